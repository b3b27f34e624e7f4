/* The CIFAR-10 binary and image-folder readers on small files written here,
 * their error messages, and the real CIFAR-10 JPEG folder when it is around. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stb_image_write.h>

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
    char path[1024];
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
    CHECK_MSG(strstr(err, "/val") && strstr(err, "No such file"), "%s", err);
    /* A split without class folders. */
    make_dir(root, "empty");
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
    CHECK_MSG(strstr(err, "train/dog/b.jpg") && strstr(err, "decode"), "%s", err);
    CHECK(d.pixels == NULL && d.n == 0);
    /* An image of another size in place of the broken one. */
    char broken[800];
    snprintf(broken, sizeof broken, "%s/b.jpg", cls);
    unlink(broken);
    write_image(cls, "b.png", 32, w + 1, h);
    CHECK(image_folder_load(&d, root, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "train/dog/b.png") && strstr(err, "6x4") && strstr(err, "5x4"), "%s",
              err);
    /* With it fixed, the fourth class loads. */
    write_image(cls, "b.png", 32, w, h);
    CHECK_MSG(image_folder_load(&d, root, "train", 0, err, sizeof err) == 0, "%s", err);
    CHECK(d.n == 11 && d.num_classes == 4 && d.labels[10] == 3 && image_has_tag(&d, 9, 32));
    dataset_free(&d);
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
    test_jpeg_round_trip();
    test_real_cifar10_jpg();
    return test_finish("test_data_readers");
}
