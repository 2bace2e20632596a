/*
 * test_grpc_codec.c - unit tests of the gRPC codec (src/frontend/grpc/codec.c
 * and model_info.c): no server, no gRPC runtime.
 *
 * Requests are built with the protobuf-c structs, packed, and fed to
 * pjs_grpc_infer_decode as a client's bytes would be; then checked against a
 * fixed manifest with pjs_infer_validate. Responses are encoded from outputs
 * filled as the dispatcher fills them and unpacked again to check what a
 * client reads. Raw input bytes are read in place (infer_wire.c), with
 * every prefix and one-byte change of a message decoded as protobuf-c
 * decodes it whole. Shared-memory tests use a real POSIX shared-memory object
 * registered with the core registry. The model control messages are
 * encoded from plain snapshots and unpacked again, and decoded from packed
 * requests. String (BYTES) tensors go through a hooked model's client
 * tensors: raw, typed bytes_contents and shared memory in, raw out.
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
#include <sys/mman.h>
#include <unistd.h>

#include "core/bytes.h"
#include "frontend/deadline.h"
#include "frontend/grpc/codec.h"
#include "frontend/grpc/control_codec.h"
#include "frontend/grpc/model_info.h"

typedef Inference__ModelInferRequest request;
typedef Inference__ModelInferRequest__InferInputTensor input_tensor;
typedef Inference__ModelInferRequest__InferRequestedOutputTensor output_tensor;
typedef Inference__InferParameter param;

static const char MANIFEST[] = "format_version: \"2.0\"\n"
                               "name: demo\n"
                               "batch_sizes: [1, 4]\n"
                               "inputs:\n"
                               "  - {name: x, dtype: f32, shape: [batch, 4]}\n"
                               "  - {name: mask, dtype: i8, shape: [batch, 2]}\n"
                               "outputs:\n"
                               "  - {name: y, dtype: f32, shape: [batch, 3]}\n"
                               "  - {name: n, dtype: i64, shape: [batch]}\n";

/* ---- building requests ------------------------------------------------------- */

/* Storage for one request under construction. */
typedef struct builder {
    request req;
    input_tensor inputs[4];
    input_tensor *input_ptrs[4];
    int64_t shapes[4][2];
    Inference__InferTensorContents contents[4];
    output_tensor outputs[4];
    output_tensor *output_ptrs[4];
    ProtobufCBinaryData raw[4];
    Inference__ModelInferRequest__ParametersEntry params[4];
    Inference__ModelInferRequest__ParametersEntry *param_ptrs[4];
    param param_values[4];
    Inference__ModelInferRequest__InferInputTensor__ParametersEntry in_params[4][3];
    Inference__ModelInferRequest__InferInputTensor__ParametersEntry *in_param_ptrs[4][3];
    param in_param_values[4][3];
    Inference__ModelInferRequest__InferRequestedOutputTensor__ParametersEntry out_params[4][3];
    Inference__ModelInferRequest__InferRequestedOutputTensor__ParametersEntry *out_param_ptrs[4][3];
    param out_param_values[4][3];
} builder;

static float x_data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
static int8_t mask_data[4] = {1, -1, 0, 127};

static void builder_init(builder *b, const char *model)
{
    memset(b, 0, sizeof *b);
    b->req = (request)INFERENCE__MODEL_INFER_REQUEST__INIT;
    b->req.model_name = (char *)model;
    b->req.inputs = b->input_ptrs;
    b->req.outputs = b->output_ptrs;
    b->req.raw_input_contents = b->raw;
    b->req.parameters = b->param_ptrs;
}

static input_tensor *add_input(builder *b, const char *name, const char *dt, int64_t d0, int64_t d1)
{
    size_t i = b->req.n_inputs++;
    input_tensor *t = &b->inputs[i];
    *t = (input_tensor)INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
    t->name = (char *)name;
    t->datatype = (char *)dt;
    b->shapes[i][0] = d0;
    b->shapes[i][1] = d1;
    t->shape = b->shapes[i];
    t->n_shape = d1 < 0 ? 1 : 2;
    t->parameters = b->in_param_ptrs[i];
    b->input_ptrs[i] = t;
    return t;
}

static void add_raw(builder *b, const void *data, size_t len)
{
    b->raw[b->req.n_raw_input_contents].data = (uint8_t *)data;
    b->raw[b->req.n_raw_input_contents++].len = len;
}

static output_tensor *add_output(builder *b, const char *name)
{
    size_t k = b->req.n_outputs++;
    output_tensor *t = &b->outputs[k];
    *t = (output_tensor)INFERENCE__MODEL_INFER_REQUEST__INFER_REQUESTED_OUTPUT_TENSOR__INIT;
    t->name = (char *)name;
    t->parameters = b->out_param_ptrs[k];
    b->output_ptrs[k] = t;
    return t;
}

static param *add_request_param(builder *b, const char *key)
{
    size_t i = b->req.n_parameters++;
    b->params[i] = (Inference__ModelInferRequest__ParametersEntry)
        INFERENCE__MODEL_INFER_REQUEST__PARAMETERS_ENTRY__INIT;
    b->param_values[i] = (param)INFERENCE__INFER_PARAMETER__INIT;
    b->params[i].key = (char *)key;
    b->params[i].value = &b->param_values[i];
    b->param_ptrs[i] = &b->params[i];
    return &b->param_values[i];
}

static param *add_input_param(builder *b, size_t input, const char *key)
{
    input_tensor *t = &b->inputs[input];
    size_t i = t->n_parameters++;
    b->in_params[input][i] = (Inference__ModelInferRequest__InferInputTensor__ParametersEntry)
        INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__PARAMETERS_ENTRY__INIT;
    b->in_param_values[input][i] = (param)INFERENCE__INFER_PARAMETER__INIT;
    b->in_params[input][i].key = (char *)key;
    b->in_params[input][i].value = &b->in_param_values[input][i];
    b->in_param_ptrs[input][i] = &b->in_params[input][i];
    return &b->in_param_values[input][i];
}

static param *add_output_param(builder *b, size_t output, const char *key)
{
    output_tensor *t = &b->outputs[output];
    size_t i = t->n_parameters++;
    b->out_params[output][i] =
        (Inference__ModelInferRequest__InferRequestedOutputTensor__ParametersEntry)
            INFERENCE__MODEL_INFER_REQUEST__INFER_REQUESTED_OUTPUT_TENSOR__PARAMETERS_ENTRY__INIT;
    b->out_param_values[output][i] = (param)INFERENCE__INFER_PARAMETER__INIT;
    b->out_params[output][i].key = (char *)key;
    b->out_params[output][i].value = &b->out_param_values[output][i];
    b->out_param_ptrs[output][i] = &b->out_params[output][i];
    return &b->out_param_values[output][i];
}

static void set_int(param *p, int64_t v)
{
    p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    p->int64_param = v;
}

static void set_uint(param *p, uint64_t v)
{
    p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM;
    p->uint64_param = v;
}

static void set_string(param *p, const char *v)
{
    p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    p->string_param = (char *)v;
}

/* The demo request the way tritonclient sends it: two raw inputs, batch 2. */
static void demo_request(builder *b)
{
    builder_init(b, "demo");
    add_input(b, "x", "FP32", 2, 4);
    add_input(b, "mask", "INT8", 2, 2);
    add_raw(b, x_data, sizeof x_data);
    add_raw(b, mask_data, sizeof mask_data);
}

/* Every message packed by the tests: a decoded request borrows its
 * raw_input_contents from the bytes received, so they are freed only when
 * the tests are done (free_wires). */
static uint8_t **wires;
static size_t n_wires;

static uint8_t *new_wire(size_t len)
{
    uint8_t **more = realloc(wires, (n_wires + 1) * sizeof *wires);
    assert_non_null(more);
    wires = more;
    wires[n_wires] = malloc(len + 1);
    assert_non_null(wires[n_wires]);
    return wires[n_wires++];
}

static void free_wires(void)
{
    for (size_t i = 0; i < n_wires; i++)
        free(wires[i]);
    free(wires);
    wires = NULL;
    n_wires = 0;
}

/* b packed, in bytes kept until the tests end; its length in *len. */
static uint8_t *pack_request(builder *b, size_t *len)
{
    *len = inference__model_infer_request__get_packed_size(&b->req);
    uint8_t *buf = new_wire(*len);
    inference__model_infer_request__pack(&b->req, buf);
    return buf;
}

/* Packs b and decodes it into d as it is (initialized, or recycled after
 * an earlier request); returns decode's status. */
static int decode_into(builder *b, pjs_grpc_infer *d, pjs_shm_registry *shm, pjs_error *err)
{
    size_t len;
    uint8_t *buf = pack_request(b, &len);
    pjs_error_clear(err);
    int rc = pjs_grpc_infer_decode(d, buf, len, shm, err);
    if (getenv("PJS_TEST_VERBOSE") != NULL && rc != 0)
        print_message("%s\n", err->msg);
    return rc;
}

/* decode_into a freshly initialized d. */
static int decode(builder *b, pjs_grpc_infer *d, pjs_shm_registry *shm, pjs_error *err)
{
    pjs_grpc_infer_init(d);
    return decode_into(b, d, shm, err);
}

/* Decodes b expecting failure with `code` and a message containing needle. */
static void expect_decode_error(builder *b, pjs_shm_registry *shm, int code, const char *needle)
{
    pjs_grpc_infer d;
    pjs_error err;
    int rc = decode(b, &d, shm, &err);
    if (rc != code || strstr(err.msg, needle) == NULL)
        print_error("rc=%d msg: %s\n", rc, err.msg);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err.msg, needle));
    pjs_grpc_infer_release(&d);
}

static int setup_manifest(void **state)
{
    pjs_manifest *m = calloc(1, sizeof *m);
    pjs_error err;
    if (m == NULL || pjs_manifest_parse(m, MANIFEST, strlen(MANIFEST), "demo", &err) != 0)
        return -1;
    *state = m;
    return 0;
}

static int teardown_manifest(void **state)
{
    pjs_manifest_free(*state);
    free(*state);
    free_wires();
    return 0;
}

/* ---- decoding ---------------------------------------------------------------- */

static void test_decode_raw(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b);
    b.req.id = "req-7";
    b.req.model_version = "1";
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_string_equal(d.msg->model_name, "demo");
    assert_string_equal(d.req.id, "req-7");
    assert_int_equal(d.req.n_inputs, 2);
    assert_string_equal(d.req.inputs[0].name, "x");
    assert_string_equal(d.req.inputs[0].datatype, "FP32");
    assert_int_equal(d.req.inputs[0].shape.rank, 2);
    assert_int_equal(d.req.inputs[0].shape.dims[1], 4);
    assert_int_equal(d.req.inputs[0].nbytes, sizeof x_data);
    assert_memory_equal(d.req.inputs[0].data, x_data, sizeof x_data);
    assert_memory_equal(d.req.inputs[1].data, mask_data, sizeof mask_data);
    assert_int_equal(d.req.n_requested, 0);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    assert_int_equal(d.req.batch, 2);
    pjs_grpc_infer_release(&d);
}

/* A call object serves one request after another: recycled between them,
 * nothing of the first shows in the second, and the arena's block is
 * reused instead of allocated again. */
static void test_recycle_between_requests(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b);
    b.req.id = "first";
    add_output(&b, "y");
    set_uint(add_request_param(&b, "timeout"), 5000);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(d.req.n_requested, 1);
    assert_true(d.has_timeout);
    const void *block = d.arena.blocks;
    assert_non_null(block);

    pjs_grpc_infer_recycle(&d);
    assert_null(d.msg);
    assert_ptr_equal(d.arena.blocks, block);
    assert_int_equal(d.arena.total, 0);

    demo_request(&b); /* no outputs named, no timeout */
    assert_int_equal(decode_into(&b, &d, NULL, &err), 0);
    assert_ptr_equal(d.arena.blocks, block);
    assert_string_equal(d.req.id, "");
    assert_int_equal(d.req.n_requested, 0);
    assert_false(d.has_timeout);
    assert_int_equal(d.req.deadline_ns, 0);
    assert_int_equal(d.req.n_inputs, 2);
    assert_memory_equal(d.req.inputs[0].data, x_data, sizeof x_data);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    pjs_grpc_infer_release(&d); /* frees the kept block too (leak-checked) */
    assert_null(d.arena.blocks);
}

static void test_decode_malformed(void **state)
{
    (void)state;
    static const uint8_t junk[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 'd'};
    pjs_grpc_infer d;
    pjs_error err;
    pjs_grpc_infer_init(&d);
    assert_int_equal(pjs_grpc_infer_decode(&d, junk, sizeof junk, NULL, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "malformed ModelInferRequest"));
    pjs_grpc_infer_release(&d);
}

static void test_decode_empty_message(void **state)
{
    (void)state;
    pjs_grpc_infer d;
    pjs_error err;
    pjs_grpc_infer_init(&d);
    assert_int_equal(pjs_grpc_infer_decode(&d, (const uint8_t *)"", 0, NULL, &err), 0);
    assert_int_equal(d.req.n_inputs, 0);
    assert_string_equal(d.msg->model_name, "");
    pjs_grpc_infer_release(&d);
}

/* raw_input_contents are read where they arrived: each input's data points
 * into the message's bytes, whatever the order of the fields on the wire,
 * and the message is otherwise decoded as protobuf-c decodes it. */
static void test_raw_inputs_read_in_place(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    size_t len;
    demo_request(&b);
    b.req.id = "in place";
    uint8_t *wire = pack_request(&b, &len);
    pjs_grpc_infer_init(&d);
    assert_int_equal(pjs_grpc_infer_decode(&d, wire, len, NULL, &err), 0);
    for (size_t i = 0; i < 2; i++) {
        const uint8_t *data = d.req.inputs[i].data;
        assert_true(data >= wire && data + d.req.inputs[i].nbytes <= wire + len);
    }
    assert_memory_equal(d.req.inputs[0].data, x_data, sizeof x_data);
    assert_memory_equal(d.req.inputs[1].data, mask_data, sizeof mask_data);
    assert_string_equal(d.req.id, "in place");
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    pjs_grpc_infer_release(&d);

    /* The same message with its raw entries first and last: protobuf
     * concatenates repeated fields wherever they appear. */
    builder parts;
    size_t n_raw_first, n_rest, n_raw_last;
    builder_init(&parts, "");
    add_raw(&parts, x_data, sizeof x_data);
    uint8_t *raw_first = pack_request(&parts, &n_raw_first);
    b.req.n_raw_input_contents = 0;
    uint8_t *rest = pack_request(&b, &n_rest);
    builder_init(&parts, "");
    add_raw(&parts, mask_data, sizeof mask_data);
    uint8_t *raw_last = pack_request(&parts, &n_raw_last);
    uint8_t *joined = new_wire(n_raw_first + n_rest + n_raw_last);
    memcpy(joined, raw_first, n_raw_first);
    memcpy(joined + n_raw_first, rest, n_rest);
    memcpy(joined + n_raw_first + n_rest, raw_last, n_raw_last);
    pjs_grpc_infer_init(&d);
    assert_int_equal(pjs_grpc_infer_decode(&d, joined, n_raw_first + n_rest + n_raw_last, NULL,
                                           &err),
                     0);
    assert_ptr_equal(d.req.inputs[0].data, joined + n_raw_first - sizeof x_data);
    assert_ptr_equal(d.req.inputs[1].data, joined + n_raw_first + n_rest + n_raw_last -
                                               sizeof mask_data);
    assert_string_equal(d.msg->model_name, "demo");
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    pjs_grpc_infer_release(&d);
}

/* Every prefix of a message, and the message with any one byte changed to
 * each of a few values, is accepted exactly when protobuf-c accepts it
 * whole; an accepted one has protobuf-c's raw_input_contents. */
static void expect_same_verdict_as_protobuf_c(const uint8_t *wire, size_t len)
{
    Inference__ModelInferRequest *ref = inference__model_infer_request__unpack(NULL, len, wire);
    pjs_grpc_infer d;
    pjs_error err;
    pjs_grpc_infer_init(&d);
    int rc = pjs_grpc_infer_decode(&d, wire, len, NULL, &err);
    if (ref == NULL) {
        assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
        assert_null(d.msg);
        assert_non_null(strstr(err.msg, "malformed ModelInferRequest"));
    } else {
        assert_non_null(d.msg);
        assert_int_equal(d.msg->n_raw_input_contents, ref->n_raw_input_contents);
        for (size_t i = 0; i < ref->n_raw_input_contents; i++) {
            assert_int_equal(d.msg->raw_input_contents[i].len, ref->raw_input_contents[i].len);
            if (ref->raw_input_contents[i].len > 0)
                assert_memory_equal(d.msg->raw_input_contents[i].data,
                                    ref->raw_input_contents[i].data,
                                    ref->raw_input_contents[i].len);
        }
        assert_int_equal(d.msg->n_inputs, ref->n_inputs);
        assert_string_equal(d.msg->model_name, ref->model_name);
        inference__model_infer_request__free_unpacked(ref, NULL);
    }
    pjs_grpc_infer_release(&d);
}

static void test_framing_refused_as_protobuf_c_refuses(void **state)
{
    (void)state;
    builder b;
    size_t len;
    demo_request(&b);
    add_output(&b, "y");
    set_uint(add_request_param(&b, "timeout"), 5000);
    uint8_t *wire = pack_request(&b, &len);
    uint8_t *copy = new_wire(len);
    static const uint8_t values[] = {0x00, 0x01, 0x07, 0x08, 0x3a, 0x7f, 0x80, 0xff};
    for (size_t cut = 0; cut <= len; cut++) {
        memcpy(copy, wire, cut);
        expect_same_verdict_as_protobuf_c(copy, cut);
    }
    for (size_t at = 0; at < len; at++)
        for (size_t v = 0; v < sizeof values; v++) {
            memcpy(copy, wire, len);
            copy[at] = values[v];
            expect_same_verdict_as_protobuf_c(copy, len);
        }
    /* What the walk refuses by name: field number 0, a group, wire types 6
     * and 7, an overlong tag, a length prefix past INT_MAX. */
    static const uint8_t bad[][8] = {
        {0x02, 0x00},                         /* field 0 */
        {0x3b, 0x3c},                         /* field 7 as a group */
        {0x3e},                               /* wire type 6 */
        {0x3f},                               /* wire type 7 */
        {0xfa, 0xff, 0xff, 0xff, 0xff, 0x01}, /* a tag of 6 bytes */
        {0x3a, 0xff, 0xff, 0xff, 0xff, 0x0f}, /* raw entry of 4 GiB - 1 */
    };
    static const size_t bad_len[] = {2, 2, 1, 1, 6, 6};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_same_verdict_as_protobuf_c(bad[i], bad_len[i]);
}

static void test_priority_and_timeout(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b);
    set_int(add_request_param(&b, "priority"), 3);
    set_uint(add_request_param(&b, "timeout"), 5000);
    set_string(add_request_param(&b, "some_future_parameter"), "ignored");
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_true(d.has_priority);
    assert_int_equal(d.priority, 3);
    assert_true(d.has_timeout);
    assert_int_equal(d.timeout_us, 5000);
    /* The deadline counts from when the request was received. */
    assert_true(d.req.times.received > 0);
    assert_int_equal(d.req.deadline_ns, d.req.times.received + 5000u * 1000u);
    pjs_grpc_infer_release(&d);

    demo_request(&b);
    set_uint(add_request_param(&b, "priority"), 2);
    set_int(add_request_param(&b, "timeout"), 10);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(d.priority, 2);
    assert_int_equal(d.timeout_us, 10);
    assert_int_equal(d.req.deadline_ns, d.req.times.received + 10000u);
    pjs_grpc_infer_release(&d);
}

static void set_bool(param *p, bool v)
{
    p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    p->bool_param = v;
}

/* sequence_id as int64, uint64 or string (0 and "": none), the two flags
 * as bool_param; other types refused. */
static void test_sequence_parameters(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b);
    set_int(add_request_param(&b, "sequence_id"), 42);
    set_bool(add_request_param(&b, "sequence_start"), true);
    set_bool(add_request_param(&b, "sequence_end"), false);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_true(d.req.sequence.has_id);
    assert_false(d.req.sequence.is_string);
    assert_int_equal(d.req.sequence.number, 42);
    assert_true(d.req.sequence.start);
    assert_false(d.req.sequence.end);
    pjs_grpc_infer_release(&d);

    demo_request(&b);
    set_string(add_request_param(&b, "sequence_id"), "abc");
    set_bool(add_request_param(&b, "sequence_end"), true);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_true(d.req.sequence.has_id && d.req.sequence.is_string);
    assert_string_equal(d.req.sequence.string, "abc");
    assert_false(d.req.sequence.start);
    assert_true(d.req.sequence.end);
    pjs_grpc_infer_release(&d);

    demo_request(&b);
    set_uint(add_request_param(&b, "sequence_id"), 0);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_false(d.req.sequence.has_id);
    pjs_grpc_infer_release(&d);

    demo_request(&b);
    set_int(add_request_param(&b, "sequence_id"), -3);
    assert_int_equal(decode(&b, &d, NULL, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "\"sequence_id\" must be a non-negative int64_param"));
    pjs_grpc_infer_release(&d);

    demo_request(&b);
    set_int(add_request_param(&b, "sequence_start"), 1);
    assert_int_equal(decode(&b, &d, NULL, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "\"sequence_start\" must be a bool_param"));
    pjs_grpc_infer_release(&d);
}

static void test_timeout_without_deadline(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b); /* no timeout */
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_false(d.has_timeout);
    assert_int_equal(d.req.deadline_ns, 0);
    pjs_grpc_infer_release(&d);

    demo_request(&b); /* 0 means no timeout, as Triton */
    set_uint(add_request_param(&b, "timeout"), 0);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_true(d.has_timeout);
    assert_int_equal(d.req.deadline_ns, 0);
    pjs_grpc_infer_release(&d);

    demo_request(&b); /* too far away to represent: no deadline either */
    set_uint(add_request_param(&b, "timeout"), UINT64_MAX);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(d.req.deadline_ns, 0);
    pjs_grpc_infer_release(&d);
}

/* The call's deadline and the timeout parameter, as infer_call.c combines
 * them (the gRPC clock conversion itself needs a live call). */
static void test_deadline_arithmetic(void **state)
{
    (void)state;
    assert_int_equal(pjs_deadline_after_ns(1000, 500), 1500);
    assert_int_equal(pjs_deadline_after_ns(1000, -300), 700);
    assert_int_equal(pjs_deadline_after_ns(1000, -5000), 1); /* passed, never "none" */
    assert_int_equal(pjs_deadline_after_ns(1000, INT64_MIN), 1);
    assert_int_equal(pjs_deadline_after_ns(UINT64_MAX - 10, 20), 0); /* unrepresentable */
    assert_int_equal(pjs_deadline_from_timeout_us(1000, 0), 0);
    assert_int_equal(pjs_deadline_from_timeout_us(1000, 1), 2000);
    assert_int_equal(pjs_deadline_from_timeout_us(1000, UINT64_MAX / 1000), 0);
    assert_int_equal(pjs_deadline_earlier(0, 0), 0);
    assert_int_equal(pjs_deadline_earlier(0, 7), 7);
    assert_int_equal(pjs_deadline_earlier(9, 0), 9);
    assert_int_equal(pjs_deadline_earlier(9, 7), 7);
    assert_int_equal(pjs_deadline_earlier(5, 7), 5);
    /* A stall bound: a start read after the clock has not waited (the
     * gateway cut a 3.6 s old stream as stalled for 30 s on the wrap). */
    assert_true(pjs_waited_at_least(1000, 31000, 30000));
    assert_false(pjs_waited_at_least(1000, 30999, 30000));
    assert_false(pjs_waited_at_least(5000, 4000, 30000));
    assert_false(pjs_waited_at_least(UINT64_MAX, 0, 1));
}

static void test_priority_wrong_type(void **state)
{
    (void)state;
    builder b;
    demo_request(&b);
    set_string(add_request_param(&b, "priority"), "high");
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT, "\"priority\" must be an int64");
    demo_request(&b);
    set_int(add_request_param(&b, "timeout"), -1);
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT, "must not be negative");
}

static void test_raw_count_mismatch(void **state)
{
    (void)state;
    builder b;
    demo_request(&b);
    b.req.n_raw_input_contents = 1;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT, "1 raw_input_contents but 2");
    demo_request(&b);
    b.req.n_raw_input_contents = 0;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT, "input \"x\" has no data");
}

static void test_rank_and_id_limits(void **state)
{
    (void)state;
    builder b;
    int64_t dims[PJS_MAX_RANK + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    demo_request(&b);
    b.inputs[0].shape = dims;
    b.inputs[0].n_shape = PJS_MAX_RANK + 1;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT, "rank 9");
}

/* ---- typed contents ---------------------------------------------------------- */

static void test_contents_fp32_and_int8(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    int32_t mask_ints[4] = {1, -1, 0, 127};
    builder_init(&b, "demo");
    add_input(&b, "x", "FP32", 2, 4)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].fp32_contents = x_data;
    b.contents[0].n_fp32_contents = 8;
    add_input(&b, "mask", "INT8", 2, 2)->contents = &b.contents[1];
    b.contents[1] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[1].int_contents = mask_ints;
    b.contents[1].n_int_contents = 4;
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(d.req.inputs[0].nbytes, sizeof x_data);
    assert_memory_equal(d.req.inputs[0].data, x_data, sizeof x_data);
    assert_int_equal(d.req.inputs[1].nbytes, 4);
    assert_memory_equal(d.req.inputs[1].data, mask_data, 4);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    pjs_grpc_infer_release(&d);
}

static void test_contents_bool_and_u16(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    protobuf_c_boolean flags[3] = {1, 0, 1};
    uint32_t shorts[2] = {65535, 7};
    builder_init(&b, "any");
    add_input(&b, "flags", "BOOL", 3, -1)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].bool_contents = flags;
    b.contents[0].n_bool_contents = 3;
    add_input(&b, "shorts", "UINT16", 2, -1)->contents = &b.contents[1];
    b.contents[1] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[1].uint_contents = shorts;
    b.contents[1].n_uint_contents = 2;
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    const uint8_t want_flags[3] = {1, 0, 1};
    const uint16_t want_shorts[2] = {65535, 7};
    assert_int_equal(d.req.inputs[0].nbytes, 3);
    assert_memory_equal(d.req.inputs[0].data, want_flags, 3);
    assert_int_equal(d.req.inputs[1].nbytes, 4);
    assert_memory_equal(d.req.inputs[1].data, want_shorts, 4);
    pjs_grpc_infer_release(&d);
}

static void test_contents_errors(void **state)
{
    (void)state;
    builder b;
    int32_t ints[4] = {1, 2, 300, 4};
    float floats[3] = {1, 2, 3};

    builder_init(&b, "demo"); /* a value that does not fit INT8 */
    add_input(&b, "mask", "INT8", 2, 2)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].int_contents = ints;
    b.contents[0].n_int_contents = 4;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT, "element 2 (300) does not fit INT8");

    builder_init(&b, "demo"); /* the wrong field for the datatype */
    add_input(&b, "x", "FP32", 1, 4)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].int_contents = ints;
    b.contents[0].n_int_contents = 4;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "FP32 elements belong in fp32_contents, not int_contents");

    builder_init(&b, "demo"); /* fewer elements than the shape holds */
    add_input(&b, "x", "FP32", 1, 4)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].fp32_contents = floats;
    b.contents[0].n_fp32_contents = 3;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "fp32_contents holds 3 elements but the shape has 4");

    builder_init(&b, "demo"); /* FP16 has no typed field */
    add_input(&b, "h", "FP16", 3, -1)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].fp32_contents = floats;
    b.contents[0].n_fp32_contents = 3;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT, "send it in raw_input_contents");
}

/* One input in contents, the other raw, with one raw entry per input (the
 * contents input's entry empty): the positional layout. */
static void test_positional_raw(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    int32_t mask_ints[4] = {1, -1, 0, 127};
    builder_init(&b, "demo");
    add_input(&b, "mask", "INT8", 2, 2)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].int_contents = mask_ints;
    b.contents[0].n_int_contents = 4;
    add_input(&b, "x", "FP32", 2, 4);
    add_raw(&b, NULL, 0);
    add_raw(&b, x_data, sizeof x_data);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_memory_equal(d.req.inputs[1].data, x_data, sizeof x_data);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    assert_string_equal(d.req.inputs[0].name, "x"); /* manifest order after validation */
    pjs_grpc_infer_release(&d);

    b.raw[0].data = (uint8_t *)mask_data; /* both contents and raw bytes */
    b.raw[0].len = sizeof mask_data;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "contents field must not be specified when using raw_input_contents "
                        "for 'mask' for model 'demo'"); /* Triton's words */
}

/* ---- validation errors pass through -------------------------------------------- */

static void test_validate_errors(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b);
    b.inputs[0].name = "nope";
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "unexpected input \"nope\""));
    pjs_grpc_infer_release(&d);

    demo_request(&b);
    b.raw[0].len = 12; /* byte size */
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "got 12 bytes"));
    pjs_grpc_infer_release(&d);

    demo_request(&b);
    add_output(&b, "zz");
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "unknown output \"zz\""));
    pjs_grpc_infer_release(&d);
}

static void test_classification_bad_counts(void **state)
{
    (void)state;
    builder b;
    demo_request(&b);
    add_output(&b, "y");
    set_int(add_output_param(&b, 0, "classification"), 0);
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "output \"y\": parameter \"classification\" must be at least 1");
    demo_request(&b);
    add_output(&b, "y");
    set_int(add_output_param(&b, 0, "classification"), -3);
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "parameter \"classification\" must not be negative (got -3)");
    demo_request(&b);
    add_output(&b, "y");
    set_string(add_output_param(&b, 0, "classification"), "2");
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "parameter \"classification\" must be an int64_param or uint64_param");
    /* The classes are strings in the response; they never go to a region. */
    demo_request(&b);
    add_output(&b, "y");
    set_int(add_output_param(&b, 0, "classification"), 2);
    set_string(add_output_param(&b, 0, "shared_memory_region"), "region");
    set_int(add_output_param(&b, 0, "shared_memory_byte_size"), 64);
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "classification and a shared memory region cannot be combined");
}

/* ---- encoding ------------------------------------------------------------------- */

/* Fills outputs as the dispatcher does, for a validated request of batch 2. */
static void fake_outputs(pjs_grpc_infer *d, const pjs_manifest *m)
{
    pjs_infer_request *r = &d->req;
    r->n_outputs = m->n_outputs;
    for (size_t i = 0; i < m->n_outputs; i++) {
        pjs_infer_output *o = &r->outputs[i];
        o->spec = &m->outputs[i];
        o->shape = m->outputs[i].shape;
        o->shape.dims[0] = r->batch;
        int64_t numel;
        assert_true(pjs_shape_numel(&o->shape, &numel));
        o->nbytes = (size_t)numel * pjs_dtype_size(o->spec->dtype);
        o->requested = -1;
        for (size_t k = 0; k < r->n_requested; k++)
            if (strcmp(r->requested[k].name, o->spec->name) == 0)
                o->requested = (int)k;
        o->data = malloc(o->nbytes);
        assert_non_null(o->data);
        memset(o->data, (int)(0x10 + i), o->nbytes);
    }
}

/* Encodes d's response, packs it and unpacks it as a client would. */
static Inference__ModelInferResponse *round_trip(pjs_grpc_infer *d)
{
    Inference__ModelInferResponse *resp;
    pjs_error err;
    uint8_t *buf;
    size_t len;
    assert_int_equal(pjs_grpc_infer_response(d, "1", &resp, &err), 0);
    assert_int_equal(pjs_grpc_pack(&resp->base, &buf, &len, &err), 0);
    Inference__ModelInferResponse *back = inference__model_infer_response__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(back);
    return back;
}

static void test_encode_all_outputs(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b);
    b.req.id = "abc";
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    fake_outputs(&d, *state);
    Inference__ModelInferResponse *r = round_trip(&d);
    assert_string_equal(r->model_name, "demo");
    assert_string_equal(r->model_version, "1");
    assert_string_equal(r->id, "abc");
    assert_int_equal(r->n_outputs, 2);
    assert_int_equal(r->n_raw_output_contents, 2);
    assert_string_equal(r->outputs[0]->name, "y");
    assert_string_equal(r->outputs[0]->datatype, "FP32");
    assert_int_equal(r->outputs[0]->n_shape, 2);
    assert_int_equal(r->outputs[0]->shape[0], 2);
    assert_int_equal(r->outputs[0]->shape[1], 3);
    assert_null(r->outputs[0]->contents);
    assert_int_equal(r->raw_output_contents[0].len, 2 * 3 * 4);
    assert_int_equal(r->raw_output_contents[0].data[5], 0x10);
    assert_string_equal(r->outputs[1]->datatype, "INT64");
    assert_int_equal(r->outputs[1]->n_shape, 1);
    assert_int_equal(r->raw_output_contents[1].len, 2 * 8);
    inference__model_infer_response__free_unpacked(r, NULL);
    pjs_grpc_infer_release(&d);
}

static void test_encode_requested_output(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b);
    add_output(&b, "n");
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    fake_outputs(&d, *state);
    Inference__ModelInferResponse *r = round_trip(&d);
    assert_int_equal(r->n_outputs, 1);
    assert_string_equal(r->outputs[0]->name, "n");
    assert_int_equal(r->n_raw_output_contents, 1);
    assert_int_equal(r->raw_output_contents[0].data[0], 0x11);
    inference__model_infer_response__free_unpacked(r, NULL);
    pjs_grpc_infer_release(&d);
}

/* tritonclient's InferRequestedOutput("y", class_count=K): the output comes
 * back as BYTES [batch, min(K, 3)] of "score:index", best first. */
static void test_encode_classification(void **state)
{
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    demo_request(&b);
    add_output(&b, "n");
    add_output(&b, "y");
    set_uint(add_output_param(&b, 1, "classification"), 2);
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(d.req.requested[1].class_count, 2);
    assert_int_equal(pjs_infer_validate(&d.req, *state, 4, &err), 0);
    fake_outputs(&d, *state);
    static const float y[2][3] = {{0.5f, 2.25f, -1.0f}, {7.0f, 7.0f, 8.0f}};
    memcpy(d.req.outputs[0].data, y, sizeof y);
    Inference__ModelInferResponse *r = round_trip(&d);
    assert_int_equal(r->n_outputs, 2);
    assert_string_equal(r->outputs[0]->name, "y");
    assert_string_equal(r->outputs[0]->datatype, "BYTES");
    assert_int_equal(r->outputs[0]->n_shape, 2);
    assert_int_equal(r->outputs[0]->shape[0], 2);
    assert_int_equal(r->outputs[0]->shape[1], 2);
    static const char want[] = "\x0a\0\0\0" "2.250000:1" "\x0a\0\0\0" "0.500000:0"
                               "\x0a\0\0\0" "8.000000:2" "\x0a\0\0\0" "7.000000:0";
    assert_int_equal(r->raw_output_contents[0].len, sizeof want - 1);
    assert_memory_equal(r->raw_output_contents[0].data, want, sizeof want - 1);
    assert_string_equal(r->outputs[1]->datatype, "INT64"); /* not classified: as it was */
    inference__model_infer_response__free_unpacked(r, NULL);
    /* Encoding again (a retried send) finds the output classified already. */
    r = round_trip(&d);
    assert_int_equal(r->raw_output_contents[0].len, sizeof want - 1);
    inference__model_infer_response__free_unpacked(r, NULL);
    pjs_grpc_infer_release(&d);
}

/* ---- shared memory -------------------------------------------------------------- */

#define SHM_KEY "/pjs_test_grpc_codec"
#define SHM_BYTES 256

typedef struct shm_fixture {
    pjs_manifest *manifest;
    pjs_shm_registry *registry;
    unsigned char *map;
} shm_fixture;

/* Runs inside the group: *state is the group's manifest on entry. */
static int setup_shm(void **state)
{
    shm_fixture *fx = calloc(1, sizeof *fx);
    pjs_error err;
    if (fx == NULL)
        return -1;
    fx->manifest = *state;
    shm_unlink(SHM_KEY);
    int fd = shm_open(SHM_KEY, O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, SHM_BYTES) != 0)
        return -1;
    fx->map = mmap(NULL, SHM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    pjs_shm_options on = {.allowed = true};
    if (fx->map == MAP_FAILED || pjs_shm_registry_create(&on, &fx->registry, &err) != 0 ||
        pjs_shm_register(fx->registry, "region", SHM_KEY, 0, SHM_BYTES, &err) != 0)
        return -1;
    *state = fx;
    return 0;
}

static int teardown_shm(void **state)
{
    shm_fixture *fx = *state;
    pjs_shm_registry_destroy(fx->registry);
    munmap(fx->map, SHM_BYTES);
    shm_unlink(SHM_KEY);
    *state = fx->manifest;
    free(fx);
    return 0;
}

static void test_shm_input_and_output(void **state)
{
    shm_fixture *fx = *state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    memcpy(fx->map + 64, x_data, sizeof x_data);
    memset(fx->map + 128, 0, 64);
    builder_init(&b, "demo");
    add_input(&b, "x", "FP32", 2, 4);
    set_string(add_input_param(&b, 0, "shared_memory_region"), "region");
    set_int(add_input_param(&b, 0, "shared_memory_offset"), 64);
    set_int(add_input_param(&b, 0, "shared_memory_byte_size"), sizeof x_data);
    add_input(&b, "mask", "INT8", 2, 2);
    add_raw(&b, mask_data, sizeof mask_data); /* tritonclient: raw only for non-shm inputs */
    add_output(&b, "y");
    set_string(add_output_param(&b, 0, "shared_memory_region"), "region");
    set_uint(add_output_param(&b, 0, "shared_memory_offset"), 128);
    set_uint(add_output_param(&b, 0, "shared_memory_byte_size"), 64);
    add_output(&b, "n");
    assert_int_equal(decode(&b, &d, fx->registry, &err), 0);
    assert_memory_equal(d.req.inputs[0].data, x_data, sizeof x_data);
    fx->map[64] ^= 0xff; /* copied at decode: a later change in the region is not seen */
    assert_int_equal(((const unsigned char *)d.req.inputs[0].data)[0], fx->map[64] ^ 0xff);
    fx->map[64] ^= 0xff;
    assert_int_equal(d.req.inputs[0].nbytes, sizeof x_data);
    assert_memory_equal(d.req.inputs[1].data, mask_data, sizeof mask_data);
    assert_string_equal(d.req.requested[0].shm_region, "region");
    assert_int_equal(d.req.requested[0].shm_offset, 128);
    assert_int_equal(pjs_infer_validate(&d.req, fx->manifest, 4, &err), 0);
    fake_outputs(&d, fx->manifest);
    Inference__ModelInferResponse *r = round_trip(&d);
    assert_int_equal(r->n_outputs, 2);
    assert_int_equal(r->n_raw_output_contents, 2);
    assert_int_equal(r->raw_output_contents[0].len, 0); /* y went to shared memory */
    assert_int_equal(r->outputs[0]->n_parameters, 2);
    assert_int_equal(r->raw_output_contents[1].len, 16);
    assert_int_equal(fx->map[128], 0x10);
    assert_int_equal(fx->map[128 + 23], 0x10);
    assert_int_equal(fx->map[128 + 24], 0);
    inference__model_infer_response__free_unpacked(r, NULL);
    pjs_grpc_infer_release(&d);
}

static void test_shm_errors(void **state)
{
    shm_fixture *fx = *state;
    builder b;
    demo_request(&b);
    set_string(add_input_param(&b, 0, "shared_memory_region"), "region");
    expect_decode_error(&b, fx->registry, PJS_ERR_INVALID_ARGUMENT,
                        "\"shared_memory_byte_size\" is missing");

    demo_request(&b);
    set_string(add_input_param(&b, 0, "shared_memory_region"), "nowhere");
    set_int(add_input_param(&b, 0, "shared_memory_byte_size"), 32);
    b.req.n_raw_input_contents = 1;
    b.raw[0] = b.raw[1];
    expect_decode_error(&b, fx->registry, PJS_ERR_NOT_FOUND, "input \"x\": ");

    demo_request(&b);
    set_string(add_input_param(&b, 0, "shared_memory_region"), "region");
    set_int(add_input_param(&b, 0, "shared_memory_byte_size"), SHM_BYTES + 1);
    b.req.n_raw_input_contents = 1;
    b.raw[0] = b.raw[1];
    expect_decode_error(&b, fx->registry, PJS_ERR_INVALID_ARGUMENT, "input \"x\": ");

    demo_request(&b);
    set_string(add_input_param(&b, 0, "shared_memory_region"), "region");
    set_int(add_input_param(&b, 0, "shared_memory_byte_size"), 32);
    expect_decode_error(&b, NULL, PJS_ERR_UNSUPPORTED, "shared memory is not available");
}

static void test_shm_output_too_small(void **state)
{
    shm_fixture *fx = *state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    Inference__ModelInferResponse *resp;
    demo_request(&b);
    add_output(&b, "y");
    set_string(add_output_param(&b, 0, "shared_memory_region"), "region");
    set_int(add_output_param(&b, 0, "shared_memory_byte_size"), 8);
    assert_int_equal(decode(&b, &d, fx->registry, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, fx->manifest, 4, &err), 0);
    fake_outputs(&d, fx->manifest);
    assert_int_equal(pjs_grpc_infer_response(&d, "1", &resp, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "output \"y\" is 24 bytes"));
    pjs_grpc_infer_release(&d);
}

/* ---- strings (BYTES) ------------------------------------------------------------------ */

/* A hooked model: clients send rows of strings of any length and get a
 * label and a score per row. */
static const char TEXTS[] = "format_version: \"2.0\"\n"
                            "name: texts\n"
                            "batch_sizes: [1, 4]\n"
                            "inputs:\n"
                            "  - {name: tokens, dtype: i32, shape: [batch, 4]}\n"
                            "outputs:\n"
                            "  - {name: logits, dtype: f32, shape: [batch, 2]}\n"
                            "client_inputs:\n"
                            "  - {name: TEXT, dtype: bytes, shape: [batch, -1]}\n"
                            "client_outputs:\n"
                            "  - {name: LABEL, dtype: bytes, shape: [batch]}\n"
                            "  - {name: SCORE, dtype: f32, shape: [batch]}\n";

/* Four strings: empty, with a NUL, not UTF-8, plain. */
static ProtobufCBinaryData four_strings[4] = {
    {0, (uint8_t *)""},
    {3, (uint8_t *)"a\0b"},
    {2, (uint8_t *)"\xff\xfe"},
    {5, (uint8_t *)"hello"},
};
/* The same, serialized. */
static const unsigned char four_serialized[] = "\0\0\0\0"
                                               "\3\0\0\0a\0b"
                                               "\2\0\0\0\xff\xfe"
                                               "\5\0\0\0hello";
#define FOUR_SERIALIZED_LEN (sizeof four_serialized - 1)

static pjs_manifest *texts_manifest(void)
{
    static pjs_manifest m;
    static bool parsed;
    pjs_error err;
    if (!parsed)
        assert_int_equal(pjs_manifest_parse(&m, TEXTS, sizeof TEXTS - 1, "texts", &err), 0);
    parsed = true;
    return &m;
}

/* Decodes b and validates it against `texts`'s client tensors. */
static int decode_texts(builder *b, pjs_grpc_infer *d, pjs_shm_registry *shm, pjs_error *err)
{
    int rc = decode(b, d, shm, err);
    if (rc == 0)
        rc = pjs_infer_validate_client(&d->req, texts_manifest(), 4, err);
    if (getenv("PJS_TEST_VERBOSE") != NULL && rc != 0)
        print_message("%s\n", err->msg);
    return rc;
}

/* A string output has no classes: asking to classify it is refused when the
 * request is validated, before anything runs; a number output of the same
 * model may be classified. */
static void test_bytes_classification_refused(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 2, 2);
    add_raw(&b, four_serialized, FOUR_SERIALIZED_LEN);
    add_output(&b, "LABEL");
    set_int(add_output_param(&b, 0, "classification"), 1);
    assert_int_equal(decode_texts(&b, &d, NULL, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "model texts: output \"LABEL\" is BYTES: classification"));
    pjs_grpc_infer_release(&d);
    b.outputs[0].name = "SCORE";
    assert_int_equal(decode_texts(&b, &d, NULL, &err), 0);
    pjs_grpc_infer_release(&d);
}

static void test_bytes_raw(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 2, 2);
    add_raw(&b, four_serialized, FOUR_SERIALIZED_LEN);
    assert_int_equal(decode_texts(&b, &d, NULL, &err), 0);
    assert_int_equal(d.req.batch, 2);
    assert_ptr_equal(d.req.inputs[0].spec, &texts_manifest()->client_inputs[0]);
    assert_int_equal(d.req.inputs[0].nbytes, FOUR_SERIALIZED_LEN);
    assert_memory_equal(d.req.inputs[0].data, four_serialized, FOUR_SERIALIZED_LEN);
    pjs_grpc_infer_release(&d);

    /* The shape says 4 x 1: still four strings. */
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 4, 1);
    add_raw(&b, four_serialized, FOUR_SERIALIZED_LEN);
    assert_int_equal(decode_texts(&b, &d, NULL, &err), 0);
    assert_int_equal(d.req.batch, 4);
    pjs_grpc_infer_release(&d);
}

static void test_bytes_raw_refused(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    /* The last length runs one byte past the end. */
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 2, 2);
    add_raw(&b, four_serialized, FOUR_SERIALIZED_LEN - 1);
    assert_int_equal(decode_texts(&b, &d, NULL, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "model texts: input \"TEXT\": malformed BYTES data: element 3 "
                                    "at offset 17 has length 5 but only 4 bytes are left"));
    pjs_grpc_infer_release(&d);
    /* Well formed, but one string short of the shape. */
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 2, 2);
    add_raw(&b, four_serialized, 17);
    assert_int_equal(decode_texts(&b, &d, NULL, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "model texts: input \"TEXT\": the BYTES data holds 3 "
                                    "elements but shape [2, 2] has 4"));
    pjs_grpc_infer_release(&d);
    /* Strings for a number tensor, and numbers for a string tensor. */
    pjs_manifest *demo = *(pjs_manifest **)state;
    demo_request(&b);
    b.inputs[0].datatype = "BYTES";
    assert_int_equal(decode(&b, &d, NULL, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, demo, 4, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "datatype BYTES does not match the model's FP32"));
    pjs_grpc_infer_release(&d);
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "FP32", 2, 1);
    add_raw(&b, x_data, 8);
    assert_int_equal(decode_texts(&b, &d, NULL, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "datatype FP32 does not match the model's BYTES"));
    pjs_grpc_infer_release(&d);
}

static void test_bytes_contents(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 2, 2)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].bytes_contents = four_strings;
    b.contents[0].n_bytes_contents = 4;
    assert_int_equal(decode_texts(&b, &d, NULL, &err), 0);
    assert_int_equal(d.req.inputs[0].nbytes, FOUR_SERIALIZED_LEN);
    assert_memory_equal(d.req.inputs[0].data, four_serialized, FOUR_SERIALIZED_LEN);
    pjs_grpc_infer_release(&d);

    /* Every string empty: four length prefixes. */
    ProtobufCBinaryData empty[4] = {{0, NULL}, {0, NULL}, {0, NULL}, {0, NULL}};
    b.contents[0].bytes_contents = empty;
    assert_int_equal(decode_texts(&b, &d, NULL, &err), 0);
    assert_int_equal(d.req.inputs[0].nbytes, 16);
    uint64_t count = 0;
    assert_int_equal(pjs_bytes_count(d.req.inputs[0].data, 16, &count, &err), 0);
    assert_int_equal(count, 4);
    pjs_grpc_infer_release(&d);

    b.contents[0].bytes_contents = four_strings;
    b.contents[0].n_bytes_contents = 3;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "input \"TEXT\": bytes_contents holds 3 elements but the shape has 4");
    b.contents[0].n_bytes_contents = 4;
    b.contents[0].fp32_contents = x_data;
    b.contents[0].n_fp32_contents = 1;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "BYTES elements belong in bytes_contents, not fp32_contents");
    /* bytes_contents for a number tensor. */
    builder_init(&b, "demo");
    add_input(&b, "x", "FP32", 1, 4)->contents = &b.contents[0];
    b.contents[0] = (Inference__InferTensorContents)INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    b.contents[0].bytes_contents = four_strings;
    b.contents[0].n_bytes_contents = 4;
    expect_decode_error(&b, NULL, PJS_ERR_INVALID_ARGUMENT,
                        "FP32 elements belong in fp32_contents, not bytes_contents");
}

/* String outputs go out raw, in their serialized form. */
static void test_bytes_output_raw(void **state)
{
    (void)state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 2, 2);
    add_raw(&b, four_serialized, FOUR_SERIALIZED_LEN);
    add_output(&b, "LABEL");
    assert_int_equal(decode_texts(&b, &d, NULL, &err), 0);
    const pjs_manifest *m = texts_manifest();
    pjs_infer_output *o = &d.req.outputs[0];
    d.req.n_outputs = 2;
    o->spec = &m->client_outputs[0];
    o->shape.rank = 1;
    o->shape.dims[0] = 2;
    o->data = malloc(11);
    assert_non_null(o->data);
    memcpy(o->data, "\2\0\0\0hi\1\0\0\0\xff", 11);
    o->nbytes = 11;
    o->requested = 0;
    o = &d.req.outputs[1];
    o->spec = &m->client_outputs[1];
    o->shape.rank = 1;
    o->shape.dims[0] = 2;
    o->data = calloc(2, sizeof(float));
    o->nbytes = 2 * sizeof(float);
    o->requested = -1;
    Inference__ModelInferResponse *r = round_trip(&d);
    assert_int_equal(r->n_outputs, 1);
    assert_string_equal(r->outputs[0]->name, "LABEL");
    assert_string_equal(r->outputs[0]->datatype, "BYTES");
    assert_int_equal(r->outputs[0]->n_shape, 1);
    assert_int_equal(r->outputs[0]->shape[0], 2);
    assert_int_equal(r->raw_output_contents[0].len, 11);
    assert_memory_equal(r->raw_output_contents[0].data, "\2\0\0\0hi\1\0\0\0\xff", 11);
    inference__model_infer_response__free_unpacked(r, NULL);
    pjs_grpc_infer_release(&d);
}

/* Shared memory carries strings serialized, both ways; an output's region
 * must hold its serialized size. */
static void test_bytes_shm(void **state)
{
    shm_fixture *fx = *state;
    builder b;
    pjs_grpc_infer d;
    pjs_error err;
    memcpy(fx->map + 32, four_serialized, FOUR_SERIALIZED_LEN);
    memset(fx->map + 128, 0, 64);
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 2, 2);
    set_string(add_input_param(&b, 0, "shared_memory_region"), "region");
    set_int(add_input_param(&b, 0, "shared_memory_offset"), 32);
    set_int(add_input_param(&b, 0, "shared_memory_byte_size"), FOUR_SERIALIZED_LEN);
    add_output(&b, "LABEL");
    set_string(add_output_param(&b, 0, "shared_memory_region"), "region");
    set_uint(add_output_param(&b, 0, "shared_memory_offset"), 128);
    set_uint(add_output_param(&b, 0, "shared_memory_byte_size"), 11);
    assert_int_equal(decode_texts(&b, &d, fx->registry, &err), 0);
    assert_memory_equal(d.req.inputs[0].data, four_serialized, FOUR_SERIALIZED_LEN);
    pjs_infer_output *o = &d.req.outputs[0];
    d.req.n_outputs = 1;
    o->spec = &texts_manifest()->client_outputs[0];
    o->shape.rank = 1;
    o->shape.dims[0] = 2;
    o->data = malloc(11);
    assert_non_null(o->data);
    memcpy(o->data, "\2\0\0\0hi\1\0\0\0\xff", 11);
    o->nbytes = 11;
    o->requested = 0;
    Inference__ModelInferResponse *r = round_trip(&d);
    assert_int_equal(r->raw_output_contents[0].len, 0);
    assert_memory_equal(fx->map + 128, "\2\0\0\0hi\1\0\0\0\xff", 11);
    inference__model_infer_response__free_unpacked(r, NULL);
    pjs_grpc_infer_release(&d);

    /* A region one byte short of the strings is refused. */
    set_uint(&b.out_param_values[0][2], 10);
    assert_int_equal(decode_texts(&b, &d, fx->registry, &err), 0);
    o = &d.req.outputs[0];
    d.req.n_outputs = 1;
    o->spec = &texts_manifest()->client_outputs[0];
    o->shape.rank = 1;
    o->shape.dims[0] = 2;
    o->data = malloc(11);
    assert_non_null(o->data);
    memcpy(o->data, "\2\0\0\0hi\1\0\0\0\xff", 11);
    o->nbytes = 11;
    o->requested = 0;
    Inference__ModelInferResponse *resp;
    assert_int_equal(pjs_grpc_infer_response(&d, "1", &resp, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "output \"LABEL\" is 11 bytes but shared memory region "
                                    "\"region\" was given 10"));
    pjs_grpc_infer_release(&d);

    /* A malformed serialization in the region is refused like a raw one. */
    memcpy(fx->map + 32, "\x09\0\0\0abc", 7);
    builder_init(&b, "texts");
    add_input(&b, "TEXT", "BYTES", 1, 1);
    set_string(add_input_param(&b, 0, "shared_memory_region"), "region");
    set_int(add_input_param(&b, 0, "shared_memory_offset"), 32);
    set_int(add_input_param(&b, 0, "shared_memory_byte_size"), 7);
    assert_int_equal(decode_texts(&b, &d, fx->registry, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "malformed BYTES data: element 0 at offset 0 has length 9"));
    pjs_grpc_infer_release(&d);
}

/* Metadata and config show the client tensors: strings as BYTES and
 * TYPE_STRING, extents that vary as -1. */
static void test_bytes_model_info(void **state)
{
    (void)state;
    pjs_grpc_arena a;
    pjs_error err;
    Inference__ModelMetadataResponse *md;
    Inference__ModelConfig *c;
    pjs_grpc_model_desc desc = {"texts", "1", "cpu", 4, texts_manifest()};
    pjs_grpc_arena_init(&a, 1 << 20);
    assert_int_equal(pjs_grpc_model_metadata(&desc, &a, &md, &err), 0);
    assert_int_equal(md->n_inputs, 1);
    assert_string_equal(md->inputs[0]->name, "TEXT");
    assert_string_equal(md->inputs[0]->datatype, "BYTES");
    assert_int_equal(md->inputs[0]->n_shape, 2);
    assert_int_equal(md->inputs[0]->shape[0], -1);
    assert_int_equal(md->inputs[0]->shape[1], -1);
    assert_int_equal(md->n_outputs, 2);
    assert_string_equal(md->outputs[0]->name, "LABEL");
    assert_string_equal(md->outputs[0]->datatype, "BYTES");
    assert_string_equal(md->outputs[1]->datatype, "FP32");
    assert_int_equal(pjs_grpc_model_config(&desc, &a, &c, &err), 0);
    assert_int_equal(c->n_input, 1);
    assert_string_equal(c->input[0]->name, "TEXT");
    assert_int_equal(c->input[0]->data_type, INFERENCE__DATA_TYPE__TYPE_STRING);
    assert_int_equal(c->input[0]->n_dims, 1); /* the batch axis left out */
    assert_int_equal(c->input[0]->dims[0], -1);
    assert_int_equal(c->n_output, 2);
    assert_int_equal(c->output[0]->data_type, INFERENCE__DATA_TYPE__TYPE_STRING);
    assert_int_equal(c->output[0]->n_dims, 0);
    assert_int_equal(c->output[1]->data_type, INFERENCE__DATA_TYPE__TYPE_FP32);
    pjs_grpc_arena_reset(&a);
}

/* ---- model metadata and config ----------------------------------------------------- */

static void test_model_metadata(void **state)
{
    pjs_grpc_arena a;
    pjs_error err;
    Inference__ModelMetadataResponse *md;
    pjs_grpc_model_desc desc = {"demo", "1", "cpu", 4, *state};
    pjs_grpc_arena_init(&a, 1 << 20);
    assert_int_equal(pjs_grpc_model_metadata(&desc, &a, &md, &err), 0);
    assert_string_equal(md->name, "demo");
    assert_string_equal(md->platform, "pjrt_cpu");
    assert_int_equal(md->n_versions, 1);
    assert_string_equal(md->versions[0], "1");
    assert_int_equal(md->n_inputs, 2);
    assert_string_equal(md->inputs[1]->name, "mask");
    assert_string_equal(md->inputs[1]->datatype, "INT8");
    assert_int_equal(md->inputs[0]->n_shape, 2);
    assert_int_equal(md->inputs[0]->shape[0], -1);
    assert_int_equal(md->inputs[0]->shape[1], 4);
    assert_int_equal(md->outputs[1]->n_shape, 1);
    assert_int_equal(md->outputs[1]->shape[0], -1);
    pjs_grpc_arena_reset(&a);
}

static void test_model_config(void **state)
{
    pjs_grpc_arena a;
    pjs_error err;
    Inference__ModelConfig *c;
    pjs_grpc_model_desc desc = {"demo", "1", "cpu", 4, *state};
    pjs_grpc_arena_init(&a, 1 << 20);
    assert_int_equal(pjs_grpc_model_config(&desc, &a, &c, &err), 0);
    assert_string_equal(c->name, "demo");
    assert_string_equal(c->platform, "pjrt_cpu");
    assert_string_equal(c->backend, "pjserve");
    assert_int_equal(c->max_batch_size, 4);
    /* Every tensor has a batch axis: requests are coalesced. */
    assert_int_equal(c->scheduling_choice_case,
                     INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING);
    assert_int_equal(c->dynamic_batching->n_preferred_batch_size, 2);
    assert_int_equal(c->dynamic_batching->preferred_batch_size[0], 1);
    assert_int_equal(c->dynamic_batching->preferred_batch_size[1], 4);
    assert_int_equal(c->dynamic_batching->max_queue_delay_microseconds, 0);
    assert_int_equal(c->n_input, 2);
    assert_int_equal(c->input[0]->data_type, INFERENCE__DATA_TYPE__TYPE_FP32);
    assert_int_equal(c->input[0]->n_dims, 1); /* the batch axis left out */
    assert_int_equal(c->input[0]->dims[0], 4);
    assert_int_equal(c->input[1]->data_type, INFERENCE__DATA_TYPE__TYPE_INT8);
    assert_int_equal(c->output[1]->data_type, INFERENCE__DATA_TYPE__TYPE_INT64);
    assert_int_equal(c->output[1]->n_dims, 0);
    uint8_t *buf;
    size_t len;
    assert_int_equal(pjs_grpc_pack(&c->base, &buf, &len, &err), 0);
    free(buf);
    pjs_grpc_arena_reset(&a);

    desc.max_batch_size = 0; /* an unbatched model keeps every axis */
    pjs_grpc_arena_init(&a, 1 << 20);
    assert_int_equal(pjs_grpc_model_config(&desc, &a, &c, &err), 0);
    assert_int_equal(c->input[0]->n_dims, 2);
    assert_int_equal(c->input[0]->dims[0], -1);
    assert_int_equal(c->scheduling_choice_case,
                     INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE__NOT_SET);
    pjs_grpc_arena_reset(&a);
}

/* A model with an output that has no batch axis cannot split a coalesced
 * execution among requests: no dynamic_batching. */
static void test_model_config_not_coalesced(void **state)
{
    (void)state;
    static const char yaml[] = "format_version: \"2.0\"\n"
                               "name: pooled\n"
                               "batch_sizes: [1, 8]\n"
                               "inputs:\n"
                               "  - {name: x, dtype: f32, shape: [batch, 4]}\n"
                               "outputs:\n"
                               "  - {name: total, dtype: f32, shape: [4]}\n";
    pjs_manifest mf;
    pjs_grpc_arena a;
    pjs_error err;
    Inference__ModelConfig *c;
    assert_int_equal(pjs_manifest_parse(&mf, yaml, sizeof yaml - 1, "pooled", &err), 0);
    pjs_grpc_model_desc desc = {"pooled", "1", "cpu", 8, &mf};
    pjs_grpc_arena_init(&a, 1 << 20);
    assert_int_equal(pjs_grpc_model_config(&desc, &a, &c, &err), 0);
    assert_int_equal(c->max_batch_size, 8);
    assert_int_equal(c->scheduling_choice_case,
                     INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE__NOT_SET);
    pjs_grpc_arena_reset(&a);
    pjs_manifest_free(&mf);
}

static void test_config_dtypes(void **state)
{
    (void)state;
    assert_int_equal(pjs_grpc_config_dtype(PJS_DTYPE_BF16), INFERENCE__DATA_TYPE__TYPE_BF16);
    assert_int_equal(pjs_grpc_config_dtype(PJS_DTYPE_BOOL), INFERENCE__DATA_TYPE__TYPE_BOOL);
    assert_int_equal(pjs_grpc_config_dtype(PJS_DTYPE_U64), INFERENCE__DATA_TYPE__TYPE_UINT64);
    assert_int_equal(pjs_grpc_config_dtype(PJS_DTYPE_F16), INFERENCE__DATA_TYPE__TYPE_FP16);
    assert_int_equal(pjs_grpc_config_dtype(PJS_DTYPE_BYTES), INFERENCE__DATA_TYPE__TYPE_STRING);
    assert_int_equal(pjs_grpc_config_dtype(PJS_DTYPE_INVALID), INFERENCE__DATA_TYPE__TYPE_INVALID);
}

/* ---- the arena ---------------------------------------------------------------------- */

static void test_arena_limit(void **state)
{
    (void)state;
    pjs_grpc_arena a;
    pjs_grpc_arena_init(&a, 64 * 1024);
    assert_non_null(pjs_grpc_arena_alloc(&a, 100));
    assert_non_null(pjs_grpc_arena_alloc(&a, 40000)); /* a block of its own */
    assert_non_null(pjs_grpc_arena_alloc(&a, 100));
    assert_false(a.exhausted);
    assert_null(pjs_grpc_arena_alloc(&a, 30000));
    assert_true(a.exhausted);
    assert_null(pjs_grpc_arena_calloc(&a, SIZE_MAX / 2, 4));
    pjs_grpc_arena_reset(&a);
    assert_int_equal(a.total, 0);
    assert_non_null(pjs_grpc_arena_strdup(&a, "again"));
    pjs_grpc_arena_reset(&a);
}

static void test_arena_rewind(void **state)
{
    (void)state;
    pjs_grpc_arena a;
    pjs_grpc_arena_init(&a, 1 << 20);
    assert_non_null(pjs_grpc_arena_alloc(&a, 100));
    assert_non_null(pjs_grpc_arena_alloc(&a, 40000)); /* a block of its own */
    for (int i = 0; i < 40; i++) /* a second standard block */
        assert_non_null(pjs_grpc_arena_alloc(&a, 1000));
    pjs_grpc_arena_rewind(&a); /* keeps one standard block, frees the rest */
    assert_int_equal(a.total, 0);
    assert_non_null(a.blocks);
    void *again = pjs_grpc_arena_alloc(&a, 100);
    assert_non_null(again);
    assert_int_equal(a.used, 112);
    pjs_grpc_arena_rewind(&a);
    assert_ptr_equal(pjs_grpc_arena_alloc(&a, 8), again); /* the same block, from its start */
    pjs_grpc_arena_reset(&a);
    assert_null(a.blocks);
}

/* ---- model control ------------------------------------------------------------ */

typedef Pjserve__Control__V1__ModelControlStatusResponse control_status;

/* The status encoded, packed and unpacked as a client reads it. */
static control_status *status_round_trip(pjs_control_mode mode, const pjs_weight_cache_info *c,
                                         const pjs_control_model *models, size_t n)
{
    pjs_grpc_arena a;
    pjs_error err;
    control_status *r;
    uint8_t *buf;
    size_t len;
    pjs_grpc_arena_init(&a, 1 << 20);
    assert_int_equal(pjs_grpc_control_status(mode, c, models, n, &a, &r, &err), 0);
    assert_int_equal(pjs_grpc_pack(&r->base, &buf, &len, &err), 0);
    pjs_grpc_arena_reset(&a);
    control_status *back = pjserve__control__v1__model_control_status_response__unpack(NULL, len,
                                                                                        buf);
    free(buf);
    assert_non_null(back);
    return back;
}

static void test_control_status(void **state)
{
    (void)state;
    pjs_control_model models[2];
    memset(models, 0, sizeof models);
    snprintf(models[0].entry.name, sizeof models[0].entry.name, "mlp");
    models[0].entry.state = PJS_MODEL_READY;
    models[0].loaded = true;
    models[0].residency = (pjs_model_residency_info){.residency = PJS_RESIDENCY_HOST,
                                                     .resident = true,
                                                     .weight_bytes = 4096,
                                                     .loads = 3,
                                                     .evictions = 2,
                                                     .load_ns = 1500000000u};
    models[0].sched = (pjs_model_sched_info){.weight = 0.5, .max_queue_depth = 64,
                                             .default_timeout_us = 50000, .queue_depth = 7};
    snprintf(models[1].entry.name, sizeof models[1].entry.name, "gone");
    models[1].entry.state = PJS_MODEL_UNAVAILABLE;
    snprintf(models[1].entry.reason, sizeof models[1].entry.reason, "unloaded");
    pjs_weight_cache_info cache = {.budget_bytes = UINT64_MAX, .used_bytes = 4096,
                                   .pinned_bytes = 0};

    control_status *r = status_round_trip(PJS_CONTROL_EXPLICIT, &cache, models, 2);
    assert_string_equal(r->control_mode, "explicit");
    assert_true(r->cache->unlimited);
    assert_int_equal(r->cache->budget_bytes, 0);
    assert_int_equal(r->cache->used_bytes, 4096);
    assert_int_equal(r->n_models, 2);
    const Pjserve__Control__V1__ModelStatus *m = r->models[0];
    assert_string_equal(m->name, "mlp");
    assert_string_equal(m->state, "READY");
    assert_string_equal(m->reason, "");
    assert_int_equal(m->residency, PJSERVE__CONTROL__V1__RESIDENCY__HOST);
    assert_true(m->resident);
    assert_int_equal(m->weight_bytes, 4096);
    assert_int_equal(m->loads, 3);
    assert_int_equal(m->evictions, 2);
    assert_true(m->load_seconds == 1.5);
    assert_true(m->weight == 0.5);
    assert_int_equal(m->max_queue_depth, 64);
    assert_int_equal(m->default_timeout_us, 50000);
    assert_int_equal(m->queue_depth, 7);
    m = r->models[1];
    assert_string_equal(m->name, "gone");
    assert_string_equal(m->state, "UNAVAILABLE");
    assert_string_equal(m->reason, "unloaded");
    assert_int_equal(m->residency, PJSERVE__CONTROL__V1__RESIDENCY__RESIDENCY_UNSPECIFIED);
    assert_int_equal(m->weight_bytes, 0);
    pjserve__control__v1__model_control_status_response__free_unpacked(r, NULL);

    cache.budget_bytes = 1 << 30;
    models[0].residency.residency = PJS_RESIDENCY_DEVICE;
    r = status_round_trip(PJS_CONTROL_DYNAMIC, &cache, models, 1);
    assert_string_equal(r->control_mode, "dynamic");
    assert_false(r->cache->unlimited);
    assert_int_equal(r->cache->budget_bytes, 1 << 30);
    assert_int_equal(r->models[0]->residency, PJSERVE__CONTROL__V1__RESIDENCY__DEVICE);
    pjserve__control__v1__model_control_status_response__free_unpacked(r, NULL);
    models[0].residency.residency = PJS_RESIDENCY_UNPINNED;
    r = status_round_trip(PJS_CONTROL_STATIC, &cache, models, 1);
    assert_string_equal(r->control_mode, "static");
    assert_int_equal(r->models[0]->residency, PJSERVE__CONTROL__V1__RESIDENCY__UNPINNED);
    pjserve__control__v1__model_control_status_response__free_unpacked(r, NULL);
}

static void test_control_residency(void **state)
{
    (void)state;
    pjs_residency r;
    pjs_error err;
    assert_int_equal(pjs_grpc_control_residency(PJSERVE__CONTROL__V1__RESIDENCY__DEVICE, "m", &r,
                                                &err),
                     0);
    assert_int_equal(r, PJS_RESIDENCY_DEVICE);
    assert_int_equal(
        pjs_grpc_control_residency(PJSERVE__CONTROL__V1__RESIDENCY__HOST, "m", &r, &err), 0);
    assert_int_equal(r, PJS_RESIDENCY_HOST);
    assert_int_equal(
        pjs_grpc_control_residency(PJSERVE__CONTROL__V1__RESIDENCY__UNPINNED, "m", &r, &err), 0);
    assert_int_equal(r, PJS_RESIDENCY_UNPINNED);
    assert_int_equal(pjs_grpc_control_residency(0, "mlp", &r, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "model mlp: no residency given (DEVICE, HOST or UNPINNED)");
    assert_int_equal(pjs_grpc_control_residency(9, "mlp", &r, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg,
                        "model mlp: unknown residency 9 (expected DEVICE, HOST or UNPINNED)");
}

static void test_control_policy_change(void **state)
{
    (void)state;
    Pjserve__Control__V1__SetModelPolicyRequest req =
        PJSERVE__CONTROL__V1__SET_MODEL_POLICY_REQUEST__INIT;
    req.name = "mlp";
    req.max_queue_depth_present_case =
        PJSERVE__CONTROL__V1__SET_MODEL_POLICY_REQUEST__MAX_QUEUE_DEPTH_PRESENT_MAX_QUEUE_DEPTH;
    req.max_queue_depth = 64;
    /* Packed and unpacked, so presence comes from the wire. */
    uint8_t buf[64];
    size_t len = pjserve__control__v1__set_model_policy_request__pack(&req, buf);
    Pjserve__Control__V1__SetModelPolicyRequest *back =
        pjserve__control__v1__set_model_policy_request__unpack(NULL, len, buf);
    assert_non_null(back);
    pjs_control_policy_change c;
    pjs_grpc_control_policy_change(back, &c);
    assert_false(c.has_weight);
    assert_true(c.has_max_queue_depth);
    assert_int_equal(c.max_queue_depth, 64);
    assert_false(c.has_default_timeout_us);
    pjserve__control__v1__set_model_policy_request__free_unpacked(back, NULL);

    /* Zero is a value once present; above INT64_MAX reads as INT64_MAX. */
    req.weight_present_case = PJSERVE__CONTROL__V1__SET_MODEL_POLICY_REQUEST__WEIGHT_PRESENT_WEIGHT;
    req.weight = 0;
    req.default_timeout_us_present_case =
        PJSERVE__CONTROL__V1__SET_MODEL_POLICY_REQUEST__DEFAULT_TIMEOUT_US_PRESENT_DEFAULT_TIMEOUT_US;
    req.default_timeout_us = UINT64_MAX;
    len = pjserve__control__v1__set_model_policy_request__pack(&req, buf);
    back = pjserve__control__v1__set_model_policy_request__unpack(NULL, len, buf);
    assert_non_null(back);
    pjs_grpc_control_policy_change(back, &c);
    assert_true(c.has_weight && c.weight == 0);
    assert_true(c.has_default_timeout_us);
    assert_int_equal(c.default_timeout_us, INT64_MAX);
    pjserve__control__v1__set_model_policy_request__free_unpacked(back, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_raw),
        cmocka_unit_test(test_recycle_between_requests),
        cmocka_unit_test(test_decode_malformed),
        cmocka_unit_test(test_decode_empty_message),
        cmocka_unit_test(test_raw_inputs_read_in_place),
        cmocka_unit_test(test_framing_refused_as_protobuf_c_refuses),
        cmocka_unit_test(test_priority_and_timeout),
        cmocka_unit_test(test_sequence_parameters),
        cmocka_unit_test(test_timeout_without_deadline),
        cmocka_unit_test(test_deadline_arithmetic),
        cmocka_unit_test(test_priority_wrong_type),
        cmocka_unit_test(test_raw_count_mismatch),
        cmocka_unit_test(test_rank_and_id_limits),
        cmocka_unit_test(test_contents_fp32_and_int8),
        cmocka_unit_test(test_contents_bool_and_u16),
        cmocka_unit_test(test_contents_errors),
        cmocka_unit_test(test_positional_raw),
        cmocka_unit_test(test_validate_errors),
        cmocka_unit_test(test_classification_bad_counts),
        cmocka_unit_test(test_encode_all_outputs),
        cmocka_unit_test(test_encode_requested_output),
        cmocka_unit_test(test_encode_classification),
        cmocka_unit_test_setup_teardown(test_shm_input_and_output, setup_shm, teardown_shm),
        cmocka_unit_test_setup_teardown(test_shm_errors, setup_shm, teardown_shm),
        cmocka_unit_test_setup_teardown(test_shm_output_too_small, setup_shm, teardown_shm),
        cmocka_unit_test(test_bytes_raw),
        cmocka_unit_test(test_bytes_classification_refused),
        cmocka_unit_test(test_bytes_raw_refused),
        cmocka_unit_test(test_bytes_contents),
        cmocka_unit_test(test_bytes_output_raw),
        cmocka_unit_test_setup_teardown(test_bytes_shm, setup_shm, teardown_shm),
        cmocka_unit_test(test_bytes_model_info),
        cmocka_unit_test(test_model_metadata),
        cmocka_unit_test(test_model_config),
        cmocka_unit_test(test_model_config_not_coalesced),
        cmocka_unit_test(test_config_dtypes),
        cmocka_unit_test(test_arena_limit),
        cmocka_unit_test(test_arena_rewind),
        cmocka_unit_test(test_control_status),
        cmocka_unit_test(test_control_residency),
        cmocka_unit_test(test_control_policy_change),
    };
    return cmocka_run_group_tests(tests, setup_manifest, teardown_manifest);
}
