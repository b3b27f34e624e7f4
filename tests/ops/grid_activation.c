/* The grid's cases of an elementwise activation whose backward reads x (GELU, SiLU): tests/ops/grid.h. */
#include "tests/ops/grid.h"

#include <stdlib.h>

typedef struct {
    const GridActivation *a;
    const float *x, *r;
    float *y;
    size_t n;
} ActivationLoss;

static double activation_loss(void *p) {
    ActivationLoss *l = p;
    l->a->forward_cpu(l->x, l->y, l->n);
    return weighted_sum(l->y, l->r, l->n);
}

static void activation_finite_differences(const GridCase *c, const GridActivation *a) {
    size_t n = 1000;
    float *x = grid_random(c, DTYPE_F32, n, -a->range, a->range), *r = grid_random(c, DTYPE_F32, n, -1, 1);
    float *y = host_floats(n), *dx = host_floats(n);
    double *num = malloc(sizeof(double) * n);
    ActivationLoss loss = {a, x, r, y, n};
    numeric_gradient(x, n, 1e-2f, activation_loss, &loss, num);
    a->backward(&c->ctx, x, r, dx, n);
    char what[64];
    snprintf(what, sizeof what, "%s dx (finite differences)", a->name);
    check_gradient(what, dx, num, n);
    void *host[] = {x, r, y, dx, num};
    host_free_all(host, GRID_COUNT(host));
}

static void activation_size(const GridCase *c, const GridActivation *a, size_t n) {
    printf(" n=%zu\n", n);
    char what[3][64];
    snprintf(what[0], sizeof what[0], "%s y", a->name);
    snprintf(what[1], sizeof what[1], "%s dx", a->name);
    snprintf(what[2], sizeof what[2], "%s dx (dx == dy)", a->name);
    float *x = grid_random(c, c->dtype, n, -1.25f * a->range, 1.25f * a->range);
    float *dy = grid_random(c, c->dtype, n, -1, 1), *y = host_floats(n), *dx = host_floats(n);
    a->forward_cpu(x, y, n);
    a->backward_cpu(x, dy, dx, n);

    void *d_x = grid_put(c, c->dtype, x, n), *d_y = grid_alloc(c, c->dtype, n);
    void *d_dy = grid_put(c, c->dtype, dy, n), *d_dx = grid_alloc(c, c->dtype, n);
    a->forward(&c->ctx, d_x, d_y, n);
    a->backward(&c->ctx, d_x, d_dy, d_dx, n);
    float *gy = grid_get(c, c->dtype, d_y, n), *gdx = grid_get(c, c->dtype, d_dx, n);
    grid_check(c, what[0], gy, y, n, grid_bound(c, a->bound));
    grid_check(c, what[1], gdx, dx, n, grid_bound(c, a->bound));

    a->backward(&c->ctx, d_x, d_dy, d_dy, n); /* dx aliasing dy */
    float *gdx_inplace = grid_get(c, c->dtype, d_dy, n);
    grid_check_same(c, what[2], gdx_inplace, gdx, n * sizeof(float));

    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, y, dx, gy, gdx, gdx_inplace};
    host_free_all(host, GRID_COUNT(host));
}

/* On the CPU the face must give the reference's bits. */
static void activation_face(const GridCase *c, const GridActivation *a) {
    enum { N = 64 };
    float *x = grid_random(c, DTYPE_F32, N, -a->range, a->range), *dy = grid_random(c, DTYPE_F32, N, -1, 1);
    float y_ref[N], y[N], dx_ref[N], dx[N];
    a->forward_cpu(x, y_ref, N);
    a->backward_cpu(x, dy, dx_ref, N);
    a->forward(&c->ctx, x, y, N);
    a->backward(&c->ctx, x, dy, dx, N);
    grid_check_same(c, "face y", y, y_ref, sizeof y);
    grid_check_same(c, "face dx", dx, dx_ref, sizeof dx);
    free(x), free(dy);
}

void grid_activation_case(const GridCase *c, const GridActivation *a) {
    activation_size(c, a, 4096); /* the CUDA path's 16 bytes a thread */
    activation_size(c, a, 1001); /* its one element a thread */
    activation_size(c, a, 1);
    if (c->device != DEVICE_CPU) return;
    activation_finite_differences(c, a);
    activation_face(c, a);
}
