/* Dropout's mask, shared by the CPU reference (ops/dropout.c) and the CUDA
 * kernels (ops/dropout.cu), which therefore drop the same elements: a
 * counter-based hash (no generator state), so a mask is a function of
 * (seed, layer, step, element) and nothing else. */
#ifndef TRAINC_OPS_DROPOUT_MATH_H
#define TRAINC_OPS_DROPOUT_MATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define DROPOUT_HOST_DEVICE __host__ __device__
#else
#define DROPOUT_HOST_DEVICE
#endif

/* SplitMix64's finalizer: every input bit reaches every output bit. */
static inline DROPOUT_HOST_DEVICE uint64_t dropout_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One mask's key: the seed, then the layer, then the step, each mixed in. */
static inline DROPOUT_HOST_DEVICE uint64_t dropout_key(uint64_t seed, uint32_t layer, int64_t step) {
    uint64_t k = dropout_mix64(seed + 0x9e3779b97f4a7c15ULL * ((uint64_t)layer + 1));
    return dropout_mix64(k ^ ((uint64_t)step * 0xd1b54a32d192ed03ULL + 0x8cb92ba72f3d8dd7ULL));
}

/* Whether element 'index' (its NCHW position) is kept: its 32 hashed bits at
 * or above the threshold, p * 2^32. */
static inline DROPOUT_HOST_DEVICE int dropout_keep(uint64_t key, uint64_t index, uint32_t threshold) {
    return (uint32_t)(dropout_mix64(key + index * 0x9e3779b97f4a7c15ULL) >> 32) >= threshold;
}

/* The NCHW position of element i of a [n][plane][c] (NHWC) tensor. */
static inline DROPOUT_HOST_DEVICE uint64_t dropout_nchw_index(uint64_t i, int c, int plane, int nhwc) {
    if (!nhwc) return i;
    uint64_t per_image = (uint64_t)plane * c, img = i / per_image, r = i % per_image;
    return (img * c + r % c) * plane + r / c;
}

#endif
