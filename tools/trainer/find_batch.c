/* trainc find-batch --config FILE [--set k=v]... [--device D] [--max-batch N]
 *
 * Starting at the config's train.batch, doubles the batch until a run fails for
 * lack of memory, samples/s grows by less than 5% over the size before, or the
 * next size would pass --max-batch (default 65536), or an activation would pass
 * cuDNN's 2^31 elements per tensor. Each size is a child
 * trainc (this binary, /proc/self/exe) of 30 steps on a batch kept on the
 * device (data.resident = on, no evaluation, 10 warm-up steps), so a size
 * that runs out of memory takes only its own process down. Prints a table of
 * batch, samples/s and peak memory, and the best batch (highest samples/s). */
#include "tools/trainer/find_batch.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cJSON.h>

#include "runtime/check.h"
#include "tools/trainer/settings.h"

enum { MAX_ARGS = 256, TAIL = 1 << 16, TRIAL_STEPS = 30, TRIAL_WARMUP = 10 };
#define MIN_GAIN 1.05

typedef struct {
    int ran;                  /* exit status 0 and a summary line */
    int out_of_memory;        /* failed with "out of GPU memory" (or host memory) */
    int too_large;            /* an activation passes cuDNN's 2^31 elements per tensor */
    int status;               /* exit status, or 128 + signal */
    double samples_per_s, peak_mem_bytes;
    char why[512];            /* a failure's last stderr line */
} Trial;

static volatile sig_atomic_t interrupted;
static void on_signal(int signo) { interrupted = signo; }

static void usage(FILE *f) {
    fprintf(f, "usage: trainc find-batch --config FILE [--set section.key=value]... [--device cpu|cuda]\n"
               "                         [--max-batch N]\n"
               "  doubles train.batch from the config's until out of memory, samples/s grows by less than\n"
               "  5%%, or N (default 65536); each size is a %d-step child run on a resident batch\n",
            TRIAL_STEPS);
}

/* Appends what fd has to buf (keeping the last TAIL bytes); 0 at end of file. */
static int drain(int fd, char *buf, size_t *len) {
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0) return errno == EINTR || errno == EAGAIN;
    if (n == 0) return 0;
    if (*len + (size_t)n > TAIL) {
        size_t drop = *len + (size_t)n - TAIL;
        if (drop > *len) drop = *len;
        memmove(buf, buf + drop, *len - drop);
        *len -= drop;
    }
    memcpy(buf + *len, chunk, (size_t)n);
    *len += (size_t)n;
    buf[*len] = 0;
    return 1;
}

int find_batch_read_summary(const char *line, double *samples_per_s, double *peak_mem_bytes) {
    cJSON *summary = cJSON_Parse(line);
    const cJSON *sps = cJSON_GetObjectItemCaseSensitive(summary, "samples_per_s");
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(summary, "peak_mem_bytes");
    int ok = cJSON_IsNumber(sps) && cJSON_IsNumber(peak);
    if (ok) {
        *samples_per_s = sps->valuedouble;
        *peak_mem_bytes = peak->valuedouble;
    }
    cJSON_Delete(summary);
    return ok ? 0 : -1;
}

void find_batch_gain_reason(char *out, size_t n, long batch, double samples_per_s, double prev_samples_per_s) {
    double gain = 100 * (samples_per_s / prev_samples_per_s - 1);
    if (gain >= 0)
        snprintf(out, n, "batch %ld gave %.1f%% more samples/s than batch %ld (less than 5%%)", batch, gain,
                 batch / 2);
    else
        snprintf(out, n, "batch %ld was %.1f%% slower than batch %ld (fewer samples/s)", batch, -gain, batch / 2);
}

/* The last line of text that starts with '{' (cut at its newline), or NULL. */
static char *last_json_line(char *text) {
    char *found = NULL;
    for (char *line = text; line && *line; ) {
        char *nl = strchr(line, '\n');
        if (*line == '{') found = line;
        line = nl ? nl + 1 : NULL;
    }
    if (found) {
        char *nl = strchr(found, '\n');
        if (nl) *nl = 0;
    }
    return found;
}

static void last_line(const char *text, char *out, size_t n) {
    size_t len = strlen(text);
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    size_t start = len;
    while (start && text[start - 1] != '\n') start--;
    snprintf(out, n, "%.*s", (int)(len - start), text + start);
}

/* Runs one size as a child trainc, its stdout and stderr read through pipes. */
static void run_trial(char **base, int n_base, int batch, Trial *t) {
    static char out[TAIL + 1], err[TAIL + 1];
    char batch_set[64];
    char *argv[MAX_ARGS + 32];
    int argc = 0;
    memset(t, 0, sizeof *t);
    snprintf(batch_set, sizeof batch_set, "train.batch=%d", batch);
    argv[argc++] = "trainc";
    for (int i = 0; i < n_base; i++) argv[argc++] = base[i];
    char *fixed[] = {batch_set, "data.resident=on", "run.eval=off", "run.max_steps=30", "run.warmup_steps=10",
                     "run.epochs=1000000", "run.checkpoint_every=0", "run.save_final=off", "run.metrics_file=",
                     "run.resume=", "run.profile_steps=", "monitor.prometheus_port=0"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
        argv[argc++] = "--set";
        argv[argc++] = fixed[i];
    }
    argv[argc++] = "--quiet";
    argv[argc] = NULL;

    int po[2], pe[2];
    if (pipe(po) != 0 || pipe(pe) != 0) {
        snprintf(t->why, sizeof t->why, "pipe: %s", strerror(errno));
        t->status = -1;
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(t->why, sizeof t->why, "fork: %s", strerror(errno));
        t->status = -1;
        return;
    }
    if (pid == 0) {
        setpgid(0, 0); /* a terminal's ^C goes to find-batch, which ends the child */
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]);
        close(po[1]);
        close(pe[0]);
        close(pe[1]);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "trainc find-batch: cannot run /proc/self/exe: %s\n", strerror(errno));
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    size_t out_len = 0, err_len = 0;
    out[0] = err[0] = 0;
    struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0) {
        if (interrupted) {
            kill(pid, SIGKILL);
            break;
        }
        int r = poll(fds, 2, 200);
        if (r < 0 && errno != EINTR) break;
        for (int i = 0; i < 2 && r > 0; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            int more = i == 0 ? drain(fds[i].fd, out, &out_len) : drain(fds[i].fd, err, &err_len);
            if (!more) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0) close(fds[i].fd);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    t->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    t->out_of_memory = strstr(err, "out of GPU memory") != NULL || strstr(err, "out of host memory") != NULL;
    t->too_large = strstr(err, "more than the 2^31 a cuDNN tensor") != NULL;
    char *summary = last_json_line(out);
    if (t->status == 0 && summary &&
        find_batch_read_summary(summary, &t->samples_per_s, &t->peak_mem_bytes) == 0) {
        t->ran = 1;
    } else if (t->status == 0) {
        snprintf(t->why, sizeof t->why, "exit status 0 but no summary with samples_per_s and peak_mem_bytes");
    } else {
        last_line(err, t->why, sizeof t->why);
        if (!t->why[0]) snprintf(t->why, sizeof t->why, "exit status %d and no summary", t->status);
    }
}

int find_batch_main(int argc, char **argv) {
    const char *ini_path = NULL;
    char *base[MAX_ARGS];
    int n_base = 0;
    long max_batch = 65536;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--config") == 0 || strcmp(a, "--set") == 0 || strcmp(a, "--device") == 0 ||
            strcmp(a, "--max-batch") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "trainc find-batch: error: missing value after %s\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (strcmp(a, "--max-batch") == 0) {
                char *end;
                max_batch = strtol(v, &end, 10);
                if (*end || max_batch < 1 || max_batch > 1 << 20) {
                    fprintf(stderr, "trainc find-batch: error: --max-batch %s: must be between 1 and 1048576\n", v);
                    return 2;
                }
                continue;
            }
            if (strcmp(a, "--config") == 0) ini_path = v;
            if (n_base + 2 > MAX_ARGS) {
                fprintf(stderr, "trainc find-batch: error: too many arguments\n");
                return 2;
            }
            base[n_base++] = argv[i - 1];
            base[n_base++] = argv[i];
        } else if (strcmp(a, "--quiet") == 0) {
            /* children always run quiet */
        } else {
            fprintf(stderr, "trainc find-batch: error: unknown argument: %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!ini_path) {
        fprintf(stderr, "trainc find-batch: error: --config FILE is required\n");
        usage(stderr);
        return 2;
    }
    /* The config is checked here first, so that a typo is one message, not a failed size. */
    char *assignments[MAX_ARGS];
    int n_assignments = 0;
    for (int i = 0; i < n_base; i += 2) {
        if (strcmp(base[i], "--config") == 0) continue;
        const char *prefix = strcmp(base[i], "--device") == 0 ? "run.device=" : "";
        char *assignment = malloc(strlen(prefix) + strlen(base[i + 1]) + 1);
        if (!assignment) TC_FATAL("out of memory");
        assignments[n_assignments++] = strcat(strcpy(assignment, prefix), base[i + 1]);
    }
    char *err = NULL;
    long batch = 0;
    int rc = settings_peek_batch(ini_path, assignments, n_assignments, &batch, &err);
    for (int i = 0; i < n_assignments; i++) free(assignments[i]);
    if (rc != 0) {
        fprintf(stderr, "trainc: error: %s\n", err);
        return 1;
    }
    if (batch < 1 || batch > max_batch) {
        fprintf(stderr, "trainc find-batch: error: train.batch = %ld: must be between 1 and --max-batch %ld\n",
                batch, max_batch);
        return 2;
    }

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    printf("find-batch: %s, train.batch doubling from %ld up to %ld; each size %d steps on a resident batch "
           "(%d warm-up)\n", ini_path, batch, max_batch, TRIAL_STEPS, TRIAL_WARMUP);
    printf("%10s %14s %14s\n", "batch", "samples/s", "peak MiB");
    fflush(stdout);
    long best_batch = 0;
    double best_sps = 0, best_mem = 0, prev_sps = 0;
    const char *why_stopped = NULL;
    char reason[700];
    for (;; batch *= 2) {
        if (batch > max_batch) {
            snprintf(reason, sizeof reason, "the next size would pass --max-batch %ld", max_batch);
            why_stopped = reason;
            break;
        }
        Trial t;
        run_trial(base, n_base, (int)batch, &t);
        if (interrupted) {
            printf("%10ld %14s\n", batch, "interrupted");
            why_stopped = "interrupted";
            break;
        }
        if (!t.ran) {
            printf("%10ld %14s\n", batch, t.out_of_memory ? "out of memory" : t.too_large ? "cuDNN limit" : "failed");
            if (t.out_of_memory) {
                snprintf(reason, sizeof reason, "out of memory at batch %ld", batch);
            } else if (t.too_large) {
                snprintf(reason, sizeof reason, "at batch %ld an activation passes cuDNN's 2^31 elements per tensor",
                         batch);
            } else {
                fprintf(stderr, "trainc find-batch: batch %ld failed: %s\n", batch, t.why);
                snprintf(reason, sizeof reason, "batch %ld failed (exit status %d)", batch, t.status);
            }
            why_stopped = reason;
            break;
        }
        printf("%10ld %14.1f %14.1f\n", batch, t.samples_per_s, t.peak_mem_bytes / 1048576.0);
        fflush(stdout);
        if (t.samples_per_s > best_sps) {
            best_sps = t.samples_per_s;
            best_batch = batch;
            best_mem = t.peak_mem_bytes;
        }
        if (prev_sps > 0 && t.samples_per_s < MIN_GAIN * prev_sps) {
            find_batch_gain_reason(reason, sizeof reason, batch, t.samples_per_s, prev_sps);
            why_stopped = reason;
            break;
        }
        prev_sps = t.samples_per_s;
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    printf("stopped: %s\n", why_stopped);
    if (!best_batch) {
        printf("no batch size ran\n");
        return interrupted ? 128 + interrupted : 1;
    }
    printf("best batch: %ld (%.1f samples/s, %.1f MiB peak)\n", best_batch, best_sps, best_mem / 1048576.0);
    fflush(stdout);
    return interrupted ? 128 + interrupted : 0;
}
