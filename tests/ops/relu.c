/* ReLU (ops/relu.h): a selection, so every case matches the reference
 * exactly; in place (x == y, then dx == dy) as the model runs it. */
#include <math.h>
#include <stdlib.h>

#include "ops/relu.h"
#include "tests/ops/grid.h"

typedef struct {
    float *x, *y, *r;
    size_t n;
} ReluLoss;

static double relu_loss(void *p) {
    ReluLoss *l = p;
    relu_forward_cpu(l->x, l->y, l->n);
    return weighted_sum(l->y, l->r, l->n);
}

/* Inputs kept at least 0.1 away from the kink at 0. */
static void relu_finite_differences(const GridCase *c) {
    size_t n = 300;
    float *x = host_floats(n), *y = host_floats(n), *r = grid_random(c, DTYPE_F32, n, -1, 1);
    float *dx = host_floats(n);
    for (size_t i = 0; i < n; i++) {
        float mag = test_uniform(c->rng, 0.1f, 2.0f);
        x[i] = test_uniform(c->rng, 0, 1) < 0.5f ? -mag : mag;
    }
    void *d_x = grid_put(c, DTYPE_F32, x, n), *d_y = grid_alloc(c, DTYPE_F32, n);
    void *d_r = grid_put(c, DTYPE_F32, r, n), *d_dx = grid_alloc(c, DTYPE_F32, n);
    relu_forward(&c->ctx, d_x, d_y, n);
    relu_backward(&c->ctx, d_y, d_r, d_dx, n);
    float *got = grid_get(c, DTYPE_F32, d_dx, n);
    ReluLoss loss = {x, y, r, n};
    double *num = malloc(sizeof(double) * n);
    numeric_gradient(x, n, 1e-2f, relu_loss, &loss, num);
    check_gradient("relu dx (finite differences)", got, num, n);
    void *dev[] = {d_x, d_y, d_r, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, y, r, dx, got, num};
    host_free_all(host, GRID_COUNT(host));
}

static void relu_size(const GridCase *c, size_t n) {
    printf(" n=%zu\n", n);
    float *x = grid_random(c, c->dtype, n, -1, 1), *dy = grid_random(c, c->dtype, n, -1, 1);
    for (size_t i = 0; i < n; i += 97) x[i] = 0.0f; /* exact zeros: the kink */
    float *y = host_floats(n), *dx = host_floats(n);
    relu_forward_cpu(x, y, n);
    relu_backward_cpu(y, dy, dx, n);

    void *d_x = grid_put(c, c->dtype, x, n), *d_y = grid_alloc(c, c->dtype, n);
    void *d_dy = grid_put(c, c->dtype, dy, n), *d_dx = grid_alloc(c, c->dtype, n);
    relu_forward(&c->ctx, d_x, d_y, n);
    relu_backward(&c->ctx, d_y, d_dy, d_dx, n);
    float *gy = grid_get(c, c->dtype, d_y, n), *gdx = grid_get(c, c->dtype, d_dx, n);
    grid_check(c, "relu y", gy, y, n, grid_bound(c, GRID_EXACT));
    grid_check(c, "relu dx", gdx, dx, n, grid_bound(c, GRID_EXACT));

    /* in place, as the model runs it: x == y, then dx == dy */
    relu_forward(&c->ctx, d_x, d_x, n);
    relu_backward(&c->ctx, d_x, d_dy, d_dy, n);
    float *gy2 = grid_get(c, c->dtype, d_x, n), *gdx2 = grid_get(c, c->dtype, d_dy, n);
    grid_check(c, "relu y (in place)", gy2, y, n, grid_bound(c, GRID_EXACT));
    grid_check(c, "relu dx (dx == dy)", gdx2, dx, n, grid_bound(c, GRID_EXACT));

    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, y, dx, gy, gdx, gy2, gdx2};
    host_free_all(host, GRID_COUNT(host));
}

static void relu_case(const GridCase *c) {
    relu_size(c, 1000);
    relu_size(c, 1);
    relu_size(c, ((size_t)1 << 20) + 3);
    relu_size(c, 5000003); /* more than one grid-stride pass */
    if (c->device == DEVICE_CPU) relu_finite_differences(c);
}

static void relu_by_hand(uint64_t *rng) {
    (void)rng;
    float x[5] = {-2, -0.5f, 0, 0.5f, 3}, y[5], dy[5] = {1, 2, 3, 4, 5}, dx[5];
    relu_forward_cpu(x, y, 5);
    check_values("relu y", y, (double[]){0, 0, 0, 0.5, 3}, 5, 0);
    relu_backward_cpu(y, dy, dx, 5);
    check_values("relu dx", dx, (double[]){0, 0, 0, 4, 5}, 5, 0);
    relu_forward_cpu(x, x, 5);
    check_values("relu y in place", x, (double[]){0, 0, 0, 0.5, 3}, 5, 0);
    relu_backward_cpu(x, dy, dy, 5);
    check_values("relu dx in place", dy, (double[]){0, 0, 0, 4, 5}, 5, 0);
    /* NaN passes through the forward */
    float nan_in = NAN, nan_out = 0;
    relu_forward_cpu(&nan_in, &nan_out, 1);
    CHECK(isnan(nan_out));
}

const GridOp grid_op_relu = {
    .name = "relu",
    .run = relu_case,
    .extras = relu_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (elementwise: the layout changes nothing)",
};
