/* Nothing a run trained is lost, on the CPU: a finished run leaves its model
 * (run.save_final), the steps after the last run.checkpoint_every included,
 * and run.keep_checkpoints keeps it; the same command run again puts its
 * model beside the first's; a checkpoint folder that cannot be written stops
 * the run before it trains; a fatal error (run.metrics_file on a full disk, a
 * file that cannot be decoded) writes a last checkpoint first; SIGTERM while
 * the images are decoded ends trainc within a fraction of the decode's time,
 * writing no checkpoint. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>

#include "data/dataset.h"
#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

/* 256 synthetic images in batches of 16: 16 steps an epoch, 80 in 5 epochs. */
static const char *base_sets[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=16",
                                  "data.synthetic_train=256", "data.synthetic_test=16", "train.batch=16",
                                  "run.eval=off", "run.log_every=1000", "run.warmup_steps=0", "run.epochs=5",
                                  "data.workers=1", "optim.lr=0.01"};
enum { N_BASE = sizeof base_sets / sizeof *base_sets };

static Config *small_run(const char *checkpoint_dir) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    for (int i = 0; i < N_BASE; i++) test_config_set(c, "%s", base_sets[i]);
    test_config_set(c, "run.checkpoint_dir=%s", checkpoint_dir);
    return c;
}

static void run(Config *c, TrainSummary *s) {
    train_run(c, s);
    config_free(c);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* The steps of dir's ckpt-*.trc, as a string: "30 60 80". */
static const char *checkpoint_steps(const char *dir) {
    static char out[512];
    long steps[64];
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 64)
        if (strncmp(e->d_name, "ckpt-", 5) == 0 && strstr(e->d_name, ".trc")) steps[n++] = atol(e->d_name + 5);
    if (d) closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && steps[j] < steps[j - 1]; j--) {
            long t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    out[0] = 0;
    for (int i = 0; i < n; i++) snprintf(out + strlen(out), sizeof out - strlen(out), "%s%ld", i ? " " : "", steps[i]);
    return out;
}

static const char *path_in(const char *dir, const char *name) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* ---- a finished run leaves its model ------------------------------------------ */

static void check_final_written(void) {
    char dir[512], want[1024];
    TrainSummary s;
    /* run.checkpoint_every = 30 over 80 steps: 30, 60, and the final 80. */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("every-30"));
    Config *c = small_run(dir);
    test_config_set(c, "run.checkpoint_every=30");
    run(c, &s);
    snprintf(want, sizeof want, "%s/ckpt-00000080.trc", dir);
    CHECK_MSG(s.exit_status == 0 && s.steps == 80 && strcmp(s.checkpoint, want) == 0, "exit %d, %ld steps, "
              "checkpoint '%s'", s.exit_status, s.steps, s.checkpoint);
    CHECK_MSG(strcmp(checkpoint_steps(dir), "30 60 80") == 0, "checkpoints: %s", checkpoint_steps(dir));
    unsigned long crc = s.params_crc;
    /* The final one resumes to the end: no step left, the same weights. */
    c = small_run(test_tmpdir("resumed-final"));
    test_config_set(c, "run.resume=%s", want);
    run(c, &s);
    CHECK_MSG(s.exit_status == 0 && s.steps == 80 && s.params_crc == crc, "resumed: exit %d, %ld steps, crc %lu "
              "(the run's %lu)", s.exit_status, s.steps, (unsigned long)s.params_crc, crc);

    /* run.keep_checkpoints = 2 keeps the final one and the one before. */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("keep-2"));
    c = small_run(dir);
    test_config_set(c, "run.checkpoint_every=30");
    test_config_set(c, "run.keep_checkpoints=2");
    run(c, &s);
    CHECK_MSG(strcmp(checkpoint_steps(dir), "60 80") == 0, "keep 2: %s", checkpoint_steps(dir));

    /* run.max_steps = 50: the final checkpoint is step 50's. */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("max-steps"));
    c = small_run(dir);
    test_config_set(c, "run.checkpoint_every=30");
    test_config_set(c, "run.max_steps=50");
    run(c, &s);
    CHECK_MSG(strcmp(checkpoint_steps(dir), "30 50") == 0 && s.steps == 50, "max_steps 50: %s",
              checkpoint_steps(dir));

    /* By default (no run.checkpoint_every): the final one alone; run again,
     * the second run's goes beside it into run-2, the first's untouched. */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("default"));
    c = config_new(trainc_keys, trainc_n_keys);
    for (int i = 0; i < N_BASE; i++) test_config_set(c, "%s", base_sets[i]);
    test_config_set(c, "run.checkpoint_dir=%s", dir);
    test_config_set(c, "run.epochs=1");
    run(c, &s);
    snprintf(want, sizeof want, "%s/ckpt-00000016.trc", dir);
    CHECK_MSG(s.exit_status == 0 && strcmp(s.checkpoint, want) == 0, "default: exit %d, checkpoint '%s'",
              s.exit_status, s.checkpoint);
    CHECK_MSG(strcmp(checkpoint_steps(dir), "16") == 0, "default: %s", checkpoint_steps(dir));
    struct stat first, after;
    CHECK(stat(want, &first) == 0);
    c = small_run(dir);
    test_config_set(c, "run.epochs=1");
    run(c, &s);
    snprintf(want, sizeof want, "%s/run-2/ckpt-00000016.trc", dir);
    CHECK_MSG(s.exit_status == 0 && strcmp(s.checkpoint, want) == 0 && file_exists(want), "run again: exit %d, "
              "checkpoint '%s'", s.exit_status, s.checkpoint);
    CHECK(stat(path_in(dir, "ckpt-00000016.trc"), &after) == 0 && after.st_ino == first.st_ino &&
          after.st_mtime == first.st_mtime && after.st_size == first.st_size);

    /* run.save_final = off: none. */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("off"));
    c = small_run(dir);
    test_config_set(c, "run.save_final=off");
    test_config_set(c, "run.epochs=1");
    run(c, &s);
    CHECK_MSG(s.exit_status == 0 && s.checkpoint[0] == 0 && checkpoint_steps(dir)[0] == 0, "off: '%s', %s",
              s.checkpoint, checkpoint_steps(dir));
}

/* ---- checkpoint failures ------------------------------------------------------- */

static void train_in(void *dir) {
    Config *c = small_run(dir);
    test_config_set(c, "run.epochs=1");
    TrainSummary s;
    run(c, &s);
}

/* A folder that cannot be written stops the run before its first step, naming the key. */
static void check_unwritable_refused(void) {
    char file[600], below[700];
    snprintf(file, sizeof file, "%s", test_write_file(test_tmpdir("parent-file"), "a-file", "x", 1));
    snprintf(below, sizeof below, "%s/checkpoints", file);
    int status;
    char *err = test_child_stderr("parent-file-run", train_in, below, &status);
    CHECK_MSG(status == 1 && strstr(err, "run.checkpoint_dir") && strstr(err, below) && !strstr(err, "step 1"),
              "a folder under a file: exit %d: %s", status, err);
    free(err);
    if (geteuid() == 0) {
        printf("running as root, which writes into read-only folders: the read-only folder is not tested\n");
        return;
    }
    /* Read-only after an earlier run left its lock file (writable) in it. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("read-only"));
    test_write_file(dir, CKPT_LOCK_FILE, "", 0);
    CHECK(chmod(dir, 0555) == 0);
    err = test_child_stderr("read-only-run", train_in, dir, &status);
    CHECK_MSG(status == 1 && strstr(err, "run.checkpoint_dir") && strstr(err, "cannot create a file"),
              "a read-only folder: exit %d: %s", status, err);
    chmod(dir, 0755);
    free(err);
}

/* run.metrics_file on a full disk (/dev/full) ends the run at its first
 * metrics line (step 5), which is written as a last checkpoint first. */
static void train_onto_full_disk(void *dir) {
    Config *c = small_run(dir);
    test_config_set(c, "run.metrics_file=/dev/full");
    test_config_set(c, "run.log_every=5");
    TrainSummary s;
    run(c, &s);
}

/* A run in a child that a fatal error (naming what) ends after step: exit 1, the
 * step's checkpoint written, said and whole, and no other. */
static void expect_last_checkpoint(const char *tag, void (*train)(void *), const char *what, long step) {
    char dir[512], said[64], name[64], run_tag[128];
    snprintf(dir, sizeof dir, "%s", test_tmpdir(tag));
    snprintf(run_tag, sizeof run_tag, "%s-run", tag);
    int status;
    char *err = test_child_stderr(run_tag, train, dir, &status);
    snprintf(said, sizeof said, "a last checkpoint of step %ld", step);
    snprintf(name, sizeof name, "ckpt-%08ld.trc", step);
    const char *path = path_in(dir, name);
    CHECK_MSG(status == 1 && strstr(err, what) && strstr(err, said) && strstr(err, path), "%s: exit %d: %s", tag,
              status, err);
    snprintf(said, sizeof said, "%ld", step);
    CHECK_MSG(strcmp(checkpoint_steps(dir), said) == 0, "%s: %s", tag, checkpoint_steps(dir));
    char why[4400];
    CkptFile *f = ckpt_open(path, why, sizeof why);
    CHECK_MSG(f != NULL, "%s", why);
    if (f) ckpt_close(f);
    free(err);
}

static void make_image_set(const char *root, int n);

/* A file that cannot be decoded, streamed in order: the run stops at its batch
 * (the fifth: a/zzz.jpg follows a/'s 32 images), after 4 steps, and keeps them. */
static void train_into_bad_file(void *dir) {
    char root[600];
    snprintf(root, sizeof root, "%s", test_tmpdir("bad-file-set"));
    make_image_set(root, 64);
    test_write_file(path_in(root, "train/a"), "zzz.jpg", "<html>404</html>", 16);
    Config *c = small_run(dir);
    static const char *sets[] = {"data.source=image_folder", "data.crop=random_resized", "data.cache=stream",
                                 "data.shuffle=off", "data.image_size=32", "train.batch=8", "run.epochs=1"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) test_config_set(c, "%s", sets[i]);
    test_config_set(c, "data.path=%s", root);
    TrainSummary s;
    run(c, &s);
}

static void check_fatal_saves(void) {
    expect_last_checkpoint("full-disk", train_onto_full_disk, "run.metrics_file", 5);
    expect_last_checkpoint("bad-file", train_into_bad_file, "zzz.jpg", 4);
}

/* ---- SIGTERM while the images are decoded --------------------------------------- */

/* A file of the 32x32 JPEG for each LINKS_A_FILE links to it (ext4 allows
 * 65000 a file): path names it, *left counts down the links it still takes. */
#define LINKS_A_FILE 20000
static void next_source(const char *root, char *path, size_t n, int *left) {
    static int made;
    uint8_t hwc[32 * 32 * 3];
    for (size_t i = 0; i < sizeof hwc; i++) hwc[i] = (uint8_t)(i * 7 + i / 96);
    snprintf(path, n, "%s/source-%d.jpg", root, made++);
    CHECK(stbi_write_jpg(path, 32, 32, 3, hwc, 90));
    *left = LINKS_A_FILE;
}

/* root/{train,test}/{a,b}/: n training images, hard links to 32x32 JPEGs
 * (each is decoded: only the disk is spared). */
static void make_image_set(const char *root, int n) {
    char path[1024], link_path[1100];
    int left;
    next_source(root, path, sizeof path, &left);
    const char *splits[2] = {"train", "test"}, *classes[2] = {"a", "b"};
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 2; k++) {
            snprintf(link_path, sizeof link_path, "%s/%s", root, splits[s]);
            mkdir(link_path, 0755);
            snprintf(link_path, sizeof link_path, "%s/%s/%s", root, splits[s], classes[k]);
            mkdir(link_path, 0755);
            int count = s == 0 ? n / 2 : 2, linked = 0;
            for (int i = 0; i < count; i++, left--) {
                if (left == 0) next_source(root, path, sizeof path, &left);
                snprintf(link_path, sizeof link_path, "%s/%s/%s/%06d.jpg", root, splits[s], classes[k], i);
                linked += link(path, link_path) == 0;
            }
            CHECK_MSG(linked == count, "%d of %d links made in %s", linked, count, root);
        }
}

/* Seconds to decode root's training split, as trainc does (every core). */
static double decode_seconds(const char *root) {
    Dataset d;
    char err[4096];
    double start = now_seconds();
    int rc = image_folder_load(&d, root, "train", 0, err, sizeof err);
    double took = now_seconds() - start;
    CHECK_MSG(rc == 0, "%s", err);
    if (rc == 0) dataset_free(&d);
    return took;
}

static const char *trainc_path(void) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/trainc", test_build_dir());
    return path;
}

static void check_sigterm_in_decode(void) {
    char root[512], ckdir[700], out_file[700], path_set[800], dir_set[800];
    snprintf(root, sizeof root, "%s", test_tmpdir("decode-set"));
    /* Grown until the decode takes at least 1.5 s here (the bound below is a fraction of it). */
    double decode_s = 0;
    int n = 8000;
    for (;; n *= 2) {
        snprintf(root, sizeof root, "%s", test_tmpdir("decode-set"));
        make_image_set(root, n);
        decode_s = decode_seconds(root);
        if (decode_s >= 1.5 || n >= 128000) break;
    }
    printf("the decode of %d images takes %.2f s\n", n, decode_s);
    snprintf(ckdir, sizeof ckdir, "%s", test_tmpdir("decode-ckpt"));
    test_write_file(ckdir, "kept.txt", "a file of the user's", 20);
    snprintf(out_file, sizeof out_file, "%s/trainc.out", test_tmpdir("decode-out"));
    snprintf(path_set, sizeof path_set, "data.path=%s", root);
    snprintf(dir_set, sizeof dir_set, "run.checkpoint_dir=%s", ckdir);
    const char *argv[] = {trainc_path(), "--config", "configs/cpu.ini", "--set", "run.device=cpu", "--set",
                          "data.source=image_folder", "--set", path_set, "--set", dir_set, "--set", "run.eval=off",
                          "--set", "data.train_limit=0", "--set", "data.test_limit=0", NULL};
    pid_t pid = test_spawn(argv, out_file);
    /* SIGTERM once the decode has begun. */
    double began = now_seconds(), sent = 0;
    char *text = NULL;
    while (now_seconds() - began < 120) {
        free(text);
        text = test_read_file(out_file);
        if (text && strstr(text, "decoding the")) break;
        if (waitpid(pid, NULL, WNOHANG) == pid) break;
        usleep(2000);
    }
    CHECK_MSG(text && strstr(text, "decoding the"), "trainc never began the decode: %s", text ? text : "");
    free(text);
    sent = now_seconds();
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    double took = now_seconds() - sent;
    text = test_read_file(out_file);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "exit status %d", status);
    if (decode_s >= 0.6) /* else a machine too fast for the set's largest size: the rest is checked */
        CHECK_MSG(took < 0.5 * decode_s, "trainc ended %.2f s after SIGTERM; the whole decode takes %.2f s", took,
                  decode_s);
    else
        printf("the decode takes %.2f s here: too short to time the stop against\n", decode_s);
    CHECK_MSG(text && strstr(text, "stopped by SIGTERM while decoding") && strstr(text, "no checkpoint written"),
              "%s", text ? text : "");
    CHECK_MSG(checkpoint_steps(ckdir)[0] == 0, "checkpoints written: %s", checkpoint_steps(ckdir));
    char *kept = test_read_file(path_in(ckdir, "kept.txt"));
    CHECK(kept && strcmp(kept, "a file of the user's") == 0);
    free(kept);
    free(text);
}

int main(int argc, char **argv) {
    log_set_quiet(1);
    int only_signal = argc > 1 && strcmp(argv[1], "sigterm") == 0;
    if (!only_signal) {
        check_final_written();
        check_unwritable_refused();
        check_fatal_saves();
    }
    check_sigterm_in_decode();
    return test_finish("test_final_checkpoint");
}
