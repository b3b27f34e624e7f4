#include "runtime/gpu_monitor.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/json_out.h"
#include "runtime/log.h"

/* The few NVML types and entry points used, declared here so that building
 * needs no NVML header; the ABI is stable across driver versions. */
typedef void *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_shutdown_fn)(void);
typedef int (*nvml_by_pci_fn)(const char *, nvmlDevice_t *);
typedef int (*nvml_util_fn)(nvmlDevice_t, nvmlUtilization_t *);
typedef int (*nvml_mem_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef int (*nvml_temp_fn)(nvmlDevice_t, int, unsigned int *);
typedef int (*nvml_power_fn)(nvmlDevice_t, unsigned int *);
typedef int (*nvml_clock_fn)(nvmlDevice_t, int, unsigned int *);
typedef int (*nvml_energy_fn)(nvmlDevice_t, unsigned long long *);
typedef struct { unsigned long long reference_time_us, violation_time_ns; } nvmlViolationTime_t;
typedef int (*nvml_violation_fn)(nvmlDevice_t, int, nvmlViolationTime_t *);
#define NVML_PERF_POLICY_POWER 0 /* time the power limit held the clocks below their target */
#define NVML_CLOCK_SM 1          /* nvmlClockType_t: the streaming multiprocessors' clock */

/* The counters a window's power comes from, read at its ends; < 0: NVML gave none. */
typedef struct {
    double t, energy_j, capped_s;
} PowerCounters;

/* A window's begin or end, asked for by the trainer and read by the sampler. */
#define MONITOR_PENDING_MAX 8

struct GpuMonitor {
    GpuMonitorSource src;
    double interval_s;

    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;    /* the sampler: stop, or an end of the window to read */
    pthread_cond_t settled; /* gpu_monitor_window_power: every end read */
    int stop;
    int in_window;          /* for the utilisation samples: as the trainer said, at once */
    int pending[MONITOR_PENDING_MAX]; /* the window's ends not yet read: 1 begin, 0 end, oldest first */
    int n_pending;
    int power_open;         /* the sampler has read the window's last begin (and no end since) */
    double window_util_sum;
    int window_samples;
    PowerCounters window_open;           /* at the window's last begin */
    double window_s, window_energy_j, window_capped_s; /* summed over its spans; energy and capped < 0: unknown */
    GpuSample latest;
    FILE *record;         /* gpu_monitor_record_to: where samples go, or NULL */
    double record_every_s, record_t0, record_last;
};

/* A reading rounded to `decimals` places; null when NVML gave none (< 0). */
static void add_reading(cJSON *o, const char *key, double v, int decimals) {
    double scale = pow(10, decimals);
    json_add_number(o, key, v >= 0 ? round(v * scale) / scale : NAN, 15);
}

/* One JSON line, written with one write. */
static void record_sample(FILE *f, double t, const GpuSample *s) {
    cJSON *o = json_object_new();
    add_reading(o, "gpu_sample", t, 3);
    add_reading(o, "util", s->util_pct, 0);
    add_reading(o, "mem_bytes", s->mem_used_bytes, 0);
    add_reading(o, "temp_c", s->temp_c, 0);
    add_reading(o, "power_w", s->power_w, 1);
    add_reading(o, "sm_mhz", s->sm_clock_mhz, 0);
    json_write_line(f, o); /* a failed write loses one sample; the trainer's own lines report it */
}

static void sample_once(GpuMonitor *g) {
    GpuSample s = {-1, -1, -1, -1, -1};
    g->src.sample(g->src.user, &s);
    pthread_mutex_lock(&g->lock);
    g->latest = s;
    if (g->in_window && s.util_pct >= 0) {
        g->window_util_sum += s.util_pct;
        g->window_samples++;
    }
    double now = now_seconds();
    if (g->record && now - g->record_last >= g->record_every_s) {
        record_sample(g->record, now - g->record_t0, &s);
        g->record_last = now;
    }
    pthread_mutex_unlock(&g->lock);
}

/* NVML's counters now; read on the sampler's thread, since a read takes
 * milliseconds (an H200: 2.9 ms for the energy, up to 16 ms) that the
 * trainer, at an epoch's ends with the device idle, should not wait for. */
static PowerCounters read_power_counters(GpuMonitor *g) {
    PowerCounters c = {now_seconds(), -1, -1};
    if (g->src.energy_j && g->src.energy_j(g->src.user, &c.energy_j) != 0) c.energy_j = -1;
    if (g->src.capped_s && g->src.capped_s(g->src.user, &c.capped_s) != 0) c.capped_s = -1;
    return c;
}

/* b - a, or -1 where either end is unknown; a new unknown poisons the sum. */
static double add_span(double sum, double a, double b) {
    return sum < 0 || a < 0 || b < 0 ? -1 : sum + (b - a);
}

/* A begin or end of the window, with the counters read for it (lock held). */
static void apply_end(GpuMonitor *g, int begin, const PowerCounters *now) {
    if (begin) {
        if (!g->power_open) g->window_open = *now;
        g->power_open = 1;
        return;
    }
    if (g->power_open) {
        const PowerCounters *open = &g->window_open;
        g->window_s += now->t - open->t;
        g->window_energy_j = add_span(g->window_energy_j, open->energy_j, now->energy_j);
        g->window_capped_s = add_span(g->window_capped_s, open->capped_s, now->capped_s);
    }
    g->power_open = 0;
}

/* Reads the counters for each end the trainer asked for, oldest first (lock held, released around each read). */
static void read_pending(GpuMonitor *g) {
    while (g->n_pending > 0) {
        int begin = g->pending[0];
        pthread_mutex_unlock(&g->lock);
        PowerCounters now = read_power_counters(g);
        pthread_mutex_lock(&g->lock);
        apply_end(g, begin, &now);
        memmove(g->pending, g->pending + 1, (size_t)(--g->n_pending) * sizeof *g->pending);
    }
    pthread_cond_broadcast(&g->settled);
}

static void *sampler_main(void *arg) {
    GpuMonitor *g = arg;
    pthread_mutex_lock(&g->lock);
    double next_sample = now_seconds();
    while (!g->stop) {
        read_pending(g);
        if (now_seconds() >= next_sample) {
            pthread_mutex_unlock(&g->lock);
            sample_once(g);
            pthread_mutex_lock(&g->lock);
            next_sample = now_seconds() + g->interval_s;
        }
        if (g->stop || g->n_pending) continue;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long ns = until.tv_nsec + (long)(fmax(0, next_sample - now_seconds()) * 1e9);
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&g->wake, &g->lock, &until);
    }
    read_pending(g); /* a waiter in gpu_monitor_window_power gets its answer */
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

GpuMonitor *gpu_monitor_start_source(const GpuMonitorSource *src, double interval_s) {
    GpuMonitor *g = calloc(1, sizeof *g);
    if (!g) TC_FATAL("out of host memory");
    g->src = *src;
    g->interval_s = interval_s;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->wake, NULL);
    pthread_cond_init(&g->settled, NULL);
    if (pthread_create(&g->thread, NULL, sampler_main, g) != 0) TC_FATAL("pthread_create failed");
    return g;
}

/* ---- NVML as the monitor's source ---------------------------------------------------- */

typedef struct {
    void *lib;
    nvmlDevice_t device;
    nvml_shutdown_fn shutdown;
    nvml_util_fn get_util;
    nvml_mem_fn get_mem;
    nvml_temp_fn get_temp;
    nvml_power_fn get_power;
    nvml_clock_fn get_clock;
    nvml_energy_fn get_energy;
    nvml_violation_fn get_violation;
    nvml_power_fn get_power_limit;
} Nvml;

static int nvml_sample(void *user, GpuSample *s) {
    const Nvml *n = user;
    nvmlUtilization_t u;
    nvmlMemory_t mem;
    unsigned int temp, milliwatts, mhz;
    if (n->get_util(n->device, &u) == 0) s->util_pct = u.gpu;
    if (n->get_mem(n->device, &mem) == 0) s->mem_used_bytes = (double)mem.used;
    if (n->get_temp && n->get_temp(n->device, 0, &temp) == 0) s->temp_c = temp;
    if (n->get_power && n->get_power(n->device, &milliwatts) == 0) s->power_w = milliwatts / 1000.0;
    if (n->get_clock && n->get_clock(n->device, NVML_CLOCK_SM, &mhz) == 0) s->sm_clock_mhz = mhz;
    return 0;
}

static int nvml_energy_j(void *user, double *j) {
    const Nvml *n = user;
    unsigned long long millijoules;
    if (!n->get_energy || n->get_energy(n->device, &millijoules) != 0) return -1;
    *j = millijoules / 1000.0;
    return 0;
}

static int nvml_capped_s(void *user, double *s) {
    const Nvml *n = user;
    nvmlViolationTime_t v;
    if (!n->get_violation || n->get_violation(n->device, NVML_PERF_POLICY_POWER, &v) != 0) return -1;
    *s = v.violation_time_ns / 1e9;
    return 0;
}

static int nvml_power_limit_w(void *user, double *w) {
    const Nvml *n = user;
    unsigned int milliwatts;
    if (!n->get_power_limit || n->get_power_limit(n->device, &milliwatts) != 0) return -1;
    *w = milliwatts / 1000.0;
    return 0;
}

static void nvml_close(void *user) {
    Nvml *n = user;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

GpuMonitor *gpu_monitor_start(int cuda_device, double interval_s) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        log_warn("NVML not found (libnvidia-ml.so.1): no GPU utilisation figures");
        return NULL;
    }
    Nvml *n = calloc(1, sizeof *n);
    if (!n) TC_FATAL("out of host memory");
    n->lib = lib;
    nvml_init_fn init = (nvml_init_fn)dlsym(lib, "nvmlInit_v2");
    nvml_by_pci_fn by_pci = (nvml_by_pci_fn)dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    n->shutdown = (nvml_shutdown_fn)dlsym(lib, "nvmlShutdown");
    n->get_util = (nvml_util_fn)dlsym(lib, "nvmlDeviceGetUtilizationRates");
    n->get_mem = (nvml_mem_fn)dlsym(lib, "nvmlDeviceGetMemoryInfo");
    n->get_temp = (nvml_temp_fn)dlsym(lib, "nvmlDeviceGetTemperature");
    n->get_power = (nvml_power_fn)dlsym(lib, "nvmlDeviceGetPowerUsage");
    n->get_clock = (nvml_clock_fn)dlsym(lib, "nvmlDeviceGetClockInfo");
    n->get_energy = (nvml_energy_fn)dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    n->get_violation = (nvml_violation_fn)dlsym(lib, "nvmlDeviceGetViolationStatus");
    n->get_power_limit = (nvml_power_fn)dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
    /* CUDA and NVML number GPUs differently; the PCI bus id is common ground. */
    char bus_id[64];
    int rc = -1;
    if (init && by_pci && n->shutdown && n->get_util && n->get_mem && init() == 0) {
        gpu_pci_bus_id(cuda_device, bus_id, sizeof bus_id);
        rc = by_pci(bus_id, &n->device);
        if (rc != 0) n->shutdown();
    }
    if (rc != 0) {
        log_warn("NVML could not open GPU %d: no GPU utilisation figures", cuda_device);
        dlclose(lib);
        free(n);
        return NULL;
    }
    GpuMonitorSource src = {nvml_sample, nvml_energy_j, nvml_capped_s, nvml_power_limit_w, nvml_close, n};
    return gpu_monitor_start_source(&src, interval_s);
}

/* One end of the window: at once for the utilisation samples; its counters
 * read by the sampler, which the caller does not wait for. */
static void ask_end(GpuMonitor *g, int begin) {
    pthread_mutex_lock(&g->lock);
    g->in_window = begin;
    while (g->n_pending == MONITOR_PENDING_MAX) pthread_cond_wait(&g->settled, &g->lock);
    g->pending[g->n_pending++] = begin;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
}

void gpu_monitor_window_begin(GpuMonitor *g) {
    if (g) ask_end(g, 1);
}

void gpu_monitor_window_end(GpuMonitor *g) {
    if (g) ask_end(g, 0);
}

GpuWindowPower gpu_monitor_window_power(GpuMonitor *g) {
    GpuWindowPower p = {-1, -1, -1};
    if (!g) return p;
    if (g->src.power_limit_w && g->src.power_limit_w(g->src.user, &p.limit_w) != 0) p.limit_w = -1;
    pthread_mutex_lock(&g->lock);
    while (g->n_pending > 0) pthread_cond_wait(&g->settled, &g->lock); /* every end read */
    int long_enough = g->window_s >= GPU_MONITOR_POWER_MIN_S;
    if (long_enough && g->window_energy_j >= 0) p.mean_w = g->window_energy_j / g->window_s;
    if (long_enough && g->window_capped_s >= 0) p.capped_frac = fmin(1, g->window_capped_s / g->window_s);
    pthread_mutex_unlock(&g->lock);
    return p;
}

double gpu_monitor_window_util(GpuMonitor *g) {
    if (!g) return -1;
    pthread_mutex_lock(&g->lock);
    double mean = g->window_samples ? g->window_util_sum / g->window_samples : -1;
    pthread_mutex_unlock(&g->lock);
    return mean;
}

GpuSample gpu_monitor_latest(GpuMonitor *g) {
    GpuSample s = {-1, -1, -1, -1, -1};
    if (!g) return s;
    pthread_mutex_lock(&g->lock);
    s = g->latest;
    pthread_mutex_unlock(&g->lock);
    return s;
}

void gpu_monitor_record_to(GpuMonitor *g, FILE *f, double every_s, double t0) {
    if (!g) return;
    pthread_mutex_lock(&g->lock);
    g->record = f;
    g->record_every_s = every_s;
    g->record_t0 = t0;
    g->record_last = -1e300;
    pthread_mutex_unlock(&g->lock);
}

void gpu_monitor_stop(GpuMonitor *g) {
    if (!g) return;
    pthread_mutex_lock(&g->lock);
    g->stop = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    if (g->src.close) g->src.close(g->src.user);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->wake);
    pthread_cond_destroy(&g->settled);
    free(g);
}
