#include "ops/gelu.h"
#include "ops/gelu_math.h"

#include "ops/activation.cuh"

struct GeluMath {
    static __device__ __forceinline__ float value(float x) { return gelu_value_f(x); }
    static __device__ __forceinline__ float slope(float x) { return gelu_grad_f(x); }
};

void gelu_forward_cuda(DType dtype, const void *x, void *y, size_t n, cudaStream_t stream) {
    activation_cuda<GeluMath>("gelu", dtype, x, NULL, y, n, stream);
}

void gelu_backward_cuda(DType dtype, const void *x, const void *dy, void *dx, size_t n, cudaStream_t stream) {
    activation_cuda<GeluMath>("gelu", dtype, x, dy, dx, n, stream);
}
