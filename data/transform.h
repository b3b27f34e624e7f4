/* Per-sample transforms on the CPU: random crop with zero or reflect padding, random
 * horizontal flip, bilinear resize, per-channel normalisation and cutout, from a
 * uint8 CHW image to a float32 CHW image of out_h x out_w. The random choices
 * come from a seed per sample, so the result does not depend on which thread ran
 * it. data/gpu_transform.h does the same on the GPU from the drawn TransformParams. */
#ifndef TRAINC_DATA_TRANSFORM_H
#define TRAINC_DATA_TRANSFORM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int out_h, out_w;   /* resize target (bilinear, align_corners = false, as PyTorch) */
    int flip;           /* 1: random horizontal flip with probability 1/2;
                           TRANSFORM_FLIP_ALTERNATE: the loader flips each sample
                           in every other epoch (transform_alternate_flip) */
    int crop_pad;       /* > 0: pad by this many pixels, then crop back to the
                           stored size at a random offset, before the resize */
    int pad_reflect;    /* 1: the padding mirrors the image without repeating its
                           edge (PyTorch's mode = "reflect"); 0: zero pixels */
    float mean[3], std[3]; /* applied to pixel/255 */
    int cutout;         /* > 0: a square of this side at a random centre (cy, cx) of
                           the output, rows cy - cutout/2 .. cy - cutout/2 + cutout - 1
                           (columns alike) clipped at the borders, is set to 0 after
                           the normalisation (the mean colour), as DeVries & Taylor */
} TransformSpec;

/* One sample's random choices, drawn from its seed, in this order: crop row
 * offset, crop column offset, flip, cutout centre row, cutout centre column
 * (each only when its option is on). They say all there is to know about the
 * augmentation of the sample, so the GPU kernel needs no crop_pad, flip or
 * cutout setting of its own. A plain array of these is copied to the device as is. */
typedef struct {
    int32_t crop_dy, crop_dx; /* output pixel (y, x) of the crop reads stored pixel
                                 (y + crop_dy, x + crop_dx), zero or mirrored outside
                                 (transform_pad_index); in [-crop_pad, crop_pad], 0
                                 without a crop */
    int32_t flip;             /* 1: mirrored left-right after the crop */
    int32_t cutout_y0, cutout_y1, cutout_x0, cutout_x1; /* output rows [y0, y1) x
                                 columns [x0, x1) set to 0; empty without cutout */
} TransformParams;

#ifdef __CUDACC__
#define TRANSFORM_HOST_DEVICE __host__ __device__
#else
#define TRANSFORM_HOST_DEVICE
#endif

/* Where coordinate i (any int) of a side of n stored pixels reads: i itself
 * inside; outside, with reflect, the mirror image about the edge pixels
 * (-1 -> 1, n -> n - 2, repeated for offsets past a whole side; n = 1: 0),
 * else -1 (a zero pixel). The CPU path, its GPU reference and the kernel share it. */
static inline TRANSFORM_HOST_DEVICE int transform_pad_index(int i, int n, int reflect) {
    if (i >= 0 && i < n) return i;
    if (!reflect) return -1;
    if (n == 1) return 0;
    int period = 2 * (n - 1);
    i %= period;
    if (i < 0) i += period;
    return i < n ? i : period - i;
}

/* A flip for every other epoch (the CIFAR-10 speed runs' "alternating flip"):
 * epoch 0 flips a random half of the samples, and each later epoch flips just
 * those epoch 0 did not, then those it did, ... Where this is chosen the drawn
 * flip (TransformParams.flip) is replaced by transform_alternate_flip's. */
#define TRANSFORM_FLIP_ALTERNATE 2
int transform_alternate_flip(uint64_t seed, int epoch, int64_t sample);

/* The CIFAR-10 channel means and standard deviations. */
void transform_spec_default(TransformSpec *t, int out_h, int out_w);
/* Stops with a message unless c is 1..3, every image and output side, crop_pad
 * and cutout are at most DATASET_MAX_SIDE (data/dataset.h), the means finite
 * and the standard deviations finite and > 0; so does the loader's set-up. */
void transform_sample(const TransformSpec *t, const uint8_t *src, int c, int h, int w,
                      uint64_t sample_seed, float *dst);

/* A sample's flip and cutout draws, in this order, from *rng (after its crop
 * draws), for an output of out_h x out_w: flip with probability 1/2 where flip
 * is on, then the cutout's centre row and column where cutout > 0. */
void transform_draw_flip_cutout(uint64_t *rng, int flip, int cutout, int out_h, int out_w, TransformParams *out);
/* Zeroes the cutout square of c planes of out_h x out_w floats. */
void transform_apply_cutout(const TransformParams *tp, int c, int out_h, int out_w, float *dst);

/* splitmix64: the one random number generator of the data pipeline. */
uint64_t rng_splitmix64(uint64_t *state);
/* A seed for (run seed, epoch, sample) that does not depend on thread order. */
uint64_t rng_sample_seed(uint64_t seed, int epoch, int64_t sample);
/* Fisher-Yates permutation of 0..n-1 for the epoch. */
void shuffle_indices(int32_t *idx, int n, uint64_t seed, int epoch);

#ifdef __cplusplus
}
#endif
#endif
