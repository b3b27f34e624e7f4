#!/usr/bin/env python3
"""The lab's PyTorch reference for trainc's numbers: the same SimpleNet, data,
batch and loading, run on the same card, printing the same summary JSON.

  python3 tools/torch_reference.py --data .data/cifar10-jpg --image-size 224 \
      --batch 32 --epochs 3 --loader lab            # the lab's baseline stage
  python3 tools/torch_reference.py --image-size 32 --batch 128 --epochs 15 \
      --lr 0.05 --weight-decay 5e-4 --flip --crop-pad 4 --loader gpu

--loader lab: a torch DataLoader over the decoded images, per-sample resize and
normalisation (num_workers, pin_memory as given), a synchronous copy and
torch.cuda.synchronize() after the copy and after every step, loss.item() each
step, as the lab's baseline does. --loader gpu: the whole data set on the GPU,
augmentation done per batch there, no syncs: for accuracy runs.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_common import (MEAN, STD, SimpleNet, StepTimer, UtilSampler, add_args, amp_setup,  # noqa: E402
                          count_correct, gpu_batches, load_split, memory_format, print_summary, set_tf32,
                          train_step)


class Images(torch.utils.data.Dataset):
    """Per-sample transforms on the CPU, as torchvision's Compose would do them."""

    def __init__(self, x, y, size, flip, crop_pad):
        self.x, self.y, self.size, self.flip, self.crop_pad = x, y, size, flip, crop_pad
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i].float() / 255
        if self.crop_pad:
            p = self.crop_pad
            img = F.pad(img, (p, p, p, p))
            dy, dx = torch.randint(0, 2 * p + 1, (2,)).tolist()
            img = img[:, dy:dy + self.x.shape[2], dx:dx + self.x.shape[3]]
        if self.flip and torch.rand(()) < 0.5:
            img = img.flip(2)
        if img.shape[1] != self.size:
            img = F.interpolate(img[None], size=(self.size, self.size), mode="bilinear",
                                align_corners=False)[0]
        return (img - self.mean) / self.std, self.y[i]


def parse_args():
    ap = argparse.ArgumentParser()
    add_args(ap, data=".data/cifar10-jpg", image_size=224, batch=32, epochs=3, max_steps=0, warmup_steps=20,
             lr=0.01, momentum=0.9, weight_decay=0.0, flip=False, crop_pad=0)
    ap.add_argument("--loader", choices=["lab", "gpu"], default="lab")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--pinned", action="store_true")
    ap.add_argument("--sync", action=argparse.BooleanOptionalAction, default=True,
                    help="synchronize after the copy and the step, loss.item() every step")
    add_args(ap, {"tf32": "TF32 for convolutions (PyTorch's default for cuDNN) and matrix products"},
             tf32=False, amp="off", channels_last=False)
    ap.add_argument("--resident", action="store_true",
                    help="train on one batch kept on the GPU: the step alone")
    add_args(ap, seed=0, name="torch")
    return ap.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = False
    set_tf32(args.tf32)
    dev = torch.device("cuda")
    xtr, ytr = load_split(args.data, "train")
    xte, yte = load_split(args.data, "test")
    mf = memory_format(args.channels_last)
    model = SimpleNet(args.image_size).to(dev).to(memory_format=mf)
    amp_dtype, scaler = amp_setup(args.amp)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)
    sampler = UtilSampler(torch.cuda.current_device())
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    if args.loader == "gpu":
        xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    else:
        train_loader = torch.utils.data.DataLoader(
            Images(xtr, ytr, args.image_size, args.flip, args.crop_pad), batch_size=args.batch,
            shuffle=True, drop_last=True, num_workers=args.workers, pin_memory=args.pinned,
            persistent_workers=args.workers > 0)
        test_loader = torch.utils.data.DataLoader(
            Images(xte, yte, args.image_size, False, 0), batch_size=args.batch,
            num_workers=args.workers, pin_memory=args.pinned)

    torch.cuda.reset_peak_memory_stats()
    timer = StepTimer(args.warmup_steps, sampler=sampler)
    step, timed_samples, epoch_times, acc = 0, 0, [], None
    for epoch in range(args.epochs):
        model.train()
        t_epoch = time.perf_counter()
        batches = (gpu_batches(xtr, ytr, args.batch, args.image_size, args.flip, args.crop_pad, True, True, gen)
                   if args.loader == "gpu" else train_loader)
        if args.resident:
            first = tuple(t.to(dev) for t in next(iter(batches)))
            batches = [first] * (len(ytr) // args.batch)
        for images, labels in batches:
            if args.max_steps and step >= args.max_steps:
                break
            timer.start_if_due(step)
            images = images.to(dev, non_blocking=not args.sync).contiguous(memory_format=mf)
            labels = labels.to(dev, non_blocking=not args.sync)
            if args.sync:
                torch.cuda.synchronize()
            loss = train_step(model, opt, scaler, amp_dtype, images, labels)
            if args.sync:  # the lab's baseline reads the loss every step
                loss.item()
                torch.cuda.synchronize()
            step += 1
            if timer.running:
                timed_samples += args.batch
        epoch_times.append(timer.stop() - t_epoch)
        batches = (gpu_batches(xte, yte, args.batch, args.image_size, False, 0, False, False, gen)
                   if args.loader == "gpu" else test_loader)
        acc = count_correct(model, batches, amp_dtype, mf, dev).item() / len(yte)
        print(f"epoch {epoch + 1}: {epoch_times[-1]:.1f} s, test accuracy {100 * acc:.2f}%", flush=True)
        if args.max_steps and step >= args.max_steps:
            break
    print_summary({
        "name": args.name, "device": "cuda", "gpu": torch.cuda.get_device_name(), "steps": step,
        "samples_per_s": timed_samples / timer.seconds if timer.seconds else 0,
        "epoch_s": sum(epoch_times) / len(epoch_times), "gpu_util": sampler.mean(),
        "final_loss": loss.item(), "test_acc": acc,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(),
    })
    sampler.stop = True


if __name__ == "__main__":
    main()
