/* Logging to stderr with the elapsed time; log_info is silenced by --quiet.
 * A progress line (log_progress) is redrawn in place with \r; a log line
 * printed while one shows clears it first, and the next update redraws it. */
#ifndef TRAINC_LOG_H
#define TRAINC_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

void log_set_quiet(int quiet);
int log_is_quiet(void);
/* Text put before every log line (after the time), e.g. "rank 1: "; NULL or ""
 * for none. Copied; at most 31 characters are kept. */
void log_set_prefix(const char *prefix);
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Redraws the progress line (no newline); silenced by --quiet. */
void log_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Ends a progress line that shows, leaving it on screen (a newline). */
void log_progress_end(void);
/* A name read from a file or a folder (a class name, a file name) as it may be
 * printed on a terminal: control bytes (escape sequences, newlines, ...) and
 * DEL as \xNN, a backslash as \\; into buf (n bytes, cut short to fit), which
 * it returns. Every such name trainc prints as text goes through here. */
char *log_escape(const char *name, char *buf, unsigned long n);
/* Seconds on a monotonic clock. */
double now_seconds(void);

#ifdef __cplusplus
}
#endif
#endif
