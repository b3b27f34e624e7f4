/* Inside models/ only: what each kind of layer runs (models/layers.c), as the
 * model's plan (models/plan.h) says, and the helpers that the model (model.c),
 * its planning (plan.c, plan_graphs.c) and its running share.
 * Adding an op to the model form is one LayerKind, one entry in layer_kinds
 * (its passes, its inference step and whether it takes the ReLU after it), one
 * builder in model.c, its step's op in infer.c, a look at the sites that count
 * LAYER_KINDS (init_params, tensors.c, tools/trainer/profile.c), and, if it
 * fuses otherwise, its pattern in plan.c: the build stops until each is
 * counted, and model_finalize and infer_create stop at a missing entry. */
#ifndef TRAINC_MODELS_LAYERS_H
#define TRAINC_MODELS_LAYERS_H

#include "models/model.h"
#include "models/plan.h"
#include "ops/conv_bias_gelu.h"
#include "ops/conv_bias_relu_pool.h"

typedef struct {
    const char *name;  /* layer i of this kind is named "<name> i" (NVTX ranges, hooks) */
    /* One layer's forward and backward, through the op faces on m->ops. */
    void (*forward)(Model *m, const Layer *l);
    void (*backward)(Model *m, const Layer *l);
    int adds_dx;       /* backward can add its input gradient to one already there (dx_accumulate) */
    StepKind step;     /* what the inference form runs it as (plan_inference, infer.c) */
    int takes_relu;    /* TAKES_RELU_* (plan.h): where the ReLU after it runs in its pass */
} LayerKindOps;

extern const LayerKindOps layer_kinds[LAYER_KINDS];
/* Stops, naming the kind, where layer_kinds lacks one or a part of one (model_finalize and infer_create
 * call it). */
void layer_kinds_check(void);

/* model.nvtx_layers: an NVTX range around each op of a layer, named by the
 * layer ("conv 3"); ops outside the layers get none. */
extern const OpHooks layer_nvtx_hooks;

/* perf.overlap_wgrad: whether backward joins a filter gradient forked to the
 * side stream before this layer's backward. A batch norm's, ReLU's or add's
 * touches neither the convolutions' workspace nor what the fork reads and
 * writes (its dy stays in its buffer until the join: plan_grad_slots); any
 * other layer's may. */
int layer_joins_wgrad(const Layer *l);
/* Joins a filter gradient forked to the side stream, if one is pending (model_backward; start-up timings). */
void layer_wgrad_join(Model *m);

/* Element i of a buffer of the activation dtype. */
static inline void *element(const Model *m, void *base, size_t i) {
    return (char *)base + i * dtype_size(m->act_dtype);
}

static inline size_t act_floats(const Model *m, int id) {
    const Activation *a = &m->acts[id];
    return (size_t)m->batch * a->c * a->h * a->w;
}

/* The fp32 batch's length: the input's real channels (model_input_floats). */
static inline size_t input_floats(const Model *m) { return act_floats(m, 0) / m->acts[0].c * m->acts[0].c_real; }

/* Where d(loss)/d(activation id) lives; NULL for the input image and for an
 * activation no gradient reaches. */
static inline void *grad_of(const Model *m, int id) {
    const ActivationPlan *a = &m->plan->acts[id];
    if (id <= 0 || id < m->first_grad_act) return NULL;
    if (a->grad_in_value) return m->acts[id].value;
    return a->grad_slot >= 0 ? m->act_grads[a->grad_slot] : NULL;
}

/* A whitening conv's shape for ops/conv_bias_gelu: the image's padding channels skipped. */
static inline ConvBiasGeluShape whitening_shape(const Model *m, const Layer *l) {
    ConvBiasGeluShape s = {l->conv.shape, m->acts[l->in].c_real};
    return s;
}

/* An input convolution's shape for ops/conv_bias_relu_pool: the image's padding channels skipped. */
static inline ConvBiasReluPoolShape first_block_shape(const Model *m, const Layer *l) {
    ConvBiasReluPoolShape s = {l->conv.shape, m->acts[l->in].c_real};
    return s;
}

#endif
