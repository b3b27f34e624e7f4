/* bias + ReLU + 2x2 max-pool (ops/bias_relu_pool.h), fused and unfused
 * (bias_relu, then maxpool; backward maxpool's then relu's, through their
 * faces): forward and backward against the CPU's fused reference bit for bit
 * (grid values, exact in every dtype, with ties, zeros and negatives; and
 * continuous ones in f32), the fused backward also in place (dx over x). On
 * the CPU: by hand, fused == unfused and NHWC == NCHW bit for bit, and finite
 * differences for x and (through the channel sums of dx the convolution's
 * bias gradient takes) the bias. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/bias_relu.h"
#include "ops/bias_relu_pool.h"
#include "ops/maxpool.h"
#include "ops/relu.h"
#include "tests/ops/grid.h"

static size_t numel(const Pool2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }

/* x on a grid of quarters and b of eighths: x + b is exact in every dtype and
 * windows tie, hold zeros and negatives. */
static void grid_values(float *x, size_t nx, float *b, int c, uint64_t *rng) {
    for (size_t i = 0; i < nx; i++) x[i] = floorf(test_uniform(rng, -8, 9)) / 4;
    for (int i = 0; i < c; i++) b[i] = floorf(test_uniform(rng, -4, 5)) / 8;
}

/* The unfused ops on c's device: y and dx from x, b, dy (x left as it is). */
static void unfused(const GridCase *c, const Pool2dShape *s, const void *d_x, const void *d_b, const void *d_dy,
                    void *d_y, void *d_dx) {
    DType dt = c->dtype;
    size_t nx = numel(s), esize = dtype_size(dt);
    void *d_relu = grid_alloc(c, dt, nx);
    op_copy(&c->ctx, d_relu, d_x, nx * esize);
    bias_relu_forward(&c->ctx, d_b, d_relu, s->n, s->c, s->h * s->w);
    size_t scratch_bytes = maxpool_scratch_bytes(&c->ctx, s);
    void *scratch = scratch_bytes ? grid_alloc_bytes(c, scratch_bytes) : NULL;
    MaxPool2d p;
    maxpool_init(&c->ctx, &p, s, scratch);
    maxpool_forward(&c->ctx, &p, d_relu, d_y);
    maxpool_backward(&c->ctx, &p, d_relu, d_y, d_dy, d_dx);
    relu_backward(&c->ctx, d_relu, d_dx, d_dx, nx);
    maxpool_destroy(&c->ctx, &p);
    grid_free(c, scratch);
    grid_free(c, d_relu);
}

static void brp_shape(const GridCase *c, int n, int ch, int h, int w, int on_grid) {
    printf(" %dx%dx%dx%d %s\n", n, ch, h, w, on_grid ? "grid values" : "random values");
    DType dt = c->dtype;
    Pool2dShape s = {.n = n, .c = ch, .h = h, .w = w};
    size_t nx = numel(&s), ny = nx / 4;
    float *x = host_floats(nx), *b = host_floats(ch), *dy = host_floats(ny);
    if (on_grid) grid_values(x, nx, b, ch, c->rng);
    else test_fill_uniform(x, nx, c->rng, -1, 1), test_fill_uniform(b, ch, c->rng, -0.5f, 0.5f);
    test_fill_uniform(dy, ny, c->rng, -1, 1);
    round_to(dt, dy, ny);
    float *want_y = host_floats(ny), *want_dx = host_floats(nx);
    bias_relu_pool_forward_cpu(&s, 0, x, b, want_y);
    bias_relu_pool_backward_cpu(&s, 0, x, b, dy, want_dx);
    round_to(dt, want_y, ny);

    float *xl = grid_to_layout(c, x, n, ch, h, w), *dyl = grid_to_layout(c, dy, n, ch, h / 2, w / 2);
    void *d_x = grid_put(c, dt, xl, nx), *d_b = grid_put(c, dt, b, ch), *d_dy = grid_put(c, dt, dyl, ny);
    void *d_y = grid_alloc(c, dt, ny), *d_dx = grid_alloc(c, dt, nx);
    if (c->fused) {
        bias_relu_pool_forward(&c->ctx, &s, d_x, d_b, d_y);
        bias_relu_pool_backward(&c->ctx, &s, d_x, d_b, d_dy, d_dx);
    } else {
        unfused(c, &s, d_x, d_b, d_dy, d_y, d_dx);
    }
    float *t = grid_get(c, dt, d_y, ny), *gy = grid_from_layout(c, t, n, ch, h / 2, w / 2);
    free(t);
    t = grid_get(c, dt, d_dx, nx);
    float *gdx = grid_from_layout(c, t, n, ch, h, w);
    free(t);
    grid_check(c, "bias_relu_pool y", gy, want_y, ny, grid_bound(c, GRID_EXACT));
    grid_check_same(c, "bias_relu_pool y (bits)", gy, want_y, ny * sizeof(float));
    grid_check(c, "bias_relu_pool dx", gdx, want_dx, nx, grid_bound(c, GRID_EXACT));
    grid_check_same(c, "bias_relu_pool dx (bits)", gdx, want_dx, nx * sizeof(float));
    if (c->fused) {
        bias_relu_pool_backward(&c->ctx, &s, d_x, d_b, d_dy, d_x); /* in place */
        t = grid_get(c, dt, d_x, nx);
        float *inplace = grid_from_layout(c, t, n, ch, h, w);
        grid_check_same(c, "bias_relu_pool dx (in place, over x)", inplace, want_dx, nx * sizeof(float));
        free(t), free(inplace);
    }
    void *dev[] = {d_x, d_b, d_dy, d_y, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, b, dy, want_y, want_dx, xl, dyl, gy, gdx};
    host_free_all(host, GRID_COUNT(host));
}

typedef struct {
    const Pool2dShape *s;
    float *x, *b, *r, *y;
} FdLoss;

static double fd_loss(void *p) {
    FdLoss *l = p;
    bias_relu_pool_forward_cpu(l->s, 0, l->x, l->b, l->y);
    return weighted_sum(l->y, l->r, numel(l->s) / 4);
}

/* Each window's four values distinct steps of 0.05 apart and x + b at least
 * 0.025 from 0, so a 1e-3 step never crosses a tie or the ReLU's kink. */
static void brp_finite_differences(const GridCase *c) {
    Pool2dShape s = {.n = 2, .c = 3, .h = 4, .w = 6};
    size_t nx = numel(&s), ny = nx / 4;
    float *x = host_floats(nx), *b = host_floats(s.c), *r = host_floats(ny), *y = host_floats(ny);
    for (size_t o = 0; o < ny; o++) {
        size_t plane = o / ((s.h / 2) * (s.w / 2)), p = o / (s.w / 2) % (s.h / 2), q = o % (s.w / 2);
        size_t top = plane * s.h * s.w + 2 * p * s.w + 2 * q, at[4] = {top, top + 1, top + s.w, top + s.w + 1};
        int start = (int)floorf(test_uniform(c->rng, -12, 9));
        int order[4] = {0, 1, 2, 3};
        for (int i = 3; i > 0; i--) {
            int j = (int)floorf(test_uniform(c->rng, 0, (float)i + 1));
            if (j > i) j = i;
            int t = order[i];
            order[i] = order[j], order[j] = t;
        }
        for (int i = 0; i < 4; i++) x[at[i]] = (start + order[i]) * 0.05f;
    }
    for (int ch = 0; ch < s.c; ch++) b[ch] = 0.025f + 0.05f * floorf(test_uniform(c->rng, -2, 3));
    test_fill_uniform(r, ny, c->rng, -1, 1);
    void *d_x = grid_put(c, DTYPE_F32, x, nx), *d_b = grid_put(c, DTYPE_F32, b, s.c);
    void *d_r = grid_put(c, DTYPE_F32, r, ny), *d_dx = grid_alloc(c, DTYPE_F32, nx);
    bias_relu_pool_backward(&c->ctx, &s, d_x, d_b, d_r, d_dx);
    float *dx = grid_get(c, DTYPE_F32, d_dx, nx);
    FdLoss loss = {&s, x, b, r, y};
    double *num_dx = malloc(nx * sizeof(double)), *num_db = malloc(s.c * sizeof(double));
    numeric_gradient(x, nx, 1e-3f, fd_loss, &loss, num_dx);
    check_gradient("bias_relu_pool dx", dx, num_dx, nx);
    numeric_gradient(b, s.c, 1e-3f, fd_loss, &loss, num_db);
    float db[3] = {0, 0, 0};
    for (size_t i = 0; i < nx; i++) db[i / (s.h * s.w) % s.c] += dx[i];
    check_gradient("bias_relu_pool db (channel sums of dx)", db, num_db, s.c);
    void *dev[] = {d_x, d_b, d_r, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, b, r, y, dx, num_dx, num_db};
    host_free_all(host, GRID_COUNT(host));
}

static void brp_case(const GridCase *c) {
    if (c->device == DEVICE_CPU && c->nhwc && !c->fused) {
        printf(" skipped: the CPU's max-pool is NCHW\n");
        return;
    }
    brp_shape(c, 4, 64, 32, 32, 1); /* 16-byte NHWC vectors */
    brp_shape(c, 3, 5, 6, 10, 1);   /* channel by channel */
    brp_shape(c, 2, 24, 4, 6, 1);
    if (c->dtype == DTYPE_F32) brp_shape(c, 4, 32, 16, 16, 0);
    if (c->device == DEVICE_CPU && c->fused && !c->nhwc) brp_finite_differences(c);
}

/* ---- on the CPU ----------------------------------------------------------------- */

/* One 2x4 plane, two windows, bias -0.5: [1 3 | 0 -1] over [3 2 | -2 -3]. The
 * first window's first maximum (the 3 at column 1; the 3 below it ties) takes
 * dy; the second window's maximum is negative, so the ReLU passes nothing. */
static void brp_by_hand(void) {
    Pool2dShape s = {.n = 1, .c = 1, .h = 2, .w = 4};
    const float x[8] = {1, 3, 0, -1, 3, 2, -2, -3}, b[1] = {-0.5f}, dy[2] = {5, 7};
    const float want_y[2] = {2.5f, 0.0f}, want_dx[8] = {0, 5, 0, 0, 0, 0, 0, 0};
    float y[2], dx[8];
    bias_relu_pool_forward_cpu(&s, 0, x, b, y);
    bias_relu_pool_backward_cpu(&s, 0, x, b, dy, dx);
    for (int i = 0; i < 2; i++) CHECK_NEAR(y[i], want_y[i], 0);
    for (int i = 0; i < 8; i++) CHECK_NEAR(dx[i], want_dx[i], 0);
}

/* The fused op equals bias + ReLU, then max-pool; backward equals max-pool's
 * backward then ReLU's, bit for bit; NHWC equals NCHW; in place equals out of
 * place. */
static void brp_against_unfused(uint64_t *rng) {
    Pool2dShape s = {.n = 2, .c = 3, .h = 6, .w = 8};
    size_t nx = numel(&s), ny = nx / 4;
    float *x = host_floats(nx), *b = host_floats(s.c), *dy = host_floats(ny);
    grid_values(x, nx, b, s.c, rng);
    test_fill_uniform(dy, ny, rng, -1, 1);
    float *y = host_floats(ny), *dx = host_floats(nx);
    bias_relu_pool_forward_cpu(&s, 0, x, b, y);
    bias_relu_pool_backward_cpu(&s, 0, x, b, dy, dx);

    float *relu = copy_floats(x, nx), *y2 = host_floats(ny), *dx2 = host_floats(nx);
    bias_relu_forward_cpu(b, relu, s.n, s.c, s.h * s.w, 0);
    maxpool_forward_cpu(&s, relu, y2);
    maxpool_backward_cpu(&s, relu, y2, dy, dx2);
    for (size_t i = 0; i < nx; i++)
        if (!(relu[i] > 0.0f)) dx2[i] = 0.0f;
    CHECK_MSG(memcmp(y, y2, ny * sizeof(float)) == 0, "fused forward differs from bias + ReLU + max-pool");
    CHECK_MSG(memcmp(dx, dx2, nx * sizeof(float)) == 0, "fused backward differs from max-pool + ReLU backward");

    float *x_nhwc = to_nhwc(x, s.n, s.c, s.h, s.w, s.c), *dy_nhwc = to_nhwc(dy, s.n, s.c, s.h / 2, s.w / 2, s.c);
    float *y3 = host_floats(ny), *dx3 = host_floats(nx);
    bias_relu_pool_forward_cpu(&s, 1, x_nhwc, b, y3);
    bias_relu_pool_backward_cpu(&s, 1, x_nhwc, b, dy_nhwc, dx3);
    float *y3c = to_nchw(y3, s.n, s.c, s.h / 2, s.w / 2), *dx3c = to_nchw(dx3, s.n, s.c, s.h, s.w);
    CHECK_MSG(memcmp(y, y3c, ny * sizeof(float)) == 0 && memcmp(dx, dx3c, nx * sizeof(float)) == 0,
              "NHWC differs from NCHW on the CPU");

    float *inplace = copy_floats(x, nx);
    bias_relu_pool_backward_cpu(&s, 0, inplace, b, dy, inplace);
    CHECK_MSG(memcmp(inplace, dx, nx * sizeof(float)) == 0, "in-place backward differs on the CPU");
    void *host[] = {x, b, dy, y, dx, relu, y2, dx2, x_nhwc, dy_nhwc, y3, dx3, y3c, dx3c, inplace};
    host_free_all(host, GRID_COUNT(host));
}

static void brp_cpu(uint64_t *rng) {
    brp_by_hand();
    brp_against_unfused(rng);
}

const GridOp grid_op_bias_relu_pool = {
    .name = "bias_relu_pool",
    .run = brp_case,
    .extras = brp_cpu,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_BOTH_LAYOUTS,
    .fused = 1,
    .skipped = "cpu nhwc unfused (the CPU's max-pool is NCHW); random values in f16 and bf16 (x + b would round: "
               "the grid values are exact)",
};
