/* Elementwise sums for residual connections.
 *   add_forward:      y = a + b            (y may alias a or b)
 *   add_relu_forward: y = relu(a + b)      (ResNet's basic block: shortcut add, then ReLU;
 *                                           its backward is relu_backward on y, see relu.h)
 *   add_accumulate:   dst += src           (sums the gradients of a tensor that feeds two layers)
 * The CPU path is float32. The CUDA path stores every buffer as dtype (f32, f16
 * or bf16), adds in fp32 and rounds once; 16 bytes a thread where the pointers
 * are 16-byte aligned. The ReLU passes NaN through, as relu.h's does. */
#ifndef TRAINC_OPS_ADD_H
#define TRAINC_OPS_ADD_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): every buffer of ctx->dtype on ctx's device. */
void add_forward(const OpContext *ctx, const void *a, const void *b, void *y, size_t n);
void add_relu_forward(const OpContext *ctx, const void *a, const void *b, void *y, size_t n);
void add_accumulate(const OpContext *ctx, void *dst, const void *src, size_t n);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void add_forward_cpu(const float *a, const float *b, float *y, size_t n);
void add_relu_forward_cpu(const float *a, const float *b, float *y, size_t n);
void add_accumulate_cpu(float *dst, const float *src, size_t n);

void add_forward_cuda(DType dtype, const void *a, const void *b, void *y, size_t n,
                      cudaStream_t stream);
void add_relu_forward_cuda(DType dtype, const void *a, const void *b, void *y, size_t n,
                           cudaStream_t stream);
void add_accumulate_cuda(DType dtype, void *dst, const void *src, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
