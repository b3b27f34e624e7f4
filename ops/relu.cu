#include "ops/relu.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

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

/* 16 bytes a thread where the buffers allow: the half types are memory-bound
 * at two bytes an element otherwise. */
template <typename T>
static __global__ void relu_forward_vector_kernel(const T *x, T *y, size_t vectors) {
    constexpr int width = 16 / sizeof(T);
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < vectors;
         v += (size_t)gridDim.x * blockDim.x) {
        alignas(16) T vals[width];
        *reinterpret_cast<uint4 *>(vals) = reinterpret_cast<const uint4 *>(x)[v];
#pragma unroll
        for (int j = 0; j < width; j++) {
            float f = to_float(vals[j]);
            vals[j] = from_float<T>(f < 0.0f ? 0.0f : f);
        }
        reinterpret_cast<uint4 *>(y)[v] = *reinterpret_cast<const uint4 *>(vals);
    }
}

template <typename T>
static __global__ void relu_backward_vector_kernel(const T *y, const T *dy, T *dx, size_t vectors) {
    constexpr int width = 16 / sizeof(T);
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < vectors;
         v += (size_t)gridDim.x * blockDim.x) {
        alignas(16) T ys[width], gs[width];
        *reinterpret_cast<uint4 *>(ys) = reinterpret_cast<const uint4 *>(y)[v];
        *reinterpret_cast<uint4 *>(gs) = reinterpret_cast<const uint4 *>(dy)[v];
#pragma unroll
        for (int j = 0; j < width; j++) gs[j] = from_float<T>(to_float(ys[j]) > 0.0f ? to_float(gs[j]) : 0.0f);
        reinterpret_cast<uint4 *>(dx)[v] = *reinterpret_cast<const uint4 *>(gs);
    }
}

static int vectorizable(size_t n, size_t elem, const void *a, const void *b, const void *c) {
    return n % (16 / elem) == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 16 == 0;
}

template <typename T>
static void launch_relu_forward(const void *x, void *y, size_t n, cudaStream_t stream) {
    if (vectorizable(n, sizeof(T), x, y, y)) {
        size_t vectors = n / (16 / sizeof(T));
        relu_forward_vector_kernel<T><<<elementwise_blocks(vectors), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (T *)y, vectors);
    } else {
        relu_forward_kernel<T><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (T *)y, n);
    }
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_relu_backward(const void *y, const void *dy, void *dx, size_t n,
                                 cudaStream_t stream) {
    if (vectorizable(n, sizeof(T), y, dy, dx)) {
        size_t vectors = n / (16 / sizeof(T));
        relu_backward_vector_kernel<T><<<elementwise_blocks(vectors), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)y, (const T *)dy, (T *)dx, vectors);
    } else {
        relu_backward_kernel<T><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)y, (const T *)dy, (T *)dx, n);
    }
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
