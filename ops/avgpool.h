/* Average pooling.
 *
 * Global: x [n][c][plane] (plane = h*w; with nhwc, [n][plane][c]) -> y [n][c].
 *   forward:  y[n][c] = (sum over the plane of x[n][c]) / plane, summed in fp32
 *             (double on the CPU) in a fixed order
 *   backward: dx[n][c][p] = dy[n][c] / plane at every position p (the division
 *             in float on both paths), overwriting dx (accumulate_dx = 0) or
 *             added to it (1)
 * The CPU path is float32 NCHW. The CUDA path stores x, y, dy and dx as dtype
 * (f32, f16 or bf16) and computes in fp32; y and dy are [n][c] in both layouts.
 *
 * Windowed (avgpool2d): k x k windows at a stride over x padded with zeros
 * (Pool2dShape, ops/maxpool.h), PyTorch's nn.AvgPool2d(k, stride, pad) with
 * count_include_pad=True and ceil_mode=False: the padding counts in each
 * window's k*k, and an odd size leaves out its last row or column.
 *   forward:  y = (sum of the window's elements inside the map) / (k*k)
 *   backward: dx = (sum of dy over the outputs whose window holds the element)
 *             / (k*k), overwriting dx (accumulate_dx = 0) or added to it (1)
 * each sum in fp32 (double on the CPU) in row-major order, rounded once. The
 * CPU path is float32 NCHW; the CUDA path NCHW and NHWC (ctx->nhwc), dtype
 * as above. */
#ifndef TRAINC_OPS_AVGPOOL_H
#define TRAINC_OPS_AVGPOOL_H

#include <stddef.h>

#include "ops/maxpool.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): ctx->dtype and ctx->nhwc on ctx's device. */
void avgpool_forward(const OpContext *ctx, const void *x, void *y, int n, int c, int plane);
void avgpool_backward(const OpContext *ctx, const void *dy, void *dx, int accumulate_dx, int n, int c, int plane);
void avgpool2d_forward(const OpContext *ctx, const Pool2dShape *s, const void *x, void *y);
void avgpool2d_backward(const OpContext *ctx, const Pool2dShape *s, const void *dy, void *dx, int accumulate_dx);
/* Fails naming the layer's problem: a window wider than the padded map, padding over half the window. */
void avgpool2d_check(const Pool2dShape *s);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void avgpool_forward_cpu(const float *x, float *y, int n, int c, int plane);
void avgpool_backward_cpu(const float *dy, float *dx, int accumulate_dx, int n, int c, int plane);
void avgpool2d_forward_cpu(const Pool2dShape *s, const float *x, float *y);
void avgpool2d_backward_cpu(const Pool2dShape *s, const float *dy, float *dx, int accumulate_dx);

void avgpool_forward_cuda(DType dtype, int nhwc, const void *x, void *y, int n, int c, int plane,
                          cudaStream_t stream);
void avgpool_backward_cuda(DType dtype, int nhwc, const void *dy, void *dx, int accumulate_dx, int n,
                           int c, int plane, cudaStream_t stream);
void avgpool2d_forward_cuda(DType dtype, int nhwc, const Pool2dShape *s, const void *x, void *y, cudaStream_t stream);
void avgpool2d_backward_cuda(DType dtype, int nhwc, const Pool2dShape *s, const void *dy, void *dx, int accumulate_dx,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
