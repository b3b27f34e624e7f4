/* One parameter's Adam or AdamW update (ops/adamw.h), shared by the CPU
 * reference and the CUDA kernel so both run the same expression in the same
 * order: torch's single-tensor step (exp_avg.lerp_, exp_avg_sq.mul_().addcmul_,
 * param.addcdiv_), the step's scalars made once per step. */
#ifndef TRAINC_OPS_ADAMW_MATH_H
#define TRAINC_OPS_ADAMW_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ADAMW_HOST_DEVICE __host__ __device__
#else
#define ADAMW_HOST_DEVICE
#endif

/* A product rounded on its own, never fused into the next add (PyTorch's
 * separate unscale, clip and accumulation passes round each). */
static inline ADAMW_HOST_DEVICE float adamw_mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* What every parameter of a step shares. */
typedef struct {
    float lr;                   /* the schedule's, before a parameter's share */
    float grad_mult;            /* the clip factor, 1 without clipping */
    float inv_scale;            /* 1 / the loss scale */
    float inv_accumulate;       /* 1 / memory.accumulate */
    float one_minus_beta1, beta2, one_minus_beta2, eps;
    float bias_correction1;     /* 1 - beta1^t */
    float bias_correction2_sqrt; /* sqrt(1 - beta2^t) */
    int decoupled;
} AdamwStep;

/* The scalars of step t. 1 - beta is made in double and rounded, as torch
 * rounds its Python floats; so are the bias corrections. */
static inline ADAMW_HOST_DEVICE AdamwStep adamw_step_scalars(float lr, float grad_mult, float inv_scale,
                                                            int accumulate, float beta1, float beta2, float eps,
                                                            int decoupled, int64_t t) {
    AdamwStep s;
    s.lr = lr;
    s.grad_mult = grad_mult;
    s.inv_scale = inv_scale;
    s.inv_accumulate = accumulate > 1 ? (float)(1.0 / accumulate) : 1.0f;
    s.one_minus_beta1 = (float)(1.0 - (double)beta1);
    s.beta2 = beta2;
    s.one_minus_beta2 = (float)(1.0 - (double)beta2);
    s.eps = eps;
    s.bias_correction1 = (float)(1.0 - pow((double)beta1, (double)t));
    s.bias_correction2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
    s.decoupled = decoupled;
    return s;
}

/* grad: as the backward pass left it (scaled); share: the parameter's share of
 * lr (not 0); weight_decay: 0 where the mask leaves it out. */
static inline ADAMW_HOST_DEVICE float adamw_update(const AdamwStep *s, float grad, float share, float weight_decay,
                                                  float weight, float *m, float *v) {
    float unscaled = adamw_mul_rn(grad, s->inv_scale);
    float clipped = adamw_mul_rn(unscaled, s->grad_mult);     /* exact when 1 */
    float g = adamw_mul_rn(clipped, s->inv_accumulate);       /* exact when 1 */
    float lr = adamw_mul_rn(s->lr, share), decay = weight_decay / share; /* exact when share is 1 */
    if (s->decoupled) weight = weight * (1.0f - adamw_mul_rn(lr, decay));
    else g = g + decay * weight;
    float mom = *m + s->one_minus_beta1 * (g - *m); /* lerp toward g */
    float sq = adamw_mul_rn(*v, s->beta2) + adamw_mul_rn(s->one_minus_beta2, g) * g;
    float denom = sqrtf(sq) / s->bias_correction2_sqrt + s->eps;
    float step_size = lr / s->bias_correction1;
    *m = mom;
    *v = sq;
    return weight - adamw_mul_rn(step_size, mom) / denom;
}

#endif
