/* The device side of the gradient buckets (grad_buckets_gpu.c, CUDA builds
 * only), for grad_buckets.c where the gradients are on the GPU (on_device):
 * the gradients' check, the events and comm buffer, one launch of buckets
 * [from, to) (NCCL or the copy engines), a pass's end (the found-inf flag, the
 * sharded optimizer's bookkeeping, the join) and freeing. The public GPU-only
 * calls of grad_buckets.h (the peer link, sharding, the flag) live there too. */
#ifndef TRAINC_DIST_GRAD_BUCKETS_GPU_H
#define TRAINC_DIST_GRAD_BUCKETS_GPU_H

#include "dist/grad_buckets.h"

#ifdef __cplusplus
extern "C" {
#endif

void grad_buckets_gpu_check(const GradBuckets *b);
void grad_buckets_gpu_init(GradBuckets *b);
void grad_buckets_gpu_launch(GradBuckets *b, int from, int to, cudaStream_t compute);
void grad_buckets_gpu_finish(GradBuckets *b, cudaStream_t compute);
void grad_buckets_gpu_free(GradBuckets *b);

#ifdef __cplusplus
}
#endif
#endif
