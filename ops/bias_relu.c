#include "ops/bias_relu.h"

#include <stddef.h>

void bias_relu_forward_cpu(const float *b, float *y, int n, int c, int plane, int nhwc) {
    size_t total = (size_t)n * c * plane;
    for (size_t i = 0; i < total; i++) {
        int channel = nhwc ? (int)(i % c) : (int)(i / plane % c);
        float v = y[i] + b[channel];
        y[i] = v < 0.0f ? 0.0f : v;
    }
}

void bias_relu_forward(const OpContext *ctx, const void *b, void *y, int n, int c, int plane) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) bias_relu_forward_cpu(b, y, n, c, plane, ctx->nhwc);
    else GPU_ONLY(bias_relu_forward_cuda(ctx->dtype, ctx->nhwc, b, y, n, c, plane, ctx->stream));
    op_end(ctx, __func__);
}
