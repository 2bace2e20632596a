/*
 * faster_rcnn: the C between a torchvision Faster R-CNN's two exported
 * stages (python/pjserve_export/detection.py, docs/detection.md).
 *
 * IMAGE f32 [3, H, W] -> BOXES f32 [n, 4], SCORES f32 [n], LABELS i64 [n],
 * best first, as torchvision's model(images) answers for one image:
 *
 *   1. stage 1 over the image: the pooled feature maps and every anchor's
 *      objectness logit and box deltas.
 *   2. The region proposals (RegionProposalNetwork.filter_proposals): per
 *      level the PRE_NMS_TOP_N best logits; their anchors' boxes decoded and
 *      clipped to the resized image; boxes narrower or lower than
 *      RPN_MIN_SIZE and probabilities below RPN_SCORE_THRESH dropped; NMS per
 *      level; the POST_NMS_TOP_N best kept. None left: no detections, no
 *      stage 2.
 *   3. RoI Align (MultiScaleRoIAlign) of each proposal on the map its size
 *      picks (LevelMapper), when FRCNN_ROI_ALIGN_IN_GLUE; then stage 2 over
 *      the pooled features, or over the maps and the proposals, padded with
 *      zeros to the smallest proposal count it is compiled for that holds
 *      them (its variants): class logits and per-class box deltas.
 *   4. The detections (RoIHeads.postprocess_detections): softmax, each
 *      proposal's box per class decoded and clipped, background dropped,
 *      scores above BOX_SCORE_THRESH, boxes of at least BOX_MIN_SIZE, NMS per
 *      class, the DETECTIONS best; then scaled from the resized image to the
 *      client's (GeneralizedRCNNTransform.postprocess).
 *
 * Arithmetic is float, in torchvision's order, so boxes agree to rounding.
 * Orders are torchvision's too: top-k and NMS take the higher score first and,
 * between equal scores, the earlier candidate. NMS runs as torchvision's
 * batched_nms does on the CPU: up to 1,000 boxes on boxes shifted apart per
 * class (the coordinate trick, whose rounding decides borderline overlaps),
 * more class by class. RoI Align adds each sample's four neighbours' channels
 * in roi_align_kernel's order, reading the maps channels last so that a
 * neighbour's channels are one contiguous run.
 *
 * Every number of one model and image size is in faster_rcnn_config.h,
 * written by the exporter.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <pjserve/model.h>

#include "faster_rcnn_config.h"

#define TRICK_MAX_BOXES 1000 /* torchvision's batched_nms: boxes.numel() <= 4000 on CPU */

typedef struct candidate {
    float box[4];
    float score;
    int group; /* the RPN level, or the class */
    int order; /* position in torchvision's candidate list: breaks score ties */
} candidate;

/* Larger first, NaN last (a network that overflowed must not break qsort's
 * ordering); 0 when equal. */
static int descending(float a, float b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) - isnan(b);
    return a > b ? -1 : a < b;
}

static int by_score(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    int c = descending(x->score, y->score);
    return c != 0 ? c : x->order - y->order;
}

typedef struct ranked {
    float logit;
    int anchor;
} ranked;

static int by_logit(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    int c = descending(x->logit, y->logit);
    return c != 0 ? c : x->anchor - y->anchor;
}

/* BoxCoder.decode_single for one box and one set of deltas. */
static void decode(const float *ref, const float *d, const float *weights, float clip,
                   float *out)
{
    float width = ref[2] - ref[0], height = ref[3] - ref[1];
    float ctr_x = ref[0] + 0.5f * width, ctr_y = ref[1] + 0.5f * height;
    float dx = d[0] / weights[0], dy = d[1] / weights[1];
    float dw = fminf(d[2] / weights[2], clip);
    float dh = fminf(d[3] / weights[3], clip);
    float pred_ctr_x = dx * width + ctr_x, pred_ctr_y = dy * height + ctr_y;
    float half_w = 0.5f * (expf(dw) * width), half_h = 0.5f * (expf(dh) * height);
    out[0] = pred_ctr_x - half_w;
    out[1] = pred_ctr_y - half_h;
    out[2] = pred_ctr_x + half_w;
    out[3] = pred_ctr_y + half_h;
}

static void clip_to_image(float *box)
{
    for (int k = 0; k < 4; k++) {
        float limit = (float)(k % 2 == 0 ? FRCNN_RESIZED_W : FRCNN_RESIZED_H);
        box[k] = fminf(fmaxf(box[k], 0.0f), limit);
    }
}

static bool big_enough(const float *box, float min_size)
{
    return box[2] - box[0] >= min_size && box[3] - box[1] >= min_size;
}

/* torchvision's nms over boxes[] (already in descending score order):
 * keeps a box unless it overlaps a kept, better one by more than
 * threshold; marks kept[i]. */
static void nms_sorted(float (*boxes)[4], size_t n, double threshold, bool *kept)
{
    for (size_t i = 0; i < n; i++)
        kept[i] = true;
    for (size_t i = 0; i < n; i++) {
        if (!kept[i])
            continue;
        const float *a = boxes[i];
        float area_a = (a[2] - a[0]) * (a[3] - a[1]);
        for (size_t j = i + 1; j < n; j++) {
            if (!kept[j])
                continue;
            const float *b = boxes[j];
            float w = fmaxf(0.0f, fminf(a[2], b[2]) - fmaxf(a[0], b[0]));
            float h = fmaxf(0.0f, fminf(a[3], b[3]) - fmaxf(a[1], b[1]));
            float inter = w * h;
            float overlap = inter / (area_a + (b[2] - b[0]) * (b[3] - b[1]) - inter);
            if (overlap > threshold)
                kept[j] = false;
        }
    }
}

/* Memory for batched_nms over up to n candidates. */
typedef struct nms_work {
    float (*boxes)[4];
    bool *kept, *group_kept;
    size_t *members;
} nms_work;

static bool nms_work_alloc(pjserve_ctx *ctx, size_t n, nms_work *w)
{
    n = n ? n : 1;
    w->boxes = pjserve_alloc(ctx, n * sizeof *w->boxes);
    w->kept = pjserve_alloc(ctx, n * sizeof *w->kept);
    w->group_kept = pjserve_alloc(ctx, n * sizeof *w->group_kept);
    w->members = pjserve_alloc(ctx, n * sizeof *w->members);
    return w->boxes && w->kept && w->group_kept && w->members;
}

/* torchvision's batched_nms: sorts cand[] best first and keeps, in that
 * order, the candidates no better one of the same group suppresses; returns
 * how many (at most limit). */
static size_t batched_nms(candidate *cand, size_t n, double threshold, size_t limit,
                          const nms_work *w)
{
    qsort(cand, n, sizeof cand[0], by_score);
    if (n <= TRICK_MAX_BOXES) {
        /* Every group shifted past the others by (largest coordinate + 1). */
        float largest = -INFINITY;
        for (size_t i = 0; i < n; i++)
            for (int k = 0; k < 4; k++)
                largest = fmaxf(largest, cand[i].box[k]);
        for (size_t i = 0; i < n; i++) {
            float offset = (float)cand[i].group * (largest + 1.0f);
            for (int k = 0; k < 4; k++)
                w->boxes[i][k] = cand[i].box[k] + offset;
        }
        nms_sorted(w->boxes, n, threshold, w->kept);
    } else {
        /* Group by group, each group's boxes in score order. */
        int last = 0;
        for (size_t i = 0; i < n; i++)
            last = cand[i].group > last ? cand[i].group : last;
        for (int g = 0; g <= last; g++) {
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                if (cand[i].group == g) {
                    w->members[m] = i;
                    memcpy(w->boxes[m], cand[i].box, sizeof w->boxes[m]);
                    m++;
                }
            nms_sorted(w->boxes, m, threshold, w->group_kept);
            for (size_t i = 0; i < m; i++)
                w->kept[w->members[i]] = w->group_kept[i];
        }
    }
    size_t out = 0;
    for (size_t i = 0; i < n && out < limit; i++)
        if (w->kept[i])
            cand[out++] = cand[i];
    return out;
}

#if FRCNN_ROI_ALIGN_IN_GLUE
#define FRCNN_BINS (FRCNN_POOLED_H * FRCNN_POOLED_W)

/* LevelMapper: the index of the map a box is pooled from. */
static int pooled_map(const float *box)
{
    float area = (box[2] - box[0]) * (box[3] - box[1]);
    float level = floorf(FRCNN_CANONICAL_LEVEL + log2f(sqrtf(area) / FRCNN_CANONICAL_SCALE) +
                         FRCNN_LEVEL_EPS);
    level = fminf(fmaxf(level, (float)FRCNN_K_MIN), (float)FRCNN_K_MAX);
    return (int)level - FRCNN_K_MIN;
}

/* One sample's neighbours along one axis, clamped as roi_align_kernel's
 * bilinear_interpolate does; at is the sample's coordinate, already known
 * to be on the map (-1 <= at <= size). */
static void neighbours(float at, int size, int *low, int *high, float *frac)
{
    at = at <= 0.0f ? 0.0f : at;
    *low = (int)at;
    if (*low >= size - 1) {
        *low = *high = size - 1;
        at = (float)*low;
    } else {
        *high = *low + 1;
    }
    *frac = at - (float)*low;
}

/* Adds one sample's bilinear interpolation to acc[FRCNN_CHANNELS]: four
 * rows of a channels-last map with their weights. */
static void add_sample(float *restrict acc, const float *restrict a, const float *restrict b,
                       const float *restrict c, const float *restrict d, float wa, float wb,
                       float wc, float wd)
{
    for (int k = 0; k < FRCNN_CHANNELS; k++)
        acc[k] += wa * a[k] + wb * b[k] + wc * c[k] + wd * d[k];
}

/* torchvision's roi_align (aligned=False) of one box on one map
 * [rows, cols, FRCNN_CHANNELS] into out[FRCNN_POOLED_H][FRCNN_POOLED_W]
 * [FRCNN_CHANNELS]. */
static void roi_align(const float *map, int rows, int cols, float scale, const float *box,
                      float *out)
{
    float start_w = box[0] * scale, start_h = box[1] * scale;
    float roi_w = fmaxf(box[2] * scale - start_w, 1.0f);
    float roi_h = fmaxf(box[3] * scale - start_h, 1.0f);
    float bin_h = roi_h / (float)FRCNN_POOLED_H, bin_w = roi_w / (float)FRCNN_POOLED_W;
    int grid_h = FRCNN_SAMPLING_RATIO > 0 ? FRCNN_SAMPLING_RATIO : (int)ceilf(bin_h);
    int grid_w = FRCNN_SAMPLING_RATIO > 0 ? FRCNN_SAMPLING_RATIO : (int)ceilf(bin_w);
    float count = (float)(grid_h * grid_w > 1 ? grid_h * grid_w : 1);
    for (int ph = 0; ph < FRCNN_POOLED_H; ph++)
        for (int pw = 0; pw < FRCNN_POOLED_W; pw++) {
            float *acc = &out[(size_t)(ph * FRCNN_POOLED_W + pw) * FRCNN_CHANNELS];
            memset(acc, 0, FRCNN_CHANNELS * sizeof *acc);
            for (int iy = 0; iy < grid_h; iy++) {
                float y = start_h + (float)ph * bin_h + ((float)iy + 0.5f) * bin_h / (float)grid_h;
                if (y < -1.0f || y > (float)rows)
                    continue;
                int y0, y1;
                float ly;
                neighbours(y, rows, &y0, &y1, &ly);
                for (int ix = 0; ix < grid_w; ix++) {
                    float x = start_w + (float)pw * bin_w +
                              ((float)ix + 0.5f) * bin_w / (float)grid_w;
                    if (x < -1.0f || x > (float)cols)
                        continue;
                    int x0, x1;
                    float lx;
                    neighbours(x, cols, &x0, &x1, &lx);
                    float hy = 1.0f - ly, hx = 1.0f - lx;
                    const float *row0 = &map[(size_t)y0 * cols * FRCNN_CHANNELS];
                    const float *row1 = &map[(size_t)y1 * cols * FRCNN_CHANNELS];
                    add_sample(acc, &row0[x0 * FRCNN_CHANNELS], &row0[x1 * FRCNN_CHANNELS],
                               &row1[x0 * FRCNN_CHANNELS], &row1[x1 * FRCNN_CHANNELS],
                               hy * hx, hy * lx, ly * hx, ly * lx);
                }
            }
            for (int k = 0; k < FRCNN_CHANNELS; k++)
                acc[k] /= count;
        }
}
#endif

static int out_of_memory(pjserve_ctx *ctx)
{
    pjserve_error(ctx, "out of memory");
    return PJSERVE_RESOURCE_EXHAUSTED;
}

/* Step 2: the proposals, best first, into proposals[FRCNN_PROPOSALS][4]
 * (the rest left zero); returns how many, or -1 when out of memory. */
static long region_proposals(pjserve_ctx *ctx, const float *logits, const float *deltas,
                             float (*proposals)[4])
{
    size_t widest = 0, chosen = 0;
    for (int l = 0; l < FRCNN_LEVELS; l++) {
        size_t n = (size_t)frcnn_level_rows[l] * frcnn_level_cols[l] * frcnn_level_anchors[l];
        widest = n > widest ? n : widest;
        chosen += n < FRCNN_PRE_NMS_TOP_N ? n : FRCNN_PRE_NMS_TOP_N;
    }
    ranked *rank = pjserve_alloc(ctx, widest * sizeof *rank);
    candidate *cand = pjserve_alloc(ctx, chosen * sizeof *cand);
    nms_work work;
    if (rank == NULL || cand == NULL || !nms_work_alloc(ctx, chosen, &work))
        return -1;
    size_t n_cand = 0, first = 0, order = 0;
    const float *cell = frcnn_cell_anchors;
    for (int l = 0; l < FRCNN_LEVELS; l++) {
        int cols = frcnn_level_cols[l], per_cell = frcnn_level_anchors[l];
        size_t n = (size_t)frcnn_level_rows[l] * cols * per_cell;
        for (size_t a = 0; a < n; a++)
            rank[a] = (ranked){logits[first + a], (int)a};
        qsort(rank, n, sizeof rank[0], by_logit);
        size_t top = n < FRCNN_PRE_NMS_TOP_N ? n : FRCNN_PRE_NMS_TOP_N;
        for (size_t t = 0; t < top; t++, order++) {
            size_t a = (size_t)rank[t].anchor, at = a / (size_t)per_cell;
            int row = (int)(at / (size_t)cols), col = (int)(at % (size_t)cols);
            const float *c = &cell[4 * (a % (size_t)per_cell)];
            float sx = (float)(col * frcnn_level_stride_x[l]);
            float sy = (float)(row * frcnn_level_stride_y[l]);
            float anchor[4] = {sx + c[0], sy + c[1], sx + c[2], sy + c[3]};
            candidate k = {.score = 1.0f / (1.0f + expf(-rank[t].logit)), .group = l,
                           .order = (int)order};
            decode(anchor, &deltas[4 * (first + a)], frcnn_rpn_weights, FRCNN_RPN_XFORM_CLIP,
                   k.box);
            clip_to_image(k.box);
            if (big_enough(k.box, FRCNN_RPN_MIN_SIZE) && k.score >= FRCNN_RPN_SCORE_THRESH)
                cand[n_cand++] = k;
        }
        first += n;
        cell += 4 * per_cell;
    }
    size_t kept = batched_nms(cand, n_cand, FRCNN_RPN_NMS_THRESH, FRCNN_POST_NMS_TOP_N, &work);
    for (size_t i = 0; i < kept; i++)
        memcpy(proposals[i], cand[i].box, sizeof proposals[i]);
    return (long)kept;
}

/* Step 4: the detections of n_proposals proposals into cand (best first);
 * returns how many, or -1 when out of memory. */
static long detections(pjserve_ctx *ctx, const float (*proposals)[4], long n_proposals,
                       const float *logits, const float *regression, candidate **out)
{
    size_t most = (size_t)n_proposals * (FRCNN_CLASSES - 1);
    candidate *cand = pjserve_alloc(ctx, (most ? most : 1) * sizeof *cand);
    float *prob = pjserve_alloc(ctx, FRCNN_CLASSES * sizeof *prob);
    if (cand == NULL || prob == NULL)
        return -1;
    size_t n_cand = 0;
    for (long p = 0; p < n_proposals; p++) {
        const float *l = &logits[(size_t)p * FRCNN_CLASSES];
        float top = l[0], sum = 0.0f;
        for (int c = 1; c < FRCNN_CLASSES; c++)
            top = fmaxf(top, l[c]);
        for (int c = 0; c < FRCNN_CLASSES; c++)
            sum += prob[c] = expf(l[c] - top);
        for (int c = 1; c < FRCNN_CLASSES; c++) {
            candidate k = {.score = prob[c] / sum, .group = c,
                           .order = (int)(p * (FRCNN_CLASSES - 1) + c - 1)};
            if (!(k.score > FRCNN_BOX_SCORE_THRESH))
                continue;
            decode(proposals[p], &regression[((size_t)p * FRCNN_CLASSES + c) * 4],
                   frcnn_box_weights, FRCNN_BOX_XFORM_CLIP, k.box);
            clip_to_image(k.box);
            if (big_enough(k.box, FRCNN_BOX_MIN_SIZE))
                cand[n_cand++] = k;
        }
    }
    nms_work work;
    if (!nms_work_alloc(ctx, n_cand, &work))
        return -1;
    *out = cand;
    return (long)batched_nms(cand, n_cand, FRCNN_BOX_NMS_THRESH, FRCNN_DETECTIONS, &work);
}

static int answer(pjserve_ctx *ctx, const candidate *found, long n, pjserve_tensor *out)
{
    float *boxes = pjserve_alloc(ctx, (size_t)(n ? n : 1) * 4 * sizeof(float));
    float *scores = pjserve_alloc(ctx, (size_t)(n ? n : 1) * sizeof(float));
    int64_t *labels = pjserve_alloc(ctx, (size_t)(n ? n : 1) * sizeof(int64_t));
    if (boxes == NULL || scores == NULL || labels == NULL)
        return out_of_memory(ctx);
    /* GeneralizedRCNNTransform.postprocess: resized image -> the client's. */
    float ratio_w = (float)FRCNN_IMAGE_W / (float)FRCNN_RESIZED_W;
    float ratio_h = (float)FRCNN_IMAGE_H / (float)FRCNN_RESIZED_H;
    for (long i = 0; i < n; i++) {
        boxes[4 * i + 0] = found[i].box[0] * ratio_w;
        boxes[4 * i + 1] = found[i].box[1] * ratio_h;
        boxes[4 * i + 2] = found[i].box[2] * ratio_w;
        boxes[4 * i + 3] = found[i].box[3] * ratio_h;
        scores[i] = found[i].score;
        labels[i] = found[i].group;
    }
    out[0].shape[0] = n;
    out[0].data = boxes;
    out[0].nbytes = (size_t)n * 4 * sizeof(float);
    out[1].shape[0] = n;
    out[1].data = scores;
    out[1].nbytes = (size_t)n * sizeof(float);
    out[2].shape[0] = n;
    out[2].data = labels;
    out[2].nbytes = (size_t)n * sizeof(int64_t);
    return PJSERVE_OK;
}

int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    const float *pixels = in[0].data;
    for (size_t i = 0; i < in[0].nbytes / sizeof(float); i++)
        if (!isfinite(pixels[i])) {
            pjserve_error(ctx, "IMAGE[%zu] is %f: send finite values (0 to 1, as torchvision "
                               "takes them)", i, (double)pixels[i]);
            return PJSERVE_INVALID_ARGUMENT;
        }
    pjserve_tensor image = {.name = "image", .dtype = PJSERVE_FP32, .rank = 4,
                            .shape = {1, 3, FRCNN_IMAGE_H, FRCNN_IMAGE_W}, .data = in[0].data,
                            .nbytes = in[0].nbytes};
    const pjserve_tensor *s1;
    size_t n_s1;
    int rc = pjserve_call(ctx, FRCNN_STAGE1, &image, 1, &s1, &n_s1);
    if (rc != PJSERVE_OK)
        return rc;

    /* The proposals, and the pooled features stage 2 reads */
    size_t sizes[2] = {(size_t)FRCNN_PROPOSALS * 4 * sizeof(float)};
#if FRCNN_ROI_ALIGN_IN_GLUE
    sizes[1] = (size_t)FRCNN_PROPOSALS * FRCNN_BINS * FRCNN_CHANNELS * sizeof(float);
#endif
    void *scratch[2];
    rc = pjserve_scratch(ctx, sizes, FRCNN_ROI_ALIGN_IN_GLUE ? 2 : 1, scratch);
    if (rc != PJSERVE_OK)
        return rc;
    float(*proposals)[4] = scratch[0];
    memset(proposals, 0, sizes[0]);
    long n_proposals = region_proposals(ctx, s1[FRCNN_POOLED_MAPS].data,
                                        s1[FRCNN_POOLED_MAPS + 1].data, proposals);
    if (n_proposals < 0)
        return out_of_memory(ctx);
    if (n_proposals == 0)
        return answer(ctx, NULL, 0, out);

    int padded = FRCNN_PROPOSALS;
    for (int i = FRCNN_PROPOSAL_SIZES - 1; i >= 0 && frcnn_proposal_sizes[i] >= n_proposals; i--)
        padded = frcnn_proposal_sizes[i];
#if FRCNN_ROI_ALIGN_IN_GLUE
    float *rois = scratch[1];
    size_t per_roi = (size_t)FRCNN_BINS * FRCNN_CHANNELS;
    for (long p = 0; p < n_proposals; p++) {
        int m = pooled_map(proposals[p]);
        roi_align(s1[m].data, frcnn_map_rows[m], frcnn_map_cols[m], frcnn_map_scale[m],
                  proposals[p], &rois[(size_t)p * per_roi]);
    }
    memset(&rois[(size_t)n_proposals * per_roi], 0,
           (size_t)(padded - n_proposals) * per_roi * sizeof *rois);
    pjserve_tensor s2_in[1] = {{
        .name = "rois", .dtype = PJSERVE_FP32, .rank = 5,
        .shape = {1, padded, FRCNN_POOLED_H, FRCNN_POOLED_W, FRCNN_CHANNELS}, .data = rois,
        .nbytes = (size_t)padded * per_roi * sizeof *rois}};
#else
    pjserve_tensor s2_in[FRCNN_POOLED_MAPS + 1];
    for (int i = 0; i < FRCNN_POOLED_MAPS; i++)
        s2_in[i] = s1[i];
    s2_in[FRCNN_POOLED_MAPS] = (pjserve_tensor){
        .name = "proposals", .dtype = PJSERVE_FP32, .rank = 3,
        .shape = {1, padded, 4}, .data = proposals,
        .nbytes = (size_t)padded * 4 * sizeof(float)};
#endif
    const pjserve_tensor *s2;
    size_t n_s2;
    rc = pjserve_call(ctx, FRCNN_STAGE2, s2_in, sizeof s2_in / sizeof s2_in[0], &s2, &n_s2);
    if (rc != PJSERVE_OK)
        return rc;
    candidate *found = NULL;
    long n = detections(ctx, (const float(*)[4])proposals, n_proposals, s2[0].data, s2[1].data,
                        &found);
    if (n < 0)
        return out_of_memory(ctx);
    return answer(ctx, found, n, out);
}
