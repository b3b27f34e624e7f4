#include "ops/grad_norm.h"

#include <math.h>

void grad_clip_factor_cpu(const float *grads, size_t n, float inv_scale_times, float clip_norm,
                          float *norm_out, float *factor_out) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)grads[i] * grads[i];
    double norm = sqrt(sum) * inv_scale_times;
    double factor = 1;
    if (isfinite(norm)) factor = fmin(1.0, clip_norm / (norm + 1e-6));
    *norm_out = (float)norm;
    *factor_out = (float)factor;
}
