/* Fully connected layer, row-major: x [n][in], w [out][in], b [out], y [n][out].
 * y = x w^T + b; b NULL: no bias (and db NULL in backward). Backward: dx = dy w is overwritten (skipped when NULL);
 * dw += dy^T x and db += sum_n dy are ADDED to (see conv2d.h).
 * The CPU path is float32. The CUDA path stores x, w, b, y, dy, dx, dw and db as
 * dtype (f32, f16 or bf16); products and sums accumulate in fp32, and an
 * accumulated dw or db is read, added to in fp32 and rounded once. */
#ifndef TRAINC_OPS_LINEAR_H
#define TRAINC_OPS_LINEAR_H

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct { int n, in, out; } LinearShape;

/* The face (op_context.h): ctx->dtype on ctx's device (cuBLAS: ctx->cublas). */
void linear_forward(const OpContext *ctx, const LinearShape *s, const void *x, const void *w, const void *b,
                    void *y);
void linear_backward(const OpContext *ctx, const LinearShape *s, const void *x, const void *w, const void *dy,
                     void *dx, void *dw, void *db);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void linear_forward_cpu(const LinearShape *s, const float *x, const float *w, const float *b,
                        float *y);
void linear_backward_cpu(const LinearShape *s, const float *x, const float *w, const float *dy,
                         float *dx, float *dw, float *db);
/* cuBLAS on the handle's stream; the bias kernels run on 'stream' (the same one). */
void linear_forward_cuda(cublasHandle_t h, cudaStream_t stream, const LinearShape *s,
                         DType dtype, const void *x, const void *w, const void *b, void *y);
void linear_backward_cuda(cublasHandle_t h, cudaStream_t stream, const LinearShape *s,
                          DType dtype, const void *x, const void *w, const void *dy, void *dx,
                          void *dw, void *db);

#ifdef __cplusplus
}
#endif
#endif
