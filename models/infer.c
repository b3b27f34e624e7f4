/* The inference form of a model (infer.h): the planner's steps (plan_inference: folded, fused, in order),
 * each with its op, placed (weights, buffers) and run. */
#include "models/infer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/add.h"
#include "ops/avgpool.h"
#include "ops/batchnorm.h"
#include "models/layers.h"
#include "ops/cast.h"
#include "ops/concat.h"
#include "ops/conv_bias_act.h"
#include "ops/gelu.h"
#include "ops/linear.h"
#include "ops/maxpool.h"
#include "ops/relu.h"
#include "ops/scale.h"
#include "ops/silu.h"
#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/gpu.h"

typedef struct {
    PlanStep plan;        /* what it runs, from the planner (plan_inference) */
    size_t w_off, b_off;  /* conv, linear: elements into the weights; batch norm: floats into bn_params */
    char name[24];        /* the layer's name: the ops' label */
    ConvBiasAct conv;
    MaxPool2d pool;
    Pool2dShape window;   /* avgpool: its window (n 0: global) */
    LinearShape linear;
    BatchNorm bn;
    float scale;          /* scale: its factor */
    void *bn_scratch;
    size_t bn_scratch_bytes;
} Step;

typedef struct {
    int c, h, w;          /* per image; the input's c is padded to 8 under NHWC */
    int last_use;         /* the last step (in run order) reading it */
    int buffer;           /* which shared buffer holds it, or -1 */
    void *value;
} Value;

#define INFER_MAX_BUFFERS 64

struct InferNet {
    InferOptions opt;
    GpuContext *gpu;
    OpContext ops;
    int classes, in_c, in_h, in_w; /* the image's real channels */
    float bn_eps;
    Value vals[MODEL_MAX_ACTS];
    int n_vals, logits_act;
    Step steps[MODEL_MAX_LAYERS];
    int n_steps;
    size_t n_weights, n_bn_floats;
    size_t buffer_bytes[INFER_MAX_BUFFERS];
    int n_buffers;
    void *buffers[INFER_MAX_BUFFERS];
    void *weights;        /* every conv's and linear's weights and bias, of opt.dtype */
    float *bn_params;     /* unfolded batch norms: gamma, beta, mean, var (c each), fp32 */
    float *input;         /* fp32 NCHW */
    float *logits;        /* fp32 */
    void *workspace;
    size_t workspace_bytes;
    cudaGraphExec_t exec; /* captured at the first run under opt.graph */
    InferStats stats;
    Arena arena;
};

static size_t dsize(const InferNet *net) { return dtype_size(net->opt.dtype); }
static void *elem(const InferNet *net, void *base, size_t i) { return (char *)base + i * dsize(net); }
static size_t val_count(const InferNet *net, int id) {
    const Value *v = &net->vals[id];
    return (size_t)net->opt.batch * v->c * v->h * v->w;
}

/* ---- the planner's steps, each with its op's state ------------------------ */

static void take_plan(InferNet *net, const Model *g) {
    InferPlan *plan = malloc(sizeof *plan);
    if (!plan) TC_FATAL("out of host memory: the inference plan");
    plan_inference(g, plan);
    for (int i = 0; i < plan->n_steps; i++) {
        Step *s = &net->steps[i];
        memset(s, 0, sizeof *s);
        s->plan = plan->steps[i];
        snprintf(s->name, sizeof s->name, "%s", g->layers[s->plan.layer].name);
    }
    net->n_steps = plan->n_steps;
    net->logits_act = plan->logits;
    net->stats.steps = plan->n_steps;
    net->stats.bn_folded = plan->bn_folded;
    net->stats.relu_fused = plan->relu_fused;
    net->stats.add_fused = plan->add_fused;
    free(plan);
}

/* ---- shapes and op state -------------------------------------------------- */

static void init_values(InferNet *net, const Model *g) {
    net->n_vals = g->n_acts;
    for (int i = 0; i < g->n_acts; i++) {
        const Activation *a = &g->acts[i];
        net->vals[i] = (Value){a->c, a->h, a->w, -1, -1, NULL};
    }
    net->in_c = g->acts[0].c_real;
    net->in_h = g->acts[0].h;
    net->in_w = g->acts[0].w;
    net->vals[0].c = net->opt.nhwc ? (net->in_c + 7) / 8 * 8 : net->in_c;
}

static void init_step_op(InferNet *net, const Model *g, Step *s) {
    const Layer *l = &g->layers[s->plan.layer];
    const Value *x = &net->vals[s->plan.in];
    int n = net->opt.batch;
    switch (s->plan.kind) {
    case STEP_CONV: {
        ConvBiasActShape shape = {l->conv.shape, s->plan.relu, s->plan.in2 >= 0};
        shape.conv.n = n;
        shape.conv.c = x->c;
        if (conv2d_groups(&l->conv.shape) > 1 && x->c != g->acts[l->in].c)
            TC_FATAL("%s: a grouped convolution over the input, whose %d channels the inference path pads to %d "
                     "in NHWC (infer in NCHW)", s->name, g->acts[l->in].c_real, x->c);
        conv_bias_act_init(&net->ops, &s->conv, &shape, &net->opt.conv_policy);
        size_t ws = conv_bias_act_workspace_bytes(&net->ops, &s->conv);
        if (ws > net->workspace_bytes) net->workspace_bytes = ws;
        net->stats.convs++;
        net->stats.convs_fused += conv_bias_act_fused(&s->conv);
        break;
    }
    case STEP_MAXPOOL: {
        Pool2dShape p = l->pool.shape;
        p.n = n;
        maxpool_init(&net->ops, &s->pool, &p, NULL); /* forward only: keeps no window positions */
        break;
    }
    case STEP_LINEAR:
        s->linear = (LinearShape){n, l->linear.in, l->linear.out};
        break;
    case STEP_SCALE:
        s->scale = l->scale;
        break;
    case STEP_AVGPOOL:
        s->window = l->pool.shape;
        if (s->window.n > 0) s->window.n = n;
        break;
    case STEP_BATCHNORM: {
        const Value *v = &net->vals[s->plan.shape_in];
        BatchNormShape b = {n, v->c, v->h, v->w};
        s->bn.shape = b;
        s->bn_scratch_bytes = batchnorm_scratch_bytes(&net->ops, &b);
        break;
    }
    default:
        break;
    }
}

/* ---- buffers: an activation takes a free buffer (or a new one) at its step
 * and gives it back after its last reader ---------------------------------- */

static void plan_buffers(InferNet *net) {
    for (int i = 0; i < net->n_steps; i++) {
        const Step *s = &net->steps[i];
        net->vals[s->plan.in].last_use = i;
        if (s->plan.in2 >= 0) net->vals[s->plan.in2].last_use = i;
    }
    net->vals[net->logits_act].last_use = net->n_steps;
    int holder[INFER_MAX_BUFFERS];
    /* The input's cast fills activation 0 before the first step (i = -1),
     * except on the CPU, where activation 0 is the input itself. */
    for (int i = net->gpu ? -1 : 0; i < net->n_steps; i++) {
        int id = i < 0 ? 0 : net->steps[i].plan.out;
        size_t bytes = val_count(net, id) * dsize(net);
        int best = -1;
        for (int b = 0; b < net->n_buffers; b++) {
            int free_now = holder[b] < 0 || net->vals[holder[b]].last_use < i;
            if (free_now && (best < 0 || net->buffer_bytes[b] > net->buffer_bytes[best])) best = b;
        }
        if (best < 0) {
            if (net->n_buffers == INFER_MAX_BUFFERS) TC_FATAL("inference: more than %d live activations", INFER_MAX_BUFFERS);
            best = net->n_buffers++;
            net->buffer_bytes[best] = 0;
            holder[best] = -1;
        }
        if (bytes > net->buffer_bytes[best]) net->buffer_bytes[best] = bytes;
        holder[best] = id;
        net->vals[id].buffer = best;
    }
}

static void carve(InferNet *net, Arena *a) {
    int gpu = net->gpu != NULL;
    net->input = arena_alloc(a, (size_t)net->opt.batch * net->in_c * net->in_h * net->in_w * sizeof(float),
                             "the inference input");
    net->logits = arena_alloc(a, (size_t)net->opt.batch * net->classes * sizeof(float), "the inference logits");
    net->weights = arena_alloc(a, net->n_weights * dsize(net), "the inference weights");
    net->bn_params = net->n_bn_floats ? arena_alloc(a, net->n_bn_floats * sizeof(float), "batch-norm statistics")
                                      : NULL;
    for (int b = 0; b < net->n_buffers; b++) net->buffers[b] = arena_alloc(a, net->buffer_bytes[b], "activations");
    net->workspace = net->workspace_bytes ? arena_alloc(a, net->workspace_bytes, "the cuDNN workspace") : NULL;
    for (int i = 0; i < net->n_steps; i++) {
        Step *s = &net->steps[i];
        s->bn_scratch = s->bn_scratch_bytes ? arena_alloc(a, s->bn_scratch_bytes, "batch-norm scratch") : NULL;
    }
    for (int id = 0; id < net->n_vals; id++)
        if (net->vals[id].buffer >= 0) net->vals[id].value = net->buffers[net->vals[id].buffer];
    if (!gpu) net->vals[0].value = net->input;
}

/* ---- weights: folded and in the net's layout ------------------------------ */

/* Index of PyTorch's weight j of conv or linear layer l in the net's layout. */
static size_t net_weight_index(const InferNet *net, const Model *g, const Layer *l, const Step *s, size_t j) {
    const Value *x = &net->vals[s->plan.in];
    const Activation *gx = &g->acts[l->in];
    if (l->kind == LAYER_CONV) { /* a filter's channels: c / groups */
        size_t rs = (size_t)l->conv.shape.r * l->conv.shape.s, groups = (size_t)conv2d_groups(&l->conv.shape);
        size_t cr = (size_t)gx->c_real / groups, xc = (size_t)x->c / groups;
        size_t k = j / (cr * rs), c = j / rs % cr, pos = j % rs;
        return net->opt.nhwc ? (k * rs + pos) * xc + c : (k * xc + c) * rs + pos;
    }
    if (net->opt.nhwc && x->h * x->w > 1) {
        size_t in = (size_t)x->c * x->h * x->w, hw = (size_t)x->h * x->w;
        size_t row = j / in, col = j % in, c = col / hw, pos = col % hw;
        return row * in + pos * x->c + c;
    }
    return j;
}

static void place_weights(InferNet *net, const Model *g) {
    for (int i = 0; i < net->n_steps; i++) {
        Step *s = &net->steps[i];
        const Layer *l = &g->layers[s->plan.layer];
        if (s->plan.kind == STEP_CONV || s->plan.kind == STEP_LINEAR) {
            size_t k = s->plan.kind == STEP_CONV ? (size_t)l->conv.shape.k : (size_t)l->linear.out;
            size_t w_count = s->plan.kind == STEP_CONV ? k * (net->vals[s->plan.in].c / conv2d_groups(&l->conv.shape)) *
                                                        l->conv.shape.r * l->conv.shape.s
                                                  : (size_t)l->linear.in * k;
            s->w_off = model_param_align(net->n_weights); /* as the training model's (add_params) */
            s->b_off = model_param_align(s->w_off + w_count);
            net->n_weights = s->b_off + k;
        } else if (s->plan.kind == STEP_BATCHNORM) {
            s->w_off = net->n_bn_floats;
            net->n_bn_floats += 4 * (size_t)net->vals[s->plan.shape_in].c;
        }
    }
}

/* w' = w * gamma / sqrt(var + eps) per output channel, b' = (b - mean) * that + beta. */
static void fold_into(const Model *g, const Layer *bn, const float *params, const float *bn_stats, size_t k,
                      float *scale, float *shift) {
    const float *gamma = params + bn->w_off, *beta = params + bn->b_off;
    const float *mean = bn_stats + bn->stat_off, *var = mean + k;
    for (size_t c = 0; c < k; c++) {
        scale[c] = gamma[c] / sqrtf(var[c] + g->bn_eps);
        shift[c] = beta[c] - mean[c] * scale[c];
    }
}

static void fill_weights(const InferNet *net, const Model *g, const float *params, const float *bn_stats,
                         float *w, float *bn) {
    for (int i = 0; i < net->n_steps; i++) {
        const Step *s = &net->steps[i];
        const Layer *l = &g->layers[s->plan.layer];
        if (s->plan.kind == STEP_BATCHNORM) {
            size_t c = (size_t)net->vals[s->plan.shape_in].c;
            memcpy(bn + s->w_off, params + l->w_off, c * sizeof(float));
            memcpy(bn + s->w_off + c, params + l->b_off, c * sizeof(float));
            memcpy(bn + s->w_off + 2 * c, bn_stats + l->stat_off, 2 * c * sizeof(float));
            continue;
        }
        if (s->plan.kind != STEP_CONV && s->plan.kind != STEP_LINEAR) continue;
        size_t k = s->plan.kind == STEP_CONV ? (size_t)l->conv.shape.k : (size_t)l->linear.out;
        size_t per_k = s->plan.kind == STEP_CONV ? (size_t)(g->acts[l->in].c_real / conv2d_groups(&l->conv.shape)) *
                                                  l->conv.shape.r * l->conv.shape.s
                                            : (size_t)l->linear.in;
        float *scale = malloc(k * sizeof(float)), *shift = malloc(k * sizeof(float));
        if (!scale || !shift) TC_FATAL("out of host memory folding %s", s->name);
        for (size_t c = 0; c < k; c++) scale[c] = 1, shift[c] = 0;
        if (s->plan.bn_layer >= 0) fold_into(g, &g->layers[s->plan.bn_layer], params, bn_stats, k, scale, shift);
        for (size_t j = 0; j < k * per_k; j++)
            w[s->w_off + net_weight_index(net, g, l, s, j)] =
                params[l->w_off + model_weight_index(g, l, j)] * scale[j / per_k];
        for (size_t c = 0; c < k; c++)
            w[s->b_off + c] = (l->b_count ? params[l->b_off + c] : 0.0f) * scale[c] + shift[c];
        free(scale);
        free(shift);
    }
}

static void upload_weights(InferNet *net, const Model *g, const float *params, const float *bn_stats) {
    float *w = calloc(net->n_weights ? net->n_weights : 1, sizeof(float)); /* padded channels stay 0 */
    float *bn = calloc(net->n_bn_floats ? net->n_bn_floats : 1, sizeof(float));
    void *stored = net->gpu ? malloc(net->n_weights * dsize(net) + 1) : NULL;
    if (!w || !bn || (net->gpu && !stored)) TC_FATAL("out of host memory: %zu inference weights", net->n_weights);
    fill_weights(net, g, params, bn_stats, w, bn);
    if (net->gpu) {
        cast_from_f32_cpu(net->opt.dtype, w, stored, net->n_weights);
        op_copy_from_host(&net->ops, net->weights, stored, net->n_weights * dsize(net));
    } else {
        memcpy(net->weights, w, net->n_weights * sizeof(float));
    }
    if (net->n_bn_floats) op_copy_from_host(&net->ops, net->bn_params, bn, net->n_bn_floats * sizeof(float));
    op_sync(&net->ops);
    free(w);
    free(bn);
    free(stored);
}

/* ---- create, run ---------------------------------------------------------- */

InferNet *infer_create(const Model *graph, const float *params, const float *bn_stats, GpuContext *gpu,
                       const InferOptions *opt) {
    if (opt->batch < 1) TC_FATAL("inference: batch %d", opt->batch);
    if (!gpu && (opt->dtype != DTYPE_F32 || opt->nhwc)) TC_FATAL("inference on the CPU runs fp32 NCHW only");
    if (graph->n_bn_stats && !bn_stats) TC_FATAL("inference: the model has batch norms but no statistics were given");
    layer_kinds_check();
    layers_check_flattens(graph, opt->nhwc);
    InferNet *net = calloc(1, sizeof *net);
    if (!net) TC_FATAL("out of host memory: an inference net");
    net->opt = *opt;
    net->gpu = gpu;
    net->classes = graph->num_classes;
    net->bn_eps = graph->bn_eps;
    net->ops = gpu ? op_context_gpu(gpu, opt->dtype, opt->nhwc) : op_context_cpu();
    init_values(net, graph);
    take_plan(net, graph);
    for (int i = 0; i < net->n_steps; i++) init_step_op(net, graph, &net->steps[i]);
    plan_buffers(net);
    place_weights(net, graph);

    Arena sizing;
    arena_init_counting(&sizing, net->ops.device);
    carve(net, &sizing);
    arena_init(&net->arena, net->ops.device, sizing.used);
    carve(net, &net->arena);
    net->ops.workspace = net->workspace;
    for (int i = 0; i < net->n_steps; i++)
        if (net->steps[i].plan.kind == STEP_BATCHNORM)
            batchnorm_init(&net->ops, &net->steps[i].bn, &net->steps[i].bn.shape, net->steps[i].bn_scratch);
    upload_weights(net, graph, params, bn_stats);
    op_fill(&net->ops, net->input, 0, infer_input_floats(net) * sizeof(float));
    for (int b = 0; b < net->n_buffers; b++) op_fill(&net->ops, net->buffers[b], 0, net->buffer_bytes[b]);
    op_sync(&net->ops);

    net->stats.weight_bytes = net->n_weights * dsize(net) + net->n_bn_floats * sizeof(float);
    for (int b = 0; b < net->n_buffers; b++) net->stats.activation_bytes += net->buffer_bytes[b];
    net->stats.workspace_bytes = net->workspace_bytes;
    return net;
}

void infer_destroy(InferNet *net) {
    if (!net) return;
    op_sync(&net->ops);
    for (int i = 0; i < net->n_steps; i++) {
        Step *s = &net->steps[i];
        if (s->plan.kind == STEP_CONV) conv_bias_act_destroy(&net->ops, &s->conv);
        if (s->plan.kind == STEP_MAXPOOL) maxpool_destroy(&net->ops, &s->pool);
        if (s->plan.kind == STEP_BATCHNORM) batchnorm_destroy(&net->ops, &s->bn);
    }
    if (net->exec) gpu_graph_destroy(net->exec);
    arena_free(&net->arena);
    free(net);
}

static void run_step(InferNet *net, const Step *s) {
    const OpContext *ctx = &net->ops;
    const void *x = net->vals[s->plan.in].value;
    const void *x2 = s->plan.in2 >= 0 ? net->vals[s->plan.in2].value : NULL;
    void *y = net->vals[s->plan.out].value;
    size_t n = val_count(net, s->plan.out);
    switch (s->plan.kind) {
    case STEP_CONV:
        conv_bias_act_forward(ctx, &s->conv, x, elem(net, net->weights, s->w_off), elem(net, net->weights, s->b_off),
                              x2, y);
        break;
    case STEP_MAXPOOL:
        maxpool_forward(ctx, &s->pool, x, y);
        break;
    case STEP_AVGPOOL: {
        const Value *v = &net->vals[s->plan.shape_in];
        if (s->window.n > 0) avgpool2d_forward(ctx, &s->window, x, y);
        else avgpool_forward(ctx, x, y, net->opt.batch, v->c, v->h * v->w);
        break;
    }
    case STEP_CONCAT: {
        const Value *a = &net->vals[s->plan.shape_in], *b = &net->vals[s->plan.shape_in2];
        ConcatShape cs = {net->opt.batch, a->c, b->c, a->h * a->w};
        concat_forward(ctx, &cs, x, x2, y);
        break;
    }
    case STEP_LINEAR:
        linear_forward(ctx, &s->linear, x, elem(net, net->weights, s->w_off), elem(net, net->weights, s->b_off), y);
        if (s->plan.relu) relu_forward(ctx, y, y, n);
        break;
    case STEP_BATCHNORM: {
        size_t c = (size_t)net->vals[s->plan.shape_in].c;
        float *p = net->bn_params + s->w_off;
        BatchNormParams bp = {.gamma = p, .beta = p + c, .running_mean = p + 2 * c, .running_var = p + 3 * c,
                              .momentum = 0.0f, .eps = net->bn_eps};
        batchnorm_forward(ctx, &s->bn, BN_EVAL, s->plan.relu ? BN_ACT_RELU : BN_ACT_NONE, &bp, x, y);
        break;
    }
    case STEP_ADD:
        if (s->plan.relu) add_relu_forward(ctx, x, x2, y, n);
        else add_forward(ctx, x, x2, y, n);
        break;
    case STEP_RELU:
        relu_forward(ctx, x, y, n);
        break;
    case STEP_GELU:
        gelu_forward(ctx, x, y, n);
        break;
    case STEP_SCALE:
        scale_forward(ctx, x, y, n, s->scale);
        break;
    case STEP_SILU:
        silu_forward(ctx, x, y, n);
        break;
    case STEP_MISSING:
    case STEP_IDENTITY: /* never a step (layer_kinds_check, plan_inference) */
        TC_FATAL("inference: %s has no step to run", s->name);
    }
}

static void run_steps(InferNet *net) {
    OpContext *ctx = &net->ops;
    int n = net->opt.batch;
    if (net->gpu && net->opt.nhwc)
        cast_nchw_to_nhwc(ctx, net->input, net->vals[0].value, n, net->in_c, net->in_h, net->in_w, net->vals[0].c);
    else if (net->gpu)
        cast_from_f32(ctx, net->input, net->vals[0].value, infer_input_floats(net));
    for (int i = 0; i < net->n_steps; i++) {
        ctx->label = net->steps[i].name;
        run_step(net, &net->steps[i]);
    }
    ctx->label = NULL;
    size_t logits = (size_t)n * net->classes;
    if (net->gpu) cast_to_f32(ctx, net->vals[net->logits_act].value, net->logits, logits);
    else op_copy(ctx, net->logits, net->vals[net->logits_act].value, logits * sizeof(float));
}

void infer_run(InferNet *net) {
    if (!net->gpu || !net->opt.graph) {
        run_steps(net);
        return;
    }
    if (!net->exec) {
        gpu_capture_begin(net->ops.stream);
        run_steps(net);
        net->exec = gpu_capture_end(net->ops.stream, 0);
    }
    gpu_graph_launch(net->exec, net->ops.stream);
}

float *infer_input(const InferNet *net) { return net->input; }
size_t infer_input_floats(const InferNet *net) {
    return (size_t)net->opt.batch * net->in_c * net->in_h * net->in_w;
}
const float *infer_logits(const InferNet *net) { return net->logits; }
const OpContext *infer_ops(const InferNet *net) { return &net->ops; }
void infer_set_hooks(InferNet *net, const OpHooks *hooks) { net->ops.hooks = hooks; }
int infer_batch(const InferNet *net) { return net->opt.batch; }
int infer_classes(const InferNet *net) { return net->classes; }
InferStats infer_stats(const InferNet *net) { return net->stats; }
