#include "runtime/check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_FATAL_HOOKS 8
static void (*fatal_hooks[MAX_FATAL_HOOKS])(void);
static int n_fatal_hooks;
static void (*fatal_reporter)(const char *message);

void tc_on_fatal(void (*hook)(void)) {
    if (n_fatal_hooks < MAX_FATAL_HOOKS) fatal_hooks[n_fatal_hooks++] = hook;
}

void tc_on_fatal_message(void (*report)(const char *message)) { fatal_reporter = report; }

void tc_fatal(const char *file, int line, const char *fmt, ...) {
    char *what = NULL, *message = NULL;
    va_list ap;
    fflush(stdout);
    va_start(ap, fmt);
    if (vasprintf(&what, fmt, ap) < 0) what = NULL;
    va_end(ap);
    if (!what) {
        message = "out of memory formatting an error message";
    } else if (file) { /* NULL: the user's mistake, no place in trainc */
        if (asprintf(&message, "%s (%s:%d)", what, file, line) < 0) message = what;
    } else {
        message = what;
    }
    /* Report and run the hooks once: one that fails itself must not loop back here. */
    void (*report)(const char *) = fatal_reporter;
    fatal_reporter = NULL;
    if (report) report(message);
    else fprintf(stderr, "trainc: error: %s\n", message);
    int n = n_fatal_hooks;
    n_fatal_hooks = 0;
    for (int i = n - 1; i >= 0; i--) fatal_hooks[i]();
    exit(1);
}
