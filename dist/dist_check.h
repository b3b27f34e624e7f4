/* Error checking for MPI and NCCL calls (dist/ sources only). A failure names
 * the call, its error, the place and the rank, then goes through tc_fatal,
 * whose hook (set by dist_init) aborts every rank so that none is left waiting
 * in a collective. */
#ifndef TRAINC_DIST_CHECK_H
#define TRAINC_DIST_CHECK_H

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* This process's rank in messages: -1 before dist_init knows it. */
int dist_message_rank(void);
void dist_fail_mpi(int err, const char *call, const char *file, int line)
    __attribute__((noreturn));
void dist_fail_nccl(ncclResult_t err, const char *call, const char *file, int line)
    __attribute__((noreturn));

#define MPI_CHECK(call) do { int e_ = (call); \
    if (e_ != MPI_SUCCESS) dist_fail_mpi(e_, #call, __FILE__, __LINE__); } while (0)
#define NCCL_CHECK(call) do { ncclResult_t e_ = (call); \
    if (e_ != ncclSuccess) dist_fail_nccl(e_, #call, __FILE__, __LINE__); } while (0)

#ifdef __cplusplus
}
#endif
#endif
