/* Dropout in training, PyTorch's nn.Dropout(p): each element kept with
 * probability 1 - p and scaled by 1 / (1 - p), else 0; backward passes dy
 * through the same mask and scale. (Evaluation is the identity: the layer,
 * not this op, does that.)
 *
 * The mask is no buffer: it comes from a counter-based hash of a seed and a
 * step counter in device memory (DropoutCounter), the layer, and each
 * element's NCHW position (ops/dropout_math.h), so
 *   - the same (seed, step, layer) gives the same mask, in forward, in
 *     backward (which regenerates it) and in a checkpointed block's
 *     recompute, in NCHW and NHWC alike, on the CPU and the GPU;
 *   - a captured CUDA graph replays with a new mask once the step on the
 *     device moves (dropout_advance, captured with it): no host value changes.
 * y = x * (1 / (1 - p)) in float where kept, rounded once to the dtype (the
 * CPU reference is float32, the CUDA path stores dtype: f32, f16, bf16). y
 * may alias x, dx may alias dy. */
#ifndef TRAINC_OPS_DROPOUT_H
#define TRAINC_OPS_DROPOUT_H

#include <stddef.h>
#include <stdint.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What every dropout's masks follow, in device memory, so that a captured graph reads it there: the step
 * (dropout_advance moves it) and the run's seed. */
typedef struct {
    int64_t step;
    uint64_t seed;
} DropoutCounter;

/* One dropout: its layer picks its masks, p (in [0, 1)) the share of elements dropped. */
typedef struct {
    uint32_t layer;
    float p;
} DropoutMask;

/* The tensor: n images of c channels of a plane of h*w (c features and a plane of 1 for a matrix). */
typedef struct {
    int n, c, plane;
} DropoutShape;

/* p * 2^32: an element is kept where its hashed 32 bits are at or above it. */
uint32_t dropout_threshold(float p);
float dropout_scale(float p); /* 1 / (1 - p) */
/* Fails naming the problem: p outside [0, 1), a shape without elements. */
void dropout_check(const DropoutShape *s, const DropoutMask *k);

/* The face (op_context.h): x, y, dy and dx of ctx->dtype in ctx->nhwc's layout on ctx's device; the counter
 * in ctx's device memory. backward with accumulate adds to dx. */
void dropout_forward(const OpContext *ctx, const DropoutShape *s, const DropoutMask *k, const DropoutCounter *counter,
                     const void *x, void *y);
void dropout_backward(const OpContext *ctx, const DropoutShape *s, const DropoutMask *k,
                      const DropoutCounter *counter, const void *dy, void *dx, int accumulate);
/* counter->step += 1 on ctx's device (the training step's, inside its CUDA graph). */
void dropout_advance(const OpContext *ctx, DropoutCounter *counter);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* forward: accumulate 0; backward: x is dy, y is dx. */
void dropout_apply_cpu(const DropoutShape *s, int nhwc, const DropoutMask *k, const DropoutCounter *counter,
                       const float *x, float *y, int accumulate);
void dropout_apply_cuda(DType dtype, const DropoutShape *s, int nhwc, const DropoutMask *k,
                        const DropoutCounter *counter, const void *x, void *y, int accumulate, cudaStream_t stream);
void dropout_advance_cuda(DropoutCounter *counter, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
