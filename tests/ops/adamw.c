/* Adam and AdamW (ops/adamw.h). Through the face, the mixed-precision step:
 * gradients of the case's dtype, scaled by a loss scaler or not, three steps
 * at changing learning rates read through the pointer, the step count on the
 * device, with and without lr_scale and a decay mask, against the CPU
 * reference; the half copy the master rounded, bit for bit; a step with
 * found_inf moving nothing (master, moments, half copy, scaler state) and not
 * counted. On the GPU also half copies of the other half type. On the CPU:
 * a first step by hand; torch.optim.Adam's and AdamW's documented algorithm in
 * double over several steps, with a schedule, parameter groups (lr_scale) and
 * weight decay left out by a mask; the step at a power-of-two loss scale, with
 * accumulated micro-batches and with a clip factor is the plain step on the
 * true gradient, bit for bit; a skipped step changes nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/adamw.h"
#include "ops/cast.h"
#include "ops/loss_scaler.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

static const AdamwParams adamw = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f, .decoupled = 1};
static const AdamwParams adam_l2 = {.beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.01f};
static const AdamwParams no_decay = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .decoupled = 1};

/* The mixed step on c's device: through the face where the half copy is of
 * the gradients' type or absent, else the CUDA path itself. */
static void mixed_step(const GridCase *c, float *master, const void *grad, float *m, float *v, void *half,
                       DType half_dtype, size_t n, const float *lr, int64_t *step, const LossScalerState *scaler,
                       AdamwParams p) {
    adamw_count_step(&c->ctx, step, scaler);
    if (!half || half_dtype == c->dtype) adamw_step_mixed(&c->ctx, master, grad, m, v, half, n, lr, step, scaler, p);
    else GPU_ONLY(adamw_step_mixed_cuda(master, grad, c->dtype, m, v, half, half_dtype, n, lr, step, scaler, p,
                                        c->ctx.stream));
}

static float *uniform_floats(uint64_t *rng, size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, rng, lo, hi);
    return p;
}

typedef struct {
    DType half_dtype; /* DTYPE_F32: no half copy */
    int scaler, shares, mask;
    int64_t first_step; /* the step count before the first step: 0 fresh, more resumed */
} MixedCase;

/* host: the CPU reference's state; dev: the device's. */
typedef struct {
    float *master, *m, *v;
    int64_t step;
} HostState;

static void adamw_mixed(const GridCase *c, MixedCase mc, AdamwParams p) {
    DType dt = c->dtype;
    int with_copy = mc.half_dtype != DTYPE_F32;
    printf(" mixed step: %s, half copy %s, %s%s%s, step %lld on, wd %g\n", p.decoupled ? "adamw" : "adam",
           with_copy ? dtype_name(mc.half_dtype) : "none", mc.scaler ? "scaler" : "no scaler",
           mc.shares ? ", lr_scale" : "", mc.mask ? ", decay mask" : "", (long long)mc.first_step, p.weight_decay);
    const size_t n = 1000003;
    HostState h = {grid_random(c, DTYPE_F32, n, -1, 1), grid_random(c, DTYPE_F32, n, -0.1f, 0.1f),
                   grid_random(c, DTYPE_F32, n, 0.0f, 0.01f), mc.first_step};
    float *grad = host_floats(n), *share = mc.shares ? grid_random_shares(c->rng, n) : NULL;
    uint8_t *mask = mc.mask ? grid_random_mask(c->rng, n) : NULL;
    LossScalerState cpu_state = loss_scaler_initial(mc.scaler ? 1024.0f : 1.0f);
    float *d_master = grid_put(c, DTYPE_F32, h.master, n), *d_m = grid_put(c, DTYPE_F32, h.m, n);
    float *d_v = grid_put(c, DTYPE_F32, h.v, n), *d_share = share ? grid_put(c, DTYPE_F32, share, n) : NULL;
    uint8_t *d_mask = mask ? grid_put_bytes(c, mask, n) : NULL;
    void *d_grad = grid_alloc(c, dt, n), *d_half = with_copy ? grid_alloc(c, mc.half_dtype, n) : NULL;
    float *d_lr = grid_alloc(c, DTYPE_F32, 1);
    int64_t *d_step = grid_put_bytes(c, &mc.first_step, sizeof mc.first_step);
    LossScalerState *d_state = mc.scaler ? grid_put_bytes(c, &cpu_state, sizeof cpu_state) : NULL;
    AdamwParams hp = p, dp = p;
    hp.lr_scale = share, dp.lr_scale = d_share;
    hp.decay_mask = mask, dp.decay_mask = d_mask;
    const float lrs[3] = {1e-2f, 2e-3f, 5e-2f};
    for (int step = 0; step < 3; step++) {
        /* gradients as the backward pass leaves them: scaled, in the case's dtype */
        for (size_t i = 0; i < n; i++) grad[i] = test_uniform(c->rng, -1, 1) * cpu_state.scale;
        round_to(dt, grad, n);
        grid_set(c, dt, d_grad, grad, n);
        grid_set(c, DTYPE_F32, d_lr, &lrs[step], 1);
        adamw_count_step_cpu(&h.step, mc.scaler ? &cpu_state : NULL);
        adamw_step_mixed_cpu(h.master, grad, h.m, h.v, n, &lrs[step], &h.step, mc.scaler ? &cpu_state : NULL, hp);
        mixed_step(c, d_master, d_grad, d_m, d_v, d_half, mc.half_dtype, n, d_lr, d_step, d_state, dp);
    }
    float *gmaster = grid_get(c, DTYPE_F32, d_master, n), *gm = grid_get(c, DTYPE_F32, d_m, n);
    float *gv = grid_get(c, DTYPE_F32, d_v, n);
    int64_t *gstep = grid_get_bytes(c, d_step, sizeof *gstep);
    /* the device may fuse multiply-adds: a rounding apart per step */
    grid_check(c, "adamw master", gmaster, h.master, n, 1e-6);
    grid_check(c, "adamw first moment", gm, h.m, n, 1e-5);
    grid_check(c, "adamw second moment", gv, h.v, n, 1e-5);
    CHECK_MSG(*gstep == mc.first_step + 3 && h.step == *gstep, "%s: adamw step count %lld (reference %lld), want %lld",
              c->name, (long long)*gstep, (long long)h.step, (long long)mc.first_step + 3);
    size_t half_bytes = n * dtype_size(mc.half_dtype);
    void *half_before = NULL;
    if (with_copy) { /* the half copy is the device's own master, rounded */
        half_before = grid_get_bytes(c, d_half, half_bytes);
        void *want = host_bytes(half_bytes);
        cast_from_f32_cpu(mc.half_dtype, gmaster, want, n);
        grid_check_same(c, "adamw half copy (the master rounded)", half_before, want, half_bytes);
        free(want);
    }
    if (mc.scaler) { /* found_inf: nothing moves, bit for bit, even with inf in the gradients; the step not counted */
        LossScalerState skip = cpu_state;
        skip.found_inf = 1;
        op_copy_from_host(&c->ctx, d_state, &skip, sizeof skip);
        grad[n / 2] = INFINITY;
        grid_set(c, dt, d_grad, grad, n);
        mixed_step(c, d_master, d_grad, d_m, d_v, d_half, mc.half_dtype, n, d_lr, d_step, d_state, dp);
        grid_check_kept(c, "adamw master (skipped step)", d_master, gmaster, n * sizeof(float));
        grid_check_kept(c, "adamw first moment (skipped step)", d_m, gm, n * sizeof(float));
        grid_check_kept(c, "adamw second moment (skipped step)", d_v, gv, n * sizeof(float));
        grid_check_kept(c, "adamw step count (skipped step: not counted)", d_step, gstep, sizeof *gstep);
        if (with_copy) grid_check_kept(c, "adamw half copy (skipped step)", d_half, half_before, half_bytes);
        grid_check_kept(c, "adamw scaler state (skipped step)", d_state, &skip, sizeof skip);
    }
    void *dev[] = {d_master, d_m, d_v, d_share, d_mask, d_grad, d_half, d_lr, d_step, d_state};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {h.master, h.m, h.v, grad, share, mask, gmaster, gm, gv, gstep, half_before};
    host_free_all(host, GRID_COUNT(host));
}

static void adamw_case(const GridCase *c) {
    int gpu = c->device == DEVICE_CUDA;
    DType own_copy = gpu && c->dtype != DTYPE_F32 ? c->dtype : DTYPE_F32; /* the trainer's: none for f32 */
    adamw_mixed(c, (MixedCase){own_copy, 1, 0, 0, 0}, adamw);
    adamw_mixed(c, (MixedCase){own_copy, 1, 1, 1, 5}, adam_l2);
    adamw_mixed(c, (MixedCase){own_copy, 0, 1, 1, 0}, adamw); /* no scaler */
    adamw_mixed(c, (MixedCase){DTYPE_F32, 1, 0, 1, 1000}, no_decay);
    if (gpu) {
        adamw_mixed(c, (MixedCase){DTYPE_F16, 1, 1, 0, 0}, adamw);
        adamw_mixed(c, (MixedCase){DTYPE_BF16, 1, 0, 1, 2}, adam_l2);
    }
}

/* ---- PyTorch's semantics (CPU) -------------------------------------------------- */

/* The first step by hand: w 1, g 0.5, m = v = 0, lr 0.1. m = 0.05, v = 2.5e-4,
 * m / (1 - 0.9) = 0.5, v / (1 - 0.999) = 0.25: the step is lr x 0.5 / (0.5 + eps).
 * AdamW first decays w by lr x wd = 0.01; Adam adds wd x w to g: g = 0.6, the
 * same step (the first step is the sign, whatever the gradient's size). */
static void adamw_by_hand(void) {
    float lr = 0.1f, g = 0.5f;
    float w = 1, m = 0, v = 0;
    int64_t t = 0;
    AdamwParams p = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f, .decoupled = 1};
    adamw_count_step_cpu(&t, NULL);
    adamw_step_mixed_cpu(&w, &g, &m, &v, 1, &lr, &t, NULL, p);
    check_values("adamw w", &w, (double[]){0.99 - 0.1 * 0.5 / (0.5 + 1e-8)}, 1, 1e-6);
    check_values("adamw m", &m, (double[]){0.05}, 1, 1e-6);
    check_values("adamw v", &v, (double[]){2.5e-4}, 1, 1e-6);
    w = 1, m = 0, v = 0, t = 0;
    p.decoupled = 0;
    adamw_count_step_cpu(&t, NULL);
    adamw_step_mixed_cpu(&w, &g, &m, &v, 1, &lr, &t, NULL, p);
    check_values("adam w", &w, (double[]){1 - 0.1 * 0.6 / (0.6 + 1e-8)}, 1, 1e-6);
    check_values("adam m", &m, (double[]){0.06}, 1, 1e-6);
    check_values("adam v", &v, (double[]){3.6e-4}, 1, 1e-6);
    CHECK_MSG(t == 1, "step count %lld after one step", (long long)t);
}

/* torch.optim.Adam's and AdamW's single-tensor step (amsgrad and maximize
 * off), written from their documented algorithm, in double; t counts from 1. */
static void torch_adam_step(double *p, const double *grad, double *m, double *v, size_t n, double lr, double beta1,
                            double beta2, double eps, double weight_decay, int decoupled, long t) {
    double bc1 = 1 - pow(beta1, (double)t), bc2 = 1 - pow(beta2, (double)t);
    for (size_t i = 0; i < n; i++) {
        double g = grad[i];
        if (decoupled) p[i] *= 1 - lr * weight_decay;
        else g += weight_decay * p[i];
        m[i] = beta1 * m[i] + (1 - beta1) * g;
        v[i] = beta2 * v[i] + (1 - beta2) * g * g;
        double m_hat = m[i] / bc1, v_hat = v[i] / bc2;
        p[i] -= lr * m_hat / (sqrt(v_hat) + eps);
    }
}

typedef struct {
    double *w, *m, *v;
} TorchState;

static TorchState torch_state(const float *w, size_t n) {
    TorchState s = {malloc(sizeof(double) * n), calloc(n, sizeof(double)), calloc(n, sizeof(double))};
    CHECK(s.w && s.m && s.v);
    for (size_t i = 0; i < n; i++) s.w[i] = w[i];
    return s;
}

static void torch_state_free(TorchState *s) { free(s->w), free(s->m), free(s->v); }

/* Six steps at a schedule's rates, the fourth skipped by the loss scaler
 * (torch's GradScaler does not call step), gradients scaled by 1024; with
 * shares, each parameter is torch's group of lr s x lr and weight_decay wd / s
 * (s = 0: not in any group, never moved), and with a mask the parameters it
 * leaves out are a group of weight_decay 0. */
static void adamw_against_torch(uint64_t *rng, AdamwParams p, int shares, int mask) {
    enum { N = 1000, STEPS = 6, SKIPPED = 3 };
    const float lrs[STEPS] = {1e-3f, 5e-3f, 2e-2f, 1e-2f, 1e-3f, 3e-3f};
    float *w = uniform_floats(rng, N, -1, 1), *m = host_floats(N), *v = host_floats(N), *g = host_floats(N);
    float *share = shares ? grid_random_shares(rng, N) : NULL, *w0 = copy_floats(w, N);
    uint8_t *decays = mask ? grid_random_mask(rng, N) : NULL;
    double pg[N];
    TorchState ts = torch_state(w, N);
    AdamwParams hp = p;
    hp.lr_scale = share, hp.decay_mask = decays;
    int64_t t = 0;
    long torch_t = 0;
    for (int step = 0; step < STEPS; step++) {
        LossScalerState scaler = loss_scaler_initial(1024.0f);
        scaler.found_inf = step == SKIPPED;
        test_fill_uniform(g, N, rng, -1, 1);
        for (int i = 0; i < N; i++) pg[i] = g[i], g[i] *= 1024.0f;
        adamw_count_step_cpu(&t, &scaler);
        adamw_step_mixed_cpu(w, g, m, v, N, &lrs[step], &t, &scaler, hp);
        if (scaler.found_inf) continue;
        torch_t++;
        for (int i = 0; i < N; i++) {
            double s = share ? share[i] : 1.0, wd = decays && !decays[i] ? 0.0 : p.weight_decay;
            if (s != 0)
                torch_adam_step(&ts.w[i], &pg[i], &ts.m[i], &ts.v[i], 1, (double)lrs[step] * s, p.beta1, p.beta2,
                                p.eps, wd / s, p.decoupled, torch_t);
        }
    }
    CHECK_MSG(t == STEPS - 1, "step count %lld after %d steps, one skipped", (long long)t, STEPS);
    char what[160];
    snprintf(what, sizeof what, "%s betas %g %g eps %g wd %g%s%s", p.decoupled ? "adamw" : "adam", p.beta1, p.beta2,
             p.eps, p.weight_decay, shares ? " lr_scale" : "", mask ? " mask" : "");
    char item[200];
    snprintf(item, sizeof item, "%s: w", what);
    check_rel_l2(item, w, ts.w, N, 1e-6);
    /* The steps themselves, which are small beside the weights: w's own roundings over the steps bound them. */
    float moved[N];
    double want_moved[N];
    for (int i = 0; i < N; i++) moved[i] = (float)((double)w[i] - w0[i]), want_moved[i] = ts.w[i] - w0[i];
    snprintf(item, sizeof item, "%s: w - w0", what);
    check_rel_l2(item, moved, want_moved, N, 6e-6);
    snprintf(item, sizeof item, "%s: m", what);
    check_rel_l2(item, m, ts.m, N, 1e-5);
    snprintf(item, sizeof item, "%s: v", what);
    check_rel_l2(item, v, ts.v, N, 1e-5);
    float delta[N];
    for (int i = 0; i < N; i++) delta[i] = w[i] - w0[i];
    CHECK_MSG(test_rel_error(w, w0, N) > 1e-4, "%s: the weights hardly moved: the check cannot fail", what);
    for (int i = 0; share && i < N; i++)
        CHECK_MSG(share[i] != 0.0f || (delta[i] == 0.0f && m[i] == 0.0f && v[i] == 0.0f),
                  "%s: lr_scale 0 moved parameter %d", what, i);
    torch_state_free(&ts);
    void *host[] = {w, m, v, g, share, w0, decays};
    host_free_all(host, GRID_COUNT(host));
}

/* The same step three ways, bit for bit: gradients scaled by 65536, by 1 and
 * without a scaler; two accumulated micro-batches' sum of 2g against g; a clip
 * factor against the gradient multiplied by it beforehand. A skipped step
 * changes nothing and is not counted. */
static void adamw_exact_forms(uint64_t *rng, AdamwParams p) {
    size_t n = 1001, bytes = n * sizeof(float);
    float lr = 3e-3f, mult = 0.375f;
    float *w = uniform_floats(rng, n, -1, 1), *m = uniform_floats(rng, n, -0.1f, 0.1f);
    float *v = uniform_floats(rng, n, 0.0f, 0.01f), *g = uniform_floats(rng, n, -1, 1);
    float *g_scaled = host_floats(n), *g_sum = host_floats(n), *g_clipped = host_floats(n);
    for (size_t i = 0; i < n; i++) g_scaled[i] = g[i] * 65536.0f, g_sum[i] = 2.0f * g[i], g_clipped[i] = g[i] * mult;
    float *want[3] = {copy_floats(w, n), copy_floats(m, n), copy_floats(v, n)};
    int64_t t0 = 4, t = t0;
    adamw_count_step_cpu(&t, NULL);
    adamw_step_mixed_cpu(want[0], g, want[1], want[2], n, &lr, &t, NULL, p);
    LossScalerState one = loss_scaler_initial(1.0f), big = loss_scaler_initial(65536.0f);
    AdamwParams accumulated = p, clipped = p;
    accumulated.accumulate = 2;
    clipped.grad_mult = &mult;
    const struct {
        const char *what;
        const float *grad;
        const LossScalerState *scaler;
        AdamwParams p;
        const float *want_grad; /* what the plain step's reference ran on */
    } forms[] = {{"at scale 1", g, &one, p, g},
                 {"at scale 65536", g_scaled, &big, p, g},
                 {"of 2 accumulated micro-batches", g_sum, NULL, accumulated, g},
                 {"with a clip factor", g, NULL, clipped, g_clipped}};
    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++) {
        float *fw = copy_floats(w, n), *fm = copy_floats(m, n), *fv = copy_floats(v, n);
        float *rw = copy_floats(w, n), *rm = copy_floats(m, n), *rv = copy_floats(v, n);
        int64_t ft = t0, rt = t0;
        adamw_count_step_cpu(&ft, forms[f].scaler);
        adamw_step_mixed_cpu(fw, forms[f].grad, fm, fv, n, &lr, &ft, forms[f].scaler, forms[f].p);
        adamw_count_step_cpu(&rt, NULL);
        adamw_step_mixed_cpu(rw, forms[f].want_grad, rm, rv, n, &lr, &rt, NULL, p);
        CHECK_MSG(!memcmp(fw, rw, bytes) && !memcmp(fm, rm, bytes) && !memcmp(fv, rv, bytes) && ft == rt,
                  "adamw %s differs from the plain step on the true gradient", forms[f].what);
        void *host[] = {fw, fm, fv, rw, rm, rv};
        host_free_all(host, GRID_COUNT(host));
    }
    CHECK_MSG(memcmp(want[0], w, bytes), "the step moved nothing: the check cannot fail");
    big.found_inf = 1;
    float *sw = copy_floats(w, n), *sm = copy_floats(m, n), *sv = copy_floats(v, n);
    int64_t st = t0;
    g_scaled[n / 2] = INFINITY;
    adamw_count_step_cpu(&st, &big);
    adamw_step_mixed_cpu(sw, g_scaled, sm, sv, n, &lr, &st, &big, p);
    CHECK_MSG(!memcmp(sw, w, bytes) && !memcmp(sm, m, bytes) && !memcmp(sv, v, bytes) && st == t0,
              "adamw moved weights or moments, or counted the step, on a skipped step");
    void *host[] = {w, m, v, g, g_scaled, g_sum, g_clipped, want[0], want[1], want[2], sw, sm, sv};
    host_free_all(host, GRID_COUNT(host));
}

/* With a decay mask every step is the decayed one where the mask is set and
 * the undecayed one elsewhere, to the bit. */
static void adamw_mask(uint64_t *rng, AdamwParams p) {
    size_t n = 1003, bytes = n * sizeof(float);
    float lr = 1e-2f;
    float *w = uniform_floats(rng, n, -1, 1), *g = uniform_floats(rng, n, -1, 1);
    uint8_t *mask = grid_random_mask(rng, n);
    AdamwParams none = p, masked = p;
    none.weight_decay = 0.0f;
    masked.decay_mask = mask;
    const AdamwParams *variants[3] = {&p, &none, &masked};
    float *out[3][3];
    for (int k = 0; k < 3; k++) {
        out[k][0] = copy_floats(w, n), out[k][1] = host_floats(n), out[k][2] = host_floats(n);
        int64_t t = 0;
        adamw_count_step_cpu(&t, NULL);
        adamw_step_mixed_cpu(out[k][0], g, out[k][1], out[k][2], n, &lr, &t, NULL, *variants[k]);
    }
    for (int b = 0; b < 3; b++)
        for (size_t i = 0; i < n; i++)
            CHECK_MSG(!memcmp(&out[2][b][i], &out[mask[i] ? 0 : 1][b][i], sizeof(float)),
                      "%s with a decay mask: buffer %d element %zu is not the %s step's",
                      p.decoupled ? "adamw" : "adam", b, i, mask[i] ? "decayed" : "undecayed");
    CHECK_MSG(memcmp(out[0][0], out[1][0], bytes), "weight decay changed nothing: the check cannot fail");
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < 3; b++) free(out[k][b]);
    free(w), free(g), free(mask);
}

static void adamw_semantics(uint64_t *rng) {
    adamw_by_hand();
    const AdamwParams cases[] = {
        adamw, adam_l2, no_decay,
        {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f},                  /* torch's Adam, L2 */
        {.beta1 = 0.5f, .beta2 = 0.9f, .eps = 1e-3f, .weight_decay = 0.3f, .decoupled = 1},    /* a large eps */
        {.beta1 = 0.0f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.0f, .decoupled = 0},   /* RMSprop-like */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        adamw_against_torch(rng, cases[i], 0, 0);
        adamw_exact_forms(rng, cases[i]);
    }
    adamw_against_torch(rng, adamw, 1, 0);
    adamw_against_torch(rng, adam_l2, 1, 1);
    adamw_against_torch(rng, adamw, 0, 1);
    adamw_mask(rng, adamw);
    adamw_mask(rng, adam_l2);
}

const GridOp grid_op_adamw = {
    .name = "adamw",
    .run = adamw_case,
    .extras = adamw_semantics,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (flat parameter buffers have no layout)",
};
