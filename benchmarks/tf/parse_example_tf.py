"""tf.data's side of benchmarks/input_pipeline: records/s of
TFRecordDataset(files).batch(b).map(parse_example + to_hash_bucket_fast) over the ctr schema
(label, 13 int64 features, 26 bytes features hashed), on `--threads` threads.

  python parse_example_tf.py --batch 256 --threads 1 --passes 3 FILE...

Prints one line: "records_per_second <median over passes>".
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--passes", type=int, default=3)
p.add_argument("--buckets", type=int, default=1 << 20)
p.add_argument("files", nargs="+")
a = p.parse_args()

tf.config.threading.set_inter_op_parallelism_threads(a.threads)
tf.config.threading.set_intra_op_parallelism_threads(a.threads)
spec = {"label": tf.io.FixedLenFeature([1], tf.int64)}
for i in range(1, 14):
    spec["I%d" % i] = tf.io.FixedLenFeature([1], tf.int64, default_value=[0])
for i in range(1, 27):
    spec["C%d" % i] = tf.io.FixedLenFeature([1], tf.string, default_value=[""])


def parse(records):
    f = tf.io.parse_example(records, spec)
    for i in range(1, 27):
        f["C%d" % i] = tf.strings.to_hash_bucket_fast(f["C%d" % i], a.buckets)
    return f


ds = tf.data.TFRecordDataset(a.files).batch(a.batch).map(
    parse, num_parallel_calls=a.threads if a.threads > 1 else None)
options = tf.data.Options()
options.threading.private_threadpool_size = a.threads
ds = ds.with_options(options)

rates = []
for _ in range(a.passes + 1):  # the first pass warms up (graph tracing, file cache)
    n = 0
    start = time.perf_counter()
    for f in ds:
        n += int(f["label"].shape[0])
    rates.append(n / (time.perf_counter() - start))
rates = sorted(rates[1:])
print("records_per_second %.0f" % rates[len(rates) // 2])
