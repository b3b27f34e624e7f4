/* Data-parallel training, 2 MPI ranks on the CPU (CI) or one GPU each: after
 * a few steps every rank holds the same weights, and they are the weights of
 * one process training on the global batch, within fp32 rounding. For a net
 * with batch norm that holds with dist.sync_bn = on only: without it each
 * rank normalises with its own samples' statistics, and the weights differ.
 * A stop signal on one rank stops all at the same step. With the argument
 * 'gpu' (test_ddp_train_4: 4 ranks) only the GPU part runs, and the test skips
 * where a host has fewer GPUs than ranks. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist/dist.h"
#include "dist/peer_link.h"
#include "models/model.h"
#include "models/plan.h"
#include "models/zoo.h"
#include "runtime/checkpoint.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/train.h"

typedef struct {
    const char *name, *lr;
    int batch, steps; /* batch: per rank */
} Net;

static const Net simplenet = {"simplenet", "0.05", 8, 4};
/* Small enough for CI's two cores: 3 steps of 4 images a rank. A small
 * learning rate, and no zero-padded crops (see check_sync_bn). */
static const Net resnet18 = {"resnet18", "0.001", 4, 3};

static void set(Config *c, const char *line) {
    char err[256];
    CHECK_MSG(config_set(c, line, err, sizeof err) == 0, "%s: %s", line, err);
}

/* extra: settings NULL-terminated, each key=value. */
static Config *small_run(const char *device, const Net *net, int batch, const char *const *extra) {
    char line[64];
    Config *c = config_new(trainc_keys, trainc_n_keys);
    test_config_set(c, "run.save_final=off"); /* no model left behind where the test runs */
    const char *lines[] = {"data.source=synthetic", "data.image_size=32", "data.synthetic_train=256",
                           "data.synthetic_test=64", "data.flip=on", "data.crop_pad=2", "run.epochs=1",
                           "run.warmup_steps=0", "optim.weight_decay=5e-4", "train.sync_after_step=off",
                           "train.read_loss_every=0", "perf.deterministic=on", "dist.bucket_mb=1",
                           "run.eval=off"};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) set(c, lines[i]);
    snprintf(line, sizeof line, "run.device=%s", device);
    set(c, line);
    snprintf(line, sizeof line, "model.name=%s", net->name);
    set(c, line);
    snprintf(line, sizeof line, "optim.lr=%s", net->lr);
    set(c, line);
    snprintf(line, sizeof line, "train.batch=%d", batch);
    set(c, line);
    snprintf(line, sizeof line, "run.max_steps=%d", net->steps);
    set(c, line);
    for (; extra && *extra; extra++) set(c, *extra);
    return c;
}

static size_t params_of(const Net *net) {
    Model m;
    char err[256];
    CHECK(model_build(&m, net->name, 1, 32, 10, 0, err, sizeof err) == 0);
    return m.n_params; /* counted while building; nothing allocated yet */
}

/* The weights after training on every rank of d, each with its shard; solo:
 * this process alone, on the global batch (the same shuffle, cut the same way). */
static float *train(Dist *d, int solo, const char *device, const Net *net, const char *const *extra) {
    TrainSummary summary;
    float *params;
    Config *c = small_run(device, net, solo ? net->batch * d->world : net->batch, extra);
    if (solo) {
        train_run_keep_params(c, &summary, &params);
    } else {
        train_run_dist(c, &summary, &params, d);
        CHECK(summary.world == d->world && summary.steps == net->steps);
    }
    config_free(c);
    return params;
}

static void check_same_on_ranks(Dist *d, const float *params, size_t n, const char *what) {
    float *rank0 = malloc(n * sizeof(float));
    memcpy(rank0, params, n * sizeof(float));
    dist_bcast_host(d, rank0, n * sizeof(float), 0);
    CHECK_MSG(memcmp(rank0, params, n * sizeof(float)) == 0, "%s: rank %d's weights differ from rank 0's", what,
              d->rank);
    free(rank0);
}

static void check_device(Dist *d, const char *device, const char *const *extras, double tol) {
    char what[128];
    int len = snprintf(what, sizeof what, "%s", device);
    for (int i = 0; extras[i] && len < (int)sizeof what; i++)
        len += snprintf(what + len, sizeof what - len, " %s", extras[i]);
    size_t n = params_of(&simplenet);
    float *dist_params = train(d, 0, device, &simplenet, extras);
    check_same_on_ranks(d, dist_params, n, what);
    float *solo_params = train(d, 1, device, &simplenet, extras);
    double rel = test_rel_error(dist_params, solo_params, n);
    CHECK_MSG(rel <= tol, "%s: %d ranks against one process on the global batch: relative error %.3g", what,
              d->world, rel);
    printf("rank %d, %s: weights equal on all ranks; against one process on the global batch %.3g relative\n",
           d->rank, what, rel);
    free(dist_params);
    free(solo_params);
}

/* ResNet-18 with dist.sync_bn = on (and 'extra', if any) on every rank against
 * one process on the global batch: within tol. Off: more than 10 x tol apart.
 * This net at these sizes amplifies rounding now and then: with lr 0.01, or
 * with data.crop_pad = 2, two single-process runs whose learning rates differ
 * by 1e-6 (relative) end 1e-6 to 2e-4 apart after 3 steps, the same pattern
 * as any other tiny difference. At lr 0.001 without padded crops, on the CPU,
 * synchronized: 6e-9 with OpenBLAS's SkylakeX, Nehalem, Core2 and Barcelona
 * kernels, 1.4e-7 with Prescott's, 4.6e-6 to 6e-6 with Haswell's, Sandybridge's,
 * Zen's and Atom's (the sums' order differs, and a ReLU input within rounding
 * of 0 now and then lands on the other side); per rank: 1.36e-3 with each. */
static void check_sync_bn(Dist *d, const char *device, const char *extra, double tol) {
    const char *on[] = {"data.crop_pad=0", "dist.sync_bn=on", extra, NULL};
    const char *off[] = {"data.crop_pad=0", "dist.sync_bn=off", extra, NULL};
    char what[128];
    snprintf(what, sizeof what, "%s resnet18 dist.sync_bn=on %s", device, extra ? extra : "");
    size_t n = params_of(&resnet18);
    float *synced = train(d, 0, device, &resnet18, on);
    check_same_on_ranks(d, synced, n, what);
    float *apart = train(d, 0, device, &resnet18, off);
    float *solo = train(d, 1, device, &resnet18, on); /* one process: sync_bn changes nothing */
    double rel_on = test_rel_error(synced, solo, n), rel_off = test_rel_error(apart, solo, n);
    CHECK_MSG(rel_on <= tol, "%s: %d ranks against one process on the global batch: relative error %.3g", what,
              d->world, rel_on);
    CHECK_MSG(rel_off > 10 * tol, "%s: per-rank batch norm is within %.3g of one process: the check cannot fail",
              what, rel_off);
    printf("rank %d, %s: weights equal on all ranks; against one process on the global batch %.3g relative "
           "(per-rank batch norm: %.3g)\n", d->rank, what, rel_on, rel_off);
    free(synced);
    free(apart);
    free(solo);
}

/* dist.shard_optimizer: each rank holds the master weights and the
 * optimizer's state (momentum; Adam's two moments) of its parts only; a
 * checkpoint must gather the others'. A run resumed from
 * step 2's checkpoint ends on the weights of the run that went straight on,
 * bit for bit; with a stale half of the master weights or momentum in the
 * checkpoint it would end elsewhere. */
static void check_sharded_resume(Dist *d, const char *optimizer) {
    char dir[512], tag[64], name[64];
    snprintf(tag, sizeof tag, "ddp_shard_resume_%s", optimizer);
    snprintf(dir, sizeof dir, "%s", test_tmpdir(tag));
    dist_bcast_host(d, dir, sizeof dir, 0); /* rank 0 writes, every rank reads */
    char ckpt_dir[600], resume[700];
    snprintf(ckpt_dir, sizeof ckpt_dir, "run.checkpoint_dir=%s", dir);
    snprintf(resume, sizeof resume, "run.resume=%s/ckpt-%08d.trc", dir, 2);
    snprintf(name, sizeof name, "optim.name=%s", optimizer);
    /* Adam's moments are sharded too (and its lr is its own) */
    const char *lr = strcmp(optimizer, "sgd") == 0 ? "optim.lr=0.05" : "optim.lr=0.001";
    const char *base[] = {"perf.cuda_graph=on", "precision.amp=fp16", "dist.shard_optimizer=on", "run.eval=off",
                          ckpt_dir, name, lr};
    const char *straight[] = {base[0], base[1], base[2], base[3], base[4], base[5], base[6], "run.checkpoint_every=2",
                              NULL};
    const char *resumed[] = {base[0], base[1], base[2], base[3], base[4], base[5], base[6], resume, NULL};
    size_t n = params_of(&simplenet);
    float *whole = train(d, 0, "cuda", &simplenet, straight);
    float *again = train(d, 0, "cuda", &simplenet, resumed);
    check_same_on_ranks(d, again, n, "sharded resume");
    CHECK_MSG(memcmp(whole, again, n * sizeof(float)) == 0,
              "rank %d: dist.shard_optimizer=on, %s resumed from step 2: relative error %.3g against the run that "
              "went on", d->rank, optimizer, test_rel_error(again, whole, n));
    printf("rank %d: sharded %s resumed from step 2's checkpoint: the same weights as the run that went on\n",
           d->rank, optimizer);
    free(whole);
    free(again);
}

/* A SIGTERM on rank 0 alone (from a thread, once training has logged its
 * first step into the metrics file) stops every rank at the same step. */
static const char *stop_metrics;

static void *term_after_first_step(void *arg) {
    (void)arg;
    struct stat st;
    for (int i = 0; i < 3000 && !(stat(stop_metrics, &st) == 0 && st.st_size > 0); i++) usleep(10 * 1000);
    raise(SIGTERM);
    return NULL;
}

static void check_stop_together(Dist *d) {
    const char *dir = test_tmpdir("ddp_stop");
    static char metrics[600], ckpt[600];
    snprintf(metrics, sizeof metrics, "run.metrics_file=%s/metrics.jsonl", dir);
    snprintf(ckpt, sizeof ckpt, "run.checkpoint_dir=%s/ckpt", dir);
    stop_metrics = metrics + strlen("run.metrics_file=");
    Net longer = simplenet;
    longer.steps = 100000; /* the signal ends it */
    const char *extra[] = {"run.epochs=1000", "run.log_every=1", metrics, ckpt, NULL};
    Config *c = small_run("cpu", &longer, longer.batch, extra);
    pthread_t thread;
    if (d->rank == 0) CHECK(pthread_create(&thread, NULL, term_after_first_step, NULL) == 0);
    TrainSummary s;
    train_run_dist(c, &s, NULL, d);
    if (d->rank == 0) pthread_join(thread, NULL);
    config_free(c);
    double steps = (double)s.steps, rank0 = steps;
    dist_bcast_host(d, &rank0, sizeof rank0, 0);
    CHECK_MSG(s.stopped && s.exit_status == 128 + SIGTERM, "rank %d: not stopped by the signal (exit %d)", d->rank,
              s.exit_status);
    CHECK_MSG(rank0 == steps && steps > 0, "rank %d stopped at step %ld, rank 0 at %.0f", d->rank, s.steps, rank0);
    if (d->rank == 0) CHECK_MSG(access(s.checkpoint, F_OK) == 0, "no checkpoint at %s", s.checkpoint);
    printf("rank %d: stopped with rank 0's SIGTERM at step %ld\n", d->rank, s.steps);
}

/* perf.conv_benchmark on several ranks: every timing behind a choice goes
 * through the policy's agree hook. Here the hook first scales each rank's
 * times by factors of its own, 0.5 to 2, as if each card's timings were
 * disturbed apart, then means them (dist_mean_timings): every rank must still
 * make the same choices (algorithms, backend plans, fused pairs, prologues,
 * the input's form), which timings taken apart and so disturbed would not. */
typedef struct {
    Dist *d;
    uint64_t rng;
} SkewedTimings;

static void skewed_mean(void *user, float *times, int n) {
    SkewedTimings *s = user;
    for (int i = 0; i < n; i++) times[i] *= test_uniform(&s->rng, 0.5f, 2.0f);
    dist_mean_timings(s->d, times, n);
}

/* What the timings chose, per layer; the agreed times of the chosen plans. */
static uint32_t choices_hash(const Model *m, int *plans) {
    uint32_t h = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const LayerPlan *lp = &m->plan->layers[i];
        int flags[] = {l->kind, lp->genstats != NULL, lp->stats_by_conv, lp->by_conv_prologue, lp->input_form != NULL};
        h = ckpt_crc32(h, flags, sizeof flags);
        if (lp->genstats) {
            const ConvGenStatsCuda *g = &lp->genstats->cuda;
            float times[] = {g->graph.plan_ms, g->direct_us};
            h = ckpt_crc32(h, times, sizeof times);
            h = ckpt_crc32(h, &g->direct, sizeof g->direct);
        }
        if (l->kind != LAYER_CONV) continue;
        const Conv2dCuda *c = &l->conv.cuda;
        int algos[] = {c->fwd_algo, c->bwd_data_algo, c->bwd_filter_algo};
        h = ckpt_crc32(h, algos, sizeof algos);
        h = ckpt_crc32(h, c->use_plan, sizeof c->use_plan);
        h = ckpt_crc32(h, c->legacy_us, sizeof c->legacy_us);
        h = ckpt_crc32(h, c->plan_us, sizeof c->plan_us);
        h = ckpt_crc32(h, c->use_direct, sizeof c->use_direct);
        h = ckpt_crc32(h, c->direct_us, sizeof c->direct_us);
        for (int p = 0; p < CONV2D_PASSES; p++) *plans += c->use_plan[p];
    }
    return h;
}

static void check_choices_agree(Dist *d) {
    GpuContext gpu;
    gpu_context_init(&gpu, d->local_rank);
    Model m;
    char err[256];
    CHECK(model_build(&m, "resnet18", 8, 32, 10, 1, err, sizeof err) == 0);
    m.act_dtype = DTYPE_F16;
    m.fuse = m.fuse_graphs = 1;
    m.conv_policy.workspace_limit = (size_t)256 << 20;
    m.conv_policy.benchmark = 1;
    SkewedTimings skew = {d, test_seed() * 7919 + (uint64_t)d->rank * 104729 + 1};
    m.conv_policy.agree = skewed_mean;
    m.conv_policy.agree_user = &skew;
    model_finalize(&m, &gpu, 11);
    int plans = 0, pairs = 0, prologues = 0;
    uint32_t mine = choices_hash(&m, &plans), rank0 = mine;
    for (int i = 0; i < m.n_layers; i++)
        pairs += m.plan->layers[i].genstats != NULL, prologues += m.plan->layers[i].prologue_bn >= 0;
    dist_bcast_host(d, &rank0, sizeof rank0, 0);
    CHECK_MSG(mine == rank0, "rank %d chose apart from rank 0 under disturbed timings (%d backend plans, %d fused "
              "pairs, %d prologues here)", d->rank, plans, pairs, prologues);
    printf("rank %d: the same choices as rank 0 under timings disturbed apart: %d backend plans, %d fused pairs, %d "
           "prologues\n", d->rank, plans, pairs, prologues);
    model_destroy(&m);
    gpu_context_destroy(&gpu);
}

/* The GPU part: a GPU per rank on every host. The copy engines and the
 * sharded optimizer where every rank is on this host. */
static void check_gpu(Dist *d) {
    check_choices_agree(d);
    check_device(d, "cuda", (const char *[]){NULL}, 1e-5);
    check_device(d, "cuda", (const char *[]){"perf.cuda_graph=on", NULL}, 1e-5);
    check_device(d, "cuda", (const char *[]){"perf.cuda_graph=on", "perf.graph_node_priority=on", NULL}, 1e-5);
    check_device(d, "cuda", (const char *[]){"precision.amp=fp16", NULL}, 2e-3);
    /* filter gradients beside backward: the buckets hear of them only at their joins */
    check_device(d, "cuda", (const char *[]){"perf.cuda_graph=on", "precision.amp=fp16", "perf.overlap_wgrad=on", NULL},
                 2e-3);
    /* dist.copy_engine is auto above (the copy engines where the GPUs of one host allow) */
    check_device(d, "cuda", (const char *[]){"perf.cuda_graph=on", "dist.copy_engine=off", NULL}, 1e-5);
    if (d->world == d->local_world && d->world <= PEER_LINK_MAX_RANKS) {
        check_device(d, "cuda",
                     (const char *[]){"perf.cuda_graph=on", "precision.amp=fp16", "dist.copy_engine=on",
                                      "dist.shard_optimizer=off", NULL},
                     2e-3);
        check_device(d, "cuda",
                     (const char *[]){"perf.cuda_graph=on", "precision.amp=fp16", "dist.shard_optimizer=on", NULL},
                     2e-3);
        check_device(d, "cuda", (const char *[]){"dist.shard_optimizer=on", "memory.accumulate=2", NULL}, 1e-5);
        check_device(d, "cuda",
                     (const char *[]){"perf.cuda_graph=on", "dist.shard_optimizer=on", "memory.accumulate=2", NULL},
                     1e-5);
        check_sharded_resume(d, "sgd");
        /* Adam: each rank its shard of both moments; every rank counts the steps */
        const char *adamw[] = {"optim.name=adamw", "optim.lr=0.001", "perf.cuda_graph=on", "precision.amp=fp16",
                               "dist.shard_optimizer=on", NULL};
        check_device(d, "cuda", adamw, 2e-3);
        check_device(d, "cuda", (const char *[]){"optim.name=adam", "optim.lr=0.001", "dist.shard_optimizer=on",
                                                 "memory.accumulate=2", NULL}, 5e-5);
        check_sharded_resume(d, "adamw");
    }
    check_sync_bn(d, "cuda", NULL, 5e-5);
    check_sync_bn(d, "cuda", "perf.cuda_graph=on", 5e-5);
    check_sync_bn(d, "cuda", "model.fuse=on", 5e-5);
    check_sync_bn(d, "cuda", "perf.overlap_wgrad=on", 5e-5);
}

int main(int argc, char **argv) {
    Dist d;
    dist_init(&d);
    if (d.world < 2) {
        dist_finalize(&d);
        test_skip("needs 2 MPI ranks (ctest runs it under mpirun)");
    }
    int gpu_only = argc > 1 && strcmp(argv[1], "gpu") == 0;
    /* 'quick' (test_slurm, ranks started by srun): the first check alone */
    if (argc > 1 && strcmp(argv[1], "quick") == 0) {
        check_device(&d, "cpu", (const char *[]){NULL}, 1e-5);
        int rc = test_finish("test_ddp_train");
        dist_finalize(&d);
        return rc;
    }
    /* The GPU part needs a GPU per rank on every host. */
    int gpus = gpu_count(), enough = !dist_any_host(&d, gpus < d.local_world);
    if (gpu_only && !enough) {
        dist_finalize(&d);
        if (d.rank == 0) test_skip("%d ranks on this host: fewer than %d GPUs (%d visible)", d.local_world,
                                   d.local_world, gpus);
        exit(77);
    }
    if (!gpu_only) {
        check_device(&d, "cpu", (const char *[]){NULL}, 1e-5);
        /* Adam's normalisation amplifies the sums' rounding where a gradient is near 0: 2.7e-6 */
        check_device(&d, "cpu", (const char *[]){"optim.name=adamw", "optim.lr=0.001", NULL}, 5e-5);
        check_stop_together(&d);
        check_sync_bn(&d, "cpu", NULL, 5e-5);
        /* a checkpointed block's recompute runs the synchronized forward again */
        check_sync_bn(&d, "cpu", "memory.checkpoint=blocks", 5e-5);
    }
    if (enough) check_gpu(&d);
    else if (d.rank == 0) printf("fewer GPUs than ranks: GPU checks skipped\n");
    int rc = test_finish("test_ddp_train");
    dist_finalize(&d);
    return rc;
}
