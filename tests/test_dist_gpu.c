/* The NCCL and copy-engine paths, one GPU per MPI rank (ctest starts 2 under
 * mpirun, and 4 as test_dist_gpu_4; every rank skips, exit 77, when any host
 * has fewer GPUs than ranks): grad_buckets in f32, f16 and bf16, sent as
 * themselves and cast (f32 as f16 or bf16, halves as f32), by NCCL and (all
 * ranks on one host) through the copy engines, give the average computed on
 * the host, the same bits on every rank; a last launch of 10 gradients, too
 * short to give every rank a part, too. The reduced flag (the loss scaler's
 * found-inf) is the maximum over the ranks; begin / ready / finish captured in
 * a CUDA graph on the compute stream give it all again on fresh data at each
 * replay. With the optimizer sharded, the flag also reports a NaN that only
 * another rank's averaging or one rank's NCCL bucket holds, and the ranges
 * each rank owns hold the average. Backward is
 * simulated on the compute stream: the gradient buffer starts as NaN and each
 * layer's range is copied in after a short host delay, so an all-reduce that
 * ran before its layer was final would show. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/dist.h"
#include "dist/grad_buckets.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "tests/harness.h"

static Dist d;
static cudaStream_t compute;

/* ---- host conversions, round to nearest even (the device casts round so too) ---- */

static uint16_t half_from_float(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t mag = x & 0x7fffffff;
    if (mag > 0x7f800000) return sign | 0x7e00;      /* NaN */
    if (mag >= 0x477ff000) return sign | 0x7c00;     /* rounds past 65504: inf */
    if (mag < 0x38800000) {                          /* below 2^-14: subnormal */
        float v;
        memcpy(&v, &mag, 4);
        return sign | (uint16_t)lrintf(v * 16777216.0f); /* units of 2^-24 */
    }
    uint32_t rounded = mag + 0xfff + ((mag >> 13) & 1);
    return sign | (uint16_t)((rounded - 0x38000000) >> 13);
}

static float half_to_float(uint16_t h) {
    int exponent = (h >> 10) & 0x1f;
    uint32_t mantissa = h & 0x3ff;
    float v = exponent == 0    ? ldexpf((float)mantissa, -24)
              : exponent == 31 ? (mantissa ? NAN : INFINITY)
                               : ldexpf((float)(mantissa | 0x400), exponent - 25);
    return h & 0x8000 ? -v : v;
}

static uint16_t bf16_from_float(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void store_as(DType t, const float *src, void *dst, size_t n) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) {
        if (t == DTYPE_F32) ((float *)dst)[i] = src[i];
        else h[i] = t == DTYPE_F16 ? half_from_float(src[i]) : bf16_from_float(src[i]);
    }
}

static void load_from(DType t, const void *src, float *dst, size_t n) {
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = t == DTYPE_F32 ? ((const float *)src)[i]
                 : t == DTYPE_F16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
}

/* Half the spacing of numbers near 1 in the coarser of the two types. */
static double rounding_of(DType t) {
    return t == DTYPE_F32 ? ldexp(1, -24) : t == DTYPE_F16 ? ldexp(1, -11) : ldexp(1, -8);
}

/* How far an average may be from the host's: a few roundings of the coarser
 * type, 2 per rank (each rank's value added rounds once more). */
static double tolerance(DType dtype, DType comm_dtype) {
    double r = rounding_of(dtype) > rounding_of(comm_dtype) ? rounding_of(dtype) : rounding_of(comm_dtype);
    return 2.0 * d.world * r;
}

/* ---- set-up ------------------------------------------------------------------- */

static void skip_unless_a_gpu_per_rank(void) {
    int gpus = gpu_count();
    if (dist_any_host(&d, gpus < d.local_world)) {
        dist_finalize(&d);
        if (d.rank == 0) test_skip("%d ranks on this host: fewer than %d GPUs (%d visible)", d.local_world,
                                   d.local_world, gpus);
        exit(77);
    }
}

/* ---- grad_buckets ---------------------------------------------------------------- */

typedef struct {
    DType dtype, comm_dtype;
    size_t n;
    void *grads;        /* device */
    void *source;       /* device: this rank's gradients, copied in layer by layer */
    size_t *layer_first;/* layers from the end of the buffer: first index of each */
    int layers;
    float *host;        /* n */
    void *host_stored;  /* n elements of dtype */
    double *average;    /* n */
    int32_t *flag;      /* device: reduced with the buckets */
    int32_t *flag_host; /* pinned: this rank's flag for the next pass */
} BucketCase;

/* Every rank's gradients for this round, so that each rank can average them. */
static void make_round(BucketCase *c, uint64_t seed, int round) {
    size_t esize = dtype_size(c->dtype);
    for (size_t j = 0; j < c->n; j++) c->average[j] = 0;
    float *rank_floats = malloc(c->n * sizeof(float));
    for (int r = 0; r < d.world; r++) {
        uint64_t state = seed + 1000003ULL * (uint64_t)round + 7919ULL * (uint64_t)r;
        test_fill_uniform(c->host, c->n, &state, -1.0f, 1.0f);
        store_as(c->dtype, c->host, c->host_stored, c->n);
        load_from(c->dtype, c->host_stored, rank_floats, c->n); /* as stored */
        for (size_t j = 0; j < c->n; j++) c->average[j] += rank_floats[j] / (double)d.world;
        if (r == d.rank)
            CUDA_CHECK(cudaMemcpy(c->source, c->host_stored, c->n * esize, cudaMemcpyHostToDevice));
    }
    free(rank_floats);
}

static void short_delay(void *arg) {
    (void)arg;
    usleep(200);
}

/* This rank's flag in a round: set on one rank only, a different one each round. */
static int32_t flag_of(int round) { return d.rank == round % d.world ? 1 + round : 0; }

/* One backward pass on the compute stream: NaN, then layer by layer from the
 * end; the flag is copied in from the host (pinned) before the pass. */
static void backward_pass(BucketCase *c, GradBuckets *b) {
    size_t esize = dtype_size(c->dtype);
    CUDA_CHECK(cudaMemcpyAsync(c->flag, c->flag_host, sizeof(int32_t), cudaMemcpyHostToDevice, compute));
    CUDA_CHECK(cudaMemsetAsync(c->grads, 0xff, c->n * esize, compute)); /* NaN in every dtype */
    grad_buckets_begin(b);
    size_t end = c->n;
    for (int i = 0; i < c->layers; i++) {
        size_t first = c->layer_first[i];
        CUDA_CHECK(cudaLaunchHostFunc(compute, short_delay, NULL));
        CUDA_CHECK(cudaMemcpyAsync((char *)c->grads + first * esize, (char *)c->source + first * esize,
                                   (end - first) * esize, cudaMemcpyDeviceToDevice, compute));
        grad_buckets_ready(b, first, compute);
        end = first;
    }
    grad_buckets_finish(b, compute);
}

/* backward_pass captured once on the compute stream, ready to replay. */
static cudaGraphExec_t capture_pass(BucketCase *c, GradBuckets *b) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeGlobal));
    backward_pass(c, b);
    CUDA_CHECK(cudaStreamEndCapture(compute, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
}

/* Compares the gradients with the average; the bits must match rank 0's. The
 * flag must be the round's maximum. */
static void check_average(BucketCase *c, int round, const char *when) {
    size_t esize = dtype_size(c->dtype);
    CUDA_CHECK(cudaStreamSynchronize(compute));
    int32_t flag = -1;
    CUDA_CHECK(cudaMemcpy(&flag, c->flag, sizeof flag, cudaMemcpyDeviceToHost));
    CHECK_MSG(flag == (d.world == 1 ? flag_of(round) : 1 + round), "%s: flag %d after round %d", when, flag,
              round);
    CUDA_CHECK(cudaMemcpy(c->host_stored, c->grads, c->n * esize, cudaMemcpyDeviceToHost));
    load_from(c->dtype, c->host_stored, c->host, c->n);
    double tol = tolerance(c->dtype, c->comm_dtype);
    double worst = 0;
    for (size_t j = 0; j < c->n; j++) {
        double err = fabs(c->host[j] - c->average[j]);
        if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
    }
    CHECK_MSG(worst <= tol, "%s grads sent as %s, %s: worst error %g > %g", dtype_name(c->dtype),
              dtype_name(c->comm_dtype), when, worst, tol);
    void *rank0 = malloc(c->n * esize);
    memcpy(rank0, c->host_stored, c->n * esize);
    dist_bcast_host(&d, rank0, c->n * esize, 0);
    CHECK_MSG(memcmp(rank0, c->host_stored, c->n * esize) == 0,
              "%s grads sent as %s, %s: ranks differ", dtype_name(c->dtype),
              dtype_name(c->comm_dtype), when);
    free(rank0);
}

/* Buffers of about a million gradients, cut into up to 63 layers of random
 * sizes (the same on every rank). first_layer > 0: 2^20 + first_layer
 * gradients, the first layer first_layer of them; with buckets of a power of
 * two bytes (in comm_dtype) it is a bucket and a launch of its own. */
static void bucket_case_init(BucketCase *c, DType dtype, DType comm_dtype, uint64_t seed, size_t first_layer) {
    size_t n = ((size_t)1 << 20) + (first_layer ? first_layer : 12345);
    *c = (BucketCase){.dtype = dtype, .comm_dtype = comm_dtype, .n = n};
    size_t esize = dtype_size(dtype);
    CUDA_CHECK(cudaMalloc(&c->grads, c->n * esize));
    CUDA_CHECK(cudaMalloc((void **)&c->flag, sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost((void **)&c->flag_host, sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&c->source, c->n * esize));
    c->host = malloc(c->n * sizeof(float));
    c->host_stored = malloc(c->n * esize);
    c->average = malloc(c->n * sizeof(double));
    c->layer_first = malloc(64 * sizeof(size_t));
    uint64_t layer_rng = seed ^ 0x1a7e5ULL; /* the same layers on every rank */
    for (size_t end = c->n; end > first_layer && c->layers < 63;) {
        size_t size = 1 + (size_t)test_uniform(&layer_rng, 0, (float)(c->n / 12));
        end = size < end - first_layer && c->layers < 62 ? end - size : first_layer;
        c->layer_first[c->layers++] = end;
    }
    if (first_layer > 0) c->layer_first[c->layers++] = 0;
}

static void bucket_case_free(BucketCase *c) {
    CUDA_CHECK(cudaFree(c->grads));
    CUDA_CHECK(cudaFree(c->flag));
    CUDA_CHECK(cudaFreeHost(c->flag_host));
    CUDA_CHECK(cudaFree(c->source));
    free(c->host);
    free(c->host_stored);
    free(c->average);
    free(c->layer_first);
}

/* by_peer: every launch through the copy engines (all ranks on one host);
 * first_layer: as in bucket_case_init. */
static void test_grad_buckets(DType dtype, DType comm_dtype, uint64_t seed, int by_peer, size_t first_layer) {
    BucketCase c;
    bucket_case_init(&c, dtype, comm_dtype, seed, first_layer);
    GradBuckets b;
    grad_buckets_init(&b, &d, c.grads, dtype, c.n, 256 << 10, comm_dtype);
    grad_buckets_reduce_flag(&b, c.flag);
    if (d.world > 1) CHECK(b.n_buckets > 4);
    if (by_peer) {
        char why[256] = "";
        CHECK_MSG(grad_buckets_use_peer_link(&b, 0, why, sizeof why), "no peer link: %s", why);
    }
    for (int round = 0; round < 2; round++) {
        make_round(&c, seed, round);
        *c.flag_host = flag_of(round);
        backward_pass(&c, &b);
        check_average(&c, round, round == 0 ? "first pass" : "second pass");
        CHECK(d.world == 1 || (b.launched == b.n_buckets && b.pass_bytes == b.step_bytes));
        CHECK(!by_peer || b.peer_launches > 4);
    }

    /* The same pass captured once, replayed on fresh data. */
    cudaGraphExec_t exec = capture_pass(&c, &b);
    for (int replay = 0; replay < 3; replay++) {
        make_round(&c, seed, 10 + replay);
        *c.flag_host = flag_of(10 + replay);
        CUDA_CHECK(cudaGraphLaunch(exec, compute));
        check_average(&c, 10 + replay, replay == 0 ? "first graph replay" : "later graph replay");
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));

    grad_buckets_free(&b);
    bucket_case_free(&c);
}

/* ---- the sharded optimizer's found-inf flag ---------------------------------------- */

/* Where a NaN goes in a round of test_sharded_flag: nowhere, into a part of
 * a copy-engine launch that another rank owns and averages, or into what NCCL
 * averages; or no NaN but the flag (the loss check's) set on rank 0 alone. */
typedef enum { POISON_NONE, POISON_PEER_PART, POISON_NCCL, POISON_FLAG_ONLY } Poison;

static const char *poison_name(Poison p) {
    return p == POISON_NONE ? "no NaN"
           : p == POISON_PEER_PART ? "a NaN in the last rank's part, on rank 0 only"
           : p == POISON_NCCL ? "a NaN in an NCCL bucket, on rank 1 only" : "the flag set on rank 0 only";
}

/* The last index of the middle copy-engine launch (in the last rank's part:
 * the launches are long enough to give every rank one), or the first outside
 * every one (NCCL's); n when there is none. */
static size_t poison_index(const GradBuckets *b, Poison p) {
    if (p == POISON_PEER_PART && b->n_peer_ranges > 0) {
        GradBucket k = b->peer_ranges[b->n_peer_ranges / 2];
        return k.first + k.count - 1;
    }
    for (size_t i = 0; i < b->n && p == POISON_NCCL;) {
        size_t past = i; /* the end of the launch holding i, if one does */
        for (int k = 0; k < b->n_peer_ranges; k++)
            if (i >= b->peer_ranges[k].first && i < b->peer_ranges[k].first + b->peer_ranges[k].count)
                past = b->peer_ranges[k].first + b->peer_ranges[k].count;
        if (past == i) return i;
        i = past;
    }
    return b->n;
}

/* This rank's round: fresh gradients, then the poison where it goes.
 * Returns the flag every rank must end the pass with: 1 where some rank got a
 * NaN or set its flag (all through the copy engines, there is no NCCL bucket
 * to poison). */
static int make_poisoned_round(BucketCase *c, const GradBuckets *b, uint64_t seed, int round, Poison p) {
    make_round(c, seed, round);
    *c->flag_host = p == POISON_FLAG_ONLY && d.rank == 0;
    size_t at = poison_index(b, p);
    int poisoner = p == POISON_PEER_PART ? 0 : 1;
    int expected = p == POISON_FLAG_ONLY || at < b->n;
    if (at == b->n || d.rank != poisoner) return expected;
    float nan = NAN;
    size_t esize = dtype_size(c->dtype);
    char stored[4];
    store_as(c->dtype, &nan, stored, 1);
    CUDA_CHECK(cudaMemcpy((char *)c->source + at * esize, stored, esize, cudaMemcpyHostToDevice));
    return expected;
}

/* After a pass: the flag is 'expected' on every rank, and where it is 0 the
 * ranges this rank owns hold the average. */
static void check_sharded_pass(BucketCase *c, GradBuckets *b, Poison p, int expected, const char *when) {
    CUDA_CHECK(cudaStreamSynchronize(compute));
    int32_t flag = -1;
    CUDA_CHECK(cudaMemcpy(&flag, c->flag, sizeof flag, cudaMemcpyDeviceToHost));
    CHECK_MSG(flag == expected, "sharded %s grads sent as %s, %s, %s: rank %d's flag is %d, not %d",
              dtype_name(c->dtype), dtype_name(c->comm_dtype), when, poison_name(p), d.rank, flag, expected);
    if (expected) return;
    size_t esize = dtype_size(c->dtype);
    CUDA_CHECK(cudaMemcpy(c->host_stored, c->grads, c->n * esize, cudaMemcpyDeviceToHost));
    load_from(c->dtype, c->host_stored, c->host, c->n);
    double tol = tolerance(c->dtype, c->comm_dtype);
    double worst = 0;
    int n_owned;
    const GradBucket *owned = grad_buckets_owned(b, &n_owned);
    for (int k = 0; k < n_owned; k++)
        for (size_t j = owned[k].first; j < owned[k].first + owned[k].count; j++) {
            double err = fabs(c->host[j] - c->average[j]);
            if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
        }
    CHECK_MSG(worst <= tol, "sharded %s grads sent as %s, %s: worst error %g > %g in what rank %d owns",
              dtype_name(c->dtype), dtype_name(c->comm_dtype), when, worst, tol, d.rank);
}

/* grad_buckets_shard_optimizer: each rank checks what it averages and the flag
 * is max-reduced with the last launch, so a NaN that only another rank sees
 * still sets the flag here; eagerly and replayed from a CUDA graph. Buckets of
 * 64 KiB: a layer completes one or several at once, so with min_bytes 128 KiB
 * launches go both ways; with 0 every one goes through the copy engines.
 * first_layer: as in bucket_case_init. */
static void test_sharded_flag(DType dtype, DType comm_dtype, uint64_t seed, size_t min_bytes, size_t first_layer) {
    BucketCase c;
    bucket_case_init(&c, dtype, comm_dtype, seed, first_layer);
    void *weights;
    CUDA_CHECK(cudaMalloc(&weights, c.n * dtype_size(dtype)));
    GradBuckets b;
    char why[256] = "";
    grad_buckets_init(&b, &d, c.grads, dtype, c.n, 64 << 10, comm_dtype);
    grad_buckets_reduce_flag(&b, c.flag);
    CHECK_MSG(grad_buckets_use_peer_link(&b, min_bytes, why, sizeof why), "no peer link: %s", why);
    CHECK_MSG(grad_buckets_shard_optimizer(&b, weights, dtype, why, sizeof why), "not sharded: %s", why);
    const Poison order[] = {POISON_NONE, POISON_PEER_PART, POISON_NONE, POISON_NCCL, POISON_FLAG_ONLY};
    int rounds = (int)(sizeof order / sizeof *order);
    for (int round = 0; round < rounds; round++) {
        int expected = make_poisoned_round(&c, &b, seed, round, order[round]);
        backward_pass(&c, &b);
        check_sharded_pass(&c, &b, order[round], expected, "eager");
    }
    CHECK(b.n_peer_ranges > 1);
    CHECK((min_bytes == 0) == (poison_index(&b, POISON_NCCL) == b.n)); /* both paths where meant */

    cudaGraphExec_t exec = capture_pass(&c, &b);
    for (int round = 0; round < rounds; round++) {
        int expected = make_poisoned_round(&c, &b, seed, 20 + round, order[rounds - 1 - round]);
        CUDA_CHECK(cudaGraphLaunch(exec, compute));
        check_sharded_pass(&c, &b, order[rounds - 1 - round], expected, "graph replay");
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    grad_buckets_free(&b);
    CUDA_CHECK(cudaFree(weights));
    bucket_case_free(&c);
}

/* ---- the sharded optimizer's weights ------------------------------------------------ */

static void hold_stream(void *arg) {
    (void)arg;
    usleep(20000);
}

/* Round r's value of weight i, as its owner writes it. */
static float weight_value(size_t i, int round) { return (float)(i % 4099) + 0.25f * (float)round; }

/* This rank's values: what it owns round r's, the rest -1 (not yet arrived). */
static void own_weights(const GradBuckets *b, float *host, size_t n, int round) {
    for (size_t i = 0; i < n; i++) host[i] = -1.0f;
    int n_owned;
    const GradBucket *owned = grad_buckets_owned(b, &n_owned);
    for (int k = 0; k < n_owned; k++)
        for (size_t i = owned[k].first; i < owned[k].first + owned[k].count; i++) host[i] = weight_value(i, round);
}

/* Counts the weights in [first, end) that are not round r's. */
static size_t stale_weights(const float *host, size_t first, size_t end, int round) {
    size_t stale = 0;
    for (size_t i = first; i < end; i++) stale += host[i] != weight_value(i, round);
    return stale;
}

/* grad_buckets_send_weights and grad_buckets_await_weights over one
 * copy-engine launch of the whole buffer. In each round every rank holds its
 * comm stream (so nothing it sends arrives for 20 ms), sends, and reads one
 * window of the buffer right after awaiting it: every weight there must be
 * the round's, which only a wait for what the window touches ensures. Then
 * the whole buffer is awaited. */
static void test_sharded_weights(uint64_t seed) {
    BucketCase c;
    bucket_case_init(&c, DTYPE_F32, DTYPE_F32, seed, 0);
    size_t n = c.n;
    float *weights, *host = malloc(n * sizeof(float));
    CUDA_CHECK(cudaMalloc((void **)&weights, n * sizeof(float)));
    GradBuckets b;
    char why[256] = "";
    grad_buckets_init(&b, &d, c.grads, DTYPE_F32, n, 0, DTYPE_F32);
    grad_buckets_reduce_flag(&b, c.flag);
    CHECK_MSG(grad_buckets_use_peer_link(&b, 0, why, sizeof why), "no peer link: %s", why);
    CHECK_MSG(grad_buckets_shard_optimizer(&b, weights, DTYPE_F32, why, sizeof why), "not sharded: %s", why);
    make_round(&c, seed, 0);
    *c.flag_host = 0;
    backward_pass(&c, &b);
    CUDA_CHECK(cudaStreamSynchronize(compute));
    CHECK(b.n_peer_ranges == 1);
    /* Windows of 300 from 2^j - 150 past the start of the buffer and of the next
     * rank's part, the last a random one. */
    int n_owned;
    const GradBucket *owned = grad_buckets_owned(&b, &n_owned);
    size_t next_part = owned[0].first == 0 ? owned[0].count : 0; /* where the next rank's part starts */
    uint64_t state = seed;
    for (int round = 0; round < 24; round++) {
        size_t from = round == 23 ? (size_t)test_uniform(&state, 0, (float)n)
                                  : (round % 2 ? next_part : 0) + ((size_t)1 << (round / 2 + 8));
        from = from < 150 ? 0 : from - 150;
        if (from > n - 300) from = n - 300; /* every rank takes every round: each one sends */
        size_t to = from + 300;
        own_weights(&b, host, n, round);
        CUDA_CHECK(cudaMemcpy(weights, host, n * sizeof(float), cudaMemcpyHostToDevice));
        dist_barrier(&d); /* no rank sends before every rank has reset what it receives */
        CUDA_CHECK(cudaLaunchHostFunc(d.comm_stream, hold_stream, NULL));
        grad_buckets_weights_updated(&b);
        grad_buckets_send_weights(&b, compute);
        grad_buckets_await_weights(&b, from, to, compute);
        CUDA_CHECK(cudaMemcpyAsync(host + from, weights + from, (to - from) * sizeof(float), cudaMemcpyDeviceToHost,
                                   compute));
        CUDA_CHECK(cudaStreamSynchronize(compute));
        size_t stale = stale_weights(host, from, to, round);
        CHECK_MSG(stale == 0, "rank %d, round %d: %zu of the weights in [%zu, %zu) not yet arrived after their wait",
                  d.rank, round, stale, from, to);
        grad_buckets_await_weights(&b, 0, n, compute);
        grad_buckets_join(&b, compute);
        CUDA_CHECK(cudaMemcpyAsync(host, weights, n * sizeof(float), cudaMemcpyDeviceToHost, compute));
        CUDA_CHECK(cudaStreamSynchronize(compute));
        stale = stale_weights(host, 0, n, round);
        CHECK_MSG(stale == 0, "rank %d, round %d: %zu weights not the owners' after waiting for all", d.rank, round,
                  stale);
    }
    grad_buckets_free(&b);
    CUDA_CHECK(cudaFree(weights));
    free(host);
    bucket_case_free(&c);
}

int main(void) {
    alarm(240); /* a hang fails the test instead of stalling CI */
    dist_init(&d);
    skip_unless_a_gpu_per_rank();
    dist_init_nccl(&d, d.local_rank);
    CHECK(d.device == d.local_rank);
    CHECK((d.world > 1) == (d.nccl != NULL && d.comm_stream != NULL));
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));

    uint64_t seed = test_seed();
    dist_bcast_host(&d, &seed, sizeof seed, 0); /* one data set for all ranks */
    const DType pairs[][2] = {{DTYPE_F32, DTYPE_F32},  {DTYPE_F16, DTYPE_F16},
                              {DTYPE_BF16, DTYPE_BF16}, {DTYPE_F32, DTYPE_F16},
                              {DTYPE_F32, DTYPE_BF16},  {DTYPE_F16, DTYPE_F32},
                              {DTYPE_BF16, DTYPE_F32}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
        test_grad_buckets(pairs[i][0], pairs[i][1], seed + i, 0, 0);
    /* Through the copy engines where every rank is on this host. */
    int copy_engines = d.world >= 2 && d.world == d.local_world && d.world <= PEER_LINK_MAX_RANKS;
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs && copy_engines; i++)
        test_grad_buckets(pairs[i][0], pairs[i][1], seed + 100 + i, 1, 0);
    if (copy_engines) {
        /* A last launch of 10 gradients: parts empty on every rank but 0. */
        test_grad_buckets(DTYPE_F32, DTYPE_F32, seed + 150, 1, 10);
        test_grad_buckets(DTYPE_BF16, DTYPE_F32, seed + 151, 1, 10);
        test_sharded_flag(DTYPE_F16, DTYPE_F16, seed + 200, 128 << 10, 0);
        test_sharded_flag(DTYPE_F32, DTYPE_F32, seed + 201, 0, 0);
        test_sharded_flag(DTYPE_F32, DTYPE_F16, seed + 202, 128 << 10, 0);
        test_sharded_flag(DTYPE_F32, DTYPE_F32, seed + 203, 0, 10);
        test_sharded_weights(seed + 300);
    } else if (d.world > 1 && d.rank == 0) {
        printf("copy engines not tested: %d ranks, %d on this host\n", d.world, d.local_world);
    }

    CUDA_CHECK(cudaStreamDestroy(compute));
    int failed = dist_any_host(&d, test_failures > 0);
    int status = test_finish("test_dist_gpu");
    dist_finalize(&d);
    return failed ? 1 : status;
}
