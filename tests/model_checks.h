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

/* Every parameter's gradient of a finalized CPU model against central differences of step eps, on a fresh
 * model_loss_random. */
void check_net_gradients(Model *m, const char *what, float eps, uint64_t *rng);
/* One step of a finalized CPU model on input (its model_input_floats) and labels: cross-entropy, SGD with
 * momentum 0.9 at lr. Returns the loss before the step. */
float model_train_step_cpu(Model *m, const float *input, const int32_t *labels, float lr);
/* Fitting one batch of random images (uniform in [-2, 2]) to labels i % classes, steps steps at lr: the loss must
 * fall below half its first. */
void check_fits_batch(Model *m, const char *what, int steps, float lr, uint64_t *rng);
/* airbench's shipped net (nets/airbench.net) at 32x32 with widths[k] in place of the recipe's width of block
 * k (64, 256, 256): the file's text with its three "blocks.K = airblock W" lines rewritten. Ends the test
 * program when the file has no such lines or does not build. */
void build_airbench(Model *m, int batch, int classes, int nhwc, const int widths[3]);

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
/* run(fuse, checkpoint, input, r) with model.fuse and checkpointed blocks each on and off: the three others within
 * bound of neither (check_train_eval_near), 'net' naming them. */
typedef ModelTrainEval (*ModelVariantRun)(int fuse, int checkpoint, const float *input, const float *r);
void check_fuse_checkpoint_variants(const char *net, ModelVariantRun run, const float *input, const float *r,
                                    double bound);

#endif
