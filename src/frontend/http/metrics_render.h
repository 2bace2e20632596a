/*
 * metrics_render.h - the Prometheus text exposition (format 0.0.4) that
 * GET /metrics serves.
 *
 * Per model, Triton's counter names labelled {model="m",version="1"}:
 * nv_inference_request_success, _failure, nv_inference_count,
 * nv_inference_exec_count and the cumulative durations in microseconds
 * (request, queue, compute input/infer/output); then pjserve's gauges for
 * the whole server. Rendering works from plain snapshots so it can be tested
 * without a server. Pure function; any thread.
 */
#ifndef PJS_FRONTEND_HTTP_METRICS_RENDER_H
#define PJS_FRONTEND_HTTP_METRICS_RENDER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "frontend/http/http_buf.h"
#include "registry/model.h"

/* One model's statistics at the time of the scrape. */
typedef struct pjs_metrics_model {
    const char *name;
    const char *version;
    pjs_model_stats stats;
} pjs_metrics_model;

/* Server-wide gauges. */
typedef struct pjs_metrics_gauges {
    uint64_t queue_depth; /* requests waiting in the dispatcher */
    uint64_t in_flight;   /* requests accepted and not yet completed */
} pjs_metrics_gauges;

/* Appends the whole exposition to out. */
int pjs_metrics_render(const pjs_metrics_model *models, size_t n, const pjs_metrics_gauges *g,
                       pjs_http_buf *out, pjs_error *err);

#endif
