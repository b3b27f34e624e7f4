/* A small test harness: CHECK records a failure and goes on; the test's main
 * returns test_finish(). Tests that need a GPU call test_require_gpu() first,
 * which exits 77 (ctest's skip code) when there is none; test_skip() prints
 * the reason as "SKIP: reason", which ctest's post-test step shows. */
#ifndef TRAINC_TESTS_HARNESS_H
#define TRAINC_TESTS_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int test_failures;
extern int test_checks;

#define CHECK(cond) do { test_checks++; if (!(cond)) { test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { test_checks++; if (!(cond)) { test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); test_checks++; \
    if (!(a_ - b_ <= (tol) && b_ - a_ <= (tol))) { test_failures++; \
    fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g, tol %.3g\n", \
            __FILE__, __LINE__, #a, a_, #b, b_, (double)(tol)); } } while (0)

/* Prints "SKIP: <reason>" and exits 77 (removing the test's scratch folders). */
_Noreturn void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void test_require_gpu(void);
/* Whether a GPU is usable, for a test whose CPU part runs either way. */
int test_have_gpu(void);
int test_finish(const char *name);

/* One printf-formatted "key=value" assignment into a config; a refused one is a
 * failed check with the config's message. */
typedef struct Config Config;
void test_config_set(Config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Fresh random data each run unless TRAINC_TEST_SEED is set; the seed is printed. */
uint64_t test_seed(void);
float test_uniform(uint64_t *state, float lo, float hi);
void test_fill_uniform(float *x, size_t n, uint64_t *state, float lo, float hi);
/* ||a - b|| / ||b|| in double; NaN anywhere gives +inf. */
double test_rel_error(const float *a, const float *b, size_t n);
/* A scratch directory $TMPDIR/trainc-test-<name>-<pid> ($TMPDIR unset: /tmp),
 * created fresh; the pointer stays valid. The directories are removed when the
 * process exits, unless the test failed and TRAINC_TEST_KEEP=1 is set (then
 * their paths are printed). */
const char *test_tmpdir(const char *name);
/* Writes bytes to dir/name; returns the full path (static buffer). */
const char *test_write_file(const char *dir, const char *name, const void *data, size_t n);
/* The whole of a file, malloc'ed and 0-terminated (free it); NULL when it cannot be read. */
char *test_read_file(const char *path);
/* Runs fn(arg) in a child process whose stderr (unbuffered) goes to a file
 * under test_tmpdir(tag); the child exits 0 if fn returns. *exit_status: the
 * child's exit status, or -1 when it did not exit (a signal). Returns what
 * it wrote to stderr, malloc'ed ("" for nothing; free it): a fatal error's
 * message and exit status, checked without ending the test. */
char *test_child_stderr(const char *tag, void (*fn)(void *), void *arg, int *exit_status);
/* The last line of text that starts with '{' (a run's summary), parsed as JSON (a cJSON *), or NULL. */
struct cJSON *test_last_json(const char *text);
/* CIFAR-10 as JPEGs: .data/cifar10-jpg where tools/get_data.sh put it, else
 * ../shared/data/cifar10-jpg.tar.gz (or .data/'s) unpacked once into $TMPDIR
 * (or /tmp) as trainc-cifar10-jpg-<uid>, a cache kept between runs; NULL when absent. */
const char *test_cifar10_jpg_root(void);

/* Runs a shell command with stderr joined to stdout; its exit status (-1: it
 * did not exit normally), and in out (cap bytes) the last of its output. */
int test_run_command(const char *cmd, char *out, size_t cap);
/* Starts argv[0] with argv (NULL-terminated), its stdout and stderr into
 * out_file; returns its pid (waitpid it). */
int test_spawn(const char *const *argv, const char *out_file);
/* Where ctest's build keeps trainc: $TRAINC_BUILD_DIR, else "build". */
const char *test_build_dir(void);
/* "'mpiexec' -n RANKS FLAGS " from ctest's environment (TRAINC_MPIEXEC,
 * TRAINC_MPIEXEC_FLAGS), with Open MPI told to run as root and without CMA;
 * NULL without MPI (or not under ctest). The pointer stays valid. */
const char *test_mpirun_prefix(int ranks);

#endif
