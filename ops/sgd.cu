#include "ops/sgd.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* The weight decay of parameter i. MASKED is a template argument so that the
 * unmasked kernels read no mask at all. */
template <bool MASKED>
static __device__ __forceinline__ float decay_at(const uint8_t *mask, size_t i, float weight_decay) {
    return MASKED && !mask[i] ? 0.0f : weight_decay;
}

/* Parameter i's share of the learning rate (sgd.h's lr_scale); 1 without one. */
static __device__ __forceinline__ float share_at(const float *lr_scale, size_t i) {
    return lr_scale ? lr_scale[i] : 1.0f;
}

/* The same update as sgd_step_cpu (see sgd.h), one pass over the flat buffers. */
template <bool MASKED>
static __global__ void sgd_step_kernel(float *w, const float *grad, float *m, size_t n,
                                       const float *lr_device, float momentum,
                                       float weight_decay, int nesterov, const uint8_t *mask,
                                       const float *grad_mult, const float *lr_scale) {
    float step = *lr_device;
    float mult = grad_mult ? *grad_mult : 1.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float share = share_at(lr_scale, i);
        if (share == 0.0f) continue; /* frozen */
        float weight = w[i];
        float clipped = __fmul_rn(grad[i], mult); /* exact when mult is 1 */
        float g = clipped + __fdiv_rn(decay_at<MASKED>(mask, i, weight_decay), share) * weight;
        float mom = momentum * m[i] + g;
        float d = nesterov ? g + momentum * mom : mom;
        m[i] = mom;
        w[i] = weight - __fmul_rn(step, share) * d;
    }
}

void sgd_step_cuda(float *w, const float *grad, float *m, size_t n, const float *lr_device,
                   SgdParams p, cudaStream_t stream) {
    if (n == 0) return;
    if (p.decay_mask)
        sgd_step_kernel<true><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            w, grad, m, n, lr_device, p.momentum, p.weight_decay, p.nesterov, p.decay_mask,
            p.grad_mult, p.lr_scale);
    else
        sgd_step_kernel<false><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
            w, grad, m, n, lr_device, p.momentum, p.weight_decay, p.nesterov, NULL, p.grad_mult, p.lr_scale);
    CUDA_CHECK_LAUNCH();
}

/* sgd_step_mixed_cpu's update (see sgd.h). The whole grid leaves at once when
 * the loss scaler found inf or NaN. The unscaled and the clipped gradient are
 * each rounded on their own (__fmul_rn: never fused into the next add), as
 * PyTorch's separate unscale and clip passes round them. */
template <typename TG, typename TW, bool MASKED>
static __global__ void sgd_step_mixed_kernel(float *master, const TG *grad, float *m,
                                             TW *weights_half, size_t n, const float *lr_device,
                                             const LossScalerState *scaler, float momentum,
                                             float weight_decay, int nesterov, const uint8_t *mask,
                                             const float *grad_mult, const float *lr_scale) {
    if (scaler && scaler->found_inf) return;
    float inv_scale = scaler ? 1.0f / scaler->scale : 1.0f;
    float step = *lr_device;
    float mult = grad_mult ? *grad_mult : 1.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float share = share_at(lr_scale, i);
        if (share == 0.0f) continue; /* frozen: its half copy too */
        float weight = master[i];
        float unscaled = __fmul_rn(to_float(grad[i]), inv_scale);
        float clipped = __fmul_rn(unscaled, mult); /* exact when mult is 1 */
        float g = clipped + __fdiv_rn(decay_at<MASKED>(mask, i, weight_decay), share) * weight;
        float mom = momentum * m[i] + g;
        float d = nesterov ? g + momentum * mom : mom;
        m[i] = mom;
        float updated = weight - __fmul_rn(step, share) * d;
        master[i] = updated;
        if (weights_half) weights_half[i] = from_float<TW>(updated);
    }
}

typedef struct {
    float *master, *momentum;
    const void *grad;
    void *weights_half; /* NULL: no half copy */
    DType weights_dtype;
    size_t n;
    const float *lr_device;
    const LossScalerState *scaler_dev;
    SgdParams p;
    cudaStream_t stream;
} SgdMixedArgs;

template <typename TG, typename TW>
static void launch_sgd_mixed(const SgdMixedArgs *a) {
    unsigned blocks = elementwise_blocks(a->n);
    if (a->p.decay_mask)
        sgd_step_mixed_kernel<TG, TW, true><<<blocks, ELEMENTWISE_THREADS, 0, a->stream>>>(
            a->master, (const TG *)a->grad, a->momentum, (TW *)a->weights_half, a->n, a->lr_device,
            a->scaler_dev, a->p.momentum, a->p.weight_decay, a->p.nesterov, a->p.decay_mask,
            a->p.grad_mult, a->p.lr_scale);
    else
        sgd_step_mixed_kernel<TG, TW, false><<<blocks, ELEMENTWISE_THREADS, 0, a->stream>>>(
            a->master, (const TG *)a->grad, a->momentum, (TW *)a->weights_half, a->n, a->lr_device,
            a->scaler_dev, a->p.momentum, a->p.weight_decay, a->p.nesterov, NULL, a->p.grad_mult, a->p.lr_scale);
    CUDA_CHECK_LAUNCH();
}

/* Picks the half copy's type once the gradient's is known. */
template <typename TG>
static void launch_sgd_mixed_for_grad(const SgdMixedArgs *a) {
    if (!a->weights_half) launch_sgd_mixed<TG, __half>(a); /* the type goes unused */
    else if (a->weights_dtype == DTYPE_BF16) launch_sgd_mixed<TG, __nv_bfloat16>(a);
    else launch_sgd_mixed<TG, __half>(a);
}

void sgd_step_mixed_cuda(float *master, const void *grad, DType grad_dtype, float *momentum,
                         void *weights_half, DType weights_dtype, size_t n,
                         const float *lr_device, const LossScalerState *scaler_dev, SgdParams p,
                         cudaStream_t stream) {
    check_float_dtype("sgd_step_mixed (gradients)", grad_dtype);
    if (weights_half && weights_dtype != DTYPE_F16 && weights_dtype != DTYPE_BF16)
        TC_FATAL("sgd_step_mixed: the weights' half copy must be f16 or bf16, not %s",
                 dtype_name(weights_dtype));
    if (n == 0) return;
    SgdMixedArgs a = {master, momentum, grad, weights_half, weights_dtype, n, lr_device,
                      scaler_dev, p, stream};
    DISPATCH_FLOAT_DTYPE(grad_dtype, launch_sgd_mixed_for_grad, &a);
}
