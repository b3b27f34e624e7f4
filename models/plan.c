/* The planner (plan.h): what runs in which pass, and where each gradient lives.
 *
 * model.fuse: a ReLU right after a convolution with a bias, a batch norm or an add, or a GELU right after a
 * batch norm or a whitening convolution, reading nothing else, folds into it; a conv + bias + ReLU that only a
 * 2x2 max-pool reads folds its bias and ReLU into the pool (bias_relu_pool), and over the input image on the GPU
 * into one kernel with the pool (conv_bias_relu_pool); a batch norm computes the add after it, or the max-pool
 * after its ReLU, in its pass. The log says which way each went.
 *
 * And on the GPU, channels-last: a convolution over the input image may run
 * on copies of the image and its filters in another form
 * (ops/space_to_depth.h), where cuDNN has faster kernels than for the image's
 * 3 channels padded to 8:
 *   block 2, a stride-2 convolution as a stride-1 one over 2x2 squares of
 *   pixels (ResNet-50's 7x7 stem as 4x4 over 16 channels);
 *   block 1, the same convolution over the 3 channels that carry data.
 * Each form's convolution is timed at start-up under perf.conv_benchmark
 * (conv2d_init), with the copy of the image, against the convolution over the
 * image itself, forward and filter gradient (the image takes none); the
 * fastest runs, and the log says which. The filters stay the model's: each
 * forward copies them into the form, and backward folds the form's filter
 * gradient back (space_to_depth_backward), so checkpoints, exports and the
 * optimizer see the same parameters either way. */
#include "models/plan.h"

#include <stdlib.h>
#include <string.h>

#include "models/layers.h"
#include "ops/backend_graph.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

/* ---- the plan's records ---------------------------------------------------- */

static Plan *plan_new(void) {
    Plan *p = malloc(sizeof *p);
    if (!p) TC_FATAL("out of host memory: the model's plan");
    memset(p, 0, sizeof *p);
    for (int i = 0; i < MODEL_MAX_LAYERS; i++) {
        LayerPlan *l = &p->layers[i];
        l->bias_layer = l->pool_layer = l->add_layer = l->prologue_bn = l->dbn_layer = -1;
    }
    for (int a = 0; a < MODEL_MAX_ACTS; a++) p->acts[a].grad_slot = -1;
    return p;
}

Plan *plan_copy(const Plan *p) {
    Plan *copy = malloc(sizeof *copy);
    if (!copy) TC_FATAL("out of host memory: an alternative plan");
    memcpy(copy, p, sizeof *copy);
    return copy;
}

void plan_genstats_free(const Model *m, ConvGenStats *op) {
    if (!op) return;
    conv_genstats_destroy(&m->ops, op);
    free(op);
}

void plan_dgrad_dbn_free(const Model *m, ConvDgradDbn *op) {
    if (!op) return;
    conv_dgrad_dbn_destroy(&m->ops, op);
    free(op);
}

/* Whether layer plan l refers to op. */
static int uses(const LayerPlan *l, const void *op) {
    return op == (const void *)l->genstats || op == (const void *)l->prologue_genstats ||
           op == (const void *)l->dgrad_dbn;
}

void plan_keep(Model *m, Plan *winner, Plan *loser) {
    for (int i = 0; i < m->n_layers; i++) {
        const LayerPlan *w = &winner->layers[i], *l = &loser->layers[i];
        if (l->genstats && !uses(w, l->genstats)) plan_genstats_free(m, l->genstats);
        if (l->prologue_genstats && !uses(w, l->prologue_genstats)) plan_genstats_free(m, l->prologue_genstats);
        if (l->dgrad_dbn && !uses(w, l->dgrad_dbn)) plan_dgrad_dbn_free(m, l->dgrad_dbn);
    }
    free(loser);
    m->plan = winner;
}

static void form_free(const Model *m, ConvInputForm *f);

void plan_destroy(Model *m) {
    if (!m->plan) return;
    for (int i = 0; i < m->n_layers; i++) {
        LayerPlan *l = &m->plan->layers[i];
        plan_genstats_free(m, l->genstats);
        plan_genstats_free(m, l->prologue_genstats);
        plan_dgrad_dbn_free(m, l->dgrad_dbn);
        form_free(m, l->input_form);
    }
    free(m->plan);
    m->plan = NULL;
}

/* ---- patterns the graphs (plan_graphs.c) and the gradient buffers share ------- */

/* The graphs are built for one convolution of all channels: a grouped one stays apart. */
int plan_ungrouped_conv(const Layer *l) { return l->kind == LAYER_CONV && conv2d_groups(&l->conv.shape) == 1; }

/* The conv right after batch norm i and its fused ReLU, alone in reading the ReLU's output; -1: none. */
int plan_norm_relu_conv(const Model *m, int i) {
    if (i + 2 >= m->n_layers) return -1;
    const Layer *bn = &m->layers[i], *relu = &m->layers[i + 1], *conv = &m->layers[i + 2];
    const LayerPlan *p = &m->plan->layers[i];
    int ok = bn->kind == LAYER_BATCHNORM && p[0].act == BN_ACT_RELU && p[0].add_layer < 0 && p[0].pool_layer < 0 &&
             relu->kind == LAYER_RELU && relu->in == bn->out && p[1].by_producer && plan_ungrouped_conv(conv) &&
             conv->in == relu->out && !p[2].input_form && m->plan->acts[relu->out].consumers == 1;
    return ok ? i + 2 : -1;
}

/* A plain conv (no bias, no fused epilogue or pool) in the norm's checkpoint
 * block (whose input its backward reads), past the frozen layers; the norm's
 * input gradient written, not added to. */
int plan_dbn_conv(const Model *m, int i) {
    int j = plan_norm_relu_conv(m, i);
    if (j < 0) return -1;
    const Layer *bn = &m->layers[i], *conv = &m->layers[j];
    const LayerPlan *pc = &m->plan->layers[j];
    int ok = !conv->b_count && !pc->bias_relu && !conv->whitening && pc->pool_layer < 0 && bn->block == conv->block &&
             bn->in > 0 && i >= m->frozen_layers && !m->plan->layers[i].dx_accumulate[0];
    return ok ? j : -1;
}

/* ---- the gradients' accumulation and buffers -------------------------------- */

static int group_of(int *parent, int a) {
    while (parent[a] != a) a = parent[a] = parent[parent[a]];
    return a;
}

static void join_groups(int *parent, int a, int b) { parent[group_of(parent, a)] = group_of(parent, b); }

void plan_count_readers(const Model *g, int *readers) {
    memset(readers, 0, sizeof(int) * (size_t)g->n_acts);
    for (int i = 0; i < g->n_layers; i++) {
        readers[g->layers[i].in]++;
        if (g->layers[i].in2 >= 0) readers[g->layers[i].in2]++;
    }
}

/* An activation that feeds several layers gets the sum of their gradients:
 * backward meets its consumers latest first; the first writes the gradient,
 * the others add to it. Only the input image (activation 0) needs none. */
static void plan_accumulation(Model *m) {
    layers_check_flattens(m, m->nhwc);
    int written[MODEL_MAX_ACTS] = {0}, readers[MODEL_MAX_ACTS];
    plan_count_readers(m, readers);
    for (int a = 0; a < m->n_acts; a++) m->plan->acts[a].consumers = readers[a];
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const Layer *l = &m->layers[i];
        LayerPlan *p = &m->plan->layers[i];
        int ins[2] = {l->in, l->in2};
        for (int k = 0; k < 2; k++) {
            p->dx_accumulate[k] = p->dx_alias[k] = 0;
            if (ins[k] <= 0) continue;
            p->dx_accumulate[k] = written[ins[k]];
            written[ins[k]] = 1;
            if (p->dx_accumulate[k] && !layer_kinds[l->kind].adds_dx)
                TC_FATAL("layer %d: its input feeds several layers, and this kind of layer cannot add its "
                         "gradient to theirs", i);
        }
        /* ... nor may what it shares its storage with (a flatten's input) */
        for (int id = l->in; l->kind == LAYER_RELU && id >= 0; id = m->plan->acts[id].shares_with)
            if (m->plan->acts[id].consumers > 1)
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
    const Layer *l = &m->layers[i];
    LayerPlan *p = &m->plan->layers[i];
    int ins[2] = {l->in, l->in2};
    int shared = -1; /* the aliased input that feeds other layers */
    for (int k = 0; k < 2; k++) {
        if (ins[k] <= 0 || p->dx_accumulate[k]) continue;
        int fan_out = m->plan->acts[ins[k]].consumers > 1;
        if (fan_out && shared >= 0) continue;
        if (fan_out) {
            int other = ins[1 - k], later = last_consumer_other_than(m, ins[k], i);
            if (other > 0 && !p->dx_accumulate[1 - k] && producer(m, other) < later) continue;
            shared = k;
        }
        p->dx_alias[k] = 1;
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
        if ((l->kind == LAYER_RELU || (l->kind == LAYER_GELU && m->plan->layers[i].by_producer)) && l->in > 0)
            join_groups(parent, l->in, l->out);
        if (l->kind == LAYER_FLATTEN && l->in > 0 && m->plan->acts[l->in].consumers == 1) /* its backward: nothing */
            join_groups(parent, l->in, l->out);
        if (l->kind == LAYER_ADD) plan_add_aliases(m, i, parent);
        /* A norm whose backward the conv after it may run (dx made over dz, in place); apart, it runs in place. */
        if (m->fuse_graphs && plan_dbn_conv(m, i) >= 0) join_groups(parent, l->in, l->out);
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
        if (m->plan->acts[a].grad_in_value) in_value[g] = 1;
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
    m->plan->acts[0].grad_slot = -1;
    for (int a = 1; a < m->n_acts; a++) m->plan->acts[a].grad_slot = slot_of[group_of(parent, a)];
}

/* ---- model.fuse's fusions ------------------------------------------------------ */

/* Activation id is written over the storage of `into`, which is kept where id is (a block's output). */
static void share_storage(Model *m, int id, int into) {
    m->plan->acts[id].shares_with = into;
    if (m->plan->acts[id].recompute_block < 0) m->plan->acts[into].recompute_block = -1;
}

/* A batch norm's pass, or a whitening convolution's (ops/conv_bias_gelu),
 * writes the GELU after it over the layer's own output: the GELU's output
 * shares that storage and (plan_grad_slots) gradient, as an in-place ReLU's
 * does, and is kept where either is a block's output. */
static void fuse_gelu(Model *m, int i) {
    const Layer *l = &m->layers[i], *gelu = &m->layers[i + 1];
    m->plan->layers[i].act = BN_ACT_GELU;
    m->plan->layers[i + 1].by_producer = 1;
    share_storage(m, gelu->out, l->out);
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
        const Layer *bn = &m->layers[i], *add = &m->layers[i + 1];
        LayerPlan *p = &m->plan->layers[i];
        if (bn->kind != LAYER_BATCHNORM || add->kind != LAYER_ADD || p->act != BN_ACT_NONE) continue;
        if ((add->in != bn->out && add->in2 != bn->out) || m->plan->acts[bn->out].consumers != 1) continue;
        p->add_layer = i + 1;
        m->plan->layers[i + 1].add_by_bn = 1;
        share_storage(m, add->out, bn->out);
    }
}

/* A conv + bias + ReLU + 2x2 max-pool reading the input image takes its ReLU
 * and pool into one op on the GPU where ops/conv_bias_relu_pool takes the
 * shape (the conv's output never stored); the log says which way it went. */
static void fuse_first_block(Model *m, int i) {
    const Layer *conv = &m->layers[i], *pool = &m->layers[i + 2];
    if (m->device != DEVICE_CUDA || conv->in != 0) return;
    ConvBiasReluPoolShape s = first_block_shape(m, conv);
    const char *why;
    if (!conv_bias_relu_pool_supported(&m->ops, &s, &why)) {
        log_info("%s + ReLU + %s: apart (conv_bias_relu_pool: %s)", conv->name, pool->name, why);
        return;
    }
    m->plan->layers[i].pool_layer = i + 2;
    m->plan->layers[i].bias_by_pool = 0;
    m->plan->layers[i + 2].pool_by_conv = 1;
    m->plan->acts[conv->out].unstored = 1;
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
        const Layer *bn = &m->layers[i], *relu = &m->layers[i + 1], *pool = &m->layers[i + 2];
        if (bn->kind != LAYER_BATCHNORM || m->plan->layers[i].act != BN_ACT_RELU || relu->kind != LAYER_RELU ||
            relu->in != bn->out || pool->kind != LAYER_MAXPOOL || pool->in != relu->out ||
            m->plan->acts[relu->out].consumers != 1)
            continue;
        if (!batchnorm_pool_supported(&m->ops, &pool->pool.shape)) {
            log_info("%s + ReLU + %s: apart (the pool's channels-last kernels do not take it)", bn->name,
                     pool->name);
            continue;
        }
        m->plan->layers[i].pool_layer = i + 2;
        m->plan->layers[i + 2].pool_by_bn = 1;
        m->plan->acts[bn->out].unstored = m->plan->acts[relu->out].unstored = 1;
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
    LayerPlan *p = m->plan->layers;
    for (int i = 0; i + 1 < m->n_layers; i++) {
        const Layer *l = &m->layers[i], *relu = &m->layers[i + 1];
        if (relu->in != l->out || m->plan->acts[l->out].consumers != 1) continue;
        if (takes_gelu(l) && relu->kind == LAYER_GELU) fuse_gelu(m, i);
        if (relu->kind != LAYER_RELU || !(layer_kinds[l->kind].takes_relu & TAKES_RELU_TRAINING)) continue;
        if (l->kind == LAYER_BATCHNORM) p[i].act = BN_ACT_RELU, p[i + 1].by_producer = 1;
        if (l->kind == LAYER_ADD) p[i].add_relu = p[i + 1].by_producer = 1;
        if (l->kind != LAYER_CONV || !l->b_count) continue;
        const Layer *conv = l, *pool = i + 2 < m->n_layers ? &m->layers[i + 2] : NULL;
        if (pool && pool->kind == LAYER_MAXPOOL && pool->in == relu->out && m->plan->acts[relu->out].consumers == 1 &&
            pool2d_window(&pool->pool.shape) == 2 && pool2d_stride(&pool->pool.shape) == 2 && !pool->pool.shape.pad &&
            pool->pool.shape.h % 2 == 0 && pool->pool.shape.w % 2 == 0) {
            p[i].bias_relu = p[i + 1].by_producer = p[i].bias_by_pool = 1;
            p[i + 2].bias_layer = i;
            m->plan->acts[conv->out].grad_in_value = m->plan->acts[relu->out].grad_in_value = 1;
            fuse_first_block(m, i);
        } else if (m->device == DEVICE_CUDA) { /* conv + bias + ReLU alone has no CPU path */
            p[i].bias_relu = p[i + 1].by_producer = 1;
        }
    }
    fuse_bn_adds(m);
    fuse_bn_pools(m);
}

void plan_layers(Model *m) {
    plan_destroy(m);
    m->plan = plan_new();
    for (int a = 0; a < m->n_acts; a++) {
        m->plan->acts[a].shares_with = m->acts[a].shares_with;
        m->plan->acts[a].recompute_block = m->acts[a].internal_to;
    }
    plan_accumulation(m);
    if (m->fuse) mark_fusions(m);
    plan_grad_slots(m);
}

/* ---- the input image's forms ------------------------------------------------- */

static int takes_input_form(const Model *m, int i) {
    const Layer *l = &m->layers[i];
    const LayerPlan *p = &m->plan->layers[i];
    return m->fuse && m->device == DEVICE_CUDA && m->nhwc && l->kind == LAYER_CONV && l->in == 0 && !p->bias_relu &&
           !l->whitening && p->pool_layer < 0 && conv2d_groups(&l->conv.shape) == 1; /* the forms regroup channels */
}

/* The copy of the image into the form that the step will run: from the
 * float32 batch where the convolution alone reads the image (plan_input_forms
 * leaves the image unstored then), else from the image. */
static int copies_from_batch(const Model *m) { return m->plan->acts[0].consumers == 1; }

#if TRAINC_CUDA
typedef struct {
    const Model *m;
    const SpaceToDepthShape *image;
    const void *x;
    void *y;
} ImageCopy;

static void run_image_copy(void *arg) {
    const ImageCopy *c = arg;
    if (copies_from_batch(c->m)) space_to_depth_from_f32_nchw(&c->m->ops, c->image, c->x, c->y);
    else space_to_depth_forward(&c->m->ops, c->image, c->x, c->y);
}

/* Microseconds per copy of the image into the form, on buffers of its own. */
static float image_copy_us(const Model *m, const SpaceToDepthShape *image) {
    size_t pixels = (size_t)image->n * image->h * image->w;
    size_t in_bytes = copies_from_batch(m) ? pixels * image->c_used * sizeof(float)
                                           : pixels * image->c * dtype_size(m->act_dtype);
    size_t out_bytes = space_to_depth_out_count(image) * dtype_size(m->act_dtype);
    const char *error;
    void *x = gpu_try_malloc(in_bytes, &error), *y = x ? gpu_try_malloc(out_bytes, &error) : NULL;
    if (!y) TC_FATAL("timing the input convolution's forms: %s (%.1f MiB)", error, (in_bytes + out_bytes) / 1048576.0);
    op_fill_random(&m->ops, x, in_bytes);
    ImageCopy copy = {m, image, x, y};
    float us = 1000.0f * backend_graph_time_ms(m->ops.cudnn, run_image_copy, &copy, BACKEND_GRAPH_TIMING_RUNS);
    conv_policy_agree(&m->conv_policy, &us, 1);
    gpu_free(x);
    gpu_free(y);
    return us;
}
#else
static float image_copy_us(const Model *m, const SpaceToDepthShape *image) {
    (void)m, (void)image;
    gpu_unavailable(__func__);
}
#endif

/* Forward and filter gradient, as conv2d_init timed them (0: not timed). */
static float conv_us(const Model *m, const Conv2d *c) {
    float fwd = conv2d_timed_us(&m->ops, c, CONV2D_FORWARD), filter = conv2d_timed_us(&m->ops, c, CONV2D_FILTER);
    return fwd > 0 && filter > 0 ? fwd + filter : 0;
}

/* Form block of layer l, initialized and timed with its copy; NULL where it does not fit. */
static ConvInputForm *form_new(Model *m, const Layer *l, int block, float *us) {
    ConvInputForm *f = calloc(1, sizeof *f);
    if (!f) TC_FATAL("out of host memory planning %s's input forms", l->name);
    Conv2dShape inner;
    const char *why;
    if (!space_to_depth_conv(&l->conv.shape, m->acts[l->in].c_real, block, &f->image, &f->filter, &inner, &why)) {
        free(f);
        return NULL;
    }
    conv2d_init(&m->ops, &f->conv, &inner, &m->conv_policy);
    char chosen[400];
    conv2d_describe(&m->ops, &f->conv, chosen, sizeof chosen);
    log_info("%s on block %d's form, %dx%dx%dx%d k%d %dx%d: %s", l->name, block, inner.n, inner.c, inner.h, inner.w,
             inner.k, inner.r, inner.s, chosen);
    float conv = conv_us(m, &f->conv);
    *us = conv > 0 ? conv + image_copy_us(m, &f->image) : 0;
    return f;
}

static void form_free(const Model *m, ConvInputForm *f) {
    if (!f) return;
    conv2d_destroy(&m->ops, &f->conv);
    free(f);
}

static void grow_workspace(Model *m, const ConvInputForm *f) {
    size_t bytes = conv2d_workspace_bytes(&m->ops, &f->conv);
    if (bytes > m->workspace_bytes) m->workspace_bytes = bytes;
}

static void plan_layer(Model *m, int index) {
    const Layer *l = &m->layers[index];
    LayerPlan *p = &m->plan->layers[index];
    float direct = conv_us(m, &l->conv), us[3] = {0, 0, 0};
    if (m->input_form_block) { /* tests: that form, untimed */
        p->input_form = form_new(m, l, m->input_form_block, &us[0]);
        log_info("layer %d %s: block %d form %s (Model.input_form_block)", index, l->name, m->input_form_block,
                 p->input_form ? "taken" : "does not fit");
        if (p->input_form) grow_workspace(m, p->input_form);
        return;
    }
    if (!m->conv_policy.benchmark || direct <= 0) {
        log_info("layer %d %s: over the image itself (its other forms are chosen by timing: perf.conv_benchmark off)",
                 index, l->name);
        return;
    }
    ConvInputForm *best = NULL;
    float best_us = direct;
    for (int block = 1; block <= 2; block++) {
        ConvInputForm *f = form_new(m, l, block, &us[block]);
        if (f && us[block] > 0 && us[block] < best_us) {
            form_free(m, best);
            best = f, best_us = us[block];
        } else {
            form_free(m, f);
        }
    }
    p->input_form = best;
    log_info("layer %d %s: %s; forward + filter gradient %.1f us over the image, %.1f us over the channels that "
             "carry data, %.1f us over 2x2 squares (0: does not fit)",
             index, l->name,
             !best ? "over the image itself" : best->image.block == 2 ? "over 2x2 squares of the image (space to depth)"
                                                                     : "over the image's channels that carry data",
             direct, us[1], us[2]);
    if (best) grow_workspace(m, best);
}

/* Where the convolution alone reads the image, the batch goes into the form
 * straight from the loader's float32 (input_form_copy): the image itself is
 * never stored. */
void plan_input_forms(Model *m) {
    for (int i = 0; i < m->n_layers; i++) {
        if (!takes_input_form(m, i)) continue;
        plan_layer(m, i);
        if (m->plan->layers[i].input_form && copies_from_batch(m)) m->plan->acts[0].unstored = 1;
    }
}

void plan_carve(Model *m, Arena *a) {
    size_t esize = dtype_size(m->act_dtype);
    for (int i = 0; i < m->n_layers; i++) {
        ConvInputForm *f = m->plan->layers[i].input_form;
        if (!f) continue;
        f->x = arena_alloc(a, space_to_depth_out_count(&f->image) * esize, "input convolution's image form");
        f->w = arena_alloc(a, space_to_depth_out_count(&f->filter) * esize, "input convolution's filter form");
        f->dw = arena_alloc(a, space_to_depth_out_count(&f->filter) * esize,
                            "input convolution's filter form gradient");
    }
}

