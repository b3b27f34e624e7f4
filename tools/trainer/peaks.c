/* The device's measured peaks and their cache (peaks.h). */
#include "tools/trainer/peaks.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/gemm_cpu.h"
#include "ops/linear.h"
#include "ops/op_context.h"
#include "runtime/check.h"
#include "runtime/files.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

enum { WARMUP_RUNS = 3, TIMED_RUNS = 5 };

/* ---- the CPU -------------------------------------------------------------------- */

/* /proc/cpuinfo's "model name", or "unknown CPU". */
static void cpu_model(char *buf, size_t len) {
    snprintf(buf, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        colon += 1 + (colon[1] == ' ');
        snprintf(buf, len, "%.*s", (int)strcspn(colon, "\n"), colon);
        break;
    }
    fclose(f);
}

static void cpu_device(char *buf, size_t len) {
    char model[200];
    cpu_model(model, sizeof model);
    snprintf(buf, len, "%s, %d BLAS threads", model, cpu_sgemm_threads());
}

static void *host_buffer(size_t bytes, int byte) {
    void *p = malloc(bytes);
    if (!p) TC_FATAL("out of host memory: %zu bytes to measure the CPU's peaks", bytes);
    memset(p, byte, bytes); /* touched: no page faults inside the timing */
    return p;
}

/* Seconds of the best of 'runs' n x n x n GEMMs. */
static double time_cpu_gemm(int n, int runs) {
    OpContext ctx = op_context_cpu();
    LinearShape s = {n, n, n};
    size_t elems = (size_t)n * n;
    float *x = host_buffer(elems * sizeof(float), 0), *w = host_buffer(elems * sizeof(float), 0),
          *b = host_buffer(n * sizeof(float), 0), *y = host_buffer(elems * sizeof(float), 0);
    double best = INFINITY;
    for (int i = 0; i < runs; i++) {
        double t0 = now_seconds();
        linear_forward(&ctx, &s, x, w, b, y);
        best = fmin(best, now_seconds() - t0);
    }
    free(x), free(w), free(b), free(y);
    return best;
}

/* The GEMM grows until one takes 0.05 s (2048 at most): large enough to be
 * compute-bound on any BLAS, short on a slow one. The growing runs are the
 * warm-up; then the best of 3. */
static double cpu_gemm_flops(void) {
    int n = 128;
    while (n < 2048 && time_cpu_gemm(n, 1) < 0.05) n *= 2;
    return (2.0 * n * n * n + (double)n * n) / time_cpu_gemm(n, 3); /* the product and the bias */
}

static double cpu_copy_bytes(void) {
    size_t bytes = (size_t)128 << 20;
    void *src = host_buffer(bytes, 1), *dst = host_buffer(bytes, 0);
    double best = INFINITY;
    for (int i = 0; i <= TIMED_RUNS; i++) {
        double t0 = now_seconds();
        memcpy(dst, src, bytes);
        if (i > 0) best = fmin(best, now_seconds() - t0);
    }
    volatile unsigned char sink = ((unsigned char *)dst)[bytes - 1]; /* the copy is used */
    (void)sink;
    free(src), free(dst);
    return 2.0 * bytes / best;
}

void peaks_measure_cpu(ProfilePeaks *out) {
    memset(out, 0, sizeof *out);
    cpu_device(out->device, sizeof out->device);
    out->flops_per_s = out->flops_f32_per_s = out->flops_tf32_per_s = cpu_gemm_flops(); /* float32 throughout */
    out->bytes_per_s = cpu_copy_bytes();
}

/* ---- the GPU -------------------------------------------------------------------- */

/* Device memory for the measurement, filled with 'byte'; NULL (with a
 * warning) when it does not fit. */
static void *device_buffer(size_t bytes, int byte, cudaStream_t stream) {
    const char *error = NULL;
    void *p = gpu_try_malloc(bytes, &error);
    if (!p) log_warn("peaks: %zu MiB of device memory: %s", bytes >> 20, error ? error : "refused");
    else gpu_fill(p, byte, bytes, stream);
    return p;
}

/* The best ms of TIMED_RUNS of what run() issues, after WARMUP_RUNS. */
typedef void (*GpuWork)(void *arg);
static double time_gpu(cudaStream_t stream, GpuWork run, void *arg) {
    cudaEvent_t e0, e1;
    gpu_event_create(&e0, 1);
    gpu_event_create(&e1, 1);
    for (int i = 0; i < WARMUP_RUNS; i++) run(arg);
    double best = INFINITY;
    for (int i = 0; i < TIMED_RUNS; i++) {
        gpu_event_record(e0, stream);
        run(arg);
        gpu_event_record(e1, stream);
        gpu_event_sync(e1);
        best = fmin(best, gpu_event_ms(e0, e1));
    }
    gpu_event_destroy(e0);
    gpu_event_destroy(e1);
    return best;
}

typedef struct {
    OpContext ctx;
    LinearShape s;
    void *x, *w, *b, *y;
} GemmRun;

static void run_gemm(void *arg) {
    GemmRun *g = arg;
    linear_forward(&g->ctx, &g->s, g->x, g->w, g->b, g->y);
}

/* y[8192][8192] = x[8192][16384] w^T in dtype (fp16 with fp32 accumulation,
 * or float32 on FMA units or, with tf32, on TF32 tensor cores); the bias
 * pass after it (n x out elements, about 4% of the time on an H100 in fp16)
 * is timed with it, so the figure is a little under cuBLAS's own. Every
 * element is 0x2020 (about 0.0083 in fp16, 1.4e-19 in float32): sums stay far
 * from the type's range. */
static double gpu_gemm_flops(GpuContext *g, DType dtype, int tf32) {
    GemmRun r = {op_context_gpu(g, dtype, 0), {8192, 16384, 8192}, NULL, NULL, NULL, NULL};
    size_t in = (size_t)r.s.n * r.s.in, wts = (size_t)r.s.out * r.s.in, out = (size_t)r.s.n * r.s.out;
    size_t esize = dtype_size(dtype);
    if (tf32) gpu_allow_tf32_gemm(g);
    r.x = device_buffer(in * esize, 0x20, g->compute);
    r.w = device_buffer(wts * esize, 0x20, g->compute);
    r.b = device_buffer((size_t)r.s.out * esize, 0, g->compute);
    r.y = device_buffer(out * esize, 0, g->compute);
    double flops = 0;
    if (r.x && r.w && r.b && r.y) flops = (2.0 * r.s.n * r.s.in * r.s.out + (double)out) /
                                          (time_gpu(g->compute, run_gemm, &r) / 1000);
    void *bufs[] = {r.x, r.w, r.b, r.y};
    for (int i = 0; i < 4; i++)
        if (bufs[i]) gpu_free(bufs[i]);
    return flops;
}

typedef struct {
    void *dst, *src;
    size_t bytes;
    cudaStream_t stream;
} CopyRun;

static void run_copy(void *arg) {
    CopyRun *c = arg;
    gpu_copy_on_device(c->dst, c->src, c->bytes, c->stream);
}

/* A 1 GiB cudaMemcpyAsync device to device: it reads and writes each byte. */
static double gpu_copy_bytes(const GpuContext *g) {
    CopyRun c = {NULL, NULL, (size_t)1 << 30, g->compute};
    c.src = device_buffer(c.bytes, 1, g->compute);
    c.dst = device_buffer(c.bytes, 0, g->compute);
    double bytes_per_s = c.src && c.dst ? 2.0 * c.bytes / (time_gpu(g->compute, run_copy, &c) / 1000) : 0;
    if (c.src) gpu_free(c.src);
    if (c.dst) gpu_free(c.dst);
    return bytes_per_s;
}

void peaks_measure_gpu(int gpu, ProfilePeaks *out) {
    memset(out, 0, sizeof *out);
    GpuContext g;
    gpu_context_init(&g, gpu);
    char uuid[64];
    gpu_uuid(gpu, uuid, sizeof uuid);
    snprintf(out->device, sizeof out->device, "%.190s (%.60s)", g.name, uuid);
    out->flops_per_s = gpu_gemm_flops(&g, DTYPE_F16, 0);
    out->flops_f32_per_s = gpu_gemm_flops(&g, DTYPE_F32, 0);
    out->flops_tf32_per_s = gpu_gemm_flops(&g, DTYPE_F32, 1); /* last: the handle keeps TF32 on */
    out->bytes_per_s = gpu_copy_bytes(&g);
    gpu_sync(g.compute);
    gpu_context_destroy(&g);
}

/* ---- the cache ------------------------------------------------------------------ */

void peaks_cache_name(int use_gpu, int gpu, char *name, size_t len) {
    char key[256];
    if (use_gpu) {
        gpu_uuid(gpu, key, sizeof key);
    } else {
        char model[200];
        cpu_model(model, sizeof model);
        snprintf(key, sizeof key, "cpu-%s-%dt", model, cpu_sgemm_threads());
    }
    for (char *c = key; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
              *c == '-'))
            *c = '_';
    snprintf(name, len, "peaks-%.200s.txt", key);
}

int peaks_cache_dir(char *dir, size_t len) {
    const char *own = getenv("TRAINC_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (own && *own) snprintf(dir, len, "%s", own);
    else if (xdg && *xdg) snprintf(dir, len, "%s/trainc", xdg);
    else if (home && *home) snprintf(dir, len, "%s/.cache/trainc", home);
    else return -1;
    return 0;
}

/* A positive finite number and nothing after it. */
static int read_rate(const char *text, double *v) {
    char *end;
    errno = 0;
    *v = strtod(text, &end);
    while (*end == ' ' || *end == '\n' || *end == '\r') end++;
    return end != text && !*end && !errno && isfinite(*v) && *v > 0 ? 0 : -1;
}

int peaks_cache_read(const char *path, ProfilePeaks *out, char *why, size_t whylen) {
    memset(out, 0, sizeof *out);
    snprintf(why, whylen, "%s", "");
    const char *reason;
    int fd = files_open_input(path, NULL, &reason);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) reason = strerror(errno), close(fd);
        if (errno != ENOENT) snprintf(why, whylen, "%s", reason);
        return -1;
    }
    char line[512];
    int have = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char *eq = strstr(line, " = ");
        if (!eq) break;
        *eq = 0;
        const char *value = eq + 3;
        if (!strcmp(line, "device")) {
            snprintf(out->device, sizeof out->device, "%.*s", (int)strcspn(value, "\r\n"), value);
            have |= out->device[0] ? 1 : 0;
        } else if (!strcmp(line, "flops_per_s") && read_rate(value, &out->flops_per_s) == 0) {
            have |= 2;
        } else if (!strcmp(line, "flops_f32_per_s") && read_rate(value, &out->flops_f32_per_s) == 0) {
            have |= 8;
        } else if (!strcmp(line, "flops_tf32_per_s") && read_rate(value, &out->flops_tf32_per_s) == 0) {
            have |= 16;
        } else if (!strcmp(line, "bytes_per_s") && read_rate(value, &out->bytes_per_s) == 0) {
            have |= 4;
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (failed || have != 31) {
        snprintf(why, whylen, "%s", failed ? "read error" : "not the device, flops_per_s, flops_f32_per_s, "
                 "flops_tf32_per_s and bytes_per_s it should hold");
        return -1;
    }
    out->from_cache = 1;
    return 0;
}

/* The cache's name is trainc's own, in its cache folder: a file there (a
 * damaged cache too) is replaced, unless files.h's checks refuse it. */
static int is_peaks_cache(int fd) { return fd >= 0; }

/* Written beside, then renamed: a reader never sees half a file. */
int peaks_cache_write(const char *path, const ProfilePeaks *p) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if (files_make_dirs(dir) != 0) return -1;
    }
    FilesWhole out;
    char err[4400];
    if (files_whole_begin(&out, path, is_peaks_cache, err, sizeof err) != 0) return -1;
    FILE *f = out.f;
    int bad = fprintf(f, "# trainc profile's measured peaks (tools/trainer/peaks.c); delete the file to remeasure\n"
                         "device = %s\nflops_per_s = %.17g\nflops_f32_per_s = %.17g\nflops_tf32_per_s = %.17g\n"
                         "bytes_per_s = %.17g\n", p->device, p->flops_per_s, p->flops_f32_per_s,
                      p->flops_tf32_per_s, p->bytes_per_s) < 0;
    if (bad) {
        files_whole_abort(&out);
        return -1;
    }
    return files_whole_commit(&out, is_peaks_cache, err, sizeof err);
}

/* ---- the peaks ------------------------------------------------------------------ */

static int from_env(ProfilePeaks *out) {
    const char *text = getenv("TRAINC_PEAKS");
    if (!text || !*text) return 0;
    char first[128];
    const char *comma = strchr(text, ',');
    snprintf(first, sizeof first, "%.*s", comma ? (int)(comma - text) : 0, text);
    memset(out, 0, sizeof *out);
    if (!comma || read_rate(first, &out->flops_per_s) != 0 || read_rate(comma + 1, &out->bytes_per_s) != 0)
        TC_USER_ERROR("TRAINC_PEAKS=%s: want FLOPS,BYTES per second, two positive numbers (e.g. 7e14,5e12)", text);
    out->flops_f32_per_s = out->flops_tf32_per_s = out->flops_per_s; /* one figure for every precision */
    snprintf(out->device, sizeof out->device, "TRAINC_PEAKS");
    return 1;
}

static void measure(int use_gpu, int gpu, ProfilePeaks *out) {
    log_info("measuring the %s's peaks for the roofline (once; cached)", use_gpu ? "GPU" : "CPU");
    if (use_gpu) peaks_measure_gpu(gpu, out);
    else peaks_measure_cpu(out);
    log_info("peaks of %s: %.3g FLOP/s (half), %.3g (float32), %.3g (TF32), %.3g B/s", out->device, out->flops_per_s,
             out->flops_f32_per_s, out->flops_tf32_per_s, out->bytes_per_s);
}

void peaks_get(int use_gpu, int gpu, ProfilePeaks *out) {
    static int warned_write;
    if (from_env(out)) return;
    memset(out, 0, sizeof *out);
    if (use_gpu && gpu >= gpu_count()) return; /* the run says why it cannot use the GPU */
    char dir[900], name[256], path[1200], why[256];
    if (peaks_cache_dir(dir, sizeof dir) != 0) {
        if (!warned_write++) log_warn("peaks: no cache folder (TRAINC_CACHE_DIR, XDG_CACHE_HOME, HOME unset): "
                                      "measured each run");
        measure(use_gpu, gpu, out);
        return;
    }
    peaks_cache_name(use_gpu, gpu, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (peaks_cache_read(path, out, why, sizeof why) == 0) return;
    if (why[0]) log_warn("peaks: cache %s: %s; measuring again and rewriting it", path, why);
    measure(use_gpu, gpu, out);
    if (out->flops_per_s <= 0 || out->flops_f32_per_s <= 0 || out->flops_tf32_per_s <= 0 || out->bytes_per_s <= 0)
        return; /* not measured: not cached either */
    if (peaks_cache_write(path, out) != 0 && !warned_write++)
        log_warn("peaks: cannot write the cache %s: %s; measured each run", path, strerror(errno));
}
