/* Global average pooling on the GPU. Forward NCHW: a warp per (image, channel)
 * row, lanes striding over the plane, then a fixed-order shuffle tree; NHWC: a
 * thread per (image, channel), walking the plane's pixels (consecutive threads
 * read consecutive channels). Backward is elementwise over dx, 16 bytes a
 * thread where a vector stays inside one (image, channel) in NCHW, or inside
 * one pixel's channels in NHWC. */
#include "ops/avgpool.h"

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

template <typename T, int N>
struct alignas(sizeof(T) * N) PoolPack {
    T v[N];
};

template <typename T>
static __global__ void avgpool_forward_nchw_kernel(const T *x, T *y, size_t rows, int plane) {
    int lane = threadIdx.x % 32;
    size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    for (size_t r = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
        const T *xr = x + r * plane;
        float sum = 0.0f;
        for (int p = lane; p < plane; p += 32) sum += to_float(xr[p]);
        for (int offset = 16; offset > 0; offset /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (lane == 0) y[r] = from_float<T>(sum / (float)plane);
    }
}

template <typename T>
static __global__ void avgpool_forward_nhwc_kernel(const T *x, T *y, int n, int c, int plane) {
    size_t total = (size_t)n * c;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t image = i / c, ch = i % c;
        const T *xp = x + image * plane * c + ch;
        float sum = 0.0f;
        for (int p = 0; p < plane; p++) sum += to_float(xp[(size_t)p * c]);
        y[i] = from_float<T>(sum / (float)plane);
    }
}

/* dx vector i = elements [i*VEC, i*VEC + VEC), which share one dy value in NCHW
 * and are VEC consecutive channels of one pixel in NHWC. */
template <typename T, int VEC, bool NHWC>
static __global__ void avgpool_backward_kernel(const T *dy, T *dx, size_t vectors, int c,
                                               int plane, int accumulate) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < vectors;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t first = i * VEC;
        PoolPack<T, VEC> out;
        if (accumulate) out = reinterpret_cast<const PoolPack<T, VEC> *>(dx)[i];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            size_t row = NHWC ? first / ((size_t)plane * c) * c + (first + e) % c : first / plane;
            float g = to_float(dy[row]) / (float)plane;
            out.v[e] = from_float<T>(accumulate ? to_float(out.v[e]) + g : g);
        }
        reinterpret_cast<PoolPack<T, VEC> *>(dx)[i] = out;
    }
}

static void check_shape(int n, int c, int plane) {
    if (n < 0 || c <= 0 || plane <= 0) TC_FATAL("avgpool: bad shape n=%d c=%d plane=%d", n, c, plane);
}

template <typename T>
static void launch_forward(int nhwc, int n, int c, int plane, const void *x, void *y,
                           cudaStream_t stream) {
    size_t rows = (size_t)n * c;
    if (nhwc) {
        avgpool_forward_nhwc_kernel<T><<<elementwise_blocks(rows), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (T *)y, n, c, plane);
    } else {
        size_t threads = rows * 32;
        avgpool_forward_nchw_kernel<T><<<elementwise_blocks(threads), ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (T *)y, rows, plane);
    }
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_backward(int nhwc, int n, int c, int plane, const void *dy, void *dx,
                            int accumulate, cudaStream_t stream) {
    constexpr int WIDE = 16 / sizeof(T);
    size_t total = (size_t)n * c * plane;
    size_t run = nhwc ? (size_t)c : (size_t)plane; /* elements a vector must not cross */
    bool wide = (uintptr_t)dx % 16 == 0 && run % WIDE == 0;
    size_t vectors = wide ? total / WIDE : total;
    unsigned blocks = elementwise_blocks(vectors);
    if (nhwc && wide)
        avgpool_backward_kernel<T, WIDE, true><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)dy, (T *)dx, vectors, c, plane, accumulate);
    else if (nhwc)
        avgpool_backward_kernel<T, 1, true><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)dy, (T *)dx, vectors, c, plane, accumulate);
    else if (wide)
        avgpool_backward_kernel<T, WIDE, false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)dy, (T *)dx, vectors, c, plane, accumulate);
    else
        avgpool_backward_kernel<T, 1, false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)dy, (T *)dx, vectors, c, plane, accumulate);
    CUDA_CHECK_LAUNCH();
}

void avgpool_forward_cuda(DType dtype, int nhwc, const void *x, void *y, int n, int c, int plane,
                          cudaStream_t stream) {
    check_float_dtype("avgpool", dtype);
    check_shape(n, c, plane);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_forward, nhwc, n, c, plane, x, y, stream);
}

void avgpool_backward_cuda(DType dtype, int nhwc, const void *dy, void *dx, int accumulate_dx, int n,
                           int c, int plane, cudaStream_t stream) {
    check_float_dtype("avgpool", dtype);
    check_shape(n, c, plane);
    if (n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_backward, nhwc, n, c, plane, dy, dx, accumulate_dx != 0, stream);
}

/* ---- windowed (avgpool2d): one output a thread forward, one input element a thread backward (no atomics: each
 * element's gradient gathered from the outputs whose window holds it, in row-major order) ---- */

typedef struct {
    int c, h, w, k, stride, pad, oh, ow;
} Window;

/* Element (image, channel, row, column)'s offset in a [n][c][rows][cols] tensor, or [n][rows][cols][c]. */
template <bool NHWC>
static __device__ __forceinline__ size_t offset_of(size_t img, int ch, int i, int j, int c, int rows, int cols) {
    return NHWC ? ((img * rows + i) * cols + j) * c + ch : ((img * c + ch) * rows + i) * (size_t)cols + j;
}

/* Element e of such a tensor: its image, channel, row and column. */
template <bool NHWC>
static __device__ __forceinline__ void place_of(size_t e, int c, int rows, int cols, size_t *img, int *ch, int *i,
                                                int *j) {
    if (NHWC) {
        *ch = (int)(e % c), e /= c;
        *j = (int)(e % cols), e /= cols;
        *i = (int)(e % rows), *img = e / rows;
    } else {
        *j = (int)(e % cols), e /= cols;
        *i = (int)(e % rows), e /= rows;
        *ch = (int)(e % c), *img = e / c;
    }
}

template <typename T, bool NHWC>
static __global__ void avgpool2d_forward_kernel(const T *x, T *y, size_t outputs, Window g) {
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < outputs; o += (size_t)gridDim.x * blockDim.x) {
        size_t img;
        int ch, p, q;
        place_of<NHWC>(o, g.c, g.oh, g.ow, &img, &ch, &p, &q);
        float sum = 0.0f;
        for (int i = p * g.stride - g.pad; i < p * g.stride - g.pad + g.k; i++)
            for (int j = q * g.stride - g.pad; j < q * g.stride - g.pad + g.k; j++)
                if (i >= 0 && i < g.h && j >= 0 && j < g.w)
                    sum += to_float(x[offset_of<NHWC>(img, ch, i, j, g.c, g.h, g.w)]);
        y[o] = from_float<T>(sum / (float)(g.k * g.k));
    }
}

/* The outputs whose window holds row (or column) i: [first, last]. */
static __device__ __forceinline__ void covering(int i, int pad, int k, int stride, int out, int *first, int *last) {
    int top = i + pad - k + 1;
    *first = top <= 0 ? 0 : (top + stride - 1) / stride;
    *last = min(out - 1, (i + pad) / stride);
}

template <typename T, bool NHWC>
static __global__ void avgpool2d_backward_kernel(const T *dy, T *dx, size_t inputs, Window g, int accumulate) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < inputs; e += (size_t)gridDim.x * blockDim.x) {
        size_t img;
        int ch, i, j, p0, p1, q0, q1;
        place_of<NHWC>(e, g.c, g.h, g.w, &img, &ch, &i, &j);
        covering(i, g.pad, g.k, g.stride, g.oh, &p0, &p1);
        covering(j, g.pad, g.k, g.stride, g.ow, &q0, &q1);
        float sum = 0.0f;
        for (int p = p0; p <= p1; p++)
            for (int q = q0; q <= q1; q++) sum += to_float(dy[offset_of<NHWC>(img, ch, p, q, g.c, g.oh, g.ow)]);
        float v = sum / (float)(g.k * g.k);
        dx[e] = from_float<T>(accumulate ? to_float(dx[e]) + v : v);
    }
}

static Window window_of(const Pool2dShape *s) {
    return Window{s->c, s->h, s->w, pool2d_window(s), pool2d_stride(s), s->pad, pool2d_out_h(s), pool2d_out_w(s)};
}

template <typename T>
static void launch_window(int nhwc, const Pool2dShape *s, const void *in, void *out, int backward, int accumulate,
                          cudaStream_t stream) {
    Window g = window_of(s);
    size_t count = (size_t)s->n * s->c * (backward ? (size_t)g.h * g.w : (size_t)g.oh * g.ow);
    unsigned blocks = elementwise_blocks(count);
    if (backward && nhwc)
        avgpool2d_backward_kernel<T, true><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)in, (T *)out, count, g, accumulate);
    else if (backward)
        avgpool2d_backward_kernel<T, false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)in, (T *)out, count, g, accumulate);
    else if (nhwc)
        avgpool2d_forward_kernel<T, true><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)in, (T *)out, count, g);
    else
        avgpool2d_forward_kernel<T, false><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)in, (T *)out, count, g);
    CUDA_CHECK_LAUNCH();
}

void avgpool2d_forward_cuda(DType dtype, int nhwc, const Pool2dShape *s, const void *x, void *y, cudaStream_t stream) {
    check_float_dtype("avgpool", dtype);
    avgpool2d_check(s);
    if (s->n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_window, nhwc, s, x, y, 0, 0, stream);
}

void avgpool2d_backward_cuda(DType dtype, int nhwc, const Pool2dShape *s, const void *dy, void *dx, int accumulate_dx,
                             cudaStream_t stream) {
    check_float_dtype("avgpool", dtype);
    avgpool2d_check(s);
    if (s->n == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_window, nhwc, s, dy, dx, 1, accumulate_dx != 0, stream);
}
