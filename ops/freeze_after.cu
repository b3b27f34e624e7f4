#include "ops/freeze_after.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"

/* One block: the ranges frozen this way are a layer's bias, tens of floats. */
static __global__ void freeze_after_kernel(const int64_t *step_counter, int64_t steps, float *lr_scale, size_t n) {
    if (*step_counter <= steps) return;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) lr_scale[i] = 0.0f;
}

void freeze_after_cuda(const int64_t *step_counter_dev, int64_t steps, float *lr_scale_dev, size_t n,
                       cudaStream_t stream) {
    if (n == 0) return;
    freeze_after_kernel<<<1, 256, 0, stream>>>(step_counter_dev, steps, lr_scale_dev, n);
    CUDA_CHECK_LAUNCH();
}
