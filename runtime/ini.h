/* The one INI lexer: config files (runtime/config.c) and net files
 * (models/netfile.c) read their lines through it.
 *
 *   # comment            ; comment
 *   [section]            (a trailing comment allowed)
 *   key = value          (key one word; value may carry a trailing "# comment")
 *   a line of its own    (no '=' after a first word: a net file's unnamed layer
 *                         "maxpool 3 stride=2", a config's mistake)
 *
 * '#' or ';' starts a comment at the start of a line or after whitespace, so
 * "a#b" keeps its '#'. Keys, values and bare lines come trimmed. A UTF-8
 * byte-order mark at the start of a file is skipped. Errors name the file
 * and line: "configs/a.ini:12: ...". What the lexer gives means nothing to it:
 * sections and keys are the reader's to check. */
#ifndef TRAINC_INI_H
#define TRAINC_INI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { INI_SECTION, INI_PAIR, INI_BARE } IniItemKind;

typedef struct {
    IniItemKind kind;
    int line;
    const char *name;  /* INI_SECTION: the section; INI_PAIR: the key; INI_BARE: the line */
    const char *value; /* INI_PAIR: the value without its comment ("" when empty); else NULL */
} IniItem;

typedef struct {
    const char *path;  /* as shown in messages */
    char *next, *end;  /* the text not lexed yet */
    int line;
} IniLexer;

/* At most this many bytes: an include of /dev/zero or a FIFO would otherwise read forever or block. */
#define INI_MAX_BYTES (16u << 20)

/* The whole regular file, NUL-terminated (the caller frees it); NULL with *why set when it cannot be read. */
char *ini_read_file(const char *path, size_t *len, const char **why);
/* Lexes text[0, len) (changed in place; it must outlive the items) as the file path. */
void ini_begin(IniLexer *lx, const char *path, char *text, size_t len);
/* 1 with the next item, 0 at the end, -1 with *err (malloc'd; "path:line: what") for a line that is no
 * item: a NUL byte, a section header without ']' or with text after it, '[]', '=' with no key. */
int ini_next(IniLexer *lx, IniItem *item, char **err);
/* The first comment character of s ('#' or ';' at its start or after whitespace), or NULL. */
char *ini_find_comment(char *s);
/* s without leading and trailing whitespace (cut in place). */
char *ini_trim(char *s);

#ifdef __cplusplus
}
#endif
#endif
