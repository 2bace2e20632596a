/*
 * http_infer.c - POST /v2/models/{m}[/versions/{v}]/infer.
 *
 * On the connection thread: look the model up, decode the body (JSON and
 * binary framing, see http_codec.h), read shared-memory inputs and submit.
 *
 * In on_done (on the submitting thread inside pjs_server_submit, when the
 * device was free, or on another thread later): write shared-memory
 * outputs, encode the response, record a traced request's spans, release
 * the request's outputs and model reference, free the decoded request and
 * store the reply.
 *
 * Then the call goes back to its connection thread through `handover`, one
 * atomic exchange on each side, so the connection is suspended only when
 * the answer is not there yet:
 *   - on_done marks DONE. Seeing SUSPENDED, it resumes the connection (its
 *     last touch of the call); seeing SUBMITTING, it leaves the call as it
 *     is, and the submitter takes it from there.
 *   - The submitter, once pjs_server_submit returned, finds DONE already
 *     (most requests on an idle device) and queues the reply without
 *     suspending. Otherwise it suspends the connection, then marks
 *     SUSPENDED; seeing DONE by then, it resumes the connection itself.
 * Either way exactly one side resumes, and only a suspended connection.
 * A refused submit stores the error and is answered at once.
 *
 * The decoded request (about 32 KB, mostly tensor tables) is taken from the
 * front end's pool and goes back to it when the request is finished, so a
 * steady stream of requests allocates none; decoding resets what it reads.
 */
#include "frontend/http/http_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static pjs_server *server_of(const pjs__http_call *c)
{
    return c->fe->routes_ctx;
}

/* A decoded request, linked while it waits in the pool. */
struct pjs__http_pooled_infer {
    pjs_http_infer infer;
    struct pjs__http_pooled_infer *next;
};

/* A decoded request from the pool, or a new one; NULL when out of memory. */
static pjs_http_infer *infer_take(pjs_http_frontend *fe)
{
    pthread_mutex_lock(&fe->infer_pool_lock);
    struct pjs__http_pooled_infer *p = fe->infer_pool;
    if (p != NULL) {
        fe->infer_pool = p->next;
        fe->n_infer_pool--;
    }
    pthread_mutex_unlock(&fe->infer_pool_lock);
    if (p == NULL)
        p = malloc(sizeof *p);
    return p != NULL ? &p->infer : NULL;
}

/* Gives a freed decoded request back to the pool (or to the heap when the
 * pool is full). */
static void infer_give(pjs_http_frontend *fe, pjs_http_infer *inf)
{
    struct pjs__http_pooled_infer *p =
        (struct pjs__http_pooled_infer *)((char *)inf -
                                          offsetof(struct pjs__http_pooled_infer, infer));
    pthread_mutex_lock(&fe->infer_pool_lock);
    bool kept = fe->n_infer_pool < PJS_HTTP_INFER_POOL;
    if (kept) {
        p->next = fe->infer_pool;
        fe->infer_pool = p;
        fe->n_infer_pool++;
    }
    pthread_mutex_unlock(&fe->infer_pool_lock);
    if (!kept)
        free(p);
}

void pjs__http_infer_pool_drain(pjs_http_frontend *fe)
{
    while (fe->infer_pool != NULL) {
        struct pjs__http_pooled_infer *p = fe->infer_pool;
        fe->infer_pool = p->next;
        free(p);
    }
    fe->n_infer_pool = 0;
}

/* Frees the decoded request and releases what the server handed back. */
static void finish_infer(pjs__http_call *c)
{
    pjs_http_infer *inf = c->infer;
    if (inf == NULL)
        return;
    pjs_infer_request_release(&inf->req);
    if (inf->req.model != NULL)
        pjs_model_unref(inf->req.model);
    pjs_http_infer_free(inf);
    infer_give(c->fe, inf);
    c->infer = NULL;
}

void pjs__http_infer_discard(pjs__http_call *c)
{
    finish_infer(c);
}

/* Encodes a successful request into the call's reply. */
static int reply_outputs(pjs__http_call *c, pjs_error *err)
{
    pjs_http_infer *inf = c->infer;
    pjs_http_buf body;
    size_t header_len = 0;
    pjs_http_buf_init(&body, PJS_HTTP_MAX_BODY);
    int rc = pjs_http_infer_write_shm_outputs(inf, err);
    if (rc == 0)
        rc = pjs_http_infer_encode(&inf->req, inf->req.model->name, PJS_MODEL_VERSION, &body,
                                   &header_len, err);
    if (rc == PJS_ERR_RESOURCE_EXHAUSTED) /* the client asked for too much, not too often */
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "the response would exceed %zu bytes; request fewer outputs or "
                           "write them to shared memory",
                           (size_t)PJS_HTTP_MAX_BODY);
    if (rc != 0) {
        pjs_http_buf_free(&body);
        return rc;
    }
    pjs__http_reply_buf(c, 200, &body,
                        header_len > 0 ? "application/octet-stream" : "application/json");
    c->reply.inference_header = header_len;
    return 0;
}

enum { HANDOVER_SUBMITTING, HANDOVER_SUSPENDED, HANDOVER_DONE };

static void on_infer_done(pjs_infer_request *r)
{
    pjs__http_call *c = r->frontend_ctx;
    pjs_error err = r->error;
    if (err.code == PJS_OK)
        reply_outputs(c, &err);
    if (err.code != PJS_OK)
        pjs__http_reply_error(c, &err);
    pjs_server_trace_finish(server_of(c), r, "http", pjs_now_ns(), &err);
    finish_infer(c);
    if (atomic_exchange(&c->handover, HANDOVER_DONE) == HANDOVER_SUSPENDED)
        MHD_resume_connection(c->conn); /* the last touch of the call */
}

bool pjs__http_infer_limit(pjs__http_call *c, const char *model, const char *version)
{
    pjs_model *m = NULL;
    if (pjs_server_get_model(server_of(c), model, version, &m, &c->body_error) != 0)
        return false; /* answered at once, before the body is read */
    uint64_t bound = pjs_http_infer_body_bound(pjs_model_manifest(m), m->max_batch_size);
    if (bound != 0 && bound < c->body_limit) {
        c->body_limit = (size_t)bound;
        snprintf(c->limit_what, sizeof c->limit_what,
                 "%llu bytes, more than any valid request for model \"%.64s\" can take (its "
                 "inputs at batch size %lld, written as JSON)",
                 (unsigned long long)bound, m->name, (long long)m->max_batch_size);
    }
    pjs_model_unref(m);
    return true;
}

void pjs__http_infer(pjs__http_call *c, const char *model, const char *version)
{
    pjs_server *s = server_of(c);
    pjs_error err;
    pjs_model *m = NULL;
    if (!pjs__http_body_ready(c))
        return;
    int rc = pjs_server_get_model(s, model, version, &m, &err);
    if (rc != 0) {
        pjs__http_reply_error(c, &err);
        return;
    }
    c->infer = infer_take(c->fe);
    if (c->infer == NULL) {
        pjs_model_unref(m);
        pjs__http_reply_message(c, 500, "out of memory decoding the request");
        return;
    }
    const char *header_length =
        MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    rc = pjs_http_infer_decode(c->infer, c->body.data, c->body.len, header_length, &err);
    c->infer->req.model = m; /* released by finish_infer from here on */
    if (rc == 0)
        rc = pjs_http_infer_map_shm(c->infer, pjs_server_shm(s), &err);
    if (rc != 0) {
        pjs_error_prefix(&err, "model %s: ", m->name);
        pjs__http_reply_error(c, &err);
        finish_infer(c);
        return;
    }
    const char *traceparent = pjs_server_tracer(s) != NULL
                                  ? MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                                "traceparent")
                                  : NULL;
    pjs_server_trace_start(s, &c->infer->req, traceparent,
                           traceparent != NULL ? strlen(traceparent) : 0);
    if (c->infer->req.sequence.start && pjs_model_manifest(m)->stateful) {
        pjs__http_client_id(c, c->client_id);
        c->infer->req.sequence.client = c->client_id;
    }
    c->infer->req.on_done = on_infer_done;
    c->infer->req.frontend_ctx = c;
    atomic_store(&c->handover, HANDOVER_SUBMITTING);
    rc = pjs_server_submit(s, &c->infer->req, &err);
    if (rc != 0) {
        pjs__http_reply_error(c, &err);
        pjs_server_trace_finish(s, &c->infer->req, "http", pjs_now_ns(), &err);
        finish_infer(c);
        return;
    }
    if (atomic_load(&c->handover) == HANDOVER_DONE)
        return; /* answered already: the reply is queued on return */
    c->waiting = true;
    MHD_suspend_connection(c->conn);
    if (atomic_exchange(&c->handover, HANDOVER_SUSPENDED) == HANDOVER_DONE)
        MHD_resume_connection(c->conn); /* done meanwhile: the reply is stored */
    /* else on_infer_done owns the call until it resumes it */
}
