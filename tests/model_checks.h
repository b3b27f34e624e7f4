/* Gradient checks of whole models (tests linking the models): the scalar
 * loss sum(logits * r) of a fixed input, and its analytic gradient. */
#ifndef TRAINC_TESTS_MODEL_CHECKS_H
#define TRAINC_TESTS_MODEL_CHECKS_H

#include <stdint.h>

#include "models/model.h"

typedef struct {
    Model *m;
    const float *input, *r; /* r: batch x classes */
} ModelLoss;

/* sum of logits * r (a LossFn, tests/op_checks.h): its gradient with respect to the logits is r. */
double model_loss(void *model_loss);
/* The loss once forward, then backward from r: every parameter's gradient in m->grads. */
void model_loss_backward(ModelLoss *l);
/* A loss over m with a fresh input, uniform in [-2, 2], and r, uniform in
 * [-1, 1], from rng (malloc'd: model_loss_free). */
ModelLoss model_loss_random(Model *m, uint64_t *rng);
void model_loss_free(ModelLoss *l);

/* One training step of a CPU model on input and labels: forward, softmax cross-entropy, backward, SGD with
 * momentum 0.9 at lr. Returns the loss. */
float model_sgd_step(Model *m, const float *input, const int32_t *labels, float lr);

/* A model's training loss, gradients and evaluation logits on one input. */
typedef struct {
    double loss;
    float *grads, *eval_logits; /* n_params; n_logits (batch x classes) */
    size_t n_params, n_logits, bytes; /* bytes: the model's (model_bytes) */
} ModelTrainEval;

/* model_loss_backward, then an evaluation forward of the same input (m is
 * left evaluating); on either device (fp32). */
ModelTrainEval model_train_eval(ModelLoss *l);
/* got's loss, gradients and evaluation logits within a relative 'bound' of want's. */
void check_train_eval_near(const char *what, const ModelTrainEval *got, const ModelTrainEval *want, double bound);
void model_train_eval_free(ModelTrainEval *r);

#endif
