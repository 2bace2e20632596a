/*
 * metrics_render.c - Prometheus text for the metrics endpoint (see
 * metrics_render.h).
 *
 * Two tables list the per-model families of one sample per model (Triton's,
 * then pjserve's); each family is written as its # HELP and # TYPE lines
 * followed by one sample per model. The queue-wait summary and the rows
 * histogram have several samples per model and their own functions. Values
 * are integers where they count something, exact decimal seconds where they
 * sum nanoseconds, and %.9g otherwise. Label values are escaped as the
 * exposition format requires (backslash, quote, newline).
 */
#include "frontend/http/metrics_render.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const double pjs_metrics_quantiles[PJS_METRICS_QUANTILES] = {0.5, 0.9, 0.99};

/* ---- values ------------------------------------------------------------------ */

typedef enum value_kind {
    VALUE_COUNT,   /* n as an integer */
    VALUE_SECONDS, /* n nanoseconds as exact decimal seconds */
    VALUE_REAL,    /* x */
} value_kind;

typedef struct metric_value {
    value_kind kind;
    uint64_t n;
    double x;
} metric_value;

static metric_value count(uint64_t n) { return (metric_value){VALUE_COUNT, n, 0}; }
static metric_value seconds(uint64_t ns) { return (metric_value){VALUE_SECONDS, ns, 0}; }
static metric_value real(double x) { return (metric_value){VALUE_REAL, 0, x}; }

static int put_value(pjs_http_buf *b, metric_value v, pjs_error *err)
{
    switch (v.kind) {
    case VALUE_COUNT: return pjs_http_buf_printf(b, err, "%" PRIu64, v.n);
    case VALUE_SECONDS:
        return pjs_http_buf_printf(b, err, "%" PRIu64 ".%09" PRIu64, v.n / 1000000000u,
                                   v.n % 1000000000u);
    default:
        if (isnan(v.x))
            return pjs_http_buf_append_str(b, "NaN", err);
        if (isinf(v.x))
            return pjs_http_buf_append_str(b, v.x > 0 ? "+Inf" : "-Inf", err);
        return pjs_http_buf_printf(b, err, "%.9g", v.x);
    }
}

/* ---- one-sample families -------------------------------------------------------- */

typedef struct model_family {
    const char *name;
    const char *help;
    const char *type;   /* "counter" or "gauge" */
    const char *labels; /* written after version: "" or ",reason=\"queue_full\"" */
    metric_value (*value)(const pjs_metrics_model *m);
} model_family;

static uint64_t ns_to_us(uint64_t ns)
{
    return ns / 1000u;
}

static metric_value request_success(const pjs_metrics_model *m)
{
    return count(m->stats.success.count);
}

static metric_value request_failure(const pjs_metrics_model *m)
{
    return count(m->stats.fail.count);
}

static metric_value inference_count(const pjs_metrics_model *m)
{
    return count(m->stats.inference_count);
}

static metric_value exec_count(const pjs_metrics_model *m)
{
    return count(m->stats.execution_count);
}

static metric_value request_us(const pjs_metrics_model *m)
{
    return count(ns_to_us(m->stats.success.ns));
}

static metric_value queue_us(const pjs_metrics_model *m)
{
    return count(ns_to_us(m->stats.queue.ns));
}

static metric_value input_us(const pjs_metrics_model *m)
{
    return count(ns_to_us(m->stats.compute_input.ns));
}

static metric_value infer_us(const pjs_metrics_model *m)
{
    return count(ns_to_us(m->stats.compute_infer.ns));
}

static metric_value output_us(const pjs_metrics_model *m)
{
    return count(ns_to_us(m->stats.compute_output.ns));
}

static metric_value device_s(const pjs_metrics_model *m)
{
    return seconds(m->stats.device_ns);
}

static metric_value utilization(const pjs_metrics_model *m)
{
    return real(m->sched.recent_utilization);
}

static metric_value weight(const pjs_metrics_model *m)
{
    return real(m->sched.weight);
}

static metric_value queue_depth(const pjs_metrics_model *m)
{
    return count(m->sched.queue_depth);
}

static metric_value in_flight(const pjs_metrics_model *m)
{
    return count(m->sched.in_flight);
}

static metric_value expired(const pjs_metrics_model *m)
{
    return count(m->stats.expired);
}

static metric_value shed(const pjs_metrics_model *m)
{
    return count(m->stats.shed);
}

static metric_value queue_full(const pjs_metrics_model *m)
{
    return count(m->stats.rejected_queue_full);
}

static metric_value weight_loads(const pjs_metrics_model *m)
{
    return count(m->residency.loads);
}

static metric_value weight_evictions(const pjs_metrics_model *m)
{
    return count(m->residency.evictions);
}

static metric_value weight_resident_bytes(const pjs_metrics_model *m)
{
    return count(m->residency.resident ? m->residency.weight_bytes : 0);
}

static metric_value weight_load_s(const pjs_metrics_model *m)
{
    return seconds(m->residency.load_ns);
}

static metric_value host_weight_bytes(const pjs_metrics_model *m)
{
    return count(m->residency.in_host ? m->residency.host_bytes : 0);
}

static metric_value host_weight_loads(const pjs_metrics_model *m)
{
    return count(m->residency.host_loads);
}

static metric_value host_weight_evictions(const pjs_metrics_model *m)
{
    return count(m->residency.host_evictions);
}

static metric_value host_weight_load_s(const pjs_metrics_model *m)
{
    return seconds(m->residency.host_load_ns);
}


static const model_family triton_families[] = {
    {"nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     "counter", "", request_success},
    {"nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     "counter", "", request_failure},
    {"nv_inference_count", "Number of inferences performed (batch elements)", "counter", "",
     inference_count},
    {"nv_inference_exec_count", "Number of model executions performed", "counter", "",
     exec_count},
    {"nv_inference_request_duration_us",
     "Cumulative duration of successful inference requests in microseconds", "counter", "",
     request_us},
    {"nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     "counter", "", queue_us},
    {"nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds", "counter", "", input_us},
    {"nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds", "counter", "", infer_us},
    {"nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds", "counter", "", output_us},
};

static const model_family pjserve_families[] = {
    {"pjserve_model_dispatches_total",
     "Device executions of the model, each serving one or more coalesced requests", "counter",
     "", exec_count},
    {"pjserve_model_device_seconds_total",
     "Device time of the model's executions in seconds, upload to read-back", "counter", "",
     device_s},
    {"pjserve_model_recent_utilization",
     "Share of the device's time the model used over the scheduler's recent window (0 to 1)",
     "gauge", "", utilization},
    {"pjserve_model_weight", "The model's fair-share weight", "gauge", "", weight},
    {"pjserve_model_queue_depth", "Requests of the model waiting in the scheduler's queues",
     "gauge", "", queue_depth},
    {"pjserve_model_requests_in_flight",
     "Requests of the model accepted by the scheduler and not yet finished (queued or running)",
     "gauge", "", in_flight},
    {"pjserve_model_requests_expired_total",
     "Requests answered DEADLINE_EXCEEDED because their deadline passed before they ran",
     "counter", "", expired},
    {"pjserve_model_requests_shed_total",
     "Requests answered DEADLINE_EXCEEDED by edf as predicted to miss their deadline", "counter",
     "", shed},
    {"pjserve_model_requests_rejected_total", "Requests refused at admission, by reason",
     "counter", ",reason=\"queue_full\"", queue_full},
    {"pjserve_weight_loads_total", "Host-to-device loads of the model's weights", "counter", "",
     weight_loads},
    {"pjserve_weight_evictions_total", "Evictions of the model's weights from the device",
     "counter", "", weight_evictions},
    {"pjserve_weight_resident_bytes", "Bytes of the model's weights on the device now",
     "gauge", "", weight_resident_bytes},
    {"pjserve_weight_load_seconds_total", "Time spent loading the model's weights, in seconds",
     "counter", "", weight_load_s},
    {"pjserve_host_weight_bytes", "Bytes of the model's host floor in host memory now",
     "gauge", "", host_weight_bytes},
    {"pjserve_host_weight_loads_total",
     "Reads of the model's weights from its file into host memory by the host tier", "counter",
     "", host_weight_loads},
    {"pjserve_host_weight_evictions_total",
     "Evictions of the model's host floor by the host tier", "counter", "",
     host_weight_evictions},
    {"pjserve_host_weight_load_seconds_total",
     "Time the host tier spent reading the model's weights from its file, in seconds",
     "counter", "", host_weight_load_s},
};

/* A label value between quotes, escaped. */
static int label_value(pjs_http_buf *b, const char *v, pjs_error *err)
{
    int rc = pjs_http_buf_append_str(b, "\"", err);
    for (const char *p = v; rc == 0 && *p != '\0'; p++) {
        if (*p == '\\' || *p == '"')
            rc = pjs_http_buf_printf(b, err, "\\%c", *p);
        else if (*p == '\n')
            rc = pjs_http_buf_append_str(b, "\\n", err);
        else
            rc = pjs_http_buf_append(b, p, 1, err);
    }
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "\"", err);
    return rc;
}

static int family_header(pjs_http_buf *b, const char *name, const char *help, const char *type,
                         pjs_error *err)
{
    return pjs_http_buf_printf(b, err, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{model="m",version="v"<labels>} value */
static int model_sample(pjs_http_buf *b, const char *name, const pjs_metrics_model *m,
                        const char *labels, metric_value v, pjs_error *err)
{
    int rc = pjs_http_buf_printf(b, err, "%s{model=", name);
    if (rc == 0)
        rc = label_value(b, m->name, err);
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, ",version=", err);
    if (rc == 0)
        rc = label_value(b, m->version, err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err, "%s} ", labels);
    if (rc == 0)
        rc = put_value(b, v, err);
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "\n", err);
    return rc;
}

static int render_families(const model_family *families, size_t n_families,
                           const pjs_metrics_model *models, size_t n, pjs_http_buf *b,
                           pjs_error *err)
{
    int rc = 0;
    for (size_t f = 0; rc == 0 && f < n_families; f++) {
        const model_family *fam = &families[f];
        rc = family_header(b, fam->name, fam->help, fam->type, err);
        for (size_t i = 0; rc == 0 && i < n; i++)
            rc = model_sample(b, fam->name, &models[i], fam->labels, fam->value(&models[i]), err);
    }
    return rc;
}

/* ---- the summary and the histogram ---------------------------------------------- */

#define QUEUE_WAIT "pjserve_model_queue_wait_seconds"
#define BATCH_ROWS "pjserve_model_batch_rows"

static int render_queue_wait(const pjs_metrics_model *models, size_t n, pjs_http_buf *b,
                             pjs_error *err)
{
    int rc = family_header(b, QUEUE_WAIT,
                           "Time requests waited in the queue before their execution started, "
                           "in seconds",
                           "summary", err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const pjs_metrics_model *m = &models[i];
        for (size_t q = 0; rc == 0 && q < PJS_METRICS_QUANTILES; q++) {
            char label[32];
            snprintf(label, sizeof label, ",quantile=\"%g\"", pjs_metrics_quantiles[q]);
            rc = model_sample(b, QUEUE_WAIT, m, label, real(m->queue_wait_us[q] / 1e6), err);
        }
        if (rc == 0)
            rc = model_sample(b, QUEUE_WAIT "_sum", m, "", seconds(m->stats.queue.ns), err);
        if (rc == 0)
            rc = model_sample(b, QUEUE_WAIT "_count", m, "", count(m->stats.queue.count), err);
    }
    return rc;
}

/* Executions that served at most `rows` rows. */
static uint64_t executions_up_to(const pjs_model_stats *st, int64_t rows)
{
    uint64_t n = 0;
    for (size_t k = 0; k < st->n_batch; k++)
        if (st->batch[k].batch_size <= rows)
            n += st->batch[k].compute_infer.count;
    return n;
}

static int render_batch_rows(const pjs_metrics_model *models, size_t n, pjs_http_buf *b,
                             pjs_error *err)
{
    int rc = family_header(b, BATCH_ROWS,
                           "Rows (batch elements) served per execution, before padding to a "
                           "compiled batch size; one bucket per compiled batch size",
                           "histogram", err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const pjs_metrics_model *m = &models[i];
        for (size_t j = 0; rc == 0 && j < m->n_batch_sizes; j++) {
            char label[48];
            snprintf(label, sizeof label, ",le=\"%" PRId64 "\"", m->batch_sizes[j]);
            rc = model_sample(b, BATCH_ROWS "_bucket", m, label,
                              count(executions_up_to(&m->stats, m->batch_sizes[j])), err);
        }
        uint64_t rows = 0, executions = 0;
        for (size_t k = 0; k < m->stats.n_batch; k++) {
            const pjs_batch_stat *e = &m->stats.batch[k];
            rows += (uint64_t)e->batch_size * e->compute_infer.count;
            executions += e->compute_infer.count;
        }
        if (rc == 0)
            rc = model_sample(b, BATCH_ROWS "_bucket", m, ",le=\"+Inf\"", count(executions), err);
        if (rc == 0)
            rc = model_sample(b, BATCH_ROWS "_sum", m, "", count(rows), err);
        if (rc == 0)
            rc = model_sample(b, BATCH_ROWS "_count", m, "", count(executions), err);
    }
    return rc;
}

/* ---- server-wide ------------------------------------------------------------------ */

/* One family with one unlabelled sample. */
static int single(pjs_http_buf *b, const char *name, const char *help, const char *type,
                  uint64_t v, pjs_error *err)
{
    int rc = family_header(b, name, help, type, err);
    return rc != 0 ? rc : pjs_http_buf_printf(b, err, "%s %" PRIu64 "\n", name, v);
}

/* Meta runs (the gate of --meta-concurrency) and their scratch pool. */
static int render_meta(const pjs_server_counters *c, pjs_http_buf *b, pjs_error *err)
{
    int rc = single(b, "pjserve_meta_permits",
                    "Meta runs that may be inside their stages at once (--meta-concurrency)",
                    "gauge", c->meta_permits, err);
    if (rc == 0)
        rc = family_header(b, "pjserve_meta_runs_running",
                           "Meta runs executing now: holding a permit (gated) or compute-only",
                           "gauge", err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err,
                                 "pjserve_meta_runs_running{kind=\"gated\"} %" PRIu64
                                 "\npjserve_meta_runs_running{kind=\"compute_only\"} %" PRIu64
                                 "\n",
                                 c->meta_running_gated, c->meta_running_compute);
    if (rc == 0)
        rc = single(b, "pjserve_meta_runs_waiting", "Meta runs waiting for a permit or thread",
                    "gauge", c->meta_waiting, err);
    if (rc == 0)
        rc = single(b, "pjserve_meta_runs_gated_peak",
                    "Most meta runs ever holding a permit at once", "gauge", c->meta_peak_gated,
                    err);
    if (rc == 0)
        rc = single(b, "pjserve_meta_runs_total", "Meta runs that returned", "counter",
                    c->meta_completed, err);
    if (rc == 0)
        rc = single(b, "pjserve_meta_runs_expired_total",
                    "Meta runs dropped at their deadline while waiting for a permit", "counter",
                    c->meta_expired, err);
    if (rc == 0)
        rc = family_header(b, "pjserve_meta_scratch_bytes",
                           "The meta scratch pool: its budget (--meta-scratch-bytes; 0: plain "
                           "memory), bytes held now and the most ever held",
                           "gauge", err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err,
                                 "pjserve_meta_scratch_bytes{state=\"budget\"} %" PRIu64
                                 "\npjserve_meta_scratch_bytes{state=\"used\"} %" PRIu64
                                 "\npjserve_meta_scratch_bytes{state=\"peak\"} %" PRIu64 "\n",
                                 c->scratch_budget_bytes, c->scratch_used_bytes,
                                 c->scratch_peak_bytes);
    if (rc == 0)
        rc = family_header(b, "pjserve_meta_scratch_waits_total",
                           "Scratch acquisitions that waited for room, and those whose deadline "
                           "passed first",
                           "counter", err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err,
                                 "pjserve_meta_scratch_waits_total{outcome=\"served\"} %" PRIu64
                                 "\npjserve_meta_scratch_waits_total{outcome=\"timed_out\"} "
                                 "%" PRIu64 "\n",
                                 c->scratch_waited, c->scratch_timed_out);
    return rc;
}

static int render_server(const pjs_metrics_gauges *g, pjs_http_buf *b, pjs_error *err)
{
    int rc = g->server != NULL ? render_meta(g->server, b, err) : 0;
    if (rc == 0)
        rc = family_header(b, "pjserve_queue_depth", "Requests waiting in the dispatcher queue",
                           "gauge", err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err, "pjserve_queue_depth %" PRIu64 "\n", g->queue_depth);
    if (rc == 0)
        rc = family_header(b, "pjserve_requests_in_flight",
                           "Requests accepted and not yet answered", "gauge", err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err, "pjserve_requests_in_flight %" PRIu64 "\n",
                                 g->in_flight);
    if (rc == 0)
        rc = family_header(b, "pjserve_device_plans_total",
                           "Plans (one execution, or requests dropped at their deadline) by "
                           "who held the device: the thread that submitted a request when the "
                           "device was free (request_thread), else a dispatcher worker",
                           "counter", err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err,
                                 "pjserve_device_plans_total{owner=\"request_thread\"} %" PRIu64
                                 "\npjserve_device_plans_total{owner=\"worker\"} %" PRIu64 "\n",
                                 g->plans_inline, g->plans_worker);
    if (rc == 0 && g->server != NULL)
        rc = family_header(b, "pjserve_weight_prefetches_total",
                           "Copies of a cold model's weights started while another model "
                           "executed, so that it runs next without waiting for its load",
                           "counter", err);
    if (rc == 0 && g->server != NULL)
        rc = pjs_http_buf_printf(b, err, "pjserve_weight_prefetches_total %" PRIu64 "\n",
                                 g->server->weight_prefetches);
    if (rc == 0 && g->server != NULL)
        rc = family_header(b, "pjserve_cuda_shm_device_bytes_total",
                           "Bytes of CUDA shared memory used on the device itself: inputs "
                           "executed on in place, outputs written device to device",
                           "counter", err);
    if (rc == 0 && g->server != NULL)
        rc = pjs_http_buf_printf(b, err,
                                 "pjserve_cuda_shm_device_bytes_total{direction=\"input\"} "
                                 "%" PRIu64 "\npjserve_cuda_shm_device_bytes_total"
                                 "{direction=\"output\"} %" PRIu64 "\n",
                                 g->server->shm_device_in_bytes, g->server->shm_device_out_bytes);
    if (rc == 0 && g->server != NULL)
        rc = family_header(b, "pjserve_trace_spans_total",
                           "Spans of sampled requests: exported to the collector, or dropped "
                           "because the export queue was full or the collector refused them",
                           "counter", err);
    if (rc == 0 && g->server != NULL)
        rc = pjs_http_buf_printf(
            b, err,
            "pjserve_trace_spans_total{outcome=\"exported\"} %" PRIu64 "\n"
            "pjserve_trace_spans_total{outcome=\"dropped_queue_full\"} %" PRIu64 "\n"
            "pjserve_trace_spans_total{outcome=\"dropped_export_failed\"} %" PRIu64 "\n",
            g->server->trace_spans_exported, g->server->trace_spans_dropped_full,
            g->server->trace_spans_dropped_failed);
    if (rc == 0)
        rc = family_header(b, "pjserve_scheduler_info",
                           "The scheduler's discipline (the value is always 1)", "gauge", err);
    if (rc == 0 && g->discipline != NULL) {
        rc = pjs_http_buf_append_str(b, "pjserve_scheduler_info{discipline=", err);
        if (rc == 0)
            rc = label_value(b, g->discipline, err);
        if (rc == 0)
            rc = pjs_http_buf_append_str(b, "} 1\n", err);
    }
    return rc;
}

/* One family of one unlabelled sample. */
/* A family of one server-wide sample of `type`. */
static int server_sample(pjs_http_buf *b, const char *name, const char *help, const char *type,
                         metric_value v, pjs_error *err)
{
    int rc = family_header(b, name, help, type, err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err, "%s ", name);
    if (rc == 0)
        rc = put_value(b, v, err);
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "\n", err);
    return rc;
}

static int server_gauge(pjs_http_buf *b, const char *name, const char *help, metric_value v,
                        pjs_error *err)
{
    return server_sample(b, name, help, "gauge", v, err);
}

/* ---- many models: the ones that matter, and totals --------------------------- */

/* Whether a matters more than b (see pjs_metrics_select). */
static bool matters_more(const pjs_metrics_model *a, const pjs_metrics_model *b)
{
    bool a_busy = a->sched.in_flight > 0, b_busy = b->sched.in_flight > 0;
    if (a_busy != b_busy)
        return a_busy;
    if (a->residency.resident != b->residency.resident)
        return a->residency.resident;
    if (a->sched.recent_utilization != b->sched.recent_utilization)
        return a->sched.recent_utilization > b->sched.recent_utilization;
    if (a->stats.last_inference_ms != b->stats.last_inference_ms)
        return a->stats.last_inference_ms > b->stats.last_inference_ms;
    return strcmp(a->name, b->name) < 0;
}

static int by_importance(const void *x, const void *y)
{
    const pjs_metrics_model *a = x, *b = y;
    return matters_more(a, b) ? -1 : matters_more(b, a) ? 1 : 0;
}

static int by_name(const void *x, const void *y)
{
    return strcmp(((const pjs_metrics_model *)x)->name, ((const pjs_metrics_model *)y)->name);
}

size_t pjs_metrics_select(pjs_metrics_model *models, size_t n, size_t limit,
                          pjs_metrics_totals *totals)
{
    *totals = (pjs_metrics_totals){.models = n};
    for (size_t i = 0; i < n; i++) {
        const pjs_model_stats *s = &models[i].stats;
        totals->success += s->success.count;
        totals->failure += s->fail.count;
        totals->inferences += s->inference_count;
        totals->executions += s->execution_count;
        totals->request_ns += s->success.ns;
        totals->queue_ns += s->queue.ns;
    }
    size_t shown = n;
    if (limit > 0 && n > limit) {
        qsort(models, n, sizeof *models, by_importance);
        shown = limit;
        qsort(models, shown, sizeof *models, by_name);
    }
    totals->shown = shown;
    return shown;
}

/* Executed requests by the tier their model was in, as a histogram with
 * pjs_queue_wait_bucket's buckets (bucket i ends at 2^(i/4) us), four per
 * octave of microseconds from 1 us to 16.8 s: three series, and tail latencies per tier read to within
 * a fifth (one bucket per octave would leave a p99 anywhere in 1-2 ms). */
static int render_tiers(const pjs_tier_stats *t, pjs_http_buf *b, pjs_error *err)
{
    static const char name[] = "pjserve_request_tier_seconds";
    int rc = family_header(b, name,
                           "Time from received to executed of requests, by the tier their "
                           "model's weights were in when the request was queued (device, "
                           "host memory, or only the bundle's file)",
                           "histogram", err);
    for (int tier = 0; rc == 0 && tier < PJS_N_TIERS; tier++) {
        const char *tn = pjs_tier_name((pjs_tier)tier);
        uint64_t below = 0;
        for (size_t i = 0; rc == 0 && i + 1 < PJS_QUEUE_WAIT_BUCKETS; i++) {
            below += t->buckets[tier][i];
            rc = pjs_http_buf_printf(b, err, "%s_bucket{tier=\"%s\",le=\"%.9g\"} %" PRIu64 "\n",
                                     name, tn, exp2((double)i / 4.0) / 1e6, below);
        }
        if (rc == 0)
            rc = pjs_http_buf_printf(b, err,
                                     "%s_bucket{tier=\"%s\",le=\"+Inf\"} %" PRIu64 "\n"
                                     "%s_sum{tier=\"%s\"} %.9g\n%s_count{tier=\"%s\"} %" PRIu64
                                     "\n",
                                     name, tn, t->requests[tier], name, tn,
                                     (double)t->ns[tier] / 1e9, name, tn, t->requests[tier]);
    }
    return rc;
}

static int render_totals(const pjs_metrics_totals *t, pjs_http_buf *b, pjs_error *err)
{
    int rc = server_gauge(b, "pjserve_models_loaded", "Models loaded", count(t->models), err);
    if (rc == 0)
        rc = server_gauge(b, "pjserve_models_with_series",
                          "Models with series of their own in this exposition (the rest are in "
                          "the pjserve_all_models_* totals only; --metrics-models)",
                          count(t->shown), err);
    if (rc == 0)
        rc = family_header(b, "pjserve_all_models_requests_total",
                           "Inference requests of every model loaded, by outcome", "counter",
                           err);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err,
                                 "pjserve_all_models_requests_total{outcome=\"success\"} %" PRIu64
                                 "\npjserve_all_models_requests_total{outcome=\"failure\"} %" PRIu64
                                 "\n",
                                 t->success, t->failure);
    if (rc == 0)
        rc = server_sample(b, "pjserve_all_models_inferences_total",
                           "Inferences (batch elements) of every model loaded", "counter",
                           count(t->inferences), err);
    if (rc == 0)
        rc = server_sample(b, "pjserve_all_models_executions_total",
                           "Device executions of every model loaded", "counter",
                           count(t->executions), err);
    if (rc == 0)
        rc = server_sample(b, "pjserve_all_models_request_seconds_total",
                           "Time of every model's successful requests, received to answered",
                           "counter", seconds(t->request_ns), err);
    if (rc == 0)
        rc = server_sample(b, "pjserve_all_models_queue_seconds_total",
                           "Time every model's successful requests waited in queues", "counter",
                           seconds(t->queue_ns), err);
    return rc;
}

static int render_weight_cache(const pjs_weight_cache_info *c, pjs_http_buf *b, pjs_error *err)
{
    metric_value budget = c->budget_bytes == UINT64_MAX ? real(INFINITY) : count(c->budget_bytes);
    int rc = server_gauge(b, "pjserve_weight_cache_budget_bytes",
                          "Device memory the weight cache may fill with evictable models' "
                          "weights (+Inf: unlimited)",
                          budget, err);
    if (rc == 0)
        rc = server_gauge(b, "pjserve_weight_cache_used_bytes",
                          "Bytes of evictable models' weights on the device now",
                          count(c->used_bytes), err);
    if (rc == 0)
        rc = server_gauge(b, "pjserve_weight_cache_pinned_bytes",
                          "Bytes of device-pinned models' weights on the device (outside the "
                          "budget)",
                          count(c->pinned_bytes), err);
    metric_value host_budget =
        c->host_budget_bytes == UINT64_MAX ? real(INFINITY) : count(c->host_budget_bytes);
    if (rc == 0)
        rc = server_gauge(b, "pjserve_host_weight_budget_bytes",
                          "Host memory the host tier may fill with host models' floors "
                          "(+Inf: no host tier, every floor kept)",
                          host_budget, err);
    if (rc == 0)
        rc = server_gauge(b, "pjserve_host_weight_used_bytes",
                          "Bytes of host models' floors in host memory under the budget (0 "
                          "without a host tier)",
                          count(c->host_used_bytes), err);
    if (rc == 0)
        rc = server_gauge(b, "pjserve_host_weight_pinned_bytes",
                          "Bytes of device-pinned models' floors kept in host memory by the "
                          "host tier (outside its budget)",
                          count(c->host_pinned_bytes), err);
    return rc;
}

int pjs_metrics_render(const pjs_metrics_model *models, size_t n, const pjs_metrics_gauges *g,
                       pjs_http_buf *out, pjs_error *err)
{
    int rc = render_families(triton_families, sizeof triton_families / sizeof *triton_families,
                             models, n, out, err);
    if (rc == 0)
        rc = render_families(pjserve_families,
                             sizeof pjserve_families / sizeof *pjserve_families, models, n, out,
                             err);
    if (rc == 0)
        rc = render_queue_wait(models, n, out, err);
    if (rc == 0)
        rc = render_batch_rows(models, n, out, err);
    if (rc == 0)
        rc = render_server(g, out, err);
    if (rc == 0)
        rc = render_weight_cache(&g->cache, out, err);
    if (rc == 0)
        rc = render_totals(&g->totals, out, err);
    if (rc == 0 && g->server != NULL)
        rc = render_tiers(&g->server->tiers, out, err);
    return rc;
}
