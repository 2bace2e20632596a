/*
 * metrics_render.c - Prometheus text for the metrics endpoint (see
 * metrics_render.h).
 *
 * One table lists the per-model families; each family is written as its
 * # HELP and # TYPE lines followed by one sample per model. Label values are
 * escaped as the exposition format requires (backslash, quote, newline).
 */
#include "frontend/http/metrics_render.h"

#include <inttypes.h>

typedef struct model_family {
    const char *name;
    const char *help;
    uint64_t (*value)(const pjs_model_stats *st);
} model_family;

static uint64_t ns_to_us(uint64_t ns)
{
    return ns / 1000u;
}

static uint64_t request_success(const pjs_model_stats *st) { return st->success.count; }
static uint64_t request_failure(const pjs_model_stats *st) { return st->fail.count; }
static uint64_t inference_count(const pjs_model_stats *st) { return st->inference_count; }
static uint64_t exec_count(const pjs_model_stats *st) { return st->execution_count; }
static uint64_t request_us(const pjs_model_stats *st) { return ns_to_us(st->success.ns); }
static uint64_t queue_us(const pjs_model_stats *st) { return ns_to_us(st->queue.ns); }
static uint64_t input_us(const pjs_model_stats *st) { return ns_to_us(st->compute_input.ns); }
static uint64_t infer_us(const pjs_model_stats *st) { return ns_to_us(st->compute_infer.ns); }
static uint64_t output_us(const pjs_model_stats *st) { return ns_to_us(st->compute_output.ns); }

static const model_family model_families[] = {
    {"nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     request_success},
    {"nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     request_failure},
    {"nv_inference_count", "Number of inferences performed (batch elements)", inference_count},
    {"nv_inference_exec_count", "Number of model executions performed", exec_count},
    {"nv_inference_request_duration_us",
     "Cumulative duration of successful inference requests in microseconds", request_us},
    {"nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     queue_us},
    {"nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds", input_us},
    {"nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds", infer_us},
    {"nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds", output_us},
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

static int render_family(const model_family *f, const pjs_metrics_model *models, size_t n,
                         pjs_http_buf *b, pjs_error *err)
{
    int rc = family_header(b, f->name, f->help, "counter", err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = pjs_http_buf_printf(b, err, "%s{model=", f->name);
        if (rc == 0)
            rc = label_value(b, models[i].name, err);
        if (rc == 0)
            rc = pjs_http_buf_append_str(b, ",version=", err);
        if (rc == 0)
            rc = label_value(b, models[i].version, err);
        if (rc == 0)
            rc = pjs_http_buf_printf(b, err, "} %" PRIu64 "\n", f->value(&models[i].stats));
    }
    return rc;
}

int pjs_metrics_render(const pjs_metrics_model *models, size_t n, const pjs_metrics_gauges *g,
                       pjs_http_buf *out, pjs_error *err)
{
    int rc = 0;
    for (size_t f = 0; rc == 0 && f < sizeof model_families / sizeof *model_families; f++)
        rc = render_family(&model_families[f], models, n, out, err);
    if (rc == 0)
        rc = family_header(out, "pjserve_queue_depth", "Requests waiting in the dispatcher queue",
                           "gauge", err);
    if (rc == 0)
        rc = pjs_http_buf_printf(out, err, "pjserve_queue_depth %" PRIu64 "\n", g->queue_depth);
    if (rc == 0)
        rc = family_header(out, "pjserve_requests_in_flight",
                           "Requests accepted and not yet answered", "gauge", err);
    if (rc == 0)
        rc = pjs_http_buf_printf(out, err, "pjserve_requests_in_flight %" PRIu64 "\n",
                                 g->in_flight);
    return rc;
}
