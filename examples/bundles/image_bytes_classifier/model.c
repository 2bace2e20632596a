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
 *   pjserve_preprocess   for each row: decodes the JPEG with libturbojpeg
 *                        (hooks_libraries: [turbojpeg] in the manifest), to
 *                        RGB; refuses empty, non-JPEG, corrupt or truncated
 *                        bytes and images over MAX_SIDE pixels a side or
 *                        MAX_DECODED bytes decoded, with INVALID_ARGUMENT
 *                        naming the row; then resizes to 32x32 (bilinear,
 *                        half-pixel centers, clamped to the edges), scales
 *                        to [0, 1], normalizes each channel with a fixed mean
 *                        and std and writes row i of x f32 [batch, 3, 32, 32]
 *                        (NCHW), as the image_classifier example does.
 *
 * The bytes are untrusted: image_decode_row is the decoder
 * fuzz/fuzz_image_decode.c drives. The numbers match
 * python/pjserve_export/pipelines.py (CLS_*), whose numpy reference
 * (pipeline_reference.py) computes the same resize and normalization.
 */
#include <stdio.h>
#include <stdlib.h>
#include <turbojpeg.h>

#include <pjserve/model.h>

#define SIZE 32
#define MAX_SIDE 8192                    /* pixels a side */
#define MAX_DECODED ((size_t)64 << 20)   /* bytes of the decoded RGB image */
#define MAX_ROWS 8                       /* the executable's largest batch size */
/* Exact decoding (no fast DCT or upsampling) and no half-decoded images: a
 * libjpeg warning (a truncated file, a corrupt scan) is an error, and a
 * progressive file may have at most libturbojpeg's limit of scans. */
#define DECODE_FLAGS (TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS)

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

/* Decodes one JPEG file (len bytes) and writes its resized, normalized
 * pixels to x [3, SIZE, SIZE]. PJSERVE_OK, or PJSERVE_INVALID_ARGUMENT (the
 * bytes' fault) or PJSERVE_RESOURCE_EXHAUSTED with why (the rest of a
 * sentence for the client) filled in. Reentrant: its own decompressor and
 * buffer per call. */
static int image_decode_row(const uint8_t *bytes, size_t len, float *x, char *why,
                            size_t why_size)
{
    if (len == 0) {
        snprintf(why, why_size, "is empty; send the bytes of a JPEG file");
        return PJSERVE_INVALID_ARGUMENT;
    }
    tjhandle tj = tjInitDecompress();
    if (tj == NULL) {
        snprintf(why, why_size, "could not be decoded: %s", tjGetErrorStr2(NULL));
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    int rc = PJSERVE_INVALID_ARGUMENT, width = 0, height = 0, subsamp = 0, colorspace = 0;
    uint8_t *rgb = NULL;
    if (tjDecompressHeader3(tj, bytes, (unsigned long)len, &width, &height, &subsamp,
                            &colorspace) != 0) {
        snprintf(why, why_size, "is not a JPEG file, or its header is cut short (%s)",
                 tjGetErrorStr2(tj));
        goto out;
    }
    if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE ||
        (size_t)width * (size_t)height * 3 > MAX_DECODED) {
        snprintf(why, why_size,
                 "is a %dx%d image; at most %d pixels a side and %zu MiB decoded (RGB) are "
                 "accepted",
                 width, height, MAX_SIDE, MAX_DECODED >> 20);
        goto out;
    }
    rgb = malloc((size_t)width * (size_t)height * 3);
    if (rgb == NULL) {
        snprintf(why, why_size, "(%dx%d) does not fit in memory now; retry later", width,
                 height);
        rc = PJSERVE_RESOURCE_EXHAUSTED;
        goto out;
    }
    if (tjDecompress2(tj, bytes, (unsigned long)len, rgb, width, 0, height, TJPF_RGB,
                      DECODE_FLAGS) != 0) {
        snprintf(why, why_size, "is a corrupt or truncated JPEG file (%s)", tjGetErrorStr2(tj));
        goto out;
    }
    resize_normalize(rgb, height, width, x);
    rc = PJSERVE_OK;
out:
    free(rgb);
    tjDestroy(tj);
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
        char why[256];
        int rc = image_decode_row((const uint8_t *)file, len, x + row * row_floats, why,
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
