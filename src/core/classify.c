/*
 * classify.c - an output's top-k classes as "score:index[:label]" strings
 * (see classify.h for what clients get).
 *
 * Each row is ranked with a bounded heap of its k best entries (the worst
 * kept one on top), so a row of n elements costs n log k comparisons and k
 * entries of memory whatever n is; the heap is then emptied worst first
 * into the row's slots from the back. Values are compared in their own type
 * (64-bit integers exactly, floating point as double with NaN below every
 * number), never through a lossy common one. The strings go into a buffer
 * that grows as they are written.
 */
#include "core/classify.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"

/* Longest score text: a double's "%f" is at most 309 digits, a sign, a
 * point and six decimals. */
#define SCORE_TEXT_MAX 330

bool pjs_classify_supported(pjs_dtype t)
{
    return t != PJS_DTYPE_BOOL && t != PJS_DTYPE_BYTES && pjs_dtype_size(t) > 0;
}

int pjs_classify_check(const pjs_tensor_spec *spec, const char *model, pjs_error *err)
{
    if (pjs_classify_supported(spec->dtype))
        return 0;
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "model %s: output \"%s\" is %s: classification (class_count) ranks "
                         "numbers, ask for a numeric output or for this one without "
                         "classification",
                         model, spec->name, pjs_dtype_kserve_name(spec->dtype));
}

/* ---- values ---------------------------------------------------------------- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu,
             mantissa = h & 0x3ffu, bits;
    if (exponent == 0) {
        float magnitude = (float)mantissa * 0x1p-24f; /* zero and subnormals, exactly */
        return sign ? -magnitude : magnitude;
    }
    bits = sign | (exponent == 0x1fu ? 0x7f800000u : (exponent + 112u) << 23) | mantissa << 13;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float bfloat_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* One element, in the widest type of its kind. */
typedef struct score {
    enum { SIGNED, UNSIGNED, REAL } kind;
    int64_t i;
    uint64_t u;
    double f;
} score;

static score read_score(const void *data, pjs_dtype t, size_t at)
{
    const unsigned char *p = (const unsigned char *)data + at * pjs_dtype_size(t);
    score s = {.kind = SIGNED};
#define LOAD(type, field, k)                                                                   \
    do {                                                                                       \
        type v;                                                                                \
        memcpy(&v, p, sizeof v);                                                               \
        s.kind = k;                                                                            \
        s.field = v;                                                                           \
    } while (0)
    switch (t) {
    case PJS_DTYPE_U8: LOAD(uint8_t, u, UNSIGNED); break;
    case PJS_DTYPE_U16: LOAD(uint16_t, u, UNSIGNED); break;
    case PJS_DTYPE_U32: LOAD(uint32_t, u, UNSIGNED); break;
    case PJS_DTYPE_U64: LOAD(uint64_t, u, UNSIGNED); break;
    case PJS_DTYPE_I8: LOAD(int8_t, i, SIGNED); break;
    case PJS_DTYPE_I16: LOAD(int16_t, i, SIGNED); break;
    case PJS_DTYPE_I32: LOAD(int32_t, i, SIGNED); break;
    case PJS_DTYPE_I64: LOAD(int64_t, i, SIGNED); break;
    case PJS_DTYPE_F32: LOAD(float, f, REAL); break;
    case PJS_DTYPE_F64: LOAD(double, f, REAL); break;
    case PJS_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, p, sizeof h);
        s = (score){.kind = REAL, .f = half_to_float(h)};
        break;
    }
    case PJS_DTYPE_BF16: {
        uint16_t b;
        memcpy(&b, p, sizeof b);
        s = (score){.kind = REAL, .f = bfloat_to_float(b)};
        break;
    }
    default: break; /* refused by pjs_classify before any read */
    }
#undef LOAD
    return s;
}

/* Whether a ranks before b: the larger value, NaN after every number, the
 * lower index between equals (and between NaNs). */
static bool ranks_before(score a, size_t ia, score b, size_t ib)
{
    if (a.kind == REAL) {
        bool a_nan = isnan(a.f), b_nan = isnan(b.f);
        if (a_nan != b_nan)
            return b_nan;
        if (!a_nan && a.f != b.f)
            return a.f > b.f;
    } else if (a.kind == SIGNED ? a.i != b.i : a.u != b.u) {
        return a.kind == SIGNED ? a.i > b.i : a.u > b.u;
    }
    return ia < ib;
}

static int format_score(char *buf, score s)
{
    switch (s.kind) {
    case SIGNED: return snprintf(buf, SCORE_TEXT_MAX, "%" PRId64, s.i);
    case UNSIGNED: return snprintf(buf, SCORE_TEXT_MAX, "%" PRIu64, s.u);
    default: return snprintf(buf, SCORE_TEXT_MAX, "%f", s.f);
    }
}

/* ---- one row: the k best, best first ---------------------------------------- */

typedef struct row {
    const void *data; /* the whole tensor */
    pjs_dtype dtype;
    size_t first;     /* element where the row starts */
} row;

static bool heap_before(const row *r, size_t a, size_t b)
{
    return ranks_before(read_score(r->data, r->dtype, r->first + a), a,
                        read_score(r->data, r->dtype, r->first + b), b);
}

/* heap[0..n) with the worst kept entry at the top: a parent never ranks
 * before its children. Moves heap[at] down to its place. */
static void sift_down(const row *r, size_t *heap, size_t n, size_t at)
{
    for (;;) {
        size_t worst = at, left = 2 * at + 1, right = left + 1;
        if (left < n && heap_before(r, heap[worst], heap[left]))
            worst = left;
        if (right < n && heap_before(r, heap[worst], heap[right]))
            worst = right;
        if (worst == at)
            return;
        size_t t = heap[at];
        heap[at] = heap[worst];
        heap[worst] = t;
        at = worst;
    }
}

static void sift_up(const row *r, size_t *heap, size_t at)
{
    while (at > 0) {
        size_t parent = (at - 1) / 2;
        if (!heap_before(r, heap[parent], heap[at]))
            return;
        size_t t = heap[at];
        heap[at] = heap[parent];
        heap[parent] = t;
        at = parent;
    }
}

/* best[0..k) := the indices (within the row) of the row's k best of n,
 * best first. */
static void top_k(const row *r, size_t n, size_t k, size_t *best)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (kept < k) {
            best[kept] = i;
            sift_up(r, best, kept++);
        } else if (heap_before(r, i, best[0])) {
            best[0] = i;
            sift_down(r, best, kept, 0);
        }
    }
    for (size_t end = kept; end > 1; end--) { /* the worst goes last */
        size_t t = best[0];
        best[0] = best[end - 1];
        best[end - 1] = t;
        sift_down(r, best, end - 1, 0);
    }
}

/* ---- the strings ---------------------------------------------------------- */

typedef struct growing {
    unsigned char *data;
    size_t len, cap;
} growing;

static bool reserve(growing *g, size_t more)
{
    if (more <= g->cap - g->len)
        return true;
    if (more > SIZE_MAX / 2 - g->len)
        return false;
    size_t cap = g->cap ? g->cap : 256;
    while (cap - g->len < more)
        cap *= 2;
    unsigned char *p = realloc(g->data, cap);
    if (p == NULL)
        return false;
    g->data = p;
    g->cap = cap;
    return true;
}

/* Appends one element "score:index[:label]" in the serialized form. */
static bool put_class(growing *g, score s, size_t index, const pjs_labels *labels)
{
    char text[SCORE_TEXT_MAX + 32];
    int n = format_score(text, s);
    n += snprintf(text + n, sizeof text - (size_t)n, ":%zu", index);
    const char *label = labels != NULL && index < labels->count ? labels->names[index] : "";
    size_t label_len = strlen(label), len = (size_t)n + (label_len ? 1 + label_len : 0);
    if (len > PJS_BYTES_MAX_ELEMENT || !reserve(g, PJS_BYTES_PREFIX + len))
        return false;
    unsigned char *at = g->data + g->len;
    for (unsigned b = 0; b < PJS_BYTES_PREFIX; b++) /* the length, little-endian */
        at[b] = (unsigned char)(len >> (8 * b));
    memcpy(at + PJS_BYTES_PREFIX, text, (size_t)n);
    if (label_len) {
        at[PJS_BYTES_PREFIX + n] = ':';
        memcpy(at + PJS_BYTES_PREFIX + n + 1, label, label_len);
    }
    g->len += PJS_BYTES_PREFIX + len;
    return true;
}

int pjs_classify(const void *data, pjs_dtype dtype, const pjs_shape *shape, bool batched,
                 uint64_t k, const pjs_labels *labels, void **out, size_t *out_nbytes,
                 pjs_shape *out_shape, pjs_error *err)
{
    *out = NULL;
    *out_nbytes = 0;
    if (!pjs_classify_supported(dtype))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s outputs cannot be classified",
                             pjs_dtype_kserve_name(dtype));
    if (k == 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "the class count must be at least 1");
    int64_t total = 0;
    if (!pjs_shape_numel(shape, &total))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "the output's shape overflows");
    bool has_rows = batched && shape->rank > 0;
    size_t rows = has_rows ? (size_t)shape->dims[0] : 1;
    size_t per_row = rows > 0 ? (size_t)total / rows : 0;
    if (has_rows && rows == 0) { /* no rows: the other extents still give the width */
        pjs_shape rest = *shape;
        rest.dims[0] = 1;
        int64_t n = 0;
        per_row = pjs_shape_numel(&rest, &n) ? (size_t)n : 0;
    }
    size_t keep = k < per_row ? (size_t)k : per_row;
    *out_shape = (pjs_shape){.rank = has_rows ? 2 : 1};
    out_shape->dims[0] = has_rows ? (int64_t)rows : (int64_t)keep;
    out_shape->dims[has_rows ? 1 : 0] = (int64_t)keep;

    size_t *best = malloc((keep > 0 ? keep : 1) * sizeof *best);
    growing g = {0};
    if (best == NULL || !reserve(&g, 1)) {
        free(best);
        free(g.data);
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory classifying the output");
    }
    for (size_t i = 0; i < rows && keep > 0; i++) {
        row r = {data, dtype, i * per_row};
        top_k(&r, per_row, keep, best);
        for (size_t j = 0; j < keep; j++) {
            if (!put_class(&g, read_score(data, dtype, r.first + best[j]), best[j], labels)) {
                free(best);
                free(g.data);
                return pjs_error_set(err, PJS_ERR_NOMEM,
                                     "out of memory for the classes of row %zu", i);
            }
        }
    }
    free(best);
    *out = g.data;
    *out_nbytes = g.len;
    return 0;
}

int pjs_classify_outputs(pjs_infer_request *r, pjs_error *err)
{
    for (size_t i = 0; i < r->n_outputs; i++) {
        pjs_infer_output *o = &r->outputs[i];
        if (o->requested < 0 || (o->data == NULL && o->nbytes > 0)) /* not produced */
            continue;
        pjs_infer_requested_output *want = &r->requested[o->requested];
        if (want->class_count == 0 || o->spec == &want->class_spec)
            continue;
        int64_t numel = 0;
        if (!pjs_shape_numel(&o->shape, &numel) ||
            (uint64_t)numel * pjs_dtype_size(o->spec->dtype) != o->nbytes)
            return pjs_error_set(err, PJS_ERR_INTERNAL,
                                 "output \"%s\" holds %zu bytes, not what its shape needs",
                                 o->spec->name, o->nbytes);
        void *classes = NULL;
        size_t nbytes = 0;
        pjs_shape shape;
        if (pjs_classify(o->data, o->spec->dtype, &o->shape, o->spec->batched, want->class_count,
                         o->spec->labels, &classes, &nbytes, &shape, err) != 0)
            return pjs_error_prefix(err, "output \"%s\": ", o->spec->name);
        want->class_spec = (pjs_tensor_spec){.name = o->spec->name,
                                             .dtype = PJS_DTYPE_BYTES,
                                             .shape = shape,
                                             .batched = o->spec->batched};
        free(o->data);
        o->data = classes;
        o->nbytes = nbytes;
        o->shape = shape;
        o->spec = &want->class_spec;
    }
    return 0;
}
