#include "ops/sgd.h"

#include "runtime/check.h"

void sgd_step_cpu(float *w, const float *grad, float *m, size_t n, const float *lr,
                  SgdParams p) {
    sgd_step_mixed_cpu(w, grad, m, n, lr, NULL, p); /* scale 1: the unscaling multiplies by exactly 1 */
}

void sgd_step_mixed_cpu(float *master, const float *grad, float *momentum, size_t n,
                        const float *lr, const LossScalerState *scaler, SgdParams p) {
    if (scaler && scaler->found_inf) return;
    float inv_scale = scaler ? 1.0f / scaler->scale : 1.0f;
    float step = *lr;
    float mult = p.grad_mult ? *p.grad_mult : 1.0f;
    for (size_t i = 0; i < n; i++) {
        float unscaled = grad[i] * inv_scale;
        float clipped = unscaled * mult; /* exact when mult is 1 */
        float share = p.lr_scale ? p.lr_scale[i] : 1.0f;
        if (share == 0.0f) continue; /* frozen */
        float decay = p.decay_mask && !p.decay_mask[i] ? 0.0f : p.weight_decay / share; /* exact when share is 1 */
        float g = clipped + decay * master[i];
        float mom = p.momentum * momentum[i] + g;
        float d = p.nesterov ? g + p.momentum * mom : mom;
        momentum[i] = mom;
        master[i] = master[i] - step * share * d;
    }
}

void sgd_step_mixed(const OpContext *ctx, float *master, const void *grad, float *momentum, void *weights_half,
                    size_t n, const float *lr, const LossScalerState *scaler, SgdParams p) {
    if (ctx->device == DEVICE_CPU && weights_half)
        TC_FATAL("sgd_step_mixed: the CPU path keeps no half-precision weights");
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) sgd_step_mixed_cpu(master, grad, momentum, n, lr, scaler, p);
    else GPU_ONLY(sgd_step_mixed_cuda(master, grad, ctx->dtype, momentum, weights_half, ctx->dtype, n, lr, scaler, p,
                                      ctx->stream));
    op_end(ctx, __func__);
}
