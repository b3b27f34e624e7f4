/* conv_bias_act's CPU reference and its face. */
#include "ops/conv_bias_act.h"

#include <string.h>

#include "ops/add.h"
#include "ops/relu.h"
#include "runtime/check.h"

void conv_bias_act_forward_cpu(const ConvBiasActShape *s, const float *x, const float *w, const float *b,
                               const float *z, float *y) {
    if (s->residual && !z) TC_FATAL("conv_bias_act: residual shape without z");
    const Conv2dShape *cs = &s->conv;
    conv2d_forward_cpu(cs, x, w, b, y);
    size_t count = (size_t)cs->n * cs->k * conv2d_out_h(cs) * conv2d_out_w(cs);
    if (s->residual && s->relu) add_relu_forward_cpu(y, z, y, count);
    else if (s->residual) add_forward_cpu(y, z, y, count);
    else if (s->relu) relu_forward_cpu(y, y, count);
}

void conv_bias_act_init(const OpContext *ctx, ConvBiasAct *op, const ConvBiasActShape *s,
                        const ConvAlgoPolicy *policy) {
    ConvBiasActShape shape = *s; /* s may be op's own */
    memset(op, 0, sizeof *op);
    op->shape = shape;
    if (ctx->device == DEVICE_CUDA)
        GPU_ONLY(conv_bias_act_cuda_init(&op->cuda, ctx->cudnn, &shape, ctx->dtype, ctx->nhwc, policy));
}

void conv_bias_act_destroy(const OpContext *ctx, ConvBiasAct *op) {
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(conv_bias_act_cuda_destroy(&op->cuda));
}

size_t conv_bias_act_workspace_bytes(const OpContext *ctx, const ConvBiasAct *op) {
    return ctx->device == DEVICE_CUDA ? op->cuda.workspace_bytes : 0;
}

int conv_bias_act_fused(const ConvBiasAct *op) { return op->cuda.fused; }

void conv_bias_act_forward(const OpContext *ctx, const ConvBiasAct *op, const void *x, const void *w,
                           const void *b, const void *z, void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) conv_bias_act_forward_cpu(&op->shape, x, w, b, z, y);
    else GPU_ONLY(conv_bias_act_forward_cuda(&op->cuda, ctx->cudnn, x, w, b, z, y, ctx->workspace));
    op_end(ctx, __func__);
}
