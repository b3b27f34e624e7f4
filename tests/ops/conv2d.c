/* 2-D convolution (ops/conv2d.h) through its face, and the bias gradient
 * (conv2d_bias_grad): y, dx, and dw and db added onto random start values
 * (CONV2D_ADD_DW), against the CPU reference; dw overwritten (NaN before) on
 * either device too. The CPU path also against the definition summed
 * in double and by finite differences; the GPU's again with dx == NULL (the
 * same dw and db; deterministic algorithms give the same bits). The shapes per
 * combination are those the old tests ran on H100 and H200: SimpleNet's
 * convolutions, other strides, pads and odd sizes; in NHWC the first layer's
 * 3 channels padded to 8 with zeros. ResNet's shapes also with accumulate_dx
 * and no bias (on the CPU: finite differences, the accumulate flag and a NULL
 * bias to the bit). In f16 and bf16 NHWC, benchmarked: cuDNN backend plans
 * against the legacy algorithms, and the plans forced for every pass (y, dx
 * overwritten and added to, dw) on airbench's 24 -> 64 3x3 at 31x31, a 1x1
 * stride 2 and a 3x3 stride 2, and deterministic ones repeating their bits;
 * the direct path of a first convolution (8 channels) timed and forced.
 * Grouped convolutions (depthwise 3x3 and 5x5 at stride 1 and 2, 2 and 4
 * groups, two outputs a channel) on both devices the same way: on the CPU
 * against the definition and by finite differences, on the GPU against the
 * reference in both layouts and every dtype, strict and timed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/conv2d.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

#define CONV_WORKSPACE_LIMIT ((size_t)512 << 20)
/* Full fp32 (no TF32) and deterministic algorithms, so GPU and CPU agree
 * closely and runs repeat; and algorithms picked by timing them. */
static const ConvAlgoPolicy strict_policy = {.workspace_limit = CONV_WORKSPACE_LIMIT, .deterministic = 1};
static const ConvAlgoPolicy benchmarked_policy = {.workspace_limit = CONV_WORKSPACE_LIMIT, .benchmark = 1};
/* Benchmarked, cuDNN's backend plans taken wherever they finalize (half
 * types in NHWC; elsewhere the legacy algorithms as benchmarked_policy). */
static const ConvAlgoPolicy backend_policy = {.workspace_limit = CONV_WORKSPACE_LIMIT, .benchmark = 1,
                                              .prefer_backend = 1};
static const ConvAlgoPolicy deterministic_backend_policy = {.workspace_limit = CONV_WORKSPACE_LIMIT, .deterministic = 1,
                                                            .benchmark = 1, .prefer_backend = 1};
/* Benchmarked, the direct path taken wherever it fits (ops/conv2d.cu). */
static const ConvAlgoPolicy direct_policy = {.workspace_limit = CONV_WORKSPACE_LIMIT, .benchmark = 1,
                                             .prefer_direct = 1};

static size_t conv_x_count(const Conv2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t conv_w_count(const Conv2dShape *s) { return conv2d_filter_count(s); }
static int conv_filter_c(const Conv2dShape *s) { return s->c / conv2d_groups(s); } /* a filter's channels */
static size_t conv_y_count(const Conv2dShape *s) { return (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s); }

static void conv_label(char *buf, size_t size, const Conv2dShape *s) {
    snprintf(buf, size, "conv %dx%dx%dx%d k%d %dx%d pad %d stride %d groups %d", s->n, s->c, s->h, s->w, s->k, s->r,
             s->s, s->pad, s->stride, conv2d_groups(s));
}

/* ---- the GPU against the CPU reference ----------------------------------------- */

/* Whether cuDNN's heuristics call the three chosen algorithms deterministic
 * (conv2d_cuda_init prefers those, but may fall back to others). */
static int conv_algos_deterministic(const GridCase *c, const Conv2dCuda *cc) {
    int deterministic = 1;
#if TRAINC_CUDA
    int count = 0, found = 0;
    cudnnHandle_t h = c->ctx.cudnn;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, cc->x_desc, cc->w_desc, cc->conv_desc, cc->y_desc,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, fwd));
    for (int i = 0; i < count; i++)
        if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].algo == cc->fwd_algo && !found++)
            deterministic &= fwd[i].determinism == CUDNN_DETERMINISTIC;
    cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, cc->w_desc, cc->y_desc, cc->conv_desc, cc->x_desc,
                                                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, data));
    found = 0;
    for (int i = 0; i < count; i++)
        if (data[i].status == CUDNN_STATUS_SUCCESS && data[i].algo == cc->bwd_data_algo && !found++)
            deterministic &= data[i].determinism == CUDNN_DETERMINISTIC;
    cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, cc->x_desc, cc->y_desc, cc->conv_desc, cc->w_desc,
                                                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                              filter));
    found = 0;
    for (int i = 0; i < count; i++)
        if (filter[i].status == CUDNN_STATUS_SUCCESS && filter[i].algo == cc->bwd_filter_algo && !found++)
            deterministic &= filter[i].determinism == CUDNN_DETERMINISTIC;
#else
    (void)c, (void)cc;
#endif
    return deterministic;
}

/* y as the device forms it: the convolution stored in dt, then the bias added
 * and stored again (for f32 both roundings are the identity). */
static void conv_forward_reference(DType dt, const Conv2dShape *s, const float *x, const float *w, const float *b,
                                   float *y) {
    size_t ny = conv_y_count(s), plane = ny / ((size_t)s->n * s->k);
    float *zero = host_floats(s->k);
    conv2d_forward_cpu(s, x, w, zero, y);
    round_to(dt, y, ny);
    for (size_t i = 0; i < ny; i++) y[i] += b[(i / plane) % s->k];
    round_to(dt, y, ny);
    free(zero);
}

/* The reference's results and the start values of the accumulators, NCHW. */
typedef struct {
    float *x, *w, *b, *dy, *dw0, *db0; /* inputs */
    float *y, *dx, *dw, *db;           /* what the op must give, dw and db added onto dw0 and db0 */
    float *dw_set;                     /* dw overwritten */
} ConvValues;

/* The input's channels from real_c on are zero, as the first layer's padded
 * input is. */
static ConvValues conv_values(const GridCase *c, const Conv2dShape *s, int real_c) {
    DType dt = c->dtype;
    size_t nx = conv_x_count(s), nw = conv_w_count(s), ny = conv_y_count(s), plane = (size_t)s->h * s->w;
    float w_scale = 1.0f / sqrtf((float)(real_c / conv2d_groups(s) * s->r * s->s));
    ConvValues v;
    v.x = grid_random(c, dt, nx, -1, 1), v.w = grid_random(c, dt, nw, -w_scale, w_scale);
    v.b = grid_random(c, dt, s->k, -1, 1), v.dy = grid_random(c, dt, ny, -1, 1);
    for (int i = 0; i < s->n; i++)
        memset(v.x + ((size_t)i * s->c + real_c) * plane, 0, (s->c - real_c) * plane * sizeof(float));
    v.y = host_floats(ny), v.dx = host_floats(nx);
    float *dw_added = host_floats(nw), *db_added = host_floats(s->k);
    conv_forward_reference(dt, s, v.x, v.w, v.b, v.y);
    conv2d_backward_cpu(s, v.x, v.w, v.dy, v.dx, dw_added, db_added);
    round_to(dt, v.dx, nx);
    v.dw0 = grid_accumulator_start(c, dt, dw_added, nw), v.db0 = grid_accumulator_start(c, dt, db_added, s->k);
    v.dw = copy_floats(v.dw0, nw), v.db = copy_floats(v.db0, s->k);
    for (size_t i = 0; i < nw; i++) v.dw[i] += dw_added[i];
    for (int i = 0; i < s->k; i++) v.db[i] += db_added[i];
    round_to(dt, v.dw, nw);
    round_to(dt, v.db, s->k);
    v.dw_set = dw_added;
    round_to(dt, v.dw_set, nw);
    free(db_added);
    return v;
}

static void conv_values_free(ConvValues *v) {
    void *host[] = {v->x, v->w, v->b, v->dy, v->dw0, v->db0, v->y, v->dx, v->dw, v->db, v->dw_set};
    host_free_all(host, GRID_COUNT(host));
}

/* Device results, back in NCHW. */
typedef struct {
    float *y, *dx, *dw, *db;
} ConvResults;

/* One forward and backward on the device from v's inputs; without want_dx
 * dx is NULL; add_dw adds dw onto v's dw0, else overwrites NaNs. */
static ConvResults conv_run(const GridCase *c, const OpContext *ctx, const Conv2d *conv, const ConvValues *v,
                            int want_dx, int add_dw) {
    const Conv2dShape *s = &conv->shape;
    DType dt = c->dtype;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    size_t nx = conv_x_count(s), nw = conv_w_count(s), ny = conv_y_count(s);
    float *xl = grid_to_layout(c, v->x, s->n, s->c, s->h, s->w);
    float *wl = grid_to_layout(c, v->w, s->k, conv_filter_c(s), s->r, s->s);
    float *dyl = grid_to_layout(c, v->dy, s->n, s->k, oh, ow);
    float *dw0l = grid_to_layout(c, v->dw0, s->k, conv_filter_c(s), s->r, s->s);
    if (!add_dw) grid_fill_nan(dw0l, nw);
    void *d_x = grid_put(c, dt, xl, nx), *d_w = grid_put(c, dt, wl, nw), *d_b = grid_put(c, dt, v->b, s->k);
    void *d_dy = grid_put(c, dt, dyl, ny), *d_y = grid_alloc(c, dt, ny), *d_dx = want_dx ? grid_alloc(c, dt, nx) : NULL;
    void *d_dw = grid_put(c, dt, dw0l, nw), *d_db = grid_put(c, dt, v->db0, s->k);
    conv2d_forward(ctx, conv, d_x, d_w, d_b, d_y);
    conv2d_backward(ctx, conv, d_x, d_w, d_dy, d_dx, d_dw, d_db, add_dw ? CONV2D_ADD_DW : 0);
    ConvResults r;
    float *t = grid_get(c, dt, d_y, ny);
    r.y = grid_from_layout(c, t, s->n, s->k, oh, ow);
    free(t);
    r.dx = NULL;
    if (want_dx) {
        t = grid_get(c, dt, d_dx, nx);
        r.dx = grid_from_layout(c, t, s->n, s->c, s->h, s->w);
        free(t);
    }
    t = grid_get(c, dt, d_dw, nw);
    r.dw = grid_from_layout(c, t, s->k, conv_filter_c(s), s->r, s->s);
    free(t);
    r.db = grid_get(c, dt, d_db, s->k);
    void *dev[] = {d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {xl, wl, dyl, dw0l};
    host_free_all(host, GRID_COUNT(host));
    return r;
}

static void conv_results_free(ConvResults *r) {
    void *host[] = {r->y, r->dx, r->dw, r->db};
    host_free_all(host, GRID_COUNT(host));
}

/* Backend plans are tried only under benchmark for f16 and bf16 in NHWC.
 * There each pass runs the faster of its plan and the legacy algorithm, or
 * under prefer_backend its plan (a pass with none fails here, named: the
 * plans were written for Hopper, where cuDNN 9 has engines for each), and the
 * log line says so. */
static void conv_check_backend_plans(const GridCase *c, const OpContext *ctx, const Conv2d *conv,
                                     const ConvAlgoPolicy *policy) {
    const Conv2dCuda *cc = &conv->cuda;
    if (!policy->benchmark || c->dtype == DTYPE_F32 || !c->nhwc) {
        CHECK_MSG(cc->plans == NULL, "%s conv: backend plans tried outside benchmarked half NHWC", c->name);
        return;
    }
    char chosen[400];
    conv2d_describe(ctx, conv, chosen, sizeof chosen);
    printf("  %s\n", chosen);
    CHECK_MSG(cc->plans != NULL, "%s conv: no backend plans were tried", c->name);
    const Conv2dShape *s = &conv->shape;
    int direct_fits = s->c == 8 && s->r == 3 && s->s == 3 && s->pad == 1 && s->stride == 1 && s->k % 16 == 0 &&
                      s->k <= 64 && conv2d_groups(s) == 1 && !policy->prefer_backend;
    /* the depthwise kernels: every pass timed */
    int depthwise = s->groups == s->c && s->k == s->c && s->c % 2 == 0 && s->r == s->s && (s->r == 3 || s->r == 5) &&
                    s->stride <= 2 && s->pad < s->r && !policy->prefer_backend;
    /* adding the filter gradient is not timed: FILTER's direct path where it won, else the legacy algorithm */
    CHECK_MSG(cc->legacy_us[CONV2D_FILTER_ADD] == 0 && cc->plan_us[CONV2D_FILTER_ADD] == 0 &&
                  !cc->use_plan[CONV2D_FILTER_ADD] && cc->use_direct[CONV2D_FILTER_ADD] == cc->use_direct[CONV2D_FILTER],
              "%s conv: the added filter gradient was timed or does not follow the overwriting one's path (%s)", c->name,
              chosen);
    for (int pass = 0; cc->plans && pass < CONV2D_PASSES; pass++) {
        if (pass == CONV2D_FILTER_ADD) continue;
        CHECK_MSG(cc->legacy_us[pass] > 0, "%s conv: pass %d's legacy algorithm was not timed", c->name, pass);
        int direct_pass = (direct_fits && (pass == CONV2D_FORWARD || pass == CONV2D_FILTER)) || depthwise;
        CHECK_MSG((cc->direct_us[pass] > 0) == direct_pass, "%s conv: pass %d's direct path %s (%s)", c->name, pass,
                  direct_pass ? "was not timed" : "was timed where it does not fit", chosen);
        int faster = cc->plan_us[pass] > 0 && cc->plan_us[pass] < cc->legacy_us[pass];
        float best = faster ? cc->plan_us[pass] : cc->legacy_us[pass];
        int direct = direct_pass && (policy->prefer_direct || cc->direct_us[pass] < best);
        CHECK_MSG(cc->use_direct[pass] == direct, "%s conv: pass %d %s the direct path (%s)", c->name, pass,
                  direct ? "does not run" : "runs", chosen);
        if (policy->prefer_backend)
            CHECK_MSG(cc->use_plan[pass] && cc->plan_us[pass] > 0, "%s conv: pass %d runs no backend plan (%s)",
                      c->name, pass, chosen);
        else
            CHECK_MSG(cc->use_plan[pass] == (faster && !direct), "%s conv: pass %d kept the slower (%s)", c->name,
                      pass, chosen);
    }
    if (policy->prefer_backend)
        CHECK_MSG(strstr(chosen, "backward data (accumulated) backend") != NULL, "%s conv: log line '%s'", c->name,
                  chosen);
}

static void conv_gpu_shape(const GridCase *c, Conv2dShape s, int real_c, const ConvAlgoPolicy *policy) {
    DType dt = c->dtype;
    size_t nw = conv_w_count(&s), ny = conv_y_count(&s), nx = conv_x_count(&s);
    int rs = s.r * s.s;
    ConvValues v = conv_values(c, &s, real_c);
    OpContext ctx = c->ctx;
    Conv2d conv;
    conv2d_init(&ctx, &conv, &s, policy);
    CHECK(conv.cuda.dtype == dt && conv.cuda.nhwc == c->nhwc);
    conv_check_backend_plans(c, &ctx, &conv, policy);
    int deterministic = conv_algos_deterministic(c, &conv.cuda);
    size_t ws = conv2d_workspace_bytes(&ctx, &conv);
    printf(" %dx%dx%dx%d (%d real) -> %d, %dx%d pad %d stride %d groups %d: algos fwd %d bwd-data %d bwd-filter %d "
           "(%s), workspace %zu bytes%s\n", s.n, s.c, s.h, s.w, real_c, s.k, s.r, s.s, s.pad, s.stride,
           conv2d_groups(&s), (int)conv.cuda.fwd_algo, (int)conv.cuda.bwd_data_algo, (int)conv.cuda.bwd_filter_algo,
           deterministic ? "deterministic" : "NOT all deterministic", ws, policy->benchmark ? " (benchmarked)" : "");
    CHECK(ws <= CONV_WORKSPACE_LIMIT);
    /* the bias gradient's partial sums live in the workspace (every case but f32 NCHW) */
    if (c->nhwc) CHECK(ws >= conv2d_bias_grad_bytes(&ctx, &conv));
    ctx.workspace = ws ? dev_bytes(ws) : NULL;

    ConvResults r = conv_run(c, &ctx, &conv, &v, 1, 1), set = conv_run(c, &ctx, &conv, &v, 0, 0);
    double bound = grid_bound(c, GRID_CONV);
    grid_check(c, "conv y", r.y, v.y, ny, bound);
    grid_check(c, "conv dx", r.dx, v.dx, nx, bound);
    grid_check(c, "conv dw (accumulated onto random dw)", r.dw, v.dw, nw, bound);
    grid_check(c, "conv db (accumulated onto random db)", r.db, v.db, s.k, bound);
    grid_check(c, "conv dw (overwriting NaN)", set.dw, v.dw_set, nw, bound);
    size_t padded_moved = 0; /* zero input channels: their weight gradient is exactly zero */
    for (int k = 0; k < s.k; k++)
        for (int ch = real_c; ch < s.c; ch++)
            for (int i = 0; i < rs; i++) {
                size_t at = ((size_t)k * conv_filter_c(&s) + ch) * rs + i; /* grouped: real_c is c, none */
                padded_moved += memcmp(&r.dw[at], &v.dw0[at], sizeof(float)) != 0 || set.dw[at] != 0.0f;
            }
    CHECK_MSG(padded_moved == 0, "%s conv: %zu weight gradients of zero input channels moved", c->name, padded_moved);

    /* again with dx == NULL: the same dw; db from our own fixed-order kernel
     * the same bits (f32 NCHW keeps cuDNN's bias gradient: close) */
    ConvResults again = conv_run(c, &ctx, &conv, &v, 0, 1);
    int f32_nchw = dt == DTYPE_F32 && !c->nhwc;
    if (f32_nchw && deterministic) {
        grid_check_same(c, "conv y (second run)", again.y, r.y, ny * sizeof(float));
        grid_check_same(c, "conv dw (second run, dx == NULL)", again.dw, r.dw, nw * sizeof(float));
    } else if (f32_nchw) {
        grid_check(c, "conv y (second run)", again.y, r.y, ny, 1e-5);
        grid_check(c, "conv dw (second run, dx == NULL)", again.dw, r.dw, nw, 1e-5);
    } else if (policy->deterministic && policy->prefer_backend) {
        grid_check_same(c, "conv y (second run, deterministic plans)", again.y, r.y, ny * sizeof(float));
        grid_check_same(c, "conv dw (dx == NULL, deterministic plans)", again.dw, r.dw, nw * sizeof(float));
    } else {
        grid_check(c, "conv dw (dx == NULL, vs the first run)", again.dw, r.dw, nw, bound / 4);
    }
    if (f32_nchw) grid_check(c, "conv db (second run, dx == NULL)", again.db, r.db, s.k, 1e-6);
    else grid_check_same(c, "conv db (dx == NULL, vs the first run)", again.db, r.db, s.k * sizeof(float));

    conv_results_free(&r);
    conv_results_free(&set);
    conv_results_free(&again);
    conv_values_free(&v);
    grid_free(c, ctx.workspace);
    conv2d_destroy(&ctx, &conv);
}

#define CONV(n_, c_, h_, w_, k_, r_, s_, pad_, stride_) \
    ((Conv2dShape){.n = n_, .c = c_, .h = h_, .w = w_, .k = k_, .r = r_, .s = s_, .pad = pad_, .stride = stride_})
/* The same in groups (depthwise: groups = c = k). */
#define CONVG(n_, c_, h_, w_, k_, r_, s_, pad_, stride_, groups_)                                                   \
    ((Conv2dShape){.n = n_, .c = c_, .h = h_, .w = w_, .k = k_, .r = r_, .s = s_, .pad = pad_, .stride = stride_, \
                   .groups = groups_})

static void conv_accumulate_shape(const GridCase *c, Conv2dShape s, int real_c, const ConvAlgoPolicy *policy);

/* The backend plans forced (backend_policy): airbench's 24 -> 64 3x3 at
 * 31x31, a 1x1 stride 2 and a 3x3 stride 2; y, dx, dw, db, and dx added. */
static void conv_backend_case(const GridCase *c) {
    conv_accumulate_shape(c, CONV(8, 24, 31, 31, 64, 3, 3, 1, 1), 24, &backend_policy);
    conv_accumulate_shape(c, CONV(4, 16, 16, 16, 32, 1, 1, 0, 2), 16, &backend_policy);
    conv_accumulate_shape(c, CONV(4, 16, 15, 17, 32, 3, 3, 1, 2), 16, &backend_policy);
    /* deterministic engines only: a second run gives the same bits */
    conv_gpu_shape(c, CONV(8, 64, 16, 16, 64, 3, 3, 1, 1), 64, &deterministic_backend_policy);
}

static void conv_gpu_case(const GridCase *c) {
    const ConvAlgoPolicy *strict = &strict_policy;
    if (c->nhwc) {
        /* SimpleNet's convolutions, the first on 3 channels padded to 8, and a stride 2 */
        conv_gpu_shape(c, CONV(8, 8, 32, 32, 64, 3, 3, 1, 1), 3, strict);
        conv_gpu_shape(c, CONV(2, 8, 224, 224, 64, 3, 3, 1, 1), 3, strict);
        conv_gpu_shape(c, CONV(8, 64, 16, 16, 128, 3, 3, 1, 1), 64, strict);
        conv_gpu_shape(c, CONV(8, 128, 8, 8, 256, 3, 3, 1, 1), 128, strict);
        conv_gpu_shape(c, CONV(4, 16, 15, 17, 32, 3, 3, 1, 2), 16, strict);
        /* timed against cuDNN's backend plans (half types), each pass's faster kept */
        conv_gpu_shape(c, CONV(8, 64, 16, 16, 128, 3, 3, 1, 1), 64, &benchmarked_policy);
        if (c->dtype != DTYPE_F32) {
            conv_backend_case(c);
            /* the direct path: ResNet-18's stem, timed and forced; an odd size (765 pixels: the last of the
             * filter gradient's rounds of 128 and of the forward's runs of 32 partial) with 32 outputs (2 of
             * the filter gradient's 4 warps idle) */
            conv_gpu_shape(c, CONV(8, 8, 32, 32, 64, 3, 3, 1, 1), 3, &benchmarked_policy);
            conv_gpu_shape(c, CONV(8, 8, 32, 32, 64, 3, 3, 1, 1), 3, &direct_policy);
            conv_gpu_shape(c, CONV(3, 8, 15, 17, 32, 3, 3, 1, 1), 8, &direct_policy);
        }
        return;
    }
    /* SimpleNet's three convolutions at 32x32, then other strides, pads and sizes */
    conv_gpu_shape(c, CONV(8, 3, 32, 32, 64, 3, 3, 1, 1), 3, strict);
    conv_gpu_shape(c, CONV(8, 64, 16, 16, 128, 3, 3, 1, 1), 64, strict);
    conv_gpu_shape(c, CONV(8, 128, 8, 8, 256, 3, 3, 1, 1), 128, strict);
    conv_gpu_shape(c, CONV(4, 16, 15, 17, 32, 3, 3, 1, 2), 16, strict);
    conv_gpu_shape(c, CONV(4, 8, 9, 12, 16, 3, 3, 0, 2), 8, strict);
    conv_gpu_shape(c, CONV(3, 32, 14, 10, 24, 1, 1, 0, 1), 32, strict);
    if (c->dtype == DTYPE_F32) {
        conv_gpu_shape(c, CONV(2, 4, 11, 7, 6, 5, 3, 2, 1), 4, strict);
        conv_gpu_shape(c, CONV(2, 3, 224, 224, 64, 3, 3, 1, 1), 3, strict);
        conv_gpu_shape(c, CONV(2, 3, 224, 224, 64, 7, 7, 3, 2), 3, strict);
    } else {
        conv_gpu_shape(c, CONV(2, 3, 11, 7, 5, 5, 3, 2, 1), 3, strict);
        conv_gpu_shape(c, CONV(2, 3, 64, 64, 64, 7, 7, 3, 2), 3, strict);
    }
    /* algorithms picked by timing them (cudnnFind), any determinism, no TF32 */
    conv_gpu_shape(c, CONV(8, 64, 16, 16, 128, 3, 3, 1, 1), 64, &benchmarked_policy);
    conv_gpu_shape(c, CONV(4, 16, 15, 17, 32, 3, 3, 1, 2), 16, &benchmarked_policy);
}

/* ---- the CPU: against the definition in double, and finite differences ----------- */

/* The definition in double (grouped: filter k's channel c reads input channel
 * (k / (K/G)) * C/G + c); beside each value (size) the sum of its terms'
 * absolute values: an fp32 sum is off by a few roundings of that, however
 * far its terms cancel (a 1x1x2x1 image's 2 dx values, 2 db values). */
static void naive_conv_forward(const Conv2dShape *s, const float *x, const float *w, const float *b, double *y,
                               double *size) {
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s), cg = conv_filter_c(s), kg = s->k / conv2d_groups(s);
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    double sum = b[k], abs_sum = fabs(b[k]);
                    for (int c = 0; c < cg; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                int ch = k / kg * cg + c; /* the input channel of filter k's channel c */
                                double term = (double)x[(((size_t)n * s->c + ch) * s->h + ih) * s->w + iw] *
                                              w[(((size_t)k * cg + c) * s->r + r) * s->s + t];
                                sum += term, abs_sum += fabs(term);
                            }
                    size_t at = (((size_t)n * s->k + k) * oh + p) * ow + q;
                    y[at] = sum, size[at] = abs_sum;
                }
}

/* dx, dw and db, and their sizes (size: dx's, then dw's, then db's). */
static void naive_conv_backward(const Conv2dShape *s, const float *x, const float *w, const float *dy, double *dx,
                                double *dw, double *db, double *size) {
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s), cg = conv_filter_c(s), kg = s->k / conv2d_groups(s);
    size_t nx = conv_x_count(s), nw = conv_w_count(s);
    double *size_dx = size, *size_dw = size + nx, *size_db = size + nx + nw;
    memset(dx, 0, sizeof(double) * nx);
    memset(dw, 0, sizeof(double) * nw);
    memset(db, 0, sizeof(double) * s->k);
    memset(size, 0, sizeof(double) * (nx + nw + s->k));
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    double g = dy[(((size_t)n * s->k + k) * oh + p) * ow + q];
                    db[k] += g, size_db[k] += fabs(g);
                    for (int c = 0; c < cg; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                size_t xi = (((size_t)n * s->c + k / kg * cg + c) * s->h + ih) * s->w + iw;
                                size_t wi = (((size_t)k * cg + c) * s->r + r) * s->s + t;
                                dx[xi] += g * w[wi], size_dx[xi] += fabs(g * w[wi]);
                                dw[wi] += g * x[xi], size_dw[wi] += fabs(g * x[xi]);
                            }
                }
}

/* Against a double reference, relative to the size of its terms (NaN fails). */
static void check_close(const GridCase *c, const char *what, const float *got, const double *want,
                        const double *size, size_t n) {
    float *w = host_floats(n);
    for (size_t i = 0; i < n; i++) w[i] = (float)want[i];
    grid_check_sums(c, what, got, w, size, (int)n, 1e-5);
    free(w);
}

/* The face on the CPU against the definition in double: dw and db added onto
 * random start values, dx overwritten; then dw overwritten. */
static void conv_cpu_against_naive(const GridCase *c, const Conv2dShape *s) {
    char label[120], what[200];
    conv_label(label, sizeof label, s);
    size_t nx = conv_x_count(s), nw = conv_w_count(s), ny = conv_y_count(s);
    float *x = grid_random(c, DTYPE_F32, nx, -1, 1), *w = grid_random(c, DTYPE_F32, nw, -0.5f, 0.5f);
    float *b = grid_random(c, DTYPE_F32, s->k, -1, 1), *dy = grid_random(c, DTYPE_F32, ny, -1, 1);
    float *y = host_floats(ny), *dx = host_floats(nx);
    float *dw0 = grid_random(c, DTYPE_F32, nw, -1, 1), *db0 = grid_random(c, DTYPE_F32, s->k, -1, 1);
    float *dw = copy_floats(dw0, nw), *db = copy_floats(db0, s->k);
    double *want_y = malloc(sizeof(double) * ny), *want_dx = malloc(sizeof(double) * nx);
    double *want_dw = malloc(sizeof(double) * nw), *want_db = malloc(sizeof(double) * s->k);
    double *size = malloc(sizeof(double) * (ny + nx + nw + s->k)); /* y's, then dx's, dw's and db's */
    double *size_dx = size + ny, *size_dw = size_dx + nx, *size_db = size_dw + nw;
    Conv2d conv;
    conv2d_init(&c->ctx, &conv, s, &strict_policy);
    grid_fill_nan(y, ny);
    conv2d_forward(&c->ctx, &conv, x, w, b, y);
    naive_conv_forward(s, x, w, b, want_y, size);
    snprintf(what, sizeof what, "%s: y", label);
    check_close(c, what, y, want_y, size, ny);
    grid_fill_nan(dx, nx);
    conv2d_backward(&c->ctx, &conv, x, w, dy, dx, dw, db, CONV2D_ADD_DW);
    naive_conv_backward(s, x, w, dy, want_dx, want_dw, want_db, size_dx);
    float *dw_set = host_floats(nw);
    grid_fill_nan(dw_set, nw);
    conv2d_backward(&c->ctx, &conv, x, w, dy, NULL, dw_set, NULL, 0);
    snprintf(what, sizeof what, "%s: dw overwriting NaN", label);
    check_close(c, what, dw_set, want_dw, size_dw, nw);
    for (size_t i = 0; i < nw; i++) want_dw[i] += dw0[i], size_dw[i] += fabs(dw0[i]);
    for (int k = 0; k < s->k; k++) want_db[k] += db0[k], size_db[k] += fabs(db0[k]);
    snprintf(what, sizeof what, "%s: dx", label);
    check_close(c, what, dx, want_dx, size_dx, nx);
    snprintf(what, sizeof what, "%s: dw", label);
    check_close(c, what, dw, want_dw, size_dw, nw);
    snprintf(what, sizeof what, "%s: db", label);
    check_close(c, what, db, want_db, size_db, s->k);
    conv2d_destroy(&c->ctx, &conv);
    void *host[] = {x, w, b, dy, y, dx, dw0, db0, dw, db, dw_set, want_y, want_dx, want_dw, want_db, size};
    host_free_all(host, GRID_COUNT(host));
}

typedef struct {
    const Conv2dShape *s;
    float *x, *w, *b, *y, *r;
} ConvLoss;

static double conv_loss(void *p) {
    ConvLoss *l = p;
    conv2d_forward_cpu(l->s, l->x, l->w, l->b, l->y);
    return weighted_sum(l->y, l->r, conv_y_count(l->s));
}

static void conv_cpu_finite_differences(const GridCase *c, const Conv2dShape *s) {
    char label[120], what[200];
    conv_label(label, sizeof label, s);
    size_t nx = conv_x_count(s), nw = conv_w_count(s), ny = conv_y_count(s);
    ConvLoss l = {s, grid_random(c, DTYPE_F32, nx, -1, 1), grid_random(c, DTYPE_F32, nw, -1, 1),
                  grid_random(c, DTYPE_F32, s->k, -1, 1), host_floats(ny), grid_random(c, DTYPE_F32, ny, -1, 1)};
    /* prefilled dw, db: backward must add to them; dx is overwritten */
    float *dw0 = grid_random(c, DTYPE_F32, nw, -1, 1), *db0 = grid_random(c, DTYPE_F32, s->k, -1, 1);
    float *dw = copy_floats(dw0, nw), *db = copy_floats(db0, s->k), *dx = host_floats(nx);
    Conv2d conv;
    conv2d_init(&c->ctx, &conv, s, &strict_policy);
    grid_fill_nan(dx, nx);
    conv2d_backward(&c->ctx, &conv, l.x, l.w, l.r, dx, dw, db, CONV2D_ADD_DW);
    for (size_t i = 0; i < nw; i++) dw[i] -= dw0[i];
    for (int k = 0; k < s->k; k++) db[k] -= db0[k];
    double *num = malloc(sizeof(double) * (nx > nw ? nx : nw));
    numeric_gradient(l.x, nx, 1e-2f, conv_loss, &l, num);
    snprintf(what, sizeof what, "%s: dx", label);
    check_gradient(what, dx, num, nx);
    numeric_gradient(l.w, nw, 1e-2f, conv_loss, &l, num);
    snprintf(what, sizeof what, "%s: dw", label);
    check_gradient(what, dw, num, nw);
    numeric_gradient(l.b, s->k, 1e-2f, conv_loss, &l, num);
    snprintf(what, sizeof what, "%s: db", label);
    check_gradient(what, db, num, s->k);

    /* dx == NULL: the same dw and db, bit for bit */
    float *dw2 = copy_floats(dw0, nw), *db2 = copy_floats(db0, s->k);
    conv2d_backward(&c->ctx, &conv, l.x, l.w, l.r, NULL, dw2, db2, CONV2D_ADD_DW);
    for (size_t i = 0; i < nw; i++) dw2[i] -= dw0[i];
    for (int k = 0; k < s->k; k++) db2[k] -= db0[k];
    snprintf(what, sizeof what, "%s: dw, db with dx == NULL", label);
    CHECK_MSG(!memcmp(dw, dw2, nw * sizeof(float)) && !memcmp(db, db2, s->k * sizeof(float)), "%s change", what);
    conv2d_destroy(&c->ctx, &conv);
    void *host[] = {l.x, l.w, l.b, l.y, l.r, dw0, db0, dw, db, dx, num, dw2, db2};
    host_free_all(host, GRID_COUNT(host));
}

static void conv_cpu_case(const GridCase *c) {
    const Conv2dShape shapes[] = {
        CONV(2, 3, 5, 7, 4, 3, 3, 1, 1), CONV(1, 2, 6, 9, 3, 3, 3, 0, 2), CONV(2, 2, 7, 6, 2, 3, 2, 1, 2),
        CONV(2, 3, 8, 6, 5, 3, 3, 1, 2), CONV(2, 4, 3, 5, 3, 1, 1, 0, 1), CONV(1, 1, 4, 4, 2, 5, 5, 2, 1),
        CONV(1, 2, 5, 4, 2, 2, 3, 2, 3),
        /* the padding is wider than the image: whole kernel rows read only zeros */
        CONV(2, 2, 1, 1, 3, 5, 5, 2, 1), CONV(1, 1, 2, 1, 2, 5, 5, 3, 2),
        /* grouped: depthwise 3x3 and 5x5, stride 1 and 2; two outputs a channel; 2 and 4 groups */
        CONVG(2, 4, 7, 6, 4, 3, 3, 1, 1, 4), CONVG(2, 3, 9, 8, 3, 3, 3, 1, 2, 3), CONVG(1, 4, 8, 7, 4, 5, 5, 2, 1, 4),
        CONVG(1, 3, 9, 9, 3, 5, 5, 2, 2, 3), CONVG(1, 2, 5, 5, 4, 3, 3, 1, 1, 2), CONVG(2, 4, 6, 5, 6, 3, 3, 1, 1, 2),
        CONVG(1, 8, 5, 6, 8, 3, 3, 0, 2, 4), CONVG(2, 8, 4, 4, 12, 1, 1, 0, 1, 4),
    };
    for (size_t i = 0; i < GRID_COUNT(shapes); i++) {
        conv_cpu_finite_differences(c, &shapes[i]);
        conv_cpu_against_naive(c, &shapes[i]);
    }
    const Conv2dShape bigger[] = {
        CONV(3, 8, 12, 10, 6, 3, 3, 1, 1), CONV(2, 16, 16, 16, 32, 3, 3, 1, 1), CONV(2, 3, 17, 23, 8, 7, 7, 3, 2),
        CONV(2, 5, 9, 11, 4, 3, 3, 0, 2),  CONVG(2, 32, 12, 12, 32, 3, 3, 1, 2, 32),
        CONVG(2, 16, 9, 9, 32, 3, 3, 1, 1, 4),
    };
    for (size_t i = 0; i < GRID_COUNT(bigger); i++) conv_cpu_against_naive(c, &bigger[i]);
}

/* ---- ResNet's convolutions: accumulate_dx, no bias --------------------------------- */

/* dx added onto random values (cuDNN's beta 1: a tensor feeding two layers
 * sums their gradients), against the old dx plus the reference's; dw as
 * without accumulate_dx. The bias gradient is skipped (db NULL), as ResNet's
 * convolutions have no bias. */
static void conv_check_accumulate_dx(const GridCase *c, const OpContext *ctx, const Conv2d *conv,
                                     const ConvValues *v) {
    const Conv2dShape *s = &conv->shape;
    DType dt = c->dtype;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    size_t nx = conv_x_count(s), nw = conv_w_count(s), ny = conv_y_count(s);
    float *old = grid_accumulator_start(c, dt, v->dx, nx), *want = host_floats(nx);
    for (size_t i = 0; i < nx; i++) want[i] = old[i] + v->dx[i];
    round_to(dt, want, nx);
    float *xl = grid_to_layout(c, v->x, s->n, s->c, s->h, s->w);
    float *wl = grid_to_layout(c, v->w, s->k, conv_filter_c(s), s->r, s->s);
    float *dyl = grid_to_layout(c, v->dy, s->n, s->k, oh, ow), *oldl = grid_to_layout(c, old, s->n, s->c, s->h, s->w);
    float *dw0l = grid_to_layout(c, v->dw0, s->k, conv_filter_c(s), s->r, s->s);
    void *d_x = grid_put(c, dt, xl, nx), *d_w = grid_put(c, dt, wl, nw), *d_dy = grid_put(c, dt, dyl, ny);
    void *d_dx = grid_put(c, dt, oldl, nx), *d_dw = grid_put(c, dt, dw0l, nw);
    conv2d_backward(ctx, conv, d_x, d_w, d_dy, d_dx, d_dw, NULL, CONV2D_ADD_DX | CONV2D_ADD_DW);
    float *t = grid_get(c, dt, d_dx, nx), *gacc = grid_from_layout(c, t, s->n, s->c, s->h, s->w);
    free(t);
    t = grid_get(c, dt, d_dw, nw);
    float *gdw = grid_from_layout(c, t, s->k, conv_filter_c(s), s->r, s->s);
    free(t);
    double bound = c->device == DEVICE_CPU ? 1e-6 : grid_bound(c, GRID_CONV);
    grid_check(c, "conv dx (accumulate_dx onto random)", gacc, want, nx, bound);
    grid_check(c, "conv dw (accumulate_dx, db NULL)", gdw, v->dw, nw, bound);
    void *dev[] = {d_x, d_w, d_dy, d_dx, d_dw};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {old, want, xl, wl, dyl, oldl, dw0l, gacc, gdw};
    host_free_all(host, GRID_COUNT(host));
}

/* On the GPU y, dx, dw and db against the reference (conv_gpu_shape); then
 * accumulate_dx on either device, both by the policy's choices. */
static void conv_accumulate_shape(const GridCase *c, Conv2dShape s, int real_c, const ConvAlgoPolicy *policy) {
    if (c->device == DEVICE_CUDA) conv_gpu_shape(c, s, real_c, policy);
    char label[120];
    conv_label(label, sizeof label, &s);
    printf(" %s, accumulate_dx%s\n", label, policy->prefer_backend ? " (backend plans preferred)" : "");
    ConvValues v = conv_values(c, &s, real_c);
    OpContext ctx = c->ctx;
    Conv2d conv;
    conv2d_init(&ctx, &conv, &s, policy);
    conv_check_backend_plans(c, &ctx, &conv, policy);
    size_t ws = conv2d_workspace_bytes(&ctx, &conv);
    ctx.workspace = ws ? dev_bytes(ws) : NULL;
    conv_check_accumulate_dx(c, &ctx, &conv, &v);
    conv_values_free(&v);
    grid_free(c, ctx.workspace);
    conv2d_destroy(&ctx, &conv);
}

/* On the CPU (after finite differences): the face overwriting dw is the plain
 * call adding onto zeros, to the bit; adding into dx leaves dw's bits; a NULL
 * bias (and db) is a zero bias, to the bit. */
static void conv_resnet_cpu(const GridCase *c, Conv2dShape s) {
    char label[120];
    conv_label(label, sizeof label, &s);
    conv_cpu_finite_differences(c, &s);
    size_t nx = conv_x_count(&s), nw = conv_w_count(&s), ny = conv_y_count(&s);
    ConvLoss l = {&s, grid_random(c, DTYPE_F32, nx, -1, 1), grid_random(c, DTYPE_F32, nw, -0.5f, 0.5f),
                  grid_random(c, DTYPE_F32, s.k, -1, 1), host_floats(ny), grid_random(c, DTYPE_F32, ny, -1, 1)};
    float *dx = host_floats(nx), *dw = host_floats(nw), *db = host_floats(s.k);
    Conv2d conv;
    conv2d_init(&c->ctx, &conv, &s, &strict_policy);
    conv2d_backward(&c->ctx, &conv, l.x, l.w, l.r, dx, dw, db, 0);

    float *dx_plain = host_floats(nx), *dw_plain = host_floats(nw), *db_plain = host_floats(s.k);
    conv2d_backward_cpu(&s, l.x, l.w, l.r, dx_plain, dw_plain, db_plain);
    CHECK_MSG(!memcmp(dx, dx_plain, nx * sizeof(float)) && !memcmp(dw, dw_plain, nw * sizeof(float)),
              "%s: conv2d_backward_cpu onto zeros differs from conv2d_backward(..., 0)", label);
    float *old = grid_random(c, DTYPE_F32, nx, -1, 1), *acc = copy_floats(old, nx), *want = host_floats(nx);
    float *dw2 = host_floats(nw), *db2 = host_floats(s.k);
    conv2d_backward(&c->ctx, &conv, l.x, l.w, l.r, acc, dw2, db2, CONV2D_ADD_DX);
    for (size_t i = 0; i < nx; i++) want[i] = old[i] + dx[i];
    grid_check(c, "conv dx accumulated = old dx + dx", acc, want, nx, 1e-6);
    CHECK_MSG(!memcmp(dw2, dw, nw * sizeof(float)), "%s: conv dw changes with accumulate_dx", label);

    float *zero_b = host_floats(s.k), *y0 = host_floats(ny), *y_null = host_floats(ny);
    float *dx_null = host_floats(nx), *dw_null = host_floats(nw);
    conv2d_forward(&c->ctx, &conv, l.x, l.w, zero_b, y0);
    conv2d_forward(&c->ctx, &conv, l.x, l.w, NULL, y_null);
    conv2d_backward(&c->ctx, &conv, l.x, l.w, l.r, dx_null, dw_null, NULL, 0);
    CHECK_MSG(!memcmp(y_null, y0, ny * sizeof(float)) && !memcmp(dx_null, dx, nx * sizeof(float)) &&
                  !memcmp(dw_null, dw, nw * sizeof(float)),
              "%s: conv2d cpu with NULL bias differs from a zero bias", label);
    conv2d_destroy(&c->ctx, &conv);
    void *host[] = {l.x, l.w, l.b, l.y, l.r, dx, dw, db, dx_plain, dw_plain, db_plain, old, acc, want, dw2,
                    db2, zero_b, y0, y_null, dx_null, dw_null};
    host_free_all(host, GRID_COUNT(host));
}

/* ResNet's projection shortcut (1x1, stride 2, no padding), its stem (7x7,
 * stride 2, pad 3; in NHWC its 3 channels padded to 8) and a 3x3 of its
 * blocks. */
static void conv_resnet_case(const GridCase *c) {
    if (c->device == DEVICE_CPU) {
        conv_resnet_cpu(c, CONV(2, 4, 9, 8, 6, 1, 1, 0, 2));
        conv_resnet_cpu(c, CONV(2, 3, 11, 10, 4, 7, 7, 3, 2));
        conv_resnet_cpu(c, CONV(2, 3, 6, 5, 4, 3, 3, 1, 1));
        conv_resnet_cpu(c, CONVG(2, 4, 6, 5, 4, 3, 3, 1, 2, 4));
    }
    conv_accumulate_shape(c, CONV(4, 16, 16, 16, 32, 1, 1, 0, 2), 16, &strict_policy);
    if (c->nhwc) conv_accumulate_shape(c, CONV(2, 8, 32, 32, 16, 7, 7, 3, 2), 3, &strict_policy);
    else conv_accumulate_shape(c, CONV(2, 3, 32, 32, 16, 7, 7, 3, 2), 3, &strict_policy);
    conv_accumulate_shape(c, CONV(4, 16, 8, 8, 16, 3, 3, 1, 1), 16, &strict_policy);
    /* a MobileNet block's depthwise 3x3 (stride 1 and 2) and a grouped 1x1, adding into dx */
    conv_accumulate_shape(c, CONVG(4, 32, 8, 8, 32, 3, 3, 1, 1, 32), 32, &strict_policy);
    conv_accumulate_shape(c, CONVG(4, 32, 9, 9, 32, 3, 3, 1, 2, 32), 32, &strict_policy);
    conv_accumulate_shape(c, CONVG(4, 32, 8, 8, 64, 1, 1, 0, 1, 4), 32, &strict_policy);
}

/* Grouped convolutions on the GPU, either layout, every dtype: depthwise 3x3 and 5x5 at stride 1 and 2 (MobileNet's
 * and EfficientNet's; 16-byte vectors where c is a multiple of 8, else 4-byte ones; odd sizes; a 5x5 unpadded), two
 * outputs a channel, 2 and 4 groups; strict, and in half NHWC the depthwise ones again on the direct kernels forced
 * (dx added onto random values too); then timed (half NHWC: against the backend's plans and the direct kernels,
 * each pass's fastest kept). */
static void conv_gpu_grouped_case(const GridCase *c) {
    const Conv2dShape shapes[] = {
        CONVG(4, 32, 16, 16, 32, 3, 3, 1, 1, 32), CONVG(4, 32, 15, 17, 32, 3, 3, 1, 2, 32),
        CONVG(2, 64, 14, 14, 64, 5, 5, 2, 1, 64), CONVG(2, 64, 13, 11, 64, 5, 5, 2, 2, 64),
        CONVG(3, 18, 9, 7, 18, 3, 3, 1, 1, 18),   CONVG(3, 18, 9, 7, 18, 5, 5, 1, 2, 18),
        CONVG(2, 24, 6, 6, 24, 5, 5, 0, 1, 24),   CONVG(64, 40, 12, 12, 40, 3, 3, 1, 1, 40),
        CONVG(2, 16, 9, 11, 32, 3, 3, 1, 1, 16),  CONVG(4, 16, 12, 12, 32, 3, 3, 1, 1, 2),
        CONVG(4, 32, 8, 8, 64, 1, 1, 0, 1, 4),    CONVG(4, 32, 15, 15, 64, 3, 3, 1, 2, 4),
    };
    for (size_t i = 0; i < GRID_COUNT(shapes); i++) {
        conv_gpu_shape(c, shapes[i], shapes[i].c, &strict_policy);
        if (conv2d_depthwise_fits(&shapes[i], c->dtype, c->nhwc))
            conv_gpu_shape(c, shapes[i], shapes[i].c, &direct_policy);
    }
    if (c->nhwc && c->dtype != DTYPE_F32) {
        conv_accumulate_shape(c, CONVG(4, 32, 9, 9, 32, 3, 3, 1, 2, 32), 32, &direct_policy);
        conv_accumulate_shape(c, CONVG(4, 18, 8, 8, 18, 5, 5, 2, 1, 18), 18, &direct_policy);
        /* MobileNetV2-CIFAR's expanded 3x3 depthwise at batch 64, stride 1 and 2: the log line's times are the
         * direct kernels' against cuDNN's at a size that counts */
        conv_gpu_shape(c, CONVG(64, 144, 32, 32, 144, 3, 3, 1, 1, 144), 144, &benchmarked_policy);
        conv_gpu_shape(c, CONVG(64, 144, 32, 32, 144, 3, 3, 1, 2, 144), 144, &benchmarked_policy);
    }
    conv_gpu_shape(c, CONVG(8, 96, 28, 28, 96, 3, 3, 1, 1, 96), 96, &benchmarked_policy);
    conv_gpu_shape(c, CONVG(8, 96, 28, 28, 96, 3, 3, 1, 2, 96), 96, &benchmarked_policy);
    conv_gpu_shape(c, CONVG(8, 64, 16, 16, 128, 3, 3, 1, 1, 4), 64, &benchmarked_policy);
}

static void conv_case(const GridCase *c) {
    if (c->device == DEVICE_CPU) {
        conv_cpu_case(c);
    } else {
        conv_gpu_case(c);
        conv_gpu_grouped_case(c);
    }
    conv_resnet_case(c);
}

/* ---- by hand -------------------------------------------------------------------- */

static void conv_forward_by_hand(void) {
    /* one 3x3 plane 1..9, one 2x2 kernel [1 2; 3 4], bias 0.5 */
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 2, 3, 4}, b[1] = {0.5f}, y[4];
    Conv2dShape s = CONV(1, 1, 3, 3, 1, 2, 2, 0, 1);
    CHECK(conv2d_out_h(&s) == 2 && conv2d_out_w(&s) == 2);
    conv2d_forward_cpu(&s, x, w, b, y);
    /* y[0][0] = 1*1 + 2*2 + 4*3 + 5*4 = 37, and so on */
    check_values("conv y (pad 0, stride 1)", y, (double[]){37.5, 47.5, 67.5, 77.5}, 4, 1e-6);
    /* pad 1, stride 2: out 2x2 reading rows/cols {-1, 0} and {1, 2} */
    s.pad = 1, s.stride = 2;
    CHECK(conv2d_out_h(&s) == 2 && conv2d_out_w(&s) == 2);
    conv2d_forward_cpu(&s, x, w, b, y);
    /* (0,0): x00*w11 = 4; (0,1): x01*w10 + x02*w11 = 6 + 12;
     * (1,0): x10*w01 + x20*w11 = 8 + 28; (1,1): 5 + 12 + 24 + 36 */
    check_values("conv y (pad 1, stride 2)", y, (double[]){4.5, 18.5, 36.5, 77.5}, 4, 1e-6);
    /* two input channels, two output channels, 1x1 kernel, non-square 1x3 image:
     * y[k] = w[k][0] * x[0] + w[k][1] * x[1] + b[k] */
    Conv2dShape s2 = CONV(1, 2, 1, 3, 2, 1, 1, 0, 1);
    float x2[6] = {1, 2, 3, 10, 20, 30}, w2[4] = {1, -1, 0.5f, 2}, b2[2] = {0, 1}, y2[6];
    conv2d_forward_cpu(&s2, x2, w2, b2, y2);
    check_values("conv y (2->2 channels)", y2, (double[]){-9, -18, -27, 21.5, 42, 62.5}, 6, 1e-6);
}

static void conv_backward_by_hand(void) {
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 2, 3, 4}, dy[4] = {1, 1, 1, 1};
    float dx[9], dw[4] = {0}, db[1] = {0};
    Conv2dShape s = CONV(1, 1, 3, 3, 1, 2, 2, 0, 1);
    grid_fill_nan(dx, 9);
    conv2d_backward_cpu(&s, x, w, dy, dx, dw, db);
    /* dw[r][s] = sum of the 2x2 block of x at (r, s); dx counts kernel taps */
    check_values("conv dw (hand)", dw, (double[]){12, 16, 24, 28}, 4, 1e-6);
    check_values("conv db (hand)", db, (double[]){4}, 1, 1e-6);
    check_values("conv dx (hand)", dx, (double[]){1, 3, 2, 4, 10, 6, 3, 7, 4}, 9, 1e-6);
    /* accumulates: a second call doubles dw and db; dx may be NULL */
    conv2d_backward_cpu(&s, x, w, dy, NULL, dw, db);
    check_values("conv dw (accumulated)", dw, (double[]){24, 32, 48, 56}, 4, 1e-6);
    check_values("conv db (accumulated)", db, (double[]){8}, 1, 1e-6);
    /* without CONV2D_ADD_DW dw is overwritten; db is added to still */
    conv2d_backward_ex_cpu(&s, x, w, dy, NULL, dw, db, 0);
    check_values("conv dw (overwritten)", dw, (double[]){12, 16, 24, 28}, 4, 1e-6);
    check_values("conv db (added)", db, (double[]){12}, 1, 1e-6);
}

/* conv2d_describe's line, and conv2d_timed_us of one pass. */
static void check_described(const OpContext *ctx, const Conv2d *conv, Conv2dPass pass, float timed_us,
                            const char *expected) {
    char line[400];
    conv2d_describe(ctx, conv, line, sizeof line);
    CHECK_MSG(!strcmp(line, expected), "conv2d_describe: '%s'", line);
    float us = conv2d_timed_us(ctx, conv, pass);
    CHECK_MSG(us == timed_us, "conv2d_timed_us of pass %d: %g, not %g", (int)pass, us, timed_us);
}

/* The log line of a layer's choices (conv2d_describe), from the fields init
 * fills: the legacy algorithms alone, then timed against backend plans. */
static void conv_describe_by_hand(void) {
    OpContext ctx = {.device = DEVICE_CUDA};
    Conv2d conv;
    memset(&conv, 0, sizeof conv);
    conv.cuda.fwd_algo = 1, conv.cuda.bwd_data_algo = 4, conv.cuda.bwd_filter_algo = 3;
    char line[400];
    conv2d_describe(&ctx, &conv, line, sizeof line);
    const char *legacy = "cuDNN forward algo 1, backward data algo 4, backward filter algo 3";
    CHECK_MSG(!strcmp(line, legacy), "conv2d_describe: '%s'", line);
    const float legacy_us[CONV2D_PASSES] = {120, 50, 55, 80}, plan_us[CONV2D_PASSES] = {85, 60, 0, 70};
    memcpy(conv.cuda.legacy_us, legacy_us, sizeof legacy_us);
    memcpy(conv.cuda.plan_us, plan_us, sizeof plan_us);
    conv.cuda.use_plan[CONV2D_FORWARD] = conv.cuda.use_plan[CONV2D_FILTER] = 1;
    conv2d_describe(&ctx, &conv, line, sizeof line);
    const char *timed = "cuDNN forward backend 85.0 us (algo 1 120.0 us), backward data algo 4 50.0 us (backend "
                        "60.0 us), backward data (accumulated) algo 4 55.0 us (no backend plan), backward filter "
                        "backend 70.0 us (algo 3 80.0 us)";
    CHECK_MSG(!strcmp(line, timed), "conv2d_describe: '%s'", line);
    /* the direct path where it won: forward against a plan, the filter gradient against the algorithm alone */
    Conv2d direct = conv;
    direct.cuda.plan_us[CONV2D_FILTER] = 0;
    direct.cuda.use_plan[CONV2D_FORWARD] = direct.cuda.use_plan[CONV2D_FILTER] = 0;
    direct.cuda.use_direct[CONV2D_FORWARD] = direct.cuda.use_direct[CONV2D_FILTER] = 1;
    direct.cuda.direct_us[CONV2D_FORWARD] = 25, direct.cuda.direct_us[CONV2D_FILTER] = 30;
    check_described(&ctx, &direct, CONV2D_FILTER, 30.0f,
                    "cuDNN forward direct 25.0 us (algo 1 120.0 us, backend 85.0 us), backward data algo 4 50.0 us "
                    "(backend 60.0 us), backward data (accumulated) algo 4 55.0 us (no backend plan), backward "
                    "filter direct 30.0 us (algo 3 80.0 us)");
    /* the direct path timed and lost: its time after the winner's */
    Conv2d lost = conv;
    lost.cuda.direct_us[CONV2D_FORWARD] = 95;
    check_described(&ctx, &lost, CONV2D_FORWARD, 85.0f,
                    "cuDNN forward backend 85.0 us (algo 1 120.0 us) (direct 95.0 us), backward data algo 4 50.0 us "
                    "(backend 60.0 us), backward data (accumulated) algo 4 55.0 us (no backend plan), backward "
                    "filter backend 70.0 us (algo 3 80.0 us)");
    char small[24];
    conv2d_describe(&ctx, &conv, small, sizeof small);
    CHECK_MSG(strlen(small) == sizeof small - 1 && !strncmp(small, timed, sizeof small - 1),
              "conv2d_describe cut to %zu bytes: '%s'", sizeof small, small);
    ctx.device = DEVICE_CPU;
    conv2d_describe(&ctx, &conv, line, sizeof line);
    CHECK_MSG(line[0] == 0, "conv2d_describe on the CPU: '%s'", line);
}

static void conv_by_hand(uint64_t *rng) {
    (void)rng;
    conv_forward_by_hand();
    conv_backward_by_hand();
    conv_describe_by_hand();
}

const GridOp grid_op_conv2d = {
    .name = "conv2d",
    .run = conv_case,
    .extras = conv_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW)",
};
