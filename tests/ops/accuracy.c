/* Top-1 accuracy (ops/accuracy.h): the count the op ADDS to its counter
 * against the CPU's, ties (the first maximum wins) included, twice. */
#include <math.h>
#include <stdlib.h>

#include "ops/accuracy.h"
#include "tests/ops/grid.h"

static void accuracy_shape(const GridCase *c, int n, int classes, int ties) {
    printf(" n=%d classes=%d%s\n", n, classes, ties ? " (ties)" : "");
    DType dt = c->dtype;
    size_t total = (size_t)n * classes;
    /* a narrow range, so rounding to a half type makes many near-ties exact ties */
    float *logits = grid_random(c, dt, total, 0.9f, 1.1f);
    if (ties)
        for (size_t i = 0; i < total; i++) logits[i] = floorf(logits[i] * 10.0f - 9.0f);
    int32_t *labels = grid_random_labels(c, n, classes);
    for (int i = 0; i < n; i += 2) { /* make about half the rows right */
        const float *row = logits + (size_t)i * classes;
        int best = 0;
        for (int j = 1; j < classes; j++)
            if (row[j] > row[best]) best = j;
        labels[i] = best;
    }
    int want = accuracy_count_cpu(logits, labels, n, classes), start = 5;

    void *d_logits = grid_put(c, dt, logits, total);
    int32_t *d_labels = grid_put_bytes(c, labels, sizeof(int32_t) * n);
    int *d_count = grid_put_bytes(c, &start, sizeof start);
    accuracy_count(&c->ctx, d_logits, d_labels, n, classes, d_count);
    int *got = grid_get_bytes(c, d_count, sizeof(int));
    CHECK_MSG(*got == start + want, "%s accuracy: counter %d, want %d + %d", c->name, *got, start, want);
    accuracy_count(&c->ctx, d_logits, d_labels, n, classes, d_count);
    int *again = grid_get_bytes(c, d_count, sizeof(int));
    CHECK_MSG(*again == start + 2 * want, "%s accuracy (second pass): counter %d, want %d", c->name, *again,
              start + 2 * want);
    printf("  %-20s %d of %d right\n", c->name, want, n);

    void *dev[] = {d_logits, d_labels, d_count};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {logits, labels, got, again};
    host_free_all(host, GRID_COUNT(host));
}

static void accuracy_case(const GridCase *c) {
    accuracy_shape(c, 512, 10, 0);
    accuracy_shape(c, 512, 10, 1);
    accuracy_shape(c, 1000, 1000, 0);
    accuracy_shape(c, 1, 3, 1);
}

static void accuracy_by_hand(uint64_t *rng) {
    (void)rng;
    float logits[15] = {
        0.1f, 0.9f, 0.3f, /* argmax 1 */
        0.5f, 0.5f, 0.2f, /* tie: first max, 0 */
        0.5f, 0.5f, 0.2f, /* tie: 0, label says 1 */
        -1, -2, -0.5f,    /* argmax 2 */
        2, 2, 2,          /* all equal: 0 */
    };
    int32_t labels[5] = {1, 0, 1, 2, 2};
    CHECK(accuracy_count_cpu(logits, labels, 5, 3) == 3);
    CHECK(accuracy_count_cpu(logits, labels, 0, 3) == 0);
}

const GridOp grid_op_accuracy = {
    .name = "accuracy",
    .run = accuracy_case,
    .extras = accuracy_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NCHW,
    .cpu_layouts = GRID_NCHW,
    .skipped = "nhwc (logits [n][classes] have no channels-last form)",
};
