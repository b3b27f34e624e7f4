/* Row-major single-precision GEMM for the CPU reference ops:
 *   C[m][n] = alpha * op(A)[m][k] * op(B)[k][n] + beta * C[m][n]
 * op(A) is A ([m][k], row stride lda) or, with trans_a, A^T where A is [k][m].
 * op(B) is B ([k][n], row stride ldb) or, with trans_b, B^T where B is [n][k].
 * With beta == 0, C is overwritten and its old contents (even NaN) are not read. */
#ifndef TRAINC_OPS_GEMM_CPU_H
#define TRAINC_OPS_GEMM_CPU_H

#ifdef __cplusplus
extern "C" {
#endif

/* cblas_sgemm when built with a CBLAS (TRAINC_HAVE_CBLAS), else cpu_sgemm_loops. */
void cpu_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
               int lda, const float *b, int ldb, float beta, float *c, int ldc);
/* The threads cpu_sgemm uses: OpenBLAS's (OPENBLAS_NUM_THREADS or its
 * default), 1 with another CBLAS or the loops. */
int cpu_sgemm_threads(void);
/* The plain-loop version, always built, so tests can check it beside the BLAS one. */
void cpu_sgemm_loops(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                     int lda, const float *b, int ldb, float beta, float *c, int ldc);

#ifdef __cplusplus
}
#endif
#endif
