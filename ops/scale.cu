#include "ops/scale.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* One element a thread: the op runs on logits, a few thousand elements. Each
 * element is read before the same thread writes it, so y may alias x. */
template <typename T>
static __global__ void scale_kernel(const T *x, T *y, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = from_float<T>(s * to_float(x[i]));
}

template <typename T>
static void launch_scale(const void *x, void *y, size_t n, float s, cudaStream_t stream) {
    scale_kernel<T><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>((const T *)x, (T *)y, n, s);
    CUDA_CHECK_LAUNCH();
}

void scale_cuda(DType dtype, const void *x, void *y, size_t n, float s, cudaStream_t stream) {
    check_float_dtype("scale", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_scale, x, y, n, s, stream);
}
