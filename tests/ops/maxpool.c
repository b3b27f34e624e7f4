/* Max-pool (ops/maxpool.h): a selection, so y and dx match the reference
 * exactly, ties included (the first maximum of a window wins, in NHWC as in
 * NCHW); only where windows overlap (ResNet's 3x3 stride-2 stem) do the
 * gradients of several windows add, in another order than the CPU's. On the
 * CPU, dx by finite differences. The channels-last kernels' window positions
 * (windows that do not overlap: 2x2 stride 2, a global max, k x k stride k
 * with floor mode): the scratch they ask for, a backward from the last
 * forward's positions alone, NaN windows, and the refusals (a forward-only
 * pool's backward, an unaligned scratch). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/maxpool.h"
#include "runtime/check.h"
#include "tests/ops/grid.h"

/* Overlapping windows add up to four gradients: cuDNN's in fp32 in another
 * order, then (halves) one rounding of the sum; the kernels add them in the
 * reference's order (exact). */
static const GridBound overlap_bound = {1e-6, 1e-3, 8e-3};

static size_t pool_x_count(const Pool2dShape *s) { return (size_t)s->n * s->c * s->h * s->w; }
static size_t pool_y_count(const Pool2dShape *s) {
    return (size_t)s->n * s->c * pool2d_out_h(s) * pool2d_out_w(s);
}

/* A max-pool on c's device with the scratch it asks for (none on the CPU and
 * on cuDNN's paths). */
typedef struct {
    MaxPool2d op;
    void *scratch;
} PoolOp;

static PoolOp pool_op(const GridCase *c, const Pool2dShape *s) {
    PoolOp p = {0};
    size_t bytes = maxpool_scratch_bytes(&c->ctx, s);
    p.scratch = bytes ? grid_alloc_bytes(c, bytes) : NULL; /* 0xff: a position no forward wrote */
    maxpool_init(&c->ctx, &p.op, s, p.scratch);
    return p;
}

static void pool_op_free(const GridCase *c, PoolOp *p) {
    maxpool_destroy(&c->ctx, &p->op);
    grid_free(c, p->scratch);
}

/* Whether c runs s through the channels-last kernels, which keep a byte per
 * output element: windows at most 15 a side (k*k positions and "all NaN" in
 * a byte) at a stride of at most k, whole 16-byte vectors of channels. */
static int keeps_positions(const GridCase *c, const Pool2dShape *s) {
    int k = pool2d_window(s);
    return c->device == DEVICE_CUDA && c->nhwc && pool2d_stride(s) <= k && k <= 15 &&
           (size_t)s->c * dtype_size(c->dtype) % 16 == 0;
}

static int windows_overlap(const Pool2dShape *s) { return pool2d_stride(s) < pool2d_window(s) || s->pad; }

/* Host NCHW values [n][ch][h][w] to c's device in c's layout and dtype, and back. */
static void *put_image(const GridCase *c, const float *nchw, int n, int ch, int h, int w) {
    float *t = grid_to_layout(c, nchw, n, ch, h, w);
    void *d = grid_put(c, c->dtype, t, (size_t)n * ch * h * w);
    free(t);
    return d;
}

static float *get_image(const GridCase *c, const void *d, int n, int ch, int h, int w) {
    float *t = grid_get(c, c->dtype, d, (size_t)n * ch * h * w);
    float *nchw = grid_from_layout(c, t, n, ch, h, w);
    free(t);
    return nchw;
}

/* Inputs of only the values 0, 1, 2: most windows hold several equal maxima. */
static void make_ties(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = floorf((x[i] + 1.0f) * 1.5f);
}

typedef struct {
    const Pool2dShape *s;
    float *x, *y, *r;
} PoolLoss;

static double pool_loss(void *p) {
    PoolLoss *l = p;
    maxpool_forward_cpu(l->s, l->x, l->y);
    return weighted_sum(l->y, l->r, pool_y_count(l->s));
}

/* Distinct values 0.05 apart: the perturbation (0.01) never changes an argmax. */
static void maxpool_finite_differences(const GridCase *c, Pool2dShape s) {
    size_t nx = pool_x_count(&s), ny = pool_y_count(&s);
    PoolLoss l = {&s, grid_shuffled_distinct(c->rng, nx, 0.05f), host_floats(ny), grid_random(c, DTYPE_F32, ny, -1, 1)};
    PoolOp p = pool_op(c, &s);
    void *d_x = grid_put(c, DTYPE_F32, l.x, nx), *d_y = grid_alloc(c, DTYPE_F32, ny);
    void *d_r = grid_put(c, DTYPE_F32, l.r, ny), *d_dx = grid_alloc(c, DTYPE_F32, nx);
    maxpool_forward(&c->ctx, &p.op, d_x, d_y);
    maxpool_backward(&c->ctx, &p.op, d_x, d_y, d_r, d_dx);
    float *dx = grid_get(c, DTYPE_F32, d_dx, nx);
    double *num = malloc(sizeof(double) * nx);
    numeric_gradient(l.x, nx, 1e-2f, pool_loss, &l, num);
    char what[120];
    snprintf(what, sizeof what, "maxpool %dx%dx%dx%d window %d stride %d pad %d dx", s.n, s.c, s.h, s.w,
             pool2d_window(&s), pool2d_stride(&s), s.pad);
    check_gradient(what, dx, num, nx);
    pool_op_free(c, &p);
    void *dev[] = {d_x, d_y, d_r, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {l.x, l.y, l.r, dx, num};
    host_free_all(host, GRID_COUNT(host));
}

/* With 'ties', inputs take only the values 0, 1, 2 (make_ties). */
static void maxpool_shape(const GridCase *c, Pool2dShape s, int ties) {
    printf(" %dx%dx%dx%d window %d stride %d pad %d%s\n", s.n, s.c, s.h, s.w, pool2d_window(&s), pool2d_stride(&s),
           s.pad, ties ? " (ties)" : "");
    DType dt = c->dtype;
    int oh = pool2d_out_h(&s), ow = pool2d_out_w(&s);
    size_t nx = pool_x_count(&s), ny = pool_y_count(&s);
    float *x = grid_random(c, dt, nx, -1, 1), *dy = grid_random(c, dt, ny, -1, 1);
    if (ties) make_ties(x, nx);
    float *y = host_floats(ny), *dx = host_floats(nx);
    maxpool_forward_cpu(&s, x, y);
    maxpool_backward_cpu(&s, x, y, dy, dx);
    round_to(dt, dx, nx);

    size_t scratch = maxpool_scratch_bytes(&c->ctx, &s);
    CHECK_MSG(scratch == (keeps_positions(c, &s) ? ny : 0), "%s: maxpool scratch %zu bytes for %zu outputs",
              c->name, scratch, ny);
    PoolOp p = pool_op(c, &s);
    if (c->device == DEVICE_CUDA) CHECK(p.op.cuda.dtype == dt && p.op.cuda.nhwc == c->nhwc);
    void *d_x = put_image(c, x, s.n, s.c, s.h, s.w), *d_y = grid_alloc(c, dt, ny);
    void *d_dy = put_image(c, dy, s.n, s.c, oh, ow), *d_dx = grid_alloc(c, dt, nx);
    maxpool_forward(&c->ctx, &p.op, d_x, d_y);
    maxpool_backward(&c->ctx, &p.op, d_x, d_y, d_dy, d_dx);
    float *gy = get_image(c, d_y, s.n, s.c, oh, ow), *gdx = get_image(c, d_dx, s.n, s.c, s.h, s.w);
    grid_check(c, ties ? "maxpool y (ties)" : "maxpool y", gy, y, ny, grid_bound(c, GRID_EXACT));
    grid_check(c, ties ? "maxpool dx (ties: first maximum)" : "maxpool dx", gdx, dx, nx,
               grid_bound(c, windows_overlap(&s) && !keeps_positions(c, &s) ? overlap_bound : GRID_EXACT));

    pool_op_free(c, &p);
    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, y, dx, gy, gdx};
    host_free_all(host, GRID_COUNT(host));
}

/* The kernels' backward reads the positions the last forward kept, not x and
 * y: after forwards on x1 and then x2 (ties likely, so the two pick other
 * places), x2 and y overwritten with NaN, dx is still x2's. */
static void maxpool_last_forward(const GridCase *c, Pool2dShape s) {
    if (!keeps_positions(c, &s)) return;
    printf(" %dx%dx%dx%d window %d: backward from the last forward's positions\n", s.n, s.c, s.h, s.w,
           pool2d_window(&s));
    DType dt = c->dtype;
    int oh = pool2d_out_h(&s), ow = pool2d_out_w(&s);
    size_t nx = pool_x_count(&s), ny = pool_y_count(&s);
    float *x1 = grid_random(c, dt, nx, -1, 1), *x2 = grid_random(c, dt, nx, -1, 1);
    float *dy = grid_random(c, dt, ny, -1, 1);
    make_ties(x1, nx), make_ties(x2, nx);
    float *y = host_floats(ny), *dx = host_floats(nx);
    maxpool_forward_cpu(&s, x2, y);
    maxpool_backward_cpu(&s, x2, y, dy, dx);
    round_to(dt, dx, nx); /* overlapping windows: sums */

    PoolOp p = pool_op(c, &s);
    void *d_x1 = put_image(c, x1, s.n, s.c, s.h, s.w), *d_x2 = put_image(c, x2, s.n, s.c, s.h, s.w);
    void *d_dy = put_image(c, dy, s.n, s.c, oh, ow), *d_y = grid_alloc(c, dt, ny), *d_dx = grid_alloc(c, dt, nx);
    maxpool_forward(&c->ctx, &p.op, d_x1, d_y);
    maxpool_forward(&c->ctx, &p.op, d_x2, d_y);
    grid_poison(c, dt, d_x2, nx);
    grid_poison(c, dt, d_y, ny);
    maxpool_backward(&c->ctx, &p.op, d_x2, d_y, d_dy, d_dx);
    float *gdx = get_image(c, d_dx, s.n, s.c, s.h, s.w);
    grid_check(c, "maxpool dx from the last forward's positions", gdx, dx, nx, grid_bound(c, GRID_EXACT));

    pool_op_free(c, &p);
    void *dev[] = {d_x1, d_x2, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x1, x2, dy, y, dx, gdx};
    host_free_all(host, GRID_COUNT(host));
}

/* The kernels leave NaN out of a window's maximum (cuDNN's
 * CUDNN_NOT_PROPAGATE_NAN; the CPU reference keeps a NaN that comes first, so
 * these are by hand), and a window of NaN alone gives NaN and passes no
 * gradient. One k x k window of 8 channels over k + 1 rows and k columns
 * (floor mode drops the last row), NHWC; by hand, for each channel: the
 * window in row-major order (window[ch * k * k + at]), then which of its
 * places gets the gradient (wins; -1: none). */
static void maxpool_nan_window(const GridCase *c, int k, const float *window, const int wins[8]) {
    const Pool2dShape s = {.n = 1, .c = 8, .h = k + 1, .w = k, .k = k, .stride = k};
    if (!keeps_positions(c, &s)) return;
    printf(" NaN in a %dx%d window\n", k, k);
    int kk = k * k, nx = (kk + k) * 8;
    float *x = host_floats(nx), *want_dx = host_floats(nx), dy[8], want_y[8];
    for (int ch = 0; ch < 8; ch++) {
        for (int at = 0; at < kk; at++) x[at * 8 + ch] = window[ch * kk + at]; /* the window's pixels */
        for (int at = kk; at < kk + k; at++) x[at * 8 + ch] = 7;                /* the dropped row */
        dy[ch] = (float)(ch + 1);
        want_y[ch] = wins[ch] < 0 ? NAN : window[ch * kk + wins[ch]];
        for (int pixel = 0; pixel < kk + k; pixel++) want_dx[pixel * 8 + ch] = pixel == wins[ch] ? dy[ch] : 0.0f;
    }
    DType dt = c->dtype;
    PoolOp p = pool_op(c, &s);
    void *d_x = grid_put(c, dt, x, nx), *d_y = grid_alloc(c, dt, 8), *d_dy = grid_put(c, dt, dy, 8);
    void *d_dx = grid_alloc(c, dt, nx);
    maxpool_forward(&c->ctx, &p.op, d_x, d_y);
    maxpool_backward(&c->ctx, &p.op, d_x, d_y, d_dy, d_dx);
    float *y = grid_get(c, dt, d_y, 8), *dx = grid_get(c, dt, d_dx, nx);
    int y_ok = 1, dx_ok = 1;
    for (int i = 0; i < 8; i++) y_ok &= isnan(want_y[i]) ? isnan(y[i]) : y[i] == want_y[i];
    for (int i = 0; i < nx; i++) dx_ok &= dx[i] == want_dx[i];
    CHECK_MSG(y_ok, "%s: maxpool y over NaN in %dx%d windows", c->name, k, k);
    CHECK_MSG(dx_ok, "%s: maxpool dx over NaN in %dx%d windows", c->name, k, k);
    pool_op_free(c, &p);
    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, want_dx, y, dx};
    host_free_all(host, GRID_COUNT(host));
}

static void maxpool_nan_windows(const GridCase *c) {
    const float nan = NAN, inf = INFINITY;
    const float window2[8 * 4] = {
        nan, 1, 2, 2,    nan, nan, nan, nan, 3, nan, 3, 1,  nan, nan, nan, -1,
        -1, -1, -1, -1,  0, 2, nan, 2,       1, 2, 3, 4,    nan, 5, nan, nan,
    };
    const int wins2[8] = {2, -1, 0, 3, 0, 1, 3, 1};
    maxpool_nan_window(c, 2, window2, wins2);
    /* 3x3 (airbench's global pool): also windows of -inf, where the first
     * element that is not NaN wins. */
    const float window3[8 * 9] = {
        nan, 1, 2, 2, nan, 0, 2, 1, 1,
        nan, nan, nan, nan, nan, nan, nan, nan, nan,
        3, nan, 3, 1, 3, 3, 3, 3, 3,
        nan, nan, nan, nan, nan, nan, nan, nan, -1,
        -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf,
        nan, -inf, nan, -inf, -inf, -inf, nan, nan, nan,
        1, 2, 3, 4, 9, 6, 7, 8, 9,
        0, -1, 0, 5, nan, 5, 2, 5, 4,
    };
    const int wins3[8] = {2, -1, 0, 8, 0, 1, 4, 3};
    maxpool_nan_window(c, 3, window3, wins3);
}

/* ---- refusals: each in a child that makes no CUDA call (the check comes
 * first) and leaves by _exit from a fatal hook, so that it never tears down
 * the CUDA state it shares with the parent ---- */

static void exit_now(void) { _exit(1); }

typedef struct {
    const GridCase *c;
    const Pool2dShape *s;
    const PoolOp *p;
    const MaxPool2d *forward_only; /* initialised without scratch, as inference does */
} Refusal;

typedef struct {
    const Refusal *r;
    void (*fn)(const Refusal *);
} RefusalCall;

static void refusal_in_child(void *arg) {
    const RefusalCall *call = arg;
    tc_on_fatal(exit_now);
    call->fn(call->r);
}

static void expect_fatal(const Refusal *r, const char *what, void (*fn)(const Refusal *), const char *want) {
    RefusalCall call = {r, fn};
    int status;
    char *text = test_child_stderr("test_op_maxpool", refusal_in_child, &call, &status);
    CHECK_MSG(status == 1, "%s %s: exit status %d", r->c->name, what, status);
    CHECK_MSG(strstr(text, want), "%s %s: '%s' lacks '%s'", r->c->name, what, text, want);
    free(text);
}

static void backward_without_positions(const Refusal *r) {
    maxpool_backward(&r->c->ctx, r->forward_only, NULL, NULL, NULL, NULL);
}

static void unaligned_scratch(const Refusal *r) {
    MaxPool2d p;
    maxpool_init(&r->c->ctx, &p, r->s, (char *)r->p->scratch + 8);
}

static void maxpool_refusals(const GridCase *c) {
    Pool2dShape s = {.n = 2, .c = 64, .h = 8, .w = 8};
    if (!keeps_positions(c, &s)) return;
    printf(" refusals\n");
    PoolOp p = pool_op(c, &s);
    MaxPool2d forward_only;
    maxpool_init(&c->ctx, &forward_only, &s, NULL);
    /* Its forward keeps nothing, and is right. */
    size_t ny = pool_y_count(&s);
    float *x = grid_random(c, c->dtype, pool_x_count(&s), -1, 1), *y = host_floats(ny);
    maxpool_forward_cpu(&s, x, y);
    void *d_x = put_image(c, x, s.n, s.c, s.h, s.w), *d_y = grid_alloc(c, c->dtype, ny);
    maxpool_forward(&c->ctx, &forward_only, d_x, d_y);
    float *gy = get_image(c, d_y, s.n, s.c, pool2d_out_h(&s), pool2d_out_w(&s));
    grid_check(c, "maxpool y (forward only)", gy, y, ny, grid_bound(c, GRID_EXACT));
    void *dev[] = {d_x, d_y};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, y, gy};
    host_free_all(host, GRID_COUNT(host));

    Refusal r = {c, &s, &p, &forward_only};
    expect_fatal(&r, "backward of a forward-only pool", backward_without_positions,
                 "maxpool: backward of a forward-only max-pool (initialised without its index scratch)");
    expect_fatal(&r, "unaligned scratch", unaligned_scratch, "maxpool: the index scratch must be 16-byte aligned");
    maxpool_destroy(&c->ctx, &forward_only);
    pool_op_free(c, &p);
}

static void maxpool_case(const GridCase *c) {
    maxpool_shape(c, (Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 128, .h = 16, .w = 16}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 3, .c = 5, .h = 6, .w = 10}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 64, .h = 224, .w = 224}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 8, .c = 64, .h = 32, .w = 32}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 3, .h = 8, .w = 6}, 1);
    /* ResNet's ImageNet stem: 3x3 windows, stride 2, padding 1, overlapping */
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 64, .h = 112, .w = 112, .k = 3, .stride = 2, .pad = 1}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 5, .h = 7, .w = 9, .k = 3, .stride = 2, .pad = 1}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 64, .h = 31, .w = 31}, 0);              /* airbench: floor mode */
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 256, .h = 3, .w = 3, .k = 3, .stride = 3}, 0); /* global max */
    /* Ties through the channels-last kernels: airbench's odd map; odd rows or
     * columns alone; 3 vectors a pixel in halves (c 24), 1 (c 8); c 4 whole
     * vectors in f32 only (halves: cuDNN). */
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 64, .h = 31, .w = 31}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 3, .c = 24, .h = 9, .w = 14}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 8, .h = 10, .w = 7}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 5, .c = 4, .h = 7, .w = 9}, 1);
    /* Other windows that do not overlap, through the same kernels in NHWC:
     * global maxima (3x3: airbench's; 4x4; 15x15, the widest they take, and
     * 16x16, which cuDNN runs); k x k stride k leaving out rows and columns
     * (floor mode), square and not; k 5 runs the kernels' loop with k unfixed. */
    maxpool_shape(c, (Pool2dShape){.n = 4, .c = 256, .h = 3, .w = 3, .k = 3, .stride = 3}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 6, .c = 64, .h = 4, .w = 4, .k = 4, .stride = 4}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 6, .c = 64, .h = 4, .w = 4, .k = 4, .stride = 4}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 16, .h = 15, .w = 15, .k = 15, .stride = 15}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 16, .h = 16, .w = 16, .k = 16, .stride = 16}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 3, .c = 24, .h = 7, .w = 7, .k = 3, .stride = 3}, 0);
    maxpool_shape(c, (Pool2dShape){.n = 3, .c = 24, .h = 7, .w = 7, .k = 3, .stride = 3}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 8, .h = 8, .w = 7, .k = 3, .stride = 3}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 32, .h = 11, .w = 13, .k = 5, .stride = 5}, 1);
    /* Windows that overlap through the kernels, with ties: the stem pool on
     * odd and even sides, one vector a pixel in halves (c 8); stride 1 (up to
     * nine windows an element), 2x2 at stride 1, 3x3 at stride 2 unpadded
     * (floor mode leaves a row and a column out). */
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 64, .h = 9, .w = 12, .k = 3, .stride = 2, .pad = 1}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 3, .c = 8, .h = 7, .w = 7, .k = 3, .stride = 2, .pad = 1}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 16, .h = 6, .w = 5, .k = 3, .stride = 1, .pad = 1}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 24, .h = 5, .w = 6, .k = 2, .stride = 1}, 1);
    maxpool_shape(c, (Pool2dShape){.n = 2, .c = 32, .h = 8, .w = 10, .k = 3, .stride = 2}, 1);
    maxpool_last_forward(c, (Pool2dShape){.n = 2, .c = 64, .h = 31, .w = 31});
    maxpool_last_forward(c, (Pool2dShape){.n = 2, .c = 64, .h = 14, .w = 14, .k = 3, .stride = 2, .pad = 1});
    maxpool_last_forward(c, (Pool2dShape){.n = 3, .c = 24, .h = 10, .w = 9});
    maxpool_last_forward(c, (Pool2dShape){.n = 8, .c = 256, .h = 3, .w = 3, .k = 3, .stride = 3});
    maxpool_last_forward(c, (Pool2dShape){.n = 3, .c = 16, .h = 11, .w = 10, .k = 5, .stride = 5});
    maxpool_nan_windows(c);
    maxpool_refusals(c);
    if (c->device == DEVICE_CPU) {
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 3, .h = 6, .w = 8});
        maxpool_finite_differences(c, (Pool2dShape){.n = 1, .c = 2, .h = 10, .w = 4});
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 2, .h = 7, .w = 8, .k = 3, .stride = 2, .pad = 1});
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 3, .h = 7, .w = 5});
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 3, .h = 3, .w = 3, .k = 3, .stride = 3});
        maxpool_finite_differences(c, (Pool2dShape){.n = 2, .c = 2, .h = 7, .w = 8, .k = 3, .stride = 3});
    }
}

/* Two 4x4 planes; ties in plane 0's window (0,1) (all equal) and in several
 * windows of plane 1, where the first maximum in row-major order must win. */
static void maxpool_by_hand(uint64_t *rng) {
    (void)rng;
    float x[32] = {
        1, 5, 2, 2,    3, 4, 2, 2,    0, -1, 7, 6,   -2, -3, 8, 1,
        0, 3, -1, -1,  3, 3, -1, -2,  4, 4, 1, 2,    5, 5, 2, 1,
    };
    float y[8], dx[32];
    Pool2dShape s = {.n = 1, .c = 2, .h = 4, .w = 4};
    maxpool_forward_cpu(&s, x, y);
    check_values("maxpool y", y, (double[]){5, 2, 0, 8, 3, -1, 5, 2}, 8, 0);
    float dy[8] = {10, 20, 30, 40, 1, 2, 3, 4};
    grid_fill_nan(dx, 32);
    maxpool_backward_cpu(&s, x, y, dy, dx);
    double want[32] = {0};
    want[1] = 10;       /* 5 at (0,1) */
    want[2] = 20;       /* all-2 window: first is (0,2) */
    want[8] = 30;       /* 0 at (2,0) */
    want[14] = 40;      /* 8 at (3,2) */
    want[16 + 1] = 1;   /* 0 3 / 3 3: first 3 at (0,1) */
    want[16 + 2] = 2;   /* -1 -1 / -1 -2: first -1 at (0,2) */
    want[16 + 12] = 3;  /* 4 4 / 5 5: first 5 at (3,0) */
    want[16 + 11] = 4;  /* 1 2 / 2 1: first 2 at (2,3) */
    check_values("maxpool dx", dx, want, 32, 0);
}

const GridOp grid_op_maxpool = {
    .name = "maxpool",
    .run = maxpool_case,
    .extras = maxpool_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_BOTH_LAYOUTS,
    .cpu_layouts = GRID_NCHW,
    .skipped = "cpu nhwc (the CPU path is NCHW)",
};
