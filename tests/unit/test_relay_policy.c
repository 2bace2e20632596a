/*
 * test_relay_policy.c - unit tests of the gateway's relay policy
 * (gateway/relay_policy.h) without a network: every KServe V2 operation
 * maps to the same operation and class over gRPC and REST, every REST
 * shape of the table reaches its own row, and the rules the classes share
 * (what the pool hears, retries, the verdicts of several answers, how a
 * failure names its worker).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "gateway/relay_policy.h"

#define SVC "/inference.GRPCInferenceService/"
#define CONTROL "/pjserve.control.v1.ModelControl/"

/* The operation of "METHOD /v2/..." (a concrete path) and its model. */
static const pjs_gw_op *rest_op(const char *request, char *model, size_t model_size)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", request);
    char *path = strchr(buf, ' ');
    *path++ = '\0';
    const char *seg[32];
    size_t n = 0;
    for (char *s = strtok(path, "/"); s != NULL; s = strtok(NULL, "/"))
        seg[n++] = s;
    size_t model_at;
    const pjs_gw_op *op = pjs_gw_op_of_rest(buf, seg, n, &model_at);
    if (model != NULL)
        snprintf(model, model_size, "%s", model_at < n ? seg[model_at] : "");
    return op;
}

/* Every V2 operation as a client calls it over each protocol, written here
 * apart from the table: the same operation, class and model on both. */
static const struct {
    const char *grpc, *rest, *cls, *model;
} calls[] = {
    {SVC "ServerLive", "GET /v2/health/live", "local", ""},
    {SVC "ServerReady", "HEAD /v2/health/ready", "local", ""},
    {CONTROL "NodeStatus", "GET /v2/pjserve/node", "local", ""},
    {SVC "ServerMetadata", "GET /v2", "any", ""},
    {SVC "ModelMetadata", "GET /v2/models/mlp", "model", "mlp"},
    {SVC "ModelMetadata", "GET /v2/models/mlp/versions/1", "model", "mlp"},
    {SVC "ModelConfig", "GET /v2/models/mlp/config", "model", "mlp"},
    {SVC "ModelReady", "GET /v2/models/mlp/versions/1/ready", "model", "mlp"},
    {SVC "ModelInfer", "POST /v2/models/mlp/infer", "model", "mlp"},
    {SVC "ModelInfer", "POST /v2/models/mlp/versions/1/infer", "model", "mlp"},
    {SVC "ModelStatistics", "GET /v2/models/stats", "merge", ""},
    {SVC "ModelStatistics", "GET /v2/models/mlp/stats", "merge", "mlp"},
    {SVC "ModelStatistics", "GET /v2/models/mlp/versions/1/stats", "merge", "mlp"},
    {SVC "RepositoryIndex", "POST /v2/repository/index", "merge", ""},
    {SVC "RepositoryModelLoad", "POST /v2/repository/models/mlp/load", "fan-out", "mlp"},
    {SVC "RepositoryModelUnload", "POST /v2/repository/models/mlp/unload", "fan-out", "mlp"},
    {SVC "SystemSharedMemoryStatus", "GET /v2/systemsharedmemory/status", "any", ""},
    {SVC "SystemSharedMemoryStatus", "GET /v2/systemsharedmemory/region/r/status", "any", ""},
    {SVC "SystemSharedMemoryRegister", "POST /v2/systemsharedmemory/region/r/register",
     "fan-out", ""},
    {SVC "SystemSharedMemoryUnregister", "POST /v2/systemsharedmemory/unregister", "fan-out", ""},
    {SVC "SystemSharedMemoryUnregister", "POST /v2/systemsharedmemory/region/r/unregister",
     "fan-out", ""},
    {SVC "CudaSharedMemoryStatus", "GET /v2/cudasharedmemory/status", "any", ""},
    {SVC "CudaSharedMemoryStatus", "GET /v2/cudasharedmemory/region/r/status", "any", ""},
    {SVC "CudaSharedMemoryRegister", "POST /v2/cudasharedmemory/region/r/register", "fan-out",
     ""},
    {SVC "CudaSharedMemoryUnregister", "POST /v2/cudasharedmemory/unregister", "fan-out", ""},
    {SVC "CudaSharedMemoryUnregister", "POST /v2/cudasharedmemory/region/r/unregister",
     "fan-out", ""},
    {SVC "TraceSetting", "GET /v2/trace/setting", "fan-out", ""},
    {SVC "TraceSetting", "POST /v2/models/mlp/trace/setting", "fan-out", ""},
    {SVC "LogSettings", "GET /v2/logging", "fan-out", ""},
    {SVC "LogSettings", "POST /v2/logging", "fan-out", ""},
    {CONTROL "ModelControlStatus", "GET /v2/pjserve/control", "any", ""},
    {CONTROL "SetModelResidency", "POST /v2/pjserve/models/mlp/residency", "fan-out", "mlp"},
    {CONTROL "SetModelPolicy", "POST /v2/pjserve/models/mlp/policy", "fan-out", "mlp"},
    {CONTROL "Compact", "POST /v2/pjserve/compact", "fan-out", ""},
};

static void test_both_protocols_same_class(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        const pjs_gw_op *g = pjs_gw_op_of_grpc(calls[i].grpc);
        char model[64];
        const pjs_gw_op *r = rest_op(calls[i].rest, model, sizeof model);
        if (g != r || strcmp(g->cls->name, calls[i].cls) != 0 ||
            strcmp(model, calls[i].model) != 0)
            fail_msg("%s / %s: gRPC %s (%s), REST %s (%s) model \"%s\"; want %s model \"%s\"",
                     calls[i].grpc, calls[i].rest, g->name, g->cls->name, r->name, r->cls->name,
                     model, calls[i].cls, calls[i].model);
    }
}

/* Every row is at its index, its gRPC method finds it, and each of its REST
 * shapes, filled in, finds it and no earlier row. */
static void test_every_row_reached(void **state)
{
    (void)state;
    for (size_t i = 0; i < PJS_GW_N_OPS; i++) {
        const pjs_gw_op *op = &pjs_gw_ops[i];
        assert_int_equal(op->id, i);
        assert_non_null(op->cls);
        if (op->grpc != NULL)
            assert_ptr_equal(pjs_gw_op_of_grpc(op->grpc), op);
        for (size_t k = 0; k < PJS_GW_OP_REST_SHAPES && op->rest[k] != NULL; k++) {
            char concrete[256] = "";
            for (const char *s = op->rest[k]; *s != '\0'; s++) {
                if (strncmp(s, "{m}", 3) == 0) {
                    strcat(concrete, "m1");
                    s += 2;
                } else if (*s == '*' && (s[1] == '/' || s[1] == '\0')) {
                    strcat(concrete, "x");
                } else {
                    strncat(concrete, s, 1);
                }
            }
            if (rest_op(concrete, NULL, 0) != op)
                fail_msg("%s (%s) reaches %s", concrete, op->name,
                         rest_op(concrete, NULL, 0)->name);
        }
        /* A several-worker class combines; a one-worker class picks. */
        if (op->cls != &pjs_gw_class_local)
            assert_true((op->cls->pick != NULL) != (op->cls->targets != NULL));
        assert_true((op->cls->targets != NULL) == (op->cls->combine != NULL));
        assert_true((op->merge != PJS_GW_MERGE_NONE) == (op->cls == &pjs_gw_class_merge));
    }
}

static void test_others_go_to_any_worker(void **state)
{
    (void)state;
    const pjs_gw_op *other = &pjs_gw_ops[PJS_GW_OP_OTHER];
    assert_ptr_equal(pjs_gw_op_of_grpc(SVC "Nope"), other);
    assert_ptr_equal(pjs_gw_op_of_grpc("/grpc.health.v1.Health/Watch"), other);
    assert_true(other->stream);
    assert_ptr_equal(other->cls, &pjs_gw_class_any);
    assert_ptr_equal(rest_op("GET /v2/nowhere", NULL, 0), other);
    assert_ptr_equal(rest_op("DELETE /v2/models/mlp", NULL, 0), other);
    assert_ptr_equal(rest_op("GET /v2/models/mlp/infer", NULL, 0), other);
    assert_ptr_equal(rest_op("POST /v2/models/mlp/versions/1/infer/more", NULL, 0), other);
    assert_ptr_equal(pjs_gw_op_of_grpc(SVC "ModelStreamInfer")->cls, &pjs_gw_class_model);
    assert_true(pjs_gw_op_of_grpc(SVC "ModelStreamInfer")->stream);
}

static pjs_gw_result answer(int worker, bool ok, int status, const char *text)
{
    return (pjs_gw_result){.worker = worker, .delivery = PJS_GW_DELIVERED, .ok = ok,
                           .mark = ok ? PJS_GW_MARK_NONE : PJS_GW_MARK_ERROR,
                           .status = status, .text = text, .text_len = strlen(text)};
}

static void test_outcomes_and_retries(void **state)
{
    (void)state;
    pjs_gw_result r = answer(0, false, 5, "unknown model");
    assert_int_equal(pjs_gw_relay_outcome(&r), PJS_GW_ANSWERED);
    assert_false(pjs_gw_class_model.retry(&r));
    r.mark = PJS_GW_MARK_NOT_RUN; /* the worker does not have the model */
    assert_int_equal(pjs_gw_relay_outcome(&r), PJS_GW_ANSWERED);
    assert_true(pjs_gw_class_model.retry(&r));
    assert_true(pjs_gw_class_any.retry(&r));
    assert_false(pjs_gw_class_fan_out.retry(&r));
    r.mark = PJS_GW_MARK_DRAINING; /* going: never sent, as far as the breaker goes */
    assert_int_equal(pjs_gw_relay_outcome(&r), PJS_GW_NOT_SENT);
    assert_true(pjs_gw_class_model.retry(&r));
    r = (pjs_gw_result){.delivery = PJS_GW_UNDELIVERED};
    assert_int_equal(pjs_gw_relay_outcome(&r), PJS_GW_NOT_SENT);
    assert_true(pjs_gw_class_any.retry(&r));
    assert_false(pjs_gw_class_merge.retry(&r));
    r.delivery = PJS_GW_LOST; /* it may have run */
    assert_int_equal(pjs_gw_relay_outcome(&r), PJS_GW_BROKEN);
    assert_false(pjs_gw_class_model.retry(&r));
    assert_int_equal(pjs_gw_mark_of("not-run", 7), PJS_GW_MARK_NOT_RUN);
    assert_int_equal(pjs_gw_mark_of("draining", 8), PJS_GW_MARK_DRAINING);
    assert_int_equal(pjs_gw_mark_of("error", 5), PJS_GW_MARK_ERROR);
}

static void test_fan_out_verdicts(void **state)
{
    (void)state;
    pjs_gw_verdict v;
    pjs_gw_result rs[3] = {answer(0, true, 0, "{}"), answer(1, true, 0, "{}"),
                           answer(2, true, 0, "{}")};
    pjs_gw_class_fan_out.combine(rs, 3, &v);
    assert_int_equal(v.kind, PJS_GW_VERDICT_RELAY);
    assert_int_equal(v.at, 0);
    assert_true(v.accepted);

    rs[1] = answer(1, false, 400, "already registered");
    pjs_gw_class_fan_out.combine(rs, 3, &v);
    assert_int_equal(v.kind, PJS_GW_VERDICT_FAILED);
    assert_int_equal(v.at, 1);
    assert_false(v.unanimous);
    assert_true(v.accepted);
    char text[256];
    pjs_gw_relay_failure_text(&v, &rs[1], "127.0.0.1:8000", "already registered", text,
                              sizeof text);
    assert_string_equal(text,
                        "worker 1 (127.0.0.1:8000): already registered (the other 2 workers "
                        "succeeded)");

    rs[2] = (pjs_gw_result){.worker = 2, .delivery = PJS_GW_UNDELIVERED};
    pjs_gw_class_fan_out.combine(rs, 3, &v);
    assert_int_equal(v.at, 1);
    assert_int_equal(v.n_failed, 2);
    pjs_gw_relay_failure_text(&v, &rs[2], "w2", "refused", text, sizeof text);
    assert_string_equal(text, "worker 2 (w2) did not answer: refused (and 1 more of the 3 "
                              "workers failed)");

    for (int i = 0; i < 3; i++)
        rs[i] = answer(i, false, 404, "unknown model");
    pjs_gw_class_fan_out.combine(rs, 3, &v);
    assert_int_equal(v.kind, PJS_GW_VERDICT_FAILED);
    assert_true(v.unanimous);
    assert_false(v.accepted);
    rs[2] = answer(2, false, 404, "unknown model!");
    pjs_gw_class_fan_out.combine(rs, 3, &v);
    assert_false(v.unanimous);
}

static void test_merge_verdicts(void **state)
{
    (void)state;
    pjs_gw_verdict v;
    pjs_gw_result rs[3] = {answer(0, false, 404, "unknown model"), answer(1, true, 0, "{}"),
                           answer(2, true, 0, "{}")};
    pjs_gw_class_merge.combine(rs, 3, &v);
    assert_int_equal(v.kind, PJS_GW_VERDICT_MERGE);
    assert_int_equal(v.merged, 0x6);
    rs[1] = rs[2] = rs[0];
    rs[1].worker = 1;
    rs[2].worker = 2;
    pjs_gw_class_merge.combine(rs, 3, &v);
    assert_int_equal(v.kind, PJS_GW_VERDICT_FAILED);
    assert_true(v.unanimous);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both_protocols_same_class),
        cmocka_unit_test(test_every_row_reached),
        cmocka_unit_test(test_others_go_to_any_worker),
        cmocka_unit_test(test_outcomes_and_retries),
        cmocka_unit_test(test_fan_out_verdicts),
        cmocka_unit_test(test_merge_verdicts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
