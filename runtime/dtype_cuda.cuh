/* The storage types of the CUDA kernels (CUDA sources only, in ops/, dist/ or
 * any other layer): float, __half and __nv_bfloat16. Kernels are templated on the storage type and compute in
 * float: load with to_float, store with from_float<T> (round to nearest even).
 * For float both are the identity, so a float instantiation does exactly what
 * the untemplated kernel did. */
#ifndef TRAINC_DTYPE_CUDA_CUH
#define TRAINC_DTYPE_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>
#include <library_types.h>

#include "runtime/check.h"
#include "runtime/dtype.h"

static __device__ __forceinline__ float to_float(float v) { return v; }
static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

/* N elements of T moved as one aligned load or store (16 bytes at most). */
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

static inline bool dtype_is_float(DType dt) {
    return dt == DTYPE_F32 || dt == DTYPE_F16 || dt == DTYPE_BF16;
}

/* Fails naming the op unless dt is one of the three floating types. */
static inline void check_float_dtype(const char *op, DType dt) {
    if (!dtype_is_float(dt))
        TC_FATAL("%s: dtype %s is not supported (f32, f16 or bf16)", op, dtype_name(dt));
}

static inline cudnnDataType_t dtype_cudnn(DType dt) {
    switch (dt) {
    case DTYPE_F16: return CUDNN_DATA_HALF;
    case DTYPE_BF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
    }
}

static inline cudaDataType_t dtype_cuda(DType dt) {
    switch (dt) {
    case DTYPE_F16: return CUDA_R_16F;
    case DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

/* Calls LAUNCH<T>(args...) with T the storage type of dt. LAUNCH is a function
 * template; dt must have passed check_float_dtype. */
#define DISPATCH_FLOAT_DTYPE(dt, LAUNCH, ...)                      \
    do {                                                           \
        switch (dt) {                                              \
        case DTYPE_F16: LAUNCH<__half>(__VA_ARGS__); break;        \
        case DTYPE_BF16: LAUNCH<__nv_bfloat16>(__VA_ARGS__); break; \
        default: LAUNCH<float>(__VA_ARGS__); break;                \
        }                                                          \
    } while (0)

#endif
