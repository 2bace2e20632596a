/*
 * encode.c - a request in its two wire forms: a gRPC ModelInferRequest
 * (every tensor's bytes in raw_input_contents) and a REST body (the JSON
 * header, then every tensor's bytes as the binary tensor extension
 * carries them, with every output asked for as binary data).
 *
 * A request with a deadline carries it as the KServe `timeout` parameter
 * (microseconds), unless the caller set that parameter itself.
 */
#include "client/internal.h"

#include <stdlib.h>
#include <string.h>

#include "grpc_service.pb-c.h"

typedef Inference__ModelInferRequest__ParametersEntry req_param_entry;
typedef Inference__ModelInferRequest__InferInputTensor input_tensor;
typedef Inference__ModelInferRequest__InferInputTensor__ParametersEntry input_param_entry;
typedef Inference__ModelInferRequest__InferRequestedOutputTensor output_tensor;
typedef Inference__ModelInferRequest__InferRequestedOutputTensor__ParametersEntry
    output_param_entry;

/* Shared memory parameters of one tensor: region, offset, byte size. */
#define SHM_PARAMS 3

struct pjsc_grpc_request {
    Inference__ModelInferRequest msg;
    req_param_entry *params;
    req_param_entry **param_ptrs;
    Inference__InferParameter *values; /* request, then inputs', then outputs' */
    input_tensor *inputs;
    input_tensor **input_ptrs;
    input_param_entry *input_params;
    input_param_entry **input_param_ptrs;
    output_tensor *outputs;
    output_tensor **output_ptrs;
    output_param_entry *output_params;
    output_param_entry **output_param_ptrs;
    ProtobufCBinaryData *raw;
};

static bool has_param(const pjs_client_request *req, const char *key)
{
    for (size_t i = 0; i < req->n_params; i++)
        if (strcmp(req->params[i].key, key) == 0)
            return true;
    return false;
}

static bool adds_timeout(const pjs_client_request *req, uint32_t timeout_ms)
{
    return timeout_ms > 0 && !has_param(req, "timeout");
}

static void set_int(Inference__InferParameter *v, int64_t i)
{
    inference__infer_parameter__init(v);
    v->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    v->int64_param = i;
}

static void set_string(Inference__InferParameter *v, const char *s)
{
    inference__infer_parameter__init(v);
    v->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    v->string_param = (char *)s;
}

static void set_request_params(pjsc_grpc_request *g, const pjs_client_request *req,
                               uint32_t timeout_ms, Inference__InferParameter **next_value)
{
    size_t n = 0;
    for (size_t i = 0; i < req->n_params; i++, n++) {
        const pjsc_param *p = &req->params[i];
        Inference__InferParameter *v = (*next_value)++;
        if (p->kind == PJSC_PARAM_STRING) {
            set_string(v, p->s);
        } else if (p->kind == PJSC_PARAM_BOOL) {
            inference__infer_parameter__init(v);
            v->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
            v->bool_param = p->i != 0;
        } else {
            set_int(v, p->i);
        }
        inference__model_infer_request__parameters_entry__init(&g->params[n]);
        g->params[n].key = p->key;
        g->params[n].value = v;
        g->param_ptrs[n] = &g->params[n];
    }
    if (adds_timeout(req, timeout_ms)) {
        Inference__InferParameter *v = (*next_value)++;
        set_int(v, (int64_t)timeout_ms * 1000);
        inference__model_infer_request__parameters_entry__init(&g->params[n]);
        g->params[n].key = (char *)"timeout";
        g->params[n].value = v;
        g->param_ptrs[n] = &g->params[n];
        n++;
    }
    g->msg.n_parameters = n;
    g->msg.parameters = g->param_ptrs;
}

/* The three values of a region: name, offset, byte size. */
static void shm_values(Inference__InferParameter *v, const char *region, uint64_t offset,
                       uint64_t byte_size)
{
    set_string(&v[0], region);
    set_int(&v[1], (int64_t)offset);
    set_int(&v[2], (int64_t)byte_size);
}

static const char *const shm_keys[SHM_PARAMS] = {"shared_memory_region", "shared_memory_offset",
                                                 "shared_memory_byte_size"};

static void set_inputs(pjsc_grpc_request *g, const pjs_client_request *req,
                       Inference__InferParameter **next_value)
{
    size_t n_raw = 0;
    for (size_t i = 0; i < req->n_inputs; i++) {
        const pjsc_input *in = &req->inputs[i];
        input_tensor *t = &g->inputs[i];
        inference__model_infer_request__infer_input_tensor__init(t);
        t->name = in->name;
        t->datatype = in->datatype;
        t->n_shape = in->rank;
        t->shape = in->shape;
        g->input_ptrs[i] = t;
        if (in->shm_region == NULL) {
            g->raw[n_raw].data = in->data;
            g->raw[n_raw].len = in->nbytes;
            n_raw++;
            continue;
        }
        Inference__InferParameter *v = *next_value;
        *next_value += SHM_PARAMS;
        shm_values(v, in->shm_region, in->shm_offset, in->shm_byte_size);
        input_param_entry *e = &g->input_params[i * SHM_PARAMS];
        input_param_entry **ep = &g->input_param_ptrs[i * SHM_PARAMS];
        for (size_t k = 0; k < SHM_PARAMS; k++) {
            inference__model_infer_request__infer_input_tensor__parameters_entry__init(&e[k]);
            e[k].key = (char *)shm_keys[k];
            e[k].value = &v[k];
            ep[k] = &e[k];
        }
        t->n_parameters = SHM_PARAMS;
        t->parameters = ep;
    }
    g->msg.n_inputs = req->n_inputs;
    g->msg.inputs = g->input_ptrs;
    g->msg.n_raw_input_contents = n_raw;
    g->msg.raw_input_contents = g->raw;
}

static void set_outputs(pjsc_grpc_request *g, const pjs_client_request *req,
                        Inference__InferParameter **next_value)
{
    for (size_t i = 0; i < req->n_outputs; i++) {
        const pjsc_output_req *o = &req->outputs[i];
        output_tensor *t = &g->outputs[i];
        inference__model_infer_request__infer_requested_output_tensor__init(t);
        t->name = o->name;
        g->output_ptrs[i] = t;
        if (o->shm_region == NULL)
            continue;
        Inference__InferParameter *v = *next_value;
        *next_value += SHM_PARAMS;
        shm_values(v, o->shm_region, o->shm_offset, o->shm_byte_size);
        output_param_entry *e = &g->output_params[i * SHM_PARAMS];
        output_param_entry **ep = &g->output_param_ptrs[i * SHM_PARAMS];
        for (size_t k = 0; k < SHM_PARAMS; k++) {
            inference__model_infer_request__infer_requested_output_tensor__parameters_entry__init(
                &e[k]);
            e[k].key = (char *)shm_keys[k];
            e[k].value = &v[k];
            ep[k] = &e[k];
        }
        t->n_parameters = SHM_PARAMS;
        t->parameters = ep;
    }
    g->msg.n_outputs = req->n_outputs;
    g->msg.outputs = g->output_ptrs;
}

void pjsc_grpc_request_free(pjsc_grpc_request *g)
{
    if (g == NULL)
        return;
    free(g->params);
    free(g->param_ptrs);
    free(g->values);
    free(g->inputs);
    free(g->input_ptrs);
    free(g->input_params);
    free(g->input_param_ptrs);
    free(g->outputs);
    free(g->output_ptrs);
    free(g->output_params);
    free(g->output_param_ptrs);
    free(g->raw);
    free(g);
}

/* calloc of n (at least one) elements. */
static void *alloc_n(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

int pjsc_grpc_request_build(const pjs_client_request *req, uint32_t timeout_ms,
                            pjsc_grpc_request **out, const ProtobufCMessage **msg,
                            pjs_client_error *err)
{
    *out = NULL;
    pjsc_grpc_request *g = calloc(1, sizeof *g);
    if (g == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for the request");
    size_t n_params = req->n_params + (adds_timeout(req, timeout_ms) ? 1 : 0);
    size_t ni = req->n_inputs, no = req->n_outputs;
    g->params = alloc_n(n_params, sizeof *g->params);
    g->param_ptrs = alloc_n(n_params, sizeof *g->param_ptrs);
    g->values = alloc_n(n_params + SHM_PARAMS * (ni + no), sizeof *g->values);
    g->inputs = alloc_n(ni, sizeof *g->inputs);
    g->input_ptrs = alloc_n(ni, sizeof *g->input_ptrs);
    g->input_params = alloc_n(SHM_PARAMS * ni, sizeof *g->input_params);
    g->input_param_ptrs = alloc_n(SHM_PARAMS * ni, sizeof *g->input_param_ptrs);
    g->outputs = alloc_n(no, sizeof *g->outputs);
    g->output_ptrs = alloc_n(no, sizeof *g->output_ptrs);
    g->output_params = alloc_n(SHM_PARAMS * no, sizeof *g->output_params);
    g->output_param_ptrs = alloc_n(SHM_PARAMS * no, sizeof *g->output_param_ptrs);
    g->raw = alloc_n(ni, sizeof *g->raw);
    if (!g->params || !g->param_ptrs || !g->values || !g->inputs || !g->input_ptrs ||
        !g->input_params || !g->input_param_ptrs || !g->outputs || !g->output_ptrs ||
        !g->output_params || !g->output_param_ptrs || !g->raw) {
        pjsc_grpc_request_free(g);
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for the request");
    }
    inference__model_infer_request__init(&g->msg);
    g->msg.model_name = req->model;
    if (req->version != NULL)
        g->msg.model_version = req->version;
    if (req->id != NULL)
        g->msg.id = req->id;
    Inference__InferParameter *next_value = g->values;
    set_request_params(g, req, timeout_ms, &next_value);
    set_inputs(g, req, &next_value);
    set_outputs(g, req, &next_value);
    *out = g;
    *msg = &g->msg.base;
    return 0;
}

/* ---- REST ------------------------------------------------------------------------ */

static json_t *shape_json(const int64_t *shape, size_t rank)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < rank; i++)
        if (json_array_append_new(a, json_integer((json_int_t)shape[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *shm_json(const char *region, uint64_t offset, uint64_t byte_size)
{
    return json_pack("{s:s, s:I, s:I}", "shared_memory_region", region, "shared_memory_offset",
                     (json_int_t)offset, "shared_memory_byte_size", (json_int_t)byte_size);
}

static json_t *params_json(const pjs_client_request *req, uint32_t timeout_ms)
{
    json_t *p = json_object();
    for (size_t i = 0; p != NULL && i < req->n_params; i++) {
        const pjsc_param *q = &req->params[i];
        json_t *v = q->kind == PJSC_PARAM_STRING ? json_string(q->s)
                    : q->kind == PJSC_PARAM_BOOL ? json_boolean(q->i)
                                                 : json_integer((json_int_t)q->i);
        if (json_object_set_new(p, q->key, v) != 0) {
            json_decref(p);
            return NULL;
        }
    }
    if (p != NULL && adds_timeout(req, timeout_ms) &&
        json_object_set_new(p, "timeout", json_integer((json_int_t)timeout_ms * 1000)) != 0) {
        json_decref(p);
        return NULL;
    }
    if (p != NULL && json_object_set_new(p, "binary_data_output", json_true()) != 0) {
        json_decref(p);
        return NULL;
    }
    return p;
}

static json_t *inputs_json(const pjs_client_request *req, size_t *binary_len)
{
    json_t *list = json_array();
    *binary_len = 0;
    for (size_t i = 0; list != NULL && i < req->n_inputs; i++) {
        const pjsc_input *in = &req->inputs[i];
        json_t *params = in->shm_region != NULL
                             ? shm_json(in->shm_region, in->shm_offset, in->shm_byte_size)
                             : json_pack("{s:I}", "binary_data_size", (json_int_t)in->nbytes);
        json_t *t = json_pack("{s:s, s:s, s:o, s:o}", "name", in->name, "datatype", in->datatype,
                              "shape", shape_json(in->shape, in->rank), "parameters", params);
        if (t == NULL || json_array_append_new(list, t) != 0) {
            json_decref(list);
            return NULL;
        }
        if (in->shm_region == NULL)
            *binary_len += in->nbytes;
    }
    return list;
}

static json_t *outputs_json(const pjs_client_request *req)
{
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < req->n_outputs; i++) {
        const pjsc_output_req *o = &req->outputs[i];
        json_t *params = o->shm_region != NULL
                             ? shm_json(o->shm_region, o->shm_offset, o->shm_byte_size)
                             : json_pack("{s:b}", "binary_data", 1);
        json_t *t = json_pack("{s:s, s:o}", "name", o->name, "parameters", params);
        if (t == NULL || json_array_append_new(list, t) != 0) {
            json_decref(list);
            return NULL;
        }
    }
    return list;
}

int pjsc_rest_request_build(const pjs_client_request *req, uint32_t timeout_ms, char **body,
                            size_t *body_len, size_t *json_len, pjs_client_error *err)
{
    *body = NULL;
    size_t binary_len = 0;
    json_t *doc = json_pack("{s:o, s:o}", "parameters", params_json(req, timeout_ms), "inputs",
                            inputs_json(req, &binary_len));
    if (doc != NULL && req->id != NULL && json_object_set_new(doc, "id", json_string(req->id)))
        goto nomem;
    if (doc != NULL && req->n_outputs > 0 &&
        json_object_set_new(doc, "outputs", outputs_json(req)) != 0)
        goto nomem;
    char *text = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    doc = NULL;
    if (text == NULL)
        goto nomem;
    size_t header = strlen(text);
    char *all = realloc(text, header + binary_len + 1);
    if (all == NULL) {
        free(text);
        goto nomem;
    }
    size_t at = header;
    for (size_t i = 0; i < req->n_inputs; i++) {
        const pjsc_input *in = &req->inputs[i];
        if (in->shm_region == NULL && in->nbytes > 0) {
            memcpy(all + at, in->data, in->nbytes);
            at += in->nbytes;
        }
    }
    *body = all;
    *body_len = at;
    *json_len = header;
    return 0;
nomem:
    json_decref(doc);
    return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for the request");
}
