/* Data-parallel training, 2 MPI ranks on the CPU (CI) or one GPU each: after
 * a few steps both ranks hold the same weights, and they are the weights of
 * one process training on the global batch, within fp32 rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "models/model.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tools/keys.h"
#include "tools/train.h"

enum { PER_RANK_BATCH = 8, STEPS = 4 };

static Config *small_run(const char *device, int batch) {
    char err[256], line[64];
    Config *c = config_new(trainc_keys, trainc_n_keys);
    const char *lines[] = {"data.source=synthetic", "data.image_size=32", "data.synthetic_train=256",
                           "data.synthetic_test=64", "data.flip=on", "data.crop_pad=2", "run.epochs=1",
                           "run.warmup_steps=0", "optim.lr=0.05", "optim.weight_decay=5e-4",
                           "train.sync_after_step=off", "train.read_loss_every=0", "perf.deterministic=on",
                           "dist.bucket_mb=1"};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) CHECK(config_set(c, lines[i], err, sizeof err) == 0);
    snprintf(line, sizeof line, "run.device=%s", device);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    snprintf(line, sizeof line, "train.batch=%d", batch);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    snprintf(line, sizeof line, "run.max_steps=%d", STEPS);
    CHECK(config_set(c, line, err, sizeof err) == 0);
    return c;
}

static size_t simplenet32_params(void) {
    Model m;
    char err[256];
    CHECK(model_build(&m, "simplenet", 1, 32, 10, 0, err, sizeof err) == 0);
    return m.n_params; /* counted while building; nothing allocated yet */
}

static void check_device(Dist *d, const char *device, const char *extra, double tol) {
    char err[256];
    TrainSummary dist_summary, solo_summary;
    float *dist_params, *solo_params, *rank0_params;
    Config *c = small_run(device, PER_RANK_BATCH);
    if (extra) CHECK(config_set(c, extra, err, sizeof err) == 0);
    train_run_dist(c, &dist_summary, &dist_params, d);
    config_free(c);
    size_t n_params = simplenet32_params();
    rank0_params = malloc(n_params * sizeof(float));
    memcpy(rank0_params, dist_params, n_params * sizeof(float));
    dist_bcast_host(d, rank0_params, n_params * sizeof(float), 0);
    CHECK_MSG(memcmp(rank0_params, dist_params, n_params * sizeof(float)) == 0,
              "%s %s: rank %d's weights differ from rank 0's", device, extra ? extra : "", d->rank);
    CHECK(dist_summary.world == d->world && dist_summary.steps == STEPS);

    /* One process, the global batch: the same shuffle, cut the same way. */
    c = small_run(device, PER_RANK_BATCH * d->world);
    if (extra) CHECK(config_set(c, extra, err, sizeof err) == 0);
    train_run_keep_params(c, &solo_summary, &solo_params);
    config_free(c);
    double rel = test_rel_error(dist_params, solo_params, n_params);
    CHECK_MSG(rel <= tol, "%s %s: %d ranks against one process on the global batch: relative error %.3g", device,
              extra ? extra : "", d->world, rel);
    printf("rank %d, %s %s: weights equal on all ranks; against one process on the global batch %.3g relative\n",
           d->rank, device, extra ? extra : "", rel);
    free(dist_params);
    free(solo_params);
    free(rank0_params);
}

int main(void) {
    Dist d;
    dist_init(&d);
    if (d.world < 2) {
        printf("needs 2 MPI ranks (ctest runs it under mpirun)\n");
        return 77;
    }
    check_device(&d, "cpu", NULL, 1e-5);
    /* The GPU part needs a GPU per rank on every host. */
    int enough = gpu_count() >= d.local_world;
    double all = enough;
    dist_allreduce_sum_host_double(&d, &all, 1);
    if (all == d.world) {
        check_device(&d, "cuda", NULL, 1e-5);
        check_device(&d, "cuda", "perf.cuda_graph=on", 1e-5);
        check_device(&d, "cuda", "precision.amp=fp16", 2e-3);
    } else if (d.rank == 0) {
        printf("fewer GPUs than ranks: GPU checks skipped\n");
    }
    int rc = test_finish("test_ddp_train");
    dist_finalize(&d);
    return rc;
}
