/* The device side of the gradient buckets (CUDA builds only): NCCL, the copy
 * engines' peer link, the sharded optimizer's bookkeeping. grad_buckets.c
 * calls in here where the gradients are on the GPU. */
#include "dist/grad_buckets_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_check.h"
#include "dist/grad_cast.h"
#include "runtime/check.h"
#include "runtime/log.h"

static double mib(double bytes) { return bytes / 1048576.0; }

static ncclDataType_t nccl_dtype(DType t) {
    switch (t) {
    case DTYPE_F16: return ncclFloat16;
    case DTYPE_BF16: return ncclBfloat16;
    default: return ncclFloat32;
    }
}

void grad_buckets_gpu_check(const GradBuckets *b) {
    struct cudaPointerAttributes attr;
    CUDA_CHECK(cudaPointerGetAttributes(&attr, b->grads));
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        TC_FATAL("rank %d: grad buckets: with NCCL the gradients must be in device memory", b->dist->rank);
}

void grad_buckets_gpu_init(GradBuckets *b) {
    CUDA_CHECK(cudaEventCreateWithFlags(&b->grads_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&b->comm_done, cudaEventDisableTiming));
    if (b->comm_dtype != b->dtype && b->n > 0)
        CUDA_CHECK(cudaMalloc(&b->comm_buffer, b->n * dtype_size(b->comm_dtype)));
}

int grad_buckets_use_peer_link(GradBuckets *b, size_t min_bytes, char *why, size_t why_size) {
    if (b->dist->world == 1 || !b->on_device) {
        snprintf(why, why_size, "%s", b->dist->world == 1 ? "the job is one rank" : "the gradients are on the host");
        return 0;
    }
    void *sent = b->comm_buffer ? b->comm_buffer : b->grads;
    /* At most one launch per bucket, two flags each for the gradients and one
     * for the weights (grad_buckets_shard_optimizer). */
    if (!peer_link_open(&b->peer, b->dist, sent, b->n * dtype_size(b->comm_dtype), 3 * b->n_buckets, why,
                        why_size))
        return 0;
    b->peer_min_bytes = min_bytes;
    if (b->dist->rank == 0)
        log_info("grad buckets: launches of %.3f MiB or more averaged through the copy engines (CUDA IPC "
                 "between the 2 GPUs), smaller ones by NCCL", mib((double)min_bytes));
    return 1;
}

int grad_buckets_shard_optimizer(GradBuckets *b, void *weights, DType weights_dtype, char *why,
                                 size_t why_size) {
    if (!b->peer.on) {
        snprintf(why, why_size, "the gradients are not averaged through the copy engines");
        return 0;
    }
    if (!peer_link_map_region(&b->peer, b->dist, weights, why, why_size)) return 0;
    b->peer_ranges = calloc((size_t)b->n_buckets, sizeof *b->peer_ranges);
    b->weights_due = calloc((size_t)b->n_buckets, 1);
    b->owned = calloc((size_t)b->n_buckets + 1, sizeof *b->owned);
    if (!b->peer_ranges || !b->weights_due || !b->owned) TC_FATAL("grad buckets: out of memory");
    b->weights = weights;
    b->weights_dtype = weights_dtype;
    b->shard = 1;
    if (b->dist->rank == 0)
        log_info("grad buckets: sharded optimizer: each rank updates its half of what the copy engines average "
                 "and sends the other its weights");
    return 1;
}

void grad_buckets_reduce_flag(GradBuckets *b, int32_t *flag) { b->flag = flag; }

static void *element(void *base, DType t, size_t i) { return (char *)base + i * dtype_size(t); }

/* A launch through the peer link is cut in two: rank 0 owns the lower half,
 * rank 1 the upper one. */
static void halves(const GradBuckets *b, GradBucket launch, GradBucket *mine, GradBucket *theirs) {
    GradBucket lower = {launch.first, launch.count / 2};
    GradBucket upper = {launch.first + lower.count, launch.count - lower.count};
    *mine = b->dist->rank == 0 ? lower : upper;
    *theirs = b->dist->rank == 0 ? upper : lower;
}

/* Sharded: the launches through the peer link are the same in every pass
 * (the weights flags pair up across passes). */
static void record_peer_range(GradBuckets *b, int k, GradBucket launch) {
    if (k < b->n_peer_ranges) {
        if (b->peer_ranges[k].first != launch.first || b->peer_ranges[k].count != launch.count)
            TC_FATAL("rank %d: grad buckets: peer launch %d is [%zu, +%zu), in the first pass [%zu, +%zu): "
                     "backward must report its gradients alike in every pass", b->dist->rank, k, launch.first,
                     launch.count, b->peer_ranges[k].first, b->peer_ranges[k].count);
        return;
    }
    b->peer_ranges[b->n_peer_ranges++] = launch;
}

/* [first, first + count) of the sent buffer averaged with the other rank's
 * through the peer link. Each rank puts the other's half into the other's
 * receive buffer, averages its own half with what arrived there and (unless
 * sharded) puts the result into the other's sent buffer. Rank r waits on the
 * flags its peer signals: 2k when the peer's half has arrived, 2k + 1 when the
 * averaged half has. */
static void average_with_peer(GradBuckets *b, size_t first, size_t count, cudaStream_t comm) {
    PeerLink *p = &b->peer;
    size_t esize = dtype_size(b->comm_dtype);
    GradBucket launch = {first, count}, mine, theirs;
    halves(b, launch, &mine, &theirs);
    int k = b->peer_launches++, flag = 2 * k;
    if (b->shard) record_peer_range(b, k, launch);
    peer_link_put(p, 0, theirs.first * esize, theirs.count * esize, comm);
    peer_link_signal(p, flag, comm);
    peer_link_wait(p, flag, comm);
    grad_average_pair_cuda(b->comm_dtype, element(p->sent, b->comm_dtype, mine.first),
                           element(p->recv, b->comm_dtype, mine.first), mine.count, b->shard ? b->flag : NULL,
                           comm);
    if (b->shard) return;
    peer_link_put(p, 1, mine.first * esize, mine.count * esize, comm);
    peer_link_signal(p, flag + 1, comm);
    peer_link_wait(p, flag + 1, comm);
}

/* grad_buckets_reduce_flag's flag, once a pass, on 'stream' (inside an NCCL
 * group where there is one): with the first launch, or sharded with the last,
 * once every rank has checked what it averages. */
static void reduce_flag(GradBuckets *b, int last, cudaStream_t stream) {
    if (!b->flag || b->flag_reduced || (b->shard && !last)) return;
    NCCL_CHECK(ncclAllReduce(b->flag, b->flag, 1, ncclInt32, ncclMax, b->dist->nccl, stream));
    b->flag_reduced = 1;
}

/* Sharded: this rank's own values of what NCCL averages are checked before
 * they are sent. ncclAvg scales each rank's values before adding them, so the
 * average is finite exactly when every rank's values are. */
static void check_before_nccl(GradBuckets *b, void *sent, int from, int to, cudaStream_t comm) {
    for (int i = from; i < to && b->shard && b->flag; i++)
        grad_flag_nonfinite_cuda(b->comm_dtype, element(sent, b->comm_dtype, b->buckets[i].first),
                                 b->buckets[i].count, b->flag, comm);
}

/* Buckets [from, to) on the device: fork the comm stream off compute, cast in,
 * average (one NCCL group, or the peer link), cast back. */
void grad_buckets_gpu_launch(GradBuckets *b, int from, int to, cudaStream_t compute) {
    Dist *d = b->dist;
    cudaStream_t comm = d->comm_stream;
    CUDA_CHECK(cudaEventRecord(b->grads_ready, compute));
    CUDA_CHECK(cudaStreamWaitEvent(comm, b->grads_ready, 0));
    int cast = b->comm_buffer != NULL;
    void *sent = cast ? b->comm_buffer : b->grads;
    for (int i = from; i < to && cast; i++) {
        const GradBucket *k = &b->buckets[i];
        grad_cast_cuda(b->dtype, element(b->grads, b->dtype, k->first), b->comm_dtype,
                       element(sent, b->comm_dtype, k->first), k->count, comm);
    }
    /* The buckets of one launch are contiguous: [first, end). */
    size_t first = b->buckets[to - 1].first, end = b->buckets[from].first + b->buckets[from].count;
    int by_peer = b->peer.on && (end - first) * dtype_size(b->comm_dtype) >= b->peer_min_bytes;
    if (by_peer) average_with_peer(b, first, end - first, comm);
    else check_before_nccl(b, sent, from, to, comm);
    /* Grouped, the NCCL calls run as one launch after ncclGroupEnd: casts back
     * must come after the group, not inside it. */
    NCCL_CHECK(ncclGroupStart());
    for (int i = from; i < to && !by_peer; i++) {
        void *buf = element(sent, b->comm_dtype, b->buckets[i].first);
        NCCL_CHECK(ncclAllReduce(buf, buf, b->buckets[i].count, nccl_dtype(b->comm_dtype),
                                 ncclAvg, d->nccl, comm));
    }
    reduce_flag(b, to == b->n_buckets, comm);
    NCCL_CHECK(ncclGroupEnd());
    for (int i = from; i < to && cast; i++) {
        const GradBucket *k = &b->buckets[i];
        grad_cast_cuda(b->comm_dtype, element(sent, b->comm_dtype, k->first), b->dtype,
                       element(b->grads, b->dtype, k->first), k->count, comm);
    }
}

/* Rising order: the launches came from the end of the buffer backwards. */
static void find_owned(GradBuckets *b) {
    size_t at = 0;
    b->n_owned = 0;
    for (int k = b->n_peer_ranges - 1; k >= 0; k--) {
        GradBucket mine, theirs;
        halves(b, b->peer_ranges[k], &mine, &theirs);
        if (theirs.first > at) b->owned[b->n_owned++] = (GradBucket){at, theirs.first - at};
        at = theirs.first + theirs.count;
    }
    if (b->n > at) b->owned[b->n_owned++] = (GradBucket){at, b->n - at};
}

void grad_buckets_gpu_finish(GradBuckets *b, cudaStream_t compute) {
    reduce_flag(b, 1, compute); /* no bucket launched it */
    if (b->shard && b->peer_launches != b->n_peer_ranges)
        TC_FATAL("rank %d: grad buckets: %d launches through the peer link in this pass, %d in the first",
                 b->dist->rank, b->peer_launches, b->n_peer_ranges);
    if (b->shard) find_owned(b);
    if (b->n_buckets > 0) grad_buckets_join(b, compute);
}

const GradBucket *grad_buckets_owned(const GradBuckets *b, int *n) {
    if (!b->shard) TC_FATAL("rank %d: grad_buckets_owned: the optimizer is not sharded", b->dist->rank);
    *n = b->n_owned;
    return b->owned;
}

static int weights_flag(const GradBuckets *b, int k) { return 2 * b->n_buckets + k; }

void grad_buckets_weights_updated(GradBuckets *b) { b->weights_new = b->shard; }

/* The half of every peer launch this rank updated, to the other rank. */
static void put_weights(GradBuckets *b, cudaStream_t stream) {
    size_t esize = dtype_size(b->weights_dtype);
    for (int k = 0; k < b->n_peer_ranges; k++) {
        GradBucket mine, theirs;
        halves(b, b->peer_ranges[k], &mine, &theirs);
        peer_link_put_region(&b->peer, element(b->weights, b->weights_dtype, mine.first), mine.count * esize,
                             stream);
        peer_link_signal(&b->peer, weights_flag(b, k), stream);
    }
}

void grad_buckets_send_weights(GradBuckets *b, cudaStream_t compute) {
    if (!b->weights_new) return;
    CUDA_CHECK(cudaEventRecord(b->grads_ready, compute));
    CUDA_CHECK(cudaStreamWaitEvent(b->dist->comm_stream, b->grads_ready, 0));
    put_weights(b, b->dist->comm_stream);
    /* The other rank updated its half in the same step and sends it now too. */
    memset(b->weights_due, 1, (size_t)b->n_peer_ranges);
    b->weights_new = 0;
}

void grad_buckets_await_weights(GradBuckets *b, size_t first, size_t end, cudaStream_t stream) {
    for (int k = 0; k < b->n_peer_ranges && b->shard; k++) {
        GradBucket mine, theirs;
        halves(b, b->peer_ranges[k], &mine, &theirs);
        if (!b->weights_due[k] || theirs.first >= end || theirs.first + theirs.count <= first) continue;
        peer_link_wait(&b->peer, weights_flag(b, k), stream);
        b->weights_due[k] = 0;
    }
}

void grad_buckets_join(GradBuckets *b, cudaStream_t compute) {
    CUDA_CHECK(cudaEventRecord(b->comm_done, b->dist->comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(compute, b->comm_done, 0));
}

void grad_buckets_sync_state(GradBuckets *b, float *params, float *momentum, cudaStream_t stream) {
    if (!b->shard) return;
    put_weights(b, stream);
    for (int k = 0; k < b->n_peer_ranges; k++) peer_link_wait(&b->peer, weights_flag(b, k), stream);
    NCCL_CHECK(ncclGroupStart());
    for (int k = 0; k < b->n_peer_ranges; k++) {
        GradBucket part[2];
        halves(b, b->peer_ranges[k], &part[b->dist->rank], &part[1 - b->dist->rank]);
        for (int owner = 0; owner < 2; owner++)
            for (int which = 0; which < 2; which++) {
                float *buf = (which ? momentum : params) + part[owner].first;
                NCCL_CHECK(ncclBroadcast(buf, buf, part[owner].count, ncclFloat32, owner, b->dist->nccl, stream));
            }
    }
    NCCL_CHECK(ncclGroupEnd());
}

void grad_buckets_gpu_free(GradBuckets *b) {
    free(b->peer_ranges);
    free(b->weights_due);
    free(b->owned);
    if (b->peer.on) peer_link_close(&b->peer);
    if (b->comm_buffer) CUDA_CHECK(cudaFree(b->comm_buffer));
    if (b->grads_ready) CUDA_CHECK(cudaEventDestroy(b->grads_ready));
    if (b->comm_done) CUDA_CHECK(cudaEventDestroy(b->comm_done));
}
