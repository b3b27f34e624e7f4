#include "ops/adamw.h"

#include "ops/adamw_math.h"
#include "runtime/check.h"

void adamw_count_step_cpu(int64_t *step, const LossScalerState *scaler) {
    if (!scaler || !scaler->found_inf) (*step)++;
}

void adamw_step_mixed_cpu(float *master, const float *grad, float *m, float *v, size_t n, const float *lr,
                          const int64_t *step, const LossScalerState *scaler, AdamwParams p) {
    if (scaler && scaler->found_inf) return;
    if (*step < 1) TC_FATAL("adamw_step_mixed: step count %lld: adamw_count_step comes first", (long long)*step);
    AdamwStep s = adamw_step_scalars(*lr, p.grad_mult ? *p.grad_mult : 1.0f, scaler ? 1.0f / scaler->scale : 1.0f,
                                     p.accumulate, p.beta1, p.beta2, p.eps, p.decoupled, *step);
    for (size_t i = 0; i < n; i++) {
        float share = p.lr_scale ? p.lr_scale[i] : 1.0f;
        if (share == 0.0f) continue; /* frozen */
        float decay = p.decay_mask && !p.decay_mask[i] ? 0.0f : p.weight_decay;
        master[i] = adamw_update(&s, grad[i], share, decay, master[i], &m[i], &v[i]);
    }
}

void adamw_count_step(const OpContext *ctx, int64_t *step, const LossScalerState *scaler) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) adamw_count_step_cpu(step, scaler);
    else GPU_ONLY(adamw_count_step_cuda(step, scaler, ctx->stream));
    op_end(ctx, __func__);
}

void adamw_step_mixed(const OpContext *ctx, float *master, const void *grad, float *m, float *v, void *weights_half,
                      size_t n, const float *lr, const int64_t *step, const LossScalerState *scaler, AdamwParams p) {
    if (ctx->device == DEVICE_CPU && weights_half)
        TC_FATAL("adamw_step_mixed: the CPU path keeps no half-precision weights");
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) adamw_step_mixed_cpu(master, grad, m, v, n, lr, step, scaler, p);
    else GPU_ONLY(adamw_step_mixed_cuda(master, grad, ctx->dtype, m, v, weights_half, ctx->dtype, n, lr, step, scaler,
                                        p, ctx->stream));
    op_end(ctx, __func__);
}
