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

#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/dropout.h"
#include "ops/linear.h"
#include "ops/maxpool.h"
#include "ops/muon.h"
#include "ops/op_context.h"
#include "runtime/arena.h"
#include "runtime/dtype.h"
#include "runtime/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_MAX_LAYERS 512
#define MODEL_MAX_ACTS 513
#define MODEL_MAX_GRAD_SLOTS 16

/* What each kind runs: models/layers.c's layer_kinds. */
typedef enum {
    LAYER_CONV, LAYER_RELU, LAYER_MAXPOOL, LAYER_LINEAR, LAYER_BATCHNORM, LAYER_ADD, LAYER_AVGPOOL, LAYER_GELU,
    LAYER_SCALE, LAYER_SILU, LAYER_DROPOUT, LAYER_CONCAT, LAYER_FLATTEN,
    LAYER_KINDS
} LayerKind;

typedef struct {
    LayerKind kind;
    int in, out;          /* activation ids */
    int in2;              /* add, concat: the second input; -1 for every other layer */
    size_t w_off, b_off;  /* offsets (in floats) into the flat parameter buffer: multiples of MODEL_PARAM_ALIGN
                             (b_off where b_count > 0) */
    size_t w_count, b_count;
    size_t fan_in;        /* for initialisation */
    Conv2d conv;          /* the op of each kind: its shape (and on the GPU its cuDNN state) */
    MaxPool2d pool;       /* maxpool; avgpool: its window (model_avgpool2d; pool.shape.n 0: global) */
    void *pool_scratch;   /* maxpool (GPU): its own, where its forward keeps each maximum's place for its
                             backward (ops/maxpool.h); NULL: none needed */
    LinearShape linear;
    BatchNorm bn;         /* batch norm: gamma at w_off, beta at b_off (c each) */
    float scale;          /* scale: the constant factor */
    float drop;           /* dropout: the share of elements dropped in training */
    size_t stat_off;      /* batch norm: running mean and variance at bn_running + stat_off (c each),
                             the batch's mean and 1/std for backward at bn_saved + stat_off, its input's sums
                             at bn_sums + stat_off where a conv makes them (models/plan.h) */
    int block;            /* the checkpoint block it belongs to, or -1 */
    int whitening;        /* conv: its weights are set from the data (models/whiten.h) and never trained */
    int dirac;            /* conv: its first min(out, in) filters start as the identity (model_dirac_last) */
    char name[24];        /* "conv 3": the label its ops carry to the op hooks (NVTX under nvtx_layers) */
    char module[48];      /* layers with parameters: PyTorch's module name ("layer1.0.conv1"), which names
                             its tensors (models/tensors.h); empty: unnamed */
} Layer;

typedef struct {
    int c, h, w;          /* per sample; a matrix activation is c features, h = w = 1 */
    int c_real;           /* channels that carry data (the input's c is padded under NHWC) */
    int shares_with;      /* -1, or the id whose storage this one reuses (in-place ReLU, flatten); the plan
                             may join more (models/plan.h: ActivationPlan) */
    int internal_to;      /* block whose inside it is (recomputed under checkpointing), or -1 */
    void *value;          /* [batch][c][h][w] of the model's activation dtype */
} Activation;

typedef struct {
    DeviceKind device;
    GpuContext *gpu;      /* NULL on the CPU */
    OpContext ops;        /* where every layer's op runs (set by model_finalize); its hooks see each op, its
                             label the running layer's name (NULL between layers) */
    int batch;
    int num_classes;
    int nhwc;             /* channels-last layout (set by model_init) */
    DType act_dtype;      /* set before model_finalize: activations and their gradients (F32, F16, BF16) */
    ConvAlgoPolicy conv_policy; /* set before model_finalize (model_init: 256 MiB, strict fp32) */

    Layer layers[MODEL_MAX_LAYERS]; /* what the net is, set by the builders (model_finalize sets only the ops'
                                       state in them: descriptors, algorithms, scratch) */
    int n_layers;
    struct Plan *plan;    /* how it runs (models/plan.h): made by model_finalize, read by the passes */
    Activation acts[MODEL_MAX_ACTS];
    int n_acts;
    int n_blocks, open_block;  /* blocks marked by model_block_begin/end; open_block -1 outside */
    int build_err;        /* 1: a builder that cannot make its layer returns -1 and writes why (without the
                             layer) into build_err_text (the first failure's); 0: it stops the program */
    char build_err_text[256];
    int checkpoint;       /* set before model_finalize: keep only block outputs, recompute inside */
    int fuse;             /* set before model_finalize: conv + bias + ReLU, batch norm + ReLU or GELU,
                             the whitening conv + bias + GELU and add + ReLU each in one pass (GPU) */
    int fuse_graphs;      /* set before model_finalize (GPU; not with bn_allreduce): each convolution right
                             before a batch norm computes that norm's statistics in its epilogue where a cuDNN
                             engine takes the shape and (conv_policy.benchmark) times faster
                             (models/plan_graphs.c) */
    int overlap_wgrad;    /* set before model_finalize (GPU): backward runs each convolution's filter gradient on
                             the GPU's side stream, beside the batch norms, ReLUs and adds before it, and joins it
                             back before the next layer of another kind (models/layers.c, wgrad_fork) */
    int input_form_block; /* set before model_finalize (tests): 1 or 2 runs a convolution over the input image
                             on that form (models/plan.c) wherever it fits, untimed; 0: the fastest */
    int no_decay_bn_bias; /* set before model_finalize: decay_mask leaves out biases and batch-norm parameters */
    int training;         /* 1 (model_finalize's default): batch norm normalises with the batch's statistics
                             and updates the running ones; 0: evaluation, with the running ones */
    int recomputing;      /* inside a checkpointed block's second forward: running statistics stay put */
    /* Dropout's masks (ops/dropout.h) follow a seed (model_init_params') and a step, both on the device: each
     * training forward advances the step there first (inside its CUDA graph), and its backward and a block's
     * recompute read it as it left it. NULL without dropout layers; dropout_seed: the seed on the host. */
    DropoutCounter *dropout;
    uint64_t dropout_seed;
    /* model_set_frozen_prefix: layers [0, frozen_layers) run no backward and the activations they write get
     * no gradient (0: every layer trains) */
    int frozen_layers;
    int first_grad_act;   /* the first activation with a gradient: 1, or past the frozen prefix's outputs */
    int nvtx_layers;      /* set before model_finalize: an NVTX range, named by the layer, around each op
                             of a layer's forward and backward (profiling; installs ops.hooks) */
    float bn_momentum, bn_eps; /* PyTorch's 0.1 and 1e-5 (model_init) */
    /* Set before model_finalize: the batch norms' gamma fixed at 1 (never trained), and their beta's share of
     * the learning rate (model_init: trained, 1). Either, or a whitening layer, gives the model lr_scale. */
    int bn_weight_fixed;
    float bn_bias_lr_scale;
    /* Set before model_finalize (model_init: 1, off): the last linear layer's share of the learning rate;
     * the trained convolutions' filters stepped by Muon, not SGD (their lr_scale 0: model_muon_matrices) */
    float head_lr_scale;
    int muon;
    int adam;             /* set before model_finalize (model_init: 0): Adam's state beside momentum (ops/adamw.h) */
    void *recompute_region; /* shared by the insides of every block under checkpointing */

    size_t n_params;      /* the flat buffers' length: the parameters and the zeros that align each layer's */
    float *params;        /* flat, n_params: the fp32 master weights */
    void *weights;        /* what the layers read: params itself in fp32, a rounded copy under AMP */
    void *grads;          /* flat, n_params, activation dtype; parameter gradients are accumulated into it */
    int grads_zeroed;     /* grads hold zeros (model_zero_grads; model_backward clears it): backward's
                             convolutions overwrite their filter gradients (conv2d's CONV2D_ADD_DW off) */
    float *momentum;      /* flat, n_params (Adam's first moment under adam) */
    float *second_moment; /* adam: flat, n_params, Adam's second moment; NULL otherwise */
    int64_t *adam_steps;  /* adam: Adam's step count, counted on the device (adamw_count_step); NULL otherwise */
    uint8_t *decay_mask;  /* n_params, 1 where weight decay applies; NULL: everywhere */
    float *lr_scale;      /* n_params, each parameter's share of the learning rate (ops/sgd.h; 0: frozen); NULL:
                             1 everywhere. Reset by model_reset_lr_scale */
    size_t n_bn_stats;    /* floats of running statistics: 2 per batch-norm channel */
    float *bn_running;    /* running mean and variance of every batch norm (model state, not parameters) */
    float *bn_saved;      /* the last training batch's mean and 1/std, for backward */
    float *bn_sums;       /* fuse_graphs: each batch norm's input sums and sums of squares (fp32, c each) */
    void *bn_coef;        /* fuse_graphs: each batch norm's scale and bias (act dtype, c each) where a conv
                             applies it as its prologue */
    float *input_f32;     /* under AMP: the fp32 batch, cast into the input activation by forward */
    int input_direct;     /* batches land in the input activation itself: no cast (model_set_input_direct) */
    /* Activation gradients share a few buffers: two share one when their
     * lifetimes in backward do not overlap (see plan_grad_slots). */
    int n_grad_slots;
    void *act_grads[MODEL_MAX_GRAD_SLOTS];
    size_t act_grad_floats[MODEL_MAX_GRAD_SLOTS]; /* each sized (in elements) for the largest gradient it holds */
    /* Called by model_backward after each layer with parameters: every
     * gradient at index >= first_ready is final (data-parallel all-reduce). */
    void (*grads_ready)(void *ctx, size_t first_ready);
    void *grads_ready_ctx;
    /* overlap_wgrad: events where backward forks a filter gradient to the side stream and where it is done; a
     * fork not joined yet, and the lowest parameter gradient queued so far (told to grads_ready at the join) */
    cudaEvent_t wgrad_fork_event, wgrad_done_event;
    int wgrad_pending;
    size_t grads_queued_from;
    /* Called by model_forward before each layer with parameters, with where
     * they lie, [first, end): under a sharded optimizer (data-parallel) part of
     * them may still be on its way from the rank that updated it. */
    void (*weights_needed)(void *ctx, size_t first, size_t end);
    void *weights_needed_ctx;
    /* Synchronized batch norm (data-parallel): in training, every batch norm
     * adds its per-channel sums over the ranks with this (see batchnorm.h's
     * BnAllreduce); NULL: each rank's own statistics. */
    BnAllreduce bn_allreduce;
    void *bn_allreduce_ctx;
    void *workspace;      /* cuDNN workspace shared by all convolutions */
    size_t workspace_bytes;
    void *dgrad_dbn_workspace; /* the convs' dgrad_dbn under overlap_wgrad, where it runs beside a filter gradient
                             that uses workspace; NULL: workspace serves them too */
    size_t dgrad_dbn_workspace_bytes;
    void *bn_scratch;     /* shared by the batch norms' reductions */
    size_t bn_scratch_bytes;

    Arena arena;          /* owns every buffer above */
} Model;

/* Builder. model_input must come first; shapes are inferred as layers are added
 * and impossible ones (a pool larger than its input, say) fail naming the layer:
 * the program stops, or, with build_err set, the builder returns -1 (0 for
 * mark_whitening and dirac_last) and the message waits in build_err_text. */
/* nhwc: activations channels-last ([n][h][w][c]), conv weights [k][r][s][c],
 * and the input's channels padded to 8 for the tensor cores (GPU only). */
void model_init(Model *m, int batch, int num_classes, int nhwc);
int model_input(Model *m, int c, int h, int w);
int model_conv(Model *m, int in, int out_channels, int kernel, int pad, int stride);
int model_conv_no_bias(Model *m, int in, int out_channels, int kernel, int pad, int stride);
/* Either of the two with its channels in groups (PyTorch's nn.Conv2d groups; depthwise: groups = in = out
 * channels): filters [out][in / groups][kernel][kernel], fan_in (in / groups) * kernel * kernel; bias 0 or 1.
 * A grouped one takes none of model.fuse's special paths but bias + ReLU (models/plan.c). */
int model_conv_groups(Model *m, int in, int out_channels, int kernel, int pad, int stride, int groups, int bias);
int model_relu(Model *m, int in);
int model_gelu(Model *m, int in);          /* exact (erf) GELU, PyTorch's nn.GELU() */
int model_maxpool2(Model *m, int in);
int model_maxpool(Model *m, int in, int kernel, int stride, int pad);
int model_global_maxpool(Model *m, int in); /* the max over each channel's square map, to c x 1 x 1 */
int model_linear(Model *m, int in, int out_features);
int model_linear_no_bias(Model *m, int in, int out_features);
int model_scale(Model *m, int in, float factor); /* y = factor x (airbench's logit scale) */
int model_silu(Model *m, int in);          /* x sigmoid(x), PyTorch's nn.SiLU() */
/* PyTorch's nn.Dropout(p): in training each element dropped with probability p, the rest scaled by
 * 1 / (1 - p), a new mask each training forward (model_forward advances the step on the device); in
 * evaluation the identity. p in [0, 1). */
int model_dropout(Model *m, int in, float p);
/* torch.cat([a, b], dim=1): a's channels then b's, the same batch, height and width. More inputs: chain it
 * (model_concat_list). */
int model_concat(Model *m, int a, int b);
int model_concat_list(Model *m, const int *ids, int count);
/* nn.Flatten(): c x h x w to c*h*w features (PyTorch's order), sharing its input's storage: no copy, and no
 * op in forward. Under NHWC the features lie in (h, w, c) order, which a linear reading them takes into
 * account (model_weight_index); so there a flatten of an h x w > 1 map may feed only linear layers. */
int model_flatten(Model *m, int in);
/* nn.AvgPool2d(kernel, stride, pad): the padding's zeros counted in each window (count_include_pad=True),
 * floor mode; pad at most kernel / 2. */
int model_avgpool2d(Model *m, int in, int kernel, int stride, int pad);
/* From the next backward on, layers [0, layers) run no backward at all and
 * the activations they write get no gradient, so the first layer after them
 * computes no input gradient either: a prefix of the net that has stopped
 * training (airbench's whitening layer once its bias is frozen). Every layer
 * of the prefix must have nothing left to train; their gradients keep what
 * model_zero_grads left (zeros). 0 trains every layer again. Between steps
 * only; a captured CUDA graph holds the prefix it was captured with. */
void model_set_frozen_prefix(Model *m, int layers);

/* The last layer added, a convolution over the input, is a whitening layer
 * (models/whiten.h): its weights are set from the data and never trained. */
int model_mark_whitening(Model *m);
/* The last layer added, a convolution with an odd square kernel, starts its
 * first min(out, in) filters as the identity (PyTorch's nn.init.dirac_ on
 * them, after the default init; airbench's blocks). */
int model_dirac_last(Model *m);
int model_batchnorm(Model *m, int in);
int model_add(Model *m, int a, int b);     /* a + b, same shapes: a residual connection */
int model_avgpool(Model *m, int in);       /* global average pooling to c x 1 x 1 */
int model_global_avgpool(Model *m, int in); /* the same (a name beside model_global_maxpool's) */
/* A block: the layers between begin and end. Under checkpointing, forward keeps
 * only the block's input and output; backward runs the block forward again to
 * get its inside back. */
void model_block_begin(Model *m);
void model_block_end(Model *m);

/* Names the last layer added by its PyTorch module ("features.0", "layer1.0.bn1"). */
void model_name_last(Model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Where weight j of layer l, counted in PyTorch's order (conv [k][c / groups][r][s]
 * over the real input channels, linear [out][in] over NCHW-flattened inputs), lives
 * in this model's weights: the identity under NCHW; conv [k][r][s][c_padded]
 * and linear inputs in (h, w, c) order under NHWC. */
size_t model_weight_index(const Model *m, const Layer *l, size_t j);

/* Allocates every buffer in one arena on the device (gpu != NULL) or the host,
 * picks the convolution algorithms and initialises the parameters like
 * PyTorch's defaults (uniform in +-1/sqrt(fan_in)) from the seed. */
void model_finalize(Model *m, GpuContext *gpu, uint64_t seed);
/* The parameters, batch-norm statistics and learning-rate shares drawn afresh
 * from the seed, as model_finalize draws them (a new run of the same net). */
void model_init_params(Model *m, uint64_t seed);
void model_destroy(Model *m);

float *model_input_buffer(const Model *m);   /* [batch][c][h][w] fp32, where batches land */
/* Where a batch may be written in the form the first layer reads, skipping
 * forward's cast of the fp32 batch: the input activation where forward stores
 * it in NHWC (its channels padded with zeros; fp32 or the AMP dtype), else the
 * fp32 NCHW batch. */
typedef struct {
    void *data;
    DType dtype;
    int nhwc, channels;  /* channels a pixel in NHWC (3 in NCHW) */
    int direct;          /* 1: the input activation (model_set_input_direct applies) */
} ModelInputForm;
ModelInputForm model_input_form(const Model *m);
/* 1: batches are written into model_input_form's direct form, and forward no
 * longer casts the fp32 batch into it (the data pipeline's GPU kernel does). */
void model_set_input_direct(Model *m, int direct);
void *model_logits(const Model *m);          /* [batch][num_classes], activation dtype */
void *model_logits_grad(const Model *m);     /* where the loss writes d(loss)/d(logits) */
size_t model_input_floats(const Model *m);
/* After model_finalize: 1 where activation id has a buffer of its own (not another's storage as the plan
 * shares it, not in the checkpoint blocks' recompute region, not left unstored by a fusion). */
int model_act_stored(const Model *m, int id);

void model_forward(Model *m);
/* Needs the logits gradient in model_logits_grad; adds parameter gradients to
 * m->grads (zero them with model_zero_grads once per optimizer step; right
 * after it, the convolutions write theirs rather than add them). */
void model_backward(Model *m);
void model_zero_grads(Model *m);

/* Training (batch statistics, dropout on) or evaluation (running statistics, dropout the identity) mode. */
void model_set_training(Model *m, int training);
/* Dropout's step counter (the next training forward uses step + 1), between steps: a resumed run's, or a
 * test's fixed masks; model_init_params sets it to 0. No-op without dropout layers. */
void model_set_dropout_step(Model *m, int64_t step);
int64_t model_dropout_step(const Model *m);

/* The running statistics of the batch norms (n_bn_stats floats), host memory. */
void model_get_bn_stats(const Model *m, float *host);
void model_set_bn_stats(Model *m, const float *host);

/* Copies the fp32 master parameters between a model and host memory
 * (n_params floats); setting them refreshes the rounded copy under AMP. */
void model_get_params(const Model *m, float *host);
void model_set_params(Model *m, const float *host);

/* lr_scale as model_finalize set it: 0 for the whitening weights and a fixed
 * batch-norm gamma, bn_bias_lr_scale for the batch norms' beta, 1 elsewhere. */
void model_reset_lr_scale(Model *m);

/* model.muon: the trained convolutions' filters as Muon's matrices (output
 * channels x the rest), in layer order. */
void model_muon_matrices(const Model *m, MuonMatrices *out);

/* Each layer's weights and bias start at a multiple of MODEL_PARAM_ALIGN
 * elements, 128 bytes in half precision: cuDNN's Hopper convolutions ran 1.75x
 * slower on filters at 16-byte offsets (airbench's 64->256 forward at 15x15:
 * 365 against 204 us on an H100). */
#define MODEL_PARAM_ALIGN 64
size_t model_param_align(size_t n); /* n rounded up to a multiple of MODEL_PARAM_ALIGN */

/* The parameters themselves, without the alignment's gaps (what the log and
 * PyTorch count). */
size_t model_param_count(const Model *m);
/* Checkpoints of trainc before the alignment packed the parameters layer
 * after layer with no gaps (model_param_count floats): a flat offset's place
 * there ((size_t)-1 in a gap), and such an array spread into n_params floats. */
size_t model_packed_offset(const Model *m, size_t offset);
void model_unpack_params(const Model *m, const float *packed, float *params);

/* The same for the optimizer's momentum buffer (n_params floats, fp32). */
void model_get_momentum(const Model *m, float *host);
void model_set_momentum(Model *m, const float *host);
/* adam: the second moment (n_params floats, fp32) and the step count. */
void model_get_second_moment(const Model *m, float *host);
void model_set_second_moment(Model *m, const float *host);
int64_t model_get_adam_steps(const Model *m);
void model_set_adam_steps(Model *m, int64_t steps);
/* The optimizer's state back to a fresh start: momentum, and under adam the
 * second moment and the step count, all 0. */
void model_reset_optimizer(Model *m);

/* Layer i's forward FLOPs for the whole batch as built, before any fusion: a convolution's and a linear
 * layer's 2 per multiply-add, any other layer's one per output element (trainc summary, profile). */
double model_layer_flops(const Model *m, int i);

/* Bytes of the arena: what the model holds on its device. */
size_t model_bytes(const Model *m);

#ifdef __cplusplus
}
#endif
#endif
