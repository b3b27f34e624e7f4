/* Watching and sizing a run, on the CPU through the trainc program:
 * run.profile_steps errors name the key; the summary's phase breakdown adds up
 * to the step time; the metrics file is JSON lines; the Prometheus endpoint
 * answers GET /metrics on loopback; find-batch prints its table and a best
 * batch; an impossible batch ends with an out-of-memory message. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"

static char output[1 << 17];

static const char *trainc_path(void) {
    static char path[1024];
    const char *build = getenv("TRAINC_BUILD_DIR");
    snprintf(path, sizeof path, "%s/trainc", build ? build : "build");
    return path;
}

/* Runs trainc with args (a shell fragment), stdout and stderr into output. */
static int trainc(const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", trainc_path(), args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* 16x16 synthetic images on the CPU: a step takes milliseconds. */
#define SMALL "--config configs/baseline.ini --device cpu --set data.source=synthetic --set data.image_size=16 " \
              "--set data.synthetic_train=1024 --set data.synthetic_test=32 --set run.eval=off"

static double field(const char *json, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *p = strstr(json, pattern);
    return p ? strtod(p + strlen(pattern), NULL) : NAN;
}

static void check_profile_steps_errors(void) {
    const char *bad[] = {"5", "3:2", "0:2", "a:b", "2:3x", ":4"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[1024];
        snprintf(args, sizeof args, SMALL " --set run.profile_steps=%s", bad[i]);
        int rc = trainc(args);
        CHECK_MSG(rc != 0 && rc < 128, "run.profile_steps=%s: exit %d", bad[i], rc);
        CHECK_MSG(strstr(output, "run.profile_steps") != NULL, "run.profile_steps=%s: %s", bad[i], output);
    }
    CHECK(trainc(SMALL " --set run.profile_steps=2:3 --set run.max_steps=4 --quiet") == 0);
}

/* Phases add up to the step; every metrics line is one JSON object. */
static void check_phases_and_metrics(const char *dir) {
    char args[2048], metrics[1024];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    unlink(metrics);
    snprintf(args, sizeof args, SMALL " --set train.batch=32 --set run.max_steps=40 --set run.warmup_steps=5 "
             "--set run.log_every=5 --set run.metrics_file=%s", metrics);
    CHECK(trainc(args) == 0);
    CHECK_MSG(strstr(output, "phases, ms per timed step") != NULL, "no phase log line: %s", output);
    const char *summary = strstr(output, "{\"name\"");
    CHECK(summary != NULL);
    if (!summary) return;
    const char *phases = strstr(summary, "\"phase_ms\": {");
    CHECK_MSG(phases != NULL, "no phase_ms: %s", summary);
    if (!phases) return;
    double wait = field(phases, "data_wait"), input = field(phases, "input"), fwd = field(phases, "forward"),
           bwd = field(phases, "backward"), opt = field(phases, "optimizer"), step = field(phases, "step");
    double step_ms = field(summary, "step_ms");
    CHECK_MSG(fwd > 0 && bwd > 0 && opt > 0, "forward %g backward %g optimizer %g", fwd, bwd, opt);
    CHECK_MSG(wait >= 0 && input >= 0, "data_wait %g input %g", wait, input);
    CHECK_NEAR(step, step_ms, 1e-3 * step_ms);
    double sum = wait + input + fwd + bwd + opt;
    CHECK_MSG(fabs(sum - step_ms) <= 0.10 * step_ms, "phases sum to %.3f ms, the step is %.3f ms", sum, step_ms);
    CHECK(strstr(phases, "\"graph\": null") != NULL);

    FILE *f = fopen(metrics, "r");
    CHECK_MSG(f != NULL, "no %s", metrics);
    if (!f) return;
    char line[4096];
    int lines = 0, steps = 0;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        CHECK_MSG(n > 0 && line[n - 1] == '\n', "unterminated line %d", lines + 1);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        lines++;
        /* one object: starts with {, ends with }, braces balanced outside strings, quotes paired */
        int depth = 0, in_string = 0, ok = n >= 2 && line[0] == '{' && line[n - 1] == '}';
        for (size_t i = 0; i < n && ok; i++) {
            char c = line[i];
            if (in_string) {
                if (c == '\\') i++;
                else if (c == '"') in_string = 0;
            } else if (c == '"') {
                in_string = 1;
            } else if (c == '{') {
                depth++;
            } else if (c == '}') {
                depth--;
                if (depth == 0 && i != n - 1) ok = 0;
            }
        }
        CHECK_MSG(ok && depth == 0 && !in_string, "metrics line %d is not one JSON object: %s", lines, line);
        if (strncmp(line, "{\"step\": ", 9) == 0) steps++;
    }
    fclose(f);
    CHECK_MSG(steps == 8, "%d step lines in the metrics file, expected 8", steps);
}

/* A free loopback port: bind port 0 and see what the kernel gave. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* GET /metrics from 127.0.0.1:port into buf; bytes read, or -1 (not listening yet). */
static int http_get_metrics(int port, char *buf, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1)) {
        close(fd);
        return -1;
    }
    size_t n = 0;
    for (int polls = 0; n + 1 < cap && polls < 50; polls++) { /* at most 5 s */
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t got = recv(fd, buf + n, cap - 1 - n, 0);
        if (got <= 0) break;
        n += (size_t)got;
    }
    buf[n] = 0;
    close(fd);
    return (int)n;
}

static void check_prometheus(const char *dir) {
    int port = free_port();
    CHECK(port > 0);
    if (port <= 0) return;
    char portset[64], ckdir[1024];
    snprintf(portset, sizeof portset, "monitor.prometheus_port=%d", port);
    snprintf(ckdir, sizeof ckdir, "run.checkpoint_dir=%s/prom-ckpt", dir);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout)) _exit(126);
        execl(trainc_path(), "trainc", "--config", "configs/baseline.ini", "--device", "cpu", "--quiet", "--set",
              "data.source=synthetic", "--set", "data.image_size=16", "--set", "data.synthetic_train=1024", "--set",
              "data.synthetic_test=32", "--set", "run.eval=off", "--set", "run.epochs=1000", "--set",
              "run.max_steps=100000", "--set", "run.log_every=2", "--set", ckdir, "--set", portset, (char *)NULL);
        _exit(127);
    }
    static char body[1 << 16];
    int got = -1;
    /* Bounded: at most 100 tries, 0.1 s apart, until the gauges have values. */
    for (int tries = 0; tries < 100; tries++) {
        got = http_get_metrics(port, body, sizeof body);
        if (got > 0 && strstr(body, "\ntrainc_step ") && !strstr(body, "\ntrainc_step NaN")) break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK_MSG(got > 0, "no answer from 127.0.0.1:%d/metrics", port);
    CHECK_MSG(strncmp(body, "HTTP/1.1 200", 12) == 0, "answer: %.200s", body);
    const char *names[] = {"trainc_samples_per_second", "trainc_loss", "trainc_loss_scale",
                           "trainc_skipped_steps_total", "trainc_data_wait_fraction", "trainc_step",
                           "trainc_gpu_utilization_ratio", "trainc_gpu_memory_used_bytes",
                           "trainc_gpu_temperature_celsius", "trainc_gpu_power_watts"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char help[128], type[128];
        snprintf(help, sizeof help, "# HELP %s ", names[i]);
        snprintf(type, sizeof type, "# TYPE %s gauge\n", names[i]);
        CHECK_MSG(strstr(body, help) && strstr(body, type), "no %s in:\n%s", names[i], body);
    }
    CHECK_MSG(strstr(body, "\ntrainc_step ") && !strstr(body, "\ntrainc_step NaN"), "trainc_step unset:\n%s", body);
    /* SIGTERM: the run stops after its step (with a checkpoint in the scratch dir) and the server with it. */
    kill(pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100 && waitpid(pid, &status, WNOHANG) == 0; i++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (i == 99) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECK_MSG(0, "trainc did not stop within 10 s of SIGTERM");
        }
    }
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "exit status %d", status);
    CHECK_MSG(http_get_metrics(port, body, sizeof body) < 0, "the endpoint still answers after the run");

    /* A port in use is refused naming the key and the port. */
    char args[1024];
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener >= 0 && bind(listener, (struct sockaddr *)&a, sizeof a) == 0 && listen(listener, 1) == 0 &&
        getsockname(listener, (struct sockaddr *)&a, &len) == 0) {
        int busy = ntohs(a.sin_port);
        snprintf(args, sizeof args, SMALL " --set run.max_steps=2 --set monitor.prometheus_port=%d", busy);
        int rc = trainc(args);
        char needle[64];
        snprintf(needle, sizeof needle, "monitor.prometheus_port = %d", busy);
        CHECK_MSG(rc != 0 && rc < 128 && strstr(output, needle), "busy port: exit %d: %s", rc, output);
    }
    if (listener >= 0) close(listener);
}

static void check_find_batch(void) {
    int rc = trainc("find-batch " SMALL " --set train.batch=8 --max-batch 64");
    CHECK_MSG(rc == 0, "find-batch exited %d: %s", rc, output);
    CHECK_MSG(strstr(output, "samples/s") && strstr(output, "peak MiB"), "no table header: %s", output);
    CHECK_MSG(strstr(output, "\n         8 ") != NULL, "no row for batch 8: %s", output);
    const char *best = strstr(output, "best batch: ");
    CHECK_MSG(best != NULL, "no best batch: %s", output);
    if (best) {
        long b = strtol(best + 12, NULL, 10);
        CHECK_MSG(b == 8 || b == 16 || b == 32 || b == 64, "best batch %ld", b);
    }
    CHECK(strstr(output, "stopped: ") != NULL);
}

/* A batch no memory holds ends with the out-of-memory message, not a crash. */
static void check_impossible_batch(void) {
    int rc = trainc("--config configs/baseline.ini --device cpu --set data.source=synthetic "
                    "--set data.synthetic_train=64 --set data.synthetic_test=8 --set train.batch=1000000");
    CHECK_MSG(rc == 1, "exit %d: %s", rc, output);
    CHECK_MSG(strstr(output, "out of host memory") != NULL, "no out-of-memory message: %s", output);
}

int main(void) {
    const char *dir = test_tmpdir("monitoring");
    check_profile_steps_errors();
    check_phases_and_metrics(dir);
    check_prometheus(dir);
    check_find_batch();
    check_impossible_batch();
    return test_finish("test_monitoring");
}
