#include "runtime/dtype.h"

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
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "(not a dtype)";
}

const char *device_name(DeviceKind d) { return d == DEVICE_CUDA ? "cuda" : "cpu"; }
