/*
 * control_rpc.c - the unary RPCs of pjserve.control.v1.ModelControl (see
 * proto/pjserve_control.proto), run by the generic unary call like those of
 * unary.c and listed in its method table.
 *
 * SetModelResidency and Compact wait for the dispatch thread to move
 * weights, so they run on the front end's control job threads (a bounded
 * pool: a full queue answers RESOURCE_EXHAUSTED at once) and answer their
 * deferred call from there; no completion-queue thread waits. Requests are
 * checked by the same functions the REST endpoints use (server/control.h),
 * so both refuse the same values with the same words.
 */
#include "frontend/grpc/internal.h"

#include <stdlib.h>

#include "core/mapped_file.h"
#include "frontend/grpc/control_codec.h"
#include "server/control.h"

static int no_memory(pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the response");
}

/* A control request handed to a job thread; lives in the call's arena,
 * which belongs to the job once the call is deferred. */
typedef struct control_job {
    pjs_grpc_frontend *frontend;
    pjs_grpc_arena *arena;
    const ProtobufCMessage *request;
    pjs_grpc_unary_fn work; /* the blocking part */
    pjs_grpc_deferred *call;
} control_job;

static void control_job_run(void *arg, bool cancelled)
{
    control_job *j = arg;
    pjs_error err;
    ProtobufCMessage *response = NULL;
    int rc;
    if (cancelled) {
        rc = pjs_error_set(&err, PJS_ERR_UNAVAILABLE, "the server is stopping");
    } else {
        pjs_grpc_unary_ctx ctx = {.frontend = j->frontend, .arena = j->arena};
        rc = j->work(&ctx, j->request, &response, &err);
    }
    pjs__grpc_unary_answer(j->call, rc == 0 ? response : NULL, rc == 0 ? NULL : &err);
}

/* Runs work(request) on a control job thread and answers from there. */
static int run_as_job(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                      pjs_grpc_unary_fn work, pjs_error *err)
{
    control_job *j = pjs_grpc_arena_alloc(ctx->arena, sizeof *j);
    if (j == NULL)
        return no_memory(err);
    *j = (control_job){.frontend = ctx->frontend, .arena = ctx->arena, .request = request,
                       .work = work};
    j->call = pjs__grpc_unary_defer(ctx);
    pjs_error refused;
    if (pjs_work_pool_submit(ctx->frontend->control_jobs, control_job_run, j, &refused) != 0)
        pjs__grpc_unary_answer(j->call, NULL, &refused);
    return 0;
}

/* The status of model `name` (after a change) as the response. */
static int model_status_response(pjs_grpc_unary_ctx *ctx, const char *name,
                                 ProtobufCMessage **response, pjs_error *err)
{
    pjs_control_model m;
    pjs_grpc_model_status *r;
    int rc = pjs_control_model_get(ctx->frontend->server, name, &m, err);
    if (rc == 0)
        rc = pjs_grpc_control_model_status(&m, ctx->arena, &r, err);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

int pjs__grpc_control_status(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                             ProtobufCMessage **response, pjs_error *err)
{
    const Pjserve__Control__V1__ModelControlStatusRequest *req =
        (const Pjserve__Control__V1__ModelControlStatusRequest *)request;
    pjs_server *s = ctx->frontend->server;
    pjs_control_model *models;
    size_t n;
    int rc = pjs_control_models(s, (const char *const *)req->names, req->n_names, &models, &n,
                                err);
    if (rc != 0)
        return rc;
    pjs_weight_cache_info cache;
    pjs_grpc_control_status_response *r;
    pjs_server_weight_cache_info(s, &cache);
    rc = pjs_grpc_control_status(pjs_server_control_mode(s), &cache, models, n, ctx->arena, &r,
                                 err);
    free(models);
    if (rc == 0)
        *response = &r->base;
    return rc;
}

static int set_residency(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                         ProtobufCMessage **response, pjs_error *err)
{
    const Pjserve__Control__V1__SetModelResidencyRequest *req =
        (const Pjserve__Control__V1__SetModelResidencyRequest *)request;
    pjs_residency target;
    int rc = pjs_grpc_control_residency((int)req->residency, req->name, &target, err);
    if (rc == 0)
        rc = pjs_server_set_residency(ctx->frontend->server, req->name, target, err);
    if (rc == 0)
        rc = model_status_response(ctx, req->name, response, err);
    return rc;
}

int pjs__grpc_control_set_policy(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                                 ProtobufCMessage **response, pjs_error *err)
{
    const Pjserve__Control__V1__SetModelPolicyRequest *req =
        (const Pjserve__Control__V1__SetModelPolicyRequest *)request;
    pjs_control_policy_change change;
    pjs_model_policy policy;
    pjs_grpc_control_policy_change(req, &change);
    int rc = pjs_control_policy(req->name, &change, &policy, err);
    if (rc == 0)
        rc = pjs_server_set_model_policy(ctx->frontend->server, req->name, &policy, err);
    if (rc == 0)
        rc = model_status_response(ctx, req->name, response, err);
    return rc;
}

static int compact(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                   ProtobufCMessage **response, pjs_error *err)
{
    const Pjserve__Control__V1__CompactRequest *req =
        (const Pjserve__Control__V1__CompactRequest *)request;
    Pjserve__Control__V1__CompactResponse *r = pjs_grpc_arena_alloc(ctx->arena, sizeof *r);
    if (r == NULL)
        return no_memory(err);
    pjserve__control__v1__compact_response__init(r);
    size_t reloaded = 0;
    int rc = pjs_server_compact(ctx->frontend->server, (const char *const *)req->reload,
                                req->n_reload, &reloaded, err);
    if (rc != 0)
        return rc;
    r->reloaded = reloaded;
    *response = &r->base;
    return 0;
}

int pjs__grpc_control_set_residency(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                                    ProtobufCMessage **response, pjs_error *err)
{
    (void)response;
    return run_as_job(ctx, request, set_residency, err);
}

int pjs__grpc_control_compact(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                              ProtobufCMessage **response, pjs_error *err)
{
    (void)response;
    return run_as_job(ctx, request, compact, err);
}

/* ---- NodeStatus ----------------------------------------------------------------------- */

/* Largest node status document read. */
#define NODE_STATUS_MAX ((size_t)1 << 20)

int pjs__grpc_control_node_status(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                                  ProtobufCMessage **response, pjs_error *err)
{
    (void)request;
    const char *path = ctx->frontend->node_status_file;
    if (path == NULL)
        return pjs_error_set(err, PJS_ERR_NOT_FOUND,
                             "this server runs on its own, not under `pjserve node`: there is "
                             "no node status");
    char *text = NULL;
    size_t len = 0;
    if (pjs_read_file(path, NODE_STATUS_MAX, &text, &len, err) != 0) {
        pjs_error_prefix(err, "the node status is not available yet: ");
        err->code = PJS_ERR_UNAVAILABLE;
        return err->code;
    }
    pjs_grpc_node_status_response *r = NULL;
    int rc = pjs_grpc_node_status(text, len, ctx->arena, &r, err);
    free(text);
    if (rc == 0)
        *response = &r->base;
    return rc;
}
