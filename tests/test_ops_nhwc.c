/* Channels-last (NHWC) on the CUDA path, in f32, f16 and bf16: conv2d and
 * maxpool against the NCHW CPU reference (inputs and weights transposed on the
 * host, results transposed back), the bias-gradient kernels of both layouts
 * against a sum in double, and the padded NCHW -> NHWC input cast against the
 * host's. Prints the bias gradient's bandwidth at 256x64x224x224 in f16 (not
 * asserted).
 *
 * As in test_ops_amp.c, inputs are rounded to the type on the host first and
 * the reference rounds where the device does; outputs are poisoned with NaN
 * before each call, so an element not written fails. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cast.h"
#include "ops/conv2d.h"
#include "ops/maxpool.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/op_buffers.h"

#define CONV_WORKSPACE_LIMIT ((size_t)512 << 20)
/* Full fp32 and deterministic algorithms, as the other op tests. */
static const ConvAlgoPolicy deterministic_policy = {CONV_WORKSPACE_LIMIT, 0, 1, 0};

static const DType all_types[3] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};

static uint64_t rng;
static GpuContext g;

static void upload(void *dst, const void *src, size_t bytes) { upload_on(g.compute, dst, src, bytes); }
static void download(void *dst, const void *src, size_t bytes) { download_on(g.compute, dst, src, bytes); }

/* Relative L2 bounds: fp32 as in test_ops_cuda.c, f16 and bf16 as in test_ops_amp.c. */
static double tol_for(DType dt, double f32, double f16, double bf16) {
    return dt == DTYPE_F32 ? f32 : dt == DTYPE_F16 ? f16 : bf16;
}

/* ---- host and device buffers -------------------------------------------------- */

/* Uniform in [lo, hi), already rounded to dt. */
static float *random_values(DType dt, size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, &rng, lo, hi);
    round_to(dt, p, n);
    return p;
}

/* host's n values as dt, into dev. */
static void upload_values(DType dt, void *dev, const float *host, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    cast_from_f32_cpu(dt, host, bits, n);
    upload(dev, bits, n * dtype_size(dt));
    free(bits);
}

static void *dev_elements(DType dt, size_t n) { return dev_bytes(n * dtype_size(dt)); }

static void *dev_values(DType dt, const float *host, size_t n) { return dev_values_on(g.compute, dt, host, n); }

/* n elements of dt from the device, widened to float on the host. */
static float *download_values(DType dt, const void *dev, size_t n) {
    return download_values_on(g.compute, dt, dev, n);
}

static void *download_bytes(const void *dev, size_t bytes) {
    void *p = host_bytes(bytes);
    download(p, dev, bytes);
    return p;
}

/* All-ones bytes are a NaN in f32, f16 and bf16 alike. */
static void poison(void *dev, DType dt, size_t n) {
    CUDA_CHECK(cudaMemsetAsync(dev, 0xff, n * dtype_size(dt), g.compute));
}

static void check_rel(const char *what, DType dt, const float *gpu, const float *cpu, size_t n,
                      double tol) {
    double err = test_rel_error(gpu, cpu, n);
    printf("  %-5s %-56s rel err %.2e (bound %.1e)\n", dtype_name(dt), what, err, tol);
    CHECK_MSG(err <= tol, "%s %s: relative error %.3g > %.3g", dtype_name(dt), what, err, tol);
}

static int same_bytes(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static double rms(const float *x, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return n ? sqrt(sum / n) : 0;
}

/* Accumulator start values of about the size of what is added to them, so an
 * accumulator that was overwritten instead is off by ~70%. */
static float *accumulator_start(DType dt, const float *added, size_t n) {
    float size = (float)rms(added, n);
    return random_values(dt, n, -size, size);
}

static void add_into(float *acc, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

static void free_all(void **p, size_t count) {
    for (size_t i = 0; i < count; i++) free(p[i]);
}

static void cuda_free_all(void **p, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (p[i]) CUDA_CHECK(cudaFree(p[i]));
}

#define COUNT(a) (sizeof(a) / sizeof *(a))

/* ---- layouts ------------------------------------------------------------------ */

/* ---- cast NCHW -> NHWC ------------------------------------------------------------ */

static void test_cast_nchw_to_nhwc(DType dt, int n, int c, int h, int w, int c_padded) {
    printf("cast f32 nchw -> %s nhwc %dx%dx%dx%d, channels padded to %d\n", dtype_name(dt), n, c,
           h, w, c_padded);
    size_t nx = (size_t)n * c * h * w, pixels = (size_t)n * h * w, ny = pixels * c_padded;
    size_t esize = dtype_size(dt), bytes = ny * esize;
    float *x = host_floats(nx);
    test_fill_uniform(x, nx, &rng, -3, 3); /* not rounded: the cast rounds */
    void *want = host_bytes(bytes);
    cast_nchw_to_nhwc_cpu(dt, x, want, n, c, h, w, c_padded);

    /* the host reference is the transposition, padded with zeros, then the plain cast */
    float *x_nhwc = to_nhwc(x, n, c, h, w, c_padded);
    void *plain = host_bytes(bytes);
    cast_from_f32_cpu(dt, x_nhwc, plain, ny);
    CHECK_MSG(same_bytes(want, plain, bytes), "%s cast nchw -> nhwc (host) is not transpose + cast",
              dtype_name(dt));

    float *d_x = dev_bytes(nx * sizeof(float));
    void *d_y = dev_elements(dt, ny);
    upload(d_x, x, nx * sizeof(float));
    poison(d_y, dt, ny);
    cast_nchw_to_nhwc_cuda(dt, d_x, d_y, n, c, h, w, c_padded, g.compute);
    unsigned char *got = download_bytes(d_y, bytes);
    CHECK_MSG(same_bytes(got, want, bytes), "%s cast nchw -> nhwc: device and host differ",
              dtype_name(dt));
    size_t nonzero_padding = 0;
    for (size_t p = 0; p < pixels; p++)
        for (size_t b = (size_t)c * esize; b < (size_t)c_padded * esize; b++)
            nonzero_padding += got[p * c_padded * esize + b] != 0;
    CHECK_MSG(nonzero_padding == 0, "%s cast nchw -> nhwc: %zu padding bytes are not zero",
              dtype_name(dt), nonzero_padding);

    void *host[] = {x, want, x_nhwc, plain, got};
    free_all(host, COUNT(host));
    void *dev[] = {d_x, d_y};
    cuda_free_all(dev, COUNT(dev));
}

/* ---- maxpool ------------------------------------------------------------------ */

/* With 'ties', inputs take only the values 0, 1, 2: the first maximum of a
 * window must win in NHWC as in NCHW. */
static void test_maxpool_nhwc(DType dt, Pool2dShape s, int ties) {
    printf("maxpool nhwc %s %dx%dx%dx%d%s\n", dtype_name(dt), s.n, s.c, s.h, s.w,
           ties ? " (ties)" : "");
    size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = nx / 4;
    float *x = random_values(dt, nx, -1, 1), *dy = random_values(dt, ny, -1, 1);
    if (ties)
        for (size_t i = 0; i < nx; i++) x[i] = floorf((x[i] + 1.0f) * 1.5f);
    float *y = host_floats(ny), *dx = host_floats(nx);
    maxpool2x2_forward_cpu(&s, x, y);
    maxpool2x2_backward_cpu(&s, x, y, dy, dx);

    MaxPoolCuda p;
    maxpool2x2_cuda_init(&p, &s, dt, 1);
    CHECK(p.dtype == dt && p.nhwc == 1);
    float *x_nhwc = to_nhwc(x, s.n, s.c, s.h, s.w, s.c);
    float *dy_nhwc = to_nhwc(dy, s.n, s.c, s.h / 2, s.w / 2, s.c);
    void *d_x = dev_values(dt, x_nhwc, nx), *d_y = dev_elements(dt, ny);
    void *d_dy = dev_values(dt, dy_nhwc, ny), *d_dx = dev_elements(dt, nx);
    poison(d_y, dt, ny);
    poison(d_dx, dt, nx);
    maxpool2x2_forward_cuda(&p, g.cudnn, d_x, d_y);
    maxpool2x2_backward_cuda(&p, g.cudnn, d_x, d_y, d_dy, d_dx);
    float *gy_nhwc = download_values(dt, d_y, ny), *gdx_nhwc = download_values(dt, d_dx, nx);
    float *gy = to_nchw(gy_nhwc, s.n, s.c, s.h / 2, s.w / 2);
    float *gdx = to_nchw(gdx_nhwc, s.n, s.c, s.h, s.w);
    /* a selection: exact in any type */
    check_rel(ties ? "maxpool nhwc y (ties)" : "maxpool nhwc y", dt, gy, y, ny, 0);
    check_rel(ties ? "maxpool nhwc dx (ties: first maximum)" : "maxpool nhwc dx", dt, gdx, dx, nx,
              0);

    maxpool2x2_cuda_destroy(&p);
    void *host[] = {x, dy, y, dx, x_nhwc, dy_nhwc, gy_nhwc, gdx_nhwc, gy, gdx};
    free_all(host, COUNT(host));
    void *dev[] = {d_x, d_y, d_dy, d_dx};
    cuda_free_all(dev, COUNT(dev));
}

/* ---- conv2d ------------------------------------------------------------------ */

/* y as the device forms it: the convolution stored in dt, then the bias added
 * and stored again (for f32 both roundings are the identity). */
static void conv_forward_reference(DType dt, const Conv2dShape *s, const float *x, const float *w,
                                   const float *b, float *y) {
    size_t plane = (size_t)conv2d_out_h(s) * conv2d_out_w(s), ny = (size_t)s->n * s->k * plane;
    float *zero = host_floats(s->k);
    conv2d_forward_cpu(s, x, w, zero, y);
    round_to(dt, y, ny);
    for (size_t i = 0; i < ny; i++) y[i] += b[(i / plane) % s->k];
    round_to(dt, y, ny);
    free(zero);
}

/* The input's channels from real_c on are zero, as the first layer's padded
 * input is: the output must not depend on their weights, and their weight
 * gradient is exactly zero (dw keeps its start value to the bit). */
static void test_conv_nhwc(DType dt, Conv2dShape s, int real_c) {
    int oh = conv2d_out_h(&s), ow = conv2d_out_w(&s), rs = s.r * s.s;
    size_t plane = (size_t)s.h * s.w;
    size_t nx = (size_t)s.n * s.c * plane, nw = (size_t)s.k * s.c * rs;
    size_t ny = (size_t)s.n * s.k * oh * ow;
    float w_scale = 1.0f / sqrtf((float)(real_c * rs));
    float *x = random_values(dt, nx, -1, 1), *w = random_values(dt, nw, -w_scale, w_scale);
    float *b = random_values(dt, s.k, -1, 1), *dy = random_values(dt, ny, -1, 1);
    for (int i = 0; i < s.n; i++)
        memset(x + ((size_t)i * s.c + real_c) * plane, 0, (s.c - real_c) * plane * sizeof(float));

    float *y = host_floats(ny), *dx = host_floats(nx);
    float *dw_added = host_floats(nw), *db_added = host_floats(s.k);
    conv_forward_reference(dt, &s, x, w, b, y);
    conv2d_backward_cpu(&s, x, w, dy, dx, dw_added, db_added);
    round_to(dt, dx, nx);
    float *dw0 = accumulator_start(dt, dw_added, nw), *db0 = accumulator_start(dt, db_added, s.k);
    float *dw = copy_floats(dw0, nw), *db = copy_floats(db0, s.k);
    add_into(dw, dw_added, nw);
    add_into(db, db_added, s.k);
    round_to(dt, dw, nw);
    round_to(dt, db, s.k);

    Conv2dCuda c;
    conv2d_cuda_init(&c, g.cudnn, &s, dt, 1, &deterministic_policy);
    CHECK(c.dtype == dt && c.nhwc == 1);
    printf("conv nhwc %s %dx%dx%dx%d (%d real) -> %d, %dx%d pad %d stride %d: algos fwd %d "
           "bwd-data %d bwd-filter %d, workspace %zu bytes\n", dtype_name(dt), s.n, s.c, s.h, s.w,
           real_c, s.k, s.r, s.s, s.pad, s.stride, (int)c.fwd_algo, (int)c.bwd_data_algo,
           (int)c.bwd_filter_algo, c.workspace_bytes);
    /* the bias gradient's partial sums live in the workspace */
    CHECK(c.workspace_bytes >= conv2d_bias_grad_workspace_bytes(s.n, s.k, oh, ow, 1));
    float *x_nhwc = to_nhwc(x, s.n, s.c, s.h, s.w, s.c);
    float *w_nhwc = to_nhwc(w, s.k, s.c, s.r, s.s, s.c);
    float *dy_nhwc = to_nhwc(dy, s.n, s.k, oh, ow, s.k);
    float *dw0_nhwc = to_nhwc(dw0, s.k, s.c, s.r, s.s, s.c);
    void *ws = c.workspace_bytes ? dev_bytes(c.workspace_bytes) : NULL;
    void *d_x = dev_values(dt, x_nhwc, nx), *d_w = dev_values(dt, w_nhwc, nw);
    void *d_b = dev_values(dt, b, s.k), *d_dy = dev_values(dt, dy_nhwc, ny);
    void *d_y = dev_elements(dt, ny), *d_dx = dev_elements(dt, nx);
    void *d_dw = dev_values(dt, dw0_nhwc, nw), *d_db = dev_values(dt, db0, s.k);

    poison(d_y, dt, ny);
    conv2d_forward_cuda(&c, g.cudnn, d_x, d_w, d_b, d_y, ws);
    poison(d_dx, dt, nx);
    conv2d_backward_cuda(&c, g.cudnn, d_x, d_w, d_dy, d_dx, d_dw, d_db, ws);
    float *gy_nhwc = download_values(dt, d_y, ny), *gdx_nhwc = download_values(dt, d_dx, nx);
    float *gdw_nhwc = download_values(dt, d_dw, nw), *gdb = download_values(dt, d_db, s.k);
    float *gy = to_nchw(gy_nhwc, s.n, s.k, oh, ow), *gdx = to_nchw(gdx_nhwc, s.n, s.c, s.h, s.w);
    float *gdw = to_nchw(gdw_nhwc, s.k, s.c, s.r, s.s);
    double tol = tol_for(dt, 1e-4, 5e-3, 2e-2);
    check_rel("conv nhwc y", dt, gy, y, ny, tol);
    check_rel("conv nhwc dx", dt, gdx, dx, nx, tol);
    check_rel("conv nhwc dw (accumulated onto random dw)", dt, gdw, dw, nw, tol);
    check_rel("conv nhwc db (accumulated onto random db)", dt, gdb, db, s.k, tol);
    size_t padded_moved = 0;
    for (int k = 0; k < s.k; k++)
        for (int ch = real_c; ch < s.c; ch++)
            for (int i = 0; i < rs; i++) {
                size_t at = ((size_t)k * s.c + ch) * rs + i;
                padded_moved += memcmp(&gdw[at], &dw0[at], sizeof(float)) != 0;
            }
    CHECK_MSG(padded_moved == 0, "%s conv nhwc: %zu weight gradients of zero input channels moved",
              dtype_name(dt), padded_moved);

    /* again with dx == NULL: the same dw; db (our own fixed-order kernels) the same bits */
    void *d_dw2 = dev_values(dt, dw0_nhwc, nw), *d_db2 = dev_values(dt, db0, s.k);
    conv2d_backward_cuda(&c, g.cudnn, d_x, d_w, d_dy, NULL, d_dw2, d_db2, ws);
    float *gdw2 = download_values(dt, d_dw2, nw), *gdb2 = download_values(dt, d_db2, s.k);
    check_rel("conv nhwc dw (dx == NULL, vs the first run)", dt, gdw2, gdw_nhwc, nw, tol / 4);
    CHECK_MSG(same_bytes(gdb, gdb2, s.k * sizeof(float)), "%s conv nhwc db is not reproducible",
              dtype_name(dt));

    conv2d_cuda_destroy(&c);
    void *host[] = {x, w, b, dy, y, dx, dw_added, db_added, dw0, db0, dw, db, x_nhwc, w_nhwc,
                    dy_nhwc, dw0_nhwc, gy_nhwc, gdx_nhwc, gdw_nhwc, gdb, gy, gdx, gdw, gdw2, gdb2};
    free_all(host, COUNT(host));
    void *dev[] = {ws, d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db, d_dw2, d_db2};
    cuda_free_all(dev, COUNT(dev));
}

/* ---- bias gradient -------------------------------------------------------------- */

/* db += the sum of dy per channel, against a sum in double. dy starts 'offset'
 * elements into its buffer: off 16-byte alignment, the kernels read one
 * element at a time. */
static void test_bias_grad(DType dt, int nhwc, int n, int k, int h, int w, int offset) {
    printf("bias gradient %s %s %dx%dx%dx%d%s\n", dtype_name(dt), nhwc ? "nhwc" : "nchw", n, k, h,
           w, offset ? " (unaligned)" : "");
    size_t plane = (size_t)h * w, count = (size_t)n * k * plane, esize = dtype_size(dt);
    float *dy = random_values(dt, count, -1, 1), *db0 = random_values(dt, k, -1, 1);
    double *sum = calloc((size_t)k, sizeof(double));
    float *want = host_floats(k);
    if (!sum) exit(1);
    for (size_t i = 0; i < count; i++) sum[nhwc ? i % k : (i / plane) % k] += dy[i];
    for (int ch = 0; ch < k; ch++) want[ch] = (float)(db0[ch] + sum[ch]);
    round_to(dt, want, k);

    void *d_buf = dev_elements(dt, count + offset), *d_dy = (char *)d_buf + offset * esize;
    upload_values(dt, d_dy, dy, count);
    void *d_db = dev_values(dt, db0, k);
    void *ws = dev_bytes(conv2d_bias_grad_workspace_bytes(n, k, h, w, nhwc));
    conv2d_bias_grad_cuda(dt, nhwc, n, k, h, w, d_dy, d_db, ws, g.compute);
    float *got = download_values(dt, d_db, k);
    check_rel("bias gradient (accumulated onto random db)", dt, got, want, k,
              tol_for(dt, 1e-5, 1e-3, 8e-3));

    upload_values(dt, d_db, db0, k);
    conv2d_bias_grad_cuda(dt, nhwc, n, k, h, w, d_dy, d_db, ws, g.compute);
    float *again = download_values(dt, d_db, k);
    CHECK_MSG(same_bytes(got, again, k * sizeof(float)), "%s %s bias gradient is not reproducible",
              dtype_name(dt), nhwc ? "nhwc" : "nchw");

    void *host[] = {dy, db0, sum, want, got, again};
    free_all(host, COUNT(host));
    void *dev[] = {d_buf, d_db, ws};
    cuda_free_all(dev, COUNT(dev));
}

/* Bytes of dy read per second; the values do not matter. */
static void time_bias_grad(DType dt, int nhwc, int n, int k, int h, int w) {
    const int iters = 10;
    size_t bytes = (size_t)n * k * h * w * dtype_size(dt);
    void *d_dy = dev_bytes(bytes), *d_db = dev_elements(dt, k);
    void *ws = dev_bytes(conv2d_bias_grad_workspace_bytes(n, k, h, w, nhwc));
    CUDA_CHECK(cudaMemsetAsync(d_dy, 0, bytes, g.compute));
    CUDA_CHECK(cudaMemsetAsync(d_db, 0, k * dtype_size(dt), g.compute));
    conv2d_bias_grad_cuda(dt, nhwc, n, k, h, w, d_dy, d_db, ws, g.compute); /* warm-up */
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start, g.compute));
    for (int i = 0; i < iters; i++)
        conv2d_bias_grad_cuda(dt, nhwc, n, k, h, w, d_dy, d_db, ws, g.compute);
    CUDA_CHECK(cudaEventRecord(stop, g.compute));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    ms /= iters;
    printf("bias gradient %s %s %dx%dx%dx%d: %.3f ms, %.0f GB/s\n", dtype_name(dt),
           nhwc ? "nhwc" : "nchw", n, k, h, w, ms, bytes / (ms * 1e6));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    void *dev[] = {d_dy, d_db, ws};
    cuda_free_all(dev, COUNT(dev));
}

int main(void) {
    test_require_gpu();
    rng = test_seed();
    gpu_context_init(&g, 0);

    for (int t = 0; t < 3; t++) {
        DType dt = all_types[t];
        test_cast_nchw_to_nhwc(dt, 4, 3, 32, 32, 8);
        test_cast_nchw_to_nhwc(dt, 3, 3, 7, 5, 4);
        test_cast_nchw_to_nhwc(dt, 2, 3, 9, 11, 3); /* no padding */
        test_cast_nchw_to_nhwc(dt, 2, 3, 224, 224, 8);

        test_maxpool_nhwc(dt, (Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 0);
        test_maxpool_nhwc(dt, (Pool2dShape){.n = 3, .c = 5, .h = 6, .w = 10}, 0);
        test_maxpool_nhwc(dt, (Pool2dShape){.n = 2, .c = 64, .h = 224, .w = 224}, 0);
        test_maxpool_nhwc(dt, (Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 1);
        test_maxpool_nhwc(dt, (Pool2dShape){.n = 2, .c = 3, .h = 8, .w = 6}, 1);

        /* SimpleNet's convolutions, the first on 3 channels padded to 8, and a stride 2 */
        test_conv_nhwc(dt, (Conv2dShape){.n = 8, .c = 8, .h = 32, .w = 32, .k = 64, .r = 3, .s = 3, .pad = 1, .stride = 1}, 3);
        test_conv_nhwc(dt, (Conv2dShape){.n = 2, .c = 8, .h = 224, .w = 224, .k = 64, .r = 3, .s = 3, .pad = 1, .stride = 1}, 3);
        test_conv_nhwc(dt, (Conv2dShape){.n = 8, .c = 64, .h = 16, .w = 16, .k = 128, .r = 3, .s = 3, .pad = 1, .stride = 1}, 64);
        test_conv_nhwc(dt, (Conv2dShape){.n = 8, .c = 128, .h = 8, .w = 8, .k = 256, .r = 3, .s = 3, .pad = 1, .stride = 1}, 128);
        test_conv_nhwc(dt, (Conv2dShape){.n = 4, .c = 16, .h = 15, .w = 17, .k = 32, .r = 3, .s = 3, .pad = 1, .stride = 2}, 16);

        for (int nhwc = 0; nhwc < 2; nhwc++) {
            test_bias_grad(dt, nhwc, 8, 64, 224, 224, 0);
            test_bias_grad(dt, nhwc, 256, 256, 8, 8, 0);
            test_bias_grad(dt, nhwc, 2, 64, 16, 16, 1);
            test_bias_grad(dt, nhwc, 3, 5, 7, 9, 0);
            test_bias_grad(dt, nhwc, 2, 24, 15, 17, 0);
            test_bias_grad(dt, nhwc, 1, 3000, 2, 2, 0); /* NHWC: more than one block of columns */
            test_bias_grad(dt, nhwc, 4, 16, 1, 1, 0);
            test_bias_grad(dt, nhwc, 5, 1, 3, 3, 0);
        }
    }

    time_bias_grad(DTYPE_F16, 0, 256, 64, 224, 224);
    time_bias_grad(DTYPE_F16, 1, 256, 64, 224, 224);

    gpu_context_destroy(&g);
    return test_finish("test_ops_nhwc");
}
