/* model.fuse, GPU, channels-last: a convolution over the input image may run
 * on copies of the image and its filters in another form
 * (ops/space_to_depth.h), where cuDNN has faster kernels than for the image's
 * 3 channels padded to 8:
 *   block 2, a stride-2 convolution as a stride-1 one over 2x2 squares of
 *   pixels (ResNet-50's 7x7 stem as 4x4 over 16 channels);
 *   block 1, the same convolution over the 3 channels that carry data.
 * Each form's convolution is timed at start-up under perf.conv_benchmark
 * (conv2d_init), with the copy of the image, against the convolution over the
 * image itself, forward and filter gradient (the image takes none); the
 * fastest runs, and the log says which. The filters stay the model's: each
 * forward copies them into the form, and backward folds the form's filter
 * gradient back (space_to_depth_backward), so checkpoints, exports and the
 * optimizer see the same parameters either way. */
#include "models/layers.h"

#include <stdlib.h>

#include "ops/backend_graph.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

static int takes_input_form(const Model *m, const Layer *l) {
    return m->fuse && m->device == DEVICE_CUDA && m->nhwc && l->kind == LAYER_CONV && l->in == 0 && !l->fused &&
           !l->whitening && l->pool_layer < 0 && conv2d_groups(&l->conv.shape) == 1; /* the forms regroup channels */
}

/* The copy of the image into the form that the step will run: from the
 * float32 batch where the convolution alone reads the image (input_form_plan
 * leaves the image unstored then), else from the image. */
static int copies_from_batch(const Model *m) { return m->acts[0].consumers == 1; }

#if TRAINC_CUDA
typedef struct {
    const Model *m;
    const SpaceToDepthShape *image;
    const void *x;
    void *y;
} ImageCopy;

static void run_image_copy(void *arg) {
    const ImageCopy *c = arg;
    if (copies_from_batch(c->m)) space_to_depth_from_f32_nchw(&c->m->ops, c->image, c->x, c->y);
    else space_to_depth_forward(&c->m->ops, c->image, c->x, c->y);
}

/* Microseconds per copy of the image into the form, on buffers of its own. */
static float image_copy_us(const Model *m, const SpaceToDepthShape *image) {
    size_t pixels = (size_t)image->n * image->h * image->w;
    size_t in_bytes = copies_from_batch(m) ? pixels * image->c_used * sizeof(float)
                                           : pixels * image->c * dtype_size(m->act_dtype);
    size_t out_bytes = space_to_depth_out_count(image) * dtype_size(m->act_dtype);
    const char *error;
    void *x = gpu_try_malloc(in_bytes, &error), *y = x ? gpu_try_malloc(out_bytes, &error) : NULL;
    if (!y) TC_FATAL("timing the input convolution's forms: %s (%.1f MiB)", error, (in_bytes + out_bytes) / 1048576.0);
    op_fill_random(&m->ops, x, in_bytes);
    ImageCopy copy = {m, image, x, y};
    float us = 1000.0f * backend_graph_time_ms(m->ops.cudnn, run_image_copy, &copy, BACKEND_GRAPH_TIMING_RUNS);
    conv_policy_agree(&m->conv_policy, &us, 1);
    gpu_free(x);
    gpu_free(y);
    return us;
}
#else
static float image_copy_us(const Model *m, const SpaceToDepthShape *image) {
    (void)m, (void)image;
    gpu_unavailable(__func__);
}
#endif

/* Forward and filter gradient, as conv2d_init timed them (0: not timed). */
static float conv_us(const Model *m, const Conv2d *c) {
    float fwd = conv2d_timed_us(&m->ops, c, CONV2D_FORWARD), filter = conv2d_timed_us(&m->ops, c, CONV2D_FILTER);
    return fwd > 0 && filter > 0 ? fwd + filter : 0;
}

/* Form block of layer l, initialized and timed with its copy; NULL where it does not fit. */
static ConvInputForm *form_new(Model *m, const Layer *l, int block, float *us) {
    ConvInputForm *f = calloc(1, sizeof *f);
    if (!f) TC_FATAL("out of host memory planning %s's input forms", l->name);
    Conv2dShape inner;
    const char *why;
    if (!space_to_depth_conv(&l->conv.shape, m->acts[l->in].c_real, block, &f->image, &f->filter, &inner, &why)) {
        free(f);
        return NULL;
    }
    conv2d_init(&m->ops, &f->conv, &inner, &m->conv_policy);
    char chosen[400];
    conv2d_describe(&m->ops, &f->conv, chosen, sizeof chosen);
    log_info("%s on block %d's form, %dx%dx%dx%d k%d %dx%d: %s", l->name, block, inner.n, inner.c, inner.h, inner.w,
             inner.k, inner.r, inner.s, chosen);
    float conv = conv_us(m, &f->conv);
    *us = conv > 0 ? conv + image_copy_us(m, &f->image) : 0;
    return f;
}

static void form_free(const Model *m, ConvInputForm *f) {
    if (!f) return;
    conv2d_destroy(&m->ops, &f->conv);
    free(f);
}

static void grow_workspace(Model *m, const ConvInputForm *f) {
    size_t bytes = conv2d_workspace_bytes(&m->ops, &f->conv);
    if (bytes > m->workspace_bytes) m->workspace_bytes = bytes;
}

static void plan_layer(Model *m, Layer *l, int index) {
    float direct = conv_us(m, &l->conv), us[3] = {0, 0, 0};
    if (m->input_form_block) { /* tests: that form, untimed */
        l->input_form = form_new(m, l, m->input_form_block, &us[0]);
        log_info("layer %d %s: block %d form %s (Model.input_form_block)", index, l->name, m->input_form_block,
                 l->input_form ? "taken" : "does not fit");
        if (l->input_form) grow_workspace(m, l->input_form);
        return;
    }
    if (!m->conv_policy.benchmark || direct <= 0) {
        log_info("layer %d %s: over the image itself (its other forms are chosen by timing: perf.conv_benchmark off)",
                 index, l->name);
        return;
    }
    ConvInputForm *best = NULL;
    float best_us = direct;
    for (int block = 1; block <= 2; block++) {
        ConvInputForm *f = form_new(m, l, block, &us[block]);
        if (f && us[block] > 0 && us[block] < best_us) {
            form_free(m, best);
            best = f, best_us = us[block];
        } else {
            form_free(m, f);
        }
    }
    l->input_form = best;
    log_info("layer %d %s: %s; forward + filter gradient %.1f us over the image, %.1f us over the channels that "
             "carry data, %.1f us over 2x2 squares (0: does not fit)",
             index, l->name,
             !best ? "over the image itself" : best->image.block == 2 ? "over 2x2 squares of the image (space to depth)"
                                                                     : "over the image's channels that carry data",
             direct, us[1], us[2]);
    if (best) grow_workspace(m, best);
}

/* Where the convolution alone reads the image, the batch goes into the form
 * straight from the loader's float32 (input_form_copy): the image itself is
 * never stored. */
void input_form_plan(Model *m) {
    for (int i = 0; i < m->n_layers; i++) {
        Layer *l = &m->layers[i];
        if (!takes_input_form(m, l)) continue;
        plan_layer(m, l, i);
        if (l->input_form && copies_from_batch(m)) m->acts[0].unstored = 1;
    }
}

void input_form_carve(Model *m, Arena *a) {
    size_t esize = dtype_size(m->act_dtype);
    for (int i = 0; i < m->n_layers; i++) {
        ConvInputForm *f = m->layers[i].input_form;
        if (!f) continue;
        f->x = arena_alloc(a, space_to_depth_out_count(&f->image) * esize, "input convolution's image form");
        f->w = arena_alloc(a, space_to_depth_out_count(&f->filter) * esize, "input convolution's filter form");
        f->dw = arena_alloc(a, space_to_depth_out_count(&f->filter) * esize,
                            "input convolution's filter form gradient");
    }
}

void input_form_copy(Model *m, const Layer *l, const void *x, const void *w) {
    const ConvInputForm *f = l->input_form;
    if (x) space_to_depth_forward(&m->ops, &f->image, x, f->x);
    else space_to_depth_from_f32_nchw(&m->ops, &f->image, m->input_f32, f->x); /* the image unstored */
    space_to_depth_forward(&m->ops, &f->filter, w, f->w);
}

void input_form_backward(Model *m, const Layer *l, const void *dy, void *dw, void *db) {
    const ConvInputForm *f = l->input_form;
    conv2d_backward(&m->ops, &f->conv, f->x, f->w, dy, NULL, f->dw, db, 0); /* f->dw overwritten */
    space_to_depth_backward(&m->ops, &f->filter, f->dw, dw);
}

void input_form_destroy(Model *m) {
    for (int i = 0; i < m->n_layers; i++) {
        form_free(m, m->layers[i].input_form);
        m->layers[i].input_form = NULL;
    }
}
