/* SGD with momentum, Nesterov and L2 weight decay, PyTorch's semantics (no
 * dampening), in one pass over flat buffers of n parameters:
 *   g = grad + weight_decay * w
 *   m = momentum * m + g
 *   d = nesterov ? g + momentum * m : m
 *   w = w - lr * d
 * lr is read through a pointer (host memory for the CPU path, device memory for
 * the CUDA path) so a schedule can change it without re-recording a CUDA graph. */
#ifndef TRAINC_OPS_SGD_H
#define TRAINC_OPS_SGD_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float momentum;
    float weight_decay;
    int nesterov;
} SgdParams;

void sgd_step_cpu(float *w, const float *grad, float *m, size_t n, const float *lr,
                  SgdParams p);
void sgd_step_cuda(float *w, const float *grad, float *m, size_t n, const float *lr_device,
                   SgdParams p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
