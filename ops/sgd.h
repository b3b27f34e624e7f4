/* SGD with momentum, Nesterov and L2 weight decay, PyTorch's semantics (no
 * dampening), in one pass over flat buffers of n parameters:
 *   g = grad + weight_decay * w
 *   m = momentum * m + g
 *   d = nesterov ? g + momentum * m : m
 *   w = w - lr * d
 * lr is read through a pointer (host memory for the CPU path, device memory for
 * the CUDA path) so a schedule can change it without re-recording a CUDA graph.
 * decay_mask (last, so initializers that omit it leave it NULL) limits the
 * weight decay: NULL decays every parameter; otherwise parameter i decays only
 * where decay_mask[i] != 0 and elsewhere steps as with weight_decay 0 (biases
 * and batch-norm scales and shifts, say). It is n bytes in host memory for the
 * CPU path, in device memory for the CUDA path.
 * grad_mult (after it, for the same reason) multiplies the (unscaled) gradient
 * before the weight decay is added, as torch.nn.utils.clip_grad_norm_ does
 * before optimizer.step: NULL is 1; else one float read at each step, on the
 * host for the CPU path, on the device for the CUDA path (grad_norm.h's factor).
 * lr_scale (last) gives each parameter its own share s of the learning rate,
 * keeping the weight decay per step as it is (decoupled: torch_airbench's
 * parameter groups with lr s * lr and weight_decay weight_decay / s):
 *   s == 0: the parameter and its momentum stay as they are (frozen)
 *   else:   g = grad + (weight_decay / s) * w, ..., w = w - (lr * s) * d
 * NULL is s = 1 everywhere, which is the update above bit for bit. n floats,
 * on the host for the CPU path, on the device for the CUDA path. */
#ifndef TRAINC_OPS_SGD_H
#define TRAINC_OPS_SGD_H

#include <stddef.h>
#include <stdint.h>

#include "ops/loss_scaler.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float momentum;
    float weight_decay;
    int nesterov;
    const uint8_t *decay_mask;
    const float *grad_mult;
    const float *lr_scale;
} SgdParams;

/* The face (op_context.h): the mixed-precision step (sgd_step_mixed_cpu below)
 * with grad and weights_half of ctx->dtype, everything in ctx's device memory
 * (weights_half NULL on the CPU). */
void sgd_step_mixed(const OpContext *ctx, float *master, const void *grad, float *momentum, void *weights_half,
                    size_t n, const float *lr, const LossScalerState *scaler, SgdParams p);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void sgd_step_cpu(float *w, const float *grad, float *m, size_t n, const float *lr,
                  SgdParams p);
void sgd_step_cuda(float *w, const float *grad, float *m, size_t n, const float *lr_device,
                   SgdParams p, cudaStream_t stream);

/* The mixed-precision step: the same update on the fp32 master weights and
 * momentum, from gradients scaled by the loss scaler (see loss_scaler.h):
 *   if scaler->found_inf: nothing at all (the step is skipped)
 *   else: grad = grad * (1 / scaler->scale), rounded to fp32, times *p.grad_mult
 *         (rounded again) when given, then sgd_step's math
 * scaler NULL means scale 1 and no skipping. The CUDA path reads the gradient as
 * grad_dtype (f32, f16 or bf16), and writes the updated master, rounded, into
 * weights_half (f16 or bf16) for the next forward pass; weights_half NULL skips
 * that (fp32 training with a loss scaler). One fused kernel; the scaler state
 * and lr are read on the device. The CPU reference takes float32 gradients and
 * keeps no half copy. */
void sgd_step_mixed_cpu(float *master, const float *grad, float *momentum, size_t n,
                        const float *lr, const LossScalerState *scaler, SgdParams p);
void sgd_step_mixed_cuda(float *master, const void *grad, DType grad_dtype, float *momentum,
                         void *weights_half, DType weights_dtype, size_t n,
                         const float *lr_device, const LossScalerState *scaler_dev, SgdParams p,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
