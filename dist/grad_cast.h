/* The element cast of the gradient buckets (dist/ only): n elements of f32,
 * f16 or bf16 into another of the three, rounded to nearest even, on 'stream'.
 * dist/ keeps its own tiny kernel rather than depend on ops/. */
#ifndef TRAINC_DIST_GRAD_CAST_H
#define TRAINC_DIST_GRAD_CAST_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "runtime/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

void grad_cast_cuda(DType from, const void *src, DType to, void *dst, size_t n,
                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
