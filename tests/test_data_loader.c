/* The batch loader: the same bytes for any worker count, every sample once per
 * epoch, holding the whole ring, abandoning an epoch, stopping mid-epoch, and
 * a stress loop (also run under ThreadSanitizer). Raw mode (for the GPU
 * transform): the same params for any worker count, the stored images in the
 * epoch's order, and the params giving the float path's images through the GPU
 * kernel's CPU reference. TRAINC_DATA_BENCH=1 adds a throughput measurement of
 * the 32 -> 224 resize and of raw mode. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/gpu_transform.h"
#include "data/loader.h"
#include "runtime/log.h"
#include "tests/harness.h"

static LoaderConfig base_config(int batch, int workers, int prefetch) {
    LoaderConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch = batch;
    cfg.workers = workers;
    cfg.prefetch = prefetch;
    cfg.pinned = 0; /* pinned memory needs a GPU */
    cfg.shuffle = 1;
    cfg.augment = 1;
    cfg.seed = 1234;
    transform_spec_default(&cfg.transform, 0, 0);
    return cfg;
}

/* Every byte of 'epochs' epochs, batch after batch. */
typedef struct {
    float *images;
    int32_t *labels;
    int *sizes;
    int batches;
} Recording;

static Recording record_epochs(const Dataset *d, const LoaderConfig *cfg, int epochs) {
    Loader *l = loader_create(d, cfg);
    int per_epoch = loader_batches_per_epoch(l);
    int out_h = cfg->transform.out_h > 0 ? cfg->transform.out_h : d->h;
    int out_w = cfg->transform.out_w > 0 ? cfg->transform.out_w : d->w;
    size_t sample = (size_t)d->c * out_h * out_w;
    Recording r = {0};
    r.images = malloc((size_t)epochs * d->n * sample * sizeof(float));
    r.labels = malloc((size_t)epochs * d->n * sizeof(int32_t));
    r.sizes = malloc((size_t)epochs * per_epoch * sizeof(int));
    size_t at = 0;
    for (int e = 0; e < epochs; e++) {
        loader_start_epoch(l, e);
        Batch b;
        while (loader_next(l, &b)) {
            memcpy(r.images + at * sample, b.images, (size_t)b.n * sample * sizeof(float));
            memcpy(r.labels + at, b.labels, (size_t)b.n * sizeof(int32_t));
            r.sizes[r.batches++] = b.n;
            at += (size_t)b.n;
            loader_release(l, &b);
        }
    }
    loader_destroy(l);
    return r;
}

static void recording_free(Recording *r) {
    free(r->images);
    free(r->labels);
    free(r->sizes);
}

static void test_same_batches_any_worker_count(void) {
    Dataset d;
    synthetic_make(&d, 300, 3, 12, 12, 10, test_seed());
    LoaderConfig cfg = base_config(32, 0, 3);
    cfg.transform.out_h = 20;
    cfg.transform.out_w = 18;
    cfg.transform.flip = 1;
    cfg.transform.crop_pad = 2;
    Recording sync = record_epochs(&d, &cfg, 2);
    CHECK(sync.batches == 2 * 10 && sync.sizes[9] == 300 - 9 * 32);
    const int workers[] = {1, 8};
    for (int k = 0; k < 2; k++) {
        cfg.workers = workers[k];
        Recording r = record_epochs(&d, &cfg, 2);
        CHECK(r.batches == sync.batches);
        CHECK(memcmp(r.sizes, sync.sizes, (size_t)sync.batches * sizeof(int)) == 0);
        CHECK(memcmp(r.labels, sync.labels, 2 * 300 * sizeof(int32_t)) == 0);
        CHECK_MSG(memcmp(r.images, sync.images, (size_t)2 * 300 * 3 * 20 * 18 * sizeof(float)) == 0,
                  "workers=%d images differ from workers=0", workers[k]);
        recording_free(&r);
    }
    /* Epochs differ (shuffle and augmentation), and augmentation does something. */
    size_t epoch_floats = (size_t)300 * 3 * 20 * 18;
    CHECK(memcmp(sync.images, sync.images + epoch_floats, epoch_floats * sizeof(float)) != 0);
    cfg.workers = 2;
    cfg.augment = 0;
    cfg.shuffle = 0;
    Recording plain = record_epochs(&d, &cfg, 2);
    CHECK(memcmp(plain.images, plain.images + epoch_floats, epoch_floats * sizeof(float)) == 0);
    recording_free(&plain);
    recording_free(&sync);
    dataset_free(&d);
}

/* A data set whose images say their own index: channel 0 holds i % 256, channel 1 i / 256. */
static void make_indexed(Dataset *d, int n) {
    memset(d, 0, sizeof *d);
    d->n = n;
    d->c = 3;
    d->h = 2;
    d->w = 3;
    d->num_classes = 7;
    d->pixels = malloc((size_t)n * 18);
    d->labels = malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        memset(d->pixels + (size_t)i * 18, i % 256, 6);
        memset(d->pixels + (size_t)i * 18 + 6, i / 256, 6);
        memset(d->pixels + (size_t)i * 18 + 12, 0, 6);
        d->labels[i] = i % 7;
    }
}

static int decode_index(const float *image, const TransformSpec *t) {
    int lo = (int)lroundf((image[0] * t->std[0] + t->mean[0]) * 255.0f);
    int hi = (int)lroundf((image[6] * t->std[1] + t->mean[1]) * 255.0f);
    return hi * 256 + lo;
}

static int decode_raw_index(const uint8_t *image) { return image[6] * 256 + image[0]; }

static void test_every_sample_once(void) {
    Dataset d;
    make_indexed(&d, 1000);
    const int drop[2] = {0, 1};
    for (int k = 0; k < 2; k++) {
        LoaderConfig cfg = base_config(64, 3, 2);
        cfg.augment = 0;
        cfg.drop_last = drop[k];
        Loader *l = loader_create(&d, &cfg);
        int expected_batches = drop[k] ? 15 : 16;
        CHECK(loader_batches_per_epoch(l) == expected_batches);
        int *seen = calloc(1000, sizeof(int));
        int first_order[8] = {0};
        for (int e = 0; e < 2; e++) {
            memset(seen, 0, 1000 * sizeof(int));
            loader_start_epoch(l, e);
            Batch b;
            int batches = 0, samples = 0, bad = 0;
            while (loader_next(l, &b)) {
                CHECK(b.index == batches && b.slot == batches % 2);
                CHECK(b.n == (batches == 15 ? 1000 - 15 * 64 : 64));
                for (int i = 0; i < b.n; i++) {
                    int idx = decode_index(b.images + (size_t)i * 18, &cfg.transform);
                    if (idx < 0 || idx >= 1000 || b.labels[i] != idx % 7) {
                        bad++;
                        continue;
                    }
                    seen[idx]++;
                    if (e == 0 && batches == 0 && i < 8) first_order[i] = idx;
                }
                samples += b.n;
                batches++;
                loader_release(l, &b);
            }
            CHECK(batches == expected_batches && bad == 0);
            CHECK(samples == (drop[k] ? 960 : 1000));
            int once = 0, twice = 0;
            for (int i = 0; i < 1000; i++) once += seen[i] == 1, twice += seen[i] > 1;
            CHECK_MSG(once == samples && twice == 0, "epoch %d: %d seen once, %d more", e, once,
                      twice);
            CHECK(loader_next(l, &b) == 0); /* stays over */
        }
        CHECK(!(first_order[0] == 0 && first_order[1] == 1 && first_order[2] == 2)); /* shuffled */
        free(seen);
        loader_destroy(l);
    }
    dataset_free(&d);
}

static void test_hold_whole_ring(void) {
    Dataset d;
    make_indexed(&d, 100);
    for (int workers = 0; workers <= 4; workers += 4) {
        LoaderConfig cfg = base_config(8, workers, 4);
        cfg.shuffle = 0;
        cfg.augment = 0;
        Loader *l = loader_create(&d, &cfg);
        loader_start_epoch(l, 0);
        Batch held[4];
        for (int i = 0; i < 4; i++) {
            CHECK(loader_next(l, &held[i]) == 1);
            CHECK(held[i].index == i && held[i].slot == i);
            CHECK(decode_index(held[i].images, &cfg.transform) == i * 8);
        }
        /* All four stay intact while held. */
        for (int i = 0; i < 4; i++)
            CHECK(decode_index(held[i].images + 7 * 18, &cfg.transform) == i * 8 + 7);
        for (int i = 0; i < 4; i++) loader_release(l, &held[i]);
        Batch b;
        int next = 4;
        while (loader_next(l, &b)) {
            CHECK(b.index == next && decode_index(b.images, &cfg.transform) == next * 8);
            next++;
            loader_release(l, &b);
        }
        CHECK(next == 13);
        CHECK(loader_wait_seconds(l) >= 0.0);
        loader_destroy(l);
    }
    dataset_free(&d);
}

static void test_destroy_mid_epoch(void) {
    Dataset d;
    synthetic_make(&d, 2000, 3, 32, 32, 10, 5);
    LoaderConfig cfg = base_config(64, 8, 2);
    cfg.transform.out_h = cfg.transform.out_w = 64;
    const int taken[3] = {0, 1, 2};
    for (int k = 0; k < 3; k++) {
        Loader *l = loader_create(&d, &cfg);
        loader_start_epoch(l, 0);
        Batch b;
        /* held, never released */
        for (int i = 0; i < taken[k]; i++) CHECK(loader_next(l, &b) == 1);
        double t0 = now_seconds();
        loader_destroy(l);
        double took = now_seconds() - t0;
        CHECK_MSG(took < 2.0, "destroy took %.2f s", took);
    }
    /* And before any epoch began. */
    Loader *l = loader_create(&d, &cfg);
    loader_destroy(l);
    CHECK(1);
    dataset_free(&d);
}

static void test_restart_mid_epoch(void) {
    Dataset d;
    synthetic_make(&d, 500, 3, 16, 16, 10, 9);
    LoaderConfig cfg = base_config(16, 4, 3);
    cfg.transform.flip = 1;
    cfg.transform.crop_pad = 4;
    cfg.transform.out_h = cfg.transform.out_w = 24;
    Recording fresh = record_epochs(&d, &cfg, 2); /* epochs 0 and 1 in full */
    size_t sample = 3 * 24 * 24;
    Loader *l = loader_create(&d, &cfg);
    for (int round = 0; round < 3; round++) {
        loader_start_epoch(l, 0);
        Batch b;
        for (int i = 0; i < 3 + round; i++) {
            CHECK(loader_next(l, &b) == 1);
            if (i < 1 + round) loader_release(l, &b); /* the last one stays held */
        }
        loader_start_epoch(l, 1); /* abandon epoch 0 with work in flight */
        size_t at = 0;
        int mismatches = 0;
        while (loader_next(l, &b)) {
            size_t off = (size_t)500 + at;
            size_t image_bytes = (size_t)b.n * sample * sizeof(float);
            if (memcmp(b.images, fresh.images + off * sample, image_bytes) ||
                memcmp(b.labels, fresh.labels + off, (size_t)b.n * sizeof(int32_t)))
                mismatches++;
            at += (size_t)b.n;
            loader_release(l, &b);
        }
        loader_release(l, &b); /* a second release is ignored */
        CHECK(at == 500 && mismatches == 0);
    }
    loader_destroy(l);
    recording_free(&fresh);
    dataset_free(&d);
}

/* ---- raw mode ------------------------------------------------------------------ */

/* Every raw batch of 'epochs' epochs: stored images, params, labels. */
typedef struct {
    uint8_t *images;
    TransformParams *params;
    int32_t *labels;
    int samples;
    int nonraw_fields; /* batches that had float images, or lacked raw ones */
} RawRecording;

static RawRecording record_raw_epochs(const Dataset *d, const LoaderConfig *cfg, int epochs) {
    LoaderConfig raw_cfg = *cfg;
    raw_cfg.raw = 1;
    Loader *l = loader_create(d, &raw_cfg);
    size_t image_bytes = dataset_image_bytes(d);
    size_t most = (size_t)epochs * d->n;
    RawRecording r = {0};
    r.images = malloc(most * image_bytes);
    r.params = malloc(most * sizeof(TransformParams));
    r.labels = malloc(most * sizeof(int32_t));
    for (int e = 0; e < epochs; e++) {
        loader_start_epoch(l, e);
        Batch b;
        while (loader_next(l, &b)) {
            r.nonraw_fields += b.images != NULL || !b.raw_images || !b.params;
            memcpy(r.images + (size_t)r.samples * image_bytes, b.raw_images, b.n * image_bytes);
            memcpy(r.params + r.samples, b.params, (size_t)b.n * sizeof(TransformParams));
            memcpy(r.labels + r.samples, b.labels, (size_t)b.n * sizeof(int32_t));
            r.samples += b.n;
            loader_release(l, &b);
        }
    }
    loader_destroy(l);
    return r;
}

static void raw_recording_free(RawRecording *r) {
    free(r->images);
    free(r->params);
    free(r->labels);
}

static LoaderConfig augmenting_config(int batch, int workers) {
    LoaderConfig cfg = base_config(batch, workers, 3);
    cfg.transform.out_h = 20;
    cfg.transform.out_w = 18;
    cfg.transform.flip = 1;
    cfg.transform.crop_pad = 2;
    cfg.transform.cutout = 5;
    return cfg;
}

static void test_raw_same_any_worker_count(void) {
    Dataset d;
    synthetic_make(&d, 300, 3, 12, 12, 10, test_seed());
    LoaderConfig cfg = augmenting_config(32, 0);
    RawRecording sync = record_raw_epochs(&d, &cfg, 2);
    CHECK(sync.samples == 600 && sync.nonraw_fields == 0);
    const int workers[] = {1, 8};
    for (int k = 0; k < 2; k++) {
        cfg.workers = workers[k];
        RawRecording r = record_raw_epochs(&d, &cfg, 2);
        CHECK(r.samples == sync.samples && r.nonraw_fields == 0);
        CHECK_MSG(memcmp(r.params, sync.params, 600 * sizeof(TransformParams)) == 0,
                  "workers=%d params differ from workers=0", workers[k]);
        CHECK(memcmp(r.images, sync.images, 600 * dataset_image_bytes(&d)) == 0);
        CHECK(memcmp(r.labels, sync.labels, 600 * sizeof(int32_t)) == 0);
        raw_recording_free(&r);
    }
    /* The stored images and labels, in the epoch's order. */
    int32_t order[300];
    int misplaced = 0;
    for (int e = 0; e < 2; e++) {
        shuffle_indices(order, 300, cfg.seed, e);
        for (int i = 0; i < 300; i++) {
            size_t at = (size_t)e * 300 + i;
            misplaced += memcmp(sync.images + at * dataset_image_bytes(&d),
                                dataset_image(&d, order[i]), dataset_image_bytes(&d)) != 0 ||
                         sync.labels[at] != d.labels[order[i]];
        }
    }
    CHECK(misplaced == 0);
    /* The params are drawn within their ranges, and all kinds come up. */
    int out_of_range = 0, flips = 0, shifted = 0, full_cutouts = 0;
    for (int i = 0; i < 600; i++) {
        const TransformParams *p = &sync.params[i];
        out_of_range += p->crop_dy < -2 || p->crop_dy > 2 || p->crop_dx < -2 || p->crop_dx > 2 ||
                        (p->flip != 0 && p->flip != 1) || p->cutout_y0 < 0 ||
                        p->cutout_y1 > 20 || p->cutout_x0 < 0 || p->cutout_x1 > 18 ||
                        p->cutout_y1 - p->cutout_y0 < 3 || p->cutout_y1 - p->cutout_y0 > 5 ||
                        p->cutout_x1 - p->cutout_x0 < 3 || p->cutout_x1 - p->cutout_x0 > 5;
        flips += p->flip;
        shifted += p->crop_dy != 0 || p->crop_dx != 0;
        full_cutouts += p->cutout_y1 - p->cutout_y0 == 5 && p->cutout_x1 - p->cutout_x0 == 5;
    }
    CHECK(out_of_range == 0);
    CHECK(flips > 200 && flips < 400 && shifted > 400 && full_cutouts > 200);
    /* augment = 0: nothing drawn. */
    cfg.augment = 0;
    RawRecording plain = record_raw_epochs(&d, &cfg, 1);
    TransformParams none;
    memset(&none, 0, sizeof none);
    int augmented = 0;
    for (int i = 0; i < plain.samples; i++)
        augmented += memcmp(&plain.params[i], &none, sizeof none) != 0;
    CHECK(plain.samples == 300 && augmented == 0);
    raw_recording_free(&plain);
    raw_recording_free(&sync);
    dataset_free(&d);
}

/* The raw batches, through the GPU kernel's CPU reference, give the float
 * loader's images: the GPU path makes the CPU path's images. */
static double raw_vs_float_max_error(const Dataset *d, const LoaderConfig *cfg, int nhwc) {
    Recording floats = record_epochs(d, cfg, 2);
    RawRecording raw = record_raw_epochs(d, cfg, 2);
    if (raw.samples != 2 * d->n) return INFINITY;
    GpuTransformArgs a;
    gpu_transform_args_init(&a, &cfg->transform, d->c, d->h, d->w);
    size_t sample_floats = (size_t)d->c * a.out_h * a.out_w;
    a.raw_images = raw.images;
    a.params = raw.params;
    a.n = raw.samples;
    a.nhwc = nhwc;
    a.out = malloc((size_t)raw.samples * sample_floats * sizeof(float));
    gpu_transform_reference_cpu(&a);
    double worst = 0;
    for (int i = 0; i < raw.samples; i++)
        for (int ch = 0; ch < d->c; ch++)
            for (int y = 0; y < a.out_h; y++)
                for (int x = 0; x < a.out_w; x++) {
                    size_t plane = (size_t)a.out_h * a.out_w, pixel = (size_t)y * a.out_w + x;
                    float want = floats.images[i * sample_floats + ch * plane + pixel];
                    float got = nhwc ? a.out[(i * plane + pixel) * d->c + ch]
                                     : a.out[i * sample_floats + ch * plane + pixel];
                    double err = fabs((double)got - (double)want);
                    if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
                }
    free(a.out);
    raw_recording_free(&raw);
    recording_free(&floats);
    return worst;
}

static void test_raw_params_reproduce_float_path(void) {
    Dataset d;
    synthetic_make(&d, 200, 3, 12, 12, 10, test_seed() + 1);
    LoaderConfig cfg = augmenting_config(24, 2);
    double err = raw_vs_float_max_error(&d, &cfg, 0);
    CHECK_MSG(err < 1e-5, "12x12 -> 20x18, crop, flip, cutout: max error %g", err);
    err = raw_vs_float_max_error(&d, &cfg, 1);
    CHECK_MSG(err < 1e-5, "the same into NHWC: max error %g", err);
    cfg.transform.out_h = cfg.transform.out_w = 0; /* the stored size: no resize */
    err = raw_vs_float_max_error(&d, &cfg, 0);
    CHECK_MSG(err < 1e-5, "12x12 kept, crop, flip, cutout: max error %g", err);
    cfg.transform.flip = TRANSFORM_FLIP_ALTERNATE;
    err = raw_vs_float_max_error(&d, &cfg, 0);
    CHECK_MSG(err < 1e-5, "12x12 kept, crop, alternating flip, cutout: max error %g", err);
    cfg.transform.out_h = cfg.transform.out_w = 5; /* down */
    cfg.augment = 0;
    err = raw_vs_float_max_error(&d, &cfg, 0);
    CHECK_MSG(err < 1e-5, "12x12 -> 5x5, no augmentation: max error %g", err);
    dataset_free(&d);

    synthetic_make(&d, 64, 1, 7, 9, 4, test_seed() + 2); /* one channel, odd sizes */
    cfg = augmenting_config(10, 3);
    cfg.transform.out_h = 13;
    cfg.transform.out_w = 4;
    cfg.transform.cutout = 3;
    err = raw_vs_float_max_error(&d, &cfg, 0);
    CHECK_MSG(err < 1e-5, "1x7x9 -> 13x4: max error %g", err);
    dataset_free(&d);
}

/* data.on_device: an epoch's plan (loader_epoch_plan) is what the raw batches of
 * the epoch hold, image, label and params for each position, alone and as rank
 * 1 of 3, with the alternating flip and the reflect padding. */
static void test_epoch_plan_matches_raw_batches(void) {
    enum { EPOCHS = 2 };
    Dataset d;
    synthetic_make(&d, 300, 3, 12, 12, 10, test_seed() + 3);
    LoaderConfig cfg = augmenting_config(32, 0);
    cfg.transform.flip = TRANSFORM_FLIP_ALTERNATE;
    cfg.transform.pad_reflect = 1;
    cfg.raw = 1;
    cfg.drop_last = 1; /* as training's */
    size_t image_bytes = dataset_image_bytes(&d);
    for (int world = 1; world <= 3; world += 2) {
        cfg.rank = world > 1 ? 1 : 0;
        cfg.world = world;
        RawRecording r = record_raw_epochs(&d, &cfg, EPOCHS);
        Loader *l = loader_create(&d, &cfg);
        int n = loader_epoch_samples(l), batched = loader_batches_per_epoch(l) * cfg.batch;
        CHECK(n == (world == 1 ? 300 : 100) && r.samples == EPOCHS * batched);
        int32_t *index = malloc((size_t)n * sizeof *index);
        TransformParams *params = malloc((size_t)n * sizeof *params);
        int differ = 0;
        for (int e = 0; e < EPOCHS; e++) {
            loader_epoch_plan(l, e, index, params);
            for (int i = 0; i < batched; i++) {
                int k = e * batched + i;
                differ += memcmp(dataset_image(&d, index[i]), r.images + (size_t)k * image_bytes, image_bytes) != 0;
                differ += memcmp(&params[i], &r.params[k], sizeof params[i]) != 0;
                differ += d.labels[index[i]] != r.labels[k];
            }
        }
        CHECK_MSG(differ == 0, "world %d: %d differences between the plan and the raw batches", world, differ);
        free(index);
        free(params);
        loader_destroy(l);
        raw_recording_free(&r);
    }
    dataset_free(&d);
}

/* ---- distributed sampler ------------------------------------------------------- */

/* The data set indices one rank's loader yields in an epoch, in order; returns how many. */
static int shard_indices(const Dataset *d, LoaderConfig cfg, int rank, int world, int epoch,
                         int32_t *out, int *batches) {
    cfg.rank = rank;
    cfg.world = world;
    Loader *l = loader_create(d, &cfg);
    *batches = loader_batches_per_epoch(l);
    loader_start_epoch(l, epoch);
    Batch b;
    int at = 0, counted = 0;
    while (loader_next(l, &b)) {
        for (int i = 0; i < b.n; i++) out[at++] = decode_index(b.images + (size_t)i * 18, &cfg.transform);
        counted++;
        loader_release(l, &b);
    }
    CHECK(counted == *batches);
    loader_destroy(l);
    return at;
}

/* For world 2, 3 and 4: the shards of an epoch are disjoint, are positions
 * rank, rank + world, ... of the world-1 permutation (so interleaved by rank
 * they give its prefix), cover the data set cut to a multiple of world (all of
 * it without drop_last), and change with the epoch. */
/* data.flip = alternate: a random half of the samples flipped in epoch 0, and
 * then each sample flipped in every other epoch, in the raw mode's params and
 * (the same choice) in the float path's images. */
static void test_alternate_flip(void) {
    enum { N = 512, EPOCHS = 3 };
    Dataset d;
    make_indexed(&d, N);
    LoaderConfig cfg = base_config(64, 2, 3);
    cfg.transform.flip = TRANSFORM_FLIP_ALTERNATE;
    RawRecording r = record_raw_epochs(&d, &cfg, EPOCHS);
    CHECK(r.samples == EPOCHS * N);
    int flipped[EPOCHS][N], seen[EPOCHS][N];
    memset(seen, 0, sizeof seen);
    for (int k = 0; k < r.samples; k++) {
        int e = k / N, i = decode_raw_index(r.images + (size_t)k * dataset_image_bytes(&d));
        CHECK(i >= 0 && i < N);
        if (i < 0 || i >= N) continue;
        flipped[e][i] = r.params[k].flip;
        seen[e][i]++;
    }
    int first = 0, alternating = 0;
    for (int i = 0; i < N; i++) {
        CHECK(seen[0][i] == 1 && seen[1][i] == 1 && seen[2][i] == 1);
        first += flipped[0][i];
        alternating += flipped[1][i] == !flipped[0][i] && flipped[2][i] == flipped[0][i];
    }
    CHECK_MSG(alternating == N, "%d of %d samples alternate their flip over 3 epochs", alternating, N);
    /* a binomial(512, 1/2) count: 0.35..0.65 of it is 6.8 standard deviations either side */
    CHECK_MSG(first > N * 35 / 100 && first < N * 65 / 100, "epoch 0 flipped %d of %d", first, N);
    CHECK(r.params[0].flip == transform_alternate_flip(cfg.seed, 0, decode_raw_index(r.images)));
    raw_recording_free(&r);
    dataset_free(&d);
}

static void test_distributed_shards(void) {
    const int n = 1001; /* not a multiple of 2, 3 or 4 */
    Dataset d;
    make_indexed(&d, n);
    int32_t *whole = malloc(n * sizeof(int32_t));
    int32_t *interleaved = malloc(n * sizeof(int32_t));
    int32_t *shard = malloc(n * sizeof(int32_t));
    int32_t *first_epoch_rank0 = malloc(n * sizeof(int32_t));
    int *seen = malloc(n * sizeof(int));
    const int batches_of[2] = {1, 7};
    for (int drop_last = 0; drop_last < 2; drop_last++)
        for (int bk = 0; bk < 2; bk++)
            for (int world = 2; world <= 4; world++) {
                int batch = batches_of[bk];
                LoaderConfig cfg = base_config(batch, world == 3 ? 0 : 3, 2);
                cfg.augment = 0;
                cfg.drop_last = drop_last;
                int cut = drop_last ? n - n % world : n;
                int first_len = 0, misplaced = 0, unequal_batches = 0;
                for (int epoch = 0; epoch < 2; epoch++) {
                    int whole_batches;
                    int whole_n = shard_indices(&d, cfg, 0, 1, epoch, whole, &whole_batches);
                    CHECK(whole_n == (drop_last ? n / batch * batch : n));
                    memset(seen, 0, n * sizeof(int));
                    int covered = 0, batches0 = -1;
                    for (int rank = 0; rank < world; rank++) {
                        int batches;
                        int got = shard_indices(&d, cfg, rank, world, epoch, shard, &batches);
                        int mine = (cut - rank + world - 1) / world;
                        int want = drop_last ? mine / batch * batch : mine;
                        CHECK_MSG(got == want, "world %d rank %d drop_last %d batch %d: %d samples, "
                                  "not %d", world, rank, drop_last, batch, got, want);
                        if (batches0 < 0) batches0 = batches;
                        unequal_batches += drop_last && batches != batches0;
                        for (int i = 0; i < got; i++) {
                            int pos = rank + i * world;
                            if (shard[i] < 0 || shard[i] >= n || pos >= n) { misplaced++; continue; }
                            seen[shard[i]]++;
                            interleaved[pos] = shard[i];
                        }
                        covered += got;
                        if (epoch == 0 && rank == 0) {
                            memcpy(first_epoch_rank0, shard, (size_t)got * sizeof(int32_t));
                            first_len = got;
                        } else if (rank == 0) {
                            CHECK_MSG(memcmp(first_epoch_rank0, shard, (size_t)got * sizeof(int32_t)),
                                      "world %d: epoch 1 repeats epoch 0's shard", world);
                            CHECK(got == first_len);
                        }
                    }
                    int twice = 0;
                    for (int i = 0; i < n; i++) twice += seen[i] > 1;
                    CHECK_MSG(twice == 0, "world %d: %d samples on more than one rank", world, twice);
                    /* With batch 1 nothing is dropped but the cut: the shards cover it exactly,
                     * and interleaved they are the world-1 permutation's prefix. */
                    if (batch == 1) {
                        CHECK_MSG(covered == cut, "world %d drop_last %d: %d covered, not %d", world,
                                  drop_last, covered, cut);
                        misplaced += memcmp(interleaved, whole, (size_t)cut * sizeof(int32_t)) != 0;
                    } else {
                        for (int rank = 0; rank < world; rank++) {
                            int batches;
                            int got = shard_indices(&d, cfg, rank, world, epoch, shard, &batches);
                            for (int i = 0; i < got; i++) misplaced += shard[i] != whole[rank + i * world];
                        }
                    }
                }
                CHECK_MSG(misplaced == 0, "world %d drop_last %d batch %d: %d misplaced", world,
                          drop_last, batch, misplaced);
                CHECK(unequal_batches == 0);
            }
    free(whole);
    free(interleaved);
    free(shard);
    free(first_epoch_rank0);
    free(seen);
    dataset_free(&d);
}

/* A rank's images are the world-1 images of the same samples, augmentation
 * included (it is drawn from the sample's index); world 0 and 1 are the same. */
static void test_distributed_same_augmentation(void) {
    Dataset d;
    synthetic_make(&d, 90, 3, 12, 12, 10, test_seed());
    LoaderConfig cfg = augmenting_config(10, 2);
    size_t sample = (size_t)3 * 20 * 18;
    Recording whole = record_epochs(&d, &cfg, 1);
    cfg.world = 1;
    Recording one = record_epochs(&d, &cfg, 1);
    CHECK(one.batches == whole.batches &&
          memcmp(one.images, whole.images, (size_t)90 * sample * sizeof(float)) == 0);
    recording_free(&one);
    const int world = 4;
    int mismatched = 0;
    for (int rank = 0; rank < world; rank++) {
        cfg.rank = rank;
        cfg.world = world;
        Recording r = record_epochs(&d, &cfg, 1);
        int samples = 0;
        for (int b = 0; b < r.batches; b++) samples += r.sizes[b];
        CHECK(samples == (90 - rank + world - 1) / world);
        for (int i = 0; i < samples; i++) {
            size_t pos = (size_t)rank + (size_t)i * world;
            mismatched += memcmp(r.images + i * sample, whole.images + pos * sample,
                                 sample * sizeof(float)) != 0 ||
                          r.labels[i] != whole.labels[pos];
        }
        recording_free(&r);
    }
    CHECK(mismatched == 0);
    recording_free(&whole);
    dataset_free(&d);
}

/* Many small batches through a shallow ring with many workers, abandoned
 * epochs and held batches mixed in. */
static void test_stress(int prefetch, int raw) {
    Dataset d;
    make_indexed(&d, 3000);
    LoaderConfig cfg = base_config(3, 8, prefetch);
    cfg.augment = 0;
    cfg.raw = raw;
    Loader *l = loader_create(&d, &cfg);
    int *seen = malloc(3000 * sizeof(int));
    int full_epochs = 0, errors = 0;
    uint64_t rng = test_seed();
    for (int e = 0; e < 16; e++) {
        memset(seen, 0, 3000 * sizeof(int));
        loader_start_epoch(l, e);
        int abandon_at = e % 4 == 3 ? (int)test_uniform(&rng, 0, 1000) : -1;
        Batch b, held;
        int holding = 0, count = 0;
        while (count != abandon_at && loader_next(l, &b)) {
            for (int i = 0; i < b.n; i++) {
                int idx = raw ? decode_raw_index(b.raw_images + (size_t)i * 18)
                              : decode_index(b.images + (size_t)i * 18, &cfg.transform);
                if (idx < 0 || idx >= 3000 || b.labels[i] != idx % 7) errors++;
                else seen[idx]++;
            }
            count++;
            /* Sometimes keep a batch while taking the next. */
            if (holding) {
                loader_release(l, &held);
                holding = 0;
            }
            if (prefetch > 1 && test_uniform(&rng, 0, 1) < 0.3f) {
                held = b;
                holding = 1;
            } else {
                loader_release(l, &b);
            }
        }
        if (holding) loader_release(l, &held);
        if (abandon_at < 0) {
            int once = 0;
            for (int i = 0; i < 3000; i++) once += seen[i] == 1;
            full_epochs += once == 3000;
        }
    }
    CHECK(errors == 0);
    CHECK(full_epochs == 12);
    loader_destroy(l);
    free(seen);
    dataset_free(&d);
}

static double samples_per_second(const Dataset *d, int workers, int prefetch, int batch,
                                 int batches, int raw) {
    LoaderConfig cfg = base_config(batch, workers, prefetch);
    cfg.raw = raw;
    cfg.transform.out_h = cfg.transform.out_w = 224;
    cfg.transform.flip = 1;
    cfg.transform.crop_pad = 4;
    Loader *l = loader_create(d, &cfg);
    loader_start_epoch(l, 0);
    Batch b;
    double t0 = now_seconds();
    int samples = 0;
    for (int i = 0; i < batches && loader_next(l, &b); i++) {
        samples += b.n;
        loader_release(l, &b);
    }
    double rate = samples / (now_seconds() - t0);
    loader_destroy(l);
    return rate;
}

static void bench(void) {
    Dataset d;
    synthetic_make(&d, 8192, 3, 32, 32, 10, 1);
    samples_per_second(&d, 2, 4, 64, 8, 0); /* warm up the pages */
    const int workers[] = {0, 1, 2, 8};
    for (int k = 0; k < 4; k++)
        printf("loader 32x32 -> 224x224, crop+flip, batch 128, prefetch 4, workers %d: "
               "%.0f samples/s\n", workers[k], samples_per_second(&d, workers[k], 4, 128, 40, 0));
    for (int k = 0; k < 4; k++)
        printf("loader raw (for the GPU transform), batch 256, prefetch 4, workers %d: "
               "%.0f samples/s\n", workers[k], samples_per_second(&d, workers[k], 4, 256, 30, 1));
    dataset_free(&d);
}

int main(void) {
    alarm(120); /* a hang fails the test instead of stalling CI */
    test_same_batches_any_worker_count();
    test_every_sample_once();
    test_hold_whole_ring();
    test_destroy_mid_epoch();
    test_restart_mid_epoch();
    test_distributed_shards();
    test_distributed_same_augmentation();
    test_stress(2, 0);
    test_stress(1, 0);
    test_raw_same_any_worker_count();
    test_raw_params_reproduce_float_path();
    test_alternate_flip();
    test_epoch_plan_matches_raw_batches();
    test_stress(2, 1);
    test_stress(1, 1);
    const char *b = getenv("TRAINC_DATA_BENCH");
    if (b && atoi(b)) bench();
    return test_finish("test_data_loader");
}
