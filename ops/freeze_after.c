#include "ops/freeze_after.h"

void freeze_after_cpu(const int64_t *step_counter, int64_t steps, float *lr_scale, size_t n) {
    if (*step_counter <= steps) return;
    for (size_t i = 0; i < n; i++) lr_scale[i] = 0.0f;
}

void freeze_after(const OpContext *ctx, const int64_t *step_counter, int64_t steps, float *lr_scale, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) freeze_after_cpu(step_counter, steps, lr_scale, n);
    else GPU_ONLY(freeze_after_cuda(step_counter, steps, lr_scale, n, ctx->stream));
    op_end(ctx, __func__);
}
