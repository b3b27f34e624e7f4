/* Inside models/ only: how a model runs, apart from what it is. The Layers (model.h) describe the net; from
 * model_finalize on only their ops' own state is set in them (the convolutions' cuDNN descriptors and
 * algorithms, a max-pool's scratch). The planner writes its decisions here, one LayerPlan per layer (which
 * layer's pass takes the next one's work under model.fuse, which convolutions run fused cuDNN graphs under
 * model.fuse = graphs, which run on a form of the input image, how each backward meets its inputs'
 * gradients) and one ActivationPlan per activation (its readers, its gradient's buffer, whether and where
 * it is stored, the storage it shares). The layers' passes (layers.c) read m->plan and never write it.
 *
 * Dependencies run one way, each file calling only those after it: model.c (building, buffers, parameters),
 * plan_graphs.c (the cuDNN graphs, timed), plan.c (the plan's records, gradient buffers, model.fuse's
 * fusions, input forms), layers.c (the passes, which the planner runs to time alternatives). A candidate is
 * timed as an alternative plan: a copy of the plan with the candidate changed, run in turn with the model's
 * own, the faster kept (plan_keep). The inference form's plan (plan_infer.c: its list of steps, which infer.c
 * runs) calls plan.c and reads layers.c's table. */
#ifndef TRAINC_MODELS_PLAN_H
#define TRAINC_MODELS_PLAN_H

#include "models/model.h"
#include "ops/conv_dgrad_dbn.h"
#include "ops/conv_genstats.h"
#include "ops/space_to_depth.h"

/* model.fuse (plan_input_forms), GPU: a convolution over the input image run on copies of the image and its
 * filters in another form (ops/space_to_depth.h). */
typedef struct ConvInputForm {
    SpaceToDepthShape image, filter; /* the copies of the image and of the filters */
    Conv2d conv;                     /* the convolution over the copies */
    void *x, *w, *dw;                /* the copies, and the gradient of the filters' copy */
} ConvInputForm;

typedef struct {
    /* Backward, per input (in, in2): 1 when another layer reading the same activation has already written its
     * gradient, so this one adds to it. An add whose input gradient is dy itself (alias) writes nothing. */
    int dx_accumulate[2];
    int dx_alias[2];
    /* model.fuse: a pass that takes the next layers' work */
    int bias_relu;        /* conv: takes its bias and the ReLU after it: in one pass after the convolution
                             (ops/bias_relu), in the max-pool after the ReLU (bias_by_pool) or in one kernel with
                             it (pool_layer) */
    BatchNormAct act;     /* batch norm: the activation after it, applied in its pass; a whitening conv: BN_ACT_GELU,
                             its bias and the GELU after it in one op (ops/conv_bias_gelu); BN_ACT_NONE: none */
    int add_relu;         /* add: the ReLU after it, in its pass */
    int by_producer;      /* relu, gelu: done by the layer whose output it reads (bias_relu, act, add_relu) or by
                             the max-pool after it (bias_by_pool); it runs nothing */
    int bias_by_pool;     /* conv: writes its raw output; the 2x2 max-pool after its ReLU adds the bias and
                             applies the ReLU, forward and backward (ops/bias_relu_pool) */
    int bias_layer;       /* maxpool: the conv whose bias and ReLU it applies, or -1 */
    int pool_layer;       /* conv (GPU): the input's 3x3 convolution computes its bias, ReLU and this 2x2 max-pool
                             too, writing only the pool's output (ops/conv_bias_relu_pool); batch norm (GPU): its
                             pass computes its ReLU and this max-pool, writing only the pool's output
                             (BatchNormParams.pool); -1: none */
    int pool_by_conv;     /* maxpool: the conv two layers before computes it (pool_layer); it runs nothing */
    int pool_by_bn;       /* maxpool: the batch norm two layers before computes its forward (pool_layer); only its
                             backward runs */
    int add_layer;        /* batch norm: the add right after it, which alone reads its output, whose sum (and
                             add_relu) its pass writes into the add's output; -1: none */
    int add_by_bn;        /* add: the batch norm before it computes it (add_layer); only its backward runs */
    ConvInputForm *input_form; /* conv over the input image (GPU): runs on copies of the image and its filters in
                             the form that timed fastest at start-up (plan_input_forms); NULL: on the image */
    /* model.fuse = graphs (plan_graphs.c) */
    ConvGenStats *genstats; /* conv: in training its forward is one cuDNN graph that also sums its output per
                             channel for the batch norm after it (ops/conv_genstats); NULL: conv2d's */
    ConvGenStats *prologue_genstats; /* conv: the same with the previous batch norm + ReLU as its prologue, between
                             plan_graphs and plan_graphs_choose, which keeps one of the two */
    size_t sums_off;      /* conv with genstats: where its sums go, bn_sums + its batch norm's stat_off */
    int stats_by_conv;    /* batch norm: the conv before it sums its input (genstats); training takes the
                             statistics from those sums (bn_finalize) and runs the apply pass alone */
    int prologue_bn;      /* conv with genstats: in training it applies this batch norm and its ReLU to the norm's
                             input as its prologue, forward and filter gradient (scale and bias at bn_coef + the
                             norm's stat_off); -1: none */
    int by_conv_prologue; /* batch norm + ReLU: the conv after it applies it (prologue_bn); training computes only
                             its scale and bias (bn_finalize) and never writes its output */
    ConvDgradDbn *dgrad_dbn; /* conv: its data gradient runs the backward of the batch norm + ReLU before it
                             (dbn_layer) in one cuDNN graph (ops/conv_dgrad_dbn); NULL: none */
    int dbn_layer;        /* conv with dgrad_dbn: that batch norm; -1: none */
    int backward_by_conv; /* batch norm + ReLU: the conv after it runs its backward (dgrad_dbn); it runs nothing */
} LayerPlan;

/* The plan of an activation (model.h's Activation: its shape, and the storage its builder shares). */
typedef struct {
    int shares_with;      /* -1, or the id whose storage it uses: its Activation's, or under model.fuse the pass
                             before it that computes it (a GELU, an add) writes it over its own output */
    int recompute_block;  /* the checkpoint block whose recompute makes it (its Activation's internal_to), or -1:
                             kept, as a block's output and the storage it shares are */
    size_t region_offset; /* recomputed: where it lives in the shared recompute region */
    int consumers;        /* layers that read it */
    int grad_slot;        /* which gradient buffer holds d(loss)/d(this); -1: none (or grad_in_value) */
    int grad_in_value;    /* d(loss)/d(this) overwrites the value itself, dead by then (a conv's raw output
                             under bias_relu_pool, whose backward works in place) */
    int unstored;         /* no layer writes or reads it (the input's conv output under conv_bias_relu_pool,
                             and the in-place ReLU's sharing it; the input image where its one reader runs on
                             a form of it, plan_input_forms; a batch norm's output, and its ReLU's, where
                             the norm's pass computes the max-pool after them): no buffer, value NULL */
} ActivationPlan;

typedef struct Plan {
    LayerPlan layers[MODEL_MAX_LAYERS];
    ActivationPlan acts[MODEL_MAX_ACTS];
} Plan;

static inline const LayerPlan *plan_of(const Model *m, const Layer *l) { return &m->plan->layers[l - m->layers]; }

/* ---- the inference form's plan (plan_infer.c), which infer.c runs ---- */

/* A layer kind's step (layer_kinds' step). STEP_MISSING (0): a kind layer_kinds does not say, which
 * layer_kinds_check refuses; STEP_IDENTITY: a layer that evaluation runs as the identity (dropout; flatten,
 * its input's storage), its output its input. */
typedef enum { STEP_MISSING, STEP_CONV, STEP_MAXPOOL, STEP_AVGPOOL, STEP_LINEAR, STEP_BATCHNORM, STEP_ADD, STEP_RELU,
               STEP_GELU, STEP_SCALE, STEP_SILU, STEP_CONCAT, STEP_IDENTITY } StepKind;

/* layer_kinds' takes_relu: where the ReLU right after a layer of the kind, reading its output alone, runs in
 * the layer's own pass. 0: not said (layer_kinds_check refuses it). */
#define TAKES_RELU_NEVER 1
#define TAKES_RELU_TRAINING 2  /* model.fuse (mark_fusions); a convolution's only with a bias */
#define TAKES_RELU_INFERENCE 4 /* plan_inference (a convolution's epilogue, a linear layer's, a norm's, an add's) */

typedef struct {
    StepKind kind;
    int layer;            /* the net's layer it runs */
    int bn_layer;         /* conv: the batch norm folded into it, or -1 */
    int in, in2, out;     /* activation ids; in2: an add's second input or a conv's residual, else -1 */
    int shape_in, shape_in2; /* the layer's own inputs, whose shapes it takes: in and in2 may be the values a
                             flatten (an identity) reshaped, c x h x w where the layer reads c*h*w x 1 x 1 */
    int relu;             /* the ReLU after it, done by it */
    long order;           /* its place in the run (a conv taking a residual moves to the add's) */
} PlanStep;

typedef struct {
    PlanStep steps[MODEL_MAX_LAYERS]; /* in run order */
    int n_steps;
    int logits;           /* the activation that holds the logits (the last, or the one it is an alias of) */
    int bn_folded, relu_fused, add_fused;
} InferPlan;

/* The net's inference steps (plan_infer.c says which folds and fusions). */
void plan_inference(const Model *g, InferPlan *plan);

/* Reads of each activation by the net's layers (readers[a], for a < g->n_acts). */
void plan_count_readers(const Model *g, int *readers);

/* model_finalize's steps, in its order. plan_layers (a fresh plan): the gradients' accumulation, model.fuse's
 * fusions and the activation-gradient buffers; plan_input_forms (GPU, after the convolutions' algorithms): the
 * input convolution's forms, timed; plan_graphs (model.fuse = graphs, before the buffers: they size the
 * workspaces): each fused graph where an engine takes it; plan_carve: the forms' buffers with the model's;
 * plan_graphs_choose (the buffers carved, before the parameters are set): under perf.conv_benchmark each graph
 * timed against the plan without it, the faster kept; plan_destroy frees the plan and what it built. */
void plan_layers(Model *m);
void plan_input_forms(Model *m);
void plan_graphs(Model *m);
void plan_carve(Model *m, Arena *a);
void plan_graphs_choose(Model *m);
void plan_destroy(Model *m);

/* A copy of the plan (what it built shared, not copied), and the end of a choice between two: the ops that
 * only the loser uses freed, the loser's record freed, the winner the model's plan. */
Plan *plan_copy(const Plan *p);
void plan_keep(Model *m, Plan *winner, Plan *loser);

/* The conv whose data gradient may run batch norm i's backward and its ReLU's (conv_dgrad_dbn), or -1. The
 * norm's input and output gradients then share a buffer (plan_layers): the conv writes dz there and makes dx
 * over it, or, apart, the norm's backward runs in place. */
int plan_dbn_conv(const Model *m, int i);

/* Stops where under NHWC (nhwc) a flatten of an h x w > 1 map feeds a layer that takes its features in NCHW
 * order: anything but a linear layer (plan_layers and infer_create call it). */
void layers_check_flattens(const Model *m, int nhwc);

/* The planner's own, plan.c's for plan_graphs.c: a convolution of all channels (the graphs take no grouped
 * one); the conv right after batch norm i and its fused ReLU, alone in reading the ReLU's output, or -1; the
 * graphs' ops freed (NULL: none). */
int plan_ungrouped_conv(const Layer *l);
int plan_norm_relu_conv(const Model *m, int i);
void plan_genstats_free(const Model *m, ConvGenStats *op);
void plan_dgrad_dbn_free(const Model *m, ConvDgradDbn *op);

#endif
