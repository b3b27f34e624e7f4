#include "ops/grad_norm.h"

#include <math.h>

void grad_clip_factor_cpu(const float *grads, size_t n, float inv_scale_times, float clip_norm,
                          float *norm_out, float *factor_out) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)grads[i] * grads[i];
    double norm = sqrt(sum) * inv_scale_times;
    double factor = 1;
    if (isfinite(norm)) factor = fmin(1.0, clip_norm / (norm + 1e-6));
    *norm_out = (float)norm;
    *factor_out = (float)factor;
}

size_t grad_clip_scratch_bytes(const OpContext *ctx, size_t n) {
    size_t bytes = 0;
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(bytes = grad_norm_scratch_bytes(n));
    return bytes;
}

void grad_clip_factor(const OpContext *ctx, const void *grads, size_t n, const LossScalerState *scaler,
                      float extra_inv, float clip_norm, void *scratch, float *norm, float *factor) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU)
        grad_clip_factor_cpu(grads, n, scaler ? extra_inv / scaler->scale : extra_inv, clip_norm, norm, factor);
    else
        GPU_ONLY(grad_clip_factor_cuda(grads, ctx->dtype, n, scaler, extra_inv, clip_norm, scratch, norm, factor,
                                       ctx->stream));
    op_end(ctx, __func__);
}
