/* Test-time augmentation of the evaluation (run.eval_tta), as airbench's: each
 * test batch's stored images go to the device once, and each view of them (the
 * image, its mirror, and with flip_translate both translated by one pixel
 * up-left and down-right, reflect-padded) is made by the transform kernel,
 * run forward, and its logits added in fp32. The weights are airbench's times
 * 8 (a power of two, so the sum rounds as its weighted mean would):
 *   flip:            f(x) + f(mirror x)
 *   flip_translate:  2 (f(x) + f(mirror x)) + (f(ul) + f(mirror ul)) + (f(dr) + f(mirror dr))
 * summed in that order, as tools/torch_airbench.py's tta_logits. */
#include "ops/add.h"
#include "ops/cast.h"
#include "tools/trainer/trainer.h"

/* View v's crop offset and flip: pairs of (view, mirror), the image first. */
static TransformParams view_params(int v) {
    static const int offsets[3] = {0, -1, 1}; /* the image; up-left; down-right */
    TransformParams p;
    memset(&p, 0, sizeof p);
    p.crop_dy = p.crop_dx = offsets[v / 2];
    p.flip = v % 2;
    return p;
}

static int view_count(const Trainer *t) { return t->set.run.eval_tta == 2 ? TTA_MAX_VIEWS : 2; }

void tta_prepare(Trainer *t) {
    if (!t->buf.tta_views) return;
    int batch = t->set.train.batch;
    TransformParams *host = malloc(TTA_MAX_VIEWS * gpu_transform_params_bytes(batch));
    if (!host) TC_FATAL("out of host memory: test-time views");
    for (int v = 0; v < TTA_MAX_VIEWS; v++)
        for (int i = 0; i < batch; i++) host[(size_t)v * batch + i] = view_params(v);
    op_copy_from_host(&t->model.ops, t->buf.tta_views, host, TTA_MAX_VIEWS * gpu_transform_params_bytes(batch));
    op_sync(&t->model.ops);
    free(host);
}

/* The batch's stored images and its labels (padded with -1) onto the device;
 * the loader's slot is free again after the sync. */
static void upload_views_source(Trainer *t, Loader *l, const Batch *b) {
    const OpContext *ctx = &t->model.ops;
    const Dataset *d = &t->data.test.decoded;
    op_copy_from_host(ctx, t->buf.tta_images, b->raw_images, gpu_transform_raw_bytes(b->n, d->c, d->h, d->w));
    upload_labels_padded(t, b);
    op_sync(ctx);
    loader_release(l, b);
}

/* View v's logits, as fp32, into out. */
static void view_logits(Trainer *t, int n, int v, float *out) {
    Model *m = &t->model;
    GpuTransformArgs a = t->input.transform_args;
    a.raw_images = t->buf.tta_images;
    a.params = t->buf.tta_views + (size_t)v * t->set.train.batch;
    a.n = n;
    a.pad_reflect = 1;
    transform_into_input(t, &a, m->ops.stream);
    model_forward(m);
    cast_to_f32(&m->ops, model_logits(m), out, (size_t)t->set.train.batch * m->num_classes);
}

/* f(view) + f(its mirror) into pair. */
static void pair_logits(Trainer *t, const OpContext *f32, int n, int first_view, float *pair) {
    size_t count = (size_t)t->set.train.batch * t->model.num_classes;
    view_logits(t, n, first_view, pair);
    view_logits(t, n, first_view + 1, t->buf.tta_view);
    add_accumulate(f32, pair, t->buf.tta_view, count);
}

void tta_count(Trainer *t, Loader *l, const Batch *b) {
    Model *m = &t->model;
    OpContext f32 = m->ops;
    f32.dtype = DTYPE_F32;
    size_t count = (size_t)t->set.train.batch * m->num_classes;
    float *sum = t->buf.tta_sum, *pair = t->buf.tta_pair;
    int n = b->n;
    upload_views_source(t, l, b);
    pair_logits(t, &f32, n, 0, sum);
    if (view_count(t) == TTA_MAX_VIEWS) {
        add_forward(&f32, sum, sum, sum, count); /* x 2, exactly */
        for (int v = 2; v < TTA_MAX_VIEWS; v += 2) {
            pair_logits(t, &f32, n, v, pair);
            add_accumulate(&f32, sum, pair, count);
        }
    }
    accuracy_count(&f32, sum, t->buf.labels, t->set.train.batch, m->num_classes, t->buf.correct);
}
