/* Fused bias + ReLU: the CPU reference against hand-computed values, and the
 * CUDA path against the CPU in fp32, fp16 and bf16, NCHW and NHWC, on shapes
 * that take the 16-byte path and shapes that do not. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/bias_relu.h"
#include "ops/cast.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"

static void check_cpu_by_hand(void) {
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

#if TRAINC_CUDA /* the GPU checks; a build without CUDA runs the CPU's alone */
static void check_gpu(DType dt, int nhwc, int n, int c, int plane, uint64_t *rng, cudaStream_t s) {
    size_t total = (size_t)n * c * plane, esize = dtype_size(dt);
    float *y = malloc(total * sizeof(float)), *b = malloc(c * sizeof(float));
    float *back = malloc(total * sizeof(float));
    test_fill_uniform(y, total, rng, -2, 2);
    test_fill_uniform(b, c, rng, -1, 1);
    /* Round the inputs to the dtype so only the op's own rounding remains. */
    void *y_half = malloc(total * esize), *b_half = malloc(c * esize);
    cast_from_f32_cpu(dt, y, y_half, total);
    cast_from_f32_cpu(dt, b, b_half, c);
    cast_to_f32_cpu(dt, y_half, y, total);
    cast_to_f32_cpu(dt, b_half, b, c);
    void *d_y, *d_b;
    CUDA_CHECK(cudaMalloc(&d_y, total * esize));
    CUDA_CHECK(cudaMalloc(&d_b, c * esize));
    CUDA_CHECK(cudaMemcpy(d_y, y_half, total * esize, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_b, b_half, c * esize, cudaMemcpyHostToDevice));
    bias_relu_forward_cuda(dt, nhwc, d_b, d_y, n, c, plane, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaMemcpy(y_half, d_y, total * esize, cudaMemcpyDeviceToHost));
    cast_to_f32_cpu(dt, y_half, back, total);
    bias_relu_forward_cpu(b, y, n, c, plane, nhwc);
    /* The CPU result rounded to the dtype must match exactly: one fp32 add, one rounding. */
    cast_from_f32_cpu(dt, y, y_half, total);
    cast_to_f32_cpu(dt, y_half, y, total);
    CHECK_MSG(memcmp(back, y, total * sizeof(float)) == 0, "%s %s n=%d c=%d plane=%d: differs (rel %.3g)",
              dtype_name(dt), nhwc ? "nhwc" : "nchw", n, c, plane, test_rel_error(back, y, total));
    CUDA_CHECK(cudaFree(d_y));
    CUDA_CHECK(cudaFree(d_b));
    free(y), free(b), free(back), free(y_half), free(b_half);
}

static void check_gpu_all(void) {
    uint64_t rng = test_seed();
    GpuContext g;
    gpu_context_init(&g, 0);
    const DType types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            check_gpu(types[t], nhwc, 4, 64, 32 * 32, &rng, g.compute); /* 16-byte path */
            check_gpu(types[t], nhwc, 3, 5, 7 * 9, &rng, g.compute);    /* element path */
            check_gpu(types[t], nhwc, 2, 24, 15, &rng, g.compute);      /* nhwc vectors, nchw elements */
        }
    gpu_context_destroy(&g);
}
#endif

int main(void) {
    check_cpu_by_hand();
    if (gpu_count() == 0) {
        printf("no GPU: CUDA checks skipped\n");
        return test_finish("test_ops_bias_relu");
    }
    GPU_ONLY(check_gpu_all());
    return test_finish("test_ops_bias_relu");
}
