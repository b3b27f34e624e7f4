/* One training step, read top to bottom: take a batch, forward, loss,
 * backward, optimizer (eagerly or replayed as a CUDA graph); reading the loss
 * back; evaluation. */
#include "ops/add.h"
#include "tools/trainer/trainer.h"

/* ---- a batch into the model ------------------------------------------------------ */

/* The next micro-batch into the model's input: the wait for the loader (host
 * time in loader_next: data_wait), then its copy (and transform), the input
 * phase. 0 at the end of the epoch. */
int take_batch(Trainer *t, long epoch_micro) {
    Batch b;
    int got;
    gpu_range_push("data");
    phase_wait_begin(t);
    if (t->set.data.on_device) {
        /* Nothing from the host: the batch is gathered on the device. */
        if ((got = epoch_micro < loader_batches_per_epoch(t->data.train_loader))) {
            phase_mark(t, PH_INPUT);
            gather_on_device(t, epoch_micro);
        }
    } else if (t->data.train_decoder) {
        /* Decoded on the GPU; one kernel makes the model's input on the compute stream. */
        DecodedBatch db;
        if ((got = gpu_decoder_next(t->data.train_decoder, &db, t->model.ops.stream))) {
            phase_mark(t, PH_INPUT);
            resample_into_input(t, &db);
            gpu_decoder_release(t->data.train_decoder, &db, t->model.ops.stream);
        }
    } else if (t->set.data.resident) {
        /* The epoch's first batch stays in the model's input buffer all epoch. */
        got = 1;
        if (epoch_micro == 0 && loader_next(t->data.train_loader, &b)) {
            phase_mark(t, PH_INPUT);
            upload_sync(t, &b);
            loader_release(t->data.train_loader, &b);
        }
    } else if ((got = loader_next(t->data.train_loader, &b))) {
        phase_mark(t, PH_INPUT);
        if (t->set.run.use_gpu && t->set.data.async_copy) upload_async(t, t->data.train_loader, &b);
        else {
            upload_sync(t, &b);
            loader_release(t->data.train_loader, &b);
        }
    }
    gpu_range_pop();
    return got;
}

/* ---- one step -------------------------------------------------------------- */

/* Data-parallel: backward reports each layer's finished gradients, and every
 * bucket they complete starts its all-reduce at once, under the rest of backward. */
static void on_grads_ready(void *ctx, size_t first_ready) {
    Trainer *t = ctx;
    grad_buckets_ready(&t->ddp.buckets, first_ready, t->model.ops.stream);
}

/* dist.shard_optimizer (GPU): the other ranks' weights, updated by them, are
 * waited for just before forward reads them. */
static void on_weights_needed(void *ctx, size_t first, size_t end) {
    GPU_ONLY(Trainer *t = ctx; grad_buckets_await_weights(&t->ddp.buckets, first, end, t->device.gpu.compute));
}

/* dist.sync_bn: a batch norm's per-channel sums, added over the ranks (on the
 * compute stream on the GPU, so a CUDA graph captures it with the step). */
void sync_bn_allreduce(void *ctx, double *sums, int n, cudaStream_t stream) {
    Trainer *t = ctx;
    if (t->set.run.use_gpu) GPU_ONLY(dist_allreduce_sum_double_device(t->ddp.dist, sums, n, stream));
    else dist_allreduce_sum_host_double(t->ddp.dist, sums, n);
}

/* The log interval's running loss and training accuracy: this micro-batch's
 * loss and correct predictions added to device sums (log_point reads them). */
static void add_to_log_sums(Trainer *t) {
    Model *m = &t->model;
    OpContext f32 = m->ops;
    f32.dtype = DTYPE_F32;
    add_accumulate(&f32, t->buf.loss_sum, t->buf.loss, 1);
    accuracy_count(&m->ops, model_logits(m), t->buf.labels, t->set.train.batch, m->num_classes, t->buf.train_correct);
}

/* Forward, loss and backward of one micro-batch; the first micro-batch of an
 * optimizer step zeroes the gradients, the others add to them; the last one's
 * backward starts the all-reduce (data-parallel). */
static void micro_step(Trainer *t, int first, int last) {
    Model *m = &t->model;
    const OpContext *ctx = &m->ops;
    eager_mark(t, PH_FORWARD);
    if (first) loss_scaler_begin_step(ctx, t->buf.scaler);
    gpu_range_push("forward");
    if (t->ddp.shard_optimizer) {
        GPU_ONLY(grad_buckets_send_weights(&t->ddp.buckets, t->device.gpu.compute));
        m->weights_needed = on_weights_needed;
        m->weights_needed_ctx = t;
    }
    model_forward(m);
    m->weights_needed = NULL;
    /* The loss gradient is scaled under AMP only; fp32's scale is 1. A
     * non-finite loss marks the step bad as a non-finite gradient does. */
    softmax_xent_smooth(ctx, model_logits(m), t->buf.labels, t->set.train.batch, m->num_classes,
                        t->set.optim.label_smoothing, t->set.precision.amp != DTYPE_F32 ? &t->buf.scaler->scale : NULL,
                        t->buf.loss, model_logits_grad(m));
    loss_scaler_check(ctx, t->buf.loss, DTYPE_F32, 1, t->buf.scaler);
    add_to_log_sums(t);
    /* run.inject_nan_step (tests): poison the first element of the loss gradient (all bits set: a NaN). */
    if (t->set.checkpoint.inject_nan_step && t->step + 1 == t->set.checkpoint.inject_nan_step)
        op_fill(ctx, model_logits_grad(m), 0xFF, dtype_size(m->act_dtype));
    gpu_range_pop();

    eager_mark(t, PH_BACKWARD);
    gpu_range_push("backward");
    if (first) model_zero_grads(m);
    int all_reduce = last && t->ddp.dist->world > 1;
    if (all_reduce) {
        grad_buckets_begin(&t->ddp.buckets);
        m->grads_ready = on_grads_ready;
        m->grads_ready_ctx = t;
    }
    model_backward(m);
    m->grads_ready = NULL;
    /* The weights sent under forward; the last micro-batch joins at grad_buckets_finish. */
    if (t->ddp.shard_optimizer && !all_reduce) GPU_ONLY(grad_buckets_join(&t->ddp.buckets, t->device.gpu.compute));
    gpu_range_pop();
}

/* The optimizer's step over [first, first + count) of the flat buffers: SGD's, or Adam's. */
static void update_range(Trainer *t, size_t first, size_t count) {
    Model *m = &t->model;
    size_t esize = dtype_size(m->act_dtype);
    void *grads = (char *)m->grads + first * esize;
    void *half = m->weights == m->params ? NULL : (char *)m->weights + first * esize;
    if (m->adam) {
        AdamwParams p = t->optim.adam;
        if (p.decay_mask) p.decay_mask += first;
        if (p.lr_scale) p.lr_scale += first;
        adamw_step_mixed(&m->ops, m->params + first, grads, m->momentum + first, m->second_moment + first, half,
                         count, t->buf.lr, m->adam_steps, t->buf.scaler, p);
        return;
    }
    SgdParams p = t->optim.sgd;
    if (p.decay_mask) p.decay_mask += first;
    if (p.lr_scale) p.lr_scale += first;
    sgd_step_mixed(&m->ops, m->params + first, grads, m->momentum + first, half, count, t->buf.lr, t->buf.scaler, p);
}

/* Adam's step count, once per optimizer step before its ranges, after the
 * loss scaler's verdict on the step (a skipped step is not counted). */
static void count_step(Trainer *t) {
    if (t->model.adam) adamw_count_step(&t->model.ops, t->model.adam_steps, t->buf.scaler);
}

/* dist.shard_optimizer (GPU): this rank updates the ranges it owns. The
 * buckets checked every gradient for inf and NaN under backward, each rank
 * what it averaged, and max-reduced the found-inf flag, so every rank skips
 * the same steps (and counts the same Adam steps). The updated weights go to
 * the other ranks at the next step's start. */
static void update_sharded(Trainer *t) {
    int n = 0;
    const GradBucket *owned = NULL;
    GPU_ONLY(owned = grad_buckets_owned(&t->ddp.buckets, &n));
    count_step(t);
    for (int i = 0; i < n; i++) update_range(t, owned[i].first, owned[i].count);
    GPU_ONLY(grad_buckets_weights_updated(&t->ddp.buckets)); /* sent under the next forward pass */
}

/* Every parameter on this rank: the loss scaler's check of the gradients;
 * optim.clip_norm: the clip factor of the true gradient, grads / (scale x
 * accumulate) (see settings_read), becomes the step's grad_mult (set in
 * train_open.c). Every rank sees the same averaged gradients, so their
 * checks agree; a non-finite loss on one rank must make all of them skip the
 * step too: on the GPU the buckets max-reduce the loss check's flag under
 * backward (grad_buckets_reduce_flag), on the CPU it is reduced here. */
static void update_whole(Trainer *t) {
    Model *m = &t->model;
    const OpContext *ctx = &m->ops;
    loss_scaler_check(ctx, m->grads, m->act_dtype, m->n_params, t->buf.scaler);
    if (!t->set.run.use_gpu) t->buf.scaler->found_inf = dist_any_host(t->ddp.dist, t->buf.scaler->found_inf);
    if (t->set.optim.clip_norm > 0)
        grad_clip_factor(ctx, m->grads, m->n_params, t->buf.scaler, 1.0f / (float)t->set.memory.accumulate,
                         t->set.optim.clip_norm, t->buf.grad_norm_scratch, t->buf.grad_norm, t->buf.clip_factor);
    count_step(t);
    update_range(t, 0, m->n_params);
}

/* optim.muon: the filters, which the SGD step left alone (their lr_scale is 0),
 * after the loss scaler's check in update_whole. */
static void muon_whole(Trainer *t) {
    Model *m = &t->model;
    muon_step(&m->ops, &t->optim.muon_mats, m->params, m->grads, m->momentum,
              m->weights == m->params ? NULL : m->weights, t->buf.lr, t->buf.scaler, t->optim.muon, t->buf.muon_scratch);
}

/* optim.lookahead_every: the parameters (with their rounded copy under AMP)
 * and the running statistics, on the step counter's schedule. */
static void lookahead_whole(Trainer *t) {
    Model *m = &t->model;
    void *half = m->weights == m->params ? NULL : m->weights;
    lookahead_step(&m->ops, t->buf.lr_step, t->optim.lookahead, t->buf.slow_params, m->params, half, m->n_params);
    if (t->buf.slow_bn)
        lookahead_step(&m->ops, t->buf.lr_step, t->optim.lookahead, t->buf.slow_bn, m->bn_running, NULL, m->n_bn_stats);
}

static void optimizer_step(Trainer *t) {
    const OpContext *ctx = &t->model.ops;
    eager_mark(t, PH_OPTIMIZER);
    gpu_range_push("optimizer");
    /* All on the device: a step whose loss or gradients hold an inf or NaN is
     * skipped (and under AMP the scale backs off), with no host sync (CUDA
     * graphs need that). In fp32 the scale is 1, and the unscaling multiplies
     * by exactly 1: sgd_step's math. */
    if (t->ddp.dist->world > 1) {
        gpu_range_push("allreduce");
        grad_buckets_finish(&t->ddp.buckets, ctx->stream);
        gpu_range_pop();
    }
    /* The whitening bias's end and lookahead read the step counter, which the schedule advances. */
    int whiten = t->optim.whiten_layer >= 0, lookahead = t->optim.lookahead.every > 0;
    if (t->optim.schedule.kind != LR_CONSTANT || whiten || lookahead)
        lr_schedule_step(ctx, &t->optim.schedule, t->buf.lr_step, t->buf.lr);
    if (whiten) {
        const Layer *l = &t->model.layers[t->optim.whiten_layer];
        freeze_after(ctx, t->buf.lr_step, t->optim.whiten_bias_steps, t->model.lr_scale + l->b_off, l->b_count);
    }
    if (t->ddp.shard_optimizer) update_sharded(t);
    else update_whole(t);
    if (t->optim.muon_mats.n) muon_whole(t);
    if (lookahead) lookahead_whole(t);
    loss_scaler_update(ctx, t->buf.scaler, t->set.precision.scale_growth, t->set.precision.scale_backoff,
                       t->set.precision.scale_interval);
    gpu_range_pop();
}

/* One micro-batch of device work, and the optimizer after the last one: run
 * eagerly, or (perf.cuda_graph) replayed from the CUDA graph captured for this
 * (first, last) pair the first time it came up after the eager warm-up step.
 * The graph holds no host work, so the host only launches it. */
void run_micro_batch(Trainer *t, int first, int last) {
    if (t->set.perf.cuda_graph) phase_mark(t, PH_GRAPH); /* before any capture: the mark is no node of the graph */
    /* Once the whitening bias is frozen (freeze_after, on the device, from the same step on), nothing
     * before the first trained layer needs a gradient. */
    int frozen = t->optim.whiten_prefix > 0 && t->step >= t->optim.whiten_bias_steps;
    model_set_frozen_prefix(&t->model, frozen ? t->optim.whiten_prefix : 0);
    if (!t->set.perf.cuda_graph || t->step == t->first_step) {
        micro_step(t, first, last);
        if (last) optimizer_step(t);
        return;
    }
    cudaGraphExec_t *exec = &t->optim.graphs[first][last][frozen];
    if (!*exec) {
        gpu_capture_begin(t->device.gpu.compute);
        micro_step(t, first, last);
        if (last) optimizer_step(t);
        *exec = gpu_capture_end(t->device.gpu.compute, t->set.perf.graph_node_priority);
        log_info("captured the %s%s micro-batch%s as a CUDA graph", first ? "first" : "next",
                 last ? " and last" : "", frozen ? " with the whitening frozen" : "");
    }
    gpu_range_push("graph");
    gpu_graph_launch(*exec, t->device.gpu.compute);
    gpu_range_pop();
}

/* The loss, and with it (the same sync) the log interval's sums, the loss
 * scaler's state and the gradient norm (optim.clip_norm). */
float read_loss(Trainer *t) {
    const OpContext *ctx = &t->model.ops;
    float loss;
    op_copy_to_host(ctx, &loss, t->buf.loss, sizeof loss);
    op_copy_to_host(ctx, &t->seen.loss_sum, t->buf.loss_sum, sizeof t->seen.loss_sum);
    op_copy_to_host(ctx, &t->seen.train_correct, t->buf.train_correct, sizeof t->seen.train_correct);
    op_copy_to_host(ctx, &t->seen.scaler, t->buf.scaler, sizeof t->seen.scaler);
    if (t->buf.grad_norm) op_copy_to_host(ctx, &t->seen.grad_norm, t->buf.grad_norm, sizeof t->seen.grad_norm);
    op_sync(ctx);
    t->seen.loss = loss;
    t->seen.sums_step = t->step;
    return loss;
}

/* ---- evaluation ------------------------------------------------------------ */

/* Data-parallel: every rank evaluates with rank 0's batch-norm statistics
 * (PyTorch's DDP broadcasts them too). */
static void share_bn_stats(Trainer *t) {
    Model *m = &t->model;
    if (t->ddp.dist->world == 1 || !m->n_bn_stats) return;
    float *stats = malloc(m->n_bn_stats * sizeof(float));
    if (!stats) TC_FATAL("out of host memory: batch-norm statistics");
    model_get_bn_stats(m, stats);
    dist_bcast_host(t->ddp.dist, stats, m->n_bn_stats * sizeof(float), 0);
    model_set_bn_stats(m, stats);
    free(stats);
}

/* Each rank counts its shard of the test set; the counts are summed. */
double evaluate(Trainer *t, int epoch) {
    Model *m = &t->model;
    const OpContext *ctx = &m->ops;
    int correct = 0;
    share_bn_stats(t);
    sync_sharded_state(t);
    Batch b;
    gpu_range_push("evaluate");
    op_fill(ctx, t->buf.correct, 0, sizeof(int));
    model_set_training(m, 0);
    model_set_input_direct(m, 0); /* the test batches are the fp32 batch */
    loader_start_epoch(t->data.test_loader, epoch);
    while (loader_next(t->data.test_loader, &b)) {
        if (t->set.run.eval_tta) {
            tta_count(t, t->data.test_loader, &b);
            continue;
        }
        upload_sync(t, &b);
        loader_release(t->data.test_loader, &b);
        model_forward(m);
        accuracy_count(ctx, model_logits(m), t->buf.labels, t->set.train.batch, m->num_classes, t->buf.correct);
    }
    model_set_training(m, 1);
    op_copy_to_host(ctx, &correct, t->buf.correct, sizeof(int));
    op_sync(ctx);
    double total = correct;
    dist_allreduce_sum_host_double(t->ddp.dist, &total, 1);
    gpu_range_pop();
    return total / t->data.test.n;
}

