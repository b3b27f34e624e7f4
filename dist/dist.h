/* The process group of a data-parallel run: one process per GPU (or CPU
 * rank), started by mpirun or srun. MPI carries the set-up and the small host
 * collectives (metrics, stop flags) and, on the CPU, the gradients; NCCL
 * carries the GPU's gradients. A plain run (no launcher in the environment) is
 * world 1 and touches neither: every collective is then a no-op. dist/ takes
 * plain pointers, counts and dtypes; it knows nothing of models or configs.
 *
 * A build without MPI (CMake found none: TRAINC_MPI 0) is always world 1, and
 * stops with a message when a launcher starts it as one of several ranks. The
 * NCCL calls (dist_init_nccl, dist_allreduce_sum_double_device) exist in CUDA
 * builds only (dist_nccl.c). */
#ifndef TRAINC_DIST_H
#define TRAINC_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int rank, world;             /* in the whole job */
    int local_rank, local_world; /* among the processes of this host */
    int mpi;                     /* MPI was initialised by us (and is finalised by us) */
    int device;                  /* the GPU of dist_init_nccl; -1 before it */
    ncclComm_t nccl;             /* NULL while world == 1 or before dist_init_nccl */
    cudaStream_t comm_stream;    /* highest priority, non-blocking; NULL without NCCL */
    int cpus_pinned;             /* the CPUs Open MPI's default binding gave this rank, before
                                    dist_init widened it to all it may use; 0: not pinned so */
} Dist;

/* Detects a launch by mpirun (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK) or srun
 * (SLURM_NTASKS > 1 with SLURM_PROCID) and then initialises MPI; otherwise world
 * is 1 and MPI is never touched. With world > 1 a fatal error on any rank
 * (tc_fatal) makes every rank exit, and log lines start with the rank. When
 * every rank fails alike at about the same time (a config error), the error is
 * printed once, by rank 0, and the ranks exit without an abort; a rank that
 * fails alone prints its error and aborts the job. Call it first in main,
 * before other tc_on_fatal hooks are registered: hooks run in reverse order,
 * so theirs then run before the job is aborted. Without MPI (TRAINC_MPI 0) a
 * launch of several ranks stops here with a message. A rank that Open MPI's
 * default binding pinned (dist_pinned_by_default) runs on every CPU it may
 * use from here on. */
void dist_init(Dist *d);
/* World 1 without looking at the environment: a run inside another program. */
void dist_init_solo(Dist *d);
/* Binds this process to 'device' (usually d->local_rank) and, with world > 1,
 * makes the NCCL communicator (rank 0's unique id broadcast over MPI) and the
 * comm stream. */
void dist_init_nccl(Dist *d, int device);
/* Before dist_init_nccl: the helper threads per connection and sockets per
 * thread of NCCL's socket transport (between hosts without InfiniBand; NCCL's
 * own default is 1 and 1), as NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD
 * unless the environment sets them; 0 leaves NCCL's choice. Other transports
 * ignore them. */
void dist_nccl_socket_defaults(const Dist *d, int threads, int sockets_per_thread);
/* Destroys the communicator and stream; finalises MPI when dist_init started it. */
void dist_finalize(Dist *d);
/* Makes every rank exit with 'code' (MPI_Abort); without MPI just this one. */
void dist_abort(Dist *d, int code) __attribute__((noreturn));

/* Host collectives over MPI; all ranks must call them in the same order. */
void dist_allreduce_sum_host_double(Dist *d, double *vals, int n);
void dist_bcast_host(Dist *d, void *buf, size_t bytes, int root);
void dist_barrier(Dist *d);
/* Every rank's `bytes` bytes to root, in rank order: on root a malloc'ed
 * buffer holding them all (the caller frees it) and counts[r] the bytes of
 * rank r (counts has world entries); NULL on the other ranks. World 1: a copy
 * of buf. Each rank's part, and all of them together, must fit an int (MPI's
 * counts): more stops the run with a message. */
char *dist_gather_bytes(Dist *d, const void *buf, size_t bytes, int root, size_t *counts);
/* Logical OR of flag over the ranks: a stop asked for on one rank stops all
 * ranks at the same step. */
int dist_any_host(Dist *d, int flag);
/* Each of n timings (dist is a Dist *) replaced by its mean over the ranks,
 * the same bits on every rank (summed in doubles, exactly for timings within
 * 10^7 of each other, so in any order):
 * ranks that time the same candidates then choose alike. Infinite where any
 * rank's is. Every rank must pass the same n: a rank that passes another
 * stops the run. The signature of ConvAlgoPolicy's agree. */
void dist_mean_timings(void *dist, float *times, int n);

/* In place, the sum over the ranks of n doubles on the device (synchronized
 * batch norm's sums), ordered on 'stream'. No host sync and no allocation, so
 * it may be captured in a CUDA graph. */
void dist_allreduce_sum_double_device(Dist *d, double *dev, int n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
