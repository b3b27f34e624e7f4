#include "models/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers.h"
#include "ops/cast.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

/* ---- building ---------------------------------------------------------- */

void model_init(Model *m, int batch, int num_classes, int nhwc) {
    memset(m, 0, sizeof *m);
    m->nhwc = nhwc;
    m->open_block = -1;
    m->batch = batch;
    m->num_classes = num_classes;
    m->conv_policy.workspace_limit = (size_t)256 << 20;
    m->training = 1;
    m->bn_momentum = 0.1f;
    m->bn_eps = 1e-5f;
    m->bn_bias_lr_scale = 1.0f;
    m->head_lr_scale = 1.0f;
}

/* A net the builders cannot make (a shape that does not fit, too many layers): with m->build_err set (a net
 * file's reader, models/netfile.c) the message goes there and the builder returns -1; else the program
 * stops, naming the layer. */
static int build_fail(Model *m, int layer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int build_fail(Model *m, int layer, const char *fmt, ...) {
    char what[sizeof m->build_err_text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!m->build_err) TC_FATAL("layer %d: %s", layer, what);
    if (!m->build_err_text[0]) memcpy(m->build_err_text, what, sizeof what);
    return -1;
}

static int add_act(Model *m, int c, int h, int w) {
    if (m->n_acts >= MODEL_MAX_ACTS) TC_FATAL("model has more than %d activations", MODEL_MAX_ACTS);
    Activation *a = &m->acts[m->n_acts];
    a->c = c; a->h = h; a->w = w;
    a->c_real = c;
    a->shares_with = -1;
    a->grad_slot = -1;
    a->internal_to = m->open_block;
    return m->n_acts++;
}

/* NULL (build_fail) past MODEL_MAX_LAYERS. */
static Layer *add_layer(Model *m, LayerKind kind, int in) {
    if (m->n_layers >= MODEL_MAX_LAYERS) {
        build_fail(m, m->n_layers, "more than %d layers", MODEL_MAX_LAYERS);
        return NULL;
    }
    if (in < 0 || in >= m->n_acts) TC_FATAL("layer %d reads activation %d, which does not exist", m->n_layers, in);
    Layer *l = &m->layers[m->n_layers++];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->in = in;
    l->in2 = -1;
    l->bias_layer = -1;
    l->pool_layer = -1;
    l->add_layer = -1;
    l->prologue_bn = -1;
    l->dbn_layer = -1;
    l->block = m->open_block;
    snprintf(l->name, sizeof l->name, "%s %d", layer_kinds[kind].name, m->n_layers - 1);
    return l;
}

/* The gaps hold zeros that nothing reads. */
size_t model_param_align(size_t n) { return (n + MODEL_PARAM_ALIGN - 1) / MODEL_PARAM_ALIGN * MODEL_PARAM_ALIGN; }

static void add_params(Model *m, Layer *l, size_t w_count, size_t b_count, size_t fan_in) {
    l->w_off = model_param_align(m->n_params);
    l->w_count = w_count;
    l->b_off = b_count ? model_param_align(l->w_off + w_count) : l->w_off + w_count;
    l->b_count = b_count;
    l->fan_in = fan_in;
    m->n_params = l->b_off + b_count;
}

size_t model_param_count(const Model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_layers; i++) n += m->layers[i].w_count + m->layers[i].b_count;
    return n;
}

size_t model_packed_offset(const Model *m, size_t offset) {
    size_t packed = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (offset >= l->w_off && offset < l->w_off + l->w_count) return packed + (offset - l->w_off);
        packed += l->w_count;
        if (offset >= l->b_off && offset < l->b_off + l->b_count) return packed + (offset - l->b_off);
        packed += l->b_count;
    }
    return (size_t)-1;
}

void model_unpack_params(const Model *m, const float *packed, float *params) {
    memset(params, 0, m->n_params * sizeof(float));
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        memcpy(params + l->w_off, packed, l->w_count * sizeof(float));
        packed += l->w_count;
        memcpy(params + l->b_off, packed, l->b_count * sizeof(float));
        packed += l->b_count;
    }
}

void model_name_last(Model *m, const char *fmt, ...) {
    if (m->n_layers == 0) TC_FATAL("model_name_last before any layer");
    Layer *l = &m->layers[m->n_layers - 1];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->module, sizeof l->module, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof l->module) TC_FATAL("layer %d: module name longer than %zu bytes",
                                                         m->n_layers - 1, sizeof l->module - 1);
}

void model_block_begin(Model *m) {
    if (m->open_block >= 0) TC_FATAL("model_block_begin inside block %d", m->open_block);
    m->open_block = m->n_blocks++;
}

void model_block_end(Model *m) {
    if (m->open_block < 0) TC_FATAL("model_block_end without model_block_begin");
    if (m->n_layers == 0 || m->layers[m->n_layers - 1].block != m->open_block)
        TC_FATAL("block %d has no layers", m->open_block);
    /* The block's output is kept, and so is the storage it shares (a ReLU's input). */
    for (int id = m->n_acts - 1; id >= 0; id = m->acts[id].shares_with) m->acts[id].internal_to = -1;
    m->open_block = -1;
}

int model_input(Model *m, int c, int h, int w) {
    if (m->n_acts != 0) TC_FATAL("model_input must be the first activation");
    /* Tensor-core convolutions want channels in multiples of 8. */
    int id = add_act(m, m->nhwc ? (c + 7) / 8 * 8 : c, h, w);
    m->acts[id].c_real = c;
    return id;
}

/* Grouped, PyTorch's fan_in: (in / groups) * k * k. Groups split channels that carry data alike, so a
 * grouped convolution may not read channels padded for the tensor cores (the NHWC input's). */
int model_conv_groups(Model *m, int in, int out_channels, int kernel, int pad, int stride, int groups, int bias) {
    Layer *l = add_layer(m, LAYER_CONV, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    if (kernel < 1 || pad < 0 || stride < 1 || out_channels < 1)
        return build_fail(m, m->n_layers - 1, "a convolution of %d channels, kernel %d, pad %d, stride %d: each "
                          "must be at least 1 (pad 0)", out_channels, kernel, pad, stride);
    if (groups < 1 || x->c % groups || out_channels % groups || (groups > 1 && x->c != x->c_real))
        return build_fail(m, m->n_layers - 1, "a convolution of %d%s input channels to %d in %d groups (both must "
                          "be multiples of the groups, and grouped the input's channels unpadded)", x->c_real,
                          x->c != x->c_real ? " (padded)" : "", out_channels, groups);
    Conv2dShape s = {m->batch, x->c, x->h, x->w, out_channels, kernel, kernel, pad, stride, groups};
    int oh = conv2d_out_h(&s), ow = conv2d_out_w(&s);
    if (oh <= 0 || ow <= 0)
        return build_fail(m, m->n_layers - 1, "a %dx%d convolution (pad %d) does not fit a %dx%d input", kernel,
                          kernel, pad, x->h, x->w);
    l->conv.shape = s;
    add_params(m, l, conv2d_filter_count(&s), bias ? (size_t)out_channels : 0,
               (size_t)x->c_real / groups * kernel * kernel);
    return l->out = add_act(m, out_channels, oh, ow);
}

int model_conv(Model *m, int in, int out_channels, int kernel, int pad, int stride) {
    return model_conv_groups(m, in, out_channels, kernel, pad, stride, 1, 1);
}

/* A convolution followed by batch norm needs no bias: the norm's beta is one. */
int model_conv_no_bias(Model *m, int in, int out_channels, int kernel, int pad, int stride) {
    return model_conv_groups(m, in, out_channels, kernel, pad, stride, 1, 0);
}

int model_batchnorm(Model *m, int in) {
    Layer *l = add_layer(m, LAYER_BATCHNORM, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    l->bn.shape = (BatchNormShape){m->batch, x->c, x->h, x->w};
    l->stat_off = m->n_bn_stats;
    m->n_bn_stats += 2 * (size_t)x->c;
    add_params(m, l, (size_t)x->c, (size_t)x->c, 1);
    return l->out = add_act(m, x->c, x->h, x->w);
}

int model_add(Model *m, int a, int b) {
    Layer *l = add_layer(m, LAYER_ADD, a);
    if (!l) return -1;
    if (b < 0 || b >= m->n_acts || b == a) return build_fail(m, m->n_layers - 1, "add needs two distinct inputs");
    const Activation *x = &m->acts[a], *y = &m->acts[b];
    if (x->c != y->c || x->h != y->h || x->w != y->w)
        return build_fail(m, m->n_layers - 1, "add of %dx%dx%d and %dx%dx%d (channels x height x width): the shapes "
                          "differ", x->c, x->h, x->w, y->c, y->h, y->w);
    l->in2 = b;
    return l->out = add_act(m, x->c, x->h, x->w);
}

int model_avgpool(Model *m, int in) {
    Layer *l = add_layer(m, LAYER_AVGPOOL, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    return l->out = add_act(m, x->c, 1, 1);
}

int model_relu(Model *m, int in) {
    Layer *l = add_layer(m, LAYER_RELU, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    l->out = add_act(m, x->c, x->h, x->w);
    /* ReLU's backward needs only its output, so it can overwrite its input. */
    m->acts[l->out].shares_with = in;
    return l->out;
}

/* GELU's backward reads its input, which therefore stays as it is: a ReLU
 * works in place only on an activation no other layer reads (plan_accumulation). */
int model_gelu(Model *m, int in) {
    Layer *l = add_layer(m, LAYER_GELU, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    return l->out = add_act(m, x->c, x->h, x->w);
}

int model_maxpool(Model *m, int in, int kernel, int stride, int pad) {
    Layer *l = add_layer(m, LAYER_MAXPOOL, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    const Pool2dShape *s = &l->pool.shape;
    /* An odd size drops the last row and column (PyTorch's floor mode). */
    l->pool.shape = (Pool2dShape){m->batch, x->c, x->h, x->w, kernel, stride, pad};
    if (kernel < 1 || stride < 1 || pad < 0 || 2 * pad > kernel || pool2d_out_h(s) < 1 || pool2d_out_w(s) < 1)
        return build_fail(m, m->n_layers - 1, "a %dx%d max-pool (stride %d, pad %d: at most half the window) does "
                          "not fit a %dx%d input", kernel, kernel, stride, pad, x->h, x->w);
    return l->out = add_act(m, x->c, pool2d_out_h(s), pool2d_out_w(s));
}

int model_maxpool2(Model *m, int in) { return model_maxpool(m, in, 2, 2, 0); }

int model_global_maxpool(Model *m, int in) {
    const Activation *x = &m->acts[in];
    if (x->h != x->w) return build_fail(m, m->n_layers, "a global max-pool needs a square map, got %dx%d", x->h, x->w);
    return model_maxpool(m, in, x->h, x->h, 0);
}

static int add_linear(Model *m, int in, int out_features, int bias) {
    Layer *l = add_layer(m, LAYER_LINEAR, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    int in_features = x->c * x->h * x->w; /* NCHW flattens to [n][c*h*w] for free */
    if (out_features < 1) return build_fail(m, m->n_layers - 1, "a linear layer of %d outputs", out_features);
    l->linear = (LinearShape){m->batch, in_features, out_features};
    add_params(m, l, (size_t)out_features * in_features, bias ? (size_t)out_features : 0, (size_t)in_features);
    return l->out = add_act(m, out_features, 1, 1);
}

int model_linear(Model *m, int in, int out_features) { return add_linear(m, in, out_features, 1); }
int model_linear_no_bias(Model *m, int in, int out_features) { return add_linear(m, in, out_features, 0); }

int model_mark_whitening(Model *m) {
    Layer *l = m->n_layers ? &m->layers[m->n_layers - 1] : NULL;
    if (!l || l->kind != LAYER_CONV || l->in != 0 || conv2d_groups(&l->conv.shape) > 1)
        return build_fail(m, m->n_layers - 1, "a whitening layer is an ungrouped convolution over the input image");
    l->whitening = 1;
    return 0;
}

void model_set_frozen_prefix(Model *m, int layers) {
    if (layers < 0 || layers > m->n_layers)
        TC_FATAL("model_set_frozen_prefix: %d layers of a %d-layer model", layers, m->n_layers);
    m->frozen_layers = layers;
    m->first_grad_act = 1;
    for (int i = 0; i < layers; i++)
        if (m->layers[i].out + 1 > m->first_grad_act) m->first_grad_act = m->layers[i].out + 1;
}

int model_dirac_last(Model *m) {
    Layer *l = m->n_layers ? &m->layers[m->n_layers - 1] : NULL;
    if (!l || l->kind != LAYER_CONV || l->conv.shape.r != l->conv.shape.s || l->conv.shape.r % 2 == 0 ||
        conv2d_groups(&l->conv.shape) > 1)
        return build_fail(m, m->n_layers - 1, "a Dirac start needs an ungrouped convolution with an odd square "
                          "kernel");
    l->dirac = 1;
    return 0;
}

int model_scale(Model *m, int in, float factor) {
    Layer *l = add_layer(m, LAYER_SCALE, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    l->scale = factor;
    return l->out = add_act(m, x->c, x->h, x->w);
}

/* SiLU's backward reads its input, as GELU's does. */
int model_silu(Model *m, int in) {
    Layer *l = add_layer(m, LAYER_SILU, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    return l->out = add_act(m, x->c, x->h, x->w);
}

/* Dropout's output has its own storage: evaluation copies x there, and backward reads neither. */
int model_dropout(Model *m, int in, float p) {
    Layer *l = add_layer(m, LAYER_DROPOUT, in);
    if (!l) return -1;
    if (!(p >= 0.0f && p < 1.0f)) return build_fail(m, m->n_layers - 1, "dropout p = %g, not in [0, 1)", p);
    const Activation *x = &m->acts[in];
    l->drop = p;
    return l->out = add_act(m, x->c, x->h, x->w);
}

int model_concat(Model *m, int a, int b) {
    Layer *l = add_layer(m, LAYER_CONCAT, a);
    if (!l) return -1;
    if (b < 0 || b >= m->n_acts)
        return build_fail(m, m->n_layers - 1, "concat reads activation %d, which does not exist", b);
    const Activation *x = &m->acts[a], *y = &m->acts[b];
    if (x->h != y->h || x->w != y->w)
        return build_fail(m, m->n_layers - 1, "concat of %dx%dx%d and %dx%dx%d (channels x height x width): the "
                          "height and width differ", x->c, x->h, x->w, y->c, y->h, y->w);
    if (m->nhwc && (x->c != x->c_real || y->c != y->c_real))
        return build_fail(m, m->n_layers - 1, "concat of the input image under NHWC, whose channels are padded");
    l->in2 = b;
    return l->out = add_act(m, x->c + y->c, x->h, x->w);
}

int model_concat_list(Model *m, const int *ids, int count) {
    if (count < 2) return build_fail(m, m->n_layers, "a concat needs at least two inputs, got %d", count);
    int y = model_concat(m, ids[0], ids[1]);
    for (int i = 2; i < count && y >= 0; i++) y = model_concat(m, y, ids[i]);
    return y;
}

int model_flatten(Model *m, int in) {
    Layer *l = add_layer(m, LAYER_FLATTEN, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    if (x->c != x->c_real)
        return build_fail(m, m->n_layers - 1, "a flatten of the input image under NHWC, whose channels are padded");
    l->out = add_act(m, x->c * x->h * x->w, 1, 1);
    m->acts[l->out].shares_with = in;
    return l->out;
}

int model_avgpool2d(Model *m, int in, int kernel, int stride, int pad) {
    Layer *l = add_layer(m, LAYER_AVGPOOL, in);
    if (!l) return -1;
    const Activation *x = &m->acts[in];
    Pool2dShape *s = &l->pool.shape;
    *s = (Pool2dShape){m->batch, x->c, x->h, x->w, kernel, stride, pad};
    if (kernel < 1 || stride < 1 || pad < 0 || 2 * pad > kernel || pool2d_out_h(s) < 1 || pool2d_out_w(s) < 1)
        return build_fail(m, m->n_layers - 1, "a %dx%d average pool (stride %d, pad %d: at most half the window) "
                          "does not fit a %dx%d input", kernel, kernel, stride, pad, x->h, x->w);
    return l->out = add_act(m, x->c, pool2d_out_h(s), pool2d_out_w(s));
}

int model_global_avgpool(Model *m, int in) { return model_avgpool(m, in); }

/* ---- gradient buffers ----------------------------------------------------- */

static int group_of(int *parent, int a) {
    while (parent[a] != a) a = parent[a] = parent[parent[a]];
    return a;
}

static void join_groups(int *parent, int a, int b) { parent[group_of(parent, a)] = group_of(parent, b); }

/* An activation that feeds several layers gets the sum of their gradients:
 * backward meets its consumers latest first; the first writes the gradient,
 * the others add to it. Only the input image (activation 0) needs none. */
static void plan_accumulation(Model *m) {
    layers_check_flattens(m, m->nhwc);
    int written[MODEL_MAX_ACTS] = {0};
    for (int a = 0; a < m->n_acts; a++) m->acts[a].consumers = 0;
    for (int i = 0; i < m->n_layers; i++) {
        m->acts[m->layers[i].in].consumers++;
        if (m->layers[i].in2 >= 0) m->acts[m->layers[i].in2].consumers++;
    }
    for (int i = m->n_layers - 1; i >= 0; i--) {
        Layer *l = &m->layers[i];
        int ins[2] = {l->in, l->in2};
        for (int k = 0; k < 2; k++) {
            l->dx_accumulate[k] = l->dx_alias[k] = 0;
            if (ins[k] <= 0) continue;
            l->dx_accumulate[k] = written[ins[k]];
            written[ins[k]] = 1;
            if (l->dx_accumulate[k] && !layer_kinds[l->kind].adds_dx)
                TC_FATAL("layer %d: its input feeds several layers, and this kind of layer cannot add its "
                         "gradient to theirs", i);
        }
        /* ... nor may what it shares its storage with (a flatten's input) */
        for (int id = l->in; l->kind == LAYER_RELU && id >= 0; id = m->acts[id].shares_with)
            if (m->acts[id].consumers > 1)
                TC_FATAL("layer %d: a ReLU works in place, so its input may feed no other layer", i);
    }
}

/* Under NHWC a flatten's features lie in (h, w, c) order: only a linear layer (model_weight_index), or an
 * in-place ReLU before one, reads them as such. */
static void check_hwc_readers(const Model *m, int act, int flatten) {
    const Activation *x = &m->acts[m->layers[flatten].in];
    for (int j = flatten + 1; j < m->n_layers; j++) {
        const Layer *r = &m->layers[j];
        if (r->in != act && r->in2 != act) continue;
        if (r->kind == LAYER_RELU) check_hwc_readers(m, r->out, flatten);
        else if (r->kind != LAYER_LINEAR)
            TC_FATAL("layer %d (%s) reads the flatten (layer %d) of a %dx%d map under NHWC, whose features lie in "
                     "(h, w, c) order: only linear layers may (or model.layout = nchw)", j, r->name, flatten, x->h,
                     x->w);
    }
}

void layers_check_flattens(const Model *m, int nhwc) {
    for (int i = 0; nhwc && i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind == LAYER_FLATTEN && m->acts[l->in].h * m->acts[l->in].w > 1) check_hwc_readers(m, l->out, i);
    }
}

/* The last layer reading activation a, and its producer. */
static int last_consumer_other_than(const Model *m, int a, int skip) {
    for (int i = m->n_layers - 1; i >= 0; i--)
        if (i != skip && (m->layers[i].in == a || m->layers[i].in2 == a)) return i;
    return -1;
}

static int producer(const Model *m, int a) {
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].out == a) return i;
    return -1;
}

/* An add's backward passes dy on unchanged, so an input whose gradient the add
 * writes first can use dy's buffer itself. Of the two, only one may feed
 * other layers too (they add into that buffer afterwards), and only once the
 * other input's producer has read its gradient from it. */
static void plan_add_aliases(Model *m, int i, int *parent) {
    Layer *l = &m->layers[i];
    int ins[2] = {l->in, l->in2};
    int shared = -1; /* the aliased input that feeds other layers */
    for (int k = 0; k < 2; k++) {
        if (ins[k] <= 0 || l->dx_accumulate[k]) continue;
        int fan_out = m->acts[ins[k]].consumers > 1;
        if (fan_out && shared >= 0) continue;
        if (fan_out) {
            int other = ins[1 - k], later = last_consumer_other_than(m, ins[k], i);
            if (other > 0 && !l->dx_accumulate[1 - k] && producer(m, other) < later) continue;
            shared = k;
        }
        l->dx_alias[k] = 1;
        join_groups(parent, ins[k], l->out);
    }
}

/* Backward time of layer i: the last layer runs first. The loss writes the
 * logits' gradient before (time -1). */
static void touch(int *first, int *last, int group, int time) {
    if (time < first[group]) first[group] = time;
    if (time > last[group]) last[group] = time;
}

/* perf.overlap_wgrad: the backward time before which conv i's filter
 * gradient is joined back (the next layer that joins it, or the end). */
static int wgrad_join_time(const Model *m, int i) {
    for (int j = i - 1; j >= 0; j--)
        if (layer_joins_wgrad(&m->layers[j])) return m->n_layers - 1 - j;
    return m->n_layers;
}

/* Every activation's gradient gets one of a few shared buffers: gradients
 * joined in place (a ReLU's, a GELU's done by its batch norm, an add's
 * passed-on dy) form one group, and two
 * groups share a buffer when the backward times that touch them do not
 * overlap. Each buffer is sized for the largest gradient it holds; a group
 * whose gradient overwrites its own value (grad_in_value) takes none. Needs
 * plan_accumulation and mark_fusions first. */
static void plan_grad_slots(Model *m) {
    int parent[MODEL_MAX_ACTS], first[MODEL_MAX_ACTS], last[MODEL_MAX_ACTS], slot_of[MODEL_MAX_ACTS];
    for (int a = 0; a < m->n_acts; a++) {
        parent[a] = a;
        first[a] = INT32_MAX;
        last[a] = INT32_MIN;
        slot_of[a] = -1;
    }
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if ((l->kind == LAYER_RELU || (l->kind == LAYER_GELU && l->fused)) && l->in > 0)
            join_groups(parent, l->in, l->out);
        if (l->kind == LAYER_FLATTEN && l->in > 0 && m->acts[l->in].consumers == 1) /* its backward: nothing */
            join_groups(parent, l->in, l->out);
        if (l->kind == LAYER_ADD) plan_add_aliases(m, i, parent);
        /* A norm whose backward the conv after it may run (dx made over dz, in place); apart, it runs in place. */
        if (m->fuse_graphs && graph_fusion_dbn_conv(m, i) >= 0) join_groups(parent, l->in, l->out);
    }
    touch(first, last, group_of(parent, m->n_acts - 1), -1);
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        int time = m->n_layers - 1 - i;
        touch(first, last, group_of(parent, l->out), time);
        if (l->in > 0) touch(first, last, group_of(parent, l->in), time);
        if (l->in2 > 0) touch(first, last, group_of(parent, l->in2), time);
    }
    for (int i = 0; m->overlap_wgrad && i < m->n_layers; i++) { /* a forked filter gradient reads dy until its join */
        const Layer *l = &m->layers[i];
        if (l->kind == LAYER_CONV) touch(first, last, group_of(parent, l->out), wgrad_join_time(m, i));
    }
    size_t need[MODEL_MAX_ACTS] = {0};
    int in_value[MODEL_MAX_ACTS] = {0};
    for (int a = 1; a < m->n_acts; a++) {
        int g = group_of(parent, a);
        if (act_floats(m, a) > need[g]) need[g] = act_floats(m, a);
        if (m->acts[a].grad_in_value) in_value[g] = 1;
    }
    /* Groups in order of their first touch; each takes the free buffer closest
     * above its size (else the largest free one, which grows), or a new one. */
    int slot_free_after[MODEL_MAX_GRAD_SLOTS];
    m->n_grad_slots = 0;
    for (int time = -1; time < m->n_layers; time++) {
        for (int g = 1; g < m->n_acts; g++) {
            if (group_of(parent, g) != g || first[g] != time || in_value[g]) continue;
            int best = -1;
            for (int s = 0; s < m->n_grad_slots; s++) {
                if (slot_free_after[s] >= time) continue;
                size_t have = m->act_grad_floats[s], best_have = best >= 0 ? m->act_grad_floats[best] : 0;
                int fits = have >= need[g], best_fits = best >= 0 && best_have >= need[g];
                if (best < 0 || (fits && (!best_fits || have < best_have)) || (!fits && !best_fits && have > best_have))
                    best = s;
            }
            if (best < 0) {
                if (m->n_grad_slots == MODEL_MAX_GRAD_SLOTS)
                    TC_FATAL("model needs more than %d activation-gradient buffers", MODEL_MAX_GRAD_SLOTS);
                best = m->n_grad_slots++;
                m->act_grad_floats[best] = 0;
            }
            if (need[g] > m->act_grad_floats[best]) m->act_grad_floats[best] = need[g];
            slot_free_after[best] = last[g];
            slot_of[g] = best;
        }
    }
    m->acts[0].grad_slot = -1;
    for (int a = 1; a < m->n_acts; a++) m->acts[a].grad_slot = slot_of[group_of(parent, a)];
}

/* A batch norm's pass, or a whitening convolution's (ops/conv_bias_gelu),
 * writes the GELU after it over the layer's own output: the GELU's output
 * shares that storage and (plan_grad_slots) gradient, as an in-place ReLU's
 * does, and is kept where either is a block's output. */
static void fuse_gelu(Model *m, Layer *l, Layer *gelu) {
    Activation *out = &m->acts[gelu->out];
    l->fused = gelu->fused = 1;
    l->fused_act = BN_ACT_GELU;
    out->shares_with = l->out;
    if (out->internal_to < 0) m->acts[l->out].internal_to = -1;
}

/* The whitening convolution's backward is its bias's alone, which the fused op computes. */
static int takes_gelu(const Layer *l) {
    return l->kind == LAYER_BATCHNORM || (l->kind == LAYER_CONV && l->whitening && l->b_count);
}

/* A batch norm with no activation of its own whose output only the add right
 * after it reads computes that add, and the add's fused ReLU, in its apply
 * pass (BatchNormParams.residual): the norm's output is never stored and read
 * back. The add's output takes the norm's storage, kept where the add's was
 * (a block's output). */
static void fuse_bn_adds(Model *m) {
    for (int i = 0; i + 1 < m->n_layers; i++) {
        Layer *bn = &m->layers[i], *add = &m->layers[i + 1];
        if (bn->kind != LAYER_BATCHNORM || add->kind != LAYER_ADD || bn->fused_act != BN_ACT_NONE) continue;
        if ((add->in != bn->out && add->in2 != bn->out) || m->acts[bn->out].consumers != 1) continue;
        bn->add_layer = i + 1;
        add->by_bn = 1;
        m->acts[add->out].shares_with = bn->out;
        if (m->acts[add->out].internal_to < 0) m->acts[bn->out].internal_to = -1;
    }
}

/* A conv + bias + ReLU + 2x2 max-pool reading the input image takes its ReLU
 * and pool into one op on the GPU where ops/conv_bias_relu_pool takes the
 * shape (the conv's output never stored); the log says which way it went. */
static void fuse_first_block(Model *m, Layer *conv, Layer *pool) {
    if (m->device != DEVICE_CUDA || conv->in != 0) return;
    ConvBiasReluPoolShape s = first_block_shape(m, conv);
    const char *why;
    if (!conv_bias_relu_pool_supported(&m->ops, &s, &why)) {
        log_info("%s + ReLU + %s: apart (conv_bias_relu_pool: %s)", conv->name, pool->name, why);
        return;
    }
    conv->pool_layer = (int)(pool - m->layers);
    conv->bias_by_pool = 0;
    pool->by_conv = 1;
    m->acts[conv->out].unstored = 1;
    log_info("%s + ReLU + %s: one kernel (conv_bias_relu_pool), the convolution's output never stored", conv->name,
             pool->name);
}

/* A batch norm + ReLU that only a max-pool reads runs the pool in its apply
 * pass on the GPU where ops/batchnorm takes the pool (BatchNormParams.pool):
 * the norm's output is never stored (ResNet's ImageNet stem: 411 MB written
 * and read back at 224 and batch 256). The pool's backward still writes that
 * output's gradient, which the norm's backward reads. */
static void fuse_bn_pools(Model *m) {
    for (int i = 0; m->device == DEVICE_CUDA && i + 2 < m->n_layers; i++) {
        Layer *bn = &m->layers[i], *relu = &m->layers[i + 1], *pool = &m->layers[i + 2];
        if (bn->kind != LAYER_BATCHNORM || bn->fused_act != BN_ACT_RELU || relu->kind != LAYER_RELU ||
            relu->in != bn->out || pool->kind != LAYER_MAXPOOL || pool->in != relu->out ||
            m->acts[relu->out].consumers != 1)
            continue;
        if (!batchnorm_pool_supported(&m->ops, &pool->pool.shape)) {
            log_info("%s + ReLU + %s: apart (the pool's channels-last kernels do not take it)", bn->name,
                     pool->name);
            continue;
        }
        bn->pool_layer = i + 2;
        pool->by_bn = 1;
        m->acts[bn->out].unstored = m->acts[relu->out].unstored = 1;
        log_info("%s + ReLU + %s: one pass (the norm's output never stored)", bn->name, pool->name);
    }
}

/* A ReLU right after a convolution with a bias, a batch norm or an add, or a
 * GELU right after a batch norm or a whitening convolution, reading nothing
 * else, folds into it; a conv +
 * bias + ReLU that only a 2x2 max-pool reads folds its bias and ReLU into the
 * pool instead (bias_relu_pool), whose backward overwrites the conv's raw
 * output with its gradient. Then fuse_bn_adds and fuse_bn_pools. Needs plan_accumulation's
 * consumer counts. */
static void mark_fusions(Model *m) {
    for (int i = 0; i + 1 < m->n_layers; i++) {
        Layer *l = &m->layers[i], *relu = &m->layers[i + 1];
        if (relu->in != l->out || m->acts[l->out].consumers != 1) continue;
        if (takes_gelu(l) && relu->kind == LAYER_GELU) fuse_gelu(m, l, relu);
        if (relu->kind != LAYER_RELU) continue;
        if (l->kind == LAYER_BATCHNORM) l->fused_act = BN_ACT_RELU;
        if (l->kind == LAYER_BATCHNORM || l->kind == LAYER_ADD) l->fused = relu->fused = 1;
        if (l->kind != LAYER_CONV || !l->b_count) continue;
        Layer *conv = l, *pool = i + 2 < m->n_layers ? &m->layers[i + 2] : NULL;
        if (pool && pool->kind == LAYER_MAXPOOL && pool->in == relu->out && m->acts[relu->out].consumers == 1 &&
            pool2d_window(&pool->pool.shape) == 2 && pool2d_stride(&pool->pool.shape) == 2 && !pool->pool.shape.pad &&
            pool->pool.shape.h % 2 == 0 && pool->pool.shape.w % 2 == 0) {
            conv->fused = relu->fused = pool->fused = conv->bias_by_pool = 1;
            pool->bias_layer = i;
            m->acts[conv->out].grad_in_value = m->acts[relu->out].grad_in_value = 1;
            fuse_first_block(m, conv, pool);
        } else if (m->device == DEVICE_CUDA) { /* conv + bias + ReLU alone has no CPU path */
            conv->fused = relu->fused = 1;
        }
    }
    fuse_bn_adds(m);
    fuse_bn_pools(m);
}

/* ---- finalizing ------------------------------------------------------- */

/* GPU: the cuDNN descriptors and algorithms of the convolutions, and the
 * sizes of the workspace and scratch the layers share. */
static void choose_conv_algorithms(Model *m) {
    const OpContext *ctx = &m->ops;
    m->workspace_bytes = 0;
    for (int i = 0; i < m->n_layers; i++) {
        Layer *l = &m->layers[i];
        if (l->kind == LAYER_CONV && l->pool_layer >= 0) {
            ConvBiasReluPoolShape s = first_block_shape(m, l);
            size_t bytes = conv_bias_relu_pool_workspace_bytes(ctx, &s);
            if (bytes > m->workspace_bytes) m->workspace_bytes = bytes;
            log_info("layer %d conv %dx%dx%dx%d k%d: conv_bias_relu_pool, workspace %.1f MiB", i, s.conv.n, s.conv.c,
                     s.conv.h, s.conv.w, s.conv.k, bytes / 1048576.0);
        } else if (l->kind == LAYER_CONV) {
            const Conv2dShape *s = &l->conv.shape;
            conv2d_init(ctx, &l->conv, s, &m->conv_policy);
            size_t bytes = conv2d_workspace_bytes(ctx, &l->conv);
            if (bytes > m->workspace_bytes) m->workspace_bytes = bytes;
            char chosen[400];
            conv2d_describe(ctx, &l->conv, chosen, sizeof chosen);
            log_info("layer %d conv %dx%dx%dx%d k%d: %s, workspace %.1f MiB", i, s->n, s->c, s->h, s->w, s->k, chosen,
                     bytes / 1048576.0);
            ConvBiasGeluShape whitening = whitening_shape(m, l);
            size_t bias_grad = l->fused_act == BN_ACT_GELU ? conv_bias_gelu_workspace_bytes(ctx, &whitening)
                                                           : conv2d_bias_grad_bytes(ctx, &l->conv);
            if ((l->fused || l->whitening) && bias_grad > m->workspace_bytes) m->workspace_bytes = bias_grad;
        } else if (l->kind == LAYER_BATCHNORM) {
            size_t scratch = batchnorm_scratch_bytes(ctx, &l->bn.shape);
            if (scratch > m->bn_scratch_bytes) m->bn_scratch_bytes = scratch;
        }
    }
}

static int recomputed(const Model *m, int id) {
    return m->checkpoint && m->acts[id].internal_to >= 0 && m->acts[id].shares_with < 0 && !m->acts[id].unstored;
}

/* Under checkpointing the insides of all blocks take turns in one region, laid
 * out block by block; returns its size in floats. */
static size_t plan_recompute_region(Model *m) {
    size_t region = 0;
    for (int b = 0; b < m->n_blocks; b++) {
        size_t offset = 0;
        for (int id = 0; id < m->n_acts; id++) {
            if (m->acts[id].internal_to != b || !recomputed(m, id)) continue;
            m->acts[id].region_offset = offset;
            offset += (act_floats(m, id) + 63) / 64 * 64;
        }
        if (offset > region) region = offset;
    }
    return region;
}

static int has_dropout(const Model *m) {
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == LAYER_DROPOUT) return 1;
    return 0;
}

static int needs_lr_scale(const Model *m) {
    if (m->bn_weight_fixed || m->bn_bias_lr_scale != 1.0f || m->head_lr_scale != 1.0f || m->muon) return 1;
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].whitening) return 1;
    return 0;
}

/* Runs twice: on a counting arena to size it, then on the real one. */
static void carve_buffers(Model *m, Arena *a) {
    size_t esize = dtype_size(m->act_dtype), half = m->act_dtype != DTYPE_F32;
    m->params = arena_alloc(a, m->n_params * sizeof(float), "parameters");
    m->weights = half ? arena_alloc(a, m->n_params * esize, "half-precision weights") : m->params;
    m->grads = arena_alloc(a, m->n_params * esize, "gradients");
    m->momentum = arena_alloc(a, m->n_params * sizeof(float), "momentum");
    m->second_moment = m->adam ? arena_alloc(a, m->n_params * sizeof(float), "Adam's second moment") : NULL;
    m->adam_steps = m->adam ? arena_alloc(a, sizeof(int64_t), "Adam's step count") : NULL;
    m->decay_mask = m->no_decay_bn_bias ? arena_alloc(a, m->n_params, "weight-decay mask") : NULL;
    m->lr_scale = needs_lr_scale(m) ? arena_alloc(a, m->n_params * sizeof(float), "learning-rate shares") : NULL;
    m->bn_running = m->n_bn_stats ? arena_alloc(a, m->n_bn_stats * sizeof(float), "batch-norm running statistics") : NULL;
    m->bn_saved = m->n_bn_stats ? arena_alloc(a, m->n_bn_stats * sizeof(float), "batch-norm batch statistics") : NULL;
    m->bn_sums = m->fuse_graphs && m->n_bn_stats ? arena_alloc(a, m->n_bn_stats * sizeof(float), "batch-norm sums")
                                                 : NULL;
    m->bn_coef = m->fuse_graphs && m->n_bn_stats ? arena_alloc(a, m->n_bn_stats * esize, "batch-norm prologues")
                                                 : NULL;
    m->dropout = has_dropout(m) ? arena_alloc(a, sizeof(DropoutCounter), "dropout seed and step") : NULL;
    m->input_f32 = half || m->nhwc ? arena_alloc(a, model_input_floats(m) * sizeof(float), "fp32 NCHW input batch") : NULL;
    size_t region = plan_recompute_region(m);
    m->recompute_region = region ? arena_alloc(a, region * esize, "recomputed activations") : NULL;
    for (int id = 0; id < m->n_acts; id++) {
        Activation *act = &m->acts[id];
        if (act->unstored) act->value = NULL;
        else if (act->shares_with >= 0) act->value = m->acts[act->shares_with].value;
        else if (recomputed(m, id)) act->value = element(m, m->recompute_region, act->region_offset);
        else act->value = arena_alloc(a, act_floats(m, id) * esize, "activations");
    }
    for (int s = 0; s < m->n_grad_slots; s++)
        m->act_grads[s] = arena_alloc(a, m->act_grad_floats[s] * esize, "activation gradients");
    m->workspace = m->workspace_bytes ? arena_alloc(a, m->workspace_bytes, "cuDNN workspace") : NULL;
    m->dgrad_dbn_workspace = m->dgrad_dbn_workspace_bytes
                                 ? arena_alloc(a, m->dgrad_dbn_workspace_bytes, "dgrad + batch-norm backward workspace")
                                 : NULL;
    m->bn_scratch = m->bn_scratch_bytes ? arena_alloc(a, m->bn_scratch_bytes, "batch-norm scratch") : NULL;
    for (int i = 0; i < m->n_layers; i++) { /* a fused max-pool runs bias_relu_pool instead */
        Layer *l = &m->layers[i];
        size_t bytes = l->kind == LAYER_MAXPOOL && !l->fused ? maxpool_scratch_bytes(&m->ops, &l->pool.shape) : 0;
        l->pool_scratch = bytes ? arena_alloc(a, bytes, "max-pool window positions") : NULL;
    }
    input_form_carve(m, a);
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *state, float bound) {
    double u = (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
    return (float)((2.0 * u - 1.0) * bound);
}

/* NCHW and NHWC models start from the same function: init_params draws in
 * PyTorch's order and model_weight_index places each weight. */
size_t model_weight_index(const Model *m, const Layer *l, size_t j) {
    const Activation *x = &m->acts[l->in];
    if (!m->nhwc) return j;
    if (l->kind == LAYER_LINEAR) /* a flatten's features (and an in-place ReLU's over them) lie as its input does */
        while (x->shares_with >= 0) x = &m->acts[x->shares_with];
    if (l->kind == LAYER_CONV) { /* a filter's channels: c / groups (grouped, none padded) */
        int rs = l->conv.shape.r * l->conv.shape.s, groups = conv2d_groups(&l->conv.shape), cr = x->c_real / groups;
        size_t k = j / ((size_t)cr * rs), c = j / rs % cr, pos = j % rs;
        return (k * rs + pos) * (x->c / groups) + c;
    }
    if (l->kind == LAYER_LINEAR && x->h * x->w > 1) {
        size_t in = (size_t)x->c * x->h * x->w, hw = (size_t)x->h * x->w;
        size_t row = j / in, col = j % in, c = col / hw, pos = col % hw;
        return row * in + pos * x->c + c;
    }
    return j;
}

/* Filter f < min(k, c) of a dirac convolution: 1 at the centre of its own
 * channel f, 0 elsewhere (indices in PyTorch's [k][c][r][s] order). */
static void set_dirac(const Model *m, const Layer *l, float *host) {
    const Conv2dShape *s = &l->conv.shape;
    int c = m->acts[l->in].c_real, rs = s->r * s->s, identity = s->k < c ? s->k : c;
    for (int f = 0; f < identity; f++) {
        size_t first = (size_t)f * c * rs;
        for (size_t j = first; j < first + (size_t)c * rs; j++) host[l->w_off + model_weight_index(m, l, j)] = 0.0f;
        size_t centre = first + (size_t)f * rs + (size_t)(s->r / 2) * s->s + s->s / 2;
        host[l->w_off + model_weight_index(m, l, centre)] = 1.0f;
    }
}

/* PyTorch's default for conv and linear: weights and biases uniform in
 * +-1/sqrt(fan_in) (kaiming_uniform with a = sqrt(5)).
 * Batch norm starts as the identity: gamma 1, beta 0, running mean 0 and
 * variance 1. Under optim.decay_bn_bias = off, weight decay skips biases and
 * batch-norm parameters. */
static void init_params(Model *m, uint64_t seed) {
    /* Each kind's start: batch norm's, or PyTorch's uniform default for any other with parameters (conv,
     * linear); SiLU, dropout, concat, flatten, pools, adds, scales have none. A new kind: say here how its
     * parameters start, then count it. */
    _Static_assert(LAYER_KINDS == 13, "init_params: a layer kind this function has not been checked for");
    float *host = calloc(m->n_params, sizeof(float)); /* padded input channels keep 0 */
    uint8_t *mask = m->decay_mask ? malloc(m->n_params) : NULL;
    if (!host || (m->decay_mask && !mask)) TC_FATAL("out of host memory initialising %zu parameters", m->n_params);
    uint64_t state = seed * 0x2545F4914F6CDD1DULL + 1;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (!l->w_count) continue;
        if (mask) {
            memset(mask + l->w_off, l->kind != LAYER_BATCHNORM, l->w_count);
            memset(mask + l->b_off, 0, l->b_count);
        }
        if (l->kind == LAYER_BATCHNORM) {
            for (size_t j = 0; j < l->w_count; j++) host[l->w_off + j] = 1.0f;
            continue;
        }
        const Activation *x = &m->acts[l->in];
        size_t real_w = l->w_count / x->c * x->c_real; /* conv: padded channels get none */
        if (l->kind == LAYER_LINEAR) real_w = l->w_count;
        float bound = 1.0f / sqrtf((float)l->fan_in);
        for (size_t j = 0; j < real_w; j++) host[l->w_off + model_weight_index(m, l, j)] = uniform(&state, bound);
        for (size_t j = 0; j < l->b_count; j++) host[l->b_off + j] = uniform(&state, bound);
        if (l->dirac) set_dirac(m, l, host);
    }
    model_set_params(m, host);
    free(host);
    if (mask) {
        op_copy_from_host(&m->ops, m->decay_mask, mask, m->n_params);
        op_sync(&m->ops);
        free(mask);
    }
    if (m->n_bn_stats) {
        float *stats = malloc(m->n_bn_stats * sizeof(float));
        if (!stats) TC_FATAL("out of host memory initialising batch-norm statistics");
        for (int i = 0; i < m->n_layers; i++) {
            const Layer *l = &m->layers[i];
            if (l->kind != LAYER_BATCHNORM) continue;
            for (int c = 0; c < l->bn.shape.c; c++) {
                stats[l->stat_off + c] = 0.0f;
                stats[l->stat_off + l->bn.shape.c + c] = 1.0f;
            }
        }
        model_set_bn_stats(m, stats);
        free(stats);
    }
}

void model_init_params(Model *m, uint64_t seed) {
    init_params(m, seed);
    m->dropout_seed = seed;
    model_set_dropout_step(m, 0);
    model_reset_lr_scale(m);
}

void model_finalize(Model *m, GpuContext *gpu, uint64_t seed) {
    if (m->n_layers == 0) TC_FATAL("model has no layers");
    if (m->open_block >= 0) TC_FATAL("block %d was not ended", m->open_block);
    if (!gpu && m->act_dtype != DTYPE_F32) TC_FATAL("the CPU path trains in fp32 only (precision.amp = off)");
    if (!gpu && m->nhwc) TC_FATAL("the CPU path trains in NCHW only (model.layout = nchw)");
    if (!gpu && m->overlap_wgrad) TC_FATAL("the CPU path has no second stream (perf.overlap_wgrad = off)");
    layer_kinds_check();
    m->gpu = gpu;
    m->device = gpu ? DEVICE_CUDA : DEVICE_CPU;
    m->ops = gpu ? op_context_gpu(gpu, m->act_dtype, m->nhwc) : op_context_cpu();
    plan_accumulation(m);
    if (m->fuse) mark_fusions(m);
    plan_grad_slots(m);
    if (gpu) choose_conv_algorithms(m);
    if (gpu) input_form_plan(m);
    if (m->fuse_graphs) graph_fusion_plan(m);

    Arena sizing;
    arena_init_counting(&sizing, m->device);
    carve_buffers(m, &sizing);
    arena_init(&m->arena, m->device, sizing.used);
    carve_buffers(m, &m->arena);
    m->ops.workspace = m->workspace;
    if (m->nvtx_layers) m->ops.hooks = &layer_nvtx_hooks;
    if (m->overlap_wgrad) {
        gpu_event_create(&m->wgrad_fork_event, 0);
        gpu_event_create(&m->wgrad_done_event, 0);
    }

    for (int i = 0; gpu && i < m->n_layers; i++)
        if (m->layers[i].kind == LAYER_MAXPOOL)
            maxpool_init(&m->ops, &m->layers[i].pool, &m->layers[i].pool.shape, m->layers[i].pool_scratch);
    /* The batch norms run one after another on one stream: one scratch serves all. */
    if (m->bn_scratch) {
        op_fill(&m->ops, m->bn_scratch, 0, m->bn_scratch_bytes);
        for (int i = 0; i < m->n_layers; i++)
            if (m->layers[i].kind == LAYER_BATCHNORM)
                batchnorm_init(&m->ops, &m->layers[i].bn, &m->layers[i].bn.shape, m->bn_scratch);
    }
    if (m->fuse_graphs) graph_fusion_choose(m);
    model_init_params(m, seed);
    model_reset_optimizer(m);
    model_zero_grads(m);
}

void model_destroy(Model *m) {
    if (m->gpu) op_sync(&m->ops);
    if (m->wgrad_fork_event) gpu_event_destroy(m->wgrad_fork_event);
    if (m->wgrad_done_event) gpu_event_destroy(m->wgrad_done_event);
    graph_fusion_destroy(m);
    if (m->gpu) {
        input_form_destroy(m);
        for (int i = 0; i < m->n_layers; i++) {
            if (m->layers[i].kind == LAYER_CONV) conv2d_destroy(&m->ops, &m->layers[i].conv);
            if (m->layers[i].kind == LAYER_MAXPOOL) maxpool_destroy(&m->ops, &m->layers[i].pool);
            if (m->layers[i].kind == LAYER_BATCHNORM) batchnorm_destroy(&m->ops, &m->layers[i].bn);
        }
    }
    arena_free(&m->arena);
}

/* ---- access (the passes are in layers.c) --------------------------------- */

float *model_input_buffer(const Model *m) { return m->input_f32 ? m->input_f32 : (float *)m->acts[0].value; }

ModelInputForm model_input_form(const Model *m) {
    const Activation *in = &m->acts[0];
    if (!m->input_f32 || in->unstored || !m->nhwc)
        return (ModelInputForm){model_input_buffer(m), DTYPE_F32, 0, in->c_real, 0};
    return (ModelInputForm){in->value, m->act_dtype, 1, in->c, 1};
}

void model_set_input_direct(Model *m, int direct) {
    if (direct && !model_input_form(m).direct) TC_FATAL("model_set_input_direct: the input is the fp32 batch itself");
    m->input_direct = direct;
}
size_t model_input_floats(const Model *m) { return act_floats(m, 0) / m->acts[0].c * m->acts[0].c_real; }
double model_layer_flops(const Model *m, int i) {
    const Layer *l = &m->layers[i];
    const Activation *y = &m->acts[l->out];
    if (l->kind == LAYER_CONV) {
        const Conv2dShape *s = &l->conv.shape;
        return 2.0 * s->n * s->k * (s->c / conv2d_groups(s)) * s->r * s->s * conv2d_out_h(s) * conv2d_out_w(s);
    }
    if (l->kind == LAYER_LINEAR) return 2.0 * l->linear.n * l->linear.in * l->linear.out;
    return (double)m->batch * y->c * y->h * y->w;
}

void *model_logits(const Model *m) { return m->acts[m->n_acts - 1].value; }
void *model_logits_grad(const Model *m) { return grad_of(m, m->n_acts - 1); }
void model_set_training(Model *m, int training) { m->training = training; }

void model_set_dropout_step(Model *m, int64_t step) {
    if (!m->dropout) return;
    DropoutCounter counter = {step, m->dropout_seed};
    op_copy_from_host(&m->ops, m->dropout, &counter, sizeof counter);
    op_sync(&m->ops);
}

int64_t model_dropout_step(const Model *m) {
    DropoutCounter counter = {0, 0};
    if (m->dropout) {
        op_copy_to_host(&m->ops, &counter, m->dropout, sizeof counter);
        op_sync(&m->ops);
    }
    return counter.step;
}
size_t model_bytes(const Model *m) { return m->arena.peak; }

void model_zero_grads(Model *m) {
    op_fill(&m->ops, m->grads, 0, m->n_params * dtype_size(m->act_dtype));
    m->grads_zeroed = 1;
}

/* Host copies of model buffers, waited for. */
static void download(const Model *m, float *host, const void *src, size_t floats) {
    op_copy_to_host(&m->ops, host, src, floats * sizeof(float));
    op_sync(&m->ops);
}

static void upload(Model *m, void *dst, const float *host, size_t floats) {
    op_copy_from_host(&m->ops, dst, host, floats * sizeof(float));
    op_sync(&m->ops);
}

void model_get_params(const Model *m, float *host) { download(m, host, m->params, m->n_params); }

void model_set_params(Model *m, const float *host) {
    op_copy_from_host(&m->ops, m->params, host, m->n_params * sizeof(float));
    if (m->weights != m->params) cast_from_f32(&m->ops, m->params, m->weights, m->n_params);
    op_sync(&m->ops);
}

static int last_linear(const Model *m) {
    for (int i = m->n_layers - 1; i >= 0; i--)
        if (m->layers[i].kind == LAYER_LINEAR) return i;
    return -1;
}

/* The layer's weights and bias all set to v. */
static void set_floats(float *host, const Layer *l, float v) {
    for (size_t j = 0; j < l->w_count; j++) host[l->w_off + j] = v;
    for (size_t j = 0; j < l->b_count; j++) host[l->b_off + j] = v;
}

void model_reset_lr_scale(Model *m) {
    if (!m->lr_scale) return;
    float *host = malloc(m->n_params * sizeof(float));
    if (!host) TC_FATAL("out of host memory: learning-rate shares");
    for (size_t j = 0; j < m->n_params; j++) host[j] = 1.0f;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        int frozen = l->whitening || (l->kind == LAYER_BATCHNORM && m->bn_weight_fixed);
        for (size_t j = 0; frozen && j < l->w_count; j++) host[l->w_off + j] = 0.0f;
        for (size_t j = 0; l->kind == LAYER_BATCHNORM && j < l->b_count; j++) host[l->b_off + j] = m->bn_bias_lr_scale;
    }
    int head = last_linear(m);
    if (head >= 0) set_floats(host, &m->layers[head], m->head_lr_scale);
    MuonMatrices muon;
    model_muon_matrices(m, &muon);
    for (int j = 0; j < muon.n; j++)
        for (size_t i = 0; i < (size_t)muon.mats[j].rows * muon.mats[j].cols; i++) host[muon.mats[j].offset + i] = 0.0f;
    upload(m, m->lr_scale, host, m->n_params);
    free(host);
}

void model_muon_matrices(const Model *m, MuonMatrices *out) {
    out->n = 0;
    for (int i = 0; m->muon && i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_CONV || l->whitening || !l->w_count) continue;
        if (out->n == MUON_MAX_MATRICES)
            TC_FATAL("optim.muon: the model has more than %d trained convolutions", MUON_MAX_MATRICES);
        int rows = l->conv.shape.k;
        out->mats[out->n++] = (MuonMatrix){l->w_off, rows, (int)(l->w_count / (size_t)rows)};
    }
}

void model_get_momentum(const Model *m, float *host) { download(m, host, m->momentum, m->n_params); }
void model_set_momentum(Model *m, const float *host) { upload(m, m->momentum, host, m->n_params); }

static void check_adam(const Model *m, const char *what) {
    if (!m->adam) TC_FATAL("%s: the model keeps no Adam state (model.adam is 0)", what);
}

void model_get_second_moment(const Model *m, float *host) {
    check_adam(m, __func__);
    download(m, host, m->second_moment, m->n_params);
}

void model_set_second_moment(Model *m, const float *host) {
    check_adam(m, __func__);
    upload(m, m->second_moment, host, m->n_params);
}

int64_t model_get_adam_steps(const Model *m) {
    int64_t steps;
    check_adam(m, __func__);
    op_copy_to_host(&m->ops, &steps, m->adam_steps, sizeof steps);
    op_sync(&m->ops);
    return steps;
}

void model_set_adam_steps(Model *m, int64_t steps) {
    check_adam(m, __func__);
    op_copy_from_host(&m->ops, m->adam_steps, &steps, sizeof steps);
    op_sync(&m->ops);
}

void model_reset_optimizer(Model *m) {
    op_fill(&m->ops, m->momentum, 0, m->n_params * sizeof(float));
    if (!m->adam) return;
    op_fill(&m->ops, m->second_moment, 0, m->n_params * sizeof(float));
    op_fill(&m->ops, m->adam_steps, 0, sizeof(int64_t));
}

void model_get_bn_stats(const Model *m, float *host) {
    if (m->n_bn_stats) download(m, host, m->bn_running, m->n_bn_stats);
}

void model_set_bn_stats(Model *m, const float *host) {
    if (m->n_bn_stats) upload(m, m->bn_running, host, m->n_bn_stats);
}
