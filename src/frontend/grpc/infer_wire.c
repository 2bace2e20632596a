/*
 * infer_wire.c - splitting a ModelInferRequest's raw_input_contents from
 * the rest of it (infer_wire.h), in two walks over the top-level fields:
 * the first sizes the rest and counts the raw entries, the second copies
 * the rest and points the entries into the message. Each walk steps from
 * one field to the next by its framing alone, so its cost grows with the
 * number of fields, not with the bytes they carry.
 */
#include "frontend/grpc/infer_wire.h"

#include <limits.h>
#include <stdbool.h>
#include <string.h>

/* Most bytes of a tag, of a length prefix and of a varint value, as
 * protobuf-c reads them. */
#define TAG_MAX_BYTES 5u
#define LENGTH_MAX_BYTES 5u
#define VARINT_MAX_BYTES 10u

/* One top-level field: [start, end) holds it whole; a length-delimited
 * one's payload is [payload, end). */
typedef struct wire_field {
    uint32_t number;
    unsigned wire_type;
    size_t start, payload, end;
} wire_field;

static int malformed(size_t len, size_t at, const char *what, pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "malformed ModelInferRequest: the %zu bytes received are not a valid "
                         "protobuf ModelInferRequest (%s at byte %zu)",
                         len, what, at);
}

/* The tag at data[at]: its field number (bits as protobuf-c assembles
 * them) and wire type; *at moves past it. */
static bool read_tag(const uint8_t *data, size_t len, size_t *at, uint32_t *number,
                     unsigned *wire_type)
{
    size_t left = len - *at, most = left < TAG_MAX_BYTES ? left : TAG_MAX_BYTES;
    const uint8_t *p = data + *at;
    if ((p[0] & 0xf8) == 0) /* field number 0 */
        return false;
    *wire_type = p[0] & 7u;
    uint32_t tag = (p[0] & 0x7fu) >> 3;
    if ((p[0] & 0x80) == 0) {
        *number = tag;
        *at += 1;
        return true;
    }
    unsigned shift = 4;
    for (size_t i = 1; i < most; i++) {
        if ((p[i] & 0x80) == 0) {
            *number = tag | (uint32_t)p[i] << shift;
            *at += i + 1;
            return true;
        }
        tag |= (uint32_t)(p[i] & 0x7fu) << shift;
        shift += 7;
    }
    return false;
}

/* Steps over a varint of at most `most` (<= VARINT_MAX_BYTES) bytes at
 * data[*at], its value in *value (the low 64 bits). */
static bool read_varint(const uint8_t *data, size_t len, size_t *at, size_t most,
                        uint64_t *value)
{
    size_t left = len - *at;
    const uint8_t *p = data + *at;
    uint64_t v = 0;
    if (left < most)
        most = left;
    for (size_t i = 0; i < most; i++) {
        v |= (uint64_t)(p[i] & 0x7fu) << (7 * i);
        if ((p[i] & 0x80) == 0) {
            *value = v;
            *at += i + 1;
            return true;
        }
    }
    return false;
}

/* Reads the field starting at data[at] into *f. */
static int next_field(const uint8_t *data, size_t len, size_t at, wire_field *f, pjs_error *err)
{
    uint64_t n;
    f->start = at;
    if (!read_tag(data, len, &at, &f->number, &f->wire_type))
        return malformed(len, f->start, "a bad field tag", err);
    f->payload = at;
    switch (f->wire_type) {
    case PROTOBUF_C_WIRE_TYPE_VARINT:
        if (!read_varint(data, len, &at, VARINT_MAX_BYTES, &n))
            return malformed(len, f->start, "an unterminated varint", err);
        break;
    case PROTOBUF_C_WIRE_TYPE_64BIT:
    case PROTOBUF_C_WIRE_TYPE_32BIT: {
        size_t size = f->wire_type == PROTOBUF_C_WIRE_TYPE_64BIT ? 8 : 4;
        if (len - at < size)
            return malformed(len, f->start, "a fixed-size field cut short", err);
        at += size;
        break;
    }
    case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED:
        if (!read_varint(data, len, &at, LENGTH_MAX_BYTES, &n) || n > INT_MAX)
            return malformed(len, f->start, "a bad length prefix", err);
        if (n > len - at)
            return malformed(len, f->start, "a field longer than the message", err);
        f->payload = at;
        at += (size_t)n;
        break;
    default:
        return malformed(len, f->start, "a group or unknown wire type", err);
    }
    f->end = at;
    return 0;
}

static bool is_raw_entry(const wire_field *f)
{
    return f->number == PJS_GRPC_RAW_INPUT_CONTENTS_FIELD &&
           f->wire_type == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
}

/* One walk: with rest == NULL it only sizes (out->rest_len, out->n_raw);
 * else it copies the rest into rest and fills out->raw. */
static int walk(const uint8_t *data, size_t len, uint8_t *rest, pjs_grpc_wire_split *out,
                pjs_error *err)
{
    size_t rest_len = 0, n_raw = 0;
    for (size_t at = 0; at < len;) {
        wire_field f = {0};
        int rc = next_field(data, len, at, &f, err);
        if (rc != 0)
            return rc;
        if (is_raw_entry(&f)) {
            if (out->raw != NULL) {
                out->raw[n_raw].len = f.end - f.payload;
                out->raw[n_raw].data = f.end > f.payload ? (uint8_t *)data + f.payload : NULL;
            }
            n_raw++;
        } else {
            if (rest != NULL)
                memcpy(rest + rest_len, data + f.start, f.end - f.start);
            rest_len += f.end - f.start;
        }
        at = f.end;
    }
    out->rest_len = rest_len;
    out->n_raw = n_raw;
    return 0;
}

static int no_room(pjs_grpc_arena *a, size_t len, pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                         "decoding this %zu-byte ModelInferRequest needs more than %zu bytes of "
                         "memory",
                         len, a->limit);
}

int pjs_grpc_wire_split_request(const uint8_t *data, size_t len, pjs_grpc_arena *a,
                                pjs_grpc_wire_split *out, pjs_error *err)
{
    memset(out, 0, sizeof *out);
    int rc = walk(data, len, NULL, out, err);
    if (rc != 0)
        return rc;
    uint8_t *rest = NULL;
    if (out->rest_len > 0 && (rest = pjs_grpc_arena_alloc(a, out->rest_len)) == NULL)
        return no_room(a, len, err);
    if (out->n_raw > 0 && (out->raw = pjs_grpc_arena_alloc(a, out->n_raw * sizeof *out->raw)) ==
                              NULL)
        return no_room(a, len, err);
    if (rest != NULL || out->raw != NULL)
        rc = walk(data, len, rest, out, err);
    out->rest = rest;
    return rc;
}
