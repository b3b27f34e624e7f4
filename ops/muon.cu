/* muon_step_cpu's step in four stages, none of which waits for the host:
 * momentum (u into the scratch, with partial sums of u^2 and W^2), u scaled
 * to unit norm, ns_steps rounds of three grouped cuBLAS products (each over
 * every matrix, one call) and one small kernel, then the weights' step. The
 * partial sums are over a grid fixed by the shapes, added in a fixed order:
 * the bits repeat. */
#include "ops/muon.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

#if CUBLAS_VERSION < 120500
#error "ops/muon.cu needs cuBLAS 12.5 or later (CUDA 12.5+) for cublasGemmGroupedBatchedEx"
#endif

#define MUON_THREADS 256
/* A matrix's partial sums: one per MUON_SLOT_FLOATS elements, at most
 * MUON_NORM_SLOTS. Fixed by its size, so the sums' order is too; a small
 * matrix gets a few busy blocks rather than many idle ones. */
#define MUON_SLOT_FLOATS 2048

/* What the kernels need of the matrices, by value (a CUDA graph keeps it).
 * The elementwise kernels run one block per slot, matrix j's slots from
 * first_slot[j] to first_slot[j + 1]; the norms' partial sums lie in that order. */
typedef struct {
    size_t offset[MUON_MAX_MATRICES], x_off[MUON_MAX_MATRICES], a_off[MUON_MAX_MATRICES];
    int rows[MUON_MAX_MATRICES], cols[MUON_MAX_MATRICES], splits[MUON_MAX_MATRICES];
    int first_slot[MUON_MAX_MATRICES + 1];
    int n;
} MuonKernelMats;

static int norm_slots(size_t floats) {
    size_t slots = (floats + MUON_SLOT_FLOATS - 1) / MUON_SLOT_FLOATS;
    return slots > MUON_NORM_SLOTS ? MUON_NORM_SLOTS : (int)slots;
}

static MuonKernelMats kernel_mats(const MuonMatrices *mats, const MuonLayout *l) {
    MuonKernelMats k;
    k.n = mats->n, k.first_slot[0] = 0;
    for (int j = 0; j < mats->n; j++) {
        k.offset[j] = mats->mats[j].offset, k.x_off[j] = l->x_off[j], k.a_off[j] = l->a_off[j];
        k.rows[j] = mats->mats[j].rows, k.cols[j] = mats->mats[j].cols, k.splits[j] = l->splits[j];
        k.first_slot[j + 1] = k.first_slot[j] + norm_slots((size_t)k.rows[j] * k.cols[j]);
    }
    return k;
}

/* The matrix whose slot this block is. */
static __device__ int block_matrix(const MuonKernelMats &k) {
    int j = 0;
    while (k.first_slot[j + 1] <= (int)blockIdx.x) j++;
    return j;
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

/* The partial sums of matrix j, added in order. */
static __device__ double slots_sum(const double *slots, const MuonKernelMats &k, int j) {
    __shared__ double total;
    if (threadIdx.x == 0) {
        double s = 0;
        for (int b = k.first_slot[j]; b < k.first_slot[j + 1]; b++) s += slots[b];
        total = s;
    }
    __syncthreads();
    return total;
}

/* The elements of matrix j that this thread covers: first, first + stride, ... */
typedef struct {
    size_t first, stride;
} SlotLoop;

static __device__ SlotLoop slot_loop(const MuonKernelMats &k, int j) {
    size_t slot = blockIdx.x - k.first_slot[j], slots = k.first_slot[j + 1] - k.first_slot[j];
    return {slot * MUON_THREADS + threadIdx.x, slots * MUON_THREADS};
}

/* One block per slot: m and u as muon_step_cpu forms them, each product
 * rounded on its own as the CPU rounds it. */
template <typename TG>
static __global__ void __launch_bounds__(MUON_THREADS)
momentum_kernel(MuonKernelMats k, const TG *grad, float *momentum, const float *master, float *x, double *u_slots,
                double *w_slots, const LossScalerState *scaler, const float *grad_mult, float beta, int nesterov) {
    if (scaler && scaler->found_inf) return;
    int j = block_matrix(k);
    float inv_scale = scaler ? 1.0f / scaler->scale : 1.0f, mult = grad_mult ? *grad_mult : 1.0f;
    size_t n = (size_t)k.rows[j] * k.cols[j], off = k.offset[j];
    double u2 = 0, w2 = 0;
    SlotLoop e = slot_loop(k, j);
    for (size_t i = e.first; i < n; i += e.stride) {
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
    if (threadIdx.x == 0) u_slots[blockIdx.x] = u2, w_slots[blockIdx.x] = w2;
}

/* x = u / (||u|| + eps), one block per slot. */
static __global__ void __launch_bounds__(MUON_THREADS)
unit_norm_kernel(MuonKernelMats k, float *x, const double *u_slots, const LossScalerState *scaler) {
    if (scaler && scaler->found_inf) return;
    int j = block_matrix(k);
    float inv = 1.0f / ((float)sqrt(slots_sum(u_slots, k, j)) + MUON_EPS);
    size_t n = (size_t)k.rows[j] * k.cols[j];
    SlotLoop e = slot_loop(k, j);
    for (size_t i = e.first; i < n; i += e.stride) x[k.x_off[j] + i] *= inv;
}

/* Blocks per matrix for poly_kernel: enough for the largest k x k, at most 32. */
static unsigned poly_blocks(const MuonKernelMats *k) {
    size_t most = 0;
    for (int j = 0; j < k->n; j++) {
        size_t kk = (size_t)(k->rows[j] < k->cols[j] ? k->rows[j] : k->cols[j]);
        if (kk * kk > most) most = kk * kk;
    }
    return grid_stride_blocks(most, MUON_THREADS, 32);
}

/* On matrix blockIdx.y's k x k slots: A = the sum of the Gram product's
 * parts, in their order, into the first part's place, and b = b_coef A +
 * a_coef I (rounded as poly_cpu rounds it); the c A A term comes next, from
 * cuBLAS. */
static __global__ void __launch_bounds__(MUON_THREADS) poly_kernel(MuonKernelMats k, float *a, float *b) {
    int j = blockIdx.y, kk = k.rows[j] < k.cols[j] ? k.rows[j] : k.cols[j];
    size_t n = (size_t)kk * kk, part = muon_pad64(n);
    float *aj = a + k.a_off[j];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float sum = aj[i];
        for (int s = 1; s < k.splits[j]; s++) sum = __fadd_rn(sum, aj[s * part + i]);
        if (k.splits[j] > 1) aj[i] = sum;
        b[k.a_off[j] + i] = __fadd_rn(__fmul_rn(MUON_NS_B, sum), i / kk == i % kk ? MUON_NS_A : 0.0f);
    }
}

/* One block per slot: W = W * sqrt(rows) / ||W|| - lr * lr_mult * X, and its half copy. */
template <typename TW>
static __global__ void __launch_bounds__(MUON_THREADS)
apply_kernel(MuonKernelMats k, float *master, TW *weights_half, const float *x, const double *w_slots,
             const LossScalerState *scaler, const float *lr, float lr_mult, int normalize) {
    if (scaler && scaler->found_inf) return;
    int j = block_matrix(k);
    double w2 = slots_sum(w_slots, k, j);
    float w_scale = normalize && w2 > 0 ? (float)(sqrt((double)k.rows[j]) / sqrt(w2)) : 1.0f;
    float step = __fmul_rn(*lr, lr_mult);
    size_t n = (size_t)k.rows[j] * k.cols[j], off = k.offset[j];
    SlotLoop e = slot_loop(k, j);
    for (size_t i = e.first; i < n; i += e.stride) {
        float w = __fsub_rn(__fmul_rn(master[off + i], w_scale), __fmul_rn(step, x[k.x_off[j] + i]));
        master[off + i] = w;
        if (weights_half) weights_half[off + i] = from_float<TW>(w);
    }
}

/* ---- the products ---------------------------------------------------------- */

/* The grouped products' problems: the matrices by shape, group i holding
 * size[i] matrices of rows[i] x cols[i]; entry p of every pointer table is
 * matrix order[p]. */
typedef struct {
    int count, size[MUON_MAX_MATRICES], rows[MUON_MAX_MATRICES], cols[MUON_MAX_MATRICES];
    int splits[MUON_MAX_MATRICES]; /* the Gram product's parts of each (one shape, one split) */
    int order[MUON_MAX_MATRICES];
} MuonGroups;

static MuonGroups shape_groups(const MuonMatrices *mats, const MuonLayout *l) {
    MuonGroups g;
    int taken[MUON_MAX_MATRICES] = {0}, p = 0;
    g.count = 0;
    for (int j = 0; j < mats->n; j++) {
        if (taken[j]) continue;
        int rows = mats->mats[j].rows, cols = mats->mats[j].cols, i = g.count++;
        g.rows[i] = rows, g.cols[i] = cols, g.size[i] = 0, g.splits[i] = l->splits[j];
        for (int o = j; o < mats->n; o++)
            if (!taken[o] && mats->mats[o].rows == rows && mats->mats[o].cols == cols)
                taken[o] = 1, g.order[p++] = o, g.size[i]++;
    }
    return g;
}

/* The pointer tables (MuonLayout's ptrs): each stage's A, B and C arrays.
 * A round reads x and writes y or the other way round, so the Gram product
 * and the product with B have a table for each. The Gram's two come first,
 * gram_parts long (a matrix's parts side by side), then the others, n long. */
enum { TABLE_GRAM_X, TABLE_GRAM_Y, TABLE_POLY, TABLE_APPLY_X_TO_Y, TABLE_APPLY_Y_TO_X, STAGE_TABLES };
static_assert(STAGE_TABLES * 3 == MUON_POINTER_TABLES, "muon.h's MUON_POINTER_TABLES: an A, B and C table per stage");

/* Table t's first array (of its A, B, C) in ptrs. */
static size_t table_start(int t, int n, int parts) {
    return t < TABLE_POLY ? (size_t)t * 3 * parts : 2 * 3 * (size_t)parts + (size_t)(t - TABLE_POLY) * 3 * n;
}

typedef struct {
    size_t x_off[MUON_MAX_MATRICES], a_off[MUON_MAX_MATRICES];
    int wide[MUON_MAX_MATRICES], splits[MUON_MAX_MATRICES];
    size_t x_part[MUON_MAX_MATRICES], a_part[MUON_MAX_MATRICES]; /* floats from one Gram part to the next */
    int n, parts;
} MuonProblems;

static MuonProblems problems_of(const MuonMatrices *mats, const MuonLayout *l, const MuonGroups *g) {
    MuonProblems q;
    q.n = mats->n, q.parts = l->gram_parts;
    for (int p = 0; p < mats->n; p++) {
        int j = g->order[p], rows = mats->mats[j].rows, cols = mats->mats[j].cols, k = rows < cols ? rows : cols;
        int long_side = rows < cols ? cols : rows;
        q.x_off[p] = l->x_off[j], q.a_off[p] = l->a_off[j];
        q.wide[p] = rows <= cols, q.splits[p] = l->splits[j];
        /* Wide: a part is a run of columns; tall: a run of rows (cols floats each). */
        size_t part = (size_t)(long_side / l->splits[j]);
        q.x_part[p] = rows <= cols ? part : part * cols;
        q.a_part[p] = muon_pad64((size_t)k * k);
    }
    return q;
}

/* The operands as the stages' shapes below take them; one thread per
 * matrix, which also writes its Gram parts' entries. */
static __global__ void pointer_tables_kernel(MuonProblems q, float *x, float *y, float *a, float *b, void **tables) {
    for (int p = threadIdx.x; p < q.n; p += blockDim.x) {
        int first_part = 0;
        for (int o = 0; o < p; o++) first_part += q.splits[o];
        for (int s = 0; s < q.splits[p]; s++) {
            float *xs = x + q.x_off[p] + s * q.x_part[p], *ys = y + q.x_off[p] + s * q.x_part[p];
            float *as = a + q.a_off[p] + s * q.a_part[p];
            float *gram[2][3] = {{xs, xs, as}, {ys, ys, as}};
            for (int t = TABLE_GRAM_X; t <= TABLE_GRAM_Y; t++)
                for (int o = 0; o < 3; o++) tables[(size_t)t * 3 * q.parts + (size_t)o * q.parts + first_part + s] = gram[t][o];
        }
        float *xp = x + q.x_off[p], *yp = y + q.x_off[p], *ap = a + q.a_off[p], *bp = b + q.a_off[p];
        int wide = q.wide[p];
        float *operands[3][3] = {{ap, ap, bp},
                                 {wide ? xp : bp, wide ? bp : xp, yp},
                                 {wide ? yp : bp, wide ? bp : yp, xp}};
        size_t rest = 2 * 3 * (size_t)q.parts;
        for (int t = 0; t < 3; t++)
            for (int o = 0; o < 3; o++) tables[rest + (size_t)(t * 3 + o) * q.n + p] = operands[t][o];
    }
}

/* Column-major C = alpha op(A) op(B) + beta C for one group. */
typedef struct {
    cublasOperation_t op_a, op_b;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
} GemmShape;

/* The products of a round for a rows x cols matrix: the row-major iterate
 * seen by cuBLAS (column-major) is X^T, cols x rows, ld cols. Wide: A = X X^T
 * = (X^T)^T X^T, and (B X)^T = X^T B. Tall (the iteration on X^T): A = X^T X
 * = X^T (X^T)^T, and (X B)^T = B X^T. B = a I + b A + c A A: the product
 * adds c A A to the b A + a I that poly_kernel leaves in it. */
static GemmShape gram_shape(int rows, int cols, int splits) {
    if (rows <= cols) return {CUBLAS_OP_T, CUBLAS_OP_N, rows, rows, cols / splits, cols, cols, rows, 1.0f, 0.0f};
    return {CUBLAS_OP_N, CUBLAS_OP_T, cols, cols, rows / splits, cols, cols, cols, 1.0f, 0.0f};
}

static GemmShape poly_shape(int rows, int cols, int splits) {
    (void)splits;
    int k = rows < cols ? rows : cols;
    return {CUBLAS_OP_N, CUBLAS_OP_N, k, k, k, k, k, k, MUON_NS_C, 1.0f};
}

static GemmShape apply_shape(int rows, int cols, int splits) {
    (void)splits;
    if (rows <= cols) return {CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, rows, cols, rows, cols, 1.0f, 0.0f};
    return {CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, cols, cols, cols, cols, 1.0f, 0.0f};
}

/* One stage's per-group arguments, host arrays as cublasGemmGroupedBatchedEx takes them. */
typedef struct {
    cublasOperation_t op_a[MUON_MAX_MATRICES], op_b[MUON_MAX_MATRICES];
    int m[MUON_MAX_MATRICES], n[MUON_MAX_MATRICES], k[MUON_MAX_MATRICES];
    int lda[MUON_MAX_MATRICES], ldb[MUON_MAX_MATRICES], ldc[MUON_MAX_MATRICES];
    float alpha[MUON_MAX_MATRICES], beta[MUON_MAX_MATRICES];
    int size[MUON_MAX_MATRICES]; /* products per group */
    int table_length;
} GroupedStage;

/* A stage's groups; the Gram product's (gram) has each matrix's parts. */
static void stage_of(const MuonGroups *g, GemmShape (*shape)(int, int, int), int gram, int n, int parts,
                     GroupedStage *st) {
    st->table_length = gram ? parts : n;
    for (int i = 0; i < g->count; i++) {
        int splits = gram ? g->splits[i] : 1;
        GemmShape s = shape(g->rows[i], g->cols[i], splits);
        st->size[i] = g->size[i] * splits;
        st->op_a[i] = s.op_a, st->op_b[i] = s.op_b, st->m[i] = s.m, st->n[i] = s.n, st->k[i] = s.k;
        st->lda[i] = s.lda, st->ldb[i] = s.ldb, st->ldc[i] = s.ldc, st->alpha[i] = s.alpha, st->beta[i] = s.beta;
    }
}

typedef struct {
    cublasHandle_t h;
    cublasComputeType_t compute;
    MuonGroups groups;
    GroupedStage gram, poly, apply;
    void **tables; /* device */
    int n, parts;  /* matrices and Gram parts: the tables' lengths */
} Products;

/* One cuBLAS call for a stage of every matrix, operands from pointer table t. */
static void grouped_gemm(const Products *pr, const GroupedStage *st, int t) {
    void **a = pr->tables + table_start(t, pr->n, pr->parts), **b = a + st->table_length, **c = b + st->table_length;
    CUBLAS_CHECK(cublasGemmGroupedBatchedEx(pr->h, st->op_a, st->op_b, st->m, st->n, st->k, st->alpha,
                                            (const void *const *)a, CUDA_R_32F, st->lda, (const void *const *)b,
                                            CUDA_R_32F, st->ldb, st->beta, c, CUDA_R_32F, st->ldc, pr->groups.count,
                                            st->size, pr->compute));
}

/* Round r of the Newton-Schulz iteration over every matrix: A, B = a I + b A
 * + c A A, then Y = B X (or X B). Even rounds read x and write y, odd ones the
 * other way round. */
static void ns_round(const Products *pr, const MuonLayout *l, const MuonKernelMats *k, char *s, int r,
                     cudaStream_t stream) {
    grouped_gemm(pr, &pr->gram, r % 2 ? TABLE_GRAM_Y : TABLE_GRAM_X);
    poly_kernel<<<dim3(poly_blocks(k), pr->n), MUON_THREADS, 0, stream>>>(*k, (float *)(s + l->a),
                                                                         (float *)(s + l->b));
    CUDA_CHECK_LAUNCH();
    grouped_gemm(pr, &pr->poly, TABLE_POLY);
    grouped_gemm(pr, &pr->apply, r % 2 ? TABLE_APPLY_Y_TO_X : TABLE_APPLY_X_TO_Y);
}

static Products products_of(cublasHandle_t h, const MuonMatrices *mats, const MuonLayout *l, char *s,
                            cudaStream_t stream) {
    Products pr;
    pr.h = h, pr.compute = gpu_fp32_gemm_compute(h), pr.groups = shape_groups(mats, l);
    pr.tables = (void **)(s + l->ptrs), pr.n = mats->n, pr.parts = l->gram_parts;
    stage_of(&pr.groups, gram_shape, 1, pr.n, pr.parts, &pr.gram);
    stage_of(&pr.groups, poly_shape, 0, pr.n, pr.parts, &pr.poly);
    stage_of(&pr.groups, apply_shape, 0, pr.n, pr.parts, &pr.apply);
    pointer_tables_kernel<<<1, MUON_MAX_MATRICES, 0, stream>>>(problems_of(mats, l, &pr.groups), (float *)(s + l->x),
                                                               (float *)(s + l->y), (float *)(s + l->a),
                                                               (float *)(s + l->b), pr.tables);
    CUDA_CHECK_LAUNCH();
    return pr;
}

template <typename TG>
static void launch_momentum(const void *grad, const MuonKernelMats *k, float *momentum, const float *master, float *x,
                            double *u_slots, double *w_slots, const LossScalerState *scaler, const MuonParams *p,
                            cudaStream_t stream) {
    momentum_kernel<TG><<<k->first_slot[k->n], MUON_THREADS, 0, stream>>>(
        *k, (const TG *)grad, momentum, master, x, u_slots, w_slots, scaler, p->grad_mult, p->momentum, p->nesterov);
    CUDA_CHECK_LAUNCH();
}

template <typename TW>
static void launch_apply(const MuonKernelMats *k, float *master, void *weights_half, const float *x,
                         const double *w_slots, const LossScalerState *scaler, const float *lr, const MuonParams *p,
                         cudaStream_t stream) {
    apply_kernel<TW><<<k->first_slot[k->n], MUON_THREADS, 0, stream>>>(
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
    float *x = (float *)(s + l.x);
    double *u_slots = (double *)(s + l.norms), *w_slots = u_slots + (size_t)MUON_NORM_SLOTS * mats->n;
    Products pr = products_of(cublas, mats, &l, s, stream);
    DISPATCH_FLOAT_DTYPE(grad_dtype, launch_momentum, grad, &k, momentum, master, x, u_slots, w_slots, scaler_dev, &p,
                         stream);
    unit_norm_kernel<<<k.first_slot[k.n], MUON_THREADS, 0, stream>>>(k, x, u_slots, scaler_dev);
    CUDA_CHECK_LAUNCH();
    for (int r = 0; r < p.ns_steps; r++) ns_round(&pr, &l, &k, s, r, stream);
    const float *result = p.ns_steps % 2 ? (const float *)(s + l.y) : x;
    if (!weights_half) launch_apply<float>(&k, master, NULL, result, w_slots, scaler_dev, lr_device, &p, stream);
    else if (weights_dtype == DTYPE_BF16)
        launch_apply<__nv_bfloat16>(&k, master, weights_half, result, w_slots, scaler_dev, lr_device, &p, stream);
    else launch_apply<__half>(&k, master, weights_half, result, w_slots, scaler_dev, lr_device, &p, stream);
}
