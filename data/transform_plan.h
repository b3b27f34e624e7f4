/* Private to data/: a TransformSpec prepared once for one image size, so the
 * per-sample work is only the crop/flip gather and the two bilinear passes. */
#ifndef TRAINC_DATA_TRANSFORM_PLAN_H
#define TRAINC_DATA_TRANSFORM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "data/transform.h"

typedef struct {
    int c, h, w;         /* input image */
    int out_h, out_w;
    int flip, crop_pad, pad_reflect, cutout;
    float norm_lut[3][256]; /* (v/255 - mean)/std for each channel and byte value */
    /* Bilinear taps: output column x reads input columns col_lo[x], col_hi[x]
     * with weights col_wlo[x], col_whi[x]; the same for rows. */
    int *col_lo, *col_hi, *row_lo, *row_hi;
    float *col_wlo, *col_whi, *row_wlo, *row_whi;
    int identity;        /* out size == in size: no interpolation at all */
} TransformPlan;

/* c must be 1..3; out_h/out_w <= 0 keep the input size. */
void transform_plan_init(TransformPlan *p, const TransformSpec *t, int c, int h, int w);
void transform_plan_free(TransformPlan *p);
/* Floats of scratch memory transform_plan_apply needs (one buffer per thread). */
size_t transform_plan_scratch_floats(const TransformPlan *p);
/* transform_plan_draw, then transform_plan_apply_params. */
void transform_plan_apply(const TransformPlan *p, const uint8_t *src, uint64_t sample_seed,
                          float *scratch, float *dst);
/* The sample's random choices; the loader's raw mode hands these to the GPU. */
void transform_plan_draw(const TransformPlan *p, uint64_t sample_seed, TransformParams *out);
void transform_plan_apply_params(const TransformPlan *p, const uint8_t *src,
                                 const TransformParams *tp, float *scratch, float *dst);

#endif
