/*
 * meta.c - running meta models (see meta.h).
 *
 * A meta_run is one request's orchestration: its hook context, its place in
 * the gate, its committed-caller slot and the sub-calls it started. Each
 * sub-call is one or more pjs_infer_requests ("parts": a batch larger than
 * the sub-model's largest compiled size is split) completed by the
 * dispatcher on its own threads; the run's lock and condition variable
 * count completed parts and hand the run's committed turn on: when a
 * committed part completes, the oldest part still waiting as an ordinary
 * request is promoted (server.h, pjs_committed_caller), so the run's parts
 * jump the line one after another. That is all those threads touch;
 * everything else belongs to the thread running pjserve_run. An ensemble's
 * run is ensemble.c's pjs_ensemble_run in place of a model.so's pjserve_run,
 * its steps' models standing for meta.calls.
 */
#include "server/meta.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "registry/model.h"
#include "server/ensemble.h"
#include "server/meta_gate.h"
#include "server/server.h"
#include "server/server_internal.h"

struct pjserve_subcall {
    struct pjs_meta_run *run;
    pjserve_subcall *next;      /* the run's list, newest first */
    pjs_model *model;           /* a reference */
    size_t n_parts;
    pjs_infer_request *parts;
    unsigned char *state;       /* per part: PART_* (run->lock) */
    size_t n_submitted;         /* parts queued (the rest failed to queue) */
    size_t n_done;              /* parts completed (run->lock) */
    pjs_error error;            /* the first failure (run->lock) */
    bool waited;
    /* Its span under the meta's request, when that is traced: from the
     * start to the last part's completion (run->lock). */
    pjs_trace_ctx trace;
    uint64_t started_ns, done_ns;
};

typedef struct pjs_meta_run {
    pjs_meta_job job;
    pjs_hook_ctx ctx;
    pjs_committed_caller committed;
    pthread_mutex_t lock;
    pthread_cond_t done;
    pjserve_subcall *calls;
    /* The models meta.calls names, held (weights not evicted to make room
     * for others) for the run's length; NULL where one was not loaded. */
    pjs_model *held[PJS_INFER_MAX_TENSORS];
    size_t n_held;
} pjs_meta_run;

/* ---- sub-calls -------------------------------------------------------------- */

enum { PART_UNSUBMITTED = 0, PART_QUEUED = 1, PART_DONE = 2 };

/* run->lock held: the run's committed turn goes to its oldest part still
 * queued as an ordinary request, if any. */
static void pass_turn_locked(pjs_meta_run *run)
{
    pjserve_subcall *oldest = NULL;
    for (bool promoted = false; !promoted;) {
        /* The list is newest first: find the oldest call with a queued part. */
        oldest = NULL;
        for (pjserve_subcall *c = run->calls; c != NULL; c = c->next)
            for (size_t k = 0; k < c->n_parts; k++)
                if (c->state[k] == PART_QUEUED && !c->parts[k].job.committed) {
                    oldest = c;
                    break;
                }
        if (oldest == NULL)
            return;
        size_t k = 0;
        while (oldest->state[k] != PART_QUEUED || oldest->parts[k].job.committed)
            k++;
        if (!pjs__server_promote(run->ctx.server, &oldest->parts[k], &run->committed))
            return; /* dequeued meanwhile, or another part took the turn */
        promoted = true;
    }
}

static void part_done(pjs_infer_request *part)
{
    pjserve_subcall *c = part->frontend_ctx;
    pjs_meta_run *run = c->run;
    pthread_mutex_lock(&run->lock);
    if (part->error.code != 0 && c->error.code == 0)
        c->error = part->error;
    c->state[part - c->parts] = PART_DONE;
    c->n_done++;
    c->done_ns = pjs_now_ns();
    if (part->committed_slot != NULL)
        pass_turn_locked(run);
    pthread_cond_broadcast(&run->done);
    pthread_mutex_unlock(&run->lock);
}

static bool declared(const pjs_manifest *meta, const char *name)
{
    for (size_t i = 0; i < meta->n_calls; i++)
        if (strcmp(meta->calls[i], name) == 0)
            return true;
    return false;
}

static int set_message(pjs_hook_ctx *ctx, const pjs_error *err)
{
    snprintf(ctx->message, sizeof ctx->message, "%s", err->msg);
    return pjs_hook_status_from_pjs(err->code);
}

/* The rows of the call: the batch axis of the sub-model's first batched
 * input as given, or 0 when no input the model batches was given. */
static int64_t call_rows(const pjs_model *m, const pjserve_tensor *in, size_t n)
{
    const pjs_manifest *man = &m->bundle->manifest;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < man->n_inputs; k++)
            if (man->inputs[k].batched && in[i].name != NULL &&
                strcmp(in[i].name, man->inputs[k].name) == 0 && in[i].rank > 0)
                return in[i].shape[0];
    return 0;
}

static bool input_batched(const pjs_model *m, const char *name)
{
    const pjs_manifest *man = &m->bundle->manifest;
    for (size_t k = 0; k < man->n_inputs; k++)
        if (strcmp(man->inputs[k].name, name) == 0)
            return man->inputs[k].batched;
    return false;
}

/* Fills part p (rows [first, first + rows) of the call) from the inputs. */
static void fill_part(pjs_infer_request *p, pjs_meta_run *run, pjserve_subcall *c,
                      const pjserve_tensor *in, size_t n, int64_t total, int64_t first,
                      int64_t rows)
{
    const pjs_infer_request *r = run->ctx.request;
    pjs_infer_request_init(p);
    p->model = pjs_model_ref(c->model);
    p->id = r->id;
    p->deadline_ns = r->deadline_ns;
    p->on_done = part_done;
    p->frontend_ctx = c;
    p->n_inputs = n;
    for (size_t i = 0; i < n; i++) {
        pjs_infer_input *x = &p->inputs[i];
        pjs_dtype dtype = pjs_hook_dtype_in(in[i].dtype);
        x->name = in[i].name != NULL ? in[i].name : "";
        x->datatype = dtype != PJS_DTYPE_INVALID ? pjs_dtype_kserve_name(dtype) : "INVALID";
        x->shape.rank = in[i].rank < 0 ? 0 : in[i].rank > PJS_MAX_RANK ? PJS_MAX_RANK : in[i].rank;
        memcpy(x->shape.dims, in[i].shape, sizeof x->shape.dims);
        x->data = in[i].data;
        x->nbytes = in[i].nbytes;
        if (total > 0 && rows != total && input_batched(c->model, x->name) &&
            in[i].shape[0] == total) {
            size_t row_bytes = in[i].nbytes / (size_t)total;
            x->shape.dims[0] = rows;
            x->data = (const char *)in[i].data + row_bytes * (size_t)first;
            x->nbytes = row_bytes * (size_t)rows;
        }
    }
}

/* Queues part p: committed when this run has no committed part in flight. */
static int submit_part(pjs_meta_run *run, pjs_infer_request *p, pjs_error *err)
{
    pjs_server *s = run->ctx.server;
    if (!atomic_load(&run->committed.in_flight)) {
        int rc = pjs_server_submit_committed(s, p, &run->committed, err);
        if (rc != PJS_ERR_FAILED_PRECONDITION)
            return rc;
        pjs_error_clear(err);
    }
    return pjs__server_submit_executable(s, p, false, err);
}

int pjs_meta_call_start(pjs_hook_ctx *ctx, const char *model, const pjserve_tensor *in, size_t n,
                        pjserve_subcall **out)
{
    pjs_meta_run *run = ctx->meta;
    const pjs_manifest *meta = &ctx->model->bundle->manifest;
    pjs_error err;
    pjs_error_clear(&err);
    *out = NULL;
    if (model == NULL || !declared(meta, model)) {
        char list[512] = "";
        size_t used = 0;
        for (size_t i = 0; i < meta->n_calls && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                     meta->calls[i]);
        pjs_error("model %s: pjserve_run called \"%s\", which its meta.calls does not declare",
                  ctx->model->name, model != NULL ? model : "(null)");
        snprintf(ctx->message, sizeof ctx->message,
                 "pjserve_call_start: \"%s\" is not in meta.calls [%s]: declare every model a "
                 "meta calls",
                 model != NULL ? model : "(null)", list);
        return PJSERVE_NOT_FOUND;
    }
    if (n > PJS_INFER_MAX_TENSORS) {
        snprintf(ctx->message, sizeof ctx->message, "pjserve_call_start: %zu inputs, at most %d",
                 n, PJS_INFER_MAX_TENSORS);
        return PJSERVE_INVALID_ARGUMENT;
    }
    uint64_t deadline = ctx->request->deadline_ns;
    if (deadline != 0 && pjs_now_ns() >= deadline) {
        snprintf(ctx->message, sizeof ctx->message,
                 "the request's deadline passed before the call of %s: stopped at that stage",
                 model);
        return PJSERVE_DEADLINE_EXCEEDED;
    }
    pjserve_subcall *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(ctx->message, sizeof ctx->message, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    c->run = run;
    c->started_ns = pjs_now_ns();
    if (ctx->request->trace.sampled)
        pjs_trace_child(&ctx->request->trace, &c->trace);
    if (pjs__server_get_internal_model(ctx->server, model, &c->model, &err) != 0) {
        free(c);
        return set_message(ctx, &err);
    }
    int64_t rows = call_rows(c->model, in, n), max = c->model->max_batch_size;
    size_t n_parts = max > 0 && rows > max ? (size_t)((rows + max - 1) / max) : 1;
    c->parts = calloc(n_parts, sizeof *c->parts);
    c->state = calloc(n_parts, sizeof *c->state);
    if (c->parts == NULL || c->state == NULL) {
        free(c->parts);
        free(c->state);
        pjs_model_unref(c->model);
        free(c);
        snprintf(ctx->message, sizeof ctx->message, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    c->n_parts = n_parts;
    /* Linked under the lock: a part of an earlier call may be completing on
     * a worker and walking the list to pass the run's turn on. */
    pthread_mutex_lock(&run->lock);
    c->next = run->calls;
    run->calls = c;
    pthread_mutex_unlock(&run->lock);
    int rc = 0;
    for (size_t k = 0; k < n_parts && rc == 0; k++) {
        int64_t first = (int64_t)k * (max > 0 ? max : rows);
        int64_t part_rows = n_parts == 1 ? rows : (rows - first < max ? rows - first : max);
        pjs_infer_request *p = &c->parts[k];
        fill_part(p, run, c, in, n, rows, first, part_rows);
        if ((rc = submit_part(run, p, &err)) != 0)
            break;
        pthread_mutex_lock(&run->lock);
        c->n_submitted++;
        if (c->state[k] == PART_UNSUBMITTED) /* else it completed already */
            c->state[k] = PART_QUEUED;
        pthread_mutex_unlock(&run->lock);
    }
    if (rc != 0) {
        pthread_mutex_lock(&run->lock);
        c->error = err;
        pthread_mutex_unlock(&run->lock);
        c->waited = true; /* never handed out */
        return set_message(ctx, &err);
    }
    *out = c;
    return PJSERVE_OK;
}

/* Blocks until every queued part of c completed. */
static void wait_parts(pjs_meta_run *run, pjserve_subcall *c)
{
    pthread_mutex_lock(&run->lock);
    while (c->n_done < c->n_submitted)
        pthread_cond_wait(&run->done, &run->lock);
    pthread_mutex_unlock(&run->lock);
}

/* The call's outputs: the one part's, or the parts' joined along the batch
 * axis into arena memory (outputs without one are the first part's). */
static int join_outputs(pjs_hook_ctx *ctx, pjserve_subcall *c, const pjserve_tensor **out,
                        size_t *n)
{
    const pjs_infer_request *p0 = &c->parts[0];
    pjserve_tensor *t = pjs_hook_ctx_alloc(ctx, (p0->n_outputs + 1) * sizeof *t);
    if (t == NULL) {
        snprintf(ctx->message, sizeof ctx->message, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    for (size_t i = 0; i < p0->n_outputs; i++) {
        const pjs_infer_output *o = &p0->outputs[i];
        t[i] = pjs_hook_tensor_from(o->spec->name, o->spec->dtype, &o->shape, o->data, o->nbytes);
        if (c->n_parts == 1 || !o->spec->batched)
            continue;
        size_t total = 0;
        for (size_t k = 0; k < c->n_parts; k++)
            total += c->parts[k].outputs[i].nbytes;
        char *joined = pjs_hook_ctx_alloc(ctx, total);
        if (joined == NULL) {
            snprintf(ctx->message, sizeof ctx->message, "out of memory joining output %s",
                     o->spec->name);
            return PJSERVE_RESOURCE_EXHAUSTED;
        }
        size_t at = 0;
        int64_t rows = 0;
        for (size_t k = 0; k < c->n_parts; k++) {
            const pjs_infer_output *ok = &c->parts[k].outputs[i];
            memcpy(joined + at, ok->data, ok->nbytes);
            at += ok->nbytes;
            rows += ok->shape.dims[0];
        }
        t[i].data = joined;
        t[i].nbytes = total;
        t[i].shape[0] = rows;
    }
    *out = t;
    *n = p0->n_outputs;
    return PJSERVE_OK;
}

int pjs_meta_call_wait(pjs_hook_ctx *ctx, pjserve_subcall *c, const pjserve_tensor **out,
                       size_t *n)
{
    pjs_meta_run *run = ctx->meta;
    if (c == NULL || c->run != run || c->waited) {
        snprintf(ctx->message, sizeof ctx->message,
                 "pjserve_call_wait: %s", c == NULL ? "no call given"
                                          : c->run != run ? "the call belongs to another request"
                                                          : "this call was waited for already");
        return PJSERVE_INVALID_ARGUMENT;
    }
    c->waited = true;
    wait_parts(run, c);
    if (c->error.code != 0) {
        pjs_error e = c->error;
        pjs_error_prefix(&e, "sub-model %s: ", c->model->name);
        return set_message(ctx, &e);
    }
    return join_outputs(ctx, c, out, n);
}

/* ---- the run ------------------------------------------------------------------ */

/* A traced call's span, and its parts' queue and execute spans under it. */
static void trace_call(pjs_meta_run *run, const pjserve_subcall *c)
{
    pjs_tracer *t = pjs_server_tracer(run->ctx.server);
    if (t == NULL || !c->trace.sampled)
        return;
    char name[PJS_SPAN_NAME_MAX];
    snprintf(name, sizeof name, "call %.80s", c->model->name);
    pjs_span s;
    pjs_span_init_self(&s, &c->trace, PJS_SPAN_INTERNAL, name, c->started_ns,
                       c->done_ns != 0 ? c->done_ns : c->started_ns);
    pjs_span_attr_str(&s, "pjserve.model", c->model->name);
    pjs_span_attr_int(&s, "pjserve.call_parts", (int64_t)c->n_parts);
    if (c->error.code != 0)
        pjs_span_set_error(&s, c->error.msg);
    pjs_tracer_emit(t, &s);
    for (size_t k = 0; k < c->n_submitted; k++)
        pjs_server_trace_execution(run->ctx.server, &c->trace, &c->parts[k]);
}

static void release_calls(pjs_meta_run *run)
{
    while (run->calls != NULL) {
        pjserve_subcall *c = run->calls;
        run->calls = c->next;
        wait_parts(run, c);
        trace_call(run, c);
        for (size_t k = 0; k < c->n_parts; k++) {
            pjs_infer_request_release(&c->parts[k]);
            pjs_model_unref(c->parts[k].model);
        }
        free(c->parts);
        free(c->state);
        pjs_model_unref(c->model);
        free(c);
    }
}

/* A run's statistics: success or fail from arrival to the end, and, for a
 * request whose run started, its wait for the meta gate as the queue time
 * (Triton counts every executed request in queue; perf_analyzer finds the
 * version it measures by the queue count that grew). */
static void record(pjs_infer_request *r)
{
    pjs_model *m = r->model;
    uint64_t now = pjs_now_ns(), took = now > r->times.received ? now - r->times.received : 0;
    uint64_t waited_from = r->times.queued != 0 ? r->times.queued : r->times.received;
    pthread_mutex_lock(&m->stats_lock);
    pjs_duration_stat *d = r->error.code == 0 ? &m->stats.success : &m->stats.fail;
    d->count++;
    d->ns += took;
    if (r->times.exec_start != 0) {
        m->stats.queue.count++;
        m->stats.queue.ns += r->times.exec_start > waited_from ? r->times.exec_start - waited_from
                                                               : 0;
    }
    if (r->error.code == 0) {
        m->stats.inference_count += (uint64_t)(r->batch > 0 ? r->batch : 1);
        m->stats.last_inference_ms = pjs_wall_ms();
    }
    pthread_mutex_unlock(&m->stats_lock);
}

/* Holds every model the meta calls for the run's length, so that its weights,
 * once loaded, stay on the device between the run's stages. */
static void hold_calls(pjs_meta_run *run)
{
    const pjs_manifest *man = &run->ctx.model->bundle->manifest;
    pjs_error err;
    for (size_t k = 0; k < man->n_calls && k < PJS_INFER_MAX_TENSORS; k++) {
        pjs_model *m = NULL;
        if (pjs__server_get_internal_model(run->ctx.server, man->calls[k], &m, &err) == 0)
            atomic_fetch_add(&m->wentry.holds, 1);
        run->held[run->n_held++] = m;
    }
}

static void release_holds(pjs_meta_run *run)
{
    for (size_t k = 0; k < run->n_held; k++) {
        if (run->held[k] != NULL) {
            atomic_fetch_sub(&run->held[k]->wentry.holds, 1);
            pjs_model_unref(run->held[k]);
        }
    }
    run->n_held = 0;
}

static void finish(pjs_meta_run *run)
{
    pjs_infer_request *r = run->ctx.request;
    release_calls(run);
    release_holds(run);
    pjs_hook_ctx_release(&run->ctx);
    pthread_mutex_destroy(&run->lock);
    pthread_cond_destroy(&run->done);
    free(run);
    record(r);
    r->on_done(r);
}

static void run_meta(pjs_meta_job *job)
{
    pjs_meta_run *run = (pjs_meta_run *)((char *)job - offsetof(pjs_meta_run, job));
    pjs_infer_request *r = run->ctx.request;
    const pjs_manifest *man = &r->model->bundle->manifest;
    r->times.exec_start = pjs_now_ns();
    pjserve_tensor in[PJS_INFER_MAX_TENSORS], slots[PJS_INFER_MAX_TENSORS],
        out[PJS_INFER_MAX_TENSORS];
    for (size_t i = 0; i < man->n_client_outputs; i++)
        out[i] = slots[i] = pjs_hook_slot(&man->client_outputs[i], NULL);
    bool ensemble = man->kind == PJS_KIND_ENSEMBLE;
    run->ctx.stage = ensemble ? "ensemble" : "run";
    hold_calls(run);
    int status = !pjs_hook_view_inputs(&run->ctx, in) ? PJSERVE_RESOURCE_EXHAUSTED
                 : ensemble ? pjs_ensemble_run(&run->ctx, in, r->n_inputs, out,
                                               man->n_client_outputs)
                            : r->model->bundle->hooks->run(&run->ctx.base, in, r->n_inputs, out,
                                                           man->n_client_outputs);
    /* Sub-calls the run started and never waited for end before their
     * inputs (the run's memory) go. */
    for (pjserve_subcall *c = run->calls; c != NULL; c = c->next)
        wait_parts(run, c);
    pjs_error err;
    pjs_error_clear(&err);
    /* A decoupled run that sent its final response, or returned no outputs,
     * leaves the request without outputs: the front end closes it. */
    bool nothing_more = man->decoupled && (run->ctx.final_sent ||
                                           pjs_hook_outputs_unset(out, man->n_client_outputs));
    int rc = status != PJSERVE_OK ? pjs_hook_fail(&run->ctx, status, &err)
             : nothing_more
                 ? 0
                 : pjs_hook_check_produced(&run->ctx, slots, out, man->n_client_outputs, &err);
    if (rc == 0 && !nothing_more)
        rc = pjs_hook_take_outputs(r, man->client_outputs, out, man->n_client_outputs, &err);
    if (rc != 0)
        r->error = err;
    r->times.output_done = pjs_now_ns();
    finish(run);
}

static void expire_meta(pjs_meta_job *job, pjs_error *err)
{
    pjs_meta_run *run = (pjs_meta_run *)((char *)job - offsetof(pjs_meta_run, job));
    pjs_infer_request *r = run->ctx.request;
    pjs_error_prefix(err, "model %s: ", r->model->name);
    r->error = *err;
    finish(run);
}

int pjs_meta_submit(pjs_server *s, pjs_infer_request *r, pjs_error *err)
{
    pjs_model *m = r->model;
    const pjs_manifest *man = &m->bundle->manifest;
    int rc = pjs_infer_validate_client(r, man, INT64_MAX, err);
    uint64_t default_timeout_ns = atomic_load(&m->default_timeout_ns);
    if (rc == 0 && r->deadline_ns == 0 && default_timeout_ns > 0)
        r->deadline_ns = r->times.received + default_timeout_ns;
    if (rc != 0)
        return rc;
    pjs_meta_run *run = calloc(1, sizeof *run);
    if (run == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", m->name);
    pjs_hook_ctx_init(&run->ctx, s, r, pjs__server_scratch_pool(s));
    run->ctx.meta = run;
    pthread_mutex_init(&run->lock, NULL);
    pthread_cond_init(&run->done, NULL);
    run->job.run = run_meta;
    run->job.expire = expire_meta;
    run->job.client = r->client;
    r->times.queued = pjs_now_ns();
    rc = pjs_meta_gate_submit(pjs__server_meta_gate(s, man), &run->job, man->n_calls > 0,
                              r->deadline_ns, err);
    if (rc != 0) {
        pjs_hook_ctx_release(&run->ctx);
        pthread_mutex_destroy(&run->lock);
        pthread_cond_destroy(&run->done);
        free(run);
        pjs_error_prefix(err, "model %s: ", m->name);
    }
    return rc;
}
