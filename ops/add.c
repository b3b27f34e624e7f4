#include "ops/add.h"

void add_forward_cpu(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* s < 0 ? 0 : s, as relu_forward_cpu: NaN passes through. */
void add_relu_forward_cpu(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float s = a[i] + b[i];
        y[i] = s < 0.0f ? 0.0f : s;
    }
}

void add_accumulate_cpu(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void add_forward(const OpContext *ctx, const void *a, const void *b, void *y, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) add_forward_cpu(a, b, y, n);
    else GPU_ONLY(add_forward_cuda(ctx->dtype, a, b, y, n, ctx->stream));
    op_end(ctx, __func__);
}

void add_relu_forward(const OpContext *ctx, const void *a, const void *b, void *y, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) add_relu_forward_cpu(a, b, y, n);
    else GPU_ONLY(add_relu_forward_cuda(ctx->dtype, a, b, y, n, ctx->stream));
    op_end(ctx, __func__);
}

void add_accumulate(const OpContext *ctx, void *dst, const void *src, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) add_accumulate_cpu(dst, src, n);
    else GPU_ONLY(add_accumulate_cuda(ctx->dtype, dst, src, n, ctx->stream));
    op_end(ctx, __func__);
}
