#!/usr/bin/python3
"""The plots of docs/benchmarks.md and docs/architecture.md, from the benchmarks' saved output.

    tools/plots.py [all]                 every PNG of docs/images/ from docs/data/ (`make plots`)
    tools/plots.py scalars LOGDIR OUT    a run's scalar summaries (its event files) as a TSV
    tools/plots.py gantt TRACE OUT       a Chrome trace (JSON) as a Gantt chart PNG
    tools/plots.py architecture OUT      the layers and a step crossing tasks, as a PNG
    tools/plots.py check                 parses every input of `all` without drawing (a test)

Inputs (docs/data/, each a benchmark's output as it printed it, under one provenance line
"# <date> | <machine> | <command>" that every parser skips; docs/data/README.md says how each
was made):
  mnist_replica_{async,sync}.tsv  `scalars` of the chief's event files (wall time, step, tag, value)
  train_throughput.txt            benchmarks/train_throughput
  ps_transfer.txt                 benchmarks/ps_transfer --only=4
  sparse_step.txt                 benchmarks/sparse_step
  docs/images/mnist_replica_step.trace.json (where present): one traced step, drawn as a Gantt

Needs Debian's python3-matplotlib (`tools/setup.sh --plots`) and nothing else: the event files
are read here (TFRecord framing, the Event and Summary protos' fields by number), as TensorBoard
would, without TensorFlow.
"""

import json
import math
import os
import re
import struct
import sys

# matplotlib, loaded by load_matplotlib() for the commands that draw (`check` only parses).
plt = FancyArrowPatch = FancyBboxPatch = None


def load_matplotlib():
    global plt, FancyArrowPatch, FancyBboxPatch
    try:
        import matplotlib
    except ImportError:
        raise InputError("matplotlib is missing: install Debian's python3-matplotlib "
                         "(tools/setup.sh --plots) and run this with /usr/bin/python3") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot
    import matplotlib.patches
    plt = matplotlib.pyplot
    FancyArrowPatch = matplotlib.patches.FancyArrowPatch
    FancyBboxPatch = matplotlib.patches.FancyBboxPatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs", "data")
IMAGES = os.path.join(ROOT, "docs", "images")
DPI = 110


class InputError(Exception):
    """A file that is not what its parser expects: the message says which file and where."""


# -- provenance --------------------------------------------------------------------------------


def provenance(path):
    """The '# date | machine | command' line a data file starts with, for the plot's caption."""
    with open(path, encoding="utf-8") as f:
        first = f.readline().strip()
    if not first.startswith("# "):
        raise InputError(f"{path}:1: no provenance line ('# <date> | <machine> | <command>')")
    parts = [p.strip() for p in first[2:].split("|")]
    if len(parts) < 3:
        raise InputError(f"{path}:1: the provenance line needs '<date> | <machine> | <command>'")
    return parts[0], parts[1], " | ".join(parts[2:])


def caption(fig, *paths):
    lines = []
    for path in paths:
        date, machine, command = provenance(path)
        lines.append(f"{date}, {machine}: {command}")
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=6.5, color="0.35", ha="left",
             va="bottom")


def data_lines(path):
    """(line number, text) of each line but the provenance and blank ones."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if n == 1 and line.startswith("# "):
                continue
            if line.strip():
                yield n, line.rstrip("\n")


# -- TensorBoard event files -------------------------------------------------------------------


def _varint(b, i):
    shift = value = 0
    while True:
        if i >= len(b):
            raise InputError("a varint runs past the end of its message")
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        if c < 0x80:
            return value, i
        shift += 7


def proto_fields(b):
    """(field number, wire type, value) of a serialized protobuf message: varints as ints,
    fixed64/fixed32 as their 8/4 bytes, length-delimited fields as bytes."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(b, i)
        elif wire == 1:
            value, i = b[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(b, i)
            value, i = b[i:i + n], i + n
        elif wire == 5:
            value, i = b[i:i + 4], i + 4
        else:
            raise InputError(f"wire type {wire} of field {number} is not protobuf's")
        if i > len(b):
            raise InputError(f"field {number} runs past the end of its message")
        yield number, wire, value


def tfrecords(path):
    """The records of a TFRecord file (length, its CRC, data, its CRC; CRCs not checked here:
    tests/train/test_summary.cpp checks loom's)."""
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i < len(data):
        if i + 12 > len(data):
            raise InputError(f"{path}: a record header is cut off at byte {i}")
        (n,) = struct.unpack_from("<Q", data, i)
        if i + 12 + n + 4 > len(data):
            raise InputError(f"{path}: the record at byte {i} declares {n} bytes past the end")
        yield data[i + 12:i + 12 + n]
        i += 12 + n + 4


def event_scalars(logdir):
    """(wall time, step, tag, value) of every simple_value in the event files of logdir
    (event.proto: wall_time 1, step 2, summary 5; summary.proto: value 1 {tag 1, simple_value 2})."""
    files = sorted(f for f in os.listdir(logdir) if f.startswith("events.out.tfevents."))
    if not files:
        raise InputError(f"{logdir}: no events.out.tfevents.* file")
    rows = []
    for name in files:
        path = os.path.join(logdir, name)
        for record in tfrecords(path):
            wall, step, summary = 0.0, 0, None
            for number, _, value in proto_fields(record):
                if number == 1:
                    (wall,) = struct.unpack("<d", value)
                elif number == 2:
                    step = value
                elif number == 5:
                    summary = value
            if summary is None:
                continue
            for number, _, value in proto_fields(summary):
                if number != 1:
                    continue
                tag, simple = None, None
                for n2, _, v2 in proto_fields(value):
                    if n2 == 1:
                        tag = v2.decode("utf-8")
                    elif n2 == 2:
                        (simple,) = struct.unpack("<f", v2)
                if tag is not None and simple is not None:
                    rows.append((wall, step, tag, simple))
    return rows


def write_scalars(logdir, out):
    rows = event_scalars(logdir)
    with open(out, "w", encoding="utf-8") as f:
        f.write("wall_time\tstep\ttag\tvalue\n")
        for wall, step, tag, value in rows:
            f.write(f"{wall:.6f}\t{step}\t{tag}\t{value:.9g}\n")
    print(f"{out}: {len(rows)} scalars from {logdir}")


def read_scalars(path):
    """{tag: [(seconds since the run's first summary, step, value)]} of a `scalars` TSV."""
    by_tag, first = {}, None
    for n, line in data_lines(path):
        cols = line.split("\t")
        if cols[0] == "wall_time":
            continue
        if len(cols) != 4:
            raise InputError(f"{path}:{n}: expected 4 tab-separated columns, got {len(cols)}")
        try:
            wall, step, tag, value = float(cols[0]), int(cols[1]), cols[2], float(cols[3])
        except ValueError as e:
            raise InputError(f"{path}:{n}: {e}") from None
        first = wall if first is None else min(first, wall)
        by_tag.setdefault(tag, []).append((wall, step, value))
    if not by_tag:
        raise InputError(f"{path}: no scalars")
    return {t: sorted((w - first, s, v) for w, s, v in rows) for t, rows in by_tag.items()}


def smoothed(values, weight=0.6):
    """TensorBoard's exponential moving average (its smoothing slider), debiased."""
    out, last, n = [], 0.0, 0
    for v in values:
        n += 1
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight ** n))
    return out


# -- benchmark outputs -------------------------------------------------------------------------

NUMBER = r"[-+]?[0-9]+(?:\.[0-9]+)?"


def parse_train_throughput(path):
    """[(configuration, examples/s, ratio to single-process loom)] of its final table."""
    rows, in_table = [], False
    for n, line in data_lines(path):
        if line.startswith("configuration") and "examples/s" in line:
            in_table = True
            continue
        if not in_table:
            continue
        m = re.match(rf"^(.*?)\s+({NUMBER})\s+({NUMBER})\s+({NUMBER})\s+({NUMBER})$", line)
        if not m:
            if rows:
                continue  # the notes under the table
            raise InputError(f"{path}:{n}: not a row of the table: {line!r}")
        rows.append((m.group(1).strip(), float(m.group(2)), float(m.group(3))))
    if not rows:
        raise InputError(f"{path}: no 'configuration examples/s ...' table")
    return rows


def parse_ps_transfer(path):
    """{column: [(bytes per key, Gbit/s)]} of part 4's table (ps_transfer --only=4)."""
    header, cols = None, {}
    for n, line in data_lines(path):
        if line.startswith("len ") or line.startswith("len\t"):
            header = line.split()[1:]
            cols = {h: [] for h in header}
            continue
        if header is None:
            continue
        m = re.match(r"^([0-9]+) (KB|MB)\s+(.*)$", line)
        if not m:
            if any(cols.values()):
                break  # the lines under the table
            continue
        size = int(m.group(1)) * (1 << 10 if m.group(2) == "KB" else 1 << 20)
        values = m.group(3).split()
        if len(values) != len(header):
            raise InputError(f"{path}:{n}: {len(values)} values under {len(header)} columns")
        for h, v in zip(header, values):
            cols[h].append((size, float(v)))
    if not any(cols.values()):
        raise InputError(f"{path}: no part-4 table (a 'len ...' header and its rows)")
    return cols


def parse_sparse_step(path):
    """{'1a'|'1b': [(rows, step ms, wire bytes per step)]} of parts 1a and 1b."""
    unit = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    parts, current = {}, None
    for n, line in data_lines(path):
        m = re.match(r"^(1[ab])\. table size", line)
        if m:
            current = parts.setdefault(m.group(1), [])
            continue
        if re.match(r"^2\. ", line):
            current = None
            continue
        if current is None:
            continue
        m = re.match(rf"^([0-9]+)\s+({NUMBER})\s+{NUMBER}\s+({NUMBER}) (B|KB|MB|GB)\s", line)
        if m:
            current.append((int(m.group(1)), float(m.group(2)),
                            float(m.group(3)) * unit[m.group(4)]))
        elif not line.startswith("rows"):
            raise InputError(f"{path}:{n}: not a row of part 1's tables: {line!r}")
    if not parts.get("1a"):
        raise InputError(f"{path}: no part 1a table ('1a. table size ...' and its rows)")
    return parts


# -- plots of the benchmarks -------------------------------------------------------------------


def plot_training(async_tsv, sync_tsv, out):
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))
    for path, label, color in ((async_tsv, "async", "tab:blue"),
                               (sync_tsv, "sync_replicas (2 of 2)", "tab:orange")):
        runs = read_scalars(path)
        for ax, tag in zip(axes, ("loss", "accuracy", "examples/s")):
            if tag not in runs:
                raise InputError(f"{path}: no scalar tagged {tag!r}")
            t = [r[0] for r in runs[tag]]
            v = [r[2] for r in runs[tag]]
            ax.plot(t, v, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(t, smoothed(v), color=color, linewidth=1.6, label=label)
    axes[0].set_ylabel("cross entropy of the batch (sum over 100)")
    axes[0].set_title("training loss")
    axes[1].set_ylabel("accuracy of the batch")
    axes[1].set_title("training accuracy")
    axes[2].set_ylabel("examples/s of the cluster, between summaries")
    axes[2].set_title("examples/s")
    axes[2].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xlabel("seconds since the first summary")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("examples/mnist_replica, 1 ps + 2 workers (loom-launch): the chief's summaries "
                 "every 100 global steps\n(faint: each summary; bold: smoothed 0.6 as TensorBoard)",
                 fontsize=10)
    caption(fig, async_tsv, sync_tsv)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    print(f"wrote {out}")


def plot_throughput(path, out):
    rows = parse_train_throughput(path)
    fig, ax = plt.subplots(figsize=(11, 4.6))
    names = [r[0] for r in rows][::-1]
    rates = [r[1] for r in rows][::-1]
    colors = ["0.6" if ("in process" in n or "bound" in n or "single-process" in n)
              else "tab:blue" for n in names]
    bars = ax.barh(names, rates, color=colors)
    for bar, (_, rate, ratio) in zip(bars, rows[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" {rate:,.0f}  ({ratio:.2f} x loom)", va="center", fontsize=8)
    ax.set_xlabel("examples/s (a cluster's: the sum of its workers' rates)")
    ax.set_xlim(0, max(rates) * 1.35)
    fig.suptitle("benchmarks/train_throughput: the seed's MLP, batch 100, by cluster shape\n"
                 "(blue: mnist_replica clusters under loom-launch; grey: in-process baselines "
                 "and the TCP bound, measured in the same run)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    caption(fig, path)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    print(f"wrote {out}")


def plot_ps_transfer(path, out):
    cols = parse_ps_transfer(path)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    style = {"push": ("tab:blue", "o", "-"), "pull": ("tab:green", "s", "-"),
             "push-pull": ("tab:purple", "^", "-"), "raw": ("0.3", "", "--"),
             "raw-echo": ("0.6", "", ":")}
    labels = {"push": "loom push (assign 4 variables over 2 ps)",
              "pull": "loom pull (fetch them)", "push-pull": "loom push-pull (fetch the assigns)",
              "raw": "raw TCP, the same bytes one way", "raw-echo": "raw TCP, echoed"}
    for name, points in cols.items():
        if name not in style or not points:
            continue
        color, marker, line = style[name]
        ax.plot([p[0] * 4 for p in points], [p[1] for p in points], color=color, marker=marker,
                linestyle=line, label=labels[name])
    ax.set_xscale("log")
    ax.set_xlabel("bytes per step (4 variables of len each)")
    ax.set_ylabel("goodput, Gbit/s (ps-lite's: 8 x len x keys / time)")
    ax.set_title("benchmarks/ps_transfer part 4: a worker session's transfers to 2 ps tasks "
                 "against raw TCP", fontsize=10)
    ticks = sorted({p[0] * 4 for points in cols.values() for p in points})
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{binary_bytes(t)}\n(4 x {binary_bytes(t // 4)})" for t in ticks],
                       fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    caption(fig, path)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    print(f"wrote {out}")


def binary_bytes(b):
    """As ps_transfer prints its sizes: KB = 2^10 bytes, MB = 2^20."""
    for unit, size in (("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= size:
            return f"{b / size:g} {unit}"
    return f"{b:g} B"


def plot_sparse_step(path, out):
    parts = parse_sparse_step(path)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = {"1a": "the same ids whatever the table (Zipf over 10^5)",
              "1b": "ids Zipf over the whole table"}
    colors = {"1a": "tab:blue", "1b": "tab:orange"}
    for part, rows in sorted(parts.items()):
        n = [r[0] for r in rows]
        axes[0].plot(n, [r[1] for r in rows], marker="o", color=colors[part], label=labels[part])
        axes[1].plot(n, [r[2] for r in rows], marker="o", color=colors[part], label=labels[part])
    rows = parts["1a"]
    axes[1].plot([r[0] for r in rows], [2.0 * r[0] * 16 * 4 for r in rows], color="0.5",
                 linestyle="--", label="a dense pull + push of the table")
    axes[0].set_ylabel("median step, ms")
    axes[0].set_ylim(bottom=0)
    axes[0].set_title("step time")
    axes[1].set_ylabel("bytes on the wire per step")
    axes[1].set_yscale("log")
    axes[1].set_title("wire bytes per step")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("embedding table rows (x 16 floats, 2 shards over 2 ps)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("benchmarks/sparse_step: an embedding model's step (batch 1024 x 26 ids, "
                 "Adagrad) as its table grows", fontsize=10)
    caption(fig, path)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    print(f"wrote {out}")


# -- a Chrome trace as a Gantt chart -----------------------------------------------------------


def read_trace(path):
    """The Chrome trace format (a JSON object with traceEvents, or a bare array of events):
    returns (slices, flows, waits, process names, thread names, sort keys) where a slice is
    (pid, tid, start us, duration us, name, args) from 'X' events and 'B'/'E' pairs, a flow is
    ((pid, tid, ts) of its start 's', (pid, tid, ts) of its end 'f' or 't'), and a wait is
    (pid, tid, start us, duration us, category) from an async 'b'/'e' pair (loom::timeline's
    "recv wait": from a _recv's request to its tensor's arrival)."""
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputError(f"{path}: neither a list of events nor an object with traceEvents")
    slices, open_b, flow_start, flows = [], {}, {}, []
    async_begin, waits = {}, []
    pnames, tnames, psort, tsort = {}, {}, {}, {}
    for k, e in enumerate(events):
        if not isinstance(e, dict) or "ph" not in e:
            raise InputError(f"{path}: traceEvents[{k}] is not an event (an object with 'ph')")
        ph = e["ph"]
        try:
            pid, tid = e.get("pid", 0), e.get("tid", 0)
            if ph == "M":
                args = e.get("args", {})
                if e.get("name") == "process_name":
                    pnames[pid] = args.get("name", str(pid))
                elif e.get("name") == "thread_name":
                    tnames[(pid, tid)] = args.get("name", str(tid))
                elif e.get("name") == "process_sort_index":
                    psort[pid] = args.get("sort_index", 0)
                elif e.get("name") == "thread_sort_index":
                    tsort[(pid, tid)] = args.get("sort_index", 0)
            elif ph == "X":
                slices.append((pid, tid, float(e["ts"]), float(e.get("dur", 0)),
                               e.get("name", "?"), e.get("args", {})))
            elif ph == "B":
                open_b.setdefault((pid, tid), []).append(e)
            elif ph == "E":
                stack = open_b.get((pid, tid))
                if not stack:
                    raise InputError(f"{path}: traceEvents[{k}]: an 'E' with no open 'B' on "
                                     f"pid {pid} tid {tid}")
                b = stack.pop()
                slices.append((pid, tid, float(b["ts"]), float(e["ts"]) - float(b["ts"]),
                               b.get("name", "?"), b.get("args", {})))
            elif ph == "b":
                async_begin[(e.get("cat"), e["id"], e.get("name"))] = e
            elif ph == "e":
                b = async_begin.pop((e.get("cat"), e["id"], e.get("name")), None)
                if b is None:
                    raise InputError(f"{path}: traceEvents[{k}]: an async 'e' with no 'b' "
                                     f"(id {e['id']!r})")
                waits.append((b.get("pid", 0), b.get("tid", 0), float(b["ts"]),
                              float(e["ts"]) - float(b["ts"]), b.get("cat", "async")))
            elif ph == "s":
                flow_start[(e.get("cat"), e["id"])] = (pid, tid, float(e["ts"]))
            elif ph in ("f", "t"):
                start = flow_start.get((e.get("cat"), e["id"]))
                if start is None:
                    raise InputError(f"{path}: traceEvents[{k}]: flow {e['id']!r} ends ('{ph}') "
                                     "before any start ('s')")
                flows.append((start, (pid, tid, float(e["ts"]))))
        except KeyError as missing:
            raise InputError(f"{path}: traceEvents[{k}] ('{ph}') has no {missing}") from None
    if not slices:
        raise InputError(f"{path}: no slices ('X' events or 'B'/'E' pairs)")
    return slices, flows, waits, pnames, tnames, psort, tsort


def plot_gantt(path, out, title=None):
    slices, flows, waits, pnames, tnames, psort, tsort = read_trace(path)
    lanes = sorted({(s[0], s[1]) for s in slices} | {(f[i][0], f[i][1]) for f in flows
                                                      for i in (0, 1)},
                   key=lambda l: (psort.get(l[0], 0), str(pnames.get(l[0], l[0])),
                                  tsort.get(l, 0), str(l[1])))
    row = {lane: i for i, lane in enumerate(lanes)}
    t0 = min(s[2] for s in slices)
    t1 = max(s[2] + s[3] for s in slices)
    span_ms = max((t1 - t0) / 1e3, 1e-6)

    def op_of(s):
        args = s[5] if isinstance(s[5], dict) else {}
        return str(args.get("op", s[4]))

    ops = sorted({op_of(s) for s in slices})
    busy = {}
    for sl in slices:
        busy[op_of(sl)] = busy.get(op_of(sl), 0.0) + sl[3]
    # tab20 without its reds and greens, which mark the transfers; its 16 colours go to the
    # ops that took longest, the rest are "other ops" in light grey.
    palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (4, 5, 6, 7)]
    special = {"_send": "tab:red", "_recv": "tab:green"}
    by_time = sorted((op for op in ops if op not in special), key=lambda op: -busy[op])
    color = {op: (palette[i] if i < len(palette) - 1 else "0.85") for i, op in enumerate(by_time)}
    color.update({k: v for k, v in special.items() if k in ops})
    shown = [op for op in ops if op in special] + by_time[:len(palette) - 1]

    fig_h = 2.0 + 0.45 * len(lanes)
    fig, ax = plt.subplots(figsize=(12, fig_h))
    for s in slices:
        pid, tid, ts, dur, name, _ = s
        y = row[(pid, tid)]
        left, width = (ts - t0) / 1e3, max(dur / 1e3, span_ms / 2000)
        ax.barh(y, width, left=left, height=0.7, color=color[op_of(s)], edgecolor="0.2",
                linewidth=0.3)
        if width > span_ms / 18:
            ax.text(left + width / 2, y, name, ha="center", va="center", fontsize=6,
                    clip_on=True)
    for pid, tid, ts, dur, _ in waits:
        ax.barh(row[(pid, tid)] + 0.3, dur / 1e3, left=(ts - t0) / 1e3, height=0.12,
                color="0.55", alpha=0.5, linewidth=0)
    for (p0, t0_, ts0), (p1, t1_, ts1) in flows:
        ax.add_patch(FancyArrowPatch(((ts0 - t0) / 1e3, row[(p0, t0_)]),
                                     ((ts1 - t0) / 1e3, row[(p1, t1_)]),
                                     arrowstyle="-|>", mutation_scale=8, color="0.15",
                                     linewidth=0.7, alpha=0.8))
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{pnames.get(p, f'pid {p}')} / {tnames.get((p, t), f'thread {t}')}"
                        for p, t in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first event")
    ax.set_xlim(-span_ms * 0.01, span_ms * 1.01)
    ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[o]) for o in shown]
    # matplotlib leaves out labels that start with '_': name the transfers in words.
    names = [{"_send": "send (_send)", "_recv": "receive (_recv)"}.get(o, o) for o in shown]
    if len(by_time) > len(palette) - 1:
        handles.append(plt.Rectangle((0, 0), 1, 1, color="0.85"))
        names.append("other ops")
    if waits:
        handles.append(plt.Rectangle((0, 0), 1, 1, color="0.55", alpha=0.5))
        names.append("a _recv waiting for its tensor")
    handles.append(FancyArrowPatch((0, 0), (1, 0), arrowstyle="-|>", color="0.15"))
    names.append("a tensor from its send to its receive")
    fig.legend(handles, names, fontsize=7, ncol=min(5, len(names)), loc="lower center",
               frameon=False)
    fig.suptitle(title or f"{os.path.basename(path)}: one lane per task and thread, arrows "
                 "from each send to its receive", fontsize=9)
    fig.tight_layout(rect=(0, 0.75 / fig_h, 1, 1))
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    print(f"wrote {out} ({len(slices)} slices, {len(flows)} flows, {len(lanes)} lanes)")


# -- the architecture diagram ------------------------------------------------------------------

LAYERS = [  # bottom to top, as docs/architecture.md's table and cmake/check_layers.cmake
    ("core/", "dtype, shape, any_tensor, device_spec, errors, flags,\n"
              "checkpoint format, TFRecord + summary protos"),
    ("expr/", "typed expression templates, elementwise op tags\n(Eigen form + scalar form)"),
    ("graph/", "graph IR, op registry, lowering, autodiff,\nserialization, ops/* (send/recv, summaries)"),
    ("placement/", "policies (pin, replica_device_setter, ...),\nstrategies, the placer"),
    ("kernels/", "kernel registry, CPU kernels (Eigen),\nfused regions; cuda/ (nvcc only)"),
    ("cluster/", "cluster_spec, TF_CONFIG, Slurm/MPI resolver"),
    ("net/", "frames, HMAC auth, rpc_server, channel\n(knows no graphs: core/ and cluster/ only)"),
    ("runtime/", "session, server, cluster master, task server,\nplan, executor, partition, rendezvous"),
    ("train/", "optimizers, sync replicas, saver, monitored session,\nhooks, summary writer"),
    ("data/", "IDX/MNIST readers, batcher (core/ only)"),
]


def _box(ax, x, y, w, h, text, face, fontsize=8, bold_first=False, edge="0.25"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.01,rounding_size=0.08",
                                facecolor=face, edgecolor=edge, linewidth=0.9))
    if bold_first and "\n" in text:
        head, rest = text.split("\n", 1)
        ax.text(x + w / 2, y + h * 0.68, head, ha="center", va="center", fontsize=fontsize + 1,
                fontweight="bold")
        ax.text(x + w / 2, y + h * 0.32, rest, ha="center", va="center", fontsize=fontsize - 1)
    else:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, a, b, text=None, color="0.2", style="-|>", offset=(0, 0.12), ls="-", rad=0.0,
           fontsize=7):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=10, color=color,
                                 linewidth=1.0, linestyle=ls,
                                 connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((a[0] + b[0]) / 2 + offset[0], (a[1] + b[1]) / 2 + offset[1], text,
                ha="center", va="bottom", fontsize=fontsize, color=color)


def plot_architecture(out):
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 8.4),
                                      gridspec_kw={"width_ratios": [1, 1.55]})
    for ax in (left, right):
        ax.set_axis_off()

    # Left: the layers, each including only those below it.
    left.set_xlim(0, 10)
    left.set_ylim(-0.9, 12.4)
    left.set_title("The layers of include/loom/ (each includes only those below it;\n"
                   "cmake/check_layers.cmake enforces it)", fontsize=10)
    h, gap = 0.86, 0.22
    for i, (name, what) in enumerate(LAYERS):
        y = 0.2 + i * (h + gap)
        face = "#dbe9f6" if name not in ("net/", "runtime/") else "#fde2c8"
        if name in ("train/", "data/"):
            face = "#e2f0d9"
        _box(left, 1.6, y, 8.2, h, f"{name}\n{what}", face, fontsize=7, bold_first=True)
        if i:
            _arrow(left, (1.25, y + h / 2), (1.25, y - gap - h / 2), color="0.45")
    top = 0.2 + len(LAYERS) * (h + gap)
    _box(left, 1.6, top, 8.2, 0.7,
         "api.hpp (what a program compiles)  /  loom.hpp (+ CPU kernels + linked runtime)",
         "#eeeeee", fontsize=7.5)
    left.text(0.15, 6.3, "includes", rotation=90, fontsize=8, color="0.45", va="center")

    # Right: one step of a between-graph replica crossing tasks.
    ax = right
    ax.set_xlim(0, 16)
    ax.set_ylim(-0.9, 12.4)
    ax.set_title("One training step across tasks (mnist_replica: the chief worker and a ps)",
                 fontsize=10)
    ax.add_patch(FancyBboxPatch((0.2, 0.3), 9.0, 11.3, boxstyle="round,pad=0.02",
                                facecolor="#f7f7f7", edgecolor="0.5", linestyle="--"))
    ax.text(0.45, 11.25, "worker process (/job:worker/task:0, the chief)", fontsize=9,
            fontweight="bold")
    ax.add_patch(FancyBboxPatch((11.0, 0.3), 4.9, 11.3, boxstyle="round,pad=0.02",
                                facecolor="#f7f7f7", edgecolor="0.5", linestyle="--"))
    ax.text(11.2, 11.25, "ps process (/job:ps/task:0)", fontsize=9, fontweight="bold")

    _box(ax, 0.5, 9.7, 8.4, 1.0, "session::run(train_op, feeds)  (monitored_training_session:\n"
         "the hooks' fetches in the same step)", "#e2f0d9")
    _box(ax, 0.5, 7.7, 8.4, 1.4, "cluster_master (runtime/master.hpp)\nonce per request: place "
         "(placer), partition (_send/_recv pairs),\nregister_graph with each task; each step: "
         "run_graph", "#fde2c8", bold_first=True)
    _box(ax, 0.5, 4.3, 4.5, 2.7, "worker partition\n(in_process_worker: starts on the\n"
         "session's thread, goes on on the io\nthread that delivers what it waits for)\n"
         "_recv w, b -> forward, backward\n-> _send grads", "#dbe9f6", bold_first=True)
    _box(ax, 5.4, 4.3, 3.5, 2.7, "rendezvous_table\n(step id, key) -> a tensor,\nor a _recv "
         "waiting\nfor it", "#eeeeee", bold_first=True)
    _box(ax, 0.5, 1.0, 8.4, 2.6, "task_server + net (rpc_server, channel)\none connection pair "
         "per peer (control + bulk); a frame:\nheader + cereal metadata + raw tensor bytes,\n"
         "written from and read into tensor buffers", "#fde2c8", bold_first=True)

    _box(ax, 11.3, 7.7, 4.3, 1.4, "task_server\nrun_graph handler", "#fde2c8", bold_first=True)
    _box(ax, 11.3, 4.3, 4.3, 2.7, "ps partition\n(started by run_graph on an io\nthread, "
         "goes on where its\ntensors arrive)\nread w, b -> _send;\n_recv grads (its own\n"
         "rendezvous_table) -> Adam", "#dbe9f6", bold_first=True)
    _box(ax, 11.3, 1.0, 4.3, 2.6, "resource container\nvariables w, b, Adam slots,\nglobal_step "
         "(shared by every\nsession on the cluster)", "#eeeeee", bold_first=True)

    _arrow(ax, (4.7, 9.7), (4.7, 9.1))
    _arrow(ax, (2.75, 7.7), (2.75, 7.0), "run_graph (in memory)", offset=(1.35, -0.2))
    _arrow(ax, (8.9, 8.65), (11.3, 8.65), "1. run_graph", color="tab:red", offset=(0, 0.05))
    _arrow(ax, (11.3, 8.0), (8.9, 8.0), "4. its reply", color="tab:red", offset=(0, -0.42))
    _arrow(ax, (13.45, 7.7), (13.45, 7.0))
    _arrow(ax, (11.3, 6.2), (8.9, 6.2), "2. put: w, b", color="tab:blue", offset=(0, 0.05))
    _arrow(ax, (5.4, 5.65), (5.0, 5.65), color="tab:blue")
    _arrow(ax, (5.0, 4.75), (11.3, 4.75), "3. put: grads", color="tab:blue", offset=(1.95, 0.05))
    _arrow(ax, (13.45, 4.3), (13.45, 3.6), style="<|-|>")
    ax.text(0.2, -0.2, "Red: the master's RPCs. Blue: the step's tensors, each _send to its _recv "
            "(keyed producer->consumer task); a put is one rendezvous_put RPC\ncarrying every "
            "tensor the step sends that task when the executor would otherwise wait. All of it "
            "over the net layer.", fontsize=7, color="0.3", va="top")
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    print(f"wrote {out}")


# -- main --------------------------------------------------------------------------------------


def need(path):
    if not os.path.exists(path):
        raise InputError(f"{path}: missing (docs/data/README.md says how to make it)")
    return path


def make_all():
    os.makedirs(IMAGES, exist_ok=True)
    d = lambda name: need(os.path.join(DATA, name))  # noqa: E731
    img = lambda name: os.path.join(IMAGES, name)  # noqa: E731
    plot_training(d("mnist_replica_async.tsv"), d("mnist_replica_sync.tsv"),
                  img("mnist_replica_training.png"))
    plot_throughput(d("train_throughput.txt"), img("train_throughput.png"))
    plot_ps_transfer(d("ps_transfer.txt"), img("ps_transfer.png"))
    plot_sparse_step(d("sparse_step.txt"), img("sparse_step.png"))
    plot_architecture(img("architecture.png"))
    trace = os.path.join(IMAGES, "mnist_replica_step.trace.json")
    if os.path.exists(trace):
        plot_gantt(trace, img("mnist_replica_step.png"),
                   "One step of mnist_replica's chief, 1 ps + 2 workers under loom-launch "
                   "(--trace_step, loom::timeline's Chrome trace):\none lane per task and "
                   "thread, arrows from each send to its receive")
    else:
        print(f"{trace}: not there yet; no Gantt chart")


def check_inputs():
    """Reads every input of `all` with the parsers that draw it and checks that each holds
    what its plot shows; an InputError names the file and what is missing."""
    d = lambda name: need(os.path.join(DATA, name))  # noqa: E731
    for mode in ("async", "sync"):
        path = d(f"mnist_replica_{mode}.tsv")
        provenance(path)
        runs = read_scalars(path)
        for tag in ("loss", "accuracy", "examples/s"):
            if len(runs.get(tag, [])) < 2:
                raise InputError(f"{path}: fewer than 2 scalars tagged {tag!r}")
    path = d("train_throughput.txt")
    provenance(path)
    rows = parse_train_throughput(path)
    names = [r[0] for r in rows]
    for wanted in ("single-process loom (session)", "1 ps + 1 worker",
                   "1 ps + 2 workers, async", "1 ps + 2 workers, sync_replicas"):
        if wanted not in names:
            raise InputError(f"{path}: no row {wanted!r} in its table (rows: {names})")
    path = d("ps_transfer.txt")
    provenance(path)
    cols = parse_ps_transfer(path)
    sizes = None
    for name in ("push", "pull", "push-pull", "raw", "raw-echo"):
        points = cols.get(name)
        if not points:
            raise InputError(f"{path}: part 4's table has no column {name!r}")
        if sizes is not None and [p[0] for p in points] != sizes:
            raise InputError(f"{path}: column {name!r} has other sizes than 'push'")
        sizes = [p[0] for p in points]
    path = d("sparse_step.txt")
    provenance(path)
    parts = parse_sparse_step(path)
    for part in ("1a", "1b"):
        if len(parts.get(part, [])) < 2:
            raise InputError(f"{path}: part {part} has fewer than 2 table sizes")
    traces = [os.path.join(DATA, "gantt_example.trace.json"),
              os.path.join(IMAGES, "mnist_replica_step.trace.json")]
    for path in traces:
        if not os.path.exists(path):
            continue
        slices, flows, _, pnames, _, _, _ = read_trace(path)
        lanes = {(sl[0], sl[1]) for sl in slices}
        if not flows:
            raise InputError(f"{path}: no flow from a send to its receive")
        for start, end in flows:
            for pid, tid, _ in (start, end):
                if (pid, tid) not in lanes:
                    raise InputError(f"{path}: a flow starts or ends on pid {pid} tid {tid}, "
                                     "where no slice ran")
        if len(pnames) < 2:
            raise InputError(f"{path}: fewer than 2 named processes (tasks)")
    print("plots: every input parses")


def main(argv):
    usage = __doc__.split("\n\n")[1]
    command = argv[1] if len(argv) > 1 else "all"
    arity = {"all": 0, "check": 0, "scalars": 2, "gantt": 2, "architecture": 1}
    if command not in arity or len(argv) - 2 != arity[command] and len(argv) > 1:
        print(usage, file=sys.stderr)
        return 2
    try:
        if command == "check":
            check_inputs()
        elif command == "scalars":
            write_scalars(argv[2], argv[3])
        else:
            load_matplotlib()
            if command == "all":
                make_all()
            elif command == "gantt":
                plot_gantt(argv[2], argv[3])
            else:
                plot_architecture(argv[2])
    except (InputError, OSError) as e:
        print(f"plots: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
