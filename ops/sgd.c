#include "ops/sgd.h"

void sgd_step_cpu(float *w, const float *grad, float *m, size_t n, const float *lr,
                  SgdParams p) {
    float step = *lr;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] + p.weight_decay * w[i];
        float mom = p.momentum * m[i] + g;
        float d = p.nesterov ? g + p.momentum * mom : mom;
        m[i] = mom;
        w[i] = w[i] - step * d;
    }
}
