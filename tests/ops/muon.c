/* Muon (ops/muon.h): the device against the CPU on matrices wide and tall,
 * one of them alone in its shape, two of one shape side by side and two of
 * one shape apart (one group of the grouped products each), one big enough
 * for several partial sums of its norms, a wide and a tall one whose Gram
 * products the device splits in parts (3 and 5), with gaps between them that nothing
 * may touch; an odd and an even number of Newton-Schulz rounds (the result
 * ends in either iterate); two steps replayed from one captured in a CUDA
 * graph; a skipped step changes nothing. By hand on the CPU: a single row (whose singular
 * value follows the quintic), the momentum and the weight normalisation, the
 * singular values the iteration ends with, and a tall matrix as the
 * transpose of the wide one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/muon.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

#define GAP 37 /* parameters between the matrices, which Muon must leave alone */

static MuonMatrices grid_matrices(size_t *n_params) {
    static const int shape[][2] = {{16, 72}, {24, 54}, {24, 54}, {40, 12}, {16, 72}, {48, 100}, {1, 10},
                                   {8, 600}, {520, 8}, {8, 600}};
    MuonMatrices m = {.n = (int)GRID_COUNT(shape)};
    size_t at = GAP;
    for (int j = 0; j < m.n; j++) {
        m.mats[j] = (MuonMatrix){at, shape[j][0], shape[j][1]};
        at += (size_t)shape[j][0] * shape[j][1] + GAP;
    }
    *n_params = at;
    return m;
}

/* The Gram products' parts (muon.h): the long sides that split, and one that cannot. */
static void gram_splits(void) {
    CHECK(muon_gram_splits(72) == 1 && muon_gram_splits(256) == 1 && muon_gram_splits(600) == 3);
    CHECK(muon_gram_splits(520) == 5 && muon_gram_splits(2304) == 9 && muon_gram_splits(576) == 3);
    CHECK(muon_gram_splits(1031) == 1); /* prime: no equal parts */
}

static const MuonParams RECIPE = {.momentum = 0.6f, .nesterov = 1, .ns_steps = 5, .lr_mult = 0.48f,
                                  .normalize_weights = 1};

/* max |w_after - w_before| outside the matrices. */
static double gap_change(const MuonMatrices *m, const float *before, const float *after, size_t n) {
    double worst = 0;
    for (size_t i = 0, j = 0; i < n; i++) {
        while (j < (size_t)m->n && i >= m->mats[j].offset + (size_t)m->mats[j].rows * m->mats[j].cols) j++;
        int inside = j < (size_t)m->n && i >= m->mats[j].offset;
        if (!inside && fabs(after[i] - before[i]) > worst) worst = fabs(after[i] - before[i]);
    }
    return worst;
}

static void difference(const float *a, const float *b, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] - b[i];
}

/* One case: steps of ns_steps rounds, on the device eagerly or from a graph. */
typedef struct {
    int found_inf, ns_steps, steps, graph;
} MuonRun;

typedef struct {
    float *w, *m, *lr;
    void *grad, *half, *scratch;
    LossScalerState *scaler;
} MuonDevice;

static void device_step(const GridCase *c, const MuonMatrices *mats, MuonDevice d, MuonParams p) {
    muon_step(&c->ctx, mats, d.w, d.grad, d.m, d.half, d.lr, d.scaler, p, d.scratch);
}

/* The step captured, the capture over (and muon_step's frame gone) before
 * the replays. */
static cudaGraphExec_t captured_step(const GridCase *c, const MuonMatrices *mats, MuonDevice d, MuonParams p) {
    gpu_capture_begin(c->ctx.stream);
    device_step(c, mats, d, p);
    return gpu_capture_end(c->ctx.stream, 0);
}

static void device_steps(const GridCase *c, const MuonMatrices *mats, MuonDevice d, MuonParams p, MuonRun r) {
    if (!r.graph) {
        for (int s = 0; s < r.steps; s++) device_step(c, mats, d, p);
        return;
    }
    cudaGraphExec_t graph = captured_step(c, mats, d, p);
    for (int s = 0; s < r.steps; s++) gpu_graph_launch(graph, c->ctx.stream);
    gpu_graph_destroy(graph);
}

static void muon_at(const GridCase *c, MuonRun r) {
    size_t n;
    MuonMatrices mats = grid_matrices(&n);
    printf(" %zu parameters in %d matrices, %d step(s) of %d rounds%s%s\n", n, mats.n, r.steps, r.ns_steps,
           r.graph ? " from a CUDA graph" : "", r.found_inf ? ", the step skipped" : "");
    float *w = grid_random(c, DTYPE_F32, n, -1, 1), *mom = grid_random(c, DTYPE_F32, n, -0.1f, 0.1f);
    float *grad = grid_random(c, c->dtype, n, -1024, 1024); /* scaled by the loss scaler's 1024 */
    LossScalerState scaler = loss_scaler_initial(1024.0f);
    scaler.found_inf = r.found_inf;
    float lr = 0.5f, mult = 0.75f;
    MuonParams p = RECIPE;
    p.ns_steps = r.ns_steps;
    size_t scratch_bytes = muon_scratch_bytes(&mats);
    float *want_w = copy_floats(w, n), *want_m = copy_floats(mom, n);
    void *scratch = malloc(scratch_bytes);
    p.grad_mult = &mult;
    for (int s = 0; s < r.steps; s++) muon_step_cpu(&mats, want_w, grad, want_m, &lr, &scaler, p, scratch);

    DType half = c->device == DEVICE_CUDA && c->dtype != DTYPE_F32 ? c->dtype : DTYPE_F32;
    float *d_w = grid_put(c, DTYPE_F32, w, n), *d_m = grid_put(c, DTYPE_F32, mom, n);
    void *d_grad = grid_put(c, c->dtype, grad, n), *d_half = half != DTYPE_F32 ? grid_put(c, half, w, n) : NULL;
    float *d_lr = grid_put(c, DTYPE_F32, &lr, 1), *d_mult = grid_put(c, DTYPE_F32, &mult, 1);
    LossScalerState *d_scaler = grid_put_bytes(c, &scaler, sizeof scaler);
    void *d_scratch = grid_alloc_bytes(c, scratch_bytes);
    p.grad_mult = d_mult;
    device_steps(c, &mats, (MuonDevice){d_w, d_m, d_lr, d_grad, d_half, d_scratch, d_scaler}, p, r);
    float *gw = grid_get(c, DTYPE_F32, d_w, n), *gm = grid_get(c, DTYPE_F32, d_m, n);

    grid_check_same(c, "muon momentum (device against the CPU)", gm, want_m, n * sizeof(float));
    CHECK_MSG(gap_change(&mats, w, gw, n) == 0, "%s: muon changed a parameter outside its matrices", c->name);
    if (r.found_inf) grid_check_same(c, "muon skipped step: the weights", gw, w, n * sizeof(float));
    else {
        /* The steps, not the weights: a wrong update is off by its own size. */
        float *got_step = malloc(n * sizeof(float)), *want_step = malloc(n * sizeof(float));
        difference(gw, w, n, got_step);
        difference(want_w, w, n, want_step);
        grid_check(c, "muon step (device against the CPU)", got_step, want_step, n, 1e-4);
        free(got_step), free(want_step);
    }
    if (d_half) {
        float *gh = grid_get(c, half, d_half, n);
        round_to(half, gw, n);
        grid_check_same(c, "muon half copy (the master, rounded)", gh, gw, n * sizeof(float));
        free(gh);
    }
    void *dev[] = {d_w, d_m, d_grad, d_half, d_lr, d_mult, d_scaler, d_scratch};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {w, mom, grad, want_w, want_m, scratch, gw, gm};
    host_free_all(host, GRID_COUNT(host));
}

static void muon_case(const GridCase *c) {
    if (c->device == DEVICE_CPU) return; /* the CPU path is the reference: muon_by_hand checks it */
    muon_at(c, (MuonRun){.ns_steps = RECIPE.ns_steps, .steps = 1});
    muon_at(c, (MuonRun){.ns_steps = 4, .steps = 1});
    muon_at(c, (MuonRun){.ns_steps = RECIPE.ns_steps, .steps = 2, .graph = 1});
    muon_at(c, (MuonRun){.found_inf = 1, .ns_steps = RECIPE.ns_steps, .steps = 1});
}

static float quintic(float s) { return MUON_NS_A * s + MUON_NS_B * s * s * s + MUON_NS_C * s * s * s * s * s; }

/* A single row: its one singular value |x| / (|x| + eps) goes through the
 * quintic ns_steps times, its direction stays. */
static void one_row(uint64_t *rng) {
    float x[10], want[10];
    double norm = 0;
    for (int i = 0; i < 10; i++) x[i] = test_uniform(rng, -1, 1), norm += (double)x[i] * x[i];
    norm = sqrt(norm);
    float s = (float)(norm / (norm + MUON_EPS));
    for (int k = 0; k < 5; k++) s = quintic(s);
    for (int i = 0; i < 10; i++) want[i] = (float)(x[i] / norm) * s;
    MuonMatrices one = {.mats = {{0, 1, 10}}, .n = 1};
    void *scratch = malloc(muon_scratch_bytes(&one));
    muon_orthogonalize_cpu(x, 1, 10, 5, scratch);
    for (int i = 0; i < 10; i++) CHECK_NEAR(x[i], want[i], 1e-5);
    free(scratch);
}

/* The largest eigenvalue of the symmetric k x k matrix a (power iteration from a fixed start). */
static double top_eigenvalue(const double *a, int k) {
    double *v = malloc(sizeof(double) * k), *next = malloc(sizeof(double) * k), lambda = 0;
    for (int i = 0; i < k; i++) v[i] = 1.0 + 0.01 * i;
    for (int it = 0; it < 2000; it++) {
        double norm = 0;
        for (int i = 0; i < k; i++) {
            next[i] = 0;
            for (int j = 0; j < k; j++) next[i] += a[(size_t)i * k + j] * v[j];
            norm += next[i] * next[i];
        }
        norm = sqrt(norm);
        lambda = norm;
        for (int i = 0; i < k; i++) v[i] = next[i] / norm;
    }
    free(v), free(next);
    return lambda;
}

/* A random 24 x 80 matrix ends with every singular value in the quintic's
 * band, [0.68, 1.21] for inputs whose singular values are above 1% of the
 * norm (checked in numpy): the squares of its extremes, from X X^T and
 * 2 I - X X^T, lie in [0.6^2, 1.25^2]. */
static void singular_band(uint64_t *rng) {
    enum { R = 24, C = 80 };
    float *x = malloc(sizeof(float) * R * C);
    double *gram = malloc(sizeof(double) * R * R), *flipped = malloc(sizeof(double) * R * R);
    for (int i = 0; i < R * C; i++) x[i] = test_uniform(rng, -1, 1);
    MuonMatrices one = {.mats = {{0, R, C}}, .n = 1};
    void *scratch = malloc(muon_scratch_bytes(&one));
    muon_orthogonalize_cpu(x, R, C, 5, scratch);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < R; j++) {
            double s = 0;
            for (int k = 0; k < C; k++) s += (double)x[i * C + k] * x[j * C + k];
            gram[i * R + j] = s;
            flipped[i * R + j] = (i == j ? 2.0 : 0.0) - s;
        }
    double top = top_eigenvalue(gram, R), bottom = 2.0 - top_eigenvalue(flipped, R);
    CHECK_MSG(top <= 1.25 * 1.25 && bottom >= 0.6 * 0.6, "muon: singular values^2 in [%g, %g], want [0.36, 1.5625]",
              bottom, top);
    free(x), free(gram), free(flipped), free(scratch);
}

/* A tall matrix is orthogonalised as its transpose (the wide one) is. */
static void tall_as_transpose(uint64_t *rng) {
    enum { R = 30, C = 12 };
    float tall[R * C], wide[C * R];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) tall[i * C + j] = wide[j * R + i] = test_uniform(rng, -1, 1);
    MuonMatrices one = {.mats = {{0, R, C}}, .n = 1};
    void *scratch = malloc(muon_scratch_bytes(&one));
    muon_orthogonalize_cpu(tall, R, C, 5, scratch);
    muon_orthogonalize_cpu(wide, C, R, 5, scratch);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) CHECK_NEAR(tall[i * C + j], wide[j * R + i], 1e-5);
    free(scratch);
}

/* One 1 x 2 matrix by hand: W = (3, 4) normalised to (0.6, 0.8); gradient
 * (2, 0) at scale 2 is g = (1, 0); m = 0.5 x 0.5 + 1 = 1.25 (and 0);
 * Nesterov's u = 1 + 0.5 x 1.25 = 1.625, whose direction (1, 0) the
 * iteration keeps with length quintic^5(1.625 / (1.625 + eps)). */
static void step_by_hand(void) {
    float w[2] = {3, 4}, grad[2] = {2, 0}, mom[2] = {0.5f, 0}, lr = 0.1f;
    LossScalerState scaler = loss_scaler_initial(2.0f);
    MuonMatrices one = {.mats = {{0, 1, 2}}, .n = 1};
    MuonParams p = {.momentum = 0.5f, .nesterov = 1, .ns_steps = 5, .lr_mult = 2.0f, .normalize_weights = 1};
    void *scratch = malloc(muon_scratch_bytes(&one));
    muon_step_cpu(&one, w, grad, mom, &lr, &scaler, p, scratch);
    float s = 1.625f / (1.625f + MUON_EPS);
    for (int k = 0; k < 5; k++) s = quintic(s);
    CHECK(mom[0] == 1.25f && mom[1] == 0.0f);
    CHECK_NEAR(w[0], 0.6f - 0.2f * s, 1e-6);
    CHECK_NEAR(w[1], 0.8f, 1e-6);
    scaler.found_inf = 1; /* skipped: nothing moves */
    float w_before[2] = {w[0], w[1]};
    muon_step_cpu(&one, w, grad, mom, &lr, &scaler, p, scratch);
    CHECK(w[0] == w_before[0] && w[1] == w_before[1] && mom[0] == 1.25f);
    free(scratch);
}

static void muon_by_hand(uint64_t *rng) {
    one_row(rng);
    singular_band(rng);
    tall_as_transpose(rng);
    step_by_hand();
    gram_splits();
}

const GridOp grid_op_muon = {
    .name = "muon",
    .run = muon_case,
    .extras = muon_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (flat parameter buffers have no layout)",
};
