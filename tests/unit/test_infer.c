/*
 * test_infer.c - unit tests of request validation (src/core/infer.c).
 *
 * One manifest with two batched inputs of different types and two outputs,
 * plus an unbatched one; each test builds a request as a front end would and
 * checks the verdict, the status and the words of the message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/infer.h"

static const char two_io_yaml[] =
    "format_version: \"2.0\"\n"
    "name: two_io\n"
    "kind: model\n"
    "batch_sizes: [1, 4, 8]\n"
    "inputs:\n"
    "  - {name: a, dtype: f32, shape: [batch, 8]}\n"
    "  - {name: b, dtype: i32, shape: [batch, 3]}\n"
    "outputs:\n"
    "  - {name: sum, dtype: f32, shape: [batch, 8]}\n"
    "  - {name: argmax, dtype: i32, shape: [batch]}\n";

static const char fixed_yaml[] =
    "format_version: \"2.0\"\n"
    "name: fixed\n"
    "kind: model\n"
    "batch_sizes: [1]\n"
    "inputs:\n"
    "  - {name: x, dtype: f16, shape: [2, 2]}\n"
    "outputs:\n"
    "  - {name: y, dtype: f16, shape: [2]}\n";

static float a_data[8 * 8];
static int32_t b_data[8 * 3];

typedef struct fixture {
    pjs_manifest two_io;
    pjs_manifest fixed;
    pjs_infer_request r;
    pjs_error err;
} fixture;

static int setup(void **state)
{
    static fixture f;
    memset(&f, 0, sizeof f);
    pjs_error err;
    if (pjs_manifest_parse(&f.two_io, two_io_yaml, strlen(two_io_yaml), "two_io", &err) != 0 ||
        pjs_manifest_parse(&f.fixed, fixed_yaml, strlen(fixed_yaml), "fixed", &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    pjs_manifest_free(&f->two_io);
    pjs_manifest_free(&f->fixed);
    return 0;
}

static void set_input(pjs_infer_request *r, size_t i, const char *name, const char *dt,
                      int64_t d0, int64_t d1, const void *data, size_t nbytes)
{
    pjs_infer_input *in = &r->inputs[i];
    in->name = name;
    in->datatype = dt;
    in->shape.rank = 2;
    in->shape.dims[0] = d0;
    in->shape.dims[1] = d1;
    in->data = data;
    in->nbytes = nbytes;
    if (r->n_inputs <= i)
        r->n_inputs = i + 1;
}

/* A valid batch-3 request for two_io, inputs given in reverse order. */
static pjs_infer_request *good_request(fixture *f)
{
    pjs_infer_request_init(&f->r);
    set_input(&f->r, 0, "b", "INT32", 3, 3, b_data, 3 * 3 * 4);
    set_input(&f->r, 1, "a", "FP32", 3, 8, a_data, 3 * 8 * 4);
    pjs_error_clear(&f->err);
    return &f->r;
}

static void expect_invalid(fixture *f, const char *needle)
{
    int rc = pjs_infer_validate(&f->r, &f->two_io, 8, &f->err);
    if (getenv("PJS_TEST_VERBOSE"))
        printf("  %s\n", f->err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(f->err.code, PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(f->err.msg, "two_io"));
    if (strstr(f->err.msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", f->err.msg, needle);
}

static void test_valid_request_reordered(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = good_request(f);
    assert_int_equal(pjs_infer_validate(r, &f->two_io, 8, &f->err), 0);
    assert_int_equal(r->batch, 3);
    assert_string_equal(r->inputs[0].name, "a");
    assert_ptr_equal(r->inputs[0].spec, &f->two_io.inputs[0]);
    assert_ptr_equal(r->inputs[0].data, a_data);
    assert_string_equal(r->inputs[1].name, "b");
    assert_ptr_equal(r->inputs[1].spec, &f->two_io.inputs[1]);
}

static void test_unknown_input(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[0].name = "c";
    expect_invalid(f, "unexpected input \"c\" (the model's inputs: a, b)");
}

static void test_duplicate_input(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[0].name = "a";
    expect_invalid(f, "input \"a\" given more than once");
}

static void test_missing_input(void **state)
{
    fixture *f = *state;
    good_request(f)->n_inputs = 1;
    expect_invalid(f, "missing input \"a\"");
}

static void test_wrong_datatype(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[1].datatype = "FP64";
    expect_invalid(f, "datatype FP64 does not match the model's FP32");
}

static void test_unknown_datatype(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[1].datatype = "FP128";
    expect_invalid(f, "unknown datatype \"FP128\"");
}

static void test_bytes_datatype(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[1].datatype = "BYTES";
    expect_invalid(f, "BYTES is not supported");
}

static void test_wrong_shape(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[1].shape.dims[1] = 7;
    expect_invalid(f, "shape [3, 7] does not match the model's [-1, 8]");
}

static void test_wrong_rank(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[1].shape.rank = 1;
    expect_invalid(f, "does not match the model's [-1, 8]");
}

static void test_batch_above_max(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = good_request(f);
    r->inputs[0].shape.dims[0] = 9;
    r->inputs[1].shape.dims[0] = 9;
    expect_invalid(f, "batch size 9 is outside 1..8");
}

static void test_batch_zero(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = good_request(f);
    r->inputs[1].shape.dims[0] = 0;
    r->inputs[1].nbytes = 0;
    expect_invalid(f, "batch size 0 is outside 1..8");
}

static void test_batches_disagree(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = good_request(f);
    r->inputs[0].shape.dims[0] = 2;
    r->inputs[0].nbytes = 2 * 3 * 4;
    expect_invalid(f, "batched inputs must agree");
}

static void test_byte_size_mismatch(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[1].nbytes = 3 * 8 * 4 - 1;
    expect_invalid(f, "got 95 bytes of data but shape [3, 8] of FP32 needs 96");
}

static void test_huge_dims(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = good_request(f);
    r->inputs[0].shape.dims[0] = INT64_MAX;
    r->inputs[1].shape.dims[0] = INT64_MAX;
    expect_invalid(f, "batch size 9223372036854775807 is outside 1..8");
}

static void test_requested_outputs(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = good_request(f);
    r->n_requested = 1;
    r->requested[0].name = "argmax";
    assert_int_equal(pjs_infer_validate(r, &f->two_io, 8, &f->err), 0);

    r = good_request(f);
    r->n_requested = 1;
    r->requested[0].name = "nope";
    expect_invalid(f, "unknown output \"nope\" requested (the model's outputs: sum, argmax)");

    r = good_request(f);
    r->n_requested = 2;
    r->requested[0].name = "sum";
    r->requested[1].name = "sum";
    expect_invalid(f, "output \"sum\" requested more than once");
}

static void test_unbatched_model(void **state)
{
    fixture *f = *state;
    static uint16_t x[4];
    pjs_infer_request_init(&f->r);
    set_input(&f->r, 0, "x", "FP16", 2, 2, x, sizeof x);
    assert_int_equal(pjs_infer_validate(&f->r, &f->fixed, 1, &f->err), 0);
    assert_int_equal(f->r.batch, 1);

    /* No batch axis: the first dimension is exact, not a batch. */
    set_input(&f->r, 0, "x", "FP16", 1, 2, x, 4);
    assert_int_equal(pjs_infer_validate(&f->r, &f->fixed, 1, &f->err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(f->err.msg, "shape [1, 2] does not match the model's [2, 2]"));
}

static void test_missing_data(void **state)
{
    fixture *f = *state;
    good_request(f)->inputs[0].data = NULL;
    expect_invalid(f, "no data");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_request_reordered),
        cmocka_unit_test(test_unknown_input),
        cmocka_unit_test(test_duplicate_input),
        cmocka_unit_test(test_missing_input),
        cmocka_unit_test(test_wrong_datatype),
        cmocka_unit_test(test_unknown_datatype),
        cmocka_unit_test(test_bytes_datatype),
        cmocka_unit_test(test_wrong_shape),
        cmocka_unit_test(test_wrong_rank),
        cmocka_unit_test(test_batch_above_max),
        cmocka_unit_test(test_batch_zero),
        cmocka_unit_test(test_batches_disagree),
        cmocka_unit_test(test_byte_size_mismatch),
        cmocka_unit_test(test_huge_dims),
        cmocka_unit_test(test_requested_outputs),
        cmocka_unit_test(test_unbatched_model),
        cmocka_unit_test(test_missing_data),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
