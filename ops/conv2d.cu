/* Conv2d through cuDNN's legacy convolution API, NCHW, float32, f16 or bf16 data
 * with fp32 accumulation (the convolution's compute type is always FLOAT: cuDNN's
 * PSEUDO_HALF and PSEUDO_BFLOAT16 configurations for the half types).
 * For float32 the math type is CUDNN_FMA_MATH unless TF32 is allowed: with CUDNN_DEFAULT_MATH
 * cuDNN may run fp32 convolutions as TF32 on Ampere and later (H100 included),
 * which is fast but no longer matches the fp32 CPU reference closely. The half
 * types always may use tensor cores (their inputs are already half, and the
 * products accumulate in fp32). Algorithms come from cuDNN's
 * heuristics at init (or, with 'benchmark', from timing each on the device),
 * the fastest usable one; with 'deterministic' only those
 * cuDNN calls deterministic, so two runs of the same step give the same bits. */
#include "ops/conv2d.h"

#include <string.h>

#include "ops/cuda_launch.h"
#include "ops/dtype_cuda.cuh"
#include "runtime/check.h"

static const float kOne = 1.0f, kZero = 0.0f;

/* A heuristic result we can run: it succeeded, uses tensor-core math on float32
 * only where TF32 is allowed, converts no half type to another, and is
 * deterministic when asked to be. The heuristics list the fastest first. */
static bool usable(const Conv2dCuda *c, cudnnStatus_t status, cudnnMathType_t math,
                   cudnnDeterminism_t det) {
    if (status != CUDNN_STATUS_SUCCESS) return false;
    if (c->dtype == DTYPE_F32) {
        if (!c->policy.allow_tf32 && math != CUDNN_FMA_MATH && math != CUDNN_DEFAULT_MATH)
            return false;
    } else if (math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) {
        return false;
    }
    return !c->policy.deterministic || det == CUDNN_DETERMINISTIC;
}

static cudnnConvolutionFwdAlgo_t choose_fwd_algo(const Conv2dCuda *c, cudnnHandle_t h,
                                                 size_t limit, size_t *bytes, cudnnMathType_t *math) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    if (c->policy.benchmark)
        CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, c->x_desc, c->w_desc, c->conv_desc, c->y_desc,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
    else
        CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c->x_desc, c->w_desc, c->conv_desc,
                                                           c->y_desc, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                           &count, perf));
    {
        for (int i = 0; i < count; i++) {
            if (!usable(c, perf[i].status, perf[i].mathType, perf[i].determinism)) continue;
            size_t need = 0;
            if (cudnnGetConvolutionForwardWorkspaceSize(h, c->x_desc, c->w_desc, c->conv_desc,
                                                        c->y_desc, perf[i].algo, &need) !=
                    CUDNN_STATUS_SUCCESS || need > limit)
                continue;
            *bytes = need;
            *math = perf[i].mathType;
            return perf[i].algo;
        }
    }
    TC_FATAL("conv2d: no%s cuDNN forward algorithm fits a %zu-byte workspace (raise "
             "perf.conv_workspace_mb%s)", c->policy.deterministic ? " deterministic" : "", limit,
             c->policy.deterministic ? " or set perf.deterministic = off" : "");
}

static cudnnConvolutionBwdDataAlgo_t choose_bwd_data_algo(const Conv2dCuda *c, cudnnHandle_t h,
                                                          size_t limit, size_t *bytes,
                                                          cudnnMathType_t *math) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    if (c->policy.benchmark)
        CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
            h, c->w_desc, c->y_desc, c->conv_desc, c->x_desc, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            &count, perf));
    else
        CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            h, c->w_desc, c->y_desc, c->conv_desc, c->x_desc, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            &count, perf));
    {
        for (int i = 0; i < count; i++) {
            if (!usable(c, perf[i].status, perf[i].mathType, perf[i].determinism)) continue;
            size_t need = 0;
            if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, c->w_desc, c->y_desc,
                                                             c->conv_desc, c->x_desc,
                                                             perf[i].algo, &need) !=
                    CUDNN_STATUS_SUCCESS || need > limit)
                continue;
            *bytes = need;
            *math = perf[i].mathType;
            return perf[i].algo;
        }
    }
    TC_FATAL("conv2d: no%s cuDNN backward-data algorithm fits a %zu-byte workspace (raise "
             "perf.conv_workspace_mb%s)", c->policy.deterministic ? " deterministic" : "", limit,
             c->policy.deterministic ? " or set perf.deterministic = off" : "");
}

static cudnnConvolutionBwdFilterAlgo_t choose_bwd_filter_algo(const Conv2dCuda *c,
                                                              cudnnHandle_t h, size_t limit,
                                                              size_t *bytes, cudnnMathType_t *math) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    if (c->policy.benchmark)
        CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
            h, c->x_desc, c->y_desc, c->conv_desc, c->w_desc,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    else
        CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            h, c->x_desc, c->y_desc, c->conv_desc, c->w_desc,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    {
        for (int i = 0; i < count; i++) {
            if (!usable(c, perf[i].status, perf[i].mathType, perf[i].determinism)) continue;
            size_t need = 0;
            if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c->x_desc, c->y_desc,
                                                               c->conv_desc, c->w_desc,
                                                               perf[i].algo, &need) !=
                    CUDNN_STATUS_SUCCESS || need > limit)
                continue;
            *bytes = need;
            *math = perf[i].mathType;
            return perf[i].algo;
        }
    }
    TC_FATAL("conv2d: no%s cuDNN backward-filter algorithm fits a %zu-byte workspace (raise "
             "perf.conv_workspace_mb%s)", c->policy.deterministic ? " deterministic" : "", limit,
             c->policy.deterministic ? " or set perf.deterministic = off" : "");
}

static cudnnConvolutionDescriptor_t make_conv_desc(const Conv2dShape *s, cudnnMathType_t math) {
    cudnnConvolutionDescriptor_t d;
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, s->pad, s->pad, s->stride, s->stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
    return d;
}

/* The math type the heuristics are asked under: the widest this policy and
 * data type allow. */
static cudnnMathType_t widest_math(const Conv2dCuda *c) {
    if (c->dtype != DTYPE_F32) return CUDNN_TENSOR_OP_MATH;
    return c->policy.allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

void conv2d_cuda_init(Conv2dCuda *c, cudnnHandle_t h, const Conv2dShape *s, DType dtype,
                      const ConvAlgoPolicy *policy) {
    memset(c, 0, sizeof *c);
    check_float_dtype("conv2d", dtype);
    c->shape = *s;
    c->dtype = dtype;
    c->policy = *policy;
    cudnnDataType_t data_type = dtype_cudnn(dtype);
    size_t workspace_limit = policy->workspace_limit;
    int out_h = conv2d_out_h(s), out_w = conv2d_out_w(s);
    if (s->n <= 0 || s->c <= 0 || s->k <= 0 || s->r <= 0 || s->s <= 0 || s->stride <= 0 ||
        s->pad < 0 || out_h <= 0 || out_w <= 0)
        TC_FATAL("conv2d: bad shape n=%d c=%d h=%d w=%d k=%d r=%d s=%d pad=%d stride=%d", s->n,
                 s->c, s->h, s->w, s->k, s->r, s->s, s->pad, s->stride);

    CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->y_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&c->b_desc));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&c->w_desc));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->x_desc, CUDNN_TENSOR_NCHW, data_type, s->n,
                                           s->c, s->h, s->w));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(c->w_desc, data_type, CUDNN_TENSOR_NCHW, s->k,
                                           s->c, s->r, s->s));
    /* Heuristics are asked under the widest math allowed; each pass then runs
     * under the math type of the algorithm it got. */
    c->conv_desc = make_conv_desc(s, widest_math(c));

    int dims[4];
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(c->conv_desc, c->x_desc, c->w_desc,
                                                      &dims[0], &dims[1], &dims[2], &dims[3]));
    if (dims[0] != s->n || dims[1] != s->k || dims[2] != out_h || dims[3] != out_w)
        TC_FATAL("conv2d: cuDNN output %dx%dx%dx%d, expected %dx%dx%dx%d", dims[0], dims[1],
                 dims[2], dims[3], s->n, s->k, out_h, out_w);
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->y_desc, CUDNN_TENSOR_NCHW, data_type, s->n,
                                           s->k, out_h, out_w));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->b_desc, CUDNN_TENSOR_NCHW, data_type, 1,
                                           s->k, 1, 1));

    size_t fwd_bytes = 0, data_bytes = 0, filter_bytes = 0;
    cudnnMathType_t fwd_math, data_math, filter_math;
    c->fwd_algo = choose_fwd_algo(c, h, workspace_limit, &fwd_bytes, &fwd_math);
    c->bwd_data_algo = choose_bwd_data_algo(c, h, workspace_limit, &data_bytes, &data_math);
    c->bwd_filter_algo = choose_bwd_filter_algo(c, h, workspace_limit, &filter_bytes, &filter_math);
    CUDNN_CHECK(cudnnSetConvolutionMathType(c->conv_desc, fwd_math));
    c->bwd_data_desc = make_conv_desc(s, data_math);
    c->bwd_filter_desc = make_conv_desc(s, filter_math);
    c->workspace_bytes = fwd_bytes;
    if (data_bytes > c->workspace_bytes) c->workspace_bytes = data_bytes;
    if (filter_bytes > c->workspace_bytes) c->workspace_bytes = filter_bytes;
}

void conv2d_cuda_destroy(Conv2dCuda *c) {
    if (c->conv_desc) CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(c->conv_desc));
    if (c->bwd_data_desc) CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(c->bwd_data_desc));
    if (c->bwd_filter_desc) CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(c->bwd_filter_desc));
    if (c->w_desc) CUDNN_CHECK(cudnnDestroyFilterDescriptor(c->w_desc));
    if (c->b_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(c->b_desc));
    if (c->y_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(c->y_desc));
    if (c->x_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(c->x_desc));
    memset(c, 0, sizeof *c);
}

/* The bias of the half types runs in our own kernels rather than cudnnAddTensor
 * and cudnnConvolutionBackwardBias, whose legacy paths need not take bf16 nor
 * sum in fp32. float32 keeps the cuDNN calls, and so its exact bits. */

/* y[n][k][pq] += b[k], rounded once. */
template <typename T>
static __global__ void conv_add_bias_kernel(T *y, const T *b, size_t total, int channels,
                                            size_t plane) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int k = (int)((i / plane) % channels);
        y[i] = from_float<T>(to_float(y[i]) + to_float(b[k]));
    }
}

/* db[k] += sum over n and pq of dy[n][k][pq]: one block per channel, each thread
 * summing every CONV_BIAS_GRAD_THREADS-th element of the channel in fp32, then
 * a tree in shared memory. A fixed order, so deterministic. */
#define CONV_BIAS_GRAD_THREADS 256

template <typename T>
static __global__ void __launch_bounds__(CONV_BIAS_GRAD_THREADS)
conv_bias_grad_kernel(const T *dy, T *db, int images, int channels, size_t plane) {
    __shared__ float partial[CONV_BIAS_GRAD_THREADS];
    int k = blockIdx.x;
    size_t count = (size_t)images * plane;
    float sum = 0.0f;
    for (size_t j = threadIdx.x; j < count; j += CONV_BIAS_GRAD_THREADS) {
        size_t n = j / plane, pq = j % plane;
        sum += to_float(dy[(n * channels + k) * plane + pq]);
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = CONV_BIAS_GRAD_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) db[k] = from_float<T>(to_float(db[k]) + partial[0]);
}

static size_t out_plane(const Conv2dShape *s) { return (size_t)conv2d_out_h(s) * conv2d_out_w(s); }

template <typename T>
static void launch_conv_add_bias(const Conv2dShape *s, const void *b, void *y,
                                 cudaStream_t stream) {
    size_t total = (size_t)s->n * s->k * out_plane(s);
    conv_add_bias_kernel<T><<<elementwise_blocks(total), ELEMENTWISE_THREADS, 0, stream>>>(
        (T *)y, (const T *)b, total, s->k, out_plane(s));
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_conv_bias_grad(const Conv2dShape *s, const void *dy, void *db,
                                  cudaStream_t stream) {
    conv_bias_grad_kernel<T><<<(unsigned)s->k, CONV_BIAS_GRAD_THREADS, 0, stream>>>(
        (const T *)dy, (T *)db, s->n, s->k, out_plane(s));
    CUDA_CHECK_LAUNCH();
}

static cudaStream_t handle_stream(cudnnHandle_t h) {
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    return stream;
}

static void add_bias(const Conv2dCuda *c, cudnnHandle_t h, const void *b, void *y) {
    if (c->dtype == DTYPE_F32)
        CUDNN_CHECK(cudnnAddTensor(h, &kOne, c->b_desc, b, &kOne, c->y_desc, y));
    else
        DISPATCH_FLOAT_DTYPE(c->dtype, launch_conv_add_bias, &c->shape, b, y, handle_stream(h));
}

static void accumulate_bias_grad(const Conv2dCuda *c, cudnnHandle_t h, const void *dy, void *db) {
    if (c->dtype == DTYPE_F32)
        CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &kOne, c->y_desc, dy, &kOne, c->b_desc, db));
    else
        DISPATCH_FLOAT_DTYPE(c->dtype, launch_conv_bias_grad, &c->shape, dy, db, handle_stream(h));
}

static void check_workspace(const Conv2dCuda *c, const void *workspace) {
    if (c->workspace_bytes > 0 && !workspace)
        TC_FATAL("conv2d: a %zu-byte workspace is needed but none was given", c->workspace_bytes);
}

void conv2d_forward_cuda(const Conv2dCuda *c, cudnnHandle_t h, const void *x, const void *w,
                         const void *b, void *y, void *workspace) {
    check_workspace(c, workspace);
    CUDNN_CHECK(cudnnConvolutionForward(h, &kOne, c->x_desc, x, c->w_desc, w, c->conv_desc,
                                        c->fwd_algo, workspace, c->workspace_bytes, &kZero,
                                        c->y_desc, y));
    add_bias(c, h, b, y);
}

void conv2d_backward_cuda(const Conv2dCuda *c, cudnnHandle_t h, const void *x, const void *w,
                          const void *dy, void *dx, void *dw, void *db, void *workspace) {
    check_workspace(c, workspace);
    if (dx)
        CUDNN_CHECK(cudnnConvolutionBackwardData(h, &kOne, c->w_desc, w, c->y_desc, dy,
                                                 c->bwd_data_desc, c->bwd_data_algo, workspace,
                                                 c->workspace_bytes, &kZero, c->x_desc, dx));
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &kOne, c->x_desc, x, c->y_desc, dy,
                                               c->bwd_filter_desc, c->bwd_filter_algo, workspace,
                                               c->workspace_bytes, &kOne, c->w_desc, dw));
    accumulate_bias_grad(c, h, dy, db);
}
