#include "ops/silu.h"

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

static __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* out = SiLU(x), or with BACKWARD dy * SiLU'(x), VEC elements a thread per
 * step: 16 bytes where the buffers allow. Each element is read before the
 * same thread writes it, so dx may alias dy. */
template <typename T, int VEC, bool BACKWARD>
static __global__ void silu_kernel(const T *x, const T *dy, T *out, size_t packs) {
    using P = Pack<T, VEC>;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < packs;
         i += (size_t)gridDim.x * blockDim.x) {
        P v = reinterpret_cast<const P *>(x)[i], g = v;
        if (BACKWARD) g = reinterpret_cast<const P *>(dy)[i];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float xf = to_float(v.v[e]), s = sigmoid_f(xf);
            v.v[e] = from_float<T>(BACKWARD ? to_float(g.v[e]) * s * (1.0f + xf * (1.0f - s)) : xf * s);
        }
        reinterpret_cast<P *>(out)[i] = v;
    }
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* 16 bytes a thread when n fills whole packs and every pointer is aligned, else one element. */
template <typename T, bool BACKWARD>
static void launch_silu(const void *x, const void *dy, void *out, size_t n, cudaStream_t stream) {
    constexpr int VEC = 16 / sizeof(T);
    if (n % VEC == 0 && aligned16(x) && aligned16(out) && (!BACKWARD || aligned16(dy)))
        silu_kernel<T, VEC, BACKWARD><<<elementwise_blocks(n / VEC), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (const T *)dy, (T *)out, n / VEC);
    else
        silu_kernel<T, 1, BACKWARD><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (const T *)dy, (T *)out, n);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_silu_forward(const void *x, void *y, size_t n, cudaStream_t stream) {
    launch_silu<T, false>(x, NULL, y, n, stream);
}

template <typename T>
static void launch_silu_backward(const void *x, const void *dy, void *dx, size_t n, cudaStream_t stream) {
    launch_silu<T, true>(x, dy, dx, n, stream);
}

void silu_forward_cuda(DType dtype, const void *x, void *y, size_t n, cudaStream_t stream) {
    check_float_dtype("silu", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_silu_forward, x, y, n, stream);
}

void silu_backward_cuda(DType dtype, const void *x, const void *dy, void *dx, size_t n, cudaStream_t stream) {
    check_float_dtype("silu", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_silu_backward, x, dy, dx, n, stream);
}
