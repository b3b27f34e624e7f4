/* Channel concat (ops/concat.h), NCHW and NHWC: y against the CPU
 * reference's NCHW concat, every output poisoned first (an element not
 * written fails); backward's da and db overwritten, added onto random values,
 * and one of them skipped (NULL). A copy: the same values. On the CPU, the
 * gradients by finite differences; extras: values by hand. */
#include <stdlib.h>
#include <string.h>

#include "ops/concat.h"
#include "tests/ops/grid.h"

/* y = [a, b] by the reference, NCHW. */
static void concat_ref(const ConcatShape *s, float *a, float *b, float *y) {
    ConcatPart pa = {s->n, s->ca, s->ca + s->cb, 0, s->plane, 0}, pb = {s->n, s->cb, s->ca + s->cb, s->ca, s->plane, 0};
    concat_part_cpu(&pa, a, y, 1, 0);
    concat_part_cpu(&pb, b, y, 1, 0);
}

typedef struct {
    ConcatShape s;
    float *a, *b, *r, *y;
} ConcatLoss;

static double concat_loss(void *p) {
    ConcatLoss *l = p;
    concat_ref(&l->s, l->a, l->b, l->y);
    return weighted_sum(l->y, l->r, (size_t)l->s.n * (l->s.ca + l->s.cb) * l->s.plane);
}

static void concat_finite_differences(const GridCase *c) {
    ConcatShape s = {2, 3, 2, 5};
    size_t na = (size_t)s.n * s.ca * s.plane, nb = (size_t)s.n * s.cb * s.plane, ny = na + nb;
    ConcatLoss l = {s, grid_random(c, DTYPE_F32, na, -1, 1), grid_random(c, DTYPE_F32, nb, -1, 1),
                    grid_random(c, DTYPE_F32, ny, -1, 1), host_floats(ny)};
    float *da = host_floats(na), *db = host_floats(nb);
    double *num_a = malloc(sizeof(double) * na), *num_b = malloc(sizeof(double) * nb);
    numeric_gradient(l.a, na, 1e-2f, concat_loss, &l, num_a);
    numeric_gradient(l.b, nb, 1e-2f, concat_loss, &l, num_b);
    concat_backward(&c->ctx, &s, l.r, da, db, 0, 0);
    check_gradient("concat da (finite differences)", da, num_a, na);
    check_gradient("concat db (finite differences)", db, num_b, nb);
    void *host[] = {l.a, l.b, l.r, l.y, da, db, num_a, num_b};
    host_free_all(host, GRID_COUNT(host));
}

static void concat_shape(const GridCase *c, ConcatShape s) {
    printf(" %dx(%d+%d)x%d\n", s.n, s.ca, s.cb, s.plane);
    DType dt = c->dtype;
    int cy = s.ca + s.cb;
    size_t na = (size_t)s.n * s.ca * s.plane, nb = (size_t)s.n * s.cb * s.plane, ny = na + nb;
    float *a = grid_random(c, dt, na, -2, 2), *b = grid_random(c, dt, nb, -2, 2), *dy = grid_random(c, dt, ny, -1, 1);
    float *y = host_floats(ny), *da = host_floats(na), *db = host_floats(nb);
    concat_ref(&s, a, b, y);
    ConcatPart pa = {s.n, s.ca, cy, 0, s.plane, 0}, pb = {s.n, s.cb, cy, s.ca, s.plane, 0};
    concat_part_cpu(&pa, da, dy, 0, 0);
    concat_part_cpu(&pb, db, dy, 0, 0);
    float *old_a = grid_random(c, dt, na, -1, 1), *acc_a = copy_floats(old_a, na);
    for (size_t i = 0; i < na; i++) acc_a[i] += da[i];
    round_to(dt, acc_a, na);

    float *al = grid_to_layout(c, a, s.n, s.ca, s.plane, 1), *bl = grid_to_layout(c, b, s.n, s.cb, s.plane, 1);
    float *dyl = grid_to_layout(c, dy, s.n, cy, s.plane, 1), *oldl = grid_to_layout(c, old_a, s.n, s.ca, s.plane, 1);
    void *d_a = grid_put(c, dt, al, na), *d_b = grid_put(c, dt, bl, nb), *d_y = grid_alloc(c, dt, ny);
    void *d_dy = grid_put(c, dt, dyl, ny), *d_da = grid_alloc(c, dt, na), *d_db = grid_alloc(c, dt, nb);
    concat_forward(&c->ctx, &s, d_a, d_b, d_y);
    concat_backward(&c->ctx, &s, d_dy, d_da, d_db, 0, 0);
    float *gy = grid_get_nchw(c, d_y, s.n, cy, s.plane, 1), *gda = grid_get_nchw(c, d_da, s.n, s.ca, s.plane, 1);
    float *gdb = grid_get_nchw(c, d_db, s.n, s.cb, s.plane, 1);
    grid_check(c, "concat y", gy, y, ny, 0);
    grid_check(c, "concat da", gda, da, na, 0);
    grid_check(c, "concat db", gdb, db, nb, 0);
    grid_set(c, dt, d_da, oldl, na);
    grid_poison(c, dt, d_db, nb);
    concat_backward(&c->ctx, &s, d_dy, d_da, NULL, 1, 0);
    float *gacc = grid_get_nchw(c, d_da, s.n, s.ca, s.plane, 1), *untouched = grid_get(c, dt, d_db, nb);
    grid_check(c, "concat da (accumulated onto random)", gacc, acc_a, na, 0);
    size_t written = 0;
    for (size_t i = 0; i < nb; i++) written += untouched[i] == untouched[i];
    CHECK_MSG(written == 0, "%s: concat wrote %zu elements of a skipped (NULL) db", c->name, written);

    void *dev[] = {d_a, d_b, d_y, d_dy, d_da, d_db};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {a, b, dy, y, da, db, old_a, acc_a, al, bl, dyl, oldl, gy, gda, gdb, gacc, untouched};
    host_free_all(host, GRID_COUNT(host));
}

static void concat_case(const GridCase *c) {
    concat_shape(c, (ConcatShape){4, 16, 8, 64});
    concat_shape(c, (ConcatShape){3, 5, 3, 7});
    concat_shape(c, (ConcatShape){2, 1, 2, 1});
    if (c->device == DEVICE_CPU && !c->nhwc) concat_finite_differences(c);
}

/* One image of a 2x1x2 (NCHW) and a 1x1x2: y's three channels, and the same in NHWC. */
static void concat_by_hand(uint64_t *rng) {
    (void)rng;
    OpContext ctx = op_context_cpu();
    ConcatShape s = {1, 2, 1, 2};
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6}, y[6], da[4], db[2];
    concat_forward(&ctx, &s, a, b, y);
    check_values("concat y (nchw)", y, (double[]){1, 2, 3, 4, 5, 6}, 6, 0);
    concat_backward(&ctx, &s, y, da, db, 0, 0);
    check_values("concat da (nchw)", da, (double[]){1, 2, 3, 4}, 4, 0);
    check_values("concat db (nchw)", db, (double[]){5, 6}, 2, 0);
    ctx.nhwc = 1; /* a's pixels (1, 2) and (3, 4), b's 5 and 6 */
    concat_forward(&ctx, &s, a, b, y);
    check_values("concat y (nhwc)", y, (double[]){1, 2, 5, 3, 4, 6}, 6, 0);
    concat_backward(&ctx, &s, y, da, db, 1, 1);
    check_values("concat da (nhwc, accumulated)", da, (double[]){2, 4, 6, 8}, 4, 0);
    check_values("concat db (nhwc, accumulated)", db, (double[]){10, 12}, 2, 0);
}

const GridOp grid_op_concat = {
    .name = "concat",
    .run = concat_case,
    .extras = concat_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_BOTH_LAYOUTS,
};
