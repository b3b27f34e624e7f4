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

/* Phi in float: 0.5 + 0.5 erff, a short polynomial on the GPU, down to -3,
 * where Phi is 1.3e-3 and the sum keeps its relative error under 1e-4; below
 * it the sum cancels (at x = -5 Phi is 3e-7, where it keeps about one
 * significant digit), so erfc, several times dearer. Batch-normalised inputs
 * fall below -3 about once in 700, so a warp seldom runs both. */
#define GELU_ERFC_BELOW (-3.0f)
static inline GELU_HOST_DEVICE float gelu_cdf_f(float x) {
    if (x >= GELU_ERFC_BELOW) return 0.5f + 0.5f * erff(x * GELU_SQRT1_2_F);
    return 0.5f * erfcf(-x * GELU_SQRT1_2_F);
}

static inline GELU_HOST_DEVICE float gelu_value_f(float x) { return x * gelu_cdf_f(x); }

static inline GELU_HOST_DEVICE float gelu_grad_f(float x) {
    float cdf = gelu_cdf_f(x);
    float pdf = GELU_INV_SQRT_2PI_F * expf(-0.5f * x * x);
    return cdf + x * pdf;
}

#endif
