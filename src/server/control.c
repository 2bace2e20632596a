/*
 * control.c - snapshots and checks of the model control surface (see
 * control.h).
 *
 * A snapshot starts from the repository index (every bundle directory and
 * every loaded model, with its state) and adds, for each model that is
 * loaded, its residency and policy as the server reports them now. The
 * pieces are read one after the other, not under one lock: a model that
 * changes meanwhile shows a mix of before and after, as any status does.
 */
#include "server/control.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The first size of the index buffer; grown once if the repository is larger. */
/* Fills out from the index entry e and, when it is loaded, from its model. */
static void describe(pjs_server *s, const pjs_repository_entry *e, pjs_control_model *out)
{
    memset(out, 0, sizeof *out);
    out->entry = *e;
    pjs_model *m;
    pjs_error ignored;
    if (pjs_server_get_model(s, e->name, "", &m, &ignored) != 0)
        return;
    out->loaded = true;
    pjs_server_model_residency(s, m, &out->residency);
    pjs_server_model_sched_info(s, m, &out->sched);
    pjs_model_unref(m);
}

static const pjs_repository_entry *find(const pjs_repository_entry *entries, size_t n,
                                        const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(entries[i].name, name) == 0)
            return &entries[i];
    return NULL;
}

int pjs_control_models(pjs_server *s, const char *const *names, size_t n,
                       pjs_control_model **out, size_t *n_out, pjs_error *err)
{
    pjs_repository_entry *entries = NULL;
    size_t n_entries = 0;
    pjs_control_model *models = NULL;
    int rc = pjs_server_repository_list(s, false, &entries, &n_entries, err);
    size_t count = n > 0 ? n : n_entries;
    if (rc == 0 && (models = calloc(count + 1, sizeof *models)) == NULL)
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the model status");
    for (size_t i = 0; rc == 0 && i < count; i++) {
        const pjs_repository_entry *e = n > 0 ? find(entries, n_entries, names[i]) : &entries[i];
        if (e == NULL)
            rc = pjs_error_set(err, PJS_ERR_NOT_FOUND, "unknown model \"%.256s\"", names[i]);
        else
            describe(s, e, &models[i]);
    }
    free(entries);
    if (rc != 0) {
        free(models);
        return rc;
    }
    *out = models;
    *n_out = count;
    return 0;
}

int pjs_control_model_get(pjs_server *s, const char *name, pjs_control_model *out,
                          pjs_error *err)
{
    pjs_control_model *models;
    size_t n;
    int rc = pjs_control_models(s, &name, 1, &models, &n, err);
    if (rc == 0) {
        *out = models[0];
        free(models);
    }
    return rc;
}

int pjs_control_policy(const char *name, const pjs_control_policy_change *c,
                       pjs_model_policy *out, pjs_error *err)
{
    if (!c->has_weight && !c->has_max_queue_depth && !c->has_default_timeout_us)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %.256s: the policy change sets nothing (give weight, "
                             "max_queue_depth or default_timeout_us)",
                             name);
    if (c->has_weight && !(isfinite(c->weight) && c->weight > 0))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %.256s: weight must be a finite number > 0, got %g", name,
                             c->weight);
    if (c->has_max_queue_depth &&
        (c->max_queue_depth < 1 || c->max_queue_depth > PJS_CONFIG_MAX_QUEUE_DEPTH))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %.256s: max_queue_depth must be in 1..%d, got %lld", name,
                             PJS_CONFIG_MAX_QUEUE_DEPTH, (long long)c->max_queue_depth);
    if (c->has_default_timeout_us &&
        (c->default_timeout_us < 0 || c->default_timeout_us > PJS_CONFIG_MAX_DURATION_US))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %.256s: default_timeout_us must be in 0..%lld (0: none), "
                             "got %lld",
                             name, PJS_CONFIG_MAX_DURATION_US, (long long)c->default_timeout_us);
    *out = (pjs_model_policy){
        .name = NULL,
        .weight = c->has_weight ? c->weight : 0,
        .max_queue_depth = c->has_max_queue_depth ? (size_t)c->max_queue_depth : 0,
        .default_timeout_us = c->has_default_timeout_us ? c->default_timeout_us : -1,
    };
    return 0;
}
