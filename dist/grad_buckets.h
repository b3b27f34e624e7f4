/* The gradient all-reduce of data-parallel training, in buckets that overlap
 * backward. The model keeps every parameter gradient in one flat buffer, and
 * backward makes them from the end of the buffer toward the start (layers in
 * reverse order). Buckets are contiguous ranges cut from the end backwards;
 * once backward says that everything from some index on is final, each bucket
 * lying wholly in that final part is averaged over the ranks on the comm
 * stream while backward goes on with the earlier layers.
 *
 * GPU path (dist_init_nccl made a communicator): grads on the device, f32, f16
 * or bf16; ncclAvg on Dist.comm_stream, forked from and joined back to the
 * compute stream with events. All of begin / ready / finish may be captured in
 * a CUDA graph on the compute stream: no host sync, no allocation after init.
 * With comm_dtype != dtype each bucket is cast into a comm buffer (allocated at
 * init, n elements of comm_dtype), averaged there and cast back: f32 grads sent
 * as f16/bf16 halve the traffic; half grads sent as f32 keep the sum exact.
 *
 * Copy engines (grad_buckets_use_peer_link, 2 to 8 ranks of one host): a
 * launch of at least min_bytes is averaged without NCCL. It is cut into one
 * part per rank; each rank puts every other rank's part into that rank's
 * memory (CUDA IPC, copy engines), averages its own part with what arrived (a
 * small kernel), and puts the result into every other rank's memory: the SMs
 * stay with backward. Smaller launches, where latency counts, stay on NCCL.
 *
 * Sharded optimizer (grad_buckets_shard_optimizer, on top of the copy
 * engines): the averaged part stays with its owner, which alone updates those
 * parameters and puts the updated weights into the other ranks' memory; each
 * rank waits for them just before its next forward pass reads them. Each
 * rank's optimizer work on those layers falls to 1 / world (ZeRO stage 1), and
 * the copy of the weights runs under the next forward pass instead of under
 * backward.
 *
 * CPU path (no communicator): grads are host floats (dtype and comm_dtype f32),
 * averaged with MPI_Allreduce synchronously inside ready and finish.
 *
 * Every rank must make the same calls with the same first_ready values, so
 * that the ranks launch the same buckets in the same order. The tests capture
 * a pass only after eager ones have run (NCCL connects lazily).
 *
 * World 1: everything is a no-op.
 *
 * A build without CUDA has the CPU path only: the calls about the peer link,
 * sharding and the found-inf flag (grad_buckets_use_peer_link through
 * grad_buckets_reduce_flag below) exist in CUDA builds only
 * (grad_buckets_gpu.c), and begin / ready / finish / free never touch a GPU. */
#ifndef TRAINC_DIST_GRAD_BUCKETS_H
#define TRAINC_DIST_GRAD_BUCKETS_H

#include <stddef.h>
#include <stdint.h>

#include "dist/dist.h"
#include "dist/peer_link.h"
#include "runtime/cuda_api.h"
#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t first; /* index of its first gradient */
    size_t count; /* gradients in it */
} GradBucket;

typedef struct {
    Dist *dist;
    void *grads;
    DType dtype, comm_dtype;
    size_t n;
    int on_device;          /* NCCL over device grads; else MPI over host floats */
    GradBucket *buckets;    /* buckets[0] ends at n and goes first; each next one ends
                               where the one before starts; none when world is 1 */
    int n_buckets;
    int launched;           /* buckets[0 .. launched-1] are launched in this pass */
    int in_pass;            /* between begin and finish */
    void *comm_buffer;      /* device, n elements of comm_dtype; NULL when no cast */
    cudaEvent_t grads_ready;/* recorded on compute, waited for on the comm stream */
    cudaEvent_t comm_done;  /* recorded on the comm stream, waited for on compute */
    size_t step_bytes;      /* all-reduced per step, in comm_dtype (0 in world 1) */
    size_t pass_bytes;      /* launched so far in this pass */
    PeerLink peer;          /* copy engines; off: NCCL only */
    size_t peer_min_bytes;  /* launches this large or larger go through the peer link */
    int peer_launches;      /* through the peer link in this pass (its flag pairs) */
    int32_t *flag;          /* device, or NULL: max-reduced over the ranks in each pass */
    int flag_reduced;       /* in this pass */
    /* grad_buckets_shard_optimizer: */
    int shard;
    void *weights;          /* what forward reads, n elements of weights_dtype */
    DType weights_dtype;
    GradBucket *peer_ranges;/* per launch through the peer link, as made in the first pass */
    int n_peer_ranges;
    uint8_t *weights_due;   /* per peer launch and rank (k * world + r): rank r's part of its
                               weights is on its way */
    int weights_new;        /* this rank updated its parts since it last sent them */
    GradBucket *owned;      /* [0, n) less the other ranks' parts, rising: what this rank updates */
    int n_owned;
} GradBuckets;

/* Cuts grads (n elements of dtype) into buckets of about bucket_bytes of
 * comm_dtype each (0: one bucket); makes the comm buffer and events. Logs the
 * per-step volume on rank 0. Needs dist_init_nccl first for the GPU path. */
void grad_buckets_init(GradBuckets *b, Dist *d, void *grads, DType dtype, size_t n,
                       size_t bucket_bytes, DType comm_dtype);
/* The same, with buckets that never cross a boundary (sorted, rising: where
 * the layers' gradients start, the first_ready values backward will report)
 * unless a layer alone is larger than a bucket. */
void grad_buckets_init_layers(GradBuckets *b, Dist *d, void *grads, DType dtype, size_t n,
                              size_t bucket_bytes, DType comm_dtype, const size_t *boundaries,
                              int n_boundaries);
/* Launches of at least min_bytes (of comm_dtype) go through the copy engines
 * (see above). Collective; returns 1 when the link is made, else 0 with the
 * reason in 'why' (the job is not 2 to 8 ranks of one host, some pair of GPUs
 * has no peer access, ...). */
int grad_buckets_use_peer_link(GradBuckets *b, size_t min_bytes, char *why, size_t why_size);
/* Collective, after grad_buckets_use_peer_link: each rank updates only the
 * parameters it owns (see above). 'weights' is what forward reads (n elements
 * of weights_dtype: the half copy under AMP, else the master weights) and must
 * lie in an allocation laid out alike on every rank. The flag of
 * grad_buckets_reduce_flag then also says whether any averaged gradient is inf
 * or NaN: each rank checks the parts it averages through the copy engines
 * (in the averaging kernel) and its own values of what NCCL averages, and the
 * flag is max-reduced with the pass's last launch. The optimizer needs no
 * check of its own. Returns 1, or 0 with the reason in 'why'. */
int grad_buckets_shard_optimizer(GradBuckets *b, void *weights, DType weights_dtype, char *why,
                                 size_t why_size);
/* Sharded, after grad_buckets_finish: the ranges this rank updates, rising. */
const GradBucket *grad_buckets_owned(const GradBuckets *b, int *n);
/* Sharded, after the update (host bookkeeping): the weights this rank owns
 * are new, to be sent by grad_buckets_send_weights. */
void grad_buckets_weights_updated(GradBuckets *b);
/* Sharded, at the start of the next step's forward pass: puts the weights
 * this rank updated into the other ranks' memory, on the comm stream forked
 * off 'compute' (the forward pass goes on meanwhile), once per update. Join
 * the comm stream with grad_buckets_join or grad_buckets_finish. */
void grad_buckets_send_weights(GradBuckets *b, cudaStream_t compute);
/* Sharded: 'stream' waits for the other ranks' weights in [first, end), where
 * they are due (forward, before the layer that reads them). */
void grad_buckets_await_weights(GradBuckets *b, size_t first, size_t end, cudaStream_t stream);
/* 'compute' waits for everything on the comm stream so far. */
void grad_buckets_join(GradBuckets *b, cudaStream_t compute);
/* Sharded, collective, outside a step: every rank gets the whole state (the
 * weights updated by the other ranks, and what each owner alone updated: the
 * n_state buffers of n floats in state, the master weights and the optimizer's
 * state, such as momentum), for a checkpoint, an evaluation or the run's end.
 * Ordered on 'stream'. The next step sends the weights once more, as a step
 * captured in a CUDA graph does anyway. Not sharded: nothing. */
void grad_buckets_sync_state(GradBuckets *b, float *const *state, int n_state, cudaStream_t stream);
/* A device int32 max-reduced over the ranks in every pass, with its first
 * launch (sharded: its last), under backward: the loss scaler's found-inf flag.
 * It must be final on 'compute' at the pass's first grad_buckets_ready and left
 * alone until grad_buckets_finish. */
void grad_buckets_reduce_flag(GradBuckets *b, int32_t *flag);
/* A backward pass starts: nothing of it is launched yet. */
void grad_buckets_begin(GradBuckets *b);
/* Every gradient at index >= first_ready is final (ordered on 'compute'):
 * launches each bucket lying wholly in [first_ready, n) not launched yet, all
 * in one NCCL group. */
void grad_buckets_ready(GradBuckets *b, size_t first_ready, cudaStream_t compute);
/* Launches what is left, then makes 'compute' wait for the comm stream: after
 * it, work on 'compute' sees the averaged gradients. */
void grad_buckets_finish(GradBuckets *b, cudaStream_t compute);
void grad_buckets_free(GradBuckets *b);

/* Bytes each rank sends per step by a ring all-reduce: 2 (world - 1) / world
 * of step_bytes. */
double grad_buckets_wire_bytes(const GradBuckets *b);

#ifdef __cplusplus
}
#endif
#endif
