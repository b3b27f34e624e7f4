/* trainc eval's and bench-infer's settings from the checkpoint: see checkpoint_config.h. */
#include "tools/trainer/checkpoint_config.h"

#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trainer/export.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/trainer.h"

/* A key the checkpoint fixes: its value there, and the value that leaves it to the checkpoint ("0" for
 * model.num_classes: the data's), NULL: none; safe: the config's wins (data.source, run.seed). */
typedef struct {
    const char *key;
    char value[160];
    const char *unset;
    int safe;
} FixedKey;

#define MAX_FIXED 16

typedef struct {
    FixedKey keys[MAX_FIXED];
    int n;
} FixedKeys;

static void fix(FixedKeys *f, const char *key, const char *unset, int safe, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void fix(FixedKeys *f, const char *key, const char *unset, int safe, const char *fmt, ...) {
    if (f->n == MAX_FIXED) TC_FATAL("internal: more than %d keys from a checkpoint", MAX_FIXED);
    FixedKey *k = &f->keys[f->n++];
    k->key = key;
    k->unset = unset;
    k->safe = safe;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->value, sizeof k->value, fmt, ap);
    va_end(ap);
}

static const CfgKeySpec *key_spec(const char *key) {
    for (int i = 0; i < trainc_n_keys; i++)
        if (strcmp(trainc_keys[i].key, key) == 0) return &trainc_keys[i];
    TC_FATAL("internal: no config key %s", key);
}

static int near(double a, double b) { return fabs(a - b) <= 1e-6 * fmax(fabs(a), fabs(b)); }

/* Three comma-separated numbers (data.mean, data.std), each within float rounding of the other's. */
static int same_channels(const char *a, const char *b) {
    double x[3], y[3];
    if (sscanf(a, "%lf,%lf,%lf", &x[0], &x[1], &x[2]) != 3 || sscanf(b, "%lf,%lf,%lf", &y[0], &y[1], &y[2]) != 3)
        return strcmp(a, b) == 0;
    return near(x[0], y[0]) && near(x[1], y[1]) && near(x[2], y[2]);
}

/* Whether key holds the same value in a and b, as its type compares. */
static int same_value(const Config *a, const Config *b, const char *key) {
    switch (key_spec(key)->type) {
    case CFG_INT: return config_int(a, key) == config_int(b, key);
    case CFG_FLOAT:
    case CFG_FLOAT32: return near(config_float(a, key), config_float(b, key));
    case CFG_BOOL: return config_bool(a, key) == config_bool(b, key);
    case CFG_STRING: return same_channels(config_str(a, key), config_str(b, key));
    default: return strcmp(config_str(a, key), config_str(b, key)) == 0;
    }
}

/* The value cfg holds for key as text ("0", "auto"): ints and strings; floats never leave a key unset. */
static int holds_text(const Config *cfg, const char *key, const char *text) {
    char have[32];
    CfgType type = key_spec(key)->type;
    if (type == CFG_INT) snprintf(have, sizeof have, "%lld", (long long)config_int(cfg, key));
    else if (type == CFG_STRING || type == CFG_ENUM) snprintf(have, sizeof have, "%.31s", config_str(cfg, key));
    else return 0;
    return strcmp(have, text) == 0;
}

static int meta_whole(const cJSON *meta, const char *key, int lo, int hi, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi || v->valuedouble != floor(v->valuedouble))
        return -1;
    *out = (int)v->valuedouble;
    return 0;
}

static int meta_channels(const cJSON *meta, const char *key, char *out, size_t n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(meta, key);
    double v[3];
    for (int i = 0; i < 3; i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) return -1;
        v[i] = x->valuedouble;
    }
    if (cJSON_GetArraySize(a) != 3) return -1;
    snprintf(out, n, "%.7g,%.7g,%.7g", v[0], v[1], v[2]);
    return 0;
}

/* The keys the meta and model sections fix; a field out of range ends the process naming it. */
static void read_fixed(const Config *cfg, const char *what, const cJSON *meta, const CkptModel *cm,
                       const CkptData *data, const CheckpointNet *net, FixedKeys *f) {
    static const char *const amp[] = {"off", "fp16", "bf16"};
    const char *layout = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "layout"));
    const char *source = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "data_source"));
    const cJSON *eps = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(meta, "bn_eps"), 0);
    int image_size, classes, eval_resize = 0;
    char mean[160], std[160];
    int has_resize = cJSON_GetObjectItemCaseSensitive(meta, "eval_resize") != NULL; /* absent before data.crop */
    const char *bad = NULL;
    if (meta_whole(meta, "image_size", 8, 4096, &image_size)) bad = "image_size (8 to 4096)";
    else if (meta_whole(meta, "num_classes", 1, DATASET_MAX_CLASSES, &classes)) bad = "num_classes";
    else if (!layout || (strcmp(layout, "nchw") != 0 && strcmp(layout, "nhwc") != 0)) bad = "layout (nchw or nhwc)";
    else if (meta_channels(meta, "mean", mean, sizeof mean)) bad = "mean (3 numbers)";
    else if (meta_channels(meta, "std", std, sizeof std)) bad = "std (3 numbers)";
    else if (has_resize && meta_whole(meta, "eval_resize", 0, DATASET_MAX_SIDE, &eval_resize)) bad = "eval_resize";
    if (bad) TC_USER_ERROR("%s: corrupt checkpoint: its meta's %s is missing or out of range", what, bad);
    if (cm->act_dtype < DTYPE_F32 || cm->act_dtype > DTYPE_BF16)
        TC_USER_ERROR("%s: corrupt checkpoint: its field model.act_dtype (f32, f16 or bf16) is out of range (%lld)",
                      what, (long long)cm->act_dtype);
    fix(f, "data.image_size", NULL, 0, "%d", image_size);
    fix(f, "model.num_classes", "0", 0, "%d", classes);
    fix(f, "model.layout", NULL, 0, "%s", layout);
    fix(f, "data.mean", "auto", 0, "%s", mean);
    fix(f, "data.std", "auto", 0, "%s", std);
    fix(f, "data.crop", NULL, 0, "%s", eval_resize > 0 ? "random_resized" : "pad");
    if (eval_resize > 0) fix(f, "data.eval_resize", "0", 0, "%d", eval_resize);
    if (cJSON_IsNumber(eps) && eps->valuedouble > 0 && eps->valuedouble <= 1)
        fix(f, "model.bn_eps", NULL, 0, "%.9g", eps->valuedouble);
    if (strcmp(config_str(cfg, "run.device"), "cuda") == 0) /* the CPU evaluates in fp32 */
        fix(f, "precision.amp", NULL, 0, "%s", amp[cm->act_dtype]);
    if (!net->net_text) fix(f, "model.name", NULL, 0, "%s", net->name);
    if (source) fix(f, "data.source", NULL, 1, "%s", source);
    fix(f, "run.seed", NULL, 1, "%lld", (long long)data->seed);
    fix(f, "train.batch", NULL, 1, "%lld", (long long)data->batch); /* it fitted the training split */
}

/* model.net or model.name set to another net than the checkpoint's: a problem naming it. */
static void check_net_name(const Config *cfg, const CheckpointNet *net, const char *path, ConfigProblems *p) {
    const char *file = config_str(cfg, "model.net");
    if (file[0]) {
        const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
        size_t len = strlen(base) > 4 && strcmp(base + strlen(base) - 4, ".net") == 0 ? strlen(base) - 4 : strlen(base);
        if (strlen(net->name) != len || strncmp(base, net->name, len) != 0)
            config_problem(p, "model.net", "the checkpoint %s holds the net %s (eval and bench-infer build the "
                           "checkpoint's own net: leave model.net out)", path, net->name);
    } else if (strcmp(config_origin(cfg, "model.name"), "default") != 0 &&
               strcmp(config_str(cfg, "model.name"), net->name) != 0) {
        config_problem(p, "model.name", "the checkpoint %s holds %s (eval and bench-infer build the checkpoint's "
                       "own net: leave model.name out)", path, net->name);
    }
}

/* Each fixed key into cfg, unless cfg set it: then the same value, or a problem naming both; all problems
 * (the net's name among them) in one message. */
static void apply_fixed(Config *cfg, const FixedKeys *f, const CheckpointNet *net, const char *path) {
    Config *ckpt = config_new(trainc_keys, trainc_n_keys);
    ConfigProblems problems = {.config = cfg};
    check_net_name(cfg, net, path, &problems);
    char origin[4300];
    snprintf(origin, sizeof origin, "the checkpoint %s", path);
    for (int i = 0; i < f->n; i++) {
        const FixedKey *k = &f->keys[i];
        char assignment[256], *err = NULL;
        snprintf(assignment, sizeof assignment, "%s=%s", k->key, k->value);
        if (config_set_origin_msg(ckpt, assignment, origin, &err) != 0)
            TC_USER_ERROR("%s: corrupt checkpoint: %s", path, err);
        int user_set = strcmp(config_origin(cfg, k->key), "default") != 0 &&
                       !(k->unset && holds_text(cfg, k->key, k->unset));
        if (user_set && !k->safe && !same_value(cfg, ckpt, k->key))
            config_problem(&problems, k->key, "the checkpoint %s holds %s = %s (eval and bench-infer take it from "
                           "the checkpoint: leave it out, or make it %s)", path, k->key, k->value, k->value);
        if (!user_set && config_set_origin_msg(cfg, assignment, origin, &err) != 0)
            TC_FATAL("internal: %s", err);
    }
    config_problems_check(&problems);
    config_free(ckpt);
}

void checkpoint_config_apply(Config *cfg, const char *option, const char *path, CheckpointNet *net) {
    char err[4400], what[4300];
    snprintf(what, sizeof what, "%s %s", option, path);
    memset(net, 0, sizeof *net);
    CkptFile *f = ckpt_open(path, err, sizeof err);
    if (!f) TC_USER_ERROR("%s: %s", option, err);
    CkptModel cm;
    CkptData data;
    cJSON *meta = checkpoint_json_section(f, "meta", err, sizeof err);
    if (!meta || ckpt_read_section(f, "model", &cm, sizeof cm, err, sizeof err) != 0 ||
        ckpt_read_section(f, "data", &data, sizeof data, err, sizeof err) != 0)
        TC_USER_ERROR("%s: %s", option, err);
    err[0] = 0;
    net->net_text = checkpoint_text_section(f, "net", err, sizeof err);
    if (!net->net_text && err[0]) TC_USER_ERROR("%s: %s", option, err);
    ckpt_close(f);
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "model"));
    if (!name || !name[0] || strlen(name) >= sizeof net->name)
        TC_USER_ERROR("%s: corrupt checkpoint: its meta names no model", what);
    snprintf(net->name, sizeof net->name, "%s", name);
    FixedKeys fixed = {0};
    read_fixed(cfg, what, meta, &cm, &data, net, &fixed);
    cJSON_Delete(meta);
    apply_fixed(cfg, &fixed, net, path);
}

void checkpoint_net_free(CheckpointNet *net) {
    free(net->net_text);
    net->net_text = NULL;
}
