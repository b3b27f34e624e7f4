/* The exact (erf) GELU's value and derivative, shared by ops/gelu and the
 * batch norm that fuses it (ops/batchnorm): in double for the CPU references,
 * in float for the CUDA kernels.
 *   gelu(x)  = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
 *   gelu'(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
#ifndef TRAINC_OPS_GELU_MATH_H
#define TRAINC_OPS_GELU_MATH_H

#include <math.h>

#ifdef __CUDACC__
#define GELU_HOST_DEVICE __host__ __device__
#else
#define GELU_HOST_DEVICE
#endif

#define GELU_SQRT1_2 0.70710678118654752440      /* 1 / sqrt(2) */
#define GELU_INV_SQRT_2PI 0.39894228040143267794 /* 1 / sqrt(2 pi) */
#define GELU_SQRT1_2_F 0.70710678118654752f
#define GELU_INV_SQRT_2PI_F 0.39894228040143268f

static inline GELU_HOST_DEVICE double gelu_value_d(double x) { return 0.5 * x * (1.0 + erf(x * GELU_SQRT1_2)); }

static inline GELU_HOST_DEVICE double gelu_grad_d(double x) {
    double cdf = 0.5 * (1.0 + erf(x * GELU_SQRT1_2)), pdf = GELU_INV_SQRT_2PI * exp(-0.5 * x * x);
    return cdf + x * pdf;
}

/* The fast forms on the device (2 ulp, far under the 1.2e-7 of gelu_cdf_f's fit below). */
static inline GELU_HOST_DEVICE float gelu_exp_f(float v) {
#ifdef __CUDA_ARCH__
    return __expf(v);
#else
    return expf(v);
#endif
}

static inline GELU_HOST_DEVICE float gelu_rcp_f(float v) {
#ifdef __CUDA_ARCH__
    return __fdividef(1.0f, v);
#else
    return 1.0f / v;
#endif
}

/* Phi and phi in float for the kernels, with no branch. erff and erfcf
 * each branch on their argument inside (a warp of normalised inputs takes
 * both sides), and so did an earlier form here (Abramowitz and Stegun's
 * 7.1.26, erfcf below -3): a branch an element keeps the compiler from
 * interleaving a vector's elements, and the batch norm's fused GELU passes
 * were bound by the chain of one element at a time (about 40% of the
 * memory roof on an H100). Here erfc(z), z = |x| / sqrt 2, is
 * the Chebyshev fit of Numerical Recipes (2nd ed., 6.2, erfcc),
 *   erfc(z) = t exp(-z^2 + P(t)),  t = 1 / (1 + z / 2),
 * whose relative error is under 1.2e-7 for every z >= 0, so Phi keeps its
 * relative accuracy far into the tail with no second formula. This is P(t). */
static inline GELU_HOST_DEVICE float gelu_erfc_poly_f(float t) {
    return -1.26551223f +
           t * (1.00002368f +
                t * (0.37409196f +
                     t * (0.09678418f +
                          t * (-0.18628806f +
                               t * (0.27886807f +
                                    t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
}

static inline GELU_HOST_DEVICE float gelu_cdf_f(float x) {
    float z = fabsf(x) * GELU_SQRT1_2_F, t = gelu_rcp_f(1.0f + 0.5f * z);
    float half_erfc = 0.5f * t * gelu_exp_f(gelu_erfc_poly_f(t) - z * z);
    return x >= 0.0f ? 1.0f - half_erfc : half_erfc;
}

/* Phi(x), and exp(-x^2 / 2) in *gauss for phi. */
static inline GELU_HOST_DEVICE float gelu_cdf_gauss_f(float x, float *gauss) {
    *gauss = gelu_exp_f(-0.5f * x * x);
    return gelu_cdf_f(x);
}

static inline GELU_HOST_DEVICE float gelu_value_f(float x) { return x * gelu_cdf_f(x); }

static inline GELU_HOST_DEVICE float gelu_grad_f(float x) {
    float gauss, cdf = gelu_cdf_gauss_f(x, &gauss);
    return cdf + x * (GELU_INV_SQRT_2PI_F * gauss);
}

#endif
