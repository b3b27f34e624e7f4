#include "tests/model_checks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/netfile.h"
#include "ops/sgd.h"
#include "ops/softmax_xent.h"
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

void check_net_gradients(Model *m, const char *what, float eps, uint64_t *rng) {
    ModelLoss loss = model_loss_random(m, rng);
    model_loss_backward(&loss);
    float *analytic = malloc(m->n_params * sizeof(float));
    double *numeric = malloc(m->n_params * sizeof(double));
    if (!analytic || !numeric) abort();
    memcpy(analytic, m->grads, m->n_params * sizeof(float));
    numeric_gradient(m->params, m->n_params, eps, model_loss, &loss, numeric);
    check_gradient(what, analytic, numeric, m->n_params);
    model_loss_free(&loss), free(analytic), free(numeric);
}

float model_train_step_cpu(Model *m, const float *input, const int32_t *labels, float lr) {
    float loss;
    SgdParams sgd = {0.9f, 0.0f, 0, NULL, NULL, NULL};
    memcpy(model_input_buffer(m), input, model_input_floats(m) * sizeof(float));
    model_forward(m);
    softmax_xent_cpu(model_logits(m), labels, m->batch, m->num_classes, NULL, &loss, model_logits_grad(m));
    model_zero_grads(m);
    model_backward(m);
    sgd_step_cpu(m->params, m->grads, m->momentum, m->n_params, &lr, sgd);
    return loss;
}

void check_fits_batch(Model *m, const char *what, int steps, float lr, uint64_t *rng) {
    float *input = malloc(model_input_floats(m) * sizeof(float));
    int32_t *labels = malloc((size_t)m->batch * sizeof(int32_t));
    if (!input || !labels) abort();
    test_fill_uniform(input, model_input_floats(m), rng, -2.0f, 2.0f);
    for (int i = 0; i < m->batch; i++) labels[i] = i % m->num_classes;
    float first = model_train_step_cpu(m, input, labels, lr), last = first;
    for (int s = 1; s < steps; s++) last = model_train_step_cpu(m, input, labels, lr);
    printf("%s: loss %.4f after one step, %.4f after %d\n", what, first, last, steps);
    CHECK_MSG(isfinite(last) && last < 0.5f * first, "%s: loss %.4f -> %.4f: the net did not learn", what, first, last);
    free(input), free(labels);
}

/* Through the model's op context: host memory on the CPU, device memory on the GPU. */
static void put(const Model *m, void *dst, const float *host, size_t n) {
    op_copy_from_host(&m->ops, dst, host, n * sizeof(float));
}

static void get(const Model *m, float *host, const void *src, size_t n) {
    op_copy_to_host(&m->ops, host, src, n * sizeof(float));
    op_sync(&m->ops);
}

ModelTrainEval model_train_eval(ModelLoss *l) {
    Model *m = l->m;
    size_t logits = (size_t)m->batch * m->num_classes, in = model_input_floats(m);
    if (m->act_dtype != DTYPE_F32) {
        fprintf(stderr, "model_train_eval: fp32 models only\n");
        exit(1);
    }
    ModelTrainEval r = {0, malloc(m->n_params * sizeof(float)), malloc(logits * sizeof(float)), m->n_params, logits,
                        model_bytes(m)};
    if (!r.grads || !r.eval_logits) {
        fprintf(stderr, "model_train_eval: out of host memory\n");
        exit(1);
    }
    put(m, model_input_buffer(m), l->input, in);
    model_forward(m);
    get(m, r.eval_logits, model_logits(m), logits); /* the training logits, until the evaluation below */
    r.loss = weighted_sum(r.eval_logits, l->r, logits);
    put(m, model_logits_grad(m), l->r, logits);
    model_zero_grads(m);
    model_backward(m);
    get(m, r.grads, m->grads, m->n_params);
    model_set_training(m, 0);
    put(m, model_input_buffer(m), l->input, in);
    model_forward(m);
    get(m, r.eval_logits, model_logits(m), logits);
    return r;
}

void check_train_eval_near(const char *what, const ModelTrainEval *got, const ModelTrainEval *want, double bound) {
    if (got->n_params != want->n_params || got->n_logits != want->n_logits) {
        CHECK_MSG(0, "%s: %zu parameters and %zu logits, want %zu and %zu", what, got->n_params, got->n_logits,
                  want->n_params, want->n_logits);
        return;
    }
    double e_loss = fabs(got->loss - want->loss) / (fabs(want->loss) + 1);
    double e_grad = test_rel_error(got->grads, want->grads, want->n_params);
    double e_eval = test_rel_error(got->eval_logits, want->eval_logits, want->n_logits);
    printf("%s: loss %.9g (want %.9g), gradients %.3g, eval logits %.3g relative; %zu bytes (want's %zu)\n", what,
           got->loss, want->loss, e_grad, e_eval, got->bytes, want->bytes);
    CHECK_MSG(e_loss <= bound && e_grad <= bound && e_eval <= bound,
              "%s: loss %.9g (want %.9g), gradients %.3g, eval logits %.3g relative (bound %.3g)", what, got->loss,
              want->loss, e_grad, e_eval, bound);
}

void model_train_eval_free(ModelTrainEval *r) {
    free(r->grads);
    free(r->eval_logits);
    r->grads = r->eval_logits = NULL;
}

void check_fuse_checkpoint_variants(const char *net, ModelVariantRun run, const float *input, const float *r,
                                    double bound) {
    ModelTrainEval want = run(0, 0, input, r);
    for (int variant = 1; variant < 4; variant++) {
        int fuse = variant & 1, checkpoint = variant >> 1;
        char what[160];
        snprintf(what, sizeof what, "%s fuse %d checkpoint %d against neither", net, fuse, checkpoint);
        ModelTrainEval got = run(fuse, checkpoint, input, r);
        check_train_eval_near(what, &got, &want, bound);
        model_train_eval_free(&got);
    }
    model_train_eval_free(&want);
}

void build_airbench(Model *m, int batch, int classes, int nhwc, const int widths[3]) {
    const char *shipped = netfile_shipped("airbench");
    size_t len = shipped ? strlen(shipped) : 0;
    char *text = malloc(len + 64), err[512];
    if (!shipped || !text) abort();
    const char *from = shipped;
    char *to = text;
    for (int k = 0; k < 3; k++) {
        char use[32];
        snprintf(use, sizeof use, "blocks.%d = airblock ", k);
        const char *at = strstr(from, use), *end = at ? strchr(at, '\n') : NULL;
        if (!end) {
            fprintf(stderr, "build_airbench: nets/airbench.net has no line '%s...'\n", use);
            exit(1);
        }
        to += sprintf(to, "%.*s%s%d", (int)(at - from), from, use, widths[k]);
        from = end;
    }
    strcpy(to, from);
    NetShape shape = {batch, 32, classes, nhwc};
    if (netfile_build(m, "nets/airbench.net", text, &shape, err, sizeof err) != 0) {
        fprintf(stderr, "build_airbench: %s\n", err);
        exit(1);
    }
    free(text);
}
