/* trainc: train a net as a config file says.
 *
 *   trainc [bench-loader] --config FILE [--set section.key=value]... [--device cpu|cuda]
 *          [--resume FILE|latest] [--print-config] [--quiet]
 *   trainc find-batch --config FILE [--set ...] [--device cpu|cuda] [--max-batch N]
 *
 * bench-loader measures the input pipeline alone (tools/bench_loader.c);
 * find-batch doubles train.batch over child runs to find the fastest size
 * (tools/find_batch.c).
 * Under mpirun (or srun) each process is one rank of a data-parallel run on
 * its host's GPU number local_rank; rank 0 logs, writes checkpoints and prints
 * the summary.
 * The last line of output is one JSON object summing up the run. SIGINT or
 * SIGTERM stops a run after its current step with a checkpoint, exit status
 * 128 + signal and a line saying how to resume. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "runtime/check.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "tools/bench_loader.h"
#include "tools/find_batch.h"
#include "tools/keys.h"
#include "tools/train.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: trainc [bench-loader] --config FILE [--set section.key=value]...\n"
            "              [--device cpu|cuda] [--resume FILE|latest] [--print-config] [--quiet]\n"
            "       trainc find-batch --config FILE [--set ...] [--device D] [--max-batch N]\n"
            "  bench-loader      time loading plus copying alone over the lab's grid\n"
            "  find-batch        double train.batch until out of memory or samples/s stops growing 5%%,\n"
            "                    up to --max-batch (65536); prints the table and the best batch\n"
            "  --config FILE     INI file (may include others)\n"
            "  --set k=v         override one key, e.g. --set train.batch=256\n"
            "  --device D        shorthand for --set run.device=D\n"
            "  --resume F        continue from checkpoint F, or latest in run.checkpoint_dir\n"
            "                    (shorthand for --set run.resume=F)\n"
            "  --print-config    print the effective config and exit\n"
            "  --quiet           only warnings, errors and the summary\n");
}

static void fail_usage(const char *msg, const char *arg) {
    fprintf(stderr, "trainc: error: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    usage(stderr);
    exit(2);
}

/* Writes a shell word, quoted when it needs it. */
static void print_word(FILE *f, const char *w) {
    if (w[0] && strspn(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=.,/:@%") == strlen(w)) {
        fputs(w, f);
        return;
    }
    fputc('\'', f);
    for (; *w; w++) {
        if (*w == '\'') fputs("'\\''", f);
        else fputc(*w, f);
    }
    fputc('\'', f);
}

/* "stopped by SIGTERM at step N; resume with: trainc <the same arguments> --resume FILE" */
static void print_stopped(const TrainSummary *s, int argc, char **argv) {
    fflush(stdout);
    if (!s->checkpoint[0]) {
        fprintf(stderr, "trainc: stopped by %s at step %ld; no checkpoint could be written (see the warnings "
                "above)\n", s->stop_signal, s->steps);
        return;
    }
    fprintf(stderr, "trainc: stopped by %s at step %ld; resume with: trainc", s->stop_signal, s->steps);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--resume") == 0) {
            i++;
            continue;
        }
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc && strncmp(argv[i + 1], "run.resume=", 11) == 0) {
            i++;
            continue;
        }
        fputc(' ', stderr);
        print_word(stderr, argv[i]);
    }
    fputs(" --resume ", stderr);
    print_word(stderr, s->checkpoint);
    fputc('\n', stderr);
}

int main(int argc, char **argv) {
    Dist dist;
    dist_init(&dist); /* first: its fatal hook must run after every other */
    Config *cfg = config_new(trainc_keys, trainc_n_keys);
    const char *config_path = NULL;
    int print_config = 0, bench_loader = 0;
    char err[1024];

    if (dist.world > 1 && argc > 1 && (strcmp(argv[1], "find-batch") == 0 || strcmp(argv[1], "bench-loader") == 0))
        TC_FATAL("%s runs in one process, not under mpirun", argv[1]);
    if (argc > 1 && strcmp(argv[1], "find-batch") == 0) {
        config_free(cfg);
        return find_batch_main(argc - 1, argv + 1);
    }
    if (argc > 1 && strcmp(argv[1], "bench-loader") == 0) {
        bench_loader = 1;
        argv++;
        argc--;
    }

    /* The config file first, then the overrides in command-line order. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) {
            if (++i >= argc) fail_usage("--config needs a file", NULL);
            if (config_path) fail_usage("--config given twice", argv[i]);
            config_path = argv[i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
    }
    if (config_path && config_load_file(cfg, config_path, err, sizeof err) != 0) {
        fprintf(stderr, "trainc: error: %s\n", err);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0) {
            i++;
        } else if (strcmp(a, "--set") == 0 || strcmp(a, "--device") == 0 || strcmp(a, "--resume") == 0) {
            if (i + 1 >= argc) fail_usage("missing value after", a);
            char assignment[4200];
            if (strcmp(a, "--device") == 0) snprintf(assignment, sizeof assignment, "run.device=%s", argv[++i]);
            else if (strcmp(a, "--resume") == 0) snprintf(assignment, sizeof assignment, "run.resume=%s", argv[++i]);
            else snprintf(assignment, sizeof assignment, "%s", argv[++i]);
            if (config_set(cfg, assignment, err, sizeof err) != 0) {
                fprintf(stderr, "trainc: error: %s\n", err);
                return 1;
            }
        } else if (strcmp(a, "--print-config") == 0) {
            print_config = 1;
        } else if (strcmp(a, "--quiet") == 0) {
            log_set_quiet(1);
        } else {
            fail_usage("unknown argument", a);
        }
    }
    if (print_config) {
        config_print(cfg, stdout);
        config_free(cfg);
        return 0;
    }
    if (!config_path) fail_usage("--config FILE is required", NULL);

    if (bench_loader) {
        int rc = bench_loader_main(cfg);
        config_free(cfg);
        return rc;
    }
    if (dist.rank != 0) log_set_quiet(1); /* rank 0 tells the story; the others warn and fail */
    TrainSummary summary;
    train_run_dist(cfg, &summary, NULL, &dist);
    if (dist.rank == 0) {
        if (summary.stop_signal[0]) print_stopped(&summary, argc, argv);
        train_summary_print_json(&summary, stdout);
    }
    config_free(cfg);
    dist_finalize(&dist);
    return summary.exit_status;
}
