/* trainc predict (CPU; the GPU part where there is one): a tiny synthetic
 * ResNet-18 trained to a checkpoint classifies PNGs of the training size and
 * of another size. Each image gets K classes by the checkpoint's names with
 * probabilities in (0, 1], descending, summing to 1 over all classes; the
 * top-1 is the argmax of the model's own evaluation forward on the input the
 * test loader would make of the same pixels; the same image twice gives the
 * same line. Bad input is refused with a message naming it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <stb_image_write.h>

#include "data/dataset.h"
#include "data/transform.h"
#include "harness.h"
#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "runtime/gpu.h"
#include "tools/trainer/export.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

#define CLASSES 10
#define SIZE 16
#define N_IMAGES 3

static void set(Config *c, const char *line) {
    char err[512];
    CHECK_MSG(config_set(c, line, err, sizeof err) == 0, "%s", err);
}

/* 2 steps of ResNet-18 (batch norm) on synthetic 16x16 images, one checkpoint. */
static void train_checkpoint(const char *dir) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    const char *fixed[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=16", "data.synthetic_train=64",
                           "data.synthetic_test=16", "train.batch=16", "run.epochs=1", "run.max_steps=2",
                           "run.checkpoint_every=2", "run.log_every=1000", "model.name=resnet18",
                           "model.num_classes=10"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) set(c, fixed[i]);
    char line[1200];
    snprintf(line, sizeof line, "run.checkpoint_dir=%s", dir);
    set(c, line);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
}

/* A w x h RGB image of random pixels as CHW (malloc'ed), written as a PNG. */
static uint8_t *write_png(const char *path, int w, int h, uint64_t *rng) {
    size_t plane = (size_t)w * h;
    uint8_t *hwc = malloc(3 * plane), *chw = malloc(3 * plane);
    for (size_t p = 0; p < plane; p++)
        for (int c = 0; c < 3; c++) hwc[3 * p + c] = chw[c * plane + p] = (uint8_t)test_uniform(rng, 0, 255.99f);
    CHECK(stbi_write_png(path, w, h, 3, hwc, w * 3));
    free(hwc);
    return chw;
}

/* The checkpoint's model at batch 1 on the CPU, its weights and statistics
 * set straight from the sections (no tensor names), in evaluation mode: the
 * argmax of the logits of the pixels prepared as the test loader prepares them. */
static int model_argmax(const CheckpointWeights *w, const uint8_t *chw, int width, int height) {
    char err[512];
    Model *m = model_of_meta(w->meta, w->net_text, 1, 0, "ckpt", err, sizeof err);
    CHECK_MSG(m != NULL, "%s", err);
    if (!m) return -1;
    model_finalize(m, NULL, 1);
    model_set_params(m, w->params);
    model_set_bn_stats(m, w->bn_stats);
    model_set_training(m, 0);
    TransformSpec loader_spec; /* data.image_size's, as train_loader_config makes it, without augmentation */
    transform_spec_default(&loader_spec, SIZE, SIZE);
    transform_sample(&loader_spec, chw, 3, height, width, 0, model_input_buffer(m));
    model_forward(m);
    const float *logits = model_logits(m);
    int best = 0;
    for (int j = 1; j < m->num_classes; j++)
        if (logits[j] > logits[best]) best = j;
    model_destroy(m);
    free(m);
    return best;
}

/* One line of --json: K entries, probabilities in (0, 1] descending, names the
 * meta's; the top-1's index, and the sum of the probabilities. */
static int check_line(const char *line, const char *image, int k, const cJSON *names, double *sum) {
    cJSON *o = cJSON_Parse(line);
    CHECK_MSG(o != NULL, "not JSON: %s", line);
    if (!o) return -1;
    const char *path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "image"));
    CHECK_MSG(path && strcmp(path, image) == 0, "%s: image %s", line, path ? path : "missing");
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(o, "top");
    CHECK_MSG(cJSON_GetArraySize(top) == k, "%s: %d entries, want %d", line, cJSON_GetArraySize(top), k);
    double last = 2;
    int first = -1;
    *sum = 0;
    for (int i = 0; i < cJSON_GetArraySize(top); i++) {
        const cJSON *e = cJSON_GetArrayItem(top, i);
        const cJSON *index = cJSON_GetObjectItemCaseSensitive(e, "index"), *p = cJSON_GetObjectItemCaseSensitive(e, "p");
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "class"));
        CHECK(cJSON_IsNumber(index) && cJSON_IsNumber(p) && name);
        if (!cJSON_IsNumber(index) || !cJSON_IsNumber(p) || !name) break;
        int j = index->valueint;
        CHECK_MSG(j >= 0 && j < CLASSES && strcmp(name, cJSON_GetStringValue(cJSON_GetArrayItem(names, j))) == 0,
                  "%s: entry %d: class %s index %d", line, i, name, j);
        CHECK_MSG(p->valuedouble > 0 && p->valuedouble <= 1 && p->valuedouble <= last, "%s: entry %d: p %g after %g",
                  line, i, p->valuedouble, last);
        last = p->valuedouble;
        *sum += p->valuedouble;
        if (i == 0) first = j;
    }
    cJSON_Delete(o);
    return first;
}

/* Each class's probability in a line's top list (classes not listed keep -1). */
static void class_probabilities(const char *line, double p[CLASSES]) {
    for (int j = 0; j < CLASSES; j++) p[j] = -1;
    cJSON *o = cJSON_Parse(line);
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(o, "top");
    for (int i = 0; i < cJSON_GetArraySize(top); i++) {
        const cJSON *e = cJSON_GetArrayItem(top, i);
        const cJSON *index = cJSON_GetObjectItemCaseSensitive(e, "index");
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(e, "p");
        if (cJSON_IsNumber(index) && cJSON_IsNumber(pr) && index->valueint >= 0 && index->valueint < CLASSES)
            p[index->valueint] = pr->valuedouble;
    }
    cJSON_Delete(o);
}

/* The output's lines (at most max), split in place. */
static int split_lines(char *out, char **lines, int max) {
    int n = 0;
    for (char *s = strtok(out, "\n"); s && n < max; s = strtok(NULL, "\n"))
        if (s[0] == '{') lines[n++] = s;
    return n;
}

static char out[1 << 16];

static int trainc(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/trainc %s", test_build_dir(), args);
    return test_run_command(cmd, out, sizeof out);
}

static void expect_message(const char *args, const char *needle) {
    int rc = trainc(args);
    CHECK_MSG(rc > 0 && rc < 128, "trainc %s exited %d", args, rc);
    CHECK_MSG(strstr(out, needle) != NULL, "trainc %s: no '%s' in:\n%s", args, needle, out);
}

/* predict --json over the images on a device: every check, and the top-1s. */
static void check_predictions(const char *ckpt, char paths[][1100], const CheckpointWeights *w, const char *device,
                              int *top1) {
    char args[8192];
    int used = snprintf(args, sizeof args, "predict --json --device %s --top %d --checkpoint %s", device, CLASSES,
                        ckpt);
    for (int i = 0; i < N_IMAGES; i++) used += snprintf(args + used, sizeof args - used, " %s", paths[i]);
    int rc = trainc(args);
    CHECK_MSG(rc == 0, "trainc %s exited %d:\n%s", args, rc, out);
    char *lines[N_IMAGES + 1];
    char copy[sizeof out];
    memcpy(copy, out, sizeof out);
    int n = split_lines(copy, lines, N_IMAGES + 1);
    CHECK_MSG(n == N_IMAGES, "%d JSON lines:\n%s", n, out);
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(w->meta, "class_names");
    for (int i = 0; i < n && i < N_IMAGES; i++) {
        double sum = 0;
        top1[i] = check_line(lines[i], paths[i], CLASSES, names, &sum);
        CHECK_NEAR(sum, 1.0, 1e-4);
    }
    /* images 0 and 2 hold the same pixels: the same classes, each with the same probability up to the
     * last digits (the BLAS may sum a batch's rows in other orders: 7.5e-9 apart seen) */
    if (n == N_IMAGES) {
        double p0[CLASSES], p2[CLASSES];
        class_probabilities(lines[0], p0), class_probabilities(lines[2], p2);
        for (int j = 0; j < CLASSES; j++)
            CHECK_MSG(p0[j] >= 0 && fabs(p0[j] - p2[j]) <= 1e-6, "class %d: p %.9g for image 0, %.9g for image 2", j,
                      p0[j], p2[j]);
    }
}

static void test_predict(void) {
    char dir[1000], ckpt[1200], paths[N_IMAGES][1100];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("predict"));
    char ckdir[1100];
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    train_checkpoint(ckdir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-00000002.trc", ckdir);
    CheckpointWeights w;
    char err[4400];
    CHECK_MSG(checkpoint_weights_read(ckpt, &w, err, sizeof err) == 0, "%s", err);

    /* the training size, another size, the first again */
    uint64_t rng = test_seed();
    const int widths[N_IMAGES] = {SIZE, 24, SIZE}, heights[N_IMAGES] = {SIZE, 20, SIZE};
    uint8_t *pixels[N_IMAGES];
    for (int i = 0; i < N_IMAGES; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/image%d.png", dir, i);
        if (i < 2) pixels[i] = write_png(paths[i], widths[i], heights[i], &rng);
    }
    pixels[2] = pixels[0];
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "cp %s %s", paths[0], paths[2]);
    CHECK(test_run_command(cmd, out, sizeof out) == 0);

    int top1[N_IMAGES] = {-1, -1, -1};
    check_predictions(ckpt, paths, &w, "cpu", top1);
    for (int i = 0; i < 2; i++) {
        int want = model_argmax(&w, pixels[i], widths[i], heights[i]);
        CHECK_MSG(top1[i] == want, "%s: predict's top-1 %d, the model's argmax %d", paths[i], top1[i], want);
    }
    if (test_have_gpu() && TRAINC_CUDA) {
        int gpu_top1[N_IMAGES] = {-1, -1, -1};
        check_predictions(ckpt, paths, &w, "cuda", gpu_top1);
        for (int i = 0; i < N_IMAGES; i++) CHECK_MSG(gpu_top1[i] == top1[i], "image %d: top-1 %d on the GPU, %d on the CPU", i, gpu_top1[i], top1[i]);
    } else {
        printf("note: the GPU part skipped: no GPU\n");
    }

    /* The default --top is 5; the text output names each image. */
    char args[8192];
    snprintf(args, sizeof args, "predict --device cpu --checkpoint %s %s", ckpt, paths[1]);
    CHECK_MSG(trainc(args) == 0 && strstr(out, paths[1]) && strstr(out, " 5. ") && !strstr(out, " 6. "), "%s", out);

    /* Bad input. */
    char old[1100], bad_image[1100];
    snprintf(old, sizeof old, "%s/old.trc", dir);
    float params[4] = {0};
    CkptWriter *cw = ckpt_write_begin(old, 1, err, sizeof err);
    CHECK(cw && ckpt_write_section(cw, "params", params, sizeof params, err, sizeof err) == 0 &&
          ckpt_write_commit(cw, err, sizeof err) == 0);
    snprintf(bad_image, sizeof bad_image, "%s", test_write_file(dir, "bad.png", "not an image", 12));
    const char *garbage = test_write_file(dir, "garbage.trc", "0123456789abcdef", 16);
    snprintf(args, sizeof args, "predict --device cpu --checkpoint %s %s", old, paths[0]);
    expect_message(args, "predates named tensors");
    snprintf(args, sizeof args, "predict --device cpu --checkpoint %s/none.trc %s", dir, paths[0]);
    expect_message(args, "none.trc");
    snprintf(args, sizeof args, "predict --device cpu --checkpoint %s %s", garbage, paths[0]);
    expect_message(args, "garbage.trc");
    snprintf(args, sizeof args, "predict --device cpu --checkpoint %s %s %s", ckpt, paths[0], bad_image);
    expect_message(args, "bad.png: cannot decode: not a JPEG, PNG or BMP");
    snprintf(args, sizeof args, "predict --device cpu --checkpoint %s %s/missing.png", ckpt, dir);
    expect_message(args, "missing.png: No such file");
    snprintf(args, sizeof args, "predict --device cpu --checkpoint %s", ckpt);
    expect_message(args, "no images given");
    snprintf(args, sizeof args, "predict --checkpoint %s --top 11 %s", ckpt, paths[0]);
    expect_message(args, "--top 11: must be a whole number from 1 to the model's 10 classes");
    snprintf(args, sizeof args, "predict --checkpoint %s --top 0 %s", ckpt, paths[0]);
    expect_message(args, "--top 0");
    snprintf(args, sizeof args, "predict --checkpoint %s --device tpu %s", ckpt, paths[0]);
    expect_message(args, "--device tpu: cpu or cuda");
    snprintf(args, sizeof args, "predict %s", paths[0]);
    expect_message(args, "--checkpoint FILE is required");
    if (!TRAINC_CUDA) {
        snprintf(args, sizeof args, "predict --device cuda --checkpoint %s %s", ckpt, paths[0]);
        expect_message(args, "built without CUDA");
    }

    free(pixels[0]);
    free(pixels[1]);
    checkpoint_weights_free(&w);
}

int main(void) {
    test_predict();
    return test_finish("test_predict");
}
