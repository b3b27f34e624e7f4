/* Adam and AdamW with torch.optim.Adam's and torch.optim.AdamW's update
 * (amsgrad and maximize off), in one pass over flat buffers of n parameters,
 * for the step count t (1 on the first step):
 *   if scaler->found_inf: nothing at all (the step is skipped, t not counted)
 *   g = grad * (1 / scaler->scale), rounded, times *p.grad_mult (rounded) when
 *       given, divided by p.accumulate (rounded) when above 1, as sgd.h's
 *   Adam  (decoupled 0): g = g + weight_decay * w                 (L2)
 *   AdamW (decoupled 1): w = w * (1 - lr * weight_decay)         (decoupled)
 *   m = beta1 * m + (1 - beta1) * g
 *   v = beta2 * v + (1 - beta2) * g * g
 *   w = w - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 * The bias corrections are made in double from t, as torch makes them in
 * Python floats. m is the model's momentum buffer, v its second moment.
 *
 * The step count lives where the state does (host memory for the CPU path,
 * device memory for the CUDA path): adamw_count_step adds 1 unless the loss
 * scaler skips the step, once per optimizer step, before adamw_step_mixed
 * (which may then run over several ranges of the buffers: a sharded optimizer
 * updates its own). Nothing is read on the host, so a CUDA graph that captured
 * the step replays it with the step count of each replay.
 *
 * lr, decay_mask, grad_mult and lr_scale are sgd.h's: lr through a pointer so a
 * schedule can change it inside a CUDA graph; decay_mask NULL decays every
 * parameter, else only where it is not 0; lr_scale s gives a parameter the
 * parameter group of lr s * lr and weight_decay weight_decay / s (torch_airbench's
 * groups: AdamW's decay per step stays lr * weight_decay), s == 0 freezing the
 * parameter and its moments. accumulate: the gradient holds the sum of that
 * many micro-batches' gradients (memory.accumulate; 0 and 1: one). */
#ifndef TRAINC_OPS_ADAMW_H
#define TRAINC_OPS_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "ops/loss_scaler.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float beta1, beta2, eps;
    float weight_decay;
    int decoupled; /* 1: AdamW's decay of the weights; 0: Adam's L2 term in the gradient */
    int accumulate;
    const uint8_t *decay_mask;
    const float *grad_mult;
    const float *lr_scale;
} AdamwParams;

/* The face (op_context.h): step and the scaler state in ctx's device memory. */
void adamw_count_step(const OpContext *ctx, int64_t *step, const LossScalerState *scaler);
/* The mixed-precision step with grad and weights_half of ctx->dtype (weights_half
 * NULL on the CPU), everything in ctx's device memory. */
void adamw_step_mixed(const OpContext *ctx, float *master, const void *grad, float *m, float *v, void *weights_half,
                      size_t n, const float *lr, const int64_t *step, const LossScalerState *scaler, AdamwParams p);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* scaler NULL means scale 1 and no skipping, in both calls. The CPU reference
 * takes float32 gradients and keeps no half copy. The CUDA path reads the
 * gradient as grad_dtype (f32, f16 or bf16) and writes the updated master,
 * rounded, into weights_half (f16 or bf16; NULL: none). One fused kernel; the
 * step count, the scaler state and lr are read on the device. */
void adamw_count_step_cpu(int64_t *step, const LossScalerState *scaler);
void adamw_step_mixed_cpu(float *master, const float *grad, float *m, float *v, size_t n, const float *lr,
                          const int64_t *step, const LossScalerState *scaler, AdamwParams p);
void adamw_count_step_cuda(int64_t *step_dev, const LossScalerState *scaler_dev, cudaStream_t stream);
void adamw_step_mixed_cuda(float *master, const void *grad, DType grad_dtype, float *m, float *v, void *weights_half,
                           DType weights_dtype, size_t n, const float *lr_device, const int64_t *step_dev,
                           const LossScalerState *scaler_dev, AdamwParams p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
