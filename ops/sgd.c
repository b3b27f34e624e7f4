#include "ops/sgd.h"

void sgd_step_cpu(float *w, const float *grad, float *m, size_t n, const float *lr,
                  SgdParams p) {
    float step = *lr;
    float mult = p.grad_mult ? *p.grad_mult : 1.0f;
    for (size_t i = 0; i < n; i++) {
        float decay = p.decay_mask && !p.decay_mask[i] ? 0.0f : p.weight_decay;
        float clipped = grad[i] * mult; /* exact when mult is 1 */
        float g = clipped + decay * w[i];
        float mom = p.momentum * m[i] + g;
        float d = p.nesterov ? g + p.momentum * mom : mom;
        m[i] = mom;
        w[i] = w[i] - step * d;
    }
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
        float decay = p.decay_mask && !p.decay_mask[i] ? 0.0f : p.weight_decay;
        float g = clipped + decay * master[i];
        float mom = p.momentum * momentum[i] + g;
        float d = p.nesterov ? g + p.momentum * mom : mom;
        momentum[i] = mom;
        master[i] = master[i] - step * d;
    }
}
