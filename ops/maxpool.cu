/* Max-pool through cuDNN pooling, in the tensors' own type and layout; the
 * common channels-last 2x2 stride-2 window by kernels of their own, 16 bytes
 * a thread (cuDNN's NHWC pooling ran at about a third of the copy bandwidth
 * forward on an H100, and its backward at 1.0 ms of airbench's 5.1 ms step
 * for a 1024x64x31x31 map that needs 0.1 ms). Their forward keeps where each
 * maximum was, so that their backward reads dy and a byte an element instead
 * of x, y and dy. */
#include "ops/maxpool.h"

#include <stdint.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* Where in a 2x2 window (row-major: 0 1 / 2 3) its first element equal to
 * the window's maximum m lies; kNoMaximum where none is (every element NaN). */
constexpr unsigned char kNoMaximum = 4;

static __device__ __forceinline__ unsigned char first_maximum(float a, float b, float c, float d, float m) {
    return a == m ? 0 : b == m ? 1 : c == m ? 2 : d == m ? 3 : kNoMaximum;
}

/* y [n][h/2][w/2][c] = the max of each 2x2 window of x [n][h][w][c], one
 * 16-byte vector of channels a thread; vecs: vectors per pixel. fmaxf leaves
 * a NaN out, as cuDNN's CUDNN_NOT_PROPAGATE_NAN. indices (laid out as y, a
 * byte an element; NULL: not kept) get each maximum's first position. */
template <typename T>
static __global__ void maxpool2x2_nhwc_kernel(const uint4 *x, uint4 *y, unsigned char *indices, int h, int w,
                                              int vecs, size_t outputs) {
    constexpr int width = 16 / sizeof(T);
    using Positions = Pack<unsigned char, width>;
    int oh = h / 2, ow = w / 2;
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < outputs; o += (size_t)gridDim.x * blockDim.x) {
        size_t v = o % vecs, pixel = o / vecs;
        size_t q = pixel % ow, rest = pixel / ow, p = rest % oh, img = rest / oh;
        size_t base = ((img * h + 2 * p) * w + 2 * q) * vecs + v, row = (size_t)w * vecs;
        alignas(16) T a[width], b[width], c[width], d[width];
        *reinterpret_cast<uint4 *>(a) = x[base];
        *reinterpret_cast<uint4 *>(b) = x[base + vecs];
        *reinterpret_cast<uint4 *>(c) = x[base + row];
        *reinterpret_cast<uint4 *>(d) = x[base + row + vecs];
        Positions at;
#pragma unroll
        for (int j = 0; j < width; j++) {
            float fa = to_float(a[j]), fb = to_float(b[j]), fc = to_float(c[j]), fd = to_float(d[j]);
            float m = fmaxf(fmaxf(fa, fb), fmaxf(fc, fd));
            at.v[j] = first_maximum(fa, fb, fc, fd, m);
            a[j] = from_float<T>(m);
        }
        y[o] = *reinterpret_cast<const uint4 *>(a);
        if (indices) reinterpret_cast<Positions *>(indices)[o] = at;
    }
}

/* dx of the kernel above from the positions its forward kept: one thread per
 * 16-byte vector of channels of a 2x2 window of x, windows = ceil(h/2) x
 * ceil(w/2) a plane. Each window's output gradient goes to its first maximum
 * in row-major order (cuDNN's choice and the CPU reference's), the rest of
 * the window gets 0; the windows are disjoint, so every element of dx is
 * written once. An odd h or w leaves a last row or column that no output saw
 * (floor mode): its windows write 0. */
template <typename T>
static __global__ void maxpool2x2_nhwc_backward_kernel(const uint4 *dy, const unsigned char *indices, uint4 *dx,
                                                       int h, int w, int vecs, size_t windows) {
    constexpr int width = 16 / sizeof(T);
    using Positions = Pack<unsigned char, width>;
    int oh = h / 2, ow = w / 2, wh = (h + 1) / 2, ww = (w + 1) / 2;
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < windows; o += (size_t)gridDim.x * blockDim.x) {
        size_t v = o % vecs, window = o / vecs;
        size_t q = window % ww, rest = window / ww, p = rest % wh, img = rest / wh;
        size_t base = ((img * h + 2 * p) * w + 2 * q) * vecs + v, row = (size_t)w * vecs;
        if ((int)p >= oh || (int)q >= ow) {
            const uint4 zero = make_uint4(0, 0, 0, 0);
            dx[base] = zero;
            if (2 * (int)q + 1 < w) dx[base + vecs] = zero;
            if (2 * (int)p + 1 < h) dx[base + row] = zero;
            continue;
        }
        size_t out = ((img * oh + p) * ow + q) * vecs + v;
        alignas(16) T a[width], b[width], c[width], d[width], g[width];
        *reinterpret_cast<uint4 *>(g) = dy[out];
        Positions at = reinterpret_cast<const Positions *>(indices)[out];
        const T zero = from_float<T>(0.0f);
#pragma unroll
        for (int j = 0; j < width; j++) {
            a[j] = at.v[j] == 0 ? g[j] : zero;
            b[j] = at.v[j] == 1 ? g[j] : zero;
            c[j] = at.v[j] == 2 ? g[j] : zero;
            d[j] = at.v[j] == 3 ? g[j] : zero;
        }
        dx[base] = *reinterpret_cast<const uint4 *>(a);
        dx[base + vecs] = *reinterpret_cast<const uint4 *>(b);
        dx[base + row] = *reinterpret_cast<const uint4 *>(c);
        dx[base + row + vecs] = *reinterpret_cast<const uint4 *>(d);
    }
}

/* Whether the kernels above take the shape: NHWC, a 2x2 stride-2 window,
 * whole vectors of channels. */
static int nhwc_2x2_shape(const Pool2dShape *s, DType dtype, int nhwc) {
    size_t row_bytes = (size_t)s->c * dtype_size(dtype);
    return nhwc && pool2d_window(s) == 2 && pool2d_stride(s) == 2 && s->pad == 0 && row_bytes % 16 == 0;
}

static int aligned16(const void *buf) { return (uintptr_t)buf % 16 == 0; }

/* Whether the kernels run: they take the shape and the buffers are aligned
 * (NULL: not used). Backward gets the forward's x and y, so it falls back to
 * cuDNN (which reads them) wherever the forward did and kept no positions. */
static int nhwc_2x2_vectorizable(const MaxPoolCuda *p, const void *x, const void *y, const void *dy,
                                 const void *dx) {
    return p->vectorized && aligned16(x) && aligned16(y) && aligned16(dy) && aligned16(dx);
}

template <typename T>
static void launch_maxpool2x2_nhwc(const MaxPoolCuda *p, const void *x, void *y, cudaStream_t stream) {
    const Pool2dShape *s = &p->shape;
    int vecs = (int)((size_t)s->c * sizeof(T) / 16);
    size_t outputs = (size_t)s->n * (s->h / 2) * (s->w / 2) * vecs;
    maxpool2x2_nhwc_kernel<T><<<elementwise_blocks(outputs), ELEMENTWISE_THREADS, 0, stream>>>(
        (const uint4 *)x, (uint4 *)y, p->indices, s->h, s->w, vecs, outputs);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_maxpool2x2_nhwc_backward(const MaxPoolCuda *p, const void *dy, void *dx, cudaStream_t stream) {
    const Pool2dShape *s = &p->shape;
    int vecs = (int)((size_t)s->c * sizeof(T) / 16);
    size_t windows = (size_t)s->n * ((s->h + 1) / 2) * ((s->w + 1) / 2) * vecs;
    maxpool2x2_nhwc_backward_kernel<T><<<elementwise_blocks(windows), ELEMENTWISE_THREADS, 0, stream>>>(
        (const uint4 *)dy, p->indices, (uint4 *)dx, s->h, s->w, vecs, windows);
    CUDA_CHECK_LAUNCH();
}

static const float kOne = 1.0f, kZero = 0.0f;

size_t maxpool2x2_cuda_index_bytes(const Pool2dShape *s, DType dtype, int nhwc) {
    return nhwc_2x2_shape(s, dtype, nhwc) ? (size_t)s->n * pool2d_out_h(s) * pool2d_out_w(s) * s->c : 0;
}

void maxpool2x2_cuda_init(MaxPoolCuda *p, const Pool2dShape *s, DType dtype, int nhwc, void *indices) {
    memset(p, 0, sizeof *p);
    check_float_dtype("maxpool2x2", dtype);
    int k = pool2d_window(s), stride = pool2d_stride(s);
    if (s->n <= 0 || s->c <= 0 || s->h < 2 || s->w < 2 ||
        s->pad < 0 || s->pad >= k || pool2d_out_h(s) < 1 || pool2d_out_w(s) < 1)
        TC_FATAL("maxpool: bad shape n=%d c=%d h=%d w=%d window %d stride %d pad %d", s->n, s->c,
                 s->h, s->w, k, stride, s->pad);
    if (!aligned16(indices)) TC_FATAL("maxpool: the index scratch must be 16-byte aligned");
    p->shape = *s;
    p->dtype = dtype;
    p->nhwc = nhwc != 0;
    p->vectorized = nhwc_2x2_shape(s, dtype, p->nhwc);
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

void maxpool2x2_cuda_destroy(MaxPoolCuda *p) {
    if (p->y_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(p->y_desc));
    if (p->x_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(p->x_desc));
    if (p->pool_desc) CUDNN_CHECK(cudnnDestroyPoolingDescriptor(p->pool_desc));
    memset(p, 0, sizeof *p);
}

void maxpool2x2_forward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x, void *y) {
    if (!nhwc_2x2_vectorizable(p, x, y, NULL, NULL)) {
        CUDNN_CHECK(cudnnPoolingForward(h, p->pool_desc, &kOne, p->x_desc, x, &kZero, p->y_desc, y));
        return;
    }
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    switch (p->dtype) {
    case DTYPE_F16: launch_maxpool2x2_nhwc<__half>(p, x, y, stream); break;
    case DTYPE_BF16: launch_maxpool2x2_nhwc<__nv_bfloat16>(p, x, y, stream); break;
    default: launch_maxpool2x2_nhwc<float>(p, x, y, stream); break;
    }
}

void maxpool2x2_backward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x,
                              const void *y, const void *dy, void *dx) {
    if (p->vectorized && !p->indices)
        TC_FATAL("maxpool: backward of a forward-only max-pool (initialised without its index scratch)");
    if (!nhwc_2x2_vectorizable(p, x, y, dy, dx)) {
        CUDNN_CHECK(cudnnPoolingBackward(h, p->pool_desc, &kOne, p->y_desc, y, p->y_desc, dy,
                                         p->x_desc, x, &kZero, p->x_desc, dx));
        return;
    }
    cudaStream_t stream;
    CUDNN_CHECK(cudnnGetStream(h, &stream));
    switch (p->dtype) {
    case DTYPE_F16: launch_maxpool2x2_nhwc_backward<__half>(p, dy, dx, stream); break;
    case DTYPE_BF16: launch_maxpool2x2_nhwc_backward<__nv_bfloat16>(p, dy, dx, stream); break;
    default: launch_maxpool2x2_nhwc_backward<float>(p, dy, dx, stream); break;
    }
}
