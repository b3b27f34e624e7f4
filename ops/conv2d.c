/* Conv2d CPU reference: per image, im2col turns the input into a matrix
 * col[c*R*S][P*Q] so the convolution becomes one GEMM with w[K][C*R*S].
 *   forward:  y_n   = w * col             [K][PQ]
 *   backward: dw   += dy_n * col^T        [K][CRS]
 *             dcol  = w^T * dy_n          [CRS][PQ], scattered back by col2im
 * Grouped, each group is that on its own C/G channels, K/G outputs and K/G
 * filters (one group: the same calls as ungrouped). */
#include "ops/conv2d.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gemm_cpu.h"
#include "runtime/check.h"

int conv2d_out_h(const Conv2dShape *s) { return (s->h + 2 * s->pad - s->r) / s->stride + 1; }
int conv2d_out_w(const Conv2dShape *s) { return (s->w + 2 * s->pad - s->s) / s->stride + 1; }
int conv2d_groups(const Conv2dShape *s) { return s->groups > 1 ? s->groups : 1; }

size_t conv2d_filter_count(const Conv2dShape *s) {
    return (size_t)s->k * (s->c / conv2d_groups(s)) * s->r * s->s;
}

void conv2d_check_ungrouped(const Conv2dShape *s, const char *op) {
    if (conv2d_groups(s) > 1)
        TC_FATAL("%s: takes no grouped convolution (%dx%dx%dx%d k%d %dx%d in %d groups)", op, s->n, s->c, s->h, s->w,
                 s->k, s->r, s->s, s->groups);
}

/* Output columns q whose input column q*stride - pad + kernel_col lies in [0, width). */
static void valid_range(int width, int out_width, int stride, int pad, int kernel_col,
                        int *lo, int *hi) {
    int shift = kernel_col - pad; /* input column = q * stride + shift */
    int first = shift >= 0 ? 0 : (-shift + stride - 1) / stride;
    int last = width - 1 - shift < 0 ? -1 : (width - 1 - shift) / stride;
    *lo = first < out_width ? first : out_width;
    *hi = last + 1 < out_width ? last + 1 : out_width;
    if (*hi < *lo) *hi = *lo;
}

/* col[(c*R + r)*S + s][p*Q + q] = x[c][p*stride - pad + r][q*stride - pad + s], 0 outside. */
static void im2col(const Conv2dShape *s, const float *x_image, float *col) {
    int out_h = conv2d_out_h(s), out_w = conv2d_out_w(s);
    size_t plane = (size_t)out_h * out_w;
    for (int c = 0; c < s->c; c++) {
        const float *x_plane = x_image + (size_t)c * s->h * s->w;
        for (int kr = 0; kr < s->r; kr++) {
            for (int ks = 0; ks < s->s; ks++) {
                float *col_row = col + ((size_t)(c * s->r + kr) * s->s + ks) * plane;
                int q_lo, q_hi;
                valid_range(s->w, out_w, s->stride, s->pad, ks, &q_lo, &q_hi);
                for (int p = 0; p < out_h; p++) {
                    float *dst = col_row + (size_t)p * out_w;
                    int ih = p * s->stride - s->pad + kr;
                    if (ih < 0 || ih >= s->h) {
                        memset(dst, 0, sizeof(float) * out_w);
                        continue;
                    }
                    const float *x_row = x_plane + (size_t)ih * s->w;
                    int shift = ks - s->pad;
                    for (int q = 0; q < q_lo; q++) dst[q] = 0.0f;
                    if (s->stride == 1) {
                        memcpy(dst + q_lo, x_row + q_lo + shift, sizeof(float) * (q_hi - q_lo));
                    } else {
                        for (int q = q_lo; q < q_hi; q++) dst[q] = x_row[q * s->stride + shift];
                    }
                    for (int q = q_hi; q < out_w; q++) dst[q] = 0.0f;
                }
            }
        }
    }
}

/* The adjoint of im2col: dx_image (zeroed by the caller) += scatter of dcol. */
static void col2im_add(const Conv2dShape *s, const float *dcol, float *dx_image) {
    int out_h = conv2d_out_h(s), out_w = conv2d_out_w(s);
    size_t plane = (size_t)out_h * out_w;
    for (int c = 0; c < s->c; c++) {
        float *dx_plane = dx_image + (size_t)c * s->h * s->w;
        for (int kr = 0; kr < s->r; kr++) {
            for (int ks = 0; ks < s->s; ks++) {
                const float *col_row = dcol + ((size_t)(c * s->r + kr) * s->s + ks) * plane;
                int q_lo, q_hi;
                valid_range(s->w, out_w, s->stride, s->pad, ks, &q_lo, &q_hi);
                for (int p = 0; p < out_h; p++) {
                    int ih = p * s->stride - s->pad + kr;
                    if (ih < 0 || ih >= s->h) continue;
                    const float *src = col_row + (size_t)p * out_w;
                    float *dx_row = dx_plane + (size_t)ih * s->w;
                    int shift = ks - s->pad;
                    for (int q = q_lo; q < q_hi; q++) dx_row[q * s->stride + shift] += src[q];
                }
            }
        }
    }
}

static float *alloc_col(const Conv2dShape *s) {
    size_t count = (size_t)s->c * s->r * s->s * conv2d_out_h(s) * conv2d_out_w(s);
    float *col = malloc(sizeof(float) * (count ? count : 1));
    if (!col) TC_FATAL("conv2d: out of host memory for a %zu-float im2col buffer", count);
    return col;
}

static void check_shape(const Conv2dShape *s) {
    if (s->n < 0 || s->c <= 0 || s->k <= 0 || s->r <= 0 || s->s <= 0 || s->stride <= 0 ||
        s->pad < 0 || conv2d_out_h(s) <= 0 || conv2d_out_w(s) <= 0 || s->groups < 0 ||
        s->c % conv2d_groups(s) || s->k % conv2d_groups(s))
        TC_FATAL("conv2d: bad shape n=%d c=%d h=%d w=%d k=%d r=%d s=%d pad=%d stride=%d groups=%d", s->n,
                 s->c, s->h, s->w, s->k, s->r, s->s, s->pad, s->stride, s->groups);
}

/* One group's convolution: c/G input channels, k/G outputs, ungrouped. */
static Conv2dShape group_shape(const Conv2dShape *s) {
    Conv2dShape g = *s;
    g.c = s->c / conv2d_groups(s), g.k = s->k / conv2d_groups(s), g.groups = 1;
    return g;
}

void conv2d_forward_cpu(const Conv2dShape *s, const float *x, const float *w, const float *b,
                        float *y) {
    check_shape(s);
    Conv2dShape g = group_shape(s);
    int groups = conv2d_groups(s), crs = g.c * g.r * g.s;
    int pq = conv2d_out_h(s) * conv2d_out_w(s);
    size_t x_image = (size_t)s->c * s->h * s->w, y_image = (size_t)s->k * pq;
    size_t x_group = (size_t)g.c * s->h * s->w, y_group = (size_t)g.k * pq, w_group = (size_t)g.k * crs;
    float *col = alloc_col(&g);
    for (int n = 0; n < s->n; n++) {
        float *y_n = y + n * y_image;
        for (int i = 0; i < groups; i++) {
            im2col(&g, x + n * x_image + i * x_group, col);
            cpu_sgemm(0, 0, g.k, pq, crs, 1.0f, w + i * w_group, crs, col, pq, 0.0f, y_n + i * y_group, pq);
        }
        for (int k = 0; b && k < s->k; k++) {
            float *y_plane = y_n + (size_t)k * pq;
            for (int i = 0; i < pq; i++) y_plane[i] += b[k];
        }
    }
    free(col);
}

void conv2d_bias_grad_cpu(const Conv2dShape *s, const float *dy, float *db) {
    check_shape(s);
    int pq = conv2d_out_h(s) * conv2d_out_w(s);
    for (int n = 0; n < s->n; n++) {
        const float *dy_n = dy + (size_t)n * s->k * pq;
        for (int k = 0; k < s->k; k++) {
            const float *dy_plane = dy_n + (size_t)k * pq;
            double sum = 0.0; /* a 224x224 plane summed in float drifts past the bounds that check the GPU's */
            for (int i = 0; i < pq; i++) sum += dy_plane[i];
            db[k] += (float)sum;
        }
    }
}

void conv2d_backward_cpu(const Conv2dShape *s, const float *x, const float *w, const float *dy,
                         float *dx, float *dw, float *db) {
    conv2d_backward_ex_cpu(s, x, w, dy, dx, dw, db, CONV2D_ADD_DW);
}

void conv2d_backward_ex_cpu(const Conv2dShape *s, const float *x, const float *w, const float *dy,
                            float *dx, float *dw, float *db, int accumulate) {
    check_shape(s);
    Conv2dShape g = group_shape(s);
    int groups = conv2d_groups(s), crs = g.c * g.r * g.s;
    int pq = conv2d_out_h(s) * conv2d_out_w(s);
    size_t x_image = (size_t)s->c * s->h * s->w, y_image = (size_t)s->k * pq;
    size_t x_group = (size_t)g.c * s->h * s->w, y_group = (size_t)g.k * pq, w_group = (size_t)g.k * crs;
    float *col = alloc_col(&g);
    if (db) conv2d_bias_grad_cpu(s, dy, db);
    if (dw && !(accumulate & CONV2D_ADD_DW)) memset(dw, 0, sizeof(float) * conv2d_filter_count(s)); /* images add */
    for (int n = 0; n < s->n; n++) {
        float *dx_n = dx ? dx + n * x_image : NULL;
        if (dx_n && !(accumulate & CONV2D_ADD_DX)) memset(dx_n, 0, sizeof(float) * x_image);
        for (int i = 0; i < groups; i++) {
            const float *dy_g = dy + n * y_image + i * y_group;
            if (dw) {
                im2col(&g, x + n * x_image + i * x_group, col);
                cpu_sgemm(0, 1, g.k, crs, pq, 1.0f, dy_g, pq, col, pq, 1.0f, dw + i * w_group, crs);
            }
            if (dx_n) {
                /* col is no longer needed for this group: reuse it for dcol. */
                cpu_sgemm(1, 0, crs, pq, g.k, 1.0f, w + i * w_group, crs, dy_g, pq, 0.0f, col, pq);
                col2im_add(&g, col, dx_n + i * x_group);
            }
        }
    }
    free(col);
}

void conv2d_init(const OpContext *ctx, Conv2d *c, const Conv2dShape *s, const ConvAlgoPolicy *policy) {
    Conv2dShape shape = *s; /* s may be c's own */
    memset(c, 0, sizeof *c);
    c->shape = shape;
    if (ctx->device == DEVICE_CUDA)
        GPU_ONLY(conv2d_cuda_init(&c->cuda, ctx->cudnn, &shape, ctx->dtype, ctx->nhwc, policy));
}

void conv2d_destroy(const OpContext *ctx, Conv2d *c) {
    if (ctx->device == DEVICE_CUDA) GPU_ONLY(conv2d_cuda_destroy(&c->cuda));
}

size_t conv2d_workspace_bytes(const OpContext *ctx, const Conv2d *c) {
    return ctx->device == DEVICE_CUDA ? c->cuda.workspace_bytes : 0;
}

size_t conv2d_bias_grad_bytes(const OpContext *ctx, const Conv2d *c) {
    size_t bytes = 0;
    if (ctx->device == DEVICE_CUDA)
        GPU_ONLY(const Conv2dShape *s = &c->shape;
                 bytes = conv2d_bias_grad_workspace_bytes(s->n, s->k, conv2d_out_h(s), conv2d_out_w(s), ctx->nhwc));
    return bytes;
}

int conv2d_direct_fits(const Conv2dShape *s, DType dtype, int nhwc) {
    return nhwc && dtype != DTYPE_F32 && conv2d_groups(s) == 1 && s->c == CONV2D_DIRECT_CHANNELS && s->r == 3 &&
           s->s == 3 && s->pad == 1 && s->stride == 1 && s->k % 16 == 0 && s->k <= CONV2D_DIRECT_MAX_OUT &&
           (size_t)s->n * s->h * s->w <= (size_t)INT_MAX / 2; /* pixels counted in int, a block's run past them */
}

int conv2d_depthwise_fits(const Conv2dShape *s, DType dtype, int nhwc) {
    return nhwc && dtype != DTYPE_F32 && s->groups == s->c && s->k == s->c && s->c % 2 == 0 && s->r == s->s &&
           (s->r == 3 || s->r == 5) && (s->stride == 1 || s->stride == 2) && s->pad < s->r;
}

/* One pass: the winner first, the losers' times in parentheses. */
static int describe_winner(char *buf, size_t size, const Conv2dCuda *c, Conv2dPass pass, const char *name, int algo) {
    float legacy = c->legacy_us[pass], plan = c->plan_us[pass];
    if (legacy <= 0) return snprintf(buf, size, "%s algo %d", name, algo); /* not timed against a plan */
    if (c->use_direct[pass] && plan > 0)
        return snprintf(buf, size, "%s direct %.1f us (algo %d %.1f us, backend %.1f us)", name, c->direct_us[pass],
                        algo, legacy, plan);
    if (c->use_direct[pass])
        return snprintf(buf, size, "%s direct %.1f us (algo %d %.1f us)", name, c->direct_us[pass], algo, legacy);
    if (c->use_plan[pass]) return snprintf(buf, size, "%s backend %.1f us (algo %d %.1f us)", name, plan, algo, legacy);
    if (plan > 0) return snprintf(buf, size, "%s algo %d %.1f us (backend %.1f us)", name, algo, legacy, plan);
    return snprintf(buf, size, "%s algo %d %.1f us (no backend plan)", name, algo, legacy);
}

static int describe_pass(char *buf, size_t size, const Conv2dCuda *c, Conv2dPass pass, const char *name, int algo) {
    int n = describe_winner(buf, size, c, pass, name, algo);
    if (n < 0 || (size_t)n >= size || c->use_direct[pass] || c->direct_us[pass] <= 0) return n;
    return n + snprintf(buf + n, size - (size_t)n, " (direct %.1f us)", c->direct_us[pass]);
}

float conv2d_timed_us(const OpContext *ctx, const Conv2d *c, Conv2dPass pass) {
    if (ctx->device != DEVICE_CUDA || pass < 0 || pass >= CONV2D_PASSES) return 0;
    const Conv2dCuda *cc = &c->cuda;
    if (cc->legacy_us[pass] <= 0) return 0;
    return cc->use_direct[pass] ? cc->direct_us[pass] : cc->use_plan[pass] ? cc->plan_us[pass] : cc->legacy_us[pass];
}

void conv2d_describe(const OpContext *ctx, const Conv2d *c, char *buf, size_t size) {
    if (size) buf[0] = 0;
    if (ctx->device != DEVICE_CUDA) return;
    const Conv2dCuda *cc = &c->cuda;
    const char *names[CONV2D_PASSES] = {"forward", "backward data", "backward data (accumulated)", "backward filter",
                                        "backward filter (accumulated)"};
    const int algos[CONV2D_PASSES] = {(int)cc->fwd_algo, (int)cc->bwd_data_algo, (int)cc->bwd_data_algo,
                                      (int)cc->bwd_filter_algo, (int)cc->bwd_filter_algo};
    size_t used = (size_t)snprintf(buf, size, "cuDNN");
    for (int pass = 0; pass < CONV2D_PASSES && used < size; pass++) {
        /* untimed, the same algorithm as the overwriting pass's (FILTER_ADD never timed) */
        if ((pass == CONV2D_DATA_ADD || pass == CONV2D_FILTER_ADD) && cc->legacy_us[pass] <= 0) continue;
        used += (size_t)snprintf(buf + used, size - used, pass ? ", " : " ");
        if (used < size) used += (size_t)describe_pass(buf + used, size - used, cc, (Conv2dPass)pass, names[pass], algos[pass]);
    }
}

void conv2d_forward(const OpContext *ctx, const Conv2d *c, const void *x, const void *w, const void *b, void *y) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) conv2d_forward_cpu(&c->shape, x, w, b, y);
    else GPU_ONLY(conv2d_forward_cuda(&c->cuda, ctx->cudnn, x, w, b, y, ctx->workspace));
    op_end(ctx, __func__);
}

void conv2d_backward(const OpContext *ctx, const Conv2d *c, const void *x, const void *w, const void *dy, void *dx,
                     void *dw, void *db, int accumulate) {
    op_begin(ctx, __func__);
    if (ctx->device == DEVICE_CPU) conv2d_backward_ex_cpu(&c->shape, x, w, dy, dx, dw, db, accumulate);
    else GPU_ONLY(conv2d_backward_ex_cuda(&c->cuda, ctx->cudnn, x, w, dy, dx, dw, db, ctx->workspace, accumulate));
    op_end(ctx, __func__);
}

void conv2d_bias_grad(const OpContext *ctx, const Conv2d *c, const void *dy, void *db) {
    op_begin(ctx, __func__);
    const Conv2dShape *s = &c->shape;
    if (ctx->device == DEVICE_CPU) conv2d_bias_grad_cpu(s, dy, db);
    else GPU_ONLY(conv2d_bias_grad_cuda(ctx->dtype, ctx->nhwc, s->n, s->k, conv2d_out_h(s), conv2d_out_w(s), dy, db,
                                        ctx->workspace, ctx->stream));
    op_end(ctx, __func__);
}
