#include "ops/loss_scaler.h"

#include <math.h>

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
