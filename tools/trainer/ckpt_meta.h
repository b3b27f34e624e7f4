/* The checkpoint's "meta" and "tensors" JSON sections (export.h lays them
 * out) checked as JSON before anything is built from them: every key read
 * from them has its type and range checked here, in one place, so that a
 * damaged or hostile value is refused naming the file and the key rather than
 * overflowing or being taken for a default. Knows no models (fuzzed on its
 * own: tests/fuzz/fuzz_ckpt_json.c). */
#ifndef TRAINC_TOOLS_TRAINER_CKPT_META_H
#define TRAINC_TOOLS_TRAINER_CKPT_META_H

#include <stddef.h>

struct cJSON;

#define CKPT_META_MIN_IMAGE 8    /* data.image_size's range */
#define CKPT_META_MAX_IMAGE 4096
#define CKPT_META_MAX_DIMS 4
#define CKPT_META_NAME_LEN 64    /* a tensor's name, its NUL included */

/* The meta's keys: "model" (a string), "layout" ("nchw" or "nhwc"),
 * "image_size" and "num_classes" (whole numbers in range) are required;
 * "in_channels", "mean", "std" (3 finite numbers, std > 0), "eval_resize" (0,
 * or image_size to DATASET_MAX_SIDE), "bn_eps" ([a number in (0, 1)]) and
 * "class_names" (num_classes strings) are checked when present. 0, or -1 with
 * a message naming path and the key in err. */
int ckpt_meta_check(const struct cJSON *meta, const char *path, char *err, size_t errlen);

/* The tensor table: an array of at most max_entries objects, each with a
 * "name" (1 to 63 bytes), a "shape" of 1 to 4 whole numbers from 1 to 2^31-1,
 * a "section" ("params" or "bn_stats"), "dtype" "F32" where present, and a
 * whole "offset" below 2^53. 0, or -1 naming path, the entry and the key. */
int ckpt_tensors_check(const struct cJSON *table, int max_entries, const char *path, char *err, size_t errlen);

#endif
