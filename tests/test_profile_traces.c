/* trainc profile --trace, run as a user runs it (the trainc binary), its
 * trace counted event by event per rank (pid).
 *
 *   test_profile_traces       2 CPU ranks under mpirun (ctest's TRAINC_MPIEXEC
 *                             and its flags, --oversubscribe for Open MPI) on
 *                             a tiny synthetic config, steps 3..5. Each rank,
 *                             pid 0 and 1, has its process name "rank N", a
 *                             span per step, exactly one span per host phase
 *                             per step (data wait, input, forward, backward,
 *                             optimizer), and the same number of op spans, a
 *                             multiple of the steps. Skipped without MPI.
 *   test_profile_traces gpu   the traces on the GPU with CIFAR-10
 *                             (.data/cifar10-jpg): configs/final.ini on one
 *                             GPU, then configs/ddp.ini on 2 ranks. Each
 *                             loads as JSON; the steps and the forward,
 *                             backward and optimizer phases come once per
 *                             step per rank, ops on every rank; the kernel,
 *                             copy and memset events (where CUPTI gave them)
 *                             are counted and printed. Skipped without a GPU
 *                             or the data; with one GPU (or no MPI) ddp.ini
 *                             is skipped after final.ini passes. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu.h"
#include "tests/harness.h"

enum { FIRST = 3, LAST = 5, STEPS = LAST - FIRST + 1, MAX_RANKS = 2 };

static char output[1 << 16];

/* Runs cmd (stderr with stdout); its exit status, its output's tail in output. */
static int run(const char *cmd) { return test_run_command(cmd, output, sizeof output); }

/* One rank's events by kind. */
typedef struct {
    int named;                /* its process_name is "rank <pid>" */
    int steps, ops, phases, kernels, copies, memsets, other;
    int phase[5];             /* data wait, input, forward, backward, optimizer */
} RankCounts;

static const char *phase_names[5] = {"data wait", "input", "forward", "backward", "optimizer"};

static void count_event(const cJSON *e, RankCounts *c, int pid) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name"), *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
    const char *n = cJSON_IsString(name) ? name->valuestring : "", *k = cJSON_IsString(cat) ? cat->valuestring : "";
    if (strcmp(n, "process_name") == 0) {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        const cJSON *pname = cJSON_GetObjectItemCaseSensitive(args, "name");
        char want[32];
        snprintf(want, sizeof want, "rank %d", pid);
        c->named += cJSON_IsString(pname) && strcmp(pname->valuestring, want) == 0;
    } else if (strcmp(k, "step") == 0) c->steps++;
    else if (strcmp(k, "op") == 0) c->ops++;
    else if (strcmp(k, "kernel") == 0) c->kernels++;
    else if (strcmp(k, "memcpy") == 0) c->copies++;
    else if (strcmp(k, "memset") == 0) c->memsets++;
    else if (strcmp(k, "phase") == 0) {
        c->phases++;
        for (int i = 0; i < 5; i++) c->phase[i] += strcmp(n, phase_names[i]) == 0;
    } else if (strcmp(n, "thread_name") != 0) c->other++;
}

/* Parses path and counts each pid's events (ranks 0..ranks-1; any other pid
 * is a failure); 0 when it does not parse. */
static int count_trace(const char *what, const char *path, int ranks, RankCounts *counts) {
    memset(counts, 0, sizeof *counts * MAX_RANKS);
    char *text = test_read_file(path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(root != NULL, "%s: %s does not load as JSON", what, path);
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
    CHECK_MSG(cJSON_IsArray(events), "%s: no traceEvents array", what);
    if (!root || !cJSON_IsArray(events)) {
        cJSON_Delete(root);
        return 0;
    }
    cJSON_ArrayForEach(e, events) {
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
        int ok = cJSON_IsNumber(pid) && pid->valueint >= 0 && pid->valueint < ranks;
        CHECK_MSG(ok, "%s: an event with no pid, or a pid outside 0..%d", what, ranks - 1);
        if (ok) count_event(e, &counts[pid->valueint], pid->valueint);
    }
    for (int r = 0; r < ranks; r++) {
        const RankCounts *c = &counts[r];
        printf("%s, rank %d: %d steps, %d phases, %d ops, %d kernels, %d copies, %d memsets, %d others\n", what, r,
               c->steps, c->phases, c->ops, c->kernels, c->copies, c->memsets, c->other);
    }
    cJSON_Delete(root);
    return 1;
}

/* What every rank's events hold on any device: its name, a span per step,
 * forward, backward and optimizer once per step, ops. On the CPU every phase
 * once per step, and nothing else (on the GPU the kernel tracer's own). */
static void check_ranks(const char *what, const RankCounts *counts, int ranks, int cpu) {
    for (int r = 0; r < ranks; r++) {
        const RankCounts *c = &counts[r];
        CHECK_MSG(c->named == 1, "%s: pid %d has no process name \"rank %d\"", what, r, r);
        CHECK_MSG(c->steps == STEPS, "%s, rank %d: %d step spans, want %d", what, r, c->steps, STEPS);
        for (int i = cpu ? 0 : 2; i < 5; i++)
            CHECK_MSG(c->phase[i] == STEPS, "%s, rank %d: %d '%s' spans, want %d", what, r, c->phase[i],
                      phase_names[i], STEPS);
        CHECK_MSG(c->ops >= STEPS && c->ops % STEPS == 0, "%s, rank %d: %d op spans over %d steps", what, r, c->ops,
                  STEPS);
        if (cpu) CHECK_MSG(c->other == 0, "%s, rank %d: %d events of no known kind", what, r, c->other);
    }
}

/* trainc profile ARGS --steps 3:5 --trace DIR/NAME.json, under launcher
 * (NULL: one process); 0 when it failed. */
static int profile(const char *what, const char *launcher, const char *args, const char *trace) {
    char cmd[3072];
    snprintf(cmd, sizeof cmd, "%s'%s/trainc' profile %s --steps %d:%d --trace '%s'", launcher ? launcher : "",
             test_build_dir(), args, FIRST, LAST, trace);
    printf("%s: %s\n", what, cmd);
    int rc = run(cmd);
    CHECK_MSG(rc == 0, "%s: exit status %d:\n%s", what, rc, output);
    return rc == 0;
}

/* 2 CPU ranks, a tiny synthetic config. */
static void check_cpu_ranks(void) {
    const char *launcher = test_mpirun_prefix(MAX_RANKS);
    if (!launcher) test_skip("no mpirun: built without MPI, or not run by ctest (TRAINC_MPIEXEC unset)");
    char trace[700];
    snprintf(trace, sizeof trace, "%s/trace.json", test_tmpdir("profile-ranks"));
    const char *args = "--config configs/cpu.ini --device cpu --set data.source=synthetic --set data.image_size=16 "
                       "--set data.synthetic_train=64 --set data.synthetic_test=8 --set train.batch=4 "
                       "--set model.name=simplenet --set run.log_every=1000";
    RankCounts c[MAX_RANKS];
    if (!profile("2 CPU ranks", launcher, args, trace) || !count_trace("2 CPU ranks", trace, 2, c)) return;
    check_ranks("2 CPU ranks", c, 2, 1);
    CHECK_MSG(c[0].ops == c[1].ops, "2 CPU ranks: %d and %d op spans", c[0].ops, c[1].ops);
    CHECK_MSG(strstr(output, "== memory") && strstr(output, "== ranks: 2 =="), "no report of rank 0:\n%s", output);
}

/* final.ini on one GPU, ddp.ini on 2; exits 77 for what it cannot run. */
static void check_gpu_traces(void) {
    if (!test_have_gpu()) test_skip("no GPU: the traces of final.ini and ddp.ini need one (two)");
    const char *root = test_cifar10_jpg_root();
    if (!root) test_skip("no CIFAR-10 data (.data/cifar10-jpg: tools/get_data.sh)");
    const char *dir = test_tmpdir("profile-gpu");
    char trace[700], args[1200];
    RankCounts c[MAX_RANKS];
    snprintf(trace, sizeof trace, "%s/final.json", dir);
    snprintf(args, sizeof args, "--config configs/final.ini --set data.path='%s'", root);
    if (profile("final.ini", NULL, args, trace) && count_trace("final.ini", trace, 1, c))
        check_ranks("final.ini", c, 1, 0);
    const char *launcher = test_mpirun_prefix(MAX_RANKS);
    if (test_failures) return;
    if (gpu_count() < 2 || !launcher)
        test_skip("final.ini's trace passed; ddp.ini's needs 2 GPUs and mpirun (%d GPUs, %s)", gpu_count(),
                  launcher ? "mpirun found" : "no mpirun");
    snprintf(trace, sizeof trace, "%s/ddp.json", dir);
    snprintf(args, sizeof args, "--config configs/ddp.ini --set data.path='%s'", root);
    if (profile("2-rank ddp.ini", launcher, args, trace) && count_trace("2-rank ddp.ini", trace, 2, c))
        check_ranks("2-rank ddp.ini", c, 2, 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "gpu") == 0) check_gpu_traces();
    else check_cpu_ranks();
    return test_finish("test_profile_traces");
}
