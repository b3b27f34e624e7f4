/* Freezing a range of parameters after a number of optimizer steps, decided
 * on the device so that a captured CUDA graph follows it with no host work
 * (airbench's whitening bias trains for its first epochs only). It reads the
 * step counter that lr_schedule_step advances before the optimizer (the steps
 * begun, this one included: step s reads s + 1) and once the counter exceeds
 * 'steps' sets lr_scale[0..n) to 0: sgd.h's lr_scale, for which 0 leaves the
 * parameter and its momentum as they are. Step s trains the range while
 * s < steps. lr_scale is never raised again: a new run sets it afresh. */
#ifndef TRAINC_OPS_FREEZE_AFTER_H
#define TRAINC_OPS_FREEZE_AFTER_H

#include <stddef.h>
#include <stdint.h>

#include "ops/op_context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): step_counter and lr_scale in ctx's device memory. */
void freeze_after(const OpContext *ctx, const int64_t *step_counter, int64_t steps, float *lr_scale, size_t n);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void freeze_after_cpu(const int64_t *step_counter, int64_t steps, float *lr_scale, size_t n);
void freeze_after_cuda(const int64_t *step_counter_dev, int64_t steps, float *lr_scale_dev, size_t n,
                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
