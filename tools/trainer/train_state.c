/* The device state beside the model's: the small buffers (labels, loss, lr,
 * loss scaler, ...), moving a batch into the model's input, and syncs. */
#include "tools/trainer/trainer.h"

/* ---- the buffers beside the model's ---------------------------------------- */

void input_raw_shape(const Trainer *t, int *c, int *h, int *w) {
    const Dataset *d = &t->data.train.decoded;
    int resampled = t->set.data.resized_crop;
    *c = resampled ? 3 : d->c;
    *h = resampled ? t->set.data.image_size : d->h;
    *w = resampled ? t->set.data.image_size : d->w;
}

/* Runs twice, as the model's buffers do: on a counting arena, then the real one. */
static void carve_aux(Trainer *t, Arena *a) {
    size_t image_floats = model_input_floats(&t->model);
    int batch = t->set.train.batch;
    const Dataset *d = &t->data.train.decoded;
    int raw_c, raw_h, raw_w;
    input_raw_shape(t, &raw_c, &raw_h, &raw_w);
    t->buf.labels = arena_alloc(a, batch * sizeof(int32_t), "labels");
    t->buf.loss = arena_alloc(a, sizeof(float), "loss");
    t->buf.lr = arena_alloc(a, sizeof(float), "learning rate");
    t->buf.lr_step = arena_alloc(a, sizeof(int64_t), "learning-rate step");
    t->buf.correct = arena_alloc(a, sizeof(int), "accuracy counter");
    t->buf.loss_sum = arena_alloc(a, sizeof(float), "log interval's loss sum");
    t->buf.train_correct = arena_alloc(a, sizeof(int), "log interval's accuracy counter");
    t->buf.scaler = arena_alloc(a, sizeof(LossScalerState), "loss scaler");
    if (t->set.optim.clip_norm > 0) {
        size_t scratch = grad_clip_scratch_bytes(&t->model.ops, t->model.n_params);
        t->buf.grad_norm = arena_alloc(a, sizeof(float), "gradient norm");
        t->buf.clip_factor = arena_alloc(a, sizeof(float), "gradient clip factor");
        if (scratch) t->buf.grad_norm_scratch = arena_alloc(a, scratch, "gradient norm scratch");
    }
    if (t->set.optim.lookahead_every > 0) {
        t->buf.slow_params = arena_alloc(a, t->model.n_params * sizeof(float), "lookahead slow parameters");
        if (t->model.n_bn_stats)
            t->buf.slow_bn = arena_alloc(a, t->model.n_bn_stats * sizeof(float), "lookahead slow batch-norm statistics");
    }
    if (t->optim.muon_mats.n) t->buf.muon_scratch = arena_alloc(a, muon_scratch_bytes(&t->optim.muon_mats), "muon iterates");
    if (t->set.run.eval && t->set.run.eval_tta) {
        size_t logit_bytes = (size_t)batch * t->model.num_classes * sizeof(float);
        t->buf.tta_images = arena_alloc(a, gpu_transform_raw_bytes(batch, d->c, d->h, d->w), "test batch");
        t->buf.tta_views = arena_alloc(a, TTA_MAX_VIEWS * gpu_transform_params_bytes(batch), "test-time views");
        t->buf.tta_sum = arena_alloc(a, logit_bytes, "test-time logits");
        t->buf.tta_pair = arena_alloc(a, logit_bytes, "test-time logits of a pair");
        t->buf.tta_view = arena_alloc(a, logit_bytes, "test-time logits of a view");
    }
    if (t->set.data.on_device) {
        t->input.set_images = arena_alloc(a, (size_t)d->n * dataset_image_bytes(d), "training set");
        t->input.set_labels = arena_alloc(a, (size_t)d->n * sizeof(int32_t), "training labels");
        t->input.epoch_index = arena_alloc(a, (size_t)d->n * sizeof(int32_t), "epoch order");
        t->input.epoch_params = arena_alloc(a, (size_t)d->n * sizeof(TransformParams), "epoch augmentation");
    }
    for (int s = 0; s < 2; s++) {
        if (t->set.data.async_copy && !t->set.data.transform_on_gpu)
            t->input.staging_images[s] = arena_alloc(a, image_floats * sizeof(float), "batch staging");
        if (t->set.data.async_copy)
            t->input.staging_labels[s] = arena_alloc(a, batch * sizeof(int32_t), "label staging");
        if (t->set.data.transform_on_gpu) {
            size_t raw_bytes = gpu_transform_raw_bytes(batch, raw_c, raw_h, raw_w);
            t->input.staging_raw[s] = arena_alloc(a, raw_bytes, "uint8 batch staging");
            t->input.staging_params[s] = arena_alloc(a, gpu_transform_params_bytes(batch), "transform parameters");
        }
    }
}

/* data.on_device: the set once to the device, and the host copy of an epoch's plan. */
static void upload_training_set(Trainer *t) {
    const OpContext *ctx = &t->model.ops;
    const Dataset *d = &t->data.train.decoded;
    op_copy_from_host(ctx, t->input.set_images, d->pixels, (size_t)d->n * dataset_image_bytes(d));
    op_copy_from_host(ctx, t->input.set_labels, d->labels, (size_t)d->n * sizeof(int32_t));
    t->input.epoch_host = host_alloc((size_t)d->n * (sizeof(int32_t) + sizeof(TransformParams)), t->set.run.use_gpu,
                                     "the epoch's order and augmentation");
    t->input.planned_epoch = -1;
    if (t->set.run.use_gpu) {
        gpu_event_create(&t->input.epoch_sent, 0);
        gpu_event_record(t->input.epoch_sent, ctx->stream);
    }
    log_info("data.on_device: %d training images, %.1f MiB, on the device", d->n,
             (double)d->n * dataset_image_bytes(d) / 1048576.0);
}

/* After model_finalize: the buffers, the lr and the loss scaler's first state
 * on the device, and the staging events. */
void state_alloc(Trainer *t) {
    DeviceKind where = t->set.run.use_gpu ? DEVICE_CUDA : DEVICE_CPU;
    Arena sizing;
    arena_init_counting(&sizing, where);
    carve_aux(t, &sizing);
    arena_init(&t->buf.arena, where, sizing.used);
    carve_aux(t, &t->buf.arena);
    t->input.host_labels = host_alloc(t->set.train.batch * sizeof(int32_t), 0, "labels");
    t->seen.scaler = loss_scaler_initial(t->set.precision.scale_init);
    t->seen.grad_norm = NAN;
    const OpContext *ctx = &t->model.ops;
    op_copy_from_host(ctx, t->buf.lr, &t->set.optim.lr, sizeof(float));
    op_fill(ctx, t->buf.lr_step, 0, sizeof(int64_t));
    op_copy_from_host(ctx, t->buf.scaler, &t->seen.scaler, sizeof t->seen.scaler);
    op_sync(ctx);
    for (int s = 0; s < 2 && t->set.run.use_gpu; s++) {
        gpu_event_create(&t->input.staged[s], 0);
        gpu_event_create(&t->input.consumed[s], 0);
    }
    if (t->set.data.on_device) upload_training_set(t);
}

void state_free(Trainer *t) {
    for (int s = 0; s < 2 && t->set.run.use_gpu; s++) {
        gpu_event_destroy(t->input.staged[s]);
        gpu_event_destroy(t->input.consumed[s]);
    }
    if (t->input.epoch_host) {
        if (t->set.run.use_gpu) gpu_event_destroy(t->input.epoch_sent);
        host_free(t->input.epoch_host, t->set.run.use_gpu);
    }
    arena_free(&t->buf.arena);
    host_free(t->input.host_labels, 0);
}

/* ---- moving a batch to the model ---------------------------------------- */

/* Transform on the GPU: the stored uint8 images and their params go to staging
 * set s, and one kernel writes the model's input from them. */
static void send_raw(Trainer *t, const Batch *b, int s, cudaStream_t stream) {
    int c, h, w;
    input_raw_shape(t, &c, &h, &w);
    gpu_copy_to_device(t->input.staging_raw[s], b->raw_images, gpu_transform_raw_bytes(b->n, c, h, w), stream);
    gpu_copy_to_device(t->input.staging_params[s], b->params, gpu_transform_params_bytes(b->n), stream);
}

void transform_into_input(Trainer *t, GpuTransformArgs *a, cudaStream_t stream) {
    a->out = model_input_buffer(&t->model);
    if (t->set.run.use_gpu) GPU_ONLY(gpu_transform_batch(a, stream));
    else gpu_transform_reference_cpu(a);
}

static void run_gpu_transform(Trainer *t, const Batch *b, int s, cudaStream_t stream) {
    GpuTransformArgs a = t->input.transform_args;
    a.raw_images = t->input.staging_raw[s];
    a.params = t->input.staging_params[s];
    a.n = b->n;
    transform_into_input(t, &a, stream);
}

/* data.on_device: the epoch's order and augmentation drawn into epoch_host,
 * once the last epoch's copy has left it. */
static void plan_epoch(Trainer *t, int epoch) {
    int32_t *index = t->input.epoch_host;
    TransformParams *params = (TransformParams *)(index + t->data.train.n);
    if (t->set.run.use_gpu) gpu_event_sync(t->input.epoch_sent);
    loader_epoch_plan(t->data.train_loader, epoch, index, params);
    t->input.planned_epoch = epoch;
}

/* data.on_device: the next epoch's plan drawn while the device still runs this
 * epoch's steps, so the next epoch starts with its upload alone. */
void plan_next_epoch(Trainer *t, int epoch) {
    if (t->set.data.on_device && epoch < t->run_epochs) plan_epoch(t, epoch);
}

/* The resident batch is the epoch's first, also in an epoch resumed mid-way. */
static void start_resident_epoch(Trainer *t, int epoch, long first_micro) {
    Batch b;
    loader_start_epoch(t->data.train_loader, epoch);
    if (first_micro == 0 || !loader_next(t->data.train_loader, &b)) return;
    upload_sync(t, &b);
    loader_release(t->data.train_loader, &b);
}

long start_train_epoch(Trainer *t, int epoch, long first_micro) {
    long batches = loader_batches_per_epoch(t->data.train_loader);
    if (first_micro > batches) first_micro = batches; /* a checkpoint of another data set (warned of) */
    if (t->data.train_decoder) {
        gpu_decoder_start_epoch(t->data.train_decoder, epoch, (int)first_micro);
        return first_micro;
    }
    if (t->set.data.resident) {
        start_resident_epoch(t, epoch, first_micro);
        return first_micro;
    }
    if (!t->set.data.on_device) { /* the batches before first_micro are never built */
        loader_start_epoch_at(t->data.train_loader, epoch, (int)first_micro);
        return first_micro;
    }
    const OpContext *ctx = &t->model.ops;
    int n = loader_epoch_samples(t->data.train_loader);
    if (t->input.planned_epoch != epoch) plan_epoch(t, epoch);
    int32_t *index = t->input.epoch_host;
    TransformParams *params = (TransformParams *)(index + t->data.train.n);
    /* On the compute stream, so after the last epoch's steps have read them. */
    op_copy_from_host(ctx, t->input.epoch_index, index, (size_t)n * sizeof(int32_t));
    op_copy_from_host(ctx, t->input.epoch_params, params, (size_t)n * sizeof(TransformParams));
    if (t->set.run.use_gpu) gpu_event_record(t->input.epoch_sent, ctx->stream);
    t->input.planned_epoch = -1;
    return first_micro; /* take_batch gathers by position */
}

double train_data_wait(const Trainer *t) {
    return t->data.train_decoder ? gpu_decoder_wait_seconds(t->data.train_decoder)
                                 : loader_wait_seconds(t->data.train_loader);
}

void gather_on_device(Trainer *t, long epoch_micro) {
    size_t first = (size_t)epoch_micro * t->set.train.batch;
    GpuTransformArgs a = t->input.transform_args;
    a.raw_images = t->input.set_images;
    a.index = t->input.epoch_index + first;
    a.params = t->input.epoch_params + first;
    a.labels = t->input.set_labels;
    a.labels_out = t->buf.labels;
    a.n = t->set.train.batch;
    transform_into_input(t, &a, t->model.ops.stream);
}

/* data.decode = gpu: the decoded batch's crops resampled into the model's
 * input (its NHWC activation where forward stores one), and its labels, on
 * the compute stream. */
void resample_into_input(Trainer *t, const DecodedBatch *b) {
    ModelInputForm form = model_input_form(&t->model);
    GpuResampleArgs a = {.images = b->images, .samples = b->samples, .labels = b->labels, .labels_out = t->buf.labels,
                         .out = form.data, .out_dtype = form.dtype, .nhwc = form.nhwc, .out_c = form.channels,
                         .n = b->n, .out_h = t->set.data.image_size, .out_w = t->set.data.image_size};
    memcpy(a.mean, t->set.data.mean, sizeof a.mean);
    memcpy(a.std, t->set.data.std, sizeof a.std);
    model_set_input_direct(&t->model, form.direct);
    GPU_ONLY(gpu_resample_batch(&a, t->model.ops.stream));
}

/* Baseline path: a synchronous copy straight into the model's input, then a
 * device sync, and the slot goes back at once. On the CPU: a memcpy. */
void upload_labels_padded(Trainer *t, const Batch *b) {
    int32_t *padded_labels = t->input.host_labels;
    memcpy(padded_labels, b->labels, b->n * sizeof(int32_t));
    /* a partial batch's extra rows count for nothing */
    for (int i = b->n; i < t->set.train.batch; i++) padded_labels[i] = -1;
    op_copy_from_host(&t->model.ops, t->buf.labels, padded_labels, t->set.train.batch * sizeof(int32_t));
}

void upload_sync(Trainer *t, const Batch *b) {
    const OpContext *ctx = &t->model.ops;
    size_t image_bytes = (size_t)b->n * (model_input_floats(&t->model) / t->set.train.batch) * sizeof(float);
    /* On the compute stream: the previous step may still be reading these buffers. */
    if (b->raw_images) {
        send_raw(t, b, 0, ctx->stream);
        run_gpu_transform(t, b, 0, ctx->stream);
    } else {
        op_copy_from_host(ctx, model_input_buffer(&t->model), b->images, image_bytes);
    }
    upload_labels_padded(t, b);
    op_sync(ctx);
}

void release_held(Trainer *t, Loader *l) {
    if (!t->input.held_slot_valid) return;
    gpu_event_sync(t->input.staged[t->input.held_staging]);
    loader_release(l, &t->input.held);
    t->input.held_slot_valid = 0;
}

/* Async path: the copy stream fills staging buffer k%2 once the step that last
 * read it has copied it out; the compute stream waits for the fill and copies
 * staging into the model's fixed input buffer (a device-to-device copy of a
 * few microseconds, which keeps the input address fixed for CUDA graphs). The
 * host slot goes back once its copy has finished, checked one step later. */
void upload_async(Trainer *t, Loader *l, const Batch *b) {
    int s = (int)(t->step & 1);
    size_t per_sample = model_input_floats(&t->model) / t->set.train.batch;
    cudaStream_t copy = t->device.gpu.copy, compute = t->device.gpu.compute;
    if (b->n != t->set.train.batch) TC_FATAL("internal: partial training batch on the async path");
    release_held(t, l);
    gpu_wait_event(copy, t->input.consumed[s]);
    if (b->raw_images)
        send_raw(t, b, s, copy);
    else
        gpu_copy_to_device(t->input.staging_images[s], b->images, (size_t)b->n * per_sample * sizeof(float), copy);
    gpu_copy_to_device(t->input.staging_labels[s], b->labels, b->n * sizeof(int32_t), copy);
    gpu_event_record(t->input.staged[s], copy);
    gpu_wait_event(compute, t->input.staged[s]);
    if (b->raw_images)
        run_gpu_transform(t, b, s, compute);
    else
        gpu_copy_on_device(model_input_buffer(&t->model), t->input.staging_images[s],
                           (size_t)b->n * per_sample * sizeof(float), compute);
    gpu_copy_on_device(t->buf.labels, t->input.staging_labels[s], b->n * sizeof(int32_t), compute);
    gpu_event_record(t->input.consumed[s], compute);
    t->input.held = *b;
    t->input.held_staging = s;
    t->input.held_slot_valid = 1;
}

/* ---- syncs ------------------------------------------------------------------ */

void device_sync(Trainer *t) { op_sync(&t->model.ops); }

void sync_sharded_state(Trainer *t) {
    /* Every rank has the same step count, so all skip a second call alike. */
    if (!t->ddp.shard_optimizer || t->ddp.state_synced_step == t->step) return;
    GPU_ONLY(Model *m = &t->model; float *state[] = {m->params, m->momentum, m->second_moment}; /* NULL: not adam */
             grad_buckets_sync_state(&t->ddp.buckets, state, m->second_moment ? 3 : 2, t->device.gpu.compute));
    device_sync(t);
    t->ddp.state_synced_step = t->step;
}

