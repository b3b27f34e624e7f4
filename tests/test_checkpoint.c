/* Long runs you can trust, on the CPU: a run stopped and resumed from its
 * checkpoint ends with bitwise the parameters of the run that never stopped
 * (through the API, and through trainc stopped by SIGTERM), also from a
 * checkpoint laid out as trainc wrote them before each layer's parameters
 * were aligned (packed, no gaps), which export reads as it reads today's; corrupt and
 * mismatched checkpoints are refused naming the file and what is wrong (every
 * truncation, every changed byte, random bytes); --resume latest moves a
 * damaged newest checkpoint aside and resumes from the one before it; a write
 * that never finished (a second signal, a fatal error, a killed process)
 * leaves no temporary file behind; a step with a NaN gradient is skipped,
 * counted, and changes nothing; run.max_bad_steps stops the run with a
 * checkpoint. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "runtime/check.h"
#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/trainer/export.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

/* 512 synthetic images of 32x32 in batches of 16: 32 steps an epoch. The
 * learning rate keeps the baseline net stable: at 0.05 its 96 steps at 16x16
 * (check_sigterm) diverged to NaN under some seeds and OpenBLAS thread counts
 * (on an AMD EPYC, 2 threads), and the run stopped at run.max_bad_steps. */
static const char *base_sets[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=32",
                                  "data.synthetic_train=512", "data.synthetic_test=32", "train.batch=16",
                                  "run.eval=off", "run.log_every=1000", "run.warmup_steps=0", "run.epochs=2",
                                  "data.workers=2", "data.flip=on", "data.crop_pad=4", "optim.lr=0.01",
                                  "optim.weight_decay=0.001"};
enum { N_BASE = sizeof base_sets / sizeof *base_sets };

static Config *small_run(void) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    for (int i = 0; i < N_BASE; i++) test_config_set(c, "%s", base_sets[i]);
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

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f && fputs(text, f) >= 0, "cannot write %s", path);
    if (f) fclose(f);
}

static void patch_u32(const char *path, long at, uint32_t value) {
    FILE *f = fopen(path, "r+b");
    CHECK_MSG(f && fseek(f, at, SEEK_SET) == 0 && fwrite(&value, sizeof value, 1, f) == 1, "cannot patch %s", path);
    if (f) fclose(f);
}

/* ---- the file format and its refusals, through the API --------------------- */

/* CRC-32 bit by bit (reflected polynomial 0xEDB88320), as the format defines
 * it: a file checksummed this way (as trainc did before it used zlib's crc32)
 * must load. */
static uint32_t reference_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) crc = crc & 1 ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
    }
    return ~crc;
}

/* patch_u32, then the file's CRC (its last 4 bytes) made to match again: a
 * file as a newer trainc would write it, not a damaged one. */
static void patch_u32_resealed(const char *path, long at, uint32_t value) {
    patch_u32(path, at, value);
    FILE *f = fopen(path, "r+b");
    long n = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    unsigned char *bytes = n >= 4 ? malloc((size_t)n) : NULL;
    int ok = bytes && fseek(f, 0, SEEK_SET) == 0 && fread(bytes, 1, (size_t)n, f) == (size_t)n;
    uint32_t crc = ok ? reference_crc32(0, bytes, (size_t)n - 4) : 0;
    ok = ok && fseek(f, n - 4, SEEK_SET) == 0 && fwrite(&crc, sizeof crc, 1, f) == 1;
    CHECK_MSG(ok, "cannot reseal %s", path);
    free(bytes);
    if (f) fclose(f);
}

static void fill_bytes(unsigned char *p, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(int)test_uniform(rng, 0, 255.99f);
}

static void check_crc32(uint64_t *rng) {
    CHECK(ckpt_crc32(0, "123456789", 9) == 0xCBF43926u); /* CRC-32's published check value */
    unsigned char buf[4099];
    fill_bytes(buf, sizeof buf, rng);
    CHECK(ckpt_crc32(0, buf, sizeof buf) == reference_crc32(0, buf, sizeof buf));
    size_t cut = 1 + (size_t)test_uniform(rng, 0, sizeof buf - 2);
    CHECK(ckpt_crc32(ckpt_crc32(0, buf, cut), buf + cut, sizeof buf - cut) == ckpt_crc32(0, buf, sizeof buf));
    CHECK(ckpt_crc32(0x12345678u, NULL, 0) == 0x12345678u);
}

/* A two-section file laid out by hand, as runtime/checkpoint.h documents it. */
enum { ALPHA_BYTES = 1000, BETA_BYTES = 3000, FILE_BYTES = 16 + 44 + ALPHA_BYTES + 44 + BETA_BYTES + 12 };
static unsigned char alpha[ALPHA_BYTES], beta[BETA_BYTES], good[FILE_BYTES];
static const size_t beta_size_at = 16 + 44 + ALPHA_BYTES + 32, beta_data_at = 16 + 44 + ALPHA_BYTES + 40;

static size_t put_bytes(unsigned char *out, size_t at, const void *data, size_t n) {
    memcpy(out + at, data, n);
    return at + n;
}

static size_t put_section(unsigned char *out, size_t at, const char *name, const unsigned char *data, uint64_t n) {
    char padded[CKPT_NAME_LEN] = {0};
    memcpy(padded, name, strlen(name));
    uint32_t crc = reference_crc32(0, data, (size_t)n);
    at = put_bytes(out, at, padded, sizeof padded);
    at = put_bytes(out, at, &n, sizeof n);
    at = put_bytes(out, at, data, (size_t)n);
    return put_bytes(out, at, &crc, sizeof crc);
}

static void build_by_hand(uint64_t *rng) {
    uint32_t version = 1, count = 2;
    fill_bytes(alpha, sizeof alpha, rng);
    fill_bytes(beta, sizeof beta, rng);
    size_t at = put_bytes(good, 0, "TRAINCK\n", 8);
    at = put_bytes(good, at, &version, 4);
    at = put_bytes(good, at, &count, 4);
    at = put_section(good, at, "alpha", alpha, ALPHA_BYTES);
    at = put_section(good, at, "beta", beta, BETA_BYTES);
    at = put_bytes(good, at, "TRCKEND\n", 8);
    uint32_t crc = reference_crc32(0, good, at);
    at = put_bytes(good, at, &crc, 4);
    CHECK(at == FILE_BYTES);
}

/* ckpt_open must refuse path as 'kind', naming it and saying 'what' (and 'also'). */
static void expect_open_fails(const char *path, CkptStatus kind, const char *what, const char *also) {
    char err[4400];
    CkptStatus status = CKPT_OK;
    CkptFile *f = ckpt_open_status(path, &status, err, sizeof err);
    CHECK_MSG(f == NULL, "%s opened (expected: %s)", path, what);
    ckpt_close(f);
    CHECK_MSG(status == kind, "%s: status %d, expected %d: %s", path, (int)status, (int)kind, err);
    CHECK_MSG(strstr(err, path) && strstr(err, what) && (!also || strstr(err, also)),
              "%s: no file name, '%s' or '%s' in: %s", path, what, also ? also : "", err);
}

static const char *write_bytes(const char *dir, const char *name, const unsigned char *data, size_t n) {
    static char path[1024];
    snprintf(path, sizeof path, "%s", test_write_file(dir, name, data, n));
    return path;
}

/* A copy of the good file with n bytes at 'at' replaced. */
static const char *write_patched(const char *dir, const char *name, size_t at, const void *bytes, size_t n) {
    unsigned char copy[FILE_BYTES];
    memcpy(copy, good, sizeof copy);
    memcpy(copy + at, bytes, n);
    return write_bytes(dir, name, copy, sizeof copy);
}

static void check_format(const char *dir) {
    char err[4400];
    const char *hand = write_bytes(dir, "hand.trc", good, sizeof good);
    CkptFile *f = ckpt_open(hand, err, sizeof err);
    CHECK_MSG(f != NULL, "a file of the documented format: %s", err);
    if (f) {
        unsigned char a[ALPHA_BYTES], b[BETA_BYTES];
        CHECK(ckpt_section_size(f, "alpha") == ALPHA_BYTES && ckpt_section_size(f, "gamma") == -1);
        CHECK(ckpt_read_section(f, "alpha", a, sizeof a, err, sizeof err) == 0 && memcmp(a, alpha, sizeof a) == 0);
        CHECK(ckpt_read_section(f, "beta", b, sizeof b, err, sizeof err) == 0 && memcmp(b, beta, sizeof b) == 0);
        CHECK(ckpt_read_section(f, "beta", b, sizeof b - 1, err, sizeof err) != 0 && strstr(err, "3000 bytes"));
        ckpt_close(f);
    }
    /* The writer makes the same bytes. */
    char written[1024];
    snprintf(written, sizeof written, "%s/written.trc", dir);
    CkptWriter *w = ckpt_write_begin(written, 2, err, sizeof err);
    CHECK_MSG(w != NULL, "%s", err);
    if (w) {
        CHECK(ckpt_write_section(w, "alpha", alpha, sizeof alpha, err, sizeof err) == 0);
        CHECK(ckpt_write_section(w, "beta", beta, sizeof beta, err, sizeof err) == 0);
        CHECK_MSG(ckpt_write_commit(w, err, sizeof err) == 0, "%s", err);
    }
    unsigned char back[FILE_BYTES + 1];
    FILE *in = fopen(written, "rb");
    size_t n = in ? fread(back, 1, sizeof back, in) : 0;
    if (in) fclose(in);
    CHECK_MSG(n == FILE_BYTES && memcmp(back, good, FILE_BYTES) == 0, "the writer's file differs from the format");
}

static void check_format_refusals(const char *dir, uint64_t *rng) {
    char path[1024], what[128], also[128];
    /* Truncated: named, with its size and the size of a whole file. */
    snprintf(what, sizeof what, "the file has %d bytes", FILE_BYTES / 2);
    snprintf(also, sizeof also, "a whole checkpoint has %d", FILE_BYTES);
    expect_open_fails(write_bytes(dir, "half.trc", good, FILE_BYTES / 2), CKPT_ERR_CORRUPT, "is truncated", what);
    expect_open_fails(write_bytes(dir, "half.trc", good, FILE_BYTES / 2), CKPT_ERR_CORRUPT, also, NULL);
    expect_open_fails(write_bytes(dir, "short.trc", good, 20), CKPT_ERR_CORRUPT, "is truncated", "at least");
    expect_open_fails(write_bytes(dir, "empty.trc", good, 0), CKPT_ERR_CORRUPT, "empty file", NULL);
    expect_open_fails(write_bytes(dir, "text.trc", (const unsigned char *)"model.name = resnet18\n", 22),
                      CKPT_ERR_CORRUPT, "not a trainc checkpoint", NULL);
    uint32_t v = 2, zero = 0, many = 1000;
    /* A newer version is believed only when the file's CRC matches: else one flipped bit is damage. */
    expect_open_fails(write_patched(dir, "v2.trc", 8, &v, 4), CKPT_ERR_CORRUPT, "checksum", "version 2");
    patch_u32_resealed(write_patched(dir, "v2.trc", 8, &v, 4), 8, v);
    snprintf(path, sizeof path, "%s/v2.trc", dir);
    expect_open_fails(path, CKPT_ERR_NEWER, "newer trainc", "version 2");
    expect_open_fails(write_patched(dir, "v0.trc", 8, &zero, 4), CKPT_ERR_CORRUPT, "version 0", NULL);
    expect_open_fails(write_patched(dir, "many.trc", 12, &many, 4), CKPT_ERR_CORRUPT, "1000 sections", NULL);
    uint64_t huge = UINT64_MAX;
    expect_open_fails(write_patched(dir, "size.trc", beta_size_at, &huge, 8), CKPT_ERR_CORRUPT, "size field", NULL);
    unsigned char flipped = good[beta_data_at + 7] ^ 0x10;
    expect_open_fails(write_patched(dir, "data.trc", beta_data_at + 7, &flipped, 1), CKPT_ERR_CORRUPT,
                      "checksum mismatch in section 'beta'", NULL);
    unsigned char pad = 0x41; /* inside alpha's name, after its NUL: only the file's CRC covers it */
    expect_open_fails(write_patched(dir, "pad.trc", 16 + 20, &pad, 1), CKPT_ERR_CORRUPT,
                      "checksum mismatch over the whole file", NULL);
    expect_open_fails(write_patched(dir, "twice.trc", beta_size_at - 32, "alpha", 6), CKPT_ERR_CORRUPT,
                      "section 'alpha' twice", NULL);
    unsigned char longer[FILE_BYTES + 5] = {0};
    memcpy(longer, good, FILE_BYTES);
    expect_open_fails(write_bytes(dir, "longer.trc", longer, sizeof longer), CKPT_ERR_CORRUPT, "5 bytes after", NULL);
    expect_open_fails(dir, CKPT_ERR_NOT_FILE, "a directory", NULL);
    snprintf(path, sizeof path, "%s/fifo.trc", dir);
    CHECK(mkfifo(path, 0600) == 0);
    expect_open_fails(path, CKPT_ERR_NOT_FILE, "not a regular file", NULL);
    snprintf(path, sizeof path, "%s/missing.trc", dir);
    expect_open_fails(path, CKPT_ERR_IO, "cannot open", NULL);

    /* Every truncation and every flipped byte is refused; random bytes too (no crash, no allocation from them). */
    int opened = 0;
    char err[4400];
    for (size_t n = 0; n < FILE_BYTES; n++) {
        CkptFile *f = ckpt_open(write_bytes(dir, "cut.trc", good, n), err, sizeof err);
        opened += f != NULL;
        ckpt_close(f);
    }
    CHECK_MSG(opened == 0, "%d truncations opened", opened);
    for (size_t at = 0; at < FILE_BYTES; at++) {
        unsigned char x = good[at] ^ (unsigned char)(1 + (int)test_uniform(rng, 0, 254.99f));
        CkptFile *f = ckpt_open(write_patched(dir, "flip.trc", at, &x, 1), err, sizeof err);
        opened += f != NULL;
        ckpt_close(f);
    }
    CHECK_MSG(opened == 0, "%d files with a changed byte opened", opened);
    unsigned char junk[FILE_BYTES];
    for (int i = 0; i < 300; i++) {
        size_t n = (size_t)test_uniform(rng, 0, FILE_BYTES);
        fill_bytes(junk, n, rng);
        if (i % 2 && n >= 16) memcpy(junk, good, 12 + (size_t)test_uniform(rng, 0, 4.99f)); /* a valid start */
        CkptFile *f = ckpt_open(write_bytes(dir, "junk.trc", junk, n), err, sizeof err);
        opened += f != NULL;
        ckpt_close(f);
    }
    CHECK_MSG(opened == 0, "%d files of random bytes opened", opened);
}

/* ---- temporary files: a write that never finished leaves nothing behind ---- */

static int count_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static pid_t dead_pid(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    waitpid(pid, NULL, 0);
    return pid;
}

static void check_stale_temporaries(const char *dir) {
    char dead[1024], ours[1024], alive[1024], finished[1024], other[1024], folder[1024], err[4400];
    pid_t gone = dead_pid();
    snprintf(dead, sizeof dead, "%s/ckpt-00000005.trc.tmp.%d", dir, (int)gone);
    snprintf(ours, sizeof ours, "%s/ckpt-00000006.trc.tmp.%d", dir, (int)getpid());
    snprintf(alive, sizeof alive, "%s/ckpt-00000007.trc.tmp.%d", dir, (int)getppid());
    snprintf(finished, sizeof finished, "%s/ckpt-00000005.trc", dir);
    snprintf(other, sizeof other, "%s/notes.txt.tmp.%d", dir, (int)gone);
    snprintf(folder, sizeof folder, "%s/ckpt-00000008.trc.tmp.%d", dir, (int)gone);
    write_text(dead, "x"), write_text(ours, "x"), write_text(alive, "x"), write_text(finished, "x");
    write_text(other, "x");
    CHECK(mkdir(folder, 0700) == 0);
    /* Without the folder's lock nothing is removed: another run may be writing them. */
    CHECK(ckpt_remove_stale_temporaries(dir, "ckpt-", ".trc") == 0);
    CHECK(file_exists(dead) && file_exists(ours) && file_exists(alive));
    /* With it no one else writes there: every temporary is stale, whatever process (namespace) made it. */
    CHECK_MSG(ckpt_lock_dir(dir, err, sizeof err) == 0, "%s", err);
    CHECK(ckpt_remove_stale_temporaries(dir, "ckpt-", ".trc") == 3);
    CHECK_MSG(!file_exists(dead) && !file_exists(ours) && !file_exists(alive), "a stale temporary file is left");
    CHECK_MSG(file_exists(finished) && file_exists(other) && file_exists(folder),
              "a finished checkpoint, another file or a folder was removed");

    /* The write in progress is not stale; ckpt_remove_pending (a signal handler's) removes it. */
    char path[1024], tmp[1100];
    snprintf(path, sizeof path, "%s/ckpt-00000009.trc", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    CkptWriter *w = ckpt_write_begin(path, 1, err, sizeof err);
    CHECK_MSG(w != NULL, "%s", err);
    CHECK(ckpt_remove_stale_temporaries(dir, "ckpt-", ".trc") == 0 && file_exists(tmp));
    ckpt_remove_pending();
    CHECK(!file_exists(tmp));
    if (w) {
        CHECK(ckpt_write_section(w, "alpha", alpha, sizeof alpha, err, sizeof err) == 0);
        CHECK(ckpt_write_commit(w, err, sizeof err) != 0 && strstr(err, path));
    }
    CHECK(!file_exists(path) && !file_exists(tmp));

    /* A fatal error in the middle of a write leaves no temporary file. */
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        CkptWriter *cw = ckpt_write_begin(path, 1, err, sizeof err);
        if (!cw) _exit(3);
        TC_FATAL("test: stopped in the middle of a checkpoint write");
    }
    int status;
    waitpid(child, &status, 0);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)child);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 1, "the child exited %d", status);
    CHECK_MSG(!file_exists(tmp) && !file_exists(path), "%s left after a fatal error", tmp);
    /* Another process cannot take the lock, and is told who holds it. */
    fflush(NULL);
    child = fork();
    if (child == 0) {
        ckpt_unlock_dir(dir); /* its copy of the lock file's descriptor: the parent's holds the lock */
        _exit(ckpt_lock_dir(dir, err, sizeof err) == 0 ? 0 : strstr(err, "in use") ? 2 : 3);
    }
    waitpid(child, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 2, "a second process on a locked folder: %d", status);
    ckpt_unlock_dir(dir);
    CHECK(!ckpt_dir_locked(dir) && ckpt_remove_stale_temporaries(dir, "ckpt-", ".trc") == 0);
    unlink(finished);
    unlink(other);
    rmdir(folder);
}

/* ---- resume through the API ------------------------------------------------ */

static char resumed_from[1024]; /* a good checkpoint, for the refusal checks */

static void check_resume(const char *dir) {
    TrainSummary s;
    char ckdir[768];

    Config *c = small_run();
    test_config_set(c, "run.max_steps=40");
    float *whole = run(c, &s);
    CHECK(s.steps == 40 && !s.stopped && s.exit_status == 0);

    /* Stopped at 25 with checkpoints at 10 and 20, resumed from 20: across the epoch's end at 32. */
    snprintf(ckdir, sizeof ckdir, "%s/api", dir);
    c = small_run();
    test_config_set(c, "run.max_steps=25");
    test_config_set(c, "run.checkpoint_every=10");
    test_config_set(c, "run.checkpoint_dir=%s", ckdir);
    free(run(c, &s));
    snprintf(resumed_from, sizeof resumed_from, "%s/ckpt-00000020.trc", ckdir);
    CHECK_MSG(file_exists(resumed_from), "no %s", resumed_from);
    CHECK(strcmp(s.checkpoint, resumed_from) == 0);

    c = small_run();
    test_config_set(c, "run.max_steps=40");
    test_config_set(c, "run.checkpoint_every=10");
    test_config_set(c, "run.checkpoint_dir=%s", ckdir);
    test_config_set(c, "run.resume=%s", resumed_from);
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

/* ---- checkpoints of the packed layout (trainc before the alignment) -------- */

static void *read_whole_section(CkptFile *f, const char *name, size_t *bytes) {
    char err[512];
    int64_t n = ckpt_section_size(f, name);
    CHECK_MSG(n >= 0, "no section %s", name);
    *bytes = n > 0 ? (size_t)n : 0;
    void *data = malloc(*bytes + 1);
    if (!data || n < 0) return data;
    if (ckpt_read_section(f, name, data, *bytes, err, sizeof err) != 0) CHECK_MSG(0, "%s", err);
    ((char *)data)[*bytes] = 0;
    return data;
}

static size_t tensor_count(const cJSON *t) {
    size_t n = 1;
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(t, "shape")) n *= (size_t)d->valuedouble;
    return n;
}

/* The params tensors of the table packed one after another in the table's
 * order (layer by layer, weight then bias; on the CPU in NCHW no input
 * channels are padded) into packed when not NULL; with set_offsets the
 * table's offsets become the packed ones. Returns the packed length. */
static size_t pack(cJSON *table, const float *flat, float *packed, int set_offsets) {
    size_t at = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, table) {
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "section")), "params") != 0) continue;
        cJSON *offset = cJSON_GetObjectItemCaseSensitive(t, "offset");
        size_t n = tensor_count(t);
        if (packed) memcpy(packed + at, flat + (size_t)offset->valuedouble, n * sizeof(float));
        if (set_offsets) cJSON_SetNumberValue(offset, (double)at);
        at += n;
    }
    return at;
}

/* from rewritten in the packed layout at to: the params and momentum sections,
 * the tensor table's offsets and the model section's n_params. */
static void write_packed(const char *from, const char *to) {
    static const char *names[] = {"model", "meta", "tensors", "position", "data", "loss_scaler", "bn_stats",
                                  "params", "momentum"};
    enum { N = sizeof names / sizeof *names, MODEL = 0, TENSORS = 2, PARAMS = 7, MOMENTUM = 8 };
    char err[512];
    void *data[N];
    size_t bytes[N];
    CkptFile *f = ckpt_open(from, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    for (int i = 0; i < N; i++) data[i] = read_whole_section(f, names[i], &bytes[i]);
    ckpt_close(f);
    cJSON *table = cJSON_Parse(data[TENSORS]);
    CHECK(table != NULL);
    size_t flat = bytes[PARAMS] / sizeof(float), packed = pack(table, NULL, NULL, 0);
    CHECK_MSG(packed < flat, "the model's layout has no gaps (%zu floats, %zu packed): nothing to check", flat,
              packed);
    for (int i = PARAMS; i <= MOMENTUM; i++) {
        float *p = malloc(packed * sizeof(float));
        pack(table, data[i], p, 0);
        free(data[i]);
        data[i] = p, bytes[i] = packed * sizeof(float);
    }
    pack(table, NULL, NULL, 1);
    free(data[TENSORS]);
    data[TENSORS] = cJSON_PrintUnformatted(table);
    bytes[TENSORS] = strlen(data[TENSORS]);
    cJSON_Delete(table);
    int64_t n64 = (int64_t)packed; /* the model section: char name[32], then int64_t n_params */
    CHECK(bytes[MODEL] >= 40);
    memcpy((char *)data[MODEL] + 32, &n64, sizeof n64);
    CkptWriter *w = ckpt_write_begin(to, N, err, sizeof err);
    for (int i = 0; w && i < N; i++)
        if (ckpt_write_section(w, names[i], data[i], bytes[i], err, sizeof err) != 0) w = NULL;
    CHECK_MSG(w && ckpt_write_commit(w, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < N; i++) free(data[i]);
}

/* airbench (its whitening layer's 288 weights and 24 biases leave gaps): 6 steps
 * with a checkpoint at 3, that checkpoint packed, resumed to 6. */
static void check_packed(const char *dir) {
    char ckdir[768], from[1024], to[1024];
    snprintf(ckdir, sizeof ckdir, "%s/packed", dir);
    snprintf(from, sizeof from, "%s/ckpt-00000003.trc", ckdir);
    snprintf(to, sizeof to, "%s/packed.trc", ckdir);
    const char *air[] = {"model.name=airbench", "run.max_steps=6", "data.workers=0"};
    TrainSummary s;
    Config *c = small_run();
    for (size_t i = 0; i < sizeof air / sizeof *air; i++) test_config_set(c, "%s", air[i]);
    test_config_set(c, "run.checkpoint_every=3");
    test_config_set(c, "run.checkpoint_dir=%s", ckdir);
    float *whole = run(c, &s);
    write_packed(from, to);
    c = small_run();
    for (size_t i = 0; i < sizeof air / sizeof *air; i++) test_config_set(c, "%s", air[i]);
    test_config_set(c, "run.resume=%s", to);
    float *resumed = run(c, &s);
    CheckpointWeights a, b;
    char err[4400];
    int ra = checkpoint_weights_read(from, &a, err, sizeof err), rb = checkpoint_weights_read(to, &b, err, sizeof err);
    CHECK_MSG(ra == 0 && rb == 0, "%s", err);
    if (ra == 0 && rb == 0) {
        size_t n = a.model->n_params;
        CHECK_MSG(s.steps == 6 && !memcmp(whole, resumed, n * sizeof(float)),
                  "resumed from the packed layout: %ld steps, rel %.3g", s.steps, test_rel_error(resumed, whole, n));
        CHECK_MSG(!memcmp(a.params, b.params, n * sizeof(float)) &&
                  !memcmp(a.bn_stats, b.bn_stats, a.model->n_bn_stats * sizeof(float)),
                  "export reads the packed checkpoint's weights otherwise");
    }
    if (ra == 0) checkpoint_weights_free(&a);
    if (rb == 0) checkpoint_weights_free(&b);
    free(whole);
    free(resumed);
}

/* ---- NaN: skipped, counted, changes nothing; max_bad_steps stops ----------- */

static void check_nan(const char *dir) {
    TrainSummary s;
    Config *c = small_run();
    test_config_set(c, "run.max_steps=3");
    float *before = run(c, &s);
    CHECK(s.skipped_steps == 0);

    c = small_run();
    test_config_set(c, "run.max_steps=4");
    test_config_set(c, "run.inject_nan_step=4");
    float *after = run(c, &s);
    CHECK_MSG(s.skipped_steps == 1, "skipped_steps = %ld", s.skipped_steps);
    CHECK(s.steps == 4 && !s.stopped);
    CHECK_MSG(same_params(before, after), "the skipped step changed the parameters");

    /* The run goes on after it: step 5 trains again. */
    c = small_run();
    test_config_set(c, "run.max_steps=6");
    test_config_set(c, "run.inject_nan_step=2");
    float *later = run(c, &s);
    CHECK(s.skipped_steps == 1 && s.steps == 6 && isfinite(s.final_loss));
    CHECK(!same_params(later, before));
    free(later);

    /* run.max_bad_steps = 1: the bad step stops the run with a checkpoint of the state before it. */
    char ckdir[768], path[1024];
    snprintf(ckdir, sizeof ckdir, "%s/nan", dir);
    c = small_run();
    test_config_set(c, "run.max_steps=10");
    test_config_set(c, "run.inject_nan_step=4");
    test_config_set(c, "run.max_bad_steps=1");
    test_config_set(c, "run.checkpoint_dir=%s", ckdir);
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
    return test_spawn(argv, out_file);
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

/* trainc --resume file must exit non-zero naming the file, why (and also, when not NULL). */
static void expect_refused_also(const char *dir, const char *file, const char *why, const char *also,
                                const char **extra, int n_extra) {
    const char *args[8];
    int n = 0;
    for (int i = 0; i < n_extra; i++) args[n++] = extra[i];
    args[n++] = "--resume";
    args[n++] = file;
    int rc = trainc(dir, args, n);
    CHECK_MSG(rc != 0 && rc < 128, "resume from %s (%s) exited %d", file, why, rc);
    CHECK_MSG(strstr(output, file) != NULL && strstr(output, why) != NULL && (!also || strstr(output, also)),
              "resume from %s: no file name, '%s' or '%s' in:\n%s", file, why, also ? also : "", output);
}

static void expect_refused(const char *dir, const char *file, const char *why, const char **extra, int n_extra) {
    expect_refused_also(dir, file, why, NULL, extra, n_extra);
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
    char half[128], folder[1024], empty[1024], text[1024], newer[1024];
    snprintf(half, sizeof half, "the file has %ld bytes", (long)st.st_size / 2);
    expect_refused_also(dir, truncated, "is truncated", half, NULL, 0);
    expect_refused_also(dir, flipped, "checksum mismatch", "corrupt", NULL, 0);
    expect_refused_also(dir, magic, "not a trainc checkpoint", "magic", NULL, 0);
    snprintf(folder, sizeof folder, "%s/api", dir);
    expect_refused_also(dir, folder, "is a directory", "--resume latest", NULL, 0);
    snprintf(empty, sizeof empty, "%s/empty.trc", dir);
    write_text(empty, "");
    expect_refused(dir, empty, "empty file", NULL, 0);
    snprintf(text, sizeof text, "%s/text.trc", dir);
    write_text(text, "[model]\nname = simplenet\n");
    expect_refused(dir, text, "not a trainc checkpoint", NULL, 0);
    snprintf(newer, sizeof newer, "%s/newer.trc", dir);
    copy_file(resumed_from, newer, -1, -1);
    patch_u32_resealed(newer, 8, CKPT_VERSION + 1);
    expect_refused_also(dir, newer, "newer trainc", "version 2", NULL, 0);
    const char *big[] = {"--set", "data.image_size=64"};
    expect_refused(dir, resumed_from, "another model", big, 2);
    expect_refused(dir, "/nonexistent/ckpt.trc", "cannot open", NULL, 0);
}

/* from copied to to (valid, every checksum right) with n bytes at offset at of
 * section name replaced by bytes. */
static void write_with_field(const char *from, const char *to, const char *name, size_t at, const void *bytes,
                             size_t n) {
    char err[512];
    CkptFile *f = ckpt_open(from, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    int count = ckpt_section_count(f);
    CkptWriter *w = ckpt_write_begin(to, count, err, sizeof err);
    CHECK_MSG(w != NULL, "%s", err);
    for (int i = 0; w && i < count; i++) {
        const char *section = ckpt_section_name(f, i);
        size_t size;
        unsigned char *data = read_whole_section(f, section, &size);
        if (strcmp(section, name) == 0 && at + n <= size) memcpy(data + at, bytes, n);
        if (ckpt_write_section(w, section, data, size, err, sizeof err) != 0) {
            CHECK_MSG(0, "%s", err);
            ckpt_write_abort(w);
            w = NULL;
        }
        free(data);
    }
    CHECK_MSG(w && ckpt_write_commit(w, err, sizeof err) == 0, "%s", err);
    ckpt_close(f);
}

/* Fields out of range (valid checksums: a writer's bug or a crafted file) are
 * refused naming the field by --resume and by eval, never a crash. */
static void check_fields_out_of_range(const char *dir) {
    struct { const char *section, *field; size_t at; int64_t value; } cases[] = {
        {"model", "model.act_dtype", 48, 5},          {"model", "model.act_dtype", 48, -1},
        {"model", "model.act_dtype", 48, 1000000},    {"model", "model.nhwc", 56, 7},
        {"model", "model.accumulate", 72, 0},         {"position", "position.epoch", 8, -1},
        {"position", "position.epoch_micro", 16, -5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char file[1024], cmd[4096];
        snprintf(file, sizeof file, "%s/field-%zu.trc", dir, i);
        write_with_field(resumed_from, file, cases[i].section, cases[i].at, &cases[i].value, sizeof(int64_t));
        expect_refused(dir, file, cases[i].field, NULL, 0);
        snprintf(cmd, sizeof cmd, "'%s/trainc' eval --checkpoint '%s' --config configs/baseline.ini --device cpu "
                 "--set data.source=synthetic --set data.image_size=32 --set data.synthetic_test=32 --quiet",
                 test_build_dir(), file);
        int rc = test_run_command(cmd, output, sizeof output);
        CHECK_MSG(rc != 0 && rc < 128 && strstr(output, cases[i].field) && strstr(output, file),
                  "eval of a checkpoint with %s = %lld: exit %d:\n%s", cases[i].field, (long long)cases[i].value,
                  rc, output);
    }
}

/* ---- trainc: --resume latest past a damaged checkpoint ---------------------- */

/* The newest checkpoint truncated: moved aside (beside an older .corrupt, which
 * stays as it was) with a warning naming it, and the run resumes from the one
 * before it. A newest one of a newer format stops the run and stays. */
static void check_latest_damaged(const char *dir) {
    char ckdir[768], ckset[1024], good[1024], bad[1024], earlier[1100], aside[1100], newer[1024], resumed[1200];
    snprintf(ckdir, sizeof ckdir, "%s/latest", dir);
    snprintf(ckset, sizeof ckset, "run.checkpoint_dir=%s", ckdir);
    CHECK(mkdir(ckdir, 0700) == 0);
    snprintf(good, sizeof good, "%s/ckpt-00000020.trc", ckdir);
    snprintf(bad, sizeof bad, "%s/ckpt-00000030.trc", ckdir);
    snprintf(earlier, sizeof earlier, "%s.corrupt", bad);
    snprintf(aside, sizeof aside, "%s.corrupt.2", bad);
    long whole = file_size(resumed_from);
    copy_file(resumed_from, good, -1, -1);
    copy_file(resumed_from, bad, whole / 2, -1);
    write_text(earlier, "an earlier damaged file\n");
    const char *args[] = {"--set", ckset, "--set", "run.checkpoint_every=10", "--set", "run.max_steps=22",
                          "--resume", "latest"};
    int n_args = sizeof args / sizeof *args;
    int rc = trainc(dir, args, n_args);
    snprintf(resumed, sizeof resumed, "resumed from %s", good);
    CHECK_MSG(rc == 0 && strstr(output, "\"steps\": 22"), "resume latest past a truncated one exited %d:\n%s", rc,
              output);
    CHECK_MSG(strstr(output, bad) && strstr(output, "is truncated") && strstr(output, aside) &&
                  strstr(output, resumed), "no warning naming %s and %s, or no '%s', in:\n%s", bad, aside, resumed,
              output);
    CHECK_MSG(!file_exists(bad) && file_size(aside) == whole / 2 && file_size(earlier) == 24 &&
                  file_size(good) == whole, "the damaged checkpoint was not moved aside, or a file was lost");

    snprintf(newer, sizeof newer, "%s/ckpt-00000040.trc", ckdir);
    copy_file(resumed_from, newer, -1, -1);
    patch_u32_resealed(newer, 8, 2);
    rc = trainc(dir, args, n_args);
    CHECK_MSG(rc != 0 && rc < 128, "resume latest with a newer-format newest checkpoint exited %d", rc);
    CHECK_MSG(strstr(output, newer) && strstr(output, "newer trainc") && !strstr(output, "resumed from") &&
                  file_size(newer) == whole, "newer format: not refused naming %s, or the file moved:\n%s", newer,
              output);
    /* One flipped bit in its version field (the CRC no longer matches): damage, moved aside, the one before used. */
    char flipped_aside[1100];
    snprintf(flipped_aside, sizeof flipped_aside, "%s.corrupt", newer);
    patch_u32(newer, 8, 1u | 1u << 20);
    rc = trainc(dir, args, n_args);
    CHECK_MSG(rc == 0 && strstr(output, newer) && strstr(output, "checksum") && !strstr(output, "newer trainc") &&
                  strstr(output, "resumed from") && !file_exists(newer) && file_size(flipped_aside) == whole,
              "a flipped version bit: exit %d, not moved aside to %s, or no resume:\n%s", rc, flipped_aside, output);

    /* Nothing valid: the run stops, the damaged file kept aside. */
    char none[768], noneset[1024], empty[1024], empty_aside[1100];
    snprintf(none, sizeof none, "%s/latest-none", dir);
    snprintf(noneset, sizeof noneset, "run.checkpoint_dir=%s", none);
    CHECK(mkdir(none, 0700) == 0);
    snprintf(empty, sizeof empty, "%s/ckpt-00000010.trc", none);
    snprintf(empty_aside, sizeof empty_aside, "%s.corrupt", empty);
    write_text(empty, "");
    const char *none_args[] = {"--set", noneset, "--resume", "latest"};
    rc = trainc(dir, none_args, 4);
    CHECK_MSG(rc != 0 && rc < 128 && strstr(output, "no valid checkpoint") && strstr(output, "empty file") &&
                  file_exists(empty_aside) && !file_exists(empty), "only an empty checkpoint: exit %d:\n%s", rc,
              output);
}

/* ---- trainc: a second signal in the middle of the stop's checkpoint --------- */

static void wait_for_file(const char *path, double seconds) {
    struct stat st;
    for (double waited = 0; waited < seconds && !(stat(path, &st) == 0 && st.st_size > 0); waited += 0.01) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* SIGTERM, then (trainc held by SIGSTOP while the stop's checkpoint has its
 * temporary file, so the next signal surely lands in the write) a second
 * SIGTERM: trainc exits at once and leaves no temporary file. Returns 0 when
 * the write was over before trainc stopped (try again). */
static int second_signal_in_write(const char *dir, int attempt) {
    char ckdir[768], ckset[1024], metrics[1024], metrics_set[1100], out_file[1024];
    snprintf(ckdir, sizeof ckdir, "%s/second-%d", dir, attempt);
    snprintf(ckset, sizeof ckset, "run.checkpoint_dir=%s", ckdir);
    snprintf(metrics, sizeof metrics, "%s/second-%d.jsonl", dir, attempt);
    snprintf(metrics_set, sizeof metrics_set, "run.metrics_file=%s", metrics);
    snprintf(out_file, sizeof out_file, "%s/second-%d.out", dir, attempt);
    const char *args[] = {"--set", ckset, "--set", metrics_set, "--set", "run.log_every=1", "--set", "run.epochs=50",
                          "--quiet"};
    fflush(stdout);
    pid_t pid = start_trainc(out_file, args, sizeof args / sizeof *args);
    wait_for_file(metrics, 60); /* a step is done */
    kill(pid, SIGTERM);
    int status = 0, exited = 0, seen = 0, in_write = 0;
    for (double waited = 0; waited < 60 && !exited; waited += 0.001) {
        if (count_temporaries(ckdir) > 0) {
            seen = 1;
            kill(pid, SIGSTOP);
            exited = waitpid(pid, &status, WUNTRACED) == pid && !WIFSTOPPED(status);
            in_write = !exited && count_temporaries(ckdir) > 0;
            if (in_write) kill(pid, SIGTERM);
            kill(pid, SIGCONT);
            break;
        }
        exited = waitpid(pid, &status, WNOHANG) == pid;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!exited && !seen) kill(pid, SIGKILL); /* no checkpoint write in 60 s */
    if (!exited) waitpid(pid, &status, 0);
    slurp(out_file);
    if (!in_write) return 0;
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM && strstr(output, "second signal"),
              "a second SIGTERM in the checkpoint write: status %d, output:\n%s", status, output);
    CHECK_MSG(count_temporaries(ckdir) == 0, "a temporary checkpoint file is left in %s", ckdir);
    return 1;
}

static void check_second_signal(const char *dir) {
    int hit = 0;
    for (int attempt = 0; attempt < 5 && !hit; attempt++) {
        hit = second_signal_in_write(dir, attempt);
        printf("second signal: try %d %s\n", attempt + 1, hit ? "landed in the checkpoint write" : "missed the write");
    }
    CHECK_MSG(hit, "5 tries and the second signal never came in the middle of the checkpoint write");
}

static void check_sigterm(const char *dir) {
    char ckdir[768], ckset[1024], out_file[1024], uninterrupted_set[1024];
    snprintf(ckdir, sizeof ckdir, "%s/sig", dir);
    snprintf(ckset, sizeof ckset, "run.checkpoint_dir=%s", ckdir);
    snprintf(out_file, sizeof out_file, "%s/sigterm.out", dir);
    /* 16 pixels: three runs of 96 steps at a quarter of the base's cost. */
    const char *args[] = {"--set", "run.checkpoint_every=6", "--set", ckset, "--set", "run.epochs=3",
                          "--set", "data.image_size=16", "--quiet"};
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

    /* Temporary files of writes that never finished are removed at the start, of whatever pid (one alive, in
     * another pid namespace): the run holds the folder's lock, so no one else writes there. */
    char stale[1024], live[1024];
    snprintf(stale, sizeof stale, "%s/ckpt-00000099.trc.tmp.%d", ckdir, (int)dead_pid());
    snprintf(live, sizeof live, "%s/ckpt-00000098.trc.tmp.%d", ckdir, (int)getpid());
    write_text(stale, "a write that never finished");
    write_text(live, "a write in progress");

    /* --resume latest to the end, and the run that never stopped. */
    const char *resume_args[] = {"--set", "run.checkpoint_every=6", "--set", ckset, "--set", "run.epochs=3",
                                 "--set", "data.image_size=16", "--quiet", "--resume", "latest"};
    int rc = trainc(dir, resume_args, sizeof resume_args / sizeof *resume_args);
    CHECK_MSG(rc == 0, "resume latest exited %d:\n%s", rc, output);
    CHECK(strstr(output, "\"steps\": 96") != NULL);
    unsigned long resumed = summary_crc();
    CHECK_MSG(!file_exists(stale) && !file_exists(live) && strstr(output, stale) && strstr(output, "removed"),
              "the stale %s or %s not removed with a warning:\n%s", stale, live, output);

    snprintf(uninterrupted_set, sizeof uninterrupted_set, "run.checkpoint_dir=%s/sig-whole", dir);
    const char *whole_args[] = {"--set", "run.epochs=3", "--set", "data.image_size=16", "--quiet", "--set",
                                uninterrupted_set};
    rc = trainc(dir, whole_args, sizeof whole_args / sizeof *whole_args);
    CHECK_MSG(rc == 0, "uninterrupted run exited %d:\n%s", rc, output);
    unsigned long whole = summary_crc();
    CHECK_MSG(whole != 0 && resumed == whole, "params_crc: resumed %lu, uninterrupted %lu", resumed, whole);
}

int main(void) {
    const char *tmp = test_tmpdir("checkpoint");
    char dir[512], format_dir[600];
    snprintf(dir, sizeof dir, "%s", tmp);
    snprintf(format_dir, sizeof format_dir, "%s/format", dir);
    CHECK(mkdir(format_dir, 0700) == 0);
    uint64_t rng = test_seed();
    check_crc32(&rng);
    build_by_hand(&rng);
    check_format(format_dir);
    check_format_refusals(format_dir, &rng);
    check_stale_temporaries(format_dir);
    check_resume(dir);
    check_packed(dir);
    check_nan(dir);
    check_refusals(dir);
    check_fields_out_of_range(dir);
    check_latest_damaged(dir);
    check_second_signal(dir);
    check_sigterm(dir);
    return test_finish("test_checkpoint");
}
