#include "runtime/gpu.h"

#include <stdio.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/log.h"

void gpu_unavailable(const char *what) {
    tc_fatal(NULL, 0, "%s: this trainc was built without CUDA (TRAINC_CUDA=OFF), so it trains on the CPU only: "
             "use --device cpu (or configs/cpu.ini)", what);
}

#if TRAINC_CUDA

#include <cublasLt.h>
#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include "runtime/gpu_graph.h"

int gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

void gpu_context_init(GpuContext *g, int device_id) {
    struct cudaDeviceProp prop;
    memset(g, 0, sizeof *g);
    g->device_id = device_id;
    CUDA_CHECK(cudaSetDevice(device_id));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_id));
    snprintf(g->name, sizeof g->name, "%s", prop.name);
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->side, cudaStreamNonBlocking));
    CUDNN_CHECK(cudnnCreate(&g->cudnn));
    CUDNN_CHECK(cudnnSetStream(g->cudnn, g->compute));
    CUBLAS_CHECK(cublasCreate(&g->cublas));
    CUBLAS_CHECK(cublasSetStream(g->cublas, g->compute));
    /* Without a workspace of its own cuBLAS takes one with cudaMallocAsync
     * under stream capture: allocation nodes in the step's CUDA graph. Set
     * after cublasSetStream, which drops it. */
    CUDA_CHECK(cudaMalloc(&g->cublas_workspace, GPU_CUBLAS_WORKSPACE_BYTES));
    CUBLAS_CHECK(cublasSetWorkspace(g->cublas, g->cublas_workspace, GPU_CUBLAS_WORKSPACE_BYTES));
    log_info("gpu %d: %s, %d SMs, %.1f GiB, cuDNN %zu", device_id, prop.name,
             prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, cudnnGetVersion());
}

void gpu_context_destroy(GpuContext *g) {
    if (g->cublas) CUBLAS_CHECK(cublasDestroy(g->cublas));
    if (g->cublas_workspace) CUDA_CHECK(cudaFree(g->cublas_workspace));
    if (g->cudnn) CUDNN_CHECK(cudnnDestroy(g->cudnn));
    if (g->side) CUDA_CHECK(cudaStreamDestroy(g->side));
    if (g->copy) CUDA_CHECK(cudaStreamDestroy(g->copy));
    if (g->compute) CUDA_CHECK(cudaStreamDestroy(g->compute));
    memset(g, 0, sizeof *g);
}

void gpu_allow_tf32_gemm(GpuContext *g) { CUBLAS_CHECK(cublasSetMathMode(g->cublas, CUBLAS_TF32_TENSOR_OP_MATH)); }

cublasComputeType_t gpu_fp32_gemm_compute(cublasHandle_t h) {
    cublasMath_t mode;
    CUBLAS_CHECK(cublasGetMathMode(h, &mode));
    return (mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) == CUBLAS_TF32_TENSOR_OP_MATH
               ? CUBLAS_COMPUTE_32F_FAST_TF32
               : CUBLAS_COMPUTE_32F_PEDANTIC;
}

int gpu_driver_entry(const char *name, void **fn) {
    enum cudaDriverEntryPointQueryResult status;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &status);
    if (e != cudaSuccess) cudaGetLastError();
    return e == cudaSuccess && status == cudaDriverEntryPointSuccess && *fn;
}

void *gpu_try_malloc(size_t bytes, const char **error) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess) return p;
    cudaGetLastError(); /* clear the sticky-free allocation error */
    *error = cudaGetErrorString(e);
    return NULL;
}

void gpu_free(void *p) { CUDA_CHECK(cudaFree(p)); }

void gpu_memory_info(size_t *free_bytes, size_t *total_bytes) { CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes)); }

void *gpu_try_host_alloc(size_t bytes, const char **error) {
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e == cudaSuccess) return p;
    cudaGetLastError();
    *error = cudaGetErrorString(e);
    return NULL;
}

void gpu_host_free(void *p) { CUDA_CHECK(cudaFreeHost(p)); }

void gpu_pci_bus_id(int device, char *buf, int len) { CUDA_CHECK(cudaDeviceGetPCIBusId(buf, len, device)); }

void gpu_uuid(int device, char *buf, int len) {
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(buf, (size_t)len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

void gpu_copy_to_device(void *dst, const void *host, size_t bytes, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream));
}

void gpu_copy_to_host(void *host, const void *src, size_t bytes, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream));
}

void gpu_copy_on_device(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

void gpu_fill(void *dst, int byte, size_t bytes, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, stream));
}

void gpu_sync(cudaStream_t stream) { CUDA_CHECK(cudaStreamSynchronize(stream)); }

void gpu_event_create(cudaEvent_t *e, int timing) {
    if (timing) CUDA_CHECK(cudaEventCreate(e));
    else CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

void gpu_event_destroy(cudaEvent_t e) { CUDA_CHECK(cudaEventDestroy(e)); }
void gpu_event_record(cudaEvent_t e, cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(e, stream)); }
void gpu_event_sync(cudaEvent_t e) { CUDA_CHECK(cudaEventSynchronize(e)); }

int gpu_event_done(cudaEvent_t e) {
    cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not an error: not there yet */
        return 0;
    }
    CUDA_CHECK(rc);
    return 1;
}

float gpu_event_ms(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
    return ms;
}

void gpu_wait_event(cudaStream_t stream, cudaEvent_t e) { CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0)); }
void gpu_cudnn_stream(cudnnHandle_t h, cudaStream_t stream) { CUDNN_CHECK(cudnnSetStream(h, stream)); }

void gpu_capture_begin(cudaStream_t stream) {
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
}

cudaGraphExec_t gpu_capture_end(cudaStream_t stream, int node_priority) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    if (gpu_graph_fills_as_kernels(graph) < 0)
        log_info("CUDA graph: its memsets kept as memset nodes (it allocates memory)");
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, node_priority ? cudaGraphInstantiateFlagUseNodePriority : 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
}

void gpu_graph_launch(cudaGraphExec_t graph, cudaStream_t stream) { CUDA_CHECK(cudaGraphLaunch(graph, stream)); }
void gpu_graph_destroy(cudaGraphExec_t graph) { CUDA_CHECK(cudaGraphExecDestroy(graph)); }

void gpu_profiler_start(void) { CUDA_CHECK(cudaProfilerStart()); }
void gpu_profiler_stop(void) { CUDA_CHECK(cudaProfilerStop()); }
void gpu_range_push(const char *name) { nvtxRangePushA(name); }
void gpu_range_pop(void) { nvtxRangePop(); }

const char *tc_cublas_status_string(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
    }
}

#else /* built without CUDA: no GPU, and no call below is reached (see gpu.h) */

int gpu_count(void) { return 0; }
void gpu_context_init(GpuContext *g, int device_id) { gpu_unavailable("gpu_context_init"); }
void gpu_context_destroy(GpuContext *g) { gpu_unavailable("gpu_context_destroy"); }
void gpu_allow_tf32_gemm(GpuContext *g) { gpu_unavailable("gpu_allow_tf32_gemm"); }
void *gpu_try_malloc(size_t bytes, const char **error) { gpu_unavailable("device memory"); }
void gpu_free(void *p) { gpu_unavailable("gpu_free"); }
void gpu_memory_info(size_t *free_bytes, size_t *total_bytes) { gpu_unavailable("gpu_memory_info"); }
void *gpu_try_host_alloc(size_t bytes, const char **error) { gpu_unavailable("pinned host memory (data.pinned)"); }
void gpu_host_free(void *p) { gpu_unavailable("gpu_host_free"); }
void gpu_pci_bus_id(int device, char *buf, int len) { gpu_unavailable("gpu_pci_bus_id"); }
void gpu_uuid(int device, char *buf, int len) { gpu_unavailable("gpu_uuid"); }
void gpu_copy_to_device(void *dst, const void *host, size_t bytes, cudaStream_t stream) {
    gpu_unavailable("gpu_copy_to_device");
}
void gpu_copy_to_host(void *host, const void *src, size_t bytes, cudaStream_t stream) {
    gpu_unavailable("gpu_copy_to_host");
}
void gpu_copy_on_device(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
    gpu_unavailable("gpu_copy_on_device");
}
void gpu_fill(void *dst, int byte, size_t bytes, cudaStream_t stream) { gpu_unavailable("gpu_fill"); }
void gpu_sync(cudaStream_t stream) { gpu_unavailable("gpu_sync"); }
void gpu_event_create(cudaEvent_t *e, int timing) { gpu_unavailable("gpu_event_create"); }
void gpu_event_destroy(cudaEvent_t e) { gpu_unavailable("gpu_event_destroy"); }
void gpu_event_record(cudaEvent_t e, cudaStream_t stream) { gpu_unavailable("gpu_event_record"); }
void gpu_event_sync(cudaEvent_t e) { gpu_unavailable("gpu_event_sync"); }
int gpu_event_done(cudaEvent_t e) { gpu_unavailable("gpu_event_done"); }
float gpu_event_ms(cudaEvent_t from, cudaEvent_t to) { gpu_unavailable("gpu_event_ms"); }
void gpu_wait_event(cudaStream_t stream, cudaEvent_t e) { gpu_unavailable("gpu_wait_event"); }
void gpu_cudnn_stream(cudnnHandle_t h, cudaStream_t stream) { gpu_unavailable("gpu_cudnn_stream"); }
void gpu_capture_begin(cudaStream_t stream) { gpu_unavailable("CUDA graphs (perf.cuda_graph)"); }
cudaGraphExec_t gpu_capture_end(cudaStream_t stream, int node_priority) {
    gpu_unavailable("CUDA graphs (perf.cuda_graph)");
}
void gpu_graph_launch(cudaGraphExec_t graph, cudaStream_t stream) { gpu_unavailable("gpu_graph_launch"); }
void gpu_graph_destroy(cudaGraphExec_t graph) { gpu_unavailable("gpu_graph_destroy"); }
void gpu_profiler_start(void) { gpu_unavailable("the CUDA profiler range (run.profile_steps)"); }
void gpu_profiler_stop(void) { gpu_unavailable("the CUDA profiler range (run.profile_steps)"); }
void gpu_range_push(const char *name) {}
void gpu_range_pop(void) {}

#endif
