#!/usr/bin/env python3
"""The PyTorch reference for issue 22's CIFAR-10 time-to-accuracy record: the recipe of
K. Jordan, "94% on CIFAR-10 in 3.29 Seconds on a Single GPU" (arXiv 2404.00498), written
here from the paper's description; trainc's configs/airbench.ini is to follow the same recipe.

  python3 tools/torch_airbench.py --runs 10                 # the defaults are the recipe
  python3 tools/torch_airbench.py --runs 10 --compile       # torch.compile, compiled once
  python3 tools/torch_airbench.py --self-check              # numpy only, no torch, no GPU

Prints `run i: acc=0.9403 time_s=3.512 eval_s=0.101` per run, then one summary JSON line
(tools/torch_common.print_summary) with the mean, std and min of the test accuracy and of
the training time over the runs.

Net (--widths 64,256,256):
  whiten   conv 2x2, no padding, 3 -> 24 channels, bias. Its weights are frozen and set at
           the start of each run from the second-moment matrix C (12x12, not centred) of
           the 2x2 patches of --whiten-images random normalised training images: with
           C = V diag(l) V^T, the filters are the rows of diag(1/sqrt(l+eps)) V^T and their
           negations (12 eigenvectors -> 24 filters), so W C W^T = diag(l/(l+eps)) ~ I.
           Its bias trains for the first --whiten-bias-epochs epochs, then is frozen (its
           learning rate is set to 0, which keeps the compiled graph unchanged).
  GELU
  3 blocks conv3x3 (pad 1, no bias) -> maxpool 2 -> BN -> GELU -> conv3x3 -> BN -> GELU
           (32 -> 31 after the whitening, then 15, 7, 3)
  head     max over the remaining 3x3, flatten, linear to 10 without bias, times
           --logit-scale (1/9)
  Convolutions in the blocks: PyTorch's default init, then (--dirac) the first
  in_channels filters set to the identity (Dirac delta), as the paper's ablation does.
  BN: eps 1e-12, weight fixed at 1 (requires_grad False), bias trained. --bn-momentum is
  the paper's 0.6, the weight of the OLD running statistics: PyTorch's BatchNorm gets
  momentum = 1 - 0.6 = 0.4 (its momentum weighs the new batch).

Optimizer: Nesterov SGD, momentum 0.85, on the SUM over the batch of the label-smoothed
(0.2) cross-entropy. Hyperparameters are decoupled (per 1024 examples):
    k        = 1024 * (1 + 1 / (1 - momentum))          # Nesterov's gain for a steady gradient, per 1024
    lr       = lr_per_1024 / k                          # torch.optim.SGD's lr (of a summed loss)
    decay    = wd_per_1024 * batch / k                  # fraction shrunk per step, lr-independent
    weight_decay passed to SGD = decay / lr_of_the_group (so lr * weight_decay = decay)
  At batch 1024, momentum 0.85 (k = 7850.67): lr = 11.5 / 7850.67 = 1.4648e-3,
  decay = 0.0153 * 1024 / 7850.67 = 1.9957e-3, weight_decay = 1.3624 for conv/linear
  weights and the whitening bias; BN biases: lr * 64 (--bn-bias-lr-scale) = 0.09375 and
  weight_decay = 1.9957e-3 / 0.09375 = 0.021287 (the same decay per step; --no-bn-bias-decay
  gives them none). The LR schedule multiplies every group's lr (the weight_decay passed
  stays, so the decay follows the schedule too):
  triangular, --lr-start 0.2 at step 0 -> 1 at --lr-peak 0.23 of the steps -> --lr-end
  0.07 at the last step (linear pieces). Batch 1024, --drop-last by default (full
  batches: 48 steps an epoch), --epochs 9.9: ceil(9.9 * 48) = 476 steps, the last epoch
  cut short.

Lookahead: every --lookahead-every 5 steps the slow copy of the parameters and BN
running statistics moves to  slow = a * slow + (1 - a) * fast  and the net takes it
(fast = slow), with a = --lookahead-alpha * (step / total_steps) ** --lookahead-power
(0.95**5 = 0.7738, power 3: little lookahead early, more late). After the last step the
net takes the slow copy (a = 1).

Data: the whole training set on the GPU, normalised once (CIFAR mean/std) to fp16,
reflect-padded by --translate (2) once. Per epoch, inside the timed window: a random
crop (a translation by up to 2 pixels each way) per image, and the alternating flip:
in epoch 0 a random half of the images is mirrored; in epoch e each image is mirrored
iff its epoch-0 choice XOR (e is odd). The epoch's order is a random permutation.
channels_last. Precision (--precision): `half` (default, the paper's way) runs the
model in fp16 (weights, activations, SGD state) with the BN layers kept in fp32;
`autocast` keeps fp32 weights under torch.autocast(fp16). No loss scaling in either: the
summed loss keeps the gradients large.

Evaluation on the 10,000 test images, in eval mode (BN running statistics), the logits
averaged over views (--tta): 0 the image; 1 the image and its mirror; 2 (default) weight
0.5 on level 1's mean and 0.25 each on level 1's mean for the image translated by one
pixel up-left and one pixel down-right (reflect padding).

Timing, as the paper times it: two CUDA events around a run's training (after the
re-initialisation of the weights: the whitening initialisation, the per-epoch augmentation and every step, lookahead included), the
data already on the GPU. Evaluation is timed apart (eval_s) and left out. Before the
runs, one untimed warm-up run of --warmup-steps steps (whitening bias trainable and
then frozen, an evaluation too) warms cuDNN's autotuner and torch.compile; the model is
re-initialised for every run, and compiled once (--compile).
"""
import argparse
import math
import os
import sys
import time

try:
    import numpy as np
except ImportError:  # --help needs no numpy; --self-check skips (77) without it
    np = None

# ---------------------------------------------------------------- pure numpy / python parts


def patches_2x2(images):
    """[N, C, H, W] -> [C*4, N*(H-1)*(W-1)] float64, rows ordered (c, dy, dx) like a conv weight."""
    x = np.asarray(images, dtype=np.float64)
    _, c, h, w = x.shape
    rows = [x[:, ch, dy:h - 1 + dy, dx:w - 1 + dx].reshape(-1) for ch in range(c) for dy in (0, 1) for dx in (0, 1)]
    return np.stack(rows)


def patch_moment(images):
    """The 2x2 patches' second-moment matrix (C*4 square, not centred)."""
    p = patches_2x2(images)
    return p @ p.T / p.shape[1]


def whitening_filters(moment, eps, channels=3):
    """Filters [2*K, channels, 2, 2] from a K x K patch second-moment matrix: each eigenvector
    scaled by 1/sqrt(eigenvalue + eps), then the same filters negated."""
    lam, vec = np.linalg.eigh(np.asarray(moment, dtype=np.float64))
    scaled = vec.T / np.sqrt(lam + eps)[:, None]
    filters = scaled.reshape(-1, channels, 2, 2)
    return np.concatenate([filters, -filters])


def flip_mask(base, epoch):
    """Which images are mirrored in `epoch` (alternating flip): epoch 0's random choice
    `base` (a bool numpy array or torch tensor [N]), inverted in every odd epoch."""
    return ~base if epoch % 2 else base


def steps_per_epoch(n, batch, drop_last):
    return n // batch if drop_last else -(-n // batch)


def total_steps(n, batch, epochs, drop_last):
    return math.ceil(epochs * steps_per_epoch(n, batch, drop_last))


def lr_factor(step, total, start, peak, end):
    """The triangular schedule: `start` at step 0, 1 at step peak*total, `end` at step total."""
    top = peak * total
    if step < top:
        return start + (1 - start) * step / top
    return 1 + (end - 1) * (step - top) / max(total - top, 1e-12)


def lookahead_alpha(step, total, every, alpha, power):
    """The weight of the slow copy after `step` steps (1-based), or None where there is no
    lookahead update; 1.0 (take the slow copy) after the last step."""
    if every <= 0:
        return None
    if step == total:
        return 1.0
    if step % every:
        return None
    return alpha * (step / total) ** power


def sgd_settings(lr_per_1024, wd_per_1024, momentum, batch, bias_lr_scale):
    """(lr, per-step decay, bias lr) for torch.optim.SGD on a summed loss (see the docstring)."""
    k = 1024 * (1 + 1 / (1 - momentum))
    lr = lr_per_1024 / k
    return lr, wd_per_1024 * batch / k, lr * bias_lr_scale


def mean_std_min(values):
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0, "min": float(v.min())}


def self_check():
    rng = np.random.default_rng(0)
    # Correlated random images: smoothed noise, channels mixed.
    noise = rng.standard_normal((64, 3, 33, 33))
    img = noise[:, :, 1:, 1:] + 0.5 * noise[:, :, :-1, 1:] + 0.3 * noise[:, :, 1:, :-1]
    img = np.einsum("ij,njhw->nihw", np.array([[1, 0.5, 0.2], [0.3, 1, 0.4], [0.1, 0.6, 1]]), img)
    moment = patch_moment(img)
    eps = 5e-4
    f = whitening_filters(moment, eps)
    assert f.shape == (24, 3, 2, 2), f.shape
    assert np.allclose(f[12:], -f[:12])
    # The filters applied as a convolution (patch rows in (c, dy, dx) order): the whitened
    # patches' second moment is diag(l/(l+eps)), within 1% of the identity here.
    white = f[:12].reshape(12, -1) @ patches_2x2(img)
    wm = white @ white.T / white.shape[1]
    lam = np.linalg.eigvalsh(moment)
    assert lam.min() > 100 * eps, lam.min()
    assert np.allclose(wm, np.diag(lam / (lam + eps)), atol=1e-9), np.abs(wm - np.diag(lam / (lam + eps))).max()
    assert np.abs(wm - np.eye(12)).max() < 1e-2, np.abs(wm - np.eye(12)).max()
    # patches_2x2's order is a convolution's: one filter by hand at one place.
    w0 = f[0]
    assert np.isclose(white[0, 0], (w0 * img[0, :, 0:2, 0:2]).sum())
    print(f"whitening: 24 filters, whitened second moment within {np.abs(wm - np.eye(12)).max():.1e} of I")

    base = rng.random(1000) < 0.5
    assert np.array_equal(flip_mask(base, 0), base)
    for e in range(1, 6):
        m = flip_mask(base, e)
        assert np.array_equal(m, ~flip_mask(base, e - 1)), e  # every image alternates
        assert np.array_equal(m, base if e % 2 == 0 else ~base)
    print("alternating flip: epoch 0 as drawn, every image mirrored in every other epoch")

    total = total_steps(50000, 1024, 9.9, True)
    assert steps_per_epoch(50000, 1024, True) == 48 and steps_per_epoch(50000, 1024, False) == 49
    assert total == 476, total
    s, p, e = 0.2, 0.23, 0.07
    assert math.isclose(lr_factor(0, total, s, p, e), s)
    assert math.isclose(lr_factor(p * total, total, s, p, e), 1.0)
    assert math.isclose(lr_factor(total, total, s, p, e), e)
    top = int(p * total)
    assert all(lr_factor(i, total, s, p, e) < lr_factor(i + 1, total, s, p, e) for i in range(top))
    assert all(lr_factor(i, total, s, p, e) > lr_factor(i + 1, total, s, p, e) for i in range(top + 1, total))
    print(f"lr schedule: {s} at step 0, 1 at step {p * total:.2f}, {e} at step {total}")

    a = [lookahead_alpha(i, total, 5, 0.95 ** 5, 3) for i in range(1, total + 1)]
    assert a[-1] == 1.0 and a[3] is None and math.isclose(a[4], 0.95 ** 5 * (5 / total) ** 3)
    assert lookahead_alpha(total, total, 0, 0.95 ** 5, 3) is None  # no lookahead: no final copy
    updates = [x for x in a[:-1] if x is not None]
    assert len(updates) == (total - 1) // 5 and updates == sorted(updates) and updates[-1] < 0.95 ** 5

    lr, decay, bias_lr = sgd_settings(11.5, 0.0153, 0.85, 1024, 64)
    assert math.isclose(lr, 11.5 / 7850.666666666667) and math.isclose(bias_lr, 64 * lr)
    assert math.isclose(decay, 0.0153 * 1024 / 7850.666666666667)
    assert math.isclose(decay / lr, 1.3623652, rel_tol=1e-6) and math.isclose(decay / bias_lr, 0.0212870, rel_tol=1e-5)
    st = mean_std_min([0.94, 0.942, 0.938])
    assert math.isclose(st["mean"], 0.94) and math.isclose(st["std"], 0.002) and st["min"] == 0.938
    print(f"sgd at batch 1024: lr {lr:.4e}, decay per step {decay:.4e}, weight_decay {decay / lr:.4f}, "
          f"bias lr {bias_lr:.5f}")
    print("torch_airbench self-check: ok")


# ---------------------------------------------------------------- options


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    B = argparse.BooleanOptionalAction
    ap.add_argument("--self-check", action="store_true", help="check the numpy parts on the CPU and exit (no torch)")
    ap.add_argument("--data", default=".data/cifar10-jpg", help="CIFAR-10 image folder, root/{train,test}/<class>/*.jpg")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="run i seeds torch and its data with seed + i")
    ap.add_argument("--epochs", type=float, default=9.9, help="fractional: the last epoch is cut")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--drop-last", action=B, default=True, help="full batches only (else a short last batch)")
    ap.add_argument("--lr", type=float, default=11.5, help="learning rate per 1024 examples (decoupled)")
    ap.add_argument("--wd", type=float, default=0.0153, help="weight decay per 1024 examples (decoupled)")
    ap.add_argument("--momentum", type=float, default=0.85, help="Nesterov momentum")
    ap.add_argument("--label-smoothing", type=float, default=0.2)
    ap.add_argument("--lr-start", type=float, default=0.2, help="LR factor at step 0")
    ap.add_argument("--lr-peak", type=float, default=0.23, help="fraction of the steps where the factor is 1")
    ap.add_argument("--lr-end", type=float, default=0.07, help="LR factor at the last step")
    ap.add_argument("--bn-bias-lr-scale", type=float, default=64.0)
    ap.add_argument("--bn-bias-decay", action=B, default=True, help="BN biases decay as much per step as the weights")
    ap.add_argument("--bn-momentum", type=float, default=0.6,
                    help="weight of the old running statistics (PyTorch's momentum is 1 minus this)")
    ap.add_argument("--widths", default="64,256,256", help="the three blocks' widths")
    ap.add_argument("--logit-scale", type=float, default=1 / 9)
    ap.add_argument("--dirac", action=B, default=True, help="identity init of the first filters of each conv")
    ap.add_argument("--whiten-eps", type=float, default=5e-4)
    ap.add_argument("--whiten-images", type=int, default=5000, help="random training images for the patch moment")
    ap.add_argument("--whiten-bias-epochs", type=float, default=3)
    ap.add_argument("--lookahead-every", type=int, default=5, help="0: no lookahead")
    ap.add_argument("--lookahead-alpha", type=float, default=0.95 ** 5)
    ap.add_argument("--lookahead-power", type=float, default=3)
    ap.add_argument("--translate", type=int, default=2, help="random translation in pixels (reflect padding)")
    ap.add_argument("--flip", choices=["alternating", "random", "none"], default="alternating")
    ap.add_argument("--tta", type=int, choices=[0, 1, 2], default=2)
    ap.add_argument("--precision", choices=["half", "autocast"], default="half")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model once, reused by every run")
    ap.add_argument("--warmup-steps", type=int, default=20, help="steps of the untimed warm-up run (0: none)")
    ap.add_argument("--eval-batch", type=int, default=2000)
    ap.add_argument("--name", default="torch_airbench")
    args = ap.parse_args(argv)
    try:
        args.widths = [int(w) for w in args.widths.split(",")]
        assert len(args.widths) == 3 and min(args.widths) > 0
    except (ValueError, AssertionError):
        ap.error(f"--widths {args.widths!r} is not three positive integers like 64,256,256")
    if args.runs < 1 or args.batch < 1 or args.epochs <= 0:
        ap.error("--runs, --batch and --epochs must be positive")
    if not 0 < args.lr_peak < 1:
        ap.error("--lr-peak must lie in (0, 1)")
    if not 0 <= args.bn_momentum < 1:
        ap.error("--bn-momentum must lie in [0, 1)")
    return args


# ---------------------------------------------------------------- torch parts


def build(torch, args):
    """The network and the helpers needing torch, defined once torch is imported."""
    nn, F = torch.nn, torch.nn.functional

    class BatchNorm(nn.BatchNorm2d):
        def __init__(self, width):
            super().__init__(width, eps=1e-12, momentum=1 - args.bn_momentum)
            self.weight.requires_grad_(False)

    class Conv(nn.Conv2d):
        def __init__(self, cin, cout):
            super().__init__(cin, cout, 3, padding=1, bias=False)

        def reset_parameters(self):
            super().reset_parameters()
            if args.dirac:
                w = self.weight.data
                nn.init.dirac_(w[:min(w.shape[0], w.shape[1])])

    class Block(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.conv1, self.norm1 = Conv(cin, cout), BatchNorm(cout)
            self.conv2, self.norm2 = Conv(cout, cout), BatchNorm(cout)

        def forward(self, x):
            x = F.gelu(self.norm1(F.max_pool2d(self.conv1(x), 2)))
            return F.gelu(self.norm2(self.conv2(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.whiten = nn.Conv2d(3, 24, 2, padding=0, bias=True)
            self.whiten.weight.requires_grad_(False)
            w = args.widths
            self.blocks = nn.Sequential(Block(24, w[0]), Block(w[0], w[1]), Block(w[1], w[2]))
            self.head = nn.Linear(w[2], 10, bias=False)

        def forward(self, x):
            x = self.blocks(F.gelu(self.whiten(x)))
            return self.head(x.amax(dim=(2, 3))) * args.logit_scale

    return Net, BatchNorm


class Trainer:
    def __init__(self, torch, args, xtr, ytr, xte, yte):
        from torch_common import MEAN, STD
        self.torch, self.args, self.F = torch, args, torch.nn.functional
        dev = xtr.device
        mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
        std = torch.tensor(STD, device=dev).view(1, 3, 1, 1)
        norm = lambda x: ((x.float() / 255 - mean) / std).half()  # noqa: E731
        self.train_images = norm(xtr)
        t = args.translate
        self.padded = self.F.pad(self.train_images, (t,) * 4, mode="reflect") if t else self.train_images
        self.ytr = ytr
        self.test_images = norm(xte).contiguous(memory_format=torch.channels_last)
        self.yte = yte
        self.n = len(ytr)
        self.steps_per_epoch = steps_per_epoch(self.n, args.batch, args.drop_last)
        if self.steps_per_epoch == 0:
            sys.exit(f"torch_airbench: --batch {args.batch} is larger than the training set ({self.n})")
        self.total = total_steps(self.n, args.batch, args.epochs, args.drop_last)
        self.bias_steps = math.ceil(args.whiten_bias_epochs * self.steps_per_epoch)
        Net, self.BatchNorm = build(torch, args)
        self.model = Net().to(dev)
        if args.precision == "half":
            self.model.half()
            for m in self.model.modules():
                if isinstance(m, self.BatchNorm):
                    m.float()
        self.model.to(memory_format=torch.channels_last)
        self.cmodel = torch.compile(self.model) if args.compile else self.model
        self.lr, self.decay, self.bias_lr = sgd_settings(args.lr, args.wd, args.momentum, args.batch,
                                                         args.bn_bias_lr_scale)

    def forward(self, x):
        torch = self.torch
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.args.precision == "autocast"):
            return self.cmodel(x)

    # -- one run's pieces

    def reset(self):
        """PyTorch's init (Dirac where --dirac), BN statistics reset; the whitening left to whiten()."""
        m = self.model
        with self.torch.no_grad():
            for mod in m.modules():
                if mod is not m.whiten and hasattr(mod, "reset_parameters"):
                    mod.reset_parameters()
            m.whiten.bias.zero_()

    def whiten(self, gen):
        torch, m = self.torch, self.model
        with torch.no_grad():
            # The whitening weights: the patch moment on the GPU, its eigen-decomposition in numpy.
            pick = torch.randperm(self.n, device=self.ytr.device, generator=gen)[:self.args.whiten_images]
            p = self.F.unfold(self.train_images[pick].float(), kernel_size=2)  # [n, 12, L], rows (c, dy, dx)
            p = p.transpose(0, 1).reshape(12, -1)
            moment = (p @ p.T / p.shape[1]).double().cpu().numpy()
            filters = whitening_filters(moment, self.args.whiten_eps)
            m.whiten.weight.copy_(torch.from_numpy(filters).to(m.whiten.weight))

    def optimizer(self):
        m, lr, decay = self.model, self.lr, self.decay
        bn_bias = [mod.bias for mod in m.modules() if isinstance(mod, self.BatchNorm)]
        weights = [p for n, p in m.named_parameters() if p.requires_grad and "norm" not in n and n != "whiten.bias"]
        groups = [
            {"params": weights, "lr": lr, "weight_decay": decay / lr, "base_lr": lr},
            {"params": bn_bias, "lr": self.bias_lr, "base_lr": self.bias_lr,
             "weight_decay": decay / self.bias_lr if self.args.bn_bias_decay else 0.0},
            {"params": [m.whiten.bias], "lr": lr, "weight_decay": decay / lr, "base_lr": lr, "whiten_bias": True},
        ]
        return self.torch.optim.SGD(groups, lr=lr, momentum=self.args.momentum, nesterov=True)

    def epoch_data(self, epoch, base_flip, gen):
        """The epoch's augmented training set [N, 3, 32, 32] fp16 channels_last (no host sync)."""
        torch, t, x = self.torch, self.args.translate, self.padded
        n, dev = self.n, x.device
        if t:
            size = x.shape[-1] - 2 * t
            oy = torch.randint(0, 2 * t + 1, (n, 1, 1, 1), device=dev, generator=gen)
            ox = torch.randint(0, 2 * t + 1, (n, 1, 1, 1), device=dev, generator=gen)
            rows = x[:, :, 0:size]
            for d in range(1, 2 * t + 1):
                rows = torch.where(oy == d, x[:, :, d:d + size], rows)
            x = rows[..., 0:size]
            for d in range(1, 2 * t + 1):
                x = torch.where(ox == d, rows[..., d:d + size], x)
        if self.args.flip != "none":
            if self.args.flip == "alternating":
                mask = flip_mask(base_flip, epoch)
            else:
                mask = torch.rand(n, device=dev, generator=gen) < 0.5
            x = torch.where(mask.view(-1, 1, 1, 1), x.flip(3), x)
        return x.contiguous(memory_format=torch.channels_last)

    def train(self, seed, max_steps=None):
        """One run from a fresh init; returns its training time in s (CUDA events)."""
        torch, args, F = self.torch, self.args, self.F
        torch.manual_seed(seed)
        gen = torch.Generator(device=self.ytr.device)
        gen.manual_seed(seed)
        steps = self.total if max_steps is None else min(max_steps, self.total)
        bias_steps = self.bias_steps if max_steps is None else steps // 2
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.model.train()
        self.reset()
        start.record()
        self.whiten(gen)
        opt = self.optimizer()
        params = [p for p in self.model.parameters()]
        state = params + [b for n, b in self.model.named_buffers() if "running" in n]
        slow = [s.detach().clone() for s in state]
        base_flip = torch.rand(self.n, device=self.ytr.device, generator=gen) < 0.5
        step, epoch = 0, 0
        while step < steps:
            images = self.epoch_data(epoch, base_flip, gen)
            order = torch.randperm(self.n, device=self.ytr.device, generator=gen)
            for i in range(self.steps_per_epoch):
                if step >= steps:
                    break
                idx = order[i * args.batch:(i + 1) * args.batch]
                factor = lr_factor(step, steps, args.lr_start, args.lr_peak, args.lr_end)
                for g in opt.param_groups:
                    g["lr"] = 0.0 if g.get("whiten_bias") and step >= bias_steps else g["base_lr"] * factor
                out = self.forward(images[idx].contiguous(memory_format=torch.channels_last))
                loss = F.cross_entropy(out.float(), self.ytr[idx], label_smoothing=args.label_smoothing,
                                       reduction="sum")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                alpha = lookahead_alpha(step, steps, args.lookahead_every, args.lookahead_alpha,
                                        args.lookahead_power)
                if alpha is not None:
                    with torch.no_grad():
                        for s, f in zip(slow, state):
                            s.lerp_(f, 1 - alpha)
                            f.copy_(s)
            epoch += 1
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000

    def evaluate(self):
        """Test accuracy with --tta's views; returns (accuracy, seconds by CUDA events)."""
        torch, F, x = self.torch, self.F, self.test_images
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.model.eval()
        start.record()
        correct = torch.zeros((), dtype=torch.int64, device=x.device)
        with torch.no_grad():
            for s in range(0, len(x), self.args.eval_batch):
                xb = x[s:s + self.args.eval_batch]
                correct += (self.tta_logits(xb).argmax(1) == self.yte[s:s + len(xb)]).sum()
        end.record()
        end.synchronize()
        self.model.train()
        return correct.item() / len(x), start.elapsed_time(end) / 1000

    def tta_logits(self, x):
        F, level = self.F, self.args.tta
        if level == 0:
            return self.forward(x).float()

        def mirrored(v):
            return 0.5 * (self.forward(v).float() + self.forward(v.flip(3)).float())

        logits = mirrored(x)
        if level == 2:
            p = F.pad(x, (1,) * 4, mode="reflect")
            up_left = p[:, :, 0:32, 0:32].contiguous(memory_format=self.torch.channels_last)
            down_right = p[:, :, 2:34, 2:34].contiguous(memory_format=self.torch.channels_last)
            logits = 0.5 * logits + 0.25 * mirrored(up_left) + 0.25 * mirrored(down_right)
        return logits


def log(msg):
    print(f"torch_airbench: {msg}", file=sys.stderr, flush=True)


def main():
    args = parse_args()
    if args.self_check:
        if np is None:
            print("torch_airbench self-check: skipped, no numpy")
            return 77
        self_check()
        return 0
    import torch  # after the options: --help and --self-check need no torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_common import load_split, print_summary
    if not torch.cuda.is_available():
        sys.exit("torch_airbench: no CUDA device")
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    xtr, ytr = load_split(args.data, "train")
    xte, yte = load_split(args.data, "test")
    log(f"decoded {len(ytr)} train and {len(yte)} test images in {time.perf_counter() - t0:.1f} s")
    trainer = Trainer(torch, args, xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev))
    log(f"{trainer.total} steps of {args.batch} ({trainer.steps_per_epoch} an epoch), SGD lr {trainer.lr:.4e}, "
        f"decay per step {trainer.decay:.4e}, BN bias lr {trainer.bias_lr:.4e}")
    if args.warmup_steps > 0:
        t = time.perf_counter()
        trainer.train(args.seed - 1, max_steps=args.warmup_steps)
        trainer.evaluate()
        log(f"untimed warm-up run ({args.warmup_steps} steps and an evaluation) in {time.perf_counter() - t:.1f} s")
    accs, times, eval_times = [], [], []
    for i in range(args.runs):
        train_s = trainer.train(args.seed + i)
        acc, eval_s = trainer.evaluate()
        accs.append(acc)
        times.append(train_s)
        eval_times.append(eval_s)
        print(f"run {i}: acc={acc:.4f} time_s={train_s:.3f} eval_s={eval_s:.3f}", flush=True)
    a, t = mean_std_min(accs), mean_std_min(times)
    print_summary({
        "name": args.name, "device": "cuda", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "runs": args.runs, "epochs": args.epochs, "steps": trainer.total, "batch": args.batch,
        "test_acc": a["mean"], "test_acc_std": a["std"], "test_acc_min": a["min"],
        "train_s": t["mean"], "train_s_std": t["std"], "train_s_min": t["min"],
        "eval_s": mean_std_min(eval_times)["mean"], "accs": accs, "train_times_s": times,
        "tta": args.tta, "precision": args.precision, "compile": args.compile, "seed": args.seed,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "sgd_lr": trainer.lr, "sgd_decay_per_step": trainer.decay, "bn_bias_lr": trainer.bias_lr,
        "wall_s": time.perf_counter() - t0,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
