/* The tail of a conv block in one pass: a convolution's raw output x (no bias
 * added), its bias, ReLU and a 2x2 stride-2 max-pool,
 *
 *     y = maxpool2x2(relu(x + b[channel]))
 *
 * reading x once and writing only y (a quarter of x). x is left as it is:
 * backward finds each window's maximum again from x and b, so nothing else is
 * stored. Backward writes dx, the gradient wrt x (the convolution's output):
 * dy at the first maximum of each window of relu(x + b) where that maximum is
 * positive, 0 elsewhere; what bias + ReLU, max-pool, then their backwards
 * give one op at a time. dx may be x itself: each window is read whole before
 * it is written.
 *
 * x, dx: [n][c][h][w] (NCHW) or [n][h][w][c] (nhwc), h and w even; y, dy the
 * same with h/2, w/2. The CPU path is float32; the CUDA path keeps x, b, y, dy
 * and dx in the dtype given (f32, f16 or bf16), adds in fp32 and rounds each
 * x + b to the dtype before comparing, as the unfused ops store it. */
#ifndef TRAINC_OPS_BIAS_RELU_POOL_H
#define TRAINC_OPS_BIAS_RELU_POOL_H

#include "ops/maxpool.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): ctx->dtype and ctx->nhwc on ctx's device. */
void bias_relu_pool_forward(const OpContext *ctx, const Pool2dShape *s, const void *x, const void *b, void *y);
void bias_relu_pool_backward(const OpContext *ctx, const Pool2dShape *s, const void *x, const void *b,
                             const void *dy, void *dx);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* s is x's shape; its window must be the plain 2x2 stride 2, pad 0 over an
 * even size: fails naming the shape otherwise (every call checks). */
void bias_relu_pool_check_shape(const Pool2dShape *s);
void bias_relu_pool_forward_cpu(const Pool2dShape *s, int nhwc, const float *x, const float *b, float *y);
void bias_relu_pool_backward_cpu(const Pool2dShape *s, int nhwc, const float *x, const float *b,
                                 const float *dy, float *dx);
void bias_relu_pool_forward_cuda(DType dtype, const Pool2dShape *s, int nhwc, const void *x, const void *b,
                                 void *y, cudaStream_t stream);
void bias_relu_pool_backward_cuda(DType dtype, const Pool2dShape *s, int nhwc, const void *x, const void *b,
                                  const void *dy, void *dx, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
