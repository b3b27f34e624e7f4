#!/usr/bin/env python3
"""PyTorch's reference for trainc's streaming JPEG input pipeline: torchvision's own
pipeline measured on an ImageNet-like image folder ROOT/{train,test}/<class>/*.jpg
(tools/make_image_set.py makes one from CIFAR-10).

  python3 tools/torch_stream.py --mode loader --root /tmp/imnet                # DataLoader alone
  python3 tools/torch_stream.py --mode decode --root /tmp/imnet                # nvJPEG, batched
  python3 tools/torch_stream.py --mode decode --root /tmp/imnet --with-crop    # + crop, flip, normalise
  python3 tools/torch_stream.py --mode train --root /tmp/imnet                 # ResNet-50 fed by the loader
  python3 tools/torch_stream.py --mode train --root /tmp/imnet --resident      # the step alone
  python3 tools/torch_stream.py --mode accuracy --root /tmp/cifar64 --epochs 30
  python3 tools/torch_stream.py --self-check                                   # no torch needed

Each mode logs on stderr and prints one JSON summary line on stdout (impl "torch", mode,
images_per_s, seconds, the fallbacks taken, ...). A failure prints the summary too, with
"error", the "stage" it happened in and "hints", and exits with status 1.

--mode loader: torchvision.datasets.ImageFolder(ROOT/train) with RandomResizedCrop(--size,
  scale=(--scale-min, 1), ratio=(3/4, 4/3)), RandomHorizontalFlip, ToTensor and Normalize
  (ImageNet's mean and std), in a DataLoader: --batch, --workers, pin_memory, shuffle,
  drop_last, persistent workers, --prefetch batches a worker, the 'fork' start method and a
  --timeout a batch (a dead or stuck worker raises instead of hanging). Every batch goes to
  the GPU (non_blocking); images/s over --batches batches after --warm, synchronised at the
  end. Fewer images than (--warm + --batches) * --batch: the epochs are cycled (a new
  epoch of the same loader), never a StopIteration; fewer than one batch: refused.
  Shared memory: the workers hand their batches over in /dev/shm, about (workers x
  prefetch + 1) batches at a time (154 MB each at 256 x 3 x 224 x 224 fp32). Its free space
  is checked and printed first; where it is short (--sharing auto), the sharing strategy
  becomes 'file_system' and the prefetch is lowered until it fits (both in "fallbacks").
  'file_system' still keeps the tensors in /dev/shm (by name, not by descriptor): it
  helps against descriptor limits, not space; if even a prefetch of 1 does not fit, the
  log says to give the container more (docker run --shm-size=32g) or fewer --workers.
--mode decode: --warm + --batches batches of --batch ROOT/train files (a seeded sample,
  repeated where the set is smaller) read with torchvision.io.read_file before timing, then
  torchvision.io.decode_jpeg(list, device=--device) a batch, RGB, synchronised at the end.
  If the batched list decode fails, decoding one image at a time (fallback "decode_per_image").
  --with-crop: per image on the GPU transforms.v2 RandomResizedCrop(--size) and
  RandomHorizontalFlip, then per batch to float and Normalize: a whole GPU pipeline.
--mode train: torchvision.models.resnet50(num_classes = the class folders), channels_last,
  --amp fp16 (autocast + GradScaler), SGD lr 0.1 momentum 0.9 weight decay 1e-4, fed by
  the loader of --mode loader; images/s over --steps steps after --warm, data_wait_frac
  the share of that time spent in next() on the loader, gpu_util from NVML where pynvml
  is installed. The workers also take CPU time from the main process's kernel launches,
  which data_wait_frac does not see (a low wait with a low gpu_util). --resident: one
  random batch kept on the GPU, the step alone (ROOT/train gives the number of classes).
--mode accuracy: torch_common.build_model("resnet18", --size) (the CIFAR stem below 128
  pixels) trained on ROOT/train with the loader's augmentation (--mean/--std: ImageNet's
  by default) and evaluated on ROOT/test after every epoch with Resize(--eval-resize,
  default round(size / 0.875)) + CenterCrop(--size). SGD Nesterov momentum 0.9, --lr 0.2,
  --weight-decay 5e-4 not on BN weights or biases, cosine per step after --warmup-epochs
  of linear warm-up from 0.1 x (torch_resnet.py's make_optimizer and make_scheduler),
  AMP fp16, channels_last, label smoothing 0, --epochs, --batch 512. test_acc is the last
  epoch's, a fraction; images_per_s is over the epochs after the first.

--workers 0 loads in the main process, where a failing transform or file shows its own
traceback.
"""
import argparse
import contextlib
import io
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Defaults that depend on --mode; an option left unset takes its mode's value.
PER_MODE = {
    "loader": {"batch": 256, "size": 224, "warm": 20, "batches": 100},
    "decode": {"batch": 256, "size": 224, "warm": 4, "batches": 40},
    "train": {"batch": 256, "size": 224, "warm": 20, "steps": 100},
    "accuracy": {"batch": 512, "size": 32},
}
SHM = "/dev/shm"


def log(msg):
    print(f"torch_stream: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- pure helpers (--self-check)


def list_classes(split_dir):
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir())


def list_images(split_dir):
    """[(path, label)] of split_dir/<class>/*, classes and files sorted (ImageFolder's order), and the classes."""
    classes = list_classes(split_dir)
    samples = []
    for label, name in enumerate(classes):
        folder = os.path.join(split_dir, name)
        samples += [(os.path.join(folder, f), label) for f in sorted(os.listdir(folder))
                    if f.lower().endswith(IMAGE_EXTENSIONS)]
    return samples, classes


def pick_files(paths, n, seed):
    """n paths, a seeded shuffle of them repeated as often as n needs."""
    if not paths:
        raise ValueError("no files to pick from")
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        order = list(paths)
        rng.shuffle(order)
        out += order[:n - len(out)]
    return out


def batch_bytes(batch, size):
    """A collated batch: fp32 images and int64 labels."""
    return batch * (3 * size * size * 4 + 8)


def shm_plan(free, workers, prefetch, batch_sizes):
    """(prefetch to use, bytes needed at the asked prefetch, whether the plan fits) for one
    DataLoader a batch size in bytes of `batch_sizes`, whose workers each hold `prefetch`
    batches in shared memory, plus one batch being pinned. free None (no /dev/shm to
    measure): the asked prefetch, taken to fit."""
    def need(p):
        return sum((workers * p + 1) * b for b in batch_sizes)

    if workers == 0 or free is None:
        return prefetch, need(prefetch) if workers else 0, True
    p = prefetch
    while p > 1 and need(p) > free:
        p -= 1
    return p, need(prefetch), need(p) <= free


def forever(first, again, on_epoch=None):
    """The batches of the iterator `first`, then of again() for each later epoch, without end:
    a data set smaller than the run cycles, and an epoch with no batch raises a RuntimeError
    that says so instead of ending the run with a bare StopIteration."""
    it, epoch = first, 0
    while True:
        got = 0
        for batch in it:
            got += 1
            yield batch
        if not got:
            raise RuntimeError(f"epoch {epoch} of the DataLoader gave no batch (fewer images than a batch, with "
                               "drop_last?)")
        epoch += 1
        if on_epoch:
            on_epoch(epoch)
        it = again()


def diagnose(text):
    """Likely causes of a DataLoader failure, from its message (a worker's traceback included)."""
    hints = []
    if any(s in text for s in ("Bus error", "shared memory", "No space left", "/dev/shm")):
        hints.append(f"{SHM} is probably too small for the batches in flight: give the container more "
                     "(docker run --shm-size=32g) or lower --workers / --prefetch")
    if "timed out" in text:
        hints.append("a worker gave no batch within --timeout: stuck (a lock inherited through fork, a slow "
                     "or hung file system) or far too slow; --workers 0 runs the loading in the main process")
    if "exited unexpectedly" in text or "killed by signal" in text:
        hints.append("a worker died: the OOM killer (see dmesg), a bus error (/dev/shm full) or a crash in a "
                     "C library; --workers 0 shows the error in the main process")
    if "Too many open files" in text or "ancdata" in text:
        hints.append("out of file descriptors: raise ulimit -n or use --sharing file_system")
    if "StopIteration" in text:
        hints.append("an iterator ran out: the loader gives len(dataset) // batch batches an epoch")
    return hints


def fmt_bytes(n):
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


class Heartbeat:
    """Logs every `every` seconds while a wait lasts (a first batch that takes minutes shows up)."""

    def __init__(self, what, every=15.0):
        self.what, self.every, self.done = what, every, threading.Event()

    def __enter__(self):
        self.t0 = time.perf_counter()
        threading.Thread(target=self.run, daemon=True).start()
        return self

    def run(self):
        while not self.done.wait(self.every):
            log(f"still waiting for {self.what} after {time.perf_counter() - self.t0:.0f} s")

    def __exit__(self, *exc):
        self.done.set()


# ---------------------------------------------------------------- the loader


def check_shared_memory(args, run, batches):
    """Measures /dev/shm against the batches in flight, for one loader a batch size of `batches`;
    applies the fallbacks; returns the prefetch to use."""
    import torch.multiprocessing as tmp
    try:
        free = shutil.disk_usage(SHM).free
    except OSError:
        free = None
    per = [batch_bytes(b, args.size) for b in batches]
    prefetch, need, fits = shm_plan(free, args.workers, args.prefetch, per)
    run.update(shm_free_bytes=free, shm_need_bytes=need)
    log(f"{SHM}: {fmt_bytes(free)} free; about {fmt_bytes(need)} in flight (({args.workers} workers x prefetch "
        f"{args.prefetch} + 1) batches of {' and '.join(fmt_bytes(b) for b in per)})")
    short = free is not None and args.workers > 0 and need > free
    if args.sharing != "auto":
        tmp.set_sharing_strategy(args.sharing)
    elif short:
        tmp.set_sharing_strategy("file_system")
        run["fallbacks"].append("sharing_strategy=file_system")
        log(f"{SHM} is short: torch.multiprocessing.set_sharing_strategy('file_system') (the tensors stay in "
            f"{SHM}, named rather than passed by descriptor)")
    run["sharing_strategy"] = tmp.get_sharing_strategy()
    if prefetch < args.prefetch:
        run["fallbacks"].append(f"prefetch_factor={prefetch}")
        log(f"prefetch {args.prefetch} -> {prefetch} batches a worker to fit {SHM}")
    if not fits:
        log(f"even a prefetch of 1 needs more than {SHM} has: the workers will likely die (bus error); give the "
            "container more shared memory (docker run --shm-size=32g) or use fewer --workers")
    run["prefetch_factor"] = prefetch
    return prefetch


def train_transform(size, scale_min, mean, std):
    import torchvision.transforms as T
    return T.Compose([T.RandomResizedCrop(size, scale=(scale_min, 1.0), ratio=(3 / 4, 4 / 3)),
                      T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])


def eval_transform(resize, size, mean, std):
    import torchvision.transforms as T
    return T.Compose([T.Resize(resize), T.CenterCrop(size), T.ToTensor(), T.Normalize(mean, std)])


def image_folder(root, split, transform, run):
    import torchvision
    t0 = time.perf_counter()
    ds = torchvision.datasets.ImageFolder(os.path.join(root, split), transform=transform)
    log(f"ImageFolder({os.path.join(root, split)}): {len(ds)} images of {len(ds.classes)} classes, "
        f"scanned in {time.perf_counter() - t0:.1f} s")
    run[f"{split}_images"] = len(ds)
    run["classes"] = len(ds.classes)
    return ds


def make_loader(ds, batch, shuffle, drop_last, args, prefetch):
    import torch
    kw = {}
    if args.workers > 0:
        kw = {"persistent_workers": True, "prefetch_factor": prefetch, "multiprocessing_context": "fork",
              "timeout": args.timeout}
    gen = torch.Generator()
    gen.manual_seed(args.seed)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=shuffle, drop_last=drop_last,
                                       num_workers=args.workers, pin_memory=args.pin_memory, generator=gen, **kw)


def training_loader(args, run, images_needed):
    """ImageFolder(ROOT/train) with the loader's augmentation, its DataLoader, after the checks."""
    run["stage"] = "scanning the training images"
    ds = image_folder(args.root, "train", train_transform(args.size, args.scale_min, args.mean, args.std), run)
    if len(ds) < args.batch:
        raise RuntimeError(f"{len(ds)} training images are fewer than one batch of {args.batch}: with drop_last "
                           "the DataLoader gives no batch at all")
    if len(ds) < images_needed:
        run["fallbacks"].append("cycled_epochs")
        log(f"{len(ds)} images < the {images_needed} the run draws: the epochs are cycled")
    prefetch = check_shared_memory(args, run, [args.batch])
    return ds, make_loader(ds, args.batch, True, True, args, prefetch)


def start_batches(loader, run):
    """The endless batch stream of `loader` and its first batch, timed; the workers fork here."""
    run["stage"] = "starting the workers"
    t0 = time.perf_counter()
    it = iter(loader)
    log(f"{len(loader)} batches an epoch; {loader.num_workers} workers started in {time.perf_counter() - t0:.1f} s")

    def on_epoch(epoch):
        run["epochs_crossed"] = epoch

    batches = forever(it, lambda: iter(loader), on_epoch)
    run["stage"] = "the first batch"
    with Heartbeat("the first batch"):
        first = next(batches)
    run["first_batch_s"] = time.perf_counter() - t0
    log(f"first batch after {run['first_batch_s']:.1f} s")
    return batches, first


# ---------------------------------------------------------------- the modes


def mode_loader(args, run):
    import torch
    dev = torch.device(args.device)
    _, loader = training_loader(args, run, (args.warm + args.batches) * args.batch)
    batches, _ = start_batches(loader, run)
    run["stage"] = "warm-up"
    for _ in range(args.warm - 1):
        images, labels = next(batches)
        images.to(dev, non_blocking=True), labels.to(dev, non_blocking=True)
    torch.cuda.synchronize(dev)
    run["stage"] = "timed batches"
    waits = []
    t0 = time.perf_counter()
    for _ in range(args.batches):
        t = time.perf_counter()
        images, labels = next(batches)
        waits.append(time.perf_counter() - t)
        images.to(dev, non_blocking=True), labels.to(dev, non_blocking=True)
    torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    run.update(images_per_s=args.batches * args.batch / seconds, batches=args.batches, seconds=seconds,
               max_batch_wait_s=max(waits))
    log(f"{run['images_per_s']:.0f} images/s over {args.batches} batches ({seconds:.1f} s; slowest batch "
        f"{max(waits):.2f} s)")


def mode_decode(args, run):
    import torch
    import torchvision
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    dev = torch.device(args.device)
    n = (args.warm + args.batches) * args.batch
    samples, _ = list_images(os.path.join(args.root, "train"))
    if len(samples) < n:
        run["fallbacks"].append("files_repeated")
    run["stage"] = "reading the files"
    t0 = time.perf_counter()
    datas = [read_file(p) for p in pick_files([p for p, _ in samples], n, args.seed)]
    total = sum(d.numel() for d in datas)
    run.update(read_s=time.perf_counter() - t0, mean_file_bytes=total / n)
    log(f"read {n} files ({fmt_bytes(total)}, {len(samples)} distinct at most) in {run['read_s']:.1f} s")
    groups = [datas[i:i + args.batch] for i in range(0, n, args.batch)]

    def decode(group):
        if run["batched_decode"]:
            return decode_jpeg(group, mode=ImageReadMode.RGB, device=dev)
        return [decode_jpeg(d, mode=ImageReadMode.RGB, device=dev) for d in group]

    crop = gpu_crop(args, dev) if args.with_crop else None
    run["stage"] = "the first batched decode"
    run["batched_decode"] = True
    try:
        first = decode(groups[0])
        torch.cuda.synchronize(dev)
    except Exception as e:  # noqa: BLE001 - any failure of the list form: try one image at a time
        run["batched_decode"] = False
        run["batched_error"] = f"{type(e).__name__}: {e}"[:300]
        run["fallbacks"].append("decode_per_image")
        log(f"decode_jpeg(list, device={args.device!r}) failed ({run['batched_error']}); decoding one image at a time")
        first = decode(groups[0])
    run["mean_pixels"] = sum(im.shape[1] * im.shape[2] for im in first) / len(first)
    log(f"torchvision {torchvision.__version__}: decode_jpeg on {dev}, "
        f"{'batched' if run['batched_decode'] else 'per image'}; mean image {run['mean_pixels'] / 1e3:.0f} kpixels")
    run["stage"] = "warm-up"
    for group in groups[1:args.warm]:
        out = decode(group)
        if crop:
            crop(out)
    torch.cuda.synchronize(dev)
    run["stage"] = "timed batches"
    t0 = time.perf_counter()
    for group in groups[args.warm:]:
        out = decode(group)
        if crop:
            crop(out)
    torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    images = args.batches * args.batch
    run.update(images_per_s=images / seconds, batches=args.batches, seconds=seconds,
               megapixels_per_s=images * run["mean_pixels"] / seconds / 1e6)
    log(f"{run['images_per_s']:.0f} images/s ({run['megapixels_per_s']:.0f} Mpixel/s) over {args.batches} "
        f"batches{' with crop, flip and normalise' if crop else ''}")


def gpu_crop(args, dev):
    """images (a list of uint8 [3, H, W] on the GPU) -> a normalised float batch [B, 3, size, size]."""
    import torch
    from torchvision.transforms import v2
    per_image = v2.Compose([v2.RandomResizedCrop(args.size, scale=(args.scale_min, 1.0), ratio=(3 / 4, 4 / 3),
                                                 antialias=True), v2.RandomHorizontalFlip()])

    def crop(images):
        x = torch.stack([per_image(im) for im in images])
        return v2.functional.normalize(v2.functional.to_dtype(x, torch.float32, scale=True), args.mean, args.std)

    return crop


def mode_train(args, run):
    import itertools

    import torch
    from torch_common import StepTimer, UtilSampler, amp_setup, build_model, memory_format, train_step
    dev = torch.device(args.device)
    mf = memory_format(args.channels_last)
    if args.resident:
        classes = len(list_classes(os.path.join(args.root, "train")))
        x = torch.randn(args.batch, 3, args.size, args.size, device=dev).contiguous(memory_format=mf)
        y = torch.randint(0, classes, (args.batch,), device=dev)
        batches = itertools.repeat((x, y))
        run["classes"] = classes
    else:
        # The workers fork before the model reaches the GPU.
        ds, loader = training_loader(args, run, (args.warm + args.steps) * args.batch)
        stream, first = start_batches(loader, run)
        batches = itertools.chain([first], stream)
        classes = len(ds.classes)
    model = build_model("resnet50", args.size, classes, stem="imagenet", torchvision=True)
    model = model.to(dev).to(memory_format=mf).train()
    amp_dtype, scaler = amp_setup(args.amp)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    sampler = UtilSampler(dev.index if dev.index is not None else torch.cuda.current_device())
    timer = StepTimer(args.warm, dev, sampler)
    wait = 0.0
    run["stage"] = "training steps"
    for step in range(args.warm + args.steps):
        timer.start_if_due(step)
        t = time.perf_counter()
        images, labels = next(batches)
        if timer.running:
            wait += time.perf_counter() - t
        images = images.to(dev, non_blocking=True).contiguous(memory_format=mf)
        loss = train_step(model, opt, scaler, amp_dtype, images, labels.to(dev, non_blocking=True))
        if step == 0:
            log("first step done")
    timer.stop()
    sampler.stop = True
    run.update(images_per_s=args.steps * args.batch / timer.seconds, steps=args.steps, seconds=timer.seconds,
               data_wait_frac=wait / timer.seconds, gpu_util=sampler.mean(), final_loss=loss.item(),
               loss_scale=scaler.get_scale() if scaler.is_enabled() else 1.0,
               peak_mem_bytes=torch.cuda.max_memory_allocated(dev), model="resnet50", resident=args.resident)
    log(f"{run['images_per_s']:.0f} images/s over {args.steps} steps, data wait {100 * run['data_wait_frac']:.1f}%"
        + (f", GPU util {100 * run['gpu_util']:.0f}%" if run["gpu_util"] is not None else ""))


def mode_accuracy(args, run):
    import torch
    from torch_common import amp_setup, build_model, count_correct, memory_format, stem_for, train_step
    from torch_resnet import make_optimizer, make_scheduler
    dev = torch.device(args.device)
    mf = memory_format(args.channels_last)
    random.seed(args.seed)
    run["stage"] = "scanning the images"
    train_ds = image_folder(args.root, "train", train_transform(args.size, args.scale_min, args.mean, args.std), run)
    test_ds = image_folder(args.root, "test", eval_transform(args.eval_resize, args.size, args.mean, args.std), run)
    if train_ds.classes != test_ds.classes:
        raise RuntimeError("ROOT/train and ROOT/test have different class folders")
    if len(train_ds) < args.batch:
        raise RuntimeError(f"{len(train_ds)} training images are fewer than one batch of {args.batch}")
    prefetch = check_shared_memory(args, run, [args.batch, args.eval_batch])
    train_loader = make_loader(train_ds, args.batch, True, True, args, prefetch)
    test_loader = make_loader(test_ds, args.eval_batch, False, False, args, prefetch)
    steps_per_epoch = len(train_loader)
    model = build_model("resnet18", args.size, len(train_ds.classes)).to(dev).to(memory_format=mf)
    amp_dtype, scaler = amp_setup(args.amp)
    opt = make_optimizer(model, args)
    warmup_steps = int(math.floor(args.warmup_epochs * steps_per_epoch + 0.5))  # as torch_resnet.py
    sched = make_scheduler(opt, "cosine", args.lr, steps_per_epoch * args.epochs, warmup_steps,
                           args.warmup_epochs, args.epochs)
    run.update(model="resnet18", stem=stem_for(args.size), steps_per_epoch=steps_per_epoch, test_accs=[],
               epoch_train_s=[])
    log(f"resnet18 ({run['stem']} stem) at {args.size} px: {args.epochs} epochs of {steps_per_epoch} steps")
    t_eval = 0.0
    for epoch in range(args.epochs):
        run["stage"] = f"epoch {epoch + 1} training"
        model.train()
        loss_sum, n = torch.zeros((), device=dev), 0
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for images, labels in train_loader:
            images = images.to(dev, non_blocking=True).contiguous(memory_format=mf)
            loss = train_step(model, opt, scaler, amp_dtype, images, labels.to(dev, non_blocking=True),
                              args.label_smoothing)
            sched.step()
            loss_sum += loss.detach().float()
            n += 1
        torch.cuda.synchronize(dev)
        run["epoch_train_s"].append(time.perf_counter() - t0)
        if n != steps_per_epoch:
            raise RuntimeError(f"epoch {epoch + 1} gave {n} batches, not {steps_per_epoch}")
        run["stage"] = f"epoch {epoch + 1} evaluation"
        t0 = time.perf_counter()
        acc = count_correct(model, test_loader, amp_dtype, mf, dev).item() / len(test_ds)
        t_eval += time.perf_counter() - t0
        run["test_accs"].append(acc)
        log(f"epoch {epoch + 1}/{args.epochs}: train {run['epoch_train_s'][-1]:.1f} s "
            f"({n * args.batch / run['epoch_train_s'][-1]:.0f} images/s), loss {(loss_sum / n).item():.4f}, "
            f"lr {opt.param_groups[0]['lr']:.4g}, test accuracy {100 * acc:.2f}%")
    timed = run["epoch_train_s"][1:] or run["epoch_train_s"]
    run.update(test_acc=run["test_accs"][-1], best_test_acc=max(run["test_accs"]), epochs=args.epochs,
               train_s=sum(run["epoch_train_s"]), eval_s=t_eval, steps=steps_per_epoch * args.epochs,
               images_per_s=len(timed) * steps_per_epoch * args.batch / sum(timed), seconds=sum(timed),
               final_loss=(loss_sum / n).item())


MODES = {"loader": mode_loader, "decode": mode_decode, "train": mode_train, "accuracy": mode_accuracy}


# ---------------------------------------------------------------- options


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    B = argparse.BooleanOptionalAction
    ap.add_argument("--mode", choices=list(MODES), default="loader")
    ap.add_argument("--root", help="the image folder, ROOT/{train,test}/<class>/*.jpg")
    ap.add_argument("--batch", type=int, help="default 256; 512 for accuracy")
    ap.add_argument("--size", type=int, help="the crop's side; default 224; 32 for accuracy")
    ap.add_argument("--workers", type=int, default=16, help="DataLoader workers (0: load in the main process)")
    ap.add_argument("--prefetch", type=int, default=4, help="batches each worker prepares ahead")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a batch may take before the loader raises")
    ap.add_argument("--pin-memory", action=B, default=True)
    ap.add_argument("--sharing", choices=["auto", "file_descriptor", "file_system"], default="auto",
                    help="torch.multiprocessing's sharing strategy; auto: file_system where /dev/shm is short")
    ap.add_argument("--scale-min", type=float, default=0.08, help="RandomResizedCrop's smallest area fraction")
    ap.add_argument("--mean", type=float, nargs=3, default=IMAGENET_MEAN)
    ap.add_argument("--std", type=float, nargs=3, default=IMAGENET_STD)
    ap.add_argument("--warm", type=int, help="untimed batches or steps first; default 20 (loader, train), 4 (decode)")
    ap.add_argument("--batches", type=int, help="timed batches (loader, decode); default 100, 40 for decode")
    ap.add_argument("--steps", type=int, help="timed steps (train); default 100")
    ap.add_argument("--with-crop", action="store_true", help="decode: crop, flip and normalise on the GPU too")
    ap.add_argument("--resident", action="store_true", help="train: one random batch kept on the GPU")
    ap.add_argument("--amp", choices=["off", "fp16", "bf16"], default="fp16")
    ap.add_argument("--channels-last", action=B, default=True)
    ap.add_argument("--epochs", type=int, default=30, help="accuracy")
    ap.add_argument("--eval-resize", type=int, help="accuracy: Resize before CenterCrop; default round(size / 0.875)")
    ap.add_argument("--eval-batch", type=int, default=1000, help="accuracy")
    ap.add_argument("--lr", type=float, default=0.2, help="accuracy")
    ap.add_argument("--momentum", type=float, default=0.9, help="accuracy")
    ap.add_argument("--nesterov", action=B, default=True, help="accuracy")
    ap.add_argument("--weight-decay", type=float, default=5e-4, help="accuracy")
    ap.add_argument("--decay-bn-bias", action=B, default=False, help="accuracy: weight decay on BN and biases too")
    ap.add_argument("--warmup-epochs", type=float, default=2, help="accuracy: linear warm-up from 0.1 x lr")
    ap.add_argument("--label-smoothing", type=float, default=0.0, help="accuracy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--name", help="the summary's name (default torch_stream_<mode>)")
    ap.add_argument("--self-check", action="store_true", help="check the options and the pure helpers (no torch)")
    args = ap.parse_args(argv)
    if not args.self_check:
        resolve(ap, args)
    return args


def resolve(ap, args):
    """Fills the per-mode defaults and refuses values that cannot work (exit 2)."""
    for key, value in PER_MODE[args.mode].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.root is None:
        ap.error("--root is needed")
    if args.eval_resize is None:
        args.eval_resize = round(args.size / 0.875)
    if args.name is None:
        args.name = f"torch_stream_{args.mode}"
    positive = ["batch", "size", "prefetch", "timeout", "epochs", "eval_batch"]
    positive += {"loader": ["warm", "batches"], "decode": ["warm", "batches"], "train": ["warm", "steps"]}.get(
        args.mode, [])
    for key in positive:
        if getattr(args, key) <= 0:
            ap.error(f"--{key.replace('_', '-')} must be positive, not {getattr(args, key)}")
    if args.workers < 0:
        ap.error("--workers must be >= 0")
    if not 0 < args.scale_min <= 1:
        ap.error(f"--scale-min must lie in (0, 1], not {args.scale_min}")
    if args.eval_resize < args.size:
        ap.error(f"--eval-resize {args.eval_resize} is smaller than --size {args.size}")
    split = os.path.join(args.root, "train")
    if not os.path.isdir(split):
        ap.error(f"--root {args.root}: no train/ folder")
    if args.mode == "accuracy" and not os.path.isdir(os.path.join(args.root, "test")):
        ap.error(f"--root {args.root}: no test/ folder (--mode accuracy evaluates on it)")


# ---------------------------------------------------------------- --self-check


def self_check():
    with tempfile.TemporaryDirectory(prefix="torch_stream-") as root:
        for split, names in (("train", ["b.jpg", "a.JPG", "notes.txt"]), ("test", ["c.png"])):
            for cls in ("dog", "cat"):
                os.makedirs(os.path.join(root, split, cls))
                for f in names:
                    open(os.path.join(root, split, cls, f), "wb").close()
        check_options(root)
        samples, classes = list_images(os.path.join(root, "train"))
        assert classes == ["cat", "dog"], classes
        assert [(os.path.relpath(p, root), y) for p, y in samples] == [
            ("train/cat/a.JPG", 0), ("train/cat/b.jpg", 0), ("train/dog/a.JPG", 1), ("train/dog/b.jpg", 1)], samples
        print("  list_images: ImageFolder's order and labels, non-images left out")
    check_helpers()
    print("torch_stream self-check: ok")
    return 0


def check_options(root):
    a = parse_args(["--root", root])
    assert (a.mode, a.batch, a.size, a.warm, a.batches, a.workers, a.prefetch) == ("loader", 256, 224, 20, 100, 16, 4)
    a = parse_args(["--mode", "accuracy", "--root", root])
    assert (a.batch, a.size, a.eval_resize, a.epochs, a.lr, a.decay_bn_bias) == (512, 32, 37, 30, 0.2, False)
    assert parse_args(["--mode", "accuracy", "--root", root, "--size", "224"]).eval_resize == 256
    a = parse_args(["--mode", "train", "--root", root, "--resident"])
    assert (a.steps, a.warm, a.batch, a.resident) == (100, 20, 256, True)
    assert parse_args(["--mode", "decode", "--root", root, "--with-crop"]).batches == 40
    for usage in [line.split("torch_stream.py", 1)[1].split("#")[0].split() for line in __doc__.splitlines()
                  if "tools/torch_stream.py --mode" in line]:
        parse_args([root if w.startswith("/tmp/") else w for w in usage])
    print("  options: per-mode defaults, eval resize round(size / 0.875), the docstring's examples parse")
    bad = [[], ["--root", root, "--batch", "0"], ["--root", root, "--scale-min", "0"],
           ["--root", root, "--mode", "train", "--steps", "-1"], ["--root", os.path.join(root, "none")],
           ["--root", os.path.join(root, "train")], ["--root", root, "--mode", "accuracy", "--eval-resize", "20"],
           ["--root", root, "--workers", "-1"], ["--root", root, "--mode", "nope"]]
    for argv in bad:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parse_args(argv)
        except SystemExit as e:
            assert e.code == 2, (argv, e.code)
            continue
        raise AssertionError(f"accepted: {argv}")
    print(f"  options: {len(bad)} bad argument lists refused with status 2")


def check_helpers():
    got = list(zip(range(7), forever(iter([1, 2, 3]), lambda: iter([1, 2, 3]))))
    assert [b for _, b in got] == [1, 2, 3, 1, 2, 3, 1], got
    epochs = []
    stream = forever(iter([1]), lambda: iter([1]), epochs.append)
    [next(stream) for _ in range(3)]
    assert epochs == [1, 2], epochs
    try:
        next(forever(iter([]), lambda: iter([])))
        raise AssertionError("an empty epoch did not raise")
    except RuntimeError as e:
        assert "gave no batch" in str(e)
    print("  forever: cycles the epochs, counts them, an empty epoch raises a RuntimeError (not StopIteration)")
    picked = pick_files(["a", "b", "c"], 8, 0)
    assert len(picked) == 8 and sorted(picked[:3]) == ["a", "b", "c"] and picked == pick_files(["a", "b", "c"], 8, 0)
    assert all(picked.count(p) in (2, 3) for p in "abc"), picked
    print("  pick_files: seeded, every file once before any twice")
    per = batch_bytes(256, 224)
    assert per == 256 * (3 * 224 * 224 * 4 + 8)
    assert shm_plan(64 << 30, 16, 4, [per]) == (4, 65 * per, True)
    assert shm_plan(64 << 20, 16, 4, [per]) == (1, 65 * per, False)
    p, _, fits = shm_plan(5 << 30, 16, 4, [per])
    assert fits and p == 2 and (16 * 2 + 1) * per <= 5 << 30 < (16 * 3 + 1) * per, p
    assert shm_plan(None, 16, 4, [per])[::2] == (4, True) and shm_plan(0, 0, 4, [per]) == (4, 0, True)
    assert shm_plan(10 << 30, 16, 4, [per, per])[0] == 2
    print("  shm_plan: 64 GiB keeps prefetch 4, 5 GiB lowers it to 2, 64 MiB does not fit at 1")
    assert any("shm" in h for h in diagnose("DataLoader worker (pid 7) is killed by signal: Bus error."))
    assert any("--timeout" in h for h in diagnose("DataLoader timed out after 120 seconds"))
    assert any("ulimit" in h for h in diagnose("received 0 items of ancdata"))
    assert diagnose('CUDA out of memory\n  File "tools/torch_stream.py", line 1, in check_shared_memory') == []
    assert fmt_bytes(64 << 20) == "67.1 MB" and fmt_bytes(12) == "12 B"
    print("  diagnose, fmt_bytes: bus error, timeout and descriptor hints")


# ---------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    if args.self_check:
        return self_check()
    try:
        import torch
        import torchvision
    except ImportError as e:
        sys.exit(f"torch_stream: {e} (only --help and --self-check run without torch and torchvision)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_common import print_summary
    if not torch.cuda.is_available():
        sys.exit("torch_stream: no CUDA device")
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    run = {"impl": "torch", "name": args.name, "mode": args.mode, "root": args.root, "batch": args.batch,
           "size": args.size, "workers": args.workers, "images_per_s": None, "seconds": None, "fallbacks": [],
           "torch": torch.__version__, "torchvision": torchvision.__version__,
           "gpu": torch.cuda.get_device_name(torch.device(args.device)), "cpus": os.cpu_count(), "stage": "setup"}
    if args.mode == "decode":
        run["with_crop"] = args.with_crop
    log(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {run['gpu']}, "
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    rc = 0
    try:
        MODES[args.mode](args, run)
        run["stage"] = "done"
    except Exception as e:  # noqa: BLE001 - every failure, a StopIteration too, ends in the summary
        log(f"failed in {run['stage']}:\n{traceback.format_exc()}")
        error = f"{type(e).__name__}: {e}"
        run["error"], run["hints"] = error[:1000], diagnose(error)
        with contextlib.suppress(OSError):
            run["shm_free_bytes_at_error"] = shutil.disk_usage(SHM).free
        for hint in run["hints"]:
            log(f"hint: {hint}")
        rc = 1
    run["wall_s"] = time.perf_counter() - t0
    print_summary(run)
    return rc


if __name__ == "__main__":
    sys.exit(main())
