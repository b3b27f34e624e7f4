#!/usr/bin/env python3
"""Plot a trainc run: loss and samples/s over steps, from its metrics file.

Usage:
    python3 tools/plot_run.py METRICS.jsonl [-o run.svg] [--title TEXT]

METRICS.jsonl is what trainc appends to run.metrics_file: one JSON object a
line; the {"step": .., "loss": .., "samples_per_s": ..} lines (one per
run.log_every steps) are plotted, loss above and samples/s below, against the
optimizer step. With {"gpu_sample": ..} lines (monitor.sample_every_s on the
GPU) a third panel shows GPU utilisation (%) against seconds since the start.
A file that several runs appended to is plotted as one series per run (a run
starts where the step number goes back). Writes an SVG by hand (no matplotlib
needed); the default output is the input's name with .svg.
"""
import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

W, PANEL_H, LEFT, RIGHT, TOP, GAP = 760, 220, 70, 20, 40, 50
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def read_metrics(path):
    runs, gpu = [[]], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            if "gpu_sample" in obj and obj.get("util") is not None:
                gpu.append((obj["gpu_sample"], obj["util"]))
            elif "loss" in obj and "samples_per_s" in obj and "step" in obj:
                if runs[-1] and obj["step"] <= runs[-1][-1][0]:
                    runs.append([])
                runs[-1].append((obj["step"], obj["loss"], obj["samples_per_s"]))
    return [r for r in runs if r], gpu


def nice_ticks(lo, hi, n=5):
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + 1e-9 * step:
        ticks.append(t)
        t += step
    return ticks


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-2:
        return f"{v:.2g}"
    return f"{v:g}" if v == int(v) else f"{v:.3g}"


def panel(out, y0, title, xlabel, series, names):
    """series: list of [(x, y)]; draws axes, ticks and polylines at height y0."""
    pts = [p for s in series for p in s if math.isfinite(p[1])]
    if not pts:
        return
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    xt, yt = nice_ticks(min(xs), max(xs)), nice_ticks(min(0, min(ys)), max(ys))
    x0, x1, ylo, yhi = xt[0], xt[-1], yt[0], yt[-1]
    pw = W - LEFT - RIGHT

    def px(x):
        return LEFT + (x - x0) / ((x1 - x0) or 1) * pw

    def py(y):
        return y0 + PANEL_H - (y - ylo) / ((yhi - ylo) or 1) * PANEL_H

    out.append(f'<text x="{LEFT}" y="{y0 - 8}" font-size="13" font-weight="bold">{escape(title)}</text>')
    out.append(f'<rect x="{LEFT}" y="{y0}" width="{pw}" height="{PANEL_H}" fill="none" stroke="#888"/>')
    for t in yt:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" font-size="11" text-anchor="end">{fmt(t)}</text>')
    for t in xt:
        out.append(f'<text x="{px(t):.1f}" y="{y0 + PANEL_H + 15}" font-size="11" '
                   f'text-anchor="middle">{fmt(t)}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{y0 + PANEL_H + 30}" font-size="11" '
               f'text-anchor="middle">{escape(xlabel)}</text>')
    for i, s in enumerate(series):
        s = [p for p in s if math.isfinite(p[1])]
        if not s:
            continue
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        if len(series) > 1:
            out.append(f'<text x="{LEFT + pw - 4}" y="{y0 + 14 + 14 * i}" font-size="11" fill="{color}" '
                       f'text-anchor="end">{escape(names[i])}</text>')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", help="trainc run.metrics_file (JSON lines)")
    ap.add_argument("-o", "--output", help="SVG to write (default: METRICS with .svg)")
    ap.add_argument("--title", help="title above the plots (default: the file name)")
    args = ap.parse_args()
    runs, gpu = read_metrics(args.metrics)
    if not runs:
        sys.exit(f"{args.metrics}: no step lines (loss, samples_per_s): was run.log_every larger than the run?")
    out_path = args.output or os.path.splitext(args.metrics)[0] + ".svg"
    names = [f"run {i + 1}" for i in range(len(runs))]
    panels = 3 if gpu else 2
    height = TOP + panels * (PANEL_H + GAP + 20)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{W / 2}" y="20" font-size="15" text-anchor="middle">'
           f'{escape(args.title or os.path.basename(args.metrics))}</text>']
    y = TOP + 10
    panel(out, y, "loss", "step", [[(s, l) for s, l, _ in r] for r in runs], names)
    y += PANEL_H + GAP + 20
    panel(out, y, "samples/s", "step", [[(s, v) for s, _, v in r] for r in runs], names)
    if gpu:
        y += PANEL_H + GAP + 20
        t0 = gpu[0][0]
        panel(out, y, "GPU utilisation (%)", "seconds", [[(t - t0, u) for t, u in gpu]], ["gpu"])
    out.append("</svg>")
    with open(out_path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(out_path)


if __name__ == "__main__":
    main()
