/* Mixed precision on the CUDA path: every op in f16 and bf16 against the fp32
 * CPU reference, the loss scaler and the mixed-precision SGD step.
 *
 * Inputs are random each run and rounded to the half type on the host first, so
 * the CPU reference sees exactly the values the device does. The reference then
 * rounds where the device rounds (a result stored in the half type, and once
 * more after a bias is added), so what remains is the device's own arithmetic:
 * fp32 accumulation in another order and cuDNN's algorithms. The relative L2
 * bounds leave room for that and still catch a wrong layout, a lost bias or an
 * overwritten accumulator, each of which is off by tens of percent. Outputs are
 * poisoned with NaN before each call, so an element not written fails. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/accuracy.h"
#include "ops/cast.h"
#include "ops/conv2d.h"
#include "ops/linear.h"
#include "ops/loss_scaler.h"
#include "ops/maxpool.h"
#include "ops/relu.h"
#include "ops/sgd.h"
#include "ops/softmax_xent.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/op_buffers.h"

#define CONV_WORKSPACE_LIMIT ((size_t)512 << 20)
/* Deterministic algorithms, so two runs repeat; allow_tf32 plays no part for half types. */
static const ConvAlgoPolicy deterministic_policy = {CONV_WORKSPACE_LIMIT, 0, 1, 0};

static const DType half_types[2] = {DTYPE_F16, DTYPE_BF16};

static uint64_t rng;
static GpuContext g;

static void upload(void *dst, const void *src, size_t bytes) { upload_on(g.compute, dst, src, bytes); }
static void download(void *dst, const void *src, size_t bytes) { download_on(g.compute, dst, src, bytes); }

/* Relative L2 bounds for results that went through fp32 accumulation in another
 * order (or another algorithm) and one or two roundings to the half type:
 * f16 has an 11-bit significand (rounding error <= 4.9e-4), bf16 an 8-bit one
 * (<= 3.9e-3). */
static double tol_for(DType dt, double f16, double bf16) { return dt == DTYPE_F16 ? f16 : bf16; }

/* ---- host and device buffers -------------------------------------------------- */

/* Uniform in [lo, hi), already rounded to dt. */
static float *random_values(DType dt, size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, &rng, lo, hi);
    round_to(dt, p, n);
    return p;
}

/* A device buffer of n elements of dt holding host's values (rounded to dt). */
static void *dev_values(DType dt, const float *host, size_t n) { return dev_values_on(g.compute, dt, host, n); }

static void *dev_elements(DType dt, size_t n) { return dev_bytes(n * dtype_size(dt)); }

/* n elements of dt from the device, widened to float on the host. */
static float *download_values(DType dt, const void *dev, size_t n) {
    return download_values_on(g.compute, dt, dev, n);
}

static void *download_bytes(const void *dev, size_t bytes) {
    void *p = host_bytes(bytes);
    download(p, dev, bytes);
    return p;
}

/* All-ones bytes are a NaN in f32, f16 and bf16 alike. */
static void poison(void *dev, DType dt, size_t n) {
    CUDA_CHECK(cudaMemsetAsync(dev, 0xff, n * dtype_size(dt), g.compute));
}

static void check_rel(const char *what, DType dt, const float *gpu, const float *cpu, size_t n,
                      double tol) {
    double err = test_rel_error(gpu, cpu, n);
    printf("  %-5s %-56s rel err %.2e (bound %.1e)\n", dtype_name(dt), what, err, tol);
    CHECK_MSG(err <= tol, "%s %s: relative error %.3g > %.3g", dtype_name(dt), what, err, tol);
}

static int same_bytes(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static double rms(const float *x, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return n ? sqrt(sum / n) : 0;
}

/* Accumulator start values of about the size of what is added to them, so an
 * accumulator that was overwritten instead is off by ~70%. */
static float *accumulator_start(DType dt, const float *added, size_t n) {
    float size = (float)rms(added, n);
    float *p = random_values(DTYPE_F32, n, -size, size);
    round_to(dt, p, n);
    return p;
}

static void add_into(float *acc, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

static void free_all(void **p, size_t count) {
    for (size_t i = 0; i < count; i++) free(p[i]);
}

static void cuda_free_all(void **p, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (p[i]) CUDA_CHECK(cudaFree(p[i]));
}

#define COUNT(a) (sizeof(a) / sizeof *(a))

/* ---- cast ---------------------------------------------------------------------- */

/* Values over the whole range of both types and past it: subnormals, ties,
 * overflow to inf, infinities and zeros of both signs. */
static float *cast_inputs(size_t n) {
    float *x = host_floats(n);
    for (size_t i = 0; i < n; i++) {
        float mantissa = test_uniform(&rng, -2, 2);
        int exponent = (int)test_uniform(&rng, -140, 130);
        x[i] = ldexpf(mantissa, exponent);
    }
    const float special[] = {INFINITY, -INFINITY, 0.0f, -0.0f, 65504.0f, 65520.0f, 65519.0f,
                             ldexpf(1, -24), ldexpf(1, -25), 3 * ldexpf(1, -25), 1.0f + ldexpf(1, -11),
                             1.0f + ldexpf(1, -8), 3.4028235e38f, 1e-40f};
    for (size_t i = 0; i < COUNT(special) && i < n; i++) x[i * 7 % n] = special[i];
    return x;
}

static void test_cast(DType dt, size_t n) {
    printf("cast f32 <-> %s n=%zu\n", dtype_name(dt), n);
    float *x = cast_inputs(n);
    x[n / 3] = NAN;
    size_t bytes = n * dtype_size(dt);
    void *want = host_bytes(bytes);
    cast_from_f32_cpu(dt, x, want, n);

    float *d_x = dev_bytes(n * sizeof(float)), *d_back = dev_bytes(n * sizeof(float));
    void *d_h = dev_elements(dt, n);
    upload(d_x, x, n * sizeof(float));
    poison(d_h, dt, n);
    cast_from_f32_cuda(dt, d_x, d_h, n, g.compute);
    uint16_t *got = download_bytes(d_h, bytes);
    const uint16_t *want16 = want;
    int nan_ok = (got[n / 3] & 0x7fff) > (dt == DTYPE_F16 ? 0x7c00 : 0x7f80);
    got[n / 3] = want16[n / 3]; /* NaN payloads may differ */
    CHECK_MSG(nan_ok, "%s cast: NaN did not stay NaN", dtype_name(dt));
    CHECK_MSG(same_bytes(got, want, bytes), "%s cast from f32: device and host round differently",
              dtype_name(dt));

    /* widening is exact: the device gives the host's floats bit for bit */
    upload(d_h, want, bytes);
    poison(d_back, DTYPE_F32, n);
    cast_to_f32_cuda(dt, d_h, d_back, n, g.compute);
    float *back = download_bytes(d_back, n * sizeof(float)), *back_want = host_floats(n);
    cast_to_f32_cpu(dt, want, back_want, n);
    back[n / 3] = back_want[n / 3] = 0;
    CHECK_MSG(same_bytes(back, back_want, n * sizeof(float)), "%s cast to f32 is not exact",
              dtype_name(dt));

    /* f32 -> f32 is a copy */
    poison(d_back, DTYPE_F32, n);
    cast_from_f32_cuda(DTYPE_F32, d_x, d_back, n, g.compute);
    float *copy = download_bytes(d_back, n * sizeof(float));
    CHECK_MSG(same_bytes(copy, x, n * sizeof(float)), "f32 -> f32 cast is not a copy");

    void *host[] = {x, want, got, back, back_want, copy};
    free_all(host, COUNT(host));
    void *dev[] = {d_x, d_back, d_h};
    cuda_free_all(dev, COUNT(dev));
}

/* ---- maxpool ------------------------------------------------------------------ */

static void test_maxpool(DType dt, Pool2dShape s, int ties) {
    printf("maxpool %s %dx%dx%dx%d%s\n", dtype_name(dt), s.n, s.c, s.h, s.w, ties ? " (ties)" : "");
    size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = nx / 4;
    float *x = random_values(dt, nx, -1, 1), *dy = random_values(dt, ny, -1, 1);
    if (ties)
        for (size_t i = 0; i < nx; i++) x[i] = floorf((x[i] + 1.0f) * 1.5f);
    float *y = host_floats(ny), *dx = host_floats(nx);
    maxpool2x2_forward_cpu(&s, x, y);
    maxpool2x2_backward_cpu(&s, x, y, dy, dx);

    MaxPoolCuda p;
    maxpool2x2_cuda_init(&p, &s, dt, 0);
    CHECK(p.dtype == dt);
    void *d_x = dev_values(dt, x, nx), *d_y = dev_elements(dt, ny), *d_dy = dev_values(dt, dy, ny);
    void *d_dx = dev_elements(dt, nx);
    poison(d_y, dt, ny);
    poison(d_dx, dt, nx);
    maxpool2x2_forward_cuda(&p, g.cudnn, d_x, d_y);
    maxpool2x2_backward_cuda(&p, g.cudnn, d_x, d_y, d_dy, d_dx);
    float *gy = download_values(dt, d_y, ny), *gdx = download_values(dt, d_dx, nx);
    check_rel(ties ? "maxpool y (ties)" : "maxpool y", dt, gy, y, ny, 0);
    check_rel(ties ? "maxpool dx (ties: first maximum)" : "maxpool dx", dt, gdx, dx, nx, 0);

    maxpool2x2_cuda_destroy(&p);
    void *host[] = {x, dy, y, dx, gy, gdx};
    free_all(host, COUNT(host));
    void *dev[] = {d_x, d_y, d_dy, d_dx};
    cuda_free_all(dev, COUNT(dev));
}

/* ---- conv2d ------------------------------------------------------------------ */

static size_t conv_x_count(const Conv2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t conv_w_count(const Conv2dShape *s) { return (size_t)s->k * s->c * s->r * s->s; }
static size_t conv_y_count(const Conv2dShape *s) {
    return (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s);
}

/* y as the device forms it: the convolution stored in dt, then the bias added
 * and stored again. */
static void conv_forward_reference(DType dt, const Conv2dShape *s, const float *x, const float *w,
                                   const float *b, float *y) {
    size_t ny = conv_y_count(s), plane = ny / ((size_t)s->n * s->k);
    float *zero = host_floats(s->k);
    conv2d_forward_cpu(s, x, w, zero, y);
    round_to(dt, y, ny);
    for (size_t i = 0; i < ny; i++) y[i] += b[(i / plane) % s->k];
    round_to(dt, y, ny);
    free(zero);
}

static void test_conv_with(DType dt, Conv2dShape s, const ConvAlgoPolicy *policy) {
    size_t nx = conv_x_count(&s), nw = conv_w_count(&s), ny = conv_y_count(&s);
    float w_scale = 1.0f / sqrtf((float)(s.c * s.r * s.s));
    float *x = random_values(dt, nx, -1, 1), *w = random_values(dt, nw, -w_scale, w_scale);
    float *b = random_values(dt, s.k, -1, 1), *dy = random_values(dt, ny, -1, 1);

    float *y = host_floats(ny), *dx = host_floats(nx);
    float *dw_added = host_floats(nw), *db_added = host_floats(s.k);
    conv_forward_reference(dt, &s, x, w, b, y);
    conv2d_backward_cpu(&s, x, w, dy, dx, dw_added, db_added);
    round_to(dt, dx, nx);
    float *dw0 = accumulator_start(dt, dw_added, nw), *db0 = accumulator_start(dt, db_added, s.k);
    float *dw = copy_floats(dw0, nw), *db = copy_floats(db0, s.k);
    add_into(dw, dw_added, nw);
    add_into(db, db_added, s.k);
    round_to(dt, dw, nw);
    round_to(dt, db, s.k);

    Conv2dCuda c;
    conv2d_cuda_init(&c, g.cudnn, &s, dt, 0, policy);
    CHECK(c.dtype == dt);
    printf("conv %s %dx%dx%dx%d -> %d, %dx%d pad %d stride %d: algos fwd %d bwd-data %d "
           "bwd-filter %d, workspace %zu bytes%s\n", dtype_name(dt), s.n, s.c, s.h, s.w, s.k, s.r,
           s.s, s.pad, s.stride, (int)c.fwd_algo, (int)c.bwd_data_algo, (int)c.bwd_filter_algo,
           c.workspace_bytes, policy->benchmark ? " (benchmarked)" : "");
    CHECK(c.workspace_bytes <= CONV_WORKSPACE_LIMIT);
    void *ws = c.workspace_bytes ? dev_bytes(c.workspace_bytes) : NULL;
    void *d_x = dev_values(dt, x, nx), *d_w = dev_values(dt, w, nw), *d_b = dev_values(dt, b, s.k);
    void *d_dy = dev_values(dt, dy, ny), *d_y = dev_elements(dt, ny), *d_dx = dev_elements(dt, nx);
    void *d_dw = dev_values(dt, dw0, nw), *d_db = dev_values(dt, db0, s.k);

    poison(d_y, dt, ny);
    conv2d_forward_cuda(&c, g.cudnn, d_x, d_w, d_b, d_y, ws);
    poison(d_dx, dt, nx);
    conv2d_backward_cuda(&c, g.cudnn, d_x, d_w, d_dy, d_dx, d_dw, d_db, ws);
    float *gy = download_values(dt, d_y, ny), *gdx = download_values(dt, d_dx, nx);
    float *gdw = download_values(dt, d_dw, nw), *gdb = download_values(dt, d_db, s.k);
    double tol = tol_for(dt, 5e-3, 2e-2);
    check_rel("conv y", dt, gy, y, ny, tol);
    check_rel("conv dx", dt, gdx, dx, nx, tol);
    check_rel("conv dw (accumulated onto random dw)", dt, gdw, dw, nw, tol);
    check_rel("conv db (accumulated onto random db)", dt, gdb, db, s.k, tol);

    /* again with dx == NULL: the same dw; db (our own fixed-order kernel) the same bits */
    void *d_dw2 = dev_values(dt, dw0, nw), *d_db2 = dev_values(dt, db0, s.k);
    conv2d_backward_cuda(&c, g.cudnn, d_x, d_w, d_dy, NULL, d_dw2, d_db2, ws);
    float *gdw2 = download_values(dt, d_dw2, nw), *gdb2 = download_values(dt, d_db2, s.k);
    check_rel("conv dw (dx == NULL, vs the first run)", dt, gdw2, gdw, nw, tol / 4);
    CHECK_MSG(same_bytes(gdb, gdb2, s.k * sizeof(float)), "%s conv db is not reproducible",
              dtype_name(dt));

    conv2d_cuda_destroy(&c);
    void *host[] = {x, w, b, dy, y, dx, dw_added, db_added, dw0, db0, dw, db, gy, gdx, gdw, gdb,
                    gdw2, gdb2};
    free_all(host, COUNT(host));
    void *dev[] = {ws, d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db, d_dw2, d_db2};
    cuda_free_all(dev, COUNT(dev));
}

static void test_conv(DType dt, Conv2dShape s) { test_conv_with(dt, s, &deterministic_policy); }

/* ---- softmax cross-entropy and accuracy ---------------------------------------- */

static int32_t *random_labels(int n, int classes) {
    int32_t *labels = host_bytes(sizeof(int32_t) * (n ? n : 1));
    for (int i = 0; i < n; i++) {
        labels[i] = (int32_t)(test_uniform(&rng, 0, 1) * classes);
        if (labels[i] >= classes) labels[i] = classes - 1;
    }
    return labels;
}

static int32_t *dev_labels(const int32_t *labels, int n) {
    int32_t *d = dev_bytes(sizeof(int32_t) * (n ? n : 1));
    upload(d, labels, sizeof(int32_t) * n);
    return d;
}

/* grad_scale 0 passes NULL (meaning 1); otherwise it is read from device memory. */
static void test_softmax(DType dt, int n, int classes, float grad_scale, float spread) {
    printf("softmax_xent %s n=%d classes=%d grad_scale=%g logits in +-%g\n", dtype_name(dt), n,
           classes, grad_scale, spread);
    size_t total = (size_t)n * classes;
    float *logits = random_values(dt, total, -spread, spread);
    int32_t *labels = random_labels(n, classes);
    float loss = 0, *dl = host_floats(total);
    softmax_xent_cpu(logits, labels, n, classes, grad_scale ? &grad_scale : NULL, &loss, dl);
    round_to(dt, dl, total);

    void *d_logits = dev_values(dt, logits, total), *d_dl = dev_elements(dt, total);
    float *d_loss = dev_bytes(sizeof(float)), *d_scale = NULL;
    if (grad_scale) {
        d_scale = dev_bytes(sizeof(float));
        upload(d_scale, &grad_scale, sizeof(float));
    }
    int32_t *d_labels = dev_labels(labels, n);
    poison(d_dl, dt, total);
    poison(d_loss, DTYPE_F32, 1);
    softmax_xent_cuda(dt, d_logits, d_labels, n, classes, d_scale, d_loss, d_dl, g.compute);
    float gloss, *gdl = download_values(dt, d_dl, total);
    download(&gloss, d_loss, sizeof gloss);
    /* the same logits on both sides, the loss in fp32 and double: as close as in fp32 */
    printf("  %-5s loss gpu %.9g cpu %.9g\n", dtype_name(dt), gloss, loss);
    CHECK_MSG(fabs(gloss - loss) <= 1e-5 * (1 + fabs(loss)), "%s softmax loss %.9g, cpu %.9g",
              dtype_name(dt), gloss, loss);
    /* rounded from a float that differs from the double reference in its last bits */
    check_rel("softmax dlogits", dt, gdl, dl, total, tol_for(dt, 1e-3, 5e-3));

    poison(d_loss, DTYPE_F32, 1);
    softmax_xent_cuda(dt, d_logits, d_labels, n, classes, d_scale, d_loss, d_dl, g.compute);
    float gloss2, *gdl2 = download_values(dt, d_dl, total);
    download(&gloss2, d_loss, sizeof gloss2);
    CHECK_MSG(same_bytes(&gloss, &gloss2, sizeof gloss) && same_bytes(gdl, gdl2, total * sizeof(float)),
              "%s softmax_xent is not reproducible", dtype_name(dt));

    void *host[] = {logits, labels, dl, gdl, gdl2};
    free_all(host, COUNT(host));
    void *dev[] = {d_logits, d_dl, d_loss, d_scale, d_labels};
    cuda_free_all(dev, COUNT(dev));
}

static void test_accuracy(DType dt, int n, int classes, int ties) {
    printf("accuracy %s n=%d classes=%d%s\n", dtype_name(dt), n, classes, ties ? " (ties)" : "");
    size_t total = (size_t)n * classes;
    /* a narrow range, so rounding to the half type makes many near-ties exact ties */
    float *logits = random_values(dt, total, 0.9f, 1.1f);
    if (ties)
        for (size_t i = 0; i < total; i++) logits[i] = floorf(logits[i] * 10.0f - 9.0f);
    int32_t *labels = random_labels(n, classes);
    for (int i = 0; i < n; i += 2) {
        const float *row = logits + (size_t)i * classes;
        int best = 0;
        for (int j = 1; j < classes; j++)
            if (row[j] > row[best]) best = j;
        labels[i] = best;
    }
    int want = accuracy_count_cpu(logits, labels, n, classes);

    void *d_logits = dev_values(dt, logits, total);
    int32_t *d_labels = dev_labels(labels, n);
    int *d_count = dev_bytes(sizeof(int)), start = 5, got = 0;
    upload(d_count, &start, sizeof start);
    accuracy_count_cuda(dt, d_logits, d_labels, n, classes, d_count, g.compute);
    download(&got, d_count, sizeof got);
    CHECK_MSG(got == start + want, "%s accuracy: counter %d, want %d + %d", dtype_name(dt), got,
              start, want);
    printf("  %-5s %d of %d right\n", dtype_name(dt), want, n);

    void *host[] = {logits, labels};
    free_all(host, COUNT(host));
    void *dev[] = {d_logits, d_labels, d_count};
    cuda_free_all(dev, COUNT(dev));
}

/* ---- loss scaler ------------------------------------------------------------------ */

static LossScalerState *dev_scaler(LossScalerState s) {
    LossScalerState *d = dev_bytes(sizeof s);
    upload(d, &s, sizeof s);
    return d;
}

static LossScalerState read_scaler(const LossScalerState *d) {
    LossScalerState s;
    download(&s, d, sizeof s);
    return s;
}

static int same_state(LossScalerState a, LossScalerState b) {
    return a.scale == b.scale && a.good_steps == b.good_steps && a.found_inf == b.found_inf &&
           a.skipped_steps == b.skipped_steps;
}

static void print_state(const char *what, LossScalerState s) {
    fprintf(stderr, "  %s: scale %g good_steps %d found_inf %d skipped_steps %d\n", what, s.scale,
            s.good_steps, s.found_inf, s.skipped_steps);
}

/* Finite values up to the type's largest, subnormals and zeros of both signs. */
static float *finite_gradients(DType dt, size_t n) {
    float *x = host_floats(n);
    float largest = dt == DTYPE_F16 ? 65504.0f : 3.38953139e38f;
    for (size_t i = 0; i < n; i++) x[i] = test_uniform(&rng, -1, 1) * ldexpf(1, (int)(i % 30) - 20);
    x[0] = largest;
    x[n - 1] = -largest;
    if (n > 2) x[1] = -0.0f;
    if (n > 3) x[2] = dt == DTYPE_F16 ? ldexpf(1, -24) : 1e-40f;
    round_to(dt, x, n);
    return x;
}

/* One planted value at 'at', checked on a fresh step; the rest of the state
 * must be left alone. */
static void check_planted(DType dt, void *d_grads, const float *finite, size_t n, size_t at,
                          float planted, LossScalerState *d_state, int want) {
    LossScalerState before = {1024.0f, 17, 1, 3};
    upload(d_state, &before, sizeof before);
    void *one = host_bytes(dtype_size(dt));
    cast_from_f32_cpu(dt, &planted, one, 1);
    upload((char *)d_grads + at * dtype_size(dt), one, dtype_size(dt));
    loss_scaler_begin_step_cuda(d_state, g.compute);
    loss_scaler_check_cuda(d_grads, dt, n, d_state, g.compute);
    LossScalerState after = read_scaler(d_state);
    LossScalerState expect = before;
    expect.found_inf = want;
    CHECK_MSG(same_state(after, expect), "%s check, n=%zu, %g at %zu: found_inf %d, want %d "
              "(scale %g good %d skipped %d)", dtype_name(dt), n, planted, at, after.found_inf,
              want, after.scale, after.good_steps, after.skipped_steps);
    /* put the finite value back */
    cast_from_f32_cpu(dt, &finite[at], one, 1);
    upload((char *)d_grads + at * dtype_size(dt), one, dtype_size(dt));
    free(one);
}

static void test_scaler_check(DType dt, size_t n) {
    printf("loss_scaler_check %s n=%zu\n", dtype_name(dt), n);
    float *finite = finite_gradients(dt, n);
    void *d_grads = dev_values(dt, finite, n);
    LossScalerState *d_state = dev_scaler(loss_scaler_initial(1.0f));
    size_t places[3] = {0, n / 2, n - 1};
    for (int p = 0; p < 3; p++) {
        check_planted(dt, d_grads, finite, n, places[p], finite[places[p]], d_state, 0);
        check_planted(dt, d_grads, finite, n, places[p], INFINITY, d_state, 1);
        check_planted(dt, d_grads, finite, n, places[p], -INFINITY, d_state, 1);
        check_planted(dt, d_grads, finite, n, places[p], NAN, d_state, 1);
    }
    if (dt != DTYPE_F32) /* past the type's range: inf once stored, as a scaled gradient overflows */
        check_planted(dt, d_grads, finite, n, n / 3, dt == DTYPE_F16 ? 1e5f : 3.4028235e38f,
                      d_state, 1);

    /* several checks in one step (one per gradient buffer): a later finite one does not clear it */
    float bad = NAN;
    void *one = host_bytes(dtype_size(dt));
    cast_from_f32_cpu(dt, &bad, one, 1);
    void *d_bad = dev_values(dt, finite, n);
    upload((char *)d_bad + (n / 2) * dtype_size(dt), one, dtype_size(dt));
    loss_scaler_begin_step_cuda(d_state, g.compute);
    loss_scaler_check_cuda(d_bad, dt, n, d_state, g.compute);
    loss_scaler_check_cuda(d_grads, dt, n, d_state, g.compute);
    CHECK_MSG(read_scaler(d_state).found_inf == 1, "%s: a finite buffer cleared found_inf",
              dtype_name(dt));
    loss_scaler_begin_step_cuda(d_state, g.compute);
    CHECK(read_scaler(d_state).found_inf == 0);

    free(finite), free(one);
    void *dev[] = {d_grads, d_state, d_bad};
    cuda_free_all(dev, COUNT(dev));
}

/* Steps of begin, check, update on the device beside the CPU's state machine;
 * which steps overflow follows a fixed random pattern. Only stream work between
 * the comparisons, as in training. */
static void test_scaler_sequence(int steps, int interval, double inf_rate, int compare_every) {
    printf("loss scaler state machine: %d steps, interval %d, inf rate %g\n", steps, interval,
           inf_rate);
    const size_t n = 4099;
    float *finite = finite_gradients(DTYPE_F16, n), *overflow = copy_floats(finite, n);
    overflow[n / 5] = INFINITY;
    void *d_finite = dev_values(DTYPE_F16, finite, n), *d_overflow = dev_values(DTYPE_F16, overflow, n);
    LossScalerState cpu = loss_scaler_initial(LOSS_SCALER_INIT_SCALE);
    LossScalerState *d_state = dev_scaler(cpu);
    int mismatches = 0, skipped = 0, grown = 0;
    for (int step = 1; step <= steps; step++) {
        int bad = test_uniform(&rng, 0, 1) < inf_rate;
        float before = cpu.scale;
        loss_scaler_begin_step_cpu(&cpu);
        loss_scaler_check_cpu(bad ? overflow : finite, n, &cpu);
        loss_scaler_update_cpu(&cpu, LOSS_SCALER_GROWTH, LOSS_SCALER_BACKOFF, interval);
        loss_scaler_begin_step_cuda(d_state, g.compute);
        loss_scaler_check_cuda(bad ? d_overflow : d_finite, DTYPE_F16, n, d_state, g.compute);
        loss_scaler_update_cuda(d_state, LOSS_SCALER_GROWTH, LOSS_SCALER_BACKOFF, interval,
                                g.compute);
        skipped += bad;
        grown += cpu.scale > before;
        if (step % compare_every == 0 || step == steps) {
            LossScalerState dev = read_scaler(d_state);
            if (!same_state(dev, cpu) && mismatches++ < 3) {
                fprintf(stderr, "  step %d:\n", step);
                print_state("device", dev);
                print_state("cpu", cpu);
            }
        }
    }
    printf("  %d skipped, %d growths, final scale %g\n", skipped, grown, cpu.scale);
    CHECK_MSG(mismatches == 0, "device loss scaler left the CPU's state machine %d times", mismatches);
    CHECK(cpu.skipped_steps == skipped);
    free(finite), free(overflow);
    void *dev[] = {d_finite, d_overflow, d_state};
    cuda_free_all(dev, COUNT(dev));
}

/* ---- mixed-precision sgd ------------------------------------------------------------ */

/* grad_dtype f32/f16/bf16, a half copy of weights_dtype or none (DTYPE_F32 here
 * standing for NULL), with or without a scaler. Three steps at changing learning
 * rates, then one with found_inf set. */
static void test_sgd_mixed(DType grad_dtype, DType weights_dtype, int use_scaler, SgdParams p) {
    int with_copy = weights_dtype != DTYPE_F32;
    printf("sgd_step_mixed grads %s, half copy %s, %s, momentum %g wd %g nesterov %d\n",
           dtype_name(grad_dtype), with_copy ? dtype_name(weights_dtype) : "none",
           use_scaler ? "scaler" : "no scaler", p.momentum, p.weight_decay, p.nesterov);
    const size_t n = 1000003;
    float *master = random_values(DTYPE_F32, n, -1, 1), *m = random_values(DTYPE_F32, n, -0.1f, 0.1f);
    float *grad = host_floats(n);
    LossScalerState cpu_state = loss_scaler_initial(use_scaler ? 1024.0f : 1.0f);
    float *d_master = dev_values(DTYPE_F32, master, n), *d_m = dev_values(DTYPE_F32, m, n);
    void *d_grad = dev_elements(grad_dtype, n);
    void *d_half = with_copy ? dev_elements(weights_dtype, n) : NULL;
    if (with_copy) poison(d_half, weights_dtype, n);
    float *d_lr = dev_bytes(sizeof(float));
    LossScalerState *d_state = use_scaler ? dev_scaler(cpu_state) : NULL;
    const float lrs[3] = {0.1f, 0.02f, 0.5f};
    for (int step = 0; step < 3; step++) {
        /* gradients as the backward pass leaves them: scaled, in grad_dtype */
        for (size_t i = 0; i < n; i++) grad[i] = test_uniform(&rng, -1, 1) * cpu_state.scale;
        round_to(grad_dtype, grad, n);
        void *bits = host_bytes(n * dtype_size(grad_dtype));
        cast_from_f32_cpu(grad_dtype, grad, bits, n);
        upload(d_grad, bits, n * dtype_size(grad_dtype));
        free(bits);
        upload(d_lr, &lrs[step], sizeof(float));
        sgd_step_mixed_cpu(master, grad, m, n, &lrs[step], use_scaler ? &cpu_state : NULL, p);
        sgd_step_mixed_cuda(d_master, d_grad, grad_dtype, d_m, d_half, weights_dtype, n, d_lr,
                            d_state, p, g.compute);
    }
    float *gmaster = download_values(DTYPE_F32, d_master, n), *gm = download_values(DTYPE_F32, d_m, n);
    /* the device may fuse multiply-adds: a rounding apart per step */
    check_rel("sgd_mixed master", grad_dtype, gmaster, master, n, 1e-6);
    check_rel("sgd_mixed momentum", grad_dtype, gm, m, n, 1e-5);
    void *half_before = NULL;
    if (with_copy) {
        /* the half copy is the device's own master, rounded */
        half_before = download_bytes(d_half, n * dtype_size(weights_dtype));
        void *want = host_bytes(n * dtype_size(weights_dtype));
        cast_from_f32_cpu(weights_dtype, gmaster, want, n);
        CHECK_MSG(same_bytes(half_before, want, n * dtype_size(weights_dtype)),
                  "sgd_mixed: the %s copy is not the master rounded", dtype_name(weights_dtype));
        free(want);
    }

    if (use_scaler) {
        /* found_inf: nothing moves, bit for bit, even with inf in the gradients */
        LossScalerState skip = cpu_state;
        skip.found_inf = 1;
        upload(d_state, &skip, sizeof skip);
        float bad = INFINITY;
        void *one = host_bytes(dtype_size(grad_dtype));
        cast_from_f32_cpu(grad_dtype, &bad, one, 1);
        upload((char *)d_grad + (n / 2) * dtype_size(grad_dtype), one, dtype_size(grad_dtype));
        free(one);
        sgd_step_mixed_cuda(d_master, d_grad, grad_dtype, d_m, d_half, weights_dtype, n, d_lr,
                            d_state, p, g.compute);
        float *smaster = download_values(DTYPE_F32, d_master, n), *sm = download_values(DTYPE_F32, d_m, n);
        CHECK_MSG(same_bytes(smaster, gmaster, n * sizeof(float)) &&
                      same_bytes(sm, gm, n * sizeof(float)),
                  "sgd_mixed moved the master weights or momentum on a skipped step");
        if (with_copy) {
            void *half_after = download_bytes(d_half, n * dtype_size(weights_dtype));
            CHECK_MSG(same_bytes(half_after, half_before, n * dtype_size(weights_dtype)),
                      "sgd_mixed wrote the half copy on a skipped step");
            free(half_after);
        }
        CHECK_MSG(same_state(read_scaler(d_state), skip), "sgd_mixed changed the scaler state");
        free(smaster), free(sm);
    }

    void *host[] = {master, m, grad, gmaster, gm, half_before};
    free_all(host, COUNT(host));
    void *dev[] = {d_master, d_m, d_grad, d_half, d_lr, d_state};
    cuda_free_all(dev, COUNT(dev));
}

/* ---- a mixed-precision training step, eagerly and as a captured CUDA graph ---- */

/* conv 3->8 (8x8) -> relu in place -> maxpool -> linear 128 -> 10 -> softmax_xent
 * scaled by the loss scaler, backward into half gradients, check, mixed SGD
 * into the fp32 master and its half copy, scaler update: the whole AMP step. */
typedef struct {
    DType dt;
    Conv2dShape conv;
    Pool2dShape pool;
    LinearShape fc;
    Conv2dCuda conv_cuda;
    MaxPoolCuda pool_cuda;
    size_t n_params, conv_w, conv_b, fc_w, fc_b; /* offsets in elements */
    float *master, *momentum, *lr, *loss;
    void *weights, *grads;                      /* dt */
    void *x, *conv_y, *pool_y, *logits;         /* dt */
    void *d_logits, *d_pool_y, *d_conv_y;       /* dt */
    LossScalerState *scaler;
    int32_t *labels;
    void *workspace;
} AmpNet;

#define AMP_BATCH 4
/* Small enough that this net's scaled f16 gradients stay finite (at GradScaler's
 * 65536 they overflow, and the first steps would be skipped). */
#define AMP_NET_SCALE 256.0f
#define AMP_X_COUNT ((size_t)AMP_BATCH * 3 * 8 * 8)
#define AMP_CONV_Y_COUNT ((size_t)AMP_BATCH * 8 * 8 * 8)

static void *at(void *base, DType dt, size_t offset) { return (char *)base + offset * dtype_size(dt); }

static void amp_net_init(AmpNet *t, DType dt) {
    memset(t, 0, sizeof *t);
    t->dt = dt;
    t->conv = (Conv2dShape){.n = AMP_BATCH, .c = 3, .h = 8, .w = 8, .k = 8, .r = 3, .s = 3, .pad = 1, .stride = 1};
    t->pool = (Pool2dShape){.n = AMP_BATCH, .c = 8, .h = 8, .w = 8};
    t->fc = (LinearShape){.n = AMP_BATCH, .in = 8 * 4 * 4, .out = 10};
    conv2d_cuda_init(&t->conv_cuda, g.cudnn, &t->conv, dt, 0, &deterministic_policy);
    maxpool2x2_cuda_init(&t->pool_cuda, &t->pool, dt, 0);
    t->conv_w = 0;
    t->conv_b = t->conv_w + 8 * 3 * 3 * 3;
    t->fc_w = t->conv_b + 8;
    t->fc_b = t->fc_w + 10 * 128;
    t->n_params = t->fc_b + 10;
    t->master = dev_bytes(t->n_params * sizeof(float));
    t->momentum = dev_bytes(t->n_params * sizeof(float));
    t->lr = dev_bytes(sizeof(float));
    t->loss = dev_bytes(sizeof(float));
    t->weights = dev_elements(dt, t->n_params);
    t->grads = dev_elements(dt, t->n_params);
    t->x = dev_elements(dt, AMP_X_COUNT);
    t->conv_y = dev_elements(dt, AMP_CONV_Y_COUNT);
    t->d_conv_y = dev_elements(dt, AMP_CONV_Y_COUNT);
    t->pool_y = dev_elements(dt, AMP_BATCH * 128);
    t->d_pool_y = dev_elements(dt, AMP_BATCH * 128);
    t->logits = dev_elements(dt, AMP_BATCH * 10);
    t->d_logits = dev_elements(dt, AMP_BATCH * 10);
    t->scaler = dev_bytes(sizeof(LossScalerState));
    t->labels = dev_bytes(AMP_BATCH * sizeof(int32_t));
    t->workspace = t->conv_cuda.workspace_bytes ? dev_bytes(t->conv_cuda.workspace_bytes) : NULL;
}

static void amp_net_set_input(AmpNet *t, const float *x) {
    void *bits = host_bytes(AMP_X_COUNT * dtype_size(t->dt));
    cast_from_f32_cpu(t->dt, x, bits, AMP_X_COUNT);
    upload(t->x, bits, AMP_X_COUNT * dtype_size(t->dt));
    free(bits);
}

/* The trainer's start: fp32 master from the host, its half copy made on the device. */
static void amp_net_reset(AmpNet *t, const float *params, const float *x, const int32_t *labels,
                          float lr) {
    upload(t->master, params, t->n_params * sizeof(float));
    cast_from_f32_cuda(t->dt, t->master, t->weights, t->n_params, g.compute);
    amp_net_set_input(t, x);
    upload(t->labels, labels, AMP_BATCH * sizeof(int32_t));
    upload(t->lr, &lr, sizeof lr);
    LossScalerState s = loss_scaler_initial(AMP_NET_SCALE);
    upload(t->scaler, &s, sizeof s);
    CUDA_CHECK(cudaMemsetAsync(t->momentum, 0, t->n_params * sizeof(float), g.compute));
    CUDA_CHECK(cudaStreamSynchronize(g.compute));
}

/* Only stream work: no sync, no allocation, so it can be captured. */
static void amp_net_step(AmpNet *t) {
    DType dt = t->dt;
    void *w = t->weights, *gr = t->grads;
    CUDA_CHECK(cudaMemsetAsync(gr, 0, t->n_params * dtype_size(dt), g.compute));
    loss_scaler_begin_step_cuda(t->scaler, g.compute);
    conv2d_forward_cuda(&t->conv_cuda, g.cudnn, t->x, at(w, dt, t->conv_w), at(w, dt, t->conv_b),
                        t->conv_y, t->workspace);
    relu_forward_cuda(dt, t->conv_y, t->conv_y, AMP_CONV_Y_COUNT, g.compute);
    maxpool2x2_forward_cuda(&t->pool_cuda, g.cudnn, t->conv_y, t->pool_y);
    linear_forward_cuda(g.cublas, g.compute, &t->fc, dt, t->pool_y, at(w, dt, t->fc_w),
                        at(w, dt, t->fc_b), t->logits);
    softmax_xent_cuda(dt, t->logits, t->labels, AMP_BATCH, 10, &t->scaler->scale, t->loss,
                      t->d_logits, g.compute);
    linear_backward_cuda(g.cublas, g.compute, &t->fc, dt, t->pool_y, at(w, dt, t->fc_w),
                         t->d_logits, t->d_pool_y, at(gr, dt, t->fc_w), at(gr, dt, t->fc_b));
    maxpool2x2_backward_cuda(&t->pool_cuda, g.cudnn, t->conv_y, t->pool_y, t->d_pool_y,
                             t->d_conv_y);
    relu_backward_cuda(dt, t->conv_y, t->d_conv_y, t->d_conv_y, AMP_CONV_Y_COUNT, g.compute);
    conv2d_backward_cuda(&t->conv_cuda, g.cudnn, t->x, at(w, dt, t->conv_w), t->d_conv_y, NULL,
                         at(gr, dt, t->conv_w), at(gr, dt, t->conv_b), t->workspace);
    loss_scaler_check_cuda(gr, dt, t->n_params, t->scaler, g.compute);
    SgdParams sgd = {.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1};
    sgd_step_mixed_cuda(t->master, gr, dt, t->momentum, w, dt, t->n_params, t->lr, t->scaler, sgd,
                        g.compute);
    loss_scaler_update_cuda(t->scaler, LOSS_SCALER_GROWTH, LOSS_SCALER_BACKOFF,
                            LOSS_SCALER_INTERVAL, g.compute);
}

static void amp_net_destroy(AmpNet *t) {
    conv2d_cuda_destroy(&t->conv_cuda);
    maxpool2x2_cuda_destroy(&t->pool_cuda);
    void *bufs[] = {t->master, t->momentum, t->lr, t->loss, t->weights, t->grads, t->x,
                    t->conv_y, t->d_conv_y, t->pool_y, t->d_pool_y, t->logits, t->d_logits,
                    t->scaler, t->labels, t->workspace};
    cuda_free_all(bufs, COUNT(bufs));
}

/* The fp32 CPU loss of the forward pass from the master rounded to dt. */
static float amp_net_cpu_loss(const AmpNet *t, const float *params, const float *x,
                              const int32_t *labels) {
    float *w = copy_floats(params, t->n_params), *xr = copy_floats(x, AMP_X_COUNT);
    round_to(t->dt, w, t->n_params);
    round_to(t->dt, xr, AMP_X_COUNT);
    float *conv_y = host_floats(AMP_CONV_Y_COUNT), *pool_y = host_floats(AMP_BATCH * 128);
    float logits[AMP_BATCH * 10], dl[AMP_BATCH * 10], loss;
    conv2d_forward_cpu(&t->conv, xr, w + t->conv_w, w + t->conv_b, conv_y);
    relu_forward_cpu(conv_y, conv_y, AMP_CONV_Y_COUNT);
    maxpool2x2_forward_cpu(&t->pool, conv_y, pool_y);
    linear_forward_cpu(&t->fc, pool_y, w + t->fc_w, w + t->fc_b, logits);
    softmax_xent_cpu(logits, labels, AMP_BATCH, 10, NULL, &loss, dl);
    free(w), free(xr), free(conv_y), free(pool_y);
    return loss;
}

static void test_amp_step(DType dt) {
    printf("mixed-precision training step (%s) captured as a CUDA graph\n", dtype_name(dt));
    AmpNet t;
    amp_net_init(&t, dt);
    size_t np = t.n_params, half_bytes = np * dtype_size(dt);
    float *params = random_values(DTYPE_F32, np, -0.3f, 0.3f);
    float *x = random_values(DTYPE_F32, AMP_X_COUNT, -1, 1);
    int32_t *labels = random_labels(AMP_BATCH, 10);

    /* eager: two steps (the first also warms up the libraries before capture) */
    amp_net_reset(&t, params, x, labels, 0.1f);
    amp_net_step(&t);
    float first_loss;
    download(&first_loss, t.loss, sizeof first_loss);
    float cpu_loss = amp_net_cpu_loss(&t, params, x, labels);
    printf("  %-5s first loss %.6g, fp32 cpu %.6g\n", dtype_name(dt), first_loss, cpu_loss);
    CHECK_MSG(fabsf(first_loss - cpu_loss) <= tol_for(dt, 1e-2, 4e-2) * cpu_loss,
              "%s step loss %g, fp32 cpu %g", dtype_name(dt), first_loss, cpu_loss);
    amp_net_step(&t);
    float *eager = download_values(DTYPE_F32, t.master, np), eager_loss;
    download(&eager_loss, t.loss, sizeof eager_loss);
    LossScalerState eager_state = read_scaler(t.scaler);
    CHECK_MSG(eager_state.scale == AMP_NET_SCALE && eager_state.good_steps == 2 &&
                  eager_state.skipped_steps == 0, "%s: scaler after two finite steps: scale %g "
              "good %d skipped %d", dtype_name(dt), eager_state.scale, eager_state.good_steps,
              eager_state.skipped_steps);
    int moved = memcmp(eager, params, np * sizeof(float)) != 0;
    CHECK_MSG(moved, "%s: two finite steps left the master weights as they were", dtype_name(dt));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(g.compute, cudaStreamCaptureModeGlobal));
    amp_net_step(&t);
    CUDA_CHECK(cudaStreamEndCapture(g.compute, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    amp_net_reset(&t, params, x, labels, 0.1f);
    CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
    CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
    float *graphed = download_values(DTYPE_F32, t.master, np), graph_loss;
    download(&graph_loss, t.loss, sizeof graph_loss);
    check_rel("graph vs eager: master weights after two steps", dt, graphed, eager, np, 1e-6);
    CHECK_MSG(fabsf(graph_loss - eager_loss) <= 1e-6f * (1 + fabsf(eager_loss)),
              "%s graph loss %.9g, eager %.9g", dtype_name(dt), graph_loss, eager_loss);
    CHECK_MSG(isfinite(graph_loss) && graph_loss > 0, "%s graph loss %g", dtype_name(dt), graph_loss);
    CHECK(same_state(read_scaler(t.scaler), eager_state));
    /* the half copy is the master rounded */
    void *weights = download_bytes(t.weights, half_bytes), *want = host_bytes(half_bytes);
    cast_from_f32_cpu(dt, graphed, want, np);
    CHECK_MSG(same_bytes(weights, want, half_bytes), "%s: half weights are not the master rounded",
              dtype_name(dt));

    /* an input with inf: the loss and gradients overflow, and the graph skips the
     * step on the device: weights, momentum and half copy untouched, the scale halved */
    float *momentum = download_values(DTYPE_F32, t.momentum, np);
    float *x_bad = copy_floats(x, AMP_X_COUNT);
    x_bad[AMP_X_COUNT / 2] = INFINITY;
    amp_net_set_input(&t, x_bad);
    CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
    LossScalerState skipped = read_scaler(t.scaler);
    float *master_after = download_values(DTYPE_F32, t.master, np);
    float *momentum_after = download_values(DTYPE_F32, t.momentum, np);
    void *weights_after = download_bytes(t.weights, half_bytes);
    CHECK_MSG(skipped.found_inf == 1 && skipped.skipped_steps == 1 &&
                  skipped.scale == AMP_NET_SCALE * LOSS_SCALER_BACKOFF &&
                  skipped.good_steps == 0, "%s overflow step: found %d skipped %d scale %g good %d",
              dtype_name(dt), skipped.found_inf, skipped.skipped_steps, skipped.scale,
              skipped.good_steps);
    CHECK_MSG(same_bytes(master_after, graphed, np * sizeof(float)) &&
                  same_bytes(momentum_after, momentum, np * sizeof(float)) &&
                  same_bytes(weights_after, weights, half_bytes),
              "%s: the overflowing step changed the weights or momentum", dtype_name(dt));

    /* finite again: the step runs at the new scale */
    amp_net_set_input(&t, x);
    CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
    LossScalerState resumed = read_scaler(t.scaler);
    float *master_resumed = download_values(DTYPE_F32, t.master, np);
    CHECK_MSG(resumed.found_inf == 0 && resumed.good_steps == 1 && resumed.skipped_steps == 1 &&
                  resumed.scale == skipped.scale, "%s after recovery: found %d good %d skipped %d",
              dtype_name(dt), resumed.found_inf, resumed.good_steps, resumed.skipped_steps);
    CHECK_MSG(!same_bytes(master_resumed, graphed, np * sizeof(float)),
              "%s: the step after an overflow did not move the weights", dtype_name(dt));

    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    amp_net_destroy(&t);
    void *host[] = {params, x, labels, eager, graphed, weights, want, momentum, x_bad,
                    master_after, momentum_after, weights_after, master_resumed};
    free_all(host, COUNT(host));
}

int main(void) {
    test_require_gpu();
    rng = test_seed();
    gpu_context_init(&g, 0);

    for (int t = 0; t < 2; t++) {
        DType dt = half_types[t];
        test_cast(dt, 1000);
        test_cast(dt, 5000003); /* more than one grid-stride pass */


        test_maxpool(dt, (Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 0);
        test_maxpool(dt, (Pool2dShape){.n = 3, .c = 5, .h = 6, .w = 10}, 0);
        test_maxpool(dt, (Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 1);
        test_maxpool(dt, (Pool2dShape){.n = 2, .c = 3, .h = 8, .w = 6}, 1);

        /* SimpleNet's three convolutions, then other strides, pads and odd sizes */
        test_conv(dt, (Conv2dShape){.n = 8, .c = 3, .h = 32, .w = 32, .k = 64, .r = 3, .s = 3, .pad = 1, .stride = 1});
        test_conv(dt, (Conv2dShape){.n = 8, .c = 64, .h = 16, .w = 16, .k = 128, .r = 3, .s = 3, .pad = 1, .stride = 1});
        test_conv(dt, (Conv2dShape){.n = 8, .c = 128, .h = 8, .w = 8, .k = 256, .r = 3, .s = 3, .pad = 1, .stride = 1});
        test_conv(dt, (Conv2dShape){.n = 4, .c = 16, .h = 15, .w = 17, .k = 32, .r = 3, .s = 3, .pad = 1, .stride = 2});
        test_conv(dt, (Conv2dShape){.n = 4, .c = 8, .h = 9, .w = 12, .k = 16, .r = 3, .s = 3, .pad = 0, .stride = 2});
        test_conv(dt, (Conv2dShape){.n = 3, .c = 32, .h = 14, .w = 10, .k = 24, .r = 1, .s = 1, .pad = 0, .stride = 1});
        test_conv(dt, (Conv2dShape){.n = 2, .c = 3, .h = 11, .w = 7, .k = 5, .r = 5, .s = 3, .pad = 2, .stride = 1});
        test_conv(dt, (Conv2dShape){.n = 2, .c = 3, .h = 64, .w = 64, .k = 64, .r = 7, .s = 7, .pad = 3, .stride = 2});
        const ConvAlgoPolicy benchmarked = {CONV_WORKSPACE_LIMIT, 0, 0, 1};
        test_conv_with(dt, (Conv2dShape){.n = 8, .c = 64, .h = 16, .w = 16, .k = 128, .r = 3, .s = 3, .pad = 1, .stride = 1}, &benchmarked);
        test_conv_with(dt, (Conv2dShape){.n = 4, .c = 16, .h = 15, .w = 17, .k = 32, .r = 3, .s = 3, .pad = 1, .stride = 2}, &benchmarked);


        test_softmax(dt, 512, 10, 0, 5.0f);
        test_softmax(dt, 100, 1000, 0, 5.0f);
        test_softmax(dt, 37, 3, 0.5f, 5.0f);
        test_softmax(dt, 512, 10, LOSS_SCALER_INIT_SCALE, 5.0f); /* the scaler's first scale */
        test_softmax(dt, 64, 10, 0, 500.0f);                    /* stable at large logits */

        test_accuracy(dt, 512, 10, 0);
        test_accuracy(dt, 512, 10, 1);
        test_accuracy(dt, 1000, 1000, 0);
        test_accuracy(dt, 1, 3, 1);
    }

    const DType check_types[3] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    for (int t = 0; t < 3; t++) {
        test_scaler_check(check_types[t], 1);
        test_scaler_check(check_types[t], 33);
        test_scaler_check(check_types[t], 1000003);
        test_scaler_check(check_types[t], 3000017); /* more than one grid-stride pass */
    }
    test_scaler_sequence(200, 3, 0.2, 1);
    test_scaler_sequence(4500, LOSS_SCALER_INTERVAL, 0.0005, 250);

    SgdParams nesterov = {.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1};
    SgdParams plain = {.momentum = 0.9f, .weight_decay = 0.0f, .nesterov = 0};
    SgdParams no_momentum = {.momentum = 0.0f, .weight_decay = 1e-2f, .nesterov = 0};
    for (int t = 0; t < 3; t++) {
        DType grad_dt = check_types[t];
        test_sgd_mixed(grad_dt, DTYPE_F16, 1, nesterov);
        test_sgd_mixed(grad_dt, DTYPE_BF16, 1, plain);
        test_sgd_mixed(grad_dt, DTYPE_F32, 1, no_momentum); /* no half copy */
    }
    test_sgd_mixed(DTYPE_F32, DTYPE_F32, 0, nesterov); /* fp32, no scaler: plain SGD */
    test_sgd_mixed(DTYPE_F16, DTYPE_F16, 0, plain);

    test_amp_step(DTYPE_F16);
    test_amp_step(DTYPE_BF16);

    gpu_context_destroy(&g);
    return test_finish("test_ops_amp");
}
