/* An image folder, root/<split>/<class>/<file>: listed in sorted order, then
 * decoded with stb_image on several threads, each image into its own place, so
 * the result does not depend on the thread count. */
#include "data/dataset.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stb_image.h>

#include "runtime/check.h"

#define DECODE_MAX_THREADS 8
#define IMAGE_FOLDER_TRAIN_SPLIT "train"

typedef struct {
    char **items;
    int count, capacity;
} NameList;

static void names_push(NameList *l, const char *name) {
    if (l->count == l->capacity) {
        l->capacity = l->capacity ? 2 * l->capacity : 64;
        l->items = realloc(l->items, (size_t)l->capacity * sizeof *l->items);
        if (!l->items) TC_FATAL("image folder: out of memory listing files");
    }
    l->items[l->count] = strdup(name);
    if (!l->items[l->count++]) TC_FATAL("image folder: out of memory listing files");
}

static void names_free(NameList *l) {
    for (int i = 0; i < l->count; i++) free(l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *path_join(const char *a, const char *b) {
    size_t len = strlen(a) + 1 + strlen(b) + 1;
    char *p = malloc(len);
    if (!p) TC_FATAL("image folder: out of memory");
    snprintf(p, len, "%s/%s", a, b);
    return p;
}

static int has_image_extension(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return 0;
    return !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") || !strcasecmp(dot, ".png") ||
           !strcasecmp(dot, ".bmp");
}

/* Sorted names in dir: sub-folders (want_dirs) or image files; hidden entries skipped. */
static int list_dir(const char *dir, int want_dirs, NameList *out, char *err, size_t errlen) {
    DIR *dp = opendir(dir);
    if (!dp) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char *full = path_join(dir, e->d_name);
        struct stat st;
        int is_dir = stat(full, &st) == 0 && S_ISDIR(st.st_mode);
        int is_file = !is_dir && S_ISREG(st.st_mode);
        free(full);
        if (want_dirs ? is_dir : (is_file && has_image_extension(e->d_name)))
            names_push(out, e->d_name);
    }
    closedir(dp);
    if (out->count > 1) qsort(out->items, (size_t)out->count, sizeof *out->items, compare_names);
    return 0;
}

/* How many images to take from each class: all of them, or 'limit' spread evenly
 * (a class short of its share leaves the rest to the others). */
static void class_quotas(const int *available, int num_classes, int limit, int *take) {
    long total = 0;
    for (int k = 0; k < num_classes; k++) total += available[k];
    int take_all = limit <= 0 || limit >= total;
    for (int k = 0; k < num_classes; k++) take[k] = take_all ? available[k] : 0;
    if (take_all) return;
    int left = limit;
    while (left > 0) {
        int open = 0;
        for (int k = 0; k < num_classes; k++) open += take[k] < available[k];
        int share = left / open > 0 ? left / open : 1;
        for (int k = 0; k < num_classes && left > 0; k++) {
            int room = available[k] - take[k];
            int add = room < share ? room : share;
            take[k] += add;
            left -= add;
        }
    }
}

typedef struct {
    char **paths;        /* one per image, in dataset order */
    int n, h, w;         /* h, w: the size of the first image, which all must share */
    uint8_t *pixels;
    atomic_int next;     /* next image to claim */
    atomic_int first_error; /* lowest failing image so far, n when none */
    pthread_mutex_t error_lock;
    char error[1024];
} DecodeJob;

static int read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len, char *err,
                     size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        fclose(f);
        return -1;
    }
    if (st.st_size > 0x7fffffff) { /* stb_image takes an int length */
        snprintf(err, errlen, "%s: %lld bytes, too large for an image file", path,
                 (long long)st.st_size);
        fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (size > *cap) {
        *cap = size;
        *buf = realloc(*buf, size);
        if (!*buf) TC_FATAL("image folder: out of memory reading %s", path);
    }
    if (fread(*buf, 1, size, f) != size) {
        snprintf(err, errlen, "%s: read error", path);
        fclose(f);
        return -1;
    }
    fclose(f);
    *len = size;
    return 0;
}

/* What the first bytes say a file is. */
typedef enum { IMAGE_UNKNOWN, IMAGE_JPEG, IMAGE_PNG, IMAGE_BMP } ImageKind;

static ImageKind image_kind(const uint8_t *buf, size_t len) {
    static const uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff) return IMAGE_JPEG;
    if (len >= 8 && memcmp(buf, png_signature, 8) == 0) return IMAGE_PNG;
    if (len >= 2 && buf[0] == 'B' && buf[1] == 'M') return IMAGE_BMP;
    return IMAGE_UNKNOWN;
}

static const char *image_kind_name(ImageKind kind) {
    return kind == IMAGE_JPEG ? "JPEG" : kind == IMAGE_PNG ? "PNG" : "BMP";
}

static int not_an_image(const char *path, const uint8_t *buf, size_t len, char *err,
                        size_t errlen) {
    char start[32] = "";
    for (size_t i = 0; i < len && i < 4; i++)
        snprintf(start + strlen(start), sizeof start - strlen(start), " %02x", buf[i]);
    snprintf(err, errlen, "%s: cannot decode: not a JPEG, PNG or BMP image (its first bytes are%s)",
             path, start);
    return -1;
}

/* stb_image's reason for a failure, where it is the decoder's own: stb tries
 * the PNG signature before the other formats, and a JPEG or BMP decoder that
 * fails without saying why leaves that test's "bad png sig" behind. */
static const char *stb_reason(ImageKind kind) {
    const char *reason = stbi_failure_reason();
    if (!reason || strcmp(reason, "unknown image type") == 0 ||
        (kind != IMAGE_PNG && strcmp(reason, "bad png sig") == 0))
        return NULL;
    return reason;
}

/* Sides as a header gives them (a top-down BMP has a negative height). */
static int check_image_shape(const char *path, long long w, long long h, int channels, char *err,
                             size_t errlen) {
    if (w < 1 || h < 1 || w > DATASET_MAX_SIDE || h > DATASET_MAX_SIDE) {
        snprintf(err, errlen, "%s: image is %lldx%lld; each side must be 1 to %d pixels", path, w,
                 h, DATASET_MAX_SIDE);
        return -1;
    }
    if (channels < 1 || channels > 4) {
        snprintf(err, errlen, "%s: image has %d channels; 1 to 4 are read", path, channels);
        return -1;
    }
    return 0;
}

static uint32_t read_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t read_le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

/* stb_image decodes an uncompressed BMP cut short as if the missing rows were
 * zeros, so the rows' extent is checked against the file here. */
static int check_bmp_complete(const char *path, const uint8_t *buf, size_t len, char *err,
                              size_t errlen) {
    if (len < 30) return 0; /* stbi_info has refused it already */
    uint32_t offset = read_le32(buf + 10), header_bytes = read_le32(buf + 14);
    long long w, h;
    uint32_t bits, compression = 0;
    if (header_bytes == 12) { /* OS/2 */
        w = read_le16(buf + 18);
        h = (int16_t)read_le16(buf + 20);
        bits = read_le16(buf + 24);
    } else {
        if (len < 34) return 0;
        w = (int32_t)read_le32(buf + 18);
        h = (int32_t)read_le32(buf + 22);
        bits = read_le16(buf + 28);
        compression = read_le32(buf + 30);
    }
    if (h < 0) h = -h;
    /* 0: plain rows, 3 and 6: rows with bit fields; stb_image refuses the rest. */
    if (compression != 0 && compression != 3 && compression != 6) return 0;
    if (w < 1 || h < 1 || w > DATASET_MAX_SIDE || h > DATASET_MAX_SIDE || bits > 64) return 0;
    long long row_bytes = (w * bits + 31) / 32 * 4;
    long long needed = (long long)offset + row_bytes * h;
    if (needed > (long long)len) {
        snprintf(err, errlen,
                 "%s: cannot decode this BMP: it is truncated (its %lld rows of %lld pixels need "
                 "%lld bytes, the file has %zu)",
                 path, h, w, needed, len);
        return -1;
    }
    return 0;
}

static uint32_t read_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* stb_image grows its PNG data buffer to each chunk's claimed length before
 * reading it, so one corrupt length asks for gigabytes: every chunk up to
 * IEND must fit in the file. */
static int check_png_complete(const char *path, const uint8_t *buf, size_t len, char *err,
                              size_t errlen) {
    size_t at = 8; /* the signature */
    while (at + 12 <= len) {
        uint32_t chunk_bytes = read_be32(buf + at);
        if (chunk_bytes > len - at - 12) {
            snprintf(err, errlen,
                     "%s: cannot decode this PNG: it is truncated or corrupt (the chunk at byte %zu "
                     "claims %u bytes, the file has %zu after it)",
                     path, at, chunk_bytes, len - at - 12);
            return -1;
        }
        if (memcmp(buf + at + 4, "IEND", 4) == 0) return 0;
        at += 12 + (size_t)chunk_bytes;
    }
    return 0; /* no IEND: stb_image refuses it itself */
}

/* Reads and decodes one image file to RGB, HWC (stbi_image_free it): a whole
 * JPEG, PNG or BMP of a size the reader takes, or NULL with a message. */
static uint8_t *decode_file(const char *path, uint8_t **buf, size_t *cap, int *w, int *h,
                            char *err, size_t errlen) {
    size_t len;
    if (read_file(path, buf, cap, &len, err, errlen) != 0) return NULL;
    if (len == 0) {
        snprintf(err, errlen, "%s: cannot decode: an empty file (0 bytes)", path);
        return NULL;
    }
    ImageKind kind = image_kind(*buf, len);
    if (kind == IMAGE_UNKNOWN) {
        not_an_image(path, *buf, len, err, errlen);
        return NULL;
    }
    int channels;
    if (!stbi_info_from_memory(*buf, (int)len, w, h, &channels)) {
        snprintf(err, errlen, "%s: cannot decode this %s: its header is truncated or corrupt", path,
                 image_kind_name(kind));
        return NULL;
    }
    if (check_image_shape(path, *w, *h < 0 ? -(long long)*h : *h, channels, err, errlen) != 0)
        return NULL;
    if (kind == IMAGE_BMP && check_bmp_complete(path, *buf, len, err, errlen) != 0) return NULL;
    if (kind == IMAGE_PNG && check_png_complete(path, *buf, len, err, errlen) != 0) return NULL;
    uint8_t *hwc = stbi_load_from_memory(*buf, (int)len, w, h, &channels, 3);
    if (!hwc) {
        const char *reason = stb_reason(kind);
        snprintf(err, errlen, "%s: cannot decode this %s: its data is truncated or corrupt%s%s%s",
                 path, image_kind_name(kind), reason ? " (stb_image: " : "", reason ? reason : "",
                 reason ? ")" : "");
        return NULL;
    }
    if (check_image_shape(path, *w, *h, channels, err, errlen) != 0) {
        stbi_image_free(hwc);
        return NULL;
    }
    return hwc;
}

static void hwc_to_chw(const uint8_t *hwc, size_t plane, uint8_t *chw) {
    for (size_t p = 0; p < plane; p++) {
        chw[p] = hwc[3 * p];
        chw[plane + p] = hwc[3 * p + 1];
        chw[2 * plane + p] = hwc[3 * p + 2];
    }
}

uint8_t *image_file_decode_rgb(const char *path, int *w, int *h, char *err, size_t errlen) {
    uint8_t *buf = NULL;
    size_t cap = 0;
    uint8_t *hwc = decode_file(path, &buf, &cap, w, h, err, errlen);
    free(buf);
    if (!hwc) return NULL;
    size_t plane = (size_t)*h * (size_t)*w;
    uint8_t *chw = malloc(3 * plane);
    if (!chw) TC_FATAL("out of host memory: a %dx%d image from %s", *w, *h, path);
    hwc_to_chw(hwc, plane, chw);
    stbi_image_free(hwc);
    return chw;
}

/* Decodes image i (> 0) into its CHW place; it must have image 0's size. */
static int decode_image(DecodeJob *job, int i, uint8_t **buf, size_t *cap, char *err,
                        size_t errlen) {
    const char *path = job->paths[i];
    int w, h;
    uint8_t *hwc = decode_file(path, buf, cap, &w, &h, err, errlen);
    if (!hwc) return -1;
    if (h != job->h || w != job->w) {
        snprintf(err, errlen, "%s: image is %dx%d but %s is %dx%d; all images must have one size",
                 path, w, h, job->paths[0], job->w, job->h);
        stbi_image_free(hwc);
        return -1;
    }
    size_t plane = (size_t)h * w;
    hwc_to_chw(hwc, plane, job->pixels + (size_t)i * 3 * plane);
    stbi_image_free(hwc);
    return 0;
}

static void *decode_worker(void *arg) {
    DecodeJob *job = arg;
    uint8_t *buf = NULL;
    size_t cap = 0;
    char err[1024];
    for (;;) {
        /* Claims go up one by one, so every image below a failing one is still
         * decoded and the error reported is the first in dataset order. */
        int i = atomic_fetch_add(&job->next, 1);
        if (i >= job->n || i > atomic_load(&job->first_error)) break;
        if (decode_image(job, i, &buf, &cap, err, sizeof err) != 0) {
            pthread_mutex_lock(&job->error_lock);
            if (i < atomic_load(&job->first_error)) {
                atomic_store(&job->first_error, i);
                snprintf(job->error, sizeof job->error, "%s", err);
            }
            pthread_mutex_unlock(&job->error_lock);
        }
    }
    free(buf);
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
static int alloc_pixels(DecodeJob *job, char *err, size_t errlen) {
    size_t bytes = (size_t)job->n * 3 * (size_t)job->h * (size_t)job->w;
    long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    double memory = pages > 0 && page_bytes > 0 ? (double)pages * (double)page_bytes : 0.0;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (memory > 0.0 && (double)bytes > memory) {
        snprintf(err, errlen,
                 "%d images of %dx%d (the size of %s) need %.1f GiB, more than this machine's "
                 "%.1f GiB of memory; load fewer (a limit) or smaller images",
                 job->n, job->w, job->h, job->paths[0], (double)bytes / gib, memory / gib);
        return -1;
    }
    job->pixels = malloc(bytes);
    if (!job->pixels) {
        snprintf(err, errlen, "out of memory for %d images of %dx%d (the size of %s)", job->n,
                 job->w, job->h, job->paths[0]);
        return -1;
    }
    return 0;
}

/* The first image sets the size; the rest are decoded in parallel. */
static int decode_all(DecodeJob *job, char *err, size_t errlen) {
    uint8_t *buf = NULL;
    size_t cap = 0;
    uint8_t *first = decode_file(job->paths[0], &buf, &cap, &job->w, &job->h, err, errlen);
    free(buf);
    if (!first) return -1;
    int rc = alloc_pixels(job, err, errlen);
    if (rc == 0) hwc_to_chw(first, (size_t)job->h * job->w, job->pixels);
    stbi_image_free(first);
    if (rc != 0) return -1;
    atomic_init(&job->next, 1);
    atomic_init(&job->first_error, job->n);
    pthread_mutex_init(&job->error_lock, NULL);
    int threads = decode_threads(job->n - 1);
    pthread_t tids[DECODE_MAX_THREADS];
    int started = 0;
    for (; started < threads - 1; started++)
        if (pthread_create(&tids[started], NULL, decode_worker, job) != 0) break;
    decode_worker(job); /* the calling thread decodes too */
    for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
    pthread_mutex_destroy(&job->error_lock);
    if (atomic_load(&job->first_error) < job->n) {
        snprintf(err, errlen, "%s", job->error);
        free(job->pixels);
        job->pixels = NULL;
        return -1;
    }
    return 0;
}

static const char image_folder_howto[] =
    "an image folder is <root>/<split>/<class>/<image>, and the labels number the class "
    "folders in sorted order; for CIFAR-10 unpack cifar10-jpg.tar.gz with: mkdir -p .data && "
    "tar xzf cifar10-jpg.tar.gz -C .data";

/* The split's class folders, or -1 with a message that says what an image
 * folder is when the root or the split is missing. */
static int list_classes(const char *root, const char *split_dir, NameList *classes, char *err,
                        size_t errlen) {
    struct stat st;
    if (stat(root, &st) != 0) {
        snprintf(err, errlen, "%s: %s (%s)", root, strerror(errno), image_folder_howto);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: not a folder (%s)", root, image_folder_howto);
        return -1;
    }
    if (list_dir(split_dir, 1, classes, err, errlen) != 0) {
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", err);
        snprintf(err, errlen, "%s (%s)", reason, image_folder_howto);
        return -1;
    }
    if (classes->count == 0) {
        snprintf(err, errlen, "%s: no class folders (%s)", split_dir, image_folder_howto);
        return -1;
    }
    if (classes->count > DATASET_MAX_CLASSES) {
        snprintf(err, errlen, "%s: %d class folders, more than the %d allowed", split_dir,
                 classes->count, DATASET_MAX_CLASSES);
        return -1;
    }
    return 0;
}

/* Where two sorted lists differ: how many names of each are not in the other,
 * and the first such name of each. */
typedef struct {
    int missing, extra;
    const char *first_missing, *first_extra;
} ListDifference;

static ListDifference compare_sorted(const NameList *want, const NameList *have) {
    ListDifference diff = {0};
    int a = 0, b = 0;
    while (a < want->count || b < have->count) {
        int order = a == want->count   ? 1
                    : b == have->count ? -1
                                       : strcmp(want->items[a], have->items[b]);
        if (order < 0) {
            if (diff.missing++ == 0) diff.first_missing = want->items[a];
            a++;
        } else if (order > 0) {
            if (diff.extra++ == 0) diff.first_extra = have->items[b];
            b++;
        } else {
            a++;
            b++;
        }
    }
    return diff;
}

/* Labels are class numbers of the training split, so another split must have
 * exactly its class folders, or its labels would silently mean other classes.
 * Without a training split there is nothing to compare with. */
static int check_same_classes(const char *root, const char *split, const char *split_dir,
                              const NameList *classes, char *err, size_t errlen) {
    if (strcmp(split, IMAGE_FOLDER_TRAIN_SPLIT) == 0) return 0;
    char *train_dir = path_join(root, IMAGE_FOLDER_TRAIN_SPLIT);
    NameList train_classes = {0};
    struct stat st;
    int rc = 0;
    if (stat(train_dir, &st) == 0 && S_ISDIR(st.st_mode) &&
        (rc = list_dir(train_dir, 1, &train_classes, err, errlen)) == 0) {
        ListDifference diff = compare_sorted(&train_classes, classes);
        if (diff.missing > 0 || diff.extra > 0) {
            char missing[600] = "", extra[600] = "";
            if (diff.missing > 0)
                snprintf(missing, sizeof missing, "; %d missing here, the first '%s'",
                         diff.missing, diff.first_missing);
            if (diff.extra > 0)
                snprintf(extra, sizeof extra, "; %d not in %s, the first '%s'", diff.extra,
                         train_dir, diff.first_extra);
            snprintf(err, errlen,
                     "%s: its class folders differ from those of %s, which number the "
                     "labels%s%s; both splits need the same class folders",
                     split_dir, train_dir, missing, extra);
            rc = -1;
        }
    }
    names_free(&train_classes);
    free(train_dir);
    return rc;
}

int image_folder_load(Dataset *d, const char *root, const char *split, int limit, char *err,
                      size_t errlen) {
    memset(d, 0, sizeof *d);
    char *split_dir = path_join(root, split);
    NameList classes = {0};
    NameList *files = NULL;
    int *available = NULL, *take = NULL;
    DecodeJob job = {0};
    int rc = -1;

    if (list_classes(root, split_dir, &classes, err, errlen) != 0) goto done;
    if (check_same_classes(root, split, split_dir, &classes, err, errlen) != 0) goto done;
    int num_classes = classes.count;
    files = calloc((size_t)num_classes, sizeof *files);
    available = calloc((size_t)num_classes, sizeof *available);
    take = calloc((size_t)num_classes, sizeof *take);
    if (!files || !available || !take)
        TC_FATAL("image folder: out of memory listing %s", split_dir);
    for (int k = 0; k < num_classes; k++) {
        char *class_dir = path_join(split_dir, classes.items[k]);
        int listed = list_dir(class_dir, 0, &files[k], err, errlen);
        if (listed == 0 && files[k].count == 0)
            snprintf(err, errlen, "%s: no images (.jpg, .jpeg, .png or .bmp files)", class_dir);
        free(class_dir);
        if (listed != 0 || files[k].count == 0) goto done;
        available[k] = files[k].count;
    }
    class_quotas(available, num_classes, limit, take);

    for (int k = 0; k < num_classes; k++) job.n += take[k];
    job.paths = malloc((size_t)job.n * sizeof *job.paths);
    d->labels = malloc((size_t)job.n * sizeof *d->labels);
    if (!job.paths || !d->labels) TC_FATAL("image folder: out of memory listing %s", split_dir);
    int i = 0;
    for (int k = 0; k < num_classes; k++) {
        char *class_dir = path_join(split_dir, classes.items[k]);
        for (int f = 0; f < take[k]; f++, i++) {
            job.paths[i] = path_join(class_dir, files[k].items[f]);
            d->labels[i] = k;
        }
        free(class_dir);
    }
    if (decode_all(&job, err, errlen) != 0) goto done;
    d->n = job.n;
    d->c = 3;
    d->h = job.h;
    d->w = job.w;
    d->num_classes = num_classes;
    d->pixels = job.pixels;
    dataset_set_class_names(d, (const char *const *)classes.items, num_classes);
    rc = 0;

done:
    if (rc != 0) dataset_free(d);
    for (int p = 0; p < job.n && job.paths; p++) free(job.paths[p]);
    free(job.paths);
    for (int k = 0; files && k < classes.count; k++) names_free(&files[k]);
    free(files);
    free(available);
    free(take);
    names_free(&classes);
    free(split_dir);
    return rc;
}
