/* The GPU side of the ImageNet recipe. The resample kernel against its CPU
 * reference (gpu_resample_reference_cpu, the CPU loader's arithmetic):
 * fresh random images of random sizes, crop boxes, flips and output sizes each
 * run, fp32 NCHW and NHWC with padded channels equal to the bit, fp16 and bf16
 * within their rounding, outputs poisoned with NaN first. Then the whole GPU
 * decode (data.decode = gpu: loader in encoded mode, nvJPEG's decoder, the
 * kernel) against the CPU loader's float batches on the same crops, JPEGs of
 * several sizes with a grayscale one and a PNG among them; the two JPEG
 * decoders differ by a few levels, so the bound is on the mean difference.
 * The kernel's time at batch 256, 400x350 to 224, is printed, not checked. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <stb_image_write.h>

#include "data/gpu_decode.h"
#include "data/gpu_resample.h"
#include "data/loader.h"
#include "data/source.h"
#include "runtime/check.h"
#include "runtime/log.h"
#include "tests/harness.h"

static uint64_t rng;

static int uniform_int(int lo, int hi) {
    int v = lo + (int)test_uniform(&rng, 0.0f, (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

static void *dev_copy(const void *src, size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    if (src) CUDA_CHECK(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
    return p;
}

/* A smooth random image (photo-like: gradients and a little noise), planar. */
static void fill_image(uint8_t *planes, int pitch, int w, int h) {
    for (int c = 0; c < 3; c++) {
        float a = test_uniform(&rng, 0, 255), gx = test_uniform(&rng, -2, 2), gy = test_uniform(&rng, -2, 2);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                float v = a + gx * x + gy * y + test_uniform(&rng, -20, 20);
                planes[((size_t)c * h + y) * pitch + x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    }
}

/* ---- the kernel against its reference ----------------------------------------- */

static void check_kernel(DType dtype, int nhwc, int out_c) {
    enum { N = 7 };
    ResampleSample samples[N];
    int32_t labels[N];
    size_t total = 0;
    int out_h = uniform_int(8, 96), out_w = uniform_int(8, 96);
    CropRecipe recipe = {test_uniform(&rng, 0.05f, 0.5f), 1.0f, 0.75f, 1.3333f, 0};
    for (int i = 0; i < N; i++) {
        int w = uniform_int(5, 300), h = uniform_int(5, 300);
        CropBox box = i % 3 == 2 ? crop_center(w, h, uniform_int(out_h > out_w ? out_h : out_w, 320), out_h, out_w)
                                 : crop_random_resized(w, h, &recipe, &rng);
        samples[i] = (ResampleSample){(int64_t)total, gpu_resample_pitch(w), w, h, uniform_int(0, 1), box};
        labels[i] = uniform_int(0, 999);
        total += gpu_resample_image_bytes(w, h);
    }
    uint8_t *images = malloc(total);
    for (int i = 0; i < N; i++) fill_image(images + samples[i].offset, samples[i].pitch, samples[i].w, samples[i].h);
    GpuResampleArgs a = {.n = N, .out_h = out_h, .out_w = out_w, .nhwc = nhwc, .out_c = out_c, .out_dtype = DTYPE_F32};
    for (int c = 0; c < 3; c++) {
        a.mean[c] = test_uniform(&rng, 0.3f, 0.6f);
        a.std[c] = test_uniform(&rng, 0.2f, 0.3f);
    }
    size_t count = (size_t)N * out_h * out_w * out_c;
    float *ref = malloc(count * sizeof(float));
    int32_t ref_labels[N];
    a.images = images, a.samples = samples, a.labels = labels, a.labels_out = ref_labels, a.out = ref;
    gpu_resample_reference_cpu(&a);

    size_t esize = dtype_size(dtype);
    uint8_t *poison = malloc(count * esize);
    memset(poison, 0xff, count * esize); /* NaN in every dtype */
    GpuResampleArgs d = a;
    d.out_dtype = dtype;
    d.images = dev_copy(images, total);
    d.samples = dev_copy(samples, sizeof samples);
    d.labels = dev_copy(labels, sizeof labels);
    d.labels_out = dev_copy(NULL, sizeof labels);
    d.out = dev_copy(poison, count * esize);
    gpu_resample_batch(&d, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    uint8_t *got = malloc(count * esize);
    int32_t got_labels[N];
    CUDA_CHECK(cudaMemcpy(got, d.out, count * esize, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(got_labels, d.labels_out, sizeof got_labels, cudaMemcpyDeviceToHost));
    double worst = 0;
    long bad = 0;
    for (size_t k = 0; k < count; k++) {
        float v;
        if (dtype == DTYPE_F32) {
            memcpy(&v, got + 4 * k, 4);
        } else {
            uint16_t bits;
            memcpy(&bits, got + 2 * k, 2);
            if (dtype == DTYPE_BF16) {
                uint32_t f = (uint32_t)bits << 16;
                memcpy(&v, &f, 4);
            } else { /* fp16 */
                int e = (bits >> 10) & 31, m = bits & 1023;
                v = e == 31 ? NAN : e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
                if (bits >> 15) v = -v;
            }
        }
        double tol = dtype == DTYPE_F32 ? 0.0 : (dtype == DTYPE_F16 ? 1.0 / 1024 : 1.0 / 128) * (fabs(ref[k]) + 1e-2);
        double diff = fabs((double)v - ref[k]);
        if (!(diff <= tol)) bad++;
        if (diff > worst || isnan(v)) worst = isnan(v) ? INFINITY : diff;
    }
    CHECK_MSG(bad == 0, "%s %s: %ld of %zu outputs off (worst %g)", dtype_name(dtype), nhwc ? "NHWC" : "NCHW", bad,
              count, worst);
    CHECK(memcmp(got_labels, labels, sizeof labels) == 0);
    printf("resample kernel %s %s (out_c %d, %dx%d): %zu outputs, worst difference %g\n", dtype_name(dtype),
           nhwc ? "NHWC" : "NCHW", out_c, out_w, out_h, count, worst);
    CUDA_CHECK(cudaFree((void *)d.images));
    CUDA_CHECK(cudaFree((void *)d.samples));
    CUDA_CHECK(cudaFree((void *)d.labels));
    CUDA_CHECK(cudaFree(d.labels_out));
    CUDA_CHECK(cudaFree(d.out));
    free(images), free(ref), free(poison), free(got);
}

/* ---- nvJPEG's decode against the CPU loader ------------------------------------------ */

static void write_files(const char *root, int count) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/train", root);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/train/a", root);
    mkdir(dir, 0755);
    for (int i = 0; i < count; i++) {
        int w = uniform_int(40, 220), h = uniform_int(40, 220), gray = i == 3, png = i == 5;
        uint8_t *planes = malloc(3 * (size_t)w * h), *hwc = malloc(3 * (size_t)w * h);
        fill_image(planes, w, w, h);
        int comp = gray ? 1 : 3;
        for (size_t p = 0; p < (size_t)w * h; p++)
            for (int c = 0; c < comp; c++) hwc[p * comp + c] = planes[c * (size_t)w * h + p];
        snprintf(path, sizeof path, "%s/%03d.%s", dir, i, png ? "png" : "jpg");
        int ok = png ? stbi_write_png(path, w, h, comp, hwc, w * comp) : stbi_write_jpg(path, w, h, comp, hwc, 90);
        CHECK_MSG(ok, "cannot write %s", path);
        free(planes), free(hwc);
    }
}

static void check_gpu_decode(void) {
    enum { FILES = 24, OUT = 64 };
    const char *root = test_tmpdir("gpu-decode");
    write_files(root, FILES);
    Source src;
    char err[4600];
    CHECK_MSG(source_open_folder(&src, root, "train", 0, err, sizeof err) == 0, "%s", err);
    LoaderConfig lc = {.batch = FILES, .workers = 2, .prefetch = 2, .pinned = 1, .shuffle = 1, .augment = 1,
                       .resized_crop = 1, .crop = {0.25f, 1.0f, 0.75f, 1.3333f, 73}, .dct_scaling = 0, .seed = 7};
    transform_spec_default(&lc.transform, OUT, OUT);
    lc.transform.flip = 1;
    Loader *cpu = loader_create_source(&src, &lc);
    loader_start_epoch(cpu, 0);
    Batch b;
    CHECK(loader_next(cpu, &b) == 1);
    size_t floats = (size_t)FILES * 3 * OUT * OUT;
    float *want = malloc(floats * sizeof(float)), *got = malloc(floats * sizeof(float));
    memcpy(want, b.images, floats * sizeof(float));
    int32_t want_labels[FILES];
    memcpy(want_labels, b.labels, sizeof want_labels);
    loader_release(cpu, &b);
    loader_destroy(cpu);

    lc.encoded = 1;
    Loader *enc = loader_create_source(&src, &lc);
    const char *backend;
    GpuDecoder *dec = gpu_decoder_create(enc, 0, FILES, err, sizeof err, &backend);
    if (!dec) {
        printf("SKIP (part): the GPU decoder: %s\n", err);
        loader_destroy(enc);
        free(want), free(got);
        source_free(&src);
        return;
    }
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    float *out = dev_copy(NULL, floats * sizeof(float));
    int32_t *labels = dev_copy(NULL, FILES * sizeof(int32_t));
    gpu_decoder_start_epoch(dec, 0, 0);
    DecodedBatch db;
    CHECK(gpu_decoder_next(dec, &db, stream) == 1);
    GpuResampleArgs a = {.images = db.images, .samples = db.samples, .labels = db.labels, .labels_out = labels,
                         .out = out, .out_dtype = DTYPE_F32, .out_c = 3, .n = db.n, .out_h = OUT, .out_w = OUT};
    memcpy(a.mean, lc.transform.mean, sizeof a.mean);
    memcpy(a.std, lc.transform.std, sizeof a.std);
    gpu_resample_batch(&a, stream);
    gpu_decoder_release(dec, &db, stream);
    int32_t got_labels[FILES];
    CUDA_CHECK(cudaMemcpyAsync(got, out, floats * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(got_labels, labels, sizeof got_labels, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double sum = 0, worst = 0;
    for (size_t k = 0; k < floats; k++) {
        double diff = fabs((double)got[k] - want[k]);
        sum += isnan(diff) ? INFINITY : diff;
        if (diff > worst) worst = diff;
    }
    double mean = sum / floats;
    GpuDecodeStages st;
    gpu_decoder_stages(dec, &st);
    printf("GPU decode by %s against the CPU loader, %d files (%ld on the GPU, %ld on the CPU): mean difference "
           "%.4f, worst %.3f (normalised units; one level is about 0.017)\n", backend, FILES, st.gpu_images,
           st.cpu_images, mean, worst);
    /* Two JPEG decoders: a few levels apart at most pixels, more at edges (their chroma upsampling). */
    CHECK_MSG(mean < 0.05 && worst < 1.5, "mean %g, worst %g", mean, worst);
    CHECK(memcmp(got_labels, want_labels, sizeof got_labels) == 0);
    CHECK(st.gpu_images >= FILES - 2 && st.cpu_images >= 1);
    gpu_decoder_destroy(dec);
    loader_destroy(enc);
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(labels));
    CUDA_CHECK(cudaStreamDestroy(stream));
    free(want), free(got);
    source_free(&src);
}

/* The kernel alone at batch 256: 400x350 images, RandomResizedCrop boxes, to 224 in NHWC fp16. */
static void time_kernel(void) {
    enum { N = 256, W = 400, H = 350, OUT = 224 };
    ResampleSample *samples = malloc(N * sizeof *samples);
    CropRecipe recipe = {0.08f, 1.0f, 0.75f, 1.3333f, 0};
    size_t per = gpu_resample_image_bytes(W, H);
    for (int i = 0; i < N; i++)
        samples[i] = (ResampleSample){(int64_t)(i * per), gpu_resample_pitch(W), W, H, i & 1,
                                      crop_random_resized(W, H, &recipe, &rng)};
    uint8_t *images = malloc(N * per);
    for (size_t k = 0; k < N * per; k++) images[k] = (uint8_t)(k * 2654435761u >> 24);
    GpuResampleArgs a = {.n = N, .out_h = OUT, .out_w = OUT, .nhwc = 1, .out_c = 8, .out_dtype = DTYPE_F16,
                         .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};
    a.images = dev_copy(images, N * per);
    a.samples = dev_copy(samples, N * sizeof *samples);
    a.out = dev_copy(NULL, (size_t)N * OUT * OUT * 8 * 2);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    gpu_resample_batch(&a, 0);
    CUDA_CHECK(cudaEventRecord(e0, 0));
    for (int r = 0; r < 10; r++) gpu_resample_batch(&a, 0);
    CUDA_CHECK(cudaEventRecord(e1, 0));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    printf("resample kernel, batch %d of %dx%d to %d NHWC fp16: %.3f ms a batch\n", N, W, H, OUT, ms / 10);
    CUDA_CHECK(cudaFree((void *)a.images));
    CUDA_CHECK(cudaFree((void *)a.samples));
    CUDA_CHECK(cudaFree(a.out));
    free(samples), free(images);
}

int main(void) {
    test_require_gpu();
    rng = test_seed();
    check_kernel(DTYPE_F32, 0, 3);
    check_kernel(DTYPE_F32, 1, 8);
    check_kernel(DTYPE_F16, 1, 8);
    check_kernel(DTYPE_BF16, 1, 4);
    check_gpu_decode();
    time_kernel();
    return test_finish("test_data_gpu_decode");
}
