/* data.on_device: the training set uploaded once, each batch gathered by the
 * epoch's permutation and augmented on the device (on the CPU by the kernel's
 * reference). The same seed trains the same parameters, bit for bit, as the
 * loader's batches do: on the CPU against the float loader, on a GPU (when
 * there is one) against data.transform_on = gpu, eagerly and as a CUDA graph.
 * With alternating flip, reflect-padded crop and cutout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

/* 256 synthetic images of 32x32 in batches of 16: 16 steps an epoch. */
static const char *base_sets[] = {"data.source=synthetic", "data.image_size=32", "data.synthetic_train=256",
                                  "data.synthetic_test=64", "train.batch=16", "run.eval=off", "run.log_every=1000",
                                  "run.warmup_steps=0", "run.epochs=2", "data.flip=alternate", "data.crop_pad=2",
                                  "data.pad_mode=reflect", "data.cutout=6", "optim.lr=0.05",
                                  "optim.weight_decay=0.001"};
enum { N_BASE = sizeof base_sets / sizeof *base_sets };

/* The summary of a run of the base settings with 'extra' applied after them. */
static TrainSummary run(const char *device, const char **extra, int n_extra) {
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    for (int i = 0; i < N_BASE; i++) test_config_set(c, "%s", base_sets[i]);
    test_config_set(c, "run.device=%s", device);
    test_config_set(c, "run.seed=%llu", (unsigned long long)(test_seed() % 1000003));
    for (int i = 0; i < n_extra; i++) test_config_set(c, "%s", extra[i]);
    TrainSummary s;
    train_run(c, &s);
    config_free(c);
    return s;
}

static void check_cpu(void) {
    const char *loader[] = {"data.workers=2"};
    const char *on_device[] = {"data.on_device=on"};
    TrainSummary a = run("cpu", loader, 1), b = run("cpu", on_device, 1);
    CHECK(a.steps == 32 && b.steps == 32);
    CHECK_MSG(a.params_crc == b.params_crc, "CPU: loader %08x, data.on_device %08x", a.params_crc, b.params_crc);
    /* A different seed's permutation and augmentation train something else. */
    const char *other_seed[] = {"data.on_device=on", "run.seed=987654321"};
    TrainSummary c = run("cpu", other_seed, 2);
    CHECK(c.params_crc != b.params_crc);
}

static void check_gpu(void) {
    const char *raw[] = {"data.transform_on=gpu", "data.workers=2"};
    const char *on_device[] = {"data.on_device=on"};
    const char *graph[] = {"data.on_device=on", "perf.cuda_graph=on", "train.sync_after_step=off",
                           "train.read_loss_every=0"};
    TrainSummary a = run("cuda", raw, 2), b = run("cuda", on_device, 1), c = run("cuda", graph, 4);
    CHECK_MSG(a.params_crc == b.params_crc, "GPU: transform_on=gpu %08x, data.on_device %08x", a.params_crc,
              b.params_crc);
    CHECK_MSG(b.params_crc == c.params_crc, "GPU: eager %08x, CUDA graph %08x", b.params_crc, c.params_crc);
    /* airbench's whitening freezes after the first epoch: the graph captured with it frozen takes over. */
    const char *air[] = {"data.on_device=on", "model.name=airbench", "model.whiten_bias_epochs=1"};
    const char *air_graph[] = {"data.on_device=on", "model.name=airbench", "model.whiten_bias_epochs=1",
                               "perf.cuda_graph=on", "train.sync_after_step=off", "train.read_loss_every=0"};
    TrainSummary d = run("cuda", air, 3), e = run("cuda", air_graph, 6);
    CHECK_MSG(d.params_crc == e.params_crc, "GPU airbench: eager %08x, CUDA graph %08x", d.params_crc, e.params_crc);
}

int main(void) {
    check_cpu();
    if (test_have_gpu()) check_gpu();
    else printf("GPU part skipped: no GPU visible (or built without CUDA)\n");
    return test_finish("test_train_on_device");
}
