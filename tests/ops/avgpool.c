/* Average pooling (ops/avgpool.h), global and windowed (avgpool2d: kernel,
 * stride, zero padding counted), through its face: y, dx overwritten and dx
 * added onto random values, against the CPU reference; every output poisoned
 * first (an element not written fails). On the CPU, dx by finite
 * differences. Extras: values by hand, the accumulate flag, the padding
 * counted in each window's k*k as PyTorch's count_include_pad=True. */
#include <stdlib.h>
#include <string.h>

#include "ops/avgpool.h"
#include "tests/ops/grid.h"

/* y as the device forms it: summed in fp32, divided, rounded once (f32 exact
 * up to the summation order); dx = dy / plane rounded once: exact. */
static const GridBound AVGPOOL_Y = {1e-6, 3e-3, 1e-2};
static const GridBound AVGPOOL_DX_ACC = {1e-7, 3e-3, 1e-2};

typedef struct {
    int n, c, h, w;
} PoolShape;

typedef struct {
    PoolShape s;
    float *x, *r, *y;
} PoolLoss;

static double pool_loss(void *p) {
    PoolLoss *l = p;
    avgpool_forward_cpu(l->x, l->y, l->s.n, l->s.c, l->s.h * l->s.w);
    return weighted_sum(l->y, l->r, (size_t)l->s.n * l->s.c);
}

static void avgpool_finite_differences(const GridCase *c, PoolShape s) {
    size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = (size_t)s.n * s.c;
    PoolLoss p = {s, grid_random(c, DTYPE_F32, nx, -1, 1), grid_random(c, DTYPE_F32, ny, -1, 1), host_floats(ny)};
    float *g = host_floats(nx);
    double *num = malloc(sizeof(double) * nx);
    grid_fill_nan(g, nx);
    avgpool_backward(&c->ctx, p.r, g, 0, s.n, s.c, s.h * s.w);
    numeric_gradient(p.x, nx, 1e-2f, pool_loss, &p, num);
    char what[64];
    snprintf(what, sizeof what, "avgpool dx %dx%dx%dx%d", s.n, s.c, s.h, s.w);
    check_gradient(what, g, num, nx);
    void *host[] = {p.x, p.r, p.y, g, num};
    host_free_all(host, GRID_COUNT(host));
}

static void avgpool_shape(const GridCase *c, PoolShape s) {
    printf(" %dx%dx%dx%d\n", s.n, s.c, s.h, s.w);
    DType dt = c->dtype;
    int plane = s.h * s.w;
    size_t nx = (size_t)s.n * s.c * plane, ny = (size_t)s.n * s.c;
    float *x = grid_random(c, dt, nx, -1, 3), *dy = grid_random(c, dt, ny, -1, 1);
    float *y = host_floats(ny), *dx = host_floats(nx);
    avgpool_forward_cpu(x, y, s.n, s.c, plane);
    avgpool_backward_cpu(dy, dx, 0, s.n, s.c, plane);
    round_to(dt, dx, nx); /* dy / plane, rounded once to dt */
    float *old = grid_random(c, dt, nx, -0.1f, 0.1f), *acc = copy_floats(old, nx);
    avgpool_backward_cpu(dy, acc, 1, s.n, s.c, plane);

    float *xl = grid_to_layout(c, x, s.n, s.c, s.h, s.w), *oldl = grid_to_layout(c, old, s.n, s.c, s.h, s.w);
    void *d_x = grid_put(c, dt, xl, nx), *d_y = grid_alloc(c, dt, ny);
    void *d_dy = grid_put(c, dt, dy, ny), *d_dx = grid_alloc(c, dt, nx);
    avgpool_forward(&c->ctx, d_x, d_y, s.n, s.c, plane);
    avgpool_backward(&c->ctx, d_dy, d_dx, 0, s.n, s.c, plane);
    float *gy = grid_get(c, dt, d_y, ny), *gdx = grid_get_nchw(c, d_dx, s.n, s.c, s.h, s.w);
    grid_check(c, "avgpool y", gy, y, ny, grid_bound(c, AVGPOOL_Y));
    grid_check(c, "avgpool dx", gdx, dx, nx, 0);
    grid_set(c, dt, d_dx, oldl, nx);
    avgpool_backward(&c->ctx, d_dy, d_dx, 1, s.n, s.c, plane);
    float *gacc = grid_get_nchw(c, d_dx, s.n, s.c, s.h, s.w);
    grid_check(c, "avgpool dx (accumulated onto random)", gacc, acc, nx, grid_bound(c, AVGPOOL_DX_ACC));
    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, y, dx, old, acc, xl, oldl, gy, gdx, gacc};
    host_free_all(host, GRID_COUNT(host));
}

/* ---- windowed ---- */

typedef struct {
    Pool2dShape s;
    float *x, *r, *y;
} WindowLoss;

static size_t out_count(const Pool2dShape *s) { return (size_t)s->n * s->c * pool2d_out_h(s) * pool2d_out_w(s); }

static double window_loss(void *p) {
    WindowLoss *l = p;
    avgpool2d_forward_cpu(&l->s, l->x, l->y);
    return weighted_sum(l->y, l->r, out_count(&l->s));
}

static void avgpool2d_finite_differences(const GridCase *c, Pool2dShape s) {
    size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = out_count(&s);
    WindowLoss l = {s, grid_random(c, DTYPE_F32, nx, -1, 1), grid_random(c, DTYPE_F32, ny, -1, 1), host_floats(ny)};
    float *g = host_floats(nx);
    double *num = malloc(sizeof(double) * nx);
    avgpool2d_backward(&c->ctx, &s, l.r, g, 0);
    numeric_gradient(l.x, nx, 1e-2f, window_loss, &l, num);
    char what[80];
    snprintf(what, sizeof what, "avgpool2d dx %dx%dx%dx%d k%d s%d p%d", s.n, s.c, s.h, s.w, s.k, s.stride, s.pad);
    check_gradient(what, g, num, nx);
    void *host[] = {l.x, l.r, l.y, g, num};
    host_free_all(host, GRID_COUNT(host));
}

static void avgpool2d_shape(const GridCase *c, Pool2dShape s) {
    int oh = pool2d_out_h(&s), ow = pool2d_out_w(&s);
    printf(" %dx%dx%dx%d k%d stride %d pad %d -> %dx%d\n", s.n, s.c, s.h, s.w, s.k, s.stride, s.pad, oh, ow);
    DType dt = c->dtype;
    size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = out_count(&s);
    float *x = grid_random(c, dt, nx, -1, 3), *dy = grid_random(c, dt, ny, -1, 1);
    float *y = host_floats(ny), *dx = host_floats(nx);
    avgpool2d_forward_cpu(&s, x, y);
    avgpool2d_backward_cpu(&s, dy, dx, 0);
    float *old = grid_random(c, dt, nx, -0.1f, 0.1f), *acc = copy_floats(old, nx);
    avgpool2d_backward_cpu(&s, dy, acc, 1);

    float *xl = grid_to_layout(c, x, s.n, s.c, s.h, s.w), *dyl = grid_to_layout(c, dy, s.n, s.c, oh, ow);
    float *oldl = grid_to_layout(c, old, s.n, s.c, s.h, s.w);
    void *d_x = grid_put(c, dt, xl, nx), *d_y = grid_alloc(c, dt, ny);
    void *d_dy = grid_put(c, dt, dyl, ny), *d_dx = grid_alloc(c, dt, nx);
    avgpool2d_forward(&c->ctx, &s, d_x, d_y);
    avgpool2d_backward(&c->ctx, &s, d_dy, d_dx, 0);
    float *gy = grid_get_nchw(c, d_y, s.n, s.c, oh, ow), *gdx = grid_get_nchw(c, d_dx, s.n, s.c, s.h, s.w);
    grid_check(c, "avgpool2d y", gy, y, ny, grid_bound(c, AVGPOOL_Y));
    grid_check(c, "avgpool2d dx", gdx, dx, nx, grid_bound(c, AVGPOOL_Y));
    grid_set(c, dt, d_dx, oldl, nx);
    avgpool2d_backward(&c->ctx, &s, d_dy, d_dx, 1);
    float *gacc = grid_get_nchw(c, d_dx, s.n, s.c, s.h, s.w);
    grid_check(c, "avgpool2d dx (accumulated onto random)", gacc, acc, nx, grid_bound(c, AVGPOOL_DX_ACC));
    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, y, dx, old, acc, xl, dyl, oldl, gy, gdx, gacc};
    host_free_all(host, GRID_COUNT(host));
}

static void avgpool_case(const GridCase *c) {
    avgpool2d_shape(c, (Pool2dShape){4, 16, 8, 8, 3, 2, 1});  /* overlapping, padded: 4x4 */
    avgpool2d_shape(c, (Pool2dShape){2, 8, 7, 9, 2, 2, 0});   /* disjoint, odd sizes: the last row and column out */
    avgpool2d_shape(c, (Pool2dShape){3, 5, 6, 5, 3, 1, 1});   /* stride 1, same size */
    avgpool2d_shape(c, (Pool2dShape){2, 4, 9, 9, 5, 3, 2});   /* wide window */
    if (c->device == DEVICE_CPU) {
        avgpool2d_finite_differences(c, (Pool2dShape){2, 3, 7, 6, 3, 2, 1});
        avgpool2d_finite_differences(c, (Pool2dShape){1, 2, 5, 5, 2, 1, 1});
    }
    avgpool_shape(c, (PoolShape){8, 64, 4, 4});
    avgpool_shape(c, (PoolShape){3, 20, 7, 7});
    avgpool_shape(c, (PoolShape){2, 5, 3, 5});
    if (c->device == DEVICE_CPU) avgpool_finite_differences(c, (PoolShape){3, 5, 4, 3});
}

static void avgpool_by_hand(uint64_t *rng) {
    (void)rng;
    float x[8] = {1, 2, 3, 4, -1, -1, 0, 6}, y[2], dy[2] = {4, -8}, dx[8];
    avgpool_forward_cpu(x, y, 1, 2, 4);
    CHECK(y[0] == 2.5f && y[1] == 1.0f);
    avgpool_backward_cpu(dy, dx, 0, 1, 2, 4);
    check_values("avgpool dx", dx, (double[]){1, 1, 1, 1, -2, -2, -2, -2}, 8, 0);
    avgpool_backward_cpu(dy, dx, 1, 1, 2, 4);
    check_values("avgpool dx (accumulated)", dx, (double[]){2, 2, 2, 2, -4, -4, -4, -4}, 8, 0);
    /* 3x3 windows at stride 2 with padding 1 over a 3x3 map of 1..9: 2x2 outputs, each window's padding
     * counted in its 9 (count_include_pad). */
    Pool2dShape s = {1, 1, 3, 3, 3, 2, 1};
    float m[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y2[4], dy2[4] = {9, 18, 27, 36}, dx2[9];
    avgpool2d_forward_cpu(&s, m, y2);
    check_values("avgpool2d y", y2, (double[]){12 / 9.0, 16 / 9.0, 24 / 9.0, 28 / 9.0}, 4, 1e-6);
    avgpool2d_backward_cpu(&s, dy2, dx2, 0);
    check_values("avgpool2d dx", dx2, (double[]){1, 3, 2, 4, 10, 6, 3, 7, 4}, 9, 1e-6);
}

const GridOp grid_op_avgpool = {
    .name = "avgpool",
    .run = avgpool_case,
    .extras = avgpool_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW)",
};
