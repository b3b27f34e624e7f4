/* IEEE binary16 and bfloat16 by bit manipulation, rounding to nearest even as
 * the device's __float2half_rn and __float2bfloat16_rn do. */
#include "ops/cast.h"

#include <stdint.h>
#include <string.h>

#include "runtime/check.h"

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Drops the low 'shift' bits of m, rounding to nearest, ties to even. */
static uint32_t shift_round_even(uint32_t m, unsigned shift) {
    uint32_t kept = m >> shift, rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    return kept + (rest > halfway || (rest == halfway && (kept & 1)));
}

static uint16_t float_to_half_bits(float f) {
    uint32_t u = float_bits(f), sign = (u >> 16) & 0x8000, mag = u & 0x7fffffff;
    if (mag > 0x7f800000) return (uint16_t)(sign | 0x7e00 | ((mag >> 13) & 0x3ff)); /* NaN */
    if (mag >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to inf */
    if (mag >= 0x38800000) /* normal: rebias the exponent 127 -> 15; a carry may bump it */
        return (uint16_t)(sign | shift_round_even(mag - 0x38000000, 13));
    if (mag < 0x33000000) return (uint16_t)sign; /* below half of 2^-24: zero */
    /* subnormal: the value in units of 2^-24 is mantissa * 2^(exponent - 126) */
    uint32_t exponent = mag >> 23, mantissa = (mag & 0x7fffff) | 0x800000;
    return (uint16_t)(sign | shift_round_even(mantissa, 126 - exponent));
}

static float half_bits_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    if (exponent == 0x1f) return bits_float(sign | 0x7f800000 | (mantissa << 13));
    if (exponent != 0) return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
    float value = (float)mantissa * 5.9604644775390625e-8f; /* 2^-24, exact */
    return sign ? -value : value;
}

static uint16_t float_to_bf16_bits(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float bf16_bits_to_float(uint16_t b) { return bits_float((uint32_t)b << 16); }

static void check_dtype(DType dt) {
    if (dt != DTYPE_F32 && dt != DTYPE_F16 && dt != DTYPE_BF16)
        TC_FATAL("cast: dtype %s is not supported (f32, f16 or bf16)", dtype_name(dt));
}

void cast_from_f32_cpu(DType dst_dtype, const float *src, void *dst, size_t n) {
    check_dtype(dst_dtype);
    if (dst_dtype == DTYPE_F32) {
        memmove(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *out = dst;
    for (size_t i = 0; i < n; i++)
        out[i] = dst_dtype == DTYPE_F16 ? float_to_half_bits(src[i]) : float_to_bf16_bits(src[i]);
}

void cast_to_f32_cpu(DType src_dtype, const void *src, float *dst, size_t n) {
    check_dtype(src_dtype);
    if (src_dtype == DTYPE_F32) {
        memmove(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *in = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = src_dtype == DTYPE_F16 ? half_bits_to_float(in[i]) : bf16_bits_to_float(in[i]);
}

/* dst[i] = v rounded to dt. */
static void store_rounded(DType dt, void *dst, size_t i, float v) {
    if (dt == DTYPE_F32)
        ((float *)dst)[i] = v;
    else
        ((uint16_t *)dst)[i] = dt == DTYPE_F16 ? float_to_half_bits(v) : float_to_bf16_bits(v);
}

void cast_nchw_to_nhwc_cpu(DType dst_dtype, const float *src_nchw, void *dst_nhwc, int n, int c,
                           int h, int w, int c_padded) {
    check_dtype(dst_dtype);
    if (n < 0 || c <= 0 || h < 0 || w < 0 || c_padded < c)
        TC_FATAL("cast nchw -> nhwc: bad shape n=%d c=%d h=%d w=%d c_padded=%d", n, c, h, w,
                 c_padded);
    size_t plane = (size_t)h * w;
    for (size_t p = 0; p < (size_t)n * plane; p++) {
        const float *in = src_nchw + (p / plane) * c * plane + p % plane;
        for (int ch = 0; ch < c_padded; ch++)
            store_rounded(dst_dtype, dst_nhwc, p * c_padded + ch, ch < c ? in[ch * plane] : 0.0f);
    }
}

void cast_from_f32(const OpContext *ctx, const float *src, void *dst, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) cast_from_f32_cpu(ctx->dtype, src, dst, n);
    else GPU_ONLY(cast_from_f32_cuda(ctx->dtype, src, dst, n, ctx->stream));
    op_end(ctx, __func__);
}

void cast_to_f32(const OpContext *ctx, const void *src, float *dst, size_t n) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) cast_to_f32_cpu(ctx->dtype, src, dst, n);
    else GPU_ONLY(cast_to_f32_cuda(ctx->dtype, src, dst, n, ctx->stream));
    op_end(ctx, __func__);
}

void cast_nchw_to_nhwc(const OpContext *ctx, const float *src_nchw, void *dst_nhwc, int n, int c, int h, int w,
                       int c_padded) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) cast_nchw_to_nhwc_cpu(ctx->dtype, src_nchw, dst_nhwc, n, c, h, w, c_padded);
    else GPU_ONLY(cast_nchw_to_nhwc_cuda(ctx->dtype, src_nchw, dst_nhwc, n, c, h, w, c_padded, ctx->stream));
    op_end(ctx, __func__);
}
