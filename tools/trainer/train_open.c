/* Opening a run (settings, the GPU, data, model, optimizer, dist,
 * monitoring, resume) and closing it. */
#include <float.h>

#include "data/decode.h"
#include "dist/placement.h"
#include "models/netfile.h"
#include "models/whiten.h"
#include "runtime/files.h"
#include "tools/trainer/export.h"
#include "tools/trainer/trainer.h"

/* ---- the parts -------------------------------------------------------------- */

/* ceil(epochs x steps_per_epoch): the whole epochs' steps exactly (a whole
 * run.epochs as it always was), the fraction's within a few roundings of a
 * whole number being that number (0.7 x 10 is 7.000000000000001 in doubles). */
static long steps_for_epochs(double epochs, long steps_per_epoch) {
    double whole = floor(epochs), part = (epochs - whole) * (double)steps_per_epoch;
    double slack = 8 * DBL_EPSILON * epochs * (double)steps_per_epoch;
    return (long)whole * steps_per_epoch + (long)ceil(part - slack);
}

/* The run's length in optimizer steps and epochs begun, once the epoch's is
 * known; run.epochs > 0 (its range) makes it at least one step. */
static void plan_run_length(Trainer *t) {
    const TrainSettings *s = &t->set;
    t->run_steps = steps_for_epochs(s->run.epochs, t->steps_per_epoch);
    t->run_epochs = (int)((t->run_steps + t->steps_per_epoch - 1) / t->steps_per_epoch);
    long last_steps = t->run_steps - (long)(t->run_epochs - 1) * t->steps_per_epoch;
    if (last_steps < t->steps_per_epoch && t->ddp.dist->rank == 0)
        log_info("run.epochs = %g: %ld optimizer steps, epoch %d stopping after %ld of its %d", s->run.epochs,
                 t->run_steps, t->run_epochs, last_steps, t->steps_per_epoch);
}

/* The schedule in optimizer steps, once the run's length is known. */
static void plan_schedule(Trainer *t, long steps_per_epoch) {
    t->optim.schedule.base_lr = t->set.optim.lr;
    t->optim.schedule.total_steps = t->run_steps;
    t->optim.schedule.warmup_steps = (long)llround(t->set.optim.warmup_epochs * (double)steps_per_epoch);
    t->optim.schedule.warmup_start_factor = t->set.optim.warmup_start_factor;
    lr_schedule_check(&t->optim.schedule);
}

/* ---- the data ------------------------------------------------------------------ */

static const char *const cifar10_classes[10] = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                "dog",      "frog",       "horse", "ship", "truck"};

static int is_cifar10(const Source *s) {
    if (s->num_classes != 10 || !s->class_names) return 0;
    for (int k = 0; k < 10; k++)
        if (strcmp(s->class_names[k], cifar10_classes[k]) != 0) return 0;
    return 1;
}

/* data.mean and data.std left at auto: CIFAR-10's for its data, ImageNet's for the rest. */
static void resolve_normalisation(TrainSettings *s, const Source *train) {
    static const float cifar_mean[3] = {0.4914f, 0.4822f, 0.4465f}, cifar_std[3] = {0.2470f, 0.2435f, 0.2616f};
    static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f}, imagenet_std[3] = {0.229f, 0.224f, 0.225f};
    if (!s->data.mean_auto && !s->data.std_auto) return;
    int cifar = strcmp(s->data.source, "synthetic") == 0 || strcmp(s->data.source, "cifar_bin") == 0 ||
                is_cifar10(train);
    if (s->data.mean_auto) memcpy(s->data.mean, cifar ? cifar_mean : imagenet_mean, sizeof s->data.mean);
    if (s->data.std_auto) memcpy(s->data.std, cifar ? cifar_std : imagenet_std, sizeof s->data.std);
    s->data.mean_auto = s->data.std_auto = 0;
    log_info("data.mean, data.std = auto: %s's (%.4g,%.4g,%.4g), (%.4g,%.4g,%.4g)", cifar ? "CIFAR-10" : "ImageNet",
             s->data.mean[0], s->data.mean[1], s->data.mean[2], s->data.std[0], s->data.std[1], s->data.std[2]);
}

/* The split listed (a folder's files, the shards' index) or, for the sets that
 * are always in memory, loaded. 0, or -1 with the message in err. */
static int open_split(const TrainSettings *s, Source *src, int train, char *err, size_t errlen) {
    const char *source = s->data.source, *path = s->data.path, *split = train ? "train" : "test";
    int limit = train ? s->data.train_limit : s->data.test_limit;
    Dataset d;
    if (strcmp(source, "image_folder") == 0) return source_open_folder(src, path, split, limit, err, errlen);
    if (strcmp(source, "shards") == 0) return source_open_shards(src, path, split, limit, err, errlen);
    if (strcmp(source, "synthetic") == 0) {
        int n = train ? s->data.synthetic_train : s->data.synthetic_test;
        if (limit > 0 && limit < n) n = limit;
        int classes = s->model.num_classes ? s->model.num_classes : 10;
        synthetic_make(&d, n, 3, 32, 32, classes, s->run.seed * 2 + (uint64_t)train);
    } else if (cifar_bin_load(&d, path, train, limit, err, errlen) != 0) {
        return -1;
    }
    source_from_dataset(src, &d, path);
    return 0;
}

/* The decoded size a streaming split would take at its first image's size. */
static double decoded_mib(const Source *src) {
    SourceReader r;
    source_reader_init(&r);
    const uint8_t *bytes;
    size_t len;
    char err[4600], name[4400];
    ImageInfo info = {0};
    source_sample_name(src, 0, name, sizeof name);
    double mib = -1;
    if (source_read(src, 0, &r, &bytes, &len, err, sizeof err) == 0 &&
        image_probe(bytes, len, name, &info, err, sizeof err) == 0)
        mib = (double)src->n * 3.0 * info.w * info.h / 1048576.0;
    source_reader_close(&r);
    return mib;
}

/* Decoded once, in place; with fallback (data.cache = auto, data.crop =
 * random_resized) images of several sizes leave it streaming. 1: decoded. */
/* SIGINT or SIGTERM while the images are decoded: the process ends at once,
 * before the first step, with nothing to save. */
static void stopped_in_decode(const Source *src, const char *how_far, double seconds) {
    int signo = *train_stop_flag();
    fflush(stdout);
    fprintf(stderr, "trainc: stopped by %s while decoding the images of %s (%s, in %.1f s), before the first "
            "step: nothing to save, no checkpoint written\n", signo == SIGINT ? "SIGINT" : "SIGTERM", src->dir,
            how_far, seconds);
    exit(128 + signo);
}

static int decode_split(const TrainSettings *s, Source *src, int fallback, char *why, size_t whylen) {
    char err[4600];
    Dataset d;
    log_info("decoding the %d images of %s once into memory ...", src->n, src->dir);
    double t0 = now_seconds();
    int rc = source_decode_all(src, &d, train_stop_flag(), err, sizeof err);
    if (rc == -3) stopped_in_decode(src, err, now_seconds() - t0);
    if (rc == -2 && fallback) {
        snprintf(why, whylen, "its images differ in size (%.900s)", err);
        return 0;
    }
    if (rc != 0)
        settings_fail(s, "data.path", "%s (data.source = %s%s)", err, s->data.source,
                      rc == -2 ? "; images of several sizes stream with data.crop = random_resized" : "");
    log_info("decoded %d images of %dx%d in %.1f s (%.0f MiB)", d.n, d.w, d.h, now_seconds() - t0,
             (double)d.n * dataset_image_bytes(&d) / 1048576.0);
    char *dir = strdup(src->dir);
    source_free(src);
    source_from_dataset(src, &d, dir);
    free(dir);
    return 1;
}

/* data.cache: whether a streaming split is decoded once; why, for the log. */
static int choose_decoded(const TrainSettings *s, const Source *train, char *why, size_t whylen) {
    if (!s->data.resized_crop) {
        if (s->data.cache == DATA_CACHE_STREAM)
            settings_fail(s, "data.cache", "= stream needs data.crop = random_resized (data.crop = pad crops images "
                          "of one stored size, decoded once)");
        snprintf(why, whylen, "data.crop = pad crops images of one size, decoded once");
        return 1;
    }
    if (s->data.cache != DATA_CACHE_AUTO) {
        snprintf(why, whylen, "data.cache = %s", s->data.cache == DATA_CACHE_DECODED ? "decoded" : "stream");
        return s->data.cache == DATA_CACHE_DECODED;
    }
    double mib = decoded_mib(train);
    if (mib < 0) {
        snprintf(why, whylen, "data.cache = auto: streamed, as the first image does not read (its message comes "
                 "when it is taken)");
        return 0;
    }
    if (mib > (double)s->data.cache_mb) {
        snprintf(why, whylen, "data.cache = auto: decoded once, the %d images would take %.0f MiB, more than "
                 "data.cache_mb = %ld", train->n, mib, s->data.cache_mb);
        return 0;
    }
    snprintf(why, whylen, "data.cache = auto: %.0f MiB decoded, within data.cache_mb = %ld", mib, s->data.cache_mb);
    return 1;
}

/* The test split's labels must be classes of the training split. */
static void check_test_classes(const TrainSettings *s, const Source *train, const Source *test) {
    for (int i = 0; i < test->n; i++)
        if (test->labels[i] >= train->num_classes) {
            char name[4400];
            source_sample_name(test, i, name, sizeof name);
            settings_fail(s, "data.path", "%s: label %d, but the training split has %d classes", name,
                          test->labels[i], train->num_classes);
        }
}

/* model.num_classes: the data's, or checked against it. */
static void resolve_classes(TrainSettings *s, const Source *train) {
    if (train->num_classes < 2)
        settings_fail(s, "data.path", "%s holds %d class: a classifier needs 2 or more", train->dir,
                      train->num_classes);
    if (s->model.num_classes && s->model.num_classes != train->num_classes)
        settings_fail(s, "model.num_classes", "is %d, but %s holds %d classes (leave it at 0 to take the data's)",
                      s->model.num_classes, train->dir, train->num_classes);
    s->model.num_classes = train->num_classes;
}

void train_open_sources(TrainSettings *s, Source *train, Source *test) {
    char err[4600], why[1200] = "", test_why[1200] = "";
    memset(test, 0, sizeof *test);
    if (open_split(s, train, 1, err, sizeof err) != 0)
        settings_fail(s, "data.path", "%s (data.source = %s; set data.path to the data set, or data.source = "
                      "synthetic to measure throughput without it)", err, s->data.source);
    int streaming = train->kind != SOURCE_DECODED;
    int may_stream = s->data.cache == DATA_CACHE_AUTO && s->data.resized_crop;
    if (streaming && choose_decoded(s, train, why, sizeof why))
        streaming = !decode_split(s, train, may_stream, why, sizeof why);
    resolve_classes(s, train);
    resolve_normalisation(s, train);
    if (s->data.val_split > 0) {
        source_hold_out(train, s->data.val_split, s->run.seed, test);
        log_info("data.val_split = %g: %d of the %d training images held out for evaluation (run.seed %llu); the "
                 "test split is not read", s->data.val_split, test->n, train->n + test->n,
                 (unsigned long long)s->run.seed);
    } else if (s->run.eval) {
        if (open_split(s, test, 0, err, sizeof err) != 0)
            settings_fail(s, "data.path", "%s (data.source = %s; without a test split, data.val_split = 0.05 holds "
                          "out a share of the training split to evaluate on)", err, s->data.source);
        /* As the training split; with data.crop = pad a size unlike the first image's stops here. */
        if (test->kind != SOURCE_DECODED && !streaming)
            decode_split(s, test, s->data.resized_crop, test_why, sizeof test_why);
        check_test_classes(s, train, test);
    }
    if (train->kind != SOURCE_DECODED)
        log_info("data: %d training images streamed from %s (%.1f GiB encoded; %s)", train->n, train->dir,
                 train->bytes_total / 1073741824.0, why);
    else if (why[0])
        log_info("data: %d training images decoded once (%s)", train->n, why);
}

void train_loader_config(const TrainSettings *s, int train, LoaderConfig *lc) {
    memset(lc, 0, sizeof *lc);
    lc->batch = s->train.batch;
    lc->workers = s->data.workers;
    lc->prefetch = s->data.prefetch;
    lc->pinned = s->data.pinned;
    lc->shuffle = train && s->data.shuffle;
    lc->shuffle_shards = s->data.shuffle_shards;
    lc->drop_last = train; /* every training step sees a full batch */
    lc->augment = train;
    lc->raw = s->data.transform_on_gpu;
    lc->resized_crop = s->data.resized_crop;
    lc->crop = (CropRecipe){s->data.crop_scale_min, s->data.crop_scale_max, s->data.crop_ratio_min,
                            s->data.crop_ratio_max, s->data.eval_resize};
    lc->dct_scaling = s->data.dct_scaling;
    lc->cpu_share = s->data.gpu_cpu_share;
    lc->skip_bad = s->data.skip_bad;
    lc->seed = s->run.seed;
    transform_spec_default(&lc->transform, s->data.image_size, s->data.image_size);
    memcpy(lc->transform.mean, s->data.mean, sizeof lc->transform.mean);
    memcpy(lc->transform.std, s->data.std, sizeof lc->transform.std);
    lc->transform.flip = s->data.flip;
    lc->transform.crop_pad = s->data.crop_pad;
    lc->transform.pad_reflect = s->data.pad_reflect;
    lc->transform.cutout = s->data.cutout;
}

/* data.decode: whether the GPU decodes the training split's JPEGs, and why. */
static int choose_gpu_decode(const Trainer *t, char *why, size_t whylen) {
    const TrainSettings *s = &t->set;
    const char *cpu_reason = s->data.decode == DATA_DECODE_CPU           ? "data.decode = cpu"
                             : !s->run.use_gpu                           ? "the run is on the CPU"
                             : !s->data.resized_crop                     ? "data.crop = pad"
                             : t->data.train.kind == SOURCE_DECODED      ? "the training images are decoded once"
                             : s->data.resident                          ? "data.resident trains on one batch"
                                                                         : NULL;
    if (cpu_reason) {
        if (s->data.decode == DATA_DECODE_GPU)
            settings_fail(s, "data.decode", "= gpu decodes streamed images, but here %s", cpu_reason);
        snprintf(why, whylen, "%s", cpu_reason);
        return 0;
    }
    return 1;
}

/* The GPU decoder of the training split, or NULL (the loader's threads decode). */
static GpuDecoder *open_gpu_decoder(Trainer *t, Loader *l) {
    char why[512];
    const char *backend = NULL;
    GpuDecoder *d = gpu_decoder_create(l, t->device.gpu.device_id, t->set.train.batch, why, sizeof why, &backend);
    if (d) {
        log_info("data.decode: JPEGs decoded on the GPU by %s, cropped, resampled and normalised into the model's "
                 "input by one kernel; PNG, BMP, CMYK and progressive files, and %g%% of the JPEGs "
                 "(data.gpu_cpu_share), decoded by the %d loader threads",
                 backend, 100.0 * t->set.data.gpu_cpu_share, t->set.data.workers);
        return d;
    }
    if (t->set.data.decode == DATA_DECODE_GPU) settings_fail(&t->set, "data.decode", "= gpu: %s", why);
    log_info("data.decode = auto: the loader threads decode, as %s", why);
    return NULL;
}

static Loader *make_loader(Trainer *t, const Source *src, int train) {
    LoaderConfig lc;
    train_loader_config(&t->set, train, &lc);
    lc.rank = t->ddp.dist->rank; /* each rank its shard of the same shuffle */
    lc.world = t->ddp.dist->world;
    if (train && t->set.data.on_device) {
        lc.workers = 0; /* asked only for each epoch's plan (loader_epoch_plan) */
        lc.prefetch = 1;
        lc.pinned = 0;
        lc.raw = 1;
    }
    if (!train && t->set.run.eval_tta) lc.raw = 1; /* the views are made from the stored images */
    char why[512] = "";
    lc.encoded = train && choose_gpu_decode(t, why, sizeof why);
    if (train && !lc.encoded && src->kind != SOURCE_DECODED)
        log_info("data.decode: the %d loader threads decode (%s)%s", t->set.data.workers, why,
                 t->set.data.dct_scaling ? ", JPEGs at 1/2, 1/4 or 1/8 where the crop allows (data.dct_scaling)" : "");
    if (train) {
        int c, h, w;
        input_raw_shape(t, &c, &h, &w);
        gpu_transform_args_init(&t->input.transform_args, &lc.transform, c, h, w);
        if (src->n / t->ddp.dist->world < t->set.train.batch)
            settings_fail(&t->set, "train.batch", "is larger than the %d training images%s",
                          src->n / t->ddp.dist->world, t->ddp.dist->world > 1 ? " of this rank's shard" : "");
    }
    Loader *l = loader_create_source(src, &lc);
    if (lc.encoded && !(t->data.train_decoder = open_gpu_decoder(t, l))) {
        loader_destroy(l); /* back to the threads' decode */
        lc.encoded = 0;
        l = loader_create_source(src, &lc);
    }
    return l;
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
        double bytes = (double)elems * (double)dtype_size(t->set.precision.amp);
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

/* dist.copy_engine: all-reduces of at least this much go through the copy
 * engines; below it NCCL's latency is lower. */
#define COPY_ENGINE_MIN_BYTES ((size_t)1 << 20)

static void use_copy_engines(Trainer *t) {
    Switch mode = t->set.dist.copy_engine;
    if (mode == SWITCH_OFF) return;
    char why[256] = "";
    int linked = 0;
    GPU_ONLY(linked = grad_buckets_use_peer_link(&t->ddp.buckets, COPY_ENGINE_MIN_BYTES, why, sizeof why));
    if (linked) return;
    if (mode == SWITCH_ON) settings_fail(&t->set, "dist.copy_engine", "%s (auto falls back to NCCL)", why);
    if (t->ddp.dist->rank == 0) log_info("dist.copy_engine = auto: NCCL alone, as %s", why);
}

static void shard_optimizer(Trainer *t) {
    Switch mode = t->set.dist.shard_optimizer;
    if (mode == SWITCH_OFF) return;
    char why[256] = "";
    if (t->set.optim.clip_norm > 0)
        snprintf(why, sizeof why, "optim.clip_norm needs the whole gradient on every rank");
    else if (t->set.optim.muon)
        snprintf(why, sizeof why, "optim.muon steps whole filters on every rank");
    else
        GPU_ONLY(t->ddp.shard_optimizer = grad_buckets_shard_optimizer(&t->ddp.buckets, t->model.weights,
                                                                       t->model.act_dtype, why, sizeof why));
    t->ddp.state_synced_step = -1;
    if (t->ddp.shard_optimizer) return;
    if (mode == SWITCH_ON)
        settings_fail(&t->set, "dist.shard_optimizer", "%s (auto falls back to every rank updating)", why);
    if (t->ddp.dist->rank == 0) log_info("dist.shard_optimizer = auto: every rank updates every parameter, as %s", why);
}

/* The GPU this process takes: run.gpu alone, the local rank's (dist/placement.h)
 * with several ranks; a message naming the key when there is none. */
int trainer_gpu_ordinal(const TrainSettings *s, const Dist *dist) {
    if (!TRAINC_CUDA)
        settings_fail(s, "run.device", "this trainc was built without CUDA (TRAINC_CUDA=OFF), so it runs on "
                      "the CPU only: use --device cpu (or configs/cpu.ini)");
    int devices = gpu_count();
    int ordinal = s->run.gpu;
    if (devices == 0) settings_fail(s, "run.device", "no GPU is visible (use --device cpu)");
    if (dist->world > 1) {
        char err[256];
        ordinal = dist_pick_device(dist->local_rank, dist->local_world, devices, err, sizeof err);
        if (ordinal < 0) TC_USER_ERROR("%s", err);
    }
    if (ordinal >= devices) settings_fail(s, "run.gpu", "names no visible GPU (%d visible)", devices);
    return ordinal;
}

/* The GPU of this rank, and with several ranks NCCL. */
static void open_gpu(Trainer *t, TrainSummary *out) {
    Dist *dist = t->ddp.dist;
    int ordinal = trainer_gpu_ordinal(&t->set, dist);
    gpu_context_init(&t->device.gpu, ordinal);
    if (dist->world > 1 && !dist->nccl) {
        dist_nccl_socket_defaults(dist, t->set.dist.socket_threads, t->set.dist.sockets_per_thread);
        GPU_ONLY(dist_init_nccl(dist, ordinal));
    }
    snprintf(out->gpu_name, sizeof out->gpu_name, "%.200s", t->device.gpu.name);
    t->device.monitor = gpu_monitor_start(ordinal, 0.1);
}

static FILE *fatal_metrics; /* flushed by the fatal hook */
static void flush_on_fatal(void) {
    log_progress_end(); /* the error goes on a line of its own */
    if (fatal_metrics) fflush(fatal_metrics);
}

/* ---- opening: settings, GPU, data, model, optimizer, dist, resume, loaders -- */

static void open_settings(Trainer *t, const Config *cfg, Dist *dist, TrainSummary *out) {
    static int hook_registered;
    t->ddp.dist = dist;
    memset(out, 0, sizeof *out);
    settings_read(cfg, dist->world, &t->set);
    if (t->weights_net && t->weights_net->net_text) { /* the checkpoint's own net, by the name it was trained as */
        t->set.model.name = t->weights_net->name;
        t->set.model.net = NULL;
    }
    if (t->set.run.profile_first && !t->set.run.use_gpu)
        log_warn("run.profile_steps: the CPU path has no CUDA profiler range; ignored");
    if (dist->rank == 0) prometheus_start(t);
    if (dist->rank == 0) tensorboard_start(t);
    if (!hook_registered) tc_on_fatal(flush_on_fatal);
    hook_registered = 1;
}

static void open_summary(const Trainer *t, TrainSummary *out) {
    snprintf(out->name, sizeof out->name, "%s", t->set.run.name);
    out->world = t->ddp.dist->world;
    snprintf(out->device, sizeof out->device, "%s", t->set.run.use_gpu ? "cuda" : "cpu");
    out->gpu_util = -1;
    out->power_w = out->power_capped = out->power_limit_w = -1;
    out->test_acc = -1;
}

static void open_data(Trainer *t) {
    const Source *train = &t->data.train, *test = &t->data.test;
    gpu_range_push("load data");
    train_open_sources(&t->set, &t->data.train, &t->data.test);
    gpu_range_pop();
    const Dataset *a = &train->decoded, *b = &test->decoded;
    int both_decoded = train->kind == SOURCE_DECODED && test->kind == SOURCE_DECODED && test->n > 0;
    if (both_decoded && !t->set.data.resized_crop && (a->c != b->c || a->h != b->h || a->w != b->w))
        TC_USER_ERROR("%s: test images are %dx%dx%d, training images %dx%dx%d (data.crop = random_resized crops "
                      "images of any size)", t->set.data.path, b->c, b->h, b->w, a->c, a->h, a->w);
    if (train->kind == SOURCE_DECODED)
        log_info("data: %d training images%s, %dx%d, %d classes", train->n, t->set.run.eval ? "" : " (no evaluation)",
                 a->h, a->w, train->num_classes);
    else
        log_info("data: %d training images%s, of any size, %d classes", train->n,
                 t->set.run.eval ? "" : " (no evaluation)", train->num_classes);
    if (t->set.data.on_device && train->kind != SOURCE_DECODED)
        settings_fail(&t->set, "data.on_device", "needs the training images decoded once (data.cache = decoded)");
}

/* The net as model.* says, with its policies and the dist.sync_bn hook. */
static void build_model(Trainer *t) {
    const TrainSettings *s = &t->set;
    Model *m = &t->model;
    char err[512];
    if (t->weights_net && t->weights_net->net_text) {
        NetShape shape = {s->train.batch, s->data.image_size, s->model.num_classes, s->model.nhwc};
        char label[4300];
        snprintf(label, sizeof label, "%s (its net)", t->weights_from);
        if (netfile_build(m, label, t->weights_net->net_text, &shape, err, sizeof err) != 0)
            TC_USER_ERROR("--checkpoint %s: its net cannot be built: %s", t->weights_from, err);
    } else if (settings_build_net(s, m, s->train.batch, s->model.nhwc, &t->net_text, err, sizeof err) != 0)
        tc_fatal(NULL, 0, "%s (%s from %s, data.image_size from %s)", err, s->model.net ? "model.net" : "model.name",
                 settings_origin(s, s->model.net ? "model.net" : "model.name"), settings_origin(s, "data.image_size"));
    m->conv_policy.workspace_limit = s->perf.conv_workspace_bytes;
    m->conv_policy.allow_tf32 = s->precision.tf32;
    m->conv_policy.deterministic = s->perf.deterministic;
    m->conv_policy.benchmark = s->perf.conv_benchmark;
    if (s->perf.conv_benchmark && t->ddp.dist->world > 1) { /* every rank the same kernels */
        m->conv_policy.agree = dist_mean_timings;
        m->conv_policy.agree_user = t->ddp.dist;
        if (t->ddp.dist->rank == 0)
            log_info("perf.conv_benchmark: the %d ranks choose together, each candidate by its mean time over them, "
                     "so that they run the same kernels", t->ddp.dist->world);
    }
    m->checkpoint = s->memory.checkpoint_blocks;
    m->fuse = s->model.fuse != 0;
    m->fuse_graphs = s->model.fuse == MODEL_FUSE_GRAPHS;
    m->overlap_wgrad = s->perf.overlap_wgrad;
    m->bn_momentum = s->model.bn_momentum;
    m->bn_eps = s->model.bn_eps;
    m->nvtx_layers = s->run.nvtx_layers;
    m->act_dtype = s->precision.amp;
    m->no_decay_bn_bias = !s->optim.decay_bn_bias;
    m->bn_weight_fixed = s->model.bn_weight_fixed;
    m->bn_bias_lr_scale = s->optim.bn_bias_lr_scale;
    m->head_lr_scale = s->optim.head_lr_scale;
    m->muon = s->optim.muon;
    m->adam = optim_is_adam(s->optim.name);
    if (s->dist.sync_bn && !m->n_bn_stats) {
        if (t->ddp.dist->rank == 0) log_warn("dist.sync_bn = on: %s has no batch norm; ignored", s->model.name);
    } else if (s->dist.sync_bn && t->ddp.dist->world > 1) {
        m->bn_allreduce = sync_bn_allreduce;
        m->bn_allreduce_ctx = t;
    }
}

/* A whitening layer's weights from the 2x2 patches of WHITEN_IMAGES training
 * images picked by the seed, normalised as the loader normalises them. Every
 * rank picks the same ones. */
static void whiten_from_data(Trainer *t, uint64_t seed) {
    const Dataset *d = &t->data.train.decoded;
    Model *m = &t->model;
    if (t->data.train.kind != SOURCE_DECODED)
        settings_fail(&t->set, "data.cache", "the whitening layer of %s needs the training images decoded once",
                      t->set.model.name);
    if (d->h != m->acts[0].h || d->w != m->acts[0].w || d->c != m->acts[0].c_real)
        settings_fail(&t->set, "data.image_size", "the whitening layer of %s needs training images of its input, "
                      "%dx%dx%d, as stored (these are %dx%dx%d)", t->set.model.name, m->acts[0].c_real, m->acts[0].h,
                      m->acts[0].w, d->c, d->h, d->w);
    int n = d->n < WHITEN_IMAGES ? d->n : WHITEN_IMAGES, k = 4 * d->c;
    size_t image = dataset_image_bytes(d);
    int *order = malloc(sizeof(int) * d->n);
    float *images = malloc(sizeof(float) * image * n), *filters = malloc(sizeof(float) * 2 * k * k);
    double *moment = malloc(sizeof(double) * k * k);
    if (!order || !images || !filters || !moment) TC_FATAL("out of host memory: whitening");
    TransformSpec spec;
    transform_spec_default(&spec, d->h, d->w);
    uint64_t state = seed ^ 0x5768697465ULL;
    for (int i = 0; i < d->n; i++) order[i] = i;
    for (int i = 0; i < n; i++) { /* the first n of a random permutation */
        int j = i + (int)(rng_splitmix64(&state) % (uint64_t)(d->n - i)), tmp = order[i];
        order[i] = order[j], order[j] = tmp;
    }
    for (int i = 0; i < n; i++) {
        const uint8_t *px = dataset_image(d, order[i]);
        for (size_t p = 0; p < image; p++) {
            int ch = (int)(p / ((size_t)d->h * d->w));
            images[(size_t)i * image + p] = (px[p] / 255.0f - spec.mean[ch]) / spec.std[ch];
        }
    }
    whiten_patch_moment(images, n, d->c, d->h, d->w, moment);
    if (whiten_filters(moment, k, WHITEN_EPS, filters) != 0)
        TC_USER_ERROR("%s: the training images' 2x2 patch moment has no eigen-decomposition", t->set.data.path);
    model_set_whitening(m, filters);
    log_info("whitening: %d filters from the 2x2 patches of %d training images", 2 * k, n);
    free(order), free(images), free(filters), free(moment);
}

/* optim.muon: the filters it steps and its settings (its scratch comes with state_alloc). */
static void muon_open(Trainer *t) {
    const TrainSettings *s = &t->set;
    model_muon_matrices(&t->model, &t->optim.muon_mats);
    if (!s->optim.muon) return;
    if (!t->optim.muon_mats.n)
        settings_fail(s, "optim.muon", "%s has no trained convolution for Muon to step", s->model.name);
    t->optim.muon = (MuonParams){.momentum = s->optim.muon_momentum, .nesterov = 1, .ns_steps = s->optim.muon_ns_steps,
                                 .lr_mult = s->optim.muon_lr / s->optim.lr, .normalize_weights = 1};
}

/* optim.name = adamw or adam: the step's settings, its masks and clip factor SGD's. */
static void adam_open(Trainer *t) {
    const TrainSettings *s = &t->set;
    if (!t->model.adam) return;
    t->optim.adam = (AdamwParams){.beta1 = s->optim.beta1, .beta2 = s->optim.beta2, .eps = s->optim.eps,
                                  .weight_decay = s->optim.weight_decay, .decoupled = s->optim.name == OPTIM_ADAMW,
                                  .accumulate = s->memory.accumulate, .decay_mask = t->model.decay_mask,
                                  .grad_mult = t->buf.clip_factor, .lr_scale = t->model.lr_scale};
    if (t->ddp.dist->rank == 0)
        log_info("optimizer: %s, betas %g and %g, eps %g, weight decay %g (%s)", settings_optim_name(s->optim.name),
                 s->optim.beta1, s->optim.beta2, s->optim.eps, s->optim.weight_decay,
                 s->optim.name == OPTIM_ADAMW ? "decoupled" : "L2, in the gradient");
}

/* The model's buffers and ours on the device, and the SGD step's masks. */
static void open_model(Trainer *t) {
    build_model(t);
    if (t->set.run.use_gpu && t->set.precision.tf32) gpu_allow_tf32_gemm(&t->device.gpu);
    if (t->set.run.use_gpu) check_activation_sizes(t);
    model_finalize(&t->model, t->set.run.use_gpu ? &t->device.gpu : NULL, t->set.run.seed);
    muon_open(t);
    state_alloc(t);
    tta_prepare(t);
    t->optim.sgd.momentum = t->set.optim.momentum;
    t->optim.sgd.weight_decay = t->set.optim.weight_decay;
    t->optim.sgd.nesterov = t->set.optim.nesterov;
    t->optim.sgd.decay_mask = t->model.decay_mask;
    t->optim.sgd.grad_mult = t->buf.clip_factor; /* NULL: no clipping */
    t->optim.muon.grad_mult = t->buf.clip_factor;
    t->optim.sgd.lr_scale = t->model.lr_scale;   /* NULL: every parameter at optim.lr */
    adam_open(t);
    t->optim.whiten_layer = model_whitening_layer(&t->model);
    t->optim.whiten_prefix = whitening_frozen_prefix(&t->model);
    if (t->optim.whiten_layer >= 0) whiten_from_data(t, (uint64_t)t->set.run.seed);
    t->optim.schedule.kind = t->set.optim.schedule;
    t->optim.schedule.final_lr = t->set.optim.final_lr;
}

/* Data-parallel: the gradient buckets, the copy engines, the sharded optimizer. */
static void open_dist(Trainer *t) {
    Dist *dist = t->ddp.dist;
    if (dist->world == 1) return;
    /* Buckets follow the layers, whose gradients backward finishes one at a time. */
    size_t layer_starts[MODEL_MAX_LAYERS];
    int n_starts = 0;
    for (int i = 0; i < t->model.n_layers; i++)
        if (t->model.layers[i].w_count && t->model.layers[i].w_off > 0)
            layer_starts[n_starts++] = t->model.layers[i].w_off;
    grad_buckets_init_layers(&t->ddp.buckets, dist, t->model.grads, t->model.act_dtype, t->model.n_params,
                             t->set.dist.bucket_bytes, t->set.dist.allreduce_dtype, layer_starts, n_starts);
    /* On the CPU, ranks average over MPI: settings_read refused the copy engines there. */
    if (t->set.run.use_gpu) {
        GPU_ONLY(grad_buckets_reduce_flag(&t->ddp.buckets, &t->buf.scaler->found_inf));
        use_copy_engines(t);
        shard_optimizer(t);
    }
    log_info("data-parallel: %d ranks x train.batch %d x memory.accumulate %d = a global batch of %d%s",
             dist->world, t->set.train.batch, t->set.memory.accumulate,
             dist->world * t->set.train.batch * t->set.memory.accumulate,
             t->model.bn_allreduce ? "; batch norm over all ranks (dist.sync_bn)" : "");
}

/* run.init_from: weights from a safetensors file; the optimizer starts fresh. */
static void open_init_from(Trainer *t) {
    char err[4400];
    if (!t->set.run.init_from[0]) return;
    if (import_safetensors(&t->model, t->set.run.init_from, err, sizeof err) != 0)
        TC_USER_ERROR("run.init_from: %s", err);
    log_info("weights from %s", t->set.run.init_from);
}

/* run.resume (opened before anything was loaded), and the checkpoint folder's check. */
static CkptPosition open_resume_point(Trainer *t, CkptFile *resume) {
    CkptPosition start = {0, 0, 0};
    if (resume) {
        start = load_checkpoint(t, resume);
        ckpt_close(resume);
    }
    if (t->set.checkpoint.every || t->set.checkpoint.save_final) check_checkpoint_dir(t, resume ? t->step : -1);
    return start;
}

/* The loaders, the metrics file, the GPU samples into it, the schedule and the phase ring. */
/* Lookahead's slow copies: the weights and statistics the run starts from. */
static void lookahead_start(Trainer *t) {
    Model *m = &t->model;
    if (!t->buf.slow_params) return;
    op_copy(&m->ops, t->buf.slow_params, m->params, m->n_params * sizeof(float));
    if (t->buf.slow_bn) op_copy(&m->ops, t->buf.slow_bn, m->bn_running, m->n_bn_stats * sizeof(float));
    op_sync(&m->ops);
}

/* optim.lookahead_every: its schedule over the run's steps, and the slow
 * copies starting from the weights the run starts from (initialised,
 * whitened, loaded or resumed). */
static void open_lookahead(Trainer *t) {
    const TrainSettings *s = &t->set;
    if (s->optim.lookahead_every <= 0) return;
    if (t->ddp.shard_optimizer)
        settings_fail(s, "optim.lookahead_every", "lookahead needs every parameter on every rank: set "
                      "dist.shard_optimizer = off");
    t->optim.lookahead = (LookaheadParams){s->optim.lookahead_every, t->watch.total_steps, s->optim.lookahead_alpha,
                                           s->optim.lookahead_power};
    lookahead_start(t);
}

static void open_loop(Trainer *t, double run_start) {
    const TrainSettings *s = &t->set;
    t->data.train_loader = make_loader(t, &t->data.train, 1);
    if (s->run.eval) t->data.test_loader = make_loader(t, &t->data.test, 0);
    if (s->run.metrics_file[0] && t->ddp.dist->rank == 0) {
        char err[4400];
        t->watch.metrics = files_open_output(s->run.metrics_file, 1, err, sizeof err);
        if (!t->watch.metrics) TC_USER_ERROR("run.metrics_file = %s: %s", s->run.metrics_file, err);
        fatal_metrics = t->watch.metrics;
    }
    if (t->watch.metrics && t->device.monitor && s->monitor.sample_every_s > 0)
        gpu_monitor_record_to(t->device.monitor, t->watch.metrics, s->monitor.sample_every_s, run_start);
    t->steps_per_epoch = loader_batches_per_epoch(t->data.train_loader) / s->memory.accumulate;
    if (t->steps_per_epoch == 0)
        settings_fail(s, "memory.accumulate", "micro-batches of train.batch = %d are more than an epoch of %d images",
                      s->train.batch, t->data.train.n);
    plan_run_length(t);
    plan_schedule(t, t->steps_per_epoch);
    t->optim.whiten_bias_steps = (long)ceil(s->model.whiten_bias_epochs * (double)t->steps_per_epoch);
    t->watch.total_steps = t->run_steps;
    if (s->run.max_steps && s->run.max_steps < t->watch.total_steps) t->watch.total_steps = s->run.max_steps;
    open_lookahead(t);
    phases_init(t);
    t->watch.progress = isatty(2) && !log_is_quiet();
    t->seen.loss = NAN;
}

CkptPosition trainer_open(Trainer *t, const Config *cfg, Dist *dist, TrainSummary *out, double run_start) {
    open_settings(t, cfg, dist, out);
    choose_final_dir(t);
    if (t->set.checkpoint.every || t->set.checkpoint.save_final || strcmp(t->set.run.resume, "latest") == 0)
        lock_checkpoint_dir(t, 1);
    /* run.resume: the file is checked end to end before anything is loaded. */
    const char *resume_from = t->weights_from ? t->weights_from : t->set.run.resume;
    CkptFile *resume = resume_from[0] ? open_resume(t, resume_from) : NULL;
    if (!resume && strcmp(config_origin(cfg, "run.resume"), "default") != 0)
        log_warn("run.resume is empty (%s): training from scratch, not resuming", config_origin(cfg, "run.resume"));
    open_summary(t, out);
    if (t->set.run.use_gpu) open_gpu(t, out);
    open_data(t);
    open_model(t);
    open_dist(t);
    log_info("model: %s, %zu parameters, %.1f MiB on %s", t->set.model.name, model_param_count(&t->model),
             model_bytes(&t->model) / 1048576.0, out->device);
    open_init_from(t);
    CkptPosition start = open_resume_point(t, resume);
    open_loop(t, run_start);
    return start;
}

/* ---- the next run (run.repeats) ------------------------------------------------- */

void trainer_restart(Trainer *t, uint64_t seed) {
    const OpContext *ctx = &t->model.ops;
    device_sync(t);
    model_init_params(&t->model, seed); /* the whitening bias's learning-rate share too */
    if (t->optim.whiten_layer >= 0) whiten_from_data(t, seed);
    lookahead_start(t);
    model_reset_optimizer(&t->model);
    model_zero_grads(&t->model);
    t->seen.scaler = loss_scaler_initial(t->set.precision.scale_init);
    op_copy_from_host(ctx, t->buf.lr, &t->set.optim.lr, sizeof(float));
    op_fill(ctx, t->buf.lr_step, 0, sizeof(int64_t));
    op_copy_from_host(ctx, t->buf.scaler, &t->seen.scaler, sizeof t->seen.scaler);
    device_sync(t);
    t->step = t->first_step = t->seen.step = t->seen.bad_total = t->seen.bad_run = 0;
    t->seen.loss = NAN;
    loader_set_seed(t->data.train_loader, seed);
    t->input.planned_epoch = -1; /* drawn from the last seed */
}

/* ---- closing ------------------------------------------------------------------ */

void trainer_close(Trainer *t) {
    cudaGraphExec_t *graph = &t->optim.graphs[0][0][0];
    for (size_t i = 0; i < sizeof t->optim.graphs / sizeof *graph; i++)
        if (graph[i]) gpu_graph_destroy(graph[i]);
    if (t->ddp.dist->world > 1) grad_buckets_free(&t->ddp.buckets);
    gpu_monitor_record_to(t->device.monitor, NULL, 0, 0);
    if (t->watch.metrics) fclose(t->watch.metrics);
    fatal_metrics = NULL;
    ckpt_unlock_dir(t->set.checkpoint.dir);
    prom_stop(t->watch.prom);
    tensorboard_stop(t);
    phases_destroy(t);
    if (t->data.train_decoder) {
        GpuDecodeStages st;
        gpu_decoder_stages(t->data.train_decoder, &st);
        double n = st.batches > 0 ? (double)st.batches : 1;
        log_info("data.decode = gpu: %ld batches (%ld JPEGs on the GPU, %ld images decoded on the CPU); a batch took "
                 "the decoder thread %.2f ms waiting for the loader threads and %.2f ms submitting, and the device "
                 "%.2f ms from its submission to its last copy", st.batches, st.gpu_images, st.cpu_images, 1e3 * st.wait_s / n,
                 1e3 * st.submit_s / n, 1e3 * st.decode_s / n);
    }
    gpu_decoder_destroy(t->data.train_decoder); /* before its loader */
    loader_destroy(t->data.train_loader);
    if (t->data.test_loader) loader_destroy(t->data.test_loader);
    model_destroy(&t->model);
    free(t->net_text);
    state_free(t);
    source_free(&t->data.train);
    source_free(&t->data.test);
    if (t->set.run.use_gpu) {
        gpu_monitor_stop(t->device.monitor);
        gpu_context_destroy(&t->device.gpu);
    }
}
