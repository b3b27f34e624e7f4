/* The inference form's plan (plan.h's InferPlan, which infer.c runs): the net's layers as a list of steps,
 * each batch norm after a convolution folded into it, each ReLU into the step before it where that kind takes
 * it (layer_kinds' takes_relu, which training's mark_fusions reads too), an add into the convolution that
 * alone makes one of its inputs (as the convolution's residual), and the identities of evaluation (dropout,
 * flatten) made aliases of their inputs. */
#include "models/plan.h"

#include <stdlib.h>
#include <string.h>

#include "models/layers.h"
#include "runtime/check.h"

/* The planning's running state: each activation's alias (the one whose value it is, or -1) and producer
 * (the step writing it, or -1), and its readers among the layers. */
typedef struct {
    InferPlan *plan;
    int alias[MODEL_MAX_ACTS], producer[MODEL_MAX_ACTS], readers[MODEL_MAX_ACTS];
    long order;
} Planning;

static int resolve(const Planning *p, int id) {
    while (p->alias[id] >= 0) id = p->alias[id];
    return id;
}

static PlanStep *new_step(Planning *p, const Model *g, int layer) {
    PlanStep *s = &p->plan->steps[p->plan->n_steps++];
    const Layer *l = &g->layers[layer];
    *s = (PlanStep){.kind = layer_kinds[l->kind].step, .layer = layer, .bn_layer = -1, .in = resolve(p, l->in),
                    .in2 = l->in2 >= 0 ? resolve(p, l->in2) : -1, .out = l->out, .shape_in = l->in,
                    .shape_in2 = l->in2, .order = p->order++};
    p->producer[l->out] = p->plan->n_steps - 1;
    return s;
}

/* The step writing activation id (after aliasing), or NULL for the input. */
static PlanStep *producer_of(Planning *p, int id) {
    int step = p->producer[resolve(p, id)];
    return step >= 0 ? &p->plan->steps[step] : NULL;
}

static int fold_bn(Planning *p, const Model *g, int layer) {
    const Layer *l = &g->layers[layer];
    PlanStep *s = producer_of(p, l->in);
    if (!s || s->kind != STEP_CONV || s->bn_layer >= 0 || s->relu || s->in2 >= 0 || p->readers[l->in] != 1) return 0;
    if (g->acts[l->in].c != g->acts[s->out].c) return 0; /* a norm of a flatten's c*h*w features */
    s->bn_layer = layer;
    p->alias[l->out] = s->out;
    p->plan->bn_folded++;
    return 1;
}

static int fuse_relu(Planning *p, const Model *g, const Layer *l) {
    PlanStep *s = producer_of(p, l->in);
    if (!s || s->relu || p->readers[l->in] != 1) return 0;
    if (!(layer_kinds[g->layers[s->layer].kind].takes_relu & TAKES_RELU_INFERENCE)) return 0;
    s->relu = 1;
    p->alias[l->out] = s->out;
    p->plan->relu_fused++;
    return 1;
}

/* An add whose input is a convolution's output (read by nothing else) becomes that convolution's residual:
 * the convolution moves to the add's place, after the other input is ready. */
static int fuse_add(Planning *p, const Layer *l) {
    int inputs[2] = {l->in, l->in2};
    for (int k = 0; k < 2; k++) {
        PlanStep *s = producer_of(p, inputs[k]);
        if (!s || s->kind != STEP_CONV || s->relu || s->in2 >= 0 || p->readers[inputs[k]] != 1) continue;
        s->in2 = resolve(p, inputs[1 - k]);
        s->order = p->order++;
        p->alias[l->out] = s->out;
        p->plan->add_fused++;
        return 1;
    }
    return 0;
}

/* An identity's output is its input: the readers of both are the readers of that one value (the folds and
 * fusions above ask whether a layer's input has one reader). */
static void alias_identity(Planning *p, const Layer *l) {
    int in = resolve(p, l->in);
    p->alias[l->out] = in;
    p->readers[in] = p->readers[l->out] = p->readers[in] - 1 + p->readers[l->out];
}

static int step_order(const void *a, const void *b) {
    long x = ((const PlanStep *)a)->order, y = ((const PlanStep *)b)->order;
    return (x > y) - (x < y);
}

void plan_inference(const Model *g, InferPlan *plan) {
    memset(plan, 0, sizeof *plan);
    Planning *p = malloc(sizeof *p);
    if (!p) TC_FATAL("out of host memory: the inference plan");
    *p = (Planning){.plan = plan};
    plan_count_readers(g, p->readers);
    for (int i = 0; i < g->n_acts; i++) p->alias[i] = p->producer[i] = -1;
    for (int i = 0; i < g->n_layers; i++) {
        const Layer *l = &g->layers[i];
        if (l->kind == LAYER_BATCHNORM && fold_bn(p, g, i)) continue;
        if (l->kind == LAYER_RELU && fuse_relu(p, g, l)) continue;
        if (l->kind == LAYER_ADD && fuse_add(p, l)) continue;
        if (layer_kinds[l->kind].step == STEP_IDENTITY) alias_identity(p, l);
        else new_step(p, g, i);
    }
    qsort(plan->steps, (size_t)plan->n_steps, sizeof(PlanStep), step_order);
    plan->logits = resolve(p, g->n_acts - 1);
    free(p);
}
