/*
 * call.c - the pieces every call state machine uses (the pjs_grpc_call
 * each call object starts with: its set-up, request from the server, final
 * batch and release), and the generic unary call that serves every method
 * of kind PJS_GRPC_UNARY.
 *
 * A unary call is one object. Its base's `on_new` fires when the server
 * hands us a call with its request payload: the next call of the method is
 * requested, the payload is unpacked into the call's arena, the method's
 * handler builds the response, and one batch sends initial metadata, the
 * response and the status and receives the close (pjs__grpc_reply).
 * `on_done` fires when that batch completed; it frees the call. Nothing else refers to the object, so
 * no lock is needed. A handler whose work runs elsewhere (a model load)
 * defers the call instead: the thread that finishes the work owns it from
 * then on, stores the answer and hands the call back to a queue thread with
 * an empty batch (`on_answer`), which starts that batch
 * (pjs__grpc_unary_answer).
 *
 * Every call state machine asks pjs__grpc_access_check before it serves a
 * call (the generic unary call here, before the request is even unpacked);
 * a refused call is answered UNAUTHENTICATED or PERMISSION_DENIED at once.
 */
#include "frontend/grpc/internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "core/log.h"
#include "frontend/deadline.h"
#include "frontend/grpc/codec.h"
#include "frontend/status_map.h"

/* ---- the base of every call -------------------------------------------------- */

void pjs__grpc_call_init(pjs_grpc_call *c, pjs_grpc_frontend *f, size_t index,
                         void (*on_new)(pjs_grpc_tag *tag, bool ok))
{
    pjs__grpc_call_born(f);
    c->on_new.fn = on_new;
    c->frontend = f;
    c->method = index;
    c->details = grpc_empty_slice();
    grpc_metadata_array_init(&c->metadata);
}

grpc_call_error pjs__grpc_call_request(pjs_grpc_call *c, grpc_byte_buffer **payload)
{
    pjs_grpc_frontend *f = c->frontend;
    void *method = f->registered[c->method];
    /* Armed last: once armed, another thread may run (and free) the call. */
    void *tag = pjs__grpc_tag_arm(&c->on_new);
    return grpc_server_request_registered_call(f->core, method, &c->call, &c->deadline,
                                               &c->metadata, payload, f->cq, f->cq, tag);
}

void pjs__grpc_call_drop(pjs_grpc_call *c)
{
    if (c->call != NULL)
        grpc_call_unref(c->call);
    c->call = NULL;
    grpc_metadata_array_destroy(&c->metadata);
    grpc_slice_unref(c->details);
    c->details = grpc_empty_slice();
}

void pjs__grpc_call_destroy(pjs_grpc_call *c)
{
    pjs__grpc_call_drop(c);
    pjs__grpc_call_gone(c->frontend);
}

grpc_call_error pjs__grpc_reply(pjs_grpc_call *c, grpc_byte_buffer *response, const pjs_error *err,
                                pjs_grpc_tag *tag)
{
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (response != NULL) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = response;
    }
    grpc_slice_unref(c->details);
    c->details = grpc_slice_from_copied_string(err != NULL ? err->msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status =
        (grpc_status_code)(err != NULL ? pjs_status_to_grpc(err->code) : 0);
    ops[n].data.send_status_from_server.status_details = &c->details;
    grpc_metadata mark = {.key = grpc_slice_from_static_string(PJS_ANSWER_MARK)};
    if (err != NULL && err->code != PJS_OK) { /* gRPC copies it when the batch starts */
        mark.value = grpc_slice_from_static_string(pjs_answer_mark(err, true));
        ops[n].data.send_status_from_server.trailing_metadata_count = 1;
        ops[n].data.send_status_from_server.trailing_metadata = &mark;
    }
    n++;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    return pjs__grpc_start_batch(c->call, ops, n, tag);
}

grpc_call_error pjs__grpc_recv_close(pjs_grpc_call *c, pjs_grpc_tag *tag)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    return pjs__grpc_start_batch(c->call, &op, 1, tag);
}

/* ---- shared helpers --------------------------------------------------------- */

static void free_packed(void *buf, size_t len)
{
    (void)len;
    free(buf);
}

grpc_byte_buffer *pjs__grpc_buffer_from(uint8_t *buf, size_t len)
{
    grpc_slice slice = grpc_slice_new_with_len(buf, len, free_packed);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

grpc_byte_buffer *pjs__grpc_pack(const ProtobufCMessage *m, pjs_error *err)
{
    size_t len;
    if (pjs_grpc_packed_size(m, &len, err) != 0)
        return NULL;
    /* packed straight into gRPC's slice: its count and bytes are one
     * allocation (none for a few bytes), and nothing is copied again */
    grpc_slice slice = grpc_slice_malloc(len);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(slice));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

/* The value of the "authorization" metadata in `who` (the first one; all
 * of them counted). gRPC hands keys lowercased. */
static void find_authorization(const grpc_metadata_array *md, pjs_access_caller *who)
{
    static const char key[] = "authorization";
    for (size_t i = 0; i < md->count; i++) {
        const grpc_slice *k = &md->metadata[i].key;
        if (GRPC_SLICE_LENGTH(*k) != sizeof key - 1 ||
            memcmp(GRPC_SLICE_START_PTR(*k), key, sizeof key - 1) != 0)
            continue;
        if (who->n_authorization++ == 0) {
            who->authorization = (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value);
            who->authorization_len = GRPC_SLICE_LENGTH(md->metadata[i].value);
        }
    }
}

int pjs__grpc_access_check(const pjs_grpc_call *c, pjs_error *err)
{
    return pjs__grpc_access_check_path(c, pjs__grpc_methods[c->method].path, err);
}

int pjs__grpc_access_check_path(const pjs_grpc_call *c, const char *path, pjs_error *err)
{
    pjs_access_class cls = pjs_access_grpc_class(path);
    if (cls == PJS_ACCESS_OPEN)
        return 0;
    pjs_access_caller who = {0};
    find_authorization(&c->metadata, &who);
    if (cls == PJS_ACCESS_ADMIN) {
        char *peer = grpc_call_get_peer(c->call);
        who.loopback = pjs_access_peer_is_loopback(peer);
        gpr_free(peer);
    }
    const char *method = strrchr(path, '/');
    int rc = pjs_access_check(c->frontend->access, cls, &who,
                              method != NULL ? method + 1 : path, err);
    if (rc != 0)
        pjs_debug("grpc %s: refused: %s", path, err->msg);
    return rc;
}

const char *pjs__grpc_metadata_value(const grpc_metadata_array *md, const char *key,
                                     size_t *len)
{
    size_t key_len = strlen(key);
    for (size_t i = 0; i < md->count; i++) {
        const grpc_metadata *m = &md->metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) == key_len &&
            memcmp(GRPC_SLICE_START_PTR(m->key), key, key_len) == 0) {
            *len = GRPC_SLICE_LENGTH(m->value);
            return (const char *)GRPC_SLICE_START_PTR(m->value);
        }
    }
    *len = 0;
    return NULL;
}

void pjs__grpc_client_id(const pjs_grpc_frontend *f, grpc_call *call,
                         const grpc_metadata_array *md, char *out)
{
    static const char key[] = PJS_CLIENT_HEADER;
    char *peer = grpc_call_get_peer(call);
    pjs_access_caller who = {0};
    find_authorization(md, &who);
    bool trusted = pjs_client_grpc_peer_is_unix(peer) ||
                   pjs_access_holds_admin_token(f->access, &who);
    bool named = false;
    for (size_t i = 0; trusted && !named && i < md->count; i++) {
        const grpc_metadata *m = &md->metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) == sizeof key - 1 &&
            memcmp(GRPC_SLICE_START_PTR(m->key), key, sizeof key - 1) == 0)
            named = pjs_client_id_parse((const char *)GRPC_SLICE_START_PTR(m->value),
                                        GRPC_SLICE_LENGTH(m->value), out);
    }
    if (!named)
        pjs_client_id_of_grpc_peer(peer, out);
    gpr_free(peer);
}

uint64_t pjs__grpc_deadline_ns(gpr_timespec deadline)
{
    if (deadline.clock_type == GPR_TIMESPAN ||
        gpr_time_cmp(deadline, gpr_inf_future(deadline.clock_type)) == 0)
        return 0;
    /* gRPC's clocks have their own epochs: carry only the time left over. */
    gpr_timespec left = gpr_time_sub(deadline, gpr_now(deadline.clock_type));
    const int64_t limit_s = INT64_MAX / 1000000000 - 1;
    if (left.tv_sec > limit_s)
        return 0; /* centuries away: no deadline */
    int64_t left_ns = left.tv_sec < -limit_s ? -limit_s * 1000000000
                                             : left.tv_sec * 1000000000 + left.tv_nsec;
    return pjs_deadline_after_ns(pjs_now_ns(), left_ns);
}

/* ---- the generic unary call ------------------------------------------------- */

typedef struct unary_call {
    pjs_grpc_call base;
    pjs_grpc_tag on_done;
    pjs_grpc_tag on_answer; /* a deferred call's answer is ready (unary_on_answer) */
    pjs_error answer_err;   /* ... and its error, when answer_failed */
    bool answer_failed;
    grpc_byte_buffer *payload;
    grpc_byte_buffer *response;
    pjs_grpc_arena arena;
} unary_call;

static void unary_free(unary_call *c)
{
    if (c->payload != NULL)
        grpc_byte_buffer_destroy(c->payload);
    if (c->response != NULL)
        grpc_byte_buffer_destroy(c->response);
    pjs_grpc_arena_reset(&c->arena);
    pjs__grpc_call_destroy(&c->base);
    free(c);
}

/* What unary_run returns when the handler deferred its answer. */
#define UNARY_DEFERRED 1

/* Unpacks the request and runs the handler; the response is packed into
 * c->response, unless the handler deferred it (UNARY_DEFERRED). */
static int unary_run(unary_call *c, const pjs_grpc_method *m, pjs_error *err)
{
    pjs_grpc_unary_ctx ctx = {.frontend = c->base.frontend, .arena = &c->arena, .call = c};
    int rc = pjs__grpc_access_check(&c->base, err);
    if (rc != 0)
        return rc;
    grpc_slice payload;
    rc = pjs__grpc_take_payload(&c->payload, pjs__grpc_small_limit(c->base.frontend), &payload,
                                err);
    if (rc != 0)
        return rc;
    ProtobufCMessage *request = protobuf_c_message_unpack(
        m->request, &c->arena.allocator, GRPC_SLICE_LENGTH(payload), GRPC_SLICE_START_PTR(payload));
    grpc_slice_unref(payload);
    if (request == NULL)
        return pjs_error_set(
            err, c->arena.exhausted ? PJS_ERR_RESOURCE_EXHAUSTED : PJS_ERR_INVALID_ARGUMENT,
            "malformed %s: the bytes received are not a valid protobuf %s", m->request->short_name,
            m->request->short_name);
    ProtobufCMessage *response = NULL;
    rc = m->handle(&ctx, request, &response, err);
    if (ctx.deferred) /* c belongs to whoever answers it now */
        rc = UNARY_DEFERRED;
    else if (rc == 0) {
        c->response = pjs__grpc_pack(response, err);
        rc = c->response == NULL ? err->code : 0;
    }
    if (ctx.model != NULL)
        pjs_model_unref(ctx.model);
    return rc;
}

static void unary_on_done(pjs_grpc_tag *tag, bool ok)
{
    (void)ok; /* nothing to do differently: the call is over either way */
    unary_free(PJS_GRPC_CONTAINER(tag, unary_call, on_done));
}

/* Starts the reply batch (err NULL: c->response and OK); the call is freed
 * when it completes. */
static void unary_reply(unary_call *c, const pjs_error *err)
{
    const char *path = pjs__grpc_methods[c->base.method].path;
    if (err != NULL)
        pjs_debug("grpc %s: %s", path, err->msg);
    if (pjs__grpc_reply(&c->base, c->response, err, &c->on_done) != GRPC_CALL_OK) {
        pjs_error("grpc %s: cannot start the reply batch", path);
        unary_free(c);
    }
}

static void unary_on_new(pjs_grpc_tag *tag, bool ok)
{
    unary_call *c = PJS_GRPC_CONTAINER(tag, unary_call, base.on_new);
    if (!ok) { /* the server is shutting down */
        unary_free(c);
        return;
    }
    pjs__grpc_request(c->base.frontend, c->base.method);
    pjs_error err;
    pjs_error_clear(&err);
    int rc = unary_run(c, &pjs__grpc_methods[c->base.method], &err);
    if (rc != UNARY_DEFERRED) /* else pjs__grpc_unary_answer replies */
        unary_reply(c, rc != 0 ? &err : NULL);
}

pjs_grpc_deferred *pjs__grpc_unary_defer(pjs_grpc_unary_ctx *ctx)
{
    unary_call *c = ctx->call;
    ctx->deferred = true;
    pjs__grpc_dispatch_begin(c->base.frontend); /* stop waits for the answer */
    return (pjs_grpc_deferred *)c;
}

/* A deferred call's answer, back on a completion-queue thread: the reply
 * batch starts there, as every other unary reply does, so gRPC's own
 * completion-queue ordering covers what it reads of the batch until the
 * call is freed. */
static void unary_on_answer(pjs_grpc_tag *tag, bool ok)
{
    (void)ok; /* the reply batch reports a cancelled call itself */
    unary_call *c = PJS_GRPC_CONTAINER(tag, unary_call, on_answer);
    pjs_grpc_frontend *f = c->base.frontend;
    unary_reply(c, c->answer_failed ? &c->answer_err : NULL);
    pjs__grpc_dispatch_end(f);
}

void pjs__grpc_unary_answer(pjs_grpc_deferred *d, const ProtobufCMessage *response,
                            const pjs_error *err)
{
    unary_call *c = (unary_call *)d;
    if (err == NULL && response != NULL &&
        (c->response = pjs__grpc_pack(response, &c->answer_err)) == NULL)
        err = &c->answer_err;
    if (err != NULL) {
        c->answer_err = *err;
        c->answer_failed = true;
    }
    /* An empty batch completes at once: it hands the call to a queue thread. */
    if (pjs__grpc_start_batch(c->base.call, NULL, 0, &c->on_answer) != GRPC_CALL_OK) {
        pjs_grpc_frontend *f = c->base.frontend;
        pjs_error("grpc %s: cannot hand a deferred answer to the queue",
                  pjs__grpc_methods[c->base.method].path);
        unary_free(c);
        pjs__grpc_dispatch_end(f);
    }
}

static void request_unary(pjs_grpc_frontend *f, size_t index)
{
    unary_call *c = calloc(1, sizeof *c);
    if (c == NULL) {
        pjs_error("grpc: no memory to accept a call of %s", pjs__grpc_methods[index].path);
        return;
    }
    pjs__grpc_call_init(&c->base, f, index, unary_on_new);
    c->on_done.fn = unary_on_done;
    c->on_answer.fn = unary_on_answer;
    pjs_grpc_arena_init(&c->arena, PJS_GRPC_UNARY_ARENA_LIMIT);
    if (pjs__grpc_call_request(&c->base, &c->payload) != GRPC_CALL_OK)
        unary_free(c);
}

void pjs__grpc_request(pjs_grpc_frontend *f, size_t index)
{
    atomic_fetch_add_explicit(&f->calls_handed_over, 1, memory_order_relaxed);
    if (atomic_load(&f->stopping))
        return;
    switch (pjs__grpc_methods[index].kind) {
    case PJS_GRPC_UNARY: request_unary(f, index); break;
    case PJS_GRPC_INFER: pjs__grpc_request_infer(f, index); break;
    case PJS_GRPC_STREAM_INFER: pjs__grpc_request_stream(f, index); break;
    case PJS_GRPC_HEALTH_WATCH: pjs__grpc_request_watch(f, index); break;
    case PJS_GRPC_REFLECTION: pjs__grpc_request_reflection(f, index); break;
    }
}
