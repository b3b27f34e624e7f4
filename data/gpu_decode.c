/* nvJPEG's batched decode on a thread of its own (data/gpu_decode.h). A ring
 * buffer's life: FREE, BUSY (the thread fills it), READY (handed over with its
 * 'ready' event), HELD (the consumer's), FREE again once the consumer gave it
 * back with its 'consumed' event, which the next fill's stream waits for. */
#include "data/gpu_decode.h"

#include <stdio.h>
#include <string.h>

#include "runtime/check.h"

#if TRAINC_CUDA && TRAINC_NVJPEG

#include <nvjpeg.h>
#include <pthread.h>
#include <stdlib.h>

#include "data/decode.h"
#include "runtime/log.h"

static const char *nvjpeg_status_name(nvjpegStatus_t s) {
    switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure (out of memory)";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    default: return "unknown status";
    }
}

#define NVJPEG_CHECK(call) do { nvjpegStatus_t e_ = (call); \
    if (e_ != NVJPEG_STATUS_SUCCESS) tc_fatal(__FILE__, __LINE__, "%s failed: %s (%d)", #call, \
        nvjpeg_status_name(e_), (int)e_); } while (0)

enum { RING_FREE, RING_BUSY, RING_READY, RING_HELD };

/* One batch's wait on the consumer's stream: 'arrived' passes once the stream
 * is done with what it had when the consumer asked for the batch, 'started'
 * once it can run the batch's work. Between the two it waits for the data:
 * for the decode on the device, or for its host, held in gpu_decoder_next
 * until the decoder submitted the batch. */
typedef struct {
    cudaEvent_t arrived, started;
    int pending;                    /* recorded, not counted yet */
} ConsumerWait;
#define CONSUMER_WAITS 8

typedef struct {
    uint8_t *images;                /* device */
    size_t cap;
    ResampleSample *samples_dev;    /* device [batch] */
    int32_t *labels_dev;
    ResampleSample *samples_host;   /* pinned [batch] */
    int32_t *labels_host;
    uint8_t *cpu_images;            /* pinned [batch][3][out_h][out_w]: what this thread decoded itself */
    cudaEvent_t ready, consumed, submitted;
    int consumed_recorded;
    int state, index, n;
    /* Each buffer decodes on its own stream with its own nvJPEG state, so that
     * the engines work on several batches at once. */
    cudaStream_t stream;
    nvjpegJpegState_t jpeg;
    int jpeg_batch;      /* the batch size its state was initialised for (0: none) */
    Batch held;          /* the loader's batch whose bytes its decode may still read */
    int holding;
} RingBuffer;

struct GpuDecoder {
    Loader *loader;
    const Source *source;
    int device, batch, out_h, out_w;
    nvjpegHandle_t handle;
    nvjpegJpegStream_t parsed;
    int hardware;
    int holding_most;   /* loader batches held at once: fewer than the loader's prefetch */
    RingBuffer ring[GPU_DECODE_RING];
    const unsigned char **data;     /* [batch] the JPEGs nvJPEG decodes in one call */
    size_t *lengths;
    nvjpegImage_t *dests;
    DecodeBuffers decode;           /* the samples nvJPEG refuses, decoded here */
    ResampleScratch resample;

    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int stopping;
    int generation;                 /* bumped by each start_epoch: a fill of an older one is dropped */
    int start_pending, start_epoch, start_batch;
    int active;                     /* an epoch is being produced */
    int produced, handed, epoch_done;
    char *error;
    /* Statistics: the thread's (under the lock) and the consumer's. */
    GpuDecodeStages stages;
    double device_wait_s;           /* the consumer's stream waiting for its batches (under the lock) */
    ConsumerWait waits[CONSUMER_WAITS]; /* the consumer's, recorded in turn */
    int next_wait;
};

/* ---- filling a buffer --------------------------------------------------------- */

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Room for 'bytes' of images; growing waits for the consumer to be done with the old buffer. */
static void ensure_images(GpuDecoder *d, RingBuffer *r, size_t bytes) {
    if (bytes <= r->cap) return;
    if (r->consumed_recorded) CUDA_CHECK(cudaEventSynchronize(r->consumed));
    CUDA_CHECK(cudaStreamSynchronize(r->stream));
    size_t cap = bytes + bytes / 4;
    if (r->images) CUDA_CHECK(cudaFree(r->images));
    if (cudaMalloc((void **)&r->images, cap) != cudaSuccess)
        TC_USER_ERROR("out of GPU memory: %.1f MiB for a batch of decoded images (data.decode = gpu); try "
                      "data.decode = cpu or a smaller train.batch", cap / 1048576.0);
    if (r->cap) log_info("data.decode = gpu: a batch's decoded images take %.1f MiB: buffer grown", cap / 1048576.0);
    r->cap = cap;
}

/* The sample decoded and resampled on the CPU, into the buffer's host crops. */
static void decode_here(GpuDecoder *d, RingBuffer *r, const Batch *b, int i) {
    const EncodedSample *e = &b->samples[i];
    char name[4400], err[4600];
    source_sample_name(d->source, e->index, name, sizeof name);
    DecodedImage image;
    if (image_decode(b->encoded + e->offset, (size_t)e->bytes, name, NULL, &d->decode, &image, err, sizeof err) != 0)
        TC_USER_ERROR("%s (data.decode = gpu: nvJPEG refused it too)", err);
    size_t plane = (size_t)image.w * image.h;
    ResampleSource src = {{image.pixels, image.pixels + plane, image.pixels + 2 * plane}, image.w, image.w, image.h,
                          0, 0, image.w, image.h};
    static const float zero[3] = {0, 0, 0}, one[3] = {1, 1, 1};
    resample_image(&src, &e->box, 0, d->out_h, d->out_w, zero, one, &d->resample, NULL,
                   r->cpu_images + (size_t)i * 3 * d->out_h * d->out_w);
}

/* A host-made crop (the loader's or this thread's) copied into its place. */
static void copy_crop(GpuDecoder *d, RingBuffer *r, const ResampleSample *p, const uint8_t *crop) {
    CUDA_CHECK(cudaMemcpy2DAsync(r->images + p->offset, (size_t)p->pitch, crop, (size_t)d->out_w, (size_t)d->out_w,
                                 3 * (size_t)d->out_h, cudaMemcpyHostToDevice, r->stream));
}

/* Whether nvJPEG's batched decode takes the file (the hardware engines take
 * fewer kinds than the hybrid backend, which takes what the loader sends). */
static int decodable(GpuDecoder *d, const uint8_t *bytes, size_t len) {
    if (nvjpegJpegStreamParseHeader(d->handle, bytes, len, d->parsed) != NVJPEG_STATUS_SUCCESS) return 0;
    if (!d->hardware) return 1;
    int unsupported = 1;
    if (nvjpegDecodeBatchedSupported(d->handle, d->parsed, &unsupported) != NVJPEG_STATUS_SUCCESS) return 0;
    return unsupported == 0;
}


static void fill_buffer(GpuDecoder *d, RingBuffer *r, const Batch *b) {
    int out_pitch = gpu_resample_pitch(d->out_w);
    size_t total = 0;
    for (int i = 0; i < b->n; i++) {
        const EncodedSample *e = &b->samples[i];
        int w = e->fallback ? d->out_w : e->w, h = e->fallback ? d->out_h : e->h;
        r->samples_host[i] = (ResampleSample){(int64_t)total, gpu_resample_pitch(w), w, h, e->flip, e->box};
        r->labels_host[i] = b->labels[i];
        /* Room for a crop made here instead, should nvJPEG refuse the file. */
        size_t image = gpu_resample_image_bytes(w, h), crop = gpu_resample_image_bytes(d->out_w, d->out_h);
        total += align_up(image > crop ? image : crop, 256);
    }
    if (r->consumed_recorded) CUDA_CHECK(cudaStreamWaitEvent(r->stream, r->consumed, 0));
    ensure_images(d, r, total);
    CUDA_CHECK(cudaEventRecord(r->submitted, r->stream));
    int m = 0, cpu = 0;
    for (int i = 0; i < b->n; i++) {
        const EncodedSample *e = &b->samples[i];
        ResampleSample *p = &r->samples_host[i];
        if (e->fallback) {
            copy_crop(d, r, p, b->fallback + (size_t)i * 3 * d->out_h * d->out_w);
            cpu++;
            continue;
        }
        const uint8_t *bytes = b->encoded + e->offset;
        if (!decodable(d, bytes, (size_t)e->bytes)) { /* made here; its place was sized for the whole image */
            decode_here(d, r, b, i);
            *p = (ResampleSample){p->offset, out_pitch, d->out_w, d->out_h, e->flip, {0, 0, (float)d->out_w,
                                  (float)d->out_h}};
            copy_crop(d, r, p, r->cpu_images + (size_t)i * 3 * d->out_h * d->out_w);
            cpu++;
            continue;
        }
        d->data[m] = bytes;
        d->lengths[m] = (size_t)e->bytes;
        memset(&d->dests[m], 0, sizeof d->dests[m]);
        for (int c = 0; c < 3; c++) {
            d->dests[m].channel[c] = r->images + p->offset + (size_t)c * p->pitch * p->h;
            d->dests[m].pitch[c] = (size_t)p->pitch;
        }
        m++;
    }
    if (m > 0) {
        /* Initialised again only for another size: it may free and allocate device memory, which waits for
         * the whole device, the training step included. */
        if (r->jpeg_batch != m)
            NVJPEG_CHECK(nvjpegDecodeBatchedInitialize(d->handle, r->jpeg, m, 1, NVJPEG_OUTPUT_RGB));
        r->jpeg_batch = m;
        nvjpegStatus_t status = nvjpegDecodeBatched(d->handle, r->jpeg, d->data, d->lengths, d->dests, r->stream);
        if (status != NVJPEG_STATUS_SUCCESS)
            TC_USER_ERROR("data.decode = gpu: nvJPEG's batched decode of batch %d failed: %s (a corrupt JPEG: "
                          "data.decode = cpu names the file)", b->index, nvjpeg_status_name(status));
    }
    CUDA_CHECK(cudaMemcpyAsync(r->samples_dev, r->samples_host, (size_t)b->n * sizeof *r->samples_host,
                               cudaMemcpyHostToDevice, r->stream));
    CUDA_CHECK(cudaMemcpyAsync(r->labels_dev, r->labels_host, (size_t)b->n * sizeof *r->labels_host,
                               cudaMemcpyHostToDevice, r->stream));
    CUDA_CHECK(cudaEventRecord(r->ready, r->stream));
    r->n = b->n;
    r->index = b->index;
    d->stages.gpu_images += m;
    d->stages.cpu_images += cpu;
}

/* ---- the thread ----------------------------------------------------------------- */

/* The loader's batch of buffer r goes back once r's decode has read its bytes
 * (wait: block until it has; else only if it has). */
static void release_held(GpuDecoder *d, RingBuffer *r, int wait) {
    if (!r->holding) return;
    if (!wait && cudaEventQuery(r->ready) == cudaErrorNotReady) return;
    CUDA_CHECK(cudaEventSynchronize(r->ready));
    float device_ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&device_ms, r->submitted, r->ready));
    loader_release(d->loader, &r->held);
    r->holding = 0;
    d->stages.decode_s += 1e-3 * device_ms;
}

/* Every held batch whose decode is done goes back; then, while the loader
 * could not hand out another (it hands out prefetch at once), the oldest is
 * waited for. */
static void release_done(GpuDecoder *d, int next) {
    int held = 0;
    for (int k = 0; k < GPU_DECODE_RING; k++) {
        release_held(d, &d->ring[k], 0);
        held += d->ring[k].holding;
    }
    for (int k = next + 1; held > d->holding_most; k++) {
        RingBuffer *r = &d->ring[k % GPU_DECODE_RING];
        held -= r->holding;
        release_held(d, r, 1);
    }
}

/* Fills buffer k with the loader's next batch; nothing waits for the device
 * here: the consumer's stream waits for its 'ready' event. */
static void produce_one(GpuDecoder *d, int k, int generation) {
    RingBuffer *r = &d->ring[k];
    release_held(d, r, 1);
    release_done(d, k);
    Batch b;
    double t0 = now_seconds();
    int got = loader_next(d->loader, &b);
    double t1 = now_seconds();
    if (got) {
        fill_buffer(d, r, &b);
        r->held = b;
        r->holding = 1;
        d->stages.submit_s += now_seconds() - t1;
    }
    pthread_mutex_lock(&d->lock);
    d->stages.wait_s += t1 - t0;
    if (generation != d->generation) {
        r->state = RING_FREE; /* an abandoned epoch's */
    } else if (!got) {
        r->state = RING_FREE;
        d->active = 0;
        d->epoch_done = 1;
    } else {
        r->state = RING_READY;
        d->produced++;
        d->stages.batches++;
    }
    pthread_cond_broadcast(&d->changed);
}

/* Before the loader's epoch restarts: every decode done with the bytes it reads. */
static void release_all(GpuDecoder *d) {
    for (int k = 0; k < GPU_DECODE_RING; k++) release_held(d, &d->ring[k], 1);
}

static void *decoder_main(void *arg) {
    GpuDecoder *d = arg;
    CUDA_CHECK(cudaSetDevice(d->device));
    pthread_mutex_lock(&d->lock);
    while (!d->stopping) {
        if (d->start_pending) {
            d->start_pending = 0;
            int epoch = d->start_epoch, first = d->start_batch;
            pthread_mutex_unlock(&d->lock);
            release_all(d);
            loader_start_epoch_at(d->loader, epoch, first);
            pthread_mutex_lock(&d->lock);
            d->produced = first;
            d->active = 1;
            continue;
        }
        int k = d->produced % GPU_DECODE_RING;
        if (!d->active || d->ring[k].state != RING_FREE) {
            pthread_cond_wait(&d->changed, &d->lock);
            continue;
        }
        d->ring[k].state = RING_BUSY;
        int generation = d->generation;
        pthread_mutex_unlock(&d->lock);
        produce_one(d, k, generation); /* returns with the lock held */
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* ---- the face ------------------------------------------------------------------- */

static void *pinned(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    return p;
}

static void ring_init(GpuDecoder *d, RingBuffer *r) {
    memset(r, 0, sizeof *r);
    CUDA_CHECK(cudaMalloc((void **)&r->samples_dev, (size_t)d->batch * sizeof *r->samples_dev));
    CUDA_CHECK(cudaMalloc((void **)&r->labels_dev, (size_t)d->batch * sizeof *r->labels_dev));
    r->samples_host = pinned((size_t)d->batch * sizeof *r->samples_host);
    r->labels_host = pinned((size_t)d->batch * sizeof *r->labels_host);
    r->cpu_images = pinned((size_t)d->batch * 3 * d->out_h * d->out_w);
    CUDA_CHECK(cudaEventCreateWithFlags(&r->ready, 0));
    CUDA_CHECK(cudaEventCreateWithFlags(&r->submitted, 0));
    CUDA_CHECK(cudaEventCreateWithFlags(&r->consumed, cudaEventDisableTiming));
    /* The decodes' copies and nvJPEG's kernels ahead of the training step's, which has the GPU otherwise. */
    int least, greatest;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&r->stream, cudaStreamNonBlocking, greatest));
    NVJPEG_CHECK(nvjpegJpegStateCreate(d->handle, &r->jpeg));
    /* A start for typical photos (ImageNet's are about 400 x 350); grown as batches need. */
    size_t start = (size_t)d->batch * align_up(gpu_resample_image_bytes(512, 512), 256);
    CUDA_CHECK(cudaMalloc((void **)&r->images, start));
    r->cap = start;
}

/* The hardware engines where the card has them, else the GPU hybrid backend. */
/* Memory pools: nvJPEG keeps the device memory it allocated instead of freeing
 * it between calls (a cudaFree waits for the whole device). The hardware
 * decode unpipelined: pipelined, nvJPEG spreads a batch over streams of its
 * own, at the default priority, whose copies and kernels for each image wait
 * behind the training step's kernels (on an H200 beside ResNet-50's step, a
 * batch took 40 ms instead of 8, and the step ran at 85% of its speed alone;
 * unpipelined, 95%). */
#ifdef NVJPEG_FLAGS_ENABLE_MEMORY_POOLS
#define DECODER_POOLS NVJPEG_FLAGS_ENABLE_MEMORY_POOLS
#else
#define DECODER_POOLS 0
#endif
#define HARDWARE_FLAGS (DECODER_POOLS | NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE)

static int open_nvjpeg(GpuDecoder *d, char *why, size_t whylen, const char **backend) {
    nvjpegStatus_t s = nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, NULL, NULL, HARDWARE_FLAGS, &d->handle);
    d->hardware = s == NVJPEG_STATUS_SUCCESS;
    if (!d->hardware) s = nvjpegCreateEx(NVJPEG_BACKEND_GPU_HYBRID, NULL, NULL, DECODER_POOLS, &d->handle);
    if (s != NVJPEG_STATUS_SUCCESS) {
        snprintf(why, whylen, "nvJPEG could not start: %s", nvjpeg_status_name(s));
        return -1;
    }
    *backend = d->hardware ? "the card's hardware JPEG engines (nvJPEG's hardware backend)"
                           : "nvJPEG's GPU hybrid backend (this card has no hardware JPEG engines)";
    NVJPEG_CHECK(nvjpegJpegStreamCreate(d->handle, &d->parsed));
    return 0;
}

GpuDecoder *gpu_decoder_create(Loader *loader, int device, int batch, char *why, size_t whylen, const char **backend) {
    GpuDecoder *d = calloc(1, sizeof *d);
    if (!d) TC_FATAL("out of host memory");
    d->loader = loader;
    d->source = loader_source(loader);
    d->device = device;
    d->batch = batch;
    int c;
    loader_raw_shape(loader, &c, &d->out_h, &d->out_w);
    if (open_nvjpeg(d, why, whylen, backend) != 0) {
        free(d);
        return NULL;
    }
    d->holding_most = loader_prefetch(loader) - 1;
    if (d->holding_most > GPU_DECODE_RING) d->holding_most = GPU_DECODE_RING;
    for (int k = 0; k < GPU_DECODE_RING; k++) ring_init(d, &d->ring[k]);
    for (int i = 0; i < CONSUMER_WAITS; i++) {
        CUDA_CHECK(cudaEventCreate(&d->waits[i].arrived));
        CUDA_CHECK(cudaEventCreate(&d->waits[i].started));
    }
    d->data = calloc((size_t)batch, sizeof *d->data);
    d->lengths = calloc((size_t)batch, sizeof *d->lengths);
    d->dests = calloc((size_t)batch, sizeof *d->dests);
    if (!d->data || !d->lengths || !d->dests) TC_FATAL("out of host memory");
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->changed, NULL);
    if (pthread_create(&d->thread, NULL, decoder_main, d) != 0) TC_FATAL("cannot start the GPU decoder's thread");
    return d;
}

void gpu_decoder_start_epoch(GpuDecoder *d, int epoch, int first_batch) {
    pthread_mutex_lock(&d->lock);
    d->generation++;
    for (int k = 0; k < GPU_DECODE_RING; k++)
        if (d->ring[k].state == RING_READY || d->ring[k].state == RING_HELD) d->ring[k].state = RING_FREE;
    d->start_pending = 1;
    d->start_epoch = epoch;
    d->start_batch = first_batch;
    d->handed = first_batch;
    d->active = 0;
    d->epoch_done = 0;
    pthread_cond_broadcast(&d->changed);
    pthread_mutex_unlock(&d->lock);
}

/* The consumer's waits whose events have passed, added to device_wait_s;
 * none is waited for (a wait still pending when its turn comes again, eight
 * batches later, is not counted). */
static void count_waits(GpuDecoder *d) {
    double s = 0;
    for (int i = 0; i < CONSUMER_WAITS; i++) {
        ConsumerWait *w = &d->waits[i];
        if (!w->pending || cudaEventQuery(w->started) == cudaErrorNotReady) continue;
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, w->arrived, w->started));
        s += ms > 0 ? 1e-3 * ms : 0;
        w->pending = 0;
    }
    pthread_mutex_lock(&d->lock);
    d->device_wait_s += s;
    pthread_mutex_unlock(&d->lock);
}

int gpu_decoder_next(GpuDecoder *d, DecodedBatch *out, cudaStream_t consumer) {
    count_waits(d);
    ConsumerWait *w = &d->waits[d->next_wait];
    d->next_wait = (d->next_wait + 1) % CONSUMER_WAITS;
    w->pending = 0;
    CUDA_CHECK(cudaEventRecord(w->arrived, consumer));
    pthread_mutex_lock(&d->lock);
    int k;
    for (;;) {
        k = d->handed % GPU_DECODE_RING;
        RingBuffer *r = &d->ring[k];
        if (!d->start_pending && r->state == RING_READY && r->index == d->handed) break;
        if (!d->start_pending && d->epoch_done && d->handed >= d->produced) {
            pthread_mutex_unlock(&d->lock);
            return 0;
        }
        pthread_cond_wait(&d->changed, &d->lock);
    }
    RingBuffer *r = &d->ring[k];
    r->state = RING_HELD;
    d->handed++;
    pthread_mutex_unlock(&d->lock);
    CUDA_CHECK(cudaStreamWaitEvent(consumer, r->ready, 0));
    CUDA_CHECK(cudaEventRecord(w->started, consumer));
    w->pending = 1;
    *out = (DecodedBatch){r->images, r->samples_dev, r->labels_dev, r->n, r->index, k};
    return 1;
}

void gpu_decoder_release(GpuDecoder *d, const DecodedBatch *b, cudaStream_t consumer) {
    RingBuffer *r = &d->ring[b->ring];
    CUDA_CHECK(cudaEventRecord(r->consumed, consumer));
    pthread_mutex_lock(&d->lock);
    r->consumed_recorded = 1;
    if (r->state == RING_HELD && r->index == b->index) r->state = RING_FREE;
    pthread_cond_broadcast(&d->changed);
    pthread_mutex_unlock(&d->lock);
}

double gpu_decoder_wait_seconds(const GpuDecoder *d) {
    pthread_mutex_lock((pthread_mutex_t *)&d->lock);
    double s = d->device_wait_s;
    pthread_mutex_unlock((pthread_mutex_t *)&d->lock);
    return s;
}

void gpu_decoder_stages(const GpuDecoder *d, GpuDecodeStages *out) {
    pthread_mutex_lock((pthread_mutex_t *)&d->lock);
    *out = d->stages;
    pthread_mutex_unlock((pthread_mutex_t *)&d->lock);
}

void gpu_decoder_destroy(GpuDecoder *d) {
    if (!d) return;
    pthread_mutex_lock(&d->lock);
    d->stopping = 1;
    d->generation++;
    pthread_cond_broadcast(&d->changed);
    pthread_mutex_unlock(&d->lock);
    pthread_join(d->thread, NULL);
    release_all(d);
    for (int k = 0; k < GPU_DECODE_RING; k++) {
        RingBuffer *r = &d->ring[k];
        CUDA_CHECK(cudaStreamSynchronize(r->stream));
        CUDA_CHECK(cudaStreamDestroy(r->stream));
        NVJPEG_CHECK(nvjpegJpegStateDestroy(r->jpeg));
        CUDA_CHECK(cudaFree(r->images));
        CUDA_CHECK(cudaFree(r->samples_dev));
        CUDA_CHECK(cudaFree(r->labels_dev));
        CUDA_CHECK(cudaFreeHost(r->samples_host));
        CUDA_CHECK(cudaFreeHost(r->labels_host));
        CUDA_CHECK(cudaFreeHost(r->cpu_images));
        CUDA_CHECK(cudaEventDestroy(r->ready));
        CUDA_CHECK(cudaEventDestroy(r->submitted));
        CUDA_CHECK(cudaEventDestroy(r->consumed));
    }
    for (int i = 0; i < CONSUMER_WAITS; i++) {
        CUDA_CHECK(cudaEventDestroy(d->waits[i].arrived));
        CUDA_CHECK(cudaEventDestroy(d->waits[i].started));
    }
    NVJPEG_CHECK(nvjpegJpegStreamDestroy(d->parsed));
    NVJPEG_CHECK(nvjpegDestroy(d->handle));
    decode_buffers_free(&d->decode);
    resample_scratch_free(&d->resample);
    pthread_cond_destroy(&d->changed);
    pthread_mutex_destroy(&d->lock);
    free(d->data);
    free(d->lengths);
    free(d->dests);
    free(d);
}

#else /* built without nvJPEG */

GpuDecoder *gpu_decoder_create(Loader *loader, int device, int batch, char *why, size_t whylen, const char **backend) {
    (void)loader, (void)device, (void)batch;
    *backend = NULL;
    snprintf(why, whylen, "this trainc was built without nvJPEG (%s)",
             TRAINC_CUDA ? "CMake found no nvjpeg.h and libnvjpeg in the CUDA toolkit" : "built without CUDA");
    return NULL;
}

static _Noreturn void no_decoder(const char *what) { TC_FATAL("%s: built without nvJPEG", what); }
void gpu_decoder_start_epoch(GpuDecoder *d, int epoch, int first_batch) {
    (void)d, (void)epoch, (void)first_batch;
    no_decoder(__func__);
}
int gpu_decoder_next(GpuDecoder *d, DecodedBatch *out, cudaStream_t consumer) {
    (void)d, (void)out, (void)consumer;
    no_decoder(__func__);
}
void gpu_decoder_release(GpuDecoder *d, const DecodedBatch *b, cudaStream_t consumer) {
    (void)d, (void)b, (void)consumer;
    no_decoder(__func__);
}
double gpu_decoder_wait_seconds(const GpuDecoder *d) {
    (void)d;
    return 0;
}
void gpu_decoder_stages(const GpuDecoder *d, GpuDecodeStages *out) {
    (void)d;
    memset(out, 0, sizeof *out);
}
void gpu_decoder_destroy(GpuDecoder *d) { (void)d; }

#endif
