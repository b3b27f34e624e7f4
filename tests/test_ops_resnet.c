/* The ops ResNet adds: batch norm (plain and fused with ReLU; synchronized
 * over ranks, two simulated in one process), residual add, global average
 * pooling, the conv2d dx accumulation, label smoothing, masked weight decay
 * and the device-side learning-rate schedule.
 *
 * The CPU part always runs: forward values against hand computation or an
 * independent formula, backward against central finite differences of a
 * scalar loss, accumulate flags, PyTorch semantics (running statistics,
 * OneCycleLR). The GPU part runs where there is a GPU: every CUDA path against
 * the CPU reference on fresh random inputs in f32, f16 and bf16, NCHW and NHWC,
 * with outputs poisoned with NaN before each call (an element not written
 * fails) and accumulators prefilled with random values on both sides;
 * reproducibility, scratch sharing and CUDA-graph capture of batch norm; the lr
 * schedule replayed from a graph. Inputs of the half types are rounded to the
 * type on the host first, so both sides see the same values. Prints batch
 * norm's bandwidth at ResNet sizes (not asserted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/add.h"
#include "ops/avgpool.h"
#include "ops/batchnorm.h"
#include "ops/cast.h"
#include "ops/conv2d.h"
#include "ops/lr_schedule.h"
#include "ops/relu.h"
#include "ops/sgd.h"
#include "ops/softmax_xent.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/op_checks.h"
#include "tests/op_buffers.h"

#define COUNT(a) (sizeof(a) / sizeof *(a))
#define BN_EPS 1e-5f

static uint64_t rng;

/* ---- host helpers ---------------------------------------------------------------- */

static float *random_floats(size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, &rng, lo, hi);
    return p;
}

static double *host_doubles(size_t n) { return host_bytes(n * sizeof(double)); }

static int same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static void free_all(void **p, size_t count) {
    for (size_t i = 0; i < count; i++) free(p[i]);
}

/* ||got - want|| / ||want|| <= tol, printed. */
static void check_rel(const char *what, const float *got, const float *want, size_t n, double tol) {
    double err = test_rel_error(got, want, n);
    printf("  %-66s rel err %.2e (bound %.0e)\n", what, err, tol);
    CHECK_MSG(err <= tol, "%s: relative error %.3g > %.3g", what, err, tol);
}

static size_t bn_numel(const BatchNormShape *s) { return (size_t)s->n * s->c * s->h * s->w; }

/* x with a random offset and scale per channel, so each channel has its own
 * mean and variance for the normalization to remove. */
static float *bn_input(const BatchNormShape *s, float offset, float spread) {
    size_t plane = (size_t)s->h * s->w;
    float *x = host_floats(bn_numel(s));
    for (int c = 0; c < s->c; c++) {
        float shift = test_uniform(&rng, -offset, offset), scale = test_uniform(&rng, 0.5f, 2.0f);
        for (int i = 0; i < s->n; i++)
            for (size_t p = 0; p < plane; p++)
                x[((size_t)i * s->c + c) * plane + p] = shift + scale * test_uniform(&rng, -spread, spread);
    }
    return x;
}

/* ---- CPU: batch norm ------------------------------------------------------------- */

static void test_bn_cpu_hand(void) {
    printf("batchnorm cpu by hand\n");
    /* n = 2, c = 1, 1x2: x = 1 2 3 4, mean 2.5, biased var 1.25, unbiased 5/3 */
    BatchNormShape s = {2, 1, 1, 2};
    float x[4] = {1, 2, 3, 4}, gamma = 2.0f, beta = 0.5f, y[4];
    float rmean = 1.0f, rvar = 3.0f, smean = -1, sinv = -1;
    batchnorm_forward_train_cpu(&s, x, &gamma, &beta, 0.1f, 0.0f, &rmean, &rvar, &smean, &sinv, y);
    double inv = 1.0 / sqrt(1.25);
    check_values("bn y", y, (double[]){0.5 - 3 * inv, 0.5 - inv, 0.5 + inv, 0.5 + 3 * inv}, 4, 1e-6);
    CHECK_NEAR(smean, 2.5, 1e-6);
    CHECK_NEAR(sinv, inv, 1e-6);
    CHECK_NEAR(rmean, 0.9 * 1.0 + 0.1 * 2.5, 1e-6);
    CHECK_NEAR(rvar, 0.9 * 3.0 + 0.1 * 5.0 / 3.0, 1e-6); /* unbiased, as PyTorch */
    /* momentum 0: the running statistics keep their bits */
    float rmean0 = rmean, rvar0 = rvar;
    batchnorm_forward_train_cpu(&s, x, &gamma, &beta, 0.0f, 0.0f, &rmean, &rvar, &smean, &sinv, y);
    CHECK(same_bits(&rmean, &rmean0, 1) && same_bits(&rvar, &rvar0, 1));
    /* eval with running mean 2, var 4 (eps 0): (x - 2) / 2 * gamma + beta */
    float rm = 2.0f, rv = 4.0f;
    batchnorm_forward_eval_cpu(&s, x, &gamma, &beta, &rm, &rv, 0.0f, y);
    check_values("bn eval y", y, (double[]){-0.5, 0.5, 1.5, 2.5}, 4, 1e-6);
    batchnorm_relu_forward_eval_cpu(&s, x, &gamma, &beta, &rm, &rv, 0.0f, y);
    check_values("bn+relu eval y", y, (double[]){0, 0.5, 1.5, 2.5}, 4, 1e-6);
}

/* Training-mode output: per channel, mean beta and variance gamma^2 var / (var + eps),
 * against the statistics computed here in double. */
static void test_bn_cpu_statistics(BatchNormShape s) {
    printf("batchnorm cpu statistics %dx%dx%dx%d\n", s.n, s.c, s.h, s.w);
    size_t nx = bn_numel(&s), plane = (size_t)s.h * s.w;
    double m = (double)s.n * plane;
    float *x = bn_input(&s, 3.0f, 1.0f), *y = host_floats(nx);
    float *gamma = random_floats(s.c, 0.5f, 1.5f), *beta = random_floats(s.c, -1, 1);
    float *rmean = random_floats(s.c, -1, 1), *rvar = random_floats(s.c, 0.5f, 2);
    float *rmean0 = copy_floats(rmean, s.c), *rvar0 = copy_floats(rvar, s.c);
    float *smean = host_floats(s.c), *sinv = host_floats(s.c);
    const float momentum = 0.1f;
    batchnorm_forward_train_cpu(&s, x, gamma, beta, momentum, BN_EPS, rmean, rvar, smean, sinv, y);
    double *want_mean = host_doubles(s.c), *want_inv = host_doubles(s.c);
    double *want_rmean = host_doubles(s.c), *want_rvar = host_doubles(s.c);
    for (int c = 0; c < s.c; c++) {
        double sum = 0, sq = 0, ysum = 0, ysq = 0;
        for (int i = 0; i < s.n; i++)
            for (size_t p = 0; p < plane; p++) sum += x[((size_t)i * s.c + c) * plane + p];
        double mean = sum / m;
        for (int i = 0; i < s.n; i++)
            for (size_t p = 0; p < plane; p++) {
                size_t at = ((size_t)i * s.c + c) * plane + p;
                sq += (x[at] - mean) * (x[at] - mean);
                ysum += y[at];
            }
        double var = sq / m, ymean = ysum / m;
        for (int i = 0; i < s.n; i++)
            for (size_t p = 0; p < plane; p++) {
                double d = y[((size_t)i * s.c + c) * plane + p] - ymean;
                ysq += d * d;
            }
        want_mean[c] = mean;
        want_inv[c] = 1.0 / sqrt(var + BN_EPS);
        want_rmean[c] = (1 - momentum) * rmean0[c] + momentum * mean;
        want_rvar[c] = (1 - momentum) * rvar0[c] + momentum * var * m / (m - 1);
        CHECK_MSG(fabs(ymean - beta[c]) <= 1e-5, "channel %d: mean of y %.9g, beta %.9g", c, ymean,
                  beta[c]);
        double want_var = (double)gamma[c] * gamma[c] * var / (var + BN_EPS);
        CHECK_MSG(fabs(ysq / m - want_var) <= 1e-5 * want_var, "channel %d: var of y %.9g, want %.9g",
                  c, ysq / m, want_var);
    }
    check_values("bn save_mean", smean, want_mean, s.c, 1e-6);
    check_values("bn save_invstd", sinv, want_inv, s.c, 1e-6);
    check_values("bn running_mean", rmean, want_rmean, s.c, 1e-6);
    check_values("bn running_var (unbiased)", rvar, want_rvar, s.c, 1e-6);
    void *p[] = {x, y, gamma, beta, rmean, rvar, rmean0, rvar0, smean, sinv, want_mean, want_inv,
                 want_rmean, want_rvar};
    free_all(p, COUNT(p));
}

static void test_bn_cpu_eval(BatchNormShape s) {
    printf("batchnorm cpu eval %dx%dx%dx%d\n", s.n, s.c, s.h, s.w);
    size_t nx = bn_numel(&s), plane = (size_t)s.h * s.w;
    float *x = random_floats(nx, -3, 3), *y = host_floats(nx), *yr = host_floats(nx);
    float *gamma = random_floats(s.c, 0.5f, 1.5f), *beta = random_floats(s.c, -1, 1);
    float *rmean = random_floats(s.c, -1, 1), *rvar = random_floats(s.c, 0.1f, 3);
    batchnorm_forward_eval_cpu(&s, x, gamma, beta, rmean, rvar, BN_EPS, y);
    batchnorm_relu_forward_eval_cpu(&s, x, gamma, beta, rmean, rvar, BN_EPS, yr);
    double *want = host_doubles(nx), *want_relu = host_doubles(nx);
    for (size_t i = 0; i < nx; i++) {
        int c = (int)((i / plane) % s.c);
        want[i] = (x[i] - (double)rmean[c]) / sqrt((double)rvar[c] + BN_EPS) * gamma[c] + beta[c];
        want_relu[i] = want[i] > 0 ? want[i] : 0;
    }
    check_values("bn eval y", y, want, nx, 1e-6);
    check_values("bn+relu eval y", yr, want_relu, nx, 1e-6);
    void *p[] = {x, y, yr, gamma, beta, rmean, rvar, want, want_relu};
    free_all(p, COUNT(p));
}

typedef struct {
    BatchNormShape s;
    float *x, *gamma, *beta, *r, *y;
    int relu;
} BnLoss;

/* The training-mode forward's weighted sum; momentum 0 and no saved statistics. */
static double bn_loss(void *ctx) {
    BnLoss *b = ctx;
    if (b->relu)
        batchnorm_relu_forward_train_cpu(&b->s, b->x, b->gamma, b->beta, 0.0f, BN_EPS, NULL, NULL,
                                         NULL, NULL, b->y);
    else
        batchnorm_forward_train_cpu(&b->s, b->x, b->gamma, b->beta, 0.0f, BN_EPS, NULL, NULL, NULL,
                                    NULL, b->y);
    return weighted_sum(b->y, b->r, bn_numel(&b->s));
}

/* Values whose normalized form stays at least ~0.2 standard deviations away
 * from zero, so that with beta = 0 no ReLU kink lies within a perturbation:
 * per channel, random magnitudes in [0.3, 1.5] with random signs, re-drawn
 * until their mean is within 0.1 of zero, then shifted by a channel offset. */
static float *bn_input_away_from_zero(const BatchNormShape *s) {
    size_t plane = (size_t)s->h * s->w, m = (size_t)s->n * plane;
    float *x = host_floats(bn_numel(s)), *v = host_floats(m);
    for (int c = 0; c < s->c; c++) {
        double mean;
        do {
            mean = 0;
            for (size_t j = 0; j < m; j++) {
                float mag = test_uniform(&rng, 0.3f, 1.5f);
                v[j] = test_uniform(&rng, -1, 1) < 0 ? -mag : mag;
                mean += v[j];
            }
            mean /= (double)m;
        } while (fabs(mean) > 0.1);
        float offset = test_uniform(&rng, -2, 2);
        for (size_t j = 0; j < m; j++)
            x[((j / plane) * s->c + c) * plane + j % plane] = offset + v[j];
    }
    free(v);
    return x;
}

/* Backward against finite differences in dx, dgamma and dbeta; then the
 * accumulate flags: dx added onto random values with accumulate_dx, dgamma and
 * dbeta always added. */
static void test_bn_cpu_gradients(BatchNormShape s, int relu) {
    printf("batchnorm%s cpu backward %dx%dx%dx%d\n", relu ? "+relu" : "", s.n, s.c, s.h, s.w);
    size_t nx = bn_numel(&s);
    BnLoss b = {s, relu ? bn_input_away_from_zero(&s) : bn_input(&s, 2.0f, 1.0f),
                random_floats(s.c, 0.5f, 1.5f),
                relu ? host_floats(s.c) : random_floats(s.c, -1, 1), random_floats(nx, -1, 1),
                host_floats(nx), relu};
    float *smean = host_floats(s.c), *sinv = host_floats(s.c), *y = host_floats(nx);
    if (relu)
        batchnorm_relu_forward_train_cpu(&s, b.x, b.gamma, b.beta, 0.0f, BN_EPS, NULL, NULL, smean,
                                         sinv, y);
    else
        batchnorm_forward_train_cpu(&s, b.x, b.gamma, b.beta, 0.0f, BN_EPS, NULL, NULL, smean, sinv,
                                    y);
    float *dx = host_floats(nx), *dgamma = host_floats(s.c), *dbeta = host_floats(s.c);
    if (relu)
        batchnorm_relu_backward_cpu(&s, b.x, y, b.r, b.gamma, smean, sinv, dx, 0, dgamma, dbeta);
    else
        batchnorm_backward_cpu(&s, b.x, b.r, b.gamma, smean, sinv, dx, 0, dgamma, dbeta);

    double *num = host_doubles(nx);
    char what[96];
    numeric_gradient(b.x, nx, 1e-2f, bn_loss, &b, num);
    snprintf(what, sizeof what, "bn%s dx %dx%dx%dx%d", relu ? "+relu" : "", s.n, s.c, s.h, s.w);
    check_gradient(what, dx, num, nx);
    numeric_gradient(b.gamma, s.c, 1e-2f, bn_loss, &b, num);
    snprintf(what, sizeof what, "bn%s dgamma", relu ? "+relu" : "");
    check_gradient(what, dgamma, num, s.c);
    numeric_gradient(b.beta, s.c, 1e-2f, bn_loss, &b, num);
    snprintf(what, sizeof what, "bn%s dbeta", relu ? "+relu" : "");
    check_gradient(what, dbeta, num, s.c);

    /* the fused backward is the plain one on dy masked by y > 0, to the bit */
    if (relu) {
        float *masked = host_floats(nx), *dx2 = host_floats(nx);
        float *dgamma2 = host_floats(s.c), *dbeta2 = host_floats(s.c);
        relu_backward_cpu(y, b.r, masked, nx);
        batchnorm_backward_cpu(&s, b.x, masked, b.gamma, smean, sinv, dx2, 0, dgamma2, dbeta2);
        CHECK_MSG(same_bits(dx, dx2, nx) && same_bits(dgamma, dgamma2, s.c) &&
                      same_bits(dbeta, dbeta2, s.c),
                  "bn+relu backward differs from bn backward on relu-masked dy");
        free(masked), free(dx2), free(dgamma2), free(dbeta2);
    }

    /* accumulate: dx = old + dx, dgamma and dbeta added to, dx NULL skipped */
    float *old = random_floats(nx, -1, 1), *acc = copy_floats(old, nx);
    float *g0 = random_floats(s.c, -1, 1), *b0 = random_floats(s.c, -1, 1);
    float *gacc = copy_floats(g0, s.c), *bacc = copy_floats(b0, s.c);
    float *gnull = copy_floats(g0, s.c), *bnull = copy_floats(b0, s.c);
    if (relu) {
        batchnorm_relu_backward_cpu(&s, b.x, y, b.r, b.gamma, smean, sinv, acc, 1, gacc, bacc);
        batchnorm_relu_backward_cpu(&s, b.x, y, b.r, b.gamma, smean, sinv, NULL, 0, gnull, bnull);
    } else {
        batchnorm_backward_cpu(&s, b.x, b.r, b.gamma, smean, sinv, acc, 1, gacc, bacc);
        batchnorm_backward_cpu(&s, b.x, b.r, b.gamma, smean, sinv, NULL, 0, gnull, bnull);
    }
    int ok = 1;
    for (size_t i = 0; i < nx; i++) ok &= acc[i] == old[i] + dx[i];
    for (int c = 0; c < s.c; c++)
        ok &= gacc[c] == g0[c] + dgamma[c] && bacc[c] == b0[c] + dbeta[c];
    CHECK_MSG(ok, "bn%s backward: accumulate_dx or dgamma/dbeta accumulation wrong", relu ? "+relu" : "");
    CHECK_MSG(same_bits(gnull, gacc, s.c) && same_bits(bnull, bacc, s.c),
              "bn backward with dx NULL gives other dgamma/dbeta");

    void *p[] = {b.x, b.gamma, b.beta, b.r, b.y, smean, sinv, y, dx, dgamma, dbeta, num, old, acc,
                 g0, b0, gacc, bacc, gnull, bnull};
    free_all(p, COUNT(p));
}

/* The fused forward is relu(bn(x)), to the bit. */
static void test_bn_relu_cpu_forward(BatchNormShape s) {
    size_t nx = bn_numel(&s);
    float *x = bn_input(&s, 1.0f, 1.0f), *gamma = random_floats(s.c, 0.5f, 1.5f);
    float *beta = random_floats(s.c, -1, 1), *y = host_floats(nx), *yr = host_floats(nx);
    float *want = host_floats(nx), *rm = random_floats(s.c, -1, 1), *rv = random_floats(s.c, 1, 2);
    float *rm2 = copy_floats(rm, s.c), *rv2 = copy_floats(rv, s.c);
    batchnorm_forward_train_cpu(&s, x, gamma, beta, 0.1f, BN_EPS, rm, rv, NULL, NULL, y);
    batchnorm_relu_forward_train_cpu(&s, x, gamma, beta, 0.1f, BN_EPS, rm2, rv2, NULL, NULL, yr);
    relu_forward_cpu(y, want, nx);
    size_t zeros = 0;
    for (size_t i = 0; i < nx; i++) zeros += yr[i] == 0.0f;
    CHECK_MSG(same_bits(yr, want, nx), "bn+relu forward is not relu(bn forward)");
    CHECK_MSG(zeros > 0 && zeros < nx, "bn+relu: %zu zeros of %zu", zeros, nx);
    CHECK(same_bits(rm, rm2, s.c) && same_bits(rv, rv2, s.c));
    void *p[] = {x, gamma, beta, y, yr, want, rm, rv, rm2, rv2};
    free_all(p, COUNT(p));
}

/* ---- CPU: synchronized batch norm ------------------------------------------------- */

/* Two ranks simulated in one process, each holding half of a batch. A
 * synchronized call runs twice on each half: pass 0 records the half's local
 * sums (and doubles them, as if the other half were the same: its outputs are
 * then reset or overwritten), pass 1 adds the other half's, as an all-reduce
 * over two ranks would (a + b on one, b + a on the other: the same bits).
 * device: the sums are in device memory. */
typedef struct {
    double *recorded[2];
    int n, rank, pass, device;
} FakeRanks;

static void fake_allreduce(void *ctx, double *sums, int n, cudaStream_t stream) {
    FakeRanks *f = ctx;
    size_t bytes = (size_t)n * sizeof(double);
    CHECK(n == f->n);
    double *host = f->device ? host_doubles(n) : sums;
    if (f->device) download_on(stream, host, sums, bytes);
    if (f->pass == 0) memcpy(f->recorded[f->rank], host, bytes);
    const double *other = f->recorded[f->pass == 0 ? f->rank : 1 - f->rank];
    for (int i = 0; i < n; i++) host[i] += other[i];
    if (f->device) {
        upload_on(stream, sums, host, bytes);
        free(host);
    }
}

/* One process: the sums stay as they are. ctx counts the calls. */
static void solo_allreduce(void *ctx, double *sums, int n, cudaStream_t stream) {
    (void)sums, (void)n, (void)stream;
    ++*(int *)ctx;
}

/* What one batch-norm layer's forward and backward give. */
typedef struct {
    float *y, *mean, *invstd, *rmean, *rvar, *dx, *dgamma, *dbeta;
} BnOut;

static BnOut bn_out_new(size_t nx, int c, const float *rmean0, const float *rvar0) {
    BnOut o = {host_floats(nx), host_floats(c), host_floats(c), copy_floats(rmean0, c),
               copy_floats(rvar0, c), host_floats(nx), host_floats(c), host_floats(c)};
    return o;
}

static void bn_out_free(BnOut *o) {
    void *p[] = {o->y, o->mean, o->invstd, o->rmean, o->rvar, o->dx, o->dgamma, o->dbeta};
    free_all(p, COUNT(p));
}

/* [a | b]: two halves back to back (images are outermost, NCHW and NHWC alike). */
static float *joined(const float *a, const float *b, size_t half) {
    float *p = host_floats(2 * half);
    memcpy(p, a, half * sizeof(float));
    memcpy(p + half, b, half * sizeof(float));
    return p;
}

/* Training forward with momentum 0.1 (running statistics skipped unless
 * 'running'); synchronized with reduce, else plain. */
static void cpu_bn_forward(const BatchNormShape *s, const float *x, const float *gamma,
                           const float *beta, int running, int relu, BnAllreduce reduce, void *ctx,
                           BnOut *o) {
    float *rm = running ? o->rmean : NULL, *rv = running ? o->rvar : NULL;
    if (reduce)
        batchnorm_forward_train_sync_cpu(s, x, gamma, beta, 0.1f, BN_EPS, rm, rv, o->mean, o->invstd,
                                         o->y, reduce, ctx, relu);
    else if (relu)
        batchnorm_relu_forward_train_cpu(s, x, gamma, beta, 0.1f, BN_EPS, rm, rv, o->mean, o->invstd,
                                         o->y);
    else
        batchnorm_forward_train_cpu(s, x, gamma, beta, 0.1f, BN_EPS, rm, rv, o->mean, o->invstd, o->y);
}

/* Backward from o's saved statistics into o's dx, dgamma, dbeta; mask: the
 * ReLU's y (relu). */
static void cpu_bn_backward(const BatchNormShape *s, const float *x, const float *mask,
                            const float *dy, const float *gamma, int relu, BnAllreduce reduce,
                            void *ctx, BnOut *o) {
    if (reduce)
        batchnorm_backward_sync_cpu(s, x, mask, dy, gamma, o->mean, o->invstd, o->dx, 0, o->dgamma,
                                    o->dbeta, reduce, ctx, relu);
    else if (relu)
        batchnorm_relu_backward_cpu(s, x, mask, dy, gamma, o->mean, o->invstd, o->dx, 0, o->dgamma,
                                    o->dbeta);
    else
        batchnorm_backward_cpu(s, x, dy, gamma, o->mean, o->invstd, o->dx, 0, o->dgamma, o->dbeta);
}

/* dist.sync_bn's arithmetic. One process (sums left alone): the plain
 * results, the backward to the bit. Two ranks (FakeRanks), each with half of
 * the batch: together they give the whole batch's plain results. A rank's loss
 * is the mean over its half, so its dy is 2x the whole batch's for the same
 * samples: its dx is 2x the whole's, and the parameter gradients averaged over
 * the ranks (DDP) are the whole's. Per-rank (plain) statistics give other y:
 * the check can fail. offset: the channels' means, in std units roughly. */
static void test_bn_sync_cpu(BatchNormShape s, int relu, float offset, int running) {
    printf("batchnorm%s cpu synchronized %dx%dx%dx%d (offset %g%s)\n", relu ? "+relu" : "", s.n,
           s.c, s.h, s.w, offset, running ? "" : ", no running statistics");
    const char *tag = relu ? "sync bn+relu" : "sync bn";
    char what[96];
    BatchNormShape h = s;
    h.n = s.n / 2;
    size_t nx = bn_numel(&s), nh = bn_numel(&h);
    float *x = bn_input(&s, offset, 1.0f), *dy = random_floats(nx, -1, 1);
    float *gamma = random_floats(s.c, 0.5f, 1.5f), *beta = random_floats(s.c, -1, 1);
    float *rmean0 = random_floats(s.c, -1, 1), *rvar0 = random_floats(s.c, 0.5f, 2);
    float *dy2 = host_floats(nx);
    for (size_t i = 0; i < nx; i++) dy2[i] = 2.0f * dy[i];

    BnOut whole = bn_out_new(nx, s.c, rmean0, rvar0);
    cpu_bn_forward(&s, x, gamma, beta, running, relu, NULL, NULL, &whole);
    cpu_bn_backward(&s, x, whole.y, dy, gamma, relu, NULL, NULL, &whole);

    /* one process: forward within rounding, backward (same saved statistics) to the bit */
    int calls = 0;
    BnOut solo = bn_out_new(nx, s.c, rmean0, rvar0);
    cpu_bn_forward(&s, x, gamma, beta, running, relu, solo_allreduce, &calls, &solo);
    snprintf(what, sizeof what, "%s, one process: y", tag);
    check_rel(what, solo.y, whole.y, nx, 1e-6);
    check_rel("  save_mean", solo.mean, whole.mean, s.c, 1e-6);
    check_rel("  save_invstd", solo.invstd, whole.invstd, s.c, 1e-6);
    if (running) {
        check_rel("  running_mean", solo.rmean, whole.rmean, s.c, 1e-6);
        check_rel("  running_var", solo.rvar, whole.rvar, s.c, 1e-6);
    }
    memcpy(solo.mean, whole.mean, s.c * sizeof(float));
    memcpy(solo.invstd, whole.invstd, s.c * sizeof(float));
    cpu_bn_backward(&s, x, whole.y, dy, gamma, relu, solo_allreduce, &calls, &solo);
    CHECK_MSG(same_bits(solo.dx, whole.dx, nx) && same_bits(solo.dgamma, whole.dgamma, s.c) &&
                  same_bits(solo.dbeta, whole.dbeta, s.c),
              "%s, one process: backward differs from the plain one", tag);
    float *scratch_dg = host_floats(s.c), *scratch_db = host_floats(s.c);
    cpu_bn_backward(&s, x, whole.y, dy, gamma, relu, solo_allreduce, &calls, &(BnOut){
        .mean = whole.mean, .invstd = whole.invstd, .dgamma = scratch_dg, .dbeta = scratch_db});
    CHECK_MSG(calls == 2, "%s: %d reduce calls, want 2 (dx NULL needs none)", tag, calls);

    /* two ranks */
    BnOut half[2] = {bn_out_new(nh, s.c, rmean0, rvar0), bn_out_new(nh, s.c, rmean0, rvar0)};
    FakeRanks f = {{host_doubles(3 * s.c), host_doubles(3 * s.c)}, 3 * s.c, 0, 0, 0};
    for (f.pass = 0; f.pass < 2; f.pass++)
        for (f.rank = 0; f.rank < 2; f.rank++) {
            memcpy(half[f.rank].rmean, rmean0, s.c * sizeof(float));
            memcpy(half[f.rank].rvar, rvar0, s.c * sizeof(float));
            cpu_bn_forward(&h, x + f.rank * nh, gamma, beta, running, relu, fake_allreduce, &f, &half[f.rank]);
        }
    for (f.pass = 0; f.pass < 2; f.pass++)
        for (f.rank = 0; f.rank < 2; f.rank++) {
            memset(half[f.rank].dgamma, 0, s.c * sizeof(float));
            memset(half[f.rank].dbeta, 0, s.c * sizeof(float));
            cpu_bn_backward(&h, x + f.rank * nh, whole.y + f.rank * nh, dy2 + f.rank * nh, gamma, relu,
                            fake_allreduce, &f, &half[f.rank]);
        }
    float *y2 = joined(half[0].y, half[1].y, nh), *dx2 = joined(half[0].dx, half[1].dx, nh);
    float *dgamma2 = host_floats(s.c), *dbeta2 = host_floats(s.c);
    for (size_t i = 0; i < nx; i++) dx2[i] /= 2;
    for (int c = 0; c < s.c; c++) {
        dgamma2[c] = (half[0].dgamma[c] + half[1].dgamma[c]) / 2;
        dbeta2[c] = (half[0].dbeta[c] + half[1].dbeta[c]) / 2;
    }
    snprintf(what, sizeof what, "%s, two ranks: y against the whole batch's", tag);
    check_rel(what, y2, whole.y, nx, 1e-6);
    check_rel("  save_mean", half[0].mean, whole.mean, s.c, 1e-6);
    check_rel("  save_invstd", half[0].invstd, whole.invstd, s.c, 1e-6);
    if (running) {
        check_rel("  running_mean", half[0].rmean, whole.rmean, s.c, 1e-6);
        check_rel("  running_var (unbiased over the global count)", half[0].rvar, whole.rvar, s.c, 1e-6);
    }
    check_rel("  dx / 2", dx2, whole.dx, nx, 1e-6);
    check_rel("  dgamma averaged over the ranks", dgamma2, whole.dgamma, s.c, 1e-6);
    check_rel("  dbeta averaged over the ranks", dbeta2, whole.dbeta, s.c, 1e-6);
    CHECK_MSG(same_bits(half[0].mean, half[1].mean, s.c) && same_bits(half[0].invstd, half[1].invstd, s.c) &&
                  same_bits(half[0].rmean, half[1].rmean, s.c) && same_bits(half[0].rvar, half[1].rvar, s.c),
              "%s: the two ranks' statistics differ", tag);

    /* each rank on its own (where it can be): other statistics, other y */
    BnOut own = bn_out_new(nh, s.c, rmean0, rvar0);
    if (h.n * h.h * h.w >= 2) {
        cpu_bn_forward(&h, x, gamma, beta, running, relu, NULL, NULL, &own);
        double err = test_rel_error(own.y, whole.y, nh);
        CHECK_MSG(err > 1e-3, "%s: per-rank statistics give y within %.3g of the whole batch's", tag, err);
    }

    bn_out_free(&whole), bn_out_free(&solo), bn_out_free(&half[0]), bn_out_free(&half[1]), bn_out_free(&own);
    void *p[] = {x, dy, dy2, gamma, beta, rmean0, rvar0, scratch_dg, scratch_db, f.recorded[0], f.recorded[1],
                 y2, dx2, dgamma2, dbeta2};
    free_all(p, COUNT(p));
}

/* ---- CPU: add, avgpool ------------------------------------------------------------ */

static void test_add_cpu(void) {
    printf("add cpu\n");
    float a[5] = {1, -2, 0.5f, -0.25f, NAN}, b[5] = {0.5f, 1, -1, 0.25f, 1}, y[5], acc[5];
    add_forward_cpu(a, b, y, 5);
    CHECK(y[0] == 1.5f && y[1] == -1.0f && y[2] == -0.5f && y[3] == 0.0f && isnan(y[4]));
    add_relu_forward_cpu(a, b, y, 5);
    CHECK(y[0] == 1.5f && y[1] == 0.0f && y[2] == 0.0f && y[3] == 0.0f && isnan(y[4]));
    memcpy(acc, b, sizeof acc);
    add_accumulate_cpu(acc, a, 4);
    CHECK(acc[0] == 1.5f && acc[1] == -1.0f && acc[2] == -0.5f && acc[3] == 0.0f && acc[4] == 1.0f);
    /* in place: y aliases a */
    memcpy(acc, a, sizeof acc);
    add_forward_cpu(acc, b, acc, 4);
    CHECK(acc[0] == 1.5f && acc[1] == -1.0f);
}

/* The test's own shape for pooling; the op takes n, c and the plane h*w. */
typedef struct {
    int n, c, h, w;
} PoolShape;

typedef struct {
    PoolShape s;
    float *x, *r, *y;
} PoolLoss;

static double pool_loss(void *ctx) {
    PoolLoss *p = ctx;
    avgpool_forward_cpu(p->x, p->y, p->s.n, p->s.c, p->s.h * p->s.w);
    return weighted_sum(p->y, p->r, (size_t)p->s.n * p->s.c);
}

static void test_avgpool_cpu(void) {
    printf("avgpool cpu\n");
    float x[8] = {1, 2, 3, 4, -1, -1, 0, 6}, y[2], dy[2] = {4, -8}, dx[8];
    avgpool_forward_cpu(x, y, 1, 2, 4);
    CHECK(y[0] == 2.5f && y[1] == 1.0f);
    avgpool_backward_cpu(dy, dx, 0, 1, 2, 4);
    check_values("avgpool dx", dx, (double[]){1, 1, 1, 1, -2, -2, -2, -2}, 8, 0);
    avgpool_backward_cpu(dy, dx, 1, 1, 2, 4);
    check_values("avgpool dx (accumulated)", dx, (double[]){2, 2, 2, 2, -4, -4, -4, -4}, 8, 0);

    PoolShape s = {3, 5, 4, 3};
    size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = (size_t)s.n * s.c;
    PoolLoss p = {s, random_floats(nx, -1, 1), random_floats(ny, -1, 1), host_floats(ny)};
    float *g = host_floats(nx);
    double *num = host_doubles(nx);
    avgpool_backward_cpu(p.r, g, 0, s.n, s.c, s.h * s.w);
    numeric_gradient(p.x, nx, 1e-2f, pool_loss, &p, num);
    check_gradient("avgpool dx 3x5x4x3", g, num, nx);
    void *f[] = {p.x, p.r, p.y, g, num};
    free_all(f, COUNT(f));
}

/* ---- CPU: conv2d with accumulate_dx ----------------------------------------------- */

static size_t conv_x_size(const Conv2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t conv_w_size(const Conv2dShape *s) { return (size_t)s->k * s->c * s->r * s->s; }
static size_t conv_y_size(const Conv2dShape *s) {
    return (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s);
}

typedef struct {
    Conv2dShape s;
    float *x, *w, *b, *r, *y;
} ConvLoss;

static double conv_loss(void *ctx) {
    ConvLoss *c = ctx;
    conv2d_forward_cpu(&c->s, c->x, c->w, c->b, c->y);
    return weighted_sum(c->y, c->r, conv_y_size(&c->s));
}

static void test_conv_ex_cpu(Conv2dShape s) {
    printf("conv2d cpu %dx%dx%dx%d -> %d, %dx%d pad %d stride %d\n", s.n, s.c, s.h, s.w, s.k, s.r,
           s.s, s.pad, s.stride);
    size_t nx = conv_x_size(&s), nw = conv_w_size(&s), ny = conv_y_size(&s);
    ConvLoss c = {s, random_floats(nx, -1, 1), random_floats(nw, -0.5f, 0.5f),
                  random_floats(s.k, -1, 1), random_floats(ny, -1, 1), host_floats(ny)};
    float *dx = host_floats(nx), *dw = host_floats(nw), *db = host_floats(s.k);
    conv2d_backward_ex_cpu(&s, c.x, c.w, c.r, dx, dw, db, 0);
    double *num = host_doubles(nx > nw ? nx : nw);
    numeric_gradient(c.x, nx, 1e-2f, conv_loss, &c, num);
    check_gradient("conv dx", dx, num, nx);
    numeric_gradient(c.w, nw, 1e-2f, conv_loss, &c, num);
    check_gradient("conv dw", dw, num, nw);

    /* the plain call is the _ex one with 0; accumulate_dx adds onto dx */
    float *dx_plain = host_floats(nx), *dw_plain = host_floats(nw), *db_plain = host_floats(s.k);
    conv2d_backward_cpu(&s, c.x, c.w, c.r, dx_plain, dw_plain, db_plain);
    CHECK_MSG(same_bits(dx, dx_plain, nx) && same_bits(dw, dw_plain, nw),
              "conv2d_backward_cpu differs from conv2d_backward_ex_cpu(..., 0)");
    float *old = random_floats(nx, -1, 1), *acc = copy_floats(old, nx), *want = host_floats(nx);
    float *dw2 = host_floats(nw), *db2 = host_floats(s.k);
    conv2d_backward_ex_cpu(&s, c.x, c.w, c.r, acc, dw2, db2, 1);
    for (size_t i = 0; i < nx; i++) want[i] = old[i] + dx[i];
    check_rel("conv dx accumulated = old dx + dx", acc, want, nx, 1e-6);
    CHECK_MSG(same_bits(dw2, dw, nw), "conv dw changes with accumulate_dx");

    /* ResNet's convolutions have no bias: NULL b and db skip it */
    float *zero_b = host_floats(s.k), *y0 = host_floats(ny), *y_null = host_floats(ny);
    float *dx_null = host_floats(nx), *dw_null = host_floats(nw);
    conv2d_forward_cpu(&s, c.x, c.w, zero_b, y0);
    conv2d_forward_cpu(&s, c.x, c.w, NULL, y_null);
    conv2d_backward_ex_cpu(&s, c.x, c.w, c.r, dx_null, dw_null, NULL, 0);
    CHECK_MSG(same_bits(y_null, y0, ny) && same_bits(dx_null, dx, nx) && same_bits(dw_null, dw, nw),
              "conv2d cpu with NULL bias differs from a zero bias");
    void *p[] = {c.x, c.w, c.b, c.r, c.y, dx, dw, db, num, dx_plain, dw_plain, db_plain, old, acc,
                 want, dw2, db2, zero_b, y0, y_null, dx_null, dw_null};
    free_all(p, COUNT(p));
}

/* ---- CPU: label smoothing --------------------------------------------------------- */

typedef struct {
    float *logits, *dl;
    int32_t *labels;
    int n, classes;
    float smoothing;
} XentLoss;

static double xent_loss(void *ctx) {
    XentLoss *x = ctx;
    float loss;
    softmax_xent_smooth_cpu(x->logits, x->labels, x->n, x->classes, x->smoothing, NULL, &loss, x->dl);
    return loss;
}

static void test_softmax_smoothing_cpu(void) {
    printf("softmax_xent label smoothing cpu\n");
    /* one row, PyTorch's definition: -sum_j q_j log p_j, q = (1 - eps) onehot + eps / K */
    float logits[3] = {1, 2, 3}, dl[3], loss;
    int32_t label = 0;
    const double eps = 0.1;
    double z = exp(1) + exp(2) + exp(3), p[3] = {exp(1) / z, exp(2) / z, exp(3) / z};
    double q[3] = {1 - eps + eps / 3, eps / 3, eps / 3}, want_loss = 0;
    for (int j = 0; j < 3; j++) want_loss -= q[j] * log(p[j]);
    softmax_xent_smooth_cpu(logits, &label, 1, 3, (float)eps, NULL, &loss, dl);
    CHECK_NEAR(loss, want_loss, 1e-6);
    check_values("smoothed dlogits", dl, (double[]){p[0] - q[0], p[1] - q[1], p[2] - q[2]}, 3, 1e-6);
    /* eps = 1: the uniform target, whatever the label */
    softmax_xent_smooth_cpu(logits, &label, 1, 3, 1.0f, NULL, &loss, dl);
    CHECK_NEAR(loss, log(z) - 2.0, 1e-6);

    /* finite differences, with a gradient scale */
    int n = 4, classes = 5;
    size_t total = (size_t)n * classes;
    XentLoss x = {random_floats(total, -3, 3), host_floats(total), host_bytes(sizeof(int32_t) * n),
                  n, classes, 0.2f};
    for (int i = 0; i < n; i++) x.labels[i] = (int32_t)(test_uniform(&rng, 0, 1) * classes) % classes;
    float *g = host_floats(total), *g2 = host_floats(total), scale = 2.0f;
    softmax_xent_smooth_cpu(x.logits, x.labels, n, classes, x.smoothing, NULL, &loss, g);
    double *num = host_doubles(total);
    numeric_gradient(x.logits, total, 1e-2f, xent_loss, &x, num);
    check_gradient("smoothed softmax dlogits 4x5 (eps 0.2)", g, num, total);
    float loss2;
    softmax_xent_smooth_cpu(x.logits, x.labels, n, classes, x.smoothing, &scale, &loss2, g2);
    for (size_t i = 0; i < total; i++) g[i] *= 2.0f;
    CHECK_MSG(same_bits(g, g2, total) && loss == loss2, "grad_scale 2 does not double dlogits");
    /* eps = 0 is the unsmoothed op, to the bit */
    float loss_plain, loss_zero;
    softmax_xent_cpu(x.logits, x.labels, n, classes, NULL, &loss_plain, g);
    softmax_xent_smooth_cpu(x.logits, x.labels, n, classes, 0.0f, NULL, &loss_zero, g2);
    CHECK_MSG(same_bits(g, g2, total) && loss_plain == loss_zero,
              "softmax_xent_smooth with eps 0 differs from softmax_xent");
    void *f[] = {x.logits, x.dl, x.labels, g, g2, num};
    free_all(f, COUNT(f));
}

/* ---- CPU: masked weight decay ----------------------------------------------------- */

static uint8_t *random_mask(size_t n) {
    uint8_t *mask = host_bytes(n);
    for (size_t i = 0; i < n; i++) mask[i] = test_uniform(&rng, 0, 1) < 0.5f ? 0 : (uint8_t)(1 + i % 7);
    return mask;
}

/* where mask: a, else b, elementwise */
static void select_floats(const uint8_t *mask, const float *a, const float *b, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = mask[i] ? a[i] : b[i];
}

static void test_sgd_mask_cpu(SgdParams p) {
    printf("sgd decay mask cpu: momentum %g wd %g nesterov %d\n", p.momentum, p.weight_decay,
           p.nesterov);
    size_t n = 1003;
    float lr = 0.05f;
    float *w = random_floats(n, -1, 1), *m = random_floats(n, -0.1f, 0.1f), *grad = random_floats(n, -1, 1);
    uint8_t *mask = random_mask(n);
    float *wd_w = copy_floats(w, n), *wd_m = copy_floats(m, n);  /* every parameter decays */
    float *no_w = copy_floats(w, n), *no_m = copy_floats(m, n);  /* none does */
    float *mk_w = copy_floats(w, n), *mk_m = copy_floats(m, n);  /* masked */
    float *want_w = host_floats(n), *want_m = host_floats(n);
    SgdParams none = p, masked = p;
    none.weight_decay = 0.0f;
    masked.decay_mask = mask;
    sgd_step_cpu(wd_w, grad, wd_m, n, &lr, p);
    sgd_step_cpu(no_w, grad, no_m, n, &lr, none);
    sgd_step_cpu(mk_w, grad, mk_m, n, &lr, masked);
    select_floats(mask, wd_w, no_w, want_w, n);
    select_floats(mask, wd_m, no_m, want_m, n);
    CHECK_MSG(same_bits(mk_w, want_w, n) && same_bits(mk_m, want_m, n),
              "sgd_step_cpu with a decay mask is not the decayed/undecayed step per element");
    CHECK_MSG(!same_bits(wd_w, no_w, n), "weight decay changed nothing: the check cannot fail");

    /* the mixed-precision step, with a scaler */
    LossScalerState scaler = loss_scaler_initial(1024.0f);
    float *scaled = host_floats(n);
    for (size_t i = 0; i < n; i++) scaled[i] = grad[i] * 1024.0f;
    memcpy(wd_w, w, n * sizeof(float)), memcpy(wd_m, m, n * sizeof(float));
    memcpy(no_w, w, n * sizeof(float)), memcpy(no_m, m, n * sizeof(float));
    memcpy(mk_w, w, n * sizeof(float)), memcpy(mk_m, m, n * sizeof(float));
    sgd_step_mixed_cpu(wd_w, scaled, wd_m, n, &lr, &scaler, p);
    sgd_step_mixed_cpu(no_w, scaled, no_m, n, &lr, &scaler, none);
    sgd_step_mixed_cpu(mk_w, scaled, mk_m, n, &lr, &scaler, masked);
    select_floats(mask, wd_w, no_w, want_w, n);
    select_floats(mask, wd_m, no_m, want_m, n);
    CHECK_MSG(same_bits(mk_w, want_w, n) && same_bits(mk_m, want_m, n),
              "sgd_step_mixed_cpu with a decay mask is not the decayed/undecayed step per element");
    void *f[] = {w, m, grad, mask, wd_w, wd_m, no_w, no_m, mk_w, mk_m, want_w, want_m, scaled};
    free_all(f, COUNT(f));
}

/* ---- CPU: learning-rate schedule -------------------------------------------------- */

/* torch.optim.lr_scheduler.OneCycleLR._get_lr (two phases, cos), transcribed:
 * the lr at step_num for max_lr, total_steps and pct_start. */
static double torch_onecycle(double max_lr, long total_steps, double pct_start, double div_factor,
                             double final_div_factor, long step_num) {
    double initial = max_lr / div_factor, min_lr = initial / final_div_factor;
    double end_steps[2] = {pct_start * total_steps - 1, (double)total_steps - 1};
    double start_lrs[2] = {initial, max_lr}, end_lrs[2] = {max_lr, min_lr};
    double start_step = 0;
    for (int i = 0; i < 2; i++) {
        double end_step = end_steps[i];
        if (step_num <= end_step || i == 1) {
            double pct = (step_num - start_step) / (end_step - start_step);
            double cos_out = cos(M_PI * pct) + 1;
            return end_lrs[i] + (start_lrs[i] - end_lrs[i]) / 2.0 * cos_out;
        }
        start_step = end_step;
    }
    return NAN;
}

/* |got - want| within 2^-23 of want: one float rounding. */
static int lr_close(float got, double want) { return fabs(got - want) <= fabs(want) * 1.2e-7 + 1e-30; }

#define CHECK_LR(sched, step, want) do { float got_ = lr_schedule_at(&(sched), (step)); \
    double want_ = (want); CHECK_MSG(lr_close(got_, want_), "lr at step %ld = %.9g, want %.9g", \
                                     (long)(step), got_, want_); } while (0)

static void test_lr_schedule_cpu(void) {
    printf("lr schedule cpu\n");
    LrSchedule constant = {.kind = LR_CONSTANT, .base_lr = 0.1f};
    CHECK_LR(constant, 0, 0.1f);
    CHECK_LR(constant, 123456, 0.1f);

    LrSchedule warm = {.kind = LR_CONSTANT, .base_lr = 0.2f, .warmup_steps = 10, .warmup_start_factor = 0.1f};
    double f = 0.1f, base = 0.2f;
    CHECK_LR(warm, 0, base * f);
    CHECK_LR(warm, 5, base * (f + (1 - f) * 0.5));
    CHECK_LR(warm, 9, base * (f + (1 - f) * 0.9));
    CHECK_LR(warm, 10, base);
    CHECK_LR(warm, 1000, base);

    LrSchedule cosine = {.kind = LR_COSINE, .base_lr = 0.1f, .warmup_steps = 5, .total_steps = 105,
                         .warmup_start_factor = 0.5f, .final_lr = 0.001f};
    double hi = 0.1f, lo = 0.001f;
    CHECK_LR(cosine, 0, hi * 0.5);
    CHECK_LR(cosine, 4, hi * (0.5 + 0.5 * 4 / 5.0));
    CHECK_LR(cosine, 5, hi);
    CHECK_LR(cosine, 30, lo + (hi - lo) * (1 + cos(M_PI * 25 / 100.0)) / 2);
    CHECK_LR(cosine, 55, (hi + lo) / 2);
    CHECK_LR(cosine, 104, lo + (hi - lo) * (1 + cos(M_PI * 99 / 100.0)) / 2);
    CHECK_LR(cosine, 105, lo);
    CHECK_LR(cosine, 100000, lo);

    LrSchedule onecycle = {.kind = LR_ONECYCLE, .base_lr = 0.4f, .warmup_steps = 30, .total_steps = 100};
    double max_lr = 0.4f;
    CHECK_LR(onecycle, 0, max_lr / 25);
    CHECK_LR(onecycle, 29, max_lr);
    CHECK_LR(onecycle, 99, max_lr / 25 / 1e4);
    CHECK_LR(onecycle, 500, max_lr / 25 / 1e4);
    int bad = 0;
    for (long t = 0; t < 100; t++)
        bad += !lr_close(lr_schedule_at(&onecycle, t), torch_onecycle(max_lr, 100, 30 / 100.0, 25, 1e4, t));
    CHECK_MSG(bad == 0, "onecycle: %d of 100 steps differ from OneCycleLR", bad);
    LrSchedule onecycle0 = {.kind = LR_ONECYCLE, .base_lr = 1.0f, .warmup_steps = 0, .total_steps = 50,
                            .div_factor = 10, .final_div_factor = 100};
    bad = 0;
    for (long t = 0; t < 50; t++)
        bad += !lr_close(lr_schedule_at(&onecycle0, t), torch_onecycle(1.0, 50, 0.0, 10, 100, t));
    CHECK_MSG(bad == 0, "onecycle with pct_start 0: %d of 50 steps differ from OneCycleLR", bad);

    LrSchedule step = {.kind = LR_STEP, .base_lr = 0.1f, .warmup_steps = 2, .warmup_start_factor = 0.25f,
                       .step_size = 30, .gamma = 0.1f};
    double sb = 0.1f, gm = 0.1f;
    CHECK_LR(step, 0, sb * 0.25);
    CHECK_LR(step, 2, sb);
    CHECK_LR(step, 31, sb);
    CHECK_LR(step, 32, sb * gm);
    CHECK_LR(step, 62, sb * gm * gm);

    /* step_cpu: the lr of the counter, then the counter moves on */
    int64_t counter = 0;
    float lr = -1;
    for (int i = 0; i < 40; i++) {
        lr_schedule_step_cpu(&cosine, &counter, &lr);
        CHECK(lr == lr_schedule_at(&cosine, i));
    }
    CHECK(counter == 40);
}

/* ==== GPU (a build without CUDA runs the CPU tests alone) ============================ */
#if TRAINC_CUDA
static GpuContext g;

static void upload(void *dst, const void *src, size_t bytes) { upload_on(g.compute, dst, src, bytes); }
static void download(void *dst, const void *src, size_t bytes) { download_on(g.compute, dst, src, bytes); }

static const DType all_types[3] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};

/* Relative L2 bounds: fp32 ~ a few roundings; f16 (11-bit) and bf16 (8-bit)
 * significands, results rounded once to the type. */
static double tol_for(DType dt, double f32) {
    return dt == DTYPE_F32 ? f32 : dt == DTYPE_F16 ? 3e-3 : 1e-2;
}

/* Uniform in [lo, hi), rounded to dt. */
static float *random_values(DType dt, size_t n, float lo, float hi) {
    float *p = random_floats(n, lo, hi);
    round_to(dt, p, n);
    return p;
}

static void *dev_elements(DType dt, size_t n) { return dev_bytes(n * dtype_size(dt)); }

static void upload_values(DType dt, void *dev, const float *host, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    cast_from_f32_cpu(dt, host, bits, n);
    upload(dev, bits, n * dtype_size(dt));
    free(bits);
}

static void *dev_values(DType dt, const float *host, size_t n) {
    void *p = dev_elements(dt, n);
    upload_values(dt, p, host, n);
    return p;
}

static float *download_values(DType dt, const void *dev, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    download(bits, dev, n * dtype_size(dt));
    float *p = host_floats(n);
    cast_to_f32_cpu(dt, bits, p, n);
    free(bits);
    return p;
}

static float *dev_floats_from(const float *host, size_t n) { return dev_values(DTYPE_F32, host, n); }
static float *download_floats(const float *dev, size_t n) { return download_values(DTYPE_F32, dev, n); }

/* All-ones bytes are NaN in f32, f16 and bf16. */
static void poison(void *dev, DType dt, size_t n) {
    CUDA_CHECK(cudaMemsetAsync(dev, 0xff, n * dtype_size(dt), g.compute));
}

static void cuda_free_all(void **p, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (p[i]) CUDA_CHECK(cudaFree(p[i]));
}

static void check_rel_dt(const char *what, DType dt, const float *gpu, const float *cpu, size_t n,
                         double tol) {
    char label[128];
    snprintf(label, sizeof label, "%-4s %s", dtype_name(dt), what);
    check_rel(label, gpu, cpu, n, tol);
}

/* dx against the CPU's, relative to the size of gamma * invstd * dy rather than
 * to dx's own: with few elements per channel dx cancels to almost nothing (with
 * two it is zero in exact arithmetic) and only the terms' rounding is left. */
static void check_dx_scaled(const char *what, DType dt, const BatchNormShape *s, const float *gpu,
                            const float *cpu, const float *dy, const float *gamma, const float *invstd,
                            double tol) {
    size_t plane = (size_t)s->h * s->w, n = (size_t)s->n * s->c * plane;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (int)(i / plane % (size_t)s->c);
        double term = (double)gamma[c] * invstd[c] * dy[i];
        diff += ((double)gpu[i] - cpu[i]) * ((double)gpu[i] - cpu[i]);
        scale += term * term;
    }
    double err = scale > 0 ? sqrt(diff / scale) : sqrt(diff);
    printf("  %-4s %-61s err %.2e of |gamma invstd dy| (bound %.0e)\n", dtype_name(dt), what, err, tol);
    CHECK_MSG(err <= tol, "%s %s: error %.3g of |gamma invstd dy| > %.3g", dtype_name(dt), what, err, tol);
}

/* The plain or the fused (ReLU) backward, as the case under test asks. */
static void bn_backward(const BatchNormCuda *bn, int relu, const void *x, const void *y, const void *dy,
                        const float *gamma, const float *mean, const float *invstd, void *dx, int accumulate,
                        void *dgamma, void *dbeta, DType dt) {
    if (relu)
        batchnorm_relu_backward_cuda(bn, g.cudnn, x, y, dy, gamma, mean, invstd, dx, accumulate, dgamma, dbeta, dt,
                                     g.compute);
    else
        batchnorm_backward_cuda(bn, g.cudnn, x, dy, gamma, mean, invstd, dx, accumulate, dgamma, dbeta, dt,
                                g.compute);
}

/* Host NCHW values to the device in the layout under test, and back. */
static void *dev_tensor(DType dt, int nhwc, const float *nchw, const BatchNormShape *s) {
    if (!nhwc) return dev_values(dt, nchw, bn_numel(s));
    float *t = to_nhwc(nchw, s->n, s->c, s->h, s->w, s->c);
    void *d = dev_values(dt, t, bn_numel(s));
    free(t);
    return d;
}

static float *download_tensor(DType dt, int nhwc, const void *dev, const BatchNormShape *s) {
    float *t = download_values(dt, dev, bn_numel(s));
    if (!nhwc) return t;
    float *u = to_nchw(t, s->n, s->c, s->h, s->w);
    free(t);
    return u;
}

static double rms(const float *x, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return n ? sqrt(sum / n) : 0;
}

/* ---- GPU: batch norm -------------------------------------------------------------- */

/* One shape, type and layout: forward (train, eval; plain and fused) and
 * backward (plain and fused; dx overwritten and accumulated; dgamma/dbeta added
 * into grad buffers of the data type, as the model keeps them). */
static void test_bn_gpu(DType dt, int nhwc, BatchNormShape s, float offset) {
    printf("batchnorm %s %s %dx%dx%dx%d (offset %g)\n", dtype_name(dt), nhwc ? "nhwc" : "nchw", s.n,
           s.c, s.h, s.w, offset);
    size_t nx = bn_numel(&s);
    float *x = bn_input(&s, offset, 1.0f);
    round_to(dt, x, nx);
    float *dy = random_values(dt, nx, -1, 1);
    float *gamma = random_floats(s.c, 0.5f, 1.5f), *beta = random_floats(s.c, -1, 1);
    float *rmean0 = random_floats(s.c, -1, 1), *rvar0 = random_floats(s.c, 0.5f, 2);
    const float momentum = 0.1f;
    double tol_y = tol_for(dt, 1e-5), tol_stats = 1e-5;

    BatchNormCuda bn;
    batchnorm_cuda_init(&bn, g.cudnn, &s, dt, nhwc);
    void *d_x = dev_tensor(dt, nhwc, x, &s), *d_dy = dev_tensor(dt, nhwc, dy, &s);
    void *d_y = dev_elements(dt, nx), *d_dx = dev_elements(dt, nx);
    float *d_gamma = dev_floats_from(gamma, s.c), *d_beta = dev_floats_from(beta, s.c);
    float *d_rmean = dev_floats_from(rmean0, s.c), *d_rvar = dev_floats_from(rvar0, s.c);
    float *d_smean = dev_bytes(s.c * sizeof(float)), *d_sinv = dev_bytes(s.c * sizeof(float));

    for (int relu = 0; relu < 2; relu++) {
        const char *tag = relu ? "bn+relu" : "bn";
        char what[96];
        /* ---- forward, training ---- */
        float *y = host_floats(nx), *smean = host_floats(s.c), *sinv = host_floats(s.c);
        float *rmean = copy_floats(rmean0, s.c), *rvar = copy_floats(rvar0, s.c);
        if (relu)
            batchnorm_relu_forward_train_cpu(&s, x, gamma, beta, momentum, BN_EPS, rmean, rvar, smean, sinv, y);
        else
            batchnorm_forward_train_cpu(&s, x, gamma, beta, momentum, BN_EPS, rmean, rvar, smean, sinv, y);
        upload(d_rmean, rmean0, s.c * sizeof(float));
        upload(d_rvar, rvar0, s.c * sizeof(float));
        poison(d_y, dt, nx);
        poison(d_smean, DTYPE_F32, s.c);
        poison(d_sinv, DTYPE_F32, s.c);
        if (relu)
            batchnorm_relu_forward_train_cuda(&bn, g.cudnn, d_x, d_gamma, d_beta, momentum, BN_EPS, d_rmean,
                                              d_rvar, d_smean, d_sinv, d_y, g.compute);
        else
            batchnorm_forward_train_cuda(&bn, g.cudnn, d_x, d_gamma, d_beta, momentum, BN_EPS, d_rmean,
                                         d_rvar, d_smean, d_sinv, d_y, g.compute);
        float *gy = download_tensor(dt, nhwc, d_y, &s);
        float *gsmean = download_floats(d_smean, s.c), *gsinv = download_floats(d_sinv, s.c);
        float *grmean = download_floats(d_rmean, s.c), *grvar = download_floats(d_rvar, s.c);
        snprintf(what, sizeof what, "%s train y", tag);
        check_rel_dt(what, dt, gy, y, nx, tol_y);
        check_rel_dt("bn save_mean", dt, gsmean, smean, s.c, tol_stats);
        check_rel_dt("bn save_invstd", dt, gsinv, sinv, s.c, tol_stats);
        check_rel_dt("bn running_mean", dt, grmean, rmean, s.c, tol_stats);
        check_rel_dt("bn running_var", dt, grvar, rvar, s.c, tol_stats);

        /* the same bits again; momentum 0 leaves the running statistics alone */
        poison(d_y, dt, nx);
        if (relu)
            batchnorm_relu_forward_train_cuda(&bn, g.cudnn, d_x, d_gamma, d_beta, 0.0f, BN_EPS, d_rmean,
                                              d_rvar, d_smean, d_sinv, d_y, g.compute);
        else
            batchnorm_forward_train_cuda(&bn, g.cudnn, d_x, d_gamma, d_beta, 0.0f, BN_EPS, d_rmean,
                                         d_rvar, d_smean, d_sinv, d_y, g.compute);
        float *gy2 = download_tensor(dt, nhwc, d_y, &s), *gsinv2 = download_floats(d_sinv, s.c);
        float *grmean2 = download_floats(d_rmean, s.c), *grvar2 = download_floats(d_rvar, s.c);
        CHECK_MSG(same_bits(gy, gy2, nx) && same_bits(gsinv, gsinv2, s.c),
                  "%s %s forward is not reproducible", dtype_name(dt), tag);
        CHECK_MSG(same_bits(grmean, grmean2, s.c) && same_bits(grvar, grvar2, s.c),
                  "%s %s: momentum 0 changed the running statistics", dtype_name(dt), tag);

        /* ---- forward, eval (from the running statistics just computed) ---- */
        float *ye = host_floats(nx);
        if (relu) batchnorm_relu_forward_eval_cpu(&s, x, gamma, beta, grmean, grvar, BN_EPS, ye);
        else batchnorm_forward_eval_cpu(&s, x, gamma, beta, grmean, grvar, BN_EPS, ye);
        poison(d_y, dt, nx);
        if (relu)
            batchnorm_relu_forward_eval_cuda(&bn, g.cudnn, d_x, d_gamma, d_beta, d_rmean, d_rvar, BN_EPS,
                                             d_y, g.compute);
        else
            batchnorm_forward_eval_cuda(&bn, g.cudnn, d_x, d_gamma, d_beta, d_rmean, d_rvar, BN_EPS, d_y,
                                        g.compute);
        float *gye = download_tensor(dt, nhwc, d_y, &s);
        snprintf(what, sizeof what, "%s eval y", tag);
        check_rel_dt(what, dt, gye, ye, nx, tol_y);

        /* ---- backward: the CPU's saved statistics on both sides; for the fused
         * op, the device's y as the mask on both sides ---- */
        upload(d_smean, smean, s.c * sizeof(float));
        upload(d_sinv, sinv, s.c * sizeof(float));
        if (relu) {
            void *d_ymask = dev_tensor(dt, nhwc, gy, &s);
            CUDA_CHECK(cudaMemcpyAsync(d_y, d_ymask, nx * dtype_size(dt), cudaMemcpyDeviceToDevice, g.compute));
            CUDA_CHECK(cudaStreamSynchronize(g.compute));
            CUDA_CHECK(cudaFree(d_ymask));
        }
        float *dx = host_floats(nx), *dgamma0 = random_values(dt, s.c, -1, 1), *dbeta0 = random_values(dt, s.c, -1, 1);
        float *dgamma = copy_floats(dgamma0, s.c), *dbeta = copy_floats(dbeta0, s.c);
        if (relu) batchnorm_relu_backward_cpu(&s, x, gy, dy, gamma, smean, sinv, dx, 0, dgamma, dbeta);
        else batchnorm_backward_cpu(&s, x, dy, gamma, smean, sinv, dx, 0, dgamma, dbeta);
        /* accumulator starts about the size of what is added, so overwriting shows */
        float *dx_old = random_values(dt, nx, -(float)rms(dx, nx), (float)rms(dx, nx));
        float *dx_acc = host_floats(nx);
        for (size_t i = 0; i < nx; i++) dx_acc[i] = dx_old[i] + dx[i];
        float *dgamma_acc = host_floats(s.c), *dbeta_acc = host_floats(s.c);
        for (int c = 0; c < s.c; c++) {
            dgamma_acc[c] = dgamma[c] + (dgamma[c] - dgamma0[c]);
            dbeta_acc[c] = dbeta[c] + (dbeta[c] - dbeta0[c]);
        }
        void *d_dgamma = dev_values(dt, dgamma0, s.c), *d_dbeta = dev_values(dt, dbeta0, s.c);
        poison(d_dx, dt, nx);
        bn_backward(&bn, relu, d_x, d_y, d_dy, d_gamma, d_smean, d_sinv, d_dx, 0, d_dgamma,
                    d_dbeta, dt);
        float *gdx = download_tensor(dt, nhwc, d_dx, &s);
        float *gdgamma = download_values(dt, d_dgamma, s.c), *gdbeta = download_values(dt, d_dbeta, s.c);
        snprintf(what, sizeof what, "%s dx", tag);
        check_rel_dt(what, dt, gdx, dx, nx, tol_for(dt, 2e-5));
        snprintf(what, sizeof what, "%s dgamma (added to random)", tag);
        check_rel_dt(what, dt, gdgamma, dgamma, s.c, tol_for(dt, 1e-5));
        snprintf(what, sizeof what, "%s dbeta (added to random)", tag);
        check_rel_dt(what, dt, gdbeta, dbeta, s.c, tol_for(dt, 1e-5));

        /* accumulate_dx onto random dx; dgamma/dbeta added a second time */
        void *d_old = dev_tensor(dt, nhwc, dx_old, &s);
        CUDA_CHECK(cudaMemcpyAsync(d_dx, d_old, nx * dtype_size(dt), cudaMemcpyDeviceToDevice, g.compute));
        bn_backward(&bn, relu, d_x, d_y, d_dy, d_gamma, d_smean, d_sinv, d_dx, 1, d_dgamma,
                    d_dbeta, dt);
        float *gdx_acc = download_tensor(dt, nhwc, d_dx, &s);
        float *gdgamma2 = download_values(dt, d_dgamma, s.c), *gdbeta2 = download_values(dt, d_dbeta, s.c);
        snprintf(what, sizeof what, "%s dx (accumulate_dx onto random)", tag);
        check_rel_dt(what, dt, gdx_acc, dx_acc, nx, tol_for(dt, 2e-5));
        snprintf(what, sizeof what, "%s dgamma (added twice)", tag);
        check_rel_dt(what, dt, gdgamma2, dgamma_acc, s.c, tol_for(dt, 1e-5));
        snprintf(what, sizeof what, "%s dbeta (added twice)", tag);
        check_rel_dt(what, dt, gdbeta2, dbeta_acc, s.c, tol_for(dt, 1e-5));

        /* dx NULL: the parameter gradients alone, the same bits as with dx */
        upload_values(dt, d_dgamma, dgamma0, s.c);
        upload_values(dt, d_dbeta, dbeta0, s.c);
        bn_backward(&bn, relu, d_x, d_y, d_dy, d_gamma, d_smean, d_sinv, NULL, 0, d_dgamma,
                    d_dbeta, dt);
        float *gdgamma3 = download_values(dt, d_dgamma, s.c), *gdbeta3 = download_values(dt, d_dbeta, s.c);
        CHECK_MSG(same_bits(gdgamma3, gdgamma, s.c) && same_bits(gdbeta3, gdbeta, s.c),
                  "%s %s backward: dgamma/dbeta differ with dx NULL or between runs", dtype_name(dt), tag);

        void *h[] = {y, smean, sinv, rmean, rvar, gy, gsmean, gsinv, grmean, grvar, gy2, gsinv2, grmean2,
                     grvar2, ye, gye, dx, dgamma0, dbeta0, dgamma, dbeta, dx_old, dx_acc, dgamma_acc,
                     dbeta_acc, gdx, gdgamma, gdbeta, gdx_acc, gdgamma2, gdbeta2, gdgamma3, gdbeta3};
        free_all(h, COUNT(h));
        void *d[] = {d_dgamma, d_dbeta, d_old};
        cuda_free_all(d, COUNT(d));
    }
    batchnorm_cuda_destroy(&bn);
    void *h[] = {x, dy, gamma, beta, rmean0, rvar0};
    free_all(h, COUNT(h));
    void *d[] = {d_x, d_dy, d_y, d_dx, d_gamma, d_beta, d_rmean, d_rvar, d_smean, d_sinv};
    cuda_free_all(d, COUNT(d));
}

/* The parameter gradients into f32 buffers while the data is half (a model
 * keeping fp32 gradients): the same sums, less rounding. */
static void test_bn_gpu_grad_f32(DType dt, int nhwc, BatchNormShape s) {
    printf("batchnorm %s %s, dgamma/dbeta in f32\n", dtype_name(dt), nhwc ? "nhwc" : "nchw");
    size_t nx = bn_numel(&s);
    float *x = bn_input(&s, 1.0f, 1.0f), *dy = random_values(dt, nx, -1, 1);
    round_to(dt, x, nx);
    float *gamma = random_floats(s.c, 0.5f, 1.5f), *beta = random_floats(s.c, -1, 1);
    float *smean = host_floats(s.c), *sinv = host_floats(s.c), *y = host_floats(nx);
    batchnorm_forward_train_cpu(&s, x, gamma, beta, 0.0f, BN_EPS, NULL, NULL, smean, sinv, y);
    float *dgamma = random_floats(s.c, -1, 1), *dbeta = random_floats(s.c, -1, 1);
    float *d_dgamma = dev_floats_from(dgamma, s.c), *d_dbeta = dev_floats_from(dbeta, s.c);
    batchnorm_backward_cpu(&s, x, dy, gamma, smean, sinv, NULL, 0, dgamma, dbeta);
    BatchNormCuda bn;
    batchnorm_cuda_init(&bn, g.cudnn, &s, dt, nhwc);
    void *d_x = dev_tensor(dt, nhwc, x, &s), *d_dy = dev_tensor(dt, nhwc, dy, &s);
    float *d_gamma = dev_floats_from(gamma, s.c), *d_smean = dev_floats_from(smean, s.c);
    float *d_sinv = dev_floats_from(sinv, s.c);
    batchnorm_backward_cuda(&bn, g.cudnn, d_x, d_dy, d_gamma, d_smean, d_sinv, NULL, 0, d_dgamma, d_dbeta,
                            DTYPE_F32, g.compute);
    float *gdgamma = download_floats(d_dgamma, s.c), *gdbeta = download_floats(d_dbeta, s.c);
    check_rel_dt("bn dgamma into f32", dt, gdgamma, dgamma, s.c, 1e-5);
    check_rel_dt("bn dbeta into f32", dt, gdbeta, dbeta, s.c, 1e-5);
    batchnorm_cuda_destroy(&bn);
    void *h[] = {x, dy, gamma, beta, smean, sinv, y, dgamma, dbeta, gdgamma, gdbeta};
    free_all(h, COUNT(h));
    void *d[] = {d_dgamma, d_dbeta, d_x, d_dy, d_gamma, d_smean, d_sinv};
    cuda_free_all(d, COUNT(d));
}

/* Two layers sharing one scratch buffer (init_scratch, filled with garbage
 * first) give the bits of layers with their own; then a forward + backward
 * captured as a CUDA graph gives the bits of the eager calls. */
static void test_bn_gpu_scratch_and_graph(DType dt, int nhwc) {
    printf("batchnorm %s %s: shared scratch, CUDA graph\n", dtype_name(dt), nhwc ? "nhwc" : "nchw");
    BatchNormShape sa = {16, 32, 16, 16}, sb = {16, 64, 8, 8};
    size_t na = bn_numel(&sa), nb = bn_numel(&sb);
    size_t bytes = batchnorm_cuda_scratch_bytes(&sa, nhwc);
    size_t bytes_b = batchnorm_cuda_scratch_bytes(&sb, nhwc);
    if (bytes_b > bytes) bytes = bytes_b;
    void *shared = dev_bytes(bytes);
    CUDA_CHECK(cudaMemset(shared, 0xa5, bytes));
    BatchNormCuda own_a, own_b, sh_a, sh_b;
    batchnorm_cuda_init(&own_a, g.cudnn, &sa, dt, nhwc);
    batchnorm_cuda_init(&own_b, g.cudnn, &sb, dt, nhwc);
    batchnorm_cuda_init_scratch(&sh_a, &sa, dt, nhwc, shared);
    batchnorm_cuda_init_scratch(&sh_b, &sb, dt, nhwc, shared);
    float *xa = bn_input(&sa, 1, 1), *xb = bn_input(&sb, 1, 1);
    float *ga = random_floats(sa.c, 0.5f, 1.5f), *ba = random_floats(sa.c, -1, 1);
    float *gb = random_floats(sb.c, 0.5f, 1.5f), *bb = random_floats(sb.c, -1, 1);
    void *d_xa = dev_values(dt, xa, na), *d_xb = dev_values(dt, xb, nb);
    void *d_ya = dev_elements(dt, na), *d_yb = dev_elements(dt, nb);
    void *d_dxa = dev_elements(dt, na), *d_dxb = dev_elements(dt, nb);
    float *d_ga = dev_floats_from(ga, sa.c), *d_ba = dev_floats_from(ba, sa.c);
    float *d_gb = dev_floats_from(gb, sb.c), *d_bb = dev_floats_from(bb, sb.c);
    float *d_stats = dev_bytes(4 * (sa.c + sb.c) * sizeof(float)); /* mean, invstd, running mean, var */
    float *ma = d_stats, *ia = ma + sa.c, *rma = ia + sa.c, *rva = rma + sa.c;
    float *mb = rva + sa.c, *ib = mb + sb.c, *rmb = ib + sb.c, *rvb = rmb + sb.c;
    void *d_grad = dev_elements(dt, 2 * (sa.c + sb.c));
    char *grad = d_grad;
    size_t es = dtype_size(dt);
    void *dga = grad, *dba = grad + sa.c * es, *dgb = grad + 2 * sa.c * es, *dbb = grad + (2 * sa.c + sb.c) * es;
    size_t nstats = 4 * (size_t)(sa.c + sb.c), ngrad = 2 * (size_t)(sa.c + sb.c);
    float *ones = host_floats(nstats);
    for (size_t i = 0; i < nstats; i++) ones[i] = 1.0f;

    /* layer a forward, layer b forward, b backward (dy = its own y), a backward */
    float *results[3][4]; /* [own, shared, graph][ya, yb, dxa, stats+grads] */
    for (int run = 0; run < 3; run++) {
        upload(d_stats, ones, nstats * sizeof(float));
        CUDA_CHECK(cudaMemsetAsync(d_grad, 0, ngrad * es, g.compute));
        poison(d_ya, dt, na), poison(d_yb, dt, nb), poison(d_dxa, dt, na), poison(d_dxb, dt, nb);
        const BatchNormCuda *a = run == 0 ? &own_a : &sh_a, *b = run == 0 ? &own_b : &sh_b;
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        if (run == 2) CUDA_CHECK(cudaStreamBeginCapture(g.compute, cudaStreamCaptureModeGlobal));
        batchnorm_relu_forward_train_cuda(a, g.cudnn, d_xa, d_ga, d_ba, 0.1f, BN_EPS, rma, rva, ma, ia, d_ya, g.compute);
        batchnorm_forward_train_cuda(b, g.cudnn, d_xb, d_gb, d_bb, 0.1f, BN_EPS, rmb, rvb, mb, ib, d_yb, g.compute);
        batchnorm_backward_cuda(b, g.cudnn, d_xb, d_yb, d_gb, mb, ib, d_dxb, 0, dgb, dbb, dt, g.compute);
        batchnorm_relu_backward_cuda(a, g.cudnn, d_xa, d_ya, d_ya, d_ga, ma, ia, d_dxa, 0, dga, dba, dt, g.compute);
        if (run == 2) {
            CUDA_CHECK(cudaStreamEndCapture(g.compute, &graph));
            CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
        }
        results[run][0] = download_values(dt, d_ya, na);
        results[run][1] = download_values(dt, d_yb, nb);
        results[run][2] = download_values(dt, d_dxa, na);
        float *stats = download_floats(d_stats, nstats), *grads = download_values(dt, d_grad, ngrad);
        results[run][3] = host_floats(nstats + ngrad);
        memcpy(results[run][3], stats, nstats * sizeof(float));
        memcpy(results[run][3] + nstats, grads, ngrad * sizeof(float));
        free(stats), free(grads);
        if (run == 2) {
            CUDA_CHECK(cudaGraphExecDestroy(exec));
            CUDA_CHECK(cudaGraphDestroy(graph));
        }
    }
    size_t sizes[4] = {na, nb, na, nstats + ngrad};
    const char *names[4] = {"y of layer a", "y of layer b", "dx of layer a", "statistics and gradients"};
    for (int k = 0; k < 4; k++) {
        double err = test_rel_error(results[0][k], results[0][k], sizes[k]);
        CHECK_MSG(err == 0, "bn %s: %s has NaN (not written)", dtype_name(dt), names[k]);
        CHECK_MSG(same_bits(results[1][k], results[0][k], sizes[k]),
                  "bn %s %s: %s differs with a shared scratch", dtype_name(dt), nhwc ? "nhwc" : "nchw", names[k]);
        CHECK_MSG(same_bits(results[2][k], results[0][k], sizes[k]),
                  "bn %s %s: %s differs when run from a CUDA graph", dtype_name(dt), nhwc ? "nhwc" : "nchw",
                  names[k]);
    }
    for (int run = 0; run < 3; run++)
        for (int k = 0; k < 4; k++) free(results[run][k]);
    batchnorm_cuda_destroy(&own_a), batchnorm_cuda_destroy(&own_b);
    batchnorm_cuda_destroy(&sh_a), batchnorm_cuda_destroy(&sh_b);
    void *h[] = {xa, xb, ga, ba, gb, bb, ones};
    free_all(h, COUNT(h));
    void *d[] = {shared, d_xa, d_xb, d_ya, d_yb, d_dxa, d_dxb, d_ga, d_ba, d_gb, d_bb, d_stats, d_grad};
    cuda_free_all(d, COUNT(d));
}

/* ---- GPU: synchronized batch norm ------------------------------------------------- */

/* One rank's device buffers for one layer: x, the ReLU mask and dy in the
 * data type and layout under test; the gradients of the parameters in it too. */
typedef struct {
    void *x, *y, *mask, *dy, *dx, *dgamma, *dbeta;
    float *mean, *invstd, *rmean, *rvar;
} BnDev;

static BnDev bn_dev_new(DType dt, int nhwc, const BatchNormShape *s, const float *x, const float *mask,
                        const float *dy) {
    size_t nx = bn_numel(s);
    BnDev d = {dev_tensor(dt, nhwc, x, s), dev_elements(dt, nx), dev_tensor(dt, nhwc, mask, s),
               dev_tensor(dt, nhwc, dy, s), dev_elements(dt, nx), dev_elements(dt, s->c),
               dev_elements(dt, s->c), dev_bytes(s->c * sizeof(float)), dev_bytes(s->c * sizeof(float)),
               dev_bytes(s->c * sizeof(float)), dev_bytes(s->c * sizeof(float))};
    return d;
}

static void bn_dev_free(BnDev *d) {
    void *p[] = {d->x, d->y, d->mask, d->dy, d->dx, d->dgamma, d->dbeta, d->mean, d->invstd, d->rmean, d->rvar};
    cuda_free_all(p, COUNT(p));
}

/* Running statistics back to their start, outputs poisoned, gradients zeroed. */
static void bn_dev_reset(BnDev *d, DType dt, const BatchNormShape *s, const float *rmean0, const float *rvar0) {
    upload(d->rmean, rmean0, s->c * sizeof(float));
    upload(d->rvar, rvar0, s->c * sizeof(float));
    poison(d->y, dt, bn_numel(s)), poison(d->dx, dt, bn_numel(s));
    CUDA_CHECK(cudaMemsetAsync(d->dgamma, 0, s->c * dtype_size(dt), g.compute));
    CUDA_CHECK(cudaMemsetAsync(d->dbeta, 0, s->c * dtype_size(dt), g.compute));
}

static void gpu_bn_forward(const BatchNormCuda *bn, const float *gamma, const float *beta, int relu,
                           BnAllreduce reduce, void *ctx, BnDev *d) {
    if (reduce)
        batchnorm_forward_train_sync_cuda(bn, g.cudnn, d->x, gamma, beta, 0.1f, BN_EPS, d->rmean, d->rvar,
                                          d->mean, d->invstd, d->y, g.compute, reduce, ctx, relu);
    else if (relu)
        batchnorm_relu_forward_train_cuda(bn, g.cudnn, d->x, gamma, beta, 0.1f, BN_EPS, d->rmean, d->rvar,
                                          d->mean, d->invstd, d->y, g.compute);
    else
        batchnorm_forward_train_cuda(bn, g.cudnn, d->x, gamma, beta, 0.1f, BN_EPS, d->rmean, d->rvar, d->mean,
                                     d->invstd, d->y, g.compute);
}

static void gpu_bn_backward(const BatchNormCuda *bn, const float *gamma, int relu, BnAllreduce reduce,
                            void *ctx, BnDev *d) {
    if (reduce)
        batchnorm_backward_sync_cuda(bn, g.cudnn, d->x, d->mask, d->dy, gamma, d->mean, d->invstd, d->dx, 0,
                                     d->dgamma, d->dbeta, bn->dtype, g.compute, reduce, ctx, relu);
    else if (relu)
        batchnorm_relu_backward_cuda(bn, g.cudnn, d->x, d->mask, d->dy, gamma, d->mean, d->invstd, d->dx, 0,
                                     d->dgamma, d->dbeta, bn->dtype, g.compute);
    else
        batchnorm_backward_cuda(bn, g.cudnn, d->x, d->dy, gamma, d->mean, d->invstd, d->dx, 0, d->dgamma,
                                d->dbeta, bn->dtype, g.compute);
}

/* Everything a layer's forward and backward wrote, downloaded (NCHW). */
static BnOut bn_dev_download(DType dt, int nhwc, const BatchNormShape *s, const BnDev *d) {
    BnOut o = {download_tensor(dt, nhwc, d->y, s), download_floats(d->mean, s->c),
               download_floats(d->invstd, s->c), download_floats(d->rmean, s->c), download_floats(d->rvar, s->c),
               download_tensor(dt, nhwc, d->dx, s), download_values(dt, d->dgamma, s->c),
               download_values(dt, d->dbeta, s->c)};
    return o;
}

static int bn_out_same_bits(const BnOut *a, const BnOut *b, size_t nx, int c) {
    return same_bits(a->y, b->y, nx) && same_bits(a->mean, b->mean, c) && same_bits(a->invstd, b->invstd, c) &&
           same_bits(a->rmean, b->rmean, c) && same_bits(a->rvar, b->rvar, c) && same_bits(a->dx, b->dx, nx) &&
           same_bits(a->dgamma, b->dgamma, c) && same_bits(a->dbeta, b->dbeta, c);
}

/* A reduce a CUDA graph can capture: the sums go to a side buffer and back on
 * the stream, poisoned in between. */
static void round_trip_allreduce(void *ctx, double *sums, int n, cudaStream_t stream) {
    size_t bytes = (size_t)n * sizeof(double);
    CUDA_CHECK(cudaMemcpyAsync(ctx, sums, bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemsetAsync(sums, 0xff, bytes, stream));
    CUDA_CHECK(cudaMemcpyAsync(sums, ctx, bytes, cudaMemcpyDeviceToDevice, stream));
}

/* test_bn_sync_cpu's checks on the device: two ranks (FakeRanks on device
 * sums), each with half of the batch, against the CPU's plain run on the whole
 * batch; one process against the plain CUDA calls (backward to the bit, from
 * the same saved statistics). Then a forward and backward captured as a CUDA
 * graph, with a reduce working on the stream, give the bits of the eager calls. */
static void test_bn_sync_gpu(DType dt, int nhwc, BatchNormShape s, float offset) {
    printf("batchnorm %s %s synchronized %dx%dx%dx%d (offset %g)\n", dtype_name(dt), nhwc ? "nhwc" : "nchw", s.n,
           s.c, s.h, s.w, offset);
    BatchNormShape h = s;
    h.n = s.n / 2;
    size_t nx = bn_numel(&s), nh = bn_numel(&h);
    float *x = bn_input(&s, offset, 1.0f), *dy = random_values(dt, nx, -1, 1), *dy2 = host_floats(nx);
    round_to(dt, x, nx);
    for (size_t i = 0; i < nx; i++) dy2[i] = 2.0f * dy[i]; /* exact in every type */
    float *gamma = random_floats(s.c, 0.5f, 1.5f), *beta = random_floats(s.c, -1, 1);
    float *rmean0 = random_floats(s.c, -1, 1), *rvar0 = random_floats(s.c, 0.5f, 2);
    float *d_gamma = dev_floats_from(gamma, s.c), *d_beta = dev_floats_from(beta, s.c);
    double *d_side = dev_bytes(3 * s.c * sizeof(double));
    BatchNormCuda bn_half, bn_whole;
    batchnorm_cuda_init(&bn_half, g.cudnn, &h, dt, nhwc);
    batchnorm_cuda_init(&bn_whole, g.cudnn, &s, dt, nhwc);
    char what[96];

    for (int relu = 0; relu < 2; relu++) {
        const char *tag = relu ? "sync bn+relu" : "sync bn";
        /* the CPU on the whole batch; the mask is the CPU's y in the type, on both sides */
        BnOut whole = bn_out_new(nx, s.c, rmean0, rvar0);
        cpu_bn_forward(&s, x, gamma, beta, 1, relu, NULL, NULL, &whole);
        float *mask = copy_floats(whole.y, nx);
        round_to(dt, mask, nx);
        cpu_bn_backward(&s, x, mask, dy, gamma, relu, NULL, NULL, &whole);

        /* two ranks */
        BnDev r[2];
        for (int k = 0; k < 2; k++) r[k] = bn_dev_new(dt, nhwc, &h, x + k * nh, mask + k * nh, dy2 + k * nh);
        FakeRanks f = {{host_doubles(3 * s.c), host_doubles(3 * s.c)}, 3 * s.c, 0, 0, 1};
        for (f.pass = 0; f.pass < 2; f.pass++)
            for (f.rank = 0; f.rank < 2; f.rank++) {
                bn_dev_reset(&r[f.rank], dt, &h, rmean0, rvar0);
                gpu_bn_forward(&bn_half, d_gamma, d_beta, relu, fake_allreduce, &f, &r[f.rank]);
            }
        for (f.pass = 0; f.pass < 2; f.pass++)
            for (f.rank = 0; f.rank < 2; f.rank++) {
                CUDA_CHECK(cudaMemsetAsync(r[f.rank].dgamma, 0, s.c * dtype_size(dt), g.compute));
                CUDA_CHECK(cudaMemsetAsync(r[f.rank].dbeta, 0, s.c * dtype_size(dt), g.compute));
                gpu_bn_backward(&bn_half, d_gamma, relu, fake_allreduce, &f, &r[f.rank]);
            }
        BnOut got[2] = {bn_dev_download(dt, nhwc, &h, &r[0]), bn_dev_download(dt, nhwc, &h, &r[1])};
        float *y2 = joined(got[0].y, got[1].y, nh), *dx2 = joined(got[0].dx, got[1].dx, nh);
        float *dgamma2 = host_floats(s.c), *dbeta2 = host_floats(s.c);
        for (size_t i = 0; i < nx; i++) dx2[i] /= 2;
        for (int c = 0; c < s.c; c++) {
            dgamma2[c] = (got[0].dgamma[c] + got[1].dgamma[c]) / 2;
            dbeta2[c] = (got[0].dbeta[c] + got[1].dbeta[c]) / 2;
        }
        snprintf(what, sizeof what, "%s, two ranks: y against the CPU's whole batch", tag);
        check_rel_dt(what, dt, y2, whole.y, nx, tol_for(dt, 1e-5));
        check_rel_dt("  save_mean", dt, got[0].mean, whole.mean, s.c, 1e-5);
        check_rel_dt("  save_invstd", dt, got[0].invstd, whole.invstd, s.c, 1e-5);
        check_rel_dt("  running_mean", dt, got[0].rmean, whole.rmean, s.c, 1e-5);
        check_rel_dt("  running_var", dt, got[0].rvar, whole.rvar, s.c, 1e-5);
        check_dx_scaled("  dx / 2", dt, &s, dx2, whole.dx, dy, gamma, whole.invstd, tol_for(dt, 2e-5));
        check_rel_dt("  dgamma averaged over the ranks", dt, dgamma2, whole.dgamma, s.c, tol_for(dt, 1e-5));
        check_rel_dt("  dbeta averaged over the ranks", dt, dbeta2, whole.dbeta, s.c, tol_for(dt, 1e-5));
        CHECK_MSG(same_bits(got[0].mean, got[1].mean, s.c) && same_bits(got[0].invstd, got[1].invstd, s.c) &&
                      same_bits(got[0].rmean, got[1].rmean, s.c) && same_bits(got[0].rvar, got[1].rvar, s.c),
                  "%s %s: the two ranks' statistics differ", dtype_name(dt), tag);

        /* one process: the plain calls, then the synchronized ones from the plain forward's saved statistics */
        BnDev plain = bn_dev_new(dt, nhwc, &s, x, mask, dy), solo = bn_dev_new(dt, nhwc, &s, x, mask, dy);
        int calls = 0;
        bn_dev_reset(&plain, dt, &s, rmean0, rvar0);
        bn_dev_reset(&solo, dt, &s, rmean0, rvar0);
        gpu_bn_forward(&bn_whole, d_gamma, d_beta, relu, NULL, NULL, &plain);
        gpu_bn_forward(&bn_whole, d_gamma, d_beta, relu, solo_allreduce, &calls, &solo);
        BnOut fwd = bn_dev_download(dt, nhwc, &s, &solo);
        CUDA_CHECK(cudaMemcpyAsync(solo.mean, plain.mean, s.c * sizeof(float), cudaMemcpyDeviceToDevice, g.compute));
        CUDA_CHECK(cudaMemcpyAsync(solo.invstd, plain.invstd, s.c * sizeof(float), cudaMemcpyDeviceToDevice,
                                   g.compute));
        gpu_bn_backward(&bn_whole, d_gamma, relu, NULL, NULL, &plain);
        gpu_bn_backward(&bn_whole, d_gamma, relu, solo_allreduce, &calls, &solo);
        BnOut want = bn_dev_download(dt, nhwc, &s, &plain), one = bn_dev_download(dt, nhwc, &s, &solo);
        snprintf(what, sizeof what, "%s, one process: y against the plain call", tag);
        check_rel_dt(what, dt, fwd.y, want.y, nx, tol_for(dt, 1e-5));
        check_rel_dt("  save_mean", dt, fwd.mean, want.mean, s.c, 1e-5);
        check_rel_dt("  save_invstd", dt, fwd.invstd, want.invstd, s.c, 1e-5);
        check_rel_dt("  running_var", dt, fwd.rvar, want.rvar, s.c, 1e-5);
        CHECK_MSG(same_bits(one.dx, want.dx, nx) && same_bits(one.dgamma, want.dgamma, s.c) &&
                      same_bits(one.dbeta, want.dbeta, s.c),
                  "%s %s %s, one process: backward differs from the plain one", dtype_name(dt),
                  nhwc ? "nhwc" : "nchw", tag);
        CHECK_MSG(calls == 2, "%s: %d reduce calls, want 2", tag, calls);

        /* eager, then the same from a CUDA graph */
        BnOut run[2];
        for (int graph = 0; graph < 2; graph++) {
            cudaGraph_t gr = NULL;
            cudaGraphExec_t exec = NULL;
            bn_dev_reset(&solo, dt, &s, rmean0, rvar0);
            if (graph) CUDA_CHECK(cudaStreamBeginCapture(g.compute, cudaStreamCaptureModeGlobal));
            gpu_bn_forward(&bn_whole, d_gamma, d_beta, relu, round_trip_allreduce, d_side, &solo);
            gpu_bn_backward(&bn_whole, d_gamma, relu, round_trip_allreduce, d_side, &solo);
            if (graph) {
                CUDA_CHECK(cudaStreamEndCapture(g.compute, &gr));
                CUDA_CHECK(cudaGraphInstantiate(&exec, gr, 0));
                CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
            }
            run[graph] = bn_dev_download(dt, nhwc, &s, &solo);
            if (graph) {
                CUDA_CHECK(cudaGraphExecDestroy(exec));
                CUDA_CHECK(cudaGraphDestroy(gr));
            }
        }
        CHECK_MSG(test_rel_error(run[0].y, run[0].y, nx) == 0 && test_rel_error(run[0].dx, run[0].dx, nx) == 0,
                  "%s %s: NaN in y or dx (not written)", dtype_name(dt), tag);
        CHECK_MSG(bn_out_same_bits(&run[1], &run[0], nx, s.c), "%s %s %s: a CUDA graph gives other bits",
                  dtype_name(dt), nhwc ? "nhwc" : "nchw", tag);

        BnOut *outs[] = {&whole, &got[0], &got[1], &fwd, &want, &one, &run[0], &run[1]};
        for (size_t i = 0; i < COUNT(outs); i++) bn_out_free(outs[i]);
        bn_dev_free(&r[0]), bn_dev_free(&r[1]), bn_dev_free(&plain), bn_dev_free(&solo);
        void *p[] = {mask, f.recorded[0], f.recorded[1], y2, dx2, dgamma2, dbeta2};
        free_all(p, COUNT(p));
    }
    batchnorm_cuda_destroy(&bn_half), batchnorm_cuda_destroy(&bn_whole);
    void *p[] = {x, dy, dy2, gamma, beta, rmean0, rvar0};
    free_all(p, COUNT(p));
    void *d[] = {d_gamma, d_beta, d_side};
    cuda_free_all(d, COUNT(d));
}

/* Bandwidth of forward (train) and backward at a ResNet size, not asserted:
 * the bytes each pass must move over the time, on an H100 ~3.3 TB/s at most. */
static void report_bn_speed(DType dt, int nhwc, BatchNormShape s) {
    size_t nx = bn_numel(&s), bytes = nx * dtype_size(dt);
    BatchNormCuda bn;
    batchnorm_cuda_init(&bn, g.cudnn, &s, dt, nhwc);
    void *d_x = dev_elements(dt, nx), *d_y = dev_elements(dt, nx), *d_dx = dev_elements(dt, nx);
    float *ones = host_floats(s.c);
    for (int c = 0; c < s.c; c++) ones[c] = 1.0f;
    float *x = random_values(dt, nx, -1, 1);
    upload_values(dt, d_x, x, nx);
    float *d_p = dev_bytes(8 * s.c * sizeof(float));
    for (int i = 0; i < 8; i++) upload(d_p + i * s.c, ones, s.c * sizeof(float));
    void *d_grad = dev_elements(dt, 2 * s.c);
    CUDA_CHECK(cudaMemset(d_grad, 0, 2 * s.c * dtype_size(dt)));
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    const int iters = 20;
    float ms[4];
    for (int which = 0; which < 4; which++) {
        for (int it = -3; it < iters; it++) {
            if (it == 0) CUDA_CHECK(cudaEventRecord(t0, g.compute));
            if (which == 0)
                batchnorm_forward_train_cuda(&bn, g.cudnn, d_x, d_p, d_p + s.c, 0.1f, BN_EPS, d_p + 2 * s.c,
                                             d_p + 3 * s.c, d_p + 4 * s.c, d_p + 5 * s.c, d_y, g.compute);
            else if (which == 1)
                batchnorm_relu_forward_train_cuda(&bn, g.cudnn, d_x, d_p, d_p + s.c, 0.1f, BN_EPS, d_p + 2 * s.c,
                                                  d_p + 3 * s.c, d_p + 4 * s.c, d_p + 5 * s.c, d_y, g.compute);
            else if (which == 2)
                batchnorm_backward_cuda(&bn, g.cudnn, d_x, d_y, d_p, d_p + 6 * s.c, d_p + 7 * s.c, d_dx, 0, d_grad,
                                        (char *)d_grad + s.c * dtype_size(dt), dt, g.compute);
            else
                batchnorm_relu_backward_cuda(&bn, g.cudnn, d_x, d_y, d_y, d_p, d_p + 6 * s.c, d_p + 7 * s.c, d_dx,
                                             0, d_grad, (char *)d_grad + s.c * dtype_size(dt), dt, g.compute);
        }
        CUDA_CHECK(cudaEventRecord(t1, g.compute));
        CUDA_CHECK(cudaEventSynchronize(t1));
        CUDA_CHECK(cudaEventElapsedTime(&ms[which], t0, t1));
        ms[which] /= iters;
    }
    /* forward: read x twice, write y; backward: read x, dy twice, write dx (+ y twice with relu) */
    double moved[4] = {3.0 * bytes, 3.0 * bytes, 5.0 * bytes, 7.0 * bytes};
    printf("  bn speed %s %s %dx%dx%dx%d: fwd %.3f ms (%.0f GB/s), fwd+relu %.3f ms (%.0f GB/s), "
           "bwd %.3f ms (%.0f GB/s), bwd+relu %.3f ms (%.0f GB/s)\n", dtype_name(dt), nhwc ? "nhwc" : "nchw",
           s.n, s.c, s.h, s.w, ms[0], moved[0] / ms[0] / 1e6, ms[1], moved[1] / ms[1] / 1e6, ms[2],
           moved[2] / ms[2] / 1e6, ms[3], moved[3] / ms[3] / 1e6);
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    batchnorm_cuda_destroy(&bn);
    free(ones), free(x);
    void *d[] = {d_x, d_y, d_dx, d_p, d_grad};
    cuda_free_all(d, COUNT(d));
}

/* ---- GPU: add, avgpool ------------------------------------------------------------ */

/* Whole buffers and a view one element in (not 16-byte aligned, the scalar path). */
static void test_add_gpu(DType dt, size_t n) {
    printf("add %s n=%zu\n", dtype_name(dt), n);
    float *a = random_values(dt, n, -1, 1), *b = random_values(dt, n, -1, 1);
    float *y = host_floats(n), *yr = host_floats(n), *acc = host_floats(n);
    add_forward_cpu(a, b, y, n);
    add_relu_forward_cpu(a, b, yr, n);
    memcpy(acc, a, n * sizeof(float));
    add_accumulate_cpu(acc, b, n);
    /* the sum of two values of dt is rounded once: the CPU's float sum rounded to dt */
    round_to(dt, y, n), round_to(dt, yr, n), round_to(dt, acc, n);
    void *d_a = dev_values(dt, a, n), *d_b = dev_values(dt, b, n), *d_y = dev_elements(dt, n);
    for (int offset = 0; offset < 2; offset++) {
        size_t m = n - offset, es = dtype_size(dt) * offset;
        const char *at = offset ? " (offset 1)" : "";
        char what[64];
        poison(d_y, dt, n);
        add_forward_cuda(dt, (char *)d_a + es, (char *)d_b + es, (char *)d_y + es, m, g.compute);
        float *gy = download_values(dt, d_y, n);
        snprintf(what, sizeof what, "add y%s", at);
        check_rel_dt(what, dt, gy + offset, y + offset, m, 0);
        poison(d_y, dt, n);
        add_relu_forward_cuda(dt, (char *)d_a + es, (char *)d_b + es, (char *)d_y + es, m, g.compute);
        float *gyr = download_values(dt, d_y, n);
        snprintf(what, sizeof what, "add+relu y%s", at);
        check_rel_dt(what, dt, gyr + offset, yr + offset, m, 0);
        /* accumulate into a copy of a, in place */
        upload_values(dt, d_y, a, n);
        add_accumulate_cuda(dt, (char *)d_y + es, (char *)d_b + es, m, g.compute);
        float *gacc = download_values(dt, d_y, n);
        snprintf(what, sizeof what, "add_accumulate dst%s", at);
        check_rel_dt(what, dt, gacc + offset, acc + offset, m, 0);
        free(gy), free(gyr), free(gacc);
    }
    /* y aliases a */
    add_forward_cuda(dt, d_a, d_b, d_a, n, g.compute);
    float *gin = download_values(dt, d_a, n);
    check_rel_dt("add y (y == a)", dt, gin, y, n, 0);
    free(a), free(b), free(y), free(yr), free(acc), free(gin);
    void *d[] = {d_a, d_b, d_y};
    cuda_free_all(d, COUNT(d));
}

static void test_avgpool_gpu(DType dt, int nhwc, PoolShape s) {
    printf("avgpool %s %s %dx%dx%dx%d\n", dtype_name(dt), nhwc ? "nhwc" : "nchw", s.n, s.c, s.h, s.w);
    size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = (size_t)s.n * s.c;
    BatchNormShape as_bn = {s.n, s.c, s.h, s.w}; /* for the layout helpers */
    float *x = random_values(dt, nx, -1, 3), *dy = random_values(dt, ny, -1, 1);
    float *y = host_floats(ny), *dx = host_floats(nx);
    int plane = s.h * s.w;
    avgpool_forward_cpu(x, y, s.n, s.c, plane);
    avgpool_backward_cpu(dy, dx, 0, s.n, s.c, plane);
    float *old = random_values(dt, nx, -0.1f, 0.1f), *acc = copy_floats(old, nx);
    avgpool_backward_cpu(dy, acc, 1, s.n, s.c, plane);
    void *d_x = dev_tensor(dt, nhwc, x, &as_bn), *d_y = dev_elements(dt, ny);
    void *d_dy = dev_values(dt, dy, ny), *d_dx = dev_elements(dt, nx);
    poison(d_y, dt, ny);
    poison(d_dx, dt, nx);
    avgpool_forward_cuda(dt, nhwc, d_x, d_y, s.n, s.c, plane, g.compute);
    avgpool_backward_cuda(dt, nhwc, d_dy, d_dx, 0, s.n, s.c, plane, g.compute);
    float *gy = download_values(dt, d_y, ny), *gdx = download_tensor(dt, nhwc, d_dx, &as_bn);
    check_rel_dt("avgpool y", dt, gy, y, ny, tol_for(dt, 1e-6));
    round_to(dt, dx, nx); /* dy / plane, rounded once to dt */
    check_rel_dt("avgpool dx", dt, gdx, dx, nx, 0);
    void *d_old = dev_tensor(dt, nhwc, old, &as_bn);
    CUDA_CHECK(cudaMemcpyAsync(d_dx, d_old, nx * dtype_size(dt), cudaMemcpyDeviceToDevice, g.compute));
    avgpool_backward_cuda(dt, nhwc, d_dy, d_dx, 1, s.n, s.c, plane, g.compute);
    float *gacc = download_tensor(dt, nhwc, d_dx, &as_bn);
    check_rel_dt("avgpool dx (accumulated onto random)", dt, gacc, acc, nx, tol_for(dt, 1e-7));
    void *h[] = {x, dy, y, dx, old, acc, gy, gdx, gacc};
    free_all(h, COUNT(h));
    void *d[] = {d_x, d_y, d_dy, d_dx, d_old};
    cuda_free_all(d, COUNT(d));
}

/* ---- GPU: conv2d accumulate_dx ------------------------------------------------------ */

static void test_conv_ex_gpu(Conv2dShape s) {
    printf("conv2d cuda accumulate_dx %dx%dx%dx%d -> %d, %dx%d pad %d stride %d\n", s.n, s.c, s.h, s.w,
           s.k, s.r, s.s, s.pad, s.stride);
    size_t nx = conv_x_size(&s), nw = conv_w_size(&s), ny = conv_y_size(&s);
    float w_scale = 1.0f / sqrtf((float)(s.c * s.r * s.s));
    float *x = random_floats(nx, -1, 1), *w = random_floats(nw, -w_scale, w_scale);
    float *b = random_floats(s.k, -1, 1), *dy = random_floats(ny, -1, 1);
    float *dx = host_floats(nx), *dw = host_floats(nw), *db = host_floats(s.k);
    float *y = host_floats(ny);
    conv2d_forward_cpu(&s, x, w, b, y);
    conv2d_backward_ex_cpu(&s, x, w, dy, dx, dw, db, 0);
    float *old = random_floats(nx, -1, 1), *acc = copy_floats(old, nx);
    float *dw2 = host_floats(nw), *db2 = host_floats(s.k);
    conv2d_backward_ex_cpu(&s, x, w, dy, acc, dw2, db2, 1);

    const ConvAlgoPolicy strict = {(size_t)512 << 20, 0, 1, 0};
    Conv2dCuda c;
    conv2d_cuda_init(&c, g.cudnn, &s, DTYPE_F32, 0, &strict);
    void *ws = c.workspace_bytes ? dev_bytes(c.workspace_bytes) : NULL;
    float *d_x = dev_floats_from(x, nx), *d_w = dev_floats_from(w, nw), *d_b = dev_floats_from(b, s.k);
    float *d_dy = dev_floats_from(dy, ny), *d_y = dev_bytes(ny * sizeof(float));
    float *d_dx = dev_bytes(nx * sizeof(float));
    float *zero_w = host_floats(nw), *zero_b = host_floats(s.k);
    float *d_dw = dev_floats_from(zero_w, nw), *d_db = dev_floats_from(zero_b, s.k);
    poison(d_y, DTYPE_F32, ny);
    conv2d_forward_cuda(&c, g.cudnn, d_x, d_w, d_b, d_y, ws);
    poison(d_dx, DTYPE_F32, nx);
    conv2d_backward_ex_cuda(&c, g.cudnn, d_x, d_w, d_dy, d_dx, d_dw, d_db, ws, 0);
    float *gy = download_floats(d_y, ny), *gdx = download_floats(d_dx, nx), *gdw = download_floats(d_dw, nw);
    check_rel("conv y", gy, y, ny, 1e-4);
    check_rel("conv dx", gdx, dx, nx, 1e-4);
    check_rel("conv dw", gdw, dw, nw, 1e-4);
    upload(d_dx, old, nx * sizeof(float));
    conv2d_backward_ex_cuda(&c, g.cudnn, d_x, d_w, d_dy, d_dx, d_dw, d_db, ws, 1);
    float *gacc = download_floats(d_dx, nx);
    check_rel("conv dx (accumulate_dx onto random)", gacc, acc, nx, 1e-4);
    conv2d_cuda_destroy(&c);
    void *h[] = {x, w, b, dy, dx, dw, db, y, old, acc, dw2, db2, zero_w, zero_b, gy, gdx, gdw, gacc};
    free_all(h, COUNT(h));
    void *d[] = {ws, d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db};
    cuda_free_all(d, COUNT(d));
}

/* ---- GPU: softmax label smoothing ---------------------------------------------------- */

static void test_softmax_smoothing_gpu(DType dt, int n, int classes, float smoothing) {
    printf("softmax_xent %s n=%d classes=%d smoothing %g\n", dtype_name(dt), n, classes, smoothing);
    size_t total = (size_t)n * classes;
    float *logits = random_values(dt, total, -5, 5), *dl = host_floats(total), loss, scale = 4.0f;
    int32_t *labels = host_bytes(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) labels[i] = (int32_t)(test_uniform(&rng, 0, 1) * classes) % classes;
    softmax_xent_smooth_cpu(logits, labels, n, classes, smoothing, &scale, &loss, dl);
    void *d_logits = dev_values(dt, logits, total), *d_dl = dev_elements(dt, total);
    float *d_loss = dev_bytes(sizeof(float)), *d_scale = dev_floats_from(&scale, 1);
    int32_t *d_labels = dev_bytes(sizeof(int32_t) * n);
    upload(d_labels, labels, sizeof(int32_t) * n);
    poison(d_dl, dt, total);
    poison(d_loss, DTYPE_F32, 1);
    softmax_xent_smooth_cuda(dt, d_logits, d_labels, n, classes, smoothing, d_scale, d_loss, d_dl, g.compute);
    float gloss, *gdl = download_values(dt, d_dl, total);
    download(&gloss, d_loss, sizeof gloss);
    printf("  loss gpu %.9g cpu %.9g\n", gloss, loss);
    CHECK_MSG(fabs(gloss - loss) <= 1e-5 * (1 + fabs(loss)), "smoothed loss %.9g, cpu %.9g", gloss, loss);
    check_rel_dt("smoothed dlogits", dt, gdl, dl, total, tol_for(dt, 1e-5));
    /* smoothing 0 through the new entry point is the old op, to the bit */
    softmax_xent_cuda(dt, d_logits, d_labels, n, classes, d_scale, d_loss, d_dl, g.compute);
    float loss_old, *dl_old = download_values(dt, d_dl, total);
    download(&loss_old, d_loss, sizeof loss_old);
    softmax_xent_smooth_cuda(dt, d_logits, d_labels, n, classes, 0.0f, d_scale, d_loss, d_dl, g.compute);
    float loss_zero, *dl_zero = download_values(dt, d_dl, total);
    download(&loss_zero, d_loss, sizeof loss_zero);
    CHECK_MSG(same_bits(dl_old, dl_zero, total) && same_bits(&loss_old, &loss_zero, 1),
              "softmax_xent_smooth_cuda with 0 differs from softmax_xent_cuda");
    free(logits), free(dl), free(labels), free(gdl), free(dl_old), free(dl_zero);
    void *d[] = {d_logits, d_dl, d_loss, d_scale, d_labels};
    cuda_free_all(d, COUNT(d));
}

/* ---- GPU: sgd decay mask ------------------------------------------------------------ */

/* Masked = decayed where the mask is set, undecayed elsewhere, to the bit:
 * the plain step and the mixed step (f16 gradients, a half copy). */
static void test_sgd_mask_gpu(size_t n, SgdParams p) {
    printf("sgd decay mask cuda n=%zu momentum %g wd %g nesterov %d\n", n, p.momentum, p.weight_decay,
           p.nesterov);
    float lr = 0.05f;
    float *w = random_floats(n, -1, 1), *m = random_floats(n, -0.1f, 0.1f);
    float *grad = random_values(DTYPE_F16, n, -1, 1);
    uint8_t *mask = random_mask(n);
    uint8_t *d_mask = dev_bytes(n);
    upload(d_mask, mask, n);
    float *d_lr = dev_floats_from(&lr, 1), *d_grad = dev_floats_from(grad, n);
    void *d_grad16 = dev_values(DTYPE_F16, grad, n), *d_half = dev_elements(DTYPE_F16, n);
    LossScalerState one = loss_scaler_initial(1.0f);
    LossScalerState *d_scaler = dev_bytes(sizeof one);
    upload(d_scaler, &one, sizeof one);
    SgdParams none = p, masked = p;
    none.weight_decay = 0.0f;
    masked.decay_mask = d_mask;
    const SgdParams *variants[3] = {&p, &none, &masked};
    for (int mixed = 0; mixed < 2; mixed++) {
        float *out_w[3], *out_m[3];
        for (int v = 0; v < 3; v++) {
            float *d_w = dev_floats_from(w, n), *d_m = dev_floats_from(m, n);
            if (mixed)
                sgd_step_mixed_cuda(d_w, d_grad16, DTYPE_F16, d_m, d_half, DTYPE_F16, n, d_lr, d_scaler,
                                    *variants[v], g.compute);
            else
                sgd_step_cuda(d_w, d_grad, d_m, n, d_lr, *variants[v], g.compute);
            out_w[v] = download_floats(d_w, n);
            out_m[v] = download_floats(d_m, n);
            CUDA_CHECK(cudaFree(d_w));
            CUDA_CHECK(cudaFree(d_m));
        }
        float *want_w = host_floats(n), *want_m = host_floats(n);
        select_floats(mask, out_w[0], out_w[1], want_w, n);
        select_floats(mask, out_m[0], out_m[1], want_m, n);
        CHECK_MSG(same_bits(out_w[2], want_w, n) && same_bits(out_m[2], want_m, n),
                  "%s with a decay mask is not the decayed/undecayed step per element",
                  mixed ? "sgd_step_mixed_cuda" : "sgd_step_cuda");
        CHECK_MSG(!same_bits(out_w[0], out_w[1], n), "weight decay changed nothing: the check cannot fail");
        /* and the CPU's masked step, within a rounding (the GPU may fuse multiply-adds) */
        float *cw = copy_floats(w, n), *cm = copy_floats(m, n);
        SgdParams host_masked = p;
        host_masked.decay_mask = mask;
        sgd_step_cpu(cw, grad, cm, n, &lr, host_masked);
        check_rel(mixed ? "sgd mixed masked w vs cpu" : "sgd masked w vs cpu", out_w[2], cw, n, 1e-6);
        free(want_w), free(want_m), free(cw), free(cm);
        for (int v = 0; v < 3; v++) free(out_w[v]), free(out_m[v]);
    }
    free(w), free(m), free(grad), free(mask);
    void *d[] = {d_mask, d_lr, d_grad, d_grad16, d_half, d_scaler};
    cuda_free_all(d, COUNT(d));
}

/* ---- GPU: lr schedule ------------------------------------------------------------- */

static void test_lr_schedule_gpu(const char *name, LrSchedule s, int steps) {
    printf("lr schedule cuda: %s, %d steps\n", name, steps);
    int64_t *d_counter = dev_bytes(sizeof(int64_t)), zero = 0;
    float *d_lr = dev_bytes(steps * sizeof(float));
    upload(d_counter, &zero, sizeof zero);
    for (int i = 0; i < steps; i++) lr_schedule_step_cuda(&s, d_counter, d_lr + i, g.compute);
    float *got = download_floats(d_lr, steps);
    int64_t counter = -1;
    download(&counter, d_counter, sizeof counter);
    CHECK_MSG(counter == steps, "lr counter %lld after %d steps", (long long)counter, steps);
    int bad = 0;
    for (int i = 0; i < steps; i++) {
        double want = lr_schedule_value(&s, i);
        if (!lr_close(got[i], want)) {
            if (bad < 3) fprintf(stderr, "  %s: step %d gpu %.9g cpu %.9g\n", name, i, got[i], want);
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%s: %d of %d steps differ from the host's lr", name, bad, steps);

    /* one captured step, replayed: the graph follows the schedule */
    upload(d_counter, &zero, sizeof zero);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(g.compute, cudaStreamCaptureModeGlobal));
    lr_schedule_step_cuda(&s, d_counter, d_lr, g.compute);
    CUDA_CHECK(cudaStreamEndCapture(g.compute, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int replays = steps / 2 + 1;
    for (int i = 0; i < replays; i++) CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
    float last;
    download(&last, d_lr, sizeof last);
    download(&counter, d_counter, sizeof counter);
    CHECK_MSG(counter == replays && last == got[replays - 1],
              "%s from a graph: counter %lld lr %.9g, want %d and %.9g", name, (long long)counter, last,
              replays, got[replays - 1]);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    free(got);
    CUDA_CHECK(cudaFree(d_counter));
    CUDA_CHECK(cudaFree(d_lr));
}

#endif

/* ==== main ============================================================================ */

static void run_cpu_tests(void) {
    test_bn_cpu_hand();
    test_bn_cpu_statistics((BatchNormShape){4, 3, 5, 6});
    test_bn_cpu_statistics((BatchNormShape){2, 5, 1, 1});
    test_bn_cpu_eval((BatchNormShape){3, 4, 5, 2});
    test_bn_cpu_gradients((BatchNormShape){3, 4, 3, 5}, 0);
    test_bn_cpu_gradients((BatchNormShape){5, 2, 1, 1}, 0);
    test_bn_cpu_gradients((BatchNormShape){2, 3, 4, 4}, 1);
    test_bn_relu_cpu_forward((BatchNormShape){4, 6, 5, 5});
    test_bn_sync_cpu((BatchNormShape){4, 3, 5, 6}, 0, 2.0f, 1);
    test_bn_sync_cpu((BatchNormShape){6, 5, 3, 3}, 1, 1.0f, 1);
    test_bn_sync_cpu((BatchNormShape){2, 4, 2, 3}, 0, 20.0f, 0); /* |mean| >> std; one image a rank */
    test_bn_sync_cpu((BatchNormShape){2, 4, 1, 1}, 1, 1.0f, 1);  /* one value a rank: only the global count is 2 */
    test_add_cpu();
    test_avgpool_cpu();
    /* ResNet's projection shortcut (1x1, stride 2, no padding) and its stem (7x7, stride 2, pad 3) */
    test_conv_ex_cpu((Conv2dShape){.n = 2, .c = 4, .h = 9, .w = 8, .k = 6, .r = 1, .s = 1, .pad = 0, .stride = 2});
    test_conv_ex_cpu((Conv2dShape){.n = 2, .c = 3, .h = 11, .w = 10, .k = 4, .r = 7, .s = 7, .pad = 3, .stride = 2});
    test_conv_ex_cpu((Conv2dShape){.n = 2, .c = 3, .h = 6, .w = 5, .k = 4, .r = 3, .s = 3, .pad = 1, .stride = 1});
    test_softmax_smoothing_cpu();
    test_sgd_mask_cpu((SgdParams){.momentum = 0.9f, .weight_decay = 5e-2f, .nesterov = 1});
    test_sgd_mask_cpu((SgdParams){.momentum = 0.0f, .weight_decay = 1e-1f, .nesterov = 0});
    test_lr_schedule_cpu();
}

#if TRAINC_CUDA
static void run_gpu_tests(void) {
    /* shapes: several rows of partial sums; h*w and c off the 16-byte vectors;
     * CIFAR ResNet-18's first stage; 300 channels: two NHWC tiles in f16 (one element a thread) */
    const BatchNormShape shapes[] = {
        {4, 16, 8, 8}, {3, 24, 7, 7}, {2, 12, 5, 3}, {32, 64, 32, 32}, {8, 40, 9, 9}, {4, 300, 4, 4},
    };
    for (size_t i = 0; i < COUNT(shapes); i++)
        for (int t = 0; t < 3; t++)
            for (int nhwc = 0; nhwc < 2; nhwc++) test_bn_gpu(all_types[t], nhwc, shapes[i], 2.0f);
    /* |mean| >> std: the shifted sums must not cancel */
    test_bn_gpu(DTYPE_F32, 0, (BatchNormShape){16, 8, 12, 12}, 20.0f);
    test_bn_gpu(DTYPE_F32, 1, (BatchNormShape){16, 8, 12, 12}, 20.0f);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        test_bn_gpu_grad_f32(DTYPE_BF16, nhwc, (BatchNormShape){8, 32, 8, 8});
        test_bn_gpu_grad_f32(DTYPE_F16, nhwc, (BatchNormShape){8, 32, 8, 8});
        for (int t = 0; t < 3; t++) test_bn_gpu_scratch_and_graph(all_types[t], nhwc);
    }
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        for (int t = 0; t < 3; t++) test_bn_sync_gpu(all_types[t], nhwc, (BatchNormShape){8, 24, 7, 7}, 2.0f);
        test_bn_sync_gpu(DTYPE_F16, nhwc, (BatchNormShape){4, 32, 8, 8}, 1.0f);    /* 16-byte vectors */
        test_bn_sync_gpu(DTYPE_F32, nhwc, (BatchNormShape){16, 8, 12, 12}, 20.0f); /* |mean| >> std */
        test_bn_sync_gpu(DTYPE_F32, nhwc, (BatchNormShape){2, 16, 1, 1}, 1.0f);    /* one value a rank */
    }

    for (int t = 0; t < 3; t++) {
        test_add_gpu(all_types[t], 1000);
        test_add_gpu(all_types[t], 1);
        test_add_gpu(all_types[t], ((size_t)1 << 20) + 5);
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            test_avgpool_gpu(all_types[t], nhwc, (PoolShape){8, 64, 4, 4});
            test_avgpool_gpu(all_types[t], nhwc, (PoolShape){3, 20, 7, 7});
            test_avgpool_gpu(all_types[t], nhwc, (PoolShape){2, 5, 3, 5});
        }
    }

    test_conv_ex_gpu((Conv2dShape){.n = 4, .c = 16, .h = 16, .w = 16, .k = 32, .r = 1, .s = 1, .pad = 0, .stride = 2});
    test_conv_ex_gpu((Conv2dShape){.n = 2, .c = 3, .h = 32, .w = 32, .k = 16, .r = 7, .s = 7, .pad = 3, .stride = 2});
    test_conv_ex_gpu((Conv2dShape){.n = 4, .c = 16, .h = 8, .w = 8, .k = 16, .r = 3, .s = 3, .pad = 1, .stride = 1});

    for (int t = 0; t < 3; t++) {
        test_softmax_smoothing_gpu(all_types[t], 512, 10, 0.1f);
        test_softmax_smoothing_gpu(all_types[t], 37, 1000, 0.3f);
    }

    test_sgd_mask_gpu(1000003, (SgdParams){.momentum = 0.9f, .weight_decay = 5e-2f, .nesterov = 1});
    test_sgd_mask_gpu(7, (SgdParams){.momentum = 0.0f, .weight_decay = 1e-1f, .nesterov = 0});

    test_lr_schedule_gpu("cosine", (LrSchedule){.kind = LR_COSINE, .base_lr = 0.1f, .warmup_steps = 20,
                                                .total_steps = 250, .warmup_start_factor = 0.01f,
                                                .final_lr = 1e-4f}, 300);
    test_lr_schedule_gpu("onecycle", (LrSchedule){.kind = LR_ONECYCLE, .base_lr = 0.4f, .warmup_steps = 75,
                                                  .total_steps = 250}, 300);
    test_lr_schedule_gpu("step", (LrSchedule){.kind = LR_STEP, .base_lr = 0.1f, .warmup_steps = 5,
                                              .warmup_start_factor = 0.1f, .step_size = 60, .gamma = 0.2f}, 300);
    test_lr_schedule_gpu("constant", (LrSchedule){.kind = LR_CONSTANT, .base_lr = 0.05f, .warmup_steps = 10,
                                                  .warmup_start_factor = 0.3f}, 50);

    report_bn_speed(DTYPE_F16, 1, (BatchNormShape){256, 64, 56, 56});
    report_bn_speed(DTYPE_F16, 1, (BatchNormShape){512, 64, 32, 32});
    report_bn_speed(DTYPE_F16, 1, (BatchNormShape){512, 512, 4, 4});
    report_bn_speed(DTYPE_F32, 0, (BatchNormShape){256, 64, 56, 56});
    report_bn_speed(DTYPE_F16, 0, (BatchNormShape){512, 64, 32, 32});
}
#endif

int main(void) {
    rng = test_seed();
    run_cpu_tests();
    if (test_have_gpu()) {
        GPU_ONLY(gpu_context_init(&g, 0); run_gpu_tests(); gpu_context_destroy(&g));
    } else {
        printf("no GPU: GPU checks skipped\n");
    }
    return test_finish("test_ops_resnet");
}
