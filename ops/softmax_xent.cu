/* Softmax cross-entropy in one kernel launch: a single block, each warp taking
 * rows warp, warp + WARPS, ...; lanes stride over the classes. Every row's
 * reduction and the final sum over warps run in a fixed order, so the loss is
 * the same bits on every run. One block is plenty for a classifier's logits
 * (batch x classes of a few thousand to a few million floats). */
#include "ops/softmax_xent.h"

#include <math.h>

#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

#define XENT_THREADS 512
#define XENT_WARPS (XENT_THREADS / 32)

static __device__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

static __device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <typename T>
static __global__ void __launch_bounds__(XENT_THREADS)
softmax_xent_kernel(const T *logits, const int32_t *labels, int n, int classes, float smoothing,
                    const float *grad_scale, float *loss, T *dlogits) {
    __shared__ double warp_loss[XENT_WARPS];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = grad_scale ? *grad_scale : 1.0f;
    float grad_factor = n > 0 ? scale / n : 0.0f;
    /* With smoothing 0 the targets are exactly 1 and 0: the unsmoothed kernel's bits. */
    float off_target = smoothing / classes, on_target = 1.0f - smoothing + off_target;
    double loss_sum = 0.0; /* kept by lane 0 */
    for (int i = warp; i < n; i += XENT_WARPS) {
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
    if (lane == 0) warp_loss[warp] = loss_sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < XENT_WARPS; w++) total += warp_loss[w];
        *loss = n > 0 ? (float)(total / n) : 0.0f;
    }
}

template <typename T>
static void launch_softmax_xent(const void *logits, const int32_t *labels, int n, int classes,
                                float smoothing, const float *grad_scale, float *loss_device,
                                void *dlogits, cudaStream_t stream) {
    softmax_xent_kernel<T><<<1, XENT_THREADS, 0, stream>>>(
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
