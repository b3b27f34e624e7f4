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
     * for the weights (grad_buckets_shard_optimizer), from each other rank. */
    if (!peer_link_open(&b->peer, b->dist, sent, b->n * dtype_size(b->comm_dtype), 3 * b->n_buckets, why,
                        why_size))
        return 0;
    b->peer_min_bytes = min_bytes;
    if (b->dist->rank == 0)
        log_info("grad buckets: launches of %.3f MiB or more averaged through the copy engines (CUDA IPC "
                 "between the %d GPUs), smaller ones by NCCL", mib((double)min_bytes), b->dist->world);
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
    b->weights_due = calloc((size_t)b->n_buckets * (size_t)b->dist->world, 1);
    /* Per launch its own part and the NCCL range before it, and the one after the last. */
    b->owned = calloc(2 * (size_t)b->n_buckets + 1, sizeof *b->owned);
    if (!b->peer_ranges || !b->weights_due || !b->owned) TC_FATAL("grad buckets: out of memory");
    b->weights = weights;
    b->weights_dtype = weights_dtype;
    b->shard = 1;
    if (b->dist->rank == 0)
        log_info("grad buckets: sharded optimizer: each rank updates its part (1/%d) of what the copy engines "
                 "average and sends the others its weights", b->dist->world);
    return 1;
}

void grad_buckets_reduce_flag(GradBuckets *b, int32_t *flag) { b->flag = flag; }

static void *element(void *base, DType t, size_t i) { return (char *)base + i * dtype_size(t); }

/* The parts of a launch through the peer link start at multiples of this many
 * elements from the launch's first: whole 16-byte vectors in every dtype. */
#define PART_ALIGN 64

/* A launch through the peer link is cut into world parts, rank r owning part
 * r: each ceil(count / world) rounded up to PART_ALIGN, the last up to the
 * launch's end. A launch too short for that leaves the last parts empty
 * (count 0, at the launch's end); every rank cuts alike. */
static GradBucket part_of(const GradBuckets *b, GradBucket launch, int r) {
    size_t world = (size_t)b->dist->world, unit = world * PART_ALIGN;
    size_t step = (launch.count + unit - 1) / unit * PART_ALIGN;
    size_t from = (size_t)r * step, to = from + step;
    if (from > launch.count) from = launch.count;
    if (to > launch.count || r == b->dist->world - 1) to = launch.count;
    return (GradBucket){launch.first + from, to - from};
}

/* The other ranks from this one on, wrapping: the i-th (1 <= i < world).
 * Each rank starts with its successor, so they do not all put to rank 0 first. */
static int next_rank(const GradBuckets *b, int i) { return (b->dist->rank + i) % b->dist->world; }

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

/* Reduce-scatter of launch k through the peer link (flag 2k): rank r puts part
 * j of its sent buffer into rank j's receive slot for r, then signals j; each
 * rank waits for the others' flags and averages its own part with what
 * arrived. An empty part is neither put, signalled nor waited for. */
static void reduce_part(GradBuckets *b, GradBucket launch, int flag, cudaStream_t comm) {
    PeerLink *p = &b->peer;
    size_t esize = dtype_size(b->comm_dtype);
    for (int i = 1; i < b->dist->world; i++) {
        int to = next_rank(b, i);
        GradBucket theirs = part_of(b, launch, to);
        if (theirs.count == 0) continue;
        peer_link_put(p, to, 0, theirs.first * esize, theirs.count * esize, comm);
        peer_link_signal(p, to, flag, comm);
    }
    GradBucket mine = part_of(b, launch, b->dist->rank);
    if (mine.count == 0) return;
    for (int i = 1; i < b->dist->world; i++) peer_link_wait(p, next_rank(b, i), flag, comm);
    /* The slots are in rising rank order, slot_bytes apart, each laid out as 'sent'. */
    int first_other = b->dist->rank == 0 ? 1 : 0;
    grad_average_cuda(b->comm_dtype, element(p->sent, b->comm_dtype, mine.first),
                      element(peer_link_slot(p, first_other), b->comm_dtype, mine.first), p->slot_bytes,
                      b->dist->world - 1, mine.count, b->shard ? b->flag : NULL, comm);
}

/* All-gather of launch k (flag 2k + 1): each rank puts its averaged part into
 * every other rank's sent buffer and signals it; each waits for the owners of
 * the other non-empty parts. */
static void gather_parts(GradBuckets *b, GradBucket launch, int flag, cudaStream_t comm) {
    PeerLink *p = &b->peer;
    size_t esize = dtype_size(b->comm_dtype);
    GradBucket mine = part_of(b, launch, b->dist->rank);
    for (int i = 1; i < b->dist->world && mine.count > 0; i++) {
        int to = next_rank(b, i);
        peer_link_put(p, to, 1, mine.first * esize, mine.count * esize, comm);
        peer_link_signal(p, to, flag, comm);
    }
    for (int i = 1; i < b->dist->world; i++) {
        int from = next_rank(b, i);
        if (part_of(b, launch, from).count > 0) peer_link_wait(p, from, flag, comm);
    }
}

/* [first, first + count) of the sent buffer averaged over the ranks through
 * the peer link: reduce-scatter, then (unless sharded: each owner keeps its
 * part) all-gather. */
static void average_with_peers(GradBuckets *b, size_t first, size_t count, cudaStream_t comm) {
    GradBucket launch = {first, count};
    int k = b->peer_launches++;
    if (b->shard) record_peer_range(b, k, launch);
    reduce_part(b, launch, 2 * k, comm);
    if (!b->shard) gather_parts(b, launch, 2 * k + 1, comm);
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
    if (by_peer) average_with_peers(b, first, end - first, comm);
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

/* Appends [from, to) to the owned ranges, joined to the last where they touch. */
static void own(GradBuckets *b, size_t from, size_t to) {
    if (to <= from) return;
    GradBucket *last = b->n_owned > 0 ? &b->owned[b->n_owned - 1] : NULL;
    if (last && last->first + last->count == from) last->count += to - from;
    else b->owned[b->n_owned++] = (GradBucket){from, to - from};
}

/* What NCCL averages and this rank's part of each peer launch, rising (the
 * launches came from the end of the buffer backwards). */
static void find_owned(GradBuckets *b) {
    size_t at = 0;
    b->n_owned = 0;
    for (int k = b->n_peer_ranges - 1; k >= 0; k--) {
        GradBucket launch = b->peer_ranges[k], mine = part_of(b, launch, b->dist->rank);
        own(b, at, launch.first);
        own(b, mine.first, mine.first + mine.count);
        at = launch.first + launch.count;
    }
    own(b, at, b->n);
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

/* This rank's part of every peer launch, updated, to every other rank. */
static void put_weights(GradBuckets *b, cudaStream_t stream) {
    size_t esize = dtype_size(b->weights_dtype);
    for (int k = 0; k < b->n_peer_ranges; k++) {
        GradBucket mine = part_of(b, b->peer_ranges[k], b->dist->rank);
        for (int i = 1; i < b->dist->world && mine.count > 0; i++) {
            int to = next_rank(b, i);
            peer_link_put_region(&b->peer, to, element(b->weights, b->weights_dtype, mine.first),
                                 mine.count * esize, stream);
            peer_link_signal(&b->peer, to, weights_flag(b, k), stream);
        }
    }
}

void grad_buckets_send_weights(GradBuckets *b, cudaStream_t compute) {
    if (!b->weights_new) return;
    CUDA_CHECK(cudaEventRecord(b->grads_ready, compute));
    CUDA_CHECK(cudaStreamWaitEvent(b->dist->comm_stream, b->grads_ready, 0));
    put_weights(b, b->dist->comm_stream);
    /* The other ranks updated their parts in the same step and send them now too. */
    memset(b->weights_due, 1, (size_t)b->n_peer_ranges * (size_t)b->dist->world);
    b->weights_new = 0;
}

/* Whether rank 'owner's part of peer launch k comes from another rank and
 * holds something of [first, end). */
static int part_from_peer(const GradBuckets *b, int k, int owner, size_t first, size_t end) {
    GradBucket part = part_of(b, b->peer_ranges[k], owner);
    return owner != b->dist->rank && part.count > 0 && part.first < end && part.first + part.count > first;
}

void grad_buckets_await_weights(GradBuckets *b, size_t first, size_t end, cudaStream_t stream) {
    for (int k = 0; k < b->n_peer_ranges && b->shard; k++)
        for (int owner = 0; owner < b->dist->world; owner++) {
            uint8_t *due = &b->weights_due[(size_t)k * (size_t)b->dist->world + (size_t)owner];
            if (!*due || !part_from_peer(b, k, owner, first, end)) continue;
            peer_link_wait(&b->peer, owner, weights_flag(b, k), stream);
            *due = 0;
        }
}

void grad_buckets_join(GradBuckets *b, cudaStream_t compute) {
    CUDA_CHECK(cudaEventRecord(b->comm_done, b->dist->comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(compute, b->comm_done, 0));
}

void grad_buckets_sync_state(GradBuckets *b, float *const *state, int n_state, cudaStream_t stream) {
    if (!b->shard) return;
    put_weights(b, stream);
    for (int k = 0; k < b->n_peer_ranges; k++)
        for (int owner = 0; owner < b->dist->world; owner++)
            if (part_from_peer(b, k, owner, 0, b->n)) peer_link_wait(&b->peer, owner, weights_flag(b, k), stream);
    NCCL_CHECK(ncclGroupStart());
    for (int k = 0; k < b->n_peer_ranges; k++)
        for (int owner = 0; owner < b->dist->world; owner++) {
            GradBucket part = part_of(b, b->peer_ranges[k], owner);
            for (int which = 0; which < n_state && part.count > 0; which++) {
                float *buf = state[which] + part.first;
                NCCL_CHECK(ncclBroadcast(buf, buf, part.count, ncclFloat32, owner, b->dist->nccl, stream));
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
