#include "ops/add.h"

void add_forward_cpu(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* s < 0 ? 0 : s, as relu_forward_cpu: NaN passes through. */
void add_relu_forward_cpu(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float s = a[i] + b[i];
        y[i] = s < 0.0f ? 0.0f : s;
    }
}

void add_accumulate_cpu(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
