#include "ops/add.h"

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

template <typename T, int N>
struct alignas(sizeof(T) * N) AddPack {
    T v[N];
};

/* y = a + b (relu'd when RELU), VEC elements a thread per step. Every element
 * is read before it is written by the same thread, so y may alias a or b. */
template <typename T, int VEC, bool RELU>
static __global__ void add_kernel(const T *a, const T *b, T *y, size_t vectors) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < vectors;
         i += (size_t)gridDim.x * blockDim.x) {
        AddPack<T, VEC> pa = reinterpret_cast<const AddPack<T, VEC> *>(a)[i];
        AddPack<T, VEC> pb = reinterpret_cast<const AddPack<T, VEC> *>(b)[i];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float s = to_float(pa.v[e]) + to_float(pb.v[e]);
            if (RELU) s = s < 0.0f ? 0.0f : s;
            pa.v[e] = from_float<T>(s);
        }
        reinterpret_cast<AddPack<T, VEC> *>(y)[i] = pa;
    }
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* The vector part covers the first n - n % VEC elements, a scalar launch the rest. */
template <typename T, bool RELU>
static void launch_add(const void *a, const void *b, void *y, size_t n, cudaStream_t stream) {
    constexpr int VEC = 16 / sizeof(T);
    size_t head = 0;
    if (aligned16(a) && aligned16(b) && aligned16(y) && n >= VEC) {
        size_t vectors = n / VEC;
        add_kernel<T, VEC, RELU><<<elementwise_blocks(vectors), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)a, (const T *)b, (T *)y, vectors);
        CUDA_CHECK_LAUNCH();
        head = vectors * VEC;
    }
    if (head < n) {
        add_kernel<T, 1, RELU><<<elementwise_blocks(n - head), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)a + head, (const T *)b + head, (T *)y + head, n - head);
        CUDA_CHECK_LAUNCH();
    }
}

template <typename T>
static void launch_add_plain(const void *a, const void *b, void *y, size_t n, cudaStream_t s) {
    launch_add<T, false>(a, b, y, n, s);
}

template <typename T>
static void launch_add_relu(const void *a, const void *b, void *y, size_t n, cudaStream_t s) {
    launch_add<T, true>(a, b, y, n, s);
}

void add_forward_cuda(DType dtype, const void *a, const void *b, void *y, size_t n,
                      cudaStream_t stream) {
    check_float_dtype("add", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_add_plain, a, b, y, n, stream);
}

void add_relu_forward_cuda(DType dtype, const void *a, const void *b, void *y, size_t n,
                           cudaStream_t stream) {
    check_float_dtype("add_relu", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_add_relu, a, b, y, n, stream);
}

/* dst += src is dst = dst + src, src's rounding included: the same kernel. */
void add_accumulate_cuda(DType dtype, void *dst, const void *src, size_t n, cudaStream_t stream) {
    check_float_dtype("add_accumulate", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_add_plain, dst, src, dst, n, stream);
}
