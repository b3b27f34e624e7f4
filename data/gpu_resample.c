/* The GPU resample's arguments, buffer layout and CPU reference. */
#include "data/gpu_resample.h"

#include <math.h>

#include "data/dataset.h"
#include "runtime/check.h"

#define RESAMPLE_PITCH_ALIGN 64

int gpu_resample_pitch(int w) { return (w + RESAMPLE_PITCH_ALIGN - 1) / RESAMPLE_PITCH_ALIGN * RESAMPLE_PITCH_ALIGN; }

size_t gpu_resample_image_bytes(int w, int h) { return 3 * (size_t)gpu_resample_pitch(w) * (size_t)h; }

void gpu_resample_check_args(const GpuResampleArgs *a) {
    if (a->n < 0 || a->out_h < 1 || a->out_w < 1 || a->out_h > DATASET_MAX_SIDE || a->out_w > DATASET_MAX_SIDE)
        TC_FATAL("gpu_resample: batch %d of %dx%d outputs", a->n, a->out_w, a->out_h);
    if (a->nhwc ? a->out_c < 3 : a->out_c != 3)
        TC_FATAL("gpu_resample: %d output channels (%s)", a->out_c, a->nhwc ? "NHWC: at least 3" : "NCHW: 3");
    if (a->out_dtype != DTYPE_F32 && !(a->nhwc && (a->out_dtype == DTYPE_F16 || a->out_dtype == DTYPE_BF16)))
        TC_FATAL("gpu_resample: output dtype %s (f32, or f16 and bf16 in NHWC)", dtype_name(a->out_dtype));
    if (a->n > 0 && (!a->images || !a->samples || !a->out)) TC_FATAL("gpu_resample: a missing buffer");
    if (a->labels_out && !a->labels) TC_FATAL("gpu_resample: labels_out without labels");
    for (int ch = 0; ch < 3; ch++)
        if (!(a->std[ch] > 0.0f) || !isfinite(a->std[ch]) || !isfinite(a->mean[ch]))
            TC_FATAL("gpu_resample: mean %g, std %g of channel %d", a->mean[ch], a->std[ch], ch);
}

void gpu_resample_reference_cpu(const GpuResampleArgs *a) {
    gpu_resample_check_args(a);
    if (a->out_dtype != DTYPE_F32) TC_FATAL("gpu_resample_reference_cpu: f32 outputs only");
    float *out = a->out;
    for (int s = 0; s < a->n; s++) {
        const ResampleSample *p = &a->samples[s];
        const uint8_t *image = a->images + p->offset;
        size_t plane = (size_t)p->pitch * p->h;
        ResampleSource src = {{image, image + plane, image + 2 * plane}, p->pitch, p->w, p->h, 0, 0, p->w, p->h};
        for (int y = 0; y < a->out_h; y++)
            for (int x = 0; x < a->out_w; x++)
                for (int ch = 0; ch < 3; ch++) {
                    float v = resample_normalise(resample_pixel(&src, &p->box, p->flip, a->out_h, a->out_w, ch, y, x),
                                                 a->mean[ch], a->std[ch]);
                    size_t pixel = ((size_t)s * a->out_h + y) * a->out_w + x;
                    if (a->nhwc) out[pixel * a->out_c + ch] = v;
                    else out[((size_t)s * 3 + ch) * a->out_h * a->out_w + (size_t)y * a->out_w + x] = v;
                }
        for (int c = 3; a->nhwc && c < a->out_c; c++)
            for (size_t pixel = (size_t)s * a->out_h * a->out_w; pixel < (size_t)(s + 1) * a->out_h * a->out_w; pixel++)
                out[pixel * a->out_c + c] = 0.0f;
        if (a->labels_out) a->labels_out[s] = a->labels[s];
    }
}
