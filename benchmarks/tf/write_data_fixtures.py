"""Writes the TensorFlow-made fixtures of loom's input pipeline tests (tests/data/tf/).

TensorFlow writes TFRecord files of tf.Example (every feature kind, empty lists, plain,
GZIP and ZLIB, a set of shard files) and parses them with tf.io.parse_example; it parses a
TSV with empty fields and quoted text with CsvDataset. What TF parsed is written beside
them as text (parsed_examples.txt, parsed_tsv.txt), so tests/data/test_tf_fixtures.cpp
checks that loom reads the same values from the same files without running TF.

  python benchmarks/tf/write_data_fixtures.py tests/data/tf

Text format, one line per value set, strings hex-encoded, floats as %.9g:
  dense <name> <dtype> <d0>x<d1>... <values...>
  sparse <name> <dtype> <d0>x<d1> <i,j>... | <values...>
  row <value>...
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/tf"
os.makedirs(out, exist_ok=True)


def int64s(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=v))


def floats(v):
    return tf.train.Feature(float_list=tf.train.FloatList(value=v))


def byteses(v):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=v))


# Every feature kind; "tags", "ids" and "weights" are empty in some examples and
# "opt" is missing from one (its default then applies).
rows = [
    dict(label=[1], ints=[1, -2, 3], score=[0.5, -1.25], name=[b"alpha"], tags=[b"a", b"bb"],
         ids=[7, 2**40], weights=[0.1], opt=[9]),
    dict(label=[0], ints=[4, 5, 6], score=[3.0e-8, 1e30], name=[b""], tags=[], ids=[-1],
         weights=[], opt=[8]),
    dict(label=[1], ints=[0, 0, 2**62], score=[0.0, -0.0], name=[b"\x00\xff bytes"],
         tags=[b"c", b"", b"ddd"], ids=[], weights=[1.5, 2.5, 3.5]),
    dict(label=[0], ints=[-7, 8, -9], score=[1.0, 2.0], name=[b"gamma"], tags=[b"e"],
         ids=[3, 3], weights=[-4.0], opt=[7]),
]
kinds = dict(label=int64s, ints=int64s, score=floats, name=byteses, tags=byteses, ids=int64s,
             weights=floats, opt=int64s)


def serialize(row):
    return tf.train.Example(features=tf.train.Features(
        feature={k: kinds[k](v) for k, v in row.items()})).SerializeToString()


records = [serialize(r) for r in rows]
for name, compression in [("examples.tfrecord", None), ("examples.tfrecord.gz", "GZIP"),
                          ("examples.zlib.tfrecord", "ZLIB")]:
    with tf.io.TFRecordWriter(os.path.join(out, name), options=compression) as w:
        for r in records:
            w.write(r)

# Several files: shard-i holds the ids 10 i .. 10 i + 2.
for i in range(3):
    with tf.io.TFRecordWriter(os.path.join(out, "shard-%05d-of-00003.tfrecord" % i)) as w:
        for k in range(3):
            w.write(tf.train.Example(features=tf.train.Features(
                feature={"id": int64s([10 * i + k])})).SerializeToString())

spec = {
    "label": tf.io.FixedLenFeature([1], tf.int64),
    "ints": tf.io.FixedLenFeature([3], tf.int64),
    "score": tf.io.FixedLenFeature([2], tf.float32),
    "name": tf.io.FixedLenFeature([], tf.string),
    "opt": tf.io.FixedLenFeature([1], tf.int64, default_value=[-1]),
    "tags": tf.io.VarLenFeature(tf.string),
    "ids": tf.io.VarLenFeature(tf.int64),
    "weights": tf.io.VarLenFeature(tf.float32),
}
parsed = tf.io.parse_example(tf.constant(records), spec)


def text(v, dtype):
    if dtype == tf.string:
        return v.hex() if v else "-"
    if dtype == tf.float32:
        return "%.9g" % v
    return str(int(v))


def dims(shape):
    return "x".join(str(int(d)) for d in shape) or "scalar"


with open(os.path.join(out, "parsed_examples.txt"), "w") as f:
    for key in sorted(spec):
        v = parsed[key]
        dtype = spec[key].dtype
        if isinstance(v, tf.SparseTensor):
            idx = " ".join("%d,%d" % (int(a), int(b)) for a, b in v.indices.numpy())
            vals = " ".join(text(x, dtype) for x in v.values.numpy())
            f.write("sparse %s %s %s %s | %s\n" % (key, dtype.name, dims(v.dense_shape.numpy()),
                                                   idx, vals))
        else:
            vals = " ".join(text(x, dtype) for x in v.numpy().reshape(-1))
            f.write("dense %s %s %s %s\n" % (key, dtype.name, dims(v.shape), vals))

# A TSV with a header, empty fields (defaults), quoted text holding the delimiter, a
# doubled quote and a line break, and "\r\n" line ends.
tsv = ('label\tcount\tscore\ttext\n'
       '1\t\t0.5\t"tab\there"\n'
       '0\t7\t\t""\n'
       '\t-3\t2.5e3\t"he said ""hi"""\r\n'
       '1\t12\t-0.25\t"two\nlines"\n'
       '0\t0\t1\tplain\n')
with open(os.path.join(out, "quoted.tsv"), "w", newline="") as f:
    f.write(tsv)
defaults = [tf.constant([-1], tf.int64), tf.constant([0], tf.int32), tf.constant([9.5], tf.float32),
            tf.constant(["none"])]
csv = tf.data.experimental.CsvDataset(os.path.join(out, "quoted.tsv"), defaults, header=True,
                                      field_delim="\t")
with open(os.path.join(out, "parsed_tsv.txt"), "w") as f:
    for row in csv:
        f.write("row " + " ".join(text(x.numpy(), d.dtype) for x, d in zip(row, defaults)) + "\n")

with open(os.path.join(out, "tensorflow_version.txt"), "w") as f:
    f.write(tf.__version__ + "\n")
print("wrote fixtures with TensorFlow", tf.__version__, "to", out)
