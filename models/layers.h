/* Inside models/ only: what each kind of layer runs (models/layers.c), and
 * the helpers that the model's planning (model.c) and its running share.
 * Adding an op to the model form is one LayerKind, one entry in layer_kinds,
 * one builder in model.c, one in infer.c's kind_of (and its step), and a
 * look at the sites that count LAYER_KINDS (init_params, tensors.c,
 * tools/trainer/profile.c): the build stops until each is counted, and
 * model_finalize and infer_create stop at a table's missing entry. */
#ifndef TRAINC_MODELS_LAYERS_H
#define TRAINC_MODELS_LAYERS_H

#include "models/model.h"
#include "ops/conv_bias_gelu.h"
#include "ops/conv_bias_relu_pool.h"
#include "ops/space_to_depth.h"

typedef struct {
    const char *name;  /* layer i of this kind is named "<name> i" (NVTX ranges, hooks) */
    /* One layer's forward and backward, through the op faces on m->ops. */
    void (*forward)(Model *m, const Layer *l);
    void (*backward)(Model *m, const Layer *l);
    int adds_dx;       /* backward can add its input gradient to one already there (dx_accumulate) */
} LayerKindOps;

extern const LayerKindOps layer_kinds[LAYER_KINDS];
/* Stops, naming the kind, where layer_kinds lacks one (model_finalize calls it). */
void layer_kinds_check(void);
/* Stops where under NHWC (nhwc) a flatten of an h x w > 1 map feeds a layer that takes its features in
 * NCHW order: anything but a linear layer (model.c; model_finalize and infer_create call it). */
void layers_check_flattens(const Model *m, int nhwc);

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

/* model.fuse = graphs (models/graph_fusion.c): plan builds each
 * convolution-before-batch-norm pair's fused graph where an engine takes it,
 * each batch norm + ReLU's prologue form of the conv after it, and that
 * conv's data gradient with the norm's backward (before the buffers: they
 * size the workspaces); choose, with the buffers carved and before the
 * parameters are set, times them under perf.conv_benchmark and keeps the
 * faster way of each; destroy frees them. On the CPU every one is taken,
 * composed of the reference ops. */
void graph_fusion_plan(Model *m);
void graph_fusion_choose(Model *m);
void graph_fusion_destroy(Model *m);
/* The conv whose data gradient may run batch norm i's backward and its
 * ReLU's (conv_dgrad_dbn), or -1. The norm's input and output gradients then
 * share a buffer (plan_grad_slots): the conv writes dz there and makes dx
 * over it, or, apart, the norm's backward runs in place. */
int graph_fusion_dbn_conv(const Model *m, int i);

/* model.fuse (models/input_form.c), GPU: a convolution over the input image
 * run on copies of the image and its filters in another form. plan (after
 * the convolutions' algorithms, before the buffers) times the forms and
 * keeps the fastest; carve takes the copies' buffers with the model's. */
typedef struct ConvInputForm {
    SpaceToDepthShape image, filter; /* the copies of the image and of the filters */
    Conv2d conv;                     /* the convolution over the copies */
    void *x, *w, *dw;                /* the copies, and the gradient of the filters' copy */
} ConvInputForm;
void input_form_plan(Model *m);
void input_form_carve(Model *m, Arena *a);
void input_form_destroy(Model *m);
/* The layer's forward copies the image x (NULL: unstored, the batch from
 * m->input_f32) and its filters w into the form, then runs its convolution
 * (conv2d or conv_genstats) on the copies; its
 * backward (the image takes no gradient) is input_form_backward. */
void input_form_copy(Model *m, const Layer *l, const void *x, const void *w);
void input_form_backward(Model *m, const Layer *l, const void *dy, void *dw, void *db);

/* Element i of a buffer of the activation dtype. */
static inline void *element(const Model *m, void *base, size_t i) {
    return (char *)base + i * dtype_size(m->act_dtype);
}

static inline size_t act_floats(const Model *m, int id) {
    const Activation *a = &m->acts[id];
    return (size_t)m->batch * a->c * a->h * a->w;
}

/* Where d(loss)/d(activation id) lives; NULL for the input image and for an
 * activation no gradient reaches. */
static inline void *grad_of(const Model *m, int id) {
    const Activation *a = &m->acts[id];
    if (id <= 0 || id < m->first_grad_act) return NULL;
    if (a->grad_in_value) return a->value;
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
