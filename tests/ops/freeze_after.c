/* Freezing after a number of steps (ops/freeze_after.h): with the counter at
 * or below the limit nothing changes, above it the range alone becomes 0;
 * the device path against the CPU's, the counter read from device memory. */
#include <string.h>

#include "ops/freeze_after.h"
#include "tests/ops/grid.h"

static void freeze_at(const GridCase *c, int64_t counter, int64_t steps, size_t n) {
    printf(" counter %lld, steps %lld, n %zu\n", (long long)counter, (long long)steps, n);
    size_t total = n + 3; /* the range, then three floats that must stay */
    float *scale = grid_random(c, DTYPE_F32, total, 0.5f, 2.0f), *want = copy_floats(scale, total);
    freeze_after_cpu(&counter, steps, want, n);
    float *d_scale = grid_put(c, DTYPE_F32, scale, total);
    int64_t *d_counter = grid_put_bytes(c, &counter, sizeof counter);
    freeze_after(&c->ctx, d_counter, steps, d_scale, n);
    float *got = grid_get(c, DTYPE_F32, d_scale, total);
    grid_check_same(c, "freeze_after (device against the CPU)", got, want, total * sizeof(float));
    for (size_t i = 0; i < total; i++) {
        float expect = i < n && counter > steps ? 0.0f : scale[i];
        CHECK_MSG(want[i] == expect, "freeze_after_cpu: counter %lld steps %lld: [%zu] = %g, want %g",
                  (long long)counter, (long long)steps, i, want[i], expect);
    }
    void *dev[] = {d_scale, d_counter};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {scale, want, got};
    host_free_all(host, GRID_COUNT(host));
}

static void freeze_after_case(const GridCase *c) {
    freeze_at(c, 0, 144, 24);    /* before the first step */
    freeze_at(c, 144, 144, 24);  /* step 143, the last to train */
    freeze_at(c, 145, 144, 24);  /* step 144: frozen */
    freeze_at(c, 1000, 0, 1000); /* more than a block's threads */
    freeze_at(c, 1, 0, 1);       /* 0 steps: frozen from the first */
}

const GridOp grid_op_freeze_after = {
    .name = "freeze_after",
    .run = freeze_after_case,
    .cuda_types = GRID_F32,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "f16, bf16, nhwc (an fp32 optimizer buffer)",
};
