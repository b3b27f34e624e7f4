#include "runtime/config.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/check.h"
#include "runtime/ini.h"

#define MAX_INCLUDE_DEPTH 16
/* Keys longer than this get no "did you mean" suggestion. */
#define MAX_SUGGEST_LEN 128

_Static_assert(sizeof(long long) == sizeof(int64_t), "strtoll must parse exactly int64");

/* A key's range, parsed from CfgKeySpec.range. */
typedef struct {
    int set;            /* 0: any value of the type */
    int64_t imin, imax; /* CFG_INT, inclusive */
    double fmin, fmax;  /* floats; +-inf where open-ended */
    int min_open, max_open;
} CfgRange;

typedef struct {
    char *text;   /* the value as written, trimmed: what config_print writes back */
    char *origin; /* "default", "path:line" or "--set" */
    unsigned order; /* 0: the default; else the how-many-th value stored in this config (config_order) */
    int64_t i;    /* CFG_INT */
    double f;     /* CFG_FLOAT */
    int b;        /* CFG_BOOL */
} CfgValue;

struct Config {
    const CfgKeySpec *schema;
    int n_keys;
    CfgValue *values; /* values[k] holds schema[k] */
    CfgRange *ranges; /* ranges[k] of schema[k] */
    unsigned stores;  /* values stored so far: the last one's order */
};

/* ---------------------------------------------------------------- strings */

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (!d) TC_FATAL("config: out of memory");
    return memcpy(d, s, n);
}

/* Whether a trimmed value reads back unchanged from a config file, which is
 * what config_print needs of every value it writes. */
static int value_fits_in_file(const char *value) {
    char *copy = xstrdup(value);
    int fits = !strpbrk(copy, "\r\n") && !ini_find_comment(copy) && strcmp(ini_trim(copy), value) == 0;
    free(copy);
    return fits;
}

/* A string as long as the text needs: user values have no length limit. */
static char *vformat(const char *fmt, va_list ap) {
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    if (n < 0) TC_FATAL("config: cannot format a message");
    char *s = malloc((size_t)n + 1);
    if (!s) TC_FATAL("config: out of memory");
    vsnprintf(s, (size_t)n + 1, fmt, again);
    va_end(again);
    return s;
}

static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

/* Sets *err (when err is not NULL) to the message; returns -1. */
static int fail(char **err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(char **err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        free(*err);
        *err = vformat(fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* *s = *s + tail, reallocated. */
static void append(char **s, const char *tail) {
    size_t used = *s ? strlen(*s) : 0, n = strlen(tail);
    char *grown = realloc(*s, used + n + 1);
    if (!grown) TC_FATAL("config: out of memory");
    memcpy(grown + used, tail, n + 1);
    *s = grown;
}

/* Levenshtein distance; INT_MAX when either string is too long to bother. */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    if (na >= MAX_SUGGEST_LEN || nb >= MAX_SUGGEST_LEN) return INT_MAX;
    int row[MAX_SUGGEST_LEN + 1];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

/* A typo, not a different word: at most 2 edits, and at most half the name. */
static int is_close(int distance, size_t name_len) {
    return distance <= 2 && (size_t)distance * 2 <= name_len + 1;
}

/* ------------------------------------------------------------------ schema */

static const char *type_name(CfgType t) {
    switch (t) {
    case CFG_INT: return "int";
    case CFG_FLOAT: return "float";
    case CFG_BOOL: return "bool";
    case CFG_STRING: return "string";
    case CFG_ENUM: return "enum";
    case CFG_FLOAT32: return "float32";
    }
    return "?";
}

static size_t section_len(const char *key) { return (size_t)(strchr(key, '.') - key); }

static int key_in_section(const char *key, const char *section) {
    size_t n = strlen(section);
    return strncmp(key, section, n) == 0 && key[n] == '.';
}

static int same_section(const char *a, const char *b) {
    size_t n = section_len(a);
    return n == section_len(b) && strncmp(a, b, n) == 0;
}

static int section_exists(const Config *c, const char *section) {
    for (int k = 0; k < c->n_keys; k++)
        if (key_in_section(c->schema[k].key, section)) return 1;
    return 0;
}

static int find_key(const Config *c, const char *section, const char *name) {
    size_t n = strlen(section);
    for (int k = 0; k < c->n_keys; k++) {
        const char *key = c->schema[k].key;
        if (key_in_section(key, section) && strcmp(key + n + 1, name) == 0) return k;
    }
    return -1;
}

static int find_full_key(const Config *c, const char *key) {
    for (int k = 0; k < c->n_keys; k++)
        if (strcmp(c->schema[k].key, key) == 0) return k;
    return -1;
}

/* The schema key the user probably meant by section.name, or NULL. The same
 * name under another section counts: "[train] workers" suggests data.workers. */
static const char *closest_key(const Config *c, const char *section, const char *name) {
    char *wanted = format("%s.%s", section, name);
    const char *best = NULL;
    int best_distance = INT_MAX;
    for (int k = 0; k < c->n_keys; k++) {
        const char *key = c->schema[k].key;
        int d = edit_distance(wanted, strlen(wanted), key, strlen(key));
        if (d < best_distance) {
            best_distance = d;
            best = key;
        }
    }
    free(wanted);
    if (best && is_close(best_distance, strlen(name))) return best;
    for (int k = 0; k < c->n_keys; k++) {
        const char *key = c->schema[k].key;
        if (strcmp(key + section_len(key) + 1, name) == 0) return key;
    }
    return NULL;
}

/* The schema key whose section is closest to section (that section is its
 * first *len characters), or NULL when nothing is close. */
static const char *closest_section(const Config *c, const char *section, int *len) {
    const char *best = NULL;
    int best_distance = INT_MAX;
    for (int k = 0; k < c->n_keys; k++) {
        const char *key = c->schema[k].key;
        int d = edit_distance(section, strlen(section), key, section_len(key));
        if (d < best_distance) {
            best_distance = d;
            best = key;
            *len = (int)section_len(key);
        }
    }
    return best && is_close(best_distance, strlen(section)) ? best : NULL;
}

/* Finds section.name in the schema; -1 with an error when it is not there. */
static int lookup_key(const Config *c, const char *section, const char *name, const char *where, char **err) {
    int k = find_key(c, section, name);
    if (k >= 0) return k;
    const char *hint = closest_key(c, section, name);
    const char *open = hint ? " (did you mean " : "", *close = hint ? "?)" : "";
    if (!hint) hint = "";
    if (!section_exists(c, section))
        return fail(err, "%s: unknown section '%s' in key %s.%s%s%s%s", where, section, section, name, open, hint,
                    close);
    return fail(err, "%s: unknown key %s.%s%s%s%s", where, section, name, open, hint, close);
}

/* ------------------------------------------------------------------ values */

static int parse_bool(const char *s, int *out) {
    static const char *truths[] = {"on", "true", "yes", "1"};
    static const char *falsehoods[] = {"off", "false", "no", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, truths[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, falsehoods[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

static int enum_has_choice(const char *choices, const char *s) {
    size_t n = strlen(s);
    for (const char *p = choices;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, s, n) == 0) return 1;
        if (!bar) return 0;
        p = bar + 1;
    }
}

static int in_range(const CfgRange *r, double x) {
    int above_min = r->min_open ? x > r->fmin : x >= r->fmin;
    int below_max = r->max_open ? x < r->fmax : x <= r->fmax;
    return above_min && below_max;
}

static int parse_int(const CfgKeySpec *spec, const CfgRange *r, const char *text, CfgValue *v, char **why) {
    char *end;
    errno = 0;
    long long n = strtoll(text, &end, 10);
    if (end == text || *end) return fail(why, "%s: '%s' is not a base-10 integer", spec->key, text);
    if (errno == ERANGE) return fail(why, "%s: %s does not fit in a 64-bit integer", spec->key, text);
    if (r->set && (n < r->imin || n > r->imax))
        return fail(why, "%s = %s is out of range: allowed %s", spec->key, text, spec->range);
    v->i = n;
    return 0;
}

/* A finite double; for CFG_FLOAT32 one that stays a non-zero finite float
 * when it was not zero. The range holds for the value the program uses. */
static int parse_float(const CfgKeySpec *spec, const CfgRange *r, const char *text, CfgValue *v, char **why) {
    const char *key = spec->key;
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || *end) return fail(why, "%s: '%s' is not a number", key, text);
    if (isnan(x) || (isinf(x) && errno != ERANGE))
        return fail(why, "%s: '%s' is not a finite number (inf and nan are not allowed)", key, text);
    int bits = spec->type == CFG_FLOAT32 ? 32 : 64;
    if (errno == ERANGE && fabs(x) > 1) return fail(why, "%s: %s overflows a %d-bit float", key, text, bits);
    if (errno == ERANGE) return fail(why, "%s: %s underflows a %d-bit float", key, text, bits);
    double used = x;
    if (bits == 32) {
        if (fabs(x) > FLT_MAX)
            return fail(why, "%s: %s overflows a 32-bit float (largest %.6g)", key, text, (double)FLT_MAX);
        used = (double)(float)x;
        if (x != 0 && used == 0)
            return fail(why, "%s: %s is too small for a 32-bit float (it would be 0; smallest %.2g)", key, text,
                        (double)FLT_TRUE_MIN);
    }
    if (r->set && !in_range(r, x))
        return fail(why, "%s = %s is out of range: allowed %s", key, text, spec->range);
    if (r->set && !in_range(r, used))
        return fail(why, "%s = %s is out of range: allowed %s (as a 32-bit float it is %.9g)", key, text,
                    spec->range, used);
    v->f = x;
    return 0;
}

/* Parses a trimmed text as spec's type into v's typed field. On failure
 * sets *why, starting with the key, and returns -1. An empty string is a
 * value ("metrics_file =" turns the file off); an empty number is a mistake. */
static int parse_value(const CfgKeySpec *spec, const CfgRange *r, const char *text, CfgValue *v, char **why) {
    const char *key = spec->key;
    if (!*text && spec->type != CFG_STRING) return fail(why, "%s: empty value", key);
    switch (spec->type) {
    case CFG_INT:
        return parse_int(spec, r, text, v, why);
    case CFG_FLOAT:
    case CFG_FLOAT32:
        return parse_float(spec, r, text, v, why);
    case CFG_BOOL:
        if (parse_bool(text, &v->b) != 0)
            return fail(why, "%s: '%s' is not a boolean (on/off, true/false, yes/no, 1/0)", key, text);
        return 0;
    case CFG_STRING:
        return 0;
    case CFG_ENUM:
        if (!enum_has_choice(spec->choices, text))
            return fail(why, "%s: '%s' is not one of %s", key, text, spec->choices);
        return 0;
    }
    return fail(why, "%s: bad type %d", key, (int)spec->type);
}

static void store_value(CfgValue *v, const CfgValue *parsed, const char *text, const char *origin) {
    free(v->text);
    free(v->origin);
    *v = *parsed;
    v->text = xstrdup(text);
    v->origin = xstrdup(origin);
}

/* Parses text for key k and makes it the effective value; errors start with where. */
static int set_value(Config *c, int k, const char *text, const char *origin, const char *where, char **err) {
    char *why = NULL;
    CfgValue parsed = {0};
    int rc = parse_value(&c->schema[k], &c->ranges[k], text, &parsed, &why);
    parsed.order = strcmp(origin, "default") == 0 ? 0 : ++c->stores;
    if (rc == 0) store_value(&c->values[k], &parsed, text, origin);
    else fail(err, "%s: %s", where, why);
    free(why);
    return rc;
}

static CfgValue *values_clone(const Config *c) {
    CfgValue *copy = calloc((size_t)c->n_keys + 1, sizeof *copy);
    if (!copy) TC_FATAL("config: out of memory");
    for (int k = 0; k < c->n_keys; k++) {
        copy[k] = c->values[k];
        copy[k].text = xstrdup(c->values[k].text);
        copy[k].origin = xstrdup(c->values[k].origin);
    }
    return copy;
}

static void values_free(CfgValue *values, int n_keys) {
    for (int k = 0; k < n_keys; k++) {
        free(values[k].text);
        free(values[k].origin);
    }
    free(values);
}

/* ------------------------------------------------------------ config_new */

static int is_name_char(char ch) { return isalnum((unsigned char)ch) || ch == '_' || ch == '-'; }

/* "section.key", both parts non-empty names. */
static int is_valid_key(const char *key) {
    const char *dot = strchr(key, '.');
    if (!dot || dot == key || !dot[1]) return 0;
    for (const char *p = key; *p; p++)
        if (p != dot && !is_name_char(*p)) return 0;
    return 1;
}

/* Each choice non-empty and writable as a value: no whitespace, no leading '#' or ';'. */
static int is_valid_choices(const char *choices) {
    if (!choices || !*choices) return 0;
    for (const char *p = choices; *p; p++) {
        int starts_choice = p == choices || p[-1] == '|';
        if (isspace((unsigned char)*p)) return 0;
        if (starts_choice && (*p == '|' || *p == '#' || *p == ';')) return 0;
    }
    return choices[strlen(choices) - 1] != '|';
}

static int is_number_type(CfgType t) { return t == CFG_INT || t == CFG_FLOAT || t == CFG_FLOAT32; }

/* One end of a range: an int, a finite number, or (floats, open end) +-inf. */
static int parse_bound(CfgType type, const char *text, int open, int is_max, double *f, int64_t *i) {
    if (type != CFG_INT && open && strcmp(text, is_max ? "inf" : "-inf") == 0) {
        *f = is_max ? INFINITY : -INFINITY;
        return 0;
    }
    char *end;
    errno = 0;
    if (type == CFG_INT) {
        *i = strtoll(text, &end, 10);
        *f = (double)*i;
        return end == text || *end || errno || open ? -1 : 0; /* ints: closed ends */
    }
    *f = strtod(text, &end);
    return end == text || *end || errno || !isfinite(*f) ? -1 : 0;
}

/* "[lo, hi]", "(lo, hi]", ...: 0, or -1 when the text is not such an interval. */
static int parse_range(const CfgKeySpec *spec, CfgRange *r) {
    const char *text = spec->range;
    size_t n = strlen(text);
    if (n < 5 || !strchr("[(", text[0]) || !strchr("])", text[n - 1])) return -1;
    char *inner = xstrdup(text + 1);
    inner[n - 2] = '\0';
    char *comma = strchr(inner, ',');
    int rc = -1;
    if (comma) {
        *comma = '\0';
        r->min_open = text[0] == '(';
        r->max_open = text[n - 1] == ')';
        rc = parse_bound(spec->type, ini_trim(inner), r->min_open, 0, &r->fmin, &r->imin) ||
             parse_bound(spec->type, ini_trim(comma + 1), r->max_open, 1, &r->fmax, &r->imax) ? -1 : 0;
        if (rc == 0 && (r->fmin > r->fmax || (r->fmin == r->fmax && (r->min_open || r->max_open)))) rc = -1;
        if (rc == 0 && spec->type == CFG_INT && r->imin > r->imax) rc = -1;
    }
    free(inner);
    r->set = rc == 0;
    return rc;
}

static void check_spec(const CfgKeySpec *schema, int k) {
    const CfgKeySpec *spec = &schema[k];
    const char *key = spec->key;
    if (!key || !is_valid_key(key))
        TC_FATAL("config schema: key %d '%s' is not section.key (letters, digits, '_', '-')", k,
                 key ? key : "(null)");
    if (strcmp(key + section_len(key) + 1, "include") == 0)
        TC_FATAL("config schema: %s: 'include' is a directive, not a key name", key);
    for (int j = 0; j < k; j++)
        if (strcmp(schema[j].key, key) == 0) TC_FATAL("config schema: %s appears twice", key);
    if (spec->type < CFG_INT || spec->type > CFG_FLOAT32)
        TC_FATAL("config schema: %s: bad type %d", key, (int)spec->type);
    if (spec->range && !is_number_type(spec->type))
        TC_FATAL("config schema: %s: a range on a %s key", key, type_name(spec->type));
    if (spec->type == CFG_ENUM && !is_valid_choices(spec->choices))
        TC_FATAL("config schema: %s: bad enum choices '%s'", key, spec->choices ? spec->choices : "(null)");
    if (spec->help && strpbrk(spec->help, "\r\n"))
        TC_FATAL("config schema: %s: help must be one line", key);
    if (!spec->default_value) TC_FATAL("config schema: %s: no default value", key);
    if (!value_fits_in_file(spec->default_value))
        TC_FATAL("config schema: %s: default '%s' cannot be written in a config file "
                 "(surrounding whitespace, a newline, or '#'/';' after whitespace)", key, spec->default_value);
}

Config *config_new(const CfgKeySpec *schema, int n_keys) {
    if (n_keys < 0 || (n_keys > 0 && !schema)) TC_FATAL("config_new: no schema for %d keys", n_keys);
    Config *c = calloc(1, sizeof *c);
    CfgValue *values = calloc((size_t)n_keys + 1, sizeof *values);
    CfgRange *ranges = calloc((size_t)n_keys + 1, sizeof *ranges);
    if (!c || !values || !ranges) TC_FATAL("config: out of memory");
    c->schema = schema;
    c->n_keys = n_keys;
    c->values = values;
    c->ranges = ranges;
    for (int k = 0; k < n_keys; k++) {
        check_spec(schema, k);
        if (schema[k].range && parse_range(&schema[k], &ranges[k]) != 0)
            TC_FATAL("config schema: %s: bad range '%s' (\"[lo, hi]\"; ints closed, floats may be open or "
                     "+-inf at an open end)", schema[k].key, schema[k].range);
        char *why = NULL;
        if (set_value(c, k, schema[k].default_value, "default", "default", &why) != 0)
            TC_FATAL("config schema: bad %s", why);
    }
    return c;
}

void config_free(Config *c) {
    if (!c) return;
    values_free(c->values, c->n_keys);
    free(c->ranges);
    free(c);
}

/* ------------------------------------------------------------- file loading */

typedef struct {
    Config *c;
    char **err;
    int depth; /* files being loaded: the top file and the includes it is inside */
    char *real_paths[MAX_INCLUDE_DEPTH + 1];        /* to detect cycles */
    const char *shown_paths[MAX_INCLUDE_DEPTH + 1]; /* as written, for messages */
} Loader;

typedef struct {
    const char *path;    /* as shown in messages and origins */
    int line;
    const char *section; /* the current [section]; NULL before the first */
    int *set_at_line;    /* per schema key: the line of this file that set it, or 0 */
} FileCursor;

static int load_file(Loader *L, const char *path, const char *include_site);

/* name relative to the directory of the file that names it (absolute names stay). */
static char *resolve_relative(const char *including_path, const char *name) {
    const char *slash = strrchr(including_path, '/');
    size_t dir_len = name[0] == '/' || !slash ? 0 : (size_t)(slash - including_path) + 1;
    char *path = malloc(dir_len + strlen(name) + 1);
    if (!path) TC_FATAL("config: out of memory");
    memcpy(path, including_path, dir_len);
    strcpy(path + dir_len, name);
    return path;
}

static int parse_section_header(Loader *L, FileCursor *fc, const char *section, const char *where) {
    if (!section_exists(L->c, section)) {
        int len = 0;
        const char *hint = closest_section(L->c, section, &len);
        if (hint)
            return fail(L->err, "%s: unknown section [%s] (did you mean [%.*s]?)", where, section,
                        len, hint);
        return fail(L->err, "%s: unknown section [%s]", where, section);
    }
    fc->section = section; /* points into the file's text, which lives as long as the cursor */
    return 0;
}

static int include_file(Loader *L, const FileCursor *fc, const char *name, const char *where) {
    if (!*name) return fail(L->err, "%s: include: empty value", where);
    char *path = resolve_relative(fc->path, name);
    int rc = load_file(L, path, where);
    free(path);
    return rc;
}

static int parse_assignment(Loader *L, FileCursor *fc, const char *name, const char *value, const char *where) {
    if (strcmp(name, "include") == 0) return include_file(L, fc, value, where);
    if (!fc->section)
        return fail(L->err, "%s: key '%s' is outside any section (add a [section] line above it)",
                    where, name);
    int k = lookup_key(L->c, fc->section, name, where, L->err);
    if (k < 0) return -1;
    if (fc->set_at_line[k])
        return fail(L->err, "%s: %s is set twice in this file (lines %d and %d)", where,
                    L->c->schema[k].key, fc->set_at_line[k], fc->line);
    fc->set_at_line[k] = fc->line;
    return set_value(L->c, k, value, where, where, L->err);
}

static int parse_item(Loader *L, FileCursor *fc, const IniItem *item) {
    fc->line = item->line;
    char *where = format("%s:%d", fc->path, fc->line);
    int rc;
    if (item->kind == INI_SECTION) rc = parse_section_header(L, fc, item->name, where);
    else if (item->kind == INI_PAIR) rc = parse_assignment(L, fc, item->name, item->value, where);
    else rc = fail(L->err, "%s: malformed line '%s' (expected key = value, [section] or a comment)", where,
                   item->name);
    free(where);
    return rc;
}

static int parse_text(Loader *L, FileCursor *fc, char *text, size_t len) {
    IniLexer lx;
    ini_begin(&lx, fc->path, text, len);
    IniItem item;
    char *lex_err = NULL;
    int got;
    while ((got = ini_next(&lx, &item, &lex_err)) == 1)
        if (parse_item(L, fc, &item) != 0) return -1;
    if (got < 0) {
        fail(L->err, "%s", lex_err);
        free(lex_err);
        return -1;
    }
    return 0;
}

/* Refuses a file that is already being loaded or that nests too deep. */
static int check_include_chain(Loader *L, const char *real, const char *path, const char *include_site) {
    for (int d = 0; d < L->depth; d++) {
        if (strcmp(L->real_paths[d], real) != 0) continue;
        char *chain = NULL;
        for (int i = d; i < L->depth; i++) {
            append(&chain, L->shown_paths[i]);
            append(&chain, " -> ");
        }
        append(&chain, path);
        fail(L->err, "%s: include cycle: %s", include_site, chain);
        free(chain);
        return -1;
    }
    if (L->depth > MAX_INCLUDE_DEPTH)
        return fail(L->err, "%s: includes nested more than %d deep", include_site, MAX_INCLUDE_DEPTH);
    return 0;
}

/* include_site is "file:line" of the include directive, NULL for the top file. */
static int load_file(Loader *L, const char *path, const char *include_site) {
    char *real = realpath(path, NULL);
    size_t len = 0;
    const char *why = real ? NULL : strerror(errno);
    char *text = real ? ini_read_file(path, &len, &why) : NULL;
    if (!text) {
        free(real);
        if (include_site) return fail(L->err, "%s: cannot open include '%s': %s", include_site, path, why);
        return fail(L->err, "%s: cannot open: %s", path, why);
    }
    int rc = include_site ? check_include_chain(L, real, path, include_site) : 0;
    if (rc == 0) {
        L->real_paths[L->depth] = real;
        L->shown_paths[L->depth] = path;
        L->depth++;
        FileCursor fc = {.path = path, .set_at_line = calloc((size_t)L->c->n_keys + 1, sizeof(int))};
        if (!fc.set_at_line) TC_FATAL("config: out of memory");
        rc = parse_text(L, &fc, text, len);
        free(fc.set_at_line);
        L->depth--;
    }
    free(real);
    free(text);
    return rc;
}

/* The message into a caller's buffer; one that does not fit ends in "...". */
static int copy_message(int rc, char *message, char *err, size_t errlen) {
    if (err && errlen) {
        const char *m = message ? message : "";
        size_t n = strlen(m);
        if (n < errlen) memcpy(err, m, n + 1);
        else snprintf(err, errlen, "%.*s...", errlen > 4 ? (int)(errlen - 4) : 0, m);
    }
    free(message);
    return rc;
}

int config_load_file(Config *c, const char *path, char *err, size_t errlen) {
    char *message = NULL;
    int rc = config_load_file_msg(c, path, &message);
    return copy_message(rc, message, err, errlen);
}

int config_set(Config *c, const char *assignment, char *err, size_t errlen) {
    char *message = NULL;
    int rc = config_set_msg(c, assignment, &message);
    return copy_message(rc, message, err, errlen);
}

/* A file that fails leaves the config as it was. */
int config_load_file_msg(Config *c, const char *path, char **err) {
    if (!c || !path) TC_FATAL("config_load_file: NULL %s", c ? "path" : "config");
    if (err) *err = NULL;
    CfgValue *before = values_clone(c);
    Loader L = {.c = c, .err = err};
    int rc = load_file(&L, path, NULL);
    if (rc != 0) {
        CfgValue *partial = c->values;
        c->values = before;
        before = partial;
    }
    values_free(before, c->n_keys);
    return rc;
}

/* ---------------------------------------------------------------- --set */

static int set_assignment(Config *c, char *assignment, const char *origin, const char *where, char **err) {
    char *eq = strchr(assignment, '=');
    if (!eq) return fail(err, "%s: expected section.key=value", where);
    *eq = '\0';
    char *key = ini_trim(assignment);
    char *value = ini_trim(eq + 1);
    char *dot = strchr(key, '.');
    if (!dot) {
        const char *hint = closest_key(c, "", key);
        return fail(err, "%s: key '%s' has no section (expected section.key=value%s%s)", where, key,
                    hint ? ", e.g. " : "", hint ? hint : "");
    }
    *dot = '\0';
    int k = lookup_key(c, key, dot + 1, where, err);
    if (k < 0) return -1;
    if (!value_fits_in_file(value))
        return fail(err, "%s: %s: a value cannot hold a newline or a '#'/';' after whitespace "
                    "(config files read that as a comment)", where, c->schema[k].key);
    return set_value(c, k, value, origin, where, err);
}

int config_set_msg(Config *c, const char *assignment, char **err) {
    return config_set_origin_msg(c, assignment, "--set", err);
}

int config_set_origin_msg(Config *c, const char *assignment, const char *origin, char **err) {
    if (!c || !assignment || !origin) TC_FATAL("config_set: NULL %s", c ? "assignment or origin" : "config");
    if (err) *err = NULL;
    char *where = strcmp(origin, "--set") == 0 ? format("--set %s", assignment) : format("%s: %s", origin, assignment);
    char *copy = xstrdup(assignment);
    int rc = set_assignment(c, copy, origin, where, err);
    free(copy);
    free(where);
    return rc;
}

/* ---------------------------------------------------------------- getters */

static const CfgValue *typed_value(const Config *c, const char *key, CfgType want, const char *getter) {
    if (!key) TC_FATAL("%s: NULL key", getter);
    int k = find_full_key(c, key);
    if (k < 0) TC_FATAL("%s(\"%s\"): no such config key", getter, key);
    CfgType type = c->schema[k].type;
    if (type != want && !(want == CFG_STRING && type == CFG_ENUM) && !(want == CFG_FLOAT && type == CFG_FLOAT32))
        TC_FATAL("%s(\"%s\"): the key has type %s", getter, key, type_name(type));
    return &c->values[k];
}

int64_t config_int(const Config *c, const char *key) { return typed_value(c, key, CFG_INT, "config_int")->i; }

double config_float(const Config *c, const char *key) {
    return typed_value(c, key, CFG_FLOAT, "config_float")->f;
}

int config_bool(const Config *c, const char *key) { return typed_value(c, key, CFG_BOOL, "config_bool")->b; }

const char *config_str(const Config *c, const char *key) {
    return typed_value(c, key, CFG_STRING, "config_str")->text;
}

const char *config_origin(const Config *c, const char *key) {
    int k = key ? find_full_key(c, key) : -1;
    if (k < 0) TC_FATAL("config_origin(\"%s\"): no such config key", key ? key : "(null)");
    return c->values[k].origin;
}

unsigned config_order(const Config *c, const char *key) {
    int k = key ? find_full_key(c, key) : -1;
    if (k < 0) TC_FATAL("config_order(\"%s\"): no such config key", key ? key : "(null)");
    return c->values[k].order;
}

/* ------------------------------------------------------------------ print */

static void print_section(const Config *c, int first, FILE *f) {
    const char *first_key = c->schema[first].key;
    fprintf(f, "[%.*s]\n", (int)section_len(first_key), first_key);
    for (int k = first; k < c->n_keys; k++) {
        const CfgKeySpec *spec = &c->schema[k];
        if (!same_section(spec->key, first_key)) continue;
        if (spec->help) fprintf(f, "# %s%s%s\n", spec->help, spec->range ? "; allowed " : "",
                                spec->range ? spec->range : "");
        fprintf(f, "%s = %s  # %s\n", spec->key + section_len(spec->key) + 1, c->values[k].text,
                c->values[k].origin);
    }
}

/* Sections in the order the schema first names them. */
void config_print(const Config *c, FILE *f) {
    int printed = 0;
    for (int k = 0; k < c->n_keys; k++) {
        int seen = 0;
        for (int j = 0; j < k && !seen; j++) seen = same_section(c->schema[j].key, c->schema[k].key);
        if (seen) continue;
        if (printed++) fputc('\n', f);
        print_section(c, k, f);
    }
}

/* A table cell: '|' would end it. */
static void markdown_cell(const char *text, FILE *f) {
    for (; *text; text++) {
        if (*text == '|') fputs("\\|", f);
        else fputc(*text, f);
    }
}

void config_schema_markdown(const CfgKeySpec *schema, int n_keys, FILE *f) {
    fputs("| key | type | allowed | default | meaning |\n|---|---|---|---|---|\n", f);
    for (int k = 0; k < n_keys; k++) {
        const CfgKeySpec *s = &schema[k];
        fprintf(f, "| `%s` | %s | ", s->key, s->type == CFG_FLOAT32 ? "float" : type_name(s->type));
        if (s->type == CFG_ENUM) {
            for (const char *c = s->choices; *c; c++) fputs(*c == '|' ? ", " : (char[2]){*c, 0}, f);
        }
        else if (s->type == CFG_BOOL) fputs("on, off", f);
        else if (s->range) markdown_cell(s->range, f);
        else fputs("any", f);
        fprintf(f, " | `%s` | ", s->default_value);
        markdown_cell(s->help, f);
        fputs(" |\n", f);
    }
}

/* ------------------------------------------------ the user's mistakes */

/* "configs/a.ini:12: key = value" or "key = value (the default)". */
static char *describe_setting(const Config *c, const char *key) {
    int k = key ? find_full_key(c, key) : -1;
    if (k < 0) TC_FATAL("config: no such config key '%s'", key ? key : "(null)");
    const CfgValue *v = &c->values[k];
    if (strcmp(v->origin, "default") == 0) return format("%s = %s (the default)", key, v->text);
    return format("%s: %s = %s", v->origin, key, v->text);
}

static char *describe_problem(const Config *c, const char *key, const char *fmt, va_list ap) {
    char *setting = describe_setting(c, key);
    char *what = vformat(fmt, ap);
    char *line = format("%s: %s", setting, what);
    free(setting);
    free(what);
    return line;
}

void config_fail(const Config *c, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *line = describe_problem(c, key, fmt, ap);
    va_end(ap);
    tc_fatal(NULL, 0, "%s", line);
}

void config_problem(ConfigProblems *p, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *line = describe_problem(p->config, key, fmt, ap);
    va_end(ap);
    append(&p->text, "\n  ");
    append(&p->text, line);
    free(line);
    p->count++;
}

void config_problems_check(ConfigProblems *p) {
    if (p->count == 1) tc_fatal(NULL, 0, "%s", p->text + 3); /* past "\n  " */
    if (p->count > 1) tc_fatal(NULL, 0, "%d problems with the settings:%s", p->count, p->text);
    free(p->text);
    p->text = NULL;
}
