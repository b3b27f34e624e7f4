#include "dist/grad_cast.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/check.h"

static __device__ __forceinline__ float load_float(float v) { return v; }
static __device__ __forceinline__ float load_float(__half v) { return __half2float(v); }
static __device__ __forceinline__ float load_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T store_float(float v);
template <> __device__ __forceinline__ float store_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half store_float<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 store_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

template <typename From, typename To>
static __global__ void grad_cast_kernel(const From *src, To *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = store_float<To>(load_float(src[i]));
}

template <typename From, typename To>
static void launch_cast(const void *src, void *dst, size_t n, cudaStream_t stream) {
    const unsigned threads = 256;
    size_t blocks = (n + threads - 1) / threads;
    if (blocks > 4096) blocks = 4096; /* the grid-stride loop covers the rest */
    grad_cast_kernel<From, To><<<(unsigned)blocks, threads, 0, stream>>>((const From *)src,
                                                                         (To *)dst, n);
    CUDA_CHECK_LAUNCH();
}

template <typename From>
static void launch_cast_to(DType to, const void *src, void *dst, size_t n, cudaStream_t stream) {
    switch (to) {
    case DTYPE_F32: launch_cast<From, float>(src, dst, n, stream); break;
    case DTYPE_F16: launch_cast<From, __half>(src, dst, n, stream); break;
    case DTYPE_BF16: launch_cast<From, __nv_bfloat16>(src, dst, n, stream); break;
    default: TC_FATAL("grad cast: dtype %s is not f32, f16 or bf16", dtype_name(to));
    }
}

void grad_cast_cuda(DType from, const void *src, DType to, void *dst, size_t n,
                    cudaStream_t stream) {
    if (n == 0) return;
    switch (from) {
    case DTYPE_F32: launch_cast_to<float>(to, src, dst, n, stream); break;
    case DTYPE_F16: launch_cast_to<__half>(to, src, dst, n, stream); break;
    case DTYPE_BF16: launch_cast_to<__nv_bfloat16>(to, src, dst, n, stream); break;
    default: TC_FATAL("grad cast: dtype %s is not f32, f16 or bf16", dtype_name(from));
    }
}
