/* The INI reader: includes, --set, origins, every error message, print round
 * trip; ranges, 32-bit floats, byte-order marks, values of any length, and the
 * messages about settings that name where a value came from. */
#include "runtime/config.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness.h"

/* run.device comes last so that config_print must group it under [run]. */
static const CfgKeySpec schema[] = {
    {"run.name", CFG_STRING, "demo", NULL, "Name of the run", NULL},
    {"run.seed", CFG_INT, "42", NULL, "Random seed", NULL},
    {"run.deterministic", CFG_BOOL, "off", NULL, "Deterministic kernels", NULL},
    {"data.root", CFG_STRING, "/tmp/data", NULL, "Dataset directory", NULL},
    {"data.workers", CFG_INT, "4", NULL, "Number of loader threads", NULL},
    {"data.shuffle", CFG_BOOL, "yes", NULL, "Shuffle every epoch", NULL},
    {"optim.lr", CFG_FLOAT, "0.1", NULL, "Learning rate", NULL},
    {"optim.momentum", CFG_FLOAT, "0.9", NULL, NULL, NULL},
    {"optim.kind", CFG_ENUM, "sgd", "sgd|adam|adamw", "Optimizer", NULL},
    {"run.device", CFG_ENUM, "cuda", "cpu|cuda", "Where to train", NULL},
    {"run.metrics_file", CFG_STRING, "", NULL, "Metrics file (empty: none)", NULL},
};
#define N_KEYS ((int)(sizeof schema / sizeof *schema))

static const char *dir; /* scratch directory for fixtures */

static const char *write_fixture(const char *name, const char *text) {
    return test_write_file(dir, name, text, strlen(text));
}

/* dir/name in one of a few rotating buffers, so two can be used at once. */
static const char *path_of(const char *name) {
    static char paths[4][600];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "%s/%s", dir, name);
    return p;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    static char buf[1 << 16];
    buf[0] = '\0';
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static void check_origin(const Config *c, const char *key, const char *want) {
    const char *got = config_origin(c, key);
    CHECK_MSG(strcmp(got, want) == 0, "origin of %s: got '%s', want '%s'", key, got, want);
}

static void test_defaults(void) {
    Config *c = config_new(schema, N_KEYS);
    CHECK(strcmp(config_str(c, "run.name"), "demo") == 0);
    CHECK(config_int(c, "run.seed") == 42);
    CHECK(config_bool(c, "run.deterministic") == 0);
    CHECK(config_bool(c, "data.shuffle") == 1);
    CHECK(config_float(c, "optim.lr") == 0.1);
    CHECK(strcmp(config_str(c, "optim.kind"), "sgd") == 0);
    CHECK(strcmp(config_str(c, "run.metrics_file"), "") == 0);
    for (int k = 0; k < N_KEYS; k++) check_origin(c, schema[k].key, "default");
    config_free(c);
}

/* top.ini includes common/base.ini (which includes deep.ini beside it) and
 * more/lr.ini from inside [optim]; later lines override included ones. */
static void write_include_tree(void) {
    char sub[600];
    snprintf(sub, sizeof sub, "%s/common", dir);
    mkdir(sub, 0755);
    snprintf(sub, sizeof sub, "%s/more", dir);
    mkdir(sub, 0755);
    write_fixture("top.ini",
                  "# top-level config\n"           /* 1 */
                  "include = common/base.ini\n"    /* 2 */
                  "[data]\n"                       /* 3 */
                  "workers = 16   # overrides 8\n" /* 4 */
                  "[optim]\n"                      /* 5 */
                  "include = more/lr.ini\n"        /* 6 */
                  "momentum = 0.5\n");             /* 7: still in [optim] after the include */
    write_fixture("common/base.ini",
                  "include = deep.ini\n" /* 1 */
                  "[data]\n"             /* 2 */
                  "workers = 8\n"        /* 3 */
                  "root = /data/base\n"  /* 4 */
                  "shuffle = no\n"       /* 5 */
                  "[optim]\n"            /* 6 */
                  "lr = 0.5\n"           /* 7 */
                  "kind = adam\n"        /* 8 */
                  "[run]\n"              /* 9 */
                  "seed = 11\n");        /* 10: overrides deep.ini */
    write_fixture("common/deep.ini", "[run]\nname = deep\nseed = 7\n");
    write_fixture("more/lr.ini", "[optim]\nlr = 0.25\n");
}

static void test_includes_and_set(void) {
    write_include_tree();
    char err[1024] = "";
    char want[700];
    Config *c = config_new(schema, N_KEYS);
    int rc = config_load_file(c, path_of("top.ini"), err, sizeof err);
    CHECK_MSG(rc == 0, "load top.ini: %s", err);

    CHECK(config_int(c, "data.workers") == 16);
    snprintf(want, sizeof want, "%s:4", path_of("top.ini"));
    check_origin(c, "data.workers", want);
    CHECK(strcmp(config_str(c, "data.root"), "/data/base") == 0);
    snprintf(want, sizeof want, "%s:4", path_of("common/base.ini"));
    check_origin(c, "data.root", want);
    CHECK(config_bool(c, "data.shuffle") == 0);
    CHECK(config_float(c, "optim.lr") == 0.25);
    snprintf(want, sizeof want, "%s:2", path_of("more/lr.ini"));
    check_origin(c, "optim.lr", want);
    CHECK(config_float(c, "optim.momentum") == 0.5);
    snprintf(want, sizeof want, "%s:7", path_of("top.ini"));
    check_origin(c, "optim.momentum", want);
    CHECK(strcmp(config_str(c, "optim.kind"), "adam") == 0);
    CHECK(strcmp(config_str(c, "run.name"), "deep") == 0);
    snprintf(want, sizeof want, "%s:2", path_of("common/deep.ini"));
    check_origin(c, "run.name", want);
    CHECK(config_int(c, "run.seed") == 11);
    check_origin(c, "run.device", "default");

    /* --set overrides both the top file and the included ones. */
    const char *sets[] = {"data.workers=32", "  optim.lr = 1e-3 ", "run.name=cli", "data.shuffle=ON",
                          "run.device=cpu"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        CHECK_MSG(config_set(c, sets[i], err, sizeof err) == 0, "%s: %s", sets[i], err);
    CHECK(config_int(c, "data.workers") == 32);
    CHECK(config_float(c, "optim.lr") == 1e-3);
    CHECK(strcmp(config_str(c, "run.name"), "cli") == 0);
    CHECK(config_bool(c, "data.shuffle") == 1);
    CHECK(strcmp(config_str(c, "run.device"), "cpu") == 0);
    check_origin(c, "data.workers", "--set");
    check_origin(c, "optim.lr", "--set");
    check_origin(c, "run.name", "--set");
    config_free(c);
}

static void test_comments_and_whitespace(void) {
    const char *path = write_fixture("spaces.ini",
                                     "\n"
                                     "   # indented comment\n"
                                     "\t; tab comment\n"
                                     "[ data ]   # header comment\n"
                                     "\tworkers\t=\t  12   ; trailing\n"
                                     "root = /a#b;c  ;comment\n"
                                     "   \n"
                                     "[run]# comment right after ]\r\n"
                                     "name = x;y   # ';' and '#' need whitespace before them\r\n"
                                     "deterministic = Yes\r\n"
                                     "seed=-9223372036854775808\n"
                                     "metrics_file =   # an empty string is a value\n"
                                     "[optim]\n"
                                     "lr = -1.5e-3\n"
                                     "kind=adamw"); /* no final newline */
    char err[1024] = "";
    Config *c = config_new(schema, N_KEYS);
    CHECK_MSG(config_load_file(c, path, err, sizeof err) == 0, "%s", err);
    CHECK(config_int(c, "data.workers") == 12);
    CHECK(strcmp(config_str(c, "data.root"), "/a#b;c") == 0);
    CHECK(strcmp(config_str(c, "run.name"), "x;y") == 0);
    CHECK(config_bool(c, "run.deterministic") == 1);
    CHECK(config_int(c, "run.seed") == INT64_MIN);
    CHECK(config_float(c, "optim.lr") == -1.5e-3);
    CHECK(strcmp(config_str(c, "optim.kind"), "adamw") == 0);
    CHECK(strcmp(config_str(c, "run.metrics_file"), "") == 0);
    char want[700];
    snprintf(want, sizeof want, "%s:15", path);
    check_origin(c, "optim.kind", want);
    config_free(c);
}

/* Longer than one read buffer: line numbers still count every line. */
static void test_long_file(void) {
    static char text[64 * 1024];
    size_t n = 0;
    for (int i = 0; i < 2000; i++) n += (size_t)snprintf(text + n, sizeof text - n, "# comment line %d\n", i);
    snprintf(text + n, sizeof text - n, "[data]\nworkers = 7\n");
    const char *path = write_fixture("long.ini", text);
    char err[1024] = "", want[700];
    Config *c = config_new(schema, N_KEYS);
    CHECK_MSG(config_load_file(c, path, err, sizeof err) == 0, "%s", err);
    CHECK(config_int(c, "data.workers") == 7);
    snprintf(want, sizeof want, "%s:2002", path);
    check_origin(c, "data.workers", want);
    config_free(c);
}

static void test_bool_spellings(void) {
    const char *spellings[] = {"on", "OFF", "True", "false", "YES", "no", "1", "0"};
    Config *c = config_new(schema, N_KEYS);
    char assignment[64], err[512];
    for (int i = 0; i < 8; i++) {
        snprintf(assignment, sizeof assignment, "run.deterministic=%s", spellings[i]);
        CHECK_MSG(config_set(c, assignment, err, sizeof err) == 0, "%s", err);
        CHECK_MSG(config_bool(c, "run.deterministic") == (i % 2 == 0), "%s", spellings[i]);
    }
    config_free(c);
}

typedef struct {
    const char *text;
    int line;           /* the line the message must name */
    const char *want[3];/* substrings the message must hold */
    const char *reject; /* a substring it must not hold, or NULL */
} FileErrorCase;

static const FileErrorCase file_errors[] = {
    {"[dta]\nworkers = 1\n", 1, {"unknown section [dta]", "did you mean [data]?"}, NULL},
    {"[zebra]\n", 1, {"unknown section [zebra]"}, "did you mean"},
    {"[data]\nworker = 1\n", 2, {"unknown key data.worker", "did you mean data.workers?"}, NULL},
    {"[optim]\nworkers = 2\n", 2, {"unknown key optim.workers", "did you mean data.workers?"}, NULL},
    {"[data]\ncolour = red\n", 2, {"unknown key data.colour"}, "did you mean"},
    {"workers = 1\n[data]\n", 1, {"'workers'", "outside any section"}, NULL},
    {"[data]\njust some words\n", 2, {"malformed line", "just some words"}, NULL},
    {"[data]\n= 3\n", 2, {"malformed line", "no key"}, NULL},
    {"# x\n[data\nworkers = 1\n", 2, {"unterminated", "[data"}, NULL},
    {"[data] extra\n", 1, {"malformed line", "extra"}, NULL},
    {"[]\n", 1, {"empty section name"}, NULL},
    {"[data]\nworkers =\n", 2, {"data.workers", "empty value"}, NULL},
    {"[data]\nworkers = # none\n", 2, {"data.workers", "empty value"}, NULL},
    {"[optim]\nlr =\n", 2, {"optim.lr", "empty value"}, NULL},
    {"[run]\ndeterministic =\n", 2, {"run.deterministic", "empty value"}, NULL},
    {"[optim]\nkind =\n", 2, {"optim.kind", "empty value"}, NULL},
    {"[data]\nworkers = 4x\n", 2, {"data.workers", "'4x'", "base-10 integer"}, NULL},
    {"[data]\nworkers = 0x10\n", 2, {"data.workers", "'0x10'", "base-10 integer"}, NULL},
    {"[data]\nworkers = 1.5\n", 2, {"data.workers", "'1.5'"}, NULL},
    {"[data]\nworkers = 9223372036854775808\n", 2, {"data.workers", "64-bit"}, NULL},
    {"[data]\nworkers = -9223372036854775809\n", 2, {"data.workers", "64-bit"}, NULL},
    {"[optim]\nlr = fast\n", 2, {"optim.lr", "'fast'", "not a number"}, NULL},
    {"[optim]\nlr = 1.0.0\n", 2, {"optim.lr", "not a number"}, NULL},
    {"[optim]\nlr = inf\n", 2, {"optim.lr", "finite"}, NULL},
    {"[optim]\nlr = nan\n", 2, {"optim.lr", "finite"}, NULL},
    {"[optim]\nlr = 1e999\n", 2, {"optim.lr", "1e999 overflows a 64-bit float"}, NULL},
    {"[optim]\nlr = -1e999\n", 2, {"optim.lr", "overflows a 64-bit float"}, NULL},
    {"[optim]\nlr = 1e-999\n", 2, {"optim.lr", "underflows a 64-bit float"}, NULL},
    {"[optim]\nlr = -inf\n", 2, {"optim.lr", "finite"}, NULL},
    {"[optim]\nlr = Infinity\n", 2, {"optim.lr", "finite"}, NULL},
    {"[optim]\nlr = NaN(1)\n", 2, {"optim.lr", "finite"}, NULL},
    {"[data]\nworkers = 12abc\n", 2, {"data.workers", "'12abc'", "base-10 integer"}, NULL},
    {"[data]\nworkers = 1 2\n", 2, {"data.workers", "'1 2'", "base-10 integer"}, NULL},
    {"[data]\nworkers = 99999999999999999999\n", 2, {"data.workers", "64-bit"}, NULL},
    {"[data]\n\xEF\xBB\xBFworkers = 1\n", 2, {"unknown key data."}, NULL}, /* a BOM only starts a file */
    {"[run]\ndeterministic = maybe\n", 2, {"run.deterministic", "'maybe'", "on/off"}, NULL},
    {"[optim]\nkind = sgdm\n", 2, {"optim.kind", "'sgdm'", "sgd|adam|adamw"}, NULL},
    {"[optim]\nkind = SGD\n", 2, {"optim.kind", "sgd|adam|adamw"}, NULL},
    {"[data]\nworkers = 1\n# again\nworkers = 2\n", 4, {"data.workers", "lines 2 and 4"}, NULL},
    {"[data]\nworkers=1\n[optim]\nlr=1\n[data]\nworkers=2\n", 6, {"data.workers", "lines 2 and 6"}, NULL},
    {"[data]\ninclude = nowhere.ini\n", 2, {"cannot open include", "nowhere.ini"}, NULL},
    {"include =\n", 1, {"include", "empty value"}, NULL},
    /* Not regular files: /dev/zero would read forever, a directory is no config. */
    {"include = /dev/zero\n", 1, {"cannot open include", "/dev/zero", "not a regular file"}, NULL},
    {"include = /\n", 1, {"cannot open include", "it is a directory"}, NULL},
};

static void check_error(const char *err, const char *file, int line, const char *const *want, int n_want,
                        const char *reject) {
    char file_line[700];
    snprintf(file_line, sizeof file_line, "%s:%d: ", file, line);
    CHECK_MSG(strncmp(err, file_line, strlen(file_line)) == 0, "'%s' does not start with '%s'", err, file_line);
    for (int i = 0; i < n_want && want[i]; i++)
        CHECK_MSG(strstr(err, want[i]) != NULL, "'%s' lacks '%s'", err, want[i]);
    if (reject) CHECK_MSG(strstr(err, reject) == NULL, "'%s' holds '%s'", err, reject);
}

static void expect_load_error(const char *path, const char *file, int line, const char *const *want,
                              int n_want, const char *reject) {
    char err[1024] = "";
    Config *c = config_new(schema, N_KEYS);
    int rc = config_load_file(c, path, err, sizeof err);
    CHECK_MSG(rc == -1, "%s loaded", path);
    check_error(err, file, line, want, n_want, reject);
    config_free(c);
}

static void test_file_errors(void) {
    for (size_t i = 0; i < sizeof file_errors / sizeof *file_errors; i++) {
        const FileErrorCase *e = &file_errors[i];
        char name[32];
        snprintf(name, sizeof name, "error%02zu.ini", i);
        const char *path = path_of(name);
        write_fixture(name, e->text);
        expect_load_error(path, path, e->line, e->want, 3, e->reject);
    }
    static const char with_nul[] = "[data]\nwork\0ers = 1\n";
    const char *want_nul[] = {"NUL byte"};
    test_write_file(dir, "nul.ini", with_nul, sizeof with_nul - 1);
    expect_load_error(path_of("nul.ini"), path_of("nul.ini"), 2, want_nul, 1, NULL);
}

static void test_include_errors(void) {
    const char *want_cycle[] = {"include cycle", "cyc_a.ini -> "};
    write_fixture("cyc_a.ini", "[data]\nworkers = 1\ninclude = cyc_b.ini\n");
    write_fixture("cyc_b.ini", "# b\ninclude = cyc_a.ini\n");
    expect_load_error(path_of("cyc_a.ini"), path_of("cyc_b.ini"), 2, want_cycle, 2, NULL);

    const char *want_self[] = {"include cycle", "self.ini -> "};
    write_fixture("self.ini", "include = ./self.ini\n");
    expect_load_error(path_of("self.ini"), path_of("self.ini"), 1, want_self, 2, NULL);

    /* An error inside an included file names that file and its line. */
    const char *want_inner[] = {"optim.lr", "'fast'"};
    write_fixture("outer.ini", "[data]\nworkers = 2\ninclude = inner.ini\n");
    write_fixture("inner.ini", "[optim]\n\nlr = fast\n");
    expect_load_error(path_of("outer.ini"), path_of("inner.ini"), 3, want_inner, 2, NULL);

    /* An included file starts outside any section, whatever section includes it. */
    const char *want_nosec[] = {"'shuffle'", "outside any section"};
    write_fixture("parent.ini", "[data]\ninclude = child.ini\n");
    write_fixture("child.ini", "shuffle = no\n");
    expect_load_error(path_of("parent.ini"), path_of("child.ini"), 1, want_nosec, 2, NULL);

    /* deepNN.ini includes deepNN+1 up to deep19: 16 levels of includes load, 17 don't. */
    for (int i = 0; i < 20; i++) {
        char name[32], text[64];
        snprintf(name, sizeof name, "deep%02d.ini", i);
        if (i < 19) snprintf(text, sizeof text, "include = deep%02d.ini\n", i + 1);
        else snprintf(text, sizeof text, "[data]\nworkers = 19\n");
        write_fixture(name, text);
    }
    char err[1024] = "";
    Config *c = config_new(schema, N_KEYS);
    CHECK_MSG(config_load_file(c, path_of("deep03.ini"), err, sizeof err) == 0, "%s", err);
    CHECK(config_int(c, "data.workers") == 19);
    config_free(c);
    const char *want_deep[] = {"nested more than 16"};
    expect_load_error(path_of("deep02.ini"), path_of("deep18.ini"), 1, want_deep, 1, NULL);

    char missing[700];
    snprintf(missing, sizeof missing, "%s/absent.ini: cannot open", dir);
    c = config_new(schema, N_KEYS);
    CHECK(config_load_file(c, path_of("absent.ini"), err, sizeof err) == -1);
    CHECK_MSG(strstr(err, missing) == err, "%s", err);
    config_free(c);
}

/* A file that fails halfway leaves the config as it was. */
static void test_failed_load_changes_nothing(void) {
    char err[1024] = "";
    Config *c = config_new(schema, N_KEYS);
    CHECK(config_set(c, "data.workers=5", err, sizeof err) == 0);
    const char *path = write_fixture("half.ini", "[data]\nworkers = 9\nroot = /x\n[optim]\nlr = bad\n");
    CHECK(config_load_file(c, path, err, sizeof err) == -1);
    CHECK(config_int(c, "data.workers") == 5);
    check_origin(c, "data.workers", "--set");
    CHECK(strcmp(config_str(c, "data.root"), "/tmp/data") == 0);
    check_origin(c, "data.root", "default");
    config_free(c);
}

static void test_set_errors(void) {
    static const struct {
        const char *assignment;
        const char *want[2];
    } cases[] = {
        {"data.workers", {"section.key=value"}},
        {"workers=3", {"'workers' has no section", "data.workers"}},
        {"dat.workers=3", {"unknown section 'dat'", "did you mean data.workers?"}},
        {"data.wrkers=3", {"unknown key data.wrkers", "did you mean data.workers?"}},
        {"data.workers=three", {"data.workers", "base-10 integer"}},
        {"data.workers=", {"data.workers", "empty value"}},
        {"optim.lr=1e999", {"optim.lr", "overflows"}},
        {"optim.lr=nan", {"optim.lr", "finite"}},
        {"run.deterministic=2", {"run.deterministic", "on/off"}},
        {"optim.kind=lamb", {"optim.kind", "sgd|adam|adamw"}},
        {"run.name=a #b", {"run.name", "comment"}},
    };
    Config *c = config_new(schema, N_KEYS);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[1024] = "", prefix[128];
        CHECK_MSG(config_set(c, cases[i].assignment, err, sizeof err) == -1, "%s", cases[i].assignment);
        snprintf(prefix, sizeof prefix, "--set %s: ", cases[i].assignment);
        CHECK_MSG(strncmp(err, prefix, strlen(prefix)) == 0, "'%s' does not start with '%s'", err, prefix);
        for (int j = 0; j < 2 && cases[i].want[j]; j++)
            CHECK_MSG(strstr(err, cases[i].want[j]) != NULL, "'%s' lacks '%s'", err, cases[i].want[j]);
    }
    CHECK(config_int(c, "data.workers") == 4);
    config_free(c);
}

static void check_same_config(const Config *a, const Config *b) {
    for (int k = 0; k < N_KEYS; k++) {
        const char *key = schema[k].key;
        switch (schema[k].type) {
        case CFG_INT: CHECK_MSG(config_int(a, key) == config_int(b, key), "%s", key); break;
        case CFG_FLOAT:
        case CFG_FLOAT32: CHECK_MSG(config_float(a, key) == config_float(b, key), "%s", key); break;
        case CFG_BOOL: CHECK_MSG(config_bool(a, key) == config_bool(b, key), "%s", key); break;
        case CFG_STRING:
        case CFG_ENUM: CHECK_MSG(strcmp(config_str(a, key), config_str(b, key)) == 0, "%s", key); break;
        }
    }
}

static void test_print_round_trip(void) {
    write_include_tree();
    char err[1024] = "";
    Config *c = config_new(schema, N_KEYS);
    CHECK_MSG(config_load_file(c, path_of("top.ini"), err, sizeof err) == 0, "%s", err);
    CHECK(config_set(c, "data.root=/with#hash;semi", err, sizeof err) == 0);
    CHECK(config_set(c, "optim.lr=0.1000000000000000055511151231257827", err, sizeof err) == 0);
    CHECK(config_set(c, "run.deterministic=yes", err, sizeof err) == 0);
    CHECK(config_set(c, "run.name=", err, sizeof err) == 0); /* the empty string */

    const char *printed = path_of("printed.ini");
    FILE *f = fopen(printed, "w");
    CHECK(f != NULL);
    if (!f) return;
    config_print(c, f);
    fclose(f);
    Config *reloaded = config_new(schema, N_KEYS);
    CHECK_MSG(config_load_file(reloaded, printed, err, sizeof err) == 0, "reload: %s", err);
    check_same_config(c, reloaded);
    CHECK(strstr(config_origin(reloaded, "data.workers"), "printed.ini:") != NULL);

    const char *text = read_all(printed);
    char want[700];
    snprintf(want, sizeof want, "workers = 16  # %s:4\n", path_of("top.ini"));
    CHECK_MSG(strstr(text, want) != NULL, "no '%s' in:\n%s", want, text);
    CHECK(strstr(text, "# Number of loader threads\nworkers = 16") != NULL);
    CHECK(strstr(text, "root = /with#hash;semi  # --set\n") != NULL);
    CHECK(strstr(text, "device = cuda  # default\n") != NULL);
    CHECK(strstr(text, "\nmomentum = 0.5") != NULL); /* no help line: none printed */
    /* Sections in schema order, each once; run.device grouped under [run]. */
    const char *run = strstr(text, "[run]"), *data = strstr(text, "[data]"), *optim = strstr(text, "[optim]");
    CHECK(run == text && data && optim && run < data && data < optim);
    CHECK(strstr(run + 1, "[run]") == NULL);
    CHECK(data && strstr(text, "device =") < data);
    config_free(reloaded);
    config_free(c);
}

/* Runs fn in a child, which must exit 1 with want in its stderr; returns that stderr. */
static const char *expect_fatal(const char *what, void (*fn)(void), const char *want) {
    const char *log = path_of("fatal.txt");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stderr)) _exit(3);
        fn();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 1, "%s: exit status %d", what, status);
    const char *text = read_all(log);
    CHECK_MSG(strstr(text, want) != NULL, "%s: '%s' lacks '%s'", what, text, want);
    return text;
}

/* ------------------------------------------------------------------ ranges */

static const CfgKeySpec ranged[] = {
    {"train.batch", CFG_INT, "32", NULL, "Samples per step", "[1, 1048576]"},
    {"train.shift", CFG_INT, "0", NULL, "A signed int", "[-5, 5]"},
    {"optim.lr", CFG_FLOAT32, "0.01", NULL, "Learning rate", "(0, inf)"},
    {"optim.momentum", CFG_FLOAT32, "0.9", NULL, "Momentum", "[0, 1)"},
    {"optim.scale", CFG_FLOAT, "1", NULL, "A double", "(-inf, 2.5]"},
    {"optim.any", CFG_FLOAT32, "0", NULL, "Any 32-bit float", NULL},
    {"run.name", CFG_STRING, "x", NULL, "Name", NULL},
};
#define N_RANGED ((int)(sizeof ranged / sizeof *ranged))

static void test_range_accepts(void) {
    static const struct {
        const char *assignment, *key;
        double want;
    } cases[] = {
        {"train.batch=1", "train.batch", 1},         {"train.batch=1048576", "train.batch", 1048576},
        {"train.batch=+7", "train.batch", 7},        {"train.shift=-5", "train.shift", -5},
        {"train.shift=5", "train.shift", 5},         {"optim.lr=1e-30", "optim.lr", 1e-30},
        {"optim.lr=3.4e38", "optim.lr", 3.4e38},     {"optim.momentum=0", "optim.momentum", 0},
        {"optim.momentum=0.999", "optim.momentum", 0.999}, {"optim.scale=-1e300", "optim.scale", -1e300},
        {"optim.scale=2.5", "optim.scale", 2.5},     {"optim.any=-3.4e38", "optim.any", -3.4e38},
        {"optim.any=0", "optim.any", 0},             {"optim.any=1e-45", "optim.any", 1e-45},
    };
    Config *c = config_new(ranged, N_RANGED);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *err = NULL;
        CHECK_MSG(config_set_msg(c, cases[i].assignment, &err) == 0, "%s: %s", cases[i].assignment, err);
        CHECK_MSG(err == NULL, "%s: a message on success", cases[i].assignment);
        double got = strncmp(cases[i].key, "train.", 6) == 0 ? (double)config_int(c, cases[i].key)
                                                              : config_float(c, cases[i].key);
        CHECK_MSG(got == cases[i].want, "%s: got %.17g", cases[i].assignment, got);
        free(err);
    }
    config_free(c);
}

/* Each refused with a message naming the key, the value and what is wrong; the old value stays. */
static void test_range_refusals(void) {
    static const struct {
        const char *assignment;
        const char *want[2];
    } cases[] = {
        {"train.batch=4294967297", {"train.batch = 4294967297 is out of range", "allowed [1, 1048576]"}},
        {"train.batch=-4294967295", {"train.batch = -4294967295 is out of range", "[1, 1048576]"}},
        {"train.batch=0", {"train.batch = 0 is out of range", "[1, 1048576]"}},
        {"train.batch=1048577", {"train.batch = 1048577 is out of range", "[1, 1048576]"}},
        {"train.batch=99999999999999999999", {"train.batch", "does not fit in a 64-bit integer"}},
        {"train.batch=12abc", {"'12abc'", "not a base-10 integer"}},
        {"train.shift=6", {"train.shift = 6 is out of range", "[-5, 5]"}},
        {"train.shift=-6", {"train.shift = -6 is out of range", "[-5, 5]"}},
        {"optim.lr=0", {"optim.lr = 0 is out of range", "allowed (0, inf)"}},
        {"optim.lr=-1", {"optim.lr = -1 is out of range", "(0, inf)"}},
        {"optim.lr=1e39", {"optim.lr: 1e39 overflows a 32-bit float", "largest 3.40282e+38"}},
        {"optim.lr=-1e39", {"optim.lr: -1e39 overflows a 32-bit float"}},
        {"optim.lr=1e999", {"optim.lr: 1e999 overflows a 32-bit float"}},
        {"optim.lr=1e-50", {"optim.lr: 1e-50 is too small for a 32-bit float", "it would be 0"}},
        {"optim.lr=inf", {"optim.lr: 'inf' is not a finite number"}},
        {"optim.lr=INFINITY", {"optim.lr: 'INFINITY' is not a finite number"}},
        {"optim.lr=nan", {"optim.lr: 'nan' is not a finite number"}},
        {"optim.lr=-NaN", {"optim.lr: '-NaN' is not a finite number"}},
        {"optim.momentum=1", {"optim.momentum = 1 is out of range", "allowed [0, 1)"}},
        /* in range as a double, but the float the program uses rounds to 1 */
        {"optim.momentum=0.99999999999", {"optim.momentum = 0.99999999999 is out of range", "as a 32-bit float it is 1"}},
        {"optim.scale=2.6", {"optim.scale = 2.6 is out of range", "(-inf, 2.5]"}},
        {"optim.scale=1e999", {"optim.scale: 1e999 overflows a 64-bit float"}},
        {"optim.any=3.5e38", {"optim.any: 3.5e38 overflows a 32-bit float"}},
    };
    Config *c = config_new(ranged, N_RANGED);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *err = NULL, prefix[128];
        CHECK_MSG(config_set_msg(c, cases[i].assignment, &err) == -1, "%s accepted", cases[i].assignment);
        if (!err) continue;
        snprintf(prefix, sizeof prefix, "--set %s: ", cases[i].assignment);
        CHECK_MSG(strncmp(err, prefix, strlen(prefix)) == 0, "'%s' does not start with '%s'", err, prefix);
        for (int j = 0; j < 2 && cases[i].want[j]; j++)
            CHECK_MSG(strstr(err, cases[i].want[j]) != NULL, "'%s' lacks '%s'", err, cases[i].want[j]);
        free(err);
    }
    CHECK(config_int(c, "train.batch") == 32);
    CHECK(config_float(c, "optim.lr") == 0.01);
    CHECK(config_float(c, "optim.momentum") == 0.9);
    config_free(c);

    /* From a file: the file and line, the key, the value and the range. */
    write_fixture("range.ini", "[optim]\nlr = 0.5\n[train]\n\nbatch = 4294967297\n");
    const char *path = path_of("range.ini");
    c = config_new(ranged, N_RANGED);
    char *err = NULL, want[700];
    CHECK(config_load_file_msg(c, path, &err) == -1);
    snprintf(want, sizeof want, "%s:5: train.batch = 4294967297 is out of range: allowed [1, 1048576]", path);
    CHECK_MSG(err && strcmp(err, want) == 0, "got '%s', want '%s'", err, want);
    CHECK(config_float(c, "optim.lr") == 0.01); /* the failed file changed nothing */
    free(err);

    /* --print-config tells each number's range. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    config_print(c, f);
    fclose(f);
    CHECK_MSG(strstr(text, "# Samples per step; allowed [1, 1048576]\nbatch = 32") != NULL, "%s", text);
    CHECK(strstr(text, "# Name\nname = x") != NULL);
    free(text);
    config_free(c);
}

/* ---------------------------------------------------------- byte-order marks */

static void test_bom(void) {
    write_fixture("bom.ini", "\xEF\xBB\xBF[data]\nworkers = 3\ninclude = bom_inner.ini\n");
    const char *path = path_of("bom.ini");
    write_fixture("bom_inner.ini", "\xEF\xBB\xBF# an included file may have one too\n[optim]\nlr = 0.5\n");
    char *err = NULL, want[700];
    Config *c = config_new(schema, N_KEYS);
    CHECK_MSG(config_load_file_msg(c, path, &err) == 0, "%s", err);
    CHECK(config_int(c, "data.workers") == 3);
    CHECK(config_float(c, "optim.lr") == 0.5);
    snprintf(want, sizeof want, "%s:2", path);
    check_origin(c, "data.workers", want);
    snprintf(want, sizeof want, "%s:3", path_of("bom_inner.ini"));
    check_origin(c, "optim.lr", want);
    free(err);
    err = NULL;
    /* A file that is only a mark is empty; half a mark is not a mark. */
    CHECK_MSG(config_load_file_msg(c, write_fixture("only_bom.ini", "\xEF\xBB\xBF"), &err) == 0, "%s", err);
    free(err);
    err = NULL;
    CHECK(config_load_file_msg(c, write_fixture("half_bom.ini", "\xEF\xBB[data]\n"), &err) == -1);
    snprintf(want, sizeof want, "%s:1: ", path_of("half_bom.ini"));
    CHECK_MSG(err && strncmp(err, want, strlen(want)) == 0, "%s", err);
    free(err);
    config_free(c);
}

/* ------------------------------------------------------ values of any length */

static char *repeated(char ch, size_t n) {
    char *s = malloc(n + 1);
    memset(s, ch, n);
    s[n] = '\0';
    return s;
}

static void test_long_values(void) {
    enum { LONG = 100000 };
    char *name = repeated('n', LONG);
    size_t assignment_len = strlen("run.name=") + LONG + 1;
    char *assignment = malloc(assignment_len);
    snprintf(assignment, assignment_len, "run.name=%s", name);
    Config *c = config_new(schema, N_KEYS);
    char *err = NULL;
    CHECK_MSG(config_set_msg(c, assignment, &err) == 0, "%.200s", err);
    CHECK(strcmp(config_str(c, "run.name"), name) == 0);

    /* In a file, and through config_print and back. */
    char *text = malloc(LONG + 64);
    snprintf(text, LONG + 64, "[data]\nroot = /%s\n", name);
    write_fixture("long_value.ini", text);
    const char *path = path_of("long_value.ini");
    CHECK_MSG(config_load_file_msg(c, path, &err) == 0, "%.200s", err);
    CHECK(strlen(config_str(c, "data.root")) == LONG + 1 && strcmp(config_str(c, "data.root") + 1, name) == 0);
    const char *printed = path_of("long_printed.ini");
    FILE *f = fopen(printed, "w");
    config_print(c, f);
    fclose(f);
    Config *reloaded = config_new(schema, N_KEYS);
    CHECK_MSG(config_load_file_msg(reloaded, printed, &err) == 0, "%.200s", err);
    CHECK(strcmp(config_str(reloaded, "run.name"), name) == 0);
    CHECK(strcmp(config_str(reloaded, "data.root"), config_str(c, "data.root")) == 0);
    config_free(reloaded);

    /* A long bad value: the whole of it in the message; a caller's short buffer ends in "...". */
    char *digits = repeated('9', 5000);
    snprintf(assignment, assignment_len, "data.workers=%s", digits);
    CHECK(config_set_msg(c, assignment, &err) == -1);
    CHECK_MSG(err && strstr(err, "64-bit") && strstr(strstr(err, ": ") + 2, digits), "%.200s", err);
    free(err);
    char small[64];
    CHECK(config_set(c, assignment, small, sizeof small) == -1);
    CHECK_MSG(strlen(small) == sizeof small - 1 && strcmp(small + sizeof small - 4, "...") == 0, "%s", small);
    CHECK(config_int(c, "data.workers") == 4);
    free(digits);
    free(text);
    free(assignment);
    free(name);
    config_free(c);
}

/* --------------------------------------- messages about the user's settings */

static Config *settings;

static void load_settings(void) {
    settings = config_new(schema, N_KEYS);
    const char *path = write_fixture("settings.ini", "[data]\n# a comment\nworkers = 7\n");
    char *err = NULL;
    CHECK_MSG(config_load_file_msg(settings, path, &err) == 0, "%s", err);
    CHECK(config_set_msg(settings, "run.device=cpu", &err) == 0);
    free(err);
}

static void fail_on_file_value(void) { config_fail(settings, "data.workers", "needs %d more", 2); }
static void fail_on_default(void) { config_fail(settings, "run.name", "is the default"); }
static void fail_on_set_value(void) { config_fail(settings, "run.device", "cannot be here"); }

static void one_problem(void) {
    ConfigProblems p = {.config = settings};
    config_problem(&p, "data.workers", "too few");
    config_problems_check(&p);
}

static void three_problems(void) {
    ConfigProblems p = {.config = settings};
    config_problem(&p, "data.workers", "too few");
    config_problem(&p, "run.device", "needs %s", "cuda");
    config_problem(&p, "optim.lr", "too small");
    config_problems_check(&p);
}

static void test_settings_messages(void) {
    load_settings();
    char want[800], path[600];
    snprintf(path, sizeof path, "%s", path_of("settings.ini"));
    snprintf(want, sizeof want, "trainc: error: %s:3: data.workers = 7: needs 2 more\n", path);
    const char *text = expect_fatal("config_fail on a file's value", fail_on_file_value, want);
    CHECK_MSG(strcmp(text, want) == 0, "'%s': more than the one line, or a place in trainc's source", text);
    text = expect_fatal("config_fail on a default", fail_on_default,
                        "trainc: error: run.name = demo (the default): is the default\n");
    text = expect_fatal("config_fail on --set", fail_on_set_value,
                        "trainc: error: --set: run.device = cpu: cannot be here\n");
    snprintf(want, sizeof want, "trainc: error: %s:3: data.workers = 7: too few\n", path);
    text = expect_fatal("one problem", one_problem, want);
    CHECK_MSG(strcmp(text, want) == 0, "'%s'", text);
    snprintf(want, sizeof want,
             "trainc: error: 3 problems with the settings:\n"
             "  %s:3: data.workers = 7: too few\n"
             "  --set: run.device = cpu: needs cuda\n"
             "  optim.lr = 0.1 (the default): too small\n", path);
    text = expect_fatal("three problems", three_problems, want);
    CHECK_MSG(strcmp(text, want) == 0, "'%s'", text);

    ConfigProblems none = {.config = settings};
    config_problems_check(&none); /* returns: nothing to say */
    CHECK(none.count == 0 && none.text == NULL);
    config_free(settings);
}

/* ----------------------------------------- programming errors abort the process */

static Config *fatal_config;
static void get_unknown_key(void) { config_int(fatal_config, "data.nope"); }
static void get_int_as_float(void) { config_float(fatal_config, "data.workers"); }
static void get_float_as_str(void) { config_str(fatal_config, "optim.lr"); }
static void get_str_as_bool(void) { config_bool(fatal_config, "run.name"); }
static void origin_of_unknown(void) { config_origin(fatal_config, "x.y"); }

#define NEW_WITH(spec) do { static const CfgKeySpec bad[] = {spec}; config_new(bad, 1); } while (0)
static void bad_int_default(void) { NEW_WITH(((CfgKeySpec){"a.count", CFG_INT, "ten", NULL, "h", NULL})); }
static void bad_enum_default(void) { NEW_WITH(((CfgKeySpec){"a.mode", CFG_ENUM, "c", "a|b", "h", NULL})); }
static void bad_enum_choices(void) { NEW_WITH(((CfgKeySpec){"a.mode", CFG_ENUM, "a", "a||b", "h", NULL})); }
static void key_without_section(void) { NEW_WITH(((CfgKeySpec){"count", CFG_INT, "1", NULL, "h", NULL})); }
static void empty_default(void) { NEW_WITH(((CfgKeySpec){"a.count", CFG_INT, "", NULL, "h", NULL})); }
static void comment_in_default(void) { NEW_WITH(((CfgKeySpec){"a.path", CFG_STRING, "x #y", NULL, "h", NULL})); }
static void key_named_include(void) { NEW_WITH(((CfgKeySpec){"a.include", CFG_STRING, "x", NULL, "h", NULL})); }
static void duplicate_key(void) {
    static const CfgKeySpec twice[] = {{"a.b", CFG_INT, "1", NULL, "h", NULL}, {"a.b", CFG_INT, "2", NULL, "h", NULL}};
    config_new(twice, 2);
}
static void range_on_string(void) { NEW_WITH(((CfgKeySpec){"a.s", CFG_STRING, "x", NULL, "h", "[0, 1]"})); }
static void open_int_range(void) { NEW_WITH(((CfgKeySpec){"a.n", CFG_INT, "1", NULL, "h", "(0, 5]"})); }
static void infinite_int_range(void) { NEW_WITH(((CfgKeySpec){"a.n", CFG_INT, "1", NULL, "h", "[0, inf)"})); }
static void reversed_range(void) { NEW_WITH(((CfgKeySpec){"a.n", CFG_INT, "1", NULL, "h", "[5, 1]"})); }
static void empty_float_range(void) { NEW_WITH(((CfgKeySpec){"a.f", CFG_FLOAT, "1", NULL, "h", "[1, 1)"})); }
static void dotted_range(void) { NEW_WITH(((CfgKeySpec){"a.n", CFG_INT, "1", NULL, "h", "0..5"})); }
static void closed_inf_range(void) { NEW_WITH(((CfgKeySpec){"a.f", CFG_FLOAT, "1", NULL, "h", "[0, inf]"})); }
static void default_out_of_range(void) { NEW_WITH(((CfgKeySpec){"a.n", CFG_INT, "9", NULL, "h", "[0, 5]"})); }

static void test_programming_errors(void) {
    fatal_config = config_new(schema, N_KEYS);
    CHECK(strcmp(config_str(fatal_config, "optim.kind"), "sgd") == 0); /* an enum reads as a string */
    expect_fatal("unknown key", get_unknown_key, "data.nope");
    expect_fatal("int as float", get_int_as_float, "data.workers");
    expect_fatal("float as string", get_float_as_str, "optim.lr");
    expect_fatal("string as bool", get_str_as_bool, "run.name");
    expect_fatal("origin of unknown", origin_of_unknown, "x.y");
    expect_fatal("bad int default", bad_int_default, "a.count");
    expect_fatal("bad enum default", bad_enum_default, "a.mode");
    expect_fatal("bad enum choices", bad_enum_choices, "a||b");
    expect_fatal("key without section", key_without_section, "'count'");
    expect_fatal("empty int default", empty_default, "a.count");
    expect_fatal("comment in default", comment_in_default, "a.path");
    expect_fatal("key named include", key_named_include, "a.include");
    expect_fatal("duplicate key", duplicate_key, "a.b appears twice");
    expect_fatal("range on a string", range_on_string, "a.s: a range on a string key");
    expect_fatal("open int range", open_int_range, "a.n: bad range '(0, 5]'");
    expect_fatal("infinite int range", infinite_int_range, "a.n: bad range '[0, inf)'");
    expect_fatal("reversed range", reversed_range, "a.n: bad range '[5, 1]'");
    expect_fatal("empty float range", empty_float_range, "a.f: bad range '[1, 1)'");
    expect_fatal("dotted range", dotted_range, "a.n: bad range '0..5'");
    expect_fatal("closed inf range", closed_inf_range, "a.f: bad range '[0, inf]'");
    expect_fatal("default out of range", default_out_of_range, "a.n = 9 is out of range: allowed [0, 5]");
    config_free(fatal_config);
}

int main(void) {
    dir = test_tmpdir("config");
    test_defaults();
    test_includes_and_set();
    test_comments_and_whitespace();
    test_long_file();
    test_bool_spellings();
    test_file_errors();
    test_include_errors();
    test_failed_load_changes_nothing();
    test_set_errors();
    test_print_round_trip();
    test_range_accepts();
    test_range_refusals();
    test_bom();
    test_long_values();
    test_settings_messages();
    test_programming_errors();
    return test_finish("test_config");
}
