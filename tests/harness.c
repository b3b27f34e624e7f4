#include "tests/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "runtime/config.h"
#include "runtime/gpu.h"

int test_failures;
int test_checks;
/* Set when the test passed or skipped; an exit without it (a fatal error, a
 * failed check) counts as a failure for TRAINC_TEST_KEEP. */
static int test_succeeded;

_Noreturn void test_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("SKIP: ", stdout);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
    test_succeeded = 1;
    exit(77);
}

void test_require_gpu(void) {
    if (gpu_count() == 0) test_skip("no GPU");
}

int test_have_gpu(void) { return gpu_count() > 0; }

int test_finish(const char *name) {
    if (test_checks == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
    test_succeeded = test_failures == 0;
    return test_failures ? 1 : 0;
}

uint64_t test_seed(void) {
    static uint64_t seed;
    if (!seed) {
        const char *s = getenv("TRAINC_TEST_SEED");
        seed = s ? strtoull(s, NULL, 10) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
        if (!seed) seed = 1;
        printf("TRAINC_TEST_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

float test_uniform(uint64_t *state, float lo, float hi) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
}

void test_fill_uniform(float *x, size_t n, uint64_t *state, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = test_uniform(state, lo, hi);
}

double test_rel_error(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static const char *tmp_base(void) {
    const char *tmp = getenv("TMPDIR");
    return tmp && *tmp ? tmp : "/tmp";
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    if (remove(path) != 0 && errno != ENOENT) fprintf(stderr, "cannot remove %s: %s\n", path, strerror(errno));
    return 0;
}

/* Deletes path and everything under it, following no symbolic links. */
static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

enum { MAX_TMPDIRS = 32 };
static char *tmpdirs[MAX_TMPDIRS];
static int n_tmpdirs;
static pid_t tmpdirs_owner;

static void remove_tmpdirs(void) {
    if (getpid() != tmpdirs_owner) return; /* a forked child's exit leaves its parent's folders alone */
    const char *keep_env = getenv("TRAINC_TEST_KEEP");
    int keep = !test_succeeded && keep_env && strcmp(keep_env, "1") == 0;
    for (int i = 0; i < n_tmpdirs; i++) {
        if (keep) {
            fprintf(stderr, "TRAINC_TEST_KEEP=1: kept %s\n", tmpdirs[i]);
            continue;
        }
        if (!test_succeeded) fprintf(stderr, "removing %s (TRAINC_TEST_KEEP=1 keeps it after a failure)\n", tmpdirs[i]);
        remove_tree(tmpdirs[i]);
        free(tmpdirs[i]);
    }
    n_tmpdirs = 0;
}

const char *test_tmpdir(const char *name) {
    char path[1024];
    int len = snprintf(path, sizeof path, "%s/trainc-test-%s-%d", tmp_base(), name, (int)getpid());
    if (len < 0 || (size_t)len >= sizeof path) {
        fprintf(stderr, "test_tmpdir: path too long under %s\n", tmp_base());
        exit(1);
    }
    remove_tree(path);
    if (mkdir(path, 0700) != 0) {
        fprintf(stderr, "cannot make %s: %s\n", path, strerror(errno));
        exit(1);
    }
    for (int i = 0; i < n_tmpdirs; i++)
        if (strcmp(tmpdirs[i], path) == 0) return tmpdirs[i];
    if (n_tmpdirs == MAX_TMPDIRS || !(tmpdirs[n_tmpdirs] = strdup(path))) {
        fprintf(stderr, "test_tmpdir: cannot register %s for removal\n", path);
        exit(1);
    }
    if (n_tmpdirs == 0 && tmpdirs_owner == 0) {
        tmpdirs_owner = getpid();
        atexit(remove_tmpdirs);
    }
    return tmpdirs[n_tmpdirs++];
}

const char *test_write_file(const char *dir, const char *name, const void *data, size_t n) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    return path;
}

char *test_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && (fseek(f, 0, SEEK_SET) != 0 || fread(s, 1, (size_t)n, f) != (size_t)n)) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

char *test_child_stderr(const char *tag, void (*fn)(void *), void *arg, int *exit_status) {
    char log[600];
    snprintf(log, sizeof log, "%s/child_stderr", test_tmpdir(tag));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stderr)) _exit(3);
        setvbuf(stderr, NULL, _IONBF, 0); /* a child that leaves by _exit flushes nothing */
        fn(arg);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    *exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    char *text = test_read_file(log);
    return text ? text : calloc(1, 1);
}

const char *test_cifar10_jpg_root(void) {
    static char root[512];
    struct stat st;
    /* Where tools/get_data.sh puts it, already unpacked. */
    if (stat(".data/cifar10-jpg/train", &st) == 0 && stat(".data/cifar10-jpg/test", &st) == 0)
        return ".data/cifar10-jpg";
    const char *candidates[] = {"../shared/data/cifar10-jpg.tar.gz", ".data/cifar10-jpg.tar.gz"};
    const char *tarball = NULL;
    for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++)
        if (stat(candidates[i], &st) == 0) { tarball = candidates[i]; break; }
    if (!tarball) return NULL;
    snprintf(root, sizeof root, "%s/trainc-cifar10-jpg-%d/cifar10-jpg", tmp_base(), (int)getuid());
    if (stat(root, &st) == 0) return root;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "d='%s/trainc-cifar10-jpg-%d'; p=$d.part.$$; rm -rf \"$p\" && mkdir -p \"$p\" && "
             "tar xzf '%s' -C \"$p\" && { mv -T \"$p\" \"$d\" 2>/dev/null || rm -rf \"$p\"; }",
             tmp_base(), (int)getuid(), tarball);
    if (system(cmd) != 0 || stat(root, &st) != 0) return NULL;
    return root;
}

int test_spawn(const char *const *argv, const char *out_file) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return (int)pid;
}

int test_run_command(const char *cmd, char *out, size_t cap) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = 0, got;
    while ((got = fread(out + n, 1, cap - 1 - n, p)) > 0) {
        n += got;
        if (n == cap - 1) { /* keep the last half */
            memmove(out, out + n / 2, n - n / 2);
            n -= n / 2;
        }
    }
    out[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const char *test_build_dir(void) {
    const char *b = getenv("TRAINC_BUILD_DIR");
    return b && b[0] ? b : "build";
}

const char *test_mpirun_prefix(int ranks) {
    static char prefix[1024];
    const char *mpiexec = getenv("TRAINC_MPIEXEC"), *flags = getenv("TRAINC_MPIEXEC_FLAGS");
    if (!TRAINC_MPI || !mpiexec || !mpiexec[0]) return NULL;
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    snprintf(prefix, sizeof prefix, "'%s' -n %d %s ", mpiexec, ranks, flags ? flags : "");
    return prefix;
}

void test_config_set(Config *c, const char *fmt, ...) {
    char line[2048], err[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    CHECK_MSG(config_set(c, line, err, sizeof err) == 0, "%s", err);
}

cJSON *test_last_json(const char *text) {
    const char *last = NULL;
    for (const char *at = text; at; at = strchr(at, '\n')) {
        if (*at == '\n') at++;
        if (*at == '{') last = at;
    }
    return last ? cJSON_Parse(last) : NULL;
}
