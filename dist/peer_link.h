/* The ranks of one host (2 to 8) writing into each other's GPU memory, for
 * averaging gradients without NCCL's kernels (dist.copy_engine). CUDA IPC maps
 * the peers' buffers here, the copy engines move the data (taking no SMs from
 * backward's kernels), and the driver's stream memory operations carry the
 * "it has landed" flags. Everything is ordered on one stream, with no host
 * sync, and may be captured in a CUDA graph.
 *
 * Each rank gives a 'sent' buffer (where its gradients are averaged); the link
 * adds a 'recv' buffer of world - 1 slots, one per other rank, each as large as
 * 'sent' (rounded up to 256 bytes), where that rank's values land at the same
 * offsets as in 'sent', so that sources never overwrite each other. Flags come
 * n_flags per other rank: flag f from rank s is set to 1 by s (signal) and
 * waited for and reset to 0 by its owner (wait); each one must be signalled
 * once and waited for once per use, in the same order on both ranks. */
#ifndef TRAINC_DIST_PEER_LINK_H
#define TRAINC_DIST_PEER_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "dist/dist.h"
#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most ranks a link joins: the GPUs of one host. */
#define PEER_LINK_MAX_RANKS 8

typedef struct {
    int on;
    int rank, world;
    void *sent;                /* local, as given */
    void *recv;                /* local: world - 1 slots, what the others put lands here */
    size_t slot_bytes;         /* one slot of recv: the bytes of 'sent', rounded up to 256 */
    uint32_t *flags;           /* local, after recv in the same allocation */
    /* Per rank (this rank's entries unused), mapped here: */
    void *peer_sent[PEER_LINK_MAX_RANKS], *peer_recv[PEER_LINK_MAX_RANKS]; /* peer_recv as opened */
    uint32_t *peer_flags[PEER_LINK_MAX_RANKS];      /* after peer_recv's slots */
    void *peer_sent_base[PEER_LINK_MAX_RANKS];      /* the allocation holding peer_sent, as opened */
    char *peer_region[PEER_LINK_MAX_RANKS];         /* peer_link_map_region: the peers' allocations */
    char *region;                                   /* and the local one */
    size_t region_bytes;
    int n_flags;                                    /* per other rank */
} PeerLink;

/* Collective over every rank: links this rank's 'sent' (bytes, device memory)
 * to every other rank's. Returns 1 when linked; 0, with the link off and the
 * reason in 'why', where it cannot be: the job is one rank or more than
 * PEER_LINK_MAX_RANKS, the ranks are on several hosts, some pair of GPUs has
 * no peer access, the driver lacks stream memory operations or refuses IPC.
 * Every rank gets the same answer. */
int peer_link_open(PeerLink *p, Dist *d, void *sent, size_t bytes, int n_flags, char *why,
                   size_t why_size);
/* Collective, after the last use on every rank: unmaps the peers' buffers and
 * frees this rank's (the callers' 'sent' buffers may be freed after it). */
void peer_link_close(PeerLink *p);
/* The slot of recv where rank 'from' puts its values. */
void *peer_link_slot(const PeerLink *p, int from);
/* Copies 'bytes' from byte offset 'at' of the local sent buffer to the same
 * offset of rank 'to's recv slot for this rank (to_sent 0) or of its sent
 * buffer (to_sent 1). */
void peer_link_put(PeerLink *p, int to, int to_sent, size_t at, size_t bytes, cudaStream_t stream);
/* Collective: maps every other rank's allocation that holds the counterpart of
 * 'inside' (a pointer into a local cudaMalloc; the peers' allocations must be
 * as large, and their buffers at the same offsets: the same model on each
 * rank). Returns 1, or 0 with the reason in 'why'; every rank gets the same
 * answer. */
int peer_link_map_region(PeerLink *p, Dist *d, void *inside, char *why, size_t why_size);
/* Copies 'bytes' from 'src' (inside the mapped region) to the same offset of
 * rank 'to's region. */
void peer_link_put_region(PeerLink *p, int to, const void *src, size_t bytes, cudaStream_t stream);
/* Sets flag 'flag' from this rank on rank 'to', after everything before it on
 * 'stream' (a memory fence precedes the write). */
void peer_link_signal(PeerLink *p, int to, int flag, cudaStream_t stream);
/* Holds 'stream' until rank 'from' has set this rank's flag 'flag' from it,
 * then resets it. */
void peer_link_wait(PeerLink *p, int from, int flag, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
