/* Muon (K. Jordan, 2024; airbench94_muon's optimizer for the convolution
 * filters): Nesterov momentum whose step for each weight matrix is
 * orthogonalised by a quintic Newton-Schulz iteration. For every matrix
 * W (rows = output channels, cols = the rest of a filter flattened) of the
 * flat buffers, with gradient G:
 *   if scaler->found_inf: nothing at all (the step is skipped)
 *   g = G * (1 / scaler->scale), rounded, times *p.grad_mult (rounded) when given
 *   m = momentum * m + g
 *   u = nesterov ? g + momentum * m : m
 *   X = u / (||u||_F + MUON_EPS), transposed when rows > cols, then ns_steps times:
 *     A = X X^T;  X = (a I + b A + c A A) X      (a, b, c) = MUON_NS_A, _B, _C
 *     (the same polynomial as X = a X + (b A + c A A) X, one product fewer)
 *   W = W * sqrt(rows) / ||W||_F    (normalize_weights: the norm before the step)
 *   W = W - lr * lr_mult * X
 * The iteration's odd polynomial pushes every singular value of u towards
 * [0.7, 1.2] without converging to 1, which is what the recipe wants: a step
 * of about the same size in every direction. Filters are never decayed.
 *
 * lr is read through a pointer (host memory for the CPU path, device memory
 * for the CUDA path), as sgd.h's is, so one schedule drives both optimizers;
 * lr_mult makes Muon's rate its own (the recipe's 0.24 against SGD's).
 *
 * The CUDA path forms the products with cuBLAS in fp32 (TF32 tensor cores when
 * the handle is in CUBLAS_TF32_TENSOR_OP_MATH), each of a round's three
 * products for every matrix in one grouped call (a group per shape); the
 * norms are summed in double in a fixed order. No host sync and no
 * allocation: scratch (muon_scratch_bytes, from the caller) holds the
 * iterates and the grouped calls' pointer tables, so a CUDA graph can capture
 * the step. */
#ifndef TRAINC_OPS_MUON_H
#define TRAINC_OPS_MUON_H

#include <stddef.h>

#include "ops/loss_scaler.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MUON_NS_A 3.4445f
#define MUON_NS_B (-4.7750f)
#define MUON_NS_C 2.0315f
#define MUON_EPS 1e-7f
#define MUON_MAX_MATRICES 64

/* One weight matrix: rows x cols floats at offset (in elements) of the flat buffers. */
typedef struct {
    size_t offset;
    int rows, cols;
} MuonMatrix;

typedef struct {
    MuonMatrix mats[MUON_MAX_MATRICES];
    int n;
} MuonMatrices;

typedef struct {
    float momentum;
    int nesterov;
    int ns_steps;          /* >= 1 */
    float lr_mult;         /* Muon's learning rate is lr_mult * *lr */
    int normalize_weights; /* each matrix scaled to Frobenius norm sqrt(rows) before its step */
    const float *grad_mult; /* as sgd.h's: NULL is 1 */
} MuonParams;

/* Bytes of scratch the step needs for these matrices (either path). */
size_t muon_scratch_bytes(const MuonMatrices *mats);

/* The face (op_context.h): grad and weights_half of ctx->dtype (weights_half
 * NULL on the CPU or in fp32), everything in ctx's device memory. */
void muon_step(const OpContext *ctx, const MuonMatrices *mats, float *master, const void *grad, float *momentum,
               void *weights_half, const float *lr, const LossScalerState *scaler, MuonParams p, void *scratch);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void muon_step_cpu(const MuonMatrices *mats, float *master, const float *grad, float *momentum, const float *lr,
                   const LossScalerState *scaler, MuonParams p, void *scratch);
void muon_step_cuda(cublasHandle_t cublas, const MuonMatrices *mats, float *master, const void *grad,
                    DType grad_dtype, float *momentum, void *weights_half, DType weights_dtype,
                    const float *lr_device, const LossScalerState *scaler_dev, MuonParams p, void *scratch,
                    cudaStream_t stream);

/* Where each matrix's slots lie in the scratch (both paths): its iterate x and
 * the next one y (rows x cols floats each), its Gram matrix a and polynomial b
 * (k x k, k = min(rows, cols)), and per matrix up to MUON_NORM_SLOTS partial
 * sums of squares of u and of W (doubles). Slots are padded to 64 floats
 * (256 bytes, the alignment cuBLAS wants of a grouped product's matrices).
 * Offsets are in floats from x, y, a, b; those four in bytes. The CUDA path
 * alone uses the rest: its Gram product in splits[j] parts of the long side
 * (split-K: a 256 x 2304 filter's Gram matrix is 4 output tiles over 2304
 * products each, too few blocks for the GPU), each part's k x k sum in a slot
 * of its own after a_off[j] (so a holds gram_parts of them); and ptrs:
 * MUON_POINTER_TABLES tables of device pointers, the A, B and C arrays of its
 * grouped products, gram_parts long for the Gram's two tables, n for the rest. */
#define MUON_NORM_SLOTS 128
#define MUON_POINTER_TABLES 15
#define MUON_GRAM_PART 256 /* the long side's floats a Gram part takes at most, where a split divides it */
typedef struct {
    size_t x_off[MUON_MAX_MATRICES], a_off[MUON_MAX_MATRICES];
    int splits[MUON_MAX_MATRICES];
    int gram_parts; /* the splits' sum */
    size_t x, y, a, b, norms, ptrs; /* byte offsets of the regions */
    size_t bytes;
} MuonLayout;

#ifdef __CUDACC__
#define MUON_HOST_DEVICE __host__ __device__
#else
#define MUON_HOST_DEVICE
#endif

static inline MUON_HOST_DEVICE size_t muon_pad64(size_t floats) { return (floats + 63) / 64 * 64; }

/* The fewest equal parts of at most MUON_GRAM_PART floats (a multiple of 4,
 * for 16-byte aligned parts) that the long side splits into; 1 where none. */
static inline int muon_gram_splits(size_t long_side) {
    for (size_t parts = 1; parts <= long_side / 4; parts++)
        if (long_side % parts == 0 && (long_side / parts) % 4 == 0 && long_side / parts <= MUON_GRAM_PART)
            return (int)parts;
    return 1;
}

static inline MuonLayout muon_layout_of(const MuonMatrices *mats) {
    MuonLayout l;
    size_t xs = 0, as = 0;
    l.gram_parts = 0;
    for (int j = 0; j < mats->n; j++) {
        size_t r = (size_t)mats->mats[j].rows, c = (size_t)mats->mats[j].cols, k = r < c ? r : c;
        l.splits[j] = muon_gram_splits(r < c ? c : r);
        l.gram_parts += l.splits[j];
        l.x_off[j] = xs, l.a_off[j] = as;
        xs += muon_pad64(r * c), as += (size_t)l.splits[j] * muon_pad64(k * k);
    }
    /* b takes a's offsets (its first part's place) */
    l.x = 0, l.y = xs * sizeof(float), l.a = 2 * xs * sizeof(float), l.b = l.a + as * sizeof(float);
    l.norms = l.b + as * sizeof(float);
    l.ptrs = l.norms + 2 * (size_t)MUON_NORM_SLOTS * (size_t)mats->n * sizeof(double);
    size_t pointers = 2 * 3 * (size_t)l.gram_parts + (MUON_POINTER_TABLES - 6) * (size_t)mats->n;
    l.bytes = l.ptrs + pointers * sizeof(void *);
    return l;
}

/* The Newton-Schulz iteration alone, on the CPU: x (rows x cols, row-major)
 * replaced by its orthogonalised form (the update X above, from u = x). */
void muon_orthogonalize_cpu(float *x, int rows, int cols, int ns_steps, void *scratch);

#ifdef __cplusplus
}
#endif
#endif
