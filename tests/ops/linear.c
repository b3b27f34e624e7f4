/* Fully connected layer (ops/linear.h): y, dx, and dw and db added onto
 * random start values, against the CPU reference; dx == NULL leaves dw and db
 * as they were; on the CPU, every gradient by finite differences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/linear.h"
#include "tests/ops/grid.h"

/* y as the device forms it: the product stored in dt, then the bias added and
 * stored again (for f32 both roundings are the identity). */
static void linear_reference(DType dt, const LinearShape *s, const float *x, const float *w, const float *b,
                             float *y) {
    size_t ny = (size_t)s->n * s->out;
    float *zero = host_floats(s->out);
    linear_forward_cpu(s, x, w, zero, y);
    round_to(dt, y, ny);
    for (size_t i = 0; i < ny; i++) y[i] += b[i % s->out];
    round_to(dt, y, ny);
    free(zero);
}

typedef struct {
    const LinearShape *s;
    float *x, *w, *b, *y, *r;
} LinearLoss;

static double linear_loss(void *p) {
    LinearLoss *l = p;
    linear_forward_cpu(l->s, l->x, l->w, l->b, l->y);
    return weighted_sum(l->y, l->r, (size_t)l->s->n * l->s->out);
}

/* dx, dw and db (dw and db less their start values) of the loss sum(y * dy). */
static void linear_finite_differences(const LinearShape *s, const float *x, const float *w, const float *b,
                                      const float *dy, const float *dx, const float *dw, const float *db) {
    size_t nx = (size_t)s->n * s->in, nw = (size_t)s->out * s->in, ny = (size_t)s->n * s->out;
    LinearLoss l = {s, copy_floats(x, nx), copy_floats(w, nw), copy_floats(b, s->out), host_floats(ny),
                    copy_floats(dy, ny)};
    double *num = malloc(sizeof(double) * (nx > nw ? nx : nw));
    char what[120];
    /* The loss is linear in each of x, w and b: a step of 0.5 is as exact as a small one, and float32's
     * rounding of y weighs 50 times less in it (a 1x1->3 dx of three terms cancelled to 1e-4 read 1.4% off
     * with steps of 1e-2). */
    const float step = 0.5f;
    numeric_gradient(l.x, nx, step, linear_loss, &l, num);
    snprintf(what, sizeof what, "linear %dx%d->%d dx", s->n, s->in, s->out);
    check_gradient(what, dx, num, nx);
    numeric_gradient(l.w, nw, step, linear_loss, &l, num);
    snprintf(what, sizeof what, "linear %dx%d->%d dw", s->n, s->in, s->out);
    check_gradient(what, dw, num, nw);
    numeric_gradient(l.b, s->out, step, linear_loss, &l, num);
    snprintf(what, sizeof what, "linear %dx%d->%d db", s->n, s->in, s->out);
    check_gradient(what, db, num, s->out);
    void *host[] = {l.x, l.w, l.b, l.y, l.r, num};
    host_free_all(host, GRID_COUNT(host));
}

/* |v| at least floor: a value near 0 makes a 1-input shape's finite
 * differences noise (dx = w * dy of one term, against float32's rounding of y). */
static void away_from_zero(DType dt, float *v, size_t n, float floor) {
    for (size_t i = 0; i < n; i++)
        if (fabsf(v[i]) < floor) v[i] = v[i] < 0 ? -floor : floor;
    round_to(dt, v, n);
}

static void linear_shape(const GridCase *c, LinearShape s) {
    printf(" n=%d in=%d out=%d\n", s.n, s.in, s.out);
    DType dt = c->dtype;
    size_t nx = (size_t)s.n * s.in, nw = (size_t)s.out * s.in, ny = (size_t)s.n * s.out;
    float w_scale = 1.0f / sqrtf((float)s.in);
    float *x = grid_random(c, dt, nx, -1, 1), *w = grid_random(c, dt, nw, -w_scale, w_scale);
    float *b = grid_random(c, dt, s.out, -1, 1), *dy = grid_random(c, dt, ny, -1, 1);
    away_from_zero(dt, x, nx, 0.25f), away_from_zero(dt, w, nw, 0.25f * w_scale);

    float *y = host_floats(ny), *dx = host_floats(nx), *dw_added = host_floats(nw), *db_added = host_floats(s.out);
    linear_reference(dt, &s, x, w, b, y);
    linear_backward_cpu(&s, x, w, dy, dx, dw_added, db_added);
    round_to(dt, dx, nx);
    float *dw0 = grid_accumulator_start(c, dt, dw_added, nw), *db0 = grid_accumulator_start(c, dt, db_added, s.out);
    float *dw = copy_floats(dw0, nw), *db = copy_floats(db0, s.out);
    for (size_t i = 0; i < nw; i++) dw[i] += dw_added[i];
    for (int i = 0; i < s.out; i++) db[i] += db_added[i];
    round_to(dt, dw, nw);
    round_to(dt, db, s.out);

    void *d_x = grid_put(c, dt, x, nx), *d_w = grid_put(c, dt, w, nw), *d_b = grid_put(c, dt, b, s.out);
    void *d_dy = grid_put(c, dt, dy, ny), *d_y = grid_alloc(c, dt, ny), *d_dx = grid_alloc(c, dt, nx);
    void *d_dw = grid_put(c, dt, dw0, nw), *d_db = grid_put(c, dt, db0, s.out);
    linear_forward(&c->ctx, &s, d_x, d_w, d_b, d_y);
    linear_backward(&c->ctx, &s, d_x, d_w, d_dy, d_dx, d_dw, d_db);
    float *gy = grid_get(c, dt, d_y, ny), *gdx = grid_get(c, dt, d_dx, nx);
    float *gdw = grid_get(c, dt, d_dw, nw), *gdb = grid_get(c, dt, d_db, s.out);
    double bound = grid_bound(c, GRID_GEMM);
    grid_check(c, "linear y", gy, y, ny, bound);
    grid_check(c, "linear dx", gdx, dx, nx, bound);
    grid_check(c, "linear dw (accumulated onto random dw)", gdw, dw, nw, bound);
    grid_check(c, "linear db (accumulated onto random db)", gdb, db, s.out, bound);

    /* dx == NULL: dw as before (cuBLAS may sum in another order), db the same bits */
    void *d_dw2 = grid_put(c, dt, dw0, nw), *d_db2 = grid_put(c, dt, db0, s.out);
    linear_backward(&c->ctx, &s, d_x, d_w, d_dy, NULL, d_dw2, d_db2);
    float *gdw2 = grid_get(c, dt, d_dw2, nw), *gdb2 = grid_get(c, dt, d_db2, s.out);
    grid_check(c, "linear dw (dx == NULL, vs the first run)", gdw2, gdw, nw, dt == DTYPE_F32 ? 1e-6 : bound / 4);
    grid_check_same(c, "linear db (dx == NULL, vs the first run)", gdb2, gdb, s.out * sizeof(float));

    if (c->device == DEVICE_CPU && nx * nw <= 100000) {
        for (size_t i = 0; i < nw; i++) gdw[i] -= dw0[i];
        for (int i = 0; i < s.out; i++) gdb[i] -= db0[i];
        linear_finite_differences(&s, x, w, b, dy, gdx, gdw, gdb);
    }

    void *dev[] = {d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db, d_dw2, d_db2};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, w, b, dy, y, dx, dw_added, db_added, dw0, db0, dw, db, gy, gdx, gdw, gdb, gdw2, gdb2};
    host_free_all(host, GRID_COUNT(host));
}

/* No bias (b and db NULL): y as with a zero bias, dw the same as with one. */
static void linear_no_bias(const GridCase *c, LinearShape s) {
    printf(" n=%d in=%d out=%d, no bias\n", s.n, s.in, s.out);
    DType dt = c->dtype;
    size_t nx = (size_t)s.n * s.in, nw = (size_t)s.out * s.in, ny = (size_t)s.n * s.out;
    float *x = grid_random(c, dt, nx, -1, 1), *w = grid_random(c, dt, nw, -0.5f, 0.5f);
    float *dy = grid_random(c, dt, ny, -1, 1), *zero = host_floats(s.out);
    float *y = host_floats(ny), *dx = host_floats(nx), *dw = host_floats(nw), *db = host_floats(s.out);
    linear_reference(dt, &s, x, w, zero, y);
    linear_backward_cpu(&s, x, w, dy, dx, dw, db);
    round_to(dt, dx, nx);
    round_to(dt, dw, nw);
    void *d_x = grid_put(c, dt, x, nx), *d_w = grid_put(c, dt, w, nw), *d_dy = grid_put(c, dt, dy, ny);
    float *dw0 = host_floats(nw);
    void *d_y = grid_alloc(c, dt, ny), *d_dx = grid_alloc(c, dt, nx), *d_dw = grid_put(c, dt, dw0, nw);
    linear_forward(&c->ctx, &s, d_x, d_w, NULL, d_y);
    linear_backward(&c->ctx, &s, d_x, d_w, d_dy, d_dx, d_dw, NULL);
    float *gy = grid_get(c, dt, d_y, ny), *gdx = grid_get(c, dt, d_dx, nx), *gdw = grid_get(c, dt, d_dw, nw);
    double bound = grid_bound(c, GRID_GEMM);
    grid_check(c, "linear y (no bias)", gy, y, ny, bound);
    grid_check(c, "linear dx (no bias)", gdx, dx, nx, bound);
    grid_check(c, "linear dw (no bias)", gdw, dw, nw, bound);
    void *dev[] = {d_x, d_w, d_dy, d_y, d_dx, d_dw};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, w, dy, zero, y, dx, dw, db, dw0, gy, gdx, gdw};
    host_free_all(host, GRID_COUNT(host));
}

static void linear_case(const GridCase *c) {
    linear_no_bias(c, (LinearShape){.n = 64, .in = 256, .out = 10}); /* airbench's head */
    linear_no_bias(c, (LinearShape){.n = 5, .in = 7, .out = 3});
    linear_shape(c, (LinearShape){.n = 64, .in = 4096, .out = 512});
    linear_shape(c, (LinearShape){.n = 512, .in = 512, .out = 10});
    linear_shape(c, (LinearShape){.n = 33, .in = 100, .out = 70});
    linear_shape(c, (LinearShape){.n = 7, .in = 33, .out = 10});
    linear_shape(c, (LinearShape){.n = 3, .in = 7, .out = 5});
    linear_shape(c, (LinearShape){.n = 3, .in = 5, .out = 4});
    linear_shape(c, (LinearShape){.n = 1, .in = 1, .out = 3});
    linear_shape(c, (LinearShape){.n = 1, .in = 1, .out = 1});
}

static void linear_by_hand(uint64_t *rng) {
    (void)rng;
    LinearShape s = {.n = 2, .in = 3, .out = 2};
    float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, -1, 0.5f, 0.5f, 0.5f}, b[2] = {0.1f, -0.2f};
    float y[4];
    linear_forward_cpu(&s, x, w, b, y);
    /* y[n][0] = x0 - x2 + 0.1, y[n][1] = (x0 + x1 + x2) / 2 - 0.2 */
    check_values("linear y", y, (double[]){-1.9, 2.8, -1.9, 7.3}, 4, 1e-6);
    float dy[4] = {1, 0, 0, 2}, dx[6], dw[6] = {1, 1, 1, 1, 1, 1}, db[2] = {10, 20};
    grid_fill_nan(dx, 6);
    linear_backward_cpu(&s, x, w, dy, dx, dw, db);
    /* dx = dy w: row 0 = w[0], row 1 = 2 w[1]; dw = 1 + dy^T x; db = db0 + column sums */
    check_values("linear dx", dx, (double[]){1, 0, -1, 1, 1, 1}, 6, 1e-6);
    check_values("linear dw", dw, (double[]){2, 3, 4, 9, 11, 13}, 6, 1e-6);
    check_values("linear db", db, (double[]){11, 22}, 2, 1e-6);
    linear_backward_cpu(&s, x, w, dy, NULL, dw, db);
    check_values("linear dw (accumulated, dx NULL)", dw, (double[]){3, 5, 7, 17, 21, 25}, 6, 1e-6);
    check_values("linear db (accumulated, dx NULL)", db, (double[]){12, 24}, 2, 1e-6);
}

const GridOp grid_op_linear = {
    .name = "linear",
    .run = linear_case,
    .extras = linear_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (a matrix [n][features] has no channels-last form)",
};
