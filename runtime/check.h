/* Fatal errors, and error checking: every CUDA, cuDNN, cuBLAS and NCCL call
 * goes through one of the macros below, which name the failed call, its error
 * and the place. The CUDA ones exist in CUDA builds only (TRAINC_CUDA). */
#ifndef TRAINC_CHECK_H
#define TRAINC_CHECK_H

#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Prints "trainc: error: <what> (<file>:<line>)" and exits with status 1.
 * Hooks registered with tc_on_fatal run first (flush logs, keep checkpoints). */
void tc_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
void tc_on_fatal(void (*hook)(void));
/* Where the message goes instead of stderr ("trainc: error: <message>"); the
 * hooks run after it. A data-parallel run prints a message that every rank
 * gives once (dist.c). */
void tc_on_fatal_message(void (*report)(const char *message));

#define TC_FATAL(...) tc_fatal(__FILE__, __LINE__, __VA_ARGS__)
/* The user's mistake or the system's refusal (a bad file, a full disk), not
 * trainc's: the message names the input, and no place in trainc's source. */
#define TC_USER_ERROR(...) tc_fatal(NULL, 0, __VA_ARGS__)

#if TRAINC_CUDA
const char *tc_cublas_status_string(cublasStatus_t s); /* runtime/gpu.c */

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
#endif

#ifdef __cplusplus
}
#endif
#endif
