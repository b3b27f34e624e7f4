#include "ops/bias_relu_pool.h"

#include <stddef.h>

#include "runtime/check.h"

void bias_relu_pool_check_shape(const Pool2dShape *s) {
    if (s->n <= 0 || s->c <= 0 || s->h < 2 || s->w < 2 || s->h % 2 || s->w % 2 || pool2d_window(s) != 2 ||
        pool2d_stride(s) != 2 || s->pad)
        TC_FATAL("bias_relu_pool: 2x2 stride-2 windows over an even size only (got n=%d c=%d %dx%d, window %d "
                 "stride %d pad %d)", s->n, s->c, s->h, s->w, pool2d_window(s), pool2d_stride(s), s->pad);
}

/* Where the four inputs of output (n, c, p, q) lie, in window order: top left,
 * top right, bottom left, bottom right (the order "first maximum" counts in). */
static void window(const Pool2dShape *s, int nhwc, int n, int c, int p, int q, size_t at[4]) {
    size_t row = nhwc ? (size_t)s->w * s->c : (size_t)s->w, col = nhwc ? (size_t)s->c : 1;
    size_t top = nhwc ? (((size_t)n * s->h + 2 * p) * s->w + 2 * q) * s->c + c
                      : (((size_t)n * s->c + c) * s->h + 2 * p) * s->w + 2 * q;
    at[0] = top, at[1] = top + col, at[2] = top + row, at[3] = top + row + col;
}

static size_t out_index(const Pool2dShape *s, int nhwc, int n, int c, int p, int q) {
    int oh = s->h / 2, ow = s->w / 2;
    return nhwc ? (((size_t)n * oh + p) * ow + q) * s->c + c : (((size_t)n * s->c + c) * oh + p) * ow + q;
}

/* The window's first maximum of x + b; its value through *max. */
static int first_max(const float *x, const size_t at[4], float b, float *max) {
    int best = 0;
    for (int i = 1; i < 4; i++)
        if (x[at[i]] + b > x[at[best]] + b) best = i;
    *max = x[at[best]] + b;
    return best;
}

/* Forward (y) or backward (dy and dx): one walk over the windows. */
static void walk_windows(const Pool2dShape *s, int nhwc, const float *x, const float *b, const float *dy, float *y,
                         float *dx) {
    bias_relu_pool_check_shape(s);
    for (int n = 0; n < s->n; n++)
        for (int c = 0; c < s->c; c++)
            for (int p = 0; p < s->h / 2; p++)
                for (int q = 0; q < s->w / 2; q++) {
                    size_t at[4], o = out_index(s, nhwc, n, c, p, q);
                    float max;
                    window(s, nhwc, n, c, p, q, at);
                    int best = first_max(x, at, b[c], &max);
                    if (y) {
                        y[o] = max > 0.0f ? max : 0.0f;
                        continue;
                    }
                    float g = max > 0.0f ? dy[o] : 0.0f;
                    for (int i = 0; i < 4; i++) dx[at[i]] = i == best ? g : 0.0f;
                }
}

void bias_relu_pool_forward_cpu(const Pool2dShape *s, int nhwc, const float *x, const float *b, float *y) {
    walk_windows(s, nhwc, x, b, NULL, y, NULL);
}

void bias_relu_pool_backward_cpu(const Pool2dShape *s, int nhwc, const float *x, const float *b,
                                 const float *dy, float *dx) {
    walk_windows(s, nhwc, x, b, dy, NULL, dx);
}

void bias_relu_pool_forward(const OpContext *ctx, const Pool2dShape *s, const void *x, const void *b, void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) bias_relu_pool_forward_cpu(s, ctx->nhwc, x, b, y);
    else GPU_ONLY(bias_relu_pool_forward_cuda(ctx->dtype, s, ctx->nhwc, x, b, y, ctx->stream));
    op_end(ctx, __func__);
}

void bias_relu_pool_backward(const OpContext *ctx, const Pool2dShape *s, const void *x, const void *b,
                             const void *dy, void *dx) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) bias_relu_pool_backward_cpu(s, ctx->nhwc, x, b, dy, dx);
    else GPU_ONLY(bias_relu_pool_backward_cuda(ctx->dtype, s, ctx->nhwc, x, b, dy, dx, ctx->stream));
    op_end(ctx, __func__);
}
