/* model.fuse = graphs: a convolution right before a batch norm computes that
 * norm's statistics in its epilogue, NVIDIA's MLPerf ResNet fusion. In
 * training its forward is one cuDNN graph (ops/conv_genstats: the
 * convolution and GEN_STATS, the per-channel sums of its output and of their
 * squares), and the batch norm turns the sums into its statistics
 * (bn_finalize) and runs its apply pass alone (BN_TRAIN_SAVED): the norm's
 * reduction pass over the convolution's output is gone. Evaluation and
 * backward are unchanged.
 *
 * A pair is fused where a cuDNN engine takes the shape (f16 or bf16,
 * channels-last, channels multiples of 8) and, under perf.conv_benchmark,
 * where the two layers' forward timed faster fused than apart on the model's
 * own buffers at start-up (filled with random data first, so the timings see
 * the step's clocks); the log says which pairs were fused and which stayed
 * apart, and why. Not under synchronized batch norm, whose statistics are
 * the global batch's, nor under perf.deterministic: two runs of the same 12
 * steps with the fused graphs ended 0.9% apart in loss on an H100, where
 * model.fuse = on repeats its bits. */
#include "models/layers.h"

#include <stdio.h>
#include <stdlib.h>

#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

#define PAIR_TIMING_RUNS 10

/* A convolution whose output the batch norm right after it normalises. */
static int stats_pair(const Model *m, int i) {
    const Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
    return conv->kind == LAYER_CONV && !conv->b_count && !conv->fused && !conv->whitening &&
           bn->kind == LAYER_BATCHNORM && bn->in == conv->out;
}

static void pair_join(Layer *conv, Layer *bn, ConvGenStats *op) {
    conv->genstats = op;
    conv->stat_off = bn->stat_off;
    bn->stats_by_conv = 1;
}

static void pair_split(const Model *m, Layer *conv, Layer *bn) {
    conv_genstats_destroy(&m->ops, conv->genstats);
    free(conv->genstats);
    conv->genstats = NULL;
    bn->stats_by_conv = 0;
}

void graph_fusion_plan(Model *m) {
    const char *why_not = m->bn_allreduce ? "dist.sync_bn (the statistics are the global batch's)"
                          : m->conv_policy.deterministic ? "perf.deterministic (runs with the fused graphs differ "
                                                           "from run to run)"
                                                         : NULL;
    if (why_not) {
        log_info("model.fuse = graphs: the batch norms compute their statistics themselves under %s", why_not);
        m->fuse_graphs = 0;
        return;
    }
    for (int i = 0; i + 1 < m->n_layers; i++) {
        if (!stats_pair(m, i)) continue;
        Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
        ConvGenStats *op = malloc(sizeof *op);
        if (!op) TC_FATAL("out of host memory planning model.fuse = graphs");
        /* A convolution over a form of the image (models/input_form.c) fuses the one over the copies. */
        ConvGenStatsShape shape = {conv->input_form ? conv->input_form->conv.shape : conv->conv.shape, 0};
        conv_genstats_init(&m->ops, op, &shape, &m->conv_policy);
        pair_join(conv, bn, op);
        if (!conv_genstats_fused(op)) {
            log_info("layer %d %s + layer %d %s: apart (no cuDNN engine takes the fused graph)", i, conv->name,
                     i + 1, bn->name);
            pair_split(m, conv, bn);
            continue;
        }
        size_t bytes = conv_genstats_workspace_bytes(&m->ops, op);
        if (bytes > m->workspace_bytes) m->workspace_bytes = bytes;
    }
}

/* The pair's forward through the layers' own code: fused while conv->genstats is set. */
static void pair_forward(Model *m, const Layer *conv, const Layer *bn) {
    layer_kinds[LAYER_CONV].forward(m, conv);
    layer_kinds[LAYER_BATCHNORM].forward(m, bn);
}

static float pair_time_us(Model *m, const Layer *conv, const Layer *bn) {
    cudaEvent_t start, stop;
    gpu_event_create(&start, 1);
    gpu_event_create(&stop, 1);
    pair_forward(m, conv, bn); /* the first run loads the kernels */
    gpu_event_record(start, m->ops.stream);
    for (int r = 0; r < PAIR_TIMING_RUNS; r++) pair_forward(m, conv, bn);
    gpu_event_record(stop, m->ops.stream);
    gpu_event_sync(stop);
    float us = gpu_event_ms(start, stop) * 1000.0f / PAIR_TIMING_RUNS;
    gpu_event_destroy(start);
    gpu_event_destroy(stop);
    return us;
}

/* Fused and apart, twice each in turn, the faster of each kept. */
static void pair_times(Model *m, Layer *conv, Layer *bn, float *fused_us, float *apart_us) {
    ConvGenStats *op = conv->genstats;
    *fused_us = *apart_us = 1e30f;
    for (int round = 0; round < 2; round++) {
        float t = pair_time_us(m, conv, bn);
        if (t < *fused_us) *fused_us = t;
        conv->genstats = NULL, bn->stats_by_conv = 0;
        t = pair_time_us(m, conv, bn);
        if (t < *apart_us) *apart_us = t;
        conv->genstats = op, bn->stats_by_conv = 1;
    }
}

/* The buffers the timings read, random: weights, batch-norm parameters and
 * each fused convolution's input. Before the parameters are initialised. */
static void fill_timing_inputs(Model *m) {
    size_t esize = dtype_size(m->act_dtype);
    op_fill_random(&m->ops, m->params, m->n_params * sizeof(float));
    if (m->weights != m->params) op_fill_random(&m->ops, m->weights, m->n_params * esize);
    for (int i = 0; i < m->n_layers; i++) {
        const Activation *in = &m->acts[m->layers[i].in];
        if (!m->layers[i].genstats) continue;
        if (in->value) op_fill_random(&m->ops, in->value, act_floats(m, m->layers[i].in) * esize);
        else op_fill_random(&m->ops, m->input_f32, model_input_floats(m) * sizeof(float)); /* read by its form */
    }
}

static void log_pairs(const Model *m) {
    int pairs = 0, fused = 0;
    char apart[256] = "";
    size_t used = 0;
    for (int i = 0; i + 1 < m->n_layers; i++) {
        if (!stats_pair(m, i)) continue;
        pairs++;
        if (m->layers[i].genstats) fused++;
        else if (used + 16 < sizeof apart) used += (size_t)snprintf(apart + used, sizeof apart - used, " %d", i);
    }
    log_info("model.fuse = graphs: %d of %d convolutions before a batch norm compute its statistics in their "
             "epilogue%s%s",
             fused, pairs, fused < pairs ? "; apart: layers" : "", apart);
}

void graph_fusion_choose(Model *m) {
    int benchmark = m->conv_policy.benchmark, training = m->training;
    if (benchmark) fill_timing_inputs(m);
    m->training = 1;
    m->recomputing = 1; /* momentum 0: the timings leave the running statistics alone */
    for (int i = 0; i + 1 < m->n_layers; i++) {
        Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
        if (!conv->genstats) continue;
        if (!benchmark) {
            log_info("layer %d %s + layer %d %s: statistics in the convolution's epilogue (cuDNN graph; not timed: "
                     "perf.conv_benchmark off)",
                     i, conv->name, i + 1, bn->name);
            continue;
        }
        float fused_us, apart_us;
        pair_times(m, conv, bn, &fused_us, &apart_us);
        int keep = fused_us < apart_us;
        log_info("layer %d %s + layer %d %s: %s, forward %.1f us fused against %.1f us apart", i, conv->name, i + 1,
                 bn->name, keep ? "statistics in the convolution's epilogue (cuDNN graph)" : "apart (slower fused)",
                 fused_us, apart_us);
        if (!keep) pair_split(m, conv, bn);
    }
    m->recomputing = 0;
    m->training = training;
    log_pairs(m);
}

void graph_fusion_destroy(Model *m) {
    for (int i = 0; i + 1 < m->n_layers; i++)
        if (m->layers[i].genstats) pair_split(m, &m->layers[i], &m->layers[i + 1]);
}
