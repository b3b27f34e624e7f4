/* The op hook (ops/op_context.h) on the CPU: installed in a model's op
 * context, it sees every layer's ops, each begin followed by its end, with
 * the layer's name as the label, layer after layer in forward and in reverse
 * in backward (with the recomputed blocks' forwards under checkpointing), and
 * ops outside the layers with no label. */
#include <stdio.h>
#include <string.h>

#include "models/model.h"
#include "models/plan.h"
#include "ops/softmax_xent.h"
#include "tests/harness.h"

enum { MAX_EVENTS = 4096, BATCH = 4, CLASSES = 3 };

typedef struct {
    int begin;
    const char *op, *label;
} Event;

typedef struct {
    const OpContext *ctx; /* the context the model runs on: what the hooks must get */
    Event events[MAX_EVENTS];
    int n, wrong_ctx;
} Recorder;

static void record(Recorder *r, const OpContext *ctx, int begin, const char *op, const char *label) {
    if (ctx != r->ctx) r->wrong_ctx++;
    if (r->n < MAX_EVENTS) r->events[r->n] = (Event){begin, op, label};
    r->n++;
}

static void on_begin(void *user, const OpContext *ctx, const char *op, const char *label) {
    record(user, ctx, 1, op, label);
}

static void on_end(void *user, const OpContext *ctx, const char *op, const char *label) {
    record(user, ctx, 0, op, label);
}

/* Every layer kind the model form has (check_kinds_covered), two residual
 * blocks (an add, a fan-out), a fused-or-not batch norm + ReLU, and a concat
 * of a map with its windowed average (another fan-out). */
static void build(Model *m, int fuse, int checkpoint) {
    model_init(m, BATCH, CLASSES, 0);
    m->fuse = fuse;
    m->checkpoint = checkpoint;
    int x = model_input(m, 3, 8, 8);
    x = model_relu(m, model_batchnorm(m, model_conv_no_bias(m, x, 4, 3, 1, 1)));
    for (int b = 0; b < 2; b++) {
        model_block_begin(m);
        int y = model_gelu(m, model_conv(m, x, 4, 3, 1, 1));
        x = model_relu(m, model_add(m, model_batchnorm(m, y), x));
        model_block_end(m);
    }
    x = model_silu(m, model_maxpool2(m, x));
    x = model_dropout(m, model_concat(m, x, model_avgpool2d(m, x, 3, 1, 1)), 0.25f);
    model_scale(m, model_linear(m, model_flatten(m, model_avgpool(m, x)), CLASSES), 0.5f);
}

/* build's net has a layer of every kind. */
static void check_kinds_covered(void) {
    Model m;
    build(&m, 0, 0);
    int seen[LAYER_KINDS] = {0};
    for (int i = 0; i < m.n_layers; i++) seen[m.layers[i].kind] = 1;
    for (int k = 0; k < LAYER_KINDS; k++) CHECK_MSG(seen[k], "the test net has no layer of kind %d", k);
}

static int layer_named(const Model *m, const char *label) {
    for (int i = 0; i < m->n_layers; i++)
        if (label == m->layers[i].name) return i;
    return -1;
}

/* Whether op is one that a layer of this kind runs, forward or backward. */
static int op_of_kind(LayerKind kind, const char *op) {
    static const char *ops[LAYER_KINDS][7] = {
        [LAYER_CONV] = {"conv2d_forward", "bias_relu_forward", "conv2d_backward", "conv2d_bias_grad", "relu_backward",
                        "conv_bias_relu_pool_forward", "conv_bias_relu_pool_backward"},
        [LAYER_RELU] = {"relu_forward", "relu_backward"},
        [LAYER_MAXPOOL] = {"maxpool_forward", "maxpool_backward", "bias_relu_pool_forward", "bias_relu_pool_backward"},
        [LAYER_LINEAR] = {"linear_forward", "linear_backward"},
        [LAYER_BATCHNORM] = {"batchnorm_forward", "batchnorm_backward"},
        [LAYER_ADD] = {"add_forward", "add_relu_forward", "relu_backward", "add_accumulate", "op_copy"},
        [LAYER_AVGPOOL] = {"avgpool_forward", "avgpool_backward", "avgpool2d_forward", "avgpool2d_backward"},
        [LAYER_GELU] = {"gelu_forward", "gelu_backward"},
        [LAYER_SCALE] = {"scale_forward", "scale_backward"},
        [LAYER_SILU] = {"silu_forward", "silu_backward"},
        [LAYER_DROPOUT] = {"dropout_forward", "dropout_backward", "op_copy", "add_accumulate"},
        [LAYER_CONCAT] = {"concat_forward", "concat_backward"},
        [LAYER_FLATTEN] = {"op_copy", "add_accumulate"},
    };
    static int checked; /* once: the table has a line for every kind */
    for (int k = 0; !checked && k < LAYER_KINDS; k++)
        CHECK_MSG(ops[k][0], "op_of_kind knows no op of layer kind %d", k);
    checked = 1;
    for (int k = 0; k < 7 && ops[kind][k]; k++)
        if (strcmp(ops[kind][k], op) == 0) return 1;
    return 0;
}

/* Each begin followed at once by its end (a face calls no other face), every
 * label a layer's, every op one of its layer's kind. Returns the layers in
 * the order their ops ran, each run of one layer's ops counted once. */
static int check_events(const Model *m, const Recorder *r, const char *pass, int *order) {
    int n_order = 0;
    CHECK_MSG(r->n <= MAX_EVENTS, "%s: %d events", pass, r->n);
    CHECK_MSG(r->n % 2 == 0, "%s: %d events, begin and end unbalanced", pass, r->n);
    CHECK_MSG(r->wrong_ctx == 0, "%s: %d calls got another context than the model's", pass, r->wrong_ctx);
    for (int e = 0; e + 1 < r->n && e + 1 < MAX_EVENTS; e += 2) {
        const Event *b = &r->events[e], *end = &r->events[e + 1];
        CHECK_MSG(b->begin && !end->begin && strcmp(b->op, end->op) == 0 && b->label == end->label,
                  "%s: event %d (%s) is not closed by the next one (%s)", pass, e, b->op, end->op);
        /* The training forward's first op, outside the layers: dropout's step counter advanced. */
        if (!b->label && strcmp(b->op, "dropout_advance") == 0) continue;
        int layer = layer_named(m, b->label);
        CHECK_MSG(layer >= 0, "%s: op %s has label %s, no layer's name", pass, b->op, b->label ? b->label : "NULL");
        if (layer < 0) continue;
        CHECK_MSG(op_of_kind(m->layers[layer].kind, b->op), "%s: op %s under layer %s", pass, b->op, b->label);
        if (n_order == 0 || order[n_order - 1] != layer) order[n_order++] = layer;
    }
    return n_order;
}

/* Layer i runs an op in forward unless a fused ReLU (done by the layer before it), an add done by the
 * batch norm before it (add_by_bn), a max-pool done by the input's conv (pool_by_conv) or a flatten (its input's
 * storage, and here, its input's only reader, its gradient's too). */
static int runs_forward(const Model *m, const Layer *l) {
    const LayerPlan *p = plan_of(m, l);
    return !(l->kind == LAYER_RELU && p->by_producer) && !p->add_by_bn && !p->pool_by_conv &&
           l->kind != LAYER_FLATTEN;
}

/* ... and in backward unless a fused ReLU, or an add passing dy on as both inputs' own buffer whose ReLU,
 * if any, the batch norm that computed it takes backward too (add_by_bn). */
static int runs_backward(const Model *m, const Layer *l) {
    const LayerPlan *p = plan_of(m, l);
    if (l->kind == LAYER_ADD) return (p->add_relu && !p->add_by_bn) || !p->dx_alias[0] || !p->dx_alias[1];
    return runs_forward(m, l);
}

static void check_forward(Model *m, Recorder *r) {
    int order[MAX_EVENTS], expect[MODEL_MAX_LAYERS], n_expect = 0;
    r->n = 0;
    model_forward(m);
    int n = check_events(m, r, "forward", order);
    for (int i = 0; i < m->n_layers; i++)
        if (runs_forward(m, &m->layers[i])) expect[n_expect++] = i;
    CHECK_MSG(n == n_expect, "forward: ops of %d layers in turn, want %d", n, n_expect);
    for (int k = 0; k < n && k < n_expect; k++)
        CHECK_MSG(order[k] == expect[k], "forward: turn %d ran layer %d, want %d", k, order[k], expect[k]);
}

/* Backward meets the layers last first; under checkpointing each block but
 * the last runs its forward again before its own backward. */
static void check_backward(Model *m, Recorder *r) {
    int order[MAX_EVENTS], expect[2 * MODEL_MAX_LAYERS], n_expect = 0;
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const Layer *l = &m->layers[i];
        int block_end = l->block >= 0 && (i == m->n_layers - 1 || m->layers[i + 1].block != l->block);
        if (m->checkpoint && block_end && l->block != m->n_blocks - 1) {
            int first = i;
            while (first > 0 && m->layers[first - 1].block == l->block) first--;
            for (int j = first; j <= i; j++)
                if (runs_forward(m, &m->layers[j])) expect[n_expect++] = j;
        }
        if (runs_backward(m, l)) {
            /* A recomputed layer followed by its own backward is one run of its ops. */
            if (n_expect == 0 || expect[n_expect - 1] != i) expect[n_expect++] = i;
        }
    }
    r->n = 0;
    model_backward(m);
    int n = check_events(m, r, "backward", order);
    CHECK_MSG(n == n_expect, "backward: ops of %d layers in turn, want %d", n, n_expect);
    for (int k = 0; k < n && k < n_expect; k++)
        CHECK_MSG(order[k] == expect[k], "backward: turn %d ran layer %d, want %d", k, order[k], expect[k]);
}

static void check_model(int fuse, int checkpoint, uint64_t *rng) {
    static Recorder r;
    Model m;
    build(&m, fuse, checkpoint);
    model_finalize(&m, NULL, 11);
    OpHooks hooks = {on_begin, on_end, &r};
    memset(&r, 0, sizeof r);
    r.ctx = &m.ops;
    m.ops.hooks = &hooks;
    test_fill_uniform(model_input_buffer(&m), model_input_floats(&m), rng, -1.0f, 1.0f);
    check_forward(&m, &r);

    /* Between the layers (the loss, the optimizer): no label. */
    int32_t labels[BATCH] = {0, 1, 2, 0};
    float loss;
    r.n = 0;
    softmax_xent_smooth(&m.ops, model_logits(&m), labels, BATCH, CLASSES, 0.0f, NULL, &loss, model_logits_grad(&m));
    CHECK(r.n == 2 && r.events[0].label == NULL && strcmp(r.events[0].op, "softmax_xent_smooth") == 0);
    CHECK(m.ops.label == NULL);

    model_zero_grads(&m);
    check_backward(&m, &r);
    CHECK(m.ops.label == NULL);
    printf("fuse %d, checkpoint %d: %d layers, the hook saw each layer's ops in order\n", fuse, checkpoint,
           m.n_layers);
    model_destroy(&m);
}

int main(void) {
    uint64_t rng = test_seed();
    check_kinds_covered();
    for (int fuse = 0; fuse < 2; fuse++)
        for (int checkpoint = 0; checkpoint < 2; checkpoint++) check_model(fuse, checkpoint, &rng);
    return test_finish("test_hooks");
}
