/*
 * ensemble.c - checking and running kind: ensemble models (see ensemble.h).
 *
 * The run keeps one table of ensemble tensors: the client inputs, then each
 * step's outputs as the step completes (pjserve_tensors viewing the
 * sub-call's outputs, alive until the response is sent). Nothing is copied
 * between steps: a step's inputs are the table's tensors under the step
 * model's names. Everything here runs on the thread running the meta; the
 * sub-calls go through meta.c exactly as a C meta's do.
 */
#include "server/ensemble.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry/model.h"
#include "server/meta.h"

/* ---- load-time checks ------------------------------------------------------ */

/* An ensemble tensor as its writer declares it. */
typedef struct written_tensor {
    const char *name;
    pjs_dtype dtype;
    pjs_shape shape; /* -1 where any extent may come */
    char by[200];    /* "client_inputs[0]", "ensemble.steps[1].output_map.sum (model m)" */
} written_tensor;

static int spec_index(const pjs_tensor_spec *v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].name, name) == 0)
            return (int)i;
    return -1;
}

static const written_tensor *find_written(const written_tensor *w, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(w[i].name, name) == 0)
            return &w[i];
    return NULL;
}

/* Same dtype and rank, and equal extents wherever both are fixed. */
static bool agree(const written_tensor *w, pjs_dtype dtype, const pjs_shape *shape)
{
    if (w->dtype != dtype || w->shape.rank != shape->rank)
        return false;
    for (int d = 0; d < shape->rank; d++)
        if (w->shape.dims[d] >= 0 && shape->dims[d] >= 0 && w->shape.dims[d] != shape->dims[d])
            return false;
    return true;
}

/* "model mlp's input \"x\" is f32 [-1, 16]" style mismatch. */
static int disagree(const char *where, const written_tensor *w, const char *reader,
                    pjs_dtype dtype, const pjs_shape *shape, pjs_error *err)
{
    char a[160], b[160];
    pjs_shape_format(&w->shape, a, sizeof a);
    pjs_shape_format(shape, b, sizeof b);
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "manifest.yaml: %s: ensemble tensor \"%s\" is %s %s (written by %s) "
                         "but %s is %s %s (-1: any extent)",
                         where, w->name, pjs_dtype_name(w->dtype), a, w->by, reader,
                         pjs_dtype_name(dtype), b);
}

static void list_names(const pjs_tensor_spec *v, size_t n, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "", v[i].name);
        used += w > 0 ? (size_t)w : 0;
    }
}

/* Step s's input_map against its model mm, reading from the tensors
 * written so far. */
static int check_step_inputs(const pjs_manifest *ens, size_t s, const pjs_manifest *mm,
                             const written_tensor *w, size_t n_w, pjs_error *err)
{
    const pjs_ensemble_step *st = &ens->steps[s];
    char where[256], names[512], reader[300];
    for (size_t e = 0; e < st->n_inputs; e++) {
        const pjs_ensemble_map *map = &st->inputs[e];
        snprintf(where, sizeof where, "ensemble.steps[%zu].input_map.%s", s, map->model_tensor);
        int i = spec_index(mm->inputs, mm->n_inputs, map->model_tensor);
        if (i < 0) {
            list_names(mm->inputs, mm->n_inputs, names, sizeof names);
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "manifest.yaml: %s: model %s has no input \"%s\" (its inputs: "
                                 "%s)",
                                 where, st->model, map->model_tensor, names);
        }
        const written_tensor *from = find_written(w, n_w, map->ensemble_tensor);
        pjs_shape shape = pjs_manifest_client_shape(mm, false, (size_t)i);
        snprintf(reader, sizeof reader, "model %s's input \"%s\"", st->model, map->model_tensor);
        if (from != NULL && !agree(from, mm->inputs[i].dtype, &shape))
            return disagree(where, from, reader, mm->inputs[i].dtype, &shape, err);
    }
    for (size_t i = 0; i < mm->n_inputs; i++) {
        bool mapped = false;
        for (size_t e = 0; !mapped && e < st->n_inputs; e++)
            mapped = strcmp(st->inputs[e].model_tensor, mm->inputs[i].name) == 0;
        if (!mapped)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "manifest.yaml: ensemble.steps[%zu].input_map: model %s's input "
                                 "\"%s\" is not mapped (a step gives its model every input)",
                                 s, st->model, mm->inputs[i].name);
    }
    return 0;
}

/* Step s's output_map against its model, appending what it writes. */
static int add_step_outputs(const pjs_manifest *ens, size_t s, const pjs_manifest *mm,
                            written_tensor *w, size_t *n_w, pjs_error *err)
{
    const pjs_ensemble_step *st = &ens->steps[s];
    char names[512];
    for (size_t e = 0; e < st->n_outputs; e++) {
        const pjs_ensemble_map *map = &st->outputs[e];
        int i = spec_index(mm->outputs, mm->n_outputs, map->model_tensor);
        if (i < 0) {
            list_names(mm->outputs, mm->n_outputs, names, sizeof names);
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "manifest.yaml: ensemble.steps[%zu].output_map.%s: model %s has "
                                 "no output \"%s\" (its outputs: %s)",
                                 s, map->model_tensor, st->model, map->model_tensor, names);
        }
        written_tensor *t = &w[(*n_w)++];
        t->name = map->ensemble_tensor;
        t->dtype = mm->outputs[i].dtype;
        t->shape = pjs_manifest_client_shape(mm, true, (size_t)i);
        snprintf(t->by, sizeof t->by, "ensemble.steps[%zu].output_map.%s (model %s)", s,
                 map->model_tensor, st->model);
    }
    return 0;
}

int pjs_ensemble_check(const pjs_manifest *ens, const pjs_manifest *const *step_models,
                       pjs_error *err)
{
    size_t cap = ens->n_client_inputs;
    for (size_t s = 0; s < ens->n_steps; s++)
        cap += ens->steps[s].n_outputs;
    written_tensor *w = calloc(cap, sizeof *w);
    if (w == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory checking the ensemble's steps");
    size_t n_w = 0;
    for (size_t i = 0; i < ens->n_client_inputs; i++, n_w++) {
        w[n_w].name = ens->client_inputs[i].name;
        w[n_w].dtype = ens->client_inputs[i].dtype;
        w[n_w].shape = ens->client_inputs[i].shape;
        snprintf(w[n_w].by, sizeof w[n_w].by, "client_inputs[%zu]", i);
    }
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < ens->n_steps; k++) {
        size_t s = ens->step_order[k];
        const pjs_ensemble_step *st = &ens->steps[s];
        if (st->version != -1 && st->version != 1)
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "manifest.yaml: ensemble.steps[%zu].version: model %s has no "
                               "version %lld (pjserve serves version " PJS_MODEL_VERSION
                               " of each model; leave version out or give -1)",
                               s, st->model, (long long)st->version);
        if (rc == 0)
            rc = check_step_inputs(ens, s, step_models[s], w, n_w, err);
        if (rc == 0)
            rc = add_step_outputs(ens, s, step_models[s], w, &n_w, err);
    }
    for (size_t i = 0; rc == 0 && i < ens->n_client_outputs; i++) {
        const pjs_tensor_spec *c = &ens->client_outputs[i];
        const written_tensor *from = find_written(w, n_w, c->name);
        char where[64], reader[300];
        snprintf(where, sizeof where, "client_outputs[%zu]", i);
        snprintf(reader, sizeof reader, "client output \"%s\"", c->name);
        if (from != NULL && !agree(from, c->dtype, &c->shape))
            rc = disagree(where, from, reader, c->dtype, &c->shape, err);
    }
    free(w);
    return rc;
}

/* ---- the run --------------------------------------------------------------- */

/* An ensemble tensor of this run. */
typedef struct ens_value {
    const char *name;
    pjserve_tensor t;
} ens_value;

typedef struct ens_run {
    pjs_hook_ctx *ctx;
    const pjs_manifest *m;
    ens_value *values;
    size_t n_values;
} ens_run;

static const ens_value *lookup(const ens_run *run, const char *name)
{
    for (size_t i = 0; i < run->n_values; i++)
        if (strcmp(run->values[i].name, name) == 0)
            return &run->values[i];
    return NULL;
}

static bool step_ready(const ens_run *run, size_t s)
{
    const pjs_ensemble_step *st = &run->m->steps[s];
    for (size_t e = 0; e < st->n_inputs; e++)
        if (lookup(run, st->inputs[e].ensemble_tensor) == NULL)
            return false;
    return true;
}

/* Puts "ensemble.steps[s] (model M): " before the message a call set. */
static int step_failed(const ens_run *run, size_t s, int status)
{
    char was[sizeof run->ctx->message];
    snprintf(was, sizeof was, "%s", run->ctx->message);
    snprintf(run->ctx->message, sizeof run->ctx->message, "ensemble.steps[%zu] (model %.128s): %.850s",
             s, run->m->steps[s].model, was[0] ? was : "failed");
    return status;
}

static int start_step(ens_run *run, size_t s, pjserve_subcall **call)
{
    const pjs_ensemble_step *st = &run->m->steps[s];
    pjserve_tensor *in = pjs_hook_ctx_alloc(run->ctx, st->n_inputs * sizeof *in);
    if (in == NULL) {
        snprintf(run->ctx->message, sizeof run->ctx->message, "out of memory");
        return step_failed(run, s, PJSERVE_RESOURCE_EXHAUSTED);
    }
    for (size_t e = 0; e < st->n_inputs; e++) {
        in[e] = lookup(run, st->inputs[e].ensemble_tensor)->t;
        in[e].name = st->inputs[e].model_tensor;
    }
    int status = pjs_meta_call_start(run->ctx, st->model, in, st->n_inputs, call);
    return status != PJSERVE_OK ? step_failed(run, s, status) : PJSERVE_OK;
}

static int finish_step(ens_run *run, size_t s, pjserve_subcall *call)
{
    const pjs_ensemble_step *st = &run->m->steps[s];
    const pjserve_tensor *out = NULL;
    size_t n_out = 0;
    int status = pjs_meta_call_wait(run->ctx, call, &out, &n_out);
    if (status != PJSERVE_OK)
        return step_failed(run, s, status);
    for (size_t e = 0; e < st->n_outputs; e++) {
        size_t j = 0;
        while (j < n_out && strcmp(out[j].name, st->outputs[e].model_tensor) != 0)
            j++;
        if (j == n_out) {
            /* The model was reloaded without it since the ensemble loaded. */
            snprintf(run->ctx->message, sizeof run->ctx->message,
                     "model %s returned no output \"%s\" (reload the ensemble to check its "
                     "steps against the model as it is now)",
                     st->model, st->outputs[e].model_tensor);
            return step_failed(run, s, PJSERVE_UNAVAILABLE);
        }
        ens_value *v = &run->values[run->n_values++];
        v->name = st->outputs[e].ensemble_tensor;
        v->t = out[j];
        v->t.name = v->name;
    }
    return PJSERVE_OK;
}

/* Every step, wave after wave: those whose inputs are written are started
 * together (in step order), then waited for. */
static int run_steps(ens_run *run, pjserve_subcall **calls)
{
    const pjs_manifest *m = run->m;
    for (size_t k = 0; k < m->n_steps;) {
        size_t first = k;
        for (; k < m->n_steps && step_ready(run, m->step_order[k]); k++) {
            int status = start_step(run, m->step_order[k], &calls[k]);
            if (status != PJSERVE_OK)
                return status;
        }
        if (k == first) { /* the parse ordered the steps: never */
            snprintf(run->ctx->message, sizeof run->ctx->message,
                     "ensemble.steps[%zu]: an input is never written", m->step_order[k]);
            return PJSERVE_INTERNAL;
        }
        for (size_t j = first; j < k; j++) {
            int status = finish_step(run, m->step_order[j], calls[j]);
            if (status != PJSERVE_OK)
                return status;
        }
    }
    return PJSERVE_OK;
}

int pjs_ensemble_run(pjs_hook_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                     pjserve_tensor *out, size_t n_out)
{
    const pjs_manifest *m = &ctx->model->bundle->manifest;
    size_t cap = n_in;
    for (size_t s = 0; s < m->n_steps; s++)
        cap += m->steps[s].n_outputs;
    ens_run run = {ctx, m, pjs_hook_ctx_alloc(ctx, cap * sizeof *run.values), 0};
    pjserve_subcall **calls = pjs_hook_ctx_alloc(ctx, m->n_steps * sizeof *calls);
    if (run.values == NULL || calls == NULL) {
        snprintf(ctx->message, sizeof ctx->message, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    for (size_t i = 0; i < n_in; i++)
        run.values[run.n_values++] = (ens_value){in[i].name, in[i]};
    int status = run_steps(&run, calls);
    for (size_t i = 0; status == PJSERVE_OK && i < n_out; i++) {
        const ens_value *v = lookup(&run, out[i].name);
        if (v == NULL) { /* the parse checked every client output is written: never */
            snprintf(ctx->message, sizeof ctx->message, "client output \"%s\" was not written",
                     out[i].name);
            return PJSERVE_INTERNAL;
        }
        out[i].rank = v->t.rank;
        memcpy(out[i].shape, v->t.shape, sizeof out[i].shape);
        out[i].data = v->t.data;
        out[i].nbytes = v->t.nbytes;
    }
    return status;
}
