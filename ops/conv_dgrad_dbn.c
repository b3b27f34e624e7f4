/* conv_dgrad_dbn's CPU reference and its face. */
#include "ops/conv_dgrad_dbn.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"

void conv_dgrad_dbn_backward_cpu(const Conv2dShape *s, const float *w, const float *dy, const float *x,
                                 const BatchNormParams *p, float *dx, int accumulate_dx, float *dgamma,
                                 float *dbeta) {
    BatchNormShape bn = {s->n, s->c, s->h, s->w};
    size_t count = (size_t)s->n * s->c * s->h * s->w;
    float *g = accumulate_dx ? (float *)malloc(sizeof(float) * count) : dx; /* the norm may write dx over dy */
    if (!g) TC_FATAL("conv_dgrad_dbn: out of host memory for the data gradient's %zu values", count);
    conv2d_backward_ex_cpu(s, NULL, w, dy, g, NULL, NULL, 0);
    batchnorm_act_backward_cpu(&bn, BN_ACT_RELU, x, NULL, g, p->gamma, p->beta, p->save_mean, p->save_invstd, dx,
                               accumulate_dx, dgamma, dbeta);
    if (g != dx) free(g);
}

void conv_dgrad_dbn_init(const OpContext *ctx, ConvDgradDbn *op, const Conv2dShape *s, const ConvAlgoPolicy *policy) {
    Conv2dShape shape = *s; /* s may be op's own */
    conv2d_check_ungrouped(&shape, "conv_dgrad_dbn");
    memset(op, 0, sizeof *op);
    op->shape = shape;
    if (ctx->device == DEVICE_CUDA)
        GPU_ONLY(conv_dgrad_dbn_cuda_init(&op->cuda, ctx->cudnn, &shape, ctx->dtype, ctx->nhwc, policy));
}

void conv_dgrad_dbn_destroy(const OpContext *ctx, ConvDgradDbn *op) {
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(conv_dgrad_dbn_cuda_destroy(&op->cuda));
}

size_t conv_dgrad_dbn_workspace_bytes(const OpContext *ctx, const ConvDgradDbn *op, int accumulate_dx) {
    if (ctx->device != DEVICE_CUDA) return 0;
    return op->cuda.workspace_bytes + (accumulate_dx ? op->cuda.dz_bytes : 0);
}

int conv_dgrad_dbn_fused(const ConvDgradDbn *op) { return op->cuda.fused; }

void conv_dgrad_dbn_backward(const OpContext *ctx, const ConvDgradDbn *op, const void *w, const void *dy,
                             const void *x, const BatchNormParams *p, void *dx, int accumulate_dx, void *dgamma,
                             void *dbeta) {
    if (!p->gamma || !p->beta || !p->save_mean || !p->save_invstd || !dx)
        TC_FATAL("conv_dgrad_dbn: the norm's gamma, beta and saved statistics, and dx, are needed");
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU)
        conv_dgrad_dbn_backward_cpu(&op->shape, w, dy, x, p, dx, accumulate_dx, dgamma, dbeta);
    else
        GPU_ONLY(conv_dgrad_dbn_backward_cuda(&op->cuda, ctx->cudnn, w, dy, x, p, dx, accumulate_dx, dgamma, dbeta,
                                              ctx->dtype, ctx->workspace));
    op_end(ctx, __func__);
}
