#include "ops/loss_scaler.h"

#include <math.h>

#include "runtime/check.h"

LossScalerState loss_scaler_initial(float scale) {
    return (LossScalerState){.scale = scale, .good_steps = 0, .found_inf = 0, .skipped_steps = 0};
}

void loss_scaler_begin_step_cpu(LossScalerState *state) { state->found_inf = 0; }

void loss_scaler_check_cpu(const float *grads, size_t n, LossScalerState *state) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(grads[i])) {
            state->found_inf = 1;
            return;
        }
}

void loss_scaler_update_cpu(LossScalerState *state, float growth, float backoff, int interval) {
    if (state->found_inf) {
        state->scale *= backoff;
        state->good_steps = 0;
        state->skipped_steps++;
    } else if (++state->good_steps == interval) {
        state->scale *= growth;
        state->good_steps = 0;
    }
}

void loss_scaler_begin_step(const OpContext *ctx, LossScalerState *state) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) loss_scaler_begin_step_cpu(state);
    else GPU_ONLY(loss_scaler_begin_step_cuda(state, ctx->stream));
    op_end(ctx, __func__);
}

void loss_scaler_check(const OpContext *ctx, const void *grads, DType dtype, size_t n, LossScalerState *state) {
    if (ctx->device == DEVICE_CPU && dtype != DTYPE_F32)
        TC_FATAL("loss_scaler_check: the CPU path checks float32, not %s", dtype_name(dtype));
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) loss_scaler_check_cpu(grads, n, state);
    else GPU_ONLY(loss_scaler_check_cuda(grads, dtype, n, state, ctx->stream));
    op_end(ctx, __func__);
}

void loss_scaler_update(const OpContext *ctx, LossScalerState *state, float growth, float backoff, int interval) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) loss_scaler_update_cpu(state, growth, backoff, interval);
    else GPU_ONLY(loss_scaler_update_cuda(state, growth, backoff, interval, ctx->stream));
    op_end(ctx, __func__);
}
