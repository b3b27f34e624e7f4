/* trainc: train a net as a config file says.
 *
 *   trainc [bench-loader] --config FILE [--set section.key=value]... [--device cpu|cuda]
 *          [--resume FILE|latest] [--print-config] [--quiet]
 *   trainc find-batch --config FILE [--set ...] [--device cpu|cuda] [--max-batch N]
 *   trainc profile --config FILE [--set ...] [--device cpu|cuda] [--steps A:B] [--trace FILE.json]
 *                  [--html FILE.html] [--graph]
 *   trainc export --checkpoint FILE --format safetensors --out FILE
 *   trainc eval --checkpoint FILE [--data PATH] [--config FILE] [--set ...] [--device cpu|cuda] [--csv FILE]
 *   trainc predict --checkpoint FILE [--top K] [--json] [--device cpu|cuda] IMAGE...
 *   trainc bench-infer --checkpoint FILE | --config FILE [--set ...] [--batch 1,32,256] [--by-layer]
 *   trainc summary --config FILE [--set ...] [--json]
 *   trainc pack --from ROOT --to DIR [--split train,test] [--shard-mb N] [--seed S] [--no-shuffle]
 *   trainc --version | --help
 *
 * bench-loader measures the input pipeline alone (tools/bench_loader.c);
 * find-batch doubles train.batch over child runs to find the fastest size
 * (tools/trainer/find_batch.c); profile times steps A..B op by op and prints
 * them by layer, a diagnosis and the memory split (tools/trainer/profile.c);
 * export writes a checkpoint's tensors under PyTorch's names (tools/trainer/export.c);
 * eval runs a checkpoint over the test split, its net and input preparation
 * the checkpoint's own (tools/trainer/eval.c); predict classifies image files
 * with one, needing no config (tools/trainer/predict.c);
 * bench-infer times the inference path that eval and predict run (tools/trainer/bench_infer.c);
 * pack writes an image folder as WebDataset tar shards (tools/trainer/pack.c); summary prints the
 * config's net layer by layer (tools/trainer/summary.c).
 * Under mpirun (or srun) each process is one rank of a data-parallel run on
 * its host's GPU number local_rank; rank 0 logs, writes checkpoints and prints
 * the summary (profile: its own report, and the trace of every rank; eval:
 * each rank a shard of the test set).
 * The last line of output is one JSON object summing up the run. SIGINT or
 * SIGTERM stops a run after its current step with a checkpoint, exit status
 * 128 + signal and a line saying how to resume. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "runtime/check.h"
#include "runtime/config.h"
#include "runtime/files.h"
#include "runtime/log.h"
#include "runtime/version.h"
#include "tools/trainer/bench_infer.h"
#include "tools/trainer/bench_loader.h"
#include "tools/trainer/export.h"
#include "tools/trainer/eval.h"
#include "tools/trainer/find_batch.h"
#include "tools/trainer/keys.h"
#include "tools/trainer/pack.h"
#include "tools/trainer/predict.h"
#include "tools/trainer/profile.h"
#include "tools/trainer/summary.h"
#include "tools/trainer/train.h"

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
#define PROFILE_DEFAULT_STEPS STRINGIFY(PROFILE_DEFAULT_FIRST) ":" STRINGIFY(PROFILE_DEFAULT_LAST)

/* Each subcommand: its synopsis (the usage's lines) and what it does; "" is training itself. */
typedef struct {
    const char *name, *synopsis, *help;
} Subcommand;

static const Subcommand subcommands[] = {
    {"", "trainc [bench-loader] --config FILE [--set section.key=value]...\n"
         "              [--device cpu|cuda] [--resume FILE|latest] [--print-config] [--quiet]\n", NULL},
    {"bench-loader", NULL, "time loading plus copying alone over the lab's grid (needs a GPU)\n"},
    {"find-batch", "trainc find-batch --config FILE [--set ...] [--device D] [--max-batch N]\n",
     "double train.batch until out of memory or samples/s stops growing 5%,\n"
     "up to --max-batch (65536); prints the table and the best batch\n"},
    {"profile", "trainc profile --config FILE [--set ...] [--device D] [--steps A:B] [--trace FILE.json]\n"
                "                      [--html FILE.html] [--graph]\n",
     "run the config's steps 1..B, time steps A..B op by op through the op hook\n"
     "(--steps; default " PROFILE_DEFAULT_STEPS ", on the GPU longer where the step is short: enough\n"
     "for NVML's utilisation and power, at most " STRINGIFY(PROFILE_AUTO_MAX_STEPS) " steps) and print them by\n"
     "layer, a diagnosis by phase and the memory split; --trace writes them as\n"
     "Chrome trace-event JSON (Perfetto); --html writes one self-contained page:\n"
     "timeline, layers, roofline, findings; --graph keeps the step in its CUDA graph\n"
     "(perf.cuda_graph on, GPU): CUPTI's kernels, the phases and the diagnosis,\n"
     "the FLOPs per step, no per-layer times\n"},
    {"eval", "trainc eval --checkpoint FILE [--data PATH] [--config FILE] [--set ...] [--device D]\n"
             "                   [--csv FILE]\n",
     "rebuild the checkpoint's net from the checkpoint and print its top-1 (and\n"
     "top-5) accuracy, loss, per-class accuracy and confusion matrix on the test\n"
     "split of --data (data.path; data.source is the checkpoint's); the image size,\n"
     "classes, layout, precision and normalisation are the checkpoint's, and a\n"
     "config that sets them otherwise is refused naming the key; --config and --set\n"
     "may set the data, train.batch and the device; --csv writes the last two as CSV\n"},
    {"keys", "trainc keys        every config key as a Markdown table (docs/config-keys.md)\n", NULL},
    {"export", "trainc export --checkpoint FILE --format safetensors --out FILE\n",
     "a checkpoint's weights as safetensors with PyTorch's names (ONNX: through\n"
     "tools/torch_load_safetensors.py --onnx)\n"},
    {"predict", "trainc predict --checkpoint FILE [--top K] [--json] [--device D] IMAGE...\n",
     "classify JPEG, PNG or BMP images with a checkpoint (no config: it holds the\n"
     "model, input preparation and class names); prints each image's top-K classes\n"
     "(default 5) with probabilities, JSON lines with --json\n"},
    {"bench-infer", "trainc bench-infer --checkpoint FILE | --config FILE [--set ...] [--batch 1,32,256]\n"
                    "                          [--by-layer]\n",
     "images/s and latency (p50, p99) of the inference path eval and predict run\n"
     "(batch norm folded, fused epilogues, fp16 NHWC, a CUDA graph per batch size)\n"
     "for each --batch size: of the checkpoint's net (rebuilt from it; no config\n"
     "needed) with its weights, or of the config's net with random ones;\n"
     "--by-layer also times each op of an eager forward, by layer (needs a GPU)\n"},
    {"pack", "trainc pack --from ROOT --to DIR [--split train,test] [--shard-mb N] [--seed S]\n",
     "write an image folder's splits as WebDataset tar shards (data.source = shards)\n"},
    {"summary", "trainc summary --config FILE [--set ...] [--json]\n",
     "the config's net, each layer with its output shape, parameters and FLOPs a\n"
     "forward per image, and the totals (CPU, no data); --json: one JSON line of\n"
     "the layers, their inputs and arguments and the tensors (tools/torch_net.py)\n"},
};
#define N_SUBCOMMANDS ((int)(sizeof subcommands / sizeof subcommands[0]))

static const char *const common_options =
    "  --config FILE     INI file (may include others)\n"
    "  --set k=v         override one key, e.g. --set train.batch=256\n"
    "  --device D        shorthand for --set run.device=D\n"
    "  --resume F        continue from checkpoint F, or latest in run.checkpoint_dir\n"
    "                    (shorthand for --set run.resume=F)\n"
    "  --print-config    print the effective config and exit\n"
    "  --quiet           only warnings, errors and the summary\n"
    "  --version         trainc's version and commit, and the CUDA, cuDNN and NCCL it finds\n"
    "  --help            this text\n";

static const Subcommand *find_subcommand(const char *name) {
    for (int i = 1; i < N_SUBCOMMANDS; i++)
        if (strcmp(subcommands[i].name, name) == 0) return &subcommands[i];
    return NULL;
}

/* Text of several lines, each after 'indent' spaces but the first, which follows 'first'. */
static void print_indented(FILE *f, const char *first, const char *text, int indent) {
    fputs(first, f);
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);
        if (p != text) fprintf(f, "%*s", indent, "");
        fwrite(p, 1, len, f);
        p += len;
    }
}

static void print_help_line(FILE *f, const Subcommand *c) {
    char first[32];
    snprintf(first, sizeof first, "  %-16s  ", c->name);
    print_indented(f, first, c->help, 20);
}

static void usage(FILE *f) {
    for (int i = 0; i < N_SUBCOMMANDS; i++)
        if (subcommands[i].synopsis) fprintf(f, "%s%s", i ? "       " : "usage: ", subcommands[i].synopsis);
    fputs("       trainc --version | --help\n", f);
    for (int i = 1; i < N_SUBCOMMANDS; i++)
        if (subcommands[i].help) print_help_line(f, &subcommands[i]);
    fputs(common_options, f);
}

/* trainc SUBCOMMAND --help: its synopsis, what it does, the options. */
static void usage_of(FILE *f, const Subcommand *c) {
    fprintf(f, "usage: %s", c->synopsis ? c->synopsis : subcommands[0].synopsis);
    if (c->help) print_help_line(f, c);
    if (strcmp(c->name, "keys") != 0) fputs(common_options, f);
}

/* The edit distance of a and b (both short). */
static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b), row[64];
    if (la > 62 || lb > 62) return 99;
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

/* argv[1] is a word that names no subcommand: say so, name them, suggest the nearest. */
static _Noreturn void unknown_subcommand(const char *word) {
    const Subcommand *nearest = NULL;
    int best = 99;
    for (int i = 1; i < N_SUBCOMMANDS; i++) {
        int d = edit_distance(word, subcommands[i].name);
        if (d < best) best = d, nearest = &subcommands[i];
    }
    fprintf(stderr, "trainc: error: unknown subcommand '%s'", word);
    if (nearest && best <= 2) fprintf(stderr, " (did you mean '%s'?)", nearest->name);
    fputs("; the subcommands:", stderr);
    for (int i = 1; i < N_SUBCOMMANDS; i++) fprintf(stderr, " %s", subcommands[i].name);
    fputs("; training takes none: trainc --config FILE (trainc --help)\n", stderr);
    exit(2);
}

static void fail_usage(const char *msg, const char *arg) {
    fprintf(stderr, "trainc: error: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    usage(stderr);
    exit(2);
}

/* One --set, --device or --resume, in command-line order. */
typedef struct {
    const char *option; /* "--set", "--device" or "--resume" */
    const char *value;  /* as given */
    char *assignment;   /* section.key=value */
} Override;

typedef struct {
    const char *program; /* argv[0], as invoked */
    const char *config_path;
    const char *steps, *trace, *html; /* profile's --steps, --trace and --html; NULL: not given */
    int graph;                 /* profile's --graph */
    const char *checkpoint, *csv; /* eval's --checkpoint (also bench-infer's) and --csv; NULL: not given */
    int data;                     /* eval's --data given (an override of data.path) */
    const char *batches;          /* bench-infer's --batch; NULL: not given */
    int by_layer;                 /* bench-infer's --by-layer */
    int json;                     /* summary's --json */
    Override *overrides;
    int n_overrides;
    int print_config, quiet, version, help;
} Args;

static char *concat(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (!s) TC_FATAL("out of memory");
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

static void add_override(Args *a, const char *option, const char *value, const char *key_prefix) {
    Override *grown = realloc(a->overrides, (size_t)(a->n_overrides + 1) * sizeof *grown);
    if (!grown) TC_FATAL("out of memory");
    a->overrides = grown;
    a->overrides[a->n_overrides++] = (Override){option, value, concat(key_prefix, value)};
}

static void free_args(Args *a) {
    for (int i = 0; i < a->n_overrides; i++) free(a->overrides[i].assignment);
    free(a->overrides);
}

/* The options after the subcommand; exits 2 on a bad command line. */
static void parse_args(int argc, char **argv, Args *a) {
    static const struct option options[] = {
        {"config", required_argument, NULL, 'c'},  {"set", required_argument, NULL, 's'},
        {"device", required_argument, NULL, 'd'},  {"resume", required_argument, NULL, 'r'},
        {"print-config", no_argument, NULL, 'p'},  {"quiet", no_argument, NULL, 'q'},
        {"version", no_argument, NULL, 'V'},       {"help", no_argument, NULL, 'h'},
        {"steps", required_argument, NULL, 'S'},   {"trace", required_argument, NULL, 'T'},
        {"checkpoint", required_argument, NULL, 'K'}, {"csv", required_argument, NULL, 'C'},
        {"batch", required_argument, NULL, 'B'},   {"by-layer", no_argument, NULL, 'L'},
        {"graph", no_argument, NULL, 'G'},     {"json", no_argument, NULL, 'J'},
        {"data", required_argument, NULL, 'D'}, {"html", required_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    opterr = 0; /* our own messages, with the usage */
    optind = 1;
    for (int opt; (opt = getopt_long(argc, argv, ":h", options, NULL)) != -1;) {
        switch (opt) {
        case 'c':
            if (a->config_path) fail_usage("--config given twice", optarg);
            a->config_path = optarg;
            break;
        case 's': add_override(a, "--set", optarg, ""); break;
        case 'd': add_override(a, "--device", optarg, "run.device="); break;
        case 'r': add_override(a, "--resume", optarg, "run.resume="); break;
        case 'p': a->print_config = 1; break;
        case 'q': a->quiet = 1; break;
        case 'V': a->version = 1; break;
        case 'h': a->help = 1; break;
        case 'S': a->steps = optarg; break;
        case 'T': a->trace = optarg; break;
        case 'H': a->html = optarg; break;
        case 'K': a->checkpoint = optarg; break;
        case 'C': a->csv = optarg; break;
        case 'B': a->batches = optarg; break;
        case 'L': a->by_layer = 1; break;
        case 'G': a->graph = 1; break;
        case 'J': a->json = 1; break;
        case 'D':
            a->data = 1;
            add_override(a, "--data", optarg, "data.path=");
            break;
        case ':': fail_usage("missing value after", argv[optind - 1]); break;
        default: /* '?': unknown, or an abbreviation that fits two options */
            fail_usage(optopt ? "unknown option" : "unknown or ambiguous option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        fail_usage(strcmp(argv[optind], "bench-loader") == 0 || strcmp(argv[optind], "find-batch") == 0 ||
                       strcmp(argv[optind], "profile") == 0 || strcmp(argv[optind], "eval") == 0 ||
                       strcmp(argv[optind], "bench-infer") == 0 || strcmp(argv[optind], "summary") == 0
                       ? "a subcommand comes first, before any option"
                       : "unexpected argument",
                   argv[optind]);
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

/* Whether an override sets run.resume: the hint replaces it. */
static int sets_resume(const Override *o) {
    const char *key = o->assignment + strspn(o->assignment, " \t");
    size_t n = strcspn(key, "= \t");
    return n == strlen("run.resume") && strncmp(key, "run.resume", n) == 0;
}

/* "stopped by SIGTERM at step N; resume with: <argv[0]> <the same options> --resume FILE" */
static void print_stopped(const TrainSummary *s, const Args *a) {
    fflush(stdout);
    if (!s->checkpoint[0] && s->steps == 0) {
        fprintf(stderr, "trainc: stopped by %s before the first step: nothing to save, no checkpoint written\n",
                s->stop_signal);
        return;
    }
    if (!s->checkpoint[0]) {
        fprintf(stderr, "trainc: stopped by %s at step %ld; no checkpoint could be written (see the warnings "
                "above)\n", s->stop_signal, s->steps);
        return;
    }
    fprintf(stderr, "trainc: stopped by %s at step %ld; resume with: ", s->stop_signal, s->steps);
    print_word(stderr, a->program);
    if (a->config_path) {
        fputs(" --config ", stderr);
        print_word(stderr, a->config_path);
    }
    for (int i = 0; i < a->n_overrides; i++) {
        if (sets_resume(&a->overrides[i])) continue;
        fprintf(stderr, " %s ", a->overrides[i].option);
        print_word(stderr, a->overrides[i].value);
    }
    if (a->quiet) fputs(" --quiet", stderr);
    fputs(" --resume ", stderr);
    print_word(stderr, s->checkpoint);
    fputc('\n', stderr);
}

/* The config file first, then the overrides in command-line order; exits 1 on an error. */
static Config *load_config(const Args *a) {
    Config *cfg = config_new(trainc_keys, trainc_n_keys);
    char *err = NULL;
    int rc = a->config_path ? config_load_file_msg(cfg, a->config_path, &err) : 0;
    for (int i = 0; rc == 0 && i < a->n_overrides; i++) rc = config_set_msg(cfg, a->overrides[i].assignment, &err);
    if (rc != 0) {
        fprintf(stderr, "trainc: error: %s\n", err);
        exit(1);
    }
    return cfg;
}

/* An output refused before the work that makes it (it is checked again when written). */
static void check_output_early(const char *option, const char *out, const char *input) {
    char err[4400];
    if (input) files_note_input(input, -1);
    if (out && files_check_output(out, err, sizeof err) != 0) TC_USER_ERROR("%s %s: %s", option, out, err);
}

/* trainc profile: the report on stdout (under mpirun rank 0's, with the
 * trace of every rank); exits 2 on a bad --steps (or one too early for --graph). */
static int profile_main(const Args *a, Config *cfg, Dist *dist) {
    long first = PROFILE_DEFAULT_FIRST, last = PROFILE_AUTO_LAST; /* chosen unless --steps */
    char err[256];
    if (a->steps && profile_parse_steps(a->steps, &first, &last, err, sizeof err) != 0) fail_usage(err, NULL);
    if (a->graph && first < PROFILE_GRAPH_FIRST)
        fail_usage("--graph: step 1 runs eagerly and step 2 captures the CUDA graph; start --steps at 3 or later",
                   NULL);
    if (dist->rank != 0) log_set_quiet(1);
    check_output_early("--trace", a->trace, NULL);
    check_output_early("--html", a->html, NULL);
    ProfileReport r;
    profile_run_dist(cfg, dist, first, last, a->trace, a->graph, &r);
    if (dist->rank == 0) {
        profile_print(&r, stdout);
        profile_print_ranks(&r, stdout);
        if (a->html) profile_html_write(&r, a->html);
        train_summary_print_json(&r.summary, stdout);
    }
    profile_report_free(&r);
    return 0;
}

/* trainc eval: the report and the JSON line on stdout (under mpirun rank 0's),
 * the CSV from rank 0. */
static int eval_main(const Args *a, Config *cfg, Dist *dist) {
    if (dist->rank != 0) log_set_quiet(1);
    check_output_early("--csv", a->csv, a->checkpoint);
    EvalReport r;
    eval_run(cfg, dist, a->checkpoint, &r);
    if (dist->rank == 0) {
        eval_print(&r, stdout);
        char err[4400];
        if (a->csv && eval_write_csv(&r, a->csv, err, sizeof err) != 0) TC_USER_ERROR("--csv %s: %s", a->csv, err);
        eval_print_json(&r, stdout);
    }
    eval_report_free(&r);
    return 0;
}

/* docs/config-keys.md is this output; a test keeps them equal. */
static void print_keys(FILE *f) {
    fputs("# Config keys\n\n"
          "Every key trainc reads, from the key schema in tools/trainer/keys.c (`build/trainc keys` prints this\n"
          "page). A value outside its allowed range, of the wrong type or under an unknown key stops\n"
          "trainc with the file and line it came from. Intervals: `[a, b]` includes both ends, `(a, b]`\n"
          "leaves a out.\n\n", f);
    config_schema_markdown(trainc_keys, trainc_n_keys, f);
}

int main(int argc, char **argv) {
    Dist dist;
    dist_init(&dist); /* first: its fatal hook must run after every other */
    /* Past ulimit -f a write fails with EFBIG, and the file's writer says so, instead of the signal ending us. */
    signal(SIGXFSZ, SIG_IGN);
    const char *subcommand = argc > 1 && (strcmp(argv[1], "find-batch") == 0 || strcmp(argv[1], "bench-loader") == 0 ||
                                          strcmp(argv[1], "profile") == 0 || strcmp(argv[1], "eval") == 0 ||
                                          strcmp(argv[1], "bench-infer") == 0 || strcmp(argv[1], "summary") == 0)
                           ? argv[1] : NULL;
    if (subcommand && strcmp(subcommand, "profile") != 0 && strcmp(subcommand, "eval") != 0 && dist.world > 1)
        TC_FATAL("%s runs in one process, not under mpirun", subcommand);
    if (subcommand && strcmp(subcommand, "find-batch") == 0) return find_batch_main(argc - 1, argv + 1);

    if (argc > 1 && (strcmp(argv[1], "export") == 0 || strcmp(argv[1], "predict") == 0 ||
                     strcmp(argv[1], "pack") == 0)) {
        int rc = strcmp(argv[1], "export") == 0    ? export_main(argc - 1, argv + 1)
                 : strcmp(argv[1], "predict") == 0 ? predict_main(argc - 1, argv + 1)
                                                   : pack_main(argc - 1, argv + 1);
        dist_finalize(&dist);
        return rc;
    }
    if (argc > 1 && strcmp(argv[1], "keys") == 0) {
        int help = argc == 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0);
        if (argc > 2 && !help) fail_usage("trainc keys takes no argument", argv[2]);
        if (help) usage_of(stdout, find_subcommand("keys"));
        else print_keys(stdout);
        dist_finalize(&dist);
        return 0;
    }
    if (argc > 1 && argv[1][0] != '-' && !find_subcommand(argv[1])) unknown_subcommand(argv[1]);
    Args args = {.program = argv[0]};
    if (subcommand) parse_args(argc - 1, argv + 1, &args);
    else parse_args(argc, argv, &args);
    if (args.help || args.version) {
        if (args.help && subcommand) usage_of(stdout, find_subcommand(subcommand));
        else if (args.help) usage(stdout);
        else trainc_print_version(stdout);
        free_args(&args);
        dist_finalize(&dist);
        return 0;
    }
    int profiling = subcommand && strcmp(subcommand, "profile") == 0;
    int evaluating = subcommand && strcmp(subcommand, "eval") == 0;
    int bench_infer = subcommand && strcmp(subcommand, "bench-infer") == 0;
    int summary = subcommand && strcmp(subcommand, "summary") == 0;
    if ((args.steps || args.trace || args.html || args.graph) && !profiling)
        fail_usage("--steps, --trace, --html and --graph belong to trainc profile", NULL);
    if (args.csv && !evaluating) fail_usage("--csv belongs to trainc eval", NULL);
    if (args.data && !evaluating) fail_usage("--data belongs to trainc eval", NULL);
    if (args.checkpoint && !evaluating && !bench_infer)
        fail_usage("--checkpoint belongs to trainc eval and trainc bench-infer", NULL);
    if ((args.batches || args.by_layer) && !bench_infer)
        fail_usage("--batch and --by-layer belong to trainc bench-infer", NULL);
    if (args.json && !summary) fail_usage("--json belongs to trainc summary (and trainc predict)", NULL);
    if (evaluating && !args.checkpoint) fail_usage("trainc eval needs --checkpoint FILE", NULL);
    if (args.quiet) log_set_quiet(1);
    Config *cfg = load_config(&args);
    int rc = 0;
    if (args.print_config) {
        config_print(cfg, stdout);
    } else if (!args.config_path && !evaluating && !(bench_infer && args.checkpoint)) {
        fail_usage(bench_infer ? "trainc bench-infer needs --checkpoint FILE or --config FILE"
                               : "--config FILE is required", NULL);
    } else if (profiling) {
        rc = profile_main(&args, cfg, &dist);
    } else if (evaluating) {
        rc = eval_main(&args, cfg, &dist);
    } else if (bench_infer) {
        rc = bench_infer_main(cfg, args.batches, args.checkpoint, args.by_layer);
    } else if (summary) {
        rc = summary_main(cfg, args.json);
    } else if (subcommand) {
        rc = bench_loader_main(cfg);
    } else {
        if (dist.rank != 0) log_set_quiet(1); /* rank 0 tells the story; the others warn and fail */
        TrainSummary summary;
        train_run_dist(cfg, &summary, NULL, &dist);
        if (dist.rank == 0) {
            if (summary.stop_signal[0]) print_stopped(&summary, &args);
            train_summary_print_json(&summary, stdout);
        }
        rc = summary.exit_status;
    }
    config_free(cfg);
    free_args(&args);
    dist_finalize(&dist);
    return rc;
}
