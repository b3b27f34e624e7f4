#!/usr/bin/env python3
"""Checks `trainc profile`'s figures against Nsight Compute on a lent GPU machine.

  python3 tools/device/ncu_check.py --trainc build/trainc --config configs/final.ini \
      --trace final.json [--report final.txt] [--set k=v ...] [--skip-steps 20]

TRACE is `trainc profile --config CONFIG --trace TRACE` of the same config. Checks:
1. kernel durations: ncu's gpu__time_duration over one steady step (the launches after
   SKIP_STEPS steps, as many as the trace has per step) against the trace's kernel
   events per step, kernel by kernel name: the ten names with the most time, each
   within 10%;
2. the per-layer rows' sum against the step: the trace's op spans (the layers' and
   the ops' outside them, the profile table's rows) per step against REPORT's
   step_ms (within 5%);
3. the largest convolution's achieved TFLOP/s (its forward op: the FLOPs in the op
   span's args over its duration) against ncu's over the same kernels (the kernels
   the trace shows inside that op): ncu's FLOPs (its tensor-pipe counters, HMMA and
   Hopper's HGMMA, and FMA/add/mul counters) over its gpu__time_duration, within 10%;
   where the counters saw under half the shape's FLOPs, the shape's over ncu's time.
ncu runs the plain training (trainc --config CONFIG, CUDA graphs off as in the
profile, run.nvtx_layers on for the third check) with --clock-control none and
--cache-control none, so that the kernels run as in training. Prints a table per check
and "ncu_check: PASS" or "ncu_check: FAIL (...)"; exit status 1 on a failed check.
"""
import argparse
import collections
import csv
import io
import json
import re
import subprocess
import sys

# Math ops on the tensor pipe: HMMA (Ampere-style) and, on Hopper, warpgroup HGMMA; those the card's ncu
# knows are asked for (--query-metrics).
TENSOR_METRICS = ["sm__ops_path_tensor_src_fp16_dst_fp32.sum", "sm__ops_path_tensor_src_fp16_dst_fp16.sum",
                  "sm__ops_path_tensor_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
                  "sm__ops_path_tensor_op_hgmma_src_fp16.sum", "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum",
                  "sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32.sum"]
FMA_METRICS = ["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
               "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum"]
ADD_MUL_METRICS = ["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
                   "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
                   "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum",
                   "smsp__sass_thread_inst_executed_op_hmul_pred_on.sum"]


def load_trace(path):
    events = json.load(open(path))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in spans if e.get("cat") == "step"]
    if not steps:
        sys.exit(f"ncu_check: {path} has no step spans")
    kernels = [e for e in spans if "kernel" in e.get("cat", "")]
    if not kernels:
        sys.exit(f"ncu_check: {path} has no kernel events (was CUPTI available to trainc profile?)")
    ops = [e for e in spans if e.get("cat") == "op"]
    return steps, kernels, ops


def run_ncu(cmd, what):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    rows = [l for l in p.stdout.splitlines() if l.startswith('"')]
    if p.returncode != 0 or not rows:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        sys.exit(f"ncu_check: ncu ({what}) failed, exit {p.returncode}:\n{tail}")
    # The raw page's second row holds the units ("ns", ...), not a kernel.
    return [r for r in csv.DictReader(io.StringIO("\n".join(rows))) if metric(r, "gpu__time_duration.sum") is not None]


def metric(row, name):
    v = row.get(name, "")
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def known_metrics(a, wanted):
    """Those of wanted (NAME.sum) that this card's ncu lists."""
    p = subprocess.run([a.ncu, "--query-metrics"], capture_output=True, text=True, errors="replace")
    names = {l.split()[0] for l in p.stdout.splitlines() if l.strip()}
    return [m for m in wanted if m.rsplit(".", 1)[0] in names] or wanted[:1]


def trainc_cmd(a, steps, nvtx):
    cmd = [a.trainc, "--config", a.config, "--quiet", "--set", "perf.cuda_graph=off", "--set", "run.eval=off",
           "--set", f"run.max_steps={steps}", "--set", "run.checkpoint_every=0", "--set", "run.epochs=1000"]
    if nvtx:
        cmd += ["--set", "run.nvtx_layers=on"]
    for s in a.set:
        cmd += ["--set", s]
    return cmd


def ncu_base(a):
    return [a.ncu, "--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
            "--cache-control", "none", "--print-kernel-base", a.kernel_base]


def check_durations(a, steps, kernels):
    n_steps = len(steps)
    per_name = collections.defaultdict(float)
    for k in kernels:
        per_name[k["name"]] += k["dur"] / 1000.0 / n_steps  # ms per step
    per_step = round(len(kernels) / n_steps)
    rows = run_ncu(ncu_base(a) + ["--metrics", "gpu__time_duration.sum", "--launch-skip",
                                  str(per_step * a.skip_steps), "--launch-count", str(per_step)]
                   + trainc_cmd(a, 2 * a.skip_steps + 5, False), "durations")
    ncu_name = collections.defaultdict(float)
    for r in rows:
        ncu_name[r["Kernel Name"]] += metric(r, "gpu__time_duration.sum") / 1e6  # ns -> ms
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:10]
    print(f"\n== kernel durations: {per_step} kernels per step; ncu over launches "
          f"{per_step * a.skip_steps}..{per_step * (a.skip_steps + 1) - 1} ({len(rows)} profiled)")
    print(f"{'kernel':<70} {'trace ms':>10} {'ncu ms':>10} {'ratio':>7}")
    worst = 0.0
    for name, ms in top:
        theirs = ncu_name.get(name)
        ratio = theirs / ms if theirs else float("nan")
        worst = max(worst, abs(ratio - 1) if theirs else 1.0)
        print(f"{name[:70]:<70} {ms:10.4f} {theirs or 0:10.4f} {ratio:7.3f}")
    total_t, total_n = sum(per_name.values()), sum(ncu_name.values())
    print(f"{'all kernels':<70} {total_t:10.4f} {total_n:10.4f} {total_n / total_t:7.3f}")
    return worst <= 0.10, f"kernel durations: the worst of the top 10 off by {100 * worst:.1f}% (10% allowed)"


def check_layer_sum(steps, ops, report):
    """The step: the summary's step_ms from REPORT (trainc profile's output: the wall time of a timed step;
    the host's step spans run ahead of the GPU), else the ops' span from first to last over the steps."""
    summary = [json.loads(l) for l in open(report) if l.startswith("{")] if report else []
    if summary and summary[-1].get("step_ms"):
        step_ms = summary[-1]["step_ms"]
    else:
        step_ms = (max(o["ts"] + o["dur"] for o in ops) - min(o["ts"] for o in ops)) / 1000.0 / len(steps)
    in_layers = sum(o["dur"] for o in ops if not o["name"].startswith("outside layers")) / 1000.0 / len(steps)
    all_ops = sum(o["dur"] for o in ops) / 1000.0 / len(steps)
    print(f"\n== layers against the step: layers {in_layers:.4f} ms, all ops {all_ops:.4f} ms, "
          f"step {step_ms:.4f} ms per step ({100 * in_layers / step_ms:.1f}%, {100 * all_ops / step_ms:.1f}%)")
    off = abs(all_ops / step_ms - 1)
    return off <= 0.05, f"per-op times sum to {100 * all_ops / step_ms:.1f}% of the step (within 5% needed)"


def largest_conv(ops):
    """The first forward op span of the convolution with the most FLOPs."""
    convs = [o for o in ops if re.match(r"conv \d+: conv2d.*forward", o["name"]) and o.get("args", {}).get("flops")]
    if not convs:
        sys.exit("ncu_check: no conv forward op spans with FLOPs in the trace")
    most = max(o["args"]["flops"] for o in convs)
    return min((o for o in convs if o["args"]["flops"] == most), key=lambda o: o["ts"])


def kernels_in(op, kernels):
    """The kernel events of an op span. The op spans are anchored where the host recorded the window's first
    event, the kernels on CUPTI's clock, so the kernels lie some tens of us later: the op's kernels are those
    from the first kernel at or after the op's start that end within the op's duration of it."""
    after = [k for k in kernels if k["ts"] >= op["ts"] and k["ts"] - op["ts"] < op["dur"] + 100]
    if not after:
        return []
    first = min(k["ts"] for k in after)
    return [k for k in kernels if first <= k["ts"] and k["ts"] + k["dur"] <= first + op["dur"] + 1]


def check_conv(a, kernels, ops):
    op = largest_conv(ops)
    layer = op["name"].split(":")[0]
    inside = kernels_in(op, kernels)
    # The layer's ops of the same step (forward and backward): NVTX's range for the layer holds all of them.
    step_ops = sorted((o for o in ops if o["name"].startswith(layer + ":") and o["ts"] >= op["ts"]),
                      key=lambda o: o["ts"])
    layer_ops = [op] + [o for o in step_ops[1:] if "backward" in o["name"]][:1]
    layer_kernels = [k for o in layer_ops for k in kernels_in(o, kernels)]
    if not inside:
        sys.exit(f"ncu_check: no kernel events inside {op['name']}")
    flops = op["args"]["flops"]
    ours = flops / (op["dur"] * 1e-6) / 1e12
    metrics = known_metrics(a, ["gpu__time_duration.sum"] + TENSOR_METRICS + FMA_METRICS + ADD_MUL_METRICS)
    # The layer's NVTX range (run.nvtx_layers) sits inside the trainer's forward and backward ranges. Two
    # steps' worth of its launches: a whole step's lies inside whatever the count per step.
    nvtx = ["--nvtx", "--nvtx-include", f"forward/{layer}/", "--nvtx-include", f"backward/{layer}/"]
    rows = run_ncu(ncu_base(a) + nvtx + ["--metrics", ",".join(metrics), "--launch-skip",
                                         str(len(layer_kernels) * a.skip_steps), "--launch-count",
                                         str(2 * len(layer_kernels))] + trainc_cmd(a, 2 * a.skip_steps + 5, True),
                   "the conv")
    names = collections.Counter(k["name"] for k in inside)
    picked, ns, ncu_flops = [], 0.0, 0.0
    for r in rows:
        if names[r["Kernel Name"]] > 0:
            names[r["Kernel Name"]] -= 1
            picked.append(r["Kernel Name"])
            ns += metric(r, "gpu__time_duration.sum") or 0
            ncu_flops += sum(metric(r, m) or 0 for m in TENSOR_METRICS)
            ncu_flops += 2 * sum(metric(r, m) or 0 for m in FMA_METRICS)
            ncu_flops += sum(metric(r, m) or 0 for m in ADD_MUL_METRICS)
    if not picked:
        sys.exit(f"ncu_check: ncu saw none of {layer}'s forward kernels {list(names)}")
    kernel_ms = sum(k["dur"] for k in inside) / 1000.0
    ncu_tflops_shape = flops / (ns * 1e-9) / 1e12
    ncu_tflops = ncu_flops / (ns * 1e-9) / 1e12
    print(f"\n== the largest convolution: {op['name']} ({flops / 1e9:.2f} GFLOP from its shape), "
          f"{len(inside)} kernels: {', '.join(sorted(set(k['name'][:60] for k in inside)))}")
    print(f"trainc: op {op['dur'] / 1000:.4f} ms (its kernels {kernel_ms:.4f} ms) -> {ours:.1f} TFLOP/s")
    print(f"ncu:    {ns / 1e6:.4f} ms -> {ncu_tflops_shape:.1f} TFLOP/s with the shape's FLOPs; "
          f"{ncu_flops / 1e9:.2f} GFLOP counted ({100 * ncu_flops / flops:.1f}% of the shape's) -> "
          f"{ncu_tflops:.1f} TFLOP/s")
    # ncu's own count where its counters saw the convolution's math (at least half the shape's FLOPs: a
    # padded or tiled kernel does somewhat more), else the shape's FLOPs over ncu's time.
    counted = ncu_flops >= 0.5 * flops
    theirs = ncu_tflops if counted else ncu_tflops_shape
    off = abs(ours / theirs - 1) if theirs > 0 else 1.0
    how = "ncu's counted FLOPs" if counted else "the shape's FLOPs over ncu's gpu__time_duration"
    return off <= 0.10, (f"largest conv ({layer}): trainc {ours:.1f} TFLOP/s, ncu {theirs:.1f} ({how}): off by "
                         f"{100 * off:.1f}% (10% allowed)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainc", default="build/trainc")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--config", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--report", help="trainc profile's output of the same run (its summary line's step_ms)")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--skip-steps", type=int, default=20)
    ap.add_argument("--kernel-base", default="mangled", choices=["mangled", "demangled", "function"])
    a = ap.parse_args()
    steps, kernels, ops = load_trace(a.trace)
    results = [check_durations(a, steps, kernels), check_layer_sum(steps, ops, a.report), check_conv(a, kernels, ops)]
    print()
    for ok, what in results:
        print(("PASS " if ok else "FAIL ") + what)
    failed = [w for ok, w in results if not ok]
    print("ncu_check: " + ("PASS" if not failed else f"FAIL ({len(failed)} of {len(results)})"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
