/* One training run as a config describes it. */
#ifndef TRAINC_TOOLS_TRAINER_TRAIN_H
#define TRAINC_TOOLS_TRAINER_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/source.h"
#include "dist/dist.h"
#include "models/model.h"
#include "runtime/config.h"
#include "tools/trainer/settings.h"

typedef struct {
    char name[128];
    int world;              /* data-parallel ranks (1: one process) */
    char device[16];
    char gpu_name[256];
    long steps;             /* optimizer steps taken */
    long timed_steps;       /* steps inside the throughput window */
    double epochs;          /* epochs completed; run.epochs once a fractional run has ended */
    double samples_per_s;   /* over the timed steps, all ranks together */
    double step_ms;         /* mean wall time of a timed step */
    double epoch_s;         /* mean wall time of an epoch's training (evaluation excluded) */
    double data_wait_frac;  /* share of the timed window spent waiting for the loader */
    double gpu_util;        /* mean NVML utilisation over the timed window; < 0: unknown */
    double power_w;         /* mean board power over the timed window (NVML's energy counter); < 0: unknown */
    double power_capped;    /* share of the timed window the power limit held the clocks down; < 0: unknown */
    double power_limit_w;   /* the enforced power limit; < 0: unknown */
    double final_loss;      /* loss of the last step */
    double loss_scale;      /* the loss scaler's scale at the end; NaN without AMP */
    long skipped_steps;     /* steps skipped for an inf/NaN loss or gradients (fp32 too) */
    double test_acc;        /* top-1 after the last epoch (the mean over run.repeats); < 0: not evaluated */
    int runs;               /* run.repeats done (a signal may stop them early) */
    double test_acc_std, test_acc_min; /* over the runs (std: sample, 0 for one run); NaN: not evaluated */
    double train_s, train_s_std, train_s_min; /* a run's training time, first step to last, device
                                                 synced at both ends, evaluations excluded: mean, std, min */
    double eval_s;          /* the last evaluation's wall time (run.eval_tta's views included, the test set's
                               upload too), the mean over the runs; NaN: not evaluated */
    size_t peak_mem_bytes;  /* device memory the run allocated (arena high-water mark) */
    size_t host_peak_rss_bytes; /* the process's peak resident host memory (getrusage) */
    long skipped_files;     /* data.skip_bad: distinct training files passed over */
    char data_decode[8];    /* the training images: "decoded" once, or streamed and decoded on the "cpu" or "gpu" */
    size_t driver_mem_bytes;/* device memory in use as the driver saw it (context included) */
    uint32_t params_crc;    /* CRC-32 of the final fp32 parameters: equal runs have equal ones */
    int stopped;            /* stopped early: by a signal, or by run.max_bad_steps */
    char stop_signal[16];   /* "SIGTERM", "SIGINT" or "" */
    int exit_status;        /* what trainc exits with: 0, 128 + signal, or 1 (run.max_bad_steps, checkpoints
                             * asked for and not written) */
    char checkpoint[4200];  /* the last checkpoint written or resumed from; "" if none */
    long checkpoints_failed; /* checkpoints asked for and not written (exit status 1 then) */
    /* Where a timed step's time went, ms per step (the summary's phase_ms); NaN
     * where not measured. data_wait: host time in loader_next. The others are
     * device time between events on the compute stream (host time on the CPU):
     * input: the batch's copy (and GPU transform) into the model's input;
     * forward: loss scaler reset, forward and loss; backward: zeroing the
     * gradients and backward; optimizer: the gradient check, SGD and the loss
     * scaler update. With perf.cuda_graph forward, backward and optimizer run
     * inside one graph and only graph (its launch to its end) is timed. */
    double phase_data_wait_ms, phase_input_ms, phase_forward_ms, phase_backward_ms, phase_optimizer_ms,
        phase_graph_ms;
    /* The loader threads' work per step over the run, summed over the threads
     * (data.workers of them work at once): reading files, decoding them,
     * cropping and resampling; and with data.decode = gpu the device's time
     * per batch from the decoder's submission to its last copy. NaN: none. */
    double data_read_ms, data_decode_ms, data_augment_ms, data_gpu_decode_ms;
} TrainSummary;

/* Runs training; bad config values, data errors and a corrupt or mismatched
 * run.resume checkpoint end the process with a message naming the key or file.
 * SIGINT and SIGTERM stop it after the current step with a checkpoint
 * (summary: stopped, exit_status 128 + signal); a second signal exits at once. */
void train_run(const Config *cfg, TrainSummary *out);
/* The same, and *params_out gets a malloc'ed copy of the final parameters. */
void train_run_keep_params(const Config *cfg, TrainSummary *out, float **params_out);
/* One rank of a data-parallel run (dist from dist_init; world 1 is a plain
 * run). Every rank returns the same summary; only rank 0 writes checkpoints
 * and the metrics file. */
void train_run_dist(const Config *cfg, TrainSummary *out, float **params_out, Dist *dist);
/* Someone watching a run from outside its files (the profiler, profile.c):
 * opened once the model exists (to install op hooks on m->ops), step_begin
 * before optimizer step number `step` (counting from 1) and step_end after
 * it, closing after the summary and before the model is freed (to read its
 * events back). phase, after each micro-batch of step `step`, once per host
 * phase it had ("data wait", "input", "forward", "backward", "optimizer" or
 * "graph", in that order), with the host times (now_seconds) the trainer
 * marked its start and end: on the GPU when the host issued the work, not
 * when it ran. stop_after, before each optimizer step: non-zero ends the run
 * after `step`, the last one taken, as run.max_steps would (the profiler's
 * window of its own length). Any may be NULL. The run calls nothing else of
 * it. */
typedef struct {
    void (*opened)(void *user, Model *m);
    void (*step_begin)(void *user, long step);
    void (*step_end)(void *user, long step);
    void (*closing)(void *user, Model *m);
    void *user;
    void (*phase)(void *user, long step, const char *name, double t0, double t1);
    int (*stop_after)(void *user, long step);
} TrainObserver;
/* train_run with an observer (one process). */
void train_run_observed(const Config *cfg, TrainSummary *out, const TrainObserver *obs);
/* train_run_dist with an observer: each rank has its own. */
void train_run_dist_observed(const Config *cfg, TrainSummary *out, Dist *dist, const TrainObserver *obs);
void train_summary_print_json(const TrainSummary *s, FILE *f);

/* The training and test splits that the data.* keys name: listed (streamed)
 * or decoded once (data.cache), the test split none without run.eval, or the
 * training split's held-out share (data.val_split). Resolves what the data
 * decides in s: model.num_classes (0: the data's; another: checked), and
 * data.mean and data.std left at auto. A data error ends the process. */
void train_open_sources(TrainSettings *s, Source *train, Source *test);
/* The loader settings that the data.* and train.batch keys give, for the
 * training (train = 1) or test split. */
void train_loader_config(const TrainSettings *s, int train, LoaderConfig *lc);

#endif
