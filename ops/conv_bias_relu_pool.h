/* A network's first convolution block in one op: a 3x3 convolution (pad 1,
 * stride 1) of the input image, its bias, ReLU and a 2x2 stride-2 max-pool,
 *
 *     y = maxpool2x2(relu(conv3x3(x, w) + b))
 *
 * where x is the data, so no gradient wrt x is taken. The convolution's
 * output, the largest tensor of such a net (SimpleNet-224: 64 channels at
 * 224x224), never reaches memory: forward writes only y, and backward takes
 * each window's maximum again from x (a recompute costs a few FLOPs per byte
 * of the 3-channel input) to route dy into the filter and bias gradients.
 *
 * Backward adds to dw (w's layout) and db (k values); the window's
 * gradient goes to its first maximum of conv + b, in the order top left, top
 * right, bottom left, bottom right, where that maximum is positive; what
 * conv2d, then bias_relu_pool, then their backwards give.
 *
 * The CPU path is the reference: float32, NCHW (x [n][c][h][w], w
 * [k][c][3][3]), conv2d's then bias_relu_pool's, through a buffer for the
 * convolution's output. The CUDA path: f16 or bf16, NHWC (x [n][h][w][c],
 * w [k][3][3][c]) with c = 8 (the input padded as cast_nchw_to_nhwc pads it)
 * of which the first c_real (at most 3) carry data: the other channels of x
 * and w are never read, and dw there is left as it is. Tensor-core MMAs with
 * fp32 accumulation; conv + b is compared in fp32 and y rounded once; x, y
 * and dy 16-byte aligned. k a multiple of 8, at most 64; h and w even.
 * Backward sums per block in registers, then the blocks' partial sums in a
 * fixed order: deterministic, no atomics. */
#ifndef TRAINC_OPS_CONV_BIAS_RELU_POOL_H
#define TRAINC_OPS_CONV_BIAS_RELU_POOL_H

#include <stddef.h>

#include "ops/conv2d.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Conv2dShape conv; /* n, c, h, w, k; r = s = 3, pad 1, stride 1 */
    int c_real;       /* channels of x that carry data (= c on the CPU) */
} ConvBiasReluPoolShape;

/* 1 when ctx's path takes the shape: on the GPU f16 or bf16, NHWC, c = 8,
 * c_real <= 3, k a multiple of 8 up to 64, h and w even; on the CPU any
 * 3x3/pad 1/stride 1 shape over an even size with c_real = c. why (may be
 * NULL) says what does not fit. */
int conv_bias_relu_pool_supported(const OpContext *ctx, const ConvBiasReluPoolShape *s, const char **why);
/* Bytes of ctx->workspace backward needs (its blocks' partial sums); 0 on the CPU. */
size_t conv_bias_relu_pool_workspace_bytes(const OpContext *ctx, const ConvBiasReluPoolShape *s);

/* The face (op_context.h). Fails naming the shape where it is not supported. */
void conv_bias_relu_pool_forward(const OpContext *ctx, const ConvBiasReluPoolShape *s, const void *x,
                                 const void *w, const void *b, void *y);
void conv_bias_relu_pool_backward(const OpContext *ctx, const ConvBiasReluPoolShape *s, const void *x,
                                  const void *w, const void *b, const void *dy, void *dw, void *db);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void conv_bias_relu_pool_forward_cpu(const ConvBiasReluPoolShape *s, const float *x, const float *w,
                                     const float *b, float *y);
void conv_bias_relu_pool_backward_cpu(const ConvBiasReluPoolShape *s, const float *x, const float *w,
                                      const float *b, const float *dy, float *dw, float *db);
size_t conv_bias_relu_pool_workspace_bytes_cuda(const ConvBiasReluPoolShape *s);
/* On stream; no allocation and no sync (CUDA graphs capture them). */
void conv_bias_relu_pool_forward_cuda(DType dtype, const ConvBiasReluPoolShape *s, const void *x, const void *w,
                                      const void *b, void *y, cudaStream_t stream);
void conv_bias_relu_pool_backward_cuda(DType dtype, const ConvBiasReluPoolShape *s, const void *x, const void *w,
                                       const void *b, const void *dy, void *dw, void *db, void *workspace,
                                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
