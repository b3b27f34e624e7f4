/* Where an op runs: the device, and on the GPU the dtype, layout, stream and
 * library handles its CUDA path takes. Each op's face (relu_forward,
 * conv2d_forward, sgd_step_mixed, ...; first in the op's own header, above
 * the _cpu and _cuda paths it picks from) takes an OpContext and calls the
 * path of its device, so that a caller makes one call per op on either device. On the CPU
 * every buffer is host memory and float32 (dtype F32, NCHW); in a build
 * without CUDA a CUDA context is refused (runtime/gpu.h's GPU_ONLY).
 *
 * Every face calls op_begin before its work and op_end after it, and so do
 * op_copy and op_fill: the hooks below see each op (a profiler's events, the
 * model's NVTX ranges).
 *
 * The op_* functions below are the memory moves around ops, on the context's
 * stream on the GPU (ordered with the ops, not waited for unless op_sync). */
#ifndef TRAINC_OPS_OP_CONTEXT_H
#define TRAINC_OPS_OP_CONTEXT_H

#include <stddef.h>

#include "runtime/dtype.h"
#include "runtime/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct OpContext OpContext;

/* Called around each op a face runs: op is the face's name ("conv2d_forward"),
 * label the context's label then (a model's layer, "conv 3"; NULL outside the
 * layers), ctx the context (its stream on the GPU). On the GPU the op's work
 * is queued, not done, when end is called: a hook that times ops records
 * events on ctx->stream. A face calls no other face, so begin and end pair up
 * without nesting. */
typedef struct {
    void (*begin)(void *user, const OpContext *ctx, const char *op, const char *label);
    void (*end)(void *user, const OpContext *ctx, const char *op, const char *label);
    void *user;
} OpHooks;

struct OpContext {
    DeviceKind device;
    DType dtype;          /* activations, their gradients and the weights the layers read */
    int nhwc;             /* activations channels-last (GPU only) */
    cudaStream_t stream;  /* GPU: where every op runs */
    cudnnHandle_t cudnn;  /* GPU: bound to stream */
    cublasHandle_t cublas;/* GPU: bound to stream */
    void *workspace;      /* GPU: the convolutions' shared cuDNN workspace */
    const OpHooks *hooks; /* NULL: none */
    const char *label;    /* what the ops run for, passed to the hooks (a model sets its layer's name) */
};

/* The CPU: float32, NCHW. */
OpContext op_context_cpu(void);
/* The GPU of g, its compute stream and handles; no workspace yet. */
OpContext op_context_gpu(const GpuContext *g, DType dtype, int nhwc);

/* Around each face's work: one branch when no hook is installed. */
static inline void op_begin(const OpContext *ctx, const char *op) {
    if (ctx->hooks) ctx->hooks->begin(ctx->hooks->user, ctx, op, ctx->label);
}

static inline void op_end(const OpContext *ctx, const char *op) {
    if (ctx->hooks) ctx->hooks->end(ctx->hooks->user, ctx, op, ctx->label);
}

/* dst = src, bytes bytes, both on the context's device (an op to the hooks). */
void op_copy(const OpContext *ctx, void *dst, const void *src, size_t bytes);
/* Every byte of dst set to 'byte' (an op to the hooks). */
void op_fill(const OpContext *ctx, void *dst, int byte, size_t bytes);
/* GPU only: dst filled with fp16 words uniform in [-1, 1), finite read as any
 * float type: data like a step's, for timing kernels at start-up (ops/backend_graph.h
 * says why not zeros). */
void op_fill_random(const OpContext *ctx, void *dst, size_t bytes);
/* Between host memory and the context's device. */
void op_copy_from_host(const OpContext *ctx, void *dst, const void *host, size_t bytes);
void op_copy_to_host(const OpContext *ctx, void *host, const void *src, size_t bytes);
/* Waits for everything issued so far (nothing to wait for on the CPU). */
void op_sync(const OpContext *ctx);

#ifdef __cplusplus
}
#endif
#endif
