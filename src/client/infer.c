/*
 * infer.c - inference calls: asynchronous with a callback (the one path),
 * with a handle to poll or wait on (a callback that fills the handle),
 * and synchronous (a handle waited on at once).
 *
 * An asynchronous call keeps copies of what it needs of the request past
 * its start (the outputs sent to shared memory, to mark them in the
 * result), so the caller may free the request as soon as the call starts.
 */
#include "client/internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct infer_call {
    pjs_client *client;
    pjsc_output_req *outs;
    size_t n_outs;
    pjs_client_callback callback;
    void *user_data;
} infer_call;

static void infer_done(void *arg, pjsc_reply *reply)
{
    infer_call *ic = arg;
    pjs_client_result *result = NULL;
    pjs_client_error e = reply->err;
    if (e.code == PJS_CLIENT_OK) {
        int rc = ic->client->protocol == PJS_CLIENT_GRPC
                     ? pjsc_decode_grpc_infer(reply->body, reply->len, ic->outs, ic->n_outs,
                                              &result, &e)
                     : pjsc_decode_rest_infer(reply->body, reply->len, reply->json_len, ic->outs,
                                              ic->n_outs, &result, &e);
        if (rc == 0)
            pjsc_ok(&e);
    }
    free(reply->body);
    pjsc_output_reqs_free(ic->outs, ic->n_outs);
    pjs_client_callback callback = ic->callback;
    void *user_data = ic->user_data;
    free(ic);
    callback(user_data, result, &e);
}

int pjs_client_infer_async(pjs_client *c, const pjs_client_request *req,
                           pjs_client_callback callback, void *user_data, pjs_client_error *err)
{
    if (c == NULL || req == NULL || callback == NULL)
        return pjsc_fail(err, PJS_CLIENT_INVALID_ARGUMENT,
                         "an inference call needs a client, a request and a callback");
    infer_call *ic = calloc(1, sizeof *ic);
    if (ic == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a call");
    ic->client = c;
    ic->callback = callback;
    ic->user_data = user_data;
    int rc = pjsc_output_reqs_copy(req, &ic->outs, &ic->n_outs, err);
    if (rc != 0) {
        free(ic);
        return rc;
    }
    uint32_t timeout = req->timeout_ms ? req->timeout_ms : c->timeout_ms;
    /* The server answers DEADLINE_EXCEEDED itself; the transport waits a
     * little longer for that answer. */
    uint32_t transport_timeout = timeout ? timeout + PJSC_DEADLINE_GRACE_MS : 0;
    if (c->protocol == PJS_CLIENT_GRPC) {
        pjsc_grpc_request *g;
        const ProtobufCMessage *msg;
        rc = pjsc_grpc_request_build(req, timeout, &g, &msg, err);
        if (rc == 0) {
            rc = pjsc_grpc_start(c, "/inference.GRPCInferenceService/ModelInfer", msg,
                                 transport_timeout, infer_done, ic, err);
            pjsc_grpc_request_free(g);
        }
    } else {
        char path[1400], *body;
        size_t body_len, json_len;
        rc = pjsc_model_path(path, sizeof path, req->model, req->version, "/infer", err);
        if (rc == 0)
            rc = pjsc_rest_request_build(req, timeout, &body, &body_len, &json_len, err);
        if (rc == 0)
            rc = pjsc_http_start(c, "POST", path, body, body_len, json_len, transport_timeout,
                                 infer_done, ic, err);
    }
    if (rc != 0) {
        pjsc_output_reqs_free(ic->outs, ic->n_outs);
        free(ic);
        return rc;
    }
    pjsc_ok(err);
    return 0;
}

/* ---- handles to poll ------------------------------------------------------------------ */

struct pjs_client_pending {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    pjs_client_result *result;
    pjs_client_error err;
};

static void pending_done(void *arg, pjs_client_result *result, const pjs_client_error *err)
{
    pjs_client_pending *p = arg;
    pthread_mutex_lock(&p->mu);
    p->result = result;
    p->err = *err;
    p->done = true;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->mu);
}

int pjs_client_infer_start(pjs_client *c, const pjs_client_request *req,
                           pjs_client_pending **out, pjs_client_error *err)
{
    *out = NULL;
    pjs_client_pending *p = calloc(1, sizeof *p);
    if (p == NULL)
        return pjsc_fail(err, PJS_CLIENT_RESOURCE_EXHAUSTED, "no memory for a call");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
    int rc = pjs_client_infer_async(c, req, pending_done, p, err);
    if (rc != 0) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cond);
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int pjs_client_pending_done(pjs_client_pending *p)
{
    pthread_mutex_lock(&p->mu);
    bool done = p->done;
    pthread_mutex_unlock(&p->mu);
    return done ? 1 : 0;
}

int pjs_client_pending_wait(pjs_client_pending *p, pjs_client_result **out,
                            pjs_client_error *err)
{
    *out = NULL;
    pthread_mutex_lock(&p->mu);
    while (!p->done)
        pthread_cond_wait(&p->cond, &p->mu);
    pthread_mutex_unlock(&p->mu);
    int rc = (int)p->err.code;
    *out = p->result;
    if (err != NULL)
        *err = p->err;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cond);
    free(p);
    return rc;
}

int pjs_client_infer(pjs_client *c, const pjs_client_request *req, pjs_client_result **out,
                     pjs_client_error *err)
{
    pjs_client_pending *p;
    *out = NULL;
    int rc = pjs_client_infer_start(c, req, &p, err);
    return rc != 0 ? rc : pjs_client_pending_wait(p, out, err);
}
