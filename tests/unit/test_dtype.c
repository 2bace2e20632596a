/*
 * test_dtype.c - the element-type table of src/core/dtype.c.
 *
 * Checks every column of the table against the values fixed by the outside
 * world (KServe V2 / Triton datatype names, safetensors names, numpy type
 * strings, MLIR element types, the PJRT_Buffer_Type and xla::PrimitiveType
 * enums), that each spelling parses back to its type, and that unknown names
 * and out-of-range enum values are handled without touching memory outside
 * the table.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "core/dtype.h"

/* The expected table, written out independently of dtype.c. */
struct expect {
    pjs_dtype t;
    size_t size;
    const char *name, *safetensors, *kserve, *mlir, *numpy;
    int pjrt, xla;
};

static const struct expect expected[] = {
    {PJS_DTYPE_BOOL, 1, "bool", "BOOL", "BOOL", "i1", "|b1", 1, 1},
    {PJS_DTYPE_U8, 1, "u8", "U8", "UINT8", "ui8", "|u1", 6, 6},
    {PJS_DTYPE_U16, 2, "u16", "U16", "UINT16", "ui16", "<u2", 7, 7},
    {PJS_DTYPE_U32, 4, "u32", "U32", "UINT32", "ui32", "<u4", 8, 8},
    {PJS_DTYPE_U64, 8, "u64", "U64", "UINT64", "ui64", "<u8", 9, 9},
    {PJS_DTYPE_I8, 1, "i8", "I8", "INT8", "i8", "|i1", 2, 2},
    {PJS_DTYPE_I16, 2, "i16", "I16", "INT16", "i16", "<i2", 3, 3},
    {PJS_DTYPE_I32, 4, "i32", "I32", "INT32", "i32", "<i4", 4, 4},
    {PJS_DTYPE_I64, 8, "i64", "I64", "INT64", "i64", "<i8", 5, 5},
    {PJS_DTYPE_F16, 2, "f16", "F16", "FP16", "f16", "<f2", 10, 10},
    {PJS_DTYPE_BF16, 2, "bf16", "BF16", "BF16", "bf16", NULL, 13, 16},
    {PJS_DTYPE_F32, 4, "f32", "F32", "FP32", "f32", "<f4", 11, 11},
    {PJS_DTYPE_F64, 8, "f64", "F64", "FP64", "f64", "<f8", 12, 12},
    /* Strings: no fixed size, and no spelling outside the manifest and
     * KServe (no safetensors, numpy, MLIR or PJRT type holds them). */
    {PJS_DTYPE_BYTES, 0, "bytes", "", "BYTES", "", NULL, 0, 0},
};
#define N_EXPECTED (sizeof expected / sizeof expected[0])

static void test_table_covers_every_type(void **state)
{
    (void)state;
    assert_int_equal(N_EXPECTED, PJS_DTYPE_COUNT - 1);
    for (int t = PJS_DTYPE_INVALID + 1; t < PJS_DTYPE_COUNT; t++) {
        int found = 0;
        for (size_t i = 0; i < N_EXPECTED; i++)
            found += expected[i].t == (pjs_dtype)t;
        assert_int_equal(found, 1);
    }
}

static void test_sizes_and_names(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_EXPECTED; i++) {
        const struct expect *e = &expected[i];
        assert_int_equal(pjs_dtype_size(e->t), e->size);
        assert_string_equal(pjs_dtype_name(e->t), e->name);
        assert_string_equal(pjs_dtype_safetensors_name(e->t), e->safetensors);
        assert_string_equal(pjs_dtype_kserve_name(e->t), e->kserve);
        assert_string_equal(pjs_dtype_mlir_name(e->t), e->mlir);
        if (e->numpy == NULL)
            assert_null(pjs_dtype_numpy_descr(e->t));
        else
            assert_string_equal(pjs_dtype_numpy_descr(e->t), e->numpy);
        assert_int_equal(pjs_dtype_to_pjrt(e->t), e->pjrt);
        assert_int_equal(pjs_dtype_to_xla(e->t), e->xla);
    }
}

static void test_every_spelling_round_trips(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_EXPECTED; i++) {
        pjs_dtype t = expected[i].t;
        const char *s;
        s = pjs_dtype_name(t);
        assert_int_equal(pjs_dtype_parse(s, strlen(s)), t);
        s = pjs_dtype_kserve_name(t);
        assert_int_equal(pjs_dtype_from_kserve(s, strlen(s)), t);
        assert_int_equal(pjs_dtype_parse(s, strlen(s)), t);
        /* A type without a spelling in a column never parses from it. */
        s = pjs_dtype_safetensors_name(t);
        assert_int_equal(pjs_dtype_from_safetensors(s, strlen(s)), s[0] ? t : PJS_DTYPE_INVALID);
        s = pjs_dtype_mlir_name(t);
        assert_int_equal(pjs_dtype_from_mlir(s, strlen(s)), s[0] ? t : PJS_DTYPE_INVALID);
        s = pjs_dtype_numpy_descr(t);
        if (s != NULL)
            assert_int_equal(pjs_dtype_from_numpy_descr(s, strlen(s)), t);
        int pjrt = pjs_dtype_to_pjrt(t), xla = pjs_dtype_to_xla(t);
        assert_int_equal(pjs_dtype_from_pjrt(pjrt), pjrt ? t : PJS_DTYPE_INVALID);
        assert_int_equal(pjs_dtype_from_xla(xla), xla ? t : PJS_DTYPE_INVALID);
    }
}

/* BYTES is named "bytes" in manifests and "BYTES" by KServe; it is no
 * safetensors, numpy or PJRT type, and has no fixed element size. */
static void test_bytes_spellings(void **state)
{
    (void)state;
    assert_int_equal(pjs_dtype_parse("bytes", 5), PJS_DTYPE_BYTES);
    assert_int_equal(pjs_dtype_parse("BYTES", 5), PJS_DTYPE_BYTES);
    assert_int_equal(pjs_dtype_from_kserve("BYTES", 5), PJS_DTYPE_BYTES);
    assert_int_equal(pjs_dtype_from_kserve("bytes", 5), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_safetensors("BYTES", 5), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("|S1", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_size(PJS_DTYPE_BYTES), 0);
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_BYTES), 0);
}

/* Names need not be NUL-terminated: only `len` bytes are read. */
static void test_parse_respects_len(void **state)
{
    (void)state;
    assert_int_equal(pjs_dtype_parse("f32xyz", 3), PJS_DTYPE_F32);
    assert_int_equal(pjs_dtype_parse("f32", 2), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_kserve("FP32,", 4), PJS_DTYPE_F32);
    assert_int_equal(pjs_dtype_from_safetensors("BF16]", 4), PJS_DTYPE_BF16);
    assert_int_equal(pjs_dtype_from_mlir("ui8>", 3), PJS_DTYPE_U8);
    assert_int_equal(pjs_dtype_from_numpy_descr("<f4'", 3), PJS_DTYPE_F32);
    char buf[3] = {'i', '6', '4'}; /* no terminator */
    assert_int_equal(pjs_dtype_parse(buf, sizeof buf), PJS_DTYPE_I64);
}

static void test_parse_is_case_insensitive(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        pjs_dtype t;
    } cases[] = {
        {"F32", PJS_DTYPE_F32},    {"Bf16", PJS_DTYPE_BF16},  {"BOOL", PJS_DTYPE_BOOL},
        {"U8", PJS_DTYPE_U8},      {"fp32", PJS_DTYPE_F32},   {"Fp16", PJS_DTYPE_F16},
        {"int64", PJS_DTYPE_I64},  {"uint16", PJS_DTYPE_U16}, {"bf16", PJS_DTYPE_BF16},
        {"bool", PJS_DTYPE_BOOL},  {"INT8", PJS_DTYPE_I8},    {"fp64", PJS_DTYPE_F64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(pjs_dtype_parse(cases[i].s, strlen(cases[i].s)), cases[i].t);
}

/* The wire parsers are exact: case matters there. */
static void test_wire_parsers_are_case_sensitive(void **state)
{
    (void)state;
    assert_int_equal(pjs_dtype_from_kserve("fp32", 4), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_safetensors("f32", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_mlir("F32", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("<F4", 3), PJS_DTYPE_INVALID);
}

static void test_unknown_names(void **state)
{
    (void)state;
    static const char *const bad[] = {"", "f", "f8", "float32", "FP8", "STRING", "STR",
                                      "invalid", "int", "u128", " f32", "f32 ", "i1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n = strlen(bad[i]);
        assert_int_equal(pjs_dtype_parse(bad[i], n), PJS_DTYPE_INVALID);
        assert_int_equal(pjs_dtype_from_kserve(bad[i], n), PJS_DTYPE_INVALID);
        assert_int_equal(pjs_dtype_from_safetensors(bad[i], n), PJS_DTYPE_INVALID);
    }
    /* The invalid row's empty and "invalid" spellings never match. */
    assert_int_equal(pjs_dtype_from_mlir("", 0), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_mlir("invalid", 7), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_mlir("si8", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("", 0), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("<V2", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("<U4", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("<c8", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("O", 1), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("f4", 2), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("<f16", 4), PJS_DTYPE_INVALID);
    /* NULL with length 0 is "no name", not a crash. */
    assert_int_equal(pjs_dtype_parse(NULL, 0), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_kserve(NULL, 0), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr(NULL, 0), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_pjrt(0), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_pjrt(-1), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_pjrt(999), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_xla(0), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_xla(999), PJS_DTYPE_INVALID);
}

/* numpy writes one-byte types with '|', but '<' and '=' mean the same. */
static void test_numpy_byte_order_prefixes(void **state)
{
    (void)state;
    assert_int_equal(pjs_dtype_from_numpy_descr("|b1", 3), PJS_DTYPE_BOOL);
    assert_int_equal(pjs_dtype_from_numpy_descr("<b1", 3), PJS_DTYPE_BOOL);
    assert_int_equal(pjs_dtype_from_numpy_descr("=b1", 3), PJS_DTYPE_BOOL);
    assert_int_equal(pjs_dtype_from_numpy_descr("|u1", 3), PJS_DTYPE_U8);
    assert_int_equal(pjs_dtype_from_numpy_descr("=u1", 3), PJS_DTYPE_U8);
    assert_int_equal(pjs_dtype_from_numpy_descr("<u1", 3), PJS_DTYPE_U8);
    assert_int_equal(pjs_dtype_from_numpy_descr("|i1", 3), PJS_DTYPE_I8);
    assert_int_equal(pjs_dtype_from_numpy_descr("=i1", 3), PJS_DTYPE_I8);
    /* '=' is native order, little-endian on every host we build for. */
    assert_int_equal(pjs_dtype_from_numpy_descr("=f4", 3), PJS_DTYPE_F32);
    assert_int_equal(pjs_dtype_from_numpy_descr("=i8", 3), PJS_DTYPE_I64);
    /* '|' (not applicable) is wrong for multi-byte types; '>' is refused. */
    assert_int_equal(pjs_dtype_from_numpy_descr("|f4", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr(">f4", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr(">i8", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("!f4", 3), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_numpy_descr("<x1", 3), PJS_DTYPE_INVALID);
}

/* PJRT numbers BF16 13 in its own enum; XLA's PrimitiveType says 16. */
static void test_bf16_pjrt_vs_xla(void **state)
{
    (void)state;
    assert_int_equal(pjs_dtype_to_pjrt(PJS_DTYPE_BF16), 13);
    assert_int_equal(pjs_dtype_to_xla(PJS_DTYPE_BF16), 16);
    assert_int_equal(pjs_dtype_from_pjrt(13), PJS_DTYPE_BF16);
    assert_int_equal(pjs_dtype_from_xla(16), PJS_DTYPE_BF16);
    /* XLA 13 is C64 and PJRT 16 is C128: neither is a type of ours. */
    assert_int_equal(pjs_dtype_from_xla(13), PJS_DTYPE_INVALID);
    assert_int_equal(pjs_dtype_from_pjrt(16), PJS_DTYPE_INVALID);
}

static void test_out_of_range_enum(void **state)
{
    (void)state;
    const pjs_dtype bad[] = {PJS_DTYPE_INVALID, PJS_DTYPE_COUNT, (pjs_dtype)(PJS_DTYPE_COUNT + 1),
                             (pjs_dtype)100, (pjs_dtype)-1, (pjs_dtype)INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(pjs_dtype_size(bad[i]), 0);
        assert_string_equal(pjs_dtype_name(bad[i]), "invalid");
        assert_string_equal(pjs_dtype_safetensors_name(bad[i]), "");
        assert_string_equal(pjs_dtype_kserve_name(bad[i]), "");
        assert_string_equal(pjs_dtype_mlir_name(bad[i]), "");
        assert_null(pjs_dtype_numpy_descr(bad[i]));
        assert_int_equal(pjs_dtype_to_pjrt(bad[i]), 0);
        assert_int_equal(pjs_dtype_to_xla(bad[i]), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_covers_every_type),
        cmocka_unit_test(test_sizes_and_names),
        cmocka_unit_test(test_every_spelling_round_trips),
        cmocka_unit_test(test_bytes_spellings),
        cmocka_unit_test(test_parse_respects_len),
        cmocka_unit_test(test_parse_is_case_insensitive),
        cmocka_unit_test(test_wire_parsers_are_case_sensitive),
        cmocka_unit_test(test_unknown_names),
        cmocka_unit_test(test_numpy_byte_order_prefixes),
        cmocka_unit_test(test_bf16_pjrt_vs_xla),
        cmocka_unit_test(test_out_of_range_enum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
