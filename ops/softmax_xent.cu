/* Softmax cross-entropy in one kernel launch over the whole GPU: each warp
 * takes a row (rows blockIdx.x * XENT_WARPS + warp, then a grid stride on),
 * its lanes striding over the classes, so each row's arithmetic is what it was
 * when one block did all rows. The loss adds up in a fixed order: each block
 * sums its warps' row losses into a slot of xent_partials, and the block that
 * finishes last (a ticket counter it resets for the next launch) sums the slots
 * in slot order. The block count depends on n alone, never on the GPU or on
 * timing, so the loss is the same bits on every run.
 *
 * The slots and the counter are static device memory, one set per device (no
 * scratch to allocate, so the face stays as it is, and a CUDA graph may
 * capture the launch). The price: two launches of this op on one device must
 * not run at the same time on different streams; the trainer computes its loss
 * on one stream. */
#include "ops/softmax_xent.h"

#include <math.h>

#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

#define XENT_THREADS 256
#define XENT_WARPS (XENT_THREADS / 32)
#define XENT_MAX_BLOCKS 1024 /* 8192 rows in flight; more rows take a grid stride */

static __device__ double xent_partials[XENT_MAX_BLOCKS];
static __device__ unsigned xent_blocks_done; /* zero between launches */

static unsigned xent_blocks(int n) {
    int blocks = (n + XENT_WARPS - 1) / XENT_WARPS;
    return blocks < 1 ? 1 : blocks > XENT_MAX_BLOCKS ? XENT_MAX_BLOCKS : (unsigned)blocks;
}

static __device__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

static __device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* The block's sum of v (one value a warp, from lane 0), in thread 0, warp by warp. */
static __device__ double block_sum_of_warps(double v) {
    __shared__ double warp_values[XENT_WARPS];
    if (threadIdx.x % 32 == 0) warp_values[threadIdx.x / 32] = v;
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < XENT_WARPS; w++) total += warp_values[w];
    return total;
}

/* Called by every thread once the block's slot is written: the last block to
 * finish sums the slots in order (each thread a fixed stride of them, then the
 * lanes and warps in a fixed order) and writes the mean. */
static __device__ void finish_loss(int n, float *loss) {
    __shared__ bool last;
    __threadfence(); /* the slot is visible before the ticket */
    if (threadIdx.x == 0) last = atomicAdd(&xent_blocks_done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const volatile double *slots = xent_partials;
    double sum = 0.0;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) sum += slots[b];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    double total = block_sum_of_warps(sum);
    if (threadIdx.x == 0) {
        *loss = n > 0 ? (float)(total / n) : 0.0f;
        xent_blocks_done = 0;
    }
}

template <typename T>
static __global__ void __launch_bounds__(XENT_THREADS)
softmax_xent_kernel(const T *logits, const int32_t *labels, int n, int classes, float smoothing,
                    const float *grad_scale, float *loss, T *dlogits) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = grad_scale ? *grad_scale : 1.0f;
    float grad_factor = n > 0 ? scale / n : 0.0f;
    /* With smoothing 0 the targets are exactly 1 and 0: the unsmoothed kernel's bits. */
    float off_target = smoothing / classes, on_target = 1.0f - smoothing + off_target;
    double loss_sum = 0.0; /* kept by lane 0 */
    for (int i = blockIdx.x * XENT_WARPS + warp; i < n; i += gridDim.x * XENT_WARPS) {
        const T *row = logits + (size_t)i * classes;
        T *drow = dlogits + (size_t)i * classes;
        float row_max = -INFINITY;
        for (int j = lane; j < classes; j += 32) row_max = fmaxf(row_max, to_float(row[j]));
        row_max = warp_max(row_max);
        float exp_sum = 0.0f;
        for (int j = lane; j < classes; j += 32) exp_sum += expf(to_float(row[j]) - row_max);
        exp_sum = warp_sum(exp_sum);
        int label = labels[i];
        bool label_ok = label >= 0 && label < classes;
        float row_sum = 0.0f;
        if (smoothing != 0.0f) {
            for (int j = lane; j < classes; j += 32) row_sum += to_float(row[j]);
            row_sum = warp_sum(row_sum);
        }
        for (int j = lane; j < classes; j += 32) {
            float prob = expf(to_float(row[j]) - row_max) / exp_sum;
            drow[j] = from_float<T>((prob - (j == label ? on_target : off_target)) * grad_factor);
        }
        /* A label outside [0, classes) makes the loss NaN rather than reading out of bounds. */
        if (lane == 0) {
            loss_sum += label_ok ? (double)row_max + log((double)exp_sum) - to_float(row[label])
                                 : NAN;
            /* see softmax_xent_smooth_cpu */
            if (smoothing != 0.0f && label_ok)
                loss_sum += (double)smoothing * ((double)to_float(row[label]) - (double)row_sum / classes);
        }
    }
    double block_loss = block_sum_of_warps(loss_sum);
    if (threadIdx.x == 0) xent_partials[blockIdx.x] = block_loss;
    finish_loss(n, loss);
}

template <typename T>
static void launch_softmax_xent(const void *logits, const int32_t *labels, int n, int classes,
                                float smoothing, const float *grad_scale, float *loss_device,
                                void *dlogits, cudaStream_t stream) {
    softmax_xent_kernel<T><<<xent_blocks(n), XENT_THREADS, 0, stream>>>(
        (const T *)logits, labels, n, classes, smoothing, grad_scale, loss_device, (T *)dlogits);
    CUDA_CHECK_LAUNCH();
}

void softmax_xent_cuda(DType dtype, const void *logits, const int32_t *labels, int n, int classes,
                       const float *grad_scale, float *loss_device, void *dlogits,
                       cudaStream_t stream) {
    softmax_xent_smooth_cuda(dtype, logits, labels, n, classes, 0.0f, grad_scale, loss_device,
                             dlogits, stream);
}

void softmax_xent_smooth_cuda(DType dtype, const void *logits, const int32_t *labels, int n,
                              int classes, float smoothing, const float *grad_scale,
                              float *loss_device, void *dlogits, cudaStream_t stream) {
    check_float_dtype("softmax_xent", dtype);
    if (!(smoothing >= 0.0f && smoothing <= 1.0f))
        TC_FATAL("softmax_xent: label smoothing %g is outside [0, 1]", smoothing);
    DISPATCH_FLOAT_DTYPE(dtype, launch_softmax_xent, logits, labels, n, classes, smoothing,
                         grad_scale, loss_device, dlogits, stream);
}
