/* trainc profile (profile.h): the op hook and its event pool, the per-layer
 * table, the diagnosis, the memory split and the Chrome trace.
 *
 * Timing: the hook counts the ops of the step before the window, then (after
 * that step, outside any step) allocates a record per op of the window, on
 * the GPU with a pair of timing events each. Inside the window the hook only
 * records an event (GPU) or reads the clock (CPU): no allocation, no sync.
 * Everything is read back when the run closes. */
#include "tools/trainer/profile.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/placement.h"
#include "models/plan.h"
#include "runtime/check.h"
#include "runtime/files.h"
#include "runtime/gpu.h"
#include "runtime/gpu_monitor.h"
#include "runtime/json_out.h"
#include "runtime/log.h"
#include "tools/trainer/peaks.h"

/* One host phase of the window (the trainer's, through the observer). */
typedef struct {
    const char *name;
    double t0, t1;            /* host seconds */
} PhaseRecord;

/* One op of the window. */
typedef struct {
    const char *op, *label;   /* the face's name; the layer's name or NULL */
    double t0, t1;            /* host seconds (now_seconds); on the GPU filled at read-back */
    cudaEvent_t ev0, ev1;     /* GPU only */
} OpRecord;

typedef struct {
    long first, last;
    int choose;               /* no --steps: last is chosen after the warm-up (choose_window) */
    double measure_t0;        /* choose: the host clock, synced, after the warm-up's first measured step */
    int gpu;
    Model *model;
    OpHooks hooks;            /* ours, installed on model->ops */
    const OpHooks *chained;   /* what was installed before (NVTX), called around ours */
    int active;               /* inside the window */
    long counted;             /* ops of the step before the window */
    OpRecord *rec;            /* none under --graph */
    long n_rec, cap_rec, open, dropped;
    int pool_ready;           /* allocate_pool ran */
    double *step_t0, *step_t1;/* host seconds of each window step's begin and end */
    long *step_rec0;          /* each window step's first op record (the next step's ends its ops) */
    PhaseRecord *phases;      /* the window's host phases, allocated with the op records */
    long n_phases, cap_phases, counted_phases, dropped_phases;
    Dist *dist;               /* the run's ranks: the window starts after a barrier, rank 0 writes the trace */
    cudaEvent_t base;         /* GPU: recorded at the window's start ... */
    double base_host;         /* ... when the host clock read this (the trace puts the two tracks together
                                 there: the device's ops are queued, so they run at or after it) */
    ProfileReport *report;
    const char *trace_path;
    ProfileKernelsRun *kernels;  /* CUPTI's records (profile_kernels.c); NULL on the CPU */
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
    if (!p->report->graph) m->ops.hooks = &p->hooks; /* a replayed graph calls no hook */
    p->kernels = profile_kernels_open(p->gpu, &p->report->kernels);
}

/* Phases a step may have beyond the step before the window's (a resumed run
 * sees none before it): data wait and the five marks. */
#define PHASE_MARGIN 6

/* The host clock once the compute stream has drained. */
static double synced_now(const Profiler *p) {
    op_sync(&p->model->ops);
    return now_seconds();
}

/* No --steps: the window's length from the warm-up's step time (the ranks'
 * mean, so that every rank stops at the same step), logged and kept as the
 * report's note. */
static void choose_window(Profiler *p) {
    long default_steps = PROFILE_DEFAULT_LAST - PROFILE_DEFAULT_FIRST + 1, steps = default_steps;
    char why[256];
    if (p->gpu) {
        double step_s = p->measure_t0 > 0 ? (synced_now(p) - p->measure_t0) / PROFILE_MEASURED_STEPS : 0;
        dist_allreduce_sum_host_double(p->dist, &step_s, 1);
        double need_s = fmax(GPU_MONITOR_UTIL_MIN_S, GPU_MONITOR_POWER_MIN_S) * PROFILE_WINDOW_MARGIN;
        steps = profile_window_steps(step_s / p->dist->world, need_s, default_steps, PROFILE_AUTO_MAX_STEPS, why,
                                     sizeof why);
    } else {
        snprintf(why, sizeof why, "the default %ld steps (the CPU: no NVML figures that need a longer window)",
                 default_steps);
    }
    p->last = p->report->last = p->first + steps - 1;
    snprintf(p->report->window_note, sizeof p->report->window_note, "steps %ld..%ld, %s; --steps A:B sets the window",
             p->first, p->last, why);
    log_info("profile: %s", p->report->window_note);
}

/* After the step before the window: the pool, sized by that step's ops (and a
 * margin for ops that come only now and then, a log point's read-back). */
static void allocate_pool(Profiler *p) {
    if (p->choose) choose_window(p);
    long steps = p->last - p->first + 1;
    p->pool_ready = 1;
    p->cap_rec = p->report->graph ? 0 : (p->counted + 16) * steps;
    p->cap_phases = (p->counted_phases + PHASE_MARGIN) * steps;
    p->rec = p->cap_rec ? calloc((size_t)p->cap_rec, sizeof *p->rec) : NULL;
    p->phases = calloc((size_t)p->cap_phases, sizeof *p->phases);
    p->step_t0 = calloc((size_t)steps, sizeof *p->step_t0);
    p->step_t1 = calloc((size_t)steps, sizeof *p->step_t1);
    p->step_rec0 = calloc((size_t)steps, sizeof *p->step_rec0);
    if ((p->cap_rec && !p->rec) || !p->phases || !p->step_t0 || !p->step_t1 || !p->step_rec0)
        TC_FATAL("out of host memory: %ld op records", p->cap_rec);
    if (!p->gpu) return;
    gpu_event_create(&p->base, 1);
    for (long i = 0; i < p->cap_rec; i++) {
        gpu_event_create(&p->rec[i].ev0, 1);
        gpu_event_create(&p->rec[i].ev1, 1);
    }
}

static void on_step_begin(void *user, long step) {
    Profiler *p = user;
    if (step == p->first - 1) p->counted = p->counted_phases = 0;
    if (step < p->first || step > p->last) return;
    if (step == p->first) {
        if (!p->pool_ready) allocate_pool(p); /* no step before the window was seen (a resumed run) */
        p->active = 1;
        p->open = -1;
        /* The ranks' common time base: each takes it on leaving this barrier,
         * so their tracks line up to the barrier's exit skew (microseconds on
         * one host) whatever their clocks read. */
        dist_barrier(p->dist);
        p->base_host = now_seconds();
        if (p->gpu) gpu_event_record(p->base, p->model->ops.stream);
        profile_kernels_window_begin(p->kernels, p->model->ops.stream);
    }
    p->step_t0[step - p->first] = now_seconds();
    p->step_rec0[step - p->first] = p->n_rec;
}

static void on_step_end(void *user, long step) {
    Profiler *p = user;
    if (p->choose && p->gpu && step == p->first - 1 - PROFILE_MEASURED_STEPS) p->measure_t0 = synced_now(p);
    if (step == p->first - 1) allocate_pool(p);
    if (step < p->first || step > p->last) return;
    p->step_t1[step - p->first] = now_seconds();
    if (step == p->last) p->active = 0;
    if (step == p->last) profile_kernels_window_end(p->kernels);
}

/* A chosen window ends the run after its last step (run.max_steps leaves room for the longest). */
static int on_stop_after(void *user, long step) {
    const Profiler *p = user;
    return p->choose && p->pool_ready && step >= p->last;
}

static void on_phase(void *user, long step, const char *name, double t0, double t1) {
    Profiler *p = user;
    if (step == p->first - 1) p->counted_phases++;
    if (step < p->first || step > p->last) return;
    if (p->n_phases == p->cap_phases) {
        p->dropped_phases++;
        return;
    }
    p->phases[p->n_phases++] = (PhaseRecord){name, t0, t1};
}

/* ---- FLOPs and bytes from the shapes -------------------------------------------- */

static double act_elems(const Model *m, int id) {
    const Activation *a = &m->acts[id];
    return (double)m->batch * a->c * a->h * a->w;
}

/* Forward FLOPs and bytes of a layer; backward is counted as twice forward
 * (the input's gradient and the weights', or reading y and dy for one dx). */
static void layer_cost(const Model *m, const Layer *l, ProfileLayer *pl) {
    /* The default, an element of flops and its input and output read and written, fits the elementwise
     * kinds (ReLU, GELU, SiLU, dropout, scale) and the pools; a new kind: give it its cost here if that does
     * not fit, then count it. */
    _Static_assert(LAYER_KINDS == 13, "layer_cost: a layer kind this function has not been checked for");
    double esize = (double)dtype_size(m->act_dtype), out = act_elems(m, l->out), in = act_elems(m, l->in);
    double weights = (double)(l->w_count + l->b_count) * esize;
    double flops = model_layer_flops(m, (int)(l - m->layers)), bytes = (in + out) * esize + weights;
    const LayerPlan *lp = plan_of(m, l);
    if (l->kind == LAYER_CONV && lp->pool_layer >= 0) { /* conv_bias_relu_pool: the real channels, the pool's output */
        flops = flops / l->conv.shape.c * m->acts[l->in].c_real;
        bytes = (in + act_elems(m, m->layers[lp->pool_layer].out)) * esize + weights;
    } else if (l->kind == LAYER_ADD) {
        bytes += in * esize;
    } else if (l->kind == LAYER_CONCAT) { /* a copy: the second input read too, no arithmetic */
        bytes += act_elems(m, l->in2) * esize;
        flops = 0;
    } else if (l->kind == LAYER_FLATTEN) { /* its input's storage: nothing runs */
        flops = bytes = 0;
    }
    pl->forward_flops = flops;
    pl->forward_bytes = bytes;
    pl->backward_flops = 2 * flops;
    pl->backward_bytes = 2 * bytes;
    if (l->kind == LAYER_BATCHNORM && lp->pool_layer >= 0) /* its pass writes the pool's output, not its own */
        pl->forward_bytes = (in + act_elems(m, m->layers[lp->pool_layer].out)) * esize + weights;
    if (l->kind == LAYER_MAXPOOL && lp->pool_by_bn) pl->forward_flops = pl->forward_bytes = 0; /* in the norm's pass */
    if (l->kind == LAYER_BATCHNORM && lp->by_conv_prologue) /* its scale and bias alone: the conv after it applies it */
        pl->forward_flops = pl->forward_bytes = 0;
    if (l->kind != LAYER_CONV) return;
    double data = conv2d_timed_us(&m->ops, &l->conv, CONV2D_DATA), filter = conv2d_timed_us(&m->ops, &l->conv,
                                                                                            CONV2D_FILTER);
    pl->timed_forward_ms = conv2d_timed_us(&m->ops, &l->conv, CONV2D_FORWARD) / 1000;
    pl->timed_backward_ms = data > 0 && filter > 0 ? (data + filter) / 1000 : 0;
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

static void add_outside(ProfileReport *r, const char *op, double ms) {
    int i = 0;
    while (i < r->n_outside && strcmp(r->outside[i].op, op) != 0) i++;
    if (i == PROFILE_MAX_OUTSIDE) i--;
    else if (i == r->n_outside) snprintf(r->outside[r->n_outside++].op, sizeof r->outside[i].op, "%s", op);
    r->outside[i].ms += ms;
    r->outside_ms += ms;
}

/* A layer that model.fuse joined with another: its pass takes the next one's work, or the previous one does
 * its work (models/plan.h). */
static int fused(const LayerPlan *p) {
    return p->bias_relu || p->act != BN_ACT_NONE || p->by_producer || p->bias_layer >= 0 || p->add_relu;
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
        if (m->layers[i].kind == LAYER_CONV || m->layers[i].kind == LAYER_LINEAR)
            r->product_flops += pl->forward_flops + pl->backward_flops;
    }
    for (long i = 0; i < p->n_rec; i++) {
        const OpRecord *o = &p->rec[i];
        double ms = 1000 * (o->t1 - o->t0) / steps;
        int li = layer_of(m, o->label);
        if (li < 0) {
            add_outside(r, o->op, ms);
            continue;
        }
        ProfileLayer *pl = &r->layers[li];
        if (strstr(o->op, "backward") || strstr(o->op, "_grad")) pl->backward_ms += ms; /* conv2d_bias_grad */
        else pl->forward_ms += ms;
        if (!strcmp(o->op, "conv2d_forward")) pl->conv_forward_ms += ms, pl->conv_forward_runs += 1 / steps;
        if (!strcmp(o->op, "conv2d_backward")) pl->conv_backward_ms += ms, pl->conv_backward_runs += 1 / steps;
        add_op_name(pl, o->op);
        r->layers_ms += ms;
    }
    for (int i = 0; i < m->n_layers; i++) {
        ProfileLayer *pl = &r->layers[i];
        /* an add whose input gradients are dy itself runs no backward; an activation fused into the layer
         * before it (model.fuse) runs nothing, its work in that layer's passes */
        if (!strstr(pl->ops, "backward")) pl->backward_flops = pl->backward_bytes = 0;
        if (fused(&m->plan->layers[i]) && !pl->ops[0]) pl->forward_flops = pl->forward_bytes = 0;
        /* an add computed by the batch norm before it (add_by_bn): its forward is that pass's, which reads one
         * tensor more, the residual (a max-pool in a norm's pass, pool_by_bn, is counted so too) */
        if (m->plan->layers[i].add_by_bn || m->plan->layers[i].pool_by_bn) {
            r->layers[i - 1].forward_bytes += act_elems(m, m->layers[i].out) * (double)dtype_size(m->act_dtype);
            pl->forward_flops = pl->forward_bytes = 0;
        }
    }
}

static void split_memory(const Model *m, ProfileReport *r) {
    ProfileMemory *mem = &r->memory;
    size_t n = m->n_params, esize = dtype_size(m->act_dtype);
    mem->weights = n * sizeof(float) + (m->weights != (void *)m->params ? n * esize : 0);
    mem->gradients = n * esize;
    mem->optimizer = n * sizeof(float) + (m->decay_mask ? n : 0);
    for (int i = 0; i < m->n_acts; i++)
        if (model_act_stored(m, i)) mem->activations += (size_t)act_elems(m, i) * esize;
    if (m->input_f32) mem->activations += model_input_floats(m) * sizeof(float);
    for (int i = 0; i < m->n_grad_slots; i++) mem->activation_grads += m->act_grad_floats[i] * esize;
    mem->workspace = m->workspace_bytes + m->bn_scratch_bytes;
    mem->peak = r->summary.peak_mem_bytes;
    size_t known = mem->weights + mem->gradients + mem->optimizer + mem->activations + mem->activation_grads +
                   mem->workspace;
    mem->other = mem->peak > known ? mem->peak - known : 0;
}

/* ---- the Chrome trace ---------------------------------------------------------- */

/* An event without its pid: write_trace gives every event its rank's at the end. */
static cJSON *trace_event(cJSON *events, const char *name, const char *ph, int tid) {
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToArray(events, e)) TC_FATAL("out of host memory writing the trace");
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "ph", ph);
    cJSON_AddNumberToObject(e, "tid", tid);
    return e;
}

static cJSON *trace_span(cJSON *events, const char *name, const char *cat, int tid, double t0, double t1,
                         double base) {
    cJSON *e = trace_event(events, name, "X", tid);
    cJSON_AddStringToObject(e, "cat", cat);
    cJSON_AddNumberToObject(e, "ts", 1e6 * (t0 - base));
    cJSON_AddNumberToObject(e, "dur", 1e6 * (t1 - t0));
    return e;
}

/* A layer's op span carries its layer's FLOPs and bytes of that pass (from
 * the shapes, as in the table): a tool reading the trace gets TFLOP/s per op. */
static void trace_op_cost(cJSON *span, const ProfileLayer *l, int backward) {
    cJSON *args = cJSON_AddObjectToObject(span, "args");
    if (!args) TC_FATAL("out of host memory writing the trace");
    cJSON_AddNumberToObject(args, "flops", backward ? l->backward_flops : l->forward_flops);
    cJSON_AddNumberToObject(args, "bytes", backward ? l->backward_bytes : l->forward_bytes);
}

/* A metadata event: "thread_name" or "process_name". */
static void trace_name(cJSON *events, const char *what, int tid, const char *name) {
    cJSON *e = trace_event(events, what, "M", tid);
    cJSON *args = cJSON_AddObjectToObject(e, "args");
    if (!args) TC_FATAL("out of host memory writing the trace");
    cJSON_AddStringToObject(args, "name", name);
}

static void trace_thread_name(cJSON *events, int tid, const char *name) {
    trace_name(events, "thread_name", tid, name);
}

/* pid = the rank, on every event (those added by others too). */
static void stamp_pid(cJSON *events, int rank) {
    cJSON *e;
    cJSON_ArrayForEach(e, events) {
        cJSON *pid = cJSON_CreateNumber(rank);
        if (!pid) TC_FATAL("out of host memory writing the trace");
        if (cJSON_HasObjectItem(e, "pid")) cJSON_ReplaceItemInObjectCaseSensitive(e, "pid", pid);
        else cJSON_AddItemToObject(e, "pid", pid);
    }
}

/* On the GPU, each step's span on the compute stream: from its first op's start to its last op's end. The host
 * queues a step's work and goes on (without train.sync_after_step), so its host span can be a fraction of the
 * time the device takes for it: the timeline shows both. */
static void trace_gpu_steps(const Profiler *p, cJSON *events) {
    long steps = p->last - p->first + 1;
    for (long s = 0; s < steps; s++) {
        long r0 = p->step_rec0[s], r1 = s + 1 < steps ? p->step_rec0[s + 1] : p->n_rec;
        if (r1 <= r0) continue;
        double t0 = p->rec[r0].t0, t1 = p->rec[r0].t1;
        for (long i = r0; i < r1; i++) t0 = fmin(t0, p->rec[i].t0), t1 = fmax(t1, p->rec[i].t1);
        char name[40];
        snprintf(name, sizeof name, "step %ld on the GPU", p->first + s);
        trace_span(events, name, "gpu_step", 3, t0, t1, p->base_host);
    }
}

/* This rank's events: its process name ("rank N"), three thread names, a
 * "step N" span per step and a span per host phase (host), an op span per op
 * named "layer: op" (the compute stream's event times on the GPU, host time
 * on the CPU) and on the GPU a step's span on the compute stream (trace_gpu_steps); ts and dur in
 * microseconds from the window's start. */
static cJSON *trace_events(const Profiler *p) {
    cJSON *events = cJSON_CreateArray();
    if (!events) TC_FATAL("out of host memory writing the trace");
    char rank_name[32];
    snprintf(rank_name, sizeof rank_name, "rank %d", p->dist->rank);
    trace_name(events, "process_name", 0, rank_name);
    trace_thread_name(events, 0, "host: steps");
    if (!p->report->graph) trace_thread_name(events, 1, p->gpu ? "compute stream: ops" : "host: ops");
    trace_thread_name(events, 2, "host: phases");
    if (p->gpu && !p->report->graph) {
        trace_thread_name(events, 3, "compute stream: steps");
        trace_gpu_steps(p, events);
    }
    for (long s = 0; s <= p->last - p->first; s++) {
        char name[32];
        snprintf(name, sizeof name, "step %ld", p->first + s);
        trace_span(events, name, "step", 0, p->step_t0[s], p->step_t1[s], p->base_host);
    }
    for (long i = 0; i < p->n_phases; i++)
        trace_span(events, p->phases[i].name, "phase", 2, p->phases[i].t0, p->phases[i].t1, p->base_host);
    for (long i = 0; i < p->n_rec; i++) {
        const OpRecord *o = &p->rec[i];
        char name[160];
        snprintf(name, sizeof name, "%s: %s", o->label ? o->label : "outside layers", o->op);
        cJSON *span = trace_span(events, name, "op", 1, o->t0, o->t1, p->base_host);
        int li = layer_of(p->model, o->label);
        if (li >= 0) trace_op_cost(span, &p->report->layers[li], strstr(o->op, "backward") != NULL);
    }
    profile_kernels_trace(p->kernels, events, p->report->rank, p->base_host);
    return events;
}

/* Rank 0's file: its own events, then each other rank's as that rank sent them. */
static void write_trace_file(const char *path, cJSON *events, const char *gathered, const size_t *counts,
                             int world) {
    cJSON *root = cJSON_CreateObject();
    if (!root || !cJSON_AddItemToObject(root, "traceEvents", events)) TC_FATAL("out of host memory writing the trace");
    const char *at = gathered + counts[0];
    for (int r = 1; r < world; r++) {
        cJSON *theirs = cJSON_ParseWithLength(at, counts[r]), *e;
        if (!cJSON_IsArray(theirs)) TC_FATAL("--trace: rank %d's events do not parse", r);
        at += counts[r];
        while ((e = cJSON_DetachItemFromArray(theirs, 0))) cJSON_AddItemToArray(events, e);
        cJSON_Delete(theirs);
    }
    char *text = cJSON_PrintUnformatted(root);
    char err[4400] = "cannot write it";
    FILE *f = text ? files_open_output(path, 0, err, sizeof err) : NULL;
    if (!f) TC_USER_ERROR("--trace %s: %s", path, err);
    if (fputs(text, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0)
        TC_USER_ERROR("--trace %s: cannot write it: %s", path, strerror(errno));
    free(text);
    cJSON_Delete(root);
}

/* {"traceEvents": [...]}, Chrome's trace-event JSON, one process per rank
 * (pid = rank): each rank sends its events as text to rank 0, which writes
 * them all to one file. */
static void write_trace(const Profiler *p) {
    cJSON *events = trace_events(p);
    stamp_pid(events, p->dist->rank);
    char *mine = cJSON_PrintUnformatted(events);
    if (!mine) TC_FATAL("out of host memory writing the trace");
    size_t *counts = calloc((size_t)p->dist->world, sizeof *counts);
    if (!counts) TC_FATAL("out of host memory writing the trace");
    char *gathered = dist_gather_bytes(p->dist, mine, strlen(mine), 0, counts);
    free(mine);
    if (p->dist->rank == 0) write_trace_file(p->trace_path, events, gathered, counts, p->dist->world);
    else cJSON_Delete(events);
    free(gathered);
    free(counts);
}

static void on_closing(void *user, Model *m) {
    Profiler *p = user;
    read_back_times(p);
    profile_kernels_collect(p->kernels, p->last - p->first + 1);
    tally_layers(p, p->report);
    split_memory(m, p->report);
    p->report->n_ops = p->n_rec;
    p->report->dropped = p->dropped;
    if (p->dropped_phases) log_warn("profile: %ld host phases past the pool are not in the trace", p->dropped_phases);
    if (p->trace_path) write_trace(p);
    p->report->timeline = trace_events(p); /* the HTML report's timeline (profile_html.c) */
    profile_kernels_close(p->kernels);
    m->ops.hooks = p->chained;
    if (p->gpu && p->pool_ready) {
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

long profile_window_steps(double step_s, double need_s, long default_steps, long max_steps, char *why, size_t n) {
    if (!(step_s > 0)) {
        snprintf(why, n, "the default %ld steps (no warm-up step was timed)", default_steps);
        return default_steps;
    }
    double wanted = ceil(need_s / step_s), ms = 1000 * step_s;
    if (wanted <= default_steps) {
        snprintf(why, n, "the default %ld steps: at the warm-up's %.3g ms a step they span %.2f s, NVML's "
                 "utilisation and power want %.3g s", default_steps, ms, default_steps * step_s, need_s);
        return default_steps;
    }
    long steps = wanted > max_steps ? max_steps : (long)wanted;
    snprintf(why, n, "%ld steps%s: at the warm-up's %.3g ms a step they span %.2f s, NVML's utilisation and power "
             "want %.3g s (%.0f steps)", steps, steps < wanted ? ", the most it takes" : "", ms, steps * step_s, need_s,
             wanted);
    return steps;
}

static void force(Config *cfg, const char *key, long v) {
    char line[128], err[512];
    snprintf(line, sizeof line, "%s=%ld", key, v);
    if (config_set(cfg, line, err, sizeof err) != 0) TC_USER_ERROR("profile: %s", err);
}

/* Each rank's step and data wait to rank 0, there their least and most. */
static void gather_rank_times(Dist *dist, ProfileReport *r) {
    double mine[2] = {r->summary.step_ms, r->summary.phase_data_wait_ms};
    size_t *counts = calloc((size_t)dist->world, sizeof *counts);
    if (!counts) TC_FATAL("out of host memory gathering the ranks' times");
    double *all = (double *)dist_gather_bytes(dist, mine, sizeof mine, 0, counts);
    r->step_ms_min = r->step_ms_max = mine[0];
    r->wait_ms_min = r->wait_ms_max = mine[1];
    for (int i = 1; all && i < dist->world; i++) {
        r->step_ms_min = fmin(r->step_ms_min, all[2 * i]), r->step_ms_max = fmax(r->step_ms_max, all[2 * i]);
        r->wait_ms_min = fmin(r->wait_ms_min, all[2 * i + 1]), r->wait_ms_max = fmax(r->wait_ms_max, all[2 * i + 1]);
    }
    free(all);
    free(counts);
}

/* The switches the diagnosis reads, before profile forces its own. */
static void note_settings(const Config *cfg, ProfileSettings *o) {
    TrainSettings s;
    settings_fill(cfg, &s);
    *o = (ProfileSettings){s.run.use_gpu, s.run.gpu, s.data.workers, s.data.prefetch, s.data.pinned,
                           s.data.async_copy, s.data.transform_on_gpu, s.train.batch, s.train.sync_after_step,
                           s.train.read_loss_every, s.model.fuse, s.model.nhwc, s.precision.amp != DTYPE_F32,
                           s.precision.tf32, s.perf.conv_benchmark, s.perf.cuda_graph, s.perf.graph_node_priority,
                           s.perf.overlap_wgrad, (long)(s.dist.bucket_bytes >> 20), s.dist.copy_engine == SWITCH_OFF,
                           s.dist.half_allreduce, s.data.resized_crop, s.data.dct_scaling,
                           strcmp(s.data.source, "image_folder") == 0, s.data.decode == DATA_DECODE_CPU, ""};
    snprintf(o->metrics_file, sizeof o->metrics_file, "%s", s.run.metrics_file);
}

void profile_run(Config *cfg, long first, long last, const char *trace_path, int graph, ProfileReport *r) {
    Dist solo;
    dist_init_solo(&solo);
    profile_run_dist(cfg, &solo, first, last, trace_path, graph, r);
}

void profile_run_dist(Config *cfg, Dist *dist, long first, long last, const char *trace_path, int graph,
                      ProfileReport *r) {
    memset(r, 0, sizeof *r);
    int choose = last == PROFILE_AUTO_LAST;
    if (choose) last = first + PROFILE_DEFAULT_LAST - PROFILE_DEFAULT_FIRST;
    r->first = first, r->last = last, r->graph = graph;
    r->rank = dist->rank, r->world = dist->world;
    note_settings(cfg, &r->settings);
    if (graph && !r->settings.use_gpu)
        TC_USER_ERROR("profile --graph: the step's CUDA graph needs the GPU (run.device = cuda; this run is on "
                      "the CPU)");
    if (graph && first < PROFILE_GRAPH_FIRST)
        TC_USER_ERROR("profile --graph: the window starts at step %ld; step 1 runs eagerly and step 2 captures "
                      "the graph, so start it at %d or later", first, PROFILE_GRAPH_FIRST);
    r->settings.cuda_graph |= graph; /* on in this run: not a switch to suggest */
    if (dist->world > 1 && r->settings.use_gpu) { /* as train_open picks it: one GPU per rank */
        char err[256];
        r->settings.gpu = dist_pick_device(dist->local_rank, dist->local_world, gpu_count(), err, sizeof err);
        if (r->settings.gpu < 0) TC_USER_ERROR("%s", err);
    }
    peaks_get(r->settings.use_gpu, r->settings.gpu, &r->peaks);
    force(cfg, "run.max_steps", choose && r->settings.use_gpu ? first - 1 + PROFILE_AUTO_MAX_STEPS : last);
    force(cfg, "run.warmup_steps", first - 1);
    force(cfg, "run.epochs", 1000000); /* run.max_steps ends it */
    force(cfg, "run.eval", 0);
    force(cfg, "run.checkpoint_every", 0);
    force(cfg, "run.save_final", 0);
    force(cfg, "run.warmup_runs", 0); /* one pass over the steps profiled */
    force(cfg, "perf.cuda_graph", graph); /* events per op cannot be timed inside a replayed graph */
    if (!graph) force(cfg, "perf.overlap_wgrad", 0); /* no filter gradient running beside a timed op */
    Profiler p = {.first = first, .last = last, .choose = choose, .report = r, .trace_path = trace_path, .open = -1,
                  .dist = dist};
    TrainObserver obs = {on_opened, on_step_begin, on_step_end, on_closing, &p, on_phase, on_stop_after};
    train_run_dist_observed(cfg, &r->summary, dist, &obs);
    r->gpu = p.gpu;
    last = p.last;
    if (r->summary.timed_steps != last - first + 1)
        TC_USER_ERROR("profile: the run timed %ld steps, not the %ld of --steps %ld:%ld", r->summary.timed_steps,
                      last - first + 1, first, last);
    gather_rank_times(dist, r);
    free(p.rec);
    free(p.phases);
    free(p.step_t0);
    free(p.step_t1);
    free(p.step_rec0);
}

void profile_print_ranks(const ProfileReport *r, FILE *f) {
    if (r->world <= 1) return;
    fprintf(f, "\n== ranks: %d ==\nstep %.4f to %.4f ms, data wait %.4f to %.4f ms per step (the fastest and the "
            "slowest rank; the report above is rank 0's)\n", r->world, r->step_ms_min, r->step_ms_max, r->wait_ms_min,
            r->wait_ms_max);
}

void profile_report_free(ProfileReport *r) {
    free(r->layers);
    r->layers = NULL;
    cJSON_Delete(r->timeline);
    r->timeline = NULL;
}
