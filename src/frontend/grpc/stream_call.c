/*
 * stream_call.c - ModelStreamInfer: many inference requests on one
 * bidirectional stream, answered in the order they arrived.
 *
 * The stream reads one message at a time. Each message becomes an item
 * appended to the stream's FIFO before the next read starts, then is
 * decoded and submitted; a request that fails there is answered at once
 * with error_message (the stream goes on). Each request's deadline is the
 * earlier of the stream's deadline and its own `timeout` parameter; one that
 * passes is answered with error_message too (DEADLINE_EXCEEDED's message).
 * Items become ready when their response (or error) is encoded: for a
 * submitted request on the thread that ran it, which is the reading thread
 * itself, inside pjs_server_submit, when the device was free. So the reader
 * holds no lock across the submit and touches the item no more after it.
 * The head of the FIFO is written as soon as it is ready, one write at a
 * time as gRPC requires, so responses leave in request order.
 * With PJS_GRPC_STREAM_MAX_IN_FLIGHT items queued, reading pauses until a
 * response is written: a client cannot queue unbounded work on one stream.
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

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "frontend/deadline.h"
#include "frontend/grpc/codec.h"

typedef struct stream_call stream_call;

typedef struct stream_item {
    struct stream_item *next;
    stream_call *stream;
    bool ready;                 /* response is set */
    grpc_byte_buffer *response; /* ModelStreamInferResponse; NULL if it could not be made */
    pjs_grpc_infer_job job;
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
    bool reading;         /* a read is outstanding */
    bool read_done;       /* half-closed by the client, or reading failed */
    bool dead;            /* cancelled or a write failed: drop responses */
    bool metadata_sent;
    bool status_started;
    size_t n_items;
    stream_item *head, *tail;
};

static void stream_free(stream_call *s)
{
    if (s->incoming != NULL)
        grpc_byte_buffer_destroy(s->incoming);
    pthread_mutex_destroy(&s->lock);
    pjs__grpc_call_destroy(&s->base);
    free(s);
}

static void item_free(stream_item *it)
{
    pjs__grpc_infer_job_release(&it->job);
    if (it->response != NULL)
        grpc_byte_buffer_destroy(it->response);
    free(it);
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

/* Writes the head item if it is ready and nothing is being written. */
static void write_next_locked(stream_call *s)
{
    while (s->writing == NULL && s->head != NULL && s->head->ready) {
        stream_item *it = s->head;
        s->head = it->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->n_items--;
        s->refs--; /* the item's reference; the write takes its own */
        grpc_byte_buffer *bb = it->response;
        it->response = NULL;
        item_free(it);
        if (s->dead || bb == NULL) {
            if (bb != NULL)
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
            s->dead = true;
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
    if (!s->read_done || s->n_items > 0 || s->writing != NULL || s->status_started)
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

/* The thread that ran the item's request, or the reading thread after a
 * failed submit: the item's answer is ready. */
static void item_complete(stream_item *it, const pjs_error *err)
{
    stream_call *s = it->stream;
    pthread_mutex_lock(&s->lock);
    bool dead = s->dead;
    pthread_mutex_unlock(&s->lock);
    if (!dead)
        item_encode(it, err);
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
    s->reading = false; /* its reference is kept until this step ends */
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
        if (pjs__grpc_infer_job_submit(&it->job, &payload, s->base.deadline, item_on_done, &err) !=
            0) {
            pjs_debug("grpc ModelStreamInfer: %s", err.msg);
            item_complete(it, &err);
        }
    }
    if (payload != NULL)
        grpc_byte_buffer_destroy(payload);
    pthread_mutex_lock(&s->lock);
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
    if (!ok)
        s->dead = true;
    write_next_locked(s);
    stream_step_done_locked(s);
}

static void stream_on_close(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    stream_call *s = PJS_GRPC_CONTAINER(tag, stream_call, on_close);
    pthread_mutex_lock(&s->lock);
    s->refs--;
    if (s->base.cancelled)
        s->dead = true;
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
    if (pjs__grpc_call_request(&s->base, NULL) != GRPC_CALL_OK)
        stream_free(s);
}
