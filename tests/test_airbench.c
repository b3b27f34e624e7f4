/* airbench's net (nets/airbench.net): its shapes and parameter count at the
 * recipe's widths, the zoo refusing another image size, the blocks' identity
 * (Dirac) start, and, at small widths,
 * the gradient of all parameters against finite differences along random
 * directions and along itself (through the odd max-pool, the global max, the
 * bias-free linear layer and the logit scale; each op's own gradient is
 * checked element by element in the op grid); model.fuse (each batch norm
 * and the whitening convolution running the GELU after it) giving the unfused
 * net's loss, gradients and evaluation logits on the CPU and, with a GPU, on
 * the GPU in NCHW and NHWC (the whitening's plain and window kernels). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers.h"
#include "models/plan.h"
#include "models/whiten.h"
#include "models/zoo.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/model_checks.h"
#include "tests/op_checks.h"

enum { BATCH = 4, CLASSES = 10 };

static void check_shapes(void) {
    Model m;
    char err[256] = "";
    CHECK(model_build(&m, "airbench", BATCH, 32, CLASSES, 0, err, sizeof err) == 0);
    /* Each block's max-pool: 31 -> 15 -> 7 -> 3; then the global max to 1x1. */
    int pooled[4], n_pooled = 0;
    for (int i = 0; i < m.n_layers; i++)
        if (m.layers[i].kind == LAYER_MAXPOOL && n_pooled < 4) pooled[n_pooled++] = m.acts[m.layers[i].out].h;
    CHECK_MSG(n_pooled == 4 && pooled[0] == 15 && pooled[1] == 7 && pooled[2] == 3 && pooled[3] == 1,
              "max-pool outputs %d %d %d %d", pooled[0], pooled[1], pooled[2], pooled[3]);
    CHECK(m.acts[m.layers[0].out].h == 31 && m.acts[m.layers[0].out].c == 24);
    size_t convs = 24 * 64 * 9 + 64 * 64 * 9 + 64 * 256 * 9 + 256 * 256 * 9 + 2 * 256 * 256 * 9;
    size_t want = 24 * 12 + 24 + convs + 2 * 2 * (64 + 256 + 256) + 256 * CLASSES;
    CHECK_MSG(model_param_count(&m) == want, "airbench: %zu parameters, want %zu", model_param_count(&m), want);
    /* Every layer's weights and bias on a 128-byte boundary in half precision, inside the flat buffers. */
    for (int i = 0; i < m.n_layers; i++) {
        const Layer *l = &m.layers[i];
        CHECK_MSG((!l->w_count || l->w_off % 64 == 0) && (!l->b_count || l->b_off % 64 == 0) &&
                      l->b_off >= l->w_off + l->w_count && l->b_off + l->b_count <= m.n_params,
                  "layer %d: weights at %zu, bias at %zu", i, l->w_off, l->b_off);
    }
    const Layer *last = &m.layers[m.n_layers - 1], *head = &m.layers[m.n_layers - 2];
    CHECK(last->kind == LAYER_SCALE && fabsf(last->scale - 1.0f / 9.0f) < 1e-9f);
    CHECK(head->kind == LAYER_LINEAR && head->b_count == 0 && strcmp(head->module, "head") == 0);
    CHECK(m.layers[0].b_count == 24 && strcmp(m.layers[0].module, "whiten") == 0);
    err[0] = 0;
    CHECK(model_build(&m, "airbench", BATCH, 64, CLASSES, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "data.image_size") && strstr(err, "32"), "airbench at 64x64: '%s'", err);
}

/* The loss's slopes along direction v (unit length): central, and one-sided
 * each way; the sum over every parameter, so float32's rounding in one
 * coordinate hardly moves them. */
typedef struct { double central, right, left; } Slopes;

static Slopes directional_slopes(Model *m, ModelLoss *l, const float *v, float eps) {
    float *saved = malloc(m->n_params * sizeof(float));
    memcpy(saved, m->params, m->n_params * sizeof(float));
    double centre = model_loss(l);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] = saved[i] + eps * v[i];
    double up = model_loss(l);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] = saved[i] - eps * v[i];
    double down = model_loss(l);
    memcpy(m->params, saved, m->n_params * sizeof(float));
    free(saved);
    return (Slopes){(up - down) / (2.0 * eps), (up - centre) / eps, (centre - down) / eps};
}

/* Two of a max-pool's candidates nearly tied at the point put a switch within
 * eps of it, and the loss bends there: the one-sided slopes part by far more
 * than the curvature over eps and float32's rounding part them (both well
 * under 0.01; along the gradient, where the slope is large, 0.2% of it).
 * Switches on both sides can leave the one-sided slopes close but move the
 * central one with the step: at half the step it moved 1.3% and 0.7% (seeds
 * 5179 and 1513), against 0.02% at points without. The gradient is then no
 * test of the analytic one. */
static int kinked(Slopes s, Slopes half) {
    return fabs(s.right - s.left) > 2e-2 + 5e-3 * fabs(s.central) ||
           fabs(s.central - half.central) > 2e-2 + 2e-3 * fabs(s.central);
}

/* One draw of the net (PyTorch's default start: the identity filters would
 * pass maxima through unchanged and tie them), its input and the loss's
 * weights, checked along 6 directions; 1 when a switch near the point makes
 * the draw unusable. */
static int check_gradients_at(uint64_t *rng) {
    Model m;
    build_airbench(&m, BATCH, CLASSES, 0, (const int[3]){4, 6, 6});
    for (int i = 0; i < m.n_layers; i++) m.layers[i].dirac = 0;
    model_finalize(&m, NULL, 3);
    ModelLoss loss = model_loss_random(&m, rng);
    model_loss_backward(&loss);
    float *analytic = malloc(m.n_params * sizeof(float)), *v = malloc(m.n_params * sizeof(float));
    memcpy(analytic, m.grads, m.n_params * sizeof(float));
    const Layer *whiten = &m.layers[model_whitening_layer(&m)];
    for (size_t i = 0; i < whiten->w_count; i++) CHECK(analytic[whiten->w_off + i] == 0.0f);
    int kink = 0;
    for (int d = 0; d < 6 && !kink; d++) {
        /* Along the analytic gradient itself, where a wrong one shows most, then random directions. */
        if (d == 0) memcpy(v, analytic, m.n_params * sizeof(float));
        else test_fill_uniform(v, m.n_params, rng, -1.0f, 1.0f);
        /* The whitening weights never train: backward leaves their gradient zero, and the directions
         * leave them alone. */
        memset(v + whiten->w_off, 0, whiten->w_count * sizeof(float));
        double norm = 0, want = 0;
        for (size_t i = 0; i < m.n_params; i++) norm += (double)v[i] * v[i];
        for (size_t i = 0; i < m.n_params; i++) v[i] = (float)(v[i] / sqrt(norm));
        for (size_t i = 0; i < m.n_params; i++) want += (double)analytic[i] * v[i];
        Slopes got = directional_slopes(&m, &loss, v, 1e-4f), half = directional_slopes(&m, &loss, v, 5e-5f);
        printf("  airbench direction %d: analytic slope %.6f, finite differences %.6f (right %.6f, left %.6f; "
               "at half the step %.6f)\n",
               d, want, got.central, got.right, got.left, half.central);
        if ((kink = kinked(got, half))) continue;
        /* Off by the curvature over eps and float32's rounding over eps: a percent or so along the gradient,
         * up to 0.01 along a random direction, whose slope is small; a wrong gradient is off by far more. */
        CHECK_MSG(fabs(got.central - want) <= (d == 0 ? 1e-2 : 5e-2) * fabs(want) + 2e-2,
                  "airbench direction %d: analytic slope %.6g, finite differences %.6g", d, want, got.central);
    }
    model_loss_free(&loss), free(analytic), free(v);
    model_destroy(&m);
    return kink;
}

static void check_gradients(uint64_t *rng) {
    int draws = 1;
    while (check_gradients_at(rng) && draws < 6) {
        printf("  a max-pool's switch near the point: drawn again\n");
        draws++;
    }
    CHECK_MSG(draws < 6, "airbench: a max-pool's switch near the point in each of 6 draws");
}

/* With the whitening frozen (its bias done training), backward skips it and
 * the GELU after it, and the first block's convolution computes no input
 * gradient: every other gradient is the same bits, the whitening bias's 0;
 * unfused and under model.fuse (the GELU run by the whitening layer). */
static void check_frozen_whitening(uint64_t *rng, int fuse) {
    Model m;
    build_airbench(&m, BATCH, CLASSES, 0, (const int[3]){4, 6, 6});
    m.fuse = fuse;
    model_finalize(&m, NULL, 5);
    int prefix = whitening_frozen_prefix(&m);
    CHECK(prefix == 2 && m.layers[prefix].kind == LAYER_CONV && m.layers[prefix - 1].kind == LAYER_GELU);
    ModelLoss loss = model_loss_random(&m, rng);
    model_loss_backward(&loss);
    float *trained = malloc(m.n_params * sizeof(float));
    memcpy(trained, m.grads, m.n_params * sizeof(float));
    model_set_frozen_prefix(&m, prefix);
    CHECK(grad_of(&m, m.layers[prefix].in) == NULL && grad_of(&m, m.layers[prefix].out) != NULL);
    model_loss_backward(&loss);
    const Layer *whiten = &m.layers[0];
    double bias_grad = 0;
    for (size_t i = 0; i < whiten->b_count; i++) bias_grad += fabs(trained[whiten->b_off + i]);
    CHECK_MSG(bias_grad > 0, "the whitening bias's gradient is 0 before freezing");
    size_t differ = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        int in_bias = i >= whiten->b_off && i < whiten->b_off + whiten->b_count;
        if (((float *)m.grads)[i] != (in_bias ? 0.0f : trained[i])) differ++;
    }
    CHECK_MSG(differ == 0, "%zu gradients differ with the whitening frozen", differ);
    model_set_frozen_prefix(&m, 0);
    model_loss_backward(&loss);
    CHECK(memcmp(m.grads, trained, m.n_params * sizeof(float)) == 0);
    model_loss_free(&loss), free(trained);
    model_destroy(&m);
}

/* The blocks' convolutions: the first min(out, in) filters the identity (1 at
 * the centre of their own channel), the rest as PyTorch's default drew them. */
static void check_dirac(void) {
    Model m;
    build_airbench(&m, 2, CLASSES, 0, (const int[3]){8, 6, 6});
    model_finalize(&m, NULL, 4);
    int convs = 0;
    for (int i = 1; i < m.n_layers; i++) {
        const Layer *l = &m.layers[i];
        if (l->kind != LAYER_CONV) continue;
        convs++;
        CHECK(l->dirac);
        int k = l->conv.shape.k, c = l->conv.shape.c, identity = k < c ? k : c, wrong = 0, drawn = 0;
        for (int f = 0; f < k; f++)
            for (int j = 0; j < c * 9; j++) {
                float w = m.params[l->w_off + (size_t)f * c * 9 + j];
                if (f < identity) wrong += w != (j == f * 9 + 4 ? 1.0f : 0.0f);
                else drawn += w != 0.0f;
            }
        CHECK_MSG(wrong == 0, "%s: %d weights of the identity filters wrong", l->module, wrong);
        CHECK_MSG(k == identity || drawn > 0, "%s: the filters past the identity are all zero", l->module);
    }
    CHECK(convs == 6 && !m.layers[0].dirac);
    model_destroy(&m);
}

/* airbench at small widths (fuse: model.fuse): its loss, gradients and
 * evaluation logits; fused, each batch norm and the whitening convolution
 * (ops/conv_bias_gelu, whose backward gives the whitening bias's gradient)
 * runs the GELU after it, whose output shares the layer's storage. */
static ModelTrainEval fuse_run(GpuContext *gpu, int nhwc, int fuse, const float *input, const float *r) {
    Model m;
    build_airbench(&m, BATCH, CLASSES, nhwc, (const int[3]){4, 6, 6});
    m.fuse = fuse;
    m.conv_policy.deterministic = 1;
    model_finalize(&m, gpu, 3);
    int fused = 0;
    for (int i = 0; i + 1 < m.n_layers; i++) {
        const Layer *l = &m.layers[i], *next = &m.layers[i + 1];
        if (l->kind != LAYER_BATCHNORM) continue;
        fused += m.plan->layers[i].act == BN_ACT_GELU && next->kind == LAYER_GELU &&
                 m.plan->layers[i + 1].by_producer && m.acts[next->out].value == m.acts[l->out].value;
    }
    CHECK_MSG(fused == (fuse ? 6 : 0), "airbench fuse %d: %d batch norms run their GELU", fuse, fused);
    const Layer *whiten = &m.layers[0], *gelu = &m.layers[1];
    int whiten_fused = whiten->whitening && m.plan->layers[0].act == BN_ACT_GELU && m.plan->layers[1].by_producer &&
                       m.acts[gelu->out].value == m.acts[whiten->out].value;
    CHECK_MSG(whiten_fused == fuse, "airbench fuse %d: the whitening layer runs its GELU: %d", fuse, whiten_fused);
    ModelLoss loss = {&m, input, r};
    ModelTrainEval run = model_train_eval(&loss);
    model_destroy(&m);
    return run;
}

/* On the GPU in fp32, NCHW and NHWC: fused against unfused (the same cuDNN
 * algorithms, deterministic; only the GELU's rounding differs), and fused
 * against the CPU's fused run (cuDNN's fp32 convolutions round otherwise and
 * six batch norms over few values amplify it, as in test_resnet). */
static void check_fuse_gpu(const float *input, const float *r, const ModelTrainEval *cpu_fused) {
    GpuContext gpu;
    gpu_context_init(&gpu, 0);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        char what[80];
        ModelTrainEval plain = fuse_run(&gpu, nhwc, 0, input, r), fused = fuse_run(&gpu, nhwc, 1, input, r);
        snprintf(what, sizeof what, "gpu %s airbench model.fuse on against off", nhwc ? "nhwc" : "nchw");
        check_train_eval_near(what, &fused, &plain, 1e-4);
        if (!nhwc) check_train_eval_near("gpu nchw airbench fused against the cpu's", &fused, cpu_fused, 2e-2);
        model_train_eval_free(&plain), model_train_eval_free(&fused);
    }
    gpu_context_destroy(&gpu);
}

/* model.fuse: batch norm + GELU and the whitening conv + bias + GELU each in
 * one op (the CPU references compute bn(x) or conv + b in double or float
 * before the GELU, unrounded: the same values within float32's rounding), the
 * GELUs' outputs in their layers' storage (less memory). */
static void check_fuse(uint64_t *rng) {
    enum { IN = BATCH * 3 * 32 * 32 };
    float *input = malloc(IN * sizeof(float)), r[BATCH * CLASSES];
    test_fill_uniform(input, IN, rng, -2.0f, 2.0f);
    test_fill_uniform(r, BATCH * CLASSES, rng, -1.0f, 1.0f);
    ModelTrainEval plain = fuse_run(NULL, 0, 0, input, r), fused = fuse_run(NULL, 0, 1, input, r);
    /* The same arithmetic rounded otherwise: 1.4e-6 at most, but where a rounding flips one of the max-pools'
     * choices the gradients move by that element's share (seed 2330 of 1 to 6000: 5.7e-5). */
    check_train_eval_near("airbench model.fuse on against off", &fused, &plain, 1e-3);
    CHECK_MSG(fused.bytes < plain.bytes, "fused: %zu bytes, unfused %zu", fused.bytes, plain.bytes);
    if (gpu_count() > 0) check_fuse_gpu(input, r, &fused);
    else printf("no GPU: airbench's fused GPU checks skipped\n");
    free(input);
    model_train_eval_free(&plain), model_train_eval_free(&fused);
}

int main(void) {
    uint64_t rng = test_seed();
    check_shapes();
    check_dirac();
    check_gradients(&rng);
    check_frozen_whitening(&rng, 0);
    check_frozen_whitening(&rng, 1);
    check_fuse(&rng);
    return test_finish("test_airbench");
}
