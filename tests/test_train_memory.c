/* Memory switches change how gradients are computed, never what they are:
 * checkpointed SimpleNet gives bitwise the gradients of the plain one (CPU, and
 * GPU where there is one), in less memory; k accumulated micro-batches take the
 * step of one batch k times as large; a CUDA-graph run ends with the weights of
 * the eager run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "models/plan.h"
#include "models/zoo.h"
#include "ops/softmax_xent.h"
#include "runtime/check.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

enum { BATCH = 4, SIZE = 32, CLASSES = 10 };

#if TRAINC_CUDA /* a build without CUDA checks the CPU alone */
static void gradients_on_gpu(Model *m, GpuContext *gpu, const float *x, const int32_t *labels, float *grads) {
    size_t in_bytes = model_input_floats(m) * sizeof(float);
    int32_t *d_labels;
    float *d_loss;
    CUDA_CHECK(cudaMalloc((void **)&d_labels, BATCH * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc((void **)&d_loss, sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_labels, labels, BATCH * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(model_input_buffer(m), x, in_bytes, cudaMemcpyHostToDevice));
    model_forward(m);
    softmax_xent_cuda(m->act_dtype, model_logits(m), d_labels, BATCH, CLASSES, NULL, d_loss, model_logits_grad(m),
                      gpu->compute);
    model_backward(m);
    CUDA_CHECK(cudaStreamSynchronize(gpu->compute));
    CUDA_CHECK(cudaMemcpy(grads, m->grads, m->n_params * dtype_size(m->act_dtype), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_labels));
    CUDA_CHECK(cudaFree(d_loss));
}
#endif

/* Gradients of one forward/backward, copied to the host. */
static float *gradients(int checkpoint, int fuse, GpuContext *gpu, const float *x, const int32_t *labels,
                        size_t *bytes_out, size_t *n_out) {
    Model m;
    char err[256];
    CHECK(model_build(&m, "simplenet", BATCH, SIZE, CLASSES, 0, err, sizeof err) == 0);
    m.checkpoint = checkpoint;
    m.fuse = fuse;
    m.conv_policy.deterministic = 1;
    model_finalize(&m, gpu, 7);
    size_t in_bytes = model_input_floats(&m) * sizeof(float);
    float *grads = malloc(m.n_params * sizeof(float));
    float loss;
    if (gpu) {
        GPU_ONLY(gradients_on_gpu(&m, gpu, x, labels, grads));
    } else {
        memcpy(model_input_buffer(&m), x, in_bytes);
        model_forward(&m);
        softmax_xent_cpu(model_logits(&m), labels, BATCH, CLASSES, NULL, &loss, model_logits_grad(&m));
        model_backward(&m);
        memcpy(grads, m.grads, m.n_params * sizeof(float));
    }
    *bytes_out = model_bytes(&m);
    *n_out = m.n_params;
    model_destroy(&m);
    return grads;
}

static void check_checkpointing(GpuContext *gpu, int fuse, const float *x, const int32_t *labels) {
    const char *where = gpu ? "gpu" : "cpu", *fused = fuse ? " fused" : "";
    size_t plain_bytes, ckpt_bytes, n, n2;
    float *plain = gradients(0, fuse, gpu, x, labels, &plain_bytes, &n);
    float *ckpt = gradients(1, fuse, gpu, x, labels, &ckpt_bytes, &n2);
    CHECK(n == n2);
    CHECK_MSG(memcmp(plain, ckpt, n * sizeof(float)) == 0, "%s%s: checkpointed gradients differ (rel %.3g)", where,
              fused, test_rel_error(ckpt, plain, n));
    CHECK_MSG(ckpt_bytes < plain_bytes, "%s%s: checkpointing used %zu bytes, plain %zu", where, fused, ckpt_bytes,
              plain_bytes);
    double norm = 0;
    for (size_t i = 0; i < n; i++) norm += fabs(plain[i]);
    CHECK(norm > 0); /* a run that computed nothing must not pass */
    printf("%s%s: checkpointing %zu bytes, plain %zu bytes\n", where, fused, ckpt_bytes, plain_bytes);
    free(plain);
    free(ckpt);
}

#if TRAINC_CUDA
/* Under AMP in NHWC the input's conv, ReLU and max-pool run as one op (ops/conv_bias_relu_pool), whose
 * sums have a fixed order: checkpointed fp16 gradients are the plain ones bit for bit; and the conv's
 * output, never stored, takes no memory (against the unfused model). */
static void check_checkpointing_amp(GpuContext *gpu, const float *x, const int32_t *labels) {
    unsigned char *grads[2];
    size_t bytes = 0, used[2], unfused_bytes, conv_output_bytes;
    Model unfused;
    char why[256];
    CHECK(model_build(&unfused, "simplenet", BATCH, SIZE, CLASSES, 1, why, sizeof why) == 0);
    unfused.act_dtype = DTYPE_F16;
    unfused.conv_policy.deterministic = 1; /* the later convolutions' algorithms (and workspace) as below */
    model_finalize(&unfused, gpu, 7);
    unfused_bytes = model_bytes(&unfused);
    conv_output_bytes = (size_t)BATCH * 64 * SIZE * SIZE * dtype_size(DTYPE_F16);
    model_destroy(&unfused);
    for (int checkpoint = 0; checkpoint < 2; checkpoint++) {
        Model m;
        char err[256];
        CHECK(model_build(&m, "simplenet", BATCH, SIZE, CLASSES, 1, err, sizeof err) == 0);
        m.checkpoint = checkpoint;
        m.fuse = 1;
        m.act_dtype = DTYPE_F16;
        m.conv_policy.deterministic = 1;
        model_finalize(&m, gpu, 7);
        CHECK_MSG(m.plan->layers[0].pool_layer == 2 && m.plan->layers[2].pool_by_conv && !m.acts[m.layers[0].out].value,
                  "fp16 nhwc: the input's block is not one op, or its conv's output has a buffer");
        bytes = m.n_params * dtype_size(m.act_dtype);
        grads[checkpoint] = malloc(m.n_params * sizeof(float));
        gradients_on_gpu(&m, gpu, x, labels, (float *)grads[checkpoint]);
        used[checkpoint] = model_bytes(&m);
        model_destroy(&m);
    }
    CHECK_MSG(memcmp(grads[0], grads[1], bytes) == 0, "gpu fp16 nhwc fused: checkpointed gradients differ");
    CHECK_MSG(used[0] + conv_output_bytes <= unfused_bytes, "gpu fp16 nhwc: fused %zu bytes, unfused %zu: the input "
              "conv's output (%zu bytes) is still stored", used[0], unfused_bytes, conv_output_bytes);
    CHECK_MSG(used[1] < used[0], "gpu fp16 nhwc fused: checkpointing used %zu bytes, plain %zu", used[1], used[0]);
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i++) nonzero += grads[0][i] != 0;
    CHECK(nonzero > bytes / 4); /* a run that computed nothing must not pass */
    printf("gpu fp16 nhwc fused: checkpointing %zu bytes, plain %zu bytes\n", used[1], used[0]);
    free(grads[0]), free(grads[1]);
}
#endif

/* On the CPU, bias + ReLU + max-pool as one op (its backward writing the
 * conv's output gradient over that output) gives bitwise the unfused
 * gradients: the same additions in the same order; and needs less memory. */
static void check_fusion_cpu(const float *x, const int32_t *labels) {
    size_t plain_bytes, fused_bytes, n, n2;
    float *plain = gradients(0, 0, NULL, x, labels, &plain_bytes, &n);
    float *fused = gradients(0, 1, NULL, x, labels, &fused_bytes, &n2);
    CHECK(n == n2);
    CHECK_MSG(memcmp(plain, fused, n * sizeof(float)) == 0, "cpu: fused gradients differ (rel %.3g)",
              test_rel_error(fused, plain, n));
    CHECK_MSG(fused_bytes < plain_bytes, "cpu: fused used %zu bytes, unfused %zu", fused_bytes, plain_bytes);
    printf("cpu: fused %zu bytes, unfused %zu bytes\n", fused_bytes, plain_bytes);
    free(plain);
    free(fused);
}

static Config *small_run(const char *device, int batch, int accumulate) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    char err[512], line[128];
    const char *sets[] = {"data.source=synthetic", "data.image_size=32", "data.synthetic_train=512",
                          "data.synthetic_test=32", "run.epochs=1", "run.max_steps=4", "run.eval=off",
                          "run.warmup_steps=0", "optim.lr=0.05", "optim.momentum=0.9",
                          "optim.nesterov=on", "optim.weight_decay=0.01", "run.log_every=1000"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) CHECK(config_set(c, sets[i], err, sizeof err) == 0);
    snprintf(line, sizeof line, "run.device=%s", device);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    snprintf(line, sizeof line, "train.batch=%d", batch);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    snprintf(line, sizeof line, "memory.accumulate=%d", accumulate);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    return c;
}

static float *run_params(Config *c, size_t *n) {
    TrainSummary s;
    float *params;
    train_run_keep_params(c, &s, &params);
    CHECK(s.steps == 4);
    *n = 0;
    config_free(c);
    return params;
}

static size_t simplenet32_params(void) {
    Model m;
    char err[128];
    model_build(&m, "simplenet", 1, SIZE, CLASSES, 0, err, sizeof err);
    size_t n = 0;
    for (int i = 0; i < m.n_layers; i++) n += m.layers[i].w_count + m.layers[i].b_count;
    return n;
}

static void check_accumulation(void) {
    size_t n, unused;
    float *whole = run_params(small_run("cpu", 32, 1), &unused);
    float *micro = run_params(small_run("cpu", 8, 4), &unused);
    n = simplenet32_params();
    double e = test_rel_error(micro, whole, n);
    CHECK_MSG(e < 1e-5, "4 x 8 accumulated vs 32 at once: params rel error %.3g", e);
    printf("cpu: 4 x 8 accumulated against 32 at once after 4 steps: weights %.3g relative\n", e);
    /* and the steps did move the weights: a different batch gives different ones */
    float *other = run_params(small_run("cpu", 16, 1), &unused);
    CHECK(test_rel_error(other, whole, n) > 1e-4);
    free(whole);
    free(micro);
    free(other);
}

/* run.nvtx_layers only marks the layers for a profiler: the same weights. */
static void check_nvtx_layers(void) {
    char err[128];
    size_t unused, n = simplenet32_params();
    float *plain = run_params(small_run("cpu", 16, 1), &unused);
    Config *c = small_run("cpu", 16, 1);
    CHECK(config_set(c, "run.nvtx_layers=on", err, sizeof err) == 0);
    float *marked = run_params(c, &unused);
    CHECK_MSG(memcmp(plain, marked, n * sizeof(float)) == 0, "run.nvtx_layers changed the weights");
    free(plain);
    free(marked);
}

/* amp: "off", "fp16" or "bf16"; checkpointing on for the half runs. */
static void check_cuda_graph(const char *amp) {
    size_t unused, n = simplenet32_params();
    char err[256], line[64];
    float *runs[2];
    for (int graph = 0; graph < 2; graph++) {
        Config *c = small_run("cuda", 16, 2);
        snprintf(line, sizeof line, "precision.amp=%s", amp);
        CHECK(config_set(c, line, err, sizeof err) == 0);
        if (strcmp(amp, "off") != 0) CHECK(config_set(c, "memory.checkpoint=blocks", err, sizeof err) == 0);
        CHECK(config_set(c, graph ? "perf.cuda_graph=on" : "perf.cuda_graph=off", err, sizeof err) == 0);
        runs[graph] = run_params(c, &unused);
    }
    CHECK_MSG(memcmp(runs[0], runs[1], n * sizeof(float)) == 0, "amp %s: graph run differs from eager (rel %.3g)",
              amp, test_rel_error(runs[1], runs[0], n));
    float *fp32 = run_params(small_run("cuda", 16, 2), &unused);
    double e = test_rel_error(runs[0], fp32, n);
    if (strcmp(amp, "off") != 0) /* close to the fp32 run, yet not the fp32 run */
        CHECK_MSG(e < 2e-2 && e > 0, "amp %s after 4 steps: params rel error to fp32 %.3g", amp, e);
    free(runs[0]);
    free(runs[1]);
    free(fp32);
}

/* The same run in NCHW and NHWC starts from the same function (the weights are
 * laid out for each), so it follows the same losses. */
static void check_layouts(const char *amp, double tol) {
    char err[256], line[64];
    double loss[2];
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        Config *c = small_run("cuda", 16, 1);
        snprintf(line, sizeof line, "precision.amp=%s", amp);
        CHECK(config_set(c, line, err, sizeof err) == 0);
        CHECK(config_set(c, nhwc ? "model.layout=nhwc" : "model.layout=nchw", err, sizeof err) == 0);
        TrainSummary s;
        train_run(c, &s);
        loss[nhwc] = s.final_loss;
        config_free(c);
    }
    CHECK_MSG(isfinite(loss[0]) && fabs(loss[1] - loss[0]) <= tol * fabs(loss[0]),
              "amp %s: loss after 4 steps NCHW %.6f NHWC %.6f", amp, loss[0], loss[1]);
}

/* Fused conv + bias + ReLU computes the unfused function: the same losses,
 * up to the order of the bias-gradient sums. */
static void check_fusion(const char *amp, const char *layout, double tol) {
    char err[256], line[64];
    double loss[2];
    for (int fuse = 0; fuse < 2; fuse++) {
        Config *c = small_run("cuda", 16, 1);
        snprintf(line, sizeof line, "precision.amp=%s", amp);
        CHECK(config_set(c, line, err, sizeof err) == 0);
        snprintf(line, sizeof line, "model.layout=%s", layout);
        CHECK(config_set(c, line, err, sizeof err) == 0);
        CHECK(config_set(c, fuse ? "model.fuse=on" : "model.fuse=off", err, sizeof err) == 0);
        TrainSummary s;
        train_run(c, &s);
        loss[fuse] = s.final_loss;
        config_free(c);
    }
    CHECK_MSG(isfinite(loss[0]) && fabs(loss[1] - loss[0]) <= tol * fabs(loss[0]),
              "amp %s %s: loss after 4 steps unfused %.6f fused %.6f", amp, layout, loss[0], loss[1]);
}

int main(void) {
    uint64_t rng = test_seed();
    size_t in_n = (size_t)BATCH * 3 * SIZE * SIZE;
    float *x = malloc(in_n * sizeof(float));
    test_fill_uniform(x, in_n, &rng, -2, 2);
    int32_t labels[BATCH];
    for (int i = 0; i < BATCH; i++) labels[i] = (int32_t)test_uniform(&rng, 0, CLASSES - 0.01f);

    check_checkpointing(NULL, 0, x, labels);
    check_checkpointing(NULL, 1, x, labels);
    check_fusion_cpu(x, labels);
    check_accumulation();
    check_nvtx_layers();
    if (gpu_count() > 0) {
        GpuContext gpu;
        gpu_context_init(&gpu, 0);
        check_checkpointing(&gpu, 0, x, labels);
        check_checkpointing(&gpu, 1, x, labels);
        GPU_ONLY(check_checkpointing_amp(&gpu, x, labels));
        gpu_context_destroy(&gpu);
        check_cuda_graph("off");
        check_cuda_graph("fp16");
        check_cuda_graph("bf16");
        check_layouts("off", 1e-4);
        check_layouts("fp16", 2e-2);
        check_fusion("off", "nchw", 1e-4);
        check_fusion("off", "nhwc", 1e-4);
        check_fusion("fp16", "nchw", 2e-2);
        check_fusion("fp16", "nhwc", 2e-2);
        check_fusion("bf16", "nhwc", 5e-2);
    } else {
        printf("no GPU: GPU checks skipped\n");
    }
    free(x);
    return test_finish("test_train_memory");
}
