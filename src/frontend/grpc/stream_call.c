/*
 * stream_call.c - ModelStreamInfer: many inference requests on one
 * bidirectional stream, answered in the order they arrived.
 *
 * The stream reads one message at a time. Each message becomes an item
 * appended to the stream's FIFO, then is decoded and submitted, and only
 * then does the next read start, so requests are submitted in arrival
 * order (a sequence's steps rely on it). A request that fails there is
 * answered at once with error_message (the stream goes on). Each request's
 * deadline is the earlier of the stream's deadline and its own `timeout`
 * parameter; one that passes is answered with error_message too
 * (DEADLINE_EXCEEDED's message). Items become ready when their response (or error) is encoded: for a
 * submitted request on the thread that ran it, which is the reading thread
 * itself, inside pjs_server_submit, when the device was free. So the reader
 * holds no lock across the submit and touches the item no more after it.
 * The head of the FIFO is written as soon as it is ready, one write at a
 * time as gRPC requires, so responses leave in request order.
 * With PJS_GRPC_STREAM_MAX_IN_FLIGHT items queued, reading pauses until a
 * response is written: a client cannot queue unbounded work on one stream.
 *
 * A decoupled model (manifest `decoupled: true`) answers a request with
 * zero, one or many responses: each pjserve_respond of its run encodes one
 * at once and appends it to the stream's write queue, ahead of earlier
 * requests' answers still running (match responses by request id, as with
 * Triton). Each carries the parameter triton_final_response. When the
 * client sent triton_enable_empty_final_response, a final flag with no
 * outputs goes out as an empty final response; otherwise, as Triton does, a
 * flag without outputs is not sent at all (a data response is never held
 * back: streaming clients see each one at once). When the run returns
 * without having sent its
 * final response, the returned outputs (or nothing) go out as the final
 * one; an error after some responses goes out as error_message. The write
 * queue holds at most STREAM_MAX_QUEUED_WRITES messages: pjserve_respond
 * waits for room, until the request's deadline, so a slow reader slows the
 * run instead of growing memory. A client that reads nothing at all would
 * hold the run (and its thread) that long, or forever without a deadline:
 * once a wait for room has seen no write complete for the front end's
 * stall bound (--grpc-stream-write-timeout-ms), the stream is cancelled
 * with RESOURCE_EXHAUSTED and the run's pjserve_respond fails.
 *
 * A caller the access rules refuse gets the refusal as the stream's status
 * before anything is read.
 *
 * The client's half-close ends reading; once the FIFO is empty the status
 * (OK) is sent. A cancelled stream (client gone, or stop) drops the
 * responses of its remaining items as they complete. `lock` guards all
 * mutable state; `refs` counts outstanding tags plus items in the FIFO and
 * the stream is freed when it reaches zero.
 */
#include "frontend/grpc/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/support/alloc.h>

#include "core/infer.h"
#include "core/log.h"
#include "frontend/deadline.h"
#include "frontend/grpc/codec.h"

/* Messages waiting for their write, at most, per stream. */
#define STREAM_MAX_QUEUED_WRITES 64

typedef struct stream_call stream_call;

/* One packed ModelStreamInferResponse (malloc'd bytes). */
typedef struct packed_response {
    uint8_t *bytes;
    size_t len;
} packed_response;

typedef struct queued_write {
    struct queued_write *next;
    grpc_byte_buffer *message;
} queued_write;

typedef struct stream_item {
    struct stream_item *next;
    stream_call *stream;
    bool ready;                 /* response is set */
    grpc_byte_buffer *response; /* ModelStreamInferResponse; NULL if it could not be made */
    pjs_grpc_infer_job job;
    /* A decoupled model's request (job.decoded.req.respond set); touched
     * only by the thread running it. */
    bool final_sent;
} stream_item;

struct stream_call {
    pjs_grpc_call base; /* base.cancelled is read under `lock` once on_close ran */
    pjs_grpc_tag on_read;
    pjs_grpc_tag on_write;
    pjs_grpc_tag on_close;
    pjs_grpc_tag on_status;
    grpc_byte_buffer *incoming; /* target of the outstanding read */
    grpc_byte_buffer *writing;  /* the response being written, or NULL */

    pthread_mutex_t lock; /* guards everything below */
    int refs;             /* outstanding tags + items in the FIFO; 0: free the stream */
    bool reading;         /* a read is outstanding, or its message is being submitted */
    bool read_done;       /* half-closed by the client, or reading failed */
    bool dead;            /* cancelled or a write failed: drop responses */
    atomic_bool gone;     /* `dead`, for the runs of its requests to read unlocked */
    bool metadata_sent;
    bool status_started;
    size_t n_items;
    stream_item *head, *tail;
    queued_write *queue_head, *queue_tail; /* messages to write, in order */
    size_t n_queued;
    pthread_cond_t room; /* n_queued went down, or the stream died */
};

static void stream_free(stream_call *s)
{
    if (s->incoming != NULL)
        grpc_byte_buffer_destroy(s->incoming);
    while (s->queue_head != NULL) {
        queued_write *q = s->queue_head;
        s->queue_head = q->next;
        grpc_byte_buffer_destroy(q->message);
        free(q);
    }
    pthread_cond_destroy(&s->room);
    pthread_mutex_destroy(&s->lock);
    pjs__grpc_call_destroy(&s->base);
    free(s);
}

static void item_free(stream_item *it)
{
    pjs__grpc_infer_job_destroy(&it->job);
    if (it->response != NULL)
        grpc_byte_buffer_destroy(it->response);
    free(it);
}

/* The client is gone or cannot be written to: responses are dropped, a
 * run waiting for room stops waiting, and runs see pjserve_cancelled. */
static void mark_dead_locked(stream_call *s)
{
    s->dead = true;
    atomic_store(&s->gone, true);
    pthread_cond_broadcast(&s->room);
}

static void start_read_locked(stream_call *s)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->incoming;
    if (pjs__grpc_start_batch(s->base.call, &op, 1, &s->on_read) == GRPC_CALL_OK) {
        s->reading = true;
        s->refs++;
    } else {
        s->read_done = true;
    }
}

/* Appends a message to the write queue (dropped on a dead stream). */
static void queue_write_locked(stream_call *s, grpc_byte_buffer *bb)
{
    queued_write *q = s->dead ? NULL : malloc(sizeof *q);
    if (q == NULL) {
        if (!s->dead)
            pjs_error("grpc ModelStreamInfer: no memory to queue a response; dropped");
        grpc_byte_buffer_destroy(bb);
        return;
    }
    q->next = NULL;
    q->message = bb;
    if (s->queue_tail != NULL)
        s->queue_tail->next = q;
    else
        s->queue_head = q;
    s->queue_tail = q;
    s->n_queued++;
}

static grpc_byte_buffer *dequeue_write_locked(stream_call *s)
{
    queued_write *q = s->queue_head;
    s->queue_head = q->next;
    if (s->queue_head == NULL)
        s->queue_tail = NULL;
    s->n_queued--;
    pthread_cond_broadcast(&s->room);
    grpc_byte_buffer *bb = q->message;
    free(q);
    return bb;
}

/* Moves the answers of ready head items to the write queue (request
 * order), then writes the queue's first message if nothing is being
 * written. A dead stream drops what is queued. */
static void write_next_locked(stream_call *s)
{
    while (s->head != NULL && s->head->ready) {
        stream_item *it = s->head;
        s->head = it->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->n_items--;
        s->refs--; /* the item's reference; a write takes its own */
        grpc_byte_buffer *bb = it->response;
        it->response = NULL;
        item_free(it);
        if (bb != NULL)
            queue_write_locked(s, bb);
    }
    while (s->writing == NULL && s->queue_head != NULL) {
        grpc_byte_buffer *bb = dequeue_write_locked(s);
        if (s->dead) {
            grpc_byte_buffer_destroy(bb);
            continue;
        }
        grpc_op ops[2];
        size_t n = 0;
        memset(ops, 0, sizeof ops);
        if (!s->metadata_sent)
            ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
        if (pjs__grpc_start_batch(s->base.call, ops, n, &s->on_write) != GRPC_CALL_OK) {
            grpc_byte_buffer_destroy(bb);
            mark_dead_locked(s);
            continue;
        }
        s->metadata_sent = true;
        s->writing = bb;
        s->refs++;
    }
}

/* Resumes reading when it was paused for a full FIFO, or sends the status
 * once everything is answered. */
static void advance_locked(stream_call *s)
{
    if (!s->read_done && !s->reading && !s->dead && s->n_items < PJS_GRPC_STREAM_MAX_IN_FLIGHT)
        start_read_locked(s);
    if (!s->read_done || s->n_items > 0 || s->writing != NULL || s->queue_head != NULL ||
        s->status_started)
        return;
    s->status_started = true;
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!s->metadata_sent)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[n++].data.send_status_from_server.status_details = &s->base.details;
    if (pjs__grpc_start_batch(s->base.call, ops, n, &s->on_status) == GRPC_CALL_OK)
        s->refs++;
}

/* Ends a step: advances and frees the stream if that was its last reference. */
static void stream_step_done_locked(stream_call *s)
{
    advance_locked(s);
    bool last = s->refs == 0;
    pthread_mutex_unlock(&s->lock);
    if (last)
        stream_free(s);
}

/* Encodes an item's answer: its response, or err as error_message. */
static void item_encode(stream_item *it, const pjs_error *err)
{
    Inference__ModelStreamInferResponse out = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    Inference__ModelInferResponse failed = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    pjs_error pack_err;
    pjs_grpc_infer *d = &it->job.decoded;
    const Inference__ModelInferRequest *msg = d->msg;
    if (err == NULL &&
        pjs_grpc_infer_response(d, PJS_MODEL_VERSION, &out.infer_response, &pack_err) == 0 &&
        (it->response = pjs__grpc_pack(&out.base, &pack_err)) != NULL)
        return;
    if (err == NULL)
        err = &pack_err;
    /* An error: say which request it answers when the request was readable. */
    out.error_message = (char *)err->msg;
    if (msg != NULL) {
        failed.model_name = msg->model_name;
        failed.model_version = msg->model_version;
        failed.id = msg->id;
    }
    out.infer_response = &failed;
    it->response = pjs__grpc_pack(&out.base, &pack_err);
}

/* ---- decoupled responses ------------------------------------------------------ */

/* ModelStreamInferResponse { infer_response { parameters {
 * triton_final_response: final } } }: appended to a packed response, it
 * merges into its infer_response (protobuf concatenation). */
static int final_flag_bytes(bool final, packed_response *out, pjs_error *err)
{
    Inference__InferParameter value = INFERENCE__INFER_PARAMETER__INIT;
    value.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    value.bool_param = final;
    Inference__ModelInferResponse__ParametersEntry entry =
        INFERENCE__MODEL_INFER_RESPONSE__PARAMETERS_ENTRY__INIT;
    entry.key = "triton_final_response";
    entry.value = &value;
    Inference__ModelInferResponse__ParametersEntry *entries[1] = {&entry};
    Inference__ModelInferResponse resp = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    resp.parameters = entries;
    resp.n_parameters = 1;
    Inference__ModelStreamInferResponse msg = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    msg.infer_response = &resp;
    return pjs_grpc_pack(&msg.base, &out->bytes, &out->len, err);
}

/* Waits on s->room until `until` (monotonic ns; 0: no limit); false when
 * that time came first. */
static bool wait_room_until(stream_call *s, uint64_t until)
{
    if (until == 0)
        return pthread_cond_wait(&s->room, &s->lock) == 0;
    struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u),
                          .tv_nsec = (long)(until % 1000000000u)};
    return pthread_cond_timedwait(&s->room, &s->lock, &ts) != ETIMEDOUT;
}

/* The client read nothing for the front end's stall bound while the write
 * queue was full: the stream is closed, so the run's responding fails and
 * its thread is free again. */
static void close_stalled_stream(stream_call *s, const char *model)
{
    unsigned long long ms = s->base.frontend->stream_write_stall_ns / 1000000u;
    char *peer = grpc_call_get_peer(s->base.call);
    pjs_warn("grpc ModelStreamInfer from %s: model %s: the client read none of %d waiting "
             "responses for %llu ms; closing the stream (--grpc-stream-write-timeout-ms)",
             peer != NULL ? peer : "?", model, STREAM_MAX_QUEUED_WRITES, ms);
    gpr_free(peer);
    char details[160];
    snprintf(details, sizeof details,
             "the client read none of the stream's responses for %llu ms: stream closed", ms);
    grpc_call_cancel_with_status(s->base.call, GRPC_STATUS_RESOURCE_EXHAUSTED, details, NULL);
}

/* Queues p (consumed) with its final flag. `wait`: while the write queue is
 * full, wait for room until the request's deadline, or for at most the
 * front end's stall bound without a write completing (then the stream is
 * closed). */
static int queue_response(stream_item *it, packed_response *p, bool final, bool wait,
                          pjs_error *err)
{
    stream_call *s = it->stream;
    packed_response flag = {0};
    int rc = final_flag_bytes(final, &flag, err);
    if (rc != 0) {
        free(p->bytes);
        p->bytes = NULL;
        return rc;
    }
    grpc_slice parts[2] = {grpc_slice_new(p->bytes, p->len, free),
                           grpc_slice_new(flag.bytes, flag.len, free)};
    p->bytes = NULL;
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, 2);
    grpc_slice_unref(parts[0]);
    grpc_slice_unref(parts[1]);
    uint64_t deadline = it->job.decoded.req.deadline_ns;
    uint64_t stall_ns = s->base.frontend->stream_write_stall_ns;
    pthread_mutex_lock(&s->lock);
    bool timed_out = false, stalled = false;
    while (wait && !s->dead && !timed_out && !stalled && s->n_queued >= STREAM_MAX_QUEUED_WRITES) {
        /* Room comes only when a write completes, so a wait that reaches
         * its stall bound saw no write complete. */
        uint64_t stall_at = stall_ns > 0 ? pjs_now_ns() + stall_ns : 0;
        bool by_stall = stall_at != 0 && (deadline == 0 || stall_at < deadline);
        if (!wait_room_until(s, by_stall ? stall_at : deadline)) {
            stalled = by_stall;
            timed_out = !by_stall;
        }
    }
    if (stalled) {
        mark_dead_locked(s);
        rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                           "the client read none of the ModelStreamInfer stream's responses for "
                           "%llu ms: the stream was closed, stop responding",
                           (unsigned long long)(stall_ns / 1000000u));
    } else if (s->dead) {
        rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                           "the client closed the ModelStreamInfer stream: stop responding");
    } else if (timed_out) {
        rc = pjs_error_set(err, PJS_ERR_DEADLINE_EXCEEDED,
                           "the request's deadline passed while its responses waited for the "
                           "client to read them");
    }
    if (rc != 0)
        grpc_byte_buffer_destroy(bb);
    else
        queue_write_locked(s, bb);
    write_next_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (stalled)
        close_stalled_stream(s, it->job.decoded.msg->model_name);
    return rc;
}

/* Packs a response of the item's request: its outputs as they are in
 * d->req (none when n_outputs is 0). The response is built in an arena of
 * its own, so a long stream does not grow the request's. */
static int pack_response(stream_item *it, packed_response *out, pjs_error *err)
{
    pjs_grpc_infer *d = &it->job.decoded;
    pjs_grpc_arena own, kept = d->arena;
    pjs_grpc_arena_init(&own, PJS_GRPC_DECODE_SLACK);
    d->arena = own;
    Inference__ModelStreamInferResponse msg = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    int rc = pjs_grpc_infer_response(d, PJS_MODEL_VERSION, &msg.infer_response, err);
    if (rc == 0)
        rc = pjs_grpc_pack(&msg.base, &out->bytes, &out->len, err);
    pjs_grpc_arena_reset(&d->arena);
    d->arena = kept;
    return rc;
}

/* The request's triton_enable_empty_final_response parameter. */
static bool wants_empty_final(const stream_item *it)
{
    const Inference__ModelInferRequest *msg = it->job.decoded.msg;
    for (size_t i = 0; i < msg->n_parameters; i++) {
        const Inference__ModelInferRequest__ParametersEntry *e = msg->parameters[i];
        if (strcmp(e->key, "triton_enable_empty_final_response") == 0 && e->value != NULL &&
            e->value->parameter_choice_case ==
                INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
            return e->value->bool_param;
    }
    return false;
}

/* Sends a decoupled request's response: `data` (consumed; NULL: none) and
 * the final flag; a flag without data only when the client's
 * triton_enable_empty_final_response asks for it. */
static int item_send(stream_item *it, packed_response *data, bool final, bool wait,
                     pjs_error *err)
{
    int rc = 0;
    packed_response empty = {0};
    if (data != NULL)
        rc = queue_response(it, data, final, wait, err);
    else if (final && wants_empty_final(it) && (rc = pack_response(it, &empty, err)) == 0)
        rc = queue_response(it, &empty, true, wait, err);
    if (rc == 0 && final)
        it->final_sent = true;
    return rc;
}

/* pjserve_respond of a decoupled model's run (pjs_infer_respond_fn). */
static int item_respond(pjs_infer_request *r, pjs_infer_output *outputs, size_t n, bool final,
                        pjs_error *err)
{
    stream_item *it = PJS_GRPC_CONTAINER(r->frontend_ctx, stream_item, job);
    memcpy(r->outputs, outputs, n * sizeof outputs[0]);
    r->n_outputs = n;
    packed_response data = {0};
    int rc = n > 0 ? pack_response(it, &data, err) : 0;
    pjs_infer_request_release(r);
    if (rc != 0)
        return rc;
    return item_send(it, n > 0 ? &data : NULL, final, true, err);
}

/* A decoupled request's run returned: the final response (the returned
 * outputs, or none) unless the run sent it; an error after the responses
 * sent so far. */
static void item_finish_decoupled(stream_item *it, const pjs_error *err)
{
    pjs_error send_err;
    pjs_error_clear(&send_err);
    if (err == NULL && !it->final_sent) {
        packed_response data = {0};
        bool any = it->job.decoded.req.n_outputs > 0;
        if ((any && pack_response(it, &data, &send_err) != 0) ||
            item_send(it, any ? &data : NULL, true, false, &send_err) != 0)
            err = &send_err;
    }
    if (err != NULL && send_err.code != PJS_ERR_UNAVAILABLE)
        item_encode(it, err);
}

/* The thread that ran the item's request, or the reading thread after a
 * failed submit: the item's answer is ready. */
static void item_complete(stream_item *it, const pjs_error *err)
{
    stream_call *s = it->stream;
    pthread_mutex_lock(&s->lock);
    bool dead = s->dead;
    pthread_mutex_unlock(&s->lock);
    if (!dead && it->job.decoded.req.respond != NULL)
        item_finish_decoupled(it, err);
    else if (!dead)
        item_encode(it, err);
    pjs__grpc_infer_job_trace(&it->job, err);
    pjs__grpc_infer_job_release(&it->job);
    pthread_mutex_lock(&s->lock);
    it->ready = true;
    write_next_locked(s);
    stream_step_done_locked(s);
}

static void item_on_done(pjs_grpc_infer_job *j, const pjs_error *err)
{
    item_complete(PJS_GRPC_CONTAINER(j, stream_item, job), err);
}

static void stream_on_read(pjs_grpc_tag *tag, bool ok)
{
    stream_call *s = PJS_GRPC_CONTAINER(tag, stream_call, on_read);
    pthread_mutex_lock(&s->lock);
    /* `reading` stays set until the message is submitted: a completion on
     * another thread must not start the next read (whose message could be
     * submitted first) in between. The read's reference is kept as long. */
    grpc_byte_buffer *payload = s->incoming;
    s->incoming = NULL;
    stream_item *it = NULL;
    if (!ok || payload == NULL || s->dead) {
        s->read_done = true;
    } else if ((it = calloc(1, sizeof *it)) != NULL) {
        it->stream = s;
        pjs__grpc_infer_job_init(&it->job, s->base.frontend);
        if (s->tail != NULL)
            s->tail->next = it;
        else
            s->head = it;
        s->tail = it;
        s->n_items++;
        s->refs++;
    } else {
        pjs_error("grpc ModelStreamInfer: no memory for a request; ending the stream");
        s->read_done = true;
        grpc_call_cancel(s->base.call, NULL);
    }
    pthread_mutex_unlock(&s->lock);
    if (it != NULL) {
        pjs_error err;
        pjs_error_clear(&err);
        it->job.respond = item_respond;
        it->job.client_gone = &s->gone;
        it->job.client = s;
        it->job.call = &s->base;
        if (pjs__grpc_infer_job_submit(&it->job, &payload, s->base.deadline, item_on_done, &err) !=
            0) {
            pjs_debug("grpc ModelStreamInfer: %s", err.msg);
            item_complete(it, &err);
        }
    }
    if (payload != NULL)
        grpc_byte_buffer_destroy(payload);
    pthread_mutex_lock(&s->lock);
    s->reading = false;
    s->refs--;
    stream_step_done_locked(s);
}

static void stream_on_write(pjs_grpc_tag *tag, bool ok)
{
    stream_call *s = PJS_GRPC_CONTAINER(tag, stream_call, on_write);
    pthread_mutex_lock(&s->lock);
    grpc_byte_buffer_destroy(s->writing);
    s->writing = NULL;
    s->refs--;
    if (!ok) {
        mark_dead_locked(s);
    }
    write_next_locked(s);
    stream_step_done_locked(s);
}

static void stream_on_close(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    stream_call *s = PJS_GRPC_CONTAINER(tag, stream_call, on_close);
    pthread_mutex_lock(&s->lock);
    s->refs--;
    if (s->base.cancelled) {
        mark_dead_locked(s);
    }
    write_next_locked(s);
    stream_step_done_locked(s);
}

static void stream_on_status(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    stream_call *s = PJS_GRPC_CONTAINER(tag, stream_call, on_status);
    pthread_mutex_lock(&s->lock);
    s->refs--;
    stream_step_done_locked(s);
}

static void stream_on_new(pjs_grpc_tag *tag, bool ok)
{
    stream_call *s = PJS_GRPC_CONTAINER(tag, stream_call, base.on_new);
    if (!ok) {
        stream_free(s);
        return;
    }
    pjs__grpc_request(s->base.frontend, s->base.method);
    pjs_error err;
    pjs_error_clear(&err);
    bool allowed = pjs__grpc_access_check(&s->base, &err) == 0;
    pthread_mutex_lock(&s->lock);
    if (!allowed) {
        /* Refused before the first read: the status alone, nothing read. */
        s->read_done = true;
        s->status_started = true;
        if (pjs__grpc_reply(&s->base, NULL, &err, &s->on_status) == GRPC_CALL_OK)
            s->refs++;
        stream_step_done_locked(s);
        return;
    }
    if (pjs__grpc_recv_close(&s->base, &s->on_close) == GRPC_CALL_OK)
        s->refs++;
    start_read_locked(s);
    stream_step_done_locked(s);
}

void pjs__grpc_request_stream(pjs_grpc_frontend *f, size_t index)
{
    stream_call *s = calloc(1, sizeof *s);
    if (s == NULL) {
        pjs_error("grpc: no memory to accept a ModelStreamInfer call");
        return;
    }
    pjs__grpc_call_init(&s->base, f, index, stream_on_new);
    s->on_read.fn = stream_on_read;
    s->on_write.fn = stream_on_write;
    s->on_close.fn = stream_on_close;
    s->on_status.fn = stream_on_status;
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC); /* deadlines are pjs_now_ns */
    pthread_cond_init(&s->room, &monotonic);
    pthread_condattr_destroy(&monotonic);
    if (pjs__grpc_call_request(&s->base, NULL) != GRPC_CALL_OK)
        stream_free(s);
}
