/* Space-to-depth of a channels-last image: each block x block square of
 * pixels becomes one pixel holding the square's block^2 pixels one after
 * another, each as group channels,
 *
 *     y[n][i][j][(a*block + b)*group + ch] = x[n][block*i + a - pad][block*j + b - pad][ch]
 *
 * for ch < c_used; 0 where ch >= c_used or the pixel lies outside x (the
 * top and left pad rows, and whatever out_h and out_w reach past the bottom
 * and right). x's channels from c_used on are never read. A stride-2
 * convolution over an image of few channels then runs as a stride-1 one over
 * four times as many (ResNet's 7x7 stride-2 stem, 3 channels padded to 8, as
 * a 4x4 convolution over 16): the tensor cores' shape. The filters take the
 * same map ([k][r][s][c] read as k images of r x s). With block 1 and pad 0
 * it copies out the c_used channels that carry data (group of them).
 *
 * backward is its transpose, added: dx[n][p][q][ch] += the one element of dy
 * that x[n][p][q][ch] went to, for ch < c_used (a filter gradient folded back
 * into the filter's layout); dx's other channels are left as they are.
 * The CPU path is float32; the CUDA path stores x and y as the dtype (f32,
 * f16 or bf16), moving values unchanged, and backward adds in float, rounding
 * once. */
#ifndef TRAINC_OPS_SPACE_TO_DEPTH_H
#define TRAINC_OPS_SPACE_TO_DEPTH_H

#include <stddef.h>

#include "ops/conv2d.h"
#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n, h, w, c;      /* x: [n][h][w][c] */
    int c_used;          /* x's channels that carry data: the first c_used */
    int block, pad;      /* block x block squares; pad rows and columns of zeros at the top and left */
    int group;           /* channels per pixel of the square in y: at least c_used */
    int out_h, out_w;    /* y: [n][out_h][out_w][block * block * group] */
} SpaceToDepthShape;

/* y's elements, and why a shape is impossible (NULL where it is not). */
size_t space_to_depth_out_count(const SpaceToDepthShape *s);
const char *space_to_depth_invalid(const SpaceToDepthShape *s);

/* The forms that run convolution conv, channels-last (x [n][h][w][c], w
 * [k][r][s][c]) over an x whose first c_used channels carry data, on
 * transformed copies: *image and *filter map x and w, and *inner is the
 * convolution over what they write, whose output is conv's. Block 2 (conv's
 * stride 2): 2x2 squares (group c_used rounded up to even, so 4 x group
 * channels are a multiple of 8), x's pad rounded up to even, the filter's
 * taps shifted by the difference, inner 1 stride and no pad. Block 1: x's
 * c_used channels alone (group c_used), inner conv over them. Returns 0,
 * with why, where the block does not fit conv. */
int space_to_depth_conv(const Conv2dShape *conv, int c_used, int block, SpaceToDepthShape *image,
                        SpaceToDepthShape *filter, Conv2dShape *inner, const char **why);

/* The face (op_context.h): x, y, dy, dx of ctx->dtype on ctx's device,
 * channels-last on either. Fails naming the shape where it is impossible. */
void space_to_depth_forward(const OpContext *ctx, const SpaceToDepthShape *s, const void *x, void *y);
void space_to_depth_backward(const OpContext *ctx, const SpaceToDepthShape *s, const void *dy, void *dx);
/* The forward from a float32 NCHW image instead, x [n][c_used][h][w] (s->c
 * is not read), each value rounded once to ctx->dtype: a batch as the loader
 * gives it cast and copied into the form in one pass. */
void space_to_depth_from_f32_nchw(const OpContext *ctx, const SpaceToDepthShape *s, const float *x, void *y);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void space_to_depth_forward_cpu(const SpaceToDepthShape *s, const float *x, float *y);
void space_to_depth_backward_cpu(const SpaceToDepthShape *s, const float *dy, float *dx);
void space_to_depth_from_f32_nchw_cpu(const SpaceToDepthShape *s, const float *x, float *y);
/* On stream; no allocation and no sync. */
void space_to_depth_forward_cuda(DType dtype, const SpaceToDepthShape *s, const void *x, void *y,
                                 cudaStream_t stream);
void space_to_depth_backward_cuda(DType dtype, const SpaceToDepthShape *s, const void *dy, void *dx,
                                  cudaStream_t stream);
void space_to_depth_from_f32_nchw_cuda(DType dtype, const SpaceToDepthShape *s, const float *x, void *y,
                                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
