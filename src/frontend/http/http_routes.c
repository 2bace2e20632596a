/*
 * http_routes.c - serve's route sets: the REST endpoints other than
 * inference (http_infer.c), and /metrics, answered from a pjs_server.
 *
 * The path is split into segments (empty ones ignored, so a trailing slash
 * is accepted) and matched against Triton's routes; each handler stores a
 * reply. A known path with the wrong method gets 405, an unknown path 404,
 * both with an {"error"} body. HEAD is answered like GET (without the body).
 * All handlers run on connection threads except two kinds: model loads,
 * which compile, are queued on the server's load thread, which answers
 * them; the residency and compact requests of the model control endpoints,
 * which wait for the device owner to move weights, run on the front
 * end's job threads (pjs__http_defer). Both leave the connection suspended
 * meanwhile.
 *
 * Before any of that, once a request's headers are in, the access rules
 * (frontend/access.h) decide whether its caller may make it at all.
 */
#include "frontend/http/http_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"
#include "frontend/http/control_json.h"
#include "frontend/http/metrics_render.h"
#include "frontend/http/model_json.h"
#include "frontend/http/shm_json.h"
#include "server/control.h"
#include "server/load_config.h"
#include "server/server.h"

/* Size of the metrics text buffer. */
#define METRICS_MAX_BYTES ((size_t)64 << 20)
/* Reads of the model set until no load or eviction happened during one. */
#define METRICS_CONSISTENT_TRIES 4

/* Largest node status document read for GET /v2/pjserve/node. */
#define NODE_STATUS_MAX_BYTES ((size_t)1 << 20)

static bool is(const char *a, const char *b)
{
    return strcmp(a, b) == 0;
}

static pjs_server *server_of(const pjs__http_call *c)
{
    return c->fe->routes_ctx;
}

/* ---- health and server metadata ---------------------------------------- */

/* {"live": true} or {"ready": true} (false with 400), as the KServe V2
 * REST health endpoints answer; the kserve SDK reads the body. */
static void health(pjs__http_call *c, const char *kind)
{
    pjs_server *s = server_of(c);
    bool ok = is(kind, "live") ? pjs_server_live(s) : pjs_server_ready(s);
    pjs__http_reply_json(c, ok ? 200 : 400, json_pack("{s:b}", kind, ok));
}

static void server_metadata(pjs__http_call *c)
{
    json_t *doc = json_pack("{s:s, s:s, s:[s,s,s,s,s,s,s,s,s]}", "name",
                            pjs_server_name(server_of(c)), "version",
                            pjs_server_version(), "extensions", "classification",
                            "binary_tensor_data",
                            "model_repository", "model_configuration", "system_shared_memory",
                            "cuda_shared_memory", "statistics", "trace", "logging");
    pjs__http_reply_json(c, 200, doc);
}

/* ---- logging ------------------------------------------------------------- */

/* Triton's log settings as pjserve's one threshold shows them. */
static json_t *log_settings_json(void)
{
    pjs_log_level level = pjs_log_get_level();
    return json_pack("{s:s, s:b, s:b, s:b, s:i, s:s}", "log_file", "", "log_info",
                     level <= PJS_LOG_INFO, "log_warning", level <= PJS_LOG_WARN, "log_error", 1,
                     "log_verbose_level", level == PJS_LOG_DEBUG ? 1 : 0, "log_format",
                     "default");
}

/* Applies Triton's settings as a threshold: verbose > 0 is debug, else the
 * lowest level still on. */
static int apply_log_settings(const json_t *doc, pjs_error *err)
{
    pjs_log_level level = pjs_log_get_level();
    bool info = level <= PJS_LOG_INFO, warning = level <= PJS_LOG_WARN;
    json_int_t verbose = level == PJS_LOG_DEBUG;
    const json_t *v;
    if ((v = json_object_get(doc, "log_file")) != NULL &&
        !(json_is_string(v) && json_string_length(v) == 0))
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "log_file: pjserve logs to stderr only (give \"\")");
    if ((v = json_object_get(doc, "log_format")) != NULL &&
        !(json_is_string(v) && is(json_string_value(v), "default")))
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED, "log_format: only \"default\" is supported");
    if ((v = json_object_get(doc, "log_error")) != NULL && !json_is_true(v))
        return pjs_error_set(err, json_is_boolean(v) ? PJS_ERR_UNSUPPORTED
                                                     : PJS_ERR_INVALID_ARGUMENT,
                             "log_error: errors are always logged (give true)");
    if ((v = json_object_get(doc, "log_info")) != NULL) {
        if (!json_is_boolean(v))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "log_info must be a boolean");
        info = json_is_true(v);
    }
    if ((v = json_object_get(doc, "log_warning")) != NULL) {
        if (!json_is_boolean(v))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "log_warning must be a boolean");
        warning = json_is_true(v);
    }
    if ((v = json_object_get(doc, "log_verbose_level")) != NULL) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "log_verbose_level must be a non-negative integer");
        verbose = json_integer_value(v);
    }
    pjs_log_set_level(verbose > 0 ? PJS_LOG_DEBUG
                      : info      ? PJS_LOG_INFO
                      : warning   ? PJS_LOG_WARN
                                  : PJS_LOG_ERROR);
    return 0;
}

static void logging(pjs__http_call *c)
{
    if (is(c->method, "POST")) {
        json_t *doc;
        pjs_error err;
        if (!pjs__http_body_object(c, &doc))
            return;
        int rc = doc ? apply_log_settings(doc, &err) : 0;
        json_decref(doc);
        if (rc != 0) {
            pjs__http_reply_error(c, &err);
            return;
        }
    } else if (!pjs__http_method_ok(c, "GET")) {
        return;
    }
    pjs__http_reply_json(c, 200, log_settings_json());
}

/* ---- trace settings ----------------------------------------------------------- */

static json_t *trace_settings_json(const pjs_tracer *t)
{
    pjs_trace_setting_out now[PJS_TRACE_SETTINGS];
    size_t n = pjs_trace_settings_current(t, now);
    json_t *doc = json_object();
    for (size_t i = 0; doc != NULL && i < n; i++)
        json_object_set_new(doc, now[i].key,
                            now[i].is_list ? json_pack("[s]", now[i].value)
                                           : json_string(now[i].value));
    return doc;
}

/* GET or POST /v2/trace/setting, /v2/models/{m}/trace/setting (model NULL
 * for the first). */
static void trace_setting(pjs__http_call *c, const char *model)
{
    pjs_tracer *t = pjs_server_tracer(server_of(c));
    if (is(c->method, "POST")) {
        pjs_error err;
        if (!pjs__http_body_ready(c))
            return;
        int rc = pjs_trace_settings_update_json(t, model, c->body.data, c->body.len, &err);
        if (rc != 0) {
            pjs__http_reply_error(c, &err);
            return;
        }
    } else if (!pjs__http_method_ok(c, "GET")) {
        return;
    }
    pjs__http_reply_json(c, 200, trace_settings_json(t));
}

/* ---- models --------------------------------------------------------------- */

static void model_ready(pjs__http_call *c, const char *name, const char *version)
{
    pjs_model *m = NULL;
    pjs_error err;
    bool ready = pjs_server_get_model(server_of(c), name, version, &m, &err) == 0;
    if (ready)
        pjs_model_unref(m);
    pjs__http_reply_empty(c, ready ? 200 : 400);
}

static void platform_name(pjs_server *s, char *buf, size_t size)
{
    snprintf(buf, size, "pjrt_%s", pjs_server_platform(s));
}

/* Metadata, config or stats of one model. */
static void model_document(pjs__http_call *c, const char *name, const char *version,
                           const char *what)
{
    pjs_server *s = server_of(c);
    pjs_model *m = NULL;
    pjs_error err;
    if (pjs_server_get_model(s, name, version, &m, &err) != 0) {
        pjs__http_reply_error(c, &err);
        return;
    }
    char platform[64];
    platform_name(s, platform, sizeof platform);
    json_t *doc;
    if (is(what, "config")) {
        doc = pjs_model_config_json(m->name, platform, pjs_model_manifest(m), m->max_batch_size,
                                    !m->coalesce);
    } else if (is(what, "stats")) {
        pjs_model_stats st;
        pjs_model_stats_snapshot(m, &st);
        doc = json_pack("{s:[o]}", "model_stats",
                        pjs_model_stats_json(m->name, PJS_MODEL_VERSION, &st));
        pjs_model_stats_release(&st);
    } else {
        doc = pjs_model_metadata_json(m->name, platform, pjs_model_manifest(m));
    }
    pjs_model_unref(m);
    pjs__http_reply_json(c, 200, doc);
}

static void append_model_stats(pjs_model *m, void *ctx)
{
    json_t *list = ctx;
    pjs_model_stats st;
    pjs_model_stats_snapshot(m, &st);
    json_array_append_new(list, pjs_model_stats_json(m->name, PJS_MODEL_VERSION, &st));
    pjs_model_stats_release(&st);
}

static void all_model_stats(pjs__http_call *c)
{
    json_t *list = json_array();
    if (list != NULL)
        pjs_server_foreach_public_model(server_of(c), append_model_stats, list);
    pjs__http_reply_json(c, 200, list ? json_pack("{s:o}", "model_stats", list) : NULL);
}

/* /v2/models/... with p->seg[2] the model name (or "stats"). */
static void models_route(pjs__http_call *c, const pjs__http_path *p)
{
    if (p->n == 3 && is(p->seg[2], "stats")) {
        if (pjs__http_method_ok(c, "GET"))
            all_model_stats(c);
        return;
    }
    const char *name = p->seg[2];
    const char *version = "";
    size_t i = 3;
    if (i + 1 < p->n && is(p->seg[i], "versions")) {
        version = p->seg[i + 1];
        i += 2;
    }
    const char *action = i < p->n ? p->seg[i] : "";
    if (is(action, "trace") && i + 2 == p->n && is(p->seg[i + 1], "setting")) {
        trace_setting(c, name);
        return;
    }
    if (i + 1 < p->n) {
        pjs__http_reply_message(c, 404, "no such endpoint: %s", c->url);
        return;
    }
    if (is(action, "infer")) {
        if (pjs__http_method_ok(c, "POST"))
            pjs__http_infer(c, name, version);
        return;
    }
    if (!is(action, "") && !is(action, "ready") && !is(action, "config") &&
        !is(action, "stats")) {
        pjs__http_reply_message(c, 404, "no such endpoint: %s", c->url);
        return;
    }
    if (!pjs__http_method_ok(c, "GET"))
        return;
    if (is(action, "ready"))
        model_ready(c, name, version);
    else
        model_document(c, name, version, action);
}

/* ---- repository ------------------------------------------------------------ */

static json_t *repository_index_json(pjs_server *s, bool ready_only)
{
    pjs_repository_entry *entries = NULL;
    size_t n;
    pjs_error err;
    if (pjs_server_repository_list(s, ready_only, &entries, &n, &err) != 0)
        return NULL;
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < n; i++) {
        json_t *e = json_pack("{s:s, s:s, s:s, s:s}", "name", entries[i].name, "version",
                              PJS_MODEL_VERSION, "state", pjs_model_state_name(entries[i].state),
                              "reason", entries[i].reason);
        if (e == NULL || json_array_append_new(list, e) != 0) {
            json_decref(list);
            list = NULL;
        }
    }
    free(entries);
    return list;
}

static void repository_index(pjs__http_call *c)
{
    json_t *doc;
    if (!pjs__http_body_object(c, &doc))
        return;
    const json_t *ready = doc ? json_object_get(doc, "ready") : NULL;
    if (ready != NULL && !json_is_boolean(ready)) {
        json_decref(doc);
        pjs__http_reply_message(c, 400, "\"ready\" must be true or false");
        return;
    }
    bool ready_only = json_is_true(ready);
    json_decref(doc);
    pjs__http_reply_json(c, 200, repository_index_json(server_of(c), ready_only));
}

/* The load thread's answer to POST /v2/repository/models/{m}/load. */
static void load_model_done(void *arg, const pjs_error *err)
{
    pjs__http_call *c = arg;
    if (err->code != 0)
        pjs__http_reply_error(c, err);
    else
        pjs__http_reply_empty(c, 200);
    pjs__http_resume(c);
}

/* Queues the load, with its config override (NULL: none), with the
 * connection suspended; the server's load thread answers (no thread waits
 * for a compile). A refused queue or config answers at once. */
static void load_model(pjs__http_call *c, const char *name, const json_t *config)
{
    pjs_error err;
    pjs__http_suspend(c);
    if (pjs_server_load_model_config_async(server_of(c), name, json_string_value(config),
                                           json_string_length(config), load_model_done, c,
                                           &err) != 0) {
        pjs__http_reply_error(c, &err);
        pjs__http_resume(c);
    }
}

/* A load's "parameters": "config" (a string, ModelConfig as JSON) into
 * *config (borrowed from doc; NULL when absent); "file:" overrides are
 * refused, other keys ignored. */
static bool load_parameters(pjs__http_call *c, const char *name, const json_t *doc,
                            const json_t **config)
{
    const json_t *params = doc ? json_object_get(doc, "parameters") : NULL;
    *config = NULL;
    if (params == NULL)
        return true;
    if (!json_is_object(params)) {
        pjs__http_reply_message(c, 400, "\"parameters\" must be an object");
        return false;
    }
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)params, key, value) {
        pjs_error err;
        if (pjs_load_parameter_check(name, key, &err) != 0) {
            pjs__http_reply_error(c, &err);
            return false;
        }
        if (!is(key, "config"))
            continue;
        if (!json_is_string(value)) {
            pjs__http_reply_message(c, 400,
                                    "model %.256s: load parameter \"config\" must be a string "
                                    "holding the ModelConfig as JSON",
                                    name);
            return false;
        }
        *config = value;
    }
    return true;
}

static void repository_model(pjs__http_call *c, const char *name, const char *action)
{
    json_t *doc;
    pjs_error err;
    if (!pjs__http_body_object(c, &doc))
        return;
    if (is(action, "load")) {
        const json_t *config;
        if (load_parameters(c, name, doc, &config))
            load_model(c, name, config);
        json_decref(doc);
        return;
    }
    json_decref(doc); /* unload_dependents and the like: pjserve models have none */
    if (pjs_server_unload_model(server_of(c), name, &err) != 0)
        pjs__http_reply_error(c, &err);
    else
        pjs__http_reply_empty(c, 200);
}

static void repository_route(pjs__http_call *c, const pjs__http_path *p)
{
    if (p->n == 3 && is(p->seg[2], "index")) {
        if (pjs__http_method_ok(c, "POST"))
            repository_index(c);
        return;
    }
    bool model_action = p->n == 5 && is(p->seg[2], "models") &&
                        (is(p->seg[4], "load") || is(p->seg[4], "unload"));
    if (model_action) {
        if (pjs__http_method_ok(c, "POST"))
            repository_model(c, p->seg[3], p->seg[4]);
        return;
    }
    pjs__http_reply_message(c, 404, "no such endpoint: %s", c->url);
}

/* ---- shared memory: system and CUDA ------------------------------------------ */

/* One region as its kind's status lists it (Triton's fields). */
static json_t *shm_region_json(const pjs_shm_info *info)
{
    if (info->kind == PJS_SHM_CUDA)
        return json_pack("{s:s, s:I, s:I}", "name", info->name, "device_id",
                         (json_int_t)info->device_id, "byte_size", (json_int_t)info->byte_size);
    return json_pack("{s:s, s:s, s:I, s:I}", "name", info->name, "key", info->key, "offset",
                     (json_int_t)info->offset, "byte_size", (json_int_t)info->byte_size);
}

static void shm_status(pjs__http_call *c, pjs_shm_kind kind, const char *region)
{
    pjs_shm_registry *reg = pjs_server_shm(server_of(c));
    pjs_error err;
    size_t cap = 16;
    pjs_shm_info *info = NULL;
    int n;
    for (;;) {
        pjs_shm_info *grown = realloc(info, cap * sizeof *info);
        if (grown == NULL) {
            free(info);
            pjs__http_reply_json(c, 200, NULL);
            return;
        }
        info = grown;
        n = pjs_shm_status_kind(reg, kind, region, info, cap, &err);
        if (n < 0 || (size_t)n <= cap)
            break;
        cap = (size_t)n;
    }
    if (n < 0) {
        free(info);
        pjs__http_reply_error(c, &err);
        return;
    }
    json_t *list = json_array();
    for (int i = 0; list != NULL && i < n; i++) {
        json_t *e = shm_region_json(&info[i]);
        if (e == NULL || json_array_append_new(list, e) != 0) {
            json_decref(list);
            list = NULL;
        }
    }
    free(info);
    pjs__http_reply_json(c, 200, list);
}

static void shm_register(pjs__http_call *c, const char *region)
{
    json_t *doc;
    pjs_error err;
    if (!pjs__http_body_object(c, &doc))
        return;
    const json_t *key = doc ? json_object_get(doc, "key") : NULL;
    const json_t *offset = doc ? json_object_get(doc, "offset") : NULL;
    const json_t *size = doc ? json_object_get(doc, "byte_size") : NULL;
    if (!json_is_string(key) || (offset != NULL && !json_is_integer(offset)) ||
        !json_is_integer(size) || json_integer_value(offset) < 0 ||
        json_integer_value(size) < 0) {
        json_decref(doc);
        pjs__http_reply_message(c, 400,
                                "register needs a JSON body {\"key\": string, \"offset\": "
                                "non-negative integer (optional), \"byte_size\": non-negative "
                                "integer}");
        return;
    }
    int rc = pjs_shm_register(pjs_server_shm(server_of(c)), region, json_string_value(key),
                              (uint64_t)json_integer_value(offset),
                              (uint64_t)json_integer_value(size), &err);
    json_decref(doc);
    if (rc != 0)
        pjs__http_reply_error(c, &err);
    else
        pjs__http_reply_empty(c, 200);
}

static void cuda_shm_register(pjs__http_call *c, const char *region)
{
    pjs_cuda_shm_register_body body;
    pjs_error err;
    int rc = pjs_cuda_shm_parse_register(c->body.data, c->body.len, &body, &err);
    if (rc == 0)
        rc = pjs_shm_register_cuda(pjs_server_shm(server_of(c)), region, body.raw_handle,
                                   sizeof body.raw_handle, body.device_id, body.byte_size,
                                   &err);
    if (rc != 0)
        pjs__http_reply_error(c, &err);
    else
        pjs__http_reply_empty(c, 200);
}

static void shm_unregister(pjs__http_call *c, pjs_shm_kind kind, const char *region)
{
    pjs_error err;
    if (pjs_shm_unregister_kind(pjs_server_shm(server_of(c)), kind, region, &err) != 0)
        pjs__http_reply_error(c, &err);
    else
        pjs__http_reply_empty(c, 200);
}

/* /v2/{system|cuda}sharedmemory/[region/{r}/]{status|register|unregister} */
static void shm_route(pjs__http_call *c, const pjs__http_path *p, pjs_shm_kind kind)
{
    const char *region = NULL;
    const char *action = NULL;
    if (p->n == 3) {
        action = p->seg[2];
    } else if (p->n == 5 && is(p->seg[2], "region")) {
        region = p->seg[3];
        action = p->seg[4];
    }
    if (action != NULL && is(action, "status")) {
        if (pjs__http_method_ok(c, "GET"))
            shm_status(c, kind, region);
    } else if (action != NULL && is(action, "unregister")) {
        if (pjs__http_method_ok(c, "POST"))
            shm_unregister(c, kind, region);
    } else if (action != NULL && region != NULL && is(action, "register")) {
        if (!pjs__http_method_ok(c, "POST"))
            return;
        if (kind == PJS_SHM_CUDA)
            cuda_shm_register(c, region);
        else
            shm_register(c, region);
    } else {
        pjs__http_reply_message(c, 404, "no such endpoint: %s", c->url);
    }
}

/* ---- model control ---------------------------------------------------------- */

static void control_status(pjs__http_call *c)
{
    pjs_server *s = server_of(c);
    pjs_control_model *models;
    size_t n;
    pjs_error err;
    if (pjs_control_models(s, NULL, 0, &models, &n, &err) != 0) {
        pjs__http_reply_error(c, &err);
        return;
    }
    pjs_weight_cache_info cache;
    pjs_server_weight_cache_info(s, &cache);
    pjs__http_reply_json(c, 200,
                         pjs_control_status_json(pjs_server_control_mode(s), &cache, models, n));
    free(models);
}

/* Answers with the status of model `name` after a change. */
static void reply_model_status(pjs__http_call *c, const char *name)
{
    pjs_control_model m;
    pjs_error err;
    if (pjs_control_model_get(server_of(c), name, &m, &err) != 0)
        pjs__http_reply_error(c, &err);
    else
        pjs__http_reply_json(c, 200, pjs_control_model_json(&m));
}

/* POST /v2/pjserve/models/{m}/residency on a helper thread (it waits for
 * the device owner to move the weights); the name is read from the path
 * again here. */
static void residency_deferred(pjs__http_call *c)
{
    pjs__http_path p;
    pjs_residency target;
    pjs_error err;
    pjs__http_split_path(c->url, &p);
    const char *name = p.seg[3];
    if (!pjs__http_body_ready(c))
        return;
    int rc = pjs_control_parse_residency(c->body.data, c->body.len, &target, &err);
    if (rc != 0)
        pjs_error_prefix(&err, "model %.256s: ", name);
    else
        rc = pjs_server_set_residency(server_of(c), name, target, &err);
    if (rc != 0)
        pjs__http_reply_error(c, &err);
    else
        reply_model_status(c, name);
}

static void set_policy(pjs__http_call *c, const char *name)
{
    pjs_control_policy_change change;
    pjs_model_policy policy;
    pjs_error err;
    if (!pjs__http_body_ready(c))
        return;
    int rc = pjs_control_parse_policy(c->body.data, c->body.len, &change, &err);
    if (rc != 0)
        pjs_error_prefix(&err, "model %.256s: ", name);
    if (rc == 0)
        rc = pjs_control_policy(name, &change, &policy, &err);
    if (rc == 0)
        rc = pjs_server_set_model_policy(server_of(c), name, &policy, &err);
    if (rc != 0)
        pjs__http_reply_error(c, &err);
    else
        reply_model_status(c, name);
}

/* POST /v2/pjserve/compact on a helper thread (it frees and loads weights). */
static void compact_deferred(pjs__http_call *c)
{
    char **names;
    size_t n, reloaded = 0;
    pjs_error err;
    if (!pjs__http_body_ready(c))
        return;
    int rc = pjs_control_parse_compact(c->body.data, c->body.len, &names, &n, &err);
    if (rc == 0) {
        rc = pjs_server_compact(server_of(c), (const char *const *)names, n, &reloaded, &err);
        free(names);
    }
    if (rc != 0)
        pjs__http_reply_error(c, &err);
    else
        pjs__http_reply_json(c, 200, json_pack("{s:I}", "reloaded", (json_int_t)reloaded));
}

/* GET /v2/pjserve/node: the node's status document, as the node last wrote
 * it to --node-status-file (the node replaces the file whole, by rename, so
 * a read never sees half of it). */
static void node_status(pjs__http_call *c)
{
    const char *path = c->fe->opts.node_status_file;
    if (path == NULL) {
        pjs__http_reply_message(c, 404,
                                "this server runs on its own, not under `pjserve node`: there is "
                                "no node status");
        return;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        pjs__http_reply_message(c, 503, "the node status is not available yet (%s: %s)", path,
                                strerror(errno));
        return;
    }
    pjs_http_buf doc;
    pjs_error err;
    pjs_http_buf_init(&doc, NODE_STATUS_MAX_BYTES);
    char chunk[8192];
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        rc = pjs_http_buf_append(&doc, chunk, n, &err);
    bool failed = ferror(f) != 0;
    fclose(f);
    if (rc != 0 || failed) {
        pjs_http_buf_free(&doc);
        pjs__http_reply_message(c, 500, "cannot read the node status file %s (%s)", path,
                                rc != 0 ? err.msg : "read error");
        return;
    }
    pjs__http_reply_buf(c, 200, &doc, "application/json");
}

/* /v2/pjserve/node, /v2/pjserve/control, /v2/pjserve/compact and
 * /v2/pjserve/models/{m}/residency|policy. */
static void control_route(pjs__http_call *c, const pjs__http_path *p)
{
    const char *what = p->n > 2 ? p->seg[2] : "";
    if (p->n == 3 && is(what, "node")) {
        if (pjs__http_method_ok(c, "GET"))
            node_status(c);
    } else if (p->n == 3 && is(what, "control")) {
        if (pjs__http_method_ok(c, "GET"))
            control_status(c);
    } else if (p->n == 3 && is(what, "compact")) {
        if (pjs__http_method_ok(c, "POST"))
            pjs__http_defer(c, compact_deferred);
    } else if (p->n == 5 && is(what, "models") && is(p->seg[4], "residency")) {
        if (pjs__http_method_ok(c, "POST"))
            pjs__http_defer(c, residency_deferred);
    } else if (p->n == 5 && is(what, "models") && is(p->seg[4], "policy")) {
        if (pjs__http_method_ok(c, "POST"))
            set_policy(c, p->seg[3]);
    } else {
        pjs__http_reply_message(c, 404, "no such endpoint: %.256s", c->url);
    }
}

/* ---- entry points ----------------------------------------------------------- */

static void route_rest(pjs__http_call *c)
{
    pjs__http_path p;
    if (!pjs__http_split_path(c->url, &p) || p.n == 0 || !is(p.seg[0], "v2")) {
        pjs__http_reply_message(c, 404, "no such endpoint: %.256s", c->url);
        return;
    }
    const char *area = p.n > 1 ? p.seg[1] : "";
    if (p.n == 1) {
        if (pjs__http_method_ok(c, "GET"))
            server_metadata(c);
    } else if (is(area, "health") && p.n == 3 && (is(p.seg[2], "live") || is(p.seg[2], "ready"))) {
        if (pjs__http_method_ok(c, "GET"))
            health(c, p.seg[2]);
    } else if (is(area, "logging") && p.n == 2) {
        logging(c);
    } else if (is(area, "trace") && p.n == 3 && is(p.seg[2], "setting")) {
        trace_setting(c, NULL);
    } else if (is(area, "models") && p.n >= 3) {
        models_route(c, &p);
    } else if (is(area, "repository")) {
        repository_route(c, &p);
    } else if (is(area, "systemsharedmemory")) {
        shm_route(c, &p, PJS_SHM_SYSTEM);
    } else if (is(area, "cudasharedmemory")) {
        shm_route(c, &p, PJS_SHM_CUDA);
    } else if (is(area, "pjserve")) {
        control_route(c, &p);
    } else {
        pjs__http_reply_message(c, 404, "no such endpoint: %.256s", c->url);
    }
}

/* Collects every loaded model's statistics and scheduler state for one
 * scrape. */
typedef struct metrics_scrape {
    pjs_server *server;
    pjs_metrics_model *models;
    size_t n, cap;
    bool out_of_memory;
} metrics_scrape;

static void collect_model(pjs_model *m, void *ctx)
{
    metrics_scrape *s = ctx;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        pjs_metrics_model *grown = realloc(s->models, cap * sizeof *grown);
        if (grown == NULL) {
            s->out_of_memory = true;
            return;
        }
        s->models = grown;
        s->cap = cap;
    }
    pjs_metrics_model *e = &s->models[s->n];
    char *name = strdup(m->name);
    if (name == NULL) {
        s->out_of_memory = true;
        return;
    }
    e->name = name;
    e->version = PJS_MODEL_VERSION;
    pjs_model_stats_snapshot(m, &e->stats);
    pjs_server_model_sched_info(s->server, m, &e->sched);
    pjs_server_model_residency(s->server, m, &e->residency);
    for (size_t q = 0; q < PJS_METRICS_QUANTILES; q++)
        e->queue_wait_us[q] = pjs_queue_wait_quantile_us(e->stats.queue_wait,
                                                         pjs_metrics_quantiles[q]);
    const pjs_manifest *mf = pjs_model_manifest(m);
    e->n_batch_sizes = mf->n_batch_sizes < PJS_MODEL_MAX_BATCH_SIZES ? mf->n_batch_sizes
                                                                     : PJS_MODEL_MAX_BATCH_SIZES;
    if (e->n_batch_sizes > 0)
        memcpy(e->batch_sizes, mf->batch_sizes, e->n_batch_sizes * sizeof *e->batch_sizes);
    s->n++;
}

/* Forgets the models read so far (the array is kept for the next read). */
static void metrics_scrape_clear(metrics_scrape *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free((char *)s->models[i].name);
        pjs_model_stats_release(&s->models[i].stats);
    }
    s->n = 0;
}

static void route_metrics(pjs__http_call *c)
{
    pjs__http_path p;
    if (!pjs__http_split_path(c->url, &p) || p.n != 1 || !is(p.seg[0], "metrics")) {
        pjs__http_reply_message(c, 404, "no such endpoint: %.256s (metrics are at /metrics)",
                                c->url);
        return;
    }
    if (!pjs__http_method_ok(c, "GET"))
        return;
    metrics_scrape scrape = {.server = server_of(c)};
    pjs_metrics_gauges gauges = {0};
    /* One consistent set of resident models: read again when a load or
     * eviction happened while the models were read (a few tries; loads take
     * far longer than a scrape). */
    for (int attempt = 0;; attempt++) {
        pjs_weight_cache_info before;
        pjs_server_weight_cache_info(server_of(c), &before);
        pjs_server_foreach_model(server_of(c), collect_model, &scrape);
        pjs_server_weight_cache_info(server_of(c), &gauges.cache);
        if (before.changes == gauges.cache.changes || attempt == METRICS_CONSISTENT_TRIES - 1 ||
            scrape.out_of_memory)
            break;
        metrics_scrape_clear(&scrape);
    }
    size_t shown = pjs_metrics_select(scrape.models, scrape.n,
                                      pjs_server_metrics_models(server_of(c)), &gauges.totals);
    for (size_t i = shown; i < scrape.n; i++) {
        free((char *)scrape.models[i].name);
        pjs_model_stats_release(&scrape.models[i].stats);
    }
    scrape.n = shown;
    pjs_server_counters counters;
    pjs_server_get_counters(server_of(c), &counters);
    gauges.queue_depth = counters.queue_depth;
    gauges.in_flight = counters.in_flight;
    gauges.plans_inline = counters.plans_inline;
    gauges.plans_worker = counters.plans_worker;
    gauges.discipline = pjs_server_discipline(server_of(c));
    gauges.server = &counters;
    pjs_http_buf text;
    pjs_error err;
    pjs_http_buf_init(&text, METRICS_MAX_BYTES);
    int rc = scrape.out_of_memory ? pjs_error_set(&err, PJS_ERR_NOMEM, "out of memory")
                                  : pjs_metrics_render(scrape.models, scrape.n, &gauges, &text,
                                                       &err);
    metrics_scrape_clear(&scrape);
    free(scrape.models);
    if (rc != 0) {
        pjs_http_buf_free(&text);
        pjs__http_reply_error(c, &err);
        return;
    }
    pjs__http_reply_buf(c, 200, &text, "text/plain; version=0.0.4; charset=utf-8");
}

/* POST bodies to an inference path are held to what the model can take,
 * others to the size of a control document. */
static bool limit_rest_body(pjs__http_call *c)
{
    char model[256], version[64];
    if (pjs__http_infer_path(c->url, model, sizeof model, version, sizeof version))
        return pjs__http_infer_limit(c, model, version);
    pjs__http_limit_control_body(c);
    return true;
}

static const pjs__http_routes rest_routes = {
    .what = "HTTP/REST",
    .keeps_bodies = true,
    .defers_jobs = true,
    .limit_body = limit_rest_body,
    .route = route_rest,
    .release = pjs__http_infer_discard,
};

static const pjs__http_routes metrics_routes = {
    .what = "metrics",
    .route = route_metrics,
};

int pjs_http_frontend_start(pjs_server *s, const pjs_http_options *o, pjs_http_frontend **out,
                            pjs_error *err)
{
    return pjs__http_frontend_start(&rest_routes, s, o, pjs_server_request_budget(s),
                                    pjs_server_max_request_bytes(s), out, err);
}

int pjs_metrics_frontend_start(pjs_server *s, const pjs_http_options *o,
                               pjs_http_frontend **out, pjs_error *err)
{
    return pjs__http_frontend_start(&metrics_routes, s, o, pjs_server_request_budget(s),
                                    pjs_server_max_request_bytes(s), out, err);
}
