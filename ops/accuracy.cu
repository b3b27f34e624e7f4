#include "ops/accuracy.h"

#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

#define ACCURACY_THREADS 256

/* One thread per row (argmax as in accuracy_count_cpu), a block-wide count in
 * shared memory, then one integer atomicAdd per block: exact, so deterministic. */
template <typename T>
static __global__ void accuracy_kernel(const T *logits, const int32_t *labels, int n,
                                       int classes, int *count) {
    __shared__ int block_count;
    if (threadIdx.x == 0) block_count = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const T *row = logits + (size_t)i * classes;
        int best = 0;
        float best_value = to_float(row[0]);
        for (int j = 1; j < classes; j++) {
            float v = to_float(row[j]);
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

template <typename T>
static void launch_accuracy(const void *logits, const int32_t *labels, int n, int classes,
                            int *count_device, cudaStream_t stream) {
    unsigned blocks = (unsigned)((n + ACCURACY_THREADS - 1) / ACCURACY_THREADS);
    accuracy_kernel<T><<<blocks, ACCURACY_THREADS, 0, stream>>>((const T *)logits, labels, n,
                                                               classes, count_device);
    CUDA_CHECK_LAUNCH();
}

void accuracy_count_cuda(DType dtype, const void *logits, const int32_t *labels, int n,
                         int classes, int *count_device, cudaStream_t stream) {
    check_float_dtype("accuracy", dtype);
    if (n <= 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_accuracy, logits, labels, n, classes, count_device, stream);
}
