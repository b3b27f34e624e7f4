/* Host side of the GPU transform: argument set-up and checks, and the plain C
 * reference of the kernel in gpu_transform.cu (same expressions, same order). */
#include "data/gpu_transform.h"

#include <string.h>

#include "runtime/check.h"

void gpu_transform_args_init(GpuTransformArgs *a, const TransformSpec *t, int c, int h, int w) {
    memset(a, 0, sizeof *a);
    a->c = c;
    a->h = h;
    a->w = w;
    a->out_h = t->out_h > 0 ? t->out_h : h;
    a->out_w = t->out_w > 0 ? t->out_w : w;
    memcpy(a->mean, t->mean, sizeof a->mean);
    memcpy(a->std, t->std, sizeof a->std);
    a->pad_reflect = t->pad_reflect != 0;
}

size_t gpu_transform_params_bytes(int batch) { return (size_t)batch * sizeof(TransformParams); }

size_t gpu_transform_raw_bytes(int batch, int c, int h, int w) {
    return (size_t)batch * c * h * w;
}

void gpu_transform_check_args(const GpuTransformArgs *a) {
    if (a->c < 1 || a->c > 3) TC_FATAL("gpu_transform: images need 1 to 3 channels, not %d", a->c);
    if (a->h < 1 || a->w < 1 || a->out_h < 1 || a->out_w < 1)
        TC_FATAL("gpu_transform: bad sizes %dx%d -> %dx%d", a->h, a->w, a->out_h, a->out_w);
    if (a->n < 0) TC_FATAL("gpu_transform: n = %d", a->n);
    for (int ch = 0; ch < a->c; ch++)
        if (!(a->std[ch] > 0.0f))
            TC_FATAL("gpu_transform: std[%d] = %g must be > 0", ch, a->std[ch]);
    if (a->n > 0 && (!a->raw_images || !a->params || !a->out))
        TC_FATAL("gpu_transform: raw_images, params and out must all be set");
    if (a->labels_out && !a->labels) TC_FATAL("gpu_transform: labels_out needs labels");
}

/* ---- the reference ------------------------------------------------------- */

/* One output coordinate's two bilinear source taps: PyTorch's source index,
 * align_corners = false, in float, as bilinear_taps in transform.c. */
typedef struct {
    int lo, hi;
    float wlo, whi;
} Tap;

static Tap bilinear_tap(int i, int in, float scale) {
    float src = scale * ((float)i + 0.5f) - 0.5f;
    if (src < 0.0f) src = 0.0f;
    int lo = (int)src;
    if (lo > in - 1) lo = in - 1;
    float frac = src - (float)lo;
    if (frac > 1.0f) frac = 1.0f;
    Tap t = {lo, lo + (lo < in - 1 ? 1 : 0), 1.0f - frac, frac};
    return t;
}

/* Pixel (gy, gx) of the cropped and flipped image, normalised; the zero padding
 * is the pixel value 0. */
static float gathered(const GpuTransformArgs *a, const uint8_t *image, const TransformParams *p,
                      int ch, int gy, int gx) {
    int sy = transform_pad_index(gy + p->crop_dy, a->h, a->pad_reflect);
    int sx = transform_pad_index((p->flip ? a->w - 1 - gx : gx) + p->crop_dx, a->w, a->pad_reflect);
    int inside = sy >= 0 && sx >= 0;
    int v = inside ? image[((size_t)ch * a->h + sy) * a->w + sx] : 0;
    return ((float)v / 255.0f - a->mean[ch]) / a->std[ch];
}

static int in_cutout(const TransformParams *p, int y, int x) {
    return y >= p->cutout_y0 && y < p->cutout_y1 && x >= p->cutout_x0 && x < p->cutout_x1;
}

static size_t out_index(const GpuTransformArgs *a, int i, int ch, int y, int x) {
    if (a->nhwc) return (((size_t)i * a->out_h + y) * a->out_w + x) * a->c + ch;
    return (((size_t)i * a->c + ch) * a->out_h + y) * a->out_w + x;
}

void gpu_transform_reference_cpu(const GpuTransformArgs *a) {
    gpu_transform_check_args(a);
    float scale_y = (float)a->h / (float)a->out_h, scale_x = (float)a->w / (float)a->out_w;
    for (int i = 0; i < a->n; i++) {
        int image_number = a->index ? a->index[i] : i;
        const uint8_t *image = a->raw_images + (size_t)image_number * a->c * a->h * a->w;
        const TransformParams *p = &a->params[i];
        if (a->labels_out) a->labels_out[i] = a->labels[image_number];
        for (int y = 0; y < a->out_h; y++) {
            Tap ty = bilinear_tap(y, a->h, scale_y);
            for (int x = 0; x < a->out_w; x++) {
                Tap tx = bilinear_tap(x, a->w, scale_x);
                for (int ch = 0; ch < a->c; ch++) {
                    /* Across, then down: the order of the CPU path's two passes. */
                    float top = tx.wlo * gathered(a, image, p, ch, ty.lo, tx.lo) +
                                tx.whi * gathered(a, image, p, ch, ty.lo, tx.hi);
                    float bottom = tx.wlo * gathered(a, image, p, ch, ty.hi, tx.lo) +
                                   tx.whi * gathered(a, image, p, ch, ty.hi, tx.hi);
                    float v = ty.wlo * top + ty.whi * bottom;
                    a->out[out_index(a, i, ch, y, x)] = in_cutout(p, y, x) ? 0.0f : v;
                }
            }
        }
    }
}
