/* The GPU a process trains on: its streams and library handles. */
#ifndef TRAINC_GPU_H
#define TRAINC_GPU_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int device_id;
    struct cudaDeviceProp prop;
    cudaStream_t compute; /* forward, backward, optimizer */
    cudaStream_t copy;    /* host-to-device batch copies */
    cudnnHandle_t cudnn;  /* bound to 'compute' */
    cublasHandle_t cublas;/* bound to 'compute' */
} GpuContext;

/* Number of usable GPUs; 0 when there is no driver or device (never fails). */
int gpu_count(void);
void gpu_context_init(GpuContext *g, int device_id);
void gpu_context_destroy(GpuContext *g);

#ifdef __cplusplus
}
#endif
#endif
