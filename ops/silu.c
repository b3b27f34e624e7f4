#include "ops/silu.h"

#include <math.h>

/* 1 / (1 + exp(-x)) in double: exp(-x) overflows to inf for x < -709, giving 0, as it should. */
static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

void silu_forward_cpu(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = (float)(x[i] * sigmoid_d(x[i]));
}

void silu_backward_cpu(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double s = sigmoid_d(x[i]);
        dx[i] = (float)(dy[i] * s * (1.0 + x[i] * (1.0 - s)));
    }
}

void silu_forward(const OpContext *ctx, const void *x, void *y, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) silu_forward_cpu(x, y, n);
    else GPU_ONLY(silu_forward_cuda(ctx->dtype, x, y, n, ctx->stream));
    op_end(ctx, __func__);
}

void silu_backward(const OpContext *ctx, const void *x, const void *dy, void *dx, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) silu_backward_cpu(x, dy, dx, n);
    else GPU_ONLY(silu_backward_cuda(ctx->dtype, x, dy, dx, n, ctx->stream));
    op_end(ctx, __func__);
}
