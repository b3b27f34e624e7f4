#include "data/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/transform.h"
#include "runtime/check.h"

size_t dataset_image_bytes(const Dataset *d) { return (size_t)d->c * d->h * d->w; }

const uint8_t *dataset_image(const Dataset *d, int i) {
    return d->pixels + (size_t)i * dataset_image_bytes(d);
}

void dataset_free(Dataset *d) {
    free(d->pixels);
    free(d->labels);
    for (int k = 0; d->class_names && k < d->num_classes; k++) free(d->class_names[k]);
    free(d->class_names);
    memset(d, 0, sizeof *d);
}

void dataset_set_class_names(Dataset *d, const char *const *names, int n) {
    d->class_names = calloc((size_t)n, sizeof *d->class_names);
    if (!d->class_names) TC_FATAL("out of host memory: %d class names", n);
    for (int k = 0; k < n; k++)
        if (!(d->class_names[k] = strdup(names[k]))) TC_FATAL("out of host memory: class names");
}

static float rng_unit(uint64_t *state) {
    return (float)((rng_splitmix64(state) >> 40) * (1.0 / 16777216.0));
}

/* Each class: a base colour per channel plus a plane wave of its own
 * direction, frequency and phase, so a small network tells them apart. */
static void make_class_patterns(float *patterns, int num_classes, int c, int h, int w,
                                uint64_t *rng) {
    const float two_pi = 6.28318530718f;
    for (int k = 0; k < num_classes; k++) {
        for (int ch = 0; ch < c; ch++) {
            float base = 64.0f + 128.0f * rng_unit(rng);
            float fy = (float)(1 + (int)(3.0f * rng_unit(rng)));
            float fx = (float)(1 + (int)(3.0f * rng_unit(rng)));
            float phase = two_pi * rng_unit(rng);
            float *plane = patterns + ((size_t)k * c + ch) * h * w;
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++)
                    plane[y * w + x] =
                        base + 48.0f * sinf(two_pi * (fy * y / h + fx * x / w) + phase);
        }
    }
}

void synthetic_make(Dataset *d, int n, int c, int h, int w, int num_classes, uint64_t seed) {
    if (n < 1 || c < 1 || h < 1 || w < 1 || h > DATASET_MAX_SIDE || w > DATASET_MAX_SIDE ||
        num_classes < 1 || num_classes > DATASET_MAX_CLASSES)
        TC_FATAL("synthetic_make: bad shape n=%d c=%d h=%d w=%d classes=%d", n, c, h, w,
                 num_classes);
    memset(d, 0, sizeof *d);
    d->n = n;
    d->c = c;
    d->h = h;
    d->w = w;
    d->num_classes = num_classes;
    size_t image_bytes = dataset_image_bytes(d);
    d->pixels = malloc((size_t)n * image_bytes);
    d->labels = malloc((size_t)n * sizeof(int32_t));
    float *patterns = malloc((size_t)num_classes * image_bytes * sizeof(float));
    if (!d->pixels || !d->labels || !patterns)
        TC_FATAL("synthetic_make: out of memory for %d images", n);

    /* The class patterns are the same for every seed, so a training set and a
     * test set made from two seeds share their classes. */
    uint64_t pattern_rng = 0x7261696e63ULL;
    make_class_patterns(patterns, num_classes, c, h, w, &pattern_rng);
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) {
        int label = (int)((rng_splitmix64(&rng) >> 32) % (uint64_t)num_classes);
        d->labels[i] = label;
        const float *pattern = patterns + (size_t)label * image_bytes;
        uint8_t *image = d->pixels + (size_t)i * image_bytes;
        uint64_t noise_bits = 0;
        for (size_t p = 0; p < image_bytes; p++) {
            if (p % 8 == 0) noise_bits = rng_splitmix64(&rng);
            float noise = (float)(int)(noise_bits & 63) - 31.5f; /* uniform, +-32 */
            noise_bits >>= 8;
            float v = pattern[p] + noise;
            image[p] = (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v + 0.5f);
        }
    }
    free(patterns);
}
