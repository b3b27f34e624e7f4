#include "ops/space_to_depth.h"

#include "runtime/check.h"
#include "runtime/cuda_launch.h"
#include "runtime/dtype_cuda.cuh"

/* x's pixel (p, q), channel 0, and the distance between its channels: x
 * [n][h][w][c] or, NCHW, [n][c_used][h][w]. */
template <bool NCHW, typename S>
static __device__ const S *source_pixel(const SpaceToDepthShape &s, const S *x, int img, int p, int q, size_t *step) {
    if (NCHW) {
        *step = (size_t)s.h * s.w;
        return x + (size_t)img * s.c_used * *step + (size_t)p * s.w + q;
    }
    *step = 1;
    return x + (((size_t)img * s.h + p) * s.w + q) * s.c;
}

/* One thread per pixel of a square (n, i, j, a, b): its group channels of y,
 * written one after another, read from one pixel of x (of type S). */
template <typename T, typename S, bool NCHW>
static __global__ void space_to_depth_kernel(SpaceToDepthShape s, const S *x, T *y) {
    size_t squares = (size_t)s.n * s.out_h * s.out_w * s.block * s.block;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < squares; t += (size_t)gridDim.x * blockDim.x) {
        int b = (int)(t % s.block), a = (int)(t / s.block % s.block);
        size_t pixel = t / ((size_t)s.block * s.block);
        int j = (int)(pixel % s.out_w), i = (int)(pixel / s.out_w % s.out_h);
        int img = (int)(pixel / ((size_t)s.out_w * s.out_h));
        int p = s.block * i + a - s.pad, q = s.block * j + b - s.pad;
        int inside = p >= 0 && p < s.h && q >= 0 && q < s.w;
        size_t step;
        const S *src = source_pixel<NCHW>(s, x, img, inside ? p : 0, inside ? q : 0, &step);
        T *dst = y + t * s.group;
        for (int ch = 0; ch < s.group; ch++)
            dst[ch] = from_float<T>(inside && ch < s.c_used ? to_float(src[ch * step]) : 0.0f);
    }
}

/* One thread per element of dx that carries data: the one element of dy it went to. */
template <typename T>
static __global__ void space_to_depth_backward_kernel(SpaceToDepthShape s, const T *dy, T *dx) {
    size_t count = (size_t)s.n * s.h * s.w * s.c_used;
    int yc = s.block * s.block * s.group;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < count; e += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)(e % s.c_used);
        size_t pixel = e / s.c_used;
        int q = (int)(pixel % s.w), p = (int)(pixel / s.w % s.h), img = (int)(pixel / ((size_t)s.w * s.h));
        int pp = p + s.pad, qq = q + s.pad, i = pp / s.block, j = qq / s.block;
        if (i >= s.out_h || j >= s.out_w) continue;
        size_t t = (((size_t)img * s.out_h + i) * s.out_w + j) * yc;
        t += ((pp % s.block) * s.block + qq % s.block) * s.group + ch;
        T *d = dx + pixel * s.c + ch;
        *d = from_float<T>(to_float(*d) + to_float(dy[t]));
    }
}

template <typename T>
static void launch_forward(const SpaceToDepthShape *s, const void *x, void *y, cudaStream_t stream) {
    size_t squares = (size_t)s->n * s->out_h * s->out_w * s->block * s->block;
    space_to_depth_kernel<T, T, false>
        <<<elementwise_blocks(squares), ELEMENTWISE_THREADS, 0, stream>>>(*s, (const T *)x, (T *)y);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_from_f32_nchw(const SpaceToDepthShape *s, const float *x, void *y, cudaStream_t stream) {
    size_t squares = (size_t)s->n * s->out_h * s->out_w * s->block * s->block;
    space_to_depth_kernel<T, float, true>
        <<<elementwise_blocks(squares), ELEMENTWISE_THREADS, 0, stream>>>(*s, x, (T *)y);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void launch_backward(const SpaceToDepthShape *s, const void *dy, void *dx, cudaStream_t stream) {
    size_t count = (size_t)s->n * s->h * s->w * s->c_used;
    space_to_depth_backward_kernel<T>
        <<<elementwise_blocks(count), ELEMENTWISE_THREADS, 0, stream>>>(*s, (const T *)dy, (T *)dx);
    CUDA_CHECK_LAUNCH();
}

void space_to_depth_forward_cuda(DType dtype, const SpaceToDepthShape *s, const void *x, void *y,
                                 cudaStream_t stream) {
    check_float_dtype("space_to_depth", dtype);
    DISPATCH_FLOAT_DTYPE(dtype, launch_forward, s, x, y, stream);
}

void space_to_depth_backward_cuda(DType dtype, const SpaceToDepthShape *s, const void *dy, void *dx,
                                  cudaStream_t stream) {
    check_float_dtype("space_to_depth", dtype);
    DISPATCH_FLOAT_DTYPE(dtype, launch_backward, s, dy, dx, stream);
}

void space_to_depth_from_f32_nchw_cuda(DType dtype, const SpaceToDepthShape *s, const float *x, void *y,
                                       cudaStream_t stream) {
    check_float_dtype("space_to_depth", dtype);
    DISPATCH_FLOAT_DTYPE(dtype, launch_from_f32_nchw, s, x, y, stream);
}
