/* Max-pool through cuDNN pooling, in the tensors' own type and layout. */
#include "ops/maxpool.h"

#include <string.h>

#include "runtime/check.h"
#include "runtime/dtype_cuda.cuh"

static const float kOne = 1.0f, kZero = 0.0f;

void maxpool2x2_cuda_init(MaxPoolCuda *p, const Pool2dShape *s, DType dtype, int nhwc) {
    memset(p, 0, sizeof *p);
    check_float_dtype("maxpool2x2", dtype);
    int k = pool2d_window(s), stride = pool2d_stride(s);
    int plain = k == 2 && stride == 2 && s->pad == 0;
    if (s->n <= 0 || s->c <= 0 || s->h < 2 || s->w < 2 || (plain && (s->h % 2 || s->w % 2)) ||
        s->pad < 0 || s->pad >= k || pool2d_out_h(s) < 1 || pool2d_out_w(s) < 1)
        TC_FATAL("maxpool: bad shape n=%d c=%d h=%d w=%d window %d stride %d pad %d", s->n, s->c,
                 s->h, s->w, k, stride, s->pad);
    p->shape = *s;
    p->dtype = dtype;
    p->nhwc = nhwc != 0;
    cudnnDataType_t data_type = dtype_cudnn(dtype);
    cudnnTensorFormat_t format = p->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    CUDNN_CHECK(cudnnCreatePoolingDescriptor(&p->pool_desc));
    CUDNN_CHECK(cudnnSetPooling2dDescriptor(p->pool_desc, CUDNN_POOLING_MAX,
                                            CUDNN_NOT_PROPAGATE_NAN, k, k, s->pad, s->pad, stride,
                                            stride));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y_desc));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x_desc, format, data_type, s->n, s->c, s->h, s->w));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y_desc, format, data_type, s->n, s->c, pool2d_out_h(s),
                                           pool2d_out_w(s)));
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
