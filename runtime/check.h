/* Error checking: every CUDA, cuDNN, cuBLAS and NCCL call goes through one of
 * these macros, which name the failed call, its error and the place. */
#ifndef TRAINC_CHECK_H
#define TRAINC_CHECK_H

#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <cudnn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Prints "trainc: error: <what> (<file>:<line>)" and exits with status 1.
 * Hooks registered with tc_on_fatal run first (flush logs, keep checkpoints). */
void tc_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
void tc_on_fatal(void (*hook)(void));

const char *tc_cublas_status_string(cublasStatus_t s);

#define TC_FATAL(...) tc_fatal(__FILE__, __LINE__, __VA_ARGS__)

#define CUDA_CHECK(call) do { cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) tc_fatal(__FILE__, __LINE__, "%s failed: %s (%s)", #call, \
        cudaGetErrorString(e_), cudaGetErrorName(e_)); } while (0)
#define CUDNN_CHECK(call) do { cudnnStatus_t e_ = (call); \
    if (e_ != CUDNN_STATUS_SUCCESS) tc_fatal(__FILE__, __LINE__, "%s failed: %s", #call, \
        cudnnGetErrorString(e_)); } while (0)
#define CUBLAS_CHECK(call) do { cublasStatus_t e_ = (call); \
    if (e_ != CUBLAS_STATUS_SUCCESS) tc_fatal(__FILE__, __LINE__, "%s failed: %s", #call, \
        tc_cublas_status_string(e_)); } while (0)
/* After a kernel launch: catches bad launch configurations at the launch site. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#ifdef __cplusplus
}
#endif
#endif
