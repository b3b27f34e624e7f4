/* Every data set trainc reads, behind one face: how many samples, each one's
 * label, and a read of sample i. Three kinds:
 *   SOURCE_DECODED  a set decoded once into memory (data/dataset.h: CIFAR-10's
 *                   binary batches, a small image folder, synthetic images);
 *                   a read gives the pixels;
 *   SOURCE_FILES    an image folder read file by file (any size, any number);
 *   SOURCE_SHARDS   WebDataset tar shards, NAME-000000.tar ..., each sample a
 *                   KEY.jpg (or .jpeg, .png, .bmp) and a KEY.cls beside it.
 * The two streaming kinds keep only an index in memory (a path or a shard
 * offset, a size and a label a sample), so memory does not grow with the
 * images. Reads are reentrant: one SourceReader per thread. */
#ifndef TRAINC_DATA_SOURCE_H
#define TRAINC_DATA_SOURCE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SOURCE_DECODED, SOURCE_FILES, SOURCE_SHARDS } SourceKind;

typedef struct {
    SourceKind kind;
    int n, num_classes;
    int32_t *labels;         /* n: the class of each sample */
    char **class_names;      /* num_classes */
    char *dir;               /* files: the split's folder; shards: their folder; decoded: what it came from */
    Dataset decoded;         /* SOURCE_DECODED: the pixels (n, labels and names are its own) */
    /* The streaming index: sample i is bytes [offset[i], offset[i] + size[i]) of
     * file file_of[i] (files: its own, offset 0), named name_at[i] in names. */
    char *names;             /* NUL-terminated strings: each file's path, then each sample's name */
    size_t names_len, names_cap;
    int64_t *file_at;        /* files: each file's path (relative to dir) in names */
    int n_files;
    int32_t *file_of;
    int64_t *offset, *size, *name_at;
    int64_t bytes_total;     /* the encoded bytes of every sample */
    /* Shards: the first sample of each shard, and the count (groups of the shuffle). */
    int32_t *shard_first;
    int n_shards;
} Source;

/* A thread's state for reading samples: the buffer of the last read, and
 * (shards) the shard file it has open. */
typedef struct {
    uint8_t *buf;
    size_t cap;
    int fd, fd_file;         /* fd_file: the file fd is open on (-1: none) */
} SourceReader;

void source_reader_init(SourceReader *r);
void source_reader_close(SourceReader *r);

/* Sample i's encoded bytes (streaming kinds), valid until the reader's next
 * read. 0, or -1 with a message naming the file (missing, unreadable, cut
 * short, changed size). */
int source_read(const Source *s, int i, SourceReader *r, const uint8_t **bytes, size_t *len, char *err,
                size_t errlen);
/* "dir/class/file.jpg" or "dir/train-000003.tar: KEY.jpg", for messages. */
void source_sample_name(const Source *s, int i, char *out, size_t len);

/* A decoded set as a source (the Dataset moves in: its memory is the source's). */
void source_from_dataset(Source *s, Dataset *d, const char *what);

/* The split folder's files, listed (sorted by class folder, then file name)
 * but not read: image_folder_load's layout and checks, without its one-size
 * rule. limit as image_folder_load. 0, or -1 with its messages in err. */
int source_open_folder(Source *s, const char *root, const char *split, int limit, char *err, size_t errlen);

/* The split's shards, dir/split-NNNNNN.tar in sorted order, their headers read
 * into the index (the images are not read). Labels from each KEY.cls (a
 * decimal class number); class names from dir/classes.txt (one a line, in label
 * order) where it is there, else the numbers. limit > 0 keeps the first
 * 'limit' samples. 0, or -1 with a message naming the shard and the entry
 * (no shards, a truncated tar, a sample without an image or a .cls, a label
 * out of range). */
int source_open_shards(Source *s, const char *dir, const char *split, int limit, char *err, size_t errlen);

/* Every sample of a streaming source decoded once into d (data.cache =
 * decoded), on several threads, each image into its own place: the same bytes
 * whatever the thread count. They must share the first image's size: -2 (with
 * the message) where one does not, -1 for the other failures (the first in
 * sample order, with its file), among them more pixels than the machine's
 * memory. The labels and class names are copied. A stop flag (NULL: none)
 * that becomes non-zero (a signal) ends the decode within an image a thread:
 * -3, with the count decoded. */
int source_decode_all(const Source *s, Dataset *d, const volatile sig_atomic_t *stop, char *err, size_t errlen);

/* Moves a seeded share of s's samples (about share x n, at least 1, and at
 * least one left) into held_out, in their order: a validation split made from
 * the training split (data.val_split). */
void source_hold_out(Source *s, double share, uint64_t seed, Source *held_out);

void source_free(Source *s);

/* Appends a NUL-terminated string to the source's names; returns its offset. */
int64_t source_add_name(Source *s, const char *name);

#ifdef __cplusplus
}
#endif
#endif
