/* Softmax cross-entropy over logits [n][classes] with int32 labels.
 * loss = mean_n ( logsumexp(logits[n]) - logits[n][label[n]] )
 * dlogits[n][j] = (softmax(logits[n])[j] - (j == label[n])) * grad_scale / n
 * grad_scale is 1 in plain training (the loss scaler passes its scale later).
 * The CUDA path is one kernel that writes the loss to device memory (no host
 * sync) with a fixed reduction order, so the loss is deterministic. */
#ifndef TRAINC_OPS_SOFTMAX_XENT_H
#define TRAINC_OPS_SOFTMAX_XENT_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void softmax_xent_cpu(const float *logits, const int32_t *labels, int n, int classes,
                      float grad_scale, float *loss, float *dlogits);
void softmax_xent_cuda(const float *logits, const int32_t *labels, int n, int classes,
                       float grad_scale, float *loss_device, float *dlogits, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
