/* The batch loader: worker threads read, decode, augment and collate batches
 * into a ring of slots in host memory (pinned or pageable) ahead of the
 * trainer, from any source (data/source.h). What a sample becomes:
 *   a set decoded once, without resized_crop: the TransformSpec's pad-crop,
 *     flip, resize and cutout (data/transform_plan.h): floats, or in raw mode
 *     the stored uint8 image and the drawn TransformParams for the GPU;
 *   with resized_crop (any source): the ImageNet recipe's crop box resampled
 *     (data/resample.h) to the output size: floats, or in raw mode the uint8
 *     crop at the output size and its flip and cutout as TransformParams (the
 *     GPU transform then only flips, normalises and cuts out);
 *   in encoded mode (the GPU decodes, data/gpu_decode.h): the file's bytes and
 *     its crop box, or where the GPU's decoder cannot take the file (PNG, BMP,
 *     CMYK, progressive JPEG) the uint8 crop the CPU made.
 * workers = 0 builds each batch on the caller's thread when it is asked for
 * (the lab's baseline). Batches come out in order and are identical for a given
 * seed whatever the number of workers. */
#ifndef TRAINC_DATA_LOADER_H
#define TRAINC_DATA_LOADER_H

#include <stdint.h>

#include "data/dataset.h"
#include "data/resample.h"
#include "data/source.h"
#include "data/transform.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int batch;
    int workers;   /* 0: build batches on the caller's thread */
    int prefetch;  /* ring slots (>= 1); batches built ahead of the trainer */
    int pinned;    /* slots in cudaHostAlloc memory */
    int shuffle;   /* per-epoch permutation from the seed */
    int shuffle_shards; /* shards: this many shards' samples are shuffled together (the order of the
                           shards shuffled too), so reads stay within a few files; 0: every sample */
    int drop_last; /* skip the last partial batch */
    int augment;   /* training: random crops, flip and cutout; off: evaluation's */
    int raw;       /* 1: batches hold uint8 images and each sample's TransformParams, for
                      gpu_transform_batch, instead of floats */
    int resized_crop; /* the ImageNet recipe (crop): any image size */
    CropRecipe crop;
    int dct_scaling;  /* resized_crop: JPEG decoded at 1/2, 1/4 or 1/8 where the box allows */
    int encoded;      /* batches hold the encoded files for the GPU decoder (resized_crop) */
    float cpu_share;  /* encoded: this share of each batch's JPEGs, spread evenly over it, decoded by the loader
                         threads instead (the GPU decoder's engines slow beside a training step) */
    int skip_bad;     /* a file that cannot be read or decoded is passed over: counted, named in the
                         log, its place taken by the next sample of the epoch; 0: it stops the run */
    uint64_t seed;
    TransformSpec transform;
    /* Distributed sampler (world > 1; 0 and 1 mean the whole data set): every
     * rank draws the same permutation for the epoch and takes positions rank,
     * rank + world, rank + 2 world, ... of it. With drop_last the permutation is
     * first cut to a multiple of world, so all ranks get the same number of
     * samples and batches; without it every sample is taken exactly once over
     * the ranks, and a rank may get one sample (and so one batch) fewer. */
    int rank, world;
} LoaderConfig;

/* Encoded mode: one sample of a batch. */
typedef struct {
    int64_t offset;   /* its file's bytes in Batch.encoded */
    int32_t index;    /* the sample's index in the source (its name in messages) */
    int32_t bytes;
    int32_t w, h;     /* the stored image's size */
    int32_t flip;
    int32_t fallback; /* 1: the CPU decoded and resampled it: Batch.fallback's image, box its whole */
    CropBox box;      /* in the stored image's pixels */
} EncodedSample;

typedef struct {
    float *images;   /* [n][c][out_h][out_w] float32 in a ring slot; NULL in raw and encoded modes */
    int32_t *labels; /* [n] */
    int n;           /* samples in this batch (<= batch) */
    int index;       /* batch number within the epoch */
    int slot;
    /* Raw mode only, else NULL; both in the ring slot (pinned when cfg.pinned). */
    const uint8_t *raw_images;     /* [n][c][h][w] at loader_raw_shape's size */
    const TransformParams *params; /* [n] the random choices the float path would make */
    /* Encoded mode only, else NULL. */
    const uint8_t *encoded;        /* the files of the batch, back to back */
    const EncodedSample *samples;  /* [n] */
    const uint8_t *fallback;       /* [n][3][out_h][out_w]: the samples with fallback set */
} Batch;

/* Where the workers' time went, summed over them since creation. */
typedef struct {
    double read_s, decode_s, augment_s; /* reading files, decoding them, cropping and resampling */
    long samples;                       /* built */
    long skipped;                       /* distinct files passed over (skip_bad) */
    long gpu_decoded, cpu_decoded;      /* encoded mode: samples left to the GPU, decoded on the CPU */
} LoaderStages;

typedef struct Loader Loader;

Loader *loader_create_source(const Source *s, const LoaderConfig *cfg);
/* A decoded set (tests, tools): loader_create_source over a view of it. */
Loader *loader_create(const Dataset *d, const LoaderConfig *cfg);
/* Batches of this rank's shard of an epoch (the whole epoch when world <= 1). */
int loader_batches_per_epoch(const Loader *l);
/* Starts producing the batches of this epoch (0-based); the previous epoch
 * must have been consumed or be abandoned (its pending work is dropped). */
void loader_start_epoch(Loader *l, int epoch);
/* The same from batch first_batch on, the earlier ones never built (a resume). */
void loader_start_epoch_at(Loader *l, int epoch, int first_batch);
/* Waits for the next batch of the epoch; returns 0 when the epoch is over. The
 * batch stays valid until loader_release. At most 'prefetch' batches may be
 * held at once. A sample that failed (without skip_bad) stops the run here,
 * with its file's message. */
int loader_next(Loader *l, Batch *out);
void loader_release(Loader *l, const Batch *b);
/* The seed of the epochs started from now on (run.repeats: run r's own order
 * and augmentation); the epoch in hand, if any, is dropped. */
void loader_set_seed(Loader *l, uint64_t seed);
/* Samples of this rank's epoch (the whole data set when world <= 1). */
int loader_epoch_samples(const Loader *l);
/* The epoch as data that stays on the device needs it (data.on_device): the
 * data set index of each of the epoch's loader_epoch_samples positions, in
 * order, and each sample's random choices: what raw-mode batches of the epoch
 * would hold, batch b being positions b * batch .. b * batch + n - 1. Only for a
 * loader with workers = 0 over a decoded set without resized_crop, never asked
 * for batches (it rewrites the epoch's order). */
void loader_epoch_plan(Loader *l, int epoch, int32_t *index, TransformParams *params);
/* The uint8 images of raw mode: c x h x w (the stored size, or the output's with resized_crop). */
void loader_raw_shape(const Loader *l, int *c, int *h, int *w);
/* Its ring's depth: the batches a consumer may hold at once. */
int loader_prefetch(const Loader *l);
/* The source it reads. */
const Source *loader_source(const Loader *l);
/* Seconds loader_next spent waiting for workers since creation. */
double loader_wait_seconds(const Loader *l);
void loader_stages(const Loader *l, LoaderStages *out);
/* Stops the workers (also mid-epoch) and frees everything. */
void loader_destroy(Loader *l);

#ifdef __cplusplus
}
#endif
#endif
