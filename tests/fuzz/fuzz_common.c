#include "tests/fuzz/fuzz_common.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char scratch[PATH_MAX];

int fuzz_split(const uint8_t *data, size_t size, FuzzPart *parts, int max_parts) {
    int n = 0;
    size_t start = 0;
    for (size_t i = 0; n < max_parts - 1 && i + FUZZ_SEP_LEN <= size; i++) {
        if (memcmp(data + i, FUZZ_SEP, FUZZ_SEP_LEN) != 0) continue;
        parts[n++] = (FuzzPart){data + start, i - start};
        i += FUZZ_SEP_LEN - 1;
        start = i + 1;
    }
    parts[n++] = (FuzzPart){data + start, size - start};
    return n;
}

void fuzz_fail(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "fuzz: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void fuzz_expect_message(const char *reader, const char *err) {
    if (!err[0]) fuzz_fail("%s failed without a message", reader);
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s: %s\n", reader, err);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    /* The scratch folder itself stays; everything under it goes. */
    if (ftw->level > 0 && remove(path) != 0) fuzz_fail("cannot remove %s: %s", path, strerror(errno));
    return 0;
}

static void remove_scratch(void) {
    if (!scratch[0]) return;
    nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    rmdir(scratch);
}

const char *fuzz_scratch_reset(void) {
    if (!scratch[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(scratch, sizeof scratch, "%s/trainc-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(scratch)) fuzz_fail("cannot make a scratch folder %s: %s", scratch, strerror(errno));
        atexit(remove_scratch);
    } else if (nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        fuzz_fail("cannot empty %s: %s", scratch, strerror(errno));
    }
    return scratch;
}

const char *fuzz_path(const char *rel) {
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", scratch, rel);
    return path;
}

void fuzz_mkdir(const char *rel) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", fuzz_path(rel));
    for (char *slash = path + strlen(scratch) + 1; (slash = strchr(slash, '/')); slash++) {
        *slash = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) fuzz_fail("mkdir %s: %s", path, strerror(errno));
        *slash = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) fuzz_fail("mkdir %s: %s", path, strerror(errno));
}

void fuzz_write(const char *rel, const void *data, size_t n) {
    const char *slash = strrchr(rel, '/');
    if (slash) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - rel), rel);
        fuzz_mkdir(dir);
    }
    const char *path = fuzz_path(rel);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0)
        fuzz_fail("cannot write %s: %s", path, strerror(errno));
}
