/* Batch norm (ops/batchnorm.h) through its face; fused: batch norm + ReLU
 * (c->fused 1) or + GELU (2), c->fused being the BatchNormAct.
 * Every case: the training forward (y, saved and running statistics), the same
 * bits again with momentum 0 leaving the running statistics alone, evaluation
 * from the running statistics, and the backward (dx overwritten and
 * accumulated, dgamma and dbeta added onto random start values, dx NULL giving
 * the same parameter gradients) against the CPU reference; synchronized batch
 * norm over two ranks simulated in one process (each with half of the batch)
 * against the whole batch, and over one process against the plain calls. On
 * the CPU: every gradient by finite differences, the accumulate flags to the
 * bit. On the GPU: the parameter gradients into f32 buffers under half data,
 * layers sharing one scratch buffer, and calls captured in a CUDA graph giving
 * the eager calls' bits. Extras: values by hand, the statistics against sums in
 * double (PyTorch's unbiased running variance), eval against its formula, the
 * fused forward as relu(bn(x)) to the bit and as gelu(bn(x)) within rounding.
 * A max-pool in the norm's pass (BatchNormParams.pool) against the two apart. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/batchnorm.h"
#include "ops/gelu.h"
#include "ops/maxpool.h"
#include "ops/relu.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

#define BN_EPS 1e-5f
/* The old GPU tests' bounds (H100, H200): y and the parameter gradients within
 * a few fp32 roundings, dx within a few more (it cancels); halves rounded once. */
static const GridBound BN_Y = {1e-5, 3e-3, 1e-2};
static const GridBound BN_DX = {2e-5, 3e-3, 1e-2};
/* The statistics are fp32 in every dtype. */
#define BN_STATS 1e-5

static size_t bn_numel(const BatchNormShape *s) { return (size_t)s->n * s->c * s->h * s->w; }

static float *bn_uniform(uint64_t *rng, size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, rng, lo, hi);
    return p;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* x with a random offset and scale per channel, so each channel has its own
 * mean and variance for the normalization to remove. */
static float *bn_input(uint64_t *rng, const BatchNormShape *s, float offset, float spread) {
    size_t plane = (size_t)s->h * s->w;
    float *x = host_floats(bn_numel(s));
    for (int c = 0; c < s->c; c++) {
        float shift = test_uniform(rng, -offset, offset), scale = test_uniform(rng, 0.5f, 2.0f);
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++)
                x[((size_t)i * s->c + c) * plane + p] = shift + scale * test_uniform(rng, -spread, spread);
    }
    return x;
}

/* bn_input with each channel's values set to a standard deviation of 1
 * about their mean: a channel of few values drawn close together would make
 * its 1/std large, the finite differences' step of 1e-2 too coarse for it
 * (5x2x1x1: 5 values) and y's variance, tiny, a matter of y's rounding next
 * to beta (2x5x1x1: 2 values about 3e-6 apart). */
static float *bn_input_spread(uint64_t *rng, const BatchNormShape *s, float offset) {
    float *x = bn_input(rng, s, offset, 1.0f);
    size_t plane = (size_t)s->h * s->w;
    for (int c = 0; c < s->c; c++) {
        double sum = 0, sq = 0, m = (double)s->n * plane;
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++) sum += x[((size_t)i * s->c + c) * plane + p];
        double mean = sum / m;
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++) {
                double d = x[((size_t)i * s->c + c) * plane + p] - mean;
                sq += d * d;
            }
        double std = sqrt(sq / m);
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++) {
                float *v = &x[((size_t)i * s->c + c) * plane + p];
                *v = (float)(mean + (*v - mean) / std);
            }
    }
    return x;
}

/* ---- the CPU reference, plain or fused ------------------------------------------- */

static BatchNormAct bn_act(const GridCase *c) { return (BatchNormAct)c->fused; }

static void ref_forward_train(const BatchNormShape *s, BatchNormAct act, const float *x, const float *gamma,
                              const float *beta, float momentum, float *rmean, float *rvar, float *smean,
                              float *sinv, float *y) {
    if (act) batchnorm_act_forward_train_cpu(s, act, x, gamma, beta, momentum, BN_EPS, rmean, rvar, smean, sinv, y);
    else batchnorm_forward_train_cpu(s, x, gamma, beta, momentum, BN_EPS, rmean, rvar, smean, sinv, y);
}

static void ref_backward(const BatchNormShape *s, BatchNormAct act, const float *x, const float *y, const float *dy,
                         const float *gamma, const float *beta, const float *smean, const float *sinv, float *dx,
                         int accumulate, float *dgamma, float *dbeta) {
    if (act) batchnorm_act_backward_cpu(s, act, x, y, dy, gamma, beta, smean, sinv, dx, accumulate, dgamma, dbeta);
    else batchnorm_backward_cpu(s, x, dy, gamma, smean, sinv, dx, accumulate, dgamma, dbeta);
}

/* ---- one layer on c's device ------------------------------------------------------- */

typedef struct {
    BatchNorm bn;
    void *scratch; /* its own (GPU), or NULL */
} BnLayer;

/* shared: the scratch to use (NULL: one of its own). */
static BnLayer bn_layer(const GridCase *c, const BatchNormShape *s, void *shared) {
    BnLayer l = {0};
    size_t bytes = batchnorm_scratch_bytes(&c->ctx, s);
    if (bytes && !shared) l.scratch = dev_bytes(bytes);
    batchnorm_init(&c->ctx, &l.bn, s, shared ? shared : l.scratch);
    return l;
}

static void bn_layer_free(const GridCase *c, BnLayer *l) {
    batchnorm_destroy(&c->ctx, &l->bn);
    grid_free(c, l->scratch);
}

/* Host NCHW values to c's device in c's layout and dtype, and back. */
static void *bn_put(const GridCase *c, const BatchNormShape *s, const float *nchw) {
    float *t = grid_to_layout(c, nchw, s->n, s->c, s->h, s->w);
    void *d = grid_put(c, c->dtype, t, bn_numel(s));
    free(t);
    return d;
}

static void bn_set(const GridCase *c, const BatchNormShape *s, void *d, const float *nchw) {
    float *t = grid_to_layout(c, nchw, s->n, s->c, s->h, s->w);
    grid_set(c, c->dtype, d, t, bn_numel(s));
    free(t);
}

static float *bn_get(const GridCase *c, const BatchNormShape *s, const void *d) {
    float *t = grid_get(c, c->dtype, d, bn_numel(s));
    float *u = grid_from_layout(c, t, s->n, s->c, s->h, s->w);
    free(t);
    return u;
}

static float *stats_get(const GridCase *c, const float *d, int n) { return grid_get(c, DTYPE_F32, d, n); }

static double rms(const float *x, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return n ? sqrt(sum / n) : 0;
}

/* ---- the face against the reference ----------------------------------------------- */

/* The inputs of one layer and its fp32 buffers on c's device. */
typedef struct {
    BatchNormShape s;
    float *x, *dy, *gamma, *beta, *rmean0, *rvar0;                /* host, NCHW */
    void *d_x, *d_dy, *d_y, *d_dx;                                /* c's dtype and layout */
    float *d_gamma, *d_beta, *d_rmean, *d_rvar, *d_smean, *d_sinv; /* fp32 */
} BnSetup;

static BnSetup bn_setup(const GridCase *c, BatchNormShape s, float offset) {
    BnSetup b = {.s = s};
    size_t nx = bn_numel(&s);
    b.x = bn_input(c->rng, &s, offset, 1.0f);
    round_to(c->dtype, b.x, nx);
    b.dy = grid_random(c, c->dtype, nx, -1, 1);
    b.gamma = grid_random(c, DTYPE_F32, s.c, 0.5f, 1.5f), b.beta = grid_random(c, DTYPE_F32, s.c, -1, 1);
    b.rmean0 = grid_random(c, DTYPE_F32, s.c, -1, 1), b.rvar0 = grid_random(c, DTYPE_F32, s.c, 0.5f, 2);
    b.d_x = bn_put(c, &s, b.x), b.d_dy = bn_put(c, &s, b.dy);
    b.d_y = grid_alloc(c, c->dtype, nx), b.d_dx = grid_alloc(c, c->dtype, nx);
    b.d_gamma = grid_put(c, DTYPE_F32, b.gamma, s.c), b.d_beta = grid_put(c, DTYPE_F32, b.beta, s.c);
    b.d_rmean = grid_put(c, DTYPE_F32, b.rmean0, s.c), b.d_rvar = grid_put(c, DTYPE_F32, b.rvar0, s.c);
    b.d_smean = grid_alloc(c, DTYPE_F32, s.c), b.d_sinv = grid_alloc(c, DTYPE_F32, s.c);
    return b;
}

static void bn_setup_free(const GridCase *c, BnSetup *b) {
    void *dev[] = {b->d_x, b->d_dy, b->d_y, b->d_dx, b->d_gamma, b->d_beta, b->d_rmean, b->d_rvar, b->d_smean,
                   b->d_sinv};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {b->x, b->dy, b->gamma, b->beta, b->rmean0, b->rvar0};
    host_free_all(host, GRID_COUNT(host));
}

static BatchNormParams bn_params(const BnSetup *b, float momentum) {
    BatchNormParams p = {.gamma = b->d_gamma, .beta = b->d_beta, .running_mean = b->d_rmean,
                         .running_var = b->d_rvar, .save_mean = b->d_smean, .save_invstd = b->d_sinv,
                         .momentum = momentum, .eps = BN_EPS};
    return p;
}

/* The activation after the norm, in double, rounded once. */
static float ref_activation(BatchNormAct act, double v) {
    if (act == BN_ACT_RELU) return v < 0 ? 0.0f : (float)v;
    if (act == BN_ACT_GELU) return (float)(0.5 * v * (1.0 + erf(v / sqrt(2.0))));
    return (float)v;
}

/* A residual added before the activation (BatchNormParams.residual, a block's
 * add and ReLU in the norm's pass): the training y with momentum 0 against
 * the reference's act(bn(x) + residual). */
static void bn_check_residual(const GridCase *c, const BnLayer *l, BnSetup *b, BatchNormAct act) {
    const BatchNormShape *s = &b->s;
    size_t nx = bn_numel(s);
    float *r = grid_random(c, c->dtype, nx, -2, 2), *want = host_floats(nx);
    ref_forward_train(s, BN_ACT_NONE, b->x, b->gamma, b->beta, 0.0f, NULL, NULL, NULL, NULL, want);
    for (size_t i = 0; i < nx; i++) want[i] = ref_activation(act, (double)want[i] + r[i]);
    void *d_r = bn_put(c, s, r);
    BatchNormParams p = bn_params(b, 0.0f);
    p.residual = d_r;
    batchnorm_forward(&c->ctx, &l->bn, BN_TRAIN, act, &p, b->d_x, b->d_y);
    float *got = bn_get(c, s, b->d_y);
    grid_check(c, "bn train y with a residual before the activation", got, want, nx, grid_bound(c, BN_Y));
    grid_free(c, d_r);
    void *host[] = {r, want, got};
    host_free_all(host, GRID_COUNT(host));
}

/* BatchNormParams.pool: the norm's pass with a max-pool after it (window k,
 * stride 2, padding pad) in each forward mode, where the device takes it,
 * against the norm and then the pool on the same device, to the bit: the
 * pooled y, and through the pool's backward from the same dy the window
 * positions it kept. The training one also against the CPU reference. */
static void bn_check_pool(const GridCase *c, const BnLayer *l, BnSetup *b, BatchNormAct act, int k, int pad) {
    const BatchNormShape *s = &b->s;
    Pool2dShape ps = {s->n, s->c, s->h, s->w, k, 2, pad};
    if (act == BN_ACT_GELU || !batchnorm_pool_supported(&c->ctx, &ps)) return;
    int oh = pool2d_out_h(&ps), ow = pool2d_out_w(&ps);
    size_t nx = bn_numel(s), ny = (size_t)s->n * s->c * oh * ow, bytes = maxpool_scratch_bytes(&c->ctx, &ps);
    MaxPool2d pool[2];
    void *scratch[2], *d_pooled[2], *d_dx[2];
    float *dpool = grid_random(c, c->dtype, ny, -1, 1);
    void *d_dpool = grid_put(c, c->dtype, dpool, ny);
    for (int j = 0; j < 2; j++) {
        scratch[j] = bytes ? dev_bytes(bytes) : NULL;
        maxpool_init(&c->ctx, &pool[j], &ps, scratch[j]);
        d_pooled[j] = grid_alloc(c, c->dtype, ny), d_dx[j] = grid_alloc(c, c->dtype, nx);
    }
    const BatchNormMode modes[] = {BN_TRAIN, BN_TRAIN_SAVED, BN_EVAL};
    const char *names[] = {"train", "saved-statistics", "eval"};
    for (int i = 0; i < 3; i++) {
        BatchNormParams p = bn_params(b, 0.0f);
        batchnorm_forward(&c->ctx, &l->bn, modes[i], act, &p, b->d_x, b->d_y);
        maxpool_forward(&c->ctx, &pool[0], b->d_y, d_pooled[0]);
        grid_poison(c, c->dtype, d_pooled[1], ny);
        p.pool = &pool[1];
        batchnorm_forward(&c->ctx, &l->bn, modes[i], act, &p, b->d_x, d_pooled[1]);
        for (int j = 0; j < 2; j++) maxpool_backward(&c->ctx, &pool[j], b->d_y, d_pooled[j], d_dpool, d_dx[j]);
        float *apart = grid_get(c, c->dtype, d_pooled[0], ny), *together = grid_get(c, c->dtype, d_pooled[1], ny);
        float *dx_apart = grid_get(c, c->dtype, d_dx[0], nx), *dx_together = grid_get(c, c->dtype, d_dx[1], nx);
        char what[96];
        snprintf(what, sizeof what, "bn %s y %dx%d-pooled in the norm's pass", names[i], k, k);
        grid_check_same(c, what, together, apart, ny * sizeof(float));
        snprintf(what, sizeof what, "bn %s: the pool's dx from the positions it kept", names[i]);
        grid_check_same(c, what, dx_together, dx_apart, nx * sizeof(float));
        if (modes[i] == BN_TRAIN) {
            float *y = host_floats(nx), *want = host_floats(ny);
            ref_forward_train(s, act, b->x, b->gamma, b->beta, 0.0f, NULL, NULL, NULL, NULL, y);
            maxpool_forward_cpu(&ps, y, want);
            float *got = grid_from_layout(c, together, s->n, s->c, oh, ow);
            grid_check(c, "bn train y pooled in the norm's pass, against the CPU", got, want, ny,
                       grid_bound(c, BN_Y));
            free(y), free(want), free(got);
        }
        free(apart), free(together), free(dx_apart), free(dx_together);
    }
    for (int j = 0; j < 2; j++) {
        maxpool_destroy(&c->ctx, &pool[j]);
        grid_free(c, scratch[j]), grid_free(c, d_pooled[j]), grid_free(c, d_dx[j]);
    }
    grid_free(c, d_dpool);
    free(dpool);
}

/* Training forward, again with momentum 0, then eval from the running
 * statistics the first call left. Returns the device's training y (NCHW) and
 * in smean, sinv the saved statistics the backward takes on both sides: the
 * reference's, or with ReLU the device's own, from which the GPU's backward
 * recomputes y's mask (the reference reads the returned y). */
static float *bn_check_forward(const GridCase *c, const BnLayer *l, BnSetup *b, float *smean, float *sinv) {
    const BatchNormShape *s = &b->s;
    size_t nx = bn_numel(s);
    BatchNormAct act = bn_act(c);
    float *y = host_floats(nx), *rmean = copy_floats(b->rmean0, s->c), *rvar = copy_floats(b->rvar0, s->c);
    ref_forward_train(s, act, b->x, b->gamma, b->beta, 0.1f, rmean, rvar, smean, sinv, y);
    BatchNormParams p = bn_params(b, 0.1f);
    batchnorm_forward(&c->ctx, &l->bn, BN_TRAIN, act, &p, b->d_x, b->d_y);
    float *gy = bn_get(c, s, b->d_y), *gsmean = stats_get(c, b->d_smean, s->c), *gsinv = stats_get(c, b->d_sinv, s->c);
    float *grmean = stats_get(c, b->d_rmean, s->c), *grvar = stats_get(c, b->d_rvar, s->c);
    grid_check(c, "bn train y", gy, y, nx, grid_bound(c, BN_Y));
    grid_check(c, "bn save_mean", gsmean, smean, s->c, BN_STATS);
    grid_check(c, "bn save_invstd", gsinv, sinv, s->c, BN_STATS);
    grid_check(c, "bn running_mean", grmean, rmean, s->c, BN_STATS);
    grid_check(c, "bn running_var (unbiased)", grvar, rvar, s->c, BN_STATS);
    if (act == BN_ACT_RELU) {
        memcpy(smean, gsmean, s->c * sizeof(float));
        memcpy(sinv, gsinv, s->c * sizeof(float));
    }

    /* the same bits again; momentum 0 leaves the running statistics alone */
    grid_poison(c, c->dtype, b->d_y, nx);
    p.momentum = 0.0f;
    batchnorm_forward(&c->ctx, &l->bn, BN_TRAIN, act, &p, b->d_x, b->d_y);
    float *gy2 = bn_get(c, s, b->d_y), *gsinv2 = stats_get(c, b->d_sinv, s->c);
    float *grmean2 = stats_get(c, b->d_rmean, s->c), *grvar2 = stats_get(c, b->d_rvar, s->c);
    grid_check_same(c, "bn train y (second run)", gy2, gy, nx * sizeof(float));
    grid_check_same(c, "bn save_invstd (second run)", gsinv2, gsinv, s->c * sizeof(float));
    grid_check_same(c, "bn running_mean (momentum 0)", grmean2, grmean, s->c * sizeof(float));
    grid_check_same(c, "bn running_var (momentum 0)", grvar2, grvar, s->c * sizeof(float));

    /* BN_TRAIN_SAVED from the statistics just saved: the training y (the GPU's
     * bits, which its ReLU's backward relies on; the CPU's within rounding, its
     * scale from the rounded invstd) and the running statistics left alone */
    grid_poison(c, c->dtype, b->d_y, nx);
    p.momentum = 0.1f;
    batchnorm_forward(&c->ctx, &l->bn, BN_TRAIN_SAVED, act, &p, b->d_x, b->d_y);
    float *gys = bn_get(c, s, b->d_y), *grmean3 = stats_get(c, b->d_rmean, s->c);
    if (c->device == DEVICE_CPU) grid_check(c, "bn saved-statistics y", gys, gy, nx, grid_bound(c, BN_Y));
    else grid_check_same(c, "bn saved-statistics y (the training y's bits)", gys, gy, nx * sizeof(float));
    grid_check_same(c, "bn running_mean (saved statistics)", grmean3, grmean, s->c * sizeof(float));
    bn_check_residual(c, l, b, act);
    bn_check_pool(c, l, b, act, 3, 1); /* ResNet's stem: windows that overlap, padding */
    bn_check_pool(c, l, b, act, 2, 0); /* disjoint windows */

    /* eval, from the running statistics just computed */
    float *ye = host_floats(nx);
    if (act) batchnorm_act_forward_eval_cpu(s, act, b->x, b->gamma, b->beta, grmean, grvar, BN_EPS, ye);
    else batchnorm_forward_eval_cpu(s, b->x, b->gamma, b->beta, grmean, grvar, BN_EPS, ye);
    grid_poison(c, c->dtype, b->d_y, nx);
    batchnorm_forward(&c->ctx, &l->bn, BN_EVAL, act, &p, b->d_x, b->d_y);
    float *gye = bn_get(c, s, b->d_y);
    grid_check(c, "bn eval y", gye, ye, nx, grid_bound(c, BN_Y));
    void *host[] = {y, rmean, rvar, gsmean, gsinv, grmean, grvar, gy2, gsinv2, grmean2, grvar2, gys, grmean3, ye,
                    gye};
    host_free_all(host, GRID_COUNT(host));
    return gy;
}

/* The backward from the same saved statistics on both sides (bn_check_forward);
 * ReLU: the device's training y (gy) as the reference's mask, which the GPU
 * recomputes from x, bit for bit; GELU: y NULL (not needed). dx overwritten, then
 * added onto random values; dgamma and dbeta added onto random values, then a
 * second time; dx NULL: the same parameter gradients. */
static void bn_check_backward(const GridCase *c, const BnLayer *l, BnSetup *b, const float *smean, const float *sinv,
                              const float *gy) {
    const BatchNormShape *s = &b->s;
    DType dt = c->dtype;
    size_t nx = bn_numel(s);
    BatchNormAct act = bn_act(c);
    grid_set(c, DTYPE_F32, b->d_smean, smean, s->c);
    grid_set(c, DTYPE_F32, b->d_sinv, sinv, s->c);
    if (act == BN_ACT_RELU) bn_set(c, s, b->d_y, gy);
    void *d_y = act == BN_ACT_GELU ? NULL : b->d_y;
    float *dx = host_floats(nx), *dgamma0 = grid_random(c, dt, s->c, -1, 1), *dbeta0 = grid_random(c, dt, s->c, -1, 1);
    float *dgamma = copy_floats(dgamma0, s->c), *dbeta = copy_floats(dbeta0, s->c);
    ref_backward(s, act, b->x, gy, b->dy, b->gamma, b->beta, smean, sinv, dx, 0, dgamma, dbeta);
    /* the accumulator starts about the size of what is added, so overwriting shows */
    float size = (float)rms(dx, nx);
    float *dx_old = grid_random(c, dt, nx, -size, size), *dx_acc = host_floats(nx);
    for (size_t i = 0; i < nx; i++) dx_acc[i] = dx_old[i] + dx[i];
    float *dgamma_acc = host_floats(s->c), *dbeta_acc = host_floats(s->c);
    for (int k = 0; k < s->c; k++) {
        dgamma_acc[k] = dgamma[k] + (dgamma[k] - dgamma0[k]);
        dbeta_acc[k] = dbeta[k] + (dbeta[k] - dbeta0[k]);
    }
    BatchNormParams p = bn_params(b, 0.1f);
    void *d_dgamma = grid_put(c, dt, dgamma0, s->c), *d_dbeta = grid_put(c, dt, dbeta0, s->c);
    grid_poison(c, dt, b->d_dx, nx);
    batchnorm_backward(&c->ctx, &l->bn, BN_TRAIN, act, &p, b->d_x, d_y, b->d_dy, b->d_dx, 0, d_dgamma, d_dbeta);
    float *gdx = bn_get(c, s, b->d_dx), *gdgamma = grid_get(c, dt, d_dgamma, s->c), *gdbeta = grid_get(c, dt, d_dbeta, s->c);
    grid_check(c, "bn dx", gdx, dx, nx, grid_bound(c, BN_DX));
    grid_check(c, "bn dgamma (added to random)", gdgamma, dgamma, s->c, grid_bound(c, BN_Y));
    grid_check(c, "bn dbeta (added to random)", gdbeta, dbeta, s->c, grid_bound(c, BN_Y));

    bn_set(c, s, b->d_dx, dx_old);
    batchnorm_backward(&c->ctx, &l->bn, BN_TRAIN, act, &p, b->d_x, d_y, b->d_dy, b->d_dx, 1, d_dgamma, d_dbeta);
    float *gdx_acc = bn_get(c, s, b->d_dx), *gdgamma2 = grid_get(c, dt, d_dgamma, s->c);
    float *gdbeta2 = grid_get(c, dt, d_dbeta, s->c);
    grid_check(c, "bn dx (accumulate_dx onto random)", gdx_acc, dx_acc, nx, grid_bound(c, BN_DX));
    grid_check(c, "bn dgamma (added twice)", gdgamma2, dgamma_acc, s->c, grid_bound(c, BN_Y));
    grid_check(c, "bn dbeta (added twice)", gdbeta2, dbeta_acc, s->c, grid_bound(c, BN_Y));

    grid_set(c, dt, d_dgamma, dgamma0, s->c);
    grid_set(c, dt, d_dbeta, dbeta0, s->c);
    batchnorm_backward(&c->ctx, &l->bn, BN_TRAIN, act, &p, b->d_x, d_y, b->d_dy, NULL, 0, d_dgamma, d_dbeta);
    float *gdgamma3 = grid_get(c, dt, d_dgamma, s->c), *gdbeta3 = grid_get(c, dt, d_dbeta, s->c);
    grid_check_same(c, "bn dgamma (dx NULL, vs the first run)", gdgamma3, gdgamma, s->c * sizeof(float));
    grid_check_same(c, "bn dbeta (dx NULL, vs the first run)", gdbeta3, gdbeta, s->c * sizeof(float));

    void *dev[] = {d_dgamma, d_dbeta};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {dx, dgamma0, dbeta0, dgamma, dbeta, dx_old, dx_acc, dgamma_acc, dbeta_acc, gdx, gdgamma,
                    gdbeta, gdx_acc, gdgamma2, gdbeta2, gdgamma3, gdbeta3};
    host_free_all(host, GRID_COUNT(host));
}

/* The saved statistics onto the device, and dgamma and dbeta there, zeroed. */
static void bn_backward_buffers(const GridCase *c, BnSetup *b, const float *smean, const float *sinv,
                                void **d_dgamma, void **d_dbeta) {
    int channels = b->s.c;
    grid_set(c, DTYPE_F32, b->d_smean, smean, channels);
    grid_set(c, DTYPE_F32, b->d_sinv, sinv, channels);
    *d_dgamma = grid_alloc(c, c->dtype, channels), *d_dbeta = grid_alloc(c, c->dtype, channels);
    float *zeros = calloc(channels, sizeof(float));
    grid_set(c, c->dtype, *d_dgamma, zeros, channels);
    grid_set(c, c->dtype, *d_dbeta, zeros, channels);
    free(zeros);
}

/* BN_ACT_ADD_RELU (backward only): dy masked by the add's output y > 0 (y with
 * zeros, negatives and a NaN) and written over dy itself, then the plain
 * backward from it: the masked dy bit for bit, dx, dgamma and dbeta against
 * relu_backward_cpu, then the plain reference. */
static void bn_check_add_relu_backward(const GridCase *c, const BnLayer *l, BnSetup *b, const float *smean,
                                       const float *sinv) {
    const BatchNormShape *s = &b->s;
    DType dt = c->dtype;
    size_t nx = bn_numel(s);
    float *y = grid_random(c, dt, nx, -1, 1), *masked = host_floats(nx), *dx = host_floats(nx);
    for (size_t i = 0; i < nx; i += 5) y[i] = 0.0f;
    y[nx / 2] = NAN;
    float *dgamma = calloc(s->c, sizeof(float)), *dbeta = calloc(s->c, sizeof(float));
    relu_backward_cpu(y, b->dy, masked, nx);
    batchnorm_backward_cpu(s, b->x, masked, b->gamma, smean, sinv, dx, 0, dgamma, dbeta);

    void *d_y = bn_put(c, s, y), *d_g = bn_put(c, s, b->dy), *d_dgamma, *d_dbeta;
    bn_backward_buffers(c, b, smean, sinv, &d_dgamma, &d_dbeta);
    BatchNormParams p = bn_params(b, 0.1f);
    p.dy_masked = d_g;
    grid_poison(c, dt, b->d_dx, nx);
    batchnorm_backward(&c->ctx, &l->bn, BN_TRAIN, BN_ACT_ADD_RELU, &p, b->d_x, d_y, d_g, b->d_dx, 0, d_dgamma,
                       d_dbeta);
    float *gmasked = bn_get(c, s, d_g), *gdx = bn_get(c, s, b->d_dx);
    float *gdgamma = grid_get(c, dt, d_dgamma, s->c), *gdbeta = grid_get(c, dt, d_dbeta, s->c);
    grid_check_same(c, "bn add+relu: dy masked in place (relu_backward's bits)", gmasked, masked, nx * sizeof(float));
    grid_check(c, "bn add+relu dx", gdx, dx, nx, grid_bound(c, BN_DX));
    grid_check(c, "bn add+relu dgamma", gdgamma, dgamma, s->c, grid_bound(c, BN_Y));
    grid_check(c, "bn add+relu dbeta", gdbeta, dbeta, s->c, grid_bound(c, BN_Y));

    void *dev[] = {d_y, d_g, d_dgamma, d_dbeta};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {y, masked, dx, dgamma, dbeta, gmasked, gdx, gdgamma, gdbeta};
    host_free_all(host, GRID_COUNT(host));
}

/* BN_ACT_RELU's backward where a convolution's prologue applied the norm
 * (p->relu_coef, no y): dy masked where bn_prologue_input(x, scale, bias),
 * rounded to the dtype as the GPU compares it, is > 0, then the plain
 * backward. The scale and bias are drawn apart from the statistics: a mask
 * taken from those instead differs in a large share of the elements. */
static void bn_check_prologue_backward(const GridCase *c, const BnLayer *l, BnSetup *b, const float *smean,
                                       const float *sinv) {
    const BatchNormShape *s = &b->s;
    DType dt = c->dtype;
    size_t nx = bn_numel(s), plane = (size_t)s->h * s->w;
    float *coef = grid_random(c, dt, 2 * (size_t)s->c, -1, 1), *masked = host_floats(nx), *dx = host_floats(nx);
    for (size_t at = 0; at < nx; at++) {
        int ch = (int)(at / plane % s->c);
        float z = bn_prologue_input(b->x[at], coef[ch], coef[s->c + ch]);
        round_to(dt, &z, 1);
        masked[at] = z > 0.0f ? b->dy[at] : 0.0f;
    }
    float *dgamma = calloc(s->c, sizeof(float)), *dbeta = calloc(s->c, sizeof(float));
    batchnorm_backward_cpu(s, b->x, masked, b->gamma, smean, sinv, dx, 0, dgamma, dbeta);

    void *d_coef = grid_put(c, dt, coef, 2 * (size_t)s->c), *d_dgamma, *d_dbeta;
    bn_backward_buffers(c, b, smean, sinv, &d_dgamma, &d_dbeta);
    BatchNormParams p = bn_params(b, 0.1f);
    p.relu_coef = d_coef;
    grid_poison(c, dt, b->d_dx, nx);
    batchnorm_backward(&c->ctx, &l->bn, BN_TRAIN, BN_ACT_RELU, &p, b->d_x, NULL, b->d_dy, b->d_dx, 0, d_dgamma,
                       d_dbeta);
    float *gdx = bn_get(c, s, b->d_dx), *gdgamma = grid_get(c, dt, d_dgamma, s->c);
    float *gdbeta = grid_get(c, dt, d_dbeta, s->c);
    grid_check(c, "bn prologue's mask: dx", gdx, dx, nx, grid_bound(c, BN_DX));
    grid_check(c, "bn prologue's mask: dgamma", gdgamma, dgamma, s->c, grid_bound(c, BN_Y));
    grid_check(c, "bn prologue's mask: dbeta", gdbeta, dbeta, s->c, grid_bound(c, BN_Y));

    void *dev[] = {d_coef, d_dgamma, d_dbeta};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {coef, masked, dx, dgamma, dbeta, gdx, gdgamma, gdbeta};
    host_free_all(host, GRID_COUNT(host));
}

static void bn_shape(const GridCase *c, BatchNormShape s, float offset) {
    printf(" %dx%dx%dx%d (offset %g)\n", s.n, s.c, s.h, s.w, offset);
    BnSetup b = bn_setup(c, s, offset);
    BnLayer l = bn_layer(c, &s, NULL);
    float *smean = host_floats(s.c), *sinv = host_floats(s.c);
    float *gy = bn_check_forward(c, &l, &b, smean, sinv);
    bn_check_backward(c, &l, &b, smean, sinv, gy);
    if (!c->fused) bn_check_add_relu_backward(c, &l, &b, smean, sinv);
    if (bn_act(c) == BN_ACT_RELU) bn_check_prologue_backward(c, &l, &b, smean, sinv);
    bn_layer_free(c, &l);
    bn_setup_free(c, &b);
    free(smean), free(sinv), free(gy);
}

/* ---- synchronized: two ranks in one process ------------------------------------- */

/* A synchronized call runs twice on each half: pass 0 records the half's local
 * sums (and doubles them, as if the other half were the same: its outputs are
 * then reset or overwritten), pass 1 adds the other half's, as an all-reduce
 * over two ranks would (a + b on one, b + a on the other: the same bits). The
 * sums are on ctx's device. */
typedef struct {
    const OpContext *ctx;
    double *recorded[2];
    int n, rank, pass;
} FakeRanks;

static void fake_allreduce(void *p, double *sums, int n, cudaStream_t stream) {
    FakeRanks *f = p;
    size_t bytes = (size_t)n * sizeof(double);
    (void)stream; /* the context's */
    CHECK(n == f->n);
    double *host = host_bytes(bytes);
    op_copy_to_host(f->ctx, host, sums, bytes);
    op_sync(f->ctx);
    if (f->pass == 0) memcpy(f->recorded[f->rank], host, bytes);
    const double *other = f->recorded[f->pass == 0 ? f->rank : 1 - f->rank];
    for (int i = 0; i < n; i++) host[i] += other[i];
    op_copy_from_host(f->ctx, sums, host, bytes);
    op_sync(f->ctx);
    free(host);
}

/* One process: the sums stay as they are. p counts the calls. */
static void solo_allreduce(void *p, double *sums, int n, cudaStream_t stream) {
    (void)sums, (void)n, (void)stream;
    ++*(int *)p;
}

/* What one layer's forward and backward gave (host, NCHW). */
typedef struct {
    float *y, *mean, *invstd, *rmean, *rvar, *dx, *dgamma, *dbeta;
} BnOut;

static BnOut bn_out_new(size_t nx, int c, const float *rmean0, const float *rvar0) {
    BnOut o = {host_floats(nx), host_floats(c), host_floats(c), copy_floats(rmean0, c),
               copy_floats(rvar0, c), host_floats(nx), host_floats(c), host_floats(c)};
    return o;
}

static void bn_out_free(BnOut *o) {
    void *p[] = {o->y, o->mean, o->invstd, o->rmean, o->rvar, o->dx, o->dgamma, o->dbeta};
    host_free_all(p, GRID_COUNT(p));
}

/* [a | b]: two halves back to back (images are outermost). */
static float *joined(const float *a, const float *b, size_t half) {
    float *p = host_floats(2 * half);
    memcpy(p, a, half * sizeof(float));
    memcpy(p + half, b, half * sizeof(float));
    return p;
}

/* One rank's layer on c's device: x, the ReLU mask and dy in c's dtype and
 * layout, the parameter gradients in c's dtype. running 0: no running statistics. */
typedef struct {
    BatchNormShape s;
    BnLayer layer;
    void *x, *y, *mask, *dy, *dx, *dgamma, *dbeta;
    float *mean, *invstd, *rmean, *rvar;
} BnRank;

static BnRank bn_rank_new(const GridCase *c, const BatchNormShape *s, const float *x, const float *mask,
                          const float *dy, int running) {
    size_t nx = bn_numel(s);
    BnRank r = {*s, bn_layer(c, s, NULL), bn_put(c, s, x), grid_alloc(c, c->dtype, nx), bn_put(c, s, mask),
                bn_put(c, s, dy), grid_alloc(c, c->dtype, nx), grid_alloc(c, c->dtype, s->c),
                grid_alloc(c, c->dtype, s->c), grid_alloc(c, DTYPE_F32, s->c), grid_alloc(c, DTYPE_F32, s->c),
                running ? grid_alloc(c, DTYPE_F32, s->c) : NULL, running ? grid_alloc(c, DTYPE_F32, s->c) : NULL};
    return r;
}

static void bn_rank_free(const GridCase *c, BnRank *r) {
    bn_layer_free(c, &r->layer);
    void *p[] = {r->x, r->y, r->mask, r->dy, r->dx, r->dgamma, r->dbeta, r->mean, r->invstd, r->rmean, r->rvar};
    grid_free_all(c, p, GRID_COUNT(p));
}

/* Running statistics back to their start, outputs poisoned, gradients zeroed. */
static void bn_rank_reset(const GridCase *c, BnRank *r, const float *rmean0, const float *rvar0) {
    if (r->rmean) grid_set(c, DTYPE_F32, r->rmean, rmean0, r->s.c), grid_set(c, DTYPE_F32, r->rvar, rvar0, r->s.c);
    grid_poison(c, c->dtype, r->y, bn_numel(&r->s));
    grid_poison(c, c->dtype, r->dx, bn_numel(&r->s));
    op_fill(&c->ctx, r->dgamma, 0, r->s.c * dtype_size(c->dtype));
    op_fill(&c->ctx, r->dbeta, 0, r->s.c * dtype_size(c->dtype));
}

static BatchNormParams bn_rank_params(const BnRank *r, const float *d_gamma, const float *d_beta, BnAllreduce reduce,
                                      void *reduce_ctx) {
    BatchNormParams p = {.gamma = d_gamma, .beta = d_beta, .running_mean = r->rmean, .running_var = r->rvar,
                         .save_mean = r->mean, .save_invstd = r->invstd, .momentum = 0.1f, .eps = BN_EPS,
                         .reduce = reduce, .reduce_ctx = reduce_ctx};
    return p;
}

/* Training forward (synchronized where reduce is given), then backward with
 * the mask as the fused op's y; dx NULL skips dx. */
static void bn_rank_forward(const GridCase *c, BnRank *r, const BatchNormParams *p) {
    BatchNormMode mode = p->reduce ? BN_TRAIN_SYNC : BN_TRAIN;
    batchnorm_forward(&c->ctx, &r->layer.bn, mode, bn_act(c), p, r->x, r->y);
}

static void bn_rank_backward(const GridCase *c, BnRank *r, const BatchNormParams *p, void *dx) {
    BatchNormMode mode = p->reduce ? BN_TRAIN_SYNC : BN_TRAIN;
    batchnorm_backward(&c->ctx, &r->layer.bn, mode, bn_act(c), p, r->x, r->mask, r->dy, dx, 0, r->dgamma, r->dbeta);
}

static BnOut bn_rank_get(const GridCase *c, const BnRank *r) {
    const BatchNormShape *s = &r->s;
    BnOut o = {bn_get(c, s, r->y), stats_get(c, r->mean, s->c), stats_get(c, r->invstd, s->c),
               r->rmean ? stats_get(c, r->rmean, s->c) : host_floats(s->c),
               r->rvar ? stats_get(c, r->rvar, s->c) : host_floats(s->c), bn_get(c, s, r->dx),
               grid_get(c, c->dtype, r->dgamma, s->c), grid_get(c, c->dtype, r->dbeta, s->c)};
    return o;
}

/* dx against the reference's, relative to the size of gamma * invstd * dy
 * rather than to dx's own: with few elements per channel dx cancels to almost
 * nothing (with two it is zero in exact arithmetic) and only the terms'
 * rounding is left. */
static void check_dx_scaled(const GridCase *c, const char *what, const BatchNormShape *s, const float *got,
                            const float *want, const float *dy, const float *gamma, const float *invstd, double bound) {
    size_t plane = (size_t)s->h * s->w, n = bn_numel(s);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        int k = (int)(i / plane % (size_t)s->c);
        double term = (double)gamma[k] * invstd[k] * dy[i];
        diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        scale += term * term;
    }
    double err = scale > 0 ? sqrt(diff / scale) : sqrt(diff);
    printf("  %-20s %-52s err %.2e of |gamma invstd dy| (bound %.1e)\n", c->name, what, err, bound);
    CHECK_MSG(err <= bound, "%s %s: error %.3g of |gamma invstd dy| > %.3g", c->name, what, err, bound);
}

/* The CPU's plain calls on the whole batch, the mask (the ReLU's y) in c's dtype. */
static BnOut bn_whole_reference(const GridCase *c, const BatchNormShape *s, const float *x, const float *dy,
                                const float *gamma, const float *beta, const float *rmean0, const float *rvar0,
                                int running, float **mask) {
    size_t nx = bn_numel(s);
    BnOut w = bn_out_new(nx, s->c, rmean0, rvar0);
    ref_forward_train(s, bn_act(c), x, gamma, beta, 0.1f, running ? w.rmean : NULL, running ? w.rvar : NULL, w.mean,
                      w.invstd, w.y);
    *mask = copy_floats(w.y, nx);
    round_to(c->dtype, *mask, nx);
    ref_backward(s, bn_act(c), x, *mask, dy, gamma, beta, w.mean, w.invstd, w.dx, 0, w.dgamma, w.dbeta);
    return w;
}

/* Two ranks each with half of the batch against the whole batch's reference.
 * A rank's loss is the mean over its half, so its dy is 2x the whole batch's
 * for the same samples: its dx is 2x the whole's, and the parameter gradients
 * averaged over the ranks (DDP) are the whole's. With ReLU on the GPU, whose
 * backward recomputes its own forward's mask, the reference's backward is
 * taken again with the ranks' y as the mask: the two masks could differ where
 * y rounds to zero on one side only. */
static void bn_sync_two_ranks(const GridCase *c, const BatchNormShape *s, const float *x, const float *mask,
                              const float *dy, const float *d_gamma, const float *d_beta, const float *gamma,
                              const float *beta, const float *rmean0, const float *rvar0, int running,
                              const BnOut *whole_ref) {
    BatchNormShape h = *s;
    h.n = s->n / 2;
    size_t nx = bn_numel(s), nh = bn_numel(&h);
    int cpu = c->device == DEVICE_CPU;
    float *dy2 = host_floats(nx);
    for (size_t i = 0; i < nx; i++) dy2[i] = 2.0f * dy[i]; /* exact in every type */
    BnRank r[2];
    for (int k = 0; k < 2; k++) r[k] = bn_rank_new(c, &h, x + k * nh, mask + k * nh, dy2 + k * nh, running);
    FakeRanks f = {&c->ctx, {host_bytes(3 * sizeof(double) * s->c), host_bytes(3 * sizeof(double) * s->c)}, 3 * s->c,
                   0, 0};
    for (f.pass = 0; f.pass < 2; f.pass++)
        for (f.rank = 0; f.rank < 2; f.rank++) {
            bn_rank_reset(c, &r[f.rank], rmean0, rvar0);
            BatchNormParams p = bn_rank_params(&r[f.rank], d_gamma, d_beta, fake_allreduce, &f);
            bn_rank_forward(c, &r[f.rank], &p);
        }
    for (f.pass = 0; f.pass < 2; f.pass++)
        for (f.rank = 0; f.rank < 2; f.rank++) {
            op_fill(&c->ctx, r[f.rank].dgamma, 0, s->c * dtype_size(c->dtype));
            op_fill(&c->ctx, r[f.rank].dbeta, 0, s->c * dtype_size(c->dtype));
            BatchNormParams p = bn_rank_params(&r[f.rank], d_gamma, d_beta, fake_allreduce, &f);
            bn_rank_backward(c, &r[f.rank], &p, r[f.rank].dx);
        }
    BnOut got[2] = {bn_rank_get(c, &r[0]), bn_rank_get(c, &r[1])};
    float *y2 = joined(got[0].y, got[1].y, nh), *dx2 = joined(got[0].dx, got[1].dx, nh);
    BnOut remasked = bn_out_new(nx, s->c, rmean0, rvar0);
    const BnOut *whole = whole_ref;
    if (!cpu && bn_act(c) == BN_ACT_RELU) {
        memcpy(remasked.y, whole_ref->y, nx * sizeof(float));
        memcpy(remasked.mean, whole_ref->mean, s->c * sizeof(float));
        memcpy(remasked.invstd, whole_ref->invstd, s->c * sizeof(float));
        memcpy(remasked.rmean, whole_ref->rmean, s->c * sizeof(float));
        memcpy(remasked.rvar, whole_ref->rvar, s->c * sizeof(float));
        ref_backward(s, BN_ACT_RELU, x, y2, dy, gamma, beta, remasked.mean, remasked.invstd, remasked.dx, 0,
                     remasked.dgamma, remasked.dbeta);
        whole = &remasked;
    }
    float *dgamma2 = host_floats(s->c), *dbeta2 = host_floats(s->c);
    for (size_t i = 0; i < nx; i++) dx2[i] /= 2;
    for (int k = 0; k < s->c; k++) {
        dgamma2[k] = (got[0].dgamma[k] + got[1].dgamma[k]) / 2;
        dbeta2[k] = (got[0].dbeta[k] + got[1].dbeta[k]) / 2;
    }
    /* the CPU computes as the reference does (1e-6); the GPU as in bn_shape */
    double stats = cpu ? 1e-6 : BN_STATS, ybound = cpu ? 1e-6 : grid_bound(c, BN_Y);
    grid_check(c, "sync bn, two ranks: y (the whole batch's)", y2, whole->y, nx, ybound);
    grid_check(c, "  save_mean", got[0].mean, whole->mean, s->c, stats);
    grid_check(c, "  save_invstd", got[0].invstd, whole->invstd, s->c, stats);
    if (running) {
        grid_check(c, "  running_mean", got[0].rmean, whole->rmean, s->c, stats);
        grid_check(c, "  running_var (unbiased, global count)", got[0].rvar, whole->rvar, s->c, stats);
    }
    if (cpu) grid_check(c, "  dx / 2", dx2, whole->dx, nx, 1e-6);
    else check_dx_scaled(c, "  dx / 2", s, dx2, whole->dx, dy, gamma, whole->invstd, grid_bound(c, BN_DX));
    /* per-rank sums that cancel: measured against the size of their terms, |dy * xhat| and |dy| */
    double *size_gamma = calloc(2 * (size_t)s->c, sizeof(double)), *size_beta = size_gamma + s->c;
    size_t plane = (size_t)s->h * s->w;
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->c; k++)
            for (size_t q = 0; q < plane; q++) {
                size_t at = ((size_t)n * s->c + k) * plane + q;
                size_gamma[k] += fabs(dy[at] * (x[at] - whole->mean[k]) * whole->invstd[k]);
                size_beta[k] += fabs(dy[at]);
            }
    grid_check_sums(c, "  dgamma averaged over the ranks", dgamma2, whole->dgamma, size_gamma, s->c, ybound);
    grid_check_sums(c, "  dbeta averaged over the ranks", dbeta2, whole->dbeta, size_beta, s->c, ybound);
    free(size_gamma);
    CHECK_MSG(same_bits(got[0].mean, got[1].mean, s->c) && same_bits(got[0].invstd, got[1].invstd, s->c) &&
                  same_bits(got[0].rmean, got[1].rmean, s->c) && same_bits(got[0].rvar, got[1].rvar, s->c),
              "%s sync bn: the two ranks' statistics differ", c->name);

    /* each rank on its own statistics (where it has two values a channel): other y */
    if (h.n * h.h * h.w >= 2) {
        bn_rank_reset(c, &r[0], rmean0, rvar0);
        BatchNormParams p = bn_rank_params(&r[0], d_gamma, d_beta, NULL, NULL);
        bn_rank_forward(c, &r[0], &p);
        float *own = bn_get(c, &h, r[0].y);
        double err = test_rel_error(own, whole->y, nh);
        CHECK_MSG(err > 1e-3, "%s sync bn: per-rank statistics give y within %.3g of the whole batch's", c->name, err);
        free(own);
    }
    bn_out_free(&got[0]), bn_out_free(&got[1]), bn_out_free(&remasked);
    bn_rank_free(c, &r[0]), bn_rank_free(c, &r[1]);
    void *host[] = {dy2, f.recorded[0], f.recorded[1], y2, dx2, dgamma2, dbeta2};
    host_free_all(host, GRID_COUNT(host));
}

/* One process (the sums left alone): the plain calls on c's device, forward
 * within rounding, backward from the same saved statistics to the bit; two
 * reduce calls (dx NULL needs none). */
static void bn_sync_one_process(const GridCase *c, const BatchNormShape *s, const float *x, const float *mask,
                                const float *dy, const float *d_gamma, const float *d_beta, const float *rmean0,
                                const float *rvar0, int running) {
    size_t nx = bn_numel(s);
    int cpu = c->device == DEVICE_CPU, calls = 0;
    BnRank plain = bn_rank_new(c, s, x, mask, dy, running), solo = bn_rank_new(c, s, x, mask, dy, running);
    bn_rank_reset(c, &plain, rmean0, rvar0);
    bn_rank_reset(c, &solo, rmean0, rvar0);
    BatchNormParams pp = bn_rank_params(&plain, d_gamma, d_beta, NULL, NULL);
    BatchNormParams ps = bn_rank_params(&solo, d_gamma, d_beta, solo_allreduce, &calls);
    bn_rank_forward(c, &plain, &pp);
    bn_rank_forward(c, &solo, &ps);
    BnOut fwd = bn_rank_get(c, &solo);
    op_copy(&c->ctx, solo.mean, plain.mean, s->c * sizeof(float));
    op_copy(&c->ctx, solo.invstd, plain.invstd, s->c * sizeof(float));
    bn_rank_backward(c, &plain, &pp, plain.dx);
    bn_rank_backward(c, &solo, &ps, solo.dx);
    BnOut want = bn_rank_get(c, &plain), one = bn_rank_get(c, &solo);
    double stats = cpu ? 1e-6 : BN_STATS;
    grid_check(c, "sync bn, one process: y (the plain call's)", fwd.y, want.y, nx, cpu ? 1e-6 : grid_bound(c, BN_Y));
    grid_check(c, "  save_mean", fwd.mean, want.mean, s->c, stats);
    grid_check(c, "  save_invstd", fwd.invstd, want.invstd, s->c, stats);
    if (running) {
        grid_check(c, "  running_mean", fwd.rmean, want.rmean, s->c, stats);
        grid_check(c, "  running_var", fwd.rvar, want.rvar, s->c, stats);
    }
    CHECK_MSG(same_bits(one.dx, want.dx, nx) && same_bits(one.dgamma, want.dgamma, s->c) &&
                  same_bits(one.dbeta, want.dbeta, s->c),
              "%s sync bn, one process: backward differs from the plain one", c->name);
    bn_rank_backward(c, &solo, &ps, NULL);
    CHECK_MSG(calls == 2, "%s sync bn: %d reduce calls, want 2 (dx NULL needs none)", c->name, calls);
    bn_out_free(&fwd), bn_out_free(&want), bn_out_free(&one);
    bn_rank_free(c, &plain), bn_rank_free(c, &solo);
}

#if TRAINC_CUDA
static int bn_out_same_bits(const BnOut *a, const BnOut *b, size_t nx, int c) {
    return same_bits(a->y, b->y, nx) && same_bits(a->mean, b->mean, c) && same_bits(a->invstd, b->invstd, c) &&
           same_bits(a->rmean, b->rmean, c) && same_bits(a->rvar, b->rvar, c) && same_bits(a->dx, b->dx, nx) &&
           same_bits(a->dgamma, b->dgamma, c) && same_bits(a->dbeta, b->dbeta, c);
}

/* A reduce a CUDA graph can capture: the sums go to a side buffer and back on
 * the stream, poisoned in between. */
static void round_trip_allreduce(void *side, double *sums, int n, cudaStream_t stream) {
    size_t bytes = (size_t)n * sizeof(double);
    CUDA_CHECK(cudaMemcpyAsync(side, sums, bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemsetAsync(sums, 0xff, bytes, stream));
    CUDA_CHECK(cudaMemcpyAsync(sums, side, bytes, cudaMemcpyDeviceToDevice, stream));
}

/* A synchronized forward and backward captured as a CUDA graph, with a reduce
 * working on the stream, give the bits of the eager calls. */
static void bn_sync_graph(const GridCase *c, const BatchNormShape *s, const float *x, const float *mask,
                          const float *dy, const float *d_gamma, const float *d_beta, const float *rmean0,
                          const float *rvar0) {
    size_t nx = bn_numel(s);
    double *side = dev_bytes(3 * sizeof(double) * s->c);
    BnRank r = bn_rank_new(c, s, x, mask, dy, 1);
    BatchNormParams p = bn_rank_params(&r, d_gamma, d_beta, round_trip_allreduce, side);
    BnOut run[2] = {{NULL}, {NULL}};
    for (int graph = 0; graph < 2; graph++) {
        cudaGraph_t gr = NULL;
        cudaGraphExec_t exec = NULL;
        bn_rank_reset(c, &r, rmean0, rvar0);
        if (graph) CUDA_CHECK(cudaStreamBeginCapture(c->ctx.stream, cudaStreamCaptureModeGlobal));
        bn_rank_forward(c, &r, &p);
        bn_rank_backward(c, &r, &p, r.dx);
        if (graph) {
            CUDA_CHECK(cudaStreamEndCapture(c->ctx.stream, &gr));
            CUDA_CHECK(cudaGraphInstantiate(&exec, gr, 0));
            CUDA_CHECK(cudaGraphLaunch(exec, c->ctx.stream));
        }
        run[graph] = bn_rank_get(c, &r);
        if (graph) {
            CUDA_CHECK(cudaGraphExecDestroy(exec));
            CUDA_CHECK(cudaGraphDestroy(gr));
        }
    }
    CHECK_MSG(test_rel_error(run[0].y, run[0].y, nx) == 0 && test_rel_error(run[0].dx, run[0].dx, nx) == 0,
              "%s sync bn: NaN in y or dx (not written)", c->name);
    CHECK_MSG(bn_out_same_bits(&run[1], &run[0], nx, s->c), "%s sync bn: a CUDA graph gives other bits", c->name);
    bn_out_free(&run[0]), bn_out_free(&run[1]);
    bn_rank_free(c, &r);
    grid_free(c, side);
}
#endif

/* offset: the channels' means, in std units roughly; running 0: no running statistics. */
static void bn_sync(const GridCase *c, BatchNormShape s, float offset, int running) {
    printf(" synchronized %dx%dx%dx%d (offset %g%s)\n", s.n, s.c, s.h, s.w, offset,
           running ? "" : ", no running statistics");
    size_t nx = bn_numel(&s);
    float *x = bn_input(c->rng, &s, offset, 1.0f), *dy = grid_random(c, c->dtype, nx, -1, 1);
    round_to(c->dtype, x, nx);
    float *gamma = grid_random(c, DTYPE_F32, s.c, 0.5f, 1.5f), *beta = grid_random(c, DTYPE_F32, s.c, -1, 1);
    float *rmean0 = grid_random(c, DTYPE_F32, s.c, -1, 1), *rvar0 = grid_random(c, DTYPE_F32, s.c, 0.5f, 2);
    float *d_gamma = grid_put(c, DTYPE_F32, gamma, s.c), *d_beta = grid_put(c, DTYPE_F32, beta, s.c);
    float *mask;
    BnOut whole = bn_whole_reference(c, &s, x, dy, gamma, beta, rmean0, rvar0, running, &mask);
    bn_sync_two_ranks(c, &s, x, mask, dy, d_gamma, d_beta, gamma, beta, rmean0, rvar0, running, &whole);
    bn_sync_one_process(c, &s, x, mask, dy, d_gamma, d_beta, rmean0, rvar0, running);
#if TRAINC_CUDA
    if (c->device == DEVICE_CUDA) bn_sync_graph(c, &s, x, mask, dy, d_gamma, d_beta, rmean0, rvar0);
#endif
    bn_out_free(&whole);
    void *dev[] = {d_gamma, d_beta};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, gamma, beta, rmean0, rvar0, mask};
    host_free_all(host, GRID_COUNT(host));
}

/* ---- the CPU: finite differences ------------------------------------------------- */

typedef struct {
    BatchNormShape s;
    float *x, *gamma, *beta, *r, *y;
    BatchNormAct act;
} BnLoss;

/* The training forward's weighted sum; momentum 0 and no saved statistics. */
static double bn_loss(void *p) {
    BnLoss *b = p;
    ref_forward_train(&b->s, b->act, b->x, b->gamma, b->beta, 0.0f, NULL, NULL, NULL, NULL, b->y);
    return weighted_sum(b->y, b->r, bn_numel(&b->s));
}

/* Values whose normalized form stays at least ~0.2 standard deviations away
 * from zero, so that with beta = 0 no ReLU kink lies within a perturbation:
 * per channel, random magnitudes in [0.3, 1.5] with random signs, re-drawn
 * until their mean is within 0.1 of zero, then shifted by a channel offset. */
static float *bn_input_away_from_zero(uint64_t *rng, const BatchNormShape *s) {
    size_t plane = (size_t)s->h * s->w, m = (size_t)s->n * plane;
    float *x = host_floats(bn_numel(s)), *v = host_floats(m);
    for (int c = 0; c < s->c; c++) {
        double mean;
        do {
            mean = 0;
            for (size_t j = 0; j < m; j++) {
                float mag = test_uniform(rng, 0.3f, 1.5f);
                v[j] = test_uniform(rng, -1, 1) < 0 ? -mag : mag;
                mean += v[j];
            }
            mean /= (double)m;
        } while (fabs(mean) > 0.1);
        float offset = test_uniform(rng, -2, 2);
        for (size_t j = 0; j < m; j++) x[((j / plane) * s->c + c) * plane + j % plane] = offset + v[j];
    }
    free(v);
    return x;
}

/* The fused backward is the plain one on dy masked by y > 0, to the bit; and
 * without y (its mask recomputed from x and beta) the same bits again. */
static void bn_check_fused_backward(const BnLoss *b, const float *y, const float *smean, const float *sinv,
                                    const float *dx, const float *dgamma, const float *dbeta) {
    const BatchNormShape *s = &b->s;
    size_t nx = bn_numel(s);
    float *masked = host_floats(nx), *dx2 = host_floats(nx), *dgamma2 = host_floats(s->c), *dbeta2 = host_floats(s->c);
    relu_backward_cpu(y, b->r, masked, nx);
    batchnorm_backward_cpu(s, b->x, masked, b->gamma, smean, sinv, dx2, 0, dgamma2, dbeta2);
    CHECK_MSG(same_bits(dx, dx2, nx) && same_bits(dgamma, dgamma2, s->c) && same_bits(dbeta, dbeta2, s->c),
              "bn+relu backward differs from bn backward on relu-masked dy");
    memset(dgamma2, 0, sizeof(float) * s->c), memset(dbeta2, 0, sizeof(float) * s->c);
    batchnorm_act_backward_cpu(s, BN_ACT_RELU, b->x, NULL, b->r, b->gamma, b->beta, smean, sinv, dx2, 0, dgamma2,
                               dbeta2);
    CHECK_MSG(same_bits(dx, dx2, nx) && same_bits(dgamma, dgamma2, s->c) && same_bits(dbeta, dbeta2, s->c),
              "bn+relu backward with y NULL (its mask recomputed) differs from the one reading y");
    free(masked), free(dx2), free(dgamma2), free(dbeta2);
}

/* accumulate: dx = old + dx to the bit, dgamma and dbeta added to, dx NULL skipped. */
static void bn_check_accumulate_bits(const GridCase *c, const BnLoss *b, const float *y, const float *smean,
                                     const float *sinv, const float *dx, const float *dgamma, const float *dbeta) {
    const BatchNormShape *s = &b->s;
    size_t nx = bn_numel(s);
    float *old = grid_random(c, DTYPE_F32, nx, -1, 1), *acc = copy_floats(old, nx);
    float *g0 = grid_random(c, DTYPE_F32, s->c, -1, 1), *b0 = grid_random(c, DTYPE_F32, s->c, -1, 1);
    float *gacc = copy_floats(g0, s->c), *bacc = copy_floats(b0, s->c);
    float *gnull = copy_floats(g0, s->c), *bnull = copy_floats(b0, s->c);
    BatchNorm bn;
    batchnorm_init(&c->ctx, &bn, s, NULL);
    BatchNormParams p = {.gamma = b->gamma, .beta = b->beta, .save_mean = (float *)smean,
                         .save_invstd = (float *)sinv, .momentum = 0.0f, .eps = BN_EPS};
    batchnorm_backward(&c->ctx, &bn, BN_TRAIN, b->act, &p, b->x, y, b->r, acc, 1, gacc, bacc);
    batchnorm_backward(&c->ctx, &bn, BN_TRAIN, b->act, &p, b->x, y, b->r, NULL, 0, gnull, bnull);
    int ok = 1;
    for (size_t i = 0; i < nx; i++) ok &= acc[i] == old[i] + dx[i];
    for (int k = 0; k < s->c; k++) ok &= gacc[k] == g0[k] + dgamma[k] && bacc[k] == b0[k] + dbeta[k];
    CHECK_MSG(ok, "%s backward: accumulate_dx or dgamma/dbeta accumulation wrong", c->name);
    CHECK_MSG(same_bits(gnull, gacc, s->c) && same_bits(bnull, bacc, s->c),
              "%s backward with dx NULL gives other dgamma/dbeta", c->name);
    batchnorm_destroy(&c->ctx, &bn);
    void *host[] = {old, acc, g0, b0, gacc, bacc, gnull, bnull};
    host_free_all(host, GRID_COUNT(host));
}

/* The fused GELU's backward is the plain one on dy * gelu'(bn(x)), within
 * rounding (the fused one takes bn(x) in double, unrounded). */
static void bn_check_gelu_backward(const BnLoss *b, const float *smean, const float *sinv, const float *dx,
                                   const float *dgamma, const float *dbeta) {
    const BatchNormShape *s = &b->s;
    size_t nx = bn_numel(s);
    float *z = host_floats(nx), *g = host_floats(nx), *dx2 = host_floats(nx), *dgamma2 = host_floats(s->c);
    float *dbeta2 = host_floats(s->c);
    batchnorm_forward_train_cpu(s, b->x, b->gamma, b->beta, 0.0f, BN_EPS, NULL, NULL, NULL, NULL, z);
    gelu_backward_cpu(z, b->r, g, nx);
    batchnorm_backward_cpu(s, b->x, g, b->gamma, smean, sinv, dx2, 0, dgamma2, dbeta2);
    double edx = test_rel_error(dx, dx2, nx), eg = test_rel_error(dgamma, dgamma2, s->c);
    double eb = test_rel_error(dbeta, dbeta2, s->c);
    CHECK_MSG(edx <= 1e-5 && eg <= 1e-5 && eb <= 1e-5,
              "bn+gelu backward vs bn backward on dy * gelu'(bn(x)): dx %.3g, dgamma %.3g, dbeta %.3g", edx, eg, eb);
    void *host[] = {z, g, dx2, dgamma2, dbeta2};
    host_free_all(host, GRID_COUNT(host));
}

/* dx, dgamma and dbeta against central differences of the training forward. */
static void bn_finite_differences(const GridCase *c, BatchNormShape s) {
    BatchNormAct act = bn_act(c);
    int relu = act == BN_ACT_RELU;
    static const char *const suffix[] = {"", "+relu", "+gelu"};
    printf(" finite differences %dx%dx%dx%d\n", s.n, s.c, s.h, s.w);
    size_t nx = bn_numel(&s);
    BnLoss b = {s, relu ? bn_input_away_from_zero(c->rng, &s) : bn_input_spread(c->rng, &s, 2.0f),
                grid_random(c, DTYPE_F32, s.c, 0.5f, 1.5f),
                relu ? host_floats(s.c) : grid_random(c, DTYPE_F32, s.c, -1, 1), grid_random(c, DTYPE_F32, nx, -1, 1),
                host_floats(nx), act};
    float *smean = host_floats(s.c), *sinv = host_floats(s.c), *y = host_floats(nx);
    ref_forward_train(&s, act, b.x, b.gamma, b.beta, 0.0f, NULL, NULL, smean, sinv, y);
    float *dx = host_floats(nx), *dgamma = host_floats(s.c), *dbeta = host_floats(s.c);
    ref_backward(&s, act, b.x, y, b.r, b.gamma, b.beta, smean, sinv, dx, 0, dgamma, dbeta);

    double *num = malloc(sizeof(double) * nx);
    char what[96];
    numeric_gradient(b.x, nx, 1e-2f, bn_loss, &b, num);
    snprintf(what, sizeof what, "bn%s dx %dx%dx%dx%d", suffix[act], s.n, s.c, s.h, s.w);
    check_gradient(what, dx, num, nx);
    numeric_gradient(b.gamma, s.c, 1e-2f, bn_loss, &b, num);
    snprintf(what, sizeof what, "bn%s dgamma", suffix[act]);
    check_gradient(what, dgamma, num, s.c);
    numeric_gradient(b.beta, s.c, 1e-2f, bn_loss, &b, num);
    snprintf(what, sizeof what, "bn%s dbeta", suffix[act]);
    check_gradient(what, dbeta, num, s.c);
    if (relu) bn_check_fused_backward(&b, y, smean, sinv, dx, dgamma, dbeta);
    if (act == BN_ACT_GELU) bn_check_gelu_backward(&b, smean, sinv, dx, dgamma, dbeta);
    bn_check_accumulate_bits(c, &b, y, smean, sinv, dx, dgamma, dbeta);
    void *host[] = {b.x, b.gamma, b.beta, b.r, b.y, smean, sinv, y, dx, dgamma, dbeta, num};
    host_free_all(host, GRID_COUNT(host));
}

/* ---- the GPU only --------------------------------------------------------------- */

/* The parameter gradients into f32 buffers while the data is half (a model
 * keeping fp32 gradients): the same sums, less rounding. The face ties the
 * gradients' type to the data's; the CUDA path takes any. */
static void bn_grad_f32(const GridCase *c, BatchNormShape s) {
    printf(" dgamma/dbeta in f32 %dx%dx%dx%d\n", s.n, s.c, s.h, s.w);
    size_t nx = bn_numel(&s);
    float *x = bn_input(c->rng, &s, 1.0f, 1.0f), *dy = grid_random(c, c->dtype, nx, -1, 1);
    round_to(c->dtype, x, nx);
    float *gamma = grid_random(c, DTYPE_F32, s.c, 0.5f, 1.5f), *beta = grid_random(c, DTYPE_F32, s.c, -1, 1);
    float *smean = host_floats(s.c), *sinv = host_floats(s.c), *y = host_floats(nx);
    batchnorm_forward_train_cpu(&s, x, gamma, beta, 0.0f, BN_EPS, NULL, NULL, smean, sinv, y);
    float *dgamma = grid_random(c, DTYPE_F32, s.c, -1, 1), *dbeta = grid_random(c, DTYPE_F32, s.c, -1, 1);
    float *d_dgamma = grid_put(c, DTYPE_F32, dgamma, s.c), *d_dbeta = grid_put(c, DTYPE_F32, dbeta, s.c);
    batchnorm_backward_cpu(&s, x, dy, gamma, smean, sinv, NULL, 0, dgamma, dbeta);
    BnLayer l = bn_layer(c, &s, NULL);
    void *d_x = bn_put(c, &s, x), *d_dy = bn_put(c, &s, dy);
    float *d_gamma = grid_put(c, DTYPE_F32, gamma, s.c), *d_smean = grid_put(c, DTYPE_F32, smean, s.c);
    float *d_sinv = grid_put(c, DTYPE_F32, sinv, s.c);
    GPU_ONLY(batchnorm_backward_cuda(&l.bn.cuda, c->ctx.cudnn, d_x, d_dy, d_gamma, d_smean, d_sinv, NULL, 0, d_dgamma,
                                     d_dbeta, DTYPE_F32, c->ctx.stream));
    float *gdgamma = grid_get(c, DTYPE_F32, d_dgamma, s.c), *gdbeta = grid_get(c, DTYPE_F32, d_dbeta, s.c);
    grid_check(c, "bn dgamma into f32", gdgamma, dgamma, s.c, 1e-5);
    grid_check(c, "bn dbeta into f32", gdbeta, dbeta, s.c, 1e-5);
    bn_layer_free(c, &l);
    void *dev[] = {d_dgamma, d_dbeta, d_x, d_dy, d_gamma, d_smean, d_sinv};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, gamma, beta, smean, sinv, y, dgamma, dbeta, gdgamma, gdbeta};
    host_free_all(host, GRID_COUNT(host));
}

#if TRAINC_CUDA
/* Two layers a (fused) and b (plain): forward a, forward b, backward b (dy =
 * its own y), backward a (dy = its own y). */
typedef struct {
    BatchNormShape s;
    void *x, *y, *dx;
    float *gamma, *beta;
} GraphLayer;

static void graph_step(const GridCase *c, const BatchNorm *a, const BatchNorm *b, const GraphLayer *la,
                       const GraphLayer *lb, float *stats, void *grads) {
    size_t es = dtype_size(c->dtype);
    int ca = la->s.c, cb = lb->s.c;
    float *ma = stats, *ia = ma + ca, *rma = ia + ca, *rva = rma + ca;
    float *mb = rva + ca, *ib = mb + cb, *rmb = ib + cb, *rvb = rmb + cb;
    char *g = grads;
    void *dga = g, *dba = g + ca * es, *dgb = g + 2 * ca * es, *dbb = g + (2 * ca + cb) * es;
    BatchNormParams pa = {.gamma = la->gamma, .beta = la->beta, .running_mean = rma, .running_var = rva,
                          .save_mean = ma, .save_invstd = ia, .momentum = 0.1f, .eps = BN_EPS};
    BatchNormParams pb = {.gamma = lb->gamma, .beta = lb->beta, .running_mean = rmb, .running_var = rvb,
                          .save_mean = mb, .save_invstd = ib, .momentum = 0.1f, .eps = BN_EPS};
    batchnorm_forward(&c->ctx, a, BN_TRAIN, BN_ACT_RELU, &pa, la->x, la->y);
    batchnorm_forward(&c->ctx, b, BN_TRAIN, BN_ACT_NONE, &pb, lb->x, lb->y);
    batchnorm_backward(&c->ctx, b, BN_TRAIN, BN_ACT_NONE, &pb, lb->x, NULL, lb->y, lb->dx, 0, dgb, dbb);
    batchnorm_backward(&c->ctx, a, BN_TRAIN, BN_ACT_RELU, &pa, la->x, la->y, la->y, la->dx, 0, dga, dba);
}

static GraphLayer graph_layer(const GridCase *c, BatchNormShape s) {
    size_t nx = bn_numel(&s);
    float *x = bn_input(c->rng, &s, 1, 1), *gamma = grid_random(c, DTYPE_F32, s.c, 0.5f, 1.5f);
    float *beta = grid_random(c, DTYPE_F32, s.c, -1, 1);
    GraphLayer l = {s, grid_put(c, c->dtype, x, nx), grid_alloc(c, c->dtype, nx), grid_alloc(c, c->dtype, nx),
                    grid_put(c, DTYPE_F32, gamma, s.c), grid_put(c, DTYPE_F32, beta, s.c)};
    free(x), free(gamma), free(beta);
    return l;
}

static void graph_layer_free(const GridCase *c, GraphLayer *l) {
    void *dev[] = {l->x, l->y, l->dx, l->gamma, l->beta};
    grid_free_all(c, dev, GRID_COUNT(dev));
}

/* Two layers sharing one scratch buffer (filled with garbage first) give the
 * bits of layers with their own; then the same calls captured as a CUDA graph
 * give the bits of the eager calls. */
static void bn_scratch_and_graph(const GridCase *c) {
    printf(" shared scratch, CUDA graph\n");
    DType dt = c->dtype;
    GraphLayer la = graph_layer(c, (BatchNormShape){16, 32, 16, 16}), lb = graph_layer(c, (BatchNormShape){16, 64, 8, 8});
    size_t na = bn_numel(&la.s), nb = bn_numel(&lb.s);
    size_t bytes = batchnorm_scratch_bytes(&c->ctx, &la.s), bytes_b = batchnorm_scratch_bytes(&c->ctx, &lb.s);
    if (bytes_b > bytes) bytes = bytes_b;
    void *shared = dev_bytes(bytes);
    op_fill(&c->ctx, shared, 0xa5, bytes);
    BnLayer own_a = bn_layer(c, &la.s, NULL), own_b = bn_layer(c, &lb.s, NULL);
    BnLayer sh_a = bn_layer(c, &la.s, shared), sh_b = bn_layer(c, &lb.s, shared);
    size_t nstats = 4 * (size_t)(la.s.c + lb.s.c), ngrad = 2 * (size_t)(la.s.c + lb.s.c);
    float *d_stats = grid_alloc(c, DTYPE_F32, nstats);
    void *d_grad = grid_alloc(c, dt, ngrad);
    float *ones = host_floats(nstats);
    for (size_t i = 0; i < nstats; i++) ones[i] = 1.0f;

    float *results[3][4]; /* [own, shared, graph][ya, yb, dxa, stats+grads] */
    for (int run = 0; run < 3; run++) {
        grid_set(c, DTYPE_F32, d_stats, ones, nstats);
        op_fill(&c->ctx, d_grad, 0, ngrad * dtype_size(dt));
        grid_poison(c, dt, la.y, na), grid_poison(c, dt, lb.y, nb), grid_poison(c, dt, la.dx, na);
        grid_poison(c, dt, lb.dx, nb);
        const BnLayer *a = run == 0 ? &own_a : &sh_a, *b = run == 0 ? &own_b : &sh_b;
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        if (run == 2) CUDA_CHECK(cudaStreamBeginCapture(c->ctx.stream, cudaStreamCaptureModeGlobal));
        graph_step(c, &a->bn, &b->bn, &la, &lb, d_stats, d_grad);
        if (run == 2) {
            CUDA_CHECK(cudaStreamEndCapture(c->ctx.stream, &graph));
            CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            CUDA_CHECK(cudaGraphLaunch(exec, c->ctx.stream));
        }
        results[run][0] = grid_get(c, dt, la.y, na);
        results[run][1] = grid_get(c, dt, lb.y, nb);
        results[run][2] = grid_get(c, dt, la.dx, na);
        float *stats = grid_get(c, DTYPE_F32, d_stats, nstats), *grads = grid_get(c, dt, d_grad, ngrad);
        results[run][3] = host_floats(nstats + ngrad);
        memcpy(results[run][3], stats, nstats * sizeof(float));
        memcpy(results[run][3] + nstats, grads, ngrad * sizeof(float));
        free(stats), free(grads);
        if (run == 2) {
            CUDA_CHECK(cudaGraphExecDestroy(exec));
            CUDA_CHECK(cudaGraphDestroy(graph));
        }
    }
    size_t sizes[4] = {na, nb, na, nstats + ngrad};
    const char *names[4] = {"y of layer a", "y of layer b", "dx of layer a", "statistics and gradients"};
    for (int k = 0; k < 4; k++) {
        CHECK_MSG(test_rel_error(results[0][k], results[0][k], sizes[k]) == 0, "%s bn: %s has NaN (not written)",
                  c->name, names[k]);
        CHECK_MSG(same_bits(results[1][k], results[0][k], sizes[k]), "%s bn: %s differs with a shared scratch",
                  c->name, names[k]);
        CHECK_MSG(same_bits(results[2][k], results[0][k], sizes[k]), "%s bn: %s differs when run from a CUDA graph",
                  c->name, names[k]);
    }
    for (int run = 0; run < 3; run++)
        for (int k = 0; k < 4; k++) free(results[run][k]);
    BnLayer *layers[] = {&own_a, &own_b, &sh_a, &sh_b};
    for (int i = 0; i < 4; i++) bn_layer_free(c, layers[i]);
    graph_layer_free(c, &la), graph_layer_free(c, &lb);
    void *dev[] = {shared, d_stats, d_grad};
    grid_free_all(c, dev, GRID_COUNT(dev));
    free(ones);
}
#endif

/* ---- the cases -------------------------------------------------------------------- */

static void bn_case(const GridCase *c) {
    /* several rows of partial sums; h*w and c off the 16-byte vectors; CIFAR
     * ResNet-18's first stage; 300 channels: two NHWC tiles in f16 (one
     * element a thread); then |mean| >> std: the shifted sums must not cancel */
    const BatchNormShape shapes[] = {
        {4, 16, 8, 8}, {3, 24, 7, 7}, {2, 12, 5, 3}, {32, 64, 32, 32}, {8, 40, 9, 9}, {4, 300, 4, 4},
    };
    for (size_t i = 0; i < GRID_COUNT(shapes); i++) bn_shape(c, shapes[i], 2.0f);
    if (c->dtype == DTYPE_F32) bn_shape(c, (BatchNormShape){16, 8, 12, 12}, 20.0f);

    if (c->device == DEVICE_CPU) {
        if (c->fused) bn_finite_differences(c, (BatchNormShape){2, 3, 4, 4});
        else bn_finite_differences(c, (BatchNormShape){3, 4, 3, 5}), bn_finite_differences(c, (BatchNormShape){5, 2, 1, 1});
        bn_sync(c, (BatchNormShape){4, 3, 5, 6}, 2.0f, 1);
        bn_sync(c, (BatchNormShape){6, 5, 3, 3}, 1.0f, 1);
        bn_sync(c, (BatchNormShape){2, 4, 2, 3}, 20.0f, 0); /* |mean| >> std; one image a rank */
        bn_sync(c, (BatchNormShape){2, 4, 1, 1}, 1.0f, 1);  /* one value a rank: only the global count is 2 */
        return;
    }
    bn_sync(c, (BatchNormShape){8, 24, 7, 7}, 2.0f, 1);
    if (c->dtype == DTYPE_F16) bn_sync(c, (BatchNormShape){4, 32, 8, 8}, 1.0f, 1); /* 16-byte vectors */
    if (c->dtype == DTYPE_F32) {
        bn_sync(c, (BatchNormShape){16, 8, 12, 12}, 20.0f, 1); /* |mean| >> std */
        bn_sync(c, (BatchNormShape){2, 16, 1, 1}, 1.0f, 1);    /* one value a rank */
    }
    if (c->fused) return; /* what follows runs both kinds of layer itself */
    if (c->dtype != DTYPE_F32) bn_grad_f32(c, (BatchNormShape){8, 32, 8, 8});
#if TRAINC_CUDA
    bn_scratch_and_graph(c);
#endif
}

/* ---- extras: by hand, and against independent formulas -------------------------- */

/* x Phi(x), written out here rather than taken from ops/gelu_math.h. */
static double gelu_exact(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

static void bn_by_hand(void) {
    /* n = 2, c = 1, 1x2: x = 1 2 3 4, mean 2.5, biased var 1.25, unbiased 5/3 */
    BatchNormShape s = {2, 1, 1, 2};
    float x[4] = {1, 2, 3, 4}, gamma = 2.0f, beta = 0.5f, y[4];
    float rmean = 1.0f, rvar = 3.0f, smean = -1, sinv = -1;
    batchnorm_forward_train_cpu(&s, x, &gamma, &beta, 0.1f, 0.0f, &rmean, &rvar, &smean, &sinv, y);
    double inv = 1.0 / sqrt(1.25);
    check_values("bn y", y, (double[]){0.5 - 3 * inv, 0.5 - inv, 0.5 + inv, 0.5 + 3 * inv}, 4, 1e-6);
    CHECK_NEAR(smean, 2.5, 1e-6);
    CHECK_NEAR(sinv, inv, 1e-6);
    CHECK_NEAR(rmean, 0.9 * 1.0 + 0.1 * 2.5, 1e-6);
    CHECK_NEAR(rvar, 0.9 * 3.0 + 0.1 * 5.0 / 3.0, 1e-6); /* unbiased, as PyTorch */
    /* momentum 0: the running statistics keep their bits */
    float rmean0 = rmean, rvar0 = rvar;
    batchnorm_forward_train_cpu(&s, x, &gamma, &beta, 0.0f, 0.0f, &rmean, &rvar, &smean, &sinv, y);
    CHECK(same_bits(&rmean, &rmean0, 1) && same_bits(&rvar, &rvar0, 1));
    /* eval with running mean 2, var 4 (eps 0): (x - 2) / 2 * gamma + beta */
    float rm = 2.0f, rv = 4.0f;
    batchnorm_forward_eval_cpu(&s, x, &gamma, &beta, &rm, &rv, 0.0f, y);
    check_values("bn eval y", y, (double[]){-0.5, 0.5, 1.5, 2.5}, 4, 1e-6);
    batchnorm_act_forward_eval_cpu(&s, BN_ACT_RELU, x, &gamma, &beta, &rm, &rv, 0.0f, y);
    check_values("bn+relu eval y", y, (double[]){0, 0.5, 1.5, 2.5}, 4, 1e-6);
    batchnorm_act_forward_eval_cpu(&s, BN_ACT_GELU, x, &gamma, &beta, &rm, &rv, 0.0f, y);
    check_values("bn+gelu eval y", y, (double[]){gelu_exact(-0.5), gelu_exact(0.5), gelu_exact(1.5), gelu_exact(2.5)},
                 4, 1e-6);
}

/* One channel's mean and biased variance in double. */
static void channel_moments(const BatchNormShape *s, const float *x, int c, double *mean, double *var) {
    size_t plane = (size_t)s->h * s->w;
    double m = (double)s->n * plane, sum = 0, sq = 0;
    for (int i = 0; i < s->n; i++)
        for (size_t p = 0; p < plane; p++) sum += x[((size_t)i * s->c + c) * plane + p];
    *mean = sum / m;
    for (int i = 0; i < s->n; i++)
        for (size_t p = 0; p < plane; p++) {
            double d = x[((size_t)i * s->c + c) * plane + p] - *mean;
            sq += d * d;
        }
    *var = sq / m;
}

/* Training-mode output: per channel, mean beta and variance gamma^2 var / (var
 * + eps), against the statistics computed here in double. */
static void bn_statistics(uint64_t *rng, BatchNormShape s) {
    printf(" statistics %dx%dx%dx%d\n", s.n, s.c, s.h, s.w);
    size_t nx = bn_numel(&s);
    double m = (double)s.n * s.h * s.w;
    float *x = bn_input_spread(rng, &s, 3.0f), *y = host_floats(nx);
    float *gamma = bn_uniform(rng, s.c, 0.5f, 1.5f), *beta = bn_uniform(rng, s.c, -1, 1);
    float *rmean = bn_uniform(rng, s.c, -1, 1), *rvar = bn_uniform(rng, s.c, 0.5f, 2);
    float *rmean0 = copy_floats(rmean, s.c), *rvar0 = copy_floats(rvar, s.c);
    float *smean = host_floats(s.c), *sinv = host_floats(s.c);
    const float momentum = 0.1f;
    batchnorm_forward_train_cpu(&s, x, gamma, beta, momentum, BN_EPS, rmean, rvar, smean, sinv, y);
    double *want_mean = malloc(sizeof(double) * s.c), *want_inv = malloc(sizeof(double) * s.c);
    double *want_rmean = malloc(sizeof(double) * s.c), *want_rvar = malloc(sizeof(double) * s.c);
    for (int c = 0; c < s.c; c++) {
        double mean, var, ymean, yvar;
        channel_moments(&s, x, c, &mean, &var);
        channel_moments(&s, y, c, &ymean, &yvar);
        want_mean[c] = mean;
        want_inv[c] = 1.0 / sqrt(var + BN_EPS);
        want_rmean[c] = (1 - momentum) * rmean0[c] + momentum * mean;
        want_rvar[c] = (1 - momentum) * rvar0[c] + momentum * var * m / (m - 1);
        CHECK_MSG(fabs(ymean - beta[c]) <= 1e-5, "channel %d: mean of y %.9g, beta %.9g", c, ymean, beta[c]);
        double want_var = (double)gamma[c] * gamma[c] * var / (var + BN_EPS);
        CHECK_MSG(fabs(yvar - want_var) <= 1e-5 * want_var, "channel %d: var of y %.9g, want %.9g", c, yvar, want_var);
    }
    check_values("bn save_mean", smean, want_mean, s.c, 1e-6);
    check_values("bn save_invstd", sinv, want_inv, s.c, 1e-6);
    check_values("bn running_mean", rmean, want_rmean, s.c, 1e-6);
    check_values("bn running_var (unbiased)", rvar, want_rvar, s.c, 1e-6);
    void *p[] = {x, y, gamma, beta, rmean, rvar, rmean0, rvar0, smean, sinv, want_mean, want_inv, want_rmean, want_rvar};
    host_free_all(p, GRID_COUNT(p));
}

static void bn_eval_formula(uint64_t *rng, BatchNormShape s) {
    printf(" eval %dx%dx%dx%d\n", s.n, s.c, s.h, s.w);
    size_t nx = bn_numel(&s), plane = (size_t)s.h * s.w;
    float *x = bn_uniform(rng, nx, -3, 3), *y = host_floats(nx), *yr = host_floats(nx), *yg = host_floats(nx);
    float *gamma = bn_uniform(rng, s.c, 0.5f, 1.5f), *beta = bn_uniform(rng, s.c, -1, 1);
    float *rmean = bn_uniform(rng, s.c, -1, 1), *rvar = bn_uniform(rng, s.c, 0.1f, 3);
    batchnorm_forward_eval_cpu(&s, x, gamma, beta, rmean, rvar, BN_EPS, y);
    batchnorm_act_forward_eval_cpu(&s, BN_ACT_RELU, x, gamma, beta, rmean, rvar, BN_EPS, yr);
    batchnorm_act_forward_eval_cpu(&s, BN_ACT_GELU, x, gamma, beta, rmean, rvar, BN_EPS, yg);
    double *want = malloc(sizeof(double) * nx), *want_relu = malloc(sizeof(double) * nx);
    double *want_gelu = malloc(sizeof(double) * nx);
    for (size_t i = 0; i < nx; i++) {
        int c = (int)((i / plane) % s.c);
        want[i] = (x[i] - (double)rmean[c]) / sqrt((double)rvar[c] + BN_EPS) * gamma[c] + beta[c];
        want_relu[i] = want[i] > 0 ? want[i] : 0;
        want_gelu[i] = gelu_exact(want[i]);
    }
    check_values("bn eval y", y, want, nx, 1e-6);
    check_values("bn+relu eval y", yr, want_relu, nx, 1e-6);
    check_values("bn+gelu eval y", yg, want_gelu, nx, 1e-6);
    void *p[] = {x, y, yr, yg, gamma, beta, rmean, rvar, want, want_relu, want_gelu};
    host_free_all(p, GRID_COUNT(p));
}

/* The fused forward is relu(bn(x)), to the bit, and gelu(bn(x)) within a
 * rounding (the fused one rounds once), and updates the same running statistics. */
static void bn_fused_forward_bits(uint64_t *rng, BatchNormShape s) {
    size_t nx = bn_numel(&s);
    float *x = bn_input(rng, &s, 1.0f, 1.0f), *gamma = bn_uniform(rng, s.c, 0.5f, 1.5f);
    float *beta = bn_uniform(rng, s.c, -1, 1), *y = host_floats(nx), *yr = host_floats(nx), *yg = host_floats(nx);
    float *want = host_floats(nx), *want_g = host_floats(nx), *rm = bn_uniform(rng, s.c, -1, 1);
    float *rv = bn_uniform(rng, s.c, 1, 2);
    float *rm2 = copy_floats(rm, s.c), *rv2 = copy_floats(rv, s.c), *rm3 = copy_floats(rm, s.c), *rv3 = copy_floats(rv, s.c);
    batchnorm_forward_train_cpu(&s, x, gamma, beta, 0.1f, BN_EPS, rm, rv, NULL, NULL, y);
    batchnorm_act_forward_train_cpu(&s, BN_ACT_RELU, x, gamma, beta, 0.1f, BN_EPS, rm2, rv2, NULL, NULL, yr);
    batchnorm_act_forward_train_cpu(&s, BN_ACT_GELU, x, gamma, beta, 0.1f, BN_EPS, rm3, rv3, NULL, NULL, yg);
    relu_forward_cpu(y, want, nx);
    gelu_forward_cpu(y, want_g, nx);
    size_t zeros = 0;
    for (size_t i = 0; i < nx; i++) zeros += yr[i] == 0.0f;
    CHECK_MSG(same_bits(yr, want, nx), "bn+relu forward is not relu(bn forward)");
    CHECK_MSG(zeros > 0 && zeros < nx, "bn+relu: %zu zeros of %zu", zeros, nx);
    CHECK(same_bits(rm, rm2, s.c) && same_bits(rv, rv2, s.c));
    double err = test_rel_error(yg, want_g, nx);
    CHECK_MSG(err <= 1e-6, "bn+gelu forward is %.3g from gelu(bn forward)", err);
    CHECK(same_bits(rm, rm3, s.c) && same_bits(rv, rv3, s.c));
    void *p[] = {x, gamma, beta, y, yr, yg, want, want_g, rm, rv, rm2, rv2, rm3, rv3};
    host_free_all(p, GRID_COUNT(p));
}

/* Misuse of the face ends the process with one message: the GELU's backward
 * without beta, an activation that is no BatchNormAct. */
static void bn_misuse_call(void *arg) {
    int which = *(const int *)arg;
    BatchNormShape s = {2, 1, 1, 2};
    float x[4] = {1, 2, 3, 4}, dy[4] = {1, 1, 1, 1}, dx[4], gamma = 1, mean = 2.5f, inv = 1, y[4];
    OpContext ctx = op_context_cpu();
    BatchNorm bn;
    batchnorm_init(&ctx, &bn, &s, NULL);
    BatchNormParams p = {.gamma = &gamma, .save_mean = &mean, .save_invstd = &inv, .momentum = 0.0f, .eps = BN_EPS};
    if (which == 0) batchnorm_backward(&ctx, &bn, BN_TRAIN, BN_ACT_GELU, &p, x, NULL, dy, dx, 0, NULL, NULL);
    else batchnorm_forward(&ctx, &bn, BN_EVAL, (BatchNormAct)7, &p, x, y);
}

static void bn_misuse(void) {
    static const char *const want[] = {"batchnorm+gelu backward: beta is needed", "batchnorm: unknown activation 7"};
    for (int which = 0; which < 2; which++) {
        int status;
        char *text = test_child_stderr("test_op_batchnorm", bn_misuse_call, &which, &status);
        CHECK_MSG(status > 0 && strstr(text, want[which]), "bn misuse %d: exit status %d, message '%s' (want '%s')",
                  which, status, text, want[which]);
        free(text);
    }
}

static void bn_extras(uint64_t *rng) {
    bn_misuse();
    bn_by_hand();
    bn_statistics(rng, (BatchNormShape){4, 3, 5, 6});
    bn_statistics(rng, (BatchNormShape){2, 5, 1, 1});
    bn_eval_formula(rng, (BatchNormShape){3, 4, 5, 2});
    bn_fused_forward_bits(rng, (BatchNormShape){4, 6, 5, 5});
}

/* c->fused: the BatchNormAct */
static const char *const bn_variants[] = {"unfused", "fused relu", "fused gelu"};

const GridOp grid_op_batchnorm = {
    .name = "batchnorm",
    .run = bn_case,
    .extras = bn_extras,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .fused = 2,
    .fused_names = bn_variants,
    .skipped = "cpu nhwc (the CPU path is NCHW)",
};
