/*
 * grpc_unary.h - one blocking unary gRPC call from the gateway to a worker,
 * for the pool's probes: a protobuf-c request out, a protobuf-c response
 * back, the worker's status as a pjs_error.
 */
#ifndef PJS_GATEWAY_GRPC_UNARY_H
#define PJS_GATEWAY_GRPC_UNARY_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "core/status.h"

/* Calls `method` ("/pkg.Service/Method") on `channel` with `request`,
 * waiting at most timeout_ms. On success *response is the unpacked answer
 * (free with protobuf_c_message_free_unpacked). `token`, when not NULL, is
 * sent as `authorization: Bearer <token>`. Errors carry the worker's status
 * and message, or UNAVAILABLE / DEADLINE_EXCEEDED when it did not answer. */
int pjs_gw_unary(grpc_channel *channel, const char *method, const ProtobufCMessage *request,
                 const ProtobufCMessageDescriptor *response_type, const char *token,
                 unsigned timeout_ms, ProtobufCMessage **response, pjs_error *err);

/* The pjserve status for a gRPC status code. */
pjs_status pjs_gw_status_from_grpc(grpc_status_code code);

#endif
