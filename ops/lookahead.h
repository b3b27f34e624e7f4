/* Lookahead on a schedule (the CIFAR-10 speed runs' weight averaging): a slow
 * copy of the parameters (and of the batch norms' running statistics) that,
 * every 'every' optimizer steps, moves towards the trained (fast) values and
 * is then taken by the net:
 *   a    = alpha * (c / total)^power    after step c (1-based) when c % every == 0
 *   a    = 1                             after the last step, c == total
 *   slow = a * slow + (1 - a) * fast,  fast = slow
 * and nothing at the other steps (tools/torch_airbench.py's lookahead_alpha).
 * c is read on the device from the step counter lr_schedule_step advances
 * before the optimizer (after step s it holds s + 1), so a captured CUDA
 * graph follows the schedule with no host work. fast_half (NULL: none) is
 * the rounded copy of fast the layers read under AMP, refreshed with it. */
#ifndef TRAINC_OPS_LOOKAHEAD_H
#define TRAINC_OPS_LOOKAHEAD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/op_context.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t every;  /* > 0 */
    int64_t total;  /* the run's optimizer steps, > 0 */
    float alpha, power;
} LookaheadParams;

/* The face (op_context.h): slow and fast fp32 and fast_half of ctx->dtype, all
 * in ctx's device memory with the step counter. */
void lookahead_step(const OpContext *ctx, const int64_t *step_counter, LookaheadParams p, float *slow, float *fast,
                    void *fast_half, size_t n);

/* ---- The paths the face picks; tests call them to compare ---------------- */

void lookahead_step_cpu(const int64_t *step_counter, LookaheadParams p, float *slow, float *fast, size_t n);
void lookahead_step_cuda(DType half_dtype, const int64_t *step_counter_dev, LookaheadParams p, float *slow,
                         float *fast, void *fast_half, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

/* a after step c, or -1 where there is no update: one definition for the
 * host (lookahead.c) and the device (lookahead.cu). */
#ifdef __CUDACC__
#define LOOKAHEAD_HOST_DEVICE __host__ __device__
#else
#define LOOKAHEAD_HOST_DEVICE
#endif

static inline LOOKAHEAD_HOST_DEVICE float lookahead_weight(LookaheadParams p, int64_t c) {
    if (c == p.total) return 1.0f;
    if (c <= 0 || c > p.total || c % p.every) return -1.0f;
    return (float)(p.alpha * pow((double)c / (double)p.total, (double)p.power));
}

#endif
