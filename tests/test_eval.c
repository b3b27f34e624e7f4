/* trainc eval against the training run's own evaluation.
 *   - CPU: a tiny synthetic run (one epoch, a checkpoint after its last step)
 *     and eval_run of that checkpoint: top-1 equals the run's test_acc
 *     exactly (same weights, batches and arithmetic); the confusion matrix
 *     sums to n and its diagonal is the top-1 count; top-5 >= top-1; the loss
 *     is finite. With 4 classes there is no top-5, in the text or the JSON.
 *   - the trainc binary: the report, the CSV (a row per class whose counts
 *     match the text) and the JSON line; a missing or corrupt checkpoint, a
 *     config contradicting it and no test split each fail with one message
 *     (tests/test_checkpoint_net.c: eval from the checkpoint alone).
 *   - 2 CPU ranks under mpirun (ctest's TRAINC_MPIEXEC): the same CSV and
 *     top-1 as one process (noted and left out without MPI).
 *   - GPU: the first part on cuda (noted and left out without a GPU). */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "tests/harness.h"
#include "tools/trainer/eval.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

enum { TRAIN = 64, TEST = 10, BATCH = 4 }; /* 10 test images: the last batch is partial */

static char output[1 << 16];

/* The tiny run's keys as "k=v" (sets[0..n)), for a Config and for --set. */
static int tiny_sets(char sets[][256], const char *device, int classes, const char *ckdir) {
    static const char *fixed[] = {"data.source=synthetic", "data.image_size=16", "train.batch=4",
                                  "model.name=simplenet", "run.log_every=1000", "run.epochs=1",
                                  "data.synthetic_train=64", "data.synthetic_test=10",
                                  "run.checkpoint_every=16"}; /* 64 / 4: after the last step */
    int n = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) snprintf(sets[n++], 256, "%s", fixed[i]);
    snprintf(sets[n++], 256, "run.device=%s", device);
    snprintf(sets[n++], 256, "model.num_classes=%d", classes);
    snprintf(sets[n++], 256, "run.checkpoint_dir=%s", ckdir);
    snprintf(sets[n++], 256, "run.seed=%llu", (unsigned long long)(test_seed() % 1000));
    return n;
}

static Config *tiny_config(const char *device, int classes, const char *ckdir) {
    char sets[16][256], err[512];
    int n = tiny_sets(sets, device, classes, ckdir);
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    for (int i = 0; i < n; i++) CHECK_MSG(config_set(c, sets[i], err, sizeof err) == 0, "%s", err);
    return c;
}

/* " --set k=v" for each of the tiny run's keys. */
static void tiny_args(char *out, size_t cap, const char *device, int classes, const char *ckdir) {
    char sets[16][256];
    int n = tiny_sets(sets, device, classes, ckdir);
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) len += snprintf(out + len, cap - len, " --set '%s'", sets[i]);
}

static void check_counts(const char *what, const EvalReport *r) {
    long cells = 0, diagonal = 0;
    for (int c = 0; c < r->classes; c++)
        for (int j = 0; j < r->classes; j++) {
            cells += r->confusion[(size_t)c * r->classes + j];
            if (c == j) diagonal += r->confusion[(size_t)c * r->classes + j];
        }
    CHECK_MSG(r->n == TEST && cells == r->n, "%s: n %ld, confusion matrix sum %ld, want %d", what, r->n, cells, TEST);
    CHECK_MSG(diagonal == r->top1, "%s: diagonal %ld, top-1 count %ld", what, diagonal, r->top1);
    CHECK_MSG(r->top5 >= r->top1 && r->top5 <= r->n, "%s: top-5 %ld, top-1 %ld of %ld", what, r->top5, r->top1, r->n);
    CHECK_MSG(r->classes > 5 || r->top5 == r->n, "%s: %d classes, top-5 %ld of %ld", what, r->classes, r->top5, r->n);
    double loss = r->loss_sum / (double)r->n;
    CHECK_MSG(isfinite(loss) && loss > 0, "%s: loss %g", what, loss);
}

/* Trains the tiny run, then evaluates its last checkpoint; returns the checkpoint's path (static). */
static const char *train_and_eval(const char *device, int classes, EvalReport *r) {
    static char checkpoint[4200];
    char what[64];
    snprintf(what, sizeof what, "%s, %d classes", device, classes);
    const char *ckdir = test_tmpdir(strcmp(device, "cpu") == 0 ? "eval-cpu" : "eval-gpu");
    Config *c = tiny_config(device, classes, ckdir);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
    snprintf(checkpoint, sizeof checkpoint, "%s", s.checkpoint);
    CHECK_MSG(s.steps == TRAIN / BATCH && checkpoint[0], "%s: %ld steps, checkpoint '%s'", what, s.steps, checkpoint);
    Dist solo;
    dist_init_solo(&solo);
    c = tiny_config(device, classes, ckdir);
    eval_run(c, &solo, checkpoint, r);
    config_free(c);
    printf("%s: the run's test_acc %.9g, eval's top-1 %.9g (%ld of %ld), top-5 %ld, loss %.6f\n", what, s.test_acc,
           eval_top1(r), r->top1, r->n, r->top5, r->loss_sum / (double)r->n);
    CHECK_MSG(eval_top1(r) == s.test_acc, "%s: eval's top-1 %.9g, the run's own evaluation %.9g", what, eval_top1(r),
              s.test_acc);
    check_counts(what, r);
    return checkpoint;
}

/* The printed report has a top-5 line exactly with more than 5 classes. */
static void check_text(const EvalReport *r) {
    const char *path = test_write_file(test_tmpdir("eval-text"), "report.txt", "", 0);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    eval_print(r, f);
    eval_print_json(r, f);
    fclose(f);
    char *text = test_read_file(path);
    CHECK(text && strstr(text, "top-1 accuracy") && strstr(text, "confusion matrix (rows: true class"));
    CHECK_MSG(text && (strstr(text, "top-5 accuracy") != NULL) == (r->classes > 5), "%d classes:\n%s", r->classes,
              text ? text : "");
    CHECK_MSG(text && (strstr(text, "\"top5\": null") != NULL) == (r->classes <= 5), "%d classes:\n%s", r->classes,
              text ? text : "");
    free(text);
}

static double json_number(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* trainc eval under launcher ("" for one process) with --csv; the CSV's text (malloc'ed), NULL when it failed. */
static char *eval_binary(const char *what, const char *launcher, const char *checkpoint, const char *csv,
                         const EvalReport *r) {
    char cmd[8192], args[4096];
    tiny_args(args, sizeof args, "cpu", r->classes, test_tmpdir("eval-cli"));
    snprintf(cmd, sizeof cmd, "%s'%s/trainc' eval --checkpoint '%s' --config configs/cpu.ini%s --csv '%s' --quiet",
             launcher, test_build_dir(), checkpoint, args, csv);
    int rc = test_run_command(cmd, output, sizeof output);
    CHECK_MSG(rc == 0, "%s: %s: exit status %d:\n%s", what, cmd, rc, output);
    if (rc != 0) return NULL;
    CHECK_MSG(strstr(output, "top-1 accuracy") && strstr(output, "per-class accuracy"), "%s:\n%s", what, output);
    cJSON *o = test_last_json(output);
    CHECK_MSG(o != NULL, "%s: no JSON line:\n%s", what, output);
    CHECK_MSG(json_number(o, "top1") == json_number(o, "top1") && fabs(json_number(o, "top1") - eval_top1(r)) < 1e-6,
              "%s: JSON top1 %g, eval_run's %g", what, json_number(o, "top1"), eval_top1(r));
    CHECK_MSG(json_number(o, "n") == TEST, "%s: JSON n %g", what, json_number(o, "n"));
    CHECK_MSG(fabs(json_number(o, "loss") - r->loss_sum / r->n) < 1e-5 * (1 + r->loss_sum / r->n),
              "%s: JSON loss %g, eval_run's %g", what, json_number(o, "loss"), r->loss_sum / r->n);
    cJSON_Delete(o);
    return test_read_file(csv);
}

/* The CSV: a header and a row per class, its counts those of the report. */
static void check_csv(const char *csv, const EvalReport *r) {
    int rows = 0;
    const char *line = strchr(csv, '\n');
    for (; line && line[1]; line = strchr(line + 1, '\n'), rows++) {
        int cls;
        long images, correct;
        CHECK_MSG(sscanf(line + 1, "%d,%ld,%ld,", &cls, &images, &correct) == 3 && cls == rows &&
                      correct == r->confusion[(size_t)cls * r->classes + cls],
                  "CSV row %d: %.80s", rows, line + 1);
    }
    CHECK_MSG(rows == r->classes && strncmp(csv, "class,images,correct,accuracy,predicted_0", 41) == 0,
              "CSV: %d rows for %d classes:\n%s", rows, r->classes, csv);
}

/* One trainc eval (the tiny run's keys, then extra's) that must fail with a message holding each of want
 * (NULL-ended). */
static void check_fails(const char *what, const char *extra, const char *checkpoint, const char *const *want) {
    char cmd[8192], args[4096];
    tiny_args(args, sizeof args, "cpu", 10, test_tmpdir("eval-cli"));
    snprintf(cmd, sizeof cmd, "'%s/trainc' eval --checkpoint '%s'%s %s", test_build_dir(), checkpoint, args, extra);
    int rc = test_run_command(cmd, output, sizeof output);
    CHECK_MSG(rc != 0, "%s: exit status 0:\n%s", what, output);
    for (; *want; want++) CHECK_MSG(strstr(output, *want), "%s: no '%s' in:\n%s", what, *want, output);
    printf("%s: exit status %d: %s", what, rc, output);
}

/* CIFAR-10 binary files with 2 images each, training batches only. */
static const char *cifar_without_test(void) {
    const char *dir = test_tmpdir("eval-no-test");
    unsigned char records[2 * 3073] = {0};
    records[3073] = 1;
    for (int i = 1; i <= 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "data_batch_%d.bin", i);
        test_write_file(dir, name, records, sizeof records);
    }
    return dir;
}

static void check_bad_input(const char *checkpoint) {
    const char *dir = test_tmpdir("eval-bad");
    char *whole = test_read_file(checkpoint), missing[700], extra[1024];
    CHECK(whole != NULL);
    if (!whole) return;
    const char *corrupt = test_write_file(dir, "corrupt.trc", whole, 1000);
    char corrupt_path[700];
    snprintf(corrupt_path, sizeof corrupt_path, "%s", corrupt);
    free(whole);
    snprintf(missing, sizeof missing, "%s/missing.trc", dir);
    check_fails("missing checkpoint", "--config configs/cpu.ini", missing, (const char *[]){"missing.trc", NULL});
    check_fails("corrupt checkpoint", "--config configs/cpu.ini", corrupt_path,
                (const char *[]){"corrupt.trc", "truncated", NULL});
    check_fails("another class count", "--config configs/cpu.ini --set model.num_classes=12", checkpoint,
                (const char *[]){checkpoint, "--set: model.num_classes = 12", "model.num_classes = 10", NULL});
    snprintf(extra, sizeof extra, "--config configs/cpu.ini --set data.source=cifar_bin --set data.path=%s",
             cifar_without_test());
    check_fails("no test split", extra, checkpoint, (const char *[]){"test_batch.bin", NULL});
}

static void check_cpu(void) {
    EvalReport few;
    train_and_eval("cpu", 4, &few);
    check_text(&few);
    eval_report_free(&few);

    EvalReport r;
    const char *checkpoint = train_and_eval("cpu", 10, &r);
    check_text(&r);
    char csv_path[700];
    snprintf(csv_path, sizeof csv_path, "%s/one.csv", test_tmpdir("eval-csv"));
    char *one = eval_binary("trainc eval", "", checkpoint, csv_path, &r);
    if (one) check_csv(one, &r);
    check_bad_input(checkpoint);

    const char *launcher = test_mpirun_prefix(2);
    if (!launcher) {
        printf("note: 2 CPU ranks left out: no mpirun (built without MPI, or not run by ctest)\n");
    } else if (one) {
        snprintf(csv_path, sizeof csv_path, "%s/two.csv", test_tmpdir("eval-csv"));
        char *two = eval_binary("trainc eval, 2 CPU ranks", launcher, checkpoint, csv_path, &r);
        CHECK_MSG(two && strcmp(one, two) == 0, "2 ranks' CSV differs from one process's:\n%s\n---\n%s", one,
                  two ? two : "(none)");
        if (two) printf("2 CPU ranks: the same CSV as one process\n");
        free(two);
    }
    free(one);
    eval_report_free(&r);
}

int main(void) {
    check_cpu();
    if (test_have_gpu()) {
        EvalReport r;
        train_and_eval("cuda", 10, &r);
        eval_report_free(&r);
    } else {
        printf("note: the GPU part left out: no GPU\n");
    }
    return test_finish("test_eval");
}
