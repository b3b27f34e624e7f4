/* A captured CUDA graph rewritten before it is instantiated (CUDA builds only;
 * gpu_capture_end calls it). */
#ifndef TRAINC_GPU_GRAPH_H
#define TRAINC_GPU_GRAPH_H

#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The small memset nodes of 'graph' (at most GPU_GRAPH_FILL_MAX_BYTES each)
 * as kernel nodes, each chain of them (one after another, nothing else
 * waiting on them) as one kernel with their edges. cuDNN's fused convolution
 * plans zero their statistics and counters with memsets before each
 * convolution: in a replayed ResNet-18 step on an H200 each memset node left
 * the GPU idle about 2 us on either side, where a kernel node leaves 0.5.
 * Returns the number of memset nodes replaced, or -1 when the graph
 * allocates memory (cudaMallocAsync captured), which keeps CUDA from
 * removing any of its nodes: then it is left as it is. */
#define GPU_GRAPH_FILL_MAX_BYTES 65536
int gpu_graph_fills_as_kernels(cudaGraph_t graph);

#ifdef __cplusplus
}
#endif

#endif
