/* GPU utilisation, memory, temperature and power from NVML, sampled by a
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
} GpuSample;

typedef struct GpuMonitor GpuMonitor;

GpuMonitor *gpu_monitor_start(int cuda_device, double interval_s);
/* Samples taken between window_begin and window_end calls make up the window's
 * mean; a window may be paused (end) and resumed (begin) any number of times. */
void gpu_monitor_window_begin(GpuMonitor *g);
void gpu_monitor_window_end(GpuMonitor *g);
/* Mean utilisation over the window; -1 when no sample fell inside it. */
double gpu_monitor_window_util(GpuMonitor *g);
GpuSample gpu_monitor_latest(GpuMonitor *g);
/* From now on the sampler thread appends a JSON line
 *   {"gpu_sample": T, "util": .., "mem_bytes": .., "temp_c": .., "power_w": ..}
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
