#!/usr/bin/env python3
"""Reads run.tensorboard_dir's event file with TensorBoard's own reader.

A short CPU run on synthetic data writes a TensorBoard event file and a
metrics file side by side; TensorBoard's EventFileLoader (which checks every
record's length and data CRC32C and stops at the first bad one) must load
every record, the first being the file version, and its scalars
(EventAccumulator) must be the metrics file's loss, lr, samples/s and test
accuracy at the same steps.

    tests/tensorboard_read.py TRAINC SCRATCH_DIR
Exit 0: passed, 1: failed, 77: skipped (no tensorboard module)."""
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
except ImportError:
    print("SKIP: python3 has no tensorboard (pip install tensorboard)")
    sys.exit(77)

LOG_EVERY, BATCH, TRAIN, EPOCHS = 4, 16, 256, 2
STEPS = TRAIN // BATCH * EPOCHS
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what, file=sys.stderr)


def close(a, b):
    """Equal as the float32 TensorBoard holds, against the metrics file's 6 digits."""
    return math.isclose(a, b, rel_tol=2e-5, abs_tol=1e-6)


def run_trainc(trainc, scratch):
    tb_dir, metrics = os.path.join(scratch, "tb"), os.path.join(scratch, "metrics.jsonl")
    sets = ["run.device=cpu", "data.source=synthetic", "data.image_size=32", f"data.synthetic_train={TRAIN}",
            "data.synthetic_test=32", f"train.batch={BATCH}", f"run.epochs={EPOCHS}", f"run.log_every={LOG_EVERY}",
            "run.warmup_steps=0", "data.workers=0", "model.name=simplenet", f"run.tensorboard_dir={tb_dir}",
            f"run.metrics_file={metrics}", "run.save_final=off"]
    cmd = [trainc, "--config", "configs/cpu.ini", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return tb_dir, metrics


def read_metrics(path):
    """{tag: {step: value}} as the metrics file has them."""
    want = {"train/loss": {}, "train/lr": {}, "train/samples_per_s": {}, "eval/test_acc": {}}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "loss" in o:
                want["train/loss"][o["step"]] = o["loss"]
                want["train/lr"][o["step"]] = o["lr"]
                want["train/samples_per_s"][o["step"]] = o["samples_per_s"]
            elif "epoch_end" in o:
                want["eval/test_acc"][o["step"]] = o["test_acc"]
    return want


def main():
    trainc, scratch = sys.argv[1], sys.argv[2]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    tb_dir, metrics = run_trainc(trainc, scratch)
    files = glob.glob(os.path.join(tb_dir, "*"))
    check(len(files) == 1, f"one event file in {tb_dir}: {files}")
    name = os.path.basename(files[0])
    check(re.fullmatch(r"events\.out\.tfevents\.\d+\.[^/]+", name) is not None, f"file name {name}")

    want = read_metrics(metrics)
    log_points = STEPS // LOG_EVERY
    check(sorted(want["train/loss"]) == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY)), "metrics file's steps")
    events = list(EventFileLoader(files[0]).Load())
    # the version, 4 scalars a log point (no GPU readings on the CPU), test accuracy each epoch
    check(len(events) == 1 + 4 * log_points + EPOCHS, f"{len(events)} records read back whole")
    check(events[0].file_version == "brain.Event:2", f"first record: {events[0]}")

    acc = event_accumulator.EventAccumulator(tb_dir)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    check(tags == set(want) | {"train/loss_scale"}, f"tags {sorted(tags)}")
    for tag, by_step in want.items():
        got = {s.step: s.value for s in acc.Scalars(tag)} if tag in tags else {}
        check(sorted(got) == sorted(by_step), f"{tag}: steps {sorted(got)}, metrics file {sorted(by_step)}")
        for step, value in by_step.items():
            check(step in got and close(got[step], value), f"{tag} at step {step}: {got.get(step)}, want {value}")
    if "train/loss_scale" in tags:
        check(all(s.value == 1 for s in acc.Scalars("train/loss_scale")), "fp32's loss scale is 1")
    print(f"tensorboard_read: {len(events)} records, {len(tags)} tags read back from {name}"
          + (f"; {len(failures)} FAILED" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
