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
typedef int (*nvml_energy_fn)(nvmlDevice_t, unsigned long long *);
typedef struct { unsigned long long reference_time_us, violation_time_ns; } nvmlViolationTime_t;
typedef int (*nvml_violation_fn)(nvmlDevice_t, int, nvmlViolationTime_t *);
#define NVML_PERF_POLICY_POWER 0 /* time the power limit held the clocks below their target */

/* The counters a window's power comes from, read at its ends; < 0: NVML gave none. */
typedef struct {
    double t, energy_j, capped_s;
} PowerCounters;

struct GpuMonitor {
    void *lib;
    nvmlDevice_t device;
    nvml_shutdown_fn shutdown;
    nvml_util_fn get_util;
    nvml_mem_fn get_mem;
    nvml_temp_fn get_temp;
    nvml_power_fn get_power;
    nvml_energy_fn get_energy;
    nvml_violation_fn get_violation;
    nvml_power_fn get_power_limit;
    double interval_s;

    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int stop;
    int in_window;
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
    json_write_line(f, o); /* a failed write loses one sample; the trainer's own lines report it */
}

static void sample_once(GpuMonitor *g) {
    GpuSample s = {-1, -1, -1, -1};
    nvmlUtilization_t u;
    nvmlMemory_t mem;
    unsigned int temp, milliwatts;
    if (g->get_util(g->device, &u) == 0) s.util_pct = u.gpu;
    if (g->get_mem(g->device, &mem) == 0) s.mem_used_bytes = (double)mem.used;
    if (g->get_temp && g->get_temp(g->device, 0, &temp) == 0) s.temp_c = temp;
    if (g->get_power && g->get_power(g->device, &milliwatts) == 0) s.power_w = milliwatts / 1000.0;
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

static void *sampler_main(void *arg) {
    GpuMonitor *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        pthread_mutex_unlock(&g->lock);
        sample_once(g);
        pthread_mutex_lock(&g->lock);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long ns = until.tv_nsec + (long)(g->interval_s * 1e9);
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        if (!g->stop) pthread_cond_timedwait(&g->wake, &g->lock, &until);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

GpuMonitor *gpu_monitor_start(int cuda_device, double interval_s) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        log_warn("NVML not found (libnvidia-ml.so.1): no GPU utilisation figures");
        return NULL;
    }
    GpuMonitor *g = calloc(1, sizeof *g);
    if (!g) TC_FATAL("out of host memory");
    g->lib = lib;
    nvml_init_fn init = (nvml_init_fn)dlsym(lib, "nvmlInit_v2");
    nvml_by_pci_fn by_pci = (nvml_by_pci_fn)dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    g->shutdown = (nvml_shutdown_fn)dlsym(lib, "nvmlShutdown");
    g->get_util = (nvml_util_fn)dlsym(lib, "nvmlDeviceGetUtilizationRates");
    g->get_mem = (nvml_mem_fn)dlsym(lib, "nvmlDeviceGetMemoryInfo");
    g->get_temp = (nvml_temp_fn)dlsym(lib, "nvmlDeviceGetTemperature");
    g->get_power = (nvml_power_fn)dlsym(lib, "nvmlDeviceGetPowerUsage");
    g->get_energy = (nvml_energy_fn)dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    g->get_violation = (nvml_violation_fn)dlsym(lib, "nvmlDeviceGetViolationStatus");
    g->get_power_limit = (nvml_power_fn)dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
    /* CUDA and NVML number GPUs differently; the PCI bus id is common ground. */
    char bus_id[64];
    int rc = -1;
    if (init && by_pci && g->shutdown && g->get_util && g->get_mem && init() == 0) {
        gpu_pci_bus_id(cuda_device, bus_id, sizeof bus_id);
        rc = by_pci(bus_id, &g->device);
        if (rc != 0) g->shutdown();
    }
    if (rc != 0) {
        log_warn("NVML could not open GPU %d: no GPU utilisation figures", cuda_device);
        dlclose(lib);
        free(g);
        return NULL;
    }
    g->interval_s = interval_s;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->wake, NULL);
    if (pthread_create(&g->thread, NULL, sampler_main, g) != 0) TC_FATAL("pthread_create failed");
    return g;
}

/* Read in the caller's thread (NVML is thread-safe): the window's ends are the
 * trainer's, after a device sync, and the sampler's period is far too coarse
 * for a window of a few steps. */
static PowerCounters read_power_counters(GpuMonitor *g) {
    PowerCounters c = {now_seconds(), -1, -1};
    unsigned long long millijoules;
    nvmlViolationTime_t v;
    if (g->get_energy && g->get_energy(g->device, &millijoules) == 0) c.energy_j = millijoules / 1000.0;
    if (g->get_violation && g->get_violation(g->device, NVML_PERF_POLICY_POWER, &v) == 0)
        c.capped_s = v.violation_time_ns / 1e9;
    return c;
}

/* b - a, or -1 where either end is unknown; a new unknown poisons the sum. */
static double add_span(double sum, double a, double b) {
    return sum < 0 || a < 0 || b < 0 ? -1 : sum + (b - a);
}

void gpu_monitor_window_begin(GpuMonitor *g) {
    if (!g) return;
    PowerCounters now = read_power_counters(g);
    pthread_mutex_lock(&g->lock);
    if (!g->in_window) g->window_open = now;
    g->in_window = 1;
    pthread_mutex_unlock(&g->lock);
}

void gpu_monitor_window_end(GpuMonitor *g) {
    if (!g) return;
    PowerCounters now = read_power_counters(g);
    pthread_mutex_lock(&g->lock);
    if (g->in_window) {
        const PowerCounters *open = &g->window_open;
        g->window_s += now.t - open->t;
        g->window_energy_j = add_span(g->window_energy_j, open->energy_j, now.energy_j);
        g->window_capped_s = add_span(g->window_capped_s, open->capped_s, now.capped_s);
    }
    g->in_window = 0;
    pthread_mutex_unlock(&g->lock);
}

GpuWindowPower gpu_monitor_window_power(GpuMonitor *g) {
    GpuWindowPower p = {-1, -1, -1};
    if (!g) return p;
    unsigned int milliwatts;
    if (g->get_power_limit && g->get_power_limit(g->device, &milliwatts) == 0) p.limit_w = milliwatts / 1000.0;
    pthread_mutex_lock(&g->lock);
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
    GpuSample s = {-1, -1, -1, -1};
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
    g->shutdown();
    dlclose(g->lib);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->wake);
    free(g);
}
