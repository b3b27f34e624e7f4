#include "ops/gemm_cpu.h"

#include <stddef.h>

#ifdef TRAINC_HAVE_CBLAS
#include <cblas.h>
#endif

int cpu_sgemm_threads(void) {
#if defined(TRAINC_HAVE_CBLAS) && defined(OPENBLAS_VERSION)
    return openblas_get_num_threads();
#else
    return 1;
#endif
}

static void scale_rows(int m, int n, float beta, float *c, int ldc) {
    for (int i = 0; i < m; i++) {
        float *row = c + (size_t)i * ldc;
        if (beta == 0.0f) {
            for (int j = 0; j < n; j++) row[j] = 0.0f;
        } else if (beta != 1.0f) {
            for (int j = 0; j < n; j++) row[j] *= beta;
        }
    }
}

/* C[i][:] += alpha * op(A)[i][p] * B[p][:], the inner loop running along a row
 * of B and of C, so it vectorizes. Covers the two cases with B not transposed. */
static void gemm_b_rows(int trans_a, int m, int n, int k, float alpha, const float *a, int lda,
                        const float *b, int ldb, float *c, int ldc) {
    for (int i = 0; i < m; i++) {
        float *c_row = c + (size_t)i * ldc;
        for (int p = 0; p < k; p++) {
            float a_ip = alpha * (trans_a ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]);
            const float *b_row = b + (size_t)p * ldb;
            for (int j = 0; j < n; j++) c_row[j] += a_ip * b_row[j];
        }
    }
}

/* Dot product with 8 independent partial sums, which the compiler can keep in
 * one vector register (a single running sum would serialize the adds). */
static float dot(const float *x, const float *y, int len) {
    float part[8] = {0};
    int p = 0;
    for (; p + 8 <= len; p += 8)
        for (int l = 0; l < 8; l++) part[l] += x[p + l] * y[p + l];
    float sum = 0.0f;
    for (; p < len; p++) sum += x[p] * y[p];
    for (int l = 0; l < 8; l++) sum += part[l];
    return sum;
}

/* B transposed: op(B)[p][j] = B[j][p], so C[i][j] is a dot product of a row of
 * op(A) and a row of B. With A also transposed, op(A)[i][p] is strided. */
static void gemm_b_cols(int trans_a, int m, int n, int k, float alpha, const float *a, int lda,
                        const float *b, int ldb, float *c, int ldc) {
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            const float *b_row = b + (size_t)j * ldb;
            float sum;
            if (!trans_a) {
                sum = dot(a + (size_t)i * lda, b_row, k);
            } else {
                sum = 0.0f;
                for (int p = 0; p < k; p++) sum += a[(size_t)p * lda + i] * b_row[p];
            }
            c[(size_t)i * ldc + j] += alpha * sum;
        }
    }
}

void cpu_sgemm_loops(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                     int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    scale_rows(m, n, beta, c, ldc);
    if (alpha == 0.0f || k == 0) return;
    if (!trans_b)
        gemm_b_rows(trans_a, m, n, k, alpha, a, lda, b, ldb, c, ldc);
    else
        gemm_b_cols(trans_a, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

void cpu_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
               int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
#ifdef TRAINC_HAVE_CBLAS
    if (k > 0) {
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                    ldc);
        return;
    }
#endif
    cpu_sgemm_loops(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
