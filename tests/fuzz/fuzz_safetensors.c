/* The safetensors reader (runtime/safetensors.h), as run.init_from reads a file.
 *
 * Input: the file's bytes. When the reader accepts them the file must be what
 * the format says, checked here on its own: the header length inside the
 * file, each key once, __metadata__ an object of strings, and the tensors'
 * spans (each its shape's bytes) back to back from the data's start to the
 * file's end. */
#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

static int by_data(const void *a, const void *b) {
    const SafetensorsTensor *x = *(const SafetensorsTensor *const *)a, *y = *(const SafetensorsTensor *const *)b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    return x->count < y->count ? -1 : x->count > y->count;
}

static void check_accepted(const Safetensors *st, const uint8_t *data, size_t size) {
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)data[b] << (8 * b);
    if (size < 8 || header_len > size - 8 || data[8] != '{') fuzz_fail("accepted a header outside the file");
    int n_keys = 0;
    for (const cJSON *a = st->header->child; a; a = a->next, n_keys++)
        for (const cJSON *b = a->next; b; b = b->next)
            if (strcmp(a->string, b->string) == 0) fuzz_fail("accepted \"%s\" twice", a->string);
    if (n_keys != st->n_tensors + (st->metadata != NULL)) fuzz_fail("%d keys, %d tensors", n_keys, st->n_tensors);
    if (st->metadata)
        for (const cJSON *v = st->metadata->child; v; v = v->next)
            if (!cJSON_IsString(v)) fuzz_fail("accepted metadata \"%s\" that is not a string", v->string);
    const SafetensorsTensor **order = malloc(((size_t)st->n_tensors + 1) * sizeof *order);
    for (int i = 0; i < st->n_tensors; i++) order[i] = &st->tensors[i];
    qsort(order, (size_t)st->n_tensors, sizeof *order, by_data);
    const unsigned char *at = st->bytes + 8 + header_len;
    for (int i = 0; i < st->n_tensors; i++) {
        const SafetensorsTensor *t = order[i];
        uint64_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (uint64_t)t->shape[d];
        if (t->data != at || count != t->count) fuzz_fail("tensor %s is not where the one before it ends", t->name);
        if ((size_t)(t->data - st->bytes) % (size_t)t->dtype_bytes != (8 + header_len) % (size_t)t->dtype_bytes)
            fuzz_fail("tensor %s misaligned", t->name);
        at += t->count * (uint64_t)t->dtype_bytes;
        if (at > st->bytes + size) fuzz_fail("tensor %s runs past the file", t->name);
        if (safetensors_find(st, t->name) != t) fuzz_fail("tensor %s not found by its name", t->name);
    }
    if (at != st->bytes + size) fuzz_fail("accepted %zu bytes after the last tensor", (size_t)(st->bytes + size - at));
    free(order);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *bytes = malloc(size ? size : 1);
    memcpy(bytes, data, size);
    Safetensors st;
    char err[8192] = "";
    if (safetensors_parse("x.safetensors", bytes, size, &st, err, sizeof err) != 0) {
        fuzz_expect_message("safetensors_parse", err);
        if (!strstr(err, "x.safetensors")) fuzz_fail("a refusal that does not name the file: %s", err);
    } else {
        check_accepted(&st, data, size);
    }
    safetensors_free(&st);
    /* Through the file too, now and then (the reader's own read and its refusals). */
    if (size % 16 == 0) {
        fuzz_scratch_reset();
        fuzz_write("y.safetensors", data, size);
        err[0] = '\0';
        if (safetensors_read(fuzz_path("y.safetensors"), &st, err, sizeof err) != 0)
            fuzz_expect_message("safetensors_read", err);
        safetensors_free(&st);
    }
    return 0;
}
