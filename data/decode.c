/* Image files to planar RGB: JPEG by libjpeg-turbo's libjpeg API, which alone
 * of its APIs (in the 2.1 Debian ships) decodes a region: jpeg_crop_scanline
 * for the columns, jpeg_skip_scanlines for the rows, and scale_denom for the
 * DCT-domain scaling; PNG and BMP by stb_image. */
#include "data/decode.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <jerror.h>
#include <stb_image.h>
#include <zlib.h>

#include "data/dataset.h"
#include "runtime/check.h"
#include "runtime/files.h"

/* ---- reading and telling kinds apart --------------------------------------- */

int read_whole_file(const char *path, uint8_t **buf, size_t *cap, size_t *len, char *err, size_t errlen) {
    struct stat st;
    const char *why;
    int fd = files_open_input(path, &st, &why);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, fd >= 0 ? strerror(errno) : why);
        if (fd >= 0) close(fd);
        return -1;
    }
    if (st.st_size > 0x7fffffff) { /* stb_image takes an int length */
        snprintf(err, errlen, "%s: %lld bytes, too large for an image file", path, (long long)st.st_size);
        fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    *buf = buffer_grow(*buf, cap, size, path);
    if (fread(*buf, 1, size, f) != size) {
        snprintf(err, errlen, "%s: read error", path);
        fclose(f);
        return -1;
    }
    fclose(f);
    *len = size;
    return 0;
}

ImageKind image_kind(const uint8_t *buf, size_t len) {
    static const uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff) return IMAGE_JPEG;
    if (len >= 8 && memcmp(buf, png_signature, 8) == 0) return IMAGE_PNG;
    if (len >= 2 && buf[0] == 'B' && buf[1] == 'M') return IMAGE_BMP;
    return IMAGE_UNKNOWN;
}

const char *image_kind_name(ImageKind kind) {
    return kind == IMAGE_JPEG ? "JPEG" : kind == IMAGE_PNG ? "PNG" : kind == IMAGE_BMP ? "BMP" : "file";
}

static int not_an_image(const char *name, const uint8_t *buf, size_t len, char *err, size_t errlen) {
    if (len == 0) {
        snprintf(err, errlen, "%s: cannot decode: an empty file (0 bytes)", name);
        return -1;
    }
    char start[32] = "";
    for (size_t i = 0; i < len && i < 4; i++)
        snprintf(start + strlen(start), sizeof start - strlen(start), " %02x", buf[i]);
    snprintf(err, errlen, "%s: cannot decode: not a JPEG, PNG or BMP image (its first bytes are%s)", name, start);
    return -1;
}

/* Sides as a header gives them (a top-down BMP has a negative height). */
static int check_image_shape(const char *name, long long w, long long h, int channels, char *err, size_t errlen) {
    if (w < 1 || h < 1 || w > DATASET_MAX_SIDE || h > DATASET_MAX_SIDE) {
        snprintf(err, errlen, "%s: image is %lldx%lld; each side must be 1 to %d pixels", name, w, h,
                 DATASET_MAX_SIDE);
        return -1;
    }
    if (channels < 1 || channels > 4) {
        snprintf(err, errlen, "%s: image has %d channels; 1 to 4 are read", name, channels);
        return -1;
    }
    return 0;
}

/* ---- PNG and BMP: stb_image ---------------------------------------------------- */

static uint32_t read_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint32_t read_le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t read_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* stb_image decodes an uncompressed BMP cut short as if the missing rows were
 * zeros, so the rows' extent is checked against the file here. */
static int check_bmp_complete(const char *name, const uint8_t *buf, size_t len, char *err, size_t errlen) {
    if (len < 30) return 0; /* stbi_info has refused it already */
    uint32_t offset = read_le32(buf + 10), header_bytes = read_le32(buf + 14);
    long long w, h;
    uint32_t bits, compression = 0;
    if (header_bytes == 12) { /* OS/2 */
        w = read_le16(buf + 18);
        h = (int16_t)read_le16(buf + 20);
        bits = read_le16(buf + 24);
    } else {
        if (len < 34) return 0;
        w = (int32_t)read_le32(buf + 18);
        h = (int32_t)read_le32(buf + 22);
        bits = read_le16(buf + 28);
        compression = read_le32(buf + 30);
    }
    if (h < 0) h = -h;
    /* 0: plain rows, 3 and 6: rows with bit fields; stb_image refuses the rest. */
    if (compression != 0 && compression != 3 && compression != 6) return 0;
    if (w < 1 || h < 1 || w > DATASET_MAX_SIDE || h > DATASET_MAX_SIDE || bits > 64) return 0;
    long long row_bytes = (w * bits + 31) / 32 * 4;
    long long needed = (long long)offset + row_bytes * h;
    if (needed > (long long)len) {
        snprintf(err, errlen,
                 "%s: cannot decode this BMP: it is truncated (its %lld rows of %lld pixels need %lld bytes, the "
                 "file has %zu)", name, h, w, needed, len);
        return -1;
    }
    return 0;
}

/* The bytes of the filtered rows a PNG's header declares (each row one filter
 * byte and its pixels' bits rounded up), over the 7 passes of an interlaced one. */
static double png_raw_bytes(const uint8_t *ihdr) {
    static const int start_x[7] = {0, 4, 0, 2, 0, 1, 0}, start_y[7] = {0, 0, 4, 0, 2, 0, 1};
    static const int step_x[7] = {8, 8, 4, 4, 2, 2, 1}, step_y[7] = {8, 8, 8, 4, 4, 2, 2};
    double w = read_be32(ihdr), h = read_be32(ihdr + 4);
    int depth = ihdr[8], color = ihdr[9], interlaced = ihdr[12] == 1;
    int channels = color == 2 ? 3 : color == 4 ? 2 : color == 6 ? 4 : 1;
    double bits = (double)channels * depth;
    if (!interlaced) return h * (1 + ceil(w * bits / 8));
    double sum = 0;
    for (int p = 0; p < 7; p++) {
        double pw = w > start_x[p] ? ceil((w - start_x[p]) / step_x[p]) : 0;
        double ph = h > start_y[p] ? ceil((h - start_y[p]) / step_y[p]) : 0;
        if (pw > 0 && ph > 0) sum += ph * (1 + ceil(pw * bits / 8));
    }
    return sum;
}

/* The IDAT chunks' zlib stream inflated (into a scratch buffer, discarded):
 * stb_image checks neither its Adler-32 nor that it holds every row, and
 * decodes a damaged stream into changed pixels. */
static int check_png_stream(const char *name, const uint8_t *buf, size_t len, double raw_bytes, char *err,
                            size_t errlen) {
    uint8_t scratch[65536];
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit(&z) != Z_OK) TC_FATAL("zlib: inflateInit failed");
    int rc = Z_OK;
    for (size_t at = 8; at + 12 <= len && rc == Z_OK;) {
        uint32_t chunk_bytes = read_be32(buf + at);
        if (memcmp(buf + at + 4, "IEND", 4) == 0) break;
        if (memcmp(buf + at + 4, "IDAT", 4) == 0) {
            z.next_in = (Bytef *)(buf + at + 8);
            z.avail_in = chunk_bytes;
            while (rc == Z_OK && z.avail_in > 0) {
                z.next_out = scratch;
                z.avail_out = sizeof scratch;
                rc = inflate(&z, Z_NO_FLUSH);
                if (rc == Z_BUF_ERROR && z.avail_out > 0) rc = Z_OK; /* wants the next chunk */
            }
        }
        at += 12 + (size_t)chunk_bytes;
    }
    double inflated = (double)z.total_out;
    const char *zlib_says = z.msg ? z.msg : "";
    if (rc != Z_OK && rc != Z_STREAM_END)
        snprintf(err, errlen, "%s: cannot decode this PNG: its compressed image data is corrupt (zlib: %s)", name,
                 zlib_says[0] ? zlib_says : "error");
    else if (rc != Z_STREAM_END || inflated < raw_bytes)
        snprintf(err, errlen, "%s: cannot decode this PNG: its compressed image data is truncated (%.0f bytes of the "
                 "%.0f its header's size needs%s)", name, inflated, raw_bytes,
                 rc == Z_STREAM_END ? "" : ", and the stream has no end");
    inflateEnd(&z);
    return rc == Z_STREAM_END && inflated >= raw_bytes ? 0 : -1;
}

/* Deflate codes at most 258 bytes in 2 bits (a 1-bit length code and a 1-bit
 * distance code), so no zlib stream inflates to more than 1032 times its
 * bytes, and a header whose rows need more than that of its IDAT chunks is
 * refused before anything is inflated. */
#define DEFLATE_MAX_RATIO 1032.0

/* Every chunk up to IEND fits in the file (stb_image grows its PNG data buffer
 * to each chunk's claimed length before reading it, so one corrupt length asks
 * for gigabytes) and matches its CRC-32, as PIL checks them; the size declared
 * can be held by the IDAT bytes; the zlib stream inflates whole. */
static int check_png_complete(const char *name, const uint8_t *buf, size_t len, char *err, size_t errlen) {
    size_t at = 8; /* the signature */
    double idat_bytes = 0;
    const uint8_t *ihdr = NULL;
    while (at + 12 <= len) {
        uint32_t chunk_bytes = read_be32(buf + at);
        if (chunk_bytes > len - at - 12) {
            snprintf(err, errlen,
                     "%s: cannot decode this PNG: it is truncated or corrupt (the chunk at byte %zu claims %u bytes, "
                     "the file has %zu after it)", name, at, chunk_bytes, len - at - 12);
            return -1;
        }
        uint32_t stored = read_be32(buf + at + 8 + chunk_bytes);
        uint32_t computed = (uint32_t)crc32(0, buf + at + 4, 4 + chunk_bytes);
        if (stored != computed) {
            snprintf(err, errlen, "%s: cannot decode this PNG: its %.4s chunk at byte %zu is corrupt (CRC-32 %08x, "
                     "its data's %08x)", name, (const char *)buf + at + 4, at, stored, computed);
            return -1;
        }
        if (memcmp(buf + at + 4, "IHDR", 4) == 0 && chunk_bytes >= 13) ihdr = buf + at + 8;
        if (memcmp(buf + at + 4, "IDAT", 4) == 0) idat_bytes += chunk_bytes;
        if (memcmp(buf + at + 4, "IEND", 4) == 0) break;
        at += 12 + (size_t)chunk_bytes;
    }
    if (!ihdr || at + 12 > len) return 0; /* no header or no IEND: stb_image refuses it itself */
    double raw_bytes = png_raw_bytes(ihdr);
    if (raw_bytes > DEFLATE_MAX_RATIO * idat_bytes + 1024) {
        snprintf(err, errlen, "%s: cannot decode this PNG: its header declares %ux%u, whose rows need %.0f bytes, "
                 "more than its %.0f bytes of compressed image data can hold (deflate inflates at most %.0f-fold): "
                 "it is corrupt or truncated", name, read_be32(ihdr), read_be32(ihdr + 4), raw_bytes, idat_bytes,
                 DEFLATE_MAX_RATIO);
        return -1;
    }
    return check_png_stream(name, buf, len, raw_bytes, err, errlen);
}

/* stb_image's reason for a failure, where it is the decoder's own: stb tries
 * the PNG signature before the other formats, and a decoder that fails without
 * saying why leaves that test's "bad png sig" behind. */
static const char *stb_reason(ImageKind kind) {
    const char *reason = stbi_failure_reason();
    if (!reason || strcmp(reason, "unknown image type") == 0 ||
        (kind != IMAGE_PNG && strcmp(reason, "bad png sig") == 0))
        return NULL;
    return reason;
}

static int probe_stb(const uint8_t *buf, size_t len, const char *name, ImageInfo *info, char *err, size_t errlen) {
    int w, h, channels;
    if (len > 0x7fffffff || !stbi_info_from_memory(buf, (int)len, &w, &h, &channels)) {
        snprintf(err, errlen, "%s: cannot decode this %s: its header is truncated or corrupt", name,
                 image_kind_name(info->kind));
        return -1;
    }
    if (check_image_shape(name, w, h < 0 ? -(long long)h : h, channels, err, errlen) != 0) return -1;
    info->w = w;
    info->h = h < 0 ? -h : h;
    info->channels = channels;
    if (info->kind == IMAGE_BMP && check_bmp_complete(name, buf, len, err, errlen) != 0) return -1;
    if (info->kind == IMAGE_PNG && check_png_complete(name, buf, len, err, errlen) != 0) return -1;
    return 0;
}

void *buffer_grow(void *p, size_t *cap, size_t bytes, const char *what) {
    if (bytes <= *cap && p) return p;
    void *grown = realloc(p, bytes ? bytes : 1);
    if (!grown) TC_FATAL("out of host memory: %zu bytes for %s", bytes, what);
    *cap = bytes;
    return grown;
}

static uint8_t *grow(uint8_t **p, size_t *cap, size_t bytes, const char *what) {
    return *p = buffer_grow(*p, cap, bytes, what);
}

/* Region [x0, x1) x [y0, y1) of interleaved rows of 'channels' bytes a pixel
 * into three planes (gray repeated). */
static void rows_to_planes(const uint8_t *hwc, int row_pixels, int channels, int x0, int x1, int y0, int y1,
                           uint8_t *chw) {
    size_t plane = (size_t)(x1 - x0) * (size_t)(y1 - y0);
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = hwc + ((size_t)y * row_pixels + x0) * channels;
        size_t at = (size_t)(y - y0) * (x1 - x0);
        for (int x = 0; x < x1 - x0; x++, at++) {
            const uint8_t *px = row + (size_t)x * channels;
            chw[at] = px[0];
            chw[plane + at] = channels >= 3 ? px[1] : px[0];
            chw[2 * plane + at] = channels >= 3 ? px[2] : px[0];
        }
    }
}

static int decode_stb(const uint8_t *buf, size_t len, const char *name, const ImageInfo *info, int x0, int y0,
                      int x1, int y1, DecodeBuffers *db, DecodedImage *out, char *err, size_t errlen) {
    int w, h, channels;
    uint8_t *hwc = stbi_load_from_memory(buf, (int)len, &w, &h, &channels, 3);
    if (!hwc) {
        const char *reason = stb_reason(info->kind);
        snprintf(err, errlen, "%s: cannot decode this %s: its data is truncated or corrupt%s%s%s", name,
                 image_kind_name(info->kind), reason ? " (stb_image: " : "", reason ? reason : "", reason ? ")" : "");
        return -1;
    }
    if (w != info->w || h != info->h) {
        snprintf(err, errlen, "%s: its header says %dx%d, its data %dx%d", name, info->w, info->h, w, h);
        stbi_image_free(hwc);
        return -1;
    }
    uint8_t *chw = grow(&db->pixels, &db->pixels_cap, 3 * (size_t)(x1 - x0) * (size_t)(y1 - y0), name);
    rows_to_planes(hwc, w, 3, x0, x1, y0, y1, chw);
    stbi_image_free(hwc);
    *out = (DecodedImage){chw, x1 - x0, y1 - y0, 1, x0, y0, w, h};
    return 0;
}

/* ---- JPEG: libjpeg-turbo ------------------------------------------------------ */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} JpegErrors;

static void jpeg_fail(j_common_ptr cinfo) {
    JpegErrors *e = (JpegErrors *)cinfo->err;
    e->pub.format_message(cinfo, e->message);
    longjmp(e->jump, 1);
}

/* libjpeg reports a file cut short or damaged in its data only as a warning,
 * and fills in grey: those warnings are failures here. Others (extraneous bytes
 * before a marker, an unknown JFIF revision) leave the image intact. */
static void jpeg_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return; /* trace messages */
    int code = cinfo->err->msg_code;
    if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_HUFF_BAD_CODE || code == JWRN_MUST_RESYNC ||
        code == JWRN_ARITH_BAD_CODE || code == JWRN_NOT_SEQUENTIAL || code == JWRN_BOGUS_PROGRESSION)
        jpeg_fail(cinfo);
}

/* A JPEG whose last 4 KiB hold no end-of-image marker may be cut short beyond the
 * rows a region decode reads, so it is read through to the end. */
static int has_end_marker(const uint8_t *buf, size_t len) {
    size_t from = len > 4096 ? len - 4096 : 0;
    for (size_t i = len - 1; i > from; i--)
        if (buf[i] == 0xd9 && buf[i - 1] == 0xff) return 1;
    return 0;
}

static int jpeg_is_cmyk(const struct jpeg_decompress_struct *cinfo) {
    return cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
}

/* CMYK to RGB as PIL's convert("RGB"): (255 - C)(255 - K)/255 per channel. An
 * Adobe file (Photoshop's) stores the inks inverted, so there it is C'K'/255. */
static void cmyk_rows_to_rgb(uint8_t *row, int pixels, int inverted) {
    for (int x = 0; x < pixels; x++) {
        uint8_t *px = row + 4 * (size_t)x;
        int k = inverted ? px[3] : 255 - px[3];
        for (int ch = 0; ch < 3; ch++) {
            int c = inverted ? px[ch] : 255 - px[ch];
            px[ch] = (uint8_t)((c * k + 127) / 255);
        }
    }
}

/* The error handler: a failure jumps back to the caller's setjmp. */
static void jpeg_errors_init(struct jpeg_decompress_struct *cinfo, JpegErrors *errors) {
    cinfo->err = jpeg_std_error(&errors->pub);
    errors->pub.error_exit = jpeg_fail;
    errors->pub.emit_message = jpeg_message;
}

/* Called after the caller's setjmp: the decompressor and the file's header. */
static void jpeg_open(struct jpeg_decompress_struct *cinfo, const uint8_t *buf, size_t len) {
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, buf, (unsigned long)len);
    jpeg_read_header(cinfo, TRUE);
}

/* A Huffman-coded JPEG codes each 8x8 block of a component it scans in at
 * least one bit (its DC difference's code; a progressive file may leave all
 * but one component unscanned): a file with fewer bits than its least sampled
 * component has blocks declares a size it cannot hold, and is refused before
 * gigabytes are decoded. Its headers count as data, so the bound is loose for
 * every valid file. Arithmetic coding can code a block in less than a bit:
 * those are bounded by DATASET_MAX_SIDE alone. */
static int check_jpeg_size(const char *name, const struct jpeg_decompress_struct *cinfo, size_t len, char *err,
                           size_t errlen) {
    if (cinfo->arith_code) return 0;
    double least = -1;
    for (int c = 0; c < cinfo->num_components; c++) {
        double blocks = (double)cinfo->comp_info[c].width_in_blocks * cinfo->comp_info[c].height_in_blocks;
        if (least < 0 || blocks < least) least = blocks;
    }
    if (least <= 8.0 * (double)len) return 0;
    snprintf(err, errlen, "%s: cannot decode this JPEG: its header declares %ux%u, whose least sampled component "
             "has %.0f blocks of 8x8 and needs at least %.0f bytes (a bit a block), more than the file's %zu: it is "
             "corrupt or truncated", name, (unsigned)cinfo->image_width, (unsigned)cinfo->image_height, least,
             ceil(least / 8), len);
    return -1;
}

static int probe_jpeg(const uint8_t *buf, size_t len, const char *name, ImageInfo *info, char *err, size_t errlen) {
    struct jpeg_decompress_struct cinfo;
    JpegErrors errors;
    jpeg_errors_init(&cinfo, &errors);
    if (setjmp(errors.jump)) {
        jpeg_destroy_decompress(&cinfo);
        snprintf(err, errlen, "%s: cannot decode this JPEG: its header is truncated or corrupt (libjpeg: %s)", name,
                 errors.message);
        return -1;
    }
    jpeg_open(&cinfo, buf, len);
    int rc = check_image_shape(name, cinfo.image_width, cinfo.image_height, cinfo.num_components, err, errlen);
    if (rc == 0) rc = check_jpeg_size(name, &cinfo, len, err, errlen);
    info->w = (int)cinfo.image_width;
    info->h = (int)cinfo.image_height;
    info->channels = cinfo.num_components;
    info->gpu_decodable = !cinfo.progressive_mode && !cinfo.arith_code && cinfo.data_precision == 8 &&
                          !jpeg_is_cmyk(&cinfo) && (cinfo.num_components == 1 || cinfo.num_components == 3);
    jpeg_destroy_decompress(&cinfo);
    return rc;
}

#define REGION_MARGIN 16

/* The rows and columns [x0, x1) x [y0, y1) of the 1/scale image. */
static int decode_jpeg(const uint8_t *buf, size_t len, const char *name, int scale, int x0, int y0, int x1, int y1,
                       DecodeBuffers *db, DecodedImage *out, char *err, size_t errlen) {
    struct jpeg_decompress_struct cinfo;
    JpegErrors errors;
    jpeg_errors_init(&cinfo, &errors);
    if (setjmp(errors.jump)) {
        jpeg_destroy_decompress(&cinfo);
        snprintf(err, errlen, "%s: cannot decode this JPEG: its data is truncated or corrupt (libjpeg: %s)", name,
                 errors.message);
        return -1;
    }
    jpeg_open(&cinfo, buf, len);
    int cmyk = jpeg_is_cmyk(&cinfo), channels = cmyk ? 4 : 3;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned)scale;
    jpeg_start_decompress(&cinfo);
    int full_w = (int)cinfo.output_width, full_h = (int)cinfo.output_height;
    int x_end = x1 < full_w ? x1 : full_w, y_end = y1 < full_h ? y1 : full_h;
    /* Decoded with a margin: the chroma upsampling at a cropped or skipped edge
     * has no neighbours there and differs from the whole image's. */
    int top = y0 > REGION_MARGIN ? y0 - REGION_MARGIN : 0;
    int bottom = y_end + REGION_MARGIN < full_h ? y_end + REGION_MARGIN : full_h;
    int left = x0 > REGION_MARGIN ? x0 - REGION_MARGIN : 0;
    int right = x_end + REGION_MARGIN < full_w ? x_end + REGION_MARGIN : full_w;
    /* The columns, rounded out to the decoder's blocks (it moves crop_x back). */
    JDIMENSION crop_x = (JDIMENSION)left, crop_w = (JDIMENSION)(right - left);
    if (crop_w < cinfo.output_width) jpeg_crop_scanline(&cinfo, &crop_x, &crop_w);
    int row_pixels = (int)cinfo.output_width;
    uint8_t *rows = grow(&db->rows, &db->rows_cap, (size_t)row_pixels * channels * (size_t)(bottom - top), name);
    if (top > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
    while ((int)cinfo.output_scanline < bottom) {
        JSAMPROW row = rows + (size_t)((int)cinfo.output_scanline - top) * row_pixels * channels;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    if ((int)cinfo.output_scanline < full_h && !has_end_marker(buf, len)) {
        /* Skipping to the very end decodes nothing: skip to the last row and read it. */
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)(full_h - 1 - (int)cinfo.output_scanline));
        JSAMPROW row = rows;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    int inverted = cinfo.saw_Adobe_marker;
    jpeg_destroy_decompress(&cinfo);

    if (cmyk) cmyk_rows_to_rgb(rows, row_pixels * (bottom - top), inverted);
    uint8_t *chw = grow(&db->pixels, &db->pixels_cap, 3 * (size_t)(x_end - x0) * (size_t)(y_end - y0), name);
    int shift = x0 - (int)crop_x;
    rows_to_planes(rows, row_pixels, channels, shift, shift + (x_end - x0), y0 - top, y_end - top, chw);
    *out = (DecodedImage){chw, x_end - x0, y_end - y0, scale, x0, y0, full_w, full_h};
    return 0;
}

/* ---- the face ----------------------------------------------------------------- */

int decode_choose_scale(const ImageInfo *info, double box_w, double box_h, int out_w, int out_h) {
    if (info->kind != IMAGE_JPEG) return 1;
    for (int scale = 8; scale > 1; scale /= 2)
        if (box_w / scale >= out_w && box_h / scale >= out_h) return scale;
    return 1;
}

int image_probe(const uint8_t *bytes, size_t len, const char *name, ImageInfo *info, char *err, size_t errlen) {
    memset(info, 0, sizeof *info);
    info->kind = image_kind(bytes, len);
    if (info->kind == IMAGE_UNKNOWN) return not_an_image(name, bytes, len, err, errlen);
    if (info->kind == IMAGE_JPEG) return probe_jpeg(bytes, len, name, info, err, errlen);
    return probe_stb(bytes, len, name, info, err, errlen);
}

int image_decode(const uint8_t *bytes, size_t len, const char *name, const DecodeRegion *region,
                 DecodeBuffers *buf, DecodedImage *out, char *err, size_t errlen) {
    ImageInfo info;
    if (image_probe(bytes, len, name, &info, err, errlen) != 0) return -1;
    return image_decode_probed(bytes, len, name, &info, region, buf, out, err, errlen);
}

int image_decode_probed(const uint8_t *bytes, size_t len, const char *name, const ImageInfo *probed,
                        const DecodeRegion *region, DecodeBuffers *buf, DecodedImage *out, char *err, size_t errlen) {
    ImageInfo info = *probed;
    DecodeRegion whole = {region ? region->scale : 1, 0, 0, 0, 0};
    if (!region || region->x1 <= region->x0 || region->y1 <= region->y0) region = &whole;
    int scale = info.kind == IMAGE_JPEG ? region->scale : 1;
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) TC_FATAL("image_decode: scale %d", scale);
    int full_w = (info.w + scale - 1) / scale, full_h = (info.h + scale - 1) / scale;
    int x0 = region->x0 > 0 ? region->x0 : 0, y0 = region->y0 > 0 ? region->y0 : 0;
    int x1 = region == &whole || region->x1 > full_w ? full_w : region->x1;
    int y1 = region == &whole || region->y1 > full_h ? full_h : region->y1;
    if (x0 >= x1 || y0 >= y1) TC_FATAL("image_decode: empty region of %s", name);
    if (info.kind == IMAGE_JPEG) return decode_jpeg(bytes, len, name, scale, x0, y0, x1, y1, buf, out, err, errlen);
    return decode_stb(bytes, len, name, &info, x0, y0, x1, y1, buf, out, err, errlen);
}

void decode_buffers_free(DecodeBuffers *buf) {
    free(buf->pixels);
    free(buf->rows);
    memset(buf, 0, sizeof *buf);
}

uint8_t *image_file_decode_rgb(const char *path, int *w, int *h, char *err, size_t errlen) {
    uint8_t *bytes = NULL;
    size_t cap = 0, len;
    DecodeBuffers db = {0};
    DecodedImage image;
    uint8_t *chw = NULL;
    if (read_whole_file(path, &bytes, &cap, &len, err, errlen) == 0 &&
        image_decode(bytes, len, path, NULL, &db, &image, err, errlen) == 0) {
        *w = image.w;
        *h = image.h;
        chw = db.pixels; /* the buffer is the image's: 3 x h x w */
        db.pixels = NULL;
    }
    free(bytes);
    decode_buffers_free(&db);
    return chw;
}
