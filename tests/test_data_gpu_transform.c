/* The GPU transform kernel against its CPU reference (gpu_transform_reference_cpu,
 * which test_data_loader ties to the CPU float path): fresh random images and
 * params each run, NCHW and NHWC, output rows past n poisoned with NaN and left
 * alone; zero and reflect padding; samples gathered by index with their labels
 * (data.on_device). Then the whole GPU path (raw loader, copies, kernel) against the float
 * loader, and timings, printed, not checked: the kernel alone at batch 256,
 * 32 -> 224, and loading + copying + the kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/gpu_transform.h"
#include "data/loader.h"
#include "runtime/check.h"
#include "runtime/log.h"
#include "tests/harness.h"

static uint64_t rng;
static cudaStream_t stream;

/* ---- buffers ------------------------------------------------------------------- */

static void *host_bytes(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}

static void *dev_bytes(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void *dev_copy(const void *src, size_t bytes) {
    void *p = dev_bytes(bytes);
    CUDA_CHECK(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
    return p;
}

static float *nan_floats(size_t n) {
    float *p = host_bytes(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* ---- random inputs --------------------------------------------------------------- */

static int uniform_int(int lo, int hi) { /* in [lo, hi] */
    int v = lo + (int)test_uniform(&rng, 0.0f, (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

static void clipped_range(int centre, int side, int size, int32_t *lo, int32_t *hi) {
    int first = centre - side / 2, last = first + side;
    *lo = first < 0 ? 0 : first;
    *hi = last > size ? size : last;
}

/* Any crop offset, flip, and a cutout anywhere (one sample in five without). */
static void random_params(TransformParams *p, int crop_pad, int cutout, int out_h, int out_w) {
    memset(p, 0, sizeof *p);
    p->crop_dy = uniform_int(-crop_pad, crop_pad);
    p->crop_dx = uniform_int(-crop_pad, crop_pad);
    p->flip = uniform_int(0, 1);
    if (cutout > 0 && uniform_int(0, 4) > 0) {
        clipped_range(uniform_int(0, out_h - 1), cutout, out_h, &p->cutout_y0, &p->cutout_y1);
        clipped_range(uniform_int(0, out_w - 1), cutout, out_w, &p->cutout_x0, &p->cutout_x1);
    }
}

/* ---- kernel against the reference ----------------------------------------------- */

typedef struct {
    const char *name;
    int c, h, w, out_h, out_w, crop_pad, cutout;
    int pad_reflect; /* data.pad_mode = reflect */
    int gather;      /* data.on_device: samples picked by index, labels gathered too */
} Case;

static void check_case(const Case *k, int nhwc) {
    const int batch = 11, n = 9; /* rows n..batch-1 must stay untouched */
    size_t image_bytes = (size_t)k->c * k->h * k->w;
    size_t sample_floats = (size_t)k->c * k->out_h * k->out_w;
    size_t out_floats = (size_t)batch * sample_floats;
    uint8_t *images = host_bytes(batch * image_bytes);
    TransformParams *params = host_bytes(gpu_transform_params_bytes(batch));
    for (size_t i = 0; i < batch * image_bytes; i++) images[i] = (uint8_t)uniform_int(0, 255);
    for (int i = 0; i < batch; i++)
        random_params(&params[i], k->crop_pad, k->cutout, k->out_h, k->out_w);

    TransformSpec spec;
    transform_spec_default(&spec, k->out_h, k->out_w);
    GpuTransformArgs a;
    spec.pad_reflect = k->pad_reflect;
    gpu_transform_args_init(&a, &spec, k->c, k->h, k->w);
    a.nhwc = nhwc;
    a.n = n;
    float *expected = nan_floats(out_floats);
    int32_t index[11], labels[11], want_labels[11], got_labels[11];
    for (int i = 0; i < batch; i++) {
        index[i] = uniform_int(0, batch - 1);
        labels[i] = uniform_int(0, 999);
        want_labels[i] = got_labels[i] = -7;
    }
    a.raw_images = images;
    a.params = params;
    a.out = expected;
    if (k->gather) {
        a.index = index;
        a.labels = labels;
        a.labels_out = want_labels;
    }
    gpu_transform_reference_cpu(&a);

    float *got = nan_floats(out_floats);
    a.raw_images = dev_copy(images, batch * image_bytes);
    a.params = dev_copy(params, gpu_transform_params_bytes(batch));
    a.out = dev_copy(got, out_floats * sizeof(float));
    if (k->gather) {
        a.index = dev_copy(index, sizeof index);
        a.labels = dev_copy(labels, sizeof labels);
        a.labels_out = dev_copy(got_labels, sizeof got_labels);
    }
    gpu_transform_batch(&a, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(got, a.out, out_floats * sizeof(float), cudaMemcpyDeviceToHost));
    if (k->gather) {
        CUDA_CHECK(cudaMemcpy(got_labels, a.labels_out, sizeof got_labels, cudaMemcpyDeviceToHost));
        CHECK_MSG(memcmp(got_labels, want_labels, sizeof got_labels) == 0, "%s: gathered labels differ", k->name);
        CHECK(want_labels[0] == labels[index[0]] && want_labels[n] == -7);
        CUDA_CHECK(cudaFree((void *)a.index));
        CUDA_CHECK(cudaFree((void *)a.labels));
        CUDA_CHECK(cudaFree(a.labels_out));
    }

    size_t written = (size_t)n * sample_floats, not_finite = 0, touched = 0, differ = 0;
    double worst = 0;
    for (size_t i = 0; i < written; i++) {
        if (!isfinite(got[i])) not_finite++;
        double err = fabs((double)got[i] - (double)expected[i]);
        if (err > worst) worst = err;
        differ += got[i] != expected[i];
    }
    for (size_t i = written; i < out_floats; i++) touched += !isnan(got[i]);
    const char *layout = nhwc ? "NHWC" : "NCHW";
    CHECK_MSG(not_finite == 0, "%s %s: %zu outputs not finite", k->name, layout, not_finite);
    CHECK_MSG(worst < 1e-4, "%s %s: max error %g", k->name, layout, worst);
    CHECK_MSG(touched == 0, "%s %s: %zu floats past row n written", k->name, layout, touched);
    printf("%-28s %s: max error %g, %zu of %zu floats differ from the reference\n", k->name, layout,
           worst, differ, written);

    /* n = 0 launches nothing. */
    a.n = 0;
    gpu_transform_batch(&a, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));

    CUDA_CHECK(cudaFree((void *)a.raw_images));
    CUDA_CHECK(cudaFree((void *)a.params));
    CUDA_CHECK(cudaFree(a.out));
    free(images);
    free(params);
    free(expected);
    free(got);
}

static void test_kernel_against_reference(void) {
    static const Case cases[] = {
        {"3x32x32 -> 32x32", 3, 32, 32, 32, 32, 4, 8, 0, 0},
        {"3x32x32 -> 224x224", 3, 32, 32, 224, 224, 4, 8, 0, 0},
        {"3x32x32 -> 224x224 plain", 3, 32, 32, 224, 224, 0, 0, 0, 0},
        {"1x7x9 -> 13x5", 1, 7, 9, 13, 5, 2, 3, 0, 0},
        {"2x12x10 -> 5x4", 2, 12, 10, 5, 4, 3, 2, 0, 0},
        {"3x5x5 -> 50x47", 3, 5, 5, 50, 47, 6, 60, 0, 0}, /* crop past the image, cutout past it */
        {"3x32x32 reflect, gathered", 3, 32, 32, 32, 32, 2, 8, 1, 1},
        {"3x5x5 -> 50x47 reflect", 3, 5, 5, 50, 47, 6, 60, 1, 0}, /* mirrored more than a side */
        {"1x7x9 -> 13x5 reflect, gathered", 1, 7, 9, 13, 5, 2, 3, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int nhwc = 0; nhwc < 2; nhwc++) check_case(&cases[i], nhwc);
}

/* ---- the GPU path against the CPU path -------------------------------------------- */

/* Raw loader batches through the kernel give the float loader's batches. */
static void test_gpu_path_matches_cpu_path(void) {
    Dataset d;
    synthetic_make(&d, 64, 3, 32, 32, 10, test_seed());
    LoaderConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch = 24;
    cfg.workers = 2;
    cfg.prefetch = 2;
    cfg.shuffle = 1;
    cfg.augment = 1;
    cfg.seed = test_seed();
    transform_spec_default(&cfg.transform, 224, 224);
    cfg.transform.flip = 1;
    cfg.transform.crop_pad = 4;
    cfg.transform.cutout = 16;

    Loader *cpu = loader_create(&d, &cfg);
    cfg.raw = 1;
    cfg.pinned = 1;
    Loader *gpu = loader_create(&d, &cfg);
    GpuTransformArgs a;
    gpu_transform_args_init(&a, &cfg.transform, d.c, d.h, d.w);
    size_t sample_floats = (size_t)d.c * a.out_h * a.out_w;
    uint8_t *raw = dev_bytes(gpu_transform_raw_bytes(cfg.batch, d.c, d.h, d.w));
    TransformParams *params = dev_bytes(gpu_transform_params_bytes(cfg.batch));
    float *out = dev_bytes(cfg.batch * sample_floats * sizeof(float));
    float *got = host_bytes(cfg.batch * sample_floats * sizeof(float));
    double worst = 0;
    int batches = 0, label_mismatches = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        loader_start_epoch(cpu, epoch);
        loader_start_epoch(gpu, epoch);
        Batch want, b;
        while (loader_next(cpu, &want) && loader_next(gpu, &b)) {
            CUDA_CHECK(cudaMemcpyAsync(raw, b.raw_images, gpu_transform_raw_bytes(b.n, d.c, d.h, d.w),
                                       cudaMemcpyHostToDevice, stream));
            CUDA_CHECK(cudaMemcpyAsync(params, b.params, gpu_transform_params_bytes(b.n),
                                       cudaMemcpyHostToDevice, stream));
            a.raw_images = raw;
            a.params = params;
            a.out = out;
            a.n = b.n;
            gpu_transform_batch(&a, stream);
            CUDA_CHECK(cudaMemcpyAsync(got, out, b.n * sample_floats * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));
            for (size_t i = 0; i < b.n * sample_floats; i++) {
                double err = fabs((double)got[i] - (double)want.images[i]);
                if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
            }
            label_mismatches += b.n != want.n ||
                                memcmp(b.labels, want.labels, b.n * sizeof(int32_t)) != 0;
            batches++;
            loader_release(cpu, &want);
            loader_release(gpu, &b);
        }
    }
    CHECK(batches == 2 * 3 && label_mismatches == 0);
    CHECK_MSG(worst < 1e-4, "GPU path vs CPU path: max error %g", worst);
    printf("raw loader + kernel vs float loader, 32x32 -> 224x224, crop, flip, cutout: "
           "max error %g\n", worst);
    CUDA_CHECK(cudaFree(raw));
    CUDA_CHECK(cudaFree(params));
    CUDA_CHECK(cudaFree(out));
    free(got);
    loader_destroy(cpu);
    loader_destroy(gpu);
    dataset_free(&d);
}

/* ---- timings ----------------------------------------------------------------------- */

static void time_kernel(int nhwc) {
    enum { BATCH = 256, C = 3, H = 32, W = 32, OUT = 224, LAUNCHES = 20 };
    size_t image_bytes = (size_t)C * H * W;
    uint8_t *images = host_bytes(BATCH * image_bytes);
    TransformParams *params = host_bytes(gpu_transform_params_bytes(BATCH));
    for (size_t i = 0; i < BATCH * image_bytes; i++) images[i] = (uint8_t)uniform_int(0, 255);
    for (int i = 0; i < BATCH; i++) random_params(&params[i], 4, 8, OUT, OUT);
    TransformSpec spec;
    transform_spec_default(&spec, OUT, OUT);
    GpuTransformArgs a;
    gpu_transform_args_init(&a, &spec, C, H, W);
    a.nhwc = nhwc;
    a.n = BATCH;
    a.raw_images = dev_copy(images, BATCH * image_bytes);
    a.params = dev_copy(params, gpu_transform_params_bytes(BATCH));
    a.out = dev_bytes((size_t)BATCH * C * OUT * OUT * sizeof(float));
    for (int i = 0; i < 3; i++) gpu_transform_batch(&a, stream);
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < LAUNCHES; i++) gpu_transform_batch(&a, stream);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    double seconds = ms / 1000.0 / LAUNCHES;
    double out_bytes = (double)BATCH * C * OUT * OUT * sizeof(float);
    printf("kernel alone, batch %d, %dx%d -> %dx%d %s, crop, flip, cutout: %.1f us, "
           "%.0f samples/s, %.0f GB/s written\n", BATCH, H, W, OUT, OUT, nhwc ? "NHWC" : "NCHW",
           seconds * 1e6, BATCH / seconds, out_bytes / seconds / 1e9);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaFree((void *)a.raw_images));
    CUDA_CHECK(cudaFree((void *)a.params));
    CUDA_CHECK(cudaFree(a.out));
    free(images);
    free(params);
}

/* Loading + copying + the kernel, as a trainer would run them: two device
 * staging sets on one stream, a loader batch released once its copies landed.
 * Over 4 epochs of 16384 CIFAR-sized images. */
static void time_pipeline(int workers) {
    enum { BATCH = 256, OUT = 224, WARMUP = 3, EPOCHS = 4 };
    Dataset d;
    synthetic_make(&d, 16384, 3, 32, 32, 10, 1);
    LoaderConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch = BATCH;
    cfg.workers = workers;
    cfg.prefetch = 4;
    cfg.pinned = 1;
    cfg.shuffle = 1;
    cfg.drop_last = 1;
    cfg.augment = 1;
    cfg.raw = 1;
    cfg.seed = 1;
    transform_spec_default(&cfg.transform, OUT, OUT);
    cfg.transform.flip = 1;
    cfg.transform.crop_pad = 4;
    cfg.transform.cutout = 16;
    Loader *l = loader_create(&d, &cfg);
    GpuTransformArgs a;
    gpu_transform_args_init(&a, &cfg.transform, d.c, d.h, d.w);
    a.out = dev_bytes((size_t)BATCH * d.c * OUT * OUT * sizeof(float));
    uint8_t *raw[2];
    TransformParams *params[2];
    cudaEvent_t copied[2];
    Batch held[2];
    int holding[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        raw[k] = dev_bytes(gpu_transform_raw_bytes(BATCH, d.c, d.h, d.w));
        params[k] = dev_bytes(gpu_transform_params_bytes(BATCH));
        CUDA_CHECK(cudaEventCreateWithFlags(&copied[k], cudaEventDisableTiming));
    }
    double start = 0;
    long samples = 0;
    for (int epoch = 0, i = 0; epoch < EPOCHS; epoch++) {
        loader_start_epoch(l, epoch);
        Batch b;
        for (; loader_next(l, &b); i++) {
            int k = i & 1;
            if (holding[k]) { /* this staging set's last batch must have left the host */
                CUDA_CHECK(cudaEventSynchronize(copied[k]));
                loader_release(l, &held[k]);
                holding[k] = 0;
            }
            if (i == WARMUP) {
                CUDA_CHECK(cudaStreamSynchronize(stream));
                start = now_seconds();
                samples = 0;
            }
            CUDA_CHECK(cudaMemcpyAsync(raw[k], b.raw_images,
                                       gpu_transform_raw_bytes(b.n, d.c, d.h, d.w),
                                       cudaMemcpyHostToDevice, stream));
            CUDA_CHECK(cudaMemcpyAsync(params[k], b.params, gpu_transform_params_bytes(b.n),
                                       cudaMemcpyHostToDevice, stream));
            CUDA_CHECK(cudaEventRecord(copied[k], stream));
            a.raw_images = raw[k];
            a.params = params[k];
            a.n = b.n;
            gpu_transform_batch(&a, stream);
            held[k] = b;
            holding[k] = 1;
            samples += b.n;
        }
        /* The next epoch rewrites the slots: the copies out of them must be done. */
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int k = 0; k < 2; k++)
            if (holding[k]) loader_release(l, &held[k]), holding[k] = 0;
    }
    double seconds = now_seconds() - start;
    printf("loading + copying + kernel, raw loader with %d workers, pinned, batch %d, "
           "32x32 -> %dx%d: %.0f samples/s\n", workers, BATCH, OUT, OUT, samples / seconds);
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaFree(raw[k]));
        CUDA_CHECK(cudaFree(params[k]));
        CUDA_CHECK(cudaEventDestroy(copied[k]));
    }
    CUDA_CHECK(cudaFree(a.out));
    loader_destroy(l);
    dataset_free(&d);
}

int main(void) {
    test_require_gpu();
    rng = test_seed();
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    test_kernel_against_reference();
    test_gpu_path_matches_cpu_path();
    time_kernel(0);
    time_kernel(1);
    time_pipeline(2);
    time_pipeline(4);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return test_finish("test_data_gpu_transform");
}
