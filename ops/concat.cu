#include "ops/concat.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* One element of the part a thread (consecutive threads: consecutive elements of both tensors within a
 * channel run): into y, or out of y into t (added under ACCUMULATE). */
template <typename T, bool INTO, bool ACCUMULATE>
static __global__ void concat_part_kernel(T *t, T *y, size_t n, int c, int channels, int c0, int plane, int nhwc) {
    size_t per_image = (size_t)c * plane;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t at = nhwc ? i / c * channels + c0 + i % c
                         : i / per_image * channels * plane + (size_t)c0 * plane + i % per_image;
        if (INTO) y[at] = t[i];
        else t[i] = ACCUMULATE ? from_float<T>(to_float(t[i]) + to_float(y[at])) : y[at];
    }
}

template <typename T>
static void launch_part(const ConcatPart *p, void *t, void *y, int into, int accumulate, cudaStream_t stream) {
    size_t n = (size_t)p->n * p->c * p->plane;
    unsigned blocks = elementwise_blocks(n);
    T *part = (T *)t, *whole = (T *)y;
    if (into)
        concat_part_kernel<T, true, false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            part, whole, n, p->c, p->channels, p->c0, p->plane, p->nhwc);
    else if (accumulate)
        concat_part_kernel<T, false, true><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            part, whole, n, p->c, p->channels, p->c0, p->plane, p->nhwc);
    else
        concat_part_kernel<T, false, false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            part, whole, n, p->c, p->channels, p->c0, p->plane, p->nhwc);
    CUDA_CHECK_LAUNCH();
}

void concat_part_cuda(DType dtype, const ConcatPart *p, void *t, void *y, int into, int accumulate,
                      cudaStream_t stream) {
    check_float_dtype("concat", dtype);
    if (p->n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_part, p, t, y, into, accumulate, stream);
}
