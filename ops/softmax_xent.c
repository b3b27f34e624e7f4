#include "ops/softmax_xent.h"

#include <math.h>

#include "runtime/check.h"

void softmax_xent_cpu(const float *logits, const int32_t *labels, int n, int classes,
                      const float *grad_scale, float *loss, float *dlogits) {
    softmax_xent_smooth_cpu(logits, labels, n, classes, 0.0f, grad_scale, loss, dlogits);
}

/* Double precision throughout: this is the reference the CUDA kernel is held to. */
void softmax_xent_smooth_cpu(const float *logits, const int32_t *labels, int n, int classes,
                             float smoothing, const float *grad_scale, float *loss,
                             float *dlogits) {
    if (!(smoothing >= 0.0f && smoothing <= 1.0f))
        TC_FATAL("softmax_xent: label smoothing %g is outside [0, 1]", smoothing);
    double loss_sum = 0.0;
    double scale = grad_scale ? *grad_scale : 1.0;
    double grad_factor = n > 0 ? scale / n : 0.0;
    double eps = smoothing, off_target = eps / classes, on_target = 1.0 - eps + off_target;
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * classes;
        float *drow = dlogits + (size_t)i * classes;
        int label = labels[i];
        if (label < 0 || label >= classes)
            TC_FATAL("softmax_xent: label %d of row %d is outside [0, %d)", label, i, classes);
        double row_max = row[0];
        for (int j = 1; j < classes; j++)
            if (row[j] > row_max) row_max = row[j];
        double exp_sum = 0.0;
        for (int j = 0; j < classes; j++) exp_sum += exp((double)row[j] - row_max);
        loss_sum += row_max + log(exp_sum) - row[label];
        if (smoothing != 0.0f) {
            /* - sum_j q_j z_j = -(1 - eps) z_label - eps/classes sum_j z_j: the
             * -z_label above, plus eps * (z_label - mean_j z_j) */
            double row_sum = 0.0;
            for (int j = 0; j < classes; j++) row_sum += row[j];
            loss_sum += eps * ((double)row[label] - row_sum / classes);
        }
        for (int j = 0; j < classes; j++) {
            double prob = exp((double)row[j] - row_max) / exp_sum;
            double target = smoothing != 0.0f ? (j == label ? on_target : off_target) : (j == label);
            drow[j] = (float)((prob - target) * grad_factor);
        }
    }
    *loss = n > 0 ? (float)(loss_sum / n) : 0.0f;
}

void softmax_xent_smooth(const OpContext *ctx, const void *logits, const int32_t *labels, int n, int classes,
                         float smoothing, const float *grad_scale, float *loss, void *dlogits) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU)
        softmax_xent_smooth_cpu(logits, labels, n, classes, smoothing, grad_scale, loss, dlogits);
    else
        GPU_ONLY(softmax_xent_smooth_cuda(ctx->dtype, logits, labels, n, classes, smoothing, grad_scale, loss, dlogits,
                                          ctx->stream));
    op_end(ctx, __func__);
}
