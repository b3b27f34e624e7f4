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
 * ops: no faster, the same wiring, which the tests check.
 *
 * Each choice times the model's plan against a copy of it with the one candidate changed (plan_copy), the two
 * run in turn on the model's buffers, and keeps the faster (plan_keep). */
#include "models/plan.h"

#include <stdio.h>
#include <stdlib.h>

#include "models/layers.h"
#include "ops/backend_graph.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

#define PAIR_TIMING_RUNS 10

/* A convolution whose output the batch norm right after it normalises. */
static int stats_pair(const Model *m, int i) {
    const Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
    return plan_ungrouped_conv(conv) && !conv->b_count && !m->plan->layers[i].bias_relu && !conv->whitening &&
           bn->kind == LAYER_BATCHNORM && bn->in == conv->out;
}

/* In plan p, conv i computes batch norm i + 1's sums with op (NULL: apart). */
static void pair_set(const Model *m, Plan *p, int i, ConvGenStats *op) {
    p->layers[i].genstats = op;
    p->layers[i].sums_off = op ? m->layers[i + 1].stat_off : 0;
    p->layers[i + 1].stats_by_conv = op != NULL;
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

/* The conv that may take batch norm i (+ its ReLU) as its prologue: a fused pair's; -1: none. */
static int prologue_conv(const Model *m, int i) {
    int j = plan_norm_relu_conv(m, i);
    return j >= 0 && m->plan->layers[i].stats_by_conv && m->plan->layers[j].genstats ? j : -1;
}

/* The prologue form of batch norm i's conv, kept aside for choose where its two graphs have an engine. */
static void plan_prologue(Model *m, int i) {
    int j = prologue_conv(m, i);
    if (j < 0) return;
    const Layer *conv = &m->layers[j];
    ConvGenStatsShape shape = {conv->conv.shape, 1};
    ConvGenStats *op = genstats_new(m, &shape);
    if (m->device == DEVICE_CUDA && (!conv_genstats_fused(op) || !conv_genstats_filter_fused(op))) {
        log_info("layer %d %s + ReLU as layer %d %s's prologue: apart (no cuDNN engine takes the %s graph)", i,
                 m->layers[i].name, j, conv->name, conv_genstats_fused(op) ? "filter gradient's" : "forward");
        plan_genstats_free(m, op);
        return;
    }
    m->plan->layers[j].prologue_genstats = op;
    reserve_workspace(m, op);
}

/* Conv j's data gradient with batch norm i's backward, where an engine takes its graph. */
static void plan_dgrad_dbn(Model *m, int i) {
    int j = plan_dbn_conv(m, i);
    if (j < 0) return;
    const Layer *bn = &m->layers[i], *conv = &m->layers[j];
    ConvDgradDbn *op = malloc(sizeof *op);
    if (!op) TC_FATAL("out of host memory planning model.fuse = graphs");
    conv_dgrad_dbn_init(&m->ops, op, &conv->conv.shape, &m->conv_policy);
    if (m->device == DEVICE_CUDA && !conv_dgrad_dbn_fused(op)) {
        log_info("layer %d %s + ReLU backward: apart from layer %d %s's data gradient (no cuDNN engine takes the "
                 "graph)", i, bn->name, j, conv->name);
        plan_dgrad_dbn_free(m, op);
        return;
    }
    m->plan->layers[j].dgrad_dbn = op;
    m->plan->layers[j].dbn_layer = i;
    m->plan->layers[i].backward_by_conv = 1;
    size_t bytes = conv_dgrad_dbn_workspace_bytes(&m->ops, op, 0);
    size_t *reserved = m->overlap_wgrad ? &m->dgrad_dbn_workspace_bytes : &m->workspace_bytes;
    if (bytes > *reserved) *reserved = bytes;
}

void plan_graphs(Model *m) {
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
        if (l->kind == LAYER_CONV && !plan_ungrouped_conv(l) && m->layers[i + 1].kind == LAYER_BATCHNORM)
            log_info("layer %d %s + layer %d %s: apart (a convolution in %d groups; the graphs take one of all "
                     "channels)", i, l->name, i + 1, m->layers[i + 1].name, l->conv.shape.groups);
        if (!stats_pair(m, i)) continue;
        const Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
        const ConvInputForm *form = m->plan->layers[i].input_form;
        /* A convolution over a form of the image (plan_input_forms) fuses the one over the copies. */
        ConvGenStatsShape shape = {form ? form->conv.shape : conv->conv.shape, 0};
        ConvGenStats *op = genstats_new(m, &shape);
        pair_set(m, m->plan, i, op);
        if (m->device == DEVICE_CUDA && !conv_genstats_fused(op)) {
            log_info("layer %d %s + layer %d %s: apart (no cuDNN engine takes the fused graph)", i, conv->name,
                     i + 1, bn->name);
            pair_set(m, m->plan, i, NULL);
            plan_genstats_free(m, op);
            continue;
        }
        reserve_workspace(m, op);
    }
    for (int i = 0; i + 2 < m->n_layers; i++) plan_prologue(m, i);
    for (int i = 0; i + 2 < m->n_layers; i++) plan_dgrad_dbn(m, i);
}

/* Two layers of the model, for a timing of run under plan. */
typedef struct Timed {
    Model *m;
    const Layer *a, *b;
    void (*run)(const struct Timed *t);
} Timed;

/* The pair's forward through the layers' own code: fused where the plan gives the conv genstats. */
static void pair_forward(const Timed *t) {
    layer_kinds[LAYER_CONV].forward(t->m, t->a);
    layer_kinds[LAYER_BATCHNORM].forward(t->m, t->b);
}

/* A norm's forward, the conv after it forward and backward: its prologue where the plan says so. */
static void prologue_step(const Timed *t) {
    layer_kinds[LAYER_BATCHNORM].forward(t->m, t->a);
    layer_kinds[LAYER_CONV].forward(t->m, t->b);
    layer_kinds[LAYER_CONV].backward(t->m, t->b);
}

/* A conv's backward and the batch norm's before it, its filter gradient joined: the norm's in the conv's data
 * gradient where the plan says so. */
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

/* Layers i and j's run timed under plan p, the model's own plan again after. */
static float plan_time_us(Model *m, Plan *p, int i, int j, void (*run)(const Timed *t)) {
    Plan *own = m->plan;
    Timed t = {m, &m->layers[i], &m->layers[j], run};
    m->plan = p;
    float us = time_us(&t);
    m->plan = own;
    return us;
}

/* The two timings made to agree across ranks (conv_policy_agree). */
static void agree(Model *m, float *fused_us, float *apart_us) {
    float both[2] = {*fused_us, *apart_us};
    conv_policy_agree(&m->conv_policy, both, 2);
    *fused_us = both[0], *apart_us = both[1];
}

/* Fused (the model's plan) and apart (the copy without the pair), twice each in turn, the faster of each kept. */
static void pair_times(Model *m, Plan *apart, int i, float *fused_us, float *apart_us) {
    *fused_us = *apart_us = 1e30f;
    for (int round = 0; round < 2; round++) {
        float t = plan_time_us(m, m->plan, i, i + 1, pair_forward);
        if (t < *fused_us) *fused_us = t;
        t = plan_time_us(m, apart, i, i + 1, pair_forward);
        if (t < *apart_us) *apart_us = t;
    }
    agree(m, fused_us, apart_us);
}

/* The buffers the timings read, random: weights, batch-norm parameters and
 * each fused convolution's input. Before the parameters are initialised. */
static void fill_timing_inputs(Model *m) {
    size_t esize = dtype_size(m->act_dtype);
    op_fill_random(&m->ops, m->params, m->n_params * sizeof(float));
    if (m->weights != m->params) op_fill_random(&m->ops, m->weights, m->n_params * esize);
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const LayerPlan *p = &m->plan->layers[i];
        const Activation *in = &m->acts[l->in];
        if (p->prologue_genstats || p->dgrad_dbn) /* the dy of the backward timed */
            op_fill_random(&m->ops, grad_of(m, l->out), act_floats(m, l->out) * esize);
        if (!p->genstats) continue;
        if (in->value) op_fill_random(&m->ops, in->value, act_floats(m, l->in) * esize);
        else op_fill_random(&m->ops, m->input_f32, input_floats(m) * sizeof(float)); /* read by its form */
    }
}

static void log_pairs(const Model *m) {
    int pairs = 0, fused = 0;
    char apart[256] = "";
    size_t used = 0;
    for (int i = 0; i + 1 < m->n_layers; i++) {
        if (!stats_pair(m, i)) continue;
        pairs++;
        if (m->plan->layers[i].genstats) fused++;
        else if (used + 16 < sizeof apart) used += (size_t)snprintf(apart + used, sizeof apart - used, " %d", i);
    }
    log_info("model.fuse = graphs: %d of %d convolutions before a batch norm compute its statistics in their "
             "epilogue%s%s",
             fused, pairs, fused < pairs ? "; apart: layers" : "", apart);
}

/* Conv i and batch norm i + 1's pair: under benchmark kept where its forward timed faster than apart. */
static void choose_pair(Model *m, int i, int benchmark) {
    const Layer *conv = &m->layers[i], *bn = &m->layers[i + 1];
    if (!benchmark) {
        log_info("layer %d %s + layer %d %s: statistics in the convolution's epilogue (%s)", i, conv->name, i + 1,
                 bn->name,
                 m->device == DEVICE_CUDA ? "cuDNN graph; not timed: perf.conv_benchmark off"
                                          : "the CPU composes the reference ops");
        return;
    }
    Plan *apart = plan_copy(m->plan);
    pair_set(m, apart, i, NULL);
    float fused_us, apart_us;
    pair_times(m, apart, i, &fused_us, &apart_us);
    int keep = fused_us < apart_us;
    char how[64];
    snprintf(how, sizeof how, "statistics in the convolution's epilogue (%s)",
             conv_genstats_path(m->plan->layers[i].genstats));
    log_info("layer %d %s + layer %d %s: %s, forward %.1f us fused against %.1f us apart", i, conv->name, i + 1,
             bn->name, keep ? how : "apart (slower fused)", fused_us, apart_us);
    if (keep) plan_keep(m, m->plan, apart);
    else plan_keep(m, apart, m->plan);
}

/* Plan p with batch norm i as conv j's prologue: the conv runs its prologue form. */
static void prologue_take(Plan *p, int i, int j) {
    LayerPlan *conv = &p->layers[j];
    conv->genstats = conv->prologue_genstats, conv->prologue_genstats = NULL;
    p->layers[i].by_conv_prologue = 1;
    conv->prologue_bn = i;
}

/* Batch norm i as conv j's prologue where both ways are built: under
 * benchmark where it timed faster (the conv that sums the norm's input runs
 * first, so the norm normalises real sums), else always. */
static void choose_prologue(Model *m, int i, int benchmark) {
    int j = prologue_conv(m, i);
    if (j < 0 || !m->plan->layers[j].prologue_genstats) return;
    const Layer *bn = &m->layers[i], *conv = &m->layers[j];
    Plan *prologue = plan_copy(m->plan);
    prologue_take(prologue, i, j);
    float fused_us = 0, apart_us = 0;
    int keep = 1;
    if (benchmark) {
        layer_kinds[LAYER_CONV].forward(m, &m->layers[i - 1]);
        apart_us = plan_time_us(m, m->plan, i, j, prologue_step);
        fused_us = plan_time_us(m, prologue, i, j, prologue_step);
        agree(m, &fused_us, &apart_us);
        keep = !(fused_us >= apart_us);
    }
    if (keep) plan_keep(m, prologue, m->plan);
    else plan_keep(m, m->plan, prologue);
    plan_genstats_free(m, m->plan->layers[j].prologue_genstats); /* apart: the form not taken */
    m->plan->layers[j].prologue_genstats = NULL;
    if (benchmark)
        log_info("layer %d %s + ReLU: %s layer %d %s's prologue, the norm's forward and the conv's forward and "
                 "backward %.1f us so against %.1f us apart",
                 i, bn->name, m->plan->layers[i].by_conv_prologue ? "as" : "apart (slower) from being", j, conv->name,
                 fused_us, apart_us);
    else
        log_info("layer %d %s + ReLU: layer %d %s's prologue (%s)", i, bn->name, j, conv->name,
                 m->device == DEVICE_CUDA ? "cuDNN graphs; not timed: perf.conv_benchmark off"
                                          : "the CPU composes the reference ops");
}

static void log_prologues(const Model *m) {
    int candidates = 0, taken = 0;
    for (int i = 0; i < m->n_layers; i++) {
        if (m->layers[i].kind != LAYER_BATCHNORM || m->plan->layers[i].act != BN_ACT_RELU) continue;
        candidates += prologue_conv(m, i) >= 0;
        taken += m->plan->layers[i].by_conv_prologue;
    }
    if (candidates)
        log_info("model.fuse = graphs: %d of %d batch norms + ReLU before a fused convolution run as its prologue",
                 taken, candidates);
}

/* Plan p with conv j's data gradient apart from batch norm i's backward. */
static void dgrad_dbn_apart(Plan *p, int i, int j) {
    p->layers[j].dgrad_dbn = NULL;
    p->layers[j].dbn_layer = -1;
    p->layers[i].backward_by_conv = 0;
}

/* Conv j's data gradient with batch norm i's backward, under benchmark where
 * the two layers' backward (the filter gradient as training runs it, joined)
 * timed faster so, after their forward on the model's buffers. */
static void choose_dgrad_dbn(Model *m, int j, int benchmark) {
    const Layer *conv = &m->layers[j];
    int i = m->plan->layers[j].dbn_layer;
    const Layer *bn = &m->layers[i];
    if (!benchmark) {
        log_info("layer %d %s + ReLU backward: in layer %d %s's data gradient (%s)", i, bn->name, j, conv->name,
                 m->device == DEVICE_CUDA ? "cuDNN graph; not timed: perf.conv_benchmark off"
                                          : "the CPU composes the reference ops");
        return;
    }
    if (m->plan->layers[i].stats_by_conv) layer_kinds[LAYER_CONV].forward(m, &m->layers[i - 1]);
    layer_kinds[LAYER_BATCHNORM].forward(m, bn);
    layer_kinds[LAYER_CONV].forward(m, conv);
    Plan *apart = plan_copy(m->plan);
    dgrad_dbn_apart(apart, i, j);
    float fused_us = plan_time_us(m, m->plan, i, j, dgrad_dbn_step);
    float apart_us = plan_time_us(m, apart, i, j, dgrad_dbn_step);
    agree(m, &fused_us, &apart_us);
    int keep = fused_us < apart_us;
    log_info("layer %d %s + ReLU backward: %s layer %d %s's data gradient, the two layers' backward %.1f us so "
             "against %.1f us apart",
             i, bn->name, keep ? "in" : "apart (slower) from", j, conv->name, fused_us, apart_us);
    if (keep) plan_keep(m, m->plan, apart);
    else plan_keep(m, apart, m->plan);
}

static void log_dgrad_dbns(const Model *m) {
    int candidates = 0, taken = 0;
    for (int i = 0; i < m->n_layers; i++) {
        candidates += plan_dbn_conv(m, i) >= 0;
        taken += m->plan->layers[i].backward_by_conv;
    }
    if (candidates)
        log_info("model.fuse = graphs: %d of %d batch norms + ReLU before a convolution run their backward in its "
                 "data gradient",
                 taken, candidates);
}

/* How the layers run while the candidates are timed. */
typedef struct {
    int training, grads_zeroed, recomputing, overlap_wgrad;
} RunState;

static RunState run_state(const Model *m) {
    return (RunState){m->training, m->grads_zeroed, m->recomputing, m->overlap_wgrad};
}

static void set_run_state(Model *m, RunState s) {
    m->training = s.training, m->grads_zeroed = s.grads_zeroed;
    m->recomputing = s.recomputing, m->overlap_wgrad = s.overlap_wgrad;
}

void plan_graphs_choose(Model *m) {
    int benchmark = m->conv_policy.benchmark && m->device == DEVICE_CUDA;
    RunState own = run_state(m);
    if (benchmark) fill_timing_inputs(m);
    /* Training, timed as an optimizer step's first micro-batch runs (filter gradients overwritten), momentum 0
     * (recomputing: the timings leave the running statistics alone). A filter gradient forked to the side
     * stream is joined only by model_backward: the timings' runs, one after another on the compute stream,
     * would share the convolutions' workspace with it (on an H200 the start-up then never ended, the GPU busy
     * at 138 W), so the pairs and prologues are timed without the fork; each dgrad timing joins its own, and
     * the op has its own workspace. */
    set_run_state(m, (RunState){1, 1, 1, 0});
    for (int i = 0; i + 1 < m->n_layers; i++)
        if (m->plan->layers[i].genstats) choose_pair(m, i, benchmark);
    for (int i = 0; i < m->n_layers; i++) {
        choose_prologue(m, i, benchmark);
        if (m->plan->layers[i].prologue_genstats) { /* its pairs came apart */
            plan_genstats_free(m, m->plan->layers[i].prologue_genstats);
            m->plan->layers[i].prologue_genstats = NULL;
        }
    }
    set_run_state(m, (RunState){1, 1, 1, own.overlap_wgrad});
    for (int j = 0; j < m->n_layers; j++)
        if (m->plan->layers[j].dgrad_dbn) choose_dgrad_dbn(m, j, benchmark);
    set_run_state(m, own);
    log_pairs(m);
    log_prologues(m);
    log_dgrad_dbns(m);
}
