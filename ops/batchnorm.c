#include "ops/batchnorm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gelu_math.h"
#include "ops/relu.h"
#include "runtime/check.h"

static size_t plane_of(const BatchNormShape *s) {
    if (s->n <= 0 || s->c <= 0 || s->h <= 0 || s->w <= 0)
        TC_FATAL("batchnorm: bad shape n=%d c=%d h=%d w=%d", s->n, s->c, s->h, s->w);
    return (size_t)s->h * s->w;
}

/* Element p of image i in channel c: NCHW. */
#define AT(base, i, c, p) (base)[((size_t)(i) * s->c + (c)) * plane + (p)]

/* Channel c's mean and sum of squares about it, in double. */
static void channel_moments(const BatchNormShape *s, const float *x, int c, double *mean,
                            double *sq) {
    size_t plane = plane_of(s);
    double m = (double)s->n * plane, sum = 0.0;
    for (int i = 0; i < s->n; i++)
        for (size_t p = 0; p < plane; p++) sum += AT(x, i, c, p);
    *mean = sum / m;
    *sq = 0.0;
    for (int i = 0; i < s->n; i++)
        for (size_t p = 0; p < plane; p++) {
            double d = AT(x, i, c, p) - *mean;
            *sq += d * d;
        }
}

/* act of bn(x) = v, rounded once (ReLU: of v rounded, as relu.h would). */
static float activate(BatchNormAct act, double v) {
    if (act == BN_ACT_GELU) return (float)gelu_value_d(v);
    float f = (float)v;
    return act == BN_ACT_RELU && f < 0.0f ? 0.0f : f;
}

/* dy through the activation's derivative: ReLU masks by its output y, GELU
 * takes gelu'(z) at its input z = bn(x). */
static double activation_dy(BatchNormAct act, double dy, float y, double z) {
    if (act == BN_ACT_RELU) return y > 0.0f ? dy : 0.0;
    if (act == BN_ACT_GELU) return dy * gelu_grad_d(z);
    return dy;
}

/* Synchronized: sums[3][c] of x, x^2 (from the squares about the local mean,
 * so that |mean| >> std does not cancel) and the count, added over the
 * processes. */
static double *global_forward_sums(const BatchNormShape *s, const float *x, BnAllreduce reduce,
                                   void *ctx) {
    double m = (double)s->n * plane_of(s), *sums = malloc(3 * (size_t)s->c * sizeof(double));
    if (!sums) TC_FATAL("batchnorm: out of host memory");
    for (int c = 0; c < s->c; c++) {
        double mean, sq;
        channel_moments(s, x, c, &mean, &sq);
        sums[c] = m * mean;
        sums[s->c + c] = sq + m * mean * mean;
        sums[2 * s->c + c] = m;
    }
    reduce(ctx, sums, 3 * s->c, NULL);
    return sums;
}

static void forward_train(const BatchNormShape *s, const float *x, const float *gamma,
                          const float *beta, float momentum, float eps, float *running_mean,
                          float *running_var, float *save_mean, float *save_invstd, float *y,
                          BatchNormAct act, BnAllreduce reduce, void *ctx) {
    size_t plane = plane_of(s);
    double *sums = reduce ? global_forward_sums(s, x, reduce, ctx) : NULL;
    for (int c = 0; c < s->c; c++) {
        double m = (double)s->n * plane, mean, var;
        if (sums) {
            m = sums[2 * s->c + c];
            mean = sums[c] / m;
            var = sums[s->c + c] / m - mean * mean;
            if (var < 0.0) var = 0.0;
        } else {
            channel_moments(s, x, c, &mean, &var);
            var /= m;
        }
        if (m < 2) TC_FATAL("batchnorm: training needs more than one value per channel");
        double invstd = 1.0 / sqrt(var + eps);
        if (save_mean) save_mean[c] = (float)mean;
        if (save_invstd) save_invstd[c] = (float)invstd;
        if (momentum != 0.0f && running_mean)
            running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + (double)momentum * mean);
        if (momentum != 0.0f && running_var)
            running_var[c] = (float)((1.0 - momentum) * running_var[c] +
                                     (double)momentum * var * m / (m - 1.0));
        double scale = invstd * gamma[c];
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++)
                AT(y, i, c, p) = activate(act, (AT(x, i, c, p) - mean) * scale + beta[c]);
    }
    free(sums);
}

static void forward_eval(const BatchNormShape *s, const float *x, const float *gamma,
                         const float *beta, const float *running_mean, const float *running_var,
                         float eps, float *y, BatchNormAct act) {
    size_t plane = plane_of(s);
    for (int c = 0; c < s->c; c++) {
        double scale = gamma[c] / sqrt((double)running_var[c] + eps);
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++)
                AT(y, i, c, p) = activate(act, (AT(x, i, c, p) - (double)running_mean[c]) * scale + beta[c]);
    }
}

static void forward_saved(const BatchNormShape *s, const float *x, const float *gamma, const float *beta,
                          const float *save_mean, const float *save_invstd, float *y, BatchNormAct act) {
    size_t plane = plane_of(s);
    for (int c = 0; c < s->c; c++) {
        double scale = (double)save_invstd[c] * gamma[c];
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++)
                AT(y, i, c, p) = activate(act, (AT(x, i, c, p) - (double)save_mean[c]) * scale + beta[c]);
    }
}

/* The fused activation's backward inputs: y (ReLU) or beta (GELU); relu_coef
 * (ReLU, NULL: none), a convolution prologue's scale and bias. */
typedef struct {
    BatchNormAct act;
    const float *y, *beta, *relu_coef;
} ActBackward;

/* dy' of element (i, c, p), the activation's derivative applied; x its input, xhat that normalised. */
static double channel_dy(const BatchNormShape *s, ActBackward a, const float *dy, int i, int c, size_t p,
                         double gamma, float x, double xhat) {
    size_t plane = plane_of(s);
    if (a.act == BN_ACT_NONE) return AT(dy, i, c, p);
    /* the ReLU's input where a prologue applied the norm, else bn(x) from the saved statistics: GELU's
     * input, and the ReLU's mask where y is not given */
    double z = a.relu_coef                  ? bn_prologue_input(x, a.relu_coef[c], a.relu_coef[s->c + c])
               : a.act == BN_ACT_GELU || !a.y ? xhat * gamma + a.beta[c]
                                              : 0.0;
    float y = a.act != BN_ACT_RELU ? 0.0f : a.y ? AT(a.y, i, c, p) : activate(BN_ACT_RELU, z);
    return activation_dy(a.act, AT(dy, i, c, p), y, z);
}

/* Channel c's dx from the sums of dy' and dy' * xhat over m values. */
static void channel_dx(const BatchNormShape *s, int c, const float *x, ActBackward a, const float *dy,
                       double gamma, double mean, double invstd, double m, double sum_dy,
                       double sum_dy_xhat, float *dx, int accumulate_dx) {
    size_t plane = plane_of(s);
    double factor = gamma * invstd / m;
    for (int i = 0; i < s->n; i++)
        for (size_t p = 0; p < plane; p++) {
            double xhat = (AT(x, i, c, p) - mean) * invstd;
            double g = channel_dy(s, a, dy, i, c, p, gamma, AT(x, i, c, p), xhat);
            float v = (float)(factor * (m * g - sum_dy - xhat * sum_dy_xhat));
            AT(dx, i, c, p) = accumulate_dx ? AT(dx, i, c, p) + v : v;
        }
}

/* Synchronized (reduce set and dx wanted): dx from the sums[3][c] of dy',
 * dy' * xhat and the count, added over the processes. */
static void backward(const BatchNormShape *s, const float *x, ActBackward a, const float *dy,
                     const float *gamma, const float *save_mean, const float *save_invstd,
                     float *dx, int accumulate_dx, float *dgamma, float *dbeta,
                     BnAllreduce reduce, void *ctx) {
    if (a.act == BN_ACT_RELU && !a.y && !a.beta && !a.relu_coef)
        TC_FATAL("batchnorm+relu backward: y, beta or a prologue's scale and bias is needed");
    if (a.act == BN_ACT_GELU && !a.beta) TC_FATAL("batchnorm+gelu backward: beta is needed");
    size_t plane = plane_of(s);
    double m = (double)s->n * plane, *sums = NULL;
    if (dx && reduce) {
        sums = malloc(3 * (size_t)s->c * sizeof(double));
        if (!sums) TC_FATAL("batchnorm: out of host memory");
    }
    for (int c = 0; c < s->c; c++) {
        double mean = save_mean[c], invstd = save_invstd[c];
        double sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++) {
                double d = AT(x, i, c, p) - mean;
                double g = channel_dy(s, a, dy, i, c, p, gamma[c], AT(x, i, c, p), d * invstd);
                sum_dy += g;
                sum_dy_xhat += g * d * invstd;
            }
        if (dbeta) dbeta[c] += (float)sum_dy;
        if (dgamma) dgamma[c] += (float)sum_dy_xhat;
        if (sums) {
            sums[c] = sum_dy;
            sums[s->c + c] = sum_dy_xhat;
            sums[2 * s->c + c] = m;
        } else if (dx) {
            channel_dx(s, c, x, a, dy, gamma[c], mean, invstd, m, sum_dy, sum_dy_xhat, dx, accumulate_dx);
        }
    }
    if (!sums) return;
    reduce(ctx, sums, 3 * s->c, NULL);
    for (int c = 0; c < s->c; c++)
        channel_dx(s, c, x, a, dy, gamma[c], save_mean[c], save_invstd[c], sums[2 * s->c + c], sums[c],
                   sums[s->c + c], dx, accumulate_dx);
    free(sums);
}

void batchnorm_forward_train_cpu(const BatchNormShape *s, const float *x, const float *gamma,
                                 const float *beta, float momentum, float eps, float *running_mean,
                                 float *running_var, float *save_mean, float *save_invstd,
                                 float *y) {
    forward_train(s, x, gamma, beta, momentum, eps, running_mean, running_var, save_mean,
                  save_invstd, y, BN_ACT_NONE, NULL, NULL);
}

void batchnorm_forward_eval_cpu(const BatchNormShape *s, const float *x, const float *gamma,
                                const float *beta, const float *running_mean,
                                const float *running_var, float eps, float *y) {
    forward_eval(s, x, gamma, beta, running_mean, running_var, eps, y, BN_ACT_NONE);
}

void batchnorm_backward_cpu(const BatchNormShape *s, const float *x, const float *dy,
                            const float *gamma, const float *save_mean, const float *save_invstd,
                            float *dx, int accumulate_dx, float *dgamma, float *dbeta) {
    ActBackward a = {BN_ACT_NONE, NULL, NULL, NULL};
    backward(s, x, a, dy, gamma, save_mean, save_invstd, dx, accumulate_dx, dgamma, dbeta, NULL, NULL);
}

void batchnorm_act_forward_train_cpu(const BatchNormShape *s, BatchNormAct act, const float *x,
                                     const float *gamma, const float *beta, float momentum, float eps,
                                     float *running_mean, float *running_var, float *save_mean,
                                     float *save_invstd, float *y) {
    forward_train(s, x, gamma, beta, momentum, eps, running_mean, running_var, save_mean,
                  save_invstd, y, act, NULL, NULL);
}

void batchnorm_act_forward_eval_cpu(const BatchNormShape *s, BatchNormAct act, const float *x,
                                    const float *gamma, const float *beta, const float *running_mean,
                                    const float *running_var, float eps, float *y) {
    forward_eval(s, x, gamma, beta, running_mean, running_var, eps, y, act);
}

void batchnorm_act_backward_cpu(const BatchNormShape *s, BatchNormAct act, const float *x,
                                const float *y, const float *dy, const float *gamma,
                                const float *beta, const float *save_mean, const float *save_invstd,
                                float *dx, int accumulate_dx, float *dgamma, float *dbeta) {
    ActBackward a = {act, y, beta, NULL};
    backward(s, x, a, dy, gamma, save_mean, save_invstd, dx, accumulate_dx, dgamma, dbeta, NULL, NULL);
}

void batchnorm_forward_train_sync_cpu(const BatchNormShape *s, const float *x, const float *gamma,
                                      const float *beta, float momentum, float eps,
                                      float *running_mean, float *running_var, float *save_mean,
                                      float *save_invstd, float *y, BnAllreduce reduce, void *ctx,
                                      BatchNormAct act) {
    forward_train(s, x, gamma, beta, momentum, eps, running_mean, running_var, save_mean,
                  save_invstd, y, act, reduce, ctx);
}

void batchnorm_backward_sync_cpu(const BatchNormShape *s, const float *x, const float *y,
                                 const float *dy, const float *gamma, const float *beta,
                                 const float *save_mean, const float *save_invstd, float *dx,
                                 int accumulate_dx, float *dgamma, float *dbeta, BnAllreduce reduce,
                                 void *ctx, BatchNormAct act) {
    ActBackward a = {act, y, beta, NULL};
    backward(s, x, a, dy, gamma, save_mean, save_invstd, dx, accumulate_dx, dgamma, dbeta, reduce, ctx);
}

/* ---- the face ---------------------------------------------------------- */

size_t batchnorm_scratch_bytes(const OpContext *ctx, const BatchNormShape *s) {
    size_t bytes = 0;
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(bytes = batchnorm_cuda_scratch_bytes(s, ctx->nhwc));
    return bytes;
}

void batchnorm_init(const OpContext *ctx, BatchNorm *bn, const BatchNormShape *s, void *scratch) {
    BatchNormShape shape = *s; /* s may be bn's own */
    memset(bn, 0, sizeof *bn);
    bn->shape = shape;
    if (ctx->device == DEVICE_CUDA)
        GPU_ONLY(batchnorm_cuda_init_scratch(&bn->cuda, &shape, ctx->dtype, ctx->nhwc, scratch));
}

void batchnorm_destroy(const OpContext *ctx, BatchNorm *bn) {
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(batchnorm_cuda_destroy(&bn->cuda));
}

/* y = act(y + residual), y the norm's output: the CPU's residual after the norm, rounded once more. */
static void add_residual(const BatchNormShape *s, BatchNormAct act, const float *residual, float *y) {
    size_t n = (size_t)s->n * s->c * plane_of(s);
    for (size_t i = 0; i < n; i++) y[i] = activate(act, (double)y[i] + residual[i]);
}

/* The CPU paths by mode. */
static void forward_cpu(const BatchNorm *bn, BatchNormMode mode, BatchNormAct act, const BatchNormParams *p,
                        const float *x, float *y) {
    BatchNormAct after = act;
    if (p->residual) act = BN_ACT_NONE;
    if (mode == BN_EVAL)
        forward_eval(&bn->shape, x, p->gamma, p->beta, p->running_mean, p->running_var, p->eps, y, act);
    else if (mode == BN_TRAIN_SAVED)
        forward_saved(&bn->shape, x, p->gamma, p->beta, p->save_mean, p->save_invstd, y, act);
    else
        forward_train(&bn->shape, x, p->gamma, p->beta, p->momentum, p->eps, p->running_mean, p->running_var,
                      p->save_mean, p->save_invstd, y, act, mode == BN_TRAIN_SYNC ? p->reduce : NULL,
                      p->reduce_ctx);
    if (p->residual) add_residual(&bn->shape, after, p->residual, y);
}

static int same_map(const BatchNormShape *s, const Pool2dShape *pool) {
    return s->n == pool->n && s->c == pool->c && s->h == pool->h && s->w == pool->w;
}

/* BatchNormParams.pool on the CPU: the norm into a buffer of its own, then the pool. */
static void forward_pool_cpu(const BatchNorm *bn, BatchNormMode mode, BatchNormAct act, const BatchNormParams *p,
                             const float *x, float *y) {
    const BatchNormShape *s = &bn->shape;
    float *z = malloc((size_t)s->n * s->c * plane_of(s) * sizeof(float));
    if (!z) TC_FATAL("batchnorm: out of host memory for the output the max-pool after it reads");
    forward_cpu(bn, mode, act, p, x, z);
    maxpool_forward_cpu(&p->pool->shape, z, y);
    free(z);
}

#if TRAINC_CUDA
static const MaxPoolCuda *cuda_pool(const BatchNormParams *p) { return p->pool ? &p->pool->cuda : NULL; }
#endif

static void forward_cuda(const OpContext *ctx, const BatchNorm *bn, BatchNormMode mode, BatchNormAct act,
                         const BatchNormParams *p, const void *x, void *y) {
    if (mode == BN_TRAIN_SYNC)
        GPU_ONLY(batchnorm_forward_train_sync_cuda(&bn->cuda, ctx->cudnn, x, p->gamma, p->beta, p->momentum, p->eps,
                                                   p->running_mean, p->running_var, p->save_mean, p->save_invstd, y,
                                                   p->residual, cuda_pool(p), ctx->stream, p->reduce, p->reduce_ctx,
                                                   act));
    else if (mode == BN_TRAIN_SAVED)
        GPU_ONLY(batchnorm_act_forward_saved_cuda(&bn->cuda, ctx->cudnn, act, x, p->gamma, p->beta, p->save_mean,
                                                  p->save_invstd, y, p->residual, cuda_pool(p), ctx->stream));
    else if (mode == BN_TRAIN)
        GPU_ONLY(batchnorm_act_forward_train_cuda(&bn->cuda, ctx->cudnn, act, x, p->gamma, p->beta, p->momentum,
                                                  p->eps, p->running_mean, p->running_var, p->save_mean,
                                                  p->save_invstd, y, p->residual, cuda_pool(p), ctx->stream));
    else
        GPU_ONLY(batchnorm_act_forward_eval_cuda(&bn->cuda, ctx->cudnn, act, x, p->gamma, p->beta, p->running_mean,
                                                 p->running_var, p->eps, y, p->residual, cuda_pool(p), ctx->stream));
}

int batchnorm_pool_supported(const OpContext *ctx, const Pool2dShape *pool) {
    /* The pool's own kernels are those that keep window positions. */
    return ctx->device == DEVICE_CPU || (ctx->nhwc && maxpool_scratch_bytes(ctx, pool) > 0);
}

static void check_act(BatchNormAct act) {
    if (act == BN_ACT_ADD_RELU)
        TC_FATAL("batchnorm: BN_ACT_ADD_RELU is backward only (its forward is BN_ACT_RELU with p->residual)");
    if (act != BN_ACT_NONE && act != BN_ACT_RELU && act != BN_ACT_GELU)
        TC_FATAL("batchnorm: unknown activation %d", (int)act);
}

static void check_backward_act(BatchNormMode mode, BatchNormAct act, const BatchNormParams *p, const void *y) {
    if (act != BN_ACT_ADD_RELU) check_act(act);
    else if (!y || !p->dy_masked) TC_FATAL("batchnorm+add+relu backward: y (the add's output) and p->dy_masked are needed");
    if (p->relu_coef && (act != BN_ACT_RELU || y || mode == BN_TRAIN_SYNC))
        TC_FATAL("batchnorm backward: a prologue's scale and bias (relu_coef) go with BN_ACT_RELU, no y and no "
                 "BN_TRAIN_SYNC");
}

void batchnorm_forward(const OpContext *ctx, const BatchNorm *bn, BatchNormMode mode, BatchNormAct act,
                       const BatchNormParams *p, const void *x, void *y) {
    if (mode == BN_TRAIN_SYNC && !p->reduce) TC_FATAL("batchnorm: BN_TRAIN_SYNC without a reduce");
    check_act(act);
    if (p->pool && !same_map(&bn->shape, &p->pool->shape))
        TC_FATAL("batchnorm: the max-pool in the norm's pass is for a %dx%dx%dx%d input, the norm's is %dx%dx%dx%d",
                 p->pool->shape.n, p->pool->shape.c, p->pool->shape.h, p->pool->shape.w, bn->shape.n, bn->shape.c,
                 bn->shape.h, bn->shape.w);
    if (p->pool && (p->residual || act == BN_ACT_GELU || !batchnorm_pool_supported(ctx, &p->pool->shape)))
        TC_FATAL("batchnorm: the max-pool in the norm's pass takes a ReLU or no activation, no residual, and on the "
                 "GPU channels-last data its own kernels take (batchnorm_pool_supported)");
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU && p->pool) forward_pool_cpu(bn, mode, act, p, x, y);
    else if (ctx->device == DEVICE_CPU) forward_cpu(bn, mode, act, p, x, y);
    else forward_cuda(ctx, bn, mode, act, p, x, y);
    op_end(ctx, __func__);
}

static void backward_cuda(const OpContext *ctx, const BatchNorm *bn, BatchNormMode mode, BatchNormAct act,
                          const BatchNormParams *p, const void *x, const void *y, const void *dy, void *dx,
                          int accumulate_dx, void *dgamma, void *dbeta) {
    if (mode == BN_TRAIN_SYNC)
        GPU_ONLY(batchnorm_backward_sync_cuda(&bn->cuda, ctx->cudnn, x, y, dy, p->dy_masked, p->gamma, p->beta,
                                              p->save_mean, p->save_invstd, dx, accumulate_dx, dgamma, dbeta,
                                              ctx->dtype, ctx->stream, p->reduce, p->reduce_ctx, act));
    else
        GPU_ONLY(batchnorm_act_backward_cuda(&bn->cuda, ctx->cudnn, act, x, y, dy, p->dy_masked, p->gamma, p->beta,
                                             p->relu_coef, p->save_mean, p->save_invstd, dx, accumulate_dx, dgamma,
                                             dbeta, ctx->dtype, ctx->stream));
}

void batchnorm_backward(const OpContext *ctx, const BatchNorm *bn, BatchNormMode mode, BatchNormAct act,
                        const BatchNormParams *p, const void *x, const void *y, const void *dy, void *dx,
                        int accumulate_dx, void *dgamma, void *dbeta) {
    if (mode == BN_TRAIN_SYNC && !p->reduce) TC_FATAL("batchnorm: BN_TRAIN_SYNC without a reduce");
    check_backward_act(mode, act, p, y);
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) {
        if (act == BN_ACT_ADD_RELU) { /* the add's ReLU backward, then the norm's own */
            relu_backward_cpu(y, dy, p->dy_masked, (size_t)bn->shape.n * bn->shape.c * plane_of(&bn->shape));
            dy = p->dy_masked;
            act = BN_ACT_NONE;
        }
        ActBackward a = {act, y, p->beta, p->relu_coef};
        backward(&bn->shape, x, a, dy, p->gamma, p->save_mean, p->save_invstd, dx, accumulate_dx, dgamma, dbeta,
                 mode == BN_TRAIN_SYNC ? p->reduce : NULL, p->reduce_ctx);
    } else {
        backward_cuda(ctx, bn, mode, act, p, x, y, dy, dx, accumulate_dx, dgamma, dbeta);
    }
    op_end(ctx, __func__);
}
