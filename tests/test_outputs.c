/* Nothing the user has is lost, through the trainc program on the CPU: an
 * output (export's --out, eval's --csv, run.metrics_file) that is one of the
 * command's inputs or holds a checkpoint is refused naming the file and why,
 * and the file is unchanged; a symlink is written through and stays a link; a
 * FIFO no one reads, a directory and a file export did not make are refused; a
 * FIFO with a reader and /dev/null are written through. Two runs on one
 * run.checkpoint_dir: the second is refused naming the first's pid and host,
 * and the first's checkpoints are all there; a checkpoint is never committed
 * over an existing file. */
#include <errno.h>
#include <fcntl.h>
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
#include "runtime/files.h"
#include "tests/harness.h"

static char output[1 << 16];

/* 16x16 synthetic images on the CPU: a step takes milliseconds. */
#define DATA "--config configs/baseline.ini --device cpu --set data.source=synthetic --set data.image_size=16 " \
             "--set data.synthetic_train=256 --set data.synthetic_test=32 --set run.eval=off"

/* Runs "trainc ARGS"; its exit status (-1: killed by a signal), output in 'output'. */
static int trainc(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int trainc(const char *fmt, ...) {
    char args[6000], cmd[7000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "timeout 120 '%s/trainc' %s", test_build_dir(), args);
    int rc = test_run_command(cmd, output, sizeof output);
    return rc == 124 ? -1 : rc;
}

static long file_sum(const char *path) {
    char *text = test_read_file(path);
    struct stat st;
    if (!text || stat(path, &st) != 0) {
        free(text);
        return -1;
    }
    uint32_t crc = ckpt_crc32(0, text, (size_t)st.st_size);
    free(text);
    return (long)crc;
}

/* The command fails (not by a signal) naming path and why; path's bytes are as they were. */
static void expect_refused(const char *what, const char *path, const char *why, long sum_before, int rc) {
    CHECK_MSG(rc > 0 && rc < 124, "%s: exit %d:\n%s", what, rc, output);
    CHECK_MSG(strstr(output, path) && strstr(output, why), "%s: no '%s' or '%s' in:\n%s", what, path, why, output);
    if (sum_before >= 0) CHECK_MSG(file_sum(path) == sum_before, "%s: %s changed", what, path);
}

static int is_link(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

static int is_fifo(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISFIFO(st.st_mode);
}

static void check_outputs(const char *dir, const char *ckpt, const char *other_ckpt) {
    char out[1024], link[1024], fifo[1024], text[1024];
    long sum = file_sum(ckpt), other_sum = file_sum(other_ckpt);
    CHECK(sum >= 0 && other_sum >= 0);

    expect_refused("export --out the checkpoint", ckpt, "which this command reads", sum,
                   trainc("export --checkpoint '%s' --format safetensors --out '%s'", ckpt, ckpt));
    expect_refused("export --out another checkpoint", other_ckpt, "holds a trainc checkpoint", other_sum,
                   trainc("export --checkpoint '%s' --format safetensors --out '%s'", ckpt, other_ckpt));
    expect_refused("eval --csv the checkpoint", ckpt, "which this command reads", sum,
                   trainc("eval --checkpoint '%s' " DATA " --csv '%s' --quiet", ckpt, ckpt));
    expect_refused("metrics_file a checkpoint", other_ckpt, "holds a trainc checkpoint", other_sum,
                   trainc(DATA " --set run.max_steps=2 --set run.metrics_file='%s' --quiet", other_ckpt));
    snprintf(text, sizeof text, "%s/notes.txt", dir);
    test_write_file(dir, "notes.txt", "my notes\n", 9);
    long text_sum = file_sum(text);
    expect_refused("export --out a file export did not make", text, "never replaces a file it did not make",
                   text_sum, trainc("export --checkpoint '%s' --format safetensors --out '%s'", ckpt, text));

    /* A symlink is written through: the link stays, the file it names is the export. */
    snprintf(out, sizeof out, "%s/model.safetensors", dir);
    snprintf(link, sizeof link, "%s/link.safetensors", dir);
    CHECK(symlink("model.safetensors", link) == 0);
    int rc = trainc("export --checkpoint '%s' --format safetensors --out '%s'", ckpt, link);
    CHECK_MSG(rc == 0, "export --out a dangling symlink: exit %d:\n%s", rc, output);
    struct stat st;
    CHECK_MSG(is_link(link) && stat(out, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 1000,
              "the symlink was replaced, or its file not written");
    rc = trainc("export --checkpoint '%s' --format safetensors --out '%s'", ckpt, link); /* replaces its own */
    CHECK_MSG(rc == 0 && is_link(link), "export again through the symlink: exit %d:\n%s", rc, output);
    snprintf(link, sizeof link, "%s/link.trc", dir);
    CHECK(symlink(ckpt, link) == 0);
    expect_refused("export --out a symlink to the checkpoint", ckpt, "which this command reads", sum,
                   trainc("export --checkpoint '%s' --format safetensors --out '%s'", ckpt, link));
    CHECK(is_link(link));

    /* A FIFO: export refuses it, eval's CSV to a FIFO no one reads is refused at once; both leave it a FIFO. */
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    expect_refused("export --out a FIFO", fifo, "a FIFO", -1,
                   trainc("export --checkpoint '%s' --format safetensors --out '%s'", ckpt, fifo));
    expect_refused("eval --csv a FIFO no one reads", fifo, "no process reads", -1,
                   trainc("eval --checkpoint '%s' " DATA " --csv '%s' --quiet", ckpt, fifo));
    CHECK(is_fifo(fifo));
    expect_refused("eval --csv a directory", dir, "Is a directory", -1,
                   trainc("eval --checkpoint '%s' " DATA " --csv '%s' --quiet", ckpt, dir));
    rc = trainc("eval --checkpoint '%s' " DATA " --csv /dev/null --quiet", ckpt);
    CHECK_MSG(rc == 0, "eval --csv /dev/null: exit %d:\n%s", rc, output);
}

/* The stream writer into a FIFO with a reader: written through, the FIFO stays. */
static void check_fifo_with_reader(const char *dir) {
    char fifo[1024], err[4400];
    snprintf(fifo, sizeof fifo, "%s/fifo-read", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK);
    CHECK(rd >= 0);
    FILE *f = files_open_output(fifo, 0, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (f) {
        fputs("a,b\n", f);
        fclose(f);
    }
    char got[16] = "";
    CHECK(rd >= 0 && read(rd, got, sizeof got - 1) == 4 && strcmp(got, "a,b\n") == 0);
    if (rd >= 0) close(rd);
    CHECK(is_fifo(fifo));
}

/* files_rename_noreplace leaves an existing file as it was. */
static void check_rename_noreplace(const char *dir) {
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s", test_write_file(dir, "a.txt", "new", 3));
    snprintf(b, sizeof b, "%s", test_write_file(dir, "b.txt", "old", 3));
    CHECK(files_rename_noreplace(a, b) != 0 && errno == EEXIST);
    char *kept = test_read_file(b);
    CHECK(kept && strcmp(kept, "old") == 0 && access(a, F_OK) == 0);
    free(kept);
    unlink(b);
    CHECK(files_rename_noreplace(a, b) == 0 && access(a, F_OK) != 0 && access(b, F_OK) == 0);
}

/* A run that goes on for a while in the background, writing a checkpoint every 5 steps into ckdir. */
static pid_t start_long_run(const char *ckdir, const char *log) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec '%s/trainc' " DATA " --set run.epochs=1000 --set run.max_steps=100000 "
             "--set run.checkpoint_every=5 --set run.keep_checkpoints=0 --set run.checkpoint_dir='%s' --quiet "
             ">'%s' 2>&1", test_build_dir(), ckdir, log);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int count_checkpoints(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c '^ckpt-.*\\.trc$'", dir);
    char out[64];
    test_run_command(cmd, out, sizeof out);
    return atoi(out);
}

/* Two runs on one folder: the second (fresh or --resume latest) is refused
 * naming the first's pid and host while the first goes on; the first's
 * checkpoints are all there, and it resumes after. */
static void check_two_runs(const char *dir) {
    char ckdir[1024], log[1024], pid_text[64];
    snprintf(ckdir, sizeof ckdir, "%s/shared-ckpt", dir);
    snprintf(log, sizeof log, "%s/first.log", dir);
    pid_t first = start_long_run(ckdir, log);
    for (int i = 0; i < 300 && count_checkpoints(ckdir) < 2; i++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK_MSG(count_checkpoints(ckdir) >= 2, "the first run wrote no checkpoints");
    snprintf(pid_text, sizeof pid_text, "pid %d", (int)first);
    const char *second_args[] = {"", "--resume latest"};
    for (int k = 0; k < 2; k++) {
        int rc = trainc(DATA " --set run.max_steps=40 --set run.checkpoint_every=5 --set run.checkpoint_dir='%s' "
                        "%s --quiet", ckdir, second_args[k]);
        CHECK_MSG(rc > 0 && rc < 124 && strstr(output, ckdir) && strstr(output, pid_text) &&
                  strstr(output, "in use"), "a second run (%s) on the first's folder: exit %d:\n%s",
                  second_args[k], rc, output);
    }
    kill(first, SIGTERM);
    int status = 0;
    waitpid(first, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "the first run: status %d", status);
    /* Every step the first run saved is there, each file whole. */
    char cmd[1200], listing[8192];
    snprintf(cmd, sizeof cmd, "ls '%s'", ckdir);
    test_run_command(cmd, listing, sizeof listing);
    int n = 0;
    long latest = 0;
    for (char *line = strtok(listing, "\n"); line; line = strtok(NULL, "\n")) {
        char path[2200], err[4400];
        CHECK_MSG(strstr(line, ".tmp.") == NULL, "a temporary file left: %s", line);
        if (strncmp(line, "ckpt-", 5) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", ckdir, line);
        CkptFile *f = ckpt_open(path, err, sizeof err);
        CHECK_MSG(f != NULL, "%s", err);
        ckpt_close(f);
        long step = strtol(line + 5, NULL, 10);
        latest = step > latest ? step : latest;
        n++;
    }
    CHECK_MSG(n >= 2, "%d checkpoints after the runs", n);
    /* The lock went with the first run: the folder is free to resume. */
    int rc = trainc(DATA " --set run.epochs=1000 --set run.max_steps=%ld --set run.checkpoint_every=5 "
                    "--set run.checkpoint_dir='%s' --resume latest --quiet", latest + 1, ckdir);
    CHECK_MSG(rc == 0, "resume after the first run ended: exit %d:\n%s", rc, output);
}

/* A checkpoint that cannot be written (its temporary file's name taken by a
 * folder) is a warning while the run goes on, and the run ends with exit
 * status 1 saying so (and the summary's checkpoints_failed); a checkpoint folder that cannot be made stops the run at
 * its start. */
static void check_failed_checkpoints(const char *dir) {
    char ckdir[1024], log[1100], blocker[1200], cmd[4096];
    snprintf(ckdir, sizeof ckdir, "%s/failing-ckpt", dir);
    snprintf(log, sizeof log, "%s/failing.log", dir);
    snprintf(cmd, sizeof cmd, "exec '%s/trainc' " DATA " --set run.max_steps=3 --set run.checkpoint_every=1 "
             "--set run.checkpoint_dir='%s' --quiet", test_build_dir(), ckdir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        snprintf(blocker, sizeof blocker, "%s/ckpt-00000002.trc.tmp.%d", ckdir, (int)getpid());
        if (files_make_dirs(blocker) != 0) _exit(126);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1), dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL); /* exec: trainc runs in this pid */
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    char *text = test_read_file(log);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 1 && text &&
              strstr(text, "1 checkpoint asked for was not written") && strstr(text, "\"checkpoints_failed\": 1"),
              "status %d:\n%s", status, text ? text : "");
    free(text);
    int rc = trainc(DATA " --set run.max_steps=2 --set run.checkpoint_every=1 --set run.checkpoint_dir='%s/notes.txt/ck' "
                    "--quiet", dir);
    CHECK_MSG(rc == 1 && strstr(output, "run.checkpoint_dir") && strstr(output, "notes.txt"),
              "a checkpoint folder under a file: exit %d:\n%s", rc, output);
}

int main(void) {
    const char *dir = test_tmpdir("outputs");
    char ckdir[1024], ckpt[1200], other[1200];
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    int rc = trainc(DATA " --set run.max_steps=2 --set run.checkpoint_every=1 --set run.checkpoint_dir='%s' --quiet",
                    ckdir);
    CHECK_MSG(rc == 0, "the run that makes the checkpoints: exit %d:\n%s", rc, output);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-00000002.trc", ckdir);
    snprintf(other, sizeof other, "%s/ckpt-00000001.trc", ckdir);
    if (rc == 0) check_outputs(dir, ckpt, other);
    check_fifo_with_reader(dir);
    check_rename_noreplace(dir);
    check_two_runs(dir);
    check_failed_checkpoints(dir);
    return test_finish("test_outputs");
}
