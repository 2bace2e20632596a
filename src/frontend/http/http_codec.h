/*
 * http_codec.h - KServe V2 REST inference messages: request decoding (JSON
 * and the binary tensor extension), shared-memory tensors, response encoding.
 *
 * Request framing. Without an Inference-Header-Content-Length header the
 * whole body is the JSON request. With it, the first that-many bytes are
 * the JSON request and the rest is the binary section: every input with
 * parameters.binary_data_size takes the next that-many bytes, in the order
 * the inputs are listed, and the sizes must add up to the section exactly.
 * Every input has exactly one source of bytes: "data" (a JSON list, nested or
 * flat; of strings for BYTES), parameters.binary_data_size, or
 * parameters.shared_memory_region (with shared_memory_byte_size and an
 * optional shared_memory_offset); binary data and shared memory carry a
 * BYTES tensor serialized (core/bytes.h).
 * Unknown request, input and output parameters are ignored; "timeout" and
 * "priority" must be non-negative integers. A "timeout" other than 0 sets
 * the request's deadline, that many microseconds after it was received;
 * "priority" is accepted and ignored. Content-Encoding gzip and deflate are
 * inflated first (the header length counts decompressed bytes).
 *
 * Response framing. Outputs go out in the order they were requested (every
 * output in model order when none were named). An output is binary when
 * its parameters.binary_data says so, else when the request parameter
 * binary_data_output does; binary outputs carry parameters.binary_data_size
 * and their bytes follow the JSON header in order, and the header's length
 * is reported for the Inference-Header-Content-Length response header.
 * Outputs written to shared memory carry neither data nor bytes.
 *
 * Nothing here touches the server: this is the part of the front end that is
 * fuzzed and unit-tested on its own. A decoded request belongs to one thread
 * at a time, like the pjs_infer_request inside it.
 */
#ifndef PJS_FRONTEND_HTTP_HTTP_CODEC_H
#define PJS_FRONTEND_HTTP_HTTP_CODEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/byte_budget.h"
#include "core/infer.h"
#include "core/manifest.h"
#include "core/shm.h"
#include "core/status.h"
#include "frontend/http/http_buf.h"

/* Largest request body (after decompression) and response body: 2 GiB. */
#define PJS_HTTP_MAX_BODY ((size_t)2 << 30)

/* Where an input's bytes come from when it names a shared-memory region. */
typedef struct pjs_http_shm_ref {
    const char *region; /* borrowed from the JSON header; NULL: not shared memory */
    uint64_t offset;
    uint64_t byte_size;
} pjs_http_shm_ref;

/* A decoded REST inference request and everything its tensors point into. */
typedef struct pjs_http_infer {
    pjs_infer_request req;
    /* The parsed JSON header: names, datatypes and region names point into it. */
    json_t *header;
    /* Inputs given as JSON "data", packed; freed with the request. */
    size_t n_converted;
    void *converted[PJS_INFER_MAX_TENSORS];
    /* Per input as decoded (before validation reorders req.inputs). */
    pjs_http_shm_ref input_shm[PJS_INFER_MAX_TENSORS];
    /* Shared-memory views held until the request is freed: inputs first
     * (in decode order), then requested outputs (indexed by output_view). */
    size_t n_views;
    pjs_shm_view views[2 * PJS_INFER_MAX_TENSORS];
    int output_view[PJS_INFER_MAX_TENSORS]; /* per requested output; -1: none */
} pjs_http_infer;

/* Checks an Inference-Header-Content-Length value (NULL: header absent) against
 * the body length and returns the JSON part's length in *out_json_len (the
 * whole body when absent). INVALID_ARGUMENT for anything but a decimal count
 * no larger than the body. */
int pjs_http_header_length(const char *value, size_t body_len, size_t *out_json_len,
                           pjs_error *err);

/* Decodes body[body_len] into d (overwritten; pjs_http_infer_free it also
 * after a failure). `header_length` is the Inference-Header-Content-Length
 * value or NULL. The request comes out initialised (received time set), with
 * its inputs, requested outputs, id, binary_data_output and deadline (from
 * "timeout"; 0 when none) filled; inputs in
 * shared memory still lack data until pjs_http_infer_map_shm. body must
 * outlive d. Errors are INVALID_ARGUMENT (UNSUPPORTED for a feature pjserve
 * does not have) with a message saying what was wrong and where. */
int pjs_http_infer_decode(pjs_http_infer *d, const void *body, size_t body_len,
                          const char *header_length, pjs_error *err);

/* Looks up the shared-memory regions the request names (inputs and outputs)
 * through `registry` and reads the inputs' bytes into the views; must run
 * before validation reorders the inputs. The views are held until
 * pjs_http_infer_free. Errors: INVALID_ARGUMENT for an unknown region, a
 * window outside it or a region that shrank; RESOURCE_EXHAUSTED when the
 * request byte budget cannot hold the inputs' bytes. */
int pjs_http_infer_map_shm(pjs_http_infer *d, pjs_shm_registry *registry, pjs_error *err);

/* After completion: copies each output requested into shared memory there.
 * INVALID_ARGUMENT when an output is larger than its region window or the
 * region shrank. */
int pjs_http_infer_write_shm_outputs(pjs_http_infer *d, pjs_error *err);

/* Frees what decoding and mapping took (JSON, converted inputs, views); does
 * not touch the request's outputs or model reference. */
void pjs_http_infer_free(pjs_http_infer *d);

/* Encodes a completed request's outputs as the response body into `out`
 * (created by the caller with its limit), and the JSON header's length into
 * *out_header_len, or 0 when no output is binary (the body is pure JSON).
 * Outputs the client asked to classify are first replaced in r by their
 * classes (pjs_classify_outputs). */
int pjs_http_infer_encode(pjs_infer_request *r, const char *model_name,
                          const char *model_version, pjs_http_buf *out, size_t *out_header_len,
                          pjs_error *err);

/* Undoes Content-Encoding (NULL, "" or "identity": copies nothing and sets
 * *out_used to false). gzip and deflate are inflated into `out`, whose limit
 * bounds the result: inflating stops as soon as it is reached
 * (RESOURCE_EXHAUSTED, with out->len == out->limit). The memory `out` grows
 * by is taken from `budget` (NULL: none) as it grows and added to *charged,
 * success or not; the caller gives it back. A take refused is
 * RESOURCE_EXHAUSTED with out->len below the limit. Corrupt or truncated
 * data is INVALID_ARGUMENT, another encoding UNSUPPORTED. */
int pjs_http_inflate(const char *content_encoding, const void *in, size_t len, pjs_http_buf *out,
                     pjs_byte_budget *budget, uint64_t *charged, bool *out_used,
                     pjs_error *err);

/* An upper bound on the size of the body of any valid REST inference
 * request for a model whose manifest is m, at batch sizes up to max_batch:
 * every client input (pjs_manifest_client_tensors; of the largest variant
 * when they are the executable's) at max_batch, each element written as
 * the longest JSON text of its datatype with room for separators, brackets
 * and indentation, plus slack for names, shapes and parameters. Binary
 * tensors are smaller than their JSON text, so the bound holds for them too.
 * 0 when no bound can be given: an extent that varies (-1 in a client
 * tensor), or a BYTES input, whose strings have no length limit. */
uint64_t pjs_http_infer_body_bound(const pjs_manifest *m, int64_t max_batch);

/* The strings of a BYTES input's JSON "data" (a list, nested lists
 * flattened in row-major order) in the serialized form of core/bytes.h:
 * *out (malloc'd, the caller frees it; NULL when there are no strings),
 * *out_nbytes and *out_count. INVALID_ARGUMENT when data is not a list or
 * holds anything but strings; `what` names the tensor ("input \"x\""). */
int pjs_http_bytes_from_json(const json_t *data, const char *what, void **out,
                             size_t *out_nbytes, size_t *out_count, pjs_error *err);

/* Appends a serialized BYTES tensor as a flat JSON list of strings. Each
 * element's bytes are copied as they are, with '"', '\\' and control
 * characters escaped: bytes that are not UTF-8 stay as they are (as
 * Triton's server writes them), so a client reading such an output as JSON
 * fails loudly instead of getting other bytes; such outputs belong in the
 * binary section. INTERNAL when data is not well formed. */
int pjs_http_bytes_to_json(pjs_http_buf *b, const void *data, size_t nbytes, pjs_error *err);

/* Writes {"error": msg} into out; msg need not be valid UTF-8. */
int pjs_http_error_json(const char *msg, pjs_http_buf *out, pjs_error *err);

#endif
