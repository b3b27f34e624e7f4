#include "tests/op_checks.h"

#include <math.h>
#include <stdio.h>

#include "tests/harness.h"

void check_values(const char *what, const float *got, const double *want, size_t n, double tol) {
    for (size_t i = 0; i < n; i++)
        CHECK_MSG(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])), "%s[%zu] = %.9g, want %.9g",
                  what, i, got[i], want[i]);
}

void check_rel_l2(const char *what, const float *got, const double *want, size_t n, double tol) {
    double diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = isnan(got[i]) ? INFINITY : got[i] - want[i];
        diff2 += d * d;
        norm2 += want[i] * want[i];
    }
    double rel = sqrt(diff2) / (norm2 > 0 ? sqrt(norm2) : 1.0);
    printf("  %-66s rel err %.2e (bound %.1e)\n", what, rel, tol);
    CHECK_MSG(rel <= tol, "%s: relative error %.3g > %.3g", what, rel, tol);
}

void numeric_gradient(float *param, size_t n, float eps, LossFn loss, void *ctx, double *grad) {
    for (size_t i = 0; i < n; i++) {
        float saved = param[i];
        float up = saved + eps, down = saved - eps;
        param[i] = up;
        double loss_up = loss(ctx);
        param[i] = down;
        double loss_down = loss(ctx);
        param[i] = saved;
        grad[i] = (loss_up - loss_down) / ((double)up - (double)down);
    }
}

void check_gradient(const char *what, const float *analytic, const double *numeric, size_t n) {
    double diff2 = 0, norm2 = 0, max_diff = 0, max_abs = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(analytic[i] - numeric[i]);
        diff2 += d * d;
        norm2 += numeric[i] * numeric[i];
        if (d > max_diff) {
            max_diff = d;
            worst = i;
        }
        if (fabs(numeric[i]) > max_abs) max_abs = fabs(numeric[i]);
    }
    double rel = sqrt(diff2) / (norm2 > 0 ? sqrt(norm2) : 1.0);
    printf("  %-66s rel err %.2e (finite differences)\n", what, rel);
    CHECK_MSG(max_abs > 0, "%s: numeric gradient is all zero", what);
    CHECK_MSG(rel <= 1e-2, "%s: relative error %.3g", what, rel);
    CHECK_MSG(max_diff <= 1e-2 * max_abs, "%s[%zu]: analytic %.7g, numeric %.7g (max |g| %.3g)",
              what, worst, analytic[worst], numeric[worst], max_abs);
}

double weighted_sum(const float *y, const float *r, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)y[i] * r[i];
    return s;
}
