/* GELU, elementwise, the exact (erf) form of PyTorch's nn.GELU():
 *   y  = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
 *   dx = dy * (Phi(x) + x phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 * Backward reads the forward INPUT x (not y: GELU is not monotonic, so y does
 * not give x back), so x must still hold it then. dx may alias dy. NaN passes
 * through. The CPU reference is float32 and computes in double; the CUDA path
 * stores x, y, dy and dx as dtype (f32, f16 or bf16) and computes in float. */
#ifndef TRAINC_OPS_GELU_H
#define TRAINC_OPS_GELU_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): x, y, dy and dx of ctx->dtype on ctx's device. */
void gelu_forward(const OpContext *ctx, const void *x, void *y, size_t n);
void gelu_backward(const OpContext *ctx, const void *x, const void *dy, void *dx, size_t n);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void gelu_forward_cpu(const float *x, float *y, size_t n);
void gelu_backward_cpu(const float *x, const float *dy, float *dx, size_t n);
void gelu_forward_cuda(DType dtype, const void *x, void *y, size_t n, cudaStream_t stream);
void gelu_backward_cuda(DType dtype, const void *x, const void *dy, void *dx, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
