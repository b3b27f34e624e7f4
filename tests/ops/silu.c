/* SiLU (ops/silu.h): every case against the CPU reference on the same
 * (rounded) inputs, dx aliasing dy giving the same bits; on the CPU, the face
 * gives the reference's bits and the backward matches finite differences;
 * once, the reference against the formula and values by hand. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/silu.h"
#include "tests/ops/grid.h"

/* Computed in float (expf) and rounded once to the dtype: within half a unit
 * of its last place per element (f16 2^-11, bf16 2^-8). */
static const GridBound SILU_BOUND = {1e-5, 1e-3, 8e-3};

typedef struct {
    const float *x, *r;
    float *y;
    size_t n;
} SiluLoss;

static double silu_loss(void *p) {
    SiluLoss *l = p;
    silu_forward_cpu(l->x, l->y, l->n);
    return weighted_sum(l->y, l->r, l->n);
}

static void silu_finite_differences(const GridCase *c) {
    size_t n = 1000;
    float *x = grid_random(c, DTYPE_F32, n, -6, 6), *r = grid_random(c, DTYPE_F32, n, -1, 1);
    float *y = host_floats(n), *dx = host_floats(n);
    double *num = malloc(sizeof(double) * n);
    SiluLoss loss = {x, r, y, n};
    numeric_gradient(x, n, 1e-2f, silu_loss, &loss, num);
    silu_backward(&c->ctx, x, r, dx, n);
    check_gradient("silu dx (finite differences)", dx, num, n);
    void *host[] = {x, r, y, dx, num};
    host_free_all(host, GRID_COUNT(host));
}

static void silu_size(const GridCase *c, size_t n) {
    printf(" n=%zu\n", n);
    float *x = grid_random(c, c->dtype, n, -8, 8), *dy = grid_random(c, c->dtype, n, -1, 1);
    float *y = host_floats(n), *dx = host_floats(n);
    silu_forward_cpu(x, y, n);
    silu_backward_cpu(x, dy, dx, n);

    void *d_x = grid_put(c, c->dtype, x, n), *d_y = grid_alloc(c, c->dtype, n);
    void *d_dy = grid_put(c, c->dtype, dy, n), *d_dx = grid_alloc(c, c->dtype, n);
    silu_forward(&c->ctx, d_x, d_y, n);
    silu_backward(&c->ctx, d_x, d_dy, d_dx, n);
    float *gy = grid_get(c, c->dtype, d_y, n), *gdx = grid_get(c, c->dtype, d_dx, n);
    grid_check(c, "silu y", gy, y, n, grid_bound(c, SILU_BOUND));
    grid_check(c, "silu dx", gdx, dx, n, grid_bound(c, SILU_BOUND));

    silu_backward(&c->ctx, d_x, d_dy, d_dy, n); /* dx aliasing dy */
    float *gdx_inplace = grid_get(c, c->dtype, d_dy, n);
    grid_check_same(c, "silu dx (dx == dy)", gdx_inplace, gdx, n * sizeof(float));

    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, y, dx, gy, gdx, gdx_inplace};
    host_free_all(host, GRID_COUNT(host));
}

static void silu_case(const GridCase *c) {
    silu_size(c, 4096); /* the CUDA path's 16 bytes a thread */
    silu_size(c, 1001); /* its one element a thread */
    silu_size(c, 1);
    if (c->device != DEVICE_CPU) return;
    silu_finite_differences(c);
    float *x = grid_random(c, DTYPE_F32, 64, -4, 4), *dy = grid_random(c, DTYPE_F32, 64, -1, 1);
    float y_ref[64], y[64], dx_ref[64], dx[64];
    silu_forward_cpu(x, y_ref, 64);
    silu_backward_cpu(x, dy, dx_ref, 64);
    silu_forward(&c->ctx, x, y, 64);
    silu_backward(&c->ctx, x, dy, dx, 64);
    grid_check_same(c, "silu face y", y, y_ref, sizeof y);
    grid_check_same(c, "silu face dx", dx, dx_ref, sizeof dx);
    free(x), free(dy);
}

/* Values by hand (silu(0) = 0 with slope 1/2, silu(x) -> x and -> 0 far out),
 * the formula in double over [-10, 10], and NaN passing through. */
static void silu_formula(uint64_t *rng) {
    enum { N = 1000 };
    float *x = host_floats(N), *y = host_floats(N), *dy = host_floats(N), *dx = host_floats(N);
    double *want = malloc(N * sizeof(double));
    test_fill_uniform(x, N, rng, -10.0f, 10.0f);
    test_fill_uniform(dy, N, rng, -1.0f, 1.0f);
    const float special[] = {0.0f, 1.0f, -1.0f, 40.0f, -40.0f};
    memcpy(x, special, sizeof special);
    dy[0] = 1.0f;
    silu_forward_cpu(x, y, N);
    for (int i = 0; i < N; i++) want[i] = x[i] / (1.0 + exp(-(double)x[i]));
    check_values("silu_forward_cpu", y, want, N, 1e-6);
    CHECK(y[0] == 0.0f && fabsf(y[1] - 0.7310586f) < 1e-6f && fabsf(y[2] + 0.2689414f) < 1e-6f);
    CHECK(y[3] == 40.0f && fabsf(y[4]) < 1e-15f);
    silu_backward_cpu(x, dy, dx, N);
    CHECK(dx[0] == 0.5f);
    for (int i = 0; i < N; i++) {
        double s = 1.0 / (1.0 + exp(-(double)x[i]));
        want[i] = dy[i] * (s + x[i] * s * (1.0 - s));
    }
    check_values("silu_backward_cpu", dx, want, N, 1e-6);
    silu_backward_cpu(x, dy, dy, N); /* dx aliasing dy */
    CHECK(memcmp(dy, dx, N * sizeof(float)) == 0);
    float nan_x = NAN, nan_y, one = 1.0f, nan_dx;
    silu_forward_cpu(&nan_x, &nan_y, 1);
    silu_backward_cpu(&nan_x, &one, &nan_dx, 1);
    CHECK(isnan(nan_y) && isnan(nan_dx));
    void *host[] = {x, y, dy, dx, want};
    host_free_all(host, GRID_COUNT(host));
}

const GridOp grid_op_silu = {
    .name = "silu",
    .run = silu_case,
    .extras = silu_formula,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (elementwise: the layout changes nothing)",
};
