/* Where each rank runs (dist/placement.h) as two nodes of two ranks each
 * would see it under Open MPI, Slurm and MPICH: each process's environment
 * as the launcher sets it, the place read from it, and the GPU taken with two
 * GPUs visible on each node or one bound to each task; uneven Slurm nodes,
 * contradictions and plain runs. */
#include <stdio.h>
#include <string.h>

#include <stdlib.h>

#include "dist/dist.h"
#include "dist/placement.h"
#include "tests/harness.h"

typedef struct {
    const char *names[8], *values[8];
} Env;

static const char *env_get(void *ctx, const char *name) {
    const Env *e = ctx;
    for (int i = 0; i < 8 && e->names[i]; i++)
        if (strcmp(e->names[i], name) == 0) return e->values[i];
    return NULL;
}

/* Process r of 4 on 2 nodes (ranks 0-1 on node 0, 2-3 on node 1) as launcher l sets it up. */
static Env launcher_env(int l, int r, char (*buf)[16]) {
    snprintf(buf[0], 16, "%d", r);
    snprintf(buf[1], 16, "%d", r % 2);
    snprintf(buf[2], 16, "%d", r / 2);
    Env e = {{0}, {0}};
    if (l == 0) {
        const char *n[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK"};
        const char *v[] = {buf[0], "4", buf[1], "2", buf[2]};
        memcpy(e.names, n, sizeof n), memcpy(e.values, v, sizeof v);
    } else if (l == 1) {
        const char *n[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASKS_PER_NODE",
                           "SLURM_NNODES"};
        const char *v[] = {buf[0], "4", buf[1], buf[2], "2(x2)", "2"};
        memcpy(e.names, n, sizeof n), memcpy(e.values, v, sizeof v);
    } else {
        const char *n[] = {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};
        const char *v[] = {buf[0], "4", buf[1], "2"};
        memcpy(e.names, n, sizeof n), memcpy(e.values, v, sizeof v);
    }
    return e;
}

static void check_two_nodes(void) {
    static const char *launchers[] = {"Open MPI", "Slurm", "MPICH"};
    char err[256], buf[3][16];
    for (int l = 0; l < 3; l++) {
        int devices_used[2][2] = {{0}};
        for (int r = 0; r < 4; r++) {
            Env e = launcher_env(l, r, buf);
            DistPlace p;
            CHECK_MSG(dist_place_from_env(env_get, &e, &p, err, sizeof err) == 1, "%s rank %d: %s", launchers[l], r,
                      err);
            CHECK_MSG(strcmp(p.launcher, launchers[l]) == 0, "%s read as %s", launchers[l], p.launcher);
            CHECK_MSG(p.rank == r && p.world == 4 && p.local_rank == r % 2 && p.local_world == 2,
                      "%s rank %d: read as rank %d of %d, local %d of %d", launchers[l], r, p.rank, p.world,
                      p.local_rank, p.local_world);
            /* two GPUs visible on each node: one each; one bound to each task: that one */
            int two = dist_pick_device(p.local_rank, p.local_world, 2, err, sizeof err);
            CHECK_MSG(two == r % 2, "%s rank %d took GPU %d of 2", launchers[l], r, two);
            if (two >= 0) devices_used[r / 2][two]++;
            CHECK(dist_pick_device(p.local_rank, p.local_world, 1, err, sizeof err) == 0);
        }
        for (int node = 0; node < 2; node++)
            CHECK_MSG(devices_used[node][0] == 1 && devices_used[node][1] == 1, "%s node %d: a GPU shared or idle",
                      launchers[l], node);
        printf("%-8s 2 nodes x 2 ranks: ranks, local ranks and GPUs as expected\n", launchers[l]);
    }
}

static void check_uneven_and_bad(void) {
    char err[256];
    DistPlace p;
    /* Slurm, 3 tasks on node 0 and 1 on node 1: the last rank is alone on its node */
    Env uneven = {{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASKS_PER_NODE"},
                  {"3", "4", "0", "1", "3,1"}};
    CHECK(dist_place_from_env(env_get, &uneven, &p, err, sizeof err) == 1);
    CHECK_MSG(p.local_rank == 0 && p.local_world == 1, "uneven: local %d of %d", p.local_rank, p.local_world);
    /* SLURM_NTASKS_PER_NODE where SLURM_TASKS_PER_NODE is missing */
    Env per_node = {{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}, {"5", "8", "1", "4"}};
    CHECK(dist_place_from_env(env_get, &per_node, &p, err, sizeof err) == 1 && p.local_world == 4);
    /* a launcher that does not say the local rank: left to MPI */
    Env no_local = {{"PMI_RANK", "PMI_SIZE"}, {"1", "2"}};
    CHECK(dist_place_from_env(env_get, &no_local, &p, err, sizeof err) == 1 && p.local_rank == -1);
    /* contradictions */
    Env outside = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"4", "4"}};
    CHECK(dist_place_from_env(env_get, &outside, &p, err, sizeof err) == -1 && strstr(err, "rank 4 of 4"));
    Env local_outside = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE"}, {"1", "4", "2", "2"}};
    CHECK(dist_place_from_env(env_get, &local_outside, &p, err, sizeof err) == -1 && strstr(err, "local rank 2 of 2"));
    Env garbage = {{"SLURM_PROCID", "SLURM_NTASKS"}, {"x", "4"}};
    CHECK(dist_place_from_env(env_get, &garbage, &p, err, sizeof err) == -1);
    /* a plain run, and one task under srun, are no launch */
    Env none = {{"HOME"}, {"/root"}};
    CHECK(dist_place_from_env(env_get, &none, &p, err, sizeof err) == 0);
    /* GPUs: fewer than the host's ranks (but more than one), or none */
    CHECK(dist_pick_device(3, 4, 2, err, sizeof err) == -1 && strstr(err, "4 ranks share this host but each sees 2"));
    CHECK(dist_pick_device(0, 2, 0, err, sizeof err) == -1 && strstr(err, "no GPU is visible"));
    CHECK(dist_pick_device(1, 2, 8, err, sizeof err) == 1);
}

/* NCCL's socket transport: trainc's values where the environment sets none,
 * the user's where it does, NCCL's own for 0. */
static void check_socket_defaults(void) {
    Dist d = {.rank = 0, .world = 1};
    unsetenv("NCCL_SOCKET_NTHREADS");
    setenv("NCCL_NSOCKS_PERTHREAD", "2", 1);
    dist_nccl_socket_defaults(&d, 4, 8);
    const char *threads = getenv("NCCL_SOCKET_NTHREADS"), *socks = getenv("NCCL_NSOCKS_PERTHREAD");
    CHECK(threads && strcmp(threads, "4") == 0);
    CHECK(socks && strcmp(socks, "2") == 0);
    unsetenv("NCCL_SOCKET_NTHREADS");
    unsetenv("NCCL_NSOCKS_PERTHREAD");
    dist_nccl_socket_defaults(&d, 0, 0);
    CHECK(!getenv("NCCL_SOCKET_NTHREADS") && !getenv("NCCL_NSOCKS_PERTHREAD"));
}

/* Open MPI's own default binding against a --bind-to of the user's and other launchers. */
static void check_default_binding(void) {
    Env by_default = {{"OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_bound_at_launch"}, {"2", "1"}};
    Env chosen = {{"OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_bound_at_launch", "OMPI_MCA_hwloc_base_binding_policy"},
                  {"2", "1", "core"}};
    Env unbound = {{"OMPI_COMM_WORLD_SIZE", "OMPI_MCA_hwloc_base_binding_policy"}, {"2", "none"}};
    Env slurm = {{"SLURM_PROCID", "SLURM_NTASKS", "OMPI_MCA_orte_bound_at_launch"}, {"0", "2", "1"}};
    Env plain = {{0}, {0}};
    CHECK(dist_pinned_by_default(env_get, &by_default) == 1);
    CHECK(dist_pinned_by_default(env_get, &chosen) == 0);
    CHECK(dist_pinned_by_default(env_get, &unbound) == 0);
    CHECK(dist_pinned_by_default(env_get, &slurm) == 0);
    CHECK(dist_pinned_by_default(env_get, &plain) == 0);
}

int main(void) {
    check_default_binding();
    check_socket_defaults();
    check_two_nodes();
    check_uneven_and_bad();
    return test_finish("test_placement");
}
