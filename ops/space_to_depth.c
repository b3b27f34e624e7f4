#include "ops/space_to_depth.h"

#include "runtime/check.h"

size_t space_to_depth_out_count(const SpaceToDepthShape *s) {
    return (size_t)s->n * s->out_h * s->out_w * s->block * s->block * s->group;
}

const char *space_to_depth_invalid(const SpaceToDepthShape *s) {
    if (s->n < 1 || s->h < 1 || s->w < 1 || s->c < 1) return "an empty source";
    if (s->c_used < 1 || s->c_used > s->c) return "c_used outside 1..c";
    if (s->group < s->c_used) return "group below c_used";
    if (s->block < 1 || s->pad < 0 || s->pad >= s->block * s->out_h || s->pad >= s->block * s->out_w)
        return "a block below 1, or a pad below 0 or past the output";
    if (s->out_h < 1 || s->out_w < 1) return "an empty output";
    return NULL;
}

int space_to_depth_conv(const Conv2dShape *conv, int c_used, int block, SpaceToDepthShape *image,
                        SpaceToDepthShape *filter, Conv2dShape *inner, const char **why) {
    if (block != 1 && block != 2) return *why = "a block other than 1 or 2", 0;
    if (conv2d_groups(conv) > 1) return *why = "a grouped convolution", 0;
    if (block == 2 && conv->stride != 2) return *why = "block 2 takes a stride of 2", 0;
    if (c_used < 1 || c_used > conv->c) return *why = "c_used outside 1..c", 0;
    int group = block == 1 ? c_used : (c_used + 1) / 2 * 2;
    int image_pad = (conv->pad + block - 1) / block * block, shift = image_pad - conv->pad;
    int taps_r = (conv->r + shift + block - 1) / block, taps_s = (conv->s + shift + block - 1) / block;
    int out_h = conv2d_out_h(conv), out_w = conv2d_out_w(conv);
    if (block == 1) image_pad = shift = 0;
    *image = (SpaceToDepthShape){conv->n, conv->h, conv->w, conv->c, c_used, block, image_pad, group,
                                 block == 1 ? conv->h : out_h + taps_r - 1, block == 1 ? conv->w : out_w + taps_s - 1};
    *filter = (SpaceToDepthShape){conv->k, conv->r, conv->s, conv->c, c_used, block, shift, group, taps_r, taps_s};
    *inner = *conv;
    inner->c = block * block * group;
    if (block == 2) {
        inner->h = image->out_h, inner->w = image->out_w;
        inner->r = taps_r, inner->s = taps_s;
        inner->pad = 0, inner->stride = 1;
    }
    return 1;
}

/* Where x's pixel (p, q) and channel ch land in y; -1 where past out_h or out_w. */
static long target_of(const SpaceToDepthShape *s, int img, int p, int q, int ch) {
    int pp = p + s->pad, qq = q + s->pad;
    int i = pp / s->block, j = qq / s->block, a = pp % s->block, b = qq % s->block;
    if (i >= s->out_h || j >= s->out_w) return -1;
    int yc = s->block * s->block * s->group;
    return (((long)img * s->out_h + i) * s->out_w + j) * yc + (a * s->block + b) * s->group + ch;
}

/* x's pixel (p, q), channel ch: x [n][h][w][c] or, nchw, [n][c_used][h][w]. */
static size_t source_of(const SpaceToDepthShape *s, int nchw, int img, int p, int q, int ch) {
    if (nchw) return (((size_t)img * s->c_used + ch) * s->h + p) * s->w + q;
    return (((size_t)img * s->h + p) * s->w + q) * s->c + ch;
}

static void forward_cpu(const SpaceToDepthShape *s, int nchw, const float *x, float *y) {
    for (size_t e = 0; e < space_to_depth_out_count(s); e++) y[e] = 0.0f;
    for (int img = 0; img < s->n; img++)
        for (int p = 0; p < s->h; p++)
            for (int q = 0; q < s->w; q++)
                for (int ch = 0; ch < s->c_used; ch++) {
                    long t = target_of(s, img, p, q, ch);
                    if (t >= 0) y[t] = x[source_of(s, nchw, img, p, q, ch)];
                }
}

void space_to_depth_forward_cpu(const SpaceToDepthShape *s, const float *x, float *y) { forward_cpu(s, 0, x, y); }

void space_to_depth_from_f32_nchw_cpu(const SpaceToDepthShape *s, const float *x, float *y) {
    forward_cpu(s, 1, x, y);
}

void space_to_depth_backward_cpu(const SpaceToDepthShape *s, const float *dy, float *dx) {
    for (int img = 0; img < s->n; img++)
        for (int p = 0; p < s->h; p++)
            for (int q = 0; q < s->w; q++)
                for (int ch = 0; ch < s->c_used; ch++) {
                    long t = target_of(s, img, p, q, ch);
                    if (t >= 0) dx[source_of(s, 0, img, p, q, ch)] += dy[t];
                }
}

enum { FORWARD, BACKWARD, FROM_F32_NCHW };

static void space_to_depth_any(const OpContext *ctx, const char *op, const SpaceToDepthShape *s, const void *in,
                               void *out, int which) {
    const char *why = space_to_depth_invalid(s);
    if (why)
        TC_FATAL("%s: %dx%dx%dx%d (c_used %d, block %d, pad %d, group %d) to %dx%d: %s", op, s->n, s->h, s->w, s->c,
                 s->c_used, s->block, s->pad, s->group, s->out_h, s->out_w, why);
    op_begin(ctx, op);
    if (ctx->device == DEVICE_CPU && which == BACKWARD) space_to_depth_backward_cpu(s, in, out);
    else if (ctx->device == DEVICE_CPU) forward_cpu(s, which == FROM_F32_NCHW, in, out);
    else if (which == BACKWARD) GPU_ONLY(space_to_depth_backward_cuda(ctx->dtype, s, in, out, ctx->stream));
    else if (which == FROM_F32_NCHW) GPU_ONLY(space_to_depth_from_f32_nchw_cuda(ctx->dtype, s, in, out, ctx->stream));
    else GPU_ONLY(space_to_depth_forward_cuda(ctx->dtype, s, in, out, ctx->stream));
    op_end(ctx, op);
}

void space_to_depth_forward(const OpContext *ctx, const SpaceToDepthShape *s, const void *x, void *y) {
    space_to_depth_any(ctx, "space_to_depth_forward", s, x, y, FORWARD);
}

void space_to_depth_backward(const OpContext *ctx, const SpaceToDepthShape *s, const void *dy, void *dx) {
    space_to_depth_any(ctx, "space_to_depth_backward", s, dy, dx, BACKWARD);
}

void space_to_depth_from_f32_nchw(const OpContext *ctx, const SpaceToDepthShape *s, const float *x, void *y) {
    space_to_depth_any(ctx, "space_to_depth_from_f32_nchw", s, x, y, FROM_F32_NCHW);
}
