/* A convolution's data gradient with its input's ReLU and batch norm backward
 * (ops/conv_dgrad_dbn.h) through its face. The inputs keep every
 * z = (x - mean) * invstd * gamma + beta at least CDD_Z_GAP from 0 (x moved
 * where it is not), so that no rounding decides the ReLU's mask.
 * On the CPU: dx, dgamma and dbeta against the definition in double (the
 * data gradient by its sum, the norm's backward by its formula), and by
 * central finite differences of L = sum dy * conv(relu(bn(x)), w), bn
 * normalizing by the batch's statistics, in x, gamma and beta.
 * On the GPU: against the CPU reference, dx overwritten and added onto random
 * values, dgamma and dbeta added onto random values (the norm's gradient
 * stored in the dtype between its passes, the convolution's bounds). Each
 * shape prints whether the fused cuDNN graph was taken (the fallback is not a
 * failure). Shapes: ResNet-18-CIFAR's 3x3, a stride-2 3x3 with k = 128 and a
 * 1x1 stride-2 downsample; on the CPU small odd ones. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/conv_dgrad_dbn.h"
#include "runtime/gpu.h"
#include "tests/op_checks.h"
#include "tests/ops/grid.h"

#define CDD_EPS 1e-5f
#define CDD_Z_GAP 0.05
#define CDD_WORKSPACE_LIMIT ((size_t)512 << 20)
/* no TF32; not deterministic: the fused graph's reductions may not be */
static const ConvAlgoPolicy cdd_policy = {.workspace_limit = CDD_WORKSPACE_LIMIT};

#define CONV(n_, c_, h_, w_, k_, r_, s_, pad_, stride_) \
    ((Conv2dShape){.n = n_, .c = c_, .h = h_, .w = w_, .k = k_, .r = r_, .s = s_, .pad = pad_, .stride = stride_})

static size_t cdd_x_count(const Conv2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t cdd_w_count(const Conv2dShape *s) { return (size_t)s->k * s->c * s->r * s->s; }
static size_t cdd_plane(const Conv2dShape *s) { return (size_t)s->h * s->w; }
static size_t cdd_y_count(const Conv2dShape *s) { return (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s); }
#define X_AT(s, x, n, c, p) ((x)[((size_t)(n) * (s)->c + (c)) * cdd_plane(s) + (p)])

static void cdd_label(char *buf, size_t size, const Conv2dShape *s) {
    snprintf(buf, size, "%dx%dx%dx%d k%d %dx%d pad %d stride %d", s->n, s->c, s->h, s->w, s->k, s->r, s->s, s->pad,
             s->stride);
}

/* The inputs, NCHW: x, w and dy rounded to the dtype; the norm's parameters
 * and its statistics of x (fp32). */
typedef struct {
    float *x, *w, *dy, *gamma, *beta, *mean, *invstd;
} CddInputs;

/* Channel c's mean and invstd (biased variance) over the batch, in double. */
static void channel_statistics(const Conv2dShape *s, const float *x, int c, double *mean, double *invstd) {
    double m = (double)s->n * cdd_plane(s), sum = 0, sq = 0;
    for (int n = 0; n < s->n; n++)
        for (size_t p = 0; p < cdd_plane(s); p++) sum += X_AT(s, x, n, c, p);
    *mean = sum / m;
    for (int n = 0; n < s->n; n++)
        for (size_t p = 0; p < cdd_plane(s); p++) sq += pow(X_AT(s, x, n, c, p) - *mean, 2);
    *invstd = 1.0 / sqrt(sq / m + CDD_EPS);
}

/* The saved statistics of x, as floats. */
static void cdd_statistics(const Conv2dShape *s, CddInputs *in) {
    for (int c = 0; c < s->c; c++) {
        double mean, invstd;
        channel_statistics(s, in->x, c, &mean, &invstd);
        in->mean[c] = (float)mean, in->invstd[c] = (float)invstd;
    }
}

static double cdd_z(const CddInputs *in, int c, double x) {
    return (x - in->mean[c]) * in->invstd[c] * in->gamma[c] + in->beta[c];
}

/* Moves each x whose z lies within CDD_Z_GAP of 0 to z = +-2 CDD_Z_GAP (its
 * side), rounded to dt; the statistics move with it, so again until none is
 * left. */
static void cdd_keep_off_kink(const Conv2dShape *s, DType dt, CddInputs *in) {
    for (int round = 1; round <= 20; round++) {
        cdd_statistics(s, in);
        int moved = 0;
        for (int n = 0; n < s->n; n++)
            for (int c = 0; c < s->c; c++)
                for (size_t p = 0; p < cdd_plane(s); p++) {
                    float *x = &X_AT(s, in->x, n, c, p);
                    double z = cdd_z(in, c, *x);
                    if (fabs(z) >= CDD_Z_GAP) continue;
                    double target = z < 0 ? -2 * CDD_Z_GAP : 2 * CDD_Z_GAP;
                    *x = (float)(in->mean[c] + (target - in->beta[c]) / in->gamma[c] / in->invstd[c]);
                    round_to(dt, x, 1);
                    moved++;
                }
        if (!moved) return;
    }
    CHECK_MSG(0, "conv_dgrad_dbn: inputs still near the ReLU's kink after 20 rounds");
}

static CddInputs cdd_inputs(const GridCase *c, DType dt, const Conv2dShape *s) {
    float w_scale = 1.0f / sqrtf((float)(s->c * s->r * s->s));
    CddInputs in;
    in.x = grid_random(c, dt, cdd_x_count(s), -1, 1);
    in.w = grid_random(c, dt, cdd_w_count(s), -w_scale, w_scale);
    in.dy = grid_random(c, dt, cdd_y_count(s), -1, 1);
    in.gamma = grid_random(c, DTYPE_F32, s->c, 0.5f, 1.5f);
    in.beta = grid_random(c, DTYPE_F32, s->c, -0.5f, 0.5f);
    in.mean = host_floats(s->c);
    in.invstd = host_floats(s->c);
    cdd_keep_off_kink(s, dt, &in);
    return in;
}

static void cdd_inputs_free(CddInputs *in) {
    void *host[] = {in->x, in->w, in->dy, in->gamma, in->beta, in->mean, in->invstd};
    host_free_all(host, GRID_COUNT(host));
}

static BatchNormParams cdd_params(const CddInputs *in) {
    return (BatchNormParams){.gamma = in->gamma, .beta = in->beta, .save_mean = in->mean, .save_invstd = in->invstd,
                             .eps = CDD_EPS};
}

/* ---- the CPU against the definition in double, and finite differences -------------- */

/* g = dgrad(w, dy) in double, NCHW. */
static void naive_dgrad(const Conv2dShape *s, const CddInputs *in, double *g) {
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    memset(g, 0, sizeof(double) * cdd_x_count(s));
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    double d = in->dy[(((size_t)n * s->k + k) * oh + p) * ow + q];
                    for (int c = 0; c < s->c; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                g[(((size_t)n * s->c + c) * s->h + ih) * s->w + iw] +=
                                    d * in->w[(((size_t)k * s->c + c) * s->r + r) * s->s + t];
                            }
                }
}

/* dx, dgamma, dbeta by the definition (conv_dgrad_dbn.h), in double. */
static void naive_backward(const Conv2dShape *s, const CddInputs *in, double *dx, double *dgamma, double *dbeta) {
    double *g = malloc(sizeof(double) * cdd_x_count(s)), m = (double)s->n * cdd_plane(s);
    naive_dgrad(s, in, g);
    for (int c = 0; c < s->c; c++) {
        double sum_dz = 0, sum_dz_xhat = 0;
        for (int n = 0; n < s->n; n++)
            for (size_t p = 0; p < cdd_plane(s); p++) {
                double x = X_AT(s, in->x, n, c, p), xhat = (x - in->mean[c]) * in->invstd[c];
                double dz = cdd_z(in, c, x) > 0 ? X_AT(s, g, n, c, p) : 0;
                sum_dz += dz, sum_dz_xhat += dz * xhat;
            }
        dgamma[c] = sum_dz_xhat, dbeta[c] = sum_dz;
        for (int n = 0; n < s->n; n++)
            for (size_t p = 0; p < cdd_plane(s); p++) {
                double x = X_AT(s, in->x, n, c, p), xhat = (x - in->mean[c]) * in->invstd[c];
                double dz = cdd_z(in, c, x) > 0 ? X_AT(s, g, n, c, p) : 0;
                X_AT(s, dx, n, c, p) = in->gamma[c] * in->invstd[c] / m * (m * dz - sum_dz - xhat * sum_dz_xhat);
            }
    }
    free(g);
}

/* L = sum dy * conv(relu(bn(x)), w), bn by the batch's statistics of x, in double. */
typedef struct {
    const Conv2dShape *s;
    CddInputs *in;
} CddLoss;

static double cdd_loss(void *arg) {
    const CddLoss *l = arg;
    const Conv2dShape *s = l->s;
    const CddInputs *in = l->in;
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    double *act = malloc(sizeof(double) * cdd_x_count(s)), loss = 0;
    for (int c = 0; c < s->c; c++) {
        double mean, invstd;
        channel_statistics(s, in->x, c, &mean, &invstd);
        for (int n = 0; n < s->n; n++)
            for (size_t p = 0; p < cdd_plane(s); p++) {
                double z = (X_AT(s, in->x, n, c, p) - mean) * invstd * in->gamma[c] + in->beta[c];
                X_AT(s, act, n, c, p) = z > 0 ? z : 0;
            }
    }
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    double y = 0;
                    for (int c = 0; c < s->c; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                y += act[(((size_t)n * s->c + c) * s->h + ih) * s->w + iw] *
                                     in->w[(((size_t)k * s->c + c) * s->r + r) * s->s + t];
                            }
                    loss += y * in->dy[(((size_t)n * s->k + k) * oh + p) * ow + q];
                }
    free(act);
    return loss;
}

static void cdd_check_double(const GridCase *c, const char *label, const char *name, const float *got,
                             const double *exact, size_t n, double bound) {
    char what[220];
    float *want = host_floats(n);
    for (size_t i = 0; i < n; i++) want[i] = (float)exact[i];
    snprintf(what, sizeof what, "%s: %s", label, name);
    grid_check(c, what, got, want, n, bound);
    free(want);
}

static void cdd_cpu_shape(const GridCase *c, const Conv2dShape *s, int finite_differences) {
    char label[160];
    cdd_label(label, sizeof label, s);
    size_t nx = cdd_x_count(s);
    CddInputs in = cdd_inputs(c, DTYPE_F32, s);
    BatchNormParams p = cdd_params(&in);
    ConvDgradDbn op;
    conv_dgrad_dbn_init(&c->ctx, &op, s, &cdd_policy);
    CHECK(conv_dgrad_dbn_workspace_bytes(&c->ctx, &op, 1) == 0);
    float *dx = host_floats(nx), *dgamma = calloc(s->c, sizeof(float)), *dbeta = calloc(s->c, sizeof(float));
    conv_dgrad_dbn_backward(&c->ctx, &op, in.w, in.dy, in.x, &p, dx, 0, dgamma, dbeta);
    double *want_dx = malloc(sizeof(double) * nx), *want_dgamma = malloc(sizeof(double) * s->c),
           *want_dbeta = malloc(sizeof(double) * s->c);
    naive_backward(s, &in, want_dx, want_dgamma, want_dbeta);
    cdd_check_double(c, label, "dx against the definition", dx, want_dx, nx, 1e-5);
    cdd_check_double(c, label, "dgamma against the definition", dgamma, want_dgamma, s->c, 1e-5);
    cdd_check_double(c, label, "dbeta against the definition", dbeta, want_dbeta, s->c, 1e-5);
    /* dx added to what is there, dgamma and dbeta added again */
    float *dx2 = copy_floats(dx, nx);
    conv_dgrad_dbn_backward(&c->ctx, &op, in.w, in.dy, in.x, &p, dx2, 1, dgamma, dbeta);
    for (size_t i = 0; i < nx; i++) want_dx[i] *= 2;
    for (int ch = 0; ch < s->c; ch++) want_dgamma[ch] *= 2, want_dbeta[ch] *= 2;
    cdd_check_double(c, label, "dx accumulated", dx2, want_dx, nx, 1e-5);
    cdd_check_double(c, label, "dgamma added twice", dgamma, want_dgamma, s->c, 1e-5);
    cdd_check_double(c, label, "dbeta added twice", dbeta, want_dbeta, s->c, 1e-5);
    if (finite_differences) {
        CddLoss loss = {s, &in};
        double *num = malloc(sizeof(double) * nx);
        char what[220];
        numeric_gradient(in.x, nx, 1e-3f, cdd_loss, &loss, num);
        snprintf(what, sizeof what, "conv_dgrad_dbn %s: dx by finite differences", label);
        check_gradient(what, dx, num, nx);
        float *half_gamma = host_floats(s->c), *half_beta = host_floats(s->c);
        for (int ch = 0; ch < s->c; ch++) half_gamma[ch] = dgamma[ch] / 2, half_beta[ch] = dbeta[ch] / 2;
        numeric_gradient(in.gamma, s->c, 1e-3f, cdd_loss, &loss, num);
        snprintf(what, sizeof what, "conv_dgrad_dbn %s: dgamma by finite differences", label);
        check_gradient(what, half_gamma, num, s->c);
        numeric_gradient(in.beta, s->c, 1e-3f, cdd_loss, &loss, num);
        snprintf(what, sizeof what, "conv_dgrad_dbn %s: dbeta by finite differences", label);
        check_gradient(what, half_beta, num, s->c);
        void *more[] = {num, half_gamma, half_beta};
        host_free_all(more, GRID_COUNT(more));
    }
    conv_dgrad_dbn_destroy(&c->ctx, &op);
    void *host[] = {dx, dgamma, dbeta, want_dx, want_dgamma, want_dbeta, dx2};
    host_free_all(host, GRID_COUNT(host));
    cdd_inputs_free(&in);
}

/* ---- the GPU against the CPU reference ----------------------------------------------- */

static void cdd_gpu_shape(const GridCase *c, const Conv2dShape *s) {
    DType dt = c->dtype;
    size_t nx = cdd_x_count(s), nw = cdd_w_count(s), ny = cdd_y_count(s);
    char label[160], what[220];
    cdd_label(label, sizeof label, s);
    CddInputs in = cdd_inputs(c, dt, s);
    BatchNormParams hp = cdd_params(&in);
    float *want_dx = host_floats(nx), *want_dgamma = calloc(s->c, sizeof(float)),
          *want_dbeta = calloc(s->c, sizeof(float));
    conv_dgrad_dbn_backward_cpu(s, in.w, in.dy, in.x, &hp, want_dx, 0, want_dgamma, want_dbeta);

    OpContext ctx = c->ctx;
    ConvDgradDbn op;
    conv_dgrad_dbn_init(&ctx, &op, s, &cdd_policy);
    int fused = conv_dgrad_dbn_fused(&op);
    size_t ws = conv_dgrad_dbn_workspace_bytes(&ctx, &op, 1); /* dx is made, then added to */
    printf(" %s: %s, workspace %zu bytes\n", label,
           fused ? "fused cuDNN graph" : "FALLBACK (conv2d's data gradient + batchnorm's backward)", ws);
    ctx.workspace = ws ? dev_bytes(ws) : NULL;

    float *xl = grid_to_layout(c, in.x, s->n, s->c, s->h, s->w);
    float *wl = grid_to_layout(c, in.w, s->k, s->c, s->r, s->s);
    float *dyl = grid_to_layout(c, in.dy, s->n, s->k, conv2d_out_h(s), conv2d_out_w(s));
    float *dx_start = grid_accumulator_start(c, dt, want_dx, nx);
    float *dgamma_start = grid_accumulator_start(c, dt, want_dgamma, s->c);
    float *dbeta_start = grid_accumulator_start(c, dt, want_dbeta, s->c);
    float *dx_start_l = grid_to_layout(c, dx_start, s->n, s->c, s->h, s->w);
    void *d_x = grid_put(c, dt, xl, nx), *d_w = grid_put(c, dt, wl, nw), *d_dy = grid_put(c, dt, dyl, ny);
    void *d_param[4];
    const float *params[4] = {in.gamma, in.beta, in.mean, in.invstd};
    for (int i = 0; i < 4; i++) d_param[i] = grid_put(c, DTYPE_F32, params[i], s->c);
    BatchNormParams dp = {.gamma = d_param[0], .beta = d_param[1], .save_mean = d_param[2],
                          .save_invstd = d_param[3], .eps = CDD_EPS};
    void *d_dx = grid_alloc(c, dt, nx), *d_dgamma = grid_put(c, dt, dgamma_start, s->c);
    void *d_dbeta = grid_put(c, dt, dbeta_start, s->c);
    const char *path = fused ? "fused" : "fallback";
    double bound = grid_bound(c, GRID_CONV);

    conv_dgrad_dbn_backward(&ctx, &op, d_w, d_dy, d_x, &dp, d_dx, 0, d_dgamma, d_dbeta);
    float *t = grid_get(c, dt, d_dx, nx), *got = grid_from_layout(c, t, s->n, s->c, s->h, s->w);
    float *got_dgamma = grid_get(c, dt, d_dgamma, s->c), *got_dbeta = grid_get(c, dt, d_dbeta, s->c);
    for (int ch = 0; ch < s->c; ch++) want_dgamma[ch] += dgamma_start[ch], want_dbeta[ch] += dbeta_start[ch];
    snprintf(what, sizeof what, "%s: dx (%s)", label, path);
    grid_check(c, what, got, want_dx, nx, bound);
    snprintf(what, sizeof what, "%s: dgamma added to random (%s)", label, path);
    grid_check(c, what, got_dgamma, want_dgamma, s->c, bound);
    snprintf(what, sizeof what, "%s: dbeta added to random (%s)", label, path);
    grid_check(c, what, got_dbeta, want_dbeta, s->c, bound);

    grid_set(c, dt, d_dx, dx_start_l, nx);
    conv_dgrad_dbn_backward(&ctx, &op, d_w, d_dy, d_x, &dp, d_dx, 1, NULL, NULL);
    float *t2 = grid_get(c, dt, d_dx, nx), *got2 = grid_from_layout(c, t2, s->n, s->c, s->h, s->w);
    for (size_t i = 0; i < nx; i++) want_dx[i] += dx_start[i];
    snprintf(what, sizeof what, "%s: dx added to random (%s)", label, path);
    grid_check(c, what, got2, want_dx, nx, bound);

    void *dev[] = {d_x, d_w, d_dy, d_param[0], d_param[1], d_param[2], d_param[3], d_dx, d_dgamma, d_dbeta,
                   ctx.workspace};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {want_dx, want_dgamma, want_dbeta, xl, wl, dyl, dx_start, dgamma_start, dbeta_start,
                    dx_start_l, t, got, got_dgamma, got_dbeta, t2, got2};
    host_free_all(host, GRID_COUNT(host));
    cdd_inputs_free(&in);
    conv_dgrad_dbn_destroy(&ctx, &op);
}

/* ---- the shapes -------------------------------------------------------------------- */

static void cdd_case(const GridCase *c) {
    if (c->device == DEVICE_CUDA) {
        const Conv2dShape shapes[] = {
            CONV(4, 64, 16, 16, 64, 3, 3, 1, 1),  /* ResNet-18-CIFAR's 3x3 */
            CONV(8, 64, 16, 16, 128, 3, 3, 1, 2), /* stride-2 3x3, k = 128 */
            CONV(8, 64, 16, 16, 128, 1, 1, 0, 2), /* 1x1 stride-2 downsample */
        };
        for (size_t i = 0; i < GRID_COUNT(shapes); i++) cdd_gpu_shape(c, &shapes[i]);
        return;
    }
    const Conv2dShape small[] = {
        CONV(2, 3, 5, 5, 4, 3, 3, 1, 1), /* 3x3 */
        CONV(2, 3, 6, 7, 4, 3, 3, 1, 2), /* stride 2, odd width */
        CONV(3, 2, 4, 4, 3, 1, 1, 0, 1), /* 1x1 */
    };
    for (size_t i = 0; i < GRID_COUNT(small); i++) cdd_cpu_shape(c, &small[i], 1);
    cdd_cpu_shape(c, &CONV(4, 16, 8, 8, 32, 3, 3, 1, 1), 0); /* larger: the definition only */
}

const GridOp grid_op_conv_dgrad_dbn = {
    .name = "conv_dgrad_dbn",
    .run = cdd_case,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW)",
};
