/*
 * control_codec.c - pjserve.control.v1 messages from and to the control
 * surface's structures (see control_codec.h).
 *
 * pjs_residency (host 0, device 1, unpinned 2) and the wire enum (0
 * unspecified, device 1, host 2, unpinned 3) differ, so they are mapped
 * by name here, in one table.
 */
#include "frontend/grpc/control_codec.h"

#include <stdint.h>
#include <string.h>

#include <jansson.h>

/* The table's wire values (core/residency.c) are the service's enum. */
_Static_assert(PJSERVE__CONTROL__V1__RESIDENCY__DEVICE == 1 &&
                   PJSERVE__CONTROL__V1__RESIDENCY__HOST == 2 &&
                   PJSERVE__CONTROL__V1__RESIDENCY__UNPINNED == 3,
               "pjserve.control.v1.Residency differs from core/residency.c's wire values");

static Pjserve__Control__V1__Residency wire_residency(pjs_residency r)
{
    return (Pjserve__Control__V1__Residency)pjs_residency_wire(r);
}

static int no_memory(pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the model control response");
}

int pjs_grpc_control_model_status(const pjs_control_model *m, pjs_grpc_arena *a,
                                  pjs_grpc_model_status **out, pjs_error *err)
{
    pjs_grpc_model_status *s = pjs_grpc_arena_alloc(a, sizeof *s);
    if (s == NULL)
        return no_memory(err);
    pjserve__control__v1__model_status__init(s);
    s->name = pjs_grpc_arena_strdup(a, m->entry.name);
    s->state = pjs_grpc_arena_strdup(a, pjs_model_state_name(m->entry.state));
    s->reason = pjs_grpc_arena_strdup(a, m->entry.reason);
    if (s->name == NULL || s->state == NULL || s->reason == NULL)
        return no_memory(err);
    if (m->loaded) {
        const pjs_model_residency_info *r = &m->residency;
        s->residency = wire_residency(r->residency);
        s->resident = r->resident;
        s->weight_bytes = r->weight_bytes;
        s->loads = r->loads;
        s->evictions = r->evictions;
        s->load_seconds = (double)r->load_ns / 1e9;
        s->weight = m->sched.weight;
        s->max_queue_depth = m->sched.max_queue_depth;
        s->default_timeout_us = m->sched.default_timeout_us;
        s->queue_depth = m->sched.queue_depth;
        s->in_host = r->in_host;
        s->host_loads = r->host_loads;
        s->host_evictions = r->host_evictions;
    }
    *out = s;
    return 0;
}

int pjs_grpc_control_status(pjs_control_mode mode, const pjs_weight_cache_info *cache,
                            const pjs_control_model *models, size_t n, pjs_grpc_arena *a,
                            pjs_grpc_control_status_response **out, pjs_error *err)
{
    pjs_grpc_control_status_response *r = pjs_grpc_arena_alloc(a, sizeof *r);
    Pjserve__Control__V1__WeightCache *c = pjs_grpc_arena_alloc(a, sizeof *c);
    pjs_grpc_model_status **list = pjs_grpc_arena_calloc(a, n + 1, sizeof *list);
    if (r == NULL || c == NULL || list == NULL)
        return no_memory(err);
    pjserve__control__v1__model_control_status_response__init(r);
    pjserve__control__v1__weight_cache__init(c);
    c->unlimited = cache->budget_bytes == UINT64_MAX;
    c->budget_bytes = c->unlimited ? 0 : cache->budget_bytes;
    c->used_bytes = cache->used_bytes;
    c->pinned_bytes = cache->pinned_bytes;
    c->host_unlimited = cache->host_budget_bytes == UINT64_MAX;
    c->host_budget_bytes = c->host_unlimited ? 0 : cache->host_budget_bytes;
    c->host_used_bytes = cache->host_used_bytes;
    c->host_pinned_bytes = cache->host_pinned_bytes;
    for (size_t i = 0; i < n; i++) {
        int rc = pjs_grpc_control_model_status(&models[i], a, &list[i], err);
        if (rc != 0)
            return rc;
    }
    r->control_mode = (char *)pjs_control_mode_name(mode);
    r->cache = c;
    r->models = list;
    r->n_models = n;
    *out = r;
    return 0;
}

int pjs_grpc_control_residency(int value, const char *name, pjs_residency *out, pjs_error *err)
{
    if (pjs_residency_from_wire(value, out))
        return 0;
    if (value == PJSERVE__CONTROL__V1__RESIDENCY__RESIDENCY_UNSPECIFIED)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %.256s: no residency given (DEVICE, HOST or UNPINNED)", name);
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "model %.256s: unknown residency %d (expected DEVICE, HOST or UNPINNED)",
                         name, value);
}

static int64_t as_int64(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
}

#define POLICY_CASE(field, member)                                                                 \
    PJSERVE__CONTROL__V1__SET_MODEL_POLICY_REQUEST__##field##_PRESENT_##member

void pjs_grpc_control_policy_change(const Pjserve__Control__V1__SetModelPolicyRequest *r,
                                    pjs_control_policy_change *out)
{
    memset(out, 0, sizeof *out);
    out->has_weight = r->weight_present_case == POLICY_CASE(WEIGHT, WEIGHT);
    out->weight = out->has_weight ? r->weight : 0;
    out->has_max_queue_depth =
        r->max_queue_depth_present_case == POLICY_CASE(MAX_QUEUE_DEPTH, MAX_QUEUE_DEPTH);
    out->max_queue_depth = out->has_max_queue_depth ? as_int64(r->max_queue_depth) : 0;
    out->has_default_timeout_us =
        r->default_timeout_us_present_case == POLICY_CASE(DEFAULT_TIMEOUT_US, DEFAULT_TIMEOUT_US);
    out->default_timeout_us = out->has_default_timeout_us ? as_int64(r->default_timeout_us) : 0;
}

/* ---- node status -------------------------------------------------------------------- */

/* A string member, "" when absent or null; NULL (no memory, or not a
 * string) sets *bad. */
static char *member_string(json_t *o, const char *key, pjs_grpc_arena *a, const char **bad)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return pjs_grpc_arena_strdup(a, "");
    if (!json_is_string(v)) {
        *bad = key;
        return NULL;
    }
    char *s = pjs_grpc_arena_strdup(a, json_string_value(v));
    if (s == NULL)
        *bad = key;
    return s;
}

static int64_t member_int(json_t *o, const char *key, const char **bad)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        *bad = key;
        return 0;
    }
    return json_integer_value(v);
}

static Pjserve__Control__V1__NodeWorker *node_worker(json_t *w, pjs_grpc_arena *a,
                                                      const char **bad)
{
    Pjserve__Control__V1__NodeWorker *nw = pjs_grpc_arena_alloc(a, sizeof *nw);
    if (nw == NULL || !json_is_object(w)) {
        *bad = "workers[]";
        return NULL;
    }
    pjserve__control__v1__node_worker__init(nw);
    nw->id = (uint32_t)member_int(w, "id", bad);
    nw->pid = member_int(w, "pid", bad);
    nw->restarts = (uint32_t)member_int(w, "restarts", bad);
    nw->device = member_string(w, "device", a, bad);
    nw->state = member_string(w, "state", a, bad);
    nw->grpc = member_string(w, "grpc", a, bad);
    nw->http = member_string(w, "http", a, bad);
    nw->last_exit = member_string(w, "last_exit", a, bad);
    json_t *models = json_object_get(w, "models");
    size_t n = json_is_array(models) ? json_array_size(models) : 0;
    nw->models = pjs_grpc_arena_alloc(a, (n ? n : 1) * sizeof *nw->models);
    if (nw->models == NULL)
        *bad = "models";
    for (size_t i = 0; nw->models != NULL && i < n; i++) {
        json_t *m = json_array_get(models, i);
        if (!json_is_string(m) ||
            (nw->models[i] = pjs_grpc_arena_strdup(a, json_string_value(m))) == NULL) {
            *bad = "models";
            break;
        }
        nw->n_models = i + 1;
    }
    return *bad == NULL ? nw : NULL;
}

int pjs_grpc_node_status(const char *json, size_t len, pjs_grpc_arena *a,
                         pjs_grpc_node_status_response **out, pjs_error *err)
{
    json_error_t jerr;
    json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (doc == NULL || !json_is_object(doc)) {
        json_decref(doc);
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "the node's status document is not a JSON object (%s)",
                             doc == NULL ? jerr.text : "another value");
    }
    const char *bad = NULL;
    pjs_grpc_node_status_response *r = pjs_grpc_arena_alloc(a, sizeof *r);
    json_t *workers = json_object_get(doc, "workers");
    size_t n = json_is_array(workers) ? json_array_size(workers) : 0;
    if (r == NULL) {
        bad = "routing";
    } else {
        pjserve__control__v1__node_status_response__init(r);
        r->routing = member_string(doc, "routing", a, &bad);
        r->workers = pjs_grpc_arena_alloc(a, (n ? n : 1) * sizeof *r->workers);
        if (!json_is_array(workers) || r->workers == NULL)
            bad = "workers";
    }
    for (size_t i = 0; bad == NULL && i < n; i++) {
        r->workers[i] = node_worker(json_array_get(workers, i), a, &bad);
        r->n_workers = i + 1;
    }
    json_decref(doc);
    if (bad != NULL)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "the node's status document has no valid \"%s\"", bad);
    *out = r;
    return 0;
}

int pjs_grpc_trace_settings_update(pjs_tracer *t, const Inference__TraceSettingRequest *req,
                                   pjs_error *err)
{
    pjs_trace_setting_in in[16];
    if (req->n_settings > sizeof in / sizeof in[0])
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "%zu trace settings, at most %zu",
                             req->n_settings, sizeof in / sizeof in[0]);
    for (size_t i = 0; i < req->n_settings; i++) {
        const Inference__TraceSettingRequest__SettingValue *v = req->settings[i]->value;
        in[i] = (pjs_trace_setting_in){.key = req->settings[i]->key,
                                       .values = v != NULL ? (const char *const *)v->value : NULL,
                                       .n_values = v != NULL ? v->n_value : 0};
    }
    return pjs_trace_settings_update(t, req->model_name, in, req->n_settings, err);
}
