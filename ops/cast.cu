#include "ops/cast.h"

#include "ops/cuda_launch.h"
#include "ops/dtype_cuda.cuh"
#include "runtime/check.h"

template <typename From, typename To>
static __global__ void cast_kernel(const From *src, To *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_float<To>(to_float(src[i]));
}

template <typename T>
static void launch_cast_from_f32(const float *src, void *dst, size_t n, cudaStream_t stream) {
    cast_kernel<float, T><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(src, (T *)dst,
                                                                                     n);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_cast_to_f32(const void *src, float *dst, size_t n, cudaStream_t stream) {
    cast_kernel<T, float><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
        (const T *)src, dst, n);
    CUDA_CHECK_LAUNCH();
}

void cast_from_f32_cuda(DType dst_dtype, const float *src, void *dst, size_t n,
                        cudaStream_t stream) {
    check_float_dtype("cast", dst_dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dst_dtype, launch_cast_from_f32, src, dst, n, stream);
}

void cast_to_f32_cuda(DType src_dtype, const void *src, float *dst, size_t n,
                      cudaStream_t stream) {
    check_float_dtype("cast", src_dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(src_dtype, launch_cast_to_f32, src, dst, n, stream);
}
