/* trainc profile's kernels section (profile.h): CUPTI's records of the window
 * (runtime/cupti_activity.h) summed per step, printed, and put in the trace.
 *
 * The window's records: those whose launching API call (matched by
 * correlation id) started between the CUPTI timestamps taken at the first
 * step's begin and the last step's end. So the kernels the last step queued
 * count even where they run after the host's step_end, and the read-backs
 * after the run do not. A record with no API call of its own (CUPTI recorded
 * none: internal launches) counts when it starts inside the window. */
#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/cupti_activity.h"
#include "runtime/log.h"
#include "tools/trainer/profile.h"

/* ---- spans ----------------------------------------------------------------------- */

static int by_start(const void *a, const void *b) {
    const ProfileSpan *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

long profile_spans_merge(ProfileSpan *s, long n) {
    if (n == 0) return 0;
    qsort(s, (size_t)n, sizeof *s, by_start);
    long out = 0;
    for (long i = 1; i < n; i++) {
        if (s[i].start <= s[out].end) {
            if (s[i].end > s[out].end) s[out].end = s[i].end;
        } else {
            s[++out] = s[i];
        }
    }
    return out + 1;
}

uint64_t profile_spans_length(const ProfileSpan *s, long n) {
    uint64_t sum = 0;
    for (long i = 0; i < n; i++) sum += s[i].end - s[i].start;
    return sum;
}

uint64_t profile_spans_gaps(const ProfileSpan *merged, long n, uint64_t *longest) {
    uint64_t sum = 0;
    *longest = 0;
    for (long i = 1; i < n; i++) {
        uint64_t gap = merged[i].start - merged[i - 1].end;
        sum += gap;
        if (gap > *longest) *longest = gap;
    }
    return sum;
}

/* The first of merged's spans that ends after t (n_merged if none). */
static long first_ending_after(const ProfileSpan *merged, long n_merged, uint64_t t) {
    long lo = 0, hi = n_merged;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (merged[mid].end <= t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

uint64_t profile_spans_overlap(const ProfileSpan *s, long n, const ProfileSpan *merged, long n_merged) {
    uint64_t sum = 0;
    for (long i = 0; i < n; i++)
        for (long j = first_ending_after(merged, n_merged, s[i].start); j < n_merged && merged[j].start < s[i].end;
             j++) {
            uint64_t lo = s[i].start > merged[j].start ? s[i].start : merged[j].start;
            uint64_t hi = s[i].end < merged[j].end ? s[i].end : merged[j].end;
            sum += hi - lo;
        }
    return sum;
}

/* ---- the run --------------------------------------------------------------------- */

struct ProfileKernelsRun {
    ProfileKernels *k;
    uint32_t compute_stream;
    uint64_t begin_ns, end_ns;  /* the window on CUPTI's clock */
    double begin_host;          /* now_seconds() at begin_ns */
    int have_window;
    GpuActivity *win;           /* the window's records, after collect */
    long n_win;
    GpuApiCall *win_api;        /* its launch and sync calls */
    long n_win_api;
};

/* CUPTI failed: the section says why, and the run goes on without it. */
static void give_up(ProfileKernelsRun *kr) {
    ProfileKernels *k = kr->k;
    memset(k, 0, sizeof *k);
    snprintf(k->why_not, sizeof k->why_not, "%s", gpu_activity_why());
    log_warn("profile: kernels not available: %s", k->why_not);
    gpu_activity_close();
    kr->have_window = -1;
}

ProfileKernelsRun *profile_kernels_open(int gpu, ProfileKernels *k) {
    memset(k, 0, sizeof *k);
    if (!gpu) {
        snprintf(k->why_not, sizeof k->why_not, "a CPU run (CUPTI records a GPU's kernels)");
        return NULL;
    }
    ProfileKernelsRun *kr = calloc(1, sizeof *kr);
    if (!kr) TC_FATAL("out of host memory: the profile's kernels");
    kr->k = k;
    if (gpu_activity_open() != 0) {
        give_up(kr);
        free(kr);
        return NULL;
    }
    return kr;
}

void profile_kernels_window_begin(ProfileKernelsRun *kr, cudaStream_t compute) {
    if (!kr || kr->have_window < 0) return;
    if (gpu_activity_stream_id(compute, &kr->compute_stream) != 0 || gpu_activity_timestamp(&kr->begin_ns) != 0)
        return give_up(kr);
    kr->begin_host = now_seconds();
}

void profile_kernels_window_end(ProfileKernelsRun *kr) {
    if (!kr || kr->have_window < 0) return;
    if (gpu_activity_timestamp(&kr->end_ns) != 0) return give_up(kr);
    kr->have_window = 1;
}

/* ---- matching records to the window ---------------------------------------------- */

typedef struct {
    uint32_t correlation;
    uint8_t driver;
    uint64_t start;
} ApiStart;

static int by_correlation(const void *a, const void *b) {
    const ApiStart *x = a, *y = b;
    if (x->correlation != y->correlation) return (x->correlation > y->correlation) - (x->correlation < y->correlation);
    return x->driver - y->driver; /* the runtime's call first */
}

/* The first of calls (sorted) with this correlation id, or NULL. */
static const ApiStart *find_call(const ApiStart *calls, long n, uint32_t correlation) {
    long lo = 0, hi = n;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (calls[mid].correlation < correlation) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && calls[lo].correlation == correlation ? &calls[lo] : NULL;
}

static int in_window(const ProfileKernelsRun *kr, uint64_t t) { return t >= kr->begin_ns && t <= kr->end_ns; }

static void select_window(ProfileKernelsRun *kr) {
    long n_act, n_api;
    const GpuActivity *act = gpu_activity_records(&n_act);
    const GpuApiCall *api = gpu_activity_api_calls(&n_api);
    ApiStart *calls = malloc((size_t)(n_api + 1) * sizeof *calls);
    kr->win = malloc((size_t)(n_act + 1) * sizeof *kr->win);
    kr->win_api = malloc((size_t)(n_api + 1) * sizeof *kr->win_api);
    if (!calls || !kr->win || !kr->win_api) TC_FATAL("out of host memory: the profile's kernels");
    for (long i = 0; i < n_api; i++) calls[i] = (ApiStart){api[i].correlation, api[i].driver, api[i].start};
    qsort(calls, (size_t)n_api, sizeof *calls, by_correlation);
    for (long i = 0; i < n_act; i++) {
        const ApiStart *c = find_call(calls, n_api, act[i].correlation);
        if (in_window(kr, c ? c->start : act[i].start)) kr->win[kr->n_win++] = act[i];
    }
    /* A runtime call that enters the driver leaves a driver record with its
     * correlation id: only driver calls of their own (NCCL's launches) count. */
    for (long i = 0; i < n_api; i++) {
        const GpuApiCall *a = &api[i];
        if (a->api_class == GPU_API_OTHER || !in_window(kr, a->start)) continue;
        if (a->driver && find_call(calls, n_api, a->correlation)->driver == 0) continue;
        kr->win_api[kr->n_win_api++] = *a;
    }
    free(calls);
}

/* ---- the figures ------------------------------------------------------------------ */

static ProfileSpan span_of(const GpuActivity *a) { return (ProfileSpan){a->start, a->end}; }
static int is_comm(const GpuActivity *a) {
    return (a->kind == GPU_ACT_KERNEL && !strncmp(a->name, "nccl", 4)) ||
           (a->kind == GPU_ACT_COPY && a->copy == GPU_COPY_PEER);
}
static double ms_per_step(uint64_t ns, long steps) { return ns / 1e6 / steps; }

typedef struct {
    const char *name;
    uint64_t ns;
    long count;
} NameTime;

static int by_name_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const NameTime *)a)->name, y = (uintptr_t)((const NameTime *)b)->name;
    return (x > y) - (x < y);
}
static int by_ns_desc(const void *a, const void *b) {
    uint64_t x = ((const NameTime *)a)->ns, y = ((const NameTime *)b)->ns;
    return (x < y) - (x > y);
}

/* The ten kernel names with the most time (names are interned: equal pointers). */
static void longest_kernels(const ProfileKernelsRun *kr, long steps, ProfileKernels *k) {
    NameTime *t = calloc((size_t)kr->n_win + 1, sizeof *t);
    if (!t) TC_FATAL("out of host memory: the profile's kernels");
    long n = 0;
    for (long i = 0; i < kr->n_win; i++)
        if (kr->win[i].kind == GPU_ACT_KERNEL)
            t[n++] = (NameTime){kr->win[i].name, kr->win[i].end - kr->win[i].start, 1};
    qsort(t, (size_t)n, sizeof *t, by_name_ptr);
    long names = 0;
    for (long i = 0; i < n; i++) {
        if (names && t[names - 1].name == t[i].name) {
            t[names - 1].ns += t[i].ns;
            t[names - 1].count++;
        } else {
            t[names++] = t[i];
        }
    }
    qsort(t, (size_t)names, sizeof *t, by_ns_desc);
    for (long i = 0; i < names && i < PROFILE_TOP_KERNELS; i++) {
        ProfileKernelName *kn = &k->longest[i];
        snprintf(kn->name, sizeof kn->name, "%s", t[i].name);
        kn->count = (t[i].count + steps / 2) / steps; /* rounded: a kernel not in every step still shows */
        kn->ms = ms_per_step(t[i].ns, steps);
    }
    free(t);
}

static int by_stream(const void *a, const void *b) {
    uint32_t x = ((const GpuActivity *)a)->stream, y = ((const GpuActivity *)b)->stream;
    return (x > y) - (x < y);
}
static int compute_then_busiest(const void *a, const void *b) {
    const ProfileStream *x = a, *y = b;
    if (x->compute != y->compute) return y->compute - x->compute;
    return (x->busy_ms < y->busy_ms) - (x->busy_ms > y->busy_ms);
}

/* Busy time per stream (the union of its records). Sorts kr->win by stream. */
static void stream_figures(ProfileKernelsRun *kr, long steps, ProfileSpan *spans, ProfileKernels *k) {
    qsort(kr->win, (size_t)kr->n_win, sizeof *kr->win, by_stream);
    ProfileStream all[64];
    int n_all = 0;
    for (long i = 0, j; i < kr->n_win; i = j) {
        long n = 0;
        for (j = i; j < kr->n_win && kr->win[j].stream == kr->win[i].stream; j++) spans[n++] = span_of(&kr->win[j]);
        n = profile_spans_merge(spans, n);
        int compute = kr->win[i].stream == kr->compute_stream;
        k->streams_seen++;
        ProfileStream st = {kr->win[i].stream, compute, ms_per_step(profile_spans_length(spans, n), steps)};
        if (n_all < 64) all[n_all++] = st;
        else if (compute) all[63] = st;
    }
    qsort(all, (size_t)n_all, sizeof *all, compute_then_busiest);
    k->n_streams = n_all < PROFILE_MAX_STREAMS ? n_all : PROFILE_MAX_STREAMS;
    memcpy(k->streams, all, (size_t)k->n_streams * sizeof *all);
}

/* Kernels, copies, overlaps and communication: spans of kernels (merged),
 * of compute kernels on any stream (merged: work beside the compute stream,
 * such as perf.overlap_wgrad's, hides communication too), of copies to and
 * from the host, of communication, and of every record (the GPU's idle time). */
static void device_figures(const ProfileKernelsRun *kr, long steps, ProfileSpan *buf, ProfileKernels *k) {
    long n = kr->n_win;
    ProfileSpan *kernels = buf, *compute = buf + n, *host_copies = buf + 2 * n, *comm = buf + 3 * n;
    ProfileSpan *every = buf + 4 * n;
    long nk = 0, nc = 0, nh = 0, nm = 0;
    uint64_t first = UINT64_MAX, last = 0, kernel_ns = 0, h2d = 0, d2h = 0;
    for (long i = 0; i < n; i++) {
        const GpuActivity *a = &kr->win[i];
        ProfileSpan s = span_of(a);
        every[i] = s;
        if (a->start < first) first = a->start;
        if (a->end > last) last = a->end;
        if (is_comm(a)) comm[nm++] = s;
        if (a->kind == GPU_ACT_KERNEL) {
            k->kernels++;
            kernel_ns += s.end - s.start;
            kernels[nk++] = s;
            if (!is_comm(a)) compute[nc++] = s;
        } else if (a->kind == GPU_ACT_COPY) {
            k->copies++;
            if (a->copy == GPU_COPY_H2D) h2d += s.end - s.start, host_copies[nh++] = s;
            if (a->copy == GPU_COPY_D2H) d2h += s.end - s.start, host_copies[nh++] = s;
        } else {
            k->memsets++;
        }
    }
    k->window_ms = n ? ms_per_step(last - first, steps) : 0;
    k->mean_kernel_us = k->kernels ? kernel_ns / 1e3 / k->kernels : 0;
    k->kernels /= steps, k->copies /= steps, k->memsets /= steps;
    k->kernel_ms = ms_per_step(kernel_ns, steps);
    k->h2d_ms = ms_per_step(h2d, steps);
    k->d2h_ms = ms_per_step(d2h, steps);
    uint64_t comm_ns = profile_spans_length(comm, nm);
    k->comm_ms = ms_per_step(comm_ns, steps);
    nk = profile_spans_merge(kernels, nk);
    nc = profile_spans_merge(compute, nc);
    k->active_ms = ms_per_step(profile_spans_length(kernels, nk), steps);
    k->copy_overlap_ms = ms_per_step(profile_spans_overlap(host_copies, nh, kernels, nk), steps);
    k->comm_exposed_ms = ms_per_step(comm_ns - profile_spans_overlap(comm, nm, compute, nc), steps);
    uint64_t longest_idle;
    k->idle_ms = ms_per_step(profile_spans_gaps(every, profile_spans_merge(every, n), &longest_idle), steps);
    k->longest_idle_ms = longest_idle / 1e6;
}

static void host_figures(const ProfileKernelsRun *kr, long steps, ProfileKernels *k) {
    uint64_t launch = 0, sync = 0;
    long launches = 0;
    for (long i = 0; i < kr->n_win_api; i++) {
        const GpuApiCall *a = &kr->win_api[i];
        if (a->api_class == GPU_API_LAUNCH) launch += a->end - a->start, launches++;
        else if (a->api_class == GPU_API_SYNC) sync += a->end - a->start;
    }
    k->launch_ms = ms_per_step(launch, steps);
    k->launches = (double)launches / steps;
    k->sync_ms = ms_per_step(sync, steps);
}

void profile_kernels_collect(ProfileKernelsRun *kr, long steps) {
    if (!kr || kr->have_window < 0) return;
    if (!kr->have_window) {
        snprintf(kr->k->why_not, sizeof kr->k->why_not, "the window's steps were not seen");
        return;
    }
    if (gpu_activity_flush() != 0) return give_up(kr);
    ProfileKernels *k = kr->k;
    select_window(kr);
    ProfileSpan *buf = malloc((5 * (size_t)kr->n_win + 1) * sizeof *buf);
    if (!buf) TC_FATAL("out of host memory: the profile's kernels");
    device_figures(kr, steps, buf, k);
    longest_kernels(kr, steps, k);
    host_figures(kr, steps, k);
    stream_figures(kr, steps, buf, k);
    free(buf);
    k->dropped = gpu_activity_dropped();
    k->available = 1;
}

/* ---- the trace -------------------------------------------------------------------- */

enum { TID_CUDA_API = 999, TID_STREAM_BASE = 1000 };

static cJSON *add_event(cJSON *events, const char *name, const char *ph, int pid, int tid) {
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToArray(events, e)) TC_FATAL("out of host memory writing the trace");
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "ph", ph);
    cJSON_AddNumberToObject(e, "pid", pid);
    cJSON_AddNumberToObject(e, "tid", tid);
    return e;
}

static cJSON *add_args(cJSON *e) {
    cJSON *args = cJSON_AddObjectToObject(e, "args");
    if (!args) TC_FATAL("out of host memory writing the trace");
    return args;
}

/* An "X" event from CUPTI's ns, on the host's time line: ts in us from base_host. */
static cJSON *add_span(const ProfileKernelsRun *kr, cJSON *events, const char *name, const char *cat, int pid,
                       int tid, uint64_t start, uint64_t end, double base_host) {
    cJSON *e = add_event(events, name, "X", pid, tid);
    double host = kr->begin_host + ((double)start - (double)kr->begin_ns) / 1e9;
    cJSON_AddStringToObject(e, "cat", cat);
    cJSON_AddNumberToObject(e, "ts", 1e6 * (host - base_host));
    cJSON_AddNumberToObject(e, "dur", (end - start) / 1e3);
    return e;
}

static const char *copy_name(uint8_t copy) {
    static const char *names[] = {"memcpy", "memcpy HtoD", "memcpy DtoH", "memcpy DtoD", "memcpy peer"};
    return copy < sizeof names / sizeof *names ? names[copy] : "memcpy";
}

static void trace_stream_names(const ProfileKernelsRun *kr, cJSON *events, int pid) {
    for (long i = 0; i < kr->n_win; i++) {
        if (i && kr->win[i].stream == kr->win[i - 1].stream) continue; /* sorted by stream */
        char name[64];
        snprintf(name, sizeof name, "stream %u%s", kr->win[i].stream,
                 kr->win[i].stream == kr->compute_stream ? " (compute)" : "");
        cJSON_AddStringToObject(add_args(add_event(events, "thread_name", "M", pid,
                                                   TID_STREAM_BASE + (int)kr->win[i].stream)), "name", name);
    }
}

void profile_kernels_trace(const ProfileKernelsRun *kr, cJSON *events, int pid, double base_host) {
    if (!kr || !kr->k->available) return;
    trace_stream_names(kr, events, pid);
    for (long i = 0; i < kr->n_win; i++) {
        const GpuActivity *a = &kr->win[i];
        const char *cat = a->kind == GPU_ACT_KERNEL ? "kernel" : a->kind == GPU_ACT_COPY ? "memcpy" : "memset";
        const char *name = a->kind == GPU_ACT_KERNEL ? a->name
                           : a->kind == GPU_ACT_COPY ? copy_name(a->copy)
                                                     : "memset";
        cJSON *args = add_args(add_span(kr, events, name, cat, pid, TID_STREAM_BASE + (int)a->stream, a->start,
                                        a->end, base_host));
        cJSON_AddNumberToObject(args, "stream", a->stream);
        cJSON_AddNumberToObject(args, "correlation", a->correlation);
        if (a->kind != GPU_ACT_KERNEL) cJSON_AddNumberToObject(args, "bytes", (double)a->bytes);
    }
    if (!kr->n_win_api) return;
    cJSON_AddStringToObject(add_args(add_event(events, "thread_name", "M", pid, TID_CUDA_API)), "name",
                            "host: cuda api (launches, syncs)");
    for (long i = 0; i < kr->n_win_api; i++) {
        const GpuApiCall *a = &kr->win_api[i];
        cJSON *args = add_args(add_span(kr, events, a->name, "cuda api", pid, TID_CUDA_API, a->start, a->end,
                                        base_host));
        cJSON_AddNumberToObject(args, "correlation", a->correlation);
    }
}

void profile_kernels_close(ProfileKernelsRun *kr) {
    if (!kr) return;
    if (kr->have_window >= 0) gpu_activity_close();
    free(kr->win);
    free(kr->win_api);
    free(kr);
}

/* ---- the section ------------------------------------------------------------------ */

void profile_kernels_print(const ProfileReport *r, FILE *f) {
    const ProfileKernels *k = &r->kernels;
    if (!k->available) {
        fprintf(f, "\n== kernels: not available: %s ==\n", k->why_not);
        return;
    }
    fprintf(f, "\n== kernels: the GPU's activity over steps %ld..%ld from CUPTI's records, per step ==\n", r->first,
            r->last);
    fprintf(f, "%.1f kernels, %.1f copies, %.1f memsets; kernels %.4f ms together (mean %.2f us), kernel-active "
            "%.4f ms of the %.4f ms window (%.1f%%)\n", k->kernels, k->copies, k->memsets, k->kernel_ms,
            k->mean_kernel_us, k->active_ms, k->window_ms, k->window_ms > 0 ? 100 * k->active_ms / k->window_ms : 0);
    fprintf(f, "%9s %7s  %s\n", "ms", "count", "kernel (the ten with the most time)");
    for (int i = 0; i < PROFILE_TOP_KERNELS && k->longest[i].name[0]; i++)
        fprintf(f, "%9.4f %7ld  %s\n", k->longest[i].ms, k->longest[i].count, k->longest[i].name);
    for (int i = 0; i < k->n_streams; i++)
        fprintf(f, "stream %u%s busy %.4f ms (%.1f%% of the window)\n", k->streams[i].id,
                k->streams[i].compute ? " (compute)" : "", k->streams[i].busy_ms,
                k->window_ms > 0 ? 100 * k->streams[i].busy_ms / k->window_ms : 0);
    if (k->streams_seen > k->n_streams) fprintf(f, "(%d more streams)\n", k->streams_seen - k->n_streams);
    fprintf(f, "GPU idle (no record on any stream) between the first and last record: %.4f ms, the longest gap "
            "%.4f ms\n", k->idle_ms, k->longest_idle_ms);
    fprintf(f, "copies: H2D %.4f ms, D2H %.4f ms; %.4f ms of them while a kernel ran\n", k->h2d_ms, k->d2h_ms,
            k->copy_overlap_ms);
    fprintf(f, "launches: %.1f calls, %.4f ms of host time in them against %.4f ms of kernels on the GPU\n",
            k->launches, k->launch_ms, k->kernel_ms);
    fprintf(f, "syncs: %.4f ms of host time in synchronizing calls (stream, event and device syncs, synchronous "
            "copies)\n", k->sync_ms);
    if (k->comm_ms > 0)
        fprintf(f, "communication (NCCL kernels, peer copies): %.4f ms, %.4f ms of it while no other kernel ran\n",
                k->comm_ms, k->comm_exposed_ms);
    if (k->dropped) fprintf(f, "warning: CUPTI dropped %ld records: the figures miss them\n", k->dropped);
}
