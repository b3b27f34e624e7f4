/* A convolution's bias and the ReLU after it in one pass over its output, in
 * place: y = max(y + b[channel], 0). The backward needs no op of its own: ReLU
 * backward on the output, then the bias gradient (conv2d_bias_grad_cuda).
 * y is [n][c][plane] (NCHW) or, with nhwc, [n][plane][c]. */
#ifndef TRAINC_OPS_BIAS_RELU_H
#define TRAINC_OPS_BIAS_RELU_H

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): ctx->dtype and ctx->nhwc on ctx's device. */
void bias_relu_forward(const OpContext *ctx, const void *b, void *y, int n, int c, int plane);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void bias_relu_forward_cpu(const float *b, float *y, int n, int c, int plane, int nhwc);
void bias_relu_forward_cuda(DType dtype, int nhwc, const void *b, void *y, int n, int c, int plane,
                            cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
