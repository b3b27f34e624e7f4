#include "tests/harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/gpu.h"

int test_failures;
int test_checks;

void test_require_gpu(void) {
    if (gpu_count() == 0) {
        printf("no GPU: skipped\n");
        exit(77);
    }
}

int test_have_gpu(void) { return gpu_count() > 0; }

int test_finish(const char *name) {
    if (test_checks == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
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

const char *test_tmpdir(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "/tmp/trainc-test-%s-%d", name, (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", path, path);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot make %s\n", path);
        exit(1);
    }
    return path;
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

const char *test_cifar10_jpg_root(void) {
    static char root[512];
    const char *candidates[] = {"../shared/data/cifar10-jpg.tar.gz", ".data/cifar10-jpg.tar.gz"};
    const char *tarball = NULL;
    struct stat st;
    for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++)
        if (stat(candidates[i], &st) == 0) { tarball = candidates[i]; break; }
    if (!tarball) return NULL;
    snprintf(root, sizeof root, "/tmp/trainc-cifar10-jpg-%d/cifar10-jpg", (int)getuid());
    if (stat(root, &st) == 0) return root;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "d=/tmp/trainc-cifar10-jpg-%d; p=$d.part.$$; rm -rf $p && mkdir -p $p && "
             "tar xzf '%s' -C $p && { mv -T $p $d 2>/dev/null || rm -rf $p; }",
             (int)getuid(), tarball);
    if (system(cmd) != 0 || stat(root, &st) != 0) return NULL;
    return root;
}
