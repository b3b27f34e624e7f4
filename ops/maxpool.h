/* Max-pool, NCHW; the CUDA path also NHWC. 2x2 stride 2 unless the shape
 * names another window (k x k, stride, zero padding that never wins: ResNet's
 * 3x3 stride-2 pad-1 stem pool; k = stride = the map's side: a global max).
 * An odd size leaves out its last row or column (PyTorch's floor mode). Backward routes each output
 * gradient to the first maximum of its window (the one cuDNN picks), adding
 * where windows overlap; dx is overwritten. The CPU path is float32; the CUDA path stores x, y, dy and dx
 * as the dtype given at init (f32, f16 or bf16), which is exact: a selection.
 *
 * The CUDA path's channels-last pools with k at most 15 and a stride of at
 * most k (the 2x2 stride-2 pools, a global max, ResNet's stem pool; whole
 * 16-byte vectors of channels a pixel) run kernels of their own, whose
 * forward also writes, a byte per output element, where in its window the
 * first maximum lies (0..k*k-1 in row-major order; k*k where every element is
 * NaN), into the layer's scratch; backward then reads dy and those bytes, not
 * x and y, and writes all of dx (0 where no maximum was; where windows
 * overlap, each element's gradients added in fp32 in the outputs' row-major
 * order, the CPU reference's, and rounded once). So a backward takes
 * the positions of the last forward of the same MaxPool2d: a forward of it on
 * other inputs in between (not a recompute of the same) gives the wrong dx. */
#ifndef TRAINC_OPS_MAXPOOL_H
#define TRAINC_OPS_MAXPOOL_H

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The input; k, stride and pad 0 mean 2, k and 0. */
typedef struct { int n, c, h, w; int k, stride, pad; } Pool2dShape;
int pool2d_window(const Pool2dShape *s);
int pool2d_stride(const Pool2dShape *s);
int pool2d_out_h(const Pool2dShape *s);
int pool2d_out_w(const Pool2dShape *s);

/* The CUDA path's state of one max-pool (cuDNN descriptors). */
typedef struct {
    Pool2dShape shape;
    DType dtype;
    int nhwc;               /* x, y and their gradients are [n][h][w][c] */
    int vectorized;         /* the channels-last kernels take the shape (see above) */
    int overlap;            /* ...through those for windows that overlap or take padding */
    unsigned char *indices; /* vectorized: laid out as y, each element's window position from the last
                               forward (0..k*k-1 row-major, k*k: every element NaN); NULL: forward only */
    cudnnPoolingDescriptor_t pool_desc;
    cudnnTensorDescriptor_t x_desc, y_desc;
} MaxPoolCuda;

/* The face (op_context.h): one max-pool on either device, ctx->dtype and
 * ctx->nhwc on the GPU (init makes its cuDNN descriptors there). init takes
 * the layer's own scratch, 16-byte aligned, of maxpool_scratch_bytes (the
 * window positions above; 0 on the CPU and on cuDNN's paths, where scratch
 * is not used); scratch NULL where bytes > 0 makes a forward-only pool
 * (inference), whose backward fails. */
typedef struct {
    Pool2dShape shape;
    MaxPoolCuda cuda; /* GPU only */
} MaxPool2d;

size_t maxpool_scratch_bytes(const OpContext *ctx, const Pool2dShape *s);
void maxpool_init(const OpContext *ctx, MaxPool2d *p, const Pool2dShape *s, void *scratch);
void maxpool_destroy(const OpContext *ctx, MaxPool2d *p);
void maxpool_forward(const OpContext *ctx, const MaxPool2d *p, const void *x, void *y);
void maxpool_backward(const OpContext *ctx, const MaxPool2d *p, const void *x, const void *y, const void *dy,
                      void *dx);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void maxpool_forward_cpu(const Pool2dShape *s, const float *x, float *y);
void maxpool_backward_cpu(const Pool2dShape *s, const float *x, const float *y, const float *dy, float *dx);

/* The window positions' bytes: n x out_h x out_w x c where the channels-last
 * kernels take the shape, else 0. */
size_t maxpool_cuda_index_bytes(const Pool2dShape *s, DType dtype, int nhwc);
/* indices: index_bytes of them, 16-byte aligned, or NULL (forward only). */
void maxpool_cuda_init(MaxPoolCuda *p, const Pool2dShape *s, DType dtype, int nhwc, void *indices);
void maxpool_cuda_destroy(MaxPoolCuda *p);

void maxpool_forward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x, void *y);
/* Batch norm's apply pass and the pool in one (BatchNormParams.pool, ops/batchnorm.h): the pool of
 * z = act(fma(x - mean, scale, shift)), rounded to the dtype as batch norm stores it, per channel from
 * coef (device, [c][4]: mean, scale, shift, unused); act ReLU (relu 1) or none. z is never stored. Only
 * where the channels-last kernels take the pool, with 16-byte aligned x and y (else it fails). */
void maxpool_forward_bn_cuda(const MaxPoolCuda *p, const void *x, const float *coef, int relu, void *y,
                             cudaStream_t stream);
void maxpool_backward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x, const void *y, const void *dy,
                           void *dx);

#ifdef __cplusplus
}
#endif
#endif
