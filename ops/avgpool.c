#include "ops/avgpool.h"

#include "runtime/check.h"

static void check_shape(int n, int c, int plane) {
    if (n < 0 || c <= 0 || plane <= 0)
        TC_FATAL("avgpool: bad shape n=%d c=%d plane=%d", n, c, plane);
}

void avgpool_forward_cpu(const float *x, float *y, int n, int c, int plane) {
    check_shape(n, c, plane);
    size_t rows = (size_t)n * c;
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * plane;
        double sum = 0.0;
        for (int p = 0; p < plane; p++) sum += xr[p];
        y[r] = (float)(sum / plane);
    }
}

void avgpool_backward_cpu(const float *dy, float *dx, int accumulate_dx, int n, int c, int plane) {
    check_shape(n, c, plane);
    size_t rows = (size_t)n * c;
    for (size_t r = 0; r < rows; r++) {
        float g = dy[r] / (float)plane;
        float *dxr = dx + r * plane;
        for (int p = 0; p < plane; p++) dxr[p] = accumulate_dx ? dxr[p] + g : g;
    }
}

void avgpool_forward(const OpContext *ctx, const void *x, void *y, int n, int c, int plane) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) avgpool_forward_cpu(x, y, n, c, plane);
    else GPU_ONLY(avgpool_forward_cuda(ctx->dtype, ctx->nhwc, x, y, n, c, plane, ctx->stream));
    op_end(ctx, __func__);
}

void avgpool_backward(const OpContext *ctx, const void *dy, void *dx, int accumulate_dx, int n, int c, int plane) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) avgpool_backward_cpu(dy, dx, accumulate_dx, n, c, plane);
    else GPU_ONLY(avgpool_backward_cuda(ctx->dtype, ctx->nhwc, dy, dx, accumulate_dx, n, c, plane, ctx->stream));
    op_end(ctx, __func__);
}
