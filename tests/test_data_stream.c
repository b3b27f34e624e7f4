/* The streaming image pipeline on the CPU (data/decode.h, resample.h,
 * source.h, shards.h, the loader's resized_crop and encoded modes):
 *   decoding JPEG (colour, grayscale, CMYK from Adobe's inverted inks,
 *     progressive), PNG (colour, grayscale) and a PNG named .jpg, against
 *     stb_image's independent decode or the pixels written;
 *   a region decoded alone and at 1/2, 1/4, 1/8 against the same part of the
 *     whole image decoded at that scale;
 *   the crop boxes: RandomResizedCrop's ranges, its centre-crop fallback, and
 *     Resize + CenterCrop against torchvision's numbers for known sizes;
 *   the resample's two passes against its per-pixel form, to the bit;
 *   shards: packed from a folder, read back (the same samples, labels and
 *     bytes), split by size, and a truncated or corrupt shard refused by name;
 *   the loader: batches the same for any worker count, a resumed epoch's
 *     batches those of the whole epoch, two ranks' parts disjoint and
 *     complete, shards read in windows, encoded batches, data.skip_bad, and
 *     memory that does not grow with the set (a stated bound on the RSS). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <stb_image.h>
#include <stb_image_write.h>

#include "data/decode.h"
#include "data/loader.h"
#include "data/resample.h"
#include "data/shards.h"
#include "data/source.h"
#include "tests/harness.h"

static uint64_t rng;
static char err[8192];

static int uniform_int(int lo, int hi) {
    int v = lo + (int)test_uniform(&rng, 0.0f, (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

/* ---- writing images ----------------------------------------------------------- */

/* A smooth, noisy, interleaved image of 'channels' (1, 3 or 4) a pixel. */
static uint8_t *make_pixels(int w, int h, int channels) {
    uint8_t *p = malloc((size_t)w * h * channels);
    float base[4], gx[4], gy[4];
    for (int c = 0; c < channels; c++) {
        base[c] = test_uniform(&rng, 30, 220);
        gx[c] = test_uniform(&rng, -1.5f, 1.5f);
        gy[c] = test_uniform(&rng, -1.5f, 1.5f);
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < channels; c++) {
                float v = base[c] + gx[c] * (x % 64) + gy[c] * (y % 64) + test_uniform(&rng, -6, 6);
                p[((size_t)y * w + x) * channels + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    return p;
}

/* A JPEG through libjpeg: JCS_RGB, JCS_GRAYSCALE or JCS_CMYK (written with
 * Adobe's inverted inks, as Photoshop does), optionally progressive. */
static size_t jpeg_bytes(const uint8_t *pixels, int w, int h, J_COLOR_SPACE space, int progressive,
                         unsigned char **out) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned long len = 0;
    *out = NULL;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, out, &len);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = space == JCS_GRAYSCALE ? 1 : space == JCS_CMYK ? 4 : 3;
    c.in_color_space = space;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 92, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    if (space == JCS_CMYK) c.write_Adobe_marker = TRUE;
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)c.next_scanline * w * c.input_components);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return len;
}

typedef struct {
    unsigned char *data;
    size_t len;
} Bytes;

static void append(void *context, void *data, int size) {
    Bytes *b = context;
    b->data = realloc(b->data, b->len + (size_t)size);
    memcpy(b->data + b->len, data, (size_t)size);
    b->len += (size_t)size;
}

static unsigned char *png_bytes(const uint8_t *pixels, int w, int h, int channels, int *len) {
    Bytes b = {0};
    stbi_write_png_to_func(append, &b, w, h, channels, pixels, w * channels);
    *len = (int)b.len;
    return b.data;
}

static void write_bytes(const char *path, const void *bytes, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f && fwrite(bytes, 1, len, f) == len, "writing %s", path);
    if (f) fclose(f);
}

static const char *make_dir(const char *a, const char *b) {
    static char path[2048];
    snprintf(path, sizeof path, "%s/%s", a, b);
    mkdir(path, 0755);
    return path;
}

/* A folder root/<split>/c<k>/NNN.jpg of 'count' RGB JPEGs of random sizes in [lo, hi], over 'classes' classes. */
static void write_folder(const char *root, const char *split, int count, int classes, int lo, int hi) {
    char dir[2048];
    snprintf(dir, sizeof dir, "%s", make_dir(root, split));
    for (int i = 0; i < count; i++) {
        char cls[2100], path[2200];
        snprintf(cls, sizeof cls, "%s/c%d", dir, i % classes);
        mkdir(cls, 0755);
        int w = uniform_int(lo, hi), h = uniform_int(lo, hi);
        uint8_t *px = make_pixels(w, h, 3);
        unsigned char *jpg;
        size_t len = jpeg_bytes(px, w, h, JCS_RGB, 0, &jpg);
        snprintf(path, sizeof path, "%s/%04d.jpg", cls, i);
        write_bytes(path, jpg, len);
        free(jpg);
        free(px);
    }
}

/* ---- decoding ------------------------------------------------------------------- */

/* Mean absolute difference between decoded planes and interleaved reference pixels. */
static double mean_diff(const DecodedImage *d, const uint8_t *hwc, int channels) {
    double sum = 0;
    size_t plane = (size_t)d->w * d->h;
    for (size_t p = 0; p < plane; p++)
        for (int c = 0; c < 3; c++)
            sum += fabs((double)d->pixels[c * plane + p] - hwc[p * channels + (channels >= 3 ? c : 0)]);
    return sum / (3.0 * plane);
}

static void check_decode_kinds(void) {
    DecodeBuffers db = {0};
    DecodedImage d;
    int w = uniform_int(17, 90), h = uniform_int(17, 90);
    uint8_t *rgb = make_pixels(w, h, 3), *gray = make_pixels(w, h, 1), *cmyk = make_pixels(w, h, 4);
    struct {
        const char *what;
        J_COLOR_SPACE space;
        int progressive;
        const uint8_t *pixels;
    } jpegs[] = {{"RGB JPEG", JCS_RGB, 0, rgb}, {"progressive JPEG", JCS_RGB, 1, rgb},
                 {"grayscale JPEG", JCS_GRAYSCALE, 0, gray}, {"CMYK JPEG", JCS_CMYK, 0, cmyk}};
    for (size_t k = 0; k < sizeof jpegs / sizeof *jpegs; k++) {
        unsigned char *bytes;
        size_t len = jpeg_bytes(jpegs[k].pixels, w, h, jpegs[k].space, jpegs[k].progressive, &bytes);
        ImageInfo info;
        CHECK_MSG(image_probe(bytes, len, jpegs[k].what, &info, err, sizeof err) == 0, "%s", err);
        CHECK(info.kind == IMAGE_JPEG && info.w == w && info.h == h);
        CHECK_MSG(info.gpu_decodable == (jpegs[k].space != JCS_CMYK && !jpegs[k].progressive), "%s", jpegs[k].what);
        CHECK_MSG(image_decode(bytes, len, jpegs[k].what, NULL, &db, &d, err, sizeof err) == 0, "%s", err);
        CHECK(d.w == w && d.h == h && d.scale == 1);
        if (jpegs[k].space == JCS_CMYK) {
            /* Adobe's inverted inks c', k': R = c' k' / 255 (PIL's convert of a CMYK JPEG). */
            uint8_t *want = malloc((size_t)w * h * 3);
            for (size_t p = 0; p < (size_t)w * h; p++)
                for (int c = 0; c < 3; c++)
                    want[p * 3 + c] = (uint8_t)((cmyk[p * 4 + c] * cmyk[p * 4 + 3] + 127) / 255);
            double diff = mean_diff(&d, want, 3);
            CHECK_MSG(diff < 4.0, "CMYK JPEG: mean difference %.2f from the inks' RGB", diff);
            free(want);
        } else {
            int sw, sh, sc;
            uint8_t *stb = stbi_load_from_memory(bytes, (int)len, &sw, &sh, &sc, 3);
            double diff = stb ? mean_diff(&d, stb, 3) : 1e9;
            CHECK_MSG(diff < 2.0, "%s: mean difference %.2f from stb_image's decode", jpegs[k].what, diff);
            stbi_image_free(stb);
        }
        free(bytes);
    }
    /* PNG: the pixels exactly, colour and grayscale, and under a .jpg name (the content decides). */
    int png_len;
    unsigned char *png = png_bytes(rgb, w, h, 3, &png_len);
    CHECK(image_kind(png, (size_t)png_len) == IMAGE_PNG);
    CHECK_MSG(image_decode(png, (size_t)png_len, "x.jpg", NULL, &db, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.w == w && d.h == h && mean_diff(&d, rgb, 3) == 0);
    free(png);
    png = png_bytes(gray, w, h, 1, &png_len);
    CHECK_MSG(image_decode(png, (size_t)png_len, "g.png", NULL, &db, &d, err, sizeof err) == 0, "%s", err);
    CHECK(mean_diff(&d, gray, 1) == 0);
    free(png);
    /* Cut short: refused, the name in the message, whatever part is asked for. */
    unsigned char *bytes;
    size_t len = jpeg_bytes(rgb, w, h, JCS_RGB, 0, &bytes);
    DecodeRegion top = {1, 0, 0, w, 2};
    CHECK(image_decode(bytes, len / 2, "cut.jpg", &top, &db, &d, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "cut.jpg") && strstr(err, "truncated or corrupt"), "%s", err);
    free(bytes);
    free(rgb), free(gray), free(cmyk);
    decode_buffers_free(&db);
}

/* A region decoded alone equals that part of the whole image decoded at the same scale. */
static void check_regions(void) {
    DecodeBuffers whole_buf = {0}, part_buf = {0};
    for (int trial = 0; trial < 40; trial++) {
        int w = uniform_int(40, 400), h = uniform_int(40, 400), scale = 1 << uniform_int(0, 3);
        uint8_t *px = make_pixels(w, h, 3);
        unsigned char *bytes;
        size_t len = jpeg_bytes(px, w, h, JCS_RGB, trial % 4 == 3, &bytes);
        DecodedImage whole, part;
        DecodeRegion all = {scale, 0, 0, 0, 0};
        CHECK_MSG(image_decode(bytes, len, "w", &all, &whole_buf, &whole, err, sizeof err) == 0, "%s", err);
        CHECK(whole.w == (w + scale - 1) / scale && whole.h == (h + scale - 1) / scale);
        int x0 = uniform_int(0, whole.w - 1), y0 = uniform_int(0, whole.h - 1);
        DecodeRegion r = {scale, x0, y0, uniform_int(x0 + 1, whole.w), uniform_int(y0 + 1, whole.h)};
        CHECK_MSG(image_decode(bytes, len, "r", &r, &part_buf, &part, err, sizeof err) == 0, "%s", err);
        CHECK(part.x0 == r.x0 && part.y0 == r.y0 && part.w == r.x1 - r.x0 && part.h == r.y1 - r.y0);
        long differ = 0;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < part.h; y++)
                for (int x = 0; x < part.w; x++)
                    differ += part.pixels[((size_t)c * part.h + y) * part.w + x] !=
                              whole.pixels[((size_t)c * whole.h + y + y0) * whole.w + x + x0];
        CHECK_MSG(differ == 0, "%dx%d at 1/%d, region [%d,%d)x[%d,%d): %ld values differ from the whole decode", w, h,
                  scale, r.x0, r.x1, r.y0, r.y1, differ);
        free(bytes);
        free(px);
    }
    decode_buffers_free(&whole_buf);
    decode_buffers_free(&part_buf);
}

/* ---- crops and the resample ------------------------------------------------------ */

static void check_crops(void) {
    CropRecipe r = {0.08f, 1.0f, 0.75f, 4.0f / 3.0f, 256};
    for (int trial = 0; trial < 2000; trial++) {
        int w = uniform_int(1, 600), h = uniform_int(1, 600);
        CropBox b = crop_random_resized(w, h, &r, &rng);
        CHECK(b.x0 >= 0 && b.y0 >= 0 && b.w >= 1 && b.h >= 1 && b.x0 + b.w <= w && b.y0 + b.h <= h);
        CHECK(b.x0 == floorf(b.x0) && b.w == floorf(b.w)); /* torchvision's boxes are whole pixels */
        double share = (double)b.w * b.h / ((double)w * h), ratio = (double)b.w / b.h;
        /* Drawn boxes keep the ranges, to their rounding to whole pixels (at most 1 in 20 of a side
         * here); the fallback, a whole side, is the centre crop. */
        int exempt = b.w == w || b.h == h || b.w < 20 || b.h < 20;
        CHECK_MSG(exempt || (share > 0.08 * 0.9 && share < 1.0 + 1e-9 && ratio > 0.75 * 0.9 && ratio < 1.3334 / 0.9),
                  "%dx%d: box %gx%g at (%g,%g)", w, h, b.w, b.h, b.x0, b.y0);
    }
    /* A very thin image has no box in the ratio range: the centre crop at the nearest ratio. */
    CropBox thin = crop_random_resized(1000, 10, &r, &rng);
    CHECK(thin.h == 10 && thin.w == 13 && thin.x0 == (1000 - 13) / 2 && thin.y0 == 0);
    /* torchvision: Resize(256) of 500x375 is 341x256, CenterCrop(224) at top 16, left round(58.5) = 58. */
    CropBox c = crop_center(500, 375, 256, 224, 224);
    CHECK_NEAR(c.x0, 58 * 500.0 / 341, 1e-3);
    CHECK_NEAR(c.w, 224 * 500.0 / 341, 1e-3);
    CHECK_NEAR(c.y0, 16 * 375.0 / 256, 1e-4);
    CHECK_NEAR(c.h, 224 * 375.0 / 256, 1e-4);
    c = crop_center(300, 600, 256, 224, 224); /* portrait: 256x512, top 144, left 16 */
    CHECK_NEAR(c.x0, 16 * 300.0 / 256, 1e-4);
    CHECK_NEAR(c.y0, 144 * 600.0 / 512, 1e-3);
}

/* The two passes sum in the per-pixel order: the same floats. */
static void check_resample_passes(void) {
    ResampleScratch scratch = {0};
    for (int trial = 0; trial < 20; trial++) {
        int w = uniform_int(3, 200), h = uniform_int(3, 200), out_h = uniform_int(1, 64), out_w = uniform_int(1, 64);
        uint8_t *px = make_pixels(w, h, 1), *planes = malloc(3 * (size_t)w * h);
        for (int c = 0; c < 3; c++) memcpy(planes + (size_t)c * w * h, px, (size_t)w * h);
        CropRecipe r = {0.05f, 1.0f, 0.5f, 2.0f, 0};
        CropBox box = crop_random_resized(w, h, &r, &rng);
        int flip = trial & 1;
        ResampleSource src = {{planes, planes + (size_t)w * h, planes + 2 * (size_t)w * h}, w, w, h, 0, 0, w, h};
        float mean[3] = {0.5f, 0.4f, 0.3f}, std[3] = {0.2f, 0.25f, 0.3f};
        float *out = malloc(3 * (size_t)out_h * out_w * sizeof(float));
        resample_image(&src, &box, flip, out_h, out_w, mean, std, &scratch, out, NULL);
        long differ = 0;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < out_h; y++)
                for (int x = 0; x < out_w; x++) {
                    float v = resample_pixel(&src, &box, flip, out_h, out_w, c, y, x);
                    float want = resample_normalise(v, mean[c], std[c]);
                    differ += out[((size_t)c * out_h + y) * out_w + x] != want;
                }
        CHECK_MSG(differ == 0, "%dx%d box %gx%g to %dx%d: %ld values differ", w, h, box.w, box.h, out_w, out_h, differ);
        /* A box the size of the output reads its pixels unchanged. */
        CropBox same = {0, 0, (float)w, (float)h};
        uint8_t *u8 = malloc(3 * (size_t)w * h);
        resample_image(&src, &same, 0, h, w, mean, std, &scratch, NULL, u8);
        CHECK(memcmp(u8, planes, 3 * (size_t)w * h) == 0);
        free(u8), free(out), free(px), free(planes);
    }
    resample_scratch_free(&scratch);
}

/* ---- shards ------------------------------------------------------------------------- */

/* A folder of 'count' images over 3 classes listed into folder, and packed
 * into root/packed (its path in packed) as shards of at most shard_bytes. */
static int pack_folder(const char *tag, int count, int64_t shard_bytes, int shuffle, Source *folder, char *packed,
                       size_t len, PackOptions *opt) {
    char root[600];
    snprintf(root, sizeof root, "%s", test_tmpdir(tag));
    write_folder(root, "train", count, 3, 20, 60);
    CHECK_MSG(source_open_folder(folder, root, "train", 0, err, sizeof err) == 0, "%s", err);
    snprintf(packed, len, "%s/packed", root);
    *opt = (PackOptions){.shard_bytes = shard_bytes, .seed = 5, .shuffle = shuffle};
    int n_shards = 0;
    CHECK_MSG(shards_write(folder, packed, "train", opt, &n_shards, err, sizeof err) == 0, "%s", err);
    return n_shards;
}

static void check_shards(void) {
    char packed[700], err2[4600];
    Source folder, shards;
    PackOptions opt;
    int n_shards = pack_folder("shards", 23, 12000, 1, &folder, packed, sizeof packed, &opt);
    CHECK_MSG(n_shards >= 3, "%d shards of at most 12000 bytes", n_shards);
    /* Packing again into the same folder is refused: nothing is replaced. */
    int again;
    CHECK(shards_write(&folder, packed, "train", &opt, &again, err2, sizeof err2) == -1 &&
          strstr(err2, "holds") && strstr(err2, "shards"));
    CHECK_MSG(source_open_shards(&shards, packed, "train", 0, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(shards.n == folder.n && shards.num_classes == 3 && shards.n_shards == n_shards,
              "%d samples of %d, %d classes, %d shards of %d", shards.n, folder.n, shards.num_classes, shards.n_shards,
              n_shards);
    for (int k = 0; k < 3 && shards.class_names; k++) CHECK(strcmp(shards.class_names[k], folder.class_names[k]) == 0);
    /* Every sample once: its bytes those of one file of the folder, with that file's label. */
    SourceReader a, b;
    source_reader_init(&a);
    source_reader_init(&b);
    int *matched = calloc((size_t)folder.n, sizeof *matched);
    for (int i = 0; i < shards.n; i++) {
        const uint8_t *sb, *fb;
        size_t sl, fl;
        CHECK_MSG(source_read(&shards, i, &a, &sb, &sl, err, sizeof err) == 0, "%s", err);
        int found = -1;
        for (int j = 0; j < folder.n && found < 0; j++) {
            if (matched[j] || folder.size[j] != (int64_t)sl) continue;
            if (source_read(&folder, j, &b, &fb, &fl, err, sizeof err) == 0 && memcmp(fb, sb, sl) == 0) found = j;
        }
        CHECK_MSG(found >= 0 && shards.labels[i] == folder.labels[found], "shard sample %d", i);
        if (found >= 0) matched[found] = 1;
    }
    free(matched);
    source_reader_close(&a);
    source_reader_close(&b);
    source_free(&shards);
    /* A shard cut short, then one that is not a tar file: refused, named. */
    char path[800];
    shard_file_name("train", 1, path, sizeof path);
    char full[1600];
    snprintf(full, sizeof full, "%s/%s", packed, path);
    struct stat st;
    CHECK(stat(full, &st) == 0);
    CHECK(truncate(full, st.st_size - 700) == 0);
    CHECK(source_open_shards(&shards, packed, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, path) && strstr(err, "truncated"), "%s", err);
    write_bytes(full, "not a tar file at all, just text and more text ...", 50);
    CHECK(source_open_shards(&shards, packed, "train", 0, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, path), "%s", err);
    CHECK(source_open_shards(&shards, packed, "test", 0, err, sizeof err) == -1 && strstr(err, "no shards"));
    source_free(&folder);
}

/* ---- the loader ----------------------------------------------------------------------- */

static LoaderConfig stream_config(int batch, int workers) {
    LoaderConfig lc = {.batch = batch, .workers = workers, .prefetch = 3, .shuffle = 1, .shuffle_shards = 2,
                       .drop_last = 1, .augment = 1, .resized_crop = 1, .dct_scaling = 1, .seed = 11,
                       .crop = {0.08f, 1.0f, 0.75f, 4.0f / 3.0f, 37}};
    transform_spec_default(&lc.transform, 32, 32);
    lc.transform.flip = 1;
    return lc;
}

/* An epoch's batches from batch 'first' on: their floats and labels, appended. */
static size_t epoch_bytes(const Source *s, const LoaderConfig *lc, int epoch, int first, float **floats,
                          int32_t **labels) {
    Loader *l = loader_create_source(s, lc);
    loader_start_epoch_at(l, epoch, first);
    size_t per = 3 * 32 * 32, n = 0;
    *floats = NULL;
    *labels = NULL;
    Batch b;
    while (loader_next(l, &b)) {
        *floats = realloc(*floats, (n + b.n) * per * sizeof(float));
        *labels = realloc(*labels, (n + b.n) * sizeof(int32_t));
        memcpy(*floats + n * per, b.images, (size_t)b.n * per * sizeof(float));
        memcpy(*labels + n, b.labels, (size_t)b.n * sizeof(int32_t));
        n += b.n;
        loader_release(l, &b);
    }
    loader_destroy(l);
    return n;
}

static void check_loader_streaming(void) {
    char root[600];
    snprintf(root, sizeof root, "%s", test_tmpdir("loader"));
    write_folder(root, "train", 40, 4, 24, 140);
    Source s;
    CHECK_MSG(source_open_folder(&s, root, "train", 0, err, sizeof err) == 0, "%s", err);
    LoaderConfig lc = stream_config(8, 0);
    float *a, *b;
    int32_t *la, *lb;
    size_t n = epoch_bytes(&s, &lc, 1, 0, &a, &la);
    CHECK(n == 40);
    lc.workers = 3; /* any worker count: the same bytes */
    CHECK(epoch_bytes(&s, &lc, 1, 0, &b, &lb) == n && memcmp(a, b, n * 3 * 32 * 32 * sizeof(float)) == 0 &&
          memcmp(la, lb, n * sizeof *la) == 0);
    free(b), free(lb);
    /* Resumed at batch 2: the whole epoch's batches from 2 on. */
    size_t rest = epoch_bytes(&s, &lc, 1, 2, &b, &lb);
    CHECK(rest == n - 16 && memcmp(b, a + 16 * 3 * 32 * 32, rest * 3 * 32 * 32 * sizeof(float)) == 0);
    free(b), free(lb);
    /* Another epoch, another order and other crops. */
    epoch_bytes(&s, &lc, 2, 0, &b, &lb);
    CHECK(memcmp(a, b, n * 3 * 32 * 32 * sizeof(float)) != 0);
    free(b), free(lb), free(a), free(la);
    /* Raw mode: the uint8 crop at the output size and its flip; the same crop as the float path's. */
    lc.raw = 1;
    Loader *l = loader_create_source(&s, &lc);
    int c, h, w;
    loader_raw_shape(l, &c, &h, &w);
    CHECK(c == 3 && h == 32 && w == 32);
    loader_start_epoch(l, 0);
    Batch batch;
    CHECK(loader_next(l, &batch) == 1 && batch.raw_images && batch.params && batch.params[0].crop_dx == 0);
    loader_release(l, &batch);
    loader_destroy(l);
    source_free(&s);
}

/* Two ranks: their parts of every epoch disjoint and, without drop_last,
 * complete. The labels are made the samples' numbers to tell them apart. */
static void check_ranks(Source *s, const char *what) {
    for (int i = 0; i < s->n; i++) s->labels[i] = i;
    for (int drop = 0; drop < 2; drop++) {
        int *seen = calloc((size_t)s->n, sizeof *seen), total = 0, twice = 0;
        for (int rank = 0; rank < 2; rank++) {
            LoaderConfig lc = stream_config(4, 2);
            lc.rank = rank, lc.world = 2, lc.drop_last = drop, lc.augment = 0;
            Loader *l = loader_create_source(s, &lc);
            loader_start_epoch(l, 3);
            Batch b;
            while (loader_next(l, &b)) {
                for (int i = 0; i < b.n; i++) twice += seen[b.labels[i]]++ > 0;
                total += b.n;
                loader_release(l, &b);
            }
            CHECK(loader_epoch_samples(l) == (drop ? s->n / 2 : (s->n - rank + 1) / 2));
            loader_destroy(l);
        }
        int expect = drop ? s->n / 2 / 4 * 4 * 2 : s->n;
        CHECK_MSG(twice == 0 && total == expect, "%s, drop_last %d: %d of %d samples over 2 ranks, %d twice", what,
                  drop, total, s->n, twice);
        free(seen);
    }
}

static void check_shard_windows(void) {
    char packed[700];
    Source folder, shards;
    PackOptions opt;
    pack_folder("windows", 30, 8000, 0, &folder, packed, sizeof packed, &opt);
    CHECK_MSG(source_open_shards(&shards, packed, "train", 0, err, sizeof err) == 0, "%s", err);
    check_ranks(&shards, "shards");
    check_ranks(&folder, "folder");
    source_free(&shards);
    source_free(&folder);
}

/* Encoded mode: the files' bytes and their boxes, and the CPU's crop for what the GPU cannot decode. */
static void check_encoded(void) {
    char root[600], dir[800], path[900];
    snprintf(root, sizeof root, "%s", test_tmpdir("encoded"));
    write_folder(root, "train", 6, 1, 30, 80);
    snprintf(dir, sizeof dir, "%s/train/c0", root);
    uint8_t *cmyk = make_pixels(50, 40, 4);
    unsigned char *bytes;
    size_t len = jpeg_bytes(cmyk, 50, 40, JCS_CMYK, 0, &bytes);
    snprintf(path, sizeof path, "%s/9999.jpg", dir);
    write_bytes(path, bytes, len);
    free(bytes), free(cmyk);
    Source s;
    CHECK_MSG(source_open_folder(&s, root, "train", 0, err, sizeof err) == 0, "%s", err);
    LoaderConfig lc = stream_config(7, 2);
    lc.encoded = 1;
    Loader *l = loader_create_source(&s, &lc);
    loader_start_epoch(l, 0);
    Batch b;
    CHECK(loader_next(l, &b) == 1 && b.n == 7 && b.encoded && b.samples && b.fallback && !b.images);
    int fallbacks = 0;
    SourceReader r;
    source_reader_init(&r);
    for (int i = 0; i < b.n; i++) {
        const EncodedSample *e = &b.samples[i];
        if (e->fallback) {
            fallbacks++;
            CHECK(e->w == 32 && e->h == 32 && e->box.w == 32);
            continue;
        }
        const uint8_t *file;
        size_t flen;
        CHECK(source_read(&s, e->index, &r, &file, &flen, err, sizeof err) == 0);
        CHECK(flen == (size_t)e->bytes && memcmp(file, b.encoded + e->offset, flen) == 0);
        CHECK(e->box.x0 >= 0 && e->box.x0 + e->box.w <= e->w && e->box.y0 + e->box.h <= e->h);
    }
    CHECK_MSG(fallbacks == 1, "%d of 7 decoded on the CPU (the CMYK one)", fallbacks);
    source_reader_close(&r);
    loader_release(l, &b);
    loader_destroy(l);
    /* data.gpu_cpu_share = 0.5: places 1, 3 and 5 of 7 (and the CMYK file wherever it is) on the CPU. */
    lc.cpu_share = 0.5f;
    l = loader_create_source(&s, &lc);
    loader_start_epoch(l, 0);
    CHECK(loader_next(l, &b) == 1 && b.n == 7);
    fallbacks = 0;
    for (int i = 0; i < b.n; i++) {
        fallbacks += b.samples[i].fallback;
        if (i % 2) CHECK_MSG(b.samples[i].fallback && b.samples[i].w == 32, "place %d of the share not on the CPU", i);
    }
    CHECK_MSG(fallbacks == 3 || fallbacks == 4, "%d of 7 decoded on the CPU, not 3 (or 4 with the CMYK one)", fallbacks);
    loader_release(l, &b);
    loader_destroy(l);
    source_free(&s);
}

/* ---- bad files ------------------------------------------------------------------------ */

static const Source *bad_source;

static void take_bad_epoch(void *arg) {
    LoaderConfig lc = stream_config(4, 2);
    lc.skip_bad = arg != NULL;
    Loader *l = loader_create_source(bad_source, &lc);
    loader_start_epoch(l, 0);
    Batch b;
    while (loader_next(l, &b)) loader_release(l, &b);
    LoaderStages st;
    loader_stages(l, &st);
    printf("skipped %ld\n", st.skipped);
    if (st.skipped != 4) _exit(5);
    loader_destroy(l);
}

static void check_skip_bad(void) {
    char root[600], path[900];
    snprintf(root, sizeof root, "%s", test_tmpdir("skip-bad"));
    write_folder(root, "train", 12, 2, 24, 50);
    snprintf(path, sizeof path, "%s/train/c0/0002.jpg", root); /* cut short */
    FILE *f = fopen(path, "r+");
    if (f) {
        CHECK(ftruncate(fileno(f), 300) == 0);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/train/c1/0003.jpg", root);
    write_bytes(path, "<html>404</html>", 16);
    /* A PNG with a byte of its image data changed (its chunk's CRC no longer fits). */
    int png_len;
    uint8_t *px = make_pixels(20, 20, 3);
    unsigned char *png = png_bytes(px, 20, 20, 3, &png_len);
    png[png_len - 12 - 20] ^= 0x01; /* inside the IDAT, before its CRC and the IEND chunk */
    snprintf(path, sizeof path, "%s/train/c0/0004.jpg", root);
    write_bytes(path, png, (size_t)png_len);
    free(png);
    /* A progressive JPEG of 20x20 whose header declares 16384x16384 (the campaign's took 26 s and 4.2 GB). */
    unsigned char *jpg;
    size_t jpg_len = jpeg_bytes(px, 20, 20, JCS_RGB, 1, &jpg), sof = 2;
    while (sof + 9 < jpg_len && !(jpg[sof] == 0xff && jpg[sof + 1] == 0xc2)) sof++;
    CHECK(sof + 9 < jpg_len);
    memcpy(jpg + sof + 5, "\x40\x00\x40\x00", 4);
    snprintf(path, sizeof path, "%s/train/c1/0005.jpg", root);
    write_bytes(path, jpg, jpg_len);
    free(jpg);
    free(px);
    Source s;
    CHECK_MSG(source_open_folder(&s, root, "train", 0, err, sizeof err) == 0, "%s", err);
    bad_source = &s;
    int status;
    char *out = test_child_stderr("skip-bad-run", take_bad_epoch, NULL, &status);
    CHECK_MSG(status == 1 && (strstr(out, "0002.jpg") || strstr(out, "0003.jpg")) && strstr(out, "data.skip_bad"),
              "without skip_bad, exit %d: %s", status, out);
    free(out);
    out = test_child_stderr("skip-bad-run", take_bad_epoch, (void *)1, &status);
    CHECK_MSG(status == 0 && strstr(out, "0002.jpg") && strstr(out, "0003.jpg") &&
                  strstr(out, "0004.jpg: cannot decode this PNG: its IDAT chunk") &&
                  strstr(out, "0005.jpg: cannot decode this JPEG: its header declares 16384x16384"),
              "with skip_bad, exit %d: %s", status, out);
    free(out);
    source_free(&s);
}

/* ---- memory ------------------------------------------------------------------------------ */

/* 3,000 images of 200-300 pixels a side (about 560 MB decoded) streamed through
 * an epoch: the process's peak grows by less than MEMORY_BOUND_MB, which a
 * decode-once set could not. */
#define MEMORY_BOUND_MB 48
static void write_memory_folder(void *root) { write_folder(root, "train", 3000, 10, 200, 300); }

static void check_memory_bound(void) {
    char root[600];
    snprintf(root, sizeof root, "%s", test_tmpdir("memory"));
    int status; /* written by a child, so that this process's peak is the streaming's alone */
    free(test_child_stderr("memory-write", write_memory_folder, root, &status));
    CHECK(status == 0);
    Source s;
    CHECK_MSG(source_open_folder(&s, root, "train", 0, err, sizeof err) == 0, "%s", err);
    LoaderConfig lc = stream_config(64, 2);
    struct rusage u0;
    getrusage(RUSAGE_SELF, &u0);
    Loader *l = loader_create_source(&s, &lc);
    loader_start_epoch(l, 0);
    Batch b;
    int n = 0;
    while (loader_next(l, &b)) {
        n += b.n;
        loader_release(l, &b);
    }
    loader_destroy(l);
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    double mb = u.ru_maxrss / 1024.0;
    printf("streamed %d images (%.0f MB of files, about %.0f MB decoded): peak RSS %.0f MB\n", n,
           s.bytes_total / 1e6, 3000 * 3 * 250.0 * 250.0 / 1e6, mb);
    double grown = mb - u0.ru_maxrss / 1024.0; /* over the libraries' pages (cuDNN's and cuBLAS's in a CUDA build) */
    CHECK_MSG(grown < MEMORY_BOUND_MB, "peak RSS %.0f MB, %.0f MB over the %.0f MB before the loader, over %d MB", mb,
              grown, u0.ru_maxrss / 1024.0, MEMORY_BOUND_MB);
    source_free(&s);
}

int main(void) {
    rng = test_seed();
    check_memory_bound(); /* first: the peak RSS is the process's */
    check_decode_kinds();
    check_regions();
    check_crops();
    check_resample_passes();
    check_shards();
    check_loader_streaming();
    check_shard_windows();
    check_encoded();
    check_skip_bad();
    return test_finish("test_data_stream");
}
