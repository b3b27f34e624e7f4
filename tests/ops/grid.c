/* The grid's driver: its op table, the cases each op runs, and the helpers
 * the op files share. Usage: test_ops [NAME...] (no name: every op). */
#include "tests/ops/grid.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cast.h"
#include "runtime/gpu.h"

/* The op table: one line per op, its GridOp in tests/ops/NAME.c. */
#define GRID_OPS(X) \
    X(relu) \
    X(gelu) \
    X(silu) \
    X(dropout) \
    X(concat) \
    X(scale) \
    X(linear) \
    X(maxpool) \
    X(conv2d) \
    X(conv_bias_grad) \
    X(conv_bias_gelu) \
    X(conv_bias_act) \
    X(conv_genstats) \
    X(conv_dgrad_dbn) \
    X(softmax_xent) \
    X(accuracy) \
    X(cast) \
    X(loss_scaler) \
    X(sgd) \
    X(adamw) \
    X(grad_norm) \
    X(bias_relu) \
    X(bias_relu_pool) \
    X(conv_bias_relu_pool) \
    X(gemm) \
    X(train_step) \
    X(batchnorm) \
    X(add) \
    X(avgpool) \
    X(lr_schedule) \
    X(freeze_after) \
    X(lookahead) \
    X(muon) \
    X(space_to_depth) \
    /* end of the table */

#define GRID_DECLARE(name) extern const GridOp grid_op_##name;
GRID_OPS(GRID_DECLARE)
#define GRID_ENTRY(name) &grid_op_##name,
static const GridOp *const grid_ops[] = {GRID_OPS(GRID_ENTRY)};

/* The bounds, from the op tests the grid replaced (they held on H100 and
 * H200). Inputs are rounded to the dtype on the host first and the reference
 * rounds where the device does, so what remains is the device's own
 * arithmetic. f16 has an 11-bit significand (a rounding is off by at most
 * 4.9e-4), bf16 an 8-bit one (3.9e-3); a wrong layout, a lost bias or an
 * overwritten accumulator is off by tens of percent. */
/* A selection or a copy (ReLU, max-pool, bias + ReLU, casts): the same values. */
const GridBound GRID_EXACT = {0, 0, 0};
/* fp32: only the summation order differs; halves: one or two roundings of a
 * result accumulated in fp32. */
const GridBound GRID_GEMM = {1e-5, 3e-3, 1.5e-2};
/* fp32 (TF32 off): FFT or Winograd is close to, not equal to, the direct sum. */
const GridBound GRID_CONV = {1e-4, 5e-3, 2e-2};
/* dlogits rounded from a float that differs from the reference's in its last bits. */
const GridBound GRID_SOFTMAX = {1e-5, 1e-3, 5e-3};
const GridBound GRID_BIAS_GRAD = {1e-5, 1e-3, 8e-3};
/* An optimizer step keeps fp32 master weights whatever the gradients' type:
 * sgd.c bounds them as fp32 (1e-6, the momentum 1e-5: fused multiply-adds, a
 * rounding apart per step). */

double grid_bound(const GridCase *c, GridBound b) {
    return c->dtype == DTYPE_F16 ? b.f16 : c->dtype == DTYPE_BF16 ? b.bf16 : b.f32;
}

void grid_check(const GridCase *c, const char *what, const float *got, const float *want, size_t n, double bound) {
    double err = test_rel_error(got, want, n);
    printf("  %-20s %-52s rel err %.2e (bound %.1e)\n", c->name, what, err, bound);
    CHECK_MSG(err <= bound, "%s %s: relative error %.3g > %.3g", c->name, what, err, bound);
}

void grid_check_sums(const GridCase *c, const char *what, const float *got, const float *want,
                     const double *magnitude, int k, double bound) {
    double num = 0, den = 0;
    for (int ch = 0; ch < k; ch++) {
        double d = (double)got[ch] - want[ch];
        num += isnan(d) ? INFINITY : d * d;
        den += magnitude[ch] * magnitude[ch];
    }
    double err = den > 0 ? sqrt(num / den) : sqrt(num); /* terms all 0: the sums must be 0 */
    printf("  %-20s %-52s rel err %.2e (bound %.1e)\n", c->name, what, err, bound);
    CHECK_MSG(err <= bound, "%s %s: relative error %.3g > %.3g", c->name, what, err, bound);
}

void grid_check_same(const GridCase *c, const char *what, const void *got, const void *want, size_t bytes) {
    CHECK_MSG(memcmp(got, want, bytes) == 0, "%s %s: not the same bits", c->name, what);
}

void grid_check_kept(const GridCase *c, const char *what, const void *buf, const void *before, size_t bytes) {
    void *now = grid_get_bytes(c, buf, bytes);
    grid_check_same(c, what, now, before, bytes);
    free(now);
}

float *grid_random(const GridCase *c, DType dt, size_t n, float lo, float hi) {
    float *p = host_floats(n);
    test_fill_uniform(p, n, c->rng, lo, hi);
    round_to(dt, p, n);
    return p;
}

float *grid_accumulator_start(const GridCase *c, DType dt, const float *added, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)added[i] * added[i];
    float size = n ? (float)sqrt(sum / n) : 0;
    return grid_random(c, dt, n, -size, size);
}

int32_t *grid_random_labels(const GridCase *c, int n, int classes) {
    int32_t *labels = host_bytes(sizeof(int32_t) * (n ? n : 1));
    for (int i = 0; i < n; i++) {
        labels[i] = (int32_t)(test_uniform(c->rng, 0, 1) * classes);
        if (labels[i] >= classes) labels[i] = classes - 1;
    }
    return labels;
}

float *grid_shuffled_distinct(uint64_t *rng, size_t n, float gap) {
    float *p = host_floats(n);
    for (size_t i = 0; i < n; i++) p[i] = ((float)i - (float)n / 2) * gap;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(test_uniform(rng, 0, 1) * i);
        if (j >= i) j = i - 1;
        float t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
    }
    return p;
}

void grid_fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

float *grid_random_shares(uint64_t *rng, size_t n) {
    static const float shares[4] = {0.0f, 0.5f, 1.0f, 64.0f};
    float *share = host_floats(n);
    for (size_t i = 0; i < n; i++) share[i] = shares[(int)test_uniform(rng, 0.0f, 3.99f)];
    return share;
}

uint8_t *grid_random_mask(uint64_t *rng, size_t n) {
    uint8_t *mask = host_bytes(n);
    for (size_t i = 0; i < n; i++) mask[i] = test_uniform(rng, 0, 1) < 0.5f ? 0 : (uint8_t)(1 + i % 7);
    return mask;
}

static void *grid_bytes(const GridCase *c, size_t bytes) {
    return c->device == DEVICE_CPU ? host_bytes(bytes) : dev_bytes(bytes);
}

void *grid_put_bytes(const GridCase *c, const void *host, size_t bytes) {
    void *p = grid_bytes(c, bytes);
    op_copy_from_host(&c->ctx, p, host, bytes);
    op_sync(&c->ctx);
    return p;
}

void *grid_get_bytes(const GridCase *c, const void *buf, size_t bytes) {
    void *p = host_bytes(bytes);
    op_copy_to_host(&c->ctx, p, buf, bytes);
    op_sync(&c->ctx);
    return p;
}

void grid_set(const GridCase *c, DType dt, void *buf, const float *host, size_t n) {
    void *bits = host_bytes(n * dtype_size(dt));
    cast_from_f32_cpu(dt, host, bits, n);
    op_copy_from_host(&c->ctx, buf, bits, n * dtype_size(dt));
    op_sync(&c->ctx);
    free(bits);
}

void *grid_put(const GridCase *c, DType dt, const float *host, size_t n) {
    void *p = grid_bytes(c, n * dtype_size(dt));
    grid_set(c, dt, p, host, n);
    return p;
}

float *grid_get(const GridCase *c, DType dt, const void *buf, size_t n) {
    void *bits = grid_get_bytes(c, buf, n * dtype_size(dt));
    float *p = host_floats(n);
    cast_to_f32_cpu(dt, bits, p, n);
    free(bits);
    return p;
}

void grid_poison(const GridCase *c, DType dt, void *buf, size_t n) { op_fill(&c->ctx, buf, 0xff, n * dtype_size(dt)); }

void *grid_alloc_bytes(const GridCase *c, size_t bytes) {
    void *p = grid_bytes(c, bytes);
    op_fill(&c->ctx, p, 0xff, bytes);
    return p;
}

void *grid_alloc(const GridCase *c, DType dt, size_t n) { return grid_alloc_bytes(c, n * dtype_size(dt)); }

void grid_free(const GridCase *c, void *buf) {
    if (!buf) return;
    if (c->device == DEVICE_CPU) free(buf);
    else gpu_free(buf);
}

void grid_free_all(const GridCase *c, void **bufs, size_t count) {
    for (size_t i = 0; i < count; i++) grid_free(c, bufs[i]);
}

void host_free_all(void **bufs, size_t count) {
    for (size_t i = 0; i < count; i++) free(bufs[i]);
}

float *grid_to_layout(const GridCase *c, const float *nchw, int n, int ch, int h, int w) {
    return c->nhwc ? to_nhwc(nchw, n, ch, h, w, ch) : copy_floats(nchw, (size_t)n * ch * h * w);
}

float *grid_from_layout(const GridCase *c, const float *x, int n, int ch, int h, int w) {
    return c->nhwc ? to_nchw(x, n, ch, h, w) : copy_floats(x, (size_t)n * ch * h * w);
}

float *grid_get_nchw(const GridCase *c, const void *buf, int n, int ch, int h, int w) {
    float *t = grid_get(c, c->dtype, buf, (size_t)n * ch * h * w), *nchw = grid_from_layout(c, t, n, ch, h, w);
    free(t);
    return nchw;
}

/* ---- the driver ------------------------------------------------------------- */

static const GridOp *find_op(const char *name) {
    for (size_t i = 0; i < GRID_COUNT(grid_ops); i++)
        if (strcmp(grid_ops[i]->name, name) == 0) return grid_ops[i];
    return NULL;
}

static void run_case(const GridOp *op, DeviceKind device, DType dt, int nhwc, int fused, const GpuContext *g,
                     uint64_t *rng) {
    GridCase c;
    memset(&c, 0, sizeof c);
    c.device = device, c.dtype = dt, c.nhwc = nhwc, c.fused = fused, c.rng = rng;
    c.gpu = device == DEVICE_CUDA ? g : NULL;
    c.ctx = device == DEVICE_CUDA ? op_context_gpu(g, dt, nhwc) : op_context_cpu();
    c.ctx.nhwc = nhwc;
    const char *variant = op->fused_names ? op->fused_names[fused] : fused ? "fused" : "unfused";
    snprintf(c.name, sizeof c.name, "%s %s %s%s%s", device_name(device), dtype_name(dt), nhwc ? "nhwc" : "nchw",
             op->fused ? " " : "", op->fused ? variant : "");
    printf("%s %s\n", op->name, c.name);
    op->run(&c);
}

/* Every case of op: the CPU's, then the GPU's (or the reason they are
 * skipped). Returns how many ran. */
static int run_op(const GridOp *op, const GpuContext *g, uint64_t *rng) {
    static const DType types[3] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    int ran = 0, skipped = 0;
    if (op->extras) {
        printf("%s: properties beyond the reference (cpu)\n", op->name);
        op->extras(rng);
        ran++;
    }
    for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int fused = 0; fused <= op->fused; fused++) {
            if (op->cpu_layouts & (nhwc ? GRID_NHWC : GRID_NCHW)) {
                run_case(op, DEVICE_CPU, DTYPE_F32, nhwc, fused, g, rng);
                ran++;
            }
            for (int t = 0; t < 3; t++) {
                if (!(op->cuda_types & (1u << types[t])) || !(op->cuda_layouts & (nhwc ? GRID_NHWC : GRID_NCHW)))
                    continue;
                if (!g) {
                    skipped++;
                    continue;
                }
                run_case(op, DEVICE_CUDA, types[t], nhwc, fused, g, rng);
                ran++;
            }
        }
    if (skipped) printf("%s: %d cuda cases skipped: no GPU\n", op->name, skipped);
    if (op->skipped) printf("%s: not in the grid: %s\n", op->name, op->skipped);
    return ran;
}

int main(int argc, char **argv) {
    const GridOp *chosen[GRID_COUNT(grid_ops)];
    int count = 0;
    for (int i = 1; i < argc; i++) {
        const GridOp *op = find_op(argv[i]);
        if (!op) {
            fprintf(stderr, "test_ops: no op '%s' in the grid; the ops are:", argv[i]);
            for (size_t j = 0; j < GRID_COUNT(grid_ops); j++) fprintf(stderr, " %s", grid_ops[j]->name);
            fputc('\n', stderr);
            return 1;
        }
        if (count < (int)GRID_COUNT(chosen)) chosen[count++] = op;
    }
    if (argc == 1)
        for (size_t j = 0; j < GRID_COUNT(grid_ops); j++) chosen[count++] = grid_ops[j];

    uint64_t rng = test_seed();
    GpuContext g;
    int have_gpu = test_have_gpu();
    if (have_gpu) gpu_context_init(&g, 0);
    int ran = 0;
    for (int i = 0; i < count; i++) ran += run_op(chosen[i], have_gpu ? &g : NULL, &rng);
    if (have_gpu) gpu_context_destroy(&g);
    if (ran == 0) test_skip("no GPU, and no CPU case in %s", argc == 2 ? argv[1] : "these ops");

    char name[64];
    snprintf(name, sizeof name, "test_op%s%s", argc == 2 ? "_" : "s", argc == 2 ? argv[1] : "");
    return test_finish(name);
}
