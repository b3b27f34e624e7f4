/* conv_genstats' and bn_finalize's CPU references and their faces. */
#include "ops/conv_genstats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"

void conv_genstats_prologue_cpu(const Conv2dShape *s, const float *x, const float *scale, const float *bias,
                                float *out) {
    size_t plane = (size_t)s->h * s->w;
    for (int n = 0; n < s->n; n++)
        for (int c = 0; c < s->c; c++) {
            size_t base = ((size_t)n * s->c + c) * plane;
            for (size_t i = 0; i < plane; i++) {
                float v = bn_prologue_input(x[base + i], scale[c], bias[c]);
                out[base + i] = v < 0.0f ? 0.0f : v; /* NaN passes, as in relu.h */
            }
        }
}

/* Per channel k of y [n][k][plane]: the sums of its values and their squares. */
static void channel_sums_cpu(int n, int k, size_t plane, const float *y, float *sum, float *sqsum) {
    for (int ch = 0; ch < k; ch++) {
        double s1 = 0, s2 = 0;
        for (int i = 0; i < n; i++) {
            const float *row = y + ((size_t)i * k + ch) * plane;
            for (size_t p = 0; p < plane; p++) s1 += row[p], s2 += (double)row[p] * row[p];
        }
        sum[ch] = (float)s1;
        sqsum[ch] = (float)s2;
    }
}

/* x' in new memory (freed by the caller), or NULL without a prologue. */
static float *prologue_copy_cpu(const ConvGenStatsShape *s, const float *x, const float *scale, const float *bias) {
    const Conv2dShape *cs = &s->conv;
    if (!s->prologue) return NULL;
    if (!scale || !bias) TC_FATAL("conv_genstats: a prologue shape without scale and bias");
    float *xp = (float *)malloc(sizeof(float) * cs->n * cs->c * cs->h * cs->w);
    if (!xp) TC_FATAL("conv_genstats: out of host memory for the prologue's %d x %d x %d x %d values", cs->n, cs->c,
                      cs->h, cs->w);
    conv_genstats_prologue_cpu(cs, x, scale, bias, xp);
    return xp;
}

void conv_genstats_forward_cpu(const ConvGenStatsShape *s, const float *x, const float *scale, const float *bias,
                               const float *w, float *y, float *sum, float *sqsum) {
    const Conv2dShape *cs = &s->conv;
    float *xp = prologue_copy_cpu(s, x, scale, bias);
    conv2d_forward_cpu(cs, xp ? xp : x, w, NULL, y);
    channel_sums_cpu(cs->n, cs->k, (size_t)conv2d_out_h(cs) * conv2d_out_w(cs), y, sum, sqsum);
    free(xp);
}

void conv_genstats_backward_filter_cpu(const ConvGenStatsShape *s, const float *x, const float *scale,
                                       const float *bias, const float *dy, float *dw, int accumulate_dw) {
    if (!s->prologue) TC_FATAL("conv_genstats: the filter gradient is for prologue shapes");
    float *xp = prologue_copy_cpu(s, x, scale, bias);
    conv2d_backward_ex_cpu(&s->conv, xp, NULL, dy, NULL, dw, NULL, accumulate_dw ? CONV2D_ADD_DW : 0);
    free(xp);
}

void bn_finalize_cpu(int channels, int64_t m, const float *sum, const float *sqsum, const BatchNormParams *p,
                     float *scale, float *bias) {
    if (m < 2) TC_FATAL("bn_finalize: training needs more than one value per channel (m = %lld)", (long long)m);
    double count = (double)m;
    for (int c = 0; c < channels; c++) {
        double mean = sum[c] / count, var = sqsum[c] / count - mean * mean;
        if (var < 0.0) var = 0.0;
        double invstd = 1.0 / sqrt(var + p->eps), channel_scale = invstd * p->gamma[c];
        if (scale) scale[c] = (float)channel_scale;
        if (bias) bias[c] = (float)(p->beta[c] - mean * channel_scale);
        if (p->save_mean) p->save_mean[c] = (float)mean;
        if (p->save_invstd) p->save_invstd[c] = (float)invstd;
        if (p->momentum != 0.0f && p->running_mean)
            p->running_mean[c] = (float)((1.0 - p->momentum) * p->running_mean[c] + (double)p->momentum * mean);
        if (p->momentum != 0.0f && p->running_var)
            p->running_var[c] = (float)((1.0 - p->momentum) * p->running_var[c] +
                                        (double)p->momentum * var * count / (count - 1.0));
    }
}

/* ---- the faces ------------------------------------------------------------------ */

void conv_genstats_init(const OpContext *ctx, ConvGenStats *op, const ConvGenStatsShape *s,
                        const ConvAlgoPolicy *policy) {
    ConvGenStatsShape shape = *s; /* s may be op's own */
    conv2d_check_ungrouped(&shape.conv, "conv_genstats");
    memset(op, 0, sizeof *op);
    op->shape = shape;
    if (ctx->device == DEVICE_CUDA)
        GPU_ONLY(conv_genstats_cuda_init(&op->cuda, ctx->cudnn, &shape, ctx->dtype, ctx->nhwc, policy));
}

void conv_genstats_destroy(const OpContext *ctx, ConvGenStats *op) {
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(conv_genstats_cuda_destroy(&op->cuda));
}

size_t conv_genstats_workspace_bytes(const OpContext *ctx, const ConvGenStats *op) {
    return ctx->device == DEVICE_CUDA ? op->cuda.workspace_bytes : 0;
}

int conv_genstats_fused(const ConvGenStats *op) { return op->cuda.fused || op->cuda.direct; }

const char *conv_genstats_path(const ConvGenStats *op) {
    return op->cuda.direct ? "direct kernel" : op->cuda.fused ? "cuDNN graph" : "fallback";
}

int conv_genstats_filter_fused(const ConvGenStats *op) { return op->cuda.filter_fused; }

void conv_genstats_forward(const OpContext *ctx, const ConvGenStats *op, const void *x, const void *scale,
                           const void *bias, const void *w, void *y, float *sum, float *sqsum) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) conv_genstats_forward_cpu(&op->shape, x, scale, bias, w, y, sum, sqsum);
    else
        GPU_ONLY(conv_genstats_forward_cuda(&op->cuda, ctx->cudnn, x, scale, bias, w, y, sum, sqsum,
                                            ctx->workspace));
    op_end(ctx, __func__);
}

void conv_genstats_backward_filter(const OpContext *ctx, const ConvGenStats *op, const void *x, const void *scale,
                                   const void *bias, const void *dy, void *dw, int accumulate_dw) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) conv_genstats_backward_filter_cpu(&op->shape, x, scale, bias, dy, dw, accumulate_dw);
    else
        GPU_ONLY(conv_genstats_backward_filter_cuda(&op->cuda, ctx->cudnn, x, scale, bias, dy, dw, accumulate_dw,
                                                    ctx->workspace));
    op_end(ctx, __func__);
}

void bn_finalize(const OpContext *ctx, int channels, int64_t m, const float *sum, const float *sqsum,
                 const BatchNormParams *p, void *scale, void *bias) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) bn_finalize_cpu(channels, m, sum, sqsum, p, scale, bias);
    else GPU_ONLY(bn_finalize_cuda(ctx->dtype, channels, m, sum, sqsum, p, scale, bias, ctx->stream));
    op_end(ctx, __func__);
}
