/*
 * control_json.h - the JSON of the REST model control endpoints
 * (/v2/pjserve/...): the status document, and the request bodies of
 * .../residency, .../policy and /v2/pjserve/compact, read strictly (an
 * object; no unknown or repeated keys; each value of its one type).
 *
 * Pure functions of plain structures (server/control.h), so they are tested
 * without a server. Any thread. Parse errors are INVALID_ARGUMENT with a
 * message naming the field and what it must be.
 */
#ifndef PJS_FRONTEND_HTTP_CONTROL_JSON_H
#define PJS_FRONTEND_HTTP_CONTROL_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "core/manifest.h"
#include "core/status.h"
#include "server/control.h"
#include "server/server.h"

/* {"name", "state", "reason"} and, when the model is loaded, "residency"
 * ("device", "host", "unpinned"), "resident", "weight_bytes", "loads",
 * "evictions", "load_seconds", "weight", "max_queue_depth",
 * "default_timeout_us" and "queue_depth". NULL when out of memory. */
json_t *pjs_control_model_json(const pjs_control_model *m);

/* {"control_mode", "cache": {"budget_bytes" (0 when unlimited), "unlimited",
 * "used_bytes", "pinned_bytes"}, "models": [pjs_control_model_json...]}. */
json_t *pjs_control_status_json(pjs_control_mode mode, const pjs_weight_cache_info *cache,
                                const pjs_control_model *models, size_t n);

/* {"residency": "device" | "host" | "unpinned"}. */
int pjs_control_parse_residency(const char *body, size_t len, pjs_residency *out,
                                pjs_error *err);

/* {"weight": number, "max_queue_depth": integer, "default_timeout_us":
 * integer}, any of them (ranges are pjs_control_policy's to check). */
int pjs_control_parse_policy(const char *body, size_t len, pjs_control_policy_change *out,
                             pjs_error *err);

/* {"reload": ["name", ...]} with "reload" optional; an empty body is {}.
 * *names is one malloc'd block (the pointers and the strings) to free()
 * at once; NULL when *n is 0. */
int pjs_control_parse_compact(const char *body, size_t len, char ***names, size_t *n,
                              pjs_error *err);

#endif
