#!/usr/bin/env python3
"""The PyTorch reference for trainc's ResNets, printing trainc's summary JSON
(the field names tools/torch_reference.py prints) as the last line of stdout.

  # the issue's recipe: ResNet-18 on CIFAR-10 at 32x32, 30 epochs (the defaults are the
  # recipe; --no-decay-bn-bias as configs/resnet18.ini's optim.decay_bn_bias = off)
  python3 tools/torch_resnet.py --mode train --data .data/cifar10-jpg --model resnet18 \
      --epochs 30 --batch 512 --lr 0.2 --nesterov --weight-decay 5e-4 --no-decay-bn-bias \
      --schedule cosine --warmup-epochs 2 --amp fp16 --channels-last --seed 0
  # the training step alone, one batch kept on the GPU
  python3 tools/torch_resnet.py --mode step --model resnet18 --image-size 32 --batch 512 \
      --channels-last --compile none|default|max-autotune
  python3 tools/torch_resnet.py --mode step --model resnet50 --image-size 224 --batch 256 --channels-last

Models (tools/torch_common.py's build_model, shared with tools/torch_ddp.py):
  resnet18 / resnet34: BasicBlock [2,2,2,2] / [3,4,6,3]; resnet50: Bottleneck [3,4,6,3],
  expansion 4, the stride on the 3x3 conv (torchvision v1.5). Widths 64-128-256-512,
  stride 2 at the first block of layers 2-4, 1x1 conv + BN projection shortcut where
  the shape changes, global average pool, fc. Convolutions have no bias.
  --stem auto (default): the CIFAR stem (3x3 s1 conv 64, BN, ReLU, no max-pool) below
  128 pixels, the ImageNet stem (7x7 s2 p3 conv, BN, ReLU, 3x3 s2 p1 max-pool) from 128
  on (224), as trainc's model.name chooses. Parameter names follow torchvision's (conv1, bn1, layerK.i,
  downsample.0/1, fc), so `--torchvision` (torchvision.models.resnetNN(weights=None),
  ImageNet stem) is a drop-in cross-check; its kaiming_normal init differs.
  Initialisation: PyTorch's defaults (kaiming_uniform a=sqrt(5) for conv and linear,
  linear bias uniform, BN weight 1 bias 0), as trainc does.

--mode train (the issue's recipe): the whole CIFAR-10 set kept on the GPU as uint8,
  shuffled each epoch, flip + pad-4 random crop and normalisation per batch on the GPU
  (torch_reference.py's `--loader gpu` code, imported), drop_last batches. SGD
  (Nesterov by default) with weight decay (--no-decay-bn-bias: BN weights/biases and
  every bias get none, i.e. all parameters of ndim <= 1), the learning rate set per
  iteration:
    constant: lr after the warm-up;
    cosine:   F + (lr - F) * 0.5 * (1 + cos(pi * (it - W) / (T - W))) after the warm-up, F
              (--final-lr, default 0) at the end;
    linear:   lr + (F - lr) * (it - W) / (T - W) after the warm-up, F at the end (trainc's
              optim.schedule = linear: with the warm-up, a triangle);
    warm-up (constant, cosine, linear): lr * (f + (1 - f) * it / W) for it < W, f =
              --warmup-start-factor (0.1), W = warmup_epochs * steps per epoch (the same values
              as LinearLR(start_factor=f, total_iters=W) followed by CosineAnnealingLR(T_max=T-W,
              eta_min=F), stepped per iteration);
    onecycle: torch.optim.lr_scheduler.OneCycleLR(max_lr=lr, total_steps=T, pct_start=W/T,
              cycle_momentum=False, div_factor 25, final_div_factor 1e4, cosine annealing)
              (trainc's optim.schedule = onecycle, ops/lr_schedule.h).
  AMP fp16 with a GradScaler (bf16: plain autocast), label smoothing in the loss,
  evaluation on the test split with running BN statistics after every epoch (not timed).
  samples_per_s and epoch_s are over the epochs after the first (the first pays for
  cuDNN autotuning and allocator warm-up; with one epoch, that epoch), test_acc is the
  last epoch's, peak_mem_bytes is torch.cuda.max_memory_allocated() (the uint8 data set
  on the GPU included: data_bytes says how much of it that is).

--mode step: the training step alone (forward, loss, backward, GradScaler, SGD step)
  on one random batch kept on the GPU, --warmup-steps untimed then --steps timed with
  CUDA events; SGD as in train mode but at lr 0.01 unless --lr says (no schedule, so no
  warm-up: lr 0.2 on a random batch could diverge, and fp16 steps the GradScaler skips
  would time less work; skipped_steps_est counts them). --compile default|max-autotune wraps the model in torch.compile (the loss
  and optimizer stay eager); compilation happens in the first warm-up steps and its time
  is reported as compile_s (progress on stderr). If the warm-up (compilation included)
  exceeds --compile-timeout seconds, the run prints the summary with samples_per_s null
  and an "error" saying so, and exits with status 3.

The last line of stdout is the JSON summary; progress goes to stdout (per epoch) and
stderr (compile progress).
"""
import argparse
import math
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_common import (RESNETS as MODELS, UtilSampler, add_args, amp_setup, build_model,  # noqa: E402
                          count_correct, gpu_batches, load_split, memory_format, print_summary, set_tf32,
                          stem_for, train_step)

# ---------------------------------------------------------------- training pieces


def param_groups(model, weight_decay, decay_bn_bias):
    """decay_bn_bias off: parameters of ndim <= 1 (BN weights and biases, the fc bias) get no decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_bn_bias or weight_decay == 0:
        return [{"params": params, "weight_decay": weight_decay}]
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model, args):
    nesterov = bool(args.nesterov and args.momentum > 0)
    kw = {}
    if getattr(args, "fused_sgd", False):
        kw["fused"] = True
    return torch.optim.SGD(param_groups(model, args.weight_decay, args.decay_bn_bias), lr=args.lr,
                           momentum=args.momentum, nesterov=nesterov, **kw)


def make_scheduler(opt, schedule, lr, total_steps, warmup_steps, warmup_epochs, epochs, start_factor=0.1,
                   final_lr=0.0):
    total_steps = max(1, total_steps)
    warmup_steps = min(warmup_steps, total_steps)
    if schedule == "onecycle":
        if warmup_steps == 1 or warmup_steps >= total_steps:
            sys.exit(f"torch_resnet: onecycle needs 0 or at least 2 warm-up steps and fewer than the "
                     f"{total_steps} total (has {warmup_steps})")
        pct = warmup_steps / total_steps
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total_steps, pct_start=pct,
                                                   anneal_strategy="cos", cycle_momentum=False)

    end = final_lr / lr if lr > 0 else 0.0

    def factor(it):
        if it < warmup_steps:
            return start_factor + (1 - start_factor) * it / warmup_steps
        span = max(1, total_steps - warmup_steps)
        done = min(it - warmup_steps, span) / span
        if schedule == "cosine":
            return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * done))
        if schedule == "linear":
            return 1 + (end - 1) * done
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def compile_model(model, mode):
    if mode == "none":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode)


def mark_step(compiled):
    if compiled:
        fn = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
        if fn is not None:
            fn()


def base_summary(args, model):
    return {
        "name": args.name, "device": "cuda", "gpu": torch.cuda.get_device_name(), "mode": args.mode,
        "model": args.model, "stem": "torchvision" if args.torchvision else stem_for(args.image_size, args.stem),
        "image_size": args.image_size, "batch": args.batch, "amp": args.amp,
        "channels_last": args.channels_last, "compile": args.compile, "cudnn_benchmark": args.cudnn_benchmark,
        "params": sum(p.numel() for p in model.parameters()), "seed": args.seed,
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
    }


def model_of(args):
    """The net --model names: tools/torch_common.py's build_model, or args.make_model(args) where a caller set it
    (tools/torch_net.py: any trainc net)."""
    if getattr(args, "make_model", None):
        return args.make_model(args)
    return build_model(args.model, args.image_size, 10, args.stem, args.torchvision)


def log(msg):
    print(f"torch_resnet: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- --mode train


def train(args):
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    xtr, ytr = load_split(args.data, "train")
    xte, yte = load_split(args.data, "test")
    if args.train_limit:
        xtr, ytr = xtr[:args.train_limit], ytr[:args.train_limit]
    log(f"decoded {len(ytr)} train and {len(yte)} test images in {time.perf_counter() - t0:.1f} s")
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    data_bytes = sum(t.numel() * t.element_size() for t in (xtr, ytr, xte, yte))
    mf = memory_format(args.channels_last)
    model = model_of(args).to(dev).to(memory_format=mf)
    cmodel = compile_model(model, args.compile)
    amp_dtype, scaler = amp_setup(args.amp)
    opt = make_optimizer(model, args)
    steps_per_epoch = len(ytr) // args.batch
    if steps_per_epoch == 0:
        sys.exit(f"torch_resnet: batch {args.batch} is larger than the training set ({len(ytr)})")
    total = steps_per_epoch * args.epochs
    warmup_steps = int(math.floor(args.warmup_epochs * steps_per_epoch + 0.5))  # trainc's llround
    sched = make_scheduler(opt, args.schedule, args.lr, total, warmup_steps, args.warmup_epochs, args.epochs,
                           args.warmup_start_factor, args.final_lr)
    sampler = UtilSampler(torch.cuda.current_device())
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    torch.cuda.reset_peak_memory_stats()

    step, epoch_train_s, epoch_samples, accs = 0, [], [], []
    loss = torch.zeros((), device=dev)
    for epoch in range(args.epochs):
        model.train()
        loss_sum = torch.zeros((), device=dev)
        n = 0
        sampler.recording = epoch > 0 or args.epochs == 1
        torch.cuda.synchronize()
        t_epoch = time.perf_counter()
        for images, labels in gpu_batches(xtr, ytr, args.batch, args.image_size, args.flip, args.crop_pad,
                                          True, True, gen):
            if args.max_steps and step >= args.max_steps:
                break
            images = images.contiguous(memory_format=mf)
            mark_step(args.compile != "none")
            loss = train_step(cmodel, opt, scaler, amp_dtype, images, labels, args.label_smoothing)
            sched.step()
            loss_sum += loss.detach().float()
            n += 1
            step += 1
        torch.cuda.synchronize()
        epoch_train_s.append(time.perf_counter() - t_epoch)
        epoch_samples.append(n * args.batch)
        sampler.recording = False
        acc = evaluate(cmodel, model, xte, yte, args, amp_dtype, mf, gen)
        accs.append(acc)
        mean_loss = (loss_sum / max(n, 1)).item()
        print(f"epoch {epoch + 1}: train {epoch_train_s[-1]:.2f} s, {n * args.batch / epoch_train_s[-1]:.0f} "
              f"samples/s, loss {mean_loss:.4f}, lr {opt.param_groups[0]['lr']:.4g}, test accuracy "
              f"{100 * acc:.2f}%", flush=True)
        if args.max_steps and step >= args.max_steps:
            break

    timed = slice(1, None) if len(epoch_train_s) > 1 else slice(0, None)
    timed_s, timed_samples = sum(epoch_train_s[timed]), sum(epoch_samples[timed])
    sps = timed_samples / timed_s if timed_s > 0 else None
    summary = base_summary(args, model)
    summary.update({
        "steps": step, "timed_steps": timed_samples // args.batch, "epochs": len(epoch_train_s),
        "samples_per_s": sps, "step_ms": 1000 * args.batch / sps if sps else None,
        "epoch_s": timed_s / len(epoch_train_s[timed]) if epoch_train_s else None,
        "first_epoch_s": epoch_train_s[0] if epoch_train_s else None,
        "train_s": sum(epoch_train_s), "gpu_util": sampler.mean(), "final_loss": loss.item(),
        "test_acc": accs[-1] if accs else None, "best_test_acc": max(accs) if accs else None,
        "loss_scale": scaler.get_scale() if scaler.is_enabled() else 1.0,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(), "data_bytes": data_bytes,
        "lr": args.lr, "momentum": args.momentum, "nesterov": args.nesterov, "weight_decay": args.weight_decay,
        "decay_bn_bias": args.decay_bn_bias, "schedule": args.schedule, "warmup_epochs": args.warmup_epochs,
        "label_smoothing": args.label_smoothing, "flip": args.flip, "crop_pad": args.crop_pad,
        "wall_s": time.perf_counter() - t0,
    })
    sampler.stop = True
    return summary, 0


def evaluate(cmodel, model, xte, yte, args, amp_dtype, mf, gen):
    model.eval()
    batches = gpu_batches(xte, yte, args.eval_batch, args.image_size, False, 0, False, False, gen)
    correct = count_correct(cmodel, batches, amp_dtype, mf, xte.device, lambda: mark_step(args.compile != "none"))
    model.train()
    cmodel.train()
    return correct.item() / len(yte)


# ---------------------------------------------------------------- --mode step


def step_bench(args):
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    mf = memory_format(args.channels_last)
    model = model_of(args).to(dev).to(memory_format=mf)
    model.train()
    cmodel = compile_model(model, args.compile)
    amp_dtype, scaler = amp_setup(args.amp)
    opt = make_optimizer(model, args)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=dev, generator=gen)
    x = x.contiguous(memory_format=mf)
    y = torch.randint(0, 10, (args.batch,), device=dev, generator=gen)
    summary = base_summary(args, model)
    summary.update({"steps": 0, "timed_steps": 0, "epochs": 0, "samples_per_s": None, "step_ms": None,
                    "epoch_s": None, "gpu_util": None, "final_loss": None, "test_acc": None})
    compiled = args.compile != "none"

    def one_step():
        mark_step(compiled)
        return train_step(cmodel, opt, scaler, amp_dtype, x, y, args.label_smoothing)

    # The warm-up (compilation included) runs under a watchdog.
    lock = threading.Lock()
    state = {"done": False, "phase": "warm-up"}

    def on_timeout():
        with lock:
            if state["done"]:
                return
            state["done"] = True
        summary["error"] = (f"{state['phase']} did not finish within --compile-timeout {args.compile_timeout:.0f} s "
                            f"(compile {args.compile}); samples_per_s not measured")
        summary["compile_s"] = None
        summary["elapsed_s"] = time.perf_counter() - t0
        log(summary["error"])
        sys.stderr.flush()
        print_summary(summary)
        os._exit(3)

    watchdog = None
    if args.compile_timeout > 0:
        watchdog = threading.Timer(args.compile_timeout, on_timeout)
        watchdog.daemon = True
        watchdog.start()
    if compiled:
        log(f"compiling {args.model} with torch.compile(mode={args.compile!r}) (first steps; "
            f"max-autotune can take minutes) ...")
    try:
        t_first = time.perf_counter()
        one_step()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t_first
        log(f"first step done in {first_s:.1f} s")
        state["phase"] = "warm-up after the first step"
        for i in range(1, args.warmup_steps):
            one_step()
            if compiled and i == 1:
                # A second step can recompile (or record CUDA graphs): time it too.
                torch.cuda.synchronize()
                log(f"second step done at {time.perf_counter() - t_first:.1f} s")
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - t_first
    except Exception as e:  # compile errors: report them as the run's result
        with lock:
            state["done"] = True
        if watchdog:
            watchdog.cancel()
        summary["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
        summary["elapsed_s"] = time.perf_counter() - t0
        import traceback
        traceback.print_exc()
        return summary, 1
    with lock:
        if state["done"]:  # the watchdog fired at the very end: it has printed and exits
            time.sleep(60)
        state["done"] = True
    if watchdog:
        watchdog.cancel()
    log(f"warm-up ({args.warmup_steps} steps) done in {warm_s:.1f} s; timing {args.steps} steps")

    sampler = UtilSampler(torch.cuda.current_device())
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sampler.recording = True
    t_wall = time.perf_counter()
    start.record()
    for _ in range(args.steps):
        loss = one_step()
    end.record()
    end.synchronize()
    wall_s = time.perf_counter() - t_wall
    sampler.recording = False
    ms = start.elapsed_time(end)
    summary.update({
        "steps": args.warmup_steps + args.steps, "timed_steps": args.steps,
        "samples_per_s": args.batch * args.steps / (ms / 1000) if ms > 0 else None,
        "step_ms": ms / args.steps if args.steps else None,
        "wall_samples_per_s": args.batch * args.steps / wall_s if wall_s > 0 else None,
        "gpu_util": sampler.mean(), "final_loss": loss.item(),
        "loss_scale": scaler.get_scale() if scaler.is_enabled() else 1.0,
        # GradScaler starts at 2**16 and halves on each skipped step; with fewer steps than its
        # growth interval (2000) the final scale tells how many steps were skipped.
        "skipped_steps_est": (max(0, round(math.log2(65536.0 / scaler.get_scale())))
                              if scaler.is_enabled() and scaler.get_scale() > 0
                              and args.warmup_steps + args.steps < 2000 else None),
        "peak_mem_bytes": torch.cuda.max_memory_allocated(),
        "compile_s": first_s if compiled else None, "first_step_s": first_s, "warmup_s": warm_s,
        "elapsed_s": time.perf_counter() - t0,
    })
    sampler.stop = True
    return summary, 0


# ---------------------------------------------------------------- main


def make_parser(models=sorted(MODELS) + ["simplenet"], model_help=None, description=None):
    """The options; models: --model's choices (None: any name, for tools/torch_net.py)."""
    ap = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["train", "step"], default="train")
    add_args(ap, {"data": "root/{train,test}/<class>/*.jpg (--mode train)"}, data=".data/cifar10-jpg")
    ap.add_argument("--model", choices=models, default="resnet18",
                    help=model_help or "simplenet: tools/torch_common.py's, for --mode step (its lab recipe is "
                                       "torch_reference.py's)")
    add_args(ap, image_size=32, stem="auto")
    ap.add_argument("--torchvision", action="store_true",
                    help="torchvision.models.<model>(weights=None) (ImageNet stem, torchvision's init)")
    add_args(ap, {"max_steps": "stop training after this many steps (0: no limit)"},
             epochs=30, max_steps=0, train_limit=0, batch=512)
    ap.add_argument("--eval-batch", type=int, default=1000)
    add_args(ap, {"lr": "default 0.2 (train); 0.01 in --mode step, whose random batch could diverge at 0.2 with no "
                        "warm-up (skipped fp16 steps would time less work)"},
             lr=None, momentum=0.9, nesterov=True, weight_decay=5e-4)
    ap.add_argument("--decay-bn-bias", action=argparse.BooleanOptionalAction, default=True,
                    help="--no-decay-bn-bias: no weight decay on BN and bias parameters")
    ap.add_argument("--schedule", choices=["constant", "cosine", "onecycle", "linear"], default="cosine")
    ap.add_argument("--warmup-start-factor", type=float, default=0.1,
                    help="the warm-up starts at lr x this (trainc's optim.warmup_start_factor)")
    ap.add_argument("--final-lr", type=float, default=0.0,
                    help="where cosine and linear end (trainc's optim.final_lr)")
    ap.add_argument("--warmup-epochs", type=float, default=2)
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    add_args(ap, flip=True, crop_pad=4, amp="fp16", channels_last=False, cudnn_benchmark=True, tf32=None)
    ap.add_argument("--fused-sgd", action="store_true", help="torch.optim.SGD(fused=True)")
    ap.add_argument("--compile", choices=["none", "default", "max-autotune"], default="none")
    ap.add_argument("--compile-timeout", type=float, default=1800,
                    help="--mode step: give up (null samples_per_s) if the warm-up takes longer (0: never)")
    add_args(ap, {"warmup_steps": "--mode step: untimed steps"}, warmup_steps=20)
    ap.add_argument("--steps", type=int, default=200, help="--mode step: timed steps")
    add_args(ap, seed=0, name=None)
    return ap


def main(ap=None, make_model=None):
    """Runs --mode train or step; make_model(args): the module in place of build_model's (tools/torch_net.py)."""
    ap = ap or make_parser()
    args = ap.parse_args()
    args.make_model = make_model
    if args.name is None:
        args.name = f"torch_{args.model}_{args.mode}" + ("" if args.compile == "none" else f"_{args.compile}")
    if args.warmup_steps < 1:
        args.warmup_steps = 1
    if args.lr is None:
        args.lr = 0.2 if args.mode == "train" else 0.01
    if not torch.cuda.is_available():
        sys.exit("torch_resnet: no CUDA device")

    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    set_tf32(args.tf32)
    summary, rc = (train if args.mode == "train" else step_bench)(args)
    print_summary(summary)
    sys.exit(rc)


if __name__ == "__main__":
    main()
