/* Learning-rate schedules, evaluated from a step counter so that the CUDA path
 * can compute the lr on the device: a CUDA graph that replays the training step
 * (lr_schedule_step_cuda, then the optimizer reading lr_dev) follows the
 * schedule with no host involvement.
 *
 * lr(step) is the rate used by optimizer step number 'step' (0-based), in
 * double, rounded once to float. W = warmup_steps, T = total_steps, f =
 * warmup_start_factor, base = base_lr.
 *
 *   warm-up (constant, cosine, step), step < W: base * (f + (1 - f) * step / W)
 *     (PyTorch's LinearLR(start_factor=f, total_iters=W) stepped per optimizer
 *     step, closed form)
 *   LR_CONSTANT, step >= W: base
 *   LR_COSINE, step >= W: with t = step - W, P = T - W,
 *     final_lr + (base - final_lr) * (1 + cos(pi * t / P)) / 2 while t < P, then final_lr
 *     (CosineAnnealingLR(T_max=P, eta_min=final_lr) after the warm-up, as
 *     SequentialLR([LinearLR, CosineAnnealingLR], milestones=[W]) gives it, closed form)
 *   LR_STEP, step >= W: base * gamma^floor((step - W) / step_size)  (StepLR; T unused)
 *   LR_LINEAR, step >= W: with t = step - W, P = T - W,
 *     base + (final_lr - base) * t / P while t < P, then final_lr: with the
 *     warm-up, a triangle from f * base up to base and down to final_lr
 *     (LinearLR(start_factor=f) then LinearLR(1, final_lr / base, P) under
 *     SequentialLR, closed form)
 *   LR_ONECYCLE: PyTorch's OneCycleLR(max_lr=base, total_steps=T, pct_start=W/T,
 *     anneal_strategy='cos', div_factor=D, final_div_factor=F, three_phase=False),
 *     D = div_factor or 25, F = final_div_factor or 1e4 when those are 0:
 *       initial = base / D, min = initial / F, anneal(a, b, p) = b + (a - b) * (1 + cos(pi p)) / 2
 *       step <= W - 1:  anneal(initial, base, step / (W - 1))
 *       otherwise:      anneal(base, min, (step - (W - 1)) / (T - W))
 *     so lr(0) = initial, lr(W - 1) = base, lr(T - 1) = min. (With W = 0 the
 *     second line holds from step 0, as in PyTorch with pct_start = 0.) f and
 *     final_lr are unused. PyTorch refuses steps past T; here the lr holds min.
 *     Only the lr: OneCycleLR's momentum cycling is not done (compare with
 *     cycle_momentum=False).
 * Every schedule holds its final value past T (cosine, onecycle, linear).
 * Invalid settings (W = 1 or T <= W for onecycle, T < W for cosine or linear, step_size <
 * 1 for step, f outside [0, 1], negative counts) stop the program with a message
 * from lr_schedule_check, which every host entry point calls. */
#ifndef TRAINC_OPS_LR_SCHEDULE_H
#define TRAINC_OPS_LR_SCHEDULE_H

#include <math.h>
#include <stdint.h>

#include "ops/op_context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { LR_CONSTANT = 0, LR_COSINE, LR_ONECYCLE, LR_STEP, LR_LINEAR } LrScheduleKind;

typedef struct {
    LrScheduleKind kind;
    float base_lr;             /* the lr after warm-up; OneCycleLR's max_lr */
    long warmup_steps;         /* W */
    long total_steps;          /* T: cosine and onecycle */
    float warmup_start_factor; /* f */
    float final_lr;            /* cosine's eta_min, linear's end */
    float div_factor;          /* onecycle; 0 = 25 */
    float final_div_factor;    /* onecycle; 0 = 1e4 */
    long step_size;            /* step */
    float gamma;               /* step */
} LrSchedule;

void lr_schedule_check(const LrSchedule *s);
/* Host: the lr of optimizer step 'step', for logging and the CPU path. */
float lr_schedule_at(const LrSchedule *s, long step);

/* The face (op_context.h): writes the lr for *step_counter into *lr_out, then
 * increments *step_counter; both in ctx's device memory. */
void lr_schedule_step(const OpContext *ctx, const LrSchedule *s, int64_t *step_counter, float *lr_out);

/* ---- The paths the face picks; tests call them to compare ---------------- */

/* Writes the lr for *step_counter into *lr_out, then increments *step_counter. */
void lr_schedule_step_cpu(const LrSchedule *s, int64_t *step_counter, float *lr_out);
/* The same on the device, one single-thread kernel on 'stream': reads
 * *step_counter_dev, writes *lr_dev, increments *step_counter_dev. The schedule
 * is passed by value, so a captured graph keeps the one given at capture. */
void lr_schedule_step_cuda(const LrSchedule *s, int64_t *step_counter_dev, float *lr_dev,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif

/* The formula above, in double, compiled for the host (lr_schedule.c) and the
 * device (lr_schedule.cu) from this one definition. s must have passed
 * lr_schedule_check. */
#ifdef __CUDACC__
#define LR_SCHEDULE_HOST_DEVICE __host__ __device__
#else
#define LR_SCHEDULE_HOST_DEVICE
#endif

static inline LR_SCHEDULE_HOST_DEVICE double lr_schedule_anneal_cos(double from, double to,
                                                                    double pct) {
    return to + (from - to) / 2.0 * (cos(3.14159265358979323846 * pct) + 1.0);
}

static inline LR_SCHEDULE_HOST_DEVICE double lr_schedule_value(const LrSchedule *s, long step) {
    double base = s->base_lr;
    long w = s->warmup_steps, t = s->total_steps;
    if (step < 0) step = 0;
    if (s->kind == LR_ONECYCLE) {
        double initial = base / (s->div_factor > 0 ? s->div_factor : 25.0);
        double min_lr = initial / (s->final_div_factor > 0 ? s->final_div_factor : 1e4);
        if (step >= t - 1) return min_lr;
        if (step <= w - 1) return lr_schedule_anneal_cos(initial, base, (double)step / (double)(w - 1));
        return lr_schedule_anneal_cos(base, min_lr, (double)(step - (w - 1)) / (double)(t - w));
    }
    if (step < w) {
        double f = s->warmup_start_factor;
        return base * (f + (1.0 - f) * (double)step / (double)w);
    }
    switch (s->kind) {
    case LR_COSINE: {
        long since = step - w, span = t - w;
        if (since >= span) return s->final_lr;
        double fin = s->final_lr;
        return fin + (base - fin) * (1.0 + cos(3.14159265358979323846 * (double)since / (double)span)) / 2.0;
    }
    case LR_STEP: return base * pow((double)s->gamma, (double)((step - w) / s->step_size));
    case LR_LINEAR: {
        long since = step - w, span = t - w;
        if (since >= span) return s->final_lr;
        return base + ((double)s->final_lr - base) * (double)since / (double)span;
    }
    default: return base;
    }
}

#endif
