/* trainc bench-loader: the input pipeline alone, no model. On a set decoded
 * once with data.crop = pad, the lab's task 2.1 grid: batch x workers x pinned,
 * with the transform on the CPU (float batches of the output size cross the
 * bus) and on the GPU (uint8 batches of the stored size cross the bus, one
 * kernel makes the output). On streamed images (data.crop = random_resized),
 * the config's batch, workers and pinning for each way of decoding: the
 * threads making floats, the threads making uint8 crops the GPU normalises,
 * and nvJPEG on the GPU. Prints samples/s as a table.
 *
 *   trainc bench-loader --config configs/dataloader.ini [--set k=v]... */
#include "tools/trainer/bench_loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/gpu_decode.h"
#include "data/gpu_transform.h"
#include "data/loader.h"
#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"
#include "tools/trainer/train.h"

#define BENCH_SECONDS 0.6
#define BENCH_WARMUP_BATCHES 3
/* Streamed images: long enough to pass the ring's first fill. */
#define BENCH_STREAM_SECONDS 8.0

typedef struct {
    GpuContext *gpu;
    const Dataset *data;
    const Source *source;
    int image_size;
    int raw_c, raw_h, raw_w;   /* the uint8 images raw batches hold */
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
        size_t raw_bytes = gpu_transform_raw_bytes(batch->n, b->raw_c, b->raw_h, b->raw_w);
        gpu_copy_to_device(b->device_raw[s], batch->raw_images, raw_bytes, stream);
        gpu_copy_to_device(b->device_params[s], batch->params, gpu_transform_params_bytes(batch->n), stream);
        GpuTransformArgs args;
        gpu_transform_args_init(&args, &lc->transform, b->raw_c, b->raw_h, b->raw_w);
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
static double bench_one(Bench *b, const LoaderConfig *lc, double limit_s) {
    Loader *l = loader_create_source(b->source, lc);
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
        if (i >= BENCH_WARMUP_BATCHES && now_seconds() - start > limit_s) break;
    }
    gpu_sync(b->gpu->copy);
    double seconds = now_seconds() - start;
    for (int s = 0; s < 2; s++)
        if (holding[s]) loader_release(l, &held[s]);
    loader_destroy(l);
    return seconds > 0 ? samples / seconds : 0;
}

/* Streamed: samples/s of nvJPEG's decoder feeding the resample kernel into a
 * float batch (the trainer's path), over BENCH_STREAM_SECONDS after the warm-up. */
static double bench_gpu_decode(Bench *b, const LoaderConfig *lc, const TrainSettings *set) {
    LoaderConfig encoded = *lc;
    encoded.encoded = 1;
    Loader *l = loader_create_source(b->source, &encoded);
    char why[512];
    const char *backend;
    GpuDecoder *d = gpu_decoder_create(l, b->gpu->device_id, lc->batch, why, sizeof why, &backend);
    if (!d) {
        printf("  gpu decode: %s\n", why);
        loader_destroy(l);
        return 0;
    }
    gpu_decoder_start_epoch(d, 0, 0);
    long samples = 0;
    double start = 0;
    DecodedBatch batch;
    for (int i = 0; gpu_decoder_next(d, &batch, b->gpu->compute); i++) {
        GpuResampleArgs a = {.images = batch.images, .samples = batch.samples, .out = b->device_images[0],
                             .out_dtype = DTYPE_F32, .out_c = 3, .n = batch.n, .out_h = b->image_size,
                             .out_w = b->image_size};
        memcpy(a.mean, set->data.mean, sizeof a.mean);
        memcpy(a.std, set->data.std, sizeof a.std);
        GPU_ONLY(gpu_resample_batch(&a, b->gpu->compute));
        gpu_decoder_release(d, &batch, b->gpu->compute);
        if (i == BENCH_WARMUP_BATCHES) {
            gpu_sync(b->gpu->compute);
            start = now_seconds();
            samples = 0;
        }
        samples += batch.n;
        if (i > BENCH_WARMUP_BATCHES && now_seconds() - start > BENCH_STREAM_SECONDS) break;
    }
    gpu_sync(b->gpu->compute);
    double seconds = now_seconds() - start;
    GpuDecodeStages st;
    gpu_decoder_stages(d, &st);
    printf("  gpu decode by %s: %ld JPEGs on the GPU, %ld decoded on the CPU; decoder thread: %.2f s waiting for "
           "the loader, %.2f s submitting, %.2f s of device decode\n", backend, st.gpu_images, st.cpu_images,
           st.wait_s, st.submit_s, st.decode_s);
    gpu_decoder_destroy(d);
    loader_destroy(l);
    return seconds > 0 && start > 0 ? samples / seconds : 0;
}

/* Streamed: the config's batch, workers and pinning, for each way of decoding. */
static void bench_streamed(Bench *b, const TrainSettings *set) {
    static const char *names[] = {"cpu: threads make float batches", "cpu: threads make uint8, GPU normalises",
                                  "gpu: nvJPEG, then one kernel"};
    printf("the input pipeline alone, %d training images of any size -> %dx%d (data.crop = random_resized), "
           "batch %d, %d workers, pinned %s, on %s\n", b->source->n, b->image_size, b->image_size, set->train.batch,
           set->data.workers, set->data.pinned ? "on" : "off", b->gpu->name);
    printf("%-40s %12s\n", "decode", "samples/s");
    for (int way = 0; way < 3; way++) {
        LoaderConfig lc;
        train_loader_config(set, 1, &lc);
        lc.raw = way == 1;
        double rate = way < 2 ? bench_one(b, &lc, BENCH_STREAM_SECONDS) : bench_gpu_decode(b, &lc, set);
        printf("%-40s %12.0f\n", names[way], rate);
        fflush(stdout);
    }
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
    set.run.eval = 0;
    GpuContext gpu;
    gpu_context_init(&gpu, set.run.gpu);
    Source train, test;
    train_open_sources(&set, &train, &test);
    const Dataset *decoded = &train.decoded;
    int streamed = set.data.resized_crop;
    int batch_most = streamed ? set.train.batch : 256;
    Bench b = {.gpu = &gpu, .data = decoded, .source = &train, .image_size = set.data.image_size,
               .raw_c = streamed ? 3 : decoded->c, .raw_h = streamed ? set.data.image_size : decoded->h,
               .raw_w = streamed ? set.data.image_size : decoded->w};
    size_t out_bytes = (size_t)batch_most * 3 * b.image_size * b.image_size * sizeof(float);
    for (int s = 0; s < 2; s++) {
        b.device_images[s] = device_buffer(out_bytes, "output batches");
        b.device_raw[s] = device_buffer(gpu_transform_raw_bytes(batch_most, b.raw_c, b.raw_h, b.raw_w),
                                        "stored-size batches");
        b.device_params[s] = device_buffer(gpu_transform_params_bytes(batch_most), "transform parameters");
        gpu_event_create(&b.done[s], 0);
    }
    if (streamed) {
        bench_streamed(&b, &set);
        goto done;
    }
    printf("loading + copying alone, %d training images %dx%d -> %dx%d, flip %s, crop_pad %lld, on %s\n",
           decoded->n, decoded->h, decoded->w, b.image_size, b.image_size,
           set.data.flip == TRANSFORM_FLIP_ALTERNATE ? "alternate" : set.data.flip ? "on" : "off",
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
                    double rate = bench_one(&b, &lc, BENCH_SECONDS);
                    printf("%-9s %5d %7d %6s %12.0f\n", on_gpu ? "gpu" : "cpu", lc.batch, lc.workers,
                           pinned ? "on" : "off", rate);
                    fflush(stdout);
                }
done:
    for (int s = 0; s < 2; s++) {
        gpu_free(b.device_images[s]);
        gpu_free(b.device_raw[s]);
        gpu_free(b.device_params[s]);
        gpu_event_destroy(b.done[s]);
    }
    source_free(&train);
    source_free(&test);
    gpu_context_destroy(&gpu);
    return 0;
}
