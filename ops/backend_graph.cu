/* The shared pieces of the ops built on cuDNN's backend graph API
 * (ops/backend_graph.h says what they do). */
#include "ops/backend_graph.h"

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/log.h"

/* One attribute set; a failure names the attribute and the place. */
#define SET_ATTR(desc, name, type, count, value) \
    CUDNN_CHECK(cudnnBackendSetAttribute(desc, name, type, count, value))

void backend_graph_init(BackendGraph *g, const char *op_name, DType dtype, int nhwc) {
    memset(g, 0, sizeof *g);
    g->op_name = op_name;
    g->dtype = dtype;
    g->nhwc = nhwc != 0;
}

void backend_graph_destroy(BackendGraph *g) {
    if (g->plan) CUDNN_CHECK(cudnnBackendDestroyDescriptor(g->plan));
    if (g->engine_config) CUDNN_CHECK(cudnnBackendDestroyDescriptor(g->engine_config));
    for (int i = g->part_count - 1; i >= 0; i--) CUDNN_CHECK(cudnnBackendDestroyDescriptor(g->parts[i]));
    memset(g, 0, sizeof *g);
}

cudnnBackendDescriptor_t backend_graph_part(BackendGraph *g, cudnnBackendDescriptorType_t type) {
    if (g->part_count == BACKEND_GRAPH_MAX_PARTS)
        TC_FATAL("%s: more than %d graph descriptors", g->op_name, BACKEND_GRAPH_MAX_PARTS);
    cudnnBackendDescriptor_t d;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d));
    g->parts[g->part_count++] = d;
    return d;
}

static size_t cudnn_type_size(cudnnDataType_t type) {
    return type == CUDNN_DATA_HALF || type == CUDNN_DATA_BFLOAT16 ? 2 : 4;
}

static void record_tensor(BackendGraph *g, int64_t uid, size_t bytes) {
    if (uid < 1 || uid > BACKEND_GRAPH_MAX_TENSORS || g->tensor_count == BACKEND_GRAPH_MAX_TENSORS)
        TC_FATAL("%s: real tensor uid %lld outside 1..%d", g->op_name, (long long)uid, BACKEND_GRAPH_MAX_TENSORS);
    g->uids[g->tensor_count] = uid;
    g->bytes[g->tensor_count++] = bytes;
}

cudnnBackendDescriptor_t backend_graph_tensor(BackendGraph *g, int64_t uid, cudnnDataType_t type, int64_t n,
                                              int64_t ch, int64_t h, int64_t w, bool is_virtual) {
    int64_t dims[4] = {n, ch, h, w};
    int64_t nchw[4] = {ch * h * w, h * w, w, 1}, nhwc[4] = {h * w * ch, 1, w * ch, ch};
    int64_t alignment = BACKEND_GRAPH_ALIGNMENT;
    cudnnBackendDescriptor_t t = backend_graph_part(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, g->nhwc ? nhwc : nchw);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    SET_ATTR(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    CUDNN_CHECK(cudnnBackendFinalize(t));
    if (!is_virtual) record_tensor(g, uid, (size_t)(n * ch * h * w) * cudnn_type_size(type));
    return t;
}

static cudnnBackendDescriptor_t conv_descriptor(BackendGraph *g, const Conv2dShape *s) {
    int64_t spatial = 2, pads[2] = {s->pad, s->pad}, strides[2] = {s->stride, s->stride}, dilations[2] = {1, 1};
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    cudnnBackendDescriptor_t conv = backend_graph_part(g, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides);
    SET_ATTR(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations);
    CUDNN_CHECK(cudnnBackendFinalize(conv));
    return conv;
}

/* The operation type and attribute names of a pass: its activation tensor
 * (x or dx), filter (w or dw), output-side tensor (y or dy), convolution,
 * alpha and beta. */
typedef struct {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
} ConvPassAttrs;

static const ConvPassAttrs kConvPassAttrs[BACKEND_CONV_PASSES] = {
    [BACKEND_CONV_FORWARD] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
    [BACKEND_CONV_DATA] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
    [BACKEND_CONV_FILTER] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                             CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                             CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                             CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                             CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                             CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                             CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
};

cudnnBackendDescriptor_t backend_graph_conv_pass_op(BackendGraph *g, const Conv2dShape *s, BackendConvPass pass,
                                                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                                                    cudnnBackendDescriptor_t y, float beta) {
    const ConvPassAttrs *a = &kConvPassAttrs[pass];
    cudnnBackendDescriptor_t conv = conv_descriptor(g, s);
    float alpha = 1.0f;
    cudnnBackendDescriptor_t op = backend_graph_part(g, a->type);
    SET_ATTR(op, a->x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET_ATTR(op, a->w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    SET_ATTR(op, a->y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    SET_ATTR(op, a->conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
    SET_ATTR(op, a->alpha, CUDNN_TYPE_FLOAT, 1, &alpha);
    SET_ATTR(op, a->beta, CUDNN_TYPE_FLOAT, 1, &beta);
    CUDNN_CHECK(cudnnBackendFinalize(op));
    return op;
}

cudnnBackendDescriptor_t backend_graph_conv_op(BackendGraph *g, const Conv2dShape *s, cudnnBackendDescriptor_t x,
                                               cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y) {
    return backend_graph_conv_pass_op(g, s, BACKEND_CONV_FORWARD, x, w, y, 0.0f);
}

/* A pointwise operation computing in fp32: y = mode(x, alpha2 * b) (b NULL
 * for a unary mode), or for a backward mode dx = mode(dy, x). */
static cudnnBackendDescriptor_t pointwise(BackendGraph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y, float alpha2,
                                          cudnnBackendDescriptor_t dy) {
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = backend_graph_part(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    SET_ATTR(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET_ATTR(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    CUDNN_CHECK(cudnnBackendFinalize(pw));
    cudnnBackendDescriptor_t op = backend_graph_part(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (dy) {
        SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dy);
        SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    } else {
        if (b) SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
        SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        if (alpha2 != 1.0f) SET_ATTR(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha2);
    }
    CUDNN_CHECK(cudnnBackendFinalize(op));
    return op;
}

cudnnBackendDescriptor_t backend_graph_pointwise_op(BackendGraph *g, cudnnPointwiseMode_t mode,
                                                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                                    cudnnBackendDescriptor_t y) {
    return pointwise(g, mode, x, b, y, 1.0f, NULL);
}

cudnnBackendDescriptor_t backend_graph_sub_op(BackendGraph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                              cudnnBackendDescriptor_t y) {
    return pointwise(g, CUDNN_POINTWISE_ADD, x, b, y, -1.0f, NULL);
}

cudnnBackendDescriptor_t backend_graph_pointwise_backward_op(BackendGraph *g, cudnnPointwiseMode_t mode,
                                                             cudnnBackendDescriptor_t dy, cudnnBackendDescriptor_t x,
                                                             cudnnBackendDescriptor_t dx) {
    return pointwise(g, mode, x, NULL, dx, 1.0f, dy);
}

bool backend_graph_build(BackendGraph *g, cudnnHandle_t h, const cudnnBackendDescriptor_t *ops, int count) {
    cudnnBackendDescriptor_t graph = backend_graph_part(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    SET_ATTR(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, ops);
    SET_ATTR(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    if (cudnnBackendFinalize(graph) != CUDNN_STATUS_SUCCESS) return false;
    g->graph = graph;
    return true;
}

/* ---- choosing a plan ----------------------------------------------------------- */

/* Whether the engine behind cfg keeps the policy (see the header). */
static bool engine_allowed(const BackendGraph *g, const ConvAlgoPolicy *policy, cudnnBackendDescriptor_t cfg) {
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
        if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && g->dtype == DTYPE_F32 && !policy->allow_tf32) ok = false;
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
static int collect_candidates(const BackendGraph *g, cudnnHandle_t h, const ConvAlgoPolicy *policy,
                              cudnnBackendHeurMode_t mode, Candidate *out, int max) {
    cudnnBackendDescriptor_t heur;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    SET_ATTR(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->graph);
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
    if (!cfgs) TC_FATAL("%s: out of host memory for %lld engine configs", g->op_name, (long long)available);
    for (int64_t i = 0; i < available; i++)
        CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]));
    int64_t returned = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         available, &returned, cfgs));
    int found = 0;
    for (int64_t i = 0; i < available; i++) {
        Candidate cand = {cfgs[i], NULL, 0};
        if (i < returned && found < max && engine_allowed(g, policy, cfgs[i]))
            cand.plan = finalize_plan(h, cfgs[i], policy->workspace_limit, &cand.workspace);
        if (cand.plan) out[found++] = cand;
        else CUDNN_CHECK(cudnnBackendDestroyDescriptor(cfgs[i]));
    }
    free(cfgs);
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(heur));
    return found;
}

/* The variant pack: the recorded tensors' device pointers, and the workspace. */
static cudnnBackendDescriptor_t variant_pack(const BackendGraph *g, void *const *ptrs, void *workspace) {
    int64_t uids[BACKEND_GRAPH_MAX_TENSORS];
    void *data[BACKEND_GRAPH_MAX_TENSORS];
    int64_t count = g->tensor_count;
    for (int i = 0; i < g->tensor_count; i++) {
        uids[i] = g->uids[i];
        data[i] = ptrs[g->uids[i] - 1];
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

/* Holds the stream until the host opens the gate (gate[0]) or timeout_ns
 * passes (then says so in gate[1]): the runs queued behind it then start
 * back to back, so that their events time the GPU, not how fast the host
 * queued them (a host busy with other threads, or a rank pinned to one core,
 * queued cuDNN's launches slower than the GPU ran them and made fast plans
 * time slow). */
static __global__ void gate_kernel(volatile int *gate, unsigned long long timeout_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(2000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (!gate[0] && now - start < timeout_ns);
    if (!gate[0]) gate[1] = 1;
}

#define GATE_TIMEOUT_NS 20000000ull

float backend_graph_time_ms(cudnnHandle_t h, void (*run)(void *arg), void *arg, int runs) {
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    volatile int *gate;
    CUDA_CHECK(cudaHostAlloc((void **)&gate, 2 * sizeof(int), cudaHostAllocMapped));
    gate[0] = gate[1] = 0;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    run(arg); /* the first run also pays the kernel's loading */
    gate_kernel<<<1, 1, 0, stream>>>((int *)gate, GATE_TIMEOUT_NS);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < runs; i++) run(arg);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    gate[0] = 1;
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (gate[1])
        log_warn("a start-up timing: the host took over %.0f ms to queue %d runs, so their time (%.3f ms each) is "
                 "partly the host's", GATE_TIMEOUT_NS / 1e6, runs, ms / runs);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaFreeHost((void *)gate));
    return ms / runs;
}

static __global__ void fill_scratch_kernel(__half *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t u = (uint32_t)i * 0x9E3779B9u ^ (uint32_t)(i >> 32);
        u ^= u >> 16, u *= 0x7FEB352Du, u ^= u >> 15, u *= 0x846CA68Bu, u ^= u >> 16;
        p[i] = __float2half((float)(u >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

void backend_graph_fill_scratch(cudnnHandle_t h, void *p, size_t bytes) {
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    size_t n = bytes / sizeof(__half);
    if (n == 0) return;
    fill_scratch_kernel<<<1024, 256, 0, stream>>>((__half *)p, n);
    CUDA_CHECK_LAUNCH();
}

typedef struct {
    cudnnHandle_t h;
    cudnnBackendDescriptor_t plan, pack;
} PlanRun;

static void run_plan(void *arg) {
    const PlanRun *r = (const PlanRun *)arg;
    execute(r->h, r->plan, r->pack);
}

/* Milliseconds per run of plan on buffers of random values, on the handle's stream. */
static float time_plan(const BackendGraph *g, cudnnHandle_t h, cudnnBackendDescriptor_t plan, void *const *ptrs,
                       void *workspace) {
    PlanRun r = {h, plan, variant_pack(g, ptrs, workspace)};
    float ms = backend_graph_time_ms(h, run_plan, &r, BACKEND_GRAPH_TIMING_RUNS);
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(r.pack));
    return ms;
}

/* Each candidate's milliseconds per run into ms, timed on scratch buffers allocated here. */
static void time_candidates(const BackendGraph *g, cudnnHandle_t h, const Candidate *cands, int count, float *ms) {
    size_t workspace_bytes = 0;
    for (int i = 0; i < count; i++)
        if (cands[i].workspace > workspace_bytes) workspace_bytes = cands[i].workspace;
    void *ptrs[BACKEND_GRAPH_MAX_TENSORS] = {0}, *workspace = NULL;
    for (int i = 0; i < g->tensor_count; i++) {
        void **p = &ptrs[g->uids[i] - 1];
        CUDA_CHECK(cudaMalloc(p, g->bytes[i]));
        backend_graph_fill_scratch(h, *p, g->bytes[i]);
    }
    if (workspace_bytes) CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    for (int i = 0; i < count; i++) ms[i] = time_plan(g, h, cands[i].plan, ptrs, workspace);
    for (int i = 0; i < g->tensor_count; i++) CUDA_CHECK(cudaFree(ptrs[g->uids[i] - 1]));
    if (workspace) CUDA_CHECK(cudaFree(workspace));
}

/* The index of the fastest of count candidates by their times, agreed with
 * the processes the policy chooses with (BACKEND_GRAPH_BENCHMARK_PLANS of
 * them, infinite past count, so that each passes as many); its milliseconds
 * per run into *best_ms. -1 where none has a finite time. */
static int fastest(const BackendGraph *g, cudnnHandle_t h, const ConvAlgoPolicy *policy, const Candidate *cands,
                   int count, float *best_ms) {
    float ms[BACKEND_GRAPH_BENCHMARK_PLANS];
    for (int i = 0; i < BACKEND_GRAPH_BENCHMARK_PLANS; i++) ms[i] = INFINITY;
    if (count > 0) time_candidates(g, h, cands, count, ms);
    conv_policy_agree(policy, ms, BACKEND_GRAPH_BENCHMARK_PLANS);
    int best = -1;
    for (int i = 0; i < count; i++)
        if (isfinite(ms[i]) && (best < 0 || ms[i] < ms[best])) best = i;
    if (best >= 0) *best_ms = ms[best];
    return best;
}

/* Keeps cands[best] as g's plan and destroys the others; 0 where best < 0. */
static int keep_candidate(BackendGraph *g, Candidate *cands, int count, int best) {
    for (int i = 0; i < count; i++) {
        if (i == best) continue;
        CUDNN_CHECK(cudnnBackendDestroyDescriptor(cands[i].plan));
        CUDNN_CHECK(cudnnBackendDestroyDescriptor(cands[i].cfg));
    }
    if (best < 0) return 0;
    g->engine_config = cands[best].cfg;
    g->plan = cands[best].plan;
    g->workspace_bytes = cands[best].workspace;
    return 1;
}

/* Heuristics mode A's candidates; under benchmark the FALLBACK list's fill
 * the rest of the timed set (engines mode A does not rank), otherwise they
 * are taken only where mode A has none. A graph that did not build has none,
 * but still agrees its (infinite) timings with the other processes. */
int backend_graph_choose_plan(BackendGraph *g, cudnnHandle_t h, const ConvAlgoPolicy *policy) {
    Candidate cands[BACKEND_GRAPH_BENCHMARK_PLANS];
    int max = policy->benchmark ? BACKEND_GRAPH_BENCHMARK_PLANS : 1;
    int count = 0;
    if (g->graph) {
        count = collect_candidates(g, h, policy, CUDNN_HEUR_MODE_A, cands, max);
        if (count < max)
            count += collect_candidates(g, h, policy, CUDNN_HEUR_MODE_FALLBACK, cands + count, max - count);
    }
    g->plan_ms = 0;
    int best = policy->benchmark ? fastest(g, h, policy, cands, count, &g->plan_ms) : count > 0 ? 0 : -1;
    return keep_candidate(g, cands, count, best);
}

/* ---- the plan cache (ConvAlgoPolicy.plan_cache) ----------------------------------- */

static BackendPlanChoice *cached_choice(BackendPlanCache *cache, const char *op, const void *key, size_t key_bytes) {
    for (int i = 0; i < cache->n; i++) {
        const BackendPlanChoice *c = &cache->choices[i];
        if (!strcmp(c->op, op) && c->key_bytes == key_bytes && memcmp(c->key, key, key_bytes) == 0)
            return &cache->choices[i];
    }
    return NULL;
}

/* cfg's engine and knobs as numbers; 0 where cuDNN does not give them or
 * they are more than BACKEND_PLAN_MAX_KNOBS (then nothing is cached). */
static int read_choice(cudnnBackendDescriptor_t cfg, BackendPlanChoice *c) {
    cudnnBackendDescriptor_t engine, knobs[BACKEND_PLAN_MAX_KNOBS];
    int64_t got = 0, count = 0;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine));
    int ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                                      &engine) == CUDNN_STATUS_SUCCESS && got == 1 &&
             cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                      &c->engine) == CUDNN_STATUS_SUCCESS && got == 1 &&
             cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                      &count, NULL) == CUDNN_STATUS_SUCCESS && count >= 0 &&
             count <= BACKEND_PLAN_MAX_KNOBS;
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(engine));
    if (!ok) return 0;
    for (int64_t i = 0; i < count; i++) CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
                                                                                 &knobs[i]));
    ok = count == 0 || (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                 count, &got, knobs) == CUDNN_STATUS_SUCCESS && got == count);
    for (int64_t i = 0; ok && i < count; i++) {
        cudnnBackendKnobType_t type;
        int64_t n_type = 0, n_value = 0;
        ok = cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n_type,
                                      &type) == CUDNN_STATUS_SUCCESS && n_type == 1 &&
             cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &n_value,
                                      &c->knob_value[i]) == CUDNN_STATUS_SUCCESS && n_value == 1;
        c->knob_type[i] = (int64_t)type;
    }
    for (int64_t i = 0; i < count; i++) CUDNN_CHECK(cudnnBackendDestroyDescriptor(knobs[i]));
    c->knobs = (int)count;
    return ok;
}

/* The cached engine with its knobs, built for g's graph (the engine and knob
 * descriptors kept with g's parts), as a candidate within the policy; 0 where
 * it does not finalize for this graph. */
static int rebuild_choice(BackendGraph *g, cudnnHandle_t h, const ConvAlgoPolicy *policy, const BackendPlanChoice *c,
                          Candidate *out) {
    cudnnBackendDescriptor_t engine = backend_graph_part(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR), knobs[BACKEND_PLAN_MAX_KNOBS];
    SET_ATTR(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->graph);
    SET_ATTR(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &c->engine);
    if (cudnnBackendFinalize(engine) != CUDNN_STATUS_SUCCESS) return 0;
    for (int i = 0; i < c->knobs; i++) {
        cudnnBackendKnobType_t type = (cudnnBackendKnobType_t)c->knob_type[i];
        knobs[i] = backend_graph_part(g, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
        SET_ATTR(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type);
        SET_ATTR(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &c->knob_value[i]);
        if (cudnnBackendFinalize(knobs[i]) != CUDNN_STATUS_SUCCESS) return 0;
    }
    cudnnBackendDescriptor_t cfg;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg));
    SET_ATTR(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine);
    if (c->knobs) SET_ATTR(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, c->knobs, knobs);
    *out = (Candidate){cfg, NULL, 0};
    if (cudnnBackendFinalize(cfg) == CUDNN_STATUS_SUCCESS && engine_allowed(g, policy, cfg))
        out->plan = finalize_plan(h, cfg, policy->workspace_limit, &out->workspace);
    if (out->plan) return 1;
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(cfg));
    return 0;
}

/* A choice cached at another batch offered to g (the header says how); -1 where none of the plans it tried
 * finalized (the caller searches in full), else 1. */
static int choose_from_cache(BackendGraph *g, cudnnHandle_t h, const ConvAlgoPolicy *policy,
                             const BackendPlanChoice *c) {
    Candidate cands[1 + BACKEND_PLAN_CACHE_FRESH];
    int count = rebuild_choice(g, h, policy, c, &cands[0]);
    count += collect_candidates(g, h, policy, CUDNN_HEUR_MODE_A, cands + count, BACKEND_PLAN_CACHE_FRESH);
    if (count == 0) return -1;
    g->plan_ms = 0;
    return keep_candidate(g, cands, count, fastest(g, h, policy, cands, count, &g->plan_ms)) ? 1 : -1;
}

int backend_graph_choose_plan_cached(BackendGraph *g, cudnnHandle_t h, const ConvAlgoPolicy *policy, const void *key,
                                     size_t key_bytes, int batch) {
    BackendPlanCache *cache = policy->plan_cache;
    if (!cache || !policy->benchmark || policy->agree || !g->graph || key_bytes > BACKEND_PLAN_KEY_BYTES)
        return backend_graph_choose_plan(g, h, policy);
    double t0 = now_seconds();
    BackendPlanChoice *c = cached_choice(cache, g->op_name, key, key_bytes);
    int chosen = c && c->batch != batch ? choose_from_cache(g, h, policy, c) : -1;
    BackendPlanHow how = chosen < 0 ? BACKEND_PLAN_SEARCHED : BACKEND_PLAN_NARROWED;
    cache->chosen[how]++;
    if (how == BACKEND_PLAN_SEARCHED) {
        chosen = backend_graph_choose_plan(g, h, policy);
        BackendPlanChoice fresh = {g->op_name, {0}, key_bytes, batch, 0, 0, {0}, {0}};
        memcpy(fresh.key, key, key_bytes);
        if (chosen && !c && cache->n < BACKEND_PLAN_CACHE_SIZE && read_choice(g->engine_config, &fresh))
            cache->choices[cache->n++] = fresh;
    }
    if (cache->progress) cache->progress(cache->progress_user, how, now_seconds() - t0);
    return chosen;
}

/* ---- running it ------------------------------------------------------------------- */

void backend_graph_execute(const BackendGraph *g, cudnnHandle_t h, void *const *ptrs, void *workspace) {
    for (int i = 0; i < g->tensor_count; i++) {
        const void *p = ptrs[g->uids[i] - 1];
        if (!p) TC_FATAL("%s: no pointer for the graph's tensor %lld", g->op_name, (long long)g->uids[i]);
        if ((uintptr_t)p % BACKEND_GRAPH_ALIGNMENT != 0)
            TC_FATAL("%s: tensor %lld at %p is not %d-byte aligned, as the fused plan was built for", g->op_name,
                     (long long)g->uids[i], p, BACKEND_GRAPH_ALIGNMENT);
    }
    cudnnBackendDescriptor_t pack = variant_pack(g, ptrs, workspace);
    execute(h, g->plan, pack);
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
}
