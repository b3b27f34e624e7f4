#include "models/whiten.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"

/* One Jacobi rotation in the (p, q) plane, zeroing a[p][q]; the rotation is
 * accumulated into v. Golub & Van Loan's symmetric Schur decomposition. */
static void rotate(double *a, double *v, int n, int p, int q) {
    double apq = a[p * n + q];
    if (apq == 0.0) return;
    double theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
    double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
    double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
    for (int k = 0; k < n; k++) { /* columns p and q */
        double akp = a[k * n + p], akq = a[k * n + q];
        a[k * n + p] = c * akp - s * akq;
        a[k * n + q] = s * akp + c * akq;
    }
    for (int k = 0; k < n; k++) { /* rows p and q */
        double apk = a[p * n + k], aqk = a[q * n + k];
        a[p * n + k] = c * apk - s * aqk;
        a[q * n + k] = s * apk + c * aqk;
    }
    a[p * n + q] = a[q * n + p] = 0.0;
    for (int k = 0; k < n; k++) {
        double vkp = v[k * n + p], vkq = v[k * n + q];
        v[k * n + p] = c * vkp - s * vkq;
        v[k * n + q] = s * vkp + c * vkq;
    }
}

static double off_diagonal(const double *a, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (i != j) sum += a[i * n + j] * a[i * n + j];
    return sum;
}

int symmetric_eigen(double *a, int n, double *values, double *vectors) {
    double scale = 0.0;
    for (int i = 0; i < n * n; i++) scale += a[i] * a[i];
    for (int i = 0; i < n * n; i++) vectors[i] = i / n == i % n;
    int sweeps = 0;
    while (off_diagonal(a, n) > 1e-30 * scale) {
        if (++sweeps > 100) return -1;
        for (int p = 0; p < n - 1; p++)
            for (int q = p + 1; q < n; q++) rotate(a, vectors, n, p, q);
    }
    for (int i = 0; i < n; i++) values[i] = a[i * n + i];
    /* Ascending, as numpy's eigh: a selection sort moving whole columns. */
    for (int i = 0; i < n; i++) {
        int low = i;
        for (int j = i + 1; j < n; j++)
            if (values[j] < values[low]) low = j;
        if (low == i) continue;
        double tv = values[i];
        values[i] = values[low], values[low] = tv;
        for (int r = 0; r < n; r++) {
            double t = vectors[r * n + i];
            vectors[r * n + i] = vectors[r * n + low], vectors[r * n + low] = t;
        }
    }
    return sweeps;
}

void whiten_patch_moment(const float *images, int n, int c, int h, int w, double *moment) {
    int k = 4 * c;
    size_t windows = (size_t)n * (h - 1) * (w - 1);
    memset(moment, 0, sizeof(double) * k * k);
    double patch[4 * 4]; /* up to 4 channels */
    if (c > 4) TC_FATAL("whitening: %d channels (at most 4)", c);
    for (int img = 0; img < n; img++)
        for (int y = 0; y + 1 < h; y++)
            for (int x = 0; x + 1 < w; x++) {
                for (int ch = 0; ch < c; ch++) {
                    const float *plane = images + ((size_t)img * c + ch) * h * w;
                    for (int d = 0; d < 4; d++) patch[ch * 4 + d] = plane[(y + d / 2) * w + x + d % 2];
                }
                for (int i = 0; i < k; i++)
                    for (int j = 0; j <= i; j++) moment[i * k + j] += patch[i] * patch[j];
            }
    for (int i = 0; i < k; i++)
        for (int j = 0; j <= i; j++) moment[i * k + j] = moment[j * k + i] = moment[i * k + j] / (double)windows;
}

int whiten_filters(const double *moment, int k, double eps, float *filters) {
    double *a = malloc(sizeof(double) * k * k), *v = malloc(sizeof(double) * k * k), *l = malloc(sizeof(double) * k);
    if (!a || !v || !l) TC_FATAL("out of host memory: whitening");
    memcpy(a, moment, sizeof(double) * k * k);
    int ok = symmetric_eigen(a, k, l, v) >= 0;
    for (int f = 0; ok && f < k; f++) {
        double gain = 1.0 / sqrt(l[f] + eps);
        for (int j = 0; j < k; j++) {
            filters[f * k + j] = (float)(gain * v[j * k + f]);
            filters[(k + f) * k + j] = -filters[f * k + j];
        }
    }
    free(a), free(v), free(l);
    return ok ? 0 : -1;
}

int model_whitening_layer(const Model *m) {
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].whitening) return i;
    return -1;
}

int whitening_frozen_prefix(const Model *m) {
    int w = model_whitening_layer(m);
    if (w < 0) return 0;
    for (int i = 0; i < w; i++)
        if (m->layers[i].w_count) return 0;
    int end = w + 1;
    while (end < m->n_layers && m->layers[end].w_count == 0) end++;
    return end;
}

void model_set_whitening(Model *m, const float *filters) {
    int i = model_whitening_layer(m);
    if (i < 0) TC_FATAL("model_set_whitening: the model has no whitening layer");
    const Layer *l = &m->layers[i];
    float *host = malloc(m->n_params * sizeof(float));
    if (!host) TC_FATAL("out of host memory: whitening");
    model_get_params(m, host);
    size_t real = l->w_count / m->acts[l->in].c * m->acts[l->in].c_real; /* NHWC's padded channels stay 0 */
    for (size_t j = 0; j < real; j++) host[l->w_off + model_weight_index(m, l, j)] = filters[j];
    for (size_t j = 0; j < l->b_count; j++) host[l->b_off + j] = 0.0f;
    model_set_params(m, host);
    free(host);
}
