/* trainc pack: each split of an image folder, root/<split>/<class>/<image>,
 * written as DIR/<split>-000000.tar ... in a seeded shuffled order (so that a
 * shard holds every class), with DIR/classes.txt. */
#include "tools/trainer/pack.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/shards.h"
#include "runtime/log.h"

#define PACK_DEFAULT_SHARD_MB 256

typedef struct {
    const char *from, *to, *splits;
    long shard_mb;
    unsigned long long seed;
    int shuffle;
} PackArgs;

static int pack_usage(FILE *f, int status) {
    fprintf(f, "usage: trainc pack --from ROOT --to DIR [--split train,test] [--shard-mb %d] [--seed 0]\n"
               "                   [--no-shuffle]\n"
               "  writes each split of the image folder ROOT/<split>/<class>/<image> as WebDataset tar shards\n"
               "  DIR/<split>-000000.tar ... of about --shard-mb MiB each, the samples in an order shuffled from\n"
               "  --seed (--no-shuffle: the folder's sorted order), each KEY.jpg (or .png, .bmp) and KEY.cls,\n"
               "  and DIR/classes.txt; train with data.source = shards and data.path = DIR. A split that is\n"
               "  not there is passed over (--split names the ones to pack); shards there already are never\n"
               "  replaced.\n", PACK_DEFAULT_SHARD_MB);
    return status;
}

static int pack_fail(int status, const char *fmt, const char *what) {
    fprintf(stderr, "trainc: error: ");
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    if (status == 2) pack_usage(stderr, 2);
    return status;
}

static int parse_args(int argc, char **argv, PackArgs *a, int *help) {
    static const struct option options[] = {{"from", required_argument, NULL, 'f'},
                                            {"to", required_argument, NULL, 't'},
                                            {"split", required_argument, NULL, 's'},
                                            {"shard-mb", required_argument, NULL, 'm'},
                                            {"seed", required_argument, NULL, 'S'},
                                            {"no-shuffle", no_argument, NULL, 'n'},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    *a = (PackArgs){.splits = "train,test", .shard_mb = PACK_DEFAULT_SHARD_MB, .shuffle = 1};
    *help = 0;
    opterr = 0;
    optind = 1;
    char *end;
    for (int opt; (opt = getopt_long(argc, argv, ":h", options, NULL)) != -1;) {
        switch (opt) {
        case 'f': a->from = optarg; break;
        case 't': a->to = optarg; break;
        case 's': a->splits = optarg; break;
        case 'm':
            a->shard_mb = strtol(optarg, &end, 10);
            if (end == optarg || *end || a->shard_mb < 1 || a->shard_mb > 1048576)
                return pack_fail(2, "--shard-mb %s: a whole number of MiB from 1 to 1048576", optarg);
            break;
        case 'S':
            a->seed = strtoull(optarg, &end, 10);
            if (end == optarg || *end || optarg[0] == '-')
                return pack_fail(2, "--seed %s: a whole number >= 0", optarg);
            break;
        case 'n': a->shuffle = 0; break;
        case 'h': *help = 1; return 0;
        case ':': return pack_fail(2, "missing value after %s", argv[optind - 1]);
        default: return pack_fail(2, "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return pack_fail(2, "unexpected argument: %s", argv[optind]);
    if (!a->from || !a->to) return pack_fail(2, "%s", "trainc pack needs --from ROOT and --to DIR");
    return 0;
}

static void report(void *user, int shards, int done, int total, int64_t bytes) {
    (void)bytes;
    log_info("pack %s: %d shards, %d of %d samples", (const char *)user, shards, done, total);
}

/* One split; 0 packed, 1 not there (passed over), -1 failed (message printed). */
static int pack_split(const PackArgs *a, const char *split) {
    Source s;
    char err[4600];
    if (source_open_folder(&s, a->from, split, 0, err, sizeof err) != 0) {
        if (strcmp(split, "test") == 0 && strstr(err, "No such file")) return 1;
        fprintf(stderr, "trainc: error: %s\n", err);
        return -1;
    }
    PackOptions opt = {.shard_bytes = (int64_t)a->shard_mb << 20, .seed = a->seed, .shuffle = a->shuffle,
                       .progress = report, .user = (void *)split};
    int shards;
    double t0 = now_seconds();
    int rc = shards_write(&s, a->to, split, &opt, &shards, err, sizeof err);
    if (rc != 0) fprintf(stderr, "trainc: error: %s\n", err);
    else
        printf("%s: %d samples of %d classes (%.1f MiB) into %d shards in %s, %.1f s\n", split, s.n, s.num_classes,
               s.bytes_total / 1048576.0, shards, a->to, now_seconds() - t0);
    source_free(&s);
    return rc;
}

int pack_main(int argc, char **argv) {
    PackArgs a;
    int help;
    int rc = parse_args(argc, argv, &a, &help);
    if (rc != 0) return rc;
    if (help) return pack_usage(stdout, 0);
    char splits[256];
    snprintf(splits, sizeof splits, "%s", a.splits);
    int packed = 0;
    for (char *save = NULL, *split = strtok_r(splits, ",", &save); split; split = strtok_r(NULL, ",", &save)) {
        int r = pack_split(&a, split);
        if (r < 0) return 1;
        packed += r == 0;
    }
    if (!packed) return pack_fail(1, "%s: no split to pack", a.from);
    return 0;
}
