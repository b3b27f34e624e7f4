/* Learning-rate schedules (ops/lr_schedule.h) through the face: the step
 * counter and the lr in the device's memory, every step's lr within one float
 * rounding of the host's formula in double and the counter moved on; on the
 * GPU one captured step replayed from a CUDA graph follows the schedule.
 * Extras: each kind's values by hand, OneCycleLR as PyTorch computes it, and
 * lr_schedule_step_cpu as lr_schedule_at plus the counter. The schedule has no
 * dtype or layout: one case a device. */
#include <math.h>
#include <stdlib.h>

#include "ops/lr_schedule.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/ops/grid.h"

/* |got - want| within 2^-23 of want: one float rounding. */
static int lr_close(float got, double want) { return fabs(got - want) <= fabs(want) * 1.2e-7 + 1e-30; }

#if TRAINC_CUDA
/* One captured step, replayed: the graph follows the schedule. got: the eager steps' lrs. */
static void lr_graph_replay(const GridCase *c, const char *name, LrSchedule s, int steps, const float *got) {
    int64_t zero = 0, counter = -1;
    int64_t *d_counter = grid_put_bytes(c, &zero, sizeof zero);
    float *d_lr = grid_alloc(c, DTYPE_F32, 1);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(c->ctx.stream, cudaStreamCaptureModeGlobal));
    lr_schedule_step(&c->ctx, &s, d_counter, d_lr);
    CUDA_CHECK(cudaStreamEndCapture(c->ctx.stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int replays = steps / 2 + 1;
    for (int i = 0; i < replays; i++) CUDA_CHECK(cudaGraphLaunch(exec, c->ctx.stream));
    float *last = grid_get(c, DTYPE_F32, d_lr, 1);
    op_copy_to_host(&c->ctx, &counter, d_counter, sizeof counter);
    op_sync(&c->ctx);
    CHECK_MSG(counter == replays && *last == got[replays - 1],
              "%s from a graph: counter %lld lr %.9g, want %d and %.9g", name, (long long)counter, *last, replays,
              got[replays - 1]);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    free(last);
    grid_free(c, d_counter);
    grid_free(c, d_lr);
}
#endif

static void lr_steps(const GridCase *c, const char *name, LrSchedule s, int steps) {
    printf(" %s, %d steps\n", name, steps);
    int64_t zero = 0, counter = -1;
    int64_t *d_counter = grid_put_bytes(c, &zero, sizeof zero);
    float *d_lr = grid_alloc(c, DTYPE_F32, steps);
    for (int i = 0; i < steps; i++) lr_schedule_step(&c->ctx, &s, d_counter, d_lr + i);
    float *got = grid_get(c, DTYPE_F32, d_lr, steps);
    op_copy_to_host(&c->ctx, &counter, d_counter, sizeof counter);
    op_sync(&c->ctx);
    CHECK_MSG(counter == steps, "%s %s: lr counter %lld after %d steps", c->name, name, (long long)counter, steps);
    int bad = 0;
    for (int i = 0; i < steps; i++) {
        double want = lr_schedule_value(&s, i);
        if (!lr_close(got[i], want)) {
            if (bad < 3) fprintf(stderr, "  %s %s: step %d got %.9g, host %.9g\n", c->name, name, i, got[i], want);
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%s %s: %d of %d steps differ from the host's lr", c->name, name, bad, steps);
#if TRAINC_CUDA
    if (c->device == DEVICE_CUDA) lr_graph_replay(c, name, s, steps, got);
#endif
    free(got);
    grid_free(c, d_counter);
    grid_free(c, d_lr);
}

static void lr_case(const GridCase *c) {
    lr_steps(c, "cosine", (LrSchedule){.kind = LR_COSINE, .base_lr = 0.1f, .warmup_steps = 20, .total_steps = 250,
                                       .warmup_start_factor = 0.01f, .final_lr = 1e-4f}, 300);
    lr_steps(c, "onecycle", (LrSchedule){.kind = LR_ONECYCLE, .base_lr = 0.4f, .warmup_steps = 75, .total_steps = 250},
             300);
    lr_steps(c, "step", (LrSchedule){.kind = LR_STEP, .base_lr = 0.1f, .warmup_steps = 5, .warmup_start_factor = 0.1f,
                                     .step_size = 60, .gamma = 0.2f}, 300);
    lr_steps(c, "linear", (LrSchedule){.kind = LR_LINEAR, .base_lr = 2.0f, .warmup_steps = 23, .total_steps = 100,
                                       .warmup_start_factor = 0.2f, .final_lr = 0.14f}, 120);
    lr_steps(c, "constant", (LrSchedule){.kind = LR_CONSTANT, .base_lr = 0.05f, .warmup_steps = 10,
                                         .warmup_start_factor = 0.3f}, 50);
}

/* ---- extras: by hand and against PyTorch ---------------------------------------- */

/* torch.optim.lr_scheduler.OneCycleLR._get_lr (two phases, cos), transcribed:
 * the lr at step_num for max_lr, total_steps and pct_start. */
static double torch_onecycle(double max_lr, long total_steps, double pct_start, double div_factor,
                             double final_div_factor, long step_num) {
    double initial = max_lr / div_factor, min_lr = initial / final_div_factor;
    double end_steps[2] = {pct_start * total_steps - 1, (double)total_steps - 1};
    double start_lrs[2] = {initial, max_lr}, end_lrs[2] = {max_lr, min_lr};
    double start_step = 0;
    for (int i = 0; i < 2; i++) {
        double end_step = end_steps[i];
        if (step_num <= end_step || i == 1) {
            double pct = (step_num - start_step) / (end_step - start_step);
            double cos_out = cos(M_PI * pct) + 1;
            return end_lrs[i] + (start_lrs[i] - end_lrs[i]) / 2.0 * cos_out;
        }
        start_step = end_step;
    }
    return NAN;
}

#define CHECK_LR(sched, step, want) do { float got_ = lr_schedule_at(&(sched), (step)); \
    double want_ = (want); CHECK_MSG(lr_close(got_, want_), "lr at step %ld = %.9g, want %.9g", \
                                     (long)(step), got_, want_); } while (0)

static void lr_constant_and_warmup(void) {
    LrSchedule constant = {.kind = LR_CONSTANT, .base_lr = 0.1f};
    CHECK_LR(constant, 0, 0.1f);
    CHECK_LR(constant, 123456, 0.1f);
    LrSchedule warm = {.kind = LR_CONSTANT, .base_lr = 0.2f, .warmup_steps = 10, .warmup_start_factor = 0.1f};
    double f = 0.1f, base = 0.2f;
    CHECK_LR(warm, 0, base * f);
    CHECK_LR(warm, 5, base * (f + (1 - f) * 0.5));
    CHECK_LR(warm, 9, base * (f + (1 - f) * 0.9));
    CHECK_LR(warm, 10, base);
    CHECK_LR(warm, 1000, base);
}

static const LrSchedule cosine = {.kind = LR_COSINE, .base_lr = 0.1f, .warmup_steps = 5, .total_steps = 105,
                                  .warmup_start_factor = 0.5f, .final_lr = 0.001f};

static void lr_cosine(void) {
    double hi = 0.1f, lo = 0.001f;
    CHECK_LR(cosine, 0, hi * 0.5);
    CHECK_LR(cosine, 4, hi * (0.5 + 0.5 * 4 / 5.0));
    CHECK_LR(cosine, 5, hi);
    CHECK_LR(cosine, 30, lo + (hi - lo) * (1 + cos(M_PI * 25 / 100.0)) / 2);
    CHECK_LR(cosine, 55, (hi + lo) / 2);
    CHECK_LR(cosine, 104, lo + (hi - lo) * (1 + cos(M_PI * 99 / 100.0)) / 2);
    CHECK_LR(cosine, 105, lo);
    CHECK_LR(cosine, 100000, lo);
}

static void lr_onecycle(void) {
    LrSchedule onecycle = {.kind = LR_ONECYCLE, .base_lr = 0.4f, .warmup_steps = 30, .total_steps = 100};
    double max_lr = 0.4f;
    CHECK_LR(onecycle, 0, max_lr / 25);
    CHECK_LR(onecycle, 29, max_lr);
    CHECK_LR(onecycle, 99, max_lr / 25 / 1e4);
    CHECK_LR(onecycle, 500, max_lr / 25 / 1e4);
    int bad = 0;
    for (long t = 0; t < 100; t++)
        bad += !lr_close(lr_schedule_at(&onecycle, t), torch_onecycle(max_lr, 100, 30 / 100.0, 25, 1e4, t));
    CHECK_MSG(bad == 0, "onecycle: %d of 100 steps differ from OneCycleLR", bad);
    LrSchedule onecycle0 = {.kind = LR_ONECYCLE, .base_lr = 1.0f, .warmup_steps = 0, .total_steps = 50,
                            .div_factor = 10, .final_div_factor = 100};
    bad = 0;
    for (long t = 0; t < 50; t++)
        bad += !lr_close(lr_schedule_at(&onecycle0, t), torch_onecycle(1.0, 50, 0.0, 10, 100, t));
    CHECK_MSG(bad == 0, "onecycle with pct_start 0: %d of 50 steps differ from OneCycleLR", bad);
}

static void lr_step(void) {
    LrSchedule step = {.kind = LR_STEP, .base_lr = 0.1f, .warmup_steps = 2, .warmup_start_factor = 0.25f,
                       .step_size = 30, .gamma = 0.1f};
    double sb = 0.1f, gm = 0.1f;
    CHECK_LR(step, 0, sb * 0.25);
    CHECK_LR(step, 2, sb);
    CHECK_LR(step, 31, sb);
    CHECK_LR(step, 32, sb * gm);
    CHECK_LR(step, 62, sb * gm * gm);
}

/* The triangle of the CIFAR-10 speed runs: 0.2x up to 1x at 23% of the steps, down to 0.07x at the end. */
static void lr_linear(void) {
    LrSchedule tri = {.kind = LR_LINEAR, .base_lr = 2.0f, .warmup_steps = 23, .total_steps = 100,
                      .warmup_start_factor = 0.2f, .final_lr = 0.14f};
    double top = 2.0f, end = 0.14f;
    CHECK_LR(tri, 0, top * 0.2f);
    CHECK_LR(tri, 10, top * (0.2f + (1 - 0.2f) * 10 / 23.0));
    CHECK_LR(tri, 23, top);
    CHECK_LR(tri, 50, top + (end - top) * 27 / 77.0);
    CHECK_LR(tri, 99, top + (end - top) * 76 / 77.0);
    CHECK_LR(tri, 100, end);
    CHECK_LR(tri, 5000, end);
}

static void lr_extras(uint64_t *rng) {
    (void)rng;
    lr_constant_and_warmup();
    lr_cosine();
    lr_onecycle();
    lr_step();
    lr_linear();
    /* step_cpu: the lr of the counter, then the counter moves on */
    int64_t counter = 0;
    float lr = -1;
    for (int i = 0; i < 40; i++) {
        lr_schedule_step_cpu(&cosine, &counter, &lr);
        CHECK(lr == lr_schedule_at(&cosine, i));
    }
    CHECK(counter == 40);
}

const GridOp grid_op_lr_schedule = {
    .name = "lr_schedule",
    .run = lr_case,
    .extras = lr_extras,
    .cuda_types = GRID_F32,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "f16, bf16 and nhwc (the lr is an fp32 scalar); finite differences (no gradient)",
};
