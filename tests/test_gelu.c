/* GELU (ops/gelu.h) on the CPU: the forward against the erf formula in
 * double, the backward against that formula and against finite differences,
 * the face against the reference, and GELU as a layer: a small net's
 * gradients against finite differences, a net with a ReLU working in place on
 * a GELU's output learning one batch, and the planner refusing an in-place
 * ReLU over a GELU's input (which its backward reads). Where there is a GPU,
 * the face's CUDA path in f32, f16 and bf16 against the reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "models/model.h"
#include "ops/gelu.h"
#include "ops/sgd.h"
#include "ops/softmax_xent.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tests/op_buffers.h"
#include "tests/op_checks.h"

enum { N = 1000 };

static double gelu_exact(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

static double gelu_slope(double x) {
    return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

/* Values over [-6, 6], a few exactly where the curve bends or flattens. */
static void fill_inputs(float *x, uint64_t *rng) {
    test_fill_uniform(x, N, rng, -6.0f, 6.0f);
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 8.0f, -8.0f, 30.0f, -30.0f, 1e-20f, -0.7517915f};
    memcpy(x, special, sizeof special);
}

static void check_formula(uint64_t *rng) {
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)), *dy = malloc(N * sizeof(float));
    float *dx = malloc(N * sizeof(float));
    double *want = malloc(N * sizeof(double));
    fill_inputs(x, rng);
    test_fill_uniform(dy, N, rng, -1.0f, 1.0f);
    gelu_forward_cpu(x, y, N);
    for (int i = 0; i < N; i++) want[i] = gelu_exact(x[i]);
    check_values("gelu_forward_cpu", y, want, N, 1e-6);
    CHECK(y[6] == 30.0f && y[7] == 0.0f); /* x Phi(x) is x, and 0, far out */
    gelu_backward_cpu(x, dy, dx, N);
    for (int i = 0; i < N; i++) want[i] = dy[i] * gelu_slope(x[i]);
    check_values("gelu_backward_cpu", dx, want, N, 1e-6);

    /* dx may alias dy. */
    float *inplace = malloc(N * sizeof(float));
    memcpy(inplace, dy, N * sizeof(float));
    gelu_backward_cpu(x, inplace, inplace, N);
    CHECK(memcmp(inplace, dx, N * sizeof(float)) == 0);

    /* NaN passes through, as in relu.h. */
    float nan_x = NAN, nan_y, one = 1.0f, nan_dx;
    gelu_forward_cpu(&nan_x, &nan_y, 1);
    gelu_backward_cpu(&nan_x, &one, &nan_dx, 1);
    CHECK(isnan(nan_y) && isnan(nan_dx));
    printf("gelu: forward and backward within 1e-6 of the erf formula in double, over %d values\n", N);
    free(x), free(y), free(dy), free(dx), free(want), free(inplace);
}

/* The face on the CPU context runs the reference: the same bits. */
static void check_face(uint64_t *rng) {
    OpContext ctx = op_context_cpu();
    float x[64], dy[64], y_ref[64], y[64], dx_ref[64], dx[64];
    test_fill_uniform(x, 64, rng, -4.0f, 4.0f);
    test_fill_uniform(dy, 64, rng, -1.0f, 1.0f);
    gelu_forward_cpu(x, y_ref, 64);
    gelu_backward_cpu(x, dy, dx_ref, 64);
    gelu_forward(&ctx, x, y, 64);
    gelu_backward(&ctx, x, dy, dx, 64);
    CHECK(memcmp(y, y_ref, sizeof y) == 0);
    CHECK(memcmp(dx, dx_ref, sizeof dx) == 0);
}

typedef struct {
    const float *x;
    float *y;
    const float *r;
} OpLoss;

static double op_loss(void *p) {
    OpLoss *l = p;
    gelu_forward_cpu(l->x, l->y, N);
    return weighted_sum(l->y, l->r, N);
}

static void check_finite_differences(uint64_t *rng) {
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)), *r = malloc(N * sizeof(float));
    float *dx = malloc(N * sizeof(float));
    double *numeric = malloc(N * sizeof(double));
    test_fill_uniform(x, N, rng, -4.0f, 4.0f);
    test_fill_uniform(r, N, rng, -1.0f, 1.0f);
    OpLoss loss = {x, y, r};
    numeric_gradient(x, N, 1e-2f, op_loss, &loss, numeric);
    gelu_backward_cpu(x, r, dx, N);
    check_gradient("gelu_backward_cpu", dx, numeric, N);
    free(x), free(y), free(r), free(dx), free(numeric);
}

/* ---- GELU as a layer ------------------------------------------------------ */

enum { BATCH = 8, CLASSES = 3, SIZE = 6 };

/* conv -> GELU -> conv -> GELU -> pool -> linear; relu: a ReLU (in place) after the first GELU. */
static void build(Model *m, int relu) {
    model_init(m, BATCH, CLASSES, 0);
    int x = model_input(m, 2, SIZE, SIZE);
    x = model_gelu(m, model_conv(m, x, 6, 3, 1, 1));
    if (relu) x = model_relu(m, x);
    x = model_gelu(m, model_conv(m, x, 6, 3, 1, 1));
    model_linear(m, model_avgpool(m, x), CLASSES);
}

typedef struct {
    Model *m;
    const float *input, *r;
} ModelLoss;

/* sum of logits * r: its gradient with respect to the logits is r. */
static double model_loss(void *p) {
    ModelLoss *l = p;
    memcpy(model_input_buffer(l->m), l->input, model_input_floats(l->m) * sizeof(float));
    model_forward(l->m);
    return weighted_sum(model_logits(l->m), l->r, BATCH * CLASSES);
}

static void check_model_gradients(uint64_t *rng) {
    Model m;
    build(&m, 0); /* smooth: central differences across a ReLU's kink would be off */
    model_finalize(&m, NULL, 5);
    float *input = malloc(model_input_floats(&m) * sizeof(float)), r[BATCH * CLASSES];
    test_fill_uniform(input, model_input_floats(&m), rng, -2.0f, 2.0f);
    test_fill_uniform(r, BATCH * CLASSES, rng, -1.0f, 1.0f);
    ModelLoss loss = {&m, input, r};
    model_loss(&loss);
    memcpy(model_logits_grad(&m), r, sizeof r);
    model_zero_grads(&m);
    model_backward(&m);
    float *analytic = malloc(m.n_params * sizeof(float));
    double *numeric = malloc(m.n_params * sizeof(double));
    memcpy(analytic, m.grads, m.n_params * sizeof(float));
    numeric_gradient(m.params, m.n_params, 1e-4f, model_loss, &loss, numeric);
    check_gradient("conv, gelu, conv, gelu, avgpool, linear: every parameter", analytic, numeric,
                   m.n_params);
    free(input), free(analytic), free(numeric);
    model_destroy(&m);
}

static float train_step(Model *m, const float *input, const int32_t *labels, float lr) {
    float loss;
    SgdParams sgd = {0.9f, 0.0f, 0, NULL, NULL};
    memcpy(model_input_buffer(m), input, model_input_floats(m) * sizeof(float));
    model_forward(m);
    softmax_xent_cpu(model_logits(m), labels, m->batch, m->num_classes, NULL, &loss, model_logits_grad(m));
    model_zero_grads(m);
    model_backward(m);
    sgd_step_cpu(m->params, m->grads, m->momentum, m->n_params, &lr, sgd);
    return loss;
}

/* Fitting one batch of random images to random labels: the loss must fall well below chance. */
static void check_training(uint64_t *rng) {
    enum { STEPS = 100 };
    Model m;
    build(&m, 1);
    model_finalize(&m, NULL, 7);
    float *input = malloc(model_input_floats(&m) * sizeof(float));
    int32_t labels[BATCH];
    test_fill_uniform(input, model_input_floats(&m), rng, -2.0f, 2.0f);
    for (int i = 0; i < BATCH; i++) labels[i] = i % CLASSES;
    float first = train_step(&m, input, labels, 0.1f), last = first;
    for (int s = 1; s < STEPS; s++) last = train_step(&m, input, labels, 0.1f);
    printf("gelu net: loss %.4f after one step, %.4f after %d\n", first, last, STEPS);
    CHECK_MSG(isfinite(last) && last < 0.5f * first, "loss %.4f -> %.4f: the net did not learn", first, last);
    free(input);
    model_destroy(&m);
}

/* GELU's input also read by a ReLU, which would overwrite it in place: model_finalize must refuse. */
static void finalize_relu_over_gelu_input(void) {
    Model m;
    model_init(&m, BATCH, CLASSES, 0);
    int x = model_conv(&m, model_input(&m, 2, SIZE, SIZE), 6, 3, 1, 1);
    int y = model_add(&m, model_gelu(&m, x), model_relu(&m, x));
    model_linear(&m, model_avgpool(&m, y), CLASSES);
    model_finalize(&m, NULL, 1);
}

static void check_input_kept(void) {
    char log[512];
    snprintf(log, sizeof log, "%s/stderr", test_tmpdir("test_gelu"));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stderr)) _exit(3);
        finalize_relu_over_gelu_input();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) != 0, "a ReLU over a GELU's input: exit status %d", status);
    char text[1024] = "";
    FILE *f = fopen(log, "r");
    if (f) {
        text[fread(text, 1, sizeof text - 1, f)] = 0;
        fclose(f);
    }
    /* Either rule refuses it, by the order of the layers: GELU, as ReLU, cannot add its input's gradient to
     * another layer's, and a ReLU works in place only on an activation no other layer reads. */
    CHECK_MSG(strstr(text, "works in place") || strstr(text, "cannot add its gradient"),
              "a ReLU over a GELU's input: '%s'", text);
}

#if TRAINC_CUDA
/* On inputs rounded to dt, computed in float and rounded once: within half a
 * unit of dt's last place (f16 2^-11, bf16 2^-8) and float's erff and expf. */
static void check_cuda_dtype(GpuContext *g, DType dt, size_t n, uint64_t *rng) {
    const double tol = dt == DTYPE_F32 ? 1e-5 : dt == DTYPE_F16 ? 1e-3 : 8e-3;
    OpContext ctx = op_context_gpu(g, dt, 0);
    float *x = host_floats(n), *dy = host_floats(n), *want_f = host_floats(n);
    double *want = malloc(n * sizeof(double));
    test_fill_uniform(x, n, rng, -5.0f, 5.0f);
    test_fill_uniform(dy, n, rng, -1.0f, 1.0f);
    round_to(dt, x, n), round_to(dt, dy, n);
    void *d_x = dev_values_on(g->compute, dt, x, n), *d_dy = dev_values_on(g->compute, dt, dy, n);
    void *d_y = dev_bytes(n * dtype_size(dt)), *d_dx = dev_bytes(n * dtype_size(dt));
    char what[64];

    gelu_forward(&ctx, d_x, d_y, n);
    float *y = download_values_on(g->compute, dt, d_y, n);
    gelu_forward_cpu(x, want_f, n);
    for (size_t i = 0; i < n; i++) want[i] = want_f[i];
    snprintf(what, sizeof what, "gelu_forward %s n=%zu", dtype_name(dt), n);
    check_values(what, y, want, n, tol);

    gelu_backward(&ctx, d_x, d_dy, d_dx, n);
    float *dx = download_values_on(g->compute, dt, d_dx, n);
    gelu_backward_cpu(x, dy, want_f, n);
    for (size_t i = 0; i < n; i++) want[i] = want_f[i];
    snprintf(what, sizeof what, "gelu_backward %s n=%zu", dtype_name(dt), n);
    check_values(what, dx, want, n, tol);

    gelu_backward(&ctx, d_x, d_dy, d_dy, n); /* dx aliasing dy: the same bits */
    float *inplace = download_values_on(g->compute, dt, d_dy, n);
    CHECK_MSG(memcmp(inplace, dx, n * sizeof(float)) == 0, "gelu_backward %s in place differs", dtype_name(dt));
    gpu_free(d_x), gpu_free(d_dy), gpu_free(d_y), gpu_free(d_dx);
    free(x), free(dy), free(want_f), free(want), free(y), free(dx), free(inplace);
}

static void check_cuda(uint64_t *rng) {
    if (!test_have_gpu()) {
        printf("gelu: no GPU, the CUDA path unchecked\n");
        return;
    }
    GpuContext g;
    gpu_context_init(&g, 0);
    const DType types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    for (int t = 0; t < 3; t++) {
        check_cuda_dtype(&g, types[t], 4096, rng); /* 16 bytes a thread */
        check_cuda_dtype(&g, types[t], 1001, rng); /* one element a thread */
    }
    printf("gelu: the CUDA path in f32, f16 and bf16 within half a unit of each type of the reference\n");
    gpu_context_destroy(&g);
}
#else
static void check_cuda(uint64_t *rng) { (void)rng; }
#endif

int main(void) {
    uint64_t rng = test_seed();
    check_formula(&rng);
    check_face(&rng);
    check_finite_differences(&rng);
    check_model_gradients(&rng);
    check_training(&rng);
    check_input_kept();
    check_cuda(&rng);
    return test_finish("test_gelu");
}
