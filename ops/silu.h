/* SiLU (swish), elementwise, PyTorch's nn.SiLU():
 *   y  = x * sigmoid(x),  sigmoid(x) = 1 / (1 + exp(-x))
 *   dx = dy * sigmoid(x) * (1 + x * (1 - sigmoid(x)))
 * Backward reads the forward INPUT x (SiLU is not monotonic: y does not give
 * x back), so x must still hold it then. dx may alias dy. NaN passes through.
 * The CPU reference is float32 and computes in double; the CUDA path stores
 * x, y, dy and dx as dtype (f32, f16 or bf16) and computes in float. */
#ifndef TRAINC_OPS_SILU_H
#define TRAINC_OPS_SILU_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): x, y, dy and dx of ctx->dtype on ctx's device. */
void silu_forward(const OpContext *ctx, const void *x, void *y, size_t n);
void silu_backward(const OpContext *ctx, const void *x, const void *dy, void *dx, size_t n);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void silu_forward_cpu(const float *x, float *y, size_t n);
void silu_backward_cpu(const float *x, const float *dy, float *dx, size_t n);
void silu_forward_cuda(DType dtype, const void *x, void *y, size_t n, cudaStream_t stream);
void silu_backward_cuda(DType dtype, const void *x, const void *dy, void *dx, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
