#!/usr/bin/env python3
"""Makes an ImageNet-like image folder from a CIFAR-10 style one, for the streaming JPEG
input pipeline's benchmarks (tools/torch_stream.py is PyTorch's side of them).

  # 40,000 train + 10,000 test images of 250..500 pixels a side (tens of KB each)
  python3 tools/make_image_set.py --src /tmp/x/cifar10-jpg --out /tmp/imnet --train 40000 --test 10000
  # the same, the training split made 10 times larger by hard links (400,000 names)
  python3 tools/make_image_set.py --src /tmp/x/cifar10-jpg --out /tmp/imnet10 --train 40000 --links 10
  # "upscaled CIFAR" for accuracy runs: small sides, no added noise
  python3 tools/make_image_set.py --src /tmp/x/cifar10-jpg --out /tmp/cifar64 --min-side 40 --max-side 80 --noise 0
  python3 tools/make_image_set.py --self-test             # a tiny synthetic set, no CIFAR needed

Input: SRC/{train,test}/<class>/*.{jpg,jpeg,png,bmp}, the same class folders in both.
--train N / --test M images are taken spread evenly over the classes (N // classes each,
the first N % classes classes one more), the first files of each class in sorted order;
default: all of them; --test 0 makes no test split.

Each output image OUT/<split>/<class>/<stem>.jpg is the source image upscaled (PIL
bicubic) to a width and a height drawn independently and uniformly from
[--min-side, --max-side], plus photo-like entropy: Gaussian noise of std --noise (0..255
units) and a low-frequency variation (two random sinusoidal waves per channel, amplitude
--noise / 2 at most), clipped to 0..255 and saved as a baseline JPEG at --quality, 4:2:0.
Every image draws from its own generator seeded by (--seed, split, class, file index in
the class), so the bytes depend neither on --workers nor on --train/--test.

--links R (R >= 2): afterwards every training file x.jpg gets R-1 more names x-r1.jpg ..
x-r{R-1}.jpg in its class folder, hard links (copies where links fail), a set R times
larger on the same disk. Repeated names share the page cache: such a set measures decoding,
not the disk.

OUT must be empty or absent. Progress goes to stderr about every 10%; the last line on
stdout counts the images and links and gives the mean/min/max file size, the total bytes
and the seconds. Bad arguments exit with status 2 and one message.
"""
import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

# One process a core already: BLAS threads inside each (low_frequency's matrix product)
# would only oversubscribe the cores.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
try:
    import numpy as np
    from PIL import Image, JpegImagePlugin
except ImportError as _e:  # --help needs neither; --self-test skips (77) without them
    np = Image = JpegImagePlugin = None
    MISSING = str(_e)

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
SPLITS = ("train", "test")
LOW_FREQ_WAVES = 2  # per channel


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class Task:
    split: str
    src: str
    dst: str
    seed: tuple  # (seed, split, class, index in class)
    min_side: int
    max_side: int
    noise: float
    quality: int


def log(msg):
    print(f"make_image_set: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the source


def list_classes(split_dir):
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir())


def list_images(folder):
    return sorted(e.name for e in os.scandir(folder) if e.is_file() and e.name.lower().endswith(EXTENSIONS))


def quotas(n, classes):
    """n images spread over `classes` classes: n // classes each, the first n % classes one more."""
    base, extra = divmod(n, classes)
    return [base + (k < extra) for k in range(classes)]


def select(src, split, classes, n):
    """[(class index, class name, [file names])], the first files of each class in sorted order."""
    files = [list_images(os.path.join(src, split, c)) for c in classes]
    want = [len(f) for f in files] if n is None else quotas(n, len(classes))
    chosen = []
    for k, (name, names, count) in enumerate(zip(classes, files, want)):
        if count > len(names):
            raise UsageError(f"{split}/{name} has {len(names)} images; --{split} {n} needs {count} from each class")
        stems = [os.path.splitext(f)[0] for f in names[:count]]
        if len(set(stems)) != len(stems):
            raise UsageError(f"{split}/{name} has two images of one name but the extension (both would be .jpg)")
        chosen.append((k, name, names[:count]))
    if n is None and not sum(want):
        raise UsageError(f"no images in {os.path.join(src, split)}/<class>/ ({', '.join(EXTENSIONS)})")
    return chosen


def make_tasks(args):
    """The images to write, split by split, and the classes (the train split's folders)."""
    train_dir = os.path.join(args.src, "train")
    if not os.path.isdir(train_dir):
        raise UsageError(f"--src {args.src}: no train/ folder")
    classes = list_classes(train_dir)
    if not classes:
        raise UsageError(f"{train_dir} has no class folders")
    tasks = []
    for split_id, split in enumerate(SPLITS):
        n = args.train if split == "train" else args.test
        if n == 0:
            continue
        split_dir = os.path.join(args.src, split)
        if not os.path.isdir(split_dir):
            raise UsageError(f"--src {args.src}: no {split}/ folder (--{split} 0 skips it)")
        if list_classes(split_dir) != classes:
            raise UsageError(f"{split_dir}'s class folders differ from train/'s")
        for k, name, files in select(args.src, split, classes, n):
            for i, f in enumerate(files):
                dst = os.path.join(args.out, split, name, os.path.splitext(f)[0] + ".jpg")
                tasks.append(Task(split, os.path.join(split_dir, name, f), dst, (args.seed, split_id, k, i),
                                  args.min_side, args.max_side, args.noise, args.quality))
    if not tasks:
        raise UsageError("nothing to write (--train 0 and --test 0)")
    return tasks, classes


# ---------------------------------------------------------------- one image


def low_frequency(rng, h, w, amplitude):
    """A smooth [h, w, 3] field: LOW_FREQ_WAVES waves a channel, each under 1.5 cycles an image."""
    a = amplitude * rng.uniform(0.25, 1.0, (3, LOW_FREQ_WAVES))
    fy, fx = 2 * np.pi * rng.uniform(0.2, 1.5, (2, 3, LOW_FREQ_WAVES))
    phase = rng.uniform(0, 2 * np.pi, (3, LOW_FREQ_WAVES))
    ty = (np.arange(h) / h)[:, None, None] * fy + phase  # [h, 3, waves]
    tx = (np.arange(w) / w)[:, None, None] * fx  # [w, 3, waves]
    # a cos(ty + tx) = a cos(ty) cos(tx) - a sin(ty) sin(tx): the sum over the waves is one
    # matrix product per channel, [3, h, 2 waves] @ [3, 2 waves, w]
    rows = np.concatenate([a * np.cos(ty), -a * np.sin(ty)], axis=2).transpose(1, 0, 2)
    cols = np.concatenate([np.cos(tx), np.sin(tx)], axis=2).transpose(1, 2, 0)
    return (rows @ cols).astype(np.float32).transpose(1, 2, 0)


def render(task):
    """Writes one image; returns its size in bytes."""
    rng = np.random.default_rng(np.random.SeedSequence(task.seed))
    w, h = (int(v) for v in rng.integers(task.min_side, task.max_side + 1, size=2))
    with Image.open(task.src) as im:
        img = im.convert("RGB").resize((w, h), Image.BICUBIC)
    if task.noise > 0:
        px = rng.standard_normal((h, w, 3), dtype=np.float32)
        px *= task.noise
        px += np.asarray(img, dtype=np.float32)
        px += low_frequency(rng, h, w, task.noise / 2)
        np.clip(np.rint(px, out=px), 0, 255, out=px)
        img = Image.fromarray(px.astype(np.uint8), "RGB")
    img.save(task.dst, "JPEG", quality=task.quality, subsampling="4:2:0", optimize=False, progressive=False)
    return os.path.getsize(task.dst)


# ---------------------------------------------------------------- the set


def render_all(tasks, workers, log):
    """Renders every task (in a pool of `workers` processes unless 1); the sizes in task order."""
    sizes = [0] * len(tasks)
    step = max(1, len(tasks) // 10)
    t0 = time.perf_counter()

    def report(done):
        if done % step == 0 or done == len(tasks):
            log(f"{done}/{len(tasks)} images ({100 * done // len(tasks)}%), {time.perf_counter() - t0:.1f} s")

    if workers == 1:
        for i, t in enumerate(tasks):
            sizes[i] = render(t)
            report(i + 1)
        return sizes
    chunk = max(1, min(64, len(tasks) // (workers * 8)))
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for done, (i, size) in enumerate(pool.imap_unordered(_render_indexed, enumerate(tasks), chunk), 1):
            sizes[i] = size
            report(done)
    return sizes


def _render_indexed(item):
    i, task = item
    return i, render(task)


def add_links(tasks, repeats):
    """x.jpg -> x-r1.jpg .. x-r{repeats-1}.jpg for every training image; (links, copies, bytes copied)."""
    links = copies = copied = 0
    for t in tasks:
        if t.split != "train":
            continue
        stem = t.dst[:-len(".jpg")]
        for r in range(1, repeats):
            name = f"{stem}-r{r}.jpg"
            try:
                os.link(t.dst, name)
                links += 1
            except OSError:
                shutil.copyfile(t.dst, name)
                copies += 1
                copied += os.path.getsize(name)
    return links, copies, copied


def check_out(out):
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise UsageError(f"--out {out} exists and is not an empty folder (remove it first)")


def generate(args, log=log):
    """Writes the set; returns the summary as a dict."""
    t0 = time.perf_counter()
    tasks, classes = make_tasks(args)
    check_out(args.out)
    for split in {t.split for t in tasks}:
        for c in classes:
            os.makedirs(os.path.join(args.out, split, c), exist_ok=True)
    log(f"{len(tasks)} images of {len(classes)} classes from {args.src} to {args.out}, "
        f"{args.workers} workers")
    sizes = render_all(tasks, args.workers, log)
    links = copies = copied = 0
    if args.links > 1:
        links, copies, copied = add_links(tasks, args.links)
        log(f"--links {args.links}: {links} hard links" + (f", {copies} copies (links failed)" if copies else ""))
    n_train = sum(t.split == "train" for t in tasks)
    # total_bytes: what the set takes on disk; a hard link takes none, a copy its file's size
    return {"train": n_train, "test": len(tasks) - n_train, "classes": len(classes), "links": links,
            "copies": copies, "mean_bytes": sum(sizes) / len(sizes), "min_bytes": min(sizes),
            "max_bytes": max(sizes), "total_bytes": sum(sizes) + copied, "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------- options


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", help="SRC/{train,test}/<class>/*.jpg")
    ap.add_argument("--out", help="the new set's root (absent or empty)")
    ap.add_argument("--train", type=int, default=None, help="training images (default: all)")
    ap.add_argument("--test", type=int, default=None, help="test images (default: all; 0: no test split)")
    ap.add_argument("--min-side", type=int, default=250)
    ap.add_argument("--max-side", type=int, default=500)
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality, 1..100")
    ap.add_argument("--noise", type=float, default=12, help="Gaussian noise std in 0..255 units (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    ap.add_argument("--links", type=int, default=1, help="make the training split this many times larger by hard links")
    ap.add_argument("--self-test", action="store_true", help="make and check a tiny synthetic set, then exit")
    return ap.parse_args(argv)


def check_args(args):
    if args.src is None or args.out is None:
        raise UsageError("--src and --out are both needed")
    if not os.path.isdir(args.src):
        raise UsageError(f"--src {args.src} is not a folder")
    if args.min_side < 1 or args.min_side > args.max_side:
        raise UsageError(f"--min-side {args.min_side} must be in 1..--max-side ({args.max_side})")
    if not 1 <= args.quality <= 100:
        raise UsageError(f"--quality {args.quality} must be in 1..100")
    for name in ("train", "test"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            raise UsageError(f"--{name} must be >= 0")
    if args.noise < 0:
        raise UsageError("--noise must be >= 0")
    if args.workers < 1:
        raise UsageError("--workers must be >= 1")
    if args.links < 1:
        raise UsageError("--links must be >= 2 (1: no links)")


def summary_line(s):
    return (f"make_image_set: train={s['train']} test={s['test']} classes={s['classes']} links={s['links']} "
            f"copies={s['copies']} mean_bytes={s['mean_bytes']:.0f} min_bytes={s['min_bytes']} "
            f"max_bytes={s['max_bytes']} total_bytes={s['total_bytes']} seconds={s['seconds']:.1f}")


# ---------------------------------------------------------------- --self-test


def make_source(root, classes=("cat", "dog", "eel"), train=8, test=4):
    """A tiny CIFAR-like source: smooth random 32x32 colour images."""
    rng = np.random.default_rng(1)
    for split, n in (("train", train), ("test", test)):
        for c in classes:
            os.makedirs(os.path.join(root, split, c))
            for i in range(n):
                px = rng.uniform(0, 255, (4, 4, 3)).astype(np.uint8)
                img = Image.fromarray(px, "RGB").resize((32, 32), Image.BICUBIC)
                img.save(os.path.join(root, split, c, f"{i:04d}.jpg"), quality=95)


def tree(root):
    """{relative path: bytes} of every file under root."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def self_test():
    t0 = time.perf_counter()
    quiet = lambda msg: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="make_image_set-") as tmp:
        src = os.path.join(tmp, "src")
        make_source(src)

        def run(out, *extra):
            args = parse_args(["--src", src, "--out", os.path.join(tmp, out), "--train", "20", "--test", "10",
                               "--min-side", "60", "--max-side", "90", *extra])
            check_args(args)
            return generate(args, quiet), tree(os.path.join(tmp, out))

        s1, t1 = run("one", "--workers", "1")
        check_layout(t1)
        print("  layout: train 7/7/6 and test 4/3/3 per class, the first files by name, same class names")
        check_images(os.path.join(tmp, "one"), t1, 60, 90)
        print("  images: JPEG, RGB, baseline, 4:2:0, sides in 60..90, width and height drawn apart")
        _, t2 = run("two", "--workers", "2")
        assert t1 == t2, "--workers 1 and --workers 2 wrote different bytes"
        print(f"  determinism: --workers 1 and 2 wrote the same bytes ({len(t1)} files)")
        _, t3 = run("seed", "--workers", "2", "--seed", "1")
        assert t3.keys() == t1.keys() and all(t3[k] != t1[k] for k in t1), "--seed 1 repeated --seed 0's images"
        print("  --seed 1: every image differs from --seed 0's")
        s4, t4 = run("links", "--workers", "2", "--links", "3")
        check_links(os.path.join(tmp, "links"), t1, t4, s4)
        print(f"  --links 3: 60 train names, x-r1/x-r2 equal to x ({s4['links']} hard links, {s4['copies']} copies)")
        s5, _ = run("small", "--workers", "2", "--noise", "0", "--quality", "95")
        assert s5["train"] == 20 and s5["test"] == 10
        print(f"  --noise 0 accepted; mean file {s5['mean_bytes']:.0f} B against {s1['mean_bytes']:.0f} B with noise")
        check_refusals(tmp, src)
        print("  refused with UsageError (exit 2): min > max, missing --src, no images, too many per class, "
              "non-empty --out, --quality 0, --links 0")
    print(f"make_image_set: self-test passed in {time.perf_counter() - t0:.1f} s")
    return 0


def check_layout(files):
    per = {}
    for rel in files:
        split, cls, name = rel.split(os.sep)
        per.setdefault((split, cls), []).append(name)
    counts = {k: len(v) for k, v in per.items()}
    assert counts == {("train", "cat"): 7, ("train", "dog"): 7, ("train", "eel"): 6,
                      ("test", "cat"): 4, ("test", "dog"): 3, ("test", "eel"): 3}, counts
    for (split, cls), names in per.items():
        assert sorted(names) == [f"{i:04d}.jpg" for i in range(counts[(split, cls)])], (split, cls, names)


def check_images(root, files, lo, hi):
    shapes = set()
    for rel in files:
        with Image.open(os.path.join(root, rel)) as im:
            assert im.format == "JPEG" and im.mode == "RGB", (rel, im.format, im.mode)
            assert not im.info.get("progressive") and not im.info.get("progression"), rel
            assert JpegImagePlugin.get_sampling(im) == 2, (rel, "not 4:2:0")
            assert lo <= im.width <= hi and lo <= im.height <= hi, (rel, im.size)
            shapes.add(im.size)
    assert len(shapes) > len(files) // 2 and any(w != h for w, h in shapes), shapes


def check_links(root, plain, linked, summary):
    train = [k for k in plain if k.startswith("train" + os.sep)]
    assert summary["train"] == 20 and summary["links"] + summary["copies"] == 40, summary
    assert len([k for k in linked if k.startswith("train" + os.sep)]) == 60
    for k in train:
        stem = k[:-len(".jpg")]
        for r in (1, 2):
            assert linked[f"{stem}-r{r}.jpg"] == plain[k], (k, r)
            if summary["copies"] == 0:
                assert os.stat(os.path.join(root, k)).st_ino == os.stat(os.path.join(root, f"{stem}-r{r}.jpg")).st_ino


def check_refusals(tmp, src):
    empty = os.path.join(tmp, "empty")
    os.makedirs(os.path.join(empty, "train", "cat"))
    occupied = os.path.join(tmp, "one")  # written above
    cases = [
        ["--src", src, "--out", os.path.join(tmp, "r1"), "--min-side", "90", "--max-side", "60"],
        ["--src", os.path.join(tmp, "nowhere"), "--out", os.path.join(tmp, "r2")],
        ["--src", empty, "--out", os.path.join(tmp, "r3"), "--test", "0"],
        ["--src", src, "--out", os.path.join(tmp, "r4"), "--train", "100"],
        ["--src", src, "--out", occupied, "--train", "3", "--test", "0"],
        ["--src", src, "--out", os.path.join(tmp, "r6"), "--quality", "0"],
        ["--src", src, "--out", os.path.join(tmp, "r7"), "--links", "0"],
    ]
    for argv in cases:
        try:
            args = parse_args(argv)
            check_args(args)
            generate(args, lambda msg: None)
        except UsageError:
            continue
        raise AssertionError(f"not refused: {argv}")


# ---------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    if np is None:
        print(f"make_image_set: {'self-test skipped: ' if args.self_test else ''}{MISSING} (needs numpy and PIL)",
              file=sys.stderr)
        return 77 if args.self_test else 1
    if args.self_test:
        return self_test()
    try:
        check_args(args)
        summary = generate(args)
    except UsageError as e:
        print(f"make_image_set: {e}", file=sys.stderr)
        return 2
    print(summary_line(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
