/* Residual add (ops/add.h) through its face; fused: add + ReLU. The sum of two
 * values of the dtype is rounded once, so every case matches the reference
 * rounded to the dtype exactly: unfused, y = a + b and dst += src; fused,
 * y = relu(a + b); each on whole buffers and on views one element in (not
 * 16-byte aligned: the scalar path), and y aliasing a. Extras: values by hand,
 * NaN passing through. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/add.h"
#include "tests/ops/grid.h"

/* What the case checks: y = a + b (or relu of it), and unfused dst += src. */
static void add_reference(const GridCase *c, const float *a, const float *b, float *y, float *acc, size_t n) {
    if (c->fused) add_relu_forward_cpu(a, b, y, n);
    else add_forward_cpu(a, b, y, n);
    memcpy(acc, a, n * sizeof(float));
    add_accumulate_cpu(acc, b, n);
    round_to(c->dtype, y, n);
    round_to(c->dtype, acc, n);
}

static void add_run(const GridCase *c, const void *a, const void *b, void *y, size_t n) {
    if (c->fused) add_relu_forward(&c->ctx, a, b, y, n);
    else add_forward(&c->ctx, a, b, y, n);
}

static void add_size(const GridCase *c, size_t n) {
    printf(" n=%zu\n", n);
    DType dt = c->dtype;
    size_t es = dtype_size(dt);
    float *a = grid_random(c, dt, n, -1, 1), *b = grid_random(c, dt, n, -1, 1);
    float *y = host_floats(n), *acc = host_floats(n);
    add_reference(c, a, b, y, acc, n);
    void *d_a = grid_put(c, dt, a, n), *d_b = grid_put(c, dt, b, n), *d_y = grid_alloc(c, dt, n);
    const char *what_y = c->fused ? "add+relu y" : "add y";
    char what[64];
    for (int offset = 0; offset < 2; offset++) { /* n = 1, offset 1: an empty call */
        size_t m = n - offset;
        const char *at = offset ? " (offset 1)" : "";
        grid_poison(c, dt, d_y, n);
        add_run(c, (char *)d_a + es * offset, (char *)d_b + es * offset, (char *)d_y + es * offset, m);
        float *gy = grid_get(c, dt, d_y, n);
        snprintf(what, sizeof what, "%s%s", what_y, at);
        grid_check(c, what, gy + offset, y + offset, m, 0);
        free(gy);
        if (c->fused) continue;
        /* accumulate into a copy of a, in place */
        grid_set(c, dt, d_y, a, n);
        add_accumulate(&c->ctx, (char *)d_y + es * offset, (char *)d_b + es * offset, m);
        float *gacc = grid_get(c, dt, d_y, n);
        snprintf(what, sizeof what, "add_accumulate dst%s", at);
        grid_check(c, what, gacc + offset, acc + offset, m, 0);
        free(gacc);
    }
    /* y aliases a */
    add_run(c, d_a, d_b, d_a, n);
    float *gin = grid_get(c, dt, d_a, n);
    snprintf(what, sizeof what, "%s (y == a)", what_y);
    grid_check(c, what, gin, y, n, 0);
    void *dev[] = {d_a, d_b, d_y};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {a, b, y, acc, gin};
    host_free_all(host, GRID_COUNT(host));
}

static void add_case(const GridCase *c) {
    add_size(c, 1000);
    add_size(c, 1);
    add_size(c, ((size_t)1 << 20) + 5);
}

static void add_by_hand(uint64_t *rng) {
    (void)rng;
    float a[5] = {1, -2, 0.5f, -0.25f, NAN}, b[5] = {0.5f, 1, -1, 0.25f, 1}, y[5], acc[5];
    add_forward_cpu(a, b, y, 5);
    CHECK(y[0] == 1.5f && y[1] == -1.0f && y[2] == -0.5f && y[3] == 0.0f && isnan(y[4]));
    add_relu_forward_cpu(a, b, y, 5);
    CHECK(y[0] == 1.5f && y[1] == 0.0f && y[2] == 0.0f && y[3] == 0.0f && isnan(y[4]));
    memcpy(acc, b, sizeof acc);
    add_accumulate_cpu(acc, a, 4);
    CHECK(acc[0] == 1.5f && acc[1] == -1.0f && acc[2] == -0.5f && acc[3] == 0.0f && acc[4] == 1.0f);
    /* in place: y aliases a */
    memcpy(acc, a, sizeof acc);
    add_forward_cpu(acc, b, acc, 4);
    CHECK(acc[0] == 1.5f && acc[1] == -1.0f);
}

const GridOp grid_op_add = {
    .name = "add",
    .run = add_case,
    .extras = add_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .fused = 1,
    .skipped = "nhwc (elementwise: the layout changes nothing); finite differences (no backward of its own: "
               "the gradient passes through, relu_backward's for the fused op)",
};
