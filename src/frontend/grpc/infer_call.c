/*
 * infer_call.c - unary ModelInfer.
 *
 * States of one call:
 *   requested --on_new--> decoding (CQ thread): the next call is requested,
 *     RECV_CLOSE_ON_SERVER is started (to learn of cancellation), the
 *     caller's access checked, the payload decoded, the model looked up
 *     and the request submitted. Any failure is answered at once.
 *   in the dispatcher --on_done (completion thread)--> the response is
 *     encoded (or the error mapped) and the send batch started.
 *   sent --on_sent--> and --on_close--> both tags back: the call is freed.
 *
 * `refs` counts the tags still to come (close and send), so whichever of
 * the two completes last frees the call. The call's deadline becomes the
 * request's (the `timeout` parameter's when that is earlier), so the
 * scheduler answers DEADLINE_EXCEEDED instead of running a request nobody
 * waits for. A cancelled call still runs in the dispatcher (there is no way
 * to withdraw a submitted request); its response is then dropped unencoded.
 * The request's bytes count against the server's budget for request bytes
 * in flight from decoding until the request is released.
 */
#include "frontend/grpc/internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "frontend/deadline.h"
#include "frontend/grpc/codec.h"
#include "frontend/status_map.h"

typedef struct infer_call {
    pjs_grpc_tag on_new;
    pjs_grpc_tag on_close;
    pjs_grpc_tag on_sent;
    pjs_grpc_frontend *frontend;
    size_t method;
    grpc_call *call;
    gpr_timespec deadline; /* the client's deadline, on a gRPC clock */
    grpc_metadata_array metadata;
    grpc_byte_buffer *payload;
    grpc_byte_buffer *response;
    grpc_slice details;
    int cancelled;      /* written by RECV_CLOSE_ON_SERVER */
    atomic_bool closed; /* on_close ran: `cancelled` is final */
    atomic_int refs;    /* tags still to come */
    pjs_model *model;
    pjs_grpc_infer decoded;
    uint64_t charged; /* request bytes taken from the server's budget */
} infer_call;

static void infer_free(infer_call *c)
{
    pjs_grpc_infer_release(&c->decoded);
    pjs__grpc_release_request(c->frontend, &c->charged);
    if (c->model != NULL)
        pjs_model_unref(c->model);
    if (c->call != NULL)
        grpc_call_unref(c->call);
    if (c->payload != NULL)
        grpc_byte_buffer_destroy(c->payload);
    if (c->response != NULL)
        grpc_byte_buffer_destroy(c->response);
    grpc_slice_unref(c->details);
    grpc_metadata_array_destroy(&c->metadata);
    pjs__grpc_call_gone(c->frontend);
    free(c);
}

static void infer_unref(infer_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        infer_free(c);
}

static void infer_on_close(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    infer_call *c = PJS_GRPC_CONTAINER(tag, infer_call, on_close);
    atomic_store(&c->closed, true);
    infer_unref(c);
}

static void infer_on_sent(pjs_grpc_tag *tag, bool ok)
{
    (void)ok; /* a failed send means the client went away: nothing to do */
    infer_unref(PJS_GRPC_CONTAINER(tag, infer_call, on_sent));
}

/* Starts the one send batch: the response, or err as the status. */
static void infer_reply(infer_call *c, const pjs_error *err)
{
    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (err == NULL) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->response;
    }
    c->details = grpc_slice_from_copied_string(err != NULL ? err->msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status =
        (grpc_status_code)(err != NULL ? pjs_status_to_grpc(err->code) : GRPC_STATUS_OK);
    ops[n++].data.send_status_from_server.status_details = &c->details;
    if (pjs__grpc_start_batch(c->call, ops, n, &c->on_sent) != GRPC_CALL_OK) {
        pjs_error("grpc ModelInfer: cannot start the reply batch");
        infer_unref(c);
    }
}

/* Completion thread: encode and send. */
static void infer_on_done(pjs_infer_request *r)
{
    infer_call *c = r->frontend_ctx;
    pjs_grpc_frontend *f = c->frontend;
    pjs_error err;
    pjs_error_clear(&err);
    int rc = r->error.code;
    if (rc != 0) {
        err = r->error;
    } else if (atomic_load(&c->closed) && c->cancelled) {
        rc = pjs_error_set(&err, PJS_ERR_UNAVAILABLE, "the client cancelled the call");
    } else {
        Inference__ModelInferResponse *resp;
        rc = pjs_grpc_infer_response(&c->decoded, PJS_MODEL_VERSION, &resp, &err);
        if (rc == 0) {
            c->response = pjs__grpc_pack(&resp->base, &err);
            rc = c->response == NULL ? err.code : 0;
        }
    }
    /* The packed response owns its bytes: the request can go now. */
    pjs_grpc_infer_release(&c->decoded);
    pjs__grpc_release_request(f, &c->charged);
    pjs_model_unref(c->model);
    c->model = NULL;
    infer_reply(c, rc == 0 ? NULL : &err);
    pjs__grpc_dispatch_end(f);
}

/* Decodes, looks the model up and submits; on failure err says why. */
static int infer_submit(infer_call *c, pjs_error *err)
{
    pjs_grpc_frontend *f = c->frontend;
    int rc = pjs__grpc_access_check(f, c->method, c->call, &c->metadata, err);
    if (rc != 0)
        return rc;
    grpc_slice payload;
    rc = pjs__grpc_take_request(f, &c->payload, &payload, &c->charged, err);
    if (rc != 0)
        return rc;
    rc = pjs_grpc_infer_decode(&c->decoded, GRPC_SLICE_START_PTR(payload),
                                   GRPC_SLICE_LENGTH(payload), pjs_server_shm(f->server), err);
    grpc_slice_unref(payload);
    if (rc != 0)
        return rc;
    const Inference__ModelInferRequest *msg = c->decoded.msg;
    rc = pjs_server_get_model(f->server, msg->model_name, msg->model_version, &c->model, err);
    if (rc != 0)
        return rc;
    pjs_infer_request *r = &c->decoded.req;
    r->model = c->model;
    r->deadline_ns = pjs_deadline_earlier(r->deadline_ns, pjs__grpc_deadline_ns(c->deadline));
    r->on_done = infer_on_done;
    r->frontend_ctx = c;
    pjs__grpc_dispatch_begin(f);
    rc = pjs_server_submit(f->server, r, err);
    if (rc != 0)
        pjs__grpc_dispatch_end(f);
    return rc;
}

static void infer_on_new(pjs_grpc_tag *tag, bool ok)
{
    infer_call *c = PJS_GRPC_CONTAINER(tag, infer_call, on_new);
    if (!ok) {
        infer_free(c);
        return;
    }
    pjs__grpc_request(c->frontend, c->method);
    atomic_store(&c->refs, 2);
    if (pjs__grpc_recv_close(c->call, &c->cancelled, &c->on_close) != GRPC_CALL_OK)
        infer_unref(c);
    pjs_error err;
    pjs_error_clear(&err);
    if (infer_submit(c, &err) != 0) {
        pjs_debug("grpc ModelInfer: %s", err.msg);
        infer_reply(c, &err);
    }
}

void pjs__grpc_request_infer(pjs_grpc_frontend *f, size_t index)
{
    infer_call *c = calloc(1, sizeof *c);
    if (c == NULL) {
        pjs_error("grpc: no memory to accept a ModelInfer call");
        return;
    }
    pjs__grpc_call_born(f);
    c->on_new.fn = infer_on_new;
    c->on_close.fn = infer_on_close;
    c->on_sent.fn = infer_on_sent;
    c->frontend = f;
    c->method = index;
    c->details = grpc_empty_slice();
    grpc_metadata_array_init(&c->metadata);
    pjs_grpc_infer_init(&c->decoded);
    if (grpc_server_request_registered_call(f->core, f->registered[index], &c->call, &c->deadline,
                                            &c->metadata, &c->payload, f->cq, f->cq,
                                            pjs__grpc_tag_arm(&c->on_new)) != GRPC_CALL_OK)
        infer_free(c);
}
