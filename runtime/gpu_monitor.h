/* GPU utilisation, memory, temperature, power and the SM clock from NVML, sampled by a
 * background thread. NVML is loaded at run time (dlopen), so trainc runs where
 * it is absent; gpu_monitor_start then returns NULL. */
#ifndef TRAINC_GPU_MONITOR_H
#define TRAINC_GPU_MONITOR_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double util_pct;      /* % of the sample period a kernel ran */
    double mem_used_bytes;
    double temp_c;
    double power_w;
    double sm_clock_mhz;  /* the SM clock now (the power limit lowers it) */
} GpuSample;

typedef struct GpuMonitor GpuMonitor;

GpuMonitor *gpu_monitor_start(int cuda_device, double interval_s);
/* What a monitor reads (NVML's, in gpu_monitor_start; tests give their own),
 * each called on the sampler's thread: sample fills what it has of s (the
 * rest stays -1); the counters return 0 and their value, else non-zero;
 * energy_j, capped_s and power_limit_w may be NULL, as close may. */
typedef struct {
    int (*sample)(void *user, GpuSample *s);
    int (*energy_j)(void *user, double *joules);   /* energy used since some fixed point */
    int (*capped_s)(void *user, double *seconds);  /* time the power limit held the clocks down, likewise */
    int (*power_limit_w)(void *user, double *watts);
    void (*close)(void *user);                      /* in gpu_monitor_stop */
    void *user;
} GpuMonitorSource;
GpuMonitor *gpu_monitor_start_source(const GpuMonitorSource *src, double interval_s);
/* Samples taken between window_begin and window_end calls make up the window's
 * mean; a window may be paused (end) and resumed (begin) any number of times.
 * Neither call waits for NVML: the counters behind the window's power are read
 * on the sampler's thread, as soon after each call as it can (an NVML read
 * takes milliseconds, which the trainer would otherwise spend with the device
 * idle at every epoch's ends). */
void gpu_monitor_window_begin(GpuMonitor *g);
void gpu_monitor_window_end(GpuMonitor *g);
/* Mean utilisation over the window; -1 when no sample fell inside it. */
double gpu_monitor_window_util(GpuMonitor *g);
/* The window's power, from NVML's counters read at each begin and end (it
 * waits for the reads still due): the
 * mean draw (the energy counter over the time), the share of the time the
 * power limit held the clocks below their target (NVML's power violation
 * time: kernels bound by arithmetic then run slower than on a cool card), and
 * the enforced limit now. -1 for what NVML does not give, and for both
 * figures over a window shorter than GPU_MONITOR_POWER_MIN_S: the counters
 * move in steps (on an H100, 0.17 s of steps read 776 W against a 700 W limit). */
#define GPU_MONITOR_POWER_MIN_S 1.0
/* NVML's utilisation over a window shorter than this reads the sample period
 * before it (1/6 s to 1 s by the card): not a figure of the window. */
#define GPU_MONITOR_UTIL_MIN_S 1.0
typedef struct {
    double mean_w, capped_frac, limit_w;
} GpuWindowPower;
GpuWindowPower gpu_monitor_window_power(GpuMonitor *g);
GpuSample gpu_monitor_latest(GpuMonitor *g);
/* From now on the sampler thread appends a JSON line
 *   {"gpu_sample": T, "util": .., "mem_bytes": .., "temp_c": .., "power_w": .., "sm_mhz": ..}
 * to f every every_s seconds (T: seconds on now_seconds() minus t0; a value
 * NVML did not give is null). Each line is one fprintf, so lines that other
 * threads write to f stay whole. f = NULL stops it; once that call returns the
 * thread no longer touches the old f. */
void gpu_monitor_record_to(GpuMonitor *g, FILE *f, double every_s, double t0);
void gpu_monitor_stop(GpuMonitor *g);

#ifdef __cplusplus
}
#endif
#endif
