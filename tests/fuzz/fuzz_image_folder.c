/* The image-folder reader on a tree of class folders.
 *
 * Input: a byte for the limit (signed, mod 8: 0 or less means all), then
 * files split by FUZZ_SEP. A file's first byte picks its class folder
 * (bits 0-1: c0..c3) and its extension (bits 2-3: png, bmp, jpg, txt, the
 * last one not an image); the rest is its content, written as
 * root/train/c<k>/<index>.<ext>. On success the dataset must be consistent:
 * labels within the classes and every pixel readable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stb_image.h>

#include "data/dataset.h"
#include "tests/fuzz/fuzz_common.h"

/* Images whose header claims more pixels than this are left out: decoding
 * them allocates that much, in the reader and in stb_image alike, which is
 * what a big image costs, not a bug. Negative sizes are kept. */
#define MAX_CLAIMED_PIXELS (1 << 20)

static int claims_too_many_pixels(const uint8_t *bytes, size_t n) {
    int w, h, channels;
    if (n > 0x7fffffff || !stbi_info_from_memory(bytes, (int)n, &w, &h, &channels)) return 0;
    return w > 0 && h > 0 && (long long)w * h > MAX_CLAIMED_PIXELS;
}

static void expect_consistent(const Dataset *d, int files) {
    if (d->n < 1 || d->n > files || d->c != 3 || d->h < 1 || d->w < 1 || d->num_classes < 1)
        fuzz_fail("image_folder_load succeeded with n=%d c=%d h=%d w=%d classes=%d from %d files", d->n,
                  d->c, d->h, d->w, d->num_classes, files);
    unsigned sum = 0;
    for (int i = 0; i < d->n; i++) {
        if (d->labels[i] < 0 || d->labels[i] >= d->num_classes)
            fuzz_fail("image %d has label %d of %d classes", i, d->labels[i], d->num_classes);
        const uint8_t *image = dataset_image(d, i);
        for (size_t p = 0; p < dataset_image_bytes(d); p++) sum += image[p];
    }
    /* The sum only makes the reads happen. */
    if (sum == 0xFFFFFFFFu) fprintf(stderr, " ");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *extensions[] = {"png", "bmp", "jpg", "txt"};
    if (size < 1) return 0;
    int limit = (int8_t)data[0] % 8;
    FuzzPart parts[FUZZ_MAX_PARTS];
    int n = fuzz_split(data + 1, size - 1, parts, FUZZ_MAX_PARTS);
    for (int i = 0; i < n; i++)
        if (parts[i].size > 1 && claims_too_many_pixels(parts[i].data + 1, parts[i].size - 1)) return -1;

    fuzz_scratch_reset();
    fuzz_mkdir("root/train");
    int files = 0;
    for (int i = 0; i < n; i++) {
        if (parts[i].size == 0) continue;
        uint8_t pick = parts[i].data[0];
        char rel[64];
        snprintf(rel, sizeof rel, "root/train/c%d/%02d.%s", pick & 3, i, extensions[(pick >> 2) & 3]);
        fuzz_write(rel, parts[i].data + 1, parts[i].size - 1);
        files++;
    }
    Dataset d;
    char err[2048] = "";
    if (image_folder_load(&d, fuzz_path("root"), "train", limit, err, sizeof err) != 0) {
        fuzz_expect_message("image_folder_load", err);
        return 0;
    }
    expect_consistent(&d, files);
    dataset_free(&d);
    return 0;
}
