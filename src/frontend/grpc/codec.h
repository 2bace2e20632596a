/*
 * codec.h - ModelInferRequest bytes -> pjs_infer_request -> ModelInferResponse.
 *
 * The codec is the part of the gRPC front end that touches untrusted bytes,
 * kept free of the gRPC runtime and of the server so the unit tests and the
 * fuzzer link it alone. Decoding unpacks the message into the call's arena
 * and maps it onto a pjs_infer_request: names, datatypes and shapes are
 * borrowed from the message; input bytes come from raw_input_contents, read
 * in place in the bytes received (infer_wire.h: never copied, so those bytes
 * must outlive the request), from typed `contents` (converted to the
 * datatype's raw form), or from a registered shared-memory region (read
 * into a view held until the call ends).
 * Checking the request against the model is pjs_infer_validate's job, not
 * the codec's: the codec rejects only what cannot be mapped at all.
 *
 * A pjs_grpc_infer belongs to one call; one thread uses it at a time.
 */
#ifndef PJS_FRONTEND_GRPC_CODEC_H
#define PJS_FRONTEND_GRPC_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/infer.h"
#include "core/shm.h"
#include "core/status.h"
#include "frontend/grpc/arena.h"
#include "grpc_service.pb-c.h"

/* Decoding may allocate at most this many bytes per byte of message, plus
 * PJS_GRPC_DECODE_SLACK: typed contents expand (a 1-byte varint becomes an
 * 8-byte INT64 and is converted once more). */
#define PJS_GRPC_DECODE_FACTOR 4u
#define PJS_GRPC_DECODE_SLACK ((size_t)64 << 20)

/* Largest message gRPC carries either way: 2 GiB - 1. */
#define PJS_GRPC_MAX_MESSAGE INT32_MAX

/* One decoded inference request and everything it borrows from. */
typedef struct pjs_grpc_infer {
    pjs_grpc_arena arena;              /* the message, conversions, the response */
    Inference__ModelInferRequest *msg; /* unpacked into arena; NULL before decode */
    pjs_infer_request req;             /* inputs point into msg, arena or views */

    /* Scheduling options as sent, each accepted as int64 or uint64. A
     * non-zero timeout sets req.deadline_ns (received + timeout); priority
     * is accepted and ignored (the scheduler's disciplines do not use it). */
    bool has_priority;
    uint64_t priority;
    bool has_timeout;
    uint64_t timeout_us;

    /* Shared-memory windows the request reads or writes; released with it. */
    size_t n_input_views;
    pjs_shm_view input_views[PJS_INFER_MAX_TENSORS];
    pjs_shm_view output_views[PJS_INFER_MAX_TENSORS]; /* by requested index; region NULL if none */
} pjs_grpc_infer;

/* Prepares d (zeroed, empty arena). */
void pjs_grpc_infer_init(pjs_grpc_infer *d);
/* Releases the views, the outputs and the arena; d can be decoded into again. */
void pjs_grpc_infer_release(pjs_grpc_infer *d);
/* The same, but the arena keeps one block and the request's tensor tables
 * are left as they are (decoding resets them): what a call object reused
 * for the next request does instead of releasing and initializing again.
 * pjs_grpc_infer_release frees the block when d goes for good. */
void pjs_grpc_infer_recycle(pjs_grpc_infer *d);

/* Unpacks and maps one ModelInferRequest, whose len bytes at data the
 * decoded request borrows (raw_input_contents) until d is recycled or
 * released; req.deadline_ns comes from the
 * `timeout` parameter (0 when absent or 0; the caller folds in the call's
 * own deadline). shm may be NULL (every shared memory parameter is then
 * refused). Errors: INVALID_ARGUMENT ("malformed ModelInferRequest: ..." for
 * bytes that are not the message, or a message naming the input and the
 * problem, a shared-memory region that shrank among them), NOT_FOUND for an
 * unknown shared-memory region, RESOURCE_EXHAUSTED when decoding would pass
 * the memory bound or shared-memory input bytes the request budget, UNSUPPORTED
 * for parameters pjserve recognises but does not implement. On failure d
 * still holds what it decoded; release it. */
int pjs_grpc_infer_decode(pjs_grpc_infer *d, const uint8_t *data, size_t len, pjs_shm_registry *shm,
                          pjs_error *err);

/* Builds the response of a completed request (d->req outputs set, no
 * error) in d's arena: the requested outputs (or all) in manifest order,
 * each with one raw_output_contents entry, which borrows the output bytes.
 * Outputs the client placed in shared memory are copied there now and
 * answered with an empty entry (INVALID_ARGUMENT when the region shrank).
 * model_version is reported as given. */
int pjs_grpc_infer_response(pjs_grpc_infer *d, const char *model_version,
                            Inference__ModelInferResponse **out, pjs_error *err);

/* m's serialized size in *len; RESOURCE_EXHAUSTED when it passes gRPC's
 * message limit. */
int pjs_grpc_packed_size(const ProtobufCMessage *m, size_t *len, pjs_error *err);
/* Serializes m into a malloc'd buffer (*out_len bytes; the caller frees
 * it). NOMEM when the buffer cannot be had. */
int pjs_grpc_pack(const ProtobufCMessage *m, uint8_t **out, size_t *out_len, pjs_error *err);

#endif
