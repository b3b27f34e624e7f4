/* Where an op runs: the device, and on the GPU the dtype, layout, stream and
 * library handles its CUDA path takes. Each op's face (relu_forward,
 * conv2d_forward, sgd_step_mixed, ...; in the op's own header, beside its
 * _cpu and _cuda functions) takes an OpContext and calls the path of its
 * device, so that a caller makes one call per op on either device. On the CPU
 * every buffer is host memory and float32 (dtype F32, NCHW); in a build
 * without CUDA a CUDA context is refused (runtime/gpu.h's GPU_ONLY).
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

typedef struct {
    DeviceKind device;
    DType dtype;          /* activations, their gradients and the weights the layers read */
    int nhwc;             /* activations channels-last (GPU only) */
    cudaStream_t stream;  /* GPU: where every op runs */
    cudnnHandle_t cudnn;  /* GPU: bound to stream */
    cublasHandle_t cublas;/* GPU: bound to stream */
    void *workspace;      /* GPU: the convolutions' shared cuDNN workspace */
} OpContext;

/* The CPU: float32, NCHW. */
OpContext op_context_cpu(void);
/* The GPU of g, its compute stream and handles; no workspace yet. */
OpContext op_context_gpu(const GpuContext *g, DType dtype, int nhwc);

/* dst = src, bytes bytes, both on the context's device. */
void op_copy(const OpContext *ctx, void *dst, const void *src, size_t bytes);
/* Every byte of dst set to 'byte'. */
void op_fill(const OpContext *ctx, void *dst, int byte, size_t bytes);
/* Between host memory and the context's device. */
void op_copy_from_host(const OpContext *ctx, void *dst, const void *host, size_t bytes);
void op_copy_to_host(const OpContext *ctx, void *host, const void *src, size_t bytes);
/* Waits for everything issued so far (nothing to wait for on the CPU). */
void op_sync(const OpContext *ctx);

#ifdef __cplusplus
}
#endif
#endif
