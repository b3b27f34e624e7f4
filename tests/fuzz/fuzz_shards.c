/* The WebDataset shard reader on one shard: the input is the bytes of
 * root/train-000000.tar. On success the index must be consistent (every
 * sample's bytes inside the shard, labels within the classes), and every
 * sample must read back and either decode or fail with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/decode.h"
#include "data/source.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_scratch_reset();
    fuzz_mkdir("root");
    fuzz_write("root/train-000000.tar", data, size);
    Source s;
    char err[4600] = "";
    if (source_open_shards(&s, fuzz_path("root"), "train", 0, err, sizeof err) != 0) {
        fuzz_expect_message("source_open_shards", err);
        return 0;
    }
    if (s.n < 1 || s.num_classes < 1 || s.n_shards != 1)
        fuzz_fail("source_open_shards succeeded with %d samples, %d classes, %d shards", s.n, s.num_classes,
                  s.n_shards);
    SourceReader r;
    source_reader_init(&r);
    DecodeBuffers db = {0};
    for (int i = 0; i < s.n; i++) {
        if (s.labels[i] < 0 || s.labels[i] >= s.num_classes)
            fuzz_fail("sample %d has label %d of %d classes", i, s.labels[i], s.num_classes);
        if (s.offset[i] < 0 || s.size[i] < 0 || (size_t)(s.offset[i] + s.size[i]) > size)
            fuzz_fail("sample %d: bytes [%lld, +%lld) outside the %zu-byte shard", i, (long long)s.offset[i],
                      (long long)s.size[i], size);
        const uint8_t *bytes;
        size_t len;
        if (source_read(&s, i, &r, &bytes, &len, err, sizeof err) != 0) {
            fuzz_expect_message("source_read", err);
            continue;
        }
        if (len != (size_t)s.size[i] || memcmp(bytes, data + s.offset[i], len) != 0)
            fuzz_fail("sample %d read back other bytes than the shard holds", i);
        ImageInfo info;
        DecodedImage image;
        char name[4400];
        source_sample_name(&s, i, name, sizeof name);
        if (image_probe(bytes, len, name, &info, err, sizeof err) != 0 || (long long)info.w * info.h > (1 << 20)) {
            continue; /* big images cost what they cost */
        }
        if (image_decode(bytes, len, name, NULL, &db, &image, err, sizeof err) != 0)
            fuzz_expect_message("image_decode", err);
    }
    decode_buffers_free(&db);
    source_reader_close(&r);
    source_free(&s);
    return 0;
}
