/*
 * infer_call.c - unary ModelInfer, and the path every inference request
 * over gRPC takes to the server (a pjs_grpc_infer_job: ModelInfer's, and
 * each message of ModelStreamInfer's).
 *
 * A job takes its message's bytes from the server's budget for request
 * bytes in flight, decodes them (the tensors in raw_input_contents stay in
 * those bytes, which the job keeps with the request), looks the model up
 * and submits the request
 * with the earlier of its `timeout` and the call's deadline, so the
 * scheduler answers DEADLINE_EXCEEDED instead of running a request nobody
 * waits for. The bytes stay charged until the job is released, once its
 * response is encoded.
 *
 * States of one ModelInfer call:
 *   requested --on_new--> submitting (CQ thread): the next call is
 *     requested, the caller's access checked and the job submitted. Any
 *     failure is answered at once.
 *   in the dispatcher --job done--> the response is encoded (or the error
 *     mapped), a traced request's spans recorded (server/request_trace.c),
 *     and the one reply batch started: initial metadata, message,
 *     status and RECV_CLOSE_ON_SERVER. This runs on the thread that ran the
 *     request: the CQ thread itself, inside pjs_server_submit, when the
 *     device was free, else a dispatcher worker; so on_new touches nothing
 *     of the call once the submit succeeded.
 *   replying --on_sent--> the batch completed: the call is freed.
 *
 * A cancelled call still runs in the dispatcher (there is no way to
 * withdraw a submitted request); its response is encoded all the same and
 * the batch fails quietly.
 *
 * A finished call object goes to the front end's pool (up to
 * PJS_GRPC_INFER_POOL of them) and serves a later call: with its arena
 * block kept, a steady stream of small requests allocates no call object,
 * arena or response buffer of pjserve's own (the output buffers aside).
 */
#include "frontend/grpc/internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "frontend/deadline.h"
#include "frontend/grpc/codec.h"

/* ---- the job ------------------------------------------------------------------ */

void pjs__grpc_infer_job_init(pjs_grpc_infer_job *j, pjs_grpc_frontend *f)
{
    memset(j, 0, sizeof *j);
    j->frontend = f;
    j->bytes = grpc_empty_slice();
    pjs_grpc_infer_init(&j->decoded);
}

void pjs__grpc_infer_job_trace(pjs_grpc_infer_job *j, const pjs_error *err)
{
    pjs_server_trace_finish(j->frontend->server, &j->decoded.req, "grpc", pjs_now_ns(), err);
}

void pjs__grpc_infer_job_release(pjs_grpc_infer_job *j)
{
    memset(&j->decoded.req.trace, 0, sizeof j->decoded.req.trace);
    pjs_grpc_infer_recycle(&j->decoded);
    grpc_slice_unref(j->bytes); /* after the request that borrowed from it */
    j->bytes = grpc_empty_slice();
    pjs__grpc_release_request(j->frontend, &j->charged);
    if (j->model != NULL)
        pjs_model_unref(j->model);
    j->model = NULL;
}

void pjs__grpc_infer_job_destroy(pjs_grpc_infer_job *j)
{
    pjs__grpc_infer_job_release(j);
    pjs_grpc_infer_release(&j->decoded);
}

/* The thread that ran the request: hands the job to its owner. */
static void job_on_done(pjs_infer_request *r)
{
    pjs_grpc_infer_job *j = r->frontend_ctx;
    pjs_grpc_frontend *f = j->frontend; /* j may be freed by done */
    pjs_error err;
    bool failed = r->error.code != 0;
    if (failed)
        err = r->error; /* r goes with the job's release */
    j->done(j, failed ? &err : NULL);
    pjs__grpc_dispatch_end(f);
}

int pjs__grpc_infer_job_submit(pjs_grpc_infer_job *j, grpc_byte_buffer **payload,
                               gpr_timespec deadline, pjs_grpc_infer_job_done_fn done,
                               pjs_error *err)
{
    pjs_grpc_frontend *f = j->frontend;
    int rc = pjs__grpc_take_request(f, payload, &j->bytes, &j->charged, err);
    if (rc != 0)
        return rc;
    rc = pjs_grpc_infer_decode(&j->decoded, GRPC_SLICE_START_PTR(j->bytes),
                               GRPC_SLICE_LENGTH(j->bytes), pjs_server_shm(f->server), err);
    if (rc != 0)
        return rc;
    const Inference__ModelInferRequest *msg = j->decoded.msg;
    rc = pjs_server_get_model(f->server, msg->model_name, msg->model_version, &j->model, err);
    if (rc != 0)
        return rc;
    pjs_infer_request *r = &j->decoded.req;
    r->model = j->model;
    r->deadline_ns = pjs_deadline_earlier(r->deadline_ns, pjs__grpc_deadline_ns(deadline));
    r->on_done = job_on_done;
    r->frontend_ctx = j;
    r->client_gone = j->client_gone;
    r->client = j->client;
    r->sole_poller = atomic_load_explicit(&f->polling, memory_order_relaxed) == 0;
    size_t traceparent_len = 0;
    const char *traceparent =
        j->call != NULL && pjs_server_tracer(f->server) != NULL
            ? pjs__grpc_metadata_value(&j->call->metadata, "traceparent", &traceparent_len)
            : NULL;
    pjs_server_trace_start(f->server, r, traceparent, traceparent_len);
    if (r->sequence.start && j->model->bundle->manifest.stateful && j->call != NULL) {
        pjs__grpc_client_id(f, j->call->call, &j->call->metadata, j->client_id);
        r->sequence.client = j->client_id;
    }
    if (j->model->bundle->manifest.decoupled)
        r->respond = j->respond;
    j->done = done;
    pjs__grpc_dispatch_begin(f);
    rc = pjs_server_submit(f->server, r, err); /* j may be gone once this succeeded */
    if (rc != 0)
        pjs__grpc_dispatch_end(f);
    return rc;
}

/* ---- ModelInfer --------------------------------------------------------------- */

typedef struct infer_call {
    pjs_grpc_call base;
    pjs_grpc_tag on_sent; /* the reply batch completed */
    grpc_byte_buffer *payload;
    grpc_byte_buffer *response;
    pjs_grpc_infer_job job;
} infer_call;

/* Call objects kept for reuse per front end: enough for every call in
 * flight at a busy moment, about 46 KiB each. */
#define PJS_GRPC_INFER_POOL 64

static infer_call *pool_take(pjs_grpc_frontend *f)
{
    pthread_mutex_lock(&f->pool_lock);
    pjs_grpc_infer_job *j = f->pooled_jobs;
    if (j != NULL) {
        f->pooled_jobs = j->next_pooled;
        f->n_pooled--;
    }
    pthread_mutex_unlock(&f->pool_lock);
    return j != NULL ? PJS_GRPC_CONTAINER(j, infer_call, job) : NULL;
}

static bool pool_put(pjs_grpc_frontend *f, infer_call *c)
{
    pthread_mutex_lock(&f->pool_lock);
    bool kept = f->n_pooled < PJS_GRPC_INFER_POOL;
    if (kept) {
        c->job.next_pooled = f->pooled_jobs;
        f->pooled_jobs = &c->job;
        f->n_pooled++;
    }
    pthread_mutex_unlock(&f->pool_lock);
    return kept;
}

void pjs__grpc_infer_pool_drain(pjs_grpc_frontend *f)
{
    infer_call *c;
    while ((c = pool_take(f)) != NULL) {
        pjs__grpc_infer_job_destroy(&c->job);
        free(c);
    }
}

/* The call is over: its object goes to the pool, or is freed. */
static void infer_free(infer_call *c)
{
    pjs_grpc_frontend *f = c->base.frontend;
    pjs__grpc_infer_job_release(&c->job);
    if (c->payload != NULL)
        grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    if (c->response != NULL)
        grpc_byte_buffer_destroy(c->response);
    c->response = NULL;
    pjs__grpc_call_drop(&c->base);
    if (!pool_put(f, c)) {
        pjs__grpc_infer_job_destroy(&c->job);
        free(c);
    }
    pjs__grpc_call_gone(f); /* the front end may go from here on */
}

static void infer_on_sent(pjs_grpc_tag *tag, bool ok)
{
    (void)ok; /* a failed batch means the client went away: nothing to do */
    infer_free(PJS_GRPC_CONTAINER(tag, infer_call, on_sent));
}

/* Starts the one reply batch: c->response, or err as the status. */
static void infer_reply(infer_call *c, const pjs_error *err)
{
    if (pjs__grpc_reply(&c->base, c->response, err, &c->on_sent) != GRPC_CALL_OK) {
        pjs_error("grpc ModelInfer: cannot start the reply batch");
        infer_free(c);
    }
}

/* The thread that ran the request: encode and reply. */
static void infer_on_done(pjs_grpc_infer_job *j, const pjs_error *err)
{
    infer_call *c = PJS_GRPC_CONTAINER(j, infer_call, job);
    pjs_error encode_err;
    if (err == NULL) {
        Inference__ModelInferResponse *resp;
        if (pjs_grpc_infer_response(&j->decoded, PJS_MODEL_VERSION, &resp, &encode_err) != 0 ||
            (c->response = pjs__grpc_pack(&resp->base, &encode_err)) == NULL)
            err = &encode_err;
    }
    pjs__grpc_infer_job_trace(j, err);
    /* The packed response owns its bytes: the request can go now. */
    pjs__grpc_infer_job_release(j);
    infer_reply(c, err);
}

static void infer_on_new(pjs_grpc_tag *tag, bool ok)
{
    infer_call *c = PJS_GRPC_CONTAINER(tag, infer_call, base.on_new);
    if (!ok) {
        infer_free(c);
        return;
    }
    pjs__grpc_request(c->base.frontend, c->base.method);
    pjs_error err;
    pjs_error_clear(&err);
    if (pjs__grpc_access_check(&c->base, &err) == 0 &&
        pjs__grpc_infer_job_submit(&c->job, &c->payload, c->base.deadline, infer_on_done, &err) ==
            0)
        return; /* c belongs to infer_on_done now, which may have run already */
    pjs_debug("grpc ModelInfer: %s", err.msg);
    pjs__grpc_infer_job_trace(&c->job, &err);
    pjs__grpc_infer_job_release(&c->job);
    infer_reply(c, &err);
}

void pjs__grpc_request_infer(pjs_grpc_frontend *f, size_t index)
{
    infer_call *c = pool_take(f); /* released by infer_free: payload, response, call NULL */
    if (c == NULL) {
        if ((c = calloc(1, sizeof *c)) == NULL) {
            pjs_error("grpc: no memory to accept a ModelInfer call");
            return;
        }
        pjs__grpc_infer_job_init(&c->job, f);
        c->job.call = &c->base;
    }
    c->base.cancelled = 0;
    pjs__grpc_call_init(&c->base, f, index, infer_on_new);
    c->on_sent.fn = infer_on_sent;
    if (pjs__grpc_call_request(&c->base, &c->payload) != GRPC_CALL_OK)
        infer_free(c);
}
