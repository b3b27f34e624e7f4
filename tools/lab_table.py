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
  python3 tools/lab_table.py --html lab.html      # one self-contained page: the table and chart, each
                                                  # stage's timeline (its profile's trace) at one time
                                                  # scale, its findings and a reflection (implies --diagnose)
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


def run_profile(trainc, config, sets, steps, trace=None):
    """trainc profile's findings for config: (findings as dicts, why none); with trace, its --trace file too."""
    cmd = [trainc, "profile", "--config", config, "--quiet", "--steps", steps] + (["--trace", trace] if trace else [])
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


def trace_lanes(path):
    """A profile's trace: ({(pid, tid): lane name}, [(pid, tid, name, cat, ts, dur)] of its first two steps,
    their span in us); None when it could not be read."""
    try:
        events = json.load(open(path))["traceEvents"]
    except (OSError, ValueError, KeyError):
        return None
    names, boxes = {}, []
    # the first two steps as the host ran them and, on the GPU, as the compute stream did (the host queues a
    # step and goes on: its span can be a fraction of the device's)
    steps = [s for cat in ("step", "gpu_step")
             for s in sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == cat)[:2]]
    if not steps:
        return None
    t0, t1 = min(s[0] for s in steps), max(s[1] for s in steps)
    for e in events:
        key = (e.get("pid", 0), e.get("tid", 0))
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[key] = e["args"]["name"]
        elif e.get("ph") == "X" and e["ts"] < t1 and e["ts"] + e["dur"] > t0:
            names.setdefault(key, f"track {key[1]}")
            boxes.append((*key, e["name"], e.get("cat", ""), e["ts"] - t0, e["dur"]))
    return names, boxes, t1 - t0


LANE_COLOURS = {"step": "#9aa5b1", "gpu_step": "#9aa5b1", "phase": "#7fb3d5", "op": "#82c99a"}


STREAM_ROWS = 8  # as trainc profile --html: the compute stream and the busiest others, the rest in one lane


def lane_rows(names, boxes):
    """Each track's row: a row each for every track but streams beyond STREAM_ROWS (the compute stream and the
    busiest others kept), which share the last row; returns ({key: row}, the rows' labels, the shared keys)."""
    busy = {}
    for pid, tid, _, _, _, dur in boxes:
        busy[(pid, tid)] = busy.get((pid, tid), 0) + dur
    streams = sorted((k for k in names if names[k].startswith("stream ")),
                     key=lambda k: ("(compute)" not in names[k], -busy.get(k, 0)))
    shared = set(streams[STREAM_ROWS:]) if len(streams) > STREAM_ROWS else set()
    own = [k for k in sorted(names) if k not in shared]
    rows = {k: i for i, k in enumerate(own)}
    labels = [names[k] for k in own]
    if shared:
        rows.update({k: len(own) for k in shared})
        labels.append(f"other streams ({len(shared)})")
    return rows, labels, shared


def timeline_svg(lanes, scale_us, width=1000, lane_h=16, left=170):
    """One stage's timeline: a lane per track (streams as lane_rows says), every box at scale_us for the width
    after the labels."""
    names, boxes, _ = lanes
    rows, labels, shared = lane_rows(names, boxes)
    px = (width - left - 10) / scale_us
    out = [f'<svg class="timeline" width="{width}" height="{len(labels) * lane_h + 4}">']
    for i, label in enumerate(labels):
        out.append(f'<text x="2" y="{i * lane_h + 12}" font-size="11">{escape(label)}</text>')
    for pid, tid, name, cat, ts, dur in boxes:
        y = rows[(pid, tid)] * lane_h + 2
        colour = LANE_COLOURS.get(cat, "#f5b041" if "memcpy" in cat else "#5d8aa8")
        where = f"{names[(pid, tid)]}: " if (pid, tid) in shared else ""
        out.append(f'<rect x="{left + max(ts, 0) * px:.2f}" y="{y}" width="{max(dur * px, 0.5):.2f}" '
                   f'height="{lane_h - 4}" fill="{colour}"><title>{escape(where + name[:80])}: {dur:.1f} us'
                   '</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


def switch_text(switches):
    """A finding's switches as a sentence's end."""
    return "no switch is left (those it names are on)" if switches.startswith("none") else f"the switches {switches}"


def reflection(rows):
    """Plain sentences from the measured figures: the baseline's biggest bottleneck, the stage that gained most,
    what the final stage is bound by now."""
    stages = [r for r in rows if r["who"] == "trainc"]
    out = []
    first, last = stages[0], stages[-1]
    if first.get("findings"):
        f = first["findings"][0]
        out.append(f"The biggest bottleneck at {first['version']} was {f['what']}: {f['share']:.1f}% of its step "
                   f"({f['ms']:.2f} ms); against it: {switch_text(f['switches'])}.")
    gains = [(b["samples_per_s"] / a["samples_per_s"], b) for a, b in zip(stages, stages[1:]) if a["samples_per_s"]]
    if gains:
        ratio, best = max(gains, key=lambda g: g[0])
        out.append(f"The stage that gained most was {best['version']}: {ratio:.2f}x the samples/s of the stage "
                   f"before it.")
    if last.get("findings"):
        f = last["findings"][0]
        out.append(f"{last['version']} is bound now by {f['what']} ({f['share']:.1f}% of its step); against it "
                   f"{switch_text(f['switches'])}.")
        turnable = [g for g in last["findings"] if not g["switches"].startswith("none")]
        if f["switches"].startswith("none") and turnable:
            g = turnable[0]
            out.append(f"What would help next: {g['switches']}, against {g['what']} ({g['share']:.1f}% of its "
                       f"step, a gain of {g['gain_ms']:.2f} ms).")
    elif phase_split(last):
        key, ms = max(phase_split(last), key=lambda p: p[1])
        out.append(f"{last['version']} spends most of its step in {key} ({ms:.2f} ms).")
    return out


def html_page(rows, svg_path, path):
    """The lab in one self-contained page (nothing fetched: a CSP of default-src 'none')."""
    util = lambda r: f"{100 * r['gpu_util']:.0f}%" if r.get("gpu_util") is not None else "not measured"
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">',
           "<title>the lab</title><style>body{font:13px sans-serif;margin:16px}td,th{padding:2px 8px}"
           "svg text{font-family:sans-serif}</style></head><body><h1>The lab</h1>",
           '<section id="table"><h2>Table</h2><table><tr><th>version</th><th>GPU util</th><th>samples/s</th>'
           "<th>speedup</th><th>peak GiB</th></tr>"]
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        out.append(f"<tr><td>{escape(r['version'])}</td><td>{util(r)}</td><td>{r['samples_per_s']:,.0f}</td>"
                   f"<td>{speedup}</td><td>{r.get('peak_mem_bytes', 0) / 2**30:.2f}</td></tr>")
    chart = open(svg_path).read().replace(' xmlns="http://www.w3.org/2000/svg"', "")
    out += ["</table>", chart, "</section>", '<section id="timelines"><h2>Timelines, one time scale</h2>']
    lanes = [(r, r.get("trace_lanes")) for r in rows if r.get("trace_lanes")]
    scale = max((l[2] for _, l in lanes), default=1)
    for r, l in lanes:
        out.append(f"<h3>{escape(r['version'])}: first two profiled steps, {l[2] / 1000:.3f} ms</h3>")
        out.append(timeline_svg(l, scale))
    if not lanes:
        out.append("<p>No stage's trace could be read.</p>")
    out.append('</section><section id="findings"><h2>Findings</h2>')
    for r in rows:
        if "findings" in r:
            out.append(f"<h3>{escape(r['version'])}</h3><ol>")
            out += [f"<li>{escape(finding_text(f))}</li>" for f in r["findings"]]
            out.append("</ol>" + ("" if r["findings"] else f"<p>{escape(r['diagnosis_note'])}</p>"))
    out.append('</section><section id="reflection"><h2>Reflection</h2>')
    out += [f"<p>{escape(s)}</p>" for s in reflection(rows)]
    out.append("</section></body></html>")
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
    ap.add_argument("--html", help="the lab in one self-contained page (implies --diagnose; the stages' traces "
                    "are written beside it)")
    args = ap.parse_args()
    args.diagnose |= bool(args.html)
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
            trace = None
            if args.html:
                trace = os.path.splitext(args.html)[0] + f"_{len(rows)}_" + os.path.basename(config) + ".trace.json"
            rows[-1]["findings"], rows[-1]["diagnosis_note"] = run_profile(args.trainc, config, args.set,
                                                                             args.diagnose_steps, trace)
            if trace and os.path.exists(trace):
                rows[-1]["trace_lanes"] = trace_lanes(trace)
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
    if args.html:
        html_page(rows, args.svg, args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if any(r.get("failed") for r in rows):
        sys.exit("lab_table: some runs failed (see the table)")


if __name__ == "__main__":
    main()
