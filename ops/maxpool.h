/* Max-pool 2x2, stride 2 (h and w even), NCHW; the CUDA path also NHWC. Backward routes each output
 * gradient to the first maximum of its window (the one cuDNN picks); dx is
 * overwritten. The CPU path is float32; the CUDA path stores x, y, dy and dx
 * as the dtype given at init (f32, f16 or bf16), which is exact: a selection. */
#ifndef TRAINC_OPS_MAXPOOL_H
#define TRAINC_OPS_MAXPOOL_H

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "runtime/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct { int n, c, h, w; } Pool2dShape; /* input; output is h/2 x w/2 */

void maxpool2x2_forward_cpu(const Pool2dShape *s, const float *x, float *y);
void maxpool2x2_backward_cpu(const Pool2dShape *s, const float *x, const float *y,
                             const float *dy, float *dx);

typedef struct {
    Pool2dShape shape;
    DType dtype;
    int nhwc; /* x, y and their gradients are [n][h][w][c] */
    cudnnPoolingDescriptor_t pool_desc;
    cudnnTensorDescriptor_t x_desc, y_desc;
} MaxPoolCuda;

void maxpool2x2_cuda_init(MaxPoolCuda *p, const Pool2dShape *s, DType dtype, int nhwc);
void maxpool2x2_cuda_destroy(MaxPoolCuda *p);

/* The backward of ReLU then 2x2 max-pool in one pass, NCHW: x is the ReLU's
 * output (the pool's input); dx gets dy at the first maximum of each window
 * where that maximum is positive, 0 elsewhere: what maxpool backward followed
 * by ReLU backward give, without writing and re-reading dx in between. */
void maxpool2x2_relu_backward_cpu(const Pool2dShape *s, const float *x, const float *dy, float *dx);
void maxpool2x2_relu_backward_cuda(DType dtype, const Pool2dShape *s, const void *x, const void *dy,
                                   void *dx, cudaStream_t stream);
void maxpool2x2_forward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x, void *y);
void maxpool2x2_backward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x,
                              const void *y, const void *dy, void *dx);

#ifdef __cplusplus
}
#endif
#endif
