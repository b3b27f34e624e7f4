#!/usr/bin/env python3
"""The lab's table: run a list of trainc configs on one card over the same
timed window and print version, GPU util, throughput, speedup over the first,
peak memory; write it as CSV and draw it as an SVG bar chart.

  python3 tools/lab_table.py                      # baseline, dataloader, model, memory, final
  python3 tools/lab_table.py --configs configs/dataloader.ini,configs/final.ini \
      --set run.max_steps=200                     # any list: an ablation
  python3 tools/lab_table.py --torch-json torch.jsonl   # add PyTorch rows (summary lines)
"""
import argparse
import csv
import json
import os
import subprocess
import sys

STAGES = ["baseline", "dataloader", "model", "memory", "final"]


def run_trainc(trainc, config, sets):
    cmd = [trainc, "--config", config, "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr.strip()}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def svg_chart(rows, path):
    """Horizontal bars of samples/s, one per row, labelled with the speedup."""
    width, bar_h, gap, left = 760, 26, 10, 230
    height = 60 + len(rows) * (bar_h + gap)
    top = max(r["samples_per_s"] for r in rows) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="13">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="24" font-size="16">samples/s on {rows[0]["gpu"]}</text>']
    for i, r in enumerate(rows):
        y = 44 + i * (bar_h + gap)
        w = (width - left - 120) * r["samples_per_s"] / top
        color = "#4c78a8" if r["who"] == "trainc" else "#f58518"
        out.append(f'<text x="10" y="{y + 18}">{r["version"]}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + 18}">{r["samples_per_s"]:,.0f} '
                   f'({r["speedup"]:.2f}x)</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainc", default="build/trainc")
    ap.add_argument("--configs", default=",".join(f"configs/{s}.ini" for s in STAGES))
    ap.add_argument("--set", action="append", default=[], help="applied to every config")
    ap.add_argument("--torch-json", help="JSON summary lines of PyTorch runs to add as rows")
    ap.add_argument("--csv", default="lab_table.csv")
    ap.add_argument("--svg", default="lab_table.svg")
    args = ap.parse_args()

    rows = []
    for config in args.configs.split(","):
        s = run_trainc(args.trainc, config, args.set)
        rows.append({"who": "trainc", "version": "trainc " + os.path.splitext(os.path.basename(config))[0], **s})
        print(f"ran {config}: {s['samples_per_s']:.0f} samples/s", file=sys.stderr)
    if args.torch_json:
        for line in open(args.torch_json):
            if line.strip():
                s = json.loads(line)
                rows.append({"who": "pytorch", "version": "PyTorch " + s["name"], **s})
    base = rows[0]["samples_per_s"] or 1
    for r in rows:
        r["speedup"] = r["samples_per_s"] / base
    print(f"{'version':<28} {'GPU util':>8} {'samples/s':>10} {'speedup':>8} {'peak GiB':>9}")
    for r in rows:
        util = f"{100 * r['gpu_util']:.0f}%" if r.get("gpu_util") is not None else "-"
        print(f"{r['version']:<28} {util:>8} {r['samples_per_s']:>10,.0f} {r['speedup']:>7.2f}x "
              f"{r['peak_mem_bytes'] / 2**30:>9.2f}")
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["version", "gpu", "gpu_util", "samples_per_s", "speedup", "peak_mem_bytes"])
        for r in rows:
            w.writerow([r["version"], r["gpu"], r.get("gpu_util"), round(r["samples_per_s"], 1),
                        round(r["speedup"], 3), r["peak_mem_bytes"]])
    svg_chart(rows, args.svg)


if __name__ == "__main__":
    main()
