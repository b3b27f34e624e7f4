/* The training run, top to bottom: open it (settings, data, model, optimizer,
 * dist, monitoring, resume), then for each epoch train and evaluate, then sum
 * it up and close it. A step: wait for a batch, copy it to the device,
 * forward, loss, backward, optimizer (train_step.c).
 *
 * The step itself never waits for the host unless a switch asks for it
 * (train.sync_after_step, train.read_loss_every, data.async_copy = off): those
 * are the lab's baseline habits, kept so that their cost can be measured. */
#include "tools/trainer/trainer.h"
#include <pthread.h>
#include <sys/resource.h>

#include "runtime/json_out.h"

/* ---- stopping: signals and bad steps --------------------------------------- */

static volatile sig_atomic_t stop_signal;

const volatile sig_atomic_t *train_stop_flag(void) { return &stop_signal; }

/* SIGINT, SIGTERM: the first asks the loop to stop after the current step (or
 * the data's decode), a second ends the process at once. */
static void on_stop_signal(int signo) {
    if (stop_signal) {
        static const char msg[] = "trainc: second signal: exiting now\n";
        ssize_t unused = write(2, msg, sizeof msg - 1);
        (void)unused;
        ckpt_remove_pending(); /* a checkpoint being written is left unfinished */
        _exit(128 + signo);
    }
    stop_signal = signo;
}

/* A signal on any rank stops every rank at the same step (a collective, so
 * every rank asks at the same points). */
static int stop_requested(Trainer *t) {
    int any = dist_any_host(t->ddp.dist, stop_signal != 0);
    if (any && !stop_signal) stop_signal = SIGTERM;
    return any;
}

static void install_stop_handlers(struct sigaction old[2]) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    stop_signal = 0;
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
}

static void restore_stop_handlers(const struct sigaction old[2]) {
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
}

/* After a read-back: the steps skipped since the last one (a non-finite loss or
 * gradient), logged; bad_run counts them in a row as far as the read-backs
 * tell (exactly with train.read_loss_every = 1). */
static void count_bad_steps(Trainer *t, int epoch) {
    long bad = t->seen.scaler.skipped_steps - (t->seen.bad_total), elapsed = t->step - t->seen.step;
    t->seen.bad_total = t->seen.scaler.skipped_steps;
    t->seen.step = t->step;
    if (bad <= 0) {
        t->seen.bad_run = 0;
        return;
    }
    if (!t->seen.scaler.found_inf) t->seen.bad_run = 0;  /* the last step was good */
    else if (bad == elapsed) t->seen.bad_run += bad;     /* every step since the last look was bad */
    else t->seen.bad_run = 1;                            /* at least the last one */
    log_warn("step %ld: %ld of the last %ld steps skipped for a non-finite loss or gradient (%d in all%s)", t->step,
             bad, elapsed, t->seen.scaler.skipped_steps,
             t->set.precision.amp != DTYPE_F32 ? ", loss scale backed off" : "");
    write_metric_skipped(t, epoch);
}

/* phase_ms of the summary: each phase's sum over the timed window per timed step. */
static void summarize_phases(Trainer *t, TrainSummary *out, double timed_wait_s) {
    phases_collect(t, 1);
    double n = (double)out->timed_steps, *ms = t->watch.phases.timed_ms;
    out->phase_data_wait_ms = out->phase_input_ms = out->phase_forward_ms = NAN;
    out->phase_backward_ms = out->phase_optimizer_ms = out->phase_graph_ms = NAN;
    if (n <= 0) return;
    out->phase_data_wait_ms = 1000 * timed_wait_s / n;
    out->phase_input_ms = ms[PH_INPUT] / n;
    if (t->set.perf.cuda_graph) {
        out->phase_graph_ms = ms[PH_GRAPH] / n;
    } else {
        out->phase_forward_ms = ms[PH_FORWARD] / n;
        out->phase_backward_ms = ms[PH_BACKWARD] / n;
        out->phase_optimizer_ms = ms[PH_OPTIMIZER] / n;
    }
}

static void log_phases(const Trainer *t, const TrainSummary *s) {
    const char *clock = t->set.run.use_gpu ? "device time between events on the compute stream" : "host time";
    if (t->set.perf.cuda_graph) {
        double sum = s->phase_data_wait_ms + s->phase_input_ms + s->phase_graph_ms;
        log_info("phases, ms per timed step: data wait %.3f (host time in loader_next), input %.3f (copy and "
                 "transform into the model's input), graph %.3f (forward, backward and optimizer replayed as one "
                 "CUDA graph: perf.cuda_graph = on times them only as a whole); sum %.3f of the %.3f ms step "
                 "(%.1f%%; %s)", s->phase_data_wait_ms, s->phase_input_ms, s->phase_graph_ms, sum, s->step_ms,
                 100 * sum / s->step_ms, clock);
        return;
    }
    double sum = s->phase_data_wait_ms + s->phase_input_ms + s->phase_forward_ms + s->phase_backward_ms +
                 s->phase_optimizer_ms;
    log_info("phases, ms per timed step: data wait %.3f (host time in loader_next), input %.3f (copy and "
             "transform into the model's input), forward %.3f (loss scaler reset, forward, loss), backward %.3f "
             "(zero gradients, backward), optimizer %.3f (gradient check, SGD, loss scaler update); sum %.3f of "
             "the %.3f ms step (%.1f%%; %s)", s->phase_data_wait_ms, s->phase_input_ms, s->phase_forward_ms,
             s->phase_backward_ms, s->phase_optimizer_ms, sum, s->step_ms, 100 * sum / s->step_ms, clock);
}

/* ---- a fatal error's last checkpoint ------------------------------------------ */

/* The last state a checkpoint may hold: the weights of t->step optimizer steps
 * and where the data order stands after them; none while an optimizer step
 * changes the weights. */
static struct {
    Trainer *t;
    pthread_t trainer_thread; /* an error on another (a decoder's) comes while the step runs on */
    int valid, epoch;
    long epoch_micro;
} last_safe;

static void mark_safe(int epoch, long epoch_micro) {
    last_safe.epoch = epoch, last_safe.epoch_micro = epoch_micro;
    last_safe.valid = 1;
}

/* A fatal error (a disk full under run.metrics_file, a data file that cannot
 * be read, the device out of memory) ends the process: the steps since the
 * last checkpoint are written first where the weights are whole. Rank 0 of a
 * run alone (the others would wait on it in a collective). */
static void save_on_fatal(void) {
    Trainer *t = last_safe.t;
    if (!t) return;
    last_safe.t = NULL;
    if (t->ddp.dist->world > 1 || !t->set.checkpoint.save_final || t->step == t->first_step) return;
    if (t->ckpt.step == t->step && t->ckpt.path[0]) {
        fprintf(stderr, "trainc: the last checkpoint, of step %ld, is %s\n", t->step, t->ckpt.path);
        return;
    }
    if (!pthread_equal(pthread_self(), last_safe.trainer_thread)) {
        fprintf(stderr, "trainc: no last checkpoint: the error came on a data thread while step %ld ran (the last "
                "written: %s)\n", t->step + 1, t->ckpt.path[0] ? t->ckpt.path : "none");
        return;
    }
    if (!last_safe.valid) {
        fprintf(stderr, "trainc: no last checkpoint: the error came inside step %ld's optimizer step (the last "
                "written: %s)\n", t->step + 1, t->ckpt.path[0] ? t->ckpt.path : "none");
        return;
    }
    if (save_checkpoint(t, last_safe.epoch, last_safe.epoch_micro) == 0)
        fprintf(stderr, "trainc: the run stopped on the error above; a last checkpoint of step %ld was written: %s\n",
                t->step, t->ckpt.path);
    else
        fprintf(stderr, "trainc: the run stopped on the error above; no last checkpoint could be written (the last "
                "written: %s)\n", t->ckpt.path[0] ? t->ckpt.path : "none");
}

/* t: the run a fatal error saves; NULL: none (warm-up runs, closing). */
static void watch_fatal(Trainer *t) {
    static int registered;
    if (!registered) tc_on_fatal(save_on_fatal);
    registered = 1;
    last_safe.t = t;
    last_safe.trainer_thread = pthread_self();
    last_safe.valid = 0;
}

/* ---- the run ------------------------------------------------------------------ */

typedef enum { RUN_ON, STOP_MAX_STEPS, STOP_SIGNAL, STOP_BAD_STEPS } StopReason;

/* What the run adds up for its summary. */
typedef struct {
    double timed_s, timed_wait_s, epoch_s_sum; /* the timed window; the epochs' training */
    double eval_s;            /* the last evaluation's wall time, from an idle device to its count read back */
    long timed_samples;
    float loss;               /* as last read back */
    StopReason why;
    int last_step_epoch;      /* the loop's epoch goes one past it when an epoch ends */
    long last_step_micro;     /* the micro-batches of that epoch taken by the last step */
} RunTally;

/* Where an epoch stands. */
typedef struct {
    double start, window_start, window_wait_start; /* window_start < 0: the timed window has not begun */
    LogWindow lw;
    int micro;                /* micro-batch within the optimizer step */
    long epoch_micro;         /* micro-batches taken this epoch */
} EpochClock;

/* The micro-batches epoch trains: all of its data, but for the last epoch of a
 * fractional run.epochs, which stops at the run's last optimizer step. */
static long epoch_micro_batches(const Trainer *t, int epoch) {
    long steps = epoch == t->run_epochs - 1 ? t->run_steps - (long)epoch * t->steps_per_epoch : t->steps_per_epoch;
    return steps * t->set.memory.accumulate;
}

/* 0 when the epoch ends before the next micro-batch: its data (or its share of
 * a fractional run) is done, or the run stops (r->why). */
static int may_take_batch(Trainer *t, RunTally *r, const EpochClock *c, int epoch) {
    if (c->micro == 0 && stop_requested(t)) { /* between optimizer steps */
        r->why = STOP_SIGNAL;
        return 0;
    }
    const TrainObserver *obs = t->observer;
    int observer_stops = c->micro == 0 && obs && obs->stop_after && obs->stop_after(obs->user, t->step);
    if ((t->set.run.max_steps && t->step >= t->set.run.max_steps) || observer_stops) {
        r->why = STOP_MAX_STEPS;
        return 0;
    }
    return c->epoch_micro < epoch_micro_batches(t, epoch);
}

/* Before an optimizer step's first micro-batch: the timed window opens after
 * run.warmup_steps, and the profiler range may start. */
static void begin_step(Trainer *t, EpochClock *c) {
    if (c->window_start < 0 && t->step >= t->set.run.warmup_steps) {
        device_sync(t);
        gpu_monitor_window_begin(t->device.monitor); /* queued: the monitor's thread reads NVML (milliseconds) */
        c->window_start = now_seconds();
        c->window_wait_start = train_data_wait(t);
    }
    profile_step_begin(t);
    if (t->observer && t->observer->step_begin) t->observer->step_begin(t->observer->user, t->step + 1);
}

/* After an optimizer step: the read-back, log point and checkpoint that fall
 * due. 0 when the run stops (run.max_bad_steps). */
static int end_step(Trainer *t, RunTally *r, EpochClock *c, int epoch) {
    const TrainSettings *s = &t->set;
    t->step++;
    r->last_step_epoch = epoch;
    r->last_step_micro = c->epoch_micro;
    mark_safe(epoch, c->epoch_micro);
    if (s->train.sync_after_step) device_sync(t);
    profile_step_end(t);
    if (t->observer && t->observer->step_end) t->observer->step_end(t->observer->user, t->step);
    if (c->window_start >= 0) r->timed_samples += (long)s->train.batch * s->memory.accumulate;
    int log_now = t->step % s->run.log_every == 0;
    if (log_now || (s->train.read_loss_every && t->step % s->train.read_loss_every == 0)) {
        r->loss = read_loss(t);
        count_bad_steps(t, epoch);
    }
    if (log_now) log_point(t, epoch, r->loss, &c->lw);
    if (t->watch.progress) progress_draw(t, epoch, 0);
    if (s->checkpoint.max_bad_steps && t->seen.bad_run >= s->checkpoint.max_bad_steps) {
        r->why = STOP_BAD_STEPS;
        return 0;
    }
    if (s->checkpoint.every && t->step % s->checkpoint.every == 0) save_checkpoint(t, epoch, c->epoch_micro);
    return 1;
}

static void train_steps(Trainer *t, RunTally *r, EpochClock *c, int epoch) {
    int accumulate = t->set.memory.accumulate;
    while (may_take_batch(t, r, c, epoch)) {
        if (c->micro == 0) begin_step(t, c);
        if (!take_batch(t, c->epoch_micro)) break;
        if (c->micro == accumulate - 1) last_safe.valid = 0; /* the optimizer step changes the weights */
        run_micro_batch(t, c->micro == 0, c->micro == accumulate - 1);
        phase_close(t, c->window_start >= 0);
        c->epoch_micro++;
        if (++c->micro < accumulate) continue;
        c->micro = 0;
        if (!end_step(t, r, c, epoch)) break;
    }
}

/* One epoch's training (a resumed one skips the micro-batches its checkpoint
 * had taken); returns its wall time. A stop writes the checkpoint of where
 * the data order stands. */
static double train_epoch(Trainer *t, RunTally *r, int epoch, long resume_micro) {
    EpochClock c = {.start = now_seconds(), .window_start = -1};
    log_window_open(t, &c.lw);
    t->watch.progress_drawn = c.lw.start; /* the rate leaves out the evaluation */
    t->watch.progress_step = t->step;
    t->watch.progress_wait_at = train_data_wait(t);
    c.epoch_micro = start_train_epoch(t, epoch, resume_micro);
    mark_safe(epoch, c.epoch_micro);
    train_steps(t, r, &c, epoch);
    if (r->why == RUN_ON) plan_next_epoch(t, epoch + 1);
    if (t->set.run.use_gpu) release_held(t, t->data.train_loader);
    device_sync(t);
    double end = now_seconds();
    if (c.window_start >= 0) {
        r->timed_s += end - c.window_start;
        r->timed_wait_s += train_data_wait(t) - c.window_wait_start;
        gpu_monitor_window_end(t->device.monitor);
    }
    if (t->watch.progress) progress_draw(t, epoch, 1);
    /* The state after the last finished step, where the data order stands. */
    if (r->why == STOP_SIGNAL || r->why == STOP_BAD_STEPS) save_checkpoint(t, epoch, c.epoch_micro);
    return end - c.start;
}

static void end_epoch(Trainer *t, RunTally *r, TrainSummary *out, int epoch, double epoch_s) {
    r->epoch_s_sum += epoch_s;
    /* A fractional run's last epoch ends it: the summary says run.epochs (9.9). */
    int ran_all = epoch == t->run_epochs - 1 && t->step == t->run_steps;
    out->epochs = ran_all ? t->set.run.epochs : epoch + 1;
    if (t->set.run.eval) {
        double eval_start = now_seconds(); /* train_epoch left the device idle */
        out->test_acc = evaluate(t, epoch);
        r->eval_s = now_seconds() - eval_start;
        log_info("epoch %d: %.3f s, test accuracy %.2f%% (evaluated in %.3f s)", epoch + 1, epoch_s,
                 100 * out->test_acc, r->eval_s);
    }
    write_metric_epoch(t, epoch, epoch_s, out->test_acc);
}

/* ---- the summary ---------------------------------------------------------------- */

/* run.repeats: one line per run on standard output (rank 0). */
static void report_repeat(const Trainer *t, int run, double acc, double train_s, double eval_s) {
    if (t->set.run.repeats == 1 || t->ddp.dist->rank != 0) return;
    log_progress_end();
    printf("run %d: acc=%.4f train_s=%.3f eval_s=%.3f\n", run, acc, train_s, eval_s);
    fflush(stdout);
}

/* The mean, sample standard deviation and minimum of n values (n >= 1). */
static void mean_std_min(const double *v, int n, double *mean, double *std, double *min) {
    double sum = 0, squares = 0;
    *min = v[0];
    for (int i = 0; i < n; i++) {
        sum += v[i];
        if (v[i] < *min) *min = v[i];
    }
    *mean = sum / n;
    for (int i = 0; i < n; i++) squares += (v[i] - *mean) * (v[i] - *mean);
    *std = n > 1 ? sqrt(squares / (n - 1)) : 0;
}

/* Over the runs finished; a run stopped by a signal counts for nothing. */
static void summarize_repeats(TrainSummary *out, const double *accs, const double *train_s, const double *eval_s) {
    double acc_mean, eval_std, eval_min;
    out->test_acc_std = out->test_acc_min = out->train_s = out->train_s_std = out->train_s_min = out->eval_s = NAN;
    if (out->runs == 0) return;
    mean_std_min(train_s, out->runs, &out->train_s, &out->train_s_std, &out->train_s_min);
    mean_std_min(eval_s, out->runs, &out->eval_s, &eval_std, &eval_min);
    mean_std_min(accs, out->runs, &acc_mean, &out->test_acc_std, &out->test_acc_min);
    if (!isnan(acc_mean)) out->test_acc = acc_mean;
}

/* The last read-back, and why the run stopped early. */
static void finish_run(Trainer *t, RunTally *r, TrainSummary *out) {
    log_progress_end();
    profile_finish(t);
    if (r->why == RUN_ON && stop_signal) {
        /* The signal came after the last step (during the last evaluation). */
        r->why = STOP_SIGNAL;
        save_checkpoint(t, t->run_epochs - 1, epoch_micro_batches(t, t->run_epochs - 1));
    } else if ((r->why == RUN_ON || r->why == STOP_MAX_STEPS) && t->set.checkpoint.save_final) {
        /* The run's model: the steps since the last run.checkpoint_every are kept too. */
        if (save_checkpoint(t, r->last_step_epoch, r->last_step_micro) == 0 && t->ckpt.step == t->step)
            log_info("the run's final checkpoint (run.save_final): %s", t->ckpt.path);
    }
    if (t->step > t->first_step) {
        r->loss = read_loss(t);
        if (r->why != STOP_BAD_STEPS) count_bad_steps(t, r->last_step_epoch);
    }
    if (r->why == STOP_SIGNAL) {
        out->stopped = 1;
        out->exit_status = 128 + stop_signal;
        snprintf(out->stop_signal, sizeof out->stop_signal, "%s", stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
    } else if (r->why == STOP_BAD_STEPS) {
        out->stopped = 1;
        out->exit_status = 1;
        fflush(stdout);
        fprintf(stderr, "trainc: error: run.max_bad_steps = %d: %ld steps in a row had a non-finite loss or "
                "gradient and were skipped; stopped at step %ld with the parameters of step %ld%s%s\n",
                t->set.checkpoint.max_bad_steps, t->seen.bad_run, t->step, t->step - t->seen.bad_run,
                t->ckpt.step == t->step ? ", saved in " : " (no checkpoint written)",
                t->ckpt.step == t->step ? t->ckpt.path : "");
    }
    if (t->ckpt.failed) {
        if (!out->exit_status) out->exit_status = 1;
        fflush(stdout);
        fprintf(stderr, "trainc: error: %ld checkpoint%s asked for %s not written (see the warnings above); the "
                "last one written: %s\n", t->ckpt.failed, t->ckpt.failed > 1 ? "s" : "",
                t->ckpt.failed > 1 ? "were" : "was", t->ckpt.path[0] ? t->ckpt.path : "none");
    }
    out->checkpoints_failed = t->ckpt.failed;
    _Static_assert(sizeof out->checkpoint == sizeof t->ckpt.path, "checkpoint path sizes");
    memcpy(out->checkpoint, t->ckpt.path, sizeof out->checkpoint);
}

static void summarize_timing(Trainer *t, const RunTally *r, TrainSummary *out) {
    long step_samples = (long)t->set.train.batch * t->set.memory.accumulate;
    out->steps = t->step;
    out->timed_steps = r->timed_samples / step_samples;
    out->samples_per_s = r->timed_s > 0 ? r->timed_samples / r->timed_s : 0;
    dist_allreduce_sum_host_double(t->ddp.dist, &out->samples_per_s, 1); /* every rank's, together */
    out->step_ms = out->timed_steps ? 1000 * r->timed_s / out->timed_steps : 0;
    out->epoch_s = out->epochs ? r->epoch_s_sum / out->epochs : 0;
    out->data_wait_frac = r->timed_s > 0 ? r->timed_wait_s / r->timed_s : 0;
    summarize_phases(t, out, r->timed_wait_s);
    out->final_loss = r->loss;
}

/* The loss scaler, memory and GPU use; the closing log lines and gauges. */
static void summarize_device(Trainer *t, const RunTally *r, TrainSummary *out) {
    LossScalerState s;
    int amp = t->set.precision.amp != DTYPE_F32;
    op_copy_to_host(&t->model.ops, &s, t->buf.scaler, sizeof s);
    op_sync(&t->model.ops);
    out->loss_scale = amp ? s.scale : NAN;
    out->skipped_steps = s.skipped_steps;
    if (s.skipped_steps && amp)
        log_info("%d steps skipped for an inf/NaN loss or gradients, loss scale now %g", s.skipped_steps, s.scale);
    else if (s.skipped_steps)
        log_info("%d steps skipped for an inf/NaN loss or gradients", s.skipped_steps);
    out->peak_mem_bytes = t->model.arena.peak + t->buf.arena.peak;
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) == 0) out->host_peak_rss_bytes = (size_t)usage.ru_maxrss * 1024;
    LoaderStages stages;
    loader_stages(t->data.train_loader, &stages);
    out->skipped_files = stages.skipped;
    double steps = t->step > t->first_step ? (double)(t->step - t->first_step) : NAN;
    out->data_read_ms = 1e3 * stages.read_s / steps;
    out->data_decode_ms = 1e3 * stages.decode_s / steps;
    out->data_augment_ms = 1e3 * stages.augment_s / steps;
    out->data_gpu_decode_ms = NAN;
    if (t->data.train_decoder) {
        GpuDecodeStages gpu;
        gpu_decoder_stages(t->data.train_decoder, &gpu);
        out->data_gpu_decode_ms = gpu.batches ? 1e3 * gpu.decode_s / gpu.batches : NAN;
    }
    if (stages.skipped) log_warn("data.skip_bad: %ld training files were passed over (named above)", stages.skipped);
    snprintf(out->data_decode, sizeof out->data_decode, "%s", t->data.train_decoder            ? "gpu"
                                                              : t->data.train.kind == SOURCE_DECODED ? "decoded"
                                                                                                   : "cpu");
    if (t->set.run.use_gpu) {
        size_t free_b, total_b;
        gpu_memory_info(&free_b, &total_b);
        out->driver_mem_bytes = total_b - free_b;
        out->gpu_util = gpu_monitor_window_util(t->device.monitor);
        GpuWindowPower power = gpu_monitor_window_power(t->device.monitor);
        out->power_w = power.mean_w, out->power_capped = power.capped_frac, out->power_limit_w = power.limit_w;
        if (power.mean_w >= 0 && power.capped_frac >= 0 && power.limit_w > 0)
            log_info("GPU power over the timed steps: mean %.0f W (limit %.0f W); the power limit held the clocks "
                     "down %.1f%% of the time", power.mean_w, power.limit_w, 100 * power.capped_frac);
    }
    if (r->timed_samples == 0)
        log_warn("no step fell inside the timed window (run.warmup_steps = %d, %ld steps taken): "
                 "samples_per_s is 0", t->set.run.warmup_steps, t->step);
    else
        log_phases(t, out);
    if (t->step > t->first_step) prometheus_update(t, out->samples_per_s, out->data_wait_frac, r->loss);
}

/* params_crc, and the parameters themselves when asked for. */
static void summarize_params(Trainer *t, TrainSummary *out, float **params_out) {
    float *params = malloc(t->model.n_params * sizeof(float));
    if (!params) TC_FATAL("out of host memory copying %zu parameters", t->model.n_params);
    sync_sharded_state(t);
    model_get_params(&t->model, params);
    out->params_crc = ckpt_crc32(0, params, t->model.n_params * sizeof(float));
    if (params_out) *params_out = params;
    else free(params);
}

/* run.warmup_runs: the run untimed, as airbench's warm-up run, so the first
 * counted run finds every CUDA graph captured and every kernel loaded; no
 * evaluation and no checkpoint, then trainer_restart to run.seed's start,
 * which the first counted run then takes as it would without them. */
static void warmup_runs(Trainer *t) {
    watch_fatal(NULL); /* an untimed run's weights are not the run's */
    for (int w = 0; w < t->set.run.warmup_runs; w++) {
        RunTally r = {.loss = NAN, .why = RUN_ON};
        double start = now_seconds();
        for (int epoch = 0; epoch < t->run_epochs && r.why == RUN_ON; epoch++) train_epoch(t, &r, epoch, 0);
        trainer_restart(t, t->set.run.seed);
        log_info("warm-up run %d of %d: %.3f s, untimed", w + 1, t->set.run.warmup_runs, now_seconds() - start);
    }
    watch_fatal(t);
}

/* run.repeats runs (one unless set), each its epochs from start (a resumed
 * run's position) and their evaluations; the last run's tally. */
static RunTally train_runs(Trainer *t, TrainSummary *out, CkptPosition start) {
    const RunTally fresh = {.loss = NAN, .why = RUN_ON, .last_step_epoch = (int)start.epoch};
    RunTally r = fresh;
    int repeats = t->set.run.repeats;
    double *accs = calloc(3 * (size_t)repeats, sizeof *accs), *train_s = accs + repeats, *eval_s = train_s + repeats;
    if (!accs) TC_FATAL("out of host memory: run.repeats");
    warmup_runs(t);
    for (out->runs = 0; out->runs < repeats; out->runs++) {
        if (out->runs > 0) trainer_restart(t, t->set.run.seed + (uint64_t)out->runs);
        device_sync(t); /* the training time starts on an idle device */
        r = fresh;
        for (int epoch = (int)start.epoch; epoch < t->run_epochs && r.why == RUN_ON; epoch++) {
            double epoch_s = train_epoch(t, &r, epoch, epoch == start.epoch ? (long)start.epoch_micro : 0);
            if (r.why == STOP_SIGNAL || r.why == STOP_BAD_STEPS) break;
            end_epoch(t, &r, out, epoch, epoch_s);
        }
        if (r.why == STOP_SIGNAL || r.why == STOP_BAD_STEPS) break;
        accs[out->runs] = t->set.run.eval ? out->test_acc : NAN;
        train_s[out->runs] = r.epoch_s_sum; /* each epoch from an idle device to its last step's end */
        eval_s[out->runs] = t->set.run.eval ? r.eval_s : NAN;
        report_repeat(t, out->runs, accs[out->runs], train_s[out->runs], eval_s[out->runs]);
    }
    summarize_repeats(out, accs, train_s, eval_s);
    free(accs);
    return r;
}

void train_run(const Config *cfg, TrainSummary *out) { train_run_keep_params(cfg, out, NULL); }

void train_run_keep_params(const Config *cfg, TrainSummary *out, float **params_out) {
    Dist solo;
    dist_init_solo(&solo);
    train_run_dist(cfg, out, params_out, &solo);
}

static void run_observed(const Config *cfg, TrainSummary *out, float **params_out, Dist *dist,
                         const TrainObserver *obs) {
    Trainer trainer = {.observer = obs}, *t = &trainer;
    double run_start = now_seconds();
    struct sigaction old_handlers[2];
    install_stop_handlers(old_handlers);
    CkptPosition start = trainer_open(t, cfg, dist, out, run_start);
    if (obs && obs->opened) obs->opened(obs->user, &t->model);
    watch_fatal(t);
    RunTally r = train_runs(t, out, start);
    finish_run(t, &r, out);
    summarize_timing(t, &r, out);
    summarize_device(t, &r, out);
    summarize_params(t, out, params_out);
    if (obs && obs->closing) obs->closing(obs->user, &t->model);
    watch_fatal(NULL);
    trainer_close(t);
    restore_stop_handlers(old_handlers);
}

void train_run_dist(const Config *cfg, TrainSummary *out, float **params_out, Dist *dist) {
    run_observed(cfg, out, params_out, dist, NULL);
}

void train_run_observed(const Config *cfg, TrainSummary *out, const TrainObserver *obs) {
    Dist solo;
    dist_init_solo(&solo);
    run_observed(cfg, out, NULL, &solo, obs);
}

void train_run_dist_observed(const Config *cfg, TrainSummary *out, Dist *dist, const TrainObserver *obs) {
    run_observed(cfg, out, NULL, dist, obs);
}

/* Measured values keep 6 significant digits. */
static void json_measure(cJSON *obj, const char *key, double v) { json_add_number(obj, key, v, 6); }

void train_summary_print_json(const TrainSummary *s, FILE *f) {
    cJSON *o = json_object_new();
    json_add_string(o, "name", s->name);
    json_add_string(o, "device", s->device);
    json_add_string(o, "gpu", s->gpu_name);
    json_add_int(o, "world", s->world);
    json_add_int(o, "steps", s->steps);
    json_add_int(o, "timed_steps", s->timed_steps);
    if (s->epochs == floor(s->epochs)) json_add_int(o, "epochs", (long long)s->epochs); /* as before */
    else json_add_number(o, "epochs", s->epochs, 9);
    json_measure(o, "samples_per_s", s->samples_per_s);
    json_measure(o, "step_ms", s->step_ms);
    json_measure(o, "epoch_s", s->epoch_s);
    json_measure(o, "data_wait_frac", s->data_wait_frac);
    json_measure(o, "gpu_util", s->gpu_util >= 0 ? s->gpu_util / 100.0 : NAN);
    json_measure(o, "power_w", s->power_w >= 0 ? s->power_w : NAN);
    json_measure(o, "power_capped", s->power_capped >= 0 ? s->power_capped : NAN);
    json_measure(o, "power_limit_w", s->power_limit_w >= 0 ? s->power_limit_w : NAN);
    json_measure(o, "final_loss", s->final_loss);
    json_measure(o, "test_acc", s->test_acc >= 0 ? s->test_acc : NAN);
    json_add_int(o, "runs", s->runs);
    json_measure(o, "test_acc_std", s->test_acc_std);
    json_measure(o, "test_acc_min", s->test_acc_min);
    json_measure(o, "train_s", s->train_s);
    json_measure(o, "train_s_std", s->train_s_std);
    json_measure(o, "train_s_min", s->train_s_min);
    json_measure(o, "eval_s", s->eval_s);
    json_measure(o, "loss_scale", s->loss_scale);
    json_add_int(o, "skipped_steps", s->skipped_steps);
    json_add_bool(o, "stopped", s->stopped);
    json_add_int(o, "params_crc", s->params_crc);
    json_add_string(o, "checkpoint", s->checkpoint);
    json_add_int(o, "checkpoints_failed", s->checkpoints_failed);
    json_add_int(o, "peak_mem_bytes", (long long)s->peak_mem_bytes);
    json_add_int(o, "host_peak_rss_bytes", (long long)s->host_peak_rss_bytes);
    json_add_int(o, "skipped_files", s->skipped_files);
    json_add_string(o, "data_decode", s->data_decode);
    json_add_int(o, "driver_mem_bytes", (long long)s->driver_mem_bytes);
    cJSON *phases = json_add_object(o, "phase_ms");
    json_measure(phases, "data_wait", s->phase_data_wait_ms);
    json_measure(phases, "input", s->phase_input_ms);
    json_measure(phases, "forward", s->phase_forward_ms);
    json_measure(phases, "backward", s->phase_backward_ms);
    json_measure(phases, "optimizer", s->phase_optimizer_ms);
    json_measure(phases, "graph", s->phase_graph_ms);
    json_measure(phases, "step", s->timed_steps ? s->step_ms : NAN);
    cJSON *data = json_add_object(o, "data_ms");
    json_measure(data, "read", s->data_read_ms);
    json_measure(data, "decode", s->data_decode_ms);
    json_measure(data, "augment", s->data_augment_ms);
    json_measure(data, "gpu_decode", s->data_gpu_decode_ms);
    if (json_write_line(f, o) != 0) TC_USER_ERROR("writing the run's summary: %s", strerror(errno));
}

