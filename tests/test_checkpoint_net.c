/* The net travels with its weights (CPU): a net file trains on an image folder of 3 classes at 24x24 with
 * a normalisation of its own, then the net file and the config are deleted. From the checkpoint alone:
 *   - trainc eval --checkpoint F --data DIR gives the run's own test accuracy (same net, input size,
 *     classes and normalisation, all from the checkpoint), and so does --set data.path=DIR;
 *   - a config or --set that contradicts the checkpoint (data.image_size, model.num_classes, data.mean,
 *     model.name) is refused naming the key, where it was set and both values; a safe one (train.batch)
 *     is taken;
 *   - eval's refusals name --checkpoint, never run.resume;
 *   - trainc predict and trainc export work from it;
 *   - trainc bench-infer takes --checkpoint without --config, checks a config against it, and (here,
 *     without a GPU) stops at run.device; on a GPU it times the checkpoint's net; --help texts, --data;
 *   - an older checkpoint (no net section: rewritten without it) still evaluates, by meta's model name;
 *   - resuming with a net that differs in one layer's width names that tensor and both shapes. */
#include <cJSON.h>
#include <math.h>
#include <stb_image_write.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "runtime/checkpoint.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

enum { CLASSES = 3, SIZE = 24, TRAIN_PER_CLASS = 8, TEST_PER_CLASS = 3, BATCH = 4 };

static char output[1 << 16];
static const char *const class_names[CLASSES] = {"ant", "bee", "cow"};

static const char *const tiny_net = "[net]\nc1 = conv 8 3 pad=1\nrelu\nmaxpool 2\nflatten\nfc = linear {classes}\n";

/* root/split/<class>/<i>.png: SIZE x SIZE, each class a colour of its own with noise. */
static void write_split(const char *root, const char *split, int per_class, uint64_t *rng) {
    unsigned char hwc[SIZE * SIZE * 3];
    for (int c = 0; c < CLASSES; c++) {
        char dir[1200], path[1300];
        snprintf(dir, sizeof dir, "%s/%s", root, split);
        mkdir(dir, 0755);
        snprintf(dir, sizeof dir, "%s/%s/%s", root, split, class_names[c]);
        mkdir(dir, 0755);
        for (int i = 0; i < per_class; i++) {
            for (int p = 0; p < SIZE * SIZE * 3; p++)
                hwc[p] = (unsigned char)((p % 3 == c ? 110 : 90) + test_uniform(rng, 0, 120));
            snprintf(path, sizeof path, "%s/%d.png", dir, i);
            CHECK(stbi_write_png(path, SIZE, SIZE, 3, hwc, SIZE * 3));
        }
    }
}

static const char *image_folder(void) {
    const char *root = test_tmpdir("ckptnet-data");
    uint64_t rng = test_seed() + 7;
    write_split(root, "train", TRAIN_PER_CLASS, &rng);
    write_split(root, "test", TEST_PER_CLASS, &rng);
    return root;
}

/* A run of net (model.net = tiny.net beside the config, or model.name = net) from a config file; both
 * files deleted after it. Returns the checkpoint's path (static per call site: copy it). */
static const char *train(const char *tag, const char *data, const char *net_text, const char *model_name,
                         double *test_acc) {
    static char checkpoint[4200];
    const char *dir = test_tmpdir(tag);
    char ini[6000], net_path[1200], ini_path[1200];
    if (net_text)
        snprintf(net_path, sizeof net_path, "%s", test_write_file(dir, "tiny.net", net_text, strlen(net_text)));
    snprintf(ini, sizeof ini,
             "[run]\ndevice = cpu\nepochs = 3\ncheckpoint_every = %d\nlog_every = 1000\ncheckpoint_dir = %s/ck\n"
             "seed = %llu\n[data]\nsource = image_folder\npath = %s\nimage_size = %d\nmean = 0.5,0.4,0.3\n"
             "std = 0.2,0.25,0.3\n[train]\nbatch = %d\n[model]\n%s%s\n",
             3 * CLASSES * TRAIN_PER_CLASS / BATCH, dir, (unsigned long long)(test_seed() % 1000), data, SIZE, BATCH,
             net_text ? "net = tiny.net" : "name = ", net_text ? "" : model_name);
    snprintf(ini_path, sizeof ini_path, "%s", test_write_file(dir, "train.ini", ini, strlen(ini)));
    Config *c = config_new(trainc_keys, trainc_n_keys);
    char err[2048];
    CHECK_MSG(config_load_file(c, ini_path, err, sizeof err) == 0, "%s", err);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
    CHECK_MSG(s.checkpoint[0] && s.test_acc >= 0, "%s: no checkpoint (%s), test_acc %g", tag, s.checkpoint,
              s.test_acc);
    *test_acc = s.test_acc;
    snprintf(checkpoint, sizeof checkpoint, "%s", s.checkpoint);
    CHECK(unlink(ini_path) == 0);
    if (net_text) CHECK(unlink(net_path) == 0);
    return checkpoint;
}

static double json_number(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* trainc SUBCOMMAND ARGS; its exit status, the output in output. */
static int trainc(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/trainc' %s", test_build_dir(), args);
    return test_run_command(cmd, output, sizeof output);
}

/* trainc eval ARGS must give the run's test accuracy over every test image, with 3 classes; returns its loss. */
static double check_eval(const char *what, const char *args, double test_acc) {
    double loss = -1;
    int rc = trainc(args);
    CHECK_MSG(rc == 0, "%s: trainc %s: exit status %d:\n%s", what, args, rc, output);
    cJSON *o = test_last_json(output);
    CHECK_MSG(o && json_number(o, "n") == CLASSES * TEST_PER_CLASS && json_number(o, "classes") == CLASSES &&
                  fabs(json_number(o, "top1") - test_acc) < 1e-6,
              "%s: want %d images, %d classes, top-1 %g:\n%s", what, CLASSES * TEST_PER_CLASS, CLASSES, test_acc,
              output);
    CHECK_MSG(strstr(output, "ant") && strstr(output, "cow"), "%s: no class names:\n%s", what, output);
    if (o) printf("%s: top-1 %g, the run's %g, loss %.9g\n", what, json_number(o, "top1"), test_acc,
                  loss = json_number(o, "loss"));
    cJSON_Delete(o);
    return loss;
}

/* trainc ARGS must fail with a message holding each of want (NULL-ended) and none of refused (or NULL). */
static void check_refused(const char *what, const char *args, const char *const *want, const char *refused) {
    int rc = trainc(args);
    CHECK_MSG(rc != 0, "%s: trainc %s: exit status 0:\n%s", what, args, output);
    for (; *want; want++) CHECK_MSG(strstr(output, *want), "%s: no '%s' in:\n%s", what, *want, output);
    CHECK_MSG(!refused || !strstr(output, refused), "%s: '%s' in:\n%s", what, refused, output);
    printf("%s: exit status %d: %s", what, rc, output);
}

static void check_eval_alone(const char *ckpt, const char *data, double test_acc) {
    char args[8192], cfg[1200];
    snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s' --device cpu --quiet", ckpt, data);
    double alone = check_eval("eval --checkpoint --data", args, test_acc);
    snprintf(args, sizeof args, "eval --checkpoint '%s' --set 'data.path=%s' --set run.device=cpu --set train.batch=5 "
             "--quiet", ckpt, data);
    check_eval("eval --checkpoint --set data.path, train.batch 5", args, test_acc);
    /* a config beside it that sets all it fixes as the training config did (the same loss: the checkpoint
     * alone gave the input its size and normalisation), and one that contradicts it in a file's lines */
    const char *agree = "[data]\nimage_size = 24\nmean = 0.5, 0.4, 0.3\nstd = 0.2,0.25,0.3\n[model]\n"
                        "num_classes = 3\nnet = tiny.net\n";
    snprintf(cfg, sizeof cfg, "%s", test_write_file(test_tmpdir("ckptnet-cfg"), "agree.ini", agree, strlen(agree)));
    snprintf(args, sizeof args, "eval --checkpoint '%s' --config '%s' --data '%s' --device cpu --quiet", ckpt, cfg,
             data);
    double agreed = check_eval("eval with a config that agrees", args, test_acc);
    CHECK_MSG(alone > 0 && fabs(alone - agreed) <= 1e-6 * agreed, "eval's loss %.9g from the checkpoint alone, %.9g "
              "with the training config's input preparation", alone, agreed);
    const char *contra = "[data]\nimage_size = 32\nmean = 0.1,0.2,0.3\n";
    snprintf(cfg, sizeof cfg, "%s", test_write_file(test_tmpdir("ckptnet-cfg"), "contra.ini", contra, strlen(contra)));
    snprintf(args, sizeof args, "eval --checkpoint '%s' --config '%s' --data '%s' --device cpu", ckpt, cfg, data);
    check_refused("eval with a contradicting config", args,
                  (const char *[]){"contra.ini:2: data.image_size = 32", "data.image_size = 24",
                                   "contra.ini:3: data.mean = 0.1,0.2,0.3", "data.mean = 0.5,0.4,0.3", ckpt, NULL},
                  "run.resume");
    snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s' --device cpu --set model.num_classes=5", ckpt,
             data);
    check_refused("eval --set model.num_classes=5", args,
                  (const char *[]){"--set: model.num_classes = 5", "model.num_classes = 3", NULL}, "run.resume");
    snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s' --device cpu --set model.name=resnet18", ckpt,
             data);
    check_refused("eval --set model.name=resnet18", args,
                  (const char *[]){"model.name = resnet18", "holds tiny", NULL}, "run.resume");
}

static void check_refusals_name_checkpoint(const char *ckpt, const char *data) {
    const char *dir = test_tmpdir("ckptnet-bad");
    char *whole = test_read_file(ckpt), args[8192], path[1200];
    CHECK(whole != NULL);
    if (!whole) return;
    snprintf(path, sizeof path, "%s", test_write_file(dir, "cut.trc", whole, 600));
    free(whole);
    snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s' --device cpu", path, data);
    check_refused("eval of a truncated checkpoint", args, (const char *[]){"--checkpoint", "cut.trc", NULL},
                  "run.resume");
    snprintf(args, sizeof args, "eval --checkpoint '%s/none.trc' --data '%s' --device cpu", dir, data);
    check_refused("eval of a missing checkpoint", args, (const char *[]){"--checkpoint", "none.trc", NULL},
                  "run.resume");
    snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s/nowhere' --device cpu", ckpt, dir);
    check_refused("eval with a missing data path", args, (const char *[]){"data.path", "nowhere", NULL},
                  "run.resume");
}

static void check_predict_export(const char *ckpt) {
    const char *dir = test_tmpdir("ckptnet-out");
    unsigned char hwc[40 * 30 * 3];
    for (size_t p = 0; p < sizeof hwc; p++) hwc[p] = (unsigned char)(p % 3 == 2 ? 200 : 50);
    char png[1200], args[8192], out[1200];
    snprintf(png, sizeof png, "%s/cow.png", dir);
    CHECK(stbi_write_png(png, 40, 30, 3, hwc, 40 * 3));
    snprintf(args, sizeof args, "predict --checkpoint '%s' --device cpu --json '%s'", ckpt, png);
    int rc = trainc(args);
    cJSON *o = test_last_json(output);
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(o, "top");
    CHECK_MSG(rc == 0 && cJSON_GetArraySize(top) == CLASSES, "predict: exit status %d:\n%s", rc, output);
    const char *first = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(top, 0), "class"));
    CHECK_MSG(first && (!strcmp(first, "ant") || !strcmp(first, "bee") || !strcmp(first, "cow")), "predict: %s",
              output);
    cJSON_Delete(o);
    snprintf(out, sizeof out, "%s/tiny.safetensors", dir);
    snprintf(args, sizeof args, "export --checkpoint '%s' --format safetensors --out '%s'", ckpt, out);
    rc = trainc(args);
    char *st = test_read_file(out);
    CHECK_MSG(rc == 0 && st && strstr(st + 8, "\"c1.weight\"") && strstr(st + 8, "\"fc.bias\""), "export: %d:\n%s", rc,
              output);
    free(st);
}

static void check_bench_infer(const char *ckpt) {
    char args[8192];
    snprintf(args, sizeof args, "bench-infer --checkpoint '%s' --batch 1,2", ckpt);
    int rc = trainc(args);
    if (test_have_gpu()) {
        CHECK_MSG(rc == 0 && strstr(output, "infer impl=trainc model=tiny image=24 batch=2"),
                  "bench-infer on the GPU: exit status %d:\n%s", rc, output);
    } else {
        CHECK_MSG(rc == 1 && strstr(output, "run.device") && !strstr(output, "--config"),
                  "bench-infer without a GPU: exit status %d (want 1 at run.device):\n%s", rc, output);
        printf("bench-infer --checkpoint without --config: exit status %d: %s", rc, output);
    }
    snprintf(args, sizeof args, "bench-infer --checkpoint '%s' --set data.image_size=32", ckpt);
    check_refused("bench-infer with a contradicting --set", args,
                  (const char *[]){"--set: data.image_size = 32", "data.image_size = 24", NULL}, NULL);
    snprintf(args, sizeof args, "bench-infer --checkpoint '%s/none.trc'", test_tmpdir("ckptnet-bad"));
    check_refused("bench-infer of a missing checkpoint", args, (const char *[]){"--checkpoint", "none.trc", NULL},
                  NULL);
    check_refused("bench-infer with neither", "bench-infer --batch 1",
                  (const char *[]){"--checkpoint FILE or --config FILE", NULL}, NULL);
}

/* The subcommands' --help says what they need; --data is eval's alone. */
static void check_command_line(void) {
    int rc = trainc("eval --help");
    CHECK_MSG(rc == 0 && strstr(output, "trainc eval --checkpoint FILE [--data PATH] [--config FILE]"),
              "eval --help: %d:\n%s", rc, output);
    rc = trainc("bench-infer --help");
    CHECK_MSG(rc == 0 && strstr(output, "trainc bench-infer --checkpoint FILE | --config FILE"),
              "bench-infer --help: %d:\n%s", rc, output);
    check_refused("--data outside eval", "--config configs/cpu.ini --data x",
                  (const char *[]){"--data belongs to trainc eval", NULL}, NULL);
}

/* The checkpoint rewritten without its net section, as trainc wrote them before it kept one. */
static const char *without_net(const char *ckpt) {
    static char path[1200];
    char err[4400];
    snprintf(path, sizeof path, "%s/old.trc", test_tmpdir("ckptnet-old"));
    CkptFile *f = ckpt_open(ckpt, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return NULL;
    int n = ckpt_section_count(f), kept = 0;
    CHECK(ckpt_section_size(f, "net") > 0);
    CkptWriter *w = ckpt_write_begin(path, n - 1, err, sizeof err);
    CHECK_MSG(w != NULL, "%s", err);
    for (int i = 0; w && i < n; i++) {
        const char *name = ckpt_section_name(f, i);
        if (strcmp(name, "net") == 0) continue;
        size_t size = (size_t)ckpt_section_size(f, name);
        void *bytes = malloc(size ? size : 1);
        CHECK(ckpt_read_section(f, name, bytes, size, err, sizeof err) == 0);
        CHECK_MSG(ckpt_write_section(w, name, bytes, size, err, sizeof err) == 0, "%s", err);
        free(bytes);
        kept++;
    }
    CHECK_MSG(w && kept == n - 1 && ckpt_write_commit(w, err, sizeof err) == 0, "%s", err);
    ckpt_close(f);
    return path;
}

/* Resuming with a net one layer wider names that layer's tensor and both shapes. */
static void check_resume_difference(const char *ckpt, const char *data) {
    const char *dir = test_tmpdir("ckptnet-resume");
    const char *wider = "[net]\nc1 = conv 16 3 pad=1\nrelu\nmaxpool 2\nflatten\nfc = linear {classes}\n";
    test_write_file(dir, "tiny.net", wider, strlen(wider));
    char ini[4000], args[8192];
    snprintf(ini, sizeof ini, "[run]\ndevice = cpu\nepochs = 2\ncheckpoint_every = 0\n[data]\nsource = image_folder\n"
             "path = %s\nimage_size = %d\nmean = 0.5,0.4,0.3\nstd = 0.2,0.25,0.3\n[train]\nbatch = %d\n[model]\n"
             "net = tiny.net\n", data, SIZE, BATCH);
    const char *ini_path = test_write_file(dir, "resume.ini", ini, strlen(ini));
    snprintf(args, sizeof args, "--config '%s' --resume '%s' --set run.save_final=off", ini_path, ckpt);
    check_refused("resume with a wider conv", args,
                  (const char *[]){"holds another model", "tensor 0 is c1.weight [8,3,3,3] in it",
                                   "c1.weight [16,3,3,3] in this run's net", NULL},
                  NULL);
}

int main(void) {
    const char *data = image_folder();
    double acc, old_acc;
    char ckpt[4200], shipped[4200];
    snprintf(ckpt, sizeof ckpt, "%s", train("ckptnet-tiny", data, tiny_net, NULL, &acc));
    check_eval_alone(ckpt, data, acc);
    check_refusals_name_checkpoint(ckpt, data);
    check_predict_export(ckpt);
    check_bench_infer(ckpt);
    check_command_line();
    check_resume_difference(ckpt, data);

    snprintf(shipped, sizeof shipped, "%s", train("ckptnet-simplenet", data, NULL, "simplenet", &old_acc));
    const char *old = without_net(shipped);
    if (old) {
        char args[8192];
        snprintf(args, sizeof args, "eval --checkpoint '%s' --data '%s' --device cpu --quiet", old, data);
        check_eval("eval of a checkpoint without a net section (simplenet by name)", args, old_acc);
        snprintf(args, sizeof args, "predict --checkpoint '%s' --device cpu '%s/test/ant/0.png'", old, data);
        CHECK_MSG(trainc(args) == 0, "predict of a checkpoint without a net section:\n%s", output);
    }
    return test_finish("test_checkpoint_net");
}
