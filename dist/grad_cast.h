/* The element kernels of the gradient buckets (dist/ only), on 'stream'.
 * dist/ keeps its own tiny kernels rather than depend on ops/. */
#ifndef TRAINC_DIST_GRAD_CAST_H
#define TRAINC_DIST_GRAD_CAST_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/cuda_api.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* n elements of f32, f16 or bf16 into another of the three, rounded to
 * nearest even. */
void grad_cast_cuda(DType from, const void *src, DType to, void *dst, size_t n,
                    cudaStream_t stream);
/* dst[i] = (dst[i] + others_0[i] + ... + others_{n_others-1}[i]) / (n_others + 1),
 * summed in float in that order and rounded once to t: the ranks' gradients
 * averaged (the copy-engine path). The others lie stride_bytes apart from
 * 'others' on, each at the same offset from 16-byte alignment as dst (a
 * multiple of 16 bytes apart). flag (device, or NULL) is set to 1 when an
 * average is inf or NaN, and left alone otherwise. */
void grad_average_cuda(DType t, void *dst, const void *others, size_t stride_bytes, int n_others, size_t n,
                       int32_t *flag, cudaStream_t stream);
/* *flag = 1 when any of x[0 .. n) (of t) is inf or NaN; else left alone. */
void grad_flag_nonfinite_cuda(DType t, const void *x, size_t n, int32_t *flag, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
