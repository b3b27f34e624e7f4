/* The batch loader: worker threads decode, augment and collate batches into a
 * ring of slots in host memory (pinned or pageable) ahead of the trainer. In raw
 * mode they only gather the stored uint8 images and draw each sample's
 * augmentation, and gpu_transform_batch makes the floats on the device.
 * workers = 0 builds each batch on the caller's thread when it is asked for
 * (the lab's baseline). Batches come out in order and are identical for a given
 * seed whatever the number of workers. */
#ifndef TRAINC_DATA_LOADER_H
#define TRAINC_DATA_LOADER_H

#include <stdint.h>

#include "data/dataset.h"
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
    int drop_last; /* skip the last partial batch */
    int augment;   /* apply TransformSpec flip, crop and cutout (off for evaluation) */
    int raw;       /* 1: batches hold the stored uint8 images and each sample's
                      TransformParams, for gpu_transform_batch, instead of floats */
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

typedef struct {
    float *images;   /* [n][c][out_h][out_w] float32 in a ring slot; NULL in raw mode */
    int32_t *labels; /* [n] */
    int n;           /* samples in this batch (<= batch) */
    int index;       /* batch number within the epoch */
    int slot;
    /* Raw mode only, else NULL; both in the ring slot (pinned when cfg.pinned). */
    const uint8_t *raw_images;     /* [n][c][h][w] the data set's images, as stored */
    const TransformParams *params; /* [n] the random choices the float path would make */
} Batch;

typedef struct Loader Loader;

Loader *loader_create(const Dataset *d, const LoaderConfig *cfg);
/* Batches of this rank's shard of an epoch (the whole epoch when world <= 1). */
int loader_batches_per_epoch(const Loader *l);
/* Starts producing the batches of this epoch (0-based); the previous epoch
 * must have been consumed or be abandoned (its pending work is dropped). */
void loader_start_epoch(Loader *l, int epoch);
/* Waits for the next batch of the epoch; returns 0 when the epoch is over. The
 * batch stays valid until loader_release. At most 'prefetch' batches may be
 * held at once. */
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
 * loader with workers = 0, never asked for batches (it rewrites the epoch's order). */
void loader_epoch_plan(Loader *l, int epoch, int32_t *index, TransformParams *params);
/* Seconds loader_next spent waiting for workers since creation. */
double loader_wait_seconds(const Loader *l);
/* Stops the workers (also mid-epoch) and frees everything. */
void loader_destroy(Loader *l);

#ifdef __cplusplus
}
#endif
#endif
