/* The batch loader. Batch b of an epoch is built in ring slot b % prefetch.
 * Work is handed out in order from one counter, in chunks of a batch, so that
 * all workers stay busy even when the ring is shallow; a slot is opened for
 * batch b only once the consumer has released batch b - prefetch from it.
 * Every sample's augmentation comes from its own seed, so the bytes of a batch
 * do not depend on which worker built which chunk. */
#include "data/loader.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "data/transform_plan.h"
#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/log.h"

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD };

typedef struct {
    void *memory;            /* one allocation holding the arrays below */
    float *images;           /* batch * sample_floats; NULL in raw mode */
    uint8_t *raw_images;     /* raw mode: batch * raw_image_bytes; else NULL */
    TransformParams *params; /* raw mode: batch; else NULL */
    int32_t *labels;         /* batch */
    int state;
    int batch;       /* FREE: the batch allowed in next; otherwise the batch it holds */
    int n;           /* samples of that batch */
    int chunks_left; /* FILLING: chunks not yet done */
} Slot;

typedef struct {
    Loader *loader;
    pthread_t thread;
    float *scratch;
} Worker;

struct Loader {
    const Dataset *data;
    LoaderConfig cfg;
    TransformPlan plan;
    size_t sample_floats;
    size_t raw_image_bytes; /* one stored image */
    int samples;           /* per epoch: the data set, or this rank's shard of it */
    int batches_per_epoch;
    int chunk_samples;     /* samples per work unit */
    int chunks_per_batch;

    Slot *pinned_ring;     /* cfg.prefetch slots, pinned when cfg.pinned */
    int32_t *order;        /* dataset index of each position in the epoch (this rank's) */
    int32_t *global_order; /* world > 1: the permutation all ranks share; else NULL */
    Worker *workers;
    float *caller_scratch; /* workers = 0 */

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

/* Sample 'index' of the data set's random choices in the epoch. */
static void draw_params(const Loader *l, int epoch, int index, TransformParams *params) {
    transform_plan_draw(&l->plan, rng_sample_seed(l->cfg.seed, epoch, index), params);
    if (l->plan.flip == TRANSFORM_FLIP_ALTERNATE)
        params->flip = transform_alternate_flip(l->cfg.seed, epoch, index);
}

/* Builds samples [from, to) of batch b into the slot; returns 0, or -1 when the
 * generation moved (the work was dropped). Raw mode draws from the same seed as
 * the float path, so the GPU makes the same images from the params. */
static int build_samples(Loader *l, Slot *s, int b, int from, int to, int epoch, int generation,
                         float *scratch) {
    const Dataset *d = l->data;
    for (int i = from; i < to; i++) {
        if (atomic_load_explicit(&l->generation, memory_order_relaxed) != generation) return -1;
        int index = l->order[b * l->cfg.batch + i];
        TransformParams params;
        draw_params(l, epoch, index, &params);
        if (l->cfg.raw) {
            memcpy(s->raw_images + (size_t)i * l->raw_image_bytes, dataset_image(d, index),
                   l->raw_image_bytes);
            s->params[i] = params;
        } else {
            transform_plan_apply_params(&l->plan, dataset_image(d, index), &params, scratch,
                                        s->images + (size_t)i * l->sample_floats);
        }
        s->labels[i] = d->labels[index];
    }
    return 0;
}

/* With the lock held: can this chunk of batch b go into its slot now? Opens the slot if so. */
static int slot_open_for(Loader *l, Slot *s, int b) {
    if (s->batch != b) return 0;
    if (s->state == SLOT_FILLING) return 1;
    if (s->state != SLOT_FREE) return 0;
    s->state = SLOT_FILLING;
    s->n = batch_samples(l, b);
    s->chunks_left = l->chunks_per_batch;
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
        Slot *s = &l->pinned_ring[b % l->cfg.prefetch];
        while (!l->stopping && atomic_load(&l->generation) == generation && !slot_open_for(l, s, b))
            pthread_cond_wait(&l->work_changed, &l->lock);
        if (l->stopping) break;
        if (atomic_load(&l->generation) != generation) continue;

        int from = chunk * l->chunk_samples;
        int to = from + l->chunk_samples < s->n ? from + l->chunk_samples : s->n;
        l->workers_filling++;
        pthread_mutex_unlock(&l->lock);
        int built = build_samples(l, s, b, from, to, epoch, generation, w->scratch);
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

/* A slot's one allocation: the images, then (raw mode) the params, then the labels. */
static void slot_alloc(Loader *l, Slot *s) {
    int batch = l->cfg.batch;
    size_t image_bytes = l->cfg.raw ? round_up((size_t)batch * l->raw_image_bytes, 64)
                                    : (size_t)batch * l->sample_floats * sizeof(float);
    size_t params_bytes = l->cfg.raw ? round_up((size_t)batch * sizeof(TransformParams), 64) : 0;
    size_t label_bytes = (size_t)batch * sizeof(int32_t);
    char *memory = host_alloc(image_bytes + params_bytes + label_bytes, l->cfg.pinned,
                              "a loader batch slot");
    s->memory = memory;
    if (l->cfg.raw) {
        s->raw_images = (uint8_t *)memory;
        s->params = (TransformParams *)(memory + image_bytes);
    } else {
        s->images = (float *)memory;
    }
    s->labels = (int32_t *)(memory + image_bytes + params_bytes);
}

/* Per-thread scratch of the float path; raw mode needs none. */
static float *scratch_alloc(const Loader *l) {
    if (l->cfg.raw) return NULL;
    float *scratch = malloc(transform_plan_scratch_floats(&l->plan) * sizeof(float));
    if (!scratch) TC_FATAL("loader: out of memory");
    return scratch;
}

Loader *loader_create(const Dataset *d, const LoaderConfig *cfg) {
    if (cfg->batch < 1) TC_FATAL("loader: batch must be >= 1, not %d", cfg->batch);
    if (cfg->prefetch < 1) TC_FATAL("loader: prefetch must be >= 1, not %d", cfg->prefetch);
    if (cfg->workers < 0) TC_FATAL("loader: workers must be >= 0, not %d", cfg->workers);
    if (d->n < 1) TC_FATAL("loader: the data set is empty");
    Loader *l = calloc(1, sizeof *l);
    if (!l) TC_FATAL("loader: out of memory");
    l->data = d;
    l->cfg = *cfg;
    TransformSpec spec = cfg->transform;
    if (!cfg->augment) {
        spec.flip = 0;
        spec.crop_pad = 0;
        spec.cutout = 0;
    }
    transform_plan_init(&l->plan, &spec, d->c, d->h, d->w);
    l->sample_floats = (size_t)d->c * l->plan.out_h * l->plan.out_w;
    l->raw_image_bytes = dataset_image_bytes(d);
    l->samples = shard_samples(d->n, cfg);
    l->batches_per_epoch =
        cfg->drop_last ? l->samples / cfg->batch : (l->samples + cfg->batch - 1) / cfg->batch;
    if (l->samples == 0)
        log_warn("loader: rank %d of %d gets none of the %d samples: epochs are empty", cfg->rank,
                 cfg->world, d->n);
    else if (l->batches_per_epoch == 0)
        log_warn("loader: %d samples make no full batch of %d with drop_last: epochs are empty",
                 l->samples, cfg->batch);
    int splits = cfg->workers > 1 ? cfg->workers : 1;
    l->chunk_samples = (cfg->batch + splits - 1) / splits;
    l->chunks_per_batch = (cfg->batch + l->chunk_samples - 1) / l->chunk_samples;

    l->pinned_ring = calloc((size_t)cfg->prefetch, sizeof *l->pinned_ring);
    l->order = malloc((size_t)d->n * sizeof *l->order);
    if (cfg->world > 1) l->global_order = malloc((size_t)d->n * sizeof *l->global_order);
    if (!l->pinned_ring || !l->order || (cfg->world > 1 && !l->global_order))
        TC_FATAL("loader: out of memory");
    for (int i = 0; i < cfg->prefetch; i++) {
        Slot *s = &l->pinned_ring[i];
        slot_alloc(l, s);
        s->state = SLOT_FREE;
        s->batch = i;
    }

    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->work_changed, NULL);
    pthread_cond_init(&l->slot_changed, NULL);
    atomic_init(&l->generation, 0);
    l->epoch = -1;
    if (cfg->workers == 0) {
        l->caller_scratch = scratch_alloc(l);
    } else {
        l->workers = calloc((size_t)cfg->workers, sizeof *l->workers);
        if (!l->workers) TC_FATAL("loader: out of memory");
        for (int i = 0; i < cfg->workers; i++) {
            Worker *w = &l->workers[i];
            w->loader = l;
            w->scratch = scratch_alloc(l);
            if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
                TC_FATAL("loader: cannot start worker thread %d of %d", i + 1, cfg->workers);
        }
    }
    return l;
}

int loader_batches_per_epoch(const Loader *l) { return l->batches_per_epoch; }
int loader_epoch_samples(const Loader *l) { return l->samples; }

/* The epoch's permutation from the seed (the same on every rank); with world > 1
 * this rank keeps every world-th position of it, starting at its rank. */
static void epoch_order(Loader *l, int epoch) {
    int n = l->data->n;
    int world = l->cfg.world > 1 ? l->cfg.world : 1;
    int32_t *all = world > 1 ? l->global_order : l->order;
    if (l->cfg.shuffle) shuffle_indices(all, n, l->cfg.seed, epoch);
    else for (int i = 0; i < n; i++) all[i] = i;
    for (int i = 0; world > 1 && i < l->samples; i++)
        l->order[i] = all[l->cfg.rank + (size_t)i * world];
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

void loader_start_epoch(Loader *l, int epoch) {
    pthread_mutex_lock(&l->lock);
    drop_epoch(l);

    epoch_order(l, epoch);
    for (int i = 0; i < l->cfg.prefetch; i++) {
        l->pinned_ring[i].state = SLOT_FREE;
        l->pinned_ring[i].batch = i;
    }
    l->epoch = epoch;
    l->next_consume = 0;
    l->held = 0;
    l->units_per_epoch = l->cfg.workers > 0 ? l->batches_per_epoch * l->chunks_per_batch : 0;
    pthread_cond_broadcast(&l->work_changed);
    pthread_mutex_unlock(&l->lock);
}

void loader_epoch_plan(Loader *l, int epoch, int32_t *index, TransformParams *params) {
    if (l->cfg.workers > 0) TC_FATAL("loader_epoch_plan: the loader has worker threads (workers must be 0)");
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

static void build_batch_here(Loader *l, Slot *s, int b) {
    s->n = batch_samples(l, b);
    build_samples(l, s, b, 0, s->n, l->epoch, atomic_load(&l->generation), l->caller_scratch);
}

int loader_next(Loader *l, Batch *out) {
    if (l->epoch < 0) TC_FATAL("loader_next before loader_start_epoch");
    if (l->next_consume >= l->batches_per_epoch) return 0;
    int b = l->next_consume;
    Slot *s = &l->pinned_ring[b % l->cfg.prefetch];
    double t0 = now_seconds();
    pthread_mutex_lock(&l->lock);
    if (l->held >= l->cfg.prefetch)
        TC_FATAL("loader_next: %d batches held, the prefetch depth: release one first", l->held);
    if (s->state == SLOT_HELD)
        TC_FATAL("loader_next: batch %d still holds ring slot %d that batch %d needs: release it "
                 "first", s->batch, b % l->cfg.prefetch, b);
    if (l->cfg.workers == 0) {
        s->state = SLOT_FILLING;
        pthread_mutex_unlock(&l->lock);
        build_batch_here(l, s, b);
        pthread_mutex_lock(&l->lock);
    } else {
        while (!(s->state == SLOT_READY && s->batch == b))
            pthread_cond_wait(&l->slot_changed, &l->lock);
    }
    s->state = SLOT_HELD;
    s->batch = b;
    l->held++;
    pthread_mutex_unlock(&l->lock);
    l->wait_seconds += now_seconds() - t0;

    l->next_consume++;
    out->images = s->images;
    out->labels = s->labels;
    out->n = s->n;
    out->index = b;
    out->slot = b % l->cfg.prefetch;
    out->raw_images = s->raw_images;
    out->params = s->params;
    return 1;
}

void loader_release(Loader *l, const Batch *b) {
    if (b->slot < 0 || b->slot >= l->cfg.prefetch) TC_FATAL("loader_release: bad slot %d", b->slot);
    pthread_mutex_lock(&l->lock);
    Slot *s = &l->pinned_ring[b->slot];
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

void loader_destroy(Loader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    l->stopping = 1;
    atomic_fetch_add(&l->generation, 1);
    pthread_cond_broadcast(&l->work_changed);
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; i < l->cfg.workers; i++) {
        pthread_join(l->workers[i].thread, NULL);
        free(l->workers[i].scratch);
    }
    free(l->workers);
    free(l->caller_scratch);
    for (int i = 0; i < l->cfg.prefetch; i++) host_free(l->pinned_ring[i].memory, l->cfg.pinned);
    free(l->pinned_ring);
    free(l->order);
    free(l->global_order);
    transform_plan_free(&l->plan);
    pthread_cond_destroy(&l->work_changed);
    pthread_cond_destroy(&l->slot_changed);
    pthread_mutex_destroy(&l->lock);
    free(l);
}
