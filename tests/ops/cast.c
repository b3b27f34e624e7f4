/* Casts (ops/cast.h): float32 to the case's dtype through the face (f32: a
 * copy), the same bits as the host's cast, NaN staying NaN; widening back
 * exact; in NHWC the padded NCHW -> NHWC input cast (zero padding). On the
 * CPU, the rounding itself: chosen values bit for bit, every f16 and bf16
 * value through a round trip, midpoints to even. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cast.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

/* Values over the whole range of both types and past it: subnormals, ties,
 * overflow to inf, infinities and zeros of both signs; a NaN at n / 3. */
static float *cast_inputs(const GridCase *c, size_t n) {
    float *x = host_floats(n);
    for (size_t i = 0; i < n; i++) {
        float mantissa = test_uniform(c->rng, -2, 2);
        int exponent = (int)test_uniform(c->rng, -140, 130);
        x[i] = ldexpf(mantissa, exponent);
    }
    const float special[] = {INFINITY, -INFINITY, 0.0f, -0.0f, 65504.0f, 65520.0f, 65519.0f, ldexpf(1, -24),
                             ldexpf(1, -25), 3 * ldexpf(1, -25), 1.0f + ldexpf(1, -11), 1.0f + ldexpf(1, -8),
                             3.4028235e38f, 1e-40f};
    for (size_t i = 0; i < GRID_COUNT(special) && i < n; i++) x[i * 7 % n] = special[i];
    x[n / 3] = NAN;
    return x;
}

static void cast_to_f32_on(const GridCase *c, const void *src, float *dst, size_t n) {
    if (c->device == DEVICE_CPU) cast_to_f32_cpu(c->dtype, src, dst, n);
    else GPU_ONLY(cast_to_f32_cuda(c->dtype, src, dst, n, c->ctx.stream));
}

static void cast_size(const GridCase *c, size_t n) {
    printf(" n=%zu\n", n);
    DType dt = c->dtype;
    size_t bytes = n * dtype_size(dt);
    float *x = cast_inputs(c, n);
    void *want = host_bytes(bytes);
    cast_from_f32_cpu(dt, x, want, n);

    float *d_x = grid_put_bytes(c, x, n * sizeof(float));
    void *d_h = grid_alloc(c, dt, n);
    cast_from_f32(&c->ctx, d_x, d_h, n);
    unsigned char *got = grid_get_bytes(c, d_h, bytes);
    if (dt != DTYPE_F32) { /* NaN payloads may differ */
        uint16_t *got16 = (uint16_t *)got;
        const uint16_t *want16 = want;
        CHECK_MSG((got16[n / 3] & 0x7fff) > (dt == DTYPE_F16 ? 0x7c00 : 0x7f80), "%s cast: NaN did not stay NaN",
                  c->name);
        got16[n / 3] = want16[n / 3];
    }
    grid_check_same(c, dt == DTYPE_F32 ? "cast f32 -> f32 (a copy)" : "cast from f32 (the host's rounding)", got,
                    want, bytes);

    /* widening is exact: the host's floats bit for bit */
    void *d_back = grid_alloc(c, DTYPE_F32, n);
    op_copy_from_host(&c->ctx, d_h, want, bytes);
    cast_to_f32_on(c, d_h, d_back, n);
    float *back = grid_get_bytes(c, d_back, n * sizeof(float)), *back_want = host_floats(n);
    cast_to_f32_cpu(dt, want, back_want, n);
    back[n / 3] = back_want[n / 3] = 0;
    grid_check_same(c, "cast to f32 (exact)", back, back_want, n * sizeof(float));

    void *dev[] = {d_x, d_h, d_back};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, want, got, back, back_want};
    host_free_all(host, GRID_COUNT(host));
}

/* A float32 NCHW batch to the dtype in NHWC, channels padded to c_padded. */
static void cast_nhwc_shape(const GridCase *c, int n, int ch, int h, int w, int c_padded) {
    printf(" nchw -> nhwc %dx%dx%dx%d, channels padded to %d\n", n, ch, h, w, c_padded);
    DType dt = c->dtype;
    size_t nx = (size_t)n * ch * h * w, pixels = (size_t)n * h * w, esize = dtype_size(dt);
    size_t bytes = pixels * c_padded * esize;
    float *x = grid_random(c, DTYPE_F32, nx, -3, 3); /* not rounded: the cast rounds */
    void *want = host_bytes(bytes);
    cast_nchw_to_nhwc_cpu(dt, x, want, n, ch, h, w, c_padded);

    float *d_x = grid_put_bytes(c, x, nx * sizeof(float));
    void *d_y = grid_alloc(c, dt, pixels * c_padded);
    cast_nchw_to_nhwc(&c->ctx, d_x, d_y, n, ch, h, w, c_padded);
    unsigned char *got = grid_get_bytes(c, d_y, bytes);
    grid_check_same(c, "cast nchw -> nhwc (the host's)", got, want, bytes);
    size_t nonzero_padding = 0;
    for (size_t p = 0; p < pixels; p++)
        for (size_t b = (size_t)ch * esize; b < (size_t)c_padded * esize; b++)
            nonzero_padding += got[p * c_padded * esize + b] != 0;
    CHECK_MSG(nonzero_padding == 0, "%s cast nchw -> nhwc: %zu padding bytes are not zero", c->name,
              nonzero_padding);
    void *dev[] = {d_x, d_y};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, want, got};
    host_free_all(host, GRID_COUNT(host));
}

static void cast_case(const GridCase *c) {
    if (c->nhwc) {
        cast_nhwc_shape(c, 4, 3, 32, 32, 8);
        cast_nhwc_shape(c, 3, 3, 7, 5, 4);
        cast_nhwc_shape(c, 2, 3, 9, 11, 3); /* no padding */
        cast_nhwc_shape(c, 2, 3, 224, 224, 8);
        return;
    }
    cast_size(c, 1000);
    cast_size(c, 5000003); /* more than one grid-stride pass */
}

/* ---- the host's rounding ---------------------------------------------------------- */

static uint16_t half_bits_of(DType dt, float f) {
    uint16_t h;
    cast_from_f32_cpu(dt, &f, &h, 1);
    return h;
}

static float float_of(DType dt, uint16_t h) {
    float f;
    cast_to_f32_cpu(dt, &h, &f, 1);
    return f;
}

static void cast_values(void) {
    const DType F16 = DTYPE_F16, BF16 = DTYPE_BF16;
    float tiny = ldexpf(1, -24), small = ldexpf(1, -25);
    struct { DType dt; float in; uint16_t want; } cases[] = {
        {F16, 1.0f, 0x3c00}, {F16, -2.0f, 0xc000}, {F16, 0.1f, 0x2e66}, {F16, 65504.0f, 0x7bff},
        {F16, 65519.99f, 0x7bff}, {F16, 65520.0f, 0x7c00}, {F16, 1e6f, 0x7c00},
        {F16, -INFINITY, 0xfc00}, {F16, 0.0f, 0x0000}, {F16, -0.0f, 0x8000},
        {F16, ldexpf(1, -14), 0x0400}, {F16, tiny, 0x0001}, {F16, small, 0x0000},
        {F16, small * 1.0001f, 0x0001}, {F16, 3 * small, 0x0002}, {F16, 5 * small, 0x0002},
        {F16, 1.0f + ldexpf(1, -11), 0x3c00}, {F16, 1.0f + 3 * ldexpf(1, -11), 0x3c02},
        {F16, ldexpf(1, -14) - tiny / 4, 0x0400}, {F16, 1e-10f, 0x0000},
        {BF16, 1.0f, 0x3f80}, {BF16, -2.0f, 0xc000}, {BF16, 1.0f + ldexpf(1, -8), 0x3f80},
        {BF16, 1.0f + 3 * ldexpf(1, -8), 0x3f82}, {BF16, 3.4028235e38f, 0x7f80},
        {BF16, INFINITY, 0x7f80}, {BF16, 1e-40f, 0x0001}, {BF16, -0.0f, 0x8000},
    };
    for (size_t i = 0; i < GRID_COUNT(cases); i++) {
        uint16_t got = half_bits_of(cases[i].dt, cases[i].in);
        CHECK_MSG(got == cases[i].want, "%s(%.9g) = 0x%04x, want 0x%04x", dtype_name(cases[i].dt), cases[i].in, got,
                  cases[i].want);
    }
    CHECK(isnan(float_of(F16, half_bits_of(F16, NAN))));
    CHECK(isnan(float_of(BF16, half_bits_of(BF16, NAN))));
    CHECK(float_of(F16, 0x0001) == tiny && float_of(F16, 0x7bff) == 65504.0f);
    CHECK(float_of(F16, 0x8400) == -ldexpf(1, -14) && isinf(float_of(F16, 0x7c00)));
    CHECK(float_of(BF16, 0x3f80) == 1.0f && float_of(BF16, 0xc000) == -2.0f);
}

/* Every non-NaN f16 and bf16 value survives the trip through float32, and a
 * float between two neighbours rounds to the nearer one (ties to even). */
static void cast_round_trips(void) {
    const DType types[2] = {DTYPE_F16, DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        int bad = 0, bad_mid = 0;
        for (uint32_t b = 0; b < 0x10000; b++) {
            float f = float_of(types[t], (uint16_t)b);
            if (isnan(f)) continue;
            bad += half_bits_of(types[t], f) != b;
            /* b and b + 1 are neighbours of one sign when neither is inf or NaN */
            float next = float_of(types[t], (uint16_t)(b + 1));
            if ((b & 0x7fff) == 0x7fff || isinf(f) || isinf(next) || isnan(next)) continue;
            double mid = ((double)f + next) / 2;
            float below = nextafterf((float)mid, f), above = nextafterf((float)mid, next);
            uint16_t want_mid = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
            bad_mid += half_bits_of(types[t], below) != b || half_bits_of(types[t], above) != (uint16_t)(b + 1) ||
                       ((double)(float)mid == mid && half_bits_of(types[t], (float)mid) != want_mid);
        }
        CHECK_MSG(bad == 0, "%s: %d values change on a round trip", dtype_name(types[t]), bad);
        CHECK_MSG(bad_mid == 0, "%s: %d midpoints round wrongly", dtype_name(types[t]), bad_mid);
    }
    float src[3] = {1.5f, -3.25f, 7.0f}, back[3];
    cast_from_f32_cpu(DTYPE_F32, src, back, 3);
    CHECK(!memcmp(src, back, sizeof src));
}

/* The host's NCHW -> NHWC cast is the transposition, padded with zeros, then
 * the plain cast, in every dtype. */
static void cast_nhwc_host(uint64_t *rng) {
    const DType types[3] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    const int shapes[4][5] = {{4, 3, 32, 32, 8}, {3, 3, 7, 5, 4}, {2, 3, 9, 11, 3}, {2, 3, 224, 224, 8}};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++) {
            int n = shapes[i][0], ch = shapes[i][1], h = shapes[i][2], w = shapes[i][3], c_padded = shapes[i][4];
            size_t nx = (size_t)n * ch * h * w, ny = (size_t)n * h * w * c_padded, bytes = ny * dtype_size(types[t]);
            float *x = host_floats(nx);
            test_fill_uniform(x, nx, rng, -3, 3);
            void *want = host_bytes(bytes), *plain = host_bytes(bytes);
            cast_nchw_to_nhwc_cpu(types[t], x, want, n, ch, h, w, c_padded);
            float *x_nhwc = to_nhwc(x, n, ch, h, w, c_padded);
            cast_from_f32_cpu(types[t], x_nhwc, plain, ny);
            CHECK_MSG(!memcmp(want, plain, bytes), "%s cast nchw -> nhwc (host) %dx%dx%dx%d is not transpose + cast",
                      dtype_name(types[t]), n, ch, h, w);
            free(x), free(want), free(plain), free(x_nhwc);
        }
}

static void cast_host(uint64_t *rng) {
    cast_values();
    cast_round_trips();
    cast_nhwc_host(rng);
}

const GridOp grid_op_cast = {
    .name = "cast",
    .run = cast_case,
    .extras = cast_host,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_BOTH_LAYOUTS,
    .skipped = "cpu f16 and bf16 through the face (the host's casts are checked as the reference, in extras)",
};
