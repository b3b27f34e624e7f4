/* Per-sample transforms on the CPU: random crop with zero padding, random
 * horizontal flip, bilinear resize, per-channel normalisation, from a uint8 CHW
 * image to a float32 CHW image of out_h x out_w. The random choices come from
 * a seed per sample, so the result does not depend on which thread ran it. */
#ifndef TRAINC_DATA_TRANSFORM_H
#define TRAINC_DATA_TRANSFORM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int out_h, out_w;   /* resize target (bilinear, align_corners = false, as PyTorch) */
    int flip;           /* random horizontal flip with probability 1/2 */
    int crop_pad;       /* > 0: pad by this many zero pixels, then crop back to the
                           stored size at a random offset, before the resize */
    float mean[3], std[3]; /* applied to pixel/255 */
} TransformSpec;

/* The CIFAR-10 channel means and standard deviations. */
void transform_spec_default(TransformSpec *t, int out_h, int out_w);
void transform_sample(const TransformSpec *t, const uint8_t *src, int c, int h, int w,
                      uint64_t sample_seed, float *dst);

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
