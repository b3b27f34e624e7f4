/* Top-1 accuracy: how many rows of logits [n][classes] have their largest value
 * (first one on ties) at the label. The CUDA path ADDS its count to a device
 * counter, so an evaluation pass reads back once at its end. Its logits are
 * stored as dtype (f32, f16 or bf16), compared as their exact float values. */
#ifndef TRAINC_OPS_ACCURACY_H
#define TRAINC_OPS_ACCURACY_H

#include <stdint.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): ADDS the count to *count, logits of ctx->dtype,
 * everything in ctx's device memory. */
void accuracy_count(const OpContext *ctx, const void *logits, const int32_t *labels, int n, int classes,
                    int *count);

/* ---- The paths the face picks; tests call them to compare ---------------- */

int accuracy_count_cpu(const float *logits, const int32_t *labels, int n, int classes);
void accuracy_count_cuda(DType dtype, const void *logits, const int32_t *labels, int n,
                         int classes, int *count_device, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
