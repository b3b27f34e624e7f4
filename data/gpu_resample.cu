/* The GPU resample kernel: a thread an output pixel, all its channels; a block
 * RESAMPLE_THREADS consecutive pixels of one sample (grid: pixel tiles x
 * samples). Each pixel's taps are computed where it is made, in the order of
 * data/resample.h's per-pixel form (the CPU reference's), so both give the
 * same floats. The decoded images are read through the caches. */
#include "data/gpu_resample.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/check.h"

#define RESAMPLE_THREADS 256
#define MAX_GRID_Y 65535

/* The three channels of output pixel (y, x) of one sample, unnormalised. */
static __device__ void resample_rgb(const ResampleSample &p, const uint8_t *image, int out_h, int out_w, int y, int x,
                                    float v[3]) {
    ResampleAxis ax = resample_axis(p.box.x0, p.box.w, out_w, p.w), ay = resample_axis(p.box.y0, p.box.h, out_h, p.h);
    double cy, cx;
    int ly, lx;
    int ny = resample_span(&ay, y, &cy, &ly), nx = resample_span(&ax, resample_column(x, out_w, p.flip), &cx, &lx);
    double norm_y = resample_weight_norm(&ay, cy, ly, ny), norm_x = resample_weight_norm(&ax, cx, lx, nx);
    size_t plane = (size_t)p.pitch * p.h;
    float acc_y[3] = {0.0f, 0.0f, 0.0f};
    for (int j = 0; j < ny; j++) {
        const uint8_t *row = image + (size_t)(ly + j) * p.pitch + lx;
        float acc_x[3] = {0.0f, 0.0f, 0.0f};
        for (int k = 0; k < nx; k++) {
            float w = resample_weight(&ax, cx, lx + k, norm_x);
#pragma unroll
            for (int ch = 0; ch < 3; ch++) acc_x[ch] = RS_FADD(acc_x[ch], RS_FMUL(w, (float)row[ch * plane + k]));
        }
        float w = resample_weight(&ay, cy, ly + j, norm_y);
#pragma unroll
        for (int ch = 0; ch < 3; ch++) acc_y[ch] = RS_FADD(acc_y[ch], RS_FMUL(w, acc_x[ch]));
    }
#pragma unroll
    for (int ch = 0; ch < 3; ch++) v[ch] = acc_y[ch];
}

template <typename T> static __device__ T store_as(float v);
template <> __device__ float store_as<float>(float v) { return v; }
template <> __device__ __half store_as<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 store_as<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
static __global__ void __launch_bounds__(RESAMPLE_THREADS) gpu_resample_kernel(GpuResampleArgs a) {
    int sample = blockIdx.y;
    int pixels = a.out_h * a.out_w;
    int pixel = blockIdx.x * RESAMPLE_THREADS + threadIdx.x;
    if (a.labels_out && blockIdx.x == 0 && threadIdx.x == 0) a.labels_out[sample] = a.labels[sample];
    if (pixel >= pixels) return;
    ResampleSample p = a.samples[sample];
    int y = pixel / a.out_w, x = pixel % a.out_w;
    float v[3];
    resample_rgb(p, a.images + p.offset, a.out_h, a.out_w, y, x, v);
    float mean[3] = {a.mean[0], a.mean[1], a.mean[2]}, std[3] = {a.std[0], a.std[1], a.std[2]};
    T *out = (T *)a.out;
    if (!a.nhwc) {
#pragma unroll
        for (int ch = 0; ch < 3; ch++)
            out[((size_t)sample * 3 + ch) * pixels + pixel] = store_as<T>(resample_normalise(v[ch], mean[ch], std[ch]));
        return;
    }
    T *px = out + ((size_t)sample * pixels + pixel) * a.out_c;
#pragma unroll
    for (int ch = 0; ch < 3; ch++) px[ch] = store_as<T>(resample_normalise(v[ch], mean[ch], std[ch]));
    for (int ch = 3; ch < a.out_c; ch++) px[ch] = store_as<T>(0.0f);
}

void gpu_resample_batch(const GpuResampleArgs *a, cudaStream_t s) {
    gpu_resample_check_args(a);
    if (a->n == 0) return;
    if (a->n > MAX_GRID_Y) TC_FATAL("gpu_resample: batch of %d samples, more than %d", a->n, MAX_GRID_Y);
    int pixels = a->out_h * a->out_w;
    dim3 grid((unsigned)((pixels + RESAMPLE_THREADS - 1) / RESAMPLE_THREADS), (unsigned)a->n);
    switch (a->out_dtype) {
    case DTYPE_F16: gpu_resample_kernel<__half><<<grid, RESAMPLE_THREADS, 0, s>>>(*a); break;
    case DTYPE_BF16: gpu_resample_kernel<__nv_bfloat16><<<grid, RESAMPLE_THREADS, 0, s>>>(*a); break;
    default: gpu_resample_kernel<float><<<grid, RESAMPLE_THREADS, 0, s>>>(*a); break;
    }
    CUDA_CHECK_LAUNCH();
}
