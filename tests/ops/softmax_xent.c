/* Softmax cross-entropy (ops/softmax_xent.h), plain and with label smoothing:
 * the loss and dlogits against the CPU reference, grad_scale
 * read from the device (NULL meaning 1), the same bits on a second run
 * (a fixed reduction order), numerically stable at large logits; smoothing 0
 * the unsmoothed op to the bit; batches of 1 to 20011 rows, so the CUDA kernel
 * spans one to all of its blocks. On the CPU, dlogits by finite differences and
 * each row of it summing to 0; smoothing by hand (PyTorch's definition). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/softmax_xent.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

typedef struct {
    float *logits, *dl;
    int32_t *labels;
    int n, classes;
} XentLoss;

static double xent_loss(void *p) {
    XentLoss *x = p;
    float loss;
    softmax_xent_cpu(x->logits, x->labels, x->n, x->classes, NULL, &loss, x->dl);
    return loss;
}

static void softmax_finite_differences(int n, int classes, const float *logits,
                                       const int32_t *labels, const float *dl) {
    size_t total = (size_t)n * classes;
    XentLoss x = {copy_floats(logits, total), host_floats(total), (int32_t *)labels, n, classes};
    double *num = malloc(sizeof(double) * total);
    numeric_gradient(x.logits, total, 1e-2f, xent_loss, &x, num);
    char what[80];
    snprintf(what, sizeof what, "softmax %dx%d dlogits", n, classes);
    check_gradient(what, dl, num, total);
    double row_sum = 0; /* each row of dlogits sums to 0 */
    for (int j = 0; j < classes; j++) row_sum += dl[j];
    CHECK_NEAR(row_sum, 0, 1e-6);
    free(x.logits), free(x.dl), free(num);
}

/* grad_scale 0 passes NULL (meaning 1); otherwise it is read from c's device. */
static void softmax_shape(const GridCase *c, int n, int classes, float grad_scale, float spread) {
    printf(" n=%d classes=%d grad_scale=%g logits in +-%g\n", n, classes, grad_scale, spread);
    DType dt = c->dtype;
    size_t total = (size_t)n * classes;
    float *logits = grid_random(c, dt, total, -spread, spread);
    int32_t *labels = grid_random_labels(c, n, classes);
    float loss = 0, *dl = host_floats(total);
    softmax_xent_cpu(logits, labels, n, classes, grad_scale ? &grad_scale : NULL, &loss, dl);
    round_to(dt, dl, total);

    void *d_logits = grid_put(c, dt, logits, total), *d_dl = grid_alloc(c, dt, total);
    float *d_loss = grid_alloc(c, DTYPE_F32, 1); /* written, not accumulated */
    float *d_scale = grad_scale ? grid_put(c, DTYPE_F32, &grad_scale, 1) : NULL;
    int32_t *d_labels = grid_put_bytes(c, labels, sizeof(int32_t) * n);
    softmax_xent_smooth(&c->ctx, d_logits, d_labels, n, classes, 0.0f, d_scale, d_loss, d_dl);
    float *gloss = grid_get(c, DTYPE_F32, d_loss, 1), *gdl = grid_get(c, dt, d_dl, total);
    /* the same logits on both sides, the loss in fp32 and double: as close as in fp32 */
    printf("  %-20s loss %.9g, reference %.9g\n", c->name, *gloss, loss);
    CHECK_MSG(fabs(*gloss - loss) <= 1e-5 * (1 + fabs(loss)), "%s softmax loss %.9g, reference %.9g", c->name,
              *gloss, loss);
    grid_check(c, "softmax dlogits", gdl, dl, total, grid_bound(c, GRID_SOFTMAX));

    /* deterministic: a second run gives the same bits */
    grid_poison(c, DTYPE_F32, d_loss, 1);
    softmax_xent_smooth(&c->ctx, d_logits, d_labels, n, classes, 0.0f, d_scale, d_loss, d_dl);
    float *gloss2 = grid_get(c, DTYPE_F32, d_loss, 1), *gdl2 = grid_get(c, dt, d_dl, total);
    grid_check_same(c, "softmax loss (second run)", gloss2, gloss, sizeof(float));
    grid_check_same(c, "softmax dlogits (second run)", gdl2, gdl, total * sizeof(float));

    if (c->device == DEVICE_CPU && total <= 100 && !grad_scale)
        softmax_finite_differences(n, classes, logits, labels, gdl);

    void *dev[] = {d_logits, d_dl, d_loss, d_scale, d_labels};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {logits, labels, dl, gloss, gdl, gloss2, gdl2};
    host_free_all(host, GRID_COUNT(host));
}

/* ---- label smoothing (ResNet's recipe) -------------------------------------------- */

/* The old ResNet test's bounds: fp32 a few roundings, the halves rounded once. */
static const GridBound SMOOTH_DLOGITS = {1e-5, 3e-3, 1e-2};

/* The smoothed loss and dlogits against the reference, with a grad_scale of 4;
 * smoothing 0 through the face is the unsmoothed op, to the bit. */
static void softmax_smoothing_shape(const GridCase *c, int n, int classes, float smoothing) {
    printf(" n=%d classes=%d smoothing %g\n", n, classes, smoothing);
    DType dt = c->dtype;
    size_t total = (size_t)n * classes;
    float *logits = grid_random(c, dt, total, -5, 5), *dl = host_floats(total), loss = 0, scale = 4.0f;
    int32_t *labels = grid_random_labels(c, n, classes);
    softmax_xent_smooth_cpu(logits, labels, n, classes, smoothing, &scale, &loss, dl);
    void *d_logits = grid_put(c, dt, logits, total), *d_dl = grid_alloc(c, dt, total);
    float *d_loss = grid_alloc(c, DTYPE_F32, 1), *d_scale = grid_put(c, DTYPE_F32, &scale, 1);
    int32_t *d_labels = grid_put_bytes(c, labels, sizeof(int32_t) * n);
    softmax_xent_smooth(&c->ctx, d_logits, d_labels, n, classes, smoothing, d_scale, d_loss, d_dl);
    float *gloss = grid_get(c, DTYPE_F32, d_loss, 1), *gdl = grid_get(c, dt, d_dl, total);
    printf("  %-20s smoothed loss %.9g, reference %.9g\n", c->name, *gloss, loss);
    CHECK_MSG(fabs(*gloss - loss) <= 1e-5 * (1 + fabs(loss)), "%s smoothed loss %.9g, reference %.9g", c->name,
              *gloss, loss);
    grid_check(c, "smoothed dlogits", gdl, dl, total, grid_bound(c, SMOOTH_DLOGITS));

    if (c->device == DEVICE_CPU) softmax_xent_cpu(logits, labels, n, classes, &scale, d_loss, d_dl);
    else GPU_ONLY(softmax_xent_cuda(dt, d_logits, d_labels, n, classes, d_scale, d_loss, d_dl, c->ctx.stream));
    float *loss_plain = grid_get(c, DTYPE_F32, d_loss, 1), *dl_plain = grid_get(c, dt, d_dl, total);
    softmax_xent_smooth(&c->ctx, d_logits, d_labels, n, classes, 0.0f, d_scale, d_loss, d_dl);
    float *loss_zero = grid_get(c, DTYPE_F32, d_loss, 1), *dl_zero = grid_get(c, dt, d_dl, total);
    grid_check_same(c, "dlogits (smoothing 0 vs the unsmoothed op)", dl_zero, dl_plain, total * sizeof(float));
    grid_check_same(c, "loss (smoothing 0 vs the unsmoothed op)", loss_zero, loss_plain, sizeof(float));
    void *dev[] = {d_logits, d_dl, d_loss, d_scale, d_labels};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {logits, dl, labels, gloss, gdl, loss_plain, dl_plain, loss_zero, dl_zero};
    host_free_all(host, GRID_COUNT(host));
}

typedef struct {
    float *logits, *dl;
    int32_t *labels;
    int n, classes;
    float smoothing;
} SmoothLoss;

static double smooth_loss(void *p) {
    SmoothLoss *x = p;
    float loss;
    softmax_xent_smooth_cpu(x->logits, x->labels, x->n, x->classes, x->smoothing, NULL, &loss, x->dl);
    return loss;
}

/* PyTorch's definition by hand; finite differences; grad_scale doubling
 * dlogits only; smoothing 0 the unsmoothed op, to the bit. */
static void softmax_smoothing_by_hand(uint64_t *rng) {
    /* one row: -sum_j q_j log p_j, q = (1 - eps) onehot + eps / K */
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

    int n = 4, classes = 5;
    size_t total = (size_t)n * classes;
    SmoothLoss x = {host_floats(total), host_floats(total), host_bytes(sizeof(int32_t) * n), n, classes, 0.2f};
    test_fill_uniform(x.logits, total, rng, -3, 3);
    for (int i = 0; i < n; i++) x.labels[i] = (int32_t)(test_uniform(rng, 0, 1) * classes) % classes;
    float *g = host_floats(total), *g2 = host_floats(total), scale = 2.0f, loss2;
    softmax_xent_smooth_cpu(x.logits, x.labels, n, classes, x.smoothing, NULL, &loss, g);
    double *num = malloc(sizeof(double) * total);
    numeric_gradient(x.logits, total, 1e-2f, smooth_loss, &x, num);
    check_gradient("smoothed softmax dlogits 4x5 (eps 0.2)", g, num, total);
    softmax_xent_smooth_cpu(x.logits, x.labels, n, classes, x.smoothing, &scale, &loss2, g2);
    for (size_t i = 0; i < total; i++) g[i] *= 2.0f;
    CHECK_MSG(!memcmp(g, g2, total * sizeof(float)) && loss == loss2, "grad_scale 2 does not double dlogits");
    float loss_plain, loss_zero;
    softmax_xent_cpu(x.logits, x.labels, n, classes, NULL, &loss_plain, g);
    softmax_xent_smooth_cpu(x.logits, x.labels, n, classes, 0.0f, NULL, &loss_zero, g2);
    CHECK_MSG(!memcmp(g, g2, total * sizeof(float)) && loss_plain == loss_zero,
              "softmax_xent_smooth with eps 0 differs from softmax_xent");
    void *host[] = {x.logits, x.dl, x.labels, g, g2, num};
    host_free_all(host, GRID_COUNT(host));
}

static void softmax_case(const GridCase *c) {
    softmax_shape(c, 512, 10, 0, 5.0f);
    softmax_shape(c, 100, 1000, 0, 5.0f);
    softmax_shape(c, 4096, 10, 1.0f, 5.0f);
    softmax_shape(c, 37, 3, 0.5f, 5.0f);
    softmax_shape(c, 1, 10, 128.0f, 5.0f);
    softmax_shape(c, 512, 10, 65536.0f, 5.0f); /* the loss scaler's first scale */
    softmax_shape(c, 64, 10, 0, 500.0f);       /* numerically stable at large logits */
    /* small enough for finite differences on the CPU */
    softmax_shape(c, 4, 5, 0, 3.0f);
    softmax_shape(c, 3, 10, 0, 3.0f);
    softmax_shape(c, 1, 2, 0, 3.0f);
    softmax_smoothing_shape(c, 512, 10, 0.1f);
    softmax_smoothing_shape(c, 37, 1000, 0.3f);
    /* batches over many blocks of the CUDA kernel (8 rows a block, at most
     * 1024 blocks, then a grid stride): the per-block loss sums and their
     * fixed-order total, the block count not a round number */
    softmax_shape(c, 1024, 10, 0, 5.0f);
    softmax_shape(c, 5003, 10, 2.0f, 5.0f);
    softmax_shape(c, 20011, 10, 0, 5.0f);
    softmax_shape(c, 1, 1000, 0, 5.0f);
    softmax_shape(c, 1024, 1000, 0.5f, 5.0f);
    softmax_shape(c, 5000, 1000, 0, 5.0f);
    softmax_smoothing_shape(c, 5003, 10, 0.2f);
    softmax_smoothing_shape(c, 1024, 1000, 0.1f);
}

static void softmax_by_hand(uint64_t *rng) {
    softmax_smoothing_by_hand(rng);
    /* row 0 [1 2 3] label 2: loss = log(e + e^2 + e^3) - 3; row 1 uniform: log 3 */
    float logits[6] = {1, 2, 3, 0, 0, 0}, loss = NAN, dl[6];
    int32_t labels[2] = {2, 1};
    softmax_xent_cpu(logits, labels, 2, 3, NULL, &loss, dl);
    CHECK_NEAR(loss, (0.4076059644443806 + 1.0986122886681098) / 2, 1e-6);
    double want[6] = {0.09003057317038046 / 2, 0.24472847105479764 / 2, (0.6652409557748218 - 1) / 2, 1.0 / 6,
                      -1.0 / 3, 1.0 / 6};
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
    /* grad_scale NULL is 1, bit for bit */
    float one = 1.0f, dl_null[6], dl_one[6], loss_a, loss_b;
    softmax_xent_cpu(logits, labels, 2, 3, NULL, &loss_a, dl_null);
    softmax_xent_cpu(logits, labels, 2, 3, &one, &loss_b, dl_one);
    CHECK_MSG(!memcmp(dl_null, dl_one, sizeof dl_one) && loss_a == loss_b, "grad_scale NULL is not 1");
}

const GridOp grid_op_softmax_xent = {
    .name = "softmax_xent",
    .run = softmax_case,
    .extras = softmax_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (logits [n][classes] have no channels-last form)",
};
