/* Space-to-depth (ops/space_to_depth.h): forward against the CPU reference
 * bit for bit (a move; every element of y written, zeros included), backward
 * adding into a dx that held values (its padding channels untouched), and
 * the forward from a float32 NCHW image, rounded once. On the
 * CPU: by hand, finite differences of the backward, and the point of the op:
 * a convolution run on space_to_depth_conv's forms, its filter gradient
 * folded back by the backward, gives the direct convolution's output and
 * filter gradient (7x7 stride 2 over 3 of 8 channels, as ResNet's stem, with
 * block 2 and block 1, and an even kernel with an odd pad). */
#include <stdlib.h>

#include "ops/space_to_depth.h"
#include "tests/ops/grid.h"

static size_t in_count(const SpaceToDepthShape *s) { return (size_t)s->n * s->h * s->w * s->c; }

static void print_shape(const char *what, const SpaceToDepthShape *s) {
    printf(" %s %dx%dx%dx%d (c_used %d) block %d pad %d group %d to %dx%d\n", what, s->n, s->h, s->w, s->c, s->c_used,
           s->block, s->pad, s->group, s->out_h, s->out_w);
}

static void s2d_shape(const GridCase *c, const SpaceToDepthShape *s) {
    print_shape("", s);
    DType dt = c->dtype;
    size_t nx = in_count(s), ny = space_to_depth_out_count(s);
    float *x = grid_random(c, dt, nx, -4, 4), *dy = grid_random(c, dt, ny, -1, 1);
    float *dx0 = grid_accumulator_start(c, dt, x, nx);
    float *want_y = host_floats(ny), *want_dx = copy_floats(dx0, nx);
    space_to_depth_forward_cpu(s, x, want_y);
    space_to_depth_backward_cpu(s, dy, want_dx);
    round_to(dt, want_dx, nx); /* one sum of two values of the dtype, rounded once */
    void *d_x = grid_put(c, dt, x, nx), *d_y = grid_alloc(c, dt, ny);
    void *d_dy = grid_put(c, dt, dy, ny), *d_dx = grid_put(c, dt, dx0, nx);
    space_to_depth_forward(&c->ctx, s, d_x, d_y);
    space_to_depth_backward(&c->ctx, s, d_dy, d_dx);
    float *y = grid_get(c, dt, d_y, ny), *dx = grid_get(c, dt, d_dx, nx);
    grid_check(c, "space_to_depth y", y, want_y, ny, grid_bound(c, GRID_EXACT));
    grid_check(c, "space_to_depth dx (added)", dx, want_dx, nx, grid_bound(c, GRID_EXACT));
    void *dev[] = {d_x, d_y, d_dy, d_dx};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, dy, dx0, want_y, want_dx, y, dx};
    host_free_all(host, GRID_COUNT(host));
}

/* From a float32 NCHW image of c_used channels: each value rounded once to
 * the dtype; on the CPU, the forward of the same image in NHWC. */
static void s2d_from_nchw(const GridCase *c, const SpaceToDepthShape *s) {
    DType dt = c->dtype;
    size_t nx = (size_t)s->n * s->c_used * s->h * s->w, ny = space_to_depth_out_count(s);
    float *x = grid_random(c, DTYPE_F32, nx, -4, 4), *want = host_floats(ny);
    space_to_depth_from_f32_nchw_cpu(s, x, want);
    if (c->device == DEVICE_CPU) {
        float *x_nhwc = to_nhwc(x, s->n, s->c_used, s->h, s->w, s->c), *from_nhwc = host_floats(ny);
        space_to_depth_forward_cpu(s, x_nhwc, from_nhwc);
        grid_check_same(c, "space_to_depth from NCHW, as from NHWC", want, from_nhwc, ny * sizeof(float));
        void *host[] = {x_nhwc, from_nhwc};
        host_free_all(host, GRID_COUNT(host));
    }
    round_to(dt, want, ny);
    void *d_x = grid_put(c, DTYPE_F32, x, nx), *d_y = grid_alloc(c, dt, ny);
    space_to_depth_from_f32_nchw(&c->ctx, s, d_x, d_y);
    float *y = grid_get(c, dt, d_y, ny);
    grid_check(c, "space_to_depth y from f32 NCHW", y, want, ny, grid_bound(c, GRID_EXACT));
    void *dev[] = {d_x, d_y};
    grid_free_all(c, dev, GRID_COUNT(dev));
    void *host[] = {x, want, y};
    host_free_all(host, GRID_COUNT(host));
}

typedef struct {
    const SpaceToDepthShape *s;
    const float *x, *r;
    float *y;
} S2dLoss;

static double s2d_loss(void *p) {
    S2dLoss *l = p;
    space_to_depth_forward_cpu(l->s, l->x, l->y);
    return weighted_sum(l->y, l->r, space_to_depth_out_count(l->s));
}

static void s2d_finite_differences(const GridCase *c, const SpaceToDepthShape *s) {
    size_t nx = in_count(s), ny = space_to_depth_out_count(s);
    float *x = grid_random(c, DTYPE_F32, nx, -2, 2), *r = grid_random(c, DTYPE_F32, ny, -1, 1);
    float *y = host_floats(ny), *dx = host_floats(nx);
    double *num = malloc(sizeof(double) * nx);
    S2dLoss loss = {s, x, r, y};
    numeric_gradient(x, nx, 1e-2f, s2d_loss, &loss, num);
    space_to_depth_backward(&c->ctx, s, r, dx);
    check_gradient("space_to_depth dx (finite differences)", dx, num, nx);
    void *host[] = {x, r, y, dx, num};
    host_free_all(host, GRID_COUNT(host));
}

static const SpaceToDepthShape S2D_SHAPES[] = {
    {2, 20, 20, 8, 3, 2, 4, 4, 13, 13}, /* a 7x7 stride-2 stem's image at 20 pixels */
    {16, 7, 7, 8, 3, 2, 1, 4, 4, 4},    /* and its filters */
    {3, 9, 9, 8, 3, 1, 0, 3, 9, 9},     /* block 1: the 3 channels that carry data */
    {2, 7, 5, 4, 4, 3, 1, 5, 3, 2},     /* block 3, output short of the source's last rows */
};

static void s2d_case(const GridCase *c) {
    for (size_t i = 0; i < GRID_COUNT(S2D_SHAPES); i++) s2d_shape(c, &S2D_SHAPES[i]);
    s2d_from_nchw(c, &S2D_SHAPES[0]);
    s2d_from_nchw(c, &S2D_SHAPES[2]);
    if (c->device != DEVICE_CPU) return;
    s2d_finite_differences(c, &S2D_SHAPES[1]);
    s2d_finite_differences(c, &S2D_SHAPES[3]);
}

/* conv (NHWC x over c_used of its channels, w [k][r][s][c]) directly and on block's forms: y and dw the same. */
static void s2d_conv_matches(const Conv2dShape *conv, int c_used, int block, uint64_t *rng) {
    SpaceToDepthShape image, filter;
    Conv2dShape inner;
    const char *why;
    int taken = space_to_depth_conv(conv, c_used, block, &image, &filter, &inner, &why);
    CHECK_MSG(taken, "space_to_depth_conv refused block %d: %s", block, why);
    if (!taken) return;
    printf(" conv %dx%dx%dx%d k%d %dx%d pad %d stride %d, block %d: inner %dx%dx%dx%d %dx%d pad %d stride %d\n",
           conv->n, conv->c, conv->h, conv->w, conv->k, conv->r, conv->s, conv->pad, conv->stride, block, inner.n,
           inner.c, inner.h, inner.w, inner.r, inner.s, inner.pad, inner.stride);
    int oh = conv2d_out_h(conv), ow = conv2d_out_w(conv);
    size_t nx = (size_t)conv->n * conv->h * conv->w * conv->c, nw = (size_t)conv->k * conv->r * conv->s * conv->c;
    size_t ny = (size_t)conv->n * conv->k * oh * ow;
    float *x = host_floats(nx), *w = host_floats(nw), *dy = host_floats(ny);
    for (size_t i = 0; i < nx; i++) x[i] = (int)(i % conv->c) < c_used ? test_uniform(rng, -1, 1) : 0.0f;
    for (size_t i = 0; i < nw; i++) w[i] = (int)(i % conv->c) < c_used ? test_uniform(rng, -1, 1) : 0.0f;
    test_fill_uniform(dy, ny, rng, -1, 1);
    /* Directly, in NCHW. */
    float *x_nchw = to_nchw(x, conv->n, conv->c, conv->h, conv->w);
    float *w_nchw = to_nchw(w, conv->k, conv->c, conv->r, conv->s);
    float *want_y = host_floats(ny), *want_dw = host_floats(nw);
    conv2d_forward_cpu(conv, x_nchw, w_nchw, NULL, want_y);
    conv2d_backward_cpu(conv, x_nchw, w_nchw, dy, NULL, want_dw, NULL);
    /* On the forms: the inner convolution in NCHW, its filter gradient folded back into [k][r][s][c]. */
    size_t nxs = space_to_depth_out_count(&image), nws = space_to_depth_out_count(&filter);
    float *xs = host_floats(nxs), *ws = host_floats(nws);
    space_to_depth_forward_cpu(&image, x, xs);
    space_to_depth_forward_cpu(&filter, w, ws);
    float *xs_nchw = to_nchw(xs, inner.n, inner.c, inner.h, inner.w);
    float *ws_nchw = to_nchw(ws, inner.k, inner.c, inner.r, inner.s);
    float *y = host_floats(ny), *dws_nchw = host_floats(nws), *dw = host_floats(nw);
    conv2d_forward_cpu(&inner, xs_nchw, ws_nchw, NULL, y);
    conv2d_backward_cpu(&inner, xs_nchw, ws_nchw, dy, NULL, dws_nchw, NULL);
    float *dws = to_nhwc(dws_nchw, inner.k, inner.c, inner.r, inner.s, inner.c);
    space_to_depth_backward_cpu(&filter, dws, dw);
    float *want_dw_nhwc = to_nhwc(want_dw, conv->k, conv->c, conv->r, conv->s, conv->c);
    /* The same products summed in another order, in float. */
    double err_y = test_rel_error(y, want_y, ny), err_dw = test_rel_error(dw, want_dw_nhwc, nw);
    CHECK_MSG(err_y < 3e-5, "space_to_depth conv y: %.3g from the direct convolution's", err_y);
    CHECK_MSG(err_dw < 3e-5, "space_to_depth conv dw: %.3g from the direct convolution's", err_dw);
    printf("  y %.3g and dw %.3g from the direct convolution's\n", err_y, err_dw);
    void *host[] = {x, w, dy, x_nchw, w_nchw, want_y, want_dw, xs, ws, xs_nchw, ws_nchw, y, dws_nchw, dw, dws,
                    want_dw_nhwc};
    host_free_all(host, GRID_COUNT(host));
}

static void s2d_by_hand(uint64_t *rng) {
    /* One 1-channel 3x3 image, block 2, pad 1, group 2: four 2x2 squares of two channels each. */
    SpaceToDepthShape s = {1, 3, 3, 1, 1, 2, 1, 2, 2, 2};
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y[32], dx[9] = {0};
    space_to_depth_forward_cpu(&s, x, y);
    /* Square (0,0) holds pad, pad / pad, x[0][0]: its pixels (a,b) = (0,0) (0,1) (1,0) (1,1). */
    check_values("space_to_depth y, square (0,0)", y, (double[]){0, 0, 0, 0, 0, 0, 1, 0}, 8, 0);
    check_values("space_to_depth y, square (1,1)", y + 24, (double[]){5, 0, 6, 0, 8, 0, 9, 0}, 8, 0);
    space_to_depth_backward_cpu(&s, y, dx);
    check_values("space_to_depth backward of its own forward", dx, (double[]){1, 2, 3, 4, 5, 6, 7, 8, 9}, 9, 0);
    const char *why;
    SpaceToDepthShape image, filter;
    Conv2dShape stem = {2, 8, 15, 14, 16, 7, 7, 3, 2, 1}, even = {2, 8, 12, 12, 8, 4, 4, 1, 2, 1}, inner;
    CHECK(space_to_depth_conv(&stem, 3, 2, &image, &filter, &inner, &why));
    CHECK(inner.c == 16 && inner.r == 4 && inner.s == 4 && inner.pad == 0 && inner.stride == 1);
    CHECK(image.pad == 4 && filter.pad == 1 && image.out_h == conv2d_out_h(&stem) + 3);
    Conv2dShape stride1 = stem;
    stride1.stride = 1;
    CHECK(!space_to_depth_conv(&stride1, 3, 2, &image, &filter, &inner, &why));
    s2d_conv_matches(&stem, 3, 2, rng);
    s2d_conv_matches(&stem, 3, 1, rng);
    s2d_conv_matches(&even, 5, 2, rng);
}

const GridOp grid_op_space_to_depth = {
    .name = "space_to_depth",
    .run = s2d_case,
    .extras = s2d_by_hand,
    .cuda_types = GRID_ALL_TYPES,
    .cuda_layouts = GRID_NHWC,
    .cpu_layouts = GRID_NHWC,
    .skipped = "nchw (the op is defined on channels-last tensors)",
};
