/* optim.name = adamw and adam in the trainer, on the CPU (and on a GPU where
 * there is one): a short run learns the classes; a step skipped for a NaN
 * gradient changes nothing and is not counted; k accumulated micro-batches
 * take the step of one batch k times as large; a run stopped and resumed from
 * its checkpoint (which holds both moments and the step count) ends on the
 * bits of the run that never stopped; a checkpoint of another optimizer is
 * refused naming both, one written before checkpoints named their optimizer
 * (SGD) still resumes with SGD. On a GPU: the step replayed as a CUDA graph
 * takes the eager step's bits (the step count lives on the device), fp16 AMP
 * trains, and the GPU's run is the CPU's within rounding.
 *
 * `test_adamw_train trajectory FILE` writes a few steps of the CPU reference
 * (ops/adamw.h) as JSON for tools/torch_optim_check.py to replay in PyTorch. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "models/zoo.h"
#include "ops/adamw.h"
#include "runtime/checkpoint.h"
#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

static const char *tmpdir;

/* SimpleNet on 512 synthetic images of 32x32 in batches of 16 (32 steps an epoch). */
static Config *small_run(const char *device, const char *optimizer, int steps, const char *const *extra) {
    static const char *sets[] = {"data.source=synthetic", "data.image_size=32", "data.synthetic_train=512",
                                 "data.synthetic_test=32", "train.batch=16", "run.eval=off", "run.log_every=1000",
                                 "run.warmup_steps=0", "run.epochs=2", "data.workers=2", "data.flip=on",
                                 "data.crop_pad=4", "optim.lr=0.001", "optim.weight_decay=0.01"};
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) test_config_set(c, "%s", sets[i]);
    test_config_set(c, "run.device=%s", device);
    test_config_set(c, "optim.name=%s", optimizer);
    test_config_set(c, "run.max_steps=%d", steps);
    test_config_set(c, "run.seed=%llu", (unsigned long long)(test_seed() % 1000));
    for (; extra && *extra; extra++) test_config_set(c, "%s", *extra);
    return c;
}

static size_t n_params;

static float *run(Config *c, TrainSummary *s) {
    float *params;
    train_run_keep_params(c, s, &params);
    config_free(c);
    return params;
}

static int same(const float *a, const float *b) { return memcmp(a, b, n_params * sizeof(float)) == 0; }

static int64_t section_size(const char *path, const char *name) {
    char err[4400];
    CkptFile *f = ckpt_open(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return -1;
    int64_t n = ckpt_section_size(f, name);
    ckpt_close(f);
    return n;
}

/* ---- training --------------------------------------------------------------------- */

/* 40 steps at lr 1e-3: SimpleNet learns the synthetic set's classes. The last
 * step's loss is one batch of 16's (up to 1.5 in 163 runs of the two), so the
 * check is the accuracy on 256 held-out images: 64% to 100% in 160 runs (80
 * seeds each), 10% for an optimizer that does not learn; bound 30%. */
static const char *const held_out[] = {"run.eval=on", "data.synthetic_test=256", NULL};

static void check_learns(const char *optimizer, double test_acc, double final_loss, long steps) {
    printf("%s: test accuracy after 40 steps %.3f, last loss %.4g\n", optimizer, test_acc, final_loss);
    CHECK_MSG(steps == 40 && isfinite(final_loss) && test_acc > 0.3,
              "%s: %ld steps, test accuracy %.3f (chance 0.1), last loss %.4g", optimizer, steps, test_acc, final_loss);
}

static void check_loss_falls(const char *optimizer) {
    TrainSummary s;
    free(run(small_run("cpu", optimizer, 40, held_out), &s));
    check_learns(optimizer, s.test_acc, s.final_loss, s.steps);
}

/* A NaN gradient at step 4: the weights of 4 steps are those of 3. On one
 * batch for every step (data.resident), 4 steps with the NaN at step 1 are 3
 * steps without it, bit for bit, only if the skipped step was not counted:
 * counted, the bias corrections of the three would be steps 2 to 4's. */
static void check_skipped_step(const char *device) {
    TrainSummary s;
    float *three = run(small_run(device, "adamw", 3, NULL), &s);
    float *four = run(small_run(device, "adamw", 4, (const char *[]){"run.inject_nan_step=4", NULL}), &s);
    CHECK_MSG(s.skipped_steps == 1 && s.steps == 4, "%ld skipped of %ld", s.skipped_steps, s.steps);
    CHECK_MSG(same(three, four), "%s: the skipped step moved the weights", device);
    const char *resident = "data.resident=on";
    float *kept = run(small_run(device, "adamw", 3, (const char *[]){resident, NULL}), &s);
    float *late = run(small_run(device, "adamw", 4, (const char *[]){resident, "run.inject_nan_step=1", NULL}), &s);
    CHECK_MSG(s.skipped_steps == 1 && same(kept, late),
              "%s: 3 steps after a skipped first step differ from 3 steps (rel %.3g): the skipped step was counted",
              device, test_rel_error(late, kept, n_params));
    CHECK_MSG(!same(kept, three), "one batch and every batch train alike: the check cannot fail");
    free(three), free(four), free(kept), free(late);
}

/* 2 x 8 accumulated against 16 at once (SimpleNet has no batch norm): Adam
 * divides the summed gradient by 2, so the steps agree within rounding (which
 * Adam's normalisation amplifies where a gradient is near 0). */
static void check_accumulate(const char *optimizer) {
    TrainSummary s;
    float *whole = run(small_run("cpu", optimizer, 4, NULL), &s);
    float *micro = run(small_run("cpu", optimizer, 4, (const char *[]){"train.batch=8", "memory.accumulate=2", NULL}),
                       &s);
    double e = test_rel_error(micro, whole, n_params);
    printf("%s: 2 x 8 accumulated against 16 at once after 4 steps: weights %.3g relative\n", optimizer, e);
    CHECK_MSG(e < 1e-5, "%s: accumulated micro-batches: rel error %.3g", optimizer, e);
    free(whole), free(micro);
}

/* ---- checkpoints -------------------------------------------------------------------- */

/* The checkpoint's optimizer section: optim.name, then Adam's step count. */
static void read_optimizer_section(const char *path, char name[16], int64_t *steps) {
    char err[4400], bytes[24] = {0};
    CkptFile *f = ckpt_open(path, err, sizeof err);
    CHECK_MSG(f && ckpt_read_section(f, "optimizer", bytes, sizeof bytes, err, sizeof err) == 0, "%s", err);
    if (f) ckpt_close(f);
    memcpy(name, bytes, 16);
    name[15] = 0;
    memcpy(steps, bytes + 16, sizeof *steps);
}

static char adamw_ckpt[1024], sgd_ckpt[1024];

/* Stopped at 25 with checkpoints at 10 and 20, a NaN at step 5, resumed from
 * 20 to 40: the bits of 40 steps straight. The checkpoint at 20 holds 19
 * counted steps. */
static void check_resume(const char *optimizer) {
    TrainSummary s;
    char dir[900], every[1000], resume[1100];
    snprintf(dir, sizeof dir, "run.checkpoint_dir=%s/%s", tmpdir, optimizer);
    snprintf(every, sizeof every, "run.checkpoint_every=10");
    const char *nan = "run.inject_nan_step=5";
    float *whole = run(small_run("cpu", optimizer, 40, (const char *[]){nan, NULL}), &s);
    free(run(small_run("cpu", optimizer, 25, (const char *[]){nan, dir, every, NULL}), &s));
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/ckpt-00000020.trc", tmpdir, optimizer);
    snprintf(resume, sizeof resume, "run.resume=%s", path);
    float *resumed = run(small_run("cpu", optimizer, 40, (const char *[]){nan, dir, every, resume, NULL}), &s);
    CHECK_MSG(s.steps == 40 && same(whole, resumed), "%s resumed from step 20: %ld steps, rel error %.3g",
              optimizer, s.steps, test_rel_error(resumed, whole, n_params));
    char name[16];
    int64_t steps;
    read_optimizer_section(path, name, &steps);
    CHECK_MSG(strcmp(name, optimizer) == 0 && steps == 19, "%s: the checkpoint names %s with %lld Adam steps",
              path, name, (long long)steps);
    CHECK_MSG(section_size(path, "second_moment") == (int64_t)(n_params * sizeof(float)),
              "%s: no second moment of %zu floats", path, n_params);
    if (strcmp(optimizer, "adamw") == 0) snprintf(adamw_ckpt, sizeof adamw_ckpt, "%s", path);
    free(whole), free(resumed);
}

/* An SGD checkpoint, and the same without its optimizer section (as trainc
 * wrote them before), which must still resume with SGD. */
static void write_sgd_checkpoints(char *old_path, size_t n) {
    TrainSummary s;
    char dir[900];
    snprintf(dir, sizeof dir, "run.checkpoint_dir=%s/sgd", tmpdir);
    free(run(small_run("cpu", "sgd", 3, (const char *[]){dir, "run.checkpoint_every=3", NULL}), &s));
    snprintf(sgd_ckpt, sizeof sgd_ckpt, "%s/sgd/ckpt-00000003.trc", tmpdir);
    CHECK_MSG(section_size(sgd_ckpt, "second_moment") < 0, "an SGD checkpoint with a second moment");
    snprintf(old_path, n, "%s/old-sgd.trc", tmpdir);
    static const char *names[] = {"model", "meta", "tensors", "position", "data", "loss_scaler", "params", "momentum"};
    enum { N = sizeof names / sizeof *names };
    char err[4400];
    void *data[N];
    size_t bytes[N];
    CkptFile *f = ckpt_open(sgd_ckpt, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    for (int i = 0; i < N; i++) {
        bytes[i] = (size_t)ckpt_section_size(f, names[i]);
        data[i] = malloc(bytes[i] + 1);
        CHECK_MSG(ckpt_read_section(f, names[i], data[i], bytes[i], err, sizeof err) == 0, "%s", err);
    }
    ckpt_close(f);
    CkptWriter *w = ckpt_write_begin(old_path, N, err, sizeof err);
    for (int i = 0; w && i < N; i++)
        if (ckpt_write_section(w, names[i], data[i], bytes[i], err, sizeof err) != 0) w = NULL;
    CHECK_MSG(w && ckpt_write_commit(w, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < N; i++) free(data[i]);
}

typedef struct {
    const char *optimizer, *resume;
} ResumeArgs;

static void resume_in_child(void *arg) {
    const ResumeArgs *a = arg;
    char resume[1100];
    snprintf(resume, sizeof resume, "run.resume=%s", a->resume);
    TrainSummary s;
    free(run(small_run("cpu", a->optimizer, 5, (const char *[]){resume, NULL}), &s));
}

/* Resumed with optimizer: refused with a message holding each of want (NULL-ended), or (want NULL) not. */
static void expect_resume(const char *optimizer, const char *path, const char *const *want) {
    ResumeArgs a = {optimizer, path};
    int status;
    char *err = test_child_stderr("resume", resume_in_child, &a, &status);
    if (!want) {
        CHECK_MSG(status == 0, "%s resumed with optim.name = %s: exit %d:\n%s", path, optimizer, status, err);
    } else {
        CHECK_MSG(status == 1, "%s resumed with optim.name = %s: exit %d, not refused", path, optimizer, status);
        for (; *want; want++)
            CHECK_MSG(strstr(err, *want) != NULL, "resuming %s with %s: no '%s' in:\n%s", path, optimizer, *want, err);
    }
    free(err);
}

static void check_other_optimizer(void) {
    char old_sgd[1024];
    write_sgd_checkpoints(old_sgd, sizeof old_sgd);
    expect_resume("adam", adamw_ckpt, (const char *[]){adamw_ckpt, "optim.name = adamw", "optim.name = adam ", NULL});
    expect_resume("sgd", adamw_ckpt, (const char *[]){"optim.name = adamw", "this run has optim.name = sgd", NULL});
    expect_resume("adamw", sgd_ckpt, (const char *[]){"optim.name = sgd", "this run has optim.name = adamw", NULL});
    expect_resume("muon", sgd_ckpt, (const char *[]){"optim.name = sgd", "optim.name = muon", NULL});
    expect_resume("adamw", old_sgd, (const char *[]){old_sgd, "SGD or Muon", "optim.name = adamw", NULL});
    expect_resume("sgd", old_sgd, NULL);
    expect_resume("sgd", sgd_ckpt, NULL);
}

/* ---- the GPU ------------------------------------------------------------------------ */

static void check_gpu(void) {
    TrainSummary s;
    const char *graph[] = {"perf.cuda_graph=on", NULL};
    float *eager = run(small_run("cuda", "adamw", 6, NULL), &s);
    float *graphed = run(small_run("cuda", "adamw", 6, graph), &s);
    CHECK_MSG(same(eager, graphed), "adamw replayed as a CUDA graph differs from eager: rel %.3g",
              test_rel_error(graphed, eager, n_params));
    float *cpu = run(small_run("cpu", "adamw", 6, NULL), &s);
    double e = test_rel_error(eager, cpu, n_params);
    printf("adamw: the GPU's 6 steps against the CPU's: %.3g relative\n", e);
    CHECK_MSG(e < 1e-4, "adamw on the GPU against the CPU: rel error %.3g", e);
    const char *amp_graph[] = {"precision.amp=fp16", "perf.cuda_graph=on", held_out[0], held_out[1], NULL};
    float *amp = run(small_run("cuda", "adam", 40, amp_graph), &s);
    check_learns("adam, fp16 AMP and a CUDA graph", s.test_acc, s.final_loss, s.steps);
    check_skipped_step("cuda");
    free(eager), free(graphed), free(cpu), free(amp);
}

/* ---- the reference's trajectory, for PyTorch ---------------------------------------- */

static void put_floats(FILE *f, const char *key, const float *x, size_t n) {
    fprintf(f, "\"%s\": [", key);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? ", " : "", x[i]);
    fprintf(f, "]");
}

/* Parameters in three groups: [0, 32) as they are, [32, 48) undecayed (the
 * mask), [48, 64) at half the learning rate (lr_scale 0.5: torch's group of lr
 * x 0.5 and weight_decay / 0.5). Eight steps of a schedule, gradients scaled
 * by 1024, the fourth skipped by the loss scaler. */
static void write_case(FILE *f, uint64_t *rng, const char *name, AdamwParams p, int first) {
    enum { N = 64, STEPS = 8, SKIPPED = 3 };
    static const float lrs[STEPS] = {1e-3f, 3e-3f, 1e-2f, 1e-2f, 5e-3f, 2e-3f, 1e-3f, 5e-4f};
    float w[N], m[N] = {0}, v[N] = {0}, g[N], scaled[N], share[N];
    uint8_t mask[N];
    int64_t t = 0;
    for (int i = 0; i < N; i++) share[i] = i < 48 ? 1.0f : 0.5f, mask[i] = i < 32 || i >= 48;
    p.lr_scale = share, p.decay_mask = mask;
    test_fill_uniform(w, N, rng, -1, 1);
    fprintf(f, "%s{\"name\": \"%s\", \"optimizer\": \"%s\", \"betas\": [%.9g, %.9g], \"eps\": %.9g, "
            "\"weight_decay\": %.9g,\n \"groups\": [{\"first\": 0, \"count\": 32, \"lr_scale\": 1, \"decay\": 1}, "
            "{\"first\": 32, \"count\": 16, \"lr_scale\": 1, \"decay\": 0}, "
            "{\"first\": 48, \"count\": 16, \"lr_scale\": 0.5, \"decay\": 1}],\n ", first ? "" : ",\n", name,
            p.decoupled ? "adamw" : "adam", p.beta1, p.beta2, p.eps, p.weight_decay);
    put_floats(f, "w0", w, N);
    fprintf(f, ",\n \"steps\": [");
    for (int step = 0; step < STEPS; step++) {
        LossScalerState scaler = loss_scaler_initial(1024.0f);
        scaler.found_inf = step == SKIPPED;
        test_fill_uniform(g, N, rng, -1, 1);
        for (int i = 0; i < N; i++) scaled[i] = g[i] * 1024.0f;
        adamw_count_step_cpu(&t, &scaler);
        adamw_step_mixed_cpu(w, scaled, m, v, N, &lrs[step], &t, &scaler, p);
        fprintf(f, "%s\n  {\"lr\": %.9g, \"skipped\": %d, \"step\": %lld, ", step ? "," : "", lrs[step],
                scaler.found_inf, (long long)t);
        put_floats(f, "grad", g, N);
        fprintf(f, ", ");
        put_floats(f, "w", w, N);
        fprintf(f, ", ");
        put_floats(f, "m", m, N);
        fprintf(f, ", ");
        put_floats(f, "v", v, N);
        fprintf(f, "}");
    }
    fprintf(f, "]}");
}

static int write_trajectory(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    uint64_t rng = test_seed();
    const struct {
        const char *name;
        AdamwParams p;
    } cases[] = {
        {"adamw, torch's defaults",
         {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .decoupled = 1}},
        {"adam, L2", {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f}},
        {"adamw, betas 0.8 0.95", {.beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f, .decoupled = 1}},
        {"adam, eps 1e-3", {.beta1 = 0.5f, .beta2 = 0.9f, .eps = 1e-3f, .weight_decay = 0.3f}},
    };
    fprintf(f, "{\"cases\": [\n");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) write_case(f, &rng, cases[i].name, cases[i].p, i == 0);
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "trajectory") == 0) return write_trajectory(argv[2]);
    tmpdir = test_tmpdir("adamw_train");
    Model m;
    char err[256];
    CHECK_MSG(model_build(&m, "simplenet", 1, 32, 10, 0, err, sizeof err) == 0, "%s", err);
    n_params = m.n_params; /* counted while building; nothing allocated yet */
    check_loss_falls("adamw");
    check_loss_falls("adam");
    check_skipped_step("cpu");
    check_accumulate("adamw");
    check_accumulate("adam");
    check_resume("adamw");
    check_resume("adam");
    check_other_optimizer();
    if (test_have_gpu()) check_gpu();
    else printf("no GPU: the GPU checks (CUDA graph, fp16 AMP, against the CPU) are skipped\n");
    return test_finish("test_adamw_train");
}
