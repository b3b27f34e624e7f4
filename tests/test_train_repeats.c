/* run.repeats on the CPU: run r of a repeated run is the single run of seed
 * run.seed + r on the same data (a CIFAR-10 binary copy of synthetic images
 * written here, as the synthetic source draws its images from run.seed), bit for bit (its weights, order and augmentation drawn anew;
 * momentum, batch-norm statistics, learning-rate step and loss scaler reset),
 * and the summary's accuracy is the mean of the runs', with their sample
 * standard deviation and minimum; training times are positive. Through the
 * loader's worker threads, through data.on_device, and with airbench's net,
 * whitening and lookahead. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

static const char *base_sets[] = {"run.device=cpu", "data.source=cifar_bin", "data.image_size=32", "train.batch=16",
                                  "run.log_every=1000", "run.warmup_steps=0", "run.epochs=2", "data.flip=alternate",
                                  "data.crop_pad=2", "optim.lr=0.05", "optim.momentum=0.9",
                                  "optim.schedule=linear", "optim.warmup_epochs=0.5"};
enum { N_BASE = sizeof base_sets / sizeof *base_sets };

static char data_dir[1024];

/* Synthetic images as the CIFAR-10 binary batches: 5 x 52 training, 64 test. */
static void write_cifar_copy(void) {
    Dataset d;
    synthetic_make(&d, 5 * 52 + 64, 3, 32, 32, 10, 12345);
    snprintf(data_dir, sizeof data_dir, "%s", test_tmpdir("train-repeats"));
    for (int file = 0; file < 6; file++) {
        char path[1200];
        if (file < 5) snprintf(path, sizeof path, "%s/data_batch_%d.bin", data_dir, file + 1);
        else snprintf(path, sizeof path, "%s/test_batch.bin", data_dir);
        FILE *f = fopen(path, "wb");
        CHECK_MSG(f != NULL, "cannot write %s", path);
        int first = file * 52, count = file < 5 ? 52 : 64;
        for (int i = first; f && i < first + count; i++) {
            unsigned char label = (unsigned char)d.labels[i];
            fwrite(&label, 1, 1, f);
            fwrite(dataset_image(&d, i), 1, dataset_image_bytes(&d), f);
        }
        if (f) fclose(f);
    }
    dataset_free(&d);
}

static TrainSummary run(const char *data, unsigned long long seed, int repeats) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    for (int i = 0; i < N_BASE; i++) test_config_set(c, "%s", base_sets[i]);
    test_config_set(c, "data.path=%s", data_dir);
    char sets[512];
    snprintf(sets, sizeof sets, "%s", data);
    for (char *save = NULL, *set = strtok_r(sets, " ", &save); set; set = strtok_r(NULL, " ", &save))
        test_config_set(c, "%s", set);
    test_config_set(c, "run.seed=%llu", seed);
    test_config_set(c, "run.repeats=%d", repeats);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
    return s;
}

/* 'data': more key=value sets, space-separated; 'steps': the optimizer steps of one run. */
static void check(const char *data, int steps) {
    unsigned long long seed = test_seed() % 1000003;
    TrainSummary first = run(data, seed, 1), second = run(data, seed + 1, 1), both = run(data, seed, 2);
    CHECK(first.runs == 1 && both.runs == 2 && both.steps == steps);
    CHECK_MSG(both.params_crc == second.params_crc, "%s: the second of 2 runs %08x, the single run of its seed %08x",
              data, both.params_crc, second.params_crc);
    CHECK(first.params_crc != second.params_crc);
    double mean = (first.test_acc + second.test_acc) / 2, std = fabs(first.test_acc - second.test_acc) / sqrt(2.0);
    CHECK_MSG(fabs(both.test_acc - mean) < 1e-12, "%s: mean accuracy %g, the runs' %g and %g", data, both.test_acc,
              first.test_acc, second.test_acc);
    CHECK(fabs(both.test_acc_std - std) < 1e-12 && both.test_acc_min == fmin(first.test_acc, second.test_acc));
    CHECK(first.test_acc_std == 0 && first.test_acc_min == first.test_acc);
    CHECK(both.train_s > 0 && both.train_s_min > 0 && both.train_s_min <= both.train_s && both.train_s_std >= 0);
    CHECK(first.eval_s > 0 && both.eval_s > 0 && both.eval_s < both.train_s * 100);
    printf("%s: accuracies %.4f and %.4f, mean %.4f std %.4f; train_s %.3f (min %.3f)\n", data, first.test_acc,
           second.test_acc, both.test_acc, both.test_acc_std, both.train_s, both.train_s_min);
}

/* run.warmup_runs: the counted runs are those without it, bit for bit. */
static void check_warmup(const char *data) {
    unsigned long long seed = test_seed() % 1000003;
    char warmed[512];
    snprintf(warmed, sizeof warmed, "%s run.warmup_runs=1", data);
    TrainSummary plain = run(data, seed, 1), after = run(warmed, seed, 1);
    CHECK_MSG(after.params_crc == plain.params_crc && after.test_acc == plain.test_acc && after.runs == 1,
              "%s: after a warm-up run %08x (accuracy %g), without %08x (%g)", data, after.params_crc, after.test_acc,
              plain.params_crc, plain.test_acc);
}

/* SimpleNet at 16 pixels: 260 images, 16 full batches an epoch, 2 epochs.
 * airbench at its 32 pixels on the first 128 images: 8 batches, 1 epoch. */
int main(void) {
    write_cifar_copy();
    check("data.image_size=16 data.workers=2", 32);
    check("data.image_size=16 data.on_device=on", 32);
    /* airbench's recipe: each run whitens from its own seed's images, trains
     * the whitening bias for its first epoch again and starts lookahead anew. */
    check("data.on_device=on data.train_limit=128 model.name=airbench model.whiten_bias_epochs=0.5 "
          "model.bn_weight=fixed optim.bn_bias_lr_scale=4 optim.lookahead_every=3 run.epochs=1 "
          "optim.warmup_epochs=0.25", 8);
    /* The Muon variant: its momentum starts anew and its filters leave SGD again in every run. */
    check("data.on_device=on data.train_limit=128 model.name=airbench model.whiten_bias_epochs=0.5 "
          "model.bn_weight=fixed optim.muon=on optim.head_lr_scale=0.25 run.epochs=1 optim.warmup_epochs=0", 8);
    check_warmup("data.on_device=on data.train_limit=128 model.name=airbench model.whiten_bias_epochs=0.5 "
                 "model.bn_weight=fixed optim.muon=on run.epochs=1");
    return test_finish("test_train_repeats");
}
