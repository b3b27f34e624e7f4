#include "ops/scale.h"

void scale_cpu(const float *x, float *y, size_t n, float s) {
    for (size_t i = 0; i < n; i++) y[i] = s * x[i];
}

static void scale_any(const OpContext *ctx, const char *op, const void *x, void *y, size_t n, float s) {
    op_begin(ctx, op);
    if (ctx->device == DEVICE_CPU) scale_cpu(x, y, n, s);
    else GPU_ONLY(scale_cuda(ctx->dtype, x, y, n, s, ctx->stream));
    op_end(ctx, op);
}

void scale_forward(const OpContext *ctx, const void *x, void *y, size_t n, float s) {
    scale_any(ctx, "scale_forward", x, y, n, s);
}

void scale_backward(const OpContext *ctx, const void *dy, void *dx, size_t n, float s) {
    scale_any(ctx, "scale_backward", dy, dx, n, s);
}
