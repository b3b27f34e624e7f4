#include "ops/bias_relu_pool.h"

#include <stdint.h>

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* x + b as the unfused bias + ReLU stores it (rounded to T); ReLU is left to
 * the callers, which compare before it. */
template <typename T>
static __device__ __forceinline__ float biased(T x, float b) {
    return to_float(from_float<T>(to_float(x) + b));
}

/* Where the four packs of a window start, in window order, and where its
 * output pack goes. NHWC: one thread per output pixel and VEC consecutive
 * channels. NCHW: one thread per output element; VEC is 2 (a row's two
 * inputs in one load) or 1. Units are packs of VEC elements. */
template <int VEC, bool NHWC>
static __device__ __forceinline__ void locate(size_t v, int c, int oh, int ow, size_t at[4], int *channel) {
    if (NHWC) {
        size_t cv = (size_t)c / VEC, pix = v / cv;
        size_t n = pix / ((size_t)oh * ow);
        int p = (int)(pix / ow % oh), q = (int)(pix % ow);
        size_t row = 2 * (size_t)ow * cv;
        at[0] = (n * 2 * oh + 2 * p) * row + 2 * (size_t)q * cv + v % cv;
        at[1] = at[0] + cv, at[2] = at[0] + row, at[3] = at[0] + row + cv;
        *channel = (int)(v % cv) * VEC;
    } else {
        size_t plane = v / ((size_t)oh * ow);
        int p = (int)(v / ow % oh), q = (int)(v % ow);
        size_t w = 2 * (size_t)ow, top = (plane * 2 * oh + 2 * p) * w + 2 * q;
        if (VEC == 2) {
            at[0] = top / 2, at[1] = (top + w) / 2, at[2] = at[3] = 0;
        } else {
            at[0] = top, at[1] = top + 1, at[2] = top + w, at[3] = top + w + 1;
        }
        *channel = (int)(plane % c);
    }
}

/* The window's four values of x + b (rounded), per output lane: NHWC lanes
 * are channels, NCHW has one lane. */
template <typename T, int VEC, bool NHWC>
static __device__ __forceinline__ void load_window(const T *x, const T *b, const size_t at[4], int channel,
                                                   float vals[4][NHWC ? VEC : 1]) {
    const Pack<T, VEC> *xv = (const Pack<T, VEC> *)x;
    if (NHWC) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            Pack<T, VEC> pk = xv[at[i]];
#pragma unroll
            for (int e = 0; e < VEC; e++) vals[i][e] = biased(pk.v[e], to_float(b[channel + e]));
        }
    } else if (VEC == 2) {
        float bc = to_float(b[channel]);
        Pack<T, VEC> top = xv[at[0]], bottom = xv[at[1]];
        vals[0][0] = biased(top.v[0], bc), vals[1][0] = biased(top.v[VEC - 1], bc);
        vals[2][0] = biased(bottom.v[0], bc), vals[3][0] = biased(bottom.v[VEC - 1], bc);
    } else {
        float bc = to_float(b[channel]);
#pragma unroll
        for (int i = 0; i < 4; i++) vals[i][0] = biased(xv[at[i]].v[0], bc);
    }
}

template <typename T, int VEC, bool NHWC>
static __global__ void bias_relu_pool_forward_kernel(const T *x, const T *b, T *y, size_t threads, int c, int oh,
                                                     int ow) {
    constexpr int LANES = NHWC ? VEC : 1;
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < threads; v += (size_t)gridDim.x * blockDim.x) {
        size_t at[4];
        int channel;
        float vals[4][LANES];
        locate<VEC, NHWC>(v, c, oh, ow, at, &channel);
        load_window<T, VEC, NHWC>(x, b, at, channel, vals);
        Pack<T, LANES> out;
#pragma unroll
        for (int e = 0; e < LANES; e++)
            out.v[e] = from_float<T>(fmaxf(fmaxf(fmaxf(vals[0][e], vals[1][e]), fmaxf(vals[2][e], vals[3][e])), 0.0f));
        ((Pack<T, LANES> *)y)[v] = out;
    }
}

template <typename T, int VEC, bool NHWC>
static __global__ void bias_relu_pool_backward_kernel(const T *x, const T *b, const T *dy, T *dx, size_t threads,
                                                      int c, int oh, int ow) {
    constexpr int LANES = NHWC ? VEC : 1;
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < threads; v += (size_t)gridDim.x * blockDim.x) {
        size_t at[4];
        int channel;
        float vals[4][LANES];
        locate<VEC, NHWC>(v, c, oh, ow, at, &channel);
        load_window<T, VEC, NHWC>(x, b, at, channel, vals);
        Pack<T, LANES> g = ((const Pack<T, LANES> *)dy)[v];
        T zero = from_float<T>(0.0f);
        Pack<T, VEC> out[4];
#pragma unroll
        for (int e = 0; e < LANES; e++) {
            int best = 0;
#pragma unroll
            for (int i = 1; i < 4; i++)
                if (vals[i][e] > vals[best][e]) best = i;
            T grad = vals[best][e] > 0.0f ? g.v[e] : zero;
            if (NHWC) {
#pragma unroll
                for (int i = 0; i < 4; i++) out[i].v[e] = i == best ? grad : zero;
            } else if (VEC == 2) {
                out[0].v[0] = best == 0 ? grad : zero, out[0].v[VEC - 1] = best == 1 ? grad : zero;
                out[1].v[0] = best == 2 ? grad : zero, out[1].v[VEC - 1] = best == 3 ? grad : zero;
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) out[i].v[0] = i == best ? grad : zero;
            }
        }
        Pack<T, VEC> *dxv = (Pack<T, VEC> *)dx;
        int stores = !NHWC && VEC == 2 ? 2 : 4;
        for (int i = 0; i < stores; i++) dxv[at[i]] = out[i];
    }
}

static bool aligned(const void *p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

/* One launch of the forward (dy NULL) or the backward kernel at this vector width. */
template <typename T, int VEC, bool NHWC>
static void launch(const Pool2dShape *s, const void *x, const void *b, const void *dy, void *out,
                   cudaStream_t stream) {
    int oh = s->h / 2, ow = s->w / 2;
    size_t threads = (size_t)s->n * s->c * oh * ow / (NHWC ? VEC : 1);
    unsigned blocks = elementwise_blocks(threads);
    if (dy)
        bias_relu_pool_backward_kernel<T, VEC, NHWC><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (const T *)b, (const T *)dy, (T *)out, threads, s->c, oh, ow);
    else
        bias_relu_pool_forward_kernel<T, VEC, NHWC><<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
            (const T *)x, (const T *)b, (T *)out, threads, s->c, oh, ow);
    CUDA_CHECK_LAUNCH();
}

/* NHWC takes 16 bytes of channels a thread where c and the pointers allow;
 * NCHW a row's two inputs in one load where the pointers allow. */
template <typename T>
static void launch_widest(const Pool2dShape *s, int nhwc, const void *x, const void *b, const void *dy, void *out,
                          cudaStream_t stream) {
    constexpr int WIDE = 16 / sizeof(T);
    bool ptrs16 = aligned(x, 16) && aligned(out, 16) && (!dy || aligned(dy, 16));
    if (nhwc && s->c % WIDE == 0 && ptrs16) launch<T, WIDE, true>(s, x, b, dy, out, stream);
    else if (nhwc) launch<T, 1, true>(s, x, b, dy, out, stream);
    else if (aligned(x, 2 * sizeof(T)) && aligned(out, 2 * sizeof(T))) launch<T, 2, false>(s, x, b, dy, out, stream);
    else launch<T, 1, false>(s, x, b, dy, out, stream);
}

void bias_relu_pool_forward_cuda(DType dtype, const Pool2dShape *s, int nhwc, const void *x, const void *b,
                                 void *y, cudaStream_t stream) {
    check_float_dtype("bias_relu_pool", dtype);
    bias_relu_pool_check_shape(s);
    DISPATCH_FLOAT_DTYPE(dtype, launch_widest, s, nhwc, x, b, (const void *)NULL, y, stream);
}

void bias_relu_pool_backward_cuda(DType dtype, const Pool2dShape *s, int nhwc, const void *x, const void *b,
                                  const void *dy, void *dx, cudaStream_t stream) {
    check_float_dtype("bias_relu_pool", dtype);
    bias_relu_pool_check_shape(s);
    DISPATCH_FLOAT_DTYPE(dtype, launch_widest, s, nhwc, x, b, dy, dx, stream);
}
