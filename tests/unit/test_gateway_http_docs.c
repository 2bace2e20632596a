/*
 * test_gateway_http_docs.c - unit tests of what the gateway's HTTP proxy
 * reads and writes of relayed bytes (src/gateway/http_docs.c): metrics of
 * two workers merged family by family under a worker label (HELP and TYPE
 * once, histogram samples kept with their family, labels before others or
 * added, odd lines dropped, the output bound kept); repository indexes
 * merged (each model once, READY from any worker); statistics summed per
 * model and batch size; the sequence id found past tensors and strings,
 * absent, zero, and in malformed bytes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "gateway/http_docs.h"

static char *merge_metrics(const char *a, const char *b, size_t limit, int *rc)
{
    pjs_gw_metrics_text texts[2] = {{a, strlen(a), 0}, {b, strlen(b), 1}};
    pjs_http_buf out;
    pjs_error err;
    pjs_http_buf_init(&out, limit);
    *rc = pjs_gw_metrics_merge(texts, 2, &out, &err);
    size_t len;
    char *text = pjs_http_buf_take(&out, &len);
    pjs_http_buf_free(&out);
    return text;
}

static void metrics_grouped_by_family_with_worker_labels(void **state)
{
    (void)state;
    const char *w0 = "# HELP reqs Requests\n"
                     "# TYPE reqs counter\n"
                     "reqs{model=\"a\"} 3\n"
                     "reqs{model=\"b\"} 4\n"
                     "# HELP lat Latency\n"
                     "# TYPE lat histogram\n"
                     "lat_bucket{le=\"1\"} 1\n"
                     "lat_sum 0.5\n"
                     "lat_count 1\n"
                     "up 1\n";
    const char *w1 = "# HELP reqs Requests\n"
                     "# TYPE reqs counter\n"
                     "reqs{model=\"a\"} 7\r\n"
                     "# a comment dropped\n"
                     "\n"
                     "{bad} 1\n"
                     "# HELP lat Latency\n"
                     "# TYPE lat histogram\n"
                     "lat_bucket{le=\"1\"} 2\n"
                     "lat_sum 1.5\n"
                     "lat_count 2\n"
                     "empty{} 0\n";
    int rc;
    char *text = merge_metrics(w0, w1, 1 << 20, &rc);
    assert_int_equal(rc, 0);
    const char *want = "# HELP reqs Requests\n"
                       "# TYPE reqs counter\n"
                       "reqs{worker=\"0\",model=\"a\"} 3\n"
                       "reqs{worker=\"0\",model=\"b\"} 4\n"
                       "reqs{worker=\"1\",model=\"a\"} 7\n"
                       "# HELP lat Latency\n"
                       "# TYPE lat histogram\n"
                       "lat_bucket{worker=\"0\",le=\"1\"} 1\n"
                       "lat_sum{worker=\"0\"} 0.5\n"
                       "lat_count{worker=\"0\"} 1\n"
                       "lat_bucket{worker=\"1\",le=\"1\"} 2\n"
                       "lat_sum{worker=\"1\"} 1.5\n"
                       "lat_count{worker=\"1\"} 2\n"
                       "up{worker=\"0\"} 1\n"
                       "empty{worker=\"1\"} 0\n";
    assert_string_equal(text, want);
    free(text);
}

static void metrics_output_bound_is_kept(void **state)
{
    (void)state;
    int rc;
    char *text = merge_metrics("a 1\nb 2\n", "c 3\n", 20, &rc);
    assert_int_equal(rc, PJS_ERR_RESOURCE_EXHAUSTED);
    free(text);
}

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *doc = json_loads(s, 0, &e);
    assert_non_null(doc);
    return doc;
}

static void index_lists_each_model_once_ready_from_any(void **state)
{
    (void)state;
    json_t *docs[3] = {
        parse("[{\"name\":\"a\",\"version\":\"1\",\"state\":\"UNAVAILABLE\",\"reason\":\"x\"},"
              " {\"name\":\"b\",\"version\":\"1\",\"state\":\"READY\",\"reason\":\"\"}, 5]"),
        parse("[{\"name\":\"a\",\"version\":\"1\",\"state\":\"READY\",\"reason\":\"\"},"
              " {\"name\":\"c\",\"version\":\"1\",\"state\":\"READY\",\"reason\":\"\"},"
              " {\"version\":\"1\"}]"),
        parse("{\"error\": \"not an index\"}"),
    };
    json_t *merged = pjs_gw_merge_index(docs, 3);
    json_t *want = parse("[{\"name\":\"a\",\"version\":\"1\",\"state\":\"READY\",\"reason\":\"\"},"
                         " {\"name\":\"b\",\"version\":\"1\",\"state\":\"READY\",\"reason\":\"\"},"
                         " {\"name\":\"c\",\"version\":\"1\",\"state\":\"READY\",\"reason\":\"\"}]");
    assert_true(json_equal(merged, want));
    json_decref(want);
    json_decref(merged);
    for (int i = 0; i < 3; i++)
        json_decref(docs[i]);
}

static void stats_summed_per_model_and_batch_size(void **state)
{
    (void)state;
    json_t *docs[2] = {
        parse("{\"model_stats\":[{\"name\":\"a\",\"version\":\"1\",\"last_inference\":100,"
              "\"inference_count\":2,\"execution_count\":1,"
              "\"inference_stats\":{\"success\":{\"count\":2,\"ns\":50}},"
              "\"batch_stats\":[{\"batch_size\":1,\"compute_infer\":{\"count\":1,\"ns\":10}}]}]}"),
        parse("{\"model_stats\":[{\"name\":\"a\",\"version\":\"1\",\"last_inference\":90,"
              "\"inference_count\":3,\"execution_count\":3,"
              "\"inference_stats\":{\"success\":{\"count\":3,\"ns\":70}},"
              "\"batch_stats\":[{\"batch_size\":1,\"compute_infer\":{\"count\":2,\"ns\":5}},"
              "{\"batch_size\":4,\"compute_infer\":{\"count\":1,\"ns\":9}}]},"
              "{\"name\":\"b\",\"version\":\"1\",\"inference_count\":1}]}"),
    };
    json_t *merged = pjs_gw_merge_stats(docs, 2);
    json_t *want = parse(
        "{\"model_stats\":[{\"name\":\"a\",\"version\":\"1\",\"last_inference\":100,"
        "\"inference_count\":5,\"execution_count\":4,"
        "\"inference_stats\":{\"success\":{\"count\":5,\"ns\":120}},"
        "\"batch_stats\":[{\"batch_size\":1,\"compute_infer\":{\"count\":3,\"ns\":15}},"
        "{\"batch_size\":4,\"compute_infer\":{\"count\":1,\"ns\":9}}]},"
        "{\"name\":\"b\",\"version\":\"1\",\"inference_count\":1}]}");
    assert_true(json_equal(merged, want));
    json_decref(want);
    json_decref(merged);
    json_decref(docs[0]);
    json_decref(docs[1]);
}

static int key_of(const char *json, char *out, size_t size)
{
    return pjs_gw_sequence_key(json, strlen(json), out, size);
}

static void sequence_id_found_past_tensors(void **state)
{
    (void)state;
    char key[32];
    assert_int_equal(key_of("{\"inputs\":[{\"name\":\"x\",\"data\":[1,2,[3,\"]}\\\"\"]]}],"
                            " \"id\":\"r\", \"parameters\" : {\"priority\":1,"
                            " \"sequence_id\": 42, \"sequence_start\": true}}",
                            key, sizeof key),
                     1);
    assert_string_equal(key, "42");
    assert_int_equal(key_of("{\"parameters\":{\"sequence_id\":\"abc\"},\"inputs\":[]}", key,
                            sizeof key),
                     1);
    assert_string_equal(key, "abc");
}

static void sequence_id_absent_zero_or_unusable(void **state)
{
    (void)state;
    char key[8];
    assert_int_equal(key_of("{\"inputs\":[]}", key, sizeof key), 0);
    assert_int_equal(key_of("{\"parameters\":{\"sequence_id\":0}}", key, sizeof key), 0);
    assert_int_equal(key_of("{\"parameters\":{\"sequence_id\":\"\"}}", key, sizeof key), 0);
    assert_int_equal(key_of("{\"parameters\":{\"sequence_id\":true}}", key, sizeof key), 0);
    assert_int_equal(key_of("{\"parameters\":{\"sequence_id\":\"much too long\"}}", key,
                            sizeof key),
                     0);
    assert_int_equal(key_of("{\"inputs\": [1, 2", key, sizeof key), -1);
    assert_int_equal(key_of("[1]", key, sizeof key), -1);
    assert_int_equal(key_of("{\"parameters\":{\"sequence_id\":\"x\\", key, sizeof key), -1);
    assert_int_equal(key_of("", key, sizeof key), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(metrics_grouped_by_family_with_worker_labels),
        cmocka_unit_test(metrics_output_bound_is_kept),
        cmocka_unit_test(index_lists_each_model_once_ready_from_any),
        cmocka_unit_test(stats_summed_per_model_and_batch_size),
        cmocka_unit_test(sequence_id_found_past_tensors),
        cmocka_unit_test(sequence_id_absent_zero_or_unusable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
