/* Linear layer on cuBLAS. cuBLAS is column-major; a row-major [rows][cols]
 * matrix is the column-major cols x rows matrix, i.e. its transpose. So with
 * X = x^T (in x n), W = w^T (in x out), Y = y^T (out x n), all column-major:
 *   y = x w^T    ->  Y  = W^T X       gemm(T, N, out, n, in)
 *   dx = dy w    ->  dX = W dY        gemm(N, N, in, n, out)
 *   dw += dy^T x ->  dW += X dY^T     gemm(N, T, in, out, n), beta 1
 * f16 and bf16 matrices multiply with fp32 accumulation (CUBLAS_COMPUTE_32F,
 * tensor cores allowed), and C = alpha AB + beta C is formed in fp32 and
 * rounded once, so an accumulated dw keeps its fp32 sum until the store. */
#include "ops/linear.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* Column-major C = alpha op(A) op(B) + beta C in fp32: full fp32 (the pedantic
 * compute type) unless the caller put the handle in CUBLAS_TF32_TENSOR_OP_MATH. */
static void sgemm_fp32(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m,
                       int n, int k, float alpha, const void *a, int lda, const void *b,
                       int ldb, float beta, void *c, int ldc) {
    cublasComputeType_t compute = gpu_fp32_gemm_compute(h);
    CUBLAS_CHECK(cublasGemmEx(h, op_a, op_b, m, n, k, &alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F,
                              ldb, &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
}

/* f16 or bf16 matrices, fp32 compute: scaling factors are floats. */
static void gemm_half(cublasHandle_t h, cudaDataType_t type, cublasOperation_t op_a,
                      cublasOperation_t op_b, int m, int n, int k, float alpha, const void *a,
                      int lda, const void *b, int ldb, float beta, void *c, int ldc) {
    CUBLAS_CHECK(cublasGemmEx(h, op_a, op_b, m, n, k, &alpha, a, type, lda, b, type, ldb, &beta,
                              c, type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void gemm(cublasHandle_t h, DType dtype, cublasOperation_t op_a, cublasOperation_t op_b,
                 int m, int n, int k, float alpha, const void *a, int lda, const void *b, int ldb,
                 float beta, void *c, int ldc) {
    if (dtype == DTYPE_F32)
        sgemm_fp32(h, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        gemm_half(h, dtype_cuda(dtype), op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
static __global__ void add_bias_kernel(T *y, const T *b, size_t rows, int cols) {
    size_t total = rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = from_float<T>(to_float(y[i]) + to_float(b[i % cols]));
}

/* db[j] += sum_i dy[i][j], deterministically: a block covers 32 columns; its
 * 8 thread rows each sum every 8th row of dy in a fixed order (reads coalesce
 * along the columns), then one thread per column adds the 8 partial sums in order. */
#define BIAS_GRAD_COLS 32
#define BIAS_GRAD_ROWS 8

template <typename T>
static __global__ void bias_grad_kernel(const T *dy, T *db, int rows, int cols) {
    __shared__ float partial[BIAS_GRAD_ROWS][BIAS_GRAD_COLS + 1];
    int col = blockIdx.x * BIAS_GRAD_COLS + threadIdx.x;
    float sum = 0.0f;
    if (col < cols)
        for (int row = threadIdx.y; row < rows; row += BIAS_GRAD_ROWS)
            sum += to_float(dy[(size_t)row * cols + col]);
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float total = 0.0f;
        for (int r = 0; r < BIAS_GRAD_ROWS; r++) total += partial[r][threadIdx.x];
        db[col] = from_float<T>(to_float(db[col]) + total);
    }
}

template <typename T>
static void launch_add_bias(const LinearShape *s, const void *b, void *y, cudaStream_t stream) {
    size_t total = (size_t)s->n * s->out;
    add_bias_kernel<T><<<elementwise_blocks(total), ELEMENTWISE_THREADS, 0, stream>>>(
        (T *)y, (const T *)b, s->n, s->out);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_bias_grad(const LinearShape *s, const void *dy, void *db, cudaStream_t stream) {
    dim3 block(BIAS_GRAD_COLS, BIAS_GRAD_ROWS);
    unsigned blocks = (unsigned)((s->out + BIAS_GRAD_COLS - 1) / BIAS_GRAD_COLS);
    bias_grad_kernel<T><<<blocks, block, 0, stream>>>((const T *)dy, (T *)db, s->n, s->out);
    CUDA_CHECK_LAUNCH();
}

void linear_forward_cuda(cublasHandle_t h, cudaStream_t stream, const LinearShape *s,
                         DType dtype, const void *x, const void *w, const void *b, void *y) {
    check_float_dtype("linear", dtype);
    if (s->n <= 0 || s->out <= 0) return;
    gemm(h, dtype, CUBLAS_OP_T, CUBLAS_OP_N, s->out, s->n, s->in, 1.0f, w, s->in, x, s->in, 0.0f,
         y, s->out);
    if (b) DISPATCH_FLOAT_DTYPE(dtype, launch_add_bias, s, b, y, stream);
}

void linear_backward_cuda(cublasHandle_t h, cudaStream_t stream, const LinearShape *s,
                          DType dtype, const void *x, const void *w, const void *dy, void *dx,
                          void *dw, void *db) {
    check_float_dtype("linear", dtype);
    if (s->n <= 0 || s->out <= 0 || s->in <= 0) return;
    if (dx)
        gemm(h, dtype, CUBLAS_OP_N, CUBLAS_OP_N, s->in, s->n, s->out, 1.0f, w, s->in, dy, s->out,
             0.0f, dx, s->in);
    gemm(h, dtype, CUBLAS_OP_N, CUBLAS_OP_T, s->in, s->out, s->n, 1.0f, x, s->in, dy, s->out, 1.0f,
         dw, s->in);
    if (db) DISPATCH_FLOAT_DTYPE(dtype, launch_bias_grad, s, dy, db, stream);
}
