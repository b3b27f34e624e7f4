#!/usr/bin/env python3
"""tools/scaling.py's efficiencies, against a stand-in mpirun and trainc.

The stand-in trainc prints the summary line trainc prints, at a rate set by
the card it sees (CUDA_VISIBLE_DEVICES' first entry): card 0 runs at 100
samples/s and card 1 at 90. On N cards the job runs at N x its slowest card's
rate x 0.99, as synchronous training with a 1% exchange would. So with
--each-card the 2-GPU row must read 178.2 / 200 = 89.1% against GPU 0 alone,
and 178.2 / 190 = 93.8% against its two cards alone; without it, no such value.

    tests/scaling_cards.py SCRATCH_DIR
Exit 0: passed, 1: failed."""
import csv
import os
import shutil
import stat
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCALING = os.path.join(HERE, "..", "tools", "scaling.py")

FAKE_MPIRUN = """#!/usr/bin/env python3
import os, sys
args, world = sys.argv[1:], 1
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag == "-np":
        world = int(args.pop(0))
    elif flag in ("-x", "--bind-to"):
        args.pop(0)
os.environ["FAKE_WORLD"] = str(world)
os.execv(args[0], args)
"""

FAKE_TRAINC = """#!/usr/bin/env python3
import json, os
cards = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
world = int(os.environ.get("FAKE_WORLD", "1"))
rate = {"0": 100.0, "1": 90.0}
sps = rate[cards[0]] if world == 1 else world * min(rate[c] for c in cards[:world]) * 0.99
print(json.dumps({"samples_per_s": sps, "world": world, "step_ms": 1.0}))
"""


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def script(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def scaling(scratch, mpirun, trainc, name, *more):
    csv_path = os.path.join(scratch, f"{name}.csv")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1")
    cmd = [sys.executable, SCALING, "--gpus", "1,2", "--mpirun", mpirun, "--trainc", trainc, "--nccl-debug", "",
           "--csv", csv_path, "--log-dir", scratch, *more]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if p.returncode != 0:
        fail(f"scaling.py {' '.join(more)} exited {p.returncode}: {p.stdout[-800:]} {p.stderr[-800:]}")
    with open(csv_path, newline="") as f:
        rows = {int(r["gpus"]): r for r in csv.DictReader(f)}
    return rows, p.stdout


def near(value, want, what):
    if value == "" or abs(float(value) - want) > 1e-3:
        fail(f"{what}: {value!r}, want {want:.4f}")


def main():
    scratch = sys.argv[1]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    mpirun = script(os.path.join(scratch, "mpirun"), FAKE_MPIRUN)
    trainc = script(os.path.join(scratch, "trainc"), FAKE_TRAINC)

    rows, out = scaling(scratch, mpirun, trainc, "each", "--each-card")
    near(rows[1]["samples_per_s"], 100.0, "1 GPU samples/s")
    near(rows[2]["samples_per_s"], 178.2, "2 GPUs samples/s")
    near(rows[2]["efficiency"], 178.2 / 200.0, "2 GPUs against GPU 0 alone")
    near(rows[2]["efficiency_cards"], 178.2 / 190.0, "2 GPUs against cards 0 and 1 alone")
    near(rows[1]["efficiency_cards"], 1.0, "1 GPU against card 0 alone")
    for card in ("0", "1"):
        if not os.path.exists(os.path.join(scratch, f"scaling_trainc_card{card}.log")):
            fail(f"no log of card {card}'s run alone")
    if "vs alone" not in out or "93.8%" not in out:
        fail(f"the table has no column against the cards alone:\n{out}")

    rows, out = scaling(scratch, mpirun, trainc, "plain")
    near(rows[2]["efficiency"], 178.2 / 200.0, "2 GPUs against GPU 0 alone, without --each-card")
    if rows[2]["efficiency_cards"] != "" or "vs alone" in out:
        fail("an efficiency against the cards alone without --each-card")
    print("scaling.py: 2 GPUs at 89.1% against GPU 0 alone and 93.8% against the two cards alone, as made")


if __name__ == "__main__":
    main()
