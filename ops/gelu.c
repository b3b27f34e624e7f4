#include "ops/gelu.h"

#include "ops/gelu_math.h"

void gelu_forward_cpu(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = (float)gelu_value_d(x[i]);
}

void gelu_backward_cpu(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] = (float)(dy[i] * gelu_grad_d(x[i]));
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
