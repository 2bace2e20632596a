/*
 * test_http_codec.c - the REST codec of src/frontend/http without a server.
 *
 * Requests: JSON "data" for every datatype (flat and nested, booleans as
 * true/false and 0/1, FP16/BF16 rounded), the refusals of values a datatype
 * cannot hold, the binary tensor extension (good framing and each way it can
 * be broken), Content-Encoding, and shared-memory inputs and outputs through
 * a real POSIX shared-memory object. Responses: JSON and binary encodings,
 * output order and the id echo. Documents: model metadata, config and
 * statistics, and the Prometheus text (the weight cache's families
 * included). Each request is decoded and then validated against a manifest,
 * as the front end does. Model control: the status document and the strict
 * reading of the residency, policy and compact bodies. Strings (BYTES) of a
 * hooked model's client tensors: JSON strings and binary data in, JSON
 * strings (bytes kept as they are) and binary data out, and the documents.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "core/bytes.h"
#include "frontend/http/control_json.h"
#include "frontend/http/http_codec.h"
#include "frontend/http/metrics_render.h"
#include "frontend/http/model_json.h"
#include "frontend/http/shm_json.h"
#include "frontend/http/tensor_json.h"

/* ---- fixtures ------------------------------------------------------------- */

/* Every datatype once, batched, plus an unbatched input and three outputs. */
static const char all_dtypes_yaml[] = "format_version: \"2.0\"\n"
                                      "name: dtypes\n"
                                      "batch_sizes: [1, 4]\n"
                                      "inputs:\n"
                                      "  - {name: bool, dtype: bool, shape: [batch, 2]}\n"
                                      "  - {name: u8, dtype: u8, shape: [batch, 2]}\n"
                                      "  - {name: u16, dtype: u16, shape: [batch, 2]}\n"
                                      "  - {name: u32, dtype: u32, shape: [batch, 2]}\n"
                                      "  - {name: u64, dtype: u64, shape: [batch, 2]}\n"
                                      "  - {name: i8, dtype: i8, shape: [batch, 2]}\n"
                                      "  - {name: i16, dtype: i16, shape: [batch, 2]}\n"
                                      "  - {name: i32, dtype: i32, shape: [batch, 2]}\n"
                                      "  - {name: i64, dtype: i64, shape: [batch, 2]}\n"
                                      "  - {name: f16, dtype: f16, shape: [batch, 2]}\n"
                                      "  - {name: bf16, dtype: bf16, shape: [batch, 2]}\n"
                                      "  - {name: f32, dtype: f32, shape: [batch, 2]}\n"
                                      "  - {name: f64, dtype: f64, shape: [batch, 2]}\n"
                                      "  - {name: scale, dtype: f32, shape: [3]}\n"
                                      "outputs:\n"
                                      "  - {name: y, dtype: f32, shape: [batch, 2]}\n"
                                      "  - {name: flags, dtype: bool, shape: [batch]}\n"
                                      "  - {name: half, dtype: f16, shape: [2]}\n";

static pjs_manifest manifest;

static int setup_manifest(void **state)
{
    (void)state;
    pjs_error err;
    return pjs_manifest_parse(&manifest, all_dtypes_yaml, sizeof all_dtypes_yaml - 1, "test",
                              &err);
}

static int teardown_manifest(void **state)
{
    (void)state;
    pjs_manifest_free(&manifest);
    return 0;
}

/* The JSON of every input of the manifest with one row each; `override`
 * replaces the input of the same name (a JSON object text). */
static char *request_json(const char *override_name, const char *override)
{
    static const char *inputs[][2] = {
        {"bool", "{\"name\":\"bool\",\"datatype\":\"BOOL\",\"shape\":[1,2],\"data\":[true,0]}"},
        {"u8", "{\"name\":\"u8\",\"datatype\":\"UINT8\",\"shape\":[1,2],\"data\":[0,255]}"},
        {"u16", "{\"name\":\"u16\",\"datatype\":\"UINT16\",\"shape\":[1,2],\"data\":[1,65535]}"},
        {"u32",
         "{\"name\":\"u32\",\"datatype\":\"UINT32\",\"shape\":[1,2],\"data\":[2,4294967295]}"},
        {"u64", "{\"name\":\"u64\",\"datatype\":\"UINT64\",\"shape\":[1,2],"
                "\"data\":[3,9223372036854775807]}"},
        {"i8", "{\"name\":\"i8\",\"datatype\":\"INT8\",\"shape\":[1,2],\"data\":[-128,127]}"},
        {"i16", "{\"name\":\"i16\",\"datatype\":\"INT16\",\"shape\":[1,2],\"data\":[-32768,5]}"},
        {"i32",
         "{\"name\":\"i32\",\"datatype\":\"INT32\",\"shape\":[1,2],\"data\":[-2147483648,6]}"},
        {"i64", "{\"name\":\"i64\",\"datatype\":\"INT64\",\"shape\":[1,2],"
                "\"data\":[-9223372036854775808,7]}"},
        {"f16", "{\"name\":\"f16\",\"datatype\":\"FP16\",\"shape\":[1,2],\"data\":[1.5,-65504]}"},
        {"bf16", "{\"name\":\"bf16\",\"datatype\":\"BF16\",\"shape\":[1,2],\"data\":[1,-2.5]}"},
        {"f32", "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[[0.25,8]]}"},
        {"f64", "{\"name\":\"f64\",\"datatype\":\"FP64\",\"shape\":[1,2],\"data\":[0.1,3]}"},
        {"scale", "{\"name\":\"scale\",\"datatype\":\"FP32\",\"shape\":[3],\"data\":[1,2,3]}"},
    };
    size_t size = 64;
    for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++)
        size += strlen(inputs[i][1]) + (override ? strlen(override) : 0) + 1;
    char *text = malloc(size);
    assert_non_null(text);
    strcpy(text, "{\"inputs\":[");
    for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++) {
        if (i > 0)
            strcat(text, ",");
        bool replaced = override_name && strcmp(override_name, inputs[i][0]) == 0;
        strcat(text, replaced ? override : inputs[i][1]);
    }
    strcat(text, "]}");
    return text;
}

/* Decodes, maps (no registry: NULL) and validates; returns the status. */
static int decode_and_validate(pjs_http_infer *d, const char *body, size_t len,
                               const char *header_length, pjs_error *err)
{
    int rc = pjs_http_infer_decode(d, body, len, header_length, err);
    if (rc == 0)
        rc = pjs_infer_validate(&d->req, &manifest, 4, err);
    return rc;
}

static const pjs_infer_input *input_named(const pjs_http_infer *d, const char *name)
{
    for (size_t i = 0; i < d->req.n_inputs; i++)
        if (strcmp(d->req.inputs[i].name, name) == 0)
            return &d->req.inputs[i];
    fail_msg("no input %s", name);
    return NULL;
}

/* Expects a refusal whose message contains `piece`. */
static void expect_refused(const char *override_name, const char *override, const char *piece)
{
    char *body = request_json(override_name, override);
    pjs_http_infer d;
    pjs_error err;
    int rc = decode_and_validate(&d, body, strlen(body), NULL, &err);
    if (rc == 0 || strstr(err.msg, piece) == NULL)
        fail_msg("expected an error with \"%s\", got %d \"%s\"", piece, rc, rc ? err.msg : "");
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    pjs_http_infer_free(&d);
    free(body);
}

/* ---- half precision ---------------------------------------------------- */

static void test_f16_conversions(void **state)
{
    (void)state;
    assert_int_equal(pjs_f32_to_f16(1.5f), 0x3e00);
    assert_int_equal(pjs_f32_to_f16(-65504.0f), 0xfbff);
    assert_int_equal(pjs_f32_to_f16(65520.0f), 0x7c00);   /* rounds up to infinity */
    assert_int_equal(pjs_f32_to_f16(0x1p-24f), 0x0001);   /* smallest subnormal */
    assert_int_equal(pjs_f32_to_f16(0x1p-25f), 0x0000);   /* tie: rounds to even zero */
    assert_int_equal(pjs_f32_to_f16(0x1.8p-25f), 0x0001); /* above the tie */
    assert_int_equal(pjs_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    assert_int_equal(pjs_f32_to_f16(1.0f + 0x3p-11f), 0x3c02); /* tie to even, up */
    assert_int_equal(pjs_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(pjs_f32_to_f16(INFINITY), 0x7c00);
    assert_true((pjs_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (pjs_f32_to_f16(NAN) & 0x3ff));
    for (uint32_t h = 0; h < 0x10000; h++) { /* every finite half survives the round trip */
        if ((h & 0x7c00) == 0x7c00)
            continue;
        assert_int_equal(pjs_f32_to_f16(pjs_f16_to_f32((uint16_t)h)), h);
    }
    assert_true(pjs_f16_to_f32(0x0001) == 0x1p-24f);
}

static void test_bf16_conversions(void **state)
{
    (void)state;
    assert_int_equal(pjs_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(pjs_f32_to_bf16(-2.5f), 0xc020);
    assert_int_equal(pjs_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
    assert_int_equal(pjs_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
    assert_true(isnan(pjs_bf16_to_f32(pjs_f32_to_bf16(NAN))));
    assert_true(pjs_bf16_to_f32(0x4049) == 3.140625f);
}

/* ---- JSON requests --------------------------------------------------------- */

static void test_decode_every_dtype(void **state)
{
    (void)state;
    char *body = request_json(NULL, NULL);
    pjs_http_infer d;
    pjs_error err;
    assert_int_equal(decode_and_validate(&d, body, strlen(body), NULL, &err), 0);
    assert_int_equal(d.req.batch, 1);
    assert_memory_equal(input_named(&d, "bool")->data, ((uint8_t[]){1, 0}), 2);
    assert_memory_equal(input_named(&d, "u8")->data, ((uint8_t[]){0, 255}), 2);
    assert_memory_equal(input_named(&d, "u16")->data, ((uint16_t[]){1, 65535}), 4);
    assert_memory_equal(input_named(&d, "u32")->data, ((uint32_t[]){2, UINT32_MAX}), 8);
    assert_memory_equal(input_named(&d, "u64")->data, ((uint64_t[]){3, INT64_MAX}), 16);
    assert_memory_equal(input_named(&d, "i8")->data, ((int8_t[]){-128, 127}), 2);
    assert_memory_equal(input_named(&d, "i16")->data, ((int16_t[]){-32768, 5}), 4);
    assert_memory_equal(input_named(&d, "i32")->data, ((int32_t[]){INT32_MIN, 6}), 8);
    assert_memory_equal(input_named(&d, "i64")->data, ((int64_t[]){INT64_MIN, 7}), 16);
    assert_memory_equal(input_named(&d, "f16")->data, ((uint16_t[]){0x3e00, 0xfbff}), 4);
    assert_memory_equal(input_named(&d, "bf16")->data, ((uint16_t[]){0x3f80, 0xc020}), 4);
    assert_memory_equal(input_named(&d, "f32")->data, ((float[]){0.25f, 8.0f}), 8);
    assert_memory_equal(input_named(&d, "f64")->data, ((double[]){0.1, 3.0}), 16);
    assert_int_equal(input_named(&d, "f64")->nbytes, 16);
    pjs_http_infer_free(&d);
    free(body);
}

static void test_decode_nested_batch(void **state)
{
    (void)state;
    const char *body =
        "{\"id\":\"r1\",\"parameters\":{\"priority\":4,\"timeout\":7,\"whatever\":[1]},"
        "\"inputs\":[{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[2,1,2],"
        "\"data\":[[[1,2]],[[3,4]]],\"parameters\":{\"unknown\":1}}]}";
    pjs_http_infer d;
    pjs_error err;
    assert_int_equal(pjs_http_infer_decode(&d, body, strlen(body), NULL, &err), 0);
    assert_string_equal(d.req.id, "r1");
    assert_int_equal(d.req.n_inputs, 1);
    assert_int_equal(d.req.inputs[0].shape.rank, 3);
    assert_memory_equal(d.req.inputs[0].data, ((float[]){1, 2, 3, 4}), 16);
    assert_true(d.req.times.received > 0);
    /* timeout is microseconds from when the request was received */
    assert_int_equal(d.req.deadline_ns, d.req.times.received + 7000);
    pjs_http_infer_free(&d);
}

/* sequence_id as an integer or a string (0 and "": none), the two flags as
 * booleans. */
static void test_sequence_parameters(void **state)
{
    (void)state;
    static const struct {
        const char *params;
        bool has_id, is_string;
        uint64_t number;
        const char *string;
        bool start, end;
    } cases[] = {
        {"{\"sequence_id\":7,\"sequence_start\":true}", true, false, 7, NULL, true, false},
        {"{\"sequence_id\":\"u-1\",\"sequence_end\":true}", true, true, 0, "u-1", false, true},
        {"{\"sequence_id\":0,\"sequence_start\":false,\"sequence_end\":false}", false, false, 0,
         NULL, false, false},
        {"{\"sequence_id\":\"\"}", false, true, 0, "", false, false},
        {"{}", false, false, 0, NULL, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"parameters\":%s,\"inputs\":[]}", cases[i].params);
        pjs_http_infer d;
        pjs_error err;
        assert_int_equal(pjs_http_infer_decode(&d, body, strlen(body), NULL, &err), 0);
        assert_int_equal(d.req.sequence.has_id, cases[i].has_id);
        assert_int_equal(d.req.sequence.is_string, cases[i].is_string);
        assert_int_equal(d.req.sequence.number, cases[i].number);
        if (cases[i].string != NULL)
            assert_string_equal(d.req.sequence.string, cases[i].string);
        assert_int_equal(d.req.sequence.start, cases[i].start);
        assert_int_equal(d.req.sequence.end, cases[i].end);
        pjs_http_infer_free(&d);
    }
}

static void test_timeout_sets_deadline(void **state)
{
    (void)state;
    static const struct {
        const char *params;
        uint64_t timeout_us; /* 0: no deadline expected */
    } cases[] = {
        {"{}", 0},
        {"{\"timeout\":0}", 0}, /* 0 means no timeout, as Triton */
        {"{\"timeout\":1}", 1},
        {"{\"timeout\":2500000,\"priority\":0}", 2500000},
        {"{\"timeout\":9223372036854775807}", 0}, /* too far away to represent */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"parameters\":%s,\"inputs\":[]}", cases[i].params);
        pjs_http_infer d;
        pjs_error err;
        assert_int_equal(pjs_http_infer_decode(&d, body, strlen(body), NULL, &err), 0);
        uint64_t want = cases[i].timeout_us == 0
                            ? 0
                            : d.req.times.received + cases[i].timeout_us * 1000u;
        if (d.req.deadline_ns != want)
            fail_msg("%s: deadline %llu, want %llu", body, (unsigned long long)d.req.deadline_ns,
                     (unsigned long long)want);
        pjs_http_infer_free(&d);
    }
}

static void test_refuse_values_a_dtype_cannot_hold(void **state)
{
    (void)state;
    expect_refused("i8", "{\"name\":\"i8\",\"datatype\":\"INT8\",\"shape\":[1,2],\"data\":[128,0]}",
                   "element 0 is an integer 128, which INT8 cannot hold");
    expect_refused("u8", "{\"name\":\"u8\",\"datatype\":\"UINT8\",\"shape\":[1,2],\"data\":[0,-1]}",
                   "element 1 is an integer -1, which UINT8 cannot hold");
    expect_refused("u64", "{\"name\":\"u64\",\"datatype\":\"UINT64\",\"shape\":[1,2],"
                          "\"data\":[0,1.5]}",
                   "a fraction 1.5, which UINT64 cannot hold");
    expect_refused("bool", "{\"name\":\"bool\",\"datatype\":\"BOOL\",\"shape\":[1,2],"
                           "\"data\":[true,2]}",
                   "which BOOL cannot hold");
    expect_refused("f32", "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[1,2],"
                          "\"data\":[1,\"2\"]}",
                   "element 1 is a string");
    expect_refused("f32", "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1]}",
                   "\"data\" holds 1 values but the shape needs 2");
    expect_refused("f32", "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":5}",
                   "\"data\" must be a list");
    expect_refused("f32", "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[1,-2],\"data\":[]}",
                   "\"shape\"[1] must be a non-negative integer");
    expect_refused("f32", "{\"name\":\"f32\",\"datatype\":\"FP64\",\"shape\":[1,2],\"data\":[1,2]}",
                   "datatype FP64 does not match the model's FP32");
    expect_refused("f32", "{\"name\":\"f32\",\"datatype\":\"BYTES\",\"shape\":[1,2],"
                          "\"data\":[\"a\",\"b\"]}",
                   "datatype BYTES does not match the model's FP32");
    expect_refused("f32", "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[1,2]}",
                   "give exactly one of \"data\"");
    expect_refused("f32", "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[1,2],"
                          "\"data\":[1,2],\"parameters\":{\"binary_data_size\":8}}",
                   "several given");
}

static void test_refuse_malformed_requests(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        const char *piece;
    } cases[] = {
        {"{\"inputs\":[", "malformed JSON request at line 1"},
        {"[]", "must be an object"},
        {"{}", "\"inputs\" must be a list"},
        {"{\"inputs\":[],\"inputs\":[]}", "duplicate object key"},
        {"{\"id\":1,\"inputs\":[]}", "\"id\" must be a string"},
        {"{\"parameters\":{\"timeout\":\"soon\"},\"inputs\":[]}",
         "parameter \"timeout\" must be a non-negative integer"},
        {"{\"parameters\":{\"timeout\":-1},\"inputs\":[]}",
         "parameter \"timeout\" must be a non-negative integer"},
        {"{\"parameters\":{\"priority\":-4},\"inputs\":[]}",
         "parameter \"priority\" must be a non-negative integer"},
        {"{\"parameters\":{\"binary_data_output\":1},\"inputs\":[]}",
         "\"binary_data_output\" must be true or false"},
        {"{\"parameters\":{\"sequence_id\":-1},\"inputs\":[]}",
         "parameter \"sequence_id\" must be a non-negative integer or a string"},
        {"{\"parameters\":{\"sequence_id\":1.5},\"inputs\":[]}",
         "parameter \"sequence_id\" must be a non-negative integer or a string"},
        {"{\"parameters\":{\"sequence_id\":\"a\\u0000b\"},\"inputs\":[]}",
         "\"sequence_id\" must not hold NUL characters"},
        {"{\"parameters\":{\"sequence_start\":1},\"inputs\":[]}",
         "\"sequence_start\" must be true or false"},
        {"{\"parameters\":{\"sequence_end\":\"yes\"},\"inputs\":[]}",
         "\"sequence_end\" must be true or false"},
        {"{\"inputs\":[7]}", "inputs[0] must be an object"},
        {"{\"inputs\":[{\"datatype\":\"FP32\"}]}", "inputs[0]: \"name\" must be a string"},
        {"{\"inputs\":[],\"outputs\":{}}", "\"outputs\" must be a list"},
        {"{\"inputs\":[],\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":0}}]}",
         "output \"y\": parameter \"classification\" must be at least 1"},
        {"{\"inputs\":[],\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":-2}}]}",
         "parameter \"classification\" must be a non-negative integer"},
        {"{\"inputs\":[],\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":\"2\"}}]}",
         "parameter \"classification\" must be a non-negative integer"},
        {"{\"inputs\":[],\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":2,"
         "\"shared_memory_region\":\"r\",\"shared_memory_byte_size\":8}}]}",
         "classification and a shared memory region cannot be combined"},
        {"{\"inputs\":[],\"outputs\":[{\"name\":\"y\",\"parameters\":"
         "{\"shared_memory_region\":\"r\"}}]}",
         "needs \"shared_memory_byte_size\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pjs_http_infer d;
        pjs_error err;
        int rc = pjs_http_infer_decode(&d, cases[i].body, strlen(cases[i].body), NULL, &err);
        if (rc == 0 || strstr(err.msg, cases[i].piece) == NULL)
            fail_msg("%s: expected \"%s\", got \"%s\"", cases[i].body, cases[i].piece,
                     rc ? err.msg : "success");
        pjs_http_infer_free(&d);
    }
}

/* ---- binary framing -------------------------------------------------------- */

/* A request whose f32 and scale inputs are binary and the rest JSON. */
static char *binary_request(size_t *out_len, size_t *out_header_len, const char *f32_size)
{
    char *json = request_json(
        "f32", "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[1,2],\"parameters\":"
               "{\"binary_data_size\":8}}");
    char *scale_json = strstr(json, "{\"name\":\"scale\"");
    strcpy(scale_json, "{\"name\":\"scale\",\"datatype\":\"FP32\",\"shape\":[3],\"parameters\":"
                       "{\"binary_data_size\":12}}]}");
    if (f32_size != NULL) {
        char *size = strstr(json, "\"binary_data_size\":8");
        memmove(size + 19 + strlen(f32_size), size + 20, strlen(size + 20) + 1);
        memcpy(size + 19, f32_size, strlen(f32_size));
    }
    size_t header_len = strlen(json);
    float blob[5] = {0.5f, -1.0f, 10.0f, 20.0f, 30.0f};
    char *body = malloc(header_len + sizeof blob);
    assert_non_null(body);
    memcpy(body, json, header_len);
    memcpy(body + header_len, blob, sizeof blob);
    free(json);
    *out_len = header_len + sizeof blob;
    *out_header_len = header_len;
    return body;
}

static void test_binary_framing(void **state)
{
    (void)state;
    size_t len, header_len;
    char *body = binary_request(&len, &header_len, NULL);
    char length[32];
    snprintf(length, sizeof length, "%zu", header_len);
    pjs_http_infer d;
    pjs_error err;
    assert_int_equal(decode_and_validate(&d, body, len, length, &err), 0);
    const pjs_infer_input *f32 = input_named(&d, "f32");
    const pjs_infer_input *scale = input_named(&d, "scale");
    assert_ptr_equal(f32->data, body + header_len); /* binary data is not copied */
    assert_int_equal(f32->nbytes, 8);
    assert_ptr_equal(scale->data, body + header_len + 8);
    assert_memory_equal(scale->data, ((float[]){10, 20, 30}), 12);
    pjs_http_infer_free(&d);
    free(body);
}

static void expect_framing_error(const char *f32_size, const char *length, size_t trim,
                                 const char *piece)
{
    size_t len, header_len;
    char *body = binary_request(&len, &header_len, f32_size);
    char computed[32];
    snprintf(computed, sizeof computed, "%zu", header_len);
    pjs_http_infer d;
    pjs_error err;
    int rc = pjs_http_infer_decode(&d, body, len - trim, length ? length : computed, &err);
    if (rc == 0 || strstr(err.msg, piece) == NULL)
        fail_msg("expected \"%s\", got \"%s\"", piece, rc ? err.msg : "success");
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    pjs_http_infer_free(&d);
    free(body);
}

static void test_binary_framing_errors(void **state)
{
    (void)state;
    expect_framing_error(NULL, "999999", 0, "is larger than the");
    expect_framing_error(NULL, "12x", 0, "must be a decimal byte count");
    expect_framing_error(NULL, "", 0, "must be a decimal byte count");
    expect_framing_error(NULL, "-5", 0, "must be a decimal byte count");
    expect_framing_error(NULL, "99999999999999999999999", 0, "out of range");
    expect_framing_error(NULL, NULL, 3, "runs past the end of the binary data");
    expect_framing_error("4", NULL, 0, "is 20 bytes but the inputs' binary_data_size add up to 16");
    expect_framing_error("-8", NULL, 0, "\"binary_data_size\" must be a non-negative integer");
    expect_framing_error(NULL, "10", 0, "malformed JSON request");

    /* binary_data_size without the header */
    size_t len, header_len;
    char *body = binary_request(&len, &header_len, NULL);
    pjs_http_infer d;
    pjs_error err;
    assert_int_equal(pjs_http_infer_decode(&d, body, header_len, NULL, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "needs the Inference-Header-Content-Length header"));
    pjs_http_infer_free(&d);
    free(body);
}

/* The byte size check is validation's: a binary size that disagrees with
 * the shape is refused there, with the same words gRPC uses. */
static void test_binary_size_disagrees_with_shape(void **state)
{
    (void)state;
    size_t len, header_len;
    char *body = binary_request(&len, &header_len, "4");
    pjs_http_infer d;
    pjs_error err;
    char length[32];
    snprintf(length, sizeof length, "%zu", header_len);
    assert_int_equal(pjs_http_infer_decode(&d, body, len - 4, length, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, &manifest, 4, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "got 4 bytes of data but shape [1, 2] of FP32 needs 8"));
    pjs_http_infer_free(&d);
    free(body);
}

/* ---- content encoding ---------------------------------------------------- */

static void test_inflate(void **state)
{
    (void)state;
    const char *text = "{\"inputs\":[]} and some more text to compress";
    unsigned char packed[256];
    uLongf packed_len = sizeof packed;
    assert_int_equal(compress(packed, &packed_len, (const Bytef *)text, strlen(text)), Z_OK);
    pjs_http_buf out;
    pjs_error err;
    bool used;
    uint64_t charged;
    pjs_http_buf_init(&out, 1024);
    assert_int_equal(
        pjs_http_inflate("deflate", packed, packed_len, &out, NULL, &charged, &used, &err), 0);
    assert_true(used);
    assert_int_equal(charged, 0); /* no budget, nothing charged */
    assert_int_equal(out.len, strlen(text));
    assert_memory_equal(out.data, text, out.len);
    pjs_http_buf_free(&out);

    pjs_http_buf_init(&out, 10); /* a body that inflates past the limit: stops there */
    assert_int_equal(
        pjs_http_inflate("deflate", packed, packed_len, &out, NULL, &charged, &used, &err),
        PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "inflates to more than the limit of 10 bytes"));
    assert_int_equal(out.len, 10);
    pjs_http_buf_free(&out);

    pjs_http_buf_init(&out, 1024);
    assert_int_equal(
        pjs_http_inflate("gzip", packed, packed_len, &out, NULL, &charged, &used, &err),
        PJS_ERR_INVALID_ARGUMENT); /* zlib framing is not gzip */
    assert_int_equal(pjs_http_inflate("br", text, 3, &out, NULL, &charged, &used, &err),
                     PJS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "Content-Encoding \"br\" is not supported"));
    assert_int_equal(pjs_http_inflate("identity", text, 3, &out, NULL, &charged, &used, &err), 0);
    assert_false(used);
    assert_int_equal(pjs_http_inflate(NULL, text, 3, &out, NULL, &charged, &used, &err), 0);
    assert_false(used);
    pjs_http_buf_free(&out);
}

/* A bomb against a byte budget: the memory the output takes is charged as
 * it grows, inflating stops when the budget refuses, and what was charged
 * is reported so the caller can give it back. */
static void test_inflate_budget(void **state)
{
    (void)state;
    size_t plain_len = 4u << 20;
    unsigned char *zeros = calloc(1, plain_len);
    uLongf packed_len = compressBound(plain_len);
    unsigned char *packed = malloc(packed_len);
    assert_non_null(zeros);
    assert_non_null(packed);
    assert_int_equal(compress(packed, &packed_len, zeros, plain_len), Z_OK);
    pjs_byte_budget budget;
    pjs_byte_budget_init(&budget, 1u << 20);
    pjs_http_buf out;
    pjs_error err;
    bool used;
    uint64_t charged;
    pjs_http_buf_init(&out, 64u << 20);
    assert_int_equal(
        pjs_http_inflate("deflate", packed, packed_len, &out, &budget, &charged, &used, &err),
        PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "--max-inflight-request-bytes"));
    assert_true(out.len < out.limit); /* the budget, not the limit, stopped it */
    assert_true(charged > 0 && charged <= (1u << 20));
    assert_int_equal(pjs_byte_budget_used(&budget), charged);
    pjs_byte_budget_give(&budget, charged);
    pjs_http_buf_free(&out);

    pjs_byte_budget_init(&budget, 64u << 20); /* room enough: all of it, all charged */
    pjs_http_buf_init(&out, 64u << 20);
    assert_int_equal(
        pjs_http_inflate("deflate", packed, packed_len, &out, &budget, &charged, &used, &err), 0);
    assert_int_equal(out.len, plain_len);
    assert_int_equal(charged, out.cap);
    pjs_http_buf_free(&out);
    free(packed);
    free(zeros);
}

/* The bound on a valid request's body: every input at the largest batch,
 * each element as its longest JSON text with slack. */
static void test_infer_body_bound(void **state)
{
    (void)state;
    static const char yaml[] = "format_version: \"2.0\"\n"
                               "name: mlp\n"
                               "batch_sizes: [1, 4, 8]\n"
                               "inputs:\n"
                               "  - {name: x, dtype: f32, shape: [batch, 16]}\n"
                               "  - {name: k, dtype: bool, shape: [3]}\n"
                               "outputs:\n"
                               "  - {name: y, dtype: f32, shape: [batch, 4]}\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(pjs_manifest_parse(&m, yaml, sizeof yaml - 1, "mlp", &err), 0);
    uint64_t at8 = pjs_http_infer_body_bound(&m, 8);
    uint64_t at1 = pjs_http_infer_body_bound(&m, 1);
    assert_true(at8 > at1);
    /* x: 128 elements, k: 3, each under 64 bytes; tens of KiB of slack. */
    assert_true(at8 > 128 * 32 && at8 < 128 * 64 + 3 * 64 + (256u << 10));
    /* A request tritonclient writes for batch 8 fits well within it. */
    char body[16384];
    size_t n = (size_t)snprintf(body, sizeof body,
                                "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\","
                                "\"shape\":[8,16],\"data\":[");
    for (int i = 0; i < 128; i++)
        n += (size_t)snprintf(body + n, sizeof body - n, "%s-1.2345678901234567e-308",
                              i ? ", " : "");
    n += (size_t)snprintf(body + n, sizeof body - n,
                          "]},{\"name\":\"k\",\"datatype\":\"BOOL\",\"shape\":[3],"
                          "\"data\":[false, false, false]}]}");
    assert_true(n < at8);
    pjs_manifest_free(&m);
}

/* ---- shared memory ----------------------------------------------------------- */

static void test_shared_memory_tensors(void **state)
{
    (void)state;
    char key[64];
    snprintf(key, sizeof key, "/pjs_test_http_%d", (int)getpid());
    int fd = shm_open(key, O_CREAT | O_RDWR | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 64), 0);
    float in[3] = {7, 8, 9};
    assert_int_equal(pwrite(fd, in, sizeof in, 16), (ssize_t)sizeof in);
    pjs_shm_registry *reg;
    pjs_error err;
    pjs_shm_options on = {.allowed = true};
    assert_int_equal(pjs_shm_registry_create(&on, &reg, &err), 0);
    assert_int_equal(pjs_shm_register(reg, "region", key, 0, 64, &err), 0);

    char *body = request_json(
        "scale", "{\"name\":\"scale\",\"datatype\":\"FP32\",\"shape\":[3],\"parameters\":"
                 "{\"shared_memory_region\":\"region\",\"shared_memory_offset\":16,"
                 "\"shared_memory_byte_size\":12}}");
    char *end = strrchr(body, ']');
    strcpy(end, "],\"outputs\":[{\"name\":\"half\",\"parameters\":{\"shared_memory_region\":"
                "\"region\",\"shared_memory_offset\":40,\"shared_memory_byte_size\":4}}]}");
    pjs_http_infer d;
    assert_int_equal(pjs_http_infer_decode(&d, body, strlen(body), NULL, &err), 0);
    assert_int_equal(pjs_http_infer_map_shm(&d, reg, &err), 0);
    assert_int_equal(pjs_infer_validate(&d.req, &manifest, 4, &err), 0);
    assert_memory_equal(input_named(&d, "scale")->data, in, sizeof in);

    /* The output goes into the region, and the response carries no bytes. */
    uint16_t half[2] = {0x3c00, 0xc000};
    d.req.n_outputs = 3;
    for (size_t o = 0; o < 3; o++) {
        d.req.outputs[o].spec = &manifest.outputs[o];
        d.req.outputs[o].shape = manifest.outputs[o].shape;
        d.req.outputs[o].requested = -1;
    }
    d.req.outputs[2].data = half;
    d.req.outputs[2].nbytes = sizeof half;
    d.req.outputs[2].requested = 0;
    assert_int_equal(pjs_http_infer_write_shm_outputs(&d, &err), 0);
    uint16_t back[2];
    assert_int_equal(pread(fd, back, sizeof back, 40), (ssize_t)sizeof back);
    assert_memory_equal(back, half, sizeof half);
    pjs_http_buf out;
    size_t header_len;
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&d.req, "dtypes", "1", &out, &header_len, &err), 0);
    assert_int_equal(header_len, 0);
    /* An output in shared memory carries neither data nor parameters. */
    assert_null(strstr(out.data, "\"parameters\""));
    assert_null(strstr(out.data, "\"data\""));
    pjs_http_buf_free(&out);
    d.req.outputs[2].data = NULL; /* not ours to free */

    /* Unregistering while the request holds its views is safe. */
    assert_int_equal(pjs_shm_unregister(reg, "region", &err), 0);
    assert_memory_equal(input_named(&d, "scale")->data, in, sizeof in);
    pjs_http_infer_free(&d);

    /* Now the region is unknown: the request's mistake, 400 not 404. */
    assert_int_equal(pjs_http_infer_decode(&d, body, strlen(body), NULL, &err), 0);
    assert_int_equal(pjs_http_infer_map_shm(&d, reg, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "input \"scale\": shared memory region \"region\" is not"));
    pjs_http_infer_free(&d);

    free(body);
    pjs_shm_registry_destroy(reg);
    close(fd);
    shm_unlink(key);
}

/* ---- responses ----------------------------------------------------------- */

/* A completed request with outputs y (FP32 [2,2]), flags (BOOL [2]) and
 * half (FP16 [2]). */
typedef struct completed {
    pjs_infer_request r;
    float y[4];
    uint8_t flags[2];
    uint16_t half[2];
} completed;

static void make_completed(completed *c)
{
    memset(c, 0, sizeof *c);
    float y[4] = {0.5f, -1.25f, NAN, INFINITY};
    memcpy(c->y, y, sizeof y);
    c->flags[0] = 1;
    c->half[0] = 0x3e00; /* 1.5 */
    c->half[1] = 0xfc00; /* -inf */
    c->r.batch = 2;
    c->r.n_outputs = 3;
    void *data[3] = {c->y, c->flags, c->half};
    size_t sizes[3] = {sizeof c->y, sizeof c->flags, sizeof c->half};
    for (size_t o = 0; o < 3; o++) {
        pjs_infer_output *out = &c->r.outputs[o];
        out->spec = &manifest.outputs[o];
        out->shape = manifest.outputs[o].shape;
        if (out->spec->batched)
            out->shape.dims[0] = 2;
        out->data = data[o];
        out->nbytes = sizes[o];
        out->requested = -1;
    }
}

static void test_encode_json(void **state)
{
    (void)state;
    completed c;
    make_completed(&c);
    c.r.id = "q\"1";
    pjs_http_buf out;
    pjs_error err;
    size_t header_len;
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&c.r, "dtypes", "1", &out, &header_len, &err), 0);
    assert_int_equal(header_len, 0);
    assert_string_equal(
        out.data,
        "{\"model_name\":\"dtypes\",\"model_version\":\"1\",\"id\":\"q\\\"1\",\"outputs\":["
        "{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[2,2],"
        "\"data\":[0.5,-1.25,NaN,Infinity]},"
        "{\"name\":\"flags\",\"datatype\":\"BOOL\",\"shape\":[2],\"data\":[true,false]},"
        "{\"name\":\"half\",\"datatype\":\"FP16\",\"shape\":[2],\"data\":[1.5,-Infinity]}]}");
    pjs_http_buf_free(&out);
}

static void test_encode_binary_in_request_order(void **state)
{
    (void)state;
    completed c;
    make_completed(&c);
    /* Ask for half (binary), then y (JSON), leaving flags out. */
    c.r.n_requested = 2;
    c.r.requested[0] = (pjs_infer_requested_output){.name = "half", .binary_data = true};
    c.r.requested[1] = (pjs_infer_requested_output){.name = "y", .binary_data = false};
    c.r.outputs[1].data = NULL; /* not wanted: the dispatcher leaves it empty */
    c.r.outputs[1].nbytes = 0;
    c.r.outputs[2].requested = 0;
    c.r.outputs[0].requested = 1;
    pjs_http_buf out;
    pjs_error err;
    size_t header_len;
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&c.r, "dtypes", "1", &out, &header_len, &err), 0);
    const char *header =
        "{\"model_name\":\"dtypes\",\"model_version\":\"1\",\"outputs\":["
        "{\"name\":\"half\",\"datatype\":\"FP16\",\"shape\":[2],"
        "\"parameters\":{\"binary_data_size\":4}},"
        "{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[2,2],"
        "\"data\":[0.5,-1.25,NaN,Infinity]}]}";
    assert_int_equal(header_len, strlen(header));
    assert_memory_equal(out.data, header, header_len);
    assert_int_equal(out.len, header_len + 4);
    assert_memory_equal(out.data + header_len, c.half, 4);
    pjs_http_buf_free(&out);

    /* binary_data_output makes every output binary when none is named. */
    make_completed(&c);
    c.r.binary_data_output = true;
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&c.r, "dtypes", "1", &out, &header_len, &err), 0);
    assert_int_equal(out.len, header_len + 16 + 2 + 4);
    assert_memory_equal(out.data + header_len, c.y, 16);
    assert_memory_equal(out.data + header_len + 16, c.flags, 2);
    pjs_http_buf_free(&out);

    /* A response over the limit is refused, not truncated. */
    make_completed(&c);
    pjs_http_buf_init(&out, 32);
    assert_int_equal(pjs_http_infer_encode(&c.r, "dtypes", "1", &out, &header_len, &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    pjs_http_buf_free(&out);
}

/* Classification: y (FP32 [2, 2]) as JSON strings, best first with
 * infinity above and NaN below every number; half (FP16 [2], no batch axis)
 * as binary data: BYTES [1]. */
static void test_encode_classification(void **state)
{
    (void)state;
    completed c;
    make_completed(&c);
    pjs_http_infer d;
    pjs_error err;
    static const char body[] =
        "{\"inputs\":[],\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":2}},"
        "{\"name\":\"half\",\"parameters\":{\"classification\":1,\"binary_data\":true}}]}";
    assert_int_equal(pjs_http_infer_decode(&d, body, sizeof body - 1, NULL, &err), 0);
    assert_int_equal(d.req.requested[0].class_count, 2);
    assert_int_equal(d.req.requested[1].class_count, 1);
    c.r.n_requested = 2;
    memcpy(c.r.requested, d.req.requested, 2 * sizeof c.r.requested[0]);
    c.r.outputs[0].requested = 0;
    c.r.outputs[2].requested = 1;
    c.r.outputs[1].data = NULL;
    c.r.outputs[1].nbytes = 0;
    /* Classified outputs are replaced, so they must be the request's own. */
    c.r.outputs[0].data = malloc(sizeof c.y);
    c.r.outputs[2].data = malloc(sizeof c.half);
    assert_non_null(c.r.outputs[0].data);
    assert_non_null(c.r.outputs[2].data);
    memcpy(c.r.outputs[0].data, c.y, sizeof c.y);
    memcpy(c.r.outputs[2].data, c.half, sizeof c.half);
    pjs_http_buf out;
    size_t header_len;
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&c.r, "dtypes", "1", &out, &header_len, &err), 0);
    const char *header =
        "{\"model_name\":\"dtypes\",\"model_version\":\"1\",\"outputs\":["
        "{\"name\":\"y\",\"datatype\":\"BYTES\",\"shape\":[2,2],"
        "\"data\":[\"0.500000:0\",\"-1.250000:1\",\"inf:1\",\"nan:0\"]},"
        "{\"name\":\"half\",\"datatype\":\"BYTES\",\"shape\":[1],"
        "\"parameters\":{\"binary_data_size\":14}}]}";
    assert_int_equal(header_len, strlen(header));
    assert_memory_equal(out.data, header, header_len);
    assert_int_equal(out.len, header_len + 14);
    assert_memory_equal(out.data + header_len, "\x0a\0\0\0" "1.500000:0", 14);
    pjs_http_buf_free(&out);
    pjs_infer_request_release(&c.r);
    pjs_http_infer_free(&d);
}

static void test_round_trip_every_dtype(void **state)
{
    (void)state;
    /* Encoding each decoded input as an output gives the JSON numbers back. */
    char *body = request_json(NULL, NULL);
    pjs_http_infer d;
    pjs_error err;
    assert_int_equal(decode_and_validate(&d, body, strlen(body), NULL, &err), 0);
    static const char *expected[] = {
        "[true,false]", "[0,255]", "[1,65535]", "[2,4294967295]", "[3,9223372036854775807]",
        "[-128,127]", "[-32768,5]", "[-2147483648,6]", "[-9223372036854775808,7]",
        "[1.5,-65504]", "[1,-2.5]", "[0.25,8]", "[0.10000000000000001,3]", "[1,2,3]",
    };
    for (size_t i = 0; i < d.req.n_inputs; i++) {
        const pjs_infer_input *in = &d.req.inputs[i]; /* manifest order after validation */
        pjs_http_buf out;
        pjs_http_buf_init(&out, 4096);
        size_t size = pjs_dtype_size(in->spec->dtype);
        assert_int_equal(
            pjs_tensor_json_encode(&out, in->spec->dtype, in->data, in->nbytes / size, &err), 0);
        assert_string_equal(out.data, expected[i]);
        pjs_http_buf_free(&out);
    }
    pjs_http_infer_free(&d);
    free(body);
}

static void test_error_json_is_always_valid(void **state)
{
    (void)state;
    pjs_http_buf out;
    pjs_error err;
    pjs_http_buf_init(&out, 1024);
    assert_int_equal(pjs_http_error_json("model \"m\xff\": bad\n\x01 caf\xc3\xa9", &out, &err), 0);
    assert_string_equal(out.data,
                        "{\"error\":\"model \\\"m\\ufffd\\\": bad\\n\\u0001 caf\xc3\xa9\"}");
    json_error_t jerr;
    json_t *doc = json_loads(out.data, 0, &jerr);
    assert_non_null(doc);
    json_decref(doc);
    pjs_http_buf_free(&out);
}

/* ---- documents ------------------------------------------------------------- */

static void test_model_metadata_and_config(void **state)
{
    (void)state;
    json_t *meta = pjs_model_metadata_json("dtypes", "pjrt_cpu", &manifest);
    char *text = json_dumps(meta, JSON_COMPACT);
    assert_non_null(strstr(text, "\"name\":\"dtypes\",\"versions\":[\"1\"],\"platform\":"
                                 "\"pjrt_cpu\""));
    assert_non_null(strstr(text, "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[-1,2]}"));
    assert_non_null(strstr(text, "{\"name\":\"scale\",\"datatype\":\"FP32\",\"shape\":[3]}"));
    assert_non_null(strstr(text, "\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\","));
    free(text);
    json_decref(meta);

    json_t *config = pjs_model_config_json("dtypes", "pjrt_cpu", &manifest, 4, false);
    assert_string_equal(json_string_value(json_object_get(config, "backend")), "pjserve");
    assert_int_equal(json_integer_value(json_object_get(config, "max_batch_size")), 4);
    json_t *first = json_array_get(json_object_get(config, "input"), 0);
    assert_string_equal(json_string_value(json_object_get(first, "data_type")), "TYPE_BOOL");
    text = json_dumps(json_object_get(first, "dims"), JSON_COMPACT);
    assert_string_equal(text, "[2]"); /* no batch axis when max_batch_size > 0 */
    free(text);
    json_t *bf16 = json_array_get(json_object_get(config, "input"), 10);
    assert_string_equal(json_string_value(json_object_get(bf16, "data_type")), "TYPE_BF16");
    json_t *half = json_array_get(json_object_get(config, "output"), 2);
    assert_string_equal(json_string_value(json_object_get(half, "data_type")), "TYPE_FP16");
    assert_null(json_object_get(config, "dynamic_batching"));
    json_decref(config);

    config = pjs_model_config_json("dtypes", "pjrt_cpu", &manifest, 0, false);
    first = json_array_get(json_object_get(config, "input"), 0);
    text = json_dumps(json_object_get(first, "dims"), JSON_COMPACT);
    assert_string_equal(text, "[-1,2]"); /* unbatched config: dims as the manifest says */
    free(text);
    json_decref(config);

    /* Every tensor batched: requests are coalesced, the compiled sizes preferred. */
    static const char batched_yaml[] = "format_version: \"2.0\"\n"
                                       "name: mlp\n"
                                       "batch_sizes: [1, 4, 8]\n"
                                       "inputs:\n"
                                       "  - {name: x, dtype: f32, shape: [batch, 16]}\n"
                                       "outputs:\n"
                                       "  - {name: y, dtype: f32, shape: [batch, 4]}\n";
    pjs_manifest batched;
    pjs_error err;
    assert_int_equal(
        pjs_manifest_parse(&batched, batched_yaml, sizeof batched_yaml - 1, "mlp", &err), 0);
    config = pjs_model_config_json("mlp", "pjrt_cpu", &batched, 8, false);
    text = json_dumps(json_object_get(config, "dynamic_batching"), JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(text, "{\"max_queue_delay_microseconds\":0,"
                              "\"preferred_batch_size\":[1,4,8]}");
    free(text);
    json_decref(config);
    config = pjs_model_config_json("mlp", "pjrt_cpu", &batched, 0, false);
    assert_null(json_object_get(config, "dynamic_batching"));
    json_decref(config);
    pjs_manifest_free(&batched);
}

static void test_model_stats(void **state)
{
    (void)state;
    pjs_model_stats st;
    memset(&st, 0, sizeof st);
    st.last_inference_ms = 1700000000123u;
    st.inference_count = 12;
    st.execution_count = 5;
    st.success = (pjs_duration_stat){5, 5000};
    st.fail = (pjs_duration_stat){1, 100};
    st.queue = (pjs_duration_stat){5, 700};
    pjs_batch_stat batch[2] = {{.batch_size = 1, .compute_infer = {3, 30}},
                               {.batch_size = 4}}; /* never ran: left out */
    st.n_batch = 2;
    st.batch = batch;
    json_t *doc = pjs_model_stats_json("mlp", "1", &st);
    char *text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(strstr(text, "\"inference_count\":12"));
    assert_non_null(strstr(text, "\"execution_count\":5"));
    assert_non_null(strstr(text, "\"last_inference\":1700000000123"));
    assert_non_null(strstr(text, "\"batch_stats\":[{\"batch_size\":1,\"compute_infer\":"
                                 "{\"count\":3,\"ns\":30},"));
    const char *fields[] = {"success", "fail", "queue", "compute_input", "compute_infer",
                            "compute_output", "cache_hit", "cache_miss"};
    json_t *inference = json_object_get(doc, "inference_stats");
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        json_t *d = json_object_get(inference, fields[i]);
        assert_true(json_is_integer(json_object_get(d, "count")));
        assert_true(json_is_integer(json_object_get(d, "ns")));
    }
    assert_int_equal(json_integer_value(json_object_get(json_object_get(inference, "fail"), "ns")),
                     100);
    free(text);
    json_decref(doc);
}

static void test_metrics_render(void **state)
{
    (void)state;
    pjs_metrics_model models[2];
    memset(models, 0, sizeof models);
    models[0].name = "mlp";
    models[0].version = "1";
    models[0].stats.success = (pjs_duration_stat){3, 4500000};
    models[0].stats.fail = (pjs_duration_stat){2, 10};
    models[0].stats.inference_count = 7;
    models[0].stats.execution_count = 3;
    models[0].stats.queue = (pjs_duration_stat){3, 2999};
    models[0].stats.compute_infer = (pjs_duration_stat){3, 1000000};
    models[0].stats.device_ns = 2000000123;
    models[0].stats.expired = 6;
    models[0].stats.shed = 1;
    models[0].stats.rejected_queue_full = 8;
    models[0].sched = (pjs_model_sched_info){.weight = 2.5, .queue_depth = 11, .in_flight = 13,
                                             .recent_utilization = 0.25};
    models[0].residency = (pjs_model_residency_info){.residency = PJS_RESIDENCY_HOST,
                                                     .resident = true,
                                                     .weight_bytes = 4096,
                                                     .loads = 5,
                                                     .evictions = 4,
                                                     .load_ns = 1500000001};
    /* Not resident: its bytes are not counted as resident. */
    models[1].residency = (pjs_model_residency_info){.weight_bytes = 999, .loads = 1,
                                                     .evictions = 1};
    models[0].queue_wait_us[0] = 16;      /* 0.5 */
    models[0].queue_wait_us[1] = 1024;    /* 0.9 */
    models[0].queue_wait_us[2] = INFINITY; /* 0.99: the last bucket */
    /* Executions of 1, 3 and 8 rows (the coalesced rows, before padding). */
    pjs_batch_stat batch[3] = {{.batch_size = 1, .compute_infer = {2, 10}},
                               {.batch_size = 3, .compute_infer = {1, 10}},
                               {.batch_size = 8, .compute_infer = {4, 10}}};
    models[0].stats.n_batch = 3;
    models[0].stats.batch = batch;
    models[0].n_batch_sizes = 3;
    memcpy(models[0].batch_sizes, (int64_t[]){1, 4, 8}, 3 * sizeof(int64_t));
    models[1].name = "we\"ird\\na\nme";
    models[1].version = "1";
    pjs_metrics_gauges gauges = {.queue_depth = 4, .in_flight = 9, .plans_inline = 11,
                                 .plans_worker = 5, .discipline = "fair",
                                 .cache = {.budget_bytes = 1000000, .used_bytes = 4096,
                                           .pinned_bytes = 512}};
    pjs_http_buf out;
    pjs_error err;
    pjs_http_buf_init(&out, 1 << 20);
    assert_int_equal(pjs_metrics_render(models, 2, &gauges, &out, &err), 0);
    static const char *lines[] = {
        "# HELP nv_inference_request_success Number of successful inference requests, all "
        "batch sizes\n# TYPE nv_inference_request_success counter\n"
        "nv_inference_request_success{model=\"mlp\",version=\"1\"} 3\n",
        "nv_inference_request_failure{model=\"mlp\",version=\"1\"} 2\n",
        "nv_inference_count{model=\"mlp\",version=\"1\"} 7\n",
        "nv_inference_exec_count{model=\"mlp\",version=\"1\"} 3\n",
        "nv_inference_request_duration_us{model=\"mlp\",version=\"1\"} 4500\n",
        "nv_inference_queue_duration_us{model=\"mlp\",version=\"1\"} 2\n",
        "nv_inference_compute_input_duration_us{model=\"mlp\",version=\"1\"} 0\n",
        "nv_inference_compute_infer_duration_us{model=\"mlp\",version=\"1\"} 1000\n",
        "# TYPE nv_inference_compute_output_duration_us counter\n",
        "nv_inference_count{model=\"we\\\"ird\\\\na\\nme\",version=\"1\"} 0\n",
        "# TYPE pjserve_queue_depth gauge\npjserve_queue_depth 4\n",
        "# TYPE pjserve_requests_in_flight gauge\npjserve_requests_in_flight 9\n",
        "# TYPE pjserve_device_plans_total counter\n"
        "pjserve_device_plans_total{owner=\"request_thread\"} 11\n"
        "pjserve_device_plans_total{owner=\"worker\"} 5\n",
        "# TYPE pjserve_model_dispatches_total counter\n"
        "pjserve_model_dispatches_total{model=\"mlp\",version=\"1\"} 3\n",
        "# TYPE pjserve_model_device_seconds_total counter\n"
        "pjserve_model_device_seconds_total{model=\"mlp\",version=\"1\"} 2.000000123\n",
        "# TYPE pjserve_model_recent_utilization gauge\n"
        "pjserve_model_recent_utilization{model=\"mlp\",version=\"1\"} 0.25\n",
        "# TYPE pjserve_model_weight gauge\n"
        "pjserve_model_weight{model=\"mlp\",version=\"1\"} 2.5\n",
        "# TYPE pjserve_model_queue_depth gauge\n"
        "pjserve_model_queue_depth{model=\"mlp\",version=\"1\"} 11\n",
        "# TYPE pjserve_model_requests_in_flight gauge\n"
        "pjserve_model_requests_in_flight{model=\"mlp\",version=\"1\"} 13\n",
        "pjserve_model_requests_expired_total{model=\"mlp\",version=\"1\"} 6\n",
        "pjserve_model_requests_shed_total{model=\"mlp\",version=\"1\"} 1\n",
        "# TYPE pjserve_model_requests_rejected_total counter\n"
        "pjserve_model_requests_rejected_total{model=\"mlp\",version=\"1\",reason=\"queue_full\"}"
        " 8\n",
        /* the queue wait summary: quantiles in seconds, sum and count */
        "# TYPE pjserve_model_queue_wait_seconds summary\n"
        "pjserve_model_queue_wait_seconds{model=\"mlp\",version=\"1\",quantile=\"0.5\"} 1.6e-05\n"
        "pjserve_model_queue_wait_seconds{model=\"mlp\",version=\"1\",quantile=\"0.9\"} 0.001024\n"
        "pjserve_model_queue_wait_seconds{model=\"mlp\",version=\"1\",quantile=\"0.99\"} +Inf\n"
        "pjserve_model_queue_wait_seconds_sum{model=\"mlp\",version=\"1\"} 0.000002999\n"
        "pjserve_model_queue_wait_seconds_count{model=\"mlp\",version=\"1\"} 3\n",
        /* the rows histogram: cumulative executions per compiled batch size */
        "# TYPE pjserve_model_batch_rows histogram\n"
        "pjserve_model_batch_rows_bucket{model=\"mlp\",version=\"1\",le=\"1\"} 2\n"
        "pjserve_model_batch_rows_bucket{model=\"mlp\",version=\"1\",le=\"4\"} 3\n"
        "pjserve_model_batch_rows_bucket{model=\"mlp\",version=\"1\",le=\"8\"} 7\n"
        "pjserve_model_batch_rows_bucket{model=\"mlp\",version=\"1\",le=\"+Inf\"} 7\n"
        "pjserve_model_batch_rows_sum{model=\"mlp\",version=\"1\"} 37\n"
        "pjserve_model_batch_rows_count{model=\"mlp\",version=\"1\"} 7\n",
        /* a model with no batch sizes and no executions: only +Inf, zeros */
        "pjserve_model_batch_rows_bucket{model=\"we\\\"ird\\\\na\\nme\",version=\"1\","
        "le=\"+Inf\"} 0\n"
        "pjserve_model_batch_rows_sum{model=\"we\\\"ird\\\\na\\nme\",version=\"1\"} 0\n",
        "pjserve_model_queue_wait_seconds{model=\"we\\\"ird\\\\na\\nme\",version=\"1\","
        "quantile=\"0.5\"} 0\n",
        "# TYPE pjserve_scheduler_info gauge\npjserve_scheduler_info{discipline=\"fair\"} 1\n",
        /* the device weight cache, per model and for the server */
        "# TYPE pjserve_weight_loads_total counter\n"
        "pjserve_weight_loads_total{model=\"mlp\",version=\"1\"} 5\n",
        "# TYPE pjserve_weight_evictions_total counter\n"
        "pjserve_weight_evictions_total{model=\"mlp\",version=\"1\"} 4\n",
        "# TYPE pjserve_weight_resident_bytes gauge\n"
        "pjserve_weight_resident_bytes{model=\"mlp\",version=\"1\"} 4096\n"
        "pjserve_weight_resident_bytes{model=\"we\\\"ird\\\\na\\nme\",version=\"1\"} 0\n",
        "# TYPE pjserve_weight_load_seconds_total counter\n"
        "pjserve_weight_load_seconds_total{model=\"mlp\",version=\"1\"} 1.500000001\n",
        "pjserve_weight_evictions_total{model=\"we\\\"ird\\\\na\\nme\",version=\"1\"} 1\n",
        "# TYPE pjserve_weight_cache_budget_bytes gauge\n"
        "pjserve_weight_cache_budget_bytes 1000000\n",
        "# TYPE pjserve_weight_cache_used_bytes gauge\npjserve_weight_cache_used_bytes 4096\n",
        "# TYPE pjserve_weight_cache_pinned_bytes gauge\n"
        "pjserve_weight_cache_pinned_bytes 512\n",
    };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
        if (strstr(out.data, lines[i]) == NULL)
            fail_msg("missing:\n%s\nin:\n%s", lines[i], out.data);
    assert_int_equal(out.data[out.len - 1], '\n');
    pjs_http_buf_free(&out);

    /* No models: the families are still declared, the gauges still there;
     * an unlimited budget is +Inf. */
    gauges.cache.budget_bytes = UINT64_MAX;
    gauges.cache.host_budget_bytes = UINT64_MAX;
    pjs_http_buf_init(&out, 1 << 20);
    assert_int_equal(pjs_metrics_render(NULL, 0, &gauges, &out, &err), 0);
    assert_non_null(strstr(out.data, "# TYPE nv_inference_count counter\n# HELP"));
    assert_non_null(strstr(out.data, "# TYPE pjserve_model_batch_rows histogram\n# HELP"));
    assert_non_null(strstr(out.data, "pjserve_scheduler_info{discipline=\"fair\"} 1\n"));
    assert_non_null(strstr(out.data, "# TYPE pjserve_weight_loads_total counter\n# HELP"));
    assert_non_null(strstr(out.data, "\npjserve_weight_cache_budget_bytes +Inf\n"));
    assert_non_null(strstr(out.data, "\npjserve_host_weight_budget_bytes +Inf\n"));
    pjs_http_buf_free(&out);

    /* Every line is a comment or `name{labels} value`, every family declared once. */
    pjs_http_buf_init(&out, 1 << 20);
    assert_int_equal(pjs_metrics_render(models, 1, &gauges, &out, &err), 0);
    size_t types = 0;
    for (char *line = strtok(out.data, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, "# TYPE ", 7) == 0)
            types++;
        else if (line[0] != '#' && strchr(line, ' ') == NULL)
            fail_msg("a sample without a value: %s", line);
    }
    assert_int_equal(types, 9 + 17 + 3 + 9 + 7 + (gauges.server != NULL));
    pjs_http_buf_free(&out);
}

/* ---- model control ---------------------------------------------------------- */

static pjs_control_model control_model(const char *name, pjs_model_state state, bool loaded)
{
    pjs_control_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.entry.name, sizeof m.entry.name, "%s", name);
    m.entry.state = state;
    if (state != PJS_MODEL_READY)
        snprintf(m.entry.reason, sizeof m.entry.reason, "unloaded by a repository request");
    m.loaded = loaded;
    if (loaded) {
        m.residency = (pjs_model_residency_info){.residency = PJS_RESIDENCY_DEVICE,
                                                 .resident = true,
                                                 .weight_bytes = 4096,
                                                 .loads = 2,
                                                 .evictions = 1,
                                                 .load_ns = 2500000000u,
                                                 .in_host = true,
                                                 .host_bytes = 4096,
                                                 .host_loads = 3,
                                                 .host_evictions = 2};
        m.sched = (pjs_model_sched_info){.weight = 2.5, .max_queue_depth = 64,
                                         .default_timeout_us = 50000, .queue_depth = 3};
    }
    return m;
}

/* Past the limit, the models that matter keep series of their own: busy,
 * then on the device, then the most used; totals count every model. */
static void test_metrics_select(void **state)
{
    (void)state;
    pjs_metrics_model m[5];
    memset(m, 0, sizeof m);
    const char *names[5] = {"e", "d", "c", "b", "a"};
    for (int i = 0; i < 5; i++) {
        m[i].name = names[i];
        m[i].stats.success.count = 10;
        m[i].stats.fail.count = 1;
        m[i].stats.inference_count = 20;
        m[i].stats.success.ns = 1000;
    }
    m[3].sched.in_flight = 2;             /* b: busy */
    m[1].residency.resident = true;       /* d: on the device */
    m[4].stats.last_inference_ms = 99;    /* a: used most recently */
    m[0].sched.recent_utilization = 0.5;  /* e: used the device lately */
    pjs_metrics_totals t;
    assert_int_equal(pjs_metrics_select(m, 5, 3, &t), 3);
    assert_string_equal(m[0].name, "b"); /* the chosen, in name order */
    assert_string_equal(m[1].name, "d");
    assert_string_equal(m[2].name, "e");
    assert_int_equal(t.models, 5);
    assert_int_equal(t.shown, 3);
    assert_int_equal(t.success, 50);
    assert_int_equal(t.failure, 5);
    assert_int_equal(t.inferences, 100);
    assert_int_equal(t.request_ns, 5000);
    /* No limit, or under it: every model, as they were. */
    assert_int_equal(pjs_metrics_select(m, 5, 0, &t), 5);
    assert_int_equal(t.shown, 5);
    assert_int_equal(pjs_metrics_select(m, 2, 3, &t), 2);
    assert_int_equal(t.models, 2);
}

static void test_control_status_json(void **state)
{
    (void)state;
    pjs_control_model models[2] = {control_model("mlp", PJS_MODEL_READY, true),
                                   control_model("two_io", PJS_MODEL_UNAVAILABLE, false)};
    pjs_weight_cache_info cache = {.budget_bytes = UINT64_MAX, .used_bytes = 7,
                                   .pinned_bytes = 4096, .host_budget_bytes = UINT64_MAX};
    json_t *doc = pjs_control_status_json(PJS_CONTROL_EXPLICIT, &cache, models, 2);
    char *text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(
        text, "{\"cache\":{\"budget_bytes\":0,\"host_budget_bytes\":0,\"host_pinned_bytes\":0,"
              "\"host_unlimited\":true,\"host_used_bytes\":0,\"pinned_bytes\":4096,"
              "\"unlimited\":true,\"used_bytes\":7},\"control_mode\":\"explicit\",\"models\":[{"
              "\"default_timeout_us\":50000,\"evictions\":1,\"host_evictions\":2,"
              "\"host_loads\":3,\"in_host\":true,\"load_seconds\":2.5,\"loads\":2,"
              "\"max_queue_depth\":64,\"name\":\"mlp\",\"queue_depth\":3,\"reason\":\"\","
              "\"residency\":\"device\",\"resident\":true,\"state\":\"READY\",\"weight\":2.5,"
              "\"weight_bytes\":4096},{\"name\":\"two_io\",\"reason\":\"unloaded by a "
              "repository request\",\"state\":\"UNAVAILABLE\"}]}");
    free(text);
    json_decref(doc);

    cache.budget_bytes = 1 << 20;
    cache.host_budget_bytes = 3 << 20;
    cache.host_used_bytes = 5;
    doc = pjs_control_status_json(PJS_CONTROL_DYNAMIC, &cache, NULL, 0);
    text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(strstr(text, "\"budget_bytes\":1048576,"));
    assert_non_null(strstr(text, "\"unlimited\":false"));
    assert_non_null(strstr(text, "\"host_budget_bytes\":3145728,"));
    assert_non_null(strstr(text, "\"host_unlimited\":false,\"host_used_bytes\":5,"));
    assert_non_null(strstr(text, "\"control_mode\":\"dynamic\",\"models\":[]"));
    free(text);
    json_decref(doc);
}

/* fn(args..., &err) fails INVALID_ARGUMENT with `words` in its message. */
#define EXPECT_REFUSED(words, fn, ...)                                                             \
    do {                                                                                           \
        pjs_error e_;                                                                              \
        pjs_error_clear(&e_);                                                                      \
        assert_int_equal(fn(__VA_ARGS__, &e_), PJS_ERR_INVALID_ARGUMENT);                          \
        if (strstr(e_.msg, (words)) == NULL)                                                       \
            fail_msg("expected \"%s\" in: %s", (words), e_.msg);                                   \
    } while (0)

static int parse_residency(const char *body, pjs_residency *r, pjs_error *err)
{
    return pjs_control_parse_residency(body, strlen(body), r, err);
}

static void test_control_parse_residency(void **state)
{
    (void)state;
    pjs_residency r;
    pjs_error err;
    assert_int_equal(parse_residency("{\"residency\":\"device\"}", &r, &err), 0);
    assert_int_equal(r, PJS_RESIDENCY_DEVICE);
    assert_int_equal(parse_residency(" {\"residency\" : \"host\"} ", &r, &err), 0);
    assert_int_equal(r, PJS_RESIDENCY_HOST);
    assert_int_equal(parse_residency("{\"residency\":\"unpinned\"}", &r, &err), 0);
    assert_int_equal(r, PJS_RESIDENCY_UNPINNED);
    EXPECT_REFUSED("unknown residency \"gpu\" (expected \"device\", \"host\" or \"unpinned\")",
                   parse_residency, "{\"residency\":\"gpu\"}", &r);
    EXPECT_REFUSED("unknown residency", parse_residency, "{\"residency\":\"Device\"}", &r);
    EXPECT_REFUSED("must be a string", parse_residency, "{\"residency\":1}", &r);
    EXPECT_REFUSED("must be a string", parse_residency, "{\"residency\":null}", &r);
    EXPECT_REFUSED("no \"residency\" given", parse_residency, "{}", &r);
    EXPECT_REFUSED("needs a JSON body", parse_residency, "", &r);
    EXPECT_REFUSED("must be an object", parse_residency, "[\"device\"]", &r);
    EXPECT_REFUSED("unknown field \"x\"", parse_residency, "{\"residency\":\"host\",\"x\":1}", &r);
    EXPECT_REFUSED("duplicate", parse_residency,
                   "{\"residency\":\"host\",\"residency\":\"device\"}", &r);
    EXPECT_REFUSED("malformed JSON body", parse_residency, "{\"residency\":", &r);
}

static int parse_policy(const char *body, pjs_control_policy_change *c, pjs_error *err)
{
    return pjs_control_parse_policy(body, strlen(body), c, err);
}

static void test_control_parse_policy(void **state)
{
    (void)state;
    pjs_control_policy_change c;
    pjs_error err;
    assert_int_equal(parse_policy("{\"weight\":2,\"max_queue_depth\":64,"
                                  "\"default_timeout_us\":0}",
                                  &c, &err),
                     0);
    assert_true(c.has_weight && c.has_max_queue_depth && c.has_default_timeout_us);
    assert_true(c.weight == 2.0);
    assert_int_equal(c.max_queue_depth, 64);
    assert_int_equal(c.default_timeout_us, 0);
    assert_int_equal(parse_policy("{\"weight\":0.25}", &c, &err), 0);
    assert_true(c.has_weight && !c.has_max_queue_depth && !c.has_default_timeout_us);
    assert_true(c.weight == 0.25);
    /* Values are read as given; ranges are pjs_control_policy's to check. */
    assert_int_equal(parse_policy("{\"max_queue_depth\":-3,\"weight\":-1}", &c, &err), 0);
    assert_int_equal(c.max_queue_depth, -3);
    assert_int_equal(parse_policy("{}", &c, &err), 0);
    assert_false(c.has_weight || c.has_max_queue_depth || c.has_default_timeout_us);

    EXPECT_REFUSED("\"weight\" must be a number", parse_policy, "{\"weight\":\"2\"}", &c);
    EXPECT_REFUSED("\"weight\" must be a number", parse_policy, "{\"weight\":true}", &c);
    EXPECT_REFUSED("\"max_queue_depth\" must be an integer", parse_policy,
                   "{\"max_queue_depth\":2.0}", &c);
    EXPECT_REFUSED("\"default_timeout_us\" must be an integer", parse_policy,
                   "{\"default_timeout_us\":\"5\"}", &c);
    EXPECT_REFUSED("unknown field \"weigth\"", parse_policy, "{\"weigth\":2}", &c);
    EXPECT_REFUSED("duplicate", parse_policy, "{\"weight\":1,\"weight\":2}", &c);
    EXPECT_REFUSED("needs a JSON body", parse_policy, "", &c);
    EXPECT_REFUSED("malformed JSON body", parse_policy, "2", &c);
}

static int parse_compact(const char *body, char ***names, size_t *n, pjs_error *err)
{
    return pjs_control_parse_compact(body, strlen(body), names, n, err);
}

static void test_control_parse_compact(void **state)
{
    (void)state;
    char **names;
    size_t n;
    pjs_error err;
    assert_int_equal(parse_compact("{\"reload\":[\"a\",\"bb\"]}", &names, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "a");
    assert_string_equal(names[1], "bb");
    assert_null(names[2]);
    free(names);
    static const char *const empty[] = {"", "{}", "{\"reload\":[]}"};
    for (size_t i = 0; i < sizeof empty / sizeof *empty; i++) {
        assert_int_equal(parse_compact(empty[i], &names, &n, &err), 0);
        assert_int_equal(n, 0);
        assert_null(names);
    }
    EXPECT_REFUSED("\"reload\" must be an array of model names", parse_compact,
                   "{\"reload\":\"a\"}", &names, &n);
    EXPECT_REFUSED("\"reload\"[1] must be a model name", parse_compact,
                   "{\"reload\":[\"a\",3]}", &names, &n);
    EXPECT_REFUSED("\"reload\"[0] must be a model name", parse_compact,
                   "{\"reload\":[\"\"]}", &names, &n);
    EXPECT_REFUSED("malformed JSON body", parse_compact, "{\"reload\":[\"a\\u0000b\"]}", &names,
                   &n);
    EXPECT_REFUSED("unknown field \"models\"", parse_compact, "{\"models\":[]}", &names, &n);
}

/* ---- strings (BYTES) ------------------------------------------------------------- */

/* A hooked model whose clients send rows of strings and get a label each. */
static const char texts_yaml[] = "format_version: \"2.0\"\n"
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

/* "", "a\0b", "très", "\"q\\\n" serialized. */
static const char four_serialized[] = "\0\0\0\0"
                                      "\3\0\0\0a\0b"
                                      "\5\0\0\0tr\xc3\xa8s"
                                      "\4\0\0\0\"q\\\n";
#define FOUR_LEN (sizeof four_serialized - 1)

static int decode_texts(pjs_manifest *m, pjs_http_infer *d, const char *body, size_t len,
                        const char *header_length, pjs_error *err)
{
    int rc = pjs_http_infer_decode(d, body, len, header_length, err);
    if (rc == 0)
        rc = pjs_infer_validate_client(&d->req, m, 4, err);
    if (getenv("PJS_TEST_VERBOSE") != NULL && rc != 0)
        print_message("%s\n", err->msg);
    return rc;
}

static void expect_texts_refused(pjs_manifest *m, const char *body, const char *piece)
{
    pjs_http_infer d;
    pjs_error err;
    int rc = decode_texts(m, &d, body, strlen(body), NULL, &err);
    if (rc == 0 || strstr(err.msg, piece) == NULL)
        fail_msg("expected an error with \"%s\", got %d \"%s\"", piece, rc, rc ? err.msg : "");
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    pjs_http_infer_free(&d);
}

static void test_bytes_json_input(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    pjs_http_infer d;
    assert_int_equal(pjs_manifest_parse(&m, texts_yaml, sizeof texts_yaml - 1, "texts", &err), 0);
    /* Nested as the shape, or flat: the same strings in row-major order. */
    static const char *const bodies[] = {
        "{\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"BYTES\",\"shape\":[2,2],"
        "\"data\":[[\"\",\"a\\u0000b\"],[\"tr\\u00e8s\",\"\\\"q\\\\\\n\"]]}]}",
        "{\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"BYTES\",\"shape\":[2,2],"
        "\"data\":[\"\",\"a\\u0000b\",\"tr\xc3\xa8s\",\"\\\"q\\\\\\n\"]}]}",
    };
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(decode_texts(&m, &d, bodies[i], strlen(bodies[i]), NULL, &err), 0);
        assert_int_equal(d.req.batch, 2);
        assert_int_equal(d.req.inputs[0].nbytes, FOUR_LEN);
        assert_memory_equal(d.req.inputs[0].data, four_serialized, FOUR_LEN);
        pjs_http_infer_free(&d);
    }
    /* No strings at all for a shape with no elements. */
    const char *none = "{\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"BYTES\",\"shape\":[1,0],"
                       "\"data\":[]}]}";
    assert_int_equal(decode_texts(&m, &d, none, strlen(none), NULL, &err), 0);
    assert_int_equal(d.req.inputs[0].nbytes, 0);
    pjs_http_infer_free(&d);

    expect_texts_refused(&m,
                         "{\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"BYTES\",\"shape\":[2,2],"
                         "\"data\":[\"a\",\"b\",\"c\"]}]}",
                         "input \"TEXT\": \"data\" holds 3 strings but the shape needs 4");
    expect_texts_refused(&m,
                         "{\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"BYTES\",\"shape\":[1,2],"
                         "\"data\":[\"a\",7]}]}",
                         "input \"TEXT\": \"data\" element 1 is not a string; BYTES elements are "
                         "JSON strings");
    expect_texts_refused(&m,
                         "{\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"BYTES\",\"shape\":[1,1],"
                         "\"data\":\"a\"}]}",
                         "input \"TEXT\": \"data\" must be a list of strings");
    expect_texts_refused(&m,
                         "{\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"FP32\",\"shape\":[1,1],"
                         "\"data\":[1]}]}",
                         "datatype FP32 does not match the model's BYTES");
    /* NUL characters are for string data only. */
    expect_texts_refused(&m,
                         "{\"inputs\":[{\"name\":\"TEXT\\u0000x\",\"datatype\":\"BYTES\","
                         "\"shape\":[1,1],\"data\":[\"a\"]}]}",
                         "\"name\" must not contain NUL characters");
    expect_texts_refused(&m,
                         "{\"id\":\"a\\u0000\",\"inputs\":[{\"name\":\"TEXT\",\"datatype\":"
                         "\"BYTES\",\"shape\":[1,1],\"data\":[\"a\"]}]}",
                         "\"id\" must be a string without NUL characters");
    pjs_manifest_free(&m);
}

static void test_bytes_binary_input(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    pjs_http_infer d;
    assert_int_equal(pjs_manifest_parse(&m, texts_yaml, sizeof texts_yaml - 1, "texts", &err), 0);
    char body[512];
    char length[32];
    for (size_t cut = 0; cut < 3; cut++) {
        size_t size = FOUR_LEN - (cut == 1 ? 1 : 0) - (cut == 2 ? 17 : 0);
        int n = snprintf(body, sizeof body,
                         "{\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"BYTES\",\"shape\":[2,2],"
                         "\"parameters\":{\"binary_data_size\":%zu}}]}",
                         size);
        snprintf(length, sizeof length, "%d", n);
        memcpy(body + n, four_serialized, size);
        int rc = decode_texts(&m, &d, body, (size_t)n + size, length, &err);
        if (cut == 0) {
            assert_int_equal(rc, 0);
            assert_ptr_equal(d.req.inputs[0].data, body + n); /* not copied */
            assert_int_equal(d.req.inputs[0].nbytes, FOUR_LEN);
        } else {
            assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(err.msg, cut == 1 ? "model texts: input \"TEXT\": malformed "
                                                       "BYTES data: element 3 at offset 20 has "
                                                       "length 4 but only 3 bytes are left"
                                                     : "the BYTES data holds 2 elements but "
                                                       "shape [2, 2] has 4"));
        }
        pjs_http_infer_free(&d);
    }
    pjs_manifest_free(&m);
}

/* A completed `texts` request: LABEL (two strings) and SCORE. */
static void texts_completed(pjs_infer_request *r, const pjs_manifest *m, void *labels,
                            size_t labels_len, float *scores)
{
    memset(r, 0, sizeof *r);
    r->batch = 2;
    r->n_outputs = 2;
    void *data[2] = {labels, scores};
    size_t sizes[2] = {labels_len, 2 * sizeof *scores};
    for (size_t o = 0; o < 2; o++) {
        pjs_infer_output *out = &r->outputs[o];
        out->spec = &m->client_outputs[o];
        out->shape.rank = 1;
        out->shape.dims[0] = 2;
        out->data = data[o];
        out->nbytes = sizes[o];
        out->requested = -1;
    }
}

static void test_bytes_encode(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(pjs_manifest_parse(&m, texts_yaml, sizeof texts_yaml - 1, "texts", &err), 0);
    /* "cat\t\"1\"" and bytes that are not UTF-8, with a control character. */
    char labels[] = "\x08\0\0\0cat\t\"1\"\\"
                    "\x04\0\0\0\xff\x01\xc3\xa8";
    size_t labels_len = sizeof labels - 1;
    float scores[2] = {0.5f, 0.25f};
    pjs_infer_request r;
    texts_completed(&r, &m, labels, labels_len, scores);
    pjs_http_buf out;
    size_t header_len;
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&r, "texts", "1", &out, &header_len, &err), 0);
    assert_int_equal(header_len, 0);
    const char *want = "{\"model_name\":\"texts\",\"model_version\":\"1\",\"outputs\":["
                       "{\"name\":\"LABEL\",\"datatype\":\"BYTES\",\"shape\":[2],"
                       "\"data\":[\"cat\\t\\\"1\\\"\\\\\",\"\xff\\u0001\xc3\xa8\"]},"
                       "{\"name\":\"SCORE\",\"datatype\":\"FP32\",\"shape\":[2],"
                       "\"data\":[0.5,0.25]}]}";
    assert_int_equal(out.len, strlen(want));
    assert_memory_equal(out.data, want, out.len);
    pjs_http_buf_free(&out);

    /* Valid UTF-8 strings read back as the same bytes through a JSON parser. */
    texts_completed(&r, &m, (char *)"\x02\0\0\0hi\x03\0\0\0a\0b", 13, scores);
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&r, "texts", "1", &out, &header_len, &err), 0);
    json_t *doc = json_loadb(out.data, out.len, JSON_ALLOW_NUL, NULL);
    assert_non_null(doc);
    json_t *data = json_object_get(json_array_get(json_object_get(doc, "outputs"), 0), "data");
    assert_string_equal(json_string_value(json_array_get(data, 0)), "hi");
    assert_int_equal(json_string_length(json_array_get(data, 1)), 3);
    assert_memory_equal(json_string_value(json_array_get(data, 1)), "a\0b", 3);
    json_decref(doc);
    pjs_http_buf_free(&out);

    /* Binary: the serialized form as it is. */
    texts_completed(&r, &m, labels, labels_len, scores);
    r.binary_data_output = true;
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&r, "texts", "1", &out, &header_len, &err), 0);
    assert_non_null(strstr(out.data, "{\"name\":\"LABEL\",\"datatype\":\"BYTES\",\"shape\":[2],"
                                     "\"parameters\":{\"binary_data_size\":20}}"));
    assert_int_equal(out.len, header_len + labels_len + 8);
    assert_memory_equal(out.data + header_len, labels, labels_len);
    pjs_http_buf_free(&out);

    /* A malformed output is the server's fault. */
    texts_completed(&r, &m, labels, labels_len - 1, scores);
    pjs_http_buf_init(&out, 4096);
    assert_int_equal(pjs_http_infer_encode(&r, "texts", "1", &out, &header_len, &err),
                     PJS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "output \"LABEL\": malformed BYTES data at offset 12 of 19"));
    pjs_http_buf_free(&out);
    pjs_manifest_free(&m);
}

/* Metadata and config describe the client tensors; no body bound holds
 * for strings. */
static void test_bytes_documents(void **state)
{
    (void)state;
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(pjs_manifest_parse(&m, texts_yaml, sizeof texts_yaml - 1, "texts", &err), 0);
    json_t *meta = pjs_model_metadata_json("texts", "pjrt_cpu", &m);
    char *text = json_dumps(meta, JSON_COMPACT);
    assert_non_null(strstr(text, "\"inputs\":[{\"name\":\"TEXT\",\"datatype\":\"BYTES\","
                                 "\"shape\":[-1,-1]}],\"outputs\":[{\"name\":\"LABEL\","
                                 "\"datatype\":\"BYTES\",\"shape\":[-1]},{\"name\":\"SCORE\","
                                 "\"datatype\":\"FP32\",\"shape\":[-1]}]"));
    free(text);
    json_decref(meta);
    json_t *config = pjs_model_config_json("texts", "pjrt_cpu", &m, 4, false);
    json_t *input = json_array_get(json_object_get(config, "input"), 0);
    assert_string_equal(json_string_value(json_object_get(input, "name")), "TEXT");
    assert_string_equal(json_string_value(json_object_get(input, "data_type")), "TYPE_STRING");
    text = json_dumps(json_object_get(input, "dims"), JSON_COMPACT);
    assert_string_equal(text, "[-1]");
    free(text);
    assert_int_equal(json_array_size(json_object_get(config, "output")), 2);
    json_t *label = json_array_get(json_object_get(config, "output"), 0);
    assert_string_equal(json_string_value(json_object_get(label, "data_type")), "TYPE_STRING");
    json_decref(config);
    assert_int_equal(pjs_http_infer_body_bound(&m, 4), 0);
    pjs_manifest_free(&m);
}

/* The CUDA shared-memory register body: the handle is padded base64 of
 * exactly 64 bytes. */
static void test_cuda_shm_register_body(void **state)
{
    (void)state;
    /* base64 of the bytes 0, 1, ..., 63 */
    static const char handle[] = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKiss"
                                 "LS4vMDEyMzQ1Njc4OTo7PD0+Pw==";
    char body[512];
    pjs_cuda_shm_register_body b;
    pjs_error err;
    snprintf(body, sizeof body, "{\"raw_handle\": {\"b64\": \"%s\"}, \"device_id\": 3, "
             "\"byte_size\": 4096}", handle);
    assert_int_equal(pjs_cuda_shm_parse_register(body, strlen(body), &b, &err), 0);
    for (int i = 0; i < PJS_CUDA_IPC_HANDLE_SIZE; i++)
        assert_int_equal(b.raw_handle[i], i);
    assert_int_equal(b.device_id, 3);
    assert_int_equal(b.byte_size, 4096);

    static const struct {
        const char *b64;
        const char *says;
    } bad[] = {
        {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+",
         "decodes to 63 bytes"},
        {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+"
         "Pz8/",
         "not padded base64"},
        {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+Pw",
         "not padded base64"},
        {"AA==AwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+Pw==",
         "not padded base64"},
        {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKiss LS4vMDEyMzQ1Njc4OTo7PD0+Pw=",
         "not padded base64"},
        {"", "decodes to 0 bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"raw_handle\": {\"b64\": \"%s\"}, \"device_id\": 0, "
                 "\"byte_size\": 64}", bad[i].b64);
        assert_int_equal(pjs_cuda_shm_parse_register(body, strlen(body), &b, &err),
                         PJS_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, bad[i].says));
    }
    static const char *bodies[] = {
        "[]",
        "{\"raw_handle\": \"AAAA\", \"device_id\": 0, \"byte_size\": 64}",
        "{\"raw_handle\": {\"b64\": 1}, \"device_id\": 0, \"byte_size\": 64}",
        "{\"raw_handle\": {\"b64\": \"\"}, \"device_id\": -1, \"byte_size\": 64}",
        "{\"raw_handle\": {\"b64\": \"\"}, \"device_id\": 0, \"byte_size\": \"64\"}",
        "{\"raw_handle\": {\"b64\": \"\"}, \"device_id\": 0, \"device_id\": 0, \"byte_size\": 1}",
        "{\"raw_handle\":",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        assert_int_equal(pjs_cuda_shm_parse_register(bodies[i], strlen(bodies[i]), &b, &err),
                         PJS_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_conversions),
        cmocka_unit_test(test_bf16_conversions),
        cmocka_unit_test(test_decode_every_dtype),
        cmocka_unit_test(test_decode_nested_batch),
        cmocka_unit_test(test_sequence_parameters),
        cmocka_unit_test(test_timeout_sets_deadline),
        cmocka_unit_test(test_refuse_values_a_dtype_cannot_hold),
        cmocka_unit_test(test_refuse_malformed_requests),
        cmocka_unit_test(test_binary_framing),
        cmocka_unit_test(test_binary_framing_errors),
        cmocka_unit_test(test_binary_size_disagrees_with_shape),
        cmocka_unit_test(test_inflate),
        cmocka_unit_test(test_inflate_budget),
        cmocka_unit_test(test_infer_body_bound),
        cmocka_unit_test(test_shared_memory_tensors),
        cmocka_unit_test(test_encode_json),
        cmocka_unit_test(test_encode_binary_in_request_order),
        cmocka_unit_test(test_encode_classification),
        cmocka_unit_test(test_round_trip_every_dtype),
        cmocka_unit_test(test_error_json_is_always_valid),
        cmocka_unit_test(test_model_metadata_and_config),
        cmocka_unit_test(test_model_stats),
        cmocka_unit_test(test_metrics_render),
        cmocka_unit_test(test_metrics_select),
        cmocka_unit_test(test_control_status_json),
        cmocka_unit_test(test_control_parse_residency),
        cmocka_unit_test(test_control_parse_policy),
        cmocka_unit_test(test_control_parse_compact),
        cmocka_unit_test(test_bytes_json_input),
        cmocka_unit_test(test_bytes_binary_input),
        cmocka_unit_test(test_bytes_encode),
        cmocka_unit_test(test_bytes_documents),
        cmocka_unit_test(test_cuda_shm_register_body),
    };
    return cmocka_run_group_tests(tests, setup_manifest, teardown_manifest);
}
