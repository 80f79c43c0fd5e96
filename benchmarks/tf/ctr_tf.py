#!/usr/bin/env python3
"""examples/ctr's wide & deep click model in TensorFlow (tf.compat.v1), for the
comparison with loom (benchmarks/sparse_step --tf, docs/benchmarks.md).

The same model as examples/ctr/wide_deep.hpp: per field a deep embedding
[V, 16] and a wide weight [V, 1], both partitioned with
fixed_size_partitioner(2) and placed by replica_device_setter; single-hot
fields through tf.nn.embedding_lookup, multi-hot ones through
tf.nn.embedding_lookup_sparse (mean for the deep part, sum for the wide);
hidden layers 256 and 128 (relu, Glorot uniform); sigmoid cross entropy;
Adagrad 0.1 (initial accumulator 0.1, as loom's); async, or
SyncReplicasOptimizer with --sync_replicas.

The data are the files `ctr --write_data=DIR` writes (the same streams loom
trains on): worker i reads DIR/train_<i>.bin, everyone evaluates DIR/test.bin,
and DIR/meta.txt holds the vocabularies.

  ctr_tf.py --data_dir DIR --ps 1 --workers 2 --train_steps 3000 [--sync_replicas]

launches 1 ps + 2 worker processes on free loopback ports (as loom-launch does)
and prints each worker's lines; each worker ends with
  Worker i: Training ends: S local steps, ... (E examples/s on this worker)
  Worker i: test AUC = A
"""
import argparse
import os
import sys
import time

import tf_cluster

NUM_FIELDS, NUM_MULTI, MAX_IDS, NUM_DENSE = 26, 4, 5, 13
NUM_SINGLE = NUM_FIELDS - NUM_MULTI


def record_dtype():
    import numpy as np
    return np.dtype([("ids", np.int32, (NUM_SINGLE,)),
                     ("multi", np.int32, (NUM_MULTI, MAX_IDS)),
                     ("dense", np.float32, (NUM_DENSE,)),
                     ("label", np.float32),
                     ("teacher", np.float32)])


def read_vocab(data_dir):
    with open(os.path.join(data_dir, "meta.txt")) as f:
        for line in f:
            key, _, value = line.partition("=")
            if key.strip() == "vocab":
                return [int(v) for v in value.split(",")]
    raise SystemExit("ctr_tf.py: %s/meta.txt has no vocab line" % data_dir)


def auc(scores, labels):
    """The exact ROC AUC (Mann-Whitney, ties counted half), as examples/ctr computes it."""
    import numpy as np
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    y = labels[order] > 0.5
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        ranks[i:j] = (i + j + 1) / 2.0
        i = j
    pos = y.sum()
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return 0.5
    return (ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg)


def feeds(model, batch):
    import numpy as np
    import tensorflow.compat.v1 as tf
    ids, sparse, dense, label = model
    d = {}
    for k in range(NUM_SINGLE):
        d[ids[k]] = batch["ids"][:, k].astype(np.int64)
    n = len(batch)
    for k in range(NUM_MULTI):
        m = batch["multi"][:, k, :]
        rows, cols = np.nonzero(m >= 0)
        d[sparse[k]] = tf.SparseTensorValue(
            np.stack([rows, cols], 1).astype(np.int64), m[rows, cols].astype(np.int64),
            np.array([n, MAX_IDS], np.int64))
    d[dense] = batch["dense"]
    d[label] = batch["label"].reshape(-1, 1)
    return d


def worker_or_ps(a):
    import numpy as np
    import tensorflow.compat.v1 as tf
    tf.disable_eager_execution()
    tf.logging.set_verbosity(tf.logging.ERROR)
    cluster = tf.train.ClusterSpec({"ps": a.ps_hosts.split(","), "worker": a.worker_hosts.split(",")})
    # --threads N: every task's thread pools (a server's device pool is made
    # when the server starts, so the server's config sets it; the session's
    # repeats it); 0: TensorFlow's default, one thread per core in each pool.
    threads = {}
    if a.threads > 0:
        threads = dict(intra_op_parallelism_threads=a.threads,
                       inter_op_parallelism_threads=a.threads)
    server = tf.train.Server(cluster, job_name=a.job_name, task_index=a.task_index,
                             config=tf.ConfigProto(**threads))
    if a.job_name == "ps":
        server.join()
        return
    num_workers = len(a.worker_hosts.split(","))
    vocab = read_vocab(a.data_dir)
    tf.set_random_seed(a.seed)
    with tf.device(tf.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % a.task_index, cluster=cluster)):
        global_step = tf.train.get_or_create_global_step()
        ids = [tf.placeholder(tf.int64, [None], name="ids_%d" % k) for k in range(NUM_SINGLE)]
        sparse = [tf.sparse_placeholder(tf.int64, name="multi_ids_%d" % (NUM_SINGLE + k))
                  for k in range(NUM_MULTI)]
        dense = tf.placeholder(tf.float32, [None, NUM_DENSE], name="dense")
        label = tf.placeholder(tf.float32, [None, 1], name="label")
        deep_in, wide_in = [], []
        for f in range(NUM_FIELDS):
            part = tf.fixed_size_partitioner(min(a.shards, vocab[f]))
            emb = tf.get_variable("field_%d/embedding" % f, [vocab[f], a.embedding_dim],
                                  initializer=tf.truncated_normal_initializer(
                                      stddev=1.0 / a.embedding_dim ** 0.5), partitioner=part)
            wide = tf.get_variable("field_%d/wide" % f, [vocab[f], 1],
                                   initializer=tf.zeros_initializer(), partitioner=part)
            if f < NUM_SINGLE:
                deep_in.append(tf.nn.embedding_lookup(emb, ids[f]))
                wide_in.append(tf.nn.embedding_lookup(wide, ids[f]))
            else:
                sp = sparse[f - NUM_SINGLE]
                deep_in.append(tf.nn.embedding_lookup_sparse(emb, sp, None, combiner="mean"))
                wide_in.append(tf.nn.embedding_lookup_sparse(wide, sp, None, combiner="sum"))
        h = tf.concat(deep_in + [dense], 1)
        for layer, units in enumerate(int(u) for u in a.hidden_units.split(",")):
            h = tf.layers.dense(h, units, tf.nn.relu, name="dnn/layer_%d" % layer,
                                kernel_initializer=tf.glorot_uniform_initializer())
        deep_logit = tf.layers.dense(h, 1, name="dnn/logit",
                                     kernel_initializer=tf.glorot_uniform_initializer())
        wide_logit = tf.add_n(wide_in) + tf.layers.dense(
            dense, 1, name="linear", kernel_initializer=tf.zeros_initializer())
        logit = deep_logit + wide_logit
        probability = tf.sigmoid(logit)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
        opt = tf.train.AdagradOptimizer(a.learning_rate, initial_accumulator_value=0.1)
        hooks = [tf.train.StopAtStepHook(last_step=a.train_steps)]
        if a.sync_replicas:
            opt = tf.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=num_workers,
                                                 total_num_replicas=num_workers)
            hooks.append(opt.make_session_run_hook(a.task_index == 0))
        train_op = opt.minimize(loss, global_step=global_step)
        # A start line: every worker waits until all have their session, so that
        # examples/s are measured with all workers training (TF's start-up takes
        # seconds per worker; loom's workers start within one).
        ready = tf.get_variable("benchmark_ready", [], tf.int64, tf.zeros_initializer(),
                                trainable=False)
        arrive = tf.assign_add(ready, 1)

    train = np.fromfile(os.path.join(a.data_dir, "train_%d.bin" % a.task_index), record_dtype())
    test = np.fromfile(os.path.join(a.data_dir, "test.bin"), record_dtype())
    label_text = "Worker %d" % a.task_index
    config = tf.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % a.task_index],
                            **threads)
    with tf.train.MonitoredTrainingSession(master=server.target, is_chief=a.task_index == 0,
                                           hooks=hooks, config=config,
                                           save_checkpoint_secs=None,
                                           save_summaries_steps=None,
                                           log_step_count_steps=None) as sess:
        print("%s: Session initialization complete." % label_text, flush=True)
        raw = sess._tf_sess()
        raw.run(arrive)
        while raw.run(ready) < num_workers:
            time.sleep(0.01)
        step, begin, at = 0, time.time(), 0
        while not sess.should_stop():
            if at + a.batch_size > len(train):
                at = 0
            batch = train[at:at + a.batch_size]
            at += a.batch_size
            sess.run(train_op, feeds((ids, sparse, dense, label), batch))
            step += 1
            if step % a.log_every == 0:
                print("%s: step %d  %.0f examples/s" % (
                    label_text, step, step * a.batch_size / (time.time() - begin)), flush=True)
        secs = time.time() - begin
        print("%s: Training ends: %d local steps, %.1f s (%.0f examples/s on this worker)" % (
            label_text, step, secs, step * a.batch_size / secs), flush=True)
        scores = []
        for i in range(0, len(test), 4096):
            scores.append(raw.run(
                probability, feeds((ids, sparse, dense, label), test[i:i + 4096]))[:, 0])
        print("%s: test AUC = %.4f (the teacher's AUC, the best possible: %.4f)" % (
            label_text, auc(np.concatenate(scores), test["label"]),
            auc(test["teacher"], test["label"])), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data_dir", required=True)
    p.add_argument("--ps", type=int, default=1, help="ps tasks to launch")
    p.add_argument("--workers", type=int, default=2, help="worker tasks to launch")
    p.add_argument("--ps_hosts", default="")
    p.add_argument("--worker_hosts", default="")
    p.add_argument("--job_name", default="")
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--train_steps", type=int, default=3000)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--learning_rate", type=float, default=0.1)
    p.add_argument("--embedding_dim", type=int, default=16)
    p.add_argument("--hidden_units", default="256,128")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log_every", type=int, default=500)
    p.add_argument("--sync_replicas", action="store_true")
    p.add_argument("--threads", type=int, default=0,
                   help="intra- and inter-op threads of each task (0: TensorFlow's default)")
    a, _ = p.parse_known_args()
    if a.job_name:
        worker_or_ps(a)
        return 0
    rest = [x for x in sys.argv[1:]]
    for flag in ("--ps", "--workers"):
        if flag in rest:
            i = rest.index(flag)
            del rest[i:i + 2]
    return tf_cluster.launch(os.path.abspath(__file__), a.ps, a.workers, rest, "ctr_tf.py")


if __name__ == "__main__":
    sys.exit(main())
