/* The trainer's state, shared by the files of the training run. They form
 * layers; each calls only the ones above it:
 *   settings.c          the Config read once into TrainSettings (and keys.c, the schema)
 *   train_state.c       the buffers beside the model's, moving a batch in, syncs
 *   train_watch.c       phase timing, the metrics file, profiler range, log
 *                       points, progress line, Prometheus, TensorBoard
 *   train_tta.c         test-time augmentation of the evaluation (run.eval_tta)
 *   train_step.c        one micro-batch and the optimizer, reading the loss back,
 *                       evaluation
 *   train_checkpoint.c  checkpoints and resume
 *   train_open.c        opening a run (data, model, optimizer, dist, monitoring,
 *                       resume), the next run of run.repeats, and closing it
 *   train.c             the run, top to bottom
 * Private to tools/trainer/. */
#ifndef TRAINC_TOOLS_TRAINER_TRAINER_H
#define TRAINC_TOOLS_TRAINER_TRAINER_H

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
#include "data/gpu_decode.h"
#include "data/gpu_transform.h"
#include "data/loader.h"
#include "dist/dist.h"
#include "dist/grad_buckets.h"
#include "models/model.h"
#include "models/zoo.h"
#include "ops/accuracy.h"
#include "ops/adamw.h"
#include "ops/freeze_after.h"
#include "ops/grad_norm.h"
#include "ops/lookahead.h"
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
#include "runtime/tensorboard.h"
#include "tools/trainer/checkpoint_config.h"
#include "tools/trainer/settings.h"
#include "tools/trainer/train.h"

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
    int observed;             /* the observer takes each set's phases (host times, on the GPU too) */
    double wait_t0;           /* observed: the host time take_batch began waiting for the loader */
} Phases;

/* The last log point, to rate the interval since. */
typedef struct {
    double start, wait_start;
    long start_step;
} LogWindow;

/* Where the run's time went: the phase ring, and the watchers of the run. */
typedef struct {
    Phases phases;
    FILE *metrics;            /* run.metrics_file; NULL: none (or not rank 0) */
    PromServer *prom;         /* monitor.prometheus_port */
    TbWriter *tb;             /* run.tensorboard_dir; NULL: none (or not rank 0) */
    int profiling, profiled;  /* run.profile_steps: inside the range; the range is done */
    int progress;             /* a progress line on the terminal instead of the step log lines */
    double progress_drawn;    /* when it was last drawn */
    long progress_step;       /* at that time */
    double progress_rate;     /* steps per second between the last two draws */
    double progress_wait;     /* the share of that time the step waited for data */
    double progress_wait_at;  /* train_data_wait at the last draw */
    long total_steps;
} TrainWatch;

typedef struct {
    GpuContext gpu;
    GpuMonitor *monitor;
} TrainDevice;

typedef struct {
    Dist *dist;               /* world 1: a plain run */
    GradBuckets buckets;      /* world > 1: the gradient all-reduce */
    int shard_optimizer;      /* dist.shard_optimizer in effect (grad_buckets_shard_optimizer) */
    long state_synced_step;   /* sharded: the step whose whole state sync_sharded_state last gathered */
} TrainDist;

typedef struct {
    Source train, test;       /* test: n 0 without evaluation */
    Loader *train_loader, *test_loader;
    GpuDecoder *train_decoder; /* data.decode = gpu: the training loader's consumer; NULL: none */
} TrainData;

/* run.eval_tta = flip_translate: the image, translated up-left and down-right, each with its mirror. */
#define TTA_MAX_VIEWS 6

/* Small device buffers beside the model's (host memory on the CPU), carved
 * from one arena. */
typedef struct {
    Arena arena;
    int32_t *labels;
    float *loss;
    float *lr;
    int64_t *lr_step;         /* the schedule's step counter, beside lr */
    int *correct;             /* the evaluation's counter */
    /* The log interval's sums, added to by every micro-batch on the device (no
     * host sync), read with the loss and zeroed at each log point. */
    float *loss_sum;
    int *train_correct;       /* training predictions at the label */
    /* Every run has a loss scaler (fp32: scale 1, never grows or backs off),
     * so a step with a non-finite loss or gradient is skipped on the device. */
    LossScalerState *scaler;
    /* optim.clip_norm > 0: the gradient's norm and clip factor (SgdParams.grad_mult),
     * made on the device each step, and the norm's scratch; NULL when off. */
    float *grad_norm, *clip_factor;
    void *grad_norm_scratch;
    /* optim.lookahead_every > 0: the slow copies of the parameters and of the batch norms' running
     * statistics; NULL when off. */
    float *slow_params, *slow_bn;
    /* optim.muon: the Newton-Schulz iterates (ops/muon.h's scratch); NULL when off. */
    void *muon_scratch;
    /* run.eval_tta: a test batch's stored images, each view's params (the same
     * for every sample), and fp32 logits: the views' weighted sum, a pair of
     * views, one view. NULL when off. */
    uint8_t *tta_images;
    TransformParams *tta_views;
    float *tta_sum, *tta_pair, *tta_view;
} TrainBuffers;

/* Moving a batch in: two staging buffers that the copy stream fills while the
 * previous step runs (data.async_copy), and the batch still held for its copy. */
typedef struct {
    int32_t *host_labels;     /* a batch of labels padded with -1 (host) */
    float *staging_images[2];  /* async copies of float batches */
    uint8_t *staging_raw[2];   /* transform on the GPU: stored-size uint8 batches ... */
    TransformParams *staging_params[2]; /* ... and each sample's random choices */
    int32_t *staging_labels[2];
    GpuTransformArgs transform_args;
    cudaEvent_t staged[2], consumed[2];
    int held_slot_valid;
    Batch held;               /* the batch whose copy may still be in flight */
    int held_staging;
    /* data.on_device: the training set on the device, and the epoch's order and
     * random choices, sent at each epoch's start from their host copy. */
    uint8_t *set_images;
    int32_t *set_labels;
    int32_t *epoch_index;
    TransformParams *epoch_params;
    void *epoch_host;         /* the index, then the params (pinned on the GPU) */
    cudaEvent_t epoch_sent;   /* the last epoch's copy has left epoch_host */
    int planned_epoch;        /* the epoch whose plan epoch_host holds, not yet sent; -1: none */
} TrainInput;

typedef struct {
    SgdParams sgd;
    AdamwParams adam;         /* optim.name = adamw or adam (model.adam): the step instead of SGD's */
    LrSchedule schedule;      /* kind LR_CONSTANT: the lr buffer keeps optim.lr */
    cudaGraphExec_t graphs[2][2][2]; /* [first micro-batch][last micro-batch][whitening frozen] */
    int whiten_layer;         /* the model's whitening layer, or -1 */
    long whiten_bias_steps;   /* its bias trains in steps [0, this) (model.whiten_bias_epochs) */
    int whiten_prefix;        /* the layers that run no backward after that (whitening_frozen_prefix) */
    LookaheadParams lookahead; /* every 0: off */
    MuonMatrices muon_mats;   /* optim.muon: the filters Muon steps (n 0: off) */
    MuonParams muon;
} TrainOptim;

/* What the host last read back from the device, and the bad steps it tells of. */
typedef struct {
    LossScalerState scaler;
    float grad_norm;          /* NaN before the first read-back, or when optim.clip_norm is off */
    float loss;
    float loss_sum;           /* the log interval's sums, as of sums_step */
    int train_correct;
    long sums_from, sums_step; /* the interval's sums cover the steps (sums_from, sums_step] */
    long step;                /* the step at that read-back */
    long bad_total;           /* skipped_steps at that read-back */
    long bad_run;             /* bad steps in a row, as far as the read-backs tell */
} TrainSeen;

typedef struct {
    char path[4200];          /* written (or resumed from) at step */
    long step;
    long failed;              /* checkpoints asked for and not written: the run ends with exit status 1 */
    char dir[4200];           /* run.checkpoint_dir/run-<N>: a final checkpoint's folder beside another run's */
} TrainLastCheckpoint;

typedef struct {
    TrainSettings set;        /* read once; nothing else reads the Config */
    TrainDevice device;
    TrainDist ddp;
    TrainData data;
    Model model;
    char *net_text;           /* the net file's text, as built (a checkpoint's "net" section) */
    TrainBuffers buf;
    TrainInput input;
    TrainOptim optim;
    TrainSeen seen;
    TrainLastCheckpoint ckpt;
    TrainWatch watch;
    int steps_per_epoch;      /* optimizer steps */
    long run_steps;           /* ceil(run.epochs x steps_per_epoch): the run's optimizer steps */
    int run_epochs;           /* the epochs it begins, the last of them partial when run.epochs is */
    long step;
    long first_step;          /* 0, or the step a resumed run starts from */
    const TrainObserver *observer; /* NULL: none (train_run_observed) */
    int weights_only;         /* opened for its weights alone (trainc eval): run.resume's data order is no concern */
    const char *weights_from; /* trainc eval's --checkpoint (not run.resume): its refusals name that option */
    const CheckpointNet *weights_net; /* its net (the model is built from its text; none: by model.name) */
} Trainer;

/* A checkpoint's "model" section: which net, so another one is refused (train_checkpoint.c). */
typedef struct {
    char name[32];
    int64_t n_params;
    uint64_t shape_fingerprint;
    int64_t act_dtype, nhwc, num_classes, accumulate;
} CkptModel;

/* Its "data" section: what the data order was made from. */
typedef struct {
    int64_t seed, batch, train_images, shuffle;
} CkptData;

/* Where in the data order a checkpoint's next step starts. */
typedef struct {
    int64_t step, epoch, epoch_micro; /* micro-batches of that epoch already taken */
} CkptPosition;

/* train_state.c */
/* The uint8 images raw-mode batches hold: the stored size, or the output's
 * with data.crop = random_resized. */
void input_raw_shape(const Trainer *t, int *c, int *h, int *w);
void state_alloc(Trainer *t);
void state_free(Trainer *t);
void upload_sync(Trainer *t, const Batch *b);
/* The batch's labels, padded with -1 to train.batch, copied into the device's
 * label buffer on the compute stream from a host staging buffer: sync before
 * the next call. */
void upload_labels_padded(Trainer *t, const Batch *b);
void upload_async(Trainer *t, Loader *l, const Batch *b);
void release_held(Trainer *t, Loader *l);
/* The training data's epoch begins at micro-batch first_micro (a resumed
 * epoch's; the ones before it are never built): the loader's, the GPU
 * decoder's, or (data.on_device) the epoch's order and random choices sent to
 * the device. Returns where it begins (first_micro, or the epoch's end). */
long start_train_epoch(Trainer *t, int epoch, long first_micro);
/* Host seconds the step waited for its data since the start (the loader's, or the GPU decoder's). */
double train_data_wait(const Trainer *t);
void plan_next_epoch(Trainer *t, int epoch);
/* data.on_device: micro-batch epoch_micro of the epoch gathered, augmented and
 * normalised into the model's input, and its labels, on the device. */
void gather_on_device(Trainer *t, long epoch_micro);
/* The transform kernel (on the CPU its reference) from a's images and params
 * into the model's input, on stream. */
void transform_into_input(Trainer *t, GpuTransformArgs *a, cudaStream_t stream);
void resample_into_input(Trainer *t, const DecodedBatch *b);
void device_sync(Trainer *t);
/* dist.shard_optimizer: every rank gets the whole state (the owners' master
 * weights, momentum and weights), before a checkpoint, an evaluation or the
 * run's end. Collective; nothing without sharding. */
void sync_sharded_state(Trainer *t);

/* train_watch.c */
void phases_init(Trainer *t);
void phases_destroy(Trainer *t);
void phase_mark(Trainer *t, int m);
void eager_mark(Trainer *t, int m);
void phase_close(Trainer *t, int timed);
/* Before loader_next: where the observer's data wait span starts. */
void phase_wait_begin(Trainer *t);
void phases_collect(Trainer *t, int wait);
void write_metric_epoch(Trainer *t, int epoch, double epoch_s, double test_acc);
void write_metric_skipped(Trainer *t, int epoch);
void profile_step_begin(Trainer *t);
void profile_step_end(Trainer *t);
void profile_finish(Trainer *t);
void prometheus_start(Trainer *t);
void prometheus_update(Trainer *t, double samples_per_s, double wait_frac, float loss);
void tensorboard_start(Trainer *t);
void tensorboard_stop(Trainer *t);
void log_window_open(Trainer *t, LogWindow *lw);
void log_point(Trainer *t, int epoch, float loss, LogWindow *lw);
void progress_draw(Trainer *t, int epoch, int force);

/* train_tta.c */
/* run.eval_tta: the views' params on the device (after state_alloc). */
void tta_prepare(Trainer *t);
/* Adds to t->buf.correct the test batch's samples whose views' summed logits
 * have their largest value at the label; the batch goes back to its loader. */
void tta_count(Trainer *t, Loader *l, const Batch *b);

/* train_step.c */
int take_batch(Trainer *t, long epoch_micro);
void run_micro_batch(Trainer *t, int first, int last);
float read_loss(Trainer *t);
double evaluate(Trainer *t, int epoch);
void sync_bn_allreduce(void *ctx, double *sums, int n, cudaStream_t stream);

/* train_checkpoint.c */
int save_checkpoint(Trainer *t, int epoch, long epoch_micro);
/* train.c: set (to the signal) by SIGINT and SIGTERM during the run */
const volatile sig_atomic_t *train_stop_flag(void);
int lock_checkpoint_dir(const Trainer *t, int at_start);
void choose_final_dir(Trainer *t);
CkptFile *open_resume(const Trainer *t, const char *resume);
void check_checkpoint_dir(const Trainer *t, long resume_step);
CkptPosition load_checkpoint(Trainer *t, CkptFile *f);

/* train_open.c */
/* The GPU this process takes (run.gpu, or the local rank's under a launcher);
 * a message naming the key when there is none. */
int trainer_gpu_ordinal(const TrainSettings *s, const Dist *dist);
/* Everything the loop needs, in order: settings, the GPU, data, model,
 * optimizer, dist, resume, loaders, metrics file, schedule. Returns where
 * the data order starts. */
CkptPosition trainer_open(Trainer *t, const Config *cfg, Dist *dist, TrainSummary *out, double run_start);
/* run.repeats: the next run from seed: the weights drawn as model_finalize
 * draws them, momentum, batch-norm statistics, learning-rate step and loss
 * scaler as at the start, step 0, and the loaders' order and augmentation
 * from seed. Buffers, convolution algorithms and captured CUDA graphs stay. */
void trainer_restart(Trainer *t, uint64_t seed);
void trainer_close(Trainer *t);

#endif
