/*
 * health.c - grpc.health.v1.Health: Check and Watch.
 *
 * The server is SERVING when pjs_server_ready (live, not draining and,
 * under --strict-readiness true, every model that should be loaded READY)
 * and NOT_SERVING otherwise. Both the whole server ("") and
 * inference.GRPCInferenceService answer; Check of any other service is
 * NOT_FOUND, Watch of one reports SERVICE_UNKNOWN, as the protocol says.
 *
 * A Watch stream sends the status when it opens and again whenever it
 * changes. The server has no readiness callbacks, so the completion-queue
 * threads poll (pjs__grpc_health_poll) about every PJS_GRPC_HEALTH_POLL_MS,
 * busy or idle. Open watches are kept in the front end's
 * list under watch_lock, which also guards each watch's state; a watch ends
 * when the client cancels it or the server stops (cancel_all_calls), and is
 * freed when its last outstanding tag returns.
 */
#include "frontend/grpc/internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "health.pb-c.h"

#define INFERENCE_SERVICE "inference.GRPCInferenceService"

typedef Grpc__Health__V1__HealthCheckResponse__ServingStatus serving_status;

struct pjs_grpc_watch {
    pjs_grpc_call base;
    pjs_grpc_tag on_write;
    pjs_grpc_tag on_close;
    grpc_byte_buffer *payload;

    /* Under frontend->watch_lock: */
    pjs_grpc_watch *next;
    bool listed;
    bool known; /* the service is one we report on */
    bool writing;
    bool metadata_sent;
    bool dead; /* cancelled or a write failed */
    int refs;  /* outstanding tags */
    serving_status last_sent;
    grpc_byte_buffer *out; /* the message being written */
};

bool pjs__grpc_health_known(const char *service)
{
    return service[0] == '\0' || strcmp(service, INFERENCE_SERVICE) == 0;
}

static serving_status server_status(pjs_grpc_frontend *f)
{
    return pjs_server_ready(f->server)
               ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

int pjs__grpc_health_check(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                           ProtobufCMessage **response, pjs_error *err)
{
    const Grpc__Health__V1__HealthCheckRequest *req =
        (const Grpc__Health__V1__HealthCheckRequest *)request;
    if (!pjs__grpc_health_known(req->service))
        return pjs_error_set(
            err, PJS_ERR_NOT_FOUND,
            "unknown service \"%.256s\" (pjserve reports on \"\" and \"" INFERENCE_SERVICE "\")",
            req->service);
    Grpc__Health__V1__HealthCheckResponse *resp = pjs_grpc_arena_alloc(ctx->arena, sizeof *resp);
    if (resp == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the health response");
    *resp = (Grpc__Health__V1__HealthCheckResponse)GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp->status = server_status(ctx->frontend);
    *response = &resp->base;
    return 0;
}

/* ---- Watch ------------------------------------------------------------------ */

static void watch_free(pjs_grpc_watch *w)
{
    if (w->payload != NULL)
        grpc_byte_buffer_destroy(w->payload);
    if (w->out != NULL)
        grpc_byte_buffer_destroy(w->out);
    pjs__grpc_call_destroy(&w->base);
    free(w);
}

static void unlist_locked(pjs_grpc_frontend *f, pjs_grpc_watch *w)
{
    for (pjs_grpc_watch **p = &f->watches; *p != NULL; p = &(*p)->next) {
        if (*p == w) {
            *p = w->next;
            break;
        }
    }
    w->listed = false;
}

/* Sends `status` unless a write is in flight or the stream is over. */
static void send_locked(pjs_grpc_watch *w, serving_status status)
{
    if (w->writing || w->dead)
        return;
    Grpc__Health__V1__HealthCheckResponse msg = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    msg.status = status;
    pjs_error err;
    w->out = pjs__grpc_pack(&msg.base, &err);
    if (w->out == NULL) {
        pjs_error("grpc Health/Watch: %s", err.msg);
        return;
    }
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!w->metadata_sent)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = w->out;
    if (pjs__grpc_start_batch(w->base.call, ops, n, &w->on_write) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(w->out);
        w->out = NULL;
        w->dead = true;
        return;
    }
    w->metadata_sent = true;
    w->writing = true;
    w->last_sent = status;
    w->refs++;
}

static serving_status watch_status(pjs_grpc_watch *w)
{
    return w->known ? server_status(w->base.frontend)
                    : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
}

/* Ends a step under watch_lock: frees the watch after its last tag. */
static void watch_step_done_locked(pjs_grpc_watch *w)
{
    pjs_grpc_frontend *f = w->base.frontend;
    bool last = --w->refs == 0;
    if (last && w->listed)
        unlist_locked(f, w);
    pthread_mutex_unlock(&f->watch_lock);
    if (last)
        watch_free(w);
}

static void watch_on_write(pjs_grpc_tag *tag, bool ok)
{
    pjs_grpc_watch *w = PJS_GRPC_CONTAINER(tag, pjs_grpc_watch, on_write);
    pthread_mutex_lock(&w->base.frontend->watch_lock);
    grpc_byte_buffer_destroy(w->out);
    w->out = NULL;
    w->writing = false;
    if (!ok)
        w->dead = true;
    else if (watch_status(w) != w->last_sent)
        send_locked(w, watch_status(w));
    watch_step_done_locked(w);
}

static void watch_on_close(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    pjs_grpc_watch *w = PJS_GRPC_CONTAINER(tag, pjs_grpc_watch, on_close);
    pthread_mutex_lock(&w->base.frontend->watch_lock);
    w->dead = true;
    if (w->listed)
        unlist_locked(w->base.frontend, w);
    watch_step_done_locked(w);
}

static void watch_on_new(pjs_grpc_tag *tag, bool ok)
{
    pjs_grpc_watch *w = PJS_GRPC_CONTAINER(tag, pjs_grpc_watch, base.on_new);
    pjs_grpc_frontend *f = w->base.frontend;
    if (!ok) {
        watch_free(w);
        return;
    }
    pjs__grpc_request(f, w->base.method);
    grpc_slice payload;
    pjs_error payload_err;
    Grpc__Health__V1__HealthCheckRequest *req = NULL;
    if (pjs__grpc_take_payload(&w->payload, pjs__grpc_small_limit(f), &payload, &payload_err) == 0)
        req = grpc__health__v1__health_check_request__unpack(NULL, GRPC_SLICE_LENGTH(payload),
                                                             GRPC_SLICE_START_PTR(payload));
    grpc_slice_unref(payload);
    pthread_mutex_lock(&f->watch_lock);
    w->refs = 1; /* this step's own, dropped when it ends */
    if (req == NULL) {
        pjs_error err;
        pjs_error_set(&err, PJS_ERR_INVALID_ARGUMENT,
                      "malformed HealthCheckRequest: the bytes received are not a valid "
                      "protobuf HealthCheckRequest");
        if (pjs__grpc_reply(&w->base, NULL, &err, &w->on_close) == GRPC_CALL_OK)
            w->refs++;
        watch_step_done_locked(w);
        return;
    }
    w->known = pjs__grpc_health_known(req->service);
    grpc__health__v1__health_check_request__free_unpacked(req, NULL);
    if (pjs__grpc_recv_close(&w->base, &w->on_close) == GRPC_CALL_OK) {
        w->refs++;
        w->next = f->watches;
        f->watches = w;
        w->listed = true;
        send_locked(w, watch_status(w));
    }
    watch_step_done_locked(w);
}

void pjs__grpc_request_watch(pjs_grpc_frontend *f, size_t index)
{
    pjs_grpc_watch *w = calloc(1, sizeof *w);
    if (w == NULL) {
        pjs_error("grpc: no memory to accept a Health/Watch call");
        return;
    }
    pjs__grpc_call_init(&w->base, f, index, watch_on_new);
    w->on_write.fn = watch_on_write;
    w->on_close.fn = watch_on_close;
    if (pjs__grpc_call_request(&w->base, &w->payload) != GRPC_CALL_OK)
        watch_free(w);
}

void pjs__grpc_health_poll(pjs_grpc_frontend *f)
{
    uint64_t now_ns = pjs_now_ns();
    if (now_ns < atomic_load(&f->next_health_poll_ns))
        return;
    if (pthread_mutex_trylock(&f->watch_lock) != 0)
        return; /* another thread is polling */
    atomic_store(&f->next_health_poll_ns, now_ns + (uint64_t)PJS_GRPC_HEALTH_POLL_MS * 1000000u);
    if (f->watches != NULL) {
        serving_status now = server_status(f);
        for (pjs_grpc_watch *w = f->watches; w != NULL; w = w->next)
            if (w->known && w->last_sent != now)
                send_locked(w, now);
    }
    pthread_mutex_unlock(&f->watch_lock);
}
