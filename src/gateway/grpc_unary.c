/*
 * grpc_unary.c - a blocking unary call on the gRPC C core: one batch with
 * every op on a pluck queue of its own, waited for with the call's
 * deadline plus a second (the library ends the call at its deadline).
 */
#include "gateway/grpc_unary.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>

/* Largest answer a probe accepts. */
#define UNARY_RESPONSE_MAX ((size_t)64 << 20)

pjs_status pjs_gw_status_from_grpc(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK: return PJS_OK;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE: return PJS_ERR_INVALID_ARGUMENT;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return PJS_ERR_DEADLINE_EXCEEDED;
    case GRPC_STATUS_NOT_FOUND: return PJS_ERR_NOT_FOUND;
    case GRPC_STATUS_PERMISSION_DENIED: return PJS_ERR_PERMISSION_DENIED;
    case GRPC_STATUS_UNAUTHENTICATED: return PJS_ERR_UNAUTHENTICATED;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return PJS_ERR_RESOURCE_EXHAUSTED;
    case GRPC_STATUS_FAILED_PRECONDITION: return PJS_ERR_FAILED_PRECONDITION;
    case GRPC_STATUS_UNIMPLEMENTED: return PJS_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_CANCELLED:
    case GRPC_STATUS_ABORTED: return PJS_ERR_UNAVAILABLE;
    default: return PJS_ERR_INTERNAL;
    }
}

static int pack_request(const ProtobufCMessage *request, grpc_byte_buffer **out, pjs_error *err)
{
    size_t size = protobuf_c_message_get_packed_size(request);
    grpc_slice slice = grpc_slice_malloc(size);
    protobuf_c_message_pack(request, GRPC_SLICE_START_PTR(slice));
    *out = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return *out != NULL ? 0 : pjs_error_set(err, PJS_ERR_NOMEM, "no memory for a probe");
}

static int unpack_response(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *type,
                           ProtobufCMessage **out, pjs_error *err)
{
    if (bb == NULL)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "the worker answered OK without a message");
    if (grpc_byte_buffer_length(bb) > UNARY_RESPONSE_MAX)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "the worker's answer is larger than %zu bytes", UNARY_RESPONSE_MAX);
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot read the worker's answer");
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    *out = protobuf_c_message_unpack(type, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    return *out != NULL ? 0
                        : pjs_error_set(err, PJS_ERR_INTERNAL,
                                        "the worker's answer is not a %s", type->name);
}

int pjs_gw_unary(grpc_channel *channel, const char *method, const ProtobufCMessage *request,
                 const ProtobufCMessageDescriptor *response_type, const char *token,
                 unsigned timeout_ms, ProtobufCMessage **response, pjs_error *err)
{
    *response = NULL;
    grpc_byte_buffer *send = NULL;
    if (pack_request(request, &send, err) != 0)
        return err->code;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_call(channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                               grpc_slice_from_static_string(method), NULL,
                                               deadline, NULL);
    char bearer[600];
    grpc_metadata md[1];
    size_t n_md = 0;
    if (token != NULL) {
        snprintf(bearer, sizeof bearer, "Bearer %s", token);
        md[0].key = grpc_slice_from_static_string("authorization");
        md[0].value = grpc_slice_from_copied_string(bearer);
        n_md = 1;
    }
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_md;
    ops[0].data.send_initial_metadata.metadata = md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    int rc = 0;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, call, NULL);
    if (e != GRPC_CALL_OK) {
        rc = pjs_error_set(err, PJS_ERR_INTERNAL, "cannot start %s (gRPC error %d)", method, e);
    } else {
        gpr_timespec wait = gpr_time_add(deadline, gpr_time_from_millis(1000, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_pluck(cq, call, wait, NULL);
        if (ev.type != GRPC_OP_COMPLETE) {
            grpc_call_cancel(call, NULL);
            grpc_completion_queue_pluck(cq, call, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            rc = pjs_error_set(err, PJS_ERR_DEADLINE_EXCEEDED, "%s did not complete", method);
        } else if (status != GRPC_STATUS_OK) {
            rc = pjs_error_set(err, pjs_gw_status_from_grpc(status), "%.*s",
                               (int)GRPC_SLICE_LENGTH(details),
                               (const char *)GRPC_SLICE_START_PTR(details));
        } else {
            rc = unpack_response(recv, response_type, response, err);
        }
    }
    if (n_md > 0)
        grpc_slice_unref(md[0].value);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    if (recv != NULL)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    return rc;
}
