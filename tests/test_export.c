/* Named tensors, trainc export and run.init_from (CPU): the names of SimpleNet
 * and ResNet-18 are PyTorch's keys; NHWC weights go to PyTorch's order and
 * back; a checkpoint exports to a safetensors file whose import gives the same
 * parameter checksum; bad inputs are refused by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "models/tensors.h"
#include "models/zoo.h"
#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "tools/trainer/export.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

/* PyTorch's keys (num_batches_tracked left out): tools/torch_common.py's SimpleNet ... */
static const char *const simplenet_keys[] = {
    "features.0.weight", "features.0.bias", "features.3.weight", "features.3.bias", "features.6.weight",
    "features.6.bias", "classifier.1.weight", "classifier.1.bias", "classifier.3.weight", "classifier.3.bias"};

/* ... and torchvision's resnet18().state_dict(), block by block. */
static int resnet18_keys(char keys[][64]) {
    int n = 0;
    const char *bn[] = {"weight", "bias", "running_mean", "running_var"};
    snprintf(keys[n++], 64, "conv1.weight");
    for (int k = 0; k < 4; k++) snprintf(keys[n++], 64, "bn1.%s", bn[k]);
    for (int layer = 1; layer <= 4; layer++)
        for (int b = 0; b < 2; b++) {
            for (int c = 1; c <= 2; c++) {
                snprintf(keys[n++], 64, "layer%d.%d.conv%d.weight", layer, b, c);
                for (int k = 0; k < 4; k++) snprintf(keys[n++], 64, "layer%d.%d.bn%d.%s", layer, b, c, bn[k]);
            }
            if (layer > 1 && b == 0) {
                snprintf(keys[n++], 64, "layer%d.0.downsample.0.weight", layer);
                for (int k = 0; k < 4; k++) snprintf(keys[n++], 64, "layer%d.0.downsample.1.%s", layer, bn[k]);
            }
        }
    snprintf(keys[n++], 64, "fc.weight");
    snprintf(keys[n++], 64, "fc.bias");
    return n;
}

static ModelTensor tensors[320];

static int names_of(const char *model, int image_size, int nhwc, Model *m) {
    char err[256];
    CHECK(model_build(m, model, 1, image_size, 10, nhwc, err, sizeof err) == 0);
    int n = model_tensors(m, tensors, 320, err, sizeof err);
    CHECK_MSG(n > 0 && n <= 320, "%s: %d tensors (%s)", model, n, err);
    return n;
}

static void test_names(Model *m) {
    int n = names_of("simplenet", 32, 0, m);
    CHECK(n == 10);
    for (int i = 0; i < n && i < 10; i++) CHECK_MSG(strcmp(tensors[i].name, simplenet_keys[i]) == 0, "%s", tensors[i].name);
    CHECK(tensors[0].ndim == 4 && tensors[0].shape[0] == 64 && tensors[0].shape[1] == 3 && tensors[0].shape[2] == 3);
    CHECK(tensors[6].ndim == 2 && tensors[6].shape[0] == 512 && tensors[6].shape[1] == 256 * 4 * 4);

    static char keys[128][64];
    int want = resnet18_keys(keys);
    for (int stem = 0; stem < 2; stem++) {
        n = names_of("resnet18", stem ? 224 : 32, 0, m);
        CHECK_MSG(n == want, "resnet18: %d tensors, torchvision %d", n, want);
        for (int i = 0; i < n && i < want; i++)
            CHECK_MSG(strcmp(tensors[i].name, keys[i]) == 0, "resnet18 tensor %d: %s, torchvision %s", i,
                      tensors[i].name, keys[i]);
        CHECK(tensors[0].shape[2] == (stem ? 7 : 3)); /* conv1: the stem's own kernel */
        CHECK(strcmp(tensors[n - 2].name, "fc.weight") == 0 && tensors[n - 2].shape[1] == 512);
    }
    n = names_of("resnet50", 32, 0, m);
    CHECK(strcmp(tensors[n - 3].name, "layer4.2.bn3.running_var") == 0);
}

/* NHWC (input padded to 8 channels, linear inputs in h, w, c order): get then
 * put gives the same buffer, and get of an NCHW twin filled in PyTorch's order
 * gives the same tensors. */
static void test_nhwc_layout(Model *nhwc, Model *nchw) {
    ModelTensor nchw_t[16];
    int n = names_of("simplenet", 16, 0, nchw);
    memcpy(nchw_t, tensors, sizeof nchw_t);
    CHECK(names_of("simplenet", 16, 1, nhwc) == n);
    CHECK(nhwc->n_params > nchw->n_params); /* the padded channels */
    float *a = calloc(nhwc->n_params, sizeof(float)), *b = calloc(nhwc->n_params, sizeof(float));
    float *flat = calloc(nchw->n_params, sizeof(float)), *t = malloc(nchw->n_params * sizeof(float));
    uint64_t rng = test_seed();
    test_fill_uniform(flat, nchw->n_params, &rng, -1, 1);
    for (int i = 0; i < n; i++) model_tensor_put(nhwc, &tensors[i], flat + nchw_t[i].offset, a, NULL);
    for (int i = 0; i < n; i++) {
        model_tensor_get(nhwc, &tensors[i], a, NULL, t);
        CHECK_MSG(memcmp(t, flat + nchw_t[i].offset, tensors[i].count * sizeof(float)) == 0, "%s", tensors[i].name);
        model_tensor_put(nhwc, &tensors[i], t, b, NULL);
    }
    CHECK(memcmp(a, b, nhwc->n_params * sizeof(float)) == 0);
    CHECK(a[tensors[0].offset + 3] == 0.0f); /* conv1 [k0][r0][s0][c3]: a padded channel */
    free(a);
    free(b);
    free(flat);
    free(t);
}

static void set(Config *c, const char *fmt, const char *value) {
    char line[1200], err[512];
    snprintf(line, sizeof line, fmt, value);
    if (config_set(c, line, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        CHECK(0);
    }
}

static Config *small_run(const char *model, const char *dir) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    const char *fixed[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=16", "data.synthetic_train=64",
                           "data.synthetic_test=16", "train.batch=16", "run.epochs=1", "run.max_steps=2",
                           "run.checkpoint_every=2", "run.log_every=1000"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) set(c, "%s", fixed[i]);
    set(c, "model.name=%s", model);
    set(c, "run.checkpoint_dir=%s", dir);
    return c;
}

typedef struct { uint32_t params_crc, stats_crc; } Seen;

static void seen_opened(void *user, Model *m) {
    Seen *s = user;
    float *p = malloc(m->n_params * sizeof(float)), *st = malloc((m->n_bn_stats + 1) * sizeof(float));
    model_get_params(m, p);
    model_get_bn_stats(m, st);
    s->params_crc = ckpt_crc32(0, p, m->n_params * sizeof(float));
    s->stats_crc = ckpt_crc32(0, st, m->n_bn_stats * sizeof(float));
    free(p);
    free(st);
}

static uint32_t stats_crc_of(const char *ckpt) {
    char err[512];
    CkptFile *f = ckpt_open(ckpt, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return 0;
    int64_t size = ckpt_section_size(f, "bn_stats");
    uint32_t crc = 0;
    if (size > 0) {
        char *buf = malloc((size_t)size);
        CHECK(ckpt_read_section(f, "bn_stats", buf, (size_t)size, err, sizeof err) == 0);
        crc = ckpt_crc32(0, buf, (size_t)size);
        free(buf);
    }
    ckpt_close(f);
    return crc;
}

static int export_to(const char *ckpt, const char *format, const char *out) {
    char *argv[] = {"export", "--checkpoint", (char *)ckpt, "--format", (char *)format, "--out", (char *)out, NULL};
    return export_main(7, argv);
}

/* Train 2 steps with a checkpoint, export it, start a run from the file: the
 * same parameters (and running statistics) as the checkpoint's. */
static void test_round_trip(const char *model) {
    char dir[1100], ckpt[1200], file[1200], err[4400], root[1000];
    snprintf(root, sizeof root, "%s", test_tmpdir(model)); /* fresh at each call */
    snprintf(dir, sizeof dir, "%s/ck", root);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-00000002.trc", dir);
    snprintf(file, sizeof file, "%s/%s.safetensors", root, model);
    Config *c = small_run(model, dir);
    set(c, "model.bn_eps=%s", "0.001"); /* kept in the checkpoint's meta: the inference path folds with it */
    TrainSummary first;
    train_run(c, &first);
    config_free(c);
    CHECK_MSG(export_to(ckpt, "safetensors", file) == 0, "export of %s", ckpt);
    CheckpointWeights w;
    CHECK_MSG(checkpoint_weights_read(ckpt, &w, err, sizeof err) == 0, "%s", err);
    if (w.model) CHECK_MSG(w.model->bn_eps == 0.001f, "%s: bn_eps %g from the meta", model, w.model->bn_eps);
    checkpoint_weights_free(&w);

    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "2");
    c = small_run(model, dir);
    set(c, "model.bn_eps=%s", "0.001");
    set(c, "run.init_from=%s", file);
    Seen seen = {0};
    TrainObserver obs = {.user = &seen, .opened = seen_opened};
    TrainSummary second;
    train_run_observed(c, &second, &obs);
    config_free(c);
    CHECK_MSG(seen.params_crc == first.params_crc, "%s: imported params crc %08x, exported %08x", model,
              seen.params_crc, first.params_crc);
    CHECK(seen.stats_crc == stats_crc_of(ckpt));

    /* Bad input: nothing is left at --out. */
    char out[1200];
    snprintf(out, sizeof out, "%s/bad.safetensors", root);
    CHECK(export_to(ckpt, "onnx", out) == 2 && access(out, F_OK) != 0);
    CHECK(export_to("/nonexistent/ckpt.trc", "safetensors", out) == 1 && access(out, F_OK) != 0);
    CHECK(export_to(file, "safetensors", out) == 1 && access(out, F_OK) != 0); /* not a checkpoint */
    CHECK(export_to(ckpt, "safetensors", "/nonexistent/dir/x.safetensors") == 1);

    /* Import refuses another model's file and a file that is not safetensors, naming them. */
    Model *m = calloc(1, sizeof *m);
    CHECK(model_build(m, strcmp(model, "simplenet") ? "simplenet" : "resnet18", 1, 16, 10, 0, err, sizeof err) == 0);
    model_finalize(m, NULL, 1);
    CHECK(import_safetensors(m, file, err, sizeof err) != 0 && strstr(err, file) && strstr(err, "tensor"));
    CHECK_MSG(import_safetensors(m, ckpt, err, sizeof err) != 0 && strstr(err, "not a safetensors file"), "%s", err);
    CHECK(import_safetensors(m, "/nonexistent.safetensors", err, sizeof err) != 0 && strstr(err, "cannot read"));
    model_destroy(m);
    free(m);
}

/* A file whose tensor has another shape: the message names it. */
static void test_wrong_shape(void) {
    const char *header = "{\"features.0.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    size_t hl = strlen(header);
    unsigned char buf[512] = {0};
    buf[0] = (unsigned char)hl;
    memcpy(buf + 8, header, hl);
    const char *path = test_write_file(test_tmpdir("shape"), "w.safetensors", buf, 8 + hl + 4);
    Model *m = calloc(1, sizeof *m);
    char err[4400];
    CHECK(model_build(m, "simplenet", 1, 16, 10, 0, err, sizeof err) == 0);
    model_finalize(m, NULL, 1);
    CHECK_MSG(import_safetensors(m, path, err, sizeof err) != 0 && strstr(err, "features.0.weight has shape [1]"),
              "%s", err);
    model_destroy(m);
    free(m);
}

/* Runs build/trainc with args; its exit status, and its output in out. */
static int trainc(const char *args, char *out, size_t n) {
    const char *build = getenv("TRAINC_BUILD_DIR");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/trainc %s 2>&1", build ? build : "build", args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void expect_message(const char *args, const char *needle) {
    static char out[1 << 16];
    int rc = trainc(args, out, sizeof out);
    CHECK_MSG(rc != 0 && rc < 128, "trainc %s exited %d", args, rc);
    CHECK_MSG(strstr(out, needle) != NULL, "trainc %s: no '%s' in:\n%s", args, needle, out);
}

/* The messages of the command line: a checkpoint written before the names
 * (no meta section), a missing one, an unknown format, an unwritable --out, a
 * run.init_from of another model. */
static void test_messages(void) {
    char dir[1000], old[1100], args[4096], err[512];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("messages"));
    snprintf(old, sizeof old, "%s/old.trc", dir);
    float params[4] = {0};
    CkptWriter *w = ckpt_write_begin(old, 1, err, sizeof err);
    CHECK(w && ckpt_write_section(w, "params", params, sizeof params, err, sizeof err) == 0 &&
          ckpt_write_commit(w, err, sizeof err) == 0);
    snprintf(args, sizeof args, "export --checkpoint %s --format safetensors --out %s/x.safetensors", old, dir);
    expect_message(args, "predates named tensors");
    snprintf(args, sizeof args, "export --checkpoint %s/none.trc --format safetensors --out %s/x.safetensors", dir, dir);
    expect_message(args, "none.trc");
    snprintf(args, sizeof args, "export --checkpoint %s --format onnx --out %s/x.safetensors", old, dir);
    expect_message(args, "--format onnx: unknown (known: safetensors)");
    snprintf(args, sizeof args, "export --checkpoint %s --format safetensors", old);
    expect_message(args, "--checkpoint, --format and --out are required");
    char x[1100];
    snprintf(x, sizeof x, "%s/x.safetensors", dir);
    CHECK(access(x, F_OK) != 0);

    /* A simplenet file into a resnet18 run; an unwritable --out. */
    char ck[1100], file[1100];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    Config *c = small_run("simplenet", ck);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
    snprintf(file, sizeof file, "%s/s.safetensors", dir);
    snprintf(args, sizeof args, "export --checkpoint %s/ckpt-00000002.trc --format safetensors --out %s", ck, file);
    static char out[1 << 16];
    CHECK_MSG(trainc(args, out, sizeof out) == 0, "%s", out);
    snprintf(args, sizeof args, "export --checkpoint %s/ckpt-00000002.trc --format safetensors --out %s/no/x", ck, dir);
    expect_message(args, "cannot write it");
    const char *ini = test_write_file(dir, "empty.ini", "", 0);
    snprintf(args, sizeof args, "--config %s --device cpu --set data.source=synthetic --set data.image_size=16 "
             "--set model.name=resnet18 --set run.max_steps=1 --set run.init_from=%s", ini, file);
    expect_message(args, "run.init_from:");
    expect_message(args, "is not one of the model's");
}

int main(void) {
    Model *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    test_names(a);
    test_nhwc_layout(a, b);
    free(a);
    free(b);
    test_round_trip("simplenet");
    test_round_trip("resnet18");
    test_wrong_shape();
    test_messages();
    return test_finish("test_export");
}
