/* The net-file reader (models/netfile.c) with the builders' shape inference behind it, on text alone.
 *
 * Input: a net file's text (blocks, repeats, variables, conditions, names). Besides sanitizer findings it
 * checks the reader's promises: an error names the file and the line ("f.net:12: ..."); a net that builds has
 * layers and ends in {classes} features; the same text builds the same net, or fails with the same message, a
 * second time (no state kept between builds). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/netfile.h"
#include "tests/fuzz/fuzz_common.h"

#define CLASSES 10

typedef struct {
    int rc, n_layers, n_acts, n_blocks;
    size_t n_params;
    char err[1024];
} Built;

/* "f.net:LINE: " at the start of err. */
static int names_file_and_line(const char *err) {
    if (strncmp(err, "f.net:", 6) != 0 || !isdigit((unsigned char)err[6])) return 0;
    const char *p = err + 6;
    while (isdigit((unsigned char)*p)) p++;
    return p[0] == ':' && p[1] == ' ';
}

static Built build(Model *m, const char *text) {
    static const NetShape shape = {2, 32, CLASSES, 0};
    Built b = {0};
    memset(m, 0, sizeof *m);
    b.rc = netfile_build(m, "f.net", text, &shape, b.err, sizeof b.err);
    b.n_layers = m->n_layers, b.n_acts = m->n_acts, b.n_blocks = m->n_blocks, b.n_params = m->n_params;
    if (b.rc == 0 && b.n_acts > 0 && m->acts[b.n_acts - 1].c != CLASSES)
        fuzz_fail("a net that built ends in %d features, not {classes} = %d", m->acts[b.n_acts - 1].c, CLASSES);
    model_destroy(m);
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Model *m; /* large: one for every input */
    if (!m && !(m = malloc(sizeof *m))) fuzz_fail("out of memory");
    char *text = malloc(size + 1);
    if (!text) fuzz_fail("out of memory");
    memcpy(text, data, size);
    text[size] = '\0';
    Built first = build(m, text);
    if (first.rc != 0) {
        fuzz_expect_message("netfile_build", first.err);
        if (!names_file_and_line(first.err)) fuzz_fail("an error that names no file and line: %s", first.err);
    } else if (first.n_layers == 0) {
        fuzz_fail("a net of no layers built");
    }
    Built again = build(m, text);
    if (again.rc != first.rc || strcmp(again.err, first.err) != 0 || again.n_layers != first.n_layers ||
        again.n_acts != first.n_acts || again.n_blocks != first.n_blocks || again.n_params != first.n_params)
        fuzz_fail("the same text built twice differs: rc %d / %d, %d / %d layers, '%s' / '%s'", first.rc, again.rc,
                  first.n_layers, again.n_layers, first.err, again.err);
    free(text);
    return 0;
}
