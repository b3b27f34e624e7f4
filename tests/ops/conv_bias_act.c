/* Convolution + bias [+ residual] [+ ReLU] (ops/conv_bias_act.h) through its
 * face. On the CPU against the definition summed in double, the error taken
 * relative to the size of each output's terms (a few outputs after the ReLU
 * can cancel to near 0: 6 of them in the 1x1 image's case); on the GPU
 * against the CPU reference rounded to the dtype, with conv2d's bounds (the
 * fused graph rounds once, the fallback after the convolution, the bias and
 * the sum: a rounding or two either way). Shapes: ResNet-18-CIFAR's 3x3,
 * stride-2 3x3 and 1x1 stride-2 downsample, k = 128; ResNet-50's 1x1
 * bottleneck; the first layer (3 channels, padded with zeros to 8 in NHWC);
 * SimpleNet's 3x3; grouped ones (MobileNet's depthwise 3x3 at stride 1 and
 * 2, a 1x1 in 4 groups: the inference path's folded grouped convolutions);
 * all four relu/residual combinations on three of them. Each
 * GPU shape prints whether the fused cuDNN graph was taken (the fallback is
 * not a failure). On the GPU a plan cache shared by two batch sizes too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/backend_graph.h"
#include "ops/conv_bias_act.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

#define CBA_WORKSPACE_LIMIT ((size_t)512 << 20)
/* No TF32 and deterministic engines; and engines picked by timing them. */
static const ConvAlgoPolicy strict_policy = {.workspace_limit = CBA_WORKSPACE_LIMIT, .deterministic = 1};
static const ConvAlgoPolicy benchmarked_policy = {.workspace_limit = CBA_WORKSPACE_LIMIT, .benchmark = 1};

#define CONV(n_, c_, h_, w_, k_, r_, s_, pad_, stride_) \
    ((Conv2dShape){.n = n_, .c = c_, .h = h_, .w = w_, .k = k_, .r = r_, .s = s_, .pad = pad_, .stride = stride_})
/* The same in groups (depthwise: groups = c = k): filters of c / groups channels. */
#define CONVG(n_, c_, h_, w_, k_, r_, s_, pad_, stride_, groups_)                                                   \
    ((Conv2dShape){.n = n_, .c = c_, .h = h_, .w = w_, .k = k_, .r = r_, .s = s_, .pad = pad_, .stride = stride_, \
                   .groups = groups_})

static size_t cba_x_count(const Conv2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t cba_w_count(const Conv2dShape *s) { return conv2d_filter_count(s); }
static int cba_filter_c(const Conv2dShape *s) { return s->c / conv2d_groups(s); }
static size_t cba_y_count(const Conv2dShape *s) { return (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s); }

static void cba_label(char *buf, size_t size, const ConvBiasActShape *a) {
    const Conv2dShape *s = &a->conv;
    snprintf(buf, size, "%dx%dx%dx%d k%d %dx%d pad %d stride %d groups %d%s%s", s->n, s->c, s->h, s->w, s->k, s->r,
             s->s, s->pad, s->stride, conv2d_groups(s), a->residual ? " +z" : "", a->relu ? " relu" : "");
}

/* The inputs, NCHW, rounded to the dtype; x's channels from real_c on are zero. */
typedef struct {
    float *x, *w, *b, *z;
} CbaInputs;

static CbaInputs cba_inputs(const GridCase *c, DType dt, const ConvBiasActShape *a, int real_c) {
    const Conv2dShape *s = &a->conv;
    size_t plane = (size_t)s->h * s->w;
    float w_scale = 1.0f / sqrtf((float)(real_c / conv2d_groups(s) * s->r * s->s));
    CbaInputs in;
    in.x = grid_random(c, dt, cba_x_count(s), -1, 1);
    in.w = grid_random(c, dt, cba_w_count(s), -w_scale, w_scale);
    in.b = grid_random(c, dt, s->k, -1, 1);
    in.z = a->residual ? grid_random(c, dt, cba_y_count(s), -1, 1) : NULL;
    for (int i = 0; i < s->n; i++)
        memset(in.x + ((size_t)i * s->c + real_c) * plane, 0, (s->c - real_c) * plane * sizeof(float));
    return in;
}

static void cba_inputs_free(CbaInputs *in) {
    void *host[] = {in->x, in->w, in->b, in->z};
    host_free_all(host, GRID_COUNT(host));
}

/* ---- the CPU against the definition in double ------------------------------------- */

/* y and, in magnitude, the sum of its terms' absolute values: an fp32 sum is
 * off by a few roundings of that, however far its terms cancel. */
static void naive_conv_bias_act(const ConvBiasActShape *a, const CbaInputs *in, double *y, double *magnitude) {
    const Conv2dShape *s = &a->conv;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s), cg = cba_filter_c(s), kg = s->k / conv2d_groups(s);
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    size_t at = (((size_t)n * s->k + k) * oh + p) * ow + q;
                    double sum = in->b[k], size = fabs(in->b[k]);
                    for (int c = 0; c < cg; c++) /* grouped: filter k's channel c reads channel k / kg * cg + c */
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                size_t xi = (((size_t)n * s->c + k / kg * cg + c) * s->h + ih) * s->w + iw;
                                double term = (double)in->x[xi] * in->w[(((size_t)k * cg + c) * s->r + r) * s->s + t];
                                sum += term, size += fabs(term);
                            }
                    if (a->residual) sum += in->z[at], size += fabs(in->z[at]);
                    if (a->relu && sum < 0) sum = 0;
                    y[at] = sum, magnitude[at] = size;
                }
}

static void cba_cpu_shape(const GridCase *c, ConvBiasActShape a, int real_c) {
    char label[160], what[200];
    cba_label(label, sizeof label, &a);
    size_t ny = cba_y_count(&a.conv);
    CbaInputs in = cba_inputs(c, DTYPE_F32, &a, real_c);
    ConvBiasAct op;
    conv_bias_act_init(&c->ctx, &op, &a, &strict_policy);
    CHECK(conv_bias_act_workspace_bytes(&c->ctx, &op) == 0 && !conv_bias_act_fused(&op));
    float *y = host_floats(ny), *want = host_floats(ny);
    double *exact = malloc(sizeof(double) * ny), *magnitude = malloc(sizeof(double) * ny);
    grid_fill_nan(y, ny);
    conv_bias_act_forward(&c->ctx, &op, in.x, in.w, in.b, in.z, y);
    naive_conv_bias_act(&a, &in, exact, magnitude);
    for (size_t i = 0; i < ny; i++) want[i] = (float)exact[i];
    snprintf(what, sizeof what, "%s: y", label);
    grid_check_sums(c, what, y, want, magnitude, (int)ny, 1e-5);
    conv_bias_act_destroy(&c->ctx, &op);
    void *host[] = {y, want, exact, magnitude};
    host_free_all(host, GRID_COUNT(host));
    cba_inputs_free(&in);
}

/* ---- the GPU against the CPU reference --------------------------------------------- */

static void cba_gpu_shape(const GridCase *c, ConvBiasActShape a, int real_c, const ConvAlgoPolicy *policy) {
    const Conv2dShape *s = &a.conv;
    DType dt = c->dtype;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    size_t nx = cba_x_count(s), nw = cba_w_count(s), ny = cba_y_count(s);
    char label[160], what[220];
    cba_label(label, sizeof label, &a);
    CbaInputs in = cba_inputs(c, dt, &a, real_c);
    float *want = host_floats(ny);
    conv_bias_act_forward_cpu(&a, in.x, in.w, in.b, in.z, want);
    round_to(dt, want, ny);

    OpContext ctx = c->ctx;
    ConvBiasAct op;
    conv_bias_act_init(&ctx, &op, &a, policy);
    size_t ws = conv_bias_act_workspace_bytes(&ctx, &op);
    printf(" %s (%d real channels): %s, workspace %zu bytes%s\n", label, real_c,
           conv_bias_act_fused(&op) ? "fused cuDNN graph" : "FALLBACK (conv2d + add/relu kernels)", ws,
           policy->benchmark ? " (benchmarked)" : "");
    CHECK(ws <= CBA_WORKSPACE_LIMIT);
    ctx.workspace = ws ? dev_bytes(ws) : NULL;

    float *xl = grid_to_layout(c, in.x, s->n, s->c, s->h, s->w);
    float *wl = grid_to_layout(c, in.w, s->k, cba_filter_c(s), s->r, s->s);
    float *zl = a.residual ? grid_to_layout(c, in.z, s->n, s->k, oh, ow) : NULL;
    void *d_x = grid_put(c, dt, xl, nx), *d_w = grid_put(c, dt, wl, nw), *d_b = grid_put(c, dt, in.b, s->k);
    void *d_z = zl ? grid_put(c, dt, zl, ny) : NULL, *d_y = grid_alloc(c, dt, ny);
    conv_bias_act_forward(&ctx, &op, d_x, d_w, d_b, d_z, d_y);
    float *t = grid_get(c, dt, d_y, ny), *got = grid_from_layout(c, t, s->n, s->k, oh, ow);
    snprintf(what, sizeof what, "%s: y (%s)", label, conv_bias_act_fused(&op) ? "fused" : "fallback");
    grid_check(c, what, got, want, ny, grid_bound(c, GRID_CONV));
    if (a.relu) {
        size_t negative = 0;
        for (size_t i = 0; i < ny; i++) negative += got[i] < 0;
        CHECK_MSG(negative == 0, "%s %s: %zu negative values after the ReLU", c->name, label, negative);
    }

    void *dev[] = {d_x, d_w, d_b, d_z, d_y, ctx.workspace};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {want, xl, wl, zl, t, got};
    host_free_all(host, GRID_COUNT(host));
    cba_inputs_free(&in);
    conv_bias_act_destroy(&ctx, &op);
}

/* A plan cache shared by batch sizes (ops/backend_graph.h): batch 8 searched in
 * full, the same shape at 8 again searched in full (the cached engine rebuilt
 * is not the plan it was read from), batch 2 narrowed to it and cuDNN's first
 * two (or searched where none finalizes), each against the CPU reference.
 * Where no fused graph is taken the cache sees nothing. */
static void cba_plan_cache(const GridCase *c) {
    BackendPlanCache *cache = calloc(1, sizeof *cache);
    CHECK(cache != NULL);
    if (!cache) return;
    ConvAlgoPolicy policy = benchmarked_policy;
    policy.plan_cache = cache;
    const int batches[] = {8, 8, 2};
    for (size_t i = 0; i < GRID_COUNT(batches); i++)
        cba_gpu_shape(c, (ConvBiasActShape){CONV(batches[i], 64, 16, 16, 64, 3, 3, 1, 1), 1, 1}, 64, &policy);
    long *n = cache->chosen, total = n[BACKEND_PLAN_SEARCHED] + n[BACKEND_PLAN_NARROWED];
    printf(" plan cache: %ld searched, %ld narrowed; %d kept\n", n[BACKEND_PLAN_SEARCHED], n[BACKEND_PLAN_NARROWED],
           cache->n);
    CHECK_MSG(total == 0 || (total == 3 && n[BACKEND_PLAN_SEARCHED] >= 2), "%s: %ld plans through the cache, %ld "
              "searched", c->name, total, n[BACKEND_PLAN_SEARCHED]);
    if (cache->n) CHECK_MSG(cache->n == 1, "%s: %d kept", c->name, cache->n);
    free(cache);
}

/* ---- the shapes -------------------------------------------------------------------- */

typedef struct {
    Conv2dShape conv;
    int real_c;
    int all_modes; /* 1: every relu/residual combination; 0: the one below */
    int relu, residual;
} CbaShape;

static void cba_shape(const GridCase *c, ConvBiasActShape a, int real_c) {
    if (c->device == DEVICE_CPU) cba_cpu_shape(c, a, real_c);
    else cba_gpu_shape(c, a, real_c, &strict_policy);
}

static void cba_case(const GridCase *c) {
    /* the first layer: 3 channels, padded to 8 with zeros in NHWC */
    Conv2dShape first = c->nhwc ? CONV(4, 8, 32, 32, 64, 3, 3, 1, 1) : CONV(4, 3, 32, 32, 64, 3, 3, 1, 1);
    const CbaShape shapes[] = {
        {CONV(4, 64, 16, 16, 64, 3, 3, 1, 1), 64, 1, 0, 0},   /* ResNet-18-CIFAR's 3x3 */
        {CONV(4, 256, 8, 8, 64, 1, 1, 0, 1), 256, 1, 0, 0},   /* ResNet-50's 1x1 bottleneck */
        {CONV(4, 64, 16, 16, 128, 3, 3, 1, 2), 64, 0, 1, 0},  /* stride-2 3x3, k = 128 */
        {CONV(4, 64, 16, 16, 128, 1, 1, 0, 2), 64, 0, 0, 0},  /* 1x1 stride-2 downsample */
        {CONV(4, 128, 8, 8, 128, 3, 3, 1, 1), 128, 0, 1, 1},  /* k = 128, the block's second conv */
        {first, 3, 0, 1, 0},                                  /* the first layer */
        {CONV(8, 128, 8, 8, 256, 3, 3, 1, 1), 128, 0, 1, 0},  /* SimpleNet's third 3x3 */
        /* grouped: a MobileNet block's depthwise 3x3 (stride 1 and 2, batch norm folded in), a 1x1 in 4 groups */
        {CONVG(4, 64, 16, 16, 64, 3, 3, 1, 1, 64), 64, 1, 0, 0},
        {CONVG(4, 64, 15, 15, 64, 3, 3, 1, 2, 64), 64, 0, 1, 0},
        {CONVG(4, 32, 8, 8, 64, 1, 1, 0, 1, 4), 32, 0, 1, 1},
    };
    for (size_t i = 0; i < GRID_COUNT(shapes); i++) {
        const CbaShape *sh = &shapes[i];
        for (int mode = 0; mode < 4; mode++) {
            int relu = mode & 1, residual = mode >> 1;
            if (!sh->all_modes && (relu != sh->relu || residual != sh->residual)) continue;
            cba_shape(c, (ConvBiasActShape){sh->conv, relu, residual}, sh->real_c);
        }
    }
    if (c->device == DEVICE_CUDA) {
        /* plans picked by timing up to 8 of them */
        cba_gpu_shape(c, (ConvBiasActShape){CONV(4, 64, 16, 16, 64, 3, 3, 1, 1), 1, 1}, 64, &benchmarked_policy);
        cba_gpu_shape(c, (ConvBiasActShape){CONV(4, 64, 16, 16, 128, 1, 1, 0, 2), 0, 0}, 64, &benchmarked_policy);
        cba_plan_cache(c);
    } else {
        /* small and odd: a pad wider than a 1x1 image, an odd stride */
        cba_cpu_shape(c, (ConvBiasActShape){CONV(2, 3, 5, 7, 4, 3, 3, 1, 1), 1, 1}, 3);
        cba_cpu_shape(c, (ConvBiasActShape){CONV(2, 2, 1, 1, 3, 5, 5, 2, 1), 1, 1}, 2);
        cba_cpu_shape(c, (ConvBiasActShape){CONV(1, 2, 5, 4, 2, 2, 3, 2, 3), 0, 1}, 2);
        cba_cpu_shape(c, (ConvBiasActShape){CONVG(2, 4, 6, 5, 4, 5, 5, 2, 2, 4), 1, 1}, 4);
        cba_cpu_shape(c, (ConvBiasActShape){CONVG(1, 4, 5, 5, 6, 3, 3, 1, 1, 2), 0, 1}, 4);
    }
}

/* ---- by hand -------------------------------------------------------------------- */

static void cba_by_hand(uint64_t *rng) {
    (void)rng;
    /* one 3x3 plane 1..9, one 2x2 kernel [1 2; 3 4] gives 37 47 67 77; bias -50 */
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 2, 3, 4}, b[1] = {-50}, z[4] = {1, -20, 2, 3}, y[4];
    ConvBiasActShape a = {CONV(1, 1, 3, 3, 1, 2, 2, 0, 1), 0, 0};
    conv_bias_act_forward_cpu(&a, x, w, b, NULL, y);
    check_values("conv_bias_act y (bias)", y, (double[]){-13, -3, 17, 27}, 4, 1e-6);
    a.relu = 1;
    conv_bias_act_forward_cpu(&a, x, w, b, NULL, y);
    check_values("conv_bias_act y (bias, relu)", y, (double[]){0, 0, 17, 27}, 4, 1e-6);
    a.relu = 0, a.residual = 1;
    conv_bias_act_forward_cpu(&a, x, w, b, z, y);
    check_values("conv_bias_act y (bias, +z)", y, (double[]){-12, -23, 19, 30}, 4, 1e-6);
    a.relu = 1;
    conv_bias_act_forward_cpu(&a, x, w, b, z, y);
    check_values("conv_bias_act y (bias, +z, relu)", y, (double[]){0, 0, 19, 30}, 4, 1e-6);
}

const GridOp grid_op_conv_bias_act = {
    .name = "conv_bias_act",
    .run = cba_case,
    .extras = cba_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW); backward (forward only, for inference)",
};
