/* An image folder, root/<split>/<class>/<file>: listed in sorted order into a
 * streaming source (data/source.h), whose index holds each file's path and
 * size; image_folder_load then decodes it once (source_decode_all). */
#include "data/source.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/check.h"
#include "runtime/files.h"
#include "runtime/log.h"

#define IMAGE_FOLDER_TRAIN_SPLIT "train"

typedef struct {
    char **items;
    int64_t *bytes;  /* files: each one's size */
    int count, capacity;
} NameList;

static void names_push(NameList *l, const char *name, int64_t bytes) {
    if (l->count == l->capacity) {
        l->capacity = l->capacity ? 2 * l->capacity : 64;
        l->items = realloc(l->items, (size_t)l->capacity * sizeof *l->items);
        l->bytes = realloc(l->bytes, (size_t)l->capacity * sizeof *l->bytes);
        if (!l->items || !l->bytes) TC_FATAL("image folder: out of memory listing files");
    }
    l->bytes[l->count] = bytes;
    l->items[l->count] = strdup(name);
    if (!l->items[l->count++]) TC_FATAL("image folder: out of memory listing files");
}

static void names_free(NameList *l) {
    for (int i = 0; i < l->count; i++) free(l->items[i]);
    free(l->items);
    free(l->bytes);
    memset(l, 0, sizeof *l);
}

typedef struct {
    char *name;
    int64_t bytes;
} DirEntry;

static int compare_entries(const void *a, const void *b) {
    return strcmp(((const DirEntry *)a)->name, ((const DirEntry *)b)->name);
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

/* Sorted names in dir: sub-folders (want_dirs) or image files, with their
 * sizes; hidden entries skipped. */
static int list_dir(const char *dir, int want_dirs, NameList *out, char *err, size_t errlen) {
    DIR *dp = opendir(dir);
    if (!dp) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    DirEntry *entries = NULL;
    size_t count = 0, capacity = 0;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char *full = path_join(dir, e->d_name);
        struct stat st;
        int found = stat(full, &st) == 0;
        int is_dir = found && S_ISDIR(st.st_mode), is_file = found && S_ISREG(st.st_mode);
        if (!want_dirs && !is_file && has_image_extension(e->d_name)) /* never opened: a FIFO would block */
            log_warn("image folder: left out %s: %s", full,
                     found ? files_kind_name(st.st_mode) : strerror(errno));
        free(full);
        if (!(want_dirs ? is_dir : (is_file && has_image_extension(e->d_name)))) continue;
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 256;
            entries = realloc(entries, capacity * sizeof *entries);
            if (!entries) TC_FATAL("image folder: out of memory listing %s", dir);
        }
        entries[count].name = strdup(e->d_name);
        if (!entries[count].name) TC_FATAL("image folder: out of memory listing %s", dir);
        entries[count++].bytes = (int64_t)st.st_size;
    }
    closedir(dp);
    if (count > 1) qsort(entries, count, sizeof *entries, compare_entries);
    for (size_t i = 0; i < count; i++) {
        names_push(out, entries[i].name, entries[i].bytes);
        free(entries[i].name);
    }
    free(entries);
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

/* The split's class folders and the files of each (NULL-terminated lists
 * freed by free_listing), checked as the header of dataset.h says. */
typedef struct {
    NameList classes;
    NameList *files;
    int *take;
} Listing;

static void free_listing(Listing *l) {
    for (int k = 0; l->files && k < l->classes.count; k++) names_free(&l->files[k]);
    free(l->files);
    free(l->take);
    names_free(&l->classes);
}

static int list_split(const char *root, const char *split, const char *split_dir, int limit, Listing *l, char *err,
                      size_t errlen) {
    if (list_classes(root, split_dir, &l->classes, err, errlen) != 0) return -1;
    if (check_same_classes(root, split, split_dir, &l->classes, err, errlen) != 0) return -1;
    int num_classes = l->classes.count;
    l->files = calloc((size_t)num_classes, sizeof *l->files);
    l->take = calloc((size_t)num_classes, sizeof *l->take);
    int *available = calloc((size_t)num_classes, sizeof *available);
    if (!l->files || !l->take || !available) TC_FATAL("image folder: out of memory listing %s", split_dir);
    for (int k = 0; k < num_classes; k++) {
        char *class_dir = path_join(split_dir, l->classes.items[k]);
        int listed = list_dir(class_dir, 0, &l->files[k], err, errlen);
        if (listed == 0 && l->files[k].count == 0)
            snprintf(err, errlen, "%s: no images (.jpg, .jpeg, .png or .bmp files)", class_dir);
        free(class_dir);
        if (listed != 0 || l->files[k].count == 0) {
            free(available);
            return -1;
        }
        available[k] = l->files[k].count;
    }
    class_quotas(available, num_classes, limit, l->take);
    free(available);
    return 0;
}

static void index_alloc(Source *s, int n) {
    s->file_at = malloc((size_t)n * sizeof *s->file_at);
    s->file_of = malloc((size_t)n * sizeof *s->file_of);
    s->offset = calloc((size_t)n, sizeof *s->offset);
    s->size = malloc((size_t)n * sizeof *s->size);
    s->name_at = malloc((size_t)n * sizeof *s->name_at);
    s->labels = malloc((size_t)n * sizeof *s->labels);
    if (!s->file_at || !s->file_of || !s->offset || !s->size || !s->name_at || !s->labels)
        TC_FATAL("image folder: out of memory for the index of %d images", n);
}

int source_open_folder(Source *s, const char *root, const char *split, int limit, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->kind = SOURCE_FILES;
    s->dir = path_join(root, split);
    Listing l = {0};
    if (list_split(root, split, s->dir, limit, &l, err, errlen) != 0) {
        free_listing(&l);
        source_free(s);
        return -1;
    }
    long total = 0;
    for (int k = 0; k < l.classes.count; k++) total += l.take[k];
    if (total > INT32_MAX) {
        snprintf(err, errlen, "%s: %ld images, more than the %d a split may hold", s->dir, total, INT32_MAX);
        free_listing(&l);
        source_free(s);
        return -1;
    }
    index_alloc(s, (int)total);
    int i = 0;
    for (int k = 0; k < l.classes.count; k++) {
        for (int f = 0; f < l.take[k]; f++, i++) {
            size_t len = strlen(l.classes.items[k]) + 1 + strlen(l.files[k].items[f]) + 1;
            char *rel = malloc(len);
            if (!rel) TC_FATAL("image folder: out of memory");
            snprintf(rel, len, "%s/%s", l.classes.items[k], l.files[k].items[f]);
            s->file_at[i] = s->name_at[i] = source_add_name(s, rel);
            free(rel);
            s->file_of[i] = i;
            s->size[i] = l.files[k].bytes[f];
            s->bytes_total += s->size[i];
            s->labels[i] = k;
        }
    }
    s->n = s->n_files = i;
    s->num_classes = l.classes.count;
    s->class_names = calloc((size_t)s->num_classes, sizeof *s->class_names);
    if (!s->class_names) TC_FATAL("image folder: out of memory");
    for (int k = 0; k < s->num_classes; k++) {
        s->class_names[k] = l.classes.items[k];
        l.classes.items[k] = NULL; /* moved */
    }
    free_listing(&l);
    return 0;
}

int image_folder_load(Dataset *d, const char *root, const char *split, int limit, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    Source s;
    if (source_open_folder(&s, root, split, limit, err, errlen) != 0) return -1;
    int rc = source_decode_all(&s, d, NULL, err, errlen);
    source_free(&s);
    return rc;
}
