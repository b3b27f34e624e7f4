/* A Prometheus text endpoint: GET /metrics on 127.0.0.1:port, answered by a
 * background thread from a table of gauges and counters that the training
 * thread sets.
 * Plain sockets; the thread polls over up to 16 connections at once with a
 * short timeout, so prom_stop returns within about 0.1 s. Each connection has
 * 2 s from its accept to send its request and take the answer, however slowly
 * it sends; when all are busy the oldest makes room for a new one, so slow
 * clients cannot keep a scrape out. */
#ifndef TRAINC_PROMETHEUS_H
#define TRAINC_PROMETHEUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct PromServer PromServer;

/* Listens on 127.0.0.1:port; NULL with the reason in err when it cannot. */
PromServer *prom_start(int port, char *err, size_t errlen);
typedef enum { PROM_GAUGE, PROM_COUNTER } PromType;

/* Declares a metric (# HELP, # TYPE gauge or counter), absent from the
 * exposition until its first prom_set. name and help must outlive the server
 * (string literals). At most PROM_MAX_METRICS. A counter's name ends in _total
 * and its value never goes down (a restarted process starts it again). */
void prom_declare(PromServer *s, const char *name, const char *help, PromType type);
/* Sets a declared metric; NaN and inf are exposed as such. */
void prom_set(PromServer *s, const char *name, double value);
/* The exposition text as GET /metrics answers it (malloc'ed). */
char *prom_render(PromServer *s);
int prom_port(const PromServer *s);
void prom_stop(PromServer *s);

#define PROM_MAX_METRICS 32

#ifdef __cplusplus
}
#endif
#endif
