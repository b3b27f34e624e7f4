/* The source face: reading a sample, naming it, a set decoded once, the
 * held-out split. The folder and shard listings are image_folder.c's and
 * shards.c's. */
#include "data/source.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/decode.h"
#include "data/transform.h"
#include "runtime/check.h"

#define DECODE_MAX_THREADS 8

void source_reader_init(SourceReader *r) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->fd_file = -1;
}

void source_reader_close(SourceReader *r) {
    free(r->buf);
    if (r->fd >= 0) close(r->fd);
    source_reader_init(r);
}

int64_t source_add_name(Source *s, const char *name) {
    size_t len = strlen(name) + 1;
    if (s->names_len + len > s->names_cap) {
        size_t cap = s->names_cap ? 2 * s->names_cap : 4096;
        while (cap < s->names_len + len) cap *= 2;
        char *grown = realloc(s->names, cap);
        if (!grown) TC_FATAL("out of host memory: the names of %d samples", s->n);
        s->names = grown;
        s->names_cap = cap;
    }
    memcpy(s->names + s->names_len, name, len);
    int64_t at = (int64_t)s->names_len;
    s->names_len += len;
    return at;
}

static void file_path(const Source *s, int file, char *out, size_t len) {
    snprintf(out, len, "%s/%s", s->dir, s->names + s->file_at[file]);
}

void source_sample_name(const Source *s, int i, char *out, size_t len) {
    if (s->kind == SOURCE_DECODED) snprintf(out, len, "%s: image %d", s->dir ? s->dir : "data", i);
    else if (s->kind == SOURCE_FILES) file_path(s, s->file_of[i], out, len);
    else snprintf(out, len, "%s/%s: %s", s->dir, s->names + s->file_at[s->file_of[i]], s->names + s->name_at[i]);
}

/* Bytes [offset, offset + size) of shard 'file', through the reader's open one. */
static int read_shard(const Source *s, int i, SourceReader *r, char *err, size_t errlen) {
    char path[4200];
    int file = s->file_of[i];
    file_path(s, file, path, sizeof path);
    if (r->fd_file != file) {
        if (r->fd >= 0) close(r->fd);
        r->fd = open(path, O_RDONLY | O_CLOEXEC);
        r->fd_file = r->fd >= 0 ? file : -1;
        if (r->fd < 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return -1;
        }
    }
    uint8_t *buf = r->buf = buffer_grow(r->buf, &r->cap, (size_t)s->size[i], "a sample");
    size_t done = 0, want = (size_t)s->size[i];
    while (done < want) {
        ssize_t got = pread(r->fd, buf + done, want - done, (off_t)(s->offset[i] + (int64_t)done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            snprintf(err, errlen, "%s: %s: %s", path, s->names + s->name_at[i],
                     got < 0 ? strerror(errno) : "the shard is cut short (it changed since it was indexed)");
            return -1;
        }
        done += (size_t)got;
    }
    return 0;
}

int source_read(const Source *s, int i, SourceReader *r, const uint8_t **bytes, size_t *len, char *err,
                size_t errlen) {
    if (i < 0 || i >= s->n) TC_FATAL("source_read: sample %d of %d", i, s->n);
    if (s->kind == SOURCE_DECODED) TC_FATAL("source_read: a decoded set has no files");
    if (s->kind == SOURCE_SHARDS) {
        if (read_shard(s, i, r, err, errlen) != 0) return -1;
        *bytes = r->buf;
        *len = (size_t)s->size[i];
        return 0;
    }
    char path[4200];
    file_path(s, s->file_of[i], path, sizeof path);
    if (read_whole_file(path, &r->buf, &r->cap, len, err, errlen) != 0) return -1;
    if ((int64_t)*len != s->size[i]) {
        snprintf(err, errlen, "%s: %zu bytes, %lld when it was listed: the data set changed under the run", path,
                 *len, (long long)s->size[i]);
        return -1;
    }
    *bytes = r->buf;
    return 0;
}

void source_from_dataset(Source *s, Dataset *d, const char *what) {
    memset(s, 0, sizeof *s);
    s->kind = SOURCE_DECODED;
    s->decoded = *d;
    memset(d, 0, sizeof *d);
    s->n = s->decoded.n;
    s->num_classes = s->decoded.num_classes;
    s->labels = s->decoded.labels;
    s->class_names = s->decoded.class_names;
    s->dir = strdup(what ? what : "data");
    if (!s->dir) TC_FATAL("out of host memory");
}

void source_free(Source *s) {
    if (s->kind == SOURCE_DECODED) {
        dataset_free(&s->decoded);
    } else {
        free(s->labels);
        for (int k = 0; s->class_names && k < s->num_classes; k++) free(s->class_names[k]);
        free(s->class_names);
    }
    free(s->dir);
    free(s->names);
    free(s->file_at);
    free(s->file_of);
    free(s->offset);
    free(s->size);
    free(s->name_at);
    free(s->shard_first);
    memset(s, 0, sizeof *s);
}

/* ---- decoded once ----------------------------------------------------------- */

typedef struct {
    const Source *source;
    Dataset *d;
    const volatile sig_atomic_t *stop; /* NULL: never */
    atomic_int decoded;
    atomic_int next;        /* next image to claim */
    atomic_int first_error; /* lowest failing image so far, n when none */
    int error_code;         /* -1, or -2 for a size unlike the first image's */
    pthread_mutex_t error_lock;
    char error[1024];
} DecodeJob;

/* Image i into its CHW place; it must have image 0's size (d->w, d->h). */
static int decode_one(DecodeJob *job, int i, SourceReader *r, DecodeBuffers *db, char *err, size_t errlen) {
    const uint8_t *bytes;
    size_t len;
    char name[4400];
    source_sample_name(job->source, i, name, sizeof name);
    if (source_read(job->source, i, r, &bytes, &len, err, errlen) != 0) return -1;
    DecodedImage image;
    if (image_decode(bytes, len, name, NULL, db, &image, err, errlen) != 0) return -1;
    Dataset *d = job->d;
    if (image.w != d->w || image.h != d->h) {
        char first[4400];
        source_sample_name(job->source, 0, first, sizeof first);
        snprintf(err, errlen, "%.480s: image is %dx%d but %.480s is %dx%d; all images must have one size", name,
                 image.w,
                 image.h, first, d->w, d->h);
        return -2;
    }
    memcpy(d->pixels + (size_t)i * dataset_image_bytes(d), image.pixels, dataset_image_bytes(d));
    return 0;
}

static void *decode_worker(void *arg) {
    DecodeJob *job = arg;
    SourceReader r;
    DecodeBuffers db = {0};
    source_reader_init(&r);
    char err[1024];
    for (;;) {
        /* Claims go up one by one, so every image below a failing one is still
         * decoded and the error reported is the first in sample order. */
        if (job->stop && *job->stop) break;
        int i = atomic_fetch_add(&job->next, 1);
        if (i >= job->d->n || i > atomic_load(&job->first_error)) break;
        int rc = decode_one(job, i, &r, &db, err, sizeof err);
        if (rc == 0) atomic_fetch_add(&job->decoded, 1);
        if (rc != 0) {
            pthread_mutex_lock(&job->error_lock);
            if (i < atomic_load(&job->first_error)) {
                atomic_store(&job->first_error, i);
                job->error_code = rc;
                snprintf(job->error, sizeof job->error, "%s", err);
            }
            pthread_mutex_unlock(&job->error_lock);
        }
    }
    source_reader_close(&r);
    decode_buffers_free(&db);
    return NULL;
}

static int decode_threads(int images) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus > 0 ? (int)cpus : 1;
    if (threads > DECODE_MAX_THREADS) threads = DECODE_MAX_THREADS;
    if (threads > images) threads = images;
    return threads > 0 ? threads : 1;
}

/* Room for every image at the first one's size, refused where it is more than
 * the machine's memory (malloc might grant it, and the decode then be killed). */
static int alloc_pixels(const Source *s, Dataset *d, char *err, size_t errlen) {
    size_t bytes = (size_t)d->n * dataset_image_bytes(d);
    long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    double memory = pages > 0 && page_bytes > 0 ? (double)pages * (double)page_bytes : 0.0;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    char first[4400];
    source_sample_name(s, 0, first, sizeof first);
    if (memory > 0.0 && (double)bytes > memory) {
        snprintf(err, errlen,
                 "%d images of %dx%d (the size of %s) need %.1f GiB, more than this machine's %.1f GiB of memory; "
                 "load fewer (a limit) or smaller images, or stream them (data.cache = stream)",
                 d->n, d->w, d->h, first, (double)bytes / gib, memory / gib);
        return -1;
    }
    d->pixels = malloc(bytes);
    if (!d->pixels) {
        snprintf(err, errlen, "out of memory for %d images of %dx%d (the size of %s)", d->n, d->w, d->h, first);
        return -1;
    }
    return 0;
}

/* The first image sets the size. */
static int decode_first(const Source *s, Dataset *d, char *err, size_t errlen) {
    SourceReader r;
    DecodeBuffers db = {0};
    source_reader_init(&r);
    const uint8_t *bytes;
    size_t len;
    char name[4400];
    source_sample_name(s, 0, name, sizeof name);
    DecodedImage image;
    int rc = source_read(s, 0, &r, &bytes, &len, err, errlen);
    if (rc == 0) rc = image_decode(bytes, len, name, NULL, &db, &image, err, errlen);
    if (rc == 0) {
        d->c = 3;
        d->w = image.w;
        d->h = image.h;
        rc = alloc_pixels(s, d, err, errlen);
    }
    if (rc == 0) memcpy(d->pixels, image.pixels, dataset_image_bytes(d));
    source_reader_close(&r);
    decode_buffers_free(&db);
    return rc;
}

int source_decode_all(const Source *s, Dataset *d, const volatile sig_atomic_t *stop, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    if (s->kind == SOURCE_DECODED || s->n < 1) TC_FATAL("source_decode_all: not a streaming source of images");
    d->n = s->n;
    if (decode_first(s, d, err, errlen) != 0) {
        dataset_free(d);
        return -1;
    }
    DecodeJob job = {.source = s, .d = d, .stop = stop, .error_code = 0};
    atomic_init(&job.next, 1);
    atomic_init(&job.decoded, 1);
    atomic_init(&job.first_error, s->n);
    pthread_mutex_init(&job.error_lock, NULL);
    int threads = decode_threads(s->n - 1);
    pthread_t tids[DECODE_MAX_THREADS];
    int started = 0;
    for (; started < threads - 1; started++)
        if (pthread_create(&tids[started], NULL, decode_worker, &job) != 0) break;
    decode_worker(&job); /* the calling thread decodes too */
    for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
    pthread_mutex_destroy(&job.error_lock);
    if (stop && *stop && atomic_load(&job.decoded) < s->n) {
        snprintf(err, errlen, "stopped after %d of the %d images", atomic_load(&job.decoded), s->n);
        dataset_free(d);
        return -3;
    }
    if (atomic_load(&job.first_error) < s->n) {
        snprintf(err, errlen, "%s", job.error);
        dataset_free(d);
        return job.error_code;
    }
    d->labels = malloc((size_t)s->n * sizeof *d->labels);
    if (!d->labels) TC_FATAL("out of host memory: %d labels", s->n);
    memcpy(d->labels, s->labels, (size_t)s->n * sizeof *d->labels);
    d->num_classes = s->num_classes;
    if (s->class_names) dataset_set_class_names(d, (const char *const *)s->class_names, s->num_classes);
    return 0;
}

/* ---- a held-out split --------------------------------------------------------- */

/* Which samples go: a seeded choice of 'count', marked in out (1: held out). */
static void choose_held_out(int n, int count, uint64_t seed, uint8_t *out) {
    int32_t *order = malloc((size_t)n * sizeof *order);
    if (!order) TC_FATAL("out of host memory: the held-out split of %d samples", n);
    shuffle_indices(order, n, seed ^ 0x76616c73706c6974ULL, 0);
    memset(out, 0, (size_t)n);
    for (int i = 0; i < count; i++) out[order[i]] = 1;
    free(order);
}

/* Copies sample 'from' of s into slot 'to' of dst's index (dst's arrays have room). */
static void copy_entry(const Source *s, int from, Source *dst, int to) {
    dst->labels[to] = s->labels[from];
    if (s->kind == SOURCE_DECODED) return;
    dst->file_of[to] = s->file_of[from];
    dst->offset[to] = s->offset[from];
    dst->size[to] = s->size[from];
    dst->name_at[to] = s->name_at[from];
}

static void *copy_of(const void *p, size_t bytes) {
    void *q = malloc(bytes ? bytes : 1);
    if (!q) TC_FATAL("out of host memory: %zu bytes", bytes);
    if (bytes) memcpy(q, p, bytes);
    return q;
}

/* A streaming source's shared parts (the files, their names) copied into held. */
static void copy_streaming_parts(const Source *s, Source *held, int count) {
    held->names = copy_of(s->names, s->names_len);
    held->names_len = held->names_cap = s->names_len;
    held->file_at = copy_of(s->file_at, (size_t)s->n_files * sizeof *s->file_at);
    held->n_files = s->n_files;
    held->file_of = malloc((size_t)count * sizeof *held->file_of);
    held->offset = malloc((size_t)count * sizeof *held->offset);
    held->size = malloc((size_t)count * sizeof *held->size);
    held->name_at = malloc((size_t)count * sizeof *held->name_at);
    if (!held->file_of || !held->offset || !held->size || !held->name_at) TC_FATAL("out of host memory");
}

/* Shards: each shard's first sample, from the samples' shards in order. */
static void index_shard_groups(Source *s) {
    free(s->shard_first);
    s->shard_first = malloc(((size_t)s->n + 1) * sizeof *s->shard_first);
    if (!s->shard_first) TC_FATAL("out of host memory");
    s->n_shards = 0;
    for (int i = 0; i < s->n; i++)
        if (i == 0 || s->file_of[i] != s->file_of[i - 1]) s->shard_first[s->n_shards++] = i;
    s->shard_first[s->n_shards] = s->n;
}

static void split_pixels(Source *s, const uint8_t *held_mark, Source *held, int count) {
    Dataset *d = &s->decoded, *h = &held->decoded;
    size_t image = dataset_image_bytes(d);
    *h = (Dataset){.n = count, .c = d->c, .h = d->h, .w = d->w, .num_classes = d->num_classes};
    h->pixels = malloc((size_t)count * image);
    h->labels = malloc((size_t)count * sizeof *h->labels);
    if (!h->pixels || !h->labels) TC_FATAL("out of host memory: the held-out split of %d images", count);
    if (d->class_names) dataset_set_class_names(h, (const char *const *)d->class_names, d->num_classes);
    int kept = 0, out = 0;
    for (int i = 0; i < d->n; i++) {
        uint8_t *to = held_mark[i] ? h->pixels + (size_t)out * image : d->pixels + (size_t)kept * image;
        memmove(to, d->pixels + (size_t)i * image, image);
        if (held_mark[i]) h->labels[out++] = d->labels[i];
        else d->labels[kept++] = d->labels[i];
    }
    d->n = kept;
    s->n = kept;
    held->n = count;
    held->num_classes = h->num_classes;
    held->labels = h->labels;
    held->class_names = h->class_names;
}

void source_hold_out(Source *s, double share, uint64_t seed, Source *held) {
    if (s->n < 2) TC_FATAL("source_hold_out: %d samples cannot be split", s->n);
    int count = (int)(share * s->n + 0.5);
    if (count < 1) count = 1;
    if (count > s->n - 1) count = s->n - 1;
    uint8_t *mark = malloc((size_t)s->n);
    if (!mark) TC_FATAL("out of host memory");
    choose_held_out(s->n, count, seed, mark);
    memset(held, 0, sizeof *held);
    held->kind = s->kind;
    held->dir = strdup(s->dir ? s->dir : "data");
    if (!held->dir) TC_FATAL("out of host memory");
    if (s->kind == SOURCE_DECODED) {
        split_pixels(s, mark, held, count);
        free(mark);
        return;
    }
    copy_streaming_parts(s, held, count);
    held->labels = malloc((size_t)count * sizeof *held->labels);
    held->class_names = calloc((size_t)s->num_classes, sizeof *held->class_names);
    if (!held->labels || !held->class_names) TC_FATAL("out of host memory");
    for (int k = 0; k < s->num_classes; k++)
        if (!(held->class_names[k] = strdup(s->class_names[k]))) TC_FATAL("out of host memory");
    held->num_classes = s->num_classes;
    int kept = 0, out = 0;
    held->bytes_total = 0;
    s->bytes_total = 0;
    for (int i = 0; i < s->n; i++) {
        Source *to = mark[i] ? held : s;
        int at = mark[i] ? out++ : kept++;
        copy_entry(s, i, to, at);
        to->bytes_total += s->size[i];
    }
    s->n = kept;
    held->n = count;
    if (s->kind == SOURCE_SHARDS) {
        index_shard_groups(s);
        index_shard_groups(held);
    }
    free(mark);
}
