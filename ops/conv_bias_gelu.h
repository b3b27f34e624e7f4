/* A small direct convolution, its bias and the GELU after it in one pass:
 *   y = GELU(conv(x, w) + b)
 * with GELU the exact (erf) form of ops/gelu_math.h, for airbench's whitening
 * layer (a 2x2 convolution over the image whose weights never train). Stride
 * 1 and no padding only; any other shape is refused naming it.
 * Backward is for the bias alone (the weights never train and x is the data):
 *   db += sum over n, h, w of dy * GELU'(z),  z = conv(x, w) + b
 * recomputing z from x, which is a few channels and far cheaper to read than
 * z itself; db is ADDED to, as conv2d's bias gradient is.
 * The CPU path is float32, NCHW (conv2d_forward_cpu and the GELU in double).
 * The CUDA path stores x, w, b, y, dy and db as the context's dtype (f32, f16
 * or bf16), NCHW or channels-last as conv2d.h's (x, y [n][h][w][c], w
 * [k][r][s][c]), computes in fp32 and rounds once. Channels-last with x's
 * channels filling 16-byte loads and k filling 16-byte stores (the model's
 * padded input) takes one thread per output pixel that reads its window once
 * and writes every channel of y at once, the weights in shared memory, for
 * 2x2 filters over 3 or 8 real channels and 3x3 ones over 8; every other
 * shape takes a plain kernel. The bias
 * gradient is summed in fp32 in a fixed order (per-block partial sums in the
 * workspace, then conv2d's finishing pass): deterministic, no atomics. */
#ifndef TRAINC_OPS_CONV_BIAS_GELU_H
#define TRAINC_OPS_CONV_BIAS_GELU_H

#include <stddef.h>

#include "ops/conv2d.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x's channels from c_real on are taken as zeros (the model's input padded
 * to 8 channels under NHWC): neither read nor multiplied, whatever x and w
 * hold there. */
typedef struct {
    Conv2dShape conv; /* n, c (as x is stored), h, w, k, r, s, pad 0, stride 1 */
    int c_real;       /* 1 to c */
} ConvBiasGeluShape;

/* The face (op_context.h): x, w, b, y, dy and db of ctx->dtype in ctx's
 * layout, 16-byte aligned for the fast kernel (else the plain one runs);
 * backward needs ctx->workspace of workspace_bytes (0 on the CPU). */
size_t conv_bias_gelu_workspace_bytes(const OpContext *ctx, const ConvBiasGeluShape *s);
void conv_bias_gelu_forward(const OpContext *ctx, const ConvBiasGeluShape *s, const void *x, const void *w,
                            const void *b, void *y);
void conv_bias_gelu_backward(const OpContext *ctx, const ConvBiasGeluShape *s, const void *x, const void *w,
                             const void *b, const void *dy, void *db);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* Fails naming the shape unless it is one the op takes (stride 1, no padding, 1 <= c_real <= c). */
void conv_bias_gelu_check_shape(const ConvBiasGeluShape *s);
/* Threads per block of the CUDA kernels. */
#define CONV_BIAS_GELU_THREADS 256
/* Rows of partial sums the CUDA backward writes (k floats each): a function of the shape alone. */
int conv_bias_gelu_partial_rows(const ConvBiasGeluShape *s);

void conv_bias_gelu_forward_cpu(const ConvBiasGeluShape *s, const float *x, const float *w, const float *b,
                                float *y);
void conv_bias_gelu_backward_cpu(const ConvBiasGeluShape *s, const float *x, const float *w, const float *b,
                                 const float *dy, float *db);

void conv_bias_gelu_forward_cuda(DType dtype, int nhwc, const ConvBiasGeluShape *s, const void *x, const void *w,
                                 const void *b, void *y, cudaStream_t stream);
void conv_bias_gelu_backward_cuda(DType dtype, int nhwc, const ConvBiasGeluShape *s, const void *x, const void *w,
                                  const void *b, const void *dy, void *db, void *workspace, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
