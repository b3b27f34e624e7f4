/* What trainc says when it is started in a way this build cannot serve, each
 * one message and a non-zero exit:
 *   - run.device = cuda in a build without CUDA (TRAINC_CUDA=0): use --device
 *     cpu; in a CUDA build on a machine without a GPU: no GPU is visible;
 *     bench-loader (copies to the GPU) without CUDA;
 *   - several ranks from a launcher in a build without MPI (TRAINC_MPI=0): the
 *     launcher's first rank says so, the others stop quietly;
 *   - under mpirun, every rank failing the same config check (configs/ddp.ini
 *     on CPU ranks; the copy engines or the sharded optimizer asked of CPU
 *     ranks): the error once, from rank 0, and none of Open MPI's garbled
 *     abort output ("Data unpack had inadequate space"). A rank that fails
 *     alone is test_dist_cpu_abort's case. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "runtime/gpu.h"
#include "tests/harness.h"

static char output[1 << 16];

/* Runs a shell command with stderr joined to stdout into output; returns its
 * exit status (-1: it did not exit normally). */
static int run(const char *cmd) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = fread(output, 1, sizeof output - 1, p);
    output[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *at = strstr(text, needle); at; at = strstr(at + 1, needle)) n++;
    return n;
}

static const char *trainc_path(void) {
    static char path[1024];
    const char *build = getenv("TRAINC_BUILD_DIR");
    snprintf(path, sizeof path, "%s/trainc", build ? build : "build");
    return path;
}

/* A small synthetic run on the device its config's default names (cuda). */
static const char *small_config(void) {
    static const char text[] = "[data]\nsource = synthetic\nsynthetic_train = 64\nsynthetic_test = 16\n"
                               "[train]\nbatch = 8\n[run]\nmax_steps = 2\n";
    return test_write_file(test_tmpdir("launch-errors"), "small.ini", text, sizeof text - 1);
}

/* Exactly one error, with the needle in it, and a non-zero exit. */
static void expect_one_error(const char *what, int rc, const char *needle) {
    CHECK_MSG(rc != 0, "%s: exit status 0", what);
    CHECK_MSG(count_of(output, "trainc: error:") == 1, "%s: not one error line in:\n%s", what, output);
    CHECK_MSG(strstr(output, needle) != NULL, "%s: no '%s' in:\n%s", what, needle, output);
}

static void check_gpu_refused(const char *config) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' --config '%s' --set run.device=cuda", trainc_path(), config);
    int rc = run(cmd);
    if (!TRAINC_CUDA) {
        expect_one_error("run.device = cuda without CUDA", rc,
                         "run.device = cuda: this trainc was built without CUDA (TRAINC_CUDA=OFF)");
        CHECK_MSG(strstr(output, "--device cpu") != NULL, "no hint at --device cpu in:\n%s", output);
    } else {
        expect_one_error("run.device = cuda without a GPU", rc, "no GPU is visible (use --device cpu)");
    }
    if (TRAINC_CUDA) return;
    snprintf(cmd, sizeof cmd, "'%s' bench-loader --config '%s'", trainc_path(), config);
    expect_one_error("bench-loader without CUDA", run(cmd),
                     "trainc bench-loader measures copies to the GPU, and this trainc was built without CUDA");
}

/* A build without MPI under a launcher of 2 tasks: rank 0 says why, rank 1
 * stops with no message of its own. */
static void check_ranks_refused(const char *config) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 '%s' --config '%s' --device cpu",
             trainc_path(), config);
    expect_one_error("2 ranks without MPI, rank 0", run(cmd),
                     "started as one of 2 ranks (OMPI_COMM_WORLD_SIZE=2), but this trainc was built without MPI");
    snprintf(cmd, sizeof cmd, "env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 '%s' --config '%s' --device cpu",
             trainc_path(), config);
    int rc = run(cmd);
    CHECK_MSG(rc != 0 && output[0] == 0, "2 ranks without MPI, rank 1: exit %d, output:\n%s", rc, output);
    snprintf(cmd, sizeof cmd, "env SLURM_NTASKS=3 SLURM_PROCID=0 '%s' --config '%s' --device cpu", trainc_path(),
             config);
    expect_one_error("3 srun tasks without MPI", run(cmd), "(SLURM_NTASKS=3)");
}

/* mpirun -n 2 of trainc with args; 0 when there is no mpirun to run (not under ctest). */
static int run_two_ranks(const char *what, const char *args) {
    const char *mpiexec = getenv("TRAINC_MPIEXEC"), *flags = getenv("TRAINC_MPIEXEC_FLAGS");
    if (!mpiexec || !mpiexec[0]) {
        printf("TRAINC_MPIEXEC not set (run under ctest): %s is not checked\n", what);
        return 0;
    }
    /* Open MPI refuses root unless told; in containers its shared memory may be denied CMA. */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' -n 2 %s '%s' %s", mpiexec, flags ? flags : "", trainc_path(), args);
    int rc = run(cmd);
    CHECK_MSG(rc != 0, "%s: exit status 0", what);
    /* Ranks that fail within dist.c's agreement window say it once; on a loaded
     * machine one rank may get there late, and the first then stops the job
     * alone with its own message. Either way: trainc's message, nothing garbled. */
    if (strstr(output, "trainc: error: on all 2 ranks: "))
        CHECK_MSG(count_of(output, "trainc: error:") == 1, "%s: not one error line in:\n%s", what, output);
    else
        CHECK_MSG(strstr(output, "trainc: error: ") && strstr(output, "stopping every rank"),
                  "%s: no trainc error in:\n%s", what, output);
    const char *garbled[] = {"ORTE_ERROR_LOG", "Data unpack"};
    for (size_t i = 0; i < sizeof garbled / sizeof *garbled; i++)
        CHECK_MSG(strstr(output, garbled[i]) == NULL, "%s: '%s' in:\n%s", what, garbled[i], output);
    return 1;
}

/* mpirun of the data-parallel config on CPU ranks: its GPU-only settings are
 * one config error that every rank finds; so are the copy engines and the
 * sharded optimizer asked of CPU ranks. */
static void check_every_rank_fails_once(const char *config) {
    if (run_two_ranks("mpirun -n 2 of ddp.ini on the CPU",
                      "--config configs/ddp.ini --device cpu --set data.source=synthetic"))
        CHECK_MSG(strstr(output, "precision.amp") != NULL, "the GPU-only settings are not named in:\n%s", output);
    const char *gpu_only[] = {"dist.copy_engine", "dist.shard_optimizer"};
    for (size_t i = 0; i < sizeof gpu_only / sizeof *gpu_only; i++) {
        char args[1024], what[128];
        snprintf(args, sizeof args, "--config '%s' --device cpu --set %s=on", config, gpu_only[i]);
        snprintf(what, sizeof what, "%s = on on CPU ranks", gpu_only[i]);
        if (run_two_ranks(what, args))
            CHECK_MSG(strstr(output, "needs run.device = cuda (CPU ranks average their gradients over MPI)") != NULL,
                      "%s: not refused for the CPU in:\n%s", what, output);
    }
}

int main(void) {
    const char *config = small_config();
    if (!TRAINC_CUDA || gpu_count() == 0) check_gpu_refused(config);
    else printf("a GPU is visible: run.device = cuda would train, not fail\n");
    if (!TRAINC_MPI) check_ranks_refused(config);
    else check_every_rank_fails_once(config);
    return test_finish("test_launch_errors");
}
