/* Convolution with its output's batch-norm statistics, and optionally the
 * previous batch norm applied to its input, in one forward op (the fused
 * convolutions of NVIDIA's MLPerf ResNet training):
 *   prologue (optional): x' = relu(x * scale[c] + bias[c]), per input channel c
 *   y = conv(x', w)                       (no bias; stored in the dtype)
 *   sum[k] = sum over n, p, q of y,  sqsum[k] = the same of y^2   (fp32)
 * so that the next batch norm needs only bn_finalize (below) on k values, and
 * the layer after it takes that batch norm's scale and bias as its prologue.
 *
 * The CPU path is float32, NCHW: the prologue, conv2d_forward_cpu with no
 * bias, then the sums in double stored as float. The CUDA path builds one
 * cuDNN graph through the backend API at init (ops/backend_graph.h):
 *   [X * SCALE -> + BIAS -> RELU_FWD ->] CONVOLUTION_FORWARD -> Y -> GEN_STATS -> SUM, SQSUM
 * and with a prologue a second one for the filter gradient (backward_filter):
 *   X * SCALE -> + BIAS -> RELU_FWD -> CONVOLUTION_BACKWARD_FILTER (DY) -> DW
 * (into dw where it is overwritten; else into a scratch, then added to dw: its
 * plans ignore beta),
 * the prologue's intermediates virtual fp32 (x' is never rounded or stored),
 * Y real in the dtype, SUM and SQSUM fp32 [1, k, 1, 1]; scale and bias are k
 * values of the dtype, as in cuDNN's and Paddle's ConvBN-fprop pattern (the
 * runtime fusion engines take them so). Those engines want NHWC f16 or bf16
 * with c and k multiples of 8; elsewhere no engine finalizes and it falls
 * back: the prologue as a kernel writing x' (rounded to the dtype) into the
 * front of the workspace (so the fallback's workspace holds a copy of x), then
 * conv2d_forward_cuda (conv2d's filter gradient in backward_filter), then a per-channel reduction of y into sum and sqsum
 * (accumulated in double in a fixed order: deterministic, no atomics). A
 * fused engine may sum y before or after rounding it to the dtype.
 * A shape without prologue that conv2d's direct path takes (a network's first
 * convolution, over the image padded to 8 channels: ops/conv2d.cu) is timed
 * under the policy's benchmark by that path with the sums in its epilogue
 * (conv2d_forward_stats_cuda) against the graph's plan, and the faster runs
 * (prefer_direct: the direct path wherever it fits). */
#ifndef TRAINC_OPS_CONV_GENSTATS_H
#define TRAINC_OPS_CONV_GENSTATS_H

#include <stddef.h>
#include <stdint.h>

#include "ops/backend_graph.h"
#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Conv2dShape conv; /* n, c, h, w, k, r, s, pad, stride (ops/conv2d.h) */
    int prologue;     /* 1: x' = relu(x * scale + bias) per input channel */
} ConvGenStatsShape;

/* The tensors of the fused graph, by their cuDNN unique ids. */
enum { CGS_UID_X = 1, CGS_UID_SCALE, CGS_UID_BIAS, CGS_UID_W, CGS_UID_Y, CGS_UID_SUM, CGS_UID_SQSUM,
       CGS_TENSORS = CGS_UID_SQSUM };

typedef struct {
    ConvGenStatsShape shape;
    DType dtype; /* of x, scale, bias, w and y; sum and sqsum are fp32 */
    int nhwc;
    int fused;               /* 1: one cuDNN graph; 0: the fallback */
    int direct;              /* 1: the fallback conv2d's direct path, the sums in its epilogue */
    float direct_us;         /* its time per run where timed (against graph.plan_ms), else 0 */
    BackendGraph graph;      /* its descriptors and plan */
    size_t workspace_bytes;  /* of the plan, or of the fallback */
    size_t prologue_bytes;   /* the fallback's x' at the front of the workspace (0 without prologue) */
    /* The filter gradient's graph, prologue shapes only:
     *   X * SCALE -> + BIAS -> RELU_FWD -> CONVOLUTION_BACKWARD_FILTER (DY) -> DW
     * into a scratch at the front of the workspace, then added to dw. */
    int filter_fused;
    BackendGraph filter_graph;
    size_t filter_scratch_bytes;
    Conv2dCuda fallback; /* initialized only where a graph is not fused */
} ConvGenStatsCuda;

/* The face (op_context.h). */
typedef struct {
    ConvGenStatsShape shape;
    ConvGenStatsCuda cuda; /* GPU only */
} ConvGenStats;

void conv_genstats_init(const OpContext *ctx, ConvGenStats *op, const ConvGenStatsShape *s,
                        const ConvAlgoPolicy *policy);
void conv_genstats_destroy(const OpContext *ctx, ConvGenStats *op);
size_t conv_genstats_workspace_bytes(const OpContext *ctx, const ConvGenStats *op); /* 0 on the CPU */
/* 1 when the GPU path computes the sums in the convolution's epilogue: one cuDNN graph or the direct path. */
int conv_genstats_fused(const ConvGenStats *op);
/* What runs the GPU's forward, for the log: "cuDNN graph", "direct kernel" or "fallback". */
const char *conv_genstats_path(const ConvGenStats *op);
/* 1 when the GPU's filter gradient with the prologue is one cuDNN graph too. */
int conv_genstats_filter_fused(const ConvGenStats *op);
/* x, w, y in ctx->dtype and layout on the GPU (ctx->nhwc: x, y [n][h][w][c],
 * w [k][r][s][c]; else NCHW, w [k][c][r][s]); scale and bias (NULL unless
 * prologue) c values of ctx->dtype; sum and sqsum k floats, overwritten. All
 * 16-byte aligned. Runs with ctx->workspace (>= workspace_bytes) on
 * ctx->stream, with no allocation and no sync. CPU: fp32 NCHW. */
void conv_genstats_forward(const OpContext *ctx, const ConvGenStats *op, const void *x, const void *scale,
                           const void *bias, const void *w, void *y, float *sum, float *sqsum);
/* Backward of a prologue shape, the filter's part: dw = wgrad(x', dy), or
 * with accumulate_dw dw += wgrad(x', dy) (conv2d's CONV2D_ADD_DW), x'
 * the prologue's output recomputed from x as the forward computes it, never
 * stored. The data gradient at x' is conv2d's (ops/conv2d.h) and the
 * prologue's own backward is its batch norm's, so neither is here; a shape
 * without a prologue has conv2d's whole backward. Tensors as forward's (dy as
 * y, dw as w), on ctx->stream with ctx->workspace. */
void conv_genstats_backward_filter(const OpContext *ctx, const ConvGenStats *op, const void *x, const void *scale,
                                   const void *bias, const void *dy, void *dw, int accumulate_dw);

/* ---- Batch-norm finalize: the statistics' sums to what the next layer needs --
 * From sum and sqsum of a channel's m values (a batch norm's input, as
 * conv_genstats makes them), with p's gamma, beta, eps and momentum, exactly
 * batchnorm.h's training semantics:
 *   mean = sum / m, var = max(0, sqsum / m - mean^2)   (biased), invstd = 1 / sqrt(var + eps)
 *   scale = gamma * invstd, bias = beta - mean * scale (bn(x) = x * scale + bias)
 *   p->save_mean, p->save_invstd = mean, invstd (NULL: skipped)
 *   p->running_mean/var updated by momentum with the UNBIASED var * m / (m - 1)
 *   (momentum 0 or NULL buffers: left alone). m must be at least 2.
 * Computed in double per channel. p->reduce is not used. The face: scale and
 * bias are fp32 on the CPU and ctx->dtype on the GPU (a prologue's operands),
 * or NULL, not written (a batch norm's BN_TRAIN_SAVED forward derives its own
 * from the saved statistics); the rest fp32 on ctx's device. */
void bn_finalize(const OpContext *ctx, int channels, int64_t m, const float *sum, const float *sqsum,
                 const BatchNormParams *p, void *scale, void *bias);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void conv_genstats_forward_cpu(const ConvGenStatsShape *s, const float *x, const float *scale, const float *bias,
                               const float *w, float *y, float *sum, float *sqsum);
void conv_genstats_backward_filter_cpu(const ConvGenStatsShape *s, const float *x, const float *scale,
                                       const float *bias, const float *dy, float *dw, int accumulate_dw);
/* The prologue alone, in place allowed: x' = relu(x * scale[c] + bias[c]), NCHW. */
void conv_genstats_prologue_cpu(const Conv2dShape *s, const float *x, const float *scale, const float *bias,
                                float *out);
void bn_finalize_cpu(int channels, int64_t m, const float *sum, const float *sqsum, const BatchNormParams *p,
                     float *scale, float *bias);

/* Builds the graph and picks its plan by the policy (see conv_genstats.cu). */
void conv_genstats_cuda_init(ConvGenStatsCuda *c, cudnnHandle_t h, const ConvGenStatsShape *s, DType dtype,
                             int nhwc, const ConvAlgoPolicy *policy);
void conv_genstats_cuda_destroy(ConvGenStatsCuda *c);
/* On the handle's stream; no allocation on the device and no sync, so it can
 * be captured into a CUDA graph. */
void conv_genstats_forward_cuda(const ConvGenStatsCuda *c, cudnnHandle_t h, const void *x, const void *scale,
                                const void *bias, const void *w, void *y, float *sum, float *sqsum,
                                void *workspace);
void conv_genstats_backward_filter_cuda(const ConvGenStatsCuda *c, cudnnHandle_t h, const void *x,
                                        const void *scale, const void *bias, const void *dy, void *dw,
                                        int accumulate_dw, void *workspace);
/* scale and bias in scale_dtype; on 'stream'. */
void bn_finalize_cuda(DType scale_dtype, int channels, int64_t m, const float *sum, const float *sqsum,
                      const BatchNormParams *p, void *scale, void *bias, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
