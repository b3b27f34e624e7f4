/* The CPU reference's GEMM (ops/gemm_cpu.h), the BLAS one and the plain
 * loops, against a sum in double: every transpose, row strides wider than the
 * rows (the padding of C untouched), alpha and beta, and beta 0 never reading
 * C (NaN there). It has no face and no GPU path (cuBLAS is linear's). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm_cpu.h"
#include "tests/ops/grid.h"

static void naive_gemm(int ta, int tb, int m, int n, int k, double alpha, const float *a, int lda, const float *b,
                       int ldb, double beta, const float *c0, int ldc, double *c) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = 0;
            for (int p = 0; p < k; p++) {
                double av = ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
                double bv = tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
                sum += av * bv;
            }
            double old = beta != 0 ? beta * c0[(size_t)i * ldc + j] : 0;
            c[(size_t)i * n + j] = alpha * sum + old;
        }
}

static void gemm_shape(const GridCase *c, int ta, int tb, int m, int n, int k, float alpha, float beta) {
    int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
    int a_rows = ta ? k : m, b_rows = tb ? n : k;
    float *a = grid_random(c, DTYPE_F32, (size_t)a_rows * lda, -1, 1);
    float *b = grid_random(c, DTYPE_F32, (size_t)b_rows * ldb, -1, 1);
    float *c0 = grid_random(c, DTYPE_F32, (size_t)m * ldc, -1, 1);
    if (beta == 0) grid_fill_nan(c0, (size_t)m * ldc); /* beta 0 must not read C */
    double *want = malloc(sizeof(double) * m * n);
    naive_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want);
    for (int impl = 0; impl < 2; impl++) {
        float *out = copy_floats(c0, (size_t)m * ldc);
        if (impl == 0) cpu_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc);
        else cpu_sgemm_loops(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc);
        int bad = 0;
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < n; j++) {
                double got = out[(size_t)i * ldc + j], w = want[(size_t)i * n + j];
                if (!(fabs(got - w) <= 1e-5 * (1 + fabs(w)) * sqrt(k + 1.0))) bad++;
            }
            /* the padding past n in each row of C is not touched */
            bad += memcmp(&out[(size_t)i * ldc + n], &c0[(size_t)i * ldc + n], sizeof(float)) != 0;
        }
        CHECK_MSG(bad == 0, "%s ta=%d tb=%d %dx%dx%d alpha=%g beta=%g: %d wrong", impl ? "cpu_sgemm_loops" : "cpu_sgemm",
                  ta, tb, m, n, k, alpha, beta, bad);
        free(out);
    }
    free(a), free(b), free(c0), free(want);
}

static void gemm_case(const GridCase *c) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_shape(c, ta, tb, 5, 7, 9, 0.5f, -1.5f);
            gemm_shape(c, ta, tb, 37, 45, 53, 1.0f, 0.0f);
            gemm_shape(c, ta, tb, 3, 2, 1, 2.0f, 1.0f);
        }
}

const GridOp grid_op_gemm = {
    .name = "gemm",
    .run = gemm_case,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cuda (no GPU path: cuBLAS is linear's), nhwc (matrices)",
};
