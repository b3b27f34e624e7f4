/* The CIFAR-10 binary and image-folder readers on small files written here,
 * their error messages, and the real CIFAR-10 JPEG folder when it is around. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stb_image_write.h>
#include <zlib.h>

#include "data/dataset.h"
#include "runtime/log.h"
#include "tests/harness.h"

#define RECORD 3073

static char err[2048];

/* ---- CIFAR-10 binary ---- */

static uint8_t *make_records(int count, uint64_t *rng) {
    uint8_t *rec = malloc((size_t)count * RECORD);
    for (int r = 0; r < count; r++) {
        rec[r * RECORD] = (uint8_t)test_uniform(rng, 0, 10);
        for (int p = 1; p < RECORD; p++) rec[r * RECORD + p] = (uint8_t)test_uniform(rng, 0, 256);
    }
    return rec;
}

static void write_batch(const char *dir, const char *name, const uint8_t *rec, size_t bytes) {
    test_write_file(dir, name, rec, bytes);
}

/* Writes data_batch_1..5 (train_counts[i] records) and test_batch (test_count). */
static uint8_t *write_cifar(const char *dir, const int *train_counts, int test_count,
                            uint8_t **test_records, uint64_t *rng) {
    int total = 0;
    for (int i = 0; i < 5; i++) total += train_counts[i];
    uint8_t *all = make_records(total, rng);
    const uint8_t *p = all;
    for (int i = 0; i < 5; i++) {
        char name[64];
        snprintf(name, sizeof name, "data_batch_%d.bin", i + 1);
        write_batch(dir, name, p, (size_t)train_counts[i] * RECORD);
        p += (size_t)train_counts[i] * RECORD;
    }
    *test_records = make_records(test_count, rng);
    write_batch(dir, "test_batch.bin", *test_records, (size_t)test_count * RECORD);
    return all;
}

static int dataset_matches_records(const Dataset *d, const uint8_t *rec, int count) {
    if (d->n != count || d->c != 3 || d->h != 32 || d->w != 32 || d->num_classes != 10) return 0;
    for (int i = 0; i < count; i++) {
        if (d->labels[i] != rec[(size_t)i * RECORD]) return 0;
        if (memcmp(dataset_image(d, i), rec + (size_t)i * RECORD + 1, 3072) != 0) return 0;
    }
    return 1;
}

static void test_cifar_bin(void) {
    uint64_t rng = test_seed();
    char dir[512];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("cifar-bin"));
    const int counts[5] = {3, 2, 1, 2, 2};
    uint8_t *test_rec;
    uint8_t *train_rec = write_cifar(dir, counts, 4, &test_rec, &rng);
    Dataset d;
    CHECK(cifar_bin_load(&d, dir, 1, 0, err, sizeof err) == 0);
    CHECK(dataset_matches_records(&d, train_rec, 10));
    CHECK(dataset_image_bytes(&d) == 3072);
    dataset_free(&d);
    CHECK(cifar_bin_load(&d, dir, 1, 4, err, sizeof err) == 0); /* across files 1 and 2 */
    CHECK(dataset_matches_records(&d, train_rec, 4));
    dataset_free(&d);
    CHECK(cifar_bin_load(&d, dir, 0, 0, err, sizeof err) == 0);
    CHECK(dataset_matches_records(&d, test_rec, 4));
    dataset_free(&d);

    /* A truncated last record in data_batch_3: 2 records and 100 bytes. */
    uint8_t *rec = make_records(3, &rng);
    write_batch(dir, "data_batch_3.bin", rec, 2 * RECORD + 100);
    CHECK(cifar_bin_load(&d, dir, 1, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "data_batch_3.bin") && strstr(err, "record 2"), "%s", err);
    /* Shorter than one record. */
    write_batch(dir, "data_batch_3.bin", rec, 10);
    CHECK(cifar_bin_load(&d, dir, 1, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "data_batch_3.bin") && strstr(err, "record 0"), "%s", err);
    /* Empty. */
    write_batch(dir, "data_batch_3.bin", rec, 0);
    CHECK(cifar_bin_load(&d, dir, 1, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "data_batch_3.bin") && strstr(err, "empty"), "%s", err);
    write_batch(dir, "data_batch_3.bin", rec, RECORD);

    /* A label out of range in the test batch. */
    uint8_t *bad = make_records(3, &rng);
    bad[2 * RECORD] = 10;
    write_batch(dir, "test_batch.bin", bad, 3 * RECORD);
    CHECK(cifar_bin_load(&d, dir, 0, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "test_batch.bin") && strstr(err, "label 10") && strstr(err, "record 2"),
              "%s", err);

    /* A missing file: the message says where to get CIFAR-10. */
    char path[1024];
    snprintf(path, sizeof path, "%s/data_batch_4.bin", dir);
    unlink(path);
    CHECK(cifar_bin_load(&d, dir, 1, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, path) && strstr(err, "No such file or directory") &&
                  strstr(err, "https://www.cs.toronto.edu/~kriz/cifar.html"),
              "%s", err);
    CHECK(d.pixels == NULL && d.labels == NULL && d.n == 0);
    /* The test batch missing, the folder missing, a file given as the folder. */
    snprintf(path, sizeof path, "%s/test_batch.bin", dir);
    unlink(path);
    CHECK(cifar_bin_load(&d, dir, 0, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, path) && strstr(err, "No such file") && strstr(err, "cifar-10-binary"),
              "%s", err);
    snprintf(path, sizeof path, "%s/nowhere", dir);
    CHECK(cifar_bin_load(&d, path, 1, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "nowhere/data_batch_1.bin") && strstr(err, "No such file") &&
                  strstr(err, "cifar-10-binary"),
              "%s", err);
    snprintf(path, sizeof path, "%s/data_batch_1.bin", dir);
    CHECK(cifar_bin_load(&d, path, 1, 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "data_batch_1.bin/data_batch_1.bin") && strstr(err, "Not a directory"),
              "%s", err);
    free(rec);
    free(bad);
    free(train_rec);
    free(test_rec);
}

/* ---- image folders ---- */

/* A w x h RGB image: pixel (y, x) channel ch is (tag * 37 + y * 11 + x * 5 + ch * 70) % 256. */
static uint8_t pixel_value(int tag, int y, int x, int ch) {
    return (uint8_t)((tag * 37 + y * 11 + x * 5 + ch * 70) % 256);
}

static void write_image(const char *dir, const char *name, int tag, int w, int h) {
    uint8_t *hwc = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < 3; ch++) hwc[(y * w + x) * 3 + ch] = pixel_value(tag, y, x, ch);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const char *dot = strrchr(name, '.');
    int bmp = !strcmp(dot, ".bmp") || !strcmp(dot, ".BMP");
    int ok = bmp ? stbi_write_bmp(path, w, h, 3, hwc) : stbi_write_png(path, w, h, 3, hwc, w * 3);
    if (!ok) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    free(hwc);
}

static int image_has_tag(const Dataset *d, int i, int tag) {
    const uint8_t *img = dataset_image(d, i);
    for (int ch = 0; ch < 3; ch++)
        for (int y = 0; y < d->h; y++)
            for (int x = 0; x < d->w; x++)
                if (img[(ch * d->h + y) * d->w + x] != pixel_value(tag, y, x, ch)) return 0;
    return 1;
}

static const char *make_dir(const char *a, const char *b) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", a, b);
    mkdir(path, 0755);
    return path;
}

static void test_image_folder(void) {
    char root[512], split[600], cls[700];
    snprintf(root, sizeof root, "%s", test_tmpdir("image-folder"));
    snprintf(split, sizeof split, "%s", make_dir(root, "train"));
    /* Classes in unsorted creation order; files likewise; a stray text file. */
    const int w = 5, h = 4;
    snprintf(cls, sizeof cls, "%s", make_dir(split, "cat"));
    write_image(cls, "b.png", 20, w, h);
    write_image(cls, "a.bmp", 21, w, h);
    write_image(cls, "c.PNG", 22, w, h);
    snprintf(cls, sizeof cls, "%s", make_dir(split, "ant"));
    write_image(cls, "z.png", 0, w, h);
    write_image(cls, "m.bmp", 1, w, h);
    write_image(cls, "a.png", 2, w, h);
    test_write_file(cls, "notes.txt", "not an image", 12);
    snprintf(cls, sizeof cls, "%s", make_dir(split, "bee"));
    write_image(cls, "x.png", 10, w, h);
    write_image(cls, "y.png", 11, w, h);

    Dataset d;
    CHECK_MSG(image_folder_load(&d, root, "train", 0, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 8 && d.c == 3 && d.h == h && d.w == w && d.num_classes == 3);
    /* ant: a.png m.bmp z.png; bee: x y; cat: a.bmp b.png c.PNG */
    const int tags[8] = {2, 1, 0, 10, 11, 21, 20, 22};
    const int labels[8] = {0, 0, 0, 1, 1, 2, 2, 2};
    for (int i = 0; i < 8 && i < d.n; i++) {
        CHECK_MSG(d.labels[i] == labels[i], "image %d label %d", i, d.labels[i]);
        CHECK_MSG(image_has_tag(&d, i, tags[i]), "image %d pixels", i);
    }
    dataset_free(&d);

    /* limit 4 over 3 classes: one each, then one more for the first class. */
    CHECK(image_folder_load(&d, root, "train", 4, err, sizeof err) == 0);
    CHECK(d.n == 4);
    const int limited_tags[4] = {2, 1, 10, 21}, limited_labels[4] = {0, 0, 1, 2};
    for (int i = 0; i < 4 && i < d.n; i++)
        CHECK(d.labels[i] == limited_labels[i] && image_has_tag(&d, i, limited_tags[i]));
    dataset_free(&d);
    /* limit 7: bee has only 2, the others take the rest. */
    CHECK(image_folder_load(&d, root, "train", 7, err, sizeof err) == 0);
    int per_class[3] = {0};
    for (int i = 0; i < d.n; i++) per_class[d.labels[i]]++;
    CHECK(d.n == 7 && per_class[1] == 2 && per_class[0] + per_class[2] == 5 &&
          abs(per_class[0] - per_class[2]) <= 1);
    dataset_free(&d);

    /* A missing split. */
    CHECK(image_folder_load(&d, root, "val", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "/val") && strstr(err, "No such file") &&
                  strstr(err, "<root>/<split>/<class>/<image>") &&
                  strstr(err, "cifar10-jpg.tar.gz"),
              "%s", err);
    /* A split without class folders; one with only images, no class folders. */
    char empty[600];
    snprintf(empty, sizeof empty, "%s", make_dir(root, "empty"));
    CHECK(image_folder_load(&d, root, "empty", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "/empty") && strstr(err, "no class folders") &&
                  strstr(err, "<root>/<split>/<class>/<image>"),
              "%s", err);
    write_image(empty, "loose.png", 0, w, h);
    CHECK(image_folder_load(&d, root, "empty", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "/empty") && strstr(err, "no class folders"), "%s", err);
    /* A class folder without images. */
    snprintf(cls, sizeof cls, "%s", make_dir(split, "dog"));
    test_write_file(cls, "readme.txt", "x", 1);
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "train/dog") && strstr(err, "no images"), "%s", err);
    /* An image that does not decode, among good ones. */
    write_image(cls, "a.png", 30, w, h);
    write_image(cls, "c.png", 31, w, h);
    test_write_file(cls, "b.jpg", "garbage, not a JPEG at all", 26);
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "train/dog/b.jpg") && strstr(err, "cannot decode"), "%s", err);
    CHECK(d.pixels == NULL && d.n == 0);
    /* An image of another size in place of the broken one. */
    char broken[800];
    snprintf(broken, sizeof broken, "%s/b.jpg", cls);
    unlink(broken);
    write_image(cls, "b.png", 32, w + 1, h);
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -2); /* another size: stream it */
    CHECK_MSG(strstr(err, "train/dog/b.png") && strstr(err, "6x4") && strstr(err, "5x4"), "%s",
              err);
    /* With it fixed, the fourth class loads. */
    write_image(cls, "b.png", 32, w, h);
    CHECK_MSG(image_folder_load(&d, root, "train", 0, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 11 && d.num_classes == 4 && d.labels[10] == 3 && image_has_tag(&d, 9, 32));
    dataset_free(&d);
}

/* A FIFO (or any file that is not a regular one) named like an image is left out, never opened (it would block),
 * and a warning names it. */
static const char *fifo_root;

static void load_fifo_folder(void *arg) {
    (void)arg;
    Dataset d;
    int rc = image_folder_load(&d, fifo_root, "train", 0, err, sizeof err);
    if (rc != 0) fprintf(stderr, "load failed: %s\n", err);
    exit(rc == 0 && d.n == 2 ? 0 : 3);
}

static void test_image_folder_fifo(void) {
    char root[512], split[600], cls[700], fifo[800];
    snprintf(root, sizeof root, "%s", test_tmpdir("image-folder-fifo"));
    snprintf(split, sizeof split, "%s", make_dir(root, "train"));
    snprintf(cls, sizeof cls, "%s", make_dir(split, "cat"));
    write_image(cls, "a.png", 1, 5, 4);
    write_image(cls, "c.png", 2, 5, 4);
    snprintf(fifo, sizeof fifo, "%s/b.png", cls);
    CHECK_MSG(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    fifo_root = root;
    int status = 0;
    char *out = test_child_stderr("fifo", load_fifo_folder, NULL, &status);
    CHECK_MSG(status == 0 && strstr(out, "left out") && strstr(out, "cat/b.png: a FIFO"), "exit %d: %s", status, out);
    free(out);
}

static void test_jpeg_round_trip(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("jpeg"));
    make_dir(dir, "test");
    char cls[600];
    snprintf(cls, sizeof cls, "%s/test/only", dir);
    mkdir(cls, 0755);
    uint8_t hwc[8 * 8 * 3];
    for (int i = 0; i < 8 * 8; i++) hwc[3 * i] = 200, hwc[3 * i + 1] = 100, hwc[3 * i + 2] = 50;
    char path[700];
    snprintf(path, sizeof path, "%s/0.jpg", cls);
    CHECK(stbi_write_jpg(path, 8, 8, 3, hwc, 95));
    Dataset d;
    CHECK_MSG(image_folder_load(&d, dir, "test", 0, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 1 && d.h == 8 && d.w == 8);
    if (d.n == 1) {
        const uint8_t *img = dataset_image(&d, 0);
        CHECK(abs(img[0] - 200) <= 4 && abs(img[64] - 100) <= 4 && abs(img[128] - 50) <= 4);
    }
    dataset_free(&d);
}

/* ---- images with headers by hand, bad image files ---- */

static void put_le(uint8_t *p, uint32_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The 54-byte header of a 24-bit BMP of w x h; height < 0: top-down rows. */
static void bmp_header(uint8_t *f, int w, int height, size_t file_bytes) {
    memset(f, 0, 54);
    f[0] = 'B';
    f[1] = 'M';
    put_le(f + 2, (uint32_t)file_bytes, 4);
    put_le(f + 10, 54, 4);
    put_le(f + 14, 40, 4);
    put_le(f + 18, (uint32_t)w, 4);
    put_le(f + 22, (uint32_t)height, 4);
    put_le(f + 26, 1, 2);
    put_le(f + 28, 24, 2);
    put_le(f + 34, (uint32_t)(file_bytes - 54), 4);
}

/* A 24-bit BMP of pixel_value(tag, ...) written by hand; top_down stores the
 * rows first to last, which the header says with a negative height. */
static size_t bmp_bytes(uint8_t **out, int tag, int w, int h, int top_down) {
    size_t row = ((size_t)w * 3 + 3) / 4 * 4, size = 54 + row * h;
    uint8_t *f = calloc(size, 1);
    bmp_header(f, w, top_down ? -h : h, size);
    for (int y = 0; y < h; y++) {
        uint8_t *dst = f + 54 + row * (size_t)(top_down ? y : h - 1 - y);
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < 3; ch++) dst[3 * x + ch] = pixel_value(tag, y, x, 2 - ch);
    }
    *out = f;
    return size;
}

static void write_bmp(const char *dir, const char *name, int tag, int w, int h, int top_down) {
    uint8_t *bytes;
    size_t size = bmp_bytes(&bytes, tag, w, h, top_down);
    test_write_file(dir, name, bytes, size);
    free(bytes);
}

typedef struct {
    uint8_t *data;
    size_t len;
} Bytes;

static void append_bytes(void *ctx, void *data, int size) {
    Bytes *b = ctx;
    b->data = realloc(b->data, b->len + (size_t)size);
    memcpy(b->data + b->len, data, (size_t)size);
    b->len += (size_t)size;
}

/* A PNG or JPEG of pixel_value(tag, ...), in memory. */
static Bytes encode_image(int jpeg, int tag, int w, int h) {
    uint8_t *hwc = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < 3; ch++) hwc[(y * w + x) * 3 + ch] = pixel_value(tag, y, x, ch);
    Bytes b = {0};
    int ok = jpeg ? stbi_write_jpg_to_func(append_bytes, &b, w, h, 3, hwc, 90)
                  : stbi_write_png_to_func(append_bytes, &b, w, h, 3, hwc, w * 3);
    free(hwc);
    if (!ok) {
        fprintf(stderr, "cannot encode a test image\n");
        exit(1);
    }
    return b;
}

/* The top-down BMP that once went to malloc as a negative size, as the first
 * image of its class: it loads, right side up, beside other kinds. */
static void test_top_down_bmp(void) {
    char root[512], cls[1024];
    snprintf(root, sizeof root, "%s", test_tmpdir("top-down"));
    make_dir(root, "train");
    snprintf(cls, sizeof cls, "%s", make_dir(root, "train/a"));
    write_bmp(cls, "0.bmp", 3, 7, 5, 1);
    write_bmp(cls, "1.bmp", 4, 7, 5, 0);
    write_image(cls, "2.png", 5, 7, 5);
    write_bmp(cls, "3.bmp", 6, 7, 5, 1);
    Dataset d;
    CHECK_MSG(image_folder_load(&d, root, "train", 0, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 4 && d.h == 5 && d.w == 7);
    for (int i = 0; i < 4 && i < d.n; i++) CHECK_MSG(image_has_tag(&d, i, 3 + i), "image %d", i);
    dataset_free(&d);
}

/* A split train/a/ of the bad file alone (so it is the first image), then
 * with good images before and after it: each time one message naming it. */
static void expect_bad_file(const char *what, const void *bytes, size_t len, const char *name,
                            const char *want, const char *want2) {
    for (int alone = 1; alone >= 0; alone--) {
        char root[512], cls[1024], path[1200];
        snprintf(root, sizeof root, "%s", test_tmpdir("bad-file"));
        make_dir(root, "train");
        snprintf(cls, sizeof cls, "%s", make_dir(root, "train/a"));
        if (!alone) {
            write_image(cls, "0.png", 1, 6, 5);
            write_image(cls, "2.png", 2, 6, 5);
        }
        test_write_file(cls, name, bytes, len);
        snprintf(path, sizeof path, "%s/%s", cls, name);
        Dataset d;
        int rc = image_folder_load(&d, root, "train", 0, err, sizeof err);
        CHECK_MSG(rc == -1 && d.pixels == NULL && d.labels == NULL && d.n == 0, "%s%s: rc %d",
                  what, alone ? " alone" : "", rc);
        CHECK_MSG(strstr(err, path) && strstr(err, want) && (!want2 || strstr(err, want2)) &&
                      !strstr(err, "png sig"),
                  "%s%s: %s", what, alone ? " alone" : "", err);
    }
}

static void test_bad_files(void) {
    Bytes jpeg = encode_image(1, 7, 64, 48), png = encode_image(0, 7, 64, 48);
    uint8_t *bmp;
    size_t bmp_len = bmp_bytes(&bmp, 7, 6, 5, 0);
    /* Cut inside the scan (stb_image's reason was the PNG test's "bad png sig"),
     * in half, and inside the header. */
    expect_bad_file("JPEG cut at 200 bytes", jpeg.data, 200, "1.jpg", "cannot decode this JPEG",
                    "truncated or corrupt");
    expect_bad_file("JPEG cut in half", jpeg.data, jpeg.len / 2, "1.jpg", "cannot decode this JPEG",
                    "truncated or corrupt");
    expect_bad_file("JPEG cut at 20 bytes", jpeg.data, 20, "1.jpeg", "cannot decode this JPEG",
                    "header");
    expect_bad_file("PNG cut in half", png.data, png.len / 2, "1.png", "cannot decode this PNG",
                    "truncated or corrupt");
    /* A chunk length near 2 GiB: refused before stb_image allocates it. */
    uint8_t *huge_chunk = malloc(png.len);
    memcpy(huge_chunk, png.data, png.len);
    size_t idat = 8;
    while (idat + 8 < png.len && memcmp(huge_chunk + idat + 4, "IDAT", 4) != 0) idat++;
    CHECK(idat + 8 < png.len);
    memcpy(huge_chunk + idat, "\x7f\xff\x00\x00", 4);
    expect_bad_file("PNG with a 2 GiB chunk", huge_chunk, png.len, "1.png",
                    "cannot decode this PNG", "claims 2147418112 bytes");
    free(huge_chunk);
    uint8_t corrupt[64];
    memcpy(corrupt, png.data, 8);
    for (int i = 8; i < 64; i++) corrupt[i] = (uint8_t)(i * 29);
    expect_bad_file("PNG signature and noise", corrupt, sizeof corrupt, "1.png",
                    "cannot decode this PNG", NULL);
    expect_bad_file("BMP cut in half", bmp, bmp_len / 2, "1.bmp", "cannot decode this BMP",
                    "truncated");
    expect_bad_file("BMP without its last byte", bmp, bmp_len - 1, "1.bmp",
                    "cannot decode this BMP", "truncated");
    expect_bad_file("BMP header cut", bmp, 20, "1.bmp", "cannot decode this BMP", "header");
    expect_bad_file("empty file", "", 0, "1.png", "cannot decode", "empty");
    expect_bad_file("text as a JPEG", "<html>not found</html>", 22, "1.jpg", "cannot decode",
                    "not a JPEG, PNG or BMP image");
    /* Over 2 GiB (a sparse file): refused before it is read. */
    char root[512], cls[1024], path[1200];
    snprintf(root, sizeof root, "%s", test_tmpdir("bad-file"));
    make_dir(root, "train");
    snprintf(cls, sizeof cls, "%s", make_dir(root, "train/a"));
    snprintf(path, sizeof path, "%s/0.png", cls);
    FILE *f = fopen(path, "wb");
    CHECK(f && ftruncate(fileno(f), 0x80000000LL) == 0);
    if (f) fclose(f);
    Dataset d;
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, path) && strstr(err, "2147483648 bytes, too large"), "%s", err);

    /* A PNG named .jpg is a PNG: it loads. */
    snprintf(root, sizeof root, "%s", test_tmpdir("bad-file"));
    make_dir(root, "train");
    snprintf(cls, sizeof cls, "%s", make_dir(root, "train/a"));
    test_write_file(cls, "0.jpg", png.data, png.len);
    CHECK_MSG(image_folder_load(&d, root, "train", 0, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 1 && d.w == 64 && d.h == 48 && image_has_tag(&d, 0, 7));
    dataset_free(&d);
    free(jpeg.data);
    free(png.data);
    free(bmp);
}

/* A chunk: length, type, data, CRC-32 of the type and data. */
static size_t put_chunk(uint8_t *out, const char *type, const uint8_t *data, uint32_t n) {
    uint8_t be[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    memcpy(out, be, 4);
    memcpy(out + 4, type, 4);
    if (n) memcpy(out + 8, data, n);
    uint32_t crc = (uint32_t)crc32(0, out + 4, 4 + n);
    uint8_t crc_be[4] = {(uint8_t)(crc >> 24), (uint8_t)(crc >> 16), (uint8_t)(crc >> 8), (uint8_t)crc};
    memcpy(out + 8 + n, crc_be, 4);
    return 12 + n;
}

/* An 8-bit RGB PNG of pixel_value(tag, ...) whose IDAT is stored uncompressed
 * (zlib level 0), so that one changed byte of it is a changed pixel that still
 * inflates; declared_w x declared_h go into its header. Returns its length;
 * *pixel_at: where pixel (0, 1)'s red byte lies in the file. */
static size_t stored_png(uint8_t *out, int tag, int w, int h, int declared_w, int declared_h, size_t *pixel_at) {
    uint8_t raw[8 * (1 + 16 * 3)], packed[sizeof raw + 64]; /* w <= 16, h <= 8 */
    size_t row = 1 + 3 * (size_t)w;
    for (int y = 0; y < h; y++) {
        raw[y * row] = 0; /* filter: none */
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < 3; ch++) raw[y * row + 1 + 3 * x + ch] = pixel_value(tag, y, x, ch);
    }
    uLongf packed_len = sizeof packed;
    CHECK(compress2(packed, &packed_len, raw, (uLong)(h * row), 0) == Z_OK);
    uint8_t ihdr[13] = {0, 0, (uint8_t)(declared_w >> 8), (uint8_t)declared_w, 0, 0, (uint8_t)(declared_h >> 8),
                        (uint8_t)declared_h, 8, 2, 0, 0, 0};
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memcpy(out, signature, 8);
    size_t at = 8 + put_chunk(out + 8, "IHDR", ihdr, 13);
    /* zlib header (2), stored block header (5), filter byte: pixel (0, 0), then (0, 1). */
    *pixel_at = at + 8 + 2 + 5 + 1 + 3;
    at += put_chunk(out + at, "IDAT", packed, (uint32_t)packed_len);
    return at + put_chunk(out + at, "IEND", NULL, 0);
}

/* Chunk CRCs and the zlib stream are checked as PIL checks them: one changed
 * byte in a pixel is refused whether or not the chunk's CRC was made to fit,
 * and a header declaring more rows than its data could inflate to is refused
 * before anything is decoded. */
static void test_png_integrity(void) {
    uint8_t png[1024], changed[1024];
    size_t pixel_at, len = stored_png(png, 9, 16, 8, 16, 8, &pixel_at);
    char root[512], cls[1024];
    snprintf(root, sizeof root, "%s", test_tmpdir("png-good"));
    make_dir(root, "train");
    snprintf(cls, sizeof cls, "%s", make_dir(root, "train/a"));
    test_write_file(cls, "0.png", png, len);
    Dataset d;
    CHECK_MSG(image_folder_load(&d, root, "train", 0, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 1 && d.w == 16 && d.h == 8 && image_has_tag(&d, 0, 9));
    if (d.n == 1) dataset_free(&d);

    memcpy(changed, png, len);
    changed[pixel_at] ^= 0x10;
    expect_bad_file("PNG with a pixel changed", changed, len, "1.png", "IDAT chunk at byte 33 is corrupt", "CRC-32");
    /* The same change with the chunk's CRC made to fit: zlib's Adler-32 tells. */
    size_t idat_at = 33;
    uint32_t idat_len = (uint32_t)changed[idat_at] << 24 | (uint32_t)changed[idat_at + 1] << 16 |
                        (uint32_t)changed[idat_at + 2] << 8 | changed[idat_at + 3];
    put_chunk(changed + idat_at, "IDAT", changed + idat_at + 8, idat_len);
    expect_bad_file("PNG with a pixel and its CRC changed", changed, len, "1.png",
                    "compressed image data is corrupt", "incorrect data check");
    /* The IDAT of 16x8 under a header of 16384x16384 (CRCs right): refused without inflating 805 MB. */
    len = stored_png(changed, 9, 16, 8, 16384, 16384, &pixel_at);
    expect_bad_file("PNG declaring 16384x16384", changed, len, "1.png", "declares 16384x16384",
                    "more than its");
    /* 16x8 under 16x9: the rows run out. */
    len = stored_png(changed, 9, 16, 8, 16, 9, &pixel_at);
    expect_bad_file("PNG declaring a row more", changed, len, "1.png", "compressed image data is truncated",
                    "392 bytes of the 441");
}

/* A JPEG's header declaring 16384x16384 over a file of a few hundred bytes
 * (one bit for each 8x8 block is the least any file spends): refused at once
 * naming the file, not decoded in 26 s and 4 GB. */
static void test_jpeg_declared_size(void) {
    Bytes jpeg = encode_image(1, 7, 64, 48);
    size_t sof = 2;
    while (sof + 9 < jpeg.len && !(jpeg.data[sof] == 0xff && jpeg.data[sof + 1] == 0xc0)) sof++;
    CHECK(sof + 9 < jpeg.len);
    static const uint8_t side[4] = {0x40, 0x00, 0x40, 0x00}; /* height, width: 16384 each */
    memcpy(jpeg.data + sof + 5, side, 4);
    double start = now_seconds();
    expect_bad_file("JPEG declaring 16384x16384", jpeg.data, jpeg.len, "1.jpg", "declares 16384x16384",
                    "corrupt or truncated");
    CHECK_MSG(now_seconds() - start < 5, "refused in %.1f s", now_seconds() - start);
    free(jpeg.data);
}

/* Headers claiming sizes the reader refuses before decoding anything. */
static void test_bad_sizes(void) {
    uint8_t header[54 + 16] = {0};
    bmp_header(header, 16385, 1, sizeof header);
    expect_bad_file("16385 wide", header, sizeof header, "1.bmp", "16385x1", "1 to 16384");
    bmp_header(header, 1, -20000, sizeof header);
    expect_bad_file("20000 high, top-down", header, sizeof header, "1.bmp", "1x20000",
                    "1 to 16384");
    bmp_header(header, 1, 16385, sizeof header);
    expect_bad_file("16385 high", header, sizeof header, "1.bmp", "1x16385", "1 to 16384");
    bmp_header(header, 0, 4, sizeof header);
    expect_bad_file("no width", header, sizeof header, "1.bmp", "0x4", "1 to 16384");
    /* A top-down BMP of another size after the first image. */
    char root[512], cls[1024];
    snprintf(root, sizeof root, "%s", test_tmpdir("bad-file"));
    make_dir(root, "train");
    snprintf(cls, sizeof cls, "%s", make_dir(root, "train/a"));
    write_image(cls, "0.png", 1, 6, 5);
    write_bmp(cls, "1.bmp", 2, 6, 4, 1);
    Dataset d;
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -2);
    CHECK_MSG(strstr(err, "train/a/1.bmp") && strstr(err, "6x4") && strstr(err, "6x5") &&
                  strstr(err, "train/a/0.png"),
              "%s", err);
}

/* More images than the machine's memory holds: one message before the
 * allocation. The images are links to one file, so only the count is large. */
static void test_more_than_memory(void) {
    const int side = 2048;
    long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    double memory = (double)pages * (double)page_bytes;
    long count = (long)(memory / (3.0 * side * side)) + 2;
    if (pages <= 0 || page_bytes <= 0 || count > 300000) {
        printf("memory size unknown or too large for links: the memory check is not tested\n");
        return;
    }
    char root[512], cls[1024], target[1200], link[1200];
    snprintf(root, sizeof root, "%s", test_tmpdir("memory"));
    make_dir(root, "train");
    snprintf(cls, sizeof cls, "%s", make_dir(root, "train/a"));
    write_bmp(cls, "0000000.bmp", 1, side, side, 0);
    snprintf(target, sizeof target, "%s/0000000.bmp", cls);
    int linked = 1;
    for (long i = 1; i < count && linked; i++) {
        snprintf(link, sizeof link, "%s/%07ld.bmp", cls, i);
        linked = symlink(target, link) == 0;
    }
    CHECK_MSG(linked, "cannot link %s", link);
    Dataset d;
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, target) && strstr(err, "2048x2048") && strstr(err, "GiB of memory"),
              "%s", err);
    CHECK(d.pixels == NULL && d.n == 0);
}

static void make_split(const char *root, const char *split, const char *const *classes, int n) {
    char split_dir[600];
    snprintf(split_dir, sizeof split_dir, "%s", make_dir(root, split));
    for (int k = 0; k < n; k++) write_image(make_dir(split_dir, classes[k]), "0.png", k, 4, 3);
}

/* A test split whose class folders are not the training split's. */
static void expect_split_mismatch(const char *what, const char *const *test_classes, int n,
                                  const char *want, const char *want2) {
    static const char *const train_classes[3] = {"ant", "bee", "cat"};
    char root[512], train_dir[600], test_dir[600];
    snprintf(root, sizeof root, "%s", test_tmpdir("splits"));
    make_split(root, "train", train_classes, 3);
    make_split(root, "test", test_classes, n);
    snprintf(train_dir, sizeof train_dir, "%s/train", root);
    snprintf(test_dir, sizeof test_dir, "%s/test", root);
    Dataset d;
    CHECK_MSG(image_folder_load(&d, root, "train", 0, err, sizeof err) == 0, "%s", err);
    dataset_free(&d);
    int rc = image_folder_load(&d, root, "test", 0, err, sizeof err);
    CHECK_MSG(rc == -1 && d.pixels == NULL && d.n == 0, "%s: rc %d", what, rc);
    CHECK_MSG(strstr(err, test_dir) && strstr(err, train_dir) && strstr(err, want) &&
                  (!want2 || strstr(err, want2)),
              "%s: %s", what, err);
}

static void test_split_classes(void) {
    static const char *const same[3] = {"ant", "bee", "cat"};
    static const char *const fewer[2] = {"ant", "bee"};
    static const char *const more[4] = {"ant", "bee", "cat", "cow"};
    static const char *const renamed[3] = {"Bee", "ant", "cat"};
    static const char *const other[3] = {"ant", "cow", "dog"};
    expect_split_mismatch("a class missing", fewer, 2, "1 missing here, the first 'cat'", NULL);
    expect_split_mismatch("an extra class", more, 4, "1 not in", "the first 'cow'");
    expect_split_mismatch("a renamed class, sorted elsewhere", renamed, 3,
                          "1 missing here, the first 'bee'", "the first 'Bee'");
    expect_split_mismatch("two replaced", other, 3, "2 missing here, the first 'bee'",
                          "2 not in");

    /* The same classes load; a test split without a training split loads too. */
    char root[512];
    snprintf(root, sizeof root, "%s", test_tmpdir("splits"));
    make_split(root, "train", same, 3);
    make_split(root, "test", same, 3);
    Dataset d;
    CHECK_MSG(image_folder_load(&d, root, "test", 0, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 3 && d.num_classes == 3 && d.labels[2] == 2);
    dataset_free(&d);
    snprintf(root, sizeof root, "%s", test_tmpdir("splits"));
    make_split(root, "test", fewer, 2);
    CHECK_MSG(image_folder_load(&d, root, "test", 0, err, sizeof err) == 0, "%s", err);
    dataset_free(&d);
}

/* A missing root or a file in its place: the layout and how to get CIFAR-10. */
static void test_missing_root(void) {
    char root[600];
    snprintf(root, sizeof root, "%s/no-such-data", test_tmpdir("missing"));
    Dataset d;
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strncmp(err, root, strlen(root)) == 0 && strstr(err, "No such file") &&
                  strstr(err, "<root>/<split>/<class>/<image>") &&
                  strstr(err, "cifar10-jpg.tar.gz"),
              "%s", err);
    test_write_file(test_tmpdir("missing"), "no-such-data", "x", 1);
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, root) && strstr(err, "not a folder") && strstr(err, "cifar10-jpg.tar.gz"),
              "%s", err);
}

/* Through trainc, where it is built: the message, and a non-zero exit. */
static void test_trainc_exit(void) {
    const char *build = getenv("TRAINC_BUILD_DIR");
    char trainc[1024];
    snprintf(trainc, sizeof trainc, "%s/trainc", build ? build : "");
    if (!build || access(trainc, X_OK) != 0) {
        printf("no trainc in TRAINC_BUILD_DIR: the end-to-end check is skipped\n");
        return;
    }
    static const char *const train_classes[2] = {"ant", "bee"}, *const test_classes[1] = {"ant"};
    char root[512], cmd[2048], output[4096];
    snprintf(root, sizeof root, "%s", test_tmpdir("trainc"));
    make_split(root, "train", train_classes, 2);
    make_split(root, "test", test_classes, 1);
    snprintf(cmd, sizeof cmd,
             "%s --config configs/baseline.ini --device cpu --set run.save_final=off --set data.path=%s 2>&1", trainc,
             root);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(output, 1, sizeof output - 1, p) : 0;
    output[n] = 0;
    int status = p ? pclose(p) : -1;
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) != 0, "trainc exit status %d", status);
    CHECK_MSG(strstr(output, "the first 'bee'") && strstr(output, "/test"), "%s", output);
}

static void check_balance(const Dataset *d, int per_class) {
    int counts[10] = {0};
    for (int i = 0; i < d->n; i++)
        if (d->labels[i] >= 0 && d->labels[i] < 10) counts[d->labels[i]]++;
    for (int k = 0; k < 10; k++) CHECK_MSG(counts[k] == per_class, "class %d: %d", k, counts[k]);
}

static void test_real_cifar10_jpg(void) {
    const char *root = test_cifar10_jpg_root();
    if (!root) {
        printf("no ../shared/data/cifar10-jpg.tar.gz: real-data checks skipped\n");
        return;
    }
    Dataset d;
    double t0 = now_seconds();
    CHECK_MSG(image_folder_load(&d, root, "train", 2000, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 2000 && d.num_classes == 10 && d.c == 3 && d.h == 32 && d.w == 32);
    check_balance(&d, 200);
    dataset_free(&d);
    double t1 = now_seconds();
    CHECK_MSG(image_folder_load(&d, root, "test", 0, err, sizeof err) == 0, "%s", err);
    double t2 = now_seconds();
    CHECK(d.n == 10000 && d.num_classes == 10 && d.h == 32 && d.w == 32);
    check_balance(&d, 1000);
    /* Real photographs: not blank, not saturated. */
    double mean = 0;
    for (size_t i = 0; i < (size_t)d.n * 3072; i++) mean += d.pixels[i];
    mean /= (double)d.n * 3072;
    CHECK_MSG(mean > 90 && mean < 150, "mean pixel %.1f", mean);
    printf("cifar10-jpg: train limit 2000 in %.2f s, test (10000) in %.2f s\n", t1 - t0, t2 - t1);
    dataset_free(&d);
}

int main(void) {
    test_cifar_bin();
    test_image_folder();
    test_image_folder_fifo();
    test_jpeg_round_trip();
    test_top_down_bmp();
    test_bad_files();
    test_bad_sizes();
    test_png_integrity();
    test_jpeg_declared_size();
    test_more_than_memory();
    test_split_classes();
    test_missing_root();
    test_trainc_exit();
    test_real_cifar10_jpg();
    return test_finish("test_data_readers");
}
