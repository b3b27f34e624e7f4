/* conv_bias_act on the GPU: one cuDNN graph through cuDNN 9's backend API.
 *
 *   X, W -> CONVOLUTION_FORWARD -> (fp32, virtual) -> ADD B -> [ADD Z] -> [RELU_FWD] -> Y
 *
 * The intermediates are virtual fp32, so the sum is rounded to the dtype once,
 * into Y. The plan is chosen by the policy as ops/backend_graph.h says (the
 * tensors' layout, the heuristics, the numerical notes, benchmarking). With
 * no such plan, the fallback: Conv2dCuda with the bias, then our add / ReLU
 * kernels. */
#include "ops/conv_bias_act.h"

#include <stdlib.h>
#include <string.h>

#include "ops/add.h"
#include "ops/relu.h"
#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

/* The graph's virtual intermediates (unique ids after the real tensors). */
enum { UID_CONV = 100, UID_BIASED, UID_SUMMED };

/* The operations of the graph, in order; returns their count. An operation
 * writes the real Y where it is the last, a virtual fp32 tensor before. */
static int build_ops(ConvBiasActCuda *c, cudnnDataType_t data, cudnnBackendDescriptor_t ops[4]) {
    const Conv2dShape *s = &c->shape.conv;
    int64_t oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    int residual = c->shape.residual, relu = c->shape.relu;
    BackendGraph *g = &c->graph;
    cudnnBackendDescriptor_t x = backend_graph_tensor(g, CBA_UID_X, data, s->n, s->c, s->h, s->w, false);
    cudnnBackendDescriptor_t w = /* grouped: C / G channels, from which cuDNN's graph takes the groups */
        backend_graph_tensor(g, CBA_UID_W, data, s->k, s->c / conv2d_groups(s), s->r, s->s, false);
    cudnnBackendDescriptor_t b = backend_graph_tensor(g, CBA_UID_B, data, 1, s->k, 1, 1, false);
    cudnnBackendDescriptor_t y = backend_graph_tensor(g, CBA_UID_Y, data, s->n, s->k, oh, ow, false);
    cudnnBackendDescriptor_t conv = backend_graph_tensor(g, UID_CONV, CUDNN_DATA_FLOAT, s->n, s->k, oh, ow, true);
    int count = 0;
    ops[count++] = backend_graph_conv_op(g, s, x, w, conv);
    cudnnBackendDescriptor_t biased =
        residual || relu ? backend_graph_tensor(g, UID_BIASED, CUDNN_DATA_FLOAT, s->n, s->k, oh, ow, true) : y;
    ops[count++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_ADD, conv, b, biased);
    cudnnBackendDescriptor_t summed = biased;
    if (residual) {
        cudnnBackendDescriptor_t z = backend_graph_tensor(g, CBA_UID_Z, data, s->n, s->k, oh, ow, false);
        summed = relu ? backend_graph_tensor(g, UID_SUMMED, CUDNN_DATA_FLOAT, s->n, s->k, oh, ow, true) : y;
        ops[count++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_ADD, biased, z, summed);
    }
    if (relu) ops[count++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_RELU_FWD, summed, NULL, y);
    return count;
}

/* A graph's key in the policy's plan cache: its shape but the batch, dtype and layout (all ints: no padding). */
typedef struct {
    ConvBiasActShape shape;
    int dtype, nhwc;
} PlanKey;
static_assert(sizeof(PlanKey) <= BACKEND_PLAN_KEY_BYTES, "conv_bias_act's plan key");

/* Builds the graph and keeps a plan; 0 when there is none (fallback). */
static int choose_plan(ConvBiasActCuda *c, cudnnHandle_t h, const ConvAlgoPolicy *policy) {
    cudnnBackendDescriptor_t ops[4];
    int count = build_ops(c, dtype_cudnn(c->dtype), ops);
    bool built = backend_graph_build(&c->graph, h, ops, count);
    PlanKey key = {c->shape, (int)c->dtype, c->nhwc};
    key.shape.conv.n = 0;
    if (!backend_graph_choose_plan_cached(&c->graph, h, policy, &key, sizeof key, c->shape.conv.n) || !built)
        return 0; /* agreed even where not built */
    c->workspace_bytes = c->graph.workspace_bytes;
    return 1;
}

/* ---- the op ---------------------------------------------------------------------- */

void conv_bias_act_cuda_init(ConvBiasActCuda *c, cudnnHandle_t h, const ConvBiasActShape *s, DType dtype,
                             int nhwc, const ConvAlgoPolicy *policy) {
    memset(c, 0, sizeof *c);
    check_float_dtype("conv_bias_act", dtype);
    const Conv2dShape *cs = &s->conv;
    int groups = conv2d_groups(cs);
    if (cs->n <= 0 || cs->c <= 0 || cs->k <= 0 || cs->r <= 0 || cs->s <= 0 || cs->stride <= 0 || cs->pad < 0 ||
        conv2d_out_h(cs) <= 0 || conv2d_out_w(cs) <= 0 || cs->groups < 0 || cs->c % groups || cs->k % groups)
        TC_FATAL("conv_bias_act: bad shape n=%d c=%d h=%d w=%d k=%d r=%d s=%d pad=%d stride=%d groups=%d", cs->n,
                 cs->c, cs->h, cs->w, cs->k, cs->r, cs->s, cs->pad, cs->stride, cs->groups);
    c->shape = *s;
    c->dtype = dtype;
    c->nhwc = nhwc != 0;
    backend_graph_init(&c->graph, "conv_bias_act", dtype, nhwc);
    c->fused = choose_plan(c, h, policy);
    if (!c->fused) {
        conv2d_cuda_init(&c->fallback, h, cs, dtype, nhwc, policy);
        c->workspace_bytes = c->fallback.workspace_bytes; /* the add and ReLU kernels need none */
    }
}

void conv_bias_act_cuda_destroy(ConvBiasActCuda *c) {
    backend_graph_destroy(&c->graph);
    if (!c->fused && c->fallback.x_desc) conv2d_cuda_destroy(&c->fallback);
    memset(c, 0, sizeof *c);
}

static void forward_fallback(const ConvBiasActCuda *c, cudnnHandle_t h, const void *x, const void *w,
                             const void *b, const void *z, void *y, void *workspace) {
    conv2d_forward_cuda(&c->fallback, h, x, w, b, y, workspace);
    if (!c->shape.residual && !c->shape.relu) return;
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    const Conv2dShape *s = &c->shape.conv;
    size_t count = (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s);
    if (c->shape.residual && c->shape.relu) add_relu_forward_cuda(c->dtype, y, z, y, count, stream);
    else if (c->shape.residual) add_forward_cuda(c->dtype, y, z, y, count, stream);
    else relu_forward_cuda(c->dtype, y, y, count, stream);
}

void conv_bias_act_forward_cuda(const ConvBiasActCuda *c, cudnnHandle_t h, const void *x, const void *w,
                                const void *b, const void *z, void *y, void *workspace) {
    if (c->shape.residual && !z) TC_FATAL("conv_bias_act: residual shape without z");
    if (!c->fused) {
        forward_fallback(c, h, x, w, b, z, y, workspace);
        return;
    }
    void *ptrs[CBA_TENSORS] = {(void *)x, (void *)w, (void *)b, (void *)z, y};
    backend_graph_execute(&c->graph, h, ptrs, workspace);
}
