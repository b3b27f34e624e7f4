#include "dist/dist.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist_check.h"
#include "dist/placement.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

/* Process-wide, for the failure paths, which have no Dist at hand. */
static int message_rank = -1;

int dist_message_rank(void) { return message_rank; }

/* 'value' into the environment variable 'name' unless it is set; what NCCL
 * will read, for the log. */
static int default_env(const char *name, int value, char *said, size_t said_size) {
    const char *set = getenv(name);
    if (set || value <= 0) {
        snprintf(said, said_size, "%s%s", set ? set : "NCCL's default", set ? " (from the environment)" : "");
        return 0;
    }
    char text[16];
    snprintf(text, sizeof text, "%d", value);
    if (setenv(name, text, 0) != 0) TC_FATAL("rank %d: setenv %s=%s failed", message_rank, name, text);
    snprintf(said, said_size, "%d", value);
    return 1;
}

void dist_nccl_socket_defaults(const Dist *d, int threads, int sockets_per_thread) {
    char t[64], s[64];
    default_env("NCCL_SOCKET_NTHREADS", threads, t, sizeof t);
    default_env("NCCL_NSOCKS_PERTHREAD", sockets_per_thread, s, sizeof s);
    if (d->rank == 0 && d->world > 1)
        log_info("nccl socket transport, if used: %s threads x %s sockets per connection", t, s);
}

/* Did mpirun or srun start us as one of several tasks? */
static int launched_by_mpi(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK")) return 1;
    const char *tasks = getenv("SLURM_NTASKS");
    return tasks && atoi(tasks) > 1 && getenv("SLURM_PROCID");
}

/* The number of tasks the launcher says it started, and the variable that
 * says so; 0 when it does not say. */
static int launcher_world(const char **var) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v) {
            if (var) *var = vars[i];
            return atoi(v);
        }
    }
    return 0;
}

#if TRAINC_MPI

/* How long a failing rank waits for the others to fail too before it aborts
 * the job alone: ranks that all fail the same config check usually do so
 * within milliseconds of each other, seconds apart on a loaded machine. */
#define FAIL_AGREE_SECONDS 10.0

static int message_world;
static int abort_armed;              /* MPI is up: a fatal error aborts the job */
static int all_ranks_failed;         /* every rank is in tc_fatal: none waits in a collective */
static MPI_Comm fail_comm = MPI_COMM_NULL; /* a copy of the world for that agreement alone */
static pthread_t mpi_thread;         /* MPI_THREAD_FUNNELED: the thread that may call MPI */

void dist_fail_mpi(int err, const char *call, const char *file, int line) {
    char what[MPI_MAX_ERROR_STRING] = "unknown MPI error";
    int len = 0;
    if (MPI_Error_string(err, what, &len) != MPI_SUCCESS) snprintf(what, sizeof what, "error %d", err);
    tc_fatal(file, line, "rank %d: %s failed: %s", message_rank, call, what);
}

/* Whether every rank reaches this within FAIL_AGREE_SECONDS. */
static int every_rank_failing(void) {
    MPI_Request request;
    int done = 0;
    if (fail_comm == MPI_COMM_NULL || !pthread_equal(pthread_self(), mpi_thread)) return 0;
    if (MPI_Ibarrier(fail_comm, &request) != MPI_SUCCESS) return 0;
    double until = MPI_Wtime() + FAIL_AGREE_SECONDS;
    while (!done && MPI_Wtime() < until) {
        if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 0;
        if (!done) nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return done;
}

static unsigned long message_hash(const char *s) {
    unsigned long h = 5381;
    for (; *s; s++) h = h * 33 + (unsigned char)*s;
    return h;
}

/* tc_fatal's message. Ranks that all fail together exit without MPI_Abort:
 * ranks aborting at once garble Open MPI's output ("ORTE_ERROR_LOG: Data
 * unpack had inadequate space"). The same message from every rank is printed
 * once, by rank 0. A rank that fails alone prints its own, and the hook below
 * aborts the job. */
static void report_fatal(const char *message) {
    if (!abort_armed || !every_rank_failing()) {
        fprintf(stderr, "trainc: error: %s\n", message);
        return;
    }
    all_ranks_failed = 1;
    unsigned long h = message_hash(message), lowest = h, highest = h;
    int same = MPI_Allreduce(&h, &lowest, 1, MPI_UNSIGNED_LONG, MPI_MIN, fail_comm) == MPI_SUCCESS &&
               MPI_Allreduce(&h, &highest, 1, MPI_UNSIGNED_LONG, MPI_MAX, fail_comm) == MPI_SUCCESS &&
               lowest == highest;
    if (!same) fprintf(stderr, "trainc: error: rank %d of %d: %s\n", message_rank, message_world, message);
    else if (message_rank == 0) fprintf(stderr, "trainc: error: on all %d ranks: %s\n", message_world, message);
    fflush(stderr);
}

/* tc_fatal's hook: the message is out; take every other rank down with this one. */
static void abort_all_ranks(void) {
    if (!abort_armed) return;
    abort_armed = 0;
    if (all_ranks_failed) {
        MPI_Finalize(); /* every rank does: no one is left waiting, the job ends with status 1 */
        return;
    }
    fprintf(stderr, "trainc: rank %d of %d failed: stopping every rank\n", message_rank,
            message_world);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
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
    mpi_thread = pthread_self();
    tc_on_fatal(abort_all_ranks);
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &d->world));
    message_rank = d->rank;
    message_world = d->world;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &fail_comm));
    tc_on_fatal_message(report_fatal);

    MPI_Comm host;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL,
                                  &host));
    MPI_CHECK(MPI_Comm_rank(host, &d->local_rank));
    MPI_CHECK(MPI_Comm_size(host, &d->local_world));
    MPI_CHECK(MPI_Comm_free(&host));
}

static void finalize_mpi(void) {
    abort_armed = 0; /* MPI_Abort is not allowed after MPI_Finalize */
    tc_on_fatal_message(NULL);
    MPI_CHECK(MPI_Comm_free(&fail_comm));
    MPI_CHECK(MPI_Finalize());
}

static void abort_job(int code) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

#else /* built without MPI: always world 1 */

void dist_unreachable_mpi(const char *call, const char *file, int line) {
    tc_fatal(file, line, "internal: %s reached in a build without MPI (world 1)", call);
}

/* A launch of several ranks: one message (from the launcher's first rank,
 * where it says which that is), and every rank stops. */
static void start_mpi(Dist *d) {
    const char *var = NULL;
    int world = launcher_world(&var);
    if (world <= 1) return; /* one task: a plain run */
    const char *rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof rank_vars / sizeof *rank_vars; i++) {
        const char *r = getenv(rank_vars[i]);
        if (r && atoi(r) != 0) exit(1);
        if (r) break;
    }
    tc_fatal(NULL, 0, "started as one of %d ranks (%s=%d), but this trainc was built without MPI, so it runs one "
             "process only: install an MPI (Debian: libopenmpi-dev openmpi-bin), configure and build again, or "
             "start trainc alone", world, var, world);
}

static void finalize_mpi(void) {}
static void abort_job(int code) {}

#endif

void dist_init_solo(Dist *d) {
    memset(d, 0, sizeof *d);
    d->world = d->local_world = 1;
    d->device = -1;
}

static const char *process_env(void *ctx, const char *name) {
    (void)ctx;
    return getenv(name);
}

/* MPI's places against the launcher's environment (dist/placement.h): on
 * several nodes they must agree, or ranks would share or skip GPUs. */
static void check_env_place(const Dist *d) {
    DistPlace p;
    char err[256];
    int said = dist_place_from_env(process_env, NULL, &p, err, sizeof err);
    if (said < 0) log_warn("%s", err);
    if (said <= 0) return;
    int local_differs = p.local_rank >= 0 && (p.local_rank != d->local_rank || p.local_world != d->local_world);
    if (p.rank != d->rank || p.world != d->world || local_differs)
        log_warn("%s's environment places this process at rank %d of %d, %d of %d on its host; MPI at rank %d of "
                 "%d, %d of %d on its host (its shared-memory split), which trainc follows", p.launcher, p.rank,
                 p.world, p.local_rank, p.local_world, d->rank, d->world, d->local_rank, d->local_world);
}

/* Open MPI's default binding (dist_pinned_by_default) puts the rank's loader
 * threads, NCCL's and its own on one core: the rank takes every CPU it may use
 * instead, as mpirun --bind-to none would; threads started later inherit it.
 * The kernel leaves out CPUs outside the process's cpuset. */
static void unpin_default_binding(Dist *d) {
    cpu_set_t mask;
    if (!dist_pinned_by_default(process_env, NULL) || sched_getaffinity(0, sizeof mask, &mask) != 0) return;
    int pinned = CPU_COUNT(&mask);
    long cpus = sysconf(_SC_NPROCESSORS_CONF);
    CPU_ZERO(&mask);
    for (long i = 0; i < cpus && i < CPU_SETSIZE; i++) CPU_SET((int)i, &mask);
    if (sched_setaffinity(0, sizeof mask, &mask) != 0 || sched_getaffinity(0, sizeof mask, &mask) != 0) {
        log_warn("Open MPI's default binding pinned this rank to %d CPU%s and trainc could not widen it: start "
                 "mpirun with --bind-to none", pinned, pinned == 1 ? "" : "s");
        return;
    }
    d->cpus_pinned = pinned;
    if (d->rank == 0 && CPU_COUNT(&mask) > pinned)
        log_info("Open MPI's default binding pinned each rank to %d CPU%s: trainc runs them on all %d this process "
                 "may use, as mpirun --bind-to none would (a --bind-to of your own is kept)", pinned,
                 pinned == 1 ? "" : "s", CPU_COUNT(&mask));
}

void dist_init(Dist *d) {
    dist_init_solo(d);
    if (!launched_by_mpi()) return;
    start_mpi(d);
    unpin_default_binding(d);
    if (d->world > 1) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "rank %d: ", d->rank);
        log_set_prefix(prefix);
    }
    int expected = launcher_world(NULL);
    if (expected > 1 && d->world != expected)
        log_warn("the launcher started %d tasks but MPI sees %d: is trainc built against the "
                 "launcher's MPI?", expected, d->world);
    else if (d->world > 1)
        check_env_place(d);
    if (d->rank == 0 && d->world > 1)
        log_info("dist: %d ranks, %d on this host", d->world, d->local_world);
}

void dist_finalize(Dist *d) {
    if (d->nccl || d->comm_stream) GPU_ONLY(dist_nccl_destroy(d));
    if (d->mpi) {
        finalize_mpi();
        d->mpi = 0;
    }
    log_set_prefix(NULL);
}

void dist_abort(Dist *d, int code) {
    fflush(stdout);
    fflush(stderr);
    if (d->world > 1) abort_job(code);
    exit(code);
}

void dist_allreduce_sum_host_double(Dist *d, double *vals, int n) {
    if (d->world == 1 || n == 0) return;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, vals, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
}

void dist_mean_timings(void *dist, float *times, int n) {
    Dist *d = (Dist *)dist;
    if (d->world == 1) return;
    double count[2] = {n, (double)n * n}; /* equal counts: world n and world n^2 */
    dist_allreduce_sum_host_double(d, count, 2);
    if (count[0] * count[0] != d->world * count[1])
        TC_FATAL("the ranks time different numbers of candidates (%d on rank %d): do they have the same GPUs and "
                 "libraries? (perf.conv_benchmark = off chooses without timing)", n, d->rank);
    double *sum = malloc((size_t)(n > 0 ? n : 1) * sizeof *sum);
    if (!sum) TC_FATAL("out of host memory agreeing %d timings", n);
    for (int i = 0; i < n; i++) sum[i] = times[i];
    dist_allreduce_sum_host_double(d, sum, n);
    for (int i = 0; i < n; i++) times[i] = (float)(sum[i] / d->world);
    free(sum);
}

void dist_bcast_host(Dist *d, void *buf, size_t bytes, int root) {
    if (d->world == 1) return;
    /* MPI counts are ints: send large buffers in pieces. */
    const size_t piece = (size_t)1 << 30;
    for (size_t at = 0; at < bytes; at += piece)
        MPI_CHECK(MPI_Bcast((char *)buf + at, (int)(bytes - at < piece ? bytes - at : piece), MPI_BYTE, root,
                            MPI_COMM_WORLD));
}

void dist_barrier(Dist *d) {
    if (d->world == 1) return;
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

/* The byte counts of a gather and where each rank's part starts; the total. */
static size_t gather_layout(const int *sizes, int world, int *displs, size_t *counts) {
    size_t total = 0;
    for (int r = 0; r < world; r++) {
        if (total > INT_MAX) break;
        displs[r] = (int)total;
        counts[r] = (size_t)sizes[r];
        total += (size_t)sizes[r];
    }
    if (total > INT_MAX) TC_FATAL("dist_gather_bytes: the ranks' parts together are more than %d bytes", INT_MAX);
    return total;
}

char *dist_gather_bytes(Dist *d, const void *buf, size_t bytes, int root, size_t *counts) {
    int is_root = d->rank == root;
    if (bytes > INT_MAX) TC_FATAL("dist_gather_bytes: rank %d's %zu bytes are more than %d", d->rank, bytes, INT_MAX);
    char *all = NULL;
    if (d->world == 1) {
        all = malloc(bytes ? bytes : 1);
        if (!all) TC_FATAL("out of host memory gathering %zu bytes", bytes);
        memcpy(all, buf, bytes);
        counts[0] = bytes;
        return all;
    }
    int mine = (int)bytes, *sizes = NULL, *displs = NULL;
    if (is_root) {
        sizes = calloc((size_t)d->world, sizeof *sizes);
        displs = calloc((size_t)d->world, sizeof *displs);
        if (!sizes || !displs) TC_FATAL("out of host memory gathering from %d ranks", d->world);
    }
    MPI_CHECK(MPI_Gather(&mine, 1, MPI_INT, sizes, 1, MPI_INT, root, MPI_COMM_WORLD));
    if (is_root) {
        size_t total = gather_layout(sizes, d->world, displs, counts);
        all = malloc(total ? total : 1);
        if (!all) TC_FATAL("out of host memory gathering %zu bytes", total);
    }
    MPI_CHECK(MPI_Gatherv(buf, mine, MPI_BYTE, all, sizes, displs, MPI_BYTE, root, MPI_COMM_WORLD));
    free(sizes);
    free(displs);
    return all;
}

int dist_any_host(Dist *d, int flag) {
    int any = flag != 0;
    if (d->world == 1) return any;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD));
    return any;
}
