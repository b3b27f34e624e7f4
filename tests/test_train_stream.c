/* Training on a folder of images of several sizes, on the CPU: streamed with
 * the ImageNet recipe (data.cache = auto chooses it), the head's classes from
 * the data (3 here) and a mismatch refused, the checkpoint's meta naming the
 * folders and the evaluation's resize, an exact resume in the middle of a
 * streamed epoch (the same parameters' CRC as the run never stopped), a
 * held-out share evaluated where there is no test split, and the messages of
 * the settings the data refuses: a pad crop on images of several sizes, a
 * test split missing, data.mean that is not three numbers, data.decode = gpu
 * on the CPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>
#include <stb_image_write.h>

#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/trainer/export.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

static uint64_t rng;
static char root[600], no_test[700];

static const char *base_sets[] = {"run.device=cpu", "model.name=simplenet", "data.image_size=32",
                                  "data.crop=random_resized", "data.crop_scale_min=0.3", "data.workers=2",
                                  "data.flip=on", "train.batch=8", "run.log_every=1000", "run.warmup_steps=0",
                                  "optim.lr=0.02", "run.epochs=2"};

static Config *config_of(const char *path, const char *sets) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    for (size_t i = 0; i < sizeof base_sets / sizeof *base_sets; i++) test_config_set(c, "%s", base_sets[i]);
    test_config_set(c, "data.path=%s", path);
    test_config_set(c, "run.seed=%llu", (unsigned long long)(test_seed() % 1000));
    char copy[2048];
    snprintf(copy, sizeof copy, "%s", sets);
    for (char *save = NULL, *set = strtok_r(copy, " ", &save); set; set = strtok_r(NULL, " ", &save))
        test_config_set(c, "%s", set);
    return c;
}

/* root/<split>/{cat,dog,owl}/ of PNGs of random sizes, each class its own colour. */
static void write_split(const char *dir, const char *split, int per_class) {
    static const char *classes[] = {"cat", "dog", "owl"};
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, split);
    mkdir(path, 0755);
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s/%s", dir, split, classes[k]);
        mkdir(path, 0755);
        for (int i = 0; i < per_class; i++) {
            int w = 20 + (int)test_uniform(&rng, 0, 40), h = 20 + (int)test_uniform(&rng, 0, 40);
            uint8_t *px = malloc((size_t)w * h * 3);
            for (int p = 0; p < w * h; p++)
                for (int c = 0; c < 3; c++)
                    px[p * 3 + c] = (uint8_t)(c == k ? 200 : 40 + (int)test_uniform(&rng, 0, 30));
            char file[1300];
            snprintf(file, sizeof file, "%s/%02d.png", path, i);
            CHECK(stbi_write_png(file, w, h, 3, px, w * 3));
            free(px);
        }
    }
}

static TrainSummary run(const char *path, const char *sets) {
    Config *c = config_of(path, sets);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
    return s;
}

/* ---- what the data decides ----------------------------------------------------- */

static void check_classes_from_data(void) {
    char sets[1200];
    const char *dir = test_tmpdir("stream-ckpt");
    snprintf(sets, sizeof sets, "run.checkpoint_every=6 run.checkpoint_dir=%s", dir);
    TrainSummary s = run(root, sets);
    CHECK_MSG(strcmp(s.data_decode, "cpu") == 0, "data_decode %s", s.data_decode);
    CHECK(s.test_acc >= 0 && s.steps == 2 * (36 / 8));
    CheckpointWeights w;
    char err[4400];
    CHECK_MSG(checkpoint_weights_read(s.checkpoint, &w, err, sizeof err) == 0, "%s", err);
    if (!w.meta) return;
    CHECK(w.model->num_classes == 3);
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(w.meta, "class_names");
    CHECK(cJSON_GetArraySize(names) == 3 && strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(names, 2)), "owl") == 0);
    const cJSON *resize = cJSON_GetObjectItemCaseSensitive(w.meta, "eval_resize");
    CHECK(cJSON_IsNumber(resize) && resize->valueint == 37); /* 32 / 0.875 */
    const cJSON *mean = cJSON_GetObjectItemCaseSensitive(w.meta, "mean");
    CHECK_NEAR(cJSON_GetArrayItem(mean, 0)->valuedouble, 0.485, 1e-6); /* not CIFAR-10's classes: ImageNet's */
    checkpoint_weights_free(&w);
}

/* Stopped after step 4 of 9 (an epoch is 4 steps of 36 images), resumed: the same run. */
static void check_resume(void) {
    char sets[1500];
    const char *dir = test_tmpdir("stream-resume");
    TrainSummary whole = run(root, "run.eval=off run.epochs=2.25");
    snprintf(sets, sizeof sets, "run.eval=off run.epochs=2.25 run.max_steps=6 run.checkpoint_every=6 "
             "run.checkpoint_dir=%s", dir);
    TrainSummary first = run(root, sets);
    CHECK(first.steps == 6);
    snprintf(sets, sizeof sets, "run.eval=off run.epochs=2.25 run.resume=latest run.checkpoint_dir=%s", dir);
    TrainSummary resumed = run(root, sets);
    CHECK_MSG(resumed.steps == whole.steps && resumed.params_crc == whole.params_crc,
              "resumed at step 6 of a streamed run: %ld steps, crc %u; uninterrupted %ld, crc %u", resumed.steps,
              resumed.params_crc, whole.steps, whole.params_crc);
}

static void check_val_split(void) {
    TrainSummary s = run(no_test, "data.val_split=0.25");
    CHECK(s.test_acc >= 0 && s.steps == 2 * (27 / 8));
}

/* ---- refused ----------------------------------------------------------------------- */

static const char *child_sets;
static const char *child_path;
static void child_run(void *arg) {
    (void)arg;
    run(child_path, child_sets);
}

static void expect_error(const char *path, const char *sets, const char *want, const char *want2) {
    int status;
    child_path = path;
    child_sets = sets;
    char *out = test_child_stderr("stream-errors", child_run, NULL, &status);
    CHECK_MSG(status == 1 && strstr(out, want) && (!want2 || strstr(out, want2)), "%s: exit %d: %s", sets, status,
              out);
    free(out);
}

static void check_errors(void) {
    expect_error(root, "model.num_classes=5", "model.num_classes", "holds 3 classes");
    expect_error(root, "data.crop=pad", "must have one size", "data.crop = random_resized");
    expect_error(no_test, "", "test", "data.val_split");
    expect_error(root, "data.mean=0.5,0.4", "data.mean", "three numbers");
    expect_error(root, "data.std=0.2,0,0.2", "data.std", "> 0");
    expect_error(root, "data.decode=gpu", "data.decode", "run.device = cuda");
    expect_error(root, "data.crop_pad=4", "data.crop_pad", "data.crop = pad");
}

int main(void) {
    rng = test_seed();
    snprintf(root, sizeof root, "%s", test_tmpdir("stream-data"));
    write_split(root, "train", 12);
    write_split(root, "test", 4);
    snprintf(no_test, sizeof no_test, "%s/no-test", root);
    mkdir(no_test, 0755);
    write_split(no_test, "train", 12);
    check_classes_from_data();
    check_resume();
    check_val_split();
    check_errors();
    return test_finish("test_train_stream");
}
