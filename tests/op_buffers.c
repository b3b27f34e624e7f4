#include "tests/op_buffers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cast.h"
#include "runtime/check.h"
#include "runtime/gpu.h"

void *host_bytes(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}

float *host_floats(size_t n) { return host_bytes(n * sizeof(float)); }

float *copy_floats(const float *src, size_t n) {
    float *p = host_floats(n);
    memcpy(p, src, n * sizeof(float));
    return p;
}

void round_to(DType dt, float *x, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    cast_from_f32_cpu(dt, x, bits, n);
    cast_to_f32_cpu(dt, bits, x, n);
    free(bits);
}

void *dev_bytes(size_t bytes) {
    const char *error = NULL;
    void *p = gpu_try_malloc(bytes ? bytes : 1, &error);
    if (!p) TC_FATAL("cudaMalloc of %zu bytes failed: %s", bytes, error);
    return p;
}

void upload_on(cudaStream_t s, void *dst, const void *src, size_t bytes) {
    gpu_copy_to_device(dst, src, bytes, s);
    gpu_sync(s);
}

void download_on(cudaStream_t s, void *dst, const void *src, size_t bytes) {
    gpu_copy_to_host(dst, src, bytes, s);
    gpu_sync(s);
}

float *to_nhwc(const float *x, int n, int c, int h, int w, int c_padded) {
    size_t plane = (size_t)h * w;
    float *y = host_floats((size_t)n * plane * c_padded);
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (size_t p = 0; p < plane; p++)
                y[((size_t)i * plane + p) * c_padded + ch] = x[((size_t)i * c + ch) * plane + p];
    return y;
}

float *to_nchw(const float *x, int n, int c, int h, int w) {
    size_t plane = (size_t)h * w;
    float *y = host_floats((size_t)n * plane * c);
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (size_t p = 0; p < plane; p++)
                y[((size_t)i * c + ch) * plane + p] = x[((size_t)i * plane + p) * c + ch];
    return y;
}

void *dev_values_on(cudaStream_t s, DType dt, const float *host, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    cast_from_f32_cpu(dt, host, bits, n);
    void *p = dev_bytes(n * dtype_size(dt));
    upload_on(s, p, bits, n * dtype_size(dt));
    free(bits);
    return p;
}

float *download_values_on(cudaStream_t s, DType dt, const void *dev, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    download_on(s, bits, dev, n * dtype_size(dt));
    float *p = host_floats(n);
    cast_to_f32_cpu(dt, bits, p, n);
    free(bits);
    return p;
}
