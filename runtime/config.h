/* INI configuration checked against a schema.
 *
 *   # comment            ; comment
 *   include = base.ini   (path relative to the including file; later lines override it)
 *   [section]
 *   key = value          (value may carry a trailing "# comment")
 *
 * Every key is "section.key" and must be in the schema; its value must parse
 * as the key's type. Errors name the file and line ("configs/a.ini:12: ...")
 * or "--set section.key=value". Later values override earlier ones; the same
 * key twice in one file is an error. */
#ifndef TRAINC_CONFIG_H
#define TRAINC_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CFG_INT, CFG_FLOAT, CFG_BOOL, CFG_STRING, CFG_ENUM } CfgType;

typedef struct {
    const char *key;           /* "section.key" */
    CfgType type;
    const char *default_value; /* as it would be written in a file */
    const char *choices;       /* CFG_ENUM only: "cpu|cuda" */
    const char *help;          /* one line, for --print-config and the README */
} CfgKeySpec;

typedef struct Config Config;

/* The schema array must outlive the Config. */
Config *config_new(const CfgKeySpec *schema, int n_keys);
void config_free(Config *c);
/* 0 on success; -1 with a message in err (file:line: what is wrong). */
int config_load_file(Config *c, const char *path, char *err, size_t errlen);
/* "section.key=value" from the command line. */
int config_set(Config *c, const char *assignment, char *err, size_t errlen);

/* Typed getters. Booleans accept on/off, true/false, yes/no, 1/0. Asking for a
 * key that is not in the schema, or with the wrong type, is a programming
 * error and aborts with a message. */
int64_t config_int(const Config *c, const char *key);
double config_float(const Config *c, const char *key);
int config_bool(const Config *c, const char *key);
const char *config_str(const Config *c, const char *key); /* CFG_STRING or CFG_ENUM */
/* Where the effective value came from: "default", "configs/a.ini:12" or "--set". */
const char *config_origin(const Config *c, const char *key);

/* The effective config as an INI file every key of the schema, with origins
 * as comments; loading that output gives the same config. */
void config_print(const Config *c, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
