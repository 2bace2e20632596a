/*
 * test_classify.c - unit tests of the classification extension's formatter
 * (src/core/classify.c): the ranking (values in their own type, ties by
 * index, NaN last), the score text of every dtype, shapes with and without
 * a batch axis, labels, the refusals, and the replacement of a request's
 * outputs. A heap-selected top-k is compared with a plain sort on rows with
 * many ties.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/classify.h"

/* The strings of a serialized BYTES buffer, joined with '|'. */
static char *joined(const void *data, size_t nbytes)
{
    char *out = calloc(1, nbytes + 1);
    assert_non_null(out);
    pjs_bytes_reader r = pjs_bytes_reader_init(data, nbytes);
    const unsigned char *s;
    uint32_t len;
    size_t at = 0;
    while (pjs_bytes_next(&r, &s, &len)) {
        if (at > 0)
            out[at++] = '|';
        memcpy(out + at, s, len);
        at += len;
    }
    assert_ptr_equal(r.at, r.end); /* well formed to the end */
    return out;
}

static pjs_shape shape2(int64_t a, int64_t b)
{
    pjs_shape s = {.rank = 2};
    s.dims[0] = a;
    s.dims[1] = b;
    return s;
}

static pjs_shape shape1(int64_t a)
{
    pjs_shape s = {.rank = 1};
    s.dims[0] = a;
    return s;
}

/* Classifies and checks the strings and the shape. */
static void expect_classes(const void *data, pjs_dtype t, pjs_shape shape, bool batched,
                           uint64_t k, const pjs_labels *labels, const char *want,
                           pjs_shape want_shape)
{
    void *out;
    size_t nbytes;
    pjs_shape got;
    pjs_error err;
    int rc = pjs_classify(data, t, &shape, batched, k, labels, &out, &nbytes, &got, &err);
    if (rc != 0)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    char *text = joined(out, nbytes);
    if (strcmp(text, want) != 0)
        print_error("got %s, want %s\n", text, want);
    assert_string_equal(text, want);
    assert_true(pjs_shape_equal(&got, &want_shape));
    free(text);
    free(out);
}

static void test_rows_best_first(void **state)
{
    (void)state;
    const float y[2][4] = {{0.1f, 0.7f, 0.2f, -3.0f}, {5.0f, 5.0f, -1.0f, 6.5f}};
    expect_classes(y, PJS_DTYPE_F32, shape2(2, 4), true, 2, NULL,
                   "0.700000:1|0.200000:2|6.500000:3|5.000000:0", shape2(2, 2));
    /* More classes asked for than a row has: all of them. */
    expect_classes(y, PJS_DTYPE_F32, shape2(2, 4), true, 100, NULL,
                   "0.700000:1|0.200000:2|0.100000:0|-3.000000:3|"
                   "6.500000:3|5.000000:0|5.000000:1|-1.000000:2",
                   shape2(2, 4));
    /* Without a batch axis the whole tensor is one row. */
    expect_classes(y, PJS_DTYPE_F32, shape2(2, 4), false, 3, NULL,
                   "6.500000:7|5.000000:4|5.000000:5", shape1(3));
    /* No rows: [0, k]. */
    expect_classes(y, PJS_DTYPE_F32, shape2(0, 4), true, 2, NULL, "", shape2(0, 2));
    /* A row of nothing: [rows, 0]. */
    expect_classes(y, PJS_DTYPE_F32, shape2(2, 0), true, 2, NULL, "", shape2(2, 0));
    /* Batched with one extent: each row has one class. */
    expect_classes(y, PJS_DTYPE_F32, shape1(3), true, 5, NULL, "0.100000:0|0.700000:0|0.200000:0",
                   shape2(3, 1));
}

static void test_special_floats(void **state)
{
    (void)state;
    const double v[6] = {NAN, -INFINITY, 1e20, INFINITY, NAN, -0.0};
    expect_classes(v, PJS_DTYPE_F64, shape1(6), false, 6, NULL,
                   "inf:3|100000000000000000000.000000:2|-0.000000:5|-inf:1|nan:0|nan:4",
                   shape1(6));
}

static void test_every_number_type(void **state)
{
    (void)state;
    const uint8_t u8[3] = {3, 255, 0};
    expect_classes(u8, PJS_DTYPE_U8, shape1(3), false, 2, NULL, "255:1|3:0", shape1(2));
    const uint16_t u16[2] = {65535, 1};
    expect_classes(u16, PJS_DTYPE_U16, shape1(2), false, 1, NULL, "65535:0", shape1(1));
    const uint32_t u32[2] = {7, 4294967295u};
    expect_classes(u32, PJS_DTYPE_U32, shape1(2), false, 1, NULL, "4294967295:1", shape1(1));
    /* 64-bit values compared exactly: these two are one double. */
    const uint64_t u64[2] = {18446744073709551614u, 18446744073709551615u};
    expect_classes(u64, PJS_DTYPE_U64, shape1(2), false, 2, NULL,
                   "18446744073709551615:1|18446744073709551614:0", shape1(2));
    const int8_t i8[3] = {-128, 127, -1};
    expect_classes(i8, PJS_DTYPE_I8, shape1(3), false, 3, NULL, "127:1|-1:2|-128:0", shape1(3));
    const int16_t i16[2] = {-5, -300};
    expect_classes(i16, PJS_DTYPE_I16, shape1(2), false, 2, NULL, "-5:0|-300:1", shape1(2));
    const int32_t i32[2] = {INT32_MIN, 9};
    expect_classes(i32, PJS_DTYPE_I32, shape1(2), false, 2, NULL, "9:1|-2147483648:0",
                   shape1(2));
    const int64_t i64[3] = {INT64_MAX - 1, INT64_MIN, INT64_MAX};
    expect_classes(i64, PJS_DTYPE_I64, shape1(3), false, 3, NULL,
                   "9223372036854775807:2|9223372036854775806:0|-9223372036854775808:1",
                   shape1(3));
    /* f16: 1.5, -2, 65504, a subnormal (2^-24), -inf; bf16: 1, -2.5, 3.140625. */
    const uint16_t f16[5] = {0x3e00, 0xc000, 0x7bff, 0x0001, 0xfc00};
    expect_classes(f16, PJS_DTYPE_F16, shape1(5), false, 5, NULL,
                   "65504.000000:2|1.500000:0|0.000000:3|-2.000000:1|-inf:4", shape1(5));
    const uint16_t bf16[3] = {0x3f80, 0xc020, 0x4049};
    expect_classes(bf16, PJS_DTYPE_BF16, shape1(3), false, 3, NULL,
                   "3.140625:2|1.000000:0|-2.500000:1", shape1(3));
}

static void test_labels(void **state)
{
    (void)state;
    char *names[3] = {"cat", "", "bee, the insect: yes"};
    pjs_labels labels = {.file = "labels.txt", .count = 3, .names = names};
    const int32_t v[2][4] = {{1, 2, 3, 4}, {9, 8, 7, 6}};
    /* Index 1's line is empty and index 3 has no line: no label for them. */
    expect_classes(v, PJS_DTYPE_I32, shape2(2, 4), true, 4, &labels,
                   "4:3|3:2:bee, the insect: yes|2:1|1:0:cat|"
                   "9:0:cat|8:1|7:2:bee, the insect: yes|6:3",
                   shape2(2, 4));
}

static void test_refused(void **state)
{
    (void)state;
    const uint8_t flags[2] = {1, 0};
    pjs_shape s = shape1(2);
    void *out = (void *)1;
    size_t nbytes;
    pjs_shape got;
    pjs_error err;
    assert_int_equal(pjs_classify(flags, PJS_DTYPE_BOOL, &s, false, 1, NULL, &out, &nbytes, &got,
                                  &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "BOOL outputs cannot be classified"));
    assert_null(out);
    assert_int_equal(pjs_classify(flags, PJS_DTYPE_U8, &s, false, 0, NULL, &out, &nbytes, &got,
                                  &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "at least 1"));

    assert_false(pjs_classify_supported(PJS_DTYPE_BYTES));
    assert_false(pjs_classify_supported(PJS_DTYPE_BOOL));
    assert_false(pjs_classify_supported(PJS_DTYPE_INVALID));
    assert_true(pjs_classify_supported(PJS_DTYPE_BF16));
    assert_true(pjs_classify_supported(PJS_DTYPE_U64));
    pjs_tensor_spec text = {.name = "LABEL", .dtype = PJS_DTYPE_BYTES};
    assert_int_equal(pjs_classify_check(&text, "texts", &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "model texts: output \"LABEL\" is BYTES: classification"));
    pjs_tensor_spec scores = {.name = "SCORE", .dtype = PJS_DTYPE_F16};
    assert_int_equal(pjs_classify_check(&scores, "texts", &err), 0);
}

/* Whether a ranks before b as classify.c promises (ints: no NaN). */
static int reference_order(const void *pa, const void *pb, const int32_t *v)
{
    size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
    if (v[a] != v[b])
        return v[a] > v[b] ? -1 : 1;
    return a < b ? -1 : 1;
}

static const int32_t *sort_values;
static int by_reference(const void *a, const void *b)
{
    return reference_order(a, b, sort_values);
}

/* The heap's top-k equals the first k of a full sort, on rows with many
 * ties and for k from 1 past the row's length. */
static void test_heap_matches_sort(void **state)
{
    (void)state;
    enum { N = 97 };
    int32_t v[N];
    size_t order[N];
    unsigned seed = 12345;
    for (int round = 0; round < 20; round++) {
        for (size_t i = 0; i < N; i++) {
            seed = seed * 1103515245u + 12345u;
            v[i] = (int32_t)((seed >> 16) % (round % 4 == 0 ? 3 : 40)) - 5;
            order[i] = i;
        }
        sort_values = v;
        qsort(order, N, sizeof order[0], by_reference);
        for (uint64_t k = 1; k <= N + 3; k += (k < 8 ? 1 : 13)) {
            size_t keep = k < N ? (size_t)k : N;
            char *want = calloc(keep, 32);
            assert_non_null(want);
            size_t at = 0;
            for (size_t j = 0; j < keep; j++)
                at += (size_t)sprintf(want + at, "%s%d:%zu", j ? "|" : "", v[order[j]], order[j]);
            expect_classes(v, PJS_DTYPE_I32, shape1(N), false, k, NULL, want,
                           shape1((int64_t)keep));
            free(want);
        }
    }
}

/* A completed request: y (FP32 [2, 3]) classified, n (INT64 [2]) not. */
static void test_request_outputs(void **state)
{
    (void)state;
    pjs_tensor_spec y = {.name = "y", .dtype = PJS_DTYPE_F32, .shape = shape2(-1, 3),
                         .batched = true};
    pjs_tensor_spec n = {.name = "n", .dtype = PJS_DTYPE_I64, .shape = shape1(-1),
                         .batched = true};
    pjs_infer_request r;
    pjs_infer_request_init(&r);
    r.n_requested = 2;
    r.requested[0] = (pjs_infer_requested_output){.name = "n"};
    r.requested[1] = (pjs_infer_requested_output){.name = "y", .class_count = 1};
    r.n_outputs = 2;
    const float yv[6] = {1, 3, 2, -1, -2, -3};
    const int64_t nv[2] = {4, 5};
    r.outputs[0] = (pjs_infer_output){.spec = &y, .shape = shape2(2, 3), .nbytes = sizeof yv,
                                      .requested = 1, .data = malloc(sizeof yv)};
    r.outputs[1] = (pjs_infer_output){.spec = &n, .shape = shape1(2), .nbytes = sizeof nv,
                                      .requested = 0, .data = malloc(sizeof nv)};
    assert_non_null(r.outputs[0].data);
    assert_non_null(r.outputs[1].data);
    memcpy(r.outputs[0].data, yv, sizeof yv);
    memcpy(r.outputs[1].data, nv, sizeof nv);
    pjs_error err;
    assert_int_equal(pjs_classify_outputs(&r, &err), 0);
    assert_ptr_equal(r.outputs[0].spec, &r.requested[1].class_spec);
    assert_string_equal(r.outputs[0].spec->name, "y");
    assert_int_equal(r.outputs[0].spec->dtype, PJS_DTYPE_BYTES);
    assert_true(pjs_shape_equal(&r.outputs[0].shape, &(pjs_shape){.rank = 2, .dims = {2, 1}}));
    char *text = joined(r.outputs[0].data, r.outputs[0].nbytes);
    assert_string_equal(text, "3.000000:1|-1.000000:0");
    free(text);
    assert_ptr_equal(r.outputs[1].spec, &n);
    assert_memory_equal(r.outputs[1].data, nv, sizeof nv);
    /* Twice is once. */
    size_t nbytes = r.outputs[0].nbytes;
    assert_int_equal(pjs_classify_outputs(&r, &err), 0);
    assert_int_equal(r.outputs[0].nbytes, nbytes);

    /* No rows and no data: still the classes' shape and type. */
    free(r.outputs[1].data);
    r.outputs[1] = (pjs_infer_output){.spec = &n, .shape = shape1(0), .requested = 0};
    r.requested[0].class_count = 3;
    assert_int_equal(pjs_classify_outputs(&r, &err), 0);
    assert_int_equal(r.outputs[1].spec->dtype, PJS_DTYPE_BYTES);
    assert_true(pjs_shape_equal(&r.outputs[1].shape, &(pjs_shape){.rank = 2, .dims = {0, 1}}));
    assert_int_equal(r.outputs[1].nbytes, 0);

    /* Bytes that do not match the shape are the server's bug, not read. */
    free(r.outputs[1].data);
    r.outputs[1] = (pjs_infer_output){.spec = &n, .shape = shape1(2), .requested = 0,
                                      .data = malloc(sizeof nv)};
    assert_non_null(r.outputs[1].data);
    r.requested[0].class_count = 2;
    r.outputs[1].nbytes = 8;
    assert_int_equal(pjs_classify_outputs(&r, &err), PJS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "output \"n\" holds 8 bytes"));
    pjs_infer_request_release(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_best_first),
        cmocka_unit_test(test_special_floats),
        cmocka_unit_test(test_every_number_type),
        cmocka_unit_test(test_labels),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_heap_matches_sort),
        cmocka_unit_test(test_request_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
