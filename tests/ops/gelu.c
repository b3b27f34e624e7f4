/* GELU (ops/gelu.h), the erf form: every case against the CPU reference on
 * the same (rounded) inputs, dx aliasing dy giving the same bits; on the CPU,
 * the face gives the reference's bits and the backward matches finite
 * differences (grid_activation_case); once, the reference against the
 * formula in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gelu.h"
#include "ops/gelu_math.h"
#include "tests/ops/grid.h"

/* Computed in float (erff, expf) and rounded once to the dtype: within half a
 * unit of its last place per element (f16 2^-11, bf16 2^-8), float's own
 * functions a few units of 2^-24 from the reference's double. */
#define GELU_BOUND {1e-5, 1e-3, 8e-3}

static double gelu_exact(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

static double gelu_slope(double x) {
    return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

static const GridActivation GELU = {"gelu", gelu_forward_cpu, gelu_backward_cpu, gelu_forward, gelu_backward,
                                    GELU_BOUND, 4};

static void gelu_case(const GridCase *c) { grid_activation_case(c, &GELU); }

/* The kernels' Phi in float (gelu_math.h: one Chebyshev fit of erfc, no
 * branch) within 1e-4 of Phi in double, relative, from -12 to 12: the tail
 * too, where Phi is 1e-33 and an absolute error would swamp it. */
static void gelu_float_cdf(void) {
    double worst = 0;
    for (int i = -12000; i <= 12000; i++) {
        float x = (float)i * 1e-3f;
        double want = 0.5 * erfc(-(double)x * GELU_SQRT1_2), err = fabs(gelu_cdf_f(x) - want) / want;
        if (err > worst) worst = err;
    }
    printf("gelu: the float Phi within %.2g of double's, relative\n", worst);
    CHECK(worst < 1e-4);
}

/* The reference against the formula in double over [-6, 6], and where the
 * curve bends or flattens; NaN passes through, as in relu.h. */
static void gelu_formula(uint64_t *rng) {
    enum { N = 1000 };
    float *x = host_floats(N), *y = host_floats(N), *dy = host_floats(N), *dx = host_floats(N);
    double *want = malloc(N * sizeof(double));
    test_fill_uniform(x, N, rng, -6.0f, 6.0f);
    test_fill_uniform(dy, N, rng, -1.0f, 1.0f);
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 8.0f, -8.0f, 30.0f, -30.0f, 1e-20f, -0.7517915f};
    memcpy(x, special, sizeof special);
    gelu_forward_cpu(x, y, N);
    for (int i = 0; i < N; i++) want[i] = gelu_exact(x[i]);
    check_values("gelu_forward_cpu", y, want, N, 1e-6);
    CHECK(y[6] == 30.0f && y[7] == 0.0f); /* x Phi(x) is x, and 0, far out */
    gelu_backward_cpu(x, dy, dx, N);
    for (int i = 0; i < N; i++) want[i] = dy[i] * gelu_slope(x[i]);
    check_values("gelu_backward_cpu", dx, want, N, 1e-6);
    gelu_backward_cpu(x, dy, dy, N); /* dx aliasing dy */
    CHECK(memcmp(dy, dx, N * sizeof(float)) == 0);
    float nan_x = NAN, nan_y, one = 1.0f, nan_dx;
    gelu_forward_cpu(&nan_x, &nan_y, 1);
    gelu_backward_cpu(&nan_x, &one, &nan_dx, 1);
    CHECK(isnan(nan_y) && isnan(nan_dx));
    void *host[] = {x, y, dy, dx, want};
    host_free_all(host, GRID_COUNT(host));
    gelu_float_cdf();
}

const GridOp grid_op_gelu = {
    .name = "gelu",
    .run = gelu_case,
    .extras = gelu_formula,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (elementwise: the layout changes nothing)",
};
