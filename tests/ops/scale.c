/* A constant factor (ops/scale.h): every case against the CPU reference on
 * the same (rounded) inputs, in place giving the same bits; on the CPU, the
 * face gives the reference's bits and the backward matches finite
 * differences of the forward. */
#include <stdlib.h>

#include "ops/scale.h"
#include "tests/ops/grid.h"

/* One product in float, rounded once to the dtype. */
static const GridBound SCALE_BOUND = {0, 1e-3, 8e-3};

typedef struct {
    const float *x, *r;
    float *y;
    size_t n;
    float s;
} ScaleLoss;

static double scale_loss(void *p) {
    ScaleLoss *l = p;
    scale_cpu(l->x, l->y, l->n, l->s);
    return weighted_sum(l->y, l->r, l->n);
}

static void scale_finite_differences(const GridCase *c) {
    size_t n = 100;
    float *x = grid_random(c, DTYPE_F32, n, -4, 4), *r = grid_random(c, DTYPE_F32, n, -1, 1);
    float *y = host_floats(n), *dx = host_floats(n);
    double *num = malloc(sizeof(double) * n);
    ScaleLoss loss = {x, r, y, n, 1.0f / 9.0f};
    numeric_gradient(x, n, 1e-2f, scale_loss, &loss, num);
    scale_backward(&c->ctx, r, dx, n, loss.s);
    check_gradient("scale dx (finite differences)", dx, num, n);
    void *host[] = {x, r, y, dx, num};
    host_free_all(host, GRID_COUNT(host));
}

static void scale_size(const GridCase *c, size_t n, float s) {
    printf(" n=%zu factor %g\n", n, s);
    float *x = grid_random(c, c->dtype, n, -5, 5), *y = host_floats(n);
    scale_cpu(x, y, n, s);
    round_to(c->dtype, y, n);
    void *d_x = grid_put(c, c->dtype, x, n), *d_y = grid_alloc(c, c->dtype, n);
    scale_forward(&c->ctx, d_x, d_y, n, s);
    float *gy = grid_get(c, c->dtype, d_y, n);
    grid_check(c, "scale y", gy, y, n, grid_bound(c, SCALE_BOUND));
    scale_backward(&c->ctx, d_x, d_x, n, s); /* in place: the model's dx may alias nothing, but the op allows it */
    float *g_inplace = grid_get(c, c->dtype, d_x, n);
    grid_check_same(c, "scale in place", g_inplace, gy, n * sizeof(float));
    void *dev[] = {d_x, d_y};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, y, gy, g_inplace};
    host_free_all(host, GRID_COUNT(host));
}

static void scale_case(const GridCase *c) {
    scale_size(c, 1024 * 10, 1.0f / 9.0f); /* airbench's logits */
    scale_size(c, 1001, -2.5f);
    scale_size(c, 1, 0.0f);
    if (c->device != DEVICE_CPU) return;
    scale_finite_differences(c);
}

static void scale_by_hand(uint64_t *rng) {
    (void)rng;
    float x[3] = {9, -18, 0.5f}, y[3];
    scale_cpu(x, y, 3, 1.0f / 9.0f);
    check_values("scale y", y, (double[]){1, -2, 0.5 / 9}, 3, 1e-6);
}

const GridOp grid_op_scale = {
    .name = "scale",
    .run = scale_case,
    .extras = scale_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (elementwise: the layout changes nothing)",
};
