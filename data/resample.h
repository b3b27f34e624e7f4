/* The ImageNet recipe's crops and the resample that makes them, on images of
 * any size: torchvision's RandomResizedCrop (training) and resize-then-centre-
 * crop (evaluation) as a box in the image, and PIL's antialiased bilinear
 * resample of that box to the output size (a triangle filter widened by the
 * downscale factor, as torchvision's default on PIL images), then the flip and
 * the normalisation.
 *
 * The taps are computed in double and the pixels summed in float, in the same
 * order on the CPU (resample.c) and the GPU (gpu_resample.cu): each output
 * value is sum_j wy_j * (sum_i wx_i * pixel), i along the row. The inline
 * functions below are that shared arithmetic. */
#ifndef TRAINC_DATA_RESAMPLE_H
#define TRAINC_DATA_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "data/transform.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A box in an image's continuous pixel coordinates: pixel i spans [i, i + 1). */
typedef struct {
    float x0, y0, w, h;
} CropBox;

/* The crop recipe: RandomResizedCrop's scale (area fraction) and ratio (width
 * over height) ranges; evaluation's shorter side before its centre crop. */
typedef struct {
    float scale_min, scale_max, ratio_min, ratio_max;
    int eval_resize;
} CropRecipe;

/* torchvision's RandomResizedCrop.get_params on a w x h image: ten tries of an
 * area and a log-uniform ratio, else the centre crop clamped to the ratio
 * range; integer boxes, as torchvision's. */
CropBox crop_random_resized(int w, int h, const CropRecipe *r, uint64_t *rng);
/* Resize(eval_resize) then CenterCrop(out_h x out_w), as torchvision computes
 * both (the long side truncated, the crop offsets rounded), as one box in the
 * stored image. eval_resize <= 0: the crop of the whole image's centre at
 * out_w / out_h's shape, as large as the image allows. */
CropBox crop_center(int w, int h, int eval_resize, int out_h, int out_w);
/* Uniform in [lo, hi) from the stream (doubles from 53 bits). */
double rng_uniform(uint64_t *state, double lo, double hi);

#ifdef __CUDACC__
#define RESAMPLE_HD __host__ __device__
#else
#define RESAMPLE_HD
#endif
/* On the device each operation rounds once, as on the host (no fused multiply-adds). */
#ifdef __CUDA_ARCH__
#define RS_DMUL(a, b) __dmul_rn(a, b)
#define RS_DADD(a, b) __dadd_rn(a, b)
#define RS_DDIV(a, b) __ddiv_rn(a, b)
#define RS_FMUL(a, b) __fmul_rn(a, b)
#define RS_FADD(a, b) __fadd_rn(a, b)
#define RS_FDIV(a, b) __fdiv_rn(a, b)
#else
#define RS_DMUL(a, b) ((a) * (b))
#define RS_DADD(a, b) ((a) + (b))
#define RS_DDIV(a, b) ((a) / (b))
#define RS_FMUL(a, b) ((a) * (b))
#define RS_FADD(a, b) ((a) + (b))
#define RS_FDIV(a, b) ((a) / (b))
#endif

/* One axis of the resample: the box [start, start + len) of a side of 'in'
 * pixels to 'out' pixels (PIL's precompute_coeffs with a box). */
typedef struct {
    double start, scale, support, inv_filter_scale;
    int in;
} ResampleAxis;

static inline RESAMPLE_HD ResampleAxis resample_axis(float start, float len, int out, int in) {
    ResampleAxis a;
    a.start = (double)start;
    a.scale = RS_DDIV((double)len, (double)out);
    double filter_scale = a.scale < 1.0 ? 1.0 : a.scale;
    a.support = filter_scale; /* the triangle's support, 1, widened */
    a.inv_filter_scale = RS_DDIV(1.0, filter_scale);
    a.in = in;
    return a;
}

/* Output i reads input pixels [*lo, *lo + count) (count returned, >= 1 for a box inside the image). */
static inline RESAMPLE_HD int resample_span(const ResampleAxis *a, int i, double *center, int *lo) {
    *center = RS_DADD(a->start, RS_DMUL((double)i + 0.5, a->scale));
    int first = (int)RS_DADD(RS_DADD(*center, -a->support), 0.5);
    int last = (int)RS_DADD(RS_DADD(*center, a->support), 0.5);
    if (first < 0) first = 0;
    if (last > a->in) last = a->in;
    *lo = first;
    return last - first;
}

/* The unnormalised weight of input pixel 'pixel' for the output at center. */
static inline RESAMPLE_HD double resample_tap(const ResampleAxis *a, double center, int pixel) {
    double x = RS_DMUL(RS_DADD(RS_DADD((double)pixel, -center), 0.5), a->inv_filter_scale);
    if (x < 0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* 1 / the sum of output i's raw weights: each weight is raw x that (PIL
 * divides by the sum; a product is the same to an ulp and cheaper on the GPU). */
static inline RESAMPLE_HD double resample_weight_norm(const ResampleAxis *a, double center, int lo, int count) {
    double sum = 0.0;
    for (int k = 0; k < count; k++) sum = RS_DADD(sum, resample_tap(a, center, lo + k));
    return sum != 0.0 ? RS_DDIV(1.0, sum) : 0.0;
}

static inline RESAMPLE_HD float resample_weight(const ResampleAxis *a, double center, int pixel, double norm) {
    return (float)RS_DMUL(resample_tap(a, center, pixel), norm);
}

/* Output index x of a flipped output reads the resample's column out_w - 1 - x. */
static inline RESAMPLE_HD int resample_column(int x, int out_w, int flip) { return flip ? out_w - 1 - x : x; }

/* (v/255 - mean)/std of a resampled value v in 0..255, as the GPU computes it. */
static inline RESAMPLE_HD float resample_normalise(float v, float mean, float std) {
    return RS_FDIV(RS_FADD(RS_FDIV(v, 255.0f), -mean), std);
}

/* A decoded image as the resample reads it: 3 planes of w x h (pitch bytes a
 * row), its first pixel at (x0, y0) of the full image of full_w x full_h that
 * the box's coordinates are in (a region decode, or the whole image). */
typedef struct {
    const uint8_t *planes[3];
    int pitch, w, h, x0, y0, full_w, full_h;
} ResampleSource;

/* The rows and columns [x0, x1) x [y0, y1) of the full image that resampling
 * box to out_h x out_w reads: what a region decode must cover. */
void resample_reads(const CropBox *box, int full_w, int full_h, int out_h, int out_w, int *x0, int *y0, int *x1,
                    int *y1);
/* What resample_image reuses from call to call (one per thread): the
 * horizontal pass's rows and the taps. Zero it to start; resample_scratch_free. */
typedef struct {
    float *rows, *weights;
    int *first;
    size_t rows_cap, weights_cap, first_cap; /* bytes */
} ResampleScratch;
void resample_scratch_free(ResampleScratch *s);

/* The box resampled to out_h x out_w, flipped left-right with flip, into:
 * float_out (3 x out_h x out_w, normalised by mean and std) or, with it NULL,
 * u8_out (3 x out_h x out_w, rounded to bytes: for the GPU's normalisation). */
void resample_image(const ResampleSource *src, const CropBox *box, int flip, int out_h, int out_w,
                    const float mean[3], const float std[3], ResampleScratch *scratch, float *float_out,
                    uint8_t *u8_out);

/* The same value of one output pixel computed alone (the per-pixel order the
 * GPU kernel uses): the tests' reference. Channel ch, row y, column x. */
float resample_pixel(const ResampleSource *src, const CropBox *box, int flip, int out_h, int out_w, int ch, int y,
                     int x);

#ifdef __cplusplus
}
#endif
#endif
