/*
 * decode.c - the server's answers into results: a gRPC ModelInferResponse
 * (raw_output_contents, or the typed contents fields servers may use
 * instead), a ModelStreamInferResponse, and a REST answer (the JSON
 * header with each output's "data" or its binary_data_size bytes after
 * the header).
 *
 * These are the only functions that read bytes from the server, and they
 * trust none of them: datatypes must be known, extents non-negative, and
 * each output's bytes must be exactly its shape's elements (for BYTES,
 * well-formed elements of that count), unless the request sent the
 * output to shared memory. fuzz/fuzz_client_decode.c feeds them
 * arbitrary bytes. Pure functions; any thread.
 */
#include "client/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/dtype.h"
#include "grpc_service.pb-c.h"

#define BAD(err, ...) pjsc_fail(err, PJS_CLIENT_INTERNAL, "the server's answer: " __VA_ARGS__)

/* Checks every output's bytes against its shape (see the file comment).
 * `empty_ok`: an output without bytes may have gone to shared memory
 * (streams, whose answers are not matched to their requests). */
static int check_outputs(const pjs_client_result *r, bool empty_ok, pjs_client_error *err)
{
    for (size_t i = 0; i < r->n_outputs; i++) {
        const pjsc_output *o = &r->outputs[i];
        pjs_dtype dt = pjs_dtype_from_kserve(o->datatype, strlen(o->datatype));
        if (dt == PJS_DTYPE_INVALID)
            return BAD(err, "output %.200s has the unknown datatype %.40s", o->name, o->datatype);
        uint64_t elements;
        if (!pjsc_shape_elements(o->shape, o->rank, &elements))
            return BAD(err, "output %.200s has a negative or overflowing shape", o->name);
        if (o->shm_region != NULL || (empty_ok && o->nbytes == 0))
            continue;
        if (dt == PJS_DTYPE_BYTES) {
            uint64_t count;
            if (!pjsc_bytes_count(o->data, o->nbytes, &count) || count != elements)
                return BAD(err, "output %.200s is not %llu well-formed BYTES elements", o->name,
                           (unsigned long long)elements);
            continue;
        }
        size_t size = pjs_dtype_size(dt);
        if (elements > UINT64_MAX / size || elements * size != o->nbytes)
            return BAD(err, "output %.200s has %zu bytes for %llu %s elements", o->name,
                       o->nbytes, (unsigned long long)elements, o->datatype);
    }
    return 0;
}

static int copy_bytes(pjsc_output *o, const void *data, size_t n, pjs_client_error *err)
{
    if (n == 0)
        return 0;
    o->data = malloc(n);
    if (o->data == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED,
                         "no memory for an output of %zu bytes", n);
    memcpy(o->data, data, n);
    o->nbytes = n;
    return 0;
}

static int set_names(pjs_client_result *r, const char *model, const char *version,
                     const char *id, pjs_client_error *err)
{
    r->model = pjsc_strdup(model ? model : "");
    r->version = pjsc_strdup(version ? version : "");
    r->id = pjsc_strdup(id ? id : "");
    if (r->model == NULL || r->version == NULL || r->id == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an answer");
    return 0;
}

/* ---- gRPC ---------------------------------------------------------------------------- */

/* Writes n elements of `src` (of `from` bytes each, signed or not) as
 * elements of `to` bytes, little-endian, into o. */
static int narrow_ints(pjsc_output *o, const void *src, size_t n, size_t from, size_t to,
                       pjs_client_error *err)
{
    if (n == 0)
        return 0;
    if (n > SIZE_MAX / to)
        return BAD(err, "output %.200s is too large", o->name);
    o->data = malloc(n * to);
    if (o->data == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an output");
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        if (from == 1)
            v = ((const protobuf_c_boolean *)src)[i] ? 1 : 0;
        else if (from == 4)
            v = ((const uint32_t *)src)[i];
        else
            v = ((const uint64_t *)src)[i];
        for (size_t b = 0; b < to; b++)
            o->data[i * to + b] = (unsigned char)(v >> (8 * b));
    }
    o->nbytes = n * to;
    return 0;
}

/* An output sent in the typed fields of `contents` instead of raw. */
static int typed_contents(pjsc_output *o, const Inference__InferTensorContents *c,
                          pjs_client_error *err)
{
    pjs_dtype dt = pjs_dtype_from_kserve(o->datatype, strlen(o->datatype));
    size_t size = pjs_dtype_size(dt);
    switch (dt) {
    case PJS_DTYPE_BOOL: return narrow_ints(o, c->bool_contents, c->n_bool_contents, 1, 1, err);
    case PJS_DTYPE_I8:
    case PJS_DTYPE_I16:
    case PJS_DTYPE_I32: return narrow_ints(o, c->int_contents, c->n_int_contents, 4, size, err);
    case PJS_DTYPE_U8:
    case PJS_DTYPE_U16:
    case PJS_DTYPE_U32: return narrow_ints(o, c->uint_contents, c->n_uint_contents, 4, size, err);
    case PJS_DTYPE_I64: return narrow_ints(o, c->int64_contents, c->n_int64_contents, 8, 8, err);
    case PJS_DTYPE_U64: return narrow_ints(o, c->uint64_contents, c->n_uint64_contents, 8, 8, err);
    case PJS_DTYPE_F32:
        return copy_bytes(o, c->fp32_contents, c->n_fp32_contents * sizeof(float), err);
    case PJS_DTYPE_F64:
        return copy_bytes(o, c->fp64_contents, c->n_fp64_contents * sizeof(double), err);
    case PJS_DTYPE_BYTES: {
        size_t total = 0;
        for (size_t i = 0; i < c->n_bytes_contents; i++)
            if (!pjs_bytes_add_size(&total, c->bytes_contents[i].len))
                return BAD(err, "output %.200s: an element is too long", o->name);
        if (total == 0)
            return 0;
        if ((o->data = malloc(total)) == NULL)
            return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an output");
        pjs_bytes_writer w = pjs_bytes_writer_init(o->data, total);
        for (size_t i = 0; i < c->n_bytes_contents; i++)
            pjs_bytes_put(&w, c->bytes_contents[i].data, c->bytes_contents[i].len);
        o->nbytes = total;
        return 0;
    }
    default: return 0; /* FP16 and BF16 travel raw only; check_outputs reports it */
    }
}

static int from_grpc_response(const Inference__ModelInferResponse *m,
                              const pjsc_output_req *outs, size_t n_outs, bool empty_ok,
                              pjs_client_result **out, pjs_client_error *err)
{
    pjs_client_result *r = pjsc_result_new();
    if (r == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an answer");
    int rc = set_names(r, m->model_name, m->model_version, m->id, err);
    if (rc == 0 && m->n_raw_output_contents > m->n_outputs)
        rc = BAD(err, "%zu raw contents for %zu outputs", m->n_raw_output_contents, m->n_outputs);
    for (size_t i = 0; rc == 0 && i < m->n_outputs; i++) {
        const Inference__ModelInferResponse__InferOutputTensor *t = m->outputs[i];
        pjsc_output *o;
        rc = pjsc_result_add(r, t->name, t->datatype, t->shape, t->n_shape, &o, err);
        if (rc != 0)
            break;
        if (i < m->n_raw_output_contents)
            rc = copy_bytes(o, m->raw_output_contents[i].data, m->raw_output_contents[i].len,
                            err);
        else if (t->contents != NULL)
            rc = typed_contents(o, t->contents, err);
    }
    if (rc == 0)
        rc = pjsc_result_mark_shm(r, outs, n_outs, err);
    if (rc == 0)
        rc = check_outputs(r, empty_ok, err);
    if (rc != 0) {
        pjs_client_result_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int pjsc_decode_grpc_infer(const unsigned char *bytes, size_t len, const pjsc_output_req *outs,
                           size_t n_outs, pjs_client_result **out, pjs_client_error *err)
{
    *out = NULL;
    Inference__ModelInferResponse *m = inference__model_infer_response__unpack(NULL, len, bytes);
    if (m == NULL)
        return BAD(err, "not a ModelInferResponse");
    int rc = from_grpc_response(m, outs, n_outs, false, out, err);
    inference__model_infer_response__free_unpacked(m, NULL);
    return rc;
}

int pjsc_decode_grpc_stream(const unsigned char *bytes, size_t len, pjs_client_result **out,
                            pjs_client_error *err)
{
    *out = NULL;
    Inference__ModelStreamInferResponse *m =
        inference__model_stream_infer_response__unpack(NULL, len, bytes);
    if (m == NULL)
        return BAD(err, "not a ModelStreamInferResponse");
    int rc;
    if (m->error_message != NULL && m->error_message[0] != '\0') {
        /* The stream carries no code with a request's error. */
        rc = pjsc_fail(err, PJS_CLIENT_UNKNOWN, "%s", m->error_message);
        err->http_status = 0;
        err->from_server = 1;
    } else if (m->infer_response == NULL) {
        rc = BAD(err, "a stream message with neither an answer nor an error");
    } else {
        rc = from_grpc_response(m->infer_response, NULL, 0, true, out, err);
    }
    inference__model_stream_infer_response__free_unpacked(m, NULL);
    return rc;
}

/* ---- REST ------------------------------------------------------------------------------ */

void pjsc_decode_rest_error(long status, const unsigned char *body, size_t len,
                            pjs_client_error *err)
{
    pjs_client_code code = pjsc_code_from_http(status);
    if (code == PJS_CLIENT_OK)
        code = PJS_CLIENT_UNKNOWN;
    json_t *doc = len > 0 ? json_loadb((const char *)body, len, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(doc, "error"));
    if (msg != NULL)
        pjsc_fail(err, code, "%s", msg);
    else if (len > 0)
        pjsc_fail(err, code, "HTTP %ld: %.*s", status, (int)(len > 512 ? 512 : len),
                  (const char *)body);
    else
        pjsc_fail(err, code, "HTTP %ld", status);
    json_decref(doc);
    if (err != NULL) {
        err->http_status = (int)status;
        err->from_server = 1;
    }
}

static int shape_from_json(const json_t *a, int64_t *shape, size_t cap, size_t *rank,
                           const char *name, pjs_client_error *err)
{
    if (!json_is_array(a) || json_array_size(a) > cap)
        return BAD(err, "output %.200s has no shape, or more than %zu extents", name, cap);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *d = json_array_get(a, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return BAD(err, "output %.200s: extent %zu is not a non-negative integer", name, i);
        shape[i] = (int64_t)json_integer_value(d);
    }
    *rank = json_array_size(a);
    return 0;
}

/* Stores JSON number v as element i of o (of datatype dt). */
static bool put_number(pjsc_output *o, pjs_dtype dt, size_t i, const json_t *v)
{
    unsigned char *p = o->data + i * pjs_dtype_size(dt);
    if (dt == PJS_DTYPE_BOOL) {
        if (!json_is_boolean(v))
            return false;
        p[0] = json_is_true(v) ? 1 : 0;
        return true;
    }
    if (dt == PJS_DTYPE_F32 || dt == PJS_DTYPE_F64) {
        if (!json_is_number(v))
            return false;
        double d = json_number_value(v);
        if (dt == PJS_DTYPE_F64) {
            memcpy(p, &d, sizeof d);
        } else {
            float f = (float)d;
            memcpy(p, &f, sizeof f);
        }
        return true;
    }
    if (!json_is_integer(v))
        return false;
    uint64_t u = (uint64_t)json_integer_value(v);
    for (size_t b = 0; b < pjs_dtype_size(dt); b++)
        p[b] = (unsigned char)(u >> (8 * b));
    return true;
}

/* An output's JSON "data" (flat) as bytes. */
static int data_from_json(pjsc_output *o, const json_t *data, pjs_client_error *err)
{
    pjs_dtype dt = pjs_dtype_from_kserve(o->datatype, strlen(o->datatype));
    size_t n = json_array_size(data);
    if (!json_is_array(data))
        return BAD(err, "output %.200s: \"data\" is not an array", o->name);
    if (dt == PJS_DTYPE_BYTES) {
        size_t total = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *s = json_array_get(data, i);
            if (!json_is_string(s) || !pjs_bytes_add_size(&total, json_string_length(s)))
                return BAD(err, "output %.200s: element %zu is not a string", o->name, i);
        }
        if (total == 0)
            return 0;
        if ((o->data = malloc(total)) == NULL)
            return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an output");
        pjs_bytes_writer w = pjs_bytes_writer_init(o->data, total);
        for (size_t i = 0; i < n; i++) {
            const json_t *s = json_array_get(data, i);
            pjs_bytes_put(&w, json_string_value(s), json_string_length(s));
        }
        o->nbytes = total;
        return 0;
    }
    size_t size = pjs_dtype_size(dt);
    if (size == 0 || dt == PJS_DTYPE_F16 || dt == PJS_DTYPE_BF16)
        return BAD(err, "output %.200s: %s cannot be read from JSON data", o->name, o->datatype);
    if (n == 0)
        return 0;
    if ((o->data = malloc(n * size)) == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an output");
    o->nbytes = n * size;
    for (size_t i = 0; i < n; i++)
        if (!put_number(o, dt, i, json_array_get(data, i)))
            return BAD(err, "output %.200s: element %zu is not a %s value", o->name, i,
                       o->datatype);
    return 0;
}

#define REST_MAX_RANK 64

static int rest_output(pjs_client_result *r, const json_t *t, const unsigned char *binary,
                       size_t binary_len, size_t *binary_at, pjs_client_error *err)
{
    const char *name = json_string_value(json_object_get(t, "name"));
    const char *datatype = json_string_value(json_object_get(t, "datatype"));
    if (name == NULL || datatype == NULL)
        return BAD(err, "an output without a name or a datatype");
    int64_t shape[REST_MAX_RANK];
    size_t rank = 0;
    int rc = shape_from_json(json_object_get(t, "shape"), shape, REST_MAX_RANK, &rank, name, err);
    pjsc_output *o;
    if (rc == 0)
        rc = pjsc_result_add(r, name, datatype, shape, rank, &o, err);
    if (rc != 0)
        return rc;
    const json_t *size = json_object_get(json_object_get(t, "parameters"), "binary_data_size");
    const json_t *data = json_object_get(t, "data");
    if (size != NULL) {
        if (!json_is_integer(size) || json_integer_value(size) < 0 ||
            (uint64_t)json_integer_value(size) > binary_len - *binary_at)
            return BAD(err, "output %.200s: binary_data_size runs past the answer's end", name);
        size_t n = (size_t)json_integer_value(size);
        rc = copy_bytes(o, binary + *binary_at, n, err);
        *binary_at += n;
        return rc;
    }
    return data != NULL ? data_from_json(o, data, err) : 0;
}

int pjsc_decode_rest_infer(const unsigned char *body, size_t len, size_t json_len,
                           const pjsc_output_req *outs, size_t n_outs, pjs_client_result **out,
                           pjs_client_error *err)
{
    *out = NULL;
    if (json_len > len)
        return BAD(err, "its JSON part is longer than the answer");
    json_error_t jerr;
    json_t *doc = json_loadb((const char *)body, json_len, 0, &jerr);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return BAD(err, "not a JSON object (%s)", jerr.text);
    }
    const json_t *outputs = json_object_get(doc, "outputs");
    pjs_client_result *r = pjsc_result_new();
    int rc = r != NULL ? 0 : pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory");
    if (rc == 0)
        rc = set_names(r, json_string_value(json_object_get(doc, "model_name")),
                       json_string_value(json_object_get(doc, "model_version")),
                       json_string_value(json_object_get(doc, "id")), err);
    if (rc == 0 && outputs != NULL && !json_is_array(outputs))
        rc = BAD(err, "\"outputs\" is not an array");
    size_t binary_at = 0;
    for (size_t i = 0; rc == 0 && i < json_array_size(outputs); i++)
        rc = rest_output(r, json_array_get(outputs, i), body + json_len, len - json_len,
                         &binary_at, err);
    if (rc == 0 && binary_at != len - json_len)
        rc = BAD(err, "%zu bytes after the outputs' binary data", len - json_len - binary_at);
    if (rc == 0)
        rc = pjsc_result_mark_shm(r, outs, n_outs, err);
    if (rc == 0)
        rc = check_outputs(r, false, err);
    json_decref(doc);
    if (rc != 0) {
        pjs_client_result_free(r);
        return rc;
    }
    *out = r;
    return 0;
}
