#include "ops/silu.h"

#include "ops/activation.cuh"

/* sigmoid(x) = 1 / (1 + exp(-x)); exp(-x) is inf below about -88, giving 0. */
struct SiluMath {
    static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
    static __device__ __forceinline__ float value(float x) { return x * sigmoid(x); }
    static __device__ __forceinline__ float slope(float x) {
        float s = sigmoid(x);
        return s * (1.0f + x * (1.0f - s));
    }
};

void silu_forward_cuda(DType dtype, const void *x, void *y, size_t n, cudaStream_t stream) {
    activation_cuda<SiluMath>("silu", dtype, x, NULL, y, n, stream);
}

void silu_backward_cuda(DType dtype, const void *x, const void *dy, void *dx, size_t n, cudaStream_t stream) {
    activation_cuda<SiluMath>("silu", dtype, x, dy, dx, n, stream);
}
