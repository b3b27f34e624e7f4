/* The checkpoint's meta and tensors sections checked as JSON (ckpt_meta.h). */
#include "tools/trainer/ckpt_meta.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "data/dataset.h"

#define MAX_WHOLE 9007199254740992.0 /* 2^53 */

static int whole_in(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi &&
           v->valuedouble == floor(v->valuedouble);
}

static const cJSON *key(const cJSON *o, const char *name) { return cJSON_GetObjectItemCaseSensitive(o, name); }

/* n finite numbers, each above lo (when above) or at least lo. */
static int numbers(const cJSON *a, int n, double lo, int above) {
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return 0;
    for (const cJSON *v = a->child; v; v = v->next)
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || (above ? v->valuedouble <= lo : v->valuedouble < lo))
            return 0;
    return 1;
}

static int strings(const cJSON *a, int n) {
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return 0;
    for (const cJSON *v = a->child; v; v = v->next)
        if (!cJSON_IsString(v)) return 0;
    return 1;
}

int ckpt_meta_check(const cJSON *meta, const char *path, char *err, size_t errlen) {
    const char *bad = NULL, *layout = cJSON_GetStringValue(key(meta, "layout"));
    const cJSON *image = key(meta, "image_size"), *classes = key(meta, "num_classes");
    const cJSON *resize = key(meta, "eval_resize"), *eps = key(meta, "bn_eps");
    const cJSON *mean = key(meta, "mean"), *std = key(meta, "std"), *names = key(meta, "class_names");
    const cJSON *channels = key(meta, "in_channels");
    if (!cJSON_IsObject(meta)) bad = "its meta section is not a JSON object";
    else if (!cJSON_GetStringValue(key(meta, "model"))) bad = "its meta section's model is not a string";
    else if (!layout || (strcmp(layout, "nchw") != 0 && strcmp(layout, "nhwc") != 0))
        bad = "its meta section's layout is neither \"nchw\" nor \"nhwc\"";
    else if (!whole_in(image, CKPT_META_MIN_IMAGE, CKPT_META_MAX_IMAGE)) {
        snprintf(err, errlen, "%s: its meta section's image_size is not a whole number from %d to %d", path,
                 CKPT_META_MIN_IMAGE, CKPT_META_MAX_IMAGE);
        return -1;
    } else if (!whole_in(classes, 1, DATASET_MAX_CLASSES)) {
        snprintf(err, errlen, "%s: its meta section's num_classes is not a whole number from 1 to %d", path,
                 DATASET_MAX_CLASSES);
        return -1;
    } else if (channels && !whole_in(channels, 1, 4096)) bad = "its meta section's in_channels is not a whole number";
    else if ((mean && !numbers(mean, 3, -INFINITY, 0)) || (std && !numbers(std, 3, 0, 1)))
        bad = "its meta section's mean or std is not 3 finite numbers (std above 0)";
    else if (resize && !(whole_in(resize, 0, 0) || whole_in(resize, image->valuedouble, DATASET_MAX_SIDE)))
        bad = "its meta section's eval_resize is neither 0 nor from image_size to 16384";
    else if (eps && !(numbers(eps, 1, 0, 1) && eps->child->valuedouble < 1))
        bad = "its meta section's bn_eps is not [a number between 0 and 1]";
    else if (names && !strings(names, (int)classes->valuedouble))
        bad = "its meta section's class_names are not num_classes strings";
    if (!bad) return 0;
    snprintf(err, errlen, "%s: %s", path, bad);
    return -1;
}

static const char *entry_problem(const cJSON *e) {
    const char *name = cJSON_GetStringValue(key(e, "name")), *section = cJSON_GetStringValue(key(e, "section"));
    const cJSON *shape = key(e, "shape"), *dtype = key(e, "dtype");
    if (!cJSON_IsObject(e)) return "is not a JSON object";
    if (!name || !name[0] || strlen(name) >= CKPT_META_NAME_LEN) return "has no name of 1 to 63 bytes";
    int ndim = cJSON_GetArraySize(shape);
    if (!cJSON_IsArray(shape) || ndim < 1 || ndim > CKPT_META_MAX_DIMS) return "has no shape of 1 to 4 numbers";
    for (const cJSON *d = shape->child; d; d = d->next)
        if (!whole_in(d, 1, 2147483647.0)) return "has a shape that is not of whole numbers from 1 to 2^31-1";
    if (!section || (strcmp(section, "params") != 0 && strcmp(section, "bn_stats") != 0))
        return "has a section that is neither \"params\" nor \"bn_stats\"";
    if (dtype && !(cJSON_IsString(dtype) && strcmp(dtype->valuestring, "F32") == 0))
        return "has a dtype other than F32";
    if (!whole_in(key(e, "offset"), 0, MAX_WHOLE - 1)) return "has an offset that is not a whole number";
    return NULL;
}

int ckpt_tensors_check(const cJSON *table, int max_entries, const char *path, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(table);
    if (!cJSON_IsArray(table) || n > max_entries) {
        snprintf(err, errlen, "%s: its tensors section is not an array of at most %d entries", path, max_entries);
        return -1;
    }
    int i = 0;
    for (const cJSON *e = table->child; e; e = e->next, i++) {
        const char *problem = entry_problem(e);
        if (problem) {
            snprintf(err, errlen, "%s: its tensors section's entry %d %s", path, i, problem);
            return -1;
        }
    }
    return 0;
}
