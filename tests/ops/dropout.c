/* Dropout (ops/dropout.h): every case, NCHW and NHWC, against the CPU
 * reference's mask on NCHW data (the mask follows each element's NCHW
 * position, so both layouts drop the same elements): forward, backward
 * overwriting dx and added onto it, y aliasing x, the step counter advanced
 * on the device. On the CPU, dx by finite differences. Extras: the share
 * dropped, the same (seed, layer, step) giving the same mask and another
 * step, layer or seed another, p = 0 the identity. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/dropout.h"
#include "tests/ops/grid.h"

typedef struct {
    DropoutShape s;
    DropoutMask k;
    DropoutCounter counter;
    const float *x, *r;
    float *y;
} DropoutLoss;

static double dropout_loss(void *p) {
    DropoutLoss *l = p;
    dropout_apply_cpu(&l->s, 0, &l->k, &l->counter, l->x, l->y, 0);
    return weighted_sum(l->y, l->r, (size_t)l->s.n * l->s.c * l->s.plane);
}

static void dropout_finite_differences(const GridCase *c) {
    DropoutLoss l = {{2, 3, 25}, {1, 0.4f}, {5, 7}, NULL, NULL, NULL};
    size_t n = (size_t)l.s.n * l.s.c * l.s.plane;
    float *x = grid_random(c, DTYPE_F32, n, -2, 2), *r = grid_random(c, DTYPE_F32, n, -1, 1);
    float *y = host_floats(n), *dx = host_floats(n);
    double *num = malloc(sizeof(double) * n);
    l.x = x, l.r = r, l.y = y;
    numeric_gradient(x, n, 1e-2f, dropout_loss, &l, num);
    dropout_backward(&c->ctx, &l.s, &l.k, &l.counter, r, dx, 0);
    check_gradient("dropout dx (finite differences)", dx, num, n);
    void *host[] = {x, r, y, dx, num};
    host_free_all(host, GRID_COUNT(host));
}

/* The device's values of a [n][c][plane] tensor in c's layout, back in NCHW. */
static float *get_nchw(const GridCase *c, const void *buf, const DropoutShape *s) {
    return grid_get_nchw(c, buf, s->n, s->c, s->plane, 1);
}

static void dropout_shape(const GridCase *c, DropoutShape s, float p) {
    printf(" %dx%dx%d p=%g\n", s.n, s.c, s.plane, p);
    DType dt = c->dtype;
    DropoutMask k = {3, p};
    DropoutCounter counter = {41, (uint64_t)(test_uniform(c->rng, 0, 1) * 1e9)};
    size_t n = (size_t)s.n * s.c * s.plane;
    float *x = grid_random(c, dt, n, -2, 2), *dy = grid_random(c, dt, n, -1, 1);
    float *old = grid_random(c, dt, n, -1, 1);
    float *y = host_floats(n), *dx = host_floats(n), *acc = copy_floats(old, n);
    dropout_apply_cpu(&s, 0, &k, &counter, x, y, 0);
    dropout_apply_cpu(&s, 0, &k, &counter, dy, dx, 0);
    round_to(dt, y, n), round_to(dt, dx, n);
    for (size_t i = 0; i < n; i++) acc[i] += dx[i];
    round_to(dt, acc, n);

    DropoutCounter before = {counter.step - 1, counter.seed};
    DropoutCounter *d_counter = grid_put_bytes(c, &before, sizeof before);
    dropout_advance(&c->ctx, d_counter); /* 40 -> 41 on the device */
    float *xl = grid_to_layout(c, x, s.n, s.c, s.plane, 1), *dyl = grid_to_layout(c, dy, s.n, s.c, s.plane, 1);
    float *oldl = grid_to_layout(c, old, s.n, s.c, s.plane, 1);
    void *d_x = grid_put(c, dt, xl, n), *d_y = grid_alloc(c, dt, n);
    void *d_dy = grid_put(c, dt, dyl, n), *d_dx = grid_alloc(c, dt, n);
    dropout_forward(&c->ctx, &s, &k, d_counter, d_x, d_y);
    dropout_backward(&c->ctx, &s, &k, d_counter, d_dy, d_dx, 0);
    float *gy = get_nchw(c, d_y, &s), *gdx = get_nchw(c, d_dx, &s);
    /* A product by the scale, rounded as the reference rounds it: exact. */
    grid_check(c, "dropout y", gy, y, n, 0);
    grid_check(c, "dropout dx", gdx, dx, n, 0);
    grid_set(c, dt, d_dx, oldl, n);
    dropout_backward(&c->ctx, &s, &k, d_counter, d_dy, d_dx, 1);
    float *gacc = get_nchw(c, d_dx, &s);
    /* Accumulating in half precision the device adds the unrounded product (H200: 3.0e-4 fp16, 2.4e-3 bf16
     * apart): one rounding of the sum, within an ulp of the reference's two. */
    static const GridBound ACCUMULATED = {0, 1e-3, 8e-3};
    grid_check(c, "dropout dx (accumulated onto random)", gacc, acc, n, grid_bound(c, ACCUMULATED));
    dropout_forward(&c->ctx, &s, &k, d_counter, d_x, d_x); /* y aliasing x */
    float *ginplace = get_nchw(c, d_x, &s);
    grid_check_same(c, "dropout y (y == x)", ginplace, gy, n * sizeof(float));
    DropoutCounter *after = grid_get_bytes(c, d_counter, sizeof *after);
    CHECK_MSG(after->step == counter.step && after->seed == counter.seed,
              "%s: the step on the device is %lld after one advance from %lld", c->name, (long long)after->step,
              (long long)before.step);

    void *dev[] = {d_counter, d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, old, y, dx, acc, xl, dyl, oldl, gy, gdx, gacc, ginplace, after};
    host_free_all(host, GRID_COUNT(host));
}

static void dropout_case(const GridCase *c) {
    dropout_shape(c, (DropoutShape){4, 16, 64}, 0.3f);
    dropout_shape(c, (DropoutShape){3, 5, 7}, 0.5f);
    dropout_shape(c, (DropoutShape){2, 10, 1}, 0.0f);
    if (c->device == DEVICE_CPU && !c->nhwc) dropout_finite_differences(c);
}

/* Which of n elements a mask keeps (y of x = 1 is the scale there, 0 elsewhere). */
static unsigned char *kept(const DropoutShape *s, const DropoutMask *k, DropoutCounter counter, int nhwc) {
    size_t n = (size_t)s->n * s->c * s->plane;
    float *ones = host_floats(n), *y = host_floats(n);
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
    dropout_apply_cpu(s, nhwc, k, &counter, ones, y, 0);
    unsigned char *keep = host_bytes(n);
    for (size_t i = 0; i < n; i++) {
        keep[i] = y[i] != 0.0f;
        CHECK(y[i] == 0.0f || y[i] == dropout_scale(k->p));
    }
    free(ones), free(y);
    return keep;
}

static double share_differing(const unsigned char *a, const unsigned char *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += a[i] != b[i];
    return (double)d / n;
}

/* With n = 2^17 elements the share dropped is within 0.01 of p (7 standard deviations); two independent masks
 * differ in 2p(1-p) of them. */
static void dropout_masks(uint64_t *rng) {
    DropoutShape s = {8, 64, 256};
    size_t n = (size_t)s.n * s.c * s.plane;
    DropoutMask k = {2, 0.3f};
    DropoutCounter at = {10, (uint64_t)(test_uniform(rng, 0, 1) * 1e9)}, next_step = at, other_seed = at;
    next_step.step++, other_seed.seed++;
    unsigned char *m = kept(&s, &k, at, 0), *same = kept(&s, &k, at, 0), *next = kept(&s, &k, next_step, 0);
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) dropped += !m[i];
    printf("dropout: p 0.3 dropped %.4f of %zu elements\n", (double)dropped / n, n);
    CHECK(fabs((double)dropped / n - 0.3) < 0.01);
    CHECK(memcmp(m, same, n) == 0);
    double independent = 2 * 0.3 * 0.7;
    CHECK_MSG(fabs(share_differing(m, next, n) - independent) < 0.01, "the next step's mask differs in %.4f",
              share_differing(m, next, n));
    DropoutMask other_layer = {3, k.p};
    unsigned char *l = kept(&s, &other_layer, at, 0), *sd = kept(&s, &k, other_seed, 0);
    CHECK(fabs(share_differing(m, l, n) - independent) < 0.01);
    CHECK(fabs(share_differing(m, sd, n) - independent) < 0.01);
    /* NHWC drops the element that NCHW drops: element (img, ch, pos) sits at (img * plane + pos) * c + ch. */
    unsigned char *hwc = kept(&s, &k, at, 1);
    size_t mismatched = 0;
    for (size_t i = 0; i < n; i++) {
        size_t img = i / ((size_t)s.c * s.plane), ch = i / s.plane % s.c, pos = i % s.plane;
        mismatched += m[i] != hwc[(img * s.plane + pos) * s.c + ch];
    }
    CHECK_MSG(mismatched == 0, "%zu elements kept in one layout and dropped in the other", mismatched);
    DropoutMask none = {2, 0.0f};
    unsigned char *all = kept(&s, &none, at, 0);
    size_t all_kept = 0;
    for (size_t i = 0; i < n; i++) all_kept += all[i];
    CHECK(all_kept == n && dropout_scale(0.0f) == 1.0f && dropout_threshold(0.0f) == 0);
    CHECK(dropout_threshold(0.5f) == 0x80000000u && dropout_scale(0.5f) == 2.0f);
    void *host[] = {m, same, next, l, sd, hwc, all};
    host_free_all(host, GRID_COUNT(host));
}

const GridOp grid_op_dropout = {
    .name = "dropout",
    .run = dropout_case,
    .extras = dropout_masks,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_BOTH_LAYOUTS,
};
