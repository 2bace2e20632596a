/*
 * test_trace.c - unit tests of src/trace/trace.c: traceparent parsing and
 * formatting (the W3C specification's valid and invalid forms), ids,
 * sampling (parent-based, and by rate for new traces), the OTLP/HTTP JSON
 * of spans, the bounded export queue, and export to a real HTTP listener
 * on loopback (what it receives is read back as JSON), and to none.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "trace/trace.h"

static const char good[] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

static void test_parse_and_format(void **state)
{
    (void)state;
    pjs_trace_ctx c;
    assert_true(pjs_trace_parse(good, strlen(good), &c));
    assert_true(c.valid && c.sampled);
    assert_int_equal(c.trace_id[0], 0x0a);
    assert_int_equal(c.trace_id[15], 0x9c);
    assert_int_equal(c.span_id[0], 0xb7);
    assert_int_equal(c.span_id[7], 0x31);
    char out[PJS_TRACEPARENT_LEN + 1];
    pjs_trace_format(&c, out);
    assert_string_equal(out, good);

    static const char unsampled[] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    assert_true(pjs_trace_parse(unsampled, strlen(unsampled), &c));
    assert_true(c.valid && !c.sampled);
    /* a later version may append fields; its first four are read */
    static const char later[] = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what";
    assert_true(pjs_trace_parse(later, strlen(later), &c));
    assert_true(c.sampled);
}

static void test_parse_refuses(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",   /* short */
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-", /* 00 with more */
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  /* upper case */
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  /* zero trace id */
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  /* zero span id */
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  /* version ff */
        "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  /* separator */
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",  /* not hex */
        "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x", /* later, no '-' */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pjs_trace_ctx c;
        memset(&c, 0xaa, sizeof c);
        assert_false(pjs_trace_parse(bad[i], strlen(bad[i]), &c));
        assert_false(c.valid);
        assert_false(c.sampled);
    }
    /* never past len: the valid value cut one short */
    pjs_trace_ctx c;
    assert_false(pjs_trace_parse(good, strlen(good) - 1, &c));
    assert_false(pjs_trace_parse(NULL, 0, &c));
}

static void test_ids_and_children(void **state)
{
    (void)state;
    pjs_trace_ctx a, b;
    assert_true(pjs_trace_parse(good, strlen(good), &a));
    pjs_trace_child(&a, &b);
    assert_memory_equal(a.trace_id, b.trace_id, PJS_TRACE_ID_SIZE);
    assert_memory_not_equal(a.span_id, b.span_id, PJS_SPAN_ID_SIZE);
    assert_memory_equal(b.parent_id, a.span_id, PJS_SPAN_ID_SIZE);
    pjs_span s;
    pjs_span_init_self(&s, &b, PJS_SPAN_SERVER, "self", 1, 2);
    assert_memory_equal(s.span_id, b.span_id, PJS_SPAN_ID_SIZE);
    assert_memory_equal(s.parent_id, a.span_id, PJS_SPAN_ID_SIZE);
    pjs_span_init(&s, &b, PJS_SPAN_INTERNAL, "child", 1, 2);
    assert_memory_equal(s.parent_id, b.span_id, PJS_SPAN_ID_SIZE);
    assert_memory_not_equal(s.span_id, b.span_id, PJS_SPAN_ID_SIZE);
    assert_true(b.valid && b.sampled);
    uint8_t x[PJS_TRACE_ID_SIZE], y[PJS_TRACE_ID_SIZE];
    pjs_trace_new_trace_id(x);
    pjs_trace_new_trace_id(y);
    assert_memory_not_equal(x, y, sizeof x);
}

static pjs_tracer *tracer_to(const char *endpoint, double rate, size_t queue)
{
    pjs_tracer_options o = {.endpoint = endpoint, .service_name = "pjserve-test",
                            .instance = "unit", .rate = rate, .queue_spans = queue};
    pjs_tracer *t = NULL;
    pjs_error err;
    assert_int_equal(pjs_tracer_create(&o, &t, &err), 0);
    return t;
}

static void test_sampling(void **state)
{
    (void)state;
    pjs_trace_ctx in, ctx;
    assert_true(pjs_trace_parse(good, strlen(good), &in));
    /* tracing off: nothing is sampled, a caller's decision included */
    assert_false(pjs_tracer_start(NULL, &in, &ctx));

    pjs_tracer *t = tracer_to("http://127.0.0.1:9/v1/traces", 0.0, 0);
    /* the caller decided: followed whatever the rate, same trace, new span */
    assert_true(pjs_tracer_start(t, &in, &ctx));
    assert_memory_equal(ctx.trace_id, in.trace_id, PJS_TRACE_ID_SIZE);
    assert_memory_not_equal(ctx.span_id, in.span_id, PJS_SPAN_ID_SIZE);
    assert_memory_equal(ctx.parent_id, in.span_id, PJS_SPAN_ID_SIZE);
    in.sampled = false;
    pjs_tracer_set_rate(t, 1.0);
    assert_false(pjs_tracer_start(t, &in, &ctx));
    /* no caller: by rate */
    int sampled = 0;
    for (int i = 0; i < 1000; i++)
        sampled += pjs_tracer_start(t, NULL, &ctx);
    assert_int_equal(sampled, 1000);
    assert_true(ctx.valid);
    static const uint8_t zero[PJS_SPAN_ID_SIZE];
    assert_memory_equal(ctx.parent_id, zero, PJS_SPAN_ID_SIZE); /* a new trace's root */
    pjs_tracer_set_rate(t, 0.0);
    for (int i = 0; i < 1000; i++)
        assert_false(pjs_tracer_start(t, NULL, &ctx));
    pjs_tracer_set_rate(t, 0.25);
    sampled = 0;
    for (int i = 0; i < 20000; i++)
        sampled += pjs_tracer_start(t, NULL, &ctx);
    assert_in_range(sampled, 4400, 5600);
    /* a relay (a gateway) hands a decision on even when it samples nothing */
    pjs_trace_ctx forward;
    pjs_tracer_set_rate(t, 0.0);
    pjs_tracer_start_relay(t, NULL, &ctx, &forward);
    assert_true(ctx.valid && !ctx.sampled && forward.valid && !forward.sampled);
    assert_memory_equal(forward.trace_id, ctx.trace_id, PJS_TRACE_ID_SIZE);
    assert_memory_equal(forward.parent_id, ctx.span_id, PJS_SPAN_ID_SIZE);
    pjs_tracer_set_rate(t, 7); /* clamped */
    assert_true(pjs_tracer_rate(t) == 1.0);
    pjs_tracer_destroy(t);
}

static void test_options_refused(void **state)
{
    (void)state;
    pjs_tracer *t = NULL;
    pjs_error err;
    pjs_tracer_options o = {.endpoint = "127.0.0.1:4318", .rate = 1};
    assert_int_equal(pjs_tracer_create(&o, &t, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "OTLP/HTTP traces URL"));
    o = (pjs_tracer_options){.endpoint = "http://127.0.0.1:4318/v1/traces", .rate = 1.5};
    assert_int_equal(pjs_tracer_create(&o, &t, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_null(t);
}

/* The spans array of an ExportTraceServiceRequest's one resource and scope. */
static json_t *spans_of(json_t *doc)
{
    json_t *rs = json_array_get(json_object_get(doc, "resourceSpans"), 0);
    return json_object_get(json_array_get(json_object_get(rs, "scopeSpans"), 0), "spans");
}

static void test_otlp_json(void **state)
{
    (void)state;
    pjs_trace_ctx ctx;
    assert_true(pjs_trace_parse(good, strlen(good), &ctx));
    pjs_span s[2];
    pjs_span_init(&s[0], &ctx, PJS_SPAN_SERVER, "infer mlp", 1000, 5000);
    pjs_span_attr_str(&s[0], "pjserve.model", "mlp \"quoted\"");
    pjs_span_attr_int(&s[0], "pjserve.batch_rows", 3);
    pjs_span_set_error(&s[0], "model mlp: no");
    pjs_trace_ctx root = {.valid = true, .sampled = true};
    memcpy(root.trace_id, ctx.trace_id, PJS_TRACE_ID_SIZE);
    pjs_span_init(&s[1], &root, PJS_SPAN_INTERNAL, "queue", 2000, 1500); /* end before start */
    memset(s[1].parent_id, 0, PJS_SPAN_ID_SIZE);
    for (int i = 0; i < 20; i++) /* past the limit: left out */
        pjs_span_attr_int(&s[1], "n", i);
    pjs_tracer_options o = {.service_name = "svc", .instance = "w1"};
    char *text = pjs_trace_encode_otlp_json(&o, s, 2, 1000000);
    assert_non_null(text);
    json_error_t jerr;
    json_t *doc = json_loads(text, 0, &jerr);
    assert_non_null(doc);
    json_t *rs = json_array_get(json_object_get(doc, "resourceSpans"), 0);
    json_t *res = json_object_get(json_object_get(rs, "resource"), "attributes");
    assert_string_equal(json_string_value(json_object_get(json_array_get(res, 0), "key")),
                        "service.name");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(res, 0), "value"), "stringValue")),
                        "svc");
    json_t *spans = spans_of(doc);
    assert_int_equal(json_array_size(spans), 2);
    json_t *a = json_array_get(spans, 0), *b = json_array_get(spans, 1);
    assert_string_equal(json_string_value(json_object_get(a, "traceId")),
                        "0af7651916cd43dd8448eb211c80319c");
    assert_string_equal(json_string_value(json_object_get(a, "parentSpanId")), "b7ad6b7169203331");
    assert_int_equal(strlen(json_string_value(json_object_get(a, "spanId"))), 16);
    assert_string_equal(json_string_value(json_object_get(a, "name")), "infer mlp");
    assert_int_equal(json_integer_value(json_object_get(a, "kind")), 2);
    assert_string_equal(json_string_value(json_object_get(a, "startTimeUnixNano")), "1001000");
    assert_string_equal(json_string_value(json_object_get(a, "endTimeUnixNano")), "1005000");
    json_t *st = json_object_get(a, "status");
    assert_int_equal(json_integer_value(json_object_get(st, "code")), 2);
    assert_string_equal(json_string_value(json_object_get(st, "message")), "model mlp: no");
    json_t *attrs = json_object_get(a, "attributes");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(attrs, 0), "value"), "stringValue")),
                        "mlp \"quoted\"");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(attrs, 1), "value"), "intValue")),
                        "3");
    assert_null(json_object_get(b, "parentSpanId")); /* a root */
    assert_string_equal(json_string_value(json_object_get(b, "endTimeUnixNano")), "1002000");
    assert_int_equal(json_array_size(json_object_get(b, "attributes")), PJS_SPAN_MAX_ATTRS);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(b, "status"), "code")), 0);
    json_decref(doc);
    free(text);
}

/* A client's request id may hold anything: the JSON stays valid UTF-8, with
 * control characters escaped and each stray byte replaced by U+FFFD. */
static void test_otlp_json_escapes_what_clients_send(void **state)
{
    (void)state;
    pjs_trace_ctx ctx;
    assert_true(pjs_trace_parse(good, strlen(good), &ctx));
    pjs_span s;
    pjs_span_init(&s, &ctx, PJS_SPAN_SERVER, "infer \"m\"\\", 1, 2);
    pjs_span_attr_str(&s, "pjserve.request_id",
                      "\x01id\n\xff\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xed\xa0\x80\xc3");
    pjs_tracer_options o = {.service_name = "s"};
    char *text = pjs_trace_encode_otlp_json(&o, &s, 1, 0);
    assert_non_null(text);
    json_error_t jerr;
    json_t *doc = json_loads(text, 0, &jerr); /* jansson refuses invalid UTF-8 */
    assert_non_null(doc);
    json_t *span = json_array_get(spans_of(doc), 0);
    assert_string_equal(json_string_value(json_object_get(span, "name")), "infer \"m\"\\");
    const char *id = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(span, "attributes"), 0), "value"),
        "stringValue"));
    assert_string_equal(id, "\x01id\n\xef\xbf\xbd\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                            "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    json_decref(doc);
    free(text);
}

/* ---- a collector on loopback: answers each POST with `status`, keeps bodies ---- */

typedef struct sink {
    int fd, port, status, requests;
    char bodies[4][1 << 16];
    pthread_t thread;
} sink;

static void *sink_main(void *arg)
{
    sink *k = arg;
    for (int r = 0; r < 4; r++) {
        int c = accept(k->fd, NULL, NULL);
        if (c < 0)
            return NULL;
        static char buf[1 << 17];
        size_t got = 0;
        long length = -1;
        char *body = NULL;
        while (got < sizeof buf - 1) {
            ssize_t n = read(c, buf + got, sizeof buf - 1 - got);
            if (n <= 0)
                break;
            got += (size_t)n;
            buf[got] = '\0';
            char *end = strstr(buf, "\r\n\r\n");
            if (end != NULL && length < 0) {
                char *cl = strcasestr(buf, "Content-Length:");
                length = cl ? strtol(cl + 15, NULL, 10) : 0;
                body = end + 4;
            }
            if (body != NULL && (long)(got - (size_t)(body - buf)) >= length)
                break;
        }
        if (body != NULL && strncmp(buf, "POST /v1/traces ", 16) == 0 &&
            strcasestr(buf, "Content-Type: application/json") != NULL)
            snprintf(k->bodies[r], sizeof k->bodies[r], "%s", body);
        char reply[128];
        int n = snprintf(reply, sizeof reply,
                         "HTTP/1.1 %d X\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                         k->status);
        if (write(c, reply, (size_t)n) != n)
            break;
        close(c);
        __atomic_add_fetch(&k->requests, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void sink_start(sink *k, int status)
{
    memset(k, 0, sizeof *k);
    k->status = status;
    k->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(k->fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(k->fd, 4), 0);
    assert_int_equal(getsockname(k->fd, (struct sockaddr *)&a, &len), 0);
    k->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&k->thread, NULL, sink_main, k), 0);
}

static void sink_stop(sink *k)
{
    shutdown(k->fd, SHUT_RDWR);
    close(k->fd);
    pthread_join(k->thread, NULL);
}

static void test_export_to_a_collector(void **state)
{
    (void)state;
    sink *k = calloc(1, sizeof *k);
    sink_start(k, 200);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", k->port);
    pjs_tracer *t = tracer_to(url, 1.0, 0);
    pjs_trace_ctx ctx;
    assert_true(pjs_tracer_start(t, NULL, &ctx));
    pjs_span s;
    pjs_span_init(&s, &ctx, PJS_SPAN_SERVER, "infer simple", 10, 20);
    pjs_tracer_emit(t, &s);
    pjs_span_init(&s, &ctx, PJS_SPAN_INTERNAL, "queue", 11, 12);
    pjs_tracer_emit(t, &s);
    pjs_tracer_destroy(t); /* flushes */
    sink_stop(k);
    assert_true(k->requests >= 1);
    json_error_t jerr;
    json_t *doc = json_loads(k->bodies[0], 0, &jerr);
    assert_non_null(doc);
    json_t *spans = spans_of(doc);
    assert_int_equal(json_array_size(spans), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(spans, 1), "name")),
                        "queue");
    json_decref(doc);
    free(k);
}

static void test_queue_bound_and_failed_exports(void **state)
{
    (void)state;
    sink *k = calloc(1, sizeof *k);
    sink_start(k, 503); /* a collector that refuses */
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", k->port);
    pjs_tracer *t = tracer_to(url, 1.0, 4);
    pjs_trace_ctx ctx;
    assert_true(pjs_tracer_start(t, NULL, &ctx));
    pjs_span s;
    pjs_span_init(&s, &ctx, PJS_SPAN_INTERNAL, "x", 1, 2);
    for (int i = 0; i < 1000; i++)
        pjs_tracer_emit(t, &s);
    /* Every span is accounted for once: dropped at the full queue (at most 4
     * wait at a time, so most of them), or taken and refused by the
     * collector. */
    pjs_tracer_counters c;
    for (int i = 0; i < 200; i++) {
        pjs_tracer_get_counters(t, &c);
        if (c.dropped_full + c.dropped_failed == 1000)
            break;
        usleep(50000);
    }
    assert_int_equal(c.dropped_full + c.dropped_failed, 1000);
    assert_true(c.dropped_full >= 500);
    assert_true(c.dropped_failed >= 1);
    assert_int_equal(c.exported, 0);
    pjs_tracer_destroy(t);
    sink_stop(k);
    free(k);

    /* nobody listening at all: counted, and destroy does not wait long */
    t = tracer_to("http://127.0.0.1:9/v1/traces", 1.0, 0);
    pjs_tracer_emit(t, &s);
    pjs_tracer_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_format),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_ids_and_children),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_options_refused),
        cmocka_unit_test(test_otlp_json),
        cmocka_unit_test(test_otlp_json_escapes_what_clients_send),
        cmocka_unit_test(test_export_to_a_collector),
        cmocka_unit_test(test_queue_bound_and_failed_exports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
