#include "ops/lookahead.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* lookahead_step_cpu's update; every thread works out a from the counter
 * itself and the whole grid leaves at once at the steps without one. The
 * products are rounded on their own (__fmul_rn), as the CPU rounds them. */
template <typename T>
static __global__ void lookahead_kernel(const int64_t *step_counter, LookaheadParams p, float *slow, float *fast,
                                        T *fast_half, size_t n) {
    float a = lookahead_weight(p, *step_counter);
    if (a < 0.0f) return;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = __fadd_rn(__fmul_rn(a, slow[i]), __fmul_rn(1.0f - a, fast[i]));
        slow[i] = s;
        fast[i] = s;
        if (fast_half) fast_half[i] = from_float<T>(s);
    }
}

template <typename T>
static void launch_lookahead(const int64_t *step_counter, LookaheadParams p, float *slow, float *fast, void *fast_half,
                             size_t n, cudaStream_t stream) {
    lookahead_kernel<T><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(step_counter, p, slow, fast,
                                                                                 (T *)fast_half, n);
    CUDA_CHECK_LAUNCH();
}

void lookahead_step_cuda(DType half_dtype, const int64_t *step_counter_dev, LookaheadParams p, float *slow,
                         float *fast, void *fast_half, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (!fast_half) half_dtype = DTYPE_F32; /* the type goes unused */
    check_float_dtype("lookahead (half copy)", half_dtype);
    DISPATCH_FLOAT_DTYPE(half_dtype, launch_lookahead, step_counter_dev, p, slow, fast, fast_half, n, stream);
}
