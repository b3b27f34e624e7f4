/* airbench's whitening layer: a 2x2 convolution over the input whose weights
 * come from the training images rather than from training. With C the 2x2
 * patches' second-moment matrix (k = 4 x channels square, not centred) and
 * C = V diag(l) V^T, the filters are the rows of diag(1 / sqrt(l + eps)) V^T
 * and their negations (2k filters), so W C W^T = diag(l / (l + eps)) ~ I
 * (tools/torch_airbench.py's whitening_filters). */
#ifndef TRAINC_MODELS_WHITEN_H
#define TRAINC_MODELS_WHITEN_H

#include <stddef.h>

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WHITEN_EPS 5e-4      /* the recipe's eps */
#define WHITEN_IMAGES 5000   /* the recipe's: training images whose patches make C */

/* The eigen-decomposition of the symmetric n x n matrix a (row-major; a is
 * overwritten) by cyclic Jacobi rotations: values ascending, vectors[i * n + k]
 * component i of the eigenvector of values[k] (unit length). Returns the
 * sweeps taken, or -1 when 100 did not bring the off-diagonal to zero. */
int symmetric_eigen(double *a, int n, double *values, double *vectors);

/* C of n images [n][c][h][w]: k = 4c rows and columns ordered (channel, dy,
 * dx) as a convolution's weights, averaged over every 2x2 window (no padding). */
void whiten_patch_moment(const float *images, int n, int c, int h, int w, double *moment);

/* The 2k filters [2k][k] (each [c][2][2]) of a k x k second moment; 0, or -1
 * when the decomposition did not converge. */
int whiten_filters(const double *moment, int k, double eps, float *filters);

/* The layer model_mark_whitening marked, or -1. */
int model_whitening_layer(const Model *m);
/* The layers that need no backward once the whitening bias stops training
 * (model_set_frozen_prefix's count): the whitening layer and the layers
 * without parameters right after it; 0 without a whitening layer, or when
 * a layer before it has parameters. */
int whitening_frozen_prefix(const Model *m);
/* Its weights from filters [2k][c][2][2] (PyTorch's order) and its bias 0. */
void model_set_whitening(Model *m, const float *filters);

#ifdef __cplusplus
}
#endif
#endif
