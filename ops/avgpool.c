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

void avgpool2d_check(const Pool2dShape *s) {
    int k = pool2d_window(s);
    if (s->n < 0 || s->c <= 0 || s->pad < 0 || 2 * s->pad > k || pool2d_out_h(s) < 1 || pool2d_out_w(s) < 1)
        TC_FATAL("avgpool: a %dx%d window at stride %d with padding %d does not fit a %dx%d map (padding at most "
                 "half the window)", k, k, pool2d_stride(s), s->pad, s->h, s->w);
}

/* The outputs whose window holds row (or column) i: [*first, *last]. */
static void covering(int i, int pad, int k, int stride, int out, int *first, int *last) {
    int top = i + pad - k + 1;
    *first = top <= 0 ? 0 : (top + stride - 1) / stride;
    *last = (i + pad) / stride;
    if (*last > out - 1) *last = out - 1;
}

void avgpool2d_forward_cpu(const Pool2dShape *s, const float *x, float *y) {
    avgpool2d_check(s);
    int k = pool2d_window(s), stride = pool2d_stride(s), oh = pool2d_out_h(s), ow = pool2d_out_w(s);
    for (size_t pl = 0; pl < (size_t)s->n * s->c; pl++) {
        const float *xp = x + pl * s->h * s->w;
        for (int p = 0; p < oh; p++)
            for (int q = 0; q < ow; q++) {
                double sum = 0.0;
                for (int i = p * stride - s->pad; i < p * stride - s->pad + k; i++)
                    for (int j = q * stride - s->pad; j < q * stride - s->pad + k; j++)
                        if (i >= 0 && i < s->h && j >= 0 && j < s->w) sum += xp[(size_t)i * s->w + j];
                y[(pl * oh + p) * ow + q] = (float)(sum / (k * k));
            }
    }
}

void avgpool2d_backward_cpu(const Pool2dShape *s, const float *dy, float *dx, int accumulate_dx) {
    avgpool2d_check(s);
    int k = pool2d_window(s), stride = pool2d_stride(s), oh = pool2d_out_h(s), ow = pool2d_out_w(s);
    for (size_t pl = 0; pl < (size_t)s->n * s->c; pl++) {
        const float *dyp = dy + pl * oh * ow;
        for (int i = 0; i < s->h; i++)
            for (int j = 0; j < s->w; j++) {
                int p0, p1, q0, q1;
                covering(i, s->pad, k, stride, oh, &p0, &p1);
                covering(j, s->pad, k, stride, ow, &q0, &q1);
                double sum = 0.0;
                for (int p = p0; p <= p1; p++)
                    for (int q = q0; q <= q1; q++) sum += dyp[p * ow + q];
                float g = (float)(sum / (k * k)), *at = dx + (pl * s->h + i) * s->w + j;
                *at = accumulate_dx ? *at + g : g;
            }
    }
}

void avgpool2d_forward(const OpContext *ctx, const Pool2dShape *s, const void *x, void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) avgpool2d_forward_cpu(s, x, y);
    else GPU_ONLY(avgpool2d_forward_cuda(ctx->dtype, ctx->nhwc, s, x, y, ctx->stream));
    op_end(ctx, __func__);
}

void avgpool2d_backward(const OpContext *ctx, const Pool2dShape *s, const void *dy, void *dx, int accumulate_dx) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) avgpool2d_backward_cpu(s, dy, dx, accumulate_dx);
    else GPU_ONLY(avgpool2d_backward_cuda(ctx->dtype, ctx->nhwc, s, dy, dx, accumulate_dx, ctx->stream));
    op_end(ctx, __func__);
}
