/*
 * proxy.c - a front end that forwards: each call the server hands over is
 * checked, then answered locally, forwarded to one worker, fanned out to
 * all of them, or piped as a stream, as the gateway's ops decide
 * (grpc_frontend.h).
 *
 * One object per call (`proxy_call`), on the front end's completion queue
 * and threads. Every batch started on either side holds a reference; the
 * object is freed when the last batch returned. A mutex orders the steps of
 * a stream, whose two directions complete on any thread.
 *
 * Unary (ROUTED): read the client's message, pick a worker, one client
 * batch with every op, then one server batch relaying the worker's initial
 * metadata, message, status and trailing metadata. How the call went on
 * the channel (answered, never sent, broken) and the worker's
 * pjserve-answer mark go to ops->done, which tells the pool and says
 * whether the call goes to a worker not tried yet (the gateway's relay
 * policy, gateway/relay_policy.h); any other ending is relayed as it is.
 *
 * Fan-out: the same client batch to every worker ops->fanout names; when
 * all answered, ops->finish makes the reply of their results (the first
 * error, naming the worker, or the answers merged).
 *
 * Streams (STREAM_ROUTED): the first message picks the worker; then two
 * pumps run until the worker's status arrives: client -> worker (receive,
 * send, ..., half-close) and worker -> client (receive, send, ...). The
 * status is relayed once the worker's last message was sent on. A client
 * that goes away cancels the worker's call (gRPC propagates cancellation
 * from the server call to the client call made under it, and the deadline
 * with it). A client that reads nothing holds one message here: the pump
 * stops reading from the worker, whose own stall bound then ends its call.
 * Streams are listed on the front end so that a sweep (between the queue
 * threads' events) cuts off a client whose message has waited for the same
 * bound (--grpc-stream-write-timeout-ms), as the worker does its own; else
 * the stream would stay open for as long as such a client does.
 *
 * Messages are decompressed (payload.c, under the request limit) before
 * they are forwarded: the client's compression is between it and us.
 * Metadata is forwarded but for the credential, which the worker token
 * replaces, gRPC's reserved keys, and `pjserve-client`, which names the
 * client's address instead (frontend/client_id.h: workers count per client).
 *
 * With a tracer, an inference call (ModelInfer, ModelStreamInfer) is traced
 * here too: its sampling is decided as a server's (the client's
 * traceparent, else the rate), and the worker gets a traceparent naming the
 * gateway's forward span and carrying the decision, in place of the
 * client's. When the call is over, a sampled one records the gateway's
 * server span and, under it, the forward span (first send to last answer,
 * with the worker and the attempts).
 */
#include "frontend/grpc/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "core/log.h"
#include "frontend/deadline.h"
#include "frontend/status_map.h"
#include "trace/trace.h"

#define MAX_FANOUT 64

typedef struct pjs_grpc_proxy_call proxy_call;

/* One client call to a worker (a fan-out has several). */
typedef struct upstream {
    proxy_call *owner;
    int worker;
    grpc_call *call;
    pjs_grpc_tag tag;
    grpc_metadata_array initial, trailing;
    grpc_byte_buffer *response;
    grpc_status_code status;
    grpc_slice details;
    char text[512]; /* the details as a C string (proxy_take_details) */
} upstream;

struct pjs_grpc_proxy_call {
    pjs_grpc_frontend *f;
    grpc_call *call; /* the client's call to us */
    grpc_metadata_array metadata;
    char method[256];
    pjs_grpc_proxy_kind kind;
    pthread_mutex_t lock;
    int refs; /* batches outstanding + 1 while being set up; guarded by lock */

    /* The client's first message, decompressed, and its charge to the budget. */
    grpc_byte_buffer *first_bb;
    grpc_slice first;
    uint64_t charged;
    uint64_t tried;
    int cancelled;

    pjs_grpc_tag on_first, on_reply;
    grpc_slice reply_details;
    grpc_byte_buffer *reply_message;
    grpc_metadata *forward_md; /* the client's metadata as sent to the worker */
    size_t n_forward_md;
    grpc_slice bearer;
    grpc_slice client_id; /* the forwarded pjserve-client value */

    /* The calls to workers, in the order made: up[0] is up0, any later one
     * (a retry, the rest of a fan-out) allocated on its own, so that a call
     * object stays small. */
    upstream *up[MAX_FANOUT];
    upstream up0;
    size_t n_up, pending;
    uint64_t change; /* a fan-out's remembered change (grpc_frontend.h); 0: none */

    /* Streams. */
    pjs_grpc_tag on_client_msg, on_worker_sent, on_worker_msg, on_client_sent, on_worker_status,
        on_client_close;
    grpc_byte_buffer *client_msg, *worker_msg;
    bool client_done;      /* the client half-closed (or failed) */
    bool worker_msgs_done; /* the worker's messages ended */
    bool status_in;        /* the worker's status arrived */
    bool sending_client;   /* a message to the client is in flight */
    uint64_t sending_since_ns; /* pjs_now_ns() when that message was handed to gRPC */
    bool stall_cut;        /* the sweep cut the client off */
    bool initial_sent;     /* initial metadata went to the client */
    bool final_started;

    /* On f->relayed while a stream (under f->relayed_lock). */
    proxy_call *relayed_prev, *relayed_next;
    bool relayed;

    /* Tracing (see top): the gateway's server span and its forward span,
     * the forward's traceparent as sent, and the times of both. */
    pjs_trace_ctx trace, forward;
    grpc_slice traceparent;
    uint64_t started_ns, forward_start_ns, forward_end_ns;
    int last_worker;
    grpc_status_code final_status;
};

static void proxy_ref(proxy_call *p)
{
    pthread_mutex_lock(&p->lock);
    p->refs++;
    pthread_mutex_unlock(&p->lock);
}

/* Lists a stream on its front end for the stall sweep. */
static void relayed_add(proxy_call *p)
{
    pjs_grpc_frontend *f = p->f;
    pthread_mutex_lock(&f->relayed_lock);
    p->relayed_next = f->relayed;
    if (f->relayed != NULL)
        f->relayed->relayed_prev = p;
    f->relayed = p;
    p->relayed = true;
    pthread_mutex_unlock(&f->relayed_lock);
}

static void relayed_remove(proxy_call *p)
{
    pjs_grpc_frontend *f = p->f;
    pthread_mutex_lock(&f->relayed_lock);
    if (p->relayed_prev != NULL)
        p->relayed_prev->relayed_next = p->relayed_next;
    else
        f->relayed = p->relayed_next;
    if (p->relayed_next != NULL)
        p->relayed_next->relayed_prev = p->relayed_prev;
    pthread_mutex_unlock(&f->relayed_lock);
}

/* A sampled call's spans (see top), once it is over. */
static void trace_spans(const proxy_call *p)
{
    pjs_tracer *t = p->f->proxy->tracer;
    if (t == NULL || !p->trace.sampled)
        return;
    const char *method = strrchr(p->method, '/');
    char name[PJS_SPAN_NAME_MAX];
    snprintf(name, sizeof name, "gateway %.80s", method != NULL ? method + 1 : p->method);
    pjs_span s;
    pjs_span_init_self(&s, &p->trace, PJS_SPAN_SERVER, name, p->started_ns, pjs_now_ns());
    pjs_span_attr_str(&s, "rpc.system", "grpc");
    pjs_span_attr_str(&s, "rpc.method", p->method);
    if (p->final_status != GRPC_STATUS_OK) {
        char text[64];
        snprintf(text, sizeof text, "gRPC status %d", (int)p->final_status);
        pjs_span_set_error(&s, text);
    }
    pjs_tracer_emit(t, &s);
    if (p->forward_start_ns == 0)
        return;
    pjs_span_init_self(&s, &p->forward, PJS_SPAN_CLIENT, "forward to a worker",
                       p->forward_start_ns,
                       p->forward_end_ns != 0 ? p->forward_end_ns : pjs_now_ns());
    pjs_span_attr_int(&s, "pjserve.worker", p->last_worker);
    pjs_span_attr_int(&s, "pjserve.attempts", (int64_t)p->n_up);
    pjs_tracer_emit(t, &s);
}

static void proxy_free(proxy_call *p)
{
    pjs_grpc_frontend *f = p->f;
    if (p->relayed)
        relayed_remove(p);
    for (size_t i = 0; i < p->n_up; i++) {
        upstream *u = p->up[i];
        if (u->call != NULL)
            grpc_call_unref(u->call);
        grpc_metadata_array_destroy(&u->initial);
        grpc_metadata_array_destroy(&u->trailing);
        if (u->response != NULL)
            grpc_byte_buffer_destroy(u->response);
        grpc_slice_unref(u->details);
        if (u != &p->up0)
            free(u);
    }
    if (p->first_bb != NULL)
        grpc_byte_buffer_destroy(p->first_bb);
    if (p->client_msg != NULL)
        grpc_byte_buffer_destroy(p->client_msg);
    if (p->worker_msg != NULL)
        grpc_byte_buffer_destroy(p->worker_msg);
    if (p->reply_message != NULL)
        grpc_byte_buffer_destroy(p->reply_message);
    grpc_slice_unref(p->first);
    grpc_slice_unref(p->reply_details);
    trace_spans(p);
    grpc_slice_unref(p->bearer);
    grpc_slice_unref(p->client_id);
    grpc_slice_unref(p->traceparent);
    pjs__grpc_release_request(f, &p->charged);
    free(p->forward_md);
    grpc_metadata_array_destroy(&p->metadata);
    if (p->call != NULL)
        grpc_call_unref(p->call);
    pthread_mutex_destroy(&p->lock);
    free(p);
    pjs__grpc_call_gone(f);
}

static void proxy_unref(proxy_call *p)
{
    pthread_mutex_lock(&p->lock);
    bool last = --p->refs == 0;
    pthread_mutex_unlock(&p->lock);
    if (last)
        proxy_free(p);
}

/* Starts a batch holding a reference; drops it again when the start failed. */
static bool start(proxy_call *p, grpc_call *call, const grpc_op *ops, size_t n, pjs_grpc_tag *tag)
{
    proxy_ref(p);
    if (pjs__grpc_start_batch(call, ops, n, tag) == GRPC_CALL_OK)
        return true;
    proxy_unref(p);
    return false;
}

/* ---- metadata --------------------------------------------------------------- */

static bool slice_is(grpc_slice s, const char *text)
{
    size_t n = strlen(text);
    return GRPC_SLICE_LENGTH(s) == n && memcmp(GRPC_SLICE_START_PTR(s), text, n) == 0;
}

/* Keys never relayed: the credential, gRPC's own and HTTP/2's. */
static bool relayable(grpc_slice key)
{
    size_t n = GRPC_SLICE_LENGTH(key);
    const char *k = (const char *)GRPC_SLICE_START_PTR(key);
    if (n == 0 || k[0] == ':' || (n >= 5 && memcmp(k, "grpc-", 5) == 0))
        return false;
    return !slice_is(key, "authorization") && !slice_is(key, "user-agent") &&
           !slice_is(key, "te") && !slice_is(key, "content-type") && !slice_is(key, "host") &&
           !slice_is(key, PJS_CLIENT_HEADER);
}

/* Whether the call is traced here (see top): an inference call with a
 * tracer on. Decides its sampling and makes the forward's traceparent. */
static bool start_trace(proxy_call *p)
{
    pjs_tracer *t = p->f->proxy->tracer;
    if (t == NULL || !pjs_tracer_enabled(t) ||
        (strstr(p->method, "/ModelInfer") == NULL && strstr(p->method, "/ModelStreamInfer") == NULL))
        return false;
    size_t len = 0;
    const char *value = pjs__grpc_metadata_value(&p->metadata, "traceparent", &len);
    pjs_trace_ctx incoming;
    bool given = value != NULL && pjs_trace_parse(value, len, &incoming);
    pjs_tracer_start_relay(t, given ? &incoming : NULL, &p->trace, &p->forward);
    char text[PJS_TRACEPARENT_LEN + 1];
    pjs_trace_format(&p->forward, text);
    p->traceparent = grpc_slice_from_copied_string(text);
    return true;
}

/* The client's metadata as sent to workers: relayable entries (the
 * traceparent replaced when the call is traced here), the client and the
 * worker token. Slices are borrowed from p->metadata, p->client_id,
 * p->traceparent and p->bearer. */
static bool build_forward_md(proxy_call *p)
{
    const grpc_metadata_array *md = &p->metadata;
    p->forward_md = calloc(md->count + 3, sizeof *p->forward_md);
    if (p->forward_md == NULL)
        return false;
    bool traced = start_trace(p);
    size_t n = 0;
    for (size_t i = 0; i < md->count; i++)
        if (relayable(md->metadata[i].key) &&
            !(traced && slice_is(md->metadata[i].key, "traceparent")))
            p->forward_md[n++] = md->metadata[i];
    if (traced) {
        p->forward_md[n].key = grpc_slice_from_static_string("traceparent");
        p->forward_md[n++].value = p->traceparent;
    }
    char client[PJS_CLIENT_ID_MAX];
    pjs__grpc_client_id(p->f, p->call, &p->metadata, client);
    p->client_id = grpc_slice_from_copied_string(client);
    p->forward_md[n].key = grpc_slice_from_static_string(PJS_CLIENT_HEADER);
    p->forward_md[n++].value = p->client_id;
    const char *token = p->f->proxy->worker_token;
    if (token != NULL) {
        char bearer[600];
        snprintf(bearer, sizeof bearer, "Bearer %s", token);
        p->bearer = grpc_slice_from_copied_string(bearer);
        p->forward_md[n].key = grpc_slice_from_static_string("authorization");
        p->forward_md[n++].value = p->bearer;
    }
    p->n_forward_md = n;
    return true;
}

/* The relayable entries of a worker's metadata, in a new array whose
 * slices are borrowed from `from` (free the array only). */
static grpc_metadata *relay_md(const grpc_metadata_array *from, size_t *n)
{
    grpc_metadata *out = calloc(from->count + 1, sizeof *out);
    *n = 0;
    for (size_t i = 0; out != NULL && i < from->count; i++)
        if (relayable(from->metadata[i].key))
            out[(*n)++] = from->metadata[i];
    return out;
}

/* ---- answering the client ------------------------------------------------------ */

/* The final batch to the client: initial metadata (from `head` when it
 * has not gone yet), the message (may be NULL), the status and the close.
 * `tail` supplies trailing metadata (may be NULL). */
static void reply(proxy_call *p, const grpc_metadata_array *head, grpc_byte_buffer *message,
                  grpc_status_code status, grpc_slice details, const grpc_metadata_array *tail)
{
    size_t n_head = 0, n_tail = 0;
    grpc_metadata *head_md = head != NULL && !p->initial_sent ? relay_md(head, &n_head) : NULL;
    grpc_metadata *tail_md = tail != NULL ? relay_md(tail, &n_tail) : NULL;
    grpc_slice_unref(p->reply_details);
    p->reply_details = grpc_slice_ref(details);
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!p->initial_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = n_head;
        ops[n++].data.send_initial_metadata.metadata = head_md;
        p->initial_sent = true;
    }
    if (message != NULL) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = message;
    }
    p->final_status = status;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = status;
    ops[n].data.send_status_from_server.status_details = &p->reply_details;
    ops[n].data.send_status_from_server.trailing_metadata_count = n_tail;
    ops[n++].data.send_status_from_server.trailing_metadata = tail_md;
    if (p->kind != PJS_GRPC_PROXY_STREAM_ROUTED) {
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n++].data.recv_close_on_server.cancelled = &p->cancelled;
    }
    start(p, p->call, ops, n, &p->on_reply);
    /* gRPC copied what it needs of the arrays when the batch started. */
    free(head_md);
    free(tail_md);
}

static void reply_error(proxy_call *p, const pjs_error *err)
{
    grpc_slice details = grpc_slice_from_copied_string(err->msg);
    grpc_metadata mark = {.key = grpc_slice_from_static_string(PJS_ANSWER_MARK),
                          .value = grpc_slice_from_static_string(pjs_answer_mark(err, true))};
    grpc_metadata_array tail = {.count = 1, .capacity = 1, .metadata = &mark};
    reply(p, NULL, NULL, (grpc_status_code)pjs_status_to_grpc(err->code), details, &tail);
    grpc_slice_unref(details);
}

static void on_reply(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    proxy_unref(PJS_GRPC_CONTAINER(tag, proxy_call, on_reply));
}

/* ---- calls to workers ------------------------------------------------------------ */

static void on_upstream(pjs_grpc_tag *tag, bool ok);

/* Creates the client call to `worker` under the client's call (deadline
 * and cancellation propagate); NULL when there is no memory for it. */
static upstream *upstream_open(proxy_call *p, int worker)
{
    upstream *u = p->n_up == 0 ? &p->up0 : calloc(1, sizeof *u);
    if (u == NULL)
        return NULL;
    p->up[p->n_up++] = u;
    u->owner = p;
    u->worker = worker;
    p->last_worker = worker;
    if (p->forward_start_ns == 0)
        p->forward_start_ns = pjs_now_ns();
    u->details = grpc_empty_slice();
    u->status = GRPC_STATUS_UNKNOWN;
    u->tag.fn = on_upstream;
    grpc_metadata_array_init(&u->initial);
    grpc_metadata_array_init(&u->trailing);
    grpc_channel *ch = p->f->proxy->channel(p->f->proxy->ctx, worker);
    grpc_slice method = grpc_slice_from_copied_string(p->method);
    u->call = grpc_channel_create_call(ch, p->call, GRPC_PROPAGATE_DEFAULTS, p->f->cq, method,
                                       NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    grpc_slice_unref(method); /* the call took its own reference */
    return u;
}

/* One batch with every op of a unary call. */
static bool upstream_unary(proxy_call *p, upstream *u)
{
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = p->n_forward_md;
    ops[0].data.send_initial_metadata.metadata = p->forward_md;
    grpc_slice msg = grpc_slice_ref(p->first);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&msg, 1);
    grpc_slice_unref(msg);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->response;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &u->trailing;
    ops[5].data.recv_status_on_client.status = &u->status;
    ops[5].data.recv_status_on_client.status_details = &u->details;
    bool ok = start(p, u->call, ops, 6, &u->tag);
    grpc_byte_buffer_destroy(bb);
    return ok;
}

/* Copies a completed call's status details (bytes gRPC's own threads wrote:
 * tests/tsan.supp names this function) into u->text. */
static void proxy_take_details(upstream *u)
{
    size_t n = GRPC_SLICE_LENGTH(u->details);
    if (n >= sizeof u->text)
        n = sizeof u->text - 1;
    memcpy(u->text, GRPC_SLICE_START_PTR(u->details), n);
    u->text[n] = '\0';
}

static bool details_contain(const upstream *u, const char *phrase)
{
    return strcasestr(u->text, phrase) != NULL;
}

/* The worker's answer mark in its trailing metadata (status_map.h), copied
 * into buf; NULL: unmarked. */
static const char *answer_mark_of(const upstream *u, char *buf, size_t size)
{
    for (size_t i = 0; i < u->trailing.count; i++) {
        const grpc_metadata *m = &u->trailing.metadata[i];
        if (grpc_slice_str_cmp(m->key, PJS_ANSWER_MARK) != 0)
            continue;
        size_t n = GRPC_SLICE_LENGTH(m->value);
        if (n >= size)
            n = size - 1;
        memcpy(buf, GRPC_SLICE_START_PTR(m->value), n);
        buf[n] = '\0';
        return buf;
    }
    return NULL;
}

/* How a call to a worker went on the channel. A status the worker marked
 * as its own is an answer, whatever it says (a model's NOT_FOUND, a
 * request's UNAVAILABLE); what its mark means (refused before running, or
 * because the worker is going) the gateway judges.
 * An unmarked UNAVAILABLE, INTERNAL or UNKNOWN came from our side of the
 * channel: "failed to connect" (gRPC's words: nothing was sent) or a
 * connection that failed under the call. Other unmarked codes are the
 * client's (its deadline, its cancellation) or a message limit: no fault
 * of the worker's. Only the channel's failures are not answers, so no text
 * a client can choose (a model name in an error) makes one. */
static pjs_grpc_proxy_outcome outcome_of(const upstream *u, bool marked)
{
    if (u->status == GRPC_STATUS_OK || marked)
        return PJS_GRPC_PROXY_ANSWERED;
    switch (u->status) {
    case GRPC_STATUS_UNAVAILABLE:
        return details_contain(u, "failed to connect") ? PJS_GRPC_PROXY_NOT_SENT
                                                        : PJS_GRPC_PROXY_BROKEN;
    case GRPC_STATUS_INTERNAL:
    case GRPC_STATUS_UNKNOWN: return PJS_GRPC_PROXY_BROKEN;
    default: return PJS_GRPC_PROXY_ANSWERED;
    }
}

/* u's result for the gateway; `mark` is room for its mark. */
static pjs_grpc_proxy_result result_of(const upstream *u, char *mark, size_t size)
{
    const char *m = answer_mark_of(u, mark, size);
    return (pjs_grpc_proxy_result){.worker = u->worker,
                                   .outcome = outcome_of(u, m != NULL),
                                   .mark = m,
                                   .status = (int)u->status,
                                   .details = u->text};
}

/* Tells the gateway a call ended as u did; true: try another worker. */
static bool upstream_done(proxy_call *p, const upstream *u, pjs_grpc_proxy_outcome *outcome)
{
    char mark[32];
    pjs_grpc_proxy_result r = result_of(u, mark, sizeof mark);
    if (outcome != NULL)
        *outcome = r.outcome;
    return p->f->proxy->done(p->f->proxy->ctx, p->method, &r);
}

/* A call that could not be started on worker w: never sent. */
static void upstream_not_started(proxy_call *p, int w)
{
    pjs_grpc_proxy_result r = {.worker = w,
                               .outcome = PJS_GRPC_PROXY_NOT_SENT,
                               .status = GRPC_STATUS_INTERNAL,
                               .details = "the call could not be started"};
    p->f->proxy->done(p->f->proxy->ctx, p->method, &r);
}

static bool routed_try(proxy_call *p, pjs_error *err);

/* A unary forward completed. It goes to another worker when the gateway
 * says it provably did not run there and one is left; else the worker's
 * answer is relayed (its refusal, when no other could take it), or, when
 * it reached no worker, the reason none could take it. */
static void routed_done(proxy_call *p, upstream *u)
{
    pjs_grpc_proxy_outcome outcome;
    pjs_error err;
    if (upstream_done(p, u, &outcome) && p->n_up < MAX_FANOUT) {
        pjs_debug("gateway: %s: worker %d did not run it, trying another", p->method, u->worker);
        if (routed_try(p, &err))
            return;
        if (outcome != PJS_GRPC_PROXY_ANSWERED) {
            reply_error(p, &err);
            return;
        }
    }
    reply(p, &u->initial, u->response, u->status, u->details, &u->trailing);
}

/* Every worker of a fan-out answered: the reply the gateway makes of them. */
static void fanout_done(proxy_call *p)
{
    const pjs_grpc_proxy_ops *ops = p->f->proxy;
    pjs_grpc_proxy_result results[MAX_FANOUT];
    char marks[MAX_FANOUT][32];
    const uint8_t *answers[MAX_FANOUT];
    size_t lengths[MAX_FANOUT];
    grpc_slice slices[MAX_FANOUT];
    for (size_t i = 0; i < p->n_up; i++) {
        results[i] = result_of(p->up[i], marks[i], sizeof marks[i]);
        slices[i] = grpc_empty_slice();
        if (p->up[i]->response != NULL) {
            grpc_byte_buffer_reader r;
            if (grpc_byte_buffer_reader_init(&r, p->up[i]->response)) {
                slices[i] = grpc_byte_buffer_reader_readall(&r);
                grpc_byte_buffer_reader_destroy(&r);
            }
        }
        answers[i] = GRPC_SLICE_START_PTR(slices[i]);
        lengths[i] = GRPC_SLICE_LENGTH(slices[i]);
    }
    pjs_grpc_proxy_reply out;
    memset(&out, 0, sizeof out);
    pjs_error err;
    if (ops->finish(ops->ctx, p->method, p->change, results, answers, lengths, p->n_up, &out,
                    &err) != 0) {
        reply_error(p, &err);
    } else {
        upstream *from = p->up[out.from];
        grpc_slice details = out.own_details ? grpc_slice_ref(from->details)
                                             : grpc_slice_from_copied_string(out.details);
        if (out.message != NULL)
            p->reply_message = pjs__grpc_buffer_from(out.message, out.len);
        reply(p, &from->initial, p->reply_message, (grpc_status_code)out.status, details,
              out.status != GRPC_STATUS_OK ? &from->trailing : NULL);
        grpc_slice_unref(details);
    }
    for (size_t i = 0; i < p->n_up; i++)
        grpc_slice_unref(slices[i]);
}

static void on_upstream(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    upstream *u = PJS_GRPC_CONTAINER(tag, upstream, tag);
    proxy_call *p = u->owner;
    p->forward_end_ns = pjs_now_ns();
    proxy_take_details(u);
    if (p->kind == PJS_GRPC_PROXY_ROUTED) {
        routed_done(p, u);
    } else {
        upstream_done(p, u, NULL);
        pthread_mutex_lock(&p->lock);
        bool last = --p->pending == 0;
        pthread_mutex_unlock(&p->lock);
        if (last)
            fanout_done(p);
    }
    proxy_unref(p);
}

/* Sends the unary call to a worker not tried yet (or answers that it could
 * not start it); false with err, and nothing done, when there is none. */
static bool routed_try(proxy_call *p, pjs_error *err)
{
    const pjs_grpc_proxy_ops *ops = p->f->proxy;
    int w = ops->pick(ops->ctx, p->method, GRPC_SLICE_START_PTR(p->first),
                      GRPC_SLICE_LENGTH(p->first), p->tried, err);
    if (w < 0)
        return false;
    p->tried |= 1ull << w;
    upstream *u = upstream_open(p, w);
    if (u == NULL) {
        upstream_not_started(p, w);
        pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the call to worker %d", w);
        reply_error(p, err);
    } else if (!upstream_unary(p, u)) {
        upstream_not_started(p, w);
        pjs_error_set(err, PJS_ERR_INTERNAL, "cannot start the call to worker %d", w);
        reply_error(p, err);
    }
    return true;
}

/* Sends the unary call to a worker not tried yet, or answers the error. */
static void routed_send(proxy_call *p)
{
    pjs_error err;
    if (!routed_try(p, &err))
        reply_error(p, &err);
}

static void fanout_send(proxy_call *p)
{
    const pjs_grpc_proxy_ops *ops = p->f->proxy;
    pjs_error err;
    uint64_t mask = ops->fanout(ops->ctx, p->method, GRPC_SLICE_START_PTR(p->first),
                                GRPC_SLICE_LENGTH(p->first), &p->change, &err);
    if (mask == 0) {
        reply_error(p, &err);
        return;
    }
    /* Every call made before any starts: no memory for one, none is sent. */
    for (int w = 0; w < MAX_FANOUT; w++) {
        if ((mask & (1ull << w)) && upstream_open(p, w) == NULL) {
            pjs_error_set(&err, PJS_ERR_NOMEM, "no memory for the calls to the workers");
            reply_error(p, &err);
            return;
        }
    }
    pthread_mutex_lock(&p->lock);
    p->pending = p->n_up + 1; /* +1 until every call started */
    pthread_mutex_unlock(&p->lock);
    for (size_t i = 0; i < p->n_up; i++) {
        upstream *u = p->up[i];
        int w = u->worker;
        if (!upstream_unary(p, u)) {
            upstream_not_started(p, w);
            u->status = GRPC_STATUS_INTERNAL;
            pthread_mutex_lock(&p->lock);
            p->pending--;
            pthread_mutex_unlock(&p->lock);
        }
    }
    pthread_mutex_lock(&p->lock);
    bool last = --p->pending == 0;
    pthread_mutex_unlock(&p->lock);
    if (last)
        fanout_done(p);
}

static void answer_local(proxy_call *p)
{
    const pjs_grpc_proxy_ops *ops = p->f->proxy;
    uint8_t *out = NULL;
    size_t len = 0;
    pjs_error err;
    if (ops->answer(ops->ctx, p->method, GRPC_SLICE_START_PTR(p->first),
                    GRPC_SLICE_LENGTH(p->first), &out, &len, &err) != 0) {
        reply_error(p, &err);
        return;
    }
    p->reply_message = pjs__grpc_buffer_from(out, len);
    reply(p, NULL, p->reply_message, GRPC_STATUS_OK, grpc_empty_slice(), NULL);
}

/* ---- streams ---------------------------------------------------------------------- */

static void stream_recv_client(proxy_call *p)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &p->client_msg;
    if (!start(p, p->call, &op, 1, &p->on_client_msg)) {
        pthread_mutex_lock(&p->lock);
        p->client_done = true;
        pthread_mutex_unlock(&p->lock);
    }
}

static void stream_recv_worker(proxy_call *p)
{
    upstream *u = p->up[0];
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!p->initial_sent) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &u->initial;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &p->worker_msg;
    start(p, u->call, ops, n, &p->on_worker_msg);
}

/* Relays the worker's status once it is in, its messages ended and no
 * message to the client is in flight. Lock held; returns whether to. */
static bool stream_final_due(proxy_call *p)
{
    if (p->final_started || !p->status_in || !p->worker_msgs_done || p->sending_client)
        return false;
    p->final_started = true;
    return true;
}

static void stream_final(proxy_call *p)
{
    upstream *u = p->up[0];
    upstream_done(p, u, NULL);
    reply(p, &u->initial, NULL, u->status, u->details, &u->trailing);
}

/* The client sent a message (or half-closed): pass it on. */
static void on_client_msg(pjs_grpc_tag *tag, bool ok)
{
    proxy_call *p = PJS_GRPC_CONTAINER(tag, proxy_call, on_client_msg);
    upstream *u = p->up[0];
    grpc_op op;
    memset(&op, 0, sizeof op);
    grpc_byte_buffer *plain_bb = NULL;
    if (ok && p->client_msg != NULL) {
        grpc_slice plain;
        pjs_error err;
        if (pjs__grpc_take_payload(&p->client_msg, p->f->max_message, &plain, &err) != 0) {
            pjs_log_limited(&p->f->refused_stream_msg_log, PJS_LOG_WARN,
                            "gateway: %s: a stream message was refused: %s", p->method, err.msg);
            grpc_call_cancel_with_status(p->call, (grpc_status_code)pjs_status_to_grpc(err.code),
                                         err.msg, NULL);
            proxy_unref(p);
            return;
        }
        plain_bb = grpc_raw_byte_buffer_create(&plain, 1);
        grpc_slice_unref(plain);
        op.op = GRPC_OP_SEND_MESSAGE;
        op.data.send_message.send_message = plain_bb;
    } else {
        pthread_mutex_lock(&p->lock);
        p->client_done = true;
        pthread_mutex_unlock(&p->lock);
        op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    }
    start(p, u->call, &op, 1, &p->on_worker_sent);
    if (plain_bb != NULL)
        grpc_byte_buffer_destroy(plain_bb);
    proxy_unref(p);
}

/* A message (or the half-close) reached the worker: read the next one. */
static void on_worker_sent(pjs_grpc_tag *tag, bool ok)
{
    proxy_call *p = PJS_GRPC_CONTAINER(tag, proxy_call, on_worker_sent);
    pthread_mutex_lock(&p->lock);
    bool more = ok && !p->client_done;
    pthread_mutex_unlock(&p->lock);
    if (more)
        stream_recv_client(p);
    proxy_unref(p);
}

/* The worker sent a message (or its messages ended): pass it on. */
static void on_worker_msg(pjs_grpc_tag *tag, bool ok)
{
    proxy_call *p = PJS_GRPC_CONTAINER(tag, proxy_call, on_worker_msg);
    upstream *u = p->up[0];
    if (ok && p->worker_msg != NULL) {
        size_t n_head = 0;
        grpc_metadata *head = !p->initial_sent ? relay_md(&u->initial, &n_head) : NULL;
        grpc_op ops[2];
        size_t n = 0;
        memset(ops, 0, sizeof ops);
        pthread_mutex_lock(&p->lock);
        p->sending_client = true;
        p->sending_since_ns = pjs_now_ns();
        if (!p->initial_sent) {
            ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
            ops[n].data.send_initial_metadata.count = n_head;
            ops[n++].data.send_initial_metadata.metadata = head;
            p->initial_sent = true;
        }
        pthread_mutex_unlock(&p->lock);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = p->worker_msg;
        if (!start(p, p->call, ops, n, &p->on_client_sent)) {
            pthread_mutex_lock(&p->lock);
            p->sending_client = false;
            p->worker_msgs_done = true;
            pthread_mutex_unlock(&p->lock);
            grpc_call_cancel(u->call, NULL);
        }
        free(head);
        proxy_unref(p);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->worker_msgs_done = true;
    bool final = stream_final_due(p);
    pthread_mutex_unlock(&p->lock);
    if (final)
        stream_final(p);
    proxy_unref(p);
}

/* A message reached the client: read the worker's next one. */
static void on_client_sent(pjs_grpc_tag *tag, bool ok)
{
    proxy_call *p = PJS_GRPC_CONTAINER(tag, proxy_call, on_client_sent);
    grpc_byte_buffer_destroy(p->worker_msg);
    p->worker_msg = NULL;
    pthread_mutex_lock(&p->lock);
    p->sending_client = false;
    if (!ok)
        p->worker_msgs_done = true;
    bool final = stream_final_due(p);
    pthread_mutex_unlock(&p->lock);
    if (!ok)
        grpc_call_cancel(p->up[0]->call, NULL);
    else if (!final)
        stream_recv_worker(p);
    if (final)
        stream_final(p);
    proxy_unref(p);
}

static void on_worker_status(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    proxy_call *p = PJS_GRPC_CONTAINER(tag, proxy_call, on_worker_status);
    p->forward_end_ns = pjs_now_ns();
    proxy_take_details(p->up[0]);
    pthread_mutex_lock(&p->lock);
    p->status_in = true;
    bool final = stream_final_due(p);
    pthread_mutex_unlock(&p->lock);
    if (final)
        stream_final(p);
    proxy_unref(p);
}

static void on_client_close(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    proxy_call *p = PJS_GRPC_CONTAINER(tag, proxy_call, on_client_close);
    if (p->cancelled && p->n_up > 0)
        grpc_call_cancel(p->up[0]->call, NULL);
    proxy_unref(p);
}

static void stream_open(proxy_call *p)
{
    const pjs_grpc_proxy_ops *ops = p->f->proxy;
    pjs_error err;
    int w = ops->pick(ops->ctx, p->method, GRPC_SLICE_START_PTR(p->first),
                      GRPC_SLICE_LENGTH(p->first), 0, &err);
    if (w < 0) {
        reply_error(p, &err);
        return;
    }
    upstream *u = upstream_open(p, w);
    if (u == NULL) {
        upstream_not_started(p, w);
        pjs_error_set(&err, PJS_ERR_NOMEM, "no memory for the stream to worker %d", w);
        reply_error(p, &err);
        return;
    }
    relayed_add(p);
    /* The worker's status, whenever it comes. */
    grpc_op st;
    memset(&st, 0, sizeof st);
    st.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    st.data.recv_status_on_client.trailing_metadata = &u->trailing;
    st.data.recv_status_on_client.status = &u->status;
    st.data.recv_status_on_client.status_details = &u->details;
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &p->cancelled;
    /* The first message (if the client sent one) with the metadata. */
    grpc_op first[2];
    size_t n = 0;
    memset(first, 0, sizeof first);
    first[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    first[n].data.send_initial_metadata.count = p->n_forward_md;
    first[n++].data.send_initial_metadata.metadata = p->forward_md;
    grpc_byte_buffer *bb = NULL;
    if (p->client_done) {
        first[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    } else {
        grpc_slice msg = grpc_slice_ref(p->first);
        bb = grpc_raw_byte_buffer_create(&msg, 1);
        grpc_slice_unref(msg);
        first[n].op = GRPC_OP_SEND_MESSAGE;
        first[n++].data.send_message.send_message = bb;
    }
    if (!start(p, u->call, &st, 1, &p->on_worker_status)) {
        upstream_not_started(p, w);
        pjs_error_set(&err, PJS_ERR_INTERNAL, "cannot start the stream to worker %d", w);
        reply_error(p, &err);
        if (bb != NULL)
            grpc_byte_buffer_destroy(bb);
        return;
    }
    start(p, p->call, &close_op, 1, &p->on_client_close);
    start(p, u->call, first, n, &p->on_worker_sent);
    if (bb != NULL)
        grpc_byte_buffer_destroy(bb);
    stream_recv_worker(p);
}

/* Cuts p's client off if the message waiting for it has waited for the
 * stall bound; f->relayed_lock held (p cannot be freed meanwhile). The
 * message's send then fails, which cancels the worker's call. */
static void cut_if_stalled(proxy_call *p, uint64_t now_ns)
{
    uint64_t stall_ns = p->f->stream_write_stall_ns;
    pthread_mutex_lock(&p->lock);
    /* The message may have been handed over after the sweep read its clock. */
    bool cut = p->sending_client && !p->stall_cut &&
               pjs_waited_at_least(p->sending_since_ns, now_ns, stall_ns);
    if (cut)
        p->stall_cut = true;
    pthread_mutex_unlock(&p->lock);
    if (!cut)
        return;
    unsigned long long ms = stall_ns / 1000000u;
    char *peer = grpc_call_get_peer(p->call);
    pjs_warn("gateway: %s from %s: the client read none of the stream's responses for %llu ms; "
             "closing the stream (--grpc-stream-write-timeout-ms)",
             p->method, peer != NULL ? peer : "?", ms);
    gpr_free(peer);
    char details[160];
    snprintf(details, sizeof details,
             "the client read none of the stream's responses for %llu ms: stream closed", ms);
    grpc_call_cancel_with_status(p->call, GRPC_STATUS_RESOURCE_EXHAUSTED, details, NULL);
}

void pjs__grpc_proxy_sweep(pjs_grpc_frontend *f)
{
    uint64_t now_ns = pjs_now_ns();
    if (now_ns < atomic_load(&f->next_stall_sweep_ns))
        return;
    if (pthread_mutex_trylock(&f->relayed_lock) != 0)
        return; /* another thread is sweeping, or a stream is being listed */
    atomic_store(&f->next_stall_sweep_ns, now_ns + (uint64_t)PJS_GRPC_STALL_SWEEP_MS * 1000000u);
    for (proxy_call *p = f->relayed; p != NULL; p = p->relayed_next)
        cut_if_stalled(p, now_ns);
    pthread_mutex_unlock(&f->relayed_lock);
}

/* ---- the first message ------------------------------------------------------------ */

/* The client's first message is in p->first_bb (NULL: it sent none): what
 * the call is, decided and started. */
static void first_arrived(proxy_call *p)
{
    pjs_error err;
    if (p->first_bb == NULL) {
        p->client_done = true; /* closed without a message */
    } else {
        int rc = p->kind == PJS_GRPC_PROXY_ROUTED
                     ? pjs__grpc_take_request(p->f, &p->first_bb, &p->first, &p->charged, &err)
                     : pjs__grpc_take_payload(&p->first_bb, pjs__grpc_small_limit(p->f),
                                              &p->first, &err);
        if (rc != 0) {
            reply_error(p, &err);
            return;
        }
    }
    if (!build_forward_md(p)) {
        pjs_error_set(&err, PJS_ERR_NOMEM, "no memory to forward the call");
        reply_error(p, &err);
    } else if (p->kind == PJS_GRPC_PROXY_LOCAL) {
        answer_local(p);
    } else if (p->kind == PJS_GRPC_PROXY_STREAM_ROUTED) {
        stream_open(p);
    } else if (p->client_done) {
        pjs_error_set(&err, PJS_ERR_INVALID_ARGUMENT, "%s: the request has no message",
                      p->method);
        reply_error(p, &err);
    } else if (p->kind == PJS_GRPC_PROXY_FANOUT) {
        fanout_send(p);
    } else {
        routed_send(p);
    }
}

static void on_first(pjs_grpc_tag *tag, bool ok)
{
    proxy_call *p = PJS_GRPC_CONTAINER(tag, proxy_call, on_first);
    if (ok) /* else the client went away */
        first_arrived(p);
    proxy_unref(p);
}

/* A proxy call for `call`, checked and classified, holding one reference;
 * NULL when it was answered already (refused, or no memory). */
static proxy_call *proxy_begin(pjs_grpc_frontend *f, grpc_call *call,
                               grpc_metadata_array *metadata, const grpc_slice *method)
{
    pjs__grpc_call_born(f);
    proxy_call *p = calloc(1, sizeof *p);
    if (p == NULL) {
        grpc_call_cancel_with_status(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
        grpc_call_unref(call);
        grpc_metadata_array_destroy(metadata);
        pjs__grpc_call_gone(f);
        return NULL;
    }
    p->f = f;
    p->call = call;
    p->metadata = *metadata;
    p->refs = 1;
    p->started_ns = pjs_now_ns();
    p->traceparent = grpc_empty_slice();
    pthread_mutex_init(&p->lock, NULL);
    p->first = grpc_empty_slice();
    p->reply_details = grpc_empty_slice();
    p->bearer = grpc_empty_slice();
    p->client_id = grpc_empty_slice();
    p->on_first.fn = on_first;
    p->on_reply.fn = on_reply;
    p->on_client_msg.fn = on_client_msg;
    p->on_worker_sent.fn = on_worker_sent;
    p->on_worker_msg.fn = on_worker_msg;
    p->on_client_sent.fn = on_client_sent;
    p->on_worker_status.fn = on_worker_status;
    p->on_client_close.fn = on_client_close;
    size_t len = GRPC_SLICE_LENGTH(*method);
    if (len >= sizeof p->method)
        len = sizeof p->method - 1;
    memcpy(p->method, GRPC_SLICE_START_PTR(*method), len);
    p->method[len] = '\0';
    pjs_grpc_call check = {.frontend = f, .call = call, .metadata = p->metadata};
    pjs_error err;
    if (pjs__grpc_access_check_path(&check, p->method, &err) != 0) {
        p->kind = PJS_GRPC_PROXY_ROUTED;
        reply_error(p, &err);
        proxy_unref(p);
        return NULL;
    }
    p->kind = f->proxy->classify(f->proxy->ctx, p->method);
    return p;
}

void pjs__grpc_proxy_serve(pjs_grpc_frontend *f, grpc_call *call, grpc_metadata_array *metadata,
                           const grpc_slice *method)
{
    proxy_call *p = proxy_begin(f, call, metadata, method);
    if (p == NULL)
        return;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &p->first_bb;
    start(p, call, &op, 1, &p->on_first);
    proxy_unref(p);
}

void pjs__grpc_proxy_serve_read(pjs_grpc_frontend *f, grpc_call *call,
                                grpc_metadata_array *metadata, const grpc_slice *method,
                                grpc_byte_buffer *first)
{
    proxy_call *p = proxy_begin(f, call, metadata, method);
    if (p == NULL) {
        if (first != NULL)
            grpc_byte_buffer_destroy(first);
        return;
    }
    p->first_bb = first;
    first_arrived(p);
    proxy_unref(p);
}
