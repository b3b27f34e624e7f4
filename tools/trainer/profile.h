/* trainc profile: the config's training steps, warmed up, then a window of
 * steps timed op by op through the op hook (OpHooks: a cudaEvent pair per op
 * on the compute stream, host time on the CPU). It prints the time by layer
 * with FLOPs and bytes from the shapes, a diagnosis from the trainer's phase
 * timing, the model's memory split, and optionally a Chrome trace.
 *
 * It watches the run through train_run_dist_observed (train.h) only: nothing in
 * the run calls back into this file except through that observer and the op
 * hook, and without `trainc profile` neither is installed. */
#ifndef TRAINC_TOOLS_TRAINER_PROFILE_H
#define TRAINC_TOOLS_TRAINER_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/config.h"
#include "tools/trainer/train.h"

#define PROFILE_DEFAULT_FIRST 11
#define PROFILE_DEFAULT_LAST 30
/* last = PROFILE_AUTO_LAST (no --steps): the window is chosen. From step
 * PROFILE_DEFAULT_FIRST on the GPU it is extended past PROFILE_DEFAULT_LAST
 * until it spans PROFILE_WINDOW_MARGIN x what NVML's utilisation and power
 * need (GPU_MONITOR_UTIL_MIN_S, GPU_MONITOR_POWER_MIN_S) at the step time of
 * the warm-up's last PROFILE_MEASURED_STEPS steps (synced at both ends; the
 * margin absorbs steps slower than the warm-up's), to at most
 * PROFILE_AUTO_MAX_STEPS steps; on the CPU (no NVML) it is the default. */
#define PROFILE_AUTO_LAST 0
#define PROFILE_WINDOW_MARGIN 1.25
#define PROFILE_MEASURED_STEPS 5
#define PROFILE_AUTO_MAX_STEPS 1000
/* --graph's earliest window: step 1 runs eagerly, step 2 captures the graph. */
#define PROFILE_GRAPH_FIRST 3

typedef struct {
    char name[24];            /* the layer's ("conv 3") */
    char ops[96];             /* its ops' names, forward first, as the hook saw them */
    int n, c, h, w;           /* output shape */
    double forward_ms, backward_ms;           /* per step */
    double forward_flops, backward_flops;     /* per step, from the shapes */
    double forward_bytes, backward_bytes;     /* per step, from the shapes */
    /* A convolution's conv2d_forward and conv2d_backward ops alone: ms and runs per step (more than one
     * under memory.checkpoint's recompute or memory.accumulate), and its chosen plans as init timed them
     * on random data (conv2d_timed_us), ms per run: forward, and backward data plus backward filter;
     * 0: not timed */
    double conv_forward_ms, conv_backward_ms, conv_forward_runs, conv_backward_runs;
    double timed_forward_ms, timed_backward_ms;
} ProfileLayer;

#define PROFILE_MAX_OUTSIDE 16

/* An op outside the layers (the input's cast, the loss, the optimizer): ms per step. */
typedef struct {
    char op[40];
    double ms;
} ProfileOutsideOp;

typedef struct {
    size_t weights, gradients, optimizer, activations, activation_grads, workspace, other, peak;
} ProfileMemory;

/* The card's measured peaks (tools/trainer/peaks.c): a large half-precision
 * GEMM and a device-to-device copy on the GPU; an fp32 GEMM and a memcpy on
 * the CPU. Measured once per device and cached. */
typedef struct {
    double flops_per_s;       /* half precision (fp16 in, fp32 accumulate); 0: not known (nominal then) */
    double flops_f32_per_s;   /* float32 on FMA units (no TF32); the CPU's one GEMM figure fills all three */
    double flops_tf32_per_s;  /* float32 on TF32 tensor cores */
    double bytes_per_s;
    char device[256];         /* what they were measured on (the GPU's name and UUID, the CPU's model) */
    int from_cache;           /* read from the cache file, not measured in this run */
} ProfilePeaks;

#define PROFILE_TOP_KERNELS 10
#define PROFILE_MAX_STREAMS 8

typedef struct {
    char name[128];           /* the kernel's (demangled where CUPTI gives it so) */
    long count;               /* per step */
    double ms;                /* per step, all its launches together */
} ProfileKernelName;

typedef struct {
    unsigned id;              /* CUPTI's stream id */
    int compute;              /* the model's compute stream */
    double busy_ms;           /* per step: the union of its kernels, copies and memsets */
} ProfileStream;

/* The GPU's activity over the window from CUPTI activity records (kernels,
 * copies and memsets, graph nodes included) and runtime API records; every
 * time is per step. Filled by profile_kernels.c; available = 0 on the CPU, or
 * where CUPTI could not be loaded (why_not says why). */
typedef struct {
    int available;
    char why_not[256];
    double window_ms;         /* the window on the GPU's clock: first record's start to last one's end */
    double kernels, copies, memsets;  /* counts per step */
    double kernel_ms;         /* the kernels' durations together */
    double mean_kernel_us;
    double active_ms;         /* the union of all kernels' intervals: kernel-active time */
    ProfileKernelName longest[PROFILE_TOP_KERNELS]; /* by ms, largest first; empty names past the end */
    int n_streams;
    ProfileStream streams[PROFILE_MAX_STREAMS];
    double idle_ms, longest_idle_ms; /* no record on any stream, between the window's first and last */
    double h2d_ms, d2h_ms;           /* copies' durations */
    double copy_overlap_ms;          /* of h2d + d2h, the time some kernel ran meanwhile */
    double launch_ms;                /* host time inside launch calls (kernels, copies, graphs) */
    double launches;                 /* launch calls per step */
    double sync_ms;                  /* host time inside synchronizing calls (stream, event, device syncs,
                                        synchronous copies) */
    double comm_ms;                  /* communication: NCCL kernels and peer copies */
    double comm_exposed_ms;          /* of comm_ms, the time no other kernel (on any stream) ran meanwhile */
    int streams_seen;                /* streams with records in the window (streams[] holds the busiest) */
    long dropped;                    /* records CUPTI dropped (no free buffer): the figures miss them */
} ProfileKernels;

/* The switches the diagnosis names, as the config set them (before profile
 * forces its own: perf.cuda_graph and perf.overlap_wgrad are off while timing
 * ops), so that one already on is not suggested. */
typedef struct {
    int use_gpu, gpu;
    int workers, prefetch, pinned, async_copy, transform_on_gpu;
    int batch, sync_after_step, read_loss_every;
    int fuse, nhwc, amp, tf32, conv_benchmark, cuda_graph, graph_node_priority, overlap_wgrad;
    long bucket_mb;
    int copy_engine_off, half_allreduce;
    int resized_crop, dct_scaling, folder, decode_cpu; /* the streaming pipeline's switches */
    char metrics_file[1024];  /* run.metrics_file ("": none): --html graphs its NVML samples over the run */
} ProfileSettings;

typedef struct {
    TrainSummary summary;     /* the run's, timed window = the profiled steps */
    long first, last;         /* the profiled steps */
    char window_note[320];    /* a chosen window (no --steps): its length and why; "" for --steps */
    int graph;                /* --graph: the steps replayed as the run's CUDA graph, no op timed (n_ops 0) */
    int gpu;                  /* timed with events on the compute stream (else host time) */
    int n_layers;
    ProfileLayer *layers;     /* n_layers, in the model's order */
    double layers_ms;         /* per step: the layers' forward and backward together */
    double product_flops;     /* per step: the convolutions' and linear layers' FLOPs (backward as twice forward) */
    double outside_ms;        /* per step: ops with no layer (input copy, loss, optimizer, zeroing) */
    int n_outside;
    ProfileOutsideOp outside[PROFILE_MAX_OUTSIDE]; /* those ops by name, in the order first seen (the rest
                                                      past PROFILE_MAX_OUTSIDE under the last) */
    long n_ops;               /* ops timed in the window */
    long dropped;             /* ops past the event pool (GPU; 0 normally) */
    ProfileMemory memory;
    ProfilePeaks peaks;
    ProfileKernels kernels;
    int rank, world;          /* this process's rank; the run's ranks (1: one process) */
    double step_ms_min, step_ms_max;  /* rank 0: the ranks' timed step, fastest and slowest (world 1: its own) */
    double wait_ms_min, wait_ms_max;  /* rank 0: the ranks' data wait per step, least and most */
    const char *top_phase;    /* the diagnosis' largest phase ("forward", "data wait", ...) */
    ProfileSettings settings;
    struct cJSON *timeline;   /* this rank's trace events (as --trace writes them, without pid) */
} ProfileReport;

/* ---- the kernels section (profile_kernels.c) ---- */

/* [start, end) in ns. */
typedef struct {
    uint64_t start, end;
} ProfileSpan;

/* Sorts s and merges the spans that overlap or touch; returns how many are left. */
long profile_spans_merge(ProfileSpan *s, long n);
uint64_t profile_spans_length(const ProfileSpan *s, long n); /* their lengths together */
/* The gaps between merged spans: their sum, and the longest in *longest. */
uint64_t profile_spans_gaps(const ProfileSpan *merged, long n, uint64_t *longest);
/* Of each of s's spans (any order, overlapping or not), the part inside
 * merged's; summed over s. */
uint64_t profile_spans_overlap(const ProfileSpan *s, long n, const ProfileSpan *merged, long n_merged);

/* profile.c's observer drives these; each takes NULL (the CPU, or CUPTI not
 * available: k->why_not says why) and then does nothing. */
typedef struct ProfileKernelsRun ProfileKernelsRun;
ProfileKernelsRun *profile_kernels_open(int gpu, ProfileKernels *k);       /* at opened */
void profile_kernels_window_begin(ProfileKernelsRun *kr, cudaStream_t compute); /* step_begin(first) */
void profile_kernels_window_end(ProfileKernelsRun *kr);                   /* step_end(last) */
void profile_kernels_collect(ProfileKernelsRun *kr, long steps);          /* at closing: fills k */
/* Every kernel, copy and memset of the window as an "X" event on a track per
 * stream, and the window's launch and sync calls on a "cuda api" track; ts in
 * us from base_host (now_seconds) as the host's events. */
struct cJSON;
void profile_kernels_trace(const ProfileKernelsRun *kr, struct cJSON *events, int pid, double base_host);
void profile_kernels_close(ProfileKernelsRun *kr);
void profile_kernels_print(const ProfileReport *r, FILE *f);

/* ---- the diagnosis (profile_report.c) -------------------------------------------- */

/* A bottleneck: the step time it takes, the gain if it were removed, and the
 * config switches that address it (those not already on). */
typedef struct {
    char what[64];            /* "data wait", "host syncs", "memory-bound layers", ... */
    double ms;                /* per step */
    double share;             /* ms / the step */
    double gain_ms;           /* estimated, per step, if it were removed */
    char switches[192];       /* "data.workers, data.prefetch"; "none left" when all are on */
    char from[512];           /* what it is measured from (the roofline's places for layers) */
} ProfileFinding;

#define PROFILE_MAX_FINDINGS 8
/* A convolution pass counts as slower than timed past this ratio (the data and
 * the accumulating backward-data pass move it a little). */
#define PROFILE_SLOW_CONV 1.25
/* Findings under this share of the step are left out: removing one gains at most 1/(1 - share). */
#define PROFILE_FINDING_MIN_SHARE 0.05

/* The findings of r, largest share of the step first, at most max; returns
 * how many. The diagnosis prints them as "finding N: ..." lines (docs/usage.md). */
int profile_findings(const ProfileReport *r, ProfileFinding *out, int max);
/* A layer's place on the roofline against r's peaks (measured, else nominal):
 * FLOPs per byte, attainable and achieved FLOP/s, compute-bound or not. */
typedef struct {
    double intensity, attainable, achieved, roof_share;
    int compute_bound;
} ProfileRoofline;
ProfileRoofline profile_roofline(const ProfileReport *r, const ProfileLayer *l);

/* "A:B" with 2 <= A <= B (step 1 at least is warm-up); 0, or -1 with why in err. */
int profile_parse_steps(const char *text, long *first, long *last, char *err, size_t errlen);

/* The chosen window's length: default_steps, or more steps of step_s seconds
 * until they span need_s, at most max_steps; why (n bytes) says which and
 * why. step_s not > 0 (not measured): default_steps. */
long profile_window_steps(double step_s, double need_s, long default_steps, long max_steps, char *why, size_t n);

/* Runs cfg's training for steps 1..last in one process (last =
 * PROFILE_AUTO_LAST: chosen, see above, and logged; run.max_steps =
 * last, run.warmup_steps = first - 1, run.eval off, checkpoints off,
 * perf.cuda_graph and perf.overlap_wgrad off) with the op hook timing steps
 * first..last; fills r (free with profile_report_free), writes the Chrome
 * trace to trace_path unless NULL. Bad config values end the process as a
 * training run would.
 * graph: perf.cuda_graph on instead, perf.overlap_wgrad as the config says,
 * and no op hook (events per op cannot be timed inside a replayed graph):
 * CUPTI's kernels, the phases, the layers' FLOPs and bytes without times;
 * the GPU only, first >= PROFILE_GRAPH_FIRST. */
void profile_run(Config *cfg, long first, long last, const char *trace_path, int graph, ProfileReport *r);
/* The same on one rank of a data-parallel run (dist from dist_init): every
 * rank calls it and profiles its own process; the window starts after a
 * barrier, where each rank takes its trace's time zero; rank 0 gathers the
 * ranks' trace events and writes the one file (pid = rank). */
void profile_run_dist(Config *cfg, Dist *dist, long first, long last, const char *trace_path, int graph,
                      ProfileReport *r);
void profile_report_free(ProfileReport *r);
/* Under mpirun (world > 1): a line with the ranks' step and data wait, least and most. */
void profile_print_ranks(const ProfileReport *r, FILE *f);
/* The three sections: per layer, diagnosis, memory. */
void profile_print(ProfileReport *r, FILE *f); /* sets r->top_phase */
/* --html FILE: one self-contained page (inline SVG, no script, nothing fetched) of r: the timeline, the
 * layers, the roofline, the run's NVML figures, the findings and what was measured (profile_html.c). */
void profile_html_write(ProfileReport *r, const char *path);

#endif
