/* Linear layer on cuBLAS. cuBLAS is column-major; a row-major [rows][cols]
 * matrix is the column-major cols x rows matrix, i.e. its transpose. So with
 * X = x^T (in x n), W = w^T (in x out), Y = y^T (out x n), all column-major:
 *   y = x w^T    ->  Y  = W^T X       gemm(T, N, out, n, in)
 *   dx = dy w    ->  dX = W dY        gemm(N, N, in, n, out)
 *   dw += dy^T x ->  dW += X dY^T     gemm(N, T, in, out, n), beta 1 */
#include "ops/linear.h"

#include "ops/cuda_launch.h"
#include "runtime/check.h"

/* Column-major C = alpha op(A) op(B) + beta C in fp32: full fp32 (the pedantic
 * compute type) unless the caller put the handle in CUBLAS_TF32_TENSOR_OP_MATH. */
static void sgemm_fp32(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m,
                       int n, int k, float alpha, const float *a, int lda, const float *b,
                       int ldb, float beta, float *c, int ldc) {
    cublasMath_t mode;
    CUBLAS_CHECK(cublasGetMathMode(h, &mode));
    cublasComputeType_t compute = (mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) == CUBLAS_TF32_TENSOR_OP_MATH
                                      ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                      : CUBLAS_COMPUTE_32F_PEDANTIC;
    CUBLAS_CHECK(cublasGemmEx(h, op_a, op_b, m, n, k, &alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F,
                              ldb, &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
}

static __global__ void add_bias_kernel(float *y, const float *b, size_t rows, int cols) {
    size_t total = rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += b[i % cols];
}

/* db[j] += sum_i dy[i][j], deterministically: a block covers 32 columns; its
 * 8 thread rows each sum every 8th row of dy in a fixed order (reads coalesce
 * along the columns), then one thread per column adds the 8 partial sums in order. */
#define BIAS_GRAD_COLS 32
#define BIAS_GRAD_ROWS 8

static __global__ void bias_grad_kernel(const float *dy, float *db, int rows, int cols) {
    __shared__ float partial[BIAS_GRAD_ROWS][BIAS_GRAD_COLS + 1];
    int col = blockIdx.x * BIAS_GRAD_COLS + threadIdx.x;
    float sum = 0.0f;
    if (col < cols)
        for (int row = threadIdx.y; row < rows; row += BIAS_GRAD_ROWS)
            sum += dy[(size_t)row * cols + col];
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float total = 0.0f;
        for (int r = 0; r < BIAS_GRAD_ROWS; r++) total += partial[r][threadIdx.x];
        db[col] += total;
    }
}

void linear_forward_cuda(cublasHandle_t h, cudaStream_t stream, const LinearShape *s,
                         const float *x, const float *w, const float *b, float *y) {
    if (s->n <= 0 || s->out <= 0) return;
    sgemm_fp32(h, CUBLAS_OP_T, CUBLAS_OP_N, s->out, s->n, s->in, 1.0f, w, s->in, x, s->in, 0.0f,
               y, s->out);
    size_t total = (size_t)s->n * s->out;
    add_bias_kernel<<<elementwise_blocks(total), ELEMENTWISE_THREADS, 0, stream>>>(y, b, s->n,
                                                                                   s->out);
    CUDA_CHECK_LAUNCH();
}

void linear_backward_cuda(cublasHandle_t h, cudaStream_t stream, const LinearShape *s,
                          const float *x, const float *w, const float *dy, float *dx, float *dw,
                          float *db) {
    if (s->n <= 0 || s->out <= 0 || s->in <= 0) return;
    if (dx)
        sgemm_fp32(h, CUBLAS_OP_N, CUBLAS_OP_N, s->in, s->n, s->out, 1.0f, w, s->in, dy, s->out,
                   0.0f, dx, s->in);
    sgemm_fp32(h, CUBLAS_OP_N, CUBLAS_OP_T, s->in, s->out, s->n, 1.0f, x, s->in, dy, s->out, 1.0f,
               dw, s->in);
    dim3 block(BIAS_GRAD_COLS, BIAS_GRAD_ROWS);
    unsigned blocks = (unsigned)((s->out + BIAS_GRAD_COLS - 1) / BIAS_GRAD_COLS);
    bias_grad_kernel<<<blocks, block, 0, stream>>>(dy, db, s->n, s->out);
    CUDA_CHECK_LAUNCH();
}
