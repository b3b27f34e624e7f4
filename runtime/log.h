/* Logging to stderr with the elapsed time; log_info is silenced by --quiet. */
#ifndef TRAINC_LOG_H
#define TRAINC_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

void log_set_quiet(int quiet);
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Seconds on a monotonic clock. */
double now_seconds(void);

#ifdef __cplusplus
}
#endif
#endif
