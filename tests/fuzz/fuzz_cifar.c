/* The CIFAR-10 binary reader.
 *
 * Input: a byte (bit 0: the training set, five files, else the test file;
 * bits 1-3: the limit, 0 for all), then the files' contents split by
 * FUZZ_SEP: data_batch_1.bin .. data_batch_5.bin or test_batch.bin; a file
 * with no part is missing. On success every image must hold its record's
 * label and pixels, in file order. */
#include <stdio.h>
#include <string.h>

#include "data/dataset.h"
#include "tests/fuzz/fuzz_common.h"

#define RECORD_BYTES 3073

/* The records of the files, in order, as the reader must have loaded them. */
static void expect_records(const Dataset *d, const FuzzPart *files, int n_files, int limit) {
    long total = 0;
    for (int i = 0; i < n_files; i++) total += (long)(files[i].size / RECORD_BYTES);
    long want = limit > 0 && limit < total ? limit : total;
    if (d->n != want || d->c != 3 || d->h != 32 || d->w != 32 || d->num_classes != 10)
        fuzz_fail("cifar_bin_load gave n=%d %dx%dx%d, %d classes for %ld records, limit %d", d->n, d->c,
                  d->h, d->w, d->num_classes, total, limit);
    int image = 0;
    for (int i = 0; i < n_files && image < d->n; i++)
        for (size_t r = 0; r < files[i].size / RECORD_BYTES && image < d->n; r++, image++) {
            const uint8_t *record = files[i].data + r * RECORD_BYTES;
            if (d->labels[image] != record[0] ||
                memcmp(dataset_image(d, image), record + 1, RECORD_BYTES - 1) != 0)
                fuzz_fail("image %d differs from record %zu of file %d", image, r, i);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int train = data[0] & 1;
    int limit = (data[0] >> 1) & 7;
    FuzzPart parts[FUZZ_MAX_PARTS];
    int n = fuzz_split(data + 1, size - 1, parts, train ? 5 : 1);

    fuzz_scratch_reset();
    for (int i = 0; i < n; i++) {
        char rel[64];
        if (train) snprintf(rel, sizeof rel, "cifar/data_batch_%d.bin", i + 1);
        else snprintf(rel, sizeof rel, "cifar/test_batch.bin");
        fuzz_write(rel, parts[i].data, parts[i].size);
    }
    Dataset d;
    char err[8192] = "";
    if (cifar_bin_load(&d, fuzz_path("cifar"), train, limit, err, sizeof err) != 0) {
        fuzz_expect_message("cifar_bin_load", err);
        return 0;
    }
    expect_records(&d, parts, n, limit);
    dataset_free(&d);
    return 0;
}
