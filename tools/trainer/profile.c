/* trainc profile (profile.h): the op hook and its event pool, the per-layer
 * table, the diagnosis, the memory split and the Chrome trace.
 *
 * Timing: the hook counts the ops of the step before the window, then (after
 * that step, outside any step) allocates a record per op of the window, on
 * the GPU with a pair of timing events each. Inside the window the hook only
 * records an event (GPU) or reads the clock (CPU): no allocation, no sync.
 * Everything is read back when the run closes. */
#include "tools/trainer/profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/json_out.h"
#include "runtime/log.h"
#include "tools/trainer/peaks.h"

/* One op of the window. */
typedef struct {
    const char *op, *label;   /* the face's name; the layer's name or NULL */
    double t0, t1;            /* host seconds (now_seconds); on the GPU filled at read-back */
    cudaEvent_t ev0, ev1;     /* GPU only */
} OpRecord;

typedef struct {
    long first, last;
    int gpu;
    Model *model;
    OpHooks hooks;            /* ours, installed on model->ops */
    const OpHooks *chained;   /* what was installed before (NVTX), called around ours */
    int active;               /* inside the window */
    long counted;             /* ops of the step before the window */
    OpRecord *rec;
    long n_rec, cap_rec, open, dropped;
    double *step_t0, *step_t1;/* host seconds of each window step's begin and end */
    cudaEvent_t base;         /* GPU: recorded at the window's start ... */
    double base_host;         /* ... when the host clock read this (the trace puts the two tracks together
                                 there: the device's ops are queued, so they run at or after it) */
    ProfileReport *report;
    const char *trace_path;
} Profiler;

/* ---- the hook ------------------------------------------------------------------ */

static void hook_begin(void *user, const OpContext *ctx, const char *op, const char *label) {
    Profiler *p = user;
    if (p->chained) p->chained->begin(p->chained->user, ctx, op, label);
    if (!p->active) {
        p->counted++;
        return;
    }
    if (p->n_rec == p->cap_rec) {
        p->dropped++;
        p->open = -1;
        return;
    }
    OpRecord *r = &p->rec[p->open = p->n_rec++];
    r->op = op;
    r->label = label;
    if (p->gpu) gpu_event_record(r->ev0, ctx->stream);
    else r->t0 = now_seconds();
}

static void hook_end(void *user, const OpContext *ctx, const char *op, const char *label) {
    Profiler *p = user;
    if (p->active && p->open >= 0) {
        OpRecord *r = &p->rec[p->open];
        if (p->gpu) gpu_event_record(r->ev1, ctx->stream);
        else r->t1 = now_seconds();
        p->open = -1;
    }
    if (p->chained) p->chained->end(p->chained->user, ctx, op, label);
}

/* ---- the observer ------------------------------------------------------------- */

static void on_opened(void *user, Model *m) {
    Profiler *p = user;
    p->model = m;
    p->gpu = m->device == DEVICE_CUDA;
    p->chained = m->ops.hooks;
    p->hooks = (OpHooks){hook_begin, hook_end, p};
    m->ops.hooks = &p->hooks;
}

/* After the step before the window: the pool, sized by that step's ops (and a
 * margin for ops that come only now and then, a log point's read-back). */
static void allocate_pool(Profiler *p) {
    long steps = p->last - p->first + 1;
    p->cap_rec = (p->counted + 16) * steps;
    p->rec = calloc((size_t)p->cap_rec, sizeof *p->rec);
    p->step_t0 = calloc((size_t)steps, sizeof *p->step_t0);
    p->step_t1 = calloc((size_t)steps, sizeof *p->step_t1);
    if (!p->rec || !p->step_t0 || !p->step_t1) TC_FATAL("out of host memory: %ld op records", p->cap_rec);
    if (!p->gpu) return;
    gpu_event_create(&p->base, 1);
    for (long i = 0; i < p->cap_rec; i++) {
        gpu_event_create(&p->rec[i].ev0, 1);
        gpu_event_create(&p->rec[i].ev1, 1);
    }
}

static void on_step_begin(void *user, long step) {
    Profiler *p = user;
    if (step == p->first - 1) p->counted = 0;
    if (step < p->first || step > p->last) return;
    if (step == p->first) {
        if (!p->rec) allocate_pool(p); /* no step before the window was seen (a resumed run) */
        p->active = 1;
        p->open = -1;
        p->base_host = now_seconds();
        if (p->gpu) gpu_event_record(p->base, p->model->ops.stream);
    }
    p->step_t0[step - p->first] = now_seconds();
}

static void on_step_end(void *user, long step) {
    Profiler *p = user;
    if (step == p->first - 1) allocate_pool(p);
    if (step < p->first || step > p->last) return;
    p->step_t1[step - p->first] = now_seconds();
    if (step == p->last) p->active = 0;
}

/* ---- FLOPs and bytes from the shapes -------------------------------------------- */

static double act_elems(const Model *m, int id) {
    const Activation *a = &m->acts[id];
    return (double)m->batch * a->c * a->h * a->w;
}

/* Forward FLOPs and bytes of a layer; backward is counted as twice forward
 * (the input's gradient and the weights', or reading y and dy for one dx). */
static void layer_cost(const Model *m, const Layer *l, ProfileLayer *pl) {
    double esize = (double)dtype_size(m->act_dtype), out = act_elems(m, l->out), in = act_elems(m, l->in);
    double weights = (double)(l->w_count + l->b_count) * esize;
    double flops = out, bytes = (in + out) * esize + weights;
    if (l->kind == LAYER_CONV) {
        const Conv2dShape *s = &l->conv.shape;
        flops = 2.0 * s->n * s->k * s->c * s->r * s->s * conv2d_out_h(s) * conv2d_out_w(s);
    } else if (l->kind == LAYER_LINEAR) {
        flops = 2.0 * l->linear.n * l->linear.in * l->linear.out;
    } else if (l->kind == LAYER_ADD) {
        bytes += in * esize;
    }
    pl->forward_flops = flops;
    pl->forward_bytes = bytes;
    pl->backward_flops = 2 * flops;
    pl->backward_bytes = 2 * bytes;
}

static void add_op_name(ProfileLayer *pl, const char *op) {
    if (strstr(pl->ops, op)) return;
    size_t used = strlen(pl->ops);
    snprintf(pl->ops + used, sizeof pl->ops - used, "%s%s", used ? "," : "", op);
}

/* ---- read-back ----------------------------------------------------------------- */

static void read_back_times(Profiler *p) {
    if (!p->gpu) return;
    if (p->n_rec) gpu_event_sync(p->rec[p->n_rec - 1].ev1);
    for (long i = 0; i < p->n_rec; i++) {
        p->rec[i].t0 = p->base_host + gpu_event_ms(p->base, p->rec[i].ev0) / 1000;
        p->rec[i].t1 = p->base_host + gpu_event_ms(p->base, p->rec[i].ev1) / 1000;
    }
}

/* The layer whose name a label points to, or -1 (the hook passes Layer.name itself). */
static int layer_of(const Model *m, const char *label) {
    const char *lo = (const char *)m->layers, *hi = (const char *)(m->layers + m->n_layers);
    if (!label || label < lo || label >= hi) return -1;
    return (int)((label - lo) / (ptrdiff_t)sizeof(Layer));
}

static void tally_layers(Profiler *p, ProfileReport *r) {
    const Model *m = p->model;
    double steps = (double)(p->last - p->first + 1);
    r->n_layers = m->n_layers;
    r->layers = calloc((size_t)m->n_layers, sizeof *r->layers);
    if (!r->layers) TC_FATAL("out of host memory: the profile's layers");
    for (int i = 0; i < m->n_layers; i++) {
        ProfileLayer *pl = &r->layers[i];
        const Activation *a = &m->acts[m->layers[i].out];
        snprintf(pl->name, sizeof pl->name, "%s", m->layers[i].name);
        pl->n = m->batch, pl->c = a->c, pl->h = a->h, pl->w = a->w;
        layer_cost(m, &m->layers[i], pl);
    }
    for (long i = 0; i < p->n_rec; i++) {
        const OpRecord *o = &p->rec[i];
        double ms = 1000 * (o->t1 - o->t0) / steps;
        int li = layer_of(m, o->label);
        if (li < 0) {
            r->outside_ms += ms;
            continue;
        }
        ProfileLayer *pl = &r->layers[li];
        if (strstr(o->op, "backward")) pl->backward_ms += ms;
        else pl->forward_ms += ms;
        add_op_name(pl, o->op);
        r->layers_ms += ms;
    }
    for (int i = 0; i < m->n_layers; i++) /* an add whose input gradients are dy itself runs no backward */
        if (!strstr(r->layers[i].ops, "backward")) r->layers[i].backward_flops = r->layers[i].backward_bytes = 0;
}

static void split_memory(const Model *m, ProfileReport *r) {
    ProfileMemory *mem = &r->memory;
    size_t n = m->n_params, esize = dtype_size(m->act_dtype);
    mem->weights = n * sizeof(float) + (m->weights != (void *)m->params ? n * esize : 0);
    mem->gradients = n * esize;
    mem->optimizer = n * sizeof(float) + (m->decay_mask ? n : 0);
    for (int i = 0; i < m->n_acts; i++) {
        const Activation *a = &m->acts[i];
        if (a->value && a->shares_with < 0 && a->internal_to < 0) mem->activations += (size_t)act_elems(m, i) * esize;
    }
    if (m->input_f32) mem->activations += model_input_floats(m) * sizeof(float);
    for (int i = 0; i < m->n_grad_slots; i++) mem->activation_grads += m->act_grad_floats[i] * esize;
    mem->workspace = m->workspace_bytes + m->bn_scratch_bytes;
    mem->peak = r->summary.peak_mem_bytes;
    size_t known = mem->weights + mem->gradients + mem->optimizer + mem->activations + mem->activation_grads +
                   mem->workspace;
    mem->other = mem->peak > known ? mem->peak - known : 0;
}

/* ---- the Chrome trace ---------------------------------------------------------- */

static cJSON *trace_event(cJSON *events, const char *name, const char *ph, int tid) {
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToArray(events, e)) TC_FATAL("out of host memory writing the trace");
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "ph", ph);
    cJSON_AddNumberToObject(e, "pid", 0); /* the rank: profile runs one process */
    cJSON_AddNumberToObject(e, "tid", tid);
    return e;
}

static void trace_span(cJSON *events, const char *name, const char *cat, int tid, double t0, double t1,
                       double base) {
    cJSON *e = trace_event(events, name, "X", tid);
    cJSON_AddStringToObject(e, "cat", cat);
    cJSON_AddNumberToObject(e, "ts", 1e6 * (t0 - base));
    cJSON_AddNumberToObject(e, "dur", 1e6 * (t1 - t0));
}

static void trace_thread_name(cJSON *events, int tid, const char *name) {
    cJSON *e = trace_event(events, "thread_name", "M", tid);
    cJSON *args = cJSON_AddObjectToObject(e, "args");
    if (!args) TC_FATAL("out of host memory writing the trace");
    cJSON_AddStringToObject(args, "name", name);
}

/* {"traceEvents": [...]}: two thread names, a "step N" span per step (host),
 * an op span per op named "layer: op" (the compute stream's event times on
 * the GPU, host time on the CPU); ts and dur in microseconds. */
static void write_trace(const Profiler *p) {
    cJSON *root = cJSON_CreateObject(), *events = root ? cJSON_AddArrayToObject(root, "traceEvents") : NULL;
    if (!events) TC_FATAL("out of host memory writing the trace");
    trace_thread_name(events, 0, "host: steps");
    trace_thread_name(events, 1, p->gpu ? "compute stream: ops" : "host: ops");
    for (long s = 0; s <= p->last - p->first; s++) {
        char name[32];
        snprintf(name, sizeof name, "step %ld", p->first + s);
        trace_span(events, name, "step", 0, p->step_t0[s], p->step_t1[s], p->base_host);
    }
    for (long i = 0; i < p->n_rec; i++) {
        const OpRecord *o = &p->rec[i];
        char name[160];
        snprintf(name, sizeof name, "%s: %s", o->label ? o->label : "outside layers", o->op);
        trace_span(events, name, "op", 1, o->t0, o->t1, p->base_host);
    }
    char *text = cJSON_PrintUnformatted(root);
    FILE *f = fopen(p->trace_path, "w");
    if (!text || !f || fputs(text, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0)
        TC_USER_ERROR("--trace %s: cannot write it", p->trace_path);
    free(text);
    cJSON_Delete(root);
}

static void on_closing(void *user, Model *m) {
    Profiler *p = user;
    read_back_times(p);
    tally_layers(p, p->report);
    split_memory(m, p->report);
    p->report->n_ops = p->n_rec;
    p->report->dropped = p->dropped;
    if (p->trace_path) write_trace(p);
    m->ops.hooks = p->chained;
    if (p->gpu && p->rec) {
        gpu_event_destroy(p->base);
        for (long i = 0; i < p->cap_rec; i++) {
            gpu_event_destroy(p->rec[i].ev0);
            gpu_event_destroy(p->rec[i].ev1);
        }
    }
}

/* ---- the run ------------------------------------------------------------------- */

int profile_parse_steps(const char *text, long *first, long *last, char *err, size_t errlen) {
    char *end;
    long a = strtol(text, &end, 10), b = -1;
    if (end != text && *end == ':') {
        const char *rest = end + 1;
        b = strtol(rest, &end, 10);
        if (end == rest) b = -1;
    }
    if (*end || b < 0 || a < 2 || b < a || b > 1000000000L) {
        snprintf(err, errlen, "--steps %s: want A:B with 2 <= A <= B (steps counted from 1; step 1 at least is "
                 "warm-up), e.g. %d:%d", text, PROFILE_DEFAULT_FIRST, PROFILE_DEFAULT_LAST);
        return -1;
    }
    *first = a, *last = b;
    return 0;
}

static void force(Config *cfg, const char *key, long v) {
    char line[128], err[512];
    snprintf(line, sizeof line, "%s=%ld", key, v);
    if (config_set(cfg, line, err, sizeof err) != 0) TC_USER_ERROR("profile: %s", err);
}

/* The switches the diagnosis reads, before profile forces its own. */
static void note_settings(const Config *cfg, ProfileSettings *o) {
    TrainSettings s;
    settings_fill(cfg, &s);
    *o = (ProfileSettings){s.run.use_gpu, s.run.gpu, s.data.workers, s.data.prefetch, s.data.pinned,
                           s.data.async_copy, s.data.transform_on_gpu, s.train.batch, s.train.sync_after_step,
                           s.train.read_loss_every, s.model.fuse, s.model.nhwc, s.precision.amp != DTYPE_F32,
                           s.precision.tf32, s.perf.conv_benchmark, s.perf.cuda_graph, s.perf.graph_node_priority,
                           (long)(s.dist.bucket_bytes >> 20), s.dist.copy_engine == SWITCH_OFF,
                           s.dist.half_allreduce};
}

void profile_run(Config *cfg, long first, long last, const char *trace_path, ProfileReport *r) {
    memset(r, 0, sizeof *r);
    r->first = first, r->last = last;
    note_settings(cfg, &r->settings);
    peaks_get(r->settings.use_gpu, r->settings.gpu, &r->peaks);
    force(cfg, "run.max_steps", last);
    force(cfg, "run.warmup_steps", first - 1);
    force(cfg, "run.epochs", 1000000); /* run.max_steps ends it */
    force(cfg, "run.eval", 0);
    force(cfg, "run.checkpoint_every", 0);
    force(cfg, "perf.cuda_graph", 0); /* events per op cannot be timed inside a replayed graph */
    Profiler p = {.first = first, .last = last, .report = r, .trace_path = trace_path, .open = -1};
    TrainObserver obs = {on_opened, on_step_begin, on_step_end, on_closing, &p};
    train_run_observed(cfg, &r->summary, &obs);
    r->gpu = p.gpu;
    if (r->summary.timed_steps != last - first + 1)
        TC_USER_ERROR("profile: the run timed %ld steps, not the %ld of --steps %ld:%ld", r->summary.timed_steps,
                      last - first + 1, first, last);
    free(p.rec);
    free(p.step_t0);
    free(p.step_t1);
}

void profile_report_free(ProfileReport *r) {
    free(r->layers);
    r->layers = NULL;
}
