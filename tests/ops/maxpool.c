/* Max-pool (ops/maxpool.h): a selection, so y and dx match the reference
 * exactly, ties included (the first maximum of a window wins, in NHWC as in
 * NCHW); only where windows overlap (ResNet's 3x3 stride-2 stem) do the
 * gradients of several windows add, in another order than the CPU's. On the
 * CPU, dx by finite differences. */
#include <math.h>
#include <stdlib.h>

#include "ops/maxpool.h"
#include "tests/ops/grid.h"

/* Overlapping windows add up to four gradients: fp32 in another order, then
 * (halves) one rounding of the sum. */
static const GridBound overlap_bound = {1e-6, 1e-3, 8e-3};

static size_t pool_x_count(const Pool2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t pool_y_count(const Pool2dShape *s) {
    return (size_t)s->n * s->c * pool2d_out_h(s) * pool2d_out_w(s);
}

typedef struct {
    const Pool2dShape *s;
    float *x, *y, *r;
} PoolLoss;

static double pool_loss(void *p) {
    PoolLoss *l = p;
    maxpool2x2_forward_cpu(l->s, l->x, l->y);
    return weighted_sum(l->y, l->r, pool_y_count(l->s));
}

/* Distinct values 0.05 apart: the perturbation (0.01) never changes an argmax. */
static void maxpool_finite_differences(const GridCase *c, Pool2dShape s) {
    size_t nx = pool_x_count(&s), ny = pool_y_count(&s);
    PoolLoss l = {&s, grid_shuffled_distinct(c->rng, nx, 0.05f), host_floats(ny), grid_random(c, DTYPE_F32, ny, -1, 1)};
    MaxPool2d p;
    maxpool_init(&c->ctx, &p, &s);
    void *d_x = grid_put(c, DTYPE_F32, l.x, nx), *d_y = grid_alloc(c, DTYPE_F32, ny);
    void *d_r = grid_put(c, DTYPE_F32, l.r, ny), *d_dx = grid_alloc(c, DTYPE_F32, nx);
    maxpool_forward(&c->ctx, &p, d_x, d_y);
    maxpool_backward(&c->ctx, &p, d_x, d_y, d_r, d_dx);
    float *dx = grid_get(c, DTYPE_F32, d_dx, nx);
    double *num = malloc(sizeof(double) * nx);
    numeric_gradient(l.x, nx, 1e-2f, pool_loss, &l, num);
    char what[120];
    snprintf(what, sizeof what, "maxpool %dx%dx%dx%d window %d stride %d pad %d dx", s.n, s.c, s.h, s.w,
             pool2d_window(&s), pool2d_stride(&s), s.pad);
    check_gradient(what, dx, num, nx);
    maxpool_destroy(&c->ctx, &p);
    void *dev[] = {d_x, d_y, d_r, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {l.x, l.y, l.r, dx, num};
    host_free_all(host, GRID_COUNT(host));
}

/* With 'ties', inputs take only the values 0, 1, 2, so most windows hold
 * several equal maxima. */
static void maxpool_shape(const GridCase *c, Pool2dShape s, int ties) {
    printf(" %dx%dx%dx%d window %d stride %d pad %d%s\n", s.n, s.c, s.h, s.w, pool2d_window(&s), pool2d_stride(&s),
           s.pad, ties ? " (ties)" : "");
    DType dt = c->dtype;
    int oh = pool2d_out_h(&s), ow = pool2d_out_w(&s);
    size_t nx = pool_x_count(&s), ny = pool_y_count(&s);
    float *x = grid_random(c, dt, nx, -1, 1), *dy = grid_random(c, dt, ny, -1, 1);
    if (ties)
        for (size_t i = 0; i < nx; i++) x[i] = floorf((x[i] + 1.0f) * 1.5f);
    float *y = host_floats(ny), *dx = host_floats(nx);
    maxpool2x2_forward_cpu(&s, x, y);
    maxpool2x2_backward_cpu(&s, x, y, dy, dx);
    round_to(dt, dx, nx);

    MaxPool2d p;
    maxpool_init(&c->ctx, &p, &s);
    if (c->device == DEVICE_CUDA) CHECK(p.cuda.dtype == dt && p.cuda.nhwc == c->nhwc);
    float *xl = grid_to_layout(c, x, s.n, s.c, s.h, s.w), *dyl = grid_to_layout(c, dy, s.n, s.c, oh, ow);
    void *d_x = grid_put(c, dt, xl, nx), *d_y = grid_alloc(c, dt, ny);
    void *d_dy = grid_put(c, dt, dyl, ny), *d_dx = grid_alloc(c, dt, nx);
    maxpool_forward(&c->ctx, &p, d_x, d_y);
    maxpool_backward(&c->ctx, &p, d_x, d_y, d_dy, d_dx);
    float *gyl = grid_get(c, dt, d_y, ny), *gdxl = grid_get(c, dt, d_dx, nx);
    float *gy = grid_from_layout(c, gyl, s.n, s.c, oh, ow), *gdx = grid_from_layout(c, gdxl, s.n, s.c, s.h, s.w);
    grid_check(c, ties ? "maxpool y (ties)" : "maxpool y", gy, y, ny, grid_bound(c, GRID_EXACT));
    grid_check(c, ties ? "maxpool dx (ties: first maximum)" : "maxpool dx", gdx, dx, nx,
               grid_bound(c, s.pad ? overlap_bound : GRID_EXACT));

    maxpool_destroy(&c->ctx, &p);
    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, y, dx, xl, dyl, gyl, gdxl, gy, gdx};
    host_free_all(host, GRID_COUNT(host));
}

static void maxpool_case(const GridCase *c) {
    maxpool_shape(c, (Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 128, .h = 16, .w = 16}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 3, .c = 5, .h = 6, .w = 10}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 64, .h = 224, .w = 224}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 3, .h = 8, .w = 6}, 1);
    /* ResNet's ImageNet stem: 3x3 windows, stride 2, padding 1, overlapping */
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 64, .h = 112, .w = 112, .k = 3, .stride = 2, .pad = 1}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 5, .h = 7, .w = 9, .k = 3, .stride = 2, .pad = 1}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 64, .h = 31, .w = 31}, 0);              /* airbench: floor mode */
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 256, .h = 3, .w = 3, .k = 3, .stride = 3}, 0); /* global max */
    if (c->device == DEVICE_CPU) {
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 3, .h = 6, .w = 8});
        maxpool_finite_differences(c, (Pool2dShape){.n = 1, .c = 2, .h = 10, .w = 4});
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 2, .h = 7, .w = 8, .k = 3, .stride = 2, .pad = 1});
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 3, .h = 7, .w = 5});
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 3, .h = 3, .w = 3, .k = 3, .stride = 3});
    }
}

/* Two 4x4 planes; ties in plane 0's window (0,1) (all equal) and in several
 * windows of plane 1, where the first maximum in row-major order must win. */
static void maxpool_by_hand(uint64_t *rng) {
    (void)rng;
    float x[32] = {
        1, 5, 2, 2,    3, 4, 2, 2,    0, -1, 7, 6,   -2, -3, 8, 1,
        0, 3, -1, -1,  3, 3, -1, -2,  4, 4, 1, 2,    5, 5, 2, 1,
    };
    float y[8], dx[32];
    Pool2dShape s = {.n = 1, .c = 2, .h = 4, .w = 4};
    maxpool2x2_forward_cpu(&s, x, y);
    check_values("maxpool y", y, (double[]){5, 2, 0, 8, 3, -1, 5, 2}, 8, 0);
    float dy[8] = {10, 20, 30, 40, 1, 2, 3, 4};
    grid_fill_nan(dx, 32);
    maxpool2x2_backward_cpu(&s, x, y, dy, dx);
    double want[32] = {0};
    want[1] = 10;       /* 5 at (0,1) */
    want[2] = 20;       /* all-2 window: first is (0,2) */
    want[8] = 30;       /* 0 at (2,0) */
    want[14] = 40;      /* 8 at (3,2) */
    want[16 + 1] = 1;   /* 0 3 / 3 3: first 3 at (0,1) */
    want[16 + 2] = 2;   /* -1 -1 / -1 -2: first -1 at (0,2) */
    want[16 + 12] = 3;  /* 4 4 / 5 5: first 5 at (3,0) */
    want[16 + 11] = 4;  /* 1 2 / 2 1: first 2 at (2,3) */
    check_values("maxpool dx", dx, want, 32, 0);
}

const GridOp grid_op_maxpool = {
    .name = "maxpool",
    .run = maxpool_case,
    .extras = maxpool_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW)",
};
