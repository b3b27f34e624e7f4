/* Fused bias + ReLU (ops/bias_relu.h), in place on a convolution's output:
 * one fp32 add and one rounding, so the result is the CPU's rounded to the
 * dtype, bit for bit, NCHW and NHWC, on shapes that take the 16-byte path and
 * shapes that do not. */
#include <stdlib.h>
#include <string.h>

#include "ops/bias_relu.h"
#include "tests/ops/grid.h"

static void bias_relu_shape(const GridCase *c, int n, int ch, int plane) {
    printf(" n=%d c=%d plane=%d\n", n, ch, plane);
    DType dt = c->dtype;
    size_t total = (size_t)n * ch * plane;
    /* rounded to the dtype, so only the op's own rounding remains */
    float *y = grid_random(c, dt, total, -2, 2), *b = grid_random(c, dt, ch, -1, 1);
    void *d_y = grid_put(c, dt, y, total), *d_b = grid_put(c, dt, b, ch);
    bias_relu_forward(&c->ctx, d_b, d_y, n, ch, plane);
    float *got = grid_get(c, dt, d_y, total);
    bias_relu_forward_cpu(b, y, n, ch, plane, c->nhwc);
    round_to(dt, y, total);
    grid_check(c, "bias_relu y", got, y, total, grid_bound(c, GRID_EXACT));
    grid_check_same(c, "bias_relu y (bits)", got, y, total * sizeof(float));
    void *dev[] = {d_y, d_b};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {y, b, got};
    host_free_all(host, GRID_COUNT(host));
}

static void bias_relu_case(const GridCase *c) {
    bias_relu_shape(c, 4, 64, 32 * 32); /* 16-byte path */
    bias_relu_shape(c, 3, 5, 7 * 9);    /* element path */
    bias_relu_shape(c, 2, 24, 15);      /* nhwc vectors, nchw elements */
}

static void bias_relu_by_hand(uint64_t *rng) {
    (void)rng;
    /* n = 1, c = 2, plane = 2 */
    float b[2] = {0.5f, -1.0f};
    float nchw[4] = {-1.0f, 0.25f, 2.0f, 0.5f};
    const float want_nchw[4] = {0.0f, 0.75f, 1.0f, 0.0f};
    bias_relu_forward_cpu(b, nchw, 1, 2, 2, 0);
    for (int i = 0; i < 4; i++) CHECK_NEAR(nchw[i], want_nchw[i], 0);
    float nhwc[4] = {-1.0f, 0.25f, 2.0f, 0.5f}; /* pixel 0: c0 -1, c1 .25; pixel 1: c0 2, c1 .5 */
    const float want_nhwc[4] = {0.0f, 0.0f, 2.5f, 0.0f};
    bias_relu_forward_cpu(b, nhwc, 1, 2, 2, 1);
    for (int i = 0; i < 4; i++) CHECK_NEAR(nhwc[i], want_nhwc[i], 0);
}

const GridOp grid_op_bias_relu = {
    .name = "bias_relu",
    .run = bias_relu_case,
    .extras = bias_relu_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_BOTH_LAYOUTS,
    .skipped = "backward (ReLU's backward then the bias gradient: relu, conv_bias_grad); unfused (conv2d's bias, "
               "then relu)",
};
