#!/usr/bin/env python3
"""trainc's Adam and AdamW (ops/adamw.h, the CPU reference) against
torch.optim.Adam and torch.optim.AdamW, step for step.

`test_adamw_train trajectory FILE` writes a few cases as JSON: the start
weights, and per step the learning rate, the true gradient, whether the loss
scaler skipped the step, and trainc's weights, moments and step count after
it. Each case's parameters are three groups (as they are; left out of the
weight decay by the mask; at half the learning rate through lr_scale, which is
torch's group of lr x 0.5 and weight_decay / 0.5). This script replays the same
gradients through torch's optimizer (a skipped step: no optimizer.step, as
GradScaler does) and compares after every step: the weights' change since the
start, exp_avg and exp_avg_sq within a float tolerance, and the step count
exactly.

    python3 tools/torch_optim_check.py --binary build/test_adamw_train [--device cuda]

Without PyTorch it still checks the trajectory file's form, then exits 77
(ctest's skip) saying so.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile


def rel_error(got, want):
    diff = math.sqrt(sum((g - w) ** 2 for g, w in zip(got, want)))
    norm = math.sqrt(sum(w * w for w in want))
    return diff / norm if norm > 0 else diff


def check_form(cases):
    """The trajectory's shape: what the replay relies on."""
    problems = []
    for case in cases:
        n = len(case["w0"])
        covered = sorted((g["first"], g["count"]) for g in case["groups"])
        at = 0
        for first, count in covered:
            if first != at:
                problems.append(f"{case['name']}: groups leave a gap at {at}")
            at = first + count
        if at != n:
            problems.append(f"{case['name']}: groups cover {at} of {n} parameters")
        counted = 0
        for i, step in enumerate(case["steps"]):
            counted += 0 if step["skipped"] else 1
            if step["step"] != counted:
                problems.append(f"{case['name']} step {i + 1}: step count {step['step']}, want {counted}")
            for key in ("grad", "w", "m", "v"):
                if len(step[key]) != n:
                    problems.append(f"{case['name']} step {i + 1}: {key} has {len(step[key])} of {n} values")
    return problems


def replay(torch, case, device, tol):
    """Failures of one case against torch; prints each step's errors."""
    make = torch.optim.AdamW if case["optimizer"] == "adamw" else torch.optim.Adam
    params, groups = [], []
    for g in case["groups"]:
        first, count = g["first"], g["count"]
        p = torch.tensor(case["w0"][first:first + count], dtype=torch.float32, device=device, requires_grad=True)
        params.append((first, count, p))
        wd = case["weight_decay"] / g["lr_scale"] if g["decay"] else 0.0
        groups.append({"params": [p], "lr": 0.0, "weight_decay": wd, "lr_scale": g["lr_scale"]})
    opt = make(groups, betas=tuple(case["betas"]), eps=case["eps"], amsgrad=False, foreach=False)
    failures = []
    w0 = case["w0"]
    for i, step in enumerate(case["steps"]):
        if not step["skipped"]:
            for (first, count, p), group in zip(params, opt.param_groups):
                p.grad = torch.tensor(step["grad"][first:first + count], dtype=torch.float32, device=device)
                group["lr"] = step["lr"] * group["lr_scale"]
            opt.step()
        w, m, v, counts = [], [], [], []
        for first, count, p in params:
            w += p.detach().cpu().tolist()
            state = opt.state.get(p, {})
            m += state["exp_avg"].cpu().tolist() if state else [0.0] * count
            v += state["exp_avg_sq"].cpu().tolist() if state else [0.0] * count
            counts.append(int(state["step"]) if state else 0)
        moved = [a - b for a, b in zip(w, w0)]
        trainc_moved = [a - b for a, b in zip(step["w"], w0)]
        # Both sides hold the weights in float32: each rounding moves a weight by up to 2^-24 of it, which
        # is large beside a first step of lr 1e-3. The change's bound allows a few of them.
        norm = math.sqrt
        rounding = 4 * 2.0 ** -24 * norm(sum(x * x for x in w)) / max(norm(sum(x * x for x in moved)), 1e-30)
        errors = {"w - w0": (rel_error(trainc_moved, moved), tol + rounding),
                  "exp_avg": (rel_error(step["m"], m), tol), "exp_avg_sq": (rel_error(step["v"], v), tol)}
        line = ", ".join(f"{k} {e:.2e} (bound {b:.1e})" for k, (e, b) in errors.items())
        print(f"  {case['name']}: step {i + 1}{' (skipped)' if step['skipped'] else ''}: {line}")
        for k, (e, b) in errors.items():
            if not e <= b:
                failures.append(f"{case['name']} step {i + 1}: {k} relative error {e:.3g} > {b:.3g}")
        if any(c != step["step"] for c in counts):
            failures.append(f"{case['name']} step {i + 1}: torch counts {counts}, trainc {step['step']}")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True, help="test_adamw_train, which writes the trajectory")
    ap.add_argument("--device", default="cpu", help="torch's device for the replay (cpu, cuda)")
    ap.add_argument("--tol", type=float, default=1e-5,
                    help="relative L2 bound per step of the weights' change and of each moment")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainc-torch-optim-") as tmp:
        path = os.path.join(tmp, "trajectory.json")
        subprocess.run([args.binary, "trajectory", path], check=True)
        with open(path) as f:
            cases = json.load(f)["cases"]
    problems = check_form(cases)
    for p in problems:
        print(f"FAIL: {p}")
    if problems:
        return 1
    print(f"{len(cases)} cases of {len(cases[0]['steps'])} steps from {args.binary}: well formed")
    try:
        import torch
    except ImportError as e:
        print(f"SKIP: PyTorch is not installed ({e}): the replay in torch.optim.Adam and AdamW runs where it is "
              f"(the GPU machine)")
        return 77
    print(f"torch {torch.__version__} on {args.device}")
    failures = []
    for case in cases:
        failures += replay(torch, case, args.device, args.tol)
    for f in failures:
        print(f"FAIL: {f}")
    print("torch_optim_check: " + (f"{len(failures)} failures" if failures else
                                   "trainc's Adam and AdamW match torch.optim step for step"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
