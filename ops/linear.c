#include "ops/linear.h"

#include "ops/gemm_cpu.h"

void linear_forward_cpu(const LinearShape *s, const float *x, const float *w, const float *b,
                        float *y) {
    /* y[n][out] = x[n][in] * w[out][in]^T */
    cpu_sgemm(0, 1, s->n, s->out, s->in, 1.0f, x, s->in, w, s->in, 0.0f, y, s->out);
    if (!b) return;
    for (int i = 0; i < s->n; i++) {
        float *y_row = y + (size_t)i * s->out;
        for (int j = 0; j < s->out; j++) y_row[j] += b[j];
    }
}

void linear_backward_cpu(const LinearShape *s, const float *x, const float *w, const float *dy,
                         float *dx, float *dw, float *db) {
    /* dx[n][in] = dy[n][out] * w[out][in] */
    if (dx) cpu_sgemm(0, 0, s->n, s->in, s->out, 1.0f, dy, s->out, w, s->in, 0.0f, dx, s->in);
    /* dw[out][in] += dy[n][out]^T * x[n][in] */
    cpu_sgemm(1, 0, s->out, s->in, s->n, 1.0f, dy, s->out, x, s->in, 1.0f, dw, s->in);
    if (!db) return;
    for (int i = 0; i < s->n; i++) {
        const float *dy_row = dy + (size_t)i * s->out;
        for (int j = 0; j < s->out; j++) db[j] += dy_row[j];
    }
}

void linear_forward(const OpContext *ctx, const LinearShape *s, const void *x, const void *w, const void *b,
                    void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) linear_forward_cpu(s, x, w, b, y);
    else GPU_ONLY(linear_forward_cuda(ctx->cublas, ctx->stream, s, ctx->dtype, x, w, b, y));
    op_end(ctx, __func__);
}

void linear_backward(const OpContext *ctx, const LinearShape *s, const void *x, const void *w, const void *dy,
                     void *dx, void *dw, void *db) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) linear_backward_cpu(s, x, w, dy, dx, dw, db);
    else GPU_ONLY(linear_backward_cuda(ctx->cublas, ctx->stream, s, ctx->dtype, x, w, dy, dx, dw, db));
    op_end(ctx, __func__);
}
