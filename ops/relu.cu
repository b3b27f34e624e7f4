#include "ops/relu.h"

#include "ops/cuda_launch.h"
#include "ops/dtype_cuda.cuh"
#include "runtime/check.h"

/* Same expressions as the CPU reference (see relu.c), so the results are identical. */
template <typename T>
static __global__ void relu_forward_kernel(const T *x, T *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = to_float(x[i]);
        y[i] = from_float<T>(v < 0.0f ? 0.0f : v);
    }
}

template <typename T>
static __global__ void relu_backward_kernel(const T *y, const T *dy, T *dx, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] = from_float<T>(to_float(y[i]) > 0.0f ? to_float(dy[i]) : 0.0f);
}

template <typename T>
static void launch_relu_forward(const void *x, void *y, size_t n, cudaStream_t stream) {
    relu_forward_kernel<T><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
        (const T *)x, (T *)y, n);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_relu_backward(const void *y, const void *dy, void *dx, size_t n,
                                 cudaStream_t stream) {
    relu_backward_kernel<T><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
        (const T *)y, (const T *)dy, (T *)dx, n);
    CUDA_CHECK_LAUNCH();
}

void relu_forward_cuda(DType dtype, const void *x, void *y, size_t n, cudaStream_t stream) {
    check_float_dtype("relu", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_relu_forward, x, y, n, stream);
}

void relu_backward_cuda(DType dtype, const void *y, const void *dy, void *dx, size_t n,
                        cudaStream_t stream) {
    check_float_dtype("relu", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_relu_backward, y, dy, dx, n, stream);
}
