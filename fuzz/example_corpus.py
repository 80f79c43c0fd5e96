#!/usr/bin/env python3
"""Writes fuzz/corpus/example_parse_fuzz/: each record of the TF-written, uncompressed
TFRecord fixtures (tests/data/tf/*.tfrecord), one file per distinct record, named by the
first 16 hex digits of its SHA-256. The records are tf.Examples as TensorFlow serialized them,
so the fuzzer starts from TF's own encoding and mutates it into others.

    python3 fuzz/example_corpus.py     # from the repository's root
"""
import glob
import hashlib
import os
import struct

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = os.path.join(root, "fuzz", "corpus", "example_parse_fuzz")
os.makedirs(out, exist_ok=True)
written = 0
for path in sorted(glob.glob(os.path.join(root, "tests", "data", "tf", "*.tfrecord"))):
    if ".zlib." in path:  # compressed: its records are those of examples.tfrecord
        continue
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        record = data[at + 12 : at + 12 + length]  # past the length and its CRC
        at += 12 + length + 4  # and the data's CRC
        name = hashlib.sha256(record).hexdigest()[:16]
        with open(os.path.join(out, name), "wb") as f:
            f.write(record)
        written += 1
print(f"{written} records from the fixtures; {len(os.listdir(out))} distinct in {out}")
