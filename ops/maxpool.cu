/* Max-pool through cuDNN pooling, in the tensors' own type and layout; the
 * channels-last pools by kernels of their own, 16 bytes a thread: those whose
 * windows do not overlap (k = stride, no padding: the 2x2 stride-2 pools, a
 * global max; cuDNN's NHWC pooling ran at about a third of the copy bandwidth
 * forward on an H100, and its backward at 1.0 ms of airbench's 5.1 ms step
 * for a 1024x64x31x31 map that needs 0.1 ms; for airbench's global pool,
 * 2000x256x3x3, 22 us at 3% of the DRAM bandwidth), and those whose windows
 * overlap or take padding (ResNet-50's 3x3 stride-2 stem pool: cuDNN's
 * backward took 1.47 ms of a 42 ms step at batch 256 on an H100, for 0.6 GB
 * of traffic). Their forward keeps where each maximum was, so that their
 * backward reads dy and a byte an element instead of x, y and dy. */
#include "ops/maxpool.h"

#include <stdint.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* The widest window the kernels take: a byte holds each output's window
 * position, 0..k*k-1 in row-major order, and k*k where every element of the
 * window is NaN (so 4 for 2x2). 0xff is never written. */
constexpr int kMaxWindow = 15;

/* The window's side: K where the launch fixed it (2: the 2x2 pools, 3:
 * airbench's global pool; unrolled), else k. */
template <int K>
static __device__ __forceinline__ int window_side(int k) {
    return K ? K : k;
}

/* Folds v, a vector of channels at window position 'at', into each channel's
 * running maximum best (NaN at first) and its position where (side*side at
 * first): NaN is left out, and a tie keeps the earlier position. */
template <typename T, typename Positions>
static __device__ __forceinline__ void fold_maximum(uint4 v, int at, float *best, Positions &where) {
    constexpr int width = 16 / sizeof(T);
    alignas(16) T e[width];
    *reinterpret_cast<uint4 *>(e) = v;
#pragma unroll
    for (int j = 0; j < width; j++) {
        float f = to_float(e[j]);
        if (f == f && !(f <= best[j])) best[j] = f, where.v[j] = (unsigned char)at;
    }
}

/* What the forward pools: x itself (PRO_NONE), or batch norm's output before
 * it is stored (maxpool_forward_bn_cuda): act(fma(x - mean, scale, shift)),
 * rounded to T, as batchnorm.cu's apply pass writes it. */
enum { PRO_NONE, PRO_AFFINE, PRO_AFFINE_RELU };

/* One thread's channels' coefficients, loaded once for its whole window. */
template <typename T, int PRO>
struct Prologue {
    float mean[PRO ? 16 / sizeof(T) : 1], scale[PRO ? 16 / sizeof(T) : 1], shift[PRO ? 16 / sizeof(T) : 1];
    __device__ __forceinline__ Prologue(const float4 *coef, size_t vector_in_pixel) {
#pragma unroll
        for (int j = 0; j < (PRO ? 16 / (int)sizeof(T) : 0); j++) {
            float4 k = coef[vector_in_pixel * (16 / sizeof(T)) + j];
            mean[j] = k.x, scale[j] = k.y, shift[j] = k.z;
        }
    }
    __device__ __forceinline__ uint4 operator()(uint4 v) const {
        if (PRO == PRO_NONE) return v;
        constexpr int width = 16 / sizeof(T);
        alignas(16) T e[width];
        *reinterpret_cast<uint4 *>(e) = v;
#pragma unroll
        for (int j = 0; j < width; j++) {
            float z = __fmaf_rn(to_float(e[j]) - mean[j], scale[j], shift[j]);
            if (PRO == PRO_AFFINE_RELU) z = z < 0.0f ? 0.0f : z;
            e[j] = from_float<T>(z);
        }
        return *reinterpret_cast<const uint4 *>(e);
    }
};

/* A window's maxima before its first element: NaN, at side*side (every element NaN). */
template <typename T, typename Positions>
static __device__ __forceinline__ void start_maximum(float *best, Positions &where, int side) {
#pragma unroll
    for (int j = 0; j < 16 / (int)sizeof(T); j++) {
        best[j] = __int_as_float(0x7fffffff);
        where.v[j] = (unsigned char)(side * side);
    }
}

/* Output o: the window's maxima, and (indices not NULL) their positions. */
template <typename T, typename Positions>
static __device__ __forceinline__ void store_maximum(uint4 *y, unsigned char *indices, size_t o, const float *best,
                                                     const Positions &where) {
    constexpr int width = 16 / sizeof(T);
    alignas(16) T out[width];
#pragma unroll
    for (int j = 0; j < width; j++) out[j] = from_float<T>(best[j]);
    y[o] = *reinterpret_cast<const uint4 *>(out);
    if (indices) reinterpret_cast<Positions *>(indices)[o] = where;
}

/* y [n][h/k][w/k][c] = the max of each k x k window (stride k) of x
 * [n][h][w][c], one 16-byte vector of channels a thread; vecs: vectors per
 * pixel. NaN is left out of a maximum, as cuDNN's CUDNN_NOT_PROPAGATE_NAN; a
 * window of NaN alone gives NaN. indices (laid out as y, a byte an element;
 * NULL: not kept) get each maximum's first position in row-major order (the
 * CPU reference's and cuDNN's). */
template <typename T, int K, int PRO>
static __global__ void maxpool_nhwc_kernel(const uint4 *x, const float4 *coef, uint4 *y, unsigned char *indices,
                                           int h, int w, int k, int vecs, size_t outputs) {
    constexpr int width = 16 / sizeof(T);
    using Positions = Pack<unsigned char, width>;
    const int side = window_side<K>(k);
    int oh = h / side, ow = w / side;
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < outputs; o += (size_t)gridDim.x * blockDim.x) {
        size_t v = o % vecs, pixel = o / vecs;
        size_t q = pixel % ow, rest = pixel / ow, p = rest % oh, img = rest / oh;
        size_t base = ((img * h + side * p) * w + side * q) * vecs + v, row = (size_t)w * vecs;
        const Prologue<T, PRO> z(coef, v);
        float best[width];
        Positions where;
        start_maximum<T>(best, where, side);
#pragma unroll
        for (int r = 0; r < side; r++)
#pragma unroll
            for (int s = 0; s < side; s++) fold_maximum<T>(z(x[base + r * row + s * vecs]), r * side + s, best, where);
        store_maximum<T>(y, indices, o, best, where);
    }
}

/* dx of the kernel above from the positions its forward kept: one thread per
 * 16-byte vector of channels of a k x k window of x, windows = ceil(h/k) x
 * ceil(w/k) a plane. Each window's output gradient goes to its first maximum,
 * the rest of the window gets 0; the windows are disjoint, so every element
 * of dx is written once. Where h or w is not a multiple of k, the last rows
 * or columns, which no output saw (floor mode), get 0 from windows cut short. */
template <typename T, int K>
static __global__ void maxpool_nhwc_backward_kernel(const uint4 *dy, const unsigned char *indices, uint4 *dx, int h,
                                                    int w, int k, int vecs, size_t windows) {
    constexpr int width = 16 / sizeof(T);
    using Positions = Pack<unsigned char, width>;
    const int side = window_side<K>(k);
    int oh = h / side, ow = w / side, wh = (h + side - 1) / side, ww = (w + side - 1) / side;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < windows; o += (size_t)gridDim.x * blockDim.x) {
        size_t v = o % vecs, window = o / vecs;
        size_t q = window % ww, rest = window / ww, p = rest % wh, img = rest / wh;
        size_t base = ((img * h + side * p) * w + side * q) * vecs + v, row = (size_t)w * vecs;
        if ((int)p >= oh || (int)q >= ow) {
            int rows = min(side, h - side * (int)p), cols = min(side, w - side * (int)q);
            for (int r = 0; r < rows; r++)
                for (int s = 0; s < cols; s++) dx[base + r * row + s * vecs] = zero;
            continue;
        }
        size_t out = ((img * oh + p) * ow + q) * vecs + v;
        alignas(16) T g[width];
        *reinterpret_cast<uint4 *>(g) = dy[out];
        Positions at = reinterpret_cast<const Positions *>(indices)[out];
        const T t_zero = from_float<T>(0.0f);
#pragma unroll
        for (int r = 0; r < side; r++) {
#pragma unroll
            for (int s = 0; s < side; s++) {
                alignas(16) T e[width];
#pragma unroll
                for (int j = 0; j < width; j++) e[j] = at.v[j] == r * side + s ? g[j] : t_zero;
                dx[base + r * row + s * vecs] = *reinterpret_cast<const uint4 *>(e);
            }
        }
    }
}

/* y [n][oh][ow][c] = the max of each k x k window at 'stride' (at most k:
 * windows may overlap) of x [n][h][w][c] padded by 'pad' (never picked), one
 * 16-byte vector of channels a thread; NaN and positions as
 * maxpool_nhwc_kernel's. */
template <typename T, int K, int PRO>
static __global__ void maxpool_nhwc_overlap_kernel(const uint4 *x, const float4 *coef, uint4 *y,
                                                   unsigned char *indices, int h, int w, int k, int stride, int pad,
                                                   int oh, int ow, int vecs, size_t outputs) {
    constexpr int width = 16 / sizeof(T);
    using Positions = Pack<unsigned char, width>;
    const int side = window_side<K>(k);
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < outputs; o += (size_t)gridDim.x * blockDim.x) {
        size_t v = o % vecs, pixel = o / vecs, rest = pixel / ow, img = rest / oh;
        int q = (int)(pixel % ow), p = (int)(rest % oh), i0 = p * stride - pad, j0 = q * stride - pad;
        const Prologue<T, PRO> z(coef, v);
        float best[width];
        Positions where;
        start_maximum<T>(best, where, side);
#pragma unroll
        for (int r = 0; r < side; r++) {
            int i = i0 + r;
            if (i < 0 || i >= h) continue;
#pragma unroll
            for (int c = 0; c < side; c++) {
                int j = j0 + c;
                if (j >= 0 && j < w)
                    fold_maximum<T>(z(x[((img * h + i) * w + j) * vecs + v]), r * side + c, best, where);
            }
        }
        store_maximum<T>(y, indices, o, best, where);
    }
}

/* dx of the kernel above from the positions its forward kept: one thread per
 * 16-byte vector of channels of x, which adds up, in fp32 from 0 and in the
 * outputs' row-major order (the CPU reference's), the gradients of the
 * outputs whose first maximum it is, then rounds once; 0 where there are none
 * (rows and columns no window reached included). */
template <typename T, int K>
static __global__ void maxpool_nhwc_overlap_backward_kernel(const uint4 *dy, const unsigned char *indices, uint4 *dx,
                                                            int h, int w, int k, int stride, int pad, int oh, int ow,
                                                            int vecs, size_t inputs) {
    constexpr int width = 16 / sizeof(T);
    using Positions = Pack<unsigned char, width>;
    const int side = window_side<K>(k);
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < inputs; o += (size_t)gridDim.x * blockDim.x) {
        size_t v = o % vecs, pixel = o / vecs, rest = pixel / w, img = rest / h;
        int j = (int)(pixel % w), i = (int)(rest % h);
        /* the outputs whose window holds (i, j): p * stride - pad <= i < p * stride - pad + side */
        int top = i + pad - side + 1, left = j + pad - side + 1;
        int p0 = top <= 0 ? 0 : (top + stride - 1) / stride, p1 = min(oh - 1, (i + pad) / stride);
        int q0 = left <= 0 ? 0 : (left + stride - 1) / stride, q1 = min(ow - 1, (j + pad) / stride);
        float sum[width];
#pragma unroll
        for (int e = 0; e < width; e++) sum[e] = 0.0f;
        for (int p = p0; p <= p1; p++) {
            for (int q = q0; q <= q1; q++) {
                int at = (i + pad - p * stride) * side + (j + pad - q * stride);
                size_t out = ((img * oh + p) * ow + q) * vecs + v;
                Positions from = reinterpret_cast<const Positions *>(indices)[out];
                alignas(16) T g[width];
                *reinterpret_cast<uint4 *>(g) = dy[out];
#pragma unroll
                for (int e = 0; e < width; e++)
                    if (from.v[e] == at) sum[e] += to_float(g[e]);
            }
        }
        alignas(16) T grad[width];
#pragma unroll
        for (int e = 0; e < width; e++) grad[e] = from_float<T>(sum[e]);
        dx[o] = *reinterpret_cast<const uint4 *>(grad);
    }
}

/* Whether the kernels above take the shape: NHWC, windows of at most
 * kMaxWindow a side at a stride of at most k, whole vectors of channels;
 * windows that do not overlap (k = stride, no padding) through
 * maxpool_nhwc_kernel and its backward, the others through the overlap ones. */
static int nhwc_window_kernels_shape(const Pool2dShape *s, DType dtype, int nhwc) {
    size_t row_bytes = (size_t)s->c * dtype_size(dtype);
    int k = pool2d_window(s);
    return nhwc && pool2d_stride(s) <= k && k <= kMaxWindow && row_bytes % 16 == 0;
}

static int windows_overlap(const Pool2dShape *s) { return pool2d_stride(s) < pool2d_window(s) || s->pad != 0; }

static int aligned16(const void *buf) { return (uintptr_t)buf % 16 == 0; }

/* Whether the kernels run: they take the shape and the buffers are aligned
 * (NULL: not used). Backward gets the forward's x and y, so it falls back to
 * cuDNN (which reads them) wherever the forward did and kept no positions. */
static int nhwc_window_kernels_run(const MaxPoolCuda *p, const void *x, const void *y, const void *dy,
                                   const void *dx) {
    return p->vectorized && aligned16(x) && aligned16(y) && aligned16(dy) && aligned16(dx);
}

/* What a pass takes: forward, x (in) into y (out) through the prologue 'pro'
 * with batch norm's coefficients (PRO_NONE: none); backward, dy into dx. */
typedef struct {
    int backward, pro;
    const void *in;
    const float4 *coef;
    void *out;
} PoolPass;

/* One forward pass of the overlapping windows' kernel. */
template <typename T, int K, int PRO>
static void launch_overlap_forward(const MaxPoolCuda *p, const PoolPass &a, cudaStream_t stream) {
    const Pool2dShape *s = &p->shape;
    int k = pool2d_window(s), stride = pool2d_stride(s), vecs = (int)((size_t)s->c * sizeof(T) / 16);
    int oh = pool2d_out_h(s), ow = pool2d_out_w(s);
    size_t outputs = (size_t)s->n * oh * ow * vecs;
    maxpool_nhwc_overlap_kernel<T, K, PRO><<<elementwise_blocks(outputs), ELEMENTWISE_THREADS, 0, stream>>>(
        (const uint4 *)a.in, a.coef, (uint4 *)a.out, p->indices, s->h, s->w, k, stride, s->pad, oh, ow, vecs, outputs);
}

/* One forward pass of the disjoint windows' kernel. */
template <typename T, int K, int PRO>
static void launch_disjoint_forward(const MaxPoolCuda *p, const PoolPass &a, cudaStream_t stream) {
    const Pool2dShape *s = &p->shape;
    int k = pool2d_window(s), vecs = (int)((size_t)s->c * sizeof(T) / 16);
    size_t outputs = (size_t)s->n * (s->h / k) * (s->w / k) * vecs;
    maxpool_nhwc_kernel<T, K, PRO><<<elementwise_blocks(outputs), ELEMENTWISE_THREADS, 0, stream>>>(
        (const uint4 *)a.in, a.coef, (uint4 *)a.out, p->indices, s->h, s->w, k, vecs, outputs);
}

template <typename T, int K, int PRO>
static void launch_forward(const MaxPoolCuda *p, const PoolPass &a, cudaStream_t stream) {
    if (p->overlap) launch_overlap_forward<T, K, PRO>(p, a, stream);
    else launch_disjoint_forward<T, K, PRO>(p, a, stream);
}

template <typename T, int K>
static void launch_backward(const MaxPoolCuda *p, const PoolPass &a, cudaStream_t stream) {
    const Pool2dShape *s = &p->shape;
    int k = pool2d_window(s), stride = pool2d_stride(s), vecs = (int)((size_t)s->c * sizeof(T) / 16);
    if (p->overlap) {
        int oh = pool2d_out_h(s), ow = pool2d_out_w(s);
        size_t inputs = (size_t)s->n * s->h * s->w * vecs;
        maxpool_nhwc_overlap_backward_kernel<T, K><<<elementwise_blocks(inputs), ELEMENTWISE_THREADS, 0, stream>>>(
            (const uint4 *)a.in, p->indices, (uint4 *)a.out, s->h, s->w, k, stride, s->pad, oh, ow, vecs, inputs);
    } else {
        size_t windows = (size_t)s->n * ((s->h + k - 1) / k) * ((s->w + k - 1) / k) * vecs;
        maxpool_nhwc_backward_kernel<T, K><<<elementwise_blocks(windows), ELEMENTWISE_THREADS, 0, stream>>>(
            (const uint4 *)a.in, p->indices, (uint4 *)a.out, s->h, s->w, k, vecs, windows);
    }
}

/* One pass of the kernels; k fixed at compile time for 2 and 3. */
template <typename T, int K>
static void launch_pass(const MaxPoolCuda *p, const PoolPass &a, cudaStream_t stream) {
    if (a.backward) launch_backward<T, K>(p, a, stream);
    else if (a.pro == PRO_AFFINE_RELU) launch_forward<T, K, PRO_AFFINE_RELU>(p, a, stream);
    else if (a.pro == PRO_AFFINE) launch_forward<T, K, PRO_AFFINE>(p, a, stream);
    else launch_forward<T, K, PRO_NONE>(p, a, stream);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_window(const MaxPoolCuda *p, const PoolPass &a, cudaStream_t stream) {
    switch (pool2d_window(&p->shape)) {
    case 2: launch_pass<T, 2>(p, a, stream); break;
    case 3: launch_pass<T, 3>(p, a, stream); break;
    default: launch_pass<T, 0>(p, a, stream); break;
    }
}

static void launch_kernels(const MaxPoolCuda *p, const PoolPass &a, cudaStream_t stream) {
    switch (p->dtype) {
    case DTYPE_F16: launch_window<__half>(p, a, stream); break;
    case DTYPE_BF16: launch_window<__nv_bfloat16>(p, a, stream); break;
    default: launch_window<float>(p, a, stream); break;
    }
}

static cudaStream_t handle_stream(cudnnHandle_t h) {
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    return stream;
}

static const float kOne = 1.0f, kZero = 0.0f;

size_t maxpool_cuda_index_bytes(const Pool2dShape *s, DType dtype, int nhwc) {
    return nhwc_window_kernels_shape(s, dtype, nhwc) ? (size_t)s->n * pool2d_out_h(s) * pool2d_out_w(s) * s->c : 0;
}

void maxpool_cuda_init(MaxPoolCuda *p, const Pool2dShape *s, DType dtype, int nhwc, void *indices) {
    memset(p, 0, sizeof *p);
    check_float_dtype("maxpool", dtype);
    int k = pool2d_window(s), stride = pool2d_stride(s);
    if (s->n <= 0 || s->c <= 0 || s->h < 2 || s->w < 2 ||
        s->pad < 0 || s->pad >= k || pool2d_out_h(s) < 1 || pool2d_out_w(s) < 1)
        TC_FATAL("maxpool: bad shape n=%d c=%d h=%d w=%d window %d stride %d pad %d", s->n, s->c,
                 s->h, s->w, k, stride, s->pad);
    if (!aligned16(indices)) TC_FATAL("maxpool: the index scratch must be 16-byte aligned");
    p->shape = *s;
    p->dtype = dtype;
    p->nhwc = nhwc != 0;
    p->vectorized = nhwc_window_kernels_shape(s, dtype, p->nhwc);
    p->overlap = p->vectorized && windows_overlap(s);
    p->indices = p->vectorized ? (unsigned char *)indices : NULL;
    cudnnDataType_t data_type = dtype_cudnn(dtype);
    cudnnTensorFormat_t format = p->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    CUDNN_CHECK(cudnnCreatePoolingDescriptor(&p->pool_desc));
    CUDNN_CHECK(cudnnSetPooling2dDescriptor(p->pool_desc, CUDNN_POOLING_MAX,
                                            CUDNN_NOT_PROPAGATE_NAN, k, k, s->pad, s->pad, stride,
                                            stride));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y_desc));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x_desc, format, data_type, s->n, s->c, s->h, s->w));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y_desc, format, data_type, s->n, s->c, pool2d_out_h(s),
                                           pool2d_out_w(s)));
}

void maxpool_cuda_destroy(MaxPoolCuda *p) {
    if (p->y_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(p->y_desc));
    if (p->x_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(p->x_desc));
    if (p->pool_desc) CUDNN_CHECK(cudnnDestroyPoolingDescriptor(p->pool_desc));
    memset(p, 0, sizeof *p);
}

void maxpool_forward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x, void *y) {
    if (nhwc_window_kernels_run(p, x, y, NULL, NULL))
        launch_kernels(p, PoolPass{0, PRO_NONE, x, NULL, y}, handle_stream(h));
    else CUDNN_CHECK(cudnnPoolingForward(h, p->pool_desc, &kOne, p->x_desc, x, &kZero, p->y_desc, y));
}

void maxpool_backward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x, const void *y, const void *dy,
                           void *dx) {
    if (p->vectorized && !p->indices)
        TC_FATAL("maxpool: backward of a forward-only max-pool (initialised without its index scratch)");
    if (nhwc_window_kernels_run(p, x, y, dy, dx))
        launch_kernels(p, PoolPass{1, PRO_NONE, dy, NULL, dx}, handle_stream(h));
    else
        CUDNN_CHECK(cudnnPoolingBackward(h, p->pool_desc, &kOne, p->y_desc, y, p->y_desc, dy, p->x_desc, x, &kZero,
                                         p->x_desc, dx));
}

void maxpool_forward_bn_cuda(const MaxPoolCuda *p, const void *x, const float *coef, int relu, void *y,
                             cudaStream_t stream) {
    if (!p->vectorized || !nhwc_window_kernels_run(p, x, y, NULL, NULL))
        TC_FATAL("maxpool: batch norm's pass in the pool needs the channels-last kernels and 16-byte aligned tensors "
                 "(%dx%dx%dx%d, window %d)", p->shape.n, p->shape.c, p->shape.h, p->shape.w, pool2d_window(&p->shape));
    PoolPass a = {0, relu ? PRO_AFFINE_RELU : PRO_AFFINE, x, (const float4 *)coef, y};
    launch_kernels(p, a, stream);
}
