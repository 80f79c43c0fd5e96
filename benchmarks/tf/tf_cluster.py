"""Launches a TensorFlow cluster script (ctr_tf.py, cnn_tf.py) as ps and worker processes
on free loopback ports, as loom-launch does for loom's binaries."""
import os
import socket
import subprocess
import sys
import tempfile
import threading


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch(script, num_ps, num_workers, rest, who):
    """Runs `script` as num_ps ps and num_workers worker processes on free loopback ports
    with the arguments `rest`, prints each worker's lines, and returns 0 when every
    worker exited 0 and no ps was lost."""
    ports = free_ports(num_ps + num_workers)
    ps_hosts = ",".join("127.0.0.1:%d" % p for p in ports[:num_ps])
    worker_hosts = ",".join("127.0.0.1:%d" % p for p in ports[num_ps:])
    base = [sys.executable, script, "--ps_hosts", ps_hosts,
            "--worker_hosts", worker_hosts] + rest
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # A ps's output goes to a file, shown if it dies: TF's workers wait for a lost ps
    # forever, so a ps that exits early (its port taken between free_ports and its
    # bind, a crash) would otherwise hang the benchmark without a word.
    ps_logs = [tempfile.TemporaryFile(mode="w+") for _ in range(num_ps)]
    ps = [subprocess.Popen(base + ["--job_name", "ps", "--task_index", str(i)], env=env,
                           stdout=ps_logs[i], stderr=subprocess.STDOUT)
          for i in range(num_ps)]
    workers = [subprocess.Popen(base + ["--job_name", "worker", "--task_index", str(i)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for i in range(num_workers)]
    lost = []

    def watch(i, p):
        code = p.wait()
        if any(w.poll() is None for w in workers):
            lost.append("ps task %d exited with status %d before the workers finished" % (i, code))
            for w in workers:
                w.kill()

    for i, p in enumerate(ps):
        threading.Thread(target=watch, args=(i, p), daemon=True).start()
    failed = 0
    try:
        for i, w in enumerate(workers):
            for line in w.stdout:
                print("[worker:%d] %s" % (i, line), end="", flush=True)
            failed |= w.wait() != 0
    finally:
        for p in workers + ps:
            p.kill()
            p.wait()
    for message in lost:
        print(who + ": " + message, file=sys.stderr)
    if lost:
        for i, log in enumerate(ps_logs):
            log.seek(0)
            tail = log.read()[-2000:]
            print(who + ": ps task %d's output (last 2000 characters):\n%s" % (i, tail),
                  file=sys.stderr)
    return 1 if failed or lost else 0
