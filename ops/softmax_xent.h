/* Softmax cross-entropy over logits [n][classes] with int32 labels.
 * loss = mean_n ( logsumexp(logits[n]) - logits[n][label[n]] )
 * dlogits[n][j] = (softmax(logits[n])[j] - (j == label[n])) * grad_scale / n
 * grad_scale is read through a pointer, NULL meaning 1: in host memory for the
 * CPU path, in device memory for the CUDA path, where the loss scaler passes
 * &state->scale (see loss_scaler.h) so the scale changes without a host sync.
 * The CUDA path is one kernel that writes the loss (fp32) to device memory (no
 * host sync) with a fixed reduction order, so the loss is deterministic. Its
 * logits and dlogits are stored as dtype (f32, f16 or bf16); the softmax and
 * the loss are computed in fp32 and dlogits is rounded once.
 *
 * The _smooth versions add label smoothing eps (PyTorch's
 * CrossEntropyLoss(label_smoothing=eps)): the target of row n is
 * q[j] = (1 - eps) * (j == label[n]) + eps / classes, so
 *   loss = mean_n ( logsumexp(logits[n]) - sum_j q[j] * logits[n][j] )
 *   dlogits[n][j] = (softmax(logits[n])[j] - q[j]) * grad_scale / n
 * eps must lie in [0, 1]; the plain versions are the smooth ones with eps = 0,
 * which give the same bits as before smoothing existed. */
#ifndef TRAINC_OPS_SOFTMAX_XENT_H
#define TRAINC_OPS_SOFTMAX_XENT_H

#include <stdint.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The face (op_context.h): logits and dlogits of ctx->dtype, labels, loss and
 * grad_scale in ctx's device memory. */
void softmax_xent_smooth(const OpContext *ctx, const void *logits, const int32_t *labels, int n, int classes,
                         float smoothing, const float *grad_scale, float *loss, void *dlogits);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void softmax_xent_cpu(const float *logits, const int32_t *labels, int n, int classes,
                      const float *grad_scale, float *loss, float *dlogits);
void softmax_xent_cuda(DType dtype, const void *logits, const int32_t *labels, int n, int classes,
                       const float *grad_scale, float *loss_device, void *dlogits,
                       cudaStream_t stream);
void softmax_xent_smooth_cpu(const float *logits, const int32_t *labels, int n, int classes,
                             float smoothing, const float *grad_scale, float *loss,
                             float *dlogits);
void softmax_xent_smooth_cuda(DType dtype, const void *logits, const int32_t *labels, int n,
                              int classes, float smoothing, const float *grad_scale,
                              float *loss_device, void *dlogits, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
