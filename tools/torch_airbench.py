#!/usr/bin/env python3
"""The PyTorch reference for issue 22's CIFAR-10 time-to-accuracy record: the recipe of
K. Jordan, "94% on CIFAR-10 in 3.29 Seconds on a Single GPU" (arXiv 2404.00498), written
here from the paper's description; trainc's configs/airbench.ini is to follow the same recipe.

  python3 tools/torch_airbench.py --runs 10                 # the defaults are the recipe
  python3 tools/torch_airbench.py --runs 10 --compile       # torch.compile, compiled once
  python3 tools/torch_airbench.py --runs 10 --recipe muon   # the later Muon recipe (below)
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

Muon recipe (--recipe muon): K. Jordan's later airbench94_muon, written here from its
description. The net, the whitening, the data pipeline, TTA, BN (eps 1e-12, weight
fixed, momentum 0.6) and the loss (label smoothing 0.2, the SUM over the batch) are the
above; the summary is named torch_airbench_muon. What differs (each a flag; a flag of
one recipe given with the other is refused):
  Batch 2000 (--batch), --epochs 8, drop_last: 25 steps an epoch, 200 steps.
  head     logits = head(x) times --logit-scale, here 1/widths[2] (1/256); after
           PyTorch's init the head weight is divided by its standard deviation
           (--head-unit-std: std 1). No lookahead (--lookahead-every 0).
  SGD      torch.optim.SGD, Nesterov, --momentum 0.85, fused where PyTorch has it, over
           three groups: the whitening bias and the BN biases at --bias-lr 0.053, the
           head weight at --head-lr 0.67. Decay per step = --wd-per-example 2e-6 * batch
           = 0.004; each group's weight_decay = 0.004 / its lr (so lr * weight_decay =
           0.004 at LR factor 1; the schedule scales both).
  Muon     over every trainable 4-D weight (the blocks' six conv filters; the whitening
           filters are frozen): --muon-lr 0.24, --muon-momentum 0.6, Nesterov
           (--muon-nesterov). For a filter p [out, in, 3, 3] with gradient g:
               buf = momentum * buf + g;  u = g + momentum * buf   (Nesterov; else u = buf)
               p  *= sqrt(out) / ||p||_F                            (before the update)
               p  -= lr * NS(u as [out, in*9])
           NS, the quintic Newton-Schulz iteration (--muon-ns-steps 3, computed in
           --muon-ns-dtype bf16, returned in p's dtype): X = u / (||u||_F + 1e-7),
           transposed when it has more rows than columns (X X^T is then the smaller
           Gram matrix); --muon-ns-steps times A = X X^T, X = a X + (b A + c A A) X with (a, b, c) =
           (3.4445, -4.7750, 2.0315); transposed back. It maps u = U S V^T to
           U f(S/||u||_F) V^T with f applied that many times, f(s) = a s + b s^3 + c s^5: every
           s in [0.002, 1] ends in [0.68, 1.21] (the self-check verifies it), a rough
           U V^T. The momentum buffer is in the parameter's dtype (fp16 under --precision
           half), as the original keeps it; ||p||_F is computed in fp32.
  LR       per step k from 0 of T (200): every SGD group's lr and Muon's = initial *
           (1 - k/T); the whitening bias's instead initial * (1 - k/W) for k < W =
           ceil(--whiten-bias-epochs 3 * 25) = 75, then 0 (frozen, as above).
  On trainc's MEAN loss over batch B: SGD lr_mean = lr_sum * B and weight_decay_mean =
  decay_per_step / lr_mean give the same updates (the mean's gradient is the sum's / B):
  the head lr 0.67 * 2000 = 1340 with weight_decay 0.004 / 1340 = 2.985e-6, the biases lr
  0.053 * 2000 = 106 with weight_decay 3.774e-5. Muon's lr and momentum stay as they are:
  NS(c u) = NS(u) for any c > 0 (but for the 1e-7), so the loss's scale does not reach
  the update, and the weight normalisation does not depend on it.
"""
import argparse
import inspect
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


NS_COEFFS = (3.4445, -4.7750, 2.0315)  # the quintic Newton-Schulz iteration's (a, b, c)


def newton_schulz(u, steps, norm):
    """Muon's NS (see the docstring) of a 2-D numpy array or torch tensor u, in u's dtype;
    `norm` is the Frobenius norm for u's kind (np.linalg.norm, torch.linalg.vector_norm)."""
    a, b, c = NS_COEFFS
    tall = u.shape[0] > u.shape[1]
    x = u.T if tall else u
    x = x / (norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if tall else x


def ns_singular_map(s, steps):
    """What newton_schulz does to each singular value s of u / ||u||_F."""
    a, b, c = NS_COEFFS
    for _ in range(steps):
        s = a * s + b * s ** 3 + c * s ** 5
    return s


def linear_decay(step, span):
    """The muon recipe's LR factor at step `step` (from 0): 1 - step/span, 0 from step `span` on."""
    return 1 - step / span if step < span else 0.0


def mean_loss_sgd(lr_sum, decay, batch):
    """torch.optim.SGD's (lr, weight_decay) on the MEAN loss over `batch` that step as lr_sum
    and `decay` per step do on the summed loss."""
    lr = lr_sum * batch
    return lr, decay / lr


def sgd_nesterov_step(p, grad, buf, lr, weight_decay, momentum):
    """torch.optim.SGD's step (Nesterov, no dampening) in numpy: (new p, new buffer)."""
    d = grad + weight_decay * p
    buf = momentum * buf + d
    return p - lr * (d + momentum * buf), buf


def sgd_group(params, lr, decay, **marks):
    """A torch.optim.SGD param group at `lr` that decays `decay` per step (at LR factor 1)."""
    return {"params": params, "lr": lr, "base_lr": lr, "weight_decay": decay / lr, **marks}


def fused_if_available(sgd):
    """{"fused": True} where this torch's SGD has a fused step."""
    return {"fused": True} if "fused" in inspect.signature(sgd).parameters else {}


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
    self_check_muon(rng)
    print("torch_airbench self-check: ok")


def self_check_muon(rng):
    total, per_epoch = total_steps(50000, 2000, 8, True), steps_per_epoch(50000, 2000, True)
    bias_steps = math.ceil(3 * per_epoch)
    assert (per_epoch, total, bias_steps) == (25, 200, 75), (per_epoch, total, bias_steps)
    main = [linear_decay(k, total) for k in range(total)]
    bias = [linear_decay(k, bias_steps) for k in range(total)]
    assert main[0] == 1 and math.isclose(main[100], 0.5) and math.isclose(main[-1], 1 / total)
    assert all(x > y > 0 for x, y in zip(main, main[1:]))
    assert bias[0] == 1 and math.isclose(bias[74], 1 / 75) and set(bias[75:]) == {0.0}
    assert all(x > y for x, y in zip(bias[:76], bias[1:76]))
    print(f"muon schedule: 1 - k/{total} for every lr, the whitening bias 1 - k/{bias_steps} then 0")

    # The mean-loss conversion: B examples' gradients, the summed loss stepped with (lr, decay / lr)
    # and the mean loss with mean_loss_sgd's (lr, weight_decay), 5 steps each, the same weights.
    batch, decay = 2000, 2e-6 * 2000
    assert math.isclose(decay, 0.004)
    lr_mean, wd_mean = mean_loss_sgd(0.67, decay, batch)
    assert math.isclose(lr_mean, 1340) and math.isclose(wd_mean, 2.98507e-6, rel_tol=1e-5)
    assert math.isclose(mean_loss_sgd(0.053, decay, batch)[1], 3.77358e-5, rel_tol=1e-5)
    a, y = rng.standard_normal((batch, 8)) / batch, rng.standard_normal(batch) / batch
    p_sum = p_mean = rng.standard_normal(8)
    b_sum = b_mean = np.zeros(8)
    for _ in range(5):
        grad_sum = a.T @ (a @ p_sum - y)  # the sum over the batch of (a_i . p - y_i)^2 / 2's gradient
        p_sum, b_sum = sgd_nesterov_step(p_sum, grad_sum, b_sum, 0.67, decay / 0.67, 0.85)
        grad_mean = a.T @ (a @ p_mean - y) / batch
        p_mean, b_mean = sgd_nesterov_step(p_mean, grad_mean, b_mean, lr_mean, wd_mean, 0.85)
    assert np.abs(p_sum - p_mean).max() < 1e-12 * np.abs(p_sum).max(), np.abs(p_sum - p_mean).max()
    print(f"muon sgd: decay per step {decay}, head lr 0.67 is {lr_mean:.0f} on the mean loss "
          f"with weight_decay {wd_mean:.4e}")

    # NS: the singular values' map stays in [0.68, 1.21] from s = 0.002 up; the matrix
    # iteration is that map on u's singular values (wide and tall), scale-free, and a tall
    # input's Gram matrices are the small (columns x columns) ones.
    s = np.geomspace(0.002, 1, 100001)
    f = ns_singular_map(s, 5)
    assert f.min() > 0.68 and f.max() < 1.21, (f.min(), f.max())
    for rows, cols in ((64, 216), (256, 64)):
        u = rng.standard_normal((rows, cols))
        grams = []

        class Logged(np.ndarray):
            def __matmul__(self, other):
                out = np.ndarray.__matmul__(self, other)
                grams.append(out.shape)
                return out

        x = np.asarray(newton_schulz(u.view(Logged), 5, np.linalg.norm))
        small = min(rows, cols)
        assert x.shape == u.shape and set(grams[0::3] + grams[1::3]) == {(small, small)}, grams[:3]
        uu, sv, vt = np.linalg.svd(u, full_matrices=False)
        want = ns_singular_map(sv / (np.linalg.norm(u) + 1e-7), 5)
        assert np.abs(x - (uu * want) @ vt).max() < 1e-12, np.abs(x - (uu * want) @ vt).max()
        got = np.linalg.svd(x, compute_uv=False)
        assert got.min() > 0.68 and got.max() < 1.21, (got.min(), got.max())
        assert np.abs(newton_schulz(1000 * u, 5, np.linalg.norm) - x).max() < 1e-8
        print(f"newton-schulz {rows}x{cols}: singular values in [{got.min():.3f}, {got.max():.3f}]")


# ---------------------------------------------------------------- options


WIDTH_SCALE = "1/widths[2]"  # the muon recipe's logit scale, known once --widths is read

# The options whose defaults depend on --recipe (None until filled from here); an option in
# one recipe's table alone is refused with the other recipe.
RECIPE_DEFAULTS = {
    "airbench94": {"epochs": 9.9, "batch": 1024, "logit_scale": 1 / 9, "head_unit_std": False,
                   "lookahead_every": 5, "name": "torch_airbench", "lr": 11.5, "wd": 0.0153, "lr_start": 0.2,
                   "lr_peak": 0.23, "lr_end": 0.07, "bn_bias_lr_scale": 64.0, "bn_bias_decay": True},
    "muon": {"epochs": 8.0, "batch": 2000, "logit_scale": WIDTH_SCALE, "head_unit_std": True,
             "lookahead_every": 0, "name": "torch_airbench_muon", "bias_lr": 0.053, "head_lr": 0.67,
             "wd_per_example": 2e-6, "muon_lr": 0.24, "muon_momentum": 0.6, "muon_nesterov": True,
             "muon_ns_steps": 3, "muon_ns_dtype": "bf16"},
}


def flag(key):
    return "--" + key.replace("_", "-")


def recipe_help(key, text):
    """`text` and the recipes' defaults for option `key`."""
    shown = [f"{r} {d[key]:.4g}" if isinstance(d[key], float) else f"{r} {d[key]}"
             for r, d in RECIPE_DEFAULTS.items() if key in d]
    return f"{text} [{', '.join(shown)}]"


def fill_recipe_defaults(ap, args):
    mine = RECIPE_DEFAULTS[args.recipe]
    for other, table in RECIPE_DEFAULTS.items():
        for key in sorted(table.keys() - mine.keys()):
            if getattr(args, key) is not None:
                ap.error(f"{flag(key)} belongs to --recipe {other}, not --recipe {args.recipe}")
    for key, value in mine.items():
        if getattr(args, key) is None:
            setattr(args, key, 1 / args.widths[2] if value == WIDTH_SCALE else value)


def check_ranges(ap, args):
    muon = args.recipe == "muon"
    positive = ["runs", "batch", "epochs", "logit_scale"]
    positive += ["bias_lr", "head_lr", "muon_lr", "muon_ns_steps"] if muon else ["lr", "bn_bias_lr_scale"]
    non_negative = ["lookahead_every", "whiten_bias_epochs", "wd_per_example" if muon else "wd"]
    fraction = ["momentum"] + ([] if muon else ["lr_peak"])  # SGD's Nesterov wants a momentum
    below_one = ["bn_momentum"] + (["muon_momentum"] if muon else [])
    for keys, ok, what in ((positive, lambda v: v > 0, "be positive"), (non_negative, lambda v: v >= 0, "be >= 0"),
                           (fraction, lambda v: 0 < v < 1, "lie in (0, 1)"),
                           (below_one, lambda v: 0 <= v < 1, "lie in [0, 1)")):
        for key in keys:
            if not ok(getattr(args, key)):
                ap.error(f"{flag(key)} must {what}, not {getattr(args, key)}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    B = argparse.BooleanOptionalAction
    ap.add_argument("--self-check", action="store_true", help="check the numpy parts on the CPU and exit (no torch)")
    ap.add_argument("--recipe", choices=list(RECIPE_DEFAULTS), default="airbench94",
                    help="airbench94 (SGD, lookahead) or muon (Muon on the filters); [..] below: each one's default")
    ap.add_argument("--data", default=".data/cifar10-jpg", help="CIFAR-10 image folder, root/{train,test}/<class>/*.jpg")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="run i seeds torch and its data with seed + i")
    ap.add_argument("--epochs", type=float, help=recipe_help("epochs", "fractional: the last epoch is cut"))
    ap.add_argument("--batch", type=int, help=recipe_help("batch", "examples a step"))
    ap.add_argument("--drop-last", action=B, default=True, help="full batches only (else a short last batch)")
    ap.add_argument("--lr", type=float, help=recipe_help("lr", "learning rate per 1024 examples (decoupled)"))
    ap.add_argument("--wd", type=float, help=recipe_help("wd", "weight decay per 1024 examples (decoupled)"))
    ap.add_argument("--momentum", type=float, default=0.85, help="SGD's Nesterov momentum")
    ap.add_argument("--label-smoothing", type=float, default=0.2)
    ap.add_argument("--lr-start", type=float, help=recipe_help("lr_start", "LR factor at step 0"))
    ap.add_argument("--lr-peak", type=float,
                    help=recipe_help("lr_peak", "fraction of the steps where the factor is 1"))
    ap.add_argument("--lr-end", type=float, help=recipe_help("lr_end", "LR factor at the last step"))
    ap.add_argument("--bn-bias-lr-scale", type=float, help=recipe_help("bn_bias_lr_scale", "BN biases' lr / lr"))
    ap.add_argument("--bn-bias-decay", action=B,
                    help=recipe_help("bn_bias_decay", "BN biases decay as much per step as the weights"))
    ap.add_argument("--bias-lr", type=float,
                    help=recipe_help("bias_lr", "SGD lr of the whitening bias and the BN biases (summed loss)"))
    ap.add_argument("--head-lr", type=float, help=recipe_help("head_lr", "SGD lr of the head weight (summed loss)"))
    ap.add_argument("--wd-per-example", type=float,
                    help=recipe_help("wd_per_example", "SGD groups' decay per step = this * batch"))
    ap.add_argument("--muon-lr", type=float, help=recipe_help("muon_lr", "Muon's lr"))
    ap.add_argument("--muon-momentum", type=float, help=recipe_help("muon_momentum", "Muon's momentum"))
    ap.add_argument("--muon-nesterov", action=B, help=recipe_help("muon_nesterov", "Muon's Nesterov momentum"))
    ap.add_argument("--muon-ns-steps", type=int, help=recipe_help("muon_ns_steps", "Newton-Schulz iterations"))
    ap.add_argument("--muon-ns-dtype", choices=["bf16", "fp32"],
                    help=recipe_help("muon_ns_dtype", "the Newton-Schulz iteration's dtype"))
    ap.add_argument("--bn-momentum", type=float, default=0.6,
                    help="weight of the old running statistics (PyTorch's momentum is 1 minus this)")
    ap.add_argument("--widths", default="64,256,256", help="the three blocks' widths")
    ap.add_argument("--logit-scale", type=float, help=recipe_help("logit_scale", "the head's output times this"))
    ap.add_argument("--head-unit-std", action=B,
                    help=recipe_help("head_unit_std", "the head weight divided by its std after the init"))
    ap.add_argument("--dirac", action=B, default=True, help="identity init of the first filters of each conv")
    ap.add_argument("--whiten-eps", type=float, default=5e-4)
    ap.add_argument("--whiten-images", type=int, default=5000, help="random training images for the patch moment")
    ap.add_argument("--whiten-bias-epochs", type=float, default=3)
    ap.add_argument("--lookahead-every", type=int, help=recipe_help("lookahead_every", "0: no lookahead"))
    ap.add_argument("--lookahead-alpha", type=float, default=0.95 ** 5)
    ap.add_argument("--lookahead-power", type=float, default=3)
    ap.add_argument("--translate", type=int, default=2, help="random translation in pixels (reflect padding)")
    ap.add_argument("--flip", choices=["alternating", "random", "none"], default="alternating")
    ap.add_argument("--tta", type=int, choices=[0, 1, 2], default=2)
    ap.add_argument("--precision", choices=["half", "autocast"], default="half")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model once, reused by every run (and Muon's Newton-Schulz)")
    ap.add_argument("--warmup-steps", type=int, default=20, help="steps of the untimed warm-up run (0: none)")
    ap.add_argument("--eval-batch", type=int, default=2000)
    ap.add_argument("--name", help=recipe_help("name", "the summary's name"))
    args = ap.parse_args(argv)
    try:
        args.widths = [int(w) for w in args.widths.split(",")]
        assert len(args.widths) == 3 and min(args.widths) > 0
    except (ValueError, AssertionError):
        ap.error(f"--widths {args.widths!r} is not three positive integers like 64,256,256")
    fill_recipe_defaults(ap, args)
    check_ranges(ap, args)
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

    class Muon(torch.optim.Optimizer):
        """The muon recipe's optimizer of the conv filters (see the docstring); `orthogonalise`
        maps the update [out, in*9] to its Newton-Schulz orthogonalisation in its dtype."""

        def __init__(self, groups, lr, momentum, nesterov, orthogonalise):
            super().__init__(groups, {"lr": lr, "momentum": momentum, "nesterov": nesterov})
            self.orthogonalise = orthogonalise

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                momentum = group["momentum"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    buf = state["momentum_buffer"].mul_(momentum).add_(p.grad)
                    u = p.grad.add(buf, alpha=momentum) if group["nesterov"] else buf
                    p.mul_(math.sqrt(p.shape[0]) / torch.linalg.vector_norm(p, dtype=torch.float32))
                    p.sub_(self.orthogonalise(u.reshape(len(u), -1)).view_as(p), alpha=group["lr"])

    return Net, BatchNorm, Muon


def muon_orthogonalise(torch, args):
    """Muon's NS on a torch matrix in --muon-ns-dtype, returned in the matrix's dtype (compiled
    with --compile: one graph for each of the filters' four shapes)."""
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.muon_ns_dtype]

    def orthogonalise(u):
        return newton_schulz(u.to(dtype), args.muon_ns_steps, torch.linalg.vector_norm).to(u.dtype)

    return torch.compile(orthogonalise, dynamic=False) if args.compile else orthogonalise


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
        Net, self.BatchNorm, self.Muon = build(torch, args)
        self.model = Net().to(dev)
        if args.precision == "half":
            self.model.half()
            for m in self.model.modules():
                if isinstance(m, self.BatchNorm):
                    m.float()
        self.model.to(memory_format=torch.channels_last)
        self.cmodel = torch.compile(self.model) if args.compile else self.model
        if args.recipe == "muon":
            self.decay = args.wd_per_example * args.batch
            self.orthogonalise = muon_orthogonalise(torch, args)
        else:
            self.lr, self.decay, self.bias_lr = sgd_settings(args.lr, args.wd, args.momentum, args.batch,
                                                             args.bn_bias_lr_scale)

    def settings(self):
        """The optimizers' settings, for the log and the summary."""
        a = self.args
        if a.recipe == "muon":
            return {"head_lr": a.head_lr, "bias_lr": a.bias_lr, "sgd_decay_per_step": self.decay,
                    "muon_lr": a.muon_lr, "muon_momentum": a.muon_momentum, "muon_nesterov": a.muon_nesterov,
                    "muon_ns_steps": a.muon_ns_steps, "muon_ns_dtype": a.muon_ns_dtype}
        return {"sgd_lr": self.lr, "sgd_decay_per_step": self.decay, "bn_bias_lr": self.bias_lr}

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
            if self.args.head_unit_std:
                m.head.weight.mul_(1 / m.head.weight.float().std())

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

    def optimizers(self):
        """The recipe's optimizers; each param group carries its initial lr (base_lr), the
        whitening bias's group is marked whiten_bias."""
        m, a, decay = self.model, self.args, self.decay
        bn_bias = [mod.bias for mod in m.modules() if isinstance(mod, self.BatchNorm)]
        SGD = self.torch.optim.SGD
        if a.recipe == "muon":
            sgd = SGD([sgd_group([m.whiten.bias], a.bias_lr, decay, whiten_bias=True),
                       sgd_group(bn_bias, a.bias_lr, decay), sgd_group([m.head.weight], a.head_lr, decay)],
                      lr=a.bias_lr, momentum=a.momentum, nesterov=True, **fused_if_available(SGD))
            filters = [p for p in m.parameters() if p.requires_grad and p.ndim == 4]
            muon = self.Muon([{"params": filters, "base_lr": a.muon_lr}], lr=a.muon_lr, momentum=a.muon_momentum,
                             nesterov=a.muon_nesterov, orthogonalise=self.orthogonalise)
            opts = [sgd, muon]
        else:
            weights = [p for n, p in m.named_parameters() if p.requires_grad and "norm" not in n and n != "whiten.bias"]
            bn_decay = decay if a.bn_bias_decay else 0.0
            opts = [SGD([sgd_group(weights, self.lr, decay), sgd_group(bn_bias, self.bias_lr, bn_decay),
                         sgd_group([m.whiten.bias], self.lr, decay, whiten_bias=True)],
                        lr=self.lr, momentum=a.momentum, nesterov=True)]
        stepped = [p for o in opts for g in o.param_groups for p in g["params"]]
        trainable = [p for p in m.parameters() if p.requires_grad]
        if len(stepped) != len(trainable) or {id(p) for p in stepped} != {id(p) for p in trainable}:
            raise RuntimeError("torch_airbench: the optimizers do not step every trainable parameter once")
        return opts

    def group_factor(self, group, step, steps, bias_steps):
        """The schedule's factor of a param group's initial lr at `step` (from 0) of `steps`."""
        a, whiten_bias = self.args, group.get("whiten_bias", False)
        if a.recipe == "muon":
            return linear_decay(step, bias_steps if whiten_bias else steps)
        if whiten_bias and step >= bias_steps:
            return 0.0
        return lr_factor(step, steps, a.lr_start, a.lr_peak, a.lr_end)

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
        opts = self.optimizers()
        if args.lookahead_every > 0:
            state = list(self.model.parameters()) + [b for n, b in self.model.named_buffers() if "running" in n]
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
                for opt in opts:
                    for g in opt.param_groups:
                        g["lr"] = g["base_lr"] * self.group_factor(g, step, steps, bias_steps)
                out = self.forward(images[idx].contiguous(memory_format=torch.channels_last))
                loss = F.cross_entropy(out.float(), self.ytr[idx], label_smoothing=args.label_smoothing,
                                       reduction="sum")
                for opt in opts:
                    opt.zero_grad(set_to_none=True)
                loss.backward()
                for opt in opts:
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
    settings = trainer.settings()
    log(f"--recipe {args.recipe}: {trainer.total} steps of {args.batch} ({trainer.steps_per_epoch} an epoch), "
        + ", ".join(f"{k} {v:.4e}" if isinstance(v, float) else f"{k} {v}" for k, v in settings.items()))
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
        "params": sum(p.numel() for p in trainer.model.parameters()), "recipe": args.recipe,
        **settings, "wall_s": time.perf_counter() - t0,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
