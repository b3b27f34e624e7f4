/* CPU reference ops: forward against hand-computed values, backward against
 * central finite differences of a scalar loss, accumulate semantics, the
 * PyTorch semantics of SGD, the loss scaler's state machine (GradScaler's), the
 * mixed-precision SGD step and the float32 <-> f16/bf16 casts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/accuracy.h"
#include "ops/cast.h"
#include "ops/conv2d.h"
#include "ops/gemm_cpu.h"
#include "ops/linear.h"
#include "ops/loss_scaler.h"
#include "ops/maxpool.h"
#include "ops/relu.h"
#include "ops/sgd.h"
#include "ops/softmax_xent.h"
#include "tests/harness.h"
#include "tests/op_checks.h"

static uint64_t rng;

static float *floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static float *random_floats(size_t n, float lo, float hi) {
    float *p = floats(n);
    test_fill_uniform(p, n, &rng, lo, hi);
    return p;
}

static float *copy_floats(const float *src, size_t n) {
    float *p = floats(n);
    memcpy(p, src, n * sizeof(float));
    return p;
}

static void fill_nan(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static int same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Distinct values spaced 'gap' apart in random order: no ties, no kinks near
 * any perturbation smaller than gap / 2. */
static float *shuffled_distinct(size_t n, float gap) {
    float *p = floats(n);
    for (size_t i = 0; i < n; i++) p[i] = ((float)i - (float)n / 2) * gap;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(test_uniform(&rng, 0, 1) * i);
        if (j >= i) j = i - 1;
        float t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
    }
    return p;
}

/* ---- gemm ------------------------------------------------------------------ */

static void naive_gemm(int ta, int tb, int m, int n, int k, double alpha, const float *a, int lda,
                       const float *b, int ldb, double beta, const float *c0, int ldc,
                       double *c) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = 0;
            for (int p = 0; p < k; p++) {
                double av = ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
                double bv = tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
                sum += av * bv;
            }
            double old = beta != 0 ? beta * c0[(size_t)i * ldc + j] : 0;
            c[(size_t)i * n + j] = alpha * sum + old;
        }
}

static void test_gemm_case(int ta, int tb, int m, int n, int k, float alpha, float beta) {
    int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
    int a_rows = ta ? k : m, b_rows = tb ? n : k;
    float *a = random_floats((size_t)a_rows * lda, -1, 1);
    float *b = random_floats((size_t)b_rows * ldb, -1, 1);
    float *c0 = random_floats((size_t)m * ldc, -1, 1);
    if (beta == 0) fill_nan(c0, (size_t)m * ldc); /* beta 0 must not read C */
    double *want = malloc(sizeof(double) * m * n);
    naive_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want);
    for (int impl = 0; impl < 2; impl++) {
        float *c = copy_floats(c0, (size_t)m * ldc);
        if (impl == 0)
            cpu_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        else
            cpu_sgemm_loops(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        int bad = 0;
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < n; j++) {
                double got = c[(size_t)i * ldc + j], w = want[(size_t)i * n + j];
                if (!(fabs(got - w) <= 1e-5 * (1 + fabs(w)) * sqrt(k + 1.0))) bad++;
            }
            /* the padding past n in each row of C is not touched */
            if (!same_bits(&c[(size_t)i * ldc + n], &c0[(size_t)i * ldc + n], 1))
                bad++;
        }
        CHECK_MSG(bad == 0, "%s ta=%d tb=%d %dx%dx%d alpha=%g beta=%g: %d wrong",
                  impl ? "cpu_sgemm_loops" : "cpu_sgemm", ta, tb, m, n, k, alpha, beta, bad);
        free(c);
    }
    free(a), free(b), free(c0), free(want);
}

static void test_gemm(void) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_gemm_case(ta, tb, 5, 7, 9, 0.5f, -1.5f);
            test_gemm_case(ta, tb, 37, 45, 53, 1.0f, 0.0f);
            test_gemm_case(ta, tb, 3, 2, 1, 2.0f, 1.0f);
        }
}

/* ---- conv2d ------------------------------------------------------------------ */

static size_t conv_x_size(const Conv2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t conv_w_size(const Conv2dShape *s) { return (size_t)s->k * s->c * s->r * s->s; }
static size_t conv_y_size(const Conv2dShape *s) {
    return (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s);
}

static void test_conv_forward_hand(void) {
    /* one 3x3 plane 1..9, one 2x2 kernel [1 2; 3 4], bias 0.5 */
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 2, 3, 4}, b[1] = {0.5f}, y[4];
    Conv2dShape s = {.n = 1, .c = 1, .h = 3, .w = 3, .k = 1, .r = 2, .s = 2, .pad = 0, .stride = 1};
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
    Conv2dShape s2 = {.n = 1, .c = 2, .h = 1, .w = 3, .k = 2, .r = 1, .s = 1, .pad = 0, .stride = 1};
    float x2[6] = {1, 2, 3, 10, 20, 30}, w2[4] = {1, -1, 0.5f, 2}, b2[2] = {0, 1}, y2[6];
    conv2d_forward_cpu(&s2, x2, w2, b2, y2);
    check_values("conv y (2->2 channels)", y2, (double[]){-9, -18, -27, 21.5, 42, 62.5}, 6, 1e-6);
}

static void test_conv_backward_hand(void) {
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 2, 3, 4}, dy[4] = {1, 1, 1, 1};
    float dx[9], dw[4] = {0}, db[1] = {0};
    Conv2dShape s = {.n = 1, .c = 1, .h = 3, .w = 3, .k = 1, .r = 2, .s = 2, .pad = 0, .stride = 1};
    fill_nan(dx, 9);
    conv2d_backward_cpu(&s, x, w, dy, dx, dw, db);
    /* dw[r][s] = sum of the 2x2 block of x at (r, s); dx counts kernel taps */
    check_values("conv dw (hand)", dw, (double[]){12, 16, 24, 28}, 4, 1e-6);
    check_values("conv db (hand)", db, (double[]){4}, 1, 1e-6);
    check_values("conv dx (hand)", dx, (double[]){1, 3, 2, 4, 10, 6, 3, 7, 4}, 9, 1e-6);
    /* accumulates: a second call doubles dw and db; dx may be NULL */
    conv2d_backward_cpu(&s, x, w, dy, NULL, dw, db);
    check_values("conv dw (accumulated)", dw, (double[]){24, 32, 48, 56}, 4, 1e-6);
    check_values("conv db (accumulated)", db, (double[]){8}, 1, 1e-6);
}

/* The definition in conv2d.h, in double, as a second reference on bigger shapes. */
static void naive_conv_forward(const Conv2dShape *s, const float *x, const float *w,
                               const float *b, double *y) {
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    double sum = b[k];
                    for (int c = 0; c < s->c; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                sum += (double)x[(((size_t)n * s->c + c) * s->h + ih) * s->w + iw] *
                                       w[(((size_t)k * s->c + c) * s->r + r) * s->s + t];
                            }
                    y[(((size_t)n * s->k + k) * oh + p) * ow + q] = sum;
                }
}

static void naive_conv_backward(const Conv2dShape *s, const float *x, const float *w,
                                const float *dy, double *dx, double *dw, double *db) {
    int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    memset(dx, 0, sizeof(double) * conv_x_size(s));
    memset(dw, 0, sizeof(double) * conv_w_size(s));
    memset(db, 0, sizeof(double) * s->k);
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < oh; p++)
                for (int q = 0; q < ow; q++) {
                    double g = dy[(((size_t)n * s->k + k) * oh + p) * ow + q];
                    db[k] += g;
                    for (int c = 0; c < s->c; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int t = 0; t < s->s; t++) {
                                int ih = p * s->stride - s->pad + r, iw = q * s->stride - s->pad + t;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                size_t xi = (((size_t)n * s->c + c) * s->h + ih) * s->w + iw;
                                size_t wi = (((size_t)k * s->c + c) * s->r + r) * s->s + t;
                                dx[xi] += g * w[wi];
                                dw[wi] += g * x[xi];
                            }
                }
}

static void check_close(const char *what, const float *got, const double *want, size_t n,
                        double tol) {
    double diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - want[i];
        if (isnan(got[i])) d = INFINITY;
        diff2 += d * d;
        norm2 += want[i] * want[i];
    }
    double rel = sqrt(diff2) / (norm2 > 0 ? sqrt(norm2) : 1.0);
    CHECK_MSG(rel <= tol, "%s: relative error %.3g > %.3g", what, rel, tol);
}

static void test_conv_against_naive(const Conv2dShape *s) {
    char what[160];
    snprintf(what, sizeof what, "conv %dx%dx%dx%d k%d %dx%d pad %d stride %d", s->n, s->c, s->h,
             s->w, s->k, s->r, s->s, s->pad, s->stride);
    size_t nx = conv_x_size(s), nw = conv_w_size(s), ny = conv_y_size(s);
    float *x = random_floats(nx, -1, 1), *w = random_floats(nw, -0.5f, 0.5f);
    float *b = random_floats(s->k, -1, 1), *dy = random_floats(ny, -1, 1);
    float *y = floats(ny), *dx = floats(nx);
    float *dw0 = random_floats(nw, -1, 1), *db0 = random_floats(s->k, -1, 1);
    float *dw = copy_floats(dw0, nw), *db = copy_floats(db0, s->k);
    double *want_y = malloc(sizeof(double) * ny), *want_dx = malloc(sizeof(double) * nx);
    double *want_dw = malloc(sizeof(double) * nw), *want_db = malloc(sizeof(double) * s->k);

    fill_nan(y, ny);
    conv2d_forward_cpu(s, x, w, b, y);
    naive_conv_forward(s, x, w, b, want_y);
    char buf[200];
    snprintf(buf, sizeof buf, "%s: y", what);
    check_close(buf, y, want_y, ny, 1e-5);

    fill_nan(dx, nx);
    conv2d_backward_cpu(s, x, w, dy, dx, dw, db);
    naive_conv_backward(s, x, w, dy, want_dx, want_dw, want_db);
    for (size_t i = 0; i < nw; i++) want_dw[i] += dw0[i];
    for (int k = 0; k < s->k; k++) want_db[k] += db0[k];
    snprintf(buf, sizeof buf, "%s: dx", what);
    check_close(buf, dx, want_dx, nx, 1e-5);
    snprintf(buf, sizeof buf, "%s: dw", what);
    check_close(buf, dw, want_dw, nw, 1e-5);
    snprintf(buf, sizeof buf, "%s: db", what);
    check_close(buf, db, want_db, s->k, 1e-5);

    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw0), free(db0), free(dw), free(db);
    free(want_y), free(want_dx), free(want_dw), free(want_db);
}

typedef struct {
    const Conv2dShape *s;
    float *x, *w, *b, *y, *r;
} ConvLoss;

static double conv_loss(void *ctx) {
    ConvLoss *c = ctx;
    conv2d_forward_cpu(c->s, c->x, c->w, c->b, c->y);
    return weighted_sum(c->y, c->r, conv_y_size(c->s));
}

static void test_conv_gradients(const Conv2dShape *s) {
    char what[160];
    snprintf(what, sizeof what, "conv %dx%dx%dx%d k%d %dx%d pad %d stride %d", s->n, s->c, s->h,
             s->w, s->k, s->r, s->s, s->pad, s->stride);
    size_t nx = conv_x_size(s), nw = conv_w_size(s), ny = conv_y_size(s);
    ConvLoss c = {s, random_floats(nx, -1, 1), random_floats(nw, -1, 1),
                  random_floats(s->k, -1, 1), floats(ny), random_floats(ny, -1, 1)};
    /* prefilled dw, db: backward must add to them; dx is overwritten */
    float *dw0 = random_floats(nw, -1, 1), *db0 = random_floats(s->k, -1, 1);
    float *dw = copy_floats(dw0, nw), *db = copy_floats(db0, s->k), *dx = floats(nx);
    fill_nan(dx, nx);
    conv2d_backward_cpu(s, c.x, c.w, c.r, dx, dw, db);
    for (size_t i = 0; i < nw; i++) dw[i] -= dw0[i];
    for (int k = 0; k < s->k; k++) db[k] -= db0[k];

    double *num = malloc(sizeof(double) * (nx > nw ? nx : nw));
    char buf[200];
    numeric_gradient(c.x, nx, 1e-2f, conv_loss, &c, num);
    snprintf(buf, sizeof buf, "%s: dx", what);
    check_gradient(buf, dx, num, nx);
    numeric_gradient(c.w, nw, 1e-2f, conv_loss, &c, num);
    snprintf(buf, sizeof buf, "%s: dw", what);
    check_gradient(buf, dw, num, nw);
    numeric_gradient(c.b, s->k, 1e-2f, conv_loss, &c, num);
    snprintf(buf, sizeof buf, "%s: db", what);
    check_gradient(buf, db, num, s->k);

    /* dx == NULL: same dw and db, bit for bit */
    float *dw2 = copy_floats(dw0, nw), *db2 = copy_floats(db0, s->k);
    conv2d_backward_cpu(s, c.x, c.w, c.r, NULL, dw2, db2);
    for (size_t i = 0; i < nw; i++) dw2[i] -= dw0[i];
    for (int k = 0; k < s->k; k++) db2[k] -= db0[k];
    CHECK_MSG(same_bits(dw, dw2, nw) && same_bits(db, db2, s->k), "%s: dx == NULL changes dw/db",
              what);

    free(c.x), free(c.w), free(c.b), free(c.y), free(c.r);
    free(dw0), free(db0), free(dw), free(db), free(dx), free(dw2), free(db2), free(num);
}

static void test_conv(void) {
    test_conv_forward_hand();
    test_conv_backward_hand();
    const Conv2dShape shapes[] = {
        {.n = 2, .c = 3, .h = 5, .w = 7, .k = 4, .r = 3, .s = 3, .pad = 1, .stride = 1},
        {.n = 1, .c = 2, .h = 6, .w = 9, .k = 3, .r = 3, .s = 3, .pad = 0, .stride = 2},
        {.n = 2, .c = 2, .h = 7, .w = 6, .k = 2, .r = 3, .s = 2, .pad = 1, .stride = 2},
        {.n = 2, .c = 3, .h = 8, .w = 6, .k = 5, .r = 3, .s = 3, .pad = 1, .stride = 2},
        {.n = 2, .c = 4, .h = 3, .w = 5, .k = 3, .r = 1, .s = 1, .pad = 0, .stride = 1},
        {.n = 1, .c = 1, .h = 4, .w = 4, .k = 2, .r = 5, .s = 5, .pad = 2, .stride = 1},
        {.n = 1, .c = 2, .h = 5, .w = 4, .k = 2, .r = 2, .s = 3, .pad = 2, .stride = 3},
        /* the padding is wider than the image: whole kernel rows read only zeros */
        {.n = 2, .c = 2, .h = 1, .w = 1, .k = 3, .r = 5, .s = 5, .pad = 2, .stride = 1},
        {.n = 1, .c = 1, .h = 2, .w = 1, .k = 2, .r = 5, .s = 5, .pad = 3, .stride = 2},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        test_conv_gradients(&shapes[i]);
        test_conv_against_naive(&shapes[i]);
    }
    const Conv2dShape bigger[] = {
        {.n = 3, .c = 8, .h = 12, .w = 10, .k = 6, .r = 3, .s = 3, .pad = 1, .stride = 1},
        {.n = 2, .c = 16, .h = 16, .w = 16, .k = 32, .r = 3, .s = 3, .pad = 1, .stride = 1},
        {.n = 2, .c = 3, .h = 17, .w = 23, .k = 8, .r = 7, .s = 7, .pad = 3, .stride = 2},
        {.n = 2, .c = 5, .h = 9, .w = 11, .k = 4, .r = 3, .s = 3, .pad = 0, .stride = 2},
    };
    for (size_t i = 0; i < sizeof bigger / sizeof *bigger; i++) test_conv_against_naive(&bigger[i]);
}

/* ---- maxpool ------------------------------------------------------------------ */

static void test_maxpool_hand(void) {
    /* two 4x4 planes; ties in plane 0 window (0,1) (all equal) and in several
     * windows of plane 1, where the first maximum in row-major order must win */
    float x[32] = {
        1, 5, 2, 2,    3, 4, 2, 2,    0, -1, 7, 6,   -2, -3, 8, 1,
        0, 3, -1, -1,  3, 3, -1, -2,  4, 4, 1, 2,    5, 5, 2, 1,
    };
    float y[8], dx[32];
    Pool2dShape s = {.n = 1, .c = 2, .h = 4, .w = 4};
    maxpool2x2_forward_cpu(&s, x, y);
    check_values("maxpool y", y, (double[]){5, 2, 0, 8, 3, -1, 5, 2}, 8, 0);
    float dy[8] = {10, 20, 30, 40, 1, 2, 3, 4};
    fill_nan(dx, 32);
    maxpool2x2_backward_cpu(&s, x, y, dy, dx);
    double want[32] = {0};
    want[1] = 10;       /* 5 at (0,1) */
    want[2] = 20;       /* all-2 window: first is (0,2) */
    want[8] = 30;       /* 0 at (2,0) */
    want[14] = 40;      /* 8 at (3,2) */
    want[16 + 1] = 1;   /* 0 3 / 3 3: first 3 at (0,1) */
    want[16 + 2] = 2;   /* -1 -1 / -1 -2: first -1 at (0,2) */
    want[16 + 12] = 3;  /* 4 4 / 5 5: first 5 at (3,0) */
    want[16 + 11] = 4;  /* 1 2 / 2 1: first 2 at (2,3) */
    check_values("maxpool dx", dx, want, 32, 0);
}

typedef struct {
    const Pool2dShape *s;
    float *x, *y, *r;
} PoolLoss;

static double pool_loss(void *ctx) {
    PoolLoss *p = ctx;
    maxpool2x2_forward_cpu(p->s, p->x, p->y);
    return weighted_sum(p->y, p->r, (size_t)p->s->n * p->s->c * pool2d_out_h(p->s) * pool2d_out_w(p->s));
}

static void test_maxpool_gradients(const Pool2dShape *s) {
    size_t nx = (size_t)s->n * s->c * s->h * s->w, ny = (size_t)s->n * s->c * pool2d_out_h(s) * pool2d_out_w(s);
    /* distinct values 0.05 apart: the perturbation (0.01) never changes an argmax */
    PoolLoss p = {s, shuffled_distinct(nx, 0.05f), floats(ny), random_floats(ny, -1, 1)};
    float *dx = floats(nx);
    maxpool2x2_forward_cpu(s, p.x, p.y);
    fill_nan(dx, nx);
    maxpool2x2_backward_cpu(s, p.x, p.y, p.r, dx);
    double *num = malloc(sizeof(double) * nx);
    numeric_gradient(p.x, nx, 1e-2f, pool_loss, &p, num);
    char what[120];
    snprintf(what, sizeof what, "maxpool %dx%dx%dx%d window %d stride %d pad %d dx", s->n, s->c, s->h, s->w,
             pool2d_window(s), pool2d_stride(s), s->pad);
    check_gradient(what, dx, num, nx);
    free(p.x), free(p.y), free(p.r), free(dx), free(num);
}

static void test_maxpool(void) {
    test_maxpool_hand();
    Pool2dShape a = {.n = 2, .c = 3, .h = 6, .w = 8}, b = {.n = 1, .c = 2, .h = 10, .w = 4};
    /* ResNet's ImageNet stem: 3x3 windows, stride 2, padding 1, overlapping */
    Pool2dShape c = {.n = 2, .c = 2, .h = 7, .w = 8, .k = 3, .stride = 2, .pad = 1};
    test_maxpool_gradients(&a);
    test_maxpool_gradients(&b);
    test_maxpool_gradients(&c);
}

/* ---- softmax cross-entropy ------------------------------------------------------ */

static void test_softmax_hand(void) {
    /* row 0 [1 2 3] label 2: loss = log(e + e^2 + e^3) - 3; row 1 uniform: log 3 */
    float logits[6] = {1, 2, 3, 0, 0, 0}, loss = NAN, dl[6];
    int32_t labels[2] = {2, 1};
    softmax_xent_cpu(logits, labels, 2, 3, NULL, &loss, dl);
    CHECK_NEAR(loss, (0.4076059644443806 + 1.0986122886681098) / 2, 1e-6);
    double want[6] = {0.09003057317038046 / 2, 0.24472847105479764 / 2,
                      (0.6652409557748218 - 1) / 2, 1.0 / 6, -1.0 / 3, 1.0 / 6};
    check_values("softmax dlogits", dl, want, 6, 1e-6);
    /* grad_scale multiplies the gradient only */
    float loss8 = NAN, dl8[6], eight = 8.0f;
    softmax_xent_cpu(logits, labels, 2, 3, &eight, &loss8, dl8);
    CHECK(loss8 == loss);
    for (int i = 0; i < 6; i++) want[i] *= 8;
    check_values("softmax dlogits (grad_scale 8)", dl8, want, 6, 1e-6);

    /* numerically stable: logits of +-1000 */
    float big[6] = {1000, 0, -1000, 1000, 0, -1000}, dbig[6];
    int32_t big_labels[2] = {0, 1};
    softmax_xent_cpu(big, big_labels, 2, 3, NULL, &loss, dbig);
    CHECK_NEAR(loss, 500, 1e-4); /* (0 + 1000) / 2 */
    check_values("softmax dlogits (large logits)", dbig, (double[]){0, 0, 0, 0.5, -0.5, 0}, 6, 1e-6);
}

typedef struct {
    float *logits, *dl;
    int32_t *labels;
    int n, classes;
} XentLoss;

static double xent_loss(void *ctx) {
    XentLoss *x = ctx;
    float loss;
    softmax_xent_cpu(x->logits, x->labels, x->n, x->classes, NULL, &loss, x->dl);
    return loss;
}

static void test_softmax_gradients(int n, int classes) {
    size_t total = (size_t)n * classes;
    XentLoss x = {random_floats(total, -3, 3), floats(total), malloc(sizeof(int32_t) * n), n,
                  classes};
    for (int i = 0; i < n; i++) x.labels[i] = (int32_t)(test_uniform(&rng, 0, 1) * classes) % classes;
    float *dl = floats(total), loss;
    softmax_xent_cpu(x.logits, x.labels, n, classes, NULL, &loss, dl);
    double *num = malloc(sizeof(double) * total);
    numeric_gradient(x.logits, total, 1e-2f, xent_loss, &x, num);
    char what[80];
    snprintf(what, sizeof what, "softmax %dx%d dlogits", n, classes);
    check_gradient(what, dl, num, total);
    double row_sum = 0; /* each row of dlogits sums to 0 */
    for (int j = 0; j < classes; j++) row_sum += dl[j];
    CHECK_NEAR(row_sum, 0, 1e-6);
    free(x.logits), free(x.dl), free(x.labels), free(dl), free(num);
}

static void test_softmax(void) {
    test_softmax_hand();
    test_softmax_gradients(4, 5);
    test_softmax_gradients(3, 10);
    test_softmax_gradients(1, 2);
}

/* ---- sgd ------------------------------------------------------------------ */

/* torch.optim.SGD's single-tensor step (dampening 0), written from its documented
 * algorithm, in double: on the first step the momentum buffer is the gradient
 * itself; with momentum 0 there is no buffer at all. */
static void torch_sgd_step(double *p, const double *grad, double *buf, size_t n, double lr,
                           double momentum, double weight_decay, int nesterov, int first_step) {
    for (size_t i = 0; i < n; i++) {
        double d_p = grad[i];
        if (weight_decay != 0) d_p += weight_decay * p[i];
        if (momentum != 0) {
            buf[i] = first_step ? d_p : momentum * buf[i] + d_p;
            d_p = nesterov ? d_p + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * d_p;
    }
}

static void test_sgd_hand(void) {
    float w[2] = {1, -2}, g[2] = {0.5f, 0.25f}, m[2] = {0, 0.5f}, lr = 0.1f;
    SgdParams p = {.momentum = 0.9f, .weight_decay = 0.1f, .nesterov = 0};
    sgd_step_cpu(w, g, m, 2, &lr, p);
    /* g' = g + 0.1 w = {0.6, 0.05}; m = 0.9 m + g' = {0.6, 0.5}; w -= 0.1 m */
    check_values("sgd w", w, (double[]){0.94, -2.05}, 2, 1e-6);
    check_values("sgd m", m, (double[]){0.6, 0.5}, 2, 1e-6);
    float wn[2] = {1, -2}, mn[2] = {0, 0.5f};
    p.nesterov = 1;
    sgd_step_cpu(wn, g, mn, 2, &lr, p);
    /* d = g' + 0.9 m = {1.14, 0.5} */
    check_values("sgd w (nesterov)", wn, (double[]){0.886, -2.05}, 2, 1e-6);
    check_values("sgd m (nesterov)", mn, (double[]){0.6, 0.5}, 2, 1e-6);
}

static void test_sgd_against_torch(float momentum, float weight_decay, int nesterov) {
    size_t n = 1000;
    const float lrs[5] = {0.1f, 0.05f, 0.2f, 0.01f, 0.1f}; /* a schedule, through the pointer */
    float *w = random_floats(n, -1, 1), *m = floats(n), *g = floats(n);
    double *pw = malloc(sizeof(double) * n), *pbuf = calloc(n, sizeof(double));
    double *pg = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) pw[i] = w[i];
    SgdParams p = {.momentum = momentum, .weight_decay = weight_decay, .nesterov = nesterov};
    float lr;
    for (int step = 0; step < 5; step++) {
        test_fill_uniform(g, n, &rng, -1, 1);
        for (size_t i = 0; i < n; i++) pg[i] = g[i];
        lr = lrs[step];
        sgd_step_cpu(w, g, m, n, &lr, p);
        torch_sgd_step(pw, pg, pbuf, n, lrs[step], momentum, weight_decay, nesterov, step == 0);
    }
    char what[120];
    snprintf(what, sizeof what, "sgd momentum %g wd %g nesterov %d: w", momentum, weight_decay,
             nesterov);
    check_close(what, w, pw, n, 1e-6);
    if (momentum != 0) {
        snprintf(what, sizeof what, "sgd momentum %g wd %g nesterov %d: m", momentum,
                 weight_decay, nesterov);
        check_close(what, m, pbuf, n, 1e-5);
    }
    free(w), free(m), free(g), free(pw), free(pbuf), free(pg);
}

static void test_sgd(void) {
    test_sgd_hand();
    test_sgd_against_torch(0.9f, 0.0f, 0);
    test_sgd_against_torch(0.9f, 5e-4f, 0);
    test_sgd_against_torch(0.9f, 5e-4f, 1);
    test_sgd_against_torch(0.5f, 0.1f, 1);
    test_sgd_against_torch(0.0f, 1e-2f, 0);
    test_sgd_against_torch(0.0f, 0.0f, 0);
}

/* ---- accuracy ------------------------------------------------------------------ */

static void test_accuracy(void) {
    float logits[15] = {
        0.1f, 0.9f, 0.3f,  /* argmax 1 */
        0.5f, 0.5f, 0.2f,  /* tie: first max, 0 */
        0.5f, 0.5f, 0.2f,  /* tie: 0, label says 1 */
        -1, -2, -0.5f,     /* argmax 2 */
        2, 2, 2,           /* all equal: 0 */
    };
    int32_t labels[5] = {1, 0, 1, 2, 2};
    CHECK(accuracy_count_cpu(logits, labels, 5, 3) == 3);
    CHECK(accuracy_count_cpu(logits, labels, 0, 3) == 0);
}

/* ---- loss scaler ------------------------------------------------------------------ */

static void scaler_step(LossScalerState *s, const float *grads, size_t n, int interval) {
    loss_scaler_begin_step_cpu(s);
    loss_scaler_check_cpu(grads, n, s);
    loss_scaler_update_cpu(s, LOSS_SCALER_GROWTH, LOSS_SCALER_BACKOFF, interval);
}

static void test_loss_scaler_check(void) {
    float grads[5] = {1, -2, 3e38f, -0.0f, 1e-45f};
    LossScalerState s = loss_scaler_initial(LOSS_SCALER_INIT_SCALE);
    CHECK(s.scale == 65536.0f && s.good_steps == 0 && s.found_inf == 0 && s.skipped_steps == 0);
    loss_scaler_check_cpu(grads, 5, &s);
    CHECK_MSG(s.found_inf == 0, "finite gradients (largest, subnormal, -0) flagged");
    const float bad[3] = {INFINITY, -INFINITY, NAN};
    for (int b = 0; b < 3; b++) {
        for (int at = 0; at < 5; at++) {
            float g[5];
            memcpy(g, grads, sizeof g);
            g[at] = bad[b];
            loss_scaler_begin_step_cpu(&s);
            loss_scaler_check_cpu(g, 5, &s);
            CHECK_MSG(s.found_inf == 1, "%g at %d not found", bad[b], at);
        }
    }
    /* a later finite buffer of the same step does not clear the flag; begin_step does */
    loss_scaler_check_cpu(grads, 5, &s);
    CHECK(s.found_inf == 1);
    loss_scaler_begin_step_cpu(&s);
    CHECK(s.found_inf == 0 && s.scale == 65536.0f && s.good_steps == 0 && s.skipped_steps == 0);
}

static void test_loss_scaler_state_machine(void) {
    const int interval = 3;
    float good[4] = {1, 2, 3, 4}, inf_grads[4] = {1, INFINITY, 3, 4}, nan_grads[4] = {NAN, 2, 3, 4};
    LossScalerState s = loss_scaler_initial(1024.0f);
    /* interval - 1 good steps: counting, no growth */
    for (int i = 1; i < interval; i++) {
        scaler_step(&s, good, 4, interval);
        CHECK(s.scale == 1024.0f && s.good_steps == i && s.found_inf == 0);
    }
    /* the interval-th grows the scale and restarts the count */
    scaler_step(&s, good, 4, interval);
    CHECK_MSG(s.scale == 2048.0f && s.good_steps == 0, "scale %g good_steps %d", s.scale,
              s.good_steps);
    /* two good, then inf: backoff, count reset, one skipped; the flag stays up until begin */
    scaler_step(&s, good, 4, interval);
    scaler_step(&s, good, 4, interval);
    CHECK(s.good_steps == 2);
    scaler_step(&s, inf_grads, 4, interval);
    CHECK_MSG(s.scale == 1024.0f && s.good_steps == 0 && s.skipped_steps == 1 && s.found_inf == 1,
              "after inf: scale %g good %d skipped %d found %d", s.scale, s.good_steps,
              s.skipped_steps, s.found_inf);
    /* NaN counts as inf */
    scaler_step(&s, nan_grads, 4, interval);
    CHECK(s.scale == 512.0f && s.good_steps == 0 && s.skipped_steps == 2);
    /* growth needs interval good steps counted from the backoff, not from before it */
    scaler_step(&s, good, 4, interval);
    scaler_step(&s, good, 4, interval);
    CHECK(s.scale == 512.0f && s.good_steps == 2);
    scaler_step(&s, good, 4, interval);
    CHECK(s.scale == 1024.0f && s.good_steps == 0 && s.skipped_steps == 2 && s.found_inf == 0);

    /* GradScaler's defaults: 65536, x2 after 2000 good steps, not after 1999 */
    LossScalerState d = loss_scaler_initial(LOSS_SCALER_INIT_SCALE);
    for (int i = 0; i < LOSS_SCALER_INTERVAL - 1; i++) scaler_step(&d, good, 4, LOSS_SCALER_INTERVAL);
    CHECK(d.scale == 65536.0f && d.good_steps == LOSS_SCALER_INTERVAL - 1);
    scaler_step(&d, good, 4, LOSS_SCALER_INTERVAL);
    CHECK(d.scale == 131072.0f && d.good_steps == 0);
    /* repeated overflow keeps halving, each step skipped */
    for (int i = 0; i < 20; i++) scaler_step(&d, inf_grads, 4, LOSS_SCALER_INTERVAL);
    CHECK_MSG(d.scale == 131072.0f / (1 << 20) && d.skipped_steps == 20, "scale %g skipped %d",
              d.scale, d.skipped_steps);
}

/* ---- mixed-precision sgd ------------------------------------------------------------ */

static void test_sgd_mixed(SgdParams p) {
    size_t n = 1001;
    float lr = 0.05f;
    float *w = random_floats(n, -1, 1), *m = random_floats(n, -0.1f, 0.1f);
    float *g = random_floats(n, -1, 1);
    float *w_plain = copy_floats(w, n), *m_plain = copy_floats(m, n);
    float *w_mixed = copy_floats(w, n), *m_mixed = copy_floats(m, n);

    /* no scaler, and scale 1: exactly sgd_step_cpu */
    sgd_step_cpu(w_plain, g, m_plain, n, &lr, p);
    sgd_step_mixed_cpu(w_mixed, g, m_mixed, n, &lr, NULL, p);
    CHECK_MSG(same_bits(w_mixed, w_plain, n) && same_bits(m_mixed, m_plain, n),
              "sgd_step_mixed_cpu without a scaler differs from sgd_step_cpu");
    LossScalerState one = loss_scaler_initial(1.0f);
    memcpy(w_mixed, w, n * sizeof(float));
    memcpy(m_mixed, m, n * sizeof(float));
    sgd_step_mixed_cpu(w_mixed, g, m_mixed, n, &lr, &one, p);
    CHECK_MSG(same_bits(w_mixed, w_plain, n) && same_bits(m_mixed, m_plain, n),
              "sgd_step_mixed_cpu at scale 1 differs from sgd_step_cpu");

    /* scale 2^k: gradients scaled by it come out unscaled exactly */
    LossScalerState scaled = loss_scaler_initial(65536.0f);
    float *g_scaled = floats(n);
    for (size_t i = 0; i < n; i++) g_scaled[i] = g[i] * 65536.0f;
    memcpy(w_mixed, w, n * sizeof(float));
    memcpy(m_mixed, m, n * sizeof(float));
    sgd_step_mixed_cpu(w_mixed, g_scaled, m_mixed, n, &lr, &scaled, p);
    CHECK_MSG(same_bits(w_mixed, w_plain, n) && same_bits(m_mixed, m_plain, n),
              "sgd_step_mixed_cpu at scale 65536 does not unscale exactly");

    /* found_inf: the step is skipped, weights and momentum untouched */
    scaled.found_inf = 1;
    memcpy(w_mixed, w, n * sizeof(float));
    memcpy(m_mixed, m, n * sizeof(float));
    g_scaled[n / 2] = INFINITY;
    sgd_step_mixed_cpu(w_mixed, g_scaled, m_mixed, n, &lr, &scaled, p);
    CHECK_MSG(same_bits(w_mixed, w, n) && same_bits(m_mixed, m, n),
              "sgd_step_mixed_cpu moved weights or momentum on a skipped step");
    free(w), free(m), free(g), free(w_plain), free(m_plain), free(w_mixed), free(m_mixed);
    free(g_scaled);
}

static void test_softmax_scale_pointer(void) {
    float logits[6] = {1, 2, 3, 0.5f, -1, 2}, one = 1.0f, dl_null[6], dl_one[6], loss_a, loss_b;
    int32_t labels[2] = {0, 2};
    softmax_xent_cpu(logits, labels, 2, 3, NULL, &loss_a, dl_null);
    softmax_xent_cpu(logits, labels, 2, 3, &one, &loss_b, dl_one);
    CHECK_MSG(same_bits(dl_null, dl_one, 6) && loss_a == loss_b, "grad_scale NULL is not 1");
}

/* ---- casts ------------------------------------------------------------------ */

static uint16_t half_bits_of(DType dt, float f) {
    uint16_t h;
    cast_from_f32_cpu(dt, &f, &h, 1);
    return h;
}

static float float_of(DType dt, uint16_t h) {
    float f;
    cast_to_f32_cpu(dt, &h, &f, 1);
    return f;
}

static void test_cast_values(void) {
    const DType F16 = DTYPE_F16, BF16 = DTYPE_BF16;
    float tiny = ldexpf(1, -24), small = ldexpf(1, -25);
    struct { DType dt; float in; uint16_t want; } cases[] = {
        {F16, 1.0f, 0x3c00}, {F16, -2.0f, 0xc000}, {F16, 0.1f, 0x2e66}, {F16, 65504.0f, 0x7bff},
        {F16, 65519.99f, 0x7bff}, {F16, 65520.0f, 0x7c00}, {F16, 1e6f, 0x7c00},
        {F16, -INFINITY, 0xfc00}, {F16, 0.0f, 0x0000}, {F16, -0.0f, 0x8000},
        {F16, ldexpf(1, -14), 0x0400}, {F16, tiny, 0x0001}, {F16, small, 0x0000},
        {F16, small * 1.0001f, 0x0001}, {F16, 3 * small, 0x0002}, {F16, 5 * small, 0x0002},
        {F16, 1.0f + ldexpf(1, -11), 0x3c00}, {F16, 1.0f + 3 * ldexpf(1, -11), 0x3c02},
        {F16, ldexpf(1, -14) - tiny / 4, 0x0400}, {F16, 1e-10f, 0x0000},
        {BF16, 1.0f, 0x3f80}, {BF16, -2.0f, 0xc000}, {BF16, 1.0f + ldexpf(1, -8), 0x3f80},
        {BF16, 1.0f + 3 * ldexpf(1, -8), 0x3f82}, {BF16, 3.4028235e38f, 0x7f80},
        {BF16, INFINITY, 0x7f80}, {BF16, 1e-40f, 0x0001}, {BF16, -0.0f, 0x8000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = half_bits_of(cases[i].dt, cases[i].in);
        CHECK_MSG(got == cases[i].want, "%s(%.9g) = 0x%04x, want 0x%04x", dtype_name(cases[i].dt),
                  cases[i].in, got, cases[i].want);
    }
    CHECK(isnan(float_of(F16, half_bits_of(F16, NAN))));
    CHECK(isnan(float_of(BF16, half_bits_of(BF16, NAN))));
    CHECK(float_of(F16, 0x0001) == tiny && float_of(F16, 0x7bff) == 65504.0f);
    CHECK(float_of(F16, 0x8400) == -ldexpf(1, -14) && isinf(float_of(F16, 0x7c00)));
    CHECK(float_of(BF16, 0x3f80) == 1.0f && float_of(BF16, 0xc000) == -2.0f);
}

/* Every non-NaN f16 and bf16 value survives the trip through float32, and a
 * float between two neighbours rounds to the nearer one (ties to even). */
static void test_cast_round_trips(void) {
    const DType types[2] = {DTYPE_F16, DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        int bad = 0, bad_mid = 0;
        for (uint32_t b = 0; b < 0x10000; b++) {
            float f = float_of(types[t], (uint16_t)b);
            if (isnan(f)) continue;
            bad += half_bits_of(types[t], f) != b;
            /* b and b + 1 are neighbours of one sign when neither is inf or NaN */
            float next = float_of(types[t], (uint16_t)(b + 1));
            if ((b & 0x7fff) == 0x7fff || isinf(f) || isinf(next) || isnan(next)) continue;
            double mid = ((double)f + next) / 2;
            float below = nextafterf((float)mid, f), above = nextafterf((float)mid, next);
            uint16_t want_mid = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
            bad_mid += half_bits_of(types[t], below) != b ||
                       half_bits_of(types[t], above) != (uint16_t)(b + 1) ||
                       ((double)(float)mid == mid && half_bits_of(types[t], (float)mid) != want_mid);
        }
        CHECK_MSG(bad == 0, "%s: %d values change on a round trip", dtype_name(types[t]), bad);
        CHECK_MSG(bad_mid == 0, "%s: %d midpoints round wrongly", dtype_name(types[t]), bad_mid);
    }
    float src[3] = {1.5f, -3.25f, 7.0f}, back[3];
    cast_from_f32_cpu(DTYPE_F32, src, back, 3);
    CHECK(same_bits(src, back, 3));
}

static void test_amp_cpu(void) {
    test_loss_scaler_check();
    test_loss_scaler_state_machine();
    test_sgd_mixed((SgdParams){.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1});
    test_sgd_mixed((SgdParams){.momentum = 0.9f, .weight_decay = 0.0f, .nesterov = 0});
    test_sgd_mixed((SgdParams){.momentum = 0.0f, .weight_decay = 1e-2f, .nesterov = 0});
    test_softmax_scale_pointer();
    test_cast_values();
    test_cast_round_trips();
}

/* ---- speed: SimpleNet's convolutions, batch 32 at 32x32, forward and backward ---- */

static void report_conv_speed(void) {
    const Conv2dShape layers[3] = {
        {.n = 32, .c = 3, .h = 32, .w = 32, .k = 64, .r = 3, .s = 3, .pad = 1, .stride = 1},
        {.n = 32, .c = 64, .h = 16, .w = 16, .k = 128, .r = 3, .s = 3, .pad = 1, .stride = 1},
        {.n = 32, .c = 128, .h = 8, .w = 8, .k = 256, .r = 3, .s = 3, .pad = 1, .stride = 1},
    };
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 3; i++) {
        const Conv2dShape *s = &layers[i];
        float *x = random_floats(conv_x_size(s), -1, 1), *w = random_floats(conv_w_size(s), -1, 1);
        float *b = floats(s->k), *y = floats(conv_y_size(s)), *dx = floats(conv_x_size(s));
        float *dw = floats(conv_w_size(s)), *db = floats(s->k);
        conv2d_forward_cpu(s, x, w, b, y);
        conv2d_backward_cpu(s, x, w, y, i ? dx : NULL, dw, db);
        free(x), free(w), free(b), free(y), free(dx), free(dw), free(db);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("SimpleNet convolutions, batch 32, forward + backward: %.1f ms\n",
           (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
}

int main(void) {
    rng = test_seed();
    test_gemm();
    test_conv();
    test_maxpool();
    test_softmax();
    test_sgd();
    test_accuracy();
    test_amp_cpu();
    report_conv_speed();
    return test_finish("test_ops_cpu");
}
