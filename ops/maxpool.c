#include "ops/maxpool.h"

#include <string.h>

int pool2d_window(const Pool2dShape *s) { return s->k ? s->k : 2; }
int pool2d_stride(const Pool2dShape *s) { return s->stride ? s->stride : pool2d_window(s); }
int pool2d_out_h(const Pool2dShape *s) { return (s->h + 2 * s->pad - pool2d_window(s)) / pool2d_stride(s) + 1; }
int pool2d_out_w(const Pool2dShape *s) { return (s->w + 2 * s->pad - pool2d_window(s)) / pool2d_stride(s) + 1; }

/* Offset (within the plane) of the largest element of the window at output
 * (p, q): the first one in row-major window order on ties, as cuDNN picks;
 * padding is outside the plane and never picked. */
static size_t window_argmax(const Pool2dShape *s, const float *plane, int p, int q) {
    int k = pool2d_window(s), stride = pool2d_stride(s);
    size_t best = (size_t)-1;
    for (int r = 0; r < k; r++) {
        int i = p * stride - s->pad + r;
        if (i < 0 || i >= s->h) continue;
        for (int c = 0; c < k; c++) {
            int j = q * stride - s->pad + c;
            if (j < 0 || j >= s->w) continue;
            size_t at = (size_t)i * s->w + j;
            if (best == (size_t)-1 || plane[at] > plane[best]) best = at;
        }
    }
    return best;
}

void maxpool_forward_cpu(const Pool2dShape *s, const float *x, float *y) {
    int out_h = pool2d_out_h(s), out_w = pool2d_out_w(s);
    size_t planes = (size_t)s->n * s->c;
    for (size_t pl = 0; pl < planes; pl++) {
        const float *x_plane = x + pl * s->h * s->w;
        float *y_plane = y + pl * out_h * out_w;
        for (int p = 0; p < out_h; p++)
            for (int q = 0; q < out_w; q++)
                y_plane[p * out_w + q] = x_plane[window_argmax(s, x_plane, p, q)];
    }
}

/* Routes each output gradient by the argmax of x; y is not needed for that. */
void maxpool_backward_cpu(const Pool2dShape *s, const float *x, const float *y, const float *dy, float *dx) {
    int out_h = pool2d_out_h(s), out_w = pool2d_out_w(s);
    size_t planes = (size_t)s->n * s->c;
    memset(dx, 0, sizeof(float) * planes * s->h * s->w);
    for (size_t pl = 0; pl < planes; pl++) {
        const float *x_plane = x + pl * s->h * s->w;
        const float *dy_plane = dy + pl * out_h * out_w;
        float *dx_plane = dx + pl * s->h * s->w;
        for (int p = 0; p < out_h; p++)
            for (int q = 0; q < out_w; q++)
                dx_plane[window_argmax(s, x_plane, p, q)] += dy_plane[p * out_w + q];
    }
}

size_t maxpool_scratch_bytes(const OpContext *ctx, const Pool2dShape *s) {
    size_t bytes = 0;
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(bytes = maxpool_cuda_index_bytes(s, ctx->dtype, ctx->nhwc));
    return bytes;
}

void maxpool_init(const OpContext *ctx, MaxPool2d *p, const Pool2dShape *s, void *scratch) {
    Pool2dShape shape = *s; /* s may be p's own */
    memset(p, 0, sizeof *p);
    p->shape = shape;
    if (ctx->device == DEVICE_CUDA)
        GPU_ONLY(maxpool_cuda_init(&p->cuda, &shape, ctx->dtype, ctx->nhwc, scratch));
}

void maxpool_destroy(const OpContext *ctx, MaxPool2d *p) {
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(maxpool_cuda_destroy(&p->cuda));
}

void maxpool_forward(const OpContext *ctx, const MaxPool2d *p, const void *x, void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) maxpool_forward_cpu(&p->shape, x, y);
    else GPU_ONLY(maxpool_forward_cuda(&p->cuda, ctx->cudnn, x, y));
    op_end(ctx, __func__);
}

void maxpool_backward(const OpContext *ctx, const MaxPool2d *p, const void *x, const void *y, const void *dy,
                      void *dx) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) maxpool_backward_cpu(&p->shape, x, y, dy, dx);
    else GPU_ONLY(maxpool_backward_cuda(&p->cuda, ctx->cudnn, x, y, dy, dx));
    op_end(ctx, __func__);
}
