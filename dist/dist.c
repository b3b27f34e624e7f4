#include "dist/dist.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_check.h"
#include "runtime/check.h"
#include "runtime/log.h"

/* Process-wide, for the failure paths, which have no Dist at hand. */
static int message_rank = -1;
static int message_world;
static int abort_armed; /* MPI is up: a fatal error aborts the job */

int dist_message_rank(void) { return message_rank; }

void dist_fail_mpi(int err, const char *call, const char *file, int line) {
    char what[MPI_MAX_ERROR_STRING] = "unknown MPI error";
    int len = 0;
    if (MPI_Error_string(err, what, &len) != MPI_SUCCESS) snprintf(what, sizeof what, "error %d", err);
    tc_fatal(file, line, "rank %d: %s failed: %s", message_rank, call, what);
}

void dist_fail_nccl(ncclResult_t err, const char *call, const char *file, int line) {
    const char *last = ncclGetLastError(NULL);
    tc_fatal(file, line, "rank %d: %s failed: %s%s%s", message_rank, call, ncclGetErrorString(err),
             last && *last ? ": " : "", last ? last : "");
}

/* tc_fatal's hook: the message is out; take every other rank down with this one. */
static void abort_all_ranks(void) {
    if (!abort_armed) return;
    abort_armed = 0;
    fprintf(stderr, "trainc: rank %d of %d failed: stopping every rank\n", message_rank,
            message_world);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Did mpirun or srun start us as one of several tasks? */
static int launched_by_mpi(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK")) return 1;
    const char *tasks = getenv("SLURM_NTASKS");
    return tasks && atoi(tasks) > 1 && getenv("SLURM_PROCID");
}

/* The number of tasks the launcher says it started; 0 when it does not say. */
static int launcher_world(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return 0;
}

static void start_mpi(Dist *d) {
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
        int provided = 0;
        MPI_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided));
        d->mpi = 1;
        if (provided < MPI_THREAD_FUNNELED)
            TC_FATAL("MPI gives thread level %d, trainc needs MPI_THREAD_FUNNELED", provided);
    }
    abort_armed = 1;
    tc_on_fatal(abort_all_ranks);
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &d->world));
    message_rank = d->rank;
    message_world = d->world;

    MPI_Comm host;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL,
                                  &host));
    MPI_CHECK(MPI_Comm_rank(host, &d->local_rank));
    MPI_CHECK(MPI_Comm_size(host, &d->local_world));
    MPI_CHECK(MPI_Comm_free(&host));
}

void dist_init_solo(Dist *d) {
    memset(d, 0, sizeof *d);
    d->world = d->local_world = 1;
    d->device = -1;
}

void dist_init(Dist *d) {
    dist_init_solo(d);
    if (!launched_by_mpi()) return;
    start_mpi(d);
    if (d->world > 1) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "rank %d: ", d->rank);
        log_set_prefix(prefix);
    }
    int expected = launcher_world();
    if (expected > 1 && d->world != expected)
        log_warn("the launcher started %d tasks but MPI sees %d: is trainc built against the "
                 "launcher's MPI?", expected, d->world);
    if (d->rank == 0 && d->world > 1)
        log_info("dist: %d ranks, %d on this host", d->world, d->local_world);
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

void dist_finalize(Dist *d) {
    if (d->nccl) NCCL_CHECK(ncclCommDestroy(d->nccl));
    if (d->comm_stream) CUDA_CHECK(cudaStreamDestroy(d->comm_stream));
    d->nccl = NULL;
    d->comm_stream = NULL;
    if (d->mpi) {
        abort_armed = 0; /* MPI_Abort is not allowed after MPI_Finalize */
        MPI_CHECK(MPI_Finalize());
        d->mpi = 0;
    }
    log_set_prefix(NULL);
}

void dist_abort(Dist *d, int code) {
    fflush(stdout);
    fflush(stderr);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (d->world > 1 && initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

void dist_allreduce_sum_host_double(Dist *d, double *vals, int n) {
    if (d->world == 1 || n == 0) return;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, vals, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
}

void dist_bcast_host(Dist *d, void *buf, size_t bytes, int root) {
    if (d->world == 1) return;
    /* MPI counts are ints: send large buffers in pieces. */
    const size_t piece = (size_t)1 << 30;
    for (size_t at = 0; at < bytes; at += piece) {
        size_t n = bytes - at < piece ? bytes - at : piece;
        MPI_CHECK(MPI_Bcast((char *)buf + at, (int)n, MPI_BYTE, root, MPI_COMM_WORLD));
    }
}

void dist_barrier(Dist *d) {
    if (d->world == 1) return;
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

int dist_any_host(Dist *d, int flag) {
    int any = flag != 0;
    if (d->world == 1) return any;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD));
    return any;
}

void dist_allreduce_sum_double_device(Dist *d, double *dev, int n, cudaStream_t stream) {
    if (d->world == 1 || n == 0) return;
    if (!d->nccl) TC_FATAL("rank %d: dist_allreduce_sum_double_device before dist_init_nccl", d->rank);
    NCCL_CHECK(ncclAllReduce(dev, dev, (size_t)n, ncclFloat64, ncclSum, d->nccl, stream));
}
