/* Spatial batch normalization, per channel c of x [n][c][h][w] (or, on the CUDA
 * path with nhwc, channels-last [n][h][w][c]), PyTorch's BatchNorm2d:
 *   training:  mean, var = the batch mean and BIASED variance of channel c over
 *              its n*h*w values; invstd = 1 / sqrt(var + eps)
 *              y = (x - mean) * invstd * gamma[c] + beta[c]
 *              running_mean = (1 - momentum) * running_mean + momentum * mean
 *              running_var  = (1 - momentum) * running_var  + momentum * var * m / (m - 1)
 *              (the UNBIASED variance, m = n*h*w; momentum 0 leaves both untouched,
 *              as when a checkpointed block is recomputed; NULL running buffers
 *              are skipped). save_mean and save_invstd [c] keep mean and invstd
 *              for the backward pass. m must be at least 2.
 *   eval:      y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta
 *   backward:  with xhat = (x - save_mean) * save_invstd,
 *              dbeta  += sum dy,  dgamma += sum dy * xhat   (over the channel)
 *              dx = gamma * invstd / m * (m * dy - sum dy - xhat * sum dy * xhat)
 *              dx is overwritten (accumulate_dx = 0) or added to (1: a tensor
 *              feeding two layers sums their gradients) and skipped when NULL;
 *              dgamma and dbeta are always ADDED to (flat gradient buffers
 *              accumulate micro-batches) and skipped when NULL. With
 *              accumulate_dx = 0, dx may alias dy.
 *   activation: the same followed by an activation, y = act(bn(x)):
 *              BN_ACT_RELU (NaN passes, as in relu.h): backward masks dy by
 *              y > 0 before the batch-norm backward; the CPU path takes that
 *              y where given (NULL: recomputed from x, beta and the saved
 *              statistics), the CUDA path always recomputes it, bit for bit
 *              as its forward stored it, and never reads y (one tensor less
 *              through memory, twice);
 *              BN_ACT_GELU, the exact (erf) GELU of gelu.h: backward needs no
 *              y (GELU is not monotonic) but recomputes z = xhat * gamma + beta
 *              from x and the saved statistics and takes dy * gelu'(z). On
 *              the CUDA path with dx overwritten (accumulate_dx = 0), the
 *              reduction pass writes dy * gelu'(z) (in the dtype) into dx and
 *              the apply pass reads it there, so gelu' runs once an element;
 *              BN_ACT_ADD_RELU, backward only: the ReLU after a residual add
 *              that the forward computed (BatchNormParams.residual, with
 *              BN_ACT_RELU): dy is masked by y > 0, y the add's output (read
 *              on both devices: without the residual it cannot be recomputed),
 *              and the masked dy is written to p->dy_masked, which may be dy
 *              itself: it is the add's gradient, which its other input takes
 *              too. The CUDA path masks and writes it in the reduction pass and
 *              the apply pass reads it there, so the add's ReLU backward needs
 *              no pass of its own. The results are relu_backward's, then the
 *              plain backward's, bit for bit.
 * The CPU reference is float32 NCHW and computes in double.
 *
 * The CUDA path stores x, y, dy and dx as the dtype given at init (f32, f16 or
 * bf16); gamma, beta, the running and saved statistics are fp32; dgamma and
 * dbeta are added into buffers of grad_dtype (f32, f16 or bf16: the model's
 * flat gradient buffer) after summing in fp32. It runs its own kernels rather
 * than cuDNN's batch-norm calls, which cuDNN 9 marks deprecated and which can
 * neither add dgamma/dbeta into a half buffer nor add into dx. Per call:
 *   forward:  a reduction pass (per-channel sums of x - k and (x - k)^2, k the
 *             channel's first value, so the variance does not cancel when
 *             |mean| >> std), then a pass writing y (BN_TRAIN_SAVED: that pass
 *             alone);
 *   backward: a reduction pass (sums of dy and dy * (x - mean)), then a pass
 *             writing dx (none when dx is NULL); a fused activation's
 *             derivative is applied to dy in both.
 * Each reduction writes per-block partial sums (each over a fixed share of a
 * channel, in a fixed order) and a small kernel adds each channel's partials
 * in a fixed order, in double: results are the same bits on every run, with no
 * atomics. Loads and stores are 16 bytes where the layout allows (NCHW: h*w a
 * multiple of 8 elements for f16/bf16, of 4 for f32; NHWC: c such a multiple;
 * every pointer 16-byte aligned), else one element a thread. Everything runs
 * on 'stream' (NULL: the stream of h), with no host sync and no allocation,
 * so calls can be captured in a CUDA graph. h is otherwise unused and may be
 * NULL when a stream is given.
 *
 * Synchronized (the *_sync_* calls, PyTorch's SyncBatchNorm): the training
 * forward and the backward of one layer spread over several processes, each
 * holding part of the batch. Each call makes per-channel sums over its own
 * values and hands them to 'reduce', which must add them over all processes
 * in place; the statistics (forward) and dx (backward) then come from the
 * sums of the global batch, m its count:
 *   forward:  sums of x and x^2 in double, each process's made from sums
 *             about its own shift (fp32 sums of x^2 would cancel where
 *             |mean| >> std). The running statistics take the global mean
 *             and unbiased variance: they stay the same on every process;
 *   backward: sums of dy' and dy' * (x - mean), dy' = dy through the
 *             activation's derivative (as above). dgamma and
 *             dbeta get the LOCAL sums (a data-parallel gradient all-reduce
 *             averages them afterwards); dx NULL needs no global sums and
 *             calls no reduce.
 * The global count must be at least 2. Every process must make the same calls
 * in the same order. With a reduce that leaves the sums alone (one process)
 * the results are those of the plain calls, up to rounding. */
#ifndef TRAINC_OPS_BATCHNORM_H
#define TRAINC_OPS_BATCHNORM_H

#include <math.h>
#include <stddef.h>

#include "ops/maxpool.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n, c, h, w;
} BatchNormShape;

/* Adds sums[0..n) over the processes, in place: host memory on the CPU path
 * (stream NULL), device memory on the CUDA path, ordered on 'stream' (no host
 * sync there, so that a CUDA graph can capture it). */
typedef void (*BnAllreduce)(void *ctx, double *sums, int n, cudaStream_t stream);

/* The CUDA path's state of one layer. */
typedef struct {
    BatchNormShape shape;
    DType dtype; /* of x, y, dy, dx */
    int nhwc;
    int rows;    /* partial sums per channel: the reductions' grid x */
    void *scratch;
    size_t scratch_bytes;
    int owns_scratch;
} BatchNormCuda;

/* ---- The face (op_context.h) ------------------------------------------ */

/* One batch norm on either device: ctx->dtype and ctx->nhwc on the GPU, where
 * dgamma and dbeta are of ctx->dtype too and init takes the layer's scratch
 * (scratch_bytes of it; none on the CPU). */
typedef struct {
    BatchNormShape shape;
    BatchNormCuda cuda; /* GPU only */
} BatchNorm;

/* The activation fused after the norm. */
typedef enum {
    BN_ACT_NONE,
    BN_ACT_RELU, /* backward masks by y > 0: the CPU reads y if given, the GPU recomputes it (needs beta) */
    BN_ACT_GELU, /* backward reads beta */
    BN_ACT_ADD_RELU /* backward only: the ReLU after the add a residual forward computed; reads y (the add's
                       output), writes the masked dy to p->dy_masked */
} BatchNormAct;

/* The ReLU's input where a convolution's prologue applies a batch norm + ReLU
 * (ops/conv_genstats.h, BatchNormParams.relu_coef): x * scale + bias in one
 * rounding, as the prologue's CPU and fallback paths compute it. */
static inline float bn_prologue_input(float x, float scale, float bias) { return fmaf(x, scale, bias); }

typedef enum {
    BN_EVAL,       /* normalise with the running statistics */
    BN_TRAIN,      /* with the batch's; update the running ones */
    BN_TRAIN_SYNC, /* with the global batch's, the sums added over the processes by reduce */
    BN_TRAIN_SAVED /* with the batch's, already in save_mean and save_invstd (bn_finalize of ops/conv_genstats.h,
                      from sums a convolution made of its output): forward is the apply pass alone and leaves the
                      running statistics to whoever saved them; backward is BN_TRAIN's */
} BatchNormMode;

/* One layer's per-channel fp32 buffers ([c] each, on ctx's device) and
 * settings. Training writes save_mean/save_invstd and updates the running
 * statistics by momentum (0: left alone, as when a checkpointed block is
 * recomputed); evaluation reads the running ones; backward reads gamma and
 * the saved ones. reduce and reduce_ctx serve BN_TRAIN_SYNC only. */
typedef struct {
    const float *gamma, *beta;
    float *running_mean, *running_var;
    float *save_mean, *save_invstd;
    float momentum, eps;
    BnAllreduce reduce;
    void *reduce_ctx;
    /* Forward only, NULL: none. Added before the activation, y = act(bn(x) +
     * residual), as x (dtype, layout): a residual block's add (and ReLU) in
     * the norm's pass. Backward is the norm's alone: the add's backward
     * passes dy on, its ReLU's mask reads this y. */
    const void *residual;
    /* Backward with BN_ACT_ADD_RELU only: where dy masked by y > 0 goes (dtype,
     * layout; may be dy itself). */
    void *dy_masked;
    /* Forward only, NULL: none. The max-pool after the norm (and its ReLU:
     * act BN_ACT_RELU or BN_ACT_NONE, no residual) in the norm's pass: y is
     * the pool's output, and the norm's own output is never stored. The pool
     * keeps its window positions for its maxpool_backward, whose dx is the
     * norm's dy, as after its own forward. The GPU takes it where
     * batchnorm_pool_supported says; the CPU composes the two. */
    const MaxPool2d *pool;
    /* Backward with BN_ACT_RELU, no y and not BN_TRAIN_SYNC only, NULL: none.
     * Where a convolution's prologue applied the norm and its ReLU
     * (ops/conv_genstats.h), its scale and bias ([2][c], the dtype): the
     * ReLU's mask is bn_prologue_input(x, scale[c], bias[c]) > 0 as that
     * prologue computed it (in the dtype's rounding on the GPU), not from the
     * saved statistics, so that the backward follows that forward. */
    const void *relu_coef;
} BatchNormParams;

/* Whether the forward takes a max-pool of this shape as p->pool: on the GPU
 * where the data is channels-last and the pool's own kernels take it (those
 * that keep window positions, ops/maxpool.h); on the CPU always. */
int batchnorm_pool_supported(const OpContext *ctx, const Pool2dShape *pool);

size_t batchnorm_scratch_bytes(const OpContext *ctx, const BatchNormShape *s);
void batchnorm_init(const OpContext *ctx, BatchNorm *bn, const BatchNormShape *s, void *scratch);
void batchnorm_destroy(const OpContext *ctx, BatchNorm *bn);
/* y = act(bn(x)). */
void batchnorm_forward(const OpContext *ctx, const BatchNorm *bn, BatchNormMode mode, BatchNormAct act,
                       const BatchNormParams *p, const void *x, void *y);
/* BN_TRAIN_SYNC: dx from the global sums (see above); any other mode: the
 * plain backward. act: the forward's (BN_ACT_ADD_RELU: see above); y is read
 * for BN_ACT_RELU on the CPU only, where given (NULL: recomputed from x, as
 * on the GPU), and for BN_ACT_ADD_RELU (otherwise it may be NULL), p->beta
 * for BN_ACT_RELU and BN_ACT_GELU. */
void batchnorm_backward(const OpContext *ctx, const BatchNorm *bn, BatchNormMode mode, BatchNormAct act,
                        const BatchNormParams *p, const void *x, const void *y, const void *dy,
                        void *dx, int accumulate_dx, void *dgamma, void *dbeta);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* CPU reference (float32, NCHW) */
void batchnorm_forward_train_cpu(const BatchNormShape *s, const float *x, const float *gamma,
                                 const float *beta, float momentum, float eps, float *running_mean,
                                 float *running_var, float *save_mean, float *save_invstd,
                                 float *y);
void batchnorm_forward_eval_cpu(const BatchNormShape *s, const float *x, const float *gamma,
                                const float *beta, const float *running_mean,
                                const float *running_var, float eps, float *y);
void batchnorm_backward_cpu(const BatchNormShape *s, const float *x, const float *dy,
                            const float *gamma, const float *save_mean, const float *save_invstd,
                            float *dx, int accumulate_dx, float *dgamma, float *dbeta);

/* With a fused activation (BN_ACT_NONE: the plain calls above). */
void batchnorm_act_forward_train_cpu(const BatchNormShape *s, BatchNormAct act, const float *x,
                                     const float *gamma, const float *beta, float momentum, float eps,
                                     float *running_mean, float *running_var, float *save_mean,
                                     float *save_invstd, float *y);
void batchnorm_act_forward_eval_cpu(const BatchNormShape *s, BatchNormAct act, const float *x,
                                    const float *gamma, const float *beta, const float *running_mean,
                                    const float *running_var, float eps, float *y);
/* y: read for BN_ACT_RELU only (NULL: recomputed from x and beta); beta: for
 * BN_ACT_GELU, and for BN_ACT_RELU without y. */
void batchnorm_act_backward_cpu(const BatchNormShape *s, BatchNormAct act, const float *x,
                                const float *y, const float *dy, const float *gamma,
                                const float *beta, const float *save_mean, const float *save_invstd,
                                float *dx, int accumulate_dx, float *dgamma, float *dbeta);

/* Synchronized; act: the fused activation (backward reads y and beta as
 * batchnorm_act_backward_cpu does). */
void batchnorm_forward_train_sync_cpu(const BatchNormShape *s, const float *x, const float *gamma,
                                      const float *beta, float momentum, float eps,
                                      float *running_mean, float *running_var, float *save_mean,
                                      float *save_invstd, float *y, BnAllreduce reduce, void *ctx,
                                      BatchNormAct act);
void batchnorm_backward_sync_cpu(const BatchNormShape *s, const float *x, const float *y,
                                 const float *dy, const float *gamma, const float *beta,
                                 const float *save_mean, const float *save_invstd, float *dx,
                                 int accumulate_dx, float *dgamma, float *dbeta, BnAllreduce reduce,
                                 void *ctx, BatchNormAct act);

/* CUDA (the layer's state in BatchNormCuda above) */

/* The scratch one layer of this shape needs, in any dtype: partial sums,
 * per-channel coefficients and the synchronized calls' sums (3 x c doubles),
 * a few kB in NCHW, in NHWC at most 1/16 of an f16 tensor (1/128 at c = 64). */
size_t batchnorm_cuda_scratch_bytes(const BatchNormShape *s, int nhwc);
/* Allocates the layer's scratch (cudaMalloc); destroy frees it. */
void batchnorm_cuda_init(BatchNormCuda *bn, cudnnHandle_t h, const BatchNormShape *s, DType dtype,
                         int nhwc);
/* Uses the caller's scratch instead (an arena's, say), 16-byte aligned and of
 * at least batchnorm_cuda_scratch_bytes; its contents need no initial value.
 * Scratch holds nothing from one call to the next, so layers whose calls run
 * one after another on one stream may share one buffer of the largest size. */
void batchnorm_cuda_init_scratch(BatchNormCuda *bn, const BatchNormShape *s, DType dtype, int nhwc,
                                 void *scratch);
void batchnorm_cuda_destroy(BatchNormCuda *bn);

void batchnorm_forward_train_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                                  const float *gamma, const float *beta, float momentum, float eps,
                                  float *running_mean, float *running_var, float *save_mean,
                                  float *save_invstd, void *y, cudaStream_t stream);
void batchnorm_forward_eval_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                                 const float *gamma, const float *beta, const float *running_mean,
                                 const float *running_var, float eps, void *y, cudaStream_t stream);
void batchnorm_backward_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                             const void *dy, const float *gamma, const float *save_mean,
                             const float *save_invstd, void *dx, int accumulate_dx, void *dgamma,
                             void *dbeta, DType grad_dtype, cudaStream_t stream);

/* With a fused activation; y and beta as batchnorm_act_backward_cpu's;
 * residual (NULL: none): y = act(bn(x) + residual), residual as x; pool
 * (NULL: none): y = maxpool(act(bn(x))) (BatchNormParams.pool). */
void batchnorm_act_forward_train_cuda(const BatchNormCuda *bn, cudnnHandle_t h, BatchNormAct act,
                                      const void *x, const float *gamma, const float *beta,
                                      float momentum, float eps, float *running_mean,
                                      float *running_var, float *save_mean, float *save_invstd,
                                      void *y, const void *residual, const MaxPoolCuda *pool,
                                      cudaStream_t stream);
void batchnorm_act_forward_eval_cuda(const BatchNormCuda *bn, cudnnHandle_t h, BatchNormAct act,
                                     const void *x, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var,
                                     float eps, void *y, const void *residual, const MaxPoolCuda *pool,
                                     cudaStream_t stream);
/* BN_TRAIN_SAVED: the apply pass alone, its coefficients made from the saved
 * statistics as the training forward makes them (its ReLU's backward
 * recomputes y from them). */
void batchnorm_act_forward_saved_cuda(const BatchNormCuda *bn, cudnnHandle_t h, BatchNormAct act,
                                      const void *x, const float *gamma, const float *beta,
                                      const float *save_mean, const float *save_invstd, void *y,
                                      const void *residual, const MaxPoolCuda *pool, cudaStream_t stream);
/* y and dy_masked: BN_ACT_ADD_RELU's (otherwise unused; y is recomputed for
 * BN_ACT_RELU); relu_coef: BatchNormParams'. */
void batchnorm_act_backward_cuda(const BatchNormCuda *bn, cudnnHandle_t h, BatchNormAct act,
                                 const void *x, const void *y, const void *dy, void *dy_masked,
                                 const float *gamma, const float *beta, const void *relu_coef,
                                 const float *save_mean, const float *save_invstd, void *dx, int accumulate_dx,
                                 void *dgamma, void *dbeta, DType grad_dtype, cudaStream_t stream);

/* Synchronized: 'reduce' gets the 3 x c sums in the layer's scratch, on the
 * call's stream. */
void batchnorm_forward_train_sync_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                                       const float *gamma, const float *beta, float momentum,
                                       float eps, float *running_mean, float *running_var,
                                       float *save_mean, float *save_invstd, void *y,
                                       const void *residual, const MaxPoolCuda *pool, cudaStream_t stream,
                                       BnAllreduce reduce, void *ctx, BatchNormAct act);
void batchnorm_backward_sync_cuda(const BatchNormCuda *bn, cudnnHandle_t h, const void *x,
                                  const void *y, const void *dy, void *dy_masked, const float *gamma,
                                  const float *beta, const float *save_mean,
                                  const float *save_invstd, void *dx, int accumulate_dx,
                                  void *dgamma, void *dbeta, DType grad_dtype, cudaStream_t stream,
                                  BnAllreduce reduce, void *ctx, BatchNormAct act);

#ifdef __cplusplus
}
#endif
#endif
