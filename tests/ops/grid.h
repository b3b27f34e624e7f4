/* The op test grid, in the manner of ggml's test-backend-ops: every op runs on
 * the CPU and the GPU, in f32, f16 and bf16, NCHW and NHWC, fused and unfused
 * where it has both, through its face (ops/op_context.h), and each case is
 * checked against the CPU fp32 reference with a bound per precision. On the
 * CPU the backward is also checked by central finite differences.
 *
 * One file per op (tests/ops/NAME.c) defines a GridOp grid_op_NAME, listed
 * once in grid.c's GRID_OPS; one binary runs them: `test_ops NAME...` (ctest:
 * test_op_NAME). GPU cases print why they are skipped where there is no GPU;
 * the CPU cases run anyway. */
#ifndef TRAINC_TESTS_OPS_GRID_H
#define TRAINC_TESTS_OPS_GRID_H

#include <stddef.h>
#include <stdint.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"
#include "tests/harness.h"
#include "tests/op_buffers.h"
#include "tests/op_checks.h"

/* One point of the grid. ctx runs the op there (on the CPU: float32, and
 * nhwc only for ops whose CPU path takes it). */
typedef struct {
    DeviceKind device;
    DType dtype;
    int nhwc;
    int fused;
    OpContext ctx;
    const GpuContext *gpu; /* NULL on the CPU */
    uint64_t *rng;         /* from test_seed() */
    char name[48];         /* "cuda bf16 nhwc fused" */
} GridCase;

/* What an op's CUDA and CPU paths take, as bit sets. */
enum { GRID_F32 = 1 << DTYPE_F32, GRID_F16 = 1 << DTYPE_F16, GRID_BF16 = 1 << DTYPE_BF16 };
#define GRID_ALL_TYPES (GRID_F32 | GRID_F16 | GRID_BF16)
enum { GRID_NCHW = 1, GRID_NHWC = 2, GRID_BOTH_LAYOUTS = 3 };

/* A row of the grid's op table. */
typedef struct {
    const char *name;
    void (*run)(const GridCase *c);  /* one case: forward and backward against the reference */
    void (*extras)(uint64_t *rng);   /* once, on the CPU: what is not "matches the reference"
                                      * (hand-computed values, aliasing, flags); may be NULL */
    unsigned cuda_types;             /* GRID_* dtypes of the CUDA path; 0: no CUDA path */
    unsigned cuda_layouts;           /* GRID_NCHW / GRID_NHWC */
    unsigned cpu_layouts;            /* the CPU path: NCHW, a few also NHWC; 0: no CPU path */
    int fused;                       /* N: cases run unfused and with N fused variants (c->fused 0..N) */
    const char *const *fused_names;  /* the variants' names, [0] unfused; NULL: "unfused", "fused" */
    const char *skipped;             /* the combinations left out and why */
} GridOp;

/* Relative L2 bounds of a GPU result against the CPU fp32 reference, the
 * reference rounded where the device rounds (tests/ops/grid.c says why each). */
typedef struct { double f32, f16, bf16; } GridBound;
extern const GridBound GRID_EXACT;     /* a selection or a copy: the same values */
extern const GridBound GRID_GEMM;      /* cuBLAS products, fp32 accumulation in another order */
extern const GridBound GRID_CONV;      /* cuDNN, which may pick FFT or Winograd */
extern const GridBound GRID_SOFTMAX;   /* softmax in fp32, rounded once */
extern const GridBound GRID_BIAS_GRAD; /* channel sums in fp32, fixed order */
/* The bound for c's dtype (the CPU's is f32: an accumulator's start value
 * added in another order is a rounding apart). */
double grid_bound(const GridCase *c, GridBound b);

/* got against want, relative L2 (NaN anywhere fails), printed with c's name. */
void grid_check(const GridCase *c, const char *what, const float *got, const float *want, size_t n, double bound);
/* k sums (a bias gradient, a convolution's outputs) against want: the error
 * relative to the size of their terms, magnitude[ch] (the sum of their
 * absolute values), rather than to the sums themselves, which can cancel to
 * near 0. */
void grid_check_sums(const GridCase *c, const char *what, const float *got, const float *want,
                     const double *magnitude, int k, double bound);
/* The same bytes (bit for bit). */
void grid_check_same(const GridCase *c, const char *what, const void *got, const void *want, size_t bytes);
/* The bytes of buf on c's device are still those of before (host), bit for bit. */
void grid_check_kept(const GridCase *c, const char *what, const void *buf, const void *before, size_t bytes);

/* Host values: n uniform in [lo, hi), rounded to dt (f32: as drawn). */
float *grid_random(const GridCase *c, DType dt, size_t n, float lo, float hi);
/* Start values for an accumulator, about the size of what is added to it, so
 * one that was overwritten instead is off by ~70%; rounded to dt. */
float *grid_accumulator_start(const GridCase *c, DType dt, const float *added, size_t n);
int32_t *grid_random_labels(const GridCase *c, int n, int classes);
/* Distinct values 'gap' apart in random order: no ties, and no kink within a
 * perturbation smaller than gap / 2. */
float *grid_shuffled_distinct(uint64_t *rng, size_t n, float gap);
void grid_fill_nan(float *x, size_t n);
/* The optimizers' per-parameter inputs (ops/sgd.h): shares of the learning
 * rate as airbench's groups have them (frozen 0, 0.5, the weights' own 1, the
 * BN biases' 64), and a weight-decay mask, half of it 0, the rest 1 to 7. */
float *grid_random_shares(uint64_t *rng, size_t n);
uint8_t *grid_random_mask(uint64_t *rng, size_t n);

/* Buffers on c's device. put: n host floats stored as dt; get: n elements of
 * dt as new host floats; alloc: n elements of dt, every byte 0xff (NaN in
 * f32, f16 and bf16: an element the op does not write shows). */
void *grid_put(const GridCase *c, DType dt, const float *host, size_t n);
float *grid_get(const GridCase *c, DType dt, const void *buf, size_t n);
void grid_set(const GridCase *c, DType dt, void *buf, const float *host, size_t n);
void *grid_alloc(const GridCase *c, DType dt, size_t n);
void *grid_alloc_bytes(const GridCase *c, size_t bytes);
void grid_poison(const GridCase *c, DType dt, void *buf, size_t n);
void *grid_put_bytes(const GridCase *c, const void *host, size_t bytes);
void *grid_get_bytes(const GridCase *c, const void *buf, size_t bytes);
void grid_free(const GridCase *c, void *buf);
void grid_free_all(const GridCase *c, void **bufs, size_t count); /* NULLs skipped */
void host_free_all(void **bufs, size_t count);
#define GRID_COUNT(a) (sizeof(a) / sizeof *(a))

/* An elementwise activation whose backward reads x (GELU, SiLU; tests/ops/grid_activation.c): its cases on
 * n = 4096, 1001 and 1 against the reference (x uniform in +-1.25 range), dx aliasing dy giving the same
 * bits; on the CPU, dx by finite differences (x in +-range) and the face giving the reference's bits. */
typedef struct {
    const char *name;
    void (*forward_cpu)(const float *x, float *y, size_t n);
    void (*backward_cpu)(const float *x, const float *dy, float *dx, size_t n);
    void (*forward)(const OpContext *ctx, const void *x, void *y, size_t n);
    void (*backward)(const OpContext *ctx, const void *x, const void *dy, void *dx, size_t n);
    GridBound bound;
    float range;
} GridActivation;
void grid_activation_case(const GridCase *c, const GridActivation *a);

/* An image tensor [n][ch][h][w] in c's layout (a copy; NHWC when c->nhwc),
 * and back from it to NCHW. */
float *grid_to_layout(const GridCase *c, const float *nchw, int n, int ch, int h, int w);
float *grid_from_layout(const GridCase *c, const float *x, int n, int ch, int h, int w);
/* A device tensor [n][ch][h][w] of c's dtype in c's layout, as new host floats in NCHW. */
float *grid_get_nchw(const GridCase *c, const void *buf, int n, int ch, int h, int w);

#endif
