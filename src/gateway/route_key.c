/*
 * route_key.c - a protobuf reader just deep enough for routing: top-level
 * fields are walked by wire type, field 1 (a string) is the model name,
 * field 4 entries (map<string, InferParameter>) are opened only to find
 * "sequence_id". Every length is checked against what is left.
 */
#include "gateway/route_key.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static bool read_varint(reader *r, uint64_t *v)
{
    *v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end)
            return false;
        uint8_t b = *r->p++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* The next field: number, wire type and, for length-delimited ones, the
 * bytes. Other fields are skipped. False at a malformed field. */
static bool next_field(reader *r, uint32_t *field, unsigned *type, reader *bytes, uint64_t *value)
{
    uint64_t tag;
    if (!read_varint(r, &tag) || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX)
        return false;
    *field = (uint32_t)(tag >> 3);
    *type = (unsigned)(tag & 7);
    switch (*type) {
    case 0:
        return read_varint(r, value);
    case 1:
        if (r->end - r->p < 8)
            return false;
        r->p += 8;
        return true;
    case 5:
        if (r->end - r->p < 4)
            return false;
        r->p += 4;
        return true;
    case 2: {
        uint64_t n;
        if (!read_varint(r, &n) || n > (uint64_t)(r->end - r->p))
            return false;
        bytes->p = r->p;
        bytes->end = r->p + n;
        r->p += n;
        return true;
    }
    default:
        return false;
    }
}

static bool copy_text(char *dst, size_t size, const reader *s)
{
    size_t n = (size_t)(s->end - s->p);
    if (n >= size)
        return false;
    memcpy(dst, s->p, n);
    dst[n] = '\0';
    return memchr(dst, '\0', n) == NULL;
}

/* An InferParameter as text (int64, string or uint64; others: ""). */
static bool parameter_text(reader v, char *out, size_t size)
{
    out[0] = '\0';
    while (v.p < v.end) {
        uint32_t field;
        unsigned type;
        reader bytes;
        uint64_t value = 0;
        if (!next_field(&v, &field, &type, &bytes, &value))
            return false;
        if (field == 2 && type == 0)
            snprintf(out, size, "%" PRId64, (int64_t)value);
        else if (field == 5 && type == 0)
            snprintf(out, size, "%" PRIu64, value);
        else if (field == 3 && type == 2 && !copy_text(out, size, &bytes))
            return false;
    }
    return true;
}

/* One map entry of field 4: the sequence id when its key is "sequence_id". */
static bool read_parameter(reader e, pjs_gw_route_key *out)
{
    static const char key[] = "sequence_id";
    bool is_sequence = false;
    reader value = {0};
    while (e.p < e.end) {
        uint32_t field;
        unsigned type;
        reader bytes;
        uint64_t v;
        if (!next_field(&e, &field, &type, &bytes, &v))
            return false;
        if (field == 1 && type == 2)
            is_sequence = (size_t)(bytes.end - bytes.p) == sizeof key - 1 &&
                          memcmp(bytes.p, key, sizeof key - 1) == 0;
        else if (field == 2 && type == 2)
            value = bytes;
    }
    if (is_sequence && value.p != NULL)
        return parameter_text(value, out->sequence, sizeof out->sequence);
    return true;
}

int pjs_gw_route_key_read(const uint8_t *msg, size_t len, bool inference, pjs_gw_route_key *out,
                          pjs_error *err)
{
    out->model[0] = '\0';
    out->sequence[0] = '\0';
    reader r = {msg, msg + len};
    while (r.p < r.end) {
        uint32_t field;
        unsigned type;
        reader bytes;
        uint64_t value;
        if (!next_field(&r, &field, &type, &bytes, &value))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "the request is not a well-formed protobuf message (at byte %zu)",
                                 (size_t)(r.p - msg));
        if (field == 1 && type == 2) {
            if (!copy_text(out->model, sizeof out->model, &bytes))
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "the model name is longer than %zu bytes or holds a NUL",
                                     sizeof out->model - 1);
        } else if (inference && field == 4 && type == 2 && !read_parameter(bytes, out)) {
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "the request's parameters are not well-formed protobuf");
        }
    }
    return 0;
}
