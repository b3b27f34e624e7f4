/* The NCCL side of dist.h (CUDA builds only). */
#include "dist/dist.h"

#include <string.h>

#include "dist/dist_check.h"
#include "runtime/check.h"
#include "runtime/log.h"

void dist_fail_nccl(ncclResult_t err, const char *call, const char *file, int line) {
    const char *last = ncclGetLastError(NULL);
    tc_fatal(file, line, "rank %d: %s failed: %s%s%s", dist_message_rank(), call, ncclGetErrorString(err),
             last && *last ? ": " : "", last ? last : "");
}

void dist_init_nccl(Dist *d, int device) {
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (device < 0 || device >= devices)
        TC_FATAL("rank %d: GPU %d asked for but %d visible (%d ranks on this host): start at "
                 "most one rank per GPU", d->rank, device, devices, d->local_world);
    CUDA_CHECK(cudaSetDevice(device));
    d->device = device;
    if (d->world == 1) return;

    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (d->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    NCCL_CHECK(ncclCommInitRank(&d->nccl, d->world, id, d->rank));

    /* Gradient all-reduces overlap backward; the highest priority keeps them
     * from queueing behind the compute kernels. */
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&d->comm_stream, cudaStreamNonBlocking, greatest));
    int version = 0;
    NCCL_CHECK(ncclGetVersion(&version)); /* major * 10000 + minor * 100 + patch */
    if (d->rank == 0)
        log_info("nccl %d.%d.%d: %d ranks, rank 0 on GPU %d", version / 10000, version / 100 % 100,
                 version % 100, d->world, device);
}

void dist_nccl_destroy(Dist *d) {
    if (d->nccl) NCCL_CHECK(ncclCommDestroy(d->nccl));
    if (d->comm_stream) CUDA_CHECK(cudaStreamDestroy(d->comm_stream));
    d->nccl = NULL;
    d->comm_stream = NULL;
}

void dist_allreduce_sum_double_device(Dist *d, double *dev, int n, cudaStream_t stream) {
    if (d->world == 1 || n == 0) return;
    if (!d->nccl) TC_FATAL("rank %d: dist_allreduce_sum_double_device before dist_init_nccl", d->rank);
    NCCL_CHECK(ncclAllReduce(dev, dev, (size_t)n, ncclFloat64, ncclSum, d->nccl, stream));
}
