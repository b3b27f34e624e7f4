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

/* Phi and phi in float for the kernels, from one exponential. erff and
 * erfcf each branch on their argument inside (a warp of normalised inputs
 * takes both sides) and made the batch norm's fused GELU passes compute-bound
 * (ncu on an H100: 40% of the memory roof). Down to -3 Phi comes from
 * Abramowitz and Stegun's 7.1.26, erfc(z) = t (a1 + ... + a5 t^4) exp(-z^2),
 * t = 1 / (1 + p z), z = |x| / sqrt 2, whose error is 1.5e-7 absolute: 5e-5
 * of Phi at -3, where Phi is 1.3e-3. Below -3 (one input in 700 after a batch
 * norm) the absolute error would swamp Phi, so erfcf there. */
#define GELU_ERFC_BELOW (-3.0f)

/* The fast forms on the device (2 ulp, far under the 1.5e-7 above). */
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

/* Phi(x), and exp(-x^2 / 2) in *gauss for phi. */
static inline GELU_HOST_DEVICE float gelu_cdf_gauss_f(float x, float *gauss) {
    float z = fabsf(x) * GELU_SQRT1_2_F, t = gelu_rcp_f(1.0f + 0.3275911f * z);
    float e = gelu_exp_f(-z * z);
    *gauss = e;
    if (x < GELU_ERFC_BELOW) return 0.5f * erfcf(-x * GELU_SQRT1_2_F);
    float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    float half_erfc = 0.5f * poly * e;
    return x >= 0.0f ? 1.0f - half_erfc : half_erfc;
}

static inline GELU_HOST_DEVICE float gelu_cdf_f(float x) {
    float gauss;
    return gelu_cdf_gauss_f(x, &gauss);
}

static inline GELU_HOST_DEVICE float gelu_value_f(float x) { return x * gelu_cdf_f(x); }

static inline GELU_HOST_DEVICE float gelu_grad_f(float x) {
    float gauss, cdf = gelu_cdf_gauss_f(x, &gauss);
    return cdf + x * (GELU_INV_SQRT_2PI_F * gauss);
}

#endif
