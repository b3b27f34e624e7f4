/* The batch loader. Batch b of an epoch is built in ring slot b % prefetch.
 * Work is handed out in order from one counter, in chunks of a batch, so that
 * all workers stay busy even when the ring is shallow; a slot is opened for
 * batch b only once the consumer has released batch b - prefetch from it.
 * Every sample's augmentation comes from its own seed, so the bytes of a batch
 * do not depend on which worker built which chunk. */
#include "data/loader.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/decode.h"
#include "data/transform_plan.h"
#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/log.h"

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD };

/* How a sample is made (loader.h's header). */
typedef enum { MODE_PLAN, MODE_RESAMPLE, MODE_ENCODED } SampleMode;

typedef struct {
    void *memory;            /* one allocation holding the arrays below but the encoded bytes */
    float *images;           /* float modes: batch * sample_floats; else NULL */
    uint8_t *raw_images;     /* raw mode: batch * raw_image_bytes; else NULL */
    TransformParams *params; /* raw mode: batch; else NULL */
    EncodedSample *samples;  /* encoded mode: batch */
    uint8_t *fallback;       /* encoded mode: batch * out_bytes */
    uint8_t *encoded;        /* encoded mode: its own allocation of encoded_cap bytes */
    size_t encoded_cap;
    atomic_llong encoded_used; /* bytes of encoded taken by the batch's samples so far */
    int32_t *labels;         /* batch */
    int state;
    int batch;       /* FREE: the batch allowed in next; otherwise the batch it holds */
    int n;           /* samples of that batch */
    int chunks_left; /* FILLING: chunks not yet done */
    atomic_int failed; /* a sample of the batch failed: the rest is not built */
    char *error;     /* (under the lock) its message, raised by loader_next; NULL: none */
} Slot;

/* A worker's counters, read by loader_stages while it runs. */
typedef struct {
    atomic_llong read_ns, decode_ns, augment_ns, samples, gpu_decoded, cpu_decoded;
} StageClock;

typedef struct {
    struct Loader *loader;
    pthread_t thread;
    float *scratch;          /* MODE_PLAN's float path */
    ResampleScratch resample;
    DecodeBuffers decode;
    SourceReader reader;
    StageClock clock;
} Worker;

struct Loader {
    const Source *src;
    Source view;           /* loader_create: the Dataset seen as a source */
    LoaderConfig cfg;
    SampleMode mode;
    TransformPlan plan;    /* MODE_PLAN */
    int out_h, out_w;
    size_t sample_floats;
    size_t raw_image_bytes; /* one raw-mode image */
    size_t out_bytes;       /* 3 x out_h x out_w */
    int samples;           /* per epoch: the data set, or this rank's shard of it */
    int batches_per_epoch;
    int chunk_samples;     /* samples per work unit */
    int chunks_per_batch;

    Slot *ring;            /* cfg.prefetch slots, pinned when cfg.pinned */
    int32_t *order;        /* source index of each position in the epoch (this rank's) */
    int32_t *global_order; /* world > 1: the permutation all ranks share; else NULL */
    Worker *workers;
    Worker caller;         /* workers = 0: the consumer's own buffers */

    /* skip_bad: each file passed over is marked once, counted and named. */
    atomic_uchar *bad;
    atomic_long skipped;

    pthread_mutex_t lock;
    pthread_cond_t work_changed; /* for workers: new work, a slot released, stop */
    pthread_cond_t slot_changed; /* for the consumer: a batch ready, a fill stopped */
    /* Bumped by loader_start_epoch and loader_destroy; fills in flight read it
     * without the lock and stop at the next sample when it moves. */
    atomic_int generation;
    int epoch;           /* -1 before the first loader_start_epoch */
    int next_unit;       /* next chunk to hand out: batch * chunks_per_batch + chunk */
    int units_per_epoch;
    int workers_filling; /* workers between claiming a chunk and publishing it */
    int stopping;

    int held;            /* batches out with the consumer */
    /* Only the consumer's thread touches these. */
    int next_consume;
    double wait_seconds;
};

static int batch_samples(const Loader *l, int b) {
    int first = b * l->cfg.batch;
    int left = l->samples - first;
    return left < l->cfg.batch ? left : l->cfg.batch;
}

static int64_t clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- one sample -------------------------------------------------------------- */

/* MODE_PLAN: sample 'index' of the set's random choices in the epoch. */
static void draw_params(const Loader *l, int epoch, int index, TransformParams *params) {
    transform_plan_draw(&l->plan, rng_sample_seed(l->cfg.seed, epoch, index), params);
    if (l->plan.flip == TRANSFORM_FLIP_ALTERNATE)
        params->flip = transform_alternate_flip(l->cfg.seed, epoch, index);
}

static void build_planned(Loader *l, Worker *w, Slot *s, int i, int index, int epoch) {
    const Dataset *d = &l->src->decoded;
    TransformParams params;
    draw_params(l, epoch, index, &params);
    if (l->cfg.raw) {
        memcpy(s->raw_images + (size_t)i * l->raw_image_bytes, dataset_image(d, index), l->raw_image_bytes);
        s->params[i] = params;
    } else {
        transform_plan_apply_params(&l->plan, dataset_image(d, index), &params, w->scratch,
                                    s->images + (size_t)i * l->sample_floats);
    }
}

/* The crop box and the flip and cutout of a w x h image, drawn from the
 * sample's seed: the box first (a varying number of draws), then the flip,
 * then the cutout; evaluation's centre crop draws nothing. */
static CropBox draw_crop(const Loader *l, int epoch, int seed_index, int w, int h, TransformParams *params) {
    memset(params, 0, sizeof *params);
    if (!l->cfg.augment) return crop_center(w, h, l->cfg.crop.eval_resize, l->out_h, l->out_w);
    uint64_t rng = rng_sample_seed(l->cfg.seed, epoch, seed_index);
    CropBox box = crop_random_resized(w, h, &l->cfg.crop, &rng);
    const TransformSpec *t = &l->cfg.transform;
    transform_draw_flip_cutout(&rng, t->flip, t->cutout, l->out_h, l->out_w, params);
    if (t->flip == TRANSFORM_FLIP_ALTERNATE) params->flip = transform_alternate_flip(l->cfg.seed, epoch, seed_index);
    return box;
}

/* The box resampled from src into the slot's place i: floats (flipped, cut
 * out), or the uint8 crop whose flip and cutout the GPU applies. */
static void resample_into(Loader *l, Worker *w, Slot *s, int i, const ResampleSource *src, const CropBox *box,
                          const TransformParams *params) {
    const TransformSpec *t = &l->cfg.transform;
    int64_t t0 = clock_ns();
    if (l->mode == MODE_ENCODED) {
        resample_image(src, box, 0, l->out_h, l->out_w, t->mean, t->std, &w->resample, NULL,
                       s->fallback + (size_t)i * l->out_bytes);
    } else if (l->cfg.raw) {
        resample_image(src, box, 0, l->out_h, l->out_w, t->mean, t->std, &w->resample, NULL,
                       s->raw_images + (size_t)i * l->raw_image_bytes);
        s->params[i] = *params;
    } else {
        float *out = s->images + (size_t)i * l->sample_floats;
        resample_image(src, box, params->flip, l->out_h, l->out_w, t->mean, t->std, &w->resample, out, NULL);
        transform_apply_cutout(params, 3, l->out_h, l->out_w, out);
    }
    atomic_fetch_add(&w->clock.augment_ns, clock_ns() - t0);
}

/* A decoded set's image at its stored size. */
static ResampleSource decoded_image(const Dataset *d, int index) {
    const uint8_t *px = dataset_image(d, index);
    size_t plane = (size_t)d->h * d->w;
    return (ResampleSource){{px, px + plane, px + 2 * plane}, d->w, d->w, d->h, 0, 0, d->w, d->h};
}

/* The file's bytes into the slot's encoded bytes, for the GPU; 0 where they do not fit. */
static int take_encoded(Slot *s, int i, int index, const uint8_t *bytes, size_t len, const ImageInfo *info,
                        const CropBox *box, const TransformParams *params) {
    long long at = atomic_fetch_add(&s->encoded_used, (long long)len);
    if ((size_t)at + len > s->encoded_cap) return 0;
    memcpy(s->encoded + at, bytes, len);
    s->samples[i] = (EncodedSample){at, index, (int32_t)len, info->w, info->h, params->flip, 0, *box};
    return 1;
}

/* Encoded mode: whether sample i of a batch is one of cpu_share's, spread evenly. */
static int left_to_cpu(const Loader *l, int i) {
    return (int)((i + 1) * l->cfg.cpu_share) > (int)(i * l->cfg.cpu_share);
}

/* Resampled from the file: read, probe, draw, decode (the box's region, at the
 * DCT scale it allows), resample. -1 with the message where the file fails. */
static int build_from_file(Loader *l, Worker *w, Slot *s, int i, int index, int seed_index, int epoch, char *err,
                           size_t errlen) {
    const uint8_t *bytes;
    size_t len;
    char name[4400];
    int64_t t0 = clock_ns();
    if (source_read(l->src, index, &w->reader, &bytes, &len, err, errlen) != 0) return -1;
    int64_t t1 = clock_ns();
    atomic_fetch_add(&w->clock.read_ns, t1 - t0);
    source_sample_name(l->src, index, name, sizeof name);
    ImageInfo info;
    if (image_probe(bytes, len, name, &info, err, errlen) != 0) return -1;
    TransformParams params;
    CropBox box = draw_crop(l, epoch, seed_index, info.w, info.h, &params);
    if (l->mode == MODE_ENCODED && info.gpu_decodable && !left_to_cpu(l, i) && take_encoded(s, i, index, bytes, len, &info, &box, &params)) {
        atomic_fetch_add(&w->clock.decode_ns, clock_ns() - t1);
        atomic_fetch_add(&w->clock.gpu_decoded, 1);
        return 0;
    }
    int scale = l->cfg.dct_scaling ? decode_choose_scale(&info, box.w, box.h, l->out_w, l->out_h) : 1;
    CropBox scaled = {box.x0 / scale, box.y0 / scale, box.w / scale, box.h / scale};
    DecodeRegion region = {scale, 0, 0, 0, 0};
    int full_w = (info.w + scale - 1) / scale, full_h = (info.h + scale - 1) / scale;
    resample_reads(&scaled, full_w, full_h, l->out_h, l->out_w, &region.x0, &region.y0, &region.x1, &region.y1);
    DecodedImage image;
    if (image_decode_probed(bytes, len, name, &info, &region, &w->decode, &image, err, errlen) != 0) return -1;
    atomic_fetch_add(&w->clock.decode_ns, clock_ns() - t1);
    size_t plane = (size_t)image.w * image.h;
    ResampleSource src = {{image.pixels, image.pixels + plane, image.pixels + 2 * plane}, image.w, image.w, image.h,
                          image.x0, image.y0, image.full_w, image.full_h};
    resample_into(l, w, s, i, &src, &scaled, &params);
    if (l->mode == MODE_ENCODED) {
        CropBox whole = {0, 0, (float)l->out_w, (float)l->out_h};
        s->samples[i] = (EncodedSample){0, index, 0, l->out_w, l->out_h, params.flip, 1, whole};
        atomic_fetch_add(&w->clock.cpu_decoded, 1);
    }
    return 0;
}

/* A file passed over (skip_bad): named in the log once, counted once. */
static void mark_bad(Loader *l, int index, const char *err) {
    if (atomic_exchange(&l->bad[index], 1)) return;
    long count = atomic_fetch_add(&l->skipped, 1) + 1;
    log_warn("data.skip_bad: passed over %s (%ld so far)", err, count);
}

/* Sample i of batch b (position p of the epoch): the sample there, or with
 * skip_bad the next of the epoch that reads. */
static int build_one(Loader *l, Worker *w, Slot *s, int i, int p, int epoch, char *err, size_t errlen) {
    int index = l->order[p];
    s->labels[i] = l->src->labels[index];
    if (l->mode == MODE_PLAN) {
        build_planned(l, w, s, i, index, epoch);
        return 0;
    }
    if (l->src->kind == SOURCE_DECODED) {
        ResampleSource src = decoded_image(&l->src->decoded, index);
        TransformParams params;
        CropBox box = draw_crop(l, epoch, index, src.w, src.h, &params);
        resample_into(l, w, s, i, &src, &box, &params);
        return 0;
    }
    for (int tries = 0; tries < l->samples; tries++) {
        int at = l->order[(p + tries) % l->samples];
        if (l->cfg.skip_bad && atomic_load(&l->bad[at])) continue;
        /* A stand-in keeps the crop of the sample it stands in for. */
        if (build_from_file(l, w, s, i, at, index, epoch, err, errlen) == 0) {
            s->labels[i] = l->src->labels[at];
            return 0;
        }
        if (!l->cfg.skip_bad) return -1;
        mark_bad(l, at, err);
    }
    snprintf(err, errlen, "data.skip_bad: none of the %d samples of the epoch could be read", l->samples);
    return -1;
}

/* Builds samples [from, to) of batch b into the slot; returns 0, or -1 when the
 * generation moved (the work was dropped). A failing sample leaves its message
 * in the slot for loader_next. */
static int build_samples(Loader *l, Worker *w, Slot *s, int b, int from, int to, int epoch, int generation) {
    char err[4600];
    for (int i = from; i < to; i++) {
        if (atomic_load_explicit(&l->generation, memory_order_relaxed) != generation) return -1;
        if (atomic_load(&s->failed)) continue; /* the batch is lost: loader_next stops the run */
        if (build_one(l, w, s, i, b * l->cfg.batch + i, epoch, err, sizeof err) != 0) {
            pthread_mutex_lock(&l->lock);
            if (!s->error && !(s->error = strdup(err))) TC_FATAL("out of host memory");
            atomic_store(&s->failed, 1);
            pthread_mutex_unlock(&l->lock);
        }
        atomic_fetch_add(&w->clock.samples, 1);
    }
    return 0;
}

/* ---- the workers ----------------------------------------------------------- */

/* With the lock held: can this chunk of batch b go into its slot now? Opens the slot if so. */
static int slot_open_for(Loader *l, Slot *s, int b) {
    if (s->batch != b) return 0;
    if (s->state == SLOT_FILLING) return 1;
    if (s->state != SLOT_FREE) return 0;
    s->state = SLOT_FILLING;
    s->n = batch_samples(l, b);
    s->chunks_left = l->chunks_per_batch;
    atomic_store(&s->encoded_used, 0);
    atomic_store(&s->failed, 0);
    free(s->error);
    s->error = NULL;
    return 1;
}

static void *worker_main(void *arg) {
    Worker *w = arg;
    Loader *l = w->loader;
    pthread_mutex_lock(&l->lock);
    while (!l->stopping) {
        if (l->next_unit >= l->units_per_epoch) {
            pthread_cond_wait(&l->work_changed, &l->lock);
            continue;
        }
        int unit = l->next_unit++;
        int b = unit / l->chunks_per_batch;
        int chunk = unit % l->chunks_per_batch;
        int generation = atomic_load(&l->generation);
        int epoch = l->epoch;
        Slot *s = &l->ring[b % l->cfg.prefetch];
        while (!l->stopping && atomic_load(&l->generation) == generation && !slot_open_for(l, s, b))
            pthread_cond_wait(&l->work_changed, &l->lock);
        if (l->stopping) break;
        if (atomic_load(&l->generation) != generation) continue;

        int from = chunk * l->chunk_samples;
        int to = from + l->chunk_samples < s->n ? from + l->chunk_samples : s->n;
        l->workers_filling++;
        pthread_mutex_unlock(&l->lock);
        int built = build_samples(l, w, s, b, from, to, epoch, generation);
        pthread_mutex_lock(&l->lock);
        l->workers_filling--;
        if (built == 0 && atomic_load(&l->generation) == generation && --s->chunks_left == 0)
            s->state = SLOT_READY;
        pthread_cond_broadcast(&l->slot_changed);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

/* Samples per epoch for this rank: the data set when not distributed; else its
 * shard, of the permutation cut to a multiple of world with drop_last, or of
 * all of it without (ranks below n % world then get one more). */
static int shard_samples(int n, const LoaderConfig *cfg) {
    if (cfg->world <= 1) return n;
    if (cfg->rank < 0 || cfg->rank >= cfg->world)
        TC_FATAL("loader: rank %d is not in 0..%d", cfg->rank, cfg->world - 1);
    if (cfg->drop_last) return n / cfg->world;
    return (n - cfg->rank + cfg->world - 1) / cfg->world;
}

static size_t round_up(size_t bytes, size_t align) { return (bytes + align - 1) / align * align; }

/* A slot's one allocation: the images (floats, raw uint8, or encoded mode's
 * fallback crops), the params or encoded samples, then the labels. */
static void slot_alloc(Loader *l, Slot *s) {
    int batch = l->cfg.batch;
    size_t image_bytes = l->mode == MODE_ENCODED ? round_up((size_t)batch * l->out_bytes, 64)
                         : l->cfg.raw           ? round_up((size_t)batch * l->raw_image_bytes, 64)
                                                : (size_t)batch * l->sample_floats * sizeof(float);
    size_t params_bytes = l->mode == MODE_ENCODED ? round_up((size_t)batch * sizeof(EncodedSample), 64)
                          : l->cfg.raw            ? round_up((size_t)batch * sizeof(TransformParams), 64)
                                                  : 0;
    size_t label_bytes = (size_t)batch * sizeof(int32_t);
    char *memory = host_alloc(image_bytes + params_bytes + label_bytes, l->cfg.pinned, "a loader batch slot");
    s->memory = memory;
    if (l->mode == MODE_ENCODED) {
        s->fallback = (uint8_t *)memory;
        s->samples = (EncodedSample *)(memory + image_bytes);
    } else if (l->cfg.raw) {
        s->raw_images = (uint8_t *)memory;
        s->params = (TransformParams *)(memory + image_bytes);
    } else {
        s->images = (float *)memory;
    }
    s->labels = (int32_t *)(memory + image_bytes + params_bytes);
    atomic_init(&s->encoded_used, 0);
    atomic_init(&s->failed, 0);
}

static void worker_init(Loader *l, Worker *w) {
    w->loader = l;
    if (l->mode == MODE_PLAN && !l->cfg.raw) {
        w->scratch = malloc(transform_plan_scratch_floats(&l->plan) * sizeof(float));
        if (!w->scratch) TC_FATAL("loader: out of memory");
    }
    source_reader_init(&w->reader);
}

static void worker_free(Worker *w) {
    free(w->scratch);
    resample_scratch_free(&w->resample);
    decode_buffers_free(&w->decode);
    source_reader_close(&w->reader);
}

/* What a sample becomes, and the output size, from the config and the source. */
static void choose_mode(Loader *l) {
    const LoaderConfig *cfg = &l->cfg;
    const Source *s = l->src;
    if (cfg->encoded && (!cfg->resized_crop || s->kind == SOURCE_DECODED))
        TC_FATAL("loader: encoded batches need resized_crop over a streaming source");
    if (!cfg->resized_crop && s->kind != SOURCE_DECODED)
        TC_FATAL("loader: a streaming source has images of any size: it needs resized_crop");
    l->mode = cfg->encoded ? MODE_ENCODED : cfg->resized_crop ? MODE_RESAMPLE : MODE_PLAN;
    if (l->mode == MODE_PLAN) {
        TransformSpec spec = cfg->transform;
        if (!cfg->augment) {
            spec.flip = 0;
            spec.crop_pad = 0;
            spec.cutout = 0;
        }
        const Dataset *d = &s->decoded;
        transform_plan_init(&l->plan, &spec, d->c, d->h, d->w);
        l->out_h = l->plan.out_h;
        l->out_w = l->plan.out_w;
        l->sample_floats = (size_t)d->c * l->out_h * l->out_w;
        l->raw_image_bytes = dataset_image_bytes(d);
        return;
    }
    l->out_h = cfg->transform.out_h;
    l->out_w = cfg->transform.out_w;
    if (l->out_h < 1 || l->out_w < 1 || l->out_h > DATASET_MAX_SIDE || l->out_w > DATASET_MAX_SIDE)
        TC_FATAL("loader: resized_crop needs an output size of 1 to %d a side, not %dx%d", DATASET_MAX_SIDE, l->out_w,
                 l->out_h);
    if (s->kind == SOURCE_DECODED && s->decoded.c != 3)
        TC_FATAL("loader: resized_crop reads 3-channel images, not %d", s->decoded.c);
    l->out_bytes = 3 * (size_t)l->out_h * l->out_w;
    l->sample_floats = l->out_bytes;
    l->raw_image_bytes = l->out_bytes;
}

/* view: a decoded set seen as a source, kept in the loader (loader_create); NULL: src. */
static Loader *create(const Source *src, const Source *view, const LoaderConfig *cfg) {
    if (cfg->batch < 1) TC_FATAL("loader: batch must be >= 1, not %d", cfg->batch);
    if (cfg->prefetch < 1) TC_FATAL("loader: prefetch must be >= 1, not %d", cfg->prefetch);
    if (cfg->workers < 0) TC_FATAL("loader: workers must be >= 0, not %d", cfg->workers);
    if (src->n < 1) TC_FATAL("loader: the data set is empty");
    Loader *l = calloc(1, sizeof *l);
    if (!l) TC_FATAL("loader: out of memory");
    if (view) {
        l->view = *view;
        src = &l->view;
    }
    l->src = src;
    l->cfg = *cfg;
    choose_mode(l);
    l->samples = shard_samples(src->n, cfg);
    l->batches_per_epoch =
        cfg->drop_last ? l->samples / cfg->batch : (l->samples + cfg->batch - 1) / cfg->batch;
    if (l->samples == 0)
        log_warn("loader: rank %d of %d gets none of the %d samples: epochs are empty", cfg->rank, cfg->world, src->n);
    else if (l->batches_per_epoch == 0)
        log_warn("loader: %d samples make no full batch of %d with drop_last: epochs are empty", l->samples,
                 cfg->batch);
    int splits = cfg->workers > 1 ? cfg->workers : 1;
    l->chunk_samples = (cfg->batch + splits - 1) / splits;
    l->chunks_per_batch = (cfg->batch + l->chunk_samples - 1) / l->chunk_samples;

    l->ring = calloc((size_t)cfg->prefetch, sizeof *l->ring);
    l->order = malloc((size_t)src->n * sizeof *l->order);
    if (cfg->world > 1) l->global_order = malloc((size_t)src->n * sizeof *l->global_order);
    l->bad = calloc((size_t)src->n, sizeof *l->bad);
    if (!l->ring || !l->order || !l->bad || (cfg->world > 1 && !l->global_order)) TC_FATAL("loader: out of memory");
    for (int i = 0; i < cfg->prefetch; i++) {
        Slot *s = &l->ring[i];
        slot_alloc(l, s);
        s->state = SLOT_FREE;
        s->batch = i;
    }

    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->work_changed, NULL);
    pthread_cond_init(&l->slot_changed, NULL);
    atomic_init(&l->generation, 0);
    atomic_init(&l->skipped, 0);
    l->epoch = -1;
    worker_init(l, &l->caller);
    if (cfg->workers > 0) {
        l->workers = calloc((size_t)cfg->workers, sizeof *l->workers);
        if (!l->workers) TC_FATAL("loader: out of memory");
        for (int i = 0; i < cfg->workers; i++) {
            Worker *w = &l->workers[i];
            worker_init(l, w);
            if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
                TC_FATAL("loader: cannot start worker thread %d of %d", i + 1, cfg->workers);
        }
    }
    return l;
}

Loader *loader_create_source(const Source *s, const LoaderConfig *cfg) { return create(s, NULL, cfg); }

Loader *loader_create(const Dataset *d, const LoaderConfig *cfg) {
    Source view;
    memset(&view, 0, sizeof view);
    view.kind = SOURCE_DECODED;
    view.decoded = *d;
    view.n = d->n;
    view.num_classes = d->num_classes;
    view.labels = d->labels;
    view.class_names = d->class_names;
    return create(&view, &view, cfg);
}

int loader_batches_per_epoch(const Loader *l) { return l->batches_per_epoch; }
int loader_epoch_samples(const Loader *l) { return l->samples; }

void loader_raw_shape(const Loader *l, int *c, int *h, int *w) {
    if (l->mode == MODE_PLAN) {
        *c = l->src->decoded.c;
        *h = l->src->decoded.h;
        *w = l->src->decoded.w;
    } else {
        *c = 3;
        *h = l->out_h;
        *w = l->out_w;
    }
}

/* ---- the epoch's order ------------------------------------------------------- */

static void shuffle_range(int32_t *a, int n, uint64_t seed, int epoch, int64_t stream) {
    uint64_t state = rng_sample_seed(seed ^ 0x77696e646f77ULL, epoch, stream);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(((rng_splitmix64(&state) >> 32) * (uint64_t)(i + 1)) >> 32);
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* Shards: the shards in a shuffled order, and the samples of each run of
 * shuffle_shards of them shuffled together. */
static void shard_window_order(const Loader *l, int epoch, int32_t *all) {
    const Source *s = l->src;
    int32_t *shards = malloc((size_t)s->n_shards * sizeof *shards);
    if (!shards) TC_FATAL("loader: out of memory");
    shuffle_indices(shards, s->n_shards, l->cfg.seed, epoch);
    int at = 0, window = l->cfg.shuffle_shards;
    for (int first = 0; first < s->n_shards; first += window) {
        int start = at;
        for (int k = first; k < first + window && k < s->n_shards; k++)
            for (int i = s->shard_first[shards[k]]; i < s->shard_first[shards[k] + 1]; i++) all[at++] = i;
        shuffle_range(all + start, at - start, l->cfg.seed, epoch, first);
    }
    free(shards);
}

/* The epoch's permutation from the seed (the same on every rank); with world > 1
 * this rank keeps every world-th position of it, starting at its rank. */
static void epoch_order(Loader *l, int epoch) {
    int n = l->src->n;
    int world = l->cfg.world > 1 ? l->cfg.world : 1;
    int32_t *all = world > 1 ? l->global_order : l->order;
    if (!l->cfg.shuffle) {
        for (int i = 0; i < n; i++) all[i] = i;
    } else if (l->src->kind == SOURCE_SHARDS && l->cfg.shuffle_shards > 0 && l->src->n_shards > 1) {
        shard_window_order(l, epoch, all);
    } else {
        shuffle_indices(all, n, l->cfg.seed, epoch);
    }
    for (int i = 0; world > 1 && i < l->samples; i++) l->order[i] = all[l->cfg.rank + (size_t)i * world];
}

/* Encoded mode: room in every slot for the epoch's largest batch of files
 * (grown here, between epochs, never inside one). */
static void size_encoded(Loader *l) {
    if (l->mode != MODE_ENCODED) return;
    size_t most = 0;
    for (int b = 0; b < l->batches_per_epoch; b++) {
        size_t bytes = 0;
        for (int i = 0; i < batch_samples(l, b); i++) bytes += (size_t)l->src->size[l->order[b * l->cfg.batch + i]];
        if (bytes > most) most = bytes;
    }
    for (int k = 0; k < l->cfg.prefetch; k++) {
        Slot *s = &l->ring[k];
        if (s->encoded_cap >= most) continue;
        size_t cap = most + most / 8 + 4096; /* stand-ins (skip_bad) may be larger */
        host_free(s->encoded, l->cfg.pinned);
        s->encoded = host_alloc(cap, l->cfg.pinned, "a loader slot's encoded images");
        s->encoded_cap = cap;
    }
}

/* With the lock held: drop the epoch in hand: nothing more to claim, fills in
 * flight stop, and it returns once no worker is inside a fill (the ring, the
 * order and the seed may then be rewritten). */
static void drop_epoch(Loader *l) {
    atomic_fetch_add(&l->generation, 1);
    l->units_per_epoch = 0;
    l->next_unit = 0;
    pthread_cond_broadcast(&l->work_changed);
    while (l->workers_filling > 0) pthread_cond_wait(&l->slot_changed, &l->lock);
}

void loader_start_epoch_at(Loader *l, int epoch, int first_batch) {
    if (first_batch < 0 || first_batch > l->batches_per_epoch)
        TC_FATAL("loader_start_epoch_at: batch %d of %d", first_batch, l->batches_per_epoch);
    pthread_mutex_lock(&l->lock);
    drop_epoch(l);

    epoch_order(l, epoch);
    size_encoded(l);
    for (int i = 0; i < l->cfg.prefetch; i++) { /* slot i holds the batches b with b % prefetch == i */
        l->ring[i].state = SLOT_FREE;
        l->ring[i].batch = first_batch + ((i - first_batch % l->cfg.prefetch) + l->cfg.prefetch) % l->cfg.prefetch;
    }
    l->epoch = epoch;
    l->next_consume = first_batch;
    l->held = 0;
    l->next_unit = first_batch * l->chunks_per_batch;
    l->units_per_epoch = l->cfg.workers > 0 ? l->batches_per_epoch * l->chunks_per_batch : 0;
    pthread_cond_broadcast(&l->work_changed);
    pthread_mutex_unlock(&l->lock);
}

void loader_start_epoch(Loader *l, int epoch) { loader_start_epoch_at(l, epoch, 0); }

void loader_epoch_plan(Loader *l, int epoch, int32_t *index, TransformParams *params) {
    if (l->cfg.workers > 0) TC_FATAL("loader_epoch_plan: the loader has worker threads (workers must be 0)");
    if (l->mode != MODE_PLAN) TC_FATAL("loader_epoch_plan: only for a decoded set without resized_crop");
    epoch_order(l, epoch);
    for (int i = 0; i < l->samples; i++) {
        index[i] = l->order[i];
        draw_params(l, epoch, index[i], &params[i]);
    }
}

void loader_set_seed(Loader *l, uint64_t seed) {
    pthread_mutex_lock(&l->lock);
    drop_epoch(l); /* workers read the seed inside their fills, unlocked */
    l->cfg.seed = seed;
    l->epoch = -1;
    pthread_mutex_unlock(&l->lock);
}

/* ---- the consumer ------------------------------------------------------------ */

static void build_batch_here(Loader *l, Slot *s, int b) {
    s->n = batch_samples(l, b);
    atomic_store(&s->encoded_used, 0);
    atomic_store(&s->failed, 0);
    free(s->error);
    s->error = NULL;
    build_samples(l, &l->caller, s, b, 0, s->n, l->epoch, atomic_load(&l->generation));
}

int loader_next(Loader *l, Batch *out) {
    if (l->epoch < 0) TC_FATAL("loader_next before loader_start_epoch");
    if (l->next_consume >= l->batches_per_epoch) return 0;
    int b = l->next_consume;
    Slot *s = &l->ring[b % l->cfg.prefetch];
    double t0 = now_seconds();
    pthread_mutex_lock(&l->lock);
    if (l->held >= l->cfg.prefetch)
        TC_FATAL("loader_next: %d batches held, the prefetch depth: release one first", l->held);
    if (s->state == SLOT_HELD)
        TC_FATAL("loader_next: batch %d still holds ring slot %d that batch %d needs: release it first", s->batch,
                 b % l->cfg.prefetch, b);
    if (l->cfg.workers == 0) {
        s->state = SLOT_FILLING;
        pthread_mutex_unlock(&l->lock);
        build_batch_here(l, s, b);
        pthread_mutex_lock(&l->lock);
    } else {
        while (!(s->state == SLOT_READY && s->batch == b)) pthread_cond_wait(&l->slot_changed, &l->lock);
    }
    s->state = SLOT_HELD;
    s->batch = b;
    l->held++;
    char *error = s->error;
    pthread_mutex_unlock(&l->lock);
    if (error) TC_USER_ERROR("%s (data.skip_bad = on passes over such files)", error);
    l->wait_seconds += now_seconds() - t0;

    l->next_consume++;
    *out = (Batch){.images = s->images, .labels = s->labels, .n = s->n, .index = b, .slot = b % l->cfg.prefetch,
                   .raw_images = s->raw_images, .params = s->params};
    if (l->mode == MODE_ENCODED) {
        out->encoded = s->encoded;
        out->samples = s->samples;
        out->fallback = s->fallback;
    }
    return 1;
}

void loader_release(Loader *l, const Batch *b) {
    if (b->slot < 0 || b->slot >= l->cfg.prefetch) TC_FATAL("loader_release: bad slot %d", b->slot);
    pthread_mutex_lock(&l->lock);
    Slot *s = &l->ring[b->slot];
    /* A batch of an abandoned epoch was reclaimed by loader_start_epoch: nothing to do. */
    if (s->state == SLOT_HELD && s->batch == b->index) {
        s->state = SLOT_FREE;
        s->batch += l->cfg.prefetch;
        l->held--;
        pthread_cond_broadcast(&l->work_changed);
    }
    pthread_mutex_unlock(&l->lock);
}

double loader_wait_seconds(const Loader *l) { return l->wait_seconds; }
const Source *loader_source(const Loader *l) { return l->src; }
int loader_prefetch(const Loader *l) { return l->cfg.prefetch; }

static void add_clock(const StageClock *c, LoaderStages *out) {
    out->read_s += 1e-9 * (double)atomic_load(&c->read_ns);
    out->decode_s += 1e-9 * (double)atomic_load(&c->decode_ns);
    out->augment_s += 1e-9 * (double)atomic_load(&c->augment_ns);
    out->samples += (long)atomic_load(&c->samples);
    out->gpu_decoded += (long)atomic_load(&c->gpu_decoded);
    out->cpu_decoded += (long)atomic_load(&c->cpu_decoded);
}

void loader_stages(const Loader *l, LoaderStages *out) {
    memset(out, 0, sizeof *out);
    add_clock(&l->caller.clock, out);
    for (int i = 0; i < l->cfg.workers; i++) add_clock(&l->workers[i].clock, out);
    out->skipped = atomic_load(&l->skipped);
}

void loader_destroy(Loader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    l->stopping = 1;
    atomic_fetch_add(&l->generation, 1);
    pthread_cond_broadcast(&l->work_changed);
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; i < l->cfg.workers; i++) {
        pthread_join(l->workers[i].thread, NULL);
        worker_free(&l->workers[i]);
    }
    free(l->workers);
    worker_free(&l->caller);
    for (int i = 0; i < l->cfg.prefetch; i++) {
        host_free(l->ring[i].memory, l->cfg.pinned);
        host_free(l->ring[i].encoded, l->cfg.pinned);
        free(l->ring[i].error);
    }
    free(l->ring);
    free(l->order);
    free(l->global_order);
    free(l->bad);
    if (l->mode == MODE_PLAN) transform_plan_free(&l->plan);
    pthread_cond_destroy(&l->work_changed);
    pthread_cond_destroy(&l->slot_changed);
    pthread_mutex_destroy(&l->lock);
    free(l);
}
