#include "runtime/tensor.h"

size_t dtype_size(DType t) {
    switch (t) {
    case DTYPE_F32: case DTYPE_I32: return 4;
    case DTYPE_F16: case DTYPE_BF16: return 2;
    case DTYPE_U8: return 1;
    }
    return 0;
}

const char *dtype_name(DType t) {
    static const char *names[] = {"f32", "f16", "bf16", "i32", "u8"};
    return names[t];
}

const char *device_name(DeviceKind d) { return d == DEVICE_CUDA ? "cuda" : "cpu"; }

size_t tensor_numel(const Tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

size_t tensor_bytes(const Tensor *t) { return tensor_numel(t) * dtype_size(t->dtype); }

Tensor tensor_4d(DType dt, DeviceKind dev, int n, int c, int h, int w) {
    Tensor t = {0};
    t.ndim = 4;
    t.shape[0] = n; t.shape[1] = c; t.shape[2] = h; t.shape[3] = w;
    t.dtype = dt;
    t.device = dev;
    return t;
}

Tensor tensor_2d(DType dt, DeviceKind dev, int rows, int cols) {
    Tensor t = {0};
    t.ndim = 2;
    t.shape[0] = rows; t.shape[1] = cols;
    t.dtype = dt;
    t.device = dev;
    return t;
}
