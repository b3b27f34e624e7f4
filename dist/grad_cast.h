/* The element kernels of the gradient buckets (dist/ only), on 'stream'.
 * dist/ keeps its own tiny kernels rather than depend on ops/. */
#ifndef TRAINC_DIST_GRAD_CAST_H
#define TRAINC_DIST_GRAD_CAST_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "runtime/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* n elements of f32, f16 or bf16 into another of the three, rounded to
 * nearest even. */
void grad_cast_cuda(DType from, const void *src, DType to, void *dst, size_t n,
                    cudaStream_t stream);
/* dst[i] = (dst[i] + other[i]) / 2, in float, rounded once to t: two ranks'
 * gradients averaged (the copy-engine path). dst and other must lie at the same
 * offset from 16-byte alignment. */
void grad_average_pair_cuda(DType t, void *dst, const void *other, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
