#include "runtime/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char kMagic[8] = {'T', 'R', 'A', 'I', 'N', 'C', 'K', '\n'};
static const char kEnd[8] = {'T', 'R', 'C', 'K', 'E', 'N', 'D', '\n'};

/* ---- CRC-32, slicing by 8 ------------------------------------------------- */

static uint32_t crc_table[8][256];
static int crc_ready;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
    crc_ready = 1;
}

uint32_t ckpt_crc32(uint32_t crc, const void *data, size_t n) {
    if (!crc_ready) crc_init();
    const unsigned char *p = data;
    uint32_t c = ~crc;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

/* ---- writing ---------------------------------------------------------------- */

struct CkptWriter {
    FILE *f;
    char path[4096], tmp[4200];
    uint32_t file_crc;
    uint32_t n_sections, declared;
    char names[CKPT_MAX_SECTIONS][CKPT_NAME_LEN];
    int failed;
};

static int put(CkptWriter *w, const void *data, size_t n) {
    if (w->failed) return -1;
    if (n && fwrite(data, 1, n, w->f) != n) {
        w->failed = errno ? errno : EIO;
        return -1;
    }
    w->file_crc = ckpt_crc32(w->file_crc, data, n);
    return 0;
}

CkptWriter *ckpt_write_begin(const char *path, int n_sections, char *err, size_t errlen) {
    CkptWriter *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "%s: out of host memory", path);
        return NULL;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d", path, (int)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        snprintf(err, errlen, "%s: cannot create: %s", w->tmp, strerror(errno));
        free(w);
        return NULL;
    }
    uint32_t version = CKPT_VERSION;
    w->declared = (uint32_t)n_sections;
    put(w, kMagic, sizeof kMagic);
    put(w, &version, sizeof version);
    put(w, &w->declared, sizeof w->declared);
    return w;
}

int ckpt_write_section(CkptWriter *w, const char *name, const void *data, size_t bytes, char *err,
                       size_t errlen) {
    char padded[CKPT_NAME_LEN] = {0};
    if (strlen(name) >= CKPT_NAME_LEN || w->n_sections >= CKPT_MAX_SECTIONS || w->n_sections >= w->declared) {
        snprintf(err, errlen, "%s: section name '%s' too long or too many sections", w->path, name);
        return -1;
    }
    for (uint32_t i = 0; i < w->n_sections; i++)
        if (strcmp(w->names[i], name) == 0) {
            snprintf(err, errlen, "%s: section '%s' written twice", w->path, name);
            return -1;
        }
    memcpy(padded, name, strlen(name));
    memcpy(w->names[w->n_sections++], padded, CKPT_NAME_LEN);
    uint64_t size = bytes;
    uint32_t crc = ckpt_crc32(0, data, bytes);
    put(w, padded, sizeof padded);
    put(w, &size, sizeof size);
    put(w, data, bytes);
    if (put(w, &crc, sizeof crc) != 0) {
        snprintf(err, errlen, "%s: write failed: %s", w->tmp, strerror(w->failed));
        return -1;
    }
    return 0;
}

static void fsync_dir_of(const char *path) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int ckpt_write_commit(CkptWriter *w, char *err, size_t errlen) {
    int rc = -1;
    if (w->n_sections != w->declared && !w->failed) {
        snprintf(err, errlen, "%s: %u sections written, %u declared", w->path, (unsigned)w->n_sections,
                 (unsigned)w->declared);
        ckpt_write_abort(w);
        return -1;
    }
    put(w, kEnd, sizeof kEnd);
    uint32_t crc = w->file_crc;
    if (!w->failed && fwrite(&crc, sizeof crc, 1, w->f) != 1) w->failed = errno ? errno : EIO;
    if (!w->failed && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)) w->failed = errno ? errno : EIO;
    if (fclose(w->f) != 0 && !w->failed) w->failed = errno ? errno : EIO;
    w->f = NULL;
    if (w->failed) {
        snprintf(err, errlen, "%s: write failed: %s", w->tmp, strerror(w->failed));
    } else if (rename(w->tmp, w->path) != 0) {
        snprintf(err, errlen, "%s: cannot rename into place: %s", w->path, strerror(errno));
    } else {
        fsync_dir_of(w->path);
        rc = 0;
    }
    if (rc != 0) unlink(w->tmp);
    free(w);
    return rc;
}

void ckpt_write_abort(CkptWriter *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    unlink(w->tmp);
    free(w);
}

/* ---- reading ---------------------------------------------------------------- */

typedef struct {
    char name[CKPT_NAME_LEN];
    uint64_t offset, size;
    uint32_t crc;
} Section;

struct CkptFile {
    FILE *f;
    char path[4096];
    Section sections[CKPT_MAX_SECTIONS];
    uint32_t n_sections;
};

/* Reads n bytes at the current position into out (or only through the CRC when
 * out is NULL); -1 at end of file. */
static int take(FILE *f, void *out, uint64_t n, uint32_t *file_crc, uint32_t *part_crc) {
    static unsigned char buf[1 << 20];
    unsigned char *dst = out;
    while (n > 0) {
        size_t chunk = n < sizeof buf ? (size_t)n : sizeof buf;
        unsigned char *into = dst ? dst : buf;
        if (fread(into, 1, chunk, f) != chunk) return -1;
        if (file_crc) *file_crc = ckpt_crc32(*file_crc, into, chunk);
        if (part_crc) *part_crc = ckpt_crc32(*part_crc, into, chunk);
        if (dst) dst += chunk;
        n -= chunk;
    }
    return 0;
}

CkptFile *ckpt_open(const char *path, char *err, size_t errlen) {
    CkptFile *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "%s: out of host memory", path);
        return NULL;
    }
    snprintf(c->path, sizeof c->path, "%s", path);
    c->f = fopen(path, "rb");
    struct stat st;
    if (!c->f || fstat(fileno(c->f), &st) != 0) {
        snprintf(err, errlen, "%s: cannot open checkpoint: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t length = (uint64_t)st.st_size, pos = 0;
    uint32_t crc = 0, version = 0, count = 0;
    char magic[8];
    if (take(c->f, magic, sizeof magic, &crc, NULL) != 0 || memcmp(magic, kMagic, sizeof magic) != 0) {
        snprintf(err, errlen, "%s: not a trainc checkpoint (bad magic)", path);
        goto fail;
    }
    if (take(c->f, &version, sizeof version, &crc, NULL) != 0 || version != CKPT_VERSION) {
        snprintf(err, errlen, "%s: checkpoint format version %u, this trainc reads version %d", path,
                 (unsigned)version, CKPT_VERSION);
        goto fail;
    }
    if (take(c->f, &count, sizeof count, &crc, NULL) != 0 || count > CKPT_MAX_SECTIONS) {
        snprintf(err, errlen, "%s: corrupt checkpoint header (%u sections)", path, (unsigned)count);
        goto fail;
    }
    pos = sizeof magic + sizeof version + sizeof count;
    for (uint32_t i = 0; i < count; i++) {
        Section *s = &c->sections[i];
        uint32_t part = 0, stored;
        if (take(c->f, s->name, CKPT_NAME_LEN, &crc, NULL) != 0 ||
            take(c->f, &s->size, sizeof s->size, &crc, NULL) != 0) {
            snprintf(err, errlen, "%s: truncated (%llu bytes) in the header of section %u", path,
                     (unsigned long long)length, (unsigned)i);
            goto fail;
        }
        s->name[CKPT_NAME_LEN - 1] = 0;
        pos += CKPT_NAME_LEN + sizeof s->size;
        if (s->size > length || pos + s->size + sizeof stored > length) {
            snprintf(err, errlen, "%s: truncated: section '%s' needs %llu bytes, the file has %llu", path,
                     s->name, (unsigned long long)s->size, (unsigned long long)length);
            goto fail;
        }
        s->offset = pos;
        if (take(c->f, NULL, s->size, &crc, &part) != 0 || take(c->f, &stored, sizeof stored, &crc, NULL) != 0) {
            snprintf(err, errlen, "%s: truncated in section '%s'", path, s->name);
            goto fail;
        }
        pos += s->size + sizeof stored;
        if (part != stored) {
            snprintf(err, errlen, "%s: checksum mismatch in section '%s' (corrupt file)", path, s->name);
            goto fail;
        }
        s->crc = stored;
    }
    c->n_sections = count;
    char end[8];
    uint32_t stored_crc;
    if (take(c->f, end, sizeof end, &crc, NULL) != 0 || take(c->f, &stored_crc, sizeof stored_crc, NULL, NULL) != 0) {
        snprintf(err, errlen, "%s: truncated (%llu bytes): no end marker", path, (unsigned long long)length);
        goto fail;
    }
    if (memcmp(end, kEnd, sizeof end) != 0) {
        snprintf(err, errlen, "%s: corrupt checkpoint: bad end marker", path);
        goto fail;
    }
    if (stored_crc != crc) {
        snprintf(err, errlen, "%s: checksum mismatch (corrupt file)", path);
        goto fail;
    }
    if (pos + sizeof end + sizeof stored_crc != length) {
        snprintf(err, errlen, "%s: %llu bytes of trailing garbage", path,
                 (unsigned long long)(length - pos - sizeof end - sizeof stored_crc));
        goto fail;
    }
    return c;
fail:
    ckpt_close(c);
    return NULL;
}

static const Section *find(const CkptFile *f, const char *name) {
    for (uint32_t i = 0; i < f->n_sections; i++)
        if (strcmp(f->sections[i].name, name) == 0) return &f->sections[i];
    return NULL;
}

int64_t ckpt_section_size(const CkptFile *f, const char *name) {
    const Section *s = find(f, name);
    return s ? (int64_t)s->size : -1;
}

int ckpt_read_section(CkptFile *f, const char *name, void *out, size_t bytes, char *err, size_t errlen) {
    const Section *s = find(f, name);
    if (!s) {
        snprintf(err, errlen, "%s: no section '%s'", f->path, name);
        return -1;
    }
    if (s->size != bytes) {
        snprintf(err, errlen, "%s: section '%s' holds %llu bytes, %zu expected", f->path, name,
                 (unsigned long long)s->size, bytes);
        return -1;
    }
    uint32_t crc = 0;
    if (fseeko(f->f, (off_t)s->offset, SEEK_SET) != 0 || take(f->f, out, bytes, NULL, &crc) != 0) {
        snprintf(err, errlen, "%s: cannot read section '%s': %s", f->path, name, strerror(errno));
        return -1;
    }
    if (crc != s->crc) {
        snprintf(err, errlen, "%s: section '%s' changed on disk since it was checked", f->path, name);
        return -1;
    }
    return 0;
}

const char *ckpt_path(const CkptFile *f) { return f->path; }

void ckpt_close(CkptFile *f) {
    if (!f) return;
    if (f->f) fclose(f->f);
    free(f);
}
