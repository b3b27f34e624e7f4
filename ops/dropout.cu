#include "ops/dropout.h"
#include "ops/dropout_math.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* One element a thread: y = x * scale where element i's hash keeps it, else
 * 0 (added to y under ACCUMULATE). The seed and step are read on the
 * device, so a replayed graph follows them. Each element is read before the same thread
 * writes it, so y may alias x. */
template <typename T, bool ACCUMULATE>
static __global__ void dropout_kernel(const T *x, T *y, size_t n, int c, int plane, int nhwc, uint32_t layer,
                                      const DropoutCounter *counter, uint32_t threshold, float scale) {
    uint64_t key = dropout_key(counter->seed, layer, counter->step);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t at = dropout_nchw_index(i, c, plane, nhwc);
        float v = dropout_keep(key, at, threshold) ? __fmul_rn(to_float(x[i]), scale) : 0.0f; /* no fused add */
        y[i] = from_float<T>(ACCUMULATE ? to_float(y[i]) + v : v);
    }
}

template <typename T>
static void launch_dropout(const DropoutShape *s, int nhwc, const DropoutMask *k, const DropoutCounter *counter,
                           const void *x, void *y, int accumulate, cudaStream_t stream) {
    size_t n = (size_t)s->n * s->c * s->plane;
    uint32_t threshold = dropout_threshold(k->p);
    float scale = dropout_scale(k->p);
    if (accumulate)
        dropout_kernel<T, true><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (T *)y, n, s->c, s->plane, nhwc, k->layer, counter, threshold, scale);
    else
        dropout_kernel<T, false><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (T *)y, n, s->c, s->plane, nhwc, k->layer, counter, threshold, scale);
    CUDA_CHECK_LAUNCH();
}

void dropout_apply_cuda(DType dtype, const DropoutShape *s, int nhwc, const DropoutMask *k,
                        const DropoutCounter *counter, const void *x, void *y, int accumulate, cudaStream_t stream) {
    check_float_dtype("dropout", dtype);
    dropout_check(s, k);
    if (s->n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_dropout, s, nhwc, k, counter, x, y, accumulate, stream);
}

static __global__ void dropout_advance_kernel(DropoutCounter *counter) { counter->step += 1; }

void dropout_advance_cuda(DropoutCounter *counter, cudaStream_t stream) {
    dropout_advance_kernel<<<1, 1, 0, stream>>>(counter);
    CUDA_CHECK_LAUNCH();
}
