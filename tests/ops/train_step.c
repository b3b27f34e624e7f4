/* A whole training step through the faces, every op the model uses in one
 * stream: conv 3->8 (8x8) -> relu in place -> maxpool -> linear 128 -> 10 ->
 * accuracy, softmax_xent scaled by the loss scaler, backward into gradients
 * of the case's dtype, check, the mixed SGD step into the fp32 master (and its
 * half copy), scaler update. Its first loss against the CPU's fp32 forward
 * from the same rounded weights; two finite steps move the weights and count
 * as good; an input with inf skips the step (nothing moves, the scale
 * halves) and the next finite one runs; lr 0 read through the pointer moves
 * nothing. On the GPU the step is also captured as a CUDA graph (which fails
 * on any host sync, legacy-stream use or allocation inside an op) and its
 * replays give the eager step's weights, loss and scaler state. */
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
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

#define BATCH 4
/* Small enough that this net's scaled f16 gradients stay finite (at
 * GradScaler's 65536 they overflow, and the first steps would be skipped). */
#define NET_SCALE 256.0f
#define X_COUNT ((size_t)BATCH * 3 * 8 * 8)
#define CONV_Y_COUNT ((size_t)BATCH * 8 * 8 * 8)

static const ConvAlgoPolicy deterministic_policy = {.workspace_limit = (size_t)512 << 20, .deterministic = 1};

typedef struct {
    const GridCase *c;
    OpContext ctx; /* c's, with the convolution's workspace */
    Conv2d conv;
    MaxPool2d pool;
    void *pool_scratch; /* the pool's window positions, or NULL */
    LinearShape fc;
    size_t n_params, conv_w, conv_b, fc_w, fc_b; /* offsets in elements */
    float *master, *momentum, *lr, *loss;        /* f32 */
    void *weights, *grads;                       /* the dtype; weights is the master itself on f32 */
    void *x, *conv_y, *pool_y, *logits, *d_logits, *d_pool_y, *d_conv_y;
    LossScalerState *scaler;
    int32_t *labels;
    int *correct;
    cudaGraphExec_t graph; /* the step captured (GPU), or NULL */
} Net;

static void *at(const Net *t, void *base, size_t offset) {
    return (char *)base + offset * dtype_size(t->c->dtype);
}

static void net_init(Net *t, const GridCase *c) {
    memset(t, 0, sizeof *t);
    t->c = c;
    t->ctx = c->ctx;
    DType dt = c->dtype;
    Conv2dShape conv = {.n = BATCH, .c = 3, .h = 8, .w = 8, .k = 8, .r = 3, .s = 3, .pad = 1, .stride = 1};
    conv2d_init(&t->ctx, &t->conv, &conv, &deterministic_policy);
    size_t ws = conv2d_workspace_bytes(&t->ctx, &t->conv);
    t->ctx.workspace = ws ? dev_bytes(ws) : NULL;
    Pool2dShape pool = {.n = BATCH, .c = 8, .h = 8, .w = 8};
    size_t pool_scratch = maxpool_scratch_bytes(&t->ctx, &pool);
    t->pool_scratch = pool_scratch ? grid_alloc_bytes(c, pool_scratch) : NULL;
    maxpool_init(&t->ctx, &t->pool, &pool, t->pool_scratch);
    t->fc = (LinearShape){.n = BATCH, .in = 8 * 4 * 4, .out = 10};
    t->conv_w = 0;
    t->conv_b = t->conv_w + 8 * 3 * 3 * 3;
    t->fc_w = t->conv_b + 8;
    t->fc_b = t->fc_w + 10 * 128;
    t->n_params = t->fc_b + 10;
    t->master = grid_alloc(c, DTYPE_F32, t->n_params);
    t->momentum = grid_alloc(c, DTYPE_F32, t->n_params);
    t->lr = grid_alloc(c, DTYPE_F32, 1);
    t->loss = grid_alloc(c, DTYPE_F32, 1);
    t->weights = dt == DTYPE_F32 ? t->master : grid_alloc(c, dt, t->n_params);
    t->grads = grid_alloc(c, dt, t->n_params);
    t->x = grid_alloc(c, dt, X_COUNT);
    t->conv_y = grid_alloc(c, dt, CONV_Y_COUNT);
    t->d_conv_y = grid_alloc(c, dt, CONV_Y_COUNT);
    t->pool_y = grid_alloc(c, dt, BATCH * 128);
    t->d_pool_y = grid_alloc(c, dt, BATCH * 128);
    t->logits = grid_alloc(c, dt, BATCH * 10);
    t->d_logits = grid_alloc(c, dt, BATCH * 10);
    t->scaler = grid_alloc_bytes(c, sizeof(LossScalerState));
    t->labels = grid_alloc_bytes(c, BATCH * sizeof(int32_t));
    t->correct = grid_alloc_bytes(c, sizeof(int));
}

static void net_destroy(Net *t) {
    if (t->graph) gpu_graph_destroy(t->graph);
    conv2d_destroy(&t->ctx, &t->conv);
    maxpool_destroy(&t->ctx, &t->pool);
    void *bufs[] = {t->master, t->momentum, t->lr, t->loss, t->weights == t->master ? NULL : t->weights, t->grads,
                    t->x, t->conv_y, t->d_conv_y, t->pool_y, t->d_pool_y, t->logits, t->d_logits, t->scaler,
                    t->labels, t->correct, t->ctx.workspace, t->pool_scratch};
    grid_free_all(t->c, bufs, GRID_COUNT(bufs));
}

static void net_set_input(Net *t, const float *x) { grid_set(t->c, t->c->dtype, t->x, x, X_COUNT); }

static void net_set_lr(Net *t, float lr) { grid_set(t->c, DTYPE_F32, t->lr, &lr, 1); }

/* The trainer's start: the fp32 master from the host, its half copy made on the device. */
static void net_reset(Net *t, const float *params, const float *x, const int32_t *labels) {
    const GridCase *c = t->c;
    grid_set(c, DTYPE_F32, t->master, params, t->n_params);
    if (t->weights != t->master) cast_from_f32(&t->ctx, t->master, t->weights, t->n_params);
    net_set_input(t, x);
    op_copy_from_host(&t->ctx, t->labels, labels, BATCH * sizeof(int32_t));
    net_set_lr(t, 0.1f);
    LossScalerState s = loss_scaler_initial(NET_SCALE);
    op_copy_from_host(&t->ctx, t->scaler, &s, sizeof s);
    op_fill(&t->ctx, t->momentum, 0, t->n_params * sizeof(float));
    op_fill(&t->ctx, t->correct, 0, sizeof(int));
    op_sync(&t->ctx);
}

/* Only the ops' work: no sync, no allocation, so it can be captured. */
static void net_step(Net *t) {
    const OpContext *ctx = &t->ctx;
    void *w = t->weights, *gr = t->grads;
    op_fill(ctx, gr, 0, t->n_params * dtype_size(t->c->dtype));
    loss_scaler_begin_step(ctx, t->scaler);
    conv2d_forward(ctx, &t->conv, t->x, at(t, w, t->conv_w), at(t, w, t->conv_b), t->conv_y);
    relu_forward(ctx, t->conv_y, t->conv_y, CONV_Y_COUNT);
    maxpool_forward(ctx, &t->pool, t->conv_y, t->pool_y);
    linear_forward(ctx, &t->fc, t->pool_y, at(t, w, t->fc_w), at(t, w, t->fc_b), t->logits);
    accuracy_count(ctx, t->logits, t->labels, BATCH, 10, t->correct);
    softmax_xent_smooth(ctx, t->logits, t->labels, BATCH, 10, 0.0f, &t->scaler->scale, t->loss, t->d_logits);
    linear_backward(ctx, &t->fc, t->pool_y, at(t, w, t->fc_w), t->d_logits, t->d_pool_y, at(t, gr, t->fc_w),
                    at(t, gr, t->fc_b));
    maxpool_backward(ctx, &t->pool, t->conv_y, t->pool_y, t->d_pool_y, t->d_conv_y);
    relu_backward(ctx, t->conv_y, t->d_conv_y, t->d_conv_y, CONV_Y_COUNT);
    conv2d_backward(ctx, &t->conv, t->x, at(t, w, t->conv_w), t->d_conv_y, NULL, at(t, gr, t->conv_w),
                    at(t, gr, t->conv_b), 0);
    loss_scaler_check(ctx, gr, t->c->dtype, t->n_params, t->scaler);
    SgdParams sgd = {.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1};
    sgd_step_mixed(ctx, t->master, gr, t->momentum, t->weights == t->master ? NULL : t->weights, t->n_params, t->lr,
                   t->scaler, sgd);
    loss_scaler_update(ctx, t->scaler, LOSS_SCALER_GROWTH, LOSS_SCALER_BACKOFF, LOSS_SCALER_INTERVAL);
}

/* The step, from its graph once there is one. */
static void net_run(Net *t) {
    if (t->graph) gpu_graph_launch(t->graph, t->ctx.stream);
    else net_step(t);
}

/* The fp32 CPU loss of the forward pass from the master rounded to the dtype. */
static float net_cpu_loss(const Net *t, const float *params, const float *x, const int32_t *labels) {
    DType dt = t->c->dtype;
    float *w = copy_floats(params, t->n_params), *xr = copy_floats(x, X_COUNT);
    round_to(dt, w, t->n_params);
    round_to(dt, xr, X_COUNT);
    float *conv_y = host_floats(CONV_Y_COUNT), *pool_y = host_floats(BATCH * 128);
    float logits[BATCH * 10], dl[BATCH * 10], loss;
    conv2d_forward_cpu(&t->conv.shape, xr, w + t->conv_w, w + t->conv_b, conv_y);
    relu_forward_cpu(conv_y, conv_y, CONV_Y_COUNT);
    maxpool_forward_cpu(&t->pool.shape, conv_y, pool_y);
    linear_forward_cpu(&t->fc, pool_y, w + t->fc_w, w + t->fc_b, logits);
    softmax_xent_cpu(logits, labels, BATCH, 10, NULL, &loss, dl);
    free(w), free(xr), free(conv_y), free(pool_y);
    return loss;
}

static LossScalerState read_scaler(const Net *t) {
    LossScalerState *p = grid_get_bytes(t->c, t->scaler, sizeof *p), s = *p;
    free(p);
    return s;
}

static float read_loss(const Net *t) {
    float *p = grid_get(t->c, DTYPE_F32, t->loss, 1), loss = *p;
    free(p);
    return loss;
}

static int same_state(LossScalerState a, LossScalerState b) {
    return a.scale == b.scale && a.good_steps == b.good_steps && a.found_inf == b.found_inf &&
           a.skipped_steps == b.skipped_steps;
}

/* Replays of the captured step from the same start give the eager weights,
 * loss and scaler state, and the half copy is the master rounded. The net
 * keeps the graph for the steps after. */
static void net_graph(Net *t, const float *params, const float *x, const int32_t *labels, const float *eager,
                      float eager_loss, LossScalerState eager_state) {
    const GridCase *c = t->c;
    size_t np = t->n_params;
    gpu_capture_begin(t->ctx.stream);
    net_step(t);
    t->graph = gpu_capture_end(t->ctx.stream, 0);
    net_reset(t, params, x, labels);
    net_run(t);
    net_run(t);
    float *graphed = grid_get(c, DTYPE_F32, t->master, np), graph_loss = read_loss(t);
    grid_check(c, "graph vs eager: master weights after two steps", graphed, eager, np, 1e-6);
    CHECK_MSG(fabsf(graph_loss - eager_loss) <= 1e-6f * (1 + fabsf(eager_loss)), "%s graph loss %.9g, eager %.9g",
              c->name, graph_loss, eager_loss);
    CHECK_MSG(isfinite(graph_loss) && graph_loss > 0, "%s graph loss %g", c->name, graph_loss);
    CHECK(same_state(read_scaler(t), eager_state));
    if (t->weights != t->master) {
        size_t bytes = np * dtype_size(c->dtype);
        void *weights = grid_get_bytes(c, t->weights, bytes), *want = host_bytes(bytes);
        cast_from_f32_cpu(c->dtype, graphed, want, np);
        grid_check_same(c, "half weights (the master rounded)", weights, want, bytes);
        free(weights), free(want);
    }
    free(graphed);
}

static void train_step_case(const GridCase *c) {
    Net t;
    net_init(&t, c);
    size_t np = t.n_params;
    float *params = grid_random(c, DTYPE_F32, np, -0.3f, 0.3f), *x = grid_random(c, DTYPE_F32, X_COUNT, -1, 1);
    int32_t *labels = grid_random_labels(c, BATCH, 10);

    /* eager: two steps (on the GPU the first also warms up the libraries before capture) */
    net_reset(&t, params, x, labels);
    net_step(&t);
    float first_loss = read_loss(&t), cpu_loss = net_cpu_loss(&t, params, x, labels);
    printf("  %-20s first loss %.6g, fp32 cpu %.6g\n", c->name, first_loss, cpu_loss);
    double loss_bound = c->dtype == DTYPE_F16 ? 1e-2 : c->dtype == DTYPE_BF16 ? 4e-2 : 1e-4;
    CHECK_MSG(fabsf(first_loss - cpu_loss) <= loss_bound * cpu_loss, "%s step loss %g, fp32 cpu %g", c->name,
              first_loss, cpu_loss);
    net_step(&t);
    float *eager = grid_get(c, DTYPE_F32, t.master, np), eager_loss = read_loss(&t);
    LossScalerState eager_state = read_scaler(&t);
    CHECK_MSG(eager_state.scale == NET_SCALE && eager_state.good_steps == 2 && eager_state.skipped_steps == 0,
              "%s: scaler after two finite steps: scale %g good %d skipped %d", c->name, eager_state.scale,
              eager_state.good_steps, eager_state.skipped_steps);
    CHECK_MSG(memcmp(eager, params, np * sizeof(float)) != 0, "%s: two finite steps left the master weights as they "
              "were", c->name);
    int *correct = grid_get_bytes(c, t.correct, sizeof(int));
    CHECK_MSG(*correct >= 0 && *correct <= 2 * BATCH, "%s: accuracy counter %d after two steps of %d", c->name,
              *correct, BATCH);
    if (c->device == DEVICE_CUDA) net_graph(&t, params, x, labels, eager, eager_loss, eager_state);

    /* an input with inf: the loss and gradients overflow, and the step (on
     * the GPU the graph) is skipped on the device: weights, momentum and half copy untouched, the scale halved */
    size_t half_bytes = np * dtype_size(c->dtype);
    float *master = grid_get(c, DTYPE_F32, t.master, np), *momentum = grid_get(c, DTYPE_F32, t.momentum, np);
    void *weights = grid_get_bytes(c, t.weights, half_bytes);
    float *x_bad = copy_floats(x, X_COUNT);
    x_bad[X_COUNT / 2] = INFINITY;
    net_set_input(&t, x_bad);
    net_run(&t);
    LossScalerState skipped = read_scaler(&t);
    float *master_after = grid_get(c, DTYPE_F32, t.master, np), *momentum_after = grid_get(c, DTYPE_F32, t.momentum, np);
    void *weights_after = grid_get_bytes(c, t.weights, half_bytes);
    CHECK_MSG(skipped.found_inf == 1 && skipped.skipped_steps == 1 && skipped.scale == NET_SCALE * LOSS_SCALER_BACKOFF &&
                  skipped.good_steps == 0, "%s overflow step: found %d skipped %d scale %g good %d", c->name,
              skipped.found_inf, skipped.skipped_steps, skipped.scale, skipped.good_steps);
    grid_check_same(c, "master (overflow step)", master_after, master, np * sizeof(float));
    grid_check_same(c, "momentum (overflow step)", momentum_after, momentum, np * sizeof(float));
    grid_check_same(c, "half weights (overflow step)", weights_after, weights, half_bytes);

    /* finite again: the step runs at the new scale */
    net_set_input(&t, x);
    net_run(&t);
    LossScalerState resumed = read_scaler(&t);
    float *master_resumed = grid_get(c, DTYPE_F32, t.master, np);
    CHECK_MSG(resumed.found_inf == 0 && resumed.good_steps == 1 && resumed.skipped_steps == 1 &&
                  resumed.scale == skipped.scale, "%s after recovery: found %d good %d skipped %d", c->name,
              resumed.found_inf, resumed.good_steps, resumed.skipped_steps);
    CHECK_MSG(memcmp(master_resumed, master, np * sizeof(float)) != 0,
              "%s: the step after an overflow did not move the weights", c->name);

    /* the learning rate is read at run time through its pointer: at 0 nothing
     * moves (momentum and gradients still update) */
    net_set_lr(&t, 0.0f);
    net_run(&t);
    float *frozen = grid_get(c, DTYPE_F32, t.master, np);
    grid_check_same(c, "master (lr 0)", frozen, master_resumed, np * sizeof(float));

    net_destroy(&t);
    void *host[] = {params, x, labels, eager, correct, master, momentum, weights, x_bad, master_after, momentum_after,
                    weights_after, master_resumed, frozen};
    host_free_all(host, GRID_COUNT(host));
}

const GridOp grid_op_train_step = {
    .name = "train_step",
    .run = train_step_case,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (the layers' own cases run it); the CUDA graph on the CPU (none there)",
};
