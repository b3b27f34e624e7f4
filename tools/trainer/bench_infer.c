/* trainc bench-infer: see bench_infer.h. */
#include "tools/trainer/bench_infer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/infer.h"
#include "models/zoo.h"
#include "ops/backend_graph.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/json_out.h"
#include "runtime/log.h"
#include "tools/trainer/export.h"
#include "tools/trainer/infer_options.h"
#include "tools/trainer/settings.h"
#include "tools/trainer/trainer.h"

#define BENCH_INFER_MAX_BATCHES 16
#define BENCH_INFER_LATENCY_RUNS 300
#define BENCH_INFER_SPAN_S 0.5

/* "1,32,256" into batches; the count, or -1 with a message. */
static int parse_batches(const char *list, int *batches, char *err, size_t errlen) {
    int n = 0;
    for (const char *p = list; *p;) {
        char *end;
        long b = strtol(p, &end, 10);
        if (end == p || b < 1 || b > 65536 || (*end && *end != ',') || n == BENCH_INFER_MAX_BATCHES) {
            snprintf(err, errlen, "--batch %s: a comma-separated list of up to %d sizes from 1 to 65536", list,
                     BENCH_INFER_MAX_BATCHES);
            return -1;
        }
        batches[n++] = (int)b;
        p = *end ? end + 1 : end;
    }
    if (n == 0) snprintf(err, errlen, "--batch is empty");
    return n ? n : -1;
}

/* PyTorch's default initialisation (uniform in +-1/sqrt(fan_in)); batch norms the identity. */
static void random_weights(const Model *g, uint64_t seed, float *params, float *bn_stats) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < g->n_layers; i++) {
        const Layer *l = &g->layers[i];
        if (l->kind == LAYER_BATCHNORM) {
            for (size_t c = 0; c < l->w_count; c++) {
                params[l->w_off + c] = 1, params[l->b_off + c] = 0;
                bn_stats[l->stat_off + c] = 0, bn_stats[l->stat_off + l->w_count + c] = 1;
            }
            continue;
        }
        float bound = l->fan_in ? 1.0f / sqrtf((float)l->fan_in) : 0;
        for (size_t j = 0; j < l->w_count + l->b_count; j++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            size_t at = j < l->w_count ? l->w_off + j : l->b_off + (j - l->w_count);
            params[at] = bound * (2.0f * (float)(state >> 40) / (float)(1 << 24) - 1.0f);
        }
    }
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double images_per_s, p50_ms, p99_ms;
} InferTiming;

static InferTiming time_net(InferNet *net) {
    const OpContext *ctx = infer_ops(net);
    int batch = infer_batch(net);
    log_info("bench-infer: batch %d: warm-up (the CUDA graph's capture, clocks)", batch);
    for (int i = 0; i < 20; i++) infer_run(net); /* capture, plans, clocks */
    op_sync(ctx);
    cudaEvent_t start, stop;
    gpu_event_create(&start, 1);
    gpu_event_create(&stop, 1);
    int reps = 10;
    float ms = 0;
    for (int round = 0; round < 2; round++) {
        gpu_event_record(start, ctx->stream);
        for (int i = 0; i < reps; i++) infer_run(net);
        gpu_event_record(stop, ctx->stream);
        gpu_event_sync(stop);
        ms = gpu_event_ms(start, stop);
        if (round == 0) reps = (int)(BENCH_INFER_SPAN_S * 1000 / (ms / reps > 1e-3 ? ms / reps : 1e-3)) + 10;
    }
    gpu_event_destroy(start);
    gpu_event_destroy(stop);
    InferTiming t = {(double)batch * reps / (ms / 1000.0), 0, 0};
    log_info("bench-infer: batch %d: %d runs timed for throughput; now %d one by one for latency", batch, reps,
             BENCH_INFER_LATENCY_RUNS);
    double lat[BENCH_INFER_LATENCY_RUNS];
    for (int i = 0; i < BENCH_INFER_LATENCY_RUNS; i++) {
        double t0 = now_seconds();
        infer_run(net);
        op_sync(ctx);
        lat[i] = (now_seconds() - t0) * 1000.0;
    }
    qsort(lat, BENCH_INFER_LATENCY_RUNS, sizeof(double), compare_double);
    t.p50_ms = lat[BENCH_INFER_LATENCY_RUNS / 2];
    t.p99_ms = lat[BENCH_INFER_LATENCY_RUNS * 99 / 100];
    return t;
}

/* --by-layer: each op of an eager forward between two events, averaged over
 * runs; the same ops in the same order every run. */
#define BY_LAYER_MAX_OPS 1024
#define BY_LAYER_RUNS 10

typedef struct {
    cudaEvent_t begin[BY_LAYER_MAX_OPS], end[BY_LAYER_MAX_OPS];
    const char *label[BY_LAYER_MAX_OPS], *op[BY_LAYER_MAX_OPS];
    double ms[BY_LAYER_MAX_OPS];
    int n;
} OpTimes;

static void op_time_begin(void *user, const OpContext *ctx, const char *op, const char *label) {
    OpTimes *t = user;
    if (t->n >= BY_LAYER_MAX_OPS) return;
    gpu_event_record(t->begin[t->n], ctx->stream);
    t->label[t->n] = label;
    t->op[t->n] = op;
}

static void op_time_end(void *user, const OpContext *ctx, const char *op, const char *label) {
    OpTimes *t = user;
    if (t->n >= BY_LAYER_MAX_OPS) return;
    gpu_event_record(t->end[t->n++], ctx->stream);
}

static void print_by_layer(InferNet *net) {
    OpTimes *t = calloc(1, sizeof *t);
    if (!t) TC_FATAL("out of host memory");
    for (int i = 0; i < BY_LAYER_MAX_OPS; i++) gpu_event_create(&t->begin[i], 1), gpu_event_create(&t->end[i], 1);
    OpHooks hooks = {op_time_begin, op_time_end, t};
    infer_set_hooks(net, &hooks);
    int ops = 0;
    for (int run = 0; run < 3 + BY_LAYER_RUNS; run++) {
        t->n = 0;
        infer_run(net);
        op_sync(infer_ops(net));
        ops = t->n;
        for (int i = 0; run >= 3 && i < ops; i++) t->ms[i] += gpu_event_ms(t->begin[i], t->end[i]) / BY_LAYER_RUNS;
    }
    infer_set_hooks(net, NULL);
    double total = 0;
    for (int i = 0; i < ops; i++) total += t->ms[i];
    printf("by layer, batch %d (eager, each op between two events, mean of %d runs):\n", infer_batch(net),
           BY_LAYER_RUNS);
    for (int i = 0; i < ops; i++)
        printf("  %-16s %-24s %9.4f ms %5.1f%%\n", t->label[i] ? t->label[i] : "(input, logits)", t->op[i], t->ms[i],
               100 * t->ms[i] / total);
    printf("  %-41s %9.4f ms\n", "sum", total);
    for (int i = 0; i < BY_LAYER_MAX_OPS; i++) gpu_event_destroy(t->begin[i]), gpu_event_destroy(t->end[i]);
    free(t);
}

/* The net of the config, or of the checkpoint (rebuilt from its net section; by meta's name when older). */
typedef struct {
    Model *graph;
    float *params, *bn_stats;
    CheckpointWeights ckpt;
} Weights;

static void load_weights(const TrainSettings *s, const char *checkpoint, Weights *w) {
    char err[4400];
    memset(w, 0, sizeof *w);
    if (checkpoint) {
        if (checkpoint_weights_read(checkpoint, &w->ckpt, err, sizeof err) != 0) TC_USER_ERROR("--checkpoint: %s", err);
        w->graph = w->ckpt.model;
        w->params = w->ckpt.params;
        w->bn_stats = w->ckpt.bn_stats;
        return;
    }
    w->graph = calloc(1, sizeof(Model));
    if (!w->graph) TC_FATAL("out of host memory: a model");
    if (settings_build_net(s, w->graph, 1, 0, NULL, err, sizeof err) != 0)
        settings_fail(s, s->model.net ? "model.net" : "model.name", "%s", err);
    w->params = calloc(w->graph->n_params, sizeof(float));
    w->bn_stats = calloc(w->graph->n_bn_stats + 1, sizeof(float));
    if (!w->params || !w->bn_stats) TC_FATAL("out of host memory: %zu parameters", w->graph->n_params);
    random_weights(w->graph, s->run.seed, w->params, w->bn_stats);
}

static void free_weights(Weights *w) {
    if (w->ckpt.model) {
        checkpoint_weights_free(&w->ckpt);
        return;
    }
    free(w->graph);
    free(w->params);
    free(w->bn_stats);
}

/* The plans shared by the batch sizes (ops/backend_graph.h's plan cache), and where the planning stands. */
typedef struct {
    BackendPlanCache cache;
    int batch, planned;       /* the batch whose net is being built; its convolutions planned so far */
    int first_batch;          /* the batch whose plans were searched first */
} SharedPlans;

static void plan_progress(void *user, BackendPlanHow how, double seconds) {
    static const char *said[BACKEND_PLAN_HOWS] = {"searched in full", "narrowed"};
    SharedPlans *p = user;
    p->planned++;
    char from[64] = "";
    if (how == BACKEND_PLAN_NARROWED)
        snprintf(from, sizeof from, " (batch %d's plan and cuDNN's first %d for this batch)", p->first_batch,
                 BACKEND_PLAN_CACHE_FRESH);
    log_info("bench-infer: batch %d: convolution plan %d %s%s in %.2f s", p->batch, p->planned, said[how], from,
             seconds);
}

/* The net for batch, its plans chosen through the shared cache (under perf.conv_benchmark); logged. */
static InferNet *build_net(const TrainSettings *s, const Weights *w, GpuContext *gpu, SharedPlans *plans, int batch,
                           int graph) {
    InferOptions opt = infer_options_of(s, batch);
    opt.graph = graph;
    if (opt.conv_policy.benchmark) opt.conv_policy.plan_cache = &plans->cache;
    plans->batch = batch;
    plans->planned = 0;
    long before[BACKEND_PLAN_HOWS];
    memcpy(before, plans->cache.chosen, sizeof before);
    double t0 = now_seconds();
    InferNet *net = infer_create(w->graph, w->params, w->bn_stats, gpu, &opt);
    if (opt.conv_policy.benchmark)
        log_info("bench-infer: batch %d: net built in %.1f s; convolution plans: %ld searched in full, %ld narrowed to "
                 "batch %d's and cuDNN's first %d", batch, now_seconds() - t0,
                 plans->cache.chosen[BACKEND_PLAN_SEARCHED] - before[BACKEND_PLAN_SEARCHED],
                 plans->cache.chosen[BACKEND_PLAN_NARROWED] - before[BACKEND_PLAN_NARROWED], plans->first_batch,
                 BACKEND_PLAN_CACHE_FRESH);
    return net;
}

static int compare_batch_down(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

int bench_infer_main(Config *cfg, const char *batch_list, const char *checkpoint, int by_layer) {
    TrainSettings s;
    CheckpointNet net = {0};
    if (checkpoint) checkpoint_config_apply(cfg, "--checkpoint", checkpoint, &net); /* a config beside it agrees */
    settings_read(cfg, 1, &s);
    int batches[BENCH_INFER_MAX_BATCHES];
    char err[256];
    int n_batches = parse_batches(batch_list ? batch_list : "1,32,256", batches, err, sizeof err);
    if (n_batches < 0) TC_USER_ERROR("%s", err);
    if (!s.run.use_gpu) settings_fail(&s, "run.device", "bench-infer measures the GPU's inference path: use cuda");
    if (!checkpoint && s.model.num_classes == 0) { /* random weights read no data set to count the classes of */
        s.model.num_classes = 10;
        log_info("bench-infer: model.num_classes = 0 takes a data set's classes, and random weights read none: "
                 "a head of 10 (set model.num_classes for another)");
    }
    Dist solo;
    dist_init_solo(&solo);
    GpuContext gpu;
    gpu_context_init(&gpu, trainer_gpu_ordinal(&s, &solo));
    Weights w;
    load_weights(&s, checkpoint, &w);
    const char *model = checkpoint ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(w.ckpt.meta, "model"))
                                   : s.model.name;
    int image = w.graph->acts[0].h;
    /* The largest batch first: its plans are searched in full, the smaller ones' narrowed to them. */
    qsort(batches, (size_t)n_batches, sizeof *batches, compare_batch_down);
    SharedPlans *plans = calloc(1, sizeof *plans);
    if (!plans) TC_FATAL("out of host memory: the plan cache");
    plans->cache.progress = plan_progress;
    plans->cache.progress_user = plans;
    plans->first_batch = batches[0];
    for (int i = 0; i < n_batches; i++) {
        log_info("bench-infer: batch %d (%d of %d): building the net: folding the weights, choosing each "
                 "convolution's cuDNN plan%s", batches[i], i + 1, n_batches,
                 s.perf.conv_benchmark ? " (timed: perf.conv_benchmark)" : "");
        InferNet *net = build_net(&s, &w, &gpu, plans, batches[i], infer_options_of(&s, batches[i]).graph);
        InferStats st = infer_stats(net);
        log_info("bench-infer: %s at %d, batch %d on %s: %d steps, %d of %d convolutions one cuDNN graph, %d batch "
                 "norms folded, %d ReLUs and %d adds fused; %.1f MiB weights, %.1f MiB activations",
                 model ? model : "?", image, batches[i], gpu.name, st.steps, st.convs_fused, st.convs, st.bn_folded,
                 st.relu_fused, st.add_fused, st.weight_bytes / 1048576.0, st.activation_bytes / 1048576.0);
        InferTiming t = time_net(net);
        printf("infer impl=trainc model=%s image=%d batch=%d images_per_s=%.1f p50_ms=%.4f p99_ms=%.4f\n",
               model ? model : "?", image, batches[i], t.images_per_s, t.p50_ms, t.p99_ms);
        fflush(stdout);
        infer_destroy(net);
        if (!by_layer) continue;
        net = build_net(&s, &w, &gpu, plans, batches[i], 0);
        print_by_layer(net);
        infer_destroy(net);
    }
    free(plans);
    free_weights(&w);
    checkpoint_net_free(&net);
    gpu_context_destroy(&gpu);
    return 0;
}
