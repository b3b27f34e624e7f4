/* The trainc program as a user meets it: bad configs and missing data end with
 * one message naming the file, line or key and a non-zero exit; a short run
 * ends with the summary JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/harness.h"

static char output[1 << 16];

/* Runs trainc with args (a shell fragment); returns its exit status. */
static int trainc(const char *args) {
    const char *build = getenv("TRAINC_BUILD_DIR");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/trainc %s 2>&1", build ? build : "build", args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

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
    expect_error("--config configs/baseline.ini --set train.batchh=3", "train.batchh");
    expect_error("--config configs/baseline.ini --set train.batch=0 --device cpu", "train.batch");
    expect_error("--config configs/baseline.ini --set data.image_size=36 --device cpu "
                 "--set data.source=synthetic --set data.synthetic_train=64 --set data.synthetic_test=8",
                 "data.image_size");
    expect_error("--config configs/baseline.ini --device cpu --set data.path=/nonexistent/cifar",
                 "/nonexistent/cifar");
    expect_error("--bogus", "--bogus");

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
                 "--set run.epochs=1 --set run.warmup_steps=2") == 0);
    const char *last = strstr(output, "{\"name\""); /* the summary line (phase_ms nests an object) */
    CHECK(last != NULL);
    if (last) {
        const char *keys[] = {"\"samples_per_s\"", "\"epoch_s\"", "\"gpu_util\"", "\"peak_mem_bytes\"",
                              "\"test_acc\"", "\"steps\": 8", "\"device\": \"cpu\""};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
            CHECK_MSG(strstr(last, keys[i]) != NULL, "summary lacks %s: %s", keys[i], last);
    }
    return test_finish("test_trainc_cli");
}
