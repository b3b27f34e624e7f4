/* Running a model: each kind of layer's forward and backward (layer_kinds),
 * each a few calls to op faces on m->ops, and the passes over the layers. */
#include "models/layers.h"

#include "ops/add.h"
#include "ops/avgpool.h"
#include "ops/bias_relu.h"
#include "ops/bias_relu_pool.h"
#include "ops/cast.h"
#include "ops/concat.h"
#include "ops/dropout.h"
#include "ops/gelu.h"
#include "ops/relu.h"
#include "ops/scale.h"
#include "ops/silu.h"
#include "runtime/check.h"
#include "runtime/gpu.h"

/* What a layer's ops read and write, from the model's buffers. */
static const void *x_of(const Model *m, const Layer *l) { return m->acts[l->in].value; }
static void *y_of(const Model *m, const Layer *l) { return m->acts[l->out].value; }
static const void *w_of(const Model *m, const Layer *l) { return element(m, m->weights, l->w_off); }
static const void *b_of(const Model *m, const Layer *l) {
    return l->b_count ? element(m, m->weights, l->b_off) : NULL;
}
static size_t n_of(const Model *m, const Layer *l) { return act_floats(m, l->out); }
/* A batch norm's scale and bias where a conv applies it as its prologue (model.fuse = graphs). */
static void *bn_scale_of(const Model *m, const Layer *bn) { return element(m, m->bn_coef, bn->stat_off); }
static void *bn_bias_of(const Model *m, const Layer *bn) {
    return element(m, m->bn_coef, bn->stat_off + (size_t)bn->bn.shape.c);
}

static BatchNormParams bn_params(const Model *m, const Layer *l);

/* ---- convolution: fused, the bias and the ReLU after it (bias_relu), or in
 * the max-pool after it (bias_by_pool); the input's, with the ReLU and the
 * max-pool too (pool_layer: conv_bias_relu_pool), or on copies of the image
 * and filters in another form (input_form); a whitening one, the bias and the
 * GELU after it (conv_bias_gelu); under model.fuse = graphs, the next batch
 * norm's sums (genstats), the previous one's apply + ReLU (prologue_bn) and
 * their backward (dgrad_dbn) ---- */

/* A convolution over a form of the input image (plan_input_forms): its forward copies the image x (NULL:
 * unstored, the batch from m->input_f32) and its filters w into the form, then runs its convolution (conv2d or
 * conv_genstats) on the copies; its backward (the image takes no gradient) runs over the copies and folds the
 * form's filter gradient back. */
static void input_form_copy(Model *m, const ConvInputForm *f, const void *x, const void *w) {
    if (x) space_to_depth_forward(&m->ops, &f->image, x, f->x);
    else space_to_depth_from_f32_nchw(&m->ops, &f->image, m->input_f32, f->x); /* the image unstored */
    space_to_depth_forward(&m->ops, &f->filter, w, f->w);
}

static void input_form_backward(Model *m, const ConvInputForm *f, const void *dy, void *dw, void *db) {
    conv2d_backward(&m->ops, &f->conv, f->x, f->w, dy, NULL, f->dw, db, 0); /* f->dw overwritten */
    space_to_depth_backward(&m->ops, &f->filter, f->dw, dw);
}

static void conv_forward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    const Conv2dShape *s = &l->conv.shape;
    if (lp->pool_layer >= 0) {
        ConvBiasReluPoolShape fs = first_block_shape(m, l);
        conv_bias_relu_pool_forward(&m->ops, &fs, x_of(m, l), w_of(m, l), b_of(m, l),
                                    y_of(m, &m->layers[lp->pool_layer]));
        return;
    }
    if (lp->act == BN_ACT_GELU) {
        ConvBiasGeluShape ws = whitening_shape(m, l);
        conv_bias_gelu_forward(&m->ops, &ws, x_of(m, l), w_of(m, l), b_of(m, l), y_of(m, l));
        return;
    }
    const void *x = x_of(m, l), *w = w_of(m, l);
    const Conv2d *conv = &l->conv;
    if (lp->input_form) { /* what follows runs on the copies */
        input_form_copy(m, lp->input_form, x, w);
        x = lp->input_form->x, w = lp->input_form->w, conv = &lp->input_form->conv;
    }
    if (lp->genstats && m->training) { /* and the sums the batch norm after it takes (model.fuse = graphs) */
        float *sum = m->bn_sums + lp->sums_off;
        const void *scale = NULL, *bias = NULL;
        if (lp->prologue_bn >= 0) { /* the batch norm + ReLU before it, applied to the norm's input */
            const Layer *bn = &m->layers[lp->prologue_bn];
            x = x_of(m, bn), scale = bn_scale_of(m, bn), bias = bn_bias_of(m, bn);
        }
        conv_genstats_forward(&m->ops, lp->genstats, x, scale, bias, w, y_of(m, l), sum, sum + s->k);
        return;
    }
    conv2d_forward(&m->ops, conv, x, w, lp->bias_relu ? NULL : b_of(m, l), y_of(m, l));
    if (lp->bias_relu && !lp->bias_by_pool)
        bias_relu_forward(&m->ops, b_of(m, l), y_of(m, l), s->n, s->k, conv2d_out_h(s) * conv2d_out_w(s));
}

/* perf.overlap_wgrad: a convolution's filter gradient runs in the context
 * wgrad_fork returns, the side stream's (waiting first for what the compute
 * stream has queued: dy is final), while the compute stream goes on with the
 * layers before it; wgrad_forked marks it pending, and model_backward joins
 * it back (layer_wgrad_join) before the next layer that layer_joins_wgrad names.
 * Off, the context is the model's own and nothing forks. */
static OpContext wgrad_fork(Model *m) {
    OpContext side = m->ops;
    if (!m->overlap_wgrad) return side;
    side.stream = m->gpu->side;
    gpu_event_record(m->wgrad_fork_event, m->ops.stream);
    gpu_wait_event(side.stream, m->wgrad_fork_event);
    gpu_cudnn_stream(side.cudnn, side.stream);
    return side;
}

static void wgrad_forked(Model *m) {
    if (!m->overlap_wgrad) return;
    gpu_cudnn_stream(m->ops.cudnn, m->ops.stream);
    gpu_event_record(m->wgrad_done_event, m->gpu->side);
    m->wgrad_pending = 1;
}

int layer_joins_wgrad(const Layer *l) {
    return l->kind != LAYER_BATCHNORM && l->kind != LAYER_RELU && l->kind != LAYER_ADD;
}

/* Which of a convolution's gradients its backward adds to (conv2d's accumulate): dx where its input
 * feeds another layer too, dw unless the gradients were just zeroed. */
static int conv_accumulate(const Model *m, const Layer *l, int dx) {
    const LayerPlan *lp = plan_of(m, l);
    return (dx && lp->dx_accumulate[0] ? CONV2D_ADD_DX : 0) | (m->grads_zeroed ? 0 : CONV2D_ADD_DW);
}

/* The filter gradient, and the bias's, beside on the side stream under
 * perf.overlap_wgrad; through the prologue from the norm's input where the conv applies one. */
static void conv_filter_backward(Model *m, const Layer *l, const void *dy, void *dw, void *db) {
    const LayerPlan *lp = plan_of(m, l);
    OpContext filter_ctx = wgrad_fork(m);
    if (lp->prologue_bn >= 0) {
        const Layer *bn = &m->layers[lp->prologue_bn];
        conv_genstats_backward_filter(&filter_ctx, lp->genstats, x_of(m, bn), bn_scale_of(m, bn),
                                      bn_bias_of(m, bn), dy, dw, !m->grads_zeroed);
    } else {
        conv2d_backward(&filter_ctx, &l->conv, x_of(m, l), w_of(m, l), dy, NULL, dw, db, conv_accumulate(m, l, 0));
    }
    wgrad_forked(m);
}

/* The data gradient with the batch norm + ReLU before the conv's backward:
 * the norm's input gradient and its parameters'. Its own workspace where
 * the filter gradient may run beside it. */
static void conv_dgrad_dbn_layer_backward(Model *m, const Layer *l, const void *dy) {
    const LayerPlan *lp = plan_of(m, l);
    const Layer *bn = &m->layers[lp->dbn_layer];
    BatchNormParams p = bn_params(m, bn);
    OpContext ctx = m->ops;
    if (m->dgrad_dbn_workspace) ctx.workspace = m->dgrad_dbn_workspace;
    conv_dgrad_dbn_backward(&ctx, lp->dgrad_dbn, w_of(m, l), dy, x_of(m, bn), &p, grad_of(m, bn->in),
                            plan_of(m, bn)->dx_accumulate[0], element(m, m->grads, bn->w_off),
                            element(m, m->grads, bn->b_off));
}

static void conv_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    const OpContext *ctx = &m->ops;
    void *dy = grad_of(m, l->out), *dx = grad_of(m, l->in), *dw = element(m, m->grads, l->w_off);
    void *db = l->b_count ? element(m, m->grads, l->b_off) : NULL;
    if (lp->pool_layer >= 0) { /* the input's: no dx */
        ConvBiasReluPoolShape fs = first_block_shape(m, l);
        conv_bias_relu_pool_backward(ctx, &fs, x_of(m, l), w_of(m, l), b_of(m, l),
                                     grad_of(m, m->layers[lp->pool_layer].out), dw, db);
        return;
    }
    if (l->whitening) { /* its weights never train and its input is the data: the bias alone */
        ConvBiasGeluShape ws = whitening_shape(m, l);
        if (lp->act == BN_ACT_GELU) /* dy is the GELU's output's */
            conv_bias_gelu_backward(ctx, &ws, x_of(m, l), w_of(m, l), b_of(m, l), dy, db);
        else
            conv2d_bias_grad(ctx, &l->conv, dy, db);
        return;
    }
    if (lp->input_form) {
        input_form_backward(m, lp->input_form, dy, dw, db);
        return;
    }
    if (lp->dgrad_dbn) { /* the filter gradient first, so that under overlap_wgrad the two run side by side */
        conv_filter_backward(m, l, dy, dw, db);
        conv_dgrad_dbn_layer_backward(m, l, dy);
        return;
    }
    /* the data gradient here, the filter's beside */
    if (lp->prologue_bn >= 0 || (!lp->bias_relu && m->overlap_wgrad)) {
        conv2d_backward(ctx, &l->conv, x_of(m, l), w_of(m, l), dy, dx, NULL, NULL, conv_accumulate(m, l, 1));
        conv_filter_backward(m, l, dy, dw, db);
        return;
    }
    if (!lp->bias_relu) {
        conv2d_backward(ctx, &l->conv, x_of(m, l), w_of(m, l), dy, dx, dw, db, conv_accumulate(m, l, 1));
        return;
    }
    /* The fused ReLU's backward, in place (the max-pool did it under bias_by_pool), then the bias and the
     * convolution. */
    if (!lp->bias_by_pool) relu_backward(ctx, y_of(m, l), dy, dy, n_of(m, l));
    conv2d_bias_grad(ctx, &l->conv, dy, db);
    conv2d_backward(ctx, &l->conv, x_of(m, l), w_of(m, l), dy, dx, dw, NULL, conv_accumulate(m, l, 1));
}

/* ---- ReLU: in place; fused, done by the layer before it (or the max-pool after it) ---- */

static void relu_layer_forward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    if (!lp->by_producer) relu_forward(&m->ops, x_of(m, l), y_of(m, l), n_of(m, l));
}

static void relu_layer_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    void *dx = grad_of(m, l->in);
    if (dx && !lp->by_producer) relu_backward(&m->ops, y_of(m, l), grad_of(m, l->out), dx, n_of(m, l));
}

/* ---- GELU: backward reads its input; fused, done by the layer before it (a batch norm, the whitening conv) ---- */

static void gelu_layer_forward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    if (!lp->by_producer) gelu_forward(&m->ops, x_of(m, l), y_of(m, l), n_of(m, l));
}

static void gelu_layer_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    void *dx = grad_of(m, l->in);
    if (dx && !lp->by_producer) gelu_backward(&m->ops, x_of(m, l), grad_of(m, l->out), dx, n_of(m, l));
}

/* ---- max-pool: fused, it adds its conv's bias and applies the ReLU first; by_conv, the conv does it all;
 * by_bn, the batch norm before its ReLU runs its forward ---- */

/* A fused max-pool's bias: its conv's, in the weights the layers read. */
static const void *pool_bias(const Model *m, const Layer *pool) {
    return element(m, m->weights, m->layers[plan_of(m, pool)->bias_layer].b_off);
}

static void maxpool_layer_forward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    if (lp->pool_by_conv || lp->pool_by_bn) return;
    if (lp->bias_layer >= 0) bias_relu_pool_forward(&m->ops, &l->pool.shape, x_of(m, l), pool_bias(m, l), y_of(m, l));
    else maxpool_forward(&m->ops, &l->pool, x_of(m, l), y_of(m, l));
}

static void maxpool_layer_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    void *dx = grad_of(m, l->in), *dy = grad_of(m, l->out);
    if (lp->pool_by_conv) return;
    if (dx && lp->bias_layer >= 0)
        bias_relu_pool_backward(&m->ops, &l->pool.shape, x_of(m, l), pool_bias(m, l), dy, dx);
    else if (dx) maxpool_backward(&m->ops, &l->pool, x_of(m, l), y_of(m, l), dy, dx);
}

/* ---- linear ---- */

static void linear_layer_forward(Model *m, const Layer *l) {
    linear_forward(&m->ops, &l->linear, x_of(m, l), w_of(m, l), b_of(m, l), y_of(m, l));
}

static void linear_layer_backward(Model *m, const Layer *l) {
    void *db = l->b_count ? element(m, m->grads, l->b_off) : NULL;
    linear_backward(&m->ops, &l->linear, x_of(m, l), w_of(m, l), grad_of(m, l->out), grad_of(m, l->in),
                    element(m, m->grads, l->w_off), db);
}

/* ---- batch norm: in training, the batch's statistics (over every rank with
 * dist.sync_bn; from its conv's sums under model.fuse = graphs, and there,
 * where the conv after it applies it, only its scale and bias); in
 * evaluation, the running ones; fused, the add after it (add_layer) or the
 * max-pool after its ReLU (pool_layer) in its pass ---- */

static BatchNormMode bn_mode(const Model *m) {
    if (!m->training) return BN_EVAL;
    return m->bn_allreduce ? BN_TRAIN_SYNC : BN_TRAIN;
}

/* A layer's batch-norm buffers: gamma and beta from the fp32 masters. */
static BatchNormParams bn_params(const Model *m, const Layer *l) {
    BatchNormParams p = {0};
    p.gamma = m->params + l->w_off;
    p.beta = m->params + l->b_off;
    p.running_mean = m->bn_running + l->stat_off;
    p.running_var = p.running_mean + l->bn.shape.c;
    p.save_mean = m->bn_saved + l->stat_off;
    p.save_invstd = p.save_mean + l->bn.shape.c;
    /* A checkpointed block's second forward must not count its batch twice. */
    p.momentum = m->recomputing ? 0.0f : m->bn_momentum;
    p.eps = m->bn_eps;
    p.reduce = m->bn_allreduce;
    p.reduce_ctx = m->bn_allreduce_ctx;
    return p;
}

static void batchnorm_layer_forward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    BatchNormParams p = bn_params(m, l);
    BatchNormMode mode = bn_mode(m);
    BatchNormAct act = lp->act;
    void *y = y_of(m, l);
    if (lp->stats_by_conv && mode == BN_TRAIN) { /* the statistics from the sums its conv made */
        const BatchNormShape *s = &l->bn.shape;
        const float *sum = m->bn_sums + l->stat_off;
        int prologue = lp->by_conv_prologue; /* the conv after it applies it: its scale and bias alone */
        bn_finalize(&m->ops, s->c, (int64_t)s->n * s->h * s->w, sum, sum + s->c, &p,
                    prologue ? bn_scale_of(m, l) : NULL, prologue ? bn_bias_of(m, l) : NULL);
        if (prologue) return;
        mode = BN_TRAIN_SAVED;
    }
    if (lp->add_layer >= 0) { /* the add after it (and its ReLU), in this pass */
        const Layer *add = &m->layers[lp->add_layer];
        p.residual = m->acts[add->in == l->out ? add->in2 : add->in].value;
        act = plan_of(m, add)->add_relu ? BN_ACT_RELU : BN_ACT_NONE;
        y = y_of(m, add);
    }
    if (lp->pool_layer >= 0) { /* the ReLU's max-pool, in this pass */
        p.pool = &m->layers[lp->pool_layer].pool;
        y = y_of(m, &m->layers[lp->pool_layer]);
    }
    batchnorm_forward(&m->ops, &l->bn, mode, act, &p, x_of(m, l), y);
}

/* The ReLU of an add that its batch norm computes runs in the norm's backward
 * (BN_ACT_ADD_RELU) where both of the add's inputs take dy's buffer itself as
 * their gradient: the norm, the next layer backward, masks that buffer in
 * place before any other layer reads it. */
static int relu_in_bn_backward(const Model *m, const Layer *add) {
    if (!plan_of(m, add)->add_by_bn || !plan_of(m, add)->add_relu) return 0;
    int ins[2] = {add->in, add->in2};
    for (int k = 0; k < 2; k++)
        if (ins[k] > 0 && !plan_of(m, add)->dx_alias[k]) return 0;
    return 1;
}

static void batchnorm_layer_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    if (lp->backward_by_conv) return;
    BatchNormParams p = bn_params(m, l);
    BatchNormAct act = lp->act;
    const void *y = lp->by_conv_prologue ? NULL : y_of(m, l); /* never written: the ReLU's mask recomputed */
    if (lp->by_conv_prologue) p.relu_coef = bn_scale_of(m, l); /* as the prologue computed it: scale, then bias */
    void *dy = grad_of(m, l->out), *dgamma = element(m, m->grads, l->w_off), *dbeta = element(m, m->grads, l->b_off);
    if (lp->add_layer >= 0 && relu_in_bn_backward(m, &m->layers[lp->add_layer])) {
        act = BN_ACT_ADD_RELU;
        y = y_of(m, &m->layers[lp->add_layer]);
        p.dy_masked = dy;
    }
    batchnorm_backward(&m->ops, &l->bn, bn_mode(m), act, &p, x_of(m, l), y, dy, grad_of(m, l->in),
                       lp->dx_accumulate[0], dgamma, dbeta);
}

/* ---- add: fused, the ReLU after it; by_bn, the batch norm before it does both (and, with
 * relu_in_bn_backward, the ReLU's backward) ---- */

static void add_layer_forward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    if (lp->add_by_bn) return;
    const void *b = m->acts[l->in2].value;
    if (lp->add_relu) add_relu_forward(&m->ops, x_of(m, l), b, y_of(m, l), n_of(m, l));
    else add_forward(&m->ops, x_of(m, l), b, y_of(m, l), n_of(m, l));
}

/* An add passes dy to each input: as the input's own buffer (alias), copied,
 * or added to what another layer wrote there. */
static void add_layer_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    const OpContext *ctx = &m->ops;
    int ins[2] = {l->in, l->in2};
    void *dy = grad_of(m, l->out);
    size_t n = n_of(m, l);
    /* The fused ReLU's backward first, in place (y is the ReLU's output), unless its batch norm's does it. */
    if (lp->add_relu && !relu_in_bn_backward(m, l)) relu_backward(ctx, y_of(m, l), dy, dy, n);
    for (int k = 0; k < 2; k++) {
        void *dx = grad_of(m, ins[k]);
        if (!dx || lp->dx_alias[k]) continue;
        if (lp->dx_accumulate[k]) add_accumulate(ctx, dx, dy, n);
        else op_copy(ctx, dx, dy, n * dtype_size(m->act_dtype));
    }
}

/* ---- average pooling: global, or over windows (model_avgpool2d) ---- */

static int windowed(const Layer *l) { return l->pool.shape.n > 0; }

static void avgpool_layer_forward(Model *m, const Layer *l) {
    const Activation *a = &m->acts[l->in];
    if (windowed(l)) avgpool2d_forward(&m->ops, &l->pool.shape, x_of(m, l), y_of(m, l));
    else avgpool_forward(&m->ops, x_of(m, l), y_of(m, l), m->batch, a->c, a->h * a->w);
}

static void avgpool_layer_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    const Activation *a = &m->acts[l->in];
    void *dx = grad_of(m, l->in), *dy = grad_of(m, l->out);
    if (dx && windowed(l)) avgpool2d_backward(&m->ops, &l->pool.shape, dy, dx, lp->dx_accumulate[0]);
    else if (dx) avgpool_backward(&m->ops, dy, dx, lp->dx_accumulate[0], m->batch, a->c, a->h * a->w);
}

/* ---- a constant factor ---- */

static void scale_layer_forward(Model *m, const Layer *l) { scale_forward(&m->ops, x_of(m, l), y_of(m, l), n_of(m, l), l->scale); }

static void scale_layer_backward(Model *m, const Layer *l) {
    void *dx = grad_of(m, l->in);
    if (dx) scale_backward(&m->ops, grad_of(m, l->out), dx, n_of(m, l), l->scale);
}

/* ---- SiLU: backward reads its input ---- */

static void silu_layer_forward(Model *m, const Layer *l) { silu_forward(&m->ops, x_of(m, l), y_of(m, l), n_of(m, l)); }

static void silu_layer_backward(Model *m, const Layer *l) {
    void *dx = grad_of(m, l->in);
    if (dx) silu_backward(&m->ops, x_of(m, l), grad_of(m, l->out), dx, n_of(m, l));
}

/* dy passed on to dx unchanged (dropout in evaluation, a flatten whose gradient has a buffer of its own):
 * copied, or added to what another reader of the input wrote there. */
static void pass_gradient(Model *m, const Layer *l, const void *dy, void *dx) {
    const LayerPlan *lp = plan_of(m, l);
    if (lp->dx_accumulate[0]) add_accumulate(&m->ops, dx, dy, n_of(m, l));
    else op_copy(&m->ops, dx, dy, n_of(m, l) * dtype_size(m->act_dtype));
}

/* ---- dropout: in training the mask of (the seed and step on the device, the layer), regenerated by backward
 * and by a checkpointed block's recompute; in evaluation the identity ---- */

static DropoutShape dropout_shape(const Model *m, const Layer *l) {
    const Activation *a = &m->acts[l->in];
    return (DropoutShape){m->batch, a->c, a->h * a->w};
}

static DropoutMask dropout_mask(const Model *m, const Layer *l) {
    return (DropoutMask){(uint32_t)(l - m->layers), l->drop};
}

static void dropout_layer_forward(Model *m, const Layer *l) {
    DropoutShape s = dropout_shape(m, l);
    DropoutMask k = dropout_mask(m, l);
    if (m->training) dropout_forward(&m->ops, &s, &k, m->dropout, x_of(m, l), y_of(m, l));
    else op_copy(&m->ops, y_of(m, l), x_of(m, l), n_of(m, l) * dtype_size(m->act_dtype));
}

static void dropout_layer_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    void *dx = grad_of(m, l->in), *dy = grad_of(m, l->out);
    DropoutShape s = dropout_shape(m, l);
    DropoutMask k = dropout_mask(m, l);
    if (dx && m->training) dropout_backward(&m->ops, &s, &k, m->dropout, dy, dx, lp->dx_accumulate[0]);
    else if (dx) pass_gradient(m, l, dy, dx);
}

/* ---- channel concat of in and in2; backward splits dy ---- */

static ConcatShape concat_shape(const Model *m, const Layer *l) {
    const Activation *a = &m->acts[l->in], *b = &m->acts[l->in2];
    return (ConcatShape){m->batch, a->c, b->c, a->h * a->w};
}

static void concat_layer_forward(Model *m, const Layer *l) {
    ConcatShape s = concat_shape(m, l);
    concat_forward(&m->ops, &s, x_of(m, l), m->acts[l->in2].value, y_of(m, l));
}

static void concat_layer_backward(Model *m, const Layer *l) {
    const LayerPlan *lp = plan_of(m, l);
    ConcatShape s = concat_shape(m, l);
    void *da = grad_of(m, l->in), *db = grad_of(m, l->in2);
    if (da || db)
        concat_backward(&m->ops, &s, grad_of(m, l->out), da, db, lp->dx_accumulate[0], lp->dx_accumulate[1]);
}

/* ---- flatten: its output is its input's storage, so forward runs nothing; so is its gradient where it is
 * the input's only reader (plan_grad_slots), else backward passes dy on ---- */

static void flatten_layer_forward(Model *m, const Layer *l) { (void)m, (void)l; }

static void flatten_layer_backward(Model *m, const Layer *l) {
    void *dx = grad_of(m, l->in), *dy = grad_of(m, l->out);
    if (dx && dx != dy) pass_gradient(m, l, dy, dx);
}

#define RELU_BOTH (TAKES_RELU_TRAINING | TAKES_RELU_INFERENCE)
const LayerKindOps layer_kinds[LAYER_KINDS] = {
    [LAYER_CONV] = {"conv", conv_forward, conv_backward, 1, STEP_CONV, RELU_BOTH},
    [LAYER_RELU] = {"relu", relu_layer_forward, relu_layer_backward, 0, STEP_RELU, TAKES_RELU_NEVER},
    [LAYER_MAXPOOL] = {"maxpool", maxpool_layer_forward, maxpool_layer_backward, 0, STEP_MAXPOOL, TAKES_RELU_NEVER},
    [LAYER_LINEAR] = {"linear", linear_layer_forward, linear_layer_backward, 0, STEP_LINEAR, TAKES_RELU_INFERENCE},
    [LAYER_BATCHNORM] = {"batchnorm", batchnorm_layer_forward, batchnorm_layer_backward, 1, STEP_BATCHNORM, RELU_BOTH},
    [LAYER_ADD] = {"add", add_layer_forward, add_layer_backward, 1, STEP_ADD, RELU_BOTH},
    [LAYER_AVGPOOL] = {"avgpool", avgpool_layer_forward, avgpool_layer_backward, 1, STEP_AVGPOOL, TAKES_RELU_NEVER},
    [LAYER_GELU] = {"gelu", gelu_layer_forward, gelu_layer_backward, 0, STEP_GELU, TAKES_RELU_NEVER},
    [LAYER_SCALE] = {"scale", scale_layer_forward, scale_layer_backward, 0, STEP_SCALE, TAKES_RELU_NEVER},
    [LAYER_SILU] = {"silu", silu_layer_forward, silu_layer_backward, 0, STEP_SILU, TAKES_RELU_NEVER},
    [LAYER_DROPOUT] = {"dropout", dropout_layer_forward, dropout_layer_backward, 1, STEP_IDENTITY, TAKES_RELU_NEVER},
    [LAYER_CONCAT] = {"concat", concat_layer_forward, concat_layer_backward, 1, STEP_CONCAT, TAKES_RELU_NEVER},
    [LAYER_FLATTEN] = {"flatten", flatten_layer_forward, flatten_layer_backward, 1, STEP_IDENTITY, TAKES_RELU_NEVER},
};

void layer_kinds_check(void) {
    for (int k = 0; k < LAYER_KINDS; k++) {
        const LayerKindOps *o = &layer_kinds[k];
        if (!o->name || !o->forward || !o->backward)
            TC_FATAL("layer kind %d has no entry in models/layers.c's layer_kinds", k);
        if (o->step == STEP_MISSING || !o->takes_relu)
            TC_FATAL("layer kind %s: models/layers.c's layer_kinds says no %s", o->name,
                     o->step == STEP_MISSING ? "inference step" : "takes_relu");
    }
}

/* ---- the passes ---------------------------------------------------------- */

static void nvtx_begin(void *user, const OpContext *ctx, const char *op, const char *label) {
    (void)user, (void)ctx, (void)op;
    if (label) gpu_range_push(label);
}

static void nvtx_end(void *user, const OpContext *ctx, const char *op, const char *label) {
    (void)user, (void)ctx, (void)op;
    if (label) gpu_range_pop();
}

const OpHooks layer_nvtx_hooks = {nvtx_begin, nvtx_end, NULL};

/* The layer's ops carry its name to the hooks; ops between layers carry none. */
static void layer_forward(Model *m, const Layer *l) {
    m->ops.label = l->name;
    layer_kinds[l->kind].forward(m, l);
    m->ops.label = NULL;
}

static void layer_backward(Model *m, const Layer *l) {
    m->ops.label = l->name;
    layer_kinds[l->kind].backward(m, l);
    m->ops.label = NULL;
}

/* The fp32 NCHW batch into the input activation, where they differ (AMP, NHWC). */
static void cast_input(Model *m) {
    const Activation *in = &m->acts[0];
    if (m->plan->acts[0].unstored) return; /* the input convolution's form takes the batch itself (plan_input_forms) */
    if (m->input_direct) return; /* the batch was written in this form (model_set_input_direct) */
    if (m->nhwc)
        cast_nchw_to_nhwc(&m->ops, m->input_f32, in->value, m->batch, in->c_real, in->h, in->w, in->c);
    else if (m->input_f32)
        cast_from_f32(&m->ops, m->input_f32, in->value, act_floats(m, 0));
}

void model_forward(Model *m) {
    cast_input(m);
    if (m->training && m->dropout) dropout_advance(&m->ops, m->dropout); /* this step's masks */
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (m->weights_needed && l->w_count) /* the bias follows the weights past the alignment (add_params) */
            m->weights_needed(m->weights_needed_ctx, l->w_off, l->b_off + l->b_count);
        layer_forward(m, l);
    }
}

/* Under checkpointing, reaching a block's last layer runs the block forward
 * again from its kept input, refilling the inside that later blocks overwrote. */
static void recompute_block(Model *m, int last) {
    int first = last;
    while (first > 0 && m->layers[first - 1].block == m->layers[last].block) first--;
    gpu_range_push("recompute");
    m->recomputing = 1;
    for (int i = first; i <= last; i++) layer_forward(m, &m->layers[i]);
    m->recomputing = 0;
    gpu_range_pop();
}

/* A layer's parameter gradients, from w_off on, are queued: grads_ready
 * hears it now, or with a filter gradient still on the side stream (whose
 * parameters lie above w_off) at the join. */
static void grads_queued(Model *m, size_t w_off) {
    m->grads_queued_from = w_off;
    if (m->grads_ready && !m->wgrad_pending) m->grads_ready(m->grads_ready_ctx, w_off);
}

void layer_wgrad_join(Model *m) {
    if (!m->wgrad_pending) return;
    gpu_wait_event(m->ops.stream, m->wgrad_done_event);
    m->wgrad_pending = 0;
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, m->grads_queued_from);
}

void model_backward(Model *m) {
    for (int i = m->n_layers - 1; i >= m->frozen_layers; i--) {
        const Layer *l = &m->layers[i];
        int block_end = l->block >= 0 && (i == m->n_layers - 1 || m->layers[i + 1].block != l->block);
        /* The last block's inside is still in place from the forward pass. */
        int recompute = m->checkpoint && block_end && l->block != m->n_blocks - 1;
        if (recompute || layer_joins_wgrad(l)) layer_wgrad_join(m);
        if (recompute) recompute_block(m, i);
        layer_backward(m, l);
        if (l->w_count) grads_queued(m, l->w_off);
    }
    layer_wgrad_join(m);
    m->grads_zeroed = 0;
    /* The frozen prefix's gradients stay as zeroed: final too. */
    if (m->grads_ready && m->frozen_layers > 0) m->grads_ready(m->grads_ready_ctx, 0);
}
