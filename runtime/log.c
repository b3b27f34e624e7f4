#include "runtime/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static int quiet;
static double t_start = -1.0;

void log_set_quiet(int q) { quiet = q; }

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void vlog(const char *level, const char *fmt, va_list ap) {
    if (t_start < 0) t_start = now_seconds();
    fprintf(stderr, "[%8.2f] %s", now_seconds() - t_start, level);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void log_info(const char *fmt, ...) {
    if (quiet) return;
    va_list ap;
    va_start(ap, fmt);
    vlog("", fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog("warning: ", fmt, ap);
    va_end(ap);
}
