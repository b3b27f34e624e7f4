/* The inference form of a model: what eval, predict and bench-infer run.
 *
 * It is made from a built model's layers (model.h; the graph only, it
 * need not be finalized) and a set of its weights, not the training step run
 * without backward, as the planner's list of steps (models/plan_infer.c):
 *   - batch norm after a convolution is folded into the convolution's weights
 *     and bias (w * gamma / sqrt(var + eps), (b - mean) * that + beta);
 *   - the ReLU after a convolution, a linear layer, a batch norm or an add is
 *     done by that layer; an add of a convolution's output (after its folded
 *     norm) and another tensor becomes the convolution's residual input, so a
 *     residual block's second convolution, its norm, the add and the ReLU are
 *     one cuDNN graph (ops/conv_bias_act.h);
 *   - on the GPU, activations and weights in the dtype given (fp16, bf16) and
 *     channels-last, the input's 3 channels padded to 8 for the tensor cores;
 *   - no gradients, optimizer state or saved statistics; activations share
 *     buffers where their lifetimes do not overlap;
 *   - with graph on, the forward of the net's one batch size is captured as
 *     a CUDA graph at the first run and replayed after.
 * A net serves one batch size; run it on fewer images by leaving the rest of
 * the input as it is (their logits are ignored).
 * On the CPU it runs in fp32 NCHW the same steps (folded weights, fused
 * epilogues) through the ops' CPU references: the tests' reference for the
 * GPU path and for the folding against the model's own evaluation forward. */
#ifndef TRAINC_MODELS_INFER_H
#define TRAINC_MODELS_INFER_H

#include <stddef.h>

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct InferNet InferNet;

typedef struct {
    int batch;
    DType dtype;   /* GPU: activations and weights (F16, BF16 or F32); the CPU takes F32 only */
    int nhwc;      /* GPU: channels-last (the CPU takes NCHW only) */
    int graph;     /* GPU: replay the forward as a CUDA graph */
    ConvAlgoPolicy conv_policy; /* how each convolution's cuDNN plan is chosen (benchmark: by timing) */
} InferOptions;

/* Compiles graph (built by the zoo, shapes only) with its weights params and
 * bn_stats, host fp32 in graph's layout (as model_get_params and
 * model_get_bn_stats give them, or a checkpoint's sections), for the device
 * of gpu (NULL: the CPU). Fails with a message naming what is unsupported. */
InferNet *infer_create(const Model *graph, const float *params, const float *bn_stats, GpuContext *gpu,
                       const InferOptions *opt);
void infer_destroy(InferNet *net);

/* Where a batch lands: [batch][c][h][w] fp32 NCHW, c the image's real
 * channels, on the net's device. */
float *infer_input(const InferNet *net);
size_t infer_input_floats(const InferNet *net);
/* Runs the forward on the whole input; the logits, [batch][classes] fp32 on
 * the net's device, are ready once the net's stream reaches them (op_sync on
 * infer_ops). */
void infer_run(InferNet *net);
const float *infer_logits(const InferNet *net);
const OpContext *infer_ops(const InferNet *net);
/* Hooks around each op (op_context.h), labelled by layer; they see the ops
 * only when run eagerly (not under opt.graph, whose replay runs no host code). */
void infer_set_hooks(InferNet *net, const OpHooks *hooks);
int infer_batch(const InferNet *net);
int infer_classes(const InferNet *net);

/* What the compilation made of the layers, for the log: steps, convolutions
 * run as one fused cuDNN graph and those that fell back, batch norms folded,
 * ReLUs and adds fused, and the bytes held on the device. */
typedef struct {
    int steps, convs, convs_fused, bn_folded, relu_fused, add_fused;
    size_t weight_bytes, activation_bytes, workspace_bytes;
} InferStats;
InferStats infer_stats(const InferNet *net);

#ifdef __cplusplus
}
#endif
#endif
