#include "ops/lookahead.h"

#include "runtime/check.h"

static void check_params(LookaheadParams p) {
    if (p.every < 1 || p.total < 1 || !(p.alpha >= 0.0f && p.alpha <= 1.0f) || !(p.power >= 0.0f))
        TC_FATAL("lookahead: every %lld and total %lld must be >= 1, alpha %g in [0, 1], power %g >= 0",
                 (long long)p.every, (long long)p.total, p.alpha, p.power);
}

void lookahead_step_cpu(const int64_t *step_counter, LookaheadParams p, float *slow, float *fast, size_t n) {
    check_params(p);
    float a = lookahead_weight(p, *step_counter);
    if (a < 0.0f) return;
    for (size_t i = 0; i < n; i++) {
        slow[i] = a * slow[i] + (1.0f - a) * fast[i];
        fast[i] = slow[i];
    }
}

void lookahead_step(const OpContext *ctx, const int64_t *step_counter, LookaheadParams p, float *slow, float *fast,
                    void *fast_half, size_t n) {
    if (ctx->device == DEVICE_CPU && fast_half) TC_FATAL("lookahead_step: the CPU path keeps no half-precision weights");
    check_params(p);
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) lookahead_step_cpu(step_counter, p, slow, fast, n);
    else GPU_ONLY(lookahead_step_cuda(ctx->dtype, step_counter, p, slow, fast, fast_half, n, ctx->stream));
    op_end(ctx, __func__);
}
