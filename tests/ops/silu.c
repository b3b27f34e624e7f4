/* SiLU (ops/silu.h): every case against the CPU reference on the same
 * (rounded) inputs, dx aliasing dy giving the same bits; on the CPU, the face
 * gives the reference's bits and the backward matches finite differences
 * (grid_activation_case); once, the reference against the formula and values
 * by hand. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/silu.h"
#include "tests/ops/grid.h"

/* Computed in float (expf) and rounded once to the dtype: within half a unit
 * of its last place per element (f16 2^-11, bf16 2^-8). */
#define SILU_BOUND {1e-5, 1e-3, 8e-3}

static const GridActivation SILU = {"silu", silu_forward_cpu, silu_backward_cpu, silu_forward, silu_backward,
                                    SILU_BOUND, 6};

static void silu_case(const GridCase *c) { grid_activation_case(c, &SILU); }

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
