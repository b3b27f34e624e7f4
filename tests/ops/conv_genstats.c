/* Convolution with batch-norm statistics and an optional scale-bias-ReLU
 * prologue (ops/conv_genstats.h) through its face, and bn_finalize. On the
 * CPU against the definition summed in double; on the GPU against the CPU
 * reference with x' and y rounded to the dtype where the fallback rounds
 * them, y with conv2d's bounds, and the sums both against the sums of the
 * GPU's own (rounded) y, in double, and against the reference's: a fused
 * engine may sum y before rounding it, a rounding of ~2^-11 (f16) or 2^-8
 * (bf16) per value that averages out over n*p*q of them, inside the same
 * bounds. Shapes: ResNet-18-CIFAR's 3x3, stride-2 3x3 with k = 128 and 1x1
 * stride-2 downsample, with and without the prologue. Each GPU shape prints
 * whether the fused cuDNN graph was taken (the fallback is not a failure).
 * With a prologue, the filter gradient too (backward_filter, added onto
 * random values, and overwriting NaNs): on the CPU against the definition and
 * finite differences, on the GPU against the CPU reference. On the CPU y and sum are measured
 * against the size of their terms, which can cancel (the 1x1 image's 6
 * outputs). bn_finalize against batchnorm_forward_train_cpu's statistics. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/conv_genstats.h"
#include "runtime/gpu.h"
#include "tests/op_checks.h"
#include "tests/ops/grid.h"

#define CGS_WORKSPACE_LIMIT ((size_t)512 << 20)
/* no TF32, deterministic */
static const ConvAlgoPolicy cgs_policy = {.workspace_limit = CGS_WORKSPACE_LIMIT, .deterministic = 1};
/* Timed: a first convolution over the image padded to 8 channels may run conv2d's direct path with the
 * sums in its epilogue; and that path forced. */
static const ConvAlgoPolicy cgs_timed_policy = {.workspace_limit = CGS_WORKSPACE_LIMIT, .deterministic = 1,
                                                .benchmark = 1};
static const ConvAlgoPolicy cgs_direct_policy = {.workspace_limit = CGS_WORKSPACE_LIMIT, .deterministic = 1,
                                                 .benchmark = 1, .prefer_direct = 1};

#define CONV(n_, c_, h_, w_, k_, r_, s_, pad_, stride_) \
    ((Conv2dShape){.n = n_, .c = c_, .h = h_, .w = w_, .k = k_, .r = r_, .s = s_, .pad = pad_, .stride = stride_})

static size_t cgs_x_count(const Conv2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t cgs_w_count(const Conv2dShape *s) { return (size_t)s->k * s->c * s->r * s->s; }
static size_t cgs_plane(const Conv2dShape *s) { return (size_t)conv2d_out_h(s) * conv2d_out_w(s); }
static size_t cgs_y_count(const Conv2dShape *s) { return (size_t)s->n * s->k * cgs_plane(s); }

static void cgs_label(char *buf, size_t size, const ConvGenStatsShape *a) {
    const Conv2dShape *s = &a->conv;
    snprintf(buf, size, "%dx%dx%dx%d k%d %dx%d pad %d stride %d%s", s->n, s->c, s->h, s->w, s->k, s->r, s->s,
             s->pad, s->stride, a->prologue ? " prologue" : "");
}

/* The inputs, NCHW, rounded to the dtype (scale in [0.5, 1.5), bias in [-0.5, 0.5)). */
typedef struct {
    float *x, *scale, *bias, *w;
} CgsInputs;

static CgsInputs cgs_inputs(const GridCase *c, DType dt, const ConvGenStatsShape *a) {
    const Conv2dShape *s = &a->conv;
    float w_scale = 1.0f / sqrtf((float)(s->c * s->r * s->s));
    CgsInputs in;
    in.x = grid_random(c, dt, cgs_x_count(s), -1, 1);
    in.x[0] = 1; /* x' > 0 there: the 1x1 image's 4 values are never all cut by the ReLU */
    in.scale = grid_random(c, dt, s->c, 0.5f, 1.5f);
    in.bias = grid_random(c, dt, s->c, -0.5f, 0.5f);
    in.w = grid_random(c, dt, cgs_w_count(s), -w_scale, w_scale);
    return in;
}

static void cgs_inputs_free(CgsInputs *in) {
    void *host[] = {in->x, in->scale, in->bias, in->w};
    host_free_all(host, GRID_COUNT(host));
}

/* Per channel of y [n][k][plane]: sums of y and y^2 in double, as floats. */
static void cgs_sums(const Conv2dShape *s, const float *y, float *sum, float *sqsum) {
    size_t plane = cgs_plane(s);
    for (int k = 0; k < s->k; k++) {
        double s1 = 0, s2 = 0;
        for (int n = 0; n < s->n; n++)
            for (size_t p = 0; p < plane; p++) {
                double v = y[((size_t)n * s->k + k) * plane + p];
                s1 += v, s2 += v * v;
            }
        sum[k] = (float)s1, sqsum[k] = (float)s2;
    }
}

/* ---- the CPU against the definition in double ------------------------------------- */

static double naive_input(const ConvGenStatsShape *a, const CgsInputs *in, int n, int c, int ih, int iw) {
    const Conv2dShape *s = &a->conv;
    double v = in->x[(((size_t)n * s->c + c) * s->h + ih) * s->w + iw];
    if (!a->prologue) return v;
    v = v * in->scale[c] + in->bias[c];
    return v < 0 ? 0 : v;
}

/* The definition in double: y, sum and sqsum, and beside y and sum the sums
 * of their terms' absolute values (an fp32 sum is off by a few roundings of
 * that, however far its terms cancel). */
typedef struct {
    double *y, *y_size, *sum, *sum_size, *sqsum;
} CgsExact;

static CgsExact cgs_exact(const Conv2dShape *s) {
    size_t ny = cgs_y_count(s), k = (size_t)s->k;
    double *all = malloc(sizeof(double) * (2 * ny + 3 * k));
    CgsExact e = {all, all + ny, all + 2 * ny, all + 2 * ny + k, all + 2 * ny + 2 * k};
    return e;
}

static void naive_conv_genstats(const ConvGenStatsShape *a, const CgsInputs *in, CgsExact *e) {
    const Conv2dShape *s = &a->conv;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    for (int k = 0; k < s->k; k++) e->sum[k] = e->sum_size[k] = e->sqsum[k] = 0;
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    double acc = 0, size = 0;
                    for (int c = 0; c < s->c; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                double term = naive_input(a, in, n, c, ih, iw) *
                                              in->w[(((size_t)k * s->c + c) * s->r + r) * s->s + t];
                                acc += term, size += fabs(term);
                            }
                    size_t at = (((size_t)n * s->k + k) * oh + p) * ow + q;
                    e->y[at] = acc, e->y_size[at] = size;
                    e->sum[k] += acc, e->sum_size[k] += size, e->sqsum[k] += acc * acc;
                }
}

/* got against exact, relative to the size of its terms where size is given. */
static void cgs_check_double(const GridCase *c, const char *label, const char *name, const float *got,
                             const double *exact, const double *size, size_t n, double bound) {
    char what[220];
    float *want = host_floats(n);
    for (size_t i = 0; i < n; i++) want[i] = (float)exact[i];
    snprintf(what, sizeof what, "%s: %s", label, name);
    if (size) grid_check_sums(c, what, got, want, size, (int)n, bound);
    else grid_check(c, what, got, want, n, bound);
    free(want);
}

/* dw[k][c][r][t] = sum over n, p, q of x'[n][c][ih][iw] * dy[n][k][p][q] in
 * double, added to dw0, with the sizes of its terms (dw0's among them). */
static void naive_filter_grad(const ConvGenStatsShape *a, const CgsInputs *in, const float *dy, const float *dw0,
                              double *dw, double *size) {
    const Conv2dShape *s = &a->conv;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    for (size_t i = 0; i < cgs_w_count(s); i++) dw[i] = dw0[i], size[i] = fabs(dw0[i]);
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    double g = dy[(((size_t)n * s->k + k) * oh + p) * ow + q];
                    for (int c = 0; c < s->c; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                size_t wi = (((size_t)k * s->c + c) * s->r + r) * s->s + t;
                                double term = g * naive_input(a, in, n, c, ih, iw);
                                dw[wi] += term, size[wi] += fabs(term);
                            }
                }
}

typedef struct {
    const ConvGenStatsShape *a;
    const CgsInputs *in;
    float *y, *sum, *sqsum;
    const float *r;
} CgsLoss;

static double cgs_loss(void *p) {
    CgsLoss *l = p;
    conv_genstats_forward_cpu(l->a, l->in->x, l->in->scale, l->in->bias, l->in->w, l->y, l->sum, l->sqsum);
    return weighted_sum(l->y, l->r, cgs_y_count(&l->a->conv));
}

/* backward_filter on the CPU: onto random dw0 against the definition, and
 * (less dw0, small shapes) against finite differences of sum(y * dy) in w;
 * overwriting NaNs against the definition. */
static void cgs_cpu_filter_grad(const GridCase *c, ConvGenStatsShape a, const char *label, int differences) {
    const Conv2dShape *s = &a.conv;
    char what[220];
    size_t nw = cgs_w_count(s), ny = cgs_y_count(s);
    CgsInputs in = cgs_inputs(c, DTYPE_F32, &a);
    float *dy = grid_random(c, DTYPE_F32, ny, -1, 1), *dw0 = grid_random(c, DTYPE_F32, nw, -1, 1);
    float *dw = copy_floats(dw0, nw);
    ConvGenStats op;
    conv_genstats_init(&c->ctx, &op, &a, &cgs_policy);
    conv_genstats_backward_filter(&c->ctx, &op, in.x, in.scale, in.bias, dy, dw, 1);
    double *exact = malloc(sizeof(double) * 2 * nw);
    naive_filter_grad(&a, &in, dy, dw0, exact, exact + nw);
    cgs_check_double(c, label, "dw (added to)", dw, exact, exact + nw, nw, 1e-5);
    float *zeros = host_floats(nw), *dw_set = host_floats(nw);
    grid_fill_nan(dw_set, nw);
    conv_genstats_backward_filter(&c->ctx, &op, in.x, in.scale, in.bias, dy, dw_set, 0);
    naive_filter_grad(&a, &in, dy, zeros, exact, exact + nw);
    cgs_check_double(c, label, "dw (overwriting NaN)", dw_set, exact, exact + nw, nw, 1e-5);
    for (size_t i = 0; i < nw; i++) dw[i] -= dw0[i];
    CgsLoss l = {&a, &in, host_floats(ny), host_floats(s->k), host_floats(s->k), dy};
    if (differences) {
        numeric_gradient(in.w, nw, 1e-2f, cgs_loss, &l, exact);
        snprintf(what, sizeof what, "%s: dw", label);
        check_gradient(what, dw, exact, nw);
    }
    conv_genstats_destroy(&c->ctx, &op);
    void *host[] = {dy, dw0, dw, zeros, dw_set, exact, l.y, l.sum, l.sqsum};
    host_free_all(host, GRID_COUNT(host));
    cgs_inputs_free(&in);
}

static void cgs_cpu_shape(const GridCase *c, ConvGenStatsShape a) {
    const Conv2dShape *s = &a.conv;
    char label[160];
    cgs_label(label, sizeof label, &a);
    size_t ny = cgs_y_count(s);
    CgsInputs in = cgs_inputs(c, DTYPE_F32, &a);
    ConvGenStats op;
    conv_genstats_init(&c->ctx, &op, &a, &cgs_policy);
    CHECK(conv_genstats_workspace_bytes(&c->ctx, &op) == 0 && !conv_genstats_fused(&op));
    float *y = host_floats(ny), *sum = host_floats(s->k), *sqsum = host_floats(s->k);
    grid_fill_nan(y, ny), grid_fill_nan(sum, s->k), grid_fill_nan(sqsum, s->k);
    conv_genstats_forward(&c->ctx, &op, in.x, a.prologue ? in.scale : NULL, a.prologue ? in.bias : NULL, in.w, y,
                          sum, sqsum);
    CgsExact e = cgs_exact(s);
    naive_conv_genstats(&a, &in, &e);
    cgs_check_double(c, label, "y", y, e.y, e.y_size, ny, 1e-5);
    cgs_check_double(c, label, "sum", sum, e.sum, e.sum_size, s->k, 1e-5);
    cgs_check_double(c, label, "sqsum", sqsum, e.sqsum, NULL, s->k, 1e-5);
    conv_genstats_destroy(&c->ctx, &op);
    void *host[] = {y, sum, sqsum, e.y};
    host_free_all(host, GRID_COUNT(host));
    cgs_inputs_free(&in);
    if (a.prologue) cgs_cpu_filter_grad(c, a, label, ny < 1000);
}

/* ---- the GPU against the CPU reference --------------------------------------------- */

/* backward_filter on the GPU onto a random dw0, against dw0 plus the CPU
 * reference on x' rounded to the dtype (the fallback's; the fused graph's x'
 * is fp32, a rounding apart), rounded; and overwriting NaNs, against the
 * reference alone. */
static void cgs_gpu_filter_grad(const GridCase *c, const OpContext *ctx, const ConvGenStats *op,
                                const CgsInputs *in, const char *label) {
    const ConvGenStatsShape *a = &op->shape;
    const Conv2dShape *s = &a->conv;
    DType dt = c->dtype;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    size_t nx = cgs_x_count(s), nw = cgs_w_count(s), ny = cgs_y_count(s);
    float *dy = grid_random(c, dt, ny, -1, 1), *xp = host_floats(nx), *grad = host_floats(nw);
    conv_genstats_prologue_cpu(s, in->x, in->scale, in->bias, xp);
    round_to(dt, xp, nx);
    conv2d_backward_ex_cpu(s, xp, NULL, dy, NULL, grad, NULL, 0);
    float *dw0 = grid_accumulator_start(c, dt, grad, nw), *want = host_floats(nw);
    for (size_t i = 0; i < nw; i++) want[i] = dw0[i] + grad[i];
    round_to(dt, want, nw);
    float *xl = grid_to_layout(c, in->x, s->n, s->c, s->h, s->w), *dyl = grid_to_layout(c, dy, s->n, s->k, oh, ow);
    float *dw0l = grid_to_layout(c, dw0, s->k, s->c, s->r, s->s);
    void *d_x = grid_put(c, dt, xl, nx), *d_dy = grid_put(c, dt, dyl, ny), *d_dw = grid_put(c, dt, dw0l, nw);
    void *d_scale = grid_put(c, dt, in->scale, s->c), *d_bias = grid_put(c, dt, in->bias, s->c);
    conv_genstats_backward_filter(ctx, op, d_x, d_scale, d_bias, d_dy, d_dw, 1);
    float *t = grid_get(c, dt, d_dw, nw), *got = grid_from_layout(c, t, s->k, s->c, s->r, s->s);
    char what[220];
    int fused = conv_genstats_filter_fused(op);
    printf(" %s filter gradient: %s\n", label, fused ? "fused cuDNN graph" : "FALLBACK (prologue kernel + conv2d)");
    snprintf(what, sizeof what, "%s: dw added to (%s)", label, fused ? "fused" : "fallback");
    double bound = grid_bound(c, GRID_CONV);
    grid_check(c, what, got, want, nw, bound);
    grid_fill_nan(dw0l, nw);
    void *d_dw_set = grid_put(c, dt, dw0l, nw);
    conv_genstats_backward_filter(ctx, op, d_x, d_scale, d_bias, d_dy, d_dw_set, 0);
    float *t_set = grid_get(c, dt, d_dw_set, nw), *got_set = grid_from_layout(c, t_set, s->k, s->c, s->r, s->s);
    round_to(dt, grad, nw);
    snprintf(what, sizeof what, "%s: dw overwriting NaN (%s)", label, fused ? "fused" : "fallback");
    grid_check(c, what, got_set, grad, nw, bound);
    void *dev[] = {d_x, d_dy, d_dw, d_dw_set, d_scale, d_bias};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {dy, xp, grad, dw0, want, xl, dyl, dw0l, t, got, t_set, got_set};
    host_free_all(host, GRID_COUNT(host));
}

static void cgs_gpu_shape(const GridCase *c, ConvGenStatsShape a, const ConvAlgoPolicy *policy) {
    const Conv2dShape *s = &a.conv;
    DType dt = c->dtype;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    size_t nx = cgs_x_count(s), nw = cgs_w_count(s), ny = cgs_y_count(s);
    char label[160], what[220];
    cgs_label(label, sizeof label, &a);
    CgsInputs in = cgs_inputs(c, dt, &a);
    /* the reference, rounding x' and y where the fallback does */
    float *xp = copy_floats(in.x, nx), *want = host_floats(ny);
    if (a.prologue) conv_genstats_prologue_cpu(s, in.x, in.scale, in.bias, xp);
    round_to(dt, xp, nx);
    conv2d_forward_cpu(s, xp, in.w, NULL, want);
    round_to(dt, want, ny);
    float *want_sum = host_floats(s->k), *want_sqsum = host_floats(s->k);
    cgs_sums(s, want, want_sum, want_sqsum);

    OpContext ctx = c->ctx;
    ConvGenStats op;
    conv_genstats_init(&ctx, &op, &a, policy);
    int fused = conv_genstats_fused(&op);
    size_t ws = conv_genstats_workspace_bytes(&ctx, &op);
    const char *path = conv_genstats_path(&op);
    printf(" %s: %s (graph %.1f us, direct %.1f us), workspace %zu bytes\n", label, path,
           1000.0f * op.cuda.graph.plan_ms, op.cuda.direct_us, ws);
    int direct_fits = conv2d_direct_fits(s, dt, c->nhwc) && !a.prologue;
    if (policy->prefer_direct)
        CHECK_MSG(op.cuda.direct == direct_fits && (strcmp(path, "direct kernel") == 0) == direct_fits,
                  "%s: the direct path %s (%s)", label, direct_fits ? "not taken where it fits" : "taken", path);
    if (!policy->benchmark) CHECK_MSG(!op.cuda.direct, "%s: the direct path taken untimed", label);
    CHECK(fused || ws <= CGS_WORKSPACE_LIMIT + (a.prologue ? nx * dtype_size(dt) + 256 : 0));
    ctx.workspace = ws ? dev_bytes(ws) : NULL;

    float *xl = grid_to_layout(c, in.x, s->n, s->c, s->h, s->w), *wl = grid_to_layout(c, in.w, s->k, s->c, s->r, s->s);
    void *d_x = grid_put(c, dt, xl, nx), *d_w = grid_put(c, dt, wl, nw);
    void *d_scale = a.prologue ? grid_put(c, dt, in.scale, s->c) : NULL;
    void *d_bias = a.prologue ? grid_put(c, dt, in.bias, s->c) : NULL;
    void *d_y = grid_alloc(c, dt, ny), *d_sum = grid_alloc(c, DTYPE_F32, s->k), *d_sqsum = grid_alloc(c, DTYPE_F32, s->k);
    conv_genstats_forward(&ctx, &op, d_x, d_scale, d_bias, d_w, d_y, d_sum, d_sqsum);
    float *t = grid_get(c, dt, d_y, ny), *got = grid_from_layout(c, t, s->n, s->k, oh, ow);
    float *sum = grid_get(c, DTYPE_F32, d_sum, s->k), *sqsum = grid_get(c, DTYPE_F32, d_sqsum, s->k);
    float *own_sum = host_floats(s->k), *own_sqsum = host_floats(s->k);
    cgs_sums(s, got, own_sum, own_sqsum);
    double bound = grid_bound(c, GRID_CONV);
    snprintf(what, sizeof what, "%s: y (%s)", label, path);
    grid_check(c, what, got, want, ny, bound);
    snprintf(what, sizeof what, "%s: sum of its own y (%s)", label, path);
    grid_check(c, what, sum, own_sum, s->k, bound);
    snprintf(what, sizeof what, "%s: sqsum of its own y (%s)", label, path);
    grid_check(c, what, sqsum, own_sqsum, s->k, bound);
    snprintf(what, sizeof what, "%s: sum (%s)", label, path);
    grid_check(c, what, sum, want_sum, s->k, bound);
    snprintf(what, sizeof what, "%s: sqsum (%s)", label, path);
    grid_check(c, what, sqsum, want_sqsum, s->k, bound);
    if (a.prologue) cgs_gpu_filter_grad(c, &ctx, &op, &in, label);

    void *dev[] = {d_x, d_w, d_scale, d_bias, d_y, d_sum, d_sqsum, ctx.workspace};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {xp, want, want_sum, want_sqsum, xl, wl, t, got, sum, sqsum, own_sum, own_sqsum};
    host_free_all(host, GRID_COUNT(host));
    cgs_inputs_free(&in);
    conv_genstats_destroy(&ctx, &op);
}

/* ---- bn_finalize against batchnorm_forward_train_cpu -------------------------------- */

typedef struct {
    float *gamma, *beta, *running_mean, *running_var, *save_mean, *save_invstd, *scale, *bias;
} FinalizeOut;

static FinalizeOut finalize_out(int ch) {
    FinalizeOut o = {host_floats(ch), host_floats(ch), host_floats(ch), host_floats(ch),
                     host_floats(ch), host_floats(ch), host_floats(ch), host_floats(ch)};
    return o;
}

static void finalize_out_free(FinalizeOut *o) {
    void *host[] = {o->gamma, o->beta, o->running_mean, o->running_var, o->save_mean, o->save_invstd, o->scale,
                    o->bias};
    host_free_all(host, GRID_COUNT(host));
}

/* A batch-norm input [n][ch][h][w] with means about as large as its spreads
 * (fp32 sums of squares keep the variance to ~1e-6 there). */
static float *finalize_input(uint64_t *rng, const BatchNormShape *b) {
    size_t plane = (size_t)b->h * b->w, count = (size_t)b->n * b->c * plane;
    float *x = host_floats(count);
    for (int n = 0; n < b->n; n++)
        for (int c = 0; c < b->c; c++)
            for (size_t p = 0; p < plane; p++)
                x[((size_t)n * b->c + c) * plane + p] = 0.5f * (c % 3 - 1) + test_uniform(rng, -1.0f, 1.0f);
    return x;
}

static void cgs_finalize(uint64_t *rng) {
    BatchNormShape b = {4, 16, 6, 5};
    size_t plane = (size_t)b.h * b.w, count = (size_t)b.n * b.c * plane;
    int64_t m = (int64_t)b.n * plane;
    float *x = finalize_input(rng, &b), *y = host_floats(count), *sum = host_floats(b.c), *sqsum = host_floats(b.c);
    for (int c = 0; c < b.c; c++) {
        double s1 = 0, s2 = 0;
        for (int n = 0; n < b.n; n++)
            for (size_t p = 0; p < plane; p++) {
                double v = x[((size_t)n * b.c + c) * plane + p];
                s1 += v, s2 += v * v;
            }
        sum[c] = (float)s1, sqsum[c] = (float)s2;
    }
    FinalizeOut bn = finalize_out(b.c), fin = finalize_out(b.c);
    for (int c = 0; c < b.c; c++) {
        bn.gamma[c] = fin.gamma[c] = 0.5f + 0.1f * c;
        bn.beta[c] = fin.beta[c] = 0.3f - 0.05f * c;
        bn.running_mean[c] = fin.running_mean[c] = 0.1f * c;
        bn.running_var[c] = fin.running_var[c] = 1.0f + 0.2f * c;
    }
    const float momentum = 0.1f, eps = 1e-5f;
    batchnorm_forward_train_cpu(&b, x, bn.gamma, bn.beta, momentum, eps, bn.running_mean, bn.running_var,
                                bn.save_mean, bn.save_invstd, y);
    BatchNormParams p = {.gamma = fin.gamma, .beta = fin.beta, .running_mean = fin.running_mean,
                         .running_var = fin.running_var, .save_mean = fin.save_mean, .save_invstd = fin.save_invstd,
                         .momentum = momentum, .eps = eps};
    bn_finalize_cpu(b.c, m, sum, sqsum, &p, fin.scale, fin.bias);
    double want_scale[64], want_bias[64], want[64];
    const float *pairs[4][2] = {{fin.save_mean, bn.save_mean}, {fin.save_invstd, bn.save_invstd},
                                {fin.running_mean, bn.running_mean}, {fin.running_var, bn.running_var}};
    const char *names[4] = {"bn_finalize save_mean", "bn_finalize save_invstd", "bn_finalize running_mean",
                            "bn_finalize running_var"};
    for (int i = 0; i < 4; i++) {
        for (int c = 0; c < b.c; c++) want[c] = pairs[i][1][c];
        check_values(names[i], pairs[i][0], want, b.c, 1e-5);
    }
    for (int c = 0; c < b.c; c++) {
        want_scale[c] = (double)bn.gamma[c] * bn.save_invstd[c];
        want_bias[c] = bn.beta[c] - (double)bn.save_mean[c] * want_scale[c];
    }
    check_values("bn_finalize scale", fin.scale, want_scale, b.c, 1e-5);
    check_values("bn_finalize bias", fin.bias, want_bias, b.c, 1e-5);
    /* x * scale + bias is the batch norm's y */
    float *z = host_floats(count);
    double *want_y = malloc(sizeof(double) * count);
    for (int n = 0; n < b.n; n++)
        for (int c = 0; c < b.c; c++)
            for (size_t q = 0; q < plane; q++) {
                size_t at = ((size_t)n * b.c + c) * plane + q;
                z[at] = x[at] * fin.scale[c] + fin.bias[c];
                want_y[at] = y[at];
            }
    check_values("bn_finalize: x * scale + bias against batchnorm's y", z, want_y, count, 1e-4);
    /* momentum 0 and NULL buffers leave the running statistics alone */
    float before = fin.running_mean[1];
    p.momentum = 0.0f, p.save_mean = p.save_invstd = NULL;
    bn_finalize_cpu(b.c, m, sum, sqsum, &p, fin.scale, fin.bias);
    CHECK(fin.running_mean[1] == before);
    void *host[] = {x, y, sum, sqsum, z, want_y};
    host_free_all(host, GRID_COUNT(host));
    finalize_out_free(&bn);
    finalize_out_free(&fin);
}

/* bn_finalize on the GPU against the CPU's, scale and bias rounded to the dtype. */
static void cgs_finalize_gpu(const GridCase *c) {
    enum { CH = 64 };
    const int64_t m = 1024;
    float *sum = grid_random(c, DTYPE_F32, CH, -100, 100), *sqsum = grid_random(c, DTYPE_F32, CH, 1000, 2000);
    FinalizeOut cpu = finalize_out(CH);
    for (int i = 0; i < CH; i++)
        cpu.gamma[i] = 0.5f + 0.01f * i, cpu.beta[i] = 0.1f * (i % 5), cpu.running_mean[i] = 0.01f * i,
        cpu.running_var[i] = 1.0f;
    float *host_in[] = {cpu.gamma, cpu.beta, cpu.running_mean, cpu.running_var, sum, sqsum};
    void *dev[8];
    for (int i = 0; i < 6; i++) dev[i] = grid_put(c, DTYPE_F32, host_in[i], CH);
    dev[6] = grid_alloc(c, DTYPE_F32, CH), dev[7] = grid_alloc(c, DTYPE_F32, CH);
    void *d_scale = grid_alloc(c, c->dtype, CH), *d_bias = grid_alloc(c, c->dtype, CH);
    BatchNormParams dp = {.gamma = dev[0], .beta = dev[1], .running_mean = dev[2], .running_var = dev[3],
                          .save_mean = dev[6], .save_invstd = dev[7], .momentum = 0.1f, .eps = 1e-5f};
    bn_finalize(&c->ctx, CH, m, dev[4], dev[5], &dp, d_scale, d_bias);
    BatchNormParams hp = {.gamma = cpu.gamma, .beta = cpu.beta, .running_mean = cpu.running_mean,
                          .running_var = cpu.running_var, .save_mean = cpu.save_mean,
                          .save_invstd = cpu.save_invstd, .momentum = 0.1f, .eps = 1e-5f};
    bn_finalize_cpu(CH, m, sum, sqsum, &hp, cpu.scale, cpu.bias);
    round_to(c->dtype, cpu.scale, CH), round_to(c->dtype, cpu.bias, CH);
    float *got[6] = {grid_get(c, c->dtype, d_scale, CH), grid_get(c, c->dtype, d_bias, CH),
                     grid_get(c, DTYPE_F32, dev[6], CH), grid_get(c, DTYPE_F32, dev[7], CH),
                     grid_get(c, DTYPE_F32, dev[2], CH), grid_get(c, DTYPE_F32, dev[3], CH)};
    const float *want[6] = {cpu.scale, cpu.bias, cpu.save_mean, cpu.save_invstd, cpu.running_mean, cpu.running_var};
    const char *names[6] = {"bn_finalize scale", "bn_finalize bias", "bn_finalize save_mean",
                            "bn_finalize save_invstd", "bn_finalize running_mean", "bn_finalize running_var"};
    /* the same double arithmetic; scale and bias one rounding of a float apart */
    for (int i = 0; i < 6; i++) grid_check(c, names[i], got[i], want[i], CH, i < 2 ? grid_bound(c, GRID_GEMM) : 1e-6);
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *more[] = {d_scale, d_bias};
    grid_free_all(c, more, GRID_COUNT(more));
    void *host[] = {sum, sqsum, got[0], got[1], got[2], got[3], got[4], got[5]};
    host_free_all(host, GRID_COUNT(host));
    finalize_out_free(&cpu);
}

/* ---- the shapes -------------------------------------------------------------------- */

static void cgs_case(const GridCase *c) {
    const Conv2dShape shapes[] = {
        CONV(4, 64, 16, 16, 64, 3, 3, 1, 1),  /* ResNet-18-CIFAR's 3x3 */
        CONV(8, 64, 16, 16, 128, 3, 3, 1, 2), /* stride-2 3x3, k = 128 */
        CONV(8, 64, 16, 16, 128, 1, 1, 0, 2), /* 1x1 stride-2 downsample */
    };
    for (size_t i = 0; i < GRID_COUNT(shapes); i++)
        for (int prologue = 0; prologue < 2; prologue++) {
            ConvGenStatsShape a = {shapes[i], prologue};
            if (c->device == DEVICE_CPU) cgs_cpu_shape(c, a);
            else cgs_gpu_shape(c, a, &cgs_policy);
        }
    if (c->device == DEVICE_CUDA) {
        /* ResNet-18's stem over the image padded to 8 channels, timed and forced onto the direct path; an odd
         * size (765 pixels) with 32 outputs forced; with a prologue the direct path does not fit */
        cgs_gpu_shape(c, (ConvGenStatsShape){CONV(8, 8, 32, 32, 64, 3, 3, 1, 1), 0}, &cgs_timed_policy);
        cgs_gpu_shape(c, (ConvGenStatsShape){CONV(8, 8, 32, 32, 64, 3, 3, 1, 1), 0}, &cgs_direct_policy);
        cgs_gpu_shape(c, (ConvGenStatsShape){CONV(3, 8, 15, 17, 32, 3, 3, 1, 1), 0}, &cgs_direct_policy);
        cgs_gpu_shape(c, (ConvGenStatsShape){CONV(3, 8, 15, 17, 32, 3, 3, 1, 1), 1}, &cgs_direct_policy);
        cgs_finalize_gpu(c);
    } else {
        /* small and odd: a pad wider than a 1x1 image, an odd stride */
        cgs_cpu_shape(c, (ConvGenStatsShape){CONV(2, 3, 5, 7, 4, 3, 3, 1, 1), 1});
        cgs_cpu_shape(c, (ConvGenStatsShape){CONV(2, 2, 1, 1, 3, 5, 5, 2, 1), 1});
        cgs_cpu_shape(c, (ConvGenStatsShape){CONV(1, 2, 5, 4, 2, 2, 3, 2, 3), 0});
    }
}

/* ---- by hand -------------------------------------------------------------------- */

static void cgs_by_hand(uint64_t *rng) {
    /* one 3x3 plane 1..9, one 2x2 kernel [1 2; 3 4] gives 37 47 67 77 */
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 2, 3, 4}, y[4], sum[1], sqsum[1];
    ConvGenStatsShape a = {CONV(1, 1, 3, 3, 1, 2, 2, 0, 1), 0};
    conv_genstats_forward_cpu(&a, x, NULL, NULL, w, y, sum, sqsum);
    check_values("conv_genstats y", y, (double[]){37, 47, 67, 77}, 4, 1e-6);
    check_values("conv_genstats sum", sum, (double[]){228}, 1, 1e-6);
    check_values("conv_genstats sqsum", sqsum, (double[]){37 * 37 + 47 * 47 + 67 * 67 + 77 * 77}, 1, 1e-6);
    /* prologue x' = relu(x * 2 - 9): 0 0 0 0 1 3 5 7 9 */
    float scale[1] = {2}, bias[1] = {-9};
    a.prologue = 1;
    conv_genstats_forward_cpu(&a, x, scale, bias, w, y, sum, sqsum);
    /* windows [0 0; 0 1] [0 0; 1 3] [0 1; 5 7] [1 3; 7 9] */
    check_values("conv_genstats y (prologue)", y, (double[]){4, 15, 2 + 15 + 28, 1 + 6 + 21 + 36}, 4, 1e-6);
    check_values("conv_genstats sum (prologue)", sum, (double[]){4 + 15 + 45 + 64}, 1, 1e-6);
    cgs_finalize(rng);
}

const GridOp grid_op_conv_genstats = {
    .name = "conv_genstats",
    .run = cgs_case,
    .extras = cgs_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW); backward without a prologue (conv2d's)",
};
