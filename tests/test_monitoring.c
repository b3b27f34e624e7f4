/* Watching and sizing a run, on the CPU through the trainc program:
 * run.profile_steps errors name the key; the JSON writer escapes what it must;
 * the summary's phase breakdown adds up to the step time and its run.name
 * reads back whatever it holds; the metrics file is JSON lines whose epochs
 * are the log's; the log lines through a pipe carry the interval's loss and
 * accuracy, the schedule's lr and the time left, as the metrics file does; a
 * metrics file that cannot be opened is one message; the
 * Prometheus endpoint answers GET /metrics on loopback, types its counter and
 * lists a metric only once it has a value; find-batch prints its table and a
 * best batch, and words a slowdown as one; an impossible batch ends with an
 * out-of-memory message; lab_table.py says why a run gave 0 samples/s and
 * plot_run.py's axes hold the data (both where python3 is installed). */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "runtime/gpu_monitor.h"
#include "runtime/json_out.h"
#include "runtime/log.h"
#include "runtime/prometheus.h"
#include "tests/harness.h"
#include "tools/trainer/find_batch.h"

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
              "--set data.synthetic_train=1024 --set data.synthetic_test=32 --set run.eval=off --set run.save_final=off"

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

/* Whether bytes are well-formed UTF-8 (no overlongs, no surrogates). */
static int is_utf8(const char *text) {
    const unsigned char *p = (const unsigned char *)text;
    while (*p) {
        int n = *p < 0x80 ? 1 : *p >= 0xc2 && *p < 0xe0 ? 2 : *p >= 0xe0 && *p < 0xf0 ? 3 : *p >= 0xf0 && *p < 0xf5 ? 4 : 0;
        if (!n) return 0;
        for (int i = 1; i < n; i++)
            if ((p[i] & 0xc0) != 0x80) return 0;
        if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) || (p[0] == 0xf0 && p[1] < 0x90) ||
            (p[0] == 0xf4 && p[1] > 0x8f))
            return 0;
        p += n;
    }
    return 1;
}

/* A line JSON readers take: UTF-8, no control bytes (they must be escaped). */
static int strict_json_text(const char *line) {
    for (const unsigned char *p = (const unsigned char *)line; *p; p++)
        if (*p < 0x20) return 0;
    return is_utf8(line);
}

static int python3_found(void) { return system("command -v python3 >/dev/null 2>&1") == 0; }

/* The string under key in a parsed object, or NULL. */
static const char *json_text(const cJSON *obj, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(item) ? item->valuestring : NULL;
}

static double json_num(const cJSON *obj, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(item) ? item->valuedouble : NAN;
}

/* The writer: strings escaped (and repaired to UTF-8), json.dumps's separators,
 * non-finite numbers as null, integers exact. */
static void check_json_writer(void) {
    static const char tricky[] = "q\"uo\"te \\back\\slash\\ new\nline tab\t cr\r bell\x01 del\x7f "
                                 "\xc3\xbcn\xc3\xaf \xe2\x9c\x93 \xf0\x9f\x98\x80 </script>";
    cJSON *o = json_object_new();
    json_add_string(o, "name", tricky);
    json_add_string(o, "bad utf-8", "a\xff" "b\xc3" "c\xe0\x80\x80" "d\xed\xa0\x80" "e\xc3\xa9");
    json_add_string(o, "none", NULL);
    json_add_number(o, "pi", 3.14159265358979, 6);
    json_add_number(o, "nan", NAN, 6);
    json_add_number(o, "inf", -INFINITY, 6);
    json_add_int(o, "big", 9007199254740993LL); /* 2^53 + 1: a double would lose the 1 */
    json_add_bool(o, "yes", 1);
    json_add_number(json_add_object(o, "inner"), "x", 0.25, 6);
    char *line = json_line(o);
    cJSON_Delete(o);
    CHECK_MSG(strict_json_text(line), "control bytes or bad UTF-8 in: %s", line);
    CHECK_MSG(strchr(line, '\n') == NULL, "a newline in the line: %s", line);
    const char *tail = strstr(line, "\"pi\": ");
    CHECK_MSG(tail && strcmp(tail, "\"pi\": 3.14159, \"nan\": null, \"inf\": null, \"big\": 9007199254740993, "
                                   "\"yes\": true, \"inner\": {\"x\": 0.25}}") == 0, "line: %s", line);
    cJSON *back = cJSON_Parse(line);
    CHECK_MSG(back != NULL, "cJSON cannot read back: %s", line);
    const char *name = json_text(back, "name");
    CHECK_MSG(name && strcmp(name, tricky) == 0, "name read back as %s", name ? name : "(none)");
    const char *repaired = json_text(back, "bad utf-8");
    static const char want_repaired[] = "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                                        "d\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "e\xc3\xa9";
    CHECK_MSG(repaired && strcmp(repaired, want_repaired) == 0, "bad UTF-8 became %s", repaired ? repaired : "?");
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(back, "none")));
    cJSON_Delete(back);
    free(line);

    /* A write that fails says so. */
    FILE *full = fopen("/dev/full", "w");
    if (full) {
        CHECK(json_write_line(full, json_object_new()) == -1 && errno == ENOSPC);
        fclose(full);
    }
}

/* The log's "] step S/N  epoch E/" for step S, E from 1; -1 when no such line. */
static int log_epoch_of_step(long step) {
    char needle[64];
    snprintf(needle, sizeof needle, "] step %ld/", step);
    for (const char *p = strstr(output, needle); p; p = strstr(p + 1, needle)) {
        const char *end = strchr(p, '\n'), *e = strstr(p, "  epoch ");
        if (e && (!end || e < end)) return atoi(e + 8);
    }
    return -1;
}

/* Phases add up to the step; the summary reads back with its odd run.name;
 * every metrics line is one JSON object, and its epochs are the log's. The
 * run: 2 epochs of 32 steps cut at step 42, step 41 skipped (NaN) and found
 * only by the read-back after the loop. */
/* The linear schedule of check_log_lines (optim.lr 0.1 to 0 over 48 steps):
 * the lr of the step just taken at logged step. */
static double logged_lr(long step) { return 0.1 * (1 - (step - 1) / 48.0); }

/* One log line of check_log_lines, "step 8/48  epoch 1/1.5  images 256/1024
 * 512 img/s  data wait 0%  lr 0.08542  loss 2.2 (mean of 8 steps)  train acc
 * 18.4%  epoch left 0:01  run left 0:02": its fields parse, the lr is the
 * schedule's, the accuracy a share. Returns the step (-1: none parsed). */
static long check_log_line(const char *line, double *acc_pct) {
    long step, total, steps;
    double lr, loss, rate;
    int m, s;
    const char *lr_at = strstr(line, "  lr "), *loss_at = strstr(line, "  loss "), *acc_at = strstr(line, "train acc ");
    const char *rate_at = strstr(line, " img/s"), *left_at = strstr(line, "run left ");
    CHECK_MSG(lr_at && loss_at && acc_at && rate_at && left_at, "log line without its fields: %.300s", line);
    if (!(lr_at && loss_at && acc_at && rate_at && left_at)) return -1;
    while (rate_at > line && rate_at[-1] != ' ') rate_at--;
    int parsed = sscanf(line, "step %ld/%ld", &step, &total) == 2 && sscanf(lr_at, "  lr %lf", &lr) == 1 &&
                 sscanf(loss_at, "  loss %lf (mean of %ld steps)", &loss, &steps) == 2 &&
                 sscanf(acc_at, "train acc %lf%%", acc_pct) == 1 && sscanf(rate_at, "%lf", &rate) == 1 &&
                 sscanf(left_at, "run left %d:%d", &m, &s) == 2;
    CHECK_MSG(parsed, "log line does not parse: %.300s", line);
    if (!parsed) return -1;
    CHECK_MSG(total == 48 && step % 8 == 0 && steps == 8, "step %ld/%ld over %ld steps: %.300s", step, total, steps,
              line);
    CHECK_MSG(fabs(lr - logged_lr(step)) <= 1e-3 * logged_lr(step), "step %ld: lr %g, the schedule's %g", step, lr,
              logged_lr(step));
    CHECK_MSG(isfinite(loss) && loss >= 0 && rate > 0, "step %ld: loss %g, %g img/s", step, loss, rate);
    CHECK_MSG(*acc_pct >= 0 && *acc_pct <= 100, "step %ld: train acc %g%%", step, *acc_pct);
    CHECK_MSG(m >= 0 && s >= 0 && s < 60 && (step < 48 || m * 60 + s == 0), "step %ld: run left %d:%02d", step, m, s);
    return step;
}

/* The log lines through a pipe (not a terminal) and the metrics file carry
 * the same figures: the interval's mean loss and training accuracy, the
 * schedule's lr, samples/s and the time left. memory.accumulate = 2 and no
 * read-back between log points: the sums span the interval's micro-batches. */
static void check_log_lines(const char *dir) {
    char args[2048], metrics[1024];
    snprintf(metrics, sizeof metrics, "%s/log_lines.jsonl", dir);
    unlink(metrics);
    snprintf(args, sizeof args, SMALL " --set train.batch=16 --set memory.accumulate=2 --set run.epochs=1.5 "
             "--set run.log_every=8 --set train.read_loss_every=0 --set train.sync_after_step=off "
             "--set optim.schedule=linear --set optim.lr=0.1 --set optim.final_lr=0 --set run.metrics_file=%s",
             metrics);
    CHECK_MSG(trainc(args) == 0, "%s", output);
    double acc_pct[7] = {0};
    int lines = 0;
    for (const char *p = strstr(output, "] step "); p; p = strstr(p + 1, "] step ")) {
        double pct;
        long step = check_log_line(p + 2, &pct);
        if (step > 0 && step <= 48) acc_pct[step / 8] = pct;
        lines++;
    }
    CHECK_MSG(lines == 6, "%d log lines, expected 6: %s", lines, output);
    FILE *f = fopen(metrics, "r");
    CHECK_MSG(f != NULL, "no %s", metrics);
    if (!f) return;
    char line[4096];
    int steps = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        double step = json_num(o, "step"), acc = json_num(o, "train_acc"), lr = json_num(o, "lr");
        if (cJSON_GetObjectItemCaseSensitive(o, "loss")) {
            steps++;
            CHECK_MSG(json_num(o, "total_steps") == 48 && json_num(o, "loss_steps") == 8 && json_num(o, "loss") >= 0 &&
                      json_num(o, "samples_per_s") > 0 && json_num(o, "eta_s") >= 0, "metrics line: %s", line);
            CHECK_MSG(acc >= 0 && acc <= 1 && fabs(100 * acc - acc_pct[(int)step / 8 % 7]) <= 0.051,
                      "metrics line: train_acc %g, the log's %g%%: %s", acc, acc_pct[(int)step / 8 % 7], line);
            CHECK_MSG(fabs(lr - logged_lr((long)step)) <= 1e-5 * logged_lr((long)step), "metrics lr %g, schedule %g",
                      lr, logged_lr((long)step));
        }
        cJSON_Delete(o);
    }
    fclose(f);
    CHECK_MSG(steps == 6, "%d step lines in %s, expected 6", steps, metrics);
}

static void check_phases_and_metrics(const char *dir) {
    /* In single quotes for the shell: tab, quotes, backslashes, a control byte, UTF-8. */
    static const char name[] = "odd\t\"name\" \\with\\ \x01 \xc3\xbcn\xc3\xaf\xe2\x9c\x93";
    char args[2048], metrics[1024];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    unlink(metrics);
    snprintf(args, sizeof args, SMALL " --set train.batch=32 --set run.max_steps=42 --set run.warmup_steps=5 "
             "--set run.log_every=5 --set train.read_loss_every=0 --set run.inject_nan_step=41 "
             "--set run.metrics_file=%s --set 'run.name=%s'", metrics, name);
    CHECK_MSG(trainc(args) == 0, "%s", output);
    CHECK_MSG(strstr(output, "phases, ms per timed step") != NULL, "no phase log line: %s", output);
    const char *summary = strstr(output, "{\"name\"");
    CHECK(summary != NULL);
    if (!summary) return;
    char summary_line[8192];
    snprintf(summary_line, sizeof summary_line, "%.*s", (int)strcspn(summary, "\n"), summary);
    CHECK_MSG(strict_json_text(summary_line), "summary not strict JSON text: %s", summary_line);
    cJSON *parsed = cJSON_Parse(summary_line);
    CHECK_MSG(parsed != NULL, "summary is not JSON: %s", summary_line);
    const char *name_back = json_text(parsed, "name");
    CHECK_MSG(name_back && strcmp(name_back, name) == 0, "run.name read back as %s", name_back ? name_back : "?");
    CHECK(json_num(parsed, "skipped_steps") == 1 && json_num(parsed, "steps") == 42);
    cJSON_Delete(parsed);
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
    int lines = 0, steps = 0, epoch_ends = 0, skipped_lines = 0;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        CHECK_MSG(n > 0 && line[n - 1] == '\n', "unterminated line %d", lines + 1);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        lines++;
        cJSON *obj = cJSON_Parse(line);
        CHECK_MSG(cJSON_IsObject(obj) && strict_json_text(line), "metrics line %d is not one JSON object: %s",
                  lines, line);
        double step_no = json_num(obj, "step"), epoch = json_num(obj, "epoch");
        if (cJSON_GetObjectItemCaseSensitive(obj, "loss")) {
            steps++;
            int logged = log_epoch_of_step((long)step_no);
            CHECK_MSG(epoch == logged && epoch == (step_no <= 32 ? 1 : 2),
                      "metrics line %d: epoch %g for step %g, the log says epoch %d", lines, epoch, step_no, logged);
        } else if (cJSON_GetObjectItemCaseSensitive(obj, "skipped_steps")) {
            skipped_lines++;
            CHECK_MSG(step_no == 42 && epoch == 2 && json_num(obj, "skipped_steps") == 1,
                      "skipped-steps line: %s (expected step 42 of epoch 2)", line);
        } else if (cJSON_GetObjectItemCaseSensitive(obj, "epoch_end")) {
            epoch_ends++;
            double ended = json_num(obj, "epoch_end");
            CHECK_MSG((ended == 1 && step_no == 32) || (ended == 2 && step_no == 42), "epoch line: %s", line);
        }
        cJSON_Delete(obj);
    }
    fclose(f);
    CHECK_MSG(steps == 8, "%d step lines in the metrics file, expected 8", steps);
    CHECK_MSG(epoch_ends == 2 && skipped_lines == 1, "%d epoch lines, %d skipped-steps lines", epoch_ends,
              skipped_lines);
}

/* A metrics file that cannot be opened: the path and the system's reason, exit 1. */
static void check_metrics_file_errors(const char *dir) {
    const char *paths[] = {"no/such/dir/m.jsonl", ""}; /* "": the directory itself */
    int errs[] = {ENOENT, EISDIR};
    for (int i = 0; i < 2; i++) {
        char path[1024], args[2048], needle[1200];
        snprintf(path, sizeof path, "%s/%s", dir, paths[i]);
        snprintf(args, sizeof args, SMALL " --set run.max_steps=2 --set run.metrics_file=%s", path);
        int rc = trainc(args);
        snprintf(needle, sizeof needle, "run.metrics_file = %s: cannot open it for appending: %s", path,
                 strerror(errs[i]));
        CHECK_MSG(rc == 1 && strstr(output, needle), "metrics file %s: exit %d: %s", path, rc, output);
        CHECK_MSG(strstr(output, "{\"name\"") == NULL, "a summary after the error: %s", output);
    }
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

/* The request req sent to 127.0.0.1:port, the answer into buf; bytes read, or -1 (not listening yet). */
static int http_request(int port, const char *req, char *buf, size_t cap) {
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
    if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
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

/* GET /metrics from 127.0.0.1:port into buf; bytes read, or -1 (not listening yet). */
static int http_get_metrics(int port, char *buf, size_t cap) {
    return http_request(port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", buf, cap);
}

/* Clients that each send one byte every 150 ms (the start of a request that
 * never ends), from a thread, until told to stop or 20 s have passed. */
typedef struct {
    int port, n;
    int fds[24];
    atomic_int stop;
    pthread_t thread;
} SlowClients;

static void *trickle(void *arg) {
    SlowClients *c = arg;
    for (int pass = 0; pass < 133 && !atomic_load(&c->stop); pass++) {
        for (int i = 0; i < c->n; i++)
            if (c->fds[i] >= 0) send(c->fds[i], "G", 1, MSG_NOSIGNAL);
        struct timespec ts = {0, 150 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void slow_clients_start(SlowClients *c, int port, int n) {
    c->port = port;
    c->n = n;
    atomic_init(&c->stop, 0);
    for (int i = 0; i < n; i++) {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        c->fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (c->fds[i] >= 0 && connect(c->fds[i], (struct sockaddr *)&a, sizeof a) != 0) {
            close(c->fds[i]);
            c->fds[i] = -1;
        }
    }
    if (pthread_create(&c->thread, NULL, trickle, c) != 0) c->n = 0, c->thread = pthread_self();
    struct timespec ts = {0, 300 * 1000 * 1000}; /* the server has taken them and read a byte or two */
    nanosleep(&ts, NULL);
}

static void slow_clients_stop(SlowClients *c) {
    atomic_store(&c->stop, 1);
    if (!pthread_equal(c->thread, pthread_self())) pthread_join(c->thread, NULL);
    for (int i = 0; i < c->n; i++)
        if (c->fds[i] >= 0) close(c->fds[i]);
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Slow clients (1 and 20 of them) keep no scrape out, and the server stops at
 * once with them still connected. */
static void check_prometheus_slow_clients(void) {
    int counts[] = {1, 20};
    for (int k = 0; k < 2; k++) {
        char err[256];
        PromServer *s = prom_start(0, err, sizeof err);
        CHECK_MSG(s != NULL, "prom_start: %s", err);
        if (!s) return;
        prom_declare(s, "test_level", "A level.", PROM_GAUGE);
        prom_set(s, "test_level", 7);
        SlowClients slow;
        slow_clients_start(&slow, prom_port(s), counts[k]);
        static char body[1 << 14];
        double start = seconds_now();
        int got = http_get_metrics(prom_port(s), body, sizeof body);
        double took = seconds_now() - start;
        CHECK_MSG(got > 0 && strstr(body, "\ntest_level 7\n") && took < 1.0,
                  "%d slow clients: a scrape took %.2f s: %.200s", counts[k], took, got > 0 ? body : "");
        start = seconds_now();
        prom_stop(s);
        took = seconds_now() - start;
        CHECK_MSG(took < 0.5, "%d slow clients: prom_stop took %.2f s", counts[k], took);
        slow_clients_stop(&slow);
    }
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
    /* Another method: 405 with the methods it takes (RFC 9110 requires Allow there). */
    char other[4096];
    got = http_request(port, "HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", other, sizeof other);
    CHECK_MSG(got > 0 && strncmp(other, "HTTP/1.1 405", 12) == 0 && strstr(other, "\r\nAllow: GET\r\n"),
              "HEAD /metrics: %.300s", other);
    const char *names[][2] = {{"trainc_samples_per_second", "gauge"}, {"trainc_loss", "gauge"},
                              {"trainc_loss_scale", "gauge"},         {"trainc_skipped_steps_total", "counter"},
                              {"trainc_data_wait_fraction", "gauge"}, {"trainc_step", "gauge"}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char help[128], type[128];
        snprintf(help, sizeof help, "# HELP %s ", names[i][0]);
        snprintf(type, sizeof type, "# TYPE %s %s\n", names[i][0], names[i][1]);
        CHECK_MSG(strstr(body, help) && strstr(body, type), "no %s (%s) in:\n%s", names[i][0], names[i][1], body);
    }
    /* A CPU run has no NVML readings: its GPU metrics are absent, not NaN. */
    CHECK_MSG(strstr(body, "trainc_gpu_") == NULL && strstr(body, "NaN") == NULL, "unset metrics listed:\n%s",
              body);
    CHECK_MSG(strstr(body, "\ntrainc_step ") && !strstr(body, "\ntrainc_step NaN"), "trainc_step unset:\n%s", body);
    /* SIGTERM: the run stops after its step (with a checkpoint in the scratch dir) and the server with it, at
     * once, a slow client connected or not. */
    SlowClients slow;
    slow_clients_start(&slow, port, 1);
    got = http_get_metrics(port, body, sizeof body);
    CHECK_MSG(got > 0 && strncmp(body, "HTTP/1.1 200", 12) == 0, "with a slow client: %.200s", got > 0 ? body : "");
    double stopping = seconds_now();
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
    double stopped_in = seconds_now() - stopping;
    slow_clients_stop(&slow);
    CHECK_MSG(stopped_in < 4, "trainc took %.1f s to stop after SIGTERM with a slow client connected", stopped_in);
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

/* The server alone: HELP and TYPE (gauge or counter), nothing before a value. */
static void check_prometheus_exposition(void) {
    char err[256];
    PromServer *s = prom_start(0, err, sizeof err);
    CHECK_MSG(s != NULL, "prom_start: %s", err);
    if (!s) return;
    prom_declare(s, "test_level", "A level.", PROM_GAUGE);
    prom_declare(s, "test_events_total", "Events seen.", PROM_COUNTER);
    char *text = prom_render(s);
    CHECK_MSG(text[0] == 0, "metrics listed before any value:\n%s", text);
    free(text);
    static char body[1 << 14];
    CHECK(http_get_metrics(prom_port(s), body, sizeof body) > 0 && strstr(body, "test_") == NULL);
    prom_set(s, "test_events_total", 3);
    text = prom_render(s);
    CHECK_MSG(strcmp(text, "# HELP test_events_total Events seen.\n# TYPE test_events_total counter\n"
                           "test_events_total 3\n") == 0, "exposition:\n%s", text);
    free(text);
    prom_set(s, "test_level", NAN); /* a value that is NaN is still a value */
    prom_set(s, "test_events_total", 4);
    CHECK(http_get_metrics(prom_port(s), body, sizeof body) > 0);
    CHECK_MSG(strstr(body, "# TYPE test_level gauge\ntest_level NaN\n") &&
              strstr(body, "# TYPE test_events_total counter\ntest_events_total 4\n"), "scraped:\n%s", body);
    prom_set(s, "test_level", 129.421); /* the fewest digits that read back: not 129.42099999999999 */
    text = prom_render(s);
    CHECK_MSG(strstr(text, "\ntest_level 129.421\n") != NULL, "exposition:\n%s", text);
    free(text);
    prom_stop(s);
}

/* find-batch's stop rule words a slowdown as one; it reads a summary with cJSON. */
static void check_find_batch_words(void) {
    char reason[256];
    find_batch_gain_reason(reason, sizeof reason, 64, 70, 100);
    CHECK_MSG(strcmp(reason, "batch 64 was 30.0% slower than batch 32 (fewer samples/s)") == 0, "%s", reason);
    find_batch_gain_reason(reason, sizeof reason, 64, 103, 100);
    CHECK_MSG(strcmp(reason, "batch 64 gave 3.0% more samples/s than batch 32 (less than 5%)") == 0, "%s", reason);
    double sps = 0, peak = 0;
    CHECK(find_batch_read_summary("{\"name\": \"a \\\"samples_per_s\\\": 9\", \"samples_per_s\": 12.5, "
                                  "\"peak_mem_bytes\": 1048576}", &sps, &peak) == 0 && sps == 12.5 && peak == 1048576);
    CHECK(find_batch_read_summary("{\"samples_per_s\": null, \"peak_mem_bytes\": 1}", &sps, &peak) == -1);
    CHECK(find_batch_read_summary("{\"samples_per_s\": 1", &sps, &peak) == -1);
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

/* python3 with args (a shell fragment), stdout and stderr into output. */
static int python3(const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "python3 %s 2>&1", args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* The first line of path that holds part (in a static buffer), or NULL. */
static const char *file_line_with(const char *path, const char *part) {
    static char line[4096];
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    const char *found = NULL;
    while (!found && fgets(line, sizeof line, f))
        if (strstr(line, part)) found = line;
    fclose(f);
    return found;
}

/* lab_table.py --diagnose: each stage's trainc profile findings in the printed
 * table and the markdown report, and the chart's per-phase breakdown of the
 * step (a run that times steps has phase_ms). */
static void check_lab_diagnosis(const char *dir, const char *sets) {
    char args[4096], report[1024], svg[1024];
    snprintf(report, sizeof report, "%s/lab.md", dir);
    snprintf(svg, sizeof svg, "%s/lab.svg", dir);
    snprintf(args, sizeof args, "tools/lab_table.py --trainc %s --configs configs/baseline.ini %s "
             "--set run.warmup_steps=1 --set run.max_steps=3 --diagnose --diagnose-steps 2:3 --csv %s/lab.csv "
             "--svg %s --report %s", trainc_path(), sets, dir, svg, report);
    int rc = python3(args);
    CHECK_MSG(rc == 0 && strstr(output, "diagnosis of trainc baseline (trainc profile --steps 2:3):\n  1. "),
              "lab_table --diagnose: exit %d:\n%s", rc, output);
    CHECK_MSG(file_line_with(report, "## trainc baseline") && file_line_with(report, "1. **"), "%s: no findings",
              report);
    CHECK_MSG(file_line_with(svg, "ms per step by phase") && file_line_with(svg, "<title>backward "),
              "%s: no breakdown of the step", svg);
}

/* lab_table.py: a run that times nothing, or fails, shows why beside its 0. */
static void check_lab_table(const char *dir) {
    char args[4096];
    const char *sets = "--set run.device=cpu --set data.source=synthetic --set data.image_size=16 "
                       "--set data.synthetic_train=256 --set data.synthetic_test=32 --set run.eval=off "
                       "--set train.batch=8 --set run.max_steps=2 --set run.save_final=off";
    snprintf(args, sizeof args, "tools/lab_table.py --trainc %s --configs configs/baseline.ini %s "
             "--set run.warmup_steps=5 --csv %s/lab.csv --svg %s/lab.svg", trainc_path(), sets, dir, dir);
    int rc = python3(args);
    CHECK_MSG(rc == 0 && strstr(output, "trainc baseline") &&
              strstr(output, "no step fell inside the timed window (run.warmup_steps = 5, 2 steps taken)"),
              "lab_table with nothing timed: exit %d:\n%s", rc, output);
    snprintf(args, sizeof args, "tools/lab_table.py --trainc %s --configs configs/baseline.ini %s "
             "--set run.metrics_file=%s/no/such/dir/m.jsonl --csv %s/lab.csv --svg %s/lab.svg", trainc_path(), sets,
             dir, dir, dir);
    rc = python3(args);
    CHECK_MSG(rc == 1 && strstr(output, "(exit status 1: trainc: error: run.metrics_file = ") &&
              strstr(output, "some runs failed"), "lab_table with a failing run: exit %d:\n%s", rc, output);
    check_lab_diagnosis(dir, sets);
}

/* Every point of plot_run.py's hand-drawn SVG lies inside its panel: the axes
 * reach past the data (loss 2.31 over 128 steps once fell off an axis ending
 * at 2 and step 100). */
static void check_plot_run(const char *dir) {
    char metrics[1024], svg[1024], args[4096];
    snprintf(metrics, sizeof metrics, "%s/plot.jsonl", dir);
    snprintf(svg, sizeof svg, "%s/plot.svg", dir);
    FILE *f = fopen(metrics, "w");
    CHECK(f != NULL);
    if (!f) return;
    for (int step = 4; step <= 128; step += 4) /* 32 steps, loss from 2.31 down, one null (a gap) */
        if (step == 64) fprintf(f, "{\"step\": %d, \"epoch\": 1, \"loss\": null, \"samples_per_s\": 1000}\n", step);
        else fprintf(f, "{\"step\": %d, \"epoch\": 1, \"loss\": %.4f, \"samples_per_s\": %d}\n", step,
                     2.31 - step / 100.0, 9000 + 37 * step);
    fprintf(f, "{\"epoch_end\": 1, \"step\": 128, \"epoch_s\": 1.5, \"test_acc\": null}\n");
    fprintf(f, "{\"epoch_end\": 2, \"step\": 96, \"epoch_s\": 1.5, \"test_acc\": 0.31}\n");
    fprintf(f, "{\"epoch_end\": 3, \"step\": 128, \"epoch_s\": 1.5, \"test_acc\": 0.5}\n");
    for (int i = 0; i < 10; i++) fprintf(f, "{\"gpu_sample\": %.1f, \"util\": %d}\n", 50 + 0.5 * i, 91 + i);
    fclose(f);
    const int points = 31 + 32 + 2 + 10; /* loss (less the null), samples/s, test accuracy, GPU utilisation */
    snprintf(args, sizeof args, "tools/plot_run.py %s -o %s --no-matplotlib", metrics, svg);
    int rc = python3(args);
    CHECK_MSG(rc == 0, "plot_run.py: exit %d:\n%s", rc, output);
    f = fopen(svg, "r");
    CHECK_MSG(f != NULL, "no %s", svg);
    if (!f) return;
    static char text[1 << 18];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    double panels[4][4];
    int n_panels = 0, seen = 0, outside = 0;
    for (const char *p = strstr(text, "<rect x="); p && n_panels < 4; p = strstr(p + 1, "<rect x=")) {
        double *r = panels[n_panels];
        if (sscanf(p, "<rect x=\"%lf\" y=\"%lf\" width=\"%lf\" height=\"%lf\"", &r[0], &r[1], &r[2], &r[3]) == 4)
            n_panels++;
    }
    CHECK_MSG(n_panels == 4, "%d panels in %s (loss, samples/s, test accuracy, GPU)", n_panels, svg);
    for (const char *p = strstr(text, "points=\""); p; p = strstr(p, "points=\"")) {
        p += 8;
        double x, y;
        int used;
        while (sscanf(p, "%lf,%lf%n", &x, &y, &used) == 2) {
            int inside = 0;
            for (int i = 0; i < n_panels; i++)
                inside |= x >= panels[i][0] - 0.05 && x <= panels[i][0] + panels[i][2] + 0.05 &&
                          y >= panels[i][1] - 0.05 && y <= panels[i][1] + panels[i][3] + 0.05;
            outside += !inside;
            seen++;
            p += used;
        }
    }
    CHECK_MSG(seen == points && outside == 0, "%d of %d points drawn (expected %d) lie outside their panel", outside,
              seen, points);
    /* A PNG: matplotlib draws it where installed; elsewhere the SVG beside it, and a message that says so. */
    char png[1024];
    snprintf(png, sizeof png, "%s/plot.png", dir);
    snprintf(args, sizeof args, "tools/plot_run.py %s -o %s", metrics, png);
    rc = python3(args);
    unsigned char magic[8] = {0};
    f = fopen(png, "rb");
    int written = f != NULL;
    size_t got = f ? fread(magic, 1, sizeof magic, f) : 0;
    if (f) fclose(f);
    int have_png = got == 8 && memcmp(magic, "\x89PNG\r\n\x1a\n", 8) == 0;
    CHECK_MSG(rc == 0 && (have_png || (!written && strstr(output, "so the plot is an SVG") &&
                                        strstr(output, "plot.svg"))),
              "plot_run.py -o %s: exit %d, PNG %d:\n%s", png, rc, have_png, output);
    snprintf(args, sizeof args, "tools/plot_run.py %s -o %s --no-matplotlib", metrics, svg);
    /* A bad line is named with its number. */
    f = fopen(metrics, "a");
    if (f) {
        fputs("{\"step\": 1, \"loss\": nan}\n", f);
        fclose(f);
    }
    rc = python3(args);
    CHECK_MSG(rc != 0 && strstr(output, "plot.jsonl:46: not JSON"), "bad line: exit %d:\n%s", rc, output);
}

/* ---- the GPU monitor's window over a source of its own ---------------------------- */

/* Counters that grow at 100 W and 0.5 s capped a second, by now_seconds(); a
 * read of the energy waits while the test holds it, as a slow NVML read would. */
static atomic_int energy_held, energy_reads;

static int fake_sample(void *user, GpuSample *s) {
    (void)user;
    s->util_pct = 50;
    s->sm_clock_mhz = 1755;
    return 0;
}

static int fake_energy_j(void *user, double *j) {
    (void)user;
    while (atomic_load(&energy_held)) usleep(1000);
    atomic_fetch_add(&energy_reads, 1);
    *j = 100 * now_seconds();
    return 0;
}

static int fake_capped_s(void *user, double *s) {
    (void)user;
    *s = 0.5 * now_seconds();
    return 0;
}

static int fake_limit_w(void *user, double *w) {
    (void)user;
    *w = 300;
    return 0;
}

/* The window's ends never wait for the counters (a read held until begin has
 * returned would otherwise never end: the alarm fails the test); its power
 * comes from the counters read for them, over its spans alone, also across
 * more pauses than the monitor keeps ends pending. */
static void check_monitor_window(void) {
    GpuMonitorSource src = {fake_sample, fake_energy_j, fake_capped_s, fake_limit_w, NULL, NULL};
    GpuMonitor *g = gpu_monitor_start_source(&src, 0.01);
    alarm(60);
    atomic_store(&energy_held, 1);
    gpu_monitor_window_begin(g);
    CHECK(atomic_load(&energy_reads) == 0); /* begin returned with its read still held */
    atomic_store(&energy_held, 0);
    usleep(600 * 1000);
    for (int i = 0; i < 20; i++) { /* pauses of no length, more than the ends kept pending */
        gpu_monitor_window_end(g);
        gpu_monitor_window_begin(g);
    }
    usleep(600 * 1000);
    gpu_monitor_window_end(g);
    usleep(300 * 1000); /* outside the window */
    GpuWindowPower p = gpu_monitor_window_power(g);
    CHECK(atomic_load(&energy_reads) == 42);
    CHECK_MSG(fabs(p.mean_w - 100) < 1, "window power %.3f W, want 100", p.mean_w);
    CHECK_MSG(fabs(p.capped_frac - 0.5) < 0.01, "capped %.4f of the window, want 0.5", p.capped_frac);
    CHECK(p.limit_w == 300);
    CHECK(gpu_monitor_window_util(g) == 50);
    alarm(0);
    gpu_monitor_stop(g);
}

/* The recorded samples carry each reading, the SM clock too; the ones a source does not give are null. */
static void check_monitor_samples(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/samples.jsonl", dir);
    FILE *f = fopen(path, "w");
    CHECK_MSG(f != NULL, "%s", path);
    if (!f) return;
    GpuMonitorSource src = {fake_sample, NULL, NULL, NULL, NULL, NULL};
    GpuMonitor *g = gpu_monitor_start_source(&src, 0.01);
    gpu_monitor_record_to(g, f, 0.01, now_seconds());
    usleep(200 * 1000);
    gpu_monitor_stop(g);
    fclose(f);
    char *text = test_read_file(path);
    CHECK_MSG(text && strstr(text, "\"gpu_sample\"") && strstr(text, "\"util\": 50") &&
              strstr(text, "\"sm_mhz\": 1755") && strstr(text, "\"power_w\": null"), "%s", text ? text : "");
    free(text);
}

int main(void) {
    const char *dir = test_tmpdir("monitoring");
    check_monitor_window();
    check_monitor_samples(dir);
    check_json_writer();
    check_prometheus_exposition();
    check_prometheus_slow_clients();
    check_find_batch_words();
    check_profile_steps_errors();
    check_phases_and_metrics(dir);
    check_log_lines(dir);
    check_metrics_file_errors(dir);
    check_prometheus(dir);
    check_find_batch();
    check_impossible_batch();
    if (python3_found()) {
        check_lab_table(dir);
        check_plot_run(dir);
    } else {
        printf("test_monitoring: no python3: lab_table.py and plot_run.py not checked\n");
    }
    return test_finish("test_monitoring");
}
