/* CUDA ops against the CPU reference: fresh random inputs each run, outputs
 * poisoned with NaN before each CUDA call (an element the op fails to write
 * shows up as NaN, which test_rel_error turns into +inf), accumulators prefilled
 * with the same random values on both sides. Ends with a CUDA graph capture of a
 * whole training step, which fails on any host sync, legacy-stream use or
 * capture-unsafe call inside an op. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/accuracy.h"
#include "ops/conv2d.h"
#include "ops/linear.h"
#include "ops/maxpool.h"
#include "ops/relu.h"
#include "ops/sgd.h"
#include "ops/softmax_xent.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/op_buffers.h"

#define CONV_WORKSPACE_LIMIT ((size_t)512 << 20)
/* Full fp32 and deterministic algorithms, so GPU and CPU agree closely and runs repeat. */
static const ConvAlgoPolicy strict_fp32 = {CONV_WORKSPACE_LIMIT, 0, 1, 0};

static uint64_t rng;
static GpuContext g;

static void upload(void *dst, const void *src, size_t bytes) { upload_on(g.compute, dst, src, bytes); }
static void download(void *dst, const void *src, size_t bytes) { download_on(g.compute, dst, src, bytes); }

/* ---- host and device buffers -------------------------------------------------- */

static float *random_floats(size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, &rng, lo, hi);
    return p;
}

static float *dev_floats(size_t n) { return dev_bytes(n * sizeof(float)); }

static float *dev_copy(const float *host, size_t n) {
    float *p = dev_floats(n);
    upload(p, host, n * sizeof(float));
    return p;
}

static float *download_floats(const float *dev, size_t n) {
    float *p = host_floats(n);
    download(p, dev, n * sizeof(float));
    return p;
}

/* All-ones bytes are a NaN in float32. */
static void poison(float *dev, size_t n) {
    CUDA_CHECK(cudaMemsetAsync(dev, 0xff, n * sizeof(float), g.compute));
}

static void check_rel(const char *what, const float *gpu, const float *cpu, size_t n, double tol) {
    double err = test_rel_error(gpu, cpu, n);
    printf("  %-58s rel err %.2e\n", what, err);
    CHECK_MSG(err <= tol, "%s: relative error %.3g > %.3g", what, err, tol);
}

static int same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* ---- maxpool ------------------------------------------------------------------ */

/* With 'ties', inputs take only the values 0, 1, 2, so most windows hold several
 * equal maxima and the CPU's first-maximum rule is checked against cuDNN's. */
static void test_maxpool(Pool2dShape s, int ties) {
    printf("maxpool %dx%dx%dx%d window %d stride %d pad %d%s\n", s.n, s.c, s.h, s.w, pool2d_window(&s),
           pool2d_stride(&s), s.pad, ties ? " (ties)" : "");
    size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = (size_t)s.n * s.c * pool2d_out_h(&s) * pool2d_out_w(&s);
    float *x = random_floats(nx, -1, 1), *dy = random_floats(ny, -1, 1);
    if (ties)
        for (size_t i = 0; i < nx; i++) x[i] = floorf((x[i] + 1.0f) * 1.5f);
    float *y = host_floats(ny), *dx = host_floats(nx);
    maxpool2x2_forward_cpu(&s, x, y);
    maxpool2x2_backward_cpu(&s, x, y, dy, dx);

    MaxPoolCuda p;
    maxpool2x2_cuda_init(&p, &s, DTYPE_F32, 0);
    float *d_x = dev_copy(x, nx), *d_y = dev_floats(ny), *d_dy = dev_copy(dy, ny);
    float *d_dx = dev_floats(nx);
    poison(d_y, ny);
    poison(d_dx, nx);
    maxpool2x2_forward_cuda(&p, g.cudnn, d_x, d_y);
    maxpool2x2_backward_cuda(&p, g.cudnn, d_x, d_y, d_dy, d_dx);
    float *gy = download_floats(d_y, ny), *gdx = download_floats(d_dx, nx);
    check_rel(ties ? "maxpool y (ties)" : "maxpool y", gy, y, ny, 0);
    /* Overlapping windows add their gradients, in another order than the CPU's. */
    check_rel(ties ? "maxpool dx (ties: first maximum)" : "maxpool dx", gdx, dx, nx, s.pad ? 1e-6 : 0);

    maxpool2x2_cuda_destroy(&p);
    free(x), free(dy), free(y), free(dx), free(gy), free(gdx);
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
    CUDA_CHECK(cudaFree(d_dy));
    CUDA_CHECK(cudaFree(d_dx));
}

/* ---- conv2d ------------------------------------------------------------------ */

/* Whether cuDNN's heuristics call the three chosen algorithms deterministic.
 * conv2d_cuda_init prefers those, but may fall back to others. */
static int conv_algos_deterministic(const Conv2dCuda *c) {
    int deterministic = 1, count = 0, found = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(g.cudnn, c->x_desc, c->w_desc, c->conv_desc,
                                                       c->y_desc, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                       &count, fwd));
    for (int i = 0; i < count; i++)
        if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].algo == c->fwd_algo && !found++)
            deterministic &= fwd[i].determinism == CUDNN_DETERMINISTIC;
    cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        g.cudnn, c->w_desc, c->y_desc, c->conv_desc, c->x_desc,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, data));
    found = 0;
    for (int i = 0; i < count; i++)
        if (data[i].status == CUDNN_STATUS_SUCCESS && data[i].algo == c->bwd_data_algo && !found++)
            deterministic &= data[i].determinism == CUDNN_DETERMINISTIC;
    cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        g.cudnn, c->x_desc, c->y_desc, c->conv_desc, c->w_desc,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, filter));
    found = 0;
    for (int i = 0; i < count; i++)
        if (filter[i].status == CUDNN_STATUS_SUCCESS && filter[i].algo == c->bwd_filter_algo &&
            !found++)
            deterministic &= filter[i].determinism == CUDNN_DETERMINISTIC;
    return deterministic;
}

static void test_conv_with(Conv2dShape s, const ConvAlgoPolicy *policy) {
    int oh = conv2d_out_h(&s), ow = conv2d_out_w(&s);
    size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.r * s.s;
    size_t ny = (size_t)s.n * s.k * oh * ow;
    float w_scale = 1.0f / sqrtf((float)(s.c * s.r * s.s));
    float *x = random_floats(nx, -1, 1), *w = random_floats(nw, -w_scale, w_scale);
    float *b = random_floats(s.k, -1, 1), *dy = random_floats(ny, -1, 1);
    float *dw0 = random_floats(nw, -1, 1), *db0 = random_floats(s.k, -1, 1);

    float *y = host_floats(ny), *dx = host_floats(nx);
    float *dw = copy_floats(dw0, nw), *db = copy_floats(db0, s.k);
    conv2d_forward_cpu(&s, x, w, b, y);
    conv2d_backward_cpu(&s, x, w, dy, dx, dw, db);

    Conv2dCuda c;
    conv2d_cuda_init(&c, g.cudnn, &s, DTYPE_F32, 0, policy);
    int deterministic = conv_algos_deterministic(&c);
    printf("conv %dx%dx%dx%d -> %d, %dx%d pad %d stride %d: algos fwd %d bwd-data %d "
           "bwd-filter %d (%s), workspace %zu bytes\n", s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.pad,
           s.stride, (int)c.fwd_algo, (int)c.bwd_data_algo, (int)c.bwd_filter_algo,
           deterministic ? "deterministic" : "NOT all deterministic", c.workspace_bytes);
    CHECK(c.workspace_bytes <= CONV_WORKSPACE_LIMIT);
    void *ws = c.workspace_bytes ? dev_bytes(c.workspace_bytes) : NULL;
    float *d_x = dev_copy(x, nx), *d_w = dev_copy(w, nw), *d_b = dev_copy(b, s.k);
    float *d_dy = dev_copy(dy, ny), *d_y = dev_floats(ny), *d_dx = dev_floats(nx);
    float *d_dw = dev_copy(dw0, nw), *d_db = dev_copy(db0, s.k);

    poison(d_y, ny);
    conv2d_forward_cuda(&c, g.cudnn, d_x, d_w, d_b, d_y, ws);
    poison(d_dx, nx);
    conv2d_backward_cuda(&c, g.cudnn, d_x, d_w, d_dy, d_dx, d_dw, d_db, ws);
    float *gy = download_floats(d_y, ny), *gdx = download_floats(d_dx, nx);
    float *gdw = download_floats(d_dw, nw), *gdb = download_floats(d_db, s.k);
    /* cuDNN may pick FFT or Winograd: close to, not equal to, the direct sum */
    check_rel("conv y", gy, y, ny, 1e-4);
    check_rel("conv dx", gdx, dx, nx, 1e-4);
    check_rel("conv dw (accumulated onto random dw)", gdw, dw, nw, 1e-4);
    check_rel("conv db (accumulated onto random db)", gdb, db, s.k, 1e-4);

    /* the same step again, with dx == NULL: the same dw and db (the same bits when
     * the algorithms are deterministic) */
    upload(d_dw, dw0, nw * sizeof(float));
    upload(d_db, db0, s.k * sizeof(float));
    poison(d_y, ny);
    conv2d_forward_cuda(&c, g.cudnn, d_x, d_w, d_b, d_y, ws);
    conv2d_backward_cuda(&c, g.cudnn, d_x, d_w, d_dy, NULL, d_dw, d_db, ws);
    float *gy2 = download_floats(d_y, ny), *gdw2 = download_floats(d_dw, nw);
    float *gdb2 = download_floats(d_db, s.k);
    if (deterministic) {
        CHECK_MSG(same_bits(gy, gy2, ny), "conv forward is not reproducible");
        CHECK_MSG(same_bits(gdw, gdw2, nw), "conv dw differs between runs (or with dx == NULL)");
    } else {
        check_rel("conv y (second run)", gy2, gy, ny, 1e-5);
        check_rel("conv dw (second run, dx == NULL)", gdw2, gdw, nw, 1e-5);
    }
    check_rel("conv db (second run, dx == NULL)", gdb2, gdb, s.k, 1e-6);
    if (!same_bits(gdb, gdb2, s.k)) printf("  note: conv db is not bit-reproducible\n");

    conv2d_cuda_destroy(&c);
    free(x), free(w), free(b), free(dy), free(dw0), free(db0), free(y), free(dx), free(dw);
    free(db), free(gy), free(gdx), free(gdw), free(gdb), free(gy2), free(gdw2), free(gdb2);
    if (ws) CUDA_CHECK(cudaFree(ws));
    float *dev[] = {d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) CUDA_CHECK(cudaFree(dev[i]));
}

static void test_conv(Conv2dShape s) { test_conv_with(s, &strict_fp32); }

/* ---- softmax cross-entropy ------------------------------------------------------ */

static int32_t *random_labels(int n, int classes) {
    int32_t *labels = host_bytes(sizeof(int32_t) * (n ? n : 1));
    for (int i = 0; i < n; i++) {
        labels[i] = (int32_t)(test_uniform(&rng, 0, 1) * classes);
        if (labels[i] >= classes) labels[i] = classes - 1;
    }
    return labels;
}

static void test_softmax(int n, int classes, float grad_scale, float spread) {
    printf("softmax_xent n=%d classes=%d grad_scale=%g logits in +-%g\n", n, classes, grad_scale,
           spread);
    size_t total = (size_t)n * classes;
    float *logits = random_floats(total, -spread, spread);
    int32_t *labels = random_labels(n, classes);
    float loss = 0, *dl = host_floats(total);
    softmax_xent_cpu(logits, labels, n, classes, &grad_scale, &loss, dl);

    float *d_logits = dev_copy(logits, total), *d_dl = dev_floats(total), *d_loss = dev_floats(1);
    float *d_scale = dev_copy(&grad_scale, 1);
    int32_t *d_labels = dev_bytes(sizeof(int32_t) * n);
    upload(d_labels, labels, sizeof(int32_t) * n);
    poison(d_dl, total);
    poison(d_loss, 1); /* written, not accumulated */
    softmax_xent_cuda(DTYPE_F32, d_logits, d_labels, n, classes, d_scale, d_loss, d_dl, g.compute);
    float gloss, *gdl = download_floats(d_dl, total);
    download(&gloss, d_loss, sizeof gloss);
    printf("  loss gpu %.9g cpu %.9g\n", gloss, loss);
    CHECK_MSG(fabs(gloss - loss) <= 1e-5 * (1 + fabs(loss)), "softmax loss %.9g, cpu %.9g", gloss,
              loss);
    check_rel("softmax dlogits", gdl, dl, total, 1e-5);

    /* deterministic: a second run gives the same bits */
    poison(d_loss, 1);
    softmax_xent_cuda(DTYPE_F32, d_logits, d_labels, n, classes, d_scale, d_loss, d_dl, g.compute);
    float gloss2, *gdl2 = download_floats(d_dl, total);
    download(&gloss2, d_loss, sizeof gloss2);
    CHECK_MSG(same_bits(&gloss, &gloss2, 1) && same_bits(gdl, gdl2, total),
              "softmax_xent is not reproducible");

    free(logits), free(labels), free(dl), free(gdl), free(gdl2);
    CUDA_CHECK(cudaFree(d_logits));
    CUDA_CHECK(cudaFree(d_dl));
    CUDA_CHECK(cudaFree(d_loss));
    CUDA_CHECK(cudaFree(d_scale));
    CUDA_CHECK(cudaFree(d_labels));
}

/* ---- sgd ------------------------------------------------------------------ */

static void test_sgd(size_t n, SgdParams p) {
    printf("sgd n=%zu momentum %g weight_decay %g nesterov %d\n", n, p.momentum, p.weight_decay,
           p.nesterov);
    float *w = random_floats(n, -1, 1), *m = random_floats(n, -0.1f, 0.1f), *grad = host_floats(n);
    float *d_w = dev_copy(w, n), *d_m = dev_copy(m, n), *d_grad = dev_floats(n);
    float *d_lr = dev_floats(1);
    const float lrs[3] = {0.1f, 0.02f, 0.5f};
    for (int step = 0; step < 3; step++) {
        test_fill_uniform(grad, n, &rng, -1, 1);
        upload(d_grad, grad, n * sizeof(float));
        upload(d_lr, &lrs[step], sizeof(float));
        sgd_step_cpu(w, grad, m, n, &lrs[step], p);
        sgd_step_cuda(d_w, d_grad, d_m, n, d_lr, p, g.compute);
    }
    float *gw = download_floats(d_w, n), *gm = download_floats(d_m, n);
    /* the GPU may fuse multiply-adds: a rounding apart per step */
    check_rel("sgd w", gw, w, n, 1e-6);
    check_rel("sgd m", gm, m, n, 1e-5);
    free(w), free(m), free(grad), free(gw), free(gm);
    CUDA_CHECK(cudaFree(d_w));
    CUDA_CHECK(cudaFree(d_m));
    CUDA_CHECK(cudaFree(d_grad));
    CUDA_CHECK(cudaFree(d_lr));
}

/* ---- accuracy ------------------------------------------------------------------ */

static void test_accuracy(int n, int classes, int ties) {
    printf("accuracy n=%d classes=%d%s\n", n, classes, ties ? " (ties)" : "");
    size_t total = (size_t)n * classes;
    float *logits = random_floats(total, -1, 1);
    if (ties)
        for (size_t i = 0; i < total; i++) logits[i] = floorf(logits[i] + 1.0f);
    int32_t *labels = random_labels(n, classes);
    for (int i = 0; i < n; i += 2) { /* make about half the rows right */
        const float *row = logits + (size_t)i * classes;
        int best = 0;
        for (int j = 1; j < classes; j++)
            if (row[j] > row[best]) best = j;
        labels[i] = best;
    }
    int want = accuracy_count_cpu(logits, labels, n, classes);

    float *d_logits = dev_copy(logits, total);
    int32_t *d_labels = dev_bytes(sizeof(int32_t) * n);
    int *d_count = dev_bytes(sizeof(int));
    upload(d_labels, labels, sizeof(int32_t) * n);
    int start = 5;
    upload(d_count, &start, sizeof start);
    accuracy_count_cuda(DTYPE_F32, d_logits, d_labels, n, classes, d_count, g.compute);
    int got = 0;
    download(&got, d_count, sizeof got);
    CHECK_MSG(got == start + want, "accuracy: counter %d, want %d + %d", got, start, want);
    accuracy_count_cuda(DTYPE_F32, d_logits, d_labels, n, classes, d_count, g.compute);
    download(&got, d_count, sizeof got);
    CHECK_MSG(got == start + 2 * want, "accuracy (second pass): counter %d, want %d", got,
              start + 2 * want);
    printf("  %d of %d right\n", want, n);

    free(logits), free(labels);
    CUDA_CHECK(cudaFree(d_logits));
    CUDA_CHECK(cudaFree(d_labels));
    CUDA_CHECK(cudaFree(d_count));
}

/* ---- a whole training step, eagerly and as a captured CUDA graph ---------------- */

/* conv 3->8 (8x8) -> relu in place -> maxpool -> linear 8*4*4 -> 10 -> softmax_xent,
 * backward, SGD, accuracy: every op the model uses, in one stream. */
typedef struct {
    Conv2dShape conv;
    Pool2dShape pool;
    LinearShape fc;
    Conv2dCuda conv_cuda;
    MaxPoolCuda pool_cuda;
    size_t n_params, conv_w, conv_b, fc_w, fc_b; /* offsets into the flat buffers */
    float *params, *grads, *momentum, *lr;
    float *x, *conv_y, *pool_y, *logits, *loss;
    float *d_logits, *d_pool_y, *d_conv_y, *d_x;
    int32_t *labels;
    int *correct;
    void *workspace;
} TinyNet;

static void tiny_net_init(TinyNet *t) {
    memset(t, 0, sizeof *t);
    t->conv = (Conv2dShape){.n = 4, .c = 3, .h = 8, .w = 8, .k = 8, .r = 3, .s = 3, .pad = 1, .stride = 1};
    t->pool = (Pool2dShape){.n = 4, .c = 8, .h = 8, .w = 8};
    t->fc = (LinearShape){.n = 4, .in = 8 * 4 * 4, .out = 10};
    conv2d_cuda_init(&t->conv_cuda, g.cudnn, &t->conv, DTYPE_F32, 0, &strict_fp32);
    maxpool2x2_cuda_init(&t->pool_cuda, &t->pool, DTYPE_F32, 0);
    t->conv_w = 0;
    t->conv_b = t->conv_w + 8 * 3 * 3 * 3;
    t->fc_w = t->conv_b + 8;
    t->fc_b = t->fc_w + 10 * 128;
    t->n_params = t->fc_b + 10;
    t->params = dev_floats(t->n_params);
    t->grads = dev_floats(t->n_params);
    t->momentum = dev_floats(t->n_params);
    t->lr = dev_floats(1);
    t->x = dev_floats(4 * 3 * 8 * 8);
    t->d_x = dev_floats(4 * 3 * 8 * 8);
    t->conv_y = dev_floats(4 * 8 * 8 * 8);
    t->d_conv_y = dev_floats(4 * 8 * 8 * 8);
    t->pool_y = dev_floats(4 * 128);
    t->d_pool_y = dev_floats(4 * 128);
    t->logits = dev_floats(4 * 10);
    t->d_logits = dev_floats(4 * 10);
    t->loss = dev_floats(1);
    t->labels = dev_bytes(4 * sizeof(int32_t));
    t->correct = dev_bytes(sizeof(int));
    t->workspace = t->conv_cuda.workspace_bytes ? dev_bytes(t->conv_cuda.workspace_bytes) : NULL;
}

static void tiny_net_reset(TinyNet *t, const float *params, const float *x, const int32_t *labels,
                           float lr) {
    upload(t->params, params, t->n_params * sizeof(float));
    upload(t->x, x, 4 * 3 * 8 * 8 * sizeof(float));
    upload(t->labels, labels, 4 * sizeof(int32_t));
    upload(t->lr, &lr, sizeof lr);
    CUDA_CHECK(cudaMemsetAsync(t->momentum, 0, t->n_params * sizeof(float), g.compute));
    CUDA_CHECK(cudaMemsetAsync(t->correct, 0, sizeof(int), g.compute));
    CUDA_CHECK(cudaStreamSynchronize(g.compute));
}

/* Only stream work: no sync, no allocation, so it can be captured. */
static void tiny_net_step(TinyNet *t) {
    float *p = t->params, *gr = t->grads;
    size_t conv_y = (size_t)4 * 8 * 8 * 8;
    CUDA_CHECK(cudaMemsetAsync(gr, 0, t->n_params * sizeof(float), g.compute));
    conv2d_forward_cuda(&t->conv_cuda, g.cudnn, t->x, p + t->conv_w, p + t->conv_b, t->conv_y,
                        t->workspace);
    relu_forward_cuda(DTYPE_F32, t->conv_y, t->conv_y, conv_y, g.compute);
    maxpool2x2_forward_cuda(&t->pool_cuda, g.cudnn, t->conv_y, t->pool_y);
    linear_forward_cuda(g.cublas, g.compute, &t->fc, DTYPE_F32, t->pool_y, p + t->fc_w,
                        p + t->fc_b, t->logits);
    accuracy_count_cuda(DTYPE_F32, t->logits, t->labels, 4, 10, t->correct, g.compute);
    softmax_xent_cuda(DTYPE_F32, t->logits, t->labels, 4, 10, NULL, t->loss, t->d_logits,
                      g.compute);
    linear_backward_cuda(g.cublas, g.compute, &t->fc, DTYPE_F32, t->pool_y, p + t->fc_w,
                         t->d_logits, t->d_pool_y, gr + t->fc_w, gr + t->fc_b);
    maxpool2x2_backward_cuda(&t->pool_cuda, g.cudnn, t->conv_y, t->pool_y, t->d_pool_y,
                             t->d_conv_y);
    relu_backward_cuda(DTYPE_F32, t->conv_y, t->d_conv_y, t->d_conv_y, conv_y, g.compute);
    conv2d_backward_cuda(&t->conv_cuda, g.cudnn, t->x, p + t->conv_w, t->d_conv_y, t->d_x,
                         gr + t->conv_w, gr + t->conv_b, t->workspace);
    SgdParams sgd = {.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1};
    sgd_step_cuda(p, gr, t->momentum, t->n_params, t->lr, sgd, g.compute);
}

static void tiny_net_destroy(TinyNet *t) {
    conv2d_cuda_destroy(&t->conv_cuda);
    maxpool2x2_cuda_destroy(&t->pool_cuda);
    void *bufs[] = {t->params, t->grads, t->momentum, t->lr, t->x, t->d_x, t->conv_y,
                    t->d_conv_y, t->pool_y, t->d_pool_y, t->logits, t->d_logits, t->loss,
                    t->labels, t->correct, t->workspace};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) CUDA_CHECK(cudaFree(bufs[i]));
}

static void test_graph_capture(void) {
    printf("training step captured as a CUDA graph\n");
    TinyNet t;
    tiny_net_init(&t);
    float *params = random_floats(t.n_params, -0.3f, 0.3f), *x = random_floats(4 * 3 * 8 * 8, -1, 1);
    int32_t *labels = random_labels(4, 10);

    /* eager: two steps (the first also warms up the libraries before capture) */
    tiny_net_reset(&t, params, x, labels, 0.1f);
    tiny_net_step(&t);
    tiny_net_step(&t);
    float *eager = download_floats(t.params, t.n_params), eager_loss;
    download(&eager_loss, t.loss, sizeof eager_loss);

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(g.compute, cudaStreamCaptureModeGlobal));
    tiny_net_step(&t);
    CUDA_CHECK(cudaStreamEndCapture(g.compute, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    tiny_net_reset(&t, params, x, labels, 0.1f);
    CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
    CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
    float *graphed = download_floats(t.params, t.n_params), graph_loss;
    download(&graph_loss, t.loss, sizeof graph_loss);
    check_rel("graph vs eager: parameters after two steps", graphed, eager, t.n_params, 1e-6);
    CHECK_MSG(fabsf(graph_loss - eager_loss) <= 1e-6f * (1 + fabsf(eager_loss)),
              "graph loss %.9g, eager %.9g", graph_loss, eager_loss);
    CHECK_MSG(isfinite(graph_loss) && graph_loss > 0, "graph loss %g", graph_loss);
    int correct = -1;
    download(&correct, t.correct, sizeof correct);
    CHECK_MSG(correct >= 0 && correct <= 8, "accuracy counter %d after two steps of 4", correct);

    /* the learning rate is read at run time through its pointer: at 0 nothing moves
     * (momentum and gradients still update) */
    float zero = 0.0f;
    upload(t.lr, &zero, sizeof zero);
    CUDA_CHECK(cudaGraphLaunch(exec, g.compute));
    float *frozen = download_floats(t.params, t.n_params);
    CHECK_MSG(same_bits(frozen, graphed, t.n_params), "parameters moved with lr 0");

    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    tiny_net_destroy(&t);
    free(params), free(x), free(labels), free(eager), free(graphed), free(frozen);
}

int main(void) {
    test_require_gpu();
    rng = test_seed();
    gpu_context_init(&g, 0);


    test_maxpool((Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 0);
    test_maxpool((Pool2dShape){.n = 4, .c = 128, .h = 16, .w = 16}, 0);
    test_maxpool((Pool2dShape){.n = 3, .c = 5, .h = 6, .w = 10}, 0);
    test_maxpool((Pool2dShape){.n = 2, .c = 64, .h = 224, .w = 224}, 0);
    test_maxpool((Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 1);
    test_maxpool((Pool2dShape){.n = 2, .c = 3, .h = 8, .w = 6}, 1);
    test_maxpool((Pool2dShape){.n = 4, .c = 64, .h = 112, .w = 112, .k = 3, .stride = 2, .pad = 1}, 0);
    test_maxpool((Pool2dShape){.n = 2, .c = 5, .h = 7, .w = 9, .k = 3, .stride = 2, .pad = 1}, 1);

    /* SimpleNet's three convolutions at 32x32, then other strides, pads and sizes */
    test_conv((Conv2dShape){.n = 8, .c = 3, .h = 32, .w = 32, .k = 64, .r = 3, .s = 3, .pad = 1, .stride = 1});
    test_conv((Conv2dShape){.n = 8, .c = 64, .h = 16, .w = 16, .k = 128, .r = 3, .s = 3, .pad = 1, .stride = 1});
    test_conv((Conv2dShape){.n = 8, .c = 128, .h = 8, .w = 8, .k = 256, .r = 3, .s = 3, .pad = 1, .stride = 1});
    test_conv((Conv2dShape){.n = 4, .c = 16, .h = 15, .w = 17, .k = 32, .r = 3, .s = 3, .pad = 1, .stride = 2});
    test_conv((Conv2dShape){.n = 4, .c = 8, .h = 9, .w = 12, .k = 16, .r = 3, .s = 3, .pad = 0, .stride = 2});
    test_conv((Conv2dShape){.n = 3, .c = 32, .h = 14, .w = 10, .k = 24, .r = 1, .s = 1, .pad = 0, .stride = 1});
    test_conv((Conv2dShape){.n = 2, .c = 4, .h = 11, .w = 7, .k = 6, .r = 5, .s = 3, .pad = 2, .stride = 1});
    test_conv((Conv2dShape){.n = 2, .c = 3, .h = 224, .w = 224, .k = 64, .r = 3, .s = 3, .pad = 1, .stride = 1});
    test_conv((Conv2dShape){.n = 2, .c = 3, .h = 224, .w = 224, .k = 64, .r = 7, .s = 7, .pad = 3, .stride = 2});
    /* Algorithms picked by timing them (cudnnFind), any determinism, still fp32. */
    const ConvAlgoPolicy benchmarked = {CONV_WORKSPACE_LIMIT, 0, 0, 1};
    test_conv_with((Conv2dShape){.n = 8, .c = 64, .h = 16, .w = 16, .k = 128, .r = 3, .s = 3, .pad = 1, .stride = 1}, &benchmarked);
    test_conv_with((Conv2dShape){.n = 4, .c = 16, .h = 15, .w = 17, .k = 32, .r = 3, .s = 3, .pad = 1, .stride = 2}, &benchmarked);


    test_softmax(512, 10, 1.0f, 5.0f);
    test_softmax(100, 1000, 1.0f, 5.0f);
    test_softmax(4096, 10, 1.0f, 5.0f);
    test_softmax(37, 3, 0.5f, 5.0f);
    test_softmax(1, 10, 128.0f, 5.0f);
    test_softmax(64, 10, 1.0f, 500.0f); /* numerically stable at large logits */

    size_t n_params = 1000003;
    test_sgd(n_params, (SgdParams){.momentum = 0.9f, .weight_decay = 0.0f, .nesterov = 0});
    test_sgd(n_params, (SgdParams){.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1});
    test_sgd(n_params, (SgdParams){.momentum = 0.0f, .weight_decay = 1e-2f, .nesterov = 0});
    test_sgd(7, (SgdParams){.momentum = 0.5f, .weight_decay = 0.1f, .nesterov = 0});

    test_accuracy(512, 10, 0);
    test_accuracy(512, 10, 1);
    test_accuracy(1000, 1000, 0);
    test_accuracy(1, 3, 1);

    test_graph_capture();

    gpu_context_destroy(&g);
    return test_finish("test_ops_cuda");
}
