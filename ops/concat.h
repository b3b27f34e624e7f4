/* Channel concat of two tensors with the same n, h and w, PyTorch's
 * torch.cat([a, b], dim=1): y [n][ca + cb][h][w] holds a's channels, then
 * b's (NHWC: y [n][h][w][ca + cb], each pixel a's channels then b's).
 * Backward splits dy into da and db, each overwritten or added to
 * (accumulate); a NULL one is skipped. A copy: the same values in every
 * dtype. The CPU path is float32, NCHW and NHWC; the CUDA path stores dtype
 * (f32, f16 or bf16). More than two inputs: concat them two at a time. */
#ifndef TRAINC_OPS_CONCAT_H
#define TRAINC_OPS_CONCAT_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n, ca, cb, plane; /* plane: h * w */
} ConcatShape;

/* The face (op_context.h): ctx->dtype in ctx->nhwc's layout on ctx's device. */
void concat_forward(const OpContext *ctx, const ConcatShape *s, const void *a, const void *b, void *y);
void concat_backward(const OpContext *ctx, const ConcatShape *s, const void *dy, void *da, void *db,
                     int accumulate_a, int accumulate_b);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* One input's part: t [n][c][plane] (NHWC [n][plane][c]) against channels [c0, c0 + c) of y, which has
 * channels in all. into: t is copied into y; else y's part into t (added to it under accumulate). The
 * one read is not written (the face's const inputs). */
typedef struct {
    int n, c, channels, c0, plane, nhwc;
} ConcatPart;
void concat_part_cpu(const ConcatPart *p, float *t, float *y, int into, int accumulate);
void concat_part_cuda(DType dtype, const ConcatPart *p, void *t, void *y, int into, int accumulate,
                      cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
