"""Restores a checkpoint loom wrote (in TensorFlow's format, the saver's default) into the
same model written in TensorFlow (tf.compat.v1) and evaluates it there, so a loom-trained model is shown to hand
over to TF intact. Run by hand with PyPI TensorFlow (never in `make test`):

  mnist   examples/mnist_replica's checkpoint into seed 002's model (hid_w, hid_b, sm_w,
          sm_b, its Adam slots, global_step; the seed's code, its layers and names), then
          the test set's accuracy; --expect: the accuracy loom printed, to match to 1e-4.

      build/examples/mnist_replica --job_name=... --data_dir=/usr/share/datasets/fashion-mnist \
          --checkpoint_dir=/tmp/mnist_ckpt --checkpoint_format=tensorflow ...
      /work/tf-venv/bin/python benchmarks/tf/restore_loom_in_tf.py mnist \
          --checkpoint_dir /tmp/mnist_ckpt --data_dir /usr/share/datasets/fashion-mnist \
          --expect 0.8512

  ctr     examples/ctr's checkpoint (its partitioned tables saved as TF saves partitioned
          variables) into benchmarks/tf/ctr_tf.py's model (tf.get_variable with
          fixed_size_partitioner; its dense layers' variables under tf.layers' names), then the AUC of the test set the loom run
          evaluated (its --data_dir's test.bin); --expect: the AUC loom printed.

      build/examples/ctr --write_data=/tmp/ctr_data --write_workers=1 --train_steps=2000
      build/tools/loom-launch --ps 1 --workers 1 -- build/examples/ctr \
          --data_dir=/tmp/ctr_data --train_steps=2000 --checkpoint_dir=/tmp/ctr_ckpt
      /work/tf-venv/bin/python benchmarks/tf/restore_loom_in_tf.py ctr \
          --checkpoint_dir /tmp/ctr_ckpt --data_dir /tmp/ctr_data --expect 0.9043

The Saver restores every variable of the graph by name (a name the checkpoint lacks, or a
shape that differs, is TF's error), from the directory's latest checkpoint; ctr's layers
that tf.layers names otherwise (dnn/logit, linear/kernel) through a name map.
"""

import argparse
import gzip
import math
import os
import sys

IMAGE_PIXELS = 28


def read_idx(path):
    import numpy as np

    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def test_set(data_dir):
    """The test images as TF's input_data.read_data_sets gives them: float32 in [0, 1]
    (float32(pixel) * float32(1 / 255)), labels one-hot."""
    import numpy as np

    images = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz"))
    images = images.reshape(images.shape[0], -1).astype(np.float32)
    images = np.multiply(images, np.float32(1.0 / 255.0))
    one_hot = np.zeros((labels.shape[0], 10), dtype=np.float32)
    one_hot[np.arange(labels.shape[0]), labels] = 1.0
    return images, one_hot


def mnist(args):
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    checkpoint = tf.train.latest_checkpoint(args.checkpoint_dir)
    if checkpoint is None:
        sys.exit("no checkpoint in %s (its 'checkpoint' state file)" % args.checkpoint_dir)
    reader = tf.train.load_checkpoint(checkpoint)
    hidden = reader.get_variable_to_shape_map()["hid_w"][1]
    g = tf1.Graph()
    with g.as_default():
        # Seed 002's model, as its code builds it.
        global_step = tf1.Variable(0, name="global_step", trainable=False, dtype=tf.int64)
        hid_w = tf1.Variable(tf1.truncated_normal([IMAGE_PIXELS * IMAGE_PIXELS, hidden],
                                                  stddev=1.0 / IMAGE_PIXELS), name="hid_w")
        hid_b = tf1.Variable(tf1.zeros([hidden]), name="hid_b")
        sm_w = tf1.Variable(tf1.truncated_normal([hidden, 10], stddev=1.0 / math.sqrt(hidden)),
                            name="sm_w")
        sm_b = tf1.Variable(tf1.zeros([10]), name="sm_b")
        x = tf1.placeholder(tf.float32, [None, IMAGE_PIXELS * IMAGE_PIXELS])
        y_ = tf1.placeholder(tf.float32, [None, 10])
        hid = tf.nn.relu(tf1.nn.xw_plus_b(x, hid_w, hid_b))
        y = tf.nn.softmax(tf1.nn.xw_plus_b(hid, sm_w, sm_b))
        cross_entropy = -tf.reduce_sum(y_ * tf1.log(tf.clip_by_value(y, 1e-10, 1.0)))
        tf1.train.AdamOptimizer(0.01).minimize(cross_entropy, global_step=global_step)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(y, 1), tf.argmax(y_, 1)),
                                          tf.float32))
        saver = tf1.train.Saver()  # every global variable, Adam's slots included
        images, labels = test_set(args.data_dir)
        with tf1.Session(graph=g) as sess:
            saver.restore(sess, checkpoint)
            acc = float(sess.run(accuracy, {x: images, y_: labels}))
            step = int(sess.run(global_step))
    restored = len(g.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES))
    print("TensorFlow %s restored %s (global step %d, %d variables): test accuracy = %.4f"
          % (tf.__version__, checkpoint, step, restored, acc))
    if args.expect is not None:
        ok = abs(acc - args.expect) <= 1e-4
        print("loom printed %.4f: %s" % (args.expect, "the same (to 1e-4)" if ok else "DIFFERENT"))
        return 0 if ok else 1
    return 0


def ctr(args):
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ctr_tf  # the same model's TF code: data layout, feeds, AUC

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    checkpoint = tf.train.latest_checkpoint(args.checkpoint_dir)
    if checkpoint is None:
        sys.exit("no checkpoint in %s (its 'checkpoint' state file)" % args.checkpoint_dir)
    shapes = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
    vocab = ctr_tf.read_vocab(args.data_dir)
    dim = shapes["field_0/embedding"][1]
    hidden = []
    while "dnn/layer_%d/kernel" % (len(hidden) + 1) in shapes:  # the last is the logit's
        hidden.append(shapes["dnn/layer_%d/kernel" % len(hidden)][1])
    g = tf1.Graph()
    with g.as_default():
        ids = [tf1.placeholder(tf.int64, [None]) for _ in range(ctr_tf.NUM_SINGLE)]
        sparse = [tf1.sparse_placeholder(tf.int64) for _ in range(ctr_tf.NUM_MULTI)]
        dense = tf1.placeholder(tf.float32, [None, ctr_tf.NUM_DENSE])
        label = tf1.placeholder(tf.float32, [None, 1])
        deep_in, wide_in = [], []
        for f in range(ctr_tf.NUM_FIELDS):  # as ctr_tf.py builds it
            part = tf1.fixed_size_partitioner(min(args.shards, vocab[f]))
            emb = tf1.get_variable("field_%d/embedding" % f, [vocab[f], dim], partitioner=part)
            wide = tf1.get_variable("field_%d/wide" % f, [vocab[f], 1], partitioner=part)
            if f < ctr_tf.NUM_SINGLE:
                deep_in.append(tf1.nn.embedding_lookup(emb, ids[f]))
                wide_in.append(tf1.nn.embedding_lookup(wide, ids[f]))
            else:
                sp = sparse[f - ctr_tf.NUM_SINGLE]
                deep_in.append(tf1.nn.embedding_lookup_sparse(emb, sp, None, combiner="mean"))
                wide_in.append(tf1.nn.embedding_lookup_sparse(wide, sp, None, combiner="sum"))
        def layer(x, units, name):  # tf.layers.dense's variables (Keras 3 has no tf.layers)
            with tf1.variable_scope(name):
                kernel = tf1.get_variable("kernel", [x.shape[1], units])
                return tf1.nn.xw_plus_b(x, kernel, tf1.get_variable("bias", [units]))

        h = tf.concat(deep_in + [dense], 1)
        for k, units in enumerate(hidden):
            h = tf.nn.relu(layer(h, units, "dnn/layer_%d" % k))
        logit = layer(h, 1, "dnn/logit") + tf.add_n(wide_in) + layer(dense, 1, "linear")
        probability = tf.sigmoid(logit)
        # loom's names of what ctr_tf.py's tf.layers names otherwise; a partitioned variable's parts
        # under the whole's name (TF's save_slice_info), as TF's Saver keys them.
        loom_name = {"dnn/logit/kernel": "dnn/layer_%d/kernel" % len(hidden),
                     "dnn/logit/bias": "dnn/layer_%d/bias" % len(hidden),
                     "linear/kernel": "linear/dense_weights", "linear/bias": "linear/bias"}
        var_list = {}
        for v in g.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES):
            info = v._get_save_slice_info()
            if info is not None:
                var_list.setdefault(info.full_name, []).append(v)
            else:
                var_list[loom_name.get(v.op.name, v.op.name)] = v
        saver = tf1.train.Saver(var_list)
        test = np.fromfile(os.path.join(args.data_dir, "test.bin"), ctr_tf.record_dtype())
        with tf1.Session(graph=g) as sess:
            saver.restore(sess, checkpoint)
            scores = [sess.run(probability, ctr_tf.feeds((ids, sparse, dense, label),
                                                         test[i:i + 4096]))[:, 0]
                      for i in range(0, len(test), 4096)]
    value = ctr_tf.auc(np.concatenate(scores), test["label"])
    print("TensorFlow %s restored %s (%d tensors): test AUC = %.4f"
          % (tf.__version__, checkpoint, len(var_list), value))
    if args.expect is not None:
        ok = abs(value - args.expect) <= 1e-4
        print("loom printed %.4f: %s" % (args.expect, "the same (to 1e-4)" if ok else "DIFFERENT"))
        return 0 if ok else 1
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=["mnist", "ctr"])
    p.add_argument("--checkpoint_dir", required=True)
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--expect", type=float, help="the accuracy or AUC loom printed")
    p.add_argument("--shards", type=int, default=2, help="ctr: its tables' shards (--shards)")
    args = p.parse_args()
    return mnist(args) if args.model == "mnist" else ctr(args)


if __name__ == "__main__":
    sys.exit(main())
