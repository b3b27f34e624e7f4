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
#include <time.h>
#include <unistd.h>

#include "runtime/check.h"
#include "runtime/log.h"

/* A connection gets CONN_DEADLINE_MS from its accept to send its request and
 * take the answer; MAX_CONNS are served at once. */
enum { POLL_MS = 100, CONN_DEADLINE_MS = 2000, REQUEST_MAX = 8192, MAX_CONNS = 16 };

typedef struct {
    const char *name, *help;
    PromType type;
    int has_value; /* absent from the exposition until set */
    double value;
} Metric;

/* One client: its request head as read so far, then the answer as sent so far.
 * Whatever it does, it is closed at its deadline, counted from its accept. */
typedef struct {
    int fd; /* -1: a free slot */
    double deadline;
    size_t n;
    char *reply; /* NULL while the request is read */
    size_t reply_len, sent;
    char req[REQUEST_MAX + 1];
} Conn;

struct PromServer {
    int fd, port;
    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t lock;
    Metric metrics[PROM_MAX_METRICS];
    int n_metrics;
    Conn conns[MAX_CONNS];
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

/* ---- serving ----------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void conn_close(Conn *c) {
    if (c->fd < 0) return;
    close(c->fd);
    free(c->reply);
    c->fd = -1;
    c->reply = NULL;
}

/* The answer to the request head in req, malloc'ed; its length in *len. */
static char *answer(PromServer *s, const char *req, size_t *len) {
    const char *status = "200 OK", *type = "text/plain; version=0.0.4; charset=utf-8", *allow = "";
    char *body;
    if (strncmp(req, "GET /metrics ", 13) == 0 || strncmp(req, "GET /metrics?", 13) == 0) {
        body = prom_render(s);
    } else {
        int get = strncmp(req, "GET ", 4) == 0;
        status = get ? "404 Not Found" : "405 Method Not Allowed";
        allow = get ? "" : "Allow: GET\r\n";
        type = "text/plain; charset=utf-8";
        body = strdup("trainc serves GET /metrics\n");
        if (!body) TC_FATAL("out of host memory");
    }
    char *out = NULL;
    FILE *f = open_memstream(&out, len);
    if (!f) TC_FATAL("out of host memory");
    fprintf(f, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n%s", status,
            type, strlen(body), allow, body);
    if (fclose(f) != 0) TC_FATAL("out of host memory");
    free(body);
    return out;
}

/* Reads what the client sent; answers once the head is whole (or cut off by
 * its size or the client's end of sending). */
static void conn_read(PromServer *s, Conn *c) {
    ssize_t got = recv(c->fd, c->req + c->n, REQUEST_MAX - c->n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got < 0) {
        conn_close(c);
        return;
    }
    c->n += (size_t)got;
    c->req[c->n] = 0;
    if (got == 0 || c->n == REQUEST_MAX || strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n"))
        c->reply = answer(s, c->req, &c->reply_len);
}

static void conn_write(Conn *c) {
    ssize_t w = send(c->fd, c->reply + c->sent, c->reply_len - c->sent, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (w <= 0) {
        conn_close(c);
        return;
    }
    c->sent += (size_t)w;
    if (c->sent == c->reply_len) conn_close(c);
}

/* Takes the waiting connections; with every slot busy, the one accepted first
 * makes room (a slow client can hold a slot only until a newer one comes). */
static void accept_all(PromServer *s, double now) {
    for (;;) {
        int fd = accept4(s->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        Conn *slot = NULL;
        for (int i = 0; i < MAX_CONNS; i++) {
            Conn *c = &s->conns[i];
            if (c->fd < 0) {
                slot = c;
                break;
            }
            if (!slot || c->deadline < slot->deadline) slot = c;
        }
        conn_close(slot);
        slot->fd = fd;
        slot->deadline = now + CONN_DEADLINE_MS / 1000.0;
        slot->n = slot->reply_len = slot->sent = 0;
        slot->req[0] = 0;
    }
}

/* All connections at once: poll over them, at most POLL_MS at a time, the stop
 * flag and every deadline checked on each pass. */
static void *server_main(void *arg) {
    PromServer *s = arg;
    struct pollfd pfd[MAX_CONNS + 1];
    while (!atomic_load(&s->stop)) {
        pfd[0] = (struct pollfd){s->fd, POLLIN, 0};
        for (int i = 0; i < MAX_CONNS; i++) {
            Conn *c = &s->conns[i];
            pfd[i + 1] = (struct pollfd){c->fd, (short)(c->reply ? POLLOUT : POLLIN), 0};
        }
        if (poll(pfd, MAX_CONNS + 1, POLL_MS) < 0 && errno != EINTR) continue;
        double now = now_s();
        for (int i = 0; i < MAX_CONNS; i++) {
            Conn *c = &s->conns[i];
            if (c->fd >= 0 && pfd[i + 1].revents) c->reply ? conn_write(c) : conn_read(s, c);
            if (c->fd >= 0 && now >= c->deadline) conn_close(c);
        }
        if (pfd[0].revents & POLLIN) accept_all(s, now);
    }
    for (int i = 0; i < MAX_CONNS; i++) conn_close(&s->conns[i]);
    return NULL;
}

PromServer *prom_start(int port, char *err, size_t errlen) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
    for (int i = 0; i < MAX_CONNS; i++) s->conns[i].fd = -1;
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
