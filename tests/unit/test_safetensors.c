/*
 * test_safetensors.c - unit tests of the safetensors reader (core/safetensors.h).
 *
 * Files are assembled in memory by build_file(): the 8-byte little-endian
 * header length, the JSON header (padded with spaces to a multiple of 8, as
 * the reference writer does), then the data bytes. To keep the JSON readable
 * in C string literals, the header text is written with ' for " and ` for \"
 * (the escaped quotes inside the argument_order string), e.g.
 *   {'__metadata__':{'argument_order':'[`a`]'},'a':{...}}
 *
 * Every rejection test checks the status, that the message starts with the
 * label, that it names the offending field, and that closing the failed
 * struct is safe. One test goes through the file system with
 * pjs_safetensors_open; the rest parse from memory. Run under ASan the tests
 * also prove the error paths leak nothing.
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

#include "core/safetensors.h"

#define LABEL "t.safetensors"

/* Translates the quoting convention above into real JSON (caller frees). */
static char *unquote(const char *src)
{
    size_t n = strlen(src);
    char *out = malloc(2 * n + 1);
    assert_non_null(out);
    char *p = out;
    for (const char *s = src; *s != '\0'; s++) {
        if (*s == '\'') {
            *p++ = '"';
        } else if (*s == '`') {
            *p++ = '\\';
            *p++ = '"';
        } else {
            *p++ = *s;
        }
    }
    *p = '\0';
    return out;
}

/* Assembles length prefix + header + data; the header is taken verbatim. */
static unsigned char *build_raw(const char *json, size_t json_len, const void *data,
                                size_t data_len, size_t *out_size)
{
    size_t padded = (json_len + 7) / 8 * 8;
    size_t size = 8 + padded + data_len;
    unsigned char *buf = malloc(size);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, json_len);
    memset(buf + 8 + json_len, ' ', padded - json_len);
    if (data_len > 0)
        memcpy(buf + 8 + padded, data, data_len);
    *out_size = size;
    return buf;
}

/* Like build_raw, but the header is written in the quoting convention. */
static unsigned char *build_file(const char *json, const void *data, size_t data_len,
                                 size_t *out_size)
{
    char *real = unquote(json);
    unsigned char *buf = build_raw(real, strlen(real), data, data_len, out_size);
    free(real);
    return buf;
}

static void assert_rejected(const unsigned char *bytes, size_t size, const char *needle)
{
    pjs_safetensors st;
    pjs_error err;
    pjs_error_clear(&err);
    int rc = pjs_safetensors_parse(&st, bytes, size, LABEL, &err);
    if (rc != PJS_ERR_INVALID_ARGUMENT || err.code != PJS_ERR_INVALID_ARGUMENT)
        fail_msg("expected INVALID_ARGUMENT, got %s: %s", pjs_status_name(rc), err.msg);
    if (strncmp(err.msg, LABEL ": ", strlen(LABEL ": ")) != 0)
        fail_msg("message does not start with the label: %s", err.msg);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("message lacks \"%s\": %s", needle, err.msg);
    pjs_safetensors_close(&st); /* safe on a failed struct */
    assert_int_equal(st.n_tensors, 0);
}

/* Builds a file from a convention-quoted header and expects a rejection. */
static void expect_error(const char *json, size_t data_len, const char *needle)
{
    unsigned char *data = calloc(1, data_len + 1);
    assert_non_null(data);
    size_t size;
    unsigned char *buf = build_file(json, data, data_len, &size);
    assert_rejected(buf, size, needle);
    free(buf);
    free(data);
}

static void expect_ok(const char *json, size_t data_len, size_t n_tensors)
{
    unsigned char *data = calloc(1, data_len + 1);
    assert_non_null(data);
    size_t size;
    unsigned char *buf = build_file(json, data, data_len, &size);
    pjs_safetensors st;
    pjs_error err;
    int rc = pjs_safetensors_parse(&st, buf, size, LABEL, &err);
    if (rc != 0)
        fail_msg("expected success: %s", err.msg);
    assert_int_equal(st.n_tensors, n_tensors);
    pjs_safetensors_close(&st);
    free(buf);
    free(data);
}

/* ---- valid files ---------------------------------------------------------- */

/* Data region of the valid file: w F32[2,3] @0, b BF16[3] @24, a 2-byte gap,
 * h F16[2] @32, mask BOOL[4] @36, s I64[] @40, z F32[0] @48 (empty). */
static const char valid_header[] =
    "{'w':{'dtype':'F32','shape':[2,3],'data_offsets':[0,24]},"
    "'b':{'dtype':'BF16','shape':[3],'data_offsets':[24,30]},"
    "'h':{'dtype':'F16','shape':[2],'data_offsets':[32,36]},"
    "'__metadata__':{'format':'pt','argument_order':'[`s`,`w`,`mask`,`z`,`b`,`h`]'},"
    "'mask':{'dtype':'BOOL','shape':[4],'data_offsets':[36,40]},"
    "'s':{'dtype':'I64','shape':[],'data_offsets':[40,48]},"
    "'z':{'dtype':'F32','shape':[0],'data_offsets':[48,48]}}";

static void fill_valid_data(unsigned char data[48])
{
    const float w[6] = {1, 2, 3, 4, 5, 6};
    const uint16_t b[3] = {0x3f80, 0x4000, 0x4040}; /* bf16 1, 2, 3 */
    const uint16_t h[2] = {0x3c00, 0x4000};         /* f16 1, 2 */
    const unsigned char mask[4] = {1, 0, 0, 1};
    const int64_t s = -42;
    memset(data, 0xee, 48);
    memcpy(data, w, sizeof w);
    memcpy(data + 24, b, sizeof b);
    memcpy(data + 32, h, sizeof h);
    memcpy(data + 36, mask, sizeof mask);
    memcpy(data + 40, &s, sizeof s);
}

static void test_valid_file(void **state)
{
    (void)state;
    unsigned char data[48];
    fill_valid_data(data);
    size_t size;
    unsigned char *buf = build_file(valid_header, data, sizeof data, &size);
    uint64_t header_end = size - sizeof data;

    pjs_safetensors st;
    pjs_error err;
    int rc = pjs_safetensors_parse(&st, buf, size, LABEL, &err);
    if (rc != 0)
        fail_msg("%s", err.msg);
    assert_ptr_equal(st.bytes, buf);
    assert_int_equal(st.size, size);
    assert_int_equal(st.n_tensors, 6);

    /* Stored in argument_order order, not header order. */
    const char *order[] = {"s", "w", "mask", "z", "b", "h"};
    for (size_t i = 0; i < 6; i++)
        assert_string_equal(st.tensors[i].name, order[i]);

    const pjs_st_tensor *s = &st.tensors[0];
    assert_int_equal(s->dtype, PJS_DTYPE_I64);
    assert_int_equal(s->shape.rank, 0);
    assert_int_equal(s->offset, header_end + 40);
    assert_int_equal(s->nbytes, 8);
    int64_t sv;
    memcpy(&sv, pjs_safetensors_data(&st, s), sizeof sv);
    assert_int_equal(sv, -42);

    const pjs_st_tensor *w = pjs_safetensors_find(&st, "w");
    assert_ptr_equal(w, &st.tensors[1]);
    assert_int_equal(w->dtype, PJS_DTYPE_F32);
    assert_int_equal(w->shape.rank, 2);
    assert_int_equal(w->shape.dims[0], 2);
    assert_int_equal(w->shape.dims[1], 3);
    assert_int_equal(w->offset, header_end);
    assert_int_equal(w->nbytes, 24);
    float wv[6];
    memcpy(wv, pjs_safetensors_data(&st, w), sizeof wv);
    assert_true(wv[0] == 1.0f && wv[5] == 6.0f);

    const pjs_st_tensor *b = pjs_safetensors_find(&st, "b");
    assert_int_equal(b->dtype, PJS_DTYPE_BF16);
    assert_int_equal(b->nbytes, 6);
    assert_memory_equal(pjs_safetensors_data(&st, b), data + 24, 6);

    const pjs_st_tensor *h = pjs_safetensors_find(&st, "h");
    assert_int_equal(h->dtype, PJS_DTYPE_F16);
    assert_int_equal(h->offset, header_end + 32); /* after the gap */
    assert_memory_equal(pjs_safetensors_data(&st, h), data + 32, 4);

    const pjs_st_tensor *mask = pjs_safetensors_find(&st, "mask");
    assert_int_equal(mask->dtype, PJS_DTYPE_BOOL);
    assert_memory_equal(pjs_safetensors_data(&st, mask), data + 36, 4);

    const pjs_st_tensor *z = pjs_safetensors_find(&st, "z");
    assert_int_equal(z->nbytes, 0);
    assert_int_equal(z->shape.rank, 1);
    assert_int_equal(z->shape.dims[0], 0);

    assert_null(pjs_safetensors_find(&st, "missing"));
    assert_null(pjs_safetensors_find(&st, "__metadata__"));
    assert_int_equal(pjs_safetensors_total_bytes(&st), 24 + 6 + 4 + 4 + 8);

    pjs_safetensors_close(&st);
    assert_null(st.tensors);
    pjs_safetensors_close(&st); /* twice is harmless */
    free(buf);
}

static void test_zero_tensors(void **state)
{
    (void)state;
    expect_ok("{}", 0, 0);
    expect_ok("{'__metadata__':{'format':'pt'}}", 0, 0);
    expect_ok("{'__metadata__':{'argument_order':'[]'}}", 16, 0);
    expect_error("{'__metadata__':{'argument_order':'[`x`]'}}", 0,
                 "__metadata__.argument_order names \"x\" which is not a tensor in the file");
}

/* An empty tensor touches no bytes, so it may sit inside another's range. */
static void test_empty_tensor_inside_another(void **state)
{
    (void)state;
    expect_ok("{'__metadata__':{'argument_order':'[`a`,`e`]'},"
              "'a':{'dtype':'U8','shape':[8],'data_offsets':[0,8]},"
              "'e':{'dtype':'U8','shape':[2,0],'data_offsets':[4,4]}}",
              8, 2);
}

static void test_close_zeroed(void **state)
{
    (void)state;
    pjs_safetensors st;
    memset(&st, 0, sizeof st);
    pjs_safetensors_close(&st);
    pjs_safetensors_close(NULL);
    assert_int_equal(pjs_safetensors_total_bytes(&st), 0);
    assert_null(pjs_safetensors_find(&st, "x"));
}

/* ---- the length prefix ---------------------------------------------------- */

static void test_empty_file(void **state)
{
    (void)state;
    assert_rejected(NULL, 0, "file is 0 bytes, too short for the 8-byte header length");
}

static void test_truncated_prefix(void **state)
{
    (void)state;
    const unsigned char five[5] = {2, 0, 0, 0, 0};
    assert_rejected(five, sizeof five, "file is 5 bytes, too short");
    const unsigned char zero_len[8] = {0};
    assert_rejected(zero_len, sizeof zero_len, "header is not valid JSON");
}

static void test_header_length_past_end(void **state)
{
    (void)state;
    unsigned char buf[120];
    memset(buf, ' ', sizeof buf);
    uint64_t n = 999999;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    assert_rejected(buf, sizeof buf, "header length 999999 exceeds file size 120");
    /* One byte more than what follows the prefix. */
    n = sizeof buf - 8 + 1;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    assert_rejected(buf, sizeof buf, "header length 113 exceeds file size 120");
    /* Far beyond the format's limit, and beyond int64. */
    memset(buf, 0xff, 8);
    assert_rejected(buf, sizeof buf, "header length 18446744073709551615 exceeds the limit");
}

/* ---- the JSON ------------------------------------------------------------- */

static void test_bad_json(void **state)
{
    (void)state;
    expect_error("{'w': ", 0, "header is not valid JSON: ");
    expect_error("{'w': ", 0, " at line 1 column ");
    expect_error("{} trailing", 0, "header is not valid JSON");
    expect_error("7", 0, "header is not valid JSON");
    /* Invalid UTF-8 in a key. */
    const char bad_utf8[] = "{\"\xff\xfe\":{}}";
    size_t size;
    unsigned char *buf = build_raw(bad_utf8, strlen(bad_utf8), NULL, 0, &size);
    assert_rejected(buf, size, "header is not valid JSON");
    free(buf);
    /* A NUL byte inside the header. */
    const char nul[] = "{\"a\0\":{}}";
    buf = build_raw(nul, sizeof nul - 1, NULL, 0, &size);
    assert_rejected(buf, size, "header is not valid JSON");
    free(buf);
}

static void test_not_an_object(void **state)
{
    (void)state;
    expect_error("[1, 2]", 0, "header is not a JSON object");
}

static void test_duplicate_keys(void **state)
{
    (void)state;
    expect_error("{'__metadata__':{'argument_order':'[`a`]'},"
                 "'a':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"
                 "'a':{'dtype':'U8','shape':[1],'data_offsets':[1,2]}}",
                 2, "duplicate object key");
    expect_error("{'__metadata__':{'argument_order':'[`a`]'},"
                 "'a':{'dtype':'U8','dtype':'I8','shape':[1],'data_offsets':[0,1]}}",
                 2, "duplicate object key");
}

/* ---- tensor entries ------------------------------------------------------- */

#define ORDER_W "'__metadata__':{'argument_order':'[`w`]'},"

static void test_entry_fields(void **state)
{
    (void)state;
    expect_error("{" ORDER_W "'w':[1]}", 0, "tensor \"w\" is not an object");
    expect_error("{" ORDER_W "'w':{'shape':[1],'data_offsets':[0,1]}}", 1,
                 "tensor \"w\" has no \"dtype\"");
    expect_error("{" ORDER_W "'w':{'dtype':'U8','data_offsets':[0,1]}}", 1,
                 "tensor \"w\" has no \"shape\"");
    expect_error("{" ORDER_W "'w':{'dtype':'U8','shape':[1]}}", 1,
                 "tensor \"w\" has no \"data_offsets\"");
    expect_error("{" ORDER_W "'w':{'dtype':'U8','shape':[1],'data_offsets':[0,1],'extra':1}}", 1,
                 "tensor \"w\" has unexpected field \"extra\"");
    expect_error("{" ORDER_W "'w':{'dtype':4,'shape':[1],'data_offsets':[0,1]}}", 1,
                 "tensor \"w\": dtype is not a string");
}

static void test_unknown_dtype(void **state)
{
    (void)state;
    expect_error("{" ORDER_W "'w':{'dtype':'F8_E4M3','shape':[1],'data_offsets':[0,1]}}", 1,
                 "unknown dtype \"F8_E4M3\" for tensor \"w\"");
    /* Names are case-sensitive in safetensors. */
    expect_error("{" ORDER_W "'w':{'dtype':'f32','shape':[1],'data_offsets':[0,4]}}", 4,
                 "unknown dtype \"f32\" for tensor \"w\"");
}

static void test_bad_shape(void **state)
{
    (void)state;
    expect_error("{" ORDER_W "'w':{'dtype':'F32','shape':[-1,4],'data_offsets':[0,0]}}", 0,
                 "tensor \"w\": shape[0] is negative (-1)");
    expect_error("{" ORDER_W "'w':{'dtype':'F32','shape':[2,2.5],'data_offsets':[0,20]}}", 20,
                 "tensor \"w\": shape[1] is not an integer");
    expect_error("{" ORDER_W "'w':{'dtype':'F32','shape':4,'data_offsets':[0,16]}}", 16,
                 "tensor \"w\": shape is not a list");
    expect_error("{" ORDER_W
                 "'w':{'dtype':'U8','shape':[1,1,1,1,1,1,1,1,1],'data_offsets':[0,1]}}",
                 1, "tensor \"w\": shape has rank 9");
    /* 2^32 * 2^32 elements overflows int64. */
    expect_error("{" ORDER_W "'w':{'dtype':'F32','shape':[4294967296,4294967296],"
                 "'data_offsets':[0,0]}}",
                 0, "tensor \"w\": shape [4294967296, 4294967296] of F32 is too large");
    /* The element count fits, but times 8 bytes it does not. */
    expect_error("{" ORDER_W "'w':{'dtype':'F64','shape':[2305843009213693952],"
                 "'data_offsets':[0,0]}}",
                 0, "shape [2305843009213693952] of F64 is too large");
    /* Beyond int64 altogether: jansson refuses the number. */
    expect_error("{" ORDER_W "'w':{'dtype':'F32','shape':[99999999999999999999],"
                 "'data_offsets':[0,0]}}",
                 0, "header is not valid JSON");
}

static void test_offsets_past_end(void **state)
{
    (void)state;
    unsigned char data[64] = {0};
    size_t size;
    unsigned char *buf = build_file("{'__metadata__':{'argument_order':'[`dense.w`]'},"
                                    "'dense.w':{'dtype':'F32','shape':[25],"
                                    "'data_offsets':[0,100]}}",
                                    data, sizeof data, &size);
    pjs_safetensors st;
    pjs_error err;
    assert_int_equal(pjs_safetensors_parse(&st, buf, size, "weights.safetensors", &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "weights.safetensors: tensor \"dense.w\": data_offsets [0, 100] "
                                 "past the end of the data region (64 bytes)");
    pjs_safetensors_close(&st);
    free(buf);
    /* One byte too far. */
    expect_error("{" ORDER_W "'w':{'dtype':'U8','shape':[9],'data_offsets':[0,9]}}", 8,
                 "data_offsets [0, 9] past the end of the data region (8 bytes)");
}

static void test_bad_offsets(void **state)
{
    (void)state;
    expect_error("{" ORDER_W "'w':{'dtype':'U8','shape':[0],'data_offsets':[8,4]}}", 8,
                 "tensor \"w\": data_offsets [8, 4] begin is after end");
    expect_error("{" ORDER_W "'w':{'dtype':'U8','shape':[0],'data_offsets':[-4,0]}}", 8,
                 "tensor \"w\": data_offsets [-4, 0] has a negative offset");
    expect_error("{" ORDER_W "'w':{'dtype':'U8','shape':[1],'data_offsets':[0]}}", 8,
                 "tensor \"w\": data_offsets is not a list of two integers");
    expect_error("{" ORDER_W "'w':{'dtype':'U8','shape':[1],'data_offsets':[0,1,2]}}", 8,
                 "tensor \"w\": data_offsets is not a list of two integers");
    expect_error("{" ORDER_W "'w':{'dtype':'U8','shape':[1],'data_offsets':['0',1]}}", 8,
                 "tensor \"w\": data_offsets is not a list of two integers");
}

static void test_size_mismatch(void **state)
{
    (void)state;
    expect_error("{" ORDER_W "'w':{'dtype':'F32','shape':[2,2],'data_offsets':[0,12]}}", 16,
                 "tensor \"w\": data_offsets [0, 12] hold 12 bytes but shape [2, 2] of F32 "
                 "needs 16");
    expect_error("{" ORDER_W "'w':{'dtype':'BF16','shape':[],'data_offsets':[0,4]}}", 16,
                 "hold 4 bytes but shape [] of BF16 needs 2");
}

static void test_overlapping(void **state)
{
    (void)state;
    expect_error("{'__metadata__':{'argument_order':'[`a`,`b`]'},"
                 "'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
                 "'b':{'dtype':'F32','shape':[2],'data_offsets':[4,12]}}",
                 16, "tensor \"b\": data_offsets [4, 12] overlap tensor \"a\" [0, 8]");
    /* Identical ranges. */
    expect_error("{'__metadata__':{'argument_order':'[`a`,`b`]'},"
                 "'a':{'dtype':'U8','shape':[4],'data_offsets':[0,4]},"
                 "'b':{'dtype':'U8','shape':[4],'data_offsets':[0,4]}}",
                 4, "overlap tensor");
    /* c lies inside a, with the empty e between them in offset order. */
    expect_error("{'__metadata__':{'argument_order':'[`a`,`e`,`c`]'},"
                 "'a':{'dtype':'U8','shape':[16],'data_offsets':[0,16]},"
                 "'e':{'dtype':'U8','shape':[0],'data_offsets':[2,2]},"
                 "'c':{'dtype':'U8','shape':[2],'data_offsets':[8,10]}}",
                 16, "tensor \"c\": data_offsets [8, 10] overlap tensor \"a\" [0, 16]");
    /* Adjacent is fine. */
    expect_ok("{'__metadata__':{'argument_order':'[`b`,`a`]'},"
              "'a':{'dtype':'U8','shape':[4],'data_offsets':[0,4]},"
              "'b':{'dtype':'U8','shape':[4],'data_offsets':[4,8]}}",
              8, 2);
}

/* ---- __metadata__ and argument_order -------------------------------------- */

#define TENSORS_AB                                             \
    "'a':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"     \
    "'b':{'dtype':'U8','shape':[1],'data_offsets':[1,2]}"

static void test_missing_argument_order(void **state)
{
    (void)state;
    expect_error("{" TENSORS_AB "}", 2,
                 "__metadata__.argument_order is missing (required when the file has tensors)");
    expect_error("{'__metadata__':{'format':'pt'}," TENSORS_AB "}", 2,
                 "__metadata__.argument_order is missing");
}

static void test_argument_order_not_a_list(void **state)
{
    (void)state;
    expect_error("{'__metadata__':{'argument_order':'a,b'}," TENSORS_AB "}", 2,
                 "__metadata__.argument_order is not a JSON list");
    expect_error("{'__metadata__':{'argument_order':'{`a`:1}'}," TENSORS_AB "}", 2,
                 "__metadata__.argument_order is not a JSON list");
    expect_error("{'__metadata__':{'argument_order':'[`a`,2]'}," TENSORS_AB "}", 2,
                 "__metadata__.argument_order[1] is not a string");
    expect_error("{'__metadata__':{'argument_order':['a','b']}," TENSORS_AB "}", 2,
                 "__metadata__ value for \"argument_order\" is not a string");
}

static void test_argument_order_unknown(void **state)
{
    (void)state;
    expect_error("{'__metadata__':{'argument_order':'[`a`,`x`,`b`]'}," TENSORS_AB "}", 2,
                 "__metadata__.argument_order names \"x\" which is not a tensor in the file");
    expect_error("{'__metadata__':{'argument_order':'[`a`,`b`,`__metadata__`]'}," TENSORS_AB "}",
                 2, "names \"__metadata__\" which is not a tensor");
}

static void test_argument_order_duplicate(void **state)
{
    (void)state;
    expect_error("{'__metadata__':{'argument_order':'[`a`,`b`,`a`]'}," TENSORS_AB "}", 2,
                 "__metadata__.argument_order names \"a\" more than once");
}

static void test_argument_order_missing_tensor(void **state)
{
    (void)state;
    expect_error("{'__metadata__':{'argument_order':'[`a`]'}," TENSORS_AB "}", 2,
                 "__metadata__.argument_order does not name tensor \"b\"");
}

static void test_metadata_not_strings(void **state)
{
    (void)state;
    expect_error("{'__metadata__':{'argument_order':'[`a`,`b`]','version':2}," TENSORS_AB "}", 2,
                 "__metadata__ value for \"version\" is not a string");
    expect_error("{'__metadata__':['x']," TENSORS_AB "}", 2, "__metadata__ is not an object");
}

/* ---- through the file system ---------------------------------------------- */

/* Makes dir (a mkdtemp template) and writes the valid test file as
 * dir/model.safetensors (its path into path, its tensor bytes into
 * data[48]); returns the file's bytes (*size of them), for the caller to
 * free. */
static unsigned char *write_valid_file(char *dir, char *path, size_t path_size,
                                       unsigned char *data, size_t *size)
{
    assert_non_null(mkdtemp(dir));
    snprintf(path, path_size, "%s/model.safetensors", dir);
    fill_valid_data(data);
    unsigned char *buf = build_file(valid_header, data, 48, size);
    pjs_error err;
    assert_int_equal(pjs_write_file_atomic(path, buf, *size, &err), 0);
    return buf;
}

static void test_open_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/pjs_test_st_XXXXXX";
    char path[256];
    unsigned char data[48];
    size_t size;
    pjs_error err;
    unsigned char *buf = write_valid_file(dir, path, sizeof path, data, &size);

    pjs_safetensors st;
    int rc = pjs_safetensors_open(&st, path, &err);
    if (rc != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(st.size, size);
    assert_int_equal(st.n_tensors, 6);
    assert_string_equal(st.tensors[0].name, "s");
    const pjs_st_tensor *mask = pjs_safetensors_find(&st, "mask");
    assert_non_null(mask);
    assert_null(pjs_safetensors_data(&st, mask)); /* read, not mapped */
    unsigned char got[4];
    assert_int_equal(pjs_safetensors_read(&st, mask, 0, 4, got, &err), 0);
    assert_memory_equal(got, data + 36, 4);
    assert_int_equal(pjs_safetensors_read(&st, mask, 1, 4, got, &err), PJS_ERR_INTERNAL);
    assert_int_equal(pjs_safetensors_total_bytes(&st), 46);

    /* Replaced by a rename: the descriptor still reads the file opened. */
    unsigned char *other = build_file(valid_header, data, sizeof data, &size);
    memset(other + size - sizeof data, 0x5a, sizeof data);
    assert_int_equal(pjs_write_file_atomic(path, other, size, &err), 0);
    assert_int_equal(pjs_safetensors_read(&st, mask, 0, 4, got, &err), 0);
    assert_memory_equal(got, data + 36, 4);
    pjs_safetensors_close(&st);
    free(other);
    free(buf);

    /* A bad file on disk is named by its path, and nothing stays open. */
    buf = build_file("{'w':{'dtype':'F8_E4M3','shape':[1],'data_offsets':[0,1]}}", data, 1,
                     &size);
    assert_int_equal(pjs_write_file_atomic(path, buf, size, &err), 0);
    assert_int_equal(pjs_safetensors_open(&st, path, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(strncmp(err.msg, path, strlen(path)), 0);
    assert_non_null(strstr(err.msg, "unknown dtype \"F8_E4M3\" for tensor \"w\""));
    assert_null(st.path);
    assert_int_equal(st.fd, -1);
    pjs_safetensors_close(&st);
    free(buf);

    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* A file written or truncated in place after opening is refused (never a
 * signal: nothing is mapped), with an error naming it. */
static void test_open_file_changed(void **state)
{
    (void)state;
    char dir[] = "/tmp/pjs_test_st_XXXXXX";
    char path[256];
    unsigned char data[48];
    size_t size;
    pjs_error err;
    unsigned char *buf = write_valid_file(dir, path, sizeof path, data, &size);

    pjs_safetensors st;
    assert_int_equal(pjs_safetensors_open(&st, path, &err), 0);
    const pjs_st_tensor *w = pjs_safetensors_find(&st, "w");
    assert_non_null(w);
    unsigned char got[24];
    assert_int_equal(pjs_safetensors_read(&st, w, 0, sizeof got, got, &err), 0);

    /* Rewritten in place, same size (a tick later: timestamps are as coarse
     * as the kernel's clock tick; the bundle layer's checksums cover writes
     * within one tick). */
    usleep(30000);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    unsigned char junk[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(pwrite(fd, junk, sizeof junk, (off_t)w->offset), (ssize_t)sizeof junk);
    assert_int_equal(pjs_safetensors_read(&st, w, 0, sizeof got, got, &err),
                     PJS_ERR_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "changed since it was opened"));

    /* Truncated in place. */
    assert_int_equal(ftruncate(fd, 16), 0);
    close(fd);
    assert_int_equal(pjs_safetensors_read(&st, w, 0, sizeof got, got, &err),
                     PJS_ERR_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, "its size differs"));
    pjs_safetensors_close(&st);
    free(buf);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

static void test_open_missing(void **state)
{
    (void)state;
    pjs_safetensors st;
    pjs_error err;
    assert_int_equal(pjs_safetensors_open(&st, "/nonexistent/pjs/model.safetensors", &err),
                     PJS_ERR_NOT_FOUND);
    assert_int_equal(err.code, PJS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "/nonexistent/pjs/model.safetensors"));
    pjs_safetensors_close(&st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file),
        cmocka_unit_test(test_zero_tensors),
        cmocka_unit_test(test_empty_tensor_inside_another),
        cmocka_unit_test(test_close_zeroed),
        cmocka_unit_test(test_empty_file),
        cmocka_unit_test(test_truncated_prefix),
        cmocka_unit_test(test_header_length_past_end),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_not_an_object),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_entry_fields),
        cmocka_unit_test(test_unknown_dtype),
        cmocka_unit_test(test_bad_shape),
        cmocka_unit_test(test_offsets_past_end),
        cmocka_unit_test(test_bad_offsets),
        cmocka_unit_test(test_size_mismatch),
        cmocka_unit_test(test_overlapping),
        cmocka_unit_test(test_missing_argument_order),
        cmocka_unit_test(test_argument_order_not_a_list),
        cmocka_unit_test(test_argument_order_unknown),
        cmocka_unit_test(test_argument_order_duplicate),
        cmocka_unit_test(test_argument_order_missing_tensor),
        cmocka_unit_test(test_metadata_not_strings),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_open_file_changed),
        cmocka_unit_test(test_open_missing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
