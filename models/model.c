#include "models/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers.h"
#include "models/plan.h"
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

/* ---- finalizing ------------------------------------------------------- */

/* GPU: the cuDNN descriptors and algorithms of the convolutions, and the
 * sizes of the workspace and scratch the layers share. */
static void choose_conv_algorithms(Model *m) {
    const OpContext *ctx = &m->ops;
    m->workspace_bytes = 0;
    for (int i = 0; i < m->n_layers; i++) {
        Layer *l = &m->layers[i];
        const LayerPlan *p = &m->plan->layers[i];
        if (l->kind == LAYER_CONV && p->pool_layer >= 0) {
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
            size_t bias_grad = p->act == BN_ACT_GELU ? conv_bias_gelu_workspace_bytes(ctx, &whitening)
                                                     : conv2d_bias_grad_bytes(ctx, &l->conv);
            if ((p->bias_relu || l->whitening) && bias_grad > m->workspace_bytes) m->workspace_bytes = bias_grad;
        } else if (l->kind == LAYER_BATCHNORM) {
            size_t scratch = batchnorm_scratch_bytes(ctx, &l->bn.shape);
            if (scratch > m->bn_scratch_bytes) m->bn_scratch_bytes = scratch;
        }
    }
}

static int recomputed(const Model *m, int id) {
    const ActivationPlan *p = &m->plan->acts[id];
    return m->checkpoint && p->recompute_block >= 0 && p->shares_with < 0 && !p->unstored;
}

/* Under checkpointing the insides of all blocks take turns in one region, laid
 * out block by block; returns its size in floats. */
static size_t plan_recompute_region(Model *m) {
    size_t region = 0;
    for (int b = 0; b < m->n_blocks; b++) {
        size_t offset = 0;
        for (int id = 0; id < m->n_acts; id++) {
            if (m->plan->acts[id].recompute_block != b || !recomputed(m, id)) continue;
            m->plan->acts[id].region_offset = offset;
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
        const ActivationPlan *p = &m->plan->acts[id];
        if (p->unstored) act->value = NULL;
        else if (p->shares_with >= 0) act->value = m->acts[p->shares_with].value;
        else if (recomputed(m, id)) act->value = element(m, m->recompute_region, p->region_offset);
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
        int by_bias_relu_pool = m->plan->layers[i].bias_layer >= 0;
        size_t bytes = l->kind == LAYER_MAXPOOL && !by_bias_relu_pool ? maxpool_scratch_bytes(&m->ops, &l->pool.shape)
                                                                      : 0;
        l->pool_scratch = bytes ? arena_alloc(a, bytes, "max-pool window positions") : NULL;
    }
    plan_carve(m, a);
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
    plan_layers(m);
    if (gpu) choose_conv_algorithms(m);
    if (gpu) plan_input_forms(m);
    if (m->fuse_graphs) plan_graphs(m);

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
    if (m->fuse_graphs) plan_graphs_choose(m);
    model_init_params(m, seed);
    model_reset_optimizer(m);
    model_zero_grads(m);
}

void model_destroy(Model *m) {
    if (m->gpu) op_sync(&m->ops);
    if (m->wgrad_fork_event) gpu_event_destroy(m->wgrad_fork_event);
    if (m->wgrad_done_event) gpu_event_destroy(m->wgrad_done_event);
    plan_destroy(m);
    if (m->gpu) {
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
    if (!m->input_f32 || (m->plan && m->plan->acts[0].unstored) || !m->nhwc)
        return (ModelInputForm){model_input_buffer(m), DTYPE_F32, 0, in->c_real, 0};
    return (ModelInputForm){in->value, m->act_dtype, 1, in->c, 1};
}

void model_set_input_direct(Model *m, int direct) {
    if (direct && !model_input_form(m).direct) TC_FATAL("model_set_input_direct: the input is the fp32 batch itself");
    m->input_direct = direct;
}
size_t model_input_floats(const Model *m) { return input_floats(m); }

int model_act_stored(const Model *m, int id) {
    const ActivationPlan *p = &m->plan->acts[id];
    return !p->unstored && p->shares_with < 0 && !recomputed(m, id);
}
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
