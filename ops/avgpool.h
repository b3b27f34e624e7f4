/* Global average pooling: x [n][c][plane] (plane = h*w; with nhwc, [n][plane][c]) -> y [n][c].
 *   forward:  y[n][c] = (sum over the plane of x[n][c]) / plane, summed in fp32
 *             (double on the CPU) in a fixed order
 *   backward: dx[n][c][p] = dy[n][c] / plane at every position p (the division
 *             in float on both paths), overwriting dx (accumulate_dx = 0) or
 *             added to it (1)
 * The CPU path is float32 NCHW. The CUDA path stores x, y, dy and dx as dtype
 * (f32, f16 or bf16) and computes in fp32; y and dy are [n][c] in both layouts. */
#ifndef TRAINC_OPS_AVGPOOL_H
#define TRAINC_OPS_AVGPOOL_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): ctx->dtype and ctx->nhwc on ctx's device. */
void avgpool_forward(const OpContext *ctx, const void *x, void *y, int n, int c, int plane);
void avgpool_backward(const OpContext *ctx, const void *dy, void *dx, int accumulate_dx, int n, int c, int plane);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void avgpool_forward_cpu(const float *x, float *y, int n, int c, int plane);
void avgpool_backward_cpu(const float *dy, float *dx, int accumulate_dx, int n, int c, int plane);

void avgpool_forward_cuda(DType dtype, int nhwc, const void *x, void *y, int n, int c, int plane,
                          cudaStream_t stream);
void avgpool_backward_cuda(DType dtype, int nhwc, const void *dy, void *dx, int accumulate_dx, int n,
                           int c, int plane, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
