/* Watching a training run: phase timing from events on the compute stream,
 * the metrics file (run.metrics_file), the profiler range (run.profile_steps),
 * log points, the progress line, the Prometheus gauges (monitor.*) and the
 * TensorBoard event file (run.tensorboard_dir). */
#include "tools/trainer/trainer.h"
#include "runtime/json_out.h"

/* ---- phase timing ------------------------------------------------------------ */

void phases_init(Trainer *t) {
    Phases *p = &t->watch.phases;
    memset(p, 0, sizeof *p);
    p->open = -1;
    p->observed = t->observer && t->observer->phase;
    if (!t->set.run.use_gpu) return;
    for (int i = 0; i < PHASE_RING; i++)
        for (int m = 0; m < PH_MARKS; m++) gpu_event_create(&p->ring[i].ev[m], 1);
}

void phases_destroy(Trainer *t) {
    if (!t->set.run.use_gpu) return;
    for (int i = 0; i < PHASE_RING; i++)
        for (int m = 0; m < PH_MARKS; m++) gpu_event_destroy(t->watch.phases.ring[i].ev[m]);
}

/* Adds a finished set's phases to the sums (when it was timed). */
static void collect_set(Trainer *t, PhaseSet *s) {
    int prev = -1;
    for (int m = 0; m < PH_MARKS; m++) {
        if (!(s->marked & (1u << m))) continue;
        if (prev >= 0 && s->timed) {
            float ms;
            if (t->set.run.use_gpu) ms = gpu_event_ms(s->ev[prev], s->ev[m]);
            else ms = (float)(1000 * (s->host[m] - s->host[prev]));
            t->watch.phases.timed_ms[prev] += ms;
        }
        prev = m;
    }
    s->pending = 0;
}

/* Reads back the sets whose last event has completed; wait: all of them. */
void phases_collect(Trainer *t, int wait) {
    for (int i = 0; i < PHASE_RING; i++) {
        PhaseSet *s = &t->watch.phases.ring[i];
        if (!s->pending) continue;
        if (t->set.run.use_gpu && wait) gpu_event_sync(s->ev[PH_END]);
        else if (t->set.run.use_gpu && !gpu_event_done(s->ev[PH_END])) continue; /* not there yet */
        collect_set(t, s);
    }
}

/* The start of phase m of this micro-batch (the first mark opens a set). */
void phase_mark(Trainer *t, int m) {
    Phases *p = &t->watch.phases;
    if (p->open < 0) {
        PhaseSet *s = &p->ring[p->next];
        if (s->pending) {
            if (t->set.run.use_gpu) gpu_event_sync(s->ev[PH_END]);
            collect_set(t, s);
        }
        s->marked = 0;
        p->open = p->next;
        p->next = (p->next + 1) % PHASE_RING;
    }
    PhaseSet *s = &p->ring[p->open];
    if (t->set.run.use_gpu) gpu_event_record(s->ev[m], t->device.gpu.compute);
    if (!t->set.run.use_gpu || p->observed) s->host[m] = now_seconds();
    s->marked |= 1u << m;
}

void phase_wait_begin(Trainer *t) {
    if (t->watch.phases.observed) t->watch.phases.wait_t0 = now_seconds();
}

/* The observer's phases of a set just closed, by their host marks: the data
 * wait (take_batch's start to the input mark) and each mark to the next. */
static void observe_phases(Trainer *t, const PhaseSet *s) {
    static const char *names[PH_END] = {"input", "forward", "backward", "optimizer", "graph"};
    const TrainObserver *obs = t->observer;
    long step = t->step + 1; /* the step in progress */
    if ((s->marked & (1u << PH_INPUT)) && t->watch.phases.wait_t0 > 0)
        obs->phase(obs->user, step, "data wait", t->watch.phases.wait_t0, s->host[PH_INPUT]);
    t->watch.phases.wait_t0 = 0;
    int prev = -1;
    for (int m = 0; m < PH_MARKS; m++) {
        if (!(s->marked & (1u << m))) continue;
        if (prev >= 0) obs->phase(obs->user, step, names[prev], s->host[prev], s->host[m]);
        prev = m;
    }
}

/* The end of the micro-batch's last phase. */
void phase_close(Trainer *t, int timed) {
    Phases *p = &t->watch.phases;
    if (p->open < 0) return;
    phase_mark(t, PH_END);
    if (p->observed) observe_phases(t, &p->ring[p->open]);
    p->ring[p->open].timed = timed;
    p->ring[p->open].pending = 1;
    p->open = -1;
}

/* Forward, backward and optimizer are timed one by one only when run eagerly:
 * under perf.cuda_graph they are inside the graph (PH_GRAPH times it whole). */
void eager_mark(Trainer *t, int m) {
    if (!t->set.perf.cuda_graph) phase_mark(t, m);
}

/* ---- the metrics file (run.metrics_file) ------------------------------------ */

/* A step's line: {"step": .., "epoch": .., ...}. Epochs count from 1 in the
 * metrics file, as in the log; epoch is the loop's (from 0). */
static cJSON *metric_step_line(Trainer *t, int epoch) {
    cJSON *o = json_object_new();
    json_add_int(o, "step", t->step);
    json_add_int(o, "epoch", epoch + 1);
    return o;
}

static void write_metric_line(Trainer *t, cJSON *o) {
    if (json_write_line(t->watch.metrics, o) != 0) TC_FATAL("run.metrics_file: cannot write: %s", strerror(errno));
}

void write_metric_skipped(Trainer *t, int epoch) {
    if (!t->watch.metrics) return;
    cJSON *o = metric_step_line(t, epoch);
    json_add_int(o, "skipped_steps", t->seen.scaler.skipped_steps);
    json_add_int(o, "bad_in_a_row", t->seen.bad_run);
    write_metric_line(t, o);
}

static void tensorboard_epoch(Trainer *t, double test_acc);

void write_metric_epoch(Trainer *t, int epoch, double epoch_s, double test_acc) {
    tensorboard_epoch(t, test_acc);
    if (!t->watch.metrics) return;
    cJSON *o = json_object_new();
    json_add_int(o, "epoch_end", epoch + 1);
    json_add_int(o, "step", t->step);
    json_add_number(o, "epoch_s", epoch_s, 6);
    json_add_number(o, "test_acc", test_acc >= 0 ? test_acc : NAN, 6);
    write_metric_line(t, o);
}

/* ---- watching the run: profiler range, log points, progress line, Prometheus -- */

/* run.profile_steps = a:b: cudaProfilerStart before step a, Stop after step b. */
void profile_step_begin(Trainer *t) {
    long next = t->step + 1;
    if (!t->set.run.use_gpu || !t->set.run.profile_first || t->watch.profiling || t->watch.profiled ||
        next < t->set.run.profile_first)
        return;
    device_sync(t); /* the range holds this step's work only */
    gpu_profiler_start();
    t->watch.profiling = 1;
    log_info("run.profile_steps: cudaProfilerStart before step %ld", next);
}

void profile_finish(Trainer *t) {
    if (!t->watch.profiling) return;
    device_sync(t);
    gpu_profiler_stop();
    t->watch.profiling = 0;
    t->watch.profiled = 1;
    log_info("run.profile_steps: cudaProfilerStop after step %ld", t->step);
}

void profile_step_end(Trainer *t) {
    if (t->watch.profiling && t->step >= t->set.run.profile_last) profile_finish(t);
}

enum { G_SAMPLES, G_LOSS, G_SCALE, G_SKIPPED, G_WAIT, G_STEP, G_UTIL, G_MEM, G_TEMP, G_POWER, G_COUNT };
static const struct {
    const char *name, *help;
    PromType type;
} metrics[G_COUNT] = {
    {"trainc_samples_per_second", "Training samples per second over the last log interval.", PROM_GAUGE},
    {"trainc_loss", "Training loss as last read back from the device.", PROM_GAUGE},
    {"trainc_loss_scale", "Scale of the dynamic loss scaler (1 without AMP).", PROM_GAUGE},
    {"trainc_skipped_steps_total", "Steps skipped for a non-finite loss or gradient.", PROM_COUNTER},
    {"trainc_data_wait_fraction", "Share of the last log interval the training thread waited for the loader.",
     PROM_GAUGE},
    {"trainc_step", "Optimizer steps taken.", PROM_GAUGE},
    {"trainc_gpu_utilization_ratio", "NVML GPU utilisation, 0 to 1.", PROM_GAUGE},
    {"trainc_gpu_memory_used_bytes", "NVML device memory in use, bytes.", PROM_GAUGE},
    {"trainc_gpu_temperature_celsius", "NVML GPU temperature, degrees Celsius.", PROM_GAUGE},
    {"trainc_gpu_power_watts", "NVML board power draw, watts.", PROM_GAUGE},
};

static void set_metric(Trainer *t, int g, double v) { prom_set(t->watch.prom, metrics[g].name, v); }

/* A reading NVML did not give (< 0) leaves the metric as it was: absent until one does. */
static void set_reading(Trainer *t, int g, double v, double scale) {
    if (v >= 0) set_metric(t, g, v * scale);
}

/* monitor.prometheus_port: every metric is declared at the start and appears
 * in the exposition from its first value on. */
void prometheus_start(Trainer *t) {
    char err[512];
    if (!t->set.monitor.prometheus_port) return;
    t->watch.prom = prom_start(t->set.monitor.prometheus_port, err, sizeof err);
    if (!t->watch.prom) TC_FATAL("monitor.prometheus_port = %d: %s", t->set.monitor.prometheus_port, err);
    for (int g = 0; g < G_COUNT; g++) prom_declare(t->watch.prom, metrics[g].name, metrics[g].help, metrics[g].type);
    log_info("monitor.prometheus_port: serving http://127.0.0.1:%d/metrics", prom_port(t->watch.prom));
}

void prometheus_update(Trainer *t, double samples_per_s, double wait_frac, float loss) {
    if (!t->watch.prom) return;
    GpuSample g = gpu_monitor_latest(t->device.monitor);
    set_metric(t, G_SAMPLES, samples_per_s);
    set_metric(t, G_LOSS, loss);
    set_metric(t, G_SCALE, t->seen.scaler.scale);
    set_metric(t, G_SKIPPED, t->seen.scaler.skipped_steps);
    set_metric(t, G_WAIT, wait_frac);
    set_metric(t, G_STEP, (double)t->step);
    set_reading(t, G_UTIL, g.util_pct, 0.01);
    set_reading(t, G_MEM, g.mem_used_bytes, 1);
    set_reading(t, G_TEMP, g.temp_c, 1);
    set_reading(t, G_POWER, g.power_w, 1);
}

/* ---- TensorBoard (run.tensorboard_dir) -------------------------------------- */

/* Rank 0 alone writes (train_open.c starts it there): one file per run, with
 * no rank in its name; the loss and rate it logs are rank 0's, as the log's. */
void tensorboard_start(Trainer *t) {
    char err[4608];
    const char *dir = t->set.run.tensorboard_dir;
    if (!dir[0]) return;
    t->watch.tb = tb_open(dir, -1, err, sizeof err);
    if (!t->watch.tb) TC_USER_ERROR("run.tensorboard_dir = %s: %s", dir, err);
    log_info("run.tensorboard_dir: writing %s (tensorboard --logdir %s)", tb_path(t->watch.tb), dir);
}

void tensorboard_stop(Trainer *t) {
    if (t->watch.tb && tb_close(t->watch.tb) != 0)
        log_warn("run.tensorboard_dir: the last events may be lost: %s", strerror(errno));
    t->watch.tb = NULL;
}

static void tb_write(Trainer *t, const char *tag, double value) {
    if (tb_scalar(t->watch.tb, tag, t->step, (float)value) != 0)
        TC_USER_ERROR("run.tensorboard_dir: cannot write %s: %s", tb_path(t->watch.tb), strerror(errno));
}

static void tb_flush_or_fail(Trainer *t) {
    if (tb_flush(t->watch.tb) != 0)
        TC_USER_ERROR("run.tensorboard_dir: cannot write %s: %s", tb_path(t->watch.tb), strerror(errno));
}

/* The lr of the step just taken, from the schedule on the host (optim.lr is
 * kept divided by memory.accumulate, see settings_read). */
static double step_lr(const Trainer *t) {
    long step = t->step > 0 ? t->step - 1 : 0;
    return (double)lr_schedule_at(&t->optim.schedule, step) * t->set.memory.accumulate;
}

/* A log point's scalars; the GPU's only where NVML gave them. */
static void tensorboard_log_point(Trainer *t, float loss, double samples_per_s) {
    if (!t->watch.tb) return;
    tb_write(t, "train/loss", loss);
    tb_write(t, "train/lr", step_lr(t));
    tb_write(t, "train/samples_per_s", samples_per_s);
    tb_write(t, "train/loss_scale", t->seen.scaler.scale);
    GpuSample g = gpu_monitor_latest(t->device.monitor);
    if (g.util_pct >= 0) tb_write(t, "gpu/utilization_pct", g.util_pct);
    if (g.mem_used_bytes >= 0) tb_write(t, "gpu/memory_used_gib", g.mem_used_bytes / 1073741824.0);
    tb_flush_or_fail(t);
}

/* test_acc < 0: no evaluation this epoch. */
static void tensorboard_epoch(Trainer *t, double test_acc) {
    if (!t->watch.tb || test_acc < 0) return;
    tb_write(t, "eval/test_acc", test_acc);
    tb_flush_or_fail(t);
}

/* The log interval's figures as far as the last read-back: the mean loss of
 * its micro-batches and the training accuracy over their samples (rank 0's,
 * as the loss), from the device's sums; NaN over no step, or where the
 * counter may have wrapped. */
typedef struct {
    double loss, acc;
    long steps;               /* the optimizer steps they cover */
} IntervalMeans;

static IntervalMeans interval_means(const Trainer *t) {
    IntervalMeans m = {NAN, NAN, t->seen.sums_step - t->seen.sums_from};
    long micro = m.steps * t->set.memory.accumulate, samples = micro * t->set.train.batch;
    if (m.steps <= 0) m.steps = 0;
    if (m.steps <= 0 || samples > INT_MAX) return m;
    m.loss = t->seen.loss_sum / micro;
    m.acc = (double)t->seen.train_correct / samples;
    return m;
}

/* A log interval opens: its clock, and the device's sums zeroed (on the
 * compute stream between steps, never inside a CUDA graph). */
void log_window_open(Trainer *t, LogWindow *lw) {
    const OpContext *ctx = &t->model.ops;
    *lw = (LogWindow){now_seconds(), train_data_wait(t), t->step};
    op_fill(ctx, t->buf.loss_sum, 0, sizeof(float));
    op_fill(ctx, t->buf.train_correct, 0, sizeof(int));
    t->seen.loss_sum = 0;
    t->seen.train_correct = 0;
    t->seen.sums_from = t->seen.sums_step = t->step;
}

/* The seconds the run has left at steps_per_s (0 at no rate). */
static double run_left_s(const Trainer *t, double steps_per_s) {
    return steps_per_s > 0 ? (t->watch.total_steps - t->step) / steps_per_s : 0;
}

/* A logged step's metrics line: the log line's figures. */
static void write_metric_step(Trainer *t, int epoch, const IntervalMeans *m, double samples_per_s,
                              double steps_per_s) {
    if (!t->watch.metrics) return;
    cJSON *o = metric_step_line(t, epoch);
    json_add_number(o, "loss", m->loss, 6);
    json_add_int(o, "loss_steps", m->steps);
    json_add_number(o, "train_acc", m->acc, 6);
    json_add_number(o, "lr", step_lr(t), 6);
    json_add_number(o, "samples_per_s", samples_per_s, 6);
    json_add_int(o, "total_steps", t->watch.total_steps);
    json_add_number(o, "eta_s", run_left_s(t, steps_per_s), 3);
    /* before clipping, as clip_grad_norm_ returns it; null when not finite */
    if (t->buf.grad_norm) json_add_number(o, "grad_norm", t->seen.grad_norm, 6);
    write_metric_line(t, o);
}

/* h:mm:ss or m:ss. */
static void clock_text(double seconds, char *out, size_t n) {
    long left = seconds > 0 ? (long)(seconds + 0.5) : 0;
    if (left >= 3600) snprintf(out, n, "%ld:%02ld:%02ld", left / 3600, left / 60 % 60, left % 60);
    else snprintf(out, n, "%ld:%02ld", left / 60, left % 60);
}

/* Where the run stands at steps_per_s and a data wait of wait_frac: "epoch 1/3
 * images 12800/40000  2345 img/s  data wait 3%  lr 0.1  loss 2.1034 (mean of 100
 * steps)  train acc 41.2%  epoch left 0:12  run left 3:21" (images of every
 * rank; the loss and accuracy rank 0's over the log interval). */
static void standing_text(const Trainer *t, int epoch, double steps_per_s, double wait_frac, const IntervalMeans *m,
                          char *out, size_t n) {
    long step_images = (long)t->set.train.batch * t->set.memory.accumulate * t->ddp.dist->world;
    long epoch_steps = t->step - (long)epoch * t->steps_per_epoch;
    long epoch_left = t->steps_per_epoch - epoch_steps, run_left = t->watch.total_steps - t->step;
    if (epoch_left > run_left) epoch_left = run_left;
    char loss_text[64] = "-", acc_text[32] = "-", epoch_eta[32], run_eta[32];
    if (isfinite(m->loss))
        snprintf(loss_text, sizeof loss_text, "%.4f (mean of %ld step%s)", m->loss, m->steps, m->steps > 1 ? "s" : "");
    if (isfinite(m->acc)) snprintf(acc_text, sizeof acc_text, "%.1f%%", 100 * m->acc);
    clock_text(steps_per_s > 0 ? epoch_left / steps_per_s : 0, epoch_eta, sizeof epoch_eta);
    clock_text(run_left_s(t, steps_per_s), run_eta, sizeof run_eta);
    snprintf(out, n, "epoch %d/%g  images %ld/%ld  %.0f img/s  data wait %.0f%%  lr %.4g  loss %s  train acc %s  "
             "epoch left %s  run left %s", epoch + 1, t->set.run.epochs, epoch_steps * step_images,
             (long)t->steps_per_epoch * step_images, steps_per_s * step_images, 100 * wait_frac, step_lr(t), loss_text,
             acc_text, epoch_eta, run_eta);
}

/* Every run.log_every steps, just after a read-back (loss: the last batch's):
 * the log line (unless the progress line shows), the metrics line, the
 * Prometheus gauges, TensorBoard, and the phase sets done so far; then the
 * next interval opens. */
void log_point(Trainer *t, int epoch, float loss, LogWindow *lw) {
    double now = now_seconds(), wait = train_data_wait(t);
    double seconds = now - lw->start, wait_frac = seconds > 0 ? (wait - lw->wait_start) / seconds : 0;
    double steps_per_s = seconds > 0 ? (t->step - lw->start_step) / seconds : 0;
    double rate = steps_per_s * t->set.train.batch * t->set.memory.accumulate;
    IntervalMeans means = interval_means(t);
    if (!t->watch.progress) {
        char text[512], norm[64] = "";
        standing_text(t, epoch, steps_per_s, wait_frac, &means, text, sizeof text);
        if (t->buf.grad_norm) snprintf(norm, sizeof norm, "  grad norm %.4g", t->seen.grad_norm);
        log_info("step %ld/%ld  %s%s", t->step, t->watch.total_steps, text, norm);
    }
    write_metric_step(t, epoch, &means, rate, steps_per_s);
    tensorboard_log_point(t, means.loss, rate);
    prometheus_update(t, rate, wait_frac, loss);
    phases_collect(t, 0);
    log_window_open(t, lw);
}

/* On a terminal the same standing, redrawn at most 4 times a second (force: now). */
void progress_draw(Trainer *t, int epoch, int force) {
    double now = now_seconds(), dt = now - t->watch.progress_drawn, wait = train_data_wait(t);
    if (!force && dt < 0.25) return;
    if (t->step > t->watch.progress_step && dt > 0) {
        t->watch.progress_rate = (t->step - t->watch.progress_step) / dt;
        t->watch.progress_wait = (wait - t->watch.progress_wait_at) / dt;
    }
    t->watch.progress_drawn = now;
    t->watch.progress_step = t->step;
    t->watch.progress_wait_at = wait;
    if (t->watch.progress_rate <= 0) return;
    char text[512];
    IntervalMeans means = interval_means(t);
    standing_text(t, epoch, t->watch.progress_rate, t->watch.progress_wait, &means, text, sizeof text);
    log_progress("%s", text);
}
