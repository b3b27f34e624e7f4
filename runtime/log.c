#include "runtime/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

/* Lines come from several threads (the loader's workers warn of the files they
 * pass over): one at a time, whole. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int quiet;
static int progress_shown; /* a progress line is on the terminal, without a newline */
static double t_start = -1.0;
static char line_prefix[32];

void log_set_quiet(int q) { quiet = q; }
int log_is_quiet(void) { return quiet; }

void log_set_prefix(const char *prefix) {
    snprintf(line_prefix, sizeof line_prefix, "%s", prefix ? prefix : "");
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void clear_progress(void) {
    if (!progress_shown) return;
    fputs("\r\033[K", stderr);
    progress_shown = 0;
}

static void vlog(const char *level, const char *fmt, va_list ap) {
    pthread_mutex_lock(&log_lock);
    if (t_start < 0) t_start = now_seconds();
    clear_progress();
    fprintf(stderr, "[%8.2f] %s%s", now_seconds() - t_start, line_prefix, level);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&log_lock);
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

void log_progress(const char *fmt, ...) {
    if (quiet) return;
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&log_lock);
    fputs("\r\033[K", stderr);
    vfprintf(stderr, fmt, ap);
    fflush(stderr);
    progress_shown = 1;
    pthread_mutex_unlock(&log_lock);
    va_end(ap);
}

void log_progress_end(void) {
    pthread_mutex_lock(&log_lock);
    if (progress_shown) fputc('\n', stderr);
    progress_shown = 0;
    pthread_mutex_unlock(&log_lock);
}

char *log_escape(const char *name, char *buf, unsigned long n) {
    unsigned long used = 0;
    for (const unsigned char *p = (const unsigned char *)name; *p && used + 5 <= n; p++) {
        if (*p < 0x20 || *p == 0x7f) used += (unsigned long)snprintf(buf + used, n - used, "\\x%02x", *p);
        else if (*p == '\\') buf[used++] = '\\', buf[used++] = '\\';
        else buf[used++] = (char)*p;
    }
    if (n) buf[used < n ? used : n - 1] = 0;
    return buf;
}
