/* A constant factor, elementwise: y = s x; its backward is the same map on
 * the gradient, dx = s dy. y may alias x (dx may alias dy). The CPU reference
 * is float32; the CUDA path stores x and y as dtype (f32, f16 or bf16) and
 * multiplies in float, rounding once. */
#ifndef TRAINC_OPS_SCALE_H
#define TRAINC_OPS_SCALE_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): x, y, dy and dx of ctx->dtype on ctx's device. */
void scale_forward(const OpContext *ctx, const void *x, void *y, size_t n, float s);
void scale_backward(const OpContext *ctx, const void *dy, void *dx, size_t n, float s);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void scale_cpu(const float *x, float *y, size_t n, float s);
void scale_cuda(DType dtype, const void *x, void *y, size_t n, float s, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
