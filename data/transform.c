#include "data/transform.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "data/dataset.h"
#include "data/transform_plan.h"
#include "runtime/check.h"

void transform_spec_default(TransformSpec *t, int out_h, int out_w) {
    static const float cifar10_mean[3] = {0.4914f, 0.4822f, 0.4465f};
    static const float cifar10_std[3] = {0.2470f, 0.2435f, 0.2616f};
    memset(t, 0, sizeof *t);
    t->out_h = out_h;
    t->out_w = out_w;
    memcpy(t->mean, cifar10_mean, sizeof cifar10_mean);
    memcpy(t->std, cifar10_std, sizeof cifar10_std);
}

uint64_t rng_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int transform_alternate_flip(uint64_t seed, int epoch, int64_t sample) {
    uint64_t state = rng_sample_seed(seed ^ 0xA17E57A7E0F11FULL, 0, sample); /* not epoch 0's draws */
    return (int)(rng_splitmix64(&state) >> 63) ^ (epoch & 1);
}

uint64_t rng_sample_seed(uint64_t seed, int epoch, int64_t sample) {
    uint64_t state = seed;
    uint64_t h = rng_splitmix64(&state);
    state = h ^ (uint64_t)(int64_t)epoch;
    h = rng_splitmix64(&state);
    state = h ^ (uint64_t)sample;
    return rng_splitmix64(&state);
}

/* Uniform in [0, bound) without modulo bias worth mentioning (bound < 2^32). */
static uint32_t rng_below(uint64_t *state, uint32_t bound) {
    return (uint32_t)(((rng_splitmix64(state) >> 32) * (uint64_t)bound) >> 32);
}

void shuffle_indices(int32_t *idx, int n, uint64_t seed, int epoch) {
    /* A stream of its own, apart from the per-sample augmentation seeds. */
    uint64_t state = rng_sample_seed(seed ^ 0x73687566666c65ULL, epoch, -1);
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(&state, (uint32_t)i + 1);
        int32_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* PyTorch's bilinear source index, align_corners = False, in float as its CPU kernel. */
static void bilinear_taps(int in, int out, int *lo, int *hi, float *wlo, float *whi) {
    float scale = (float)in / (float)out;
    for (int i = 0; i < out; i++) {
        float src = scale * ((float)i + 0.5f) - 0.5f;
        if (src < 0.0f) src = 0.0f;
        int i0 = (int)src;
        if (i0 > in - 1) i0 = in - 1;
        float frac = src - (float)i0;
        if (frac > 1.0f) frac = 1.0f;
        lo[i] = i0;
        hi[i] = i0 + (i0 < in - 1 ? 1 : 0);
        whi[i] = frac;
        wlo[i] = 1.0f - frac;
    }
}

/* Every size, offset and index of the transform stays far inside an int when
 * sides, crop_pad and cutout are at most DATASET_MAX_SIDE. */
static void check_spec(const TransformSpec *t, int c, int h, int w, int out_h, int out_w) {
    if (c < 1 || c > 3) TC_FATAL("transform: images need 1 to 3 channels, not %d", c);
    if (h < 1 || w < 1 || h > DATASET_MAX_SIDE || w > DATASET_MAX_SIDE)
        TC_FATAL("transform: image size %dx%d (height x width); each side must be 1 to %d", h, w,
                 DATASET_MAX_SIDE);
    if (out_h > DATASET_MAX_SIDE || out_w > DATASET_MAX_SIDE)
        TC_FATAL("transform: output size %dx%d (height x width); each side must be at most %d",
                 out_h, out_w, DATASET_MAX_SIDE);
    if (t->crop_pad > DATASET_MAX_SIDE)
        TC_FATAL("transform: crop_pad = %d; it must be at most %d", t->crop_pad, DATASET_MAX_SIDE);
    if (t->cutout > DATASET_MAX_SIDE)
        TC_FATAL("transform: cutout = %d; it must be at most %d", t->cutout, DATASET_MAX_SIDE);
    for (int ch = 0; ch < c; ch++) {
        if (!isfinite(t->mean[ch]))
            TC_FATAL("transform: mean[%d] = %g must be a finite number", ch, t->mean[ch]);
        if (!(t->std[ch] > 0.0f) || !isfinite(t->std[ch]))
            TC_FATAL("transform: std[%d] = %g must be a finite number > 0", ch, t->std[ch]);
    }
}

void transform_plan_init(TransformPlan *p, const TransformSpec *t, int c, int h, int w) {
    check_spec(t, c, h, w, t->out_h, t->out_w);
    memset(p, 0, sizeof *p);
    p->c = c;
    p->h = h;
    p->w = w;
    p->out_h = t->out_h > 0 ? t->out_h : h;
    p->out_w = t->out_w > 0 ? t->out_w : w;
    p->flip = t->flip;
    p->crop_pad = t->crop_pad > 0 ? t->crop_pad : 0;
    p->pad_reflect = t->pad_reflect != 0;
    p->cutout = t->cutout > 0 ? t->cutout : 0;
    p->identity = p->out_h == h && p->out_w == w;
    for (int ch = 0; ch < c; ch++) {
        for (int v = 0; v < 256; v++)
            p->norm_lut[ch][v] = ((float)v / 255.0f - t->mean[ch]) / t->std[ch];
    }
    size_t taps = (size_t)p->out_w + (size_t)p->out_h;
    int *ints = malloc(2 * taps * sizeof(int));
    float *floats = malloc(2 * taps * sizeof(float));
    if (!ints || !floats) TC_FATAL("transform: out of memory for the resize tables");
    p->col_lo = ints;
    p->col_hi = ints + p->out_w;
    p->row_lo = ints + 2 * p->out_w;
    p->row_hi = p->row_lo + p->out_h;
    p->col_wlo = floats;
    p->col_whi = floats + p->out_w;
    p->row_wlo = floats + 2 * p->out_w;
    p->row_whi = p->row_wlo + p->out_h;
    bilinear_taps(w, p->out_w, p->col_lo, p->col_hi, p->col_wlo, p->col_whi);
    bilinear_taps(h, p->out_h, p->row_lo, p->row_hi, p->row_wlo, p->row_whi);
}

void transform_plan_free(TransformPlan *p) {
    free(p->col_lo);
    free(p->col_wlo);
    memset(p, 0, sizeof *p);
}

size_t transform_plan_scratch_floats(const TransformPlan *p) {
    /* The cropped, flipped, normalised input, then the rows resized across. */
    return (size_t)p->c * p->h * p->w + (size_t)p->c * p->h * p->out_w;
}

/* Crop (zero or reflect padding), flip and normalise into a float image of the
 * input size. Normalising before the resize gives the same values as after it
 * (the bilinear weights sum to 1) at a fraction of the cost. */
static void gather_normalized(const TransformPlan *p, const uint8_t *src, int dy, int dx, int flip,
                              float *out) {
    int h = p->h, w = p->w;
    for (int ch = 0; ch < p->c; ch++) {
        const float *lut = p->norm_lut[ch];
        const uint8_t *plane = src + (size_t)ch * h * w;
        float *out_plane = out + (size_t)ch * h * w;
        for (int y = 0; y < h; y++) {
            float *out_row = out_plane + (size_t)y * w;
            int sy = transform_pad_index(y + dy, h, p->pad_reflect);
            if (sy < 0) {
                for (int x = 0; x < w; x++) out_row[x] = lut[0];
                continue;
            }
            const uint8_t *src_row = plane + (size_t)sy * w;
            for (int x = 0; x < w; x++) {
                int sx = transform_pad_index((flip ? w - 1 - x : x) + dx, w, p->pad_reflect);
                out_row[x] = sx >= 0 ? lut[src_row[sx]] : lut[0];
            }
        }
    }
}

/* out = wa * a + wb * b. The output (a batch in a ring slot) is far larger than
 * the caches and is next read by the GPU copy, so on x86 it is written with
 * streaming stores: without them every line is first read in, doubling the
 * memory traffic that bounds the loader. */
static void blend_rows(const float *restrict a, const float *restrict b, float wa, float wb,
                       float *restrict out, int n) {
    int x = 0;
#if defined(__SSE2__)
    if (((uintptr_t)out & 15) == 0) {
        __m128 va = _mm_set1_ps(wa), vb = _mm_set1_ps(wb);
        for (; x + 4 <= n; x += 4) {
            __m128 va_x = _mm_mul_ps(va, _mm_loadu_ps(a + x));
            __m128 vb_x = _mm_mul_ps(vb, _mm_loadu_ps(b + x));
            _mm_stream_ps(out + x, _mm_add_ps(va_x, vb_x));
        }
    }
#endif
    for (; x < n; x++) out[x] = wa * a[x] + wb * b[x];
}

static void resize_bilinear(const TransformPlan *p, const float *in, float *across, float *dst) {
    int h = p->h, w = p->w, out_h = p->out_h, out_w = p->out_w;
    const int *col_lo = p->col_lo, *col_hi = p->col_hi;
    const float *col_wlo = p->col_wlo, *col_whi = p->col_whi;
    for (int r = 0; r < p->c * h; r++) {
        const float *in_row = in + (size_t)r * w;
        float *out_row = across + (size_t)r * out_w;
        for (int x = 0; x < out_w; x++)
            out_row[x] = col_wlo[x] * in_row[col_lo[x]] + col_whi[x] * in_row[col_hi[x]];
    }
    for (int ch = 0; ch < p->c; ch++) {
        const float *plane = across + (size_t)ch * h * out_w;
        float *out_plane = dst + (size_t)ch * out_h * out_w;
        for (int y = 0; y < out_h; y++) {
            blend_rows(plane + (size_t)p->row_lo[y] * out_w, plane + (size_t)p->row_hi[y] * out_w,
                       p->row_wlo[y], p->row_whi[y], out_plane + (size_t)y * out_w, out_w);
        }
    }
#if defined(__SSE2__)
    _mm_sfence(); /* streaming stores visible before the batch is handed over */
#endif
}

/* The half-open range [lo, hi) of a cutout side centred at 'centre', clipped to [0, size). */
static void cutout_range(int centre, int side, int size, int32_t *lo, int32_t *hi) {
    int first = centre - side / 2, last = first + side;
    *lo = first < 0 ? 0 : first;
    *hi = last > size ? size : last;
}

void transform_draw_flip_cutout(uint64_t *rng, int flip, int cutout, int out_h, int out_w, TransformParams *out) {
    out->flip = flip && (rng_splitmix64(rng) >> 63);
    if (cutout > 0) {
        int cy = (int)rng_below(rng, (uint32_t)out_h);
        int cx = (int)rng_below(rng, (uint32_t)out_w);
        cutout_range(cy, cutout, out_h, &out->cutout_y0, &out->cutout_y1);
        cutout_range(cx, cutout, out_w, &out->cutout_x0, &out->cutout_x1);
    }
}

void transform_plan_draw(const TransformPlan *p, uint64_t sample_seed, TransformParams *out) {
    /* The random draws, in this order: crop row offset, crop column offset,
     * flip, cutout centre row, cutout centre column. */
    uint64_t rng = sample_seed;
    memset(out, 0, sizeof *out);
    if (p->crop_pad > 0) {
        uint32_t offsets = 2 * (uint32_t)p->crop_pad + 1;
        out->crop_dy = (int32_t)rng_below(&rng, offsets) - p->crop_pad;
        out->crop_dx = (int32_t)rng_below(&rng, offsets) - p->crop_pad;
    }
    transform_draw_flip_cutout(&rng, p->flip, p->cutout, p->out_h, p->out_w, out);
}

void transform_apply_cutout(const TransformParams *tp, int c, int out_h, int out_w, float *dst) {
    int width = tp->cutout_x1 - tp->cutout_x0;
    if (tp->cutout_y1 <= tp->cutout_y0 || width <= 0) return;
    for (int ch = 0; ch < c; ch++)
        for (int y = tp->cutout_y0; y < tp->cutout_y1; y++) {
            float *row = dst + ((size_t)ch * out_h + y) * out_w;
            memset(row + tp->cutout_x0, 0, (size_t)width * sizeof(float));
        }
}

void transform_plan_apply_params(const TransformPlan *p, const uint8_t *src,
                                 const TransformParams *tp, float *scratch, float *dst) {
    if (p->identity) {
        gather_normalized(p, src, tp->crop_dy, tp->crop_dx, tp->flip, dst);
    } else {
        float *gathered = scratch;
        float *across = scratch + (size_t)p->c * p->h * p->w;
        gather_normalized(p, src, tp->crop_dy, tp->crop_dx, tp->flip, gathered);
        resize_bilinear(p, gathered, across, dst);
    }
    transform_apply_cutout(tp, p->c, p->out_h, p->out_w, dst);
}

void transform_plan_apply(const TransformPlan *p, const uint8_t *src, uint64_t sample_seed,
                          float *scratch, float *dst) {
    TransformParams tp;
    transform_plan_draw(p, sample_seed, &tp);
    transform_plan_apply_params(p, src, &tp, scratch, dst);
}

void transform_sample(const TransformSpec *t, const uint8_t *src, int c, int h, int w,
                      uint64_t sample_seed, float *dst) {
    TransformPlan plan;
    transform_plan_init(&plan, t, c, h, w);
    float *scratch = malloc(transform_plan_scratch_floats(&plan) * sizeof(float));
    if (!scratch) TC_FATAL("transform: out of memory for scratch");
    transform_plan_apply(&plan, src, sample_seed, scratch, dst);
    free(scratch);
    transform_plan_free(&plan);
}
