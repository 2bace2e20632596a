/*
 * codec.c - decoding ModelInferRequest and encoding ModelInferResponse.
 *
 * The message is first split (infer_wire.h): raw_input_contents stay in the
 * bytes received and only the other fields go through protobuf-c, which
 * would copy every tensor. Decoding then runs in three passes over the
 * unpacked message: the request's parameters (timeout, which sets the
 * deadline; priority, accepted and ignored), each input (name, datatype, shape, and where its bytes are:
 * shared memory, typed contents or raw), then the requested outputs. Raw
 * bytes are matched to inputs in one of the two ways clients send them: one
 * raw_input_contents entry per input that has no other source (tritonclient),
 * or one entry per input with the entries of the other inputs empty. Typed
 * contents are read once every input's source is settled: those of 4- and
 * 8-byte types are used in place (protobuf-c unpacks them into native
 * arrays); narrower types and BOOL are converted into the arena
 * with a range check; BYTES strings in bytes_contents are serialized into
 * the arena (core/bytes.h). Raw and shared-memory BYTES inputs carry the
 * serialized form already, checked by validation.
 *
 * Encoding never copies output bytes: raw_output_contents entries point at
 * the request's outputs (a BYTES output in its serialized form, as Triton
 * sends it) and the message is packed once. An output the client asked to
 * classify ("classification" parameter) is first replaced by its classes
 * (core/classify.h).
 */
#include "frontend/grpc/codec.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/classify.h"
#include "frontend/deadline.h"
#include "frontend/grpc/infer_wire.h"

/* The value of `name` in a protobuf map<string, InferParameter> (entries
 * with `key` and `value` fields), the last one winning as in protobuf; NULL
 * when absent. A macro because each map has its own entry type. */
#define FIND_PARAM(out, entries, n_entries, name)                                                  \
    do {                                                                                           \
        (out) = NULL;                                                                              \
        for (size_t find_i = 0; find_i < (n_entries); find_i++)                                    \
            if ((entries)[find_i]->key != NULL && strcmp((entries)[find_i]->key, (name)) == 0)     \
                (out) = (entries)[find_i]->value;                                                  \
    } while (0)

#define SHM_REGION "shared_memory_region"
#define SHM_OFFSET "shared_memory_offset"
#define SHM_BYTE_SIZE "shared_memory_byte_size"

typedef Inference__InferParameter infer_param;
typedef Inference__ModelInferRequest__InferInputTensor input_tensor;
typedef Inference__ModelInferRequest__InferRequestedOutputTensor output_tensor;

/* Where an input's bytes come from. */
typedef enum input_source { SOURCE_RAW, SOURCE_CONTENTS, SOURCE_SHM } input_source;

void pjs_grpc_infer_init(pjs_grpc_infer *d)
{
    memset(d, 0, sizeof *d);
    pjs_grpc_arena_init(&d->arena, 0);
}

void pjs_grpc_infer_recycle(pjs_grpc_infer *d)
{
    for (size_t i = 0; i < d->n_input_views; i++)
        pjs_shm_view_release(&d->input_views[i]);
    for (size_t k = 0; k < PJS_INFER_MAX_TENSORS; k++)
        if (d->output_views[k].region != NULL)
            pjs_shm_view_release(&d->output_views[k]); /* zeroes it */
    d->n_input_views = 0;
    pjs_infer_request_release(&d->req);
    pjs_grpc_arena_rewind(&d->arena);
    d->msg = NULL;
    d->has_priority = false;
    d->priority = 0;
    d->has_timeout = false;
    d->timeout_us = 0;
}

void pjs_grpc_infer_release(pjs_grpc_infer *d)
{
    pjs_grpc_infer_recycle(d);
    pjs_grpc_arena_reset(&d->arena);
    pjs_grpc_infer_init(d);
}

/* ---- parameters ------------------------------------------------------------ */

/* A non-negative integer parameter sent as int64 or uint64. */
static int param_uint(const infer_param *p, const char *what, uint64_t *out, pjs_error *err)
{
    switch (p->parameter_choice_case) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        *out = p->uint64_param;
        return 0;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        if (p->int64_param < 0)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "%s must not be negative (got %" PRId64 ")", what, p->int64_param);
        *out = (uint64_t)p->int64_param;
        return 0;
    default:
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s must be an int64_param or uint64_param", what);
    }
}

static int param_string(const infer_param *p, const char *what, const char **out, pjs_error *err)
{
    if (p->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s must be a string_param", what);
    *out = p->string_param;
    return 0;
}

static int param_bool(const infer_param *p, const char *what, bool *out, pjs_error *err)
{
    if (p->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%s must be a bool_param", what);
    *out = p->bool_param;
    return 0;
}

/* sequence_id (int64, uint64 or string), sequence_start, sequence_end. */
static int decode_sequence_parameters(pjs_grpc_infer *d, pjs_error *err)
{
    const Inference__ModelInferRequest *msg = d->msg;
    pjs_infer_sequence *q = &d->req.sequence;
    const infer_param *p;
    int rc;
    FIND_PARAM(p, msg->parameters, msg->n_parameters, "sequence_id");
    if (p != NULL) {
        if (p->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM) {
            q->is_string = true;
            q->string = p->string_param;
            q->has_id = p->string_param[0] != '\0';
        } else if (param_uint(p, "parameter \"sequence_id\"", &q->number, err) != 0) {
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "parameter \"sequence_id\" must be a non-negative int64_param, "
                                 "a uint64_param or a string_param");
        } else {
            q->has_id = q->number != 0;
        }
    }
    FIND_PARAM(p, msg->parameters, msg->n_parameters, "sequence_start");
    if (p != NULL && (rc = param_bool(p, "parameter \"sequence_start\"", &q->start, err)) != 0)
        return rc;
    FIND_PARAM(p, msg->parameters, msg->n_parameters, "sequence_end");
    if (p != NULL && (rc = param_bool(p, "parameter \"sequence_end\"", &q->end, err)) != 0)
        return rc;
    return 0;
}

/* The request-level parameters pjserve reads; every other one is ignored. */
static int decode_request_parameters(pjs_grpc_infer *d, pjs_error *err)
{
    const Inference__ModelInferRequest *msg = d->msg;
    const infer_param *p;
    int rc = decode_sequence_parameters(d, err);
    if (rc != 0)
        return rc;
    FIND_PARAM(p, msg->parameters, msg->n_parameters, "priority");
    if (p != NULL) {
        if ((rc = param_uint(p, "parameter \"priority\"", &d->priority, err)) != 0)
            return rc;
        d->has_priority = true;
    }
    FIND_PARAM(p, msg->parameters, msg->n_parameters, "timeout");
    if (p != NULL) {
        if ((rc = param_uint(p, "parameter \"timeout\"", &d->timeout_us, err)) != 0)
            return rc;
        d->has_timeout = true;
        d->req.deadline_ns = pjs_deadline_from_timeout_us(d->req.times.received, d->timeout_us);
    }
    return 0;
}

/* A shared-memory window named by a tensor's parameters: region (NULL when
 * the tensor has none), offset and byte size. */
typedef struct shm_params {
    const char *region;
    uint64_t offset;
    uint64_t byte_size;
} shm_params;

/* Reads the three shared_memory_* parameters of a tensor; `kind` and `name`
 * ("input", "x") label errors. */
#define DECODE_SHM_PARAMS(rc, out, entries, n_entries, kind, name, err)                            \
    do {                                                                                           \
        const infer_param *region_ = NULL, *offset_ = NULL, *size_ = NULL;                         \
        FIND_PARAM(region_, entries, n_entries, SHM_REGION);                                       \
        FIND_PARAM(offset_, entries, n_entries, SHM_OFFSET);                                       \
        FIND_PARAM(size_, entries, n_entries, SHM_BYTE_SIZE);                                      \
        (rc) = shm_params_from(region_, offset_, size_, kind, name, &(out), err);                  \
    } while (0)

static int shm_params_from(const infer_param *region, const infer_param *offset,
                           const infer_param *byte_size, const char *kind, const char *name,
                           shm_params *out, pjs_error *err)
{
    char what[320];
    int rc;
    memset(out, 0, sizeof *out);
    if (region == NULL)
        return 0;
    snprintf(what, sizeof what, "%s \"%.256s\": parameter \"" SHM_REGION "\"", kind, name);
    if ((rc = param_string(region, what, &out->region, err)) != 0)
        return rc;
    if (byte_size == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s \"%.256s\": shared memory region \"%.256s\" is named but "
                             "\"" SHM_BYTE_SIZE "\" is missing",
                             kind, name, out->region);
    snprintf(what, sizeof what, "%s \"%.256s\": parameter \"" SHM_BYTE_SIZE "\"", kind, name);
    if ((rc = param_uint(byte_size, what, &out->byte_size, err)) != 0)
        return rc;
    if (offset != NULL) {
        snprintf(what, sizeof what, "%s \"%.256s\": parameter \"" SHM_OFFSET "\"", kind, name);
        if ((rc = param_uint(offset, what, &out->offset, err)) != 0)
            return rc;
    }
    return 0;
}

static int get_shm_view(pjs_shm_registry *shm, const shm_params *sp, const char *kind,
                        const char *name, pjs_shm_view *out, pjs_error *err)
{
    if (shm == NULL)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "%s \"%.256s\": shared memory is not available here", kind, name);
    int rc = pjs_shm_view_get(shm, sp->region, sp->offset, sp->byte_size, out, err);
    if (rc != 0)
        return pjs_error_prefix(err, "%s \"%.256s\": ", kind, name);
    return 0;
}

/* ---- typed contents ------------------------------------------------------- */

/* Elements in every field of c, and the name of a non-empty field that is
 * not `expected` (NULL when there is none). */
static size_t contents_count(const Inference__InferTensorContents *c, const char *expected,
                             const char **stray)
{
    const struct {
        const char *name;
        size_t n;
    } fields[] = {
        {"bool_contents", c->n_bool_contents},     {"int_contents", c->n_int_contents},
        {"int64_contents", c->n_int64_contents},   {"uint_contents", c->n_uint_contents},
        {"uint64_contents", c->n_uint64_contents}, {"fp32_contents", c->n_fp32_contents},
        {"fp64_contents", c->n_fp64_contents},     {"bytes_contents", c->n_bytes_contents},
    };
    size_t total = 0;
    *stray = NULL;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        total += fields[i].n;
        if (fields[i].n > 0 && *stray == NULL &&
            (expected == NULL || strcmp(fields[i].name, expected) != 0))
            *stray = fields[i].name;
    }
    return total;
}

/* The typed field that carries elements of dt, or NULL (FP16, BF16). */
static const char *contents_field_for(pjs_dtype dt)
{
    switch (dt) {
    case PJS_DTYPE_BOOL: return "bool_contents";
    case PJS_DTYPE_I8:
    case PJS_DTYPE_I16:
    case PJS_DTYPE_I32: return "int_contents";
    case PJS_DTYPE_I64: return "int64_contents";
    case PJS_DTYPE_U8:
    case PJS_DTYPE_U16:
    case PJS_DTYPE_U32: return "uint_contents";
    case PJS_DTYPE_U64: return "uint64_contents";
    case PJS_DTYPE_F32: return "fp32_contents";
    case PJS_DTYPE_F64: return "fp64_contents";
    case PJS_DTYPE_BYTES: return "bytes_contents";
    default: return NULL;
    }
}

/* Narrows int_contents / uint_contents to 1- or 2-byte elements, refusing
 * values out of range; BOOL becomes one byte per element. */
static int contents_narrow(pjs_grpc_infer *d, const input_tensor *t, pjs_dtype dt, size_t n,
                           void **out, pjs_error *err)
{
    const Inference__InferTensorContents *c = t->contents;
    size_t elem = pjs_dtype_size(dt);
    unsigned char *buf = pjs_grpc_arena_alloc(&d->arena, n * elem);
    if (buf == NULL)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "input \"%.256s\": no memory to convert %zu elements", t->name, n);
    for (size_t i = 0; i < n; i++) {
        int64_t v = 0, lo = 0, hi = 0;
        switch (dt) {
        case PJS_DTYPE_BOOL:
            v = c->bool_contents[i] ? 1 : 0;
            lo = 0;
            hi = 1;
            break;
        case PJS_DTYPE_I8:
            v = c->int_contents[i];
            lo = INT8_MIN;
            hi = INT8_MAX;
            break;
        case PJS_DTYPE_I16:
            v = c->int_contents[i];
            lo = INT16_MIN;
            hi = INT16_MAX;
            break;
        case PJS_DTYPE_U8:
            v = c->uint_contents[i];
            lo = 0;
            hi = UINT8_MAX;
            break;
        default:
            v = c->uint_contents[i];
            lo = 0;
            hi = UINT16_MAX;
            break; /* U16 */
        }
        if (v < lo || v > hi)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "input \"%.256s\": element %zu (%" PRId64 ") does not fit %s",
                                 t->name, i, v, pjs_dtype_kserve_name(dt));
        if (elem == 1) {
            buf[i] = (unsigned char)(uint8_t)v;
        } else {
            uint16_t v16 = (uint16_t)v;
            memcpy(buf + 2 * i, &v16, 2);
        }
    }
    *out = buf;
    return 0;
}

/* bytes_contents, one element per string, serialized into the arena
 * (core/bytes.h), which lives as long as the decoded message. */
static int contents_serialize_bytes(pjs_grpc_infer *d, const input_tensor *t,
                                    pjs_infer_input *in, pjs_error *err)
{
    const Inference__InferTensorContents *c = t->contents;
    size_t size = 0;
    for (size_t i = 0; i < c->n_bytes_contents; i++)
        if (!pjs_bytes_add_size(&size, c->bytes_contents[i].len))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "input \"%.256s\": bytes_contents[%zu] is %zu bytes, more than "
                                 "a BYTES element holds",
                                 t->name, i, c->bytes_contents[i].len);
    unsigned char *buf = pjs_grpc_arena_alloc(&d->arena, size);
    if (buf == NULL && size > 0)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "input \"%.256s\": no memory to serialize %zu strings (%zu bytes)",
                             t->name, c->n_bytes_contents, size);
    pjs_bytes_writer w = pjs_bytes_writer_init(buf, size);
    for (size_t i = 0; i < c->n_bytes_contents; i++)
        if (!pjs_bytes_put(&w, c->bytes_contents[i].data, c->bytes_contents[i].len))
            return pjs_error_set(err, PJS_ERR_INTERNAL,
                                 "input \"%.256s\": bytes_contents[%zu] did not fit", t->name, i);
    in->data = buf;
    in->nbytes = size;
    return 0;
}

/* Sets in->data / nbytes from the input's typed contents. A datatype or
 * shape that cannot be sized is left for pjs_infer_validate to report
 * (no data), as it words those errors against the model. */
static int decode_contents(pjs_grpc_infer *d, const input_tensor *t, pjs_infer_input *in,
                           pjs_error *err)
{
    const Inference__InferTensorContents *c = t->contents;
    pjs_dtype dt = pjs_dtype_from_kserve(t->datatype, strlen(t->datatype));
    int64_t numel;
    if (dt == PJS_DTYPE_INVALID || !pjs_shape_numel(&in->shape, &numel))
        return 0;
    const char *field = contents_field_for(dt);
    const char *stray;
    size_t total = contents_count(c, field, &stray);
    if (field == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "input \"%.256s\": %s has no typed contents field; send it in "
                             "raw_input_contents",
                             t->name, pjs_dtype_kserve_name(dt));
    if (stray != NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "input \"%.256s\": %s elements belong in %s, not %s", t->name,
                             pjs_dtype_kserve_name(dt), field, stray);
    if ((uint64_t)numel != total)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "input \"%.256s\": %s holds %zu elements but the shape has %" PRId64,
                             t->name, field, total, numel);
    if (dt == PJS_DTYPE_BYTES)
        return contents_serialize_bytes(d, t, in, err);
    void *data = NULL;
    switch (dt) {
    case PJS_DTYPE_I32: data = c->int_contents; break;
    case PJS_DTYPE_I64: data = c->int64_contents; break;
    case PJS_DTYPE_U32: data = c->uint_contents; break;
    case PJS_DTYPE_U64: data = c->uint64_contents; break;
    case PJS_DTYPE_F32: data = c->fp32_contents; break;
    case PJS_DTYPE_F64: data = c->fp64_contents; break;
    default: {
        int rc = contents_narrow(d, t, dt, total, &data, err);
        if (rc != 0)
            return rc;
    }
    }
    in->data = data;
    in->nbytes = total * pjs_dtype_size(dt);
    return 0;
}

/* True when the input carries at least one typed element. */
static bool has_contents(const input_tensor *t)
{
    const char *stray;
    return t->contents != NULL && contents_count(t->contents, NULL, &stray) > 0;
}

/* ---- inputs and outputs --------------------------------------------------- */

static int decode_input(pjs_grpc_infer *d, const input_tensor *t, pjs_shm_registry *shm,
                        pjs_infer_input *in, input_source *src, pjs_error *err)
{
    in->name = t->name;
    in->datatype = t->datatype;
    if (t->n_shape > PJS_MAX_RANK)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "input \"%.256s\": rank %zu is more than pjserve's limit of %d",
                             t->name, t->n_shape, PJS_MAX_RANK);
    in->shape.rank = (int)t->n_shape;
    for (size_t k = 0; k < t->n_shape; k++)
        in->shape.dims[k] = t->shape[k];

    shm_params sp;
    int rc;
    DECODE_SHM_PARAMS(rc, sp, t->parameters, t->n_parameters, "input", t->name, err);
    if (rc != 0)
        return rc;
    if (sp.region != NULL) {
        if (has_contents(t))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "input \"%.256s\" names a shared memory region and also has "
                                 "contents",
                                 t->name);
        pjs_shm_view *view = &d->input_views[d->n_input_views];
        if ((rc = get_shm_view(shm, &sp, "input", t->name, view, err)) != 0)
            return rc;
        d->n_input_views++;
        *src = SOURCE_SHM;
        if ((rc = pjs_infer_input_from_shm(in, view, err)) != 0)
            return pjs_error_prefix(err, "input \"%.256s\": ", t->name);
        return 0;
    }
    *src = has_contents(t) ? SOURCE_CONTENTS : SOURCE_RAW;
    return 0;
}

/* Triton's words for typed contents beside raw_input_contents (its clients
 * look for them), then how to fix the request. */
static int contents_beside_raw(const Inference__ModelInferRequest *msg, size_t i, pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "contents field must not be specified when using raw_input_contents "
                         "for '%.256s' for model '%.256s' (give each input its bytes one way: "
                         "every input in raw_input_contents, or every input in typed contents, "
                         "not both)",
                         msg->inputs[i]->name, msg->model_name);
}

/* Hands raw_input_contents to the inputs marked SOURCE_RAW (see the file
 * comment for the two layouts accepted). */
static int assign_raw_inputs(pjs_grpc_infer *d, const input_source *src, pjs_error *err)
{
    const Inference__ModelInferRequest *msg = d->msg;
    size_t n_inputs = msg->n_inputs, n_raw = msg->n_raw_input_contents, n_want = 0;
    for (size_t i = 0; i < n_inputs; i++)
        n_want += src[i] == SOURCE_RAW;
    bool positional = n_raw != n_want && n_raw == n_inputs;
    if (n_raw != n_want && !positional) {
        for (size_t i = 0; i < n_inputs && n_raw == 0; i++)
            if (src[i] == SOURCE_RAW)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "input \"%.256s\" has no data: no raw_input_contents, "
                                     "contents or shared memory region",
                                     msg->inputs[i]->name);
        for (size_t i = 0; i < n_inputs; i++)
            if (src[i] == SOURCE_CONTENTS)
                return contents_beside_raw(msg, i, err);
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "ModelInferRequest has %zu raw_input_contents but %zu of its %zu "
                             "inputs take their data from there",
                             n_raw, n_want, n_inputs);
    }
    size_t next = 0;
    for (size_t i = 0; i < n_inputs; i++) {
        size_t k = positional ? i : next;
        if (src[i] != SOURCE_RAW) {
            if (positional && msg->raw_input_contents[k].len > 0 && src[i] == SOURCE_CONTENTS)
                return contents_beside_raw(msg, i, err);
            if (positional && msg->raw_input_contents[k].len > 0)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "input \"%.256s\" has a shared memory region and also "
                                     "%zu bytes in raw_input_contents[%zu]: give each input its "
                                     "bytes one way, not both",
                                     msg->inputs[i]->name, msg->raw_input_contents[k].len, k);
            continue;
        }
        d->req.inputs[i].data = msg->raw_input_contents[k].data;
        d->req.inputs[i].nbytes = msg->raw_input_contents[k].len;
        next++;
    }
    return 0;
}

static int decode_inputs(pjs_grpc_infer *d, pjs_shm_registry *shm, pjs_error *err)
{
    const Inference__ModelInferRequest *msg = d->msg;
    input_source src[PJS_INFER_MAX_TENSORS];
    if (msg->n_inputs > PJS_INFER_MAX_TENSORS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "ModelInferRequest has %zu inputs; pjserve takes at most %d",
                             msg->n_inputs, PJS_INFER_MAX_TENSORS);
    for (size_t i = 0; i < msg->n_inputs; i++) {
        int rc = decode_input(d, msg->inputs[i], shm, &d->req.inputs[i], &src[i], err);
        d->req.n_inputs = i + 1;
        if (rc != 0)
            return rc;
    }
    /* Where each input's bytes come from is settled before typed contents
     * are read, so contents beside raw_input_contents are refused as such
     * rather than for their element count. */
    int rc = assign_raw_inputs(d, src, err);
    for (size_t i = 0; i < msg->n_inputs && rc == 0; i++)
        if (src[i] == SOURCE_CONTENTS)
            rc = decode_contents(d, msg->inputs[i], &d->req.inputs[i], err);
    return rc;
}

/* The "classification" parameter of a requested output: how many classes
 * to return instead of the tensor (core/classify.h), at least 1. */
static int decode_class_count(const infer_param *p, const char *name, uint64_t *out,
                              pjs_error *err)
{
    char what[320];
    snprintf(what, sizeof what, "output \"%.256s\": parameter \"classification\"", name);
    int rc = param_uint(p, what, out, err);
    if (rc == 0 && *out == 0)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "%s must be at least 1 (the number of classes to return), got 0",
                           what);
    return rc;
}

static int decode_outputs(pjs_grpc_infer *d, pjs_shm_registry *shm, pjs_error *err)
{
    const Inference__ModelInferRequest *msg = d->msg;
    if (msg->n_outputs > PJS_INFER_MAX_TENSORS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "ModelInferRequest requests %zu outputs; pjserve has at most %d",
                             msg->n_outputs, PJS_INFER_MAX_TENSORS);
    for (size_t k = 0; k < msg->n_outputs; k++) {
        const output_tensor *t = msg->outputs[k];
        pjs_infer_requested_output *ro = &d->req.requested[k];
        const infer_param *classification;
        shm_params sp;
        int rc;
        d->req.n_requested = k + 1;
        ro->name = t->name;
        FIND_PARAM(classification, t->parameters, t->n_parameters, "classification");
        if (classification != NULL &&
            (rc = decode_class_count(classification, t->name, &ro->class_count, err)) != 0)
            return rc;
        DECODE_SHM_PARAMS(rc, sp, t->parameters, t->n_parameters, "output", t->name, err);
        if (rc != 0)
            return rc;
        if (sp.region == NULL)
            continue;
        if (classification != NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "output \"%.256s\": classification and a shared memory region "
                                 "cannot be combined (the classes are strings sent in the "
                                 "response); ask for one or the other",
                                 t->name);
        if ((rc = get_shm_view(shm, &sp, "output", t->name, &d->output_views[k], err)) != 0)
            return rc;
        ro->shm_region = sp.region;
        ro->shm_offset = sp.offset;
        ro->shm_byte_size = sp.byte_size;
        ro->shm_view = &d->output_views[k];
    }
    return 0;
}

int pjs_grpc_infer_decode(pjs_grpc_infer *d, const uint8_t *data, size_t len, pjs_shm_registry *shm,
                          pjs_error *err)
{
    size_t room = (SIZE_MAX - PJS_GRPC_DECODE_SLACK) / PJS_GRPC_DECODE_FACTOR;
    d->arena.limit = len > room ? SIZE_MAX : len * PJS_GRPC_DECODE_FACTOR + PJS_GRPC_DECODE_SLACK;
    pjs_infer_request_init(&d->req);
    pjs_grpc_wire_split split;
    int rc = pjs_grpc_wire_split_request(data, len, &d->arena, &split, err);
    if (rc != 0)
        return rc;
    d->msg = inference__model_infer_request__unpack(&d->arena.allocator, split.rest_len,
                                                    split.rest);
    if (d->msg == NULL) {
        if (d->arena.exhausted)
            return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                                 "decoding this %zu-byte ModelInferRequest needs more than "
                                 "%zu bytes of memory; send tensors in raw_input_contents",
                                 len, d->arena.limit);
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "malformed ModelInferRequest: the %zu bytes received are not a "
                             "valid protobuf ModelInferRequest",
                             len);
    }
    d->msg->raw_input_contents = split.raw;
    d->msg->n_raw_input_contents = split.n_raw;
    d->req.id = d->msg->id; /* lives in the arena with the message */
    rc = decode_request_parameters(d, err);
    if (rc == 0)
        rc = decode_inputs(d, shm, err);
    if (rc == 0)
        rc = decode_outputs(d, shm, err);
    if (rc != 0 && d->msg->model_name[0] != '\0')
        pjs_error_prefix(err, "model %.256s: ", d->msg->model_name);
    return rc;
}

/* ---- response ------------------------------------------------------------- */

typedef Inference__ModelInferResponse__InferOutputTensor output_out;
typedef Inference__ModelInferResponse__InferOutputTensor__ParametersEntry output_param_entry;

static output_param_entry *output_param(pjs_grpc_arena *a, const char *key)
{
    output_param_entry *e = pjs_grpc_arena_alloc(a, sizeof *e);
    infer_param *v = pjs_grpc_arena_alloc(a, sizeof *v);
    if (e == NULL || v == NULL)
        return NULL;
    *e = (output_param_entry)
        INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__PARAMETERS_ENTRY__INIT;
    *v = (infer_param)INFERENCE__INFER_PARAMETER__INIT;
    e->key = (char *)key;
    e->value = v;
    return e;
}

/* Copies an output into the client's region and notes where it went. */
static int output_to_shm(pjs_grpc_infer *d, const pjs_infer_output *o, size_t k, output_out *t,
                         pjs_error *err)
{
    const pjs_shm_view *view = &d->output_views[k];
    const pjs_infer_requested_output *ro = &d->req.requested[k];
    if (o->nbytes > view->size)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "output \"%s\" is %zu bytes but shared memory region \"%.256s\" "
                             "was given %zu",
                             o->spec->name, o->nbytes, ro->shm_region, view->size);
    if (!o->in_shm && o->data != NULL && o->nbytes > 0 &&
        pjs_shm_view_write(view, o->data, o->nbytes, err) != 0)
        return pjs_error_prefix(err, "output \"%s\": ", o->spec->name);
    output_param_entry *region = output_param(&d->arena, SHM_REGION);
    output_param_entry *size = output_param(&d->arena, SHM_BYTE_SIZE);
    t->parameters = pjs_grpc_arena_alloc(&d->arena, 2 * sizeof *t->parameters);
    if (region == NULL || size == NULL || t->parameters == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the response");
    region->value->parameter_choice_case =
        INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    region->value->string_param = (char *)ro->shm_region;
    size->value->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    size->value->int64_param = (int64_t)o->nbytes;
    t->parameters[0] = region;
    t->parameters[1] = size;
    t->n_parameters = 2;
    return 0;
}

static int encode_output(pjs_grpc_infer *d, const pjs_infer_output *o, output_out **out,
                         ProtobufCBinaryData *raw, pjs_error *err)
{
    output_out *t = pjs_grpc_arena_alloc(&d->arena, sizeof *t);
    int64_t *dims = pjs_grpc_arena_alloc(&d->arena, sizeof(int64_t) * (size_t)o->shape.rank);
    if (t == NULL || dims == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the response");
    *t = (output_out)INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__INIT;
    t->name = o->spec->name;
    t->datatype = (char *)pjs_dtype_kserve_name(o->spec->dtype);
    memcpy(dims, o->shape.dims, sizeof(int64_t) * (size_t)o->shape.rank);
    t->shape = dims;
    t->n_shape = (size_t)o->shape.rank;
    *out = t;
    raw->len = 0;
    raw->data = NULL;
    if (o->requested >= 0 && d->req.requested[o->requested].shm_region != NULL)
        return output_to_shm(d, o, (size_t)o->requested, t, err);
    raw->len = o->nbytes;
    raw->data = o->data;
    return 0;
}

int pjs_grpc_infer_response(pjs_grpc_infer *d, const char *model_version,
                            Inference__ModelInferResponse **out, pjs_error *err)
{
    const pjs_infer_request *r = &d->req;
    int classified = pjs_classify_outputs(&d->req, err);
    if (classified != 0)
        return classified;
    Inference__ModelInferResponse *resp = pjs_grpc_arena_alloc(&d->arena, sizeof *resp);
    size_t n = r->n_outputs;
    output_out **outputs = pjs_grpc_arena_alloc(&d->arena, sizeof *outputs * n);
    ProtobufCBinaryData *raw = pjs_grpc_arena_alloc(&d->arena, sizeof *raw * n);
    if (resp == NULL || outputs == NULL || raw == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the response");
    *resp = (Inference__ModelInferResponse)INFERENCE__MODEL_INFER_RESPONSE__INIT;
    resp->model_name = d->msg->model_name;
    resp->model_version = (char *)model_version;
    resp->id = d->msg->id;
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        const pjs_infer_output *o = &r->outputs[i];
        if (r->n_requested > 0 && o->requested < 0)
            continue;
        int rc = encode_output(d, o, &outputs[sent], &raw[sent], err);
        if (rc != 0)
            return rc;
        sent++;
    }
    resp->outputs = outputs;
    resp->n_outputs = sent;
    resp->raw_output_contents = raw;
    resp->n_raw_output_contents = sent;
    *out = resp;
    return 0;
}

int pjs_grpc_packed_size(const ProtobufCMessage *m, size_t *len, pjs_error *err)
{
    *len = protobuf_c_message_get_packed_size(m);
    if (*len > PJS_GRPC_MAX_MESSAGE)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "the %s would be %zu bytes, more than gRPC's limit of %d",
                             m->descriptor->short_name, *len, PJS_GRPC_MAX_MESSAGE);
    return 0;
}

int pjs_grpc_pack(const ProtobufCMessage *m, uint8_t **out, size_t *out_len, pjs_error *err)
{
    size_t len;
    int rc = pjs_grpc_packed_size(m, &len, err);
    if (rc != 0)
        return rc;
    uint8_t *buf = malloc(len > 0 ? len : 1);
    if (buf == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for a %zu-byte %s", len,
                             m->descriptor->short_name);
    protobuf_c_message_pack(m, buf);
    *out = buf;
    *out_len = len;
    return 0;
}
