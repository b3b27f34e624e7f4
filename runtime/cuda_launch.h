/* Launch sizes shared by the elementwise kernels of every layer (CUDA sources
 * only). Failed launches are caught by CUDA_CHECK_LAUNCH in runtime/check.h. */
#ifndef TRAINC_CUDA_LAUNCH_H
#define TRAINC_CUDA_LAUNCH_H

#include <stddef.h>

#define ELEMENTWISE_THREADS 256
/* Enough blocks to fill an H100 many times over; grid-stride loops cover the rest. */
#define ELEMENTWISE_MAX_BLOCKS 8192

/* Blocks of 'threads' for one item per thread, at least 1 and at most
 * max_blocks (a grid-stride loop covers the rest). */
static inline unsigned grid_stride_blocks(size_t items, unsigned threads, unsigned max_blocks) {
    size_t blocks = (items + threads - 1) / threads;
    if (blocks > max_blocks) blocks = max_blocks;
    return blocks == 0 ? 1 : (unsigned)blocks;
}

static inline unsigned elementwise_blocks(size_t n) {
    return grid_stride_blocks(n, ELEMENTWISE_THREADS, ELEMENTWISE_MAX_BLOCKS);
}

#endif
