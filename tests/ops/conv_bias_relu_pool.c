/* A first convolution block in one op (ops/conv_bias_relu_pool.h): forward
 * and backward against the CPU reference (conv2d's, then bias_relu_pool's)
 * bit for bit on grid values, where every sum is exact in fp32 on both sides
 * so that windows tie, hold zeros and negatives and pick the same maximum;
 * dw and db accumulated onto start values on the grid too, and the same bits
 * twice (a fixed order). On the GPU x and w hold NaN in the channels past c_real, which the
 * op must not read, and dw there must stay as it was. Shapes: SimpleNet's
 * (3 real channels, 64 filters), tails of pooled rows and columns past a
 * tile, 1 and 2 real channels, k not a power of 2. Continuous values check
 * the forward (a window whose top two differ by a rounding may route its
 * gradient either way, so backward is checked on the grid only). On the CPU
 * backward matches finite differences; the shapes the op does not take are
 * refused naming them. On f16 it prints its time at SimpleNet-224's size,
 * not asserted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/conv_bias_relu_pool.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

enum { PADDED = 8 }; /* the CUDA path's channels per pixel */

static size_t x_count(const Conv2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t w_count(const Conv2dShape *s) { return (size_t)s->k * s->c * 9; }
static size_t y_count(const Conv2dShape *s) { return (size_t)s->n * s->k * (s->h / 2) * (s->w / 2); }

/* n floats, multiples of unit in [-steps, steps] * unit: exact in every dtype. */
static float *grid_floats(const GridCase *c, size_t n, int steps, float unit) {
    float *v = host_floats(n);
    for (size_t i = 0; i < n; i++) v[i] = floorf(test_uniform(c->rng, (float)-steps, (float)steps + 1)) * unit;
    return v;
}

/* NCHW [n][c_real][h][w] as the CUDA path's NHWC [n][h][w][8], NaN past c_real. */
static float *padded_nhwc(const float *nchw, int n, int c_real, int h, int w) {
    float *t = to_nhwc(nchw, n, c_real, h, w, PADDED);
    for (size_t i = 0; i < (size_t)n * h * w * PADDED; i++)
        if ((int)(i % PADDED) >= c_real) t[i] = NAN;
    return t;
}

static void from_padded_nhwc(const float *t, int n, int c_real, int h, int w, float *nchw) {
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c_real; ch++)
            for (int p = 0; p < h * w; p++)
                nchw[((size_t)i * c_real + ch) * h * w + p] = t[((size_t)i * h * w + p) * PADDED + ch];
}

/* The op on c's device; dw0 and db0 the accumulators' start values (NCHW, c_real channels); y, dw, db
 * read back as NCHW. On the GPU also: the padded channels of dw kept, and a second backward's bits. */
static void run_op(const GridCase *c, const ConvBiasReluPoolShape *s, const float *x, const float *w, const float *b,
                   const float *dy, const float *dw0, const float *db0, float *y, float *dw, float *db) {
    const Conv2dShape *cs = &s->conv;
    DType dt = c->dtype;
    int n = cs->n, k = cs->k, cr = s->c_real, oh = cs->h / 2, ow = cs->w / 2;
    Conv2dShape dev_shape = *cs;
    dev_shape.c = c->device == DEVICE_CUDA ? PADDED : cr;
    ConvBiasReluPoolShape ds = {dev_shape, cr};
    size_t nx = x_count(&dev_shape), nw = w_count(&dev_shape), ny = y_count(cs);
    float *xl = c->device == DEVICE_CUDA ? padded_nhwc(x, n, cr, cs->h, cs->w) : copy_floats(x, nx);
    float *wl = c->device == DEVICE_CUDA ? padded_nhwc(w, k, cr, 3, 3) : copy_floats(w, nw);
    float *dw0l = c->device == DEVICE_CUDA ? padded_nhwc(dw0, k, cr, 3, 3) : copy_floats(dw0, nw);
    float *dyl = grid_to_layout(c, dy, n, k, oh, ow);
    OpContext ctx = c->ctx;
    size_t ws = conv_bias_relu_pool_workspace_bytes(&ctx, &ds);
    ctx.workspace = ws ? grid_alloc_bytes(c, ws) : NULL;
    void *d_x = grid_put(c, dt, xl, nx), *d_w = grid_put(c, dt, wl, nw), *d_b = grid_put(c, dt, b, k);
    void *d_dy = grid_put(c, dt, dyl, ny), *d_y = grid_alloc(c, dt, ny);
    void *d_dw = grid_put(c, dt, dw0l, nw), *d_db = grid_put(c, dt, db0, k);
    conv_bias_relu_pool_forward(&ctx, &ds, d_x, d_w, d_b, d_y);
    conv_bias_relu_pool_backward(&ctx, &ds, d_x, d_w, d_b, d_dy, d_dw, d_db);

    float *t = grid_get(c, dt, d_y, ny), *yn = grid_from_layout(c, t, n, k, oh, ow);
    memcpy(y, yn, ny * sizeof(float));
    float *got_dw = grid_get(c, dt, d_dw, nw), *got_db = grid_get(c, dt, d_db, k);
    memcpy(db, got_db, k * sizeof(float));
    if (c->device == DEVICE_CPU) {
        memcpy(dw, got_dw, nw * sizeof(float));
    } else {
        from_padded_nhwc(got_dw, k, cr, 3, 3, dw);
        int kept = 1;
        for (size_t i = 0; i < nw; i++)
            if ((int)(i % PADDED) >= cr && !isnan(got_dw[i])) kept = 0;
        CHECK_MSG(kept, "%s: dw past the real channels was written", c->name);
        grid_set(c, dt, d_dw, dw0l, nw), grid_set(c, dt, d_db, db0, k);
        conv_bias_relu_pool_backward(&ctx, &ds, d_x, d_w, d_b, d_dy, d_dw, d_db);
        float *again_dw = grid_get(c, dt, d_dw, nw), *again_db = grid_get(c, dt, d_db, k);
        grid_check_same(c, "dw (second run)", again_dw, got_dw, nw * sizeof(float));
        grid_check_same(c, "db (second run)", again_db, got_db, k * sizeof(float));
        free(again_dw), free(again_db);
    }
    void *dev[] = {d_x, d_w, d_b, d_dy, d_y, d_dw, d_db, ctx.workspace};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {xl, wl, dw0l, dyl, t, yn, got_dw, got_db};
    host_free_all(host, GRID_COUNT(host));
}

static void cbrp_shape(const GridCase *c, int n, int c_real, int h, int w, int k, int on_grid) {
    printf(" %dx%dx%dx%d, %d filters, %s\n", n, c_real, h, w, k, on_grid ? "grid values" : "random values");
    DType dt = c->dtype;
    ConvBiasReluPoolShape s = {{.n = n, .c = c_real, .h = h, .w = w, .k = k, .r = 3, .s = 3, .pad = 1, .stride = 1},
                               c_real};
    size_t nx = x_count(&s.conv), nw = w_count(&s.conv), ny = y_count(&s.conv);
    /* On the grid x * w and dy * x are multiples of 1/32: every sum below 2^19 is exact in fp32. */
    float *x = on_grid ? grid_floats(c, nx, 8, 0.25f) : grid_random(c, dt, nx, -1, 1);
    float *wt = on_grid ? grid_floats(c, nw, 4, 0.125f) : grid_random(c, dt, nw, -0.3f, 0.3f);
    float *b = on_grid ? grid_floats(c, k, 4, 0.125f) : grid_random(c, dt, k, -0.2f, 0.2f);
    float *dy = grid_floats(c, ny, 8, 0.125f);
    /* the accumulators' start on the grid too, so that start + sum is exact on both sides */
    float *dw0 = grid_floats(c, nw, 128, 1.0f / 32), *db0 = grid_floats(c, k, 128, 1.0f / 32);
    float *want_y = host_floats(ny), *want_dw = copy_floats(dw0, nw), *want_db = copy_floats(db0, k);
    conv_bias_relu_pool_forward_cpu(&s, x, wt, b, want_y);
    conv_bias_relu_pool_backward_cpu(&s, x, wt, b, dy, want_dw, want_db);
    round_to(dt, want_y, ny), round_to(dt, want_dw, nw), round_to(dt, want_db, k);

    float *y = host_floats(ny), *dw = host_floats(nw), *db = host_floats(k);
    run_op(c, &s, x, wt, b, dy, dw0, db0, y, dw, db);
    if (on_grid) {
        grid_check_same(c, "y = maxpool(relu(conv + b)) (bits)", y, want_y, ny * sizeof(float));
        grid_check_same(c, "dw, accumulated (bits)", dw, want_dw, nw * sizeof(float));
        grid_check_same(c, "db, accumulated (bits)", db, want_db, k * sizeof(float));
    } else {
        grid_check(c, "y = maxpool(relu(conv + b))", y, want_y, ny, grid_bound(c, GRID_CONV));
    }
    void *host[] = {x, wt, b, dy, dw0, db0, want_y, want_dw, want_db, y, dw, db};
    host_free_all(host, GRID_COUNT(host));
}

typedef struct {
    ConvBiasReluPoolShape s;
    float *x, *w, *b, *r, *y;
} CbrpLoss;

static double cbrp_loss(void *p) {
    CbrpLoss *l = p;
    conv_bias_relu_pool_forward_cpu(&l->s, l->x, l->w, l->b, l->y);
    return weighted_sum(l->y, l->r, y_count(&l->s.conv));
}

/* Every window's top two values of conv + b at least 'margin' apart and its maximum at least that far
 * from 0: a perturbation moving each value by less than margin / 2 keeps every choice. */
static int well_separated(const ConvBiasReluPoolShape *s, const float *x, const float *w, const float *b,
                          float margin) {
    const Conv2dShape *cs = &s->conv;
    float *z = host_floats((size_t)cs->n * cs->k * cs->h * cs->w);
    conv2d_forward_cpu(cs, x, w, b, z);
    int ok = 1;
    for (int plane = 0; plane < cs->n * cs->k; plane++)
        for (int p = 0; p < cs->h; p += 2)
            for (int q = 0; q < cs->w; q += 2) {
                const float *at = z + ((size_t)plane * cs->h + p) * cs->w + q;
                float v[4] = {at[0], at[1], at[cs->w], at[cs->w + 1]}, top = -INFINITY, second = -INFINITY;
                for (int i = 0; i < 4; i++) {
                    if (v[i] > top) second = top, top = v[i];
                    else if (v[i] > second) second = v[i];
                }
                if (top - second < margin || fabsf(top) < margin) ok = 0;
            }
    free(z);
    return ok;
}

/* d(sum r y)/dw and /db through the face on the CPU against central differences, on values drawn until
 * no step of 1e-3 crosses a tie or the ReLU's kink (each value moves by at most 1e-3 * 9 * 2 * 1). */
static void cbrp_finite_differences(const GridCase *c) {
    ConvBiasReluPoolShape s = {{.n = 1, .c = 2, .h = 4, .w = 4, .k = 3, .r = 3, .s = 3, .pad = 1, .stride = 1}, 2};
    size_t nw = w_count(&s.conv), ny = y_count(&s.conv), nx = x_count(&s.conv);
    float *x = host_floats(nx), *w = host_floats(nw), *b = host_floats(s.conv.k);
    do {
        test_fill_uniform(x, nx, c->rng, -1, 1);
        test_fill_uniform(w, nw, c->rng, -1, 1);
        test_fill_uniform(b, s.conv.k, c->rng, -0.5f, 0.5f);
    } while (!well_separated(&s, x, w, b, 0.05f));
    float *r = grid_random(c, DTYPE_F32, ny, -1, 1), *y = host_floats(ny);
    float *dw = host_floats(nw), *db = host_floats(s.conv.k);
    conv_bias_relu_pool_backward(&c->ctx, &s, x, w, b, r, dw, db);
    CbrpLoss loss = {s, x, w, b, r, y};
    double *num_w = malloc(nw * sizeof(double)), *num_b = malloc(s.conv.k * sizeof(double));
    numeric_gradient(w, nw, 1e-3f, cbrp_loss, &loss, num_w);
    check_gradient("conv_bias_relu_pool dw (finite differences)", dw, num_w, nw);
    numeric_gradient(b, s.conv.k, 1e-3f, cbrp_loss, &loss, num_b);
    check_gradient("conv_bias_relu_pool db (finite differences)", db, num_b, s.conv.k);
    void *host[] = {x, w, b, r, y, dw, db, num_w, num_b};
    host_free_all(host, GRID_COUNT(host));
}

/* Forward and backward at SimpleNet-224's size (batch 256), zeros: the values do not matter. */
static void cbrp_time(const GridCase *c) {
    const int iters = 10;
    ConvBiasReluPoolShape s = {{.n = 256, .c = PADDED, .h = 224, .w = 224, .k = 64, .r = 3, .s = 3, .pad = 1,
                                .stride = 1}, 3};
    size_t esize = dtype_size(c->dtype);
    OpContext ctx = c->ctx;
    ctx.workspace = grid_alloc_bytes(c, conv_bias_relu_pool_workspace_bytes(&ctx, &s));
    size_t sizes[] = {x_count(&s.conv), w_count(&s.conv), 64, y_count(&s.conv), w_count(&s.conv), 64};
    void *bufs[GRID_COUNT(sizes)];
    for (size_t i = 0; i < GRID_COUNT(sizes); i++) {
        bufs[i] = grid_alloc_bytes(c, sizes[i] * esize);
        op_fill(&ctx, bufs[i], 0, sizes[i] * esize);
    }
    void *x = bufs[0], *w = bufs[1], *b = bufs[2], *y = bufs[3], *dw = bufs[4], *db = bufs[5];
    cudaEvent_t start, mid, stop;
    gpu_event_create(&start, 1), gpu_event_create(&mid, 1), gpu_event_create(&stop, 1);
    conv_bias_relu_pool_forward(&ctx, &s, x, w, b, y); /* warm-up */
    conv_bias_relu_pool_backward(&ctx, &s, x, w, b, y, dw, db);
    gpu_event_record(start, ctx.stream);
    for (int i = 0; i < iters; i++) conv_bias_relu_pool_forward(&ctx, &s, x, w, b, y);
    gpu_event_record(mid, ctx.stream);
    for (int i = 0; i < iters; i++) conv_bias_relu_pool_backward(&ctx, &s, x, w, b, y, dw, db);
    gpu_event_record(stop, ctx.stream);
    gpu_event_sync(stop);
    double fwd = gpu_event_ms(start, mid) / iters, bwd = gpu_event_ms(mid, stop) / iters;
    double bytes = (double)(x_count(&s.conv) + y_count(&s.conv)) * esize;
    printf(" %s 256x8(3)x224x224 -> 64, pooled: forward %.3f ms (%.0f GB/s), backward %.3f ms (%.0f GB/s) "
           "(not asserted)\n", c->name, fwd, bytes / (fwd * 1e6), bwd, bytes / (bwd * 1e6));
    gpu_event_destroy(start), gpu_event_destroy(mid), gpu_event_destroy(stop);
    grid_free_all(c, bufs, GRID_COUNT(bufs));
    grid_free(c, ctx.workspace);
}

static void cbrp_case(const GridCase *c) {
    cbrp_shape(c, 2, 3, 16, 16, 64, 1);  /* SimpleNet's block, whole tiles */
    cbrp_shape(c, 3, 3, 12, 40, 64, 1);  /* pooled 6x20: tails of rows and columns */
    cbrp_shape(c, 2, 1, 10, 6, 16, 1);   /* one real channel; a tile mostly empty */
    cbrp_shape(c, 1, 2, 18, 34, 24, 1);  /* k = 24 */
    cbrp_shape(c, 2, 3, 16, 16, 64, 0);  /* continuous values: the forward */
    if (c->device == DEVICE_CUDA)        /* more tiles than blocks, forward (2048) and backward (528) */
        cbrp_shape(c, 160, 3, 64, 64, 64, 1);
    if (c->device == DEVICE_CPU) cbrp_finite_differences(c);
    if (c->device == DEVICE_CUDA && c->dtype == DTYPE_F16) cbrp_time(c);
}

/* ---- on the CPU ----------------------------------------------------------------- */

static void expect_refused(const OpContext *ctx, ConvBiasReluPoolShape s, const char *what) {
    const char *why = NULL;
    CHECK_MSG(!conv_bias_relu_pool_supported(ctx, &s, &why) && why, "%s was taken", what);
    if (why) printf(" refused %s: %s\n", what, why);
}

/* One way off SimpleNet's block, as a change to its shape. */
typedef struct {
    const char *what;
    int r, pad, w, stride, c, c_real, k; /* 0: the block's own */
} Misfit;

static ConvBiasReluPoolShape misfit_shape(ConvBiasReluPoolShape s, const Misfit *m) {
    if (m->r) s.conv.r = s.conv.s = m->r;
    if (m->pad) s.conv.pad = m->pad;
    if (m->w) s.conv.w = m->w;
    if (m->stride) s.conv.stride = m->stride;
    if (m->c) s.conv.c = m->c;
    if (m->c_real) s.c_real = m->c_real;
    if (m->k) s.conv.k = m->k;
    return s;
}

/* The shapes the paths do not take are refused with a reason; the GPU path's limits are checked through
 * a context that names the GPU (nothing runs on it). */
static void cbrp_extras(uint64_t *rng) {
    (void)rng;
    OpContext cpu = op_context_cpu();
    ConvBiasReluPoolShape ok = {{.n = 2, .c = 3, .h = 8, .w = 8, .k = 64, .r = 3, .s = 3, .pad = 1, .stride = 1}, 3};
    CHECK_MSG(conv_bias_relu_pool_supported(&cpu, &ok, NULL), "the CPU refused SimpleNet's block");
    static const Misfit on_cpu[] = {{.what = "a 5x5 convolution", .r = 5, .pad = 2},
                                    {.what = "an odd width", .w = 9},
                                    {.what = "stride 2", .stride = 2},
                                    {.what = "c_real under c on the CPU", .c_real = 2}};
    for (size_t i = 0; i < GRID_COUNT(on_cpu); i++) expect_refused(&cpu, misfit_shape(ok, &on_cpu[i]), on_cpu[i].what);

    OpContext gpu = cpu;
    gpu.device = DEVICE_CUDA, gpu.dtype = DTYPE_F16, gpu.nhwc = 1;
    ConvBiasReluPoolShape dev = ok;
    dev.conv.c = PADDED;
    CHECK_MSG(conv_bias_relu_pool_supported(&gpu, &dev, NULL), "the GPU path refused SimpleNet's padded block");
    static const Misfit on_gpu[] = {{.what = "128 filters on the GPU", .k = 128},
                                    {.what = "20 filters on the GPU", .k = 20},
                                    {.what = "4 real channels on the GPU", .c_real = 4},
                                    {.what = "16 channels on the GPU", .c = 16}};
    for (size_t i = 0; i < GRID_COUNT(on_gpu); i++) expect_refused(&gpu, misfit_shape(dev, &on_gpu[i]), on_gpu[i].what);
    gpu.dtype = DTYPE_F32;
    expect_refused(&gpu, dev, "f32 on the GPU");
    gpu.dtype = DTYPE_F16, gpu.nhwc = 0;
    expect_refused(&gpu, dev, "NCHW on the GPU");
}

const GridOp grid_op_conv_bias_relu_pool = {
    .name = "conv_bias_relu_pool",
    .run = cbrp_case,
    .extras = cbrp_extras,
    .cuda_types = GRID_F16 | GRID_BF16,
    .cuda_layouts = GRID_NHWC,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cuda f32 and NCHW (the CUDA path is f16 or bf16, NHWC: the input layer under AMP); cpu nhwc",
};
