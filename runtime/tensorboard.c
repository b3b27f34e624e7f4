/* TensorBoard event files: TFRecord framing and a minimal protobuf encoder for
 * Event/Summary scalars (see runtime/tensorboard.h). */
#include "runtime/tensorboard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "runtime/files.h"

struct TbWriter {
    FILE *f;
    char path[4352];
};

/* ---- CRC-32C ----------------------------------------------------------------
 * TFRecord checksums with CRC-32C (Castagnoli, reflected polynomial 0x82F63B78),
 * not zlib's CRC-32, and Debian 12 packages no C library for it: a byte-wise
 * table, built once. Event files are a few records per log point, so speed
 * does not matter here. */
static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t tb_crc32c(const void *data, size_t n) {
    if (!crc_table[1]) crc_table_init(); /* entry 1 is never 0 once built */
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t tb_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- protobuf: just the wire types an Event of scalars needs --------------- */

typedef struct {
    unsigned char b[1024];
    size_t n;
} PbBuf;

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

static void pb_varint(PbBuf *p, uint64_t v) {
    while (v >= 0x80) {
        p->b[p->n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p->b[p->n++] = (unsigned char)v;
}

static void pb_key(PbBuf *p, int field, int wire) { pb_varint(p, (uint64_t)(field << 3 | wire)); }

static void pb_le(PbBuf *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p->b[p->n++] = (unsigned char)(v >> (8 * i));
}

static void pb_bytes(PbBuf *p, int field, const void *data, size_t n) {
    pb_key(p, field, WIRE_BYTES);
    pb_varint(p, n);
    memcpy(p->b + p->n, data, n);
    p->n += n;
}

static void pb_double(PbBuf *p, int field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    pb_key(p, field, WIRE_FIXED64);
    pb_le(p, bits, 8);
}

static void pb_float(PbBuf *p, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    pb_key(p, field, WIRE_FIXED32);
    pb_le(p, bits, 4);
}

/* Event.wall_time and Event.step, the start of every event. */
static void event_head(PbBuf *e, int64_t step) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    pb_double(e, 1, tv.tv_sec + tv.tv_usec * 1e-6);
    pb_key(e, 2, WIRE_VARINT);
    pb_varint(e, (uint64_t)step);
}

/* ---- TFRecord framing -------------------------------------------------------- */

static int write_record(TbWriter *w, const PbBuf *data) {
    unsigned char head[12];
    uint64_t len = data->n;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
    uint32_t len_crc = tb_mask_crc(tb_crc32c(head, 8));
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(len_crc >> (8 * i));
    unsigned char tail[4];
    uint32_t data_crc = tb_mask_crc(tb_crc32c(data->b, data->n));
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(data_crc >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(data->b, 1, data->n, w->f) != data->n ||
        fwrite(tail, 1, 4, w->f) != 4)
        return -1;
    return 0;
}

/* ---- the writer ------------------------------------------------------------------ */

TbWriter *tb_open(const char *dir, int rank, char *err, size_t errlen) {
    if (files_make_dirs(dir) != 0) {
        snprintf(err, errlen, "cannot create the directory %s: %s", dir, strerror(errno));
        return NULL;
    }
    TbWriter *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    int n = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s", dir, (long long)time(NULL), host);
    if (rank >= 0) snprintf(w->path + n, sizeof w->path - n, ".%d", rank);
    char why[4400];
    w->f = files_open_output(w->path, 1, why, sizeof why);
    if (!w->f) {
        snprintf(err, errlen, "%s: %s", w->path, why);
        free(w);
        return NULL;
    }
    PbBuf e = {.n = 0};
    event_head(&e, 0);
    pb_bytes(&e, 3, "brain.Event:2", strlen("brain.Event:2"));
    if (write_record(w, &e) != 0 || fflush(w->f) != 0) {
        snprintf(err, errlen, "cannot write %s: %s", w->path, strerror(errno));
        fclose(w->f);
        free(w);
        return NULL;
    }
    return w;
}

int tb_scalar(TbWriter *w, const char *tag, int64_t step, float value) {
    size_t tag_len = strlen(tag);
    if (tag_len > 256) tag_len = 256; /* the event stays well inside PbBuf */
    PbBuf val = {.n = 0}, sum = {.n = 0}, e = {.n = 0};
    pb_bytes(&val, 1, tag, tag_len);
    pb_float(&val, 2, value);
    pb_bytes(&sum, 1, val.b, val.n);
    event_head(&e, step);
    pb_bytes(&e, 5, sum.b, sum.n);
    return write_record(w, &e);
}

int tb_flush(TbWriter *w) { return fflush(w->f) == 0 ? 0 : -1; }

int tb_close(TbWriter *w) {
    if (!w) return 0;
    int rc = fflush(w->f);
    if (fclose(w->f) != 0) rc = -1;
    free(w);
    return rc == 0 ? 0 : -1;
}

const char *tb_path(const TbWriter *w) { return w->path; }
