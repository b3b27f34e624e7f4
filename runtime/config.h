/* INI configuration checked against a schema.
 *
 *   # comment            ; comment
 *   include = base.ini   (path relative to the including file; later lines override it)
 *   [section]
 *   key = value          (value may carry a trailing "# comment")
 *
 * Every key is "section.key" and must be in the schema; its value must parse
 * as the key's type and lie in the key's range. Errors name the file and line
 * ("configs/a.ini:12: ...") or "--set section.key=value". Later values
 * override earlier ones; the same key twice in one file is an error. A UTF-8
 * byte-order mark at the start of a file is skipped. Values have no length
 * limit. */
#ifndef TRAINC_CONFIG_H
#define TRAINC_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CFG_FLOAT is a double; CFG_FLOAT32 a value the program uses as a 32-bit
 * float, so one a float cannot hold (1e39, 1e-50) is refused. */
typedef enum { CFG_INT, CFG_FLOAT, CFG_BOOL, CFG_STRING, CFG_ENUM, CFG_FLOAT32 } CfgType;

typedef struct {
    const char *key;           /* "section.key" */
    CfgType type;
    const char *default_value; /* as it would be written in a file */
    const char *choices;       /* CFG_ENUM only: "cpu|cuda" */
    const char *help;          /* one line, for --print-config and the README */
    /* Numbers only, NULL for any value: the allowed values as an interval,
     * "[1, 1048576]" (ints: closed, both ends finite) or "(0, 1]", "[0, inf)"
     * (floats). Checked on the parsed value before the program narrows it. */
    const char *range;
} CfgKeySpec;

typedef struct Config Config;

/* The schema array must outlive the Config. */
Config *config_new(const CfgKeySpec *schema, int n_keys);
void config_free(Config *c);
/* 0 on success; -1 with a message in err (file:line: what is wrong). A
 * message longer than errlen ends in "..."; the _msg forms never cut it. */
int config_load_file(Config *c, const char *path, char *err, size_t errlen);
/* "section.key=value" from the command line. */
int config_set(Config *c, const char *assignment, char *err, size_t errlen);
/* As above, the message in *err (malloc'd, the caller frees it; NULL on success). */
int config_load_file_msg(Config *c, const char *path, char **err);
int config_set_msg(Config *c, const char *assignment, char **err);
/* As config_set_msg, with where the value came from for later messages (config_origin): "--set" above,
 * here e.g. "the checkpoint F". */
int config_set_origin_msg(Config *c, const char *assignment, const char *origin, char **err);

/* Typed getters. Booleans accept on/off, true/false, yes/no, 1/0. Asking for a
 * key that is not in the schema, or with the wrong type, is a programming
 * error and aborts with a message. */
int64_t config_int(const Config *c, const char *key);
double config_float(const Config *c, const char *key); /* CFG_FLOAT or CFG_FLOAT32 */
int config_bool(const Config *c, const char *key);
const char *config_str(const Config *c, const char *key); /* CFG_STRING or CFG_ENUM */
/* Where the effective value came from: "default", "configs/a.ini:12" or "--set". */
const char *config_origin(const Config *c, const char *key);
/* When the effective value was set: 0 for the default, else larger for a value set later (an including file's
 * lines after its include's, --set after every file). */
unsigned config_order(const Config *c, const char *key);

/* The effective config as an INI file every key of the schema, with origins
 * as comments; loading that output gives the same config. */
void config_print(const Config *c, FILE *f);
/* The schema as a Markdown table: key, type, allowed values, default, meaning. */
void config_schema_markdown(const CfgKeySpec *schema, int n_keys, FILE *f);

/* Settings the schema accepts but the program cannot use (a key that needs
 * another, a value the data cannot take) are the user's mistakes, not the
 * program's: these messages name where the value came from, never a source
 * file. "configs/a.ini:12: perf.cuda_graph = on: needs run.device = cuda".
 *
 * config_fail prints "trainc: error: " and that, runs the fatal hooks (as
 * TC_FATAL does) and exits with status 1. */
void config_fail(const Config *c, const char *key, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

/* Problems gathered so that one message names them all. Start from
 * {.config = c}; config_problems_check ends the program when there are any. */
typedef struct {
    const Config *config;
    char *text; /* one line per problem */
    int count;
} ConfigProblems;
void config_problem(ConfigProblems *p, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* With no problems, frees what p holds and returns; else stops as config_fail,
 * with every problem on a line of its own. */
void config_problems_check(ConfigProblems *p);

#ifdef __cplusplus
}
#endif
#endif
