/* WebDataset tar shards: the reader is data/source.h's source_open_shards; this
 * is the writer (trainc pack). A shard is a POSIX ustar archive of samples in
 * sequence, each KEY.jpg (or .png, .bmp: the image's real kind) then KEY.cls
 * (its label as decimal text); keys are the samples' 9-digit numbers in the
 * packed order. classes.txt beside the shards names the labels, one a line. */
#ifndef TRAINC_DATA_SHARDS_H
#define TRAINC_DATA_SHARDS_H

#include <stddef.h>
#include <stdint.h>

#include "data/source.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The shard file name of a split: "train-000012.tar". */
void shard_file_name(const char *split, int number, char *out, size_t len);

typedef struct {
    int64_t shard_bytes;   /* a shard is closed once it holds this much (>= 1 sample each) */
    uint64_t seed;         /* the samples are packed in the order of a permutation from it */
    int shuffle;           /* 0: in the source's order */
    /* Called after each shard is written; NULL: nothing. */
    void (*progress)(void *user, int shards, int samples_done, int samples, int64_t bytes);
    void *user;
} PackOptions;

/* Writes the source's samples as dir/split-NNNNNN.tar (each written to a
 * temporary name, then renamed), and dir/classes.txt (or checks the one there
 * names the same classes). Refuses a dir that holds shards of the split
 * already. 0, or -1 with a message naming the file (an unreadable sample, a
 * write error such as a full disk). *shards_out: the shards written. */
int shards_write(const Source *s, const char *dir, const char *split, const PackOptions *opt, int *shards_out,
                 char *err, size_t errlen);

/* Names of ustar header fields the reader and the writer share. */
#define TAR_BLOCK 512

#ifdef __cplusplus
}
#endif
#endif
