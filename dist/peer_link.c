#include "dist/peer_link.h"

#include <cuda.h>
#include <stdio.h>
#include <string.h>

#include "dist/dist_check.h"
#include "runtime/check.h"
#include "runtime/gpu.h"

/* The driver calls, looked up at run time (gpu_driver_entry). */
typedef CUresult (*write_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*address_range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*error_string_fn)(CUresult, const char **);

static write_value_fn write_value;
static wait_value_fn wait_value;
static address_range_fn address_range;
static error_string_fn error_string;

static void fail_driver(CUresult r, const char *call, const char *file, int line) {
    const char *s = "unknown error";
    if (error_string) error_string(r, &s);
    tc_fatal(file, line, "rank %d: %s failed: %s (CUresult %d)", dist_message_rank(), call, s, (int)r);
}
#define CU_CHECK(call) do { CUresult r_ = (call); \
    if (r_ != CUDA_SUCCESS) fail_driver(r_, #call, __FILE__, __LINE__); } while (0)

static int load_driver_calls(void) {
    return gpu_driver_entry("cuStreamWriteValue32", (void **)&write_value) &&
           gpu_driver_entry("cuStreamWaitValue32", (void **)&wait_value) &&
           gpu_driver_entry("cuMemGetAddressRange", (void **)&address_range) &&
           gpu_driver_entry("cuGetErrorString", (void **)&error_string);
}

/* Every rank's 'ok' and'ed; the first failing rank's reason goes to all. */
static int agree(Dist *d, int ok, char *why, size_t why_size) {
    int all = ok;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (all) return 1;
    int failing = ok ? d->world : d->rank, first = failing;
    MPI_CHECK(MPI_Allreduce(&failing, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    char reason[256];
    snprintf(reason, sizeof reason, "rank %d: %s", d->rank, why);
    MPI_CHECK(MPI_Bcast(reason, (int)sizeof reason, MPI_CHAR, first, MPI_COMM_WORLD));
    snprintf(why, why_size, "%s", reason);
    return 0;
}

static int cuda_ok(cudaError_t e, const char *what, char *why, size_t why_size) {
    if (e == cudaSuccess) return 1;
    cudaGetLastError();
    snprintf(why, why_size, "%s: %s", what, cudaGetErrorString(e));
    return 0;
}

/* The allocation holding 'inside': its base and size; 0 if the driver cannot say. */
static int allocation_of(const void *inside, char **base, size_t *bytes) {
    CUdeviceptr b = 0;
    if (address_range(&b, bytes, (CUdeviceptr)(uintptr_t)inside) != CUDA_SUCCESS) return 0;
    *base = (char *)(uintptr_t)b;
    return 1;
}

typedef struct {
    cudaIpcMemHandle_t sent, recv;
    size_t sent_offset; /* of 'sent' in the allocation the handle names */
} Handles;

/* This rank's IPC handles; 0 with the reason where the driver refuses. */
static int export_handles(PeerLink *p, Handles *h, char *why, size_t why_size) {
    char *base = NULL;
    size_t size = 0;
    if (!allocation_of(p->sent, &base, &size)) {
        snprintf(why, why_size, "the driver does not say which allocation holds the gradients");
        return 0;
    }
    h->sent_offset = (size_t)((char *)p->sent - base);
    return cuda_ok(cudaIpcGetMemHandle(&h->sent, base), "cudaIpcGetMemHandle", why, why_size) &&
           cuda_ok(cudaIpcGetMemHandle(&h->recv, p->recv), "cudaIpcGetMemHandle", why, why_size);
}

/* Where rank 'from's slot of recv, and its flags, lie on rank 'at': the other
 * ranks in rising order. */
static int slot_index(int at, int from) { return from < at ? from : from - 1; }

static int open_handle(void **mapped, cudaIpcMemHandle_t h, int r, const char *what, char *why, size_t why_size) {
    char call[96];
    snprintf(call, sizeof call, "cudaIpcOpenMemHandle (rank %d's %s)", r, what);
    return cuda_ok(cudaIpcOpenMemHandle(mapped, h, cudaIpcMemLazyEnablePeerAccess), call, why, why_size);
}

static int open_peer(PeerLink *p, int r, const Handles *h, char *why, size_t why_size) {
    if (!open_handle(&p->peer_sent_base[r], h->sent, r, "gradients", why, why_size) ||
        !open_handle(&p->peer_recv[r], h->recv, r, "receive buffer", why, why_size))
        return 0;
    p->peer_sent[r] = (char *)p->peer_sent_base[r] + h->sent_offset;
    p->peer_flags[r] = (uint32_t *)((char *)p->peer_recv[r] + (size_t)(p->world - 1) * p->slot_bytes);
    return 1;
}

static int open_peers(PeerLink *p, const Handles *all, char *why, size_t why_size) {
    for (int r = 0; r < p->world; r++)
        if (r != p->rank && !open_peer(p, r, &all[r], why, why_size)) return 0;
    return 1;
}

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

/* Whether the job is 2 to PEER_LINK_MAX_RANKS ranks, all on this host (the
 * same answer on every rank: each host's local_world falls short of world
 * unless one host holds them all). */
static int job_fits(const Dist *d, char *why, size_t why_size) {
    if (d->world != d->local_world)
        snprintf(why, why_size, "the job's %d ranks are on several hosts (%d on this one)", d->world, d->local_world);
    else if (d->world < 2 || d->world > PEER_LINK_MAX_RANKS)
        snprintf(why, why_size, "the job is %d ranks, not 2 to %d on one host", d->world, PEER_LINK_MAX_RANKS);
    else
        return 1;
    return 0;
}

/* Whether this rank's GPU reaches every other rank's; 0 with the reason. */
static int peer_access(const Dist *d, char *why, size_t why_size) {
    int devices[PEER_LINK_MAX_RANKS] = {0};
    MPI_CHECK(MPI_Allgather(&d->device, 1, MPI_INT, devices, 1, MPI_INT, MPI_COMM_WORLD));
    for (int r = 0; r < d->world; r++) {
        int can = 0;
        if (r == d->rank) continue;
        if (!cuda_ok(cudaDeviceCanAccessPeer(&can, d->device, devices[r]), "cudaDeviceCanAccessPeer", why, why_size))
            return 0;
        if (!can) {
            snprintf(why, why_size, "GPU %d has no peer access to GPU %d (rank %d's)", d->device, devices[r], r);
            return 0;
        }
    }
    return 1;
}

int peer_link_open(PeerLink *p, Dist *d, void *sent, size_t bytes, int n_flags, char *why,
                   size_t why_size) {
    memset(p, 0, sizeof *p);
    if (!job_fits(d, why, why_size)) return 0;
    p->sent = sent;
    p->n_flags = n_flags;
    p->rank = d->rank;
    p->world = d->world;
    int ok = peer_access(d, why, why_size);
    if (ok && !load_driver_calls()) {
        snprintf(why, why_size, "the driver lacks stream memory operations");
        ok = 0;
    }
    if (!agree(d, ok, why, why_size)) return 0;

    size_t others = (size_t)d->world - 1, flag_bytes = (size_t)n_flags * others * sizeof(uint32_t);
    p->slot_bytes = round_up(bytes, 256);
    CUDA_CHECK(cudaMalloc(&p->recv, others * p->slot_bytes + flag_bytes));
    p->flags = (uint32_t *)((char *)p->recv + others * p->slot_bytes);
    CUDA_CHECK(cudaMemset(p->flags, 0, flag_bytes));
    CUDA_CHECK(cudaDeviceSynchronize()); /* the flags are 0 before a peer may set one */

    Handles mine, all[PEER_LINK_MAX_RANKS];
    memset(&mine, 0, sizeof mine);
    ok = export_handles(p, &mine, why, why_size);
    MPI_CHECK(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD));
    if (agree(d, ok, why, why_size) && agree(d, open_peers(p, all, why, why_size), why, why_size)) {
        p->on = 1;
        return 1;
    }
    peer_link_close(p);
    return 0;
}

typedef struct {
    cudaIpcMemHandle_t handle;
    size_t bytes;
} RegionHandle;

/* Every peer's region mapped here; the gradients' allocation is open already
 * (a handle opens once per process). */
static int open_regions(PeerLink *p, const RegionHandle *all, char *why, size_t why_size) {
    char *sent_base = NULL;
    size_t sent_bytes = 0;
    if (!allocation_of(p->sent, &sent_base, &sent_bytes)) {
        snprintf(why, why_size, "the driver does not say which allocation holds the gradients");
        return 0;
    }
    for (int r = 0; r < p->world; r++) {
        if (r == p->rank) continue;
        if (p->region == sent_base) p->peer_region[r] = p->peer_sent_base[r];
        else if (!open_handle((void **)&p->peer_region[r], all[r].handle, r, "region", why, why_size)) return 0;
    }
    return 1;
}

int peer_link_map_region(PeerLink *p, Dist *d, void *inside, char *why, size_t why_size) {
    if (!p->on) {
        snprintf(why, why_size, "the peer link is not open");
        return 0;
    }
    RegionHandle mine, all[PEER_LINK_MAX_RANKS];
    memset(&mine, 0, sizeof mine);
    int ok = allocation_of(inside, &p->region, &p->region_bytes);
    if (!ok) snprintf(why, why_size, "the driver does not say which allocation holds %p", inside);
    mine.bytes = p->region_bytes;
    ok = ok && cuda_ok(cudaIpcGetMemHandle(&mine.handle, p->region), "cudaIpcGetMemHandle", why, why_size);
    MPI_CHECK(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD));
    for (int r = 0; r < p->world && ok; r++)
        if (all[r].bytes != p->region_bytes) {
            snprintf(why, why_size, "the ranks' allocations differ (%zu bytes here, %zu on rank %d)", p->region_bytes,
                     all[r].bytes, r);
            ok = 0;
        }
    if (!agree(d, ok, why, why_size)) return 0;
    return agree(d, open_regions(p, all, why, why_size), why, why_size);
}

void peer_link_close(PeerLink *p) {
    for (int r = 0; r < p->world; r++) {
        if (p->peer_region[r] && p->peer_region[r] != p->peer_sent_base[r])
            CUDA_CHECK(cudaIpcCloseMemHandle(p->peer_region[r]));
        if (p->peer_sent_base[r]) CUDA_CHECK(cudaIpcCloseMemHandle(p->peer_sent_base[r]));
        if (p->peer_recv[r]) CUDA_CHECK(cudaIpcCloseMemHandle(p->peer_recv[r]));
    }
    /* No rank frees what another still maps. */
    if (p->recv) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (p->recv) CUDA_CHECK(cudaFree(p->recv));
    memset(p, 0, sizeof *p);
}

static void check_peer(const PeerLink *p, int r) {
    if (!p->on || r < 0 || r >= p->world || r == p->rank)
        TC_FATAL("rank %d: peer link to rank %d of %d%s", dist_message_rank(), r, p->world,
                 p->on ? "" : " (link not open)");
}

void *peer_link_slot(const PeerLink *p, int from) {
    check_peer(p, from);
    return (char *)p->recv + (size_t)slot_index(p->rank, from) * p->slot_bytes;
}

void peer_link_put(PeerLink *p, int to, int to_sent, size_t at, size_t bytes, cudaStream_t stream) {
    check_peer(p, to);
    if (bytes == 0) return;
    char *dst = to_sent ? (char *)p->peer_sent[to]
                        : (char *)p->peer_recv[to] + (size_t)slot_index(to, p->rank) * p->slot_bytes;
    CUDA_CHECK(cudaMemcpyAsync(dst + at, (char *)p->sent + at, bytes, cudaMemcpyDefault, stream));
}

void peer_link_put_region(PeerLink *p, int to, const void *src, size_t bytes, cudaStream_t stream) {
    check_peer(p, to);
    if (bytes == 0) return;
    const char *from = src;
    if (!p->peer_region[to] || from < p->region || from + bytes > p->region + p->region_bytes)
        TC_FATAL("rank %d: peer link: %zu bytes at %p are outside the mapped region", dist_message_rank(), bytes,
                 src);
    CUDA_CHECK(cudaMemcpyAsync(p->peer_region[to] + (from - p->region), from, bytes, cudaMemcpyDefault, stream));
}

/* Flag 'flag' from rank 'from' among rank 'at's flags: flag by flag, the
 * other ranks in rising order within each. */
static size_t flag_index(const PeerLink *p, int at, int from, int flag) {
    check_peer(p, at == p->rank ? from : at);
    if (flag < 0 || flag >= p->n_flags)
        TC_FATAL("rank %d: peer link flag %d of %d", dist_message_rank(), flag, p->n_flags);
    return (size_t)flag * (size_t)(p->world - 1) + (size_t)slot_index(at, from);
}

void peer_link_signal(PeerLink *p, int to, int flag, cudaStream_t stream) {
    size_t at = flag_index(p, to, p->rank, flag); /* checks 'to' before it indexes */
    uint32_t *theirs = p->peer_flags[to] + at;
    CU_CHECK(write_value((CUstream)stream, (CUdeviceptr)(uintptr_t)theirs, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
}

void peer_link_wait(PeerLink *p, int from, int flag, cudaStream_t stream) {
    CUdeviceptr mine = (CUdeviceptr)(uintptr_t)(p->flags + flag_index(p, p->rank, from, flag));
    CU_CHECK(wait_value((CUstream)stream, mine, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_CHECK(write_value((CUstream)stream, mine, 0, CU_STREAM_WRITE_VALUE_DEFAULT));
}
