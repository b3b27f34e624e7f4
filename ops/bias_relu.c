#include "ops/bias_relu.h"

#include <stddef.h>

void bias_relu_forward_cpu(const float *b, float *y, int n, int c, int plane, int nhwc) {
    size_t total = (size_t)n * c * plane;
    for (size_t i = 0; i < total; i++) {
        int channel = nhwc ? (int)(i % c) : (int)(i / plane % c);
        float v = y[i] + b[channel];
        y[i] = v < 0.0f ? 0.0f : v;
    }
}
