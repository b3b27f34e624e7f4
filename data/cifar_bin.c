/* CIFAR-10 binary version: each record is 1 label byte then 3072 pixel bytes,
 * the R, G and B planes of a 32x32 image, row-major: already CHW. */
#include "data/dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/files.h"

#define CIFAR_SIDE 32
#define CIFAR_IMAGE_BYTES (3 * CIFAR_SIDE * CIFAR_SIDE)
#define CIFAR_RECORD_BYTES (1 + CIFAR_IMAGE_BYTES)
#define CIFAR_CLASSES 10
#define CIFAR_TRAIN_FILES 5

static const char cifar_howto[] =
    "get the CIFAR-10 binary version (cifar-10-binary.tar.gz) from "
    "https://www.cs.toronto.edu/~kriz/cifar.html and unpack it; the folder to give is "
    "cifar-10-batches-bin";

/* Checks that the file exists and holds whole records; returns the record count or -1. */
static long cifar_file_records(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: %s (%s)", path, strerror(errno), cifar_howto);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        return -1;
    }
    long long size = (long long)st.st_size;
    if (size == 0) {
        snprintf(err, errlen, "%s: empty file (a CIFAR-10 batch holds %d-byte records)", path,
                 CIFAR_RECORD_BYTES);
        return -1;
    }
    if (size % CIFAR_RECORD_BYTES != 0) {
        snprintf(err, errlen,
                 "%s: %lld bytes is not a whole number of %d-byte records: record %lld (counting "
                 "from 0) is truncated to %lld bytes",
                 path, size, CIFAR_RECORD_BYTES, size / CIFAR_RECORD_BYTES,
                 size % CIFAR_RECORD_BYTES);
        return -1;
    }
    return (long)(size / CIFAR_RECORD_BYTES);
}

/* Reads the first 'count' records of the file into d from image 'first' on. */
static int cifar_read_records(Dataset *d, const char *path, int first, int count, char *err,
                              size_t errlen) {
    const char *why;
    int fd = files_open_input(path, NULL, &why);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, fd >= 0 ? strerror(errno) : why);
        if (fd >= 0) close(fd);
        return -1;
    }
    files_note_input(path, fileno(f));
    uint8_t record[CIFAR_RECORD_BYTES];
    for (int r = 0; r < count; r++) {
        if (fread(record, 1, sizeof record, f) != sizeof record) {
            snprintf(err, errlen, "%s: read error at record %d: %s", path, r,
                     ferror(f) ? strerror(errno) : "unexpected end of file");
            fclose(f);
            return -1;
        }
        if (record[0] >= CIFAR_CLASSES) {
            snprintf(err, errlen, "%s: record %d has label %d; CIFAR-10 labels are 0..%d", path, r,
                     record[0], CIFAR_CLASSES - 1);
            fclose(f);
            return -1;
        }
        d->labels[first + r] = record[0];
        memcpy(d->pixels + (size_t)(first + r) * CIFAR_IMAGE_BYTES, record + 1, CIFAR_IMAGE_BYTES);
    }
    fclose(f);
    return 0;
}

int cifar_bin_load(Dataset *d, const char *dir, int train, int limit, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    int num_files = train ? CIFAR_TRAIN_FILES : 1;
    char paths[CIFAR_TRAIN_FILES][4096];
    long records[CIFAR_TRAIN_FILES];
    long total = 0;
    /* Every file is checked before anything is read, so a broken set fails at once. */
    for (int i = 0; i < num_files; i++) {
        if (train) snprintf(paths[i], sizeof paths[i], "%s/data_batch_%d.bin", dir, i + 1);
        else snprintf(paths[i], sizeof paths[i], "%s/test_batch.bin", dir);
        records[i] = cifar_file_records(paths[i], err, errlen);
        if (records[i] < 0) return -1;
        total += records[i];
    }
    if (total > 0x7fffffff / 2) {
        snprintf(err, errlen, "%s: %ld records is too many", dir, total);
        return -1;
    }
    int n = (limit > 0 && limit < total) ? limit : (int)total;

    d->n = n;
    d->c = 3;
    d->h = CIFAR_SIDE;
    d->w = CIFAR_SIDE;
    d->num_classes = CIFAR_CLASSES;
    static const char *const names[CIFAR_CLASSES] = {"airplane", "automobile", "bird", "cat", "deer",
                                                     "dog", "frog", "horse", "ship", "truck"};
    dataset_set_class_names(d, names, CIFAR_CLASSES);
    d->pixels = malloc((size_t)n * CIFAR_IMAGE_BYTES);
    d->labels = malloc((size_t)n * sizeof(int32_t));
    if (!d->pixels || !d->labels) {
        snprintf(err, errlen, "%s: out of memory for %d images", dir, n);
        dataset_free(d);
        return -1;
    }
    int loaded = 0;
    for (int i = 0; i < num_files && loaded < n; i++) {
        int count = (int)(records[i] < n - loaded ? records[i] : n - loaded);
        if (cifar_read_records(d, paths[i], loaded, count, err, errlen) != 0) {
            dataset_free(d);
            return -1;
        }
        loaded += count;
    }
    return 0;
}
