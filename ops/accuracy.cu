#include "ops/accuracy.h"

#include "runtime/check.h"

#define ACCURACY_THREADS 256

/* One thread per row (argmax as in accuracy_count_cpu), a block-wide count in
 * shared memory, then one integer atomicAdd per block: exact, so deterministic. */
static __global__ void accuracy_kernel(const float *logits, const int32_t *labels, int n,
                                       int classes, int *count) {
    __shared__ int block_count;
    if (threadIdx.x == 0) block_count = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float *row = logits + (size_t)i * classes;
        int best = 0;
        float best_value = row[0];
        for (int j = 1; j < classes; j++) {
            float v = row[j];
            if (v > best_value) {
                best = j;
                best_value = v;
            }
        }
        if (best == labels[i]) atomicAdd(&block_count, 1);
    }
    __syncthreads();
    if (threadIdx.x == 0 && block_count) atomicAdd(count, block_count);
}

void accuracy_count_cuda(const float *logits, const int32_t *labels, int n, int classes,
                         int *count_device, cudaStream_t stream) {
    if (n <= 0) return;
    unsigned blocks = (unsigned)((n + ACCURACY_THREADS - 1) / ACCURACY_THREADS);
    accuracy_kernel<<<blocks, ACCURACY_THREADS, 0, stream>>>(logits, labels, n, classes,
                                                            count_device);
    CUDA_CHECK_LAUNCH();
}
