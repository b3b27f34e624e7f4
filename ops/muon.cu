/* muon_step_cpu's step in four stages, none of which waits for the host:
 * momentum (u into the scratch, with partial sums of u^2 and W^2), u scaled
 * to unit norm, ns_steps rounds of three cuBLAS products (batched over
 * consecutive matrices of one shape), then the weights' step. The partial
 * sums are over a fixed grid, added in a fixed order: the bits repeat. */
#include "ops/muon.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

#define MUON_THREADS 256

/* What the kernels need of the matrices, by value (a CUDA graph keeps it). */
typedef struct {
    size_t offset[MUON_MAX_MATRICES], x_off[MUON_MAX_MATRICES];
    int rows[MUON_MAX_MATRICES], cols[MUON_MAX_MATRICES];
} MuonKernelMats;

static MuonKernelMats kernel_mats(const MuonMatrices *mats, const MuonLayout *l) {
    MuonKernelMats k;
    for (int j = 0; j < mats->n; j++) {
        k.offset[j] = mats->mats[j].offset, k.x_off[j] = l->x_off[j];
        k.rows[j] = mats->mats[j].rows, k.cols[j] = mats->mats[j].cols;
    }
    return k;
}

/* The block's sum of v, in every thread. */
static __device__ double block_sum_all(double v) {
    __shared__ double warp_sums[MUON_THREADS / 32];
    __shared__ double total;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int w = 0; w < MUON_THREADS / 32; w++) s += warp_sums[w];
        total = s;
    }
    __syncthreads();
    return total;
}

/* The MUON_NORM_SLOTS partial sums of matrix j, added in order. */
static __device__ double slots_sum(const double *slots, int j) {
    __shared__ double total;
    if (threadIdx.x == 0) {
        double s = 0;
        for (int b = 0; b < MUON_NORM_SLOTS; b++) s += slots[(size_t)j * MUON_NORM_SLOTS + b];
        total = s;
    }
    __syncthreads();
    return total;
}

/* Grid (MUON_NORM_SLOTS, matrices): m and u as muon_step_cpu forms them,
 * each product rounded on its own as the CPU rounds it. */
template <typename TG>
static __global__ void __launch_bounds__(MUON_THREADS)
momentum_kernel(MuonKernelMats k, const TG *grad, float *momentum, const float *master, float *x, double *u_slots,
                double *w_slots, const LossScalerState *scaler, const float *grad_mult, float beta, int nesterov) {
    if (scaler && scaler->found_inf) return;
    int j = blockIdx.y;
    float inv_scale = scaler ? 1.0f / scaler->scale : 1.0f, mult = grad_mult ? *grad_mult : 1.0f;
    size_t n = (size_t)k.rows[j] * k.cols[j], off = k.offset[j];
    double u2 = 0, w2 = 0;
    for (size_t i = blockIdx.x * (size_t)MUON_THREADS + threadIdx.x; i < n; i += (size_t)MUON_NORM_SLOTS * MUON_THREADS) {
        float g = __fmul_rn(__fmul_rn(to_float(grad[off + i]), inv_scale), mult);
        float mom = __fadd_rn(__fmul_rn(beta, momentum[off + i]), g);
        momentum[off + i] = mom;
        float u = nesterov ? __fadd_rn(g, __fmul_rn(beta, mom)) : mom;
        x[k.x_off[j] + i] = u;
        float w = master[off + i];
        u2 += (double)u * u, w2 += (double)w * w;
    }
    u2 = block_sum_all(u2);
    w2 = block_sum_all(w2);
    if (threadIdx.x == 0) {
        u_slots[(size_t)j * MUON_NORM_SLOTS + blockIdx.x] = u2;
        w_slots[(size_t)j * MUON_NORM_SLOTS + blockIdx.x] = w2;
    }
}

/* x = u / (||u|| + eps), grid (MUON_NORM_SLOTS, matrices). */
static __global__ void __launch_bounds__(MUON_THREADS)
unit_norm_kernel(MuonKernelMats k, float *x, const double *u_slots, const LossScalerState *scaler) {
    if (scaler && scaler->found_inf) return;
    int j = blockIdx.y;
    float inv = 1.0f / ((float)sqrt(slots_sum(u_slots, j)) + MUON_EPS);
    size_t n = (size_t)k.rows[j] * k.cols[j];
    for (size_t i = blockIdx.x * (size_t)MUON_THREADS + threadIdx.x; i < n; i += (size_t)MUON_NORM_SLOTS * MUON_THREADS)
        x[k.x_off[j] + i] *= inv;
}

/* b = b_coef A over every matrix's k x k slot (the diagonal's a I and the c A A term come next). */
static __global__ void poly_start_kernel(const float *a, float *b, size_t floats) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < floats; i += (size_t)gridDim.x * blockDim.x)
        b[i] = MUON_NS_B * a[i];
}

/* The diagonals get + a: one thread per diagonal element of matrix blockIdx.y. */
static __global__ void poly_diagonal_kernel(float *b, MuonLayout l, MuonKernelMats k) {
    int j = blockIdx.y, kk = k.rows[j] < k.cols[j] ? k.rows[j] : k.cols[j];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kk; i += gridDim.x * blockDim.x)
        b[l.a_off[j] + (size_t)i * kk + i] += MUON_NS_A;
}

/* Grid (MUON_NORM_SLOTS, matrices): W = W * sqrt(rows) / ||W|| - lr * lr_mult * X, and its half copy. */
template <typename TW>
static __global__ void __launch_bounds__(MUON_THREADS)
apply_kernel(MuonKernelMats k, float *master, TW *weights_half, const float *x, const double *w_slots,
             const LossScalerState *scaler, const float *lr, float lr_mult, int normalize) {
    if (scaler && scaler->found_inf) return;
    int j = blockIdx.y;
    double w2 = slots_sum(w_slots, j);
    float w_scale = normalize && w2 > 0 ? (float)(sqrt((double)k.rows[j]) / sqrt(w2)) : 1.0f;
    float step = __fmul_rn(*lr, lr_mult);
    size_t n = (size_t)k.rows[j] * k.cols[j], off = k.offset[j];
    for (size_t i = blockIdx.x * (size_t)MUON_THREADS + threadIdx.x; i < n; i += (size_t)MUON_NORM_SLOTS * MUON_THREADS) {
        float w = __fsub_rn(__fmul_rn(master[off + i], w_scale), __fmul_rn(step, x[k.x_off[j] + i]));
        master[off + i] = w;
        if (weights_half) weights_half[off + i] = from_float<TW>(w);
    }
}

/* ---- the products ---------------------------------------------------------- */

static cublasComputeType_t fp32_compute(cublasHandle_t h) {
    cublasMath_t mode;
    CUBLAS_CHECK(cublasGetMathMode(h, &mode));
    return (mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) == CUBLAS_TF32_TENSOR_OP_MATH
               ? CUBLAS_COMPUTE_32F_FAST_TF32
               : CUBLAS_COMPUTE_32F_PEDANTIC;
}

/* Column-major C = alpha op(A) op(B) + beta C over count matrices strides apart. */
typedef struct {
    cublasHandle_t h;
    cublasComputeType_t compute;
} Gemm;

static void gemm_batched(const Gemm *g, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                         float alpha, const float *a, int lda, long long stride_a, const float *b, int ldb,
                         long long stride_b, float beta, float *c, int ldc, long long stride_c, int count) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(g->h, op_a, op_b, m, n, k, &alpha, a, CUDA_R_32F, lda, stride_a, b,
                                            CUDA_R_32F, ldb, stride_b, &beta, c, CUDA_R_32F, ldc, stride_c, count,
                                            g->compute, CUBLAS_GEMM_DEFAULT));
}

/* One round for the count matrices of one shape from matrix j on: the
 * row-major rows x cols iterate seen by cuBLAS (column-major) is X^T, cols x
 * rows, ld cols. Wide: A = X X^T = (X^T)^T X^T, and (B X)^T = X^T B. Tall
 * (the iteration on X^T): A = X^T X = X^T (X^T)^T, and (X B)^T = B X^T. */
static void round_gram(const Gemm *g, const MuonLayout *l, char *s, int j, int rows, int cols, int count) {
    long long sx = (long long)muon_pad64((size_t)rows * cols), k = rows < cols ? rows : cols;
    long long sa = (long long)muon_pad64((size_t)(k * k));
    const float *x = (const float *)(s + l->x) + l->x_off[j];
    float *a = (float *)(s + l->a) + l->a_off[j];
    if (rows <= cols) gemm_batched(g, CUBLAS_OP_T, CUBLAS_OP_N, rows, rows, cols, 1.0f, x, cols, sx, x, cols, sx, 0.0f, a, rows, sa, count);
    else gemm_batched(g, CUBLAS_OP_N, CUBLAS_OP_T, cols, cols, rows, 1.0f, x, cols, sx, x, cols, sx, 0.0f, a, cols, sa, count);
}

static void round_poly(const Gemm *g, const MuonLayout *l, char *s, int j, int rows, int cols, int count) {
    int k = rows < cols ? rows : cols;
    long long sa = (long long)muon_pad64((size_t)k * k);
    const float *a = (const float *)(s + l->a) + l->a_off[j];
    float *b = (float *)(s + l->b) + l->a_off[j];
    gemm_batched(g, CUBLAS_OP_N, CUBLAS_OP_N, k, k, k, MUON_NS_C, a, k, sa, a, k, sa, 1.0f, b, k, sa, count);
}

static void round_apply(const Gemm *g, const MuonLayout *l, char *s, int j, int rows, int cols, int count) {
    long long sx = (long long)muon_pad64((size_t)rows * cols);
    int k = rows < cols ? rows : cols;
    long long sa = (long long)muon_pad64((size_t)k * k);
    const float *x = (const float *)(s + l->x) + l->x_off[j], *b = (const float *)(s + l->b) + l->a_off[j];
    float *y = (float *)(s + l->y) + l->x_off[j];
    if (rows <= cols) gemm_batched(g, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, rows, 1.0f, x, cols, sx, b, rows, sa, 0.0f, y, cols, sx, count);
    else gemm_batched(g, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, cols, 1.0f, b, cols, sa, x, cols, sx, 0.0f, y, cols, sx, count);
}

typedef void (*RoundStage)(const Gemm *, const MuonLayout *, char *, int, int, int, int);

/* A stage for every run of consecutive matrices of one shape. */
static void each_shape_run(const Gemm *g, const MuonMatrices *mats, const MuonLayout *l, char *s, RoundStage stage) {
    for (int j = 0; j < mats->n;) {
        int rows = mats->mats[j].rows, cols = mats->mats[j].cols, count = 1;
        while (j + count < mats->n && mats->mats[j + count].rows == rows && mats->mats[j + count].cols == cols) count++;
        stage(g, l, s, j, rows, cols, count);
        j += count;
    }
}

/* One Newton-Schulz round over every matrix: A, B = a I + b A + c A A, then
 * Y = B X (or X B); the caller swaps x and y. */
static void ns_round(const Gemm *g, const MuonMatrices *mats, const MuonLayout *l, const MuonKernelMats *k, char *s,
                     cudaStream_t stream) {
    each_shape_run(g, mats, l, s, round_gram);
    size_t a_floats = (l->b - l->a) / sizeof(float);
    poly_start_kernel<<<grid_stride_blocks(a_floats, MUON_THREADS, 1024), MUON_THREADS, 0, stream>>>(
        (const float *)(s + l->a), (float *)(s + l->b), a_floats);
    CUDA_CHECK_LAUNCH();
    poly_diagonal_kernel<<<dim3(1, mats->n), MUON_THREADS, 0, stream>>>((float *)(s + l->b), *l, *k);
    CUDA_CHECK_LAUNCH();
    each_shape_run(g, mats, l, s, round_poly);
    each_shape_run(g, mats, l, s, round_apply);
}

template <typename TG>
static void launch_momentum(const void *grad, const MuonKernelMats *k, int n_mats, float *momentum,
                            const float *master, float *x, double *u_slots, double *w_slots,
                            const LossScalerState *scaler, const MuonParams *p, cudaStream_t stream) {
    momentum_kernel<TG><<<dim3(MUON_NORM_SLOTS, n_mats), MUON_THREADS, 0, stream>>>(
        *k, (const TG *)grad, momentum, master, x, u_slots, w_slots, scaler, p->grad_mult, p->momentum, p->nesterov);
    CUDA_CHECK_LAUNCH();
}

template <typename TW>
static void launch_apply(const MuonKernelMats *k, int n_mats, float *master, void *weights_half, const float *x,
                         const double *w_slots, const LossScalerState *scaler, const float *lr, const MuonParams *p,
                         cudaStream_t stream) {
    apply_kernel<TW><<<dim3(MUON_NORM_SLOTS, n_mats), MUON_THREADS, 0, stream>>>(
        *k, master, (TW *)weights_half, x, w_slots, scaler, lr, p->lr_mult, p->normalize_weights);
    CUDA_CHECK_LAUNCH();
}

void muon_step_cuda(cublasHandle_t cublas, const MuonMatrices *mats, float *master, const void *grad,
                    DType grad_dtype, float *momentum, void *weights_half, DType weights_dtype,
                    const float *lr_device, const LossScalerState *scaler_dev, MuonParams p, void *scratch,
                    cudaStream_t stream) {
    check_float_dtype("muon_step (gradients)", grad_dtype);
    if (weights_half && weights_dtype != DTYPE_F16 && weights_dtype != DTYPE_BF16)
        TC_FATAL("muon_step: the weights' half copy must be f16 or bf16, not %s", dtype_name(weights_dtype));
    if (mats->n == 0) return;
    MuonLayout l = muon_layout_of(mats);
    MuonKernelMats k = kernel_mats(mats, &l);
    char *s = (char *)scratch;
    double *u_slots = (double *)(s + l.norms), *w_slots = u_slots + (size_t)MUON_NORM_SLOTS * mats->n;
    DISPATCH_FLOAT_DTYPE(grad_dtype, launch_momentum, grad, &k, mats->n, momentum, master, (float *)(s + l.x), u_slots,
                         w_slots, scaler_dev, &p, stream);
    unit_norm_kernel<<<dim3(MUON_NORM_SLOTS, mats->n), MUON_THREADS, 0, stream>>>(k, (float *)(s + l.x), u_slots,
                                                                                 scaler_dev);
    CUDA_CHECK_LAUNCH();
    Gemm g = {cublas, fp32_compute(cublas)};
    for (int r = 0; r < p.ns_steps; r++) {
        ns_round(&g, mats, &l, &k, s, stream);
        size_t swap = l.x;
        l.x = l.y, l.y = swap;
    }
    const float *x = (const float *)(s + l.x);
    if (!weights_half) launch_apply<float>(&k, mats->n, master, NULL, x, w_slots, scaler_dev, lr_device, &p, stream);
    else if (weights_dtype == DTYPE_BF16)
        launch_apply<__nv_bfloat16>(&k, mats->n, master, weights_half, x, w_slots, scaler_dev, lr_device, &p, stream);
    else launch_apply<__half>(&k, mats->n, master, weights_half, x, w_slots, scaler_dev, lr_device, &p, stream);
}
