/* The INI reader with includes and --set, on trainc's own schema.
 *
 * Input: up to four parts split by FUZZ_SEP: a.ini (loaded), b.ini,
 * sub/c.ini (reachable through include lines) and --set assignments, one a
 * line; an input whose includes could leave the scratch folder is left out.
 * Besides sanitizer findings it checks the reader's promises: an error comes
 * with a message, a failed load or --set leaves the config as it was, and
 * config_print's output loads back to the same values. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config.h"
#include "tests/fuzz/fuzz_common.h"
#include "tools/trainer/keys.h"

#define MAX_SETS 4

/* config_print's text, malloc'ed. */
static char *printed(const Config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) fuzz_fail("open_memstream failed");
    config_print(c, f);
    fclose(f);
    return text;
}

static void expect_unchanged(const char *before, const Config *c, const char *what, const char *err) {
    char *after = printed(c);
    if (strcmp(before, after) != 0)
        fuzz_fail("a failed %s (%s) changed the config:\n--- before\n%s--- after\n%s", what, err, before,
                  after);
    free(after);
}

static int same_value(const Config *a, const Config *b, const CfgKeySpec *spec) {
    switch (spec->type) {
    case CFG_INT: return config_int(a, spec->key) == config_int(b, spec->key);
    case CFG_FLOAT:
    case CFG_FLOAT32: return config_float(a, spec->key) == config_float(b, spec->key);
    case CFG_BOOL: return config_bool(a, spec->key) == config_bool(b, spec->key);
    case CFG_STRING:
    case CFG_ENUM: return strcmp(config_str(a, spec->key), config_str(b, spec->key)) == 0;
    }
    return 0;
}

static void expect_print_round_trip(const Config *c) {
    char *text = printed(c);
    fuzz_write("printed.ini", text, strlen(text));
    Config *again = config_new(trainc_keys, trainc_n_keys);
    char err[1024] = "";
    if (config_load_file(again, fuzz_path("printed.ini"), err, sizeof err) != 0)
        fuzz_fail("config_print's output does not load: %s\n%s", err, text);
    for (int k = 0; k < trainc_n_keys; k++)
        if (!same_value(c, again, &trainc_keys[k]))
            fuzz_fail("%s differs after config_print and loading it back\n%s", trainc_keys[k].key, text);
    config_free(again);
    free(text);
}

static void apply_sets(Config *c, FuzzPart part) {
    char *lines = malloc(part.size + 1);
    memcpy(lines, part.data, part.size);
    lines[part.size] = '\0';
    char *save = NULL;
    char *line = strtok_r(lines, "\n", &save);
    for (int n = 0; line && n < MAX_SETS; n++, line = strtok_r(NULL, "\n", &save)) {
        char err[1024] = "";
        char *before = printed(c);
        if (config_set(c, line, err, sizeof err) != 0) {
            fuzz_expect_message("config_set", err);
            expect_unchanged(before, c, "config_set", err);
        }
        free(before);
    }
    free(lines);
}

/* Whether the path (as written after '=') is absolute or climbs above the
 * scratch folder from a file 'depth' folders below it. */
static int leaves_scratch(const char *path, size_t len, int depth) {
    while (len && isspace((unsigned char)*path)) path++, len--; /* as the reader trims it */
    if (len && *path == '/') return 1;
    for (size_t i = 0; i < len;) {
        size_t n = 0;
        while (i + n < len && path[i + n] != '/') n++;
        int dot = n == 1 && path[i] == '.', dot_dot = n == 2 && path[i] == '.' && path[i + 1] == '.';
        if (dot_dot && --depth < 0) return 1;
        if (n && !dot && !dot_dot) depth++;
        i += n + 1;
    }
    return 0;
}

/* Whether a line of the part could include a file outside the scratch folder
 * (the host's files, /dev/zero or /dev/stdin): such inputs are left out. The
 * test is wider than the reader's include syntax, never narrower. */
static int includes_outside(FuzzPart part, int depth) {
    const char *text = (const char *)part.data;
    for (size_t start = 0; start < part.size;) {
        const char *line = text + start;
        const char *newline = memchr(line, '\n', part.size - start);
        size_t len = newline ? (size_t)(newline - line) : part.size - start;
        const char *eq = memchr(line, '=', len);
        if (eq && memmem(line, (size_t)(eq - line), "include", 7) &&
            leaves_scratch(eq + 1, len - (size_t)(eq + 1 - line), depth))
            return 1;
        start += len + 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *files[] = {"a.ini", "b.ini", "sub/c.ini"};
    static const int depths[] = {0, 0, 1};
    FuzzPart parts[4];
    int n = fuzz_split(data, size, parts, 4);
    for (int i = 0; i < n && i < 3; i++)
        if (includes_outside(parts[i], depths[i])) return -1;
    fuzz_scratch_reset();
    for (int i = 0; i < n && i < 3; i++) fuzz_write(files[i], parts[i].data, parts[i].size);

    Config *c = config_new(trainc_keys, trainc_n_keys);
    static char *defaults; /* config_print of a new config: the same every time */
    if (!defaults) defaults = printed(c);
    char err[1024] = "";
    if (config_load_file(c, fuzz_path("a.ini"), err, sizeof err) != 0) {
        fuzz_expect_message("config_load_file", err);
        expect_unchanged(defaults, c, "config_load_file", err);
    }
    if (n == 4) apply_sets(c, parts[3]);
    expect_print_round_trip(c);
    config_free(c);
    return 0;
}
