/* A labelled image set decoded once into memory: uint8 pixels, each image CHW
 * planar (R plane, G plane, B plane, row-major), as in the CIFAR-10 binary format. */
#ifndef TRAINC_DATA_DATASET_H
#define TRAINC_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DATASET_MAX_CLASSES 1000
/* The largest image side the readers (and the transforms) take. */
#define DATASET_MAX_SIDE 16384

typedef struct {
    int n;          /* images */
    int c, h, w;    /* every image has this shape */
    int num_classes;
    uint8_t *pixels;/* n * c * h * w */
    int32_t *labels;/* n */
    char **class_names; /* num_classes names (image folders: the folders; CIFAR-10 binary: its classes), or
                           NULL: unnamed (synthetic) */
} Dataset;

size_t dataset_image_bytes(const Dataset *d);
const uint8_t *dataset_image(const Dataset *d, int i);
void dataset_free(Dataset *d);
/* Copies n names into d->class_names (freed by dataset_free). */
void dataset_set_class_names(Dataset *d, const char *const *names, int n);

/* CIFAR-10 binary: dir/data_batch_1.bin .. data_batch_5.bin (train) or
 * dir/test_batch.bin (test); records of 1 label byte + 3072 pixel bytes.
 * Returns 0, or -1 with a message naming the file in err (missing file, size
 * not a multiple of a record, label out of range). limit > 0 keeps the first
 * 'limit' images. */
int cifar_bin_load(Dataset *d, const char *dir, int train, int limit, char *err, size_t errlen);

/* Image folder: root/<split>/<class>/<file>.{jpg,jpeg,png,bmp} decoded once
 * to RGB; classes are the sub-folders in sorted order; all images must share
 * one size. A split other than "train" must have the same
 * class folders as root/train where that exists, as the labels are the class
 * numbers of the training split. Returns 0, or -1 with a message naming the
 * file or folder: a missing root, split or class folder (with the layout and
 * how to get CIFAR-10), a class folder without images, class folders unlike
 * the training split's, a file that is empty, not a JPEG, PNG or BMP, truncated
 * or corrupt, a side outside 1..DATASET_MAX_SIDE, or more pixels than the
 * machine's memory; -2 with the message for a size unlike the first image's
 * (data/source.h streams such a folder). limit > 0 keeps 'limit' images spread
 * evenly over the classes (the first ones of each class in sorted file order).
 * Decoding is data/decode.h's. */
int image_folder_load(Dataset *d, const char *root, const char *split, int limit, char *err,
                      size_t errlen);

/* One JPEG, PNG or BMP file decoded as image_folder_load decodes it: RGB,
 * CHW planar uint8, *h x *w (malloc'ed), or NULL with the same messages,
 * naming the file, in err. */
uint8_t *image_file_decode_rgb(const char *path, int *w, int *h, char *err, size_t errlen);

/* Deterministic CIFAR-shaped images from the seed; the label is learnable from
 * the pixels (each class has its own mean colour pattern plus noise). */
void synthetic_make(Dataset *d, int n, int c, int h, int w, int num_classes, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
