/* A Prometheus text endpoint: GET /metrics on 127.0.0.1:port, answered by a
 * background thread from a table of gauges that the training thread sets.
 * Plain sockets; the thread polls with a short timeout, so prom_stop returns
 * within about 0.2 s. One connection at a time, each bounded in time. */
#ifndef TRAINC_PROMETHEUS_H
#define TRAINC_PROMETHEUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct PromServer PromServer;

/* Listens on 127.0.0.1:port; NULL with the reason in err when it cannot. */
PromServer *prom_start(int port, char *err, size_t errlen);
/* Adds a gauge (value NaN until set) or, when it exists, sets it. name and help
 * must outlive the server (string literals). At most PROM_MAX_GAUGES. */
void prom_gauge(PromServer *s, const char *name, const char *help, double value);
/* The exposition text as GET /metrics answers it (malloc'ed). */
char *prom_render(PromServer *s);
int prom_port(const PromServer *s);
void prom_stop(PromServer *s);

#define PROM_MAX_GAUGES 32

#ifdef __cplusplus
}
#endif
#endif
