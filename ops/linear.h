/* Fully connected layer, row-major: x [n][in], w [out][in], b [out], y [n][out].
 * y = x w^T + b. Backward: dx = dy w is overwritten (skipped when NULL);
 * dw += dy^T x and db += sum_n dy are ADDED to (see conv2d.h). */
#ifndef TRAINC_OPS_LINEAR_H
#define TRAINC_OPS_LINEAR_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct { int n, in, out; } LinearShape;

void linear_forward_cpu(const LinearShape *s, const float *x, const float *w, const float *b,
                        float *y);
void linear_backward_cpu(const LinearShape *s, const float *x, const float *w, const float *dy,
                         float *dx, float *dw, float *db);
/* cuBLAS on the handle's stream; the bias kernels run on 'stream' (the same one). */
void linear_forward_cuda(cublasHandle_t h, cudaStream_t stream, const LinearShape *s,
                         const float *x, const float *w, const float *b, float *y);
void linear_backward_cuda(cublasHandle_t h, cudaStream_t stream, const LinearShape *s,
                          const float *x, const float *w, const float *dy, float *dx, float *dw,
                          float *db);

#ifdef __cplusplus
}
#endif
#endif
