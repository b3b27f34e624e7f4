/* Host and device buffers for the ops' GPU tests. Copies go through the given
 * stream and wait for it: the compute stream does not synchronize with the
 * legacy default stream. */
#ifndef TRAINC_TESTS_OP_BUFFERS_H
#define TRAINC_TESTS_OP_BUFFERS_H

#include <stddef.h>

#include "runtime/cuda_api.h"
#include "runtime/dtype.h"

void *host_bytes(size_t bytes);              /* zeroed; exits when out of memory */
float *host_floats(size_t n);
float *copy_floats(const float *src, size_t n);
void round_to(DType dt, float *x, size_t n); /* in place, to the nearest value of dt */
/* [n][c][h][w] -> [n][h][w][c_padded], the padding zero (conv weights
 * [k][c][r][s] go to [k][r][s][c] the same way); and [n][h][w][c] -> [n][c][h][w]. */
float *to_nhwc(const float *x, int n, int c, int h, int w, int c_padded);
float *to_nchw(const float *x, int n, int c, int h, int w);
void *dev_bytes(size_t bytes);
void upload_on(cudaStream_t s, void *dst, const void *src, size_t bytes);
void download_on(cudaStream_t s, void *dst, const void *src, size_t bytes);
/* A new device buffer of n elements of dt holding host's values (rounded to
 * dt); and n elements of dt from the device, widened to new host floats. */
void *dev_values_on(cudaStream_t s, DType dt, const float *host, size_t n);
float *download_values_on(cudaStream_t s, DType dt, const void *dev, size_t n);

#endif
