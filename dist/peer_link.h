/* Two ranks of one host that write into each other's GPU memory, for
 * averaging gradients without NCCL's kernels (dist.copy_engine). CUDA IPC maps
 * the peer's buffers here, the copy engines move the data (taking no SMs from
 * backward's kernels), and the driver's stream memory operations carry the
 * "it has landed" flags. Everything is ordered on one stream, with no host
 * sync, and may be captured in a CUDA graph.
 *
 * Each rank gives a 'sent' buffer (where its gradients are averaged); the link
 * adds a 'recv' buffer of the same size, where the peer's values land at the
 * same offsets, and n_flags flags. A flag is set to 1 by the peer (signal) and
 * waited for and reset to 0 by its owner (wait): each one must be signalled
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

typedef struct {
    int on;
    void *sent;                /* local, as given */
    void *recv;                /* local: what the peer puts lands here */
    uint32_t *flags;           /* local, after recv in the same allocation */
    void *peer_sent, *peer_recv; /* the peer's, mapped here (peer_recv as opened) */
    uint32_t *peer_flags;        /* after peer_recv */
    void *peer_sent_base;        /* the allocation holding peer_sent, as opened */
    char *region, *peer_region;  /* peer_link_map_region: the local allocation and the peer's */
    size_t region_bytes;
    int n_flags;
} PeerLink;

/* Collective over the 2 ranks: links this rank's 'sent' (bytes, device memory)
 * to the other rank's. Returns 1 when linked; 0, with the link off and the
 * reason in 'why', where it cannot be: world is not 2, the ranks are on
 * different hosts, the GPUs have no peer access, the driver lacks stream
 * memory operations or refuses IPC. Both ranks get the same answer. */
int peer_link_open(PeerLink *p, Dist *d, void *sent, size_t bytes, int n_flags, char *why,
                   size_t why_size);
/* Collective, after the last use on both ranks: unmaps the peer's buffers and
 * frees this rank's (the callers' 'sent' buffers may be freed after it). */
void peer_link_close(PeerLink *p);
/* Copies 'bytes' from byte offset 'at' of the local sent buffer to the same
 * offset of the peer's recv buffer (to_sent 0) or sent buffer (to_sent 1). */
void peer_link_put(PeerLink *p, int to_sent, size_t at, size_t bytes, cudaStream_t stream);
/* Collective: maps the peer's allocation that holds the counterpart of
 * 'inside' (a pointer into a local cudaMalloc; the peer's allocation must be as
 * large, and its buffers at the same offsets: the same model on each rank).
 * Returns 1, or 0 with the reason in 'why'; both ranks get the same answer. */
int peer_link_map_region(PeerLink *p, Dist *d, void *inside, char *why, size_t why_size);
/* Copies 'bytes' from 'src' (inside the mapped region) to the same offset of
 * the peer's region. */
void peer_link_put_region(PeerLink *p, const void *src, size_t bytes, cudaStream_t stream);
/* Sets the peer's flag, after everything before it on 'stream' (a memory fence
 * precedes the write). */
void peer_link_signal(PeerLink *p, int flag, cudaStream_t stream);
/* Holds 'stream' until the peer has set this rank's flag, then resets it. */
void peer_link_wait(PeerLink *p, int flag, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
