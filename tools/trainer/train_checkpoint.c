/* Checkpoints of a training run: writing them (run.checkpoint_every, on a stop
 * signal), keeping the last run.keep_checkpoints, and resuming (run.resume). */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>

#include "runtime/files.h"
#include "runtime/json_out.h"
#include "tools/trainer/export.h"
#include "tools/trainer/trainer.h"

/* A checkpoint (runtime/checkpoint.h) holds these sections:
 *   model        CkptModel: which net, so another one is refused
 *   position     CkptPosition: where in the data order the next step starts
 *   data         CkptData: what the data order was made from (a change only warns)
 *   params       n_params fp32 master weights
 *   momentum     n_params fp32 (Adam's first moment under optim.name = adamw or adam)
 *   second_moment n_params fp32: Adam's (optim.name = adamw or adam only)
 *   optimizer    CkptOptim: optim.name and Adam's step count; checkpoints written
 *                before it was recorded are of SGD or Muon
 *   loss_scaler  LossScalerState
 *   bn_stats     n_bn_stats fp32: batch norms' running statistics (nets that have them)
 *   meta         JSON: the model, its input preparation and class names (export.h)
 *   tensors      JSON: each tensor's PyTorch name, shape and offset (export.h)
 *   net          the net file's text (models/netfile.h), from which export, predict and eval rebuild the net
 * Resume reads neither meta nor tensors: older checkpoints without them resume.
 * The loader draws every order and augmentation from run.seed, the epoch and
 * the sample's index, so the position is all of the RNG state there is. */
typedef struct {
    char name[16];      /* optim.name */
    int64_t adam_steps; /* Adam's step count: the steps the loss scaler did not skip (0 for SGD) */
} CkptOptim;

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Every layer's kind, parameter counts and the per-sample shapes it maps. */
static uint64_t shape_fingerprint(const Model *m) {
    uint64_t h = 14695981039346656037ull;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const Activation *in = &m->acts[l->in], *out = &m->acts[l->out];
        int64_t v[] = {l->kind, (int64_t)l->w_count, (int64_t)l->b_count, in->c, in->h, in->w, out->c, out->h, out->w};
        h = fnv1a(h, v, sizeof v);
    }
    return h;
}

static CkptModel ckpt_model_of(const Trainer *t) {
    CkptModel cm;
    memset(&cm, 0, sizeof cm);
    snprintf(cm.name, sizeof cm.name, "%s", t->set.model.name);
    cm.n_params = (int64_t)t->model.n_params;
    cm.shape_fingerprint = shape_fingerprint(&t->model);
    cm.act_dtype = t->set.precision.amp;
    cm.nhwc = t->model.nhwc;
    cm.num_classes = t->model.num_classes;
    cm.accumulate = t->set.memory.accumulate;
    return cm;
}

/* Steps of the checkpoints (ckpt-<step>.trc) in dir, newest first; -1 when the
 * directory cannot be read. *steps is malloc'ed. */
static int list_checkpoints(const char *dir, long **steps) {
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        /* "ckpt-" at least 8 digits ".trc", as checkpoint_path writes them */
        const char *digits = e->d_name + 5, *end = digits;
        while (*end >= '0' && *end <= '9') end++;
        if (strncmp(e->d_name, "ckpt-", 5) != 0 || end - digits < 8 || end - digits > 18 || strcmp(end, ".trc") != 0)
            continue;
        long step = strtol(digits, NULL, 10);
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long *grown = realloc(*steps, cap * sizeof(long));
            if (!grown) TC_FATAL("out of host memory listing %s", dir);
            *steps = grown;
        }
        (*steps)[n++] = step;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* newest first */
        for (int j = i; j > 0 && (*steps)[j] > (*steps)[j - 1]; j--) {
            long tmp = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = tmp;
        }
    return n;
}

static void checkpoint_path(char *out, size_t n, const char *dir, long step) {
    snprintf(out, n, "%s/ckpt-%08ld.trc", dir, step);
}

/* The temporary files of checkpoint writes that never finished (a process
 * killed mid-write); rank 0 alone writes, and removes them while it holds the
 * folder's lock. */
static void remove_stale_temporaries(const Trainer *t) {
    if (t->ddp.dist->rank == 0) ckpt_remove_stale_temporaries(t->set.checkpoint.dir, "ckpt-", ".trc");
}

/* The checkpoint folder this run made at its start, until a checkpoint is
 * written in it: a run that ends before (refused, stopped, failed) removes it
 * and its lock file as it leaves, rather than leave an empty folder behind. */
static char unused_dir[4200];

static void remove_unused_dir(void) {
    char lock[4300];
    if (!unused_dir[0]) return;
    snprintf(lock, sizeof lock, "%s/%s", unused_dir, CKPT_LOCK_FILE);
    unlink(lock);
    rmdir(unused_dir); /* fails, leaving it, where anything else is in it */
    unused_dir[0] = 0;
}

static void remove_at_exit_if_unused(const char *dir) {
    static int registered;
    if (!registered) atexit(remove_unused_dir);
    registered = 1;
    snprintf(unused_dir, sizeof unused_dir, "%s", dir);
}

/* A file made and removed at the start: a folder made read-only after its
 * lock file was written takes the lock but no checkpoint. */
static void check_dir_writable(const char *dir) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.trainc.probe-%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        TC_USER_ERROR("run.checkpoint_dir = %s: cannot create a file in it (%s): no checkpoint could be written "
                      "there; set another run.checkpoint_dir (or run.save_final = off and run.checkpoint_every = 0 "
                      "for a run that writes none)", dir, strerror(errno));
    close(fd);
    unlink(probe);
}

/* run.checkpoint_dir is this run's while it runs (rank 0 holds its lock):
 * taken at the start when the run writes checkpoints or resumes the folder's
 * latest, ending the process when it cannot be (another run holds it, it cannot
 * be written); else at the first checkpoint, which is not written then. */
int lock_checkpoint_dir(const Trainer *t, int at_start) {
    char err[4400];
    if (t->ddp.dist->rank != 0) return 0;
    struct stat st;
    int existed = stat(t->set.checkpoint.dir, &st) == 0;
    if (ckpt_lock_dir(t->set.checkpoint.dir, err, sizeof err) == 0) {
        if (at_start) check_dir_writable(t->set.checkpoint.dir);
        if (at_start && !existed) remove_at_exit_if_unused(t->set.checkpoint.dir);
        return 0;
    }
    if (at_start) TC_USER_ERROR("run.checkpoint_dir: %s", err);
    log_warn("run.checkpoint_dir: %s; no checkpoint at step %ld", err, t->step);
    return -1;
}

/* run.save_final alone (no run.checkpoint_every, no run.resume) where
 * run.checkpoint_dir holds another run's checkpoints: this run's goes into
 * the first free run.checkpoint_dir/run-<N>, so that the same command run
 * again leaves its model beside the last one's rather than being refused. */
void choose_final_dir(Trainer *t) {
    const TrainSettings *s = &t->set;
    long *steps;
    if (t->ddp.dist->rank != 0 || !s->checkpoint.save_final || s->checkpoint.every || s->run.resume[0]) return;
    int n = list_checkpoints(s->checkpoint.dir, &steps);
    long newest = n > 0 ? steps[0] : -1;
    free(steps);
    if (n <= 0) return;
    for (int k = 2; k < 1000000; k++) {
        snprintf(t->ckpt.dir, sizeof t->ckpt.dir, "%s/run-%d", s->checkpoint.dir, k);
        if (mkdir(t->ckpt.dir, 0777) == 0) {
            remove_at_exit_if_unused(t->ckpt.dir);
            log_info("run.checkpoint_dir = %s holds another run's checkpoints (newest ckpt-%08ld.trc): this run's "
                     "final checkpoint goes into %s", s->checkpoint.dir, newest, t->ckpt.dir);
            t->set.checkpoint.dir = t->ckpt.dir;
            return;
        }
        if (errno != EEXIST)
            TC_USER_ERROR("run.checkpoint_dir = %s holds another run's checkpoints, and %s cannot be made for this "
                          "run's final checkpoint: %s", s->checkpoint.dir, t->ckpt.dir, strerror(errno));
    }
    TC_USER_ERROR("run.checkpoint_dir = %s: run-2 to run-999999 are taken: set another", s->checkpoint.dir);
}

/* run.keep_checkpoints: delete all but the newest K, never the one just written. */
static void rotate_checkpoints(Trainer *t) {
    long *steps;
    int n = list_checkpoints(t->set.checkpoint.dir, &steps);
    for (int i = t->set.checkpoint.keep; t->set.checkpoint.keep > 0 && i < n; i++) {
        char path[4200];
        if (steps[i] == t->ckpt.step) continue;
        checkpoint_path(path, sizeof path, t->set.checkpoint.dir, steps[i]);
        if (ckpt_remove_own(path) != 0 && errno != EPERM) /* EPERM: not this run's, left */
            log_warn("run.keep_checkpoints: cannot delete %s: %s", path, strerror(errno));
    }
    free(steps);
}

/* The sections, written to a temporary file and renamed into place at the
 * commit; 0, or -1 with the reason in err. */
static int write_checkpoint(Trainer *t, const char *path, int epoch, long epoch_micro, char *err, size_t n) {
    int rc = -1;
    Model *m = &t->model;
    CkptModel cm = ckpt_model_of(t);
    CkptPosition pos = {t->step, epoch, epoch_micro};
    CkptData data = {(int64_t)t->set.run.seed, t->set.train.batch, t->data.train.n, t->set.data.shuffle};
    LossScalerState scaler;
    float *host = malloc(m->n_params * sizeof(float));
    if (!host) TC_FATAL("out of host memory: %zu parameters for the checkpoint", m->n_params);
    op_copy_to_host(&m->ops, &scaler, t->buf.scaler, sizeof scaler);
    op_sync(&m->ops);
    size_t stat_bytes = m->n_bn_stats * sizeof(float);
    float *stats = stat_bytes ? malloc(stat_bytes) : NULL;
    if (stat_bytes && !stats) TC_FATAL("out of host memory: batch-norm statistics for the checkpoint");
    model_get_bn_stats(m, stats);
    InputPreparation prep = {t->set.data.image_size, t->set.data.resized_crop ? t->set.data.eval_resize : 0, {0}, {0},
                             t->set.data.source};
    memcpy(prep.mean, t->set.data.mean, sizeof prep.mean);
    memcpy(prep.std, t->set.data.std, sizeof prep.std);
    char *meta = export_meta_json(m, t->set.model.name, &prep, t->data.train.class_names, t->data.train.num_classes);
    char *tensors = export_tensors_json(m);
    CkptOptim optim;
    memset(&optim, 0, sizeof optim);
    snprintf(optim.name, sizeof optim.name, "%s", settings_optim_name(t->set.optim.name));
    if (m->adam) optim.adam_steps = model_get_adam_steps(m);
    CkptWriter *w = ckpt_write_begin(path, 9 + (stat_bytes > 0) + m->adam + (t->net_text != NULL), err, n);
    if (w && ckpt_write_section(w, "model", &cm, sizeof cm, err, n) == 0 &&
        (!t->net_text || ckpt_write_section(w, "net", t->net_text, strlen(t->net_text), err, n) == 0) &&
        ckpt_write_section(w, "optimizer", &optim, sizeof optim, err, n) == 0 &&
        ckpt_write_section(w, "meta", meta, strlen(meta), err, n) == 0 &&
        ckpt_write_section(w, "tensors", tensors, strlen(tensors), err, n) == 0 &&
        ckpt_write_section(w, "position", &pos, sizeof pos, err, n) == 0 &&
        ckpt_write_section(w, "data", &data, sizeof data, err, n) == 0 &&
        ckpt_write_section(w, "loss_scaler", &scaler, sizeof scaler, err, n) == 0 &&
        (!stat_bytes || ckpt_write_section(w, "bn_stats", stats, stat_bytes, err, n) == 0)) {
        model_get_params(m, host);
        if (ckpt_write_section(w, "params", host, m->n_params * sizeof(float), err, n) == 0) {
            model_get_momentum(m, host);
            int written = ckpt_write_section(w, "momentum", host, m->n_params * sizeof(float), err, n) == 0;
            if (written && m->adam) {
                model_get_second_moment(m, host);
                written = ckpt_write_section(w, "second_moment", host, m->n_params * sizeof(float), err, n) == 0;
            }
            if (written) {
                rc = ckpt_write_commit(w, err, n);
                w = NULL;
            }
        }
    }
    if (w) ckpt_write_abort(w);
    free(host);
    free(stats);
    cJSON_free(meta);
    cJSON_free(tensors);
    return rc;
}

/* A checkpoint not written: training goes on, and the run ends with exit status 1. */
static int checkpoint_failed(Trainer *t) {
    t->ckpt.failed++;
    return -1;
}

/* Writes the state after t->step optimizer steps into run.checkpoint_dir;
 * returns 0, or -1 with a warning (training goes on; the run ends with exit
 * status 1). Never overwrites a file. */
int save_checkpoint(Trainer *t, int epoch, long epoch_micro) {
    char path[4200], err[4400];
    if (t->ckpt.step == t->step && t->ckpt.path[0]) return 0; /* this state is saved */
    if (t->step == t->first_step) return 0;                    /* nothing trained yet: nothing to save */
    sync_sharded_state(t);
    if (t->ddp.dist->rank != 0) {
        /* Rank 0 writes; every rank holds the same weights. */
        checkpoint_path(t->ckpt.path, sizeof t->ckpt.path, t->set.checkpoint.dir, t->step);
        t->ckpt.step = t->step;
        return 0;
    }
    if (lock_checkpoint_dir(t, 0) != 0) return checkpoint_failed(t);
    remove_stale_temporaries(t);
    checkpoint_path(path, sizeof path, t->set.checkpoint.dir, t->step);
    if (access(path, F_OK) == 0) {
        log_warn("%s exists already (another run's?): not overwritten; no checkpoint at step %ld", path, t->step);
        return checkpoint_failed(t);
    }
    gpu_range_push("checkpoint");
    double start = now_seconds();
    int rc = write_checkpoint(t, path, epoch, epoch_micro, err, sizeof err);
    gpu_range_pop();
    if (rc != 0) {
        log_warn("checkpoint at step %ld not written: %s", t->step, err);
        return checkpoint_failed(t);
    }
    snprintf(t->ckpt.path, sizeof t->ckpt.path, "%s", path);
    t->ckpt.step = t->step;
    unused_dir[0] = 0; /* it holds this checkpoint now */
    log_info("checkpoint: %s (%.2f s)", path, now_seconds() - start);
    rotate_checkpoints(t);
    return 0;
}

/* What the checkpoint being loaded was named by, for the messages: eval's option, or a run's key. */
static const char *resume_key(const Trainer *t) { return t->weights_from ? "--checkpoint" : "run.resume"; }

/* run.resume = FILE: refused (ending the process) naming the file and what is wrong. */
static CkptFile *open_resume_file(const char *resume) {
    char err[4400];
    struct stat st;
    if (stat(resume, &st) == 0 && S_ISDIR(st.st_mode))
        TC_USER_ERROR("run.resume = %s is a directory, not a checkpoint file: name a checkpoint in it "
                 "(%s/ckpt-<step>.trc), or resume from its newest with --resume latest --set run.checkpoint_dir=%s",
                 resume, resume, resume);
    CkptFile *f = ckpt_open(resume, err, sizeof err);
    if (!f) TC_USER_ERROR("run.resume: %s", err);
    return f;
}

/* Renames a damaged checkpoint to <path>.corrupt (or .corrupt.2, ...), never
 * replacing a file; 0 with the new name in aside, or -1 with errno. */
static int move_aside(const char *path, char *aside, size_t n) {
    for (int i = 1; i <= 100; i++) {
        if (i == 1) snprintf(aside, n, "%s.corrupt", path);
        else snprintf(aside, n, "%s.corrupt.%d", path, i);
        if (files_rename_noreplace(path, aside) == 0) return 0;
        if (errno != EEXIST) return -1;
    }
    errno = EEXIST;
    return -1;
}

/* run.resume = latest: the newest checkpoint in run.checkpoint_dir. A damaged
 * one (truncated, corrupt, not a checkpoint) is moved aside to *.corrupt with a
 * warning, and the one before it is tried; one that cannot be used for another
 * reason (unreadable, a newer format, a directory) stops the run. Other ranks
 * skip what rank 0 moves aside, so every rank opens the same file. */
static CkptFile *open_resume_latest(const Trainer *t) {
    char err[4400], path[4200], aside[4300];
    long *steps;
    remove_stale_temporaries(t);
    int n = list_checkpoints(t->set.checkpoint.dir, &steps);
    if (n < 0)
        TC_USER_ERROR("run.resume = latest: cannot read run.checkpoint_dir = %s: %s", t->set.checkpoint.dir,
                      strerror(errno));
    if (n == 0)
        TC_USER_ERROR("run.resume = latest: no checkpoint (ckpt-*.trc) in run.checkpoint_dir = %s",
                      t->set.checkpoint.dir);
    CkptFile *f = NULL;
    for (int i = 0; i < n && !f; i++) {
        CkptStatus status;
        checkpoint_path(path, sizeof path, t->set.checkpoint.dir, steps[i]);
        f = ckpt_open_status(path, &status, err, sizeof err);
        if (f || t->ddp.dist->rank != 0) continue;
        if (status != CKPT_ERR_CORRUPT)
            TC_USER_ERROR("run.resume = latest: the newest checkpoint cannot be used: %s. Make it readable, move it "
                     "out of %s to resume from the one before it, or name a checkpoint with --resume FILE",
                     err, t->set.checkpoint.dir);
        if (move_aside(path, aside, sizeof aside) != 0)
            TC_USER_ERROR("run.resume = latest: %s; it cannot be moved aside (%s): move it out of %s to resume from "
                     "the one before it, or name a checkpoint with --resume FILE", err, strerror(errno),
                     t->set.checkpoint.dir);
        log_warn("run.resume = latest: %s. Moved it aside to %s (kept, not deleted); trying the one before it",
                 err, aside);
    }
    free(steps);
    if (!f)
        TC_USER_ERROR("run.resume = latest: no valid checkpoint in %s (the damaged ones are moved aside to *.corrupt; "
                 "see the warnings above)", t->set.checkpoint.dir);
    return f;
}

/* run.resume: a file, or "latest"; eval's --checkpoint a file. Fails naming the file and what is wrong. */
CkptFile *open_resume(const Trainer *t, const char *resume) {
    char err[4400];
    if (t->weights_from) {
        CkptFile *f = ckpt_open(resume, err, sizeof err);
        if (!f) TC_USER_ERROR("--checkpoint: %s", err);
        return f;
    }
    return strcmp(resume, "latest") == 0 ? open_resume_latest(t) : open_resume_file(resume);
}

/* A fresh run writing checkpoints must not mix them with another run's, and a
 * resumed one must not write over checkpoints newer than its start. Rank 0
 * writes them, into the folder it chose (choose_final_dir). */
void check_checkpoint_dir(const Trainer *t, long resume_step) {
    long *steps;
    if (t->ddp.dist->rank != 0) return;
    remove_stale_temporaries(t);
    int n = list_checkpoints(t->set.checkpoint.dir, &steps);
    if (n > 0 && resume_step < 0)
        TC_USER_ERROR("run.checkpoint_dir = %s already holds checkpoints (newest ckpt-%08ld.trc): resume with "
                 "--resume latest, or set another run.checkpoint_dir (or run.save_final = off and "
                 "run.checkpoint_every = 0 for a run that writes none)", t->set.checkpoint.dir, steps[0]);
    if (n > 0 && steps[0] > resume_step)
        TC_USER_ERROR("run.checkpoint_dir = %s holds ckpt-%08ld.trc, newer than the resumed step %ld: move it "
                 "away or set another run.checkpoint_dir (trainc never overwrites checkpoints)",
                 t->set.checkpoint.dir, steps[0], resume_step);
    free(steps);
}

/* Every enum, count and size the file holds, in range before any is used. */
static void check_fields(const Trainer *t, const char *path, const CkptModel *have, const CkptPosition *pos,
                         const LossScalerState *scaler) {
    int64_t dtype = have->act_dtype;
    struct { int out_of_range; const char *field; } checks[] = {
        {dtype != DTYPE_F32 && dtype != DTYPE_F16 && dtype != DTYPE_BF16, "model.act_dtype (f32, f16 or bf16)"},
        {have->nhwc != 0 && have->nhwc != 1, "model.nhwc (0 or 1)"},
        {have->n_params < 0, "model.n_params"},
        {have->num_classes < 1 || have->num_classes > INT_MAX, "model.num_classes"},
        {have->accumulate < 1 || have->accumulate > INT_MAX, "model.accumulate"},
        {pos->step < 0, "position.step"},
        {pos->epoch < 0 || pos->epoch > INT_MAX, "position.epoch"},
        {pos->epoch_micro < 0, "position.epoch_micro"},
        {!(scaler->scale >= 0), "loss_scaler.scale"},
        {scaler->good_steps < 0 || scaler->skipped_steps < 0, "loss_scaler's step counts"},
    };
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++)
        if (checks[i].out_of_range)
            TC_USER_ERROR("%s: %s: corrupt checkpoint: its field %s is out of range (model: dtype %lld, "
                          "nhwc %lld, %lld classes, accumulate %lld, %lld parameters; position: step %lld, epoch "
                          "%lld, micro-batch %lld; loss scale %g)", resume_key(t), path, checks[i].field,
                          (long long)dtype,
                          (long long)have->nhwc, (long long)have->num_classes, (long long)have->accumulate,
                          (long long)have->n_params, (long long)pos->step, (long long)pos->epoch,
                          (long long)pos->epoch_micro, (double)scaler->scale);
}

static void shape_text(char *out, size_t n, const int *shape, int ndim) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, d ? ",%d" : "%d", shape[d]);
    if (used < n) snprintf(out + used, n - used, "]");
}

/* The first tensor of the checkpoint's table (its "tensors" section) whose name or shape is not the built
 * model's, into out; 0 when none differs or the checkpoint has no table. */
static int first_tensor_difference(CkptFile *f, const Model *m, char *out, size_t n) {
    char err[4400];
    cJSON *table = checkpoint_json_section(f, "tensors", err, sizeof err);
    int count = model_tensors(m, NULL, 0, err, sizeof err), found = 0;
    ModelTensor *ts = table && count > 0 ? malloc((size_t)count * sizeof *ts) : NULL;
    if (ts && model_tensors(m, ts, count, err, sizeof err) == count) {
        int have = cJSON_GetArraySize(table);
        for (int i = 0; i < have && i < count && !found; i++) {
            const cJSON *e = cJSON_GetArrayItem(table, i), *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
            int dims[MODEL_TENSOR_MAX_DIMS], ndim = cJSON_GetArraySize(shape);
            int same = name && strcmp(name, ts[i].name) == 0 && ndim == ts[i].ndim;
            for (int d = 0; d < ndim && d < MODEL_TENSOR_MAX_DIMS; d++) {
                const cJSON *v = cJSON_GetArrayItem(shape, d);
                dims[d] = cJSON_IsNumber(v) ? v->valueint : -1;
                same &= dims[d] == ts[i].shape[d];
            }
            if (same) continue;
            char a[96], b[96];
            shape_text(a, sizeof a, dims, ndim < MODEL_TENSOR_MAX_DIMS ? ndim : MODEL_TENSOR_MAX_DIMS);
            shape_text(b, sizeof b, ts[i].shape, ts[i].ndim);
            snprintf(out, n, "tensor %d is %.64s %s in it, %s %s in this run's net", i, name ? name : "(unnamed)", a,
                     ts[i].name, b);
            found = 1;
        }
        if (!found && have != count) {
            snprintf(out, n, "it has %d tensors, this run's net %d (the first %d alike)", have, count,
                     have < count ? have : count);
            found = 1;
        }
    }
    free(ts);
    cJSON_Delete(table);
    return found;
}

/* What makes the checkpoint's net another than this run's: the net's name, the class count, the image
 * size (the meta's), the first tensor unlike, or else the layer shapes' fingerprints. */
static void describe_difference(const Trainer *t, CkptFile *f, const CkptModel *have, const CkptModel *want,
                                char *out, size_t n) {
    char err[4400];
    cJSON *meta = checkpoint_json_section(f, "meta", err, sizeof err);
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(meta, "image_size");
    if (strcmp(have->name, want->name) != 0)
        snprintf(out, n, "its net is %s, this run's %s (model.name or model.net)", have->name, want->name);
    else if (have->num_classes != want->num_classes)
        snprintf(out, n, "it has %lld classes, this run %lld (model.num_classes, or the data set's classes)",
                 (long long)have->num_classes, (long long)want->num_classes);
    else if (cJSON_IsNumber(size) && size->valueint != t->set.data.image_size)
        snprintf(out, n, "its images are %dx%d, this run's %dx%d (data.image_size)", size->valueint, size->valueint,
                 t->set.data.image_size, t->set.data.image_size);
    else if (!first_tensor_difference(f, &t->model, out, n))
        snprintf(out, n, "%lld parameters (layer shapes %016llx), this run's %s %lld (%016llx)",
                 (long long)have->n_params, (unsigned long long)have->shape_fingerprint, want->name,
                 (long long)want->n_params, (unsigned long long)want->shape_fingerprint);
    cJSON_Delete(meta);
}

/* A checkpoint of another net, layout or accumulation is refused (eval: of another net or layout; it reads
 * the weights alone, in fp32); another data order only warned of. */
static void check_fits(const Trainer *t, CkptFile *f, const CkptModel *have, const CkptModel *want,
                       const CkptData *data) {
    const char *path = ckpt_path(f);
    if (strcmp(have->name, want->name) != 0 || have->n_params != want->n_params ||
        have->shape_fingerprint != want->shape_fingerprint || have->num_classes != want->num_classes) {
        char why[1024];
        describe_difference(t, f, have, want, why, sizeof why);
        TC_USER_ERROR("%s: %s holds another model than this run builds: %s", resume_key(t), path, why);
    }
    if ((have->act_dtype != want->act_dtype && !t->weights_only) || have->nhwc != want->nhwc)
        TC_USER_ERROR("%s: %s was written with precision.amp = %s and model.layout = %s; this run has %s "
                 "and %s", resume_key(t), path, dtype_name((DType)have->act_dtype), have->nhwc ? "nhwc" : "nchw",
                 dtype_name(t->set.precision.amp), t->model.nhwc ? "nhwc" : "nchw");
    if (have->accumulate != want->accumulate && !t->weights_only)
        TC_USER_ERROR("%s: %s was written with memory.accumulate = %lld, this run has %d (the momentum "
                 "buffer holds k times its value)", resume_key(t), path, (long long)have->accumulate,
                 t->set.memory.accumulate);
    if (!t->weights_only && (data->seed != (int64_t)t->set.run.seed || data->batch != t->set.train.batch ||
                             data->train_images != t->data.train.n || data->shuffle != t->set.data.shuffle))
        log_warn("%s: %s was written with run.seed = %lld, train.batch = %lld, %lld training images, "
                 "data.shuffle = %s; the data order from here on differs from that run's", resume_key(t), path,
                 (long long)data->seed, (long long)data->batch, (long long)data->train_images,
                 data->shuffle ? "on" : "off");
}

/* A section of n_params floats into host; from a checkpoint written before the
 * layers' parameters were aligned (packed), spread into the model's layout. */
static void read_params_section(Trainer *t, CkptFile *f, const char *name, int packed, float *host) {
    char err[4400];
    const Model *m = &t->model;
    size_t count = packed ? model_param_count(m) : m->n_params;
    float *read = packed ? malloc(count * sizeof(float)) : host;
    if (!read) TC_FATAL("out of host memory: %zu parameters from %s", count, ckpt_path(f));
    if (ckpt_read_section(f, name, read, count * sizeof(float), err, sizeof err) != 0)
        TC_USER_ERROR("%s: %s", resume_key(t), err);
    if (packed) {
        model_unpack_params(m, read, host);
        free(read);
    }
}

/* Parameters, momentum and batch-norm statistics into the built model. */
static void load_weights(Trainer *t, CkptFile *f, const char *path, int packed) {
    char err[4400];
    float *host = malloc(t->model.n_params * sizeof(float));
    if (!host) TC_FATAL("out of host memory: %zu parameters from %s", t->model.n_params, path);
    read_params_section(t, f, "params", packed, host);
    if (model_weights_check_finite(&t->model, host, NULL, path, err, sizeof err) != 0)
        TC_USER_ERROR("run.resume: %s", err);
    model_set_params(&t->model, host);
    read_params_section(t, f, "momentum", packed, host);
    model_set_momentum(&t->model, host);
    free(host);
    if (t->model.n_bn_stats) {
        size_t stat_bytes = t->model.n_bn_stats * sizeof(float);
        float *stats = malloc(stat_bytes);
        if (!stats) TC_FATAL("out of host memory: batch-norm statistics from %s", path);
        if (ckpt_read_section(f, "bn_stats", stats, stat_bytes, err, sizeof err) != 0)
            TC_USER_ERROR("%s: %s", resume_key(t), err);
        if (model_weights_check_finite(&t->model, NULL, stats, path, err, sizeof err) != 0)
            TC_USER_ERROR("%s: %s", resume_key(t), err);
        model_set_bn_stats(&t->model, stats);
        free(stats);
    }
}

/* The optimizer's state beyond momentum: refused when the checkpoint's
 * optimizer is not this run's (both named); Adam's second moment and step
 * count. A checkpoint without the section is of SGD or Muon. */
static void load_optimizer(Trainer *t, CkptFile *f, const char *path, int packed) {
    char err[4400];
    CkptOptim optim;
    memset(&optim, 0, sizeof optim);
    const char *want = settings_optim_name(t->set.optim.name);
    if (ckpt_section_size(f, "optimizer") < 0) {
        if (t->model.adam)
            TC_USER_ERROR("%s: %s was written by SGD or Muon (before checkpoints named their optimizer), "
                          "this run has optim.name = %s: resume with the checkpoint's optimizer, or start from its "
                          "weights alone with trainc export and run.init_from", resume_key(t), path, want);
        return;
    }
    if (ckpt_read_section(f, "optimizer", &optim, sizeof optim, err, sizeof err) != 0)
        TC_USER_ERROR("%s: %s", resume_key(t), err);
    optim.name[sizeof optim.name - 1] = 0;
    if (strcmp(optim.name, want) != 0)
        TC_USER_ERROR("%s: %s was written with optim.name = %s, this run has optim.name = %s (the optimizer's "
                      "state does not carry over): resume with optim.name = %s, or start from its weights alone "
                      "with trainc export and run.init_from", resume_key(t), path, optim.name, want, optim.name);
    if (!t->model.adam) return;
    if (optim.adam_steps < 0)
        TC_USER_ERROR("%s: %s: corrupt Adam step count %lld", resume_key(t), path, (long long)optim.adam_steps);
    float *host = malloc(t->model.n_params * sizeof(float));
    if (!host) TC_FATAL("out of host memory: %zu parameters from %s", t->model.n_params, path);
    read_params_section(t, f, "second_moment", packed, host);
    model_set_second_moment(&t->model, host);
    free(host);
    model_set_adam_steps(&t->model, optim.adam_steps);
}

/* Loads a checkpoint into the built model; returns where the data order goes on. */
CkptPosition load_checkpoint(Trainer *t, CkptFile *f) {
    char err[4400];
    const char *path = ckpt_path(f);
    CkptModel have, want = ckpt_model_of(t);
    CkptPosition pos;
    CkptData data;
    LossScalerState scaler;
    if (ckpt_read_section(f, "model", &have, sizeof have, err, sizeof err) != 0 ||
        ckpt_read_section(f, "position", &pos, sizeof pos, err, sizeof err) != 0 ||
        ckpt_read_section(f, "data", &data, sizeof data, err, sizeof err) != 0 ||
        ckpt_read_section(f, "loss_scaler", &scaler, sizeof scaler, err, sizeof err) != 0)
        TC_USER_ERROR("%s: %s", resume_key(t), err);
    have.name[sizeof have.name - 1] = 0;
    check_fields(t, path, &have, &pos, &scaler);
    /* Written before the layers' parameters were aligned: the same parameters, packed. */
    int packed = have.n_params != want.n_params && have.n_params == (int64_t)model_param_count(&t->model);
    if (packed) have.n_params = want.n_params;
    check_fits(t, f, &have, &want, &data);
    load_weights(t, f, path, packed);
    if (!t->weights_only) load_optimizer(t, f, path, packed);
    if (t->set.precision.amp == DTYPE_F32 && scaler.scale != 1) scaler.scale = 1; /* defensive: fp32 never scales */
    t->seen.scaler = scaler;
    op_copy_from_host(&t->model.ops, t->buf.scaler, &scaler, sizeof scaler);
    t->step = t->first_step = t->seen.step = (long)pos.step;
    int64_t lr_step = pos.step; /* the schedule goes on from the checkpoint's step */
    op_copy_from_host(&t->model.ops, t->buf.lr_step, &lr_step, sizeof lr_step);
    model_set_dropout_step(&t->model, pos.step * t->set.memory.accumulate); /* a training forward a micro-batch */
    op_sync(&t->model.ops);
    t->seen.bad_total = scaler.skipped_steps;
    snprintf(t->ckpt.path, sizeof t->ckpt.path, "%s", path);
    t->ckpt.step = t->step;
    log_info("resumed from %s: step %ld, epoch %lld, %lld micro-batches into it", path, t->step,
             (long long)pos.epoch + 1, (long long)pos.epoch_micro);
    return pos;
}

