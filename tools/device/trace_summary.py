#!/usr/bin/env python3
"""Per-step GPU time of a traced run (tools/device/kernel_trace.c): for each
process, the median over steady steps of the step period, the time some
compute kernel ran, the time NCCL kernels or copies ran, the time only they ran
(exposed communication), the idle time, and the kernels and copies that took
the most time per step. Steps are cut at a
marker kernel that runs once a step (the loss).

    trace_summary.py DIR [--marker softmax_xent] [--skip 30] [--top 12] [--slow 6] [--gaps 3] [--periods 10]

--periods N: the mean step period of every N steps in turn (from the first
step, --skip aside), to see where in a run the slow steps lie.
--gaps US: in the step of median period, where the busiest stream (compute)
sat idle for at least US microseconds, and what ran on the other streams.
"""
import argparse
import collections
import csv
import glob
import os
import statistics


def union_length(intervals):
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def short_name(name):
    for key in ("nccl", "sgd", "loss_scaler", "softmax", "bias_relu_pool", "cast", "grad", "xmma", "cutlass",
                "conv", "gemm", "sm90", "nhwc", "nchw", "pool", "relu", "bias", "batchnorm", "bn", "add"):
        if key in name.lower():
            return key + ":" + name[:60]
    return name[:70]


def print_gaps(ks, start, streams, min_gap_us):
    """The idle spans of the busiest stream in one step, and the other streams' work."""
    busy = collections.Counter()
    for s, e, n in ks:
        busy[streams.get((s, n))] += e - s
    main = busy.most_common(1)[0][0]
    on_main = sorted((s, e, n) for s, e, n in ks if streams.get((s, n)) == main)
    print(f"    stream {main}: {len(on_main)} kernels; idle spans of {min_gap_us} us or more:")
    for (s0, e0, n0), (s1, _, n1) in zip(on_main, on_main[1:]):
        if s1 - e0 >= min_gap_us * 1000:
            print(f"      at {(e0 - start) / 1e3:8.1f} us idle {(s1 - e0) / 1e3:7.1f}  after {short_name(n0)[:40]}  before {short_name(n1)[:40]}")
    print("    other streams:")
    for s, e, n in sorted(ks):
        if streams.get((s, n)) != main:
            print(f"      at {(s - start) / 1e3:8.1f} us for {(e - s) / 1e3:7.1f}  stream {streams.get((s, n))}  {short_name(n)[:60]}")


def print_periods(path, marker, every):
    """Mean step period of each run of 'every' steps, from the run's first step."""
    marks = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if marker in r["name"]:
                marks.append(int(r["start_ns"]))
    marks.sort()
    periods = [b - a for a, b in zip(marks, marks[1:])]
    print(f"== {os.path.basename(path)}: mean period (us) of each {every} steps from step 1")
    line = []
    for i in range(0, len(periods), every):
        chunk = periods[i:i + every]
        line.append(f"{statistics.mean(chunk) * 1e-3:.0f}")
        if len(line) == 12:
            print("  " + " ".join(line))
            line = []
    if line:
        print("  " + " ".join(line))


def summarize(path, marker, skip, top, slow, gaps):
    rows = []
    streams = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["start_ns"]), int(r["end_ns"]), r["name"]))
            streams[(int(r["start_ns"]), r["name"])] = int(r["stream"])
    rows.sort()
    marks = [s for s, _, n in rows if marker in n]
    if len(marks) < skip + 3:
        print(f"{os.path.basename(path)}: {len(rows)} kernels, {len(marks)} steps: too few")
        return
    marks = marks[skip:]
    steps = collections.defaultdict(list)
    i = 0
    for s, e, n in rows:
        while i + 1 < len(marks) and s >= marks[i + 1]:
            i += 1
        if marks[0] <= s < marks[-1]:
            steps[i].append((s, e, n))
    stats = collections.defaultdict(list)
    per_name = collections.Counter()
    for k in range(len(marks) - 1):
        ks = steps[k]
        period = marks[k + 1] - marks[k]
        comp = [(s, e) for s, e, n in ks if "nccl" not in n.lower() and not n.startswith("memcpy")]
        comm = [(s, e) for s, e, n in ks if "nccl" in n.lower()]
        copies = [(s, e) for s, e, n in ks if n.startswith("memcpy")]
        all_ = union_length(comp + comm + copies)
        stats["period"].append(period)
        stats["compute busy"].append(union_length(comp))
        stats["compute kernel sum"].append(sum(e - s for s, e in comp))
        stats["nccl busy"].append(union_length(comm))
        stats["copy busy"].append(union_length(copies))
        stats["comm only (exposed)"].append(all_ - union_length(comp))
        stats["idle"].append(period - all_)
        stats["kernels"].append(len(ks))
        for s, e, n in ks:
            per_name[short_name(n)] += e - s
    n_steps = len(marks) - 1
    print(f"== {os.path.basename(path)}: {n_steps} steps")
    for key, v in stats.items():
        unit = "" if key == "kernels" else " us"
        scale = 1 if key == "kernels" else 1e-3
        print(f"  {key:22s} median {statistics.median(v) * scale:10.1f}{unit}   mean {statistics.mean(v) * scale:10.1f}")
    q = statistics.quantiles(stats["period"], n=10)
    print(f"  period p10 {q[0] * 1e-3:.1f}  p90 {q[-1] * 1e-3:.1f}  max {max(stats['period']) * 1e-3:.1f} us")
    slowest = sorted(range(n_steps), key=lambda k: -stats["period"][k])[:slow]
    for k in slowest:
        ks = sorted(steps[k])
        gap, after = 0, ""
        for (s0, e0, _), (s1, _, n1) in zip(ks, ks[1:]):
            if s1 - e0 > gap:
                gap, after = s1 - e0, n1
        print(f"    slow step {k + skip}: period {stats['period'][k] * 1e-3:.1f} us, nccl {stats['nccl busy'][k] * 1e-3:.1f},"
              f" idle {stats['idle'][k] * 1e-3:.1f}; longest gap {gap * 1e-3:.1f} us before {short_name(after)}")
    if gaps:
        order = sorted(range(n_steps), key=lambda k: stats["period"][k])
        k = order[len(order) // 2]
        print(f"  step {k + skip} (median period {stats['period'][k] * 1e-3:.1f} us):")
        print_gaps(steps[k], marks[k], streams, gaps)
    print("  top kernels, us per step:")
    for name, t in per_name.most_common(top):
        print(f"    {t / n_steps / 1e3:9.1f}  {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--marker", default="softmax_xent")
    p.add_argument("--skip", type=int, default=30)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--slow", type=int, default=0, help="list the slowest steps")
    p.add_argument("--gaps", type=float, default=0, help="idle spans of the compute stream in the median step")
    p.add_argument("--periods", type=int, default=0, help="the mean period of every N steps in turn")
    a = p.parse_args()
    for path in sorted(glob.glob(os.path.join(a.dir, "kernels.*.csv"))):
        if a.periods:
            print_periods(path, a.marker, a.periods)
        else:
            summarize(path, a.marker, a.skip, a.top, a.slow, a.gaps)


if __name__ == "__main__":
    main()
