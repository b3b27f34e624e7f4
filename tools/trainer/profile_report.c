/* trainc profile's report (profile.h): the per-layer table, the diagnosis
 * and the memory split, printed from a filled ProfileReport. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu_monitor.h"
#include "tools/trainer/profile.h"

/* ---- the roofline ------------------------------------------------------------- */

/* The GEMM peak of the run's precision: half with precision.amp, else
 * float32 on TF32 tensor cores with precision.tf32, else float32 on FMA
 * units. Without measured peaks (none measured, TRAINC_PEAKS unset): nominal
 * ones (an H100 SXM's dense tensor cores or FMA units against its HBM; a CPU
 * core's FMA units against DRAM), so that the bound still has a ridge. */
static double measured_flops(const ProfileReport *r) {
    const ProfilePeaks *p = &r->peaks;
    return r->settings.amp ? p->flops_per_s : r->settings.tf32 ? p->flops_tf32_per_s : p->flops_f32_per_s;
}

static int measured_peaks(const ProfileReport *r) { return measured_flops(r) > 0 && r->peaks.bytes_per_s > 0; }

static void peaks_or_nominal(const ProfileReport *r, double *flops, double *bytes) {
    if (measured_peaks(r)) {
        *flops = measured_flops(r), *bytes = r->peaks.bytes_per_s;
        return;
    }
    *flops = !r->gpu ? 50e9 : r->settings.amp ? 989e12 : r->settings.tf32 ? 494e12 : 67e12;
    *bytes = r->gpu ? 3.35e12 : 10e9;
}

static const char *peak_precision(const ProfileReport *r) {
    return r->settings.amp ? "half-precision GEMM" : r->settings.tf32 ? "TF32 GEMM" : "float32 GEMM";
}

ProfileRoofline profile_roofline(const ProfileReport *r, const ProfileLayer *l) {
    double peak, bw, flops = l->forward_flops + l->backward_flops, bytes = l->forward_bytes + l->backward_bytes,
                     ms = l->forward_ms + l->backward_ms;
    peaks_or_nominal(r, &peak, &bw);
    ProfileRoofline p = {0};
    p.intensity = bytes > 0 ? flops / bytes : 0;
    p.attainable = fmin(peak, p.intensity * bw);
    p.achieved = ms > 0 ? flops / (ms / 1000) : 0;
    p.roof_share = p.attainable > 0 ? p.achieved / p.attainable : 0;
    p.compute_bound = p.intensity >= peak / bw;
    return p;
}

/* ---- the per-layer table ------------------------------------------------------- */

/* --graph: no op was timed; the matrix products' FLOPs over the graph's step. */
static void print_graph_step(const ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    double peak, bw, achieved = r->product_flops / (s->step_ms / 1000);
    peaks_or_nominal(r, &peak, &bw);
    fprintf(f, "== per layer: not timed (--graph: steps %ld..%ld replayed as the run's CUDA graph, inside which "
            "events per op cannot be timed; trainc profile without --graph times them eagerly) ==\n", r->first,
            r->last);
    fprintf(f, "the convolutions and linear layers: %.4g GFLOP a step (backward counted as twice forward), %.4g "
            "TFLOP/s over the %.4f ms step, %.1f%% of the %.4g TFLOP/s %s%s\n", r->product_flops / 1e9,
            achieved / 1e12, s->step_ms, 100 * achieved / peak, peak / 1e12, peak_precision(r),
            measured_peaks(r) ? " measured" : " (nominal: no measured peaks)");
}

static void print_layers(const ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    const char *rate = r->gpu ? "TFLOP/s" : "GFLOP/s";
    double scale = r->gpu ? 1e12 : 1e9, peak, bw;
    if (r->graph) {
        print_graph_step(r, f);
        return;
    }
    peaks_or_nominal(r, &peak, &bw);
    fprintf(f, "== per layer: ms per step over steps %ld..%ld (%s), FLOPs and bytes from the shapes "
            "(backward counted as twice forward) ==\n", r->first, r->last,
            r->gpu ? "device time between a cudaEvent pair per op on the compute stream" : "host time per op");
    if (measured_peaks(r))
        fprintf(f, "roofline: %.4g %s (%s) and %.4g GB/s (device copy) measured on %s%s; ridge %.1f FLOP/byte\n",
                peak / scale, rate, peak_precision(r), bw / 1e9, r->peaks.device, r->peaks.from_cache ? " (cached)" : "",
                peak / bw);
    else
        fprintf(f, "roofline: no measured peaks; nominal %.4g %s (%s) and %.4g GB/s, ridge %.1f FLOP/byte\n",
                peak / scale, rate, peak_precision(r), bw / 1e9, peak / bw);
    fprintf(f, "%-14s %-44s %-18s %9s %9s %6s %10s %10s %8s %8s %8s %-7s %6s\n", "layer", "ops", "output", "fwd ms",
            "bwd ms", "share", "GFLOP", "MB", rate, "GB/s", "FLOP/B", "bound", "% roof");
    for (int i = 0; i < r->n_layers; i++) {
        const ProfileLayer *l = &r->layers[i];
        ProfileRoofline p = profile_roofline(r, l);
        char shape[40];
        snprintf(shape, sizeof shape, "%dx%dx%dx%d", l->n, l->c, l->h, l->w);
        double ms = l->forward_ms + l->backward_ms, flops = l->forward_flops + l->backward_flops,
               bytes = l->forward_bytes + l->backward_bytes;
        fprintf(f, "%-14s %-44.44s %-18s %9.4f %9.4f %5.1f%% %10.4f %10.3f %8.2f %8.2f %8.2f %-7s %5.1f%%\n",
                l->name, l->ops, shape, l->forward_ms, l->backward_ms, 100 * ms / s->step_ms, flops / 1e9,
                bytes / 1e6, p.achieved / scale, ms > 0 ? bytes / (ms / 1000) / 1e9 : 0, p.intensity,
                p.compute_bound ? "compute" : "memory", 100 * p.roof_share);
    }
    for (int i = 0; i < r->n_outside; i++)
        fprintf(f, "%-14s %-44.44s %-18s %9.4f %9s %5.1f%%\n", "(no layer)", r->outside[i].op, "", r->outside[i].ms,
                "", 100 * r->outside[i].ms / s->step_ms);
    double ops_ms = r->layers_ms + r->outside_ms;
    fprintf(f, "the rows together %.4f ms of the %.4f ms step (%.1f%%; the step: wall time of a timed step): the "
            "layers %.4f ms (%.1f%%), the ops outside them %.4f ms; the rest %.4f ms is %s between ops (data "
            "wait, launches, syncs)\n", ops_ms, s->step_ms, 100 * ops_ms / s->step_ms, r->layers_ms,
            100 * r->layers_ms / s->step_ms, r->outside_ms, s->step_ms - ops_ms,
            r->gpu ? "the compute stream's time" : "host time");
    if (r->dropped) fprintf(f, "warning: %ld ops past the event pool were not timed\n", r->dropped);
}

/* ---- the findings -------------------------------------------------------------- */

static double finite_or_0(double v) { return isfinite(v) ? v : 0; }

/* The device phases (input, forward, backward, optimizer; graph with perf.cuda_graph). */
static double device_phases_ms(const TrainSummary *s) {
    return finite_or_0(s->phase_input_ms) + finite_or_0(s->phase_forward_ms) + finite_or_0(s->phase_backward_ms) +
           finite_or_0(s->phase_optimizer_ms) + finite_or_0(s->phase_graph_ms);
}

/* What lies between the phases: step wall time less data wait and the device phases. */
static double outside_phases_ms(const TrainSummary *s) {
    return fmax(0, s->step_ms - finite_or_0(s->phase_data_wait_ms) - device_phases_ms(s));
}

/* "key=value" appended to a finding's switches when 'apply' (the switch not already on). */
static void suggest(ProfileFinding *f, int apply, const char *text) {
    if (!apply) return;
    size_t used = strlen(f->switches);
    snprintf(f->switches + used, sizeof f->switches - used, "%s%s", used ? ", " : "", text);
}

typedef struct {
    ProfileFinding *out;
    int n, max;
    double step_ms;
} Findings;

static ProfileFinding *add(Findings *fs, const char *what, double ms, double gain_ms) {
    static ProfileFinding spare; /* past max: filled and dropped */
    ProfileFinding *f = fs->n < fs->max ? &fs->out[fs->n] : &spare;
    memset(f, 0, sizeof *f);
    snprintf(f->what, sizeof f->what, "%s", what);
    f->ms = fmax(0, ms);
    f->share = f->ms / fs->step_ms;
    f->gain_ms = fmin(fmax(0, gain_ms), fs->step_ms);
    if (f->share >= PROFILE_FINDING_MIN_SHARE && fs->n < fs->max) fs->n++;
    return f;
}

/* The data wait, and where the loader threads' time went: reading, decoding,
 * cropping and resampling (the streamed ImageNet recipe's stages). */
static void find_data_wait(const ProfileReport *r, Findings *fs) {
    const ProfileSettings *c = &r->settings;
    const TrainSummary *s = &r->summary;
    double ms = finite_or_0(s->phase_data_wait_ms);
    ProfileFinding *f = add(fs, "data wait", ms, ms);
    double read = finite_or_0(s->data_read_ms), decode = finite_or_0(s->data_decode_ms);
    double augment = finite_or_0(s->data_augment_ms), gpu = finite_or_0(s->data_gpu_decode_ms);
    int streamed = read > 0;
    if (streamed)
        snprintf(f->from, sizeof f->from, "host time in loader_next (data.workers = %d, data.prefetch = %d); the "
                 "threads' work a step: read %.3f, decode %.3f, crop and resample %.3f ms (summed over the threads)%s",
                 c->workers, c->prefetch, read, decode, augment, gpu > 0 ? "; the GPU's decode of a batch" : "");
    else
        snprintf(f->from, sizeof f->from, "host time in loader_next (data.workers = %d, data.prefetch = %d)",
                 c->workers, c->prefetch);
    if (gpu > 0) snprintf(f->from + strlen(f->from), sizeof f->from - strlen(f->from), " %.3f ms", gpu);
    suggest(f, c->workers == 0, "data.workers=8");
    suggest(f, c->workers > 0, "more data.workers");
    suggest(f, c->workers > 0, "data.prefetch");
    suggest(f, streamed && r->gpu && gpu == 0 && c->decode_cpu, "data.decode=gpu");
    suggest(f, streamed && !c->dct_scaling && decode > read, "data.dct_scaling=on");
    suggest(f, streamed && c->folder && read > decode, "data.source=shards (trainc pack)");
    suggest(f, r->gpu && !c->transform_on_gpu && gpu == 0, "data.transform_on=gpu");
}

/* A sync stops the host from queuing the next step's work while the GPU runs
 * this one, so the GPU idles through whatever the host does next (loading,
 * copying, launching). With CUPTI: the GPU's idle time (no record on any
 * stream), as far as the host spent at least as long blocked in sync calls;
 * without it, the host's time between the phases. */
static void find_syncs(const ProfileReport *r, Findings *fs) {
    const ProfileSettings *c = &r->settings;
    const ProfileKernels *k = &r->kernels;
    double between = outside_phases_ms(&r->summary);
    double ms = k->available ? fmin(k->sync_ms, k->idle_ms) : between;
    int syncing = c->sync_after_step || !c->async_copy || (c->read_loss_every > 0 && c->read_loss_every < 100);
    ProfileFinding *f = add(fs, !r->gpu ? "trainer work outside the phases" : syncing ? "host syncs" :
                            "host work between the phases", ms, ms);
    if (k->available)
        snprintf(f->from, sizeof f->from, "CUPTI: the GPU idle %.3f ms per step (no record on any stream) while "
                 "the host blocked %.3f ms in sync calls (stream, event, device syncs, synchronous copies); %.3f ms "
                 "between the phases", k->idle_ms, k->sync_ms, between);
    else
        snprintf(f->from, sizeof f->from, "step wall time less data wait and the device phases");
    if (!r->gpu) return;
    suggest(f, c->sync_after_step, "train.sync_after_step=off");
    suggest(f, c->read_loss_every > 0 && c->read_loss_every < 100, "train.read_loss_every=0");
    suggest(f, !c->async_copy, "data.async_copy=on");
    suggest(f, !syncing && !c->cuda_graph, "perf.cuda_graph=on");
}

/* With CUPTI the copies' time no kernel ran under; else the input phase when
 * the copy is synchronous (data.async_copy off), the copy and a device sync. */
static void find_copies(const ProfileReport *r, Findings *fs) {
    const ProfileSettings *c = &r->settings;
    const ProfileKernels *k = &r->kernels;
    ProfileFinding *f;
    if (k->available) {
        double ms = k->h2d_ms + k->d2h_ms - k->copy_overlap_ms;
        f = add(fs, "copies not overlapped", ms, ms);
        snprintf(f->from, sizeof f->from, "CUPTI: H2D %.3f + D2H %.3f ms per step, %.3f of it under kernels",
                 k->h2d_ms, k->d2h_ms, k->copy_overlap_ms);
    } else {
        double ms = r->gpu && c->async_copy ? 0 : finite_or_0(r->summary.phase_input_ms);
        f = add(fs, r->gpu ? "copies not overlapped" : "input copy", ms, ms);
        snprintf(f->from, sizeof f->from, "%s", r->gpu ? "the input phase: a synchronous copy on the compute "
                 "stream (data.async_copy off; no CUPTI)" : "the input phase (host time)");
    }
    if (!r->gpu) return;
    suggest(f, !c->async_copy, "data.async_copy=on");
    suggest(f, !c->pinned, "data.pinned=on");
    suggest(f, !c->transform_on_gpu, "data.transform_on=gpu");
}

/* The compute stream idle inside the device phases: the GPU waiting for the
 * host to launch the next kernel (or op). */
static double launch_gaps_ms(const ProfileReport *r, double *mean_us, char *from, size_t len) {
    const ProfileKernels *k = &r->kernels;
    double steps = (double)(r->last - r->first + 1), busy;
    if (k->available) {
        busy = k->active_ms;
        *mean_us = k->mean_kernel_us;
        snprintf(from, len, "the device phases less CUPTI's kernel-active time; %.0f kernels per step, mean %.1f "
                 "us; %.3f ms per step in launch calls", k->kernels, k->mean_kernel_us, k->launch_ms);
    } else {
        busy = r->layers_ms + r->outside_ms;
        *mean_us = r->n_ops ? 1000 * busy * steps / r->n_ops : 0;
        snprintf(from, len, "the device phases less the ops' event times (no CUPTI); %.0f ops per step, mean %.1f "
                 "us", r->n_ops / steps, *mean_us);
    }
    return fmax(0, device_phases_ms(&r->summary) - busy);
}

/* Launch-bound: many short kernels leave the GPU waiting on launches. */
static double find_launch_bound(const ProfileReport *r, Findings *fs) {
    const ProfileSettings *c = &r->settings;
    char from[512];
    double mean_us, ms = launch_gaps_ms(r, &mean_us, from, sizeof from);
    if (!r->gpu) return 0;
    ProfileFinding *f = add(fs, mean_us < 20 ? "launch-bound small kernels" : "idle gaps between kernels", ms, ms);
    snprintf(f->from, sizeof f->from, "%s", from);
    suggest(f, !c->cuda_graph, "perf.cuda_graph=on");
    suggest(f, !c->fuse, "model.fuse=on");
    suggest(f, 1, "a larger train.batch");
    return ms;
}

/* What a step costs whatever its batch (host work between the phases, launch
 * gaps, the optimizer): twice the batch halves it per sample, a gain of half
 * of it per step's worth of samples. */
static void find_small_batch(const ProfileReport *r, Findings *fs, double gaps_ms) {
    const TrainSummary *s = &r->summary;
    double fixed = outside_phases_ms(s) + gaps_ms + finite_or_0(s->phase_optimizer_ms);
    if (!r->gpu) return;
    ProfileFinding *f = add(fs, "small batch", fixed, fixed / 2);
    snprintf(f->from, sizeof f->from, "per-step costs that do not grow with the batch of %d: between the phases "
             "%.3f, launch gaps %.3f, optimizer %.3f ms; the gain is doubling the batch's", r->settings.batch,
             outside_phases_ms(s), gaps_ms, finite_or_0(s->phase_optimizer_ms));
    char batch[48];
    snprintf(batch, sizeof batch, "train.batch=%d", 2 * r->settings.batch);
    suggest(f, 1, batch);
}

/* The layers on one side of the ridge: their time, the gain at the roof, and
 * the three longest with their place on the roofline. */
static double layers_at(const ProfileReport *r, int compute, double *gain_ms, int *all_conv, char *where,
                        size_t len) {
    double ms = 0, scale = r->gpu ? 1e12 : 1e9, peak, bw;
    peaks_or_nominal(r, &peak, &bw);
    int top[3] = {-1, -1, -1};
    *gain_ms = 0;
    for (int i = 0; i < r->n_layers; i++) {
        const ProfileLayer *l = &r->layers[i];
        ProfileRoofline p = profile_roofline(r, l);
        double t = l->forward_ms + l->backward_ms, flops = l->forward_flops + l->backward_flops;
        if (p.compute_bound != compute || t <= 0) continue;
        ms += t;
        *all_conv &= strncmp(l->name, "conv ", 5) == 0; /* model.c names a layer by its kind */
        *gain_ms += fmax(0, t - 1000 * flops / p.attainable);
        for (int j = 0; j < 3; j++) {
            const ProfileLayer *o = top[j] >= 0 ? &r->layers[top[j]] : NULL;
            if (o && o->forward_ms + o->backward_ms >= t) continue;
            for (int m = 2; m > j; m--) top[m] = top[m - 1];
            top[j] = i;
            break;
        }
    }
    int n = snprintf(where, len, "layers %s the ridge (%.1f FLOP/byte, %s peaks); the gain is theirs at the roof",
                     compute ? "at or over" : "under", peak / bw, measured_peaks(r) ? "measured" : "nominal");
    for (int j = 0; j < 3 && top[j] >= 0 && n < (int)len; j++) {
        const ProfileLayer *l = &r->layers[top[j]];
        ProfileRoofline p = profile_roofline(r, l);
        n += snprintf(where + n, len - n, "; %s %.3f ms, %.1f FLOP/byte, %.3g of %.3g %s attainable (%.0f%%)",
                      l->name, l->forward_ms + l->backward_ms, p.intensity, p.achieved / scale,
                      p.attainable / scale, r->gpu ? "TFLOP/s" : "GFLOP/s", 100 * p.roof_share);
    }
    return ms;
}

static void find_layers(const ProfileReport *r, Findings *fs) {
    const ProfileSettings *c = &r->settings;
    char where[512];
    int all_conv = 1;
    double gain, ms = layers_at(r, 0, &gain, &all_conv, where, sizeof where);
    ProfileFinding *f = add(fs, all_conv ? "memory-bound convolutions" : "memory-bound layers", ms, gain);
    snprintf(f->from, sizeof f->from, "%s", where);
    suggest(f, r->gpu && !c->fuse, "model.fuse=on");
    suggest(f, r->gpu && !c->amp, "precision.amp=fp16");
    suggest(f, r->gpu && !c->nhwc, "model.layout=nhwc");
    all_conv = 1;
    ms = layers_at(r, 1, &gain, &all_conv, where, sizeof where);
    f = add(fs, all_conv ? "compute-bound convolutions" : "compute-bound layers", ms, gain);
    snprintf(f->from, sizeof f->from, "%s", where);
    suggest(f, r->gpu && !c->amp, "precision.amp=fp16");
    suggest(f, r->gpu && !c->amp && !c->tf32, "precision.tf32=on");
    suggest(f, r->gpu && !c->nhwc, "model.layout=nhwc");
    suggest(f, r->gpu && !c->conv_benchmark, "perf.conv_benchmark=on");
}

static void find_communication(const ProfileReport *r, Findings *fs) {
    const ProfileSettings *c = &r->settings;
    const ProfileKernels *k = &r->kernels;
    if (r->world <= 1 || !k->available) return;
    ProfileFinding *f = add(fs, "communication not hidden", k->comm_exposed_ms, k->comm_exposed_ms);
    snprintf(f->from, sizeof f->from, "CUPTI: %.3f ms per step of all-reduce, %.3f of it with no other kernel "
             "running", k->comm_ms, k->comm_exposed_ms);
    suggest(f, c->bucket_mb == 0, "dist.bucket_mb=25");
    suggest(f, c->bucket_mb > 0, "dist.bucket_mb (smaller: earlier all-reduces)");
    suggest(f, c->copy_engine_off, "dist.copy_engine=auto");
    suggest(f, c->cuda_graph && !c->graph_node_priority, "perf.graph_node_priority=on");
}

/* Convolutions that ran slower in the step than init timed their plans (on
 * random data, perf.conv_benchmark): what cost airbench 0.6 ms a step on an
 * H100 until each layer's filters were aligned (365 us against 204 timed). */
static void find_slow_convs(const ProfileReport *r, Findings *fs) {
    if (!r->gpu) return;
    double excess = 0;
    char where[512] = "";
    int n = 0;
    for (int i = 0; i < r->n_layers; i++) {
        const ProfileLayer *l = &r->layers[i];
        for (int bwd = 0; bwd < 2; bwd++) {
            double ms = bwd ? l->conv_backward_ms : l->conv_forward_ms;
            double runs = bwd ? l->conv_backward_runs : l->conv_forward_runs;
            double timed = bwd ? l->timed_backward_ms : l->timed_forward_ms;
            if (timed <= 0 || runs <= 0 || ms / runs <= PROFILE_SLOW_CONV * timed) continue;
            excess += ms - runs * timed;
            if (n < 3 && strlen(where) < sizeof where - 96)
                snprintf(where + strlen(where), sizeof where - strlen(where), "; %s %s %.3f ms against %.3f timed",
                         l->name, bwd ? "backward" : "forward", ms / runs, timed);
            n++;
        }
    }
    ProfileFinding *f = add(fs, "convolutions slower than timed", excess, excess);
    snprintf(f->from, sizeof f->from, "the step's convolution passes over %.2fx what init timed their plans at on "
             "random data (perf.conv_benchmark); the gain is the step at those times (the tensors' alignment, the "
             "card's clocks)%s", PROFILE_SLOW_CONV, where);
}

static int by_ms_desc(const void *a, const void *b) {
    double x = ((const ProfileFinding *)a)->ms, y = ((const ProfileFinding *)b)->ms;
    return (x < y) - (x > y);
}

int profile_findings(const ProfileReport *r, ProfileFinding *out, int max) {
    ProfileFinding all[PROFILE_MAX_FINDINGS + 2];
    Findings fs = {all, 0, PROFILE_MAX_FINDINGS + 2, r->summary.step_ms > 0 ? r->summary.step_ms : 1};
    find_data_wait(r, &fs);
    find_syncs(r, &fs);
    find_copies(r, &fs);
    double gaps = find_launch_bound(r, &fs);
    find_small_batch(r, &fs, gaps);
    find_layers(r, &fs);
    find_slow_convs(r, &fs);
    find_communication(r, &fs);
    qsort(all, (size_t)fs.n, sizeof *all, by_ms_desc);
    int n = fs.n < max ? fs.n : max;
    for (int i = 0; i < n; i++)
        if (!all[i].switches[0]) snprintf(all[i].switches, sizeof all[i].switches, "%s",
                                          r->gpu ? "none left (all on)" : "none on the CPU");
    memcpy(out, all, (size_t)n * sizeof *out);
    return n;
}

/* ---- the diagnosis ------------------------------------------------------------- */

static void print_utilisation(const ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    if (!r->gpu) {
        fprintf(f, "GPU utilisation: does not apply (the CPU)\n");
        return;
    }
    /* NVML's utilisation is the share of its last sample period (1/6 s to 1 s by the card) with a kernel
     * running: over a shorter window it reads whatever ran before, often 0. */
    char nvml[160];
    double window_s = s->timed_steps * s->step_ms / 1000;
    if (s->gpu_util >= 0 && window_s >= GPU_MONITOR_UTIL_MIN_S) snprintf(nvml, sizeof nvml, "%.0f%%", s->gpu_util);
    else if (s->gpu_util >= 0)
        snprintf(nvml, sizeof nvml, "not measured: the window is %.2f s, shorter than NVML's %.0f s sample (profile "
                 "%.0f steps or more)", window_s, GPU_MONITOR_UTIL_MIN_S,
                 ceil(1000 * GPU_MONITOR_UTIL_MIN_S / fmax(s->step_ms, 1e-3)));
    else snprintf(nvml, sizeof nvml, "not measured");
    if (r->kernels.available)
        fprintf(f, "GPU utilisation: kernels active %.1f%% of the step (CUPTI: %.3f of %.3f ms); NVML %s\n",
                100 * r->kernels.active_ms / s->step_ms, r->kernels.active_ms, s->step_ms, nvml);
    else
        fprintf(f, "GPU utilisation: kernel-active share not measured (CUPTI: %s); NVML %s\n",
                r->kernels.why_not[0] ? r->kernels.why_not : "no records", nvml);
}

/* NVML's power over the window: when the power limit held the clocks down, the
 * layers bound by arithmetic ran slower than the roofline's measured peaks
 * (timed on a cool card) say they could; what shortens those stretches is
 * less energy a step: fewer FLOPs or bytes, or kernels that spend less on each. */
static void print_power(const ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    if (!r->gpu) return;
    double window_s = s->timed_steps * s->step_ms / 1000;
    if (s->power_w < 0 && s->power_capped < 0 && window_s < GPU_MONITOR_POWER_MIN_S) {
        fprintf(f, "GPU power: not measured: NVML's counters need %.1f s of steps, the window is %.2f s (profile "
                "%.0f steps or more)\n", GPU_MONITOR_POWER_MIN_S, window_s,
                ceil(1000 * GPU_MONITOR_POWER_MIN_S / fmax(s->step_ms, 1e-3)));
        return;
    }
    if (s->power_w < 0 && s->power_capped < 0) {
        fprintf(f, "GPU power: not measured (NVML's energy and power-limit counters)\n");
        return;
    }
    char limit[48] = "";
    if (s->power_limit_w > 0) snprintf(limit, sizeof limit, " of the %.0f W limit", s->power_limit_w);
    fprintf(f, "GPU power:");
    if (s->power_w >= 0)
        fprintf(f, " mean %.0f W%s, %.2f J per step;", s->power_w, limit, s->power_w * s->step_ms / 1000);
    if (s->power_capped < 0) fprintf(f, " the power limit's hold on the clocks not measured\n");
    else if (s->power_capped < PROFILE_FINDING_MIN_SHARE)
        fprintf(f, " the power limit held the clocks down %.1f%% of the window\n", 100 * s->power_capped);
    else
        fprintf(f, " power-bound: the power limit held the clocks down %.1f%% of the window (NVML), so the "
                "layers bound by arithmetic ran below the clock the peaks were measured at\n",
                100 * s->power_capped);
}

/* The trainer's phases in one line; sets r->top_phase. */
static void print_phases(ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    const char *names[] = {"data wait", "input", "forward", "backward", "optimizer", "outside the phases"};
    double ms[] = {finite_or_0(s->phase_data_wait_ms), finite_or_0(s->phase_input_ms),
                   finite_or_0(s->phase_forward_ms), finite_or_0(s->phase_backward_ms),
                   finite_or_0(s->phase_optimizer_ms), outside_phases_ms(s)};
    int top = 0;
    for (int i = 1; i < 6; i++)
        if (ms[i] > ms[top]) top = i;
    r->top_phase = names[top];
    fprintf(f, "phases, ms per step (largest: %s):", r->top_phase);
    for (int i = 0; i < 6; i++) fprintf(f, " %s %.4f (%.1f%%)%s", names[i], ms[i], 100 * ms[i] / s->step_ms,
                                        i < 5 ? "," : "\n");
}

static void print_diagnosis(ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    fprintf(f, "\n== diagnosis: the bottlenecks over %.0f%% of the %.4f ms step, largest first; each one's "
            "estimated gain if removed (they overlap: gains do not add) ==\n", 100 * PROFILE_FINDING_MIN_SHARE,
            s->step_ms);
    print_utilisation(r, f);
    print_power(r, f);
    print_phases(r, f);
    ProfileFinding fs[PROFILE_MAX_FINDINGS];
    int n = profile_findings(r, fs, PROFILE_MAX_FINDINGS);
    for (int i = 0; i < n; i++)
        fprintf(f, "finding %d: %s | %.4f ms/step | %.1f%% of the step | gain %.4f ms (%.2fx) | switches: %s | "
                "from: %s\n", i + 1, fs[i].what, fs[i].ms, 100 * fs[i].share, fs[i].gain_ms,
                s->step_ms / fmax(s->step_ms - fs[i].gain_ms, 1e-9), fs[i].switches, fs[i].from);
    if (!n) fprintf(f, "no bottleneck over %.0f%% of the step\n", 100 * PROFILE_FINDING_MIN_SHARE);
    if (r->graph)
        fprintf(f, "perf.cuda_graph was on while profiling (--graph): the step is the graph's, no layer's time is "
                "in the findings\n");
    else
        fprintf(f, "perf.cuda_graph was off while profiling (events per op cannot be timed inside a replayed "
                "graph)%s%s\n", r->settings.cuda_graph ? "; the config has it on: trainc --config ... gives the "
                "graph's step time, trainc profile --graph its kernels" : "", r->settings.overlap_wgrad ?
                "; so was perf.overlap_wgrad (each op timed alone), which the config has on and --graph keeps" :
                "");
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

/* The report's first lines: the step, the utilisation and the top finding with its switches. */
static void print_summary(const ProfileReport *r, FILE *f) {
    const TrainSummary *s = &r->summary;
    double window_s = s->timed_steps * s->step_ms / 1000;
    fprintf(f, "== summary ==\nstep %.4f ms (steps %ld..%ld on the %s)\n", s->step_ms, r->first, r->last,
            r->gpu ? "GPU" : "CPU");
    if (r->window_note[0]) fprintf(f, "window: %s\n", r->window_note);
    if (!r->gpu) fprintf(f, "GPU utilisation: not measured on the CPU\n");
    else if (r->kernels.available)
        fprintf(f, "GPU utilisation: kernels active %.1f%% of the step\n", 100 * r->kernels.active_ms / s->step_ms);
    else if (s->gpu_util >= 0 && window_s >= GPU_MONITOR_UTIL_MIN_S)
        fprintf(f, "GPU utilisation: NVML %.0f%%\n", s->gpu_util);
    else fprintf(f, "GPU utilisation: not measured\n");
    ProfileFinding top;
    if (profile_findings(r, &top, 1))
        fprintf(f, "top finding: %s, %.1f%% of the step, gain %.4f ms; switches: %s\n", top.what, 100 * top.share,
                top.gain_ms, top.switches);
    else fprintf(f, "top finding: none over %.0f%% of the step\n", 100 * PROFILE_FINDING_MIN_SHARE);
    fprintf(f, "\n");
}

void profile_print(ProfileReport *r, FILE *f) {
    print_summary(r, f);
    print_layers(r, f);
    profile_kernels_print(r, f);
    print_diagnosis(r, f);
    print_memory(r, f);
}
