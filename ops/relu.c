#include "ops/relu.h"

/* x < 0 ? 0 : x rather than fmaxf(x, 0): a NaN passes through, so a diverging
 * run shows up in the loss instead of being clamped away. */
void relu_forward_cpu(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void relu_backward_cpu(const float *y, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void relu_forward(const OpContext *ctx, const void *x, void *y, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) relu_forward_cpu(x, y, n);
    else GPU_ONLY(relu_forward_cuda(ctx->dtype, x, y, n, ctx->stream));
    op_end(ctx, __func__);
}

void relu_backward(const OpContext *ctx, const void *y, const void *dy, void *dx, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) relu_backward_cpu(y, dy, dx, n);
    else GPU_ONLY(relu_backward_cuda(ctx->dtype, y, dy, dx, n, ctx->stream));
    op_end(ctx, __func__);
}
