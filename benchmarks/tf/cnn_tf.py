#!/usr/bin/env python3
"""examples/cnn's network in TensorFlow (tf.compat.v1), for the comparison with loom
(docs/benchmarks.md, "Models: conv2d and examples/cnn").

The "Deep MNIST for experts" CNN as examples/common/deep_cnn.hpp builds it with
loom::layers: conv 5x5x32 (relu, SAME), max pool 2x2, conv 5x5x64 (relu, SAME), max
pool 2x2, dense 1024 (relu), dropout 0.5, dense 10; weights truncated normal (stddev
0.1), biases 0.1; the mean sparse softmax cross entropy; Adam 1e-4; variables on the ps
(replica_device_setter), async or SyncReplicasOptimizer with --sync_replicas;
--batch_norm adds tf.layers.batch_normalization after each convolution and fc1 (before
the relu, no biases there), its UPDATE_OPS run with the train op.

Needs TensorFlow 2.15, or a later one with tf_keras of its version (pip install
tensorflow-cpu tf_keras): tf.compat.v1.layers is Keras 2's.

Data: Fashion-MNIST's IDX files (--data_dir, .gz as published); the first 5000 training
images are the validation set, as TF's read_data_sets and loom's read_mnist split them;
worker i shuffles the rest with seed + i.

  cnn_tf.py --data_dir /usr/share/datasets/fashion-mnist --ps 1 --workers 2 \\
            --train_steps 2000 [--sync_replicas] [--batch_norm]

launches 1 ps + 2 worker processes on free loopback ports and prints each worker's
lines; each worker ends with
  Worker i: Training ends: S local steps, T s (E examples/s on this worker)
  Worker i: test accuracy = A
"""
import argparse
import gzip
import os
import sys
import time

import tf_cluster


def read_idx(path):
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, name):
    for suffix in (".gz", ""):
        path = os.path.join(data_dir, name + suffix)
        if os.path.exists(path):
            return read_idx(path)
    raise SystemExit("cnn_tf.py: no %s(.gz) in %s" % (name, data_dir))


def worker_or_ps(a):
    import numpy as np
    # tf.compat.v1.layers is Keras 2's: from TensorFlow 2.16 on it needs the tf_keras package
    # and this switch (TF 2.15 has it built in).
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow.compat.v1 as tf
    tf.disable_eager_execution()
    tf.logging.set_verbosity(tf.logging.ERROR)
    cluster = tf.train.ClusterSpec({"ps": a.ps_hosts.split(","),
                                    "worker": a.worker_hosts.split(",")})
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
    images = load(a.data_dir, "train-images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / 255
    labels = load(a.data_dir, "train-labels-idx1-ubyte").astype(np.int64)
    train_x, train_y = images[5000:], labels[5000:]
    test_x = load(a.data_dir, "t10k-images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / 255
    test_y = load(a.data_dir, "t10k-labels-idx1-ubyte").astype(np.int64)
    tf.set_random_seed(a.seed)
    weights = tf.truncated_normal_initializer(stddev=0.1)
    biases = tf.constant_initializer(0.1)
    with tf.device(tf.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % a.task_index, cluster=cluster)):
        global_step = tf.train.get_or_create_global_step()
        x = tf.placeholder(tf.float32, [None, 784], name="x")
        y = tf.placeholder(tf.int64, [None], name="labels")
        training = tf.placeholder(tf.bool, [], name="training")

        def relu_after(h):
            if a.batch_norm:
                h = tf.layers.batch_normalization(h, training=training)
            return tf.nn.relu(h)

        h = tf.reshape(x, [-1, 28, 28, 1])
        h = relu_after(tf.layers.conv2d(h, 32, 5, padding="same", use_bias=not a.batch_norm,
                                        kernel_initializer=weights, bias_initializer=biases))
        h = tf.layers.max_pooling2d(h, 2, 2)
        h = relu_after(tf.layers.conv2d(h, 64, 5, padding="same", use_bias=not a.batch_norm,
                                        kernel_initializer=weights, bias_initializer=biases))
        h = tf.layers.max_pooling2d(h, 2, 2)
        h = relu_after(tf.layers.dense(tf.layers.flatten(h), 1024, use_bias=not a.batch_norm,
                                       kernel_initializer=weights, bias_initializer=biases))
        h = tf.layers.dropout(h, 0.5, training=training)
        logits = tf.layers.dense(h, 10, kernel_initializer=weights, bias_initializer=biases)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                             logits=logits))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int64))
        opt = tf.train.AdamOptimizer(a.learning_rate)
        hooks = [tf.train.StopAtStepHook(last_step=a.train_steps)]
        if a.sync_replicas:
            opt = tf.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=num_workers,
                                                 total_num_replicas=num_workers)
            hooks.append(opt.make_session_run_hook(a.task_index == 0))
        with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
            train_op = opt.minimize(loss, global_step=global_step)
        # Every worker starts timing once all have their session (as ctr_tf.py does).
        ready = tf.get_variable("benchmark_ready", [], tf.int64, tf.zeros_initializer(),
                                trainable=False)
        arrive = tf.assign_add(ready, 1)

    label = "Worker %d" % a.task_index
    config = tf.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % a.task_index],
                            **threads)
    rng = np.random.RandomState(a.seed + a.task_index)
    with tf.train.MonitoredTrainingSession(master=server.target, is_chief=a.task_index == 0,
                                           hooks=hooks, config=config, save_checkpoint_secs=None,
                                           save_summaries_steps=None,
                                           log_step_count_steps=None) as sess:
        print("%s: Session initialization complete." % label, flush=True)
        raw = sess._tf_sess()
        raw.run(arrive)
        while raw.run(ready) < num_workers:
            time.sleep(0.01)
        order, at, step, begin = rng.permutation(len(train_x)), 0, 0, time.time()
        while not sess.should_stop():
            if at + a.batch_size > len(order):
                order, at = rng.permutation(len(train_x)), 0
            batch = order[at:at + a.batch_size]
            at += a.batch_size
            sess.run(train_op, {x: train_x[batch], y: train_y[batch], training: True})
            step += 1
            if step % a.log_every == 0:
                print("%s: step %d  %.0f examples/s" % (
                    label, step, step * a.batch_size / (time.time() - begin)), flush=True)
        secs = time.time() - begin
        print("%s: Training ends: %d local steps, %.1f s (%.0f examples/s on this worker)" % (
            label, step, secs, step * a.batch_size / secs), flush=True)
        right = 0
        for i in range(0, len(test_x), 500):
            right += raw.run(correct, {x: test_x[i:i + 500], y: test_y[i:i + 500],
                                       training: False})
        print("%s: test accuracy = %.4f" % (label, right / len(test_x)), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--ps", type=int, default=1, help="ps tasks to launch")
    p.add_argument("--workers", type=int, default=2, help="worker tasks to launch")
    p.add_argument("--ps_hosts", default="")
    p.add_argument("--worker_hosts", default="")
    p.add_argument("--job_name", default="")
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--train_steps", type=int, default=2000)
    p.add_argument("--batch_size", type=int, default=50)
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log_every", type=int, default=100)
    p.add_argument("--sync_replicas", action="store_true")
    p.add_argument("--batch_norm", action="store_true")
    p.add_argument("--threads", type=int, default=0,
                   help="intra- and inter-op threads of each task (0: TensorFlow's default)")
    a, _ = p.parse_known_args()
    if a.job_name:
        worker_or_ps(a)
        return 0
    rest = list(sys.argv[1:])
    for flag in ("--ps", "--workers"):
        if flag in rest:
            i = rest.index(flag)
            del rest[i:i + 2]
    return tf_cluster.launch(os.path.abspath(__file__), a.ps, a.workers, rest, "cnn_tf.py")


if __name__ == "__main__":
    sys.exit(main())
