#!/usr/bin/env python3
"""Plot a trainc run: loss, samples/s and test accuracy over steps, from its metrics file.

Usage:
    python3 tools/plot_run.py METRICS.jsonl [-o run.svg|run.png] [--title TEXT] [--no-matplotlib]

METRICS.jsonl is what trainc appends to run.metrics_file: one JSON object a
line; the {"step": .., "loss": .., "samples_per_s": ..} lines (one per
run.log_every steps) are plotted, loss above and samples/s below, against the
optimizer step. The {"epoch_end": .., "test_acc": ..} lines of runs that
evaluated give a test-accuracy panel (%) against the step. With {"gpu_sample": ..} lines (monitor.sample_every_s on the
GPU) a third panel shows GPU utilisation (%) against seconds since the start.
A file that several runs appended to is plotted as one series per run (a run
starts where the step number goes back). A loss that is null (not finite)
leaves a gap.

Draws with matplotlib where it is installed (any format it writes, by the
output's extension); without it, or with --no-matplotlib, writes the SVG by
hand, beside the output asked for when that is not an SVG (-o run.png writes
run.svg and says so). The default output is the input's name with .svg.
"""
import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

W, PANEL_H, LEFT, RIGHT, TOP, GAP = 760, 220, 70, 20, 40, 50
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def number(v):
    """A JSON value as a float: null (trainc's non-finite) is NaN."""
    return float(v) if isinstance(v, (int, float)) else math.nan


def read_metrics(path):
    runs, accs, gpu = [[]], [[]], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            if not isinstance(obj, dict):
                sys.exit(f"{path}:{n}: not a JSON object")
            if "gpu_sample" in obj and obj.get("util") is not None:
                gpu.append((number(obj["gpu_sample"]), number(obj["util"])))
            elif "loss" in obj and "samples_per_s" in obj and "step" in obj:
                if runs[-1] and obj["step"] <= runs[-1][-1][0]:
                    runs.append([])
                    accs.append([])
                runs[-1].append((obj["step"], number(obj["loss"]), number(obj["samples_per_s"])))
            elif "epoch_end" in obj and "step" in obj and math.isfinite(number(obj.get("test_acc"))):
                accs[-1].append((obj["step"], 100 * number(obj["test_acc"])))
    kept = [i for i, r in enumerate(runs) if r]
    return [runs[i] for i in kept], [accs[i] for i in kept], gpu


def panels_of(runs, accs, gpu):
    """(title, x label, series [[(x, y)]], series names, y from 0) for each panel."""
    names = [f"run {i + 1}" for i in range(len(runs))]
    panels = [("loss", "step", [[(s, l) for s, l, _ in r] for r in runs], names, False),
              ("samples/s", "step", [[(s, v) for s, _, v in r] for r in runs], names, True)]
    if any(accs):
        panels.append(("test accuracy (%)", "step", accs, names, False))
    if gpu:
        t0 = gpu[0][0]
        panels.append(("GPU utilisation (%)", "seconds", [[(t - t0, u) for t, u in gpu]], ["gpu"], True))
    return panels


# ---- matplotlib ----------------------------------------------------------------

def plot_matplotlib(plt, panels, title, out_path):
    try:
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.8 * len(panels)), squeeze=False,
                                 layout="constrained")
    except TypeError:  # matplotlib before 3.5
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.8 * len(panels)), squeeze=False)
    for ax, (ptitle, xlabel, series, names, from_zero) in zip(axes[:, 0], panels):
        for i, s in enumerate(series):
            xs, ys = [p[0] for p in s], [p[1] for p in s]
            ax.plot(xs, ys, color=COLORS[i % len(COLORS)], linewidth=1.5, marker="o" if len(s) == 1 else None,
                    label=names[i])
        ax.set_title(ptitle, loc="left", fontsize=11, fontweight="bold")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if from_zero:
            ax.set_ylim(bottom=0)
        if len(series) > 1:
            ax.legend(loc="best", fontsize=9)
    fig.suptitle(title)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


# ---- the SVG by hand -------------------------------------------------------------

def nice_ticks(lo, hi, n=5):
    """Round ticks from at or below lo to at or above hi, about n steps apart."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1 if math.isfinite(lo) else 1
        lo = lo if math.isfinite(lo) else 0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1e4:
        return f"{v:,.0f}"
    if abs(v) < 1e-3:
        return f"{v:.1e}"
    return f"{v:.6g}"


def finite_runs(s):
    """The series cut into pieces of finite points (a NaN is a gap)."""
    pieces, cur = [], []
    for x, y in s:
        if math.isfinite(y):
            cur.append((x, y))
        elif cur:
            pieces.append(cur)
            cur = []
    if cur:
        pieces.append(cur)
    return pieces


def svg_panel(out, y0, ptitle, xlabel, series, names, from_zero):
    """Axes, ticks and lines of one panel whose plot area starts at height y0;
    the axes reach past the data on both ends, so nothing is drawn outside."""
    pw = W - LEFT - RIGHT
    out.append(f'<text x="{LEFT}" y="{y0 - 8}" font-size="13" font-weight="bold">{escape(ptitle)}</text>')
    out.append(f'<rect x="{LEFT}" y="{y0}" width="{pw}" height="{PANEL_H}" fill="none" stroke="#888"/>')
    pts = [p for s in series for p in s if math.isfinite(p[1])]
    if not pts:
        out.append(f'<text x="{LEFT + pw / 2}" y="{y0 + PANEL_H / 2}" font-size="12" text-anchor="middle" '
                   f'fill="#888">no finite values</text>')
        return
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xt = nice_ticks(min(xs), max(xs))
    yt = nice_ticks(min(0, min(ys)) if from_zero else min(ys), max(ys))
    x0, x1, ylo, yhi = xt[0], xt[-1], yt[0], yt[-1]

    def px(x):
        return LEFT + (x - x0) / (x1 - x0) * pw

    def py(y):
        return y0 + PANEL_H - (y - ylo) / (yhi - ylo) * PANEL_H

    for t in yt:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" font-size="11" text-anchor="end">{fmt(t)}</text>')
    for t in xt:
        out.append(f'<text x="{px(t):.1f}" y="{y0 + PANEL_H + 15}" font-size="11" '
                   f'text-anchor="middle">{fmt(t)}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{y0 + PANEL_H + 30}" font-size="11" '
               f'text-anchor="middle">{escape(xlabel)}</text>')
    legend_x = LEFT + pw
    for i in reversed(range(len(series))):
        color = COLORS[i % len(COLORS)]
        for piece in finite_runs(series[i]):
            if len(piece) == 1:
                x, y = piece[0]
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>')
            else:
                path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in piece)
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        if len(series) > 1:  # the legend on the title's line, right-aligned
            out.append(f'<text x="{legend_x}" y="{y0 - 8}" font-size="11" fill="{color}" '
                       f'text-anchor="end">{escape(names[i])}</text>')
            legend_x -= 8 * len(names[i]) + 12


def plot_svg(panels, title, out_path):
    height = TOP + len(panels) * (PANEL_H + GAP + 20)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{W / 2}" y="20" font-size="15" text-anchor="middle">{escape(title)}</text>']
    y = TOP + 10
    for ptitle, xlabel, series, names, from_zero in panels:
        svg_panel(out, y, ptitle, xlabel, series, names, from_zero)
        y += PANEL_H + GAP + 20
    out.append("</svg>")
    with open(out_path, "w") as f:
        f.write("\n".join(out) + "\n")


def load_matplotlib():
    """pyplot on the Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", help="trainc run.metrics_file (JSON lines)")
    ap.add_argument("-o", "--output", help="file to write (default: METRICS with .svg); without matplotlib an SVG")
    ap.add_argument("--title", help="title above the plots (default: the file name)")
    ap.add_argument("--no-matplotlib", action="store_true", help="write the SVG by hand even with matplotlib")
    args = ap.parse_args()
    runs, accs, gpu = read_metrics(args.metrics)
    if not runs:
        sys.exit(f"{args.metrics}: no step lines (loss, samples_per_s): was run.log_every larger than the run?")
    out_path = args.output or os.path.splitext(args.metrics)[0] + ".svg"
    title = args.title or os.path.basename(args.metrics)
    panels = panels_of(runs, accs, gpu)
    plt = None if args.no_matplotlib else load_matplotlib()
    if plt:
        plot_matplotlib(plt, panels, title, out_path)
    else:
        if not out_path.lower().endswith(".svg"):
            why = "--no-matplotlib" if args.no_matplotlib else "matplotlib is not installed"
            svg_path = os.path.splitext(out_path)[0] + ".svg"
            print(f"{out_path}: {why}, so the plot is an SVG: {svg_path}", file=sys.stderr)
            out_path = svg_path
        plot_svg(panels, title, out_path)
    print(out_path)


if __name__ == "__main__":
    main()
