#!/usr/bin/env python3
"""The lab's table: run a list of trainc configs on one card over the same
timed window and print version, GPU util, throughput, speedup over the first,
peak memory; write it as CSV and draw it as an SVG chart: samples/s, and
each run's step split into its phases (the summary's phase_ms). A run that
fails or times no step shows 0 samples/s and why (its error and exit status,
or trainc's warning); the table is still written, and a failed run makes the
exit status 1.

  python3 tools/lab_table.py                      # baseline, dataloader, model, memory, final
  python3 tools/lab_table.py --configs configs/dataloader.ini,configs/final.ini \
      --set run.max_steps=200                     # any list: an ablation
  python3 tools/lab_table.py --torch-json torch.jsonl   # add PyTorch rows (summary lines)
  python3 tools/lab_table.py --diagnose           # and each stage's `trainc profile` findings,
                                                  # printed and written to lab_report.md
  python3 tools/lab_table.py --stages imagenet --data /tmp/imnet --set run.max_steps=200
                                                  # the ImageNet case's stages on a folder (ResNet-50)
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
from xml.sax.saxutils import escape

STAGES = ["baseline", "dataloader", "model", "memory", "final"]
# The ImageNet case's stages (configs/imagenet_*.ini): --stages imagenet --data DIR.
IMAGENET_STAGES = ["imagenet_baseline", "imagenet_workers", "imagenet_amp", "imagenet_batch256", "imagenet_final"]


def last_line(text, part=""):
    """The last non-empty line of text that contains part, without the log's
    "[  time] " ("" if none)."""
    lines = [re.sub(r"^\[\s*[0-9.]+\]\s*", "", l.strip()) for l in text.splitlines() if l.strip() and part in l]
    return lines[-1] if lines else ""


def zero_reason(p, summary):
    """Why a run gave no samples/s: its error and exit status, or the warning
    that says why nothing was timed."""
    if p.returncode != 0:
        status = f"exit status {p.returncode}" if p.returncode > 0 else f"killed by signal {-p.returncode}"
        error = last_line(p.stderr, "error:") or last_line(p.stderr)
        return f"{status}: {error}" if error else status
    if summary is None:
        return "no summary line on stdout"
    warning = last_line(p.stderr, "samples_per_s is 0") or last_line(p.stderr, "warning:")
    if summary.get("stopped"):
        return "stopped early" + (f": {warning}" if warning else "")
    if warning:
        return warning
    return f"no timed steps ({summary.get('timed_steps', 0)} of {summary.get('steps', 0)} steps timed)"


def run_trainc(trainc, config, sets):
    """The run's summary; samples_per_s 0 and a 'note' saying why when it failed or timed nothing."""
    cmd = [trainc, "--config", config, "--quiet", "--set", "run.save_final=off"]  # a measurement, not a model
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    summary = None
    lines = p.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        try:
            summary = json.loads(lines[-1])
        except json.JSONDecodeError:
            summary = None
    s = {"gpu": "-", "gpu_util": None, "samples_per_s": 0.0, "peak_mem_bytes": 0, "failed": p.returncode != 0}
    if p.returncode == 0 and summary is not None:
        s.update(summary)
    if not s.get("samples_per_s"):
        s["samples_per_s"] = 0.0
        s["note"] = zero_reason(p, summary)
    return s


# The step's phases as the summary's phase_ms names them, and their colours;
# "rest" is the step less the others (host work between them, syncs).
PHASES = [("data_wait", "data wait", "#e45756"), ("input", "input", "#f58518"), ("forward", "forward", "#4c78a8"),
          ("backward", "backward", "#72b7b2"), ("optimizer", "optimizer", "#54a24b"),
          ("graph", "graph (fwd+bwd+opt)", "#b279a2"), ("rest", "rest", "#bab0ac")]

# trainc profile's findings (docs/usage.md): "finding N: what | X ms/step | Y% of the step |
# gain G ms (Fx) | switches: S | from: F"
FINDING = re.compile(r"^finding (\d+): (.*?) \| ([0-9.]+) ms/step \| ([0-9.]+)% of the step \| "
                     r"gain ([0-9.]+) ms \(([0-9.]+)x\) \| switches: (.*?) \| from: (.*)$")


def phase_split(summary):
    """[(phase key, ms)] of a run's step, or None without phase_ms."""
    ph = summary.get("phase_ms") or {}
    step = ph.get("step")
    if not step:
        return None
    parts = [(k, ph.get(k) or 0.0) for k, _, _ in PHASES if k != "rest"]
    parts.append(("rest", max(0.0, step - sum(ms for _, ms in parts))))
    return parts


def run_profile(trainc, config, sets, steps):
    """trainc profile's findings for config: (findings as dicts, why none)."""
    cmd = [trainc, "profile", "--config", config, "--quiet", "--steps", steps]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        return [], f"profile failed, exit status {p.returncode}: {last_line(p.stderr, 'error:') or last_line(p.stderr)}"
    found = []
    for line in p.stdout.splitlines():
        m = FINDING.match(line.strip())
        if m:
            keys = ["rank", "what", "ms", "share", "gain_ms", "speedup", "switches", "from"]
            f = dict(zip(keys, m.groups()))
            for k in ("ms", "share", "gain_ms", "speedup"):
                f[k] = float(f[k])
            found.append(f)
    return found, "" if found else "no bottleneck over 5% of the step"


def finding_text(f):
    return (f"{f['what']}: {f['ms']:.2f} ms/step ({f['share']:.1f}%), gain {f['gain_ms']:.2f} ms "
            f"({f['speedup']:.2f}x); switches: {f['switches']}")


def write_report(rows, path, top):
    """The lab's report: the table, then each stage's findings (markdown)."""
    out = ["# The lab's table and diagnosis", "",
           "| version | GPU util | samples/s | speedup | peak GiB |", "|---|---|---|---|---|"]
    for r in rows:
        util = f"{100 * r['gpu_util']:.0f}%" if r.get("gpu_util") is not None else "-"
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        out.append(f"| {r['version']} | {util} | {r['samples_per_s']:,.0f} | {speedup} | "
                   f"{r.get('peak_mem_bytes', 0) / 2**30:.2f} |")
    for r in rows:
        if "findings" not in r:
            continue
        out += ["", f"## {r['version']}", ""]
        if not r["findings"]:
            out.append(f"- {r['diagnosis_note']}")
        for f in r["findings"][:top]:
            out.append(f"{f['rank']}. **{f['what']}**: {f['ms']:.2f} ms per step ({f['share']:.1f}%), estimated gain "
                       f"{f['gain_ms']:.2f} ms ({f['speedup']:.2f}x); switches: `{f['switches']}`; from: {f['from']}")
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")


def svg_chart(rows, path):
    """Horizontal bars of samples/s, one per row, labelled with the speedup;
    under them each trainc run's step as a stacked bar of its phases."""
    width, bar_h, gap, left = 760, 26, 10, 230
    split = [(r, phase_split(r)) for r in rows if r["who"] == "trainc" and phase_split(r)]
    breakdown_h = 60 + len(split) * (bar_h + gap) + 30 if split else 0
    height = 60 + len(rows) * (bar_h + gap) + breakdown_h
    top = max(r["samples_per_s"] for r in rows) or 1
    gpu = next((r["gpu"] for r in rows if r.get("gpu") not in (None, "", "-")), None)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="13">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="24" font-size="16">samples/s{" on " + escape(str(gpu)) if gpu else ""}</text>']
    for i, r in enumerate(rows):
        y = 44 + i * (bar_h + gap)
        w = (width - left - 120) * r["samples_per_s"] / top
        color = "#4c78a8" if r["who"] == "trainc" else "#f58518"
        out.append(f'<text x="10" y="{y + 18}">{escape(r["version"])}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
        if r.get("note"):
            note = r["note"] if len(r["note"]) <= 60 else r["note"][:59] + "\u2026"
            label = f"0: {note}"
        else:
            label = f"{r['samples_per_s']:,.0f} ({r['speedup']:.2f}x)" if r.get("speedup") else \
                f"{r['samples_per_s']:,.0f}"
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + 18}">{escape(label)}</text>')
    if split:
        y0 = 60 + len(rows) * (bar_h + gap)
        longest = max(sum(ms for _, ms in parts) for _, parts in split) or 1
        out.append(f'<text x="10" y="{y0 + 16}" font-size="16">ms per step by phase</text>')
        for i, (r, parts) in enumerate(split):
            y, x = y0 + 30 + i * (bar_h + gap), left
            out.append(f'<text x="10" y="{y + 18}">{escape(r["version"])}</text>')
            for key, ms in parts:
                w = (width - left - 120) * ms / longest
                color = next(c for k, _, c in PHASES if k == key)
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}">'
                           f'<title>{escape(key)} {ms:.3f} ms</title></rect>')
                x += w
            out.append(f'<text x="{x + 6:.1f}" y="{y + 18}">{sum(ms for _, ms in parts):.2f} ms</text>')
        y, x = y0 + 30 + len(split) * (bar_h + gap), 10
        for _, name, color in PHASES:
            out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{color}"/>')
            out.append(f'<text x="{x + 16}" y="{y + 11}">{escape(name)}</text>')
            x += 24 + 8 * len(name)
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainc", default="build/trainc")
    ap.add_argument("--configs", help="a comma-separated list of configs (default: the --stages')")
    ap.add_argument("--stages", choices=["lab", "imagenet"], default="lab",
                    help="lab: the lab's five configs; imagenet: configs/imagenet_*.ini (with --data)")
    ap.add_argument("--data", help="data.path for every config (the ImageNet stages' folder or shards)")
    ap.add_argument("--set", action="append", default=[], help="applied to every config")
    ap.add_argument("--torch-json", help="JSON summary lines of PyTorch runs to add as rows")
    ap.add_argument("--csv", default="lab_table.csv")
    ap.add_argument("--svg", default="lab_table.svg")
    ap.add_argument("--diagnose", action="store_true",
                    help="also run `trainc profile` on each config and add its top findings (and --report)")
    ap.add_argument("--diagnose-steps", default="11:30", help="the profiled window, trainc profile's --steps A:B")
    ap.add_argument("--top", type=int, default=8, help="findings shown per stage (default: all, 8 at most)")
    ap.add_argument("--report", default="lab_report.md", help="with --diagnose: the markdown report")
    args = ap.parse_args()
    if not args.configs:
        args.configs = ",".join(f"configs/{s}.ini" for s in (IMAGENET_STAGES if args.stages == "imagenet" else STAGES))
    if args.data:
        args.set = [f"data.path={args.data}"] + args.set
    elif args.stages == "imagenet":
        ap.error("--stages imagenet needs --data DIR: an ImageNet-layout folder (tools/make_image_set.py makes one)")

    rows = []
    for config in args.configs.split(","):
        s = run_trainc(args.trainc, config, args.set)
        rows.append({"who": "trainc", "version": "trainc " + os.path.splitext(os.path.basename(config))[0], **s})
        if s.get("note"):
            print(f"ran {config}: 0 samples/s: {s['note']}", file=sys.stderr)
        else:
            print(f"ran {config}: {s['samples_per_s']:.0f} samples/s", file=sys.stderr)
        if args.diagnose:
            rows[-1]["findings"], rows[-1]["diagnosis_note"] = run_profile(args.trainc, config, args.set,
                                                                             args.diagnose_steps)
            print(f"profiled {config}: {len(rows[-1]['findings'])} findings", file=sys.stderr)
    if args.torch_json:
        for line in open(args.torch_json):
            if line.strip():
                s = json.loads(line)
                rows.append({"who": "pytorch", "version": "PyTorch " + s["name"], **s})
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup"] = r["samples_per_s"] / base if base else None
    print(f"{'version':<28} {'GPU util':>8} {'samples/s':>10} {'speedup':>8} {'peak GiB':>9}")
    for r in rows:
        util = f"{100 * r['gpu_util']:.0f}%" if r.get("gpu_util") is not None else "-"
        speedup = f"{r['speedup']:>7.2f}x" if r["speedup"] is not None else f"{'-':>8}"
        line = (f"{r['version']:<28} {util:>8} {r['samples_per_s']:>10,.0f} {speedup} "
                f"{r.get('peak_mem_bytes', 0) / 2**30:>9.2f}")
        if r.get("note"):
            line += f"  ({r['note']})"
        print(line)
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["version", "gpu", "gpu_util", "samples_per_s", "speedup", "peak_mem_bytes", "note"])
        for r in rows:
            w.writerow([r["version"], r["gpu"], r.get("gpu_util"), round(r["samples_per_s"], 1),
                        round(r["speedup"], 3) if r["speedup"] is not None else None, r.get("peak_mem_bytes"),
                        r.get("note", "")])
    for r in rows:
        if "findings" in r:
            print(f"\ndiagnosis of {r['version']} (trainc profile --steps {args.diagnose_steps}):")
            for f in r["findings"][:args.top]:
                print(f"  {f['rank']}. {finding_text(f)}")
            if not r["findings"]:
                print(f"  {r['diagnosis_note']}")
    if args.diagnose:
        write_report(rows, args.report, args.top)
    svg_chart(rows, args.svg)
    if any(r.get("failed") for r in rows):
        sys.exit("lab_table: some runs failed (see the table)")


if __name__ == "__main__":
    main()
