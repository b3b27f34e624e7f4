#include "ops/conv_bias_gelu.h"
#include "ops/gelu_math.h"

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

#define THREADS CONV_BIAS_GELU_THREADS
/* The window kernels' grid: enough blocks to fill an H100 a few times; each stages the weights once. */
#define WINDOW_MAX_BLOCKS 2048
/* Dynamic shared memory a launch may take without opting in. */
#define SHARED_LIMIT (48 << 10)

/* The sizes the kernels index by; p, q the output's height and width, cr the real channels. */
struct Dims {
    int n, c, h, w, k, r, s, p, q, cr;
    int nhwc;
};

static Dims dims_of(const ConvBiasGeluShape *cs, int nhwc) {
    const Conv2dShape *s = &cs->conv;
    return Dims{s->n, s->c, s->h, s->w, s->k, s->r, s->s, conv2d_out_h(s), conv2d_out_w(s), cs->c_real, nhwc != 0};
}

static __host__ __device__ size_t pixels_of(const Dims &d) { return (size_t)d.n * d.p * d.q; }

/* Element (n, c, y, x) of an image tensor of 'channels' x height x width in the layout. */
static __device__ size_t image_at(const Dims &d, int channels, int height, int width, size_t n, int c, int y,
                                  int x) {
    return d.nhwc ? ((n * height + y) * width + x) * channels + c : ((n * channels + c) * height + y) * width + x;
}

static __device__ size_t filter_at(const Dims &d, int k, int c, int r, int s) {
    return d.nhwc ? (((size_t)k * d.r + r) * d.s + s) * d.c + c : (((size_t)k * d.c + c) * d.r + r) * d.s + s;
}

/* ---- the partial sums of the bias gradient ---- */

/* Each warp adds up channels warp, warp + warps, ...: each lane a fixed share of the threads' sums
 * [k][THREADS], then a fixed shuffle tree. */
static __device__ void write_partials(const float *sums, float *row, int k) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int f = warp; f < k; f += THREADS / 32) {
        float v = 0.0f;
        for (int t = lane; t < THREADS; t += 32) v += sums[f * THREADS + t];
        for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
        if (lane == 0) row[f] = v;
    }
}

/* ---- the plain kernels: any shape and layout, everything from global memory ---- */

/* z of output (n, k, p, q). */
template <typename T>
static __device__ float plain_z(const T *x, const T *w, const T *b, const Dims &d, size_t n, int k, int p, int q) {
    float z = 0.0f;
    for (int c = 0; c < d.cr; c++)
        for (int r = 0; r < d.r; r++)
            for (int s = 0; s < d.s; s++)
                z = fmaf(to_float(x[image_at(d, d.c, d.h, d.w, n, c, p + r, q + s)]), to_float(w[filter_at(d, k, c, r, s)]), z);
    return z + to_float(b[k]);
}

/* One thread per element of y, in y's order. */
template <typename T>
static __global__ void __launch_bounds__(THREADS) plain_forward(const T *x, const T *w, const T *b, T *y, Dims d) {
    size_t count = pixels_of(d) * d.k;
    for (size_t i = blockIdx.x * (size_t)THREADS + threadIdx.x; i < count; i += (size_t)gridDim.x * THREADS) {
        int k, p, q;
        size_t n;
        if (d.nhwc) {
            size_t pix = i / d.k;
            k = (int)(i % d.k), q = (int)(pix % d.q), p = (int)(pix / d.q % d.p), n = pix / d.q / d.p;
        } else {
            q = (int)(i % d.q), p = (int)(i / d.q % d.p), k = (int)(i / d.q / d.p % d.k), n = i / d.q / d.p / d.k;
        }
        y[i] = from_float<T>(gelu_value_f(plain_z(x, w, b, d, n, k, p, q)));
    }
}

/* Block (row, k): channel k over every gridDim.x-th pixel from the row's, into partials[row][k]. */
template <typename T>
static __global__ void __launch_bounds__(THREADS)
plain_backward(const T *x, const T *w, const T *b, const T *dy, float *partials, Dims d) {
    int k = blockIdx.y;
    size_t pixels = pixels_of(d);
    float sum = 0.0f;
    for (size_t pix = blockIdx.x * (size_t)THREADS + threadIdx.x; pix < pixels; pix += (size_t)gridDim.x * THREADS) {
        int q = (int)(pix % d.q), p = (int)(pix / d.q % d.p);
        size_t n = pix / d.q / d.p;
        float z = plain_z(x, w, b, d, n, k, p, q);
        sum += to_float(dy[image_at(d, d.k, d.p, d.q, n, k, p, q)]) * gelu_grad_f(z);
    }
    __shared__ float sums[THREADS];
    sums[threadIdx.x] = sum;
    __syncthreads();
    write_partials(sums, partials + (size_t)blockIdx.x * d.k + k, 1); /* the one channel's */
}

/* ---- the window kernels: NHWC, C channels (CR of them real) in whole 16-byte packs, k in whole packs; one
 * thread per output pixel reads its R x S window once and handles every channel of it ---- */

/* Every block's copy of the weights [k][r][s] over the CR real channels and of the bias [k], in fp32. */
template <typename T, int C, int CR>
static __device__ void stage_weights(const T *w, const T *b, float *ws, float *bs, int k, int rs) {
    for (int i = threadIdx.x; i < k * rs * CR; i += THREADS) ws[i] = to_float(w[i / CR * C + i % CR]);
    for (int i = threadIdx.x; i < k; i += THREADS) bs[i] = to_float(b[i]);
    __syncthreads();
}

/* The window of output pixel pix as floats, [r][s][c] over the real channels (the staged filters' order). */
template <typename T, int R, int S, int C, int CR>
static __device__ void load_window(const T *x, const Dims &d, size_t pix, float (&win)[R * S * CR]) {
    constexpr int V = 16 / sizeof(T);
    int q = (int)(pix % d.q), p = (int)(pix / d.q % d.p);
    size_t n = pix / d.q / d.p;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int s = 0; s < S; s++) {
            const Pack<T, V> *px = (const Pack<T, V> *)(x + image_at(d, C, d.h, d.w, n, 0, p + r, q + s));
#pragma unroll
            for (int j = 0; j < C / V; j++) {
                Pack<T, V> v = px[j];
#pragma unroll
                for (int e = 0; e < V; e++)
                    if (j * V + e < CR) win[(r * S + s) * CR + j * V + e] = to_float(v.v[e]);
            }
        }
}

/* The filter read 16 bytes at a time (a broadcast: every thread reads the same one). */
template <int TAPS>
static __device__ float window_z(const float (&win)[TAPS], const float *filter, float bias) {
    static_assert(TAPS % 4 == 0, "window kernels read filters as float4");
    const float4 *f4 = reinterpret_cast<const float4 *>(filter);
    float z = 0.0f;
#pragma unroll
    for (int i = 0; i < TAPS / 4; i++) {
        float4 v = f4[i];
        z = fmaf(win[4 * i], v.x, z);
        z = fmaf(win[4 * i + 1], v.y, z);
        z = fmaf(win[4 * i + 2], v.z, z);
        z = fmaf(win[4 * i + 3], v.w, z);
    }
    return z + bias;
}

template <typename T, int R, int S, int C, int CR>
static __global__ void __launch_bounds__(THREADS) window_forward(const T *x, const T *w, const T *b, T *y, Dims d) {
    constexpr int TAPS = R * S * CR, V = 16 / sizeof(T);
    extern __shared__ float4 smem4[]; /* 16-byte aligned: whole filters of TAPS floats read as float4 */
    float *ws = reinterpret_cast<float *>(smem4), *bs = ws + (size_t)d.k * TAPS;
    stage_weights<T, C, CR>(w, b, ws, bs, d.k, R * S);
    size_t pixels = pixels_of(d);
    for (size_t pix = blockIdx.x * (size_t)THREADS + threadIdx.x; pix < pixels; pix += (size_t)gridDim.x * THREADS) {
        float win[TAPS];
        load_window<T, R, S, C, CR>(x, d, pix, win);
        Pack<T, V> *out = (Pack<T, V> *)(y + pix * d.k);
        for (int j = 0; j < d.k / V; j++) {
            Pack<T, V> o;
#pragma unroll
            for (int e = 0; e < V; e++) {
                int f = j * V + e;
                o.v[e] = from_float<T>(gelu_value_f(window_z<TAPS>(win, ws + f * TAPS, bs[f])));
            }
            out[j] = o;
        }
    }
}

/* Each thread keeps its own sums per channel (a column of sums, [k][THREADS] in shared memory) over every
 * gridDim.x-th pixel from its own; the block's partials[row][k] are their totals. */
template <typename T, int R, int S, int C, int CR>
static __global__ void __launch_bounds__(THREADS)
window_backward(const T *x, const T *w, const T *b, const T *dy, float *partials, Dims d) {
    constexpr int TAPS = R * S * CR, V = 16 / sizeof(T);
    extern __shared__ float4 smem4[];
    float *ws = reinterpret_cast<float *>(smem4), *bs = ws + (size_t)d.k * TAPS, *sums = bs + d.k;
    for (int f = 0; f < d.k; f++) sums[f * THREADS + threadIdx.x] = 0.0f;
    stage_weights<T, C, CR>(w, b, ws, bs, d.k, R * S);
    size_t pixels = pixels_of(d);
    for (size_t pix = blockIdx.x * (size_t)THREADS + threadIdx.x; pix < pixels; pix += (size_t)gridDim.x * THREADS) {
        float win[TAPS];
        load_window<T, R, S, C, CR>(x, d, pix, win);
        const Pack<T, V> *g = (const Pack<T, V> *)(dy + pix * d.k);
        for (int j = 0; j < d.k / V; j++) {
            Pack<T, V> gv = g[j];
#pragma unroll
            for (int e = 0; e < V; e++) {
                int f = j * V + e;
                float z = window_z<TAPS>(win, ws + f * TAPS, bs[f]);
                sums[f * THREADS + threadIdx.x] += to_float(gv.v[e]) * gelu_grad_f(z);
            }
        }
    }
    __syncthreads();
    write_partials(sums, partials + (size_t)blockIdx.x * d.k, d.k);
}

/* ---- launching ---- */

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

static size_t window_shared_bytes(const Dims &d, bool backward) {
    size_t floats = (size_t)d.k * d.r * d.s * d.cr + d.k + (backward ? (size_t)d.k * THREADS : 0);
    return floats * sizeof(float);
}

/* Whether the window kernels take the shape and the buffers (x and y, or dy). */
template <typename T>
static bool window_fits(const Dims &d, const void *x, const void *y, bool backward) {
    constexpr int V = 16 / sizeof(T);
    return d.nhwc && d.c % V == 0 && d.k % V == 0 && aligned16(x) && aligned16(y) &&
           window_shared_bytes(d, backward) <= SHARED_LIMIT;
}

template <typename T, int R, int S, int C, int CR>
static void launch_window(const Dims &d, const T *x, const T *w, const T *b, T *y, const T *dy, float *partials,
                          unsigned rows, cudaStream_t stream) {
    if (partials)
        window_backward<T, R, S, C, CR><<<rows, THREADS, window_shared_bytes(d, true), stream>>>(x, w, b, dy, partials, d);
    else
        window_forward<T, R, S, C, CR><<<grid_stride_blocks(pixels_of(d), THREADS, WINDOW_MAX_BLOCKS), THREADS,
                                     window_shared_bytes(d, false), stream>>>(x, w, b, y, d);
    CUDA_CHECK_LAUNCH();
}

/* The window kernel of the filter size and channel counts, if one is built (2x2 over 3 of 8 channels:
 * airbench's padded image); false otherwise. Forward
 * writes y; backward (partials) writes rows partial sums. */
template <typename T>
static bool try_window(const Dims &d, const T *x, const T *w, const T *b, T *y, const T *dy, float *partials,
                       unsigned rows, cudaStream_t stream) {
    if (!window_fits<T>(d, x, partials ? (const void *)dy : (const void *)y, partials != NULL)) return false;
    if (d.c != 8) return false;
    if (d.r == 2 && d.s == 2 && d.cr == 3) launch_window<T, 2, 2, 8, 3>(d, x, w, b, y, dy, partials, rows, stream);
    else if (d.r == 2 && d.s == 2 && d.cr == 8) launch_window<T, 2, 2, 8, 8>(d, x, w, b, y, dy, partials, rows, stream);
    else if (d.r == 3 && d.s == 3 && d.cr == 8) launch_window<T, 3, 3, 8, 8>(d, x, w, b, y, dy, partials, rows, stream);
    else return false;
    return true;
}

template <typename T>
static void launch_forward(const Dims &d, const void *x, const void *w, const void *b, void *y, cudaStream_t stream) {
    const T *xt = (const T *)x, *wt = (const T *)w, *bt = (const T *)b;
    if (try_window<T>(d, xt, wt, bt, (T *)y, NULL, NULL, 0, stream)) return;
    plain_forward<T><<<elementwise_blocks(pixels_of(d) * d.k), THREADS, 0, stream>>>(xt, wt, bt, (T *)y, d);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_backward(const Dims &d, const void *x, const void *w, const void *b, const void *dy,
                            float *partials, unsigned rows, cudaStream_t stream) {
    const T *xt = (const T *)x, *wt = (const T *)w, *bt = (const T *)b, *dyt = (const T *)dy;
    if (try_window<T>(d, xt, wt, bt, NULL, dyt, partials, rows, stream)) return;
    plain_backward<T><<<dim3(rows, (unsigned)d.k), THREADS, 0, stream>>>(xt, wt, bt, dyt, partials, d);
    CUDA_CHECK_LAUNCH();
}

void conv_bias_gelu_forward_cuda(DType dtype, int nhwc, const ConvBiasGeluShape *s, const void *x, const void *w,
                                 const void *b, void *y, cudaStream_t stream) {
    check_float_dtype("conv_bias_gelu", dtype);
    conv_bias_gelu_check_shape(s);
    DISPATCH_FLOAT_DTYPE(dtype, launch_forward, dims_of(s, nhwc), x, w, b, y, stream);
}

void conv_bias_gelu_backward_cuda(DType dtype, int nhwc, const ConvBiasGeluShape *s, const void *x, const void *w,
                                  const void *b, const void *dy, void *db, void *workspace, cudaStream_t stream) {
    check_float_dtype("conv_bias_gelu", dtype);
    conv_bias_gelu_check_shape(s);
    if (!workspace) TC_FATAL("conv_bias_gelu backward: no workspace for the partial sums");
    int rows = conv_bias_gelu_partial_rows(s);
    DISPATCH_FLOAT_DTYPE(dtype, launch_backward, dims_of(s, nhwc), x, w, b, dy, (float *)workspace, (unsigned)rows,
                         stream);
    conv2d_bias_grad_finish_cuda(dtype, (const float *)workspace, rows, s->conv.k, db, stream);
}
