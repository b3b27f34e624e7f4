#include "ops/dropout.h"

#include <math.h>

#include "ops/dropout_math.h"
#include "runtime/check.h"

uint32_t dropout_threshold(float p) {
    double t = floor((double)p * 4294967296.0 + 0.5);
    return t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
}

float dropout_scale(float p) { return 1.0f / (1.0f - p); }

void dropout_check(const DropoutShape *s, const DropoutMask *k) {
    if (!(k->p >= 0.0f && k->p < 1.0f)) TC_FATAL("dropout: p = %g, not in [0, 1)", k->p);
    if (s->n < 0 || s->c <= 0 || s->plane <= 0)
        TC_FATAL("dropout: bad shape n=%d c=%d plane=%d", s->n, s->c, s->plane);
}

void dropout_apply_cpu(const DropoutShape *s, int nhwc, const DropoutMask *k, const DropoutCounter *counter,
                       const float *x, float *y, int accumulate) {
    dropout_check(s, k);
    uint64_t key = dropout_key(counter->seed, k->layer, counter->step);
    uint32_t threshold = dropout_threshold(k->p);
    float scale = dropout_scale(k->p);
    size_t n = (size_t)s->n * s->c * s->plane;
    for (size_t i = 0; i < n; i++) {
        float v = dropout_keep(key, dropout_nchw_index(i, s->c, s->plane, nhwc), threshold) ? x[i] * scale : 0.0f;
        y[i] = accumulate ? y[i] + v : v;
    }
}

void dropout_forward(const OpContext *ctx, const DropoutShape *s, const DropoutMask *k, const DropoutCounter *counter,
                     const void *x, void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) dropout_apply_cpu(s, ctx->nhwc, k, counter, x, y, 0);
    else GPU_ONLY(dropout_apply_cuda(ctx->dtype, s, ctx->nhwc, k, counter, x, y, 0, ctx->stream));
    op_end(ctx, __func__);
}

void dropout_backward(const OpContext *ctx, const DropoutShape *s, const DropoutMask *k,
                      const DropoutCounter *counter, const void *dy, void *dx, int accumulate) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) dropout_apply_cpu(s, ctx->nhwc, k, counter, dy, dx, accumulate);
    else GPU_ONLY(dropout_apply_cuda(ctx->dtype, s, ctx->nhwc, k, counter, dy, dx, accumulate, ctx->stream));
    op_end(ctx, __func__);
}

void dropout_advance(const OpContext *ctx, DropoutCounter *counter) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) counter->step += 1;
    else GPU_ONLY(dropout_advance_cuda(counter, ctx->stream));
    op_end(ctx, __func__);
}
