/* Reading a safetensors file, its format enforced (what PyTorch's and the
 * safetensors library's readers rely on), so that one file cannot mean two
 * different nets:
 *   - an 8-byte little-endian header length N, then N bytes of JSON: one
 *     object beginning at its first byte, then nothing but spaces;
 *   - each key once (a JSON library keeps either the first or the last of a
 *     repeated key); "__metadata__", when there, an object of strings;
 *   - every other key a tensor {"dtype", "shape", "data_offsets": [begin, end]}
 *     with a known dtype, a shape of whole numbers and offsets that are whole
 *     numbers, begin <= end, each a multiple of the dtype's size, and
 *     end - begin = the shape's count x the dtype's size;
 *   - the tensors, in the order of their offsets, back to back from 0, the
 *     last ending where the file does: no gap, no overlap, nothing after.
 * A file shorter than its header or its offsets say is called truncated. */
#ifndef TRAINC_RUNTIME_SAFETENSORS_H
#define TRAINC_RUNTIME_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

struct cJSON;

#define SAFETENSORS_MAX_DIMS 8
#define SAFETENSORS_MAX_HEADER (100u << 20) /* the safetensors library's own bound */

typedef struct {
    const char *name;                    /* the header's key */
    const char *dtype;                   /* "F32", ... */
    int dtype_bytes;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t count;                      /* elements: the product of shape */
    const unsigned char *data;           /* count x dtype_bytes bytes, not aligned */
} SafetensorsTensor;

typedef struct {
    unsigned char *bytes; /* the whole file */
    size_t size;
    struct cJSON *header;
    const struct cJSON *metadata; /* NULL when absent */
    SafetensorsTensor *tensors;   /* in the header's order */
    int n_tensors;
} Safetensors;

/* Parses and checks a file's bytes (taken: freed by safetensors_free, also on
 * failure); 0, or -1 with a message naming path in err. */
int safetensors_parse(const char *path, unsigned char *bytes, size_t size, Safetensors *st, char *err,
                      size_t errlen);
/* Reads path (a regular file: a FIFO or a directory is refused without
 * blocking) and parses it; 0, or -1 with a message naming path in err. */
int safetensors_read(const char *path, Safetensors *st, char *err, size_t errlen);
const SafetensorsTensor *safetensors_find(const Safetensors *st, const char *name);
void safetensors_free(Safetensors *st);

#endif
