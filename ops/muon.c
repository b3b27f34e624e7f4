#include "ops/muon.h"

#include <math.h>
#include <string.h>

#include "ops/gemm_cpu.h"
#include "runtime/check.h"

static void check_matrices(const MuonMatrices *mats, MuonParams p) {
    if (mats->n < 0 || mats->n > MUON_MAX_MATRICES)
        TC_FATAL("muon: %d matrices (at most %d)", mats->n, MUON_MAX_MATRICES);
    for (int j = 0; j < mats->n; j++)
        if (mats->mats[j].rows < 1 || mats->mats[j].cols < 1)
            TC_FATAL("muon: matrix %d is %d x %d", j, mats->mats[j].rows, mats->mats[j].cols);
    if (p.ns_steps < 1) TC_FATAL("muon: %d Newton-Schulz steps (at least 1)", p.ns_steps);
}

size_t muon_scratch_bytes(const MuonMatrices *mats) { return muon_layout_of(mats).bytes; }

/* One product of the iteration, row-major (ops/gemm_cpu.h). For a wide X
 * (rows <= cols) A = X X^T and X <- B X; for a tall one the same on X^T,
 * which is A = X^T X and X <- X B (B is symmetric). */
static void gram_cpu(const float *x, int rows, int cols, float *a) {
    if (rows <= cols) cpu_sgemm(0, 1, rows, rows, cols, 1.0f, x, cols, x, cols, 0.0f, a, rows);
    else cpu_sgemm(1, 0, cols, cols, rows, 1.0f, x, cols, x, cols, 0.0f, a, cols);
}

static void apply_poly_cpu(const float *b, const float *x, int rows, int cols, float *y) {
    if (rows <= cols) cpu_sgemm(0, 0, rows, cols, rows, 1.0f, b, rows, x, cols, 0.0f, y, cols);
    else cpu_sgemm(0, 0, rows, cols, cols, 1.0f, x, cols, b, cols, 0.0f, y, cols);
}

/* B = a I + b A + c A A, k x k. */
static void poly_cpu(const float *a, int k, float *b) {
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) b[(size_t)i * k + j] = MUON_NS_B * a[(size_t)i * k + j] + (i == j ? MUON_NS_A : 0.0f);
    cpu_sgemm(0, 0, k, k, k, MUON_NS_C, a, k, a, k, 1.0f, b, k);
}

/* x scaled to unit norm (plus eps) and iterated; x, y (rows x cols) and a, b
 * (k x k) are the matrix's slots of the scratch. The result ends in x. */
static void orthogonalize_in(float *x, float *y, float *a, float *b, int rows, int cols, int ns_steps) {
    size_t n = (size_t)rows * cols;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    float inv = 1.0f / ((float)sqrt(sum) + MUON_EPS);
    for (size_t i = 0; i < n; i++) x[i] *= inv;
    int k = rows <= cols ? rows : cols;
    for (int s = 0; s < ns_steps; s++) {
        gram_cpu(x, rows, cols, a);
        poly_cpu(a, k, b);
        apply_poly_cpu(b, x, rows, cols, y);
        memcpy(x, y, n * sizeof(float));
    }
}

void muon_orthogonalize_cpu(float *x, int rows, int cols, int ns_steps, void *scratch) {
    MuonMatrices one = {.mats = {{0, rows, cols}}, .n = 1};
    check_matrices(&one, (MuonParams){.ns_steps = ns_steps});
    MuonLayout l = muon_layout_of(&one);
    char *s = scratch;
    orthogonalize_in(x, (float *)(s + l.y), (float *)(s + l.a), (float *)(s + l.b), rows, cols, ns_steps);
}

/* The momentum step of one matrix; u goes to x. */
static void momentum_cpu(const float *grad, float *momentum, size_t n, float inv_scale, float mult, MuonParams p,
                         float *x) {
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * inv_scale * mult;
        float mom = p.momentum * momentum[i] + g;
        momentum[i] = mom;
        x[i] = p.nesterov ? g + p.momentum * mom : mom;
    }
}

static float weight_scale_cpu(const float *w, size_t n, int rows) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)w[i] * w[i];
    return sum > 0 ? (float)(sqrt((double)rows) / sqrt(sum)) : 1.0f;
}

void muon_step_cpu(const MuonMatrices *mats, float *master, const float *grad, float *momentum, const float *lr,
                   const LossScalerState *scaler, MuonParams p, void *scratch) {
    check_matrices(mats, p);
    if (scaler && scaler->found_inf) return;
    float inv_scale = scaler ? 1.0f / scaler->scale : 1.0f, mult = p.grad_mult ? *p.grad_mult : 1.0f;
    float step = *lr * p.lr_mult;
    MuonLayout l = muon_layout_of(mats);
    char *s = scratch;
    for (int j = 0; j < mats->n; j++) {
        const MuonMatrix *mat = &mats->mats[j];
        size_t n = (size_t)mat->rows * mat->cols;
        float *w = master + mat->offset, *x = (float *)(s + l.x) + l.x_off[j];
        momentum_cpu(grad + mat->offset, momentum + mat->offset, n, inv_scale, mult, p, x);
        orthogonalize_in(x, (float *)(s + l.y) + l.x_off[j], (float *)(s + l.a) + l.a_off[j],
                         (float *)(s + l.b) + l.a_off[j], mat->rows, mat->cols, p.ns_steps);
        float w_scale = p.normalize_weights ? weight_scale_cpu(w, n, mat->rows) : 1.0f;
        for (size_t i = 0; i < n; i++) w[i] = w[i] * w_scale - step * x[i];
    }
}

void muon_step(const OpContext *ctx, const MuonMatrices *mats, float *master, const void *grad, float *momentum,
               void *weights_half, const float *lr, const LossScalerState *scaler, MuonParams p, void *scratch) {
    if (ctx->device == DEVICE_CPU && weights_half) TC_FATAL("muon_step: the CPU path keeps no half-precision weights");
    check_matrices(mats, p);
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) muon_step_cpu(mats, master, grad, momentum, lr, scaler, p, scratch);
    else GPU_ONLY(muon_step_cuda(ctx->cublas, mats, master, grad, ctx->dtype, momentum, weights_half, ctx->dtype, lr,
                                 scaler, p, scratch, ctx->stream));
    op_end(ctx, __func__);
}
