/*
 * test_manifest_ensemble.c - unit tests of kind: ensemble manifests
 * (src/core/manifest.c): the steps as parsed, the order they run in, the
 * step models collected as the ensemble's calls, and every check of the
 * tensor graph, each rejection asserting its status, the path it names and
 * what it says. Run under ASan too, so every error path is checked for
 * leaks. PJS_TEST_VERBOSE=1 prints every rejection message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/manifest.h"

#define LABEL "models/ens/manifest.yaml"

#define HEAD "format_version: \"2.0\"\nname: ens\nkind: ensemble\n"
#define CLIENT_IO                                                                             \
    "client_inputs:\n"                                                                        \
    "  - {name: a, dtype: f32, shape: [batch, 8]}\n"                                          \
    "  - {name: b, dtype: i32, shape: [batch, 3]}\n"                                          \
    "  - {name: x, dtype: f32, shape: [batch, 16]}\n"                                         \
    "client_outputs:\n"                                                                       \
    "  - {name: s2, dtype: f32, shape: [batch, 8]}\n"                                         \
    "  - {name: am1, dtype: i32, shape: [batch]}\n"                                           \
    "  - {name: y, dtype: f32, shape: [batch, 4]}\n"
/* Declared out of order on purpose: step 0 reads what step 1 writes. */
#define STEPS                                                                                 \
    "ensemble:\n"                                                                             \
    "  steps:\n"                                                                              \
    "    - model: two_io\n"                                                                   \
    "      input_map: {a: s1, b: b}\n"                                                        \
    "      output_map: {sum: s2}\n"                                                           \
    "    - model: two_io\n"                                                                   \
    "      version: 1\n"                                                                      \
    "      input_map: {a: a, b: b}\n"                                                         \
    "      output_map: {sum: s1, argmax: am1}\n"                                              \
    "    - model: mlp\n"                                                                      \
    "      input_map: {x: x}\n"                                                               \
    "      output_map: {y: y}\n"
#define ENSEMBLE HEAD CLIENT_IO STEPS

static void expect_reject(const char *yaml, const char *needle1, const char *needle2)
{
    pjs_manifest m;
    pjs_error err;
    pjs_error_clear(&err);
    int rc = pjs_manifest_parse(&m, yaml, strlen(yaml), LABEL, &err);
    if (getenv("PJS_TEST_VERBOSE") != NULL)
        print_message("%s\n", err.msg);
    if (rc != PJS_ERR_INVALID_ARGUMENT || (needle1 && !strstr(err.msg, needle1)) ||
        (needle2 && !strstr(err.msg, needle2)))
        print_error("rc=%d msg: %s\n", rc, err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_true(strncmp(err.msg, LABEL ": ", strlen(LABEL) + 2) == 0);
    if (needle1)
        assert_non_null(strstr(err.msg, needle1));
    if (needle2)
        assert_non_null(strstr(err.msg, needle2));
    static const pjs_manifest zero;
    assert_memory_equal(&m, &zero, sizeof zero);
}

#define REJECT(test, yaml, n1, n2)                                                            \
    static void test(void **state)                                                            \
    {                                                                                         \
        (void)state;                                                                          \
        expect_reject(yaml, n1, n2);                                                          \
    }

REJECT(test_reject_hooks_libraries, ENSEMBLE "hooks_libraries: [m]\n", "hooks_libraries",
       "an ensemble has no model.c")

/* ---- accepted ---------------------------------------------------------- */

static void test_parse_ensemble(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    pjs_error_clear(&err);
    assert_int_equal(pjs_manifest_parse(&m, ENSEMBLE, strlen(ENSEMBLE), LABEL, &err), 0);
    assert_int_equal(m.kind, PJS_KIND_ENSEMBLE);
    assert_int_equal(m.n_inputs, 0);
    assert_int_equal(m.n_batch_sizes, 0);
    assert_int_equal(m.n_variants, 0);
    assert_int_equal(m.n_client_inputs, 3);
    assert_int_equal(m.n_client_outputs, 3);
    assert_int_equal(m.n_steps, 3);
    const pjs_ensemble_step *s = m.steps;
    assert_string_equal(s[0].model, "two_io");
    assert_int_equal(s[0].version, -1);
    assert_int_equal(s[0].n_inputs, 2);
    assert_string_equal(s[0].inputs[0].model_tensor, "a");
    assert_string_equal(s[0].inputs[0].ensemble_tensor, "s1");
    assert_string_equal(s[0].inputs[1].model_tensor, "b");
    assert_string_equal(s[0].inputs[1].ensemble_tensor, "b");
    assert_int_equal(s[0].n_outputs, 1);
    assert_string_equal(s[0].outputs[0].model_tensor, "sum");
    assert_string_equal(s[0].outputs[0].ensemble_tensor, "s2");
    assert_int_equal(s[1].version, 1);
    assert_int_equal(s[1].n_outputs, 2);
    assert_string_equal(s[1].outputs[1].model_tensor, "argmax");
    assert_string_equal(s[1].outputs[1].ensemble_tensor, "am1");
    assert_string_equal(s[2].model, "mlp");
    /* Step 1 and 2 read client inputs only (first wave, manifest order);
     * step 0 reads step 1's s1. */
    assert_int_equal(m.step_order[0], 1);
    assert_int_equal(m.step_order[1], 2);
    assert_int_equal(m.step_order[2], 0);
    /* Each step model once, in order of first use. */
    assert_int_equal(m.n_calls, 2);
    assert_string_equal(m.calls[0], "two_io");
    assert_string_equal(m.calls[1], "mlp");
    pjs_manifest_free(&m);
}

/* A chain of PJS_ENSEMBLE_MAX_STEPS steps declared last to first runs first
 * to last. */
static void test_long_chain_ordered(void **state)
{
    (void)state;
    size_t cap = 64 * 200 + 1024, used = 0;
    char *yaml = malloc(cap);
    assert_non_null(yaml);
    used += (size_t)snprintf(yaml + used, cap - used,
                             HEAD "client_inputs:\n  - {name: t0, dtype: f32, shape: [4]}\n"
                                  "client_outputs:\n  - {name: t%d, dtype: f32, shape: [4]}\n"
                                  "ensemble:\n  steps:\n",
                             PJS_ENSEMBLE_MAX_STEPS);
    for (int k = PJS_ENSEMBLE_MAX_STEPS; k >= 1; k--)
        used += (size_t)snprintf(yaml + used, cap - used,
                                 "    - {model: m, input_map: {x: t%d}, output_map: {y: t%d}}\n",
                                 k - 1, k);
    pjs_manifest m;
    pjs_error err;
    pjs_error_clear(&err);
    assert_int_equal(pjs_manifest_parse(&m, yaml, used, LABEL, &err), 0);
    assert_int_equal(m.n_steps, PJS_ENSEMBLE_MAX_STEPS);
    for (size_t k = 0; k < m.n_steps; k++)
        assert_int_equal(m.step_order[k], m.n_steps - 1 - k);
    assert_int_equal(m.n_calls, 1);
    pjs_manifest_free(&m);
    free(yaml);
}

/* ---- rejected ---------------------------------------------------------- */

#define ONE_IN "client_inputs:\n  - {name: x, dtype: f32, shape: [batch, 16]}\n"
#define ONE_OUT "client_outputs:\n  - {name: y, dtype: f32, shape: [batch, 4]}\n"
#define STEP_XY "    - {model: mlp, input_map: {x: x}, output_map: {y: y}}\n"

REJECT(test_reject_missing_steps, HEAD ONE_IN ONE_OUT,
       "ensemble: required key is missing (kind ensemble)", NULL)
REJECT(test_reject_empty_steps, HEAD ONE_IN ONE_OUT "ensemble:\n  steps: []\n",
       "ensemble.steps", "empty")
REJECT(test_reject_missing_client_outputs, HEAD ONE_IN "ensemble:\n  steps:\n" STEP_XY,
       "client_outputs: required key is missing (kind ensemble)", NULL)
REJECT(test_reject_executable_keys, HEAD "batch_sizes: [1]\n" ONE_IN ONE_OUT
       "ensemble:\n  steps:\n" STEP_XY,
       "batch_sizes: not allowed in a manifest of kind ensemble", NULL)
REJECT(test_reject_meta_key, HEAD "meta:\n  calls: [mlp]\n" ONE_IN ONE_OUT
       "ensemble:\n  steps:\n" STEP_XY,
       "meta: not allowed in a manifest of kind ensemble", "ensemble.steps")
REJECT(test_reject_steps_in_a_meta,
       "format_version: \"2.0\"\nname: ens\nkind: meta\nmeta:\n  calls: []\n" ONE_IN ONE_OUT
       "ensemble:\n  steps:\n" STEP_XY,
       "ensemble: not allowed in a manifest of kind meta", NULL)
REJECT(test_reject_unknown_step_key, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: {x: x}, output_map: {y: y}, batching: true}\n",
       "ensemble.steps[0]", "unknown key \"batching\"")
REJECT(test_reject_step_without_model, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {input_map: {x: x}, output_map: {y: y}}\n",
       "ensemble.steps[0].model: required key is missing", NULL)
REJECT(test_reject_step_calls_itself, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: ens, input_map: {x: x}, output_map: {y: y}}\n",
       "ensemble.steps[0].model: an ensemble cannot call itself", NULL)
REJECT(test_reject_bad_version, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, version: 0, input_map: {x: x}, output_map: {y: y}}\n",
       "ensemble.steps[0].version: must be a version number", "got 0")
REJECT(test_reject_empty_input_map, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: {}, output_map: {y: y}}\n",
       "ensemble.steps[0].input_map: must map at least one tensor", NULL)
REJECT(test_reject_input_map_list, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: [x], output_map: {y: y}}\n",
       "ensemble.steps[0].input_map", "mapping")
REJECT(test_reject_bad_tensor_name, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: {x: \"a/x\"}, output_map: {y: y}}\n",
       "ensemble.steps[0].input_map.x", "may only contain")
REJECT(test_reject_duplicate_map_key, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: {x: x, x: x}, output_map: {y: y}}\n",
       "ensemble.steps[0].input_map", "duplicate")
REJECT(test_reject_unwritten_read, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: {x: x}, output_map: {y: h}}\n"
       "    - {model: mlp, input_map: {x: hidden}, output_map: {y: y}}\n",
       "ensemble.steps[1].input_map.x: step 1 (model mlp) reads ensemble tensor \"hidden\"",
       "neither a client input nor any step's output")
REJECT(test_reject_two_writers, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n" STEP_XY STEP_XY,
       "ensemble.steps[1].output_map.y: ensemble tensor \"y\" is written already by "
       "ensemble.steps[0].output_map.y", NULL)
REJECT(test_reject_step_writes_client_input, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: {x: x}, output_map: {y: y, z: x}}\n",
       "ensemble.steps[0].output_map.z: ensemble tensor \"x\" is written already by "
       "client_inputs[0]", NULL)
REJECT(test_reject_unwritten_client_output, HEAD ONE_IN
       "client_outputs:\n  - {name: y, dtype: f32, shape: [batch, 4]}\n"
       "  - {name: z, dtype: f32, shape: [batch, 4]}\n"
       "ensemble:\n  steps:\n" STEP_XY,
       "client_outputs[1]: no step writes \"z\"", NULL)
REJECT(test_reject_client_output_is_input, HEAD ONE_IN
       "client_outputs:\n  - {name: x, dtype: f32, shape: [batch, 16]}\n"
       "ensemble:\n  steps:\n    - {model: mlp, input_map: {x: x}, output_map: {y: y}}\n",
       "client_outputs[0]: \"x\" is a client input", NULL)
REJECT(test_reject_unread_client_input, HEAD
       "client_inputs:\n  - {name: x, dtype: f32, shape: [batch, 16]}\n"
       "  - {name: unused, dtype: f32, shape: [batch, 16]}\n" ONE_OUT
       "ensemble:\n  steps:\n" STEP_XY,
       "client_inputs[1]: no step reads \"unused\"", NULL)
REJECT(test_reject_decoupled, ENSEMBLE "decoupled: true\n",
       "decoupled: only a manifest of kind meta may be decoupled (kind ensemble", NULL)
REJECT(test_reject_cycle, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: {x: x}, output_map: {y: y}}\n"
       "    - {model: f, input_map: {p: x, q: w}, output_map: {r: v}}\n"
       "    - {model: g, input_map: {p: v}, output_map: {r: w}}\n",
       "ensemble.steps[1].input_map.q: step 1 (model f) reads \"w\"",
       "the steps form a cycle")
REJECT(test_reject_self_loop, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n"
       "    - {model: mlp, input_map: {x: x, h: h}, output_map: {y: y, z: h}}\n",
       "ensemble.steps[0].input_map.h", "the steps form a cycle")

static void test_reject_too_many_steps(void **state)
{
    (void)state;
    size_t cap = 80 * 200 + 1024, used = 0;
    char *yaml = malloc(cap);
    assert_non_null(yaml);
    used += (size_t)snprintf(yaml + used, cap - used, HEAD ONE_IN ONE_OUT "ensemble:\n  steps:\n");
    for (int k = 0; k <= PJS_ENSEMBLE_MAX_STEPS; k++)
        used += (size_t)snprintf(yaml + used, cap - used, STEP_XY);
    expect_reject(yaml, "ensemble.steps: 65 steps, more than the 64 allowed", NULL);
    free(yaml);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ensemble),
        cmocka_unit_test(test_long_chain_ordered),
        cmocka_unit_test(test_reject_missing_steps),
        cmocka_unit_test(test_reject_empty_steps),
        cmocka_unit_test(test_reject_missing_client_outputs),
        cmocka_unit_test(test_reject_executable_keys),
        cmocka_unit_test(test_reject_meta_key),
        cmocka_unit_test(test_reject_steps_in_a_meta),
        cmocka_unit_test(test_reject_unknown_step_key),
        cmocka_unit_test(test_reject_step_without_model),
        cmocka_unit_test(test_reject_step_calls_itself),
        cmocka_unit_test(test_reject_bad_version),
        cmocka_unit_test(test_reject_empty_input_map),
        cmocka_unit_test(test_reject_input_map_list),
        cmocka_unit_test(test_reject_bad_tensor_name),
        cmocka_unit_test(test_reject_duplicate_map_key),
        cmocka_unit_test(test_reject_unwritten_read),
        cmocka_unit_test(test_reject_two_writers),
        cmocka_unit_test(test_reject_step_writes_client_input),
        cmocka_unit_test(test_reject_unwritten_client_output),
        cmocka_unit_test(test_reject_client_output_is_input),
        cmocka_unit_test(test_reject_unread_client_input),
        cmocka_unit_test(test_reject_cycle),
        cmocka_unit_test(test_reject_self_loop),
        cmocka_unit_test(test_reject_too_many_steps),
        cmocka_unit_test(test_reject_decoupled),
        cmocka_unit_test(test_reject_hooks_libraries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
