/* airbench's whitening (models/whiten.h) and the learning-rate shares it
 * needs (Model.lr_scale): the Jacobi eigensolver against a matrix built from
 * a known decomposition and against a 2x2 by hand; the patch moment by hand;
 * the filters whitening the moment they came from; the layer's weights in
 * PyTorch's order; and a few SGD steps leaving the whitening weights and the
 * batch norms' fixed gamma alone, stepping beta at its share, and stopping
 * the whitening bias at its step (ops/freeze_after), as the trainer does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/whiten.h"
#include "models/zoo.h"
#include "ops/freeze_after.h"
#include "ops/sgd.h"
#include "tests/harness.h"
#include "tests/model_checks.h"

enum { K = 12 };

static void check_eigen_by_hand(void) {
    double a[4] = {2, 1, 1, 2}, l[2], v[4];
    CHECK(symmetric_eigen(a, 2, l, v) >= 0);
    CHECK_NEAR(l[0], 1.0, 1e-12);
    CHECK_NEAR(l[1], 3.0, 1e-12);
    CHECK_NEAR(fabs(v[0 * 2 + 0]), M_SQRT1_2, 1e-12); /* (1, -1) / sqrt 2 */
    CHECK_NEAR(v[0 * 2 + 0] + v[1 * 2 + 0], 0.0, 1e-12);
    CHECK_NEAR(v[0 * 2 + 1] - v[1 * 2 + 1], 0.0, 1e-12); /* (1, 1) / sqrt 2 */
}

/* A = Q diag(d) Q^T, Q the Householder reflection I - 2 u u^T / |u|^2 of a
 * random u, d distinct: the solver must give d back in ascending order, and
 * the columns of Q (up to sign) as the vectors. */
static void check_eigen_known(uint64_t *rng) {
    double u[K], q[K * K], a[K * K], want[K], l[K], v[K * K], uu = 0;
    for (int i = 0; i < K; i++) u[i] = test_uniform(rng, -1, 1), uu += u[i] * u[i];
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++) q[i * K + j] = (i == j) - 2.0 * u[i] * u[j] / uu;
    double d[K] = {5.0, 0.25, 3.0, 1e-4, 2.0, 0.5, 8.0, 1.5, 0.01, 4.0, 0.75, 12.0};
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++) {
            double sum = 0;
            for (int r = 0; r < K; r++) sum += q[i * K + r] * d[r] * q[j * K + r];
            a[i * K + j] = sum;
        }
    memcpy(want, d, sizeof d);
    for (int i = 0; i < K; i++) /* ascending */
        for (int j = i + 1; j < K; j++)
            if (want[j] < want[i]) { double t = want[i]; want[i] = want[j], want[j] = t; }
    int sweeps = symmetric_eigen(a, K, l, v);
    printf("jacobi: %d sweeps for a 12x12 matrix\n", sweeps);
    CHECK(sweeps > 0 && sweeps < 20);
    for (int k = 0; k < K; k++) {
        CHECK_MSG(fabs(l[k] - want[k]) <= 1e-12 * 12.0, "eigenvalue %d: %.15g, want %.15g", k, l[k], want[k]);
        int r = 0; /* the column of Q with this eigenvalue */
        while (d[r] != want[k]) r++;
        double dot = 0;
        for (int i = 0; i < K; i++) dot += v[i * K + k] * q[i * K + r];
        CHECK_MSG(fabs(fabs(dot) - 1.0) <= 1e-10, "eigenvector %d: |<v, q>| = %.15g", k, fabs(dot));
    }
}

/* One 2x3 image of one channel: two windows. */
static void check_moment_by_hand(void) {
    const float image[6] = {1, 2, 3, 4, 5, 6};
    double moment[16];
    whiten_patch_moment(image, 1, 1, 2, 3, moment);
    /* patches (1, 2, 4, 5) and (2, 3, 5, 6); moment = their outer products' mean */
    const double p0[4] = {1, 2, 4, 5}, p1[4] = {2, 3, 5, 6};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            CHECK_NEAR(moment[i * 4 + j], (p0[i] * p0[j] + p1[i] * p1[j]) / 2.0, 1e-12);
}

/* F C F^T = diag(l / (l + eps)) for the first K filters; the others are their negations. */
static void check_filters_whiten(uint64_t *rng) {
    enum { N = 4, C = 3, S = 8 };
    float images[N * C * S * S];
    for (int i = 0; i < N * C * S * S; i++) /* correlated neighbours, so C is far from I */
        images[i] = test_uniform(rng, -1, 1) + (i % S ? 0.7f * images[i - 1] : 0.0f);
    double moment[K * K], a[K * K], l[K], v[K * K];
    float filters[2 * K * K];
    whiten_patch_moment(images, N, C, S, S, moment);
    CHECK(whiten_filters(moment, K, WHITEN_EPS, filters) == 0);
    memcpy(a, moment, sizeof a);
    symmetric_eigen(a, K, l, v);
    double worst = 0;
    for (int f = 0; f < K; f++)
        for (int g = 0; g < K; g++) {
            double sum = 0;
            for (int i = 0; i < K; i++)
                for (int j = 0; j < K; j++) sum += filters[f * K + i] * moment[i * K + j] * filters[g * K + j];
            double want = f == g ? l[f] / (l[f] + WHITEN_EPS) : 0.0;
            worst = fmax(worst, fabs(sum - want));
        }
    printf("whitening: F C F^T within %.2g of diag(l / (l + eps))\n", worst);
    CHECK(worst < 1e-5);
    for (int j = 0; j < K * K; j++) CHECK(filters[K * K + j] == -filters[j]);
}

/* The model: the filters land in the whitening layer's weights in PyTorch's
 * order, its bias 0; lr_scale as model_reset_lr_scale says; then steps of
 * the trainer's optimizer over the model's buffers. */
static void check_model(uint64_t *rng) {
    enum { BATCH = 2, FROZEN_AFTER = 2 };
    Model m;
    build_airbench(&m, BATCH, 10, 0, (const int[3]){4, 6, 6});
    m.bn_weight_fixed = 1;
    m.bn_bias_lr_scale = 64.0f;
    model_finalize(&m, NULL, 9);
    int wl = model_whitening_layer(&m);
    CHECK(wl == 0 && m.lr_scale);
    const Layer *whiten = &m.layers[wl];
    float filters[2 * K * K];
    for (int j = 0; j < 2 * K * K; j++) filters[j] = test_uniform(rng, -1, 1);
    model_set_whitening(&m, filters);
    CHECK(memcmp(m.params + whiten->w_off, filters, sizeof filters) == 0);
    for (size_t j = 0; j < whiten->b_count; j++) CHECK(m.params[whiten->b_off + j] == 0.0f);

    float *before = malloc(m.n_params * sizeof(float)), *prev = malloc(m.n_params * sizeof(float));
    memcpy(before, m.params, m.n_params * sizeof(float));
    SgdParams p = {.momentum = 0.85f, .weight_decay = 1e-2f, .nesterov = 1, .lr_scale = m.lr_scale};
    int64_t counter = 0;
    float lr = 1e-2f;
    for (int step = 0; step < 4; step++) {
        memcpy(prev, m.params, m.n_params * sizeof(float));
        for (size_t j = 0; j < m.n_params; j++) ((float *)m.grads)[j] = test_uniform(rng, -1, 1);
        counter++; /* lr_schedule_step's */
        freeze_after_cpu(&counter, FROZEN_AFTER, m.lr_scale + whiten->b_off, whiten->b_count);
        sgd_step_cpu(m.params, m.grads, m.momentum, m.n_params, &lr, p);
        int bias_moved = memcmp(prev + whiten->b_off, m.params + whiten->b_off, whiten->b_count * sizeof(float));
        CHECK_MSG((bias_moved != 0) == (step < FROZEN_AFTER), "step %d: the whitening bias %s", step,
                  bias_moved ? "moved" : "stayed");
    }
    CHECK(memcmp(before + whiten->w_off, m.params + whiten->w_off, whiten->w_count * sizeof(float)) == 0);
    for (int i = 0; i < m.n_layers; i++) {
        const Layer *l = &m.layers[i];
        if (l->kind != LAYER_BATCHNORM) continue;
        for (size_t j = 0; j < l->w_count; j++) CHECK(m.params[l->w_off + j] == 1.0f && m.lr_scale[l->w_off + j] == 0);
        for (size_t j = 0; j < l->b_count; j++) CHECK(m.lr_scale[l->b_off + j] == 64.0f);
        CHECK(memcmp(before + l->b_off, m.params + l->b_off, l->b_count * sizeof(float)) != 0);
    }
    const Layer *head = &m.layers[m.n_layers - 2];
    CHECK(m.lr_scale[head->w_off] == 1.0f);
    model_reset_lr_scale(&m); /* a new run: the bias trains again */
    CHECK(m.lr_scale[whiten->b_off] == 1.0f && m.lr_scale[whiten->w_off] == 0.0f);
    free(before), free(prev);
    model_destroy(&m);

    /* Without any of it, no lr_scale: SGD's plain path. */
    char err[256];
    CHECK_MSG(model_build(&m, "simplenet", BATCH, 32, 10, 0, err, sizeof err) == 0, "%s", err);
    model_finalize(&m, NULL, 1);
    CHECK(m.lr_scale == NULL);
    model_destroy(&m);
}

/* model.muon: the six trained filters are Muon's (the whitening's are not),
 * their lr_scale 0 so SGD leaves them and their momentum alone; the head at
 * head_lr_scale. A trainer's step (SGD, then Muon) moves the filters exactly
 * as Muon alone does. */
static void check_muon_model(uint64_t *rng) {
    Model m;
    build_airbench(&m, 2, 10, 0, (const int[3]){4, 6, 6});
    m.bn_weight_fixed = 1;
    m.head_lr_scale = 0.25f;
    m.muon = 1;
    model_finalize(&m, NULL, 3);
    MuonMatrices mats;
    model_muon_matrices(&m, &mats);
    static const int rows[6] = {4, 4, 6, 6, 6, 6}, cols[6] = {24 * 9, 4 * 9, 4 * 9, 6 * 9, 6 * 9, 6 * 9};
    CHECK(mats.n == 6);
    for (int j = 0; j < mats.n && j < 6; j++) {
        CHECK_MSG(mats.mats[j].rows == rows[j] && mats.mats[j].cols == cols[j], "muon matrix %d: %d x %d", j,
                  mats.mats[j].rows, mats.mats[j].cols);
        CHECK(m.lr_scale[mats.mats[j].offset] == 0.0f && m.lr_scale[mats.mats[j].offset + rows[j] * cols[j] - 1] == 0.0f);
    }
    const Layer *head = &m.layers[m.n_layers - 2];
    CHECK(head->kind == LAYER_LINEAR && m.lr_scale[head->w_off] == 0.25f);
    CHECK(m.lr_scale[m.layers[0].b_off] == 1.0f); /* the whitening bias */

    size_t n = m.n_params;
    float *grads = m.grads, *alone_w = malloc(n * sizeof(float)), *alone_m = malloc(n * sizeof(float));
    for (size_t j = 0; j < n; j++) grads[j] = test_uniform(rng, -1, 1), m.momentum[j] = test_uniform(rng, -0.1f, 0.1f);
    memcpy(alone_w, m.params, n * sizeof(float));
    memcpy(alone_m, m.momentum, n * sizeof(float));
    MuonParams mp = {.momentum = 0.6f, .nesterov = 1, .ns_steps = 5, .lr_mult = 2.0f, .normalize_weights = 1};
    SgdParams sp = {.momentum = 0.85f, .weight_decay = 1e-2f, .nesterov = 1, .lr_scale = m.lr_scale};
    void *scratch = malloc(muon_scratch_bytes(&mats));
    float lr = 0.1f;
    sgd_step_cpu(m.params, grads, m.momentum, n, &lr, sp);
    muon_step_cpu(&mats, m.params, grads, m.momentum, &lr, NULL, mp, scratch);
    muon_step_cpu(&mats, alone_w, grads, alone_m, &lr, NULL, mp, scratch);
    for (int j = 0; j < mats.n; j++) {
        size_t at = mats.mats[j].offset, bytes = (size_t)mats.mats[j].rows * mats.mats[j].cols * sizeof(float);
        CHECK_MSG(memcmp(m.params + at, alone_w + at, bytes) == 0 && memcmp(m.momentum + at, alone_m + at, bytes) == 0,
                  "muon matrix %d: SGD touched it", j);
    }
    CHECK(memcmp(m.params + head->w_off, alone_w + head->w_off, head->w_count * sizeof(float)) != 0);
    free(alone_w), free(alone_m), free(scratch);
    model_destroy(&m);
}

int main(void) {
    uint64_t rng = test_seed();
    check_eigen_by_hand();
    check_eigen_known(&rng);
    check_moment_by_hand();
    check_filters_whiten(&rng);
    check_model(&rng);
    check_muon_model(&rng);
    return test_finish("test_whiten");
}
