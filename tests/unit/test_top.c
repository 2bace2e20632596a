/*
 * test_top.c - what `pjserve top` reads and shows, without a server: the
 * strict Prometheus text reader (samples, labels, escapes, numbers, and
 * every refusal with its line), snapshots built from pjserve's metrics
 * (one serve process, and several workers behind a gateway), rates between
 * two snapshots, sorting and filtering, the control and node documents,
 * the screen's text (no control bytes from the server in it) and the JSON
 * view.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/prom_text.h"
#include "cli/top_view.h"

static int parse(const char *text, pjs_prom_doc *doc, pjs_error *err)
{
    return pjs_prom_parse(text, strlen(text), doc, err);
}

/* ---- the reader ----------------------------------------------------------------- */

static void reads_samples_labels_and_values(void **state)
{
    (void)state;
    const char *text = "# HELP a_total Things, counted\n"
                       "# TYPE a_total counter\n"
                       "a_total{model=\"mlp\",version=\"1\"} 42\n"
                       "\n"
                       "b:rule 1.5e3 1700000000000\n"
                       "c{ x = \"q\\\"\\\\\\n\" , } -Inf\n"
                       "d NaN\n"
                       "e{} +Inf\n"
                       "# a free comment { with \" anything\n"
                       "f -0.25";
    pjs_prom_doc doc;
    pjs_error err;
    assert_int_equal(parse(text, &doc, &err), 0);
    assert_int_equal(doc.n_samples, 6);
    assert_string_equal(doc.samples[0].name, "a_total");
    assert_int_equal(doc.samples[0].n_labels, 2);
    assert_string_equal(pjs_prom_label_value(&doc.samples[0], "model"), "mlp");
    assert_string_equal(pjs_prom_label_value(&doc.samples[0], "version"), "1");
    assert_null(pjs_prom_label_value(&doc.samples[0], "worker"));
    assert_true(doc.samples[0].value == 42);
    assert_string_equal(doc.samples[1].name, "b:rule");
    assert_true(doc.samples[1].value == 1500);
    assert_string_equal(pjs_prom_label_value(&doc.samples[2], "x"), "q\"\\\n");
    assert_true(isinf(doc.samples[2].value) && doc.samples[2].value < 0);
    assert_true(isnan(doc.samples[3].value));
    assert_int_equal(doc.samples[4].n_labels, 0);
    assert_true(isinf(doc.samples[4].value) && doc.samples[4].value > 0);
    assert_true(doc.samples[5].value == -0.25);
    pjs_prom_free(&doc);
}

static void refuses_what_is_not_the_format(void **state)
{
    (void)state;
    static const struct {
        const char *text, *message;
    } bad[] = {
        {"ok 1\n9bad 1\n", "line 2: expected a metric name"},
        {"a{model=\"x} 1\n", "line 1: a label value is not closed"},
        {"a{model=x} 1\n", "line 1: a label value must be in double quotes"},
        {"a{model=\"x\\t\"} 1\n", "line 1: a label value has an escape other than"},
        {"a{m=\"1\",m=\"2\"} 1\n", "line 1: a label is given twice"},
        {"a{m=\"1\" n=\"2\"} 1\n", "line 1: expected ',' or '}'"},
        {"a{1m=\"1\"} 1\n", "line 1: expected a label name"},
        {"a{m \"1\"} 1\n", "line 1: expected '=' after a label name"},
        {"a 0x10\n", "line 1: the value is not a number"},
        {"a inf\n", "line 1: the value is not a number"},
        {"a 1e\n", "line 1: the value is not a number"},
        {"a .\n", "line 1: the value is not a number"},
        {"a\n", "line 1: expected a blank and a value"},
        {"a \n", "line 1: the value is not a number"},
        {"a 1 12x\n", "line 1: the timestamp is not an integer"},
        {"a 1 12 more\n", "line 1: unexpected text after the sample's timestamp"},
        {"a{m=\"1\"}1\n", "line 1: expected a blank and a value"},
        {"a 1\r\n", "line 1: a carriage return ends the line"},
        {"# TYPE a countr\n", "line 1: # TYPE must be counter, gauge"},
        {"# TYPE 9a counter\n", "line 1: # TYPE must name a metric"},
        {"# HELP\n", "line 1: # HELP must name a metric"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pjs_prom_doc doc;
        pjs_error err;
        int rc = parse(bad[i].text, &doc, &err);
        if (rc != PJS_ERR_INVALID_ARGUMENT || strstr(err.msg, bad[i].message) == NULL)
            fail_msg("%s: got %d '%s', want '%s'", bad[i].text, rc, err.msg, bad[i].message);
        pjs_prom_free(&doc);
    }
}

static void refuses_nul_and_too_many_labels(void **state)
{
    (void)state;
    pjs_prom_doc doc;
    pjs_error err;
    assert_int_equal(pjs_prom_parse("a 1\n\0b 2\n", 9, &doc, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "NUL"));
    pjs_prom_free(&doc);
    char text[4096] = "a{";
    for (int i = 0; i <= PJS_PROM_MAX_LABELS; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "l%d=\"v\",", i);
    strcat(text, "} 1\n");
    assert_int_equal(parse(text, &doc, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "labels"));
    pjs_prom_free(&doc);
}

/* ---- snapshots and the view ----------------------------------------------------- */

/* pjserve's families for two models (mlp resident, big not) at scale k. */
static char *server_metrics(const char *worker, double k)
{
    char *text = NULL;
    char w[32] = "";
    if (worker != NULL)
        snprintf(w, sizeof w, "worker=\"%s\",", worker);
    int n = asprintf(
        &text,
        "# TYPE nv_inference_request_success counter\n"
        "nv_inference_request_success{%smodel=\"mlp\",version=\"1\"} %g\n"
        "nv_inference_request_success{%smodel=\"big\",version=\"1\"} %g\n"
        "nv_inference_request_failure{%smodel=\"mlp\",version=\"1\"} 0\n"
        "nv_inference_request_duration_us{%smodel=\"mlp\",version=\"1\"} %g\n"
        "nv_inference_request_duration_us{%smodel=\"big\",version=\"1\"} %g\n"
        "nv_inference_queue_duration_us{%smodel=\"mlp\",version=\"1\"} %g\n"
        "pjserve_model_device_seconds_total{%smodel=\"mlp\",version=\"1\"} %g\n"
        "pjserve_model_device_seconds_total{%smodel=\"big\",version=\"1\"} %g\n"
        "pjserve_model_queue_depth{%smodel=\"mlp\",version=\"1\"} 3\n"
        "pjserve_model_requests_in_flight{%smodel=\"mlp\",version=\"1\"} 4\n"
        "pjserve_model_queue_wait_seconds{%smodel=\"mlp\",version=\"1\",quantile=\"0.5\"} "
        "0.001\n"
        "pjserve_model_queue_wait_seconds{%smodel=\"mlp\",version=\"1\",quantile=\"0.99\"} "
        "0.004\n"
        "pjserve_weight_loads_total{%smodel=\"big\",version=\"1\"} %g\n"
        "pjserve_weight_evictions_total{%smodel=\"big\",version=\"1\"} %g\n"
        "pjserve_weight_resident_bytes{%smodel=\"mlp\",version=\"1\"} 2704\n"
        "pjserve_weight_resident_bytes{%smodel=\"big\",version=\"1\"} 0\n"
        "pjserve_queue_depth{%s} 3\n"
        "pjserve_scheduler_info{%sdiscipline=\"fair\"} 1\n"
        "pjserve_weight_prefetches_total{%s} %g\n"
        "pjserve_weight_cache_budget_bytes{%s} 1048576\n"
        "pjserve_weight_cache_used_bytes{%s} 524288\n"
        "pjserve_weight_cache_pinned_bytes{%s} 0\n",
        w, 100 * k, w, 10 * k, w, w, 1000 * k, w, 10000 * k, w, 50 * k, w, 0.2 * k, w, 0.3 * k,
        w, w, w, w, w, 4 * k, w, 4 * k, w, w, w, w, w, 2 * k, w, w, w);
    assert_true(n > 0);
    return text;
}

static void snapshot_of(const char *text, double at, pjs_top_snapshot *s)
{
    pjs_prom_doc doc;
    pjs_error err;
    assert_int_equal(parse(text, &doc, &err), 0);
    assert_int_equal(pjs_top_snapshot_from_metrics(&doc, at, s, &err), 0);
    pjs_prom_free(&doc);
}

static const pjs_top_row *row_named(const pjs_top_view *v, const char *name)
{
    for (size_t i = 0; i < v->n_rows; i++)
        if (strcmp(v->rows[i].model->name, name) == 0)
            return &v->rows[i];
    return NULL;
}

static void rates_between_two_scrapes(void **state)
{
    (void)state;
    char *t0 = server_metrics(NULL, 1), *t1 = server_metrics(NULL, 3);
    pjs_top_snapshot a, b;
    snapshot_of(t0, 10, &a);
    snapshot_of(t1, 12, &b);
    assert_int_equal(b.n_models, 2);
    assert_string_equal(b.models[0].name, "big"); /* sorted by name */
    assert_string_equal(b.discipline, "fair");
    pjs_top_options o = {.sort = PJS_TOP_COL_RATE};
    pjs_top_view v;
    pjs_error err;
    assert_int_equal(pjs_top_view_build(&a, &b, &o, &v, &err), 0);
    assert_true(v.interval_s == 2);
    const pjs_top_row *mlp = row_named(&v, "mlp"), *big = row_named(&v, "big");
    assert_ptr_equal(&v.rows[0], mlp); /* the most requests first */
    assert_true(fabs(mlp->rate - 100) < 1e-9);        /* 200 more in 2 s */
    assert_true(fabs(mlp->latency_ms - 0.01) < 1e-9); /* 2000 us over 200 */
    assert_true(fabs(mlp->queue_ms - 0.0005) < 1e-9);
    assert_true(fabs(mlp->busy - 0.2) < 1e-9);        /* 0.4 s of 2 */
    assert_true(fabs(big->rate - 10) < 1e-9);
    assert_true(fabs(big->loads_rate - 4) < 1e-9);
    assert_true(fabs(big->evictions_rate - 4) < 1e-9);
    assert_true(fabs(v.busy - 0.5) < 1e-9);
    assert_true(fabs(v.loads_rate - 4) < 1e-9 && fabs(v.prefetches_rate - 2) < 1e-9);
    assert_true(v.has_cache && v.budget_bytes == 1048576 && v.used_bytes == 524288);
    assert_true(mlp->model->queue_depth == 3 && mlp->model->qwait_p99_s == 0.004);
    pjs_top_view_free(&v);

    /* By name, reversed; a filter; a counter that went down counts from 0. */
    o = (pjs_top_options){.sort = PJS_TOP_COL_MODEL, .reverse = true};
    assert_int_equal(pjs_top_view_build(&a, &b, &o, &v, &err), 0);
    assert_string_equal(v.rows[0].model->name, "mlp");
    pjs_top_view_free(&v);
    o = (pjs_top_options){.sort = PJS_TOP_COL_LOADS, .filter = "bi"};
    assert_int_equal(pjs_top_view_build(&a, &b, &o, &v, &err), 0);
    assert_int_equal(v.n_rows, 1);
    assert_int_equal(v.n_models, 2);
    pjs_top_view_free(&v);
    o = (pjs_top_options){.sort = PJS_TOP_COL_RATE};
    b.at_s = 8; /* swapped: the newer has less */
    assert_int_equal(pjs_top_view_build(&b, &a, &o, &v, &err), 0);
    assert_true(fabs(row_named(&v, "mlp")->rate - 50) < 1e-9); /* 100 from zero in 2 s */
    pjs_top_view_free(&v);
    pjs_top_snapshot_free(&a);
    pjs_top_snapshot_free(&b);
    free(t0);
    free(t1);
}

static void workers_behind_a_gateway_are_summed(void **state)
{
    (void)state;
    char *w0 = server_metrics("0", 1), *w1 = server_metrics("1", 2);
    char *w0b = server_metrics("0", 2), *w1b = server_metrics("1", 4);
    char *t0, *t1;
    assert_true(asprintf(&t0, "%s%s", w0, w1) > 0 &&
                asprintf(&t1, "%s%spjserve_gateway_worker_ready{worker=\"0\"} 1\n"
                              "pjserve_gateway_worker_ready{worker=\"1\"} 0\n",
                         w0b, w1b) > 0);
    pjs_top_snapshot a, b;
    snapshot_of(t0, 0, &a);
    snapshot_of(t1, 1, &b);
    assert_true(b.gateway);
    assert_int_equal(b.n_workers, 2);
    assert_string_equal(b.workers[0].state, "ready"); /* the gateway's word, until a node's */
    assert_string_equal(b.workers[1].state, "not ready");
    pjs_top_options o = {.sort = PJS_TOP_COL_RATE};
    pjs_top_view v;
    pjs_error err;
    assert_int_equal(pjs_top_view_build(&a, &b, &o, &v, &err), 0);
    const pjs_top_row *mlp = row_named(&v, "mlp");
    assert_true(fabs(mlp->rate - 300) < 1e-9); /* 100 + 200 in 1 s */
    assert_int_equal(mlp->model->workers, 2);
    assert_int_equal(mlp->model->resident_on, 2);
    assert_true(mlp->model->queue_depth == 6);
    assert_true(fabs(v.worker_busy[0] - 0.5) < 1e-9 && fabs(v.worker_busy[1] - 1.0) < 1e-9);
    assert_true(fabs(v.busy - 0.75) < 1e-9);
    assert_true(v.budget_bytes == 2 * 1048576.0);

    json_t *node = json_loads("{\"workers\": [{\"id\": 0, \"device\": \"cpu:0\", \"pid\": 7, "
                              "\"state\": \"ready\", \"restarts\": 1, \"models\": [\"mlp\"]}, "
                              "{\"id\": 1, \"device\": \"cpu:1\", \"pid\": null, \"state\": "
                              "\"restarting\", \"restarts\": 2, \"models\": []}]}",
                              0, NULL);
    pjs_top_snapshot_apply_node(&b, node);
    json_decref(node);
    assert_true(b.node);
    assert_string_equal(b.workers[1].state, "restarting");
    assert_true(b.workers[1].pid == -1 && b.workers[0].pid == 7);
    pjs_top_context ctx = {.url = "http://h:8000", .metrics_url = "http://h:8002/metrics"};
    pjs_top_lines lines;
    assert_int_equal(pjs_top_render(&b, &v, &o, &ctx, 0, &lines, &err), 0);
    bool saw_worker = false;
    for (size_t i = 0; i < lines.n; i++)
        saw_worker |= strstr(lines.line[i], "cpu:1") != NULL &&
                      strstr(lines.line[i], "restarting") != NULL;
    assert_true(saw_worker);
    pjs_top_lines_free(&lines);
    pjs_top_view_free(&v);
    pjs_top_snapshot_free(&a);
    pjs_top_snapshot_free(&b);
    free(w0);
    free(w1);
    free(w0b);
    free(w1b);
    free(t0);
    free(t1);
}

static void screen_and_json(void **state)
{
    (void)state;
    char *t0 = server_metrics(NULL, 1), *t1 = server_metrics(NULL, 2);
    pjs_top_snapshot a, b;
    snapshot_of(t0, 0, &a);
    snapshot_of(t1, 1, &b);
    json_t *control = json_loads("{\"models\": [{\"name\": \"mlp\", \"residency\": \"device\", "
                                 "\"weight_bytes\": 2704}, {\"name\": \"big\", \"residency\": "
                                 "\"unpinned\", \"weight_bytes\": 4194304}, {\"name\": "
                                 "\"gone\", \"state\": \"UNAVAILABLE\"}]}",
                                 0, NULL);
    pjs_top_snapshot_apply_control(&b, control);
    json_decref(control);
    pjs_top_options o = {.sort = PJS_TOP_COL_MODEL};
    pjs_top_view v;
    pjs_error err;
    assert_int_equal(pjs_top_view_build(&a, &b, &o, &v, &err), 0);
    pjs_top_context ctx = {.url = "http://h:8000", .metrics_url = "http://h:8002/metrics",
                           .keys = true};
    pjs_top_lines lines;
    assert_int_equal(pjs_top_render(&b, &v, &o, &ctx, 60, &lines, &err), 0);
    size_t header = 0;
    for (size_t i = 0; i < lines.n; i++) {
        assert_true(strlen(lines.line[i]) <= 60);
        if (strncmp(lines.line[i], "MODEL", 5) == 0)
            header = i;
    }
    assert_true(header > 0 && header + 2 < lines.n);
    assert_non_null(strstr(lines.line[0], "http://h:8000"));
    assert_true(strncmp(lines.line[header + 1], "big ", 4) == 0);
    assert_true(strncmp(lines.line[header + 2], "mlp ", 4) == 0);
    pjs_top_lines_free(&lines);
    assert_int_equal(pjs_top_render(&b, &v, &o, &ctx, 0, &lines, &err), 0);
    for (size_t i = 0; i < lines.n; i++) {
        if (strncmp(lines.line[i], "mlp ", 4) == 0)
            assert_non_null(strstr(lines.line[i], "pinned"));
        if (strncmp(lines.line[i], "big ", 4) == 0)
            assert_non_null(strstr(lines.line[i], "file"));
    }
    pjs_top_lines_free(&lines);
    json_t *doc = pjs_top_view_json(&b, &v, &o, &ctx);
    json_t *models = json_object_get(doc, "models");
    assert_int_equal(json_array_size(models), 2);
    json_t *mlp = json_array_get(models, 1);
    assert_string_equal(json_string_value(json_object_get(mlp, "name")), "mlp");
    assert_string_equal(json_string_value(json_object_get(mlp, "weights")), "pinned");
    assert_true(json_real_value(json_object_get(mlp, "requests_per_s")) == 100);
    assert_int_equal(json_integer_value(json_object_get(mlp, "weight_bytes")), 2704);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(doc, "cache"),
                                                        "budget_bytes")),
                     1048576);
    json_decref(doc);
    pjs_top_view_free(&v);
    pjs_top_snapshot_free(&a);
    pjs_top_snapshot_free(&b);
    free(t0);
    free(t1);
}

static void other_metrics_are_not_a_server(void **state)
{
    (void)state;
    pjs_prom_doc doc;
    pjs_error err;
    assert_int_equal(parse("go_goroutines 12\nprocess_cpu_seconds_total 3\n", &doc, &err), 0);
    pjs_top_snapshot s;
    assert_int_equal(pjs_top_snapshot_from_metrics(&doc, 0, &s, &err),
                     PJS_ERR_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, "no pjserve or Triton metrics"));
    pjs_top_snapshot_free(&s);
    pjs_prom_free(&doc);
}

static void names_cannot_drive_the_terminal(void **state)
{
    (void)state;
    const char *text = "nv_inference_request_success{model=\"evil\\n\x1b[2J\x07\"} 1\n"
                       "pjserve_scheduler_info{discipline=\"\x1b]0;x\x07\"} 1\n";
    pjs_top_snapshot a, b;
    snapshot_of(text, 0, &a);
    snapshot_of(text, 1, &b);
    assert_int_equal(b.n_models, 1);
    assert_string_equal(b.models[0].name, "evil??[2J?");
    assert_string_equal(b.discipline, "?]0;x?");
    json_t *control = json_loads("{\"models\": [{\"name\": \"evil\\n\\u001b[2J\\u0007\", "
                                 "\"residency\": \"HOST\\u001b\"}]}",
                                 0, NULL);
    pjs_top_snapshot_apply_control(&b, control);
    json_decref(control);
    assert_string_equal(b.models[0].residency, "host?");
    pjs_top_options o = {.sort = PJS_TOP_COL_RATE};
    pjs_top_view v;
    pjs_error err;
    assert_int_equal(pjs_top_view_build(&a, &b, &o, &v, &err), 0);
    pjs_top_context ctx = {.url = "http://h:8000", .metrics_url = "http://h:8002/metrics"};
    pjs_top_lines lines;
    assert_int_equal(pjs_top_render(&b, &v, &o, &ctx, 0, &lines, &err), 0);
    for (size_t i = 0; i < lines.n; i++)
        for (const char *c = lines.line[i]; *c != '\0'; c++)
            assert_true((unsigned char)*c >= 0x20 && *c != 0x7f);
    pjs_top_lines_free(&lines);
    pjs_top_view_free(&v);
    pjs_top_snapshot_free(&a);
    pjs_top_snapshot_free(&b);
}

static void columns_by_name(void **state)
{
    (void)state;
    for (int c = 0; c < PJS_TOP_N_COLUMNS; c++)
        assert_int_equal(pjs_top_column_parse(pjs_top_column_name((pjs_top_column)c)), c);
    assert_int_equal(pjs_top_column_parse("RATE"), PJS_TOP_COL_RATE);
    assert_int_equal(pjs_top_column_parse("speed"), -1);
}

/* With a host tier, a model neither on the device nor in host memory is
 * read from its file when it runs next: "file"; the header shows the tier. */
static void host_tier_shows_where_floors_are(void **state)
{
    (void)state;
    char *base = server_metrics(NULL, 1), *t0, *t1;
    const char *host = "pjserve_host_weight_bytes{model=\"mlp\",version=\"1\"} 2752\n"
                       "pjserve_host_weight_bytes{model=\"big\",version=\"1\"} 0\n"
                       "pjserve_host_weight_loads_total{model=\"big\",version=\"1\"} %d\n"
                       "pjserve_host_weight_budget_bytes 65536\n"
                       "pjserve_host_weight_used_bytes 2752\n";
    assert_true(asprintf(&t0, "%s", base) > 0);
    char *extra;
    assert_true(asprintf(&extra, host, 6) > 0);
    assert_true(asprintf(&t1, "%s%s", base, extra) > 0);
    pjs_top_snapshot a, b;
    snapshot_of(t0, 0, &a);
    snapshot_of(t1, 2, &b);
    pjs_top_options o = {.sort = PJS_TOP_COL_MODEL};
    pjs_top_view v;
    pjs_error err;
    assert_int_equal(pjs_top_view_build(&a, &b, &o, &v, &err), 0);
    assert_true(v.has_host_tier && v.host_budget_bytes == 65536 && v.host_used_bytes == 2752);
    assert_true(fabs(v.host_loads_rate - 3) < 1e-9); /* 6 reads in 2 s */
    pjs_top_context ctx = {.url = "http://h:8000", .metrics_url = "http://h:8002/metrics"};
    pjs_top_lines lines;
    assert_int_equal(pjs_top_render(&b, &v, &o, &ctx, 0, &lines, &err), 0);
    bool header = false, big = false;
    for (size_t i = 0; i < lines.n; i++) {
        header = header || strstr(lines.line[i], "host floors 2.7 KiB of 64.0 KiB") != NULL;
        if (strncmp(lines.line[i], "big ", 4) == 0) {
            assert_non_null(strstr(lines.line[i], "file"));
            big = true;
        }
        if (strncmp(lines.line[i], "mlp ", 4) == 0) /* on the device */
            assert_non_null(strstr(lines.line[i], "device"));
    }
    assert_true(header && big);
    pjs_top_lines_free(&lines);
    json_t *doc = pjs_top_view_json(&b, &v, &o, &ctx);
    json_t *tier = json_object_get(doc, "host_tier");
    assert_int_equal(json_integer_value(json_object_get(tier, "budget_bytes")), 65536);
    json_decref(doc);
    pjs_top_view_free(&v);

    /* Without a host tier an evicted model's floor is still in host memory. */
    pjs_top_snapshot c;
    snapshot_of(t0, 4, &c);
    assert_int_equal(pjs_top_view_build(&a, &c, &o, &v, &err), 0);
    assert_false(v.has_host_tier);
    assert_int_equal(pjs_top_render(&c, &v, &o, &ctx, 0, &lines, &err), 0);
    for (size_t i = 0; i < lines.n; i++)
        if (strncmp(lines.line[i], "big ", 4) == 0)
            assert_non_null(strstr(lines.line[i], "host"));
    pjs_top_lines_free(&lines);
    pjs_top_view_free(&v);
    pjs_top_snapshot_free(&a);
    pjs_top_snapshot_free(&b);
    pjs_top_snapshot_free(&c);
    free(base);
    free(extra);
    free(t0);
    free(t1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_samples_labels_and_values),
        cmocka_unit_test(refuses_what_is_not_the_format),
        cmocka_unit_test(refuses_nul_and_too_many_labels),
        cmocka_unit_test(rates_between_two_scrapes),
        cmocka_unit_test(workers_behind_a_gateway_are_summed),
        cmocka_unit_test(screen_and_json),
        cmocka_unit_test(host_tier_shows_where_floors_are),
        cmocka_unit_test(other_metrics_are_not_a_server),
        cmocka_unit_test(names_cannot_drive_the_terminal),
        cmocka_unit_test(columns_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
