#include "ops/softmax_xent.h"

#include <math.h>

#include "runtime/check.h"

/* Double precision throughout: this is the reference the CUDA kernel is held to. */
void softmax_xent_cpu(const float *logits, const int32_t *labels, int n, int classes,
                      const float *grad_scale, float *loss, float *dlogits) {
    double loss_sum = 0.0;
    double scale = grad_scale ? *grad_scale : 1.0;
    double grad_factor = n > 0 ? scale / n : 0.0;
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * classes;
        float *drow = dlogits + (size_t)i * classes;
        int label = labels[i];
        if (label < 0 || label >= classes)
            TC_FATAL("softmax_xent: label %d of row %d is outside [0, %d)", label, i, classes);
        double row_max = row[0];
        for (int j = 1; j < classes; j++)
            if (row[j] > row_max) row_max = row[j];
        double exp_sum = 0.0;
        for (int j = 0; j < classes; j++) exp_sum += exp((double)row[j] - row_max);
        loss_sum += row_max + log(exp_sum) - row[label];
        for (int j = 0; j < classes; j++) {
            double prob = exp((double)row[j] - row_max) / exp_sum;
            drow[j] = (float)((prob - (j == label)) * grad_factor);
        }
    }
    *loss = n > 0 ? (float)(loss_sum / n) : 0.0f;
}
