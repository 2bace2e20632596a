/*
 * image_bytes_classifier: a preprocess hook that decodes JPEG files in front
 * of a small convnet (docs/hooks.md).
 *
 * Clients send IMAGE bytes [batch, 1]: each row one image file's bytes,
 * exactly as read from disk (a JPEG: baseline or progressive, grayscale,
 * YCbCr or RGB). They get the executable's output, SCORES f32 [batch, 10],
 * the softmax probabilities of the classes named in labels.txt, so
 * classification (class_count) answers "score:index:label".
 *
 *   pjserve_preprocess   for each row: decodes the JPEG with libjpeg-turbo's
 *                        libjpeg API (hooks_libraries: [jpeg] in the
 *                        manifest), to RGB; refuses empty, non-JPEG, corrupt
 *                        or truncated bytes with INVALID_ARGUMENT naming the
 *                        row, and what would cost more than set bounds:
 *                        MAX_SIDE pixels a side, MAX_DECODED bytes held while
 *                        decoding, MAX_SCANS scans; then resizes to 32x32
 *                        (bilinear, half-pixel centers, clamped to the
 *                        edges), scales to [0, 1], normalizes each channel
 *                        with a fixed mean and std and writes row i of x f32
 *                        [batch, 3, 32, 32] (NCHW), as the image_classifier
 *                        example does.
 *
 * The bytes are untrusted: image_decode_row is the decoder
 * fuzz/fuzz_image_decode.c drives. The work one row may cost is bounded by
 * what it may hold and how often it may revisit it: a progressive file
 * keeps every DCT coefficient of the image (2 bytes each, a block of 64 per
 * 8x8 pixels of each component) and each scan passes over them again, so
 * MAX_DECODED counts those coefficients besides the RGB pixels, and MAX_SCANS
 * bounds the passes (a file of 379 scans took 2.2 s of CPU to decode, and
 * its coefficients 180 MiB, before these bounds). The decoder looks at the
 * request between units of work (a row of 8x8 blocks of a scan, a row of
 * output): once nobody waits for the answer any more (pjserve_cancelled:
 * the deadline passed, or the client went) it stops with DEADLINE_EXCEEDED.
 *
 * The numbers match python/pjserve_export/pipelines.py (CLS_*), whose numpy
 * reference (pipeline_reference.py) computes the same resize and
 * normalization.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#include <jpeglib.h>

#include <pjserve/model.h>

#define SIZE 32
#define MAX_SIDE 8192                    /* pixels a side */
/* Bytes held while decoding one image: its RGB pixels, plus its DCT
 * coefficients when the file has several scans (progressive, or one scan
 * per component). */
#define MAX_DECODED ((size_t)64 << 20)
/* Scans of one file. libjpeg's own progression writes 10 for a colour image
 * (6 for grayscale); each scan is another pass over the coefficients. */
#define MAX_SCANS 64
#define MAX_ROWS 8                       /* the executable's largest batch size */

static const double MEAN[3] = {0.485, 0.456, 0.406};
static const double STD[3] = {0.229, 0.224, 0.225};

/* Where output pixel i of SIZE samples an input axis of n pixels: the two
 * neighbours and the weight of the second. */
static void sample_at(int64_t n, int i, int64_t *lo, int64_t *hi, double *frac)
{
    double src = ((double)i + 0.5) * (double)n / SIZE - 0.5;
    if (src < 0)
        src = 0;
    if (src > (double)(n - 1))
        src = (double)(n - 1);
    *lo = (int64_t)src;
    *hi = *lo + 1 < n ? *lo + 1 : *lo;
    *frac = src - (double)*lo;
}

/* RGB u8 [h, w, 3] -> x f32 [3, SIZE, SIZE], normalized. */
static void resize_normalize(const uint8_t *img, int64_t h, int64_t w, float *x)
{
    for (int oy = 0; oy < SIZE; oy++) {
        int64_t y0, y1;
        double fy;
        sample_at(h, oy, &y0, &y1, &fy);
        for (int ox = 0; ox < SIZE; ox++) {
            int64_t x0, x1;
            double fx;
            sample_at(w, ox, &x0, &x1, &fx);
            for (int c = 0; c < 3; c++) {
                double p00 = img[(y0 * w + x0) * 3 + c], p01 = img[(y0 * w + x1) * 3 + c];
                double p10 = img[(y1 * w + x0) * 3 + c], p11 = img[(y1 * w + x1) * 3 + c];
                double v = (1 - fy) * ((1 - fx) * p00 + fx * p01) +
                           fy * ((1 - fx) * p10 + fx * p11);
                x[(c * SIZE + oy) * SIZE + ox] = (float)((v / 255.0 - MEAN[c]) / STD[c]);
            }
        }
    }
}

/* One image's decoding: libjpeg reports errors, warnings and progress
 * through callbacks, which end the decoding with a longjmp to `fail` after
 * filling in status and why. */
typedef struct decoder {
    struct jpeg_decompress_struct jpeg;
    struct jpeg_error_mgr errors;
    struct jpeg_progress_mgr progress;
    jmp_buf fail;
    pjserve_ctx *ctx; /* the request, for pjserve_cancelled; NULL: none */
    bool header_read;
    uint8_t *rgb;     /* the decoded image, [height, width, 3] */
    int status;
    char *why;
    size_t why_size;
} decoder;

static decoder *decoder_of(j_common_ptr jpeg)
{
    return (decoder *)((char *)jpeg - offsetof(decoder, jpeg));
}

/* A libjpeg error, or a warning (a truncated file, a corrupt scan, an
 * inconsistent progression): no half-decoded images. */
static void stop_on_libjpeg_message(j_common_ptr jpeg)
{
    decoder *d = decoder_of(jpeg);
    char message[JMSG_LENGTH_MAX];
    jpeg->err->format_message(jpeg, message);
    d->status = PJSERVE_INVALID_ARGUMENT;
    if (d->header_read)
        snprintf(d->why, d->why_size, "is a corrupt or truncated JPEG file (%s)", message);
    else
        snprintf(d->why, d->why_size, "is not a JPEG file, or its header is cut short (%s)",
                 message);
    longjmp(d->fail, 1);
}

static void on_libjpeg_message(j_common_ptr jpeg, int level)
{
    if (level < 0)
        stop_on_libjpeg_message(jpeg);
}

/* Called before each unit of input (a row of blocks of a scan, a marker)
 * and each call for output rows. */
static void on_progress(j_common_ptr jpeg)
{
    decoder *d = decoder_of(jpeg);
    int scans = d->jpeg.input_scan_number;
    if (scans > MAX_SCANS) {
        d->status = PJSERVE_INVALID_ARGUMENT;
        snprintf(d->why, d->why_size,
                 "has more than %d scans; at most %d are accepted (libjpeg's own progressive "
                 "files have 10)",
                 MAX_SCANS, MAX_SCANS);
        longjmp(d->fail, 1);
    }
    if (d->ctx != NULL && pjserve_cancelled(d->ctx)) {
        d->status = PJSERVE_DEADLINE_EXCEEDED;
        snprintf(d->why, d->why_size,
                 "was being decoded (scan %d) when the request's deadline passed or its client "
                 "went away: decoding stopped",
                 scans);
        longjmp(d->fail, 1);
    }
}

/* Bytes of the DCT coefficients libjpeg keeps for the whole image when the
 * file has several scans (a row of blocks of each component, rounded up to
 * its sampling factors, 64 coefficients of 2 bytes each); 0 otherwise. */
static size_t coefficient_bytes(const struct jpeg_decompress_struct *jpeg)
{
    if (!jpeg_has_multiple_scans((j_decompress_ptr)jpeg))
        return 0;
    size_t total = 0;
    for (int c = 0; c < jpeg->num_components; c++) {
        const jpeg_component_info *comp = &jpeg->comp_info[c];
        size_t w = (comp->width_in_blocks + (size_t)comp->h_samp_factor - 1) /
                   (size_t)comp->h_samp_factor * (size_t)comp->h_samp_factor;
        size_t h = (comp->height_in_blocks + (size_t)comp->v_samp_factor - 1) /
                   (size_t)comp->v_samp_factor * (size_t)comp->v_samp_factor;
        total += w * h * DCTSIZE2 * sizeof(JCOEF);
    }
    return total;
}

/* Refuses an image whose size or decoding memory is over the bounds. */
static int check_bounds(decoder *d)
{
    struct jpeg_decompress_struct *jpeg = &d->jpeg;
    int width = (int)jpeg->image_width, height = (int)jpeg->image_height;
    if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE) {
        snprintf(d->why, d->why_size,
                 "is a %dx%d image; at most %d pixels a side and %zu MiB decoded are accepted",
                 width, height, MAX_SIDE, MAX_DECODED >> 20);
        return PJSERVE_INVALID_ARGUMENT;
    }
    size_t rgb = (size_t)width * (size_t)height * 3, coefficients = coefficient_bytes(jpeg);
    if (rgb + coefficients > MAX_DECODED) {
        char needs[128];
        if (coefficients > 0)
            snprintf(needs, sizeof needs,
                     "%zu MiB: %zu of RGB pixels, %zu of the DCT coefficients a file of several "
                     "scans keeps",
                     (rgb + coefficients) >> 20, rgb >> 20, coefficients >> 20);
        else
            snprintf(needs, sizeof needs, "%zu MiB of RGB pixels", rgb >> 20);
        snprintf(d->why, d->why_size,
                 "is a %dx%d image; at most %d pixels a side and %zu MiB decoded are accepted "
                 "(it needs %s)",
                 width, height, MAX_SIDE, MAX_DECODED >> 20, needs);
        return PJSERVE_INVALID_ARGUMENT;
    }
    return PJSERVE_OK;
}

/* Header, bounds, then every row of pixels into d->rgb. Runs under
 * d->fail's setjmp. */
static int decode(decoder *d, const uint8_t *bytes, size_t len)
{
    struct jpeg_decompress_struct *jpeg = &d->jpeg;
    jpeg_mem_src(jpeg, bytes, (unsigned long)len);
    if (jpeg_read_header(jpeg, TRUE) != JPEG_HEADER_OK) {
        snprintf(d->why, d->why_size, "is not a JPEG file (it holds tables and no image)");
        return PJSERVE_INVALID_ARGUMENT;
    }
    d->header_read = true;
    int rc = check_bounds(d);
    if (rc != PJSERVE_OK)
        return rc;
    size_t width = jpeg->image_width, height = jpeg->image_height;
    d->rgb = malloc(width * height * 3);
    if (d->rgb == NULL) {
        snprintf(d->why, d->why_size, "(%zux%zu) does not fit in memory now; retry later",
                 width, height);
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    /* Exact decoding: the accurate integer DCT and smooth upsampling. */
    jpeg->out_color_space = JCS_EXT_RGB;
    jpeg->dct_method = JDCT_ISLOW;
    jpeg->do_fancy_upsampling = TRUE;
    jpeg_start_decompress(jpeg); /* a file of several scans is read here */
    while (jpeg->output_scanline < jpeg->output_height) {
        JSAMPROW row = d->rgb + (size_t)jpeg->output_scanline * width * 3;
        jpeg_read_scanlines(jpeg, &row, 1);
    }
    jpeg_finish_decompress(jpeg);
    return PJSERVE_OK;
}

/* Decodes one JPEG file (len bytes) and writes its resized, normalized
 * pixels to x [3, SIZE, SIZE]. PJSERVE_OK, or PJSERVE_INVALID_ARGUMENT (the
 * bytes' fault), PJSERVE_DEADLINE_EXCEEDED (ctx cancelled; ctx may be NULL)
 * or PJSERVE_RESOURCE_EXHAUSTED with why (the rest of a sentence for the
 * client) filled in. Reentrant: its own decoder and buffer per call. */
static int image_decode_row(pjserve_ctx *ctx, const uint8_t *bytes, size_t len, float *x,
                            char *why, size_t why_size)
{
    if (len == 0) {
        snprintf(why, why_size, "is empty; send the bytes of a JPEG file");
        return PJSERVE_INVALID_ARGUMENT;
    }
    decoder *d = calloc(1, sizeof *d);
    if (d == NULL) {
        snprintf(why, why_size, "could not be decoded: out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    d->ctx = ctx;
    d->why = why;
    d->why_size = why_size;
    d->jpeg.err = jpeg_std_error(&d->errors);
    d->errors.error_exit = stop_on_libjpeg_message;
    d->errors.emit_message = on_libjpeg_message;
    d->progress.progress_monitor = on_progress;
    int rc;
    if (setjmp(d->fail) == 0) {
        jpeg_create_decompress(&d->jpeg);
        d->jpeg.progress = &d->progress;
        rc = decode(d, bytes, len);
    } else {
        rc = d->status;
    }
    if (rc == PJSERVE_OK)
        resize_normalize(d->rgb, d->jpeg.image_height, d->jpeg.image_width, x);
    jpeg_destroy_decompress(&d->jpeg);
    free(d->rgb);
    free(d);
    return rc;
}

int pjserve_preprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                       pjserve_tensor *out, size_t n_out)
{
    if (n_in != 1 || n_out != 1) {
        pjserve_error(ctx, "expected 1 client input and 1 model input, got %zu and %zu", n_in,
                      n_out);
        return PJSERVE_INTERNAL;
    }
    int64_t rows = in[0].shape[0];
    if (rows < 1 || rows > MAX_ROWS || pjserve_numel(&in[0]) != rows) {
        pjserve_error(ctx, "IMAGE must be [rows, 1] with 1 to %d rows, one JPEG file each",
                      MAX_ROWS);
        return PJSERVE_INVALID_ARGUMENT;
    }
    size_t row_floats = 3 * SIZE * SIZE;
    float *x = pjserve_alloc(ctx, (size_t)rows * row_floats * sizeof(float));
    if (x == NULL) {
        pjserve_error(ctx, "out of memory for %lld resized images", (long long)rows);
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    pjserve_bytes_reader r = pjserve_bytes_begin(&in[0]);
    const char *file;
    uint32_t len;
    for (int64_t row = 0; pjserve_bytes_next(&r, &file, &len); row++) {
        if (pjserve_cancelled(ctx)) {
            pjserve_error(ctx, "the request's deadline passed or its client went away before "
                               "IMAGE row %lld was decoded",
                          (long long)row);
            return PJSERVE_DEADLINE_EXCEEDED;
        }
        char why[256];
        int rc = image_decode_row(ctx, (const uint8_t *)file, len, x + row * row_floats, why,
                                  sizeof why);
        if (rc != PJSERVE_OK) {
            pjserve_error(ctx, "IMAGE row %lld %s", (long long)row, why);
            return rc;
        }
    }
    out[0].shape[0] = rows;
    out[0].data = x;
    out[0].nbytes = (size_t)rows * row_floats * sizeof(float);
    return PJSERVE_OK;
}
