#include "ops/loss_scaler.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

static __global__ void begin_step_kernel(LossScalerState *state) { state->found_inf = 0; }

/* Grid-stride over the gradients; a warp that saw inf or NaN sets the flag with
 * one atomicOr. No early exit, so every lane reaches the vote. */
template <typename T>
static __global__ void check_kernel(const T *grads, size_t n, LossScalerState *state) {
    bool bad = false;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(to_float(grads[i]));
    if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(&state->found_inf, 1);
}

/* The same decisions as loss_scaler_update_cpu, by one thread. */
static __global__ void update_kernel(LossScalerState *state, float growth, float backoff,
                                     int interval) {
    if (state->found_inf) {
        state->scale *= backoff;
        state->good_steps = 0;
        state->skipped_steps++;
    } else if (++state->good_steps == interval) {
        state->scale *= growth;
        state->good_steps = 0;
    }
}

void loss_scaler_begin_step_cuda(LossScalerState *state_dev, cudaStream_t stream) {
    begin_step_kernel<<<1, 1, 0, stream>>>(state_dev);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_check(const void *grads, size_t n, LossScalerState *state_dev,
                         cudaStream_t stream) {
    check_kernel<T><<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>((const T *)grads,
                                                                               n, state_dev);
    CUDA_CHECK_LAUNCH();
}

void loss_scaler_check_cuda(const void *grads, DType dtype, size_t n, LossScalerState *state_dev,
                            cudaStream_t stream) {
    check_float_dtype("loss_scaler_check", dtype);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_check, grads, n, state_dev, stream);
}

void loss_scaler_update_cuda(LossScalerState *state_dev, float growth, float backoff,
                             int interval, cudaStream_t stream) {
    update_kernel<<<1, 1, 0, stream>>>(state_dev, growth, backoff, interval);
    CUDA_CHECK_LAUNCH();
}
