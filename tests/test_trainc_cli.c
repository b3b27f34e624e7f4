/* The trainc program as a user meets it: bad configs and missing data end with
 * one message naming the file, line or key and a non-zero exit; a short run
 * ends with the summary JSON. Also the command line itself (--version,
 * --config=F, bad options), every number's range, every GPU-only key of a
 * GPU config named in one message on the CPU, and the resume hint. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tools/trainer/keys.h"

static char output[1 << 17];

static const char *trainc_path(void) {
    static char path[1024];
    const char *build = getenv("TRAINC_BUILD_DIR");
    snprintf(path, sizeof path, "%s/trainc", build ? build : "build");
    return path;
}

/* Runs program with args (a shell fragment); returns its exit status. */
static int run_program(const char *program, const char *args) {
    size_t len = strlen(program) + strlen(args) + 16;
    char *cmd = malloc(len);
    snprintf(cmd, len, "%s %s 2>&1", program, args);
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p) return -1;
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int trainc(const char *args) { return run_program(trainc_path(), args); }

static void expect_error(const char *args, const char *needle) {
    int rc = trainc(args);
    CHECK_MSG(rc != 0, "trainc %s exited 0", args);
    CHECK_MSG(strstr(output, needle) != NULL, "trainc %s: no '%s' in:\n%s", args, needle, output);
    CHECK_MSG(strstr(output, "Segmentation") == NULL && rc < 128, "trainc %s crashed", args);
}

static const char *write_ini(const char *dir, const char *name, const char *text) {
    static char paths[8][1024];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 1024, "%s", test_write_file(dir, name, text, strlen(text)));
    return p;
}

/* The 1-based number of the first line of path holding text, or 0. */
static int line_of(const char *path, const char *text) {
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0, found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        n++;
        found = strstr(line, text) != NULL;
    }
    if (f) fclose(f);
    return found ? n : 0;
}

/* Every number in trainc's schema has a range. */
static void check_every_number_has_a_range(void) {
    for (int k = 0; k < trainc_n_keys; k++) {
        CfgType t = trainc_keys[k].type;
        if (t == CFG_INT || t == CFG_FLOAT || t == CFG_FLOAT32)
            CHECK_MSG(trainc_keys[k].range != NULL, "%s has no range", trainc_keys[k].key);
    }
}

/* --version: trainc's version and commit, then the libraries, without a GPU too. */
static void check_version(void) {
    CHECK_MSG(trainc("--version") == 0, "%s", output);
    int major = -1, minor = -1, patch = -1;
    char commit[64] = "";
    CHECK_MSG(sscanf(output, "trainc %d.%d.%d (git commit %63[0-9a-z])", &major, &minor, &patch, commit) == 4,
              "first line: %s", output);
    CHECK_MSG(major >= 0 && minor >= 0 && patch >= 0 && commit[0], "%s", output);
    if (strstr(output, "not built with CUDA")) {
        CHECK(strstr(output, "cuDNN") == NULL);
    } else {
        const char *lines[] = {"\nCUDA runtime: ", "\nCUDA driver: ", "\ncuDNN: ", "\nNCCL: ", "(built with "};
        for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
            CHECK_MSG(strstr(output, lines[i]) != NULL, "--version lacks '%s':\n%s", lines[i], output);
        CHECK_MSG(strstr(output, "CUDA runtime: none") == NULL && strstr(output, "CUDA runtime: unknown") == NULL,
                  "the runtime always knows its version:\n%s", output);
        if (!test_have_gpu()) CHECK_MSG(strstr(output, "CUDA driver: ") != NULL, "%s", output);
    }
    CHECK(trainc("--help") == 0 && strstr(output, "usage: trainc") && strstr(output, "--version"));
}

/* getopt_long: --opt=value, options in any order, one message for a bad command line. */
static void check_command_line(const char *dir) {
    CHECK_MSG(trainc("--print-config --config=configs/baseline.ini --set=train.batch=48 --device=cpu") == 0, "%s",
              output);
    CHECK(strstr(output, "batch = 48  # --set") && strstr(output, "device = cpu  # --set"));
    expect_error("--config", "missing value after: --config");
    expect_error("--config configs/baseline.ini --config configs/baseline.ini", "--config given twice");
    expect_error("--config configs/baseline.ini extra", "unexpected argument: extra");
    expect_error("--config configs/baseline.ini bench-loader", "a subcommand comes first");
    expect_error("-x", "unknown option: -x");
    /* A mistyped subcommand is named, with the nearest where one is near, and the subcommands listed. */
    expect_error("trian --config configs/cpu.ini", "unknown subcommand 'trian'; the subcommands: bench-loader");
    expect_error("profil --config configs/cpu.ini", "unknown subcommand 'profil' (did you mean 'profile'?)");
    /* A subcommand's --help is its own. */
    static const char *const own_help[][2] = {{"eval", "usage: trainc eval --checkpoint"},
                                              {"profile", "usage: trainc profile --config"},
                                              {"bench-infer", "needs a GPU"},
                                              {"bench-loader", "needs a GPU"},
                                              {"summary", "usage: trainc summary"},
                                              {"keys", "usage: trainc keys"}};
    for (size_t i = 0; i < sizeof own_help / sizeof own_help[0]; i++) {
        char args[64];
        snprintf(args, sizeof args, "%s --help", own_help[i][0]);
        int rc = trainc(args);
        CHECK_MSG(rc == 0 && strstr(output, own_help[i][1]) && !strstr(output, "trainc pack --from"),
                  "trainc %s: exit %d, not its own usage ('%s'):\n%s", args, rc, own_help[i][1], output);
    }
    expect_error("keys extra", "trainc keys takes no argument: extra");
    CHECK(trainc("--bogus") == 2);
    CHECK(trainc("--print-config") == 0); /* the defaults alone */

    /* bench-infer: its options, and the GPU it measures */
    expect_error("--config configs/cpu.ini --batch 8", "--batch and --by-layer belong to trainc bench-infer");
    expect_error("--config configs/cpu.ini --csv x.csv", "--csv belongs to trainc eval");
    expect_error("bench-infer --config configs/cpu.ini --batch 1,0", "--batch 1,0: a comma-separated list");
    expect_error("bench-infer --config configs/cpu.ini", "bench-infer measures the GPU's inference path");

    /* pack: its options, and a folder that is not there */
    CHECK(trainc("pack --help") == 0 && strstr(output, "WebDataset"));
    expect_error("pack --to x", "trainc pack needs --from ROOT and --to DIR");
    expect_error("pack --from x --to y --shard-mb 0", "--shard-mb 0");
    expect_error("pack --from /nonexistent-trainc-folder --to y", "/nonexistent-trainc-folder");

    /* A value of any length is kept whole (a fixed buffer cut it at 4187 characters). */
    enum { LONG = 20000 };
    size_t len = LONG + 128;
    char *args = malloc(len), *name = malloc(LONG + 1);
    memset(name, 'r', LONG);
    name[LONG] = 0;
    snprintf(args, len, "--set run.name=%s --print-config", name);
    CHECK_MSG(trainc(args) == 0, "%.300s", output);
    snprintf(args, len, "\nname = %s  # --set\n", name);
    CHECK_MSG(strstr(output, args) != NULL, "the long run.name is not whole in --print-config");
    snprintf(args, len, "--resume %s/%s --print-config", dir, name);
    CHECK(trainc(args) == 0);
    CHECK_MSG(strstr(output, name) && strstr(output, "# --set\n"), "the long --resume value is not whole");
    free(args);
    free(name);
}

/* Each number out of its range: one message with where, the key, the value and the range. */
static void check_ranges(const char *dir) {
    static const struct {
        const char *assignment, *range;
    } cases[] = {
        {"train.batch=4294967297", "[1, 1048576]"},    {"run.epochs=-4294967295", "(0, 1000000]"},
        {"data.image_size=4294967328", "[8, 4096]"},   {"model.num_classes=4294967306", "[0, 1000]"},
        {"data.crop_pad=2000000000", "[0, 4096]"},     {"monitor.prometheus_port=65536", "[0, 65535]"},
        {"optim.momentum=1", "[0, 1)"},                {"memory.accumulate=0", "[1, 4096]"},
        {"run.epochs=0", "(0, 1000000]"},              {"run.epochs=-0.5", "(0, 1000000]"},
    };
    char args[512], want[256];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "--config configs/baseline.ini --device cpu --set %s", cases[i].assignment);
        const char *eq = strchr(cases[i].assignment, '=');
        snprintf(want, sizeof want, "trainc: error: --set %s: %.*s = %s is out of range: allowed %s\n",
                 cases[i].assignment, (int)(eq - cases[i].assignment), cases[i].assignment, eq + 1,
                 cases[i].range);
        CHECK_MSG(trainc(args) == 1, "%s: %s", cases[i].assignment, output);
        CHECK_MSG(strcmp(output, want) == 0, "got:\n%swant:\n%s", output, want);
    }
    const char *big = write_ini(dir, "big.ini", "[run]\nepochs = 1\n[train]\nbatch = 4294967297\n");
    snprintf(args, sizeof args, "--config %s --device cpu", big);
    snprintf(want, sizeof want, "%s:4: train.batch = 4294967297 is out of range: allowed [1, 1048576]", big);
    expect_error(args, want);
    expect_error("--config configs/baseline.ini --set optim.lr=1e39", "optim.lr: 1e39 overflows a 32-bit float");
    expect_error("--config configs/baseline.ini --set optim.lr=inf", "optim.lr: 'inf' is not a finite number");
    expect_error("--config configs/baseline.ini --set train.batch=32x", "'32x' is not a base-10 integer");
    expect_error("--config configs/baseline.ini --set run.epochs=nan", "run.epochs: 'nan' is not a finite number");
    expect_error("--config configs/baseline.ini --set run.epochs=9.9x", "run.epochs: '9.9x' is not a number");
    expect_error("--config configs/baseline.ini --set train.batch=99999999999999999999", "64-bit integer");
}

/* A GPU config on the CPU: every GPU-only key in one message, each with its
 * origin and what to set instead; none of trainc's source places. */
static void check_gpu_keys_on_cpu(void) {
    static const struct {
        const char *file, *line_text, *key_value, *instead;
    } keys[] = {
        {"configs/dataloader.ini", "pinned = on", "data.pinned = on", "data.pinned = off"},
        {"configs/final.ini", "amp = fp16", "precision.amp = fp16", "precision.amp = off"},
        {"configs/final.ini", "cuda_graph = on", "perf.cuda_graph = on", "perf.cuda_graph = off"},
        {"configs/final.ini", "transform_on = gpu", "data.transform_on = gpu", "data.transform_on = cpu"},
        {"configs/model.ini", "layout = nhwc", "model.layout = nhwc", "model.layout = nchw"},
        {"configs/model.ini", "fuse = on", "model.fuse = on", "model.fuse = off"},
    };
    CHECK_MSG(trainc("--config configs/final.ini --device cpu") == 1, "%s", output);
    CHECK_MSG(strstr(output, "trainc: error: 6 problems with the settings:\n") != NULL, "%s", output);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char want[512];
        int line = line_of(keys[i].file, keys[i].line_text);
        CHECK_MSG(line > 0, "no '%s' in %s", keys[i].line_text, keys[i].file);
        snprintf(want, sizeof want, "\n  %s:%d: %s: needs run.device = cuda; for the CPU set %s\n", keys[i].file, line,
                 keys[i].key_value, keys[i].instead);
        CHECK_MSG(strstr(output, want) != NULL, "no '%s' in:\n%s", want, output);
    }
    CHECK_MSG(strstr(output, ".c:") == NULL, "a place in trainc's source:\n%s", output);
    const char *first = strstr(output, "trainc: error:");
    CHECK_MSG(first && !strstr(first + 1, "trainc: error:"), "not one message:\n%s", output);

    /* One problem: one line, from --set. */
    CHECK(trainc("--config configs/baseline.ini --device cpu --set perf.cuda_graph=on") == 1);
    CHECK_MSG(strcmp(output, "trainc: error: --set: perf.cuda_graph = on: needs run.device = cuda; for the CPU set "
                             "perf.cuda_graph = off\n") == 0, "%s", output);
    /* A rule joining two keys names where the value came from. */
    expect_error("--config configs/baseline.ini --device cpu --set optim.nesterov=on --set optim.momentum=0",
                 "--set: optim.nesterov = on: needs optim.momentum > 0");
    expect_error("--config configs/baseline.ini --device cpu --set dist.socket_threads=16 "
                 "--set dist.sockets_per_thread=8", "dist.sockets_per_thread = 8: times dist.socket_threads must be "
                 "at most 64");
    expect_error("--config configs/baseline.ini --device cpu --set data.on_device=on --set data.resident=on",
                 "--set: data.on_device = on: and data.resident exclude each other");
    expect_error("--config configs/baseline.ini --device cpu --set run.repeats=3 --set run.resume=latest",
                 "--set: run.repeats = 3: above 1 excludes run.resume and run.init_from");
    expect_error("--config configs/baseline.ini --device cpu --set run.warmup_runs=1 --set run.checkpoint_every=5",
                 "--set: run.warmup_runs = 1: excludes run.resume, run.init_from and run.checkpoint_every");
    expect_error("--config configs/baseline.ini --device cpu --set data.pad_mode=mirror", "data.pad_mode");
    expect_error("--config configs/baseline.ini --device cpu --set run.eval_tta=on", "run.eval_tta");
    expect_error("--config configs/baseline.ini --device cpu --set run.repeats=0", "run.repeats");
    CHECK(strstr(output, "train.c") == NULL);
}

/* optim.name: another optimizer's keys away from their defaults are refused,
 * each with where it came from; the new keys' ranges. */
static void check_optimizer_keys(void) {
    const char *base = "--config configs/baseline.ini --device cpu";
    char args[512], want[512];
    snprintf(args, sizeof args, "%s --set optim.name=adamw --set optim.nesterov=on", base);
    expect_error(args, "trainc: error: --set: optim.nesterov = on: is SGD's (optim.name = sgd or muon), not adamw's: "
                 "adamw takes optim.beta1, optim.beta2 and optim.eps\n");
    int line = line_of("configs/resnet18.ini", "nesterov = on");
    CHECK(line > 0);
    snprintf(want, sizeof want, "configs/resnet18.ini:%d: optim.nesterov = on: is SGD's", line);
    expect_error("--config configs/resnet18.ini --device cpu --set optim.name=adam", want);
    snprintf(args, sizeof args, "%s --set optim.name=adam --set optim.momentum=0.5 --set optim.muon_lr=0.1", base);
    expect_error(args, "2 problems with the settings");
    CHECK_MSG(strstr(output, "optim.momentum = 0.5: is SGD's") && strstr(output, "optim.muon_lr = 0.1: is Muon's "
              "(optim.name = muon), not adam's"), "%s", output);
    snprintf(args, sizeof args, "%s --set optim.beta1=0.8", base);
    expect_error(args, "--set: optim.beta1 = 0.8: is Adam's (optim.name = adamw or adam), not sgd's");
    snprintf(args, sizeof args, "%s --set optim.muon=on --set optim.eps=1e-6", base);
    expect_error(args, "optim.eps = 1e-6: is Adam's (optim.name = adamw or adam), not muon's");
    snprintf(args, sizeof args, "%s --set optim.name=adamw --set optim.muon=on", base);
    expect_error(args, "--set: optim.muon = on: steps the filters beside SGD (optim.name = muon), not beside");
    snprintf(args, sizeof args, "%s --set optim.name=lion", base);
    expect_error(args, "optim.name");
    CHECK_MSG(strstr(output, "sgd, muon, adamw, adam") || strstr(output, "sgd|muon|adamw|adam"), "%s", output);
    snprintf(args, sizeof args, "%s --set optim.name=adamw --set optim.beta2=1", base);
    expect_error(args, "optim.beta2 = 1 is out of range: allowed [0, 1)");
    snprintf(args, sizeof args, "%s --set optim.name=adamw --set optim.eps=0", base);
    expect_error(args, "optim.eps = 0 is out of range: allowed (0, 1]");
}

/* SIGTERM mid-run: the hint to resume names the program as it was started. */
/* docs/config-keys.md is what `trainc keys` prints from the schema: a key
 * added or changed without regenerating the page fails here. */
static void check_keys_page(void) {
    CHECK(trainc("keys") == 0);
    static char page[1 << 17];
    FILE *f = fopen("docs/config-keys.md", "r");
    size_t n = f ? fread(page, 1, sizeof page - 1, f) : 0;
    if (f) fclose(f);
    page[n] = 0;
    CHECK_MSG(f && strcmp(page, output) == 0,
              "docs/config-keys.md differs from `trainc keys`: regenerate it with build/trainc keys > "
              "docs/config-keys.md");
    CHECK(strstr(output, "| `train.batch` | int | [1, ") != NULL);
}

/* Past ulimit -f a checkpoint's write fails with EFBIG: said, the temporary gone, the run non-zero; no SIGXFSZ. */
static void check_file_size_limit(const char *dir) {
    char program[1200], args[1200], tmp[1100];
    snprintf(program, sizeof program, "ulimit -f 200; exec '%s'", trainc_path());
    snprintf(args, sizeof args, "--config configs/baseline.ini --device cpu --set data.source=synthetic --set "
             "data.image_size=32 --set data.synthetic_train=256 --set data.synthetic_test=32 --set run.eval=off --set "
             "run.max_steps=2 --set run.checkpoint_every=2 --set run.checkpoint_dir=%s/xfsz --quiet", dir);
    int rc = run_program(program, args);
    CHECK_MSG(rc == 1 && strstr(output, "not written") && strstr(output, "File too large"),
              "a checkpoint past ulimit -f: exit %d:\n%s", rc, output);
    snprintf(tmp, sizeof tmp, "%s/xfsz/ckpt-00000002.trc", dir);
    CHECK_MSG(access(tmp, F_OK) != 0, "%s left behind", tmp);
}

static void check_resume_hint(const char *dir) {
    char link[1024], log[1100], cmd[4096], target[4096];
    snprintf(link, sizeof link, "%s/my trainc", dir);
    CHECK(realpath(trainc_path(), target) != NULL);
    CHECK(symlink(target, link) == 0);
    snprintf(log, sizeof log, "%s/hint.log", dir);
    pid_t pid = fork();
    if (pid == 0) {
        snprintf(cmd, sizeof cmd, "run.checkpoint_dir=%s/ckpt", dir);
        if (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(3);
        execl(link, link, "--config", "configs/baseline.ini", "--device", "cpu", "--set", "data.source=synthetic",
              "--set", "data.image_size=32", "--set", "data.synthetic_train=512", "--set", "data.synthetic_test=64",
              "--set", "run.epochs=1000", "--set", "run.log_every=1", "--set", cmd, "--set", "run.resume=",
              (char *)NULL);
        _exit(4);
    }
    /* Wait for the first logged step: the stop handlers are in place by then. */
    for (int waited_ms = 0; waited_ms < 60000; waited_ms += 20) {
        FILE *f = fopen(log, "r");
        size_t n = f ? fread(output, 1, sizeof output - 1, f) : 0;
        if (f) fclose(f);
        output[n] = 0;
        if (strstr(output, "step ")) break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(output, 1, sizeof output - 1, f) : 0;
    if (f) fclose(f);
    output[n] = 0;
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "status %d:\n%s", status, output);
    char want[2048];
    snprintf(want, sizeof want, "resume with: '%s' --config configs/baseline.ini --device cpu --set "
             "data.source=synthetic", link);
    CHECK_MSG(strstr(output, want) != NULL, "no '%s' in:\n%s", want, output);
    const char *hint = strstr(output, "resume with: ");
    CHECK_MSG(hint && strstr(hint, " --resume ") && !strstr(hint, "run.resume="), "%s", hint ? hint : output);
    CHECK_MSG(strstr(output, "run.resume is empty (--set): training from scratch"), "--set run.resume= said nothing:"
              "\n%s", output);
}

/* The summary's params_crc of a short airbench run on the CPU with extra --set args. */
static unsigned long airbench_crc(const char *extra) {
    char args[1024];
    snprintf(args, sizeof args, "--config configs/cpu.ini --quiet --set model.name=airbench --set data.source=synthetic "
             "--set data.synthetic_train=16 --set data.synthetic_test=8 --set data.train_limit=0 "
             "--set data.test_limit=0 --set train.batch=8 --set run.eval=off --set data.workers=0 "
             "--set model.bn_weight=fixed --set optim.bn_bias_lr_scale=64 --set model.whiten_bias_epochs=0.5 "
             "--set run.save_final=off %s", extra);
    CHECK_MSG(trainc(args) == 0, "trainc %s:\n%s", args, output);
    const char *crc = strstr(output, "\"params_crc\": ");
    CHECK_MSG(crc != NULL, "no params_crc in:\n%s", output);
    return crc ? strtoul(crc + strlen("\"params_crc\": "), NULL, 10) : 0;
}

/* airbench and its keys: the image size it needs, bad values named by key;
 * lookahead with a = 1 at every step keeps the net at its slow copy, the
 * weights it started from, however many steps run; without it they move. */
static void check_airbench(void) {
    expect_error("--config configs/cpu.ini --set model.name=airbench --set data.image_size=64 --set data.source=synthetic",
                 "data.image_size = 64: airbench is built for 32x32 images only");
    expect_error("--config configs/cpu.ini --set optim.bn_bias_lr_scale=0", "optim.bn_bias_lr_scale = 0 is out of range");
    expect_error("--config configs/cpu.ini --set optim.lookahead_alpha=1.5", "optim.lookahead_alpha = 1.5 is out of range");
    expect_error("--config configs/cpu.ini --set model.bn_weight=frozen", "model.bn_weight");
    const char *still = "--set optim.lookahead_every=1 --set optim.lookahead_alpha=1 --set optim.lookahead_power=0";
    char two[512], three[512];
    snprintf(two, sizeof two, "%s --set run.max_steps=2", still);
    snprintf(three, sizeof three, "%s --set run.max_steps=3", still);
    unsigned long held2 = airbench_crc(two), held3 = airbench_crc(three), moved = airbench_crc("--set run.max_steps=2");
    CHECK_MSG(held2 == held3 && held2 != moved, "airbench params_crc: lookahead a = 1 after 2 steps %lu, after 3 %lu; "
              "without lookahead %lu", held2, held3, moved);
}

/* trainc summary: the shipped ResNet-18's table; a net file's error through summary and through training. */
static void check_summary(const char *dir) {
    CHECK_MSG(trainc("summary --config configs/resnet18.ini") == 0, "%s", output);
    CHECK_MSG(strstr(output, "layer4.1.bn2") && strstr(output, "512x4x4") &&
              strstr(output, "total: 67 layers, 11,173,962 parameters"), "%s", output);
    write_ini(dir, "bad.net", "[net]\nc1 = conv 8 3\nc2 = cnv 8 3\n");
    const char *ini = write_ini(dir, "badnet.ini", "[run]\ndevice = cpu\n[data]\nsource = synthetic\n"
                                "[model]\nnet = bad.net\n");
    char args[1200];
    snprintf(args, sizeof args, "summary --config %s", ini);
    expect_error(args, "bad.net:3: layer c2: unknown kind 'cnv'");
    snprintf(args, sizeof args, "--config %s", ini);
    expect_error(args, "bad.net:3: layer c2: unknown kind 'cnv'");
    expect_error(args, "(model.net from ");
    expect_error("summary --config configs/cpu.ini --set model.name=resnet18 --set model.net=x.net",
                 "model.net = x.net: and model.name both name the net");

    /* From different places the later names the net: a config over an included one's, a --set over a file's. */
    write_ini(dir, "small.net", "[net]\nc1 = conv 8 3\nglobal_avgpool\nfc = linear {classes}\n");
    char repo_configs[4096];
    CHECK(realpath("configs/resnet18.ini", repo_configs) != NULL);
    char text[4400];
    snprintf(text, sizeof text, "include = %s\n[model]\nnet = small.net\n", repo_configs);
    const char *over = write_ini(dir, "over.ini", text);
    snprintf(args, sizeof args, "summary --config %s", over);
    CHECK_MSG(trainc(args) == 0 && strstr(output, "total: 3 layers, 314 parameters"), "%s", output);
    snprintf(args, sizeof args, "summary --config configs/resnet18.ini --set model.net=%s/small.net", dir);
    CHECK_MSG(trainc(args) == 0 && strstr(output, "total: 3 layers, 314 parameters"), "%s", output);
    snprintf(args, sizeof args, "summary --config %s --set model.name=resnet18", over);
    CHECK_MSG(trainc(args) == 0 && strstr(output, "total: 67 layers, 11,173,962 parameters"), "%s", output);
}

int main(void) {
    const char *dir = test_tmpdir("cli");
    char args[2048];

    const char *typo = write_ini(dir, "typo.ini", "[data]\nworkerz = 4\n");
    snprintf(args, sizeof args, "--config %s", typo);
    expect_error(args, "typo.ini:2");
    expect_error(args, "workerz");

    const char *bad_type = write_ini(dir, "type.ini", "[train]\nbatch = big\n");
    snprintf(args, sizeof args, "--config %s", bad_type);
    expect_error(args, "type.ini:2");

    const char *bad_include = write_ini(dir, "inc.ini", "include = nowhere.ini\n");
    snprintf(args, sizeof args, "--config %s", bad_include);
    expect_error(args, "nowhere.ini");

    expect_error("--config /nonexistent/trainc.ini", "/nonexistent/trainc.ini");
    check_airbench();
    check_summary(dir);
    char long_name[200];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    snprintf(args, sizeof args, "--config configs/baseline.ini --device cpu --set run.name=%s", long_name);
    expect_error(args, "run.name = nnnn");
    expect_error(args, "is longer than 127 bytes");
    expect_error("--config configs/baseline.ini --set train.batchh=3", "train.batchh");
    expect_error("--config configs/baseline.ini --set train.batch=0 --device cpu", "train.batch");
    expect_error("--config configs/baseline.ini --set data.image_size=36 --device cpu "
                 "--set data.source=synthetic --set data.synthetic_train=64 --set data.synthetic_test=8",
                 "data.image_size");
    expect_error("--config configs/baseline.ini --device cpu --set data.path=/nonexistent/cifar",
                 "/nonexistent/cifar");
    expect_error("--bogus", "unknown or ambiguous option: --bogus");

    check_every_number_has_a_range();
    check_version();
    check_keys_page();
    check_command_line(dir);
    check_ranges(dir);
    check_gpu_keys_on_cpu();
    check_optimizer_keys();
    check_resume_hint(dir);
    check_file_size_limit(dir);

    /* --print-config output loads back and prints the same. */
    CHECK(trainc("--config configs/baseline.ini --set train.batch=64 --print-config") == 0);
    CHECK(strstr(output, "batch = 64") != NULL);
    const char *printed = write_ini(dir, "printed.ini", output);
    snprintf(args, sizeof args, "--config %s --print-config", printed);
    CHECK(trainc(args) == 0);
    CHECK(strstr(output, "batch = 64") != NULL);

    /* A short synthetic run on the CPU ends with the summary. */
    CHECK(trainc("--config configs/baseline.ini --device cpu --quiet --set data.source=synthetic "
                 "--set data.image_size=32 --set data.synthetic_train=256 --set data.synthetic_test=64 "
                 "--set run.epochs=1 --set run.warmup_steps=2 --set run.save_final=off") == 0);
    const char *last = strstr(output, "{\"name\""); /* the summary line (phase_ms nests an object) */
    CHECK(last != NULL);
    if (last) {
        const char *keys[] = {"\"samples_per_s\"", "\"epoch_s\"", "\"gpu_util\"", "\"power_w\": null",
                              "\"power_capped\": null", "\"peak_mem_bytes\"",
                              "\"test_acc\"", "\"steps\": 8", "\"device\": \"cpu\""};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
            CHECK_MSG(strstr(last, keys[i]) != NULL, "summary lacks %s: %s", keys[i], last);
    }
    return test_finish("test_trainc_cli");
}
