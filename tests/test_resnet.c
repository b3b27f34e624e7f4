/* ResNet as a composition of ops: a residual net's gradients against finite
 * differences (CPU), checkpointed and plain gradients bitwise equal, ResNet-18's
 * step on the GPU against the CPU, evaluation with running statistics, the
 * ImageNet stem on each form of the image against on the image itself and
 * fused against unfused (its max-pool in its batch norm's pass), and
 * every speed switch giving the same training run (GPU); a second backward
 * adding to the first's gradients (both); on the CPU, the
 * recipe through the trainer overfits one fixed batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "models/plan.h"
#include "models/zoo.h"
#include "ops/cast.h"
#include "ops/sgd.h"
#include "ops/softmax_xent.h"
#include "runtime/check.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

enum { SMALL_BATCH = 6, SMALL_SIZE = 8, SMALL_CLASSES = 5 };

/* Stem, an identity block and a projection block (stride 2). */
static void build_small(Model *m, int checkpoint) {
    model_init(m, SMALL_BATCH, SMALL_CLASSES, 0);
    m->checkpoint = checkpoint;
    m->conv_policy.deterministic = 1;
    int x = model_input(m, 4, SMALL_SIZE, SMALL_SIZE);
    x = model_relu(m, model_batchnorm(m, model_conv_no_bias(m, x, 8, 3, 1, 1)));
    for (int stage = 0; stage < 2; stage++) {
        int c = 8 << stage, stride = stage ? 2 : 1;
        model_block_begin(m);
        int y = model_relu(m, model_batchnorm(m, model_conv_no_bias(m, x, c, 3, 1, stride)));
        y = model_batchnorm(m, model_conv_no_bias(m, y, c, 3, 1, 1));
        int shortcut = stage ? model_batchnorm(m, model_conv_no_bias(m, x, c, 1, 0, 2)) : x;
        x = model_relu(m, model_add(m, y, shortcut));
        model_block_end(m);
    }
    model_linear(m, model_avgpool(m, x), SMALL_CLASSES);
}

static float loss_of(Model *m, const float *x, const int32_t *labels) {
    float loss;
    memcpy(model_input_buffer(m), x, model_input_floats(m) * sizeof(float));
    model_forward(m);
    softmax_xent_cpu(model_logits(m), labels, m->batch, m->num_classes, NULL, &loss, model_logits_grad(m));
    return loss;
}

typedef struct {
    double err, fd;
} FdSample;

static int by_error(const void *a, const void *b) {
    double x = ((const FdSample *)a)->err, y = ((const FdSample *)b)->err;
    return (x > y) - (x < y);
}

/* Central differences in float through ReLU kinks and batch statistics are
 * noisy: a step of h crosses a kink with a probability that grows with h (the
 * one-sided derivatives differ there, by up to 3x seen), and a smaller h
 * leaves more of the float loss's rounding (1.2e-7 / 2h). h = 1e-4 balanced
 * the two best. In 2000 runs (1000 seeds on SkylakeX's OpenBLAS kernels, 250
 * each on Haswell's, Sandybridge's, Nehalem's and Prescott's) at most 8 of 120
 * parameters missed the bound (0.25 on average) and the error of the best 90%
 * stayed below 0.027 relative; with h = 1e-3 and 60 parameters, 0.7% of seeds
 * failed. So the bounds let a tenth of the parameters miss and measure the
 * error of the rest. A missing residual gradient (tried: layers overwriting
 * the input gradient they add to) failed both bounds for each of 200 seeds. */
static void check_finite_differences(const float *x, const int32_t *labels, uint64_t *rng) {
    enum { SAMPLES = 120 };
    Model m;
    build_small(&m, 0);
    model_finalize(&m, NULL, 3);
    loss_of(&m, x, labels);
    model_zero_grads(&m);
    model_backward(&m);
    float *analytic = malloc(m.n_params * sizeof(float));
    memcpy(analytic, m.grads, m.n_params * sizeof(float));
    const float h = 1e-4f;
    FdSample samples[SAMPLES];
    int nonzero = 0, within = 0;
    for (int k = 0; k < SAMPLES; k++) {
        size_t i = (size_t)test_uniform(rng, 0, (float)m.n_params - 0.01f);
        float saved = m.params[i], up_p = saved + h, down_p = saved - h;
        m.params[i] = up_p;
        double up = loss_of(&m, x, labels);
        m.params[i] = down_p;
        double down = loss_of(&m, x, labels);
        m.params[i] = saved;
        double fd = (up - down) / ((double)up_p - (double)down_p), err = fabs(fd - analytic[i]);
        if (err <= 1e-3 + 5e-2 * fabs(fd)) within++;
        else printf("parameter %zu: analytic %.6g, finite differences %.6g\n", i, analytic[i], fd);
        samples[k] = (FdSample){err, fd};
        nonzero += fabs(fd) > 1e-4;
    }
    qsort(samples, SAMPLES, sizeof *samples, by_error);
    double diff2 = 0, fd2 = 0;
    for (int k = 0; k < SAMPLES - SAMPLES / 10; k++) { /* all but the tenth with the largest errors */
        diff2 += samples[k].err * samples[k].err;
        fd2 += samples[k].fd * samples[k].fd;
    }
    double rel = sqrt(diff2 / fd2);
    CHECK_MSG(within >= SAMPLES * 9 / 10, "only %d of %d parameters agree with finite differences", within, SAMPLES);
    CHECK_MSG(rel < 0.1, "gradient against finite differences: relative error %.3g (the best 90%%)", rel);
    CHECK(nonzero > SAMPLES / 3); /* gradients that are all 0 would pass the bound */
    printf("residual net: %d of %d parameters within the bound of finite differences, relative error %.3g "
           "(the best 90%%)\n", within, SAMPLES, rel);
    free(analytic);
    model_destroy(&m);
}

#if TRAINC_CUDA /* the GPU's parts; a build without CUDA checks the CPU alone */
static void gradients_on_gpu(Model *m, GpuContext *gpu, const float *x, const int32_t *labels, float *grads,
                             float *logits) {
    size_t in_bytes = model_input_floats(m) * sizeof(float), out_n = (size_t)m->batch * m->num_classes;
    int32_t *d_labels;
    float *d_loss;
    CUDA_CHECK(cudaMalloc((void **)&d_labels, m->batch * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc((void **)&d_loss, sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_labels, labels, m->batch * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(model_input_buffer(m), x, in_bytes, cudaMemcpyHostToDevice));
    model_forward(m);
    softmax_xent_cuda(m->act_dtype, model_logits(m), d_labels, m->batch, m->num_classes, NULL, d_loss,
                      model_logits_grad(m), gpu->compute);
    model_backward(m);
    CUDA_CHECK(cudaStreamSynchronize(gpu->compute));
    CUDA_CHECK(cudaMemcpy(grads, m->grads, m->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(logits, model_logits(m), out_n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_labels));
    CUDA_CHECK(cudaFree(d_loss));
}
#endif

/* Parameter gradients of one forward/backward (host copy) and the logits. */
static float *gradients(Model *m, GpuContext *gpu, const float *x, const int32_t *labels, float **logits_out) {
    size_t out_n = (size_t)m->batch * m->num_classes;
    float *grads = malloc(m->n_params * sizeof(float)), *logits = malloc(out_n * sizeof(float));
    if (gpu) {
        GPU_ONLY(gradients_on_gpu(m, gpu, x, labels, grads, logits));
    } else {
        loss_of(m, x, labels);
        model_backward(m);
        memcpy(grads, m->grads, m->n_params * sizeof(float));
        memcpy(logits, model_logits(m), out_n * sizeof(float));
    }
    if (logits_out) *logits_out = logits;
    else free(logits);
    return grads;
}

static float *resnet18_gradients(int checkpoint, GpuContext *gpu, int batch, const float *x, const int32_t *labels,
                                 size_t *n, size_t *bytes, float **logits) {
    Model m;
    char err[256];
    CHECK(model_build(&m, "resnet18", batch, 32, 10, 0, err, sizeof err) == 0);
    m.checkpoint = checkpoint & 1;
    m.fuse = (checkpoint >> 1) & 1; /* 2: fused batch norm + ReLU and add + ReLU */
    m.fuse_graphs = (checkpoint >> 2) & 1; /* 4: and model.fuse = graphs */
    m.overlap_wgrad = checkpoint >> 3;     /* 8: filter gradients on the side stream (GPU) */
    m.conv_policy.deterministic = 1;
    model_finalize(&m, gpu, 11);
    if (m.fuse_graphs && !gpu) { /* the CPU takes every pair, prologue and norm's backward: 20, 8 and 8 */
        int pairs = 0, prologues = 0, dgrads = 0;
        for (int i = 0; i < m.n_layers; i++) {
            const LayerPlan *p = &m.plan->layers[i];
            pairs += p->stats_by_conv, prologues += p->prologue_bn >= 0;
            dgrads += p->dgrad_dbn && m.plan->layers[p->dbn_layer].backward_by_conv && p->dbn_layer == i - 2;
        }
        CHECK_MSG(pairs == 20 && prologues == 8 && dgrads == 8,
                  "cpu resnet18 model.fuse = graphs: %d pairs, %d prologues, %d norms' backward in a data gradient",
                  pairs, prologues, dgrads);
    }
    float *g = gradients(&m, gpu, x, labels, logits);
    *n = m.n_params;
    *bytes = model_bytes(&m);
    model_destroy(&m);
    return g;
}

static void check_checkpointing(GpuContext *gpu, int batch, const float *x, const int32_t *labels) {
    size_t n, n2, plain_bytes, ckpt_bytes;
    float *plain = resnet18_gradients(0, gpu, batch, x, labels, &n, &plain_bytes, NULL);
    float *ckpt = resnet18_gradients(1, gpu, batch, x, labels, &n2, &ckpt_bytes, NULL);
    CHECK(n == n2 && n > 11000000); /* ResNet-18 for 10 classes: 11.17 M parameters */
    CHECK_MSG(memcmp(plain, ckpt, n * sizeof(float)) == 0, "%s: checkpointed ResNet-18 gradients differ (rel %.3g)",
              gpu ? "gpu" : "cpu", test_rel_error(ckpt, plain, n));
    CHECK_MSG(ckpt_bytes < plain_bytes, "checkpointing %zu bytes, plain %zu", ckpt_bytes, plain_bytes);
    double norm = 0;
    for (size_t i = 0; i < n; i++) norm += fabs(plain[i]);
    CHECK(norm > 0);
    printf("%s resnet18: checkpointed gradients bitwise equal, %zu bytes against %zu\n", gpu ? "gpu" : "cpu",
           ckpt_bytes, plain_bytes);
    free(plain);
    free(ckpt);
}

static void report_layers(const float *got, const float *want, int batch);

/* model.fuse = graphs on the CPU, where the pairs and prologues compose the
 * reference ops (models/plan_graphs.c), against model.fuse = on: the
 * statistics from the convolutions' sums, and 8 norms + ReLU applied as the
 * next convolution loads its input, forward and filter gradient, with the
 * norm's output never written. x' = x * scale + bias in float, where the norm
 * computes in double, is the only difference, a rounding; but where it flips
 * a ReLU's mask downstream (an input within ~1e-7 of 0: seeds 3 and 5 of 1 to
 * 5 gave 4.2e-3 and 5.2e-4, the others 1.5e-6) every gradient before it moves
 * by about that element's share of its layer's. The whole and each prologue
 * convolution's filter gradient are bounded at 5e-2: with the filter
 * gradients left out (tried) they were off by 0.65 and 1, with the prologue
 * on the norm's unwritten output by 1e5. Checkpointed, the same bits. */
static void check_graph_fusion_cpu(int batch, const float *x, const int32_t *labels, const float *fused, size_t n) {
    size_t n2, bytes;
    float *graphs = resnet18_gradients(6, NULL, batch, x, labels, &n2, &bytes, NULL);
    double e = test_rel_error(graphs, fused, n), worst = 0;
    Model m;
    char err[256];
    CHECK(model_build(&m, "resnet18", batch, 32, 10, 0, err, sizeof err) == 0);
    int prologue_convs[] = {6, 13, 20, 29, 36, 45, 52, 61}; /* after the first norm of each block */
    for (int i = 0; i < 8; i++) {
        const Layer *l = &m.layers[prologue_convs[i]];
        CHECK(l->kind == LAYER_CONV);
        worst = fmax(worst, test_rel_error(graphs + l->w_off, fused + l->w_off, l->w_count));
    }
    CHECK_MSG(n == n2 && e < 5e-2 && worst < 5e-2,
              "cpu resnet18: model.fuse = graphs gradients differ from on by %.3g (the prologue convs' up to %.3g)", e,
              worst);
    printf("cpu resnet18: model.fuse = graphs against on, gradients %.3g relative, the prologue convs' up to %.3g\n",
           e, worst);
    if (e >= 1e-4) report_layers(graphs, fused, batch);
    float *ckpt = resnet18_gradients(7, NULL, batch, x, labels, &n2, &bytes, NULL);
    CHECK_MSG(memcmp(ckpt, graphs, n * sizeof(float)) == 0,
              "cpu resnet18: model.fuse = graphs gradients change when checkpointed (rel %.3g)",
              test_rel_error(ckpt, graphs, n));
    free(graphs);
    free(ckpt);
}

/* The activation gradients' buffers of ResNet-50 (batch 2, 32x32) under
 * model.fuse = on (graphs 0) or graphs (1), in floats. */
static size_t resnet50_grad_floats(int graphs) {
    Model m;
    char err[256];
    CHECK(model_build(&m, "resnet50", 2, 32, 10, 0, err, sizeof err) == 0);
    m.fuse = 1, m.fuse_graphs = graphs;
    model_finalize(&m, NULL, 11);
    size_t floats = 0;
    for (int s = 0; s < m.n_grad_slots; s++) floats += m.act_grad_floats[s];
    model_destroy(&m);
    return floats;
}

/* ResNet-50's plan under model.fuse = graphs on the CPU: each of its 53
 * convolutions before a batch norm sums that norm's input, and each
 * bottleneck's first two norms + ReLU (32) are the next convolution's
 * prologue and run their backward in its data gradient; the others' outputs
 * are read by more than one layer or by an add. The norms' input and output
 * gradients then share a buffer, so that the activation gradients take no
 * more memory than under model.fuse = on (one buffer more, tried, took an
 * activation's size more). */
static void check_graph_fusion_plan_resnet50(void) {
    size_t on_floats = resnet50_grad_floats(0), graphs_floats = resnet50_grad_floats(1);
    CHECK_MSG(graphs_floats == on_floats,
              "cpu resnet50: activation gradients take %zu floats under model.fuse = graphs, %zu under on",
              graphs_floats, on_floats);
    Model m;
    char err[256];
    CHECK(model_build(&m, "resnet50", 2, 32, 10, 0, err, sizeof err) == 0);
    m.fuse = m.fuse_graphs = 1;
    model_finalize(&m, NULL, 11);
    int pairs = 0, prologues = 0, dgrads = 0;
    for (int i = 0; i < m.n_layers; i++) {
        const LayerPlan *p = &m.plan->layers[i];
        pairs += p->stats_by_conv, prologues += p->by_conv_prologue;
        dgrads += p->backward_by_conv && m.plan->layers[i + 2].dgrad_dbn && m.plan->layers[i + 2].dbn_layer == i;
    }
    CHECK_MSG(pairs == 53 && prologues == 32 && dgrads == 32,
              "cpu resnet50 model.fuse = graphs: %d pairs, %d prologues, %d norms' backward in a data gradient", pairs,
              prologues, dgrads);
    printf("cpu resnet50 model.fuse = graphs: %d pairs, %d prologues, %d norms' backward in a data gradient\n", pairs,
           prologues, dgrads);
    model_destroy(&m);
}

/* model.fuse on the CPU against unfused: the batch norms with the add (and its
 * ReLU, forward and, BN_ACT_ADD_RELU, backward) and with their ReLU. Only
 * rounding differs (the add of a fused norm rounds its sum from double); a
 * mask applied after a downsample's norm had read dy, say, would be off by
 * far more. */
static void check_fused_cpu(int batch, const float *x, const int32_t *labels) {
    size_t n, n2, bytes;
    float *plain = resnet18_gradients(0, NULL, batch, x, labels, &n, &bytes, NULL);
    float *fused = resnet18_gradients(2, NULL, batch, x, labels, &n2, &bytes, NULL);
    double e = test_rel_error(fused, plain, n);
    CHECK_MSG(n == n2 && e < 1e-5, "cpu resnet18: fused gradients differ from unfused by %.3g", e);
    printf("cpu resnet18: fused against unfused gradients %.3g relative\n", e);
    check_graph_fusion_cpu(batch, x, labels, fused, n);
    free(plain);
    free(fused);
}

/* The error of each parameter layer's gradients, where it is large. */
static void report_layers(const float *got, const float *want, int batch) {
    Model m;
    char err[256];
    model_build(&m, "resnet18", batch, 32, 10, 0, err, sizeof err);
    for (int i = 0; i < m.n_layers; i++) {
        const Layer *l = &m.layers[i];
        if (!l->w_count) continue;
        double e = test_rel_error(got + l->w_off, want + l->w_off, l->w_count);
        if (l->b_count) e = fmax(e, test_rel_error(got + l->b_off, want + l->b_off, l->b_count));
        if (e > 1e-3) printf("  layer %d (kind %d): gradient relative error %.3g\n", i, l->kind, e);
    }
}

/* fuse: the GPU's fused kernels against the CPU's fused references. */
static void check_gpu_against_cpu(GpuContext *gpu, int batch, const float *x, const int32_t *labels, int fuse) {
    size_t n, n2, bytes;
    float *cpu_logits, *gpu_logits;
    float *cpu = resnet18_gradients(fuse ? 2 : 0, NULL, batch, x, labels, &n, &bytes, &cpu_logits);
    float *dev = resnet18_gradients(fuse ? 2 : 0, gpu, batch, x, labels, &n2, &bytes, &gpu_logits);
    CHECK(n == n2);
    double e_grad = test_rel_error(dev, cpu, n), e_logits = test_rel_error(gpu_logits, cpu_logits, (size_t)batch * 10);
    /* cuDNN's fp32 algorithms (Winograd among them) round differently from the
     * CPU's im2col, and 17 batch norms amplify it, up to ~1e-2 at batch 32; a
     * missing or doubled gradient path is off by far more. */
    CHECK_MSG(e_grad < 2e-2, "resnet18%s gradients GPU vs CPU: relative error %.3g", fuse ? " fused" : "", e_grad);
    CHECK_MSG(e_logits < 1e-4, "resnet18%s logits GPU vs CPU: relative error %.3g", fuse ? " fused" : "", e_logits);
    if (e_grad >= 2e-2) report_layers(dev, cpu, batch);
    printf("resnet18%s one step, GPU against CPU (fp32): gradients %.3g, logits %.3g relative\n", fuse ? " fused" : "",
           e_grad, e_logits);
    free(cpu);
    free(dev);
    free(cpu_logits);
    free(gpu_logits);
}

/* A second backward without model_zero_grads adds to the first's gradients,
 * as memory.accumulate's later micro-batches do: the backward of one forward
 * run twice gives twice its gradients (one forward, so that the ReLUs' masks
 * are the same in both). once and twice: the gradients after the first and
 * the second pass (once is doubled here); the whole and each convolution's
 * filter gradient within bound. A convolution whose second pass overwrote
 * would be off by 0.5. */
static void check_twice(const Model *m, float *once, const float *twice, const char *what, double bound) {
    for (size_t i = 0; i < m->n_params; i++) once[i] *= 2.0f;
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_CONV) continue;
        double e = test_rel_error(twice + l->w_off, once + l->w_off, l->w_count);
        if (e >= worst) worst = e, worst_name = l->name;
    }
    double e = test_rel_error(twice, once, m->n_params);
    CHECK_MSG(e < bound && worst < bound, "%s: two backward passes against twice one: %.3g, the convolutions' filter "
              "gradients up to %.3g (%s)", what, e, worst, worst_name);
    printf("%s, two backward passes against twice one: gradients %.3g relative, the convolutions' up to %.3g (%s)\n",
           what, e, worst, worst_name);
}

/* check_twice on the CPU, fp32, model.fuse = graphs (every pair, prologue and
 * norm's backward taken): the sums of the second pass added onto the first's
 * in another order, a few roundings apart. */
static void check_backward_adds_cpu(int batch, const float *x, const int32_t *labels) {
    Model m;
    char err[256];
    CHECK(model_build(&m, "resnet18", batch, 32, 10, 0, err, sizeof err) == 0);
    m.fuse = m.fuse_graphs = 1;
    model_finalize(&m, NULL, 11);
    loss_of(&m, x, labels);
    float *grads[2], loss;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) /* the logits' gradient again: backward may reuse its buffer */
            softmax_xent_cpu(model_logits(&m), labels, m.batch, m.num_classes, NULL, &loss, model_logits_grad(&m));
        model_backward(&m);
        grads[pass] = malloc(m.n_params * sizeof(float));
        memcpy(grads[pass], m.grads, m.n_params * sizeof(float));
    }
    check_twice(&m, grads[0], grads[1], "cpu resnet18 graphs", 1e-5);
    model_destroy(&m);
    free(grads[0]);
    free(grads[1]);
}

#if TRAINC_CUDA
static float *to_host_floats(const float *dev, size_t n) {
    float *h = malloc(n * sizeof(float));
    CUDA_CHECK(cudaMemcpy(h, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

/* Three SGD steps, fused against unfused on the GPU (fp32): the gradients of
 * each step agree, so state carried between steps is right too. The steps are
 * small: a random batch's loss surface turns rounding differences into
 * diverging runs at a learning rate that trains. */
static void check_fused_steps(GpuContext *gpu, int batch, const float *x, const int32_t *labels) {
    Model m[2];
    char err[256];
    int32_t *d_labels;
    float *d_loss, *lr;
    CUDA_CHECK(cudaMalloc((void **)&d_labels, batch * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc((void **)&d_loss, sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&lr, sizeof(float)));
    float lr_value = 1e-4f;
    CUDA_CHECK(cudaMemcpy(lr, &lr_value, sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_labels, labels, batch * sizeof(int32_t), cudaMemcpyHostToDevice));
    for (int f = 0; f < 2; f++) {
        CHECK(model_build(&m[f], "resnet18", batch, 32, 10, 0, err, sizeof err) == 0);
        m[f].fuse = f;
        m[f].conv_policy.deterministic = 1;
        model_finalize(&m[f], gpu, 11);
    }
    size_t n = m[0].n_params;
    float *g[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    SgdParams sgd = {.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1};
    for (int step = 0; step < 3; step++) {
        for (int f = 0; f < 2; f++) {
            CUDA_CHECK(cudaMemcpy(model_input_buffer(&m[f]), x, model_input_floats(&m[f]) * sizeof(float),
                                  cudaMemcpyHostToDevice));
            model_forward(&m[f]);
            softmax_xent_cuda(DTYPE_F32, model_logits(&m[f]), d_labels, batch, 10, NULL, d_loss,
                              model_logits_grad(&m[f]), gpu->compute);
            model_zero_grads(&m[f]);
            model_backward(&m[f]);
            CUDA_CHECK(cudaStreamSynchronize(gpu->compute));
            CUDA_CHECK(cudaMemcpy(g[f], m[f].grads, n * sizeof(float), cudaMemcpyDeviceToHost));
            sgd_step_cuda(m[f].params, m[f].grads, m[f].momentum, n, lr, sgd, gpu->compute);
        }
        double e = test_rel_error(g[1], g[0], n);
        /* On an H200: 6.8e-6 at the first step, then 5e-4 and 4.4e-3. On an
         * H100, three calls: 6.8e-6 at the first step (in the two where it
         * was read), then 4.0e-3 and 6.7e-3, 7.1e-3 and 1.3e-2, 1.7e-4 and
         * 9.2e-4. The two runs drift apart faster than their first-step
         * difference explains (an open question, see the README), and by a
         * varying amount; a wrong fused gradient is off by far more from the
         * first step on. */
        double bound = step == 0 ? 1e-4 : 5e-2;
        CHECK_MSG(e < bound, "resnet18 step %d, batch %d: fused gradients differ from unfused by %.3g", step, batch, e);
        if (e >= bound) report_layers(g[1], g[0], batch);
        printf("resnet18 step %d, batch %d: fused against unfused gradients (GPU, fp32) %.3g relative\n", step, batch, e);
    }
    for (int f = 0; f < 2; f++) {
        model_destroy(&m[f]);
        free(g[f]);
    }
    CUDA_CHECK(cudaFree(d_labels));
    CUDA_CHECK(cudaFree(d_loss));
    CUDA_CHECK(cudaFree(lr));
}

/* ResNet-18 at 128 pixels (ImageNet's 7x7 stride-2 stem over 3 channels
 * padded to 8), fp32 channels-last, model.fuse on: one step with the stem on
 * each form of the image (models/plan.c) against the stem on the image
 * itself, and that against model.fuse off, whose stem's batch norm, ReLU and
 * max-pool run apart (fused, the norm's pass pools and its output is never
 * stored). The same products summed by other cuDNN algorithms, which it
 * picks per shape and, under other tests' load, per run (FFT among them, whose
 * rounding goes with the largest terms): the logits within 1e-3, and the
 * gradients within 3e-2, as each of the stem's filter gradients sums 16,384
 * products of random sign to a result about 128 times smaller than their
 * magnitudes (an H100 gave 3.8e-3 in one run, 4e-6 in another). A form
 * reading the wrong pixels or taps, or a pool reading the wrong channel's
 * statistics, is off by O(1). */
static void check_input_forms(GpuContext *gpu, int batch, const float *x, const int32_t *labels) {
    enum { UNFUSED = 3 }; /* runs 0..2: the stem on block 0 (the image), 1, 2's form; 3: model.fuse off */
    float *grads[4], *logits[4];
    size_t stem_off = 0, stem_count = 0, n = 0;
    for (int run = 0; run <= UNFUSED; run++) {
        Model m;
        char err[256];
        int block = run == UNFUSED ? 0 : run;
        CHECK(model_build(&m, "resnet18", batch, 128, 10, 1, err, sizeof err) == 0);
        m.fuse = run != UNFUSED;
        m.conv_policy.deterministic = 1;
        m.input_form_block = block; /* 0: perf.conv_benchmark off, so the image itself */
        model_finalize(&m, gpu, 11);
        const Layer *stem = &m.layers[0], *stem_bn = &m.layers[1];
        const LayerPlan *stem_plan = &m.plan->layers[0];
        CHECK_MSG(block == 0 ? !stem_plan->input_form : stem_plan->input_form != NULL,
                  "resnet18-128: the stem is %s a form of the image", block ? "not on" : "on");
        CHECK_MSG(!block == !!m.acts[0].value, "resnet18-128, block %d: the image %s stored", block,
                  m.acts[0].value ? "is" : "is not"); /* a form takes the batch straight from float32 */
        CHECK_MSG(stem_bn->kind == LAYER_BATCHNORM && (m.plan->layers[1].pool_layer >= 0) == m.fuse &&
                      (m.acts[stem_bn->out].value == NULL) == m.fuse,
                  "resnet18-128, model.fuse %d: the stem's max-pool %s in its batch norm's pass", m.fuse,
                  m.fuse ? "is not" : "is");
        stem_off = stem->w_off, stem_count = stem->w_count, n = m.n_params;
        grads[run] = gradients(&m, gpu, x, labels, &logits[run]);
        model_destroy(&m);
    }
    /* each form against the image; fused (the image) against unfused */
    const int pairs[3][2] = {{1, 0}, {2, 0}, {0, UNFUSED}};
    const char *names[4] = {"the stem on the image (model.fuse on)", "the stem on block 1's form",
                            "the stem on block 2's form", "model.fuse off"};
    for (int k = 0; k < 3; k++) {
        int got = pairs[k][0], want = pairs[k][1];
        double e_stem = test_rel_error(grads[got] + stem_off, grads[want] + stem_off, stem_count);
        double e_all = test_rel_error(grads[got], grads[want], n);
        double e_logits = test_rel_error(logits[got], logits[want], (size_t)batch * 10);
        CHECK_MSG(e_stem < 3e-2 && e_all < 3e-2 && e_logits < 1e-3,
                  "resnet18-128, %s against %s: stem gradient %.3g, all gradients %.3g, logits %.3g", names[got],
                  names[want], e_stem, e_all, e_logits);
        printf("resnet18-128 fp32, %s against %s: stem gradient %.3g, all %.3g, logits %.3g relative\n",
               names[got], names[want], e_stem, e_all, e_logits);
    }
    for (int run = 0; run <= UNFUSED; run++) free(grads[run]), free(logits[run]);
}

/* 'passes' forward and backward passes on the same batch (the caller ran the
 * first forward), the gradients added up (as micro-batches would be),
 * downloaded as floats. The loss is scaled by 1024 as the loss scaler would,
 * so that fp16's gradients stay normal numbers instead of rounding in the
 * subnormals. */
static float *gpu_gradients_passes(Model *m, GpuContext *gpu, const int32_t *labels, int passes) {
    int32_t *d_labels;
    float *d_loss, *d_scale, loss_scale = 1024.0f;
    CUDA_CHECK(cudaMalloc((void **)&d_labels, m->batch * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc((void **)&d_loss, sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&d_scale, sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_labels, labels, m->batch * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_scale, &loss_scale, sizeof(float), cudaMemcpyHostToDevice));
    for (int pass = 0; pass < passes; pass++) {
        if (pass) model_forward(m);
        softmax_xent_cuda(m->act_dtype, model_logits(m), d_labels, m->batch, m->num_classes, d_scale, d_loss,
                          model_logits_grad(m), gpu->compute);
        model_backward(m);
    }
    CUDA_CHECK(cudaStreamSynchronize(gpu->compute));
    size_t bytes = m->n_params * dtype_size(m->act_dtype);
    void *raw = malloc(bytes);
    float *grads = malloc(m->n_params * sizeof(float));
    CUDA_CHECK(cudaMemcpy(raw, m->grads, bytes, cudaMemcpyDeviceToHost));
    cast_to_f32_cpu(m->act_dtype, raw, grads, m->n_params);
    free(raw);
    CUDA_CHECK(cudaFree(d_labels));
    CUDA_CHECK(cudaFree(d_loss));
    CUDA_CHECK(cudaFree(d_scale));
    return grads;
}

/* The gradients of model.fuse = graphs against on (two passes): the
 * whole, each prologue convolution's filter gradient and each other one's.
 * In fp16 the fused pairs' statistics round differently from the separate
 * norm's, which turns some ReLU masks: on an H100 (seeds 1 to 3) the whole
 * was off by 0.100 to 0.106, the prologue convs by up to 0.110 to 0.119 and
 * the other convs by up to 0.112 to 0.119. So a prologue conv is held to its
 * neighbours' error (x1.5 + 0.05), the rest to 0.3: a prologue's filter
 * gradient overwritten instead of added to is off by 0.5, one left out by 1. */
static void check_graph_fusion_gradients(Model m[2], const float *grads[2]) {
    size_t n = m[0].n_params;
    double e = test_rel_error(grads[1], grads[0], n), worst = 0, worst_other = 0;
    int prologues = 0;
    for (int i = 0; i < m[1].n_layers; i++) {
        const Layer *l = &m[1].layers[i];
        if (l->kind != LAYER_CONV) continue;
        double e_conv = test_rel_error(grads[1] + l->w_off, grads[0] + l->w_off, l->w_count);
        if (m[1].plan->layers[i].prologue_bn < 0) {
            worst_other = fmax(worst_other, e_conv);
            continue;
        }
        prologues++;
        worst = fmax(worst, e_conv);
    }
    CHECK_MSG(e < 0.3 && worst_other < 0.3 && worst < 1.5 * worst_other + 0.05,
              "resnet18 model.fuse=graphs: gradients (two passes added) off by %.3g, the %d prologue convs' by up "
              "to %.3g, the other convs' by up to %.3g", e, prologues, worst, worst_other);
    printf("resnet18 model.fuse=graphs against on, fp16, two passes added: gradients %.3g relative, the %d "
           "prologue convs' up to %.3g, the other convs' up to %.3g\n", e, prologues, worst, worst_other);
}

/* model.fuse = graphs against model.fuse = on, fp16 channels-last, after one
 * training forward from the same parameters and batch: every batch norm's
 * saved statistics (mean, 1/std) and the change of its running ones, which
 * the fused pairs take from their convolution's sums (bn_finalize). A pair
 * reading another layer's sums, or leaving the running statistics alone, is
 * off by 100% or more; the H100 gave 1.2e-4 and 7e-5. Then the gradients
 * (check_graph_fusion_gradients). Without a fused pair (no engine on this
 * card) it says so and compares nothing. */
static void check_graph_fusion(GpuContext *gpu, int batch, const float *x, const int32_t *labels) {
    Model m[2];
    char err[256];
    float *stats[2], *saved[2], *grads[2];
    int fused = 0;
    for (int f = 0; f < 2; f++) {
        CHECK(model_build(&m[f], "resnet18", batch, 32, 10, 1, err, sizeof err) == 0);
        m[f].act_dtype = DTYPE_F16;
        m[f].fuse = 1;
        m[f].fuse_graphs = f;
        model_finalize(&m[f], gpu, 11);
        for (int i = 0; f && i < m[f].n_layers; i++) fused += m[f].plan->layers[i].genstats != NULL;
        CUDA_CHECK(cudaMemcpy(model_input_buffer(&m[f]), x, model_input_floats(&m[f]) * sizeof(float),
                              cudaMemcpyHostToDevice));
        model_forward(&m[f]);
        CUDA_CHECK(cudaStreamSynchronize(gpu->compute));
        stats[f] = malloc(m[f].n_bn_stats * sizeof(float));
        model_get_bn_stats(&m[f], stats[f]);
        for (int i = 0; i < m[f].n_layers; i++) { /* the running statistics' change: from 0 and 1 */
            const Layer *l = &m[f].layers[i];
            float *var = stats[f] + l->stat_off + l->bn.shape.c;
            for (int c = 0; l->kind == LAYER_BATCHNORM && c < l->bn.shape.c; c++) var[c] -= 1.0f;
        }
        saved[f] = to_host_floats(m[f].bn_saved, m[f].n_bn_stats);
        grads[f] = gpu_gradients_passes(&m[f], gpu, labels, 2);
    }
    if (fused == 0) {
        printf("resnet18 model.fuse=graphs: no cuDNN engine took a pair on this card; nothing to compare\n");
    } else {
        size_t n = m[0].n_bn_stats;
        double e_saved = test_rel_error(saved[1], saved[0], n), e_running = test_rel_error(stats[1], stats[0], n);
        CHECK_MSG(e_saved < 1e-2 && e_running < 1e-2,
                  "resnet18 model.fuse=graphs: batch-norm statistics off by %.3g (saved), %.3g (running)", e_saved,
                  e_running);
        printf("resnet18 model.fuse=graphs (%d pairs fused) against on, fp16: saved statistics %.3g, running %.3g "
               "relative\n", fused, e_saved, e_running);
        check_graph_fusion_gradients(m, (const float **)grads);
    }
    for (int f = 0; f < 2; f++) {
        model_destroy(&m[f]);
        free(stats[f]);
        free(saved[f]);
        free(grads[f]);
    }
}

/* perf.overlap_wgrad runs the same kernels on the same data, only some beside
 * others: the gradients to the bit, fp32 with checkpointing (backward then
 * joins before each block's recompute too) against plain, and fp16 under
 * model.fuse = graphs (the prologue convolutions' filter graphs forked too)
 * over two passes added (dy's buffers reused across the pass). A missing join
 * lets the download read the side stream's filter gradients before they are
 * written, or a batch norm overwrite the dy they read. */
static void check_overlap_wgrad(GpuContext *gpu, int batch, const float *x, const int32_t *labels) {
    size_t n, n2, plain_bytes, overlap_bytes;
    float *plain = resnet18_gradients(0, gpu, batch, x, labels, &n, &plain_bytes, NULL);
    float *overlap = resnet18_gradients(1 | 8, gpu, batch, x, labels, &n2, &overlap_bytes, NULL);
    CHECK(n == n2);
    CHECK_MSG(memcmp(plain, overlap, n * sizeof(float)) == 0,
              "resnet18 perf.overlap_wgrad with checkpointing: gradients differ (rel %.3g)",
              test_rel_error(overlap, plain, n));
    free(plain);
    free(overlap);
    Model m[2];
    char err[256];
    float *grads[2];
    for (int f = 0; f < 2; f++) {
        CHECK(model_build(&m[f], "resnet18", batch, 32, 10, 1, err, sizeof err) == 0);
        m[f].act_dtype = DTYPE_F16;
        m[f].fuse = m[f].fuse_graphs = 1;
        m[f].conv_policy.deterministic = 1;
        m[f].overlap_wgrad = f;
        model_finalize(&m[f], gpu, 11);
        CUDA_CHECK(cudaMemcpy(model_input_buffer(&m[f]), x, model_input_floats(&m[f]) * sizeof(float),
                              cudaMemcpyHostToDevice));
        model_forward(&m[f]);
        grads[f] = gpu_gradients_passes(&m[f], gpu, labels, 2);
    }
    double norm = 0;
    for (size_t i = 0; i < m[0].n_params; i++) norm += fabs(grads[0][i]);
    CHECK(norm > 0);
    CHECK_MSG(memcmp(grads[0], grads[1], m[0].n_params * sizeof(float)) == 0,
              "resnet18 perf.overlap_wgrad, fp16 model.fuse=graphs: gradients differ (rel %.3g)",
              test_rel_error(grads[1], grads[0], m[0].n_params));
    printf("resnet18 perf.overlap_wgrad: gradients bitwise equal (fp32 checkpointed, fp16 graphs over two passes); "
           "%zu bytes against %zu\n", overlap_bytes, plain_bytes);
    for (int f = 0; f < 2; f++) {
        model_destroy(&m[f]);
        free(grads[f]);
    }
    /* perf.conv_benchmark's start-up times prologues with the layers' own backward: it must not fork (a fork
     * nobody joined shared the workspace with the next run's convolutions, and the start-up never ended). */
    CHECK(model_build(&m[0], "resnet18", batch, 32, 10, 1, err, sizeof err) == 0);
    m[0].act_dtype = DTYPE_F16;
    m[0].fuse = m[0].fuse_graphs = m[0].overlap_wgrad = 1;
    m[0].conv_policy.benchmark = 1;
    model_finalize(&m[0], gpu, 11);
    CUDA_CHECK(cudaMemcpy(model_input_buffer(&m[0]), x, model_input_floats(&m[0]) * sizeof(float),
                          cudaMemcpyHostToDevice));
    model_forward(&m[0]);
    float *timed = gpu_gradients_passes(&m[0], gpu, labels, 2);
    double timed_norm = 0;
    for (size_t i = 0; i < m[0].n_params; i++) timed_norm += fabs(timed[i]);
    CHECK_MSG(isfinite(timed_norm) && timed_norm > 0, "resnet18 perf.overlap_wgrad after perf.conv_benchmark's "
              "start-up: gradients' sum of magnitudes %g", timed_norm);
    model_destroy(&m[0]);
    free(timed);
}

/* check_twice on the GPU: fp16, model.fuse = graphs under
 * perf.conv_benchmark, as training runs. The first backward overwrites the
 * convolutions' filter gradients (cuDNN's plans with beta 0, the direct
 * stem's finish storing), the second adds them (the legacy algorithm with
 * beta 1, the stem's finish adding, the prologue's graph through its
 * scratch). The passes differ by their engines' rounding alone (an fp16
 * rounding is 4.9e-4 relative). (A forward before each pass differs by more:
 * its statistics' rounding turns some masks, and the gradients moved by
 * 0.069 on an H200.) */
static void check_backward_adds(GpuContext *gpu, int batch, const float *x, const int32_t *labels) {
    Model m;
    char err[256];
    CHECK(model_build(&m, "resnet18", batch, 32, 10, 1, err, sizeof err) == 0);
    m.act_dtype = DTYPE_F16;
    m.fuse = m.fuse_graphs = 1;
    m.conv_policy.benchmark = 1;
    model_finalize(&m, gpu, 11);
    model_zero_grads(&m);
    CUDA_CHECK(cudaMemcpy(model_input_buffer(&m), x, model_input_floats(&m) * sizeof(float), cudaMemcpyHostToDevice));
    model_forward(&m);
    float *grads[2];
    for (int pass = 0; pass < 2; pass++) grads[pass] = gpu_gradients_passes(&m, gpu, labels, 1);
    check_twice(&m, grads[0], grads[1], "gpu resnet18 fp16 graphs", 1e-2);
    model_destroy(&m);
    free(grads[0]);
    free(grads[1]);
}
#endif

/* In evaluation a sample's logits depend on it alone (running statistics); in
 * training on its batch too. */
static void check_eval_mode(const float *x, const int32_t *labels, uint64_t *rng) {
    Model m;
    build_small(&m, 0);
    model_finalize(&m, NULL, 5);
    for (int i = 0; i < 3; i++) loss_of(&m, x, labels); /* move the running statistics off their start */
    size_t per_sample = model_input_floats(&m) / SMALL_BATCH, in_n = model_input_floats(&m);
    float *other = malloc(in_n * sizeof(float));
    memcpy(other, x, per_sample * sizeof(float));
    test_fill_uniform(other + per_sample, in_n - per_sample, rng, -2, 2);
    float first[2][SMALL_CLASSES];
    for (int training = 0; training < 2; training++) {
        model_set_training(&m, training);
        float *logits = model_logits(&m);
        m.bn_momentum = 0; /* the two training forwards see the same running statistics */
        loss_of(&m, x, labels);
        memcpy(first[0], logits, sizeof first[0]);
        loss_of(&m, other, labels);
        memcpy(first[1], logits, sizeof first[1]);
        int same = memcmp(first[0], first[1], sizeof first[0]) == 0;
        CHECK_MSG(same == !training, "%s: sample 0's logits %s when the rest of the batch changed",
                  training ? "training" : "evaluation", same ? "stayed" : "changed");
    }
    free(other);
    model_destroy(&m);
}

/* The recipe's settings on a synthetic set of train_images (a batch of 32). */
static Config *resnet_run(const char *device, int steps, const char *lr, int train_images) {
    char err[256];
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    const char *lines[] = {"model.name=resnet18", "data.source=synthetic", "data.image_size=32",
                           "data.synthetic_test=64", "train.batch=32",
                           "run.epochs=1", "run.warmup_steps=0", "optim.weight_decay=5e-4",
                           "optim.decay_bn_bias=off", "optim.nesterov=on", "optim.schedule=cosine",
                           "optim.warmup_epochs=0.5", "optim.label_smoothing=0.1", "train.sync_after_step=off",
                           "train.read_loss_every=0", "perf.deterministic=on"};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) CHECK(config_set(c, lines[i], err, sizeof err) == 0);
    char line[64];
    snprintf(line, sizeof line, "data.synthetic_train=%d", train_images);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    snprintf(line, sizeof line, "run.device=%s", device);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    snprintf(line, sizeof line, "run.max_steps=%d", steps);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    snprintf(line, sizeof line, "optim.lr=%s", lr);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    return c;
}

/* The recipe through the trainer on the CPU overfits one fixed batch: 16
 * synthetic images, the whole training set, so every step sees the same ones,
 * at a small learning rate. A bound on the loss after 16 steps over 512
 * images at lr 0.05 held on one machine (1.7) and not on another (2.5, and
 * 2.9 with 1 BLAS thread): that run is chaotic, so the BLAS kernel and thread
 * count decide where it ends. Here the loss falls from about ln 10 to 0.53
 * (the floor of label smoothing 0.1 is 0.50) in 6 steps: over 34 seeds, 1
 * and 2 BLAS threads and OpenBLAS's SkylakeX, Haswell, Sandybridge, Nehalem
 * and Prescott kernels, the first loss was 2.19 to 2.60 and the last at most
 * 0.25 of it. Steps that do not train leave it near ln 10. */
static void check_cpu_overfits(void) {
    enum { IMAGES = 16, STEPS = 6 };
    char err[256], line[64];
    double loss[2];
    const int steps[2] = {1, STEPS};
    for (int k = 0; k < 2; k++) {
        Config *c = resnet_run("cpu", steps[k], "0.01", IMAGES);
        const char *lines[] = {"train.batch=16", "optim.warmup_epochs=0", "run.log_every=1"};
        for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
            CHECK(config_set(c, lines[i], err, sizeof err) == 0);
        snprintf(line, sizeof line, "run.epochs=%d", STEPS); /* one step an epoch; the same schedule for both */
        CHECK(config_set(c, line, err, sizeof err) == 0);
        snprintf(line, sizeof line, "run.seed=%llu", (unsigned long long)(test_seed() % 1000003));
        CHECK(config_set(c, line, err, sizeof err) == 0);
        if (k == 0) CHECK(config_set(c, "run.eval=off", err, sizeof err) == 0);
        TrainSummary s;
        train_run(c, &s);
        CHECK(s.steps == steps[k]);
        loss[k] = s.final_loss; /* the loss of the last step, before its update */
        if (k == 1) CHECK_MSG(s.test_acc >= 0 && s.test_acc <= 1, "test accuracy %.3f: no evaluation", s.test_acc);
        config_free(c);
    }
    double ratio = loss[1] / loss[0];
    CHECK_MSG(isfinite(loss[0]) && loss[0] > 1.5 && loss[0] < 3.5, "resnet18 CPU first loss %.4f, ln 10 = 2.303",
              loss[0]);
    CHECK_MSG(isfinite(ratio) && ratio < 0.5, "resnet18 CPU, one batch of %d: loss %.4f after %d steps, first %.4f",
              IMAGES, loss[1], STEPS, loss[0]);
    printf("resnet18 cpu, one batch of %d: loss %.4f at step 1, %.4f at step %d (ratio %.3f)\n", IMAGES, loss[0],
           loss[1], STEPS, ratio);
}

/* Every switch computes the same training run: losses after 12 steps, at a
 * learning rate small enough that rounding differences stay small. A
 * model.fuse = graphs run (the batch norms' statistics from the convolutions'
 * epilogues, untimed: fused wherever an engine takes the shape) is also held
 * to 3% of the run it differs from only by that, the same precision with
 * model.fuse = on (0.1% to 1.2% over five calls on an H100, whose graphs
 * runs differ from call to call; fp32 with and without model.fuse differ
 * by 1.1%: 12 steps amplify rounding). */
static void check_switches(void) {
    const char *variants[][5] = {
        {"precision.amp=off", "model.layout=nchw", "model.fuse=off", "perf.cuda_graph=off", "perf.deterministic=on"},
        {"precision.amp=off", "model.layout=nchw", "model.fuse=on", "perf.cuda_graph=off", "perf.deterministic=on"},
        {"precision.amp=off", "model.layout=nhwc", "model.fuse=on", "memory.checkpoint=blocks", "perf.deterministic=on"},
        {"precision.amp=off", "model.layout=nchw", "model.fuse=on", "perf.cuda_graph=on", "perf.deterministic=on"},
        {"precision.amp=fp16", "model.layout=nhwc", "model.fuse=on", "perf.cuda_graph=on", "perf.deterministic=on"},
        {"precision.amp=bf16", "model.layout=nhwc", "model.fuse=on", "memory.checkpoint=blocks", "perf.deterministic=on"},
        /* graphs stay apart under perf.deterministic (models/plan_graphs.c) */
        {"precision.amp=fp16", "model.layout=nhwc", "model.fuse=graphs", "perf.cuda_graph=on", "perf.deterministic=off"},
        {"precision.amp=bf16", "model.layout=nhwc", "model.fuse=graphs", "memory.checkpoint=blocks",
         "perf.deterministic=off"},
    };
    const int same_but_graphs[] = {-1, -1, -1, -1, -1, -1, 4, 5};
    /* fp32 variants run other kernels (fused, NHWC) that round differently;
     * over 12 steps that moves the loss by under 1% (0.6% seen on an H200). */
    double tol[] = {0, 2e-2, 2e-2, 2e-2, 4e-2, 5e-2, 4e-2, 5e-2};
    double ref = NAN, losses[sizeof variants / sizeof *variants];
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        char err[256];
        Config *c = resnet_run("cuda", 12, "0.002", 512);
        for (int k = 0; k < 5; k++) CHECK(config_set(c, variants[v][k], err, sizeof err) == 0);
        TrainSummary s;
        train_run(c, &s);
        if (v == 0) ref = s.final_loss;
        losses[v] = s.final_loss;
        int twin = same_but_graphs[v];
        CHECK_MSG(twin < 0 || fabs(s.final_loss - losses[twin]) <= 3e-2 * fabs(losses[twin]),
                  "model.fuse=graphs %s: loss after 12 steps %.6f, model.fuse=on %.6f", variants[v][0], s.final_loss,
                  twin < 0 ? 0.0 : losses[twin]);
        CHECK_MSG(isfinite(s.final_loss) && fabs(s.final_loss - ref) <= tol[v] * fabs(ref) + 1e-6,
                  "%s %s %s %s: loss after 12 steps %.6f, plain fp32 %.6f", variants[v][0], variants[v][1],
                  variants[v][2], variants[v][3], s.final_loss, ref);
        printf("resnet18 %s %s %s %s: loss %.6f, test acc %.3f\n", variants[v][0], variants[v][1], variants[v][2],
               variants[v][3], s.final_loss, s.test_acc);
        config_free(c);
    }
}

int main(void) {
    uint64_t rng = test_seed();
    size_t small_n = (size_t)SMALL_BATCH * 4 * SMALL_SIZE * SMALL_SIZE;
    float *x = malloc(small_n * sizeof(float));
    test_fill_uniform(x, small_n, &rng, -2, 2);
    int32_t labels[16];
    for (int i = 0; i < 16; i++) labels[i] = (int32_t)test_uniform(&rng, 0, 9.99f) % SMALL_CLASSES;
    check_finite_differences(x, labels, &rng);
    check_eval_mode(x, labels, &rng);

    enum { BATCH = 4 };
    size_t big_n = (size_t)BATCH * 3 * 32 * 32;
    float *big = malloc(big_n * sizeof(float));
    test_fill_uniform(big, big_n, &rng, -2, 2);
    check_checkpointing(NULL, BATCH, big, labels);
    check_fused_cpu(BATCH, big, labels);
    check_backward_adds_cpu(BATCH, big, labels);
    check_graph_fusion_plan_resnet50();
    size_t n32 = (size_t)32 * 3 * 32 * 32;
    float *big32 = malloc(n32 * sizeof(float));
    test_fill_uniform(big32, n32, &rng, -2, 2);
    int32_t labels32[32];
    for (int i = 0; i < 32; i++) labels32[i] = i % 10;
    check_cpu_overfits();
    if (gpu_count() > 0) {
        GpuContext gpu;
        gpu_context_init(&gpu, 0);
        check_checkpointing(&gpu, BATCH, big, labels);
        check_gpu_against_cpu(&gpu, BATCH, big, labels, 0);
        check_gpu_against_cpu(&gpu, BATCH, big, labels, 1);
        check_gpu_against_cpu(&gpu, 32, big32, labels32, 0);
        check_gpu_against_cpu(&gpu, 32, big32, labels32, 1);
        GPU_ONLY(check_fused_steps(&gpu, 32, big32, labels32));
        GPU_ONLY(check_graph_fusion(&gpu, 32, big32, labels32));
        GPU_ONLY(check_overlap_wgrad(&gpu, 32, big32, labels32));
        GPU_ONLY(check_backward_adds(&gpu, 32, big32, labels32));
        size_t n128 = (size_t)BATCH * 3 * 128 * 128;
        float *big128 = malloc(n128 * sizeof(float));
        test_fill_uniform(big128, n128, &rng, -2, 2);
        GPU_ONLY(check_input_forms(&gpu, BATCH, big128, labels));
        free(big128);
        gpu_context_destroy(&gpu);
        check_switches();
    } else {
        printf("no GPU: GPU checks skipped\n");
    }
    free(x);
    free(big);
    free(big32);
    return test_finish("test_resnet");
}
