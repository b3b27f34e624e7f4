#include "ops/gelu.h"

#include <math.h>

#define GELU_SQRT1_2 0.70710678118654752440       /* 1 / sqrt(2) */
#define GELU_INV_SQRT_2PI 0.39894228040143267794  /* 1 / sqrt(2 pi) */

void gelu_forward_cpu(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        y[i] = (float)(0.5 * v * (1.0 + erf(v * GELU_SQRT1_2)));
    }
}

void gelu_backward_cpu(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        double cdf = 0.5 * (1.0 + erf(v * GELU_SQRT1_2)), pdf = GELU_INV_SQRT_2PI * exp(-0.5 * v * v);
        dx[i] = (float)(dy[i] * (cdf + v * pdf));
    }
}

void gelu_forward(const OpContext *ctx, const void *x, void *y, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) gelu_forward_cpu(x, y, n);
    else GPU_ONLY(gelu_forward_cuda(ctx->dtype, x, y, n, ctx->stream));
    op_end(ctx, __func__);
}

void gelu_backward(const OpContext *ctx, const void *x, const void *dy, void *dx, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) gelu_backward_cpu(x, dy, dx, n);
    else GPU_ONLY(gelu_backward_cuda(ctx->dtype, x, dy, dx, n, ctx->stream));
    op_end(ctx, __func__);
}
