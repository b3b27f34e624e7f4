/* Conversion of n elements between float32 and dtype (f32, f16 or bf16):
 * float32 -> f16/bf16 rounds to nearest even (too large goes to inf, NaN stays
 * NaN), f16/bf16 -> float32 is exact; f32 <-> f32 is a copy. Used for the half
 * copy of the fp32 master weights, the input batch and reading results back.
 * The CPU path does on the host, bit for bit, what the CUDA path does on the
 * device (NaN payloads aside). */
#ifndef TRAINC_OPS_CAST_H
#define TRAINC_OPS_CAST_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): float32 to ctx->dtype on ctx's device and back
 * (cast_nchw_to_nhwc as cast_nchw_to_nhwc_cpu below). */
void cast_from_f32(const OpContext *ctx, const float *src, void *dst, size_t n);
void cast_to_f32(const OpContext *ctx, const void *src, float *dst, size_t n);
void cast_nchw_to_nhwc(const OpContext *ctx, const float *src_nchw, void *dst_nhwc, int n, int c, int h, int w,
                       int c_padded);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void cast_from_f32_cpu(DType dst_dtype, const float *src, void *dst, size_t n);
void cast_to_f32_cpu(DType src_dtype, const void *src, float *dst, size_t n);
void cast_from_f32_cuda(DType dst_dtype, const float *src, void *dst, size_t n,
                        cudaStream_t stream);
void cast_to_f32_cuda(DType src_dtype, const void *src, float *dst, size_t n,
                      cudaStream_t stream);

/* A float32 NCHW batch [n][c][h][w] to dst_dtype in NHWC [n][h][w][c_padded],
 * rounded as above; channels c..c_padded-1 are zero. c_padded >= c; padding
 * the 3 channels of an image to 4 or 8 lets cuDNN run the first convolution on
 * tensor cores. */
void cast_nchw_to_nhwc_cpu(DType dst_dtype, const float *src_nchw, void *dst_nhwc, int n, int c,
                           int h, int w, int c_padded);
void cast_nchw_to_nhwc_cuda(DType dst_dtype, const float *src_nchw, void *dst_nhwc, int n, int c,
                            int h, int w, int c_padded, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
