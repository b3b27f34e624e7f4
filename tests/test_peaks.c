/* The measured peaks of trainc profile's roofline (tools/trainer/peaks.c), on
 * the CPU:
 * - measured peaks are positive and plausible on any machine: over 0.1
 *   GFLOP/s and 100 MB/s (a plain-loop GEMM and a memcpy clear both by far),
 *   under 1 PFLOP/s and 10 TB/s;
 * - the cache round-trips: written, read back equal to the bit (%.17g), with
 *   from_cache set;
 * - peaks_get measures once, then reads the cache; a corrupt cache file is
 *   remeasured and rewritten (no crash), as is one for missing fields;
 * - TRAINC_PEAKS skips both, and a bad one is refused naming it (exit 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tools/trainer/peaks.h"

static void check_plausible(const ProfilePeaks *p) {
    CHECK_MSG(p->flops_per_s > 1e8 && p->flops_per_s < 1e15, "%g FLOP/s", p->flops_per_s);
    CHECK(p->flops_f32_per_s == p->flops_per_s && p->flops_tf32_per_s == p->flops_per_s); /* the CPU's one GEMM */
    CHECK_MSG(p->bytes_per_s > 1e8 && p->bytes_per_s < 1e13, "%g B/s", p->bytes_per_s);
    CHECK_MSG(strstr(p->device, "BLAS threads") != NULL, "device %s", p->device);
}

static void check_round_trip(const char *dir, const ProfilePeaks *measured) {
    char path[1024], why[256];
    snprintf(path, sizeof path, "%s/nested/dir/peaks.txt", dir);
    CHECK(peaks_cache_write(path, measured) == 0);
    ProfilePeaks back;
    CHECK_MSG(peaks_cache_read(path, &back, why, sizeof why) == 0, "%s", why);
    CHECK(back.flops_per_s == measured->flops_per_s && back.bytes_per_s == measured->bytes_per_s);
    CHECK(back.flops_f32_per_s == measured->flops_f32_per_s && back.flops_tf32_per_s == measured->flops_tf32_per_s);
    CHECK(strcmp(back.device, measured->device) == 0 && back.from_cache == 1);
    snprintf(path, sizeof path, "%s/no-such-file.txt", dir);
    CHECK(peaks_cache_read(path, &back, why, sizeof why) == -1 && why[0] == 0);
}

/* peaks_get with $TRAINC_CACHE_DIR = dir: the file it uses. */
static void cache_path(const char *dir, char *path, size_t len) {
    char name[256];
    peaks_cache_name(0, 0, name, sizeof name);
    snprintf(path, len, "%s/%s", dir, name);
}

static void check_get_and_corrupt(const char *dir) {
    setenv("TRAINC_CACHE_DIR", dir, 1);
    char path[1024], why[256];
    cache_path(dir, path, sizeof path);
    ProfilePeaks first, second, fixed;
    peaks_get(0, 0, &first);
    CHECK(first.from_cache == 0);
    check_plausible(&first);
    peaks_get(0, 0, &second);
    CHECK(second.from_cache == 1 && second.flops_per_s == first.flops_per_s &&
          second.bytes_per_s == first.bytes_per_s);
    const char *bad[] = {"\x01\x02 not a cache\n", "device = x\nflops_per_s = 1e12\n",
                         "device = x\nflops_per_s = -3\nbytes_per_s = 1e9\n",
                         "device = x\nflops_per_s = 1e12\nbytes_per_s = 1e9zz\n", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f) return;
        fputs(bad[i], f);
        fclose(f);
        CHECK(peaks_cache_read(path, &fixed, why, sizeof why) == -1 && why[0]);
        if (i % 2) continue; /* every one is refused; three are remeasured (each about a second) */
        peaks_get(0, 0, &fixed);
        CHECK_MSG(fixed.from_cache == 0, "corrupt cache %zu read as valid", i);
        check_plausible(&fixed);
        CHECK_MSG(peaks_cache_read(path, &fixed, why, sizeof why) == 0, "not rewritten after corrupt cache %zu: %s", i,
                  why);
    }
}

static void check_env(void) {
    setenv("TRAINC_PEAKS", "7e14,5e12", 1);
    ProfilePeaks p;
    peaks_get(0, 0, &p);
    CHECK(p.flops_per_s == 7e14 && p.bytes_per_s == 5e12 && p.from_cache == 0 && !strcmp(p.device, "TRAINC_PEAKS"));
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        freopen("/dev/null", "w", stderr);
        setenv("TRAINC_PEAKS", "7e14", 1);
        peaks_get(0, 0, &p);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 1, "bad TRAINC_PEAKS: status %d", status);
    unsetenv("TRAINC_PEAKS");
}

int main(void) {
    const char *dir = test_tmpdir("peaks");
    unsetenv("TRAINC_PEAKS");
    ProfilePeaks measured;
    peaks_measure_cpu(&measured);
    check_plausible(&measured);
    CHECK(measured.from_cache == 0);
    check_round_trip(dir, &measured);
    check_get_and_corrupt(dir);
    check_env();
    return test_finish("test_peaks");
}
