#include "runtime/ini.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/check.h"
#include "runtime/files.h"

char *ini_trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1])) end--;
    *end = '\0';
    return s;
}

char *ini_find_comment(char *s) {
    for (char *p = s; *p; p++)
        if ((*p == '#' || *p == ';') && (p == s || isspace((unsigned char)p[-1]))) return p;
    return NULL;
}

char *ini_read_file(const char *path, size_t *len, const char **why) {
    struct stat st;
    int fd = files_open_input(path, &st, why);
    if (fd < 0) return NULL;
    files_note_input(path, fd);
    if (st.st_size > INI_MAX_BYTES) {
        *why = "larger than 16 MiB, too large for a config";
        close(fd);
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) TC_FATAL("ini: out of memory reading %s", path);
    for (ssize_t got = 1; got > 0 && n + 1 < cap; n += (size_t)got) {
        got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) got = 0;
        else if (got < 0) {
            *why = strerror(errno);
            free(buf);
            close(fd);
            return NULL;
        }
        if (got == 0) break;
    }
    close(fd);
    buf[n] = '\0';
    *len = n;
    return buf;
}

void ini_begin(IniLexer *lx, const char *path, char *text, size_t len) {
    /* A byte-order mark, as some Windows editors write, is not part of the first line. */
    size_t bom = len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
    *lx = (IniLexer){.path = path, .next = text + bom, .end = text + len};
}

static int lex_fail(const IniLexer *lx, char **err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int lex_fail(const IniLexer *lx, char **err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *what = NULL;
    if (vasprintf(&what, fmt, ap) < 0) TC_FATAL("ini: out of memory");
    va_end(ap);
    if (asprintf(err, "%s:%d: %s", lx->path, lx->line, what) < 0) TC_FATAL("ini: out of memory");
    free(what);
    return -1;
}

static int lex_section(const IniLexer *lx, char *line, IniItem *item, char **err) {
    char *close = strchr(line, ']');
    if (!close) return lex_fail(lx, err, "unterminated section header '%s' (no ']')", line);
    *close = '\0';
    char *rest = ini_trim(close + 1);
    char *section = ini_trim(line + 1);
    if (*rest && *rest != '#' && *rest != ';')
        return lex_fail(lx, err, "malformed line: '%s' after [%s]", rest, section);
    if (!*section) return lex_fail(lx, err, "empty section name '[]'");
    *item = (IniItem){.kind = INI_SECTION, .line = lx->line, .name = section};
    return 1;
}

static int lex_line(const IniLexer *lx, char *line, IniItem *item, char **err) {
    if (*line == '[') return lex_section(lx, line, item, err);
    char *eq = strchr(line, '=');
    /* A key is one word: "maxpool 3 stride=2" is a line of its own, its '=' an argument's. */
    for (char *p = line; eq && p < eq; p++)
        if (isspace((unsigned char)*p) && !isspace((unsigned char)p[1]) && p + 1 < eq) eq = NULL;
    char *comment = ini_find_comment(eq ? eq + 1 : line);
    if (comment) *comment = '\0';
    if (!eq) {
        *item = (IniItem){.kind = INI_BARE, .line = lx->line, .name = ini_trim(line)};
        return 1;
    }
    *eq = '\0';
    char *key = ini_trim(line);
    if (!*key) return lex_fail(lx, err, "malformed line: no key before '='");
    *item = (IniItem){.kind = INI_PAIR, .line = lx->line, .name = key, .value = ini_trim(eq + 1)};
    return 1;
}

int ini_next(IniLexer *lx, IniItem *item, char **err) {
    while (lx->next < lx->end) {
        char *raw = lx->next;
        char *newline = memchr(raw, '\n', (size_t)(lx->end - raw));
        char *raw_end = newline ? newline : lx->end;
        *raw_end = '\0';
        lx->next = raw_end + 1;
        lx->line++;
        if (strlen(raw) != (size_t)(raw_end - raw)) return lex_fail(lx, err, "malformed line: contains a NUL byte");
        char *line = ini_trim(raw);
        if (*line == '\0' || *line == '#' || *line == ';') continue;
        return lex_line(lx, line, item, err);
    }
    return 0;
}
