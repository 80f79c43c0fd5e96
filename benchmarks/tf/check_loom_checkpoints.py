#!/usr/bin/env python3
"""TensorFlow reads the checkpoints loom writes: loom-ckpt converts each TF-written
fixture (tests/data/tf_checkpoints, benchmarks/tf/write_checkpoint_fixtures.py) into a
checkpoint written by loom (core/tensor_bundle.hpp), and TensorFlow then
  - reads every tensor of it with tf.train.load_checkpoint, equal bit for bit to what it
    read from its own checkpoint (PREFIX.expected.txt);
  - restores its partitioned variables with tf.train.Saver into graphs of its own
    partitioning (1, 2, 3 and 5 parts), equal to the whole tensors.

  check_loom_checkpoints.py --loom_ckpt build/tools/loom-ckpt

Run by hand with PyPI TensorFlow (e.g. /work/tf-venv/bin/python); never by `make test`.
Prints one line per check and exits 1 if any fails.
"""
import argparse
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from write_checkpoint_fixtures import format_values  # noqa: E402

FIXTURES = {"mlp_adam": "model.ckpt-3", "partitioned": "model.ckpt-2", "sharded": "model.ckpt"}
PARTITIONED = {"partitioned": ["emb", "emb/Adagrad"], "sharded": ["table"]}


def read_expected(prefix):
    tensors = {}
    with open(prefix + ".expected.txt") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "tensor":
                tensors[fields[1]] = (fields[2], fields[3], fields[4])
    return tensors


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loom_ckpt", required=True, help="the loom-ckpt binary")
    p.add_argument("--fixtures", default=os.path.join(here, "..", "..", "tests", "data",
                                                      "tf_checkpoints"))
    a = p.parse_args()
    import numpy as np
    import tensorflow.compat.v1 as tf
    tf.disable_eager_execution()
    tf.logging.set_verbosity(tf.logging.ERROR)
    failures = 0

    def check(ok, what):
        nonlocal failures
        print("%s  %s" % ("ok  " if ok else "FAIL", what))
        failures += 0 if ok else 1

    with tempfile.TemporaryDirectory() as tmp:
        for name, stem in FIXTURES.items():
            source = os.path.join(a.fixtures, name, stem)
            written = os.path.join(tmp, name, stem)
            os.makedirs(os.path.dirname(written))
            subprocess.run([a.loom_ckpt, "convert", source, written], check=True)
            expected = read_expected(source)
            reader = tf.train.load_checkpoint(written)
            dtypes = reader.get_variable_to_dtype_map()
            for tensor, (dtype, dims, values) in sorted(expected.items()):
                if dtype not in ("float32", "float64", "int32", "int64", "bool", "string"):
                    check(tensor not in dtypes, "%s: %s (%s, a dtype loom lacks) left out" %
                          (name, tensor, dtype))
                    continue
                value = reader.get_tensor(tensor)
                got = (dtypes[tensor].name, ",".join(str(d) for d in value.shape) or "-",
                       format_values(value))
                check(got == (dtype, dims, values), "%s: %s read by TF" % (name, tensor))
            for tensor in PARTITIONED.get(name, []):
                _, dims, values = expected[tensor]
                shape = [int(d) for d in dims.split(",")]
                for parts in (1, 2, 3, 5):
                    if parts > shape[0]:
                        continue
                    tf.reset_default_graph()
                    var = tf.get_variable("restored", shape, tf.float32,
                                          partitioner=tf.fixed_size_partitioner(parts))
                    saver = tf.train.Saver({tensor: var})
                    with tf.Session() as sess:
                        saver.restore(sess, written)
                        whole = sess.run(tf.concat(list(var), axis=0))
                    check(format_values(whole) == values,
                          "%s: %s restored by TF's Saver into %d parts" % (name, tensor, parts))
    print("TensorFlow %s: %s" % (tf.__version__, "all checks passed" if not failures else
                                 "%d checks failed" % failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
