/* The one place where trainc's headers meet CUDA's. CMake defines TRAINC_CUDA
 * for every source: 1 in a CUDA build, where this includes the CUDA runtime,
 * cuDNN, cuBLAS and NCCL headers; 0 in a build without CUDA, where it declares
 * only the opaque handle types that host structs hold (a stream in a Model, an
 * event in the trainer, a descriptor in a layer), exactly as those headers
 * declare them, so that the structs compile. Nothing can be done with them
 * there: every CUDA call is compiled only in CUDA builds (runtime/gpu.h's
 * GPU_ONLY, the GPU-only sources CMake leaves out). */
#ifndef TRAINC_CUDA_API_H
#define TRAINC_CUDA_API_H

#if !defined(TRAINC_CUDA)
#error "TRAINC_CUDA is not defined: build trainc through CMake, which sets it to 1 or 0"
#elif TRAINC_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#else

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct cudnnContext *cudnnHandle_t;
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct *cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct *cudnnConvolutionDescriptor_t;
typedef struct cudnnPoolingStruct *cudnnPoolingDescriptor_t;
typedef void *cudnnBackendDescriptor_t;
/* cuDNN's algorithm enums, kept as plain numbers. */
typedef int cudnnConvolutionFwdAlgo_t;
typedef int cudnnConvolutionBwdDataAlgo_t;
typedef int cudnnConvolutionBwdFilterAlgo_t;
typedef struct cublasContext *cublasHandle_t;
typedef struct ncclComm *ncclComm_t;

#endif
#endif
