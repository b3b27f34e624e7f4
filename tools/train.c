/* The training loop, top to bottom: read the config, load the data, build the
 * model, then for each epoch: wait for a batch, copy it to the device, forward,
 * loss, backward, optimizer; evaluate; write the summary.
 *
 * The step itself never waits for the host unless a switch asks for it
 * (train.sync_after_step, train.read_loss_every, data.async_copy = off): those
 * are the lab's baseline habits, kept so that their cost can be measured. */
#include "tools/trainer.h"
#include "runtime/json_out.h"

/* ---- set-up --------------------------------------------------------------- */

/* A rule of the settings broken: gathered, so that one message names them all. */
static void require(ConfigProblems *p, int ok, const char *key, const char *what) {
    if (!ok) config_problem(p, key, "%s", what);
}

/* A key whose value needs the GPU; cpu_value is what to set instead. */
static void require_gpu(ConfigProblems *p, const Trainer *t, int ok, const char *key, const char *cpu_value) {
    if (!ok && !t->use_gpu)
        config_problem(p, key, "needs run.device = cuda; for the CPU set %s = %s", key, cpu_value);
}

/* run.profile_steps = "a:b"; 0, or -1 when it is not two step numbers 1 <= a <= b. */
static int parse_profile_steps(const char *v, long *first, long *last) {
    char *end;
    errno = 0;
    long a = strtol(v, &end, 10);
    if (end == v || *end != ':' || errno) return -1;
    const char *second = end + 1;
    long b = strtol(second, &end, 10);
    if (end == second || *end || errno || a < 1 || b < a) return -1;
    *first = a;
    *last = b;
    return 0;
}

/* Each value alone was checked against its range when it was read (tools/keys.c);
 * here are the rules that join keys. Every broken rule is named at once. */
static void read_settings(Trainer *t, const Config *cfg) {
    ConfigProblems problems = {.config = cfg}, *p = &problems;
    require(p, strlen(config_str(cfg, "run.name")) < sizeof ((TrainSummary *)0)->name, "run.name",
            "is longer than 127 bytes");
    t->use_gpu = strcmp(config_str(cfg, "run.device"), "cuda") == 0;
    t->batch = (int)config_int(cfg, "train.batch");
    t->epochs = (int)config_int(cfg, "run.epochs");
    t->max_steps = (long)config_int(cfg, "run.max_steps");
    t->image_size = (int)config_int(cfg, "data.image_size");
    t->log_every = (int)config_int(cfg, "run.log_every");
    t->read_loss_every = (int)config_int(cfg, "train.read_loss_every");
    t->warmup_steps = (int)config_int(cfg, "run.warmup_steps");
    t->sync_after_step = config_bool(cfg, "train.sync_after_step");
    t->async_copy = config_bool(cfg, "data.async_copy");
    t->eval = config_bool(cfg, "run.eval");
    t->resident = config_bool(cfg, "data.resident");
    t->tf32 = config_bool(cfg, "precision.tf32");
    t->transform_on_gpu = strcmp(config_str(cfg, "data.transform_on"), "gpu") == 0;
    t->accumulate = (int)config_int(cfg, "memory.accumulate");
    t->checkpoint = strcmp(config_str(cfg, "memory.checkpoint"), "blocks") == 0;
    t->cuda_graph = config_bool(cfg, "perf.cuda_graph");
    t->graph_node_priority = config_bool(cfg, "perf.graph_node_priority");
    t->sync_bn = config_bool(cfg, "dist.sync_bn");
    const char *amp = config_str(cfg, "precision.amp");
    t->amp = strcmp(amp, "fp16") == 0 ? DTYPE_F16 : strcmp(amp, "bf16") == 0 ? DTYPE_BF16 : DTYPE_F32;
    t->scale_init = (float)config_float(cfg, "precision.loss_scale");
    t->scale_growth = (float)config_float(cfg, "precision.loss_scale_growth");
    t->scale_backoff = (float)config_float(cfg, "precision.loss_scale_backoff");
    t->scale_interval = (int)config_int(cfg, "precision.loss_scale_interval");

    /* What only the GPU does, all named at once: a GPU config run with --device cpu. */
    require_gpu(p, t, t->amp == DTYPE_F32, "precision.amp", "off");
    require_gpu(p, t, !t->cuda_graph, "perf.cuda_graph", "off");
    require_gpu(p, t, !config_bool(cfg, "data.pinned"), "data.pinned", "off");
    require_gpu(p, t, !t->transform_on_gpu, "data.transform_on", "cpu");
    require_gpu(p, t, strcmp(config_str(cfg, "model.layout"), "nhwc") != 0, "model.layout", "nchw");
    require_gpu(p, t, !config_bool(cfg, "model.fuse"), "model.fuse", "off");
    const char *allreduce = config_str(cfg, "dist.allreduce_dtype");
    int half_allreduce = strcmp(allreduce, "fp16") == 0 || strcmp(allreduce, "bf16") == 0;
    require_gpu(p, t, t->dist->world == 1 || !half_allreduce, "dist.allreduce_dtype", "fp32");

    require(p, !t->graph_node_priority || t->cuda_graph, "perf.graph_node_priority", "needs perf.cuda_graph = on");
    if (t->amp == DTYPE_F32) {
        /* fp32 uses the scaler only to skip non-finite steps: the scale stays 1. */
        t->scale_init = 1;
        t->scale_growth = 1;
        t->scale_backoff = 1;
        t->scale_interval = INT_MAX;
    }
    t->checkpoint_every = (long)config_int(cfg, "run.checkpoint_every");
    t->keep_checkpoints = (int)config_int(cfg, "run.keep_checkpoints");
    t->checkpoint_dir = config_str(cfg, "run.checkpoint_dir");
    t->max_bad_steps = (int)config_int(cfg, "run.max_bad_steps");
    t->inject_nan_step = (long)config_int(cfg, "run.inject_nan_step");
    require(p, t->checkpoint_dir[0] != 0, "run.checkpoint_dir", "must not be empty");
    require(p, !t->inject_nan_step || !t->cuda_graph, "run.inject_nan_step",
            "needs perf.cuda_graph = off (the graph replays the step as captured)");
    const char *profile = config_str(cfg, "run.profile_steps");
    require(p, !profile[0] || parse_profile_steps(profile, &t->profile_first, &t->profile_last) == 0,
            "run.profile_steps", "must be a:b, optimizer steps with 1 <= a <= b (e.g. 100:120), or empty (off)");
    t->sample_every_s = config_float(cfg, "monitor.sample_every_s");
    t->prometheus_port = (int)config_int(cfg, "monitor.prometheus_port");
    t->lr = (float)config_float(cfg, "optim.lr");
    t->sgd.momentum = (float)config_float(cfg, "optim.momentum");
    t->sgd.weight_decay = (float)config_float(cfg, "optim.weight_decay");
    t->sgd.nesterov = config_bool(cfg, "optim.nesterov");
    const char *schedule = config_str(cfg, "optim.schedule");
    t->schedule.kind = strcmp(schedule, "cosine") == 0 ? LR_COSINE : strcmp(schedule, "onecycle") == 0 ? LR_ONECYCLE
                     : LR_CONSTANT;
    t->warmup_epochs = (float)config_float(cfg, "optim.warmup_epochs");
    t->schedule.final_lr = (float)config_float(cfg, "optim.final_lr");
    t->label_smoothing = (float)config_float(cfg, "optim.label_smoothing");
    t->clip_norm = (float)config_float(cfg, "optim.clip_norm");
    require(p, t->warmup_epochs <= t->epochs, "optim.warmup_epochs", "must be at most run.epochs");
    require(p, t->schedule.kind != LR_CONSTANT || t->warmup_epochs == 0, "optim.warmup_epochs",
            "needs optim.schedule = cosine or onecycle");
    require(p, !t->sgd.nesterov || t->sgd.momentum > 0, "optim.nesterov", "needs optim.momentum > 0");
    /* The async path holds the previous batch while its copy is in flight. */
    require(p, !t->async_copy || config_int(cfg, "data.prefetch") >= 2, "data.prefetch",
            "must be at least 2 with data.async_copy = on");
    config_problems_check(p);
    /* k micro-batches each add the gradient of their own mean loss, so the
     * buffer holds k times the mean gradient of the whole batch. SGD on k*g
     * with lr/k, weight decay k*wd and momentum as usual takes exactly the step
     * of SGD on g with lr and wd (the momentum buffer holds k times its value). */
    t->lr /= (float)t->accumulate;
    t->schedule.final_lr /= (float)t->accumulate;
    t->sgd.weight_decay *= (float)t->accumulate;
}

/* The schedule in optimizer steps, once the epoch's length is known. */
static void plan_schedule(Trainer *t, long steps_per_epoch) {
    t->schedule.base_lr = t->lr;
    t->schedule.total_steps = steps_per_epoch * t->epochs;
    t->schedule.warmup_steps = (long)llround(t->warmup_epochs * (double)steps_per_epoch);
    t->schedule.warmup_start_factor = 0.1f;
    lr_schedule_check(&t->schedule);
}

void train_load_dataset(const Config *cfg, Dataset *d, int train) {
    const char *source = config_str(cfg, "data.source");
    const char *path = config_str(cfg, "data.path");
    int limit = (int)config_int(cfg, train ? "data.train_limit" : "data.test_limit");
    char err[1024];
    int rc = 0;
    if (strcmp(source, "synthetic") == 0) {
        int n = (int)config_int(cfg, train ? "data.synthetic_train" : "data.synthetic_test");
        if (limit > 0 && limit < n) n = limit;
        synthetic_make(d, n, 3, 32, 32, (int)config_int(cfg, "model.num_classes"),
                       (uint64_t)config_int(cfg, "run.seed") * 2 + (uint64_t)train);
    } else if (strcmp(source, "cifar_bin") == 0) {
        rc = cifar_bin_load(d, path, train, limit, err, sizeof err);
    } else {
        rc = image_folder_load(d, path, train ? "train" : "test", limit, err, sizeof err);
    }
    if (rc != 0)
        config_fail(cfg, "data.path", "%s (data.source = %s; set data.path to the data set, or "
                    "data.source = synthetic to measure throughput without it)", err, source);
    if (d->num_classes > config_int(cfg, "model.num_classes"))
        config_fail(cfg, "model.num_classes", "%s holds %d classes, more than that", path, d->num_classes);
}

void train_loader_config(const Config *cfg, int train, LoaderConfig *lc) {
    memset(lc, 0, sizeof *lc);
    int image_size = (int)config_int(cfg, "data.image_size");
    lc->batch = (int)config_int(cfg, "train.batch");
    lc->workers = (int)config_int(cfg, "data.workers");
    lc->prefetch = (int)config_int(cfg, "data.prefetch");
    lc->pinned = config_bool(cfg, "data.pinned");
    lc->shuffle = train && config_bool(cfg, "data.shuffle");
    lc->drop_last = train; /* every training step sees a full batch */
    lc->augment = train;
    lc->raw = strcmp(config_str(cfg, "data.transform_on"), "gpu") == 0;
    lc->seed = (uint64_t)config_int(cfg, "run.seed");
    transform_spec_default(&lc->transform, image_size, image_size);
    lc->transform.flip = config_bool(cfg, "data.flip");
    lc->transform.crop_pad = (int)config_int(cfg, "data.crop_pad");
    lc->transform.cutout = (int)config_int(cfg, "data.cutout");
}

static Loader *make_loader(Trainer *t, const Config *cfg, const Dataset *d, int train) {
    LoaderConfig lc;
    train_loader_config(cfg, train, &lc);
    lc.rank = t->dist->rank; /* each rank its shard of the same shuffle */
    lc.world = t->dist->world;
    if (t->transform_on_gpu)
        gpu_transform_args_init(&t->transform_args, &lc.transform, d->c, d->h, d->w);
    if (train && d->n / t->dist->world < t->batch)
        config_fail(cfg, "train.batch", "is larger than the %d training images%s", d->n / t->dist->world,
                    t->dist->world > 1 ? " of this rank's shard" : "");
    return loader_create(d, &lc);
}

/* cuDNN describes a tensor of at most 2^31 elements. A batch that makes one
 * activation larger fails here, before cuDNN is asked: as out of GPU memory
 * (the arena's words) when that activation alone is more than the GPU holds,
 * else naming the limit. */
static void check_activation_sizes(const Trainer *t) {
    const Model *m = &t->model;
    for (int i = 0; i < m->n_acts; i++) {
        const Activation *a = &m->acts[i];
        size_t elems = (size_t)m->batch * (size_t)a->c * (size_t)a->h * (size_t)a->w;
        if (elems <= (size_t)INT_MAX) continue;
        double bytes = (double)elems * (double)dtype_size(t->amp);
        size_t free_b = 0, total_b = 0;
        gpu_memory_info(&free_b, &total_b);
        if (bytes > (double)total_b)
            TC_USER_ERROR("out of GPU memory: train.batch = %d needs %.1f MiB for one %dx%dx%d activation alone; "
                     "%.1f MiB free of %.1f MiB. Try a smaller train.batch, precision.amp = fp16, "
                     "memory.checkpoint = blocks or memory.accumulate = k", m->batch, bytes / 1048576.0, a->c, a->h,
                     a->w, free_b / 1048576.0, total_b / 1048576.0);
        TC_USER_ERROR("train.batch = %d makes the %dx%dx%d activation %zu elements, more than the 2^31 a cuDNN tensor "
                 "may hold: use a smaller train.batch (with memory.accumulate = k for the same step)", m->batch,
                 a->c, a->h, a->w, elems);
    }
}

/* Runs twice, as the model's buffers do: on a counting arena, then the real one. */
static void carve_aux(Trainer *t, Arena *a) {
    size_t image_floats = model_input_floats(&t->model);
    const Dataset *d = &t->train_set;
    t->labels = arena_alloc(a, t->batch * sizeof(int32_t), "labels");
    t->loss = arena_alloc(a, sizeof(float), "loss");
    t->lr_buf = arena_alloc(a, sizeof(float), "learning rate");
    t->lr_step = arena_alloc(a, sizeof(int64_t), "learning-rate step");
    t->correct = arena_alloc(a, sizeof(int), "accuracy counter");
    t->scaler = arena_alloc(a, sizeof(LossScalerState), "loss scaler");
    if (t->clip_norm > 0) {
        size_t scratch = grad_clip_scratch_bytes(&t->model.ops, t->model.n_params);
        t->grad_norm = arena_alloc(a, sizeof(float), "gradient norm");
        t->clip_factor = arena_alloc(a, sizeof(float), "gradient clip factor");
        if (scratch) t->grad_norm_scratch = arena_alloc(a, scratch, "gradient norm scratch");
    }
    for (int s = 0; s < 2; s++) {
        if (t->async_copy && !t->transform_on_gpu)
            t->staging_images[s] = arena_alloc(a, image_floats * sizeof(float), "batch staging");
        if (t->async_copy)
            t->staging_labels[s] = arena_alloc(a, t->batch * sizeof(int32_t), "label staging");
        if (t->transform_on_gpu) {
            t->staging_raw[s] = arena_alloc(a, gpu_transform_raw_bytes(t->batch, d->c, d->h, d->w), "uint8 batch staging");
            t->staging_params[s] = arena_alloc(a, gpu_transform_params_bytes(t->batch), "transform parameters");
        }
    }
}

static void alloc_aux(Trainer *t) {
    DeviceKind where = t->use_gpu ? DEVICE_CUDA : DEVICE_CPU;
    Arena sizing;
    arena_init_counting(&sizing, where);
    carve_aux(t, &sizing);
    arena_init(&t->aux, where, sizing.used);
    carve_aux(t, &t->aux);
    t->host_labels = host_alloc(t->batch * sizeof(int32_t), 0, "labels");
    t->scaler_seen = loss_scaler_initial(t->scale_init);
    t->grad_norm_seen = NAN;
    const OpContext *ctx = &t->model.ops;
    op_copy_from_host(ctx, t->lr_buf, &t->lr, sizeof(float));
    op_fill(ctx, t->lr_step, 0, sizeof(int64_t));
    op_copy_from_host(ctx, t->scaler, &t->scaler_seen, sizeof t->scaler_seen);
    op_sync(ctx);
    for (int s = 0; s < 2 && t->use_gpu; s++) {
        gpu_event_create(&t->staged[s], 0);
        gpu_event_create(&t->consumed[s], 0);
    }
}

/* ---- moving a batch to the model ---------------------------------------- */

/* Transform on the GPU: the stored uint8 images and their params go to staging
 * set s, and one kernel writes the model's input from them. */
static void send_raw(Trainer *t, const Batch *b, int s, cudaStream_t stream) {
    const Dataset *d = &t->train_set;
    gpu_copy_to_device(t->staging_raw[s], b->raw_images, gpu_transform_raw_bytes(b->n, d->c, d->h, d->w), stream);
    gpu_copy_to_device(t->staging_params[s], b->params, gpu_transform_params_bytes(b->n), stream);
}

static void run_gpu_transform(Trainer *t, const Batch *b, int s, cudaStream_t stream) {
    GPU_ONLY(GpuTransformArgs a = t->transform_args;
             a.raw_images = t->staging_raw[s];
             a.params = t->staging_params[s];
             a.out = model_input_buffer(&t->model);
             a.n = b->n;
             gpu_transform_batch(&a, stream));
}

/* Baseline path: a synchronous copy straight into the model's input, then a
 * device sync, and the slot goes back at once. On the CPU: a memcpy. */
void upload_sync(Trainer *t, const Batch *b) {
    const OpContext *ctx = &t->model.ops;
    size_t image_bytes = (size_t)b->n * (model_input_floats(&t->model) / t->batch) * sizeof(float);
    int32_t *padded_labels = t->host_labels;
    memcpy(padded_labels, b->labels, b->n * sizeof(int32_t));
    for (int i = b->n; i < t->batch; i++) padded_labels[i] = -1; /* a partial batch's extra rows count for nothing */
    /* On the compute stream: the previous step may still be reading these buffers. */
    if (b->raw_images) {
        send_raw(t, b, 0, ctx->stream);
        run_gpu_transform(t, b, 0, ctx->stream);
    } else {
        op_copy_from_host(ctx, model_input_buffer(&t->model), b->images, image_bytes);
    }
    op_copy_from_host(ctx, t->labels, padded_labels, t->batch * sizeof(int32_t));
    op_sync(ctx);
}

static void release_held(Trainer *t, Loader *l) {
    if (!t->held_slot_valid) return;
    gpu_event_sync(t->staged[t->held_staging]);
    loader_release(l, &t->held);
    t->held_slot_valid = 0;
}

/* Async path: the copy stream fills staging buffer k%2 once the step that last
 * read it has copied it out; the compute stream waits for the fill and copies
 * staging into the model's fixed input buffer (a device-to-device copy of a
 * few microseconds, which keeps the input address fixed for CUDA graphs). The
 * host slot goes back once its copy has finished, checked one step later. */
static void upload_async(Trainer *t, Loader *l, const Batch *b) {
    int s = (int)(t->step & 1);
    size_t per_sample = model_input_floats(&t->model) / t->batch;
    cudaStream_t copy = t->gpu.copy, compute = t->gpu.compute;
    if (b->n != t->batch) TC_FATAL("internal: partial training batch on the async path");
    release_held(t, l);
    gpu_wait_event(copy, t->consumed[s]);
    if (b->raw_images)
        send_raw(t, b, s, copy);
    else
        gpu_copy_to_device(t->staging_images[s], b->images, (size_t)b->n * per_sample * sizeof(float), copy);
    gpu_copy_to_device(t->staging_labels[s], b->labels, b->n * sizeof(int32_t), copy);
    gpu_event_record(t->staged[s], copy);
    gpu_wait_event(compute, t->staged[s]);
    if (b->raw_images)
        run_gpu_transform(t, b, s, compute);
    else
        gpu_copy_on_device(model_input_buffer(&t->model), t->staging_images[s], (size_t)b->n * per_sample * sizeof(float),
                           compute);
    gpu_copy_on_device(t->labels, t->staging_labels[s], b->n * sizeof(int32_t), compute);
    gpu_event_record(t->consumed[s], compute);
    t->held = *b;
    t->held_staging = s;
    t->held_slot_valid = 1;
}

/* ---- one step -------------------------------------------------------------- */

/* Data-parallel: backward reports each layer's finished gradients, and every
 * bucket they complete starts its all-reduce at once, under the rest of backward. */
static void on_grads_ready(void *ctx, size_t first_ready) {
    Trainer *t = ctx;
    grad_buckets_ready(&t->buckets, first_ready, t->model.ops.stream);
}

/* dist.shard_optimizer (GPU): the other rank's weights, updated by it, are
 * waited for just before forward reads them. */
static void on_weights_needed(void *ctx, size_t first, size_t end) {
    GPU_ONLY(Trainer *t = ctx; grad_buckets_await_weights(&t->buckets, first, end, t->gpu.compute));
}

/* dist.sync_bn: a batch norm's per-channel sums, added over the ranks (on the
 * compute stream on the GPU, so a CUDA graph captures it with the step). */
static void sync_bn_allreduce(void *ctx, double *sums, int n, cudaStream_t stream) {
    Trainer *t = ctx;
    if (t->use_gpu) GPU_ONLY(dist_allreduce_sum_double_device(t->dist, sums, n, stream));
    else dist_allreduce_sum_host_double(t->dist, sums, n);
}

/* Forward, loss and backward of one micro-batch; the first micro-batch of an
 * optimizer step zeroes the gradients, the others add to them; the last one's
 * backward starts the all-reduce (data-parallel). */
static void micro_step(Trainer *t, int first, int last) {
    Model *m = &t->model;
    const OpContext *ctx = &m->ops;
    eager_mark(t, PH_FORWARD);
    if (first) loss_scaler_begin_step(ctx, t->scaler);
    gpu_range_push("forward");
    if (t->shard_optimizer) {
        GPU_ONLY(grad_buckets_send_weights(&t->buckets, t->gpu.compute));
        m->weights_needed = on_weights_needed;
        m->weights_needed_ctx = t;
    }
    model_forward(m);
    m->weights_needed = NULL;
    /* The loss gradient is scaled under AMP only; fp32's scale is 1. A
     * non-finite loss marks the step bad as a non-finite gradient does. */
    softmax_xent_smooth(ctx, model_logits(m), t->labels, t->batch, m->num_classes, t->label_smoothing,
                        t->amp != DTYPE_F32 ? &t->scaler->scale : NULL, t->loss, model_logits_grad(m));
    loss_scaler_check(ctx, t->loss, DTYPE_F32, 1, t->scaler);
    /* run.inject_nan_step (tests): poison the first element of the loss gradient (all bits set: a NaN). */
    if (t->inject_nan_step && t->step + 1 == t->inject_nan_step)
        op_fill(ctx, model_logits_grad(m), 0xFF, dtype_size(m->act_dtype));
    gpu_range_pop();

    eager_mark(t, PH_BACKWARD);
    gpu_range_push("backward");
    if (first) model_zero_grads(m);
    int all_reduce = last && t->dist->world > 1;
    if (all_reduce) {
        grad_buckets_begin(&t->buckets);
        m->grads_ready = on_grads_ready;
        m->grads_ready_ctx = t;
    }
    model_backward(m);
    m->grads_ready = NULL;
    /* The weights sent under forward; the last micro-batch joins at grad_buckets_finish. */
    if (t->shard_optimizer && !all_reduce) GPU_ONLY(grad_buckets_join(&t->buckets, t->gpu.compute));
    gpu_range_pop();
}

/* The SGD step over [first, first + count) of the flat buffers. */
static void sgd_range(Trainer *t, size_t first, size_t count) {
    Model *m = &t->model;
    size_t esize = dtype_size(m->act_dtype);
    SgdParams p = t->sgd;
    if (p.decay_mask) p.decay_mask += first;
    sgd_step_mixed(&m->ops, m->params + first, (char *)m->grads + first * esize, m->momentum + first,
                   m->weights == m->params ? NULL : (char *)m->weights + first * esize, count, t->lr_buf, t->scaler,
                   p);
}

/* dist.shard_optimizer (GPU): this rank updates the ranges it owns. The
 * buckets checked every gradient for inf and NaN under backward, each rank
 * what it averaged, and max-reduced the found-inf flag, so every rank skips
 * the same steps. The updated weights go to the other rank at the next step's
 * start. */
static void update_sharded(Trainer *t) {
    int n = 0;
    const GradBucket *owned = NULL;
    GPU_ONLY(owned = grad_buckets_owned(&t->buckets, &n));
    for (int i = 0; i < n; i++) sgd_range(t, owned[i].first, owned[i].count);
    GPU_ONLY(grad_buckets_weights_updated(&t->buckets)); /* sent under the next forward pass */
}

/* Every parameter on this rank: the loss scaler's check of the gradients;
 * optim.clip_norm: the clip factor of the true gradient, grads / (scale x
 * accumulate) (see read_settings), becomes the SGD step's grad_mult (set in
 * train_run_dist). Every rank sees the same averaged gradients, so their
 * checks agree; a non-finite loss on one rank must make all of them skip the
 * step too: on the GPU the buckets max-reduce the loss check's flag under
 * backward (grad_buckets_reduce_flag), on the CPU it is reduced here. */
static void update_whole(Trainer *t) {
    Model *m = &t->model;
    const OpContext *ctx = &m->ops;
    loss_scaler_check(ctx, m->grads, m->act_dtype, m->n_params, t->scaler);
    if (!t->use_gpu) t->scaler->found_inf = dist_any_host(t->dist, t->scaler->found_inf);
    if (t->clip_norm > 0)
        grad_clip_factor(ctx, m->grads, m->n_params, t->scaler, 1.0f / (float)t->accumulate, t->clip_norm,
                         t->grad_norm_scratch, t->grad_norm, t->clip_factor);
    sgd_range(t, 0, m->n_params);
}

static void optimizer_step(Trainer *t) {
    const OpContext *ctx = &t->model.ops;
    eager_mark(t, PH_OPTIMIZER);
    gpu_range_push("optimizer");
    /* All on the device: a step whose loss or gradients hold an inf or NaN is
     * skipped (and under AMP the scale backs off), with no host sync (CUDA
     * graphs need that). In fp32 the scale is 1, and the unscaling multiplies
     * by exactly 1: sgd_step's math. */
    if (t->dist->world > 1) {
        gpu_range_push("allreduce");
        grad_buckets_finish(&t->buckets, ctx->stream);
        gpu_range_pop();
    }
    if (t->schedule.kind != LR_CONSTANT) lr_schedule_step(ctx, &t->schedule, t->lr_step, t->lr_buf);
    if (t->shard_optimizer) update_sharded(t);
    else update_whole(t);
    loss_scaler_update(ctx, t->scaler, t->scale_growth, t->scale_backoff, t->scale_interval);
    gpu_range_pop();
}

/* One micro-batch of device work, and the optimizer after the last one: run
 * eagerly, or (perf.cuda_graph) replayed from the CUDA graph captured for this
 * (first, last) pair the first time it came up after the eager warm-up step.
 * The graph holds no host work, so the host only launches it. */
static void run_micro_batch(Trainer *t, int first, int last) {
    if (t->cuda_graph) phase_mark(t, PH_GRAPH); /* before any capture: the mark is no node of the graph */
    if (!t->cuda_graph || t->step == t->first_step) {
        micro_step(t, first, last);
        if (last) optimizer_step(t);
        return;
    }
    cudaGraphExec_t *exec = &t->graphs[first][last];
    if (!*exec) {
        gpu_capture_begin(t->gpu.compute);
        micro_step(t, first, last);
        if (last) optimizer_step(t);
        *exec = gpu_capture_end(t->gpu.compute, t->graph_node_priority);
        log_info("captured the %s%s micro-batch as a CUDA graph", first ? "first" : "next",
                 last ? " and last" : "");
    }
    gpu_range_push("graph");
    gpu_graph_launch(*exec, t->gpu.compute);
    gpu_range_pop();
}

/* The loss, and with it (the same sync) the loss scaler's state and the
 * gradient norm (optim.clip_norm). */
static float read_loss(Trainer *t) {
    const OpContext *ctx = &t->model.ops;
    float loss;
    op_copy_to_host(ctx, &loss, t->loss, sizeof loss);
    op_copy_to_host(ctx, &t->scaler_seen, t->scaler, sizeof t->scaler_seen);
    if (t->grad_norm) op_copy_to_host(ctx, &t->grad_norm_seen, t->grad_norm, sizeof t->grad_norm_seen);
    op_sync(ctx);
    t->last_loss = loss;
    return loss;
}

void device_sync(Trainer *t) { op_sync(&t->model.ops); }

void sync_sharded_state(Trainer *t) {
    /* Every rank has the same step count, so all skip a second call alike. */
    if (!t->shard_optimizer || t->state_synced_step == t->step) return;
    GPU_ONLY(grad_buckets_sync_state(&t->buckets, t->model.params, t->model.momentum, t->gpu.compute));
    device_sync(t);
    t->state_synced_step = t->step;
}

/* ---- evaluation ------------------------------------------------------------ */

/* Data-parallel: every rank evaluates with rank 0's batch-norm statistics
 * (PyTorch's DDP broadcasts them too). */
static void share_bn_stats(Trainer *t) {
    Model *m = &t->model;
    if (t->dist->world == 1 || !m->n_bn_stats) return;
    float *stats = malloc(m->n_bn_stats * sizeof(float));
    if (!stats) TC_FATAL("out of host memory: batch-norm statistics");
    model_get_bn_stats(m, stats);
    dist_bcast_host(t->dist, stats, m->n_bn_stats * sizeof(float), 0);
    model_set_bn_stats(m, stats);
    free(stats);
}

/* Each rank counts its shard of the test set; the counts are summed. */
static double evaluate(Trainer *t, int epoch) {
    Model *m = &t->model;
    const OpContext *ctx = &m->ops;
    int correct = 0;
    share_bn_stats(t);
    sync_sharded_state(t);
    Batch b;
    gpu_range_push("evaluate");
    op_fill(ctx, t->correct, 0, sizeof(int));
    model_set_training(m, 0);
    loader_start_epoch(t->test_loader, epoch);
    while (loader_next(t->test_loader, &b)) {
        upload_sync(t, &b);
        loader_release(t->test_loader, &b);
        model_forward(m);
        accuracy_count(ctx, model_logits(m), t->labels, t->batch, m->num_classes, t->correct);
    }
    model_set_training(m, 1);
    op_copy_to_host(ctx, &correct, t->correct, sizeof(int));
    op_sync(ctx);
    double total = correct;
    dist_allreduce_sum_host_double(t->dist, &total, 1);
    gpu_range_pop();
    return total / t->test_set.n;
}

/* ---- stopping: signals and bad steps --------------------------------------- */

static volatile sig_atomic_t stop_signal;

/* SIGINT, SIGTERM: the first asks the loop to stop after the current step, a
 * second ends the process at once. */
static void on_stop_signal(int signo) {
    if (stop_signal) {
        static const char msg[] = "trainc: second signal: exiting now\n";
        ssize_t unused = write(2, msg, sizeof msg - 1);
        (void)unused;
        ckpt_remove_pending(); /* a checkpoint being written is left unfinished */
        _exit(128 + signo);
    }
    stop_signal = signo;
}

/* A signal on any rank stops every rank at the same step (a collective, so
 * every rank asks at the same points). */
static int stop_requested(Trainer *t) {
    int any = dist_any_host(t->dist, stop_signal != 0);
    if (any && !stop_signal) stop_signal = SIGTERM;
    return any;
}

static void install_stop_handlers(struct sigaction old[2]) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    stop_signal = 0;
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
}

static void restore_stop_handlers(const struct sigaction old[2]) {
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
}

/* After a read-back: the steps skipped since the last one (a non-finite loss or
 * gradient), logged; bad_run counts them in a row as far as the read-backs
 * tell (exactly with train.read_loss_every = 1). */
static void count_bad_steps(Trainer *t, int epoch) {
    long bad = t->scaler_seen.skipped_steps - (t->seen_bad_total), elapsed = t->step - t->seen_step;
    t->seen_bad_total = t->scaler_seen.skipped_steps;
    t->seen_step = t->step;
    if (bad <= 0) {
        t->bad_run = 0;
        return;
    }
    if (!t->scaler_seen.found_inf) t->bad_run = 0;  /* the last step was good */
    else if (bad == elapsed) t->bad_run += bad;     /* every step since the last look was bad */
    else t->bad_run = 1;                            /* at least the last one */
    log_warn("step %ld: %ld of the last %ld steps skipped for a non-finite loss or gradient (%d in all%s)", t->step,
             bad, elapsed, t->scaler_seen.skipped_steps, t->amp != DTYPE_F32 ? ", loss scale backed off" : "");
    write_metric_skipped(t, epoch);
}

static FILE *fatal_metrics; /* flushed by the fatal hook */
static void flush_on_fatal(void) {
    log_progress_end(); /* the error goes on a line of its own */
    if (fatal_metrics) fflush(fatal_metrics);
}

/* ---- the run --------------------------------------------------------------- */

/* The next micro-batch into the model's input: the wait for the loader (host
 * time in loader_next: data_wait), then its copy (and transform), the input
 * phase. 0 at the end of the epoch. */
static int take_batch(Trainer *t, long epoch_micro) {
    Batch b;
    int got;
    gpu_range_push("data");
    if (t->resident) {
        /* The epoch's first batch stays in the model's input buffer all epoch. */
        got = 1;
        if (epoch_micro == 0 && loader_next(t->train_loader, &b)) {
            phase_mark(t, PH_INPUT);
            upload_sync(t, &b);
            loader_release(t->train_loader, &b);
        }
    } else if ((got = loader_next(t->train_loader, &b))) {
        phase_mark(t, PH_INPUT);
        if (t->use_gpu && t->async_copy) upload_async(t, t->train_loader, &b);
        else {
            upload_sync(t, &b);
            loader_release(t->train_loader, &b);
        }
    }
    gpu_range_pop();
    return got;
}

/* phase_ms of the summary: each phase's sum over the timed window per timed step. */
static void summarize_phases(Trainer *t, TrainSummary *out, double timed_wait_s) {
    phases_collect(t, 1);
    double n = (double)out->timed_steps, *ms = t->phases.timed_ms;
    out->phase_data_wait_ms = out->phase_input_ms = out->phase_forward_ms = NAN;
    out->phase_backward_ms = out->phase_optimizer_ms = out->phase_graph_ms = NAN;
    if (n <= 0) return;
    out->phase_data_wait_ms = 1000 * timed_wait_s / n;
    out->phase_input_ms = ms[PH_INPUT] / n;
    if (t->cuda_graph) {
        out->phase_graph_ms = ms[PH_GRAPH] / n;
    } else {
        out->phase_forward_ms = ms[PH_FORWARD] / n;
        out->phase_backward_ms = ms[PH_BACKWARD] / n;
        out->phase_optimizer_ms = ms[PH_OPTIMIZER] / n;
    }
}

static void log_phases(const Trainer *t, const TrainSummary *s) {
    const char *clock = t->use_gpu ? "device time between events on the compute stream" : "host time";
    if (t->cuda_graph) {
        double sum = s->phase_data_wait_ms + s->phase_input_ms + s->phase_graph_ms;
        log_info("phases, ms per timed step: data wait %.3f (host time in loader_next), input %.3f (copy and "
                 "transform into the model's input), graph %.3f (forward, backward and optimizer replayed as one "
                 "CUDA graph: perf.cuda_graph = on times them only as a whole); sum %.3f of the %.3f ms step "
                 "(%.1f%%; %s)", s->phase_data_wait_ms, s->phase_input_ms, s->phase_graph_ms, sum, s->step_ms,
                 100 * sum / s->step_ms, clock);
        return;
    }
    double sum = s->phase_data_wait_ms + s->phase_input_ms + s->phase_forward_ms + s->phase_backward_ms +
                 s->phase_optimizer_ms;
    log_info("phases, ms per timed step: data wait %.3f (host time in loader_next), input %.3f (copy and "
             "transform into the model's input), forward %.3f (loss scaler reset, forward, loss), backward %.3f "
             "(zero gradients, backward), optimizer %.3f (gradient check, SGD, loss scaler update); sum %.3f of "
             "the %.3f ms step (%.1f%%; %s)", s->phase_data_wait_ms, s->phase_input_ms, s->phase_forward_ms,
             s->phase_backward_ms, s->phase_optimizer_ms, sum, s->step_ms, 100 * sum / s->step_ms, clock);
}

void train_run(const Config *cfg, TrainSummary *out) { train_run_keep_params(cfg, out, NULL); }

void train_run_keep_params(const Config *cfg, TrainSummary *out, float **params_out) {
    Dist solo;
    dist_init_solo(&solo);
    train_run_dist(cfg, out, params_out, &solo);
}

/* dist.allreduce_dtype: what the gradients travel as. */
static DType allreduce_dtype(const Trainer *t, const Config *cfg) {
    const char *v = config_str(cfg, "dist.allreduce_dtype");
    DType d = strcmp(v, "fp32") == 0 ? DTYPE_F32 : strcmp(v, "fp16") == 0 ? DTYPE_F16
            : strcmp(v, "bf16") == 0 ? DTYPE_BF16 : t->amp;
    return d;
}

/* dist.copy_engine: all-reduces of at least this much go through the copy
 * engines; below it NCCL's latency is lower. */
#define COPY_ENGINE_MIN_BYTES ((size_t)1 << 20)

static void use_copy_engines(Trainer *t, const Config *cfg) {
    const char *mode = config_str(cfg, "dist.copy_engine");
    if (strcmp(mode, "off") == 0) return;
    char why[256] = "";
    int linked = 0;
    GPU_ONLY(linked = grad_buckets_use_peer_link(&t->buckets, COPY_ENGINE_MIN_BYTES, why, sizeof why));
    if (linked) return;
    if (strcmp(mode, "on") == 0) config_fail(cfg, "dist.copy_engine", "%s (auto falls back to NCCL)", why);
    if (t->dist->rank == 0) log_info("dist.copy_engine = auto: NCCL alone, as %s", why);
}

static void shard_optimizer(Trainer *t, const Config *cfg) {
    const char *mode = config_str(cfg, "dist.shard_optimizer");
    if (strcmp(mode, "off") == 0) return;
    char why[256] = "";
    if (t->clip_norm > 0)
        snprintf(why, sizeof why, "optim.clip_norm needs the whole gradient on every rank");
    else
        GPU_ONLY(t->shard_optimizer = grad_buckets_shard_optimizer(&t->buckets, t->model.weights, t->model.act_dtype,
                                                                   why, sizeof why));
    t->state_synced_step = -1;
    if (t->shard_optimizer) return;
    if (strcmp(mode, "on") == 0) config_fail(cfg, "dist.shard_optimizer", "%s (auto falls back to every rank updating)", why);
    if (t->dist->rank == 0) log_info("dist.shard_optimizer = auto: every rank updates every parameter, as %s", why);
}

/* CPU ranks average their gradients over MPI: the copy engines, and the
 * sharded optimizer that rides on them, are the GPU's ("auto" is off here). */
static void check_cpu_dist_settings(const Config *cfg) {
    static const char *gpu_only[] = {"dist.copy_engine", "dist.shard_optimizer"};
    for (size_t i = 0; i < sizeof gpu_only / sizeof *gpu_only; i++)
        if (strcmp(config_str(cfg, gpu_only[i]), "on") == 0)
            config_fail(cfg, gpu_only[i], "needs run.device = cuda (CPU ranks average their gradients over MPI); "
                        "for the CPU set %s = auto", gpu_only[i]);
}

/* The GPU of this rank, and with several ranks NCCL. */
static void start_gpu(Trainer *t, const Config *cfg, TrainSummary *out) {
    Dist *dist = t->dist;
    if (!TRAINC_CUDA)
        config_fail(cfg, "run.device", "this trainc was built without CUDA (TRAINC_CUDA=OFF), so it trains on the CPU "
                    "only: use --device cpu (or configs/cpu.ini)");
    int devices = gpu_count();
    int ordinal = (int)config_int(cfg, "run.gpu");
    if (devices == 0) config_fail(cfg, "run.device", "no GPU is visible (use --device cpu)");
    if (dist->world > 1) ordinal = dist->local_rank; /* one GPU per rank of this host */
    if (ordinal >= devices) config_fail(cfg, "run.gpu", "names no visible GPU (%d visible)", devices);
    gpu_context_init(&t->gpu, ordinal);
    if (dist->world > 1 && !dist->nccl) GPU_ONLY(dist_init_nccl(dist, ordinal));
    snprintf(out->gpu_name, sizeof out->gpu_name, "%.200s", t->gpu.name);
    t->monitor = gpu_monitor_start(ordinal, 0.1);
}

void train_run_dist(const Config *cfg, TrainSummary *out, float **params_out, Dist *dist) {
    Trainer trainer = {0}, *t = &trainer;
    t->dist = dist;
    double run_start = now_seconds();
    memset(out, 0, sizeof *out);
    read_settings(t, cfg);
    if (t->profile_first && !t->use_gpu)
        log_warn("run.profile_steps: the CPU path has no CUDA profiler range; ignored");
    if (dist->rank == 0) prometheus_start(t);
    struct sigaction old_handlers[2];
    install_stop_handlers(old_handlers);
    static int hook_registered;
    if (!hook_registered) tc_on_fatal(flush_on_fatal);
    hook_registered = 1;

    /* run.resume: the file is checked end to end before anything is loaded. */
    CkptFile *resume = NULL;
    const char *resume_arg = config_str(cfg, "run.resume");
    if (resume_arg[0]) resume = open_resume(t, resume_arg);
    snprintf(out->name, sizeof out->name, "%s", config_str(cfg, "run.name"));
    out->world = dist->world;
    snprintf(out->device, sizeof out->device, "%s", t->use_gpu ? "cuda" : "cpu");
    out->gpu_util = -1;
    out->test_acc = -1;

    if (t->use_gpu) start_gpu(t, cfg, out);

    gpu_range_push("load data");
    train_load_dataset(cfg, &t->train_set, 1);
    if (t->eval) train_load_dataset(cfg, &t->test_set, 0);
    gpu_range_pop();
    if (t->eval && (t->test_set.c != t->train_set.c || t->test_set.h != t->train_set.h ||
                    t->test_set.w != t->train_set.w))
        TC_USER_ERROR("%s: test images are %dx%dx%d, training images %dx%dx%d", config_str(cfg, "data.path"),
                 t->test_set.c, t->test_set.h, t->test_set.w, t->train_set.c, t->train_set.h, t->train_set.w);
    log_info("data: %d training images%s, %dx%d, %d classes", t->train_set.n,
             t->eval ? "" : " (no evaluation)", t->train_set.h, t->train_set.w, t->train_set.num_classes);

    char err[512];
    int nhwc = strcmp(config_str(cfg, "model.layout"), "nhwc") == 0;
    if (model_build(&t->model, config_str(cfg, "model.name"), t->batch, t->image_size,
                    (int)config_int(cfg, "model.num_classes"), nhwc, err, sizeof err) != 0)
        tc_fatal(NULL, 0, "%s (model.name from %s, data.image_size from %s)", err, config_origin(cfg, "model.name"),
                 config_origin(cfg, "data.image_size"));
    t->model.conv_policy.workspace_limit = (size_t)config_int(cfg, "perf.conv_workspace_mb") << 20;
    t->model.conv_policy.allow_tf32 = t->tf32;
    t->model.conv_policy.deterministic = config_bool(cfg, "perf.deterministic");
    t->model.conv_policy.benchmark = config_bool(cfg, "perf.conv_benchmark");
    t->model.checkpoint = t->checkpoint;
    t->model.fuse = config_bool(cfg, "model.fuse");
    t->model.nvtx_layers = config_bool(cfg, "run.nvtx_layers");
    t->model.act_dtype = t->amp;
    t->model.no_decay_bn_bias = !config_bool(cfg, "optim.decay_bn_bias");
    if (t->sync_bn && !t->model.n_bn_stats) {
        if (dist->rank == 0)
            log_warn("dist.sync_bn = on: %s has no batch norm; ignored", config_str(cfg, "model.name"));
    } else if (t->sync_bn && dist->world > 1) {
        t->model.bn_allreduce = sync_bn_allreduce;
        t->model.bn_allreduce_ctx = t;
    }
    if (t->use_gpu && t->tf32) gpu_allow_tf32_gemm(&t->gpu);
    if (t->use_gpu) check_activation_sizes(t);
    model_finalize(&t->model, t->use_gpu ? &t->gpu : NULL, (uint64_t)config_int(cfg, "run.seed"));
    alloc_aux(t);
    t->sgd.decay_mask = t->model.decay_mask;
    t->sgd.grad_mult = t->clip_factor; /* NULL: no clipping */
    if (dist->world > 1) {
        /* Buckets follow the layers, whose gradients backward finishes one at a time. */
        size_t layer_starts[MODEL_MAX_LAYERS];
        int n_starts = 0;
        for (int i = 0; i < t->model.n_layers; i++)
            if (t->model.layers[i].w_count && t->model.layers[i].w_off > 0)
                layer_starts[n_starts++] = t->model.layers[i].w_off;
        grad_buckets_init_layers(&t->buckets, dist, t->model.grads, t->model.act_dtype, t->model.n_params,
                                 (size_t)config_int(cfg, "dist.bucket_mb") << 20, allreduce_dtype(t, cfg),
                                 layer_starts, n_starts);
        if (t->use_gpu) {
            GPU_ONLY(grad_buckets_reduce_flag(&t->buckets, &t->scaler->found_inf));
            use_copy_engines(t, cfg);
            shard_optimizer(t, cfg);
        } else {
            check_cpu_dist_settings(cfg);
        }
        log_info("data-parallel: %d ranks x train.batch %d x memory.accumulate %d = a global batch of %d%s",
                 dist->world, t->batch, t->accumulate, dist->world * t->batch * t->accumulate,
                 t->model.bn_allreduce ? "; batch norm over all ranks (dist.sync_bn)" : "");
    }
    log_info("model: %s, %zu parameters, %.1f MiB on %s", config_str(cfg, "model.name"),
             t->model.n_params, model_bytes(&t->model) / 1048576.0, out->device);
    CkptPosition start = {0, 0, 0};
    if (resume) {
        start = load_checkpoint(t, cfg, resume);
        ckpt_close(resume);
    }
    if (t->checkpoint_every) check_checkpoint_dir(t, resume ? t->step : -1);

    t->train_loader = make_loader(t, cfg, &t->train_set, 1);
    if (t->eval) t->test_loader = make_loader(t, cfg, &t->test_set, 0);
    const char *metrics_path = config_str(cfg, "run.metrics_file");
    if (metrics_path[0] && dist->rank == 0) {
        t->metrics = fopen(metrics_path, "a");
        if (!t->metrics)
            TC_USER_ERROR("run.metrics_file = %s: cannot open it for appending: %s", metrics_path, strerror(errno));
        fatal_metrics = t->metrics;
    }
    if (t->metrics && t->monitor && t->sample_every_s > 0)
        gpu_monitor_record_to(t->monitor, t->metrics, t->sample_every_s, run_start);

    int steps_per_epoch = loader_batches_per_epoch(t->train_loader) / t->accumulate;
    if (steps_per_epoch == 0)
        config_fail(cfg, "memory.accumulate", "micro-batches of train.batch = %d are more than an epoch of %d images",
                    t->batch, t->train_set.n);
    plan_schedule(t, steps_per_epoch);
    t->total_steps = (long)steps_per_epoch * t->epochs;
    if (t->max_steps && t->max_steps < t->total_steps) t->total_steps = t->max_steps;
    phases_init(t);
    t->progress = isatty(2) && !log_is_quiet();
    double timed_s = 0, timed_wait_s = 0, epoch_s_sum = 0;
    long timed_samples = 0;
    float loss = NAN;
    t->last_loss = NAN;
    StopReason why = RUN_ON;
    int epoch = (int)start.epoch;
    int last_step_epoch = epoch; /* the loop's epoch goes one past it when an epoch ends */
    for (; epoch < t->epochs && why == RUN_ON; epoch++) {
        double epoch_start = now_seconds(), window_start = -1, window_wait_start = 0;
        LogWindow lw = {now_seconds(), loader_wait_seconds(t->train_loader), t->step};
        t->progress_drawn = lw.start; /* the rate leaves out the evaluation */
        t->progress_step = t->step;
        int micro = 0;          /* micro-batch within the optimizer step */
        long epoch_micro = 0;   /* micro-batches taken this epoch */
        loader_start_epoch(t->train_loader, epoch);
        if (epoch == start.epoch && start.epoch_micro) epoch_micro = skip_batches(t, (long)start.epoch_micro);
        for (;;) {
            if (micro == 0 && stop_requested(t)) { why = STOP_SIGNAL; break; } /* between optimizer steps */
            if (t->max_steps && t->step >= t->max_steps) { why = STOP_MAX_STEPS; break; }
            if (epoch_micro == (long)steps_per_epoch * t->accumulate) break;
            if (micro == 0 && window_start < 0 && t->step >= t->warmup_steps) {
                device_sync(t);
                window_start = now_seconds();
                window_wait_start = loader_wait_seconds(t->train_loader);
                gpu_monitor_window_begin(t->monitor);
            }
            if (micro == 0) profile_step_begin(t);
            if (!take_batch(t, epoch_micro)) break;

            run_micro_batch(t, micro == 0, micro == t->accumulate - 1);
            phase_close(t, window_start >= 0);
            epoch_micro++;
            if (++micro < t->accumulate) continue;
            micro = 0;
            t->step++;
            last_step_epoch = epoch;
            if (t->sync_after_step) device_sync(t);
            profile_step_end(t);
            if (window_start >= 0) timed_samples += (long)t->batch * t->accumulate;

            int log_now = t->step % t->log_every == 0;
            if (log_now || (t->read_loss_every && t->step % t->read_loss_every == 0)) {
                loss = read_loss(t);
                count_bad_steps(t, epoch);
            }
            if (log_now) log_point(t, epoch, loss, &lw);
            if (t->progress) progress_draw(t, epoch, 0);
            if (t->max_bad_steps && t->bad_run >= t->max_bad_steps) { why = STOP_BAD_STEPS; break; }
            if (t->checkpoint_every && t->step % t->checkpoint_every == 0) save_checkpoint(t, cfg, epoch, epoch_micro);
        }
        if (t->use_gpu) release_held(t, t->train_loader);
        device_sync(t);
        double epoch_end = now_seconds();
        if (window_start >= 0) {
            timed_s += epoch_end - window_start;
            timed_wait_s += loader_wait_seconds(t->train_loader) - window_wait_start;
            gpu_monitor_window_end(t->monitor);
        }
        if (t->progress) progress_draw(t, epoch, 1);
        if (why == STOP_SIGNAL || why == STOP_BAD_STEPS) {
            /* The state after the last finished step, where the data order stands. */
            save_checkpoint(t, cfg, epoch, epoch_micro);
            break;
        }
        epoch_s_sum += epoch_end - epoch_start;
        out->epochs = epoch + 1;
        if (t->eval) {
            out->test_acc = evaluate(t, epoch);
            log_info("epoch %d: %.1f s, test accuracy %.2f%%", epoch + 1, epoch_end - epoch_start,
                     100 * out->test_acc);
        }
        write_metric_epoch(t, epoch, epoch_end - epoch_start, out->test_acc);
    }
    log_progress_end();
    profile_finish(t);
    if (why == RUN_ON && stop_signal) {
        /* The signal came after the last step (during the last evaluation). */
        why = STOP_SIGNAL;
        save_checkpoint(t, cfg, t->epochs - 1, (long)steps_per_epoch * t->accumulate);
    }
    if (t->step > t->first_step) {
        loss = read_loss(t);
        if (why != STOP_BAD_STEPS) count_bad_steps(t, last_step_epoch);
    }
    if (why == STOP_SIGNAL) {
        out->stopped = 1;
        out->exit_status = 128 + stop_signal;
        snprintf(out->stop_signal, sizeof out->stop_signal, "%s", stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
    } else if (why == STOP_BAD_STEPS) {
        out->stopped = 1;
        out->exit_status = 1;
        fflush(stdout);
        fprintf(stderr, "trainc: error: run.max_bad_steps = %d: %ld steps in a row had a non-finite loss or "
                "gradient and were skipped; stopped at step %ld with the parameters of step %ld%s%s\n",
                t->max_bad_steps, t->bad_run, t->step, t->step - t->bad_run,
                t->last_checkpoint_step == t->step ? ", saved in " : " (no checkpoint written)",
                t->last_checkpoint_step == t->step ? t->last_checkpoint : "");
    }
    _Static_assert(sizeof out->checkpoint == sizeof t->last_checkpoint, "checkpoint path sizes");
    memcpy(out->checkpoint, t->last_checkpoint, sizeof out->checkpoint);

    out->steps = t->step;
    out->timed_steps = timed_samples / ((long)t->batch * t->accumulate);
    out->samples_per_s = timed_s > 0 ? timed_samples / timed_s : 0;
    dist_allreduce_sum_host_double(dist, &out->samples_per_s, 1); /* every rank's, together */
    out->step_ms = out->timed_steps ? 1000 * timed_s / out->timed_steps : 0;
    out->epoch_s = out->epochs ? epoch_s_sum / out->epochs : 0;
    out->data_wait_frac = timed_s > 0 ? timed_wait_s / timed_s : 0;
    summarize_phases(t, out, timed_wait_s);
    out->final_loss = loss;
    out->loss_scale = NAN;
    {
        LossScalerState s;
        op_copy_to_host(&t->model.ops, &s, t->scaler, sizeof s);
        op_sync(&t->model.ops);
        if (t->amp != DTYPE_F32) out->loss_scale = s.scale;
        out->skipped_steps = s.skipped_steps;
        if (s.skipped_steps && t->amp != DTYPE_F32)
            log_info("%d steps skipped for an inf/NaN loss or gradients, loss scale now %g", s.skipped_steps, s.scale);
        else if (s.skipped_steps)
            log_info("%d steps skipped for an inf/NaN loss or gradients", s.skipped_steps);
    }
    out->peak_mem_bytes = t->model.arena.peak + t->aux.peak;
    if (t->use_gpu) {
        size_t free_b, total_b;
        gpu_memory_info(&free_b, &total_b);
        out->driver_mem_bytes = total_b - free_b;
        out->gpu_util = gpu_monitor_window_util(t->monitor);
    }
    if (timed_samples == 0)
        log_warn("no step fell inside the timed window (run.warmup_steps = %d, %ld steps taken): "
                 "samples_per_s is 0", t->warmup_steps, t->step);
    else
        log_phases(t, out);
    if (t->step > t->first_step) prometheus_update(t, out->samples_per_s, out->data_wait_frac, loss);

    {
        float *params = malloc(t->model.n_params * sizeof(float));
        if (!params) TC_FATAL("out of host memory copying %zu parameters", t->model.n_params);
        sync_sharded_state(t);
        model_get_params(&t->model, params);
        out->params_crc = ckpt_crc32(0, params, t->model.n_params * sizeof(float));
        if (params_out) *params_out = params;
        else free(params);
    }
    for (int first = 0; first < 2; first++)
        for (int last = 0; last < 2; last++)
            if (t->graphs[first][last]) gpu_graph_destroy(t->graphs[first][last]);
    if (dist->world > 1) grad_buckets_free(&t->buckets);
    gpu_monitor_record_to(t->monitor, NULL, 0, 0);
    if (t->metrics) fclose(t->metrics);
    fatal_metrics = NULL;
    prom_stop(t->prom);
    phases_destroy(t);
    loader_destroy(t->train_loader);
    if (t->test_loader) loader_destroy(t->test_loader);
    model_destroy(&t->model);
    for (int s = 0; s < 2 && t->use_gpu; s++) {
        gpu_event_destroy(t->staged[s]);
        gpu_event_destroy(t->consumed[s]);
    }
    arena_free(&t->aux);
    host_free(t->host_labels, 0);
    dataset_free(&t->train_set);
    dataset_free(&t->test_set);
    if (t->use_gpu) {
        gpu_monitor_stop(t->monitor);
        gpu_context_destroy(&t->gpu);
    }
    restore_stop_handlers(old_handlers);
}

/* Measured values keep 6 significant digits. */
static void json_measure(cJSON *obj, const char *key, double v) { json_add_number(obj, key, v, 6); }

void train_summary_print_json(const TrainSummary *s, FILE *f) {
    cJSON *o = json_object_new();
    json_add_string(o, "name", s->name);
    json_add_string(o, "device", s->device);
    json_add_string(o, "gpu", s->gpu_name);
    json_add_int(o, "world", s->world);
    json_add_int(o, "steps", s->steps);
    json_add_int(o, "timed_steps", s->timed_steps);
    json_add_int(o, "epochs", s->epochs);
    json_measure(o, "samples_per_s", s->samples_per_s);
    json_measure(o, "step_ms", s->step_ms);
    json_measure(o, "epoch_s", s->epoch_s);
    json_measure(o, "data_wait_frac", s->data_wait_frac);
    json_measure(o, "gpu_util", s->gpu_util >= 0 ? s->gpu_util / 100.0 : NAN);
    json_measure(o, "final_loss", s->final_loss);
    json_measure(o, "test_acc", s->test_acc >= 0 ? s->test_acc : NAN);
    json_measure(o, "loss_scale", s->loss_scale);
    json_add_int(o, "skipped_steps", s->skipped_steps);
    json_add_bool(o, "stopped", s->stopped);
    json_add_int(o, "params_crc", s->params_crc);
    json_add_string(o, "checkpoint", s->checkpoint);
    json_add_int(o, "peak_mem_bytes", (long long)s->peak_mem_bytes);
    json_add_int(o, "driver_mem_bytes", (long long)s->driver_mem_bytes);
    cJSON *phases = json_add_object(o, "phase_ms");
    json_measure(phases, "data_wait", s->phase_data_wait_ms);
    json_measure(phases, "input", s->phase_input_ms);
    json_measure(phases, "forward", s->phase_forward_ms);
    json_measure(phases, "backward", s->phase_backward_ms);
    json_measure(phases, "optimizer", s->phase_optimizer_ms);
    json_measure(phases, "graph", s->phase_graph_ms);
    json_measure(phases, "step", s->timed_steps ? s->step_ms : NAN);
    if (json_write_line(f, o) != 0) TC_USER_ERROR("writing the run's summary: %s", strerror(errno));
}
