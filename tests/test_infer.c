/* The inference path (models/infer.h) against the model's own evaluation
 * forward: SimpleNet, ResNet-18, ResNet-50 and airbench at 32x32 with random weights
 * and random batch-norm statistics (so folding is not the identity), on the
 * CPU in fp32 (folding and fusing reorder the arithmetic only: a tight
 * bound), the compilation's counts (every norm folded, every residual add
 * and ReLU fused), a net of batch 1 giving the first image's logits, and on
 * the GPU fp16 and bf16 NHWC with a CUDA graph against the CPU's (the
 * precision's bound), twice (the replay gives the same bits). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/infer.h"
#include "models/zoo.h"
#include "ops/op_context.h"
#include "runtime/gpu.h"
#include "tests/harness.h"

#define BATCH 3

typedef struct {
    const char *name;
    int convs, bn_folded, add_fused, relu_fused;
} NetCase;

/* Weights as the model initialised them, batch norms' gamma, beta and running
 * statistics drawn at random. */
static void randomise_bn(Model *m, uint64_t *rng, float *params, float *stats) {
    model_get_params(m, params);
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_BATCHNORM) continue;
        size_t c = l->w_count;
        for (size_t j = 0; j < c; j++) {
            params[l->w_off + j] = test_uniform(rng, 0.5f, 1.5f);
            params[l->b_off + j] = test_uniform(rng, -0.2f, 0.2f);
            stats[l->stat_off + j] = test_uniform(rng, -0.3f, 0.3f);
            stats[l->stat_off + c + j] = test_uniform(rng, 0.5f, 2.0f);
        }
    }
    model_set_params(m, params);
    model_set_bn_stats(m, stats);
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, isnan(a[i]) || isnan(b[i]) ? INFINITY : fabs(a[i] - b[i]));
    return m;
}

static float *run_net(const Model *m, const float *params, const float *stats, GpuContext *gpu, InferOptions *opt,
                      const float *input, size_t input_floats, InferStats *st) {
    InferNet *net = infer_create(m, params, stats, gpu, opt);
    const OpContext *ctx = infer_ops(net);
    CHECK(infer_input_floats(net) == input_floats / BATCH * (size_t)opt->batch);
    op_copy_from_host(ctx, infer_input(net), input, infer_input_floats(net) * sizeof(float));
    size_t n = (size_t)opt->batch * infer_classes(net);
    float *logits = malloc(n * sizeof(float)), *again = malloc(n * sizeof(float));
    infer_run(net);
    op_copy_to_host(ctx, logits, infer_logits(net), n * sizeof(float));
    infer_run(net);
    op_copy_to_host(ctx, again, infer_logits(net), n * sizeof(float));
    op_sync(ctx);
    CHECK_MSG(memcmp(logits, again, n * sizeof(float)) == 0, "a second run gave other logits");
    if (st) *st = infer_stats(net);
    infer_destroy(net);
    free(again);
    return logits;
}

static void check_net(const NetCase *nc, uint64_t *rng, GpuContext *gpu) {
    char err[256];
    Model *m = calloc(1, sizeof *m);
    CHECK(model_build(m, nc->name, BATCH, 32, 10, 0, err, sizeof err) == 0);
    model_finalize(m, NULL, *rng);
    float *params = malloc(m->n_params * sizeof(float)), *stats = malloc((m->n_bn_stats + 1) * sizeof(float));
    randomise_bn(m, rng, params, stats);
    model_set_training(m, 0);
    size_t in_n = model_input_floats(m), classes = (size_t)m->num_classes, n = BATCH * classes;
    float *input = malloc(in_n * sizeof(float));
    test_fill_uniform(input, in_n, rng, -2.0f, 2.0f);
    memcpy(model_input_buffer(m), input, in_n * sizeof(float));
    model_forward(m);
    const float *want = model_logits(m);
    double scale = max_abs(want, n);

    InferOptions cpu = {BATCH, DTYPE_F32, 0, 0, {0}};
    InferStats st;
    float *got = run_net(m, params, stats, NULL, &cpu, input, in_n, &st);
    double d = max_diff(got, want, n);
    printf("%-10s cpu fp32: max |logit| %.4f, max diff %.3g; %d steps, %d convs, %d norms folded, %d adds and %d "
           "ReLUs fused\n", nc->name, scale, d, st.steps, st.convs, st.bn_folded, st.add_fused, st.relu_fused);
    CHECK_MSG(d <= 1e-4 * fmax(scale, 1.0), "%s: the CPU inference path is %.3g off the model's forward", nc->name, d);
    CHECK_MSG(st.convs == nc->convs && st.bn_folded == nc->bn_folded && st.add_fused == nc->add_fused &&
                  st.relu_fused == nc->relu_fused, "%s: compiled to %d convs, %d folded, %d adds, %d ReLUs",
              nc->name, st.convs, st.bn_folded, st.add_fused, st.relu_fused);

    InferOptions one = cpu;
    one.batch = 1;
    float *first = run_net(m, params, stats, NULL, &one, input, in_n, NULL);
    CHECK_MSG(max_diff(first, got, classes) <= 1e-5 * fmax(scale, 1.0), "%s: batch 1 gave other logits", nc->name);

    static const DType halves[2] = {DTYPE_F16, DTYPE_BF16};
    static const double bound[2] = {2e-2, 1e-1}; /* of the logits' scale, after ~20 layers in the half type */
    for (int h = 0; gpu && h < 2; h++) {
        InferOptions g = {BATCH, halves[h], 1, 1, {.workspace_limit = (size_t)256 << 20, .allow_tf32 = 1}};
        float *dev = run_net(m, params, stats, gpu, &g, input, in_n, &st);
        double dd = max_diff(dev, got, n);
        printf("%-10s gpu %s NHWC graph: max diff %.3g (bound %.3g); %d of %d convs one cuDNN graph\n", nc->name,
               h ? "bf16" : "fp16", dd, bound[h] * scale, st.convs_fused, st.convs);
        CHECK_MSG(dd <= bound[h] * fmax(scale, 1e-3), "%s %s: %.3g off the CPU's", nc->name, h ? "bf16" : "fp16", dd);
        free(dev);
    }
    free(first);
    free(got);
    free(input);
    free(params);
    free(stats);
    model_destroy(m);
    free(m);
}

int main(void) {
    uint64_t rng = test_seed();
    GpuContext gpu_storage, *gpu = NULL;
    if (test_have_gpu()) {
        gpu_context_init(&gpu_storage, 0);
        gpu = &gpu_storage;
    } else {
        printf("no GPU: the CPU path only\n");
    }
    /* convs, norms folded, adds fused (one per residual block), ReLUs fused */
    static const NetCase nets[] = {
        {"simplenet", 3, 0, 0, 4},  /* 3 convs + fc1 */
        {"resnet18", 20, 20, 8, 17}, /* stem + 16 + 3 shortcuts; ReLUs: stem, 8 inner, 8 after the adds */
        {"resnet50", 53, 53, 16, 49},
        {"airbench", 7, 3, 0, 0},    /* whitening + 6; each block's second norm (the first follows a max-pool) */
    };
    for (size_t i = 0; i < sizeof nets / sizeof *nets; i++) check_net(&nets[i], &rng, gpu);
    if (gpu) gpu_context_destroy(gpu);
    return test_finish("test_infer");
}
