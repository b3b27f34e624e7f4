#include "ops/accuracy.h"

#include <stddef.h>

int accuracy_count_cpu(const float *logits, const int32_t *labels, int n, int classes) {
    int correct = 0;
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * classes;
        int best = 0;
        for (int j = 1; j < classes; j++)
            if (row[j] > row[best]) best = j; /* strict: the first maximum wins ties */
        correct += best == labels[i];
    }
    return correct;
}

void accuracy_count(const OpContext *ctx, const void *logits, const int32_t *labels, int n, int classes,
                    int *count) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) *count += accuracy_count_cpu(logits, labels, n, classes);
    else GPU_ONLY(accuracy_count_cuda(ctx->dtype, logits, labels, n, classes, count, ctx->stream));
    op_end(ctx, __func__);
}
