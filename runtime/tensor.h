/* A tensor is a view: shape, dtype and where the bytes live. Memory is owned by
 * an Arena (device or host), never by the tensor. */
#ifndef TRAINC_TENSOR_H
#define TRAINC_TENSOR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } DeviceKind;
typedef enum { DTYPE_F32 = 0, DTYPE_F16, DTYPE_BF16, DTYPE_I32, DTYPE_U8 } DType;

#define TENSOR_MAX_DIMS 4
typedef struct {
    void *data;
    int ndim;
    int shape[TENSOR_MAX_DIMS]; /* NCHW for images, [N, features] for matrices */
    DType dtype;
    DeviceKind device;
} Tensor;

size_t dtype_size(DType t);
const char *dtype_name(DType t);
const char *device_name(DeviceKind d);
size_t tensor_numel(const Tensor *t);
size_t tensor_bytes(const Tensor *t);
Tensor tensor_4d(DType dt, DeviceKind dev, int n, int c, int h, int w);
Tensor tensor_2d(DType dt, DeviceKind dev, int rows, int cols);

#ifdef __cplusplus
}
#endif
#endif
