/* A model is a list of layers over numbered activations. Each layer reads the
 * activations it names and writes one; a builder call adds a layer and returns
 * the id of its output, so a net reads as a short composition:
 *
 *     int x = model_input(m, 3, 32, 32);
 *     x = model_conv(m, x, 64, 3, 1, 1);
 *     x = model_relu(m, x);
 *
 * Layers name their inputs by id rather than "the previous one", so a residual
 * block (two paths meeting in an add) fits the same form.
 *
 * All parameters live in one flat buffer, and so do their gradients and the
 * optimizer state: one fused optimizer kernel, one all-reduce, one memset.
 * Every buffer comes from one arena allocated at model_finalize, so addresses
 * never change during training. */
#ifndef TRAINC_MODELS_MODEL_H
#define TRAINC_MODELS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ops/conv2d.h"
#include "ops/linear.h"
#include "ops/maxpool.h"
#include "runtime/arena.h"
#include "runtime/gpu.h"
#include "runtime/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_MAX_LAYERS 256
#define MODEL_MAX_ACTS 257

typedef enum { LAYER_CONV, LAYER_RELU, LAYER_MAXPOOL, LAYER_LINEAR } LayerKind;

typedef struct {
    LayerKind kind;
    int in, out;          /* activation ids */
    size_t w_off, b_off;  /* offsets (in floats) into the flat parameter buffer */
    size_t w_count, b_count;
    size_t fan_in;        /* for initialisation */
    Conv2dShape conv;
    Conv2dCuda conv_cuda;
    Pool2dShape pool;
    MaxPoolCuda pool_cuda;
    LinearShape linear;
    int block;            /* the checkpoint block it belongs to, or -1 */
    int fused;            /* conv: adds its bias and the ReLU after it in one pass; relu: done by that conv;
                             maxpool (NCHW): its backward applies that ReLU's backward too */
    int relu_grad_by_pool;/* conv: the max-pool after its ReLU did the ReLU's backward */
} Layer;

typedef struct {
    int c, h, w;          /* per sample; a matrix activation is c features, h = w = 1 */
    int c_real;           /* channels that carry data (the input's c is padded under NHWC) */
    int shares_with;      /* -1, or the id whose storage this one reuses (in-place ReLU) */
    int grad_slot;        /* which gradient buffer holds d(loss)/d(this); -1: none */
    int internal_to;      /* block whose inside it is (recomputed under checkpointing), or -1 */
    size_t region_offset; /* where it lives in the shared recompute region (checkpointing) */
    void *value;          /* [batch][c][h][w] of the model's activation dtype */
} Activation;

typedef struct {
    DeviceKind device;
    GpuContext *gpu;      /* NULL on the CPU */
    int batch;
    int num_classes;
    int nhwc;             /* channels-last layout (set by model_init) */
    DType act_dtype;      /* set before model_finalize: activations and their gradients (F32, F16, BF16) */
    ConvAlgoPolicy conv_policy; /* set before model_finalize (model_init: 256 MiB, strict fp32) */

    Layer layers[MODEL_MAX_LAYERS];
    int n_layers;
    Activation acts[MODEL_MAX_ACTS];
    int n_acts;
    int n_blocks, open_block;  /* blocks marked by model_block_begin/end; open_block -1 outside */
    int checkpoint;       /* set before model_finalize: keep only block outputs, recompute inside */
    int fuse;             /* set before model_finalize: conv + bias + ReLU as one conv and one pass (GPU) */
    void *recompute_region; /* shared by the insides of every block under checkpointing */

    size_t n_params;
    float *params;        /* flat, n_params: the fp32 master weights */
    void *weights;        /* what the layers read: params itself in fp32, a rounded copy under AMP */
    void *grads;          /* flat, n_params, activation dtype; parameter gradients are accumulated into it */
    float *momentum;      /* flat, n_params */
    float *input_f32;     /* under AMP: the fp32 batch, cast into the input activation by forward */
    void *act_grads[2];   /* ping-pong buffers for activation gradients */
    size_t act_grad_floats[2]; /* each sized (in elements) for the largest gradient it holds */
    void *workspace;      /* cuDNN workspace shared by all convolutions */
    size_t workspace_bytes;

    Arena arena;          /* owns every buffer above */
} Model;

/* Builder. model_input must come first; shapes are inferred as layers are added
 * and impossible ones (a pool over an odd size, say) fail naming the layer. */
/* nhwc: activations channels-last ([n][h][w][c]), conv weights [k][r][s][c],
 * and the input's channels padded to 8 for the tensor cores (GPU only). */
void model_init(Model *m, int batch, int num_classes, int nhwc);
int model_input(Model *m, int c, int h, int w);
int model_conv(Model *m, int in, int out_channels, int kernel, int pad, int stride);
int model_relu(Model *m, int in);
int model_maxpool2(Model *m, int in);
int model_linear(Model *m, int in, int out_features);
/* A block: the layers between begin and end. Under checkpointing, forward keeps
 * only the block's input and output; backward runs the block forward again to
 * get its inside back. */
void model_block_begin(Model *m);
void model_block_end(Model *m);

/* Allocates every buffer in one arena on the device (gpu != NULL) or the host,
 * picks the convolution algorithms and initialises the parameters like
 * PyTorch's defaults (uniform in +-1/sqrt(fan_in)) from the seed. */
void model_finalize(Model *m, GpuContext *gpu, uint64_t seed);
void model_destroy(Model *m);

float *model_input_buffer(const Model *m);   /* [batch][c][h][w] fp32, where batches land */
void *model_logits(const Model *m);          /* [batch][num_classes], activation dtype */
void *model_logits_grad(const Model *m);     /* where the loss writes d(loss)/d(logits) */
size_t model_input_floats(const Model *m);

void model_forward(Model *m);
/* Needs the logits gradient in model_logits_grad; adds parameter gradients to
 * m->grads (zero them with model_zero_grads once per optimizer step). */
void model_backward(Model *m);
void model_zero_grads(Model *m);

/* Copies the fp32 master parameters between a model and host memory
 * (n_params floats); setting them refreshes the rounded copy under AMP. */
void model_get_params(const Model *m, float *host);
void model_set_params(Model *m, const float *host);

/* The same for the optimizer's momentum buffer (n_params floats, fp32). */
void model_get_momentum(const Model *m, float *host);
void model_set_momentum(Model *m, const float *host);

/* Bytes of the arena: what the model holds on its device. */
size_t model_bytes(const Model *m);

/* Builds a named model ("simplenet"); returns 0, or -1 with a message for an
 * unknown name or an impossible input size. */
int model_build(Model *m, const char *name, int batch, int image_size, int num_classes, int nhwc,
                char *err, size_t errlen);
/* SimpleNet: 3 x (conv3x3 + ReLU + maxpool2), fc 256*(s/8)^2 -> 512, ReLU, fc -> classes. */
void simplenet_build(Model *m, int image_size);

#ifdef __cplusplus
}
#endif
#endif
