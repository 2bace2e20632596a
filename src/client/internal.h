/*
 * internal.h - what the files of libpjserve-client share (never installed).
 *
 * The library is three layers:
 *
 *   requests and results (request.c), their wire forms (encode.c: a request
 *   as a ModelInferRequest or a REST body; decode.c: answers back into
 *   results, the one place bytes from the server are read, fuzzed by
 *   fuzz/fuzz_client_decode.c; pb_json.c: gRPC documents as JSON);
 *
 *   two transports with the same shape, each asynchronous by nature and
 *   owning one completion thread per client: grpc_transport.c (the gRPC
 *   C core, one completion queue) and http_transport.c (a libcurl multi
 *   handle). A call is started with a `pjsc_done_fn`, which the
 *   transport's thread runs exactly once with the reply;
 *
 *   the public calls (client.c: connections, errors, waiting; calls.c:
 *   health, documents, repository, shared memory; infer.c: inference,
 *   asynchronous calls, streams; shm.c: regions of this process).
 *
 * Every call in flight is counted in pjs_client.in_flight so that
 * pjs_client_close can wait for the last callback before it stops the
 * threads.
 */
#ifndef PJS_CLIENT_INTERNAL_H
#define PJS_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "pjserve/client.h"

/* Default bound of an answer. */
#define PJSC_DEFAULT_MAX_MESSAGE ((size_t)256 << 20)
/* How long past a request's deadline the library waits for the server's
 * own DEADLINE_EXCEEDED before it gives up on the call itself. */
#define PJSC_DEADLINE_GRACE_MS 1000u

typedef struct pjsc_grpc pjsc_grpc;
typedef struct pjsc_http pjsc_http;

struct pjs_client {
    pjs_client_protocol protocol;
    bool tls;
    char *target;   /* gRPC: "HOST:PORT"; REST: "http[s]://HOST:PORT" */
    char *token;    /* bearer token or NULL */
    uint32_t timeout_ms;
    size_t max_message_bytes;
    pjsc_grpc *grpc; /* protocol == PJS_CLIENT_GRPC */
    pjsc_http *http; /* protocol == PJS_CLIENT_HTTP */
    /* Calls started and not yet completed; close waits for 0. */
    pthread_mutex_t mu;
    pthread_cond_t idle;
    size_t in_flight;
};

/* ---- errors (client.c) ------------------------------------------------------ */

/* Sets err (may be NULL) and returns code. from_server 0, HTTP status of
 * the same meaning. */
int pjsc_fail(pjs_client_error *err, pjs_client_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pjsc_ok(pjs_client_error *err);
/* The code of an HTTP status and the HTTP status of a code. */
pjs_client_code pjsc_code_from_http(long status);
int pjsc_http_from_code(pjs_client_code code);
char *pjsc_strdup(const char *s);

void pjsc_call_begin(pjs_client *c);
void pjsc_call_end(pjs_client *c);

/* ---- transports ---------------------------------------------------------------- */

/* What a transport hands to a call's completion. `err` is OK or why the
 * call failed (the server's status and message when it answered one).
 * `body` (malloc'd, owned by the completion, which frees it) holds the
 * gRPC message, or the REST body with its JSON part `json_len` long. */
typedef struct pjsc_reply {
    pjs_client_error err;
    unsigned char *body;
    size_t len;
    size_t json_len;
} pjsc_reply;

typedef void (*pjsc_done_fn)(void *arg, pjsc_reply *reply);

int pjsc_grpc_open(pjs_client *c, const pjs_client_options *o, pjs_client_error *err);
void pjsc_grpc_close(pjs_client *c);
/* Starts unary `method` with the packed `request`; `done` runs once on the
 * completion thread. `timeout_ms` 0: the client's default. */
int pjsc_grpc_start(pjs_client *c, const char *method, const ProtobufCMessage *request,
                    uint32_t timeout_ms, pjsc_done_fn done, void *arg, pjs_client_error *err);

int pjsc_http_open(pjs_client *c, const pjs_client_options *o, pjs_client_error *err);
void pjsc_http_close(pjs_client *c);
/* Starts `method` ("GET"/"POST") on `path` with `body` (taken: freed by
 * the transport; NULL for none) of which the first `json_len` bytes are
 * JSON (json_len < body_len adds Inference-Header-Content-Length). */
int pjsc_http_start(pjs_client *c, const char *method, const char *path, char *body,
                    size_t body_len, size_t json_len, uint32_t timeout_ms, pjsc_done_fn done,
                    void *arg, pjs_client_error *err);

/* A synchronous call over either transport: start with pjsc_sync_done and
 * &sync as arg, then pjsc_sync_wait. The reply's body becomes the
 * caller's (free it). */
typedef struct pjsc_sync {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    pjsc_reply reply;
} pjsc_sync;

void pjsc_sync_init(pjsc_sync *s);
void pjsc_sync_done(void *arg, pjsc_reply *reply);
/* Waits; returns the reply's code (its error copied to err). */
int pjsc_sync_wait(pjsc_sync *s, pjs_client_error *err);

/* A unary gRPC call: request out, *response (free with
 * protobuf_c_message_free_unpacked) back. */
int pjsc_grpc_call(pjs_client *c, const char *method, const ProtobufCMessage *request,
                   const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **response,
                   pjs_client_error *err);
/* ---- percent-encoding of a path segment (calls.c) -------------------------------- */

/* Writes "/v2/models/<model>[/versions/<version>]<suffix>" into out. */
int pjsc_model_path(char *out, size_t cap, const char *model, const char *version,
                    const char *suffix, pjs_client_error *err);
int pjsc_path_segment(char *out, size_t cap, const char *segment, pjs_client_error *err);

/* ---- requests and results (request.c) ----------------------------------------- */

typedef enum pjsc_param_kind { PJSC_PARAM_INT, PJSC_PARAM_BOOL, PJSC_PARAM_STRING } pjsc_param_kind;

typedef struct pjsc_param {
    char *key;
    pjsc_param_kind kind;
    int64_t i;      /* INT, BOOL */
    char *s;        /* STRING */
} pjsc_param;

typedef struct pjsc_input {
    char *name;
    char *datatype;
    int64_t *shape;
    size_t rank;
    unsigned char *data; /* NULL for a shared memory input */
    size_t nbytes;
    char *shm_region;    /* or NULL */
    uint64_t shm_offset, shm_byte_size;
} pjsc_input;

typedef struct pjsc_output_req {
    char *name;
    char *shm_region;    /* or NULL */
    uint64_t shm_offset, shm_byte_size;
} pjsc_output_req;

struct pjs_client_request {
    char *model;
    char *version;       /* or NULL */
    char *id;            /* or NULL */
    uint32_t timeout_ms; /* 0: the client's */
    pjsc_param *params;
    size_t n_params;
    pjsc_input *inputs;
    size_t n_inputs;
    pjsc_output_req *outputs;
    size_t n_outputs;
};

typedef struct pjsc_output {
    char *name;
    char *datatype;
    int64_t *shape;
    size_t rank;
    unsigned char *data; /* NULL when nbytes is 0 */
    size_t nbytes;
    char *shm_region;    /* copied from the request, or NULL */
    uint64_t shm_offset, shm_byte_size;
} pjsc_output;

struct pjs_client_result {
    char *model;
    char *version;
    char *id;
    pjsc_output *outputs;
    size_t n_outputs;
};

/* A fresh, empty result; NULL without memory. */
pjs_client_result *pjsc_result_new(void);
/* Adds an output with copies of name and datatype; *out points at it. */
int pjsc_result_add(pjs_client_result *r, const char *name, const char *datatype,
                    const int64_t *shape, size_t rank, pjsc_output **out, pjs_client_error *err);
/* Marks the outputs the request sent to shared memory (by name). */
int pjsc_result_mark_shm(pjs_client_result *r, const pjsc_output_req *outs, size_t n,
                         pjs_client_error *err);

/* Copies of a request's requested outputs, kept by asynchronous calls (the
 * request may be freed before the answer). */
int pjsc_output_reqs_copy(const pjs_client_request *req, pjsc_output_req **out, size_t *n,
                          pjs_client_error *err);
void pjsc_output_reqs_free(pjsc_output_req *outs, size_t n);

/* Element count of a shape; false on a negative extent or overflow. */
bool pjsc_shape_elements(const int64_t *shape, size_t rank, uint64_t *out);
/* Counts the elements of a serialized BYTES tensor; false when malformed. */
bool pjsc_bytes_count(const void *data, size_t nbytes, uint64_t *count);

/* ---- wire forms (encode.c, decode.c, pb_json.c) -------------------------------- */

/* The gRPC ModelInferRequest of `req`, in one allocation tree freed by
 * pjsc_grpc_request_free. The tensor bytes are borrowed from req. */
typedef struct pjsc_grpc_request pjsc_grpc_request;
int pjsc_grpc_request_build(const pjs_client_request *req, uint32_t timeout_ms,
                            pjsc_grpc_request **out, const ProtobufCMessage **msg,
                            pjs_client_error *err);
void pjsc_grpc_request_free(pjsc_grpc_request *g);

/* The REST body of `req` (JSON header, then the binary tensor bytes):
 * *body malloc'd, *json_len the header's length. */
int pjsc_rest_request_build(const pjs_client_request *req, uint32_t timeout_ms, char **body,
                            size_t *body_len, size_t *json_len, pjs_client_error *err);

/* Answers into results. Every byte is the server's: checked, never
 * trusted. `outs` (n_outs of them, may be NULL) are the request's
 * requested outputs: those it sent to shared memory carry no bytes and
 * are marked with their region; every other output's bytes must match
 * its datatype and shape. */
int pjsc_decode_grpc_infer(const unsigned char *bytes, size_t len, const pjsc_output_req *outs,
                           size_t n_outs, pjs_client_result **out, pjs_client_error *err);
/* A ModelStreamInferResponse: a result, or the per-request error it
 * carries (returned as the error, from_server set). */
int pjsc_decode_grpc_stream(const unsigned char *bytes, size_t len, pjs_client_result **out,
                            pjs_client_error *err);
int pjsc_decode_rest_infer(const unsigned char *body, size_t len, size_t json_len,
                           const pjsc_output_req *outs, size_t n_outs, pjs_client_result **out,
                           pjs_client_error *err);
/* The error a REST error answer carries: {"error": "..."} or the body. */
void pjsc_decode_rest_error(long status, const unsigned char *body, size_t len,
                            pjs_client_error *err);

/* A protobuf-c message as a JSON object with the proto field names. */
json_t *pjsc_pb_to_json(const ProtobufCMessage *m);

/* JSON text of a document, malloc'd; NULL without memory. */
char *pjsc_json_text(const json_t *doc);

#endif
