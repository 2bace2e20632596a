/*
 * http_codec.c - REST inference requests and responses (see http_codec.h).
 *
 * Decoding runs in the order a client fixes mistakes: framing (header
 * length), JSON syntax, the request's parameters, each input (name, datatype,
 * shape, then its one source of bytes), the binary section adding up, then
 * the requested outputs. Checks against the model (names known, datatypes,
 * shapes, byte sizes) are left to pjs_infer_validate so that gRPC and REST
 * word them the same; an input with an unknown datatype is passed on without
 * data for the same reason.
 *
 * BYTES tensors travel in their serialized form (core/bytes.h) in the binary
 * section and in shared memory, and as JSON strings otherwise: the strings
 * of an input's "data" are serialized here (JSON strings may hold NUL
 * characters, so the parser keeps them, and names, ids and region names
 * are refused when they do), and a BYTES output not sent as binary is
 * written as JSON strings whose bytes are copied as they are, escaped where
 * JSON requires it, valid UTF-8 or not (see pjs_http_bytes_to_json).
 * An output the client asked to classify ("classification" in its
 * parameters) is replaced by its classes before encoding (core/classify.h)
 * and then sent like any BYTES output, as JSON strings or binary data.
 */
#include "frontend/http/http_codec.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#include "core/bytes.h"
#include "core/classify.h"
#include "frontend/deadline.h"
#include "frontend/http/tensor_json.h"

/* Largest JSON part of a request. A JSON number costs tens of bytes once
 * parsed, so this bounds the parse at a few GiB; larger tensors belong in the
 * binary section. */
#define PJS_HTTP_MAX_JSON ((size_t)128 << 20)

/* "what" strings name a tensor in messages: `input "x"`. */
#define WHAT_MAX 300

/* ---- framing ------------------------------------------------------------- */

int pjs_http_header_length(const char *value, size_t body_len, size_t *out_json_len,
                           pjs_error *err)
{
    if (value == NULL) {
        *out_json_len = body_len;
        return 0;
    }
    size_t n = 0;
    const char *p = value;
    while (*p == ' ' || *p == '\t')
        p++;
    const char *digits = p;
    while (*p >= '0' && *p <= '9') {
        size_t digit = (size_t)(*p - '0');
        if (n > (SIZE_MAX - digit) / 10)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "Inference-Header-Content-Length %.40s is out of range", value);
        n = n * 10 + digit;
        p++;
    }
    bool had_digits = p > digits;
    while (*p == ' ' || *p == '\t')
        p++;
    if (!had_digits || *p != '\0')
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "Inference-Header-Content-Length must be a decimal byte count, not "
                             "\"%.40s\"",
                             value);
    if (n > body_len)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "Inference-Header-Content-Length %zu is larger than the %zu-byte "
                             "request body",
                             n, body_len);
    *out_json_len = n;
    return 0;
}

/* The binary section of a request and how much of it inputs have claimed. */
typedef struct binary_section {
    bool present; /* the request had Inference-Header-Content-Length */
    const unsigned char *base;
    size_t len;
    size_t used;
} binary_section;

/* ---- JSON helpers ---------------------------------------------------------- */

/* The "parameters" object of `obj` (NULL when absent). */
static int get_parameters(const json_t *obj, const char *what, const json_t **out,
                          pjs_error *err)
{
    *out = json_object_get(obj, "parameters");
    if (*out != NULL && !json_is_object(*out))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: \"parameters\" must be an object",
                             what);
    return 0;
}

/* Optional non-negative integer parameter. */
static int get_count(const json_t *params, const char *key, const char *what, bool *present,
                     uint64_t *out, pjs_error *err)
{
    const json_t *v = params ? json_object_get(params, key) : NULL;
    *present = v != NULL;
    if (v == NULL)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: parameter \"%s\" must be a non-negative integer", what, key);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Optional boolean parameter; *out keeps its value when absent. */
static int get_flag(const json_t *params, const char *key, const char *what, bool *out,
                    pjs_error *err)
{
    const json_t *v = params ? json_object_get(params, key) : NULL;
    if (v == NULL)
        return 0;
    if (!json_is_boolean(v))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: parameter \"%s\" must be true or false", what, key);
    *out = json_is_true(v);
    return 0;
}

/* True when a JSON string holds a NUL character (allowed in BYTES data,
 * nowhere else). */
static bool has_nul(const json_t *s)
{
    return strlen(json_string_value(s)) != json_string_length(s);
}

/* Required string member. */
static int get_string(const json_t *obj, const char *key, const char *what, const char **out,
                      pjs_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_string(v))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: \"%s\" must be a string", what,
                             key);
    if (has_nul(v))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"%s\" must not contain NUL characters", what, key);
    *out = json_string_value(v);
    return 0;
}

/* Optional shared-memory parameters; region NULL when absent. */
static int get_shm_ref(const json_t *params, const char *what, pjs_http_shm_ref *out,
                       pjs_error *err)
{
    memset(out, 0, sizeof *out);
    const json_t *region = params ? json_object_get(params, "shared_memory_region") : NULL;
    if (region == NULL)
        return 0;
    if (!json_is_string(region) || has_nul(region))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: parameter \"shared_memory_region\" must be a string without "
                             "NUL characters",
                             what);
    bool has_size = false, has_offset = false;
    int rc = get_count(params, "shared_memory_byte_size", what, &has_size, &out->byte_size, err);
    if (rc == 0)
        rc = get_count(params, "shared_memory_offset", what, &has_offset, &out->offset, err);
    if (rc == 0 && !has_size)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s: \"shared_memory_region\" needs \"shared_memory_byte_size\"", what);
    out->region = json_string_value(region);
    return rc;
}

/* ---- request ----------------------------------------------------------------- */

/* sequence_id (a non-negative integer or a string), sequence_start and
 * sequence_end (booleans). */
static int decode_sequence_parameters(pjs_http_infer *d, const json_t *params, pjs_error *err)
{
    pjs_infer_sequence *q = &d->req.sequence;
    const json_t *id = json_object_get(params, "sequence_id");
    if (id != NULL && json_is_string(id)) {
        if (has_nul(id))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "request: parameter \"sequence_id\" must not hold NUL "
                                 "characters");
        q->is_string = true;
        q->string = json_string_value(id); /* owned by the decoded document */
        q->has_id = q->string[0] != '\0';
    } else if (id != NULL) {
        if (!json_is_integer(id) || json_integer_value(id) < 0)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "request: parameter \"sequence_id\" must be a non-negative "
                                 "integer or a string");
        q->number = (uint64_t)json_integer_value(id);
        q->has_id = q->number != 0;
    }
    int rc = get_flag(params, "sequence_start", "request", &q->start, err);
    if (rc == 0)
        rc = get_flag(params, "sequence_end", "request", &q->end, err);
    return rc;
}

/* binary_data_output; timeout (microseconds, 0: none), which sets the
 * deadline; priority, checked as gRPC checks it and then ignored. */
static int decode_request_parameters(pjs_http_infer *d, const json_t *root, pjs_error *err)
{
    const json_t *params;
    int rc = get_parameters(root, "request", &params, err);
    if (rc != 0 || params == NULL)
        return rc;
    rc = get_flag(params, "binary_data_output", "request", &d->req.binary_data_output, err);
    if (rc == 0)
        rc = decode_sequence_parameters(d, params, err);
    bool has_timeout = false, has_priority = false;
    uint64_t timeout_us = 0, priority = 0;
    if (rc == 0)
        rc = get_count(params, "timeout", "request", &has_timeout, &timeout_us, err);
    if (rc == 0)
        rc = get_count(params, "priority", "request", &has_priority, &priority, err);
    if (rc == 0 && has_timeout)
        d->req.deadline_ns = pjs_deadline_from_timeout_us(d->req.times.received, timeout_us);
    return rc;
}

static int decode_id(pjs_http_infer *d, const json_t *root, pjs_error *err)
{
    const json_t *id = json_object_get(root, "id");
    if (id == NULL)
        return 0;
    if (!json_is_string(id) || has_nul(id))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "request: \"id\" must be a string without NUL characters");
    d->req.id = json_string_value(id); /* owned by the decoded document */
    return 0;
}

static int decode_shape(const json_t *v, const char *what, pjs_shape *out, pjs_error *err)
{
    if (!json_is_array(v) || json_array_size(v) > PJS_MAX_RANK)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"shape\" must be a list of at most %d dimensions", what,
                             PJS_MAX_RANK);
    out->rank = (int)json_array_size(v);
    for (int i = 0; i < out->rank; i++) {
        const json_t *dim = json_array_get(v, (size_t)i);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s: \"shape\"[%d] must be a non-negative integer", what, i);
        out->dims[i] = json_integer_value(dim);
    }
    return 0;
}

/* ---- BYTES as JSON strings --------------------------------------------------- */

/* Walks the strings of a (nested) JSON list in row-major order: counts them
 * and their serialized size into *count and *size, and writes them to w
 * when it is not NULL. */
static int walk_strings(const json_t *v, const char *what, pjs_bytes_writer *w, size_t *count,
                        size_t *size, pjs_error *err)
{
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            int rc = walk_strings(json_array_get(v, i), what, w, count, size, err);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    if (!json_is_string(v))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"data\" element %zu is not a string; BYTES elements are JSON "
                             "strings (or send the serialized form as binary data)",
                             what, *count);
    size_t len = json_string_length(v);
    if (!pjs_bytes_add_size(size, len))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"data\" element %zu is %zu bytes, more than a BYTES element "
                             "holds (%lu)",
                             what, *count, len, (unsigned long)PJS_BYTES_MAX_ELEMENT);
    if (w != NULL && !pjs_bytes_put(w, json_string_value(v), len))
        return pjs_error_set(err, PJS_ERR_INTERNAL, "%s: \"data\" changed while serialized", what);
    (*count)++;
    return 0;
}

int pjs_http_bytes_from_json(const json_t *data, const char *what, void **out,
                             size_t *out_nbytes, size_t *out_count, pjs_error *err)
{
    size_t count = 0, size = 0;
    *out = NULL;
    *out_nbytes = 0;
    *out_count = 0;
    if (!json_is_array(data))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"data\" must be a list of strings", what);
    int rc = walk_strings(data, what, NULL, &count, &size, err);
    if (rc != 0 || count == 0)
        return rc;
    unsigned char *buf = malloc(size);
    if (buf == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory for %zu bytes of strings",
                             what, size);
    pjs_bytes_writer w = pjs_bytes_writer_init(buf, size);
    size_t written = 0, again = 0;
    rc = walk_strings(data, what, &w, &written, &again, err);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_nbytes = size;
    *out_count = count;
    return 0;
}

/* Appends one element as a JSON string: '"', '\\' and control characters
 * escaped, every other byte as it is. */
static int append_json_bytes(pjs_http_buf *b, const unsigned char *s, size_t len,
                             pjs_error *err)
{
    int rc = pjs_http_buf_append_str(b, "\"", err);
    size_t run = 0; /* start of the bytes not yet appended */
    for (size_t i = 0; rc == 0 && i < len; i++) {
        unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        rc = pjs_http_buf_append(b, s + run, i - run, err);
        run = i + 1;
        if (rc != 0)
            break;
        switch (c) {
        case '"': rc = pjs_http_buf_append_str(b, "\\\"", err); break;
        case '\\': rc = pjs_http_buf_append_str(b, "\\\\", err); break;
        case '\b': rc = pjs_http_buf_append_str(b, "\\b", err); break;
        case '\f': rc = pjs_http_buf_append_str(b, "\\f", err); break;
        case '\n': rc = pjs_http_buf_append_str(b, "\\n", err); break;
        case '\r': rc = pjs_http_buf_append_str(b, "\\r", err); break;
        case '\t': rc = pjs_http_buf_append_str(b, "\\t", err); break;
        default: rc = pjs_http_buf_printf(b, err, "\\u%04x", c); break;
        }
    }
    if (rc == 0)
        rc = pjs_http_buf_append(b, s + run, len - run, err);
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "\"", err);
    return rc;
}

int pjs_http_bytes_to_json(pjs_http_buf *b, const void *data, size_t nbytes, pjs_error *err)
{
    pjs_bytes_reader r = pjs_bytes_reader_init(data, nbytes);
    const unsigned char *s;
    uint32_t len;
    bool first = true;
    int rc = pjs_http_buf_append_str(b, "[", err);
    while (rc == 0 && pjs_bytes_next(&r, &s, &len)) {
        if (!first)
            rc = pjs_http_buf_append_str(b, ",", err);
        if (rc == 0)
            rc = append_json_bytes(b, s, len, err);
        first = false;
    }
    if (rc == 0 && r.at != r.end)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "malformed BYTES data at offset %zu of %zu",
                             (size_t)(r.at - (const unsigned char *)data), nbytes);
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "]", err);
    return rc;
}

/* ---- inputs ------------------------------------------------------------------ */

/* An input's JSON "data" as strings, serialized into memory owned by d. */
static int convert_json_strings(pjs_http_infer *d, pjs_infer_input *in, const json_t *data,
                                int64_t numel, const char *what, pjs_error *err)
{
    void *bytes = NULL;
    size_t nbytes = 0, count = 0;
    int rc = pjs_http_bytes_from_json(data, what, &bytes, &nbytes, &count, err);
    if (rc != 0)
        return rc;
    if (bytes != NULL)
        d->converted[d->n_converted++] = bytes;
    if ((uint64_t)numel != count)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"data\" holds %zu strings but the shape needs %lld", what,
                             count, (long long)numel);
    in->data = bytes;
    in->nbytes = nbytes;
    return 0;
}

/* Converts an input's JSON "data" to packed elements owned by d. */
static int convert_json_data(pjs_http_infer *d, pjs_infer_input *in, const json_t *data,
                             const char *what, pjs_error *err)
{
    pjs_dtype dt = pjs_dtype_from_kserve(in->datatype, strlen(in->datatype));
    if (dt == PJS_DTYPE_INVALID)
        return 0; /* validation names the datatype problem */
    int64_t numel = 0;
    if (!pjs_shape_numel(&in->shape, &numel))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s: \"shape\" is too large", what);
    if (dt == PJS_DTYPE_BYTES)
        return convert_json_strings(d, in, data, numel, what, err);
    size_t count = 0;
    int rc = pjs_tensor_json_count(data, what, &count, err);
    if (rc != 0)
        return rc;
    if ((uint64_t)numel != count)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: \"data\" holds %zu values but the shape needs %lld", what,
                             count, (long long)numel);
    if (count == 0)
        return 0;
    void *bytes = malloc(count * pjs_dtype_size(dt));
    if (bytes == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory for %zu elements", what,
                             count);
    d->converted[d->n_converted++] = bytes;
    in->data = bytes;
    in->nbytes = count * pjs_dtype_size(dt);
    return pjs_tensor_json_decode(data, dt, what, bytes, count, err);
}

/* Takes an input's bytes from the binary section. */
static int claim_binary(binary_section *bin, pjs_infer_input *in, uint64_t size,
                        const char *what, pjs_error *err)
{
    if (!bin->present)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: parameter \"binary_data_size\" needs the "
                             "Inference-Header-Content-Length header",
                             what);
    if (size > bin->len - bin->used)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: binary_data_size %llu runs past the end of the binary data "
                             "(%zu of its %zu bytes are left)",
                             what, (unsigned long long)size, bin->len - bin->used, bin->len);
    in->data = bin->base + bin->used;
    in->nbytes = (size_t)size;
    bin->used += (size_t)size;
    return 0;
}

static int decode_input(pjs_http_infer *d, size_t i, const json_t *obj, binary_section *bin,
                        pjs_error *err)
{
    char what[WHAT_MAX];
    snprintf(what, sizeof what, "inputs[%zu]", i);
    if (!json_is_object(obj))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s must be an object", what);
    pjs_infer_input *in = &d->req.inputs[i];
    int rc = get_string(obj, "name", what, &in->name, err);
    if (rc != 0)
        return rc;
    snprintf(what, sizeof what, "input \"%.256s\"", in->name);
    const json_t *params = NULL;
    uint64_t binary_size = 0;
    bool has_binary = false;
    rc = get_string(obj, "datatype", what, &in->datatype, err);
    if (rc == 0)
        rc = decode_shape(json_object_get(obj, "shape"), what, &in->shape, err);
    if (rc == 0)
        rc = get_parameters(obj, what, &params, err);
    if (rc == 0)
        rc = get_count(params, "binary_data_size", what, &has_binary, &binary_size, err);
    if (rc == 0)
        rc = get_shm_ref(params, what, &d->input_shm[i], err);
    if (rc != 0)
        return rc;
    const json_t *data = json_object_get(obj, "data");
    int sources = (data != NULL) + has_binary + (d->input_shm[i].region != NULL);
    if (sources != 1)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: give exactly one of \"data\", parameters.binary_data_size or "
                             "parameters.shared_memory_region (%s)",
                             what, sources == 0 ? "none given" : "several given");
    if (has_binary)
        return claim_binary(bin, in, binary_size, what, err);
    if (data != NULL)
        return convert_json_data(d, in, data, what, err);
    return 0; /* shared memory: mapped by pjs_http_infer_map_shm */
}

static int decode_inputs(pjs_http_infer *d, const json_t *root, binary_section *bin,
                         pjs_error *err)
{
    const json_t *inputs = json_object_get(root, "inputs");
    if (!json_is_array(inputs))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "request: \"inputs\" must be a list of tensors");
    if (json_array_size(inputs) > PJS_INFER_MAX_TENSORS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "request: %zu inputs; the limit is %d", json_array_size(inputs),
                             PJS_INFER_MAX_TENSORS);
    for (size_t i = 0; i < json_array_size(inputs); i++) {
        d->req.n_inputs = i + 1;
        int rc = decode_input(d, i, json_array_get(inputs, i), bin, err);
        if (rc != 0)
            return rc;
    }
    if (bin->used != bin->len)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "request: the binary data after the JSON header is %zu bytes but the "
                             "inputs' binary_data_size add up to %zu",
                             bin->len, bin->used);
    return 0;
}

static int decode_output(pjs_http_infer *d, size_t k, const json_t *obj, pjs_error *err)
{
    char what[WHAT_MAX];
    snprintf(what, sizeof what, "outputs[%zu]", k);
    if (!json_is_object(obj))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s must be an object", what);
    pjs_infer_requested_output *o = &d->req.requested[k];
    int rc = get_string(obj, "name", what, &o->name, err);
    if (rc != 0)
        return rc;
    snprintf(what, sizeof what, "output \"%.256s\"", o->name);
    const json_t *params = NULL;
    pjs_http_shm_ref shm;
    bool has_classification = false;
    o->binary_data = d->req.binary_data_output;
    rc = get_parameters(obj, what, &params, err);
    if (rc == 0)
        rc = get_flag(params, "binary_data", what, &o->binary_data, err);
    if (rc == 0)
        rc = get_count(params, "classification", what, &has_classification, &o->class_count,
                       err);
    if (rc == 0 && has_classification && o->class_count == 0)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s: parameter \"classification\" must be at least 1 (the number of "
                           "classes to return), got 0",
                           what);
    if (rc == 0)
        rc = get_shm_ref(params, what, &shm, err);
    if (rc == 0 && has_classification && shm.region != NULL)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s: classification and a shared memory region cannot be combined "
                           "(the classes are strings sent in the response); ask for one or the "
                           "other",
                           what);
    if (rc != 0)
        return rc;
    o->shm_region = shm.region;
    o->shm_offset = shm.offset;
    o->shm_byte_size = shm.byte_size;
    return 0;
}

static int decode_outputs(pjs_http_infer *d, const json_t *root, pjs_error *err)
{
    const json_t *outputs = json_object_get(root, "outputs");
    if (outputs == NULL)
        return 0;
    if (!json_is_array(outputs))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "request: \"outputs\" must be a list");
    if (json_array_size(outputs) > PJS_INFER_MAX_TENSORS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "request: %zu outputs requested; the limit is %d",
                             json_array_size(outputs), PJS_INFER_MAX_TENSORS);
    for (size_t k = 0; k < json_array_size(outputs); k++) {
        d->req.n_requested = k + 1;
        int rc = decode_output(d, k, json_array_get(outputs, k), err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int pjs_http_infer_decode(pjs_http_infer *d, const void *body, size_t body_len,
                          const char *header_length, pjs_error *err)
{
    /* Only what is read before it is written: input_shm[i] and views[v] are
     * set as inputs and views are added, so a reused d is not cleared whole. */
    pjs_infer_request_init(&d->req);
    d->header = NULL;
    d->n_converted = 0;
    d->n_views = 0;
    for (size_t k = 0; k < PJS_INFER_MAX_TENSORS; k++)
        d->output_view[k] = -1;
    size_t json_len = 0;
    int rc = pjs_http_header_length(header_length, body_len, &json_len, err);
    if (rc != 0)
        return rc;
    if (json_len > PJS_HTTP_MAX_JSON)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "the JSON request is %zu bytes; the limit is %zu (send large tensors "
                             "as binary data)",
                             json_len, PJS_HTTP_MAX_JSON);
    json_error_t jerr;
    d->header = json_loadb(body, json_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (d->header == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "malformed JSON request at line %d, column %d: %s", jerr.line,
                             jerr.column, jerr.text);
    if (!json_is_object(d->header))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "the JSON request must be an object");
    binary_section bin = {
        .present = header_length != NULL,
        .base = (const unsigned char *)body + json_len,
        .len = body_len - json_len,
    };
    rc = decode_id(d, d->header, err);
    if (rc == 0)
        rc = decode_request_parameters(d, d->header, err);
    if (rc == 0)
        rc = decode_inputs(d, d->header, &bin, err);
    if (rc == 0)
        rc = decode_outputs(d, d->header, err);
    return rc;
}

/* ---- shared memory ------------------------------------------------------------ */

/* Maps one window into d->views. A region the request names but nobody
 * registered is the request's mistake (400), not a missing resource (404). */
static int map_view(pjs_http_infer *d, pjs_shm_registry *registry, const char *region,
                    uint64_t offset, uint64_t size, const char *kind, const char *name,
                    pjs_error *err)
{
    int rc = pjs_shm_view_get(registry, region, offset, size, &d->views[d->n_views], err);
    if (rc != 0) {
        if (rc == PJS_ERR_NOT_FOUND)
            err->code = rc = PJS_ERR_INVALID_ARGUMENT;
        return pjs_error_prefix(err, "%s \"%s\": ", kind, name);
    }
    d->n_views++;
    return 0;
}

int pjs_http_infer_map_shm(pjs_http_infer *d, pjs_shm_registry *registry, pjs_error *err)
{
    for (size_t i = 0; i < d->req.n_inputs; i++) {
        const pjs_http_shm_ref *ref = &d->input_shm[i];
        if (ref->region == NULL)
            continue;
        pjs_infer_input *in = &d->req.inputs[i];
        int rc = map_view(d, registry, ref->region, ref->offset, ref->byte_size, "input",
                          in->name, err);
        if (rc != 0)
            return rc;
        if ((rc = pjs_infer_input_from_shm(in, &d->views[d->n_views - 1], err)) != 0)
            return pjs_error_prefix(err, "input \"%s\": ", in->name);
    }
    for (size_t k = 0; k < d->req.n_requested; k++) {
        pjs_infer_requested_output *o = &d->req.requested[k];
        if (o->shm_region == NULL)
            continue;
        int rc = map_view(d, registry, o->shm_region, o->shm_offset, o->shm_byte_size, "output",
                          o->name, err);
        if (rc != 0)
            return rc;
        d->output_view[k] = (int)d->n_views - 1;
        o->shm_view = &d->views[d->n_views - 1];
    }
    return 0;
}

/* The produced output called `name`, or NULL. */
static const pjs_infer_output *find_output(const pjs_infer_request *r, const char *name)
{
    for (size_t j = 0; j < r->n_outputs; j++)
        if (r->outputs[j].spec != NULL && strcmp(r->outputs[j].spec->name, name) == 0)
            return &r->outputs[j];
    return NULL;
}

int pjs_http_infer_write_shm_outputs(pjs_http_infer *d, pjs_error *err)
{
    for (size_t k = 0; k < d->req.n_requested; k++) {
        if (d->output_view[k] < 0)
            continue;
        const pjs_infer_requested_output *o = &d->req.requested[k];
        const pjs_infer_output *out = find_output(&d->req, o->name);
        const pjs_shm_view *view = &d->views[d->output_view[k]];
        if (out != NULL && out->in_shm)
            continue; /* written there on the device */
        if (out == NULL || (out->data == NULL && out->nbytes > 0))
            return pjs_error_set(err, PJS_ERR_INTERNAL, "output \"%s\" was not produced",
                                 o->name);
        if (out->nbytes > view->size)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "output \"%s\" is %zu bytes but shared memory region \"%s\" "
                                 "was given %zu (shared_memory_byte_size)",
                                 o->name, out->nbytes, o->shm_region, view->size);
        if (out->nbytes > 0 && pjs_shm_view_write(view, out->data, out->nbytes, err) != 0)
            return pjs_error_prefix(err, "output \"%s\": ", o->name);
    }
    return 0;
}

void pjs_http_infer_free(pjs_http_infer *d)
{
    for (size_t v = 0; v < d->n_views; v++)
        pjs_shm_view_release(&d->views[v]);
    d->n_views = 0;
    for (size_t c = 0; c < d->n_converted; c++)
        free(d->converted[c]);
    d->n_converted = 0;
    json_decref(d->header);
    d->header = NULL;
}

/* ---- response ----------------------------------------------------------------- */

/* An output as it goes into the response. */
typedef struct sent_output {
    const pjs_infer_output *out;
    bool binary;
    const pjs_infer_requested_output *shm; /* non-NULL: written to shared memory */
} sent_output;

/* The outputs to send, in response order, into sent[]; returns the count. */
static int list_outputs(const pjs_infer_request *r, sent_output *sent, size_t *out_n,
                        pjs_error *err)
{
    size_t n = 0;
    if (r->n_requested == 0) {
        for (size_t j = 0; j < r->n_outputs; j++)
            sent[n++] = (sent_output){&r->outputs[j], r->binary_data_output, NULL};
        *out_n = n;
        return 0;
    }
    for (size_t k = 0; k < r->n_requested; k++) {
        const pjs_infer_requested_output *o = &r->requested[k];
        const pjs_infer_output *out = find_output(r, o->name);
        if (out == NULL)
            return pjs_error_set(err, PJS_ERR_INTERNAL, "requested output \"%s\" was not produced",
                                 o->name);
        sent[n++] = (sent_output){out, o->binary_data, o->shm_region ? o : NULL};
    }
    *out_n = n;
    return 0;
}

static int encode_shape(pjs_http_buf *b, const pjs_shape *s, pjs_error *err)
{
    int rc = pjs_http_buf_append_str(b, "[", err);
    for (int i = 0; rc == 0 && i < s->rank; i++)
        rc = pjs_http_buf_printf(b, err, "%s%lld", i ? "," : "", (long long)s->dims[i]);
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "]", err);
    return rc;
}

/* {"name":..,"datatype":..,"shape":[..], then data or parameters}. */
static int encode_output(pjs_http_buf *b, const sent_output *s, pjs_error *err)
{
    const pjs_infer_output *out = s->out;
    pjs_dtype dt = out->spec->dtype;
    size_t elem = pjs_dtype_size(dt);
    if (out->data == NULL && out->nbytes > 0 && !out->in_shm)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "output \"%s\" has no data",
                             out->spec->name);
    int rc = pjs_http_buf_append_str(b, "{\"name\":", err);
    if (rc == 0)
        rc = pjs_http_buf_json_string(b, out->spec->name, err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err, ",\"datatype\":\"%s\",\"shape\":",
                                 pjs_dtype_kserve_name(dt));
    if (rc == 0)
        rc = encode_shape(b, &out->shape, err);
    if (rc != 0)
        return rc;
    if (s->shm != NULL) {
        /* The bytes are in the client's region: no data and no parameters
         * (Triton's C++ client reads binary_data_size from any output that
         * has parameters). */
    } else if (s->binary) {
        rc = pjs_http_buf_printf(b, err, ",\"parameters\":{\"binary_data_size\":%zu}",
                                 out->nbytes);
    } else {
        rc = pjs_http_buf_append_str(b, ",\"data\":", err);
        if (rc == 0 && dt == PJS_DTYPE_BYTES &&
            pjs_http_bytes_to_json(b, out->data, out->nbytes, err) != 0)
            return pjs_error_prefix(err, "output \"%s\": ", out->spec->name);
        if (rc == 0 && dt != PJS_DTYPE_BYTES)
            rc = pjs_tensor_json_encode(b, dt, out->data, out->nbytes / elem, err);
    }
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "}", err);
    return rc;
}

int pjs_http_infer_encode(pjs_infer_request *r, const char *model_name,
                          const char *model_version, pjs_http_buf *out, size_t *out_header_len,
                          pjs_error *err)
{
    sent_output sent[PJS_INFER_MAX_TENSORS];
    size_t n = 0;
    *out_header_len = 0;
    int rc = pjs_classify_outputs(r, err);
    if (rc == 0)
        rc = list_outputs(r, sent, &n, err);
    if (rc == 0)
        rc = pjs_http_buf_append_str(out, "{\"model_name\":", err);
    if (rc == 0)
        rc = pjs_http_buf_json_string(out, model_name, err);
    if (rc == 0)
        rc = pjs_http_buf_append_str(out, ",\"model_version\":", err);
    if (rc == 0)
        rc = pjs_http_buf_json_string(out, model_version, err);
    if (rc == 0 && r->id != NULL && r->id[0] != '\0') {
        rc = pjs_http_buf_append_str(out, ",\"id\":", err);
        if (rc == 0)
            rc = pjs_http_buf_json_string(out, r->id, err);
    }
    if (rc == 0)
        rc = pjs_http_buf_append_str(out, ",\"outputs\":[", err);
    bool any_binary = false;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (i > 0)
            rc = pjs_http_buf_append_str(out, ",", err);
        if (rc == 0)
            rc = encode_output(out, &sent[i], err);
        any_binary = any_binary || (sent[i].binary && sent[i].shm == NULL);
    }
    if (rc == 0)
        rc = pjs_http_buf_append_str(out, "]}", err);
    if (rc != 0 || !any_binary)
        return rc;
    *out_header_len = out->len;
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (sent[i].binary && sent[i].shm == NULL)
            rc = pjs_http_buf_append(out, sent[i].out->data, sent[i].out->nbytes, err);
    return rc;
}

/* ---- content encoding and errors --------------------------------------------- */

int pjs_http_inflate(const char *content_encoding, const void *in, size_t len, pjs_http_buf *out,
                     pjs_byte_budget *budget, uint64_t *charged, bool *out_used, pjs_error *err)
{
    *out_used = false;
    *charged = 0;
    if (content_encoding == NULL || content_encoding[0] == '\0' ||
        strcasecmp(content_encoding, "identity") == 0)
        return 0;
    int window_bits;
    if (strcasecmp(content_encoding, "gzip") == 0)
        window_bits = 16 + MAX_WBITS;
    else if (strcasecmp(content_encoding, "deflate") == 0)
        window_bits = MAX_WBITS; /* HTTP's "deflate" is the zlib format */
    else
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "Content-Encoding \"%.40s\" is not supported (use gzip, deflate or "
                             "identity)",
                             content_encoding);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, window_bits) != Z_OK)
        return pjs_error_set(err, PJS_ERR_NOMEM, "cannot start inflating the request body");
    *out_used = true;
    z.next_in = (Bytef *)(uintptr_t)in;
    int rc = 0;
    int zrc = Z_OK;
    size_t left = len;
    while (rc == 0 && zrc != Z_STREAM_END) {
        if (z.avail_in == 0) {
            z.avail_in = left > UINT_MAX ? UINT_MAX : (uInt)left;
            left -= z.avail_in;
        }
        if (out->len >= out->limit) {
            rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                               "the request body inflates to more than the limit of %zu bytes",
                               out->limit);
            break;
        }
        size_t chunk = out->limit - out->len < 64 * 1024 ? out->limit - out->len : 64 * 1024;
        size_t cap = out->cap;
        rc = pjs_http_buf_reserve(out, chunk, err);
        if (rc != 0)
            break;
        /* The memory the inflated bytes take, as it grows. */
        if (budget != NULL && out->cap > cap) {
            rc = pjs_byte_budget_take_or_fail(budget, out->cap - cap, "the inflated request body",
                                              err);
            if (rc != 0)
                break;
            *charged += out->cap - cap;
        }
        size_t room = out->cap - out->len - 1;
        if (room > out->limit - out->len)
            room = out->limit - out->len;
        z.next_out = (Bytef *)out->data + out->len;
        z.avail_out = room > UINT_MAX ? UINT_MAX : (uInt)room;
        zrc = inflate(&z, Z_NO_FLUSH);
        out->len += (size_t)(z.next_out - ((Bytef *)out->data + out->len));
        if (zrc == Z_BUF_ERROR && z.avail_in == 0 && left == 0)
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "the %s request body is truncated", content_encoding);
        else if (zrc != Z_OK && zrc != Z_STREAM_END && zrc != Z_BUF_ERROR)
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "the request body is not valid %s data: %s", content_encoding,
                               z.msg ? z.msg : "corrupt stream");
    }
    if (rc == 0 && (z.avail_in > 0 || left > 0))
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "the %s request body has bytes after its end", content_encoding);
    inflateEnd(&z);
    if (rc == 0)
        out->data[out->len] = '\0';
    return rc;
}

/* ---- the size a valid request can have ---------------------------------------- */

/* Longest JSON text of one element: "false", "-128", "-2147483648", ...;
 * floating point as Python or numpy write it ("-1.2345678901234567e-308"),
 * with room to spare. */
static uint64_t element_text_max(pjs_dtype t)
{
    switch (t) {
    case PJS_DTYPE_BOOL: return 5;
    case PJS_DTYPE_U8: return 3;
    case PJS_DTYPE_I8: return 4;
    case PJS_DTYPE_U16: return 5;
    case PJS_DTYPE_I16: return 6;
    case PJS_DTYPE_U32: return 10;
    case PJS_DTYPE_I32: return 11;
    case PJS_DTYPE_U64:
    case PJS_DTYPE_I64: return 20;
    default: return 32;
    }
}

/* Per element besides its text: a comma, the brackets of nested lists
 * (at most two per dimension) and indentation. */
#define ELEMENT_SLACK_BYTES 24u
/* Per input: name, datatype, shape and parameters. */
#define INPUT_SLACK_BYTES 4096u
/* Per request: id, parameters, the list of requested outputs. */
#define REQUEST_SLACK_BYTES (64u * 1024u)

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* Bytes the inputs `in[n]` can take; UINT64_MAX: unbounded (an extent that
 * varies, strings of any length). */
static uint64_t inputs_bound(const pjs_tensor_spec *in, size_t n, int64_t max_batch)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (in[i].dtype == PJS_DTYPE_BYTES)
            return UINT64_MAX;
        uint64_t elements = 1;
        for (int d = 0; d < in[i].shape.rank; d++) {
            int64_t extent = d == 0 && in[i].batched ? max_batch : in[i].shape.dims[d];
            if (extent < 0)
                return UINT64_MAX;
            elements = mul_sat(elements, (uint64_t)extent);
        }
        uint64_t per = element_text_max(in[i].dtype) + ELEMENT_SLACK_BYTES +
                       2u * (uint64_t)in[i].shape.rank;
        total = add_sat(total, add_sat(mul_sat(elements, per), INPUT_SLACK_BYTES));
    }
    return total;
}

uint64_t pjs_http_infer_body_bound(const pjs_manifest *m, int64_t max_batch)
{
    if (max_batch < 1)
        max_batch = 1;
    size_t n_inputs = 0, n_outputs = 0;
    const pjs_tensor_spec *inputs = pjs_manifest_client_tensors(m, false, &n_inputs);
    pjs_manifest_client_tensors(m, true, &n_outputs);
    uint64_t most = inputs_bound(inputs, n_inputs, max_batch);
    for (size_t v = 0; inputs == m->inputs && v < m->n_variants; v++) {
        uint64_t b = inputs_bound(m->variants[v].inputs, m->n_inputs, max_batch);
        most = b > most ? b : most;
    }
    uint64_t outputs = mul_sat((uint64_t)n_outputs, INPUT_SLACK_BYTES);
    uint64_t bound = add_sat(most, add_sat(outputs, REQUEST_SLACK_BYTES));
    return bound == UINT64_MAX ? 0 : bound;
}

int pjs_http_error_json(const char *msg, pjs_http_buf *out, pjs_error *err)
{
    int rc = pjs_http_buf_append_str(out, "{\"error\":", err);
    if (rc == 0)
        rc = pjs_http_buf_json_string(out, msg, err);
    if (rc == 0)
        rc = pjs_http_buf_append_str(out, "}", err);
    return rc;
}
