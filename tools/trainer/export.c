/* trainc export and run.init_from: see export.h. */
#include "tools/trainer/export.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/transform.h"
#include "models/netfile.h"
#include "models/tensors.h"
#include "models/zoo.h"
#include "runtime/check.h"
#include "runtime/checkpoint.h"
#include "runtime/files.h"
#include "runtime/json_out.h"
#include "runtime/safetensors.h"
#include "tools/trainer/ckpt_meta.h"

/* ---- the checkpoint's sections ---------------------------------------------- */

/* m's tensors (malloc'ed, *n of them), or NULL with a message in err. */
static ModelTensor *list_tensors(const Model *m, int *n, char *err, size_t errlen) {
    int count = model_tensors(m, NULL, 0, err, errlen);
    if (count < 0) return NULL;
    ModelTensor *ts = malloc((size_t)(count ? count : 1) * sizeof *ts);
    if (!ts) TC_FATAL("out of host memory listing %d tensors", count);
    model_tensors(m, ts, count, err, errlen);
    *n = count;
    return ts;
}

/* 0 when every value of tensor t (v, its count floats) is finite, else -1 naming
 * the tensor and its first bad value in err. */
static int check_finite(const float *v, const ModelTensor *t, const char *path, char *err, size_t errlen) {
    for (size_t k = 0; k < t->count; k++)
        if (!isfinite(v[k])) {
            snprintf(err, errlen, "%s: tensor %s holds %s at element %zu of %zu (the weights are not finite: a "
                     "diverged run?); refused", path, t->name, isnan(v[k]) ? "NaN" : v[k] > 0 ? "+Inf" : "-Inf", k,
                     t->count);
            return -1;
        }
    return 0;
}

int model_weights_check_finite(const Model *m, const float *params, const float *bn_stats, const char *path,
                               char *err, size_t errlen) {
    int n, rc = 0;
    ModelTensor *ts = list_tensors(m, &n, err, errlen);
    if (!ts) return -1;
    size_t largest = 1;
    for (int i = 0; i < n; i++) largest = ts[i].count > largest ? ts[i].count : largest;
    float *v = malloc(largest * sizeof(float));
    if (!v) TC_FATAL("out of host memory: a tensor of %zu floats", largest);
    for (int i = 0; i < n && rc == 0; i++) {
        if (!(ts[i].in_bn_stats ? bn_stats : params)) continue;
        model_tensor_get(m, &ts[i], params, bn_stats, v);
        rc = check_finite(v, &ts[i], path, err, errlen);
    }
    free(v);
    free(ts);
    return rc;
}

static void add_floats(cJSON *obj, const char *key, const float *v, int n) {
    cJSON *a = cJSON_AddArrayToObject(obj, key);
    for (int i = 0; a && i < n; i++) {
        char text[32];
        snprintf(text, sizeof text, "%.7g", v[i]); /* 0.4914, not 0.49140000343322754 */
        cJSON_AddItemToArray(a, cJSON_CreateNumber(strtod(text, NULL)));
    }
    if (!a) TC_FATAL("out of host memory building JSON");
}

static char *json_text(cJSON *root) {
    char *text = cJSON_PrintUnformatted(root);
    if (!text) TC_FATAL("out of host memory printing JSON");
    cJSON_Delete(root);
    return text;
}

char *export_meta_json(const Model *m, const char *model_name, const InputPreparation *prep,
                       char *const *class_names, int n_names) {
    cJSON *o = json_object_new();
    json_add_string(o, "model", model_name);
    json_add_int(o, "num_classes", m->num_classes);
    json_add_int(o, "image_size", prep->image_size);
    json_add_int(o, "in_channels", m->acts[0].c_real);
    json_add_string(o, "layout", m->nhwc ? "nhwc" : "nchw");
    add_floats(o, "mean", prep->mean, 3);
    add_floats(o, "std", prep->std, 3);
    json_add_int(o, "eval_resize", prep->eval_resize);
    if (prep->source) json_add_string(o, "data_source", prep->source);
    add_floats(o, "bn_eps", &m->bn_eps, 1);
    cJSON *names = cJSON_AddArrayToObject(o, "class_names");
    for (int k = 0; names && k < m->num_classes; k++) {
        char fallback[32];
        snprintf(fallback, sizeof fallback, "class%d", k);
        int named = class_names && k < n_names;
        cJSON_AddItemToArray(names, cJSON_CreateString(named ? class_names[k] : fallback));
    }
    return json_text(o);
}

char *export_tensors_json(const Model *m) {
    char err[256];
    int n;
    ModelTensor *ts = list_tensors(m, &n, err, sizeof err);
    if (!ts) TC_FATAL("naming the model's tensors: %s", err);
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *o = json_object_new();
        json_add_string(o, "name", ts[i].name);
        cJSON_AddItemToObject(o, "shape", cJSON_CreateIntArray(ts[i].shape, ts[i].ndim));
        json_add_string(o, "dtype", "F32");
        json_add_string(o, "section", ts[i].in_bn_stats ? "bn_stats" : "params");
        json_add_int(o, "offset", (long long)ts[i].offset);
        cJSON_AddItemToArray(a, o);
    }
    if (!a) TC_FATAL("out of host memory building JSON");
    free(ts);
    return json_text(a);
}

/* ---- safetensors out ---------------------------------------------------------- */

static void shape_text(char *out, size_t n, int ndim, const int *shape) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < ndim && used < n; d++) used += (size_t)snprintf(out + used, n - used, d ? ",%d" : "%d", shape[d]);
    if (used < n) snprintf(out + used, n - used, "]");
}

/* The header, padded with spaces to 8 bytes (malloc'ed, *len bytes); takes metadata. */
static char *safetensors_header(const ModelTensor *ts, int n, cJSON *metadata, size_t *len) {
    cJSON *h = json_object_new();
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = json_add_object(h, ts[i].name);
        json_add_string(t, "dtype", "F32");
        cJSON_AddItemToObject(t, "shape", cJSON_CreateIntArray(ts[i].shape, ts[i].ndim));
        cJSON *offsets = cJSON_AddArrayToObject(t, "data_offsets");
        if (!offsets) TC_FATAL("out of host memory building JSON");
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
        offset += ts[i].count * sizeof(float);
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
    }
    cJSON_AddItemToObject(h, "__metadata__", metadata);
    char *text = json_text(h);
    size_t raw = strlen(text), padded = (raw + 7) / 8 * 8;
    char *grown = realloc(text, padded + 1);
    if (!grown) TC_FATAL("out of host memory: safetensors header");
    memset(grown + raw, ' ', padded - raw);
    grown[padded] = 0;
    *len = padded;
    return grown;
}

/* Whether an existing file is a safetensors file (its header length, then a
 * JSON object): the one kind of file export replaces. */
static int is_safetensors(int fd) {
    unsigned char head[9];
    struct stat st;
    if (fstat(fd, &st) != 0 || pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head) return 0;
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)head[b] << (8 * b);
    return head[8] == '{' && header_len <= (uint64_t)st.st_size - 8;
}

/* Writes the file at a temporary name and renames it into place
 * (files_whole_begin: never over an input, a checkpoint or a file of another
 * kind); 0, or -1 with a message in err and nothing left at path. */
static int write_safetensors(const char *path, const Model *m, const ModelTensor *ts, int n, const float *params,
                             const float *stats, cJSON *metadata, char *err, size_t errlen) {
    size_t header_len, largest = 1;
    char *header = safetensors_header(ts, n, metadata, &header_len);
    for (int i = 0; i < n; i++) largest = ts[i].count > largest ? ts[i].count : largest;
    float *buf = malloc(largest * sizeof(float));
    if (!buf) TC_FATAL("out of host memory: a tensor of %zu floats", largest);
    FilesWhole out;
    char why[4000];
    int opened = files_whole_begin(&out, path, is_safetensors, why, sizeof why) == 0, ok = opened;
    FILE *f = out.f;
    if (opened) {
        unsigned char len_le[8];
        for (int b = 0; b < 8; b++) len_le[b] = (unsigned char)((uint64_t)header_len >> (8 * b));
        ok = fwrite(len_le, 1, 8, f) == 8 && fwrite(header, 1, header_len, f) == header_len;
        for (int i = 0; ok && i < n; i++) {
            model_tensor_get(m, &ts[i], params, stats, buf);
            ok = fwrite(buf, sizeof(float), ts[i].count, f) == ts[i].count;
        }
        if (!ok) {
            snprintf(why, sizeof why, "cannot write it: %s", strerror(errno));
            files_whole_abort(&out);
        } else {
            ok = files_whole_commit(&out, is_safetensors, why, sizeof why) == 0;
        }
    }
    if (!ok) snprintf(err, errlen, "--out %s: %s", path, why);
    free(buf);
    free(header);
    return ok ? 0 : -1;
}

/* ---- export from a checkpoint --------------------------------------------------- */

char *checkpoint_text_section(CkptFile *f, const char *name, char *err, size_t errlen) {
    int64_t size = ckpt_section_size(f, name);
    if (size < 0) return NULL;
    char *text = malloc((size_t)size + 1);
    if (!text) TC_FATAL("out of host memory: section %s", name);
    if (ckpt_read_section(f, name, text, (size_t)size, err, errlen) != 0) {
        free(text);
        return NULL;
    }
    text[size] = 0;
    return text;
}

cJSON *checkpoint_json_section(CkptFile *f, const char *name, char *err, size_t errlen) {
    err[0] = 0;
    char *text = checkpoint_text_section(f, name, err, errlen);
    if (!text && !err[0])
        snprintf(err, errlen, "%s predates named tensors (it has no \"%s\" section): resume from it with this "
                 "trainc and let it write a checkpoint, then use that one", ckpt_path(f), name);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    if (text && !root) snprintf(err, errlen, "%s: its \"%s\" section is not JSON", ckpt_path(f), name);
    free(text);
    return root;
}

/* Whether a JSON value is a whole number from lo to hi. */
static int whole_in(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi &&
           v->valuedouble == floor(v->valuedouble);
}

/* The checkpoint's tensor table must be the one this trainc gives the model: its
 * offsets this trainc's, or those of a checkpoint written before the layers'
 * parameters were aligned (model_packed_offset); *packed says which. */
static int check_table(const cJSON *table, const Model *m, const ModelTensor *ts, int n, const char *path,
                       int *packed, char *err, size_t errlen) {
    if (!cJSON_IsArray(table) || cJSON_GetArraySize(table) != n) {
        snprintf(err, errlen, "%s: its tensor table has %d tensors, this trainc's model %d", path,
                 cJSON_GetArraySize(table), n);
        return -1;
    }
    int fits[2] = {1, 1}; /* [0]: this layout, [1]: packed */
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(table, i);
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
        const cJSON *offset = cJSON_GetObjectItemCaseSensitive(e, "offset");
        int named = name && strcmp(name, ts[i].name) == 0 && whole_in(offset, 0, 9007199254740992.0);
        size_t at = named ? (size_t)offset->valuedouble : 0;
        fits[0] &= named && at == ts[i].offset;
        fits[1] &= named && at == (ts[i].in_bn_stats ? ts[i].offset : model_packed_offset(m, ts[i].offset));
        if (!fits[0] && !fits[1]) {
            snprintf(err, errlen, "%s: tensor %d is %s in it, %s in this trainc's model (another trainc's layout)",
                     path, i, name ? name : "unnamed", ts[i].name);
            return -1;
        }
    }
    *packed = !fits[0];
    return 0;
}

/* The meta section as safetensors __metadata__: every value a string. */
static cJSON *metadata_of(const cJSON *meta) {
    cJSON *md = json_object_new();
    json_add_string(md, "format", "pt");
    json_add_string(md, "producer", "trainc");
    for (const cJSON *item = meta->child; item; item = item->next) {
        if (cJSON_IsString(item)) {
            json_add_string(md, item->string, item->valuestring);
        } else {
            char *text = cJSON_PrintUnformatted(item);
            if (!text) TC_FATAL("out of host memory building JSON");
            json_add_string(md, item->string, text);
            cJSON_free(text);
        }
    }
    return md;
}

/* The meta's whole number key, from lo to hi; -1 with a message naming the key when it is not one. */
static int meta_int(const cJSON *meta, const char *key, int lo, int hi, const char *path, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    if (whole_in(v, lo, hi)) return (int)v->valuedouble;
    snprintf(err, errlen, "%s: its meta section's %s is not a whole number from %d to %d", path, key, lo, hi);
    return -1;
}

/* Builds the model the meta section names: from the checkpoint's net text where it has one, else by name. */
Model *model_of_meta(const cJSON *meta, const char *net_text, int batch, int nhwc, const char *path, char *err,
                     size_t errlen) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "model"));
    const char *layout = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "layout"));
    int image_size = meta_int(meta, "image_size", 8, 4096, path, err, errlen); /* data.image_size's range */
    int num_classes = image_size < 0 ? -1 : meta_int(meta, "num_classes", 1, DATASET_MAX_CLASSES, path, err, errlen);
    Model *m = calloc(1, sizeof *m);
    if (!m) TC_FATAL("out of host memory: a model");
    char why[1024], net_path[4200];
    int layout_nhwc = nhwc >= 0 ? nhwc : layout && strcmp(layout, "nhwc") == 0;
    NetShape shape = {batch, image_size, num_classes, layout_nhwc};
    snprintf(net_path, sizeof net_path, "%s (its net)", path);
    if (!name || !layout || (strcmp(layout, "nchw") != 0 && strcmp(layout, "nhwc") != 0)) {
        snprintf(err, errlen, "%s: its meta section names no model, or no layout nchw or nhwc", path);
    } else if (num_classes < 0) {
        /* err names the key */
    } else if (net_text ? netfile_build(m, net_path, net_text, &shape, why, sizeof why) != 0
                        : model_build(m, name, batch, image_size, num_classes, layout_nhwc, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: its model cannot be built: %s", path, why);
    } else {
        /* a checkpoint from before bn_eps was kept: model_init's (then the only one) */
        const cJSON *eps = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(meta, "bn_eps"), 0);
        if (cJSON_IsNumber(eps) && eps->valuedouble > 0) m->bn_eps = (float)eps->valuedouble;
        return m;
    }
    free(m);
    return NULL;
}

static float *read_floats(CkptFile *f, const char *name, size_t count, char *err, size_t errlen) {
    float *v = malloc((count ? count : 1) * sizeof(float));
    if (!v) TC_FATAL("out of host memory: %zu floats of %s", count, name);
    if (count && ckpt_read_section(f, name, v, count * sizeof(float), err, errlen) != 0) {
        free(v);
        return NULL;
    }
    return v;
}

/* packed (model_param_count floats, malloc'ed) spread into the model's layout; packed is freed. */
static float *unpack_params(const Model *m, float *packed) {
    float *params = malloc((m->n_params ? m->n_params : 1) * sizeof(float));
    if (!params) TC_FATAL("out of host memory: %zu parameters", m->n_params);
    model_unpack_params(m, packed, params);
    free(packed);
    return params;
}

int checkpoint_weights_read(const char *path, CheckpointWeights *w, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    CkptFile *f = ckpt_open(path, err, errlen);
    if (!f) return -1;
    cJSON *table = NULL;
    w->meta = checkpoint_json_section(f, "meta", err, errlen);
    if (w->meta && ckpt_meta_check(w->meta, path, err, errlen) != 0) {
        cJSON_Delete(w->meta);
        w->meta = NULL;
    }
    w->net_text = w->meta ? checkpoint_text_section(f, "net", err, errlen) : NULL; /* older checkpoints: by name */
    if (w->meta) w->model = model_of_meta(w->meta, w->net_text, 1, -1, path, err, errlen);
    if (w->model) w->tensors = list_tensors(w->model, &w->n_tensors, err, errlen);
    if (w->tensors) table = checkpoint_json_section(f, "tensors", err, errlen);
    if (table && ckpt_tensors_check(table, w->n_tensors, path, err, errlen) != 0) {
        cJSON_Delete(table);
        table = NULL;
    }
    int packed = 0;
    int ok = table && check_table(table, w->model, w->tensors, w->n_tensors, path, &packed, err, errlen) == 0 &&
             (w->params = read_floats(f, "params", packed ? model_param_count(w->model) : w->model->n_params, err,
                                      errlen)) &&
             (w->bn_stats = read_floats(f, "bn_stats", w->model->n_bn_stats, err, errlen));
    if (ok && packed) w->params = unpack_params(w->model, w->params);
    ok = ok && model_weights_check_finite(w->model, w->params, w->bn_stats, path, err, errlen) == 0;
    cJSON_Delete(table);
    ckpt_close(f);
    if (!ok) checkpoint_weights_free(w);
    return ok ? 0 : -1;
}

void checkpoint_weights_free(CheckpointWeights *w) {
    cJSON_Delete(w->meta);
    free(w->net_text);
    free(w->model);
    free(w->tensors);
    free(w->params);
    free(w->bn_stats);
    memset(w, 0, sizeof *w);
}

void checkpoint_weights_put(const CheckpointWeights *w, Model *m) {
    char err[256];
    int n;
    ModelTensor *ts = list_tensors(m, &n, err, sizeof err);
    if (!ts) TC_FATAL("naming the model's tensors: %s", err);
    if (n != w->n_tensors) TC_FATAL("internal: %d tensors into a model of %d", w->n_tensors, n);
    float *params = malloc(m->n_params * sizeof(float)), *stats = malloc((m->n_bn_stats + 1) * sizeof(float));
    float *v = malloc(m->n_params * sizeof(float));
    if (!params || !stats || !v) TC_FATAL("out of host memory: %zu parameters", m->n_params);
    model_get_params(m, params); /* padded input channels keep their zeros */
    model_get_bn_stats(m, stats);
    for (int i = 0; i < n; i++) {
        if (strcmp(ts[i].name, w->tensors[i].name) != 0)
            TC_FATAL("internal: tensor %d is %s, %s in the checkpoint", i, ts[i].name, w->tensors[i].name);
        model_tensor_get(w->model, &w->tensors[i], w->params, w->bn_stats, v);
        model_tensor_put(m, &ts[i], v, params, stats);
    }
    model_set_params(m, params);
    model_set_bn_stats(m, stats);
    free(v);
    free(params);
    free(stats);
    free(ts);
}

static int export_checkpoint(const char *ckpt_file, const char *out, char *err, size_t errlen) {
    CheckpointWeights w;
    if (checkpoint_weights_read(ckpt_file, &w, err, errlen) != 0) return -1;
    cJSON *metadata = metadata_of(w.meta);
    if (w.net_text) json_add_string(metadata, "net", w.net_text); /* tools/torch_net.py builds the module from it */
    int rc = write_safetensors(out, w.model, w.tensors, w.n_tensors, w.params, w.bn_stats, metadata, err, errlen);
    checkpoint_weights_free(&w);
    return rc;
}

static int export_usage(FILE *f, int status) {
    fprintf(f, "usage: trainc export --checkpoint FILE --format safetensors --out FILE\n"
               "  writes the checkpoint's weights and batch-norm statistics as NCHW fp32 tensors under\n"
               "  PyTorch's names, with the class names and input preparation in __metadata__\n");
    return status;
}

static int export_fail(int status, const char *fmt, const char *arg) {
    fprintf(stderr, "trainc export: error: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    return status == 2 ? export_usage(stderr, 2) : status;
}

int export_main(int argc, char **argv) {
    static const struct option options[] = {
        {"checkpoint", required_argument, NULL, 'c'}, {"format", required_argument, NULL, 'f'},
        {"out", required_argument, NULL, 'o'},        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *checkpoint = NULL, *format = NULL, *out = NULL;
    opterr = 0;
    optind = 1;
    for (int opt; (opt = getopt_long(argc, argv, ":h", options, NULL)) != -1;) {
        switch (opt) {
        case 'c': checkpoint = optarg; break;
        case 'f': format = optarg; break;
        case 'o': out = optarg; break;
        case 'h': return export_usage(stdout, 0);
        case ':': return export_fail(2, "missing value after %s", argv[optind - 1]);
        default: return export_fail(2, "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return export_fail(2, "unexpected argument %s", argv[optind]);
    if (!checkpoint || !format || !out) return export_fail(2, "%s", "--checkpoint, --format and --out are required");
    if (strcmp(format, "safetensors") != 0) return export_fail(2, "--format %s: unknown (known: safetensors)", format);
    char err[4400];
    if (export_checkpoint(checkpoint, out, err, sizeof err) != 0) return export_fail(1, "%s", err);
    printf("exported %s to %s\n", checkpoint, out);
    return 0;
}

/* ---- safetensors in -------------------------------------------------------------- */

/* Checks the file's tensor for t: F32, t's shape (the offsets safetensors_read checked). */
static int check_entry(const SafetensorsTensor *e, const ModelTensor *t, const char *path, char *err, size_t errlen) {
    if (strcmp(e->dtype, "F32") != 0) {
        snprintf(err, errlen, "%s: tensor %s is %s, not F32", path, t->name, e->dtype);
        return -1;
    }
    int same = e->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = e->shape[d] == t->shape[d];
    if (same) return 0;
    char want[96], have[200];
    size_t used = (size_t)snprintf(have, sizeof have, "[");
    for (int d = 0; d < e->ndim && used < sizeof have; d++)
        used += (size_t)snprintf(have + used, sizeof have - used, d ? ",%lld" : "%lld", (long long)e->shape[d]);
    if (used < sizeof have) snprintf(have + used, sizeof have - used, "]");
    shape_text(want, sizeof want, t->ndim, t->shape);
    snprintf(err, errlen, "%s: tensor %s has shape %s, the model's is %s", path, t->name, have, want);
    return -1;
}

/* A file tensor the model lacks; PyTorch's num_batches_tracked is let through. */
static const char *extra_tensor(const Safetensors *st, const ModelTensor *ts, int n) {
    for (int k = 0; k < st->n_tensors; k++) {
        const char *name = st->tensors[k].name, *dot = strrchr(name, '.');
        if (dot && strcmp(dot, ".num_batches_tracked") == 0) continue;
        int known = 0;
        for (int i = 0; i < n && !known; i++) known = strcmp(ts[i].name, name) == 0;
        if (!known) return name;
    }
    return NULL;
}

static int load_tensors(Model *m, const Safetensors *st, const ModelTensor *ts, int n, const char *path,
                        char *err, size_t errlen) {
    const char *extra = extra_tensor(st, ts, n);
    if (extra) {
        snprintf(err, errlen, "%s: tensor %s is not one of the model's %d (another model?)", path, extra, n);
        return -1;
    }
    float *params = malloc(m->n_params * sizeof(float)), *stats = malloc((m->n_bn_stats + 1) * sizeof(float));
    if (!params || !stats) TC_FATAL("out of host memory: %zu parameters from %s", m->n_params, path);
    model_get_params(m, params); /* padded input channels keep their zeros */
    model_get_bn_stats(m, stats);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const SafetensorsTensor *e = safetensors_find(st, ts[i].name);
        if (!e) snprintf(err, errlen, "%s: no tensor %s (the model has %d tensors)", path, ts[i].name, n);
        if (!e || check_entry(e, &ts[i], path, err, errlen) != 0) {
            rc = -1;
            break;
        }
        float *v = malloc(ts[i].count * sizeof(float));
        if (!v) TC_FATAL("out of host memory: tensor %s", ts[i].name);
        memcpy(v, e->data, ts[i].count * sizeof(float)); /* the data need not be aligned */
        rc = check_finite(v, &ts[i], path, err, errlen);
        if (rc == 0) model_tensor_put(m, &ts[i], v, params, stats);
        free(v);
    }
    if (rc == 0) {
        model_set_params(m, params);
        model_set_bn_stats(m, stats);
    }
    free(params);
    free(stats);
    return rc;
}

int import_safetensors(Model *m, const char *path, char *err, size_t errlen) {
    int n;
    ModelTensor *ts = list_tensors(m, &n, err, errlen);
    if (!ts) return -1;
    Safetensors st;
    int rc = safetensors_read(path, &st, err, errlen);
    if (rc == 0) rc = load_tensors(m, &st, ts, n, path, err, errlen);
    safetensors_free(&st);
    free(ts);
    return rc;
}
