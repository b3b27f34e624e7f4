#!/usr/bin/env python3
"""The lab's task 5.1, weak scaling: the same per-GPU batch on 1, 2, 4 ... GPUs,
trainc under mpirun and (optionally) PyTorch DDP (tools/torch_ddp.py), with time
per epoch, samples/s, speedup over 1 GPU and weak-scaling efficiency
samples_per_s(N) / (N x samples_per_s(1)); a table, a CSV and an SVG chart.

  python3 tools/scaling.py --config configs/ddp.ini --gpus 1,2,4 \
      --set data.resident=on --set run.eval=off --set run.max_steps=300 \
      --torch="--model simplenet --image-size 224 --batch 256 --data-on-gpu --steps 280" \
      --csv out/scaling.csv --svg out/scaling.svg

Each trainc run is
  mpirun -np N --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0 \
      -x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x NVSHMEM_DISABLE_NVLS=1 [-x NCCL_DEBUG=VERSION] \
      [--mpi-args ...] TRAINC --config CONFIG --quiet --set ...
(--bind-to none: Open MPI would otherwise pin each rank, loader threads included, to
one core). Each PyTorch run is the same mpirun line with `python3 tools/torch_ddp.py
ARGS` (or torchrun --standalone --nproc_per_node N, --torch-launcher torchrun).
Give --torch with `=` (--torch="--model ...") so its value may start with dashes.

The summary is the last stdout line that parses as a JSON object with samples_per_s
(rank 0's where the lines say which rank printed them). A summary with
per_gpu_samples_per_s or world counts samples_per_s as global; one without either
is taken as global too unless --trainc-per-rank says rank 0 printed its own rate
(then x N). Time per epoch is the summary's epoch_s, else epoch_s_est, else
--train-size / samples_per_s (marked ~). A run that fails or times out is reported
and skipped; its log is kept in --log-dir. With --nccl-debug INFO the transports
NCCL's channels use ("NET/Socket", "P2P/CUMEM", "SHM") are read from each run's
output into the table's and the CSV's transport column.

With --each-card each series' 1-GPU case also runs on each of the first max(--gpus)
cards alone (CUDA_VISIBLE_DEVICES set to that card), before the series, and every
N-GPU row gets efficiency_cards = samples_per_s(N) / the sum of its N cards' rates
alone: synchronous training runs at its slowest card's pace, so the cards' own
spread is told apart from what the exchange costs.
"""
import argparse
import csv
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLORS = {"trainc": "#4c78a8", "pytorch": "#f58518"}
MPI_NOISE = re.compile(r"^-{10,}$|Primary job|non-zero exit code|job has been aborted|mpirun (detected|noticed)|"
                       r"Process name:|Exit code:|job to be terminated|first process to do so|^\s*$")
RANK_PREFIX = re.compile(r"^\[(\d+),(\d+)\]<(stdout|stderr)>:\s?")
OTHER_PREFIX = re.compile(r"^\[?\s*(?:rank\s*)?(\d+)\s*\]?\s*:?\s*(\{.*\})\s*$")


def sh(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return p.stdout.strip() if p.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_names():
    out = sh(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return [l.strip() for l in out.splitlines() if l.strip()]


def card_ids(names):
    """The visible cards' CUDA_VISIBLE_DEVICES values, in rank order."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() != "":
        return [d.strip() for d in cvd.split(",") if d.strip() and d.strip() != "-1"]
    return [str(i) for i in range(len(names))]


def visible_gpus(names):
    return len(card_ids(names))


def cards_alone(args, name, make, cards, log_dir, tag):
    """The series' 1-GPU samples/s on each card by itself: {card index: rate}, None where a run failed."""
    rates = {}
    for k, card in enumerate(cards):
        cmd = make(args, 1)
        env = child_env(args)
        env["CUDA_VISIBLE_DEVICES"] = card
        log_path = os.path.join(log_dir, f"scaling{'_' + tag if tag else ''}_{name}_card{card}.log")
        print(f"{name} card {card} alone: CUDA_VISIBLE_DEVICES={card} {shlex.join(cmd)}", flush=True)
        rc, out, err, secs = run(cmd, args.timeout, env, log_path)
        s = parse_summary(out)
        rates[k] = s.get("samples_per_s") if rc == 0 and s else None
        print(f"  {fmt(rates[k], ',.0f')} samples/s ({secs:.0f} s)" if rates[k] else
              f"  failed ({'timed out' if rc is None else f'exit {rc}'}): no efficiency against the cards alone"
              f"  [log: {log_path}]", flush=True)
    return rates


def nccl_from_logs(logs):
    """The NCCL version a run printed (NCCL_DEBUG=VERSION makes NCCL print it at init)."""
    for text in logs:
        m = re.search(r"NCCL version\s+(\S+)", text) or re.search(r"NCCL[ _-]?v?(\d+\.\d+\.\d+\S*)", text)
        if m:
            return m.group(1)
    return None


def transports(text):
    """The transports NCCL_DEBUG=INFO says its channels use ("via NET/Socket/0", "via P2P/CUMEM/read",
    "via SHM/direct/direct"): their first two parts, e.g. "NET/Socket", sorted; '' where it said none."""
    return ",".join(sorted({m.group(1) for m in re.finditer(r"\bvia ([A-Za-z0-9]+(?:/[A-Za-z]+)?)", text)}))


def nccl_torch():
    try:
        import torch
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        return None


def nccl_versions(logs):
    """'trainc X, torch Y': torch.cuda.nccl.version() where torch imports, else what the logs say."""
    parts = []
    for name in ("trainc", "pytorch"):
        v = nccl_from_logs(logs.get(name, []))
        if name == "pytorch":
            v = nccl_torch() or v
        if v:
            parts.append(f"{name} {v}")
    if not parts:
        v = nccl_torch()
        if v:
            parts.append(f"torch {v}")
    return ", ".join(parts) or None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout, env, log_path):
    """Runs cmd in its own process group; on timeout the group gets SIGTERM, then SIGKILL.
    Returns (returncode or None on timeout, stdout, stderr, seconds)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    except OSError as e:
        return -1, "", f"cannot start {cmd[0]}: {e}", 0.0
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = p.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        out, err = out or "", (err or "") + f"\nscaling.py: timed out after {timeout:.0f} s"
        rc = None
    secs = time.perf_counter() - t0
    if log_path:
        with open(log_path, "w") as f:
            f.write("$ " + shlex.join(cmd) + "\n")
            f.write(f"# exit {rc}, {secs:.1f} s\n--- stdout\n{out}\n--- stderr\n{err}\n")
    return rc, out, err, secs


def parse_summaries(stdout):
    """Every summary line: (rank or None, dict) for each JSON object with samples_per_s. A line may
    carry mpirun --tag-output's "[job,rank]<stdout>:" or a "[rank]" / "rank N:" prefix."""
    found = []
    for line in stdout.splitlines():
        rank = None
        m = RANK_PREFIX.match(line)
        if m:
            rank, line = int(m.group(2)), line[m.end():]
        line = line.strip()
        if not line.startswith("{"):
            m = OTHER_PREFIX.match(line)
            if not m:
                continue
            rank, line = int(m.group(1)), m.group(2)
        try:
            s = json.loads(line)
        except ValueError:
            continue
        if isinstance(s, dict) and "samples_per_s" in s:
            if rank is None and isinstance(s.get("rank"), int):
                rank = s["rank"]
            found.append((rank, s))
    return found


def parse_summary(stdout):
    """The summary: rank 0's JSON object with samples_per_s, else the last such line."""
    found = parse_summaries(stdout)
    if not found:
        return None
    rank0 = [s for r, s in found if r == 0]
    return rank0[-1] if rank0 else found[-1][1]


def mpirun_prefix(args, n):
    cmd = [args.mpirun, "-np", str(n), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    if args.tag_output:
        cmd.append("--tag-output")
    env = dict(SAFE_ENV)
    if args.nccl_debug:
        env["NCCL_DEBUG"] = args.nccl_debug
    for k, v in env.items():
        cmd += ["-x", f"{k}={v}"]
    return cmd + shlex.split(args.mpi_args)


def child_env(args):
    env = dict(os.environ)
    env.update(SAFE_ENV)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if args.nccl_debug:
        env["NCCL_DEBUG"] = args.nccl_debug
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(free_port())
    return env


def trainc_cmd(args, n):
    cmd = [args.trainc, "--config", args.config, "--quiet", "--set", "run.save_final=off"]  # timings, not models
    for s in args.set:
        cmd += ["--set", s]
    if n == 1 and args.direct1:
        return cmd
    return mpirun_prefix(args, n) + cmd


def torch_cmd(args, n):
    script = os.path.join(HERE, "torch_ddp.py")
    targs = shlex.split(args.torch)
    if args.torch_launcher == "torchrun" or (args.torch_launcher == "auto" and not shutil.which(args.mpirun)):
        return [args.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", script] + targs
    return mpirun_prefix(args, n) + [args.python, script] + targs


def fmt(v, spec, missing="-"):
    return missing if v is None else format(v, spec)


def pct(v):
    return fmt(v and 100 * v, ".1f") + ("%" if v else "")


def svg_scaling(rows, gpus, path, title):
    """samples/s against GPUs, one line per series, dashed ideal lines (N x the 1-GPU rate)."""
    width, height, left, right, top, bottom = 820, 440, 90, 260, 50, 60
    pw, ph = width - left - right, height - top - bottom
    series = sorted({r["series"] for r in rows}, key=lambda s: (s != "trainc", s))
    ok = [r for r in rows if r["samples_per_s"]]
    ideal = [r["ideal"] for r in ok if r.get("ideal")]
    peak = max([r["samples_per_s"] for r in ok] + ideal + [1]) * 1.05
    raw = peak / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ymax = step * math.ceil(peak / step)
    xs = {n: left + (pw * i / max(1, len(gpus) - 1) if len(gpus) > 1 else pw / 2) for i, n in enumerate(gpus)}

    def y(v):
        return top + ph * (1 - v / ymax)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="13">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="24" font-size="16">{esc(title)}</text>',
           f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>']
    for i in range(int(round(ymax / step)) + 1):
        v = step * i
        out.append(f'<line x1="{left - 4}" y1="{y(v):.1f}" x2="{left + pw}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
    for n, x in xs.items():
        out.append(f'<text x="{x:.1f}" y="{top + ph + 20}" text-anchor="middle">{n}</text>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 15}" text-anchor="middle">GPUs</text>')
    out.append(f'<text x="18" y="{top + ph / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 18 {top + ph / 2:.1f})">samples/s</text>')
    for k, s in enumerate(series):
        color = COLORS.get(s.split()[0], "#54a24b")
        pts = [(xs[r["gpus"]], y(r["samples_per_s"]), r) for r in ok if r["series"] == s]
        ide = [(xs[r["gpus"]], y(r["ideal"])) for r in ok if r["series"] == s and r.get("ideal")]
        if len(ide) > 1:
            out.append(f'<polyline points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in ide)}" fill="none" '
                       f'stroke="{color}" stroke-width="1.5" stroke-dasharray="6,4" opacity="0.6"/>')
        if len(pts) > 1:
            out.append(f'<polyline points="{" ".join(f"{a:.1f},{b:.1f}" for a, b, _ in pts)}" fill="none" '
                       f'stroke="{color}" stroke-width="2.5"/>')
        for a, b, r in pts:
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="4" fill="{color}"/>')
            eff = f' ({100 * r["efficiency"]:.0f}%)' if r.get("efficiency") is not None else ""
            dy = -8 if k % 2 == 0 else 18  # the second series' labels below its points
            out.append(f'<text x="{a + 6:.1f}" y="{b + dy:.1f}" fill="{color}">{r["samples_per_s"]:,.0f}{eff}</text>')
        lx, ly = width - 140, top + 10 + 48 * k
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 30}" y2="{ly}" stroke="{color}" stroke-width="2.5"/>')
        out.append(f'<text x="{lx + 36}" y="{ly + 4}">{esc(s)}</text>')
        out.append(f'<line x1="{lx}" y1="{ly + 18}" x2="{lx + 30}" y2="{ly + 18}" '
                   f'stroke="{color}" stroke-width="1.5" stroke-dasharray="6,4" opacity="0.6"/>')
        out.append(f'<text x="{lx + 36}" y="{ly + 22}" font-size="11">ideal: N x 1 GPU</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="1,2,4", help="comma-separated process (GPU) counts")
    ap.add_argument("--config", default="configs/ddp.ini")
    ap.add_argument("--trainc", default="build/trainc")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every trainc run")
    ap.add_argument("--no-trainc", action="store_true", help="only the PyTorch series")
    ap.add_argument("--torch", default=None, metavar="ARGS",
                    help='also run tools/torch_ddp.py with these arguments (--torch="--model ...")')
    ap.add_argument("--torch-launcher", choices=["auto", "mpirun", "torchrun"], default="auto",
                    help="auto: mpirun where it is found, else torchrun")
    ap.add_argument("--python", default=sys.executable or "python3")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpi-args", default="", help="more mpirun options (one string)")
    ap.add_argument("--tag-output", action="store_true", help="mpirun --tag-output: pick rank 0's summary for sure")
    ap.add_argument("--direct1", action="store_true", help="run trainc's 1-GPU case without mpirun")
    ap.add_argument("--each-card", action="store_true",
                    help="also each series' 1-GPU case on each card alone, and efficiency against their sum")
    ap.add_argument("--nccl-debug", default="VERSION", help="NCCL_DEBUG for the runs ('' to leave it unset)")
    ap.add_argument("--trainc-per-rank", action="store_true",
                    help="trainc's samples_per_s is rank 0's own rate: multiply by N")
    ap.add_argument("--train-size", type=int, default=50000, help="samples in an epoch, for the estimate")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds for each run")
    ap.add_argument("--label", default="", help="name of the experiment, for the title and the CSV")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--svg", default=None)
    ap.add_argument("--bars-svg", default=None, help="also lab_table.py's bar chart of the same rows")
    ap.add_argument("--jsonl", default=None, help="append every run's summary (with series, gpus) here")
    ap.add_argument("--log-dir", default=None,
                    help="each run's full output (default: beside --csv, else $OUT, else /tmp/trainc_scaling_logs)")
    args = ap.parse_args()

    try:
        gpus = sorted({int(g) for g in args.gpus.split(",") if g.strip()})
    except ValueError:
        sys.exit(f"scaling.py: --gpus wants numbers like 1,2,4, not {args.gpus!r}")
    if not gpus or min(gpus) < 1:
        sys.exit("scaling.py: --gpus needs at least one count >= 1")
    log_dir = args.log_dir or (os.path.dirname(os.path.abspath(args.csv)) if args.csv else
                               os.environ.get("OUT") or "/tmp/trainc_scaling_logs")
    os.makedirs(log_dir, exist_ok=True)
    names = gpu_names()
    avail = visible_gpus(names)
    card = names[0] if names else "unknown GPU"
    print(f"card: {card} ({avail} visible: {', '.join(names) if names else 'nvidia-smi gave nothing'})", flush=True)
    if not shutil.which(args.mpirun):
        print(f"scaling.py: warning: {args.mpirun} not found on PATH", file=sys.stderr)

    series = []
    if not args.no_trainc:
        series.append(("trainc", trainc_cmd))
    if args.torch is not None:
        series.append(("pytorch", torch_cmd))
    if not series:
        sys.exit("scaling.py: nothing to run (--no-trainc without --torch)")

    tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", args.label) if args.label else ""
    rows, logs, alone = [], {}, {}
    cards = card_ids(names)[:max(gpus)]
    if args.each_card and len(cards) < max(gpus):
        print(f"scaling.py: --each-card: {len(cards)} cards visible for up to {max(gpus)} GPUs", file=sys.stderr)
    for name, make in series:
        if args.each_card:
            alone[name] = cards_alone(args, name, make, cards, log_dir, tag)
        for n in gpus:
            row = {"series": name, "label": args.label, "gpus": n, "gpu": card, "status": "ok", "samples_per_s": None,
                   "per_gpu_samples_per_s": None, "epoch_s": None, "epoch_estimated": False, "step_ms": None,
                   "test_acc": None, "peak_mem_bytes": None, "gpu_util": None, "speedup": None,
                   "efficiency": None, "efficiency_cards": None, "ideal": None, "seconds": None, "transport": "",
                   "command": ""}
            rows.append(row)
            if avail and n > avail:
                row["status"] = f"skipped: {avail} GPUs visible"
                print(f"{name} {n} GPUs: skipped, only {avail} GPUs visible", flush=True)
                continue
            cmd = make(args, n)
            row["command"] = shlex.join(cmd)
            log_path = os.path.join(log_dir, f"scaling{'_' + tag if tag else ''}_{name}_{n}gpu.log")
            print(f"{name} {n} GPUs: {row['command']}", flush=True)
            rc, out, err, secs = run(cmd, args.timeout, child_env(args), log_path)
            logs.setdefault(name, []).append(out + "\n" + err)
            row["seconds"] = round(secs, 1)
            row["transport"] = transports(out + "\n" + err)
            found = parse_summaries(out)
            s = parse_summary(out)
            if len(found) > 1 and not any(r == 0 for r, _ in found):
                row["status"] += f" ({len(found)} summary lines with no rank: took the last; try --tag-output)"
            if rc != 0 or s is None:
                why = "timed out" if rc is None else f"exit {rc}" if rc != 0 else "no summary line"
                lines = [l for l in (err + "\n" + out).splitlines() if l.strip() and not MPI_NOISE.search(l)]
                tail = " | ".join(lines[-3:])
                row["status"] = f"failed: {why}"
                print(f"  failed ({why}, {secs:.0f} s): {tail[:400]}  [log: {log_path}]", flush=True)
                if s is None:
                    continue
                print("  (a summary line was printed anyway; using it)", flush=True)
            sps = s.get("samples_per_s")
            if sps is not None and name == "trainc" and args.trainc_per_rank:
                sps *= n
            elif sps is not None and "per_gpu_samples_per_s" not in s and "world" not in s and n > 1:
                row["status"] += " (summary has no world field: samples_per_s taken as global)"
            row["samples_per_s"] = sps
            row["per_gpu_samples_per_s"] = s.get("per_gpu_samples_per_s") or (sps / n if sps else None)
            if s.get("world") not in (None, n):
                row["status"] += f" (summary says world {s.get('world')})"
            epoch_s = s.get("epoch_s") or s.get("epoch_s_est")
            if epoch_s is None and sps:
                epoch_s, row["epoch_estimated"] = args.train_size / sps, True
            row.update({"epoch_s": epoch_s, "step_ms": s.get("step_ms"), "test_acc": s.get("test_acc"),
                        "peak_mem_bytes": s.get("peak_mem_bytes"), "gpu_util": s.get("gpu_util")})
            print(f"  {fmt(sps, ',.0f')} samples/s, epoch {fmt(epoch_s, '.2f')} s ({secs:.0f} s)", flush=True)
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps({"series": name, "label": args.label, "gpus": n, **s}) + "\n")

    # Speedup and efficiency against the series' 1-GPU run (else its smallest successful count).
    for name, _ in series:
        mine = [r for r in rows if r["series"] == name and r["samples_per_s"]]
        if not mine:
            continue
        base = min(mine, key=lambda r: r["gpus"])
        for r in mine:
            per_base = base["samples_per_s"] / base["gpus"]
            r["speedup"] = r["samples_per_s"] / base["samples_per_s"]
            r["ideal"] = per_base * r["gpus"]
            r["efficiency"] = r["samples_per_s"] / r["ideal"]
        if base["gpus"] != 1:
            print(f"note: {name} has no 1-GPU result; speedup and efficiency are against {base['gpus']} GPUs")
        for r in mine:
            rates = [alone.get(name, {}).get(k) for k in range(r["gpus"])]
            if all(rates):
                r["efficiency_cards"] = r["samples_per_s"] / sum(rates)

    nccl = nccl_versions(logs)
    print()
    print(f"weak scaling{': ' + args.label if args.label else ''} on {card}; NCCL {nccl or 'unknown'}")
    print(f"{'series':<8} {'GPUs':>4} {'epoch s':>9} {'samples/s':>11} {'per GPU':>9} {'step ms':>8} "
          f"{'speedup':>8} {'efficiency':>10}{' vs alone' if args.each_card else ''}  {'transport':<12} status")
    for r in rows:
        ep = "-" if r["epoch_s"] is None else ("~" if r["epoch_estimated"] else "") + f"{r['epoch_s']:.2f}"
        cards_col = f" {pct(r['efficiency_cards']):>9}" if args.each_card else ""
        print(f"{r['series']:<8} {r['gpus']:>4} {ep:>9} {fmt(r['samples_per_s'], ',.0f'):>11} "
              f"{fmt(r['per_gpu_samples_per_s'], ',.0f'):>9} {fmt(r['step_ms'], '.2f'):>8} "
              f"{fmt(r['speedup'], '.2f') + ('x' if r['speedup'] else ''):>8} "
              f"{pct(r['efficiency']):>10}{cards_col}  {r['transport'] or '-':<12} {r['status']}")
    sys.stdout.flush()

    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            cols = ["label", "series", "gpus", "gpu", "nccl", "status", "epoch_s", "epoch_estimated", "samples_per_s",
                    "per_gpu_samples_per_s", "step_ms", "speedup", "efficiency", "efficiency_cards", "test_acc",
                    "peak_mem_bytes", "gpu_util", "seconds", "transport", "command"]
            w.writerow(cols)
            for r in rows:
                w.writerow([nccl if c == "nccl" else
                            (round(r[c], 4) if isinstance(r.get(c), float) else r.get(c)) for c in cols])
    done = [r for r in rows if r["samples_per_s"]]
    title = f"weak scaling{': ' + args.label if args.label else ''} on {card}"
    if args.svg and done:
        svg_scaling(rows, gpus, args.svg, title)
    if args.bars_svg and done:
        sys.path.insert(0, HERE)
        from lab_table import svg_chart
        svg_chart([{"who": r["series"], "version": f"{r['series']} {r['gpus']} GPU", "gpu": card,
                    "samples_per_s": r["samples_per_s"], "speedup": r["speedup"] or 0} for r in done], args.bars_svg)
    failed = [r for r in rows if r["status"].startswith("failed")]
    sys.exit(1 if failed and not done else 0)


if __name__ == "__main__":
    main()
