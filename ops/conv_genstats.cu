/* conv_genstats on the GPU: one cuDNN graph through cuDNN 9's backend API,
 *
 *   [X * SCALE -> + BIAS -> RELU_FWD ->] CONVOLUTION_FORWARD -> Y -> GEN_STATS (SUM_SQSUM) -> SUM, SQSUM
 *
 * the prologue's intermediates virtual fp32, every operation computing in
 * fp32, its plan chosen by the policy as ops/backend_graph.h says. With no
 * such plan, the fallback (conv_genstats.h): prologue kernel, Conv2dCuda, a
 * per-channel reduction kernel; and bn_finalize's kernel. Where conv2d's
 * direct path fits and times faster, that Conv2dCuda's direct forward with
 * the sums in its epilogue. */
#include "ops/conv_genstats.h"

#include <string.h>

#include "ops/add.h"
#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

/* The prologue's virtual intermediates (unique ids after the real tensors). */
enum { UID_SCALED = 100, UID_BIASED, UID_ACTIVATED };

#define STATS_CHANNELS 32 /* the reduction's block: 32 channels x STATS_ROWS rows */
#define STATS_ROWS 8
#define FINALIZE_THREADS 128
#define PROLOGUE_THREADS 256
#define WORKSPACE_ALIGNMENT 256

/* ---- the graph -------------------------------------------------------------------- */

static cudnnBackendDescriptor_t genstats_op(BackendGraph *g, cudnnBackendDescriptor_t y,
                                            cudnnBackendDescriptor_t sum, cudnnBackendDescriptor_t sqsum) {
    cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t op = backend_graph_part(g, CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
    CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode));
    CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
    CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    CUDNN_CHECK(
        cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sum));
    CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                         &sqsum));
    CUDNN_CHECK(cudnnBackendFinalize(op));
    return op;
}

/* The convolution's input in g: X, or with a prologue the virtual
 * relu(X * SCALE + BIAS), its three operations appended to ops[*count]. */
static cudnnBackendDescriptor_t input_ops(const ConvGenStatsCuda *c, BackendGraph *g, cudnnDataType_t data,
                                          cudnnBackendDescriptor_t *ops, int *count) {
    const Conv2dShape *s = &c->shape.conv;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t x = backend_graph_tensor(g, CGS_UID_X, data, s->n, s->c, s->h, s->w, false);
    if (!c->shape.prologue) return x;
    cudnnBackendDescriptor_t scale = backend_graph_tensor(g, CGS_UID_SCALE, data, 1, s->c, 1, 1, false);
    cudnnBackendDescriptor_t bias = backend_graph_tensor(g, CGS_UID_BIAS, data, 1, s->c, 1, 1, false);
    cudnnBackendDescriptor_t scaled = backend_graph_tensor(g, UID_SCALED, f32, s->n, s->c, s->h, s->w, true);
    cudnnBackendDescriptor_t biased = backend_graph_tensor(g, UID_BIASED, f32, s->n, s->c, s->h, s->w, true);
    cudnnBackendDescriptor_t act = backend_graph_tensor(g, UID_ACTIVATED, f32, s->n, s->c, s->h, s->w, true);
    ops[(*count)++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_MUL, x, scale, scaled);
    ops[(*count)++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_ADD, scaled, bias, biased);
    ops[(*count)++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_RELU_FWD, biased, NULL, act);
    return act;
}

/* The forward graph's operations, in order; returns their count. */
static int forward_ops(ConvGenStatsCuda *c, cudnnDataType_t data, cudnnBackendDescriptor_t ops[5]) {
    const Conv2dShape *s = &c->shape.conv;
    int64_t oh = conv2d_out_h(s), ow = conv2d_out_w(s);
    BackendGraph *g = &c->graph;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    int count = 0;
    cudnnBackendDescriptor_t x = input_ops(c, g, data, ops, &count);
    cudnnBackendDescriptor_t w = backend_graph_tensor(g, CGS_UID_W, data, s->k, s->c, s->r, s->s, false);
    cudnnBackendDescriptor_t y = backend_graph_tensor(g, CGS_UID_Y, data, s->n, s->k, oh, ow, false);
    cudnnBackendDescriptor_t sum = backend_graph_tensor(g, CGS_UID_SUM, f32, 1, s->k, 1, 1, false);
    cudnnBackendDescriptor_t sqsum = backend_graph_tensor(g, CGS_UID_SQSUM, f32, 1, s->k, 1, 1, false);
    ops[count++] = backend_graph_conv_op(g, s, x, w, y);
    ops[count++] = genstats_op(g, y, sum, sqsum);
    return count;
}

/* The filter gradient's graph: dw (uid W) = wgrad(x', dy (uid Y)). Its
 * runtime-fusion plans ignore a beta of 1 (measured on an H100: dw came back
 * overwritten), so where dw is added to it writes a scratch that the op then
 * adds into dw. */
static int filter_ops(ConvGenStatsCuda *c, cudnnDataType_t data, cudnnBackendDescriptor_t ops[4]) {
    const Conv2dShape *s = &c->shape.conv;
    BackendGraph *g = &c->filter_graph;
    int count = 0;
    cudnnBackendDescriptor_t x = input_ops(c, g, data, ops, &count);
    cudnnBackendDescriptor_t dw = backend_graph_tensor(g, CGS_UID_W, data, s->k, s->c, s->r, s->s, false);
    cudnnBackendDescriptor_t dy =
        backend_graph_tensor(g, CGS_UID_Y, data, s->n, s->k, conv2d_out_h(s), conv2d_out_w(s), false);
    ops[count++] = backend_graph_conv_pass_op(g, s, BACKEND_CONV_FILTER, x, dw, dy, 0.0f);
    return count;
}

/* Builds g from its operations and keeps a plan; 0 when there is none (fallback). */
static int choose_plan(BackendGraph *g, cudnnHandle_t h, const cudnnBackendDescriptor_t *ops, int count,
                       const ConvAlgoPolicy *policy) {
    bool built = backend_graph_build(g, h, ops, count);
    return backend_graph_choose_plan(g, h, policy) && built; /* which agrees its timings even where not built */
}

/* ---- the fallback's kernels -------------------------------------------------------- */

/* out = relu(x * scale[c] + bias[c]); channel c of element i by the layout. */
template <typename T>
__global__ void prologue_kernel(const T *x, const T *scale, const T *bias, T *out, size_t count, int channels,
                                size_t plane, int nhwc) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    int c = nhwc ? (int)(i % channels) : (int)(i / plane % channels);
    float v = __fmaf_rn(to_float(x[i]), to_float(scale[c]), to_float(bias[c])); /* as bn_prologue_input */
    out[i] = from_float<T>(v < 0.0f ? 0.0f : v); /* NaN passes, as in relu.h */
}

template <typename T>
static void launch_prologue(const void *x, const void *scale, const void *bias, void *out, size_t count,
                            int channels, size_t plane, int nhwc, cudaStream_t stream) {
    unsigned blocks = (unsigned)((count + PROLOGUE_THREADS - 1) / PROLOGUE_THREADS);
    prologue_kernel<T><<<blocks, PROLOGUE_THREADS, 0, stream>>>((const T *)x, (const T *)scale, (const T *)bias,
                                                                (T *)out, count, channels, plane, nhwc);
    CUDA_CHECK(cudaGetLastError());
}

/* sum[k], sqsum[k] over the rows = n * plane values of channel k of y. A block
 * takes STATS_CHANNELS channels (adjacent in NHWC: coalesced); its thread row
 * ty sums rows ty, ty + STATS_ROWS, ... in double, and the rows' partials are
 * added in order: the same bits on every run. */
template <typename T>
__global__ void channel_stats_kernel(const T *y, float *sum, float *sqsum, int n, int k, size_t plane, int nhwc) {
    __shared__ double partial[2][STATS_ROWS][STATS_CHANNELS];
    int ch = blockIdx.x * STATS_CHANNELS + threadIdx.x;
    size_t rows = (size_t)n * plane;
    double s1 = 0, s2 = 0;
    if (ch < k)
        for (size_t row = threadIdx.y; row < rows; row += STATS_ROWS) {
            size_t at = nhwc ? row * k + ch : ((row / plane) * k + ch) * plane + row % plane;
            double v = to_float(y[at]);
            s1 += v, s2 += v * v;
        }
    partial[0][threadIdx.y][threadIdx.x] = s1;
    partial[1][threadIdx.y][threadIdx.x] = s2;
    __syncthreads();
    if (threadIdx.y != 0 || ch >= k) return;
    for (int r = 1; r < STATS_ROWS; r++) s1 += partial[0][r][threadIdx.x], s2 += partial[1][r][threadIdx.x];
    sum[ch] = (float)s1;
    sqsum[ch] = (float)s2;
}

template <typename T>
static void launch_channel_stats(const void *y, float *sum, float *sqsum, int n, int k, size_t plane, int nhwc,
                                 cudaStream_t stream) {
    dim3 block(STATS_CHANNELS, STATS_ROWS);
    unsigned blocks = (unsigned)((k + STATS_CHANNELS - 1) / STATS_CHANNELS);
    channel_stats_kernel<T><<<blocks, block, 0, stream>>>((const T *)y, sum, sqsum, n, k, plane, nhwc);
    CUDA_CHECK(cudaGetLastError());
}

static size_t round_up(size_t bytes) {
    return (bytes + WORKSPACE_ALIGNMENT - 1) / WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT;
}

/* The fallback's convolution input: x, or x' written by the prologue kernel
 * at the front of the workspace; *conv_workspace is what is left after it. */
static const void *fallback_input(const ConvGenStatsCuda *c, const void *x, const void *scale, const void *bias,
                                  void *workspace, void **conv_workspace, cudaStream_t stream) {
    const Conv2dShape *s = &c->shape.conv;
    *conv_workspace = workspace;
    if (!c->shape.prologue) return x;
    size_t plane = (size_t)s->h * s->w, count = (size_t)s->n * s->c * plane;
    DISPATCH_FLOAT_DTYPE(c->dtype, launch_prologue, x, scale, bias, workspace, count, s->c, plane, c->nhwc, stream);
    *conv_workspace = (char *)workspace + c->prologue_bytes;
    return workspace;
}

static void forward_fallback(const ConvGenStatsCuda *c, cudnnHandle_t h, const void *x, const void *scale,
                             const void *bias, const void *w, void *y, float *sum, float *sqsum, void *workspace) {
    const Conv2dShape *s = &c->shape.conv;
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    void *conv_workspace;
    const void *conv_in = fallback_input(c, x, scale, bias, workspace, &conv_workspace, stream);
    conv2d_forward_cuda(&c->fallback, h, conv_in, w, NULL, y, conv_workspace);
    size_t out_plane = (size_t)conv2d_out_h(s) * conv2d_out_w(s);
    DISPATCH_FLOAT_DTYPE(c->dtype, launch_channel_stats, y, sum, sqsum, s->n, s->k, out_plane, c->nhwc, stream);
}

/* ---- the direct path -------------------------------------------------------------- */

typedef struct {
    const ConvGenStatsCuda *c;
    cudnnHandle_t h;
    void *x, *w, *y, *workspace;
    float *sums;
} DirectRun;

static void run_direct(void *arg) {
    const DirectRun *r = (const DirectRun *)arg;
    conv2d_forward_stats_cuda(&r->c->fallback, r->h, r->x, r->w, r->y, r->sums, r->sums + r->c->shape.conv.k,
                              r->workspace);
}

/* Microseconds per run of the direct path with its sums, on scratch of random values. */
static float direct_time_us(const ConvGenStatsCuda *c, cudnnHandle_t h) {
    const Conv2dShape *s = &c->shape.conv;
    size_t elem = dtype_size(c->dtype);
    size_t bytes[3] = {(size_t)s->n * s->c * s->h * s->w * elem, (size_t)s->k * s->c * s->r * s->s * elem,
                       (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s) * elem};
    void *p[3];
    for (int i = 0; i < 3; i++) {
        CUDA_CHECK(cudaMalloc(&p[i], bytes[i]));
        backend_graph_fill_scratch(h, p[i], bytes[i]);
    }
    DirectRun r = {c, h, p[0], p[1], p[2], NULL, NULL};
    CUDA_CHECK(cudaMalloc(&r.workspace, conv2d_direct_stats_bytes(&c->fallback)));
    CUDA_CHECK(cudaMalloc((void **)&r.sums, 2 * (size_t)s->k * sizeof(float)));
    float us = 1000.0f * backend_graph_time_ms(h, run_direct, &r, BACKEND_GRAPH_TIMING_RUNS);
    for (int i = 0; i < 3; i++) CUDA_CHECK(cudaFree(p[i]));
    CUDA_CHECK(cudaFree(r.workspace));
    CUDA_CHECK(cudaFree(r.sums));
    return us;
}

/* Under benchmark, a shape without prologue that conv2d's direct path takes:
 * that path with the sums in its epilogue timed against the graph's plan (its
 * time agreed with the other processes), the faster kept. The fallback's
 * conv2d is set up here (it times its own passes, the direct one among them),
 * and taken down again where the graph wins, which needs no fallback. */
static void choose_direct(ConvGenStatsCuda *c, cudnnHandle_t h, const ConvAlgoPolicy *policy) {
    const Conv2dShape *s = &c->shape.conv;
    if (c->shape.prologue || !policy->benchmark || !conv2d_direct_fits(s, c->dtype, c->nhwc)) return;
    conv2d_cuda_init(&c->fallback, h, s, c->dtype, c->nhwc, policy);
    size_t bytes = conv2d_direct_stats_bytes(&c->fallback);
    if (bytes > 0) {
        c->direct_us = direct_time_us(c, h);
        conv_policy_agree(policy, &c->direct_us, 1);
        float graph_us = c->fused ? 1000.0f * c->graph.plan_ms : INFINITY;
        c->direct = policy->prefer_direct || c->direct_us < graph_us;
    }
    if (c->direct && bytes > c->workspace_bytes) c->workspace_bytes = bytes;
    if (!c->direct && c->fused) conv2d_cuda_destroy(&c->fallback);
}

/* ---- the op ---------------------------------------------------------------------- */

void conv_genstats_cuda_init(ConvGenStatsCuda *c, cudnnHandle_t h, const ConvGenStatsShape *s, DType dtype,
                             int nhwc, const ConvAlgoPolicy *policy) {
    memset(c, 0, sizeof *c);
    check_float_dtype("conv_genstats", dtype);
    const Conv2dShape *cs = &s->conv;
    if (cs->n <= 0 || cs->c <= 0 || cs->k <= 0 || cs->r <= 0 || cs->s <= 0 || cs->stride <= 0 || cs->pad < 0 ||
        conv2d_out_h(cs) <= 0 || conv2d_out_w(cs) <= 0)
        TC_FATAL("conv_genstats: bad shape n=%d c=%d h=%d w=%d k=%d r=%d s=%d pad=%d stride=%d", cs->n, cs->c,
                 cs->h, cs->w, cs->k, cs->r, cs->s, cs->pad, cs->stride);
    c->shape = *s;
    c->dtype = dtype;
    c->nhwc = nhwc != 0;
    cudnnDataType_t data = dtype_cudnn(dtype);
    cudnnBackendDescriptor_t ops[5];
    backend_graph_init(&c->graph, "conv_genstats", dtype, nhwc);
    c->fused = choose_plan(&c->graph, h, ops, forward_ops(c, data, ops), policy);
    if (s->prologue) {
        backend_graph_init(&c->filter_graph, "conv_genstats filter gradient", dtype, nhwc);
        c->filter_fused = choose_plan(&c->filter_graph, h, ops, filter_ops(c, data, ops), policy);
    }
    if (c->fused) c->workspace_bytes = c->graph.workspace_bytes;
    choose_direct(c, h, policy);
    c->filter_scratch_bytes = round_up((size_t)cs->k * cs->c * cs->r * cs->s * dtype_size(dtype));
    if (c->filter_fused && c->filter_scratch_bytes + c->filter_graph.workspace_bytes > c->workspace_bytes)
        c->workspace_bytes = c->filter_scratch_bytes + c->filter_graph.workspace_bytes;
    if (!c->direct && (!c->fused || (s->prologue && !c->filter_fused))) {
        if (!c->fallback.x_desc) conv2d_cuda_init(&c->fallback, h, cs, dtype, nhwc, policy);
        size_t x_bytes = (size_t)cs->n * cs->c * cs->h * cs->w * dtype_size(dtype);
        c->prologue_bytes = s->prologue ? round_up(x_bytes) : 0;
        size_t fallback_bytes = c->prologue_bytes + c->fallback.workspace_bytes; /* the stats kernel needs none */
        if (fallback_bytes > c->workspace_bytes) c->workspace_bytes = fallback_bytes;
    }
}

void conv_genstats_cuda_destroy(ConvGenStatsCuda *c) {
    backend_graph_destroy(&c->graph);
    backend_graph_destroy(&c->filter_graph);
    if (c->fallback.x_desc) conv2d_cuda_destroy(&c->fallback);
    memset(c, 0, sizeof *c);
}

void conv_genstats_forward_cuda(const ConvGenStatsCuda *c, cudnnHandle_t h, const void *x, const void *scale,
                                const void *bias, const void *w, void *y, float *sum, float *sqsum,
                                void *workspace) {
    if (c->shape.prologue && (!scale || !bias)) TC_FATAL("conv_genstats: a prologue shape without scale and bias");
    if (c->direct) {
        conv2d_forward_stats_cuda(&c->fallback, h, x, w, y, sum, sqsum, workspace);
        return;
    }
    if (!c->fused) {
        forward_fallback(c, h, x, scale, bias, w, y, sum, sqsum, workspace);
        return;
    }
    void *ptrs[CGS_TENSORS] = {(void *)x, (void *)scale, (void *)bias, (void *)w, y, sum, sqsum};
    backend_graph_execute(&c->graph, h, ptrs, workspace);
}

void conv_genstats_backward_filter_cuda(const ConvGenStatsCuda *c, cudnnHandle_t h, const void *x,
                                        const void *scale, const void *bias, const void *dy, void *dw,
                                        int accumulate_dw, void *workspace) {
    if (!c->shape.prologue || !scale || !bias)
        TC_FATAL("conv_genstats: the filter gradient is for prologue shapes, with their scale and bias");
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    if (c->filter_fused) {
        void *ptrs[CGS_UID_Y] = {(void *)x, (void *)scale, (void *)bias, accumulate_dw ? workspace : dw,
                                 (void *)dy};
        backend_graph_execute(&c->filter_graph, h, ptrs, (char *)workspace + c->filter_scratch_bytes);
        const Conv2dShape *s = &c->shape.conv;
        if (accumulate_dw) add_accumulate_cuda(c->dtype, dw, workspace, (size_t)s->k * s->c * s->r * s->s, stream);
        return;
    }
    void *conv_workspace;
    const void *conv_in = fallback_input(c, x, scale, bias, workspace, &conv_workspace, stream);
    conv2d_backward_ex_cuda(&c->fallback, h, conv_in, NULL, dy, NULL, dw, NULL, conv_workspace,
                            accumulate_dw ? CONV2D_ADD_DW : 0);
}

/* ---- bn_finalize ---------------------------------------------------------------- */

/* One thread a channel, in double, as bn_finalize_cpu. Every input is loaded
 * before the first store: after it, each load would wait for the one before
 * (the compiler cannot tell the pointers apart), a trip to memory each. */
template <typename T>
__global__ void finalize_kernel(int channels, double m, const float *sum, const float *sqsum, BatchNormParams p,
                                T *scale, T *bias) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    bool update = p.momentum != 0.0f;
    float s1 = sum[c], s2 = sqsum[c], gamma = p.gamma[c], beta = bias ? p.beta[c] : 0.0f;
    float running_mean = update && p.running_mean ? p.running_mean[c] : 0.0f;
    float running_var = update && p.running_var ? p.running_var[c] : 0.0f;
    double mean = s1 / m, var = s2 / m - mean * mean;
    if (var < 0.0) var = 0.0;
    double invstd = 1.0 / sqrt(var + p.eps), channel_scale = invstd * gamma;
    if (scale) scale[c] = from_float<T>((float)channel_scale);
    if (bias) bias[c] = from_float<T>((float)(beta - mean * channel_scale));
    if (p.save_mean) p.save_mean[c] = (float)mean;
    if (p.save_invstd) p.save_invstd[c] = (float)invstd;
    if (update && p.running_mean)
        p.running_mean[c] = (float)((1.0 - p.momentum) * running_mean + (double)p.momentum * mean);
    if (update && p.running_var)
        p.running_var[c] = (float)((1.0 - p.momentum) * running_var + (double)p.momentum * var * m / (m - 1.0));
}

template <typename T>
static void launch_finalize(int channels, double m, const float *sum, const float *sqsum, const BatchNormParams *p,
                            void *scale, void *bias, cudaStream_t stream) {
    unsigned blocks = (unsigned)((channels + FINALIZE_THREADS - 1) / FINALIZE_THREADS);
    finalize_kernel<T><<<blocks, FINALIZE_THREADS, 0, stream>>>(channels, m, sum, sqsum, *p, (T *)scale, (T *)bias);
    CUDA_CHECK(cudaGetLastError());
}

void bn_finalize_cuda(DType scale_dtype, int channels, int64_t m, const float *sum, const float *sqsum,
                      const BatchNormParams *p, void *scale, void *bias, cudaStream_t stream) {
    check_float_dtype("bn_finalize", scale_dtype);
    if (m < 2) TC_FATAL("bn_finalize: training needs more than one value per channel (m = %lld)", (long long)m);
    if (channels <= 0) return;
    DISPATCH_FLOAT_DTYPE(scale_dtype, launch_finalize, channels, (double)m, sum, sqsum, p, scale, bias, stream);
}
