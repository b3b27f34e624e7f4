/* The GPU side of the ImageNet recipe (data.decode = gpu): one kernel from a
 * batch of decoded images of any sizes to the model's normalised input: each
 * sample's crop box resampled as data/resample.h does (the same arithmetic in
 * the same order as the CPU path's), flipped, normalised by mean and std, and
 * written as float32 NCHW, or channels-last in float32, fp16 or bf16 with the
 * channels past the image's 3 set to zero (the model's padded NHWC input,
 * models/model.h's model_input_form), the labels beside. */
#ifndef TRAINC_DATA_GPU_RESAMPLE_H
#define TRAINC_DATA_GPU_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "data/resample.h"
#include "runtime/cuda_api.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One decoded image of the batch: planes R, G, B of h rows of pitch bytes, one
 * after the other from offset in the batch's image buffer. */
typedef struct {
    int64_t offset;
    int32_t pitch, w, h;
    int32_t flip;
    CropBox box;   /* in the image's pixels */
} ResampleSample;

typedef struct {
    const uint8_t *images;         /* device: the batch's decoded images */
    const ResampleSample *samples; /* device: [n] */
    const int32_t *labels;         /* device: [n], with labels_out */
    int32_t *labels_out;           /* device: [n] labels; NULL: none */
    void *out;                     /* device: [n][3][out_h][out_w] f32, or [n][out_h][out_w][out_c] with nhwc */
    DType out_dtype;               /* f32, or with nhwc f16 and bf16 too */
    int nhwc, out_c;               /* out_c >= 3 channels a pixel in NHWC (3 in NCHW) */
    int n, out_h, out_w;
    float mean[3], std[3];
} GpuResampleArgs;

/* Bytes of the images buffer a sample of w x h takes (its pitch rounded up,
 * its start aligned), and its pitch. */
int gpu_resample_pitch(int w);
size_t gpu_resample_image_bytes(int w, int h);

/* Fails with a message on bad sizes, channels, dtype or a missing pointer. */
void gpu_resample_check_args(const GpuResampleArgs *a);
/* One launch on stream s; n = 0 does nothing. CUDA builds only. */
void gpu_resample_batch(const GpuResampleArgs *a, cudaStream_t s);
/* The kernel's arithmetic on the CPU with host pointers, f32 outputs only
 * (the kernel's f16 and bf16 are these values rounded): the tests' reference. */
void gpu_resample_reference_cpu(const GpuResampleArgs *a);

#ifdef __cplusplus
}
#endif
#endif
