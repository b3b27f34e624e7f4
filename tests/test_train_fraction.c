/* A fractional run.epochs on the CPU: ceil(run.epochs x steps per epoch)
 * optimizer steps, the last epoch stopping early after the first steps of a
 * whole one (the same bits), evaluated after it, the summary saying run.epochs;
 * the one-cycle schedule spanning exactly those steps (its minimum, about
 * 4e-6 of optim.lr, on the last one); memory.accumulate counting optimizer
 * steps; 0.7 x 10 (7.000000000000001 in doubles) 7 steps; resumed from a
 * checkpoint inside the partial epoch and at its end, the same bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

/* 64 synthetic images in batches of 16: 4 steps an epoch. */
static const char *base_sets[] = {"run.device=cpu", "data.source=synthetic", "data.image_size=32",
                                  "data.synthetic_train=64", "data.synthetic_test=32", "train.batch=16",
                                  "run.log_every=1000", "run.warmup_steps=0", "data.workers=2", "data.flip=on",
                                  "data.crop_pad=2", "optim.lr=0.05", "optim.momentum=0.9",
                                  "optim.weight_decay=0.001"};
enum { N_BASE = sizeof base_sets / sizeof *base_sets };

static size_t n_params;

/* The base sets, the test's seed and 'sets' (key=value, space-separated). */
static Config *config_of(const char *sets) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    for (int i = 0; i < N_BASE; i++) test_config_set(c, "%s", base_sets[i]);
    test_config_set(c, "run.seed=%llu", (unsigned long long)(test_seed() % 1000003));
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", sets);
    for (char *save = NULL, *set = strtok_r(copy, " ", &save); set; set = strtok_r(NULL, " ", &save))
        test_config_set(c, "%s", set);
    return c;
}

static float *run(const char *sets, TrainSummary *s) {
    Config *c = config_of(sets);
    float *params;
    train_run_keep_params(c, s, &params);
    config_free(c);
    return params;
}

static float *run_steps(const char *sets, long want_steps) {
    TrainSummary s;
    float *params = run(sets, &s);
    CHECK_MSG(s.steps == want_steps, "%s: %ld steps, want %ld", sets, s.steps, want_steps);
    return params;
}

static double max_diff(const float *a, const float *b) {
    double worst = 0;
    for (size_t i = 0; i < n_params; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

/* The metrics file's epoch_end lines: how many, and the step of the last. */
static int epoch_ends(const char *path, int *last_step) {
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "no metrics file %s", path);
    char line[1024];
    int n = 0, epoch, step;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "{\"epoch_end\": %d, \"step\": %d", &epoch, &step) == 2) n++, *last_step = step;
    if (f) fclose(f);
    return n;
}

/* 2.5 epochs of 4 steps: 10 steps, epoch 3 stopping after 2, evaluated; the
 * steps and bits of a 3-epoch run stopped at step 10 (constant lr). */
static void check_partial_epoch(const char *dir) {
    char sets[1024];
    snprintf(sets, sizeof sets, "run.epochs=2.5 run.metrics_file=%s/metrics.jsonl", dir);
    TrainSummary s;
    float *fraction = run(sets, &s);
    CHECK_MSG(s.steps == 10 && s.epochs == 2.5, "2.5 epochs: %ld steps, epochs %g", s.steps, s.epochs);
    CHECK_MSG(s.test_acc >= 0 && s.test_acc <= 1, "no evaluation after the partial epoch (test_acc %g)", s.test_acc);
    snprintf(sets, sizeof sets, "%s/metrics.jsonl", dir);
    int last_step = 0, ends = epoch_ends(sets, &last_step);
    CHECK_MSG(ends == 3 && last_step == 10, "%d epoch ends, the last at step %d", ends, last_step);
    float *whole = run_steps("run.epochs=3 run.max_steps=10", 10);
    CHECK_MSG(max_diff(fraction, whole) == 0, "2.5 epochs and 3 epochs stopped at step 10 differ by %g",
              max_diff(fraction, whole));
    free(fraction), free(whole);
}

/* One cycle over 2.5 epochs: its minimum, lr / 25 / 1e4, on step 10, so the
 * last step moves the weights about 1e-4 as much as step 9 (lr / 26 there);
 * a schedule of 3 whole epochs (12 steps) would give step 10 lr / 10. */
static void check_schedule_end(void) {
    const char *cycle = "run.eval=off run.epochs=2.5 optim.schedule=onecycle optim.warmup_epochs=0.5";
    char sets[512];
    float *p[3];
    for (int i = 0; i < 3; i++) {
        snprintf(sets, sizeof sets, "%s run.max_steps=%d", cycle, 8 + i);
        p[i] = run_steps(sets, 8 + i);
    }
    double step9 = max_diff(p[1], p[0]), step10 = max_diff(p[2], p[1]);
    printf("one cycle over 10 steps: step 9 moved the weights by at most %.3g, step 10 by %.3g\n", step9, step10);
    CHECK_MSG(step9 > 0 && step10 < 1e-2 * step9, "step 10 moved the weights by %g, step 9 by %g: the schedule "
              "does not end on step 10", step10, step9);
    for (int i = 0; i < 3; i++) free(p[i]);
}

/* memory.accumulate 2 of batches of 8: 4 steps an epoch, 1.4 epochs 6 steps
 * (5.6), the second epoch 4 micro-batches; 10 steps an epoch (160 images),
 * 0.7 of it 7 steps, not 8. */
static void check_step_counts(void) {
    TrainSummary s;
    float *p = run("run.eval=off run.epochs=1.4 memory.accumulate=2 train.batch=8", &s);
    CHECK_MSG(s.steps == 6 && s.epochs == 1.4, "1.4 epochs of 4 steps of 2 micro-batches: %ld steps, epochs %g",
              s.steps, s.epochs);
    free(p);
    free(run_steps("run.eval=off run.epochs=0.7 data.synthetic_train=160", 7));
}

/* Checkpoints at steps 3, 6 and 9 (inside epoch 3) and 10 (its end, 2 of its
 * 4 steps): a run resumed from 9 or 10 ends with the uninterrupted run's bits. */
static void check_resume(const char *dir) {
    char sets[1024], ckpt[900];
    TrainSummary s;
    snprintf(sets, sizeof sets, "run.eval=off run.epochs=2.5 run.checkpoint_every=3 run.keep_checkpoints=0 "
             "run.checkpoint_dir=%s/ckpt", dir);
    float *whole = run(sets, &s);
    snprintf(sets, sizeof sets, "run.eval=off run.epochs=2.5 run.checkpoint_every=10 run.checkpoint_dir=%s/end", dir);
    free(run_steps(sets, 10));
    const char *from[] = {"ckpt/ckpt-00000009.trc", "end/ckpt-00000010.trc"};
    for (int i = 0; i < 2; i++) {
        snprintf(ckpt, sizeof ckpt, "%s/%s", dir, from[i]);
        snprintf(sets, sizeof sets, "run.eval=on run.epochs=2.5 run.resume=%s run.checkpoint_dir=%s/resumed%d", ckpt,
                 dir, i);
        float *resumed = run(sets, &s);
        CHECK_MSG(s.steps == 10 && s.epochs == 2.5 && s.test_acc >= 0, "resumed from %s: %ld steps, epochs %g",
                  from[i], s.steps, s.epochs);
        CHECK_MSG(max_diff(resumed, whole) == 0, "resumed from %s: %g from the uninterrupted run", from[i],
                  max_diff(resumed, whole));
        free(resumed);
    }
    free(whole);
}

static void count_params(void *user, Model *m) {
    (void)user;
    n_params = m->n_params;
}

int main(void) {
    const char *dir = test_tmpdir("train-fraction");
    TrainSummary s;
    Config *c = config_of("run.eval=off run.epochs=1 run.max_steps=1");
    train_run_observed(c, &s, &(TrainObserver){.opened = count_params});
    config_free(c);
    CHECK(n_params > 0);
    check_partial_epoch(dir);
    check_schedule_end();
    check_step_counts();
    check_resume(dir);
    return test_finish("test_train_fraction");
}
