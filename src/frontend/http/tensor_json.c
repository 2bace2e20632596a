/*
 * tensor_json.c - JSON "data" lists to and from packed tensor elements (see
 * tensor_json.h).
 *
 * Decoding walks the (possibly nested) list depth first, writing each scalar
 * at the next element; jansson has already bounded the nesting depth. Elements
 * are host order, which the static assertion below pins to little-endian, the
 * order of the wire format and of PJRT host buffers.
 */
#include "frontend/http/tensor_json.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "tensor bytes are little-endian on the wire and in memory");

/* ---- half and bfloat16 ----------------------------------------------------- */

uint16_t pjs_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exponent = (x >> 23) & 0xffu;
    uint32_t mantissa = x & 0x7fffffu;
    if (exponent == 0xffu) /* infinity, or NaN kept quiet */
        return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
    int32_t half_exponent = (int32_t)exponent - 127 + 15;
    if (half_exponent >= 0x1f)
        return (uint16_t)(sign | 0x7c00u);
    if (half_exponent <= 0) { /* a half subnormal, or zero */
        if (half_exponent < -10)
            return (uint16_t)sign;
        uint32_t full = mantissa | 0x800000u;
        uint32_t shift = (uint32_t)(14 - half_exponent);
        uint32_t half = full >> shift;
        uint32_t rest = full & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rest > halfway || (rest == halfway && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)half_exponent << 10) | (mantissa >> 13);
    uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
        half++; /* a carry into the exponent rounds up to the next binade or infinity */
    return (uint16_t)half;
}

float pjs_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t x;
    if (exponent == 0x1fu) {
        x = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent == 0) {
        float magnitude = (float)mantissa * 0x1p-24f; /* exact */
        return sign ? -magnitude : magnitude;
    } else {
        x = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t pjs_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float pjs_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* ---- decoding ------------------------------------------------------------ */

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a fraction";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int count_scalars(const json_t *v, const char *what, size_t *count, pjs_error *err)
{
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            int rc = count_scalars(json_array_get(v, i), what, count, err);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    if (!json_is_number(v) && !json_is_boolean(v))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"data\" element %zu is %s; expected numbers or booleans", what,
                             *count, json_kind(v));
    (*count)++;
    return 0;
}

int pjs_tensor_json_count(const json_t *data, const char *what, size_t *out_count,
                          pjs_error *err)
{
    *out_count = 0;
    if (!json_is_array(data))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"data\" must be a list, not %s", what, json_kind(data));
    return count_scalars(data, what, out_count, err);
}

/* Where the next decoded element goes. */
typedef struct element_writer {
    pjs_dtype dtype;
    unsigned char *out;
    size_t next;  /* index of the next element */
    size_t count; /* elements out can hold */
    const char *what;
} element_writer;

static int bad_element(const element_writer *w, const json_t *v, pjs_error *err)
{
    char value[64] = "";
    if (json_is_integer(v))
        snprintf(value, sizeof value, " %" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        snprintf(value, sizeof value, " %g", json_real_value(v));
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "%s: \"data\" element %zu is %s%s, which %s cannot hold", w->what,
                         w->next, json_kind(v), value, pjs_dtype_kserve_name(w->dtype));
}

/* Whether the JSON scalar v is a value of dt. */
static bool scalar_fits(pjs_dtype dt, const json_t *v)
{
    long long i = json_integer_value(v); /* 0 for anything but an integer */
    bool integer = json_is_integer(v);
    switch (dt) {
    case PJS_DTYPE_BOOL: return json_is_boolean(v) || (integer && (i == 0 || i == 1));
    case PJS_DTYPE_I8: return integer && i >= INT8_MIN && i <= INT8_MAX;
    case PJS_DTYPE_U8: return integer && i >= 0 && i <= UINT8_MAX;
    case PJS_DTYPE_I16: return integer && i >= INT16_MIN && i <= INT16_MAX;
    case PJS_DTYPE_U16: return integer && i >= 0 && i <= UINT16_MAX;
    case PJS_DTYPE_I32: return integer && i >= INT32_MIN && i <= INT32_MAX;
    case PJS_DTYPE_U32: return integer && i >= 0 && i <= UINT32_MAX;
    case PJS_DTYPE_I64: return integer;
    case PJS_DTYPE_U64: return integer && i >= 0; /* the parser refuses integers > INT64_MAX */
    case PJS_DTYPE_F16:
    case PJS_DTYPE_BF16:
    case PJS_DTYPE_F32:
    case PJS_DTYPE_F64: return json_is_number(v);
    default: return false;
    }
}

/* A double as float; out-of-range magnitudes become infinities, as numpy
 * does (a plain cast would be undefined behaviour). */
static float narrow_to_float(double d)
{
    if (d > FLT_MAX)
        return INFINITY;
    if (d < -FLT_MAX)
        return -INFINITY;
    return (float)d;
}

#define STORE_AS(type, value)                                                                      \
    do {                                                                                           \
        type stored_ = (type)(value);                                                              \
        memcpy(at, &stored_, sizeof stored_);                                                      \
    } while (0)

/* Writes v, which scalar_fits dt, at `at`. */
static void store_scalar(unsigned char *at, pjs_dtype dt, const json_t *v)
{
    long long i = json_is_true(v) ? 1 : json_integer_value(v);
    double d = json_number_value(v);
    switch (dt) {
    case PJS_DTYPE_BOOL: STORE_AS(uint8_t, i != 0); break;
    case PJS_DTYPE_I8: STORE_AS(int8_t, i); break;
    case PJS_DTYPE_U8: STORE_AS(uint8_t, i); break;
    case PJS_DTYPE_I16: STORE_AS(int16_t, i); break;
    case PJS_DTYPE_U16: STORE_AS(uint16_t, i); break;
    case PJS_DTYPE_I32: STORE_AS(int32_t, i); break;
    case PJS_DTYPE_U32: STORE_AS(uint32_t, i); break;
    case PJS_DTYPE_I64: STORE_AS(int64_t, i); break;
    case PJS_DTYPE_U64: STORE_AS(uint64_t, i); break;
    case PJS_DTYPE_F16: STORE_AS(uint16_t, pjs_f32_to_f16(narrow_to_float(d))); break;
    case PJS_DTYPE_BF16: STORE_AS(uint16_t, pjs_f32_to_bf16(narrow_to_float(d))); break;
    case PJS_DTYPE_F32: STORE_AS(float, narrow_to_float(d)); break;
    case PJS_DTYPE_F64: STORE_AS(double, d); break;
    default: break;
    }
}

static int put_scalar(element_writer *w, const json_t *v, pjs_error *err)
{
    if (w->next >= w->count)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "%s: more elements than counted", w->what);
    if (!scalar_fits(w->dtype, v))
        return bad_element(w, v, err);
    store_scalar(w->out + w->next * pjs_dtype_size(w->dtype), w->dtype, v);
    w->next++;
    return 0;
}

static int decode_value(element_writer *w, const json_t *v, pjs_error *err)
{
    if (!json_is_array(v))
        return put_scalar(w, v, err);
    for (size_t i = 0; i < json_array_size(v); i++) {
        int rc = decode_value(w, json_array_get(v, i), err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int pjs_tensor_json_decode(const json_t *data, pjs_dtype dt, const char *what, void *out,
                           size_t count, pjs_error *err)
{
    element_writer w = {.dtype = dt, .out = out, .next = 0, .count = count, .what = what};
    int rc = decode_value(&w, data, err);
    if (rc == 0 && w.next != count)
        rc = pjs_error_set(err, PJS_ERR_INTERNAL, "%s: %zu elements decoded, %zu counted", what,
                           w.next, count);
    return rc;
}

/* ---- encoding ------------------------------------------------------------ */

/* Longest text one element takes ("-1.23456789012345678e-308"). */
#define ELEMENT_TEXT_MAX 32

static int format_float(char *at, double x, int digits)
{
    if (isnan(x))
        return snprintf(at, ELEMENT_TEXT_MAX, "NaN");
    if (isinf(x))
        return snprintf(at, ELEMENT_TEXT_MAX, x < 0 ? "-Infinity" : "Infinity");
    return snprintf(at, ELEMENT_TEXT_MAX, "%.*g", digits, x);
}

static int format_element(char *at, pjs_dtype dt, const unsigned char *p)
{
    switch (dt) {
    case PJS_DTYPE_BOOL: return snprintf(at, ELEMENT_TEXT_MAX, "%s", *p ? "true" : "false");
    case PJS_DTYPE_I8: return snprintf(at, ELEMENT_TEXT_MAX, "%d", *(const int8_t *)p);
    case PJS_DTYPE_U8: return snprintf(at, ELEMENT_TEXT_MAX, "%u", *p);
    case PJS_DTYPE_I16: {
        int16_t x;
        memcpy(&x, p, sizeof x);
        return snprintf(at, ELEMENT_TEXT_MAX, "%d", x);
    }
    case PJS_DTYPE_U16: {
        uint16_t x;
        memcpy(&x, p, sizeof x);
        return snprintf(at, ELEMENT_TEXT_MAX, "%u", x);
    }
    case PJS_DTYPE_I32: {
        int32_t x;
        memcpy(&x, p, sizeof x);
        return snprintf(at, ELEMENT_TEXT_MAX, "%" PRId32, x);
    }
    case PJS_DTYPE_U32: {
        uint32_t x;
        memcpy(&x, p, sizeof x);
        return snprintf(at, ELEMENT_TEXT_MAX, "%" PRIu32, x);
    }
    case PJS_DTYPE_I64: {
        int64_t x;
        memcpy(&x, p, sizeof x);
        return snprintf(at, ELEMENT_TEXT_MAX, "%" PRId64, x);
    }
    case PJS_DTYPE_U64: {
        uint64_t x;
        memcpy(&x, p, sizeof x);
        return snprintf(at, ELEMENT_TEXT_MAX, "%" PRIu64, x);
    }
    case PJS_DTYPE_F16: {
        uint16_t x;
        memcpy(&x, p, sizeof x);
        return format_float(at, pjs_f16_to_f32(x), 5);
    }
    case PJS_DTYPE_BF16: {
        uint16_t x;
        memcpy(&x, p, sizeof x);
        return format_float(at, pjs_bf16_to_f32(x), 4);
    }
    case PJS_DTYPE_F32: {
        float x;
        memcpy(&x, p, sizeof x);
        return format_float(at, x, 9);
    }
    case PJS_DTYPE_F64: {
        double x;
        memcpy(&x, p, sizeof x);
        return format_float(at, x, 17);
    }
    default: return -1;
    }
}

int pjs_tensor_json_encode(pjs_http_buf *b, pjs_dtype dt, const void *data, size_t count,
                           pjs_error *err)
{
    size_t size = pjs_dtype_size(dt);
    const unsigned char *p = data;
    int rc = pjs_http_buf_append_str(b, "[", err);
    for (size_t i = 0; rc == 0 && i < count; i++) {
        rc = pjs_http_buf_reserve(b, ELEMENT_TEXT_MAX + 1, err);
        if (rc != 0)
            break;
        if (i > 0)
            b->data[b->len++] = ',';
        int n = format_element(b->data + b->len, dt, p + i * size);
        if (n < 0)
            return pjs_error_set(err, PJS_ERR_INTERNAL, "no JSON encoding for datatype %s",
                                 pjs_dtype_kserve_name(dt));
        b->len += (size_t)n;
    }
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "]", err);
    return rc;
}
