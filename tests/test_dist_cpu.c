/* The process group and the gradient buckets on the CPU path, as MPI ranks
 * (ctest starts 2 under mpirun): distinct ranks, the host collectives (a
 * gather of each rank's bytes among them), and
 * grad_buckets over a host buffer averaging each bucket once backward has
 * declared it final, the same on every rank. Started alone it is world 1,
 * where every collective must be a no-op.
 * "test_dist_cpu abort": the last rank fails while the others wait in a
 * barrier; every rank must exit (ctest checks the message and the time). */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/dist.h"
#include "dist/grad_buckets.h"
#include "runtime/check.h"
#include "tests/harness.h"

static Dist d;

static void test_ranks(void) {
    const char *launched = getenv("OMPI_COMM_WORLD_SIZE");
    if (launched) CHECK(d.world == atoi(launched));
    CHECK(d.rank >= 0 && d.rank < d.world);
    CHECK(d.local_rank >= 0 && d.local_rank < d.local_world && d.local_world <= d.world);
    /* Each rank adds a bit of its own: all bits set once means distinct ranks. */
    double v[4] = {1.0, (double)(1 << d.rank), (double)(1 << d.local_rank), d.local_world};
    dist_allreduce_sum_host_double(&d, v, 4);
    CHECK(v[0] == d.world);
    CHECK_MSG(v[1] == (double)((1 << d.world) - 1), "ranks not distinct: bits %g", v[1]);
    if (d.local_world == d.world) { /* one host: local ranks are distinct too */
        CHECK(v[2] == (double)((1 << d.world) - 1));
        CHECK(v[3] == (double)d.world * d.world);
    }
}

static void test_host_collectives(void) {
    CHECK(dist_any_host(&d, 0) == 0);
    CHECK(dist_any_host(&d, d.rank == d.world - 1) == 1);
    CHECK(dist_any_host(&d, 7) == 1);

    enum { N = 1000 };
    double sums[N];
    for (int i = 0; i < N; i++) sums[i] = 0.25 * i + d.rank;
    dist_allreduce_sum_host_double(&d, sums, N);
    int wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += sums[i] != 0.25 * i * d.world + d.world * (d.world - 1) / 2.0;
    CHECK(wrong == 0);

    /* Larger than one MPI message of the eager protocol, from the last rank. */
    size_t bytes = 300000;
    unsigned char *buf = calloc(bytes, 1);
    int root = d.world - 1;
    if (d.rank == root)
        for (size_t i = 0; i < bytes; i++) buf[i] = (unsigned char)(i * 7 + 3);
    dist_bcast_host(&d, buf, bytes, root);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += buf[i] != (unsigned char)(i * 7 + 3);
    CHECK(bad == 0);
    free(buf);
    dist_barrier(&d);
}

/* In a thread of its own: the CPUs this process may take (its cpuset's), into *(int *)out. */
static void *widest_affinity(void *out) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    for (long i = 0; i < sysconf(_SC_NPROCESSORS_CONF) && i < CPU_SETSIZE; i++) CPU_SET((int)i, &mask);
    *(int *)out = sched_setaffinity(0, sizeof mask, &mask) == 0 && sched_getaffinity(0, sizeof mask, &mask) == 0
                      ? CPU_COUNT(&mask)
                      : -1;
    return NULL;
}

/* Under mpirun's default binding (each rank on one core) dist_init has
 * widened this process to every CPU it may use: as many as a thread of its
 * own may take. */
static void test_unpinned(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") || getenv("OMPI_MCA_hwloc_base_binding_policy")) return;
    cpu_set_t mask;
    CHECK(sched_getaffinity(0, sizeof mask, &mask) == 0);
    int may_use = 0;
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, widest_affinity, &may_use) == 0 && pthread_join(thread, NULL) == 0);
    if (may_use < 0) { /* a sandbox that refuses sched_setaffinity: dist_init could not either */
        printf("rank %d: this process may not set its CPU affinity: not checked\n", d.rank);
        return;
    }
    CHECK_MSG(CPU_COUNT(&mask) == may_use, "rank %d runs on %d CPUs of the %d it may use (pinned to %d by Open "
              "MPI)", d.rank, CPU_COUNT(&mask), may_use, d.cpus_pinned);
    if (d.rank == 0)
        printf("mpirun's binding: %d CPU(s) a rank, widened to %d\n", d.cpus_pinned, CPU_COUNT(&mask));
}

/* dist_mean_timings: the mean over the ranks, the same bits on each,
 * infinite where any rank's is. */
static void test_mean_timings(void) {
    enum { N = 5 };
    float t[N] = {1.0f + d.rank, 0.1f * (d.rank + 1), 3e4f + 0.25f * d.rank, d.rank == d.world - 1 ? INFINITY : 2.0f,
                  INFINITY};
    dist_mean_timings(&d, t, N);
    CHECK(t[0] == 1.0f + (d.world - 1) / 2.0f);
    CHECK(isinf(t[3]) && isinf(t[4])); /* the last rank's t[3] */
    double want = 0;
    for (int r = 0; r < d.world; r++) want += (double)(0.1f * (r + 1));
    CHECK_MSG(t[1] == (float)(want / d.world), "mean %.9g, want %.9g", t[1], want / d.world);
    float rank0[N];
    memcpy(rank0, t, sizeof t);
    dist_bcast_host(&d, rank0, sizeof rank0, 0);
    CHECK_MSG(memcmp(rank0, t, sizeof t) == 0, "rank %d's means differ from rank 0's", d.rank);
}

/* Each rank sends rank * 1000 bytes (rank 0 none) of the value rank + 1; the
 * last rank, the root, gets them in rank order with their counts. */
static void test_gather_bytes(void) {
    int root = d.world - 1;
    size_t mine = (size_t)d.rank * 1000, *counts = calloc((size_t)d.world, sizeof *counts);
    unsigned char *buf = malloc(mine + 1);
    memset(buf, d.rank + 1, mine);
    unsigned char *all = (unsigned char *)dist_gather_bytes(&d, buf, mine, root, counts);
    CHECK((all != NULL) == (d.rank == root));
    size_t at = 0, bad = 0;
    for (int r = 0; all && r < d.world; r++) {
        CHECK_MSG(counts[r] == (size_t)r * 1000, "rank %d: %zu bytes", r, counts[r]);
        for (size_t i = 0; i < counts[r]; i++) bad += all[at + i] != r + 1;
        at += counts[r];
    }
    CHECK(bad == 0);
    free(all);
    free(buf);
    free(counts);
}

/* Every rank's gradients for one pass, so that each can compute the average. */
static float *rank_gradients(uint64_t seed, int pass, int rank, size_t n) {
    float *g = malloc(n * sizeof(float));
    uint64_t state = seed + 1000003ULL * (uint64_t)pass + 7919ULL * (uint64_t)rank;
    test_fill_uniform(g, n, &state, -1.0f, 1.0f);
    return g;
}

static void check_bucket_layout(const GradBuckets *b, size_t n, size_t per) {
    CHECK(b->n_buckets >= 1);
    size_t end = n, total = 0;
    int bad = 0;
    for (int i = 0; i < b->n_buckets; i++) {
        bad += b->buckets[i].first + b->buckets[i].count != end || b->buckets[i].count == 0 ||
               b->buckets[i].count > per;
        end = b->buckets[i].first;
        total += b->buckets[i].count;
    }
    CHECK_MSG(bad == 0 && end == 0 && total == n, "%d buckets out of order or size", bad);
    CHECK(b->step_bytes == n * sizeof(float));
}

/* After ready(first_ready): the launched buckets are exactly those lying wholly
 * in [first_ready, n), they hold the average, and nothing else has moved. */
static int check_after_ready(const GradBuckets *b, size_t first_ready, const float *grads,
                             const float *mine, const double *average) {
    int bad = 0;
    for (int i = 0; i < b->n_buckets; i++)
        bad += (i < b->launched) != (b->buckets[i].first >= first_ready);
    size_t averaged_from = b->launched > 0 ? b->buckets[b->launched - 1].first : b->n;
    for (size_t j = averaged_from; j < b->n; j++) bad += fabs(grads[j] - average[j]) > 1e-6;
    for (size_t j = first_ready; j < averaged_from; j++) bad += grads[j] != mine[j];
    return bad;
}

/* Backward made layer by layer from the end: before a layer is made its
 * gradients are NaN, so reducing one too early would show. */
static void run_backward_pass(GradBuckets *b, float *grads, const float *mine,
                              const double *average, uint64_t *layer_rng) {
    size_t n = b->n;
    for (size_t j = 0; j < n; j++) grads[j] = NAN;
    grad_buckets_begin(b);
    grad_buckets_ready(b, n, NULL); /* nothing final yet */
    CHECK(b->launched == 0);
    int bad = 0;
    size_t first = n;
    while (first > 0) {
        size_t layer = 1 + (size_t)test_uniform(layer_rng, 0, 1500);
        if (layer > first) layer = first;
        first -= layer;
        memcpy(grads + first, mine + first, layer * sizeof(float));
        grad_buckets_ready(b, first, NULL);
        grad_buckets_ready(b, first, NULL); /* twice: nothing more launches */
        bad += check_after_ready(b, first, grads, mine, average);
        if (first > 0 && test_uniform(layer_rng, 0, 1) < 0.3f) break; /* finish does the rest */
    }
    /* The layers finish computes were made already (finish only launches). */
    memcpy(grads, mine, first * sizeof(float));
    grad_buckets_finish(b, NULL);
    CHECK_MSG(bad == 0, "%d gradients wrong between ready calls", bad);
    CHECK(b->launched == b->n_buckets && b->pass_bytes == b->step_bytes && !b->in_pass);
}

/* Layer-aligned buckets: contiguous from the end, none holding parts of two
 * layers unless all of both fit, a layer larger than a bucket in pieces of its
 * own, and the last bucket no larger than the first layers. */
static void test_layer_buckets(void) {
    /* layers of 300, 5000 (larger than a bucket of 1024), 20, 20, 700, 100 floats */
    const size_t boundaries[] = {300, 5300, 5320, 5340, 6040}, n = 6140;
    float *grads = calloc(n, sizeof(float));
    GradBuckets b;
    grad_buckets_init_layers(&b, &d, grads, DTYPE_F32, n, 1024 * sizeof(float), DTYPE_F32, boundaries, 5);
    if (d.world > 1) {
        check_bucket_layout(&b, n, 1024);
        const size_t edges[] = {0, 300, 5300, 5320, 5340, 6040, 6140};
        int crossing = 0;
        for (int i = 0; i < b.n_buckets; i++) {
            size_t lo = b.buckets[i].first, hi = lo + b.buckets[i].count;
            int at_lo = 0, at_hi = 0;
            for (int k = 0; k < 7; k++) {
                at_lo |= lo == edges[k];
                at_hi |= hi == edges[k];
            }
            int inside_big = lo >= 300 && hi <= 5300, outside_big = hi <= 300 || lo >= 5300;
            crossing += !(inside_big || (outside_big && at_lo && at_hi));
        }
        CHECK_MSG(crossing == 0, "%d buckets cut across layers", crossing);
        CHECK(b.buckets[b.n_buckets - 1].first == 0 && b.buckets[b.n_buckets - 1].count == 300);
        CHECK(b.buckets[0].first == 5300 && b.buckets[0].count == 840); /* the four small layers merged */
        CHECK(b.n_buckets == 7);
    }
    grad_buckets_free(&b);
    free(grads);
}

static void test_grad_buckets(size_t n, size_t bucket_bytes) {
    uint64_t seed = test_seed();
    dist_bcast_host(&d, &seed, sizeof seed, 0); /* one data set for all ranks */
    float *grads = malloc(n * sizeof(float));
    float *result0 = malloc(n * sizeof(float));
    double *average = malloc(n * sizeof(double));
    GradBuckets b;
    grad_buckets_init(&b, &d, grads, DTYPE_F32, n, bucket_bytes, DTYPE_F32);
    if (d.world > 1) {
        /* Buckets hold a multiple of 256 floats, at least 256, at most all. */
        size_t per = (bucket_bytes / sizeof(float) + 255) / 256 * 256;
        if (per == 0) per = 256;
        if (bucket_bytes == 0 || per > n) per = n;
        check_bucket_layout(&b, n, per);
        if (bucket_bytes) CHECK(b.n_buckets >= (int)(n / per));
    }
    uint64_t layer_rng = seed ^ 0x5eedULL;
    for (int pass = 0; pass < 3; pass++) {
        float *mine = NULL;
        for (size_t j = 0; j < n; j++) average[j] = 0;
        for (int r = 0; r < d.world; r++) {
            float *g = rank_gradients(seed, pass, r, n);
            for (size_t j = 0; j < n; j++) average[j] += g[j] / (double)d.world;
            if (r == d.rank) mine = g;
            else free(g);
        }
        if (d.world == 1) {
            memcpy(grads, mine, n * sizeof(float));
            grad_buckets_begin(&b);
            grad_buckets_ready(&b, 0, NULL);
            grad_buckets_finish(&b, NULL);
            CHECK(memcmp(grads, mine, n * sizeof(float)) == 0 && b.n_buckets == 0);
        } else {
            run_backward_pass(&b, grads, mine, average, &layer_rng);
        }
        double worst = 0;
        for (size_t j = 0; j < n; j++) {
            double err = fabs(grads[j] - average[j]);
            if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
        }
        CHECK_MSG(worst < 1e-6, "pass %d: worst error %g from the average", pass, worst);
        /* Every rank holds the same bits (two addends: a + b == b + a exactly). */
        memcpy(result0, grads, n * sizeof(float));
        dist_bcast_host(&d, result0, n * sizeof(float), 0);
        if (d.world == 2) CHECK(memcmp(result0, grads, n * sizeof(float)) == 0);
        else CHECK(test_rel_error(grads, result0, n) < 1e-6);
        free(mine);
    }
    grad_buckets_free(&b);
    free(grads);
    free(result0);
    free(average);
}

static void abort_mode(void) {
    if (d.world == 1) {
        dist_finalize(&d);
        test_skip("abort: needs several ranks");
    }
    if (d.rank == d.world - 1) TC_FATAL("planned failure on rank %d", d.rank);
    dist_barrier(&d); /* never returns: the failing rank takes everyone down */
    fprintf(stderr, "rank %d: the barrier returned after a rank failed\n", d.rank);
    exit(1);
}

int main(int argc, char **argv) {
    alarm(60); /* a hang fails the test instead of stalling CI */
    dist_init(&d);
    if (argc > 1 && strcmp(argv[1], "abort") == 0) abort_mode();
    test_ranks();
    test_unpinned();
    test_host_collectives();
    test_mean_timings();
    test_gather_bytes();
    test_layer_buckets();
    test_grad_buckets(10007, 4096); /* 1024 floats a bucket: 10 buckets */
    test_grad_buckets(3000, 0);     /* one bucket */
    test_grad_buckets(777, 1);      /* the smallest buckets: 256 floats */
    int failed = dist_any_host(&d, test_failures > 0);
    int status = test_finish("test_dist_cpu");
    dist_finalize(&d);
    return failed ? 1 : status;
}
