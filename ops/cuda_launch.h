/* Launch sizes shared by the ops' elementwise kernels (CUDA sources only). */
#ifndef TRAINC_OPS_CUDA_LAUNCH_H
#define TRAINC_OPS_CUDA_LAUNCH_H

#include <stddef.h>

#define ELEMENTWISE_THREADS 256
/* Enough blocks to fill an H100 many times over; grid-stride loops cover the rest. */
#define ELEMENTWISE_MAX_BLOCKS 8192

static inline unsigned elementwise_blocks(size_t n) {
    size_t blocks = (n + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS;
    return (unsigned)(blocks < ELEMENTWISE_MAX_BLOCKS ? blocks : ELEMENTWISE_MAX_BLOCKS);
}

#endif
