#!/usr/bin/env python3
"""The lab's task 4.1: peak memory and samples/s of SimpleNet over batch x
precision x checkpointing, each a short trainc run on a batch kept on the GPU.

  python3 tools/bench_memory.py [--trainc build/trainc] [--config configs/model.ini]
"""
import argparse
import json
import subprocess
import sys


def run(trainc, config, sets):
    cmd = [trainc, "--config", config, "--quiet", "--set", "data.resident=on", "--set", "run.eval=off",
           "--set", "run.max_steps=40", "--set", "run.warmup_steps=10", "--set", "run.save_final=off"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return None, last
    return json.loads(p.stdout.strip().splitlines()[-1]), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainc", default="build/trainc")
    ap.add_argument("--config", default="configs/model.ini")
    ap.add_argument("--batches", default="32,64,128,256")
    ap.add_argument("--precisions", default="off,fp16")
    ap.add_argument("--set", action="append", default=[], help="applied to every run")
    args = ap.parse_args()
    print(f"{'batch':>5} {'amp':>5} {'checkpoint':>10} {'peak GiB':>9} {'samples/s':>10}")
    for batch in [int(b) for b in args.batches.split(",")]:
        for amp in args.precisions.split(","):
            for ckpt in ("off", "blocks"):
                sets = args.set + [f"train.batch={batch}", f"precision.amp={amp}", f"memory.checkpoint={ckpt}"]
                s, err = run(args.trainc, args.config, sets)
                if s is None:
                    print(f"{batch:>5} {amp:>5} {ckpt:>10}  failed: {err}")
                else:
                    print(f"{batch:>5} {amp:>5} {ckpt:>10} {s['peak_mem_bytes'] / 2**30:>9.2f} "
                          f"{s['samples_per_s']:>10.0f}")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
