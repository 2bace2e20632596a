/*
 * detector: a two-stage object detector as a meta model (docs/meta-models.md).
 *
 * Clients send IMAGE f32 [3, 64, 64] (CHW) and SCORE_THRESHOLD f32 [1]; they
 * get one row per detected box, best proposal first: BOXES f32 [n, 4]
 * (x1, y1, x2, y2 in pixels), SCORES f32 [n] and LABELS i32 [n], where n
 * depends on the image (0 to 64).
 *
 * pjserve_run:
 *   1. detector_stage1 over the image: a 16x16 feature map (16 channels), and
 *      for each of its 512 anchors an objectness score and a box.
 *   2. Keeps the anchors scoring above SCORE_THRESHOLD, best first (ties:
 *      the lower anchor first), and drops each box that overlaps a kept one
 *      by an IoU above 0.5 (greedy NMS), up to 64 boxes. None left: empty
 *      outputs, no second stage.
 *   3. Pools each kept box's features into a [16, 4, 4] grid (one bilinear
 *      sample at the center of each cell of the box, in feature-map
 *      coordinates: pixel p is at p / 4 - 0.5) into one scratch buffer.
 *   4. detector_stage2 over the pooled boxes in chunks of 32: each chunk's
 *      call starts as soon as it is pooled, so pooling the next chunk
 *      overlaps the previous chunk's execution. A chunk larger than stage 2's
 *      largest compiled batch size runs as several executions.
 *   5. For each box: LABELS the likeliest of 4 classes, SCORES its
 *      probability times the box's objectness, BOXES the box moved by the
 *      head's deltas (0.1 of its width or height per unit), clipped to the
 *      image.
 *
 * The numbers match python/pjserve_export/pipelines.py (DET_*), whose numpy
 * reference (pipeline_reference.py) computes the same pipeline.
 */
#include <math.h>
#include <stdlib.h>

#include <pjserve/model.h>

#define SIZE 64
#define STRIDE 4
#define FEAT 16 /* SIZE / STRIDE */
#define CHANNELS 16
#define ANCHORS 512
#define POOL 4
#define CLASSES 4
#define NMS_IOU 0.5
#define MAX_BOXES 64
#define CHUNK 32
#define REFINE 0.1

#define STAGE1 "detector_stage1"
#define STAGE2 "detector_stage2"
#define ROI_FLOATS (CHANNELS * POOL * POOL)

typedef struct candidate {
    float score;
    int anchor;
} candidate;

static int by_score(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->anchor - y->anchor;
}

static double iou(const float *a, const float *b)
{
    double iw = fmin(a[2], b[2]) - fmax(a[0], b[0]), ih = fmin(a[3], b[3]) - fmax(a[1], b[1]);
    if (iw <= 0 || ih <= 0)
        return 0;
    double inter = iw * ih;
    double uni = (double)(a[2] - a[0]) * (a[3] - a[1]) + (double)(b[2] - b[0]) * (b[3] - b[1]) -
                 inter;
    return uni > 0 ? inter / uni : 0;
}

/* Anchors above the threshold, then greedy NMS; returns how many were kept
 * (their anchor numbers in keep, best first). */
static int select_boxes(const float *scores, const float *boxes, float threshold,
                        int keep[MAX_BOXES])
{
    candidate cand[ANCHORS];
    int n_cand = 0, n_keep = 0;
    for (int a = 0; a < ANCHORS; a++)
        if (scores[a] > threshold)
            cand[n_cand++] = (candidate){scores[a], a};
    qsort(cand, (size_t)n_cand, sizeof cand[0], by_score);
    for (int i = 0; i < n_cand && n_keep < MAX_BOXES; i++) {
        const float *box = &boxes[4 * cand[i].anchor];
        bool suppressed = false;
        for (int k = 0; k < n_keep && !suppressed; k++)
            suppressed = iou(box, &boxes[4 * keep[k]]) > NMS_IOU;
        if (!suppressed)
            keep[n_keep++] = cand[i].anchor;
    }
    return n_keep;
}

/* features[c] at (y, x) in feature-map coordinates, clamped to the map. */
static double bilinear(const float *plane, double y, double x)
{
    y = fmin(fmax(y, 0), FEAT - 1);
    x = fmin(fmax(x, 0), FEAT - 1);
    int y0 = (int)y, x0 = (int)x;
    int y1 = y0 + 1 < FEAT ? y0 + 1 : y0, x1 = x0 + 1 < FEAT ? x0 + 1 : x0;
    double fy = y - y0, fx = x - x0;
    return (1 - fy) * ((1 - fx) * plane[y0 * FEAT + x0] + fx * plane[y0 * FEAT + x1]) +
           fy * ((1 - fx) * plane[y1 * FEAT + x0] + fx * plane[y1 * FEAT + x1]);
}

static void pool_box(const float *features, const float *box, float *roi)
{
    double x1 = box[0] / STRIDE - 0.5, y1 = box[1] / STRIDE - 0.5;
    double bw = (box[2] - box[0]) / STRIDE, bh = (box[3] - box[1]) / STRIDE;
    for (int py = 0; py < POOL; py++) {
        double y = y1 + (py + 0.5) * bh / POOL;
        for (int px = 0; px < POOL; px++) {
            double x = x1 + (px + 0.5) * bw / POOL;
            for (int c = 0; c < CHANNELS; c++)
                roi[(c * POOL + py) * POOL + px] =
                    (float)bilinear(&features[c * FEAT * FEAT], y, x);
        }
    }
}

static float clip(double v) { return (float)fmin(fmax(v, 0), SIZE); }

/* Label, score and refined box of `count` boxes from stage 2's outputs. */
static void finish_boxes(const pjserve_tensor *s2, int count, const int *anchors,
                         const float *scores, const float *boxes, float *out_boxes,
                         float *out_scores, int32_t *out_labels)
{
    const float *logits = s2[0].data, *deltas = s2[1].data;
    for (int i = 0; i < count; i++) {
        const float *l = &logits[CLASSES * i], *d = &deltas[4 * i];
        const float *b = &boxes[4 * anchors[i]];
        int best = 0;
        double sum = 0;
        for (int c = 1; c < CLASSES; c++)
            best = l[c] > l[best] ? c : best;
        for (int c = 0; c < CLASSES; c++)
            sum += exp((double)l[c] - l[best]);
        double w = (double)b[2] - b[0], h = (double)b[3] - b[1];
        out_labels[i] = best;
        out_scores[i] = (float)(scores[anchors[i]] / sum);
        out_boxes[4 * i + 0] = clip(b[0] + REFINE * d[0] * w);
        out_boxes[4 * i + 1] = clip(b[1] + REFINE * d[1] * h);
        out_boxes[4 * i + 2] = clip(b[2] + REFINE * d[2] * w);
        out_boxes[4 * i + 3] = clip(b[3] + REFINE * d[3] * h);
    }
}

static int set_outputs(pjserve_ctx *ctx, pjserve_tensor *out, int n, float **boxes,
                       float **scores, int32_t **labels)
{
    /* At least one byte each, so that an empty output still has a buffer. */
    size_t rows = n > 0 ? (size_t)n : 1;
    *boxes = pjserve_alloc(ctx, rows * 4 * sizeof(float));
    *scores = pjserve_alloc(ctx, rows * sizeof(float));
    *labels = pjserve_alloc(ctx, rows * sizeof(int32_t));
    if (*boxes == NULL || *scores == NULL || *labels == NULL) {
        pjserve_error(ctx, "out of memory for %d boxes", n);
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    out[0].shape[0] = n;
    out[0].shape[1] = 4;
    out[0].data = *boxes;
    out[0].nbytes = (size_t)n * 4 * sizeof(float);
    out[1].shape[0] = n;
    out[1].data = *scores;
    out[1].nbytes = (size_t)n * sizeof(float);
    out[2].shape[0] = n;
    out[2].data = *labels;
    out[2].nbytes = (size_t)n * sizeof(int32_t);
    return PJSERVE_OK;
}

static int check_outputs(pjserve_ctx *ctx, const char *model, size_t n, size_t want)
{
    if (n != want) {
        pjserve_error(ctx, "%s returned %zu outputs, expected %zu", model, n, want);
        return PJSERVE_INTERNAL;
    }
    return PJSERVE_OK;
}

/* Stage 2 over the kept boxes, chunk by chunk; every started call is waited
 * for, also after a failure. */
static int run_head(pjserve_ctx *ctx, const float *features, const float *scores,
                    const float *boxes, const int *keep, int n, pjserve_tensor *out)
{
    float *out_boxes, *out_scores;
    int32_t *out_labels;
    int rc = set_outputs(ctx, out, n, &out_boxes, &out_scores, &out_labels);
    if (rc != PJSERVE_OK || n == 0)
        return rc;
    size_t roi_bytes = (size_t)n * ROI_FLOATS * sizeof(float);
    void *scratch;
    if ((rc = pjserve_scratch(ctx, &roi_bytes, 1, &scratch)) != PJSERVE_OK)
        return rc;
    float *rois = scratch;

    enum { MAX_CHUNKS = (MAX_BOXES + CHUNK - 1) / CHUNK };
    pjserve_tensor chunk_in[MAX_CHUNKS];
    pjserve_subcall *calls[MAX_CHUNKS];
    int started = 0;
    for (int first = 0; first < n && rc == PJSERVE_OK; first += CHUNK, started++) {
        int count = n - first < CHUNK ? n - first : CHUNK;
        for (int i = first; i < first + count; i++)
            pool_box(features, &boxes[4 * keep[i]], &rois[(size_t)i * ROI_FLOATS]);
        chunk_in[started] = (pjserve_tensor){
            .name = "rois", .dtype = PJSERVE_FP32, .rank = 4,
            .shape = {count, CHANNELS, POOL, POOL},
            .data = &rois[(size_t)first * ROI_FLOATS],
            .nbytes = (size_t)count * ROI_FLOATS * sizeof(float)};
        rc = pjserve_call_start(ctx, STAGE2, &chunk_in[started], 1, &calls[started]);
        if (rc != PJSERVE_OK)
            break; /* this one did not start */
    }
    for (int c = 0; c < started; c++) {
        const pjserve_tensor *s2;
        size_t n_s2;
        int w = pjserve_call_wait(ctx, calls[c], &s2, &n_s2);
        if (w == PJSERVE_OK)
            w = check_outputs(ctx, STAGE2, n_s2, 2);
        if (w != PJSERVE_OK) {
            rc = rc == PJSERVE_OK ? w : rc;
            continue;
        }
        int first = c * CHUNK, count = (int)chunk_in[c].shape[0];
        if (rc == PJSERVE_OK)
            finish_boxes(s2, count, &keep[first], scores, boxes, &out_boxes[4 * first],
                         &out_scores[first], &out_labels[first]);
    }
    return rc;
}

int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    if (n_in != 2 || n_out != 3) {
        pjserve_error(ctx, "expected 2 client inputs and 3 outputs, got %zu and %zu", n_in,
                      n_out);
        return PJSERVE_INTERNAL;
    }
    float threshold = *(const float *)in[1].data;
    if (isnan(threshold)) {
        pjserve_error(ctx, "SCORE_THRESHOLD is NaN; give a number (0 to 1 keeps some boxes)");
        return PJSERVE_INVALID_ARGUMENT;
    }
    /* The client's image, by reference, as a batch of one. */
    pjserve_tensor image = {.name = "image", .dtype = PJSERVE_FP32, .rank = 4,
                            .shape = {1, 3, SIZE, SIZE}, .data = in[0].data,
                            .nbytes = in[0].nbytes};
    const pjserve_tensor *s1;
    size_t n_s1;
    int rc = pjserve_call(ctx, STAGE1, &image, 1, &s1, &n_s1);
    if (rc == PJSERVE_OK)
        rc = check_outputs(ctx, STAGE1, n_s1, 3);
    if (rc != PJSERVE_OK)
        return rc;
    const float *features = s1[0].data, *scores = s1[1].data, *boxes = s1[2].data;
    int keep[MAX_BOXES];
    int n = select_boxes(scores, boxes, threshold, keep);
    return run_head(ctx, features, scores, boxes, keep, n, out);
}
