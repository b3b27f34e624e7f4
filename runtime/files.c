/* Small file-system helpers and the outputs' one way to disk (files.h). */
#include "runtime/files.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/checkpoint.h"

int files_make_dirs(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p) continue;
        char was = *p;
        *p = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
        *p = was;
        if (!was) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* ---- inputs ------------------------------------------------------------------ */

typedef struct {
    dev_t dev;
    ino_t ino;
    char *path;
} Input;

static pthread_mutex_t inputs_lock = PTHREAD_MUTEX_INITIALIZER;
static Input *inputs;
static int n_inputs, cap_inputs;

void files_note_input(const char *path, int fd) {
    struct stat st;
    if ((fd >= 0 ? fstat(fd, &st) : stat(path, &st)) != 0 || !S_ISREG(st.st_mode)) return;
    pthread_mutex_lock(&inputs_lock);
    int known = 0;
    for (int i = 0; i < n_inputs && !known; i++) known = inputs[i].dev == st.st_dev && inputs[i].ino == st.st_ino;
    if (!known && n_inputs == cap_inputs) {
        int cap = cap_inputs ? 2 * cap_inputs : 16;
        Input *grown = realloc(inputs, (size_t)cap * sizeof *grown);
        if (grown) inputs = grown, cap_inputs = cap;
    }
    char *copy = known || n_inputs == cap_inputs ? NULL : strdup(path);
    if (copy) inputs[n_inputs++] = (Input){st.st_dev, st.st_ino, copy};
    pthread_mutex_unlock(&inputs_lock);
}

int files_open_input(const char *path, struct stat *st, const char **why) {
    struct stat own;
    if (!st) st = &own;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block: it is refused below */
    if (fd < 0 || fstat(fd, st) != 0) {
        *why = strerror(errno);
        if (fd >= 0) {
            int saved = errno;
            close(fd);
            errno = saved;
        }
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        static const char *const kinds[] = {"it is a directory", "it is a FIFO, not a regular file",
                                            "it is a character device, not a regular file",
                                            "it is a block device, not a regular file",
                                            "it is a socket, not a regular file", "it is not a regular file"};
        int k = S_ISDIR(st->st_mode) ? 0 : S_ISFIFO(st->st_mode) ? 1 : S_ISCHR(st->st_mode) ? 2
              : S_ISBLK(st->st_mode) ? 3 : S_ISSOCK(st->st_mode) ? 4 : 5;
        *why = kinds[k];
        close(fd);
        errno = k == 0 ? EISDIR : EINVAL;
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

void files_forget_inputs(void) {
    pthread_mutex_lock(&inputs_lock);
    for (int i = 0; i < n_inputs; i++) free(inputs[i].path);
    free(inputs);
    inputs = NULL;
    n_inputs = cap_inputs = 0;
    pthread_mutex_unlock(&inputs_lock);
}

/* ---- the checks ---------------------------------------------------------------- */

static int refuse(char *err, size_t errlen, int errnum, const char *fmt, const char *arg) {
    snprintf(err, errlen, fmt, arg);
    errno = errnum;
    return -1;
}

const char *files_kind_name(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device"
         : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* An existing regular file (st, open as fd when fd >= 0) may be written over:
 * not an input of this command, not a trainc checkpoint. */
static int check_regular(const struct stat *st, int fd, char *err, size_t errlen) {
    char input[4200] = "";
    pthread_mutex_lock(&inputs_lock);
    for (int i = 0; i < n_inputs && !input[0]; i++)
        if (inputs[i].dev == st->st_dev && inputs[i].ino == st->st_ino)
            snprintf(input, sizeof input, "%s", inputs[i].path);
    pthread_mutex_unlock(&inputs_lock);
    if (input[0])
        return refuse(err, errlen, EEXIST, "it is %s, which this command reads: trainc never writes an output over "
                      "an input (name another file)", input);
    char head[8]; /* a file that cannot be read (fd < 0) is not known to be a checkpoint */
    if (fd >= 0 && pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head && memcmp(head, CKPT_MAGIC, 8) == 0)
        return refuse(err, errlen, EEXIST, "%s", "it holds a trainc checkpoint, which trainc never writes over "
                      "(name another file)");
    return 0;
}

/* Where path leads: path itself, or the file its symlink (chain) names, which
 * need not exist yet. */
static int resolve_target(const char *path, char *target, size_t n) {
    char *real = realpath(path, NULL);
    if (real) {
        int fits = snprintf(target, n, "%s", real) < (int)n;
        free(real);
        return fits ? 0 : -1;
    }
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) /* missing: the path itself */
        return snprintf(target, n, "%s", path) < (int)n ? 0 : -1;
    char link[4096], dir[4096];
    ssize_t len = readlink(path, link, sizeof link - 1);
    if (len < 0) return -1;
    link[len] = 0;
    snprintf(dir, sizeof dir, "%s", path);
    if (link[0] == '/') return snprintf(target, n, "%s", link) < (int)n ? 0 : -1;
    return snprintf(target, n, "%s/%s", dirname(dir), link) < (int)n ? 0 : -1; /* a link to a file to come */
}

int files_check_output(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (!path[0]) return refuse(err, errlen, ENOENT, "%s", "an empty path");
    if (stat(path, &st) != 0) return 0; /* a new file */
    if (S_ISDIR(st.st_mode)) return refuse(err, errlen, EISDIR, "cannot open it for writing: %s", strerror(EISDIR));
    if (S_ISBLK(st.st_mode) || S_ISSOCK(st.st_mode))
        return refuse(err, errlen, EINVAL, "it is %s, not a file trainc writes", files_kind_name(st.st_mode));
    if (!S_ISREG(st.st_mode)) return 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    int rc = check_regular(&st, fd, err, errlen);
    if (fd >= 0) close(fd);
    return rc;
}

/* ---- stream outputs --------------------------------------------------------------- */

/* A FIFO or character device, written through; a FIFO no one reads is refused
 * rather than waited on. */
static int open_special(const char *path, mode_t mode, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC | (S_ISFIFO(mode) ? O_NONBLOCK : 0));
    if (fd < 0 && errno == ENXIO)
        return refuse(err, errlen, ENXIO, "%s", "it is a FIFO that no process reads (trainc writes through a FIFO "
                      "only to a reader that is there)");
    if (fd < 0) return refuse(err, errlen, errno, "cannot open it for writing: %s", strerror(errno));
    if (S_ISFIFO(mode)) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

FILE *files_open_output(const char *path, int append, char *err, size_t errlen) {
    const char *verb = append ? "appending" : "writing";
    for (int tries = 0; tries < 2; tries++) {
        struct stat st;
        int fd;
        if (!path[0]) {
            refuse(err, errlen, ENOENT, "%s", "an empty path");
            return NULL;
        }
        if (stat(path, &st) != 0) {
            if (errno != ENOENT) break;
            fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | (append ? O_APPEND : 0), 0666);
            if (fd < 0 && errno == EEXIST) continue; /* it appeared: checked from the start */
        } else if (S_ISREG(st.st_mode)) {
            fd = open(path, O_RDWR | O_CLOEXEC | (append ? O_APPEND : 0));
            if (fd < 0 && errno == EACCES) fd = open(path, O_WRONLY | O_CLOEXEC | (append ? O_APPEND : 0));
            if (fd >= 0 && (fstat(fd, &st) != 0 || check_regular(&st, fd, err, errlen) != 0 ||
                            (!append && ftruncate(fd, 0) != 0))) {
                int saved = errno;
                if (saved != EEXIST) snprintf(err, errlen, "cannot open it for %s: %s", verb, strerror(saved));
                close(fd);
                errno = saved;
                return NULL;
            }
        } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
            fd = open_special(path, st.st_mode, err, errlen);
            if (fd < 0) return NULL;
        } else if (S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "cannot open it for %s: %s", verb, strerror(EISDIR));
            errno = EISDIR;
            return NULL;
        } else {
            refuse(err, errlen, EINVAL, "it is %s, not a file trainc writes", files_kind_name(st.st_mode));
            return NULL;
        }
        if (fd < 0) break;
        FILE *f = fdopen(fd, append ? "a" : "w");
        if (!f) close(fd);
        if (f) return f;
        break;
    }
    snprintf(err, errlen, "cannot open it for %s: %s", verb, strerror(errno));
    return NULL;
}

/* ---- whole-file outputs ------------------------------------------------------------ */

/* The target as it is now: 0 when it may be (re)placed, setting *exists. */
static int check_whole_target(const char *target, int (*ours)(int fd), int *exists, char *err, size_t errlen) {
    struct stat st;
    *exists = stat(target, &st) == 0;
    if (!*exists) return 0;
    if (!S_ISREG(st.st_mode))
        return refuse(err, errlen, EEXIST, "it is %s: trainc writes this output only as a regular file",
                      files_kind_name(st.st_mode));
    int fd = open(target, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    int rc = check_regular(&st, fd, err, errlen);
    if (rc == 0 && (fd < 0 || !ours || !ours(fd)))
        rc = refuse(err, errlen, EEXIST, "%s", "it exists and is not a file of the kind trainc writes here: "
                    "trainc never replaces a file it did not make (remove it, or name another)");
    if (fd >= 0) close(fd);
    return rc;
}

int files_whole_begin(FilesWhole *w, const char *path, int (*ours)(int fd), char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    if (!path[0]) return refuse(err, errlen, ENOENT, "%s", "an empty path");
    if (resolve_target(path, w->target, sizeof w->target) != 0)
        return refuse(err, errlen, ENAMETOOLONG, "%s", "cannot follow its symlink (or the path is too long)");
    if (check_whole_target(w->target, ours, &w->replaces, err, errlen) != 0) return -1;
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", w->target, (long)getpid());
    int fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "cannot write it (cannot create %s: %s)", w->tmp, strerror(errno));
        return -1;
    }
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        close(fd);
        unlink(w->tmp);
        snprintf(err, errlen, "cannot write %s: %s", w->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int files_whole_commit(FilesWhole *w, int (*ours)(int fd), char *err, size_t errlen) {
    int ok = !ferror(w->f) && fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
    int saved = errno;
    ok = fclose(w->f) == 0 && ok;
    w->f = NULL;
    if (!ok) {
        snprintf(err, errlen, "cannot write it: %s", strerror(saved ? saved : errno));
        unlink(w->tmp);
        return -1;
    }
    int exists;
    if (check_whole_target(w->target, ours, &exists, err, errlen) != 0) {
        unlink(w->tmp);
        return -1;
    }
    /* A file that appeared since the start is not replaced; one checked (twice) is. */
    ok = exists && w->replaces ? rename(w->tmp, w->target) == 0 : files_rename_noreplace(w->tmp, w->target) == 0;
    if (!ok) {
        snprintf(err, errlen, "cannot rename it into place: %s", strerror(errno));
        unlink(w->tmp);
        return -1;
    }
    return 0;
}

void files_whole_abort(FilesWhole *w) {
    if (!w->f) return;
    fclose(w->f);
    w->f = NULL;
    unlink(w->tmp);
}

int files_rename_noreplace(const char *from, const char *to) {
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    if (link(from, to) == 0) return unlink(from) == 0 || errno == ENOENT ? 0 : -1;
    if (errno != EPERM && errno != EOPNOTSUPP && errno != ENOSYS) return -1;
    /* No hard links either (FAT, some FUSE): a check, then rename. */
    if (access(to, F_OK) == 0) {
        errno = EEXIST;
        return -1;
    }
    return rename(from, to);
}
