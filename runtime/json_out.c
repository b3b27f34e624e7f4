#include "runtime/json_out.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"

static void *need(void *p) {
    if (!p) TC_FATAL("out of host memory writing JSON");
    return p;
}

static void add(cJSON *obj, const char *key, cJSON *item) {
    need(item);
    if (!cJSON_AddItemToObject(obj, key, item)) TC_FATAL("out of host memory writing JSON");
}

cJSON *json_object_new(void) { return need(cJSON_CreateObject()); }

cJSON *json_add_object(cJSON *obj, const char *key) {
    cJSON *inner = json_object_new();
    add(obj, key, inner);
    return inner;
}

/* Length of the well-formed UTF-8 sequence at p (RFC 3629: no overlongs, no
 * surrogates, nothing past U+10FFFF), or 0. */
static size_t utf8_sequence(const unsigned char *p) {
    if (p[0] < 0x80) return 1;
    size_t n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (n == 0 || p[0] > 0xf4) return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    unsigned second = p[1];
    if (p[0] == 0xe0 && second < 0xa0) return 0; /* overlong */
    if (p[0] == 0xed && second > 0x9f) return 0; /* surrogate */
    if (p[0] == 0xf0 && second < 0x90) return 0; /* overlong */
    if (p[0] == 0xf4 && second > 0x8f) return 0; /* past U+10FFFF */
    return n;
}

/* value with each byte that starts no well-formed sequence replaced by U+FFFD
 * (malloc'ed), or NULL when it is UTF-8 already. */
static char *utf8_repaired(const char *value) {
    const unsigned char *p = (const unsigned char *)value;
    size_t len = strlen(value), bad = 0;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence(p + i);
        bad += n == 0;
        i += n ? n : 1;
    }
    if (!bad) return NULL;
    char *out = need(malloc(len + 2 * bad + 1)), *o = out;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence(p + i);
        if (n) {
            memcpy(o, p + i, n);
            o += n;
            i += n;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    *o = 0;
    return out;
}

void json_add_string(cJSON *obj, const char *key, const char *value) {
    if (!value) {
        add(obj, key, cJSON_CreateNull());
        return;
    }
    char *repaired = utf8_repaired(value);
    add(obj, key, cJSON_CreateString(repaired ? repaired : value));
    free(repaired);
}

void json_add_number(cJSON *obj, const char *key, double value, int digits) {
    if (!isfinite(value)) {
        add(obj, key, cJSON_CreateNull());
        return;
    }
    char text[64];
    snprintf(text, sizeof text, "%.*g", digits, value);
    add(obj, key, cJSON_CreateNumber(strtod(text, NULL)));
}

void json_add_int(cJSON *obj, const char *key, long long value) {
    char text[32];
    snprintf(text, sizeof text, "%lld", value);
    add(obj, key, cJSON_CreateRaw(text)); /* a double would round past 2^53 */
}

void json_add_bool(cJSON *obj, const char *key, int value) { add(obj, key, cJSON_CreateBool(value != 0)); }

/* One item as cJSON prints it (strings escaped, numbers formatted). */
static void print_leaf(FILE *f, const cJSON *item) {
    char *text = need(cJSON_PrintUnformatted(item));
    fputs(text, f);
    cJSON_free(text);
}

static void print_key(FILE *f, const char *key) {
    cJSON *s = need(cJSON_CreateStringReference(key));
    print_leaf(f, s);
    cJSON_Delete(s);
}

/* cJSON's own printer leaves no space after ':' and ','; this walk adds them. */
static void print_item(FILE *f, const cJSON *item) {
    int is_object = cJSON_IsObject(item);
    if (!is_object && !cJSON_IsArray(item)) {
        print_leaf(f, item);
        return;
    }
    fputc(is_object ? '{' : '[', f);
    for (const cJSON *c = item->child; c; c = c->next) {
        if (c != item->child) fputs(", ", f);
        if (is_object) {
            print_key(f, c->string);
            fputs(": ", f);
        }
        print_item(f, c);
    }
    fputc(is_object ? '}' : ']', f);
}

char *json_line(const cJSON *obj) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = need(open_memstream(&text, &len));
    print_item(f, obj);
    if (fclose(f) != 0) TC_FATAL("out of host memory writing JSON");
    return text;
}

int json_write_line(FILE *f, cJSON *obj) {
    char *text = json_line(obj);
    cJSON_Delete(obj);
    size_t len = strlen(text);
    text[len] = '\n'; /* open_memstream leaves room for the terminating 0 */
    errno = 0;
    int ok = fwrite(text, 1, len + 1, f) == len + 1 && fflush(f) == 0;
    free(text);
    if (!ok && errno == 0) errno = EIO;
    return ok ? 0 : -1;
}
