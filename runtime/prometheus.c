#include "runtime/prometheus.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/check.h"
#include "runtime/log.h"

enum { POLL_MS = 200, REQUEST_TIMEOUT_MS = 2000, REQUEST_MAX = 8192 };

typedef struct {
    const char *name, *help;
    PromType type;
    int has_value; /* absent from the exposition until set */
    double value;
} Metric;

struct PromServer {
    int fd, port;
    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t lock;
    Metric metrics[PROM_MAX_METRICS];
    int n_metrics;
};

/* The metric called name, or NULL; with the lock held. */
static Metric *find_metric(PromServer *s, const char *name) {
    for (int i = 0; i < s->n_metrics; i++)
        if (strcmp(s->metrics[i].name, name) == 0) return &s->metrics[i];
    return NULL;
}

void prom_declare(PromServer *s, const char *name, const char *help, PromType type) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    if (find_metric(s, name)) TC_FATAL("prometheus: %s declared twice", name);
    if (s->n_metrics == PROM_MAX_METRICS) TC_FATAL("prometheus: more than %d metrics", PROM_MAX_METRICS);
    s->metrics[s->n_metrics++] = (Metric){name, help, type, 0, 0};
    pthread_mutex_unlock(&s->lock);
}

void prom_set(PromServer *s, const char *name, double value) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    Metric *m = find_metric(s, name);
    if (!m) TC_FATAL("prometheus: %s set but never declared", name);
    m->value = value;
    m->has_value = 1;
    pthread_mutex_unlock(&s->lock);
}

/* The fewest digits (15 to 17) that read back as v: 129.421, not 129.42099999999999. */
static const char *shortest_text(double v, char *buf, size_t n) {
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

char *prom_render(PromServer *s) {
    char value[32];
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) TC_FATAL("out of host memory");
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_metrics; i++) {
        const Metric *m = &s->metrics[i];
        if (!m->has_value) continue;
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s ", m->name, m->help, m->name,
                m->type == PROM_COUNTER ? "counter" : "gauge", m->name);
        if (isnan(m->value)) fputs("NaN\n", f);
        else if (isinf(m->value)) fputs(m->value > 0 ? "+Inf\n" : "-Inf\n", f);
        else fprintf(f, "%s\n", shortest_text(m->value, value, sizeof value));
    }
    pthread_mutex_unlock(&s->lock);
    if (fclose(f) != 0) TC_FATAL("out of host memory");
    return out;
}

int prom_port(const PromServer *s) { return s ? s->port : 0; }

static void send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        struct pollfd pfd = {fd, POLLOUT, 0};
        if (poll(&pfd, 1, REQUEST_TIMEOUT_MS) <= 0) return;
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

/* Reads the request head (bounded in size and time) and answers it. */
static void serve_one(PromServer *s, int fd) {
    char req[REQUEST_MAX + 1];
    size_t n = 0;
    req[0] = 0;
    int waited_ms = 0;
    while (n < REQUEST_MAX && !strstr(req, "\r\n\r\n") && !strstr(req, "\n\n") && waited_ms < REQUEST_TIMEOUT_MS) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, POLL_MS);
        if (r == 0) {
            waited_ms += POLL_MS;
            if (atomic_load(&s->stop)) return;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return;
        ssize_t got = recv(fd, req + n, REQUEST_MAX - n, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
        req[n] = 0;
    }
    req[n] = 0;
    const char *status = "200 OK", *type = "text/plain; version=0.0.4; charset=utf-8";
    char *body = NULL;
    if (strncmp(req, "GET /metrics ", 13) == 0 || strncmp(req, "GET /metrics?", 13) == 0) {
        body = prom_render(s);
    } else {
        status = strncmp(req, "GET ", 4) == 0 ? "404 Not Found" : "405 Method Not Allowed";
        type = "text/plain; charset=utf-8";
        body = malloc(64);
        if (!body) return;
        snprintf(body, 64, "trainc serves GET /metrics\n");
    }
    char head[256];
    int h = snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, type, strlen(body));
    send_all(fd, head, (size_t)h);
    send_all(fd, body, strlen(body));
    free(body);
}

static void *server_main(void *arg) {
    PromServer *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd pfd = {s->fd, POLLIN, 0};
        int r = poll(&pfd, 1, POLL_MS);
        if (r <= 0) continue;
        int c = accept(s->fd, NULL, NULL);
        if (c < 0) continue;
        serve_one(s, c);
        close(c);
    }
    return NULL;
}

PromServer *prom_start(int port, char *err, size_t errlen) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return NULL;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 8) != 0) {
        snprintf(err, errlen, "cannot listen on 127.0.0.1:%d: %s", port, strerror(errno));
        close(fd);
        return NULL;
    }
    socklen_t len = sizeof addr;
    getsockname(fd, (struct sockaddr *)&addr, &len);
    PromServer *s = calloc(1, sizeof *s);
    if (!s) TC_FATAL("out of host memory");
    s->fd = fd;
    s->port = ntohs(addr.sin_port);
    atomic_init(&s->stop, 0);
    pthread_mutex_init(&s->lock, NULL);
    if (pthread_create(&s->thread, NULL, server_main, s) != 0) TC_FATAL("pthread_create failed");
    return s;
}

void prom_stop(PromServer *s) {
    if (!s) return;
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
    close(s->fd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
