/* What the ops built on cuDNN's backend graph API share (conv_bias_act,
 * conv_genstats, conv_dgrad_dbn): a graph's descriptors, the tensors and
 * operations they are built from, the choice of an execution plan by a
 * ConvAlgoPolicy, and its run. Named backend_graph rather than cudnn_graph
 * so that it never shadows cuDNN's own cudnn_graph.h.
 *
 * An op fills a BackendGraph with backend_graph_tensor and the *_op builders,
 * finalizes the operation graph with backend_graph_build, picks a plan with
 * backend_graph_choose_plan (0: no engine finalizes, the op falls back) and
 * runs it with backend_graph_execute. Real tensors are recorded as they are
 * made (uid and bytes): the variant pack holds exactly those, and
 * benchmarking allocates zeroed scratch of their sizes.
 *
 * Tensors are described by dims in NCHW order and strides giving the layout
 * (NHWC: [h*w*c, 1, w*c, c]; a filter [k, c, r, s] as [r*s*c, 1, s*c, c]),
 * BACKEND_GRAPH_ALIGNMENT-byte aligned. Plans are chosen by the engine
 * heuristics (mode A, then FALLBACK): the first whose execution plan
 * finalizes within the policy (workspace, determinism, TF32 for float32), or
 * under policy->benchmark the fastest of up to BACKEND_GRAPH_BENCHMARK_PLANS
 * (mode A's, then FALLBACK's) timed on scratch buffers. The policy is read off each engine's numerical
 * notes: deterministic drops engines noted NONDETERMINISTIC; float32 without
 * allow_tf32 drops those noted TENSOR_CORE; every dtype drops
 * DOWN_CONVERT_INPUTS and REDUCED_PRECISION_REDUCTION (the products
 * accumulate in fp32, no half type is converted to another), as conv2d.cu's
 * algorithm filter does. CUDA builds only (the functions); the struct
 * compiles everywhere. */
#ifndef TRAINC_OPS_BACKEND_GRAPH_H
#define TRAINC_OPS_BACKEND_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/conv2d.h"
#include "runtime/cuda_api.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BACKEND_GRAPH_MAX_PARTS 64 /* a graph's own, and a cached engine rebuilt with its knobs */
#define BACKEND_GRAPH_MAX_TENSORS 16
#define BACKEND_GRAPH_ALIGNMENT 16
#define BACKEND_GRAPH_BENCHMARK_PLANS 16
#define BACKEND_GRAPH_TIMING_RUNS 3

/* The three convolution operations (backend_graph_conv_pass_op). */
typedef enum { BACKEND_CONV_FORWARD, BACKEND_CONV_DATA, BACKEND_CONV_FILTER, BACKEND_CONV_PASSES } BackendConvPass;

typedef struct BackendGraph {
    const char *op_name; /* in messages */
    DType dtype;         /* for the policy's TF32 rule */
    int nhwc;
    /* Every backend descriptor the graph is made of (tensors, convolution,
     * pointwise modes, operations): kept until destroy. */
    cudnnBackendDescriptor_t parts[BACKEND_GRAPH_MAX_PARTS];
    int part_count;
    int64_t uids[BACKEND_GRAPH_MAX_TENSORS];  /* the real tensors, in the order made */
    size_t bytes[BACKEND_GRAPH_MAX_TENSORS];  /* and their sizes */
    int tensor_count;
    cudnnBackendDescriptor_t graph;         /* the operation graph */
    cudnnBackendDescriptor_t engine_config; /* the chosen heuristic result */
    cudnnBackendDescriptor_t plan;          /* its execution plan */
    size_t workspace_bytes;                 /* of the plan */
    float plan_ms;                          /* its time per run where benchmarked, else 0 */
} BackendGraph;

/* ConvAlgoPolicy.plan_cache: the plans chosen under benchmark, each by its
 * op's key (the op's shape with the batch left out, its dtype and layout)
 * and kept as numbers (the engine's global index and its knobs' choices),
 * so that another graph can build the same engine for its own shape.
 * backend_graph_choose_plan_cached, for a graph whose key is there:
 *   - at the batch the choice was timed at (another graph of the same shape):
 *     the full search again. The cached engine rebuilt from its number and
 *     knobs is not the plan it was read from: given untimed, it ran up to
 *     2.7 times slower a convolution (17 of ResNet-18's 20 at batch 256 on
 *     an H200 slower by 13% to 166%, bench-infer --by-layer; 14% fewer
 *     images/s in all);
 *   - at another batch: the cached engine rebuilt for this graph and the
 *     heuristics' first BACKEND_PLAN_CACHE_FRESH candidates for it, timed
 *     together, the fastest kept: the search is narrowed, not skipped, so the
 *     plan is never one the heuristics would not have ranked first for this
 *     batch or one slower than those and the other batch's winner;
 *   - where none of those finalizes, or the key is new: the full search,
 *     whose choice is kept (the first batch's stays).
 * Any plan computes the same function within the policy (its notes): the
 * cache changes the time, never what is computed. progress, where set, is
 * called after each choice with how it was made and the seconds it took. */
#define BACKEND_PLAN_CACHE_SIZE 256
#define BACKEND_PLAN_CACHE_FRESH 2
#define BACKEND_PLAN_KEY_BYTES 96
#define BACKEND_PLAN_MAX_KNOBS 16 /* an engine with more is not cached */

typedef struct {
    const char *op;           /* the graph's op_name */
    unsigned char key[BACKEND_PLAN_KEY_BYTES];
    size_t key_bytes;
    int batch;                /* the batch it was timed at */
    int64_t engine;           /* CUDNN_ATTR_ENGINE_GLOBAL_INDEX */
    int knobs;
    int64_t knob_type[BACKEND_PLAN_MAX_KNOBS], knob_value[BACKEND_PLAN_MAX_KNOBS];
} BackendPlanChoice;

/* How a graph's plan was chosen: the full search, the narrowed one. */
typedef enum { BACKEND_PLAN_SEARCHED, BACKEND_PLAN_NARROWED, BACKEND_PLAN_HOWS } BackendPlanHow;

typedef struct BackendPlanCache {
    BackendPlanChoice choices[BACKEND_PLAN_CACHE_SIZE];
    int n;
    long chosen[BACKEND_PLAN_HOWS];   /* graphs by how their plan was chosen */
    void (*progress)(void *user, BackendPlanHow how, double seconds);
    void *progress_user;
} BackendPlanCache;

#if TRAINC_CUDA
/* Empties g for an op of this name, dtype and layout. */
void backend_graph_init(BackendGraph *g, const char *op_name, DType dtype, int nhwc);
void backend_graph_destroy(BackendGraph *g);

/* A new descriptor of type, kept with the graph's parts (destroyed with them). */
cudnnBackendDescriptor_t backend_graph_part(BackendGraph *g, cudnnBackendDescriptorType_t type);
/* A 4-D tensor [n, ch, h, w] in g's layout; a real one is recorded. */
cudnnBackendDescriptor_t backend_graph_tensor(BackendGraph *g, int64_t uid, cudnnDataType_t type, int64_t n,
                                              int64_t ch, int64_t h, int64_t w, bool is_virtual);
/* One convolution pass, cross-correlation computed in fp32, alpha 1:
 * FORWARD y = conv(x, w) + beta y; DATA x = dgrad(w, y) + beta x (y the
 * output's gradient, x the input's); FILTER w = wgrad(x, y) + beta w. */
cudnnBackendDescriptor_t backend_graph_conv_pass_op(BackendGraph *g, const Conv2dShape *s, BackendConvPass pass,
                                                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                                                    cudnnBackendDescriptor_t y, float beta);
/* y = conv(x, w): the FORWARD pass with beta 0. */
cudnnBackendDescriptor_t backend_graph_conv_op(BackendGraph *g, const Conv2dShape *s, cudnnBackendDescriptor_t x,
                                               cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y);
/* y = mode(x [, b]) in fp32; b NULL for a unary mode. */
cudnnBackendDescriptor_t backend_graph_pointwise_op(BackendGraph *g, cudnnPointwiseMode_t mode,
                                                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                                    cudnnBackendDescriptor_t y);
/* y = x - b in fp32: cuDNN's ADD with alpha2 = -1, the form its batch-norm
 * backward pattern takes (conv_dgrad_dbn). */
cudnnBackendDescriptor_t backend_graph_sub_op(BackendGraph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                              cudnnBackendDescriptor_t y);
/* dx = mode(dy, x) in fp32 for a backward mode (RELU_BWD: dy where x > 0). */
cudnnBackendDescriptor_t backend_graph_pointwise_backward_op(BackendGraph *g, cudnnPointwiseMode_t mode,
                                                             cudnnBackendDescriptor_t dy, cudnnBackendDescriptor_t x,
                                                             cudnnBackendDescriptor_t dx);
/* The operation graph of ops on the handle, kept in g; false where cuDNN
 * does not take it. */
bool backend_graph_build(BackendGraph *g, cudnnHandle_t h, const cudnnBackendDescriptor_t *ops, int count);
/* Picks and keeps a plan of the built graph by the policy (top); 0 when there
 * is none. */
int backend_graph_choose_plan(BackendGraph *g, cudnnHandle_t h, const ConvAlgoPolicy *policy);
/* The same through policy->plan_cache (above) where there is one, under
 * benchmark and agree NULL; key (key_bytes <= BACKEND_PLAN_KEY_BYTES, padding
 * zeroed) the op's shape but the batch, batch the graph's. */
int backend_graph_choose_plan_cached(BackendGraph *g, cudnnHandle_t h, const ConvAlgoPolicy *policy, const void *key,
                                     size_t key_bytes, int batch);
/* Milliseconds per run of run(arg), which launches work on the handle's
 * stream and must not wait for it on the host: run once to warm up, then the
 * mean of 'runs' (BACKEND_GRAPH_TIMING_RUNS for one plan or pass), queued
 * behind a kernel that holds the stream until all are queued and timed by
 * events, so that the time is the GPU's however slowly the host queued them. */
float backend_graph_time_ms(cudnnHandle_t h, void (*run)(void *arg), void *arg, int runs);
/* Fills a timing buffer with fp16 values uniform in [-1, 1), on the handle's
 * stream. Kernels are timed on data like the step's: on an H100 tensor-core
 * kernels fed zeros draw less power and keep a higher clock than on real
 * data, which ranked the plans differently. Read as fp32 or bf16 the words
 * are finite too (magnitudes below 2), so one fill serves every dtype; an odd
 * last byte is left as it was. */
void backend_graph_fill_scratch(cudnnHandle_t h, void *p, size_t bytes);
/* Runs the plan on the handle's stream: ptrs[uid - 1] is the device pointer
 * of the tensor of that uid (each recorded one must be given, aligned). A
 * small host descriptor per call (cuDNN's own, freed after the launch): no
 * device allocation and no sync, so it can be captured into a CUDA graph. */
void backend_graph_execute(const BackendGraph *g, cudnnHandle_t h, void *const *ptrs, void *workspace);
#endif

#ifdef __cplusplus
}
#endif
#endif
