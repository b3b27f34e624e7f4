/* The trainer's state, shared by the files of the training loop:
 * train.c (the loop, top to bottom), train_checkpoint.c (checkpoints and
 * resume), train_watch.c (phase timing, the metrics file, profiler range,
 * progress line, Prometheus). Private to tools/. */
#ifndef TRAINC_TOOLS_TRAINER_H
#define TRAINC_TOOLS_TRAINER_H

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data/dataset.h"
#include "data/gpu_transform.h"
#include "data/loader.h"
#include "dist/dist.h"
#include "dist/grad_buckets.h"
#include "models/model.h"
#include "models/zoo.h"
#include "ops/accuracy.h"
#include "ops/grad_norm.h"
#include "ops/loss_scaler.h"
#include "ops/lr_schedule.h"
#include "ops/sgd.h"
#include "ops/softmax_xent.h"
#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/checkpoint.h"
#include "runtime/gpu.h"
#include "runtime/gpu_monitor.h"
#include "runtime/log.h"
#include "runtime/prometheus.h"
#include "tools/train.h"

/* Phase timing: each micro-batch's marks go into one set of a small ring: an
 * event on the compute stream per mark (a host time on the CPU). A phase runs
 * from its mark to the next one taken. Sets are read back only at log points,
 * at the end, or when the ring comes round to a set still unread (then its
 * last event, PHASE_RING micro-batches old, is waited for): never a sync
 * inside a step. */
enum { PH_INPUT, PH_FORWARD, PH_BACKWARD, PH_OPTIMIZER, PH_GRAPH, PH_END, PH_MARKS };
#define PHASE_RING 16

typedef struct {
    cudaEvent_t ev[PH_MARKS];
    double host[PH_MARKS];
    unsigned marked;          /* bit m: mark m was taken */
    int pending, timed;       /* taken and not read back yet; inside the timed window */
} PhaseSet;

typedef struct {
    PhaseSet ring[PHASE_RING];
    int open;                 /* the set being marked, -1: none */
    int next;
    double timed_ms[PH_END];  /* each phase's sum over the timed window */
} Phases;

/* The last log point, to rate the interval since. */
typedef struct {
    double start, wait_start;
    long start_step;
} LogWindow;

typedef struct {
    /* settings read once from the config */
    int use_gpu, batch, epochs, image_size, log_every, read_loss_every, warmup_steps;
    long max_steps;
    int sync_after_step, async_copy, eval, resident, tf32, transform_on_gpu;
    int accumulate, checkpoint, cuda_graph, graph_node_priority, sync_bn;
    DType amp;                /* F32: off */
    float scale_init, scale_growth, scale_backoff;
    int scale_interval;
    /* Every run has a loss scaler (fp32: scale 1, never grows or backs off),
     * so a step with a non-finite loss or gradient is skipped on the device. */
    LossScalerState *scaler;  /* device (host memory on the CPU) */
    LossScalerState scaler_seen; /* as last read back with the loss */
    cudaGraphExec_t graphs[2][2]; /* [first micro-batch][last micro-batch] */
    SgdParams sgd;
    float lr;
    LrSchedule schedule;      /* kind LR_CONSTANT: lr_buf keeps optim.lr */
    float warmup_epochs, label_smoothing;
    float clip_norm;          /* optim.clip_norm; 0: off */

    GpuContext gpu;
    GpuMonitor *monitor;
    Dist *dist;               /* world 1: a plain run */
    GradBuckets buckets;      /* world > 1: the gradient all-reduce */
    int shard_optimizer;      /* dist.shard_optimizer in effect (grad_buckets_shard_optimizer) */
    long state_synced_step;   /* sharded: the step whose whole state sync_sharded_state last gathered */
    Model model;
    Dataset train_set, test_set;
    Loader *train_loader, *test_loader;

    /* Small device buffers beside the model's: labels, loss, lr, eval counter,
     * and two staging buffers that the copy stream fills while the previous
     * step runs (async_copy). On the CPU these live in host memory. */
    Arena aux;
    int32_t *labels;
    float *loss;
    float *lr_buf;
    int64_t *lr_step;         /* the schedule's step counter, on the device beside lr_buf */
    int *correct;
    int32_t *host_labels;     /* a batch of labels padded with -1 (host) */
    float *staging_images[2];  /* async copies of float batches */
    uint8_t *staging_raw[2];   /* transform on the GPU: stored-size uint8 batches ... */
    TransformParams *staging_params[2]; /* ... and each sample's random choices */
    GpuTransformArgs transform_args;
    int32_t *staging_labels[2];
    /* optim.clip_norm > 0: the gradient's norm and clip factor (SgdParams.grad_mult),
     * made on the device each step, and the norm's scratch; NULL when off. */
    float *grad_norm, *clip_factor;
    void *grad_norm_scratch;
    float grad_norm_seen;     /* as last read back with the loss; NaN before that, or when off */
    cudaEvent_t staged[2], consumed[2];
    int held_slot_valid;
    Batch held;               /* the batch whose copy may still be in flight */
    int held_staging;

    /* Checkpoints, stopping, bad steps (run.*). */
    long checkpoint_every, inject_nan_step;
    int keep_checkpoints, max_bad_steps;
    const char *checkpoint_dir;
    char last_checkpoint[4200]; /* written (or resumed from) at step last_checkpoint_step */
    long last_checkpoint_step;
    long seen_step;           /* the step at the last read-back of the scaler state */
    long seen_bad_total;      /* skipped_steps at that read-back */
    long bad_run;             /* bad steps in a row, as far as the read-backs tell */

    FILE *metrics;
    long step;
    long first_step;          /* 0, or the step a resumed run starts from */

    /* Watching the run: run.profile_steps, monitor.*, the progress line. */
    long profile_first, profile_last; /* 0: off */
    int profiling, profiled;
    double sample_every_s;
    int prometheus_port;
    PromServer *prom;
    int progress;             /* a progress line on the terminal instead of the step log lines */
    double progress_drawn;    /* when it was last drawn */
    long progress_step;       /* at that time */
    double progress_rate;     /* steps per second between the last two draws */
    long total_steps;
    float last_loss;          /* as last read back */
    Phases phases;
} Trainer;

typedef enum { RUN_ON, STOP_MAX_STEPS, STOP_SIGNAL, STOP_BAD_STEPS } StopReason;

/* Where in the data order a checkpoint's next step starts. */
typedef struct {
    int64_t step, epoch, epoch_micro; /* micro-batches of that epoch already taken */
} CkptPosition;

/* train_checkpoint.c */
int save_checkpoint(Trainer *t, const Config *cfg, int epoch, long epoch_micro);
CkptFile *open_resume(const Trainer *t, const char *resume);
void check_checkpoint_dir(const Trainer *t, long resume_step);
CkptPosition load_checkpoint(Trainer *t, const Config *cfg, CkptFile *f);
long skip_batches(Trainer *t, long n);

/* train_watch.c */
void eager_mark(Trainer *t, int m);
void phase_mark(Trainer *t, int m);
void phases_collect(Trainer *t, int wait);
void prometheus_start(Trainer *t);
void phases_init(Trainer *t);
void profile_step_begin(Trainer *t);
void phase_close(Trainer *t, int timed);
void profile_step_end(Trainer *t);
void log_point(Trainer *t, int epoch, float loss, LogWindow *lw);
void progress_draw(Trainer *t, int epoch, int force);
void write_metric_epoch(Trainer *t, int epoch, double epoch_s, double test_acc);
void write_metric_step(Trainer *t, int epoch, float loss, double samples_per_s);
void write_metric_skipped(Trainer *t, int epoch);
void profile_finish(Trainer *t);
void prometheus_update(Trainer *t, double samples_per_s, double wait_frac, float loss);
void phases_destroy(Trainer *t);

/* train.c */
void upload_sync(Trainer *t, const Batch *b);
void device_sync(Trainer *t);
/* dist.shard_optimizer: every rank gets the whole state (the owners' master
 * weights, momentum and weights), before a checkpoint, an evaluation or the
 * run's end. Collective; nothing without sharding. */
void sync_sharded_state(Trainer *t);

#endif
