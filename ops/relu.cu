#include "ops/relu.h"

#include "ops/cuda_launch.h"
#include "runtime/check.h"

/* Same expressions as the CPU reference (see relu.c), so the results are identical. */
static __global__ void relu_forward_kernel(const float *x, float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = v < 0.0f ? 0.0f : v;
    }
}

static __global__ void relu_backward_kernel(const float *y, const float *dy, float *dx,
                                            size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void relu_forward_cuda(const float *x, float *y, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    relu_forward_kernel<<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(x, y, n);
    CUDA_CHECK_LAUNCH();
}

void relu_backward_cuda(const float *y, const float *dy, float *dx, size_t n,
                        cudaStream_t stream) {
    if (n == 0) return;
    relu_backward_kernel<<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(y, dy, dx, n);
    CUDA_CHECK_LAUNCH();
}
