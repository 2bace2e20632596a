/*
 * control_json.c - the REST model control documents and request bodies (see
 * control_json.h).
 *
 * Bodies are parsed with duplicate keys refused, then every key is checked
 * against the endpoint's list before any value is read, so a misspelt field
 * is an error rather than a silent no-op.
 */
#include "frontend/http/control_json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- documents ------------------------------------------------------------------ */

json_t *pjs_control_model_json(const pjs_control_model *m)
{
    json_t *doc = json_pack("{s:s, s:s, s:s}", "name", m->entry.name, "state",
                            pjs_model_state_name(m->entry.state), "reason", m->entry.reason);
    if (doc == NULL || !m->loaded)
        return doc;
    const pjs_model_residency_info *r = &m->residency;
    json_t *loaded = json_pack(
        "{s:s, s:b, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:I, s:b, s:I, s:I}", "residency",
        pjs_residency_name(r->residency), "resident", r->resident, "weight_bytes",
        (json_int_t)r->weight_bytes, "loads", (json_int_t)r->loads, "evictions",
        (json_int_t)r->evictions, "load_seconds", (double)r->load_ns / 1e9, "weight",
        m->sched.weight, "max_queue_depth", (json_int_t)m->sched.max_queue_depth,
        "default_timeout_us", (json_int_t)m->sched.default_timeout_us, "queue_depth",
        (json_int_t)m->sched.queue_depth, "in_host", r->in_host, "host_loads",
        (json_int_t)r->host_loads, "host_evictions", (json_int_t)r->host_evictions);
    if (loaded == NULL || json_object_update(doc, loaded) != 0) {
        json_decref(doc);
        doc = NULL;
    }
    json_decref(loaded);
    return doc;
}

json_t *pjs_control_status_json(pjs_control_mode mode, const pjs_weight_cache_info *cache,
                                const pjs_control_model *models, size_t n)
{
    bool unlimited = cache->budget_bytes == UINT64_MAX;
    bool host_unlimited = cache->host_budget_bytes == UINT64_MAX;
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < n; i++) {
        json_t *e = pjs_control_model_json(&models[i]);
        if (e == NULL || json_array_append_new(list, e) != 0) {
            json_decref(list);
            list = NULL;
        }
    }
    return json_pack("{s:s, s:{s:I, s:b, s:I, s:I, s:I, s:b, s:I, s:I}, s:o}", "control_mode",
                     pjs_control_mode_name(mode), "cache", "budget_bytes",
                     (json_int_t)(unlimited ? 0 : cache->budget_bytes), "unlimited", unlimited,
                     "used_bytes", (json_int_t)cache->used_bytes, "pinned_bytes",
                     (json_int_t)cache->pinned_bytes, "host_budget_bytes",
                     (json_int_t)(host_unlimited ? 0 : cache->host_budget_bytes),
                     "host_unlimited", host_unlimited, "host_used_bytes",
                     (json_int_t)cache->host_used_bytes, "host_pinned_bytes",
                     (json_int_t)cache->host_pinned_bytes, "models", list);
}

/* ---- request bodies -------------------------------------------------------------- */

/* The body as a JSON object whose keys are all in `keys` (NULL-terminated);
 * `shape` describes the expected body for messages. An empty body reads as
 * {} when empty_ok. */
static int load_object(const char *body, size_t len, const char *const *keys, bool empty_ok,
                       const char *shape, json_t **out, pjs_error *err)
{
    if (len == 0) {
        if (!empty_ok)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "the request needs a JSON body %s",
                                 shape);
        *out = json_object();
        return *out != NULL ? 0 : pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    }
    json_error_t jerr;
    json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (doc == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "malformed JSON body at line %d, column %d: %s", jerr.line,
                             jerr.column, jerr.text);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "the JSON body must be an object %s",
                             shape);
    }
    const char *key;
    json_t *value;
    json_object_foreach(doc, key, value) {
        (void)value;
        bool known = false;
        for (size_t i = 0; !known && keys[i] != NULL; i++)
            known = strcmp(key, keys[i]) == 0;
        if (!known) {
            pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "unknown field \"%.64s\" (expected %s)",
                          key, shape);
            json_decref(doc);
            return PJS_ERR_INVALID_ARGUMENT;
        }
    }
    *out = doc;
    return 0;
}

int pjs_control_parse_residency(const char *body, size_t len, pjs_residency *out,
                                pjs_error *err)
{
    static const char *const keys[] = {"residency", NULL};
    char shape[96];
    snprintf(shape, sizeof shape, "{\"residency\": NAME}, NAME one of %s",
             pjs_residency_choices());
    json_t *doc;
    int rc = load_object(body, len, keys, false, shape, &doc, err);
    if (rc != 0)
        return rc;
    const json_t *v = json_object_get(doc, "residency");
    const char *s = json_string_value(v);
    bool found = s != NULL && pjs_residency_from_name(s, out);
    if (v == NULL)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "no \"residency\" given: %s", shape);
    else if (s == NULL)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "\"residency\" must be a string: %s",
                           pjs_residency_choices());
    else if (!found)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "unknown residency \"%.64s\" (expected %s)", s,
                           pjs_residency_choices());
    json_decref(doc);
    return rc;
}

/* An integer field of the policy body, when present. */
static int policy_integer(const json_t *doc, const char *key, bool *has, int64_t *out,
                          pjs_error *err)
{
    const json_t *v = json_object_get(doc, key);
    *has = v != NULL;
    if (v == NULL)
        return 0;
    if (!json_is_integer(v))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "\"%s\" must be an integer", key);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

int pjs_control_parse_policy(const char *body, size_t len, pjs_control_policy_change *out,
                             pjs_error *err)
{
    static const char *const keys[] = {"weight", "max_queue_depth", "default_timeout_us", NULL};
    const char *shape = "{\"weight\": number, \"max_queue_depth\": integer, "
                        "\"default_timeout_us\": integer}, any of them";
    memset(out, 0, sizeof *out);
    json_t *doc;
    int rc = load_object(body, len, keys, false, shape, &doc, err);
    if (rc != 0)
        return rc;
    const json_t *w = json_object_get(doc, "weight");
    out->has_weight = w != NULL;
    if (w != NULL && !json_is_number(w))
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "\"weight\" must be a number");
    out->weight = json_number_value(w);
    if (rc == 0)
        rc = policy_integer(doc, "max_queue_depth", &out->has_max_queue_depth,
                            &out->max_queue_depth, err);
    if (rc == 0)
        rc = policy_integer(doc, "default_timeout_us", &out->has_default_timeout_us,
                            &out->default_timeout_us, err);
    json_decref(doc);
    return rc;
}

/* One block: n pointers, then the strings they point at. */
static char **copy_names(const json_t *list, size_t n)
{
    size_t bytes = (n + 1) * sizeof(char *);
    for (size_t i = 0; i < n; i++)
        bytes += json_string_length(json_array_get(list, i)) + 1;
    char **names = malloc(bytes);
    if (names == NULL)
        return NULL;
    char *text = (char *)(names + n + 1);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(list, i);
        size_t size = json_string_length(s) + 1;
        memcpy(text, json_string_value(s), size);
        names[i] = text;
        text += size;
    }
    names[n] = NULL;
    return names;
}

int pjs_control_parse_compact(const char *body, size_t len, char ***names, size_t *n,
                              pjs_error *err)
{
    static const char *const keys[] = {"reload", NULL};
    const char *shape = "{\"reload\": [model names]}";
    *names = NULL;
    *n = 0;
    json_t *doc;
    int rc = load_object(body, len, keys, true, shape, &doc, err);
    if (rc != 0)
        return rc;
    const json_t *list = json_object_get(doc, "reload");
    size_t count = json_array_size(list);
    if (list != NULL && !json_is_array(list))
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "\"reload\" must be an array of model names");
    for (size_t i = 0; rc == 0 && i < count; i++) {
        const json_t *s = json_array_get(list, i);
        if (!json_is_string(s) || json_string_length(s) == 0)
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "\"reload\"[%zu] must be a model name (a non-empty string)", i);
    }
    if (rc == 0 && count > 0 && (*names = copy_names(list, count)) == NULL)
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    if (rc == 0)
        *n = count;
    json_decref(doc);
    return rc;
}
