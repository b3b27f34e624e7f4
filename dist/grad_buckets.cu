#include "dist/grad_cast.h"

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* At most this many blocks for the cast: a grid-stride loop covers the rest. */
#define CAST_MAX_BLOCKS 4096
/* A few blocks for the average and the check, running beside backward's
 * kernels rather than in front of them. */
#define SIDE_MAX_BLOCKS 264

template <typename From, typename To>
static __global__ void grad_cast_kernel(const From *src, To *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_float<To>(to_float(src[i]));
}

/* To first, so that DISPATCH_FLOAT_DTYPE can name it; From comes from src. */
template <typename To, typename From>
static void launch_cast(const From *src, void *dst, size_t n, cudaStream_t stream) {
    unsigned blocks = grid_stride_blocks(n, ELEMENTWISE_THREADS, CAST_MAX_BLOCKS);
    grad_cast_kernel<From, To><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(src, (To *)dst, n);
    CUDA_CHECK_LAUNCH();
}

template <typename From>
static void launch_cast_from(const void *src, DType to, void *dst, size_t n, cudaStream_t stream) {
    DISPATCH_FLOAT_DTYPE(to, launch_cast, (const From *)src, dst, n, stream);
}

void grad_cast_cuda(DType from, const void *src, DType to, void *dst, size_t n,
                    cudaStream_t stream) {
    if (n == 0) return;
    check_float_dtype("grad cast", from);
    check_float_dtype("grad cast", to);
    DISPATCH_FLOAT_DTYPE(from, launch_cast_from, src, to, dst, n, stream);
}

/* sum / ranks, rounded once: a multiplication where 1 / ranks is exact (2, 4
 * or 8 ranks), a division elsewhere. */
static __device__ float mean_of(float sum, int ranks, float inverse) {
    return (ranks & (ranks - 1)) == 0 ? sum * inverse : sum / (float)ranks;
}

/* 16-byte vectors in the body, single elements in the unaligned head and the
 * tail. Each average adds dst's value and then the others' in order, in
 * float, and divides by their number once; flag (or NULL) is set when an
 * average is inf or NaN. */
template <typename T>
static __global__ void average_kernel(T *dst, const T *others, size_t stride, int n_others, size_t head,
                                      size_t vectors, size_t n, int32_t *flag) {
    constexpr size_t per = 16 / sizeof(T);
    const size_t grid = (size_t)gridDim.x * blockDim.x;
    const int ranks = n_others + 1;
    const float inverse = 1.0f / (float)ranks;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    bool bad = false;
    for (size_t v = tid; v < vectors; v += grid) {
        /* dst's and the first other's loads in flight together, as with 2 ranks. */
        uint4 a = ((const uint4 *)(dst + head))[v], b = ((const uint4 *)(others + head))[v];
        const T *ta = (const T *)&a, *tb = (const T *)&b;
        float sum[per];
#pragma unroll
        for (size_t k = 0; k < per; k++) sum[k] = to_float(ta[k]) + to_float(tb[k]);
        for (int j = 1; j < n_others; j++) {
            uint4 c = ((const uint4 *)(others + j * stride + head))[v];
            const T *tc = (const T *)&c;
#pragma unroll
            for (size_t k = 0; k < per; k++) sum[k] += to_float(tc[k]);
        }
        uint4 out;
        T *to = (T *)&out;
#pragma unroll
        for (size_t k = 0; k < per; k++) {
            float mean = mean_of(sum[k], ranks, inverse);
            bad |= !isfinite(mean);
            to[k] = from_float<T>(mean);
        }
        ((uint4 *)(dst + head))[v] = out;
    }
    size_t body_end = head + vectors * per;
    for (size_t i = tid; i < head + (n - body_end); i += grid) {
        size_t at = i < head ? i : body_end + (i - head);
        float sum = to_float(dst[at]);
        for (int j = 0; j < n_others; j++) sum += to_float(others[j * stride + at]);
        float mean = mean_of(sum, ranks, inverse);
        bad |= !isfinite(mean);
        dst[at] = from_float<T>(mean);
    }
    if (flag && __any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(flag, 1);
}

static unsigned side_blocks(size_t items) {
    return grid_stride_blocks(items, ELEMENTWISE_THREADS, SIDE_MAX_BLOCKS);
}

template <typename T>
static void launch_average(void *dst, const void *others, size_t stride_bytes, int n_others, size_t n,
                           int32_t *flag, cudaStream_t stream) {
    const size_t per = 16 / sizeof(T);
    size_t misaligned = ((uintptr_t)dst % 16) / sizeof(T);
    size_t head = misaligned ? per - misaligned : 0;
    if (head > n) head = n;
    size_t vectors = (n - head) / per;
    average_kernel<T><<<side_blocks(vectors + (n - vectors * per)), ELEMENTWISE_THREADS, 0, stream>>>(
        (T *)dst, (const T *)others, stride_bytes / sizeof(T), n_others, head, vectors, n, flag);
    CUDA_CHECK_LAUNCH();
}

void grad_average_cuda(DType t, void *dst, const void *others, size_t stride_bytes, int n_others, size_t n,
                       int32_t *flag, cudaStream_t stream) {
    if (n == 0) return;
    if (n_others < 1 || (uintptr_t)dst % 16 != (uintptr_t)others % 16 || (n_others > 1 && stride_bytes % 16 != 0))
        TC_FATAL("grad average: %d other buffers %zu bytes apart, not equally aligned with the first (%p, %p)",
                 n_others, stride_bytes, dst, others);
    check_float_dtype("grad average", t);
    DISPATCH_FLOAT_DTYPE(t, launch_average, dst, others, stride_bytes, n_others, n, flag, stream);
}

template <typename T>
static __global__ void flag_nonfinite_kernel(const T *x, size_t n, int32_t *flag) {
    bool bad = false;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(to_float(x[i]));
    if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(flag, 1);
}

template <typename T>
static void launch_flag_nonfinite(const void *x, size_t n, int32_t *flag, cudaStream_t stream) {
    flag_nonfinite_kernel<T><<<side_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>((const T *)x, n, flag);
    CUDA_CHECK_LAUNCH();
}

void grad_flag_nonfinite_cuda(DType t, const void *x, size_t n, int32_t *flag, cudaStream_t stream) {
    if (n == 0) return;
    check_float_dtype("grad check", t);
    DISPATCH_FLOAT_DTYPE(t, launch_flag_nonfinite, x, n, flag, stream);
}
