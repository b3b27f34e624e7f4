#include "ops/relu.h"

/* x < 0 ? 0 : x rather than fmaxf(x, 0): a NaN passes through, so a diverging
 * run shows up in the loss instead of being clamped away. */
void relu_forward_cpu(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void relu_backward_cpu(const float *y, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
