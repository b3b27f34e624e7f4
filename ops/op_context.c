#include "ops/op_context.h"

#include <string.h>

#include "ops/backend_graph.h"
#include "runtime/check.h"
#include "runtime/gpu.h"

OpContext op_context_cpu(void) {
    OpContext ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.device = DEVICE_CPU;
    ctx.dtype = DTYPE_F32;
    return ctx;
}

OpContext op_context_gpu(const GpuContext *g, DType dtype, int nhwc) {
    OpContext ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.device = DEVICE_CUDA;
    ctx.dtype = dtype;
    ctx.nhwc = nhwc;
    ctx.stream = g->compute;
    ctx.cudnn = g->cudnn;
    ctx.cublas = g->cublas;
    return ctx;
}

/* The moves on the device are ops to the hooks too (an add's backward copies). */
void op_copy(const OpContext *ctx, void *dst, const void *src, size_t bytes) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) memmove(dst, src, bytes);
    else gpu_copy_on_device(dst, src, bytes, ctx->stream);
    op_end(ctx, __func__);
}

void op_fill(const OpContext *ctx, void *dst, int byte, size_t bytes) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) memset(dst, byte, bytes);
    else gpu_fill(dst, byte, bytes, ctx->stream);
    op_end(ctx, __func__);
}

void op_fill_random(const OpContext *ctx, void *dst, size_t bytes) {
    if (ctx->device == DEVICE_CPU) TC_FATAL("op_fill_random: the GPU's (the CPU times nothing)");
    op_begin(ctx, __func__);
    GPU_ONLY(backend_graph_fill_scratch(ctx->cudnn, dst, bytes));
    op_end(ctx, __func__);
}

void op_copy_from_host(const OpContext *ctx, void *dst, const void *host, size_t bytes) {
    if (ctx->device == DEVICE_CPU) memmove(dst, host, bytes);
    else gpu_copy_to_device(dst, host, bytes, ctx->stream);
}

void op_copy_to_host(const OpContext *ctx, void *host, const void *src, size_t bytes) {
    if (ctx->device == DEVICE_CPU) memmove(host, src, bytes);
    else gpu_copy_to_host(host, src, bytes, ctx->stream);
}

void op_sync(const OpContext *ctx) {
    if (ctx->device == DEVICE_CUDA) gpu_sync(ctx->stream);
}
