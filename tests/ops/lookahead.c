/* Lookahead (ops/lookahead.h): the weight a against the recipe's formula at
 * every step of a short run, the update by hand, nothing at the steps between,
 * the slow copy taken after the last step; the device against the CPU, with
 * the half copy of fast rounded from it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/lookahead.h"
#include "tests/ops/grid.h"

static const LookaheadParams RECIPE = {.every = 5, .total = 476, .alpha = 0.77378094f, .power = 3.0f};

static void lookahead_at(const GridCase *c, int64_t counter, size_t n) {
    printf(" after step %lld of %lld, n %zu\n", (long long)counter, (long long)RECIPE.total, n);
    float *slow = grid_random(c, DTYPE_F32, n, -1, 1), *fast = grid_random(c, DTYPE_F32, n, -1, 1);
    float *want_slow = copy_floats(slow, n), *want_fast = copy_floats(fast, n);
    lookahead_step_cpu(&counter, RECIPE, want_slow, want_fast, n);
    DType half = c->device == DEVICE_CUDA && c->dtype != DTYPE_F32 ? c->dtype : DTYPE_F32;
    float *d_slow = grid_put(c, DTYPE_F32, slow, n), *d_fast = grid_put(c, DTYPE_F32, fast, n);
    void *d_half = half != DTYPE_F32 ? grid_put(c, half, fast, n) : NULL;
    int64_t *d_counter = grid_put_bytes(c, &counter, sizeof counter);
    lookahead_step(&c->ctx, d_counter, RECIPE, d_slow, d_fast, d_half, n);
    float *gs = grid_get(c, DTYPE_F32, d_slow, n), *gf = grid_get(c, DTYPE_F32, d_fast, n);
    grid_check_same(c, "lookahead slow (device against the CPU)", gs, want_slow, n * sizeof(float));
    grid_check_same(c, "lookahead fast (device against the CPU)", gf, want_fast, n * sizeof(float));
    if (d_half) {
        float *gh = grid_get(c, half, d_half, n);
        round_to(half, want_fast, n);
        grid_check_same(c, "lookahead half copy", gh, want_fast, n * sizeof(float));
        free(gh);
    }
    void *dev[] = {d_slow, d_fast, d_half, d_counter};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {slow, fast, want_slow, want_fast, gs, gf};
    host_free_all(host, GRID_COUNT(host));
}

static void lookahead_case(const GridCase *c) {
    lookahead_at(c, 5, 1000);     /* the first update, a tiny a */
    lookahead_at(c, 7, 1000);     /* none */
    lookahead_at(c, 475, 10001);  /* the last on the schedule */
    lookahead_at(c, 476, 3);      /* the last step: the slow copy taken */
}

/* a by the recipe's formula (tools/torch_airbench.py's lookahead_alpha), and one update by hand. */
static void lookahead_rule(uint64_t *rng) {
    (void)rng;
    for (int64_t step = 0; step <= RECIPE.total + 1; step++) {
        double want = step == RECIPE.total ? 1.0
                    : step < 1 || step > RECIPE.total || step % RECIPE.every ? -1.0
                    : RECIPE.alpha * pow((double)step / RECIPE.total, RECIPE.power);
        CHECK_MSG(fabs(lookahead_weight(RECIPE, step) - want) <= 1e-7, "lookahead a after step %lld: %g, want %g",
                  (long long)step, lookahead_weight(RECIPE, step), want);
    }
    LookaheadParams p = {.every = 2, .total = 4, .alpha = 0.5f, .power = 1.0f};
    float slow[2] = {1.0f, -2.0f}, fast[2] = {3.0f, 2.0f};
    int64_t step = 1;
    lookahead_step_cpu(&step, p, slow, fast, 2); /* no update */
    CHECK(slow[0] == 1.0f && fast[0] == 3.0f);
    step = 2; /* a = 0.5 * 2 / 4 = 0.25: slow = 0.25 slow + 0.75 fast */
    lookahead_step_cpu(&step, p, slow, fast, 2);
    CHECK(slow[0] == 2.5f && slow[1] == 1.0f && fast[0] == 2.5f && fast[1] == 1.0f);
    fast[0] = 7.0f;
    step = 4; /* the last: the slow copy taken */
    lookahead_step_cpu(&step, p, slow, fast, 2);
    CHECK(slow[0] == 2.5f && fast[0] == 2.5f);
}

const GridOp grid_op_lookahead = {
    .name = "lookahead",
    .run = lookahead_case,
    .extras = lookahead_rule,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (flat parameter buffers have no layout)",
};
