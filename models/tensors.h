/* A model's tensors under PyTorch's names: each layer with parameters gives
 * "<module>.weight" and ".bias" (a convolution without bias only the weight),
 * a batch norm also ".running_mean" and ".running_var" (its
 * num_batches_tracked is left out). Shapes are PyTorch's: conv [k][c][r][s]
 * over the real input channels, linear [out][in], the rest [c]. The data
 * lives in the flat fp32 parameters (m->params) or in the running statistics
 * (m->bn_running), in the model's layout; model_tensor_get and _put convert. */
#ifndef TRAINC_MODELS_TENSORS_H
#define TRAINC_MODELS_TENSORS_H

#include <stddef.h>

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_TENSOR_NAME_LEN 64
#define MODEL_TENSOR_MAX_DIMS 4

typedef struct {
    char name[MODEL_TENSOR_NAME_LEN];
    int ndim;
    int shape[MODEL_TENSOR_MAX_DIMS]; /* PyTorch's */
    size_t count;                     /* elements: the product of shape */
    int in_bn_stats;                  /* 1: offset counts into the running statistics, 0: into the parameters */
    size_t offset;                    /* floats */
    int layer;                        /* the layer it belongs to */
    int is_conv_or_linear_weight;     /* stored in the model's layout (model_weight_index), not as it is */
} ModelTensor;

/* Lists m's tensors in layer order into out (room for max); returns how many
 * there are (more than max: only max written), or -1 with a message in err
 * when a layer with parameters has no module name. */
int model_tensors(const Model *m, ModelTensor *out, int max, char *err, size_t errlen);

/* Copies tensor t out of params/bn_stats (the model's layout) into out in
 * PyTorch's order (t->count floats), or back. put leaves padded input
 * channels as they are. */
void model_tensor_get(const Model *m, const ModelTensor *t, const float *params, const float *bn_stats, float *out);
void model_tensor_put(const Model *m, const ModelTensor *t, const float *in, float *params, float *bn_stats);

#ifdef __cplusplus
}
#endif
#endif
