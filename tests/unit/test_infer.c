/*
 * test_infer.c - unit tests of request validation (src/core/infer.c).
 *
 * One manifest with two batched inputs of different types and two outputs,
 * an unbatched one, two with input-shape variants (one input; two inputs),
 * and a hooked one whose client tensors have strings (BYTES) and extents
 * that vary; each test builds a request as a front end would and checks the
 * verdict, the status and the words of the message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
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

static const char shapes_yaml[] =
    "format_version: \"2.0\"\n"
    "name: shapes\n"
    "batch_sizes: [1, 4]\n"
    "inputs:\n"
    "  - {name: image, dtype: f32, shape: [batch, 3, 32, 32]}\n"
    "outputs:\n"
    "  - {name: probs, dtype: f32, shape: [batch, 10]}\n"
    "variants:\n"
    "  - {name: wide, inputs: {image: [batch, 3, 32, 64]}}\n"
    "  - {name: tall, inputs: {image: [batch, 3, 64, 32]}}\n";

static const char pair_yaml[] =
    "format_version: \"2.0\"\n"
    "name: pair\n"
    "batch_sizes: [1, 4, 8]\n"
    "inputs:\n"
    "  - {name: a, dtype: f32, shape: [batch, 8]}\n"
    "  - {name: b, dtype: i32, shape: [batch, 3]}\n"
    "outputs:\n"
    "  - {name: sum, dtype: f32, shape: [batch, 8]}\n"
    "variants:\n"
    "  - {name: long, inputs: {a: [batch, 16]}, outputs: {sum: [batch, 16]}}\n";

/* A hooked model: clients send strings and a matrix of any height, and get
 * a label and a score per row; the executable takes tokens. */
static const char hooked_yaml[] =
    "format_version: \"2.0\"\n"
    "name: hooked\n"
    "batch_sizes: [1, 4]\n"
    "inputs:\n"
    "  - {name: tokens, dtype: i32, shape: [batch, 8]}\n"
    "outputs:\n"
    "  - {name: logits, dtype: f32, shape: [batch, 2]}\n"
    "client_inputs:\n"
    "  - {name: TEXT, dtype: bytes, shape: [batch, -1]}\n"
    "  - {name: LANG, dtype: bytes, shape: [1]}\n"
    "  - {name: SCALE, dtype: f32, shape: [-1, 2]}\n"
    "client_outputs:\n"
    "  - {name: LABEL, dtype: bytes, shape: [batch]}\n"
    "  - {name: SCORE, dtype: f32, shape: [batch]}\n";

static float a_data[8 * 16];
static int32_t b_data[8 * 3];
static float image_data[4 * 3 * 64 * 32];

typedef struct fixture {
    pjs_manifest two_io;
    pjs_manifest fixed;
    pjs_manifest shapes;
    pjs_manifest pair;
    pjs_manifest hooked;
    pjs_infer_request r;
    pjs_error err;
} fixture;

static int setup(void **state)
{
    static fixture f;
    memset(&f, 0, sizeof f);
    pjs_error err;
    if (pjs_manifest_parse(&f.two_io, two_io_yaml, strlen(two_io_yaml), "two_io", &err) != 0 ||
        pjs_manifest_parse(&f.fixed, fixed_yaml, strlen(fixed_yaml), "fixed", &err) != 0 ||
        pjs_manifest_parse(&f.shapes, shapes_yaml, strlen(shapes_yaml), "shapes", &err) != 0 ||
        pjs_manifest_parse(&f.pair, pair_yaml, strlen(pair_yaml), "pair", &err) != 0 ||
        pjs_manifest_parse(&f.hooked, hooked_yaml, strlen(hooked_yaml), "hooked", &err) != 0) {
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
    pjs_manifest_free(&f->shapes);
    pjs_manifest_free(&f->pair);
    pjs_manifest_free(&f->hooked);
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
    expect_invalid(f, "input \"a\": datatype BYTES does not match the model's FP32");
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

/* ---- variants ------------------------------------------------------------ */

/* A request for `shapes` with one image of [n, 3, h, w]. */
static pjs_infer_request *image_request(fixture *f, int64_t n, int64_t h, int64_t w)
{
    pjs_infer_request_init(&f->r);
    pjs_infer_input *in = &f->r.inputs[0];
    in->name = "image";
    in->datatype = "FP32";
    in->shape = (pjs_shape){4, {n, 3, h, w}};
    in->data = image_data;
    in->nbytes = (size_t)(n * 3 * h * w) * sizeof(float);
    f->r.n_inputs = 1;
    f->r.variant = 99; /* validation sets it */
    pjs_error_clear(&f->err);
    return &f->r;
}

static void expect_invalid_in(fixture *f, const pjs_manifest *m, int64_t max_batch,
                              const char *needle)
{
    int rc = pjs_infer_validate(&f->r, m, max_batch, &f->err);
    if (getenv("PJS_TEST_VERBOSE"))
        printf("  %s\n", f->err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(f->err.msg, m->name));
    if (strstr(f->err.msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", f->err.msg, needle);
}

static void test_variant_resolved_by_shape(void **state)
{
    fixture *f = *state;
    static const int64_t hw[3][2] = {{32, 32}, {32, 64}, {64, 32}};
    for (size_t v = 0; v < 3; v++) {
        pjs_infer_request *r = image_request(f, 3, hw[v][0], hw[v][1]);
        assert_int_equal(pjs_infer_validate(r, &f->shapes, 4, &f->err), 0);
        assert_int_equal(r->variant, v);
        assert_int_equal(r->batch, 3);
        /* The dispatcher sizes rows from the resolved variant's spec. */
        assert_ptr_equal(r->inputs[0].spec, &f->shapes.variants[v].inputs[0]);
        assert_int_equal(pjs_tensor_spec_row_bytes(r->inputs[0].spec),
                         3 * hw[v][0] * hw[v][1] * sizeof(float));
    }
    /* Single-variant models resolve to variant 0. */
    pjs_infer_request *r = good_request(f);
    r->variant = 7;
    assert_int_equal(pjs_infer_validate(r, &f->two_io, 8, &f->err), 0);
    assert_int_equal(r->variant, 0);
}

static void test_variant_none_matches(void **state)
{
    fixture *f = *state;
    image_request(f, 1, 32, 48);
    expect_invalid_in(f, &f->shapes, 4,
                      "model shapes: input \"image\": shape [1, 3, 32, 48] matches no variant "
                      "of the model (accepted: default [-1, 3, 32, 32], wide [-1, 3, 32, 64], "
                      "tall [-1, 3, 64, 32]; -1: the batch size)");
    assert_int_equal(f->err.code, PJS_ERR_INVALID_ARGUMENT);
    image_request(f, 1, 32, 64)->inputs[0].shape.rank = 3;
    expect_invalid_in(f, &f->shapes, 4, "matches no variant");
}

static void test_variant_datatype_checked_first(void **state)
{
    fixture *f = *state;
    image_request(f, 1, 32, 48)->inputs[0].datatype = "FP16";
    expect_invalid_in(f, &f->shapes, 4, "datatype FP16 does not match the model's FP32");
    image_request(f, 1, 32, 48)->inputs[0].datatype = "BYTES";
    expect_invalid_in(f, &f->shapes, 4, "datatype BYTES does not match the model's FP32");
}

static void test_variant_checks_use_its_shapes(void **state)
{
    fixture *f = *state;
    /* The byte size of a wide image, minus one. */
    image_request(f, 2, 32, 64)->inputs[0].nbytes -= 1;
    expect_invalid_in(f, &f->shapes, 4, "got 49151 bytes of data but shape [2, 3, 32, 64] of "
                                        "FP32 needs 49152");
    image_request(f, 5, 64, 32);
    expect_invalid_in(f, &f->shapes, 4, "batch size 5 is outside 1..4");
}

static void test_variant_with_two_inputs(void **state)
{
    fixture *f = *state;
    pjs_infer_request_init(&f->r);
    set_input(&f->r, 0, "b", "INT32", 2, 3, b_data, 2 * 3 * 4);
    set_input(&f->r, 1, "a", "FP32", 2, 16, a_data, 2 * 16 * 4);
    assert_int_equal(pjs_infer_validate(&f->r, &f->pair, 8, &f->err), 0);
    assert_int_equal(f->r.variant, 1);
    assert_string_equal(f->r.inputs[0].name, "a");
    assert_ptr_equal(f->r.inputs[0].spec, &f->pair.variants[1].inputs[0]);
    assert_ptr_equal(f->r.inputs[1].spec, &f->pair.variants[1].inputs[1]);

    /* Every input must fit the same variant. */
    pjs_infer_request_init(&f->r);
    set_input(&f->r, 0, "a", "FP32", 2, 16, a_data, 2 * 16 * 4);
    set_input(&f->r, 1, "b", "INT32", 2, 4, b_data, 2 * 4 * 4);
    expect_invalid_in(f, &f->pair, 8,
                      "model pair: input shapes a [2, 16], b [2, 4] match no variant of the "
                      "model (accepted: default (a [-1, 8], b [-1, 3]), long (a [-1, 16], "
                      "b [-1, 3]); -1: the batch size)");
    /* Names are checked before shapes. */
    pjs_infer_request_init(&f->r);
    set_input(&f->r, 0, "a", "FP32", 2, 5, a_data, 2 * 5 * 4);
    expect_invalid_in(f, &f->pair, 8, "missing input \"b\"");
}

/* ---- client tensors: strings and extents that vary ------------------------ */

/* Serialized strings, as a front end hands them over. */
typedef struct strings {
    unsigned char buf[512];
    size_t len;
} strings;

static void put_strings(strings *s, size_t n, const char *const *elems)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        assert_true(pjs_bytes_add_size(&total, strlen(elems[i])));
    assert_true(total <= sizeof s->buf);
    pjs_bytes_writer w = pjs_bytes_writer_init(s->buf, sizeof s->buf);
    for (size_t i = 0; i < n; i++)
        assert_true(pjs_bytes_put(&w, elems[i], strlen(elems[i])));
    s->len = total;
}

static const char *const six[] = {"a", "", "tr\xc3\xa8s", "long string here", "x", "yz"};
static strings text_data, lang_data;
static float scale_data[5 * 2];

static void set_rank(pjs_infer_request *r, size_t i, const char *name, const char *dt, int rank,
                     const int64_t *dims, const void *data, size_t nbytes)
{
    set_input(r, i, name, dt, 0, 0, data, nbytes);
    r->inputs[i].shape.rank = rank;
    for (int d = 0; d < rank; d++)
        r->inputs[i].shape.dims[d] = dims[d];
}

/* A valid request for `hooked`: two rows of three strings, a language, a
 * 5 x 2 scale, in an order of the client's own. */
static pjs_infer_request *hooked_request(fixture *f)
{
    put_strings(&text_data, 6, six);
    put_strings(&lang_data, 1, (const char *const[]){"en"});
    pjs_infer_request_init(&f->r);
    set_rank(&f->r, 0, "SCALE", "FP32", 2, (const int64_t[]){5, 2}, scale_data, 5 * 2 * 4);
    set_rank(&f->r, 1, "TEXT", "BYTES", 2, (const int64_t[]){2, 3}, text_data.buf, text_data.len);
    set_rank(&f->r, 2, "LANG", "BYTES", 1, (const int64_t[]){1}, lang_data.buf, lang_data.len);
    pjs_error_clear(&f->err);
    return &f->r;
}

static void expect_client_invalid(fixture *f, const char *needle)
{
    int rc = pjs_infer_validate_client(&f->r, &f->hooked, 4, &f->err);
    if (getenv("PJS_TEST_VERBOSE"))
        printf("  %s\n", f->err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(f->err.code, PJS_ERR_INVALID_ARGUMENT);
    if (strstr(f->err.msg, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", f->err.msg, needle);
}

static void test_client_valid_request(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = hooked_request(f);
    r->variant = 7;
    r->n_requested = 1;
    r->requested[0].name = "LABEL";
    assert_int_equal(pjs_infer_validate_client(r, &f->hooked, 4, &f->err), 0);
    assert_int_equal(r->batch, 2);
    assert_int_equal(r->variant, 0);
    assert_string_equal(r->inputs[0].name, "TEXT");
    assert_string_equal(r->inputs[1].name, "LANG");
    assert_string_equal(r->inputs[2].name, "SCALE");
    for (size_t i = 0; i < 3; i++)
        assert_ptr_equal(r->inputs[i].spec, &f->hooked.client_inputs[i]);

    /* -1 takes any extent, 0 included: no strings at all, an empty scale. */
    r = hooked_request(f);
    r->inputs[0].shape.dims[0] = 0;
    r->inputs[0].nbytes = 0;
    r->inputs[1].shape.dims[1] = 0;
    r->inputs[1].data = NULL;
    r->inputs[1].nbytes = 0;
    assert_int_equal(pjs_infer_validate_client(r, &f->hooked, 4, &f->err), 0);
    assert_int_equal(r->batch, 2);
}

/* A model without client tensors is checked against its executable's. */
static void test_client_falls_back_to_executable(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = good_request(f);
    assert_int_equal(pjs_infer_validate_client(r, &f->two_io, 8, &f->err), 0);
    assert_int_equal(r->batch, 3);
    assert_ptr_equal(r->inputs[0].spec, &f->two_io.inputs[0]);
}

/* Clients name client tensors; the executable's are not theirs to send. */
static void test_client_names(void **state)
{
    fixture *f = *state;
    hooked_request(f)->inputs[0].name = "tokens";
    expect_client_invalid(f, "model hooked: unexpected input \"tokens\" (the model's inputs: "
                             "TEXT, LANG, SCALE)");
    hooked_request(f)->n_inputs = 2;
    expect_client_invalid(f, "model hooked: missing input \"LANG\"");
    pjs_infer_request *r = hooked_request(f);
    r->n_requested = 1;
    r->requested[0].name = "logits";
    expect_client_invalid(f, "unknown output \"logits\" requested (the model's outputs: LABEL, "
                             "SCORE)");
}

static void test_client_shapes(void **state)
{
    fixture *f = *state;
    /* A fixed extent stays fixed; a varying one still refuses negatives. */
    hooked_request(f)->inputs[0].shape.dims[1] = 3;
    expect_client_invalid(f, "input \"SCALE\": shape [5, 3] does not match the model's [-1, 2] "
                             "(-1: any extent)");
    hooked_request(f)->inputs[0].shape.dims[0] = -5;
    expect_client_invalid(f, "input \"SCALE\": shape [-5, 2] does not match");
    hooked_request(f)->inputs[1].shape.dims[1] = -1;
    expect_client_invalid(f, "input \"TEXT\": shape [2, -1] does not match the model's [-1, -1] "
                             "(-1: the batch size first, any extent elsewhere)");
    pjs_infer_request *r = hooked_request(f);
    r->inputs[1].shape.dims[0] = 6;
    r->inputs[1].shape.dims[1] = 1;
    expect_client_invalid(f, "input \"TEXT\": batch size 6 is outside 1..4");
    /* The fixed-size tensor's bytes are still counted. */
    hooked_request(f)->inputs[0].nbytes -= 4;
    expect_client_invalid(f, "input \"SCALE\": got 36 bytes of data but shape [5, 2] of FP32 "
                             "needs 40");
}

/* BYTES goes to BYTES tensors only, and nothing else goes to them. */
static void test_client_bytes_datatype(void **state)
{
    fixture *f = *state;
    hooked_request(f)->inputs[0].datatype = "BYTES";
    expect_client_invalid(f, "input \"SCALE\": datatype BYTES does not match the model's FP32");
    hooked_request(f)->inputs[2].datatype = "UINT8";
    expect_client_invalid(f, "input \"LANG\": datatype UINT8 does not match the model's BYTES");
}

static void test_client_bytes_count(void **state)
{
    fixture *f = *state;
    pjs_infer_request *r = hooked_request(f);
    r->inputs[1].shape.dims[1] = 4;
    expect_client_invalid(f, "model hooked: input \"TEXT\": the BYTES data holds 6 elements but "
                             "shape [2, 4] has 8");
    /* One string fewer: the buffer is well formed but short of the shape. */
    r = hooked_request(f);
    put_strings(&text_data, 5, six);
    r->inputs[1].nbytes = text_data.len;
    expect_client_invalid(f, "the BYTES data holds 5 elements but shape [2, 3] has 6");
    r = hooked_request(f);
    r->inputs[2].data = NULL;
    r->inputs[2].nbytes = 0;
    expect_client_invalid(f, "input \"LANG\": the BYTES data holds 0 elements but shape [1] "
                             "has 1");
}

static void test_client_bytes_malformed(void **state)
{
    fixture *f = *state;
    /* The last string ("yz", 6 bytes serialized) cut short by one byte. */
    hooked_request(f)->inputs[1].nbytes -= 1;
    expect_client_invalid(f, "model hooked: input \"TEXT\": malformed BYTES data: element 5 at "
                             "offset 43 has length 2 but only 1 bytes are left after its 4-byte "
                             "length");
    /* A length prefix cut short. */
    hooked_request(f)->inputs[1].nbytes = 2;
    expect_client_invalid(f, "element 0 starts at offset 0 but only 2 bytes are left, too few "
                             "for its 4-byte length");
    /* Trailing bytes after the last element are refused too. */
    pjs_infer_request *r = hooked_request(f);
    put_strings(&lang_data, 1, (const char *const[]){"en"});
    memcpy(lang_data.buf + lang_data.len, "\0\0\0", 3);
    r->inputs[2].nbytes = lang_data.len + 3;
    expect_client_invalid(f, "input \"LANG\": malformed BYTES data: element 1 starts at offset 6 "
                             "but only 3 bytes are left");
    /* A length near 2^32 does not wrap. */
    r = hooked_request(f);
    memcpy(lang_data.buf, "\xff\xff\xff\xff", 4);
    expect_client_invalid(f, "element 0 at offset 0 has length 4294967295 but only 2 bytes are "
                             "left");
}

/* Without a batched client input the request's batch is 1. */
static void test_client_unbatched(void **state)
{
    (void)state;
    static const char yaml[] = "format_version: \"2.0\"\n"
                               "name: greet\n"
                               "kind: meta\n"
                               "meta: {calls: []}\n"
                               "client_inputs: [{name: NAME, dtype: bytes, shape: [-1]}]\n"
                               "client_outputs: [{name: GREETING, dtype: bytes, shape: [-1]}]\n";
    pjs_manifest m;
    pjs_error err;
    assert_int_equal(pjs_manifest_parse(&m, yaml, sizeof yaml - 1, "greet", &err), 0);
    strings names;
    put_strings(&names, 3, (const char *const[]){"ada", "", "grace"});
    pjs_infer_request r;
    pjs_infer_request_init(&r);
    set_rank(&r, 0, "NAME", "BYTES", 1, (const int64_t[]){3}, names.buf, names.len);
    r.batch = 9;
    assert_int_equal(pjs_infer_validate_client(&r, &m, 1, &err), 0);
    assert_int_equal(r.batch, 1);
    assert_ptr_equal(r.inputs[0].spec, &m.client_inputs[0]);
    r.inputs[0].shape.dims[0] = 2;
    assert_int_equal(pjs_infer_validate_client(&r, &m, 1, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "model greet: input \"NAME\": the BYTES data holds 3 elements "
                                    "but shape [2] has 2"));
    pjs_manifest_free(&m);
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
        cmocka_unit_test(test_variant_resolved_by_shape),
        cmocka_unit_test(test_variant_none_matches),
        cmocka_unit_test(test_variant_datatype_checked_first),
        cmocka_unit_test(test_variant_checks_use_its_shapes),
        cmocka_unit_test(test_variant_with_two_inputs),
        cmocka_unit_test(test_client_valid_request),
        cmocka_unit_test(test_client_falls_back_to_executable),
        cmocka_unit_test(test_client_names),
        cmocka_unit_test(test_client_shapes),
        cmocka_unit_test(test_client_bytes_datatype),
        cmocka_unit_test(test_client_bytes_count),
        cmocka_unit_test(test_client_bytes_malformed),
        cmocka_unit_test(test_client_unbatched),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
