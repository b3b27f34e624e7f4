#!/usr/bin/env python3
"""The PyTorch DistributedDataParallel reference for trainc's data-parallel
training (the lab's task 5.1, weak scaling: the per-GPU batch stays fixed).

  mpirun -np 2 --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 \
      python3 tools/torch_ddp.py --model simplenet --image-size 224 --batch 256 --data-on-gpu
  torchrun --standalone --nproc_per_node 2 tools/torch_ddp.py --model resnet18 --image-size 32 \
      --batch 512 --channels-last --data .data/cifar10-jpg --epochs 2

One process per GPU. Under Open MPI's mpirun the rank, world size and local rank
come from OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; under torchrun from RANK /
WORLD_SIZE / LOCAL_RANK; MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to
--port (both only where unset). NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 unless set).

Models: simplenet (at --image-size), resnet18 / resnet34 / resnet50 (CIFAR stem below
128 pixels, ImageNet stem from 128 on, as trainc), all from tools/torch_common.py as
tools/torch_reference.py and tools/torch_resnet.py build them. DDP with
gradient_as_bucket_view=True, bucket_cap_mb=--bucket-mb (25), optional fp16/bf16
gradient compression (--allreduce-dtype, DDP's comm hooks).

Data: --data-on-gpu: one random batch per rank kept on the GPU (the step alone; an
epoch is --train-size / (world x batch) steps). --data PATH: CIFAR-10 decoded once
(root/{train,test}/<class>/*.jpg) and kept on the GPU; each epoch every rank takes
its shard of one shared shuffle exactly as torch.utils.data.DistributedSampler
(seed + epoch, padded to a multiple of the world size, rank::world), and
torch_common.py's GPU batches do flip / pad-crop / resize / normalise per batch.

Timing: the first --warmup-steps steps are left out; the window is the training
time of the remaining steps (evaluation excluded), the slowest rank's. Rank 0
prints the summary JSON as the last line: world, samples_per_s (global: world x
batch x timed steps / window), per_gpu_samples_per_s, step_ms, epoch_s (mean
training time of an epoch, null when no epoch ran to its end; epoch_s_est =
steps per epoch x step_ms), test_acc (with --eval), peak_mem_bytes (the largest
rank's torch.cuda.max_memory_allocated()).
"""
import argparse
import datetime
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_common import (RESNETS, StepTimer, UtilSampler, add_args, amp_setup, build_model,  # noqa: E402
                          count_correct, gpu_batches, load_split, memory_format, print_summary, set_tf32,
                          train_step)


def env_int(*names, default=None):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            return int(v)
    return default


def dist_env(port):
    """(rank, world, local_rank) from Open MPI's or torchrun's variables; sets the ones init needs."""
    rank = env_int("OMPI_COMM_WORLD_RANK", "RANK", "PMI_RANK", "SLURM_PROCID", default=0)
    world = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", default=1)
    local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", default=None)
    if local is None:
        local = rank % max(1, torch.cuda.device_count())
    os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(rank), str(world), str(local)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    return rank, world, local


def shard(n, world, rank, epoch, seed):
    """DistributedSampler(shuffle=True, drop_last=False)'s indices of this rank for this epoch."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)
    total = math.ceil(n / world) * world
    if total > n:
        perm = torch.cat([perm, perm[:total - n]])
    return perm[rank:total:world]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["simplenet"] + sorted(RESNETS), default="simplenet")
    add_args(ap, {"batch": "per-rank batch"}, image_size=224, stem="auto", batch=256)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--data-on-gpu", action="store_true", help="one random batch per rank kept on the GPU")
    add_args(src, {"data": "CIFAR-10 image folder: the real data, GPU-resident loader"}, data=None)
    ap.add_argument("--train-size", type=int, default=50000, help="--data-on-gpu: samples in an epoch")
    add_args(ap, {"train_limit": "--data: use only this many training images",
                  "max_steps": "stop after this many steps (0: whole epochs)"},
             train_limit=0, epochs=1, max_steps=0)
    ap.add_argument("--steps", type=int, default=0,
                    help="shorthand: --max-steps = --warmup-steps + STEPS (timed steps)")
    add_args(ap, warmup_steps=20, lr=0.01, momentum=0.9, nesterov=False, weight_decay=0.0, flip=False, crop_pad=0)
    ap.add_argument("--eval", action="store_true", help="test accuracy after each epoch (sharded, not timed)")
    add_args(ap, amp="fp16", channels_last=False, cudnn_benchmark=True, tf32=None)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    ap.add_argument("--allreduce-dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
                    help="fp16/bf16: DDP's fp16_compress_hook / bf16_compress_hook")
    ap.add_argument("--broadcast-buffers", action=argparse.BooleanOptionalAction, default=True,
                    help="DDP broadcast_buffers (PyTorch's default on: BN running stats from rank 0 each forward)")
    ap.add_argument("--port", type=int, default=29531, help="MASTER_PORT where unset")
    ap.add_argument("--init-timeout", type=float, default=600, help="seconds for the process group to form")
    add_args(ap, seed=0, name=None)
    args = ap.parse_args()
    if not args.data_on_gpu and not args.data:
        ap.error("one of --data-on-gpu or --data PATH is needed")
    if args.steps:
        args.max_steps = args.warmup_steps + args.steps
    if args.name is None:
        args.name = f"torch_ddp_{args.model}{args.image_size}_{'resident' if args.data_on_gpu else 'loader'}"

    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)
    if not torch.cuda.is_available():
        sys.exit("torch_ddp: no CUDA device")
    rank, world, local = dist_env(args.port)
    if local >= torch.cuda.device_count():
        sys.exit(f"torch_ddp: rank {rank} has local rank {local} but only {torch.cuda.device_count()} GPUs are visible")
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    set_tf32(args.tf32)

    def log(msg):
        if rank == 0:
            print(f"torch_ddp: {msg}", file=sys.stderr, flush=True)

    # The data first (decoding takes a while on every rank), then the process group.
    t0 = time.perf_counter()
    xte = yte = None
    if args.data:
        xtr, ytr = load_split(args.data, "train")
        xte, yte = load_split(args.data, "test") if args.eval else (None, None)
        if args.train_limit:
            xtr, ytr = xtr[:args.train_limit], ytr[:args.train_limit]
        xtr, ytr = xtr.to(dev), ytr.to(dev)
        if xte is not None:
            xte, yte = xte.to(dev), yte.to(dev)
        n_train = len(ytr)
        log(f"decoded {n_train} training images in {time.perf_counter() - t0:.1f} s")
    else:
        n_train = args.train_size

    kw = {"backend": "nccl", "rank": rank, "world_size": world,
          "timeout": datetime.timedelta(seconds=args.init_timeout)}
    try:
        dist.init_process_group(**kw, device_id=dev)
    except TypeError:  # an older torch without device_id
        dist.init_process_group(**kw)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None
    log(f"process group: world {world}, NCCL {nccl}, MASTER {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    mf = memory_format(args.channels_last)
    model = build_model(args.model, args.image_size, 10, args.stem).to(dev).to(memory_format=mf)
    ddp = DDP(model, device_ids=[local], output_device=local, bucket_cap_mb=args.bucket_mb,
              gradient_as_bucket_view=True, broadcast_buffers=args.broadcast_buffers)
    if args.allreduce_dtype != "fp32":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = default_hooks.fp16_compress_hook if args.allreduce_dtype == "fp16" else default_hooks.bf16_compress_hook
        ddp.register_comm_hook(None, hook)
    amp_dtype, scaler = amp_setup(args.amp)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          nesterov=bool(args.nesterov and args.momentum > 0), weight_decay=args.weight_decay)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed * 1000 + 7919 * (rank + 1))
    sampler = UtilSampler(local) if rank == 0 else None

    if args.data_on_gpu:
        x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=dev, generator=gen)
        x = x.contiguous(memory_format=mf)
        y = torch.randint(0, 10, (args.batch,), device=dev, generator=gen)
        steps_per_epoch = max(1, n_train // (world * args.batch))
    else:
        steps_per_epoch = len(shard(n_train, world, rank, 0, args.seed)) // args.batch
        if steps_per_epoch == 0:
            sys.exit(f"torch_ddp: a shard of {n_train} / {world} images holds no batch of {args.batch}")
    if args.steps:  # --steps asks for that many timed steps: run as many epochs as they take
        args.epochs = max(args.epochs, math.ceil(args.max_steps / steps_per_epoch))

    torch.cuda.reset_peak_memory_stats(dev)
    timer = StepTimer(args.warmup_steps, dev, sampler)
    step, timed_steps, epoch_times, accs = 0, 0, [], []
    loss = torch.zeros((), device=dev)
    for epoch in range(args.epochs):
        ddp.train()
        if args.data_on_gpu:
            batches = ((x, y) for _ in range(steps_per_epoch))
        else:
            idx = shard(n_train, world, rank, epoch, args.seed).to(dev)
            batches = gpu_batches(xtr[idx], ytr[idx], args.batch, args.image_size, args.flip, args.crop_pad,
                                  False, True, gen)
        torch.cuda.synchronize(dev)
        t_epoch = time.perf_counter()
        timer.start_if_due(step)
        ran = 0
        for images, labels in batches:
            if args.max_steps and step >= args.max_steps:
                break
            timer.start_if_due(step)
            loss = train_step(ddp, opt, scaler, amp_dtype, images.contiguous(memory_format=mf), labels)
            step += 1
            ran += 1
            if timer.running:
                timed_steps += 1
        now = timer.stop()
        if ran == steps_per_epoch:
            epoch_times.append(now - t_epoch)
        if xte is not None:
            accs.append(evaluate(model, xte, yte, args, amp_dtype, mf, rank, world, dev, gen))
            log(f"epoch {epoch + 1}: {now - t_epoch:.2f} s, test accuracy {100 * accs[-1]:.2f}%")
        else:
            log(f"epoch {epoch + 1}: {ran} steps in {now - t_epoch:.2f} s")
        if args.max_steps and step >= args.max_steps:
            break

    # The slowest rank's window, the largest peak memory, the mean final loss.
    stats = torch.tensor([timer.seconds, float(torch.cuda.max_memory_allocated(dev)), loss.detach().float().item()],
                         dtype=torch.float64, device=dev)
    mx = stats.clone()
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    sm = stats.clone()
    dist.all_reduce(sm, op=dist.ReduceOp.SUM)
    timed_s, peak, mean_loss = mx[0].item(), int(mx[1].item()), sm[2].item() / world
    if rank == 0:
        sps = world * args.batch * timed_steps / timed_s if timed_s > 0 and timed_steps else None
        step_ms = 1000 * timed_s / timed_steps if timed_steps else None
        summary = {
            "name": args.name, "device": "cuda", "gpu": torch.cuda.get_device_name(dev), "world": world,
            "model": args.model, "image_size": args.image_size, "batch": args.batch, "global_batch": world * args.batch,
            "data": "gpu-resident" if args.data_on_gpu else "loader", "amp": args.amp,
            "channels_last": args.channels_last, "steps": step, "timed_steps": timed_steps,
            "epochs": len(epoch_times), "steps_per_epoch": steps_per_epoch,
            "samples_per_s": sps, "per_gpu_samples_per_s": sps / world if sps else None, "step_ms": step_ms,
            "epoch_s": sum(epoch_times) / len(epoch_times) if epoch_times else None,
            "epoch_s_est": steps_per_epoch * step_ms / 1000 if step_ms else None,
            "gpu_util": sampler.mean() if sampler else None, "final_loss": mean_loss,
            "test_acc": accs[-1] if accs else None,
            "loss_scale": scaler.get_scale() if scaler.is_enabled() else 1.0,
            "peak_mem_bytes": peak, "bucket_mb": args.bucket_mb, "allreduce_dtype": args.allreduce_dtype,
            "broadcast_buffers": args.broadcast_buffers, "nccl": nccl, "torch": torch.__version__,
            "wall_s": time.perf_counter() - t0,
        }
        print_summary(summary)
    if sampler:
        sampler.stop = True
    dist.barrier()
    dist.destroy_process_group()


def evaluate(model, xte, yte, args, amp_dtype, mf, rank, world, dev, gen):
    """Top-1 accuracy on the test split, each rank a contiguous slice, summed over ranks."""
    n = len(yte)
    per = math.ceil(n / world)
    lo, hi = min(n, rank * per), min(n, (rank + 1) * per)
    batches = gpu_batches(xte[lo:hi], yte[lo:hi], 1000, args.image_size, False, 0, False, False, gen) if hi > lo else []
    counts = torch.stack([count_correct(model, batches, amp_dtype, mf, dev),
                          torch.tensor(max(0, hi - lo), dtype=torch.int64, device=dev)])
    dist.all_reduce(counts)
    model.train()
    return counts[0].item() / max(1, counts[1].item())

if __name__ == "__main__":
    main()
