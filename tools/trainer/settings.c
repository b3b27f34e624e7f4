/* The one reader of the Config: fills TrainSettings and checks the rules that
 * join keys. */
#include "tools/trainer/settings.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/transform.h"
#include "models/netfile.h"
#include "models/zoo.h"
#include "runtime/check.h"
#include "runtime/ini.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

static int is(const Config *cfg, const char *key, const char *value) {
    return strcmp(config_str(cfg, key), value) == 0;
}

/* run.profile_steps = "a:b"; 0, or -1 when it is not two step numbers 1 <= a <= b. */
static int parse_profile_steps(const char *v, long *first, long *last) {
    char *end;
    errno = 0;
    long a = strtol(v, &end, 10);
    if (end == v || *end != ':' || errno) return -1;
    const char *second = end + 1;
    long b = strtol(second, &end, 10);
    if (end == second || *end || errno || a < 1 || b < a) return -1;
    *first = a;
    *last = b;
    return 0;
}

/* data.mean, data.std: 1 for "auto", 0 for three numbers "r,g,b" (into v), -1 otherwise. */
static int parse_channels(const char *text, float v[3]) {
    if (strcmp(text, "auto") == 0) return 1;
    const char *at = text;
    for (int c = 0; c < 3; c++) {
        char *end;
        errno = 0;
        double x = strtod(at, &end);
        if (end == at || errno || !isfinite(x) || fabs(x) > 1e6) return -1;
        v[c] = (float)x;
        while (*end == ' ') end++;
        if (c < 2 && *end != ',') return -1;
        at = c < 2 ? end + 1 : end;
    }
    return *at == 0 ? 0 : -1;
}

static Switch read_switch(const Config *cfg, const char *key) {
    return is(cfg, key, "off") ? SWITCH_OFF : is(cfg, key, "on") ? SWITCH_ON : SWITCH_AUTO;
}

static void fill_run(const Config *cfg, TrainSettings *s) {
    s->run.name = config_str(cfg, "run.name");
    s->run.metrics_file = config_str(cfg, "run.metrics_file");
    s->run.tensorboard_dir = config_str(cfg, "run.tensorboard_dir");
    s->run.resume = config_str(cfg, "run.resume");
    s->run.init_from = config_str(cfg, "run.init_from");
    s->run.use_gpu = is(cfg, "run.device", "cuda");
    s->run.gpu = (int)config_int(cfg, "run.gpu");
    s->run.epochs = config_float(cfg, "run.epochs");
    s->run.repeats = (int)config_int(cfg, "run.repeats");
    s->run.warmup_runs = (int)config_int(cfg, "run.warmup_runs");
    s->run.log_every = (int)config_int(cfg, "run.log_every");
    s->run.warmup_steps = (int)config_int(cfg, "run.warmup_steps");
    s->run.eval = config_bool(cfg, "run.eval");
    s->run.eval_tta = is(cfg, "run.eval_tta", "flip") ? 1 : is(cfg, "run.eval_tta", "flip_translate") ? 2 : 0;
    s->run.nvtx_layers = config_bool(cfg, "run.nvtx_layers");
    s->run.max_steps = (long)config_int(cfg, "run.max_steps");
    s->run.seed = (uint64_t)config_int(cfg, "run.seed");
    const char *profile = config_str(cfg, "run.profile_steps");
    if (profile[0]) parse_profile_steps(profile, &s->run.profile_first, &s->run.profile_last);
    s->checkpoint.dir = config_str(cfg, "run.checkpoint_dir");
    s->checkpoint.every = (long)config_int(cfg, "run.checkpoint_every");
    s->checkpoint.keep = (int)config_int(cfg, "run.keep_checkpoints");
    s->checkpoint.save_final = config_bool(cfg, "run.save_final");
    s->checkpoint.max_bad_steps = (int)config_int(cfg, "run.max_bad_steps");
    s->checkpoint.inject_nan_step = (long)config_int(cfg, "run.inject_nan_step");
    s->monitor.sample_every_s = config_float(cfg, "monitor.sample_every_s");
    s->monitor.prometheus_port = (int)config_int(cfg, "monitor.prometheus_port");
}

static void fill_data(const Config *cfg, TrainSettings *s) {
    s->data.source = config_str(cfg, "data.source");
    s->data.path = config_str(cfg, "data.path");
    s->data.image_size = (int)config_int(cfg, "data.image_size");
    s->data.train_limit = (int)config_int(cfg, "data.train_limit");
    s->data.test_limit = (int)config_int(cfg, "data.test_limit");
    s->data.synthetic_train = (int)config_int(cfg, "data.synthetic_train");
    s->data.synthetic_test = (int)config_int(cfg, "data.synthetic_test");
    s->data.workers = (int)config_int(cfg, "data.workers");
    s->data.prefetch = (int)config_int(cfg, "data.prefetch");
    s->data.pinned = config_bool(cfg, "data.pinned");
    s->data.async_copy = config_bool(cfg, "data.async_copy");
    s->data.shuffle = config_bool(cfg, "data.shuffle");
    s->data.flip = is(cfg, "data.flip", "on") ? 1 : is(cfg, "data.flip", "alternate") ? TRANSFORM_FLIP_ALTERNATE : 0;
    s->data.crop_pad = (int)config_int(cfg, "data.crop_pad");
    s->data.cutout = (int)config_int(cfg, "data.cutout");
    s->data.transform_on_gpu = is(cfg, "data.transform_on", "gpu");
    s->data.resident = config_bool(cfg, "data.resident");
    s->data.pad_reflect = is(cfg, "data.pad_mode", "reflect");
    s->data.on_device = config_bool(cfg, "data.on_device");
    s->data.cache = is(cfg, "data.cache", "decoded") ? DATA_CACHE_DECODED
                  : is(cfg, "data.cache", "stream")  ? DATA_CACHE_STREAM
                                                     : DATA_CACHE_AUTO;
    s->data.cache_mb = (long)config_int(cfg, "data.cache_mb");
    s->data.decode = is(cfg, "data.decode", "cpu") ? DATA_DECODE_CPU
                   : is(cfg, "data.decode", "gpu") ? DATA_DECODE_GPU
                                                   : DATA_DECODE_AUTO;
    s->data.resized_crop = is(cfg, "data.crop", "random_resized");
    s->data.crop_scale_min = (float)config_float(cfg, "data.crop_scale_min");
    s->data.crop_scale_max = (float)config_float(cfg, "data.crop_scale_max");
    s->data.crop_ratio_min = (float)config_float(cfg, "data.crop_ratio_min");
    s->data.crop_ratio_max = (float)config_float(cfg, "data.crop_ratio_max");
    s->data.eval_resize = (int)config_int(cfg, "data.eval_resize");
    if (s->data.eval_resize == 0) s->data.eval_resize = (int)lround(s->data.image_size / 0.875);
    s->data.dct_scaling = config_bool(cfg, "data.dct_scaling");
    s->data.gpu_cpu_share = (float)config_float(cfg, "data.gpu_cpu_share");
    s->data.skip_bad = config_bool(cfg, "data.skip_bad");
    s->data.shuffle_shards = (int)config_int(cfg, "data.shuffle_shards");
    s->data.val_split = config_float(cfg, "data.val_split");
    s->data.mean_auto = parse_channels(config_str(cfg, "data.mean"), s->data.mean) == 1;
    s->data.std_auto = parse_channels(config_str(cfg, "data.std"), s->data.std) == 1;
}

static DType read_dtype(const Config *cfg, const char *key, DType otherwise) {
    return is(cfg, key, "fp16") ? DTYPE_F16 : is(cfg, key, "bf16") ? DTYPE_BF16 : otherwise;
}

/* The file of a value's origin ("configs/a.ini" of "configs/a.ini:12"), or "--set": its length. */
static size_t origin_source_len(const char *origin) {
    const char *colon = strrchr(origin, ':');
    return colon ? (size_t)(colon - origin) : strlen(origin);
}

/* model.net and model.name from different places: the one set later names the net (a config that includes
 * configs/resnet18.ini and sets model.net, or a --set of either over a config's), as a later value of one key
 * replaces an earlier one. From one place both are an error (settings_read). */
static int name_replaces_net(const Config *cfg, TrainSettings *s) {
    const char *name_origin = config_origin(cfg, "model.name"), *net_origin = config_origin(cfg, "model.net");
    if (config_order(cfg, "model.name") == 0) return 0;
    size_t len = origin_source_len(net_origin);
    if (len == origin_source_len(name_origin) && strncmp(net_origin, name_origin, len) == 0) {
        s->model.net_and_name = 1;
        return 0;
    }
    return config_order(cfg, "model.name") > config_order(cfg, "model.net");
}

/* model.net's path against the folder of the file that set it (a --set's: the working folder's). */
static void fill_net(const Config *cfg, TrainSettings *s) {
    const char *net = config_str(cfg, "model.net"), *origin = config_origin(cfg, "model.net");
    if (!net[0] || name_replaces_net(cfg, s)) return;
    const char *colon = strrchr(origin, ':'), *slash = NULL;
    for (const char *p = origin; colon && p < colon; p++)
        if (*p == '/') slash = p;
    int dir_len = net[0] == '/' || !slash ? 0 : (int)(slash - origin) + 1;
    snprintf(s->model.net_path, sizeof s->model.net_path, "%.*s%s", dir_len, origin, net);
    const char *base = strrchr(net, '/') ? strrchr(net, '/') + 1 : net;
    size_t len = strlen(base) > 4 && strcmp(base + strlen(base) - 4, ".net") == 0 ? strlen(base) - 4 : strlen(base);
    snprintf(s->model.net_name, sizeof s->model.net_name, "%.*s", (int)len, base);
    s->model.net = s->model.net_path;
    s->model.name = s->model.net_name;
}

int settings_build_net(const TrainSettings *s, Model *m, int batch, int nhwc, char **text, char *err,
                       size_t errlen) {
    char *net = NULL;
    int rc;
    if (!s->model.net) {
        rc = model_build(m, s->model.name, batch, s->data.image_size, s->model.num_classes, nhwc, err, errlen);
        if (rc == 0 && text) net = strdup(netfile_shipped(s->model.name));
    } else {
        size_t len;
        const char *why = NULL;
        net = ini_read_file(s->model.net, &len, &why);
        NetShape shape = {batch, s->data.image_size, s->model.num_classes, nhwc};
        if (!net) snprintf(err, errlen, "%s: cannot open: %s", s->model.net, why);
        rc = net ? netfile_build(m, s->model.net, net, &shape, err, errlen) : -1;
    }
    if (rc == 0 && text && !net) TC_FATAL("out of host memory: the net's text");
    if (text && rc == 0) *text = net;
    else free(net);
    return rc;
}

static void fill_model_and_optim(const Config *cfg, TrainSettings *s) {
    s->model.name = config_str(cfg, "model.name");
    fill_net(cfg, s);
    s->model.num_classes = (int)config_int(cfg, "model.num_classes");
    s->model.fuse = is(cfg, "model.fuse", "graphs") ? MODEL_FUSE_GRAPHS : is(cfg, "model.fuse", "on");
    s->model.nhwc = is(cfg, "model.layout", "nhwc");
    s->model.bn_momentum = (float)config_float(cfg, "model.bn_momentum");
    s->model.bn_eps = (float)config_float(cfg, "model.bn_eps");
    s->model.bn_weight_fixed = is(cfg, "model.bn_weight", "fixed");
    s->model.whiten_bias_epochs = (float)config_float(cfg, "model.whiten_bias_epochs");
    s->train.batch = (int)config_int(cfg, "train.batch");
    s->train.read_loss_every = (int)config_int(cfg, "train.read_loss_every");
    s->train.sync_after_step = config_bool(cfg, "train.sync_after_step");
    s->optim.lr = (float)config_float(cfg, "optim.lr");
    s->optim.momentum = (float)config_float(cfg, "optim.momentum");
    s->optim.weight_decay = (float)config_float(cfg, "optim.weight_decay");
    s->optim.nesterov = config_bool(cfg, "optim.nesterov");
    s->optim.decay_bn_bias = config_bool(cfg, "optim.decay_bn_bias");
    s->optim.bn_bias_lr_scale = (float)config_float(cfg, "optim.bn_bias_lr_scale");
    s->optim.head_lr_scale = (float)config_float(cfg, "optim.head_lr_scale");
    s->optim.name = is(cfg, "optim.name", "muon")    ? OPTIM_MUON
                  : is(cfg, "optim.name", "adamw") ? OPTIM_ADAMW
                  : is(cfg, "optim.name", "adam")  ? OPTIM_ADAM
                                                   : OPTIM_SGD;
    s->optim.muon = config_bool(cfg, "optim.muon") || s->optim.name == OPTIM_MUON;
    if (s->optim.muon && s->optim.name == OPTIM_SGD) s->optim.name = OPTIM_MUON; /* the older spelling */
    s->optim.beta1 = (float)config_float(cfg, "optim.beta1");
    s->optim.beta2 = (float)config_float(cfg, "optim.beta2");
    s->optim.eps = (float)config_float(cfg, "optim.eps");
    s->optim.muon_lr = (float)config_float(cfg, "optim.muon_lr");
    s->optim.muon_momentum = (float)config_float(cfg, "optim.muon_momentum");
    s->optim.muon_ns_steps = (int)config_int(cfg, "optim.muon_ns_steps");
    s->optim.lookahead_every = (long)config_int(cfg, "optim.lookahead_every");
    s->optim.lookahead_alpha = (float)config_float(cfg, "optim.lookahead_alpha");
    s->optim.lookahead_power = (float)config_float(cfg, "optim.lookahead_power");
    s->optim.schedule = is(cfg, "optim.schedule", "cosine")     ? LR_COSINE
                      : is(cfg, "optim.schedule", "onecycle") ? LR_ONECYCLE
                      : is(cfg, "optim.schedule", "linear")   ? LR_LINEAR
                                                              : LR_CONSTANT;
    s->optim.warmup_start_factor = (float)config_float(cfg, "optim.warmup_start_factor");
    s->optim.warmup_epochs = (float)config_float(cfg, "optim.warmup_epochs");
    s->optim.final_lr = (float)config_float(cfg, "optim.final_lr");
    s->optim.label_smoothing = (float)config_float(cfg, "optim.label_smoothing");
    s->optim.clip_norm = (float)config_float(cfg, "optim.clip_norm");
}

static void fill_device(const Config *cfg, TrainSettings *s) {
    s->precision.amp = read_dtype(cfg, "precision.amp", DTYPE_F32);
    s->precision.tf32 = config_bool(cfg, "precision.tf32");
    s->precision.scale_init = (float)config_float(cfg, "precision.loss_scale");
    s->precision.scale_growth = (float)config_float(cfg, "precision.loss_scale_growth");
    s->precision.scale_backoff = (float)config_float(cfg, "precision.loss_scale_backoff");
    s->precision.scale_interval = (int)config_int(cfg, "precision.loss_scale_interval");
    s->memory.accumulate = (int)config_int(cfg, "memory.accumulate");
    s->memory.checkpoint_blocks = is(cfg, "memory.checkpoint", "blocks");
    s->perf.cuda_graph = config_bool(cfg, "perf.cuda_graph");
    s->perf.graph_node_priority = config_bool(cfg, "perf.graph_node_priority");
    s->perf.deterministic = config_bool(cfg, "perf.deterministic");
    s->perf.conv_benchmark = config_bool(cfg, "perf.conv_benchmark");
    s->perf.overlap_wgrad = config_bool(cfg, "perf.overlap_wgrad");
    s->perf.conv_workspace_bytes = (size_t)config_int(cfg, "perf.conv_workspace_mb") << 20;
    s->dist.sync_bn = config_bool(cfg, "dist.sync_bn");
    s->dist.allreduce_dtype =
        is(cfg, "dist.allreduce_dtype", "fp32") ? DTYPE_F32 : read_dtype(cfg, "dist.allreduce_dtype", s->precision.amp);
    s->dist.half_allreduce = is(cfg, "dist.allreduce_dtype", "fp16") || is(cfg, "dist.allreduce_dtype", "bf16");
    s->dist.bucket_bytes = (size_t)config_int(cfg, "dist.bucket_mb") << 20;
    s->dist.copy_engine = read_switch(cfg, "dist.copy_engine");
    s->dist.shard_optimizer = read_switch(cfg, "dist.shard_optimizer");
    s->dist.socket_threads = (int)config_int(cfg, "dist.socket_threads");
    s->dist.sockets_per_thread = (int)config_int(cfg, "dist.sockets_per_thread");
}

void settings_fill(const Config *cfg, TrainSettings *s) {
    memset(s, 0, sizeof *s);
    s->config = cfg;
    fill_run(cfg, s);
    fill_data(cfg, s);
    fill_model_and_optim(cfg, s);
    fill_device(cfg, s);
}

/* A rule of the settings broken: gathered, so that one message names them all. */
static void require(ConfigProblems *p, int ok, const char *key, const char *what) {
    if (!ok) config_problem(p, key, "%s", what);
}

/* A key whose value needs the GPU; cpu_value is what to set instead. */
static void require_gpu(ConfigProblems *p, const TrainSettings *s, int ok, const char *key, const char *cpu_value) {
    if (!ok && !s->run.use_gpu)
        config_problem(p, key, "needs run.device = cuda; for the CPU set %s = %s", key, cpu_value);
}

/* What only the GPU does, all named at once: a GPU config run with --device cpu. */
static void check_gpu_only(ConfigProblems *p, const TrainSettings *s, int world) {
    require_gpu(p, s, s->precision.amp == DTYPE_F32, "precision.amp", "off");
    require_gpu(p, s, !s->perf.cuda_graph, "perf.cuda_graph", "off");
    require_gpu(p, s, !s->perf.overlap_wgrad, "perf.overlap_wgrad", "off");
    require_gpu(p, s, !s->data.pinned, "data.pinned", "off");
    require_gpu(p, s, !s->data.transform_on_gpu, "data.transform_on", "cpu");
    require_gpu(p, s, !s->model.nhwc, "model.layout", "nchw");
    require_gpu(p, s, !s->model.fuse, "model.fuse", "off");
    require_gpu(p, s, world == 1 || !s->dist.half_allreduce, "dist.allreduce_dtype", "fp32");
    /* CPU ranks average their gradients over MPI: the copy engines, and the
     * sharded optimizer that rides on them, are the GPU's ("auto" is off there). */
    const char *copy_keys[] = {"dist.copy_engine", "dist.shard_optimizer"};
    Switch copy_modes[] = {s->dist.copy_engine, s->dist.shard_optimizer};
    for (int i = 0; i < 2 && world > 1 && !s->run.use_gpu; i++)
        if (copy_modes[i] == SWITCH_ON)
            config_problem(p, copy_keys[i], "needs run.device = cuda (CPU ranks average their gradients over MPI); "
                           "for the CPU set %s = auto", copy_keys[i]);
}

/* The data recipe's keys that join others. */
static void check_data_keys(ConfigProblems *p, const TrainSettings *s) {
    const Config *cfg = s->config;
    float v[3];
    require(p, parse_channels(config_str(cfg, "data.mean"), v) >= 0, "data.mean",
            "must be auto or three numbers \"r,g,b\" (e.g. 0.485,0.456,0.406)");
    int std_form = parse_channels(config_str(cfg, "data.std"), v);
    require(p, std_form >= 0 && (std_form == 1 || (v[0] > 0 && v[1] > 0 && v[2] > 0)), "data.std",
            "must be auto or three numbers > 0 \"r,g,b\" (e.g. 0.229,0.224,0.225)");
    require(p, s->data.crop_scale_min <= s->data.crop_scale_max, "data.crop_scale_min",
            "must be at most data.crop_scale_max");
    require(p, s->data.crop_ratio_min <= s->data.crop_ratio_max, "data.crop_ratio_min",
            "must be at most data.crop_ratio_max");
    require(p, !s->data.resized_crop || s->data.crop_pad == 0, "data.crop_pad",
            "belongs to data.crop = pad (data.crop = random_resized crops by data.crop_scale_* and data.crop_ratio_*)");
    require(p, !s->data.resized_crop || s->data.eval_resize >= s->data.image_size, "data.eval_resize",
            "must be at least data.image_size: evaluation crops data.image_size from the resized image");
    require(p, !s->data.resized_crop || !s->data.on_device, "data.on_device",
            "needs data.crop = pad: the set on the device is augmented by the pad-crop kernel");
    require(p, !s->data.resized_crop || !s->run.eval_tta, "run.eval_tta", "needs data.crop = pad");
    require(p, s->data.decode != DATA_DECODE_GPU || s->data.resized_crop, "data.decode",
            "= gpu needs data.crop = random_resized (the GPU crops and resamples images of any size)");
    require_gpu(p, s, s->data.decode != DATA_DECODE_GPU, "data.decode", "cpu");
    require(p, s->data.val_split == 0 || strcmp(s->data.source, "synthetic") != 0, "data.val_split",
            "needs a data set (data.source = synthetic makes its own test images)");
}

/* key holds its default value (the schema's, parsed as the key's type). */
static int at_default(const Config *cfg, const char *key) {
    for (int k = 0; k < trainc_n_keys; k++) {
        const CfgKeySpec *spec = &trainc_keys[k];
        if (strcmp(spec->key, key) != 0) continue;
        switch (spec->type) {
        case CFG_BOOL: return config_bool(cfg, key) == (strcmp(spec->default_value, "on") == 0);
        case CFG_INT: return config_int(cfg, key) == strtoll(spec->default_value, NULL, 10);
        case CFG_FLOAT32: return (float)config_float(cfg, key) == strtof(spec->default_value, NULL);
        case CFG_FLOAT: return config_float(cfg, key) == strtod(spec->default_value, NULL);
        default: return strcmp(config_str(cfg, key), spec->default_value) == 0;
        }
    }
    TC_FATAL("at_default: %s is not a key", key);
}

/* The keys of one optimizer set, away from their defaults, with another: they
 * would change nothing, so they are refused rather than ignored. */
static void check_optim_keys(ConfigProblems *p, const TrainSettings *s) {
    static const char *const sgd_keys[] = {"optim.momentum", "optim.nesterov"};
    static const char *const muon_keys[] = {"optim.muon_lr", "optim.muon_momentum", "optim.muon_ns_steps"};
    static const char *const adam_keys[] = {"optim.beta1", "optim.beta2", "optim.eps"};
    const Config *cfg = s->config;
    const char *name = settings_optim_name(s->optim.name);
    int adam = optim_is_adam(s->optim.name);
    require(p, !adam || !config_bool(cfg, "optim.muon"), "optim.muon",
            "steps the filters beside SGD (optim.name = muon), not beside optim.name = adamw or adam");
    for (int i = 0; adam && i < 2; i++)
        if (!at_default(cfg, sgd_keys[i]))
            config_problem(p, sgd_keys[i], "is SGD's (optim.name = sgd or muon), not %s's: %s takes optim.beta1, "
                           "optim.beta2 and optim.eps", name, name);
    for (int i = 0; s->optim.name != OPTIM_MUON && i < 3; i++)
        if (!at_default(cfg, muon_keys[i]))
            config_problem(p, muon_keys[i], "is Muon's (optim.name = muon), not %s's", name);
    for (int i = 0; !adam && i < 3; i++)
        if (!at_default(cfg, adam_keys[i]))
            config_problem(p, adam_keys[i], "is Adam's (optim.name = adamw or adam), not %s's", name);
}

static void check_joined_keys(ConfigProblems *p, const TrainSettings *s) {
    const Config *cfg = s->config;
    long first, last;
    const char *profile = config_str(cfg, "run.profile_steps");
    require(p, !s->perf.graph_node_priority || s->perf.cuda_graph, "perf.graph_node_priority",
            "needs perf.cuda_graph = on");
    require(p, s->checkpoint.dir[0] != 0, "run.checkpoint_dir", "must not be empty");
    require(p, !s->run.init_from[0] || !s->run.resume[0], "run.init_from",
            "and run.resume exclude each other: a resumed run takes its weights from the checkpoint");
    require(p, !s->checkpoint.inject_nan_step || !s->perf.cuda_graph, "run.inject_nan_step",
            "needs perf.cuda_graph = off (the graph replays the step as captured)");
    require(p, !profile[0] || parse_profile_steps(profile, &first, &last) == 0, "run.profile_steps",
            "must be a:b, optimizer steps with 1 <= a <= b (e.g. 100:120), or empty (off)");
    require(p, s->optim.warmup_epochs <= s->run.epochs, "optim.warmup_epochs", "must be at most run.epochs");
    require(p, s->optim.schedule != LR_CONSTANT || s->optim.warmup_epochs == 0, "optim.warmup_epochs",
            "needs optim.schedule = cosine, onecycle or linear");
    require(p, !s->optim.nesterov || s->optim.momentum > 0 || optim_is_adam(s->optim.name), "optim.nesterov",
            "needs optim.momentum > 0");
    check_optim_keys(p, s);
    require(p, s->dist.socket_threads * s->dist.sockets_per_thread <= 64, "dist.sockets_per_thread",
            "times dist.socket_threads must be at most 64 (NCCL's limit)");
    /* The async path holds the previous batch while its copy is in flight. */
    require(p, !s->data.async_copy || s->data.prefetch >= 2, "data.prefetch",
            "must be at least 2 with data.async_copy = on");
    require(p, s->run.repeats == 1 || (!s->run.resume[0] && !s->run.init_from[0]), "run.repeats",
            "above 1 excludes run.resume and run.init_from (each run starts from its own seed)");
    require(p, !s->run.warmup_runs || (!s->run.resume[0] && !s->run.init_from[0] && !s->checkpoint.every),
            "run.warmup_runs", "excludes run.resume, run.init_from and run.checkpoint_every (the counted runs start "
            "from run.seed's weights, and a warm-up run writes no checkpoint)");
    require(p, !s->model.net_and_name, "model.net", "and model.name both name the net: set one of them");
    if (!s->model.net && !netfile_shipped(s->model.name))
        config_problem(p, "model.name", "'%s' is not a shipped net (shipped: %s; model.net reads a file)",
                       s->model.name, netfile_shipped_names());
    require(p, !s->data.on_device || !s->data.resident, "data.on_device",
            "and data.resident exclude each other (data.resident trains on one batch)");
    check_data_keys(p, s);
}

void settings_read(const Config *cfg, int world, TrainSettings *s) {
    ConfigProblems problems = {.config = cfg}, *p = &problems;
    settings_fill(cfg, s);
    require(p, strlen(s->run.name) < sizeof ((TrainSummary *)0)->name, "run.name", "is longer than 127 bytes");
    check_gpu_only(p, s, world);
    check_joined_keys(p, s);
    require(p, s->run.repeats == 1 || world == 1, "run.repeats", "above 1 needs a single process (no mpirun)");
    require(p, !s->run.warmup_runs || world == 1, "run.warmup_runs", "needs a single process (no mpirun)");
    config_problems_check(p);
    if (s->precision.amp == DTYPE_F32) {
        /* fp32 uses the scaler only to skip non-finite steps: the scale stays 1. */
        s->precision.scale_init = 1;
        s->precision.scale_growth = 1;
        s->precision.scale_backoff = 1;
        s->precision.scale_interval = INT_MAX;
    }
    /* k micro-batches each add the gradient of their own mean loss, so the
     * buffer holds k times the mean gradient of the whole batch. SGD on k*g
     * with lr/k, weight decay k*wd and momentum as usual takes exactly the step
     * of SGD on g with lr and wd (the momentum buffer holds k times its value). */
    if (optim_is_adam(s->optim.name)) return; /* Adam's step divides the gradient by k (AdamwParams.accumulate) */
    s->optim.lr /= (float)s->memory.accumulate;
    s->optim.final_lr /= (float)s->memory.accumulate;
    s->optim.weight_decay *= (float)s->memory.accumulate;
}

const char *settings_optim_name(OptimName name) {
    static const char *const names[] = {"sgd", "muon", "adamw", "adam"};
    return names[name];
}

void settings_fail(const TrainSettings *s, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *what = malloc((size_t)n + 1);
    if (!what) TC_FATAL("out of host memory");
    va_start(ap, fmt);
    vsnprintf(what, (size_t)n + 1, fmt, ap);
    va_end(ap);
    config_fail(s->config, key, "%s", what);
}

const char *settings_origin(const TrainSettings *s, const char *key) { return config_origin(s->config, key); }

int settings_peek_batch(const char *config_file, char *const *assignments, int n, long *batch, char **err) {
    Config *cfg = config_new(trainc_keys, trainc_n_keys);
    *err = NULL;
    if (config_load_file_msg(cfg, config_file, err) != 0) return -1;
    for (int i = 0; i < n && !*err; i++) config_set_msg(cfg, assignments[i], err);
    if (*err) return -1;
    *batch = (long)config_int(cfg, "train.batch");
    config_free(cfg);
    return 0;
}
