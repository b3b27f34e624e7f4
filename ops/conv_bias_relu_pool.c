/* conv_bias_relu_pool's CPU reference and its face. */
#include "ops/conv_bias_relu_pool.h"

#include <stdlib.h>

#include "ops/bias_relu_pool.h"
#include "runtime/check.h"

/* The shape's checks, both paths; NULL when it fits. */
static const char *shape_misfit(const ConvBiasReluPoolShape *s) {
    const Conv2dShape *c = &s->conv;
    if (c->n <= 0 || c->c <= 0 || c->k <= 0 || c->h < 2 || c->w < 2) return "an empty tensor";
    if (conv2d_groups(c) > 1) return "a grouped convolution";
    if (c->r != 3 || c->s != 3 || c->pad != 1 || c->stride != 1) return "not a 3x3 convolution, pad 1, stride 1";
    if (c->h % 2 || c->w % 2) return "an odd height or width under the 2x2 pool";
    if (s->c_real < 1 || s->c_real > c->c) return "c_real outside 1..c";
    return NULL;
}

static const char *cuda_misfit(DType dtype, int nhwc, const ConvBiasReluPoolShape *s) {
    if (dtype != DTYPE_F16 && dtype != DTYPE_BF16) return "the CUDA path is f16 or bf16 only";
    if (!nhwc) return "the CUDA path is NHWC only";
    if (s->conv.c != 8) return "the CUDA path takes 8 channels (the padded input)";
    if (s->c_real > 3) return "the CUDA path takes at most 3 real channels (27 taps in 32)";
    if (s->conv.k % 8 || s->conv.k > 64) return "the CUDA path takes k a multiple of 8 up to 64";
    return NULL;
}

int conv_bias_relu_pool_supported(const OpContext *ctx, const ConvBiasReluPoolShape *s, const char **why) {
    const char *misfit = shape_misfit(s);
    if (!misfit && ctx->device == DEVICE_CPU && s->c_real != s->conv.c) misfit = "c_real differs from c on the CPU";
    if (!misfit && ctx->device == DEVICE_CUDA) misfit = cuda_misfit(ctx->dtype, ctx->nhwc, s);
    if (why) *why = misfit;
    return misfit == NULL;
}

static void check_supported(const OpContext *ctx, const ConvBiasReluPoolShape *s) {
    const char *why;
    if (!conv_bias_relu_pool_supported(ctx, s, &why))
        TC_FATAL("conv_bias_relu_pool: %s (n=%d c=%d (%d real) %dx%d k=%d, %dx%d pad %d stride %d)", why, s->conv.n,
                 s->conv.c, s->c_real, s->conv.h, s->conv.w, s->conv.k, s->conv.r, s->conv.s, s->conv.pad,
                 s->conv.stride);
}

size_t conv_bias_relu_pool_workspace_bytes(const OpContext *ctx, const ConvBiasReluPoolShape *s) {
    if (ctx->device == DEVICE_CPU) return 0;
    size_t bytes = 0;
    GPU_ONLY(bytes = conv_bias_relu_pool_workspace_bytes_cuda(s));
    return bytes;
}

/* The convolution's output, which the reference keeps (the CUDA path does not). */
static float *conv_output(const ConvBiasReluPoolShape *s, const float *x, const float *w) {
    const Conv2dShape *c = &s->conv;
    float *out = malloc((size_t)c->n * c->k * c->h * c->w * sizeof(float));
    if (!out) TC_FATAL("conv_bias_relu_pool: out of host memory for the reference's convolution output");
    conv2d_forward_cpu(c, x, w, NULL, out);
    return out;
}

static Pool2dShape pool_shape(const ConvBiasReluPoolShape *s) {
    return (Pool2dShape){.n = s->conv.n, .c = s->conv.k, .h = s->conv.h, .w = s->conv.w, .k = 2, .stride = 2};
}

void conv_bias_relu_pool_forward_cpu(const ConvBiasReluPoolShape *s, const float *x, const float *w,
                                     const float *b, float *y) {
    OpContext cpu = op_context_cpu();
    check_supported(&cpu, s);
    float *conv = conv_output(s, x, w);
    Pool2dShape ps = pool_shape(s);
    bias_relu_pool_forward_cpu(&ps, 0, conv, b, y);
    free(conv);
}

void conv_bias_relu_pool_backward_cpu(const ConvBiasReluPoolShape *s, const float *x, const float *w,
                                      const float *b, const float *dy, float *dw, float *db) {
    OpContext cpu = op_context_cpu();
    check_supported(&cpu, s);
    float *conv = conv_output(s, x, w);
    Pool2dShape ps = pool_shape(s);
    bias_relu_pool_backward_cpu(&ps, 0, conv, b, dy, conv); /* the convolution's output gradient, in place */
    conv2d_backward_cpu(&s->conv, x, w, conv, NULL, dw, db);
    free(conv);
}

void conv_bias_relu_pool_forward(const OpContext *ctx, const ConvBiasReluPoolShape *s, const void *x,
                                 const void *w, const void *b, void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) {
        conv_bias_relu_pool_forward_cpu(s, x, w, b, y); /* which checks the shape itself */
    } else {
        check_supported(ctx, s);
        GPU_ONLY(conv_bias_relu_pool_forward_cuda(ctx->dtype, s, x, w, b, y, ctx->stream));
    }
    op_end(ctx, __func__);
}

void conv_bias_relu_pool_backward(const OpContext *ctx, const ConvBiasReluPoolShape *s, const void *x,
                                  const void *w, const void *b, const void *dy, void *dw, void *db) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) {
        conv_bias_relu_pool_backward_cpu(s, x, w, b, dy, dw, db);
    } else {
        check_supported(ctx, s);
        GPU_ONLY(conv_bias_relu_pool_backward_cuda(ctx->dtype, s, x, w, b, dy, dw, db, ctx->workspace, ctx->stream));
    }
    op_end(ctx, __func__);
}
