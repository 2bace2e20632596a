/*
 * request.c - inference requests as the caller builds them, results as
 * the decoders fill them, and the datatype and BYTES helpers.
 *
 * A request owns copies of everything given to it (names, shapes, tensor
 * bytes), so the caller's buffers are free as soon as a call returns;
 * checks that need only the request (a known datatype, bytes that match
 * the shape) are made as inputs are added, so that the mistake is
 * reported where it was made. Checks against the model are the server's.
 */
#include "client/internal.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/bytes.h"
#include "core/dtype.h"

size_t pjs_client_datatype_size(const char *datatype)
{
    if (datatype == NULL)
        return 0;
    return pjs_dtype_size(pjs_dtype_from_kserve(datatype, strlen(datatype)));
}

static bool datatype_known(const char *datatype)
{
    return pjs_dtype_from_kserve(datatype, strlen(datatype)) != PJS_DTYPE_INVALID;
}

bool pjsc_shape_elements(const int64_t *shape, size_t rank, uint64_t *out)
{
    uint64_t n = 1;
    for (size_t i = 0; i < rank; i++) {
        if (shape[i] < 0)
            return false;
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d)
            return false;
        n *= d;
    }
    *out = n;
    return true;
}

bool pjsc_bytes_count(const void *data, size_t nbytes, uint64_t *count)
{
    return pjs_bytes_count(data, nbytes, count, NULL) == 0;
}

/* ---- BYTES ------------------------------------------------------------------------ */

int pjs_client_bytes_pack(const char *const *elements, const size_t *lengths, size_t count,
                          void **out, size_t *nbytes, pjs_client_error *err)
{
    *out = NULL;
    *nbytes = 0;
    size_t total = 0;
    for (size_t i = 0; i < count; i++)
        if (!pjs_bytes_add_size(&total, lengths[i]))
            return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                             "element %zu of %zu bytes does not fit a BYTES tensor", i,
                             lengths[i]);
    void *buf = malloc(total > 0 ? total : 1);
    if (buf == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED,
                         "no memory for a BYTES tensor of %zu bytes", total);
    pjs_bytes_writer w = pjs_bytes_writer_init(buf, total);
    for (size_t i = 0; i < count; i++)
        pjs_bytes_put(&w, elements[i], lengths[i]);
    *out = buf;
    *nbytes = total;
    pjsc_ok(err);
    return 0;
}

int pjs_client_bytes_next(const void *data, size_t nbytes, size_t *offset, const char **element,
                          size_t *length)
{
    if (*offset >= nbytes)
        return 0;
    pjs_bytes_reader r = pjs_bytes_reader_init((const unsigned char *)data + *offset,
                                               nbytes - *offset);
    const unsigned char *s;
    uint32_t len;
    if (!pjs_bytes_next(&r, &s, &len))
        return -1;
    *element = (const char *)s;
    *length = len;
    *offset = (size_t)(r.at - (const unsigned char *)data);
    return 1;
}

/* ---- requests ------------------------------------------------------------------------ */

#define NOMEM(err) pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for the request")

int pjs_client_request_new(const char *model, pjs_client_request **out, pjs_client_error *err)
{
    *out = NULL;
    if (model == NULL || model[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "a request needs a model name");
    pjs_client_request *r = calloc(1, sizeof *r);
    if (r == NULL || (r->model = pjsc_strdup(model)) == NULL) {
        free(r);
        return NOMEM(err);
    }
    *out = r;
    pjsc_ok(err);
    return 0;
}

static void input_free(pjsc_input *in)
{
    free(in->name);
    free(in->datatype);
    free(in->shape);
    free(in->data);
    free(in->shm_region);
}

void pjs_client_request_free(pjs_client_request *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n_params; i++) {
        free(r->params[i].key);
        free(r->params[i].s);
    }
    for (size_t i = 0; i < r->n_inputs; i++)
        input_free(&r->inputs[i]);
    pjsc_output_reqs_free(r->outputs, r->n_outputs);
    free(r->params);
    free(r->inputs);
    free(r->model);
    free(r->version);
    free(r->id);
    free(r);
}

static int replace_string(char **slot, const char *value, pjs_client_error *err)
{
    char *copy = NULL;
    if (value != NULL && value[0] != '\0' && (copy = pjsc_strdup(value)) == NULL)
        return NOMEM(err);
    free(*slot);
    *slot = copy;
    pjsc_ok(err);
    return 0;
}

int pjs_client_request_set_version(pjs_client_request *r, const char *version,
                                   pjs_client_error *err)
{
    return replace_string(&r->version, version, err);
}

int pjs_client_request_set_id(pjs_client_request *r, const char *id, pjs_client_error *err)
{
    return replace_string(&r->id, id, err);
}

int pjs_client_request_set_timeout_ms(pjs_client_request *r, uint32_t timeout_ms,
                                      pjs_client_error *err)
{
    r->timeout_ms = timeout_ms;
    pjsc_ok(err);
    return 0;
}

/* The parameter slot for key: the existing one (its old string freed) or
 * a new one. */
static int param_slot(pjs_client_request *r, const char *key, pjsc_param **out,
                      pjs_client_error *err)
{
    if (key == NULL || key[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "a parameter needs a name");
    for (size_t i = 0; i < r->n_params; i++) {
        if (strcmp(r->params[i].key, key) == 0) {
            free(r->params[i].s);
            r->params[i].s = NULL;
            *out = &r->params[i];
            return 0;
        }
    }
    pjsc_param *grown = realloc(r->params, (r->n_params + 1) * sizeof *grown);
    if (grown == NULL)
        return NOMEM(err);
    r->params = grown;
    pjsc_param *p = &r->params[r->n_params];
    memset(p, 0, sizeof *p);
    if ((p->key = pjsc_strdup(key)) == NULL)
        return NOMEM(err);
    r->n_params++;
    *out = p;
    return 0;
}

int pjs_client_request_set_parameter_int(pjs_client_request *r, const char *key, int64_t value,
                                         pjs_client_error *err)
{
    pjsc_param *p;
    int rc = param_slot(r, key, &p, err);
    if (rc != 0)
        return rc;
    p->kind = PJSC_PARAM_INT;
    p->i = value;
    pjsc_ok(err);
    return 0;
}

int pjs_client_request_set_parameter_bool(pjs_client_request *r, const char *key, int value,
                                          pjs_client_error *err)
{
    pjsc_param *p;
    int rc = param_slot(r, key, &p, err);
    if (rc != 0)
        return rc;
    p->kind = PJSC_PARAM_BOOL;
    p->i = value != 0;
    pjsc_ok(err);
    return 0;
}

int pjs_client_request_set_parameter_string(pjs_client_request *r, const char *key,
                                            const char *value, pjs_client_error *err)
{
    if (value == NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "parameter %s: no value given", key);
    pjsc_param *p;
    int rc = param_slot(r, key, &p, err);
    if (rc != 0)
        return rc;
    p->kind = PJSC_PARAM_STRING;
    if ((p->s = pjsc_strdup(value)) == NULL)
        return NOMEM(err);
    pjsc_ok(err);
    return 0;
}

/* Checks the parts every input has and appends a slot holding copies of
 * them; *out is the new input. */
static int add_input(pjs_client_request *r, const char *name, const char *datatype,
                     const int64_t *shape, size_t rank, pjsc_input **out, pjs_client_error *err)
{
    if (name == NULL || name[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "an input needs a name");
    if (datatype == NULL || !datatype_known(datatype))
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "input %s: unknown datatype %.40s (use a KServe name: FP32, INT64, "
                         "BYTES, ...)",
                         name, datatype ? datatype : "(none)");
    uint64_t elements;
    if ((rank > 0 && shape == NULL) || !pjsc_shape_elements(shape, rank, &elements))
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "input %s: the shape must have non-negative extents", name);
    for (size_t i = 0; i < r->n_inputs; i++)
        if (strcmp(r->inputs[i].name, name) == 0)
            return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "input %s was already added",
                             name);
    pjsc_input *grown = realloc(r->inputs, (r->n_inputs + 1) * sizeof *grown);
    if (grown == NULL)
        return NOMEM(err);
    r->inputs = grown;
    pjsc_input *in = &r->inputs[r->n_inputs];
    memset(in, 0, sizeof *in);
    in->rank = rank;
    in->name = pjsc_strdup(name);
    in->datatype = pjsc_strdup(datatype);
    in->shape = malloc((rank ? rank : 1) * sizeof *in->shape);
    if (in->name == NULL || in->datatype == NULL || in->shape == NULL) {
        input_free(in);
        return NOMEM(err);
    }
    if (rank > 0)
        memcpy(in->shape, shape, rank * sizeof *shape);
    for (char *p = in->datatype; *p; p++)
        if (*p >= 'a' && *p <= 'z')
            *p = (char)(*p - 'a' + 'A');
    r->n_inputs++;
    *out = in;
    return 0;
}

/* Whether nbytes of data are the shape's elements of the datatype. */
static int check_input_bytes(const char *name, const char *datatype, const int64_t *shape,
                             size_t rank, const void *data, size_t nbytes, pjs_client_error *err)
{
    uint64_t elements = 0;
    pjsc_shape_elements(shape, rank, &elements);
    size_t size = pjs_client_datatype_size(datatype);
    if (size == 0) {
        uint64_t count;
        if (!pjsc_bytes_count(data, nbytes, &count))
            return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                             "input %s: the BYTES data is not well formed (each element a "
                             "4-byte little-endian length, then its bytes; see "
                             "pjs_client_bytes_pack)",
                             name);
        if (count != elements)
            return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                             "input %s: the BYTES data holds %llu elements, the shape %llu", name,
                             (unsigned long long)count, (unsigned long long)elements);
        return 0;
    }
    if (elements > UINT64_MAX / size || elements * size != nbytes)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "input %s: %zu bytes given, the shape's %llu %s elements are %llu bytes",
                         name, nbytes, (unsigned long long)elements, datatype,
                         (unsigned long long)(elements * size));
    return 0;
}

int pjs_client_request_add_input(pjs_client_request *r, const char *name, const char *datatype,
                                 const int64_t *shape, size_t rank, const void *data,
                                 size_t nbytes, pjs_client_error *err)
{
    if (data == NULL && nbytes > 0)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "input %s: no data given",
                         name ? name : "");
    pjsc_input *in = NULL;
    int rc = add_input(r, name, datatype, shape, rank, &in, err);
    if (rc == 0)
        rc = check_input_bytes(in->name, in->datatype, shape, rank, data, nbytes, err);
    if (rc == 0) {
        in->data = malloc(nbytes > 0 ? nbytes : 1);
        if (in->data == NULL)
            rc = NOMEM(err);
        else if (nbytes > 0)
            memcpy(in->data, data, nbytes);
        in->nbytes = nbytes;
    }
    if (rc != 0 && in != NULL) {
        input_free(in);
        r->n_inputs--;
    }
    if (rc == 0)
        pjsc_ok(err);
    return rc;
}

int pjs_client_request_add_input_shm(pjs_client_request *r, const char *name,
                                     const char *datatype, const int64_t *shape, size_t rank,
                                     const char *region, uint64_t offset, uint64_t byte_size,
                                     pjs_client_error *err)
{
    if (region == NULL || region[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "input %s: no region named",
                         name ? name : "");
    pjsc_input *in;
    int rc = add_input(r, name, datatype, shape, rank, &in, err);
    if (rc != 0)
        return rc;
    if ((in->shm_region = pjsc_strdup(region)) == NULL) {
        input_free(in);
        r->n_inputs--;
        return NOMEM(err);
    }
    in->shm_offset = offset;
    in->shm_byte_size = byte_size;
    pjsc_ok(err);
    return 0;
}

static int add_output(pjs_client_request *r, const char *name, const char *region,
                      uint64_t offset, uint64_t byte_size, pjs_client_error *err)
{
    if (name == NULL || name[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "an output needs a name");
    for (size_t i = 0; i < r->n_outputs; i++)
        if (strcmp(r->outputs[i].name, name) == 0)
            return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "output %s was already asked for",
                             name);
    pjsc_output_req *grown = realloc(r->outputs, (r->n_outputs + 1) * sizeof *grown);
    if (grown == NULL)
        return NOMEM(err);
    r->outputs = grown;
    pjsc_output_req *o = &r->outputs[r->n_outputs];
    memset(o, 0, sizeof *o);
    o->name = pjsc_strdup(name);
    o->shm_region = region ? pjsc_strdup(region) : NULL;
    if (o->name == NULL || (region != NULL && o->shm_region == NULL)) {
        free(o->name);
        free(o->shm_region);
        return NOMEM(err);
    }
    o->shm_offset = offset;
    o->shm_byte_size = byte_size;
    r->n_outputs++;
    pjsc_ok(err);
    return 0;
}

int pjs_client_request_add_output(pjs_client_request *r, const char *name, pjs_client_error *err)
{
    return add_output(r, name, NULL, 0, 0, err);
}

int pjs_client_request_add_output_shm(pjs_client_request *r, const char *name,
                                      const char *region, uint64_t offset, uint64_t byte_size,
                                      pjs_client_error *err)
{
    if (region == NULL || region[0] == '\0')
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "output %s: no region named",
                         name ? name : "");
    return add_output(r, name, region, offset, byte_size, err);
}

int pjsc_output_reqs_copy(const pjs_client_request *req, pjsc_output_req **out, size_t *n,
                          pjs_client_error *err)
{
    *out = NULL;
    *n = 0;
    if (req->n_outputs == 0)
        return 0;
    pjsc_output_req *copy = calloc(req->n_outputs, sizeof *copy);
    if (copy == NULL)
        return NOMEM(err);
    for (size_t i = 0; i < req->n_outputs; i++) {
        const pjsc_output_req *o = &req->outputs[i];
        copy[i] = *o;
        copy[i].name = pjsc_strdup(o->name);
        copy[i].shm_region = o->shm_region ? pjsc_strdup(o->shm_region) : NULL;
        if (copy[i].name == NULL || (o->shm_region != NULL && copy[i].shm_region == NULL)) {
            pjsc_output_reqs_free(copy, i + 1);
            return NOMEM(err);
        }
    }
    *out = copy;
    *n = req->n_outputs;
    return 0;
}

void pjsc_output_reqs_free(pjsc_output_req *outs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(outs[i].name);
        free(outs[i].shm_region);
    }
    free(outs);
}

/* ---- results ----------------------------------------------------------------------- */

pjs_client_result *pjsc_result_new(void)
{
    return calloc(1, sizeof(pjs_client_result));
}

int pjsc_result_add(pjs_client_result *r, const char *name, const char *datatype,
                    const int64_t *shape, size_t rank, pjsc_output **out, pjs_client_error *err)
{
    pjsc_output *grown = realloc(r->outputs, (r->n_outputs + 1) * sizeof *grown);
    if (grown == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an answer");
    r->outputs = grown;
    pjsc_output *o = &r->outputs[r->n_outputs];
    memset(o, 0, sizeof *o);
    r->n_outputs++;
    o->name = pjsc_strdup(name);
    o->datatype = pjsc_strdup(datatype);
    o->shape = malloc((rank ? rank : 1) * sizeof *o->shape);
    if (o->name == NULL || o->datatype == NULL || o->shape == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an answer");
    if (rank > 0)
        memcpy(o->shape, shape, rank * sizeof *shape);
    o->rank = rank;
    *out = o;
    return 0;
}

int pjsc_result_mark_shm(pjs_client_result *r, const pjsc_output_req *outs, size_t n,
                         pjs_client_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (outs[i].shm_region == NULL)
            continue;
        for (size_t j = 0; j < r->n_outputs; j++) {
            pjsc_output *o = &r->outputs[j];
            if (strcmp(o->name, outs[i].name) != 0 || o->shm_region != NULL)
                continue;
            if ((o->shm_region = pjsc_strdup(outs[i].shm_region)) == NULL)
                return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for an answer");
            o->shm_offset = outs[i].shm_offset;
            o->shm_byte_size = outs[i].shm_byte_size;
        }
    }
    return 0;
}

size_t pjs_client_result_output_count(const pjs_client_result *r)
{
    return r->n_outputs;
}

static void view(const pjsc_output *o, pjs_client_tensor *t)
{
    t->name = o->name;
    t->datatype = o->datatype;
    t->shape = o->shape;
    t->rank = o->rank;
    t->data = o->data;
    t->nbytes = o->nbytes;
    t->shm_region = o->shm_region;
    t->shm_offset = o->shm_offset;
    t->shm_byte_size = o->shm_byte_size;
}

int pjs_client_result_output(const pjs_client_result *r, size_t index, pjs_client_tensor *out,
                             pjs_client_error *err)
{
    if (index >= r->n_outputs)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "output %zu asked for; the answer has %zu", index, r->n_outputs);
    view(&r->outputs[index], out);
    pjsc_ok(err);
    return 0;
}

int pjs_client_result_find(const pjs_client_result *r, const char *name, pjs_client_tensor *out,
                           pjs_client_error *err)
{
    for (size_t i = 0; name != NULL && i < r->n_outputs; i++) {
        if (strcmp(r->outputs[i].name, name) == 0) {
            view(&r->outputs[i], out);
            pjsc_ok(err);
            return 0;
        }
    }
    return pjsc_fail(err, PJS_CLIENT_NOT_FOUND, "the answer has no output %.200s",
                     name ? name : "(null)");
}

const char *pjs_client_result_model(const pjs_client_result *r)
{
    return r->model ? r->model : "";
}

const char *pjs_client_result_model_version(const pjs_client_result *r)
{
    return r->version ? r->version : "";
}

const char *pjs_client_result_id(const pjs_client_result *r)
{
    return r->id ? r->id : "";
}

void pjs_client_result_free(pjs_client_result *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n_outputs; i++) {
        pjsc_output *o = &r->outputs[i];
        free(o->name);
        free(o->datatype);
        free(o->shape);
        free(o->data);
        free(o->shm_region);
    }
    free(r->outputs);
    free(r->model);
    free(r->version);
    free(r->id);
    free(r);
}
