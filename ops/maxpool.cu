/* Max-pool through cuDNN pooling, in the tensors' own type and layout. */
#include "ops/maxpool.h"

#include <string.h>

#include "ops/cuda_launch.h"
#include "ops/dtype_cuda.cuh"
#include "runtime/check.h"

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

/* One thread per output element; the first maximum of the window, as cuDNN
 * and the CPU reference pick it, takes dy if it is positive (the ReLU's mask). */
template <typename T>
static __global__ void maxpool_relu_backward_kernel(const T *x, const T *dy, T *dx, size_t outputs,
                                                    int out_h, int out_w) {
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < outputs;
         o += (size_t)gridDim.x * blockDim.x) {
        size_t plane = o / ((size_t)out_h * out_w);
        int p = (int)(o / out_w % out_h), q = (int)(o % out_w);
        size_t width = 2 * (size_t)out_w;
        size_t top = plane * (2 * (size_t)out_h) * width + (size_t)(2 * p) * width + 2 * q;
        size_t at[4] = {top, top + 1, top + width, top + width + 1};
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = to_float(x[at[i]]);
        int best = 0;
#pragma unroll
        for (int i = 1; i < 4; i++)
            if (v[i] > v[best]) best = i;
        float g = v[best] > 0.0f ? to_float(dy[o]) : 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) dx[at[i]] = from_float<T>(i == best ? g : 0.0f);
    }
}

template <typename T>
static void launch_maxpool_relu_backward(const Pool2dShape *s, const void *x, const void *dy, void *dx,
                                         cudaStream_t stream) {
    size_t outputs = (size_t)s->n * s->c * (s->h / 2) * (s->w / 2);
    maxpool_relu_backward_kernel<T><<<elementwise_blocks(outputs), ELEMENTWISE_THREADS, 0, stream>>>(
        (const T *)x, (const T *)dy, (T *)dx, outputs, s->h / 2, s->w / 2);
    CUDA_CHECK_LAUNCH();
}

void maxpool2x2_relu_backward_cuda(DType dtype, const Pool2dShape *s, const void *x, const void *dy,
                                   void *dx, cudaStream_t stream) {
    check_float_dtype("maxpool_relu_backward", dtype);
    if (s->h % 2 || s->w % 2 || pool2d_window(s) != 2 || pool2d_stride(s) != 2 || s->pad)
        TC_FATAL("maxpool_relu_backward: 2x2 stride-2 windows over an even size only (got %dx%d, window %d)",
                 s->h, s->w, pool2d_window(s));
    if ((size_t)s->n * s->c * s->h * s->w == 0) return;
    DISPATCH_FLOAT_DTYPE(dtype, launch_maxpool_relu_backward, s, x, dy, dx, stream);
}
