/* JSON lines through cJSON (Debian's libcjson): every JSON object trainc
 * prints (the run's summary, the metrics file) is built key by key as a cJSON
 * tree and written as one line with json.dumps's separators,
 * {"key": value, "key": value}, which the tests and scripts read. cJSON
 * escapes every string (quotes, backslashes, control characters); bytes that
 * are not UTF-8 become U+FFFD, so the line always parses; a number that is not
 * finite is written as null. Out of memory ends the process. */
#ifndef TRAINC_JSON_OUT_H
#define TRAINC_JSON_OUT_H

#include <stdio.h>

#include <cJSON.h>

#ifdef __cplusplus
extern "C" {
#endif

cJSON *json_object_new(void);
/* A nested object under key, to add to. */
cJSON *json_add_object(cJSON *obj, const char *key);
/* NULL is written as null. */
void json_add_string(cJSON *obj, const char *key, const char *value);
/* Rounded to `digits` significant digits; NaN or inf: null. */
void json_add_number(cJSON *obj, const char *key, double value, int digits);
/* Exact, whatever its size. */
void json_add_int(cJSON *obj, const char *key, long long value);
void json_add_bool(cJSON *obj, const char *key, int value);
/* The object as one line, without the newline (malloc'ed). */
char *json_line(const cJSON *obj);
/* Writes the object and a newline in one write, flushes, and frees the
 * object; 0, or -1 with errno set when the write failed. */
int json_write_line(FILE *f, cJSON *obj);

#ifdef __cplusplus
}
#endif
#endif
