/* What the fuzz targets share: a scratch folder per process for the files an
 * input turns into, and inputs that hold several files, split by FUZZ_SEP. A
 * reader's error return is fine; a crash, a sanitizer report or a broken
 * promise (fuzz_fail) is a finding. */
#ifndef TRAINC_TESTS_FUZZ_COMMON_H
#define TRAINC_TESTS_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* A line of its own in text; four bytes a seed image never holds (fuzz_seeds checks). */
#define FUZZ_SEP "\n@@\n"
#define FUZZ_SEP_LEN 4
#define FUZZ_MAX_PARTS 16

typedef struct {
    const uint8_t *data;
    size_t size;
} FuzzPart;

/* Splits data at each FUZZ_SEP into at most max_parts parts (the last one keeps
 * any further separators); returns how many. */
int fuzz_split(const uint8_t *data, size_t size, FuzzPart *parts, int max_parts);

/* Empties the process's scratch folder (made once under $TMPDIR, removed at
 * exit) and returns its path. */
const char *fuzz_scratch_reset(void);
/* scratch/rel, in a static buffer that the next call overwrites. */
const char *fuzz_path(const char *rel);
/* Writes scratch/rel, making the folders on its way. */
void fuzz_write(const char *rel, const void *data, size_t n);
void fuzz_mkdir(const char *rel);

/* A reader broke a promise it makes (a failure without a message, a result
 * that differs from its input): prints why and aborts, which libFuzzer
 * reports with the input. */
void fuzz_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* An error return must come with a message (printed when FUZZ_VERBOSE is set). */
void fuzz_expect_message(const char *reader, const char *err);

#endif
