/* Error checking for MPI and NCCL calls (dist/ sources only). A failure names
 * the call, its error, the place and the rank, then goes through tc_fatal,
 * whose hook (set by dist_init) aborts every rank so that none is left waiting
 * in a collective.
 *
 * CMake defines TRAINC_MPI (1: MPI found) for every source. A build without
 * MPI is always world 1, where no MPI call is ever reached: MPI_CHECK then
 * leaves its call uncompiled, and reaching one anyway stops naming it. NCCL
 * comes with CUDA: NCCL_CHECK exists in CUDA builds only. */
#ifndef TRAINC_DIST_CHECK_H
#define TRAINC_DIST_CHECK_H

#include "dist/dist.h"
#include "runtime/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This process's rank in messages: -1 before dist_init knows it. */
int dist_message_rank(void);

#if !defined(TRAINC_MPI)
#error "TRAINC_MPI is not defined: build trainc through CMake, which sets it to 1 or 0"
#elif TRAINC_MPI
#include <mpi.h>
void dist_fail_mpi(int err, const char *call, const char *file, int line)
    __attribute__((noreturn));
#define MPI_CHECK(call) do { int e_ = (call); \
    if (e_ != MPI_SUCCESS) dist_fail_mpi(e_, #call, __FILE__, __LINE__); } while (0)
#else
void dist_unreachable_mpi(const char *call, const char *file, int line) __attribute__((noreturn));
#define MPI_CHECK(call) dist_unreachable_mpi(#call, __FILE__, __LINE__)
#endif

#if TRAINC_CUDA
void dist_fail_nccl(ncclResult_t err, const char *call, const char *file, int line)
    __attribute__((noreturn));
#define NCCL_CHECK(call) do { ncclResult_t e_ = (call); \
    if (e_ != ncclSuccess) dist_fail_nccl(e_, #call, __FILE__, __LINE__); } while (0)
/* dist_nccl.c: the communicator and comm stream go (dist_finalize). */
void dist_nccl_destroy(Dist *d);
#endif

#ifdef __cplusplus
}
#endif
#endif
