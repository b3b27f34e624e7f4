/* Max-pool 2x2 stride 2 through cuDNN pooling, in the tensors' own type and layout. */
#include "ops/maxpool.h"

#include <string.h>

#include "ops/dtype_cuda.cuh"
#include "runtime/check.h"

static const float kOne = 1.0f, kZero = 0.0f;

void maxpool2x2_cuda_init(MaxPoolCuda *p, const Pool2dShape *s, DType dtype, int nhwc) {
    memset(p, 0, sizeof *p);
    check_float_dtype("maxpool2x2", dtype);
    if (s->n <= 0 || s->c <= 0 || s->h < 2 || s->w < 2 || s->h % 2 || s->w % 2)
        TC_FATAL("maxpool2x2: bad shape n=%d c=%d h=%d w=%d (h and w must be even)", s->n, s->c,
                 s->h, s->w);
    p->shape = *s;
    p->dtype = dtype;
    p->nhwc = nhwc != 0;
    cudnnDataType_t data_type = dtype_cudnn(dtype);
    cudnnTensorFormat_t format = p->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    CUDNN_CHECK(cudnnCreatePoolingDescriptor(&p->pool_desc));
    CUDNN_CHECK(cudnnSetPooling2dDescriptor(p->pool_desc, CUDNN_POOLING_MAX,
                                            CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y_desc));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x_desc, format, data_type, s->n, s->c, s->h, s->w));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y_desc, format, data_type, s->n, s->c, s->h / 2,
                                           s->w / 2));
}

void maxpool2x2_cuda_destroy(MaxPoolCuda *p) {
    if (p->y_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(p->y_desc));
    if (p->x_desc) CUDNN_CHECK(cudnnDestroyTensorDescriptor(p->x_desc));
    if (p->pool_desc) CUDNN_CHECK(cudnnDestroyPoolingDescriptor(p->pool_desc));
    memset(p, 0, sizeof *p);
}

void maxpool2x2_forward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x, void *y) {
    CUDNN_CHECK(cudnnPoolingForward(h, p->pool_desc, &kOne, p->x_desc, x, &kZero, p->y_desc, y));
}

void maxpool2x2_backward_cuda(const MaxPoolCuda *p, cudnnHandle_t h, const void *x,
                              const void *y, const void *dy, void *dx) {
    CUDNN_CHECK(cudnnPoolingBackward(h, p->pool_desc, &kOne, p->y_desc, y, p->y_desc, dy,
                                     p->x_desc, x, &kZero, p->x_desc, dx));
}
