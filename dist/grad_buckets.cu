#include "dist/grad_cast.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

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

/* 16-byte vectors in the body, single elements in the unaligned head and the
 * tail; flag (or NULL) is set when an average is inf or NaN. */
template <typename T>
static __global__ void average_pair_kernel(T *dst, const T *other, size_t head, size_t vectors, size_t n,
                                           int32_t *flag) {
    const size_t per = 16 / sizeof(T), stride = (size_t)gridDim.x * blockDim.x;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    bool bad = false;
    for (size_t v = tid; v < vectors; v += stride) {
        uint4 a = ((const uint4 *)(dst + head))[v], b = ((const uint4 *)(other + head))[v];
        const T *ta = (const T *)&a, *tb = (const T *)&b;
        uint4 out;
        T *to = (T *)&out;
#pragma unroll
        for (size_t k = 0; k < per; k++) {
            float mean = 0.5f * (load_float(ta[k]) + load_float(tb[k]));
            bad |= !isfinite(mean);
            to[k] = store_float<T>(mean);
        }
        ((uint4 *)(dst + head))[v] = out;
    }
    size_t body_end = head + vectors * per;
    for (size_t i = tid; i < head + (n - body_end); i += stride) {
        size_t at = i < head ? i : body_end + (i - head);
        float mean = 0.5f * (load_float(dst[at]) + load_float(other[at]));
        bad |= !isfinite(mean);
        dst[at] = store_float<T>(mean);
    }
    if (flag && __any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(flag, 1);
}

/* A few blocks, running beside backward's kernels rather than in front of
 * them; the grid-stride loops cover the rest. */
static unsigned side_blocks(size_t items) {
    const unsigned threads = 256;
    size_t blocks = (items + threads - 1) / threads;
    if (blocks > 264) blocks = 264;
    return blocks == 0 ? 1 : (unsigned)blocks;
}

template <typename T>
static void launch_average_pair(void *dst, const void *other, size_t n, int32_t *flag, cudaStream_t stream) {
    const size_t per = 16 / sizeof(T);
    size_t misaligned = ((uintptr_t)dst % 16) / sizeof(T);
    size_t head = misaligned ? per - misaligned : 0;
    if (head > n) head = n;
    size_t vectors = (n - head) / per;
    average_pair_kernel<T><<<side_blocks(vectors + (n - vectors * per)), 256, 0, stream>>>(
        (T *)dst, (const T *)other, head, vectors, n, flag);
    CUDA_CHECK_LAUNCH();
}

void grad_average_pair_cuda(DType t, void *dst, const void *other, size_t n, int32_t *flag, cudaStream_t stream) {
    if (n == 0) return;
    if ((uintptr_t)dst % 16 != (uintptr_t)other % 16)
        TC_FATAL("grad average: the two buffers are not equally aligned (%p, %p)", dst, other);
    switch (t) {
    case DTYPE_F32: launch_average_pair<float>(dst, other, n, flag, stream); break;
    case DTYPE_F16: launch_average_pair<__half>(dst, other, n, flag, stream); break;
    case DTYPE_BF16: launch_average_pair<__nv_bfloat16>(dst, other, n, flag, stream); break;
    default: TC_FATAL("grad average: dtype %s is not f32, f16 or bf16", dtype_name(t));
    }
}

template <typename T>
static __global__ void flag_nonfinite_kernel(const T *x, size_t n, int32_t *flag) {
    bool bad = false;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(load_float(x[i]));
    if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(flag, 1);
}

template <typename T>
static void launch_flag_nonfinite(const void *x, size_t n, int32_t *flag, cudaStream_t stream) {
    flag_nonfinite_kernel<T><<<side_blocks(n), 256, 0, stream>>>((const T *)x, n, flag);
    CUDA_CHECK_LAUNCH();
}

void grad_flag_nonfinite_cuda(DType t, const void *x, size_t n, int32_t *flag, cudaStream_t stream) {
    if (n == 0) return;
    switch (t) {
    case DTYPE_F32: launch_flag_nonfinite<float>(x, n, flag, stream); break;
    case DTYPE_F16: launch_flag_nonfinite<__half>(x, n, flag, stream); break;
    case DTYPE_BF16: launch_flag_nonfinite<__nv_bfloat16>(x, n, flag, stream); break;
    default: TC_FATAL("grad check: dtype %s is not f32, f16 or bf16", dtype_name(t));
    }
}
