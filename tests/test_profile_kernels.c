/* The kernels section's interval arithmetic (profile.h: profile_spans_*), on
 * the CPU with hand-built spans:
 * - known cases: disjoint, nested, overlapping and touching spans merge to
 *   the expected union; the gaps between them and the longest; the overlap
 *   of copies with kernels;
 * - random nonempty spans on [0, 200) ns against a sweep over every nanosecond: the
 *   union's length, the gaps (between the first busy and the last busy ns),
 *   and each span's time inside the union of others, exactly (integers).
 * And the section without CUPTI: a CPU run's kernels say why and print one line. */
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"
#include "tools/trainer/profile.h"

enum { RANGE = 200, RANDOM_CASES = 300, MAX_SPANS = 12 };

static void check_known(void) {
    ProfileSpan s[] = {{50, 60}, {0, 10}, {5, 8}, {10, 20}, {30, 45}, {40, 50}, {70, 71}};
    long n = profile_spans_merge(s, 7);
    /* {0,20} (nested, touching), {30,60} (overlapping, touching), {70,71} */
    CHECK(n == 3);
    CHECK(s[0].start == 0 && s[0].end == 20 && s[1].start == 30 && s[1].end == 60 && s[2].start == 70 &&
          s[2].end == 71);
    CHECK(profile_spans_length(s, n) == 20 + 30 + 1);
    uint64_t longest;
    CHECK(profile_spans_gaps(s, n, &longest) == 10 + 10 && longest == 10);
    CHECK(profile_spans_gaps(s, 1, &longest) == 0 && longest == 0);
    CHECK(profile_spans_merge(s, 0) == 0 && profile_spans_length(s, 0) == 0);
    /* Copies against those kernels: inside, straddling two, outside, and two
     * copies over the same time (each counted). */
    ProfileSpan copies[] = {{2, 6}, {15, 35}, {60, 70}, {15, 35}};
    CHECK(profile_spans_overlap(copies, 1, s, n) == 4);
    CHECK(profile_spans_overlap(copies + 1, 1, s, n) == 5 + 5);
    CHECK(profile_spans_overlap(copies + 2, 1, s, n) == 0);
    CHECK(profile_spans_overlap(copies, 4, s, n) == 4 + 10 + 0 + 10);
    CHECK(profile_spans_overlap(copies, 4, s, 0) == 0);
}

static uint64_t rand_below(uint64_t *state, uint64_t n) {
    uint64_t v = (uint64_t)test_uniform(state, 0, (float)n);
    return v < n ? v : n - 1;
}

static void random_spans(uint64_t *state, ProfileSpan *s, long n) {
    for (long i = 0; i < n; i++) {
        uint64_t a = rand_below(state, RANGE), len = 1 + rand_below(state, 30);
        s[i] = (ProfileSpan){a, a + len < RANGE ? a + len : RANGE};
    }
}

/* busy[t] = 1 where some span holds t (spans are [start, end)). */
static void sweep(const ProfileSpan *s, long n, char *busy) {
    memset(busy, 0, RANGE);
    for (long i = 0; i < n; i++)
        for (uint64_t t = s[i].start; t < s[i].end; t++) busy[t] = 1;
}

static void check_random_case(uint64_t *state) {
    ProfileSpan kernels[MAX_SPANS], copies[MAX_SPANS];
    long nk = 1 + (long)rand_below(state, MAX_SPANS), nc = (long)rand_below(state, MAX_SPANS);
    random_spans(state, kernels, nk);
    random_spans(state, copies, nc);
    char busy[RANGE];
    sweep(kernels, nk, busy);
    uint64_t union_ns = 0, gap_ns = 0, longest = 0, run = 0, overlap = 0;
    long first = -1, last = -1;
    for (long t = 0; t < RANGE; t++) {
        union_ns += (uint64_t)busy[t];
        if (busy[t]) last = t, first = first < 0 ? t : first;
    }
    for (long t = first; first >= 0 && t <= last; t++) {
        run = busy[t] ? 0 : run + 1;
        gap_ns += !busy[t];
        if (run > longest) longest = run;
    }
    for (long i = 0; i < nc; i++)
        for (uint64_t t = copies[i].start; t < copies[i].end; t++) overlap += (uint64_t)busy[t];

    long n = profile_spans_merge(kernels, nk);
    for (long i = 1; i < n; i++)
        CHECK_MSG(kernels[i].start > kernels[i - 1].end, "merged spans %ld, %ld touch", i - 1, i);
    uint64_t got_longest;
    uint64_t got_union = profile_spans_length(kernels, n), got_gaps = profile_spans_gaps(kernels, n, &got_longest);
    CHECK_MSG(got_union == union_ns, "union %llu, swept %llu", (unsigned long long)got_union,
              (unsigned long long)union_ns);
    CHECK_MSG(got_gaps == gap_ns && got_longest == longest, "gaps %llu (longest %llu), swept %llu (%llu)",
              (unsigned long long)got_gaps, (unsigned long long)got_longest, (unsigned long long)gap_ns,
              (unsigned long long)longest);
    uint64_t got_overlap = profile_spans_overlap(copies, nc, kernels, n);
    CHECK_MSG(got_overlap == overlap, "overlap %llu, swept %llu", (unsigned long long)got_overlap,
              (unsigned long long)overlap);
}

static void check_random(void) {
    uint64_t state = test_seed();
    for (int i = 0; i < RANDOM_CASES; i++) check_random_case(&state);
}

static void check_not_available(void) {
    ProfileReport r;
    memset(&r, 0, sizeof r);
    r.first = 3, r.last = 5;
    CHECK(profile_kernels_open(0, &r.kernels) == NULL);
    CHECK(r.kernels.available == 0 && strstr(r.kernels.why_not, "CPU") != NULL);
    /* NULL runs through every call as a no-op */
    profile_kernels_window_begin(NULL, NULL);
    profile_kernels_window_end(NULL);
    profile_kernels_collect(NULL, 3);
    profile_kernels_trace(NULL, NULL, 0, 0);
    profile_kernels_close(NULL);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    if (!f) return;
    profile_kernels_print(&r, f);
    fclose(f);
    CHECK_MSG(strstr(text, "kernels: not available: a CPU run") != NULL && !strchr(strchr(text + 1, '\n') + 1, '\n'),
              "%s", text);
    free(text);
}

int main(void) {
    check_known();
    check_random();
    check_not_available();
    return test_finish("test_profile_kernels");
}
