#include "tests/model_checks.h"

#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"
#include "tests/op_checks.h"

double model_loss(void *model_loss) {
    ModelLoss *l = model_loss;
    memcpy(model_input_buffer(l->m), l->input, model_input_floats(l->m) * sizeof(float));
    model_forward(l->m);
    return weighted_sum(model_logits(l->m), l->r, (size_t)l->m->batch * l->m->num_classes);
}

void model_loss_backward(ModelLoss *l) {
    model_loss(l);
    memcpy(model_logits_grad(l->m), l->r, (size_t)l->m->batch * l->m->num_classes * sizeof(float));
    model_zero_grads(l->m);
    model_backward(l->m);
}

ModelLoss model_loss_random(Model *m, uint64_t *rng) {
    size_t n_input = model_input_floats(m), n_r = (size_t)m->batch * m->num_classes;
    float *buf = malloc((n_input + n_r) * sizeof(float));
    if (!buf) abort();
    test_fill_uniform(buf, n_input, rng, -2.0f, 2.0f);
    test_fill_uniform(buf + n_input, n_r, rng, -1.0f, 1.0f);
    return (ModelLoss){m, buf, buf + n_input};
}

void model_loss_free(ModelLoss *l) { free((void *)l->input); }
