/*
 * metrics_render.h - the Prometheus text exposition (format 0.0.4) that
 * GET /metrics serves.
 *
 * Per model, labelled {model="m",version="1"}: Triton's counters
 * (nv_inference_request_success, _failure, nv_inference_count,
 * nv_inference_exec_count and the cumulative durations in microseconds:
 * request, queue, compute input/infer/output), then pjserve's own families
 * (dispatches, device seconds, the scheduler's weight, queue depth and
 * recent utilization, requests expired, shed and rejected, the device
 * weight cache's loads, evictions, load seconds and resident bytes, the
 * queue wait as a summary and the rows per execution as a histogram over
 * the compiled batch sizes); then the server-wide gauges, the scheduler's
 * discipline and the weight cache's budget, used and pinned bytes.
 * Rendering works from plain snapshots so it can be tested without a
 * server. Pure function; any thread.
 */
#ifndef PJS_FRONTEND_HTTP_METRICS_RENDER_H
#define PJS_FRONTEND_HTTP_METRICS_RENDER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "frontend/http/http_buf.h"
#include "registry/model.h"
#include "server/server.h"

/* The quantiles of the queue-wait summary: 0.5, 0.9, 0.99. */
#define PJS_METRICS_QUANTILES 3
extern const double pjs_metrics_quantiles[PJS_METRICS_QUANTILES];

/* One model at the time of the scrape. */
typedef struct pjs_metrics_model {
    const char *name;
    const char *version;
    pjs_model_stats stats;
    pjs_model_sched_info sched;
    pjs_model_residency_info residency;
    /* pjs_queue_wait_quantile_us(stats.queue_wait, pjs_metrics_quantiles[i]). */
    double queue_wait_us[PJS_METRICS_QUANTILES];
    /* The compiled batch sizes, ascending: the buckets of pjserve_model_batch_rows. */
    size_t n_batch_sizes;
    int64_t batch_sizes[PJS_MODEL_MAX_BATCH_SIZES];
} pjs_metrics_model;

/* Every model's counters summed: what a catalogue larger than the per-model
 * limit still reports in full (pjs_metrics_select). */
typedef struct pjs_metrics_totals {
    uint64_t models;        /* loaded */
    uint64_t shown;         /* with series of their own */
    uint64_t success, failure; /* requests */
    uint64_t inferences, executions;
    uint64_t request_ns, queue_ns; /* of successful requests */
} pjs_metrics_totals;

/* Sums every model into *totals, then, when there are more than `limit`
 * (0: no limit), moves the `limit` that matter most to the front: those with
 * requests queued or running, then those whose weights are on the device,
 * then by recent device use and most recent request, then by name. The
 * chosen are left in name order. Returns how many are chosen. */
size_t pjs_metrics_select(pjs_metrics_model *models, size_t n, size_t limit,
                          pjs_metrics_totals *totals);

/* Server-wide gauges. */
typedef struct pjs_metrics_gauges {
    uint64_t queue_depth;   /* requests waiting in the dispatcher */
    uint64_t in_flight;     /* requests accepted and not yet completed */
    uint64_t plans_inline;  /* plans run by the thread that submitted a request */
    uint64_t plans_worker;  /* plans run by a dispatcher worker */
    const char *discipline; /* the scheduler's discipline ("fair") */
    const pjs_server_counters *server; /* meta runs and scratch (server.h) */
    pjs_weight_cache_info cache; /* the device weight cache (budget UINT64_MAX: +Inf) */
    pjs_metrics_totals totals;   /* every model's, shown or not */
} pjs_metrics_gauges;

/* Appends the whole exposition to out. */
int pjs_metrics_render(const pjs_metrics_model *models, size_t n, const pjs_metrics_gauges *g,
                       pjs_http_buf *out, pjs_error *err);

#endif
