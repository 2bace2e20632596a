/*
 * image_classifier: C hooks around a small convnet (docs/hooks.md).
 *
 * Clients send one image per request, IMAGE u8 [H, W, 3] (HWC, RGB, 1 to
 * 8192 pixels a side), and get its three likeliest classes, best first:
 * CLASSES bytes [3] (labels from labels.txt in the bundle) and SCORES f32
 * [3] (softmax probabilities).
 *
 *   pjserve_init         reads labels.txt (one label a line, ten lines).
 *   pjserve_preprocess   resizes the image to 32x32, bilinear with half-pixel
 *                        centers (output pixel i samples the input at
 *                        (i + 0.5) * in / 32 - 0.5, clamped to the edges),
 *                        scales to [0, 1], normalizes each channel with a
 *                        fixed mean and std, and writes the executable's
 *                        input x f32 [1, 3, 32, 32] (NCHW). The server
 *                        coalesces concurrent requests into its compiled
 *                        batch sizes.
 *   pjserve_postprocess  this request's row of logits [1, 10] -> softmax ->
 *                        the top three (ties: the lower class first).
 *
 * The numbers match python/pjserve_export/pipelines.py (CLS_*), whose numpy
 * reference (pipeline_reference.py) computes the same pipeline.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include <pjserve/model.h>

#define SIZE 32
#define CLASSES 10
#define TOP_K 3
#define MAX_SIDE 8192
#define LABEL_MAX 64

static const double MEAN[3] = {0.485, 0.456, 0.406};
static const double STD[3] = {0.229, 0.224, 0.225};

typedef struct labels {
    char text[CLASSES][LABEL_MAX];
    uint32_t len[CLASSES];
} labels;

/* Reads exactly CLASSES non-empty lines of fewer than LABEL_MAX bytes. */
static int read_labels(pjserve_ctx *ctx, FILE *f, const char *path, labels *l)
{
    char line[LABEL_MAX + 2];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        size_t len = strcspn(line, "\r\n");
        if (line[len] == '\0' && !feof(f)) {
            pjserve_error(ctx, "%s: line %d is longer than %d bytes", path, n + 1,
                          LABEL_MAX - 1);
            return PJSERVE_INTERNAL;
        }
        if (len == 0 || len >= LABEL_MAX || n == CLASSES) {
            pjserve_error(ctx, "%s: expected %d non-empty labels, one a line, of fewer than "
                          "%d bytes", path, CLASSES, LABEL_MAX);
            return PJSERVE_INTERNAL;
        }
        memcpy(l->text[n], line, len);
        l->len[n++] = (uint32_t)len;
    }
    if (n != CLASSES) {
        pjserve_error(ctx, "%s: expected %d labels, found %d", path, CLASSES, n);
        return PJSERVE_INTERNAL;
    }
    return PJSERVE_OK;
}

int pjserve_init(pjserve_ctx *ctx, void **state)
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/labels.txt", pjserve_bundle_dir(ctx));
    if (n < 0 || (size_t)n >= sizeof path) {
        pjserve_error(ctx, "the bundle's path is too long");
        return PJSERVE_INTERNAL;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        pjserve_error(ctx, "cannot open %s: %s", path, strerror(errno));
        return PJSERVE_INTERNAL;
    }
    labels *l = calloc(1, sizeof *l);
    int rc = l == NULL ? PJSERVE_RESOURCE_EXHAUSTED : read_labels(ctx, f, path, l);
    if (l == NULL)
        pjserve_error(ctx, "out of memory for the labels");
    fclose(f);
    if (rc != PJSERVE_OK) {
        free(l);
        return rc;
    }
    *state = l;
    return PJSERVE_OK;
}

void pjserve_fini(void *state) { free(state); }

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

int pjserve_preprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                       pjserve_tensor *out, size_t n_out)
{
    if (n_in != 1 || n_out != 1) {
        pjserve_error(ctx, "expected 1 client input and 1 model input, got %zu and %zu", n_in,
                      n_out);
        return PJSERVE_INTERNAL;
    }
    const pjserve_tensor *image = &in[0];
    int64_t h = image->shape[0], w = image->shape[1];
    if (h < 1 || w < 1 || h > MAX_SIDE || w > MAX_SIDE) {
        pjserve_error(ctx, "IMAGE must be [height, width, 3] with 1 to %d pixels a side, got "
                      "[%lld, %lld, 3]", MAX_SIDE, (long long)h, (long long)w);
        return PJSERVE_INVALID_ARGUMENT;
    }
    size_t nbytes = 3 * SIZE * SIZE * sizeof(float);
    float *x = pjserve_alloc(ctx, nbytes);
    if (x == NULL) {
        pjserve_error(ctx, "out of memory for the resized image");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    resize_normalize(image->data, h, w, x);
    out[0].shape[0] = 1; /* one image per request; the rest is fixed: 3, 32, 32 */
    out[0].data = x;
    out[0].nbytes = nbytes;
    return PJSERVE_OK;
}

int pjserve_postprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                        pjserve_tensor *out, size_t n_out)
{
    const labels *l = pjserve_state(ctx);
    if (n_in != 1 || n_out != 2 || pjserve_numel(&in[0]) != CLASSES) {
        pjserve_error(ctx, "expected logits of %d classes and 2 client outputs", CLASSES);
        return PJSERVE_INTERNAL;
    }
    const float *logits = in[0].data;
    double prob[CLASSES], top = logits[0], sum = 0;
    for (int i = 1; i < CLASSES; i++)
        top = logits[i] > top ? logits[i] : top;
    for (int i = 0; i < CLASSES; i++)
        sum += prob[i] = exp(logits[i] - top);

    int best[TOP_K];
    bool taken[CLASSES] = {false};
    size_t payload = 0;
    for (int k = 0; k < TOP_K; k++) {
        int b = -1;
        for (int i = 0; i < CLASSES; i++)
            if (!taken[i] && (b < 0 || prob[i] > prob[b]))
                b = i;
        taken[b] = true;
        best[k] = b;
        payload += l->len[b];
    }

    pjserve_tensor *classes = &out[0], *scores = &out[1];
    pjserve_bytes_writer wr;
    int rc = pjserve_bytes_reserve(ctx, &wr, classes, payload, TOP_K);
    if (rc != PJSERVE_OK)
        return rc;
    float *s = pjserve_alloc(ctx, TOP_K * sizeof(float));
    if (s == NULL) {
        pjserve_error(ctx, "out of memory for SCORES");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    for (int k = 0; k < TOP_K; k++) {
        pjserve_bytes_put(&wr, l->text[best[k]], l->len[best[k]]);
        s[k] = (float)(prob[best[k]] / sum);
    }
    classes->shape[0] = TOP_K;
    scores->shape[0] = TOP_K;
    scores->data = s;
    scores->nbytes = TOP_K * sizeof(float);
    return PJSERVE_OK;
}
