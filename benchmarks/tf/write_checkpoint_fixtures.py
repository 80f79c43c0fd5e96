#!/usr/bin/env python3
"""Writes the TensorFlow checkpoints (V2, the tensor bundle) that loom's tests read
(tests/core/test_tensor_bundle.cpp), with tf.compat.v1, and beside each a text file of
the values TensorFlow reads back from it, for a bit-for-bit comparison.

  write_checkpoint_fixtures.py [--out tests/data/tf_checkpoints]

writes under OUT:
  mlp_adam/model.ckpt-3.*       the seed MLP's variables (hid_w, hid_b, sm_w, sm_b) at
                                20 -> 8 -> 3 after 3 Adam steps: slots hid_w/Adam,
                                hid_w/Adam_1, ..., beta1_power, beta2_power, global_step
  partitioned/model.ckpt-2.*    a [10, 4] embedding in 3 parts (fixed_size_partitioner)
                                after 2 Adagrad steps: emb and emb/Adagrad saved as
                                slices of their full shapes
  sharded/model.ckpt.*          a sharded Saver over variables on 2 CPU devices: two data
                                files; float32, float64, int32, int64, bool, string,
                                float16 (a dtype loom lacks), an empty tensor and a table
                                partitioned across both devices
and per checkpoint PREFIX.expected.txt, tab-separated lines:
  tensor NAME DTYPE DIMS VALUES  every tensor as tf.train.load_checkpoint reads it (a
                                 partitioned one whole); DIMS comma-separated, "-" for a
                                 scalar; VALUES space-separated: floats as the hex of their
                                 bits, integers in decimal, bools 0/1, strings "x" + hex
  slice NAME SPEC                each part of a partitioned variable, as TF's
                                 save_slice_info spec ("10 4 0,4:0,4")

Run by hand with PyPI TensorFlow (e.g. /work/tf-venv/bin/python); never by `make test`.
"""
import argparse
import os
import shutil


def hex_bits(values, dtype):
    import numpy as np
    return [format(int(b), "0%dx" % (2 * dtype().itemsize)) for b in
            np.asarray(values).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype().itemsize])
            .ravel()]


def format_values(value):
    import numpy as np
    a = np.asarray(value)
    if a.dtype.kind == "f":
        return " ".join(hex_bits(a, a.dtype.type))
    if a.dtype == np.bool_:
        return " ".join("1" if v else "0" for v in a.ravel())
    if a.dtype.kind in "iu":
        return " ".join(str(int(v)) for v in a.ravel())
    return " ".join("x" + bytes(v).hex() for v in a.ravel())  # strings (bytes)


def write_expected(prefix, slice_specs):
    import tensorflow.compat.v1 as tf
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    with open(prefix + ".expected.txt", "w") as out:
        out.write("# written by TensorFlow %s (benchmarks/tf/write_checkpoint_fixtures.py)\n" %
                  tf.__version__)
        for name in sorted(dtypes):
            value = reader.get_tensor(name)
            dims = ",".join(str(d) for d in value.shape) if value.ndim else "-"
            out.write("tensor\t%s\t%s\t%s\t%s\n" % (name, dtypes[name].name, dims,
                                                    format_values(value)))
        for name, spec in sorted(slice_specs):
            out.write("slice\t%s\t%s\n" % (name, spec))


def distinct_rows(shape, dtype=None, partition_info=None):
    """row * 10 + column + 0.25 of the full tensor: every part's values differ, so a part
    restored to the wrong rows shows."""
    import numpy as np
    first = partition_info.single_offset(shape) if partition_info is not None else 0
    rows = np.arange(first, first + shape[0], dtype=np.float32)[:, None]
    return rows * 10 + np.arange(shape[1], dtype=np.float32) + 0.25


def slice_specs_of(tf):
    specs = []
    for v in tf.global_variables():
        info = getattr(v, "_save_slice_info", None)
        if info is not None:
            specs.append((info.full_name, info.spec))
    return specs


def save(tf, sess, saver, prefix, step=None):
    path = saver.save(sess, prefix, global_step=step, write_meta_graph=False, write_state=False)
    write_expected(path, slice_specs_of(tf))
    return path


def mlp_adam(tf, np, out):
    tf.reset_default_graph()
    tf.set_random_seed(1)
    rng = np.random.RandomState(1)
    x = tf.constant(rng.randn(16, 20).astype(np.float32))
    y = tf.constant(np.eye(3, dtype=np.float32)[rng.randint(0, 3, 16)])
    global_step = tf.train.get_or_create_global_step()
    hid_w = tf.Variable(tf.truncated_normal([20, 8], stddev=1.0 / 20), name="hid_w")
    hid_b = tf.Variable(tf.zeros([8]), name="hid_b")
    sm_w = tf.Variable(tf.truncated_normal([8, 3], stddev=1.0 / 8), name="sm_w")
    sm_b = tf.Variable(tf.zeros([3]), name="sm_b")
    hid = tf.nn.relu(tf.nn.xw_plus_b(x, hid_w, hid_b))
    logits = tf.nn.xw_plus_b(hid, sm_w, sm_b)
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(labels=y, logits=logits))
    train = tf.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
        save(tf, sess, tf.train.Saver(), os.path.join(out, "mlp_adam", "model.ckpt"), 3)


def partitioned(tf, np, out):
    tf.reset_default_graph()
    tf.set_random_seed(2)
    global_step = tf.train.get_or_create_global_step()
    emb = tf.get_variable("emb", [10, 4], initializer=distinct_rows,
                          partitioner=tf.fixed_size_partitioner(3))
    ids = tf.constant([0, 3, 4, 9, 9, 7], dtype=tf.int64)
    loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(emb, ids) - 1.0))
    train = tf.train.AdagradOptimizer(0.1).minimize(loss, global_step=global_step)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(2):
            sess.run(train)
        save(tf, sess, tf.train.Saver(), os.path.join(out, "partitioned", "model.ckpt"), 2)


def sharded(tf, np, out):
    tf.reset_default_graph()
    with tf.device("/cpu:0"):
        tf.Variable(np.array([[1.5, -2.25, 3.0], [0.0, -0.0, 1e-30]], np.float32), name="a/f32")
        tf.Variable(np.array([np.pi, -np.e, 1e300], np.float64), name="a/f64")
        tf.Variable(np.array([-(2**31), 0, 2**31 - 1], np.int32), name="a/i32")
        tf.Variable(np.zeros([0, 3], np.float32), name="a/empty")
        tf.Variable(np.float16([1.0, -0.5, 65504.0]), name="a/f16")
    with tf.device("/cpu:1"):
        tf.Variable(np.array([-(2**63), -1, 2**63 - 1], np.int64), name="b/i64")
        tf.Variable(np.array([[True, False], [False, True]]), name="b/bool")
        tf.Variable(np.array([b"", b"loom", b"\x00\xff\x01", b"x" * 200], dtype=object),
                    name="b/str")
        tf.Variable(7, dtype=tf.int64, name="b/scalar")
    # A table whose parts live on both devices: its slices come from both data files.
    with tf.device(lambda op: "/cpu:1" if "part_1" in op.name else "/cpu:0"):
        tf.get_variable("table", [5, 2],
                        initializer=distinct_rows,
                        partitioner=tf.fixed_size_partitioner(2))
    config = tf.ConfigProto(device_count={"CPU": 2})
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        save(tf, sess, tf.train.Saver(sharded=True), os.path.join(out, "sharded", "model.ckpt"))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "data",
                                                 "tf_checkpoints"))
    a = p.parse_args()
    import numpy as np
    import tensorflow.compat.v1 as tf
    tf.disable_eager_execution()
    tf.logging.set_verbosity(tf.logging.ERROR)
    for name, write in (("mlp_adam", mlp_adam), ("partitioned", partitioned),
                        ("sharded", sharded)):
        shutil.rmtree(os.path.join(a.out, name), ignore_errors=True)
        os.makedirs(os.path.join(a.out, name))
        write(tf, np, a.out)
    print("TensorFlow %s wrote %s" % (tf.__version__, os.path.abspath(a.out)))


if __name__ == "__main__":
    main()
