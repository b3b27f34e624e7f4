/* The elementwise activations whose backward reads the forward input x
 * (GELU, SiLU: neither is monotonic, so y does not give x back), one kernel
 * for all, templated on the activation's math in float: F::value(x) and
 * F::slope(x), the derivative (CUDA sources only).
 *
 * out = F(x), or backward dy * F'(x), VEC elements a thread per step: 16
 * bytes where the buffers allow, the half types being memory-bound at two
 * bytes an element otherwise. Each element is read before the same thread
 * writes it, so dx may alias dy. */
#ifndef TRAINC_OPS_ACTIVATION_CUH
#define TRAINC_OPS_ACTIVATION_CUH

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

template <typename F, typename T, int VEC, bool BACKWARD>
static __global__ void activation_kernel(const T *x, const T *dy, T *out, size_t packs) {
    using P = Pack<T, VEC>;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < packs;
         i += (size_t)gridDim.x * blockDim.x) {
        P v = reinterpret_cast<const P *>(x)[i], g = v;
        if (BACKWARD) g = reinterpret_cast<const P *>(dy)[i];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float xf = to_float(v.v[e]);
            v.v[e] = from_float<T>(BACKWARD ? to_float(g.v[e]) * F::slope(xf) : F::value(xf));
        }
        reinterpret_cast<P *>(out)[i] = v;
    }
}

static inline bool activation_aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* 16 bytes a thread when n fills whole packs and every pointer is aligned, else one element. */
template <typename F, typename T, bool BACKWARD>
static void launch_activation(const void *x, const void *dy, void *out, size_t n, cudaStream_t stream) {
    constexpr int VEC = 16 / sizeof(T);
    if (n % VEC == 0 && activation_aligned16(x) && activation_aligned16(out) && (!BACKWARD || activation_aligned16(dy)))
        activation_kernel<F, T, VEC, BACKWARD><<<elementwise_blocks(n / VEC), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (const T *)dy, (T *)out, n / VEC);
    else
        activation_kernel<F, T, 1, BACKWARD><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (const T *)dy, (T *)out, n);
    CUDA_CHECK_LAUNCH();
}

/* Forward (dy NULL: out = F(x)) or backward (out = dy * F'(x)) in dtype; op names the op in messages. */
template <typename F>
static void activation_cuda(const char *op, DType dtype, const void *x, const void *dy, void *out, size_t n,
                            cudaStream_t stream) {
    check_float_dtype(op, dtype);
    if (n == 0) return;
    bool backward = dy != NULL;
    switch (dtype) {
    case DTYPE_F16:
        backward ? launch_activation<F, __half, true>(x, dy, out, n, stream)
                 : launch_activation<F, __half, false>(x, dy, out, n, stream);
        break;
    case DTYPE_BF16:
        backward ? launch_activation<F, __nv_bfloat16, true>(x, dy, out, n, stream)
                 : launch_activation<F, __nv_bfloat16, false>(x, dy, out, n, stream);
        break;
    default:
        backward ? launch_activation<F, float, true>(x, dy, out, n, stream)
                 : launch_activation<F, float, false>(x, dy, out, n, stream);
        break;
    }
}

#endif
