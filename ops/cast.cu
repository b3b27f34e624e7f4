#include "ops/cast.h"

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

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

/* One thread per pixel: it reads its c values from the c planes (neighbouring
 * threads read neighbouring floats) and writes c_padded contiguous ones (a warp
 * writes one contiguous run). */
template <typename T>
static __global__ void cast_nchw_to_nhwc_kernel(const float *src, T *dst, size_t pixels,
                                                size_t plane, int c, int c_padded) {
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pixels;
         p += (size_t)gridDim.x * blockDim.x) {
        const float *in = src + (p / plane) * c * plane + p % plane;
        T *out = dst + p * c_padded;
        for (int ch = 0; ch < c; ch++) out[ch] = from_float<T>(in[ch * plane]);
        for (int ch = c; ch < c_padded; ch++) out[ch] = from_float<T>(0.0f);
    }
}

/* The same where a pixel's padded channels are 16 bytes (an image's 3 channels
 * padded to 8 halves): one 16-byte store a pixel, not c_padded 2-byte ones. */
template <typename T>
static __global__ void cast_nchw_to_nhwc16_kernel(const float *src, uint4 *dst, size_t pixels, size_t plane, int c) {
    constexpr int width = 16 / sizeof(T);
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pixels;
         p += (size_t)gridDim.x * blockDim.x) {
        const float *in = src + (p / plane) * c * plane + p % plane;
        alignas(16) T out[width];
#pragma unroll
        for (int ch = 0; ch < width; ch++) out[ch] = from_float<T>(ch < c ? in[ch * plane] : 0.0f);
        dst[p] = *reinterpret_cast<const uint4 *>(out);
    }
}

template <typename T>
static void launch_cast_nchw_to_nhwc(const float *src, void *dst, size_t pixels, size_t plane,
                                     int c, int c_padded, cudaStream_t stream) {
    if (c_padded * sizeof(T) == 16 && (uintptr_t)dst % 16 == 0)
        cast_nchw_to_nhwc16_kernel<T><<<elementwise_blocks(pixels), ELEMENTWISE_THREADS, 0, stream>>>(
            src, (uint4 *)dst, pixels, plane, c);
    else
        cast_nchw_to_nhwc_kernel<T><<<elementwise_blocks(pixels), ELEMENTWISE_THREADS, 0, stream>>>(
            src, (T *)dst, pixels, plane, c, c_padded);
    CUDA_CHECK_LAUNCH();
}

void cast_nchw_to_nhwc_cuda(DType dst_dtype, const float *src_nchw, void *dst_nhwc, int n, int c,
                            int h, int w, int c_padded, cudaStream_t stream) {
    check_float_dtype("cast", dst_dtype);
    if (n < 0 || c <= 0 || h < 0 || w < 0 || c_padded < c)
        TC_FATAL("cast nchw -> nhwc: bad shape n=%d c=%d h=%d w=%d c_padded=%d", n, c, h, w,
                 c_padded);
    size_t plane = (size_t)h * w, pixels = (size_t)n * plane;
    if (pixels == 0) return;
    DISPATCH_FLOAT_DTYPE(dst_dtype, launch_cast_nchw_to_nhwc, src_nchw, dst_nhwc, pixels, plane, c,
                         c_padded, stream);
}
