/*
 * infer_wire.h - a serialized ModelInferRequest split into its tensor
 * bytes, left where they arrived, and everything else.
 *
 * protobuf-c copies every bytes field it unpacks, so a request whose
 * tensors travel in raw_input_contents would be copied once more after gRPC
 * assembled it: for a 600 KB image that copy, and the 600 KB allocation
 * behind it, cost as much as the rest of decoding. The split reads only the
 * top level of the message (tags and lengths, never the tensor bytes):
 * each raw_input_contents entry is noted as a pointer into the message and
 * every other field is copied, in order, into a small contiguous buffer
 * that protobuf-c unpacks as before. Top-level framing is checked as
 * protobuf-c checks it (a tag of at most 5 bytes with a field number, a
 * varint of at most 10 bytes, a length prefix of at most 5 bytes and at
 * most INT_MAX, no field running past the end, no group or unknown wire
 * type), so a message is refused exactly when unpacking it whole would be;
 * the fields copied are then checked by protobuf-c itself.
 *
 * Pure: no gRPC, no server; any thread.
 */
#ifndef PJS_FRONTEND_GRPC_INFER_WIRE_H
#define PJS_FRONTEND_GRPC_INFER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "core/status.h"
#include "frontend/grpc/arena.h"

/* ModelInferRequest's `repeated bytes raw_input_contents = 7`. */
#define PJS_GRPC_RAW_INPUT_CONTENTS_FIELD 7u

/* The parts of one message: every field but raw_input_contents, in their
 * order (rest, rest_len bytes, in the arena; NULL when there are none), and
 * the raw_input_contents entries in theirs (raw, n_raw entries in the
 * arena), each pointing into the message itself (data NULL for an empty
 * one, as protobuf-c leaves it). */
typedef struct pjs_grpc_wire_split {
    const uint8_t *rest;
    size_t rest_len;
    ProtobufCBinaryData *raw;
    size_t n_raw;
} pjs_grpc_wire_split;

/* Splits the len bytes at data. Errors: INVALID_ARGUMENT ("malformed
 * ModelInferRequest: ...", naming the offset) when the top-level framing is
 * broken, RESOURCE_EXHAUSTED when the arena's limit is reached (then
 * a->exhausted is set). */
int pjs_grpc_wire_split_request(const uint8_t *data, size_t len, pjs_grpc_arena *a,
                                pjs_grpc_wire_split *out, pjs_error *err);

#endif
