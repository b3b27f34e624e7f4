/* The GPU's activity from CUPTI's activity API: kernels (graph nodes come as
 * kernels too), copies, memsets, and the runtime and driver API calls that
 * launched them, each copied into a compact record of ours.
 *
 * libcupti is loaded with dlopen by gpu_activity_open and by nothing else:
 * trainc does not link it, and a run that never opens it never loads it. The
 * state is the process's (CUPTI's callbacks are): one open at a time. Every
 * function returns 0, or -1 with the reason in gpu_activity_why(); a build
 * without CUDA has them all, failing with "CUDA not built". */
#ifndef TRAINC_CUPTI_ACTIVITY_H
#define TRAINC_CUPTI_ACTIVITY_H

#include <stdint.h>

#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { GPU_ACT_KERNEL, GPU_ACT_COPY, GPU_ACT_MEMSET } GpuActivityKind;
typedef enum { GPU_COPY_OTHER, GPU_COPY_H2D, GPU_COPY_D2H, GPU_COPY_D2D, GPU_COPY_PEER } GpuCopyKind;

/* A kernel, copy or memset on the device. */
typedef struct {
    uint64_t start, end;      /* ns, CUPTI's clock (gpu_activity_timestamp) */
    uint64_t bytes;           /* copies and memsets */
    const char *name;         /* kernels: interned (equal names, equal pointers); else NULL */
    uint32_t stream;          /* CUPTI's stream id (gpu_activity_stream_id) */
    uint32_t correlation;     /* the id of the API call that launched it */
    uint8_t kind;             /* GpuActivityKind */
    uint8_t copy;             /* GpuCopyKind (copies) */
} GpuActivity;

typedef enum { GPU_API_OTHER, GPU_API_LAUNCH, GPU_API_SYNC } GpuApiClass;

/* A runtime or driver API call on the host. A runtime call that enters the
 * driver gives a driver record with the same correlation id too. */
typedef struct {
    uint64_t start, end;      /* ns, CUPTI's clock */
    const char *name;         /* interned ("cudaLaunchKernel_v7000") */
    uint32_t correlation;
    uint8_t driver;           /* 1: driver API (cu...), 0: runtime API (cuda...) */
    uint8_t api_class;        /* GpuApiClass: launches (kernels, graphs, async copies and memsets), syncs
                                 (stream, event, device syncs; synchronous copies and memsets) */
} GpuApiCall;

/* Loads libcupti (the one CMake found, else "libcupti.so" by name), hands it
 * a pool of buffers and enables the records. */
int gpu_activity_open(void);
/* CUPTI's clock now, in ns: the records' time base. */
int gpu_activity_timestamp(uint64_t *ns);
/* The id CUPTI's records give stream s. */
int gpu_activity_stream_id(cudaStream_t s, uint32_t *id);
/* Waits for the device, disables the records and flushes every buffer. */
int gpu_activity_flush(void);
/* The records so far, in the order CUPTI delivered them; valid until close. */
const GpuActivity *gpu_activity_records(long *n);
const GpuApiCall *gpu_activity_api_calls(long *n);
/* Records CUPTI dropped (no buffer was free). */
long gpu_activity_dropped(void);
/* Frees the records and the buffers (libcupti stays loaded: CUPTI stays
 * attached to the CUDA context). */
void gpu_activity_close(void);
const char *gpu_activity_why(void);

#ifdef __cplusplus
}
#endif
#endif
