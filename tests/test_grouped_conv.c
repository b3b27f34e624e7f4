/* Grouped convolutions as layers (their op is in the grid, tests/ops/conv2d.c):
 * a small MobileNetV2-style net's gradients against finite differences, the
 * same net fitting one batch, its parameter count, tensor shapes and NHWC
 * filter places as PyTorch's, model.fuse and model.fuse = graphs (with and
 * without checkpointed blocks) giving the unfused net's loss, gradients and
 * evaluation on the CPU, and so on the GPU where there is one (fp32, NCHW and
 * NHWC, fused, benchmarked),
 * the inference path (batch norm folded into grouped filters) giving the
 * model's evaluation, and bad groups refused with a message naming the layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/infer.h"
#include "models/plan.h"
#include "models/model.h"
#include "models/tensors.h"
#include "tests/harness.h"
#include "tests/model_checks.h"
#include "tests/op_checks.h"

enum { BATCH = 4, CLASSES = 3, SIZE = 8, IN = 8 }; /* 8 input channels: none padded under NHWC */

/* act: GELU (smooth, for finite differences) or ReLU (the fusions' patterns). */
static int act(Model *m, int x, int relu) { return relu ? model_relu(m, x) : model_gelu(m, x); }

/* An inverted residual (1x1 expand, depthwise 3x3, 1x1 project, add), a depthwise 5x5 stride 2 with bias, a
 * conv in 2 groups with bias and a 2x2 max-pool (bias + ReLU + pool: bias_relu_pool under model.fuse), avgpool,
 * linear. Each part in a checkpoint block; layer i's module "l<i>". */
static void build(Model *m, int relu, int nhwc) {
    model_init(m, BATCH, CLASSES, nhwc);
    int x = model_input(m, IN, SIZE, SIZE);
    model_block_begin(m);
    int e = act(m, model_batchnorm(m, model_conv_no_bias(m, x, 16, 1, 0, 1)), relu);
    int d = act(m, model_batchnorm(m, model_conv_groups(m, e, 16, 3, 1, 1, 16, 0)), relu);
    x = model_add(m, model_batchnorm(m, model_conv_no_bias(m, d, IN, 1, 0, 1)), x);
    model_block_end(m);
    model_block_begin(m);
    x = act(m, model_conv_groups(m, x, 8, 5, 2, 2, IN, 1), relu); /* depthwise, with a bias */
    x = act(m, model_conv_groups(m, x, 8, 3, 1, 1, 2, 1), relu);
    if (relu) x = model_maxpool2(m, x);
    model_block_end(m);
    model_linear(m, model_avgpool(m, x), CLASSES);
    for (int i = 0; i < m->n_layers; i++) snprintf(m->layers[i].module, sizeof m->layers[i].module, "l%d", i);
}

static void check_gradients_and_training(uint64_t *rng) {
    Model m;
    build(&m, 0, 0); /* smooth: central differences across a ReLU's kink would be off */
    model_finalize(&m, NULL, 5);
    check_net_gradients(&m, "inverted residual, depthwise 5x5 stride 2, 2 groups: every parameter", 1e-3f, rng);
    model_destroy(&m);
    build(&m, 1, 0);
    model_finalize(&m, NULL, 7);
    check_fits_batch(&m, "grouped net", 60, 0.05f, rng);
    model_destroy(&m);
}

/* PyTorch's count and shapes: a filter has in / groups channels. */
static void check_layout(void) {
    Model m;
    build(&m, 1, 0);
    size_t want = 16 * IN + 2 * 16 + 16 * 9 + 2 * 16 + IN * 16 + 2 * IN + (8 * 25 + 8) + (8 * 4 * 9 + 8) +
                  (CLASSES * 8 + CLASSES);
    CHECK_MSG(model_param_count(&m) == want, "parameters: %zu, PyTorch's %zu", model_param_count(&m), want);
    ModelTensor t[64];
    char err[200];
    int n = model_tensors(&m, t, 64, err, sizeof err);
    const struct { const char *name; int shape[4]; } convs[] = {
        {"l3.weight", {16, 1, 3, 3}}, {"l9.weight", {8, 1, 5, 5}}, {"l11.weight", {8, 4, 3, 3}}};
    for (size_t c = 0; c < sizeof convs / sizeof convs[0]; c++) {
        int found = 0;
        for (int i = 0; i < n; i++) {
            if (strcmp(t[i].name, convs[c].name)) continue;
            found = t[i].ndim == 4 && !memcmp(t[i].shape, convs[c].shape, sizeof convs[c].shape);
            CHECK_MSG(found, "%s: shape [%d, %d, %d, %d]", t[i].name, t[i].shape[0], t[i].shape[1], t[i].shape[2],
                      t[i].shape[3]);
        }
        CHECK_MSG(found, "no tensor %s of the right shape among %d", convs[c].name, n);
    }
    /* NHWC filters [k][r][s][c / groups]: PyTorch's (k 1, c 1, tap 4) of the 2-group 3x3, 4 channels a filter,
     * lies at (1 * 9 + 4) * 4 + 1; depthwise, a filter's one channel, the same index. */
    m.nhwc = 1;
    const Layer *two = &m.layers[11], *depthwise = &m.layers[3];
    CHECK(two->kind == LAYER_CONV && depthwise->kind == LAYER_CONV);
    CHECK_MSG(model_weight_index(&m, two, (1 * 4 + 1) * 9 + 4) == (1 * 9 + 4) * 4 + 1, "NHWC grouped index %zu",
              model_weight_index(&m, two, (1 * 4 + 1) * 9 + 4));
    int seen[8 * 4 * 9] = {0}, bijective = 1;
    for (size_t j = 0; j < two->w_count; j++) bijective &= model_weight_index(&m, two, j) < two->w_count;
    for (size_t j = 0; bijective && j < two->w_count; j++) bijective &= !seen[model_weight_index(&m, two, j)]++;
    CHECK_MSG(bijective && two->w_count == 8 * 4 * 9, "NHWC places of a grouped filter are not a permutation");
    for (size_t j = 0; j < depthwise->w_count; j++) CHECK(model_weight_index(&m, depthwise, j) == j);
    CHECK_MSG(two->fan_in == 4 * 9 && depthwise->fan_in == 9, "fan_in %zu and %zu, PyTorch's 36 and 9", two->fan_in,
              depthwise->fan_in);
}

/* How a net runs: on the GPU (NULL: the CPU), its layout and the planner's options. */
typedef struct {
    GpuContext *gpu;
    int nhwc, fuse, graphs, checkpoint, benchmark;
} Variant;

/* The parameters' gradients in PyTorch's order (model_tensor_get): the same in either layout. */
static float *torch_order(const Model *m, const float *grads) {
    ModelTensor t[64];
    char err[200];
    int n = model_tensors(m, t, 64, err, sizeof err);
    CHECK_MSG(n > 0 && n <= 64, "model_tensors: %d (%s)", n, n < 0 ? err : "too many");
    float *out = malloc(model_param_count(m) * sizeof(float));
    size_t at = 0;
    for (int i = 0; i < n && i < 64; i++) {
        if (t[i].in_bn_stats) continue;
        model_tensor_get(m, &t[i], grads, NULL, out + at);
        at += t[i].count;
    }
    CHECK_MSG(at == model_param_count(m), "tensors of %zu parameters, the model counts %zu", at, model_param_count(m));
    return out;
}

/* A grouped conv takes none of the special paths; the CPU's model.fuse = graphs takes the first 1x1's pair. */
static void check_plan(const Model *m, const Variant *v) {
    int pooled = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const LayerPlan *p = &m->plan->layers[i];
        pooled += p->bias_by_pool;
        if (l->kind != LAYER_CONV || conv2d_groups(&l->conv.shape) == 1) continue;
        CHECK_MSG(!p->genstats && !p->prologue_genstats && !p->dgrad_dbn && p->prologue_bn < 0 && !p->input_form &&
                      p->pool_layer < 0,
                  "%s (groups %d) takes a path of one convolution of all channels", l->name, l->conv.shape.groups);
    }
    CHECK_MSG(pooled == v->fuse, "fuse %d: %d grouped convs leave their bias and ReLU to the max-pool", v->fuse,
              pooled);
    if (v->graphs && !v->gpu)
        CHECK_MSG(m->plan->layers[0].genstats != NULL, "model.fuse = graphs: the 1x1 + norm apart");
}

static ModelTrainEval run_variant(const Variant *v, const float *input, const float *r) {
    Model m;
    build(&m, 1, v->nhwc);
    m.fuse = v->fuse, m.fuse_graphs = v->graphs, m.checkpoint = v->checkpoint;
    /* deterministic algorithms, but where the graphs run: on the GPU they would not (plan_graphs) */
    m.conv_policy.deterministic = !v->graphs, m.conv_policy.benchmark = v->benchmark;
    model_finalize(&m, v->gpu, 11);
    check_plan(&m, v);
    ModelLoss loss = {&m, input, r};
    ModelTrainEval got = model_train_eval(&loss);
    float *grads = torch_order(&m, got.grads);
    free(got.grads);
    got.grads = grads, got.n_params = model_param_count(&m);
    model_destroy(&m);
    return got;
}

static ModelTrainEval cpu_run(int fuse, int checkpoint, const float *input, const float *r) {
    Variant v = {NULL, 0, fuse, 0, checkpoint, 0};
    return run_variant(&v, input, r);
}

/* Against the CPU's unfused run: on the CPU model.fuse (the batch norms' ReLUs and add, the grouped conv's bias +
 * ReLU into the max-pool) and model.fuse = graphs (the ungrouped convs' pairs), checkpointed or not, within
 * float32's rounding; on the GPU (fp32, deterministic algorithms), NCHW and NHWC, fused, benchmarked, within
 * cuDNN's other rounding through three batch norms. */
static void check_variants(const float *input, const float *r) {
    check_fuse_checkpoint_variants("grouped net", cpu_run, input, r, 1e-5);
    ModelTrainEval want = cpu_run(0, 0, input, r);
    for (int checkpoint = 0; checkpoint < 2; checkpoint++) {
        Variant v = {NULL, 0, 1, 1, checkpoint, 0};
        ModelTrainEval got = run_variant(&v, input, r);
        check_train_eval_near(checkpoint ? "grouped net, graphs, checkpointed" : "grouped net, graphs", &got, &want,
                              1e-5);
        model_train_eval_free(&got);
    }
    if (!test_have_gpu()) {
        printf("no GPU: the grouped net's GPU runs are skipped\n");
    } else {
        GpuContext gpu;
        gpu_context_init(&gpu, 0);
        const Variant gpu_runs[] = {{&gpu, 0, 0, 0, 0, 0}, {&gpu, 0, 1, 0, 1, 0}, {&gpu, 1, 0, 0, 0, 0},
                                    {&gpu, 1, 1, 1, 1, 0}, {&gpu, 1, 1, 1, 0, 1}};
        for (size_t i = 0; i < sizeof gpu_runs / sizeof gpu_runs[0]; i++) {
            const Variant *v = &gpu_runs[i];
            char what[120];
            snprintf(what, sizeof what, "grouped net on the GPU, %s, fuse %d graphs %d checkpoint %d benchmark %d",
                     v->nhwc ? "NHWC" : "NCHW", v->fuse, v->graphs, v->checkpoint, v->benchmark);
            ModelTrainEval got = run_variant(v, input, r);
            check_train_eval_near(what, &got, &want, 1e-3);
            model_train_eval_free(&got);
        }
        gpu_context_destroy(&gpu);
    }
    model_train_eval_free(&want);
}

/* The inference path folds each batch norm into the grouped filter before it: its logits are the model's
 * evaluation forward's, from trained statistics (a few steps moved them from 0 and 1). */
static void check_infer(const float *input) {
    Model m;
    build(&m, 1, 0);
    model_finalize(&m, NULL, 13);
    int32_t labels[BATCH] = {0, 1, 2, 0};
    for (int s = 0; s < 3; s++) model_train_step_cpu(&m, input, labels, 0.05f);
    model_set_training(&m, 0);
    memcpy(model_input_buffer(&m), input, model_input_floats(&m) * sizeof(float));
    model_forward(&m);
    float *params = malloc(m.n_params * sizeof(float)), *stats = malloc(m.n_bn_stats * sizeof(float));
    model_get_params(&m, params);
    model_get_bn_stats(&m, stats);
    InferOptions opt = {.batch = BATCH, .dtype = DTYPE_F32};
    InferNet *net = infer_create(&m, params, stats, NULL, &opt);
    memcpy(infer_input(net), input, infer_input_floats(net) * sizeof(float));
    infer_run(net);
    double err = test_rel_error(infer_logits(net), model_logits(&m), BATCH * CLASSES);
    printf("inference against the evaluation forward: rel err %.2e\n", err);
    CHECK_MSG(err < 1e-5, "inference of the grouped net against its evaluation forward: rel err %.2e", err);
    infer_destroy(net);
    free(params), free(stats);
    model_destroy(&m);
}

/* ---- bad groups ---- */

static void groups_not_dividing(void *unused) {
    (void)unused;
    Model m;
    model_init(&m, BATCH, CLASSES, 0);
    model_conv_groups(&m, model_input(&m, 6, SIZE, SIZE), 8, 3, 1, 1, 4, 1);
}

static void groups_over_padded_input(void *unused) {
    (void)unused;
    Model m;
    model_init(&m, BATCH, CLASSES, 1); /* NHWC pads the input's 3 channels to 8 */
    model_conv_groups(&m, model_input(&m, 3, SIZE, SIZE), 3, 3, 1, 1, 3, 1);
}

static void check_refused(const char *what, void (*fn)(void *), const char *want) {
    int status;
    char *text = test_child_stderr("test_grouped_conv", fn, NULL, &status);
    CHECK_MSG(status > 0 && strstr(text, "layer 0") && strstr(text, want), "%s: exit status %d, '%s'", what, status,
              text);
    free(text);
}

int main(void) {
    uint64_t rng = test_seed();
    check_gradients_and_training(&rng);
    check_layout();
    size_t in_floats = (size_t)BATCH * IN * SIZE * SIZE;
    float *input = malloc(in_floats * sizeof(float)), r[BATCH * CLASSES];
    test_fill_uniform(input, in_floats, &rng, -2.0f, 2.0f);
    test_fill_uniform(r, BATCH * CLASSES, &rng, -1.0f, 1.0f);
    check_variants(input, r);
    check_infer(input);
    free(input);
    check_refused("6 channels in 4 groups", groups_not_dividing, "6 input channels to 8 in 4 groups");
    check_refused("depthwise over the padded NHWC input", groups_over_padded_input, "3 (padded) input channels");
    return test_finish("test_grouped_conv");
}
