/* run.eval_tta on the CPU: a short SimpleNet run evaluated with test-time
 * augmentation counts exactly the test images that a plain C evaluation of
 * its final weights counts with airbench's views averaged before the argmax:
 * flip, the mean of the image's and its mirror's logits; flip_translate, 0.5 x
 * that plus 0.25 x the same for the image translated one pixel up-left and one
 * down-right with reflect padding (tools/torch_airbench.py's tta_logits). The
 * test split (40 images, batches of 16) ends in a partial batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/transform.h"
#include "models/zoo.h"
#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/settings.h"
#include "tools/trainer/train.h"

enum { BATCH = 16, SIDE = 32, PLANE = SIDE * SIDE, IMAGE = 3 * PLANE, CLASSES = 10, TEST = 40 };

static Config *small_run(const char *tta) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    const char *sets[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=32",
                          "data.synthetic_train=256", "data.synthetic_test=40", "run.epochs=1",
                          "run.log_every=1000", "run.warmup_steps=0", "optim.lr=0.05", "data.flip=on"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) test_config_set(c, "%s", sets[i]);
    test_config_set(c, "train.batch=%d", BATCH);
    test_config_set(c, "run.seed=%llu", (unsigned long long)(test_seed() % 1000003));
    test_config_set(c, "run.eval_tta=%s", tta);
    return c;
}

/* ---- the plain C evaluation ------------------------------------------------------- */

/* One view of a normalised CHW image: translated by (dy, dx) with reflect
 * padding, then mirrored when flip is set. */
static void view(const float *image, int dy, int dx, int flip, float *out) {
    for (int ch = 0; ch < 3; ch++)
        for (int y = 0; y < SIDE; y++)
            for (int x = 0; x < SIDE; x++) {
                int gx = flip ? SIDE - 1 - x : x;
                int sy = transform_pad_index(y + dy, SIDE, 1), sx = transform_pad_index(gx + dx, SIDE, 1);
                out[ch * PLANE + y * SIDE + x] = image[ch * PLANE + sy * SIDE + sx];
            }
}

/* Logits [BATCH][CLASSES] of one view of images first .. first + BATCH - 1 (zeros past the end). */
static void forward_view(Model *m, const float *images, int first, int dy, int dx, int flip, float *logits) {
    float *input = model_input_buffer(m);
    memset(input, 0, (size_t)BATCH * IMAGE * sizeof(float));
    for (int i = 0; i < BATCH && first + i < TEST; i++)
        view(images + (size_t)(first + i) * IMAGE, dy, dx, flip, input + (size_t)i * IMAGE);
    model_forward(m);
    memcpy(logits, model_logits(m), (size_t)BATCH * CLASSES * sizeof(float));
}

/* 0.5 (f(v) + f(mirror v)) */
static void mirrored(Model *m, const float *images, int first, int d, float *out) {
    float a[BATCH * CLASSES], b[BATCH * CLASSES];
    forward_view(m, images, first, d, d, 0, a);
    forward_view(m, images, first, d, d, 1, b);
    for (int i = 0; i < BATCH * CLASSES; i++) out[i] = 0.5f * (a[i] + b[i]);
}

/* Test images whose averaged views have their largest logit (the first on ties) at the label. */
static int count_correct(Model *m, const Dataset *test, const float *images, int level) {
    int correct = 0;
    for (int first = 0; first < TEST; first += BATCH) {
        float logits[BATCH * CLASSES], up_left[BATCH * CLASSES], down_right[BATCH * CLASSES];
        if (level == 0) forward_view(m, images, first, 0, 0, 0, logits);
        else mirrored(m, images, first, 0, logits);
        if (level == 2) {
            mirrored(m, images, first, -1, up_left);
            mirrored(m, images, first, 1, down_right);
            for (int i = 0; i < BATCH * CLASSES; i++)
                logits[i] = 0.5f * logits[i] + 0.25f * up_left[i] + 0.25f * down_right[i];
        }
        for (int i = 0; i < BATCH && first + i < TEST; i++) {
            const float *row = logits + i * CLASSES;
            int best = 0;
            for (int k = 1; k < CLASSES; k++)
                if (row[k] > row[best]) best = k;
            correct += best == test->labels[first + i];
        }
    }
    return correct;
}

static void check_level(const char *tta, int level) {
    Config *c = small_run(tta);
    TrainSummary s;
    float *params = NULL;
    train_run_keep_params(c, &s, &params);

    TrainSettings set_read;
    settings_fill(c, &set_read);
    Source train_source, test_source;
    train_open_sources(&set_read, &train_source, &test_source);
    const Dataset test = test_source.decoded;
    CHECK(test.n == TEST && test.h == SIDE && test.w == SIDE);
    TransformSpec spec;
    transform_spec_default(&spec, SIDE, SIDE);
    float *images = malloc((size_t)TEST * IMAGE * sizeof(float));
    for (int i = 0; i < TEST; i++) transform_sample(&spec, dataset_image(&test, i), 3, SIDE, SIDE, 0, images + (size_t)i * IMAGE);

    Model m;
    char err[256];
    CHECK_MSG(model_build(&m, "simplenet", BATCH, SIDE, CLASSES, 0, err, sizeof err) == 0, "%s", err);
    model_finalize(&m, NULL, 0);
    model_set_params(&m, params);
    model_set_training(&m, 0);
    int correct = count_correct(&m, &test, images, level);
    int counted = (int)lround(s.test_acc * TEST);
    printf("run.eval_tta = %s: trainc counts %d of %d, the plain C evaluation %d (no views: %d)\n", tta, counted,
           TEST, correct, count_correct(&m, &test, images, 0));
    CHECK_MSG(counted == correct, "run.eval_tta = %s: trainc counts %d, the plain evaluation %d", tta, counted,
              correct);
    model_destroy(&m);
    source_free(&train_source);
    source_free(&test_source);
    free(images);
    free(params);
    config_free(c);
}

int main(void) {
    check_level("off", 0);
    check_level("flip", 1);
    check_level("flip_translate", 2);
    return test_finish("test_eval_tta");
}
