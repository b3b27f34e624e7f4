#include "ops/sgd.h"

#include "ops/cuda_launch.h"
#include "runtime/check.h"

/* The same update as sgd_step_cpu (see sgd.h), one pass over the flat buffers. */
static __global__ void sgd_step_kernel(float *w, const float *grad, float *m, size_t n,
                                       const float *lr_device, float momentum,
                                       float weight_decay, int nesterov) {
    float step = *lr_device;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float weight = w[i];
        float g = grad[i] + weight_decay * weight;
        float mom = momentum * m[i] + g;
        float d = nesterov ? g + momentum * mom : mom;
        m[i] = mom;
        w[i] = weight - step * d;
    }
}

void sgd_step_cuda(float *w, const float *grad, float *m, size_t n, const float *lr_device,
                   SgdParams p, cudaStream_t stream) {
    if (n == 0) return;
    sgd_step_kernel<<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(
        w, grad, m, n, lr_device, p.momentum, p.weight_decay, p.nesterov);
    CUDA_CHECK_LAUNCH();
}
