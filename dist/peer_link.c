#include "dist/peer_link.h"

#include <cuda.h>
#include <stdio.h>
#include <string.h>

#include "dist/dist_check.h"
#include "runtime/check.h"

/* The driver calls, looked up at run time: linking libcuda would make every
 * program fail to start on a machine without a GPU driver (CI). */
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

static int driver_entry(const char *name, void **fn) {
    enum cudaDriverEntryPointQueryResult status;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &status);
    if (e != cudaSuccess) cudaGetLastError();
    return e == cudaSuccess && status == cudaDriverEntryPointSuccess && *fn;
}

static int load_driver_calls(void) {
    return driver_entry("cuStreamWriteValue32", (void **)&write_value) &&
           driver_entry("cuStreamWaitValue32", (void **)&wait_value) &&
           driver_entry("cuMemGetAddressRange", (void **)&address_range) &&
           driver_entry("cuGetErrorString", (void **)&error_string);
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

static int open_peer(PeerLink *p, const Handles *h, size_t recv_bytes, char *why, size_t why_size) {
    if (!cuda_ok(cudaIpcOpenMemHandle(&p->peer_sent_base, h->sent, cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle (the peer's gradients)", why, why_size))
        return 0;
    if (!cuda_ok(cudaIpcOpenMemHandle(&p->peer_recv, h->recv, cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle (the peer's receive buffer)", why, why_size))
        return 0;
    p->peer_sent = (char *)p->peer_sent_base + h->sent_offset;
    p->peer_flags = (uint32_t *)((char *)p->peer_recv + recv_bytes);
    return 1;
}

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

int peer_link_open(PeerLink *p, Dist *d, void *sent, size_t bytes, int n_flags, char *why,
                   size_t why_size) {
    memset(p, 0, sizeof *p);
    p->sent = sent;
    p->n_flags = n_flags;
    if (d->world != 2 || d->local_world != 2) {
        snprintf(why, why_size, "the job is %d ranks, %d on this host, not 2 on one host", d->world,
                 d->local_world);
        return 0;
    }
    int devices[2] = {0, 0};
    MPI_CHECK(MPI_Allgather(&d->device, 1, MPI_INT, devices, 1, MPI_INT, MPI_COMM_WORLD));
    int peer_device = devices[1 - d->rank], can = 0;
    int ok = cuda_ok(cudaDeviceCanAccessPeer(&can, d->device, peer_device), "cudaDeviceCanAccessPeer", why,
                     why_size);
    if (ok && !can) snprintf(why, why_size, "GPU %d has no peer access to GPU %d", d->device, peer_device);
    ok = ok && can;
    if (ok && !load_driver_calls()) {
        snprintf(why, why_size, "the driver lacks stream memory operations");
        ok = 0;
    }
    if (!agree(d, ok, why, why_size)) return 0;

    size_t recv_bytes = round_up(bytes, 256);
    CUDA_CHECK(cudaMalloc(&p->recv, recv_bytes + (size_t)n_flags * sizeof(uint32_t)));
    p->flags = (uint32_t *)((char *)p->recv + recv_bytes);
    CUDA_CHECK(cudaMemset(p->flags, 0, (size_t)n_flags * sizeof(uint32_t)));
    CUDA_CHECK(cudaDeviceSynchronize()); /* the flags are 0 before the peer may set one */

    Handles mine, theirs[2];
    memset(&mine, 0, sizeof mine);
    ok = export_handles(p, &mine, why, why_size);
    MPI_CHECK(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, theirs, (int)sizeof mine, MPI_BYTE,
                            MPI_COMM_WORLD));
    if (agree(d, ok, why, why_size) &&
        agree(d, open_peer(p, &theirs[1 - d->rank], recv_bytes, why, why_size), why, why_size)) {
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

int peer_link_map_region(PeerLink *p, Dist *d, void *inside, char *why, size_t why_size) {
    if (!p->on) {
        snprintf(why, why_size, "the peer link is not open");
        return 0;
    }
    RegionHandle mine, theirs[2];
    memset(&mine, 0, sizeof mine);
    int ok = allocation_of(inside, &p->region, &p->region_bytes);
    if (!ok) snprintf(why, why_size, "the driver does not say which allocation holds %p", inside);
    mine.bytes = p->region_bytes;
    ok = ok && cuda_ok(cudaIpcGetMemHandle(&mine.handle, p->region), "cudaIpcGetMemHandle", why, why_size);
    MPI_CHECK(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, theirs, (int)sizeof mine, MPI_BYTE,
                            MPI_COMM_WORLD));
    const RegionHandle *peer = &theirs[1 - d->rank];
    if (ok && peer->bytes != p->region_bytes) {
        snprintf(why, why_size, "the ranks' allocations differ (%zu and %zu bytes)", p->region_bytes, peer->bytes);
        ok = 0;
    }
    if (!agree(d, ok, why, why_size)) return 0;
    /* The gradients' allocation is open already (a handle opens once per process). */
    char *sent_base = NULL;
    size_t sent_bytes = 0;
    ok = allocation_of(p->sent, &sent_base, &sent_bytes);
    if (!ok) snprintf(why, why_size, "the driver does not say which allocation holds the gradients");
    if (ok && p->region == sent_base) p->peer_region = p->peer_sent_base;
    else if (ok)
        ok = cuda_ok(cudaIpcOpenMemHandle((void **)&p->peer_region, peer->handle, cudaIpcMemLazyEnablePeerAccess),
                     "cudaIpcOpenMemHandle (the peer's region)", why, why_size);
    return agree(d, ok, why, why_size);
}

void peer_link_close(PeerLink *p) {
    if (p->peer_region && p->peer_region != p->peer_sent_base) CUDA_CHECK(cudaIpcCloseMemHandle(p->peer_region));
    if (p->peer_sent_base) CUDA_CHECK(cudaIpcCloseMemHandle(p->peer_sent_base));
    if (p->peer_recv) CUDA_CHECK(cudaIpcCloseMemHandle(p->peer_recv));
    /* Neither rank frees what the other still maps. */
    if (p->recv) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (p->recv) CUDA_CHECK(cudaFree(p->recv));
    memset(p, 0, sizeof *p);
}

void peer_link_put(PeerLink *p, int to_sent, size_t at, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return;
    char *to = (char *)(to_sent ? p->peer_sent : p->peer_recv) + at;
    CUDA_CHECK(cudaMemcpyAsync(to, (char *)p->sent + at, bytes, cudaMemcpyDefault, stream));
}

void peer_link_put_region(PeerLink *p, const void *src, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return;
    const char *from = src;
    if (!p->peer_region || from < p->region || from + bytes > p->region + p->region_bytes)
        TC_FATAL("rank %d: peer link: %zu bytes at %p are outside the mapped region", dist_message_rank(), bytes,
                 src);
    CUDA_CHECK(cudaMemcpyAsync(p->peer_region + (from - p->region), from, bytes, cudaMemcpyDefault, stream));
}

static void check_flag(const PeerLink *p, int flag) {
    if (!p->on || flag < 0 || flag >= p->n_flags)
        TC_FATAL("rank %d: peer link flag %d of %d%s", dist_message_rank(), flag, p->n_flags,
                 p->on ? "" : " (link not open)");
}

void peer_link_signal(PeerLink *p, int flag, cudaStream_t stream) {
    check_flag(p, flag);
    CU_CHECK(write_value((CUstream)stream, (CUdeviceptr)(uintptr_t)(p->peer_flags + flag), 1,
                         CU_STREAM_WRITE_VALUE_DEFAULT));
}

void peer_link_wait(PeerLink *p, int flag, cudaStream_t stream) {
    check_flag(p, flag);
    CUdeviceptr mine = (CUdeviceptr)(uintptr_t)(p->flags + flag);
    CU_CHECK(wait_value((CUstream)stream, mine, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_CHECK(write_value((CUstream)stream, mine, 0, CU_STREAM_WRITE_VALUE_DEFAULT));
}

