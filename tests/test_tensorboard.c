/* run.tensorboard_dir: the event-file writer (runtime/tensorboard.c) read back
 * by a small reader here that checks every record's length and data CRC32C
 * and decodes the Event protobuf; a directory that cannot be made is refused;
 * a short CPU training run writes the expected tags at its log points and
 * epoch ends, and an unwritable run.tensorboard_dir stops it before it trains.
 * tests/tensorboard_read.py reads the same files with TensorBoard's reader. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/config.h"
#include "runtime/tensorboard.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

/* ---- a reader: TFRecord framing and just the Event fields the writer uses ---- */

enum { MAX_EVENTS = 512 };

typedef struct {
    double wall_time;
    int64_t step;
    char file_version[32];
    char tag[64];
    float value;
    int has_value;
} Event;

typedef struct {
    const unsigned char *p, *end;
    int bad;
} Pb;

static uint64_t le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint64_t pb_varint(Pb *b) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end) break;
        unsigned char c = *b->p++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return v;
    }
    b->bad = 1;
    return 0;
}

/* The bytes of a length-delimited field, as a sub-reader. */
static Pb pb_sub(Pb *b) {
    uint64_t n = pb_varint(b);
    Pb s = {b->p, b->p, 0};
    if (b->bad || n > (uint64_t)(b->end - b->p)) {
        b->bad = 1;
        return s;
    }
    s.end = b->p + n;
    b->p += n;
    return s;
}

static void copy_string(Pb s, char *out, size_t cap) {
    size_t n = (size_t)(s.end - s.p);
    if (n >= cap) n = cap - 1;
    memcpy(out, s.p, n);
    out[n] = 0;
}

/* Value { tag = 1, simple_value = 2 } */
static void decode_value(Pb v, Event *e) {
    while (v.p < v.end && !v.bad) {
        uint64_t key = pb_varint(&v);
        if (key == (1 << 3 | 2)) copy_string(pb_sub(&v), e->tag, sizeof e->tag);
        else if (key == (2 << 3 | 5) && v.end - v.p >= 4) {
            uint32_t bits = (uint32_t)le(v.p, 4);
            memcpy(&e->value, &bits, 4);
            e->has_value = 1;
            v.p += 4;
        } else v.bad = 1;
    }
    CHECK_MSG(!v.bad, "a Value the reader does not know");
}

static int decode_event(const unsigned char *data, size_t n, Event *e) {
    Pb b = {data, data + n, 0};
    memset(e, 0, sizeof *e);
    while (b.p < b.end && !b.bad) {
        uint64_t key = pb_varint(&b);
        if (key == (1 << 3 | 1) && b.end - b.p >= 8) {
            uint64_t bits = le(b.p, 8);
            memcpy(&e->wall_time, &bits, 8);
            b.p += 8;
        } else if (key == (2 << 3 | 0)) e->step = (int64_t)pb_varint(&b);
        else if (key == (3 << 3 | 2)) copy_string(pb_sub(&b), e->file_version, sizeof e->file_version);
        else if (key == (5 << 3 | 2)) {
            Pb summary = pb_sub(&b);
            uint64_t vkey = pb_varint(&summary); /* Summary.value = 1: one per event */
            if (vkey == (1 << 3 | 2)) decode_value(pb_sub(&summary), e);
            else b.bad = 1;
        } else b.bad = 1;
    }
    return b.bad ? -1 : 0;
}

/* Every record of the file, each length and data CRC checked; the count, or -1. */
static int read_events(const char *path, Event *out, int cap) {
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return -1;
    int n = 0;
    unsigned char head[12], crc[4], data[4096];
    size_t got;
    while ((got = fread(head, 1, 12, f)) == 12) {
        uint64_t len = le(head, 8);
        int ok = (uint32_t)le(head + 8, 4) == tb_mask_crc(tb_crc32c(head, 8)) && len <= sizeof data && n < cap &&
                 fread(data, 1, len, f) == len && fread(crc, 1, 4, f) == 4 &&
                 (uint32_t)le(crc, 4) == tb_mask_crc(tb_crc32c(data, len)) && decode_event(data, len, &out[n]) == 0;
        CHECK_MSG(ok, "%s: record %d: bad length, CRC or event", path, n);
        if (!ok) break;
        n++;
    }
    CHECK_MSG(got == 0, "%s: %zu bytes after the last whole record", path, got);
    fclose(f);
    return n;
}

/* The one file in dir (its full path in path), or 0 files / several: a failed check. */
static void the_event_file(const char *dir, char *path, size_t cap) {
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "no directory %s", dir);
    int files = 0;
    path[0] = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        CHECK_MSG(strncmp(de->d_name, "events.out.tfevents.", 20) == 0, "%s in %s", de->d_name, dir);
        snprintf(path, cap, "%s/%s", dir, de->d_name);
        files++;
    }
    if (d) closedir(d);
    CHECK_MSG(files == 1, "%d files in %s", files, dir);
}

/* ---- the writer alone ------------------------------------------------------------ */

static void check_crc32c(void) {
    CHECK(tb_crc32c("123456789", 9) == 0xE3069283u); /* the CRC-32C check value */
    CHECK(tb_crc32c("", 0) == 0);
}

static void check_writer(const char *tmp) {
    char dir[600], err[4608], path[1200];
    snprintf(dir, sizeof dir, "%s/made/by/tb_open", tmp); /* parents are made too */
    TbWriter *w = tb_open(dir, 3, err, sizeof err);
    CHECK_MSG(w != NULL, "tb_open: %s", err);
    if (!w) return;
    char host[256] = "";
    gethostname(host, sizeof host);
    char tail[300];
    snprintf(tail, sizeof tail, ".%s.3", host);
    const char *name = strrchr(tb_path(w), '/') + 1;
    CHECK_MSG(strncmp(name, "events.out.tfevents.", 20) == 0 &&
                  strcmp(name + strlen(name) - strlen(tail), tail) == 0,
              "file name %s", name);
    enum { N = 200 };
    uint64_t rng = test_seed();
    float values[N];
    for (int i = 0; i < N; i++) {
        values[i] = test_uniform(&rng, -1e6f, 1e6f);
        CHECK(tb_scalar(w, i % 2 ? "b/long tag name with spaces" : "a", (int64_t)i * 1000003, values[i]) == 0);
        if (i % 50 == 0) CHECK(tb_flush(w) == 0);
    }
    snprintf(path, sizeof path, "%s", tb_path(w));
    CHECK(tb_close(w) == 0);

    static Event ev[MAX_EVENTS];
    int n = read_events(path, ev, MAX_EVENTS);
    CHECK_MSG(n == N + 1, "%d records", n);
    CHECK(strcmp(ev[0].file_version, "brain.Event:2") == 0 && !ev[0].has_value);
    for (int i = 0; i + 1 < n; i++) {
        const Event *e = &ev[i + 1];
        CHECK_MSG(e->step == (int64_t)i * 1000003 && e->has_value && e->value == values[i] &&
                      strcmp(e->tag, i % 2 ? "b/long tag name with spaces" : "a") == 0,
                  "event %d: %s step %lld value %g", i + 1, e->tag, (long long)e->step, e->value);
        CHECK(e->wall_time >= ev[0].wall_time && e->wall_time < ev[0].wall_time + 600);
    }
}

/* A regular file where a directory should be: refused, even for root. */
static void check_unwritable(const char *tmp) {
    char dir[600], err[4608];
    const char *file = test_write_file(tmp, "not-a-dir", "x", 1);
    snprintf(dir, sizeof dir, "%s/runs", file);
    TbWriter *w = tb_open(dir, -1, err, sizeof err);
    CHECK(w == NULL);
    CHECK_MSG(strstr(err, dir) && strstr(err, "Not a directory"), "message: %s", err);
    tb_close(w);
}

/* ---- a training run -------------------------------------------------------------- */

enum { LOG_EVERY = 4, STEPS_PER_EPOCH = 8, EPOCHS = 2 };

/* 128 synthetic images of 32x32 in batches of 16: 8 steps an epoch. */
static Config *small_run(const char *tb_dir) {
    static const char *fixed[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=32",
                                  "data.synthetic_train=128", "data.synthetic_test=32", "train.batch=16",
                                  "run.warmup_steps=0", "data.workers=0", "model.name=simplenet", "optim.lr=0.05"};
    enum { N_FIXED = sizeof fixed / sizeof *fixed, N_SET = N_FIXED + 4 };
    char made[4][700], err[512];
    snprintf(made[0], sizeof made[0], "run.epochs=%d", EPOCHS);
    snprintf(made[1], sizeof made[1], "run.log_every=%d", LOG_EVERY);
    snprintf(made[2], sizeof made[2], "run.seed=%llu", (unsigned long long)(test_seed() % 1000003));
    snprintf(made[3], sizeof made[3], "run.tensorboard_dir=%s", tb_dir);
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    for (int i = 0; i < N_SET; i++) {
        const char *line = i < N_FIXED ? fixed[i] : made[i - N_FIXED];
        CHECK_MSG(config_set(c, line, err, sizeof err) == 0, "%s: %s", line, err);
    }
    return c;
}

static int count_tag(const Event *ev, int n, const char *tag, int64_t *last_step) {
    int count = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(ev[i].tag, tag) == 0) {
            count++;
            *last_step = ev[i].step;
        }
    return count;
}

static void check_training_run(const char *tmp) {
    char dir[600], path[1200];
    snprintf(dir, sizeof dir, "%s/train", tmp);
    Config *c = small_run(dir);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
    the_event_file(dir, path, sizeof path);
    static Event ev[MAX_EVENTS];
    int n = path[0] ? read_events(path, ev, MAX_EVENTS) : 0;
    CHECK_MSG(n > 0 && strcmp(ev[0].file_version, "brain.Event:2") == 0, "%s: no version event first", path);
    static const char *per_log_point[] = {"train/loss", "train/lr", "train/samples_per_s", "train/loss_scale"};
    int log_points = STEPS_PER_EPOCH * EPOCHS / LOG_EVERY;
    for (int i = 0; i < 4; i++) {
        int64_t last = -1;
        int count = count_tag(ev, n, per_log_point[i], &last);
        CHECK_MSG(count == log_points && last == STEPS_PER_EPOCH * EPOCHS, "%s: %d events, the last at step %lld",
                  per_log_point[i], count, (long long)last);
    }
    int64_t last = -1;
    CHECK_MSG(count_tag(ev, n, "eval/test_acc", &last) == EPOCHS, "eval/test_acc: one an epoch");
    for (int i = 1; i < n; i++) {
        if (strcmp(ev[i].tag, "train/lr") == 0) CHECK_NEAR(ev[i].value, 0.05, 1e-7);
        if (strcmp(ev[i].tag, "train/loss_scale") == 0) CHECK(ev[i].value == 1); /* fp32 */
        if (strcmp(ev[i].tag, "eval/test_acc") == 0) CHECK(ev[i].value >= 0 && ev[i].value <= 1);
        if (strcmp(ev[i].tag, "eval/test_acc") == 0 && ev[i].step == last) CHECK_NEAR(ev[i].value, s.test_acc, 1e-6);
    }
}

/* An unwritable run.tensorboard_dir: exit status 1 and one message naming the
 * key and the system's error, before the first step. */
static void check_training_refused(const char *tmp) {
    char dir[700], log_path[700];
    snprintf(dir, sizeof dir, "%s/runs", test_write_file(tmp, "a-file", "x", 1));
    snprintf(log_path, sizeof log_path, "%s/refused.log", tmp);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log_path, "w", stderr)) _exit(99);
        Config *c = small_run(dir);
        TrainSummary s;
        train_run(c, &s);
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 99, "status %d", status);
    static char log[1 << 16];
    FILE *f = fopen(log_path, "r");
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    log[n] = 0;
    if (f) fclose(f);
    CHECK_MSG(strstr(log, "run.tensorboard_dir") && strstr(log, "Not a directory") && !strstr(log, " step 4/"),
              "the message:\n%s", log);
}

int main(void) {
    const char *tmp = test_tmpdir("tensorboard");
    check_crc32c();
    check_writer(tmp);
    check_unwritable(tmp);
    check_training_run(tmp);
    check_training_refused(tmp);
    return test_finish("test_tensorboard");
}
