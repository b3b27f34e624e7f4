#include "ops/bias_relu.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* Same arithmetic as the CPU reference: add in fp32, round once. */
template <typename T>
static __device__ __forceinline__ T bias_relu(T y, const T *b, int channel) {
    float v = to_float(y) + to_float(b[channel]);
    return from_float<T>(v < 0.0f ? 0.0f : v);
}

template <typename T>
static __global__ void bias_relu_scalar_kernel(T *y, const T *b, size_t total, int c, int plane, int nhwc) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] = bias_relu(y[i], b, nhwc ? (int)(i % c) : (int)(i / plane % c));
}

/* 16 bytes a thread: a vector's elements share one channel (NCHW, plane a
 * multiple of the width) or hold consecutive channels (NHWC, c a multiple). */
template <typename T>
static __global__ void bias_relu_vector_kernel(T *y, const T *b, size_t vectors, int c, int plane, int nhwc) {
    constexpr int width = 16 / sizeof(T);
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < vectors; v += (size_t)gridDim.x * blockDim.x) {
        size_t first = v * width;
        alignas(16) T vals[width];
        *reinterpret_cast<uint4 *>(vals) = reinterpret_cast<const uint4 *>(y)[v];
        int channel = nhwc ? (int)(first % c) : (int)(first / plane % c);
#pragma unroll
        for (int j = 0; j < width; j++) vals[j] = bias_relu(vals[j], b, nhwc ? channel + j : channel);
        reinterpret_cast<uint4 *>(y)[v] = *reinterpret_cast<const uint4 *>(vals);
    }
}

template <typename T>
static void launch_bias_relu(const void *b, void *y, int n, int c, int plane, int nhwc, cudaStream_t stream) {
    constexpr int width = 16 / sizeof(T);
    size_t total = (size_t)n * c * plane;
    int vectorizable = ((uintptr_t)y % 16 == 0) && (nhwc ? c % width == 0 : plane % width == 0);
    if (vectorizable) {
        size_t vectors = total / width;
        bias_relu_vector_kernel<T><<<elementwise_blocks(vectors), ELEMENTWISE_THREADS, 0, stream>>>(
            (T *)y, (const T *)b, vectors, c, plane, nhwc);
    } else {
        bias_relu_scalar_kernel<T><<<elementwise_blocks(total), ELEMENTWISE_THREADS, 0, stream>>>(
            (T *)y, (const T *)b, total, c, plane, nhwc);
    }
    CUDA_CHECK_LAUNCH();
}

void bias_relu_forward_cuda(DType dtype, int nhwc, const void *b, void *y, int n, int c, int plane,
                            cudaStream_t stream) {
    check_float_dtype("bias_relu", dtype);
    if ((size_t)n * c * plane == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_bias_relu, b, y, n, c, plane, nhwc, stream);
}
