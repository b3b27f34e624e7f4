#include "ops/maxpool.h"

#include <string.h>

/* Offset (within the plane) of the largest element of the 2x2 window at output
 * (p, q): the first one in row-major window order on ties, as cuDNN picks. */
static size_t window_argmax(const float *plane, int width, int p, int q) {
    size_t top = (size_t)(2 * p) * width + 2 * q, bottom = top + width;
    size_t candidates[4] = {top, top + 1, bottom, bottom + 1};
    size_t best = candidates[0];
    for (int i = 1; i < 4; i++)
        if (plane[candidates[i]] > plane[best]) best = candidates[i];
    return best;
}

void maxpool2x2_forward_cpu(const Pool2dShape *s, const float *x, float *y) {
    int out_h = s->h / 2, out_w = s->w / 2;
    size_t planes = (size_t)s->n * s->c;
    for (size_t pl = 0; pl < planes; pl++) {
        const float *x_plane = x + pl * s->h * s->w;
        float *y_plane = y + pl * out_h * out_w;
        for (int p = 0; p < out_h; p++)
            for (int q = 0; q < out_w; q++)
                y_plane[p * out_w + q] = x_plane[window_argmax(x_plane, s->w, p, q)];
    }
}

/* Routes each output gradient by the argmax of x; y is not needed for that. */
void maxpool2x2_backward_cpu(const Pool2dShape *s, const float *x, const float *y,
                             const float *dy, float *dx) {
    int out_h = s->h / 2, out_w = s->w / 2;
    size_t planes = (size_t)s->n * s->c;
    memset(dx, 0, sizeof(float) * planes * s->h * s->w);
    for (size_t pl = 0; pl < planes; pl++) {
        const float *x_plane = x + pl * s->h * s->w;
        const float *dy_plane = dy + pl * out_h * out_w;
        float *dx_plane = dx + pl * s->h * s->w;
        for (int p = 0; p < out_h; p++)
            for (int q = 0; q < out_w; q++)
                dx_plane[window_argmax(x_plane, s->w, p, q)] = dy_plane[p * out_w + q];
    }
}

void maxpool2x2_relu_backward_cpu(const Pool2dShape *s, const float *x, const float *dy, float *dx) {
    maxpool2x2_backward_cpu(s, x, NULL, dy, dx);
    size_t n = (size_t)s->n * s->c * s->h * s->w;
    for (size_t i = 0; i < n; i++)
        if (!(x[i] > 0.0f)) dx[i] = 0.0f;
}
