/* The whitening convolution with its bias and GELU in one pass
 * (ops/conv_bias_gelu.h): forward against the CPU reference (conv2d's, then
 * the GELU in double) on the same rounded inputs; the bias gradient,
 * accumulated onto a random db, against the CPU's, and the same bits twice
 * (a fixed order); shapes that take the window kernels (2x2 over 3 real of 8
 * channels, airbench's padded image, 2x2 and 3x3 over 8, k in 16-byte packs,
 * in NHWC) and shapes and buffers that take the plain ones (other sizes, x
 * off 16-byte alignment). x holds random values in the channels past c_real
 * too, which the op must skip. On the CPU the bias
 * gradient matches finite differences; the shapes the op does not take are
 * refused naming them. On f16 NHWC it prints its time at airbench's size
 * (2000x8x32x32 -> 24 channels), not asserted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/conv_bias_gelu.h"
#include "ops/gelu_math.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

/* fp32 math rounded once, as ops/gelu's (its bounds); the fp32 convolution's
 * sums in another order add a few units of 2^-24. */
static const GridBound CBG_BOUND = {1e-5, 1e-3, 8e-3};

static size_t x_count(const ConvBiasGeluShape *s) { return (size_t)s->conv.n * s->conv.c * s->conv.h * s->conv.w; }
static size_t w_count(const ConvBiasGeluShape *s) { return (size_t)s->conv.k * s->conv.c * s->conv.r * s->conv.s; }
static size_t y_count(const ConvBiasGeluShape *s) {
    return (size_t)s->conv.n * s->conv.k * conv2d_out_h(&s->conv) * conv2d_out_w(&s->conv);
}

/* An image tensor in c's layout on c's device, 'offset' elements into its buffer (*base: the buffer). */
static void *put_image(const GridCase *c, const float *nchw, int n, int ch, int h, int w, int offset, void **base) {
    size_t count = (size_t)n * ch * h * w;
    float *laid = grid_to_layout(c, nchw, n, ch, h, w), *padded = host_floats(count + offset);
    memcpy(padded + offset, laid, count * sizeof(float));
    *base = grid_put(c, c->dtype, padded, count + offset);
    free(laid), free(padded);
    return (char *)*base + offset * dtype_size(c->dtype);
}

/* The reference's db0 + the sum over each channel of dy GELU'(z), and the size of its terms. */
static void reference_bias_grad(const ConvBiasGeluShape *s, const float *x, const float *w, const float *b,
                                const float *dy, const float *db0, float *want, double *magnitude) {
    size_t ny = y_count(s), plane = ny / s->conv.n / s->conv.k;
    float *z = host_floats(ny);
    conv2d_forward_cpu(&s->conv, x, w, b, z); /* the size of the terms: the padding channels' change it little */
    for (int k = 0; k < s->conv.k; k++) want[k] = db0[k], magnitude[k] = fabs(db0[k]);
    for (size_t i = 0; i < ny; i++) magnitude[i / plane % s->conv.k] += fabs(dy[i] * gelu_grad_d(z[i]));
    conv_bias_gelu_backward_cpu(s, x, w, b, dy, want);
    free(z);
}

/* x starts 'offset' elements into its buffer (off 16-byte alignment: the plain kernels). */
static void cbg_shape(const GridCase *c, Conv2dShape conv, int c_real, int offset) {
    printf(" %dx%dx%dx%d (%d real channels), %d filters %dx%d%s\n", conv.n, conv.c, conv.h, conv.w, c_real, conv.k,
           conv.r, conv.s, offset ? " (x unaligned)" : "");
    ConvBiasGeluShape s = {conv, c_real};
    DType dt = c->dtype;
    int p = conv2d_out_h(&conv), q = conv2d_out_w(&conv), k = conv.k;
    size_t nx = x_count(&s), nw = w_count(&s), ny = y_count(&s);
    float *x = grid_random(c, dt, nx, -2, 2), *w = grid_random(c, dt, nw, -0.5f, 0.5f);
    float *b = grid_random(c, dt, k, -1, 1), *dy = grid_random(c, dt, ny, -1, 1), *db0 = grid_random(c, dt, k, -1, 1);
    float *y = host_floats(ny), *want = host_floats(k);
    double *magnitude = malloc(k * sizeof(double));
    if (!magnitude) exit(1);
    conv_bias_gelu_forward_cpu(&s, x, w, b, y);
    round_to(dt, y, ny);
    reference_bias_grad(&s, x, w, b, dy, db0, want, magnitude);
    round_to(dt, want, k);

    OpContext ctx = c->ctx;
    size_t ws = conv_bias_gelu_workspace_bytes(&ctx, &s);
    ctx.workspace = ws ? dev_bytes(ws) : NULL;
    void *x_buf, *w_buf, *dy_buf;
    void *d_x = put_image(c, x, conv.n, conv.c, conv.h, conv.w, offset, &x_buf);
    void *d_w = put_image(c, w, k, conv.c, conv.r, conv.s, 0, &w_buf), *d_b = grid_put(c, dt, b, k);
    void *d_dy = put_image(c, dy, conv.n, k, p, q, 0, &dy_buf), *d_y = grid_alloc(c, dt, ny);
    void *d_db = grid_put(c, dt, db0, k);
    conv_bias_gelu_forward(&ctx, &s, d_x, d_w, d_b, d_y);
    float *laid = grid_get(c, dt, d_y, ny), *got_y = grid_from_layout(c, laid, conv.n, k, p, q);
    grid_check(c, "y = gelu(conv + b)", got_y, y, ny, grid_bound(c, CBG_BOUND));

    conv_bias_gelu_backward(&ctx, &s, d_x, d_w, d_b, d_dy, d_db);
    float *got = grid_get(c, dt, d_db, k);
    grid_check_sums(c, "bias gradient (accumulated onto random db)", got, want, magnitude, k,
                    grid_bound(c, GRID_BIAS_GRAD));
    grid_set(c, dt, d_db, db0, k);
    conv_bias_gelu_backward(&ctx, &s, d_x, d_w, d_b, d_dy, d_db);
    float *again = grid_get(c, dt, d_db, k);
    grid_check_same(c, "bias gradient (second run)", again, got, k * sizeof(float));

    void *dev[] = {x_buf, w_buf, d_b, dy_buf, d_y, d_db, ctx.workspace};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, w, b, dy, db0, y, want, magnitude, laid, got_y, got, again};
    host_free_all(host, GRID_COUNT(host));
}

typedef struct {
    ConvBiasGeluShape s;
    const float *x, *w, *r;
    float *b, *y;
} BiasLoss;

static double bias_loss(void *p) {
    BiasLoss *l = p;
    conv_bias_gelu_forward_cpu(&l->s, l->x, l->w, l->b, l->y);
    return weighted_sum(l->y, l->r, y_count(&l->s));
}

/* d(sum r y)/db through the face on the CPU against central differences. */
static void cbg_finite_differences(const GridCase *c) {
    ConvBiasGeluShape s = {{.n = 2, .c = 4, .h = 6, .w = 5, .k = 6, .r = 2, .s = 2, .pad = 0, .stride = 1}, 3};
    float *x = grid_random(c, DTYPE_F32, x_count(&s), -2, 2), *w = grid_random(c, DTYPE_F32, w_count(&s), -1, 1);
    int k = s.conv.k;
    float *b = grid_random(c, DTYPE_F32, k, -1, 1), *r = grid_random(c, DTYPE_F32, y_count(&s), -1, 1);
    float *y = host_floats(y_count(&s)), *db = host_floats(k);
    double *num = malloc(k * sizeof(double));
    BiasLoss loss = {s, x, w, r, b, y};
    numeric_gradient(b, k, 1e-2f, bias_loss, &loss, num);
    memset(db, 0, k * sizeof(float));
    conv_bias_gelu_backward(&c->ctx, &s, x, w, b, r, db);
    check_gradient("conv_bias_gelu db (finite differences)", db, num, k);
    void *host[] = {x, w, b, r, y, db, num};
    host_free_all(host, GRID_COUNT(host));
}

/* Forward and backward at airbench's size, all zeros: the values do not matter. */
static void cbg_time(const GridCase *c) {
    const int iters = 10;
    ConvBiasGeluShape s = {{.n = 2000, .c = 8, .h = 32, .w = 32, .k = 24, .r = 2, .s = 2, .pad = 0, .stride = 1}, 3};
    int k = s.conv.k;
    size_t esize = dtype_size(c->dtype);
    OpContext ctx = c->ctx;
    ctx.workspace = dev_bytes(conv_bias_gelu_workspace_bytes(&ctx, &s));
    void *x = dev_bytes(x_count(&s) * esize), *w = dev_bytes(w_count(&s) * esize), *b = dev_bytes(k * esize);
    void *y = dev_bytes(y_count(&s) * esize), *db = dev_bytes(k * esize);
    void *bufs[] = {x, w, b, y, db};
    size_t sizes[] = {x_count(&s), w_count(&s), k, y_count(&s), k};
    for (size_t i = 0; i < GRID_COUNT(bufs); i++) op_fill(&ctx, bufs[i], 0, sizes[i] * esize);
    cudaEvent_t start, mid, stop;
    gpu_event_create(&start, 1), gpu_event_create(&mid, 1), gpu_event_create(&stop, 1);
    conv_bias_gelu_forward(&ctx, &s, x, w, b, y); /* warm-up */
    conv_bias_gelu_backward(&ctx, &s, x, w, b, y, db);
    gpu_event_record(start, ctx.stream);
    for (int i = 0; i < iters; i++) conv_bias_gelu_forward(&ctx, &s, x, w, b, y);
    gpu_event_record(mid, ctx.stream);
    for (int i = 0; i < iters; i++) conv_bias_gelu_backward(&ctx, &s, x, w, b, y, db);
    gpu_event_record(stop, ctx.stream);
    gpu_event_sync(stop);
    double fwd = gpu_event_ms(start, mid) / iters, bwd = gpu_event_ms(mid, stop) / iters;
    double fwd_bytes = (double)(x_count(&s) + y_count(&s)) * esize, bwd_bytes = fwd_bytes;
    printf(" %s 2000x8(3)x32x32 -> 24: forward %.3f ms (%.0f GB/s), bias gradient %.3f ms (%.0f GB/s) (not asserted)\n",
           c->name, fwd, fwd_bytes / (fwd * 1e6), bwd, bwd_bytes / (bwd * 1e6));
    gpu_event_destroy(start), gpu_event_destroy(mid), gpu_event_destroy(stop);
    void *dev[] = {x, w, b, y, db, ctx.workspace};
    grid_free_all(c, dev, GRID_COUNT(dev));
}

static void cbg_case(const GridCase *c) {
    Conv2dShape s = {.n = 4, .c = 8, .h = 12, .w = 12, .k = 24, .r = 2, .s = 2, .pad = 0, .stride = 1};
    cbg_shape(c, s, 3, 0); /* airbench's: the 2x2 window kernel over 3 real channels in NHWC */
    cbg_shape(c, s, 8, 0);
    cbg_shape(c, s, 3, 1);
    cbg_shape(c, s, 5, 0); /* no window kernel for 5 real channels */
    cbg_shape(c, (Conv2dShape){.n = 2, .c = 8, .h = 9, .w = 7, .k = 16, .r = 3, .s = 3, .pad = 0, .stride = 1}, 8, 0);
    /* k in 16-byte packs of f32, not of f16 or bf16 */
    cbg_shape(c, (Conv2dShape){.n = 2, .c = 8, .h = 8, .w = 8, .k = 12, .r = 2, .s = 2, .pad = 0, .stride = 1}, 3, 0);
    cbg_shape(c, (Conv2dShape){.n = 3, .c = 3, .h = 6, .w = 5, .k = 5, .r = 2, .s = 3, .pad = 0, .stride = 1}, 3, 0);
    cbg_shape(c, (Conv2dShape){.n = 1, .c = 8, .h = 2, .w = 2, .k = 8, .r = 2, .s = 2, .pad = 0, .stride = 1}, 8, 0);
    if (c->device == DEVICE_CUDA) /* more than one row of partial sums */
        cbg_shape(c, (Conv2dShape){.n = 40, .c = 8, .h = 32, .w = 32, .k = 24, .r = 2, .s = 2, .pad = 0, .stride = 1},
                  3, 0);
    if (c->device == DEVICE_CPU) cbg_finite_differences(c);
    if (c->device == DEVICE_CUDA && c->dtype == DTYPE_F16 && c->nhwc) cbg_time(c);
}

/* ---- beyond the reference: the padding skipped, and the refusals, each in a child that leaves by _exit
 * from a fatal hook ---- */

static void exit_now(void) { _exit(1); }

static void forward_in_child(void *arg) {
    tc_on_fatal(exit_now);
    float x[64] = {0}, w[16] = {0}, b[4] = {0}, y[64];
    conv_bias_gelu_forward_cpu(arg, x, w, b, y);
}

static void expect_refused(ConvBiasGeluShape s, const char *want) {
    int status;
    char *text = test_child_stderr("test_op_conv_bias_gelu", forward_in_child, &s, &status);
    CHECK_MSG(status == 1, "conv_bias_gelu %s: exit status %d", want, status);
    CHECK_MSG(strstr(text, want), "conv_bias_gelu: '%s' lacks '%s'", text, want);
    free(text);
}

/* The CPU reference skips the channels past c_real: other values there change no bit of y or db. */
static void cbg_padding_skipped(uint64_t *rng) {
    ConvBiasGeluShape s = {{.n = 2, .c = 8, .h = 5, .w = 6, .k = 8, .r = 2, .s = 2, .pad = 0, .stride = 1}, 3};
    size_t nx = x_count(&s), ny = y_count(&s), plane = (size_t)s.conv.h * s.conv.w;
    float *x[2] = {host_floats(nx), host_floats(nx)}, *y[2] = {host_floats(ny), host_floats(ny)};
    float *w = host_floats(w_count(&s)), *b = host_floats(s.conv.k), *dy = host_floats(ny), db[2][8] = {{0}};
    test_fill_uniform(x[0], nx, rng, -2, 2);
    test_fill_uniform(w, w_count(&s), rng, -1, 1);
    test_fill_uniform(b, s.conv.k, rng, -1, 1);
    test_fill_uniform(dy, ny, rng, -1, 1);
    memcpy(x[1], x[0], nx * sizeof(float));
    for (int n = 0; n < s.conv.n; n++) test_fill_uniform(x[1] + (n * 8 + 3) * plane, 5 * plane, rng, -2, 2);
    for (int i = 0; i < 2; i++) {
        conv_bias_gelu_forward_cpu(&s, x[i], w, b, y[i]);
        conv_bias_gelu_backward_cpu(&s, x[i], w, b, dy, db[i]);
    }
    CHECK(memcmp(y[0], y[1], ny * sizeof(float)) == 0 && memcmp(db[0], db[1], sizeof db[0]) == 0);
    void *host[] = {x[0], x[1], y[0], y[1], w, b, dy};
    host_free_all(host, GRID_COUNT(host));
}

static void cbg_extras(uint64_t *rng) {
    cbg_padding_skipped(rng);
    ConvBiasGeluShape s = {{.n = 1, .c = 1, .h = 4, .w = 4, .k = 4, .r = 2, .s = 2, .pad = 0, .stride = 2}, 1};
    expect_refused(s, "conv_bias_gelu: input 1x1x4x4 (1 real channels), 4 filters 2x2, pad 0, stride 2: needs "
                      "stride 1, no padding");
    s.conv.stride = 1, s.conv.pad = 1;
    expect_refused(s, "conv_bias_gelu: input 1x1x4x4 (1 real channels), 4 filters 2x2, pad 1, stride 1");
    s.conv.pad = 0, s.conv.r = 5;
    expect_refused(s, "conv_bias_gelu: input 1x1x4x4 (1 real channels), 4 filters 5x2, pad 0, stride 1");
    s.conv.r = 2, s.c_real = 2;
    expect_refused(s, "conv_bias_gelu: input 1x1x4x4 (2 real channels), 4 filters 2x2, pad 0, stride 1");
    s.c_real = 0;
    expect_refused(s, "conv_bias_gelu: input 1x1x4x4 (0 real channels)");
}

const GridOp grid_op_conv_bias_gelu = {
    .name = "conv_bias_gelu",
    .run = cbg_case,
    .extras = cbg_extras,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW); on the CPU the 40-image shape and the timing",
};
