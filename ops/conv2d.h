/* 2-D convolution with bias, its channels optionally in groups.
 * y[n,k,p,q] = b[k] + sum_{c,r,s} x[n,c,p*stride-pad+r,q*stride-pad+s] * w[k,c,r,s]
 * With G groups (PyTorch's groups) input channels [g C/G, (g+1) C/G) feed
 * only outputs [g K/G, (g+1) K/G), so a filter has C/G channels: w[k][c'][r][s],
 * c' < C/G, reads input channel (k / (K/G)) * C/G + c'. Depthwise: G = C = K.
 * A NULL b (forward) or db (backward) skips the bias: a fused bias+ReLU
 * (ops/bias_relu.h) does it instead.
 * Backward: dx and dw are overwritten unless accumulate adds to them, db is
 * always ADDED to (NULL skips any of them; a NULL dw skips the filter
 * gradient: conv_genstats_backward_filter takes it where the input is a batch
 * norm's prologue, ops/conv_genstats.h). accumulate's flags:
 *   CONV2D_ADD_DX  adds the input gradient into dx (a tensor feeding two
 *                  layers, such as a residual block's input, sums the
 *                  gradients of both);
 *   CONV2D_ADD_DW  adds the filter gradient into dw (a flat gradient buffer
 *                  accumulating micro-batches). Without it the GPU writes dw
 *                  directly, where with beta 1 cuDNN's filter-gradient engines
 *                  write a scratch and blend it into dw in one more kernel
 *                  (its convertTensor).
 * The plain conv2d_backward_cpu is the _ex one with CONV2D_ADD_DW.
 * The CPU path is float32, NCHW. The CUDA path stores x, w, b, y, dy, dx, dw and
 * db as the dtype given at init (f32, f16 or bf16) and accumulates in fp32; its
 * layout is NCHW (x [n][c][h][w], w [k][c][r][s]) or, with nhwc, channels-last
 * (x, y and their gradients [n][h][w][c], w and dw [k][r][s][c]); b is k values
 * either way. Grouped, the filters' c is C/G in both layouts (cuDNN's and
 * PyTorch's [k][c/groups][r][s]). */
#ifndef TRAINC_OPS_CONV2D_H
#define TRAINC_OPS_CONV2D_H

#include <stddef.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n, c, h, w; /* input */
    int k, r, s;    /* output channels, kernel height and width */
    int pad, stride;
    int groups;     /* channel groups (above): c and k multiples of it; 0 (a shape that names none) or 1: one */
} Conv2dShape;

int conv2d_out_h(const Conv2dShape *s);
int conv2d_out_w(const Conv2dShape *s);
int conv2d_groups(const Conv2dShape *s);         /* groups, 0 read as 1 */
size_t conv2d_filter_count(const Conv2dShape *s); /* k * (c / groups) * r * s: w's elements */
/* The fused ops built on one convolution of all channels (conv_genstats,
 * conv_dgrad_dbn, conv_bias_relu_pool, conv_bias_gelu) refuse a grouped one,
 * naming op and shape: their planners must not pick it. */
void conv2d_check_ungrouped(const Conv2dShape *s, const char *op);

/* How convolution algorithms are chosen, once per layer at init.
 * allow_tf32 lets cuDNN run the float32 convolution on TF32 tensor cores
 * (CUDNN_DEFAULT_MATH, PyTorch's default for cuDNN); off keeps full fp32 FMA.
 * It concerns float32 only: f16 and bf16 always may use tensor cores.
 * deterministic takes only algorithms cuDNN calls deterministic (and fails if
 * none fits); otherwise the fastest. benchmark times every algorithm on the
 * device (cudnnFind*, which allocates its own buffers) instead of trusting
 * cuDNN's heuristics. No algorithm may need more than workspace_limit bytes.
 * Under benchmark, f16 and bf16 in NHWC also time a plan of cuDNN's backend
 * API per pass (ops/backend_graph.h) against the legacy algorithm and run the
 * faster; prefer_backend (tests) takes the backend's plan wherever one
 * finalizes, however it times. There too the forward and filter passes of a
 * 3x3 stride-1 convolution of an image padded to 8 channels time a direct
 * path of our own (at most 64 output channels, a multiple of 16), run where
 * fastest, and so do every pass of a depthwise 3x3 or 5x5 (conv2d_depthwise_fits);
 * prefer_direct (tests) takes either wherever it fits.
 * agree: processes that choose together (the ranks of data-parallel
 * training) pass every timing of the same candidates, n floats in the same
 * order on each, through agree, which makes each the same on all of them
 * (their mean; infinite where any could not run it): every rank then keeps
 * the same algorithms and plans, and the step is not as slow as the rank
 * whose timings were disturbed most. NULL: this process alone.
 * plan_cache: under benchmark in one process (agree NULL), the backend
 * graphs' choices kept by their shape but the batch and offered again to a
 * graph of the same shape (ops/backend_graph.h); NULL: each graph alone. */
struct BackendPlanCache;
typedef struct {
    size_t workspace_limit;
    int allow_tf32;
    int deterministic;
    int benchmark;
    int prefer_backend;
    int prefer_direct;
    void (*agree)(void *user, float *times, int n);
    void *agree_user;
    struct BackendPlanCache *plan_cache;
} ConvAlgoPolicy;

/* Under benchmark: times made common to the processes choosing together. */
static inline void conv_policy_agree(const ConvAlgoPolicy *p, float *times, int n) {
    if (p->benchmark && p->agree) p->agree(p->agree_user, times, n);
}

/* conv2d_backward's accumulate (above). */
enum { CONV2D_ADD_DX = 1, CONV2D_ADD_DW = 2 };

/* The passes a convolution runs: the data gradient overwriting dx (DATA) or
 * added to it (DATA_ADD, CONV2D_ADD_DX); the filter gradient overwriting dw
 * (FILTER) or added to it (FILTER_ADD, CONV2D_ADD_DW). FILTER_ADD is not timed:
 * it takes FILTER's direct path where that won, else the legacy algorithm. */
typedef enum {
    CONV2D_FORWARD,
    CONV2D_DATA,
    CONV2D_DATA_ADD,
    CONV2D_FILTER,
    CONV2D_FILTER_ADD,
    CONV2D_PASSES
} Conv2dPass;

struct BackendGraph; /* ops/backend_graph.h */

/* CUDA path through cuDNN. Descriptors and algorithms are chosen once, at init. */
typedef struct {
    Conv2dShape shape;
    DType dtype; /* of x, w, b, y and their gradients */
    int nhwc;    /* channels-last tensors and filters */
    cudnnTensorDescriptor_t x_desc, y_desc, b_desc;
    cudnnFilterDescriptor_t w_desc;
    cudnnConvolutionDescriptor_t conv_desc;       /* forward */
    cudnnConvolutionDescriptor_t bwd_data_desc;   /* same convolution, each pass under */
    cudnnConvolutionDescriptor_t bwd_filter_desc; /* the math type of its algorithm */
    ConvAlgoPolicy policy;
    cudnnConvolutionFwdAlgo_t fwd_algo;
    cudnnConvolutionBwdDataAlgo_t bwd_data_algo;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo;
    /* Where backend plans were timed (see ConvAlgoPolicy): CONV2D_PASSES
     * graphs, those of the passes they won kept; else NULL. */
    struct BackendGraph *plans;
    int use_plan[CONV2D_PASSES];
    float legacy_us[CONV2D_PASSES], plan_us[CONV2D_PASSES]; /* per run; plan_us 0: none finalized */
    /* The direct path (forward and filter gradient of a 3x3 convolution of an
     * image padded to 8 channels, f16/bf16 NHWC), where it timed fastest. */
    int use_direct[CONV2D_PASSES];
    float direct_us[CONV2D_PASSES]; /* per run; 0: not tried */
    int direct_blocks[CONV2D_PASSES]; /* its grids; the filter gradient's partial sums, one set a block */
    size_t workspace_bytes; /* the most any algorithm, plan or the bias gradient needs */
} Conv2dCuda;

/* The face (op_context.h): one convolution on either device, ctx->dtype and
 * ctx->nhwc on the GPU, where init chooses its algorithms by the policy and
 * the calls run with ctx->workspace, which must hold workspace_bytes (0 on the
 * CPU) and, where conv2d_bias_grad is called, bias_grad_bytes. backward's
 * accumulate: CONV2D_ADD_DX, CONV2D_ADD_DW (above). */
typedef struct {
    Conv2dShape shape;
    Conv2dCuda cuda; /* GPU only */
} Conv2d;

void conv2d_init(const OpContext *ctx, Conv2d *c, const Conv2dShape *s, const ConvAlgoPolicy *policy);
void conv2d_destroy(const OpContext *ctx, Conv2d *c);
size_t conv2d_workspace_bytes(const OpContext *ctx, const Conv2d *c);
size_t conv2d_bias_grad_bytes(const OpContext *ctx, const Conv2d *c);
/* What init chose, for the log: per pass the legacy algorithm or the backend
 * plan and, where they were timed, both times. */
void conv2d_describe(const OpContext *ctx, const Conv2d *c, char *buf, size_t size);
/* The chosen path's microseconds per run of a pass, as init timed it on
 * random data; 0 where it was not timed (the CPU, perf.conv_benchmark off). */
float conv2d_timed_us(const OpContext *ctx, const Conv2d *c, Conv2dPass pass);
void conv2d_forward(const OpContext *ctx, const Conv2d *c, const void *x, const void *w, const void *b, void *y);
void conv2d_backward(const OpContext *ctx, const Conv2d *c, const void *x, const void *w, const void *dy, void *dx,
                     void *dw, void *db, int accumulate);
void conv2d_bias_grad(const OpContext *ctx, const Conv2d *c, const void *dy, void *db);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* CPU reference (im2col + sgemm). */
void conv2d_forward_cpu(const Conv2dShape *s, const float *x, const float *w, const float *b,
                        float *y);
void conv2d_backward_cpu(const Conv2dShape *s, const float *x, const float *w, const float *dy,
                         float *dx, float *dw, float *db);
void conv2d_backward_ex_cpu(const Conv2dShape *s, const float *x, const float *w, const float *dy,
                            float *dx, float *dw, float *db, int accumulate);

/* Whether the direct path (conv2d.cu) takes a convolution: 3x3, stride 1,
 * pad 1, CONV2D_DIRECT_CHANNELS input channels, at most CONV2D_DIRECT_MAX_OUT
 * outputs in multiples of 16, f16 or bf16 NHWC. */
#define CONV2D_DIRECT_CHANNELS 8
#define CONV2D_DIRECT_MAX_OUT 64
int conv2d_direct_fits(const Conv2dShape *s, DType dtype, int nhwc);
/* Whether the direct path's depthwise kernels (conv2d.cu) take a convolution: groups = c = k (even), a square
 * 3x3 or 5x5 filter, stride 1 or 2, pad below the filter's size, f16 or bf16 NHWC. Every pass is timed
 * against cuDNN's under benchmark (prefer_direct: taken). */
int conv2d_depthwise_fits(const Conv2dShape *s, DType dtype, int nhwc);

/* nhwc picks the layout above. Half types in NHWC run on tensor cores where
 * cuDNN has a kernel for the shape: c a multiple of 8 (pad the input's channels
 * with zeros, see cast_nchw_to_nhwc_cuda) and k a multiple of 8. */
void conv2d_cuda_init(Conv2dCuda *c, cudnnHandle_t h, const Conv2dShape *s, DType dtype, int nhwc,
                      const ConvAlgoPolicy *policy);
void conv2d_cuda_destroy(Conv2dCuda *c);
/* On the handle's stream (the bias kernels of f16 and bf16 run there too). */
void conv2d_forward_cuda(const Conv2dCuda *c, cudnnHandle_t h, const void *x, const void *w,
                         const void *b, void *y, void *workspace);
void conv2d_backward_ex_cuda(const Conv2dCuda *c, cudnnHandle_t h, const void *x, const void *w,
                             const void *dy, void *dx, void *dw, void *db, void *workspace,
                             int accumulate);
/* The direct path's forward (see conv2d.cu) with its output's batch-norm sums,
 * conv_genstats' epilogue: y as conv2d_forward_cuda's without bias, and
 * sum[o], sqsum[o] of y[..][o] as stored (rounded to the dtype) and of its
 * squares, fp32, added in a fixed order (the same bits every run). Only where
 * conv2d_direct_stats_bytes(c) > 0 (the shape fits the direct path, set up
 * under perf.conv_benchmark); workspace that many bytes, 8-byte aligned;
 * x, w, y 16-byte aligned. */
size_t conv2d_direct_stats_bytes(const Conv2dCuda *c);
void conv2d_forward_stats_cuda(const Conv2dCuda *c, cudnnHandle_t h, const void *x, const void *w, void *y,
                               float *sum, float *sqsum, void *workspace);

/* The bias gradient as conv2d_backward_cuda runs it for every case but NCHW
 * float32 (which keeps cudnnConvolutionBackwardBias): db[k] += the sum of dy
 * over channel k, dy [n][k][out_h][out_w] or, with nhwc, [n][out_h][out_w][k].
 * Summed in fp32 in a fixed order (deterministic, no atomics), in two passes
 * through per-block partial sums kept in workspace, which must hold
 * conv2d_bias_grad_workspace_bytes. */
size_t conv2d_bias_grad_workspace_bytes(int n, int k, int out_h, int out_w, int nhwc);
void conv2d_bias_grad_cuda(DType dtype, int nhwc, int n, int k, int out_h, int out_w,
                           const void *dy, void *db, void *workspace, cudaStream_t stream);
/* Its second pass alone, for ops that write their own partial sums ([rows][k]
 * fp32): db[k] += the sum of partials[0..rows)[k], in a fixed order. */
void conv2d_bias_grad_finish_cuda(DType dtype, const float *partials, int rows, int k, void *db,
                                  cudaStream_t stream);
/* The same on the CPU (NCHW float32), the sums conv2d_backward_cpu adds to db. */
void conv2d_bias_grad_cpu(const Conv2dShape *s, const float *dy, float *db);

#ifdef __cplusplus
}
#endif
#endif
