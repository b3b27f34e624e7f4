#include "ops/adamw.h"

#include "ops/adamw_math.h"
#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* One thread: the step counts unless the loss scaler skips it. */
static __global__ void adamw_count_step_kernel(int64_t *step, const LossScalerState *scaler) {
    if (!scaler || !scaler->found_inf) *step += 1;
}

void adamw_count_step_cuda(int64_t *step_dev, const LossScalerState *scaler_dev, cudaStream_t stream) {
    adamw_count_step_kernel<<<1, 1, 0, stream>>>(step_dev, scaler_dev);
    CUDA_CHECK_LAUNCH();
}

typedef struct {
    float *master, *m, *v;
    const void *grad;
    void *weights_half; /* NULL: no half copy */
    DType weights_dtype;
    size_t n;
    const float *lr_device;
    const int64_t *step_dev;
    const LossScalerState *scaler_dev;
    AdamwParams p;
    cudaStream_t stream;
} AdamwArgs;

/* adamw_step_mixed_cpu's update (see adamw.h). The whole grid leaves at once
 * when the loss scaler found inf or NaN; every thread makes the step's scalars
 * from the step count on the device. Without a mask no mask byte is read (the
 * branch is the same for every thread). */
template <typename TG, typename TW>
static __global__ void adamw_step_mixed_kernel(float *master, const TG *grad, float *m, float *v, TW *weights_half,
                                               size_t n, const float *lr_device, const int64_t *step_dev,
                                               const LossScalerState *scaler, AdamwParams p) {
    if (scaler && scaler->found_inf) return;
    AdamwStep s = adamw_step_scalars(*lr_device, p.grad_mult ? *p.grad_mult : 1.0f,
                                     scaler ? 1.0f / scaler->scale : 1.0f, p.accumulate, p.beta1, p.beta2, p.eps,
                                     p.decoupled, *step_dev);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float share = p.lr_scale ? p.lr_scale[i] : 1.0f;
        if (share == 0.0f) { /* frozen; its half copy is still the master rounded, as the face promises */
            if (weights_half) weights_half[i] = from_float<TW>(master[i]);
            continue;
        }
        float decay = p.decay_mask && !p.decay_mask[i] ? 0.0f : p.weight_decay;
        float updated = adamw_update(&s, to_float(grad[i]), share, decay, master[i], &m[i], &v[i]);
        master[i] = updated;
        if (weights_half) weights_half[i] = from_float<TW>(updated);
    }
}

template <typename TG, typename TW>
static void launch_adamw(const AdamwArgs *a) {
    adamw_step_mixed_kernel<TG, TW><<<elementwise_blocks(a->n), ELEMENTWISE_THREADS, 0, a->stream>>>(
        a->master, (const TG *)a->grad, a->m, a->v, (TW *)a->weights_half, a->n, a->lr_device, a->step_dev,
        a->scaler_dev, a->p);
    CUDA_CHECK_LAUNCH();
}

/* Picks the half copy's type once the gradient's is known. */
template <typename TG>
static void launch_adamw_for_grad(const AdamwArgs *a) {
    if (!a->weights_half) launch_adamw<TG, __half>(a); /* the type goes unused */
    else if (a->weights_dtype == DTYPE_BF16) launch_adamw<TG, __nv_bfloat16>(a);
    else launch_adamw<TG, __half>(a);
}

void adamw_step_mixed_cuda(float *master, const void *grad, DType grad_dtype, float *m, float *v, void *weights_half,
                           DType weights_dtype, size_t n, const float *lr_device, const int64_t *step_dev,
                           const LossScalerState *scaler_dev, AdamwParams p, cudaStream_t stream) {
    check_float_dtype("adamw_step_mixed (gradients)", grad_dtype);
    if (weights_half && weights_dtype != DTYPE_F16 && weights_dtype != DTYPE_BF16)
        TC_FATAL("adamw_step_mixed: the weights' half copy must be f16 or bf16, not %s", dtype_name(weights_dtype));
    if (n == 0) return;
    AdamwArgs a = {master, m, v, grad, weights_half, weights_dtype, n, lr_device, step_dev, scaler_dev, p, stream};
    DISPATCH_FLOAT_DTYPE(grad_dtype, launch_adamw_for_grad, &a);
}
