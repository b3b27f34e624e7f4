/* trainc predict: see predict.h. */
#include "tools/trainer/predict.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/resample.h"
#include "data/transform.h"
#include "models/infer.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/json_out.h"
#include "runtime/log.h"
#include "tools/trainer/export.h"

#define PREDICT_DEFAULT_TOP 5
#define PREDICT_MAX_BATCH 32 /* images per forward: a long list runs in batches of this many */

typedef struct {
    const char *checkpoint, *device; /* device NULL: cuda where one is visible, else cpu */
    const char *top;                 /* NULL: PREDICT_DEFAULT_TOP, or every class when fewer */
    int json;
    char **images;
    int n_images;
} PredictArgs;

/* What predict takes from the checkpoint's meta section. */
typedef struct {
    int num_classes, image_size;
    TransformSpec prep;       /* the test loader's: resize to image_size, normalise, no augmentation */
    int eval_resize;          /* > 0: the shorter side resized to it, then the centre crop (random_resized) */
    const char **class_names; /* num_classes, pointing into the meta section */
} Preparation;

static int predict_usage(FILE *f, int status) {
    fprintf(f, "usage: trainc predict --checkpoint FILE [--top K] [--json] [--device cpu|cuda] IMAGE...\n"
               "  classifies JPEG, PNG or BMP images of any size with the checkpoint's model, prepared as its\n"
               "  test images were (the checkpoint holds the model, input size, normalisation and class names);\n"
               "  prints each image's K most likely classes (default %d) with their probabilities, one JSON\n"
               "  line per image with --json; --device defaults to cuda where a GPU is visible, else cpu\n",
            PREDICT_DEFAULT_TOP);
    return status;
}

static int predict_fail(int status, const char *msg) {
    fprintf(stderr, "trainc predict: error: %s\n", msg);
    return status == 2 ? predict_usage(stderr, 2) : status;
}

/* 0, or a message in err. */
static int parse_args(int argc, char **argv, PredictArgs *a, char *err, size_t errlen) {
    static const struct option options[] = {
        {"checkpoint", required_argument, NULL, 'c'}, {"top", required_argument, NULL, 'k'},
        {"json", no_argument, NULL, 'j'},             {"device", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    opterr = 0;
    optind = 1;
    for (int opt; (opt = getopt_long(argc, argv, ":h", options, NULL)) != -1;) {
        switch (opt) {
        case 'c': a->checkpoint = optarg; break;
        case 'k': a->top = optarg; break;
        case 'j': a->json = 1; break;
        case 'd': a->device = optarg; break;
        case 'h': exit(predict_usage(stdout, 0));
        case ':': snprintf(err, errlen, "missing value after %s", argv[optind - 1]); return -1;
        default: snprintf(err, errlen, "unknown option %s", argv[optind - 1]); return -1;
        }
    }
    a->images = argv + optind;
    a->n_images = argc - optind;
    if (!a->checkpoint) snprintf(err, errlen, "--checkpoint FILE is required");
    else if (a->n_images == 0) snprintf(err, errlen, "no images given: name one or more JPEG, PNG or BMP files");
    else if (a->device && strcmp(a->device, "cpu") != 0 && strcmp(a->device, "cuda") != 0)
        snprintf(err, errlen, "--device %s: cpu or cuda", a->device);
    else return 0;
    return -1;
}

/* --top as a count of classes: 1..num_classes. */
static int top_count(const char *top, int num_classes, char *err, size_t errlen) {
    if (!top) return num_classes < PREDICT_DEFAULT_TOP ? num_classes : PREDICT_DEFAULT_TOP;
    char *end;
    long k = strtol(top, &end, 10);
    if (end == top || *end || k < 1 || k > num_classes) {
        snprintf(err, errlen, "--top %s: must be a whole number from 1 to the model's %d classes", top, num_classes);
        return -1;
    }
    return (int)k;
}

static int meta_floats(const cJSON *meta, const char *key, float *out, int n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(meta, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return -1;
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(v)) return -1;
        out[i] = (float)v->valuedouble;
    }
    return 0;
}

static int read_preparation(const cJSON *meta, const Model *m, const char *path, Preparation *p, char *err,
                            size_t errlen) {
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(meta, "image_size");
    const cJSON *channels = cJSON_GetObjectItemCaseSensitive(meta, "in_channels");
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(meta, "class_names");
    p->num_classes = m->num_classes;
    p->image_size = cJSON_IsNumber(size) ? size->valueint : 0;
    const cJSON *resize = cJSON_GetObjectItemCaseSensitive(meta, "eval_resize"); /* absent before data.crop */
    p->eval_resize = cJSON_IsNumber(resize) ? resize->valueint : 0;
    transform_spec_default(&p->prep, p->image_size, p->image_size);
    int bad = !cJSON_IsNumber(channels) || channels->valueint != 3 || meta_floats(meta, "mean", p->prep.mean, 3) ||
              meta_floats(meta, "std", p->prep.std, 3) || !cJSON_IsArray(names) ||
              cJSON_GetArraySize(names) != p->num_classes;
    for (int c = 0; c < 3 && !bad; c++) bad = !isfinite(p->prep.mean[c]) || !(p->prep.std[c] > 0);
    bad = bad || p->eval_resize < 0 || (p->eval_resize > 0 && p->eval_resize < p->image_size) ||
          p->eval_resize > DATASET_MAX_SIDE;
    p->class_names = bad ? NULL : calloc((size_t)p->num_classes, sizeof *p->class_names);
    for (int k = 0; !bad && k < p->num_classes; k++) {
        p->class_names[k] = cJSON_GetStringValue(cJSON_GetArrayItem(names, k));
        bad = !p->class_names[k];
    }
    if (!bad) return 0;
    snprintf(err, errlen, "%s: its meta section lacks the input preparation predict needs (3 input channels, "
             "mean and std of 3 numbers, std > 0, eval_resize absent or from image_size to %d, %d class names)", path,
             DATASET_MAX_SIDE, p->num_classes);
    free(p->class_names);
    p->class_names = NULL;
    return -1;
}

/* Every image decoded and prepared: [n][3][size][size] floats (malloc'ed), or
 * NULL with a message naming the file. */
static float *prepare_images(char **paths, int n, const Preparation *p, char *err, size_t errlen) {
    size_t per_image = (size_t)3 * p->image_size * p->image_size;
    float *inputs = malloc((size_t)n * per_image * sizeof(float));
    if (!inputs) TC_FATAL("out of host memory: %d prepared images", n);
    for (int i = 0; i < n; i++) {
        int w, h;
        uint8_t *chw = image_file_decode_rgb(paths[i], &w, &h, err, errlen);
        if (!chw) {
            free(inputs);
            return NULL;
        }
        float *out = inputs + (size_t)i * per_image;
        if (p->eval_resize > 0) { /* as the evaluation crops (data.crop = random_resized) */
            CropBox box = crop_center(w, h, p->eval_resize, p->image_size, p->image_size);
            size_t plane = (size_t)w * h;
            ResampleSource src = {{chw, chw + plane, chw + 2 * plane}, w, w, h, 0, 0, w, h};
            ResampleScratch scratch = {0};
            resample_image(&src, &box, 0, p->image_size, p->image_size, p->prep.mean, p->prep.std, &scratch, out, NULL);
            resample_scratch_free(&scratch);
        } else {
            transform_sample(&p->prep, chw, 3, h, w, 0, out);
        }
        free(chw);
    }
    return inputs;
}

/* The inference path (models/infer.h) of the checkpoint's net: fp16 NHWC with
 * a CUDA graph on the GPU, fp32 on the CPU; convolutions by cuDNN's heuristics. */
static InferNet *open_net(const CheckpointWeights *w, GpuContext *gpu, int batch) {
    InferOptions opt = {0};
    opt.batch = batch;
    opt.dtype = gpu ? DTYPE_F16 : DTYPE_F32;
    opt.nhwc = gpu != NULL;
    opt.graph = gpu != NULL;
    opt.conv_policy.workspace_limit = (size_t)256 << 20;
    opt.conv_policy.allow_tf32 = 1;
    return infer_create(w->model, w->params, w->bn_stats, gpu, &opt);
}

/* Softmax of each row of logits in place, in double for the sum. */
static void softmax_rows(float *v, int rows, int classes) {
    for (int r = 0; r < rows; r++) {
        float *row = v + (size_t)r * classes;
        float max = row[0];
        for (int j = 1; j < classes; j++) max = row[j] > max ? row[j] : max;
        double sum = 0;
        for (int j = 0; j < classes; j++) sum += exp((double)row[j] - max);
        for (int j = 0; j < classes; j++) row[j] = (float)(exp((double)row[j] - max) / sum);
    }
}

/* Each image's class probabilities into probs [n][classes]. */
static void classify(InferNet *net, const float *inputs, int n, float *probs) {
    const OpContext *ctx = infer_ops(net);
    int batch = infer_batch(net), classes = infer_classes(net);
    size_t per_image = infer_input_floats(net) / (size_t)batch;
    for (int first = 0; first < n; first += batch) {
        int rows = n - first < batch ? n - first : batch;
        /* a short last batch: the rows past it hold the previous batch's images, whose results go unread */
        op_copy_from_host(ctx, infer_input(net), inputs + (size_t)first * per_image,
                          (size_t)rows * per_image * sizeof(float));
        infer_run(net);
        op_copy_to_host(ctx, probs + (size_t)first * classes, infer_logits(net), (size_t)rows * classes * sizeof(float));
        op_sync(ctx);
    }
    softmax_rows(probs, n, classes);
}

/* The k most probable classes of a row, most probable first (the lower index on ties). */
static void top_classes(const float *row, int classes, int k, int *out) {
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int j = 0; j < classes; j++) {
            int taken = 0;
            for (int t = 0; t < i && !taken; t++) taken = out[t] == j;
            if (!taken && (best < 0 || row[j] > row[best])) best = j;
        }
        out[i] = best;
    }
}

static void print_image(const char *path, const float *row, const int *top, int k, const Preparation *p, int json) {
    if (!json) {
        char name[4 * 4096 + 8];
        printf("%s\n", log_escape(path, name, sizeof name));
        for (int i = 0; i < k; i++)
            printf("  %2d. %.6f  %s (class %d)\n", i + 1, row[top[i]], log_escape(p->class_names[top[i]], name,
                   sizeof name), top[i]);
        return;
    }
    cJSON *o = json_object_new();
    json_add_string(o, "image", path);
    cJSON *list = cJSON_AddArrayToObject(o, "top");
    if (!list) TC_FATAL("out of host memory building JSON");
    for (int i = 0; i < k; i++) {
        cJSON *e = json_object_new();
        json_add_string(e, "class", p->class_names[top[i]]);
        json_add_int(e, "index", top[i]);
        json_add_number(e, "p", row[top[i]], 9);
        cJSON_AddItemToArray(list, e);
    }
    if (json_write_line(stdout, o) != 0) TC_USER_ERROR("writing the predictions: %s", strerror(errno));
}

/* The GPU asked for (or, without --device, the first visible one), or NULL for the CPU. */
static int pick_device(const char *device, GpuContext *gpu, GpuContext **out, char *err, size_t errlen) {
    int want_gpu = device ? strcmp(device, "cuda") == 0 : TRAINC_CUDA && gpu_count() > 0;
    *out = NULL;
    if (!want_gpu) return 0;
    if (!TRAINC_CUDA) snprintf(err, errlen, "--device cuda: this trainc was built without CUDA: use --device cpu");
    else if (gpu_count() == 0) snprintf(err, errlen, "--device cuda: no GPU is visible (use --device cpu)");
    if (!TRAINC_CUDA || gpu_count() == 0) return -1;
    gpu_context_init(gpu, 0);
    *out = gpu;
    return 0;
}

static int predict(const PredictArgs *a, char *err, size_t errlen) {
    CheckpointWeights w;
    if (checkpoint_weights_read(a->checkpoint, &w, err, errlen) != 0) return -1;
    Preparation p = {0};
    GpuContext gpu_storage, *gpu = NULL;
    float *inputs = NULL;
    int k = -1;
    if (read_preparation(w.meta, w.model, a->checkpoint, &p, err, errlen) == 0 &&
        (k = top_count(a->top, p.num_classes, err, errlen)) > 0)
        inputs = prepare_images(a->images, a->n_images, &p, err, errlen);
    if (!inputs || pick_device(a->device, &gpu_storage, &gpu, err, errlen) != 0) {
        free(inputs);
        free(p.class_names);
        checkpoint_weights_free(&w);
        return -1;
    }
    int batch = a->n_images < PREDICT_MAX_BATCH ? a->n_images : PREDICT_MAX_BATCH;
    InferNet *net = open_net(&w, gpu, batch);
    float *probs = malloc((size_t)a->n_images * p.num_classes * sizeof(float));
    int *top = malloc((size_t)k * sizeof(int));
    if (!probs || !top) TC_FATAL("out of host memory: %d images' probabilities", a->n_images);
    classify(net, inputs, a->n_images, probs);
    for (int i = 0; i < a->n_images; i++) {
        const float *row = probs + (size_t)i * p.num_classes;
        top_classes(row, p.num_classes, k, top);
        print_image(a->images[i], row, top, k, &p, a->json);
    }
    infer_destroy(net);
    if (gpu) gpu_context_destroy(gpu);
    free(top);
    free(probs);
    free(inputs);
    free(p.class_names);
    checkpoint_weights_free(&w);
    return 0;
}

int predict_main(int argc, char **argv) {
    PredictArgs a;
    char err[4400];
    if (parse_args(argc, argv, &a, err, sizeof err) != 0) return predict_fail(2, err);
    if (predict(&a, err, sizeof err) != 0) return predict_fail(1, err);
    return 0;
}
