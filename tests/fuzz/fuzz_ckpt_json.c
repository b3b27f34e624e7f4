/* The checkpoint's meta and tensors sections (tools/trainer/ckpt_meta.h), as
 * export, predict and eval read them: from a checkpoint file, then as JSON.
 *
 * Input: the meta section's text, FUZZ_SEP, the tensors section's text. The
 * two are made a checkpoint file, opened and read back; when a check accepts
 * a section, every value the readers then take from it must be in its range. */
#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "runtime/checkpoint.h"
#include "tests/fuzz/fuzz_common.h"
#include "tools/trainer/ckpt_meta.h"

static cJSON *read_json(CkptFile *f, const char *name) {
    int64_t size = ckpt_section_size(f, name);
    char err[8192] = "";
    char *text = malloc((size_t)size + 1);
    if (ckpt_read_section(f, name, text, (size_t)size, err, sizeof err) != 0) fuzz_fail("%s: %s", name, err);
    text[size] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    return root;
}

static double number(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) fuzz_fail("accepted meta without a number %s", key);
    return v->valuedouble;
}

static void check_meta(const cJSON *meta) {
    char err[8192] = "";
    if (ckpt_meta_check(meta, "x.trc", err, sizeof err) != 0) {
        fuzz_expect_message("ckpt_meta_check", err);
        return;
    }
    double image = number(meta, "image_size"), classes = number(meta, "num_classes");
    if (image < CKPT_META_MIN_IMAGE || image > CKPT_META_MAX_IMAGE || image != floor(image))
        fuzz_fail("accepted image_size %g", image);
    if (classes < 1 || classes > DATASET_MAX_CLASSES || classes != floor(classes))
        fuzz_fail("accepted num_classes %g", classes);
    const char *layout = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "layout"));
    if (!layout || (strcmp(layout, "nchw") && strcmp(layout, "nhwc"))) fuzz_fail("accepted a layout");
    const cJSON *std = cJSON_GetObjectItemCaseSensitive(meta, "std");
    for (const cJSON *v = std ? std->child : NULL; v; v = v->next)
        if (!(v->valuedouble > 0) || !isfinite(v->valuedouble)) fuzz_fail("accepted std %g", v->valuedouble);
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(meta, "class_names");
    if (names && cJSON_GetArraySize(names) != (int)classes) fuzz_fail("accepted class_names of another count");
}

static void check_table(const cJSON *table) {
    char err[8192] = "";
    if (ckpt_tensors_check(table, 64, "x.trc", err, sizeof err) != 0) {
        fuzz_expect_message("ckpt_tensors_check", err);
        return;
    }
    for (const cJSON *e = table->child; e; e = e->next) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
        if (!name || !name[0] || strlen(name) >= CKPT_META_NAME_LEN) fuzz_fail("accepted a tensor name");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        if (cJSON_GetArraySize(shape) < 1 || cJSON_GetArraySize(shape) > CKPT_META_MAX_DIMS)
            fuzz_fail("accepted a shape of %d sizes", cJSON_GetArraySize(shape));
        for (const cJSON *d = shape->child; d; d = d->next)
            if (!(d->valuedouble >= 1 && d->valuedouble <= 2147483647.0)) fuzz_fail("accepted a size");
        double offset = number(e, "offset");
        if (offset < 0 || offset != floor(offset)) fuzz_fail("accepted offset %g", offset);
    }
}

/* The checkpoint file of the format runtime/checkpoint.h lays out, built here
 * (the writer's fsync would slow every input down). */
static size_t put(uint8_t *out, size_t at, const void *bytes, size_t n) {
    memcpy(out + at, bytes, n);
    return at + n;
}

static size_t put_section(uint8_t *out, size_t at, const char *name, const FuzzPart *part) {
    char padded[CKPT_NAME_LEN] = {0};
    uint64_t n = part->size;
    uint32_t crc = ckpt_crc32(0, part->data, part->size);
    memcpy(padded, name, strlen(name));
    at = put(out, at, padded, sizeof padded);
    at = put(out, at, &n, sizeof n);
    at = put(out, at, part->data, part->size);
    return put(out, at, &crc, sizeof crc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzPart parts[2];
    uint32_t version = 1, n = (uint32_t)fuzz_split(data, size, parts, 2);
    const char *names[2] = {"meta", "tensors"};
    uint8_t *file = malloc(size + 128);
    size_t at = put(file, 0, CKPT_MAGIC, 8);
    at = put(file, at, &version, sizeof version);
    at = put(file, at, &n, sizeof n);
    for (uint32_t i = 0; i < n; i++) at = put_section(file, at, names[i], &parts[i]);
    at = put(file, at, "TRCKEND\n", 8);
    uint32_t crc = ckpt_crc32(0, file, at);
    at = put(file, at, &crc, sizeof crc);
    fuzz_scratch_reset();
    fuzz_write("x.trc", file, at);
    free(file);
    char err[8192] = "";
    CkptFile *f = ckpt_open(fuzz_path("x.trc"), err, sizeof err);
    if (!f) fuzz_fail("a checkpoint of the documented format does not open: %s", err);
    cJSON *meta = read_json(f, "meta"), *table = n > 1 ? read_json(f, "tensors") : NULL;
    ckpt_close(f);
    if (meta) check_meta(meta);
    if (table) check_table(table);
    cJSON_Delete(meta);
    cJSON_Delete(table);
    return 0;
}
