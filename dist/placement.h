/* Where a rank runs: its place in the job and on its host as the launcher's
 * environment tells it, and the GPU it takes.
 *
 * dist_init takes rank and world from MPI and the host's ranks from MPI's
 * shared-memory split; the launchers also say so in the environment, read
 * here (on several nodes both must agree, and dist_init warns when they do
 * not):
 *   Open MPI   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *   Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the tasks of
 *              this node: SLURM_TASKS_PER_NODE ("2(x2)", "3,1": the node's
 *              entry, by SLURM_NODEID) or SLURM_NTASKS_PER_NODE
 *   MPICH      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
 * The GPU: with at least as many GPUs visible as ranks on the host, the
 * local rank's; with one visible (a launcher that binds one GPU to each task,
 * srun --gpus-per-task=1, through CUDA_VISIBLE_DEVICES), that one; anything
 * else is refused with a message. */
#ifndef TRAINC_DIST_PLACEMENT_H
#define TRAINC_DIST_PLACEMENT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int rank, world;             /* in the whole job */
    int local_rank, local_world; /* among the ranks of this host; -1: the launcher does not say */
    const char *launcher;        /* "Open MPI", "Slurm", "MPICH"; NULL: none */
} DistPlace;

/* A variable of the environment (getenv, or a test's table); NULL when unset. */
typedef const char *(*EnvGet)(void *ctx, const char *name);

/* What the environment says: 1 and *p, 0 when no launcher's variables are
 * set (a plain run), -1 with a message in err when they contradict
 * themselves (a rank outside the world, a local rank outside the host's). */
int dist_place_from_env(EnvGet get, void *ctx, DistPlace *p, char *err, size_t errlen);

/* 1 where Open MPI pinned this process by its own default: Open MPI 4's
 * mpirun without --bind-to binds each of up to two ranks to one core (more:
 * to a socket) and says so with OMPI_MCA_orte_bound_at_launch = 1, without
 * the OMPI_MCA_hwloc_base_binding_policy that --bind-to sets. A binding the
 * user chose, or another launcher's, gives 0. */
int dist_pinned_by_default(EnvGet get, void *ctx);

/* The GPU ordinal of local rank local_rank of local_world ranks on a host
 * where this process sees visible GPUs; -1 with a message in err. */
int dist_pick_device(int local_rank, int local_world, int visible, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
