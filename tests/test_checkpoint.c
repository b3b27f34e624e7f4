/* Long runs you can trust, on the CPU: a run stopped and resumed from its
 * checkpoint ends with bitwise the parameters of the run that never stopped
 * (through the API, and through trainc stopped by SIGTERM); corrupt and
 * mismatched checkpoints are refused naming the file; a step with a NaN
 * gradient is skipped, counted, and changes nothing; run.max_bad_steps stops
 * the run with a checkpoint. */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/keys.h"
#include "tools/train.h"

/* 512 synthetic images of 32x32 in batches of 16: 32 steps an epoch. */
static const char *base_sets[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=32",
                                  "data.synthetic_train=512", "data.synthetic_test=32", "train.batch=16",
                                  "run.eval=off", "run.log_every=1000", "run.warmup_steps=0", "run.epochs=2",
                                  "data.workers=2", "data.flip=on", "data.crop_pad=4", "optim.lr=0.05",
                                  "optim.weight_decay=0.001"};
enum { N_BASE = sizeof base_sets / sizeof *base_sets };

static void set(Config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set(Config *c, const char *fmt, ...) {
    char line[2048], err[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    CHECK_MSG(config_set(c, line, err, sizeof err) == 0, "%s", err);
}

static Config *small_run(void) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    for (int i = 0; i < N_BASE; i++) set(c, "%s", base_sets[i]);
    return c;
}

static size_t n_params;

static float *run(Config *c, TrainSummary *s) {
    float *params;
    train_run_keep_params(c, s, &params);
    config_free(c);
    return params;
}

static int same_params(const float *a, const float *b) { return memcmp(a, b, n_params * sizeof(float)) == 0; }

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* ---- resume through the API ------------------------------------------------ */

static char resumed_from[1024]; /* a good checkpoint, for the refusal checks */

static void check_resume(const char *dir) {
    TrainSummary s;
    char ckdir[768];

    Config *c = small_run();
    set(c, "run.max_steps=40");
    float *whole = run(c, &s);
    CHECK(s.steps == 40 && !s.stopped && s.exit_status == 0);

    /* Stopped at 25 with checkpoints at 10 and 20, resumed from 20: across the epoch's end at 32. */
    snprintf(ckdir, sizeof ckdir, "%s/api", dir);
    c = small_run();
    set(c, "run.max_steps=25");
    set(c, "run.checkpoint_every=10");
    set(c, "run.checkpoint_dir=%s", ckdir);
    free(run(c, &s));
    snprintf(resumed_from, sizeof resumed_from, "%s/ckpt-00000020.trc", ckdir);
    CHECK_MSG(file_exists(resumed_from), "no %s", resumed_from);
    CHECK(strcmp(s.checkpoint, resumed_from) == 0);

    c = small_run();
    set(c, "run.max_steps=40");
    set(c, "run.checkpoint_every=10");
    set(c, "run.checkpoint_dir=%s", ckdir);
    set(c, "run.resume=%s", resumed_from);
    float *resumed = run(c, &s);
    CHECK(s.steps == 40);
    CHECK_MSG(s.params_crc != 0, "params_crc unset");

    /* n_params from the file: the params section holds n_params floats */
    char err[512];
    CkptFile *f = ckpt_open(resumed_from, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (f) {
        n_params = (size_t)ckpt_section_size(f, "params") / sizeof(float);
        ckpt_close(f);
    }
    CHECK(n_params > 1000);
    CHECK_MSG(same_params(whole, resumed), "resumed run differs from the uninterrupted one (rel %.3g)",
              test_rel_error(resumed, whole, n_params));
    /* The rotation kept the newest 3: 20, 30, 40 (10 deleted). */
    char p10[1024], p40[1024];
    snprintf(p10, sizeof p10, "%s/ckpt-00000010.trc", ckdir);
    snprintf(p40, sizeof p40, "%s/ckpt-00000040.trc", ckdir);
    CHECK(!file_exists(p10) && file_exists(p40) && file_exists(resumed_from));
    free(whole);
    free(resumed);
}

/* ---- NaN: skipped, counted, changes nothing; max_bad_steps stops ----------- */

static void check_nan(const char *dir) {
    TrainSummary s;
    Config *c = small_run();
    set(c, "run.max_steps=3");
    float *before = run(c, &s);
    CHECK(s.skipped_steps == 0);

    c = small_run();
    set(c, "run.max_steps=4");
    set(c, "run.inject_nan_step=4");
    float *after = run(c, &s);
    CHECK_MSG(s.skipped_steps == 1, "skipped_steps = %ld", s.skipped_steps);
    CHECK(s.steps == 4 && !s.stopped);
    CHECK_MSG(same_params(before, after), "the skipped step changed the parameters");

    /* The run goes on after it: step 5 trains again. */
    c = small_run();
    set(c, "run.max_steps=6");
    set(c, "run.inject_nan_step=2");
    float *later = run(c, &s);
    CHECK(s.skipped_steps == 1 && s.steps == 6 && isfinite(s.final_loss));
    CHECK(!same_params(later, before));
    free(later);

    /* run.max_bad_steps = 1: the bad step stops the run with a checkpoint of the state before it. */
    char ckdir[768], path[1024];
    snprintf(ckdir, sizeof ckdir, "%s/nan", dir);
    c = small_run();
    set(c, "run.max_steps=10");
    set(c, "run.inject_nan_step=4");
    set(c, "run.max_bad_steps=1");
    set(c, "run.checkpoint_dir=%s", ckdir);
    float *stopped = run(c, &s);
    CHECK(s.stopped && s.exit_status == 1 && s.steps == 4);
    snprintf(path, sizeof path, "%s/ckpt-00000004.trc", ckdir);
    CHECK_MSG(strcmp(s.checkpoint, path) == 0, "checkpoint '%s'", s.checkpoint);
    CHECK(file_exists(path));
    CHECK(same_params(stopped, before));
    free(stopped);
    free(before);
    free(after);
}

/* ---- trainc: refusals, SIGTERM and --resume latest ------------------------- */

static char output[1 << 16];

static const char *trainc_path(void) {
    static char path[1024];
    const char *build = getenv("TRAINC_BUILD_DIR");
    snprintf(path, sizeof path, "%s/trainc", build ? build : "build");
    return path;
}

/* Starts trainc with the base settings and extra arguments; stdout and stderr
 * go to out_file. */
static pid_t start_trainc(const char *out_file, const char **extra, int n_extra) {
    const char *argv[96];
    int n = 0;
    argv[n++] = trainc_path();
    argv[n++] = "--config";
    argv[n++] = "configs/baseline.ini";
    for (int i = 0; i < N_BASE; i++) {
        argv[n++] = "--set";
        argv[n++] = base_sets[i];
    }
    for (int i = 0; i < n_extra; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void slurp(const char *file) {
    FILE *f = fopen(file, "r");
    size_t n = f ? fread(output, 1, sizeof output - 1, f) : 0;
    output[n] = 0;
    if (f) fclose(f);
}

/* Runs trainc to the end; returns its exit status (-1: killed), output in 'output'. */
static int trainc(const char *dir, const char **extra, int n_extra) {
    char out_file[1024];
    snprintf(out_file, sizeof out_file, "%s/trainc.out", dir);
    pid_t pid = start_trainc(out_file, extra, n_extra);
    int status;
    waitpid(pid, &status, 0);
    slurp(out_file);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static unsigned long summary_crc(void) {
    const char *p = strstr(output, "\"params_crc\": ");
    return p ? strtoul(p + 14, NULL, 10) : 0;
}

static void expect_refused(const char *dir, const char *file, const char *why, const char **extra, int n_extra) {
    const char *args[8];
    int n = 0;
    for (int i = 0; i < n_extra; i++) args[n++] = extra[i];
    args[n++] = "--resume";
    args[n++] = file;
    int rc = trainc(dir, args, n);
    CHECK_MSG(rc != 0 && rc < 128, "resume from %s (%s) exited %d", file, why, rc);
    CHECK_MSG(strstr(output, file) != NULL && strstr(output, why) != NULL,
              "resume from %s: no file name or '%s' in:\n%s", file, why, output);
}

static void copy_file(const char *from, const char *to, long keep, long flip_at) {
    FILE *in = fopen(from, "rb");
    FILE *out = fopen(to, "wb");
    CHECK(in && out);
    if (!in || !out) return;
    long i = 0;
    int ch;
    while ((ch = fgetc(in)) != EOF && (keep < 0 || i < keep)) {
        if (i == flip_at) ch ^= 0x10;
        fputc(ch, out);
        i++;
    }
    fclose(in);
    fclose(out);
}

static void check_refusals(const char *dir) {
    char truncated[1024], flipped[1024], magic[1024];
    struct stat st;
    CHECK(stat(resumed_from, &st) == 0);
    snprintf(truncated, sizeof truncated, "%s/truncated.trc", dir);
    snprintf(flipped, sizeof flipped, "%s/flipped.trc", dir);
    snprintf(magic, sizeof magic, "%s/magic.trc", dir);
    copy_file(resumed_from, truncated, (long)st.st_size / 2, -1);
    copy_file(resumed_from, flipped, -1, (long)st.st_size / 2);
    copy_file(resumed_from, magic, -1, 0);
    expect_refused(dir, truncated, "truncated", NULL, 0);
    expect_refused(dir, flipped, "checksum", NULL, 0);
    expect_refused(dir, magic, "magic", NULL, 0);
    const char *big[] = {"--set", "data.image_size=64"};
    expect_refused(dir, resumed_from, "another model", big, 2);
    expect_refused(dir, "/nonexistent/ckpt.trc", "cannot open", NULL, 0);
}

static void check_sigterm(const char *dir) {
    char ckdir[768], ckset[1024], out_file[1024], uninterrupted_set[1024];
    snprintf(ckdir, sizeof ckdir, "%s/sig", dir);
    snprintf(ckset, sizeof ckset, "run.checkpoint_dir=%s", ckdir);
    snprintf(out_file, sizeof out_file, "%s/sigterm.out", dir);
    const char *args[] = {"--set", "run.checkpoint_every=6", "--set", ckset, "--set", "run.epochs=3", "--quiet"};
    int n_args = sizeof args / sizeof *args;

    pid_t pid = start_trainc(out_file, args, n_args);
    char first[1024];
    snprintf(first, sizeof first, "%s/ckpt-00000006.trc", ckdir);
    double waited = 0;
    int status, ended = 0;
    while (!file_exists(first) && waited < 60 && !(ended = waitpid(pid, &status, WNOHANG) == pid)) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        waited += 0.02;
    }
    CHECK_MSG(file_exists(first), "no checkpoint %s after 60 s", first);
    if (!ended) {
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
    }
    slurp(out_file);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "exit status %d, output:\n%s",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1, output);
    const char *msg = strstr(output, "stopped by SIGTERM at step ");
    CHECK_MSG(msg != NULL, "no stop message in:\n%s", output);
    if (msg) {
        long step = strtol(msg + strlen("stopped by SIGTERM at step "), NULL, 10);
        char resume_arg[1024];
        snprintf(resume_arg, sizeof resume_arg, "--resume %s/ckpt-%08ld.trc", ckdir, step);
        CHECK_MSG(strstr(msg, resume_arg) != NULL, "no '%s' in: %s", resume_arg, msg);
        CHECK_MSG(step > 0 && step < 96, "stopped at step %ld of 96 (the run ended before the signal?)", step);
    }
    const char *summary = strstr(output, "{\"name\""); /* the summary line (phase_ms nests an object) */
    CHECK(summary && strstr(summary, "\"stopped\": true"));

    /* --resume latest to the end, and the run that never stopped. */
    const char *resume_args[] = {"--set", "run.checkpoint_every=6", "--set", ckset, "--set", "run.epochs=3",
                                 "--quiet", "--resume", "latest"};
    int rc = trainc(dir, resume_args, sizeof resume_args / sizeof *resume_args);
    CHECK_MSG(rc == 0, "resume latest exited %d:\n%s", rc, output);
    CHECK(strstr(output, "\"steps\": 96") != NULL);
    unsigned long resumed = summary_crc();

    snprintf(uninterrupted_set, sizeof uninterrupted_set, "run.checkpoint_dir=%s/sig-whole", dir);
    const char *whole_args[] = {"--set", "run.epochs=3", "--quiet", "--set", uninterrupted_set};
    rc = trainc(dir, whole_args, sizeof whole_args / sizeof *whole_args);
    CHECK_MSG(rc == 0, "uninterrupted run exited %d:\n%s", rc, output);
    unsigned long whole = summary_crc();
    CHECK_MSG(whole != 0 && resumed == whole, "params_crc: resumed %lu, uninterrupted %lu", resumed, whole);
}

int main(void) {
    const char *tmp = test_tmpdir("checkpoint");
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tmp);
    check_resume(dir);
    check_nan(dir);
    check_refusals(dir);
    check_sigterm(dir);
    return test_finish("test_checkpoint");
}
