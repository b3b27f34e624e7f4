#include "tools/trainer/summary.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers.h"
#include "models/tensors.h"
#include "runtime/check.h"
#include "runtime/json_out.h"
#include "tools/trainer/settings.h"

/* "1,234,567" */
static const char *grouped(double v, char *buf, size_t n) {
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", v);
    size_t len = strlen(digits), k = 0;
    for (size_t i = 0; i < len && k + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[k++] = ',';
        buf[k++] = digits[i];
    }
    buf[k] = '\0';
    return buf;
}

void summary_print(const Model *m, const char *title, FILE *f) {
    const Activation *in = &m->acts[0];
    char p[32], fl[32], shape[32];
    double flops = 0;
    fprintf(f, "%s: input %dx%dx%d, %d classes\n", title, in->c_real, in->h, in->w, m->num_classes);
    fprintf(f, "%-28s %-10s %-16s %14s %16s %5s\n", "layer", "kind", "output", "params", "FLOPs", "block");
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const Activation *y = &m->acts[l->out];
        double layer_flops = model_layer_flops(m, i) / m->batch;
        flops += layer_flops;
        snprintf(shape, sizeof shape, "%dx%dx%d", y->c, y->h, y->w);
        char block[16] = "";
        if (l->block >= 0) snprintf(block, sizeof block, "%d", l->block);
        fprintf(f, "%-28s %-10s %-16s %14s %16s %5s\n", l->module[0] ? l->module : l->name, layer_kinds[l->kind].name,
                shape, grouped((double)(l->w_count + l->b_count), p, sizeof p), grouped(layer_flops, fl, sizeof fl),
                block);
    }
    size_t params = model_param_count(m);
    fprintf(f, "total: %d layers, %s parameters (%.2f MiB in fp32), %s FLOPs a forward per image (%.3g G), "
            "%d checkpoint blocks\n", m->n_layers, grouped((double)params, p, sizeof p),
            (double)params * 4 / (1 << 20), grouped(flops, fl, sizeof fl), flops / 1e9, m->n_blocks);
}

/* A layer's id in the JSON: its module name, or its label ("relu 42") when it has none. */
static const char *layer_id(const Layer *l) { return l->module[0] ? l->module : l->name; }

static void add_ints(cJSON *o, const char *key, const int *v, int n) {
    cJSON *a = cJSON_AddArrayToObject(o, key);
    if (!a) TC_FATAL("out of host memory building JSON");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
}

/* The kind's arguments as the net file gives them, resolved (a pool's window, depthwise's groups). */
static void add_layer_args(cJSON *o, const Model *m, const Layer *l) {
    if (l->kind == LAYER_CONV) {
        const Conv2dShape *c = &l->conv.shape;
        json_add_int(o, "out_channels", c->k);
        json_add_int(o, "kernel", c->r);
        json_add_int(o, "stride", c->stride);
        json_add_int(o, "pad", c->pad);
        json_add_int(o, "groups", conv2d_groups(c));
        json_add_bool(o, "bias", l->b_count > 0);
        json_add_bool(o, "whiten", l->whitening);
        json_add_bool(o, "dirac", l->dirac);
    } else if (l->kind == LAYER_LINEAR) {
        json_add_int(o, "in_features", l->linear.in);
        json_add_int(o, "out_features", l->linear.out);
        json_add_bool(o, "bias", l->b_count > 0);
    } else if ((l->kind == LAYER_MAXPOOL || l->kind == LAYER_AVGPOOL) && l->pool.shape.n) {
        json_add_int(o, "kernel", pool2d_window(&l->pool.shape));
        json_add_int(o, "stride", pool2d_stride(&l->pool.shape));
        json_add_int(o, "pad", l->pool.shape.pad);
    } else if (l->kind == LAYER_AVGPOOL) {
        json_add_bool(o, "global", 1);
    } else if (l->kind == LAYER_SCALE) {
        json_add_number(o, "factor", l->scale, 9);
    } else if (l->kind == LAYER_DROPOUT) {
        json_add_number(o, "p", l->drop, 9);
    }
    (void)m;
}

void summary_print_json(const Model *m, const char *title, const TrainSettings *s, FILE *f) {
    int producer[MODEL_MAX_ACTS]; /* the layer that writes each activation; -1: the input */
    for (int a = 0; a < m->n_acts; a++) producer[a] = -1;
    for (int i = 0; i < m->n_layers; i++) producer[m->layers[i].out] = i;
    cJSON *o = json_object_new();
    json_add_string(o, "net", title);
    const Activation *in = &m->acts[0];
    add_ints(o, "input", (const int[3]){in->c_real, in->h, in->w}, 3);
    json_add_int(o, "classes", m->num_classes);
    json_add_int(o, "params", (long long)model_param_count(m));
    json_add_number(o, "bn_eps", s->model.bn_eps, 7);
    json_add_number(o, "bn_momentum", s->model.bn_momentum, 7);
    json_add_bool(o, "bn_weight_fixed", s->model.bn_weight_fixed);
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int i = 0; layers && i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        cJSON *item = cJSON_CreateObject();
        if (!item) TC_FATAL("out of host memory building JSON");
        cJSON_AddItemToArray(layers, item);
        json_add_string(item, "id", layer_id(l));
        json_add_string(item, "module", l->module);
        json_add_string(item, "kind", layer_kinds[l->kind].name);
        cJSON *ins = cJSON_AddArrayToObject(item, "inputs");
        int ids[2] = {l->in, l->in2};
        for (int k = 0; ins && k < 2; k++)
            if (ids[k] >= 0 && !(k == 1 && (l->kind != LAYER_ADD && l->kind != LAYER_CONCAT)))
                cJSON_AddItemToArray(ins, cJSON_CreateString(producer[ids[k]] < 0 ? "input"
                                                             : layer_id(&m->layers[producer[ids[k]]])));
        const Activation *y = &m->acts[l->out];
        add_ints(item, "output", (const int[3]){y->c, y->h, y->w}, 3);
        json_add_int(item, "params", (long long)(l->w_count + l->b_count));
        json_add_int(item, "block", l->block);
        add_layer_args(item, m, l);
    }
    enum { MAX_TENSORS = 4 * MODEL_MAX_LAYERS };
    ModelTensor *ts = malloc(MAX_TENSORS * sizeof *ts);
    char err[256];
    if (!ts) TC_FATAL("out of host memory: the tensor list");
    int n = model_tensors(m, ts, MAX_TENSORS, err, sizeof err);
    if (n < 0) TC_FATAL("%s", err);
    cJSON *tensors = cJSON_AddArrayToObject(o, "tensors");
    for (int i = 0; tensors && i < n && i < MAX_TENSORS; i++) {
        cJSON *t = cJSON_CreateObject();
        if (!t) TC_FATAL("out of host memory building JSON");
        cJSON_AddItemToArray(tensors, t);
        json_add_string(t, "name", ts[i].name);
        add_ints(t, "shape", ts[i].shape, ts[i].ndim);
    }
    free(ts);
    if (json_write_line(f, o) != 0) TC_FATAL("summary: writing the JSON: %s", strerror(errno));
}

int summary_main(const Config *cfg, int json) {
    TrainSettings s;
    settings_fill(cfg, &s);
    if (s.model.net_and_name) settings_fail(&s, "model.net", "and model.name both name the net: set one of them");
    if (!s.model.num_classes) s.model.num_classes = 10;
    Model *m = calloc(1, sizeof *m);
    if (!m) TC_FATAL("out of host memory: a model");
    char err[4600];
    if (settings_build_net(&s, m, 1, 0, NULL, err, sizeof err) != 0)
        settings_fail(&s, s.model.net ? "model.net" : "model.name", "%s", err);
    char title[4200];
    snprintf(title, sizeof title, "%s%s%s", s.model.name, s.model.net ? " from " : "", s.model.net ? s.model.net : "");
    if (json) summary_print_json(m, title, &s, stdout);
    else summary_print(m, title, stdout);
    free(m);
    return 0;
}
