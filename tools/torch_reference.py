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
import json
import os
import threading
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


class SimpleNet(nn.Module):
    def __init__(self, image_size, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(256 * (image_size // 8) ** 2, 512), nn.ReLU(),
            nn.Linear(512, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def load_split(root, split):
    """Decodes root/split/<class>/* once into uint8 [N, 3, 32, 32] and labels."""
    classes = sorted(os.listdir(os.path.join(root, split)))
    images, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, split, name)
        for f in sorted(os.listdir(folder)):
            with Image.open(os.path.join(folder, f)) as im:
                images.append(np.asarray(im.convert("RGB")))
            labels.append(label)
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    return x, torch.tensor(labels, dtype=torch.int64)


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


def gpu_batches(x, y, batch, size, flip, crop_pad, shuffle, drop_last, gen):
    """Whole-data-on-GPU batches with vectorised crop and flip."""
    n = len(y)
    order = torch.randperm(n, device=x.device, generator=gen) if shuffle else torch.arange(n, device=x.device)
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    stop = n - n % batch if drop_last else n
    for s in range(0, stop, batch):
        idx = order[s:s + batch]
        img = x[idx].float() / 255
        if crop_pad:
            b, _, h, w = img.shape
            p = crop_pad
            padded = F.pad(img, (p, p, p, p))
            oy = torch.randint(0, 2 * p + 1, (b,), device=x.device, generator=gen)
            ox = torch.randint(0, 2 * p + 1, (b,), device=x.device, generator=gen)
            rows = (oy[:, None] + torch.arange(h, device=x.device)[None])[:, None, :, None]
            cols = (ox[:, None] + torch.arange(w, device=x.device)[None])[:, None, None, :]
            img = padded[torch.arange(b, device=x.device)[:, None, None, None],
                         torch.arange(3, device=x.device)[None, :, None, None], rows, cols]
        if flip:
            mask = torch.rand(img.shape[0], device=x.device, generator=gen) < 0.5
            img = torch.where(mask[:, None, None, None], img.flip(3), img)
        if img.shape[2] != size:
            img = F.interpolate(img, size=(size, size), mode="bilinear", align_corners=False)
        yield (img - mean) / std, y[idx]


class UtilSampler:
    """Mean NVML GPU utilisation while recording is on."""

    def __init__(self, device_index):
        self.samples, self.recording, self.stop = [], False, False
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:
            self.nvml = None
            return
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while not self.stop:
            if self.recording:
                self.samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            time.sleep(0.1)

    def mean(self):
        return sum(self.samples) / len(self.samples) / 100 if self.samples else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".data/cifar10-jpg")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--flip", action="store_true")
    ap.add_argument("--crop-pad", type=int, default=0)
    ap.add_argument("--loader", choices=["lab", "gpu"], default="lab")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--pinned", action="store_true")
    ap.add_argument("--sync", action=argparse.BooleanOptionalAction, default=True,
                    help="synchronize after the copy and the step, loss.item() every step")
    ap.add_argument("--tf32", action="store_true",
                    help="TF32 for convolutions (PyTorch's default for cuDNN) and matrix products")
    ap.add_argument("--amp", choices=["off", "fp16", "bf16"], default="off",
                    help="autocast with a GradScaler (fp16) or plain autocast (bf16)")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--resident", action="store_true",
                    help="train on one batch kept on the GPU: the step alone")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="torch")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    dev = torch.device("cuda")
    xtr, ytr = load_split(args.data, "train")
    xte, yte = load_split(args.data, "test")
    model = SimpleNet(args.image_size).to(dev)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    amp_dtype = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}[args.amp]
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp == "fp16")
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
    step, timed_samples, timed_s, epoch_times, acc, loss_value = 0, 0, 0.0, [], None, float("nan")
    for epoch in range(args.epochs):
        model.train()
        t_epoch, t_window = time.perf_counter(), None
        batches = (gpu_batches(xtr, ytr, args.batch, args.image_size, args.flip, args.crop_pad, True, True, gen)
                   if args.loader == "gpu" else train_loader)
        if args.resident:
            first = tuple(t.to(dev) for t in next(iter(batches)))
            batches = [first] * (len(ytr) // args.batch)
        for images, labels in batches:
            if args.max_steps and step >= args.max_steps:
                break
            if t_window is None and step >= args.warmup_steps:
                torch.cuda.synchronize()
                t_window = time.perf_counter()
                sampler.recording = True
            images = images.to(dev, non_blocking=not args.sync).contiguous(memory_format=memory_format)
            labels = labels.to(dev, non_blocking=not args.sync)
            if args.sync:
                torch.cuda.synchronize()
            with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if args.sync:
                loss_value = loss.item()
                torch.cuda.synchronize()
            step += 1
            if t_window is not None:
                timed_samples += args.batch
        torch.cuda.synchronize()
        now = time.perf_counter()
        sampler.recording = False
        if t_window is not None:
            timed_s += now - t_window
        epoch_times.append(now - t_epoch)
        model.eval()
        correct = 0
        with torch.no_grad():
            batches = (gpu_batches(xte, yte, args.batch, args.image_size, False, 0, False, False, gen)
                       if args.loader == "gpu" else test_loader)
            for images, labels in batches:
                images = images.to(dev).contiguous(memory_format=memory_format)
                labels = labels.to(dev)
                with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
                    correct += (model(images).argmax(1) == labels).sum().item()
        acc = correct / len(yte)
        print(f"epoch {epoch + 1}: {epoch_times[-1]:.1f} s, test accuracy {100 * acc:.2f}%", flush=True)
        if args.max_steps and step >= args.max_steps:
            break
    loss_value = loss.item()
    summary = {
        "name": args.name, "device": "cuda", "gpu": torch.cuda.get_device_name(), "steps": step,
        "samples_per_s": timed_samples / timed_s if timed_s else 0,
        "epoch_s": sum(epoch_times) / len(epoch_times), "gpu_util": sampler.mean(),
        "final_loss": loss_value, "test_acc": acc,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(),
    }
    sampler.stop = True
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
