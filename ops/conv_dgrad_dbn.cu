/* conv_dgrad_dbn on the GPU: one cuDNN graph through cuDNN 9's backend API,
 *
 *   CONVOLUTION_BACKWARD_DATA (W, DY) -> G
 *   X - MEAN -> * INVSTD -> * GAMMA -> + BETA -> Z
 *   RELU_BWD (G, Z) -> DZ
 *   BN_BWD_WEIGHTS (DZ, X, MEAN, INVSTD, GAMMA) -> DGAMMA, DBETA, A, B, C
 *
 * (the pointwise chain in the form NVIDIA's fused ResNet ops give it), its
 * plan chosen by the policy as ops/backend_graph.h says; then dx = A dz + B x
 * + C and the parameters' gradients added. With no such plan, the fallback
 * (conv_dgrad_dbn.h). */
#include "ops/conv_dgrad_dbn.h"

#include <string.h>

#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

/* The graph's virtual intermediates (unique ids after the real tensors). */
enum { UID_G = 100, UID_CENTERED, UID_NORMALIZED, UID_SCALED, UID_Z };

#define APPLY_THREADS 256
#define PARAM_THREADS 128
#define WORKSPACE_ALIGNMENT 256

static size_t round_up(size_t bytes) {
    return (bytes + WORKSPACE_ALIGNMENT - 1) / WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT;
}

/* One per-channel coefficient's fp32 array in the workspace, from front (after dz where it is there). */
static size_t coefficient_stride(int channels) { return round_up((size_t)channels * sizeof(float)); }

static float *coefficient(const ConvDgradDbnCuda *c, void *front, int which) {
    return (float *)((char *)front + which * coefficient_stride(c->shape.c));
}

/* ---- the graph -------------------------------------------------------------------- */

static cudnnBackendDescriptor_t bn_backward_weights_op(BackendGraph *g, cudnnBackendDescriptor_t dz,
                                                       cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t mean,
                                                       cudnnBackendDescriptor_t invstd, cudnnBackendDescriptor_t gamma,
                                                       const cudnnBackendDescriptor_t out[CDD_COEFFICIENTS]) {
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t op = backend_graph_part(g, CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR);
    struct {
        cudnnBackendAttributeName_t name;
        cudnnBackendDescriptor_t desc;
    } attrs[] = {
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, x},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, dz},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, mean},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, invstd},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, gamma},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, out[CDD_DGAMMA]},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, out[CDD_DBETA]},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, out[CDD_A]},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, out[CDD_B]},
        {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, out[CDD_C]},
    };
    CUDNN_CHECK(
        cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
    for (size_t i = 0; i < sizeof attrs / sizeof *attrs; i++)
        CUDNN_CHECK(cudnnBackendSetAttribute(op, attrs[i].name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &attrs[i].desc));
    return cudnnBackendFinalize(op) == CUDNN_STATUS_SUCCESS ? op : NULL; /* NULL: not for this shape: the fallback */
}

/* The graph's operations, in order; returns their count (0: cuDNN does not
 * describe the norm's backward for this shape or dtype). */
static int graph_ops(ConvDgradDbnCuda *c, cudnnDataType_t data, cudnnBackendDescriptor_t ops[7]) {
    const Conv2dShape *s = &c->shape;
    BackendGraph *g = &c->graph;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t per_channel[CDD_UID_BETA + 1], out[CDD_COEFFICIENTS], t[5];
    cudnnBackendDescriptor_t dy =
        backend_graph_tensor(g, CDD_UID_DY, data, s->n, s->k, conv2d_out_h(s), conv2d_out_w(s), false);
    cudnnBackendDescriptor_t w = backend_graph_tensor(g, CDD_UID_W, data, s->k, s->c, s->r, s->s, false);
    cudnnBackendDescriptor_t x = backend_graph_tensor(g, CDD_UID_X, data, s->n, s->c, s->h, s->w, false);
    for (int uid = CDD_UID_MEAN; uid <= CDD_UID_BETA; uid++)
        per_channel[uid] = backend_graph_tensor(g, uid, f32, 1, s->c, 1, 1, false);
    cudnnBackendDescriptor_t dz = backend_graph_tensor(g, CDD_UID_DZ, data, s->n, s->c, s->h, s->w, false);
    for (int i = 0; i < CDD_COEFFICIENTS; i++)
        out[i] = backend_graph_tensor(g, CDD_UID_DGAMMA + i, f32, 1, s->c, 1, 1, false);
    for (int i = 0; i < 5; i++) t[i] = backend_graph_tensor(g, UID_G + i, f32, s->n, s->c, s->h, s->w, true);
    int count = 0;
    ops[count++] = backend_graph_conv_pass_op(g, s, BACKEND_CONV_DATA, t[0], w, dy, 0.0f);
    ops[count++] = backend_graph_sub_op(g, x, per_channel[CDD_UID_MEAN], t[1]);
    ops[count++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_MUL, t[1], per_channel[CDD_UID_INVSTD], t[2]);
    ops[count++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_MUL, t[2], per_channel[CDD_UID_GAMMA], t[3]);
    ops[count++] = backend_graph_pointwise_op(g, CUDNN_POINTWISE_ADD, t[3], per_channel[CDD_UID_BETA], t[4]);
    ops[count++] = backend_graph_pointwise_backward_op(g, CUDNN_POINTWISE_RELU_BWD, t[0], t[4], dz);
    ops[count++] = bn_backward_weights_op(g, dz, x, per_channel[CDD_UID_MEAN], per_channel[CDD_UID_INVSTD],
                                          per_channel[CDD_UID_GAMMA], out);
    return ops[count - 1] ? count : 0;
}

/* ---- the kernels after the graph ---------------------------------------------------- */

/* dx = a[ch] * dz + b[ch] * x + c[ch] (added to dx with accumulate; else dz
 * may be dx, each thread reading its elements before it writes them), VEC
 * elements a thread: one 16-byte access each where the caller found every
 * pointer aligned and the VEC elements in one channel (NCHW) or in VEC
 * channels in a row (NHWC); else VEC = 1. */
template <typename T, int VEC>
__global__ void apply_kernel(const T *dz, const T *x, const float *a, const float *b, const float *c, T *dx,
                             size_t count, int channels, size_t plane, int nhwc, int accumulate) {
    typedef Pack<T, VEC> P;
    size_t first = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (first >= count) return;
    int ch0 = nhwc ? (int)(first % channels) : (int)(first / plane % channels);
    P dz_v = *(const P *)(dz + first), x_v = *(const P *)(x + first), out;
    if (accumulate) out = *(const P *)(dx + first);
    for (int j = 0; j < VEC; j++) {
        int ch = nhwc ? ch0 + j : ch0;
        float v = a[ch] * to_float(dz_v.v[j]) + b[ch] * to_float(x_v.v[j]) + c[ch];
        out.v[j] = from_float<T>(accumulate ? to_float(out.v[j]) + v : v);
    }
    *(P *)(dx + first) = out;
}

template <typename T>
static void launch_apply(const void *dz, const void *x, const float *a, const float *b, const float *c, void *dx,
                         size_t count, int channels, size_t plane, int nhwc, int accumulate, cudaStream_t stream) {
    constexpr int VEC = 16 / sizeof(T);
    bool aligned = ((uintptr_t)dz | (uintptr_t)x | (uintptr_t)dx) % 16 == 0;
    bool vector = aligned && count % VEC == 0 && (nhwc ? channels % VEC == 0 : plane % VEC == 0);
    int per_thread = vector ? VEC : 1;
    unsigned blocks = (unsigned)((count / per_thread + APPLY_THREADS - 1) / APPLY_THREADS);
    if (vector)
        apply_kernel<T, VEC><<<blocks, APPLY_THREADS, 0, stream>>>((const T *)dz, (const T *)x, a, b, c, (T *)dx,
                                                                   count, channels, plane, nhwc, accumulate);
    else
        apply_kernel<T, 1><<<blocks, APPLY_THREADS, 0, stream>>>((const T *)dz, (const T *)x, a, b, c, (T *)dx,
                                                                 count, channels, plane, nhwc, accumulate);
    CUDA_CHECK(cudaGetLastError());
}

/* dgamma[ch] += sum_dz_xhat[ch], dbeta[ch] += sum_dz[ch], in the gradient's dtype (either NULL: skipped). */
template <typename T>
__global__ void add_params_kernel(const float *sum_dz_xhat, const float *sum_dz, T *dgamma, T *dbeta,
                                  int channels) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= channels) return;
    if (dgamma) dgamma[ch] = from_float<T>(to_float(dgamma[ch]) + sum_dz_xhat[ch]);
    if (dbeta) dbeta[ch] = from_float<T>(to_float(dbeta[ch]) + sum_dz[ch]);
}

template <typename T>
static void launch_add_params(const float *sum_dz_xhat, const float *sum_dz, void *dgamma, void *dbeta, int channels,
                              cudaStream_t stream) {
    unsigned blocks = (unsigned)((channels + PARAM_THREADS - 1) / PARAM_THREADS);
    add_params_kernel<T><<<blocks, PARAM_THREADS, 0, stream>>>(sum_dz_xhat, sum_dz, (T *)dgamma, (T *)dbeta,
                                                               channels);
    CUDA_CHECK(cudaGetLastError());
}

/* ---- the op ---------------------------------------------------------------------- */

void conv_dgrad_dbn_cuda_init(ConvDgradDbnCuda *c, cudnnHandle_t h, const Conv2dShape *s, DType dtype, int nhwc,
                              const ConvAlgoPolicy *policy) {
    memset(c, 0, sizeof *c);
    check_float_dtype("conv_dgrad_dbn", dtype);
    if (s->n <= 0 || s->c <= 0 || s->k <= 0 || s->r <= 0 || s->s <= 0 || s->stride <= 0 || s->pad < 0 ||
        conv2d_out_h(s) <= 0 || conv2d_out_w(s) <= 0 || (int64_t)s->n * s->h * s->w < 2)
        TC_FATAL("conv_dgrad_dbn: bad shape n=%d c=%d h=%d w=%d k=%d r=%d s=%d pad=%d stride=%d (the norm needs "
                 "two values a channel)", s->n, s->c, s->h, s->w, s->k, s->r, s->s, s->pad, s->stride);
    c->shape = *s;
    c->dtype = dtype;
    c->nhwc = nhwc != 0;
    c->dz_bytes = round_up((size_t)s->n * s->c * s->h * s->w * dtype_size(dtype));
    cudnnBackendDescriptor_t ops[7];
    backend_graph_init(&c->graph, "conv_dgrad_dbn", dtype, nhwc);
    int count = graph_ops(c, dtype_cudnn(dtype), ops);
    bool built = count > 0 && backend_graph_build(&c->graph, h, ops, count);
    c->fused = backend_graph_choose_plan(&c->graph, h, policy) && built; /* agrees its timings even where not built */
    if (c->fused) {
        c->workspace_bytes = CDD_COEFFICIENTS * coefficient_stride(s->c) + c->graph.workspace_bytes;
        return;
    }
    BatchNormShape bn = {s->n, s->c, s->h, s->w};
    conv2d_cuda_init(&c->fallback_conv, h, s, dtype, nhwc, policy);
    batchnorm_cuda_init(&c->fallback_bn, h, &bn, dtype, nhwc);
    c->workspace_bytes = c->fallback_conv.workspace_bytes;
}

void conv_dgrad_dbn_cuda_destroy(ConvDgradDbnCuda *c) {
    backend_graph_destroy(&c->graph);
    if (c->fallback_conv.x_desc) conv2d_cuda_destroy(&c->fallback_conv);
    if (c->fallback_bn.scratch) batchnorm_cuda_destroy(&c->fallback_bn);
    memset(c, 0, sizeof *c);
}

void conv_dgrad_dbn_backward_cuda(const ConvDgradDbnCuda *c, cudnnHandle_t h, const void *w, const void *dy,
                                  const void *x, const BatchNormParams *p, void *dx, int accumulate_dx,
                                  void *dgamma, void *dbeta, DType grad_dtype, void *workspace) {
    const Conv2dShape *s = &c->shape;
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    void *dz = accumulate_dx ? workspace : dx; /* else dx is made over dz, in place */
    char *rest = accumulate_dx ? (char *)workspace + c->dz_bytes : (char *)workspace;
    if (!c->fused) {
        conv2d_backward_ex_cuda(&c->fallback_conv, h, NULL, w, dy, dz, NULL, NULL, rest, 0);
        batchnorm_act_backward_cuda(&c->fallback_bn, h, BN_ACT_RELU, x, NULL, dz, NULL, p->gamma, p->beta, NULL,
                                    p->save_mean, p->save_invstd, dx, accumulate_dx, dgamma, dbeta, grad_dtype,
                                    stream);
        return;
    }
    void *ptrs[CDD_TENSORS] = {(void *)dy, (void *)w, (void *)x, p->save_mean, p->save_invstd, (void *)p->gamma,
                               (void *)p->beta, dz};
    for (int i = 0; i < CDD_COEFFICIENTS; i++) ptrs[CDD_UID_DGAMMA - 1 + i] = coefficient(c, rest, i);
    backend_graph_execute(&c->graph, h, ptrs, coefficient(c, rest, CDD_COEFFICIENTS));
    size_t plane = (size_t)s->h * s->w, count = (size_t)s->n * s->c * plane;
    DISPATCH_FLOAT_DTYPE(c->dtype, launch_apply, dz, x, coefficient(c, rest, CDD_A), coefficient(c, rest, CDD_B),
                         coefficient(c, rest, CDD_C), dx, count, s->c, plane, c->nhwc, accumulate_dx, stream);
    if (dgamma || dbeta)
        DISPATCH_FLOAT_DTYPE(grad_dtype, launch_add_params, coefficient(c, rest, CDD_DGAMMA),
                             coefficient(c, rest, CDD_DBETA), dgamma, dbeta, s->c, stream);
}
