/* What this trainc is: its version, the commit it was built from, and the
 * CUDA libraries it finds when it runs (which may differ from those it was
 * built with). */
#ifndef TRAINC_VERSION_H
#define TRAINC_VERSION_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

const char *trainc_version(void);    /* the CMake project's VERSION, "0.9.0" */
const char *trainc_git_commit(void); /* "fa72896", or "unknown" outside a git checkout */
/* The lines of trainc --version. Never needs a GPU: without a driver it says so. */
void trainc_print_version(FILE *f);

#ifdef __cplusplus
}
#endif
#endif
