/* The crop boxes (torchvision's arithmetic) and the CPU resample: a horizontal
 * pass over the rows the box reads, then a vertical one, which sums in the
 * order of data/resample.h's per-pixel form. */
#include "data/resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/decode.h"
#include "runtime/check.h"

double rng_uniform(uint64_t *state, double lo, double hi) {
    double u = (double)(rng_splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

/* Uniform in lo..hi inclusive. */
static int rng_int(uint64_t *state, int lo, int hi) {
    int v = lo + (int)rng_uniform(state, 0.0, (double)(hi - lo + 1));
    return v > hi ? hi : v;
}

/* Python's round(): halves to even. */
static int round_half_even(double x) { return (int)nearbyint(x); }

CropBox crop_random_resized(int w, int h, const CropRecipe *r, uint64_t *rng) {
    double area = (double)w * (double)h, log_lo = log(r->ratio_min), log_hi = log(r->ratio_max);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * rng_uniform(rng, r->scale_min, r->scale_max);
        double ratio = exp(rng_uniform(rng, log_lo, log_hi));
        int cw = round_half_even(sqrt(target * ratio)), ch = round_half_even(sqrt(target / ratio));
        if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
            int top = rng_int(rng, 0, h - ch), left = rng_int(rng, 0, w - cw);
            return (CropBox){(float)left, (float)top, (float)cw, (float)ch};
        }
    }
    double in_ratio = (double)w / (double)h;
    int cw = w, ch = h;
    if (in_ratio < r->ratio_min) ch = round_half_even(cw / r->ratio_min);
    else if (in_ratio > r->ratio_max) cw = round_half_even(ch * r->ratio_max);
    if (ch > h) ch = h;
    if (cw > w) cw = w;
    return (CropBox){(float)((w - cw) / 2), (float)((h - ch) / 2), (float)cw, (float)ch};
}

CropBox crop_center(int w, int h, int eval_resize, int out_h, int out_w) {
    int short_side = w <= h ? w : h, long_side = w <= h ? h : w;
    int new_long = (int)((double)eval_resize * long_side / short_side);
    int new_w = w <= h ? eval_resize : new_long, new_h = w <= h ? new_long : eval_resize;
    int top = round_half_even((new_h - out_h) / 2.0), left = round_half_even((new_w - out_w) / 2.0);
    double sx = (double)w / new_w, sy = (double)h / new_h;
    return (CropBox){(float)(left * sx), (float)(top * sy), (float)(out_w * sx), (float)(out_h * sy)};
}

void resample_reads(const CropBox *box, int full_w, int full_h, int out_h, int out_w, int *x0, int *y0, int *x1,
                    int *y1) {
    ResampleAxis ax = resample_axis(box->x0, box->w, out_w, full_w), ay = resample_axis(box->y0, box->h, out_h, full_h);
    double center;
    int lo, count;
    resample_span(&ax, 0, &center, x0);
    count = resample_span(&ax, out_w - 1, &center, &lo);
    *x1 = lo + count;
    resample_span(&ay, 0, &center, y0);
    count = resample_span(&ay, out_h - 1, &center, &lo);
    *y1 = lo + count;
}

void resample_scratch_free(ResampleScratch *s) {
    free(s->rows);
    free(s->weights);
    free(s->first);
    memset(s, 0, sizeof *s);
}


/* Axis taps into the scratch: first[i] and count weights a row of 'stride'. */
typedef struct {
    int *first;
    float *weights;
    int stride, out;
} AxisTaps;

static int max_span(const ResampleAxis *a, int out) {
    int most = 1;
    for (int i = 0; i < out; i++) {
        double center;
        int lo, count = resample_span(a, i, &center, &lo);
        if (count > most) most = count;
    }
    return most;
}

/* Weights of output i are w[i * stride + k], k < stride, zero past its span. */
static void fill_taps(const ResampleAxis *a, int out, AxisTaps *t) {
    for (int i = 0; i < out; i++) {
        double center;
        int lo, count = resample_span(a, i, &center, &lo);
        double norm = resample_weight_norm(a, center, lo, count);
        t->first[i] = lo;
        for (int k = 0; k < t->stride; k++)
            t->weights[(size_t)i * t->stride + k] = k < count ? resample_weight(a, center, lo + k, norm) : 0.0f;
    }
}

static AxisTaps axis_taps(ResampleScratch *s, const ResampleAxis *ax, int out_w, const ResampleAxis *ay, int out_h,
                          AxisTaps *rows) {
    int sx = max_span(ax, out_w), sy = max_span(ay, out_h);
    size_t weights = (size_t)out_w * sx + (size_t)out_h * sy, firsts = (size_t)out_w + out_h;
    s->weights = buffer_grow(s->weights, &s->weights_cap, weights * sizeof(float), "resample taps");
    s->first = buffer_grow(s->first, &s->first_cap, firsts * sizeof(int), "resample taps");
    AxisTaps cols = {s->first, s->weights, sx, out_w};
    *rows = (AxisTaps){s->first + out_w, s->weights + (size_t)out_w * sx, sy, out_h};
    fill_taps(ax, out_w, &cols);
    fill_taps(ay, out_h, rows);
    return cols;
}

/* A row of taps holds 'stride' weights, those past the output's span zero,
 * which add nothing; the span is cut where the decoded pixels end. */
static int span_count(const AxisTaps *t, int i, int limit) {
    int n = t->stride;
    if (t->first[i] + n > limit) n = limit - t->first[i];
    return n;
}

void resample_image(const ResampleSource *src, const CropBox *box, int flip, int out_h, int out_w,
                    const float mean[3], const float std[3], ResampleScratch *s, float *float_out,
                    uint8_t *u8_out) {
    ResampleAxis ax = resample_axis(box->x0, box->w, out_w, src->full_w);
    ResampleAxis ay = resample_axis(box->y0, box->h, out_h, src->full_h);
    AxisTaps rows_taps, cols = axis_taps(s, &ax, out_w, &ay, out_h, &rows_taps);
    int y0, y1, x0, x1;
    resample_reads(box, src->full_w, src->full_h, out_h, out_w, &x0, &y0, &x1, &y1);
    if (x0 < src->x0 || y0 < src->y0 || x1 > src->x0 + src->w || y1 > src->y0 + src->h)
        TC_FATAL("resample: the box reads [%d, %d) x [%d, %d), outside the decoded [%d, %d) x [%d, %d)", x0, x1, y0,
                 y1, src->x0, src->x0 + src->w, src->y0, src->y0 + src->h);
    int rows = y1 - y0;
    s->rows = buffer_grow(s->rows, &s->rows_cap, (size_t)rows * out_w * sizeof(float), "resample rows");
    size_t plane_out = (size_t)out_h * out_w;
    for (int ch = 0; ch < 3; ch++) {
        const uint8_t *plane = src->planes[ch];
        for (int r = 0; r < rows; r++) { /* across: every output column of the rows read */
            const uint8_t *row = plane + (size_t)(y0 + r - src->y0) * src->pitch;
            for (int c = 0; c < out_w; c++) {
                const float *w = cols.weights + (size_t)c * cols.stride;
                const uint8_t *p = row + (cols.first[c] - src->x0);
                int n = span_count(&cols, c, src->x0 + src->w);
                float acc = 0.0f;
                for (int k = 0; k < n; k++) acc = RS_FADD(acc, RS_FMUL(w[k], (float)p[k]));
                s->rows[(size_t)r * out_w + c] = acc;
            }
        }
        for (int y = 0; y < out_h; y++) { /* down, into the (flipped) output */
            const float *w = rows_taps.weights + (size_t)y * rows_taps.stride;
            int n = span_count(&rows_taps, y, y1), first = rows_taps.first[y] - y0;
            for (int x = 0; x < out_w; x++) {
                int c = resample_column(x, out_w, flip);
                float acc = 0.0f;
                for (int k = 0; k < n; k++) acc = RS_FADD(acc, RS_FMUL(w[k], s->rows[(size_t)(first + k) * out_w + c]));
                size_t at = ch * plane_out + (size_t)y * out_w + x;
                if (float_out) {
                    float_out[at] = resample_normalise(acc, mean[ch], std[ch]);
                } else {
                    float v = acc < 0.0f ? 0.0f : acc > 255.0f ? 255.0f : acc;
                    u8_out[at] = (uint8_t)(v + 0.5f);
                }
            }
        }
    }
}

float resample_pixel(const ResampleSource *src, const CropBox *box, int flip, int out_h, int out_w, int ch, int y,
                     int x) {
    ResampleAxis ax = resample_axis(box->x0, box->w, out_w, src->full_w);
    ResampleAxis ay = resample_axis(box->y0, box->h, out_h, src->full_h);
    double cy, cx;
    int ly, lx, ny = resample_span(&ay, y, &cy, &ly);
    int nx = resample_span(&ax, resample_column(x, out_w, flip), &cx, &lx);
    double norm_y = resample_weight_norm(&ay, cy, ly, ny), norm_x = resample_weight_norm(&ax, cx, lx, nx);
    float acc_y = 0.0f;
    for (int j = 0; j < ny; j++) {
        const uint8_t *row = src->planes[ch] + (size_t)(ly + j - src->y0) * src->pitch;
        float acc_x = 0.0f;
        for (int k = 0; k < nx; k++)
            acc_x = RS_FADD(acc_x, RS_FMUL(resample_weight(&ax, cx, lx + k, norm_x), (float)row[lx + k - src->x0]));
        acc_y = RS_FADD(acc_y, RS_FMUL(resample_weight(&ay, cy, ly + j, norm_y), acc_x));
    }
    return acc_y;
}
