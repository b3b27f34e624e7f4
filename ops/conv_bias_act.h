/* Convolution, bias, optional residual and optional ReLU in one forward op,
 * for inference:
 *   y = act(conv(x, w) + b [+ z]),  act = ReLU or the identity.
 * The CPU path is float32, NCHW: conv2d_forward_cpu with the bias, then + z,
 * then the ReLU. The CUDA path builds one cuDNN graph through cuDNN 9's
 * backend API at init (convolution -> add bias -> [add z] -> [ReLU], fp32
 * intermediates that never reach memory, one rounding to the dtype at the
 * end) and runs it as one kernel where cuDNN has an engine for it (fused).
 * Where no engine's plan finalizes within the policy, it falls back to
 * conv2d_forward_cuda with the bias and then add_relu / add / relu in place
 * on y (each rounding to the dtype). Layouts and dtypes as conv2d.h's. */
#ifndef TRAINC_OPS_CONV_BIAS_ACT_H
#define TRAINC_OPS_CONV_BIAS_ACT_H

#include <stddef.h>
#include <stdint.h>

#include "ops/backend_graph.h"
#include "ops/conv2d.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Conv2dShape conv; /* n, c, h, w, k, r, s, pad, stride, groups (ops/conv2d.h) */
    int relu;         /* 1: y = max(0, .) */
    int residual;     /* 1: z (same shape as y) is added before the ReLU */
} ConvBiasActShape;

/* The tensors of the fused graph, by their cuDNN unique ids. */
enum { CBA_UID_X = 1, CBA_UID_W, CBA_UID_B, CBA_UID_Z, CBA_UID_Y, CBA_TENSORS = CBA_UID_Y };

typedef struct {
    ConvBiasActShape shape;
    DType dtype; /* of x, w, b, z and y */
    int nhwc;
    int fused;   /* 1: one cuDNN graph; 0: the fallback */
    BackendGraph graph;      /* its descriptors and plan (ops/backend_graph.h) */
    size_t workspace_bytes;  /* of the plan, or of the fallback */
    Conv2dCuda fallback;     /* initialized only when not fused */
} ConvBiasActCuda;

/* The face (op_context.h). */
typedef struct {
    ConvBiasActShape shape;
    ConvBiasActCuda cuda; /* GPU only */
} ConvBiasAct;

void conv_bias_act_init(const OpContext *ctx, ConvBiasAct *op, const ConvBiasActShape *s,
                        const ConvAlgoPolicy *policy);
void conv_bias_act_destroy(const OpContext *ctx, ConvBiasAct *op);
size_t conv_bias_act_workspace_bytes(const OpContext *ctx, const ConvBiasAct *op); /* 0 on the CPU */
int conv_bias_act_fused(const ConvBiasAct *op); /* 1 when the GPU path is one cuDNN graph; 0 on CPU or fallback */
/* x, w, b, z (NULL unless residual), y: in ctx->dtype and layout on the GPU
 * (ctx->nhwc: x, z, y [n][h][w][c], w [k][r][s][c]; else NCHW, w [k][c][r][s]),
 * 16-byte aligned; b is k values of ctx->dtype. Runs with ctx->workspace
 * (>= workspace_bytes) on ctx->stream. CPU: fp32 NCHW. */
void conv_bias_act_forward(const OpContext *ctx, const ConvBiasAct *op, const void *x, const void *w,
                           const void *b, const void *z, void *y);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void conv_bias_act_forward_cpu(const ConvBiasActShape *s, const float *x, const float *w, const float *b,
                               const float *z, float *y);

/* Builds the graph and picks its plan by the policy (see conv_bias_act.cu). */
void conv_bias_act_cuda_init(ConvBiasActCuda *c, cudnnHandle_t h, const ConvBiasActShape *s, DType dtype,
                             int nhwc, const ConvAlgoPolicy *policy);
void conv_bias_act_cuda_destroy(ConvBiasActCuda *c);
/* On the handle's stream; no allocation on the device and no sync, so it can
 * be captured into a CUDA graph. */
void conv_bias_act_forward_cuda(const ConvBiasActCuda *c, cudnnHandle_t h, const void *x, const void *w,
                                const void *b, const void *z, void *y, void *workspace);

#ifdef __cplusplus
}
#endif
#endif
