/* The data gradient of a convolution whose input is a batch norm + ReLU's
 * output, with that ReLU's and that norm's backward, in one op (NVIDIA's
 * DgradDreluBnBwdWeight pattern of its MLPerf ResNet training). With x the
 * norm's input [n][c][h][w], gamma, beta its parameters and mean, invstd its
 * saved statistics (BatchNormParams' save_mean and save_invstd, m = n*h*w):
 *   g  = dgrad(w, dy)                        the gradient at x' = relu(bn(x)),
 *                                            the convolution's input
 *   dz = g where (x - mean) * invstd * gamma + beta > 0, else 0
 *   dbeta += sum dz,  dgamma += sum dz * xhat         (xhat = (x - mean) * invstd)
 *   dx = gamma * invstd / m * (m dz - sum dz - xhat * sum dz * xhat)
 *        (overwritten, or added to with accumulate_dx)
 * which is conv2d_backward's data gradient followed by batchnorm_backward with
 * BN_ACT_RELU and its mask recomputed from x (no y, no prologue: the norm's
 * forward stored its output, and the convolution read it). The convolution's
 * filter gradient is not here: conv2d's, from the stored x'.
 *
 * The CPU path is those two CPU references (float32, NCHW). The CUDA path
 * builds one cuDNN graph through the backend API at init (ops/backend_graph.h):
 *   CONVOLUTION_BACKWARD_DATA (W, DY) -> G
 *   X - MEAN -> * INVSTD -> * GAMMA -> + BETA -> Z
 *   RELU_BWD (G, Z) -> DZ
 *   BN_BWD_WEIGHTS (DZ, X, MEAN, INVSTD, GAMMA) -> DGAMMA, DBETA, A, B, C
 * G and Z virtual fp32, DZ real in the dtype (in dx itself; where dx is
 * added to, in the workspace's front), the five per-channel outputs fp32 in
 * the workspace; then one pass dx = A * dz + B * x + C, in place (or
 * dx += that), and one small kernel adding dgamma and dbeta into the
 * gradient buffers. cuDNN recomputes Z in fp32, as above:
 * its mask may differ from the one the forward stored where Z rounds across
 * 0. Where no engine finalizes the graph (cuDNN runs it on Ampere and Hopper,
 * NHWC f16 or bf16, c and k multiples of 8), or the policy refuses its
 * engines, it falls back: conv2d's data gradient where dz would go, then
 * batchnorm_act_backward_cuda. */
#ifndef TRAINC_OPS_CONV_DGRAD_DBN_H
#define TRAINC_OPS_CONV_DGRAD_DBN_H

#include <stddef.h>

#include "ops/backend_graph.h"
#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tensors of the fused graph, by their cuDNN unique ids. */
enum { CDD_UID_DY = 1, CDD_UID_W, CDD_UID_X, CDD_UID_MEAN, CDD_UID_INVSTD, CDD_UID_GAMMA, CDD_UID_BETA, CDD_UID_DZ,
       CDD_UID_DGAMMA, CDD_UID_DBETA, CDD_UID_A, CDD_UID_B, CDD_UID_C, CDD_TENSORS = CDD_UID_C };

/* The per-channel fp32 outputs of the graph, in this order after dz. */
enum { CDD_DGAMMA, CDD_DBETA, CDD_A, CDD_B, CDD_C, CDD_COEFFICIENTS };

typedef struct {
    Conv2dShape shape; /* the convolution: its input is the norm's, c channels */
    DType dtype;       /* of dy, w, x, dz and dx; the norm's buffers are fp32 */
    int nhwc;
    int fused;              /* 1: the cuDNN graph; 0: the fallback */
    BackendGraph graph;     /* its descriptors and plan */
    size_t dz_bytes;        /* dz at the workspace's front where dx is added to (the fallback's g) */
    size_t workspace_bytes; /* the coefficients and the plan's, or the fallback's: after dz where it is there */
    Conv2dCuda fallback_conv;  /* initialized only where the graph is not fused */
    BatchNormCuda fallback_bn; /* likewise (its own scratch) */
} ConvDgradDbnCuda;

/* The face (op_context.h). */
typedef struct {
    Conv2dShape shape;
    ConvDgradDbnCuda cuda; /* GPU only */
} ConvDgradDbn;

void conv_dgrad_dbn_init(const OpContext *ctx, ConvDgradDbn *op, const Conv2dShape *s, const ConvAlgoPolicy *policy);
void conv_dgrad_dbn_destroy(const OpContext *ctx, ConvDgradDbn *op);
/* The workspace backward needs with that accumulate_dx (0 on the CPU): with
 * accumulate_dx = 0, dz is dx itself, and dx is made over it in place. */
size_t conv_dgrad_dbn_workspace_bytes(const OpContext *ctx, const ConvDgradDbn *op, int accumulate_dx);
int conv_dgrad_dbn_fused(const ConvDgradDbn *op); /* 1 when the GPU path is the cuDNN graph */
/* dy, w, x, dx in ctx->dtype and layout on the GPU (ctx->nhwc: x, dx
 * [n][h][w][c], dy [n][oh][ow][k], w [k][r][s][c]; else NCHW, w [k][c][r][s]);
 * p->gamma, beta, save_mean, save_invstd c floats; dgamma and dbeta c values
 * of ctx->dtype on the GPU, added to. All 16-byte aligned. Runs with
 * ctx->workspace (>= workspace_bytes for accumulate_dx) on ctx->stream, with no allocation and
 * no sync. CPU: fp32 NCHW. */
void conv_dgrad_dbn_backward(const OpContext *ctx, const ConvDgradDbn *op, const void *w, const void *dy,
                             const void *x, const BatchNormParams *p, void *dx, int accumulate_dx, void *dgamma,
                             void *dbeta);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void conv_dgrad_dbn_backward_cpu(const Conv2dShape *s, const float *w, const float *dy, const float *x,
                                 const BatchNormParams *p, float *dx, int accumulate_dx, float *dgamma,
                                 float *dbeta);

/* Builds the graph and picks its plan by the policy (see conv_dgrad_dbn.cu). */
void conv_dgrad_dbn_cuda_init(ConvDgradDbnCuda *c, cudnnHandle_t h, const Conv2dShape *s, DType dtype, int nhwc,
                              const ConvAlgoPolicy *policy);
void conv_dgrad_dbn_cuda_destroy(ConvDgradDbnCuda *c);
/* On the handle's stream; dgamma and dbeta of grad_dtype. No allocation on
 * the device and no sync, so it can be captured into a CUDA graph. */
void conv_dgrad_dbn_backward_cuda(const ConvDgradDbnCuda *c, cudnnHandle_t h, const void *w, const void *dy,
                                  const void *x, const BatchNormParams *p, void *dx, int accumulate_dx,
                                  void *dgamma, void *dbeta, DType grad_dtype, void *workspace);

#ifdef __cplusplus
}
#endif
#endif
