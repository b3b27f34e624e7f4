/* Reading a safetensors file, its format enforced (safetensors.h). */
#include "runtime/safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/check.h"
#include "runtime/files.h"

#define MAX_WHOLE 9007199254740992.0 /* 2^53: every whole number up to it is a double */

static const struct {
    const char *name;
    int bytes;
} kDtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
               {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};

static int dtype_bytes(const char *name) {
    for (size_t i = 0; name && i < sizeof kDtypes / sizeof *kDtypes; i++)
        if (strcmp(name, kDtypes[i].name) == 0) return kDtypes[i].bytes;
    return 0;
}

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* A JSON number that is a whole number from 0 to 2^53 into *out. */
static int whole(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > MAX_WHOLE ||
        v->valuedouble != floor(v->valuedouble))
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

/* The header's JSON: one object from its first byte, then only spaces. */
static int parse_header(const char *path, const char *text, size_t len, Safetensors *st, char *err, size_t errlen) {
    if (len == 0 || text[0] != '{')
        return fail(err, errlen, "%s: not a safetensors file (its header does not begin with '{'; a header length "
                    "that is wrong, or another kind of file)", path);
    const char *end = NULL;
    st->header = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!st->header)
        return fail(err, errlen, "%s: its header is not JSON, or is cut off (is the file truncated, or its header "
                    "length of %zu bytes wrong?)", path, len);
    if (!cJSON_IsObject(st->header))
        return fail(err, errlen, "%s: not a safetensors file (its header is not a JSON object)", path);
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ')
            return fail(err, errlen, "%s: its header has bytes after its JSON object other than spaces (byte %zu of "
                        "%zu: is its header length wrong?)", path, (size_t)(p - text), len);
    return 0;
}

/* Each key once: a repeated one would be two tensors (or metadata) to two readers. */
static int check_unique(const char *path, const cJSON *header, char *err, size_t errlen) {
    for (const cJSON *a = header->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (strcmp(a->string, b->string) == 0)
                return fail(err, errlen, "%s: its header names \"%.200s\" twice (readers disagree on which one is "
                            "meant: the file is refused)", path, a->string);
    return 0;
}

static int check_metadata(const char *path, const cJSON *md, char *err, size_t errlen) {
    if (!cJSON_IsObject(md))
        return fail(err, errlen, "%s: its __metadata__ is not a JSON object (of strings)", path);
    for (const cJSON *v = md->child; v; v = v->next)
        if (!cJSON_IsString(v))
            return fail(err, errlen, "%s: its __metadata__'s \"%.200s\" is not a string", path, v->string);
    return 0;
}

/* One tensor's entry; its offsets in offs[0..1]. */
static int read_entry(const char *path, const cJSON *e, SafetensorsTensor *t, uint64_t offs[2], char *err,
                      size_t errlen) {
    t->name = e->string;
    t->dtype = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "dtype"));
    t->dtype_bytes = dtype_bytes(t->dtype);
    if (!cJSON_IsObject(e) || !t->dtype_bytes)
        return fail(err, errlen, "%s: tensor %.200s: %s", path, t->name,
                    !cJSON_IsObject(e) ? "its entry is not a JSON object"
                    : t->dtype ? "its dtype is not one safetensors knows" : "it has no dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    t->ndim = cJSON_GetArraySize(shape);
    if (!cJSON_IsArray(shape) || t->ndim > SAFETENSORS_MAX_DIMS)
        return fail(err, errlen, "%s: tensor %.200s: its shape is not an array of at most %d whole numbers", path,
                    t->name, SAFETENSORS_MAX_DIMS);
    t->count = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t n;
        if (!whole(cJSON_GetArrayItem(shape, d), &n) || (n && t->count > UINT64_MAX / 16 / n))
            return fail(err, errlen, "%s: tensor %.200s: its shape's size %d is not a whole number (or too large)",
                        path, t->name, d);
        t->shape[d] = (int64_t)n;
        t->count *= n;
    }
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsArray(o) || cJSON_GetArraySize(o) != 2 || !whole(cJSON_GetArrayItem(o, 0), &offs[0]) ||
        !whole(cJSON_GetArrayItem(o, 1), &offs[1]) || offs[0] > offs[1])
        return fail(err, errlen, "%s: tensor %.200s: its data_offsets are not two whole numbers [begin, end] with "
                    "begin <= end", path, t->name);
    if (offs[0] % (uint64_t)t->dtype_bytes != 0)
        return fail(err, errlen, "%s: tensor %.200s: its data begins at byte %llu, not a multiple of its %s's %d bytes",
                    path, t->name, (unsigned long long)offs[0], t->dtype, t->dtype_bytes);
    if (offs[1] - offs[0] != t->count * (uint64_t)t->dtype_bytes)
        return fail(err, errlen, "%s: tensor %.200s: its data_offsets span %llu bytes, its shape and %s call for %llu",
                    path, t->name, (unsigned long long)(offs[1] - offs[0]), t->dtype,
                    (unsigned long long)(t->count * (uint64_t)t->dtype_bytes));
    return 0;
}

typedef struct {
    uint64_t begin, end;
    int index;
} Span;

static int by_begin(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

/* The tensors back to back from 0 to the file's end: no gap, no overlap, nothing after. */
static int check_coverage(const char *path, Safetensors *st, Span *spans, size_t data_size, char *err,
                          size_t errlen) {
    qsort(spans, (size_t)st->n_tensors, sizeof *spans, by_begin);
    uint64_t at = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const char *name = st->tensors[spans[i].index].name;
        if (spans[i].begin != at)
            return fail(err, errlen, "%s: tensor %.200s's data begins at byte %llu of the data, where %s at byte %llu "
                        "(the tensors must lie back to back, without gaps or overlaps)", path, name,
                        (unsigned long long)spans[i].begin, spans[i].begin > at ? "a gap begins" : "the one before "
                        "it is not over: they overlap", (unsigned long long)at);
        at = spans[i].end;
    }
    if (at > data_size)
        return fail(err, errlen, "%s is truncated: its tensors' data is %llu bytes, the file holds %zu after its "
                    "header (or its header length is wrong)", path, (unsigned long long)at, data_size);
    if (at < data_size)
        return fail(err, errlen, "%s: %llu bytes after its last tensor's data (the tensors' data is %llu bytes, the "
                    "file holds %zu after its header: is its header length wrong?)", path,
                    (unsigned long long)(data_size - at), (unsigned long long)at, data_size);
    for (int i = 0; i < st->n_tensors; i++) st->tensors[spans[i].index].data += spans[i].begin;
    return 0;
}

static int check_tensors(const char *path, Safetensors *st, const unsigned char *data, size_t data_size, char *err,
                         size_t errlen) {
    int n = cJSON_GetArraySize(st->header);
    st->tensors = calloc((size_t)n + 1, sizeof *st->tensors);
    Span *spans = calloc((size_t)n + 1, sizeof *spans);
    if (!st->tensors || !spans) TC_FATAL("out of host memory: %s's %d tensors", path, n);
    int rc = 0;
    for (const cJSON *e = st->header->child; e && rc == 0; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            st->metadata = e;
            rc = check_metadata(path, e, err, errlen);
            continue;
        }
        SafetensorsTensor *t = &st->tensors[st->n_tensors];
        uint64_t offs[2] = {0, 0};
        rc = read_entry(path, e, t, offs, err, errlen);
        t->data = data;
        spans[st->n_tensors] = (Span){offs[0], offs[1], st->n_tensors};
        st->n_tensors++;
    }
    if (rc == 0) rc = check_coverage(path, st, spans, data_size, err, errlen);
    free(spans);
    return rc;
}

int safetensors_parse(const char *path, unsigned char *bytes, size_t size, Safetensors *st, char *err,
                      size_t errlen) {
    memset(st, 0, sizeof *st);
    st->bytes = bytes;
    st->size = size;
    if (size < 8)
        return fail(err, errlen, "%s is truncated: %zu bytes, less than a safetensors file's 8-byte header length",
                    path, size);
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)bytes[b] << (8 * b);
    if (header_len > size - 8)
        return fail(err, errlen, "%s is truncated, or not a safetensors file: its header length says %llu bytes, the "
                    "file holds %zu after it", path, (unsigned long long)header_len, size - 8);
    if (header_len > SAFETENSORS_MAX_HEADER)
        return fail(err, errlen, "%s: its header of %llu bytes is larger than safetensors allows (%u)", path,
                    (unsigned long long)header_len, SAFETENSORS_MAX_HEADER);
    if (parse_header(path, (const char *)bytes + 8, (size_t)header_len, st, err, errlen) != 0 ||
        check_unique(path, st->header, err, errlen) != 0)
        return -1;
    return check_tensors(path, st, bytes + 8 + header_len, size - 8 - (size_t)header_len, err, errlen);
}

int safetensors_read(const char *path, Safetensors *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    struct stat info;
    const char *why;
    int fd = files_open_input(path, &info, &why);
    if (fd < 0) return fail(err, errlen, "%s: cannot read it: %s", path, why);
    files_note_input(path, fd);
    size_t size = (size_t)info.st_size, done = 0;
    unsigned char *bytes = malloc(size ? size : 1);
    if (!bytes) TC_FATAL("out of host memory: %s (%zu bytes)", path, size);
    while (done < size) {
        ssize_t got = read(fd, bytes + done, size - done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            int rc = fail(err, errlen, "%s: cannot read it: %s", path,
                          got < 0 ? strerror(errno) : "it became shorter while it was read");
            free(bytes);
            close(fd);
            return rc;
        }
        done += (size_t)got;
    }
    close(fd);
    return safetensors_parse(path, bytes, size, st, err, errlen);
}

const SafetensorsTensor *safetensors_find(const Safetensors *st, const char *name) {
    for (int i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

void safetensors_free(Safetensors *st) {
    cJSON_Delete(st->header);
    free(st->tensors);
    free(st->bytes);
    memset(st, 0, sizeof *st);
}
