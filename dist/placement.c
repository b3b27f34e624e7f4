#include "dist/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A whole number >= 0 from variable name; -1 when unset or not a number. */
static int env_int(EnvGet get, void *ctx, const char *name) {
    const char *v = get(ctx, name);
    if (!v || !*v) return -1;
    char *end;
    long n = strtol(v, &end, 10);
    return *end || n < 0 || n > 1 << 30 ? -1 : (int)n;
}

/* Slurm's SLURM_TASKS_PER_NODE, "2(x3),1": the tasks of node `node`; -1 when unreadable. */
static int slurm_tasks_of_node(const char *spec, int node) {
    for (const char *p = spec; p && *p;) {
        char *end;
        long tasks = strtol(p, &end, 10), repeat = 1;
        if (end == p) return -1;
        if (strncmp(end, "(x", 2) == 0) {
            repeat = strtol(end + 2, &end, 10);
            if (*end != ')') return -1;
            end++;
        }
        if (node < repeat) return (int)tasks;
        node -= (int)repeat;
        p = *end == ',' ? end + 1 : NULL;
    }
    return -1;
}

static int slurm_local_world(EnvGet get, void *ctx) {
    const char *spec = get(ctx, "SLURM_TASKS_PER_NODE");
    int node = env_int(get, ctx, "SLURM_NODEID");
    if (spec && node >= 0) return slurm_tasks_of_node(spec, node);
    return env_int(get, ctx, "SLURM_NTASKS_PER_NODE");
}

int dist_place_from_env(EnvGet get, void *ctx, DistPlace *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->local_rank = p->local_world = -1;
    if (get(ctx, "OMPI_COMM_WORLD_SIZE")) {
        p->launcher = "Open MPI";
        p->rank = env_int(get, ctx, "OMPI_COMM_WORLD_RANK");
        p->world = env_int(get, ctx, "OMPI_COMM_WORLD_SIZE");
        p->local_rank = env_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_RANK");
        p->local_world = env_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_SIZE");
    } else if (get(ctx, "SLURM_PROCID") && get(ctx, "SLURM_NTASKS")) {
        p->launcher = "Slurm";
        p->rank = env_int(get, ctx, "SLURM_PROCID");
        p->world = env_int(get, ctx, "SLURM_NTASKS");
        p->local_rank = env_int(get, ctx, "SLURM_LOCALID");
        p->local_world = slurm_local_world(get, ctx);
    } else if (get(ctx, "PMI_RANK") && get(ctx, "PMI_SIZE")) {
        p->launcher = "MPICH";
        p->rank = env_int(get, ctx, "PMI_RANK");
        p->world = env_int(get, ctx, "PMI_SIZE");
        p->local_rank = env_int(get, ctx, "MPI_LOCALRANKID");
        p->local_world = env_int(get, ctx, "MPI_LOCALNRANKS");
    } else {
        return 0;
    }
    if (p->world < 1 || p->rank < 0 || p->rank >= p->world) {
        snprintf(err, errlen, "%s's environment gives rank %d of %d ranks", p->launcher, p->rank, p->world);
        return -1;
    }
    if (p->local_rank < 0 || p->local_world < 1) {
        p->local_rank = p->local_world = -1; /* not said */
        return 1;
    }
    if (p->local_world > p->world || p->local_rank >= p->local_world) {
        snprintf(err, errlen, "%s's environment gives local rank %d of %d on this host, in a job of %d ranks",
                 p->launcher, p->local_rank, p->local_world, p->world);
        return -1;
    }
    return 1;
}

int dist_pinned_by_default(EnvGet get, void *ctx) {
    const char *bound = get(ctx, "OMPI_MCA_orte_bound_at_launch");
    return get(ctx, "OMPI_COMM_WORLD_SIZE") && bound && strcmp(bound, "1") == 0 &&
           !get(ctx, "OMPI_MCA_hwloc_base_binding_policy");
}

int dist_pick_device(int local_rank, int local_world, int visible, char *err, size_t errlen) {
    if (visible >= local_world && local_rank >= 0 && local_rank < local_world) return local_rank;
    if (visible == 1) return 0;
    if (visible == 0) snprintf(err, errlen, "no GPU is visible to local rank %d", local_rank);
    else
        snprintf(err, errlen, "%d ranks share this host but each sees %d GPUs: give each rank its own GPU (one "
                 "visible to each, or at least %d visible to all)", local_world, visible, local_world);
    return -1;
}
