/* Dynamic loss scaling with torch.cuda.amp.GradScaler's semantics. The loss
 * gradient is multiplied by 'scale' (softmax_xent's grad_scale = &state->scale)
 * so small half-precision gradients do not flush to zero; the optimizer divides
 * it out again (sgd_step_mixed_*). Each step:
 *
 *   loss_scaler_begin_step   found_inf = 0
 *   ... forward, loss scaled by scale, backward ...
 *   loss_scaler_check        found_inf = 1 if any gradient is inf or NaN
 *   sgd_step_mixed           skipped entirely when found_inf, else unscales by 1/scale
 *   loss_scaler_update       found_inf: scale *= backoff, good_steps = 0, skipped_steps++
 *                            else: after 'interval' good steps in a row, scale *= growth
 *
 * On the CUDA path the state lives in device memory and every decision is made
 * there: no host sync, so a whole step can be captured in a CUDA graph. The
 * optimizer must run before the update, which changes the scale it divides by. */
#ifndef TRAINC_OPS_LOSS_SCALER_H
#define TRAINC_OPS_LOSS_SCALER_H

#include <stddef.h>
#include <stdint.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GradScaler's defaults. */
#define LOSS_SCALER_INIT_SCALE 65536.0f
#define LOSS_SCALER_GROWTH 2.0f
#define LOSS_SCALER_BACKOFF 0.5f
#define LOSS_SCALER_INTERVAL 2000

typedef struct {
    float scale;           /* first, so &state->scale is softmax_xent's grad_scale */
    int32_t good_steps;    /* finite steps since the last growth or backoff */
    int32_t found_inf;     /* set by check, cleared by begin_step */
    int32_t skipped_steps; /* steps skipped over inf or NaN, in all */
} LossScalerState;

/* The state to start from (upload it once for the CUDA path). */
LossScalerState loss_scaler_initial(float scale);

/* The face (op_context.h): state in ctx's device memory; check's grads are
 * of dtype (float32 on the CPU). */
void loss_scaler_begin_step(const OpContext *ctx, LossScalerState *state);
void loss_scaler_check(const OpContext *ctx, const void *grads, DType dtype, size_t n, LossScalerState *state);
void loss_scaler_update(const OpContext *ctx, LossScalerState *state, float growth, float backoff, int interval);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void loss_scaler_begin_step_cpu(LossScalerState *state);
void loss_scaler_check_cpu(const float *grads, size_t n, LossScalerState *state);
void loss_scaler_update_cpu(LossScalerState *state, float growth, float backoff, int interval);

/* state_dev points to device memory. check may run several times per step (one
 * gradient buffer each); it only ever sets found_inf. */
void loss_scaler_begin_step_cuda(LossScalerState *state_dev, cudaStream_t stream);
void loss_scaler_check_cuda(const void *grads, DType dtype, size_t n, LossScalerState *state_dev,
                            cudaStream_t stream);
void loss_scaler_update_cuda(LossScalerState *state_dev, float growth, float backoff,
                             int interval, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
