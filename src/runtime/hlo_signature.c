/*
 * hlo_signature.c - decoding the entry signature from a serialized HLO module.
 *
 * Field numbers (xla/service/hlo.proto, xla/xla_data.proto):
 *   HloModuleProtoWithConfig { HloModuleProto hlo_module = 1; ... }
 *   HloModuleProto           { ProgramShapeProto host_program_shape = 4; ... }
 *   ProgramShapeProto        { repeated ShapeProto parameters = 1; ShapeProto result = 2; }
 *   ShapeProto               { PrimitiveType element_type = 2;
 *                              repeated int64 dimensions = 3;
 *                              repeated ShapeProto tuple_shapes = 4; }
 * Anything else is skipped by wire type.
 */
#include "runtime/hlo_signature.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* XLA PrimitiveType TUPLE. */
#define XLA_TUPLE 13

typedef struct wire {
    const unsigned char *p, *end;
} wire;

static bool read_varint(wire *w, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (w->p >= w->end)
            return false;
        unsigned char b = *w->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* Reads the next field tag; for length-delimited fields, sets *sub. Skips
 * other wire types' values unless the caller wants a varint (*varint). */
static bool next_field(wire *w, uint32_t *field, int *wtype, wire *sub, uint64_t *varint)
{
    uint64_t tag;
    if (!read_varint(w, &tag))
        return false;
    *field = (uint32_t)(tag >> 3);
    *wtype = (int)(tag & 7);
    switch (*wtype) {
    case 0:
        return read_varint(w, varint);
    case 1:
        if (w->end - w->p < 8)
            return false;
        w->p += 8;
        return true;
    case 2: {
        uint64_t len;
        if (!read_varint(w, &len) || len > (uint64_t)(w->end - w->p))
            return false;
        sub->p = w->p;
        sub->end = w->p + len;
        w->p += len;
        return true;
    }
    case 5:
        if (w->end - w->p < 4)
            return false;
        w->p += 4;
        return true;
    }
    return false;
}

/* Finds the last occurrence of a length-delimited field in a message. */
static bool find_message(wire msg, uint32_t want, wire *out)
{
    bool found = false;
    while (msg.p < msg.end) {
        uint32_t field;
        int wtype;
        wire sub;
        uint64_t v;
        if (!next_field(&msg, &field, &wtype, &sub, &v))
            return false;
        if (field == want && wtype == 2) {
            *out = sub;
            found = true;
        }
    }
    return found;
}

typedef struct shape_proto {
    int element_type;
    pjs_shape shape;
    wire tuple_elems[1024];
    int n_tuple;
    int64_t minor_to_major[PJS_MAX_RANK]; /* LayoutProto.minor_to_major, if a layout was given */
    int n_minor_to_major;
} shape_proto;

/* Appends one value of a repeated integer field to out[*n] (at most
 * PJS_MAX_RANK): `v` when it came alone (wire type 0), every varint of
 * `packed` otherwise. */
static bool add_repeated(int wtype, uint64_t v, wire packed, int64_t *out, int *n)
{
    if (wtype == 0) {
        if (*n >= PJS_MAX_RANK)
            return false;
        out[(*n)++] = (int64_t)v;
        return true;
    }
    while (packed.p < packed.end) {
        if (*n >= PJS_MAX_RANK || !read_varint(&packed, &v))
            return false;
        out[(*n)++] = (int64_t)v;
    }
    return true;
}

/* LayoutProto (field 1: minor_to_major, packed or not; the rest is tiling
 * and memory space, which pjserve leaves to the plugin). */
static bool decode_layout(wire msg, shape_proto *s)
{
    while (msg.p < msg.end) {
        uint32_t field;
        int wtype;
        wire sub;
        uint64_t v = 0;
        if (!next_field(&msg, &field, &wtype, &sub, &v))
            return false;
        if (field == 1 && (wtype == 0 || wtype == 2) &&
            !add_repeated(wtype, v, sub, s->minor_to_major, &s->n_minor_to_major))
            return false;
    }
    return true;
}

static bool decode_shape(wire msg, shape_proto *s)
{
    memset(s, 0, sizeof *s);
    while (msg.p < msg.end) {
        uint32_t field;
        int wtype;
        wire sub;
        uint64_t v = 0;
        if (!next_field(&msg, &field, &wtype, &sub, &v))
            return false;
        if (field == 2 && wtype == 0) {
            s->element_type = (int)v;
        } else if (field == 3 && (wtype == 0 || wtype == 2)) { /* dimensions, maybe packed */
            if (!add_repeated(wtype, v, sub, s->shape.dims, &s->shape.rank))
                return false;
        } else if (field == 4 && wtype == 2) {
            if (s->n_tuple >= 1024)
                return false;
            s->tuple_elems[s->n_tuple++] = sub;
        } else if (field == 5 && wtype == 2) {
            s->n_minor_to_major = 0;
            if (!decode_layout(sub, s))
                return false;
        }
    }
    return true;
}

static int to_tensor_type(const shape_proto *s, pjs_rt_tensor_type *out, const char *what,
                          size_t index, pjs_error *err)
{
    out->dtype = pjs_dtype_from_xla(s->element_type);
    out->shape = s->shape;
    int rank = s->shape.rank;
    if (s->n_minor_to_major != 0) {
        /* a permutation of the dimensions, or the module is not understood */
        unsigned seen = 0;
        bool permutation = s->n_minor_to_major == rank;
        for (int i = 0; permutation && i < rank; i++) {
            int64_t d = s->minor_to_major[i];
            permutation = d >= 0 && d < rank && !(seen & (1u << d));
            seen |= permutation ? 1u << d : 0;
            out->minor_to_major[i] = (uint8_t)d;
            if (permutation && d != rank - 1 - i)
                out->other_layout = true;
        }
        if (!permutation)
            return pjs_error_set(err, PJS_ERR_RUNTIME,
                                 "%s %zu has a layout that is not a permutation of its %d "
                                 "dimensions",
                                 what, index, rank);
    }
    if (out->dtype == PJS_DTYPE_INVALID)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "%s %zu has element type %d (XLA PrimitiveType), which pjserve does "
                             "not support",
                             what, index, s->element_type);
    return 0;
}

int pjs_hlo_program_shape(const unsigned char *proto, size_t size, bool with_config,
                          pjs_rt_tensor_type **out_params, size_t *out_n_params,
                          pjs_rt_tensor_type **out_results, size_t *out_n_results,
                          pjs_error *err)
{
    wire module = {proto, proto + size};
    wire program_shape, result_msg = {NULL, NULL};
    pjs_rt_tensor_type *params = NULL, *results = NULL;
    size_t n_params = 0, n_results = 0;
    int rc = PJS_ERR_INTERNAL;
    shape_proto s;

    if (with_config && !find_message(module, 1, &module))
        goto malformed;
    if (!find_message(module, 4, &program_shape))
        goto malformed;

    /* Count parameters first, then decode. */
    for (int pass = 0; pass < 2; pass++) {
        wire w = program_shape;
        size_t i = 0;
        while (w.p < w.end) {
            uint32_t field;
            int wtype;
            wire sub;
            uint64_t v;
            if (!next_field(&w, &field, &wtype, &sub, &v))
                goto malformed;
            if (field == 2 && wtype == 2)
                result_msg = sub;
            if (field != 1 || wtype != 2)
                continue;
            if (pass == 1) {
                if (!decode_shape(sub, &s))
                    goto malformed;
                rc = to_tensor_type(&s, &params[i], "parameter", i, err);
                if (rc != 0)
                    goto out;
            }
            i++;
        }
        if (pass == 0) {
            n_params = i;
            params = calloc(n_params ? n_params : 1, sizeof *params);
            if (params == NULL) {
                rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
                goto out;
            }
        }
    }
    if (result_msg.p == NULL || !decode_shape(result_msg, &s))
        goto malformed;

    if (s.element_type == XLA_TUPLE) {
        n_results = (size_t)s.n_tuple;
        results = calloc(n_results ? n_results : 1, sizeof *results);
        if (results == NULL) {
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
            goto out;
        }
        shape_proto tuple = s;
        for (size_t i = 0; i < n_results; i++) {
            if (!decode_shape(tuple.tuple_elems[i], &s))
                goto malformed;
            rc = to_tensor_type(&s, &results[i], "result", i, err);
            if (rc != 0)
                goto out;
        }
    } else {
        n_results = 1;
        results = calloc(1, sizeof *results);
        if (results == NULL) {
            rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
            goto out;
        }
        rc = to_tensor_type(&s, &results[0], "result", 0, err);
        if (rc != 0)
            goto out;
    }
    *out_params = params;
    *out_n_params = n_params;
    *out_results = results;
    *out_n_results = n_results;
    return 0;

malformed:
    rc = pjs_error_set(err, PJS_ERR_RUNTIME,
                       "the plugin's optimized HLO module could not be decoded (no readable "
                       "host_program_shape)");
out:
    free(params);
    free(results);
    return rc;
}
