/* The layer kinds of issue 53 as layers (their ops are in the grid: tests/ops/silu.c, dropout.c, concat.c,
 * avgpool.c), on the CPU, in one small net of each: conv, dropout, SiLU, a 3x3 stride-2 pad-1 average pool,
 * a 1x1 conv, a concat of the pool and that conv (a fan-out), dropout, flatten, linear:
 *   - every parameter's gradient against finite differences, the dropout masks held still;
 *   - the net fitting one batch, its loss falling, with a new mask each step;
 *   - dropout's masks: the same seed and step give the same, the next step, or another seed, others; one
 *     step a training forward, none in evaluation, which is the identity;
 *   - checkpointed blocks recomputing a dropout inside them with its mask (the gradients of the net
 *     without checkpointing);
 *   - the inference path (models/infer.c) giving the net's evaluation logits, and a batch norm of a
 *     flatten's features (c*h*w of them) not folded into the conv before the flatten;
 *   - under NHWC, a linear after a flatten taking the features in (h, w, c) order, and a flatten's features
 *     refused to any other reader;
 *   - bad arguments stopping with a message;
 *   - on a GPU (else skipped, saying so): the CUDA paths in NCHW and NHWC giving the CPU's loss, gradients
 *     and evaluation (the same masks: they follow each element's NCHW place), a forward captured in a
 *     CUDA graph drawing a new mask at each replay, the eager forwards' ones, and the inference path in
 *     fp32, fp16 and bf16, NHWC, replayed as a CUDA graph, giving the CPU's logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/infer.h"
#include "models/layers.h"
#include "models/model.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/model_checks.h"
#include "tests/op_checks.h"

enum { BATCH = 6, CLASSES = 3, SIZE = 8 };

/* Under checkpoint, two blocks: the first's inside holds a dropout whose output a SiLU's backward reads. */
static void build_in(Model *m, float p, int checkpoint, int nhwc) {
    model_init(m, BATCH, CLASSES, nhwc);
    m->checkpoint = checkpoint;
    int x = model_input(m, 2, SIZE, SIZE);
    model_block_begin(m);
    x = model_silu(m, model_dropout(m, model_conv(m, x, 4, 3, 1, 1), p));
    int pooled = model_avgpool2d(m, x, 3, 2, 1); /* 4 x 4 */
    model_block_end(m);
    model_block_begin(m);
    x = model_concat(m, pooled, model_conv(m, pooled, 3, 1, 0, 1));
    model_block_end(m);
    x = model_flatten(m, model_dropout(m, x, p));
    model_linear(m, x, CLASSES);
}

static void build(Model *m, float p, int checkpoint) { build_in(m, p, checkpoint, 0); }

/* The loss with the masks of one step: model_loss after the dropout step is set back. */
typedef struct {
    ModelLoss loss;
    int64_t step;
} HeldLoss;

static double held_loss(void *p) {
    HeldLoss *h = p;
    model_set_dropout_step(h->loss.m, h->step);
    return model_loss(&h->loss);
}

static void check_gradients(uint64_t *rng) {
    Model m;
    build(&m, 0.3f, 0);
    model_finalize(&m, NULL, 5);
    HeldLoss h = {model_loss_random(&m, rng), 17};
    model_set_dropout_step(&m, h.step);
    model_loss_backward(&h.loss);
    CHECK(model_dropout_step(&m) == h.step + 1);
    float *analytic = malloc(m.n_params * sizeof(float));
    double *numeric = malloc(m.n_params * sizeof(double));
    memcpy(analytic, m.grads, m.n_params * sizeof(float));
    numeric_gradient(m.params, m.n_params, 1e-3f, held_loss, &h, numeric);
    check_gradient("conv, dropout, silu, avgpool k3 s2 p1, conv, concat, dropout, flatten, linear: every parameter",
                   analytic, numeric, m.n_params);
    model_loss_free(&h.loss), free(analytic), free(numeric);
    model_destroy(&m);
}

/* Random images to random labels: the mean of the last steps' losses well under the first's. */
static void check_training(uint64_t *rng) {
    enum { STEPS = 120, LAST = 10 };
    Model m;
    build(&m, 0.2f, 0);
    model_finalize(&m, NULL, 7);
    float *input = malloc(model_input_floats(&m) * sizeof(float));
    int32_t labels[BATCH];
    test_fill_uniform(input, model_input_floats(&m), rng, -2.0f, 2.0f);
    for (int i = 0; i < BATCH; i++) labels[i] = i % CLASSES;
    float first = model_train_step_cpu(&m, input, labels, 0.05f), last = 0;
    for (int s = 1; s < STEPS; s++) {
        float loss = model_train_step_cpu(&m, input, labels, 0.05f);
        if (s >= STEPS - LAST) last += loss / LAST;
    }
    printf("layer kinds net: loss %.4f after one step, %.4f over the last %d of %d\n", first, last, LAST, STEPS);
    CHECK_MSG(isfinite(last) && last < 0.5f * first, "loss %.4f -> %.4f: the net did not learn", first, last);
    CHECK(model_dropout_step(&m) == STEPS);
    free(input);
    model_destroy(&m);
}

/* The logits of one forward of input, in the model's mode, from dropout step 'step' (-1: as it stands). */
static float *logits_of(Model *m, const float *input, int64_t step) {
    size_t n = (size_t)m->batch * m->num_classes;
    float *out = malloc(n * sizeof(float));
    if (step >= 0) model_set_dropout_step(m, step);
    memcpy(model_input_buffer(m), input, model_input_floats(m) * sizeof(float));
    model_forward(m);
    memcpy(out, model_logits(m), n * sizeof(float));
    return out;
}

static int same(const float *a, const float *b) { return memcmp(a, b, BATCH * CLASSES * sizeof(float)) == 0; }

static void check_dropout_masks(uint64_t *rng) {
    Model m, twin, other, none;
    build(&m, 0.3f, 0), build(&twin, 0.3f, 0), build(&other, 0.3f, 0), build(&none, 0.0f, 0);
    model_finalize(&m, NULL, 9), model_finalize(&twin, NULL, 9), model_finalize(&none, NULL, 9);
    model_finalize(&other, NULL, 10);
    model_set_params(&other, m.params); /* the same weights, another dropout seed */
    float *input = malloc(model_input_floats(&m) * sizeof(float));
    test_fill_uniform(input, model_input_floats(&m), rng, -2.0f, 2.0f);
    float *a = logits_of(&m, input, 4), *again = logits_of(&m, input, 4), *next = logits_of(&m, input, -1);
    float *b = logits_of(&twin, input, 4), *o = logits_of(&other, input, 4);
    CHECK_MSG(same(a, again) && same(a, b), "the same seed and step gave other logits");
    CHECK_MSG(!same(a, next), "the next step gave the same logits: the same masks");
    CHECK_MSG(!same(a, o), "another seed gave the same logits: the same masks");
    CHECK(model_dropout_step(&m) == 6);
    /* Evaluation: the identity (the logits of p = 0 in training, where the mask keeps all and scales by 1),
     * the step left where it was. */
    model_set_training(&m, 0);
    float *eval = logits_of(&m, input, -1), *eval_again = logits_of(&m, input, -1);
    float *identity = logits_of(&none, input, 0);
    CHECK_MSG(same(eval, eval_again) && same(eval, identity), "evaluation is not the identity");
    CHECK(model_dropout_step(&m) == 6);
    void *host[] = {input, a, again, next, b, o, eval, eval_again, identity};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    model_destroy(&m), model_destroy(&twin), model_destroy(&other), model_destroy(&none);
}

/* A checkpointed block's recompute draws its dropout's mask again: the same loss, gradients and evaluation. */
static void check_checkpoint_masks(uint64_t *rng) {
    Model plain, blocks;
    build(&plain, 0.3f, 0), build(&blocks, 0.3f, 1);
    model_finalize(&plain, NULL, 13), model_finalize(&blocks, NULL, 13);
    ModelLoss l = model_loss_random(&plain, rng), lb = l;
    lb.m = &blocks;
    ModelTrainEval want = model_train_eval(&l), got = model_train_eval(&lb);
    check_train_eval_near("checkpointed blocks against none, dropout inside", &got, &want, 1e-6);
    model_train_eval_free(&want), model_train_eval_free(&got), model_loss_free(&l);
    model_destroy(&plain), model_destroy(&blocks);
}

/* The inference path's steps (SiLU, the windowed pool, concat, dropout and flatten as the identity) give the
 * model's evaluation logits. */
static void check_inference(uint64_t *rng) {
    Model m;
    build(&m, 0.3f, 0);
    model_finalize(&m, NULL, 21);
    model_set_training(&m, 0);
    float *input = malloc(model_input_floats(&m) * sizeof(float));
    test_fill_uniform(input, model_input_floats(&m), rng, -2.0f, 2.0f);
    float *want = logits_of(&m, input, -1);
    InferOptions opt = {BATCH, DTYPE_F32, 0, 0, {0}};
    InferNet *net = infer_create(&m, m.params, NULL, NULL, &opt);
    memcpy(infer_input(net), input, infer_input_floats(net) * sizeof(float));
    infer_run(net);
    double err = test_rel_error(infer_logits(net), want, BATCH * CLASSES);
    printf("inference: %d steps, logits %.3g from the model's evaluation\n", infer_stats(net).steps, err);
    CHECK(err < 1e-6);
    infer_destroy(net);
    free(input), free(want);
    model_destroy(&m);
}

/* conv -> flatten -> batch norm (of its c*h*w features) -> linear, with random norm parameters and
 * statistics: the inference net's logits, the model's evaluation's. */
static void check_inference_flatten_norm(uint64_t *rng) {
    Model m;
    model_init(&m, BATCH, CLASSES, 0);
    int x = model_conv(&m, model_input(&m, 2, 4, 4), 3, 3, 1, 2); /* 3 x 2 x 2 */
    model_linear(&m, model_batchnorm(&m, model_flatten(&m, x)), CLASSES);
    model_finalize(&m, NULL, 23);
    const Layer *bn = &m.layers[2];
    float *params = malloc(m.n_params * sizeof(float)), *stats = malloc(m.n_bn_stats * sizeof(float));
    model_get_params(&m, params);
    test_fill_uniform(params + bn->w_off, bn->w_count, rng, 0.5f, 2.0f);
    test_fill_uniform(params + bn->b_off, bn->b_count, rng, -1.0f, 1.0f);
    test_fill_uniform(stats, m.n_bn_stats, rng, 0.5f, 2.0f); /* means and variances */
    model_set_params(&m, params), model_set_bn_stats(&m, stats);
    model_set_training(&m, 0);
    float *input = malloc(model_input_floats(&m) * sizeof(float));
    test_fill_uniform(input, model_input_floats(&m), rng, -2.0f, 2.0f);
    float *want = logits_of(&m, input, -1);
    InferOptions opt = {BATCH, DTYPE_F32, 0, 0, {0}};
    InferNet *net = infer_create(&m, params, stats, NULL, &opt);
    memcpy(infer_input(net), input, infer_input_floats(net) * sizeof(float));
    infer_run(net);
    double err = test_rel_error(infer_logits(net), want, BATCH * CLASSES);
    printf("inference: a norm of a flatten, %d folded, logits %.3g from the model's\n", infer_stats(net).bn_folded,
           err);
    CHECK(err < 1e-5 && infer_stats(net).bn_folded == 0);
    infer_destroy(net);
    free(params), free(stats), free(input), free(want);
    model_destroy(&m);
}

/* NHWC (the graph alone: the CPU trains NCHW): a linear after a flatten of a conv's 3x3 map takes its weights
 * in the order a linear on the conv's output itself takes them, (h, w, c). */
static void check_nhwc_flatten_weights(void) {
    Model direct, flat;
    for (int f = 0; f < 2; f++) {
        Model *m = f ? &flat : &direct;
        model_init(m, BATCH, CLASSES, 1);
        int x = model_conv(m, model_input(m, 8, 3, 3), 8, 1, 0, 1);
        model_linear(m, f ? model_flatten(m, x) : x, CLASSES);
    }
    const Layer *a = &direct.layers[1], *b = &flat.layers[2];
    size_t differ = 0, moved = 0;
    for (size_t j = 0; j < a->w_count; j++) {
        differ += model_weight_index(&direct, a, j) != model_weight_index(&flat, b, j);
        moved += model_weight_index(&flat, b, j) != j;
    }
    CHECK_MSG(differ == 0 && moved > 0, "nhwc: %zu of %zu weights placed apart, %zu moved", differ, a->w_count, moved);
}

static void nhwc_flatten_into_silu(void *unused) {
    (void)unused;
    Model m;
    model_init(&m, BATCH, CLASSES, 1);
    int x = model_flatten(&m, model_conv(&m, model_input(&m, 8, 3, 3), 8, 1, 0, 1));
    model_linear(&m, model_silu(&m, x), CLASSES);
    layers_check_flattens(&m, 1);
}

static void concat_of_other_sizes(void *unused) {
    (void)unused;
    Model m;
    model_init(&m, BATCH, CLASSES, 0);
    int x = model_input(&m, 2, SIZE, SIZE);
    model_concat(&m, x, model_avgpool2d(&m, x, 2, 2, 0));
}

static void dropout_of_one(void *unused) {
    (void)unused;
    Model m;
    model_init(&m, BATCH, CLASSES, 0);
    model_dropout(&m, model_input(&m, 2, SIZE, SIZE), 1.0f);
}

static void avgpool_padding_over_half(void *unused) {
    (void)unused;
    Model m;
    model_init(&m, BATCH, CLASSES, 0);
    model_avgpool2d(&m, model_input(&m, 2, SIZE, SIZE), 3, 2, 2);
}

static void expect_refusal(const char *what, void (*fn)(void *), const char *message) {
    int status;
    char *text = test_child_stderr("test_layer_kinds", fn, NULL, &status);
    CHECK_MSG(status > 0 && strstr(text, message), "%s: exit status %d, '%s' (want '%s')", what, status, text,
              message);
    free(text);
}

/* ---- on the GPU ---- */

/* A model's gradients in PyTorch's order (model_weight_index), layer after layer: comparable across layouts. */
static float *torch_order_grads(const Model *m, const float *grads, size_t *n) {
    float *out = malloc(m->n_params * sizeof(float));
    *n = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const Activation *x = &m->acts[l->in];
        size_t real_w = l->kind == LAYER_CONV ? l->w_count / x->c * x->c_real : l->w_count;
        for (size_t j = 0; j < real_w; j++) out[(*n)++] = grads[l->w_off + model_weight_index(m, l, j)];
        for (size_t j = 0; j < l->b_count; j++) out[(*n)++] = grads[l->b_off + j];
    }
    return out;
}

static void check_gpu_against_cpu(GpuContext *gpu, int nhwc, uint64_t *rng) {
    Model cpu, dev;
    build(&cpu, 0.3f, 0), build_in(&dev, 0.3f, 0, nhwc);
    dev.act_dtype = DTYPE_F32;
    model_finalize(&cpu, NULL, 31), model_finalize(&dev, gpu, 31);
    ModelLoss l = model_loss_random(&cpu, rng), ld = l;
    ld.m = &dev;
    ModelTrainEval want = model_train_eval(&l), got = model_train_eval(&ld);
    size_t n_want, n_got;
    float *gw = torch_order_grads(&cpu, want.grads, &n_want), *gg = torch_order_grads(&dev, got.grads, &n_got);
    double e_grad = n_got == n_want ? test_rel_error(gg, gw, n_want) : INFINITY;
    double e_eval = test_rel_error(got.eval_logits, want.eval_logits, want.n_logits);
    double e_loss = fabs(got.loss - want.loss) / (fabs(want.loss) + 1);
    printf("gpu fp32 %s against the cpu: loss %.3g, gradients %.3g, eval logits %.3g relative\n",
           nhwc ? "nhwc" : "nchw", e_loss, e_grad, e_eval);
    /* cuDNN's fp32 convolutions (no TF32) sum in another order: rounding apart, a wrong mask tens of percent. */
    CHECK(e_loss < 1e-4 && e_grad < 1e-4 && e_eval < 1e-4);
    free(gw), free(gg);
    model_train_eval_free(&want), model_train_eval_free(&got), model_loss_free(&l);
    model_destroy(&cpu), model_destroy(&dev);
}

static float *device_logits(const Model *m) {
    size_t n = (size_t)m->batch * m->num_classes;
    float *out = malloc(n * sizeof(float));
    op_copy_to_host(&m->ops, out, model_logits(m), n * sizeof(float));
    op_sync(&m->ops);
    return out;
}

/* A training forward captured once replays with the step the device holds: the masks of eager forwards at
 * the same steps, a new one each replay, the host setting nothing in between. */
static void check_graph_replay(GpuContext *gpu, uint64_t *rng) {
    Model m;
    build_in(&m, 0.3f, 0, 1);
    m.act_dtype = DTYPE_F32;
    model_finalize(&m, gpu, 33);
    size_t n_in = model_input_floats(&m);
    float *input = malloc(n_in * sizeof(float));
    test_fill_uniform(input, n_in, rng, -2.0f, 2.0f);
    op_copy_from_host(&m.ops, model_input_buffer(&m), input, n_in * sizeof(float));
    model_set_dropout_step(&m, 0);
    model_forward(&m);
    float *eager1 = device_logits(&m);
    model_forward(&m);
    float *eager2 = device_logits(&m);
    model_set_dropout_step(&m, 0);
    gpu_capture_begin(m.ops.stream);
    model_forward(&m);
    cudaGraphExec_t graph = gpu_capture_end(m.ops.stream, 0);
    CHECK_MSG(model_dropout_step(&m) == 0, "capturing ran the step's advance");
    gpu_graph_launch(graph, m.ops.stream);
    float *replay1 = device_logits(&m);
    gpu_graph_launch(graph, m.ops.stream);
    float *replay2 = device_logits(&m);
    CHECK_MSG(same(replay1, eager1) && same(replay2, eager2), "the replays' masks are not the eager forwards'");
    CHECK_MSG(!same(replay1, replay2), "two replays drew the same mask");
    CHECK(model_dropout_step(&m) == 2);
    printf("cuda graph: two replays, the eager forwards' masks, each its own\n");
    gpu_graph_destroy(graph);
    void *host[] = {input, eager1, eager2, replay1, replay2};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    model_destroy(&m);
}

/* The inference net on the GPU (NHWC, a CUDA graph) against the CPU's; the halves by their precision after
 * a few layers. */
static void check_gpu_inference(GpuContext *gpu, uint64_t *rng) {
    static const DType types[3] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    static const double bound[3] = {1e-4, 2e-2, 8e-2};
    Model m;
    build(&m, 0.3f, 0);
    model_finalize(&m, NULL, 35);
    float *input = malloc(model_input_floats(&m) * sizeof(float));
    test_fill_uniform(input, model_input_floats(&m), rng, -2.0f, 2.0f);
    InferOptions cpu = {BATCH, DTYPE_F32, 0, 0, {0}};
    InferNet *ref = infer_create(&m, m.params, NULL, NULL, &cpu);
    memcpy(infer_input(ref), input, infer_input_floats(ref) * sizeof(float));
    infer_run(ref);
    for (int t = 0; t < 3; t++) {
        InferOptions opt = {BATCH, types[t], 1, 1, {.workspace_limit = (size_t)256 << 20}};
        InferNet *net = infer_create(&m, m.params, NULL, gpu, &opt);
        op_copy_from_host(infer_ops(net), infer_input(net), input, infer_input_floats(net) * sizeof(float));
        infer_run(net);
        float got[BATCH * CLASSES];
        op_copy_to_host(infer_ops(net), got, infer_logits(net), sizeof got);
        op_sync(infer_ops(net));
        double err = test_rel_error(got, infer_logits(ref), BATCH * CLASSES);
        printf("inference on the gpu, %s nhwc graph: logits %.3g from the cpu's (bound %.1g)\n",
               dtype_name(types[t]), err, bound[t]);
        CHECK(err <= bound[t]);
        infer_destroy(net);
    }
    infer_destroy(ref);
    free(input);
    model_destroy(&m);
}

static void check_on_gpu(uint64_t *rng) {
    if (!test_have_gpu()) {
        printf("SKIP (the GPU part): no GPU: the CUDA paths against the CPU and the graph replay need one\n");
        return;
    }
    GpuContext gpu;
    gpu_context_init(&gpu, 0);
    check_gpu_against_cpu(&gpu, 0, rng);
    check_gpu_against_cpu(&gpu, 1, rng);
    check_graph_replay(&gpu, rng);
    check_gpu_inference(&gpu, rng);
    gpu_context_destroy(&gpu);
}

int main(void) {
    uint64_t rng = test_seed();
    check_gradients(&rng);
    check_training(&rng);
    check_dropout_masks(&rng);
    check_checkpoint_masks(&rng);
    check_inference(&rng);
    check_inference_flatten_norm(&rng);
    check_nhwc_flatten_weights();
    expect_refusal("a flatten under NHWC into a SiLU", nhwc_flatten_into_silu, "only linear layers may");
    expect_refusal("a concat of 8x8 and 4x4", concat_of_other_sizes, "the height and width differ");
    expect_refusal("dropout with p = 1", dropout_of_one, "not in [0, 1)");
    expect_refusal("a 3x3 average pool padded by 2", avgpool_padding_over_half, "at most half the window");
    check_on_gpu(&rng);
    return test_finish("test_layer_kinds");
}
