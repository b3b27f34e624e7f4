#include "models/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#include "ops/bias_relu.h"
#include "ops/cast.h"
#include "ops/relu.h"
#include "runtime/check.h"
#include "runtime/log.h"

/* ---- building ---------------------------------------------------------- */

void model_init(Model *m, int batch, int num_classes, int nhwc) {
    memset(m, 0, sizeof *m);
    m->nhwc = nhwc;
    m->open_block = -1;
    m->batch = batch;
    m->num_classes = num_classes;
    m->conv_policy.workspace_limit = (size_t)256 << 20;
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

static Layer *add_layer(Model *m, LayerKind kind, int in) {
    if (m->n_layers >= MODEL_MAX_LAYERS) TC_FATAL("model has more than %d layers", MODEL_MAX_LAYERS);
    if (in < 0 || in >= m->n_acts) TC_FATAL("layer %d reads activation %d, which does not exist", m->n_layers, in);
    Layer *l = &m->layers[m->n_layers++];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->in = in;
    l->block = m->open_block;
    return l;
}

static void add_params(Model *m, Layer *l, size_t w_count, size_t b_count, size_t fan_in) {
    l->w_off = m->n_params;
    l->w_count = w_count;
    l->b_off = m->n_params + w_count;
    l->b_count = b_count;
    l->fan_in = fan_in;
    m->n_params += w_count + b_count;
}

void model_block_begin(Model *m) {
    if (m->open_block >= 0) TC_FATAL("model_block_begin inside block %d", m->open_block);
    m->open_block = m->n_blocks++;
}

void model_block_end(Model *m) {
    if (m->open_block < 0) TC_FATAL("model_block_end without model_block_begin");
    if (m->n_layers == 0 || m->layers[m->n_layers - 1].block != m->open_block)
        TC_FATAL("block %d has no layers", m->open_block);
    m->acts[m->n_acts - 1].internal_to = -1; /* the block's output is kept */
    m->open_block = -1;
}

int model_input(Model *m, int c, int h, int w) {
    if (m->n_acts != 0) TC_FATAL("model_input must be the first activation");
    /* Tensor-core convolutions want channels in multiples of 8. */
    int id = add_act(m, m->nhwc ? (c + 7) / 8 * 8 : c, h, w);
    m->acts[id].c_real = c;
    return id;
}

int model_conv(Model *m, int in, int out_channels, int kernel, int pad, int stride) {
    Layer *l = add_layer(m, LAYER_CONV, in);
    const Activation *x = &m->acts[in];
    Conv2dShape s = {m->batch, x->c, x->h, x->w, out_channels, kernel, kernel, pad, stride};
    int oh = conv2d_out_h(&s), ow = conv2d_out_w(&s);
    if (oh <= 0 || ow <= 0)
        TC_FATAL("layer %d: a %dx%d convolution does not fit a %dx%d input", m->n_layers - 1, kernel,
                 kernel, x->h, x->w);
    l->conv = s;
    add_params(m, l, (size_t)out_channels * x->c * kernel * kernel, (size_t)out_channels,
               (size_t)x->c_real * kernel * kernel);
    return l->out = add_act(m, out_channels, oh, ow);
}

int model_relu(Model *m, int in) {
    Layer *l = add_layer(m, LAYER_RELU, in);
    const Activation *x = &m->acts[in];
    l->out = add_act(m, x->c, x->h, x->w);
    /* ReLU's backward needs only its output, so it can overwrite its input. */
    m->acts[l->out].shares_with = in;
    return l->out;
}

int model_maxpool2(Model *m, int in) {
    Layer *l = add_layer(m, LAYER_MAXPOOL, in);
    const Activation *x = &m->acts[in];
    if (x->h % 2 || x->w % 2)
        TC_FATAL("layer %d: 2x2 max-pool needs an even input size, got %dx%d", m->n_layers - 1,
                 x->h, x->w);
    l->pool = (Pool2dShape){m->batch, x->c, x->h, x->w};
    return l->out = add_act(m, x->c, x->h / 2, x->w / 2);
}

int model_linear(Model *m, int in, int out_features) {
    Layer *l = add_layer(m, LAYER_LINEAR, in);
    const Activation *x = &m->acts[in];
    int in_features = x->c * x->h * x->w; /* NCHW flattens to [n][c*h*w] for free */
    l->linear = (LinearShape){m->batch, in_features, out_features};
    add_params(m, l, (size_t)out_features * in_features, (size_t)out_features, (size_t)in_features);
    return l->out = add_act(m, out_features, 1, 1);
}

/* ---- finalizing ------------------------------------------------------- */

/* Element i of a buffer of the activation dtype. */
static void *element(const Model *m, void *base, size_t i) {
    return (char *)base + i * dtype_size(m->act_dtype);
}

static size_t act_floats(const Model *m, int id) {
    const Activation *a = &m->acts[id];
    return (size_t)m->batch * a->c * a->h * a->w;
}

/* Backward walks the layers in reverse; each gradient lands in the buffer its
 * producer did not read from, so two buffers serve the whole net. A ReLU works
 * in place. Every activation may feed one layer only: branching nets need the
 * gradient sum that a residual add brings. */
static void assign_grad_slots(Model *m) {
    int consumers[MODEL_MAX_ACTS] = {0};
    for (int i = 0; i < m->n_layers; i++) consumers[m->layers[i].in]++;
    for (int a = 0; a < m->n_acts; a++)
        if (consumers[a] > 1) TC_FATAL("activation %d feeds %d layers; fan-out needs a residual add", a, consumers[a]);
    m->acts[m->n_acts - 1].grad_slot = 0;
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const Layer *l = &m->layers[i];
        int dy_slot = m->acts[l->out].grad_slot;
        if (l->in == 0) continue; /* nothing needs d(loss)/d(input) */
        m->acts[l->in].grad_slot = l->kind == LAYER_RELU ? dy_slot : 1 - dy_slot;
    }
    m->act_grad_floats[0] = m->act_grad_floats[1] = 0;
    for (int a = 1; a < m->n_acts; a++) {
        int slot = m->acts[a].grad_slot;
        if (slot >= 0 && act_floats(m, a) > m->act_grad_floats[slot]) m->act_grad_floats[slot] = act_floats(m, a);
    }
}

/* A ReLU right after a convolution, reading nothing else, folds into it. */
static void mark_fusions(Model *m) {
    for (int i = 0; i + 1 < m->n_layers; i++) {
        Layer *conv = &m->layers[i], *relu = &m->layers[i + 1];
        if (conv->kind == LAYER_CONV && relu->kind == LAYER_RELU && relu->in == conv->out)
            conv->fused = relu->fused = 1;
        else
            continue;
        Layer *pool = i + 2 < m->n_layers ? &m->layers[i + 2] : NULL;
        if (pool && pool->kind == LAYER_MAXPOOL && pool->in == relu->out && !m->nhwc)
            pool->fused = conv->relu_grad_by_pool = 1;
    }
}

static void choose_conv_algorithms(Model *m) {
    m->workspace_bytes = 0;
    for (int i = 0; i < m->n_layers; i++) {
        Layer *l = &m->layers[i];
        if (l->kind == LAYER_CONV) {
            conv2d_cuda_init(&l->conv_cuda, m->gpu->cudnn, &l->conv, m->act_dtype, m->nhwc,
                             &m->conv_policy);
            if (l->conv_cuda.workspace_bytes > m->workspace_bytes)
                m->workspace_bytes = l->conv_cuda.workspace_bytes;
            size_t bias_grad = conv2d_bias_grad_workspace_bytes(l->conv.n, l->conv.k, conv2d_out_h(&l->conv),
                                                                conv2d_out_w(&l->conv), m->nhwc);
            if (l->fused && bias_grad > m->workspace_bytes) m->workspace_bytes = bias_grad;
        } else if (l->kind == LAYER_MAXPOOL) {
            maxpool2x2_cuda_init(&l->pool_cuda, &l->pool, m->act_dtype, m->nhwc);
        }
    }
}

static int recomputed(const Model *m, int id) {
    return m->checkpoint && m->acts[id].internal_to >= 0 && m->acts[id].shares_with < 0;
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

/* Runs twice: on a counting arena to size it, then on the real one. */
static void carve_buffers(Model *m, Arena *a) {
    size_t esize = dtype_size(m->act_dtype), half = m->act_dtype != DTYPE_F32;
    m->params = arena_alloc(a, m->n_params * sizeof(float), "parameters");
    m->weights = half ? arena_alloc(a, m->n_params * esize, "half-precision weights") : m->params;
    m->grads = arena_alloc(a, m->n_params * esize, "gradients");
    m->momentum = arena_alloc(a, m->n_params * sizeof(float), "momentum");
    m->input_f32 = half || m->nhwc ? arena_alloc(a, model_input_floats(m) * sizeof(float), "fp32 NCHW input batch") : NULL;
    size_t region = plan_recompute_region(m);
    m->recompute_region = region ? arena_alloc(a, region * esize, "recomputed activations") : NULL;
    for (int id = 0; id < m->n_acts; id++) {
        Activation *act = &m->acts[id];
        if (act->shares_with >= 0) act->value = m->acts[act->shares_with].value;
        else if (recomputed(m, id)) act->value = element(m, m->recompute_region, act->region_offset);
        else act->value = arena_alloc(a, act_floats(m, id) * esize, "activations");
    }
    for (int s = 0; s < 2; s++)
        m->act_grads[s] = arena_alloc(a, m->act_grad_floats[s] * esize, "activation gradients");
    m->workspace = m->workspace_bytes ? arena_alloc(a, m->workspace_bytes, "cuDNN workspace") : NULL;
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

/* PyTorch's default for conv and linear: weights and biases uniform in
 * +-1/sqrt(fan_in) (kaiming_uniform with a = sqrt(5)). */
/* Where weight j of a layer, counted in NCHW order over the real input
 * channels, lives in this model's layout: conv weights [k][c][r][s] become
 * [k][r][s][c_padded]; a linear layer after a channels-last image sees its
 * inputs in (h, w, c) order. So the NCHW and NHWC models start from the same
 * function. */
static size_t weight_index(const Model *m, const Layer *l, size_t j) {
    const Activation *x = &m->acts[l->in];
    if (!m->nhwc) return j;
    if (l->kind == LAYER_CONV) {
        int rs = l->conv.r * l->conv.s, cr = x->c_real;
        size_t k = j / ((size_t)cr * rs), c = j / rs % cr, pos = j % rs;
        return (k * rs + pos) * x->c + c;
    }
    if (l->kind == LAYER_LINEAR && x->h * x->w > 1) {
        size_t in = (size_t)x->c * x->h * x->w, hw = (size_t)x->h * x->w;
        size_t row = j / in, col = j % in, c = col / hw, pos = col % hw;
        return row * in + pos * x->c + c;
    }
    return j;
}

static void init_params(Model *m, uint64_t seed) {
    float *host = calloc(m->n_params, sizeof(float)); /* padded input channels keep 0 */
    if (!host) TC_FATAL("out of host memory initialising %zu parameters", m->n_params);
    uint64_t state = seed * 0x2545F4914F6CDD1DULL + 1;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (!l->w_count) continue;
        const Activation *x = &m->acts[l->in];
        size_t real_w = l->w_count / x->c * x->c_real; /* conv: padded channels get none */
        if (l->kind == LAYER_LINEAR) real_w = l->w_count;
        float bound = 1.0f / sqrtf((float)l->fan_in);
        for (size_t j = 0; j < real_w; j++) host[l->w_off + weight_index(m, l, j)] = uniform(&state, bound);
        for (size_t j = 0; j < l->b_count; j++) host[l->b_off + j] = uniform(&state, bound);
    }
    model_set_params(m, host);
    free(host);
}

void model_finalize(Model *m, GpuContext *gpu, uint64_t seed) {
    if (m->n_layers == 0) TC_FATAL("model has no layers");
    if (m->open_block >= 0) TC_FATAL("block %d was not ended", m->open_block);
    if (!gpu && m->act_dtype != DTYPE_F32) TC_FATAL("the CPU path trains in fp32 only (precision.amp = off)");
    if (!gpu && m->nhwc) TC_FATAL("the CPU path trains in NCHW only (model.layout = nchw)");
    m->gpu = gpu;
    m->device = gpu ? DEVICE_CUDA : DEVICE_CPU;
    assign_grad_slots(m);
    if (m->fuse && !gpu) TC_FATAL("fused layers run on the GPU only (model.fuse = off on the CPU)");
    if (m->fuse) mark_fusions(m);
    if (gpu) choose_conv_algorithms(m);

    Arena sizing;
    arena_init_counting(&sizing, m->device);
    carve_buffers(m, &sizing);
    arena_init(&m->arena, m->device, sizing.used);
    carve_buffers(m, &m->arena);

    init_params(m, seed);
    if (gpu) CUDA_CHECK(cudaMemsetAsync(m->momentum, 0, m->n_params * sizeof(float), gpu->compute));
    else memset(m->momentum, 0, m->n_params * sizeof(float));
    model_zero_grads(m);
}

void model_destroy(Model *m) {
    if (m->gpu) {
        CUDA_CHECK(cudaStreamSynchronize(m->gpu->compute));
        for (int i = 0; i < m->n_layers; i++) {
            if (m->layers[i].kind == LAYER_CONV) conv2d_cuda_destroy(&m->layers[i].conv_cuda);
            if (m->layers[i].kind == LAYER_MAXPOOL) maxpool2x2_cuda_destroy(&m->layers[i].pool_cuda);
        }
    }
    arena_free(&m->arena);
}

/* ---- running ------------------------------------------------------------ */

float *model_input_buffer(const Model *m) { return m->input_f32 ? m->input_f32 : (float *)m->acts[0].value; }
size_t model_input_floats(const Model *m) { return act_floats(m, 0) / m->acts[0].c * m->acts[0].c_real; }
void *model_logits(const Model *m) { return m->acts[m->n_acts - 1].value; }
void *model_logits_grad(const Model *m) { return m->act_grads[m->acts[m->n_acts - 1].grad_slot]; }
size_t model_bytes(const Model *m) { return m->arena.peak; }

static void layer_forward(Model *m, Layer *l) {
    const void *x = m->acts[l->in].value;
    void *y = m->acts[l->out].value;
    const void *w = element(m, m->weights, l->w_off), *b = element(m, m->weights, l->b_off);
    int gpu = m->device == DEVICE_CUDA;
    switch (l->kind) {
    case LAYER_CONV:
        if (l->fused) {
            conv2d_forward_cuda(&l->conv_cuda, m->gpu->cudnn, x, w, NULL, y, m->workspace);
            bias_relu_forward_cuda(m->act_dtype, m->nhwc, b, y, l->conv.n, l->conv.k,
                                   conv2d_out_h(&l->conv) * conv2d_out_w(&l->conv), m->gpu->compute);
        } else if (gpu) conv2d_forward_cuda(&l->conv_cuda, m->gpu->cudnn, x, w, b, y, m->workspace);
        else conv2d_forward_cpu(&l->conv, x, w, b, y);
        break;
    case LAYER_RELU:
        if (l->fused) break;
        if (gpu) relu_forward_cuda(m->act_dtype, x, y, act_floats(m, l->out), m->gpu->compute);
        else relu_forward_cpu(x, y, act_floats(m, l->out));
        break;
    case LAYER_MAXPOOL:
        if (gpu) maxpool2x2_forward_cuda(&l->pool_cuda, m->gpu->cudnn, x, y);
        else maxpool2x2_forward_cpu(&l->pool, x, y);
        break;
    case LAYER_LINEAR:
        if (gpu) linear_forward_cuda(m->gpu->cublas, m->gpu->compute, &l->linear, m->act_dtype, x, w, b, y);
        else linear_forward_cpu(&l->linear, x, w, b, y);
        break;
    }
}

static void layer_backward(Model *m, Layer *l) {
    const void *x = m->acts[l->in].value;
    const void *y = m->acts[l->out].value;
    const void *dy = m->act_grads[m->acts[l->out].grad_slot];
    int dx_slot = m->acts[l->in].grad_slot;
    void *dx = dx_slot >= 0 ? m->act_grads[dx_slot] : NULL;
    const void *w = element(m, m->weights, l->w_off);
    void *dw = element(m, m->grads, l->w_off), *db = element(m, m->grads, l->b_off);
    int gpu = m->device == DEVICE_CUDA;
    switch (l->kind) {
    case LAYER_CONV:
        if (l->fused) {
            /* The fused ReLU's backward, in place, then the bias and the convolution. */
            const Conv2dShape *s = &l->conv;
            int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
            if (!l->relu_grad_by_pool)
                relu_backward_cuda(m->act_dtype, y, dy, (void *)dy, act_floats(m, l->out), m->gpu->compute);
            conv2d_bias_grad_cuda(m->act_dtype, m->nhwc, s->n, s->k, oh, ow, dy, db, m->workspace, m->gpu->compute);
            conv2d_backward_cuda(&l->conv_cuda, m->gpu->cudnn, x, w, dy, dx, dw, NULL, m->workspace);
        } else if (gpu) conv2d_backward_cuda(&l->conv_cuda, m->gpu->cudnn, x, w, dy, dx, dw, db, m->workspace);
        else conv2d_backward_cpu(&l->conv, x, w, dy, dx, dw, db);
        break;
    case LAYER_RELU:
        if (!dx || l->fused) break;
        if (gpu) relu_backward_cuda(m->act_dtype, y, dy, dx, act_floats(m, l->out), m->gpu->compute);
        else relu_backward_cpu(y, dy, dx, act_floats(m, l->out));
        break;
    case LAYER_MAXPOOL:
        if (!dx) break;
        if (l->fused) maxpool2x2_relu_backward_cuda(m->act_dtype, &l->pool, x, dy, dx, m->gpu->compute);
        else if (gpu) maxpool2x2_backward_cuda(&l->pool_cuda, m->gpu->cudnn, x, y, dy, dx);
        else maxpool2x2_backward_cpu(&l->pool, x, y, dy, dx);
        break;
    case LAYER_LINEAR:
        if (gpu) linear_backward_cuda(m->gpu->cublas, m->gpu->compute, &l->linear, m->act_dtype, x, w, dy, dx, dw, db);
        else linear_backward_cpu(&l->linear, x, w, dy, dx, dw, db);
        break;
    }
}

void model_forward(Model *m) {
    const Activation *in = &m->acts[0];
    if (m->nhwc)
        cast_nchw_to_nhwc_cuda(m->act_dtype, m->input_f32, in->value, m->batch, in->c_real, in->h, in->w, in->c,
                               m->gpu->compute);
    else if (m->input_f32)
        cast_from_f32_cuda(m->act_dtype, m->input_f32, in->value, act_floats(m, 0), m->gpu->compute);
    for (int i = 0; i < m->n_layers; i++) layer_forward(m, &m->layers[i]);
}

/* Under checkpointing, reaching a block's last layer runs the block forward
 * again from its kept input, refilling the inside that later blocks overwrote. */
static void recompute_block(Model *m, int last) {
    int first = last;
    while (first > 0 && m->layers[first - 1].block == m->layers[last].block) first--;
    nvtxRangePushA("recompute");
    for (int i = first; i <= last; i++) layer_forward(m, &m->layers[i]);
    nvtxRangePop();
}

void model_backward(Model *m) {
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const Layer *l = &m->layers[i];
        int block_end = l->block >= 0 && (i == m->n_layers - 1 || m->layers[i + 1].block != l->block);
        /* The last block's inside is still in place from the forward pass. */
        if (m->checkpoint && block_end && l->block != m->n_blocks - 1) recompute_block(m, i);
        layer_backward(m, &m->layers[i]);
    }
}

void model_zero_grads(Model *m) {
    size_t bytes = m->n_params * dtype_size(m->act_dtype);
    if (m->device == DEVICE_CUDA) CUDA_CHECK(cudaMemsetAsync(m->grads, 0, bytes, m->gpu->compute));
    else memset(m->grads, 0, bytes);
}

void model_get_params(const Model *m, float *host) {
    size_t bytes = m->n_params * sizeof(float);
    if (m->device == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemcpyAsync(host, m->params, bytes, cudaMemcpyDeviceToHost, m->gpu->compute));
        CUDA_CHECK(cudaStreamSynchronize(m->gpu->compute));
    } else {
        memcpy(host, m->params, bytes);
    }
}

void model_set_params(Model *m, const float *host) {
    size_t bytes = m->n_params * sizeof(float);
    if (m->device == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemcpyAsync(m->params, host, bytes, cudaMemcpyHostToDevice, m->gpu->compute));
        if (m->weights != m->params)
            cast_from_f32_cuda(m->act_dtype, m->params, m->weights, m->n_params, m->gpu->compute);
        CUDA_CHECK(cudaStreamSynchronize(m->gpu->compute));
    } else {
        memcpy(m->params, host, bytes);
    }
}

void model_get_momentum(const Model *m, float *host) {
    size_t bytes = m->n_params * sizeof(float);
    if (m->device == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemcpyAsync(host, m->momentum, bytes, cudaMemcpyDeviceToHost, m->gpu->compute));
        CUDA_CHECK(cudaStreamSynchronize(m->gpu->compute));
    } else {
        memcpy(host, m->momentum, bytes);
    }
}

void model_set_momentum(Model *m, const float *host) {
    size_t bytes = m->n_params * sizeof(float);
    if (m->device == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemcpyAsync(m->momentum, host, bytes, cudaMemcpyHostToDevice, m->gpu->compute));
        CUDA_CHECK(cudaStreamSynchronize(m->gpu->compute));
    } else {
        memcpy(m->momentum, host, bytes);
    }
}

int model_build(Model *m, const char *name, int batch, int image_size, int num_classes, int nhwc,
                char *err, size_t errlen) {
    if (strcmp(name, "simplenet") != 0) {
        snprintf(err, errlen, "model.name: unknown model '%s' (known: simplenet)", name);
        return -1;
    }
    if (image_size < 8 || image_size % 8) {
        snprintf(err, errlen, "data.image_size = %d: SimpleNet needs a size divisible by 8 (32, 224, ...)",
                 image_size);
        return -1;
    }
    if (batch < 1 || num_classes < 2) {
        snprintf(err, errlen, "train.batch must be >= 1 and model.num_classes >= 2");
        return -1;
    }
    model_init(m, batch, num_classes, nhwc);
    simplenet_build(m, image_size);
    return 0;
}
