/*
 * grpc_transport.c - the gRPC side of a client: one channel, one
 * completion queue and the thread that drains it; unary calls
 * (everything but streams) and ModelStreamInfer streams.
 *
 * Every tag on the queue is a pjsc_grpc_op whose `complete` the thread
 * runs. A unary call is one batch of six ops; its completion reads the
 * status and the message and hands them to the call's pjsc_done_fn, on
 * the queue's thread. A stream keeps one receive posted at a time (each
 * completed receive decodes the answer, runs the user's callback and
 * posts the next), at most one send in flight (pjs_client_stream_send
 * waits for the previous one), and the status op posted at open, which
 * completes last: pjs_client_stream_close waits for it.
 *
 * Threads: starting calls is safe from any thread; `complete` runs on
 * the queue's thread only. The queue is shut down by pjsc_grpc_close
 * after the client's last call ended.
 */
#include "client/internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "grpc_service.pb-c.h"

/* A tag on the queue. `handoffs` gives ThreadSanitizer the order gRPC
 * keeps invisibly (the library is not instrumented): the thread that
 * starts a batch releases everything it wrote for the op (arm), the queue's
 * thread acquires it before `complete` runs. */
typedef struct pjsc_grpc_op pjsc_grpc_op;
struct pjsc_grpc_op {
    void (*complete)(pjsc_grpc_op *op, bool ok);
    atomic_uint handoffs;
};

/* The tag for a batch whose ops are all written. */
static void *arm(pjsc_grpc_op *op)
{
    atomic_fetch_add_explicit(&op->handoffs, 1, memory_order_release);
    return op;
}

/* grpc_call_start_batch with an armed tag. */
static grpc_call_error start_batch(grpc_call *call, const grpc_op *ops, size_t n,
                                   pjsc_grpc_op *op)
{
    void *tag = arm(op);
    return grpc_call_start_batch(call, ops, n, tag, NULL);
}

struct pjsc_grpc {
    grpc_channel *channel;
    grpc_completion_queue *cq;
    pthread_t thread;
    bool thread_started;
};

/* ---- status ------------------------------------------------------------------------ */

/* The error of a finished call: the server's status, or the library's
 * own words when the channel never reached the server. */
static void status_error(pjs_client *c, grpc_status_code status, grpc_slice details,
                         pjs_client_error *err)
{
    if (status == GRPC_STATUS_OK) {
        pjsc_ok(err);
        return;
    }
    pjs_client_code code = (status > 0 && status <= 16) ? (pjs_client_code)status
                                                         : PJS_CLIENT_UNKNOWN;
    pjsc_fail(err, code, "%.*s", (int)GRPC_SLICE_LENGTH(details),
              (const char *)GRPC_SLICE_START_PTR(details));
    /* Statuses the channel itself produces (no server reached, deadline
     * passed before an answer) are the library's; the server's carry its
     * words. */
    err->from_server = !(status == GRPC_STATUS_UNAVAILABLE || status == GRPC_STATUS_CANCELLED ||
                         (status == GRPC_STATUS_DEADLINE_EXCEEDED &&
                          strcmp(err->message, "Deadline Exceeded") == 0));
    if (status == GRPC_STATUS_DEADLINE_EXCEEDED && !err->from_server)
        snprintf(err->message, sizeof err->message,
                 "no answer from %.200s before the deadline (gRPC: Deadline Exceeded)",
                 c->target);
    if (status == GRPC_STATUS_UNAVAILABLE && !err->from_server) {
        char words[PJS_CLIENT_MESSAGE_MAX / 2];
        snprintf(words, sizeof words, "%.400s", err->message);
        snprintf(err->message, sizeof err->message,
                 "cannot reach the server at %.200s over gRPC%s (%s); is it running, and is the "
                 "URL right?",
                 c->target, c->tls ? " with TLS" : "", words);
    }
}

/* Reads a received message into a malloc'd copy, bounded. */
static int read_message(pjs_client *c, grpc_byte_buffer *bb, unsigned char **out, size_t *len,
                        pjs_client_error *err)
{
    *out = NULL;
    *len = 0;
    if (bb == NULL)
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "the server answered OK without a message");
    size_t n = grpc_byte_buffer_length(bb);
    if (n > c->max_message_bytes)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED,
                         "the server's answer of %zu bytes is larger than the client's limit "
                         "of %zu (pjs_client_options.max_message_bytes)",
                         n, c->max_message_bytes);
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "cannot read the server's answer");
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    *out = malloc(n > 0 ? n : 1);
    if (*out != NULL) {
        memcpy(*out, GRPC_SLICE_START_PTR(all), n);
        *len = n;
    }
    grpc_slice_unref(all);
    return *out != NULL ? 0
                        : pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED,
                                    "no memory for an answer of %zu bytes", n);
}

static grpc_byte_buffer *pack(const ProtobufCMessage *m)
{
    size_t size = protobuf_c_message_get_packed_size(m);
    grpc_slice slice = grpc_slice_malloc(size);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(slice));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

static gpr_timespec deadline_after(pjs_client *c, uint32_t timeout_ms)
{
    uint32_t ms = timeout_ms ? timeout_ms : c->timeout_ms;
    if (ms == 0)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis((int64_t)ms, GPR_TIMESPAN));
}

/* The authorization header, when the client has a token. */
typedef struct call_metadata {
    grpc_metadata md[1];
    size_t n;
} call_metadata;

static void metadata_init(pjs_client *c, call_metadata *m)
{
    m->n = 0;
    if (c->token == NULL)
        return;
    char bearer[4096];
    snprintf(bearer, sizeof bearer, "Bearer %s", c->token);
    m->md[0].key = grpc_slice_from_static_string("authorization");
    m->md[0].value = grpc_slice_from_copied_string(bearer);
    m->n = 1;
}

static void metadata_destroy(call_metadata *m)
{
    if (m->n > 0)
        grpc_slice_unref(m->md[0].value);
}

/* ---- unary calls -------------------------------------------------------------------- */

typedef struct unary_call {
    pjsc_grpc_op op;
    pjs_client *client;
    grpc_call *call;
    call_metadata md;
    grpc_byte_buffer *send;
    grpc_byte_buffer *recv;
    grpc_metadata_array initial, trailing;
    grpc_status_code status;
    grpc_slice details;
    pjsc_done_fn done;
    void *arg;
} unary_call;

static void unary_free(unary_call *u)
{
    metadata_destroy(&u->md);
    grpc_slice_unref(u->details);
    grpc_metadata_array_destroy(&u->initial);
    grpc_metadata_array_destroy(&u->trailing);
    if (u->recv != NULL)
        grpc_byte_buffer_destroy(u->recv);
    if (u->send != NULL)
        grpc_byte_buffer_destroy(u->send);
    if (u->call != NULL)
        grpc_call_unref(u->call);
    free(u);
}

static void unary_complete(pjsc_grpc_op *op, bool ok)
{
    unary_call *u = (unary_call *)op;
    pjs_client *c = u->client;
    pjsc_reply reply;
    memset(&reply, 0, sizeof reply);
    if (!ok)
        pjsc_fail(&reply.err, PJS_CLIENT_INTERNAL, "the gRPC call failed in the library");
    else
        status_error(c, u->status, u->details, &reply.err);
    if (reply.err.code == PJS_CLIENT_OK &&
        read_message(c, u->recv, &reply.body, &reply.len, &reply.err) == 0)
        reply.json_len = reply.len;
    pjsc_done_fn done = u->done;
    void *arg = u->arg;
    unary_free(u);
    done(arg, &reply);
    pjsc_call_end(c);
}

int pjsc_grpc_start(pjs_client *c, const char *method, const ProtobufCMessage *request,
                    uint32_t timeout_ms, pjsc_done_fn done, void *arg, pjs_client_error *err)
{
    unary_call *u = calloc(1, sizeof *u);
    if (u == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a call");
    u->op.complete = unary_complete;
    atomic_init(&u->op.handoffs, 0);
    u->client = c;
    u->done = done;
    u->arg = arg;
    u->details = grpc_empty_slice();
    u->status = GRPC_STATUS_UNKNOWN;
    grpc_metadata_array_init(&u->initial);
    grpc_metadata_array_init(&u->trailing);
    metadata_init(c, &u->md);
    u->send = pack(request);
    u->call = grpc_channel_create_call(c->grpc->channel, NULL, GRPC_PROPAGATE_DEFAULTS,
                                       c->grpc->cq, grpc_slice_from_static_string(method), NULL,
                                       deadline_after(c, timeout_ms), NULL);
    if (u->send == NULL || u->call == NULL) {
        unary_free(u);
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "cannot create the gRPC call %s", method);
    }
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = u->md.n;
    ops[0].data.send_initial_metadata.metadata = u->md.md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = u->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &u->trailing;
    ops[5].data.recv_status_on_client.status = &u->status;
    ops[5].data.recv_status_on_client.status_details = &u->details;
    pjsc_call_begin(c);
    grpc_call_error e = start_batch(u->call, ops, 6, &u->op);
    if (e != GRPC_CALL_OK) {
        pjsc_call_end(c);
        unary_free(u);
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "cannot start %s (gRPC call error %d)",
                         method, (int)e);
    }
    return 0;
}

/* ---- the channel and its thread ----------------------------------------------------- */

static void *cq_thread(void *arg)
{
    grpc_completion_queue *cq = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            pjsc_grpc_op *op = ev.tag;
            atomic_load_explicit(&op->handoffs, memory_order_acquire);
            op->complete(op, ev.success != 0);
        }
    }
    return NULL;
}

/* A PEM file as a NUL-terminated string (free it), or NULL with err set. */
static char *read_pem(const char *path, const char *what, pjs_client_error *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "cannot open the %s %s", what, path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf != NULL && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            fclose(f);
            free(buf);
            pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "the %s %s is larger than %zu bytes",
                      what, path, cap);
            return NULL;
        }
    }
    fclose(f);
    if (buf == NULL) {
        pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for the %s", what);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static grpc_channel_credentials *make_credentials(pjs_client *c, const pjs_client_options *o,
                                                  pjs_client_error *err)
{
    if (!c->tls)
        return grpc_insecure_credentials_create();
    char *ca = NULL, *cert = NULL, *key = NULL;
    grpc_channel_credentials *creds = NULL;
    if (o->tls_ca_file != NULL && (ca = read_pem(o->tls_ca_file, "CA file", err)) == NULL)
        goto out;
    if (o->tls_cert_file != NULL) {
        if ((cert = read_pem(o->tls_cert_file, "certificate file", err)) == NULL ||
            (key = read_pem(o->tls_key_file, "key file", err)) == NULL)
            goto out;
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    creds = grpc_ssl_credentials_create(ca, cert != NULL ? &pair : NULL, NULL, NULL);
    if (creds == NULL)
        pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "gRPC refused the TLS settings");
out:
    free(ca);
    free(cert);
    free(key);
    return creds;
}

int pjsc_grpc_open(pjs_client *c, const pjs_client_options *o, pjs_client_error *err)
{
    grpc_init();
    c->grpc = calloc(1, sizeof *c->grpc);
    if (c->grpc == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a connection");
    grpc_channel_credentials *creds = make_credentials(c, o, err);
    if (creds == NULL)
        return err != NULL ? (int)err->code : PJS_CLIENT_INVALID_ARGUMENT;
    int max_recv = c->max_message_bytes > (size_t)INT32_MAX ? INT32_MAX
                                                            : (int)c->max_message_bytes;
    grpc_arg args[2];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = max_recv;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = -1;
    grpc_channel_args ca = {.num_args = 2, .args = args};
    c->grpc->channel = grpc_channel_create(c->target, creds, &ca);
    grpc_channel_credentials_release(creds);
    c->grpc->cq = grpc_completion_queue_create_for_next(NULL);
    if (c->grpc->channel == NULL || c->grpc->cq == NULL)
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "cannot create a gRPC channel to %s",
                         c->target);
    if (pthread_create(&c->grpc->thread, NULL, cq_thread, c->grpc->cq) != 0)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "cannot start the client's thread");
    c->grpc->thread_started = true;
    return 0;
}

void pjsc_grpc_close(pjs_client *c)
{
    pjsc_grpc *g = c->grpc;
    if (g->cq != NULL) {
        grpc_completion_queue_shutdown(g->cq);
        if (g->thread_started)
            pthread_join(g->thread, NULL);
        else
            while (grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
                ;
        grpc_completion_queue_destroy(g->cq);
    }
    if (g->channel != NULL)
        grpc_channel_destroy(g->channel);
    free(g);
    c->grpc = NULL;
    /* Blocking: the library's own threads are joined before the last
     * connection's close returns (never from a gRPC thread: callbacks run on
     * the connection's completion thread, which was joined above). */
    grpc_shutdown_blocking();
}

/* ---- streams ------------------------------------------------------------------------ */

/* One op of a stream; `stream` finds its owner. */
typedef struct stream_op {
    pjsc_grpc_op op;
    pjs_client_stream *stream;
} stream_op;

struct pjs_client_stream {
    pjs_client *client;
    pjs_client_callback callback;
    void *user_data;
    grpc_call *call;
    call_metadata md;
    grpc_metadata_array initial, trailing;
    grpc_status_code status;
    grpc_slice details;
    grpc_byte_buffer *recv;
    grpc_byte_buffer *send;
    stream_op start_op, recv_op, send_op, close_op, status_op;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool sending;     /* a send is in flight */
    bool recv_ended;  /* the receive loop stopped */
    bool status_done; /* the status op completed */
    int ops_pending;  /* batches started and not completed */
};

static void stream_signal(pjs_client_stream *s, void (*change)(pjs_client_stream *))
{
    pthread_mutex_lock(&s->mu);
    change(s);
    s->ops_pending--;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

static void mark_nothing(pjs_client_stream *s)
{
    (void)s;
}
static void mark_sent(pjs_client_stream *s)
{
    s->sending = false;
}
static void mark_recv_ended(pjs_client_stream *s)
{
    s->recv_ended = true;
}
static void mark_status(pjs_client_stream *s)
{
    s->status_done = true;
}

static bool stream_post_recv(pjs_client_stream *s)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv;
    pthread_mutex_lock(&s->mu);
    s->ops_pending++;
    pthread_mutex_unlock(&s->mu);
    if (start_batch(s->call, &op, 1, &s->recv_op.op) == GRPC_CALL_OK)
        return true;
    stream_signal(s, mark_recv_ended);
    return false;
}

static void stream_recv_complete(pjsc_grpc_op *op, bool ok)
{
    pjs_client_stream *s = ((stream_op *)op)->stream;
    if (!ok || s->recv == NULL) {
        stream_signal(s, mark_recv_ended);
        return;
    }
    unsigned char *bytes = NULL;
    size_t len = 0;
    pjs_client_error err;
    pjs_client_result *result = NULL;
    int rc = read_message(s->client, s->recv, &bytes, &len, &err);
    grpc_byte_buffer_destroy(s->recv);
    s->recv = NULL;
    if (rc == 0)
        rc = pjsc_decode_grpc_stream(bytes, len, &result, &err);
    free(bytes);
    if (rc == 0)
        pjsc_ok(&err);
    s->callback(s->user_data, result, &err);
    /* This op is done; the next receive is a new one. */
    pthread_mutex_lock(&s->mu);
    s->ops_pending--;
    pthread_mutex_unlock(&s->mu);
    stream_post_recv(s);
}

static void stream_send_complete(pjsc_grpc_op *op, bool ok)
{
    (void)ok;
    pjs_client_stream *s = ((stream_op *)op)->stream;
    grpc_byte_buffer_destroy(s->send);
    s->send = NULL;
    stream_signal(s, mark_sent);
}

static void stream_status_complete(pjsc_grpc_op *op, bool ok)
{
    (void)ok;
    stream_signal(((stream_op *)op)->stream, mark_status);
}

static void stream_plain_complete(pjsc_grpc_op *op, bool ok)
{
    (void)ok;
    stream_signal(((stream_op *)op)->stream, mark_nothing);
}

static void stream_free(pjs_client_stream *s)
{
    metadata_destroy(&s->md);
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->initial);
    grpc_metadata_array_destroy(&s->trailing);
    if (s->call != NULL)
        grpc_call_unref(s->call);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cond);
    free(s);
}

static void stream_op_init(stream_op *o, pjs_client_stream *s,
                           void (*complete)(pjsc_grpc_op *, bool))
{
    o->op.complete = complete;
    atomic_init(&o->op.handoffs, 0);
    o->stream = s;
}

int pjs_client_stream_open(pjs_client *c, pjs_client_callback callback, void *user_data,
                           uint32_t timeout_ms, pjs_client_stream **out, pjs_client_error *err)
{
    *out = NULL;
    if (c == NULL || callback == NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "a stream needs a client and a callback");
    if (c->protocol != PJS_CLIENT_GRPC)
        return pjsc_fail(err, PJS_CLIENT_UNIMPLEMENTED,
                         "streaming is a gRPC call (ModelStreamInfer); connect with a grpc:// URL");
    pjs_client_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a stream");
    s->client = c;
    s->callback = callback;
    s->user_data = user_data;
    s->details = grpc_empty_slice();
    s->status = GRPC_STATUS_UNKNOWN;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    grpc_metadata_array_init(&s->initial);
    grpc_metadata_array_init(&s->trailing);
    metadata_init(c, &s->md);
    stream_op_init(&s->start_op, s, stream_plain_complete);
    stream_op_init(&s->recv_op, s, stream_recv_complete);
    stream_op_init(&s->send_op, s, stream_send_complete);
    stream_op_init(&s->close_op, s, stream_plain_complete);
    stream_op_init(&s->status_op, s, stream_status_complete);
    s->call = grpc_channel_create_call(
        c->grpc->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->grpc->cq,
        grpc_slice_from_static_string("/inference.GRPCInferenceService/ModelStreamInfer"), NULL,
        deadline_after(c, timeout_ms), NULL);
    if (s->call == NULL) {
        stream_free(s);
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "cannot create the gRPC stream");
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = s->md.n;
    ops[0].data.send_initial_metadata.metadata = s->md.md;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &s->initial;
    grpc_op status_op;
    memset(&status_op, 0, sizeof status_op);
    status_op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    status_op.data.recv_status_on_client.trailing_metadata = &s->trailing;
    status_op.data.recv_status_on_client.status = &s->status;
    status_op.data.recv_status_on_client.status_details = &s->details;
    pjsc_call_begin(c);
    s->ops_pending = 2;
    if (start_batch(s->call, ops, 2, &s->start_op.op) != GRPC_CALL_OK ||
        start_batch(s->call, &status_op, 1, &s->status_op.op) != GRPC_CALL_OK) {
        /* Nothing can be waited for on a call that refused its first
         * batches: cancel it and let the queue drain what was started. */
        grpc_call_cancel(s->call, NULL);
        pjsc_call_end(c);
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "cannot start the gRPC stream");
    }
    stream_post_recv(s);
    *out = s;
    pjsc_ok(err);
    return 0;
}

int pjs_client_stream_send(pjs_client_stream *s, const pjs_client_request *req,
                           pjs_client_error *err)
{
    pjsc_grpc_request *g = NULL;
    const ProtobufCMessage *msg = NULL;
    int rc = pjsc_grpc_request_build(req, 0, &g, &msg, err);
    if (rc != 0)
        return rc;
    grpc_byte_buffer *bb = pack(msg);
    pjsc_grpc_request_free(g);
    pthread_mutex_lock(&s->mu);
    while (s->sending)
        pthread_cond_wait(&s->cond, &s->mu);
    bool ended = s->status_done;
    if (!ended) {
        s->sending = true;
        s->ops_pending++;
    }
    pthread_mutex_unlock(&s->mu);
    if (ended) {
        grpc_byte_buffer_destroy(bb);
        return pjsc_fail(err, PJS_CLIENT_UNAVAILABLE,
                         "the stream has ended; close it to read its status");
    }
    s->send = bb;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    if (start_batch(s->call, &op, 1, &s->send_op.op) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(bb);
        s->send = NULL;
        stream_signal(s, mark_sent);
        return pjsc_fail(err, PJS_CLIENT_INTERNAL, "cannot send on the stream");
    }
    pjsc_ok(err);
    return 0;
}

int pjs_client_stream_close(pjs_client_stream *s, pjs_client_error *err)
{
    if (s == NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT, "no stream given");
    pjs_client *c = s->client;
    pthread_mutex_lock(&s->mu);
    while (s->sending)
        pthread_cond_wait(&s->cond, &s->mu);
    s->ops_pending++;
    pthread_mutex_unlock(&s->mu);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    if (start_batch(s->call, &op, 1, &s->close_op.op) != GRPC_CALL_OK)
        stream_signal(s, mark_nothing);
    pthread_mutex_lock(&s->mu);
    while (!(s->status_done && s->recv_ended && s->ops_pending == 0))
        pthread_cond_wait(&s->cond, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pjs_client_error status;
    status_error(c, s->status, s->details, &status);
    if (err != NULL)
        *err = status;
    stream_free(s);
    pjsc_call_end(c);
    return (int)status.code;
}
