/* The device's measured peaks for trainc profile's roofline (ProfilePeaks,
 * profile.h). The GPU: GEMMs through the linear face in half precision (fp16
 * in and out, fp32 accumulate), in float32 on FMA units and in float32 on
 * TF32 tensor cores (the roofline takes the one of the run's precision), and
 * a device-to-device copy. The CPU: an fp32 GEMM through the same face (all
 * three figures), and a memcpy. A copy's bytes_per_s
 * counts what it reads and what it writes (2 x its size per copy), as the
 * roofline's bytes count a layer's reads and writes. Each figure is the best
 * of several timed runs after warm-up.
 *
 * They are measured once per device and cached in a small text file:
 * $TRAINC_CACHE_DIR, else $XDG_CACHE_HOME/trainc, else $HOME/.cache/trainc,
 * as peaks-<GPU UUID>.txt, or on the CPU peaks-cpu-<model>-<BLAS threads>.txt.
 * A cache that does not read back is remeasured and rewritten with a warning;
 * one that cannot be written is warned about once. TRAINC_PEAKS="FLOPS,BYTES"
 * (per second; e.g. "7e14,5e12"; FLOPS for every precision) skips both the
 * measurement and the cache. */
#ifndef TRAINC_TOOLS_TRAINER_PEAKS_H
#define TRAINC_TOOLS_TRAINER_PEAKS_H

#include <stddef.h>

#include "tools/trainer/profile.h"

/* The peaks of CUDA device gpu (use_gpu) or of this CPU: TRAINC_PEAKS, the
 * cache, or measured and cached. Never fails for the cache's sake; a bad
 * TRAINC_PEAKS ends the process with a message naming it. */
void peaks_get(int use_gpu, int gpu, ProfilePeaks *out);

/* ---- the parts, for tests ------------------------------------------------------- */

/* Measures now (from_cache 0). */
void peaks_measure_cpu(ProfilePeaks *out);
void peaks_measure_gpu(int gpu, ProfilePeaks *out);
/* What the device's cache file is called ("peaks-GPU-8c1e....txt"): the
 * device's key, its characters outside [A-Za-z0-9.-] made '_'. */
void peaks_cache_name(int use_gpu, int gpu, char *name, size_t len);
/* The cache folder ($TRAINC_CACHE_DIR, ...); -1 when none of the three is set. */
int peaks_cache_dir(char *dir, size_t len);
/* 0 with *out filled (from_cache 1), or -1: missing (*why ""), or unreadable
 * or corrupt (*why says how). */
int peaks_cache_read(const char *path, ProfilePeaks *out, char *why, size_t whylen);
/* 0, or -1 when the file (or its folder) cannot be written. */
int peaks_cache_write(const char *path, const ProfilePeaks *p);

#endif
