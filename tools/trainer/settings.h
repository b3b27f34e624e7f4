/* The trainer's settings: the Config read once, into typed groups. This file
 * and the key schema (keys.c) are the trainer's only readers of the Config;
 * every other file reads TrainSettings. Each value alone was checked against
 * its range when the Config read it (keys.c); settings_read adds the rules that
 * join keys, all broken ones named in one message with their file:line. */
#ifndef TRAINC_TOOLS_TRAINER_SETTINGS_H
#define TRAINC_TOOLS_TRAINER_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#include "models/model.h"
#include "ops/lr_schedule.h"
#include "runtime/dtype.h"
#include "runtime/config.h"

/* dist.copy_engine, dist.shard_optimizer */
typedef enum { SWITCH_OFF, SWITCH_ON, SWITCH_AUTO } Switch;

/* data.cache and data.decode */
typedef enum { DATA_CACHE_AUTO, DATA_CACHE_DECODED, DATA_CACHE_STREAM } DataCache;
typedef enum { DATA_DECODE_AUTO, DATA_DECODE_CPU, DATA_DECODE_GPU } DataDecode;

/* optim.name; optim.muon = on is the older spelling of muon (SGD with Muon for the filters). */
typedef enum { OPTIM_SGD, OPTIM_MUON, OPTIM_ADAMW, OPTIM_ADAM } OptimName;

/* model.fuse = graphs: on, and the convolutions' fused cuDNN graphs (models/plan_graphs.c). */
#define MODEL_FUSE_GRAPHS 2

typedef struct {
    const Config *config; /* where each value came from, for the messages */
    struct {
        const char *name, *metrics_file, *tensorboard_dir, *resume, *init_from;
        int use_gpu, gpu, log_every, warmup_steps, eval, nvtx_layers;
        int eval_tta;     /* run.eval_tta: 0 off, 1 flip, 2 flip_translate */
        int repeats, warmup_runs;
        long max_steps;
        double epochs;    /* run.epochs, whole or not */
        uint64_t seed;
        long profile_first, profile_last; /* run.profile_steps; 0: off */
    } run;
    struct {
        const char *source, *path;
        int image_size, train_limit, test_limit, synthetic_train, synthetic_test;
        int workers, prefetch, pinned, async_copy, shuffle, flip, crop_pad, cutout, transform_on_gpu, resident;
        int pad_reflect, on_device;
        DataCache cache;
        long cache_mb;
        DataDecode decode;
        int resized_crop;  /* data.crop = random_resized */
        float crop_scale_min, crop_scale_max, crop_ratio_min, crop_ratio_max;
        int eval_resize;   /* data.eval_resize, or its default from data.image_size */
        int dct_scaling, skip_bad, shuffle_shards;
        float gpu_cpu_share;
        float mean[3], std[3];
        int mean_auto, std_auto; /* "auto": set by the trainer once it knows the data set */
        double val_split;
    } data;
    struct {
        const char *name;  /* model.name, or model.net's file name without ".net" (logs, checkpoints) */
        const char *net;   /* model.net against the folder of the config that set it; NULL: model.name's
                              shipped net */
        char net_path[4096], net_name[32];
        int net_and_name;  /* model.net and model.name both set in one place (one file, or both by --set) */
        int num_classes, nhwc, bn_weight_fixed;
        int fuse;          /* model.fuse: 0 off, 1 on, MODEL_FUSE_GRAPHS */
        float bn_momentum, bn_eps, whiten_bias_epochs;
    } model;
    struct {
        int batch, read_loss_every, sync_after_step;
    } train;
    /* lr, final_lr and weight_decay as the accumulated gradient needs them
     * (see settings_read). */
    struct {
        OptimName name;
        float beta1, beta2, eps; /* adamw, adam */
        float lr, momentum, weight_decay, warmup_epochs, warmup_start_factor, final_lr, label_smoothing, clip_norm;
        float bn_bias_lr_scale, head_lr_scale, lookahead_alpha, lookahead_power;
        int muon, muon_ns_steps;
        float muon_lr, muon_momentum;
        long lookahead_every;
        int nesterov, decay_bn_bias;
        LrScheduleKind schedule;
    } optim;
    /* fp32 (amp F32) keeps the scaler only to skip non-finite steps: scale 1. */
    struct {
        DType amp; /* F32: off */
        int tf32;
        float scale_init, scale_growth, scale_backoff;
        int scale_interval;
    } precision;
    struct {
        int accumulate, checkpoint_blocks;
    } memory;
    struct {
        int cuda_graph, graph_node_priority, deterministic, conv_benchmark, overlap_wgrad;
        size_t conv_workspace_bytes;
    } perf;
    struct {
        const char *dir;
        long every, inject_nan_step;
        int keep, max_bad_steps;
        int save_final; /* run.save_final */
    } checkpoint;
    struct {
        double sample_every_s;
        int prometheus_port;
    } monitor;
    struct {
        int sync_bn;
        DType allreduce_dtype; /* dist.allreduce_dtype; auto: precision.amp's */
        int half_allreduce;    /* fp16 or bf16 set explicitly */
        size_t bucket_bytes;
        Switch copy_engine, shard_optimizer;
        int socket_threads, sockets_per_thread; /* NCCL's socket transport; 0: NCCL's default */
    } dist;
} TrainSettings;

/* Fills *s from cfg and checks the rules that join keys for a run of world
 * ranks; a broken rule ends the process, every one named at once. */
void settings_read(const Config *cfg, int world, TrainSettings *s);
/* Only fills *s (no rule checked): for tools that need a few values. */
void settings_fill(const Config *cfg, TrainSettings *s);

/* Builds the net of model.net or model.name (model_init included) for batch and layout nhwc: 0, or -1
 * with a message in err that names the net file's line, or the keys. text: NULL, or where the net's text
 * goes (malloc'ed; a checkpoint keeps it). */
int settings_build_net(const TrainSettings *s, Model *m, int batch, int nhwc, char **text, char *err,
                       size_t errlen);

/* A value the run found wrong (the data, the GPU): "trainc: error: <file:line
 * of key>: ..." and exit status 1, as config_fail. */
void settings_fail(const TrainSettings *s, const char *key, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* optim.name's spelling ("sgd", "muon", "adamw", "adam"), and whether it is Adam's kind. */
const char *settings_optim_name(OptimName name);
static inline int optim_is_adam(OptimName name) { return name == OPTIM_ADAMW || name == OPTIM_ADAM; }
/* Where key's value came from ("file:line", "--set", "default"). */
const char *settings_origin(const TrainSettings *s, const char *key);

/* find-batch: train.batch of a config file with its "k=v" assignments applied
 * in order; 0, or -1 with *err set (the config's message). */
int settings_peek_batch(const char *config_file, char *const *assignments, int n, long *batch, char **err);

#endif
