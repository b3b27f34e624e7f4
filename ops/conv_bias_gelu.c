#include "ops/conv_bias_gelu.h"

#include <stdlib.h>
#include <string.h>

#include "ops/gelu.h"
#include "runtime/check.h"
#include "runtime/gpu.h"

/* Pixels a thread of the CUDA backward sums, about, before its block's partial row is written; at most so
 * many rows (blocks), a few waves on an H100. */
#define PIXELS_PER_THREAD 16
#define MAX_PARTIAL_ROWS 512

void conv_bias_gelu_check_shape(const ConvBiasGeluShape *cs) {
    const Conv2dShape *s = &cs->conv;
    conv2d_check_ungrouped(s, "conv_bias_gelu");
    if (s->n <= 0 || s->c <= 0 || s->k <= 0 || s->k > 65535 || s->r <= 0 || s->s <= 0 || s->stride != 1 ||
        s->pad != 0 || s->h < s->r || s->w < s->s || cs->c_real < 1 || cs->c_real > s->c)
        TC_FATAL("conv_bias_gelu: input %dx%dx%dx%d (%d real channels), %d filters %dx%d, pad %d, stride %d: "
                 "needs stride 1, no padding, the filter within the input, 1 to 65535 filters and 1 to c real "
                 "channels",
                 s->n, s->c, s->h, s->w, cs->c_real, s->k, s->r, s->s, s->pad, s->stride);
}

int conv_bias_gelu_partial_rows(const ConvBiasGeluShape *cs) {
    const Conv2dShape *s = &cs->conv;
    size_t pixels = (size_t)s->n * conv2d_out_h(s) * conv2d_out_w(s);
    size_t per_row = (size_t)CONV_BIAS_GELU_THREADS * PIXELS_PER_THREAD;
    size_t rows = (pixels + per_row - 1) / per_row;
    return rows > MAX_PARTIAL_ROWS ? MAX_PARTIAL_ROWS : (int)rows;
}

static size_t out_floats(const Conv2dShape *s) { return (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s); }

/* z = conv(x, w) + b over the real channels: x with the others zeroed, NCHW. */
static void pre_activation_cpu(const ConvBiasGeluShape *cs, const float *x, const float *w, const float *b,
                               float *z) {
    const Conv2dShape *s = &cs->conv;
    conv_bias_gelu_check_shape(cs);
    if (cs->c_real == s->c) { /* no padding channels (the CPU's NCHW image): no copy */
        conv2d_forward_cpu(s, x, w, b, z);
        return;
    }
    size_t plane = (size_t)s->h * s->w, image = plane * s->c, real = plane * cs->c_real;
    float *xr = malloc(image * s->n * sizeof(float));
    if (!xr) TC_FATAL("conv_bias_gelu: out of host memory (%zu floats)", image * s->n);
    for (int n = 0; n < s->n; n++) {
        memcpy(xr + n * image, x + n * image, real * sizeof(float));
        memset(xr + n * image + real, 0, (image - real) * sizeof(float));
    }
    conv2d_forward_cpu(s, xr, w, b, z);
    free(xr);
}

void conv_bias_gelu_forward_cpu(const ConvBiasGeluShape *s, const float *x, const float *w, const float *b,
                                float *y) {
    pre_activation_cpu(s, x, w, b, y);
    gelu_forward_cpu(y, y, out_floats(&s->conv));
}

void conv_bias_gelu_backward_cpu(const ConvBiasGeluShape *s, const float *x, const float *w, const float *b,
                                 const float *dy, float *db) {
    size_t n = out_floats(&s->conv);
    float *dz = malloc(n * sizeof(float));
    if (!dz) TC_FATAL("conv_bias_gelu: out of host memory (%zu floats)", n);
    pre_activation_cpu(s, x, w, b, dz);
    gelu_backward_cpu(dz, dy, dz, n);
    conv2d_bias_grad_cpu(&s->conv, dz, db);
    free(dz);
}

size_t conv_bias_gelu_workspace_bytes(const OpContext *ctx, const ConvBiasGeluShape *s) {
    conv_bias_gelu_check_shape(s);
    if (ctx->device == DEVICE_CPU) return 0;
    return (size_t)conv_bias_gelu_partial_rows(s) * s->conv.k * sizeof(float);
}

void conv_bias_gelu_forward(const OpContext *ctx, const ConvBiasGeluShape *s, const void *x, const void *w,
                            const void *b, void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) conv_bias_gelu_forward_cpu(s, x, w, b, y);
    else GPU_ONLY(conv_bias_gelu_forward_cuda(ctx->dtype, ctx->nhwc, s, x, w, b, y, ctx->stream));
    op_end(ctx, __func__);
}

void conv_bias_gelu_backward(const OpContext *ctx, const ConvBiasGeluShape *s, const void *x, const void *w,
                             const void *b, const void *dy, void *db) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) conv_bias_gelu_backward_cpu(s, x, w, b, dy, db);
    else GPU_ONLY(conv_bias_gelu_backward_cuda(ctx->dtype, ctx->nhwc, s, x, w, b, dy, db, ctx->workspace,
                                               ctx->stream));
    op_end(ctx, __func__);
}
