/* WebDataset tar shards: reading their headers into a source's index, and
 * writing them (trainc pack). Samples group consecutive entries of one key, a
 * key being an entry's path up to the first dot of its file name, as
 * WebDataset's; entries of other extensions (.json, .txt) are passed over. */
#include "data/shards.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/decode.h"
#include "data/transform.h"
#include "runtime/check.h"
#include "runtime/files.h"

#define TAR_NAME_MAX 4096
#define CLASSES_FILE "classes.txt"

void shard_file_name(const char *split, int number, char *out, size_t len) {
    snprintf(out, len, "%s-%06d.tar", split, number);
}

/* ---- the split's shards, sorted ------------------------------------------------ */

static int compare_strings(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* split-<digits>.tar */
static int is_shard_of(const char *name, const char *split) {
    size_t n = strlen(split);
    if (strncmp(name, split, n) != 0 || name[n] != '-') return 0;
    const char *p = name + n + 1;
    size_t digits = strspn(p, "0123456789");
    return digits > 0 && strcmp(p + digits, ".tar") == 0;
}

static int list_shards(const char *dir, const char *split, char ***out, int *count, char *err, size_t errlen) {
    DIR *dp = opendir(dir);
    if (!dp) {
        snprintf(err, errlen, "%s: %s (shards are DIR/%s-000000.tar ..., made by trainc pack)", dir, strerror(errno),
                 split);
        return -1;
    }
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (!is_shard_of(e->d_name, split)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, (size_t)cap * sizeof *names);
            if (!names) TC_FATAL("out of host memory listing %s", dir);
        }
        if (!(names[n++] = strdup(e->d_name))) TC_FATAL("out of host memory listing %s", dir);
    }
    closedir(dp);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, compare_strings);
    *out = names;
    *count = n;
    return 0;
}

/* ---- ustar headers ------------------------------------------------------------- */

/* An octal field (NUL or space ended), or base-256 where its first byte has the top bit. */
static int parse_number(const uint8_t *field, int len, int64_t *out) {
    int64_t v = 0;
    if (field[0] & 0x80) {
        for (int i = 1; i < len; i++) {
            if (v > (INT64_MAX >> 8)) return -1;
            v = (v << 8) | field[i];
        }
        *out = v;
        return 0;
    }
    int i = 0, digits = 0;
    while (i < len && field[i] == ' ') i++;
    for (; i < len && field[i] >= '0' && field[i] <= '7'; i++, digits++) {
        if (v > (INT64_MAX >> 3)) return -1;
        v = v * 8 + (field[i] - '0');
    }
    if (digits == 0 || (i < len && field[i] != 0 && field[i] != ' ')) return -1;
    *out = v;
    return 0;
}

static unsigned header_sum(const uint8_t *h) {
    unsigned sum = 0;
    for (int i = 0; i < TAR_BLOCK; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    return sum;
}

static int is_zero_block(const uint8_t *h) {
    for (int i = 0; i < TAR_BLOCK; i++)
        if (h[i]) return 0;
    return 1;
}

/* The entry's path: ustar's prefix "/" name. */
static void header_path(const uint8_t *h, char *out, size_t len) {
    char name[101], prefix[156];
    memcpy(name, h, 100);
    name[100] = 0;
    memcpy(prefix, h + 345, 155);
    prefix[155] = 0;
    if (memcmp(h + 257, "ustar", 5) == 0 && prefix[0]) snprintf(out, len, "%s/%s", prefix, name);
    else snprintf(out, len, "%s", name);
}

/* A pax header's "path=" record, if any. */
static void pax_path(const char *data, size_t len, char *out, size_t outlen) {
    size_t at = 0;
    while (at < len) {
        char *end;
        long rec = strtol(data + at, &end, 10);
        if (rec <= 0 || (size_t)rec > len - at || *end != ' ') return;
        const char *kv = end + 1, *stop = data + at + rec - 1; /* the record ends in '\n' */
        if (stop > kv + 5 && strncmp(kv, "path=", 5) == 0)
            snprintf(out, outlen, "%.*s", (int)(stop - kv - 5), kv + 5);
        at += (size_t)rec;
    }
}

/* ---- reading a shard's samples --------------------------------------------- */

typedef struct {
    Source *s;
    const char *shard_path;
    int shard;
    int cap;              /* the index arrays' room */
    int limit;
    char key[TAR_NAME_MAX];
    int64_t image_off, image_size;
    char image_name[TAR_NAME_MAX];
    int label;            /* -1: no .cls yet */
    int open;             /* a group is open */
} ShardScan;

static void index_grow(ShardScan *sc) {
    Source *s = sc->s;
    if (s->n < sc->cap) return;
    sc->cap = sc->cap ? 2 * sc->cap : 1024;
    s->file_of = realloc(s->file_of, (size_t)sc->cap * sizeof *s->file_of);
    s->offset = realloc(s->offset, (size_t)sc->cap * sizeof *s->offset);
    s->size = realloc(s->size, (size_t)sc->cap * sizeof *s->size);
    s->name_at = realloc(s->name_at, (size_t)sc->cap * sizeof *s->name_at);
    s->labels = realloc(s->labels, (size_t)sc->cap * sizeof *s->labels);
    if (!s->file_of || !s->offset || !s->size || !s->name_at || !s->labels)
        TC_FATAL("out of host memory: the index of %d samples", sc->cap);
}

/* The open group becomes a sample, or the message says what it lacks. */
static int close_group(ShardScan *sc, char *err, size_t errlen) {
    if (!sc->open) return 0;
    sc->open = 0;
    if (sc->image_size < 0) {
        snprintf(err, errlen, "%s: sample '%s' has no image (%s.jpg, .jpeg, .png or .bmp)", sc->shard_path, sc->key,
                 sc->key);
        return -1;
    }
    if (sc->label < 0) {
        snprintf(err, errlen, "%s: sample '%s' has no label (%s.cls, its class number)", sc->shard_path, sc->key,
                 sc->key);
        return -1;
    }
    if (sc->limit > 0 && sc->s->n >= sc->limit) return 0;
    index_grow(sc);
    Source *s = sc->s;
    s->file_of[s->n] = sc->shard;
    s->offset[s->n] = sc->image_off;
    s->size[s->n] = sc->image_size;
    s->name_at[s->n] = source_add_name(s, sc->image_name);
    s->labels[s->n] = sc->label;
    s->bytes_total += sc->image_size;
    s->n++;
    return 0;
}

static int is_image_ext(const char *ext) {
    return !strcasecmp(ext, "jpg") || !strcasecmp(ext, "jpeg") || !strcasecmp(ext, "png") || !strcasecmp(ext, "bmp");
}

/* A .cls entry's label: decimal digits, whitespace around them. */
static int read_label(int fd, int64_t off, int64_t size, int *label) {
    char text[32];
    if (size <= 0 || size >= (int64_t)sizeof text) return -1;
    if (pread(fd, text, (size_t)size, (off_t)off) != (ssize_t)size) return -1;
    text[size] = 0;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t') end++;
    if (errno || end == text || *end || v < 0 || v >= DATASET_MAX_CLASSES) return -1;
    *label = (int)v;
    return 0;
}

/* One regular entry of the shard: joins its key's group (or starts one). */
static int take_entry(ShardScan *sc, int fd, const char *path, int64_t off, int64_t size, char *err, size_t errlen) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strchr(base, '.');
    if (!dot) return 0; /* no extension: not a part of a sample */
    size_t key_len = (size_t)(dot - path);
    if (key_len >= sizeof sc->key) key_len = sizeof sc->key - 1;
    if (!sc->open || strncmp(sc->key, path, key_len) != 0 || sc->key[key_len] != 0) {
        if (close_group(sc, err, errlen) != 0) return -1;
        memcpy(sc->key, path, key_len);
        sc->key[key_len] = 0;
        sc->open = 1;
        sc->image_size = -1;
        sc->label = -1;
    }
    const char *ext = dot + 1;
    if (is_image_ext(ext) && sc->image_size < 0) {
        sc->image_off = off;
        sc->image_size = size;
        snprintf(sc->image_name, sizeof sc->image_name, "%s", path);
    } else if (!strcasecmp(ext, "cls")) {
        if (read_label(fd, off, size, &sc->label) != 0) {
            snprintf(err, errlen, "%s: %s: not a class number from 0 to %d", sc->shard_path, path,
                     DATASET_MAX_CLASSES - 1);
            return -1;
        }
    }
    return 0;
}

static int scan_shard(ShardScan *sc, char *err, size_t errlen) {
    struct stat st;
    const char *why;
    int fd = files_open_input(sc->shard_path, &st, &why);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", sc->shard_path, why);
        return -1;
    }
    int64_t at = 0, file_bytes = (int64_t)st.st_size;
    char long_name[TAR_NAME_MAX] = "";
    uint8_t h[TAR_BLOCK];
    int rc = 0, ended = 0;
    while (rc == 0 && at + TAR_BLOCK <= file_bytes) {
        if (pread(fd, h, TAR_BLOCK, (off_t)at) != TAR_BLOCK) {
            snprintf(err, errlen, "%s: read error at byte %lld", sc->shard_path, (long long)at);
            rc = -1;
            break;
        }
        if ((ended = is_zero_block(h))) break; /* the archive's end */
        int64_t size, sum;
        if (parse_number(h + 148, 8, &sum) != 0 || (unsigned)sum != header_sum(h) || parse_number(h + 124, 12, &size)) {
            snprintf(err, errlen, "%s: the entry at byte %lld has a broken header: not a tar file, or corrupt",
                     sc->shard_path, (long long)at);
            rc = -1;
            break;
        }
        int64_t data = at + TAR_BLOCK, next = data + (size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
        if (data + size > file_bytes) {
            snprintf(err, errlen, "%s: truncated: the entry at byte %lld claims %lld bytes, the file ends at %lld",
                     sc->shard_path, (long long)at, (long long)size, (long long)file_bytes);
            rc = -1;
            break;
        }
        char type = (char)h[156];
        char path[TAR_NAME_MAX];
        if (long_name[0]) snprintf(path, sizeof path, "%s", long_name);
        else header_path(h, path, sizeof path);
        long_name[0] = 0;
        if (type == 'L' || type == 'x') { /* the next entry's path */
            char text[TAR_NAME_MAX];
            size_t n = size < (int64_t)sizeof text - 1 ? (size_t)size : sizeof text - 1;
            if (pread(fd, text, n, (off_t)data) != (ssize_t)n) n = 0;
            text[n] = 0;
            if (type == 'L') snprintf(long_name, sizeof long_name, "%s", text);
            else pax_path(text, n, long_name, sizeof long_name);
        } else if (type == '0' || type == 0 || type == '7') {
            rc = take_entry(sc, fd, path, data, size, err, errlen);
        }
        at = next;
    }
    if (rc == 0 && !ended && at < file_bytes) {
        snprintf(err, errlen, "%s: truncated: %lld bytes after the last entry, less than a header", sc->shard_path,
                 (long long)(file_bytes - at));
        rc = -1;
    }
    if (rc == 0) rc = close_group(sc, err, errlen);
    close(fd);
    return rc;
}

/* classes.txt: the class names, one a line; 0 names when there is none. */
static int read_class_names(const char *dir, char ***names, int *count, char *err, size_t errlen) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, CLASSES_FILE);
    *names = NULL;
    *count = 0;
    const char *why;
    int fd = files_open_input(path, NULL, &why);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f && fd >= 0) why = strerror(errno), close(fd);
    if (!f) return errno == ENOENT ? 0 : (snprintf(err, errlen, "%s: %s", path, why), -1);
    char line[1024];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 64;
            *names = realloc(*names, (size_t)cap * sizeof **names);
            if (!*names) TC_FATAL("out of host memory");
        }
        if (*count >= DATASET_MAX_CLASSES) {
            snprintf(err, errlen, "%s: more than %d class names", path, DATASET_MAX_CLASSES);
            fclose(f);
            return -1;
        }
        if (!((*names)[(*count)++] = strdup(line))) TC_FATAL("out of host memory");
    }
    fclose(f);
    return 0;
}

static int set_classes(Source *s, const char *dir, char *err, size_t errlen) {
    char **names;
    int count, top = -1;
    if (read_class_names(dir, &names, &count, err, errlen) != 0) return -1;
    for (int i = 0; i < s->n; i++)
        if (s->labels[i] > top) top = s->labels[i];
    if (count > 0 && top >= count) {
        snprintf(err, errlen, "%s/%s names %d classes, but a sample has label %d", dir, CLASSES_FILE, count, top);
        for (int k = 0; k < count; k++) free(names[k]);
        free(names);
        return -1;
    }
    if (count == 0) { /* no names: the numbers */
        count = top + 1;
        names = calloc((size_t)count, sizeof *names);
        if (!names) TC_FATAL("out of host memory");
        for (int k = 0; k < count; k++) {
            char text[16];
            snprintf(text, sizeof text, "%d", k);
            if (!(names[k] = strdup(text))) TC_FATAL("out of host memory");
        }
    }
    s->class_names = names;
    s->num_classes = count;
    return 0;
}

int source_open_shards(Source *s, const char *dir, const char *split, int limit, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->kind = SOURCE_SHARDS;
    if (!(s->dir = strdup(dir))) TC_FATAL("out of host memory");
    char **shards = NULL;
    int n_shards = 0, rc = list_shards(dir, split, &shards, &n_shards, err, errlen);
    if (rc == 0 && n_shards == 0) {
        snprintf(err, errlen, "%s: no shards of the %s split (%s-000000.tar ...; trainc pack makes them from an image "
                 "folder)", dir, split, split);
        rc = -1;
    }
    s->file_at = malloc(((size_t)n_shards + 1) * sizeof *s->file_at);
    s->shard_first = malloc(((size_t)n_shards + 1) * sizeof *s->shard_first);
    if (!s->file_at || !s->shard_first) TC_FATAL("out of host memory");
    ShardScan sc = {.s = s, .limit = limit};
    for (int k = 0; rc == 0 && k < n_shards && !(limit > 0 && s->n >= limit); k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, shards[k]);
        s->file_at[k] = source_add_name(s, shards[k]);
        s->shard_first[k] = s->n;
        s->n_files = s->n_shards = k + 1;
        sc.shard_path = path;
        sc.shard = k;
        rc = scan_shard(&sc, err, errlen);
    }
    for (int k = 0; k < n_shards; k++) free(shards[k]);
    free(shards);
    if (rc == 0 && s->n == 0) {
        snprintf(err, errlen, "%s: the %s shards hold no samples", dir, split);
        rc = -1;
    }
    if (rc == 0) rc = set_classes(s, dir, err, errlen);
    if (rc != 0) {
        source_free(s);
        return -1;
    }
    s->shard_first[s->n_shards] = s->n;
    return 0;
}

/* ---- writing shards ----------------------------------------------------------- */

static void octal_field(uint8_t *field, int len, int64_t v) {
    snprintf((char *)field, (size_t)len, "%0*llo", len - 1, (unsigned long long)v);
}

static int write_entry(FILE *f, const char *name, const uint8_t *data, size_t size) {
    uint8_t h[TAR_BLOCK] = {0};
    snprintf((char *)h, 100, "%s", name);
    octal_field(h + 100, 8, 0644);
    octal_field(h + 108, 8, 0);
    octal_field(h + 116, 8, 0);
    octal_field(h + 124, 12, (int64_t)size);
    octal_field(h + 136, 12, 0); /* mtime 0: the same shards from the same images */
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    snprintf((char *)h + 148, 8, "%06o", header_sum(h));
    h[155] = ' ';
    static const uint8_t zeros[TAR_BLOCK];
    size_t pad = (TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK;
    return fwrite(h, 1, TAR_BLOCK, f) == TAR_BLOCK && fwrite(data, 1, size, f) == size &&
                   fwrite(zeros, 1, pad, f) == pad
               ? 0
               : -1;
}

typedef struct {
    const char *dir, *split;
    FILE *f;
    char tmp[4200], final[4200];
    int number, samples;
    int64_t bytes;
} ShardOut;

static int shard_open(ShardOut *o, char *err, size_t errlen) {
    char name[256];
    shard_file_name(o->split, o->number, name, sizeof name);
    snprintf(o->final, sizeof o->final, "%s/%s", o->dir, name);
    snprintf(o->tmp, sizeof o->tmp, "%s/.%s.tmp-%d", o->dir, name, (int)getpid());
    o->f = fopen(o->tmp, "wbx");
    if (!o->f) {
        snprintf(err, errlen, "%s: %s", o->tmp, strerror(errno));
        return -1;
    }
    o->samples = 0;
    o->bytes = 0;
    return 0;
}

/* The end-of-archive blocks, flushed to disk, renamed into place. */
static int shard_close(ShardOut *o, char *err, size_t errlen) {
    static const uint8_t zeros[2 * TAR_BLOCK];
    int ok = fwrite(zeros, 1, sizeof zeros, o->f) == sizeof zeros && fflush(o->f) == 0 && fsync(fileno(o->f)) == 0;
    int saved = errno;
    if (fclose(o->f) != 0 && ok) ok = 0, saved = errno;
    o->f = NULL;
    if (ok && files_rename_noreplace(o->tmp, o->final) != 0) ok = 0, saved = errno;
    if (!ok) {
        snprintf(err, errlen, "%s: %s", o->final, strerror(saved));
        unlink(o->tmp);
        return -1;
    }
    o->number++;
    return 0;
}

static const char *kind_ext(ImageKind kind) {
    return kind == IMAGE_JPEG ? "jpg" : kind == IMAGE_PNG ? "png" : "bmp";
}

/* classes.txt written, or the one there checked against the source's names. */
static int write_class_names(const Source *s, const char *dir, char *err, size_t errlen) {
    char **names;
    int count;
    if (read_class_names(dir, &names, &count, err, errlen) != 0) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, CLASSES_FILE);
    if (count > 0) {
        int same = count == s->num_classes;
        for (int k = 0; k < count; k++) {
            if (same && strcmp(names[k], s->class_names[k]) != 0) same = 0;
            free(names[k]);
        }
        free(names);
        if (!same) snprintf(err, errlen, "%s names other classes than %s's folders", path, s->dir);
        return same ? 0 : -1;
    }
    FILE *f = fopen(path, "wx");
    int ok = f != NULL;
    for (int k = 0; ok && k < s->num_classes; k++) ok = fprintf(f, "%s\n", s->class_names[k]) > 0;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return ok ? 0 : -1;
}

/* Removes the shards this call wrote, so that a failed pack leaves none behind. */
static void remove_written(const ShardOut *o) {
    for (int k = 0; k < o->number; k++) {
        char name[256], path[4200];
        shard_file_name(o->split, k, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", o->dir, name);
        unlink(path);
    }
}

static int write_sample(ShardOut *o, const Source *s, int i, int key, SourceReader *r, const PackOptions *opt,
                        char *err, size_t errlen) {
    const uint8_t *bytes;
    size_t len;
    if (source_read(s, i, r, &bytes, &len, err, errlen) != 0) return -1;
    ImageKind kind = image_kind(bytes, len);
    if (kind == IMAGE_UNKNOWN) {
        char name[4400];
        source_sample_name(s, i, name, sizeof name);
        snprintf(err, errlen, "%s: not a JPEG, PNG or BMP image", name);
        return -1;
    }
    if (o->f && o->samples > 0 && o->bytes + (int64_t)len + 3 * TAR_BLOCK > opt->shard_bytes &&
        shard_close(o, err, errlen) != 0)
        return -1;
    if (!o->f && shard_open(o, err, errlen) != 0) return -1;
    char name[64], label[16];
    snprintf(name, sizeof name, "%09d.%s", key, kind_ext(kind));
    int label_len = snprintf(label, sizeof label, "%d", s->labels[i]);
    if (write_entry(o->f, name, bytes, len) != 0) goto write_error;
    snprintf(name, sizeof name, "%09d.cls", key);
    if (write_entry(o->f, name, (const uint8_t *)label, (size_t)label_len) != 0) goto write_error;
    o->samples++;
    o->bytes += (int64_t)len + 3 * TAR_BLOCK;
    return 0;
write_error:
    snprintf(err, errlen, "%s: %s", o->tmp, strerror(errno));
    return -1;
}

int shards_write(const Source *s, const char *dir, const char *split, const PackOptions *opt, int *shards_out,
                 char *err, size_t errlen) {
    *shards_out = 0;
    if (files_make_dirs(dir) != 0) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    char **existing = NULL;
    int n_existing = 0;
    if (list_shards(dir, split, &existing, &n_existing, err, errlen) != 0) return -1;
    for (int k = 0; k < n_existing; k++) free(existing[k]);
    free(existing);
    if (n_existing > 0) {
        snprintf(err, errlen, "%s holds %d shards of the %s split already: pack into an empty folder (or remove them)",
                 dir, n_existing, split);
        return -1;
    }
    if (write_class_names(s, dir, err, errlen) != 0) return -1;
    int32_t *order = malloc((size_t)s->n * sizeof *order);
    if (!order) TC_FATAL("out of host memory");
    if (opt->shuffle) shuffle_indices(order, s->n, opt->seed, 0);
    else for (int i = 0; i < s->n; i++) order[i] = i;
    ShardOut o = {.dir = dir, .split = split};
    SourceReader r;
    source_reader_init(&r);
    int rc = 0, reported = 0;
    for (int k = 0; rc == 0 && k < s->n; k++) {
        rc = write_sample(&o, s, order[k], k, &r, opt, err, errlen);
        if (rc == 0 && opt->progress && o.number > reported)
            opt->progress(opt->user, reported = o.number, k, s->n, o.bytes);
    }
    if (rc == 0 && o.f) rc = shard_close(&o, err, errlen);
    if (rc != 0) {
        if (o.f) {
            fclose(o.f);
            unlink(o.tmp);
        }
        remove_written(&o);
    } else {
        if (opt->progress) opt->progress(opt->user, o.number, s->n, s->n, o.bytes);
        *shards_out = o.number;
    }
    source_reader_close(&r);
    free(order);
    return rc;
}
