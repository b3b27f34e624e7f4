#include "models/tensors.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    ModelTensor *out;
    int max, n;
} TensorList;

static void add(TensorList *list, const Layer *l, int layer, const char *suffix, int ndim, const int *shape,
                int in_bn_stats, size_t offset, int layout_weight) {
    if (list->n < list->max) {
        ModelTensor *t = &list->out[list->n];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s.%s", l->module, suffix);
        t->ndim = ndim;
        t->count = 1;
        for (int d = 0; d < ndim; d++) {
            t->shape[d] = shape[d];
            t->count *= (size_t)shape[d];
        }
        t->in_bn_stats = in_bn_stats;
        t->offset = offset;
        t->layer = layer;
        t->is_conv_or_linear_weight = layout_weight;
    }
    list->n++;
}

int model_tensors(const Model *m, ModelTensor *out, int max, char *err, size_t errlen) {
    /* Conv and linear weights take PyTorch's shapes, batch norm its statistics too, any other kind with
     * parameters a 1-D weight and bias; SiLU, dropout, concat and flatten have none. A new kind: name its
     * tensors here, then count it. */
    _Static_assert(LAYER_KINDS == 13, "model_tensors: a layer kind this function has not been checked for");
    TensorList list = {out, max, 0};
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (!l->w_count) continue;
        if (!l->module[0]) {
            snprintf(err, errlen, "layer %d (%s) has parameters but no module name", i, l->name);
            return -1;
        }
        if (l->kind == LAYER_CONV) {
            const Conv2dShape *s = &l->conv.shape;
            int shape[4] = {s->k, m->acts[l->in].c_real / conv2d_groups(s), s->r, s->s}; /* PyTorch's */
            add(&list, l, i, "weight", 4, shape, 0, l->w_off, 1);
        } else if (l->kind == LAYER_LINEAR) {
            int shape[2] = {l->linear.out, l->linear.in};
            add(&list, l, i, "weight", 2, shape, 0, l->w_off, 1);
        } else {
            int c = (int)l->w_count;
            add(&list, l, i, "weight", 1, &c, 0, l->w_off, 0);
        }
        int b = (int)l->b_count;
        if (b) add(&list, l, i, "bias", 1, &b, 0, l->b_off, 0);
        if (l->kind == LAYER_BATCHNORM) {
            add(&list, l, i, "running_mean", 1, &b, 1, l->stat_off, 0);
            add(&list, l, i, "running_var", 1, &b, 1, l->stat_off + (size_t)b, 0);
        }
    }
    return list.n;
}

void model_tensor_get(const Model *m, const ModelTensor *t, const float *params, const float *bn_stats, float *out) {
    const float *src = (t->in_bn_stats ? bn_stats : params) + t->offset;
    const Layer *l = &m->layers[t->layer];
    for (size_t j = 0; j < t->count; j++) out[j] = src[t->is_conv_or_linear_weight ? model_weight_index(m, l, j) : j];
}

void model_tensor_put(const Model *m, const ModelTensor *t, const float *in, float *params, float *bn_stats) {
    float *dst = (t->in_bn_stats ? bn_stats : params) + t->offset;
    const Layer *l = &m->layers[t->layer];
    for (size_t j = 0; j < t->count; j++) dst[t->is_conv_or_linear_weight ? model_weight_index(m, l, j) : j] = in[j];
}
