#include "ops/concat.h"

#include "runtime/check.h"

/* Element i of the part's tensor: its place in y. */
static size_t place_in_y(const ConcatPart *p, size_t i) {
    if (p->nhwc) return i / p->c * p->channels + p->c0 + i % p->c;
    size_t per_image = (size_t)p->c * p->plane;
    return i / per_image * p->channels * p->plane + (size_t)p->c0 * p->plane + i % per_image;
}

void concat_part_cpu(const ConcatPart *p, float *t, float *y, int into, int accumulate) {
    size_t n = (size_t)p->n * p->c * p->plane;
    for (size_t i = 0; i < n; i++) {
        size_t at = place_in_y(p, i);
        if (into) y[at] = t[i];
        else t[i] = accumulate ? t[i] + y[at] : y[at];
    }
}

static void concat_parts(const OpContext *ctx, const ConcatShape *s, ConcatPart parts[2]) {
    if (s->n < 0 || s->ca <= 0 || s->cb <= 0 || s->plane <= 0)
        TC_FATAL("concat: bad shape n=%d channels %d + %d plane=%d", s->n, s->ca, s->cb, s->plane);
    parts[0] = (ConcatPart){s->n, s->ca, s->ca + s->cb, 0, s->plane, ctx->nhwc};
    parts[1] = (ConcatPart){s->n, s->cb, s->ca + s->cb, s->ca, s->plane, ctx->nhwc};
}

static void run_part(const OpContext *ctx, const ConcatPart *p, void *t, void *y, int into, int accumulate) {
    if (ctx->device == DEVICE_CPU) concat_part_cpu(p, t, y, into, accumulate);
    else GPU_ONLY(concat_part_cuda(ctx->dtype, p, t, y, into, accumulate, ctx->stream));
}

void concat_forward(const OpContext *ctx, const ConcatShape *s, const void *a, const void *b, void *y) {
    ConcatPart parts[2];
    concat_parts(ctx, s, parts);
    op_begin(ctx, __func__);
    run_part(ctx, &parts[0], (void *)a, y, 1, 0); /* read, not written */
    run_part(ctx, &parts[1], (void *)b, y, 1, 0);
    op_end(ctx, __func__);
}

void concat_backward(const OpContext *ctx, const ConcatShape *s, const void *dy, void *da, void *db,
                     int accumulate_a, int accumulate_b) {
    ConcatPart parts[2];
    concat_parts(ctx, s, parts);
    op_begin(ctx, __func__);
    if (da) run_part(ctx, &parts[0], da, (void *)dy, 0, accumulate_a); /* dy read, not written */
    if (db) run_part(ctx, &parts[1], db, (void *)dy, 0, accumulate_b);
    op_end(ctx, __func__);
}
