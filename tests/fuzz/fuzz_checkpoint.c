/* The checkpoint reader: ckpt_open's verification, then every section read.
 *
 * Input: the file's bytes. When ckpt_open accepts them the file must be what
 * runtime/checkpoint.h lays out, so this walks the layout itself and checks
 * that every section reads back as the bytes the file holds, and that asking
 * for the wrong size fails with a message. */
#include <stdlib.h>
#include <string.h>

#include "runtime/checkpoint.h"
#include "tests/fuzz/fuzz_common.h"

#define HEADER_BYTES 16 /* magic, version, section count */

static uint64_t read_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void expect_section(CkptFile *f, const uint8_t *data, size_t size, size_t *pos) {
    if (*pos + CKPT_NAME_LEN + 8 > size) fuzz_fail("accepted file ends in a section header");
    char name[CKPT_NAME_LEN];
    memcpy(name, data + *pos, CKPT_NAME_LEN);
    name[CKPT_NAME_LEN - 1] = '\0';
    uint64_t bytes = read_u64(data + *pos + CKPT_NAME_LEN);
    *pos += CKPT_NAME_LEN + 8;
    if (bytes > size - *pos) fuzz_fail("accepted section '%s' of %llu bytes runs past the file", name,
                                       (unsigned long long)bytes);
    const uint8_t *content = data + *pos;
    *pos += bytes + 4;
    /* With two sections of one name, the reader finds the first. */
    if (ckpt_section_size(f, name) != (int64_t)bytes) return;
    uint8_t *out = malloc(bytes + 1);
    char err[8192] = "";
    if (ckpt_read_section(f, name, out, bytes, err, sizeof err) != 0)
        fuzz_fail("cannot read accepted section '%s': %s", name, err);
    if (bytes && memcmp(out, content, bytes) != 0) fuzz_fail("section '%s' reads back different bytes", name);
    err[0] = '\0';
    if (ckpt_read_section(f, name, out, bytes + 1, err, sizeof err) == 0)
        fuzz_fail("section '%s' of %llu bytes read as %llu", name, (unsigned long long)bytes,
                  (unsigned long long)bytes + 1);
    fuzz_expect_message("ckpt_read_section", err);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_scratch_reset();
    fuzz_write("x.trc", data, size);
    char err[8192] = "";
    CkptFile *f = ckpt_open(fuzz_path("x.trc"), err, sizeof err);
    if (!f) {
        fuzz_expect_message("ckpt_open", err);
        return 0;
    }
    if (size < HEADER_BYTES) fuzz_fail("ckpt_open accepted %zu bytes", size);
    uint32_t count;
    memcpy(&count, data + 12, sizeof count);
    if (ckpt_section_count(f) != (int)count || ckpt_section_name(f, (int)count) || ckpt_section_name(f, -1))
        fuzz_fail("%d sections listed, the header says %u", ckpt_section_count(f), (unsigned)count);
    size_t pos = HEADER_BYTES;
    for (uint32_t i = 0; i < count; i++) {
        if (strncmp(ckpt_section_name(f, (int)i), (const char *)data + pos, CKPT_NAME_LEN) != 0)
            fuzz_fail("section %u listed under another name", (unsigned)i);
        expect_section(f, data, size, &pos);
    }
    err[0] = '\0';
    if (ckpt_read_section(f, "no such section", NULL, 0, err, sizeof err) == 0)
        fuzz_fail("a missing section reads");
    fuzz_expect_message("ckpt_read_section", err);
    ckpt_close(f);
    return 0;
}
