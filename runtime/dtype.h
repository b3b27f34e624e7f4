/* Where a buffer lives and what its elements are: the two enums every layer
 * passes around, and their sizes and names. */
#ifndef TRAINC_DTYPE_H
#define TRAINC_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } DeviceKind;
typedef enum { DTYPE_F32 = 0, DTYPE_F16, DTYPE_BF16, DTYPE_I32, DTYPE_U8 } DType;

size_t dtype_size(DType t);
const char *dtype_name(DType t);
const char *device_name(DeviceKind d);

#ifdef __cplusplus
}
#endif
#endif
