/* Transforms against hand-computed values: identity resize, PyTorch bilinear
 * (align_corners = False), flip, zero-padded crop, normalisation, cutout,
 * shuffling; and with cutout off, the same bytes as before cutout existed; the
 * largest settings the set-up takes, and the message for those it refuses. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/gpu_transform.h"
#include "data/transform.h"
#include "tests/harness.h"

/* mean 0, std 1/255: the output is the pixel value itself, so expected values
 * can be written as plain numbers. */
static TransformSpec raw_spec(int out_h, int out_w) {
    TransformSpec t;
    memset(&t, 0, sizeof t);
    t.out_h = out_h;
    t.out_w = out_w;
    for (int ch = 0; ch < 3; ch++) t.std[ch] = 1.0f / 255.0f;
    return t;
}

static int near_all(const float *a, const float *b, int n, float tol) {
    for (int i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= tol)) return 0;
    return 1;
}

static void test_identity_resize_is_exact(void) {
    uint64_t rng = test_seed();
    int c = 3, h = 7, w = 9;
    uint8_t src[3 * 7 * 9];
    for (int i = 0; i < c * h * w; i++) src[i] = (uint8_t)(test_uniform(&rng, 0, 256));
    TransformSpec t;
    transform_spec_default(&t, h, w);
    float out[3 * 7 * 9], expected[3 * 7 * 9];
    transform_sample(&t, src, c, h, w, 1234, out);
    for (int ch = 0; ch < c; ch++)
        for (int i = 0; i < h * w; i++) {
            int p = ch * h * w + i;
            expected[p] = ((float)src[p] / 255.0f - t.mean[ch]) / t.std[ch];
        }
    CHECK(memcmp(out, expected, sizeof out) == 0);
    /* out size 0 means "keep the size" */
    TransformSpec keep = t;
    keep.out_h = keep.out_w = 0;
    transform_sample(&keep, src, c, h, w, 1234, out);
    CHECK(memcmp(out, expected, sizeof out) == 0);
}

static void test_bilinear_hand_values(void) {
    /* F.interpolate(torch.tensor([[[[1.,2.],[3.,4.]]]]), size=(4,4), mode='bilinear',
     * align_corners=False) */
    const uint8_t src[4] = {1, 2, 3, 4};
    const float expected[16] = {1.00f, 1.25f, 1.75f, 2.00f, 1.50f, 1.75f, 2.25f, 2.50f,
                                2.50f, 2.75f, 3.25f, 3.50f, 3.00f, 3.25f, 3.75f, 4.00f};
    TransformSpec t = raw_spec(4, 4);
    float out[16];
    transform_sample(&t, src, 1, 2, 2, 0, out);
    CHECK(near_all(out, expected, 16, 1e-4f));

    /* Down by 2: each output is the mean of a 2x2 block (source index 0.5, 2.5). */
    const uint8_t big[16] = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150};
    const float down[4] = {25.0f, 45.0f, 105.0f, 125.0f};
    float out_down[4];
    t = raw_spec(2, 2);
    transform_sample(&t, big, 1, 4, 4, 0, out_down);
    CHECK(near_all(out_down, down, 4, 1e-4f));

    /* 3 -> 5 across: scale 0.6, source x = 0, 0.4, 1.0, 1.6, 2 (the last clamped). */
    const uint8_t row[3] = {0, 100, 200};
    const float across[5] = {0.0f, 40.0f, 100.0f, 160.0f, 200.0f};
    float out_across[5];
    t = raw_spec(1, 5);
    transform_sample(&t, row, 1, 1, 3, 0, out_across);
    CHECK(near_all(out_across, across, 5, 1e-3f));
}

/* PyTorch's formula per output pixel in double, as an independent reference. */
static double reference_bilinear(const uint8_t *plane, int h, int w, int out_h, int out_w, int y,
                                 int x) {
    double sy = fmax((double)h / out_h * (y + 0.5) - 0.5, 0.0);
    double sx = fmax((double)w / out_w * (x + 0.5) - 0.5, 0.0);
    int y0 = (int)sy, x0 = (int)sx;
    int y1 = y0 < h - 1 ? y0 + 1 : y0, x1 = x0 < w - 1 ? x0 + 1 : x0;
    double fy = sy - y0, fx = sx - x0;
    double top = (1 - fx) * plane[y0 * w + x0] + fx * plane[y0 * w + x1];
    double bottom = (1 - fx) * plane[y1 * w + x0] + fx * plane[y1 * w + x1];
    return (1 - fy) * top + fy * bottom;
}

static void test_bilinear_against_reference(void) {
    uint64_t rng = test_seed() + 1;
    const int sizes[][4] = {{32, 32, 224, 224}, {5, 7, 9, 3}, {8, 6, 8, 13}};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int h = sizes[k][0], w = sizes[k][1], out_h = sizes[k][2], out_w = sizes[k][3];
        uint8_t *src = malloc((size_t)3 * h * w);
        float *out = malloc((size_t)3 * out_h * out_w * sizeof(float));
        float *ref = malloc((size_t)3 * out_h * out_w * sizeof(float));
        for (int i = 0; i < 3 * h * w; i++) src[i] = (uint8_t)test_uniform(&rng, 0, 256);
        TransformSpec t;
        transform_spec_default(&t, out_h, out_w);
        transform_sample(&t, src, 3, h, w, 99, out);
        for (int ch = 0; ch < 3; ch++)
            for (int y = 0; y < out_h; y++)
                for (int x = 0; x < out_w; x++) {
                    double v = reference_bilinear(src + ch * h * w, h, w, out_h, out_w, y, x);
                    ref[(ch * out_h + y) * out_w + x] =
                        (float)((v / 255.0 - t.mean[ch]) / t.std[ch]);
                }
        double err = test_rel_error(out, ref, (size_t)3 * out_h * out_w);
        CHECK_MSG(err < 1e-5, "%dx%d -> %dx%d: rel error %g", h, w, out_h, out_w, err);
        free(src);
        free(out);
        free(ref);
    }
}

/* 4x4, one channel, values 1..16 (none 0, so padding is told apart). */
static const uint8_t grid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static int find_seed_giving(const TransformSpec *t, const float *expected, uint64_t *seed_out) {
    float out[16];
    for (uint64_t seed = 0; seed < 4000; seed++) {
        transform_sample(t, grid, 1, 4, 4, seed, out);
        if (near_all(out, expected, 16, 1e-4f)) {
            *seed_out = seed;
            return 1;
        }
    }
    return 0;
}

static void test_flip(void) {
    TransformSpec t = raw_spec(4, 4);
    t.flip = 1;
    const float flipped[16] = {4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9, 16, 15, 14, 13};
    const float same[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    uint64_t seed_flip, seed_same;
    CHECK(find_seed_giving(&t, flipped, &seed_flip));
    CHECK(find_seed_giving(&t, same, &seed_same));
    /* The seed decides, nothing else. */
    float again[16];
    transform_sample(&t, grid, 1, 4, 4, seed_flip, again);
    CHECK(near_all(again, flipped, 16, 1e-4f));
    int flips = 0, trials = 2000;
    for (int s = 0; s < trials; s++) {
        transform_sample(&t, grid, 1, 4, 4, rng_sample_seed(7, 0, s), again);
        flips += near_all(again, flipped, 16, 1e-4f);
    }
    CHECK_MSG(flips > trials * 0.44 && flips < trials * 0.56, "%d flips of %d", flips, trials);
    /* flip off: never flips */
    t.flip = 0;
    transform_sample(&t, grid, 1, 4, 4, seed_flip, again);
    CHECK(near_all(again, same, 16, 1e-4f));
}

static void test_crop(void) {
    TransformSpec t = raw_spec(4, 4);
    t.crop_pad = 2;
    /* Offset one row down and one column left in the padded image:
     * out(y, x) = src(y + 1, x - 1), zero outside. */
    const float shifted[16] = {0, 5, 6, 7, 0, 9, 10, 11, 0, 13, 14, 15, 0, 0, 0, 0};
    /* The same, then flipped. */
    const float shifted_flipped[16] = {7, 6, 5, 0, 11, 10, 9, 0, 15, 14, 13, 0, 0, 0, 0, 0};
    uint64_t seed;
    CHECK(find_seed_giving(&t, shifted, &seed));
    t.flip = 1;
    CHECK(find_seed_giving(&t, shifted_flipped, &seed));

    /* Every offset in [-pad, pad]^2 comes up, about equally often, and each
     * output is exactly one zero-padded shift of the input. */
    t.flip = 0;
    int counts[5][5] = {{0}};
    int trials = 5000, unmatched = 0;
    for (int s = 0; s < trials; s++) {
        float out[16];
        transform_sample(&t, grid, 1, 4, 4, rng_sample_seed(3, 1, s), out);
        int matches = 0;
        for (int dy = -2; dy <= 2; dy++)
            for (int dx = -2; dx <= 2; dx++) {
                float expected[16];
                for (int y = 0; y < 4; y++)
                    for (int x = 0; x < 4; x++) {
                        int sy = y + dy, sx = x + dx;
                        expected[y * 4 + x] =
                            (sy >= 0 && sy < 4 && sx >= 0 && sx < 4) ? grid[sy * 4 + sx] : 0.0f;
                    }
                if (near_all(out, expected, 16, 1e-4f)) {
                    counts[dy + 2][dx + 2]++;
                    matches++;
                }
            }
        unmatched += matches != 1;
    }
    CHECK(unmatched == 0);
    int lo = trials, hi = 0;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) {
            lo = counts[i][j] < lo ? counts[i][j] : lo;
            hi = counts[i][j] > hi ? counts[i][j] : hi;
        }
    CHECK_MSG(lo > 140 && hi < 270, "offset counts from %d to %d (expected about 200)", lo, hi);
}

/* data.pad_mode = reflect: the padding mirrors the image about its edge pixels
 * (PyTorch's F.pad mode="reflect"), by hand on the 4x4 grid; the GPU kernel's
 * reference reads the same pixels from the same params. */
static void test_crop_reflect(void) {
    TransformSpec t = raw_spec(4, 4);
    t.crop_pad = 2;
    t.pad_reflect = 1;
    /* out(y, x) = src(y + 1, x - 1): column -1 reads column 1, row 4 reads row 2. */
    const float shifted[16] = {6, 5, 6, 7, 10, 9, 10, 11, 14, 13, 14, 15, 10, 9, 10, 11};
    /* out(y, x) = src(y - 2, x + 2): rows -2, -1 read rows 2, 1; columns 4, 5 read 2, 1. */
    const float far[16] = {11, 12, 11, 10, 7, 8, 7, 6, 3, 4, 3, 2, 7, 8, 7, 6};
    uint64_t seed;
    CHECK(find_seed_giving(&t, shifted, &seed));
    CHECK(find_seed_giving(&t, far, &seed));
    CHECK(transform_pad_index(-1, 4, 1) == 1 && transform_pad_index(4, 4, 1) == 2);
    CHECK(transform_pad_index(-7, 4, 1) == 1 && transform_pad_index(9, 4, 1) == 3); /* past a whole side */
    CHECK(transform_pad_index(-3, 1, 1) == 0 && transform_pad_index(-1, 4, 0) == -1);

    TransformParams p = {.crop_dy = 1, .crop_dx = -1};
    float out[16];
    GpuTransformArgs a;
    gpu_transform_args_init(&a, &t, 1, 4, 4);
    CHECK(a.pad_reflect == 1);
    a.raw_images = grid;
    a.params = &p;
    a.out = out;
    a.n = 1;
    gpu_transform_reference_cpu(&a);
    CHECK(near_all(out, shifted, 16, 1e-4f));
    p.crop_dy = -2;
    p.crop_dx = 2;
    gpu_transform_reference_cpu(&a);
    CHECK(near_all(out, far, 16, 1e-4f));
}

static void test_normalization(void) {
    TransformSpec t;
    transform_spec_default(&t, 1, 1);
    CHECK(t.flip == 0 && t.crop_pad == 0);
    CHECK_NEAR(t.mean[0], 0.4914, 1e-7);
    CHECK_NEAR(t.mean[1], 0.4822, 1e-7);
    CHECK_NEAR(t.mean[2], 0.4465, 1e-7);
    CHECK_NEAR(t.std[0], 0.2470, 1e-7);
    CHECK_NEAR(t.std[1], 0.2435, 1e-7);
    CHECK_NEAR(t.std[2], 0.2616, 1e-7);
    const uint8_t values[3] = {0, 128, 255};
    for (int k = 0; k < 3; k++) {
        uint8_t px[3] = {values[k], values[k], values[k]};
        float out[3];
        transform_sample(&t, px, 3, 1, 1, 0, out);
        for (int ch = 0; ch < 3; ch++)
            CHECK_NEAR(out[ch], (values[k] / 255.0 - t.mean[ch]) / t.std[ch], 1e-5);
    }
    CHECK_NEAR(((float)0 / 255.0f - 0.4914f) / 0.2470f, -1.98947, 1e-4);
}

/* ---- cutout ------------------------------------------------------------------ */

/* FNV-1a over the bytes of transform_sample's outputs for 16 seeds, with crop and
 * flip on: with cutout off the bytes are those of the code before cutout came
 * (hashes taken from that code), so adding it changed no existing result. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void test_cutout_off_changes_nothing(void) {
    static const int cases[][6] = { /* c, h, w, out_h, out_w, crop_pad */
        {3, 32, 32, 32, 32, 4}, {3, 32, 32, 224, 224, 4}, {2, 5, 7, 9, 3, 2}, {1, 8, 6, 8, 13, 0}};
    static const uint64_t before[4] = {0xf9586e6e104cf87aULL, 0x9682c6553602ba2cULL,
                                       0x78960c7a51a43bc6ULL, 0xb713a6b4f9486af9ULL};
    for (int k = 0; k < 4; k++) {
        int c = cases[k][0], h = cases[k][1], w = cases[k][2], out_h = cases[k][3],
            out_w = cases[k][4];
        uint8_t *src = malloc((size_t)c * h * w);
        float *out = malloc((size_t)c * out_h * out_w * sizeof(float));
        uint64_t pixel_rng = 42 + (uint64_t)k;
        for (int i = 0; i < c * h * w; i++) src[i] = (uint8_t)(rng_splitmix64(&pixel_rng) >> 56);
        TransformSpec t;
        transform_spec_default(&t, out_h, out_w);
        CHECK(t.cutout == 0);
        t.flip = 1;
        t.crop_pad = cases[k][5];
        uint64_t hash = 0xcbf29ce484222325ULL;
        for (int s = 0; s < 16; s++) {
            transform_sample(&t, src, c, h, w, rng_sample_seed(7, 0, s), out);
            hash = fnv1a(hash, out, (size_t)c * out_h * out_w * sizeof(float));
        }
        CHECK_MSG(hash == before[k], "case %d: outputs changed (hash %016llx)", k,
                  (unsigned long long)hash);
        free(src);
        free(out);
    }
}

/* The draws of transform.c written out again: crop row, crop column, flip,
 * cutout centre row, cutout centre column. */
static uint32_t draw_below(uint64_t *state, uint32_t bound) {
    return (uint32_t)(((rng_splitmix64(state) >> 32) * (uint64_t)bound) >> 32);
}

static void test_cutout_hand_values(void) {
    /* mean 0.5, std 1/255: out = pixel - 127.5, so the padding (pixel 0) is
     * -127.5 and the cutout (normalised 0) is 0: the two are told apart. */
    TransformSpec t = raw_spec(4, 4);
    for (int ch = 0; ch < 3; ch++) t.mean[ch] = 0.5f;
    t.cutout = 2;
    const float z = 127.5f; /* grid values below are v - z */
    /* Side 2 at centre (2, 2): rows 1..2, columns 1..2. */
    const float centre[16] = {1 - z, 2 - z, 3 - z, 4 - z, 5 - z, 0, 0, 8 - z,
                              9 - z, 0, 0, 12 - z, 13 - z, 14 - z, 15 - z, 16 - z};
    /* At centre (0, 3): row -1 and column 4 fall off; one row, two columns stay. */
    const float corner[16] = {1 - z, 2 - z, 0, 0, 5 - z, 6 - z, 7 - z, 8 - z,
                              9 - z, 10 - z, 11 - z, 12 - z, 13 - z, 14 - z, 15 - z, 16 - z};
    uint64_t seed;
    CHECK(find_seed_giving(&t, centre, &seed));
    CHECK(find_seed_giving(&t, corner, &seed));
    /* Odd side 3 at centre (1, 1): rows and columns 0..2. */
    t.cutout = 3;
    const float odd[16] = {0, 0, 0, 4 - z, 0, 0, 0, 8 - z, 0, 0, 0, 12 - z, 13 - z, 14 - z, 15 - z, 16 - z};
    CHECK(find_seed_giving(&t, odd, &seed));
    /* Larger than the image: all of it. */
    t.cutout = 9;
    float out[16], zeros[16] = {0};
    transform_sample(&t, grid, 1, 4, 4, 5, out);
    CHECK(near_all(out, zeros, 16, 0.0f));

    /* Crop, flip and cutout from one forced seed, the draws made by hand. */
    t.cutout = 2;
    t.crop_pad = 1;
    t.flip = 1;
    int checked = 0;
    for (uint64_t s = 100; s < 140; s++) {
        uint64_t rng = s;
        int dy = (int)draw_below(&rng, 3) - 1, dx = (int)draw_below(&rng, 3) - 1;
        int flip = (int)(rng_splitmix64(&rng) >> 63);
        int cy = (int)draw_below(&rng, 4), cx = (int)draw_below(&rng, 4);
        float expected[16];
        for (int y = 0; y < 4; y++)
            for (int x = 0; x < 4; x++) {
                int sy = y + dy, sx = (flip ? 3 - x : x) + dx;
                int v = (sy >= 0 && sy < 4 && sx >= 0 && sx < 4) ? grid[sy * 4 + sx] : 0;
                int cut = y >= cy - 1 && y < cy + 1 && x >= cx - 1 && x < cx + 1;
                expected[y * 4 + x] = cut ? 0.0f : (float)v - z;
            }
        transform_sample(&t, grid, 1, 4, 4, s, out);
        CHECK_MSG(near_all(out, expected, 16, 1e-4f), "seed %llu", (unsigned long long)s);
        checked++;
    }
    CHECK(checked == 40);
}

/* Side 1 on 4x4: every pixel is the centre about equally often. */
static void test_cutout_centres_uniform(void) {
    TransformSpec t = raw_spec(4, 4);
    t.cutout = 1;
    int counts[16] = {0}, bad = 0, trials = 3200;
    for (int s = 0; s < trials; s++) {
        float out[16];
        transform_sample(&t, grid, 1, 4, 4, rng_sample_seed(11, 2, s), out);
        int zeros = 0, at = -1;
        for (int i = 0; i < 16; i++)
            if (out[i] == 0.0f) zeros++, at = i;
            else if (fabsf(out[i] - grid[i]) > 1e-4f) bad++;
        if (zeros == 1) counts[at]++;
        else bad++;
    }
    CHECK(bad == 0);
    int lo = trials, hi = 0;
    for (int i = 0; i < 16; i++) {
        lo = counts[i] < lo ? counts[i] : lo;
        hi = counts[i] > hi ? counts[i] : hi;
    }
    CHECK_MSG(lo > 140 && hi < 260, "centre counts from %d to %d (expected about 200)", lo, hi);
}

/* With a resize, crop and flip: cutout draws last, so the same seed gives the
 * same image with one square (in output pixels, every channel) set to 0. */
static void test_cutout_after_resize(void) {
    uint64_t rng = test_seed() + 2;
    enum { C = 3, H = 32, W = 32, OUT = 224, SIDE = 40 };
    uint8_t *src = malloc(C * H * W);
    float *plain = malloc((size_t)C * OUT * OUT * sizeof(float));
    float *cut = malloc((size_t)C * OUT * OUT * sizeof(float));
    for (int i = 0; i < C * H * W; i++) src[i] = (uint8_t)test_uniform(&rng, 1, 256);
    TransformSpec t;
    transform_spec_default(&t, OUT, OUT);
    t.flip = 1;
    t.crop_pad = 4;
    int full_squares = 0, bad = 0;
    for (int s = 0; s < 20; s++) {
        uint64_t seed = rng_sample_seed(test_seed(), 0, s);
        t.cutout = 0;
        transform_sample(&t, src, C, H, W, seed, plain);
        t.cutout = SIDE;
        transform_sample(&t, src, C, H, W, seed, cut);
        /* The zeroed pixels form one box, the same in every channel. */
        int y0 = OUT, y1 = -1, x0 = OUT, x1 = -1, zeroed = 0;
        for (int y = 0; y < OUT; y++)
            for (int x = 0; x < OUT; x++) {
                size_t i = (size_t)y * OUT + x;
                if (cut[i] != plain[i]) {
                    zeroed++;
                    y0 = y < y0 ? y : y0, y1 = y > y1 ? y : y1;
                    x0 = x < x0 ? x : x0, x1 = x > x1 ? x : x1;
                }
            }
        for (int ch = 0; ch < C; ch++)
            for (int y = 0; y < OUT; y++)
                for (int x = 0; x < OUT; x++) {
                    size_t i = ((size_t)ch * OUT + y) * OUT + x;
                    int inside = y >= y0 && y <= y1 && x >= x0 && x <= x1;
                    if (inside ? cut[i] != 0.0f : cut[i] != plain[i]) bad++;
                }
        if (zeroed == 0 || zeroed != (y1 - y0 + 1) * (x1 - x0 + 1) || y1 - y0 + 1 > SIDE ||
            x1 - x0 + 1 > SIDE)
            bad++;
        full_squares += y1 - y0 + 1 == SIDE && x1 - x0 + 1 == SIDE;
    }
    CHECK(bad == 0);
    CHECK(full_squares > 0); /* most centres lie 20 or more pixels from the borders */
    free(src);
    free(plain);
    free(cut);
}

static int is_permutation(const int32_t *idx, int n) {
    char *seen = calloc((size_t)n, 1);
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        if (idx[i] < 0 || idx[i] >= n || seen[idx[i]]) ok = 0;
        else seen[idx[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_shuffle(void) {
    enum { N = 1000 };
    static int32_t a[N], b[N], c[N], d[N];
    shuffle_indices(a, N, 42, 0);
    shuffle_indices(b, N, 42, 1);
    shuffle_indices(c, N, 42, 0);
    shuffle_indices(d, N, 43, 0);
    CHECK(is_permutation(a, N));
    CHECK(is_permutation(b, N));
    CHECK(is_permutation(d, N));
    CHECK(memcmp(a, b, sizeof a) != 0);
    CHECK(memcmp(a, c, sizeof a) == 0);
    CHECK(memcmp(a, d, sizeof a) != 0);
    int fixed = 0;
    for (int i = 0; i < N; i++) fixed += a[i] == i;
    CHECK_MSG(fixed < 10, "%d fixed points", fixed); /* about 1 expected */
    int32_t one = -1;
    shuffle_indices(&one, 1, 5, 3);
    CHECK(one == 0);

    CHECK(rng_sample_seed(1, 0, 5) == rng_sample_seed(1, 0, 5));
    CHECK(rng_sample_seed(1, 0, 5) != rng_sample_seed(1, 1, 5));
    CHECK(rng_sample_seed(1, 0, 5) != rng_sample_seed(1, 0, 6));
    CHECK(rng_sample_seed(1, 0, 5) != rng_sample_seed(2, 0, 5));
    uint64_t s1 = 0, s2 = 0;
    CHECK(rng_splitmix64(&s1) == 0xe220a8397b1dcdafULL); /* splitmix64's first output from 0 */
    rng_splitmix64(&s2);
    CHECK(s1 == s2 && s1 == 0x9e3779b97f4a7c15ULL);
}

/* The largest crop_pad, cutout and sizes the set-up takes: every index in
 * range, as UBSan builds of this test check. */
static void test_largest_settings(void) {
    TransformSpec t = raw_spec(4, 4);
    t.crop_pad = DATASET_MAX_SIDE;
    int checked = 0;
    for (uint64_t s = 0; s < 200; s++) {
        uint64_t rng = s;
        int dy = (int)draw_below(&rng, 2 * DATASET_MAX_SIDE + 1) - DATASET_MAX_SIDE;
        int dx = (int)draw_below(&rng, 2 * DATASET_MAX_SIDE + 1) - DATASET_MAX_SIDE;
        float out[16], expected[16];
        for (int y = 0; y < 4; y++)
            for (int x = 0; x < 4; x++) {
                int sy = y + dy, sx = x + dx;
                expected[y * 4 + x] =
                    (sy >= 0 && sy < 4 && sx >= 0 && sx < 4) ? grid[sy * 4 + sx] : 0.0f;
            }
        transform_sample(&t, grid, 1, 4, 4, s, out);
        checked += near_all(out, expected, 16, 1e-4f);
    }
    CHECK_MSG(checked == 200, "%d of 200 crops as drawn", checked);

    /* A cutout of the largest side covers all of a long thin image, resized
     * to the largest side and back. */
    int side = DATASET_MAX_SIDE;
    uint8_t *column = malloc((size_t)side);
    float *out = malloc((size_t)side * sizeof(float));
    for (int i = 0; i < side; i++) column[i] = (uint8_t)(i % 251 + 1);
    t = raw_spec(side, 1);
    t.cutout = DATASET_MAX_SIDE;
    t.crop_pad = DATASET_MAX_SIDE;
    t.flip = 1;
    transform_sample(&t, column, 1, side, 1, 7, out);
    int zeros = 0;
    for (int i = 0; i < side; i++) zeros += out[i] == 0.0f;
    CHECK_MSG(zeros >= side / 2, "%d of %d zero", zeros, side);
    t = raw_spec(1, side);
    transform_sample(&t, column, 1, 1, side, 7, out); /* 1 x side -> 1 x side, a copy */
    CHECK(out[0] == 1.0f && out[side - 1] == (float)((side - 1) % 251 + 1));
    free(column);
    free(out);
}

static TransformSpec fatal_spec;
static int fatal_h, fatal_w;

static void sample_with_fatal_spec(void *unused) {
    (void)unused;
    uint8_t src[16] = {0};
    float out[16];
    transform_sample(&fatal_spec, src, 1, fatal_h, fatal_w, 1, out);
}

/* The set-up with this spec and image size stops in a child process, which
 * must exit non-zero with 'want' in its message. */
static void expect_fatal(const char *what, TransformSpec spec, int h, int w, const char *want) {
    fatal_spec = spec;
    fatal_h = h;
    fatal_w = w;
    int status;
    char *text = test_child_stderr("transform", sample_with_fatal_spec, NULL, &status);
    CHECK_MSG(status == 1, "%s: exit status %d", what, status);
    CHECK_MSG(strstr(text, want) != NULL, "%s: '%s' lacks '%s'", what, text, want);
    free(text);
}

static void test_refused_settings(void) {
    TransformSpec t = raw_spec(4, 4);
    t.crop_pad = DATASET_MAX_SIDE + 1;
    expect_fatal("crop_pad", t, 4, 4, "crop_pad = 16385; it must be at most 16384");
    t.crop_pad = 2147483647;
    expect_fatal("crop_pad INT_MAX", t, 4, 4, "crop_pad = 2147483647");
    t = raw_spec(4, 4);
    t.cutout = 2147483647;
    expect_fatal("cutout", t, 4, 4, "cutout = 2147483647; it must be at most 16384");
    t = raw_spec(4, DATASET_MAX_SIDE + 1);
    expect_fatal("output width", t, 4, 4, "output size 4x16385");
    t = raw_spec(0, 0);
    expect_fatal("image height", t, 2147483647, 1, "image size 2147483647x1");
    expect_fatal("image width 0", t, 4, 0, "image size 4x0");
    t = raw_spec(4, 4);
    t.mean[0] = NAN;
    expect_fatal("mean NaN", t, 4, 4, "mean[0] = nan");
    t = raw_spec(4, 4);
    t.std[0] = INFINITY;
    expect_fatal("std inf", t, 4, 4, "std[0] = inf");
    t.std[0] = 0.0f;
    expect_fatal("std 0", t, 4, 4, "std[0] = 0");
}

int main(void) {
    test_identity_resize_is_exact();
    test_bilinear_hand_values();
    test_bilinear_against_reference();
    test_flip();
    test_crop();
    test_crop_reflect();
    test_normalization();
    test_cutout_off_changes_nothing();
    test_cutout_hand_values();
    test_cutout_centres_uniform();
    test_cutout_after_resize();
    test_shuffle();
    test_largest_settings();
    test_refused_settings();
    return test_finish("test_data_transform");
}
