/* model.fuse = graphs: a convolution right before a batch norm computes that
 * norm's statistics in its epilogue, NVIDIA's MLPerf ResNet fusion. In
 * training its forward is one cuDNN graph (ops/conv_genstats: the
 * convolution and GEN_STATS, the per-channel sums of its output and of their
 * squares; a network's first convolution, over the image padded to 8
 * channels, may run conv2d's direct kernel with the sums in its epilogue
 * instead, where it times faster), and the batch norm turns the sums into
 * its statistics (bn_finalize) and runs its apply pass alone
 * (BN_TRAIN_SAVED): the norm's reduction pass over the convolution's output
 * is gone. Evaluation and backward are unchanged.
 *
 * A pair is fused where a cuDNN engine takes the shape (f16 or bf16,
 * channels-last, channels multiples of 8) and, under perf.conv_benchmark,
 * where the two layers' forward timed faster fused than apart on the model's
 * own buffers at start-up (filled with random data first, so the timings see
 * the step's clocks); the log says which pairs were fused and which stayed
 * apart, and why. Not under synchronized batch norm, whose statistics are
 * the global batch's, nor under perf.deterministic: two runs of the same 12
 * steps with the fused graphs ended 0.9% apart in loss on an H100, where
 * model.fuse = on repeats its bits.
 *
 * Then a batch norm + ReLU that only the convolution of another fused pair
 * reads becomes that convolution's prologue: the convolution reads the norm's
 * input and applies x * scale + bias and the ReLU as it loads it (one cuDNN
 * graph with the GEN_STATS epilogue), its filter gradient recomputes the same
 * in another graph (conv_genstats_backward_filter), and the norm computes
 * only its scale and bias (bn_finalize): its apply pass and its output are
 * gone, in training. Where both graphs have an engine, and under
 * perf.conv_benchmark where the norm's forward and the convolution's forward
 * and filter gradient timed faster that way.
 *
 * And a batch norm + ReLU that only the convolution right after it reads
 * (a prologue or not) runs its backward in that convolution's data gradient
 * (ops/conv_dgrad_dbn: the data gradient, the ReLU's mask recomputed from
 * the norm's input, the norm's reductions in one cuDNN graph, then one pass
 * making dx over dz): the norm's reduction pass over dy and x is gone. The
 * norm's input and output gradients share one buffer, so that either way
 * takes no more memory (apart, the norm's backward runs in place). Under
 * perf.overlap_wgrad the filter gradient is forked first and runs beside it,
 * the op taking a workspace of its own. Where an engine takes the graph, and
 * under perf.conv_benchmark where the two layers' backward timed faster so.
 *
 * On the CPU the pairs, prologues and data gradients compose the reference
 * ops: no faster, the same wiring, which the tests check. */
#include "models/layers.h"

#include <stdio.h>
#include <stdlib.h>

#include "ops/backend_graph.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

#define PAIR_TIMING_RUNS 10

/* The graphs are built for one convolution of all channels: a grouped one stays apart. */
static int ungrouped_conv(const Layer *l) { return l->kind == LAYER_CONV && conv2d_groups(&l->conv.shape) == 1; }

/* A convolution whose output the batch norm right after it normalises. */
static int stats_pair(const Model *m, int i) {
    const Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
    return ungrouped_conv(conv) && !conv->b_count && !conv->fused && !conv->whitening &&
           bn->kind == LAYER_BATCHNORM && bn->in == conv->out;
}

static void pair_join(Layer *conv, Layer *bn, ConvGenStats *op) {
    conv->genstats = op;
    conv->stat_off = bn->stat_off;
    bn->stats_by_conv = 1;
}

static void genstats_free(const Model *m, ConvGenStats *op) {
    if (!op) return;
    conv_genstats_destroy(&m->ops, op);
    free(op);
}

static void pair_split(const Model *m, Layer *conv, Layer *bn) {
    genstats_free(m, conv->genstats);
    conv->genstats = NULL;
    bn->stats_by_conv = 0;
}

static ConvGenStats *genstats_new(Model *m, const ConvGenStatsShape *shape) {
    ConvGenStats *op = malloc(sizeof *op);
    if (!op) TC_FATAL("out of host memory planning model.fuse = graphs");
    conv_genstats_init(&m->ops, op, shape, &m->conv_policy);
    return op;
}

static void reserve_workspace(Model *m, const ConvGenStats *op) {
    size_t bytes = conv_genstats_workspace_bytes(&m->ops, op);
    if (bytes > m->workspace_bytes) m->workspace_bytes = bytes;
}

/* The conv right after batch norm i and its fused ReLU, alone in reading the ReLU's output; -1: none. */
static int norm_relu_conv(const Model *m, int i) {
    if (i + 2 >= m->n_layers) return -1;
    const Layer *bn = &m->layers[i], *relu = &m->layers[i + 1], *conv = &m->layers[i + 2];
    int ok = bn->kind == LAYER_BATCHNORM && bn->fused_act == BN_ACT_RELU && bn->add_layer < 0 &&
             bn->pool_layer < 0 && relu->kind == LAYER_RELU && relu->in == bn->out && relu->fused &&
             ungrouped_conv(conv) && conv->in == relu->out && !conv->input_form &&
             m->acts[relu->out].consumers == 1;
    return ok ? i + 2 : -1;
}

/* The conv that may take batch norm i (+ its ReLU) as its prologue: a fused pair's; -1: none. */
static int prologue_conv(const Model *m, int i) {
    int j = norm_relu_conv(m, i);
    return j >= 0 && m->layers[i].stats_by_conv && m->layers[j].genstats ? j : -1;
}

/* A plain conv (no bias, no fused epilogue or pool) in the norm's checkpoint
 * block (whose input its backward reads), past the frozen layers; the norm's
 * input gradient written, not added to. */
int graph_fusion_dbn_conv(const Model *m, int i) {
    int j = norm_relu_conv(m, i);
    if (j < 0) return -1;
    const Layer *bn = &m->layers[i], *conv = &m->layers[j];
    int ok = !conv->b_count && !conv->fused && !conv->whitening && conv->pool_layer < 0 && bn->block == conv->block &&
             bn->in > 0 && i >= m->frozen_layers && !bn->dx_accumulate[0];
    return ok ? j : -1;
}

/* The prologue form of batch norm i's conv, kept aside for choose where its two graphs have an engine. */
static void plan_prologue(Model *m, int i) {
    int j = prologue_conv(m, i);
    if (j < 0) return;
    Layer *conv = &m->layers[j];
    ConvGenStatsShape shape = {conv->conv.shape, 1};
    ConvGenStats *op = genstats_new(m, &shape);
    if (m->device == DEVICE_CUDA && (!conv_genstats_fused(op) || !conv_genstats_filter_fused(op))) {
        log_info("layer %d %s + ReLU as layer %d %s's prologue: apart (no cuDNN engine takes the %s graph)", i,
                 m->layers[i].name, j, conv->name, conv_genstats_fused(op) ? "filter gradient's" : "forward");
        genstats_free(m, op);
        return;
    }
    conv->prologue_genstats = op;
    reserve_workspace(m, op);
}

/* Conv j's data gradient with batch norm i's backward, where an engine takes its graph. */
static void plan_dgrad_dbn(Model *m, int i) {
    int j = graph_fusion_dbn_conv(m, i);
    if (j < 0) return;
    Layer *bn = &m->layers[i], *conv = &m->layers[j];
    ConvDgradDbn *op = malloc(sizeof *op);
    if (!op) TC_FATAL("out of host memory planning model.fuse = graphs");
    conv_dgrad_dbn_init(&m->ops, op, &conv->conv.shape, &m->conv_policy);
    if (m->device == DEVICE_CUDA && !conv_dgrad_dbn_fused(op)) {
        log_info("layer %d %s + ReLU backward: apart from layer %d %s's data gradient (no cuDNN engine takes the "
                 "graph)", i, bn->name, j, conv->name);
        conv_dgrad_dbn_destroy(&m->ops, op);
        free(op);
        return;
    }
    conv->dgrad_dbn = op;
    conv->dbn_layer = i;
    bn->backward_by_conv = 1;
    size_t bytes = conv_dgrad_dbn_workspace_bytes(&m->ops, op, 0);
    size_t *reserved = m->overlap_wgrad ? &m->dgrad_dbn_workspace_bytes : &m->workspace_bytes;
    if (bytes > *reserved) *reserved = bytes;
}

static void dgrad_dbn_free(Model *m, Layer *conv) {
    conv_dgrad_dbn_destroy(&m->ops, conv->dgrad_dbn);
    free(conv->dgrad_dbn);
    conv->dgrad_dbn = NULL;
    m->layers[conv->dbn_layer].backward_by_conv = 0;
    conv->dbn_layer = -1;
}

void graph_fusion_plan(Model *m) {
    const char *why_not = m->bn_allreduce ? "dist.sync_bn (the statistics are the global batch's)"
                          : m->conv_policy.deterministic && m->device == DEVICE_CUDA
                              ? "perf.deterministic (runs with the fused graphs differ from run to run)"
                              : NULL;
    if (why_not) {
        log_info("model.fuse = graphs: the batch norms compute their statistics themselves under %s", why_not);
        m->fuse_graphs = 0;
        return;
    }
    for (int i = 0; i + 1 < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind == LAYER_CONV && !ungrouped_conv(l) && m->layers[i + 1].kind == LAYER_BATCHNORM)
            log_info("layer %d %s + layer %d %s: apart (a convolution in %d groups; the graphs take one of all "
                     "channels)", i, l->name, i + 1, m->layers[i + 1].name, l->conv.shape.groups);
        if (!stats_pair(m, i)) continue;
        Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
        /* A convolution over a form of the image (models/input_form.c) fuses the one over the copies. */
        ConvGenStatsShape shape = {conv->input_form ? conv->input_form->conv.shape : conv->conv.shape, 0};
        ConvGenStats *op = genstats_new(m, &shape);
        pair_join(conv, bn, op);
        if (m->device == DEVICE_CUDA && !conv_genstats_fused(op)) {
            log_info("layer %d %s + layer %d %s: apart (no cuDNN engine takes the fused graph)", i, conv->name,
                     i + 1, bn->name);
            pair_split(m, conv, bn);
            continue;
        }
        reserve_workspace(m, op);
    }
    for (int i = 0; i + 2 < m->n_layers; i++) plan_prologue(m, i);
    for (int i = 0; i + 2 < m->n_layers; i++) plan_dgrad_dbn(m, i);
}

/* Two layers of the model, for a timing of run. */
typedef struct Timed {
    Model *m;
    const Layer *a, *b;
    void (*run)(const struct Timed *t);
} Timed;

/* The pair's forward through the layers' own code: fused while conv->genstats is set. */
static void pair_forward(const Timed *t) {
    layer_kinds[LAYER_CONV].forward(t->m, t->a);
    layer_kinds[LAYER_BATCHNORM].forward(t->m, t->b);
}

/* A norm's forward, the conv after it forward and backward: its prologue while the flags say so. */
static void prologue_step(const Timed *t) {
    layer_kinds[LAYER_BATCHNORM].forward(t->m, t->a);
    layer_kinds[LAYER_CONV].forward(t->m, t->b);
    layer_kinds[LAYER_CONV].backward(t->m, t->b);
}

/* A conv's backward and the batch norm's before it, its filter gradient joined: the norm's in the conv's data
 * gradient while the flags say so. */
static void dgrad_dbn_step(const Timed *t) {
    layer_kinds[LAYER_CONV].backward(t->m, t->b);
    layer_kinds[LAYER_BATCHNORM].backward(t->m, t->a);
    layer_wgrad_join(t->m);
}

#if TRAINC_CUDA
static void run_timed(void *arg) {
    const Timed *t = (const Timed *)arg;
    t->run(t);
}

static float time_us(const Timed *t) {
    return 1000.0f * backend_graph_time_ms(t->m->ops.cudnn, run_timed, (void *)t, PAIR_TIMING_RUNS);
}
#else
static float time_us(const Timed *t) {
    (void)t;
    gpu_unavailable(__func__);
}
#endif

static float pair_time_us(Model *m, const Layer *conv, const Layer *bn) {
    Timed t = {m, conv, bn, pair_forward};
    return time_us(&t);
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
    float both[2] = {*fused_us, *apart_us};
    conv_policy_agree(&m->conv_policy, both, 2);
    *fused_us = both[0], *apart_us = both[1];
}

/* The buffers the timings read, random: weights, batch-norm parameters and
 * each fused convolution's input. Before the parameters are initialised. */
static void fill_timing_inputs(Model *m) {
    size_t esize = dtype_size(m->act_dtype);
    op_fill_random(&m->ops, m->params, m->n_params * sizeof(float));
    if (m->weights != m->params) op_fill_random(&m->ops, m->weights, m->n_params * esize);
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const Activation *in = &m->acts[l->in];
        if (l->prologue_genstats || l->dgrad_dbn) /* the dy of the backward timed */
            op_fill_random(&m->ops, grad_of(m, l->out), act_floats(m, l->out) * esize);
        if (!l->genstats) continue;
        if (in->value) op_fill_random(&m->ops, in->value, act_floats(m, l->in) * esize);
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

/* Batch norm i in or out of conv j's prologue: the flags, and which of the conv's two ops runs. */
static void prologue_swap(Model *m, int i, int j) {
    Layer *bn = &m->layers[i], *conv = &m->layers[j];
    ConvGenStats *other = conv->genstats;
    conv->genstats = conv->prologue_genstats, conv->prologue_genstats = other;
    bn->by_conv_prologue = !bn->by_conv_prologue;
    conv->prologue_bn = bn->by_conv_prologue ? i : -1;
}

static float prologue_time_us(Model *m, int i, int j) {
    Timed t = {m, &m->layers[i], &m->layers[j], prologue_step};
    return time_us(&t);
}

/* Batch norm i as conv j's prologue where both ways are built: under
 * benchmark where it timed faster (the conv that sums the norm's input runs
 * first, so the norm normalises real sums), else always. */
static void choose_prologue(Model *m, int i, int benchmark) {
    int j = prologue_conv(m, i);
    if (j < 0 || !m->layers[j].prologue_genstats) return;
    Layer *bn = &m->layers[i], *conv = &m->layers[j];
    float fused_us = 0, apart_us = 0;
    if (benchmark) {
        layer_kinds[LAYER_CONV].forward(m, &m->layers[i - 1]);
        apart_us = prologue_time_us(m, i, j);
        prologue_swap(m, i, j);
        fused_us = prologue_time_us(m, i, j);
        float both[2] = {fused_us, apart_us};
        conv_policy_agree(&m->conv_policy, both, 2);
        fused_us = both[0], apart_us = both[1];
        if (fused_us >= apart_us) prologue_swap(m, i, j);
    } else {
        prologue_swap(m, i, j);
    }
    genstats_free(m, conv->prologue_genstats);
    conv->prologue_genstats = NULL;
    if (benchmark)
        log_info("layer %d %s + ReLU: %s layer %d %s's prologue, the norm's forward and the conv's forward and "
                 "backward %.1f us so against %.1f us apart",
                 i, bn->name, bn->by_conv_prologue ? "as" : "apart (slower) from being", j, conv->name, fused_us,
                 apart_us);
    else
        log_info("layer %d %s + ReLU: layer %d %s's prologue (%s)", i, bn->name, j, conv->name,
                 m->device == DEVICE_CUDA ? "cuDNN graphs; not timed: perf.conv_benchmark off"
                                          : "the CPU composes the reference ops");
}

static void log_prologues(const Model *m) {
    int candidates = 0, taken = 0;
    for (int i = 0; i < m->n_layers; i++) {
        if (m->layers[i].kind != LAYER_BATCHNORM || m->layers[i].fused_act != BN_ACT_RELU) continue;
        candidates += prologue_conv(m, i) >= 0;
        taken += m->layers[i].by_conv_prologue;
    }
    if (candidates)
        log_info("model.fuse = graphs: %d of %d batch norms + ReLU before a fused convolution run as its prologue",
                 taken, candidates);
}

/* The norm's backward in the conv's data gradient (op), or apart (NULL). */
static void dgrad_dbn_set(Model *m, Layer *conv, ConvDgradDbn *op) {
    conv->dgrad_dbn = op;
    m->layers[conv->dbn_layer].backward_by_conv = op != NULL;
}

static float dgrad_dbn_time_us(Model *m, int i, int j) {
    Timed t = {m, &m->layers[i], &m->layers[j], dgrad_dbn_step};
    return time_us(&t);
}

/* Conv j's data gradient with batch norm i's backward, under benchmark where
 * the two layers' backward (the filter gradient as training runs it, joined)
 * timed faster so, after their forward on the model's buffers. */
static void choose_dgrad_dbn(Model *m, int j, int benchmark) {
    Layer *conv = &m->layers[j];
    int i = conv->dbn_layer;
    Layer *bn = &m->layers[i];
    if (!benchmark) {
        log_info("layer %d %s + ReLU backward: in layer %d %s's data gradient (%s)", i, bn->name, j, conv->name,
                 m->device == DEVICE_CUDA ? "cuDNN graph; not timed: perf.conv_benchmark off"
                                          : "the CPU composes the reference ops");
        return;
    }
    if (bn->stats_by_conv) layer_kinds[LAYER_CONV].forward(m, &m->layers[i - 1]);
    layer_kinds[LAYER_BATCHNORM].forward(m, bn);
    layer_kinds[LAYER_CONV].forward(m, conv);
    ConvDgradDbn *op = conv->dgrad_dbn;
    float fused_us = dgrad_dbn_time_us(m, i, j);
    dgrad_dbn_set(m, conv, NULL);
    float apart_us = dgrad_dbn_time_us(m, i, j);
    dgrad_dbn_set(m, conv, op);
    float both[2] = {fused_us, apart_us};
    conv_policy_agree(&m->conv_policy, both, 2);
    int keep = both[0] < both[1];
    log_info("layer %d %s + ReLU backward: %s layer %d %s's data gradient, the two layers' backward %.1f us so "
             "against %.1f us apart",
             i, bn->name, keep ? "in" : "apart (slower) from", j, conv->name, both[0], both[1]);
    if (!keep) dgrad_dbn_free(m, conv);
}

static void log_dgrad_dbns(const Model *m) {
    int candidates = 0, taken = 0;
    for (int i = 0; i < m->n_layers; i++) {
        candidates += graph_fusion_dbn_conv(m, i) >= 0;
        taken += m->layers[i].backward_by_conv;
    }
    if (candidates)
        log_info("model.fuse = graphs: %d of %d batch norms + ReLU before a convolution run their backward in its "
                 "data gradient",
                 taken, candidates);
}

void graph_fusion_choose(Model *m) {
    int benchmark = m->conv_policy.benchmark && m->device == DEVICE_CUDA, training = m->training;
    int overlap_wgrad = m->overlap_wgrad, grads_zeroed = m->grads_zeroed;
    if (benchmark) fill_timing_inputs(m);
    m->training = 1;
    m->grads_zeroed = 1; /* timed as an optimizer step's first micro-batch runs: filter gradients overwritten */
    m->recomputing = 1; /* momentum 0: the timings leave the running statistics alone */
    /* A filter gradient forked to the side stream is joined only by model_backward: the timings' runs, one
     * after another on the compute stream, would share the convolutions' workspace with it (on an H200 the
     * start-up then never ended, the GPU busy at 138 W). */
    m->overlap_wgrad = 0;
    for (int i = 0; i + 1 < m->n_layers; i++) {
        Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
        if (!conv->genstats) continue;
        if (!benchmark) {
            log_info("layer %d %s + layer %d %s: statistics in the convolution's epilogue (%s)", i, conv->name, i + 1,
                     bn->name,
                     m->device == DEVICE_CUDA ? "cuDNN graph; not timed: perf.conv_benchmark off"
                                              : "the CPU composes the reference ops");
            continue;
        }
        float fused_us, apart_us;
        pair_times(m, conv, bn, &fused_us, &apart_us);
        int keep = fused_us < apart_us;
        char how[64];
        snprintf(how, sizeof how, "statistics in the convolution's epilogue (%s)", conv_genstats_path(conv->genstats));
        log_info("layer %d %s + layer %d %s: %s, forward %.1f us fused against %.1f us apart", i, conv->name, i + 1,
                 bn->name, keep ? how : "apart (slower fused)", fused_us, apart_us);
        if (!keep) pair_split(m, conv, bn);
    }
    for (int i = 0; i < m->n_layers; i++) {
        choose_prologue(m, i, benchmark);
        if (m->layers[i].prologue_genstats) { /* its pairs came apart */
            genstats_free(m, m->layers[i].prologue_genstats);
            m->layers[i].prologue_genstats = NULL;
        }
    }
    m->overlap_wgrad = overlap_wgrad; /* each timing joins its fork, and the op has its own workspace */
    for (int j = 0; j < m->n_layers; j++)
        if (m->layers[j].dgrad_dbn) choose_dgrad_dbn(m, j, benchmark);
    m->recomputing = 0;
    m->training = training;
    m->grads_zeroed = grads_zeroed;
    log_pairs(m);
    log_prologues(m);
    log_dgrad_dbns(m);
}

void graph_fusion_destroy(Model *m) {
    for (int i = 0; i + 1 < m->n_layers; i++)
        if (m->layers[i].genstats) pair_split(m, &m->layers[i], &m->layers[i + 1]);
    for (int j = 0; j < m->n_layers; j++)
        if (m->layers[j].dgrad_dbn) dgrad_dbn_free(m, &m->layers[j]);
}
