/*
 * test_load_config.c - unit tests of a load's configuration override
 * (src/server/load_config.c): what a config sets (the served cap and its
 * compiled sizes, coalescing, the queue policy), both JSON spellings of a
 * field and 64-bit integers as strings, the restating fields accepted when
 * they agree with the bundle and refused naming the difference, every field
 * pjserve cannot apply named in one refusal, malformed documents refused
 * with the path of the value, and `file:` load parameters refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/load_config.h"

/* Every tensor batched, compiled at 1, 4 and 8: requests coalesce. */
static const char mlp_yaml[] = "format_version: \"2.0\"\n"
                               "name: mlp\n"
                               "batch_sizes: [1, 4, 8]\n"
                               "inputs:\n"
                               "  - {name: x, dtype: f32, shape: [batch, 16]}\n"
                               "outputs:\n"
                               "  - {name: y, dtype: f32, shape: [batch, 4]}\n";

/* An output without a batch axis: requests run one at a time. */
static const char pooled_yaml[] = "format_version: \"2.0\"\n"
                                  "name: pooled\n"
                                  "batch_sizes: [1, 8]\n"
                                  "inputs:\n"
                                  "  - {name: x, dtype: f32, shape: [batch, 4]}\n"
                                  "outputs:\n"
                                  "  - {name: total, dtype: f32, shape: [4]}\n";

/* No batch axis at all: served with max_batch_size 0. */
static const char fixed_yaml[] = "format_version: \"2.0\"\n"
                                 "name: fixed\n"
                                 "batch_sizes: [1]\n"
                                 "inputs:\n"
                                 "  - {name: img, dtype: u8, shape: [4, 5, 3], format: NHWC}\n"
                                 "outputs:\n"
                                 "  - {name: out, dtype: i64, shape: [2]}\n";

static pjs_manifest manifest(const char *yaml, const char *name)
{
    pjs_manifest m;
    pjs_error err;
    if (pjs_manifest_parse(&m, yaml, strlen(yaml), name, &err) != 0)
        fail_msg("manifest: %s", err.msg);
    return m;
}

/* Parses and applies `json` to bundle `yaml`; the status, *ov and *err. */
static int load(const char *yaml, const char *json, pjs_load_override *ov, pjs_error *err)
{
    pjs_manifest m = manifest(yaml, strstr(yaml, "name: mlp") ? "mlp"
                                    : strstr(yaml, "name: pooled") ? "pooled" : "fixed");
    pjs_load_config *c = NULL;
    int rc = pjs_load_config_parse(m.name, json, strlen(json), &c, err);
    if (rc == 0) {
        assert_string_equal(pjs_load_config_text(c), json);
        rc = pjs_load_config_apply(c, m.name, "pjrt_cpu", &m, ov, err);
    }
    pjs_load_config_free(c);
    pjs_manifest_free(&m);
    return rc;
}

/* Refused with INVALID_ARGUMENT and every one of `words` in the message. */
static void refused(const char *yaml, const char *json, const char *const *words)
{
    pjs_load_override ov;
    pjs_error err;
    int rc = load(yaml, json, &ov, &err);
    if (rc != PJS_ERR_INVALID_ARGUMENT)
        fail_msg("%s: expected a refusal, got %d (%s)", json, rc, rc ? err.msg : "accepted");
    if (strncmp(err.msg, "config override: ", 17) != 0)
        fail_msg("%s: %s", json, err.msg);
    for (; *words != NULL; words++)
        if (strstr(err.msg, *words) == NULL)
            fail_msg("%s: \"%s\" not in: %s", json, *words, err.msg);
}

#define REFUSED(yaml, json, ...) refused(yaml, json, (const char *const[]){__VA_ARGS__, NULL})

static void test_cap_and_batching(void **state)
{
    (void)state;
    pjs_load_override ov;
    pjs_error err;
    assert_int_equal(load(mlp_yaml, "{\"name\": \"mlp\", \"max_batch_size\": 4, "
                                    "\"dynamic_batching\": {}}",
                          &ov, &err), 0);
    assert_int_equal(ov.max_batch_size, 4);
    assert_int_equal(ov.n_served_sizes, 2); /* 1 and 4 */
    assert_true(ov.coalesce);
    assert_int_equal(ov.default_timeout_us, -1);
    assert_int_equal(ov.max_queue_depth, 0);

    /* dynamic_batching absent: requests are not coalesced. */
    assert_int_equal(load(mlp_yaml, "{\"max_batch_size\": 1}", &ov, &err), 0);
    assert_int_equal(ov.max_batch_size, 1);
    assert_int_equal(ov.n_served_sizes, 1);
    assert_false(ov.coalesce);

    /* A model that does not coalesce may restate that. */
    assert_int_equal(load(pooled_yaml, "{\"max_batch_size\": 8}", &ov, &err), 0);
    assert_int_equal(ov.n_served_sizes, 2);
    assert_false(ov.coalesce);
    /* A model without a batch axis: 0, or absent, as protobuf reads it. */
    assert_int_equal(load(fixed_yaml, "{}", &ov, &err), 0);
    assert_int_equal(ov.max_batch_size, 0);
    assert_int_equal(load(fixed_yaml, "{\"max_batch_size\": 0}", &ov, &err), 0);
}

static void test_queue_policy_and_spellings(void **state)
{
    (void)state;
    pjs_load_override ov;
    pjs_error err;
    /* lowerCamelCase and 64-bit integers as strings, as protobuf's JSON. */
    assert_int_equal(load(mlp_yaml,
                          "{\"maxBatchSize\": \"8\", \"dynamicBatching\": {"
                          "\"preferredBatchSize\": [1, 8], \"maxQueueDelayMicroseconds\": \"0\", "
                          "\"defaultQueuePolicy\": {\"defaultTimeoutMicroseconds\": \"5000\", "
                          "\"maxQueueSize\": 3, \"timeoutAction\": \"REJECT\", "
                          "\"allowTimeoutOverride\": true}, \"priorityLevels\": 0, "
                          "\"preserveOrdering\": false, \"priorityQueuePolicy\": {}}}",
                          &ov, &err), 0);
    assert_int_equal(ov.max_batch_size, 8);
    assert_int_equal(ov.n_served_sizes, 3);
    assert_true(ov.coalesce);
    assert_int_equal(ov.default_timeout_us, 5000);
    assert_int_equal(ov.max_queue_depth, 3);
    /* A timeout of 0 is set (none), a queue size of 0 is not. */
    assert_int_equal(load(mlp_yaml,
                          "{\"max_batch_size\": 8, \"dynamic_batching\": {\"default_queue_policy\":"
                          " {\"default_timeout_microseconds\": 0, \"max_queue_size\": 0}}}",
                          &ov, &err), 0);
    assert_int_equal(ov.default_timeout_us, 0);
    assert_int_equal(ov.max_queue_depth, 0);
}

/* What ModelConfig reports, sent back: accepted. */
static void test_restating_accepted(void **state)
{
    (void)state;
    pjs_load_override ov;
    pjs_error err;
    assert_int_equal(
        load(mlp_yaml,
             "{\"name\": \"mlp\", \"platform\": \"pjrt_cpu\", \"backend\": \"pjserve\", "
             "\"version_policy\": {\"latest\": {\"num_versions\": 1}}, \"max_batch_size\": 8, "
             "\"input\": [{\"name\": \"x\", \"data_type\": \"TYPE_FP32\", \"format\": "
             "\"FORMAT_NONE\", \"dims\": [\"16\"], \"is_shape_tensor\": false, "
             "\"allow_ragged_batch\": false, \"optional\": false}], "
             "\"output\": [{\"name\": \"y\", \"data_type\": \"TYPE_FP32\", \"dims\": [4], "
             "\"label_filename\": \"\", \"is_shape_tensor\": false}], "
             "\"dynamic_batching\": {\"preferred_batch_size\": [1, 4, 8], "
             "\"max_queue_delay_microseconds\": 0}}",
             &ov, &err), 0);
    /* Without a batch axis every extent is in dims. */
    assert_int_equal(load(fixed_yaml,
                          "{\"name\": \"fixed\", \"input\": [{\"name\": \"img\", \"dataType\": "
                          "\"TYPE_UINT8\", \"format\": \"FORMAT_NHWC\", \"dims\": [4, 5, 3]}], "
                          "\"output\": [{\"name\": \"out\", \"data_type\": \"TYPE_INT64\", "
                          "\"dims\": [2]}]}",
                          &ov, &err), 0);
}

static void test_cap_refused(void **state)
{
    (void)state;
    REFUSED(mlp_yaml, "{\"max_batch_size\": 16}", "model mlp",
            "larger than its largest compiled batch size", "compiled: 1, 4, 8");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 3}", "not one of its compiled batch sizes (1, 4, 8)");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 0}", "without a batch axis", "1, 4, 8");
    REFUSED(mlp_yaml, "{\"dynamic_batching\": {}}", "max_batch_size 0 (or absent)");
    REFUSED(mlp_yaml, "{\"max_batch_size\": -1}", "max_batch_size must be an integer in 0..");
    REFUSED(fixed_yaml, "{\"max_batch_size\": 4}", "no input of the model has a batch axis");
    REFUSED(pooled_yaml, "{\"max_batch_size\": 8, \"dynamic_batching\": {}}",
            "cannot be coalesced", "leave dynamic_batching out");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 4, \"dynamic_batching\": "
                      "{\"preferred_batch_size\": [1, 8]}}",
            "preferred_batch_size[1] is 8", "up to max_batch_size 4");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"dynamic_batching\": "
                      "{\"max_queue_delay_microseconds\": 100}}",
            "dynamic_batching.max_queue_delay_microseconds is 100", "never holds");
}

static void test_restating_refused(void **state)
{
    (void)state;
    REFUSED(mlp_yaml, "{\"name\": \"other\", \"max_batch_size\": 8}",
            "name \"other\" is not the model being loaded (\"mlp\")");
    REFUSED(mlp_yaml, "{\"platform\": \"onnxruntime_onnx\", \"max_batch_size\": 8}",
            "platform \"onnxruntime_onnx\"", "pjrt_cpu");
    REFUSED(mlp_yaml, "{\"backend\": \"python\", \"max_batch_size\": 8}", "backend \"python\"");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": [{\"name\": \"x\", \"dims\": [32]}]}",
            "input[0] (\"x\"): dims [32] differs from the model's [16]");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": [{\"name\": \"x\", \"dims\": [-1, 16]}]}",
            "dims [-1,16] differs");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"output\": [{\"name\": \"y\", "
                      "\"data_type\": \"TYPE_FP16\"}]}",
            "output[0] (\"y\"): data_type \"TYPE_FP16\" differs from the model's TYPE_FP32");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": [{\"name\": \"z\"}]}",
            "input[0]: the model has no input \"z\" (its inputs: 'x')");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": [{\"name\": \"x\"}, {\"name\": \"x\"}]}",
            "input[1]: input \"x\" listed twice");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": [{\"dims\": [16]}]}",
            "input[0] has no name");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": [{\"name\": \"x\", "
                      "\"format\": \"FORMAT_NCHW\"}]}",
            "format \"FORMAT_NCHW\" differs from the model's FORMAT_NONE");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"output\": [{\"name\": \"y\", "
                      "\"label_filename\": \"labels.txt\"}]}",
            "label_filename \"labels.txt\" differs");
}

static void test_unsupported_named_together(void **state)
{
    (void)state;
    REFUSED(mlp_yaml,
            "{\"max_batch_size\": 8, \"instance_group\": [{\"count\": 2}], \"optimization\": {}, "
            "\"sequence_batching\": {}, \"parameters\": {}, "
            "\"version_policy\": {\"latest\": {\"num_versions\": 2}}, "
            "\"input\": [{\"name\": \"x\", \"reshape\": {\"shape\": [4, 4]}, "
            "\"allow_ragged_batch\": true}], "
            "\"dynamic_batching\": {\"priority_levels\": 2, \"default_priority_level\": 1, "
            "\"preserve_ordering\": true, \"priority_queue_policy\": {\"1\": {}}, "
            "\"default_queue_policy\": {\"timeout_action\": \"DELAY\", "
            "\"allow_timeout_override\": false}}}",
            "pjserve cannot apply 'instance_group', 'optimization', 'sequence_batching', "
            "'parameters', 'version_policy.latest.num_versions', 'input[0].reshape', "
            "'input[0].allow_ragged_batch', 'dynamic_batching.priority_levels', "
            "'dynamic_batching.default_priority_level', 'dynamic_batching.preserve_ordering', "
            "'dynamic_batching.priority_queue_policy', "
            "'dynamic_batching.default_queue_policy.timeout_action', "
            "'dynamic_batching.default_queue_policy.allow_timeout_override'; it honours "
            "max_batch_size, dynamic_batching");
    /* A refusal names fields in the spelling given. */
    REFUSED(mlp_yaml, "{\"maxBatchSize\": 8, \"instanceGroup\": []}", "'instanceGroup'");
    /* So many that the list is cut short, and says so. */
    char big[8192];
    size_t used = (size_t)snprintf(big, sizeof big, "{\"max_batch_size\": 8");
    for (int i = 0; i < 100; i++)
        used += (size_t)snprintf(big + used, sizeof big - used, ", \"unknown_field_%d\": 1", i);
    snprintf(big + used, sizeof big - used, "}");
    REFUSED(mlp_yaml, big, "'unknown_field_0', 'unknown_field_1'", " and more; it honours");
}

static void test_malformed(void **state)
{
    (void)state;
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8,", "not a JSON ModelConfig", "line 1");
    REFUSED(mlp_yaml, "[]", "the config must be a JSON object");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"max_batch_size\": 4}", "not a JSON ModelConfig");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"maxBatchSize\": 4}",
            "field max_batch_size given twice");
    REFUSED(mlp_yaml, "{\"max_batch_size\": \"+8\"}", "must be an integer", "\"+8\"");
    REFUSED(mlp_yaml, "{\"max_batch_size\": \" 8\"}", "must be an integer");
    REFUSED(mlp_yaml, "{\"max_batch_size\": \"8 \"}", "must be an integer");
    REFUSED(mlp_yaml, "{\"max_batch_size\": \"\"}", "must be an integer");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8.5}", "must be an integer");
    REFUSED(mlp_yaml, "{\"max_batch_size\": \"99999999999999999999\"}", "must be an integer");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 4294967304}", "0..2147483647");
    REFUSED(mlp_yaml, "{\"name\": 7}", "name must be a string");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"dynamic_batching\": []}",
            "dynamic_batching must be a JSON object");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": {}}", "input must be an array");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": [{\"name\": \"x\", \"dims\": "
                      "[1,2,3,4,5,6,7,8,9]}]}",
            "input[0].dims must be an array of at most 8");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"input\": [{\"name\": \"x\", \"dims\": [-2]}]}",
            "input[0].dims[0] must be an integer in -1..");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"dynamic_batching\": {\"default_queue_policy\": "
                      "{\"timeout_action\": \"WAIT\"}}}",
            "timeout_action must be \"REJECT\" or \"DELAY\"");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"dynamic_batching\": {\"default_queue_policy\": "
                      "{\"max_queue_size\": 16777217}}}",
            "max_queue_size must be an integer in 0..16777216");
    REFUSED(mlp_yaml, "{\"max_batch_size\": 8, \"dynamic_batching\": {\"default_queue_policy\": "
                      "{\"default_timeout_microseconds\": 86400000001}}}",
            "default_timeout_microseconds must be an integer in 0..86400000000");
    REFUSED(mlp_yaml, "{\"name\": \"m\\u0000lp\"}", "not a JSON ModelConfig");

    /* Past the size limit, refused before it is read. */
    size_t n = PJS_LOAD_CONFIG_MAX_BYTES + 1;
    char *huge = malloc(n);
    assert_non_null(huge);
    memset(huge, ' ', n);
    pjs_load_config *c = NULL;
    pjs_error err;
    assert_int_equal(pjs_load_config_parse("mlp", huge, n, &c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_null(c);
    assert_non_null(strstr(err.msg, "more than the 1048576 a config may have"));
    free(huge);
}

static void test_load_parameters(void **state)
{
    (void)state;
    pjs_error err;
    assert_int_equal(pjs_load_parameter_check("mlp", "config", &err), 0);
    assert_int_equal(pjs_load_parameter_check("mlp", "unload_dependents", &err), 0);
    assert_int_equal(pjs_load_parameter_check("mlp", "file:1/model.onnx", &err),
                     PJS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "\"file:1/model.onnx\""));
    assert_non_null(strstr(err.msg, "write files into the model repository"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cap_and_batching),
        cmocka_unit_test(test_queue_policy_and_spellings),
        cmocka_unit_test(test_restating_accepted),
        cmocka_unit_test(test_cap_refused),
        cmocka_unit_test(test_restating_refused),
        cmocka_unit_test(test_unsupported_named_together),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_load_parameters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
