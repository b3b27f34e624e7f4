#include "ops/gelu.h"
#include "ops/gelu_math.h"

#include <stdint.h>

#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"
#include "runtime/check.h"

/* out = GELU(x), or with BACKWARD dy * GELU'(x), VEC elements a thread per
 * step: 16 bytes where the buffers allow, the half types being memory-bound at
 * two bytes an element otherwise. Each element is read before the same thread
 * writes it, so dx may alias dy. */
template <typename T, int VEC, bool BACKWARD>
static __global__ void gelu_kernel(const T *x, const T *dy, T *out, size_t packs) {
    using P = Pack<T, VEC>;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < packs;
         i += (size_t)gridDim.x * blockDim.x) {
        P v = reinterpret_cast<const P *>(x)[i], g = v;
        if (BACKWARD) g = reinterpret_cast<const P *>(dy)[i];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float xf = to_float(v.v[e]);
            v.v[e] = from_float<T>(BACKWARD ? to_float(g.v[e]) * gelu_grad_f(xf) : gelu_value_f(xf));
        }
        reinterpret_cast<P *>(out)[i] = v;
    }
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* 16 bytes a thread when n fills whole packs and every pointer is aligned, else one element. */
template <typename T, bool BACKWARD>
static void launch_gelu(const void *x, const void *dy, void *out, size_t n, cudaStream_t stream) {
    constexpr int VEC = 16 / sizeof(T);
    if (n % VEC == 0 && aligned16(x) && aligned16(out) && (!BACKWARD || aligned16(dy)))
        gelu_kernel<T, VEC, BACKWARD><<<elementwise_blocks(n / VEC), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (const T *)dy, (T *)out, n / VEC);
    else
        gelu_kernel<T, 1, BACKWARD><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (const T *)dy, (T *)out, n);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_gelu_forward(const void *x, void *y, size_t n, cudaStream_t stream) {
    launch_gelu<T, false>(x, NULL, y, n, stream);
}

template <typename T>
static void launch_gelu_backward(const void *x, const void *dy, void *dx, size_t n, cudaStream_t stream) {
    launch_gelu<T, true>(x, dy, dx, n, stream);
}

void gelu_forward_cuda(DType dtype, const void *x, void *y, size_t n, cudaStream_t stream) {
    check_float_dtype("gelu", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_gelu_forward, x, y, n, stream);
}

void gelu_backward_cuda(DType dtype, const void *x, const void *dy, void *dx, size_t n, cudaStream_t stream) {
    check_float_dtype("gelu", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_gelu_backward, x, dy, dx, n, stream);
}
