/* Two passes, both in a fixed order so the bits repeat: each block of the first
 * sums its grid-stride share of squares into scratch; one block of the second
 * sums those partial sums and writes the norm and the factor. The block count
 * depends on n alone (not on the GPU), so neither does the order. */
#include "ops/grad_norm.h"

#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

#define NORM_THREADS 256
#define NORM_MAX_BLOCKS 1024

static unsigned norm_blocks(size_t n) {
    size_t blocks = (n + NORM_THREADS - 1) / NORM_THREADS;
    return (unsigned)(blocks < NORM_MAX_BLOCKS ? blocks : NORM_MAX_BLOCKS);
}

size_t grad_norm_scratch_bytes(size_t n) { return norm_blocks(n) * sizeof(double); }

/* The block's sum, in thread 0. */
static __device__ double block_sum(double v) {
    __shared__ double warp_sums[NORM_THREADS / 32];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    double total = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < NORM_THREADS / 32; w++) total += warp_sums[w];
    return total;
}

template <typename T>
static __global__ void __launch_bounds__(NORM_THREADS)
sum_squares_kernel(const T *grads, size_t n, double *partial) {
    double sum = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = to_float(grads[i]);
        sum += v * v;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

/* grad_clip_factor_cpu's arithmetic on the sum of the partial sums. */
static __global__ void __launch_bounds__(NORM_THREADS)
clip_factor_kernel(const double *partial, unsigned count, const LossScalerState *scaler,
                   float extra_inv, float clip_norm, float *norm_out, float *factor_out) {
    double sum = 0;
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum);
    if (threadIdx.x != 0) return;
    double scale = scaler ? scaler->scale : 1.0f;
    double norm = sqrt(sum) * ((double)extra_inv / scale);
    double factor = 1;
    if (isfinite(norm)) factor = fmin(1.0, clip_norm / (norm + 1e-6));
    *norm_out = (float)norm;
    *factor_out = (float)factor;
}

template <typename T>
static void launch_sum_squares(const void *grads, size_t n, double *partial, cudaStream_t stream) {
    sum_squares_kernel<T><<<norm_blocks(n), NORM_THREADS, 0, stream>>>((const T *)grads, n, partial);
    CUDA_CHECK_LAUNCH();
}

void grad_clip_factor_cuda(const void *grads, DType dtype, size_t n,
                           const LossScalerState *scaler_dev, float extra_inv, float clip_norm,
                           void *scratch, float *norm_dev, float *factor_dev, cudaStream_t stream) {
    check_float_dtype("grad_clip_factor", dtype);
    double *partial = (double *)scratch;
    if (n > 0) DISPATCH_FLOAT_DTYPE(dtype, launch_sum_squares, grads, n, partial, stream);
    clip_factor_kernel<<<1, NORM_THREADS, 0, stream>>>(partial, norm_blocks(n), scaler_dev, extra_inv,
                                                       clip_norm, norm_dev, factor_dev);
    CUDA_CHECK_LAUNCH();
}
