/* Checks shared by the ops' tests: values against expected ones, and an
 * analytic gradient against central finite differences of a scalar loss. */
#ifndef TRAINC_TESTS_OP_CHECKS_H
#define TRAINC_TESTS_OP_CHECKS_H

#include <stddef.h>

/* got[i] within tol * (1 + |want[i]|) of want[i], for every i. */
void check_values(const char *what, const float *got, const double *want, size_t n, double tol);
/* got against a double-precision want: the relative L2 error within tol (NaN fails), printed. */
void check_rel_l2(const char *what, const float *got, const double *want, size_t n, double tol);

typedef double (*LossFn)(void *ctx);

/* d loss / d param[i] by central differences. The divisor is the perturbation
 * actually made, (p + eps) - (p - eps) in float, not 2 eps. */
void numeric_gradient(float *param, size_t n, float eps, LossFn loss, void *ctx, double *grad);

/* The analytic gradient must match the numeric one to 1e-2 in norm and in every
 * element relative to the largest. Float32 rounding in the forward puts the
 * numeric gradient off by ~1e-4 relative; an indexing or formula bug is off by
 * O(1). */
void check_gradient(const char *what, const float *analytic, const double *numeric, size_t n);

/* sum_i y[i] * r[i] in double: the scalar loss whose gradient wrt y is r. */
double weighted_sum(const float *y, const float *r, size_t n);

#endif
