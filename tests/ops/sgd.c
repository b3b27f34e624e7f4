/* SGD with momentum (ops/sgd.h). Through the face, the mixed-precision step:
 * gradients of the case's dtype, scaled by a loss scaler or not, three steps at
 * changing learning rates read through the pointer, against the CPU
 * reference; the half copy the master rounded, bit for bit; a step with
 * found_inf moving nothing (master, momentum, half copy, scaler state). On the
 * GPU also the plain fp32 step (sgd_step_cuda, which has no face) and half
 * copies of the other half type (the CUDA path takes them; the face ties the
 * copy's type to the gradients'). On the CPU: PyTorch's semantics by hand and
 * against torch.optim.SGD's algorithm in double; the mixed step is the plain
 * one at scale 1 and at a power-of-two scale, bit for bit. With a weight-decay
 * mask, every step is the decayed one where the mask is set and the undecayed
 * one elsewhere, to the bit. grad_mult is grad_norm's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cast.h"
#include "ops/loss_scaler.h"
#include "ops/sgd.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

static const SgdParams nesterov = {.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1};
static const SgdParams plain = {.momentum = 0.9f, .weight_decay = 0.0f, .nesterov = 0};
static const SgdParams no_momentum = {.momentum = 0.0f, .weight_decay = 1e-2f, .nesterov = 0};

/* The mixed step on c's device: through the face where the half copy is of
 * the gradients' type or absent, else the CUDA path itself. */
static void mixed_step(const GridCase *c, float *master, const void *grad, float *m, void *half, DType half_dtype,
                       size_t n, const float *lr, const LossScalerState *scaler, SgdParams p) {
    if (!half || half_dtype == c->dtype) sgd_step_mixed(&c->ctx, master, grad, m, half, n, lr, scaler, p);
    else GPU_ONLY(sgd_step_mixed_cuda(master, grad, c->dtype, m, half, half_dtype, n, lr, scaler, p, c->ctx.stream));
}

/* half_dtype DTYPE_F32 stands for no half copy. */
static void sgd_mixed(const GridCase *c, DType half_dtype, int use_scaler, SgdParams p) {
    DType dt = c->dtype;
    int with_copy = half_dtype != DTYPE_F32;
    printf(" mixed step: half copy %s, %s, momentum %g wd %g nesterov %d\n", with_copy ? dtype_name(half_dtype) : "none",
           use_scaler ? "scaler" : "no scaler", p.momentum, p.weight_decay, p.nesterov);
    const size_t n = 1000003;
    float *master = grid_random(c, DTYPE_F32, n, -1, 1), *m = grid_random(c, DTYPE_F32, n, -0.1f, 0.1f);
    float *grad = host_floats(n);
    LossScalerState cpu_state = loss_scaler_initial(use_scaler ? 1024.0f : 1.0f);
    float *d_master = grid_put(c, DTYPE_F32, master, n), *d_m = grid_put(c, DTYPE_F32, m, n);
    void *d_grad = grid_alloc(c, dt, n), *d_half = with_copy ? grid_alloc(c, half_dtype, n) : NULL;
    float *d_lr = grid_alloc(c, DTYPE_F32, 1);
    LossScalerState *d_state = use_scaler ? grid_put_bytes(c, &cpu_state, sizeof cpu_state) : NULL;
    const float lrs[3] = {0.1f, 0.02f, 0.5f};
    for (int step = 0; step < 3; step++) {
        /* gradients as the backward pass leaves them: scaled, in the case's dtype */
        for (size_t i = 0; i < n; i++) grad[i] = test_uniform(c->rng, -1, 1) * cpu_state.scale;
        round_to(dt, grad, n);
        grid_set(c, dt, d_grad, grad, n);
        grid_set(c, DTYPE_F32, d_lr, &lrs[step], 1);
        sgd_step_mixed_cpu(master, grad, m, n, &lrs[step], use_scaler ? &cpu_state : NULL, p);
        mixed_step(c, d_master, d_grad, d_m, d_half, half_dtype, n, d_lr, d_state, p);
    }
    float *gmaster = grid_get(c, DTYPE_F32, d_master, n), *gm = grid_get(c, DTYPE_F32, d_m, n);
    /* the device may fuse multiply-adds: a rounding apart per step */
    grid_check(c, "sgd_mixed master", gmaster, master, n, 1e-6);
    grid_check(c, "sgd_mixed momentum", gm, m, n, 1e-5);
    size_t half_bytes = n * dtype_size(half_dtype);
    void *half_before = NULL;
    if (with_copy) { /* the half copy is the device's own master, rounded */
        half_before = grid_get_bytes(c, d_half, half_bytes);
        void *want = host_bytes(half_bytes);
        cast_from_f32_cpu(half_dtype, gmaster, want, n);
        grid_check_same(c, "sgd_mixed half copy (the master rounded)", half_before, want, half_bytes);
        free(want);
    }
    if (use_scaler) { /* found_inf: nothing moves, bit for bit, even with inf in the gradients */
        LossScalerState skip = cpu_state;
        skip.found_inf = 1;
        op_copy_from_host(&c->ctx, d_state, &skip, sizeof skip);
        grad[n / 2] = INFINITY;
        grid_set(c, dt, d_grad, grad, n);
        mixed_step(c, d_master, d_grad, d_m, d_half, half_dtype, n, d_lr, d_state, p);
        grid_check_kept(c, "sgd_mixed master (skipped step)", d_master, gmaster, n * sizeof(float));
        grid_check_kept(c, "sgd_mixed momentum (skipped step)", d_m, gm, n * sizeof(float));
        if (with_copy) grid_check_kept(c, "sgd_mixed half copy (skipped step)", d_half, half_before, half_bytes);
        grid_check_kept(c, "sgd_mixed scaler state (skipped step)", d_state, &skip, sizeof skip);
    }
    void *dev[] = {d_master, d_m, d_grad, d_half, d_lr, d_state};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {master, m, grad, gmaster, gm, half_before};
    host_free_all(host, GRID_COUNT(host));
}

/* The plain fp32 step on the GPU against the CPU's, three steps; with
 * lr_scale, each parameter's share drawn from {0, 0.5, 1, 64}. */
static void sgd_plain_gpu(const GridCase *c, size_t n, SgdParams p, int lr_scale) {
    printf(" plain step n=%zu momentum %g weight_decay %g nesterov %d%s\n", n, p.momentum, p.weight_decay, p.nesterov,
           lr_scale ? " lr_scale" : "");
    float *share = lr_scale ? grid_random_shares(c->rng, n) : NULL, *d_share = NULL;
    SgdParams pd = p;
    if (share) {
        p.lr_scale = share;
        pd.lr_scale = d_share = grid_put(c, DTYPE_F32, share, n);
    }
    (void)pd; /* read by the CUDA path alone */
    float *w = grid_random(c, DTYPE_F32, n, -1, 1), *m = grid_random(c, DTYPE_F32, n, -0.1f, 0.1f);
    float *grad = host_floats(n);
    float *d_w = grid_put(c, DTYPE_F32, w, n), *d_m = grid_put(c, DTYPE_F32, m, n);
    float *d_grad = grid_alloc(c, DTYPE_F32, n), *d_lr = grid_alloc(c, DTYPE_F32, 1);
    const float lrs[3] = {0.1f, 0.02f, 0.5f};
    for (int step = 0; step < 3; step++) {
        test_fill_uniform(grad, n, c->rng, -1, 1);
        grid_set(c, DTYPE_F32, d_grad, grad, n);
        grid_set(c, DTYPE_F32, d_lr, &lrs[step], 1);
        sgd_step_cpu(w, grad, m, n, &lrs[step], p);
        GPU_ONLY(sgd_step_cuda(d_w, d_grad, d_m, n, d_lr, pd, c->ctx.stream));
    }
    float *gw = grid_get(c, DTYPE_F32, d_w, n), *gm = grid_get(c, DTYPE_F32, d_m, n);
    /* the GPU may fuse multiply-adds: a rounding apart per step */
    grid_check(c, "sgd w", gw, w, n, 1e-6);
    grid_check(c, "sgd m", gm, m, n, 1e-5);
    void *dev[] = {d_w, d_m, d_grad, d_lr, d_share};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {w, m, grad, gw, gm, share};
    host_free_all(host, GRID_COUNT(host));
}

/* ---- the weight-decay mask (ResNet's recipe: no decay on biases and BN) ---------- */

static float *uniform_floats(uint64_t *rng, size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, rng, lo, hi);
    return p;
}

/* where mask: a, else b, elementwise */
static void select_floats(const uint8_t *mask, const float *a, const float *b, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = mask[i] ? a[i] : b[i];
}

#if TRAINC_CUDA
/* Masked = decayed where the mask is set, undecayed elsewhere, to the bit:
 * the plain fp32 step and the mixed step (f16 gradients, a half copy); and the
 * masked step within a rounding of the CPU's (the GPU may fuse multiply-adds). */
static void sgd_mask_gpu(const GridCase *c, size_t n, SgdParams p) {
    printf(" decay mask n=%zu momentum %g wd %g nesterov %d\n", n, p.momentum, p.weight_decay, p.nesterov);
    float lr = 0.05f;
    float *w = grid_random(c, DTYPE_F32, n, -1, 1), *m = grid_random(c, DTYPE_F32, n, -0.1f, 0.1f);
    float *grad = grid_random(c, DTYPE_F16, n, -1, 1);
    uint8_t *mask = grid_random_mask(c->rng, n), *d_mask = grid_put_bytes(c, mask, n);
    float *d_lr = grid_put(c, DTYPE_F32, &lr, 1), *d_grad = grid_put(c, DTYPE_F32, grad, n);
    void *d_grad16 = grid_put(c, DTYPE_F16, grad, n), *d_half = grid_alloc(c, DTYPE_F16, n);
    LossScalerState one = loss_scaler_initial(1.0f);
    LossScalerState *d_scaler = grid_put_bytes(c, &one, sizeof one);
    SgdParams none = p, masked = p;
    none.weight_decay = 0.0f;
    masked.decay_mask = d_mask;
    const SgdParams *variants[3] = {&p, &none, &masked};
    for (int mixed = 0; mixed < 2; mixed++) {
        float *out_w[3], *out_m[3];
        for (int v = 0; v < 3; v++) {
            float *d_w = grid_put(c, DTYPE_F32, w, n), *d_m = grid_put(c, DTYPE_F32, m, n);
            if (mixed)
                sgd_step_mixed_cuda(d_w, d_grad16, DTYPE_F16, d_m, d_half, DTYPE_F16, n, d_lr, d_scaler, *variants[v],
                                    c->ctx.stream);
            else sgd_step_cuda(d_w, d_grad, d_m, n, d_lr, *variants[v], c->ctx.stream);
            out_w[v] = grid_get(c, DTYPE_F32, d_w, n);
            out_m[v] = grid_get(c, DTYPE_F32, d_m, n);
            grid_free(c, d_w), grid_free(c, d_m);
        }
        const char *step = mixed ? "sgd_step_mixed_cuda" : "sgd_step_cuda";
        float *want_w = host_floats(n), *want_m = host_floats(n);
        select_floats(mask, out_w[0], out_w[1], want_w, n);
        select_floats(mask, out_m[0], out_m[1], want_m, n);
        CHECK_MSG(!memcmp(out_w[2], want_w, n * sizeof(float)) && !memcmp(out_m[2], want_m, n * sizeof(float)),
                  "%s with a decay mask is not the decayed/undecayed step per element", step);
        CHECK_MSG(memcmp(out_w[0], out_w[1], n * sizeof(float)), "weight decay changed nothing: the check cannot fail");
        float *cw = copy_floats(w, n), *cm = copy_floats(m, n);
        SgdParams host_masked = p;
        host_masked.decay_mask = mask;
        sgd_step_cpu(cw, grad, cm, n, &lr, host_masked);
        grid_check(c, mixed ? "sgd mixed masked w vs cpu" : "sgd masked w vs cpu", out_w[2], cw, n, 1e-6);
        free(want_w), free(want_m), free(cw), free(cm);
        for (int v = 0; v < 3; v++) free(out_w[v]), free(out_m[v]);
    }
    void *dev[] = {d_mask, d_lr, d_grad, d_grad16, d_half, d_scaler};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {w, m, grad, mask};
    host_free_all(host, GRID_COUNT(host));
}
#endif

/* The CPU: the plain and the mixed step (with a scaler) with a mask are the
 * decayed and the undecayed step per element, to the bit. */
static void sgd_mask_cpu(uint64_t *rng, SgdParams p) {
    printf(" decay mask: momentum %g wd %g nesterov %d\n", p.momentum, p.weight_decay, p.nesterov);
    size_t n = 1003, bytes = n * sizeof(float);
    float lr = 0.05f;
    float *w = uniform_floats(rng, n, -1, 1), *m = uniform_floats(rng, n, -0.1f, 0.1f);
    float *grad = uniform_floats(rng, n, -1, 1);
    uint8_t *mask = grid_random_mask(rng, n);
    float *wd_w = copy_floats(w, n), *wd_m = copy_floats(m, n); /* every parameter decays */
    float *no_w = copy_floats(w, n), *no_m = copy_floats(m, n); /* none does */
    float *mk_w = copy_floats(w, n), *mk_m = copy_floats(m, n); /* masked */
    float *want_w = host_floats(n), *want_m = host_floats(n);
    SgdParams none = p, masked = p;
    none.weight_decay = 0.0f;
    masked.decay_mask = mask;
    sgd_step_cpu(wd_w, grad, wd_m, n, &lr, p);
    sgd_step_cpu(no_w, grad, no_m, n, &lr, none);
    sgd_step_cpu(mk_w, grad, mk_m, n, &lr, masked);
    select_floats(mask, wd_w, no_w, want_w, n);
    select_floats(mask, wd_m, no_m, want_m, n);
    CHECK_MSG(!memcmp(mk_w, want_w, bytes) && !memcmp(mk_m, want_m, bytes),
              "sgd_step_cpu with a decay mask is not the decayed/undecayed step per element");
    CHECK_MSG(memcmp(wd_w, no_w, bytes), "weight decay changed nothing: the check cannot fail");

    LossScalerState scaler = loss_scaler_initial(1024.0f);
    float *scaled = host_floats(n);
    for (size_t i = 0; i < n; i++) scaled[i] = grad[i] * 1024.0f;
    memcpy(wd_w, w, bytes), memcpy(wd_m, m, bytes);
    memcpy(no_w, w, bytes), memcpy(no_m, m, bytes);
    memcpy(mk_w, w, bytes), memcpy(mk_m, m, bytes);
    sgd_step_mixed_cpu(wd_w, scaled, wd_m, n, &lr, &scaler, p);
    sgd_step_mixed_cpu(no_w, scaled, no_m, n, &lr, &scaler, none);
    sgd_step_mixed_cpu(mk_w, scaled, mk_m, n, &lr, &scaler, masked);
    select_floats(mask, wd_w, no_w, want_w, n);
    select_floats(mask, wd_m, no_m, want_m, n);
    CHECK_MSG(!memcmp(mk_w, want_w, bytes) && !memcmp(mk_m, want_m, bytes),
              "sgd_step_mixed_cpu with a decay mask is not the decayed/undecayed step per element");
    void *host[] = {w, m, grad, mask, wd_w, wd_m, no_w, no_m, mk_w, mk_m, want_w, want_m, scaled};
    host_free_all(host, GRID_COUNT(host));
}

static void sgd_case(const GridCase *c) {
    int gpu = c->device == DEVICE_CUDA;
    DType own_copy = gpu && c->dtype != DTYPE_F32 ? c->dtype : DTYPE_F32; /* the trainer's: none for f32 */
    if (gpu) {
        sgd_mixed(c, DTYPE_F16, 1, nesterov);
        sgd_mixed(c, DTYPE_BF16, 1, plain);
    } else {
        sgd_mixed(c, DTYPE_F32, 1, nesterov);
    }
    sgd_mixed(c, DTYPE_F32, 1, no_momentum); /* no half copy */
    sgd_mixed(c, own_copy, 0, plain);       /* no scaler */
    if (c->dtype == DTYPE_F32) sgd_mixed(c, DTYPE_F32, 0, nesterov);
    if (gpu && c->dtype == DTYPE_F32) {
        sgd_plain_gpu(c, 1000003, plain, 0);
        sgd_plain_gpu(c, 1000003, nesterov, 0);
        sgd_plain_gpu(c, 1000003, no_momentum, 0);
        sgd_plain_gpu(c, 7, (SgdParams){.momentum = 0.5f, .weight_decay = 0.1f, .nesterov = 0}, 0);
        sgd_plain_gpu(c, 1000003, nesterov, 1);
        sgd_plain_gpu(c, 7, (SgdParams){.momentum = 0.85f, .weight_decay = 1.36f, .nesterov = 1}, 1);
#if TRAINC_CUDA
        sgd_mask_gpu(c, 1000003, (SgdParams){.momentum = 0.9f, .weight_decay = 5e-2f, .nesterov = 1});
        sgd_mask_gpu(c, 7, (SgdParams){.momentum = 0.0f, .weight_decay = 1e-1f, .nesterov = 0});
#endif
    }
}

/* ---- PyTorch's semantics (CPU) -------------------------------------------------- */

static void sgd_by_hand(void) {
    float w[2] = {1, -2}, g[2] = {0.5f, 0.25f}, m[2] = {0, 0.5f}, lr = 0.1f;
    SgdParams p = {.momentum = 0.9f, .weight_decay = 0.1f, .nesterov = 0};
    sgd_step_cpu(w, g, m, 2, &lr, p);
    /* g' = g + 0.1 w = {0.6, 0.05}; m = 0.9 m + g' = {0.6, 0.5}; w -= 0.1 m */
    check_values("sgd w", w, (double[]){0.94, -2.05}, 2, 1e-6);
    check_values("sgd m", m, (double[]){0.6, 0.5}, 2, 1e-6);
    float wn[2] = {1, -2}, mn[2] = {0, 0.5f};
    p.nesterov = 1;
    sgd_step_cpu(wn, g, mn, 2, &lr, p);
    /* d = g' + 0.9 m = {1.14, 0.5} */
    check_values("sgd w (nesterov)", wn, (double[]){0.886, -2.05}, 2, 1e-6);
    check_values("sgd m (nesterov)", mn, (double[]){0.6, 0.5}, 2, 1e-6);
}

/* torch.optim.SGD's single-tensor step (dampening 0), written from its
 * documented algorithm, in double: on the first step the momentum buffer is
 * the gradient itself; with momentum 0 there is no buffer at all. */
static void torch_sgd_step(double *p, const double *grad, double *buf, size_t n, double lr, double momentum,
                           double weight_decay, int nesterov, int first_step) {
    for (size_t i = 0; i < n; i++) {
        double d_p = grad[i];
        if (weight_decay != 0) d_p += weight_decay * p[i];
        if (momentum != 0) {
            buf[i] = first_step ? d_p : momentum * buf[i] + d_p;
            d_p = nesterov ? d_p + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * d_p;
    }
}

static void sgd_against_torch(uint64_t *rng, float momentum, float weight_decay, int nesterov) {
    size_t n = 1000;
    const float lrs[5] = {0.1f, 0.05f, 0.2f, 0.01f, 0.1f}; /* a schedule, through the pointer */
    float *w = host_floats(n), *m = host_floats(n), *g = host_floats(n);
    double *pw = malloc(sizeof(double) * n), *pbuf = calloc(n, sizeof(double)), *pg = malloc(sizeof(double) * n);
    test_fill_uniform(w, n, rng, -1, 1);
    for (size_t i = 0; i < n; i++) pw[i] = w[i];
    SgdParams p = {.momentum = momentum, .weight_decay = weight_decay, .nesterov = nesterov};
    for (int step = 0; step < 5; step++) {
        test_fill_uniform(g, n, rng, -1, 1);
        for (size_t i = 0; i < n; i++) pg[i] = g[i];
        float lr = lrs[step];
        sgd_step_cpu(w, g, m, n, &lr, p);
        torch_sgd_step(pw, pg, pbuf, n, lrs[step], momentum, weight_decay, nesterov, step == 0);
    }
    char what[120];
    snprintf(what, sizeof what, "sgd momentum %g wd %g nesterov %d: w", momentum, weight_decay, nesterov);
    check_rel_l2(what, w, pw, n, 1e-6);
    if (momentum != 0) {
        snprintf(what, sizeof what, "sgd momentum %g wd %g nesterov %d: m", momentum, weight_decay, nesterov);
        check_rel_l2(what, m, pbuf, n, 1e-5);
    }
    free(w), free(m), free(g), free(pw), free(pbuf), free(pg);
}

/* The mixed step without a scaler, at scale 1, and on gradients scaled by a
 * power of two is sgd_step_cpu bit for bit; found_inf moves nothing. */
static void sgd_mixed_is_plain(uint64_t *rng, SgdParams p) {
    size_t n = 1001, bytes = n * sizeof(float);
    float lr = 0.05f;
    float *w = host_floats(n), *m = host_floats(n), *g = host_floats(n);
    test_fill_uniform(w, n, rng, -1, 1);
    test_fill_uniform(m, n, rng, -0.1f, 0.1f);
    test_fill_uniform(g, n, rng, -1, 1);
    float *w_plain = copy_floats(w, n), *m_plain = copy_floats(m, n);
    float *w_mixed = copy_floats(w, n), *m_mixed = copy_floats(m, n);
    sgd_step_cpu(w_plain, g, m_plain, n, &lr, p);
    sgd_step_mixed_cpu(w_mixed, g, m_mixed, n, &lr, NULL, p);
    CHECK_MSG(!memcmp(w_mixed, w_plain, bytes) && !memcmp(m_mixed, m_plain, bytes),
              "sgd_step_mixed_cpu without a scaler differs from sgd_step_cpu");
    LossScalerState one = loss_scaler_initial(1.0f);
    memcpy(w_mixed, w, bytes), memcpy(m_mixed, m, bytes);
    sgd_step_mixed_cpu(w_mixed, g, m_mixed, n, &lr, &one, p);
    CHECK_MSG(!memcmp(w_mixed, w_plain, bytes) && !memcmp(m_mixed, m_plain, bytes),
              "sgd_step_mixed_cpu at scale 1 differs from sgd_step_cpu");
    LossScalerState scaled = loss_scaler_initial(65536.0f);
    float *g_scaled = host_floats(n);
    for (size_t i = 0; i < n; i++) g_scaled[i] = g[i] * 65536.0f;
    memcpy(w_mixed, w, bytes), memcpy(m_mixed, m, bytes);
    sgd_step_mixed_cpu(w_mixed, g_scaled, m_mixed, n, &lr, &scaled, p);
    CHECK_MSG(!memcmp(w_mixed, w_plain, bytes) && !memcmp(m_mixed, m_plain, bytes),
              "sgd_step_mixed_cpu at scale 65536 does not unscale exactly");
    scaled.found_inf = 1;
    memcpy(w_mixed, w, bytes), memcpy(m_mixed, m, bytes);
    g_scaled[n / 2] = INFINITY;
    sgd_step_mixed_cpu(w_mixed, g_scaled, m_mixed, n, &lr, &scaled, p);
    CHECK_MSG(!memcmp(w_mixed, w, bytes) && !memcmp(m_mixed, m, bytes),
              "sgd_step_mixed_cpu moved weights or momentum on a skipped step");
    void *host[] = {w, m, g, w_plain, m_plain, w_mixed, m_mixed, g_scaled};
    host_free_all(host, GRID_COUNT(host));
}

/* lr_scale: each parameter steps as torch.optim.SGD's parameter group of lr
 * s * lr and weight_decay wd / s (torch_airbench's groups); s = 0 moves
 * nothing; all ones is the step without lr_scale bit for bit. */
static void sgd_lr_scale(uint64_t *rng) {
    enum { N = 400 };
    float momentum = 0.85f, wd = 1.36f;
    float *w = host_floats(N), *m = host_floats(N), *g = host_floats(N), *share = grid_random_shares(rng, N);
    double pw[N], pbuf[N] = {0}, pg[N];
    test_fill_uniform(w, N, rng, -1, 1);
    for (int i = 0; i < N; i++) pw[i] = w[i];
    float *w0 = copy_floats(w, N);
    SgdParams p = {.momentum = momentum, .weight_decay = wd, .nesterov = 1, .lr_scale = share};
    const float lrs[3] = {1e-3f, 2e-3f, 5e-4f};
    for (int step = 0; step < 3; step++) {
        test_fill_uniform(g, N, rng, -1, 1);
        for (int i = 0; i < N; i++) pg[i] = g[i];
        sgd_step_cpu(w, g, m, N, &lrs[step], p);
        for (int i = 0; i < N; i++)
            if (share[i] != 0.0f)
                torch_sgd_step(&pw[i], &pg[i], &pbuf[i], 1, (double)lrs[step] * share[i], momentum, wd / share[i], 1,
                               step == 0);
    }
    check_rel_l2("sgd lr_scale: w as torch's groups", w, pw, N, 1e-6);
    for (int i = 0; i < N; i++)
        CHECK_MSG(share[i] != 0.0f || (w[i] == w0[i] && m[i] == 0.0f), "sgd lr_scale 0 moved parameter %d", i);
    float *ones = host_floats(N), *w_one = copy_floats(w0, N), *m_one = host_floats(N);
    float *w_none = copy_floats(w0, N), *m_none = host_floats(N);
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    SgdParams with_ones = p, without = p;
    with_ones.lr_scale = ones;
    without.lr_scale = NULL;
    sgd_step_cpu(w_one, g, m_one, N, &lrs[0], with_ones);
    sgd_step_cpu(w_none, g, m_none, N, &lrs[0], without);
    CHECK_MSG(!memcmp(w_one, w_none, N * sizeof(float)) && !memcmp(m_one, m_none, N * sizeof(float)),
              "sgd lr_scale of ones differs from none");
    void *host[] = {w, m, g, share, w0, ones, w_one, m_one, w_none, m_none};
    host_free_all(host, GRID_COUNT(host));
}

static void sgd_semantics(uint64_t *rng) {
    sgd_lr_scale(rng);
    sgd_by_hand();
    sgd_against_torch(rng, 0.9f, 0.0f, 0);
    sgd_against_torch(rng, 0.9f, 5e-4f, 0);
    sgd_against_torch(rng, 0.9f, 5e-4f, 1);
    sgd_against_torch(rng, 0.5f, 0.1f, 1);
    sgd_against_torch(rng, 0.0f, 1e-2f, 0);
    sgd_against_torch(rng, 0.0f, 0.0f, 0);
    sgd_mixed_is_plain(rng, nesterov);
    sgd_mixed_is_plain(rng, plain);
    sgd_mixed_is_plain(rng, no_momentum);
    sgd_mask_cpu(rng, (SgdParams){.momentum = 0.9f, .weight_decay = 5e-2f, .nesterov = 1});
    sgd_mask_cpu(rng, (SgdParams){.momentum = 0.0f, .weight_decay = 1e-1f, .nesterov = 0});
}

const GridOp grid_op_sgd = {
    .name = "sgd",
    .run = sgd_case,
    .extras = sgd_semantics,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (flat parameter buffers have no layout)",
};
