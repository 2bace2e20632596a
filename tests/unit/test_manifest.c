/*
 * test_manifest.c - unit tests of the manifest parser (src/core/manifest.c).
 *
 * Accepted manifests are checked field by field. Each rejection is its own
 * test made by REJECT(): it asserts the status code, that the message starts
 * with the label, that it names the field path (or other key phrase), and that
 * the output struct was left zeroed. Run under ASan, so every error path is
 * also checked for leaks. PJS_TEST_VERBOSE=1 prints every rejection message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/manifest.h"

#define LABEL "models/mlp/manifest.yaml"

static int parse(pjs_manifest *m, const char *yaml, pjs_error *err)
{
    pjs_error_clear(err);
    return pjs_manifest_parse(m, yaml, strlen(yaml), LABEL, err);
}

static void assert_zeroed(const pjs_manifest *m)
{
    static const pjs_manifest zero;
    assert_memory_equal(m, &zero, sizeof zero);
}

/* Parses yaml, expects `code` and a message that starts with the label and
 * contains every non-NULL needle. */
static void expect_reject(const char *yaml, size_t len, int code, const char *needle1,
                          const char *needle2)
{
    pjs_manifest m;
    pjs_error err;
    pjs_error_clear(&err);
    int rc = pjs_manifest_parse(&m, yaml, len, LABEL, &err);
    if (getenv("PJS_TEST_VERBOSE") != NULL)
        print_message("%s\n", err.msg);
    if (rc != code || strncmp(err.msg, LABEL ": ", strlen(LABEL) + 2) != 0 ||
        (needle1 && !strstr(err.msg, needle1)) || (needle2 && !strstr(err.msg, needle2)))
        print_error("rc=%d (%s) msg: %s\n", rc, pjs_status_name(rc), err.msg);
    assert_int_equal(rc, code);
    assert_int_equal(err.code, code);
    assert_true(strncmp(err.msg, LABEL ": ", strlen(LABEL) + 2) == 0);
    if (needle1)
        assert_non_null(strstr(err.msg, needle1));
    if (needle2)
        assert_non_null(strstr(err.msg, needle2));
    assert_zeroed(&m);
    pjs_manifest_free(&m);
}

/* Pieces of a valid model manifest to build variants from. */
#define HEAD "format_version: \"2.0\"\nname: mlp\n"
#define BATCH "batch_sizes: [1, 4, 8]\n"
#define IN "inputs:\n  - {name: x, dtype: f32, shape: [batch, 16]}\n"
#define OUT "outputs:\n  - {name: y, dtype: f32, shape: [batch, 4]}\n"
#define MODEL HEAD BATCH IN OUT
#define META_BODY                                                                             \
    "kind: meta\nmeta:\n  calls: [stage1, stage2]\n"                                          \
    "client_inputs:\n  - {name: text, dtype: u8, shape: [batch, 64]}\n"                      \
    "client_outputs:\n  - {name: label, dtype: i64, shape: [batch]}\n"

#define REJECT_CODE(test, code, yaml, n1, n2)                                                 \
    static void test(void **state)                                                            \
    {                                                                                         \
        (void)state;                                                                          \
        expect_reject(yaml, sizeof(yaml) - 1, code, n1, n2);                                  \
    }
#define REJECT(test, yaml, n1, n2) REJECT_CODE(test, PJS_ERR_INVALID_ARGUMENT, yaml, n1, n2)

/* ---- accepted ---------------------------------------------------------- */

static void check_tensor(const pjs_tensor_spec *t, const char *name, pjs_dtype dtype,
                         bool batched, int rank, const int64_t *dims)
{
    assert_string_equal(t->name, name);
    assert_int_equal(t->dtype, dtype);
    assert_int_equal(t->batched, batched);
    assert_int_equal(t->shape.rank, rank);
    for (int i = 0; i < rank; i++)
        assert_int_equal(t->shape.dims[i], dims[i]);
}

static void check_full_model(const pjs_manifest *m)
{
    assert_string_equal(m->name, "mlp");
    assert_int_equal(m->kind, PJS_KIND_MODEL);
    assert_string_equal(m->description, "two-layer MLP");
    assert_int_equal(m->n_batch_sizes, 3);
    assert_int_equal(m->batch_sizes[0], 1);
    assert_int_equal(m->batch_sizes[1], 4);
    assert_int_equal(m->batch_sizes[2], 8);
    assert_int_equal(m->n_inputs, 2);
    check_tensor(&m->inputs[0], "x", PJS_DTYPE_F32, true, 2, (const int64_t[]){-1, 16});
    check_tensor(&m->inputs[1], "mask.v-2_b", PJS_DTYPE_BOOL, true, 3,
                 (const int64_t[]){-1, 2, 0});
    assert_int_equal(m->n_outputs, 1);
    check_tensor(&m->outputs[0], "y", PJS_DTYPE_BF16, true, 2, (const int64_t[]){-1, 4});
    assert_int_equal(m->residency, PJS_RESIDENCY_DEVICE);
    assert_true(m->weight == 2.5);
    assert_int_equal(m->n_calls, 0);
    assert_null(m->calls);
}

static void test_full_model_block_style(void **state)
{
    (void)state;
    const char *yaml = "# a comment\n"
                       "format_version: \"2.0\"\n"
                       "name: mlp\n"
                       "kind: model\n"
                       "description: \"two-layer MLP\"\n"
                       "batch_sizes:\n  - 1\n  - 4\n  - 8\n"
                       "inputs:\n"
                       "  - name: x\n    dtype: f32\n    shape:\n      - batch\n      - 16\n"
                       "  - name: mask.v-2_b\n    dtype: bool\n    shape: [batch, 2, 0]\n"
                       "outputs:\n"
                       "  - name: y\n    dtype: bf16\n    shape: [batch, 4]\n"
                       "residency: device\n"
                       "weight: 2.5\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    check_full_model(&m);
    pjs_manifest_free(&m);
    assert_zeroed(&m);
}

static void test_full_model_flow_style(void **state)
{
    (void)state;
    const char *yaml = "{format_version: 2.0, name: mlp, kind: model, "
                       "description: 'two-layer MLP', batch_sizes: [1, 4, 8], "
                       "inputs: [{name: x, dtype: f32, shape: [batch, 16]}, "
                       "{name: mask.v-2_b, dtype: bool, shape: [batch, 2, 0]}], "
                       "outputs: [{shape: [batch, 4], dtype: bf16, name: y}], "
                       "residency: device, weight: 25e-1}\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    check_full_model(&m);
    pjs_manifest_free(&m);
}

static void test_defaults(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, MODEL, &err), 0);
    assert_int_equal(m.kind, PJS_KIND_MODEL);
    assert_null(m.description);
    assert_int_equal(m.residency, PJS_RESIDENCY_HOST);
    assert_true(m.weight == 1.0);
    assert_int_equal(m.n_calls, 0);
    /* Without `variants`, the top level is the one variant. */
    assert_int_equal(m.n_variants, 1);
    assert_string_equal(m.variants[0].name, "default");
    assert_ptr_equal(m.variants[0].inputs, m.inputs);
    assert_ptr_equal(m.variants[0].outputs, m.outputs);
    pjs_manifest_free(&m);
}

static void test_format_version_spellings(void **state)
{
    (void)state;
    static const char *const versions[] = {"\"2.0\"", "'2.0'", "2.0"};
    for (size_t i = 0; i < 3; i++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml, "format_version: %s\nname: mlp\n" BATCH IN OUT, versions[i]);
        pjs_manifest m;
        pjs_error err;
        assert_int_equal(parse(&m, yaml, &err), 0);
        pjs_manifest_free(&m);
    }
}

static void test_valid_meta(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, HEAD META_BODY "residency: unpinned\n", &err), 0);
    assert_int_equal(m.kind, PJS_KIND_META);
    assert_int_equal(m.n_batch_sizes, 0);
    assert_null(m.batch_sizes);
    assert_int_equal(m.n_calls, 2);
    assert_string_equal(m.calls[0], "stage1");
    assert_string_equal(m.calls[1], "stage2");
    assert_int_equal(m.n_inputs, 0);
    assert_int_equal(m.n_outputs, 0);
    assert_int_equal(m.n_client_inputs, 1);
    check_tensor(&m.client_inputs[0], "text", PJS_DTYPE_U8, true, 2, (const int64_t[]){-1, 64});
    assert_int_equal(m.n_client_outputs, 1);
    check_tensor(&m.client_outputs[0], "label", PJS_DTYPE_I64, true, 1, (const int64_t[]){-1});
    size_t n = 0;
    assert_ptr_equal(pjs_manifest_client_tensors(&m, false, &n), m.client_inputs);
    assert_int_equal(n, 1);
    assert_int_equal(m.residency, PJS_RESIDENCY_UNPINNED);
    assert_int_equal(m.n_variants, 0);
    assert_null(m.variants);
    pjs_manifest_free(&m);
}

/* A hooked model: the executable's tensors plus what clients send and get,
 * with strings and extents that vary. */
static void test_valid_hooked_model(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, MODEL
                           "client_inputs:\n"
                           "  - {name: IMAGE, dtype: u8, shape: [-1, -1, 3], format: NHWC}\n"
                           "client_outputs:\n"
                           "  - {name: LABELS, dtype: BYTES, shape: [-1]}\n"
                           "  - {name: SCORES, dtype: f32, shape: [batch, 5]}\n",
                           &err),
                     0);
    assert_int_equal(m.kind, PJS_KIND_MODEL);
    assert_int_equal(m.n_inputs, 1);
    assert_int_equal(m.n_client_inputs, 1);
    check_tensor(&m.client_inputs[0], "IMAGE", PJS_DTYPE_U8, false, 3,
                 (const int64_t[]){-1, -1, 3});
    assert_int_equal(m.client_inputs[0].format, PJS_FORMAT_NHWC);
    assert_int_equal(m.n_client_outputs, 2);
    check_tensor(&m.client_outputs[0], "LABELS", PJS_DTYPE_BYTES, false, 1, (const int64_t[]){-1});
    check_tensor(&m.client_outputs[1], "SCORES", PJS_DTYPE_F32, true, 2, (const int64_t[]){-1, 5});
    size_t n = 0;
    assert_ptr_equal(pjs_manifest_client_tensors(&m, true, &n), m.client_outputs);
    assert_int_equal(n, 2);
    pjs_shape s = pjs_manifest_client_shape(&m, false, 0);
    assert_int_equal(s.rank, 3);
    assert_int_equal(s.dims[0], -1);
    pjs_manifest_free(&m);

    /* Only one side declared: the other is the executable's. */
    assert_int_equal(parse(&m, MODEL "client_outputs: [{name: b, dtype: bytes, shape: []}]\n",
                           &err),
                     0);
    assert_ptr_equal(pjs_manifest_client_tensors(&m, false, &n), m.inputs);
    assert_int_equal(n, 1);
    assert_ptr_equal(pjs_manifest_client_tensors(&m, true, &n), m.client_outputs);
    pjs_manifest_free(&m);
}

static void test_meta_empty_calls(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, HEAD "kind: meta\nmeta: {calls: []}\n"
                                    "client_inputs: [{name: a, dtype: f32, shape: []}]\n"
                                    "client_outputs: [{name: b, dtype: f32, shape: []}]\n",
                           &err),
                     0);
    assert_int_equal(m.n_calls, 0);
    assert_null(m.calls);
    pjs_manifest_free(&m);
}

static void test_meta_decoupled(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, HEAD META_BODY "decoupled: true\n", &err), 0);
    assert_true(m.decoupled);
    pjs_manifest_free(&m);
    assert_int_equal(parse(&m, HEAD META_BODY "decoupled: false\n", &err), 0);
    assert_false(m.decoupled);
    pjs_manifest_free(&m);
    assert_int_equal(parse(&m, HEAD META_BODY, &err), 0);
    assert_false(m.decoupled);
    pjs_manifest_free(&m);
}

/* ---- hooks_libraries ---------------------------------------------------- */

static void test_hooks_libraries(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, MODEL "hooks_libraries: [turbojpeg, stdc++, png16, gtk-3.0]\n",
                           &err), 0);
    assert_int_equal(m.n_hooks_libraries, 4);
    assert_string_equal(m.hooks_libraries[0], "turbojpeg");
    assert_string_equal(m.hooks_libraries[1], "stdc++");
    assert_string_equal(m.hooks_libraries[3], "gtk-3.0");
    pjs_manifest_free(&m);
    assert_int_equal(parse(&m, HEAD META_BODY "hooks_libraries: [z]\n", &err), 0);
    assert_int_equal(m.n_hooks_libraries, 1);
    assert_string_equal(m.hooks_libraries[0], "z");
    pjs_manifest_free(&m);
    assert_int_equal(parse(&m, MODEL "hooks_libraries: []\n", &err), 0);
    assert_int_equal(m.n_hooks_libraries, 0);
    assert_null(m.hooks_libraries);
    pjs_manifest_free(&m);
}

#define LIB_RULE "1 to 64 of [A-Za-z0-9_+.-], not starting with '-'"
REJECT(test_reject_library_option, MODEL "hooks_libraries: [-shared]\n", "hooks_libraries[0]",
       LIB_RULE)
REJECT(test_reject_library_space, MODEL "hooks_libraries: [m, \"turbo jpeg\"]\n",
       "hooks_libraries[1]", LIB_RULE)
REJECT(test_reject_library_shell, MODEL "hooks_libraries: [\"z;rm\"]\n", "hooks_libraries[0]",
       LIB_RULE)
REJECT(test_reject_library_path, MODEL "hooks_libraries: [\"../lib/x\"]\n",
       "hooks_libraries[0]", LIB_RULE)
REJECT(test_reject_library_empty, MODEL "hooks_libraries: [\"\"]\n", "hooks_libraries[0]",
       LIB_RULE)
REJECT(test_reject_library_long,
       MODEL "hooks_libraries: [a1234567890123456789012345678901234567890123456789012345678901234]\n",
       "hooks_libraries[0]", LIB_RULE)
REJECT(test_reject_library_twice, MODEL "hooks_libraries: [m, turbojpeg, m]\n",
       "hooks_libraries[2]", "duplicate")
REJECT(test_reject_library_not_list, MODEL "hooks_libraries: turbojpeg\n", "hooks_libraries",
       NULL)
REJECT(test_reject_library_mapping, MODEL "hooks_libraries: [{name: m}]\n",
       "hooks_libraries[0]", NULL)

/* ---- stateful models (sequence:) ----------------------------------------- */

#define ACC_TENSORS                                                                           \
    "batch_sizes: [1, 4]\n"                                                                   \
    "inputs:\n  - {name: x, dtype: f32, shape: [batch, 3]}\n"                                 \
    "  - {name: state_in, dtype: f32, shape: [batch, 3]}\n"                                   \
    "outputs:\n  - {name: state_out, dtype: f32, shape: [batch, 3]}\n"                        \
    "  - {name: sum, dtype: f32, shape: [batch, 3]}\n"
#define ACC HEAD ACC_TENSORS

static void test_sequence_state(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, ACC "sequence:\n  state:\n    - {input: state_in, output: "
                                   "state_out, initial: zeros}\n  idle_timeout_ms: 500\n"
                                   "  max_sequences: 8\n",
                           &err),
                     0);
    assert_true(m.stateful);
    assert_int_equal(m.sequence.n_state, 1);
    assert_int_equal(m.sequence.state[0].input, 1);
    assert_int_equal(m.sequence.state[0].output, 0);
    assert_int_equal(m.sequence.idle_timeout_ms, 500);
    assert_int_equal(m.sequence.max_sequences, 8);
    assert_int_equal(m.sequence.max_sequences_per_client, 2); /* a quarter */
    assert_int_equal(m.sequence.evict_after_idle_ms, 500); /* 1 s, within the timeout */
    size_t n = 0;
    const pjs_tensor_spec *t = pjs_manifest_client_tensors(&m, false, &n);
    assert_int_equal(n, 1);
    assert_string_equal(t[0].name, "x");
    t = pjs_manifest_client_tensors(&m, true, &n);
    assert_int_equal(n, 1);
    assert_string_equal(t[0].name, "sum");
    assert_int_equal(pjs_manifest_client_shape(&m, true, 0).dims[1], 3);
    pjs_manifest_free(&m);
    /* Defaults. */
    assert_int_equal(parse(&m, ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n",
                           &err),
                     0);
    assert_int_equal(m.sequence.idle_timeout_ms, 60000);
    assert_int_equal(m.sequence.max_sequences, 1024);
    assert_int_equal(m.sequence.max_sequences_per_client, 256);
    assert_int_equal(m.sequence.evict_after_idle_ms, 1000);
    pjs_manifest_free(&m);
    assert_int_equal(parse(&m, ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n"
                                   "  evict_after_idle_ms: 250\n  max_sequences: 3\n",
                           &err),
                     0);
    assert_int_equal(m.sequence.evict_after_idle_ms, 250);
    assert_int_equal(m.sequence.max_sequences_per_client, 1); /* at least one */
    pjs_manifest_free(&m);
    assert_int_equal(parse(&m, ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n"
                                   "  max_sequences: 16\n  max_sequences_per_client: 16\n",
                           &err),
                     0);
    assert_int_equal(m.sequence.max_sequences_per_client, 16);
    pjs_manifest_free(&m);
    assert_int_equal(parse(&m, ACC, &err), 0);
    assert_false(m.stateful);
    pjs_manifest_free(&m);
}

REJECT(test_reject_sequence_unknown_input,
       ACC "sequence:\n  state: [{input: nope, output: state_out}]\n", "sequence.state[0]",
       "input \"nope\" is not one of the model's inputs")
REJECT(test_reject_sequence_unknown_output,
       ACC "sequence:\n  state: [{input: state_in, output: nope}]\n", "sequence.state[0]",
       "output \"nope\" is not one of the model's outputs")
REJECT(test_reject_sequence_mismatch,
       HEAD "batch_sizes: [1]\ninputs:\n  - {name: x, dtype: f32, shape: [batch, 3]}\n"
            "  - {name: s, dtype: f32, shape: [batch, 3]}\n"
            "outputs:\n  - {name: t, dtype: f32, shape: [batch, 4]}\n"
            "sequence:\n  state: [{input: s, output: t}]\n",
       "sequence.state[0]", "must have the same dtype and shape")
REJECT(test_reject_sequence_initial,
       ACC "sequence:\n  state: [{input: state_in, output: state_out, initial: ones}]\n",
       "sequence.state[0]", "only \"zeros\"")
REJECT(test_reject_sequence_no_state, ACC "sequence:\n  idle_timeout_ms: 5\n", "sequence",
       "declare the sequence's state")
REJECT(test_reject_sequence_timeout,
       ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n  idle_timeout_ms: 0\n",
       "sequence.idle_timeout_ms", "must be 1..86400000")
REJECT(test_reject_sequence_eviction_floor,
       ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n  idle_timeout_ms: 500\n"
           "  evict_after_idle_ms: 501\n",
       "sequence.evict_after_idle_ms", "must be 1..500 (the idle timeout, milliseconds), got 501")
REJECT(test_reject_sequence_per_client_cap,
       ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n  max_sequences: 8\n"
           "  max_sequences_per_client: 9\n",
       "sequence.max_sequences_per_client", "must be 1..8 (sequence.max_sequences), got 9")
REJECT(test_reject_sequence_unknown_key,
       ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n  slots: 3\n",
       "slots", NULL)
REJECT(test_reject_sequence_twice,
       ACC "sequence:\n  state: [{input: state_in, output: state_out}, "
           "{input: state_in, output: sum}]\n",
       "sequence.state[1]", "already used")
REJECT(test_reject_sequence_on_meta, HEAD META_BODY "sequence:\n  state: []\n", "sequence",
       "only kind: model keeps state")
REJECT(test_reject_sequence_all_state,
       HEAD "batch_sizes: [1]\ninputs:\n  - {name: s, dtype: f32, shape: [batch, 3]}\n"
            "outputs:\n  - {name: t, dtype: f32, shape: [batch, 3]}\n"
            "sequence:\n  state: [{input: s, output: t}]\n",
       "sequence", "at least one input")

/* Triton's simple_dyna_sequence: control inputs the server fills. */
#define CONTROLLED                                                                            \
    HEAD "batch_sizes: [1, 8]\n"                                                              \
         "inputs:\n  - {name: INPUT, dtype: i32, shape: [batch, 1]}\n"                        \
         "  - {name: START, dtype: i32, shape: [batch, 1]}\n"                                  \
         "  - {name: END, dtype: bool, shape: [batch]}\n"                                      \
         "  - {name: READY, dtype: f32, shape: [batch, 1]}\n"                                  \
         "  - {name: CORRID, dtype: u64, shape: [batch, 1]}\n"                                 \
         "  - {name: WIDE, dtype: i32, shape: [batch, 2]}\n"                                   \
         "  - {name: FIXED, dtype: i32, shape: [1]}\n"                                         \
         "outputs:\n  - {name: OUTPUT, dtype: i32, shape: [batch, 1]}\n"

static void test_sequence_controls(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, CONTROLLED "sequence:\n  controls: {start: START, end: END, "
                                          "ready: READY, corrid: CORRID}\n",
                           &err),
                     0);
    assert_true(m.stateful);
    assert_int_equal(m.sequence.n_state, 0);
    assert_int_equal(m.sequence.control[PJS_CONTROL_START], 1);
    assert_int_equal(m.sequence.control[PJS_CONTROL_END], 2);
    assert_int_equal(m.sequence.control[PJS_CONTROL_READY], 3);
    assert_int_equal(m.sequence.control[PJS_CONTROL_CORRID], 4);
    size_t n = 0;
    const pjs_tensor_spec *t = pjs_manifest_client_tensors(&m, false, &n);
    assert_int_equal(n, 3); /* INPUT, WIDE, FIXED: the controls are the server's */
    assert_string_equal(t[0].name, "INPUT");
    assert_string_equal(t[1].name, "WIDE");
    t = pjs_manifest_client_tensors(&m, true, &n);
    assert_int_equal(n, 1);
    pjs_manifest_free(&m);
    /* Some controls, with state. */
    assert_int_equal(parse(&m, ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n",
                           &err),
                     0);
    for (int k = 0; k < PJS_CONTROL_COUNT; k++)
        assert_true(m.sequence.control[k] == PJS_CONTROL_NONE);
    pjs_manifest_free(&m);
    assert_string_equal(pjs_sequence_control_name(PJS_CONTROL_CORRID), "corrid");
}

REJECT(test_reject_control_unknown_input,
       CONTROLLED "sequence:\n  controls: {start: NOPE}\n", "sequence.controls.start",
       "input \"NOPE\" is not one of the model's inputs")
REJECT(test_reject_control_unknown_kind, CONTROLLED "sequence:\n  controls: {begin: START}\n",
       "begin", NULL)
REJECT(test_reject_control_wide, CONTROLLED "sequence:\n  controls: {start: WIDE}\n",
       "sequence.controls.start", "one element per row")
REJECT(test_reject_control_unbatched, CONTROLLED "sequence:\n  controls: {ready: FIXED}\n",
       "sequence.controls.ready", "batch axis")
REJECT(test_reject_control_flag_dtype, CONTROLLED "sequence:\n  controls: {start: CORRID}\n",
       "sequence.controls.start", "bool, i32 or f32")
REJECT(test_reject_control_id_dtype, CONTROLLED "sequence:\n  controls: {corrid: READY}\n",
       "sequence.controls.corrid", "i32, i64, u32 or u64")
REJECT(test_reject_control_twice,
       CONTROLLED "sequence:\n  controls: {start: START, end: START}\n",
       "sequence.controls.end", "already takes")
REJECT(test_reject_control_on_state,
       ACC "sequence:\n  state: [{input: state_in, output: state_out}]\n"
           "  controls: {start: state_in}\n",
       "sequence.controls.start", "already takes")
REJECT(test_reject_control_every_input,
       HEAD "batch_sizes: [1]\ninputs:\n  - {name: s, dtype: i32, shape: [batch, 1]}\n"
            "outputs:\n  - {name: t, dtype: i32, shape: [batch, 1]}\n"
            "sequence:\n  controls: {start: s}\n",
       "sequence", "at least one input")

static void test_kserve_dtype_names(void **state)
{
    (void)state;
    const char *yaml = HEAD BATCH
        "inputs:\n"
        "  - {name: a, dtype: FP32, shape: [batch]}\n"
        "  - {name: b, dtype: INT64, shape: [batch]}\n"
        "  - {name: c, dtype: uint8, shape: [batch]}\n"
        "  - {name: d, dtype: Fp16, shape: [batch]}\n"
        "  - {name: e, dtype: BOOL, shape: [batch]}\n"
        "  - {name: f, dtype: BF16, shape: [batch]}\n"
        "  - {name: g, dtype: I32, shape: [batch]}\n" OUT;
    static const pjs_dtype want[] = {PJS_DTYPE_F32, PJS_DTYPE_I64,  PJS_DTYPE_U8, PJS_DTYPE_F16,
                                     PJS_DTYPE_BOOL, PJS_DTYPE_BF16, PJS_DTYPE_I32};
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    assert_int_equal(m.n_inputs, 7);
    for (size_t i = 0; i < 7; i++)
        assert_int_equal(m.inputs[i].dtype, want[i]);
    pjs_manifest_free(&m);
}

static void test_unbatched_and_scalar_tensors(void **state)
{
    (void)state;
    const char *yaml = HEAD "batch_sizes: [1]\n"
                            "inputs:\n"
                            "  - {name: s, dtype: f64, shape: []}\n"
                            "  - {name: m, dtype: i8, shape: [3, 4]}\n"
                            "  - {name: r8, dtype: u16, shape: [batch, 1, 1, 1, 1, 1, 1, 1]}\n"
                            "outputs:\n  - {name: out, dtype: u64, shape: [+0]}\n"
                            "weight: 3\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    check_tensor(&m.inputs[0], "s", PJS_DTYPE_F64, false, 0, NULL);
    check_tensor(&m.inputs[1], "m", PJS_DTYPE_I8, false, 2, (const int64_t[]){3, 4});
    assert_int_equal(m.inputs[2].shape.rank, PJS_MAX_RANK);
    assert_true(m.inputs[2].batched);
    check_tensor(&m.outputs[0], "out", PJS_DTYPE_U64, false, 1, (const int64_t[]){0});
    assert_true(m.weight == 3.0);
    pjs_manifest_free(&m);
}

/* An input's image layout: NHWC or NCHW on three extents besides the batch
 * axis (or three in all without one); none by default; never on outputs. */
static void test_input_formats(void **state)
{
    (void)state;
    const char *yaml = HEAD "batch_sizes: [1]\n"
                            "inputs:\n"
                            "  - {name: img, dtype: f32, shape: [batch, 28, 28, 1], format: NHWC}\n"
                            "  - {name: chw, dtype: u8, shape: [3, 8, 8], format: NCHW}\n"
                            "  - {name: plain, dtype: f32, shape: [batch, 4]}\n"
                            "outputs:\n  - {name: out, dtype: f32, shape: [batch, 2]}\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    assert_int_equal(m.inputs[0].format, PJS_FORMAT_NHWC);
    assert_int_equal(m.inputs[1].format, PJS_FORMAT_NCHW);
    assert_int_equal(m.inputs[2].format, PJS_FORMAT_NONE);
    assert_string_equal(pjs_tensor_format_name(m.inputs[0].format), "FORMAT_NHWC");
    assert_string_equal(pjs_tensor_format_name(m.inputs[2].format), "FORMAT_NONE");
    pjs_manifest_free(&m);

    static const struct {
        const char *tensors, *needle1, *needle2;
    } bad[] = {
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 4], format: NHWC}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2]}\n",
         "inputs[0].format", "has 1"},
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 2, 2, 2], format: HWC}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2]}\n",
         "unknown format \"HWC\"", "NHWC or NCHW"},
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 2, 2, 2], format: nchw}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2]}\n",
         "unknown format", NULL},
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 2, 2, 2]}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2, 2, 2], format: NHWC}\n",
         "outputs[0]", "format"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char doc[1024];
        snprintf(doc, sizeof doc, HEAD "batch_sizes: [1]\n%s", bad[i].tensors);
        expect_reject(doc, strlen(doc), PJS_ERR_INVALID_ARGUMENT, bad[i].needle1, bad[i].needle2);
    }
}

static void test_output_labels(void **state)
{
    (void)state;
    const char *yaml = HEAD "batch_sizes: [1]\n"
                            "inputs:\n  - {name: x, dtype: f32, shape: [batch, 4]}\n"
                            "outputs:\n"
                            "  - {name: logits, dtype: f32, shape: [batch, 3], "
                            "labels: classes.txt}\n"
                            "  - {name: raw, dtype: i8, shape: [batch, 3]}\n"
                            "variants:\n  - {name: wide, inputs: {x: [batch, 8]}}\n"
                            "client_outputs:\n"
                            "  - {name: TOP, dtype: u16, shape: [-1], labels: top.txt}\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    assert_non_null(m.outputs[0].labels);
    assert_string_equal(m.outputs[0].labels->file, "classes.txt");
    assert_int_equal(m.outputs[0].labels->count, 0); /* read by pjs_manifest_load only */
    assert_null(m.outputs[1].labels);
    assert_ptr_equal(m.variants[1].outputs[0].labels, m.outputs[0].labels); /* shared */
    assert_string_equal(m.client_outputs[0].labels->file, "top.txt");
    assert_int_equal(pjs_tensor_spec_row_elements(&m.outputs[0]), 3);
    assert_int_equal(pjs_tensor_spec_row_elements(&m.client_outputs[0]), -1);
    pjs_manifest_free(&m);

    static const struct {
        const char *tensors, *needle1, *needle2;
    } bad[] = {
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 4], labels: l.txt}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2]}\n",
         "inputs[0]: unknown key \"labels\"", NULL},
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 4]}\n"
         "outputs:\n  - {name: y, dtype: bool, shape: [batch, 2], labels: l.txt}\n",
         "outputs[0].labels", "only a numeric output has classes to label; this one is bool"},
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 4]}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2], labels: sub/l.txt}\n",
         "outputs[0].labels", "may only contain"},
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 4]}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2], labels: .hidden}\n",
         "outputs[0].labels", "must not start with '.'"},
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 4]}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2], labels: [a, b]}\n",
         "outputs[0].labels", NULL},
        {"inputs:\n  - {name: x, dtype: f32, shape: [batch, 4]}\n"
         "outputs:\n  - {name: y, dtype: f32, shape: [batch, 2]}\n"
         "client_outputs:\n  - {name: S, dtype: bytes, shape: [2], labels: l.txt}\n",
         "client_outputs[0].labels", "this one is bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char doc[1024];
        snprintf(doc, sizeof doc, HEAD "batch_sizes: [1]\n%s", bad[i].tensors);
        expect_reject(doc, strlen(doc), PJS_ERR_INVALID_ARGUMENT, bad[i].needle1, bad[i].needle2);
    }
}

static void test_name_limits(void **state)
{
    (void)state;
    char name[129];
    memset(name, 'a', 128);
    name[128] = '\0';
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "format_version: '2.0'\nname: %s\n" BATCH IN OUT, name);
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    assert_int_equal(strlen(m.name), 128);
    pjs_manifest_free(&m);
    /* One more character is too long. */
    snprintf(yaml, sizeof yaml, "format_version: '2.0'\nname: %sa\n" BATCH IN OUT, name);
    expect_reject(yaml, strlen(yaml), PJS_ERR_INVALID_ARGUMENT, "name: ", "1..128");
}

static void test_batch_size_limits(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, HEAD "batch_sizes: [1, 65536]\n" IN OUT, &err), 0);
    assert_int_equal(m.batch_sizes[1], 65536);
    pjs_manifest_free(&m);
}

static void test_residency_names(void **state)
{
    (void)state;
    assert_string_equal(pjs_residency_name(PJS_RESIDENCY_HOST), "host");
    assert_string_equal(pjs_residency_name(PJS_RESIDENCY_DEVICE), "device");
    assert_string_equal(pjs_residency_name(PJS_RESIDENCY_UNPINNED), "unpinned");
    assert_string_equal(pjs_residency_name((pjs_residency)7), "invalid");
}

static void test_free_zeroed_and_twice(void **state)
{
    (void)state;
    pjs_manifest m;
    memset(&m, 0, sizeof m);
    pjs_manifest_free(&m);
    pjs_manifest_free(NULL);
    pjs_error err;
    assert_int_equal(parse(&m, MODEL, &err), 0);
    pjs_manifest_free(&m);
    pjs_manifest_free(&m);
    assert_zeroed(&m);
}

static void test_free_partial(void **state)
{
    (void)state;
    /* A struct filled part way, as a caller building one by hand might leave it. */
    pjs_manifest m = {0};
    m.name = strdup("x");
    m.n_inputs = 3;
    m.inputs = calloc(3, sizeof *m.inputs);
    m.inputs[0].name = strdup("a");
    m.n_calls = 2;
    m.calls = calloc(2, sizeof *m.calls);
    pjs_manifest_free(&m);
    assert_zeroed(&m);
}

/* ---- rejected: structure ---------------------------------------------------- */

REJECT(test_reject_empty_file, "", "empty manifest", NULL)
REJECT(test_reject_comments_only, "# nothing here\n\n", "empty manifest", NULL)
REJECT(test_reject_top_level_list, "- a\n- b\n", "top level must be a mapping", "a list")
REJECT(test_reject_top_level_scalar, "hello\n", "top level must be a mapping", "a scalar")
REJECT(test_reject_bare_document_marker, "---\n", "top level must be a mapping", NULL)
REJECT(test_reject_syntax_error, HEAD "batch_sizes: [1, 4\ninputs: x\n", "YAML syntax error",
       "line ")
REJECT(test_reject_syntax_error_line, "format_version: '2.0'\nname: mlp\nkind: model\n"
                                      "  bad: indent\n",
       "line 4: YAML syntax error", NULL)
REJECT(test_reject_invalid_utf8, HEAD "description: \"\xff\xfe\"\n" BATCH IN OUT, "invalid YAML",
       NULL)
REJECT(test_reject_alias, HEAD "batch_sizes: &b [1, 4]\n" IN OUT "weight: *b\n", "anchors",
       "line 3")
REJECT(test_reject_alias_only, HEAD BATCH "inputs: *undefined\n" OUT, "line 4", NULL)
REJECT(test_reject_billion_laughs,
       "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
       "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n",
       "anchors are not allowed", NULL)
REJECT(test_reject_tag, HEAD "description: !!str hello\n" BATCH IN OUT, "tags are not allowed",
       "line 3")
REJECT(test_reject_multiple_documents, MODEL "---\n" MODEL, "multiple YAML documents", "line 8")
REJECT(test_reject_deep_nesting,
       HEAD "description: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
       "nested deeper", NULL)
REJECT(test_reject_duplicate_top_key, MODEL "name: other\n", "name: duplicate key", "line 8")
REJECT(test_reject_duplicate_tensor_key,
       HEAD BATCH "inputs:\n  - {name: x, dtype: f32, dtype: f16, shape: []}\n" OUT,
       "inputs[0].dtype: duplicate key", NULL)
REJECT(test_reject_non_scalar_key, MODEL "[a]: 1\n", "keys must be strings", NULL)
REJECT(test_reject_unknown_top_key, HEAD BATCH "input:\n  - {name: x, dtype: f32, shape: []}\n" IN OUT,
       "unknown key \"input\" at top level", "line 4")
REJECT(test_reject_unknown_tensor_key,
       HEAD BATCH IN "outputs:\n  - {name: y, dtype: f32, shape: [], dims: [1]}\n",
       "outputs[0]: unknown key \"dims\"", NULL)
REJECT(test_reject_unknown_meta_key,
       HEAD "kind: meta\nmeta: {calls: [], call: [a]}\n"
            "client_inputs: [{name: a, dtype: f32, shape: []}]\n"
            "client_outputs: [{name: b, dtype: f32, shape: []}]\n",
       "meta: unknown key \"call\"", NULL)
REJECT(test_reject_decoupled_model, MODEL "decoupled: true\n",
       "decoupled: only a manifest of kind meta may be decoupled (kind model", "pjserve_respond")
REJECT(test_reject_decoupled_not_bool, HEAD META_BODY "decoupled: yes please\n", "decoupled",
       NULL)
REJECT(test_reject_unknown_key_is_quoted_safely, MODEL "\"\\x01\\n\": 1\n", "unknown key \"??\"",
       NULL)

/* ---- rejected: required keys and version ---------------------------------- */

REJECT(test_reject_missing_version, "name: mlp\n" BATCH IN OUT,
       "format_version: required key is missing", NULL)
REJECT(test_reject_missing_name, "format_version: '2.0'\n" BATCH IN OUT,
       "name: required key is missing", NULL)
REJECT(test_reject_missing_batch_sizes, HEAD IN OUT, "batch_sizes: required key is missing",
       "kind model")
REJECT(test_reject_missing_inputs, HEAD BATCH OUT, "inputs: required key is missing", NULL)
REJECT(test_reject_missing_outputs, HEAD BATCH IN, "outputs: required key is missing", NULL)
REJECT(test_reject_missing_shape, HEAD BATCH "inputs: [{name: x, dtype: f32}]\n" OUT,
       "inputs[0].shape: required key is missing", NULL)
REJECT(test_reject_meta_missing_client_inputs,
       HEAD "kind: meta\nmeta: {calls: []}\nclient_outputs: [{name: b, dtype: f32, shape: []}]\n",
       "client_inputs: required key is missing", "kind meta")
REJECT(test_reject_meta_missing_meta,
       HEAD "kind: meta\nclient_inputs: [{name: a, dtype: f32, shape: []}]\n"
            "client_outputs: [{name: b, dtype: f32, shape: []}]\n",
       "meta: required key is missing", NULL)
REJECT(test_reject_meta_missing_calls,
       HEAD "kind: meta\nmeta: {}\nclient_inputs: [{name: a, dtype: f32, shape: []}]\n"
            "client_outputs: [{name: b, dtype: f32, shape: []}]\n",
       "meta.calls: required key is missing", NULL)
REJECT(test_reject_version_1, "format_version: '1.0'\nname: mlp\n" BATCH IN OUT,
       "format_version: unsupported version \"1.0\"", "\"2.0\"")
REJECT(test_reject_version_int, "format_version: 2\nname: mlp\n" BATCH IN OUT,
       "format_version: unsupported version \"2\"", NULL)
REJECT(test_reject_version_200, "format_version: 2.00\nname: mlp\n" BATCH IN OUT,
       "format_version: unsupported", NULL)
REJECT(test_reject_version_list, "format_version: [2.0]\nname: mlp\n" BATCH IN OUT,
       "format_version: unsupported version a list", NULL)
/* A future version's unknown keys are reported as a version problem. */
REJECT(test_reject_version_before_unknown_key, "format_version: '3.0'\nshards: 4\n",
       "format_version: unsupported", NULL)

/* ---- rejected: names, kind, residency, weight ----------------------------- */

REJECT(test_reject_name_space, "format_version: '2.0'\nname: my model\n" BATCH IN OUT,
       "name: \"my model\" may only contain", NULL)
REJECT(test_reject_name_dot, "format_version: '2.0'\nname: .hidden\n" BATCH IN OUT,
       "name: \".hidden\" must not start with '.'", NULL)
REJECT(test_reject_name_slash, "format_version: '2.0'\nname: ../etc\n" BATCH IN OUT, "name: ",
       NULL)
REJECT(test_reject_name_empty, "format_version: '2.0'\nname: ''\n" BATCH IN OUT, "name: ",
       "1..128")
REJECT(test_reject_name_null, "format_version: '2.0'\nname:\n" BATCH IN OUT,
       "name: must be a string, got null", NULL)
REJECT(test_reject_name_nul_byte, "format_version: '2.0'\nname: \"a\\0b\"\n" BATCH IN OUT,
       "name: must not contain NUL", NULL)
REJECT(test_reject_name_list, "format_version: '2.0'\nname: [a]\n" BATCH IN OUT,
       "name: must be a string, got a list", NULL)
REJECT(test_reject_tensor_name, HEAD BATCH "inputs: [{name: 'x y', dtype: f32, shape: []}]\n" OUT,
       "inputs[0].name: ", NULL)
REJECT(test_reject_bad_kind, HEAD "kind: pipeline\n" BATCH IN OUT, "kind: unknown kind", NULL)
REJECT(test_reject_bad_residency, MODEL "residency: gpu\n", "residency: unknown residency \"gpu\"",
       NULL)
REJECT(test_reject_weight_zero, MODEL "weight: 0\n", "weight: must be a positive", NULL)
REJECT(test_reject_weight_negative, MODEL "weight: -1.5\n", "weight: must be a positive", NULL)
REJECT(test_reject_weight_inf, MODEL "weight: .inf\n", "weight: ", NULL)
REJECT(test_reject_weight_nan, MODEL "weight: nan\n", "weight: ", NULL)
REJECT(test_reject_weight_overflow, MODEL "weight: 1e999\n", "weight: must be a positive finite",
       NULL)
REJECT(test_reject_weight_quoted, MODEL "weight: '1'\n", "weight: ", NULL)
REJECT(test_reject_weight_hex, MODEL "weight: 0x10\n", "weight: ", NULL)
REJECT(test_reject_description_mapping, MODEL "description: {a: b}\n",
       "description: must be a string", NULL)

/* ---- rejected: tensors ------------------------------------------------------ */

REJECT(test_reject_bad_dtype,
       HEAD BATCH "inputs:\n  - {name: x, dtype: f32, shape: []}\n"
                  "  - {name: z, dtype: float33, shape: []}\n" OUT,
       "inputs[1].dtype: unknown dtype \"float33\" (expected one of bool, u8, ", "f64")
REJECT(test_reject_batch_not_first,
       HEAD BATCH "inputs: [{name: x, dtype: f32, shape: [16, batch]}]\n" OUT,
       "inputs[0].shape[1]: \"batch\" is only allowed as the first dimension", NULL)
REJECT(test_reject_quoted_batch,
       HEAD BATCH "inputs: [{name: x, dtype: f32, shape: ['batch', 2]}]\n" OUT,
       "inputs[0].shape[0]: must be an integer", NULL)
REJECT(test_reject_negative_dim,
       HEAD BATCH IN "outputs: [{name: y, dtype: f32, shape: [batch, -3]}]\n",
       "outputs[0].shape[1]: must be non-negative, got -3", NULL)
REJECT(test_reject_rank_too_big,
       HEAD BATCH "inputs: [{name: x, dtype: f32, shape: [1, 1, 1, 1, 1, 1, 1, 1, 1]}]\n" OUT,
       "inputs[0].shape: rank 9 exceeds the maximum of 8", NULL)
REJECT(test_reject_shape_not_list, HEAD BATCH "inputs: [{name: x, dtype: f32, shape: 16}]\n" OUT,
       "inputs[0].shape: must be a list", NULL)
REJECT(test_reject_dim_overflow,
       HEAD BATCH "inputs: [{name: x, dtype: f32, shape: [9223372036854775808]}]\n" OUT,
       "inputs[0].shape[0]: integer \"9223372036854775808\" is out of range", NULL)
REJECT(test_reject_dim_trailing_junk,
       HEAD BATCH "inputs: [{name: x, dtype: f32, shape: [4x]}]\n" OUT,
       "inputs[0].shape[0]: must be a decimal integer, got \"4x\"", NULL)
REJECT(test_reject_dim_leading_zero, HEAD BATCH "inputs: [{name: x, dtype: f32, shape: [010]}]\n" OUT,
       "inputs[0].shape[0]: must be a decimal integer", NULL)
REJECT(test_reject_dim_float, HEAD BATCH "inputs: [{name: x, dtype: f32, shape: [4.0]}]\n" OUT,
       "inputs[0].shape[0]: must be a decimal integer", NULL)
REJECT(test_reject_element_count_overflow,
       HEAD BATCH "inputs: [{name: x, dtype: f32, shape: [batch, 4294967296, 4294967296]}]\n" OUT,
       "inputs[0].shape: element count overflows", NULL)
REJECT(test_reject_empty_inputs, HEAD BATCH "inputs: []\n" OUT, "inputs: must not be empty", NULL)
REJECT(test_reject_tensor_not_mapping, HEAD BATCH "inputs: [x]\n" OUT,
       "inputs[0]: must be a mapping", NULL)
REJECT(test_reject_duplicate_input_names,
       HEAD BATCH "inputs:\n  - {name: x, dtype: f32, shape: []}\n"
                  "  - {name: w, dtype: f32, shape: []}\n"
                  "  - {name: x, dtype: f16, shape: []}\n" OUT,
       "inputs[2].name: duplicate name \"x\" (also inputs[0])", "line 7")
REJECT(test_reject_duplicate_output_names,
       HEAD BATCH IN "outputs: [{name: y, dtype: f32, shape: []}, {name: y, dtype: f32, shape: []}]\n",
       "outputs[1].name: duplicate name \"y\"", NULL)

/* ---- rejected: batch sizes ---------------------------------------------------- */

REJECT(test_reject_batch_sizes_descending, HEAD "batch_sizes: [1, 8, 4]\n" IN OUT,
       "batch_sizes: must be strictly ascending (4 after 8)", NULL)
REJECT(test_reject_batch_sizes_duplicate, HEAD "batch_sizes: [1, 4, 4]\n" IN OUT,
       "batch_sizes: must be strictly ascending (4 after 4)", NULL)
REJECT(test_reject_batch_sizes_zero, HEAD "batch_sizes: [0, 4]\n" IN OUT,
       "batch_sizes[0]: must be in 1..65536, got 0", NULL)
REJECT(test_reject_batch_sizes_too_big, HEAD "batch_sizes: [1, 65537]\n" IN OUT,
       "batch_sizes[1]: must be in 1..65536", NULL)
REJECT(test_reject_batch_sizes_empty, HEAD "batch_sizes: []\n" IN OUT,
       "batch_sizes: must not be empty", NULL)
REJECT(test_reject_batch_sizes_scalar, HEAD "batch_sizes: 4\n" IN OUT,
       "batch_sizes: must be a list, got a scalar", NULL)
REJECT(test_reject_batch_sizes_overflow, HEAD "batch_sizes: [1, 99999999999999999999]\n" IN OUT,
       "batch_sizes[1]: integer \"99999999999999999999\" is out of range", NULL)
REJECT(test_reject_batch_sizes_int64_min_minus_one,
       HEAD "batch_sizes: [-9223372036854775809]\n" IN OUT, "batch_sizes[0]: integer", "out of range")
REJECT(test_reject_batch_sizes_quoted, HEAD "batch_sizes: ['4']\n" IN OUT,
       "batch_sizes[0]: must be an integer, got the quoted string \"4\"", NULL)

/* ---- rejected: kind-specific keys ---------------------------------------------- */

REJECT(test_reject_meta_with_inputs, HEAD META_BODY IN, "inputs: not allowed in a manifest of kind meta",
       "client_inputs")
REJECT(test_reject_meta_with_batch_sizes, HEAD META_BODY BATCH,
       "batch_sizes: not allowed in a manifest of kind meta", NULL)
REJECT(test_reject_model_with_meta, MODEL "meta: {calls: []}\n",
       "meta: not allowed in a manifest of kind model", NULL)
REJECT(test_reject_bytes_in_executable_inputs,
       HEAD BATCH "inputs:\n  - {name: x, dtype: BYTES, shape: [batch]}\n" OUT,
       "inputs[0].dtype: bytes (strings) only in client_inputs and client_outputs", NULL)
REJECT(test_reject_bytes_in_executable_outputs,
       HEAD BATCH IN "outputs:\n  - {name: y, dtype: bytes, shape: [batch]}\n",
       "outputs[0].dtype: bytes (strings) only in client_inputs", NULL)
REJECT(test_reject_varying_extent_in_executable_inputs,
       HEAD BATCH "inputs:\n  - {name: x, dtype: f32, shape: [batch, -1]}\n" OUT,
       "inputs[0].shape[1]: must be non-negative, got -1", NULL)
REJECT(test_reject_client_extent_below_minus_one,
       MODEL "client_inputs: [{name: a, dtype: u8, shape: [-2]}]\n",
       "client_inputs[0].shape[0]: must be non-negative or -1 (any extent), got -2", NULL)
REJECT(test_reject_meta_calls_itself,
       HEAD "kind: meta\nmeta: {calls: [a, mlp]}\n"
            "client_inputs: [{name: a, dtype: f32, shape: []}]\n"
            "client_outputs: [{name: b, dtype: f32, shape: []}]\n",
       "meta.calls[1]: a model cannot call itself", NULL)
REJECT(test_reject_meta_duplicate_calls,
       HEAD "kind: meta\nmeta: {calls: [a, b, a]}\n"
            "client_inputs: [{name: a, dtype: f32, shape: []}]\n"
            "client_outputs: [{name: b, dtype: f32, shape: []}]\n",
       "meta.calls[2]: duplicate name \"a\" (also meta.calls[0])", NULL)
REJECT(test_reject_meta_bad_call_name,
       HEAD "kind: meta\nmeta: {calls: [a/b]}\n"
            "client_inputs: [{name: a, dtype: f32, shape: []}]\n"
            "client_outputs: [{name: b, dtype: f32, shape: []}]\n",
       "meta.calls[0]: \"a/b\" may only contain", NULL)

/* ---- variants ------------------------------------------------------------------ */

/* A model with two inputs and two outputs to give variants of. */
#define VHEAD                                                                                 \
    HEAD BATCH                                                                                \
    "inputs:\n"                                                                               \
    "  - {name: image, dtype: f32, shape: [batch, 3, 32, 32]}\n"                              \
    "  - {name: mask, dtype: u8, shape: [batch, 4]}\n"                                        \
    "outputs:\n"                                                                              \
    "  - {name: probs, dtype: f32, shape: [batch, 10]}\n"                                     \
    "  - {name: feat, dtype: f32, shape: [batch, 8, 8, 8]}\n"
#define WIDE "  - {name: wide, inputs: {image: [batch, 3, 32, 64]}}\n"

/* ---- swap-in stages ----------------------------------------------------- */

#define STAGES                                                                                \
    "swap_in_stages:\n"                                                                       \
    "  - weights: [l0.w, l0.b]\n"                                                             \
    "    outputs: [{name: h, dtype: f32, shape: [batch, 32]}, {name: s, dtype: i32, "         \
    "shape: [2]}]\n"                                                                          \
    "  - {weights: []}\n"

static void test_swap_in_stages(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, MODEL STAGES, &err), 0);
    assert_int_equal(m.n_stages, 2);
    assert_int_equal(m.stages[0].n_weights, 2);
    assert_string_equal(m.stages[0].weights[0], "l0.w");
    assert_string_equal(m.stages[0].weights[1], "l0.b");
    assert_int_equal(m.stages[0].n_outputs, 2);
    check_tensor(&m.stages[0].outputs[0], "h", PJS_DTYPE_F32, true, 2, (const int64_t[]){-1, 32});
    check_tensor(&m.stages[0].outputs[1], "s", PJS_DTYPE_I32, false, 1, (const int64_t[]){2});
    assert_int_equal(m.stages[1].n_weights, 0);
    assert_int_equal(m.stages[1].n_outputs, 0);
    pjs_manifest_free(&m);
    assert_zeroed(&m);
    assert_int_equal(parse(&m, MODEL, &err), 0);
    assert_int_equal(m.n_stages, 0);
    assert_null(m.stages);
    pjs_manifest_free(&m);
}

REJECT(test_reject_one_stage, MODEL "swap_in_stages:\n  - {weights: [a]}\n", "swap_in_stages",
       "a model has 2 to 16 stages, not 1")
REJECT(test_reject_last_stage_outputs,
       MODEL "swap_in_stages:\n  - {weights: [a], outputs: [{name: h, dtype: f32, shape: [1]}]}\n"
             "  - {weights: [b], outputs: [{name: g, dtype: f32, shape: [1]}]}\n",
       "swap_in_stages[1].outputs", "the last stage returns the model's outputs")
REJECT(test_reject_stage_without_outputs,
       MODEL "swap_in_stages:\n  - {weights: [a]}\n  - {weights: [b]}\n", "swap_in_stages[0]",
       "missing \"outputs\"")
REJECT(test_reject_stage_without_weights,
       MODEL "swap_in_stages:\n  - {outputs: [{name: h, dtype: f32, shape: [1]}]}\n"
             "  - {weights: [b]}\n",
       "swap_in_stages[0]", "weights")
REJECT(test_reject_stage_duplicate_weight,
       MODEL "swap_in_stages:\n  - {weights: [a, a], outputs: [{name: h, dtype: f32, "
             "shape: [1]}]}\n  - {weights: [b]}\n",
       "swap_in_stages[0].weights", "a")
REJECT(test_reject_stage_unknown_key,
       MODEL "swap_in_stages:\n  - {weights: [a], outputs: [{name: h, dtype: f32, shape: [1]}], "
             "file: x}\n  - {weights: [b]}\n",
       "swap_in_stages[0]", "file")
REJECT(test_reject_stages_with_variants,
       MODEL "variants:\n  - {name: wide, inputs: {x: [batch, 32]}}\n" STAGES, "swap_in_stages",
       "not allowed together with variants")
REJECT(test_reject_stages_in_meta, HEAD META_BODY STAGES, "swap_in_stages",
       "only kind: model has modules")

static void test_variants(void **state)
{
    (void)state;
    const char *yaml = VHEAD "variants:\n"
                             "  - name: wide\n"
                             "    inputs:\n      image: [batch, 3, 32, 64]\n"
                             "    outputs:\n      feat: [batch, 8, 8, 16]\n"
                             "  - {name: tall.v-2_b, inputs: {image: [batch, 3, 64, 32], "
                             "mask: [batch, 5]}}\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    assert_int_equal(m.n_variants, 3);
    assert_string_equal(m.variants[0].name, "default");
    assert_ptr_equal(m.variants[0].inputs, m.inputs);
    assert_ptr_equal(m.variants[0].outputs, m.outputs);

    const pjs_variant *w = &m.variants[1];
    assert_string_equal(w->name, "wide");
    check_tensor(&w->inputs[0], "image", PJS_DTYPE_F32, true, 4, (const int64_t[]){-1, 3, 32, 64});
    check_tensor(&w->inputs[1], "mask", PJS_DTYPE_U8, true, 2, (const int64_t[]){-1, 4});
    check_tensor(&w->outputs[0], "probs", PJS_DTYPE_F32, true, 2, (const int64_t[]){-1, 10});
    check_tensor(&w->outputs[1], "feat", PJS_DTYPE_F32, true, 4, (const int64_t[]){-1, 8, 8, 16});
    assert_ptr_not_equal(w->inputs[1].name, m.inputs[1].name); /* owned copies */

    const pjs_variant *t = &m.variants[2];
    assert_string_equal(t->name, "tall.v-2_b");
    check_tensor(&t->inputs[0], "image", PJS_DTYPE_F32, true, 4, (const int64_t[]){-1, 3, 64, 32});
    check_tensor(&t->inputs[1], "mask", PJS_DTYPE_U8, true, 2, (const int64_t[]){-1, 5});
    check_tensor(&t->outputs[1], "feat", PJS_DTYPE_F32, true, 4, (const int64_t[]){-1, 8, 8, 8});
    /* The top level is untouched. */
    check_tensor(&m.inputs[0], "image", PJS_DTYPE_F32, true, 4, (const int64_t[]){-1, 3, 32, 32});

    /* Clients see -1 where variants differ. */
    pjs_shape s = pjs_manifest_client_shape(&m, false, 0);
    assert_int_equal(s.rank, 4);
    assert_int_equal(s.dims[0], -1);
    assert_int_equal(s.dims[1], 3);
    assert_int_equal(s.dims[2], -1);
    assert_int_equal(s.dims[3], -1);
    s = pjs_manifest_client_shape(&m, false, 1);
    assert_int_equal(s.dims[1], -1);
    s = pjs_manifest_client_shape(&m, true, 0);
    assert_int_equal(s.dims[1], 10);
    s = pjs_manifest_client_shape(&m, true, 1);
    assert_int_equal(s.dims[1], 8);
    assert_int_equal(s.dims[2], 8);
    assert_int_equal(s.dims[3], -1);
    pjs_manifest_free(&m);
    assert_zeroed(&m);
}

static void test_variants_unbatched(void **state)
{
    (void)state;
    const char *yaml = HEAD "batch_sizes: [1]\n"
                            "inputs: [{name: m, dtype: i8, shape: [3, 4]}, "
                            "{name: s, dtype: f32, shape: []}]\n"
                            "outputs: [{name: o, dtype: i8, shape: [3]}]\n"
                            "variants: [{name: five, inputs: {m: [3, 5], s: []}, "
                            "outputs: {o: [5]}}]\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    assert_int_equal(m.n_variants, 2);
    check_tensor(&m.variants[1].inputs[0], "m", PJS_DTYPE_I8, false, 2, (const int64_t[]){3, 5});
    check_tensor(&m.variants[1].inputs[1], "s", PJS_DTYPE_F32, false, 0, NULL);
    check_tensor(&m.variants[1].outputs[0], "o", PJS_DTYPE_I8, false, 1, (const int64_t[]){5});
    pjs_shape s = pjs_manifest_client_shape(&m, false, 0);
    assert_int_equal(s.dims[0], 3);
    assert_int_equal(s.dims[1], -1);
    pjs_manifest_free(&m);
}

/* A manifest with `count` variants, x: [batch, 100 + k] for the k-th. */
static char *many_variants(size_t count)
{
    size_t size = 512 + count * 64;
    char *yaml = malloc(size);
    assert_non_null(yaml);
    size_t o = (size_t)snprintf(yaml, size, MODEL "variants:\n");
    for (size_t k = 0; k < count; k++)
        o += (size_t)snprintf(yaml + o, size - o, "  - {name: v%zu, inputs: {x: [batch, %zu]}}\n",
                              k, 100 + k);
    return yaml;
}

static void test_variants_limit(void **state)
{
    (void)state;
    char *yaml = many_variants(PJS_MANIFEST_MAX_VARIANTS);
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(parse(&m, yaml, &err), 0);
    assert_int_equal(m.n_variants, PJS_MANIFEST_MAX_VARIANTS + 1);
    assert_string_equal(m.variants[PJS_MANIFEST_MAX_VARIANTS].name, "v15");
    pjs_manifest_free(&m);
    free(yaml);
    yaml = many_variants(PJS_MANIFEST_MAX_VARIANTS + 1);
    expect_reject(yaml, strlen(yaml), PJS_ERR_INVALID_ARGUMENT,
                  "variants: 17 variants, more than the 16 allowed besides \"default\"", "line 9");
    free(yaml);
}

REJECT(test_reject_variants_in_meta,
       HEAD META_BODY "variants: [{name: w, inputs: {text: [batch, 32]}}]\n",
       "variants: not allowed in a manifest of kind meta", NULL)
REJECT(test_reject_variants_empty, VHEAD "variants: []\n", "variants: must not be empty", NULL)
REJECT(test_reject_variants_mapping, VHEAD "variants: {wide: {}}\n",
       "variants: must be a list, got a mapping", NULL)
REJECT(test_reject_variant_not_mapping, VHEAD "variants: [wide]\n",
       "variants[0]: must be a mapping", NULL)
REJECT(test_reject_variant_missing_name, VHEAD "variants: [{inputs: {image: [batch, 3, 1, 1]}}]\n",
       "variants[0].name: required key is missing", NULL)
REJECT(test_reject_variant_missing_inputs, VHEAD "variants: [{name: w}]\n",
       "variants[0].inputs: required key is missing", NULL)
REJECT(test_reject_variant_unknown_key,
       VHEAD "variants: [{name: w, inputs: {image: [batch, 3, 1, 1]}, shape: [1]}]\n",
       "variants[0]: unknown key \"shape\"", NULL)
REJECT(test_reject_variant_bad_name, VHEAD "variants: [{name: a/b, inputs: {}}]\n",
       "variants[0].name: \"a/b\" may only contain", NULL)
REJECT(test_reject_variant_named_default,
       VHEAD "variants: [{name: default, inputs: {image: [batch, 3, 1, 1]}}]\n",
       "variants[0].name: \"default\" names the top-level shapes", NULL)
REJECT(test_reject_variant_duplicate_name,
       VHEAD "variants:\n" WIDE "  - {name: wide, inputs: {image: [batch, 3, 64, 64]}}\n",
       "variants[1].name: duplicate name \"wide\" (also variants[0])", "line 12")
REJECT(test_reject_variant_inputs_list, VHEAD "variants: [{name: w, inputs: [image]}]\n",
       "variants[0].inputs: must be a mapping from tensor names to shapes, got a list", NULL)
REJECT(test_reject_variant_unknown_input,
       VHEAD "variants: [{name: w, inputs: {imag: [batch, 3, 1, 1]}}]\n",
       "variants[0].inputs: \"imag\" is not one of the model's inputs", "line 10")
REJECT(test_reject_variant_output_as_input,
       VHEAD "variants: [{name: w, inputs: {probs: [batch, 11]}}]\n",
       "variants[0].inputs: \"probs\" is not one of the model's inputs", NULL)
REJECT(test_reject_variant_unknown_output,
       VHEAD "variants: [{name: w, inputs: {image: [batch, 3, 1, 1]},\n"
             "             outputs: {prob: [batch, 1]}}]\n",
       "variants[0].outputs: \"prob\" is not one of the model's outputs", NULL)
REJECT(test_reject_variant_key_not_string,
       VHEAD "variants: [{name: w, inputs: {[image]: [batch, 3, 1, 1]}}]\n",
       "variants[0].inputs: mapping keys must be strings, got a list", NULL)
REJECT(test_reject_variant_duplicate_input_key,
       VHEAD "variants: [{name: w, inputs: {image: [batch, 3, 1, 1], image: [batch, 3, 2, 2]}}]\n",
       "variants[0].inputs.image: duplicate key", NULL)
REJECT(test_reject_variant_drops_batch,
       VHEAD "variants: [{name: w, inputs: {image: [1, 3, 32, 64]}}]\n",
       "variants[0].inputs.image: must start with \"batch\" like inputs[0]", NULL)
REJECT(test_reject_variant_adds_batch,
       HEAD BATCH "inputs: [{name: m, dtype: f32, shape: [3, 4]}]\n" OUT
            "variants: [{name: w, inputs: {m: [batch, 4]}}]\n",
       "variants[0].inputs.m: must not have a batch axis: inputs[0] has none", NULL)
REJECT(test_reject_variant_output_drops_batch,
       VHEAD "variants: [{name: w, inputs: {image: [batch, 3, 1, 1]}, outputs: {probs: [10]}}]\n",
       "variants[0].outputs.probs: must start with \"batch\" like outputs[0]", NULL)
REJECT(test_reject_variant_rank,
       VHEAD "variants: [{name: w, inputs: {image: [batch, 3, 2048]}}]\n",
       "variants[0].inputs.image: rank 3 differs from the rank 4 of inputs[0]", NULL)
REJECT(test_reject_variant_bad_dim,
       VHEAD "variants: [{name: w, inputs: {image: [batch, 3, 32, -64]}}]\n",
       "variants[0].inputs.image[3]: must be non-negative, got -64", NULL)
REJECT(test_reject_variant_batch_not_first,
       VHEAD "variants: [{name: w, inputs: {image: [batch, 3, batch, 64]}}]\n",
       "variants[0].inputs.image[2]: \"batch\" is only allowed as the first dimension", NULL)
REJECT(test_reject_variant_shape_not_list, VHEAD "variants: [{name: w, inputs: {image: 64}}]\n",
       "variants[0].inputs.image: must be a list", NULL)
REJECT(test_reject_variant_same_as_default,
       VHEAD "variants: [{name: w, inputs: {mask: [batch, 4]}, outputs: {probs: [batch, 2]}}]\n",
       "variants[0].inputs: the same input shapes as the top-level inputs (\"default\")",
       "could not tell them apart")
REJECT(test_reject_variant_empty_inputs_same_as_default,
       VHEAD "variants: [{name: w, inputs: {}}]\n",
       "variants[0].inputs: the same input shapes as the top-level inputs", NULL)
REJECT(test_reject_variant_same_as_other,
       VHEAD "variants:\n" WIDE
             "  - {name: wide2, inputs: {image: [batch, 3, 32, 64]},\n"
             "     outputs: {probs: [batch, 5]}}\n",
       "variants[1].inputs: the same input shapes as variants[0] (\"wide\")", "line 12")

/* ---- other ------------------------------------------------------------------- */

static void test_reject_too_large(void **state)
{
    (void)state;
    size_t len = PJS_MANIFEST_MAX_BYTES + 1;
    char *big = malloc(len);
    assert_non_null(big);
    memset(big, ' ', len);
    expect_reject(big, len, PJS_ERR_INVALID_ARGUMENT, "more than the", NULL);
    free(big);
}

static void test_reject_embedded_nul_input(void **state)
{
    (void)state;
    static const char yaml[] = HEAD "\0" BATCH IN OUT;
    expect_reject(yaml, sizeof yaml - 1, PJS_ERR_INVALID_ARGUMENT, "invalid YAML", NULL);
}

static void test_error_leaves_previous_struct_zeroed(void **state)
{
    (void)state;
    pjs_manifest m;
    memset(&m, 0xab, sizeof m); /* garbage from the caller is not freed */
    pjs_error err;
    assert_int_equal(parse(&m, HEAD, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_zeroed(&m);
}

static void test_load_from_file(void **state)
{
    (void)state;
    char path[] = "/tmp/test_manifest_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char yaml[] = MODEL "residency: device\n";
    assert_int_equal(write(fd, yaml, sizeof yaml - 1), (ssize_t)(sizeof yaml - 1));
    close(fd);
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(pjs_manifest_load(&m, path, &err), 0);
    assert_string_equal(m.name, "mlp");
    assert_int_equal(m.residency, PJS_RESIDENCY_DEVICE);
    pjs_manifest_free(&m);

    /* Errors from a file carry its path as the label. */
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    static const char bad[] = MODEL "residency: gpu\n";
    assert_int_equal(write(fd, bad, sizeof bad - 1), (ssize_t)(sizeof bad - 1));
    close(fd);
    assert_int_equal(pjs_manifest_load(&m, path, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_true(strncmp(err.msg, path, strlen(path)) == 0);
    assert_non_null(strstr(err.msg, "residency"));
    assert_zeroed(&m);
    unlink(path);
}

/* A bundle directory with manifest.yaml and the given labels file. */
static void write_bundle(const char *dir, const char *yaml, const char *labels, size_t labels_len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/manifest.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(yaml, 1, strlen(yaml), f), strlen(yaml));
    fclose(f);
    snprintf(path, sizeof path, "%s/labels.txt", dir);
    unlink(path);
    if (labels == NULL)
        return;
    f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(labels, 1, labels_len, f), labels_len);
    fclose(f);
}

static void expect_load_error(const char *dir, int code, const char *needle1, const char *needle2)
{
    char path[512];
    pjs_manifest m;
    pjs_error err;
    snprintf(path, sizeof path, "%s/manifest.yaml", dir);
    int rc = pjs_manifest_load(&m, path, &err);
    if (getenv("PJS_TEST_VERBOSE") != NULL)
        print_message("%s\n", err.msg);
    if (rc != code || !strstr(err.msg, needle1) || (needle2 && !strstr(err.msg, needle2)))
        print_error("rc=%d msg: %s\n", rc, err.msg);
    assert_int_equal(rc, code);
    assert_true(strncmp(err.msg, path, strlen(path)) == 0);
    assert_non_null(strstr(err.msg, needle1));
    if (needle2)
        assert_non_null(strstr(err.msg, needle2));
    assert_zeroed(&m);
}

#define LABELLED(out_shape)                                                                   \
    HEAD "batch_sizes: [1]\n"                                                                 \
         "inputs:\n  - {name: x, dtype: f32, shape: [batch, 4]}\n"                            \
         "outputs:\n  - {name: y, dtype: f32, shape: " out_shape ", labels: labels.txt}\n"

static void test_load_labels(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_manifest_labels_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/manifest.yaml", dir);
    pjs_manifest m;
    pjs_error err;

    /* CRLF and LF line ends, an empty line, no newline at the end; more
     * lines than classes are fine. */
    static const char text[] = "cat\r\ndog\n\nb\xc3\xa9" "e\nextra";
    write_bundle(dir, LABELLED("[batch, 4]"), text, sizeof text - 1);
    assert_int_equal(pjs_manifest_load(&m, path, &err), 0);
    const pjs_labels *l = m.outputs[0].labels;
    assert_int_equal(l->count, 5);
    assert_string_equal(l->names[0], "cat");
    assert_string_equal(l->names[1], "dog");
    assert_string_equal(l->names[2], "");
    assert_string_equal(l->names[3], "b\xc3\xa9" "e");
    assert_string_equal(l->names[4], "extra");
    pjs_manifest_free(&m);

    /* A trailing newline ends the last line; it starts none. */
    write_bundle(dir, LABELLED("[batch, 2, 2]"), "a\nb\nc\nd\n", 8);
    assert_int_equal(pjs_manifest_load(&m, path, &err), 0);
    assert_int_equal(m.outputs[0].labels->count, 4);
    pjs_manifest_free(&m);

    /* A client output with a varying extent is checked per request only. */
    write_bundle(dir,
                 HEAD "kind: meta\nmeta: {calls: []}\n"
                      "client_inputs: [{name: a, dtype: f32, shape: [-1]}]\n"
                      "client_outputs: [{name: b, dtype: f32, shape: [batch, -1], "
                      "labels: labels.txt}]\n",
                 "", 0);
    assert_int_equal(pjs_manifest_load(&m, path, &err), 0);
    assert_int_equal(m.client_outputs[0].labels->count, 0);
    pjs_manifest_free(&m);

    write_bundle(dir, LABELLED("[batch, 4]"), NULL, 0);
    expect_load_error(dir, PJS_ERR_NOT_FOUND, "outputs[0].labels: ", "labels.txt");
    write_bundle(dir, LABELLED("[batch, 4]"), "a\nb\nc\n", 6);
    expect_load_error(dir, PJS_ERR_INVALID_ARGUMENT, "outputs[0].labels: ",
                      "labels.txt has 3 lines but output \"y\" has 4 classes per row");
    write_bundle(dir, LABELLED("[3, 2]"), "a\nb\nc\nd\ne\n", 10);
    expect_load_error(dir, PJS_ERR_INVALID_ARGUMENT, "has 5 lines but output \"y\" has 6",
                      NULL);
    write_bundle(dir, LABELLED("[batch, 2]"), "a\nb\0c\n", 6);
    expect_load_error(dir, PJS_ERR_INVALID_ARGUMENT, "line 2 holds a NUL byte", NULL);
    /* Every variant's classes are named. */
    write_bundle(dir,
                 LABELLED("[batch, 2]") "variants:\n  - {name: wide, inputs: {x: [batch, 8]}, "
                                        "outputs: {y: [batch, 3]}}\n",
                 "a\nb\n", 4);
    expect_load_error(dir, PJS_ERR_INVALID_ARGUMENT,
                      "has 2 lines but output \"y\" has 3 classes per row in variant \"wide\"",
                      NULL);
    write_bundle(dir,
                 HEAD "kind: meta\nmeta: {calls: []}\n"
                      "client_inputs: [{name: a, dtype: f32, shape: [-1]}]\n"
                      "client_outputs: [{name: b, dtype: f32, shape: [2]}, "
                      "{name: c, dtype: i32, shape: [3], labels: labels.txt}]\n",
                 "a\n", 2);
    expect_load_error(dir, PJS_ERR_INVALID_ARGUMENT, "client_outputs[1].labels: ",
                      "has 1 lines but output \"c\" has 3");

    write_bundle(dir, "", NULL, 0);
    unlink(path);
    rmdir(dir);
}

static void test_load_missing_file(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    const char *path = "/nonexistent/pjserve/manifest.yaml";
    assert_int_equal(pjs_manifest_load(&m, path, &err), PJS_ERR_NOT_FOUND);
    assert_int_equal(err.code, PJS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, path));
    assert_zeroed(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_model_block_style),
        cmocka_unit_test(test_full_model_flow_style),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_format_version_spellings),
        cmocka_unit_test(test_valid_meta),
        cmocka_unit_test(test_meta_empty_calls),
        cmocka_unit_test(test_kserve_dtype_names),
        cmocka_unit_test(test_unbatched_and_scalar_tensors),
        cmocka_unit_test(test_input_formats),
        cmocka_unit_test(test_output_labels),
        cmocka_unit_test(test_name_limits),
        cmocka_unit_test(test_batch_size_limits),
        cmocka_unit_test(test_residency_names),
        cmocka_unit_test(test_free_zeroed_and_twice),
        cmocka_unit_test(test_free_partial),

        cmocka_unit_test(test_reject_empty_file),
        cmocka_unit_test(test_reject_comments_only),
        cmocka_unit_test(test_reject_top_level_list),
        cmocka_unit_test(test_reject_top_level_scalar),
        cmocka_unit_test(test_reject_bare_document_marker),
        cmocka_unit_test(test_reject_syntax_error),
        cmocka_unit_test(test_reject_syntax_error_line),
        cmocka_unit_test(test_reject_invalid_utf8),
        cmocka_unit_test(test_reject_alias),
        cmocka_unit_test(test_reject_alias_only),
        cmocka_unit_test(test_reject_billion_laughs),
        cmocka_unit_test(test_reject_tag),
        cmocka_unit_test(test_reject_multiple_documents),
        cmocka_unit_test(test_reject_deep_nesting),
        cmocka_unit_test(test_reject_duplicate_top_key),
        cmocka_unit_test(test_reject_duplicate_tensor_key),
        cmocka_unit_test(test_reject_non_scalar_key),
        cmocka_unit_test(test_reject_unknown_top_key),
        cmocka_unit_test(test_reject_unknown_tensor_key),
        cmocka_unit_test(test_reject_unknown_meta_key),
        cmocka_unit_test(test_reject_unknown_key_is_quoted_safely),

        cmocka_unit_test(test_reject_missing_version),
        cmocka_unit_test(test_reject_missing_name),
        cmocka_unit_test(test_reject_missing_batch_sizes),
        cmocka_unit_test(test_reject_missing_inputs),
        cmocka_unit_test(test_reject_missing_outputs),
        cmocka_unit_test(test_reject_missing_shape),
        cmocka_unit_test(test_reject_meta_missing_client_inputs),
        cmocka_unit_test(test_reject_meta_missing_meta),
        cmocka_unit_test(test_reject_meta_missing_calls),
        cmocka_unit_test(test_reject_version_1),
        cmocka_unit_test(test_reject_version_int),
        cmocka_unit_test(test_reject_version_200),
        cmocka_unit_test(test_reject_version_list),
        cmocka_unit_test(test_reject_version_before_unknown_key),

        cmocka_unit_test(test_reject_name_space),
        cmocka_unit_test(test_reject_name_dot),
        cmocka_unit_test(test_reject_name_slash),
        cmocka_unit_test(test_reject_name_empty),
        cmocka_unit_test(test_reject_name_null),
        cmocka_unit_test(test_reject_name_nul_byte),
        cmocka_unit_test(test_reject_name_list),
        cmocka_unit_test(test_reject_tensor_name),
        cmocka_unit_test(test_reject_bad_kind),
        cmocka_unit_test(test_reject_bad_residency),
        cmocka_unit_test(test_reject_weight_zero),
        cmocka_unit_test(test_reject_weight_negative),
        cmocka_unit_test(test_reject_weight_inf),
        cmocka_unit_test(test_reject_weight_nan),
        cmocka_unit_test(test_reject_weight_overflow),
        cmocka_unit_test(test_reject_weight_quoted),
        cmocka_unit_test(test_reject_weight_hex),
        cmocka_unit_test(test_reject_description_mapping),

        cmocka_unit_test(test_reject_bad_dtype),
        cmocka_unit_test(test_reject_batch_not_first),
        cmocka_unit_test(test_reject_quoted_batch),
        cmocka_unit_test(test_reject_negative_dim),
        cmocka_unit_test(test_reject_rank_too_big),
        cmocka_unit_test(test_reject_shape_not_list),
        cmocka_unit_test(test_reject_dim_overflow),
        cmocka_unit_test(test_reject_dim_trailing_junk),
        cmocka_unit_test(test_reject_dim_leading_zero),
        cmocka_unit_test(test_reject_dim_float),
        cmocka_unit_test(test_reject_element_count_overflow),
        cmocka_unit_test(test_reject_empty_inputs),
        cmocka_unit_test(test_reject_tensor_not_mapping),
        cmocka_unit_test(test_reject_duplicate_input_names),
        cmocka_unit_test(test_reject_duplicate_output_names),

        cmocka_unit_test(test_reject_batch_sizes_descending),
        cmocka_unit_test(test_reject_batch_sizes_duplicate),
        cmocka_unit_test(test_reject_batch_sizes_zero),
        cmocka_unit_test(test_reject_batch_sizes_too_big),
        cmocka_unit_test(test_reject_batch_sizes_empty),
        cmocka_unit_test(test_reject_batch_sizes_scalar),
        cmocka_unit_test(test_reject_batch_sizes_overflow),
        cmocka_unit_test(test_reject_batch_sizes_int64_min_minus_one),
        cmocka_unit_test(test_reject_batch_sizes_quoted),

        cmocka_unit_test(test_reject_meta_with_inputs),
        cmocka_unit_test(test_reject_meta_with_batch_sizes),
        cmocka_unit_test(test_reject_model_with_meta),
        cmocka_unit_test(test_reject_bytes_in_executable_inputs),
        cmocka_unit_test(test_reject_bytes_in_executable_outputs),
        cmocka_unit_test(test_reject_varying_extent_in_executable_inputs),
        cmocka_unit_test(test_reject_client_extent_below_minus_one),
        cmocka_unit_test(test_valid_hooked_model),
        cmocka_unit_test(test_reject_meta_calls_itself),
        cmocka_unit_test(test_reject_meta_duplicate_calls),
        cmocka_unit_test(test_reject_meta_bad_call_name),

        cmocka_unit_test(test_swap_in_stages),
        cmocka_unit_test(test_reject_one_stage),
        cmocka_unit_test(test_reject_last_stage_outputs),
        cmocka_unit_test(test_reject_stage_without_outputs),
        cmocka_unit_test(test_reject_stage_without_weights),
        cmocka_unit_test(test_reject_stage_duplicate_weight),
        cmocka_unit_test(test_reject_stage_unknown_key),
        cmocka_unit_test(test_reject_stages_with_variants),
        cmocka_unit_test(test_reject_stages_in_meta),

        cmocka_unit_test(test_variants),
        cmocka_unit_test(test_variants_unbatched),
        cmocka_unit_test(test_variants_limit),
        cmocka_unit_test(test_reject_variants_in_meta),
        cmocka_unit_test(test_reject_variants_empty),
        cmocka_unit_test(test_reject_variants_mapping),
        cmocka_unit_test(test_reject_variant_not_mapping),
        cmocka_unit_test(test_reject_variant_missing_name),
        cmocka_unit_test(test_reject_variant_missing_inputs),
        cmocka_unit_test(test_reject_variant_unknown_key),
        cmocka_unit_test(test_reject_variant_bad_name),
        cmocka_unit_test(test_reject_variant_named_default),
        cmocka_unit_test(test_reject_variant_duplicate_name),
        cmocka_unit_test(test_reject_variant_inputs_list),
        cmocka_unit_test(test_reject_variant_unknown_input),
        cmocka_unit_test(test_reject_variant_output_as_input),
        cmocka_unit_test(test_reject_variant_unknown_output),
        cmocka_unit_test(test_reject_variant_key_not_string),
        cmocka_unit_test(test_reject_variant_duplicate_input_key),
        cmocka_unit_test(test_reject_variant_drops_batch),
        cmocka_unit_test(test_reject_variant_adds_batch),
        cmocka_unit_test(test_reject_variant_output_drops_batch),
        cmocka_unit_test(test_reject_variant_rank),
        cmocka_unit_test(test_reject_variant_bad_dim),
        cmocka_unit_test(test_reject_variant_batch_not_first),
        cmocka_unit_test(test_reject_variant_shape_not_list),
        cmocka_unit_test(test_reject_variant_same_as_default),
        cmocka_unit_test(test_reject_variant_empty_inputs_same_as_default),
        cmocka_unit_test(test_reject_variant_same_as_other),

        cmocka_unit_test(test_reject_too_large),
        cmocka_unit_test(test_reject_embedded_nul_input),
        cmocka_unit_test(test_error_leaves_previous_struct_zeroed),
        cmocka_unit_test(test_load_from_file),
        cmocka_unit_test(test_load_missing_file),
        cmocka_unit_test(test_load_labels),
        cmocka_unit_test(test_meta_decoupled),
        cmocka_unit_test(test_hooks_libraries),
        cmocka_unit_test(test_reject_library_option),
        cmocka_unit_test(test_reject_library_space),
        cmocka_unit_test(test_reject_library_shell),
        cmocka_unit_test(test_reject_library_path),
        cmocka_unit_test(test_reject_library_empty),
        cmocka_unit_test(test_reject_library_long),
        cmocka_unit_test(test_reject_library_twice),
        cmocka_unit_test(test_reject_library_not_list),
        cmocka_unit_test(test_reject_library_mapping),
        cmocka_unit_test(test_sequence_state),
        cmocka_unit_test(test_sequence_controls),
        cmocka_unit_test(test_reject_control_unknown_input),
        cmocka_unit_test(test_reject_control_unknown_kind),
        cmocka_unit_test(test_reject_control_wide),
        cmocka_unit_test(test_reject_control_unbatched),
        cmocka_unit_test(test_reject_control_flag_dtype),
        cmocka_unit_test(test_reject_control_id_dtype),
        cmocka_unit_test(test_reject_control_twice),
        cmocka_unit_test(test_reject_control_on_state),
        cmocka_unit_test(test_reject_control_every_input),
        cmocka_unit_test(test_reject_sequence_unknown_input),
        cmocka_unit_test(test_reject_sequence_unknown_output),
        cmocka_unit_test(test_reject_sequence_mismatch),
        cmocka_unit_test(test_reject_sequence_initial),
        cmocka_unit_test(test_reject_sequence_no_state),
        cmocka_unit_test(test_reject_sequence_timeout),
        cmocka_unit_test(test_reject_sequence_eviction_floor),
        cmocka_unit_test(test_reject_sequence_per_client_cap),
        cmocka_unit_test(test_reject_sequence_unknown_key),
        cmocka_unit_test(test_reject_sequence_twice),
        cmocka_unit_test(test_reject_sequence_on_meta),
        cmocka_unit_test(test_reject_sequence_all_state),
        cmocka_unit_test(test_reject_decoupled_model),
        cmocka_unit_test(test_reject_decoupled_not_bool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
