#include "runtime/gpu.h"

#include <string.h>

#include "runtime/check.h"
#include "runtime/log.h"

int gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

void gpu_context_init(GpuContext *g, int device_id) {
    memset(g, 0, sizeof *g);
    g->device_id = device_id;
    CUDA_CHECK(cudaSetDevice(device_id));
    CUDA_CHECK(cudaGetDeviceProperties(&g->prop, device_id));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking));
    CUDNN_CHECK(cudnnCreate(&g->cudnn));
    CUDNN_CHECK(cudnnSetStream(g->cudnn, g->compute));
    CUBLAS_CHECK(cublasCreate(&g->cublas));
    CUBLAS_CHECK(cublasSetStream(g->cublas, g->compute));
    log_info("gpu %d: %s, %d SMs, %.1f GiB, cuDNN %zu", device_id, g->prop.name,
             g->prop.multiProcessorCount, g->prop.totalGlobalMem / 1073741824.0, cudnnGetVersion());
}

void gpu_context_destroy(GpuContext *g) {
    if (g->cublas) CUBLAS_CHECK(cublasDestroy(g->cublas));
    if (g->cudnn) CUDNN_CHECK(cudnnDestroy(g->cudnn));
    if (g->copy) CUDA_CHECK(cudaStreamDestroy(g->copy));
    if (g->compute) CUDA_CHECK(cudaStreamDestroy(g->compute));
    memset(g, 0, sizeof *g);
}
