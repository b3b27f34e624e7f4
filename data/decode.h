/* One image file's bytes decoded to RGB: JPEG through libjpeg-turbo (with its
 * DCT-domain scaling and its cropped decode), PNG and BMP through stb_image.
 * What a file is comes from its first bytes, never its name, so a PNG named
 * .jpg decodes as a PNG. Grayscale, palette, 16-bit and CMYK images become 8-bit
 * RGB; an alpha channel is dropped (PIL's convert("RGB")). A file that is
 * empty, of another kind, truncated or corrupt, or larger than DATASET_MAX_SIDE
 * a side, is refused with a message naming it. Reentrant: one DecodeBuffers per
 * thread. */
#ifndef TRAINC_DATA_DECODE_H
#define TRAINC_DATA_DECODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { IMAGE_UNKNOWN, IMAGE_JPEG, IMAGE_PNG, IMAGE_BMP } ImageKind;

typedef struct {
    ImageKind kind;
    int w, h;        /* stored size */
    int channels;    /* in the file: 1 gray, 3 colour, 4 CMYK (JPEG) or RGBA */
    /* JPEG only: what a hardware decoder (nvJPEG's) takes: one 8-bit baseline
     * Huffman scan in YCbCr or grayscale; progressive, arithmetic-coded, 12-bit
     * and CMYK files are decoded on the CPU. */
    int gpu_decodable;
} ImageInfo;

/* The kind of image the bytes start with. */
ImageKind image_kind(const uint8_t *bytes, size_t len);
const char *image_kind_name(ImageKind kind);

/* The header: kind, size and channels. 0, or -1 with a message naming 'name'. */
int image_probe(const uint8_t *bytes, size_t len, const char *name, ImageInfo *info, char *err, size_t errlen);

/* What to decode: the rows and columns [x0, x1) x [y0, y1) of the image at
 * 1/scale of its stored size (libjpeg-turbo's DCT-domain scaling; JPEG only,
 * other kinds decode at 1). JPEG decodes those rows and columns alone (rounded
 * out to its blocks inside the decoder). An empty region: the whole image. */
typedef struct {
    int scale; /* 1, 2, 4 or 8 */
    int x0, y0, x1, y1;
} DecodeRegion;

/* The largest DCT scaling of 1/2, 1/4 or 1/8 that keeps a box of box_w x box_h
 * stored pixels at least out_w x out_h, so that the resample after it never
 * enlarges what the scaling shrank; 1 for other kinds and where none does. */
int decode_choose_scale(const ImageInfo *info, double box_w, double box_h, int out_w, int out_h);

/* Per-thread memory the decoder reuses: the pixels returned, and libjpeg's rows. */
typedef struct {
    uint8_t *pixels;
    size_t pixels_cap;
    uint8_t *rows;
    size_t rows_cap;
} DecodeBuffers;

typedef struct {
    const uint8_t *pixels; /* 3 x h x w planar RGB, in the DecodeBuffers (valid until its next use) */
    int w, h;              /* what was decoded */
    int scale;             /* 1, 2, 4 or 8: decoded at 1/scale of the stored size */
    int x0, y0;            /* where pixels start, in the 1/scale image's coordinates */
    int full_w, full_h;    /* the 1/scale image's size: ceil(stored / scale) */
} DecodedImage;

/* Decodes the region (NULL: the whole image) of the file's bytes. 0, or -1
 * with a message naming 'name'. */
int image_decode(const uint8_t *bytes, size_t len, const char *name, const DecodeRegion *region,
                 DecodeBuffers *buf, DecodedImage *out, char *err, size_t errlen);
void decode_buffers_free(DecodeBuffers *buf);

/* Decodes as image_decode, the header already probed into info (image_probe's). */
int image_decode_probed(const uint8_t *bytes, size_t len, const char *name, const ImageInfo *info,
                        const DecodeRegion *region, DecodeBuffers *buf, DecodedImage *out, char *err, size_t errlen);

/* p (*cap bytes) grown by realloc to at least bytes (TC_FATAL, naming what,
 * without the memory): the one growth of data/'s reusable buffers. */
void *buffer_grow(void *p, size_t *cap, size_t bytes, const char *what);

/* The whole of a file read into *buf (grown as needed); *len its size. 0, or -1
 * with a message naming the path (missing, unreadable, over 2 GiB). */
int read_whole_file(const char *path, uint8_t **buf, size_t *cap, size_t *len, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
