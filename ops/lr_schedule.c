#include "ops/lr_schedule.h"

#include "runtime/check.h"

void lr_schedule_check(const LrSchedule *s) {
    long w = s->warmup_steps, t = s->total_steps;
    if (s->kind < LR_CONSTANT || s->kind > LR_LINEAR)
        TC_FATAL("lr schedule: unknown kind %d", (int)s->kind);
    if (w < 0 || t < 0) TC_FATAL("lr schedule: negative warm-up (%ld) or total steps (%ld)", w, t);
    if (!(s->warmup_start_factor >= 0.0f && s->warmup_start_factor <= 1.0f))
        TC_FATAL("lr schedule: warm-up start factor %g is outside [0, 1]", s->warmup_start_factor);
    if ((s->kind == LR_COSINE || s->kind == LR_LINEAR) && t < w)
        TC_FATAL("lr schedule: %s over %ld total steps is shorter than its %ld warm-up steps",
                 s->kind == LR_COSINE ? "cosine" : "linear", t, w);
    if (s->kind == LR_ONECYCLE && (t <= w || w == 1))
        TC_FATAL("lr schedule: onecycle needs total steps (%ld) > warm-up steps (%ld) and a warm-up "
                 "of 0 or at least 2 steps (as PyTorch's OneCycleLR)", t, w);
    if (s->kind == LR_ONECYCLE && (s->div_factor < 0.0f || s->final_div_factor < 0.0f))
        TC_FATAL("lr schedule: negative onecycle div factor");
    if (s->kind == LR_STEP && s->step_size < 1)
        TC_FATAL("lr schedule: step size %ld must be at least 1", s->step_size);
}

float lr_schedule_at(const LrSchedule *s, long step) {
    lr_schedule_check(s);
    return (float)lr_schedule_value(s, step);
}

void lr_schedule_step_cpu(const LrSchedule *s, int64_t *step_counter, float *lr_out) {
    *lr_out = lr_schedule_at(s, (long)*step_counter);
    *step_counter += 1;
}

void lr_schedule_step(const OpContext *ctx, const LrSchedule *s, int64_t *step_counter, float *lr_out) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) lr_schedule_step_cpu(s, step_counter, lr_out);
    else GPU_ONLY(lr_schedule_step_cuda(s, step_counter, lr_out, ctx->stream));
    op_end(ctx, __func__);
}
