/*
 * hooked.c - requests to a model whose bundle has pre/post hooks.
 *
 * The front end's request arrives with the client's tensors. On the calling
 * (request) thread: the client inputs are checked against client_inputs,
 * pjserve_preprocess turns them into the executable's inputs (checked like
 * any request's), and the request is queued as usual. When the execution is
 * done the dispatcher calls our completion, after giving the device back, on
 * the submitting thread or one of its workers: pjserve_postprocess turns the
 * raw output rows into the client outputs, which are copied into buffers the
 * request owns, and the front end's completion runs with the request looking
 * as it was sent (its inputs and requested outputs restored) plus the
 * client outputs. The hook's arena lives from preprocess to that moment.
 *
 * While queued, the request's on_done and frontend_ctx are ours; the front
 * end's are kept in the hooked_request and put back before it is called.
 */
#include "server/hooked.h"

#include <stdlib.h>
#include <string.h>

#include "core/classify.h"
#include "registry/model.h"
#include "server/hook_ctx.h"
#include "server/server_internal.h"

typedef struct hooked_request {
    pjs_hook_ctx ctx;
    /* What the front end gave, restored before its completion runs. */
    pjs_infer_done_fn client_done;
    void *client_ctx;
    bool swapped_inputs;
    size_t n_client_inputs;
    pjs_infer_input client_inputs[PJS_INFER_MAX_TENSORS];
    size_t n_requested;
    pjs_infer_requested_output requested[PJS_INFER_MAX_TENSORS];
} hooked_request;

/* The requested output names must be client outputs, each named once, and
 * numeric when the client asks to classify them. */
static int check_requested(const pjs_model *m, const pjs_infer_request *r, pjs_error *err)
{
    size_t n = 0;
    const pjs_tensor_spec *outs = pjs_manifest_client_tensors(&m->bundle->manifest, true, &n);
    for (size_t k = 0; k < r->n_requested; k++) {
        size_t i = 0;
        while (i < n && strcmp(outs[i].name, r->requested[k].name) != 0)
            i++;
        if (i == n)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "model %s: unknown output \"%s\" requested", m->name,
                                 r->requested[k].name);
        if (r->requested[k].class_count > 0 && pjs_classify_check(&outs[i], m->name, err) != 0)
            return err->code;
        for (size_t j = 0; j < k; j++)
            if (strcmp(r->requested[j].name, r->requested[k].name) == 0)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "model %s: output \"%s\" requested twice", m->name,
                                     r->requested[k].name);
    }
    return 0;
}

/* The executable's input i as a slot: batch axis and extents that differ
 * between variants -1. */
static pjserve_tensor executable_input_slot(const pjs_manifest *man, size_t i)
{
    pjs_shape s = man->inputs[i].shape;
    for (size_t v = 1; v < man->n_variants; v++)
        for (int d = 0; d < s.rank; d++)
            if (man->variants[v].inputs[i].shape.dims[d] != s.dims[d])
                s.dims[d] = -1;
    return pjs_hook_slot(&man->inputs[i], &s);
}

/* A traced request's span of one hook, from `from` until now. */
static void trace_hook(const hooked_request *h, const char *stage, uint64_t from, int status)
{
    const pjs_infer_request *r = h->ctx.request;
    pjs_tracer *t = pjs_server_tracer(h->ctx.server);
    if (t == NULL || !r->trace.sampled)
        return;
    pjs_span s;
    pjs_span_init(&s, &r->trace, PJS_SPAN_INTERNAL, stage, from, pjs_now_ns());
    if (status != PJSERVE_OK)
        pjs_span_set_error(&s, h->ctx.message[0] != '\0' ? h->ctx.message : "the hook failed");
    pjs_tracer_emit(t, &s);
}

static int run_preprocess(hooked_request *h, pjs_error *err)
{
    pjs_infer_request *r = h->ctx.request;
    const pjs_manifest *man = &r->model->bundle->manifest;
    pjserve_tensor in[PJS_INFER_MAX_TENSORS], slots[PJS_INFER_MAX_TENSORS],
        out[PJS_INFER_MAX_TENSORS];
    h->ctx.stage = "preprocess";
    if (!pjs_hook_view_inputs(&h->ctx, in))
        return pjs_hook_fail(&h->ctx, PJSERVE_RESOURCE_EXHAUSTED, err);
    for (size_t i = 0; i < man->n_inputs; i++)
        out[i] = slots[i] = executable_input_slot(man, i);
    uint64_t from = r->trace.sampled ? pjs_now_ns() : 0;
    int status = r->model->bundle->hooks->preprocess(&h->ctx.base, in, r->n_inputs, out,
                                                      man->n_inputs);
    trace_hook(h, "preprocess", from, status);
    if (status != PJSERVE_OK)
        return pjs_hook_fail(&h->ctx, status, err);
    int rc = pjs_hook_check_produced(&h->ctx, slots, out, man->n_inputs, err);
    if (rc != 0)
        return rc;
    h->n_client_inputs = r->n_inputs;
    memcpy(h->client_inputs, r->inputs, r->n_inputs * sizeof r->inputs[0]);
    h->swapped_inputs = true;
    for (size_t i = 0; i < man->n_inputs; i++) {
        pjs_infer_input *x = &r->inputs[i];
        memset(x, 0, sizeof *x);
        x->name = man->inputs[i].name;
        x->datatype = pjs_dtype_kserve_name(man->inputs[i].dtype);
        x->shape.rank = out[i].rank;
        memcpy(x->shape.dims, out[i].shape, sizeof x->shape.dims);
        x->data = out[i].data;
        x->nbytes = out[i].nbytes;
    }
    r->n_inputs = man->n_inputs;
    return 0;
}

/* Puts back what the front end handed us, on every path. */
static void restore(hooked_request *h)
{
    pjs_infer_request *r = h->ctx.request;
    r->on_done = h->client_done;
    r->frontend_ctx = h->client_ctx;
    if (h->swapped_inputs) {
        memcpy(r->inputs, h->client_inputs, h->n_client_inputs * sizeof r->inputs[0]);
        r->n_inputs = h->n_client_inputs;
    }
    memcpy(r->requested, h->requested, h->n_requested * sizeof r->requested[0]);
    r->n_requested = h->n_requested;
}

static void finish(hooked_request *h)
{
    pjs_infer_request *r = h->ctx.request;
    restore(h);
    pjs_hook_ctx_release(&h->ctx);
    free(h);
    r->on_done(r);
}

static int run_postprocess(hooked_request *h, pjs_error *err)
{
    pjs_infer_request *r = h->ctx.request;
    const pjs_manifest *man = &r->model->bundle->manifest;
    pjserve_tensor in[PJS_INFER_MAX_TENSORS], slots[PJS_INFER_MAX_TENSORS],
        out[PJS_INFER_MAX_TENSORS];
    for (size_t i = 0; i < r->n_outputs; i++)
        in[i] = pjs_hook_tensor_from(r->outputs[i].spec->name, r->outputs[i].spec->dtype,
                                     &r->outputs[i].shape, r->outputs[i].data,
                                     r->outputs[i].nbytes);
    for (size_t i = 0; i < man->n_client_outputs; i++)
        out[i] = slots[i] = pjs_hook_slot(&man->client_outputs[i], NULL);
    h->ctx.stage = "postprocess";
    uint64_t from = r->trace.sampled ? pjs_now_ns() : 0;
    int status = r->model->bundle->hooks->postprocess(&h->ctx.base, in, r->n_outputs, out,
                                                       man->n_client_outputs);
    trace_hook(h, "postprocess", from, status);
    if (status != PJSERVE_OK)
        return pjs_hook_fail(&h->ctx, status, err);
    int rc = pjs_hook_check_produced(&h->ctx, slots, out, man->n_client_outputs, err);
    if (rc != 0)
        return rc;
    /* Restore the client's requested list first: it picks what is copied. */
    memcpy(r->requested, h->requested, h->n_requested * sizeof r->requested[0]);
    r->n_requested = h->n_requested;
    return pjs_hook_take_outputs(r, man->client_outputs, out, man->n_client_outputs, err);
}

/* The executable's outputs are the client's (no postprocess): keep the
 * requested ones. */
static void filter_outputs(hooked_request *h)
{
    pjs_infer_request *r = h->ctx.request;
    memcpy(r->requested, h->requested, h->n_requested * sizeof r->requested[0]);
    r->n_requested = h->n_requested;
    for (size_t i = 0; i < r->n_outputs; i++) {
        bool wanted;
        r->outputs[i].requested = pjs_hook_requested_index(r, r->outputs[i].spec->name, &wanted);
        if (!wanted) {
            free(r->outputs[i].data);
            r->outputs[i].data = NULL;
        }
    }
}

static void hooked_done(pjs_infer_request *r)
{
    hooked_request *h = r->frontend_ctx;
    if (r->error.code == 0) {
        pjs_error err;
        pjs_error_clear(&err);
        if (r->model->bundle->hooks->postprocess == NULL)
            filter_outputs(h);
        else if (run_postprocess(h, &err) != 0) {
            pjs_infer_request_release(r);
            r->error = err;
        }
        if (r->model->bundle->hooks->postprocess != NULL && r->trace.sampled)
            r->times.hooks_done = pjs_now_ns();
    }
    finish(h);
}

int pjs_hooked_submit(struct pjs_server *s, pjs_infer_request *r, pjs_error *err)
{
    pjs_model *m = r->model;
    const pjs_hooks *hooks = m->bundle->hooks;
    int rc = check_requested(m, r, err);
    if (rc != 0)
        return rc;
    hooked_request *h = calloc(1, sizeof *h);
    if (h == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", m->name);
    pjs_hook_ctx_init(&h->ctx, s, r, pjs__server_scratch_pool(s));
    h->client_done = r->on_done;
    h->client_ctx = r->frontend_ctx;
    h->n_requested = r->n_requested;
    memcpy(h->requested, r->requested, r->n_requested * sizeof r->requested[0]);
    r->n_requested = 0; /* the executable produces every output; the client's pick comes last */
    if (hooks->preprocess != NULL) {
        /* Batched client inputs are rows of the executable's batch: they
         * fit its largest compiled size, as its configuration says. */
        rc = pjs_infer_validate_client(r, &m->bundle->manifest,
                                       m->max_batch_size > 0 ? m->max_batch_size : INT64_MAX, err);
        if (rc == 0)
            rc = run_preprocess(h, err);
    }
    if (rc == 0) {
        r->on_done = hooked_done;
        r->frontend_ctx = h;
        rc = pjs__server_submit_executable(s, r, false, err);
        if (rc == 0)
            return 0; /* h belongs to hooked_done now, which may have run already */
        /* The executable refusing what preprocess produced is the hook's
         * fault; a deadline or a full queue is not. */
        if (h->swapped_inputs && err->code == PJS_ERR_INVALID_ARGUMENT) {
            err->code = PJS_ERR_INTERNAL;
            pjs_error_prefix(err, "model %s: preprocess produced inputs the executable does "
                                  "not take: ",
                             m->name);
        }
    }
    restore(h);
    pjs_hook_ctx_release(&h->ctx);
    free(h);
    return rc;
}
