"""Restores a checkpoint loom wrote (in TensorFlow's format) into the same model written in
TensorFlow (tf.compat.v1) and evaluates it there, so a loom-trained model is shown to hand
over to TF intact. Run by hand with PyPI TensorFlow (never in `make test`):

  mnist   examples/mnist_replica's checkpoint into seed 002's model (hid_w, hid_b, sm_w,
          sm_b, its Adam slots, global_step; the seed's code, its layers and names), then
          the test set's accuracy; --expect: the accuracy loom printed, to match to 1e-4.

      build/examples/mnist_replica --job_name=... --data_dir=/usr/share/datasets/fashion-mnist \
          --checkpoint_dir=/tmp/mnist_ckpt --checkpoint_format=tensorflow ...
      /work/tf-venv/bin/python benchmarks/tf/restore_loom_in_tf.py mnist \
          --checkpoint_dir /tmp/mnist_ckpt --data_dir /usr/share/datasets/fashion-mnist \
          --expect 0.8512

The Saver restores every variable of the graph by name (a name the checkpoint lacks, or a
shape that differs, is TF's error), from the directory's latest checkpoint.
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


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=["mnist"])
    p.add_argument("--checkpoint_dir", required=True)
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--expect", type=float, help="the accuracy loom printed")
    args = p.parse_args()
    return mnist(args)


if __name__ == "__main__":
    sys.exit(main())
