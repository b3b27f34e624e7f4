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
    l->items[l->count++] = strdup(name);
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

/* Decodes image i into its CHW place; h, w receive its size when *h == 0. */
static int decode_image(DecodeJob *job, int i, uint8_t **buf, size_t *cap, char *err,
                        size_t errlen) {
    const char *path = job->paths[i];
    size_t len;
    if (read_file(path, buf, cap, &len, err, errlen) != 0) return -1;
    if (len > 0x7fffffff) {
        snprintf(err, errlen, "%s: file too large", path);
        return -1;
    }
    int w, h, channels;
    uint8_t *hwc = stbi_load_from_memory(*buf, (int)len, &w, &h, &channels, 3);
    if (!hwc) {
        snprintf(err, errlen, "%s: cannot decode the image: %s", path, stbi_failure_reason());
        return -1;
    }
    if (h != job->h || w != job->w) {
        snprintf(err, errlen, "%s: image is %dx%d but %s is %dx%d; all images must have one size",
                 path, w, h, job->paths[0], job->w, job->h);
        stbi_image_free(hwc);
        return -1;
    }
    size_t plane = (size_t)h * w;
    uint8_t *chw = job->pixels + (size_t)i * 3 * plane;
    for (size_t p = 0; p < plane; p++) {
        chw[p] = hwc[3 * p];
        chw[plane + p] = hwc[3 * p + 1];
        chw[2 * plane + p] = hwc[3 * p + 2];
    }
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

/* The first image sets the size; the rest are decoded in parallel. */
static int decode_all(DecodeJob *job, char *err, size_t errlen) {
    uint8_t *buf = NULL;
    size_t cap = 0;
    size_t len;
    int w, h, channels;
    if (read_file(job->paths[0], &buf, &cap, &len, err, errlen) != 0) {
        free(buf);
        return -1;
    }
    if (len > 0x7fffffff || !stbi_info_from_memory(buf, (int)len, &w, &h, &channels)) {
        snprintf(err, errlen, "%s: cannot decode the image: %s", job->paths[0],
                 len > 0x7fffffff ? "file too large" : stbi_failure_reason());
        free(buf);
        return -1;
    }
    free(buf);
    job->h = h;
    job->w = w;
    job->pixels = malloc((size_t)job->n * 3 * h * w);
    if (!job->pixels) {
        snprintf(err, errlen, "out of memory for %d images of %dx%d", job->n, w, h);
        return -1;
    }
    atomic_init(&job->next, 0);
    atomic_init(&job->first_error, job->n);
    pthread_mutex_init(&job->error_lock, NULL);
    int threads = decode_threads(job->n);
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

int image_folder_load(Dataset *d, const char *root, const char *split, int limit, char *err,
                      size_t errlen) {
    memset(d, 0, sizeof *d);
    char *split_dir = path_join(root, split);
    NameList classes = {0};
    NameList *files = NULL;
    int *available = NULL, *take = NULL;
    DecodeJob job = {0};
    int rc = -1;

    if (list_dir(split_dir, 1, &classes, err, errlen) != 0) goto done;
    if (classes.count == 0) {
        snprintf(err, errlen, "%s: no class folders (expected %s/<class>/<image>)", split_dir,
                 split_dir);
        goto done;
    }
    if (classes.count > DATASET_MAX_CLASSES) {
        snprintf(err, errlen, "%s: %d class folders, more than the %d allowed", split_dir,
                 classes.count, DATASET_MAX_CLASSES);
        goto done;
    }
    int num_classes = classes.count;
    files = calloc((size_t)num_classes, sizeof *files);
    available = calloc((size_t)num_classes, sizeof *available);
    take = calloc((size_t)num_classes, sizeof *take);
    for (int k = 0; k < num_classes; k++) {
        char *class_dir = path_join(split_dir, classes.items[k]);
        int listed = list_dir(class_dir, 0, &files[k], err, errlen);
        if (listed == 0 && files[k].count == 0)
            snprintf(err, errlen, "%s: no images (.jpg, .jpeg, .png or .bmp)", class_dir);
        free(class_dir);
        if (listed != 0 || files[k].count == 0) goto done;
        available[k] = files[k].count;
    }
    class_quotas(available, num_classes, limit, take);

    for (int k = 0; k < num_classes; k++) job.n += take[k];
    job.paths = malloc((size_t)job.n * sizeof *job.paths);
    d->labels = malloc((size_t)job.n * sizeof *d->labels);
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
