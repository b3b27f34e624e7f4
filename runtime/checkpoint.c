#include "runtime/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "runtime/check.h"
#include "runtime/files.h"
#include "runtime/log.h"

static const char kMagic[8] = {'T', 'R', 'A', 'I', 'N', 'C', 'K', '\n'};
static const char kEnd[8] = {'T', 'R', 'C', 'K', 'E', 'N', 'D', '\n'};
enum {
    kHeaderBytes = 16,                        /* magic, version, section count */
    kSectionHeaderBytes = CKPT_NAME_LEN + 8,  /* name, size */
    kCrcBytes = 4,
    kTrailerBytes = 12,                       /* end marker, file CRC */
};

uint32_t ckpt_crc32(uint32_t crc, const void *data, size_t n) {
    if (n == 0) return crc; /* zlib answers 0 for a NULL buffer, whatever crc is */
    return (uint32_t)crc32_z(crc, data, n);
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

static void own_add(const char *path);

/* The temporary file of the write in progress, for ckpt_remove_pending: set
 * before the flag, cleared after the rename, so a handler sees a whole path. */
static char pending_tmp[4200];
static volatile sig_atomic_t pending;

void ckpt_remove_pending(void) {
    if (pending) unlink(pending_tmp);
}

static void set_pending(const char *tmp) {
    static int fatal_hook_registered;
    if (!fatal_hook_registered) tc_on_fatal(ckpt_remove_pending);
    fatal_hook_registered = 1;
    pending = 0;
    atomic_signal_fence(memory_order_seq_cst); /* the path is whole before a handler can see the flag */
    memcpy(pending_tmp, tmp, strlen(tmp) + 1);
    atomic_signal_fence(memory_order_seq_cst);
    pending = 1;
}

static void clear_pending(const char *tmp) {
    if (pending && strcmp(pending_tmp, tmp) == 0) pending = 0;
}

/* A file of this process's pid is a leftover (of this process, or of a dead
 * one that had the same pid): it is replaced, never written through. */
static FILE *create_exclusive(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST && unlink(path) == 0) fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "wb");
    if (!f) close(fd);
    return f;
}

CkptWriter *ckpt_write_begin(const char *path, int n_sections, char *err, size_t errlen) {
    if (strlen(path) >= sizeof ((CkptWriter *)0)->path) {
        snprintf(err, errlen, "%.200s...: checkpoint path too long", path);
        return NULL;
    }
    if (n_sections < 0 || n_sections > CKPT_MAX_SECTIONS) {
        snprintf(err, errlen, "%s: %d sections, at most %d", path, n_sections, CKPT_MAX_SECTIONS);
        return NULL;
    }
    CkptWriter *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "%s: out of host memory", path);
        return NULL;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d", path, (int)getpid());
    set_pending(w->tmp); /* before the file exists: a signal at any later point finds it */
    w->f = create_exclusive(w->tmp);
    if (!w->f) {
        snprintf(err, errlen, "%s: cannot create: %s", w->tmp, strerror(errno));
        clear_pending(w->tmp);
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
    if (!name[0] || strlen(name) >= CKPT_NAME_LEN || w->n_sections >= CKPT_MAX_SECTIONS ||
        w->n_sections >= w->declared) {
        snprintf(err, errlen, "%s: section name '%s' empty or too long, or too many sections", w->path, name);
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
    } else if (files_rename_noreplace(w->tmp, w->path) != 0) {
        snprintf(err, errlen, "%s: cannot rename into place: %s", w->path,
                 errno == EEXIST ? "a file of that name exists (another run's?): not replaced" : strerror(errno));
    } else {
        fsync_dir_of(w->path);
        own_add(w->path);
        rc = 0;
    }
    if (rc != 0) unlink(w->tmp);
    clear_pending(w->tmp);
    free(w);
    return rc;
}

void ckpt_write_abort(CkptWriter *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    unlink(w->tmp);
    clear_pending(w->tmp);
    free(w);
}

/* The pid in "<prefix>*<suffix>.tmp.<pid>", or 0 when name is not one. */
static long temporary_pid(const char *name, const char *prefix, const char *suffix) {
    const char *tail = strstr(name, ".tmp.");
    size_t n_prefix = strlen(prefix), n_suffix = strlen(suffix);
    if (!tail || strncmp(name, prefix, n_prefix) != 0 || (size_t)(tail - name) < n_prefix + n_suffix ||
        strncmp(tail - n_suffix, suffix, n_suffix) != 0)
        return 0;
    const char *digits = tail + 5;
    long pid = 0;
    for (const char *p = digits; *p; p++) {
        if (*p < '0' || *p > '9' || p - digits >= 10) return 0;
        pid = pid * 10 + (*p - '0');
    }
    return pid > 0 && pid <= INT_MAX ? pid : 0;
}

/* ---- the folder's lock and this run's files ------------------------------------ */

typedef struct {
    dev_t dev;
    ino_t ino;
} FileId;

typedef struct {
    int fd;
    FileId dir;
} DirLock;

enum { MAX_DIR_LOCKS = 8 };
static DirLock dir_locks[MAX_DIR_LOCKS];
static int n_dir_locks;
static FileId *own_files; /* committed by this process, or in a folder when it took the lock */
static size_t n_own, cap_own;

static int file_id(const char *path, FileId *id) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    *id = (FileId){st.st_dev, st.st_ino};
    return 0;
}

static void own_add(const char *path) {
    FileId id;
    if (file_id(path, &id) != 0) return;
    if (n_own == cap_own) {
        size_t cap = cap_own ? 2 * cap_own : 64;
        FileId *grown = realloc(own_files, cap * sizeof *grown);
        if (!grown) return; /* then it is not deleted by the rotation: nothing is lost */
        own_files = grown, cap_own = cap;
    }
    own_files[n_own++] = id;
}

static DirLock *held_lock(const char *dir) {
    FileId id;
    if (file_id(dir, &id) != 0) return NULL;
    for (int i = 0; i < n_dir_locks; i++)
        if (dir_locks[i].dir.dev == id.dev && dir_locks[i].dir.ino == id.ino) return &dir_locks[i];
    return NULL;
}

int ckpt_dir_locked(const char *dir) { return held_lock(dir) != NULL; }

/* The holder's line in the lock file ("pid N on host H since T"), or a word when it has written none yet. */
static void lock_holder(int fd, char *out, size_t n) {
    ssize_t got = pread(fd, out, n - 1, 0);
    out[got > 0 ? got : 0] = 0;
    out[strcspn(out, "\n")] = 0;
    if (!out[0]) snprintf(out, n, "a process that has not yet written its pid");
}

int ckpt_lock_dir(const char *dir, char *err, size_t errlen) {
    char path[4200];
    if (held_lock(dir)) return 0;
    if (n_dir_locks == MAX_DIR_LOCKS) {
        snprintf(err, errlen, "%s: more than %d checkpoint folders locked by one process", dir, MAX_DIR_LOCKS);
        return -1;
    }
    if (files_make_dirs(dir) != 0) {
        snprintf(err, errlen, "%s: cannot create it: %s", dir, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_LOCK_FILE);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot write in it (%s: %s): no checkpoint could be written there", dir, path,
                 strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char holder[512];
        int saved = errno;
        lock_holder(fd, holder, sizeof holder);
        close(fd);
        if (saved == EWOULDBLOCK)
            snprintf(err, errlen, "%s is in use by another run: %s holds its lock %s (two runs on one folder "
                     "would destroy each other's checkpoints: wait for it to end, or set another "
                     "run.checkpoint_dir)", dir, holder, path);
        else
            snprintf(err, errlen, "%s: cannot lock %s: %s", dir, path, strerror(saved));
        return -1;
    }
    char host[256] = "unknown", line[512];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    int n = snprintf(line, sizeof line, "pid %ld on host %s since %ld\n", (long)getpid(), host, (long)time(NULL));
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) /* the lock holds all the same */
        log_warn("%s: cannot note this process in it: %s", path, strerror(errno));
    DirLock *l = &dir_locks[n_dir_locks++];
    l->fd = fd;
    file_id(dir, &l->dir);
    DIR *d = opendir(dir); /* the run's own files: what is there now (the run it resumes) */
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || strstr(e->d_name, ".tmp.")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        own_add(path);
    }
    if (d) closedir(d);
    return 0;
}

void ckpt_unlock_dir(const char *dir) {
    DirLock *l = held_lock(dir);
    if (!l) return;
    close(l->fd); /* drops the flock */
    *l = dir_locks[--n_dir_locks];
}

int ckpt_remove_own(const char *path) {
    FileId id;
    if (file_id(path, &id) != 0) return -1;
    for (size_t i = 0; i < n_own; i++)
        if (own_files[i].dev == id.dev && own_files[i].ino == id.ino) {
            if (unlink(path) != 0) return -1;
            own_files[i] = own_files[--n_own];
            return 0;
        }
    errno = EPERM;
    return -1;
}

/* Whether a temporary file is the one this process is writing now. */
static int being_written(const struct stat *file) {
    struct stat in_flight;
    return pending && stat(pending_tmp, &in_flight) == 0 && in_flight.st_dev == file->st_dev &&
           in_flight.st_ino == file->st_ino;
}

int ckpt_remove_stale_temporaries(const char *dir, const char *prefix, const char *suffix) {
    if (!held_lock(dir)) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid = temporary_pid(e->d_name, prefix, suffix);
        char path[4352];
        struct stat st;
        if (!pid || snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || being_written(&st)) continue;
        if (unlink(path) == 0) {
            log_warn("%s: removed: the temporary file of a checkpoint write that never finished (process %ld "
                     "was stopped in the middle of it)", path, pid);
            removed++;
        } else if (errno != ENOENT) {
            log_warn("%s: cannot remove this stale temporary checkpoint file: %s", path, strerror(errno));
        }
    }
    closedir(d);
    return removed;
}

/* ---- reading ---------------------------------------------------------------- */

typedef struct {
    char name[CKPT_NAME_LEN];
    uint64_t offset, size;
    uint32_t crc;
} Section;

struct CkptFile {
    int fd;
    char path[4096];
    uint64_t length;
    Section sections[CKPT_MAX_SECTIONS];
    uint32_t n_sections;
    unsigned char buf[1 << 16];
};

/* Whether n bytes from offset pos lie inside a file of length bytes (no overflow). */
static int fits(uint64_t pos, uint64_t n, uint64_t length) { return pos <= length && n <= length - pos; }

static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* Reads n bytes at offset; 0, or -1 with errno (EIO for a file that shrank). */
static int read_at(const CkptFile *c, uint64_t offset, void *out, size_t n) {
    unsigned char *dst = out;
    while (n > 0) {
        ssize_t got = pread(c->fd, dst, n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got == 0) errno = EIO;
            return -1;
        }
        dst += got;
        offset += (uint64_t)got;
        n -= (size_t)got;
    }
    return 0;
}

/* The CRC of n bytes at offset, read in pieces (into out as well, when not NULL). */
static int crc_at(CkptFile *c, uint64_t offset, uint64_t n, void *out, uint32_t *crc) {
    unsigned char *dst = out;
    while (n > 0) {
        size_t chunk = n < sizeof c->buf ? (size_t)n : sizeof c->buf;
        unsigned char *into = dst ? dst : c->buf;
        if (read_at(c, offset, into, chunk) != 0) return -1;
        *crc = ckpt_crc32(*crc, into, chunk);
        if (dst) dst += chunk;
        offset += chunk;
        n -= chunk;
    }
    return 0;
}

static int fail(CkptStatus *status, CkptStatus kind, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(CkptStatus *status, CkptStatus kind, char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    *status = kind;
    return -1;
}

/* Whether the file's last 12 bytes are where a whole file ends: the end marker
 * (then a file shorter than its sizes say was not cut off, a size is wrong). */
static int ends_with_end_marker(const CkptFile *c) {
    char tail[sizeof kEnd];
    return c->length >= kHeaderBytes + kTrailerBytes &&
           read_at(c, c->length - kTrailerBytes, tail, sizeof tail) == 0 && memcmp(tail, kEnd, sizeof kEnd) == 0;
}

/* The file ends before the 'need' bytes its header and sizes call for: exactly
 * that many when 'exact', else at least (sizes are in the part that is gone);
 * 'after': how many sections follow the one the file stops in. */
static int too_short(CkptFile *c, uint64_t need, int exact, uint32_t after, const char *where, CkptStatus *status,
                     char *err, size_t errlen) {
    const char *at_least = exact ? "" : "at least ";
    if (ends_with_end_marker(c))
        return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                    "%s: corrupt checkpoint: the file has %llu bytes and ends with the end marker, but by its sizes "
                    "a whole checkpoint has %s%llu (a size field in or before %s is damaged)", c->path,
                    (unsigned long long)c->length, at_least, (unsigned long long)need, where);
    char missing[96] = "";
    if (after)
        snprintf(missing, sizeof missing, "; the %u section%s after it %s missing too", (unsigned)after,
                 after > 1 ? "s" : "", after > 1 ? "are" : "is");
    return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                "%s is truncated: the file has %llu bytes, a whole checkpoint has %s%llu (it stops in %s%s; an "
                "interrupted copy or a full disk?)", c->path, (unsigned long long)c->length, at_least,
                (unsigned long long)need, where, missing);
}

/* Whether the file's last 4 bytes are the CRC of all before them, as every
 * format version ends: checked before a version newer than this trainc's is
 * believed (one flipped bit there is damage, not a newer trainc). */
static int whole_file_crc_matches(CkptFile *c) {
    uint32_t crc = 0, stored;
    return c->length >= kHeaderBytes + kCrcBytes && crc_at(c, 0, c->length - kCrcBytes, NULL, &crc) == 0 &&
           read_at(c, c->length - kCrcBytes, &stored, sizeof stored) == 0 && stored == crc;
}

/* Magic, version and section count; sets *count. */
static int check_header(CkptFile *c, uint32_t *count, CkptStatus *status, char *err, size_t errlen) {
    unsigned char head[kHeaderBytes];
    uint64_t got = c->length < sizeof head ? c->length : sizeof head;
    uint32_t version;
    if (c->length == 0)
        return fail(status, CKPT_ERR_CORRUPT, err, errlen, "%s: empty file (0 bytes), not a checkpoint", c->path);
    if (read_at(c, 0, head, (size_t)got) != 0)
        return fail(status, CKPT_ERR_IO, err, errlen, "%s: cannot read: %s", c->path, strerror(errno));
    if (memcmp(head, kMagic, got < sizeof kMagic ? got : sizeof kMagic) != 0)
        return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                    "%s: not a trainc checkpoint (it does not begin with trainc's magic bytes \"TRAINCK\")", c->path);
    if (c->length < sizeof head)
        return too_short(c, sizeof head + kTrailerBytes, 0, 0, "the header", status, err, errlen);
    memcpy(&version, head + 8, sizeof version);
    memcpy(count, head + 12, sizeof *count);
    if (version > CKPT_VERSION && !whole_file_crc_matches(c))
        return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                    "%s: corrupt checkpoint: its header reads format version %u, but the file's checksum does not "
                    "match its bytes (its header is damaged; a later trainc's file would match)", c->path,
                    (unsigned)version);
    if (version > CKPT_VERSION)
        return fail(status, CKPT_ERR_NEWER, err, errlen,
                    "%s: checkpoint format version %u, written by a newer trainc; this trainc reads version %d "
                    "(resume with the trainc that wrote it)", c->path, (unsigned)version, CKPT_VERSION);
    if (version < 1)
        return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                    "%s: corrupt checkpoint header: format version 0, which no trainc writes", c->path);
    if (*count > CKPT_MAX_SECTIONS)
        return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                    "%s: corrupt checkpoint header: %u sections, at most %d", c->path, (unsigned)*count,
                    CKPT_MAX_SECTIONS);
    return 0;
}

/* Walks the section headers, each size checked against the file's length
 * before it is used, to the end marker. Reads no section data. */
static int check_layout(CkptFile *c, CkptStatus *status, char *err, size_t errlen) {
    uint32_t count = 0;
    if (check_header(c, &count, status, err, errlen) != 0) return -1;
    uint64_t pos = kHeaderBytes;
    for (uint32_t i = 0; i < count; i++) {
        Section *s = &c->sections[i];
        uint64_t later = (uint64_t)(count - i - 1) * (kSectionHeaderBytes + kCrcBytes) + kTrailerBytes;
        char where[96];
        snprintf(where, sizeof where, "the header of section %u", (unsigned)i + 1);
        if (!fits(pos, kSectionHeaderBytes, c->length))
            return too_short(c, pos + kSectionHeaderBytes + kCrcBytes + later, 0, count - i - 1, where, status, err,
                             errlen);
        if (read_at(c, pos, s->name, CKPT_NAME_LEN) != 0 || read_at(c, pos + CKPT_NAME_LEN, &s->size, 8) != 0)
            return fail(status, CKPT_ERR_IO, err, errlen, "%s: cannot read: %s", c->path, strerror(errno));
        if (memchr(s->name, 0, CKPT_NAME_LEN) == NULL || s->name[0] == 0)
            return fail(status, CKPT_ERR_CORRUPT, err, errlen, "%s: corrupt checkpoint: section %u has no valid name",
                        c->path, (unsigned)i + 1);
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(c->sections[j].name, s->name) == 0)
                return fail(status, CKPT_ERR_CORRUPT, err, errlen, "%s: corrupt checkpoint: section '%s' twice",
                            c->path, s->name);
        pos += kSectionHeaderBytes;
        if (!fits(pos, add_sat(s->size, kCrcBytes), c->length)) {
            snprintf(where, sizeof where, "section '%.32s' of %llu bytes", s->name, (unsigned long long)s->size);
            return too_short(c, add_sat(add_sat(pos, s->size), kCrcBytes + later), i + 1 == count, count - i - 1,
                             where, status, err, errlen);
        }
        s->offset = pos;
        pos += s->size + kCrcBytes;
        if (read_at(c, pos - kCrcBytes, &s->crc, kCrcBytes) != 0)
            return fail(status, CKPT_ERR_IO, err, errlen, "%s: cannot read: %s", c->path, strerror(errno));
    }
    char end[sizeof kEnd];
    if (!fits(pos, kTrailerBytes, c->length))
        return too_short(c, pos + kTrailerBytes, 1, 0, "the end marker", status, err, errlen);
    if (read_at(c, pos, end, sizeof end) != 0)
        return fail(status, CKPT_ERR_IO, err, errlen, "%s: cannot read: %s", c->path, strerror(errno));
    if (memcmp(end, kEnd, sizeof end) != 0)
        return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                    "%s: corrupt checkpoint: no end marker at byte %llu, where its %u sections end", c->path,
                    (unsigned long long)pos, (unsigned)count);
    if (pos + kTrailerBytes != c->length)
        return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                    "%s: corrupt checkpoint: %llu bytes after its end (the file has %llu, a checkpoint ends at %llu)",
                    c->path, (unsigned long long)(c->length - pos - kTrailerBytes), (unsigned long long)c->length,
                    (unsigned long long)(pos + kTrailerBytes));
    c->n_sections = count;
    return 0;
}

/* Reads the whole file once: every section's CRC, then the file's. */
static int check_checksums(CkptFile *c, CkptStatus *status, char *err, size_t errlen) {
    uint32_t file_crc = 0, stored;
    uint64_t pos = 0;
    for (uint32_t i = 0; i < c->n_sections; i++) {
        const Section *s = &c->sections[i];
        uint32_t part = 0;
        if (crc_at(c, pos, s->offset - pos, NULL, &file_crc) != 0 || crc_at(c, s->offset, s->size, NULL, &part) != 0)
            return fail(status, CKPT_ERR_IO, err, errlen, "%s: cannot read: %s", c->path, strerror(errno));
        if (part != s->crc)
            return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                        "%s: checksum mismatch in section '%s': the file is corrupt (its bytes changed after it was "
                        "written)", c->path, s->name);
        file_crc = crc32_combine(file_crc, part, (z_off_t)s->size);
        pos = s->offset + s->size;
    }
    if (crc_at(c, pos, c->length - kCrcBytes - pos, NULL, &file_crc) != 0 ||
        read_at(c, c->length - kCrcBytes, &stored, sizeof stored) != 0)
        return fail(status, CKPT_ERR_IO, err, errlen, "%s: cannot read: %s", c->path, strerror(errno));
    if (stored != file_crc)
        return fail(status, CKPT_ERR_CORRUPT, err, errlen,
                    "%s: checksum mismatch over the whole file: the file is corrupt (its bytes changed after it was "
                    "written)", c->path);
    return 0;
}

CkptFile *ckpt_open_status(const char *path, CkptStatus *status, char *err, size_t errlen) {
    CkptStatus ignored;
    if (!status) status = &ignored;
    CkptFile *c = calloc(1, sizeof *c);
    if (!c) {
        fail(status, CKPT_ERR_IO, err, errlen, "%s: out of host memory", path);
        return NULL;
    }
    snprintf(c->path, sizeof c->path, "%s", path);
    struct stat st;
    const char *why;
    c->fd = files_open_input(path, &st, &why);
    if (c->fd < 0) {
        int not_file = errno == EISDIR || errno == EINVAL;
        fail(status, not_file ? CKPT_ERR_NOT_FILE : CKPT_ERR_IO, err, errlen, not_file ? "%s: %s, not a checkpoint file"
             : "%s: cannot open checkpoint: %s", path, why);
        goto failed;
    }
    files_note_input(path, c->fd);
    c->length = (uint64_t)st.st_size;
    if (check_layout(c, status, err, errlen) != 0 || check_checksums(c, status, err, errlen) != 0) goto failed;
    *status = CKPT_OK;
    return c;
failed:
    ckpt_close(c);
    return NULL;
}

CkptFile *ckpt_open(const char *path, char *err, size_t errlen) { return ckpt_open_status(path, NULL, err, errlen); }

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
    if (crc_at(f, s->offset, bytes, out, &crc) != 0) {
        snprintf(err, errlen, "%s: cannot read section '%s': %s", f->path, name, strerror(errno));
        return -1;
    }
    if (crc != s->crc) {
        snprintf(err, errlen, "%s: section '%s' changed on disk since it was checked", f->path, name);
        return -1;
    }
    return 0;
}

int ckpt_section_count(const CkptFile *f) { return (int)f->n_sections; }

const char *ckpt_section_name(const CkptFile *f, int i) {
    return i >= 0 && (uint32_t)i < f->n_sections ? f->sections[i].name : NULL;
}

const char *ckpt_path(const CkptFile *f) { return f->path; }

void ckpt_close(CkptFile *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f);
}
