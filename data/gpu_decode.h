/* JPEG decoded on the GPU (data.decode = gpu): nvJPEG's batched decode, on the
 * card's hardware JPEG engines (NVJPG) where it has them, else nvJPEG's GPU
 * hybrid backend. A thread of its own takes the loader's encoded batches
 * (data/loader.h, encoded mode) in order, decodes each batch's JPEGs into one of
 * GPU_DECODE_RING device buffers on a stream of its own, copies in the
 * samples the CPU decoded (PNG, BMP, CMYK, progressive JPEG, what the engines
 * refuse) and each sample's crop box, and hands the batch over with an event;
 * the consumer makes the model's input from it with one kernel
 * (data/gpu_resample.h) on its own stream, which waits for that event, and
 * gives the buffer back with an event of its own. Nothing in the consumer's
 * stream waits for the host.
 *
 * Built with nvJPEG where CMake finds it (TRAINC_NVJPEG); without, creating a
 * decoder fails and says so. */
#ifndef TRAINC_DATA_GPU_DECODE_H
#define TRAINC_DATA_GPU_DECODE_H

#include <stddef.h>

#include "data/gpu_resample.h"
#include "data/loader.h"
#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPU_DECODE_RING 3

typedef struct GpuDecoder GpuDecoder;

/* A decoded batch on the device, valid until gpu_decoder_release. */
typedef struct {
    const uint8_t *images;          /* the decoded images */
    const ResampleSample *samples;  /* [n] their layout and crop boxes */
    const int32_t *labels;          /* [n] */
    int n, index;                   /* samples; batch number within the epoch */
    int ring;                       /* its buffer */
} DecodedBatch;

/* Where the decoder thread's time went. */
typedef struct {
    double wait_s;      /* in loader_next: the CPU workers were behind */
    double submit_s;    /* the host side of nvJPEG's decode and the copies */
    double decode_s;    /* the device side, from submit to the batch's event */
    long batches, gpu_images, cpu_images;
} GpuDecodeStages;

/* A decoder for the loader's encoded batches on CUDA device 'device', or NULL
 * with why (built without nvJPEG, nvJPEG failing to start); *backend: what it
 * runs on ("the hardware JPEG engines (NVJPG)", "nvJPEG's GPU hybrid backend").
 * The loader's consumer is this decoder from now on. */
GpuDecoder *gpu_decoder_create(Loader *loader, int device, int batch, char *why, size_t whylen, const char **backend);
/* Starts an epoch from batch first_batch (loader_start_epoch_at, by the decoder). */
void gpu_decoder_start_epoch(GpuDecoder *d, int epoch, int first_batch);
/* The next batch of the epoch, its work ordered before what 'consumer' runs
 * next; 0 at the epoch's end. A failed batch stops the run with its message. */
int gpu_decoder_next(GpuDecoder *d, DecodedBatch *out, cudaStream_t consumer);
/* The batch's buffer may be decoded into again once 'consumer' has run what it was given so far. */
void gpu_decoder_release(GpuDecoder *d, const DecodedBatch *b, cudaStream_t consumer);
/* Seconds the consumer's stream stood idle for its batches: from when it had
 * run what it was given before asking for a batch (or from the asking, if
 * later) to when it could start the batch's work, whether it waited for the
 * decode on the device or for its host, held in gpu_decoder_next until the
 * decoder had submitted the batch (the data wait). Counted as the waits pass,
 * with no sync. */
double gpu_decoder_wait_seconds(const GpuDecoder *d);
void gpu_decoder_stages(const GpuDecoder *d, GpuDecodeStages *out);
void gpu_decoder_destroy(GpuDecoder *d);

#ifdef __cplusplus
}
#endif
#endif
