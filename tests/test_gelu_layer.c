/* GELU as a layer (its op is in the grid, tests/ops/gelu.c): a small net's
 * gradients against finite differences, a net with a ReLU working in place on
 * a GELU's output learning one batch, the planner refusing an in-place
 * ReLU over a GELU's input (which its backward reads), and batch norm + GELU
 * fused (model.fuse) giving the unfused net's loss, gradients and evaluation,
 * with and without checkpointed blocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "models/plan.h"
#include "tests/harness.h"
#include "tests/model_checks.h"
#include "tests/op_checks.h"

enum { BATCH = 8, CLASSES = 3, SIZE = 6 };

/* conv -> GELU -> conv -> GELU -> pool -> linear; relu: a ReLU (in place) after the first GELU. */
static void build(Model *m, int relu) {
    model_init(m, BATCH, CLASSES, 0);
    int x = model_input(m, 2, SIZE, SIZE);
    x = model_gelu(m, model_conv(m, x, 6, 3, 1, 1));
    if (relu) x = model_relu(m, x);
    x = model_gelu(m, model_conv(m, x, 6, 3, 1, 1));
    model_linear(m, model_avgpool(m, x), CLASSES);
}

static void check_model_gradients(uint64_t *rng) {
    Model m;
    build(&m, 0); /* smooth: central differences across a ReLU's kink would be off */
    model_finalize(&m, NULL, 5);
    check_net_gradients(&m, "conv, gelu, conv, gelu, avgpool, linear: every parameter", 1e-4f, rng);
    model_destroy(&m);
}

/* Fitting one batch of random images to random labels: the loss must fall well below chance. */
static void check_training(uint64_t *rng) {
    Model m;
    build(&m, 1);
    model_finalize(&m, NULL, 7);
    check_fits_batch(&m, "gelu net", 100, 0.1f, rng);
    model_destroy(&m);
}

/* GELU's input also read by a ReLU, which would overwrite it in place: model_finalize must refuse. */
static void finalize_relu_over_gelu_input(void *unused) {
    (void)unused;
    Model m;
    model_init(&m, BATCH, CLASSES, 0);
    int x = model_conv(&m, model_input(&m, 2, SIZE, SIZE), 6, 3, 1, 1);
    int y = model_add(&m, model_gelu(&m, x), model_relu(&m, x));
    model_linear(&m, model_avgpool(&m, y), CLASSES);
    model_finalize(&m, NULL, 1);
}

static void check_input_kept(void) {
    int status;
    char *text = test_child_stderr("test_gelu_layer", finalize_relu_over_gelu_input, NULL, &status);
    CHECK_MSG(status > 0, "a ReLU over a GELU's input: exit status %d", status);
    /* Either rule refuses it, by the order of the layers: GELU, as ReLU, cannot add its input's gradient to
     * another layer's, and a ReLU works in place only on an activation no other layer reads. */
    CHECK_MSG(strstr(text, "works in place") || strstr(text, "cannot add its gradient"),
              "a ReLU over a GELU's input: '%s'", text);
    free(text);
}

/* Three checkpoint blocks of conv -> batch norm -> GELU, the second with an
 * in-place ReLU after its GELU (a block's output sharing the fused GELU's
 * storage), then avgpool -> linear. */
static void build_bn_gelu(Model *m, int fuse, int checkpoint) {
    model_init(m, BATCH, CLASSES, 0);
    m->fuse = fuse;
    m->checkpoint = checkpoint;
    int x = model_input(m, 2, SIZE, SIZE);
    for (int b = 0; b < 3; b++) {
        model_block_begin(m);
        x = model_gelu(m, model_batchnorm(m, model_conv_no_bias(m, x, 6, 3, 1, 1)));
        if (b == 1) x = model_relu(m, x);
        model_block_end(m);
    }
    model_linear(m, model_avgpool(m, x), CLASSES);
}

static ModelTrainEval bn_gelu_run(int fuse, int checkpoint, const float *input, const float *r) {
    Model m;
    build_bn_gelu(&m, fuse, checkpoint);
    model_finalize(&m, NULL, 11);
    int fused = 0;
    for (int i = 0; i < m.n_layers; i++)
        fused += m.layers[i].kind == LAYER_BATCHNORM && m.plan->layers[i].act == BN_ACT_GELU;
    CHECK_MSG(fused == (fuse ? 3 : 0), "fuse %d: %d batch norms run their GELU", fuse, fused);
    ModelLoss loss = {&m, input, r};
    ModelTrainEval run = model_train_eval(&loss);
    model_destroy(&m);
    return run;
}

/* Fused (the CPU reference takes bn(x) in double into the GELU, unrounded)
 * against unfused: the same values within float32's rounding; checkpointed
 * blocks recompute the fused layers into the same values. */
static void check_fused_bn_gelu(uint64_t *rng) {
    size_t in_floats = (size_t)BATCH * 2 * SIZE * SIZE;
    float *input = malloc(in_floats * sizeof(float)), r[BATCH * CLASSES];
    test_fill_uniform(input, in_floats, rng, -2.0f, 2.0f);
    test_fill_uniform(r, BATCH * CLASSES, rng, -1.0f, 1.0f);
    check_fuse_checkpoint_variants("bn+gelu", bn_gelu_run, input, r, 1e-5);
    free(input);
}

int main(void) {
    uint64_t rng = test_seed();
    check_model_gradients(&rng);
    check_training(&rng);
    check_input_kept();
    check_fused_bn_gelu(&rng);
    return test_finish("test_gelu_layer");
}
