/* trainc profile's report (profile.h): the per-layer table, the diagnosis
 * and the memory split, printed from a filled ProfileReport. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trainer/profile.h"

/* ---- the report ---------------------------------------------------------------- */

/* FLOPs per byte above which a layer counts as compute-bound: a nominal ridge
 * point (a GPU's fp16 tensor cores against its HBM, a CPU core's FMA units
 * against DRAM), not the card's measured peaks. */
static double ridge(const ProfileReport *r) { return r->gpu ? 50.0 : 10.0; }

static void print_layers(const ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    const char *rate = r->gpu ? "TFLOP/s" : "GFLOP/s";
    double scale = r->gpu ? 1e12 : 1e9;
    fprintf(f, "== per layer: ms per step over steps %ld..%ld (%s), FLOPs and bytes from the shapes "
            "(backward counted as twice forward) ==\n", r->first, r->last,
            r->gpu ? "device time between a cudaEvent pair per op on the compute stream" : "host time per op");
    fprintf(f, "%-14s %-44s %-18s %9s %9s %6s %10s %10s %8s %8s\n", "layer", "ops", "output", "fwd ms", "bwd ms",
            "share", "GFLOP", "MB", rate, "GB/s");
    for (int i = 0; i < r->n_layers; i++) {
        const ProfileLayer *l = &r->layers[i];
        char shape[40];
        snprintf(shape, sizeof shape, "%dx%dx%dx%d", l->n, l->c, l->h, l->w);
        double ms = l->forward_ms + l->backward_ms, flops = l->forward_flops + l->backward_flops,
               bytes = l->forward_bytes + l->backward_bytes;
        fprintf(f, "%-14s %-44.44s %-18s %9.4f %9.4f %5.1f%% %10.4f %10.3f %8.2f %8.2f\n", l->name, l->ops, shape,
                l->forward_ms, l->backward_ms, 100 * ms / s->step_ms, flops / 1e9, bytes / 1e6,
                ms > 0 ? flops / (ms / 1000) / scale : 0, ms > 0 ? bytes / (ms / 1000) / 1e9 : 0);
    }
    fprintf(f, "layers together %.4f ms of the %.4f ms step (%.1f%%; the step: wall time of a timed step); "
            "outside the layers %.4f ms (input copy, loss, zeroing, optimizer ops); the rest %.4f ms is host "
            "work between ops (data wait, launches, syncs)\n", r->layers_ms, s->step_ms,
            100 * r->layers_ms / s->step_ms, r->outside_ms, s->step_ms - r->layers_ms - r->outside_ms);
    if (r->dropped) fprintf(f, "warning: %ld ops past the event pool were not timed\n", r->dropped);
}

typedef struct {
    const char *what, *from, *switches;
    double ms;
} Finding;

static int by_ms_desc(const void *a, const void *b) {
    double x = ((const Finding *)a)->ms, y = ((const Finding *)b)->ms;
    return (x < y) - (x > y);
}

/* The layers' time, split by arithmetic intensity against the nominal ridge. */
static void bound_times(const ProfileReport *r, double *memory_ms, double *compute_conv_ms) {
    *memory_ms = *compute_conv_ms = 0;
    for (int i = 0; i < r->n_layers; i++) {
        const ProfileLayer *l = &r->layers[i];
        double intensity = (l->forward_flops + l->backward_flops) / (l->forward_bytes + l->backward_bytes);
        if (intensity < ridge(r)) *memory_ms += l->forward_ms + l->backward_ms;
        else if (!strncmp(l->name, "conv", 4)) *compute_conv_ms += l->forward_ms + l->backward_ms;
    }
}

static void print_diagnosis(ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    double phases = s->phase_data_wait_ms + s->phase_input_ms + s->phase_forward_ms + s->phase_backward_ms +
                    s->phase_optimizer_ms;
    const char *dev = r->gpu ? "device time between events on the compute stream" : "host time";
    Finding phase[] = {
        {"data wait", "host time in loader_next", "data.workers, data.pinned, data.async_copy, data.transform_on",
         s->phase_data_wait_ms},
        {"input", dev, "data.async_copy, data.pinned, data.transform_on", s->phase_input_ms},
        {"forward", dev, "see the layer lines below", s->phase_forward_ms},
        {"backward", dev, "see the layer lines below", s->phase_backward_ms},
        {"optimizer", dev, "train.batch (the same update for more samples)", s->phase_optimizer_ms},
        {"outside the phases", "step wall time less the phases: host syncs, read-backs, log points",
         "train.sync_after_step, train.read_loss_every, run.log_every", fmax(0, s->step_ms - phases)},
    };
    enum { N_PHASES = sizeof phase / sizeof *phase };
    qsort(phase, N_PHASES, sizeof *phase, by_ms_desc);
    r->top_phase = phase[0].what;
    fprintf(f, "\n== diagnosis: the step's phases (the trainer's phase timing over the same steps), largest first "
            "==\n");
    for (int i = 0; i < N_PHASES; i++)
        fprintf(f, "%d. %-19s %9.4f ms %5.1f%%  measured as %s; switches: %s\n", i + 1, phase[i].what, phase[i].ms,
                100 * phase[i].ms / s->step_ms, phase[i].from, phase[i].switches);
    double memory_ms, compute_ms, mean_op_ms = r->n_ops ? (r->layers_ms + r->outside_ms) * (r->last - r->first + 1) / r->n_ops : 0;
    bound_times(r, &memory_ms, &compute_ms);
    fprintf(f, "layers under %.0f FLOP/byte (memory-bound by their shapes; a nominal ridge, not measured peaks): "
            "%.4f ms (%.1f%%); switches: model.fuse, model.layout, precision.amp\n", ridge(r), memory_ms,
            100 * memory_ms / s->step_ms);
    fprintf(f, "convolutions at or over it (compute-bound): %.4f ms (%.1f%%); switches: precision.amp, "
            "model.layout\n", compute_ms, 100 * compute_ms / s->step_ms);
    fprintf(f, "ops: %.1f per step, mean %.1f us%s\n", (double)r->n_ops / (r->last - r->first + 1),
            1000 * mean_op_ms,
            r->gpu && mean_op_ms < 0.02 ? ": launch-bound small ops; switches: train.batch, perf.cuda_graph" : "");
    fprintf(f, "perf.cuda_graph was off while profiling (events per op cannot be timed inside a replayed graph); "
            "a run with it on gives the graph's step time (trainc --set perf.cuda_graph=on)\n");
}

static void print_memory(const ProfileReport *r, FILE *f) {
    const ProfileMemory *m = &r->memory;
    double mib = 1024.0 * 1024.0;
    fprintf(f, "\n== memory: the arenas' high-water mark %.2f MiB (model and trainer buffers) ==\n", m->peak / mib);
    fprintf(f, "weights %.2f MiB (fp32 master%s), gradients %.2f, optimizer state %.2f, activations %.2f, "
            "activation gradients %.2f, workspace %.2f, other %.2f (batch-norm statistics, the trainer's "
            "buffers, alignment)\n", m->weights / mib, r->summary.loss_scale == r->summary.loss_scale ?
            " and half copy" : "", m->gradients / mib, m->optimizer / mib, m->activations / mib,
            m->activation_grads / mib, m->workspace / mib, m->other / mib);
}

void profile_print(ProfileReport *r, FILE *f) {
    print_layers(r, f);
    profile_kernels_print(r, f);
    print_diagnosis(r, f);
    print_memory(r, f);
}
