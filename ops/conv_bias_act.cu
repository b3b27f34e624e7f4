/* conv_bias_act on the GPU: one cuDNN graph through cuDNN 9's backend API.
 *
 *   X, W -> CONVOLUTION_FORWARD -> (fp32, virtual) -> ADD B -> [ADD Z] -> [RELU_FWD] -> Y
 *
 * Tensors are described by dims in NCHW order and strides giving the layout
 * (NHWC: [h*w*c, 1, w*c, c]; the filter [k, c, r, s] as [r*s*c, 1, s*c, c]),
 * 16-byte aligned; the intermediates are virtual fp32, so the sum is rounded
 * to the dtype once, into Y. Init asks the engine heuristics (mode A, then
 * FALLBACK) for configurations and keeps the first whose execution plan
 * finalizes within the policy (workspace, determinism, TF32 for float32);
 * under policy->benchmark it times up to BENCHMARK_PLANS such plans on scratch
 * buffers and keeps the fastest. With no such plan, the fallback: Conv2dCuda
 * with the bias, then our add / ReLU kernels.
 *
 * The policy is read off each engine's numerical notes: deterministic drops
 * engines noted NONDETERMINISTIC; float32 without allow_tf32 drops those
 * noted TENSOR_CORE; every dtype drops DOWN_CONVERT_INPUTS and
 * REDUCED_PRECISION_REDUCTION (the products accumulate in fp32, no half type
 * is converted to another), as conv2d.cu's algorithm filter does. */
#include "ops/conv_bias_act.h"

#include <stdlib.h>
#include <string.h>

#include "ops/add.h"
#include "ops/relu.h"
#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

#define BENCHMARK_PLANS 8
#define BENCHMARK_RUNS 3
#define BYTE_ALIGNMENT 16

/* The graph's virtual intermediates (unique ids after the real tensors). */
enum { UID_CONV = 100, UID_BIASED, UID_SUMMED };

/* One attribute set; a failure names the attribute and the place. */
#define SET_ATTR(desc, name, type, count, value) \
    CUDNN_CHECK(cudnnBackendSetAttribute(desc, name, type, count, value))

static cudnnBackendDescriptor_t new_part(ConvBiasActCuda *c, cudnnBackendDescriptorType_t type) {
    if (c->part_count == CBA_MAX_PARTS) TC_FATAL("conv_bias_act: more than %d graph descriptors", CBA_MAX_PARTS);
    cudnnBackendDescriptor_t d;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d));
    c->parts[c->part_count++] = d;
    return d;
}

/* A 4-D tensor [n, ch, h, w] in the op's layout. */
static cudnnBackendDescriptor_t tensor(ConvBiasActCuda *c, int64_t uid, cudnnDataType_t type, int64_t n,
                                       int64_t ch, int64_t h, int64_t w, bool is_virtual) {
    int64_t dims[4] = {n, ch, h, w};
    int64_t nchw[4] = {ch * h * w, h * w, w, 1}, nhwc[4] = {h * w * ch, 1, w * ch, ch};
    int64_t alignment = BYTE_ALIGNMENT;
    cudnnBackendDescriptor_t t = new_part(c, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, c->nhwc ? nhwc : nchw);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    CUDNN_CHECK(cudnnBackendFinalize(t));
    return t;
}

static cudnnBackendDescriptor_t conv_op(ConvBiasActCuda *c, cudnnBackendDescriptor_t x,
                                        cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y) {
    const Conv2dShape *s = &c->shape.conv;
    int64_t spatial = 2, pads[2] = {s->pad, s->pad}, strides[2] = {s->stride, s->stride}, dilations[2] = {1, 1};
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    cudnnBackendDescriptor_t conv = new_part(c, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations);
    CUDNN_CHECK(cudnnBackendFinalize(conv));

    float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op = new_part(c, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    CUDNN_CHECK(cudnnBackendFinalize(op));
    return op;
}

/* y = mode(x [, b]) in fp32; b NULL for a unary mode. */
static cudnnBackendDescriptor_t pointwise_op(ConvBiasActCuda *c, cudnnPointwiseMode_t mode,
                                             cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                             cudnnBackendDescriptor_t y) {
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = new_part(c, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    SET_ATTR(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET_ATTR(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    CUDNN_CHECK(cudnnBackendFinalize(pw));
    cudnnBackendDescriptor_t op = new_part(c, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    CUDNN_CHECK(cudnnBackendFinalize(op));
    return op;
}

/* The operations of the graph, in order; returns their count. An operation
 * writes the real Y where it is the last, a virtual fp32 tensor before. */
static int build_ops(ConvBiasActCuda *c, cudnnDataType_t data, cudnnBackendDescriptor_t ops[4]) {
    const Conv2dShape *s = &c->shape.conv;
    int64_t oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    int residual = c->shape.residual, relu = c->shape.relu;
    cudnnBackendDescriptor_t x = tensor(c, CBA_UID_X, data, s->n, s->c, s->h, s->w, false);
    cudnnBackendDescriptor_t w = tensor(c, CBA_UID_W, data, s->k, s->c, s->r, s->s, false);
    cudnnBackendDescriptor_t b = tensor(c, CBA_UID_B, data, 1, s->k, 1, 1, false);
    cudnnBackendDescriptor_t y = tensor(c, CBA_UID_Y, data, s->n, s->k, oh, ow, false);
    cudnnBackendDescriptor_t conv = tensor(c, UID_CONV, CUDNN_DATA_FLOAT, s->n, s->k, oh, ow, true);
    int count = 0;
    ops[count++] = conv_op(c, x, w, conv);
    cudnnBackendDescriptor_t biased =
        residual || relu ? tensor(c, UID_BIASED, CUDNN_DATA_FLOAT, s->n, s->k, oh, ow, true) : y;
    ops[count++] = pointwise_op(c, CUDNN_POINTWISE_ADD, conv, b, biased);
    cudnnBackendDescriptor_t summed = biased;
    if (residual) {
        cudnnBackendDescriptor_t z = tensor(c, CBA_UID_Z, data, s->n, s->k, oh, ow, false);
        summed = relu ? tensor(c, UID_SUMMED, CUDNN_DATA_FLOAT, s->n, s->k, oh, ow, true) : y;
        ops[count++] = pointwise_op(c, CUDNN_POINTWISE_ADD, biased, z, summed);
    }
    if (relu) ops[count++] = pointwise_op(c, CUDNN_POINTWISE_RELU_FWD, summed, NULL, y);
    return count;
}

/* The operation graph on the handle; NULL where cuDNN does not take it. */
static cudnnBackendDescriptor_t build_graph(ConvBiasActCuda *c, cudnnHandle_t h, cudnnDataType_t data) {
    cudnnBackendDescriptor_t ops[4];
    int count = build_ops(c, data, ops);
    cudnnBackendDescriptor_t graph = new_part(c, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    SET_ATTR(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, ops);
    SET_ATTR(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    return cudnnBackendFinalize(graph) == CUDNN_STATUS_SUCCESS ? graph : NULL;
}

/* ---- choosing a plan ----------------------------------------------------------- */

/* Whether the engine behind cfg keeps the policy (see the top). */
static bool engine_allowed(const ConvBiasActCuda *c, const ConvAlgoPolicy *policy, cudnnBackendDescriptor_t cfg) {
    cudnnBackendDescriptor_t engine;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine));
    int64_t got = 0;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t note_count = 0;
    bool ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                                       &engine) == CUDNN_STATUS_SUCCESS &&
              got == 1 &&
              cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &note_count, notes) == CUDNN_STATUS_SUCCESS;
    for (int64_t i = 0; ok && i < note_count; i++) {
        cudnnBackendNumericalNote_t note = notes[i];
        if (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS || note == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
            ok = false;
        if (note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && policy->deterministic) ok = false;
        if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && c->dtype == DTYPE_F32 && !policy->allow_tf32) ok = false;
    }
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(engine));
    return ok;
}

/* An execution plan of cfg within the workspace limit, or NULL. */
static cudnnBackendDescriptor_t finalize_plan(cudnnHandle_t h, cudnnBackendDescriptor_t cfg, size_t limit,
                                              size_t *workspace) {
    cudnnBackendDescriptor_t plan;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
    SET_ATTR(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    SET_ATTR(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    int64_t bytes = 0, got = 0;
    if (cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
        cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                 &bytes) == CUDNN_STATUS_SUCCESS &&
        got == 1 && bytes >= 0 && (uint64_t)bytes <= limit) {
        *workspace = (size_t)bytes;
        return plan;
    }
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(plan));
    return NULL;
}

/* A plan the policy allows, with its engine configuration. */
typedef struct {
    cudnnBackendDescriptor_t cfg, plan;
    size_t workspace;
} Candidate;

/* The heuristics' configurations in mode, fastest first; each one usable and
 * finalizing becomes a candidate, up to max. The others are destroyed. */
static int collect_candidates(const ConvBiasActCuda *c, cudnnHandle_t h, const ConvAlgoPolicy *policy,
                              cudnnBackendHeurMode_t mode, Candidate *out, int max) {
    cudnnBackendDescriptor_t heur;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    SET_ATTR(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c->graph);
    SET_ATTR(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    int64_t available = 0;
    if (cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available,
                                 NULL) != CUDNN_STATUS_SUCCESS ||
        available <= 0) {
        CUDNN_CHECK(cudnnBackendDestroyDescriptor(heur));
        return 0;
    }
    cudnnBackendDescriptor_t *cfgs = (cudnnBackendDescriptor_t *)calloc((size_t)available, sizeof *cfgs);
    if (!cfgs) TC_FATAL("conv_bias_act: out of host memory for %lld engine configs", (long long)available);
    for (int64_t i = 0; i < available; i++)
        CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]));
    int64_t returned = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         available, &returned, cfgs));
    int found = 0;
    for (int64_t i = 0; i < available; i++) {
        Candidate cand = {cfgs[i], NULL, 0};
        if (i < returned && found < max && engine_allowed(c, policy, cfgs[i]))
            cand.plan = finalize_plan(h, cfgs[i], policy->workspace_limit, &cand.workspace);
        if (cand.plan) out[found++] = cand;
        else CUDNN_CHECK(cudnnBackendDestroyDescriptor(cfgs[i]));
    }
    free(cfgs);
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(heur));
    return found;
}

/* The variant pack: the tensors' device pointers by uid, and the workspace. */
static cudnnBackendDescriptor_t variant_pack(const ConvBiasActCuda *c, void *const ptrs[CBA_TENSORS],
                                             void *workspace) {
    int64_t uids[CBA_TENSORS];
    void *data[CBA_TENSORS];
    int64_t count = 0;
    for (int i = 0; i < CBA_TENSORS; i++) {
        if (c->uids[i] == CBA_UID_Z && !c->shape.residual) continue;
        uids[count] = c->uids[i];
        data[count++] = ptrs[i];
    }
    cudnnBackendDescriptor_t pack;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    SET_ATTR(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, uids);
    SET_ATTR(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, data);
    SET_ATTR(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    CUDNN_CHECK(cudnnBackendFinalize(pack));
    return pack;
}

static void execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
    CUDNN_CHECK(cudnnBackendExecute(h, plan, pack));
}

static size_t tensor_count(const ConvBiasActShape *s, int uid) {
    const Conv2dShape *cs = &s->conv;
    switch (uid) {
    case CBA_UID_X: return (size_t)cs->n * cs->c * cs->h * cs->w;
    case CBA_UID_W: return (size_t)cs->k * cs->c * cs->r * cs->s;
    case CBA_UID_B: return (size_t)cs->k;
    default: return (size_t)cs->n * cs->k * conv2d_out_h(cs) * conv2d_out_w(cs);
    }
}

/* Milliseconds per run of plan on buffers of zeros, on the handle's stream. */
static float time_plan(const ConvBiasActCuda *c, cudnnHandle_t h, cudnnBackendDescriptor_t plan,
                       void *const ptrs[CBA_TENSORS], void *workspace) {
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    cudnnBackendDescriptor_t pack = variant_pack(c, ptrs, workspace);
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    execute(h, plan, pack); /* the first run also pays the kernel's loading */
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < BENCHMARK_RUNS; i++) execute(h, plan, pack);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
    return ms / BENCHMARK_RUNS;
}

/* The index of the fastest candidate, timed on scratch buffers allocated here. */
static int fastest(const ConvBiasActCuda *c, cudnnHandle_t h, const Candidate *cands, int count) {
    size_t workspace_bytes = 0;
    for (int i = 0; i < count; i++)
        if (cands[i].workspace > workspace_bytes) workspace_bytes = cands[i].workspace;
    void *ptrs[CBA_TENSORS], *workspace = NULL;
    for (int i = 0; i < CBA_TENSORS; i++) {
        size_t bytes = tensor_count(&c->shape, CBA_UID_X + i) * dtype_size(c->dtype);
        CUDA_CHECK(cudaMalloc(&ptrs[i], bytes));
        CUDA_CHECK(cudaMemset(ptrs[i], 0, bytes));
    }
    if (workspace_bytes) CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    int best = 0;
    float best_ms = 0;
    for (int i = 0; i < count; i++) {
        float ms = time_plan(c, h, cands[i].plan, ptrs, workspace);
        if (i == 0 || ms < best_ms) best = i, best_ms = ms;
    }
    for (int i = 0; i < CBA_TENSORS; i++) CUDA_CHECK(cudaFree(ptrs[i]));
    if (workspace) CUDA_CHECK(cudaFree(workspace));
    return best;
}

/* Builds the graph and keeps a plan; 0 when there is none (fallback). */
static int choose_plan(ConvBiasActCuda *c, cudnnHandle_t h, const ConvAlgoPolicy *policy) {
    c->graph = build_graph(c, h, dtype_cudnn(c->dtype));
    if (!c->graph) return 0;
    Candidate cands[BENCHMARK_PLANS];
    int max = policy->benchmark ? BENCHMARK_PLANS : 1;
    int count = collect_candidates(c, h, policy, CUDNN_HEUR_MODE_A, cands, max);
    if (count == 0) count = collect_candidates(c, h, policy, CUDNN_HEUR_MODE_FALLBACK, cands, max);
    if (count == 0) return 0;
    int best = count > 1 ? fastest(c, h, cands, count) : 0;
    for (int i = 0; i < count; i++) {
        if (i == best) continue;
        CUDNN_CHECK(cudnnBackendDestroyDescriptor(cands[i].plan));
        CUDNN_CHECK(cudnnBackendDestroyDescriptor(cands[i].cfg));
    }
    c->engine_config = cands[best].cfg;
    c->plan = cands[best].plan;
    c->workspace_bytes = cands[best].workspace;
    return 1;
}

/* ---- the op ---------------------------------------------------------------------- */

void conv_bias_act_cuda_init(ConvBiasActCuda *c, cudnnHandle_t h, const ConvBiasActShape *s, DType dtype,
                             int nhwc, const ConvAlgoPolicy *policy) {
    memset(c, 0, sizeof *c);
    check_float_dtype("conv_bias_act", dtype);
    const Conv2dShape *cs = &s->conv;
    if (cs->n <= 0 || cs->c <= 0 || cs->k <= 0 || cs->r <= 0 || cs->s <= 0 || cs->stride <= 0 || cs->pad < 0 ||
        conv2d_out_h(cs) <= 0 || conv2d_out_w(cs) <= 0)
        TC_FATAL("conv_bias_act: bad shape n=%d c=%d h=%d w=%d k=%d r=%d s=%d pad=%d stride=%d", cs->n, cs->c,
                 cs->h, cs->w, cs->k, cs->r, cs->s, cs->pad, cs->stride);
    c->shape = *s;
    c->dtype = dtype;
    c->nhwc = nhwc != 0;
    for (int i = 0; i < CBA_TENSORS; i++) c->uids[i] = CBA_UID_X + i;
    c->fused = choose_plan(c, h, policy);
    if (!c->fused) {
        conv2d_cuda_init(&c->fallback, h, cs, dtype, nhwc, policy);
        c->workspace_bytes = c->fallback.workspace_bytes; /* the add and ReLU kernels need none */
    }
}

void conv_bias_act_cuda_destroy(ConvBiasActCuda *c) {
    if (c->plan) CUDNN_CHECK(cudnnBackendDestroyDescriptor(c->plan));
    if (c->engine_config) CUDNN_CHECK(cudnnBackendDestroyDescriptor(c->engine_config));
    for (int i = c->part_count - 1; i >= 0; i--) CUDNN_CHECK(cudnnBackendDestroyDescriptor(c->parts[i]));
    if (!c->fused && c->fallback.x_desc) conv2d_cuda_destroy(&c->fallback);
    memset(c, 0, sizeof *c);
}

static void check_aligned(const char *what, const void *p) {
    if ((uintptr_t)p % BYTE_ALIGNMENT != 0)
        TC_FATAL("conv_bias_act: %s at %p is not %d-byte aligned, as the fused plan was built for", what, p,
                 BYTE_ALIGNMENT);
}

static void forward_fallback(const ConvBiasActCuda *c, cudnnHandle_t h, const void *x, const void *w,
                             const void *b, const void *z, void *y, void *workspace) {
    conv2d_forward_cuda(&c->fallback, h, x, w, b, y, workspace);
    if (!c->shape.residual && !c->shape.relu) return;
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    size_t count = tensor_count(&c->shape, CBA_UID_Y);
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
    const char *names[CBA_TENSORS] = {"x", "w", "b", "z", "y"};
    for (int i = 0; i < CBA_TENSORS; i++)
        if (ptrs[i]) check_aligned(names[i], ptrs[i]);
    /* A small host descriptor per call (cuDNN's own, freed after the launch):
     * no device allocation and no sync. */
    cudnnBackendDescriptor_t pack = variant_pack(c, ptrs, workspace);
    execute(h, c->plan, pack);
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
}
