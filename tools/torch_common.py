"""What the PyTorch references share: tools/torch_reference.py (SimpleNet, the lab's
loading), tools/torch_resnet.py (ResNets) and tools/torch_ddp.py (DistributedDataParallel).

  models      SimpleNet, the ResNets (build_model picks one by name)
  data        CIFAR-10 decoded once (load_split), batched on the GPU with flip,
              pad-crop, resize and normalisation (gpu_batches)
  training    AMP (amp_setup), the step (train_step), test accuracy (count_correct),
              the timed window after the warm-up steps (StepTimer), GPU
              utilisation (UtilSampler)
  options     the command-line options the scripts have in common (add_args), each
              script giving its own defaults
  output      the summary JSON line trainc also prints (print_summary)
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

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

# ---------------------------------------------------------------- models


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


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """torchvision's v1.5 bottleneck: the stride is on the 3x3 convolution."""
    expansion = 4

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out_planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out_planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out_planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=10, stem="cifar"):
        super().__init__()
        if stem == "cifar":
            self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        elif stem == "imagenet":
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        else:
            raise ValueError(f"unknown stem {stem!r}")
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.inplanes = 64
        self.layer1 = self._make_layer(block, 64, layers[0], 1)
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        # No custom initialisation: PyTorch's defaults, as trainc.

    def _make_layer(self, block, planes, blocks, stride):
        layers = [block(self.inplanes, planes, stride)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, 1) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


RESNETS = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


def stem_for(image_size, stem="auto"):
    """The CIFAR stem below 128 pixels, the ImageNet stem from 128 on, as trainc's model.name chooses."""
    if stem != "auto":
        return stem
    return "cifar" if image_size < 128 else "imagenet"


def build_model(name, image_size, num_classes=10, stem="auto", torchvision=False):
    """simplenet or a ResNet of RESNETS for square images of `image_size`."""
    if name == "simplenet":
        return SimpleNet(image_size, num_classes)
    if name not in RESNETS:
        raise ValueError(f"unknown model {name!r} (simplenet or one of {', '.join(RESNETS)})")
    stem = stem_for(image_size, stem)
    if torchvision:
        if stem != "imagenet":
            raise ValueError("--torchvision gives the ImageNet stem only (use --stem imagenet or a larger image)")
        import torchvision.models
        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    block, layers = RESNETS[name]
    return ResNet(block, layers, num_classes, stem)


# ---------------------------------------------------------------- data


def load_split(root, split):
    """Decodes root/split/<class>/* once into uint8 [N, 3, 32, 32] and labels."""
    from PIL import Image
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


# ---------------------------------------------------------------- training


def memory_format(channels_last):
    return torch.channels_last if channels_last else torch.contiguous_format


def set_tf32(tf32):
    """TF32 convolutions and matrix products on or off; None leaves PyTorch's defaults."""
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def amp_setup(amp):
    """(autocast dtype or None, GradScaler): fp16 scales the loss, bf16 is plain autocast."""
    dtype = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}[amp]
    return dtype, torch.amp.GradScaler("cuda", enabled=amp == "fp16")


def train_step(model, opt, scaler, amp_dtype, images, labels, label_smoothing=0.0):
    """Forward and loss under autocast, backward through the scaler, the optimizer step."""
    with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(images), labels, label_smoothing=label_smoothing)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss


def count_correct(model, batches, amp_dtype, mf, device, before_batch=None):
    """Top-1 hits over (images, labels) batches, as an int64 tensor on `device` (no sync per batch).
    The model is left in eval mode; before_batch() runs ahead of each forward."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    with torch.no_grad():
        for images, labels in batches:
            images = images.to(device).contiguous(memory_format=mf)
            if before_batch:
                before_batch()
            with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
                correct += (model(images).argmax(1) == labels.to(device)).sum()
    return correct


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


class StepTimer:
    """The training time of the steps after the first `warmup_steps`, evaluation left out:
    start_if_due(step) before each step opens the window (after a sync) once the warm-up is
    over; stop() at the end of an epoch's training syncs, closes it and returns the time."""

    def __init__(self, warmup_steps, device=None, sampler=None):
        self.warmup_steps, self.device, self.sampler = warmup_steps, device, sampler
        self.opened, self.seconds = None, 0.0

    def start_if_due(self, step):
        if self.opened is None and step >= self.warmup_steps:
            torch.cuda.synchronize(self.device)
            self.opened = time.perf_counter()
            if self.sampler:
                self.sampler.recording = True

    @property
    def running(self):
        return self.opened is not None

    def stop(self):
        torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        if self.sampler:
            self.sampler.recording = False
        if self.opened is not None:
            self.seconds += now - self.opened
            self.opened = None
        return now


# ---------------------------------------------------------------- options and output

BOOL = argparse.BooleanOptionalAction
OPTIONS = {  # name: (argparse keywords, help)
    "data": ({}, "CIFAR-10 image folder, root/{train,test}/<class>/*.jpg"),
    "image_size": ({"type": int}, None),
    "stem": ({"choices": ["auto", "cifar", "imagenet"]}, "auto: cifar below 128 pixels, imagenet from 128 on (as trainc)"),
    "batch": ({"type": int}, None),
    "epochs": ({"type": int}, None),
    "max_steps": ({"type": int}, "stop after this many steps (0: no limit)"),
    "warmup_steps": ({"type": int}, "untimed steps first"),
    "train_limit": ({"type": int}, "use only this many training images (0: all)"),
    "lr": ({"type": float}, None),
    "momentum": ({"type": float}, None),
    "nesterov": ({"action": BOOL}, None),
    "weight_decay": ({"type": float}, None),
    "flip": ({"action": BOOL}, "random horizontal flip"),
    "crop_pad": ({"type": int}, "random crop after padding by this many pixels (0: none)"),
    "amp": ({"choices": ["off", "fp16", "bf16"]}, "autocast with a GradScaler (fp16) or plain autocast (bf16)"),
    "channels_last": ({"action": BOOL}, None),
    "cudnn_benchmark": ({"action": BOOL}, None),
    "tf32": ({"action": BOOL}, "TF32 for convolutions and matrix products (unset: PyTorch's defaults)"),
    "seed": ({"type": int}, None),
    "name": ({}, "the summary's name"),
}


def add_args(ap, helps=None, **defaults):
    """Adds the shared options named by `defaults` (option name with _ for -), each with its
    default; helps: option name -> help text in place of the shared one."""
    for name, default in defaults.items():
        kw, text = OPTIONS[name]
        text = (helps or {}).get(name, text)
        ap.add_argument("--" + name.replace("_", "-"), default=default, **kw, **({"help": text} if text else {}))


def print_summary(summary):
    """The summary as the last stdout line, trainc's field names."""
    print(json.dumps(summary), flush=True)
