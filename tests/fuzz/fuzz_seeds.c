/* Writes the fuzz targets' seed corpora, made at run time from the project's
 * own writers: fuzz_seeds DIR makes DIR/{config,image_folder,cifar,checkpoint,shards,safetensors,ckpt_json}/
 * and DIR/config.dict (trainc's section and key names, for libFuzzer's -dict). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <stb_image_write.h>

#include "data/shards.h"
#include "data/transform.h"
#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "tests/fuzz/fuzz_common.h"
#include "tools/trainer/keys.h"

typedef struct {
    uint8_t *bytes;
    size_t size, cap;
} Buffer;

static void put(Buffer *b, const void *data, size_t n) {
    if (b->size + n > b->cap) {
        b->cap = 2 * (b->size + n);
        b->bytes = realloc(b->bytes, b->cap);
        if (!b->bytes) fuzz_fail("out of memory");
    }
    memcpy(b->bytes + b->size, data, n);
    b->size += n;
}

static void put_str(Buffer *b, const char *s) { put(b, s, strlen(s)); }

static void put_sep(Buffer *b) { put(b, FUZZ_SEP, FUZZ_SEP_LEN); }

static void write_seed(const char *dir, const char *name, const Buffer *b) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->bytes, 1, b->size, f) != b->size || fclose(f) != 0)
        fuzz_fail("cannot write %s: %s", path, strerror(errno));
}

static void make_dir(const char *path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST) fuzz_fail("mkdir %s: %s", path, strerror(errno));
}

/* ------------------------------------------------------------------ config */

static void config_seeds(const char *dir) {
    /* Every key at its default, as config_print writes it. */
    Config *c = config_new(trainc_keys, trainc_n_keys);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    config_print(c, f);
    fclose(f);
    config_free(c);
    Buffer all = {0};
    put(&all, text, len);
    write_seed(dir, "defaults", &all);
    free(text);

    static const char *seeds[][2] = {
        {"includes",
         "[run]\nname = seed\nepochs = 2\ninclude = b.ini\n[optim]\nlr = 0.05  # after the include\n" FUZZ_SEP
         "# base\n[run]\nseed = 7\ninclude = sub/c.ini\n" FUZZ_SEP
         "; leaf\n[run]\nlog_every = 10\ndevice = cpu\neval = off\n" FUZZ_SEP
         "run.seed=5\nrun.name = from --set\n"},
        {"cycle", "include = b.ini\n" FUZZ_SEP "include = a.ini\n"},
        {"up", "include = sub/c.ini\n[run]\nepochs = 1\n" FUZZ_SEP "[run]\nseed = 3\n" FUZZ_SEP
               "include = ../b.ini\n[run]\nseed = 4\n"},
        {"sets",
         "[run]\nepochs = 1\n" FUZZ_SEP FUZZ_SEP FUZZ_SEP "run.epochs=4\nrun.device=cpu\nrun.eval=yes\n"},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        Buffer b = {0};
        put_str(&b, seeds[i][1]);
        write_seed(dir, seeds[i][0], &b);
        free(b.bytes);
    }
    free(all.bytes);
}

/* Section names, key names and enum choices, one quoted entry a line. */
static void config_dict(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) fuzz_fail("cannot write %s: %s", path, strerror(errno));
    fprintf(f, "\"include = \"\n\"\\x0a@@\\x0a\"\n");
    for (int k = 0; k < trainc_n_keys; k++) {
        const CfgKeySpec *spec = &trainc_keys[k];
        const char *dot = strchr(spec->key, '.');
        fprintf(f, "\"[%.*s]\"\n\"%s\"\n\"%s\"\n", (int)(dot - spec->key), spec->key, dot + 1, spec->key);
        for (const char *p = spec->choices; p && *p;) {
            size_t n = strcspn(p, "|");
            fprintf(f, "\"%.*s\"\n", (int)n, p);
            p += n + (p[n] == '|');
        }
    }
    if (fclose(f) != 0) fuzz_fail("cannot write %s: %s", path, strerror(errno));
}

/* ------------------------------------------------------------ image folder */

static void to_buffer(void *context, void *data, int size) { put(context, data, (size_t)size); }

/* A w x h image of the given kind ("png", "bmp", "jpg"), as the fuzz target's
 * file record: the class/extension byte, then the encoded bytes. */
static void put_image(Buffer *b, int class_index, const char *kind, int w, int h, uint64_t *rng) {
    uint8_t pixels[3 * 8 * 8];
    for (int i = 0; i < 3 * w * h; i++) pixels[i] = (uint8_t)rng_splitmix64(rng);
    Buffer image = {0};
    int ok = strcmp(kind, "png") == 0   ? stbi_write_png_to_func(to_buffer, &image, w, h, 3, pixels, 3 * w)
             : strcmp(kind, "bmp") == 0 ? stbi_write_bmp_to_func(to_buffer, &image, w, h, 3, pixels)
                                        : stbi_write_jpg_to_func(to_buffer, &image, w, h, 3, pixels, 90);
    if (!ok) fuzz_fail("stb_image_write could not make a %s", kind);
    int ext = strcmp(kind, "png") == 0 ? 0 : strcmp(kind, "bmp") == 0 ? 1 : 2;
    uint8_t pick = (uint8_t)(class_index | ext << 2);
    if (b->size > 1) put_sep(b); /* after the limit byte, files are separated */
    put(b, &pick, 1);
    put(b, image.bytes, image.size);
    if (memmem(image.bytes, image.size, FUZZ_SEP, FUZZ_SEP_LEN)) fuzz_fail("a seed image holds FUZZ_SEP");
    free(image.bytes);
}

static void image_folder_seeds(const char *dir) {
    uint64_t rng = 1;
    Buffer b = {0};
    uint8_t limit = 0;
    put(&b, &limit, 1);
    put_image(&b, 0, "png", 2, 2, &rng);
    put_image(&b, 1, "bmp", 2, 2, &rng);
    put_image(&b, 1, "jpg", 2, 2, &rng);
    write_seed(dir, "three_kinds", &b);

    b.size = 0;
    limit = 2;
    put(&b, &limit, 1);
    for (int k = 0; k < 3; k++) put_image(&b, k, "png", 3, 2, &rng);
    write_seed(dir, "limit", &b);

    b.size = 0;
    limit = 0;
    put(&b, &limit, 1);
    put_image(&b, 2, "bmp", 1, 1, &rng);
    put_sep(&b);
    put_str(&b, "\x0e" "not an image"); /* class 2, .txt */
    write_seed(dir, "with_text", &b);
    free(b.bytes);
}

/* ------------------------------------------------------------------- CIFAR */

static void put_records(Buffer *b, int n, uint64_t *rng) {
    uint8_t record[3073];
    for (int r = 0; r < n; r++) {
        record[0] = (uint8_t)(rng_splitmix64(rng) % 10);
        for (size_t p = 1; p < sizeof record; p++) record[p] = (uint8_t)rng_splitmix64(rng);
        put(b, record, sizeof record);
    }
}

static void cifar_seeds(const char *dir) {
    uint64_t rng = 2;
    Buffer b = {0};
    uint8_t mode = 0; /* test_batch.bin, no limit */
    put(&b, &mode, 1);
    put_records(&b, 3, &rng);
    write_seed(dir, "test", &b);

    b.size = 0;
    mode = 1 | 3 << 1; /* five training files, limit 3 */
    put(&b, &mode, 1);
    for (int i = 0; i < 5; i++) {
        if (i) put_sep(&b);
        put_records(&b, 1, &rng);
    }
    FuzzPart parts[5];
    if (fuzz_split(b.bytes + 1, b.size - 1, parts, 5) != 5 || parts[4].size != 3073)
        fuzz_fail("a seed CIFAR record holds FUZZ_SEP");
    write_seed(dir, "train", &b);
    free(b.bytes);
}

/* ------------------------------------------------------------------ shards */

/* A shard that trainc pack writes from a folder of three images (and one made
 * by hand with a label missing), as the target's input: the tar's bytes. */
static void shard_seeds(const char *dir, const char *scratch) {
    uint64_t rng = 3;
    static const char *kinds[] = {"jpg", "png", "bmp"};
    char path[4096], err[4600];
    snprintf(path, sizeof path, "%s/folder", scratch);
    make_dir(path);
    snprintf(path, sizeof path, "%s/folder/train", scratch);
    make_dir(path);
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/folder/train/c%d", scratch, k);
        make_dir(path);
        Buffer image = {0};
        uint8_t pixels[3 * 4 * 3];
        for (size_t i = 0; i < sizeof pixels; i++) pixels[i] = (uint8_t)rng_splitmix64(&rng);
        int ok = k == 0 ? stbi_write_jpg_to_func(to_buffer, &image, 4, 3, 3, pixels, 90)
               : k == 1 ? stbi_write_png_to_func(to_buffer, &image, 4, 3, 3, pixels, 12)
                        : stbi_write_bmp_to_func(to_buffer, &image, 4, 3, 3, pixels);
        if (!ok) fuzz_fail("stb_image_write could not make a %s", kinds[k]);
        snprintf(path, sizeof path, "%s/folder/train/c%d/0.%s", scratch, k, kinds[k]);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(image.bytes, 1, image.size, f) != image.size || fclose(f) != 0) fuzz_fail("writing %s", path);
        free(image.bytes);
    }
    Source s;
    snprintf(path, sizeof path, "%s/folder", scratch);
    if (source_open_folder(&s, path, "train", 0, err, sizeof err) != 0) fuzz_fail("%s", err);
    snprintf(path, sizeof path, "%s/packed", scratch);
    PackOptions opt = {.shard_bytes = 1 << 20, .shuffle = 0};
    int shards;
    if (shards_write(&s, path, "train", &opt, &shards, err, sizeof err) != 0) fuzz_fail("%s", err);
    source_free(&s);
    char from[4200], to[4200];
    snprintf(from, sizeof from, "%s/packed/train-000000.tar", scratch);
    snprintf(to, sizeof to, "%s/packed", dir);
    if (rename(from, to) != 0) fuzz_fail("cannot move %s to %s: %s", from, to, strerror(errno));
}

/* -------------------------------------------------------------- checkpoint */

static void checkpoint_seed(const char *dir, const char *name, int n_sections) {
    static const char *section_names[] = {"params", "momentum", "empty"};
    char path[4096], err[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CkptWriter *w = ckpt_write_begin(path, n_sections, err, sizeof err);
    if (!w) fuzz_fail("%s", err);
    float values[16];
    for (int i = 0; i < 16; i++) values[i] = 0.25f * (float)i;
    for (int s = 0; s < n_sections; s++)
        if (ckpt_write_section(w, section_names[s], values, s == 2 ? 0 : sizeof values, err, sizeof err) != 0)
            fuzz_fail("%s", err);
    if (ckpt_write_commit(w, err, sizeof err) != 0) fuzz_fail("%s", err);
}

/* ------------------------------------------------ safetensors, ckpt_json */

static void safetensors_seed(const char *dir) {
    static const char header[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                 "\"b\":{\"dtype\":\"F16\",\"shape\":[1,2],\"data_offsets\":[8,12]},"
                                 "\"__metadata__\":{\"format\":\"pt\"}}   ";
    Buffer b = {0};
    uint64_t len = sizeof header - 1;
    uint8_t le[8], tensors[12] = {0, 0, 128, 63, 0, 0, 0, 64, 0, 60, 0, 60};
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
    put(&b, le, 8);
    put_str(&b, header);
    put(&b, tensors, sizeof tensors);
    write_seed(dir, "two_tensors", &b);
    free(b.bytes);
}

static void ckpt_json_seed(const char *dir) {
    Buffer b = {0};
    put_str(&b, "{\"model\":\"simplenet\",\"num_classes\":2,\"image_size\":32,\"in_channels\":3,"
                "\"layout\":\"nchw\",\"mean\":[0.4914,0.4822,0.4465],\"std\":[0.247,0.2435,0.2616],"
                "\"eval_resize\":0,\"bn_eps\":[1e-05],\"class_names\":[\"cat\",\"dog\"]}");
    put_sep(&b);
    put_str(&b, "[{\"name\":\"features.0.weight\",\"shape\":[64,3,3,3],\"dtype\":\"F32\",\"section\":\"params\","
                "\"offset\":0},{\"name\":\"bn.running_mean\",\"shape\":[64],\"dtype\":\"F32\","
                "\"section\":\"bn_stats\",\"offset\":0}]");
    write_seed(dir, "meta_and_tensors", &b);
    free(b.bytes);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    static const char *targets[] = {"config", "image_folder", "cifar", "checkpoint", "shards", "safetensors",
                                    "ckpt_json"};
    char dir[4096], scratch[4096];
    make_dir(argv[1]);
    for (int t = 0; t < (int)(sizeof targets / sizeof *targets); t++) {
        snprintf(dir, sizeof dir, "%s/%s", argv[1], targets[t]);
        make_dir(dir);
    }
    snprintf(dir, sizeof dir, "%s/config", argv[1]);
    config_seeds(dir);
    snprintf(dir, sizeof dir, "%s/config.dict", argv[1]);
    config_dict(dir);
    snprintf(dir, sizeof dir, "%s/image_folder", argv[1]);
    image_folder_seeds(dir);
    snprintf(dir, sizeof dir, "%s/cifar", argv[1]);
    cifar_seeds(dir);
    snprintf(dir, sizeof dir, "%s/checkpoint", argv[1]);
    checkpoint_seed(dir, "three_sections", 3);
    checkpoint_seed(dir, "no_sections", 0);
    snprintf(dir, sizeof dir, "%s/shards", argv[1]);
    snprintf(scratch, sizeof scratch, "%s/shards-scratch", argv[1]);
    make_dir(scratch);
    shard_seeds(dir, scratch);
    snprintf(dir, sizeof dir, "%s/safetensors", argv[1]);
    safetensors_seed(dir);
    snprintf(dir, sizeof dir, "%s/ckpt_json", argv[1]);
    ckpt_json_seed(dir);
    return 0;
}
