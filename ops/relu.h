/* ReLU, elementwise. Backward uses the forward OUTPUT y (y > 0 where x > 0),
 * so x need not be kept; dx may alias dy. The CUDA path stores x, y, dy and dx
 * as dtype (f32, f16 or bf16) and computes in float: a selection, so it is
 * exact in every type. */
#ifndef TRAINC_OPS_RELU_H
#define TRAINC_OPS_RELU_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): x, y, dy and dx of ctx->dtype on ctx's device. */
void relu_forward(const OpContext *ctx, const void *x, void *y, size_t n);
void relu_backward(const OpContext *ctx, const void *y, const void *dy, void *dx, size_t n);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void relu_forward_cpu(const float *x, float *y, size_t n);
void relu_backward_cpu(const float *y, const float *dy, float *dx, size_t n);
void relu_forward_cuda(DType dtype, const void *x, void *y, size_t n, cudaStream_t stream);
void relu_backward_cuda(DType dtype, const void *y, const void *dy, void *dx, size_t n,
                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
