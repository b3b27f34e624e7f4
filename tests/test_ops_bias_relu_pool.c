/* bias + ReLU + 2x2 max-pool in one op (ops/bias_relu_pool): the CPU reference
 * by hand, against the three unfused ops, and against finite differences (for
 * x, and for the bias through the channel sums of dx that the conv's bias
 * gradient takes); the CUDA path against the CPU in fp32, fp16 and bf16, NCHW
 * and NHWC, out of place and in place. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/bias_relu.h"
#include "ops/bias_relu_pool.h"
#include "ops/maxpool.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/op_buffers.h"
#include "tests/op_checks.h"

static size_t numel(const Pool2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }

/* One 2x4 plane, two windows, bias -0.5: [1 3 | 0 -1] over [3 2 | -2 -3]. The
 * first window's first maximum (the 3 at column 1; the 3 below it ties) takes
 * dy; the second window's maximum is negative, so the ReLU passes nothing. */
static void check_by_hand(void) {
    Pool2dShape s = {.n = 1, .c = 1, .h = 2, .w = 4};
    const float x[8] = {1, 3, 0, -1, 3, 2, -2, -3}, b[1] = {-0.5f}, dy[2] = {5, 7};
    const float want_y[2] = {2.5f, 0.0f}, want_dx[8] = {0, 5, 0, 0, 0, 0, 0, 0};
    float y[2], dx[8];
    bias_relu_pool_forward_cpu(&s, 0, x, b, y);
    bias_relu_pool_backward_cpu(&s, 0, x, b, dy, dx);
    for (int i = 0; i < 2; i++) CHECK_NEAR(y[i], want_y[i], 0);
    for (int i = 0; i < 8; i++) CHECK_NEAR(dx[i], want_dx[i], 0);
}

/* x on a grid of quarters and b of eighths: x + b is exact in every dtype and
 * windows tie, hold zeros and negatives. */
static void grid_values(float *x, size_t nx, float *b, int c, uint64_t *rng) {
    for (size_t i = 0; i < nx; i++) x[i] = floorf(test_uniform(rng, -8, 9)) / 4;
    for (int i = 0; i < c; i++) b[i] = floorf(test_uniform(rng, -4, 5)) / 8;
}

/* The fused op equals bias + ReLU, then max-pool; backward equals max-pool's
 * backward then ReLU's, bit for bit; NHWC equals NCHW. */
static void check_against_unfused(uint64_t *rng) {
    Pool2dShape s = {.n = 2, .c = 3, .h = 6, .w = 8};
    size_t nx = numel(&s), ny = nx / 4;
    float *x = host_floats(nx), *b = host_floats(s.c), *dy = host_floats(ny);
    grid_values(x, nx, b, s.c, rng);
    test_fill_uniform(dy, ny, rng, -1, 1);
    float *y = host_floats(ny), *dx = host_floats(nx);
    bias_relu_pool_forward_cpu(&s, 0, x, b, y);
    bias_relu_pool_backward_cpu(&s, 0, x, b, dy, dx);

    float *relu = copy_floats(x, nx), *y2 = host_floats(ny), *dx2 = host_floats(nx);
    bias_relu_forward_cpu(b, relu, s.n, s.c, s.h * s.w, 0);
    maxpool2x2_forward_cpu(&s, relu, y2);
    memset(dx2, 0, nx * sizeof(float));
    maxpool2x2_backward_cpu(&s, relu, y2, dy, dx2);
    for (size_t i = 0; i < nx; i++)
        if (!(relu[i] > 0.0f)) dx2[i] = 0.0f;
    CHECK_MSG(memcmp(y, y2, ny * sizeof(float)) == 0, "fused forward differs from bias + ReLU + max-pool");
    CHECK_MSG(memcmp(dx, dx2, nx * sizeof(float)) == 0, "fused backward differs from max-pool + ReLU backward");

    float *x_nhwc = to_nhwc(x, s.n, s.c, s.h, s.w, s.c), *dy_nhwc = to_nhwc(dy, s.n, s.c, s.h / 2, s.w / 2, s.c);
    float *y3 = host_floats(ny), *dx3 = host_floats(nx);
    bias_relu_pool_forward_cpu(&s, 1, x_nhwc, b, y3);
    bias_relu_pool_backward_cpu(&s, 1, x_nhwc, b, dy_nhwc, dx3);
    float *y3c = to_nchw(y3, s.n, s.c, s.h / 2, s.w / 2), *dx3c = to_nchw(dx3, s.n, s.c, s.h, s.w);
    CHECK_MSG(memcmp(y, y3c, ny * sizeof(float)) == 0 && memcmp(dx, dx3c, nx * sizeof(float)) == 0,
              "NHWC differs from NCHW on the CPU");

    /* in place: dx over x */
    float *inplace = copy_floats(x, nx);
    bias_relu_pool_backward_cpu(&s, 0, inplace, b, dy, inplace);
    CHECK_MSG(memcmp(inplace, dx, nx * sizeof(float)) == 0, "in-place backward differs on the CPU");
    free(x), free(b), free(dy), free(y), free(dx), free(relu), free(y2), free(dx2);
    free(x_nhwc), free(dy_nhwc), free(y3), free(dx3), free(y3c), free(dx3c), free(inplace);
}

typedef struct {
    const Pool2dShape *s;
    float *x, *b, *r, *y;
} FdCtx;

static double fd_loss(void *p) {
    FdCtx *c = p;
    bias_relu_pool_forward_cpu(c->s, 0, c->x, c->b, c->y);
    return weighted_sum(c->y, c->r, numel(c->s) / 4);
}

/* Each window's four values distinct steps of 0.05 apart and x + b at least
 * 0.025 from 0, so a 1e-3 step never crosses a tie or the ReLU's kink. */
static void check_finite_differences(uint64_t *rng) {
    Pool2dShape s = {.n = 2, .c = 3, .h = 4, .w = 6};
    size_t nx = numel(&s), ny = nx / 4;
    float *x = host_floats(nx), *b = host_floats(s.c), *r = host_floats(ny), *y = host_floats(ny);
    float *dx = host_floats(nx);
    for (size_t o = 0; o < ny; o++) {
        size_t plane = o / ((s.h / 2) * (s.w / 2)), p = o / (s.w / 2) % (s.h / 2), q = o % (s.w / 2);
        size_t top = plane * s.h * s.w + 2 * p * s.w + 2 * q, at[4] = {top, top + 1, top + s.w, top + s.w + 1};
        int start = (int)floorf(test_uniform(rng, -12, 9));
        int order[4] = {0, 1, 2, 3};
        for (int i = 3; i > 0; i--) {
            int j = (int)floorf(test_uniform(rng, 0, (float)i + 1));
            if (j > i) j = i;
            int t = order[i];
            order[i] = order[j], order[j] = t;
        }
        for (int i = 0; i < 4; i++) x[at[i]] = (start + order[i]) * 0.05f;
    }
    for (int c = 0; c < s.c; c++) b[c] = 0.025f + 0.05f * floorf(test_uniform(rng, -2, 3));
    test_fill_uniform(r, ny, rng, -1, 1);
    FdCtx ctx = {&s, x, b, r, y};
    bias_relu_pool_backward_cpu(&s, 0, x, b, r, dx);
    double *num_dx = malloc(nx * sizeof(double)), *num_db = malloc(s.c * sizeof(double));
    numeric_gradient(x, nx, 1e-3f, fd_loss, &ctx, num_dx);
    check_gradient("bias_relu_pool dx", dx, num_dx, nx);
    numeric_gradient(b, s.c, 1e-3f, fd_loss, &ctx, num_db);
    float db[3] = {0, 0, 0};
    for (size_t i = 0; i < nx; i++) db[i / (s.h * s.w) % s.c] += dx[i];
    check_gradient("bias_relu_pool db (channel sums of dx)", db, num_db, s.c);
    free(x), free(b), free(r), free(y), free(dx), free(num_dx), free(num_db);
}

/* The GPU against the CPU, bit for bit: grid values (exact in every dtype),
 * or for fp32 continuous ones too. */
#if TRAINC_CUDA /* the GPU checks; a build without CUDA runs the CPU's alone */
static void check_gpu(DType dt, int nhwc, int n, int c, int h, int w, int grid, uint64_t *rng, cudaStream_t st) {
    Pool2dShape s = {.n = n, .c = c, .h = h, .w = w};
    size_t nx = numel(&s), ny = nx / 4;
    float *x = host_floats(nx), *b = host_floats(c), *dy = host_floats(ny);
    if (grid) grid_values(x, nx, b, c, rng);
    else test_fill_uniform(x, nx, rng, -1, 1), test_fill_uniform(b, c, rng, -0.5f, 0.5f);
    test_fill_uniform(dy, ny, rng, -1, 1);
    round_to(dt, dy, ny);
    float *want_y = host_floats(ny), *want_dx = host_floats(nx);
    bias_relu_pool_forward_cpu(&s, 0, x, b, want_y);
    bias_relu_pool_backward_cpu(&s, 0, x, b, dy, want_dx);

    float *xl = nhwc ? to_nhwc(x, n, c, h, w, c) : copy_floats(x, nx);
    float *dyl = nhwc ? to_nhwc(dy, n, c, h / 2, w / 2, c) : copy_floats(dy, ny);
    void *d_x = dev_values_on(st, dt, xl, nx), *d_b = dev_values_on(st, dt, b, c), *d_dy = dev_values_on(st, dt, dyl, ny);
    void *d_y = dev_bytes(ny * dtype_size(dt)), *d_dx = dev_bytes(nx * dtype_size(dt));
    CUDA_CHECK(cudaMemsetAsync(d_y, 0xff, ny * dtype_size(dt), st)); /* NaN: every element must be written */
    CUDA_CHECK(cudaMemsetAsync(d_dx, 0xff, nx * dtype_size(dt), st));
    bias_relu_pool_forward_cuda(dt, &s, nhwc, d_x, d_b, d_y, st);
    bias_relu_pool_backward_cuda(dt, &s, nhwc, d_x, d_b, d_dy, d_dx, st);
    float *gy = download_values_on(st, dt, d_y, ny), *gdx = download_values_on(st, dt, d_dx, nx);
    bias_relu_pool_backward_cuda(dt, &s, nhwc, d_x, d_b, d_dy, d_x, st); /* in place */
    float *gdx_inplace = download_values_on(st, dt, d_x, nx);
    if (nhwc) {
        float *t = to_nchw(gy, n, c, h / 2, w / 2);
        free(gy), gy = t;
        t = to_nchw(gdx, n, c, h, w);
        free(gdx), gdx = t;
        t = to_nchw(gdx_inplace, n, c, h, w);
        free(gdx_inplace), gdx_inplace = t;
    }
    round_to(dt, want_y, ny);
    const char *tag = nhwc ? "nhwc" : "nchw";
    printf("  %-4s %s %dx%dx%dx%d %s: y rel err %.2e, dx rel err %.2e\n", dtype_name(dt), tag, n, c, h, w,
           grid ? "grid" : "random", test_rel_error(gy, want_y, ny), test_rel_error(gdx, want_dx, nx));
    CHECK_MSG(memcmp(gy, want_y, ny * sizeof(float)) == 0, "%s %s %dx%dx%dx%d: forward differs from the CPU",
              dtype_name(dt), tag, n, c, h, w);
    CHECK_MSG(memcmp(gdx, want_dx, nx * sizeof(float)) == 0, "%s %s %dx%dx%dx%d: backward differs from the CPU",
              dtype_name(dt), tag, n, c, h, w);
    CHECK_MSG(memcmp(gdx_inplace, want_dx, nx * sizeof(float)) == 0,
              "%s %s %dx%dx%dx%d: in-place backward differs from the CPU", dtype_name(dt), tag, n, c, h, w);
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_b));
    CUDA_CHECK(cudaFree(d_dy));
    CUDA_CHECK(cudaFree(d_y));
    CUDA_CHECK(cudaFree(d_dx));
    free(x), free(b), free(dy), free(want_y), free(want_dx), free(xl), free(dyl), free(gy), free(gdx);
    free(gdx_inplace);
}

static void check_gpu_all(uint64_t *rng) {
    GpuContext g;
    gpu_context_init(&g, 0);
    const DType types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            check_gpu(types[t], nhwc, 4, 64, 32, 32, 1, rng, g.compute); /* 16-byte NHWC vectors */
            check_gpu(types[t], nhwc, 3, 5, 6, 10, 1, rng, g.compute);   /* channel by channel */
            check_gpu(types[t], nhwc, 2, 24, 4, 6, 1, rng, g.compute);
        }
    for (int nhwc = 0; nhwc < 2; nhwc++) check_gpu(DTYPE_F32, nhwc, 4, 32, 16, 16, 0, rng, g.compute);
    gpu_context_destroy(&g);
}
#endif

int main(void) {
    uint64_t rng = test_seed();
    check_by_hand();
    check_against_unfused(&rng);
    check_finite_differences(&rng);
    if (gpu_count() == 0) {
        printf("no GPU: CUDA checks skipped\n");
        return test_finish("test_ops_bias_relu_pool");
    }
    GPU_ONLY(check_gpu_all(&rng));
    return test_finish("test_ops_bias_relu_pool");
}
