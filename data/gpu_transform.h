/* The data transform on the GPU (data.transform_on = gpu): the loader in raw
 * mode hands over the stored uint8 images of a batch and each sample's
 * TransformParams; one kernel makes the float batch the model reads. For each
 * output pixel: crop with zero or reflect padding at the stored size, flip, bilinear resize
 * (align_corners = false), normalise, cutout, the same arithmetic in the same
 * order as the CPU path (data/transform.c), so both give the same floats.
 *
 * What the caller does per batch, all on one stream s:
 *   cudaMemcpyAsync(raw, batch.raw_images, n * c * h * w, H2D, s);
 *   cudaMemcpyAsync(params, batch.params, gpu_transform_params_bytes(n), H2D, s);
 *   gpu_transform_batch(&args, s);
 * and releases the loader batch only once the copies have finished.
 *
 * With the whole training set on the device (data.on_device), raw_images is
 * that set, index picks each sample's image in it (the epoch's permutation),
 * and the kernel gathers the labels too: nothing crosses the bus per batch. */
#ifndef TRAINC_DATA_GPU_TRANSFORM_H
#define TRAINC_DATA_GPU_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

#include "data/transform.h"
#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const uint8_t *raw_images;     /* device: [n][c][h][w], or [images][c][h][w] with index */
    const TransformParams *params; /* device: [n] */
    const int32_t *index;          /* device: [n] sample i's image in raw_images; NULL: image i */
    const int32_t *labels;         /* device, with labels_out: the labels of raw_images' images */
    int32_t *labels_out;           /* device: [n] labels[index[i]] (labels[i] without index);
                                      NULL: no labels */
    float *out;                    /* device: [n][c][out_h][out_w], or [n][out_h][out_w][c]
                                      with nhwc; rows from n on are not touched */
    int n;                         /* samples in the batch */
    int c, h, w;                   /* stored image: c in 1..3 */
    int out_h, out_w;              /* > 0 */
    int nhwc;                      /* 1: channels-last output */
    int pad_reflect;               /* the crop's padding: 1 reflect, 0 zero (TransformSpec) */
    float mean[3], std[3];         /* applied to pixel/255, as TransformSpec */
} GpuTransformArgs;

/* Sets the sizes, normalisation, padding mode and layout (NCHW) from the spec, as
 * the CPU path reads it (out size <= 0 keeps the stored size), and clears the
 * pointers and n.
 * The spec's crop, flip and cutout are not needed: the params carry them. */
void gpu_transform_args_init(GpuTransformArgs *a, const TransformSpec *t, int c, int h, int w);
/* Device bytes for a batch's params and for its stored images. */
size_t gpu_transform_params_bytes(int batch);
size_t gpu_transform_raw_bytes(int batch, int c, int h, int w);

/* Fails with a message on bad sizes, channels or std, a missing pointer, or
 * labels_out without labels. */
void gpu_transform_check_args(const GpuTransformArgs *a);

/* One kernel launch on stream s; no allocation, no sync. n = 0 does nothing.
 * CUDA builds only (gpu_transform.cu). */
void gpu_transform_batch(const GpuTransformArgs *a, cudaStream_t s);

/* The kernel's arithmetic on the CPU, pixel by pixel, with host pointers in the
 * same struct: the reference the kernel is tested against. */
void gpu_transform_reference_cpu(const GpuTransformArgs *a);

#ifdef __cplusplus
}
#endif
#endif
