/* Gradient-norm clipping (ops/grad_norm.h): the norm and factor through the
 * face against the CPU's on the same values (gradients scaled by the loss
 * scale s and summed over k micro-batches, rounded to the case's dtype) and
 * against a long-double sum of the unrounded ones; the same bits twice; inf
 * and NaN giving factor 1; n = 0. On the GPU, a CUDA graph replayed on new
 * gradients and a new scale gives the eager result bit for bit, and the
 * device's factor fed to SGD through grad_mult (both steps) matches the CPU.
 * On the CPU: clip_grad_norm_'s rule at and around the clip, huge and
 * non-finite gradients, and SGD's grad_mult bit for bit against the
 * pre-multiplied gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/grad_norm.h"
#include "ops/loss_scaler.h"
#include "ops/sgd.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

/* ||x|| * inv, summed in long double: an order and a precision of its own. */
static double reference_norm(const float *x, size_t n, double inv) {
    long double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (long double)x[i] * x[i];
    return (double)sqrtl(sum) * inv;
}

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 0 ? fabs(b) : 1); }

/* ---- the face on either device --------------------------------------------------- */

typedef struct {
    float norm, factor;
} Clip;

/* Where the face writes: scratch, norm and factor, the scaler's state. */
typedef struct {
    void *scratch;
    float *out; /* norm, factor */
    LossScalerState *scaler;
} ClipBuffers;

static ClipBuffers clip_buffers(const GridCase *c, size_t n, float scale) {
    ClipBuffers b;
    size_t bytes = grad_clip_scratch_bytes(&c->ctx, n);
    b.scratch = bytes ? dev_bytes(bytes) : NULL;
    b.out = grid_alloc(c, DTYPE_F32, 2);
    LossScalerState s = loss_scaler_initial(scale);
    b.scaler = grid_put_bytes(c, &s, sizeof s);
    return b;
}

static void clip_buffers_free(const GridCase *c, ClipBuffers *b) {
    void *dev[] = {b->scratch, b->out, b->scaler};
    grid_free_all(c, dev, GRID_COUNT(dev));
}

static void launch_clip(const GridCase *c, const ClipBuffers *b, const void *grads, size_t n, float k, float clip) {
    grad_clip_factor(&c->ctx, grads, n, b->scaler, 1.0f / k, clip, b->scratch, &b->out[0], &b->out[1]);
}

static Clip read_clip(const GridCase *c, const ClipBuffers *b) {
    float *both = grid_get(c, DTYPE_F32, b->out, 2);
    Clip r = {both[0], both[1]};
    free(both);
    return r;
}

static Clip run_clip(const GridCase *c, const ClipBuffers *b, const void *grads, size_t n, float k, float clip) {
    grid_poison(c, DTYPE_F32, b->out, 2); /* NaN: unwritten shows */
    launch_clip(c, b, grads, n, k, clip);
    return read_clip(c, b);
}

/* Gradients as backward leaves them: g x s x k, rounded to the case's dtype;
 * *unrounded (unless NULL) gets them before the rounding. */
static float *scaled_gradients(const GridCase *c, size_t n, float s, float k, float **unrounded) {
    float *x = grid_random(c, DTYPE_F32, n, -1, 1);
    for (size_t i = 0; i < n; i++) x[i] *= s * k;
    if (unrounded) *unrounded = copy_floats(x, n);
    round_to(c->dtype, x, n);
    return x;
}

static void norm_size(const GridCase *c, size_t n) {
    DType dt = c->dtype;
    const float s = dt == DTYPE_F32 ? 1.0f : 1024.0f, k = 3.0f;
    printf(" n=%zu scale %g accumulate %g\n", n, s, k);
    float *exact;
    float *x = scaled_gradients(c, n, s, k, &exact);
    void *d_x = grid_put(c, dt, x, n);
    ClipBuffers b = clip_buffers(c, n, s);
    float cpu_norm, cpu_factor;
    grad_clip_factor_cpu(x, n, 1.0f / (s * k), 1e30f, &cpu_norm, &cpu_factor);

    /* the same values in double on both sides: only the order of the sum differs */
    Clip r = run_clip(c, &b, d_x, n, k, 1e30f);
    printf("  %-20s norm %.9g (cpu %.9g) factor %.9g\n", c->name, r.norm, cpu_norm, r.factor);
    CHECK_MSG(rel(r.norm, cpu_norm) <= 1e-6, "%s n=%zu: norm %.9g, cpu %.9g", c->name, n, r.norm, cpu_norm);
    CHECK_MSG(r.factor == 1.0f, "%s: factor %.9g under a huge clip", c->name, r.factor);
    /* and it is the norm of g before the rounding to dt, up to that rounding's
     * relative error: the unit roundoff, 2^-11 in f16 (11 significant bits) and
     * 2^-8 in bf16 (8), reached when n = 1 */
    double ulp = dt == DTYPE_F16 ? 4.9e-4 : dt == DTYPE_BF16 ? 3.91e-3 : 6e-8;
    double want = reference_norm(exact, n, 1.0 / (s * k));
    CHECK_MSG(rel(r.norm, want) <= ulp + 1e-6, "%s: norm %.9g, long double %.9g", c->name, r.norm, want);

    /* clipping: factor clip / (norm + 1e-6) as the CPU has it; the same bits twice */
    float clip = cpu_norm * 0.25f;
    grad_clip_factor_cpu(x, n, 1.0f / (s * k), clip, &cpu_norm, &cpu_factor);
    Clip first = run_clip(c, &b, d_x, n, k, clip), again = run_clip(c, &b, d_x, n, k, clip);
    CHECK_MSG(rel(first.factor, cpu_factor) <= 2e-6 && first.factor < 1.0f, "%s: factor %.9g, cpu %.9g", c->name,
              first.factor, cpu_factor);
    CHECK_MSG(!memcmp(&first, &again, sizeof first), "%s n=%zu: two runs differ: norm %.9g / %.9g", c->name, n,
              first.norm, again.norm);

    /* inf and NaN: factor 1, the norm not finite */
    if (n > 1) {
        const float bad_values[2] = {INFINITY, NAN};
        for (int v = 0; v < 2; v++) {
            float *bad = copy_floats(x, n);
            bad[n / 2] = bad_values[v];
            void *d_bad = grid_put(c, dt, bad, n);
            Clip cb = run_clip(c, &b, d_bad, n, k, clip);
            CHECK_MSG(!isfinite(cb.norm) && cb.factor == 1.0f, "%s %s gradient: norm %g factor %g", c->name,
                      v ? "NaN" : "inf", cb.norm, cb.factor);
            grid_free(c, d_bad);
            free(bad);
        }
    }
    grid_free(c, d_x);
    clip_buffers_free(c, &b);
    free(x), free(exact);
}

static void norm_empty(const GridCase *c) {
    printf(" n=0\n");
    ClipBuffers b = clip_buffers(c, 0, 1.0f);
    Clip r = run_clip(c, &b, NULL, 0, 1.0f, 1.0f);
    CHECK_MSG(r.norm == 0.0f && r.factor == 1.0f, "%s n=0: norm %g factor %g", c->name, r.norm, r.factor);
    clip_buffers_free(c, &b);
}

/* Captured once, replayed on new gradients and a new loss scale: the eager
 * result for those, bit for bit (GPU). */
static void norm_graph(const GridCase *c, size_t n) {
    printf(" n=%zu captured in a CUDA graph\n", n);
    const float k = 2.0f, clip = 0.05f;
    DType dt = c->dtype;
    float *x = scaled_gradients(c, n, 256.0f, k, NULL);
    void *d_x = grid_put(c, dt, x, n);
    ClipBuffers b = clip_buffers(c, n, 256.0f);
    run_clip(c, &b, d_x, n, k, clip); /* eager first, as the trainer warms up */
    gpu_capture_begin(c->ctx.stream);
    launch_clip(c, &b, d_x, n, k, clip);
    cudaGraphExec_t graph = gpu_capture_end(c->ctx.stream, 0);
    for (int replay = 0; replay < 2; replay++) {
        float scale = replay ? 512.0f : 256.0f;
        float *y = scaled_gradients(c, n, scale, k, NULL);
        grid_set(c, dt, d_x, y, n);
        LossScalerState st = loss_scaler_initial(scale);
        op_copy_from_host(&c->ctx, b.scaler, &st, sizeof st);
        grid_poison(c, DTYPE_F32, b.out, 2);
        gpu_graph_launch(graph, c->ctx.stream);
        Clip graphed = read_clip(c, &b), eager = run_clip(c, &b, d_x, n, k, clip);
        float cpu_norm, cpu_factor;
        grad_clip_factor_cpu(y, n, 1.0f / (scale * k), clip, &cpu_norm, &cpu_factor);
        CHECK_MSG(!memcmp(&graphed, &eager, sizeof eager), "%s replay %d: norm %.9g factor %.9g, eager %.9g %.9g",
                  c->name, replay, graphed.norm, graphed.factor, eager.norm, eager.factor);
        CHECK_MSG(rel(graphed.norm, cpu_norm) <= 1e-6, "%s replay %d at scale %g: norm %.9g, cpu %.9g", c->name,
                  replay, scale, graphed.norm, cpu_norm);
        free(y);
    }
    gpu_graph_destroy(graph);
    grid_free(c, d_x);
    clip_buffers_free(c, &b);
    free(x);
}

/* The device's factor fed to both SGD steps through grad_mult, against the
 * CPU's steps with that factor: a rounding apart per step (fused
 * multiply-adds); grad_mult pointing at 1 is NULL bit for bit (GPU). */
static void norm_sgd(const GridCase *c, size_t n, SgdParams p) {
    printf(" sgd grad_mult n=%zu momentum %g wd %g nesterov %d\n", n, p.momentum, p.weight_decay, p.nesterov);
    DType dt = c->dtype;
    const float s = dt == DTYPE_F32 ? 1.0f : 1024.0f, k = 2.0f, lr = 0.05f;
    float *x = scaled_gradients(c, n, s, k, NULL);
    float *w = grid_random(c, DTYPE_F32, n, -1, 1), *m = grid_random(c, DTYPE_F32, n, -0.1f, 0.1f);
    void *d_x = grid_put(c, dt, x, n);
    float *d_w = grid_put(c, DTYPE_F32, w, n), *d_m = grid_put(c, DTYPE_F32, m, n);
    float *d_lr = grid_put(c, DTYPE_F32, &lr, 1);
    ClipBuffers b = clip_buffers(c, n, s);
    float cpu_norm, cpu_factor;
    grad_clip_factor_cpu(x, n, 1.0f / (s * k), 0.1f, &cpu_norm, &cpu_factor);
    Clip r = run_clip(c, &b, d_x, n, k, 0.1f);
    CHECK(r.factor < 1.0f && rel(r.factor, cpu_factor) <= 2e-6);

    LossScalerState state = loss_scaler_initial(s);
    SgdParams pc = p;
    pc.grad_mult = &r.factor; /* the device's factor, so both sides multiply by the same float */
    sgd_step_mixed_cpu(w, x, m, n, &lr, &state, pc);
    pc.grad_mult = &b.out[1];
    sgd_step_mixed(&c->ctx, d_w, d_x, d_m, NULL, n, d_lr, b.scaler, pc);
    float *gw = grid_get(c, DTYPE_F32, d_w, n), *gm = grid_get(c, DTYPE_F32, d_m, n);
    grid_check(c, "sgd_step_mixed master (grad_mult)", gw, w, n, 1e-6);
    grid_check(c, "sgd_step_mixed momentum (grad_mult)", gm, m, n, 1e-5);
    free(gw), free(gm);

    if (dt == DTYPE_F32) { /* sgd_step: the plain fp32 step on unscaled gradients */
        float *gx = host_floats(n);
        for (size_t i = 0; i < n; i++) gx[i] = x[i] / k;
        grid_set(c, DTYPE_F32, d_x, gx, n);
        grid_set(c, DTYPE_F32, d_w, w, n);
        grid_set(c, DTYPE_F32, d_m, m, n);
        pc.grad_mult = &r.factor;
        sgd_step_cpu(w, gx, m, n, &lr, pc);
        pc.grad_mult = &b.out[1];
        GPU_ONLY(sgd_step_cuda(d_w, d_x, d_m, n, d_lr, pc, c->ctx.stream));
        gw = grid_get(c, DTYPE_F32, d_w, n), gm = grid_get(c, DTYPE_F32, d_m, n);
        grid_check(c, "sgd_step weights (grad_mult)", gw, w, n, 1e-6);
        grid_check(c, "sgd_step momentum (grad_mult)", gm, m, n, 1e-5);
        free(gw), free(gm);

        /* grad_mult at 1 on the device: NULL's bits */
        float one = 1.0f;
        grid_set(c, DTYPE_F32, &b.out[1], &one, 1);
        float *d_w2 = grid_put(c, DTYPE_F32, w, n), *d_m2 = grid_put(c, DTYPE_F32, m, n);
        grid_set(c, DTYPE_F32, d_w, w, n);
        grid_set(c, DTYPE_F32, d_m, m, n);
        GPU_ONLY(sgd_step_cuda(d_w, d_x, d_m, n, d_lr, pc, c->ctx.stream));
        pc.grad_mult = NULL;
        GPU_ONLY(sgd_step_cuda(d_w2, d_x, d_m2, n, d_lr, pc, c->ctx.stream));
        float *w1 = grid_get(c, DTYPE_F32, d_w, n), *w2 = grid_get(c, DTYPE_F32, d_w2, n);
        float *m1 = grid_get(c, DTYPE_F32, d_m, n), *m2 = grid_get(c, DTYPE_F32, d_m2, n);
        grid_check_same(c, "sgd_step weights (grad_mult 1 vs NULL)", w1, w2, n * sizeof(float));
        grid_check_same(c, "sgd_step momentum (grad_mult 1 vs NULL)", m1, m2, n * sizeof(float));
        void *dev[] = {d_w2, d_m2};
        grid_free_all(c, dev, GRID_COUNT(dev));
        void *host[] = {gx, w1, w2, m1, m2};
        host_free_all(host, GRID_COUNT(host));
    }
    void *dev[] = {d_x, d_w, d_m, d_lr};
    grid_free_all(c, dev, GRID_COUNT(dev));
    clip_buffers_free(c, &b);
    free(x), free(w), free(m);
}

static void norm_case(const GridCase *c) {
    norm_size(c, 1);
    norm_size(c, 1000);
    norm_size(c, 1000003);
    norm_size(c, 5000011); /* more than one grid-stride pass */
    norm_empty(c);
    if (c->device == DEVICE_CPU) return;
    norm_graph(c, 300007);
    norm_sgd(c, 1000003, (SgdParams){.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1});
    if (c->dtype == DTYPE_F32) norm_sgd(c, 7, (SgdParams){.momentum = 0.0f, .weight_decay = 1e-2f, .nesterov = 0});
}

/* ---- clip_grad_norm_'s rule and grad_mult on the CPU --------------------------------- */

static void norm_rule_cpu(uint64_t *rng, size_t n) {
    printf(" grad_clip_factor_cpu n=%zu\n", n);
    float *x = host_floats(n), norm, factor;
    test_fill_uniform(x, n, rng, -1, 1);
    double want = reference_norm(x, n, 1);
    /* above the clip: clip / (norm + 1e-6); the same clip just above the norm: 1 */
    float clip = (float)(want * 0.3);
    grad_clip_factor_cpu(x, n, 1.0f, clip, &norm, &factor);
    CHECK_MSG(rel(factor, clip / (want + 1e-6)) <= 1e-6, "factor %.9g, want %.9g", factor, clip / (want + 1e-6));
    grad_clip_factor_cpu(x, n, 1.0f, (float)(want * 1.001 + 1e-5), &norm, &factor);
    CHECK_MSG(factor == 1.0f, "clip just above the norm: factor %.9g", factor);
    /* scaled by s and summed over k micro-batches: the norm and factor of x */
    const float s = 1024.0f, k = 3.0f;
    float *scaled = host_floats(n), norm_s, factor_s;
    for (size_t i = 0; i < n; i++) scaled[i] = x[i] * s * k;
    grad_clip_factor_cpu(scaled, n, 1.0f / (s * k), clip, &norm_s, &factor_s);
    double want_s = reference_norm(scaled, n, 1.0 / (s * k));
    CHECK_MSG(rel(norm_s, want_s) <= 1e-6 && rel(norm_s, want) <= 1e-6,
              "scale %g x accumulate %g: norm %.9g, want %.9g (unscaled %.9g)", s, k, norm_s, want_s, want);
    CHECK_MSG(rel(factor_s, clip / (want + 1e-6)) <= 1e-6, "scale %g x accumulate %g: factor %.9g", s, k, factor_s);
    free(x), free(scaled);
}

static void norm_edges_cpu(void) {
    float x[5] = {0, 0, 0, 0, 0}, norm, factor;
    grad_clip_factor_cpu(x, 5, 1.0f, 1.0f, &norm, &factor);
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
    CHECK_MSG(rel(norm, 5e30) <= 1e-6 && factor > 0 && rel(factor, 2e-31) <= 1e-6, "huge gradient: norm %g factor %g",
              norm, factor);
}

static int same_step(const float *w1, const float *m1, const float *w2, const float *m2, size_t n) {
    return !memcmp(w1, w2, n * sizeof(float)) && !memcmp(m1, m2, n * sizeof(float));
}

/* SGD on grad with grad_mult = &c is SGD on the gradient already multiplied
 * (rounded once), bit for bit; grad_mult = &1 is grad_mult NULL. */
static void norm_sgd_cpu(uint64_t *rng, SgdParams p, size_t n) {
    printf(" sgd grad_mult (cpu) momentum %g wd %g nesterov %d mask %d\n", p.momentum, p.weight_decay, p.nesterov,
           p.decay_mask != NULL);
    size_t bytes = n * sizeof(float);
    float *w = host_floats(n), *m = host_floats(n), *grad = host_floats(n);
    test_fill_uniform(w, n, rng, -1, 1);
    test_fill_uniform(m, n, rng, -0.1f, 0.1f);
    test_fill_uniform(grad, n, rng, -1, 1);
    float c = 0.3127f, one = 1.0f, lr = 0.05f;
    float *pre = host_floats(n);
    for (size_t i = 0; i < n; i++) pre[i] = grad[i] * c;
    float *w1 = copy_floats(w, n), *m1 = copy_floats(m, n), *w2 = copy_floats(w, n), *m2 = copy_floats(m, n);
    SgdParams clipped = p, unclipped = p;
    clipped.grad_mult = &c;
    unclipped.grad_mult = NULL;
    sgd_step_cpu(w1, grad, m1, n, &lr, clipped);
    sgd_step_cpu(w2, pre, m2, n, &lr, unclipped);
    CHECK_MSG(same_step(w1, m1, w2, m2, n), "sgd_step_cpu with grad_mult differs from the pre-multiplied gradient");
    memcpy(w1, w, bytes), memcpy(m1, m, bytes), memcpy(w2, w, bytes), memcpy(m2, m, bytes);
    clipped.grad_mult = &one;
    sgd_step_cpu(w1, grad, m1, n, &lr, clipped);
    sgd_step_cpu(w2, grad, m2, n, &lr, unclipped);
    CHECK_MSG(same_step(w1, m1, w2, m2, n), "sgd_step_cpu with grad_mult 1 differs from grad_mult NULL");

    /* sgd_step_mixed_cpu: unscaled first (rounded), then multiplied (rounded) */
    LossScalerState state = loss_scaler_initial(1024.0f);
    float *scaled = host_floats(n), *pre_mixed = host_floats(n);
    for (size_t i = 0; i < n; i++) {
        scaled[i] = grad[i] * 1024.0f * 3.0f;
        float unscaled = scaled[i] * (1.0f / 1024.0f);
        pre_mixed[i] = unscaled * c;
    }
    memcpy(w1, w, bytes), memcpy(m1, m, bytes), memcpy(w2, w, bytes), memcpy(m2, m, bytes);
    clipped.grad_mult = &c;
    sgd_step_mixed_cpu(w1, scaled, m1, n, &lr, &state, clipped);
    sgd_step_mixed_cpu(w2, pre_mixed, m2, n, &lr, NULL, unclipped);
    CHECK_MSG(same_step(w1, m1, w2, m2, n),
              "sgd_step_mixed_cpu with grad_mult differs from the pre-multiplied gradient");
    /* a skipped step stays skipped */
    state.found_inf = 1;
    sgd_step_mixed_cpu(w1, scaled, m1, n, &lr, &state, clipped);
    CHECK(same_step(w1, m1, w2, m2, n));
    void *host[] = {w, m, grad, pre, w1, m1, w2, m2, scaled, pre_mixed};
    host_free_all(host, GRID_COUNT(host));
}

static void norm_rules(uint64_t *rng) {
    norm_rule_cpu(rng, 1);
    norm_rule_cpu(rng, 1000);
    norm_rule_cpu(rng, 1000003);
    norm_edges_cpu();
    size_t n = 10007;
    uint8_t *mask = host_bytes(n);
    for (size_t i = 0; i < n; i++) mask[i] = i % 3 != 0;
    norm_sgd_cpu(rng, (SgdParams){.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1}, n);
    norm_sgd_cpu(rng, (SgdParams){.momentum = 0.0f, .weight_decay = 1e-2f, .nesterov = 0}, n);
    norm_sgd_cpu(rng, (SgdParams){.momentum = 0.9f, .weight_decay = 5e-2f, .nesterov = 1, .decay_mask = mask}, n);
    free(mask);
}

const GridOp grid_op_grad_norm = {
    .name = "grad_norm",
    .run = norm_case,
    .extras = norm_rules,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (flat gradient buffers have no layout); on the CPU the graph and SGD cases (GPU paths)",
};
