/* The safetensors reader enforces the format (runtime/safetensors.h): each
 * kind of invalid file (a header length one short, fractional, overlapping,
 * misaligned or gapped offsets, data after the last tensor, a span that is not
 * the shape's, a __metadata__ that is not an object of strings, a duplicate
 * key, a truncated file) is refused naming the file; a folder and a FIFO are
 * refused without blocking. Non-finite weights are refused at load by
 * run.init_from, export, predict, eval and resume, naming the tensor and the
 * first bad element. The checkpoint's meta is range-checked by predict and
 * export. A file name with terminal escapes is printed escaped. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stb_image_write.h>

#include "harness.h"
#include "models/zoo.h"
#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/safetensors.h"
#include "tools/trainer/export.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

static const char *dir;

/* A file of header (its length written as header_len + len_delta) and data_bytes bytes of data. */
static const char *write_file(const char *name, const char *header, long len_delta, size_t data_bytes) {
    size_t hl = strlen(header);
    unsigned char *buf = calloc(1, 8 + hl + data_bytes + 1);
    uint64_t len = (uint64_t)((long)hl + len_delta);
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)(len >> (8 * b));
    memcpy(buf + 8, header, hl);
    const char *path = test_write_file(dir, name, buf, 8 + hl + data_bytes);
    free(buf);
    return path;
}

static void expect_refused(const char *name, const char *header, long len_delta, size_t data_bytes,
                           const char *what) {
    char err[4400] = "";
    const char *path = write_file(name, header, len_delta, data_bytes);
    Safetensors st;
    int rc = safetensors_read(path, &st, err, sizeof err);
    safetensors_free(&st);
    CHECK_MSG(rc != 0 && strstr(err, path) && strstr(err, what), "%s: rc %d, no file name or '%s' in: %s", name, rc,
              what, err);
}

#define A_B "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}," \
            "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}"

static void test_format(void) {
    char err[4400];
    const char *good = write_file("good.safetensors", "{" A_B ",\"__metadata__\":{\"k\":\"v\"}}    ", 0, 12);
    Safetensors st;
    CHECK_MSG(safetensors_read(good, &st, err, sizeof err) == 0, "a valid file: %s", err);
    const SafetensorsTensor *b = safetensors_find(&st, "b");
    CHECK(st.n_tensors == 2 && st.metadata && b && b->count == 1 && b->data == st.bytes + st.size - 4);
    safetensors_free(&st);

    expect_refused("short-pad", "{" A_B "}    ", -1, 12, "header");
    expect_refused("short-brace", "{" A_B "}", -1, 12, "header");
    expect_refused("long", "{" A_B "}", 1, 12, "header length");
    expect_refused("tiny", "", -1000, 0, "truncated");
    expect_refused("past", "{" A_B "}", 100, 0, "truncated");
    expect_refused("cut", "{" A_B "}", 0, 10, "truncated");
    expect_refused("after", "{" A_B "}", 0, 13, "after its last tensor");
    expect_refused("garbage", "{" A_B "}  x ", 0, 12, "other than spaces");
    expect_refused("fraction", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.5,8.5]}}", 0, 9,
                   "whole numbers");
    expect_refused("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, 8, "overlap");
    expect_refused("gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}", 0, 16, "gap");
    expect_refused("misaligned", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[2,10]}}", 0, 10,
                   "not a multiple");
    expect_refused("span", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8, "span 8");
    expect_refused("dtype", "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "dtype");
    expect_refused("meta-array", "{" A_B ",\"__metadata__\":[\"k\"]}", 0, 12, "__metadata__");
    expect_refused("meta-number", "{" A_B ",\"__metadata__\":{\"k\":1}}", 0, 12, "not a string");
    expect_refused("duplicate", "{" A_B ",\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[12,12]}}", 0, 12,
                   "\"a\" twice");
    expect_refused("not-object", "[1]", 0, 0, "'{'");
}

/* 2 steps of SimpleNet on synthetic 16x16 images: a checkpoint in dir/ck. */
static Config *small_run(const char *ckdir) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    const char *fixed[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=16", "data.synthetic_train=64",
                           "data.synthetic_test=16", "train.batch=16", "run.epochs=1", "run.max_steps=2",
                           "run.checkpoint_every=2", "run.log_every=1000", "model.name=simplenet"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) test_config_set(c, "%s", fixed[i]);
    test_config_set(c, "run.checkpoint_dir=%s", ckdir);
    return c;
}

/* Section name of the checkpoint at path (malloc'ed, *bytes long, NUL-terminated), or NULL. */
static char *read_section(const char *path, const char *name, size_t *bytes) {
    char err[4400];
    CkptFile *f = ckpt_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return NULL;
    *bytes = (size_t)ckpt_section_size(f, name);
    char *data = calloc(1, *bytes + 1);
    CHECK_MSG(ckpt_read_section(f, name, data, *bytes, err, sizeof err) == 0, "%s", err);
    ckpt_close(f);
    return data;
}

/* A copy of the checkpoint ckpt at out with section name's content replaced by data. */
static void write_replaced(const char *ckpt, const char *out, const char *name, const void *data, size_t n) {
    char err[4400];
    CkptFile *f = ckpt_open(ckpt, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    int count = ckpt_section_count(f);
    CkptWriter *w = ckpt_write_begin(out, count, err, sizeof err);
    CHECK_MSG(w != NULL, "%s", err);
    for (int i = 0; w && i < count; i++) {
        const char *section = ckpt_section_name(f, i);
        size_t bytes;
        char *own = read_section(ckpt, section, &bytes);
        int replaced = strcmp(section, name) == 0;
        CHECK_MSG(ckpt_write_section(w, section, replaced ? data : own, replaced ? n : bytes, err, sizeof err) == 0,
                  "%s", err);
        free(own);
    }
    if (w) CHECK_MSG(ckpt_write_commit(w, err, sizeof err) == 0, "%s", err);
    ckpt_close(f);
}

/* A copy of ckpt at out with its params section's element 'at' set to value. */
static void write_poisoned(const char *ckpt, const char *out, size_t at, float value) {
    size_t bytes;
    char *params = read_section(ckpt, "params", &bytes);
    if (params) memcpy(params + at * sizeof(float), &value, sizeof value);
    write_replaced(ckpt, out, "params", params, bytes);
    free(params);
}

/* A copy of ckpt at out whose meta section has its first 'from' replaced by 'to'. */
static void write_meta_changed(const char *ckpt, const char *out, const char *from, const char *to) {
    size_t bytes;
    char *meta = read_section(ckpt, "meta", &bytes), changed[16384];
    char *at = meta ? strstr(meta, from) : NULL;
    CHECK_MSG(at != NULL, "no '%s' in the meta section: %s", from, meta ? meta : "");
    if (at) {
        snprintf(changed, sizeof changed, "%.*s%s%s", (int)(at - meta), meta, to, at + strlen(from));
        write_replaced(ckpt, out, "meta", changed, strlen(changed));
    }
    free(meta);
}

static void expect_command_fails(const char *what, const char *args, const char *needle, const char *also) {
    char cmd[8192], out[16384];
    snprintf(cmd, sizeof cmd, "timeout 60 %s/trainc %s", test_build_dir(), args);
    int rc = test_run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, needle) && (!also || strstr(out, also)),
              "%s: trainc %s exited %d (expected 1, with '%s' and '%s'):\n%s", what, args, rc, needle,
              also ? also : "", out);
}

static void test_non_finite_and_special_files(void) {
    char ckdir[1100], ckpt[1200], file[1200], nan_ckpt[1200], inf_file[1200], err[4400];
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-00000002.trc", ckdir);
    snprintf(file, sizeof file, "%s/w.safetensors", dir);
    snprintf(nan_ckpt, sizeof nan_ckpt, "%s/nan.trc", dir);
    snprintf(inf_file, sizeof inf_file, "%s/inf.safetensors", dir);
    Config *c = small_run(ckdir);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
    char *argv[] = {"export", "--checkpoint", ckpt, "--format", "safetensors", "--out", file, NULL};
    CHECK(export_main(7, argv) == 0);

    Model *m = calloc(1, sizeof *m);
    CHECK(model_build(m, "simplenet", 1, 16, 10, 0, err, sizeof err) == 0);
    model_finalize(m, NULL, 1);
    CHECK_MSG(import_safetensors(m, file, err, sizeof err) == 0, "%s", err);
    /* run.init_from: +Inf in the third float of its first tensor. */
    char *bytes = test_read_file(file);
    struct stat info;
    CHECK(bytes && stat(file, &info) == 0);
    uint64_t hl = 0;
    for (int b = 0; bytes && b < 8; b++) hl |= (uint64_t)(unsigned char)bytes[b] << (8 * b);
    float inf = INFINITY;
    if (bytes) memcpy(bytes + 8 + hl + 2 * sizeof(float), &inf, sizeof inf);
    test_write_file(dir, "inf.safetensors", bytes, (size_t)info.st_size);
    free(bytes);
    CHECK_MSG(import_safetensors(m, inf_file, err, sizeof err) != 0 && strstr(err, inf_file) &&
                  strstr(err, "features.0.weight") && strstr(err, "+Inf at element 2"), "%s", err);
    /* A folder and a FIFO: refused, without blocking or a giant allocation. */
    CHECK_MSG(import_safetensors(m, dir, err, sizeof err) != 0 && strstr(err, dir) && strstr(err, "is a directory"),
              "%s", err);
    char fifo[1200];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_MSG(import_safetensors(m, fifo, err, sizeof err) != 0 && strstr(err, fifo) && strstr(err, "FIFO"), "%s",
              err);
    model_destroy(m);
    free(m);

    /* The checkpoint with NaN in its params: export, predict, eval and resume refuse it naming the tensor. */
    write_poisoned(ckpt, nan_ckpt, 5, NAN);
    CheckpointWeights w;
    CHECK_MSG(checkpoint_weights_read(nan_ckpt, &w, err, sizeof err) != 0 && strstr(err, nan_ckpt) &&
                  strstr(err, "features.0.weight") && strstr(err, "NaN at element"), "%s", err);
    char args[4096], png[1200];
    snprintf(args, sizeof args, "export --checkpoint %s --format safetensors --out %s/x.safetensors", nan_ckpt, dir);
    expect_command_fails("export", args, "NaN at element", "features.0.weight");
    snprintf(png, sizeof png, "%s/x.png", dir);
    unsigned char pixels[16 * 16 * 3] = {0};
    CHECK(stbi_write_png(png, 16, 16, 3, pixels, 16 * 3));
    snprintf(args, sizeof args, "predict --checkpoint %s %s", nan_ckpt, png);
    expect_command_fails("predict", args, "NaN at element", "features.0.weight");
    /* predict's images: a folder is a directory, a FIFO does not block. */
    snprintf(args, sizeof args, "predict --checkpoint %s %s", ckpt, dir);
    expect_command_fails("predict a folder", args, "is a directory", dir);
    snprintf(args, sizeof args, "predict --checkpoint %s %s", ckpt, fifo);
    expect_command_fails("predict a FIFO", args, "FIFO", fifo);
    /* The meta's fields range-checked: an image size that would overflow, a layout of neither kind. */
    const char *bad_meta[][3] = {{"\"image_size\":16", "\"image_size\":100000", "image_size"},
                                 {"\"layout\":\"nchw\"", "\"layout\":\"xyz\"", "layout"},
                                 {"\"num_classes\":10", "\"num_classes\":-3", "num_classes"},
                                 {"\"std\":[", "\"std\":[0,", "std"}};
    for (size_t i = 0; i < sizeof bad_meta / sizeof *bad_meta; i++) {
        char bad[1200];
        snprintf(bad, sizeof bad, "%s/meta%zu.trc", dir, i);
        write_meta_changed(ckpt, bad, bad_meta[i][0], bad_meta[i][1]);
        snprintf(args, sizeof args, "predict --checkpoint %s %s", bad, png);
        expect_command_fails("predict, meta", args, bad_meta[i][2], bad);
        snprintf(args, sizeof args, "export --checkpoint %s --format safetensors --out %s/m.safetensors", bad, dir);
        expect_command_fails("export, meta", args, bad_meta[i][2], bad);
    }
    /* A file name with a terminal escape and a newline is printed escaped. */
    char odd[1300], cmd[4096], out[16384];
    snprintf(odd, sizeof odd, "%s/a\033[31mred\nline.png", dir);
    CHECK(rename(png, odd) == 0);
    snprintf(cmd, sizeof cmd, "%s/trainc predict --checkpoint %s \"$(printf '%%s/a\\033[31mred\\nline.png' %s)\"",
             test_build_dir(), ckpt, dir);
    int rc = test_run_command(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "a\\x1b[31mred\\x0aline.png") && !strchr(out, '\033'),
              "predict of an oddly named file: exit %d:\n%s", rc, out);
    char escaped[64];
    CHECK(strcmp(log_escape("x\\y\x7f\tz", escaped, sizeof escaped), "x\\\\y\\x7f\\x09z") == 0);
    CHECK(strlen(log_escape("\n\n\n\n", escaped, 9)) == 8); /* two escapes fit, never half of one */
    char ini[1200];
    snprintf(ini, sizeof ini, "%s/run.ini", dir);
    FILE *f = fopen(ini, "w");
    fprintf(f, "[run]\ndevice = cpu\nlog_every = 1000\n[data]\nsource = synthetic\nimage_size = 16\n"
               "synthetic_train = 64\nsynthetic_test = 16\n[train]\nbatch = 16\n[model]\nname = simplenet\n");
    fclose(f);
    snprintf(args, sizeof args, "eval --config %s --checkpoint %s", ini, nan_ckpt);
    expect_command_fails("eval", args, "NaN at element", "features.0.weight");
    snprintf(args, sizeof args, "--config %s --set run.max_steps=3 --set run.save_final=off --resume %s", ini,
             nan_ckpt);
    expect_command_fails("resume", args, "NaN at element", "features.0.weight");
    snprintf(args, sizeof args, "--config %s --set run.max_steps=1 --set run.save_final=off --set run.init_from=%s",
             ini, fifo);
    expect_command_fails("run.init_from a FIFO", args, "FIFO", "run.init_from");
}

int main(void) {
    dir = test_tmpdir("safetensors");
    test_format();
    test_non_finite_and_special_files();
    return test_finish("test_safetensors");
}
