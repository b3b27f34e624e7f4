/* The dynamic loss scaler (ops/loss_scaler.h), GradScaler's semantics: check
 * flags inf and NaN (one planted anywhere, nothing else) in gradients of the
 * case's dtype and touches nothing but found_inf; a later finite buffer of
 * the same step does not clear the flag, begin_step does; and a long run of
 * begin, check, update follows the CPU's state machine step for step. On the
 * CPU, the state machine by hand: growth after 'interval' good steps, backoff
 * and a skipped step on overflow. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cast.h"
#include "ops/loss_scaler.h"
#include "tests/ops/grid.h"

static int same_state(LossScalerState a, LossScalerState b) {
    return a.scale == b.scale && a.good_steps == b.good_steps && a.found_inf == b.found_inf &&
           a.skipped_steps == b.skipped_steps;
}

static LossScalerState read_state(const GridCase *c, const LossScalerState *d_state) {
    LossScalerState *p = grid_get_bytes(c, d_state, sizeof *p), s = *p;
    free(p);
    return s;
}

static void write_state(const GridCase *c, LossScalerState *d_state, LossScalerState s) {
    op_copy_from_host(&c->ctx, d_state, &s, sizeof s);
    op_sync(&c->ctx);
}

/* Finite values up to the type's largest, subnormals and zeros of both signs. */
static float *finite_gradients(const GridCase *c, DType dt, size_t n) {
    float *x = host_floats(n);
    float largest = dt == DTYPE_F16 ? 65504.0f : 3.38953139e38f;
    for (size_t i = 0; i < n; i++) x[i] = test_uniform(c->rng, -1, 1) * ldexpf(1, (int)(i % 30) - 20);
    x[0] = largest;
    x[n - 1] = -largest;
    if (n > 2) x[1] = -0.0f;
    if (n > 3) x[2] = dt == DTYPE_F16 ? ldexpf(1, -24) : 1e-40f;
    round_to(dt, x, n);
    return x;
}

static void set_one(const GridCase *c, void *d_grads, size_t at, float value) {
    size_t esize = dtype_size(c->dtype);
    void *one = host_bytes(esize);
    cast_from_f32_cpu(c->dtype, &value, one, 1);
    op_copy_from_host(&c->ctx, (char *)d_grads + at * esize, one, esize);
    op_sync(&c->ctx);
    free(one);
}

/* One planted value at 'at', checked on a fresh step; the rest of the state
 * must be left alone. */
static void check_planted(const GridCase *c, void *d_grads, const float *finite, size_t n, size_t at, float planted,
                          LossScalerState *d_state, int want) {
    LossScalerState before = {1024.0f, 17, 1, 3};
    write_state(c, d_state, before);
    set_one(c, d_grads, at, planted);
    loss_scaler_begin_step(&c->ctx, d_state);
    loss_scaler_check(&c->ctx, d_grads, c->dtype, n, d_state);
    LossScalerState after = read_state(c, d_state), expect = before;
    expect.found_inf = want;
    CHECK_MSG(same_state(after, expect), "%s check, n=%zu, %g at %zu: found_inf %d, want %d (scale %g good %d "
              "skipped %d)", c->name, n, planted, at, after.found_inf, want, after.scale, after.good_steps,
              after.skipped_steps);
    set_one(c, d_grads, at, finite[at]);
}

static void scaler_check_size(const GridCase *c, size_t n) {
    printf(" check n=%zu\n", n);
    DType dt = c->dtype;
    float *finite = finite_gradients(c, dt, n);
    void *d_grads = grid_put(c, dt, finite, n);
    LossScalerState initial = loss_scaler_initial(1.0f);
    LossScalerState *d_state = grid_put_bytes(c, &initial, sizeof initial);
    size_t places[3] = {0, n / 2, n - 1};
    for (int p = 0; p < 3; p++) {
        check_planted(c, d_grads, finite, n, places[p], finite[places[p]], d_state, 0);
        check_planted(c, d_grads, finite, n, places[p], INFINITY, d_state, 1);
        check_planted(c, d_grads, finite, n, places[p], -INFINITY, d_state, 1);
        check_planted(c, d_grads, finite, n, places[p], NAN, d_state, 1);
    }
    if (dt != DTYPE_F32) /* past the type's range: inf once stored, as a scaled gradient overflows */
        check_planted(c, d_grads, finite, n, n / 3, dt == DTYPE_F16 ? 1e5f : 3.4028235e38f, d_state, 1);

    /* several checks in one step (one per gradient buffer): a later finite one does not clear it */
    void *d_bad = grid_put(c, dt, finite, n);
    set_one(c, d_bad, n / 2, NAN);
    loss_scaler_begin_step(&c->ctx, d_state);
    loss_scaler_check(&c->ctx, d_bad, dt, n, d_state);
    loss_scaler_check(&c->ctx, d_grads, dt, n, d_state);
    CHECK_MSG(read_state(c, d_state).found_inf == 1, "%s: a finite buffer cleared found_inf", c->name);
    loss_scaler_begin_step(&c->ctx, d_state);
    CHECK(read_state(c, d_state).found_inf == 0);

    void *dev[] = {d_grads, d_state, d_bad};
    grid_free_all(c, dev, GRID_COUNT(dev));
    free(finite);
}

/* Steps of begin, check, update beside the CPU's state machine; which steps
 * overflow follows a fixed random pattern. Only the op's work between the
 * comparisons, as in training. */
static void scaler_sequence(const GridCase *c, int steps, int interval, double inf_rate, int compare_every) {
    printf(" state machine: %d steps, interval %d, inf rate %g\n", steps, interval, inf_rate);
    const size_t n = 4099;
    DType dt = c->dtype;
    float *finite = finite_gradients(c, dt, n), *overflow = copy_floats(finite, n);
    overflow[n / 5] = INFINITY;
    void *d_finite = grid_put(c, dt, finite, n), *d_overflow = grid_put(c, dt, overflow, n);
    LossScalerState cpu = loss_scaler_initial(LOSS_SCALER_INIT_SCALE);
    LossScalerState *d_state = grid_put_bytes(c, &cpu, sizeof cpu);
    int mismatches = 0, skipped = 0, grown = 0;
    for (int step = 1; step <= steps; step++) {
        int bad = test_uniform(c->rng, 0, 1) < inf_rate;
        float before = cpu.scale;
        loss_scaler_begin_step_cpu(&cpu);
        loss_scaler_check_cpu(bad ? overflow : finite, n, &cpu);
        loss_scaler_update_cpu(&cpu, LOSS_SCALER_GROWTH, LOSS_SCALER_BACKOFF, interval);
        loss_scaler_begin_step(&c->ctx, d_state);
        loss_scaler_check(&c->ctx, bad ? d_overflow : d_finite, dt, n, d_state);
        loss_scaler_update(&c->ctx, d_state, LOSS_SCALER_GROWTH, LOSS_SCALER_BACKOFF, interval);
        skipped += bad;
        grown += cpu.scale > before;
        if (step % compare_every == 0 || step == steps) {
            LossScalerState dev = read_state(c, d_state);
            if (!same_state(dev, cpu) && mismatches++ < 3)
                fprintf(stderr, "  step %d: device scale %g good %d found %d skipped %d, cpu %g %d %d %d\n", step,
                        dev.scale, dev.good_steps, dev.found_inf, dev.skipped_steps, cpu.scale, cpu.good_steps,
                        cpu.found_inf, cpu.skipped_steps);
        }
    }
    printf("  %-20s %d skipped, %d growths, final scale %g\n", c->name, skipped, grown, cpu.scale);
    CHECK_MSG(mismatches == 0, "%s: the loss scaler left the CPU's state machine %d times", c->name, mismatches);
    CHECK(cpu.skipped_steps == skipped);
    void *dev[] = {d_finite, d_overflow, d_state};
    grid_free_all(c, dev, GRID_COUNT(dev));
    free(finite), free(overflow);
}

static void scaler_case(const GridCase *c) {
    scaler_check_size(c, 1);
    scaler_check_size(c, 33);
    scaler_check_size(c, 1000003);
    scaler_check_size(c, 3000017); /* more than one grid-stride pass */
    scaler_sequence(c, 200, 3, 0.2, 1);
    scaler_sequence(c, 4500, LOSS_SCALER_INTERVAL, 0.0005, 250);
}

/* ---- the state machine by hand (CPU) ---------------------------------------------- */

static void scaler_step(LossScalerState *s, const float *grads, size_t n, int interval) {
    loss_scaler_begin_step_cpu(s);
    loss_scaler_check_cpu(grads, n, s);
    loss_scaler_update_cpu(s, LOSS_SCALER_GROWTH, LOSS_SCALER_BACKOFF, interval);
}

static void scaler_check_by_hand(void) {
    float grads[5] = {1, -2, 3e38f, -0.0f, 1e-45f};
    LossScalerState s = loss_scaler_initial(LOSS_SCALER_INIT_SCALE);
    CHECK(s.scale == 65536.0f && s.good_steps == 0 && s.found_inf == 0 && s.skipped_steps == 0);
    loss_scaler_check_cpu(grads, 5, &s);
    CHECK_MSG(s.found_inf == 0, "finite gradients (largest, subnormal, -0) flagged");
    const float bad[3] = {INFINITY, -INFINITY, NAN};
    for (int b = 0; b < 3; b++)
        for (int at = 0; at < 5; at++) {
            float g[5];
            memcpy(g, grads, sizeof g);
            g[at] = bad[b];
            loss_scaler_begin_step_cpu(&s);
            loss_scaler_check_cpu(g, 5, &s);
            CHECK_MSG(s.found_inf == 1, "%g at %d not found", bad[b], at);
        }
    /* a later finite buffer of the same step does not clear the flag; begin_step does */
    loss_scaler_check_cpu(grads, 5, &s);
    CHECK(s.found_inf == 1);
    loss_scaler_begin_step_cpu(&s);
    CHECK(s.found_inf == 0 && s.scale == 65536.0f && s.good_steps == 0 && s.skipped_steps == 0);
}

static void scaler_state_machine_by_hand(void) {
    const int interval = 3;
    float good[4] = {1, 2, 3, 4}, inf_grads[4] = {1, INFINITY, 3, 4}, nan_grads[4] = {NAN, 2, 3, 4};
    LossScalerState s = loss_scaler_initial(1024.0f);
    /* interval - 1 good steps: counting, no growth */
    for (int i = 1; i < interval; i++) {
        scaler_step(&s, good, 4, interval);
        CHECK(s.scale == 1024.0f && s.good_steps == i && s.found_inf == 0);
    }
    /* the interval-th grows the scale and restarts the count */
    scaler_step(&s, good, 4, interval);
    CHECK_MSG(s.scale == 2048.0f && s.good_steps == 0, "scale %g good_steps %d", s.scale, s.good_steps);
    /* two good, then inf: backoff, count reset, one skipped; the flag stays up until begin */
    scaler_step(&s, good, 4, interval);
    scaler_step(&s, good, 4, interval);
    CHECK(s.good_steps == 2);
    scaler_step(&s, inf_grads, 4, interval);
    CHECK_MSG(s.scale == 1024.0f && s.good_steps == 0 && s.skipped_steps == 1 && s.found_inf == 1,
              "after inf: scale %g good %d skipped %d found %d", s.scale, s.good_steps, s.skipped_steps,
              s.found_inf);
    /* NaN counts as inf */
    scaler_step(&s, nan_grads, 4, interval);
    CHECK(s.scale == 512.0f && s.good_steps == 0 && s.skipped_steps == 2);
    /* growth needs interval good steps counted from the backoff, not from before it */
    scaler_step(&s, good, 4, interval);
    scaler_step(&s, good, 4, interval);
    CHECK(s.scale == 512.0f && s.good_steps == 2);
    scaler_step(&s, good, 4, interval);
    CHECK(s.scale == 1024.0f && s.good_steps == 0 && s.skipped_steps == 2 && s.found_inf == 0);

    /* GradScaler's defaults: 65536, x2 after 2000 good steps, not after 1999 */
    LossScalerState d = loss_scaler_initial(LOSS_SCALER_INIT_SCALE);
    for (int i = 0; i < LOSS_SCALER_INTERVAL - 1; i++) scaler_step(&d, good, 4, LOSS_SCALER_INTERVAL);
    CHECK(d.scale == 65536.0f && d.good_steps == LOSS_SCALER_INTERVAL - 1);
    scaler_step(&d, good, 4, LOSS_SCALER_INTERVAL);
    CHECK(d.scale == 131072.0f && d.good_steps == 0);
    /* repeated overflow keeps halving, each step skipped */
    for (int i = 0; i < 20; i++) scaler_step(&d, inf_grads, 4, LOSS_SCALER_INTERVAL);
    CHECK_MSG(d.scale == 131072.0f / (1 << 20) && d.skipped_steps == 20, "scale %g skipped %d", d.scale,
              d.skipped_steps);
}

static void scaler_by_hand(uint64_t *rng) {
    (void)rng;
    scaler_check_by_hand();
    scaler_state_machine_by_hand();
}

const GridOp grid_op_loss_scaler = {
    .name = "loss_scaler",
    .run = scaler_case,
    .extras = scaler_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (flat gradient buffers have no layout)",
};
