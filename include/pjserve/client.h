/*
 * pjserve/client.h - libpjserve-client: a C client of KServe V2 servers
 * (pjserve, and any server speaking the same protocol) over gRPC and
 * HTTP/REST.
 *
 * One header, usable from C and C++. Link with `pkg-config --libs
 * pjserve-client` (or `-lpjserve-client`). The library links no PJRT and
 * nothing of the server.
 *
 * Conventions, for every function below:
 *
 *   - A fallible function returns PJS_CLIENT_OK (0) or a positive
 *     pjs_client_code, and fills the caller's pjs_client_error (which may be
 *     NULL) with the same code, the HTTP status and a message. When the
 *     server refused the call, the code and message are the server's own
 *     (from_server is 1); otherwise the library says what went wrong
 *     locally (a connection refused, a bad argument, an answer it could not
 *     read).
 *   - Results come back through out-parameters. Handles are opaque. What a
 *     function hands out is the caller's until freed with the function
 *     named next to it; nothing else is ever freed by the caller.
 *   - Documents (metadata, configuration, statistics, the repository index,
 *     shared memory status, model control status) are JSON text. Over REST
 *     the text is the server's document as sent; over gRPC it is the answer
 *     message converted field by field, with the proto field names, enums
 *     by name and 64-bit integers as JSON numbers.
 *   - Datatypes are KServe V2 names: "BOOL", "UINT8", "UINT16", "UINT32",
 *     "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "BF16", "FP32",
 *     "FP64" and "BYTES". Tensor bytes are little-endian and row-major.
 *     A BYTES tensor is its elements back to back, each a 4-byte
 *     little-endian length and then that many bytes
 *     (pjs_client_bytes_pack and pjs_client_bytes_next write and read it).
 *
 * Threads: a pjs_client may be shared by any number of threads at once.
 * A request or a result belongs to one thread at a time. Callbacks of
 * asynchronous calls and streams run on the client's own completion
 * thread; a callback must not make a synchronous call on the same client
 * or close it (the call would wait for the thread that runs the callback).
 */
#ifndef PJSERVE_CLIENT_H
#define PJSERVE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define PJS_CLIENT_API __attribute__((visibility("default")))
#else
#define PJS_CLIENT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** The library's version, as "MAJOR.MINOR.PATCH". */
PJS_CLIENT_API const char *pjs_client_version(void);

/* ---- errors ------------------------------------------------------------- */

/** Status codes: gRPC's codes and numbers. An HTTP answer's status maps to
 * the code of the same meaning (400 INVALID_ARGUMENT, 404 NOT_FOUND, 429
 * RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500 INTERNAL,
 * 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 501 UNIMPLEMENTED). */
typedef enum pjs_client_code {
    PJS_CLIENT_OK = 0,
    PJS_CLIENT_CANCELLED = 1,
    PJS_CLIENT_UNKNOWN = 2,
    PJS_CLIENT_INVALID_ARGUMENT = 3,
    PJS_CLIENT_DEADLINE_EXCEEDED = 4,
    PJS_CLIENT_NOT_FOUND = 5,
    PJS_CLIENT_ALREADY_EXISTS = 6,
    PJS_CLIENT_PERMISSION_DENIED = 7,
    PJS_CLIENT_RESOURCE_EXHAUSTED = 8,
    PJS_CLIENT_FAILED_PRECONDITION = 9,
    PJS_CLIENT_ABORTED = 10,
    PJS_CLIENT_OUT_OF_RANGE = 11,
    PJS_CLIENT_UNIMPLEMENTED = 12,
    PJS_CLIENT_INTERNAL = 13,
    PJS_CLIENT_UNAVAILABLE = 14,
    PJS_CLIENT_DATA_LOSS = 15,
    PJS_CLIENT_UNAUTHENTICATED = 16
} pjs_client_code;

/** Longest message kept, with its NUL; longer ones are cut. */
#define PJS_CLIENT_MESSAGE_MAX 1024

/** Why a call failed. Plain memory owned by the caller. */
typedef struct pjs_client_error {
    /** PJS_CLIENT_OK after a successful call. */
    pjs_client_code code;
    /** The HTTP status of a REST answer; over gRPC, or for a local error,
     * the HTTP status of the same meaning. 200 after success. */
    int http_status;
    /** 1 when the server sent this error, 0 when the library found it. */
    int from_server;
    /** What failed, in words; empty after success. */
    char message[PJS_CLIENT_MESSAGE_MAX];
} pjs_client_error;

/** A short, stable name of a code ("NOT_FOUND"). */
PJS_CLIENT_API const char *pjs_client_code_name(pjs_client_code code);

/* ---- connections ---------------------------------------------------------- */

/** A connection to one server. Opaque. */
typedef struct pjs_client pjs_client;

typedef enum pjs_client_protocol {
    PJS_CLIENT_GRPC = 0,
    PJS_CLIENT_HTTP = 1
} pjs_client_protocol;

/** Connection options; zero them (`pjs_client_options o = {0};`) and set
 * what you need. Every field's zero is its default. */
typedef struct pjs_client_options {
    /** PEM file of the certificate authorities to trust; NULL: the system's.
     * Used by grpcs:// and https:// URLs only. */
    const char *tls_ca_file;
    /** PEM files of this client's certificate and key (mutual TLS); both or
     * neither. */
    const char *tls_cert_file;
    const char *tls_key_file;
    /** Sent as "authorization: Bearer TOKEN" on every call; NULL: none. */
    const char *token;
    /** Deadline of every call that sets none of its own, in milliseconds;
     * 0: none. */
    uint32_t timeout_ms;
    /** Largest answer accepted, in bytes; 0: 256 MiB. */
    size_t max_message_bytes;
} pjs_client_options;

/** Opens a connection to `url`:
 *
 *   grpc://HOST:PORT   gRPC, plaintext        (HOST:PORT alone means this)
 *   grpcs://HOST:PORT  gRPC over TLS
 *   http://HOST:PORT   REST, plaintext
 *   https://HOST:PORT  REST over TLS
 *
 * `options` may be NULL. Nothing is sent yet: a server that is not there
 * shows in the first call (UNAVAILABLE). Free with pjs_client_close. */
PJS_CLIENT_API int pjs_client_connect(const char *url, const pjs_client_options *options,
                                      pjs_client **out, pjs_client_error *err);

/** Waits for every asynchronous call and stream of `client` to end (their
 * callbacks run), then frees it. NULL is allowed. */
PJS_CLIENT_API void pjs_client_close(pjs_client *client);

/** The protocol `client` speaks. */
PJS_CLIENT_API pjs_client_protocol pjs_client_get_protocol(const pjs_client *client);

/** Frees a string the library handed out (a JSON document). NULL is allowed. */
PJS_CLIENT_API void pjs_client_free(void *p);

/* ---- health, metadata, configuration, statistics ------------------------- */

/** Whether the server is live / ready; *out is 1 or 0. */
PJS_CLIENT_API int pjs_client_server_live(pjs_client *client, int *out, pjs_client_error *err);
PJS_CLIENT_API int pjs_client_server_ready(pjs_client *client, int *out, pjs_client_error *err);

/** Whether `model` is ready for inference; `version` may be NULL (the
 * latest). An unknown model is not ready (0). */
PJS_CLIENT_API int pjs_client_model_ready(pjs_client *client, const char *model,
                                          const char *version, int *out, pjs_client_error *err);

/** {"name", "version", "extensions"}. Free *json with pjs_client_free. */
PJS_CLIENT_API int pjs_client_server_metadata(pjs_client *client, char **json,
                                              pjs_client_error *err);

/** {"name", "versions", "platform", "inputs": [{"name", "datatype", "shape"}],
 * "outputs": [...]}; -1 in a shape is a variable extent. */
PJS_CLIENT_API int pjs_client_model_metadata(pjs_client *client, const char *model,
                                             const char *version, char **json,
                                             pjs_client_error *err);

/** The model's configuration. Over gRPC: {"config": {...}}; over REST
 * the configuration itself, as servers answer there. */
PJS_CLIENT_API int pjs_client_model_config(pjs_client *client, const char *model,
                                           const char *version, char **json,
                                           pjs_client_error *err);

/** {"model_stats": [...]} of `model`, or of every model when it is NULL. */
PJS_CLIENT_API int pjs_client_model_statistics(pjs_client *client, const char *model,
                                               const char *version, char **json,
                                               pjs_client_error *err);

/* ---- repository and model control ------------------------------------------ */

/** The repository index: over REST a JSON array of {"name", "version",
 * "state", "reason"}; over gRPC {"models": [the same]}. `ready_only`
 * non-zero lists only the models ready for inference. */
PJS_CLIENT_API int pjs_client_repository_index(pjs_client *client, int ready_only, char **json,
                                               pjs_client_error *err);

/** Loads (or reloads) / unloads `model`. Admin calls: the server may ask
 * for a token (pjs_client_options.token) or take them from loopback only. */
PJS_CLIENT_API int pjs_client_load_model(pjs_client *client, const char *model,
                                         pjs_client_error *err);
PJS_CLIENT_API int pjs_client_unload_model(pjs_client *client, const char *model,
                                           pjs_client_error *err);

/** pjserve's model control status: the mode, the device weight cache and
 * every model's residency and policy (GET /v2/pjserve/control, or
 * pjserve.control.v1.ModelControl/ModelControlStatus). Servers other
 * than pjserve answer NOT_FOUND or UNIMPLEMENTED. */
PJS_CLIENT_API int pjs_client_control_status(pjs_client *client, char **json,
                                             pjs_client_error *err);

/* ---- system shared memory --------------------------------------------------- */

/** A POSIX shared memory region this process created and maps. Opaque. */
typedef struct pjs_client_shm pjs_client_shm;

/** Creates the shared memory object `key` ("/name", as shm_open takes it;
 * it must not exist yet) of `byte_size` bytes, zero-filled, and maps it.
 * Free with pjs_client_shm_destroy, which also removes the object. */
PJS_CLIENT_API int pjs_client_shm_create(const char *key, size_t byte_size,
                                         pjs_client_shm **out, pjs_client_error *err);
/** Unmaps and removes the region. NULL is allowed. Unregister it from the
 * server first. */
PJS_CLIENT_API void pjs_client_shm_destroy(pjs_client_shm *shm);
/** The mapped bytes, their count, and the key. */
PJS_CLIENT_API void *pjs_client_shm_data(const pjs_client_shm *shm);
PJS_CLIENT_API size_t pjs_client_shm_size(const pjs_client_shm *shm);
PJS_CLIENT_API const char *pjs_client_shm_key(const pjs_client_shm *shm);

/** Registers `byte_size` bytes at `offset` of the shared memory object
 * `key` with the server under `name`; requests then name it to place
 * inputs or outputs there. The server must run on this host with client
 * shared memory enabled (pjserve: --allow-shared-memory). */
PJS_CLIENT_API int pjs_client_shm_register(pjs_client *client, const char *name,
                                           const char *key, uint64_t offset, uint64_t byte_size,
                                           pjs_client_error *err);
/** Unregisters region `name`, or every region when `name` is NULL. */
PJS_CLIENT_API int pjs_client_shm_unregister(pjs_client *client, const char *name,
                                             pjs_client_error *err);
/** The registered regions, region `name` or all when NULL: over REST an
 * array of {"name", "key", "offset", "byte_size"}; over gRPC
 * {"regions": {NAME: {the same}}}. */
PJS_CLIENT_API int pjs_client_shm_status(pjs_client *client, const char *name, char **json,
                                         pjs_client_error *err);

/* ---- inference requests ------------------------------------------------------- */

/** An inference request being built. Opaque; free with
 * pjs_client_request_free. One request may be sent any number of times. */
typedef struct pjs_client_request pjs_client_request;

PJS_CLIENT_API int pjs_client_request_new(const char *model, pjs_client_request **out,
                                          pjs_client_error *err);
PJS_CLIENT_API void pjs_client_request_free(pjs_client_request *req);

/** The model version (default: the latest) and the request id the answer
 * echoes (default: none). */
PJS_CLIENT_API int pjs_client_request_set_version(pjs_client_request *req, const char *version,
                                                  pjs_client_error *err);
PJS_CLIENT_API int pjs_client_request_set_id(pjs_client_request *req, const char *id,
                                             pjs_client_error *err);

/** The request's deadline, `timeout_ms` after it is sent; 0: the client's
 * default. The server is told (the KServe `timeout` parameter) and drops
 * the request with DEADLINE_EXCEEDED when it cannot answer in time; the
 * library gives up a second after the deadline if no answer came. */
PJS_CLIENT_API int pjs_client_request_set_timeout_ms(pjs_client_request *req,
                                                     uint32_t timeout_ms, pjs_client_error *err);

/** Request parameters (priority, sequence_id, ...); setting a key again
 * replaces its value. */
PJS_CLIENT_API int pjs_client_request_set_parameter_int(pjs_client_request *req, const char *key,
                                                        int64_t value, pjs_client_error *err);
PJS_CLIENT_API int pjs_client_request_set_parameter_bool(pjs_client_request *req,
                                                         const char *key, int value,
                                                         pjs_client_error *err);
PJS_CLIENT_API int pjs_client_request_set_parameter_string(pjs_client_request *req,
                                                           const char *key, const char *value,
                                                           pjs_client_error *err);

/** Adds input `name` of `datatype` and `shape` (`rank` extents) with its
 * `nbytes` bytes of data, which are copied. For a fixed-size datatype
 * nbytes must be the element count times the element size; for BYTES the
 * data must hold exactly the element count of serialized elements. */
PJS_CLIENT_API int pjs_client_request_add_input(pjs_client_request *req, const char *name,
                                                const char *datatype, const int64_t *shape,
                                                size_t rank, const void *data, size_t nbytes,
                                                pjs_client_error *err);

/** Adds input `name` whose bytes the server reads from `byte_size` bytes
 * at `offset` of the registered region `region`. */
PJS_CLIENT_API int pjs_client_request_add_input_shm(pjs_client_request *req, const char *name,
                                                    const char *datatype, const int64_t *shape,
                                                    size_t rank, const char *region,
                                                    uint64_t offset, uint64_t byte_size,
                                                    pjs_client_error *err);

/** Asks for output `name` (without any requested output, the server
 * answers with all of them). */
PJS_CLIENT_API int pjs_client_request_add_output(pjs_client_request *req, const char *name,
                                                 pjs_client_error *err);

/** Asks for output `name`, written by the server into `byte_size` bytes at
 * `offset` of the registered region `region` instead of the answer. */
PJS_CLIENT_API int pjs_client_request_add_output_shm(pjs_client_request *req, const char *name,
                                                     const char *region, uint64_t offset,
                                                     uint64_t byte_size, pjs_client_error *err);

/* ---- inference results ---------------------------------------------------------- */

/** An answer. Opaque; free with pjs_client_result_free. */
typedef struct pjs_client_result pjs_client_result;

/** One output of an answer, pointing into the result (valid until it is
 * freed). */
typedef struct pjs_client_tensor {
    const char *name;
    const char *datatype;
    const int64_t *shape;
    size_t rank;
    /** The output's bytes; NULL and 0 for an output written to shared
     * memory. */
    const void *data;
    size_t nbytes;
    /** The region an output was written to (NULL otherwise), with the
     * offset and the byte count the request gave. */
    const char *shm_region;
    uint64_t shm_offset;
    uint64_t shm_byte_size;
} pjs_client_tensor;

PJS_CLIENT_API size_t pjs_client_result_output_count(const pjs_client_result *result);
/** Output `index` (in the server's order), or INVALID_ARGUMENT past the end. */
PJS_CLIENT_API int pjs_client_result_output(const pjs_client_result *result, size_t index,
                                            pjs_client_tensor *out, pjs_client_error *err);
/** Output `name`, or NOT_FOUND. */
PJS_CLIENT_API int pjs_client_result_find(const pjs_client_result *result, const char *name,
                                          pjs_client_tensor *out, pjs_client_error *err);
/** The answering model's name and version, and the request id ("" when none). */
PJS_CLIENT_API const char *pjs_client_result_model(const pjs_client_result *result);
PJS_CLIENT_API const char *pjs_client_result_model_version(const pjs_client_result *result);
PJS_CLIENT_API const char *pjs_client_result_id(const pjs_client_result *result);
PJS_CLIENT_API void pjs_client_result_free(pjs_client_result *result);

/* ---- inference calls ---------------------------------------------------------- */

/** Sends `req` and waits for the answer; *out is the caller's. */
PJS_CLIENT_API int pjs_client_infer(pjs_client *client, const pjs_client_request *req,
                                    pjs_client_result **out, pjs_client_error *err);

/** How an asynchronous call or a stream hands over each answer: `result`
 * (the callback's to free) when `err->code` is PJS_CLIENT_OK, else NULL
 * and why. Runs on the client's completion thread. */
typedef void (*pjs_client_callback)(void *user_data, pjs_client_result *result,
                                    const pjs_client_error *err);

/** Sends `req` and returns at once; `callback` runs once with the answer.
 * The request may be changed or freed as soon as this returns. When this
 * fails, the callback never runs. */
PJS_CLIENT_API int pjs_client_infer_async(pjs_client *client, const pjs_client_request *req,
                                          pjs_client_callback callback, void *user_data,
                                          pjs_client_error *err);

/** An asynchronous call to poll. Opaque. */
typedef struct pjs_client_pending pjs_client_pending;

/** Sends `req` and returns at once with a handle to poll or wait on. */
PJS_CLIENT_API int pjs_client_infer_start(pjs_client *client, const pjs_client_request *req,
                                          pjs_client_pending **out, pjs_client_error *err);
/** 1 when the answer is in (pjs_client_pending_wait will not block), else 0. */
PJS_CLIENT_API int pjs_client_pending_done(pjs_client_pending *pending);
/** Waits for the answer, hands it over (or its error) and frees `pending`. */
PJS_CLIENT_API int pjs_client_pending_wait(pjs_client_pending *pending,
                                           pjs_client_result **out, pjs_client_error *err);

/* ---- streaming (gRPC ModelStreamInfer) ------------------------------------------ */

/** A bidirectional inference stream: requests go out in order, and each
 * answer (or per-request error) comes to the stream's callback. Opaque. */
typedef struct pjs_client_stream pjs_client_stream;

/** Opens a stream; REST has none (UNIMPLEMENTED). `timeout_ms` bounds the
 * whole stream (0: the client's default). */
PJS_CLIENT_API int pjs_client_stream_open(pjs_client *client, pjs_client_callback callback,
                                          void *user_data, uint32_t timeout_ms,
                                          pjs_client_stream **out, pjs_client_error *err);
/** Sends one request on the stream; waits only for the previous one to
 * leave (so never call it from the stream's own callback). */
PJS_CLIENT_API int pjs_client_stream_send(pjs_client_stream *stream,
                                          const pjs_client_request *req, pjs_client_error *err);
/** Says no more requests will come, waits for the remaining answers and
 * the stream's end, and frees `stream`. Fails with the stream's status
 * when it ended in error. */
PJS_CLIENT_API int pjs_client_stream_close(pjs_client_stream *stream, pjs_client_error *err);

/* ---- helpers ------------------------------------------------------------------- */

/** Bytes per element of `datatype`; 0 for BYTES and unknown names. */
PJS_CLIENT_API size_t pjs_client_datatype_size(const char *datatype);

/** Serializes `count` elements (elements[i] of lengths[i] bytes) as a BYTES
 * tensor into a fresh buffer *out of *nbytes bytes (free with
 * pjs_client_free). */
PJS_CLIENT_API int pjs_client_bytes_pack(const char *const *elements, const size_t *lengths,
                                         size_t count, void **out, size_t *nbytes,
                                         pjs_client_error *err);

/** Reads the element at *offset of a BYTES tensor: 1 with *element and
 * *length set and *offset moved past it, 0 at the end, -1 when the rest
 * is not a well-formed element. */
PJS_CLIENT_API int pjs_client_bytes_next(const void *data, size_t nbytes, size_t *offset,
                                         const char **element, size_t *length);

#ifdef __cplusplus
}
#endif

#endif
