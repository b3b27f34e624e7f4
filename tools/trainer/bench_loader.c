/* trainc bench-loader: the lab's task 2.1 grid. Loading plus copying alone, no
 * model: batch x workers x pinned, with the transform on the CPU (float batches
 * of the output size cross the bus) and on the GPU (uint8 batches of the stored
 * size cross the bus, one kernel makes the output). Prints samples/s as a table.
 *
 *   trainc bench-loader --config configs/dataloader.ini [--set k=v]... */
#include "tools/trainer/bench_loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/gpu_transform.h"
#include "data/loader.h"
#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"
#include "tools/trainer/train.h"

#define BENCH_SECONDS 0.6
#define BENCH_WARMUP_BATCHES 3

typedef struct {
    GpuContext *gpu;
    const Dataset *data;
    int image_size;
    float *device_images[2];   /* output batches, float NCHW */
    uint8_t *device_raw[2];    /* stored-size uint8 batches (gpu transform) */
    void *device_params[2];    /* per-sample transform parameters (gpu transform) */
    cudaEvent_t done[2];
} Bench;

/* Sends one batch to the device into buffer set s; on the GPU path the kernel
 * runs on the copy stream after the copy. */
static void send_batch(Bench *b, const LoaderConfig *lc, const Batch *batch, int s) {
    cudaStream_t stream = b->gpu->copy;
    if (lc->raw) {
        size_t raw_bytes = (size_t)batch->n * dataset_image_bytes(b->data);
        gpu_copy_to_device(b->device_raw[s], batch->raw_images, raw_bytes, stream);
        gpu_copy_to_device(b->device_params[s], batch->params, gpu_transform_params_bytes(batch->n), stream);
        GpuTransformArgs args;
        gpu_transform_args_init(&args, &lc->transform, b->data->c, b->data->h, b->data->w);
        args.raw_images = b->device_raw[s];
        args.params = b->device_params[s];
        args.n = batch->n;
        args.out = b->device_images[s];
        GPU_ONLY(gpu_transform_batch(&args, stream));
    } else {
        size_t bytes = (size_t)batch->n * 3 * b->image_size * b->image_size * sizeof(float);
        gpu_copy_to_device(b->device_images[s], batch->images, bytes, stream);
    }
    gpu_event_record(b->done[s], stream);
}

/* samples/s over BENCH_SECONDS (or the epoch, if shorter) after a warm-up. */
static double bench_one(Bench *b, const LoaderConfig *lc) {
    Loader *l = loader_create(b->data, lc);
    loader_start_epoch(l, 0);
    Batch held[2];
    int holding[2] = {0, 0};
    long samples = 0;
    double start = 0;
    for (int i = 0;; i++) {
        Batch batch;
        if (i == BENCH_WARMUP_BATCHES) {
            gpu_sync(b->gpu->copy);
            start = now_seconds();
            samples = 0;
        }
        int s = i & 1;
        if (holding[s]) { /* the buffer set's last batch must have landed first */
            gpu_event_sync(b->done[s]);
            loader_release(l, &held[s]);
            holding[s] = 0;
        }
        if (!loader_next(l, &batch)) break;
        send_batch(b, lc, &batch, s);
        held[s] = batch;
        holding[s] = 1;
        samples += batch.n;
        if (i >= BENCH_WARMUP_BATCHES && now_seconds() - start > BENCH_SECONDS) break;
    }
    gpu_sync(b->gpu->copy);
    double seconds = now_seconds() - start;
    for (int s = 0; s < 2; s++)
        if (holding[s]) loader_release(l, &held[s]);
    loader_destroy(l);
    return seconds > 0 ? samples / seconds : 0;
}

static void *device_buffer(size_t bytes, const char *what) {
    const char *error = NULL;
    void *p = gpu_try_malloc(bytes, &error);
    if (!p) TC_FATAL("bench-loader: cudaMalloc of %.1f MiB for %s failed: %s", bytes / 1048576.0, what, error);
    return p;
}

int bench_loader_main(const Config *cfg) {
    static const int batches[] = {32, 64, 128, 256};
    static const int workers[] = {0, 2, 4, 8};
    if (!TRAINC_CUDA)
        tc_fatal(NULL, 0, "trainc bench-loader measures copies to the GPU, and this trainc was built without CUDA "
                 "(TRAINC_CUDA=OFF)");
    if (gpu_count() == 0) TC_FATAL("bench-loader measures copies to the GPU, and no GPU is visible");
    TrainSettings set;
    settings_fill(cfg, &set);
    GpuContext gpu;
    gpu_context_init(&gpu, set.run.gpu);
    Dataset data;
    train_load_dataset(&set, &data, 1);
    Bench b = {.gpu = &gpu, .data = &data, .image_size = set.data.image_size};
    size_t out_bytes = (size_t)256 * 3 * b.image_size * b.image_size * sizeof(float);
    for (int s = 0; s < 2; s++) {
        b.device_images[s] = device_buffer(out_bytes, "output batches");
        b.device_raw[s] = device_buffer(256 * dataset_image_bytes(&data), "stored-size batches");
        b.device_params[s] = device_buffer(gpu_transform_params_bytes(256), "transform parameters");
        gpu_event_create(&b.done[s], 0);
    }
    printf("loading + copying alone, %d training images %dx%d -> %dx%d, flip %s, crop_pad %lld, on %s\n",
           data.n, data.h, data.w, b.image_size, b.image_size, set.data.flip == TRANSFORM_FLIP_ALTERNATE ? "alternate" : set.data.flip ? "on" : "off",
           (long long)set.data.crop_pad, gpu.name);
    printf("%-9s %5s %7s %6s %12s\n", "transform", "batch", "workers", "pinned", "samples/s");
    for (int on_gpu = 0; on_gpu < 2; on_gpu++)
        for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++)
            for (size_t wi = 0; wi < sizeof workers / sizeof *workers; wi++)
                for (int pinned = 0; pinned < 2; pinned++) {
                    LoaderConfig lc;
                    train_loader_config(&set, 1, &lc);
                    lc.batch = batches[bi];
                    lc.workers = workers[wi];
                    lc.pinned = pinned;
                    lc.raw = on_gpu;
                    double rate = bench_one(&b, &lc);
                    printf("%-9s %5d %7d %6s %12.0f\n", on_gpu ? "gpu" : "cpu", lc.batch, lc.workers,
                           pinned ? "on" : "off", rate);
                    fflush(stdout);
                }
    for (int s = 0; s < 2; s++) {
        gpu_free(b.device_images[s]);
        gpu_free(b.device_raw[s]);
        gpu_free(b.device_params[s]);
        gpu_event_destroy(b.done[s]);
    }
    dataset_free(&data);
    gpu_context_destroy(&gpu);
    return 0;
}
