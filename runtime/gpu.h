/* The GPU a process trains on (its streams and library handles), and the few
 * CUDA runtime calls that host code makes (memory, copies, events, graphs, the
 * profiler, NVTX ranges), each checked: no host file outside the GPU-only
 * sources calls CUDA itself.
 *
 * A build without CUDA (TRAINC_CUDA 0) has all of these too: gpu_count() is 0,
 * the NVTX ranges do nothing, and every other call stops with "built without
 * CUDA" (gpu_unavailable). The GPU path is refused before it gets that far
 * (run.device = cuda), so none is reached in a correct program. */
#ifndef TRAINC_GPU_H
#define TRAINC_GPU_H

#include <stddef.h>

#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int device_id;
    char name[256];       /* the device's name, "NVIDIA H100 80GB HBM3" */
    cudaStream_t compute; /* forward, backward, optimizer */
    cudaStream_t copy;    /* host-to-device batch copies */
    cudaStream_t side;    /* work beside compute's, forked from it and joined back by events
                             (perf.overlap_wgrad: the convolutions' filter gradients) */
    cudnnHandle_t cudnn;  /* bound to 'compute' */
    cublasHandle_t cublas;/* bound to 'compute' */
    void *cublas_workspace;/* cuBLAS's, GPU_CUBLAS_WORKSPACE_BYTES */
} GpuContext;

/* What cuBLAS's documentation recommends for Hopper (the most it uses). */
#define GPU_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

/* Number of usable GPUs; 0 when there is no driver or device, or no CUDA in
 * this build (never fails). */
int gpu_count(void);
void gpu_context_init(GpuContext *g, int device_id);
void gpu_context_destroy(GpuContext *g);
/* cuBLAS may run float32 GEMMs on TF32 tensor cores (precision.tf32). */
void gpu_allow_tf32_gemm(GpuContext *g);
#if TRAINC_CUDA
/* The compute type of a float32 GEMM on h: TF32 where gpu_allow_tf32_gemm
 * put h in CUBLAS_TF32_TENSOR_OP_MATH, else full fp32 (pedantic). */
cublasComputeType_t gpu_fp32_gemm_compute(cublasHandle_t h);
#endif

#if TRAINC_CUDA
/* A CUDA driver function looked up at run time into *fn: 0 when the driver
 * has none. Linking libcuda would make every program fail to start on a
 * machine without a GPU driver (CI's). */
int gpu_driver_entry(const char *name, void **fn);
#endif

/* Device memory on the current device: NULL when cudaMalloc fails, with
 * *error saying why (the error is cleared). */
void *gpu_try_malloc(size_t bytes, const char **error);
void gpu_free(void *p);
/* Free and total memory of the current device. */
void gpu_memory_info(size_t *free_bytes, size_t *total_bytes);
/* Pinned host memory: NULL when cudaHostAlloc fails, with *error saying why. */
void *gpu_try_host_alloc(size_t bytes, const char **error);
void gpu_host_free(void *p);
/* The PCI bus id of CUDA device 'device' ("0000:3B:00.0"): how NVML finds it. */
void gpu_pci_bus_id(int device, char *buf, int len);

/* The UUID of CUDA device 'device' as nvidia-smi writes it ("GPU-8c1e...-..."). */
void gpu_uuid(int device, char *buf, int len);

/* Copies and fills, ordered on 'stream' (they return before they are done). */
void gpu_copy_to_device(void *dst, const void *host, size_t bytes, cudaStream_t stream);
void gpu_copy_to_host(void *host, const void *src, size_t bytes, cudaStream_t stream);
void gpu_copy_on_device(void *dst, const void *src, size_t bytes, cudaStream_t stream);
void gpu_fill(void *dst, int byte, size_t bytes, cudaStream_t stream);
/* Waits until everything issued on 'stream' has run. */
void gpu_sync(cudaStream_t stream);

/* Events; timing 0 makes one that only orders work (cheaper). */
void gpu_event_create(cudaEvent_t *e, int timing);
void gpu_event_destroy(cudaEvent_t e);
void gpu_event_record(cudaEvent_t e, cudaStream_t stream);
void gpu_event_sync(cudaEvent_t e);
/* 1 when the work before the event's record has run, 0 when not yet; never waits. */
int gpu_event_done(cudaEvent_t e);
float gpu_event_ms(cudaEvent_t from, cudaEvent_t to);
/* Work issued on 'stream' after this waits for the event. */
void gpu_wait_event(cudaStream_t stream, cudaEvent_t e);
/* cuDNN's calls through h, and the kernels ops launch on h's stream, go to 'stream' from now on. */
void gpu_cudnn_stream(cudnnHandle_t h, cudaStream_t stream);

/* CUDA graphs: what this thread issues on 'stream' between begin and end is
 * captured, not run, and end returns it instantiated (node_priority: each
 * node keeps its stream's priority), its small memsets as kernels
 * (runtime/gpu_graph.h). */
void gpu_capture_begin(cudaStream_t stream);
cudaGraphExec_t gpu_capture_end(cudaStream_t stream, int node_priority);
void gpu_graph_launch(cudaGraphExec_t graph, cudaStream_t stream);
void gpu_graph_destroy(cudaGraphExec_t graph);

/* The profiler's capture range (nsys --capture-range=cudaProfilerApi). */
void gpu_profiler_start(void);
void gpu_profiler_stop(void);
/* A named NVTX range on the profiler's timeline; nothing without CUDA. */
void gpu_range_push(const char *name);
void gpu_range_pop(void);

/* Stops with "<what>: this trainc was built without CUDA ...". */
void gpu_unavailable(const char *what) __attribute__((noreturn));

/* GPU_ONLY(statement): the statement in a CUDA build. In a build without CUDA
 * it is not compiled at all (it may name CUDA functions that do not exist
 * there), and reaching it stops with gpu_unavailable: for the CUDA branch of
 * code that serves both builds (the ops' device dispatch, the trainer's GPU
 * path). */
#if TRAINC_CUDA
#define GPU_ONLY(...) do { __VA_ARGS__; } while (0)
#else
#define GPU_ONLY(...) gpu_unavailable(__func__)
#endif

#ifdef __cplusplus
}
#endif
#endif
