/* Gradient-norm clipping: grad_clip_factor's norm and factor, and SGD's
 * grad_mult. The CPU reference is checked against a long-double sum and
 * clip_grad_norm_'s rule; where there is a GPU, the device's norm and factor
 * against the CPU's on the same values (rounded to f32, f16 or bf16 first),
 * the same bits twice, the same result replayed from a CUDA graph, and the
 * clipped SGD steps against the CPU's. Random data each run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cast.h"
#include "ops/grad_norm.h"
#include "ops/loss_scaler.h"
#include "ops/sgd.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/op_buffers.h"

static uint64_t rng;

#define COUNT(a) (sizeof(a) / sizeof *(a))

static float *random_floats(size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, &rng, lo, hi);
    return p;
}

/* ||x|| * inv, summed in long double: an order and a precision of its own. */
static double reference_norm(const float *x, size_t n, double inv) {
    long double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (long double)x[i] * x[i];
    return (double)sqrtl(sum) * inv;
}

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 0 ? fabs(b) : 1); }

/* ---- CPU ------------------------------------------------------------------- */

static void test_norm_cpu(size_t n) {
    printf("grad_clip_factor_cpu n=%zu\n", n);
    float *x = random_floats(n, -1, 1);
    float norm, factor;
    grad_clip_factor_cpu(x, n, 1.0f, 1e30f, &norm, &factor);
    double want = reference_norm(x, n, 1);
    CHECK_MSG(rel(norm, want) <= 1e-6, "norm %.9g, long double %.9g", norm, want);
    CHECK_MSG(factor == 1.0f, "norm %g under clip 1e30: factor %.9g", norm, factor);

    /* above the clip: clip / (norm + 1e-6); the same clip just above the norm: 1 */
    float clip = (float)(want * 0.3);
    grad_clip_factor_cpu(x, n, 1.0f, clip, &norm, &factor);
    CHECK_MSG(rel(factor, clip / (want + 1e-6)) <= 1e-6, "factor %.9g, want %.9g", factor, clip / (want + 1e-6));
    CHECK(factor < 1.0f);
    grad_clip_factor_cpu(x, n, 1.0f, (float)(want * 1.001 + 1e-5), &norm, &factor);
    CHECK_MSG(factor == 1.0f, "clip just above the norm: factor %.9g", factor);

    /* scaled by s and summed over k micro-batches: the norm and factor of x */
    const float s = 1024.0f, k = 3.0f;
    float *scaled = host_floats(n);
    for (size_t i = 0; i < n; i++) scaled[i] = x[i] * s * k;
    float norm_s, factor_s;
    grad_clip_factor_cpu(scaled, n, 1.0f / (s * k), clip, &norm_s, &factor_s);
    double want_s = reference_norm(scaled, n, 1.0 / (s * k));
    CHECK_MSG(rel(norm_s, want_s) <= 1e-6 && rel(norm_s, want) <= 1e-6,
              "scale %g x accumulate %g: norm %.9g, want %.9g (unscaled %.9g)", s, k, norm_s, want_s, want);
    CHECK_MSG(rel(factor_s, clip / (want + 1e-6)) <= 1e-6,
              "scale %g x accumulate %g: factor %.9g", s, k, factor_s);
    free(x), free(scaled);
}

static void test_factor_edges_cpu(void) {
    printf("grad_clip_factor_cpu: zero, inf, NaN, huge\n");
    float x[5] = {0, 0, 0, 0, 0}, norm, factor;
    grad_clip_factor_cpu(x, 5, 1.0f, 1.0f, &norm, &factor);
    CHECK(norm == 0.0f && factor == 1.0f);
    grad_clip_factor_cpu(x, 0, 1.0f, 1.0f, &norm, &factor);
    CHECK(norm == 0.0f && factor == 1.0f);
    x[2] = INFINITY;
    grad_clip_factor_cpu(x, 5, 1.0f, 1.0f, &norm, &factor);
    CHECK_MSG(isinf(norm) && factor == 1.0f, "inf gradient: norm %g factor %g", norm, factor);
    x[2] = NAN;
    grad_clip_factor_cpu(x, 5, 1.0f, 1.0f, &norm, &factor);
    CHECK_MSG(isnan(norm) && factor == 1.0f, "NaN gradient: norm %g factor %g", norm, factor);
    /* finite, and a float square would overflow: still a finite norm, still clipped */
    x[2] = 3e30f;
    x[3] = -4e30f;
    grad_clip_factor_cpu(x, 5, 1.0f, 1.0f, &norm, &factor);
    CHECK_MSG(rel(norm, 5e30) <= 1e-6 && factor > 0 && rel(factor, 2e-31) <= 1e-6,
              "huge gradient: norm %g factor %g", norm, factor);
}

/* SGD on grad with grad_mult = &c is SGD on the gradient already multiplied
 * (rounded once), bit for bit; grad_mult = &1 is grad_mult NULL. */
static void test_sgd_grad_mult_cpu(SgdParams p, size_t n) {
    printf("sgd grad_mult (cpu) momentum %g wd %g nesterov %d mask %d\n", p.momentum, p.weight_decay,
           p.nesterov, p.decay_mask != NULL);
    float *w = random_floats(n, -1, 1), *m = random_floats(n, -0.1f, 0.1f), *grad = random_floats(n, -1, 1);
    float c = 0.3127f, one = 1.0f, lr = 0.05f;
    float *pre = host_floats(n);
    for (size_t i = 0; i < n; i++) pre[i] = grad[i] * c;

    /* sgd_step_cpu */
    float *w1 = copy_floats(w, n), *m1 = copy_floats(m, n), *w2 = copy_floats(w, n), *m2 = copy_floats(m, n);
    SgdParams clipped = p, plain = p;
    clipped.grad_mult = &c;
    plain.grad_mult = NULL;
    sgd_step_cpu(w1, grad, m1, n, &lr, clipped);
    sgd_step_cpu(w2, pre, m2, n, &lr, plain);
    CHECK_MSG(!memcmp(w1, w2, n * sizeof(float)) && !memcmp(m1, m2, n * sizeof(float)),
              "sgd_step_cpu with grad_mult differs from the pre-multiplied gradient");
    memcpy(w1, w, n * sizeof(float)), memcpy(m1, m, n * sizeof(float));
    memcpy(w2, w, n * sizeof(float)), memcpy(m2, m, n * sizeof(float));
    clipped.grad_mult = &one;
    sgd_step_cpu(w1, grad, m1, n, &lr, clipped);
    sgd_step_cpu(w2, grad, m2, n, &lr, plain);
    CHECK_MSG(!memcmp(w1, w2, n * sizeof(float)) && !memcmp(m1, m2, n * sizeof(float)),
              "sgd_step_cpu with grad_mult 1 differs from grad_mult NULL");

    /* sgd_step_mixed_cpu: unscaled first (rounded), then multiplied (rounded) */
    LossScalerState state = loss_scaler_initial(1024.0f);
    float *scaled = host_floats(n), *pre_mixed = host_floats(n);
    for (size_t i = 0; i < n; i++) {
        scaled[i] = grad[i] * 1024.0f * 3.0f;
        float unscaled = scaled[i] * (1.0f / 1024.0f);
        pre_mixed[i] = unscaled * c;
    }
    memcpy(w1, w, n * sizeof(float)), memcpy(m1, m, n * sizeof(float));
    memcpy(w2, w, n * sizeof(float)), memcpy(m2, m, n * sizeof(float));
    clipped.grad_mult = &c;
    sgd_step_mixed_cpu(w1, scaled, m1, n, &lr, &state, clipped);
    sgd_step_mixed_cpu(w2, pre_mixed, m2, n, &lr, NULL, plain);
    CHECK_MSG(!memcmp(w1, w2, n * sizeof(float)) && !memcmp(m1, m2, n * sizeof(float)),
              "sgd_step_mixed_cpu with grad_mult differs from the pre-multiplied gradient");
    /* a skipped step stays skipped */
    state.found_inf = 1;
    sgd_step_mixed_cpu(w1, scaled, m1, n, &lr, &state, clipped);
    CHECK(!memcmp(w1, w2, n * sizeof(float)) && !memcmp(m1, m2, n * sizeof(float)));
    void *host[] = {w, m, grad, pre, w1, m1, w2, m2, scaled, pre_mixed};
    for (size_t i = 0; i < COUNT(host); i++) free(host[i]);
}

/* ---- GPU (a build without CUDA runs the CPU checks alone) ------------------- */
#if TRAINC_CUDA
static GpuContext g;

static void upload(void *dst, const void *src, size_t bytes) { upload_on(g.compute, dst, src, bytes); }
static void download(void *dst, const void *src, size_t bytes) { download_on(g.compute, dst, src, bytes); }

/* A device buffer of n elements of dt holding host's values (already rounded to dt). */
static void *dev_values(DType dt, const float *host, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    cast_from_f32_cpu(dt, host, bits, n);
    void *p = dev_bytes(n * dtype_size(dt));
    upload(p, bits, n * dtype_size(dt));
    free(bits);
    return p;
}

static void set_values(DType dt, void *dev, const float *host, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    cast_from_f32_cpu(dt, host, bits, n);
    upload(dev, bits, n * dtype_size(dt));
    free(bits);
}

/* Device results: norm, factor. */
typedef struct {
    float norm, factor;
} Clip;

typedef struct {
    void *scratch;
    float *out; /* norm, factor */
    LossScalerState *scaler;
} ClipBuffers;

static ClipBuffers clip_buffers(size_t n, float scale) {
    ClipBuffers b;
    b.scratch = grad_norm_scratch_bytes(n) ? dev_bytes(grad_norm_scratch_bytes(n)) : NULL;
    b.out = dev_bytes(2 * sizeof(float));
    b.scaler = dev_bytes(sizeof(LossScalerState));
    LossScalerState s = loss_scaler_initial(scale);
    upload(b.scaler, &s, sizeof s);
    return b;
}

static void clip_buffers_free(ClipBuffers *b) {
    if (b->scratch) CUDA_CHECK(cudaFree(b->scratch));
    CUDA_CHECK(cudaFree(b->out));
    CUDA_CHECK(cudaFree(b->scaler));
}

static void launch_clip(const ClipBuffers *b, const void *grads, DType dt, size_t n, float k, float clip) {
    grad_clip_factor_cuda(grads, dt, n, b->scaler, 1.0f / k, clip, b->scratch, &b->out[0], &b->out[1], g.compute);
}

static Clip read_clip(const ClipBuffers *b) {
    Clip c;
    float both[2];
    download(both, b->out, sizeof both);
    c.norm = both[0];
    c.factor = both[1];
    return c;
}

static Clip run_clip(const ClipBuffers *b, const void *grads, DType dt, size_t n, float k, float clip) {
    CUDA_CHECK(cudaMemsetAsync(b->out, 0xff, 2 * sizeof(float), g.compute)); /* NaN: unwritten shows */
    launch_clip(b, grads, dt, n, k, clip);
    return read_clip(b);
}

/* Gradients as backward leaves them: g x s x k, rounded to dt; *unrounded
 * (unless NULL) gets them before the rounding. */
static float *scaled_gradients(DType dt, size_t n, float s, float k, float **unrounded) {
    float *x = random_floats(n, -1, 1);
    for (size_t i = 0; i < n; i++) x[i] *= s * k;
    if (unrounded) *unrounded = copy_floats(x, n);
    round_to(dt, x, n);
    return x;
}

static void test_norm_gpu(DType dt, size_t n) {
    const float s = dt == DTYPE_F32 ? 1.0f : 1024.0f, k = 3.0f;
    printf("grad_clip_factor_cuda %s n=%zu scale %g accumulate %g\n", dtype_name(dt), n, s, k);
    float *exact;
    float *x = scaled_gradients(dt, n, s, k, &exact);
    void *d_x = dev_values(dt, x, n);
    ClipBuffers b = clip_buffers(n, s);
    float cpu_norm, cpu_factor;
    grad_clip_factor_cpu(x, n, 1.0f / (s * k), 1e30f, &cpu_norm, &cpu_factor);

    /* the same values in double on both sides: only the order of the sum differs */
    Clip c = run_clip(&b, d_x, dt, n, k, 1e30f);
    printf("  norm %.9g (cpu %.9g) factor %.9g\n", c.norm, cpu_norm, c.factor);
    CHECK_MSG(rel(c.norm, cpu_norm) <= 1e-6, "%s n=%zu: norm %.9g, cpu %.9g", dtype_name(dt), n, c.norm, cpu_norm);
    CHECK_MSG(c.factor == 1.0f, "%s: factor %.9g under a huge clip", dtype_name(dt), c.factor);
    /* and it is the norm of g before the rounding to dt, up to that rounding's
     * relative error: the unit roundoff, 2^-11 in f16 (11 significant bits) and
     * 2^-8 in bf16 (8), reached when n = 1 */
    double ulp = dt == DTYPE_F16 ? 4.9e-4 : dt == DTYPE_BF16 ? 3.91e-3 : 6e-8;
    double want = reference_norm(exact, n, 1.0 / (s * k));
    CHECK_MSG(rel(c.norm, want) <= ulp + 1e-6, "%s: norm %.9g, long double %.9g", dtype_name(dt), c.norm, want);

    /* clipping: factor clip / (norm + 1e-6) as the CPU has it; same bits twice */
    float clip = cpu_norm * 0.25f;
    grad_clip_factor_cpu(x, n, 1.0f / (s * k), clip, &cpu_norm, &cpu_factor);
    Clip first = run_clip(&b, d_x, dt, n, k, clip), again = run_clip(&b, d_x, dt, n, k, clip);
    CHECK_MSG(rel(first.factor, cpu_factor) <= 2e-6 && first.factor < 1.0f, "%s: factor %.9g, cpu %.9g",
              dtype_name(dt), first.factor, cpu_factor);
    CHECK_MSG(!memcmp(&first, &again, sizeof first), "%s n=%zu: two runs differ: norm %.9g / %.9g",
              dtype_name(dt), n, first.norm, again.norm);

    /* inf and NaN: factor 1, the norm not finite */
    if (n > 1) {
        const float bad_values[2] = {INFINITY, NAN};
        for (int v = 0; v < 2; v++) {
            float *bad = copy_floats(x, n);
            bad[n / 2] = bad_values[v];
            void *d_bad = dev_values(dt, bad, n);
            Clip cb = run_clip(&b, d_bad, dt, n, k, clip);
            CHECK_MSG(!isfinite(cb.norm) && cb.factor == 1.0f, "%s %s gradient: norm %g factor %g",
                      dtype_name(dt), v ? "NaN" : "inf", cb.norm, cb.factor);
            CUDA_CHECK(cudaFree(d_bad));
            free(bad);
        }
    }
    CUDA_CHECK(cudaFree(d_x));
    clip_buffers_free(&b);
    free(x), free(exact);
}

/* Captured once, replayed on new gradients and a new loss scale: the eager
 * result for those, bit for bit. */
static void test_graph_gpu(DType dt, size_t n) {
    printf("grad_clip_factor_cuda %s n=%zu captured in a CUDA graph\n", dtype_name(dt), n);
    const float k = 2.0f;
    float *x = scaled_gradients(dt, n, 256.0f, k, NULL);
    void *d_x = dev_values(dt, x, n);
    ClipBuffers b = clip_buffers(n, 256.0f);
    float clip = 0.05f;
    run_clip(&b, d_x, dt, n, k, clip); /* eager first, as the trainer warms up */

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(g.compute, cudaStreamCaptureModeGlobal));
    launch_clip(&b, d_x, dt, n, k, clip);
    CUDA_CHECK(cudaStreamEndCapture(g.compute, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    for (int replay = 0; replay < 2; replay++) {
        float scale = replay ? 512.0f : 256.0f;
        float *y = scaled_gradients(dt, n, scale, k, NULL);
        set_values(dt, d_x, y, n);
        LossScalerState st = loss_scaler_initial(scale);
        upload(b.scaler, &st, sizeof st);
        CUDA_CHECK(cudaMemsetAsync(b.out, 0xff, 2 * sizeof(float), g.compute));
        CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
        Clip graphed = read_clip(&b);
        Clip eager = run_clip(&b, d_x, dt, n, k, clip);
        float cpu_norm, cpu_factor;
        grad_clip_factor_cpu(y, n, 1.0f / (scale * k), clip, &cpu_norm, &cpu_factor);
        CHECK_MSG(!memcmp(&graphed, &eager, sizeof eager), "%s replay %d: norm %.9g factor %.9g, eager %.9g %.9g",
                  dtype_name(dt), replay, graphed.norm, graphed.factor, eager.norm, eager.factor);
        CHECK_MSG(rel(graphed.norm, cpu_norm) <= 1e-6, "%s replay %d at scale %g: norm %.9g, cpu %.9g",
                  dtype_name(dt), replay, scale, graphed.norm, cpu_norm);
        free(y);
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaFree(d_x));
    clip_buffers_free(&b);
    free(x);
}

static void test_empty_gpu(void) {
    printf("grad_clip_factor_cuda n=0\n");
    ClipBuffers b = clip_buffers(0, 1.0f);
    Clip c = run_clip(&b, NULL, DTYPE_F32, 0, 1.0f, 1.0f);
    CHECK_MSG(c.norm == 0.0f && c.factor == 1.0f, "n=0: norm %g factor %g", c.norm, c.factor);
    clip_buffers_free(&b);
}

/* The device's factor fed to both SGD steps through grad_mult, against the
 * CPU's steps with the CPU's factor: a rounding apart per step (fused
 * multiply-adds); grad_mult pointing at 1 is NULL bit for bit. */
static void test_sgd_grad_mult_gpu(DType dt, size_t n, SgdParams p) {
    printf("sgd grad_mult (cuda) grads %s n=%zu momentum %g wd %g nesterov %d\n", dtype_name(dt), n, p.momentum,
           p.weight_decay, p.nesterov);
    const float s = dt == DTYPE_F32 ? 1.0f : 1024.0f, k = 2.0f, lr = 0.05f;
    float *x = scaled_gradients(dt, n, s, k, NULL);
    float *w = random_floats(n, -1, 1), *m = random_floats(n, -0.1f, 0.1f);
    void *d_x = dev_values(dt, x, n);
    float *d_w = dev_values(DTYPE_F32, w, n), *d_m = dev_values(DTYPE_F32, m, n);
    float *d_lr = dev_values(DTYPE_F32, &lr, 1);
    ClipBuffers b = clip_buffers(n, s);
    float cpu_norm, cpu_factor;
    grad_clip_factor_cpu(x, n, 1.0f / (s * k), 0.1f, &cpu_norm, &cpu_factor);
    Clip c = run_clip(&b, d_x, dt, n, k, 0.1f);
    CHECK(c.factor < 1.0f && rel(c.factor, cpu_factor) <= 2e-6);

    LossScalerState state = loss_scaler_initial(s);
    SgdParams pc = p;
    pc.grad_mult = &c.factor; /* the device's factor, so both sides multiply by the same float */
    sgd_step_mixed_cpu(w, x, m, n, &lr, &state, pc);
    pc.grad_mult = &b.out[1];
    sgd_step_mixed_cuda(d_w, d_x, dt, d_m, NULL, DTYPE_F32, n, d_lr, b.scaler, pc, g.compute);
    float *gw = host_floats(n), *gm = host_floats(n);
    download(gw, d_w, n * sizeof(float));
    download(gm, d_m, n * sizeof(float));
    double ew = test_rel_error(gw, w, n), em = test_rel_error(gm, m, n);
    printf("  sgd_step_mixed: master rel err %.2e, momentum %.2e\n", ew, em);
    CHECK_MSG(ew <= 1e-6 && em <= 1e-5, "%s sgd_step_mixed with grad_mult: rel err %.3g / %.3g", dtype_name(dt),
              ew, em);

    if (dt == DTYPE_F32) {
        /* sgd_step: the plain fp32 step on unscaled gradients */
        float *gx = host_floats(n);
        for (size_t i = 0; i < n; i++) gx[i] = x[i] / k;
        upload(d_x, gx, n * sizeof(float));
        upload(d_w, w, n * sizeof(float));
        upload(d_m, m, n * sizeof(float));
        pc.grad_mult = &c.factor;
        sgd_step_cpu(w, gx, m, n, &lr, pc);
        pc.grad_mult = &b.out[1];
        sgd_step_cuda(d_w, d_x, d_m, n, d_lr, pc, g.compute);
        download(gw, d_w, n * sizeof(float));
        download(gm, d_m, n * sizeof(float));
        ew = test_rel_error(gw, w, n), em = test_rel_error(gm, m, n);
        printf("  sgd_step: weights rel err %.2e, momentum %.2e\n", ew, em);
        CHECK_MSG(ew <= 1e-6 && em <= 1e-5, "sgd_step with grad_mult: rel err %.3g / %.3g", ew, em);

        /* grad_mult at 1 on the device: NULL's bits */
        float one = 1.0f;
        upload(&b.out[1], &one, sizeof one);
        float *w2 = host_floats(n), *m2 = host_floats(n);
        float *d_w2 = dev_values(DTYPE_F32, w, n), *d_m2 = dev_values(DTYPE_F32, m, n);
        upload(d_w, w, n * sizeof(float));
        upload(d_m, m, n * sizeof(float));
        sgd_step_cuda(d_w, d_x, d_m, n, d_lr, pc, g.compute);
        pc.grad_mult = NULL;
        sgd_step_cuda(d_w2, d_x, d_m2, n, d_lr, pc, g.compute);
        download(gw, d_w, n * sizeof(float));
        download(w2, d_w2, n * sizeof(float));
        download(gm, d_m, n * sizeof(float));
        download(m2, d_m2, n * sizeof(float));
        CHECK_MSG(!memcmp(gw, w2, n * sizeof(float)) && !memcmp(gm, m2, n * sizeof(float)),
                  "sgd_step_cuda: grad_mult 1 differs from NULL");
        void *dev[] = {d_w2, d_m2};
        for (size_t i = 0; i < COUNT(dev); i++) CUDA_CHECK(cudaFree(dev[i]));
        free(gx), free(w2), free(m2);
    }
    void *dev[] = {d_x, d_w, d_m, d_lr};
    for (size_t i = 0; i < COUNT(dev); i++) CUDA_CHECK(cudaFree(dev[i]));
    clip_buffers_free(&b);
    free(x), free(w), free(m), free(gw), free(gm);
}

static void run_gpu_tests(void) {
    gpu_context_init(&g, 0);
    const DType types[3] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    for (int t = 0; t < 3; t++) {
        test_norm_gpu(types[t], 1);
        test_norm_gpu(types[t], 1000);
        test_norm_gpu(types[t], 1000003);
        test_norm_gpu(types[t], 5000011); /* more than one grid-stride pass */
        test_graph_gpu(types[t], 300007);
        test_sgd_grad_mult_gpu(types[t], 1000003, (SgdParams){.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1});
    }
    test_sgd_grad_mult_gpu(DTYPE_F32, 7, (SgdParams){.momentum = 0.0f, .weight_decay = 1e-2f, .nesterov = 0});
    test_empty_gpu();
    gpu_context_destroy(&g);
}
#endif

int main(void) {
    rng = test_seed();
    test_norm_cpu(1);
    test_norm_cpu(1000);
    test_norm_cpu(1000003);
    test_factor_edges_cpu();
    size_t n = 10007;
    uint8_t *mask = host_bytes(n);
    for (size_t i = 0; i < n; i++) mask[i] = i % 3 != 0;
    test_sgd_grad_mult_cpu((SgdParams){.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1}, n);
    test_sgd_grad_mult_cpu((SgdParams){.momentum = 0.0f, .weight_decay = 1e-2f, .nesterov = 0}, n);
    test_sgd_grad_mult_cpu((SgdParams){.momentum = 0.9f, .weight_decay = 5e-2f, .nesterov = 1, .decay_mask = mask}, n);
    free(mask);

    if (test_have_gpu()) {
        GPU_ONLY(run_gpu_tests());
    } else {
        printf("no GPU: GPU checks skipped\n");
    }
    return test_finish("test_ops_clip");
}
