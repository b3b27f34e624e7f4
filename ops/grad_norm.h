/* Gradient clipping by the global L2 norm, torch.nn.utils.clip_grad_norm_ after
 * GradScaler.unscale_: the true gradient is g = grads * inv, with inv undoing
 * the loss scale s and any other factor the buffer holds (1/k for k summed
 * micro-batches), and
 *   norm   = ||g||_2 over all n gradients
 *   factor = min(1, clip_norm / (norm + 1e-6)), or 1 when norm is inf or NaN
 * The optimizer then steps on factor * g (SgdParams.grad_mult = &factor). A
 * non-finite norm means inf or NaN gradients, whose step the loss scaler skips:
 * factor 1 keeps that step from spreading NaN anywhere else.
 *
 * Squares are summed in double, in a fixed order: the same gradients give the
 * same bits on every run, and a finite gradient too large for a float square
 * still has a finite norm. The factor is computed in double and rounded.
 *
 * The CUDA path reads s from scaler_dev->scale (NULL: 1) on the device and
 * writes norm and factor to device memory: no host sync, no allocation, so it
 * can be captured in a CUDA graph. scratch (device) holds
 * grad_norm_scratch_bytes(n) bytes, allocated once by the caller. */
#ifndef TRAINC_OPS_GRAD_NORM_H
#define TRAINC_OPS_GRAD_NORM_H

#include <stddef.h>

#include "ops/loss_scaler.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): grads of ctx->dtype, everything in ctx's device
 * memory; inv = extra_inv / scaler->scale (scaler NULL: extra_inv). scratch
 * holds grad_clip_scratch_bytes (0 on the CPU, where it may be NULL). */
size_t grad_clip_scratch_bytes(const OpContext *ctx, size_t n);
void grad_clip_factor(const OpContext *ctx, const void *grads, size_t n, const LossScalerState *scaler,
                      float extra_inv, float clip_norm, void *scratch, float *norm, float *factor);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* inv_scale_times = 1 / (s * k). */
void grad_clip_factor_cpu(const float *grads, size_t n, float inv_scale_times, float clip_norm,
                          float *norm_out, float *factor_out);

size_t grad_norm_scratch_bytes(size_t n);
/* grads in dtype (f32, f16 or bf16); inv = extra_inv / scaler_dev->scale. */
void grad_clip_factor_cuda(const void *grads, DType dtype, size_t n,
                           const LossScalerState *scaler_dev, float extra_inv, float clip_norm,
                           void *scratch, float *norm_dev, float *factor_dev, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
