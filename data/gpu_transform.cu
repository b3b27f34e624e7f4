/* The GPU transform kernel. A block makes TRANSFORM_ROUNDS * TRANSFORM_THREADS
 * consecutive output pixels of one sample (grid: pixel tiles x samples), one
 * pixel per thread per round, all channels of it. The float output is nearly all
 * of the memory traffic, so each round's writes are contiguous: per channel
 * plane in NCHW, and through shared memory in NHWC. The stored image (3 KB for
 * CIFAR) is read through the caches. */
#include "data/gpu_transform.h"

#include "runtime/check.h"

#define TRANSFORM_THREADS 256
/* Pixels per thread: enough work per block to pay for building the
 * normalisation table in shared memory. */
#define TRANSFORM_ROUNDS 8
#define MAX_GRID_Y 65535

typedef struct {
    int lo, hi;
    float wlo, whi;
} Tap;

/* The CPU path's arithmetic (bilinear_taps in transform.c) rounded the same way:
 * __fmul_rn and __fadd_rn keep nvcc from fusing a multiply and an add into an
 * FMA, which would round once instead of twice. */
static __device__ Tap bilinear_tap(int i, int in, float scale) {
    float src = __fadd_rn(__fmul_rn(scale, (float)i + 0.5f), -0.5f);
    if (src < 0.0f) src = 0.0f;
    int lo = (int)src;
    if (lo > in - 1) lo = in - 1;
    float frac = src - (float)lo;
    if (frac > 1.0f) frac = 1.0f;
    Tap t = {lo, lo + (lo < in - 1 ? 1 : 0), 1.0f - frac, frac};
    return t;
}

static __device__ float blend(float wa, float a, float wb, float b) {
    return __fadd_rn(__fmul_rn(wa, a), __fmul_rn(wb, b));
}

/* Offset in a stored plane of pixel (gy, gx) of the cropped, flipped image; -1
 * in the zero padding. */
static __device__ int source_offset(const GpuTransformArgs &a, const TransformParams &p, int gy,
                                    int gx) {
    int sy = transform_pad_index(gy + p.crop_dy, a.h, a.pad_reflect);
    int sx = transform_pad_index((p.flip ? a.w - 1 - gx : gx) + p.crop_dx, a.w, a.pad_reflect);
    return (sy >= 0 && sx >= 0) ? sy * a.w + sx : -1;
}

static __device__ float tap_value(const uint8_t *plane, const float *lut, int offset) {
    return lut[offset < 0 ? 0 : plane[offset]];
}

/* Output pixel (y, x) of one sample, all channels, into v. */
static __device__ void transform_pixel(const GpuTransformArgs &a, const TransformParams &p,
                                       const uint8_t *image, const float (*lut)[256],
                                       float scale_y, float scale_x, int y, int x, float v[3]) {
    Tap ty = bilinear_tap(y, a.h, scale_y), tx = bilinear_tap(x, a.w, scale_x);
    int top_lo = source_offset(a, p, ty.lo, tx.lo), top_hi = source_offset(a, p, ty.lo, tx.hi);
    int bottom_lo = source_offset(a, p, ty.hi, tx.lo), bottom_hi = source_offset(a, p, ty.hi, tx.hi);
    int cut = y >= p.cutout_y0 && y < p.cutout_y1 && x >= p.cutout_x0 && x < p.cutout_x1;
    size_t plane_size = (size_t)a.h * a.w;
#pragma unroll
    for (int ch = 0; ch < 3; ch++) {
        if (ch >= a.c) break; /* a constant loop bound keeps v in registers */
        const uint8_t *plane = image + ch * plane_size;
        /* Across, then down: the order of the CPU path's two passes. */
        float top = blend(tx.wlo, tap_value(plane, lut[ch], top_lo),
                          tx.whi, tap_value(plane, lut[ch], top_hi));
        float bottom = blend(tx.wlo, tap_value(plane, lut[ch], bottom_lo),
                             tx.whi, tap_value(plane, lut[ch], bottom_hi));
        v[ch] = cut ? 0.0f : blend(ty.wlo, top, ty.whi, bottom);
    }
}

/* v[ch] by selects: indexing the kernel's argument array directly would copy
 * the whole argument struct to local memory. */
static __device__ float channel_value(const float (&v)[3], int ch) {
    return ch == 0 ? v[0] : ch == 1 ? v[1] : v[2];
}

static __global__ void __launch_bounds__(TRANSFORM_THREADS)
gpu_transform_kernel(GpuTransformArgs a, float scale_y, float scale_x) {
    __shared__ float lut[3][256];                  /* (v/255 - mean)/std, as the CPU path's */
    __shared__ float staged[TRANSFORM_THREADS * 3]; /* NHWC: one round's pixels */
    for (int i = threadIdx.x; i < a.c * 256; i += TRANSFORM_THREADS) {
        int ch = i >> 8, value = i & 255;
        lut[ch][value] =
            ((float)value / 255.0f - channel_value(a.mean, ch)) / channel_value(a.std, ch);
    }
    __syncthreads();

    int sample = blockIdx.y;
    int pixels = a.out_h * a.out_w;
    TransformParams p = a.params[sample];
    int image_number = a.index ? a.index[sample] : sample;
    const uint8_t *image = a.raw_images + (size_t)image_number * a.c * a.h * a.w;
    if (a.labels_out && blockIdx.x == 0 && threadIdx.x == 0) a.labels_out[sample] = a.labels[image_number];
    for (int round = 0; round < TRANSFORM_ROUNDS; round++) {
        /* 'first' is the same for the whole block, so the break and the
         * __syncthreads below are reached by all its threads or none. */
        int first = (blockIdx.x * TRANSFORM_ROUNDS + round) * TRANSFORM_THREADS;
        if (first >= pixels) break;
        int pixel = first + threadIdx.x;
        float v[3] = {0.0f, 0.0f, 0.0f};
        if (pixel < pixels)
            transform_pixel(a, p, image, lut, scale_y, scale_x, pixel / a.out_w, pixel % a.out_w, v);
        if (!a.nhwc) {
            if (pixel < pixels) {
#pragma unroll
                for (int ch = 0; ch < 3; ch++)
                    if (ch < a.c) a.out[((size_t)sample * a.c + ch) * pixels + pixel] = v[ch];
            }
            continue;
        }
        /* NHWC: thread t's channels are floats t*c .. t*c + c-1 of the round's
         * run; staging them lets consecutive threads write consecutive floats. */
#pragma unroll
        for (int ch = 0; ch < 3; ch++)
            if (ch < a.c) staged[threadIdx.x * a.c + ch] = v[ch];
        __syncthreads();
        int count = min(TRANSFORM_THREADS, pixels - first) * a.c;
        float *run = a.out + ((size_t)sample * pixels + first) * a.c;
        for (int i = threadIdx.x; i < count; i += TRANSFORM_THREADS) run[i] = staged[i];
        __syncthreads();
    }
}

void gpu_transform_batch(const GpuTransformArgs *a, cudaStream_t s) {
    gpu_transform_check_args(a);
    if (a->n == 0) return;
    if (a->n > MAX_GRID_Y)
        TC_FATAL("gpu_transform: batch of %d samples, more than %d", a->n, MAX_GRID_Y);
    int pixels = a->out_h * a->out_w;
    int pixels_per_block = TRANSFORM_THREADS * TRANSFORM_ROUNDS;
    dim3 grid((unsigned)((pixels + pixels_per_block - 1) / pixels_per_block), (unsigned)a->n);
    /* As the CPU path computes them. */
    float scale_y = (float)a->h / (float)a->out_h, scale_x = (float)a->w / (float)a->out_w;
    gpu_transform_kernel<<<grid, TRANSFORM_THREADS, 0, s>>>(*a, scale_y, scale_x);
    CUDA_CHECK_LAUNCH();
}
