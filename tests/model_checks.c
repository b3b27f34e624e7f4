#include "tests/model_checks.h"

#include <string.h>

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
