/* Data-parallel training started by a real Slurm (one node, two tasks, MPI
 * through PMIx), as `srun -n 2 trainc` starts it on a cluster: the ranks of
 * test_ddp_train's first check hold the same weights (as under mpirun; the
 * rest of it runs under mpirun in its own test), and `srun -n 2
 * trainc --device cpu` trains as one job of 2 ranks that prints one summary.
 * It needs a Slurm controller answering here; .ci/run starts one
 * (tools/slurm_local.sh) and this test skips where there is none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"

static char output[1 << 16];

static int count(const char *haystack, const char *needle) {
    int n = 0;
    for (const char *p = strstr(haystack, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void require_slurm(void) {
    if (!TRAINC_MPI) test_skip("built without MPI: srun starts MPI ranks");
    if (test_run_command("sinfo -h -o %t", output, sizeof output) != 0)
        test_skip("no Slurm controller answers here (sinfo failed); tools/slurm_local.sh start runs one");
    if (!strstr(output, "idle") && !strstr(output, "mix") && !strstr(output, "alloc"))
        test_skip("Slurm's node is not taking jobs (sinfo: %.60s)", output);
    /* containers may deny Open MPI's cross-process copies (CMA), as for ctest's mpirun */
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
}

/* test_ddp_train's first check, each rank a Slurm task. */
static void check_ddp_test(const char *build) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "srun -n 2 %s/test_ddp_train quick", build);
    int rc = test_run_command(cmd, output, sizeof output);
    CHECK_MSG(rc == 0, "%s: exit %d:\n%s", cmd, rc, output);
    CHECK_MSG(count(output, "test_ddp_train: ") == 2 && count(output, " 0 failed") == 2,
              "%s: not both ranks passed:\n%s", cmd, output);
    printf("srun -n 2 test_ddp_train quick: both ranks passed\n");
}

static void check_trainc(const char *build) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd,
             "srun -n 2 %s/trainc --config configs/cpu.ini --device cpu --set data.source=synthetic "
             "--set data.synthetic_train=256 --set data.synthetic_test=64 --set train.batch=16 "
             "--set run.max_steps=4 --set run.warmup_steps=1 --set data.workers=1 --set run.checkpoint_every=0 "
             "--set run.save_final=off",
             build);
    int rc = test_run_command(cmd, output, sizeof output);
    CHECK_MSG(rc == 0, "%s: exit %d:\n%s", cmd, rc, output);
    CHECK_MSG(strstr(output, "dist: 2 ranks, 2 on this host") != NULL, "no 2-rank job in:\n%s", output);
    CHECK_MSG(count(output, "\"world\": 2") == 1, "not one summary of a 2-rank run in:\n%s", output);
    CHECK_MSG(count(output, "\"steps\": 4") == 1, "not 4 steps in:\n%s", output);
    CHECK_MSG(strstr(output, "environment places this process") == NULL,
              "Slurm's environment and MPI disagree:\n%s", output);
    printf("srun -n 2 trainc --device cpu: one job of 2 ranks, 4 steps\n");
}

int main(void) {
    require_slurm();
    const char *build = test_build_dir();
    char path[4200];
    snprintf(path, sizeof path, "%s/test_ddp_train", build);
    if (access(path, X_OK) != 0) test_skip("no %s (ctest sets TRAINC_BUILD_DIR)", path);
    check_ddp_test(build);
    check_trainc(build);
    return test_finish("test_slurm");
}
