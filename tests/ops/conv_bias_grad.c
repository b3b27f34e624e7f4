/* The convolution's bias gradient (conv2d_bias_grad, ops/conv2d.h): db += the
 * sum of dy over each channel, NCHW and NHWC, against a sum in double; the
 * same bits twice (a fixed order, no atomics); dy off 16-byte alignment. On
 * f16 cases it prints its bandwidth at 256x64x224x224 (not asserted). */
#include <math.h>
#include <stdlib.h>

#include "ops/conv2d.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

/* conv2d_bias_grad reads only the shape: a 1x1 convolution whose output is
 * [n][k][h][w]. No cuDNN descriptors are needed, so none are made. */
static Conv2d bias_grad_conv(int n, int k, int h, int w) {
    Conv2d conv = {.shape = {.n = n, .c = 1, .h = h, .w = w, .k = k, .r = 1, .s = 1, .pad = 0, .stride = 1}};
    return conv;
}

/* dy starts 'offset' elements into its buffer. */
static void bias_grad_shape(const GridCase *c, int n, int k, int h, int w, int offset) {
    printf(" %dx%dx%dx%d%s\n", n, k, h, w, offset ? " (unaligned)" : "");
    DType dt = c->dtype;
    size_t plane = (size_t)h * w, count = (size_t)n * k * plane, esize = dtype_size(dt);
    float *dy = grid_random(c, dt, count, -1, 1), *db0 = grid_random(c, dt, k, -1, 1);
    double *sum = calloc(2 * (size_t)k, sizeof(double)), *magnitude = sum + k;
    float *want = host_floats(k);
    if (!sum) exit(1);
    for (size_t i = 0; i < count; i++) {
        size_t ch = c->nhwc ? i % k : (i / plane) % k;
        sum[ch] += dy[i];
        magnitude[ch] += fabs(dy[i]);
    }
    for (int ch = 0; ch < k; ch++) want[ch] = (float)(db0[ch] + sum[ch]), magnitude[ch] += fabs(db0[ch]);
    round_to(dt, want, k);

    Conv2d conv = bias_grad_conv(n, k, h, w);
    OpContext ctx = c->ctx;
    size_t ws = conv2d_bias_grad_bytes(&ctx, &conv);
    ctx.workspace = ws ? dev_bytes(ws) : NULL;
    float *padded = host_floats(count + offset);
    for (size_t i = 0; i < count; i++) padded[offset + i] = dy[i];
    void *d_buf = grid_put(c, dt, padded, count + offset), *d_dy = (char *)d_buf + offset * esize;
    void *d_db = grid_put(c, dt, db0, k);
    conv2d_bias_grad(&ctx, &conv, d_dy, d_db);
    float *got = grid_get(c, dt, d_db, k);
    grid_check_sums(c, "bias gradient (accumulated onto random db)", got, want, magnitude, k, grid_bound(c, GRID_BIAS_GRAD));

    grid_set(c, dt, d_db, db0, k);
    conv2d_bias_grad(&ctx, &conv, d_dy, d_db);
    float *again = grid_get(c, dt, d_db, k);
    grid_check_same(c, "bias gradient (second run)", again, got, k * sizeof(float));

    void *dev[] = {d_buf, d_db, ctx.workspace};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {dy, db0, sum, want, padded, got, again};
    host_free_all(host, GRID_COUNT(host));
}

/* Bytes of dy read per second; the values do not matter. */
static void bias_grad_time(const GridCase *c, int n, int k, int h, int w) {
    const int iters = 10;
    size_t bytes = (size_t)n * k * h * w * dtype_size(c->dtype);
    Conv2d conv = bias_grad_conv(n, k, h, w);
    OpContext ctx = c->ctx;
    ctx.workspace = dev_bytes(conv2d_bias_grad_bytes(&ctx, &conv));
    void *d_dy = dev_bytes(bytes), *d_db = dev_bytes(k * dtype_size(c->dtype));
    op_fill(&ctx, d_dy, 0, bytes);
    op_fill(&ctx, d_db, 0, k * dtype_size(c->dtype));
    conv2d_bias_grad(&ctx, &conv, d_dy, d_db); /* warm-up */
    cudaEvent_t start, stop;
    gpu_event_create(&start, 1);
    gpu_event_create(&stop, 1);
    gpu_event_record(start, ctx.stream);
    for (int i = 0; i < iters; i++) conv2d_bias_grad(&ctx, &conv, d_dy, d_db);
    gpu_event_record(stop, ctx.stream);
    gpu_event_sync(stop);
    float ms = gpu_event_ms(start, stop) / iters;
    printf(" %s %dx%dx%dx%d: %.3f ms, %.0f GB/s (not asserted)\n", c->name, n, k, h, w, ms, bytes / (ms * 1e6));
    gpu_event_destroy(start);
    gpu_event_destroy(stop);
    void *dev[] = {d_dy, d_db, ctx.workspace};
    grid_free_all(c, dev, GRID_COUNT(dev));
}

static void bias_grad_case(const GridCase *c) {
    if (c->device == DEVICE_CUDA) {
        bias_grad_shape(c, 8, 64, 224, 224, 0);
        bias_grad_shape(c, 256, 256, 8, 8, 0);
    }
    bias_grad_shape(c, 2, 64, 16, 16, 1);
    bias_grad_shape(c, 3, 5, 7, 9, 0);
    bias_grad_shape(c, 2, 24, 15, 17, 0);
    bias_grad_shape(c, 1, 3000, 2, 2, 0); /* NHWC: more than one block of columns */
    bias_grad_shape(c, 4, 16, 1, 1, 0);
    bias_grad_shape(c, 5, 1, 3, 3, 0);
    if (c->device == DEVICE_CUDA && c->dtype == DTYPE_F16) bias_grad_time(c, 256, 64, 224, 224);
}

const GridOp grid_op_conv_bias_grad = {
    .name = "conv_bias_grad",
    .run = bias_grad_case,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW); on the CPU the two largest shapes (the GPU's sizes)",
};
