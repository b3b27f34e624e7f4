/* trainc eval: a checkpoint through the inference path (models/infer.h: batch
 * norm folded, fused epilogues, half precision NHWC on the GPU). The logits
 * come back to the host once per batch (a host pass over [batch][classes] is
 * small next to the forward), where each image's argmax, rank of its label
 * and cross-entropy are counted: top-1 is the accuracy op's argmax (first
 * maximum on ties), as in the trainer's own evaluation. */
#include "tools/trainer/eval.h"

#include "models/infer.h"
#include "runtime/files.h"
#include "runtime/json_out.h"
#include "runtime/log.h"
#include "tools/trainer/infer_options.h"
#include "tools/trainer/trainer.h"

/* What an evaluation must not do as a run would: write checkpoints, metrics,
 * TensorBoard events, serve Prometheus, resume or load other weights; and it
 * takes the whole optimizer state on every rank. */
static void set_eval_keys(Config *cfg) {
    static const char *const keys[] = {"run.eval=on", "run.checkpoint_every=0", "run.save_final=off",
                                       "run.metrics_file=", "run.tensorboard_dir=", "monitor.prometheus_port=0",
                                       "run.resume=", "run.init_from=", "dist.shard_optimizer=off",
                                       "run.profile_steps="};
    char *err = NULL;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (config_set_msg(cfg, keys[i], &err) != 0) TC_FATAL("internal: %s", err);
}

/* The whole file is read and its checksums verified before anything is built. */
static void check_checkpoint_file(const char *path) {
    char err[4400];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        TC_USER_ERROR("--checkpoint %s is a directory: name a checkpoint in it (%s/ckpt-<step>.trc)", path, path);
    CkptFile *f = ckpt_open(path, err, sizeof err);
    if (!f) TC_USER_ERROR("--checkpoint: %s", err);
    ckpt_close(f);
}

/* One image's row of logits: argmax, and how many classes rank before its label. */
static void tally_image(EvalReport *r, const float *row, int label) {
    int classes = r->classes, best = 0, before = 0;
    float max = row[0];
    for (int j = 1; j < classes; j++)
        if (row[j] > row[best]) best = j; /* strict: the first maximum wins, as accuracy_count */
    for (int j = 0; j < classes; j++) {
        before += row[j] > row[label] || (row[j] == row[label] && j < label);
        if (row[j] > max) max = row[j];
    }
    double sum = 0;
    for (int j = 0; j < classes; j++) sum += exp((double)row[j] - max);
    r->loss_sum += log(sum) + max - row[label];
    r->confusion[(size_t)label * classes + best]++;
    r->top1 += best == label;
    r->top5 += best == label || (before < 5 && !isnan(row[label]));
    r->n++;
}

/* Every rank's counts summed (exact in double below 2^53). */
static void sum_over_ranks(EvalReport *r, Dist *dist) {
    if (dist->world == 1) return;
    size_t cells = (size_t)r->classes * r->classes;
    double *v = malloc((cells + 4) * sizeof(double));
    if (!v) TC_FATAL("out of host memory: a %dx%d confusion matrix", r->classes, r->classes);
    for (size_t i = 0; i < cells; i++) v[i] = (double)r->confusion[i];
    v[cells] = (double)r->n;
    v[cells + 1] = (double)r->top1;
    v[cells + 2] = (double)r->top5;
    v[cells + 3] = r->loss_sum;
    dist_allreduce_sum_host_double(dist, v, (int)(cells + 4));
    for (size_t i = 0; i < cells; i++) r->confusion[i] = (long)v[i];
    r->n = (long)v[cells];
    r->top1 = (long)v[cells + 1];
    r->top5 = (long)v[cells + 2];
    r->loss_sum = v[cells + 3];
    free(v);
}

/* The inference path (models/infer.h) of the trainer's model, with its weights. */
static InferNet *open_inference(const Trainer *t) {
    const Model *m = &t->model;
    float *params = malloc(m->n_params * sizeof(float)), *stats = malloc((m->n_bn_stats + 1) * sizeof(float));
    if (!params || !stats) TC_FATAL("out of host memory: %zu parameters", m->n_params);
    model_get_params(m, params);
    model_get_bn_stats(m, stats);
    InferOptions opt = infer_options_of(&t->set, t->set.train.batch);
    InferNet *net = infer_create(m, params, stats, m->gpu, &opt);
    InferStats st = infer_stats(net);
    log_info("eval: the inference path, %s: %d of %d convolutions one cuDNN graph, %d batch norms folded",
             m->gpu ? (opt.dtype == DTYPE_BF16 ? "bf16 NHWC" : "fp16 NHWC") : "fp32 on the CPU", st.convs_fused,
             st.convs, st.bn_folded);
    free(params);
    free(stats);
    return net;
}

/* The test loader's batches, each copied from where the trainer's loader
 * prepares it (the model's input buffer) into the inference net's input. */
static void evaluate_test_split(Trainer *t, EvalReport *r) {
    InferNet *net = open_inference(t);
    const OpContext *ctx = infer_ops(net);
    size_t per_image = infer_input_floats(net) / (size_t)infer_batch(net);
    float *logits = malloc((size_t)t->set.train.batch * r->classes * sizeof(float));
    if (!logits) TC_FATAL("out of host memory: a batch of logits");
    Batch b;
    gpu_range_push("evaluate");
    loader_start_epoch(t->data.test_loader, 0);
    while (loader_next(t->data.test_loader, &b)) {
        int n = b.n;
        upload_sync(t, &b);
        loader_release(t->data.test_loader, &b);
        op_copy(ctx, infer_input(net), model_input_buffer(&t->model), (size_t)n * per_image * sizeof(float));
        infer_run(net);
        op_copy_to_host(ctx, logits, infer_logits(net), (size_t)n * r->classes * sizeof(float));
        op_sync(ctx);
        for (int i = 0; i < n; i++) tally_image(r, logits + (size_t)i * r->classes, t->input.host_labels[i]);
    }
    gpu_range_pop();
    free(logits);
    infer_destroy(net);
}

static void copy_class_names(const Source *d, EvalReport *r) {
    if (!d->class_names || d->num_classes != r->classes) return;
    r->names = calloc((size_t)r->classes, sizeof *r->names);
    if (!r->names) TC_FATAL("out of host memory: %d class names", r->classes);
    for (int c = 0; c < r->classes; c++) snprintf(r->names[c], sizeof r->names[c], "%s", d->class_names[c]);
}

/* The trainer opens a training split, which eval never reads: one step's worth
 * of it (every rank a full batch of each micro-batch) instead of all of it. */
static void limit_training_split(Config *cfg, const Dist *dist) {
    TrainSettings s;
    settings_fill(cfg, &s);
    long need = (long)s.train.batch * s.memory.accumulate * dist->world;
    if (s.data.train_limit != 0 && s.data.train_limit <= need) return;
    if (s.data.val_split > 0) return; /* the held-out images are chosen from the whole split */
    char set[64], *err = NULL;
    snprintf(set, sizeof set, "data.train_limit=%ld", need);
    if (config_set_msg(cfg, set, &err) != 0) TC_USER_ERROR("train.batch and memory.accumulate: %s", err);
}

void eval_run(Config *cfg, Dist *dist, const char *checkpoint, EvalReport *r) {
    memset(r, 0, sizeof *r);
    check_checkpoint_file(checkpoint);
    CheckpointNet net;
    checkpoint_config_apply(cfg, "--checkpoint", checkpoint, &net);
    set_eval_keys(cfg);
    limit_training_split(cfg, dist);
    Trainer trainer = {0}, *t = &trainer;
    t->weights_only = 1;
    t->weights_from = checkpoint;
    t->weights_net = &net;
    TrainSummary opened;
    trainer_open(t, cfg, dist, &opened, now_seconds());
    if (t->data.test.n == 0)
        settings_fail(&t->set, "data.path", "the test split of %s holds no images", t->set.data.path);
    snprintf(r->checkpoint, sizeof r->checkpoint, "%s", checkpoint);
    snprintf(r->model, sizeof r->model, "%s", t->set.model.name);
    snprintf(r->device, sizeof r->device, "%s", opened.device);
    r->step = t->step;
    r->classes = t->model.num_classes;
    r->confusion = calloc((size_t)r->classes * r->classes, sizeof(long));
    if (!r->confusion) TC_FATAL("out of host memory: a %dx%d confusion matrix", r->classes, r->classes);
    copy_class_names(&t->data.test, r);
    evaluate_test_split(t, r);
    sum_over_ranks(r, dist);
    if (r->n != t->data.test.n)
        TC_FATAL("internal: the ranks evaluated %ld of %d test images", r->n, t->data.test.n);
    trainer_close(t);
    checkpoint_net_free(&net);
}

void eval_report_free(EvalReport *r) {
    free(r->confusion);
    free(r->names);
    r->confusion = NULL;
    r->names = NULL;
}

/* Images of class c, and those of them predicted as c. */
static long class_images(const EvalReport *r, int c) {
    long n = 0;
    for (int j = 0; j < r->classes; j++) n += r->confusion[(size_t)c * r->classes + j];
    return n;
}

static long class_correct(const EvalReport *r, int c) { return r->confusion[(size_t)c * r->classes + c]; }

static void print_confusion(const EvalReport *r, FILE *f) {
    if (r->classes > EVAL_MATRIX_TEXT_MAX) {
        fprintf(f, "confusion matrix: %d classes, too many to print (--csv FILE writes it)\n", r->classes);
        return;
    }
    fprintf(f, "confusion matrix (rows: true class, columns: predicted):\n%8s", "");
    for (int j = 0; j < r->classes; j++) fprintf(f, " %7d", j);
    fputc('\n', f);
    for (int c = 0; c < r->classes; c++) {
        fprintf(f, "%8d", c);
        for (int j = 0; j < r->classes; j++) fprintf(f, " %7ld", r->confusion[(size_t)c * r->classes + j]);
        fputc('\n', f);
    }
}

void eval_print(const EvalReport *r, FILE *f) {
    fprintf(f, "eval: %s (step %ld), %s on %s, %ld test images\n", r->checkpoint, r->step, r->model, r->device, r->n);
    fprintf(f, "top-1 accuracy  %.2f%%  (%ld of %ld)\n", 100 * eval_top1(r), r->top1, r->n);
    if (r->classes > 5) /* with 5 classes or fewer every label is among the 5 largest */
        fprintf(f, "top-5 accuracy  %.2f%%  (%ld of %ld)\n", 100.0 * (double)r->top5 / (double)r->n, r->top5, r->n);
    fprintf(f, "loss            %.6f  (mean cross-entropy)\n", r->loss_sum / (double)r->n);
    fprintf(f, "per-class accuracy:\n%8s %8s %8s %9s  %s\n", "class", "images", "correct", "accuracy",
            r->names ? "name" : "");
    for (int c = 0; c < r->classes; c++) {
        long n = class_images(r, c), correct = class_correct(r, c);
        char name[4 * sizeof r->names[0] + 8] = "";
        if (r->names) log_escape(r->names[c], name, sizeof name);
        if (n) fprintf(f, "%8d %8ld %8ld %8.2f%%  %s\n", c, n, correct, 100.0 * (double)correct / (double)n, name);
        else fprintf(f, "%8d %8ld %8ld %9s  %s\n", c, n, correct, "-", name);
    }
    print_confusion(r, f);
}

int eval_write_csv(const EvalReport *r, const char *path, char *err, size_t errlen) {
    FILE *f = files_open_output(path, 0, err, errlen);
    if (!f) return -1;
    fprintf(f, "class,images,correct,accuracy");
    for (int j = 0; j < r->classes; j++) fprintf(f, ",predicted_%d", j);
    fputc('\n', f);
    for (int c = 0; c < r->classes; c++) {
        long n = class_images(r, c), correct = class_correct(r, c);
        fprintf(f, "%d,%ld,%ld,", c, n, correct);
        if (n) fprintf(f, "%.6f", (double)correct / (double)n);
        for (int j = 0; j < r->classes; j++) fprintf(f, ",%ld", r->confusion[(size_t)c * r->classes + j]);
        fputc('\n', f);
    }
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) {
        snprintf(err, errlen, "cannot write it: %s", strerror(errno));
        return -1;
    }
    return 0;
}

void eval_print_json(const EvalReport *r, FILE *f) {
    cJSON *o = json_object_new();
    json_add_string(o, "checkpoint", r->checkpoint);
    json_add_int(o, "step", r->step);
    json_add_int(o, "n", r->n);
    json_add_int(o, "classes", r->classes);
    json_add_number(o, "top1", eval_top1(r), 6);
    json_add_number(o, "top5", r->classes > 5 ? (double)r->top5 / (double)r->n : NAN, 6);
    json_add_number(o, "loss", r->loss_sum / (double)r->n, 6);
    if (json_write_line(f, o) != 0) TC_USER_ERROR("writing the evaluation's summary: %s", strerror(errno));
}
