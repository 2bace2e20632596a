/*
 * test_npy.c - the .npy reader and writer of src/core/npy.c.
 *
 * Three kinds of tests: round trips through a temporary directory for every
 * dtype (including scalars and empty arrays); hand-made files that exercise
 * the header grammar and every refusal (each asserting the status and a piece
 * of the message); and a cross-check with the project's numpy, which saves
 * arrays we must read and loads the arrays we write (skipped when the venv's
 * python is absent). The files we write must be byte-identical to numpy's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/mapped_file.h"
#include "core/npy.h"

#ifndef PJS_VENV
#define PJS_VENV "/nonexistent"
#endif

/* ---- fixtures and helpers ------------------------------------------------ */

struct ctx {
    char dir[64];
};

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup_dir(void **state)
{
    struct ctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -1;
    strcpy(c->dir, "/tmp/pjs_test_npy_XXXXXX");
    if (mkdtemp(c->dir) == NULL) {
        free(c);
        return -1;
    }
    *state = c;
    return 0;
}

static int teardown_dir(void **state)
{
    struct ctx *c = *state;
    nftw(c->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(c);
    return 0;
}

static void path_in(const struct ctx *c, const char *name, char *buf, size_t n)
{
    assert_true((size_t)snprintf(buf, n, "%s/%s", c->dir, name) < n);
}

/* A hand-made .npy file: preamble of the given version, `dict` padded with
 * spaces and '\n' to a 64-byte boundary (as numpy does), then `data`. */
struct blob {
    unsigned char b[8192];
    size_t n;
};

static void craft(struct blob *out, int major, const char *dict, const void *data, size_t nd)
{
    size_t pre = major == 1 ? 10 : 12;
    size_t dl = strlen(dict);
    size_t hlen = dl + 1;
    hlen += (64 - (pre + hlen) % 64) % 64;
    assert_true(pre + hlen + nd <= sizeof out->b);
    memcpy(out->b, "\x93NUMPY", 6);
    out->b[6] = (unsigned char)major;
    out->b[7] = 0;
    for (size_t i = 0; i < pre - 8; i++)
        out->b[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(out->b + pre, dict, dl);
    memset(out->b + pre + dl, ' ', hlen - dl - 1);
    out->b[pre + hlen - 1] = '\n';
    if (nd > 0)
        memcpy(out->b + pre + hlen, data, nd);
    out->n = pre + hlen + nd;
}

/* Parses `bytes` expecting failure with `code` and `needle` in the message,
 * which must also start with the label. */
static void expect_reject(const void *bytes, size_t n, pjs_dtype void2_as, int code,
                          const char *needle)
{
    pjs_npy a;
    pjs_error err;
    pjs_error_clear(&err);
    int rc = pjs_npy_parse(&a, bytes, n, void2_as, "x.npy", &err);
    if (rc != code || strstr(err.msg, needle) == NULL || strncmp(err.msg, "x.npy: ", 7) != 0)
        print_error("rc %d, message \"%s\" (wanted %d, \"%s\")\n", rc, err.msg, code, needle);
    assert_int_equal(rc, code);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.msg, needle));
    assert_memory_equal(err.msg, "x.npy: ", 7);
    /* A failed parse leaves nothing to free. */
    assert_null(a.data);
    assert_int_equal(a.nbytes, 0);
    pjs_npy_free(&a);
}

static void expect_reject_dict(const char *dict, const void *data, size_t nd, const char *needle)
{
    struct blob b;
    craft(&b, 1, dict, data, nd);
    expect_reject(b.b, b.n, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, needle);
}

/* Parses `b` expecting success; the caller frees `a`. */
static void expect_parse(const struct blob *b, pjs_dtype void2_as, pjs_npy *a)
{
    pjs_error err;
    pjs_error_clear(&err);
    int rc = pjs_npy_parse(a, b->b, b->n, void2_as, "x.npy", &err);
    if (rc != 0)
        print_error("parse failed: %s\n", err.msg);
    assert_int_equal(rc, 0);
}

static pjs_shape shape_of(int rank, const int64_t *dims)
{
    pjs_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++)
        s.dims[i] = dims[i];
    return s;
}

/* Saves then loads, checking everything survives; checks the file layout. */
static void round_trip(const struct ctx *c, const char *name, pjs_dtype t, const pjs_shape *s,
                       const void *data, size_t nbytes)
{
    char path[128];
    path_in(c, name, path, sizeof path);
    pjs_error err;
    int rc = pjs_npy_save(path, t, s, data, &err);
    if (rc != 0)
        print_error("save: %s\n", err.msg);
    assert_int_equal(rc, 0);

    char *file;
    size_t size;
    assert_int_equal(pjs_read_file(path, 1u << 20, &file, &size, &err), 0);
    assert_memory_equal(file, "\x93NUMPY\x01\x00", 8);
    size_t hlen = (unsigned char)file[8] | (size_t)(unsigned char)file[9] << 8;
    assert_int_equal((10 + hlen) % 64, 0);
    assert_int_equal(size, 10 + hlen + nbytes);
    assert_int_equal(file[10 + hlen - 1], '\n');
    free(file);

    pjs_npy a;
    rc = pjs_npy_load(&a, path, PJS_DTYPE_BF16, &err);
    if (rc != 0)
        print_error("load: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(a.dtype, t);
    assert_true(pjs_shape_equal(&a.shape, s));
    assert_int_equal(a.nbytes, nbytes);
    if (nbytes > 0)
        assert_memory_equal(a.data, data, nbytes);
    else
        assert_null(a.data);
    pjs_npy_free(&a);
    assert_null(a.data);
}

/* ---- round trips ----------------------------------------------------------- */

static void test_round_trip_every_dtype(void **state)
{
    struct ctx *c = *state;
    const int64_t dims[] = {2, 3};
    pjs_shape s = shape_of(2, dims);
    for (int t = PJS_DTYPE_INVALID + 1; t < PJS_DTYPE_COUNT; t++) {
        if (t == PJS_DTYPE_BYTES)
            continue; /* no .npy form: refused below */
        size_t es = pjs_dtype_size((pjs_dtype)t);
        unsigned char data[6 * 8];
        for (size_t i = 0; i < 6 * es; i++)
            data[i] = t == PJS_DTYPE_BOOL ? (unsigned char)(i % 2) : (unsigned char)(i * 37 + t);
        char name[32];
        snprintf(name, sizeof name, "%s.npy", pjs_dtype_name((pjs_dtype)t));
        round_trip(c, name, (pjs_dtype)t, &s, data, 6 * es);
    }
}

static void test_round_trip_shapes(void **state)
{
    struct ctx *c = *state;
    double scalar = 3.5;
    pjs_shape s0 = {.rank = 0};
    round_trip(c, "scalar.npy", PJS_DTYPE_F64, &s0, &scalar, sizeof scalar);

    const int64_t zero[] = {0, 4};
    pjs_shape sz = shape_of(2, zero);
    round_trip(c, "empty.npy", PJS_DTYPE_F32, &sz, NULL, 0);

    const int64_t one[] = {5};
    int32_t v[5] = {-2, -1, 0, 1, 2};
    pjs_shape s1 = shape_of(1, one);
    round_trip(c, "vec.npy", PJS_DTYPE_I32, &s1, v, sizeof v);

    const int64_t eight[] = {1, 2, 1, 2, 1, 2, 1, 2};
    uint16_t w[16];
    for (int i = 0; i < 16; i++)
        w[i] = (uint16_t)(0x3f80 + i);
    pjs_shape s8 = shape_of(8, eight);
    round_trip(c, "rank8.npy", PJS_DTYPE_BF16, &s8, w, sizeof w);

    /* A large first extent leaves less growth room; alignment must still hold. */
    const int64_t big[] = {123456789012LL, 0};
    pjs_shape sb = shape_of(2, big);
    round_trip(c, "bigdim.npy", PJS_DTYPE_U8, &sb, NULL, 0);
}

/* The exact header we write, so that numpy (and humans) read it as intended. */
static void test_written_header_text(void **state)
{
    struct ctx *c = *state;
    char path[128];
    path_in(c, "hdr.npy", path, sizeof path);
    pjs_error err;
    uint8_t flags[3] = {1, 0, 1};
    const int64_t dims[] = {3};
    pjs_shape s = shape_of(1, dims);
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_BOOL, &s, flags, &err), 0);
    char *file;
    size_t size;
    assert_int_equal(pjs_read_file(path, 4096, &file, &size, &err), 0);
    const char *want = "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }";
    assert_int_equal(size, 128 + 3);
    assert_memory_equal(file + 10, want, strlen(want));
    free(file);

    uint16_t bf[2] = {0x3f80, 0xc000};
    const int64_t d2[] = {1, 2};
    pjs_shape s2 = shape_of(2, d2);
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_BF16, &s2, bf, &err), 0);
    assert_int_equal(pjs_read_file(path, 4096, &file, &size, &err), 0);
    want = "{'descr': '<V2', 'fortran_order': False, 'shape': (1, 2), }";
    assert_memory_equal(file + 10, want, strlen(want));
    free(file);

    float f = 1.0f;
    pjs_shape s0 = {.rank = 0};
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_F32, &s0, &f, &err), 0);
    assert_int_equal(pjs_read_file(path, 4096, &file, &size, &err), 0);
    want = "{'descr': '<f4', 'fortran_order': False, 'shape': (), }";
    assert_memory_equal(file + 10, want, strlen(want));
    free(file);
}

/* ---- header grammar -------------------------------------------------------- */

static void test_version_2_and_3_headers(void **state)
{
    (void)state;
    const int32_t v[3] = {7, 8, 9};
    for (int major = 2; major <= 3; major++) {
        struct blob b;
        craft(&b, major, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", v, sizeof v);
        assert_int_equal(b.n % 64, sizeof v % 64);
        pjs_npy a;
        expect_parse(&b, PJS_DTYPE_INVALID, &a);
        assert_int_equal(a.dtype, PJS_DTYPE_I32);
        assert_int_equal(a.shape.rank, 1);
        assert_int_equal(a.shape.dims[0], 3);
        assert_memory_equal(a.data, v, sizeof v);
        pjs_npy_free(&a);
    }
}

static void test_header_variants_accepted(void **state)
{
    (void)state;
    static const char *const dicts[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}",
        "{'shape': (2, 3,), 'descr': '<f4', 'fortran_order': False}",
        "{'fortran_order':False,'shape':(2,3),'descr':'<f4',}",
        "  {\n 'descr' : '<f4' ,\t'fortran_order' : False , 'shape' : ( 2 , 3 ) , }  \n",
        "{'descr': '=f4', 'fortran_order': False, 'shape': (2L, 3L), }",
    };
    const float v[6] = {1, 2, 3, 4, 5, 6};
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
        struct blob b;
        craft(&b, 1, dicts[i], v, sizeof v);
        pjs_npy a;
        expect_parse(&b, PJS_DTYPE_INVALID, &a);
        assert_int_equal(a.dtype, PJS_DTYPE_F32);
        assert_int_equal(a.shape.rank, 2);
        assert_int_equal(a.shape.dims[0], 2);
        assert_int_equal(a.shape.dims[1], 3);
        assert_memory_equal(a.data, v, sizeof v);
        pjs_npy_free(&a);
    }
}

static void test_scalar_and_empty_parse(void **state)
{
    (void)state;
    struct blob b;
    const int64_t x = -42;
    craft(&b, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", &x, sizeof x);
    pjs_npy a;
    expect_parse(&b, PJS_DTYPE_INVALID, &a);
    assert_int_equal(a.shape.rank, 0);
    assert_int_equal(a.nbytes, 8);
    assert_memory_equal(a.data, &x, 8);
    pjs_npy_free(&a);

    craft(&b, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 0, 9223372036854775807), }",
          NULL, 0);
    expect_parse(&b, PJS_DTYPE_INVALID, &a);
    assert_int_equal(a.shape.rank, 3);
    assert_int_equal(a.nbytes, 0);
    assert_null(a.data);
    pjs_npy_free(&a);
}

static void test_void2_as_bf16(void **state)
{
    (void)state;
    const uint16_t v[2] = {0x3f80, 0x4049};
    static const char *const dicts[] = {
        "{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }",
        "{'descr': '|V2', 'fortran_order': False, 'shape': (2,), }",
    };
    for (size_t i = 0; i < 2; i++) {
        struct blob b;
        craft(&b, 1, dicts[i], v, sizeof v);
        pjs_npy a;
        expect_parse(&b, PJS_DTYPE_BF16, &a);
        assert_int_equal(a.dtype, PJS_DTYPE_BF16);
        assert_memory_equal(a.data, v, sizeof v);
        pjs_npy_free(&a);
        /* Without the caller's bf16, the raw type is refused and explained. */
        expect_reject(b.b, b.n, PJS_DTYPE_INVALID, PJS_ERR_INVALID_ARGUMENT,
                      "header field 'descr'");
        expect_reject(b.b, b.n, PJS_DTYPE_F16, PJS_ERR_INVALID_ARGUMENT, "declares the input bf16");
    }
    /* Other void sizes are never bf16. */
    struct blob b;
    craft(&b, 1, "{'descr': '|V4', 'fortran_order': False, 'shape': (1,), }", v, 4);
    expect_reject(b.b, b.n, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "unsupported dtype '|V4'");
}

/* ---- refusals -------------------------------------------------------------- */

static void test_reject_bad_magic_and_version(void **state)
{
    (void)state;
    struct blob b;
    const float v[1] = {1};
    craft(&b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", v, sizeof v);
    b.b[1] = 'n';
    expect_reject(b.b, b.n, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "bad magic");
    expect_reject("", 0, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "bad magic");
    expect_reject(NULL, 0, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "bad magic");
    expect_reject("PK\x03\x04 this is a zip", 20, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT,
                  "not a .npy file");
    b.b[1] = 'N';
    b.b[6] = 4;
    expect_reject(b.b, b.n, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "version 4.0");
    b.b[6] = 1;
    b.b[7] = 1;
    expect_reject(b.b, b.n, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "version 1.1");
    b.b[6] = 0;
    b.b[7] = 0;
    expect_reject(b.b, b.n, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "version 0.0");
}

static void test_reject_truncated(void **state)
{
    (void)state;
    struct blob b;
    const float v[4] = {1, 2, 3, 4};
    craft(&b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", v, sizeof v);
    /* Every cut: inside the magic, the length, the header, the data. */
    for (size_t n = 0; n < b.n; n++) {
        pjs_npy a;
        pjs_error err;
        assert_int_equal(pjs_npy_parse(&a, b.b, n, PJS_DTYPE_BF16, "x.npy", &err),
                         PJS_ERR_INVALID_ARGUMENT);
        assert_memory_equal(err.msg, "x.npy: ", 7);
    }
    expect_reject(b.b, 9, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "truncated");
    expect_reject(b.b, 40, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "truncated: header");
    expect_reject(b.b, b.n - 1, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "(truncated)");
    /* Version 2 has a 4-byte length. */
    craft(&b, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", v, sizeof v);
    expect_reject(b.b, 11, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "header length");
}

static void test_reject_short_and_trailing_data(void **state)
{
    (void)state;
    const float v[7] = {1, 2, 3, 4, 5, 6, 7};
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    expect_reject_dict(dict, v, 5 * sizeof(float), "needs 24 bytes, the file has 20 (truncated)");
    expect_reject_dict(dict, v, 0, "the file has 0");
    expect_reject_dict(dict, v, 7 * sizeof(float), "the file has 28 (trailing bytes)");
    expect_reject_dict(dict, v, 6 * sizeof(float) + 1, "trailing bytes");
    expect_reject_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", v, 0,
                       "data: shape [] of f32 needs 4 bytes");
}

static void test_reject_fortran_order(void **state)
{
    (void)state;
    const float v[6] = {0};
    expect_reject_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", v, sizeof v,
                       "header field 'fortran_order': Fortran-order arrays are not supported");
    expect_reject_dict("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", v, sizeof v,
                       "header field 'fortran_order': expected True or False");
    expect_reject_dict("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2, 3), }", v, sizeof v,
                       "header field 'fortran_order'");
}

static void test_reject_dtypes(void **state)
{
    (void)state;
    const double v[2] = {0};
    expect_reject_dict("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", v, 8,
                       "header field 'descr': unsupported dtype '>f4' (big-endian)");
    expect_reject_dict("{'descr': '>i8', 'fortran_order': False, 'shape': (2,), }", v, 16,
                       "(big-endian)");
    expect_reject_dict("{'descr': '!u2', 'fortran_order': False, 'shape': (2,), }", v, 4,
                       "(big-endian)");
    expect_reject_dict("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", v, 16,
                       "header field 'descr': unsupported dtype '<c8'");
    expect_reject_dict("{'descr': '>U3', 'fortran_order': False, 'shape': (2,), }", v, 16,
                       "unsupported dtype '>U3' (big-endian)");
    expect_reject_dict("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", v, 16,
                       "unsupported dtype '|O'");
    expect_reject_dict("{'descr': '', 'fortran_order': False, 'shape': (2,), }", v, 16,
                       "unsupported dtype ''");
    /* Untrusted text is shown printable and short. */
    expect_reject_dict("{'descr': '<f\x1b[2J\x01', 'fortran_order': False, 'shape': (2,), }", v,
                       16, "unsupported dtype '<f?[2J?'");
    expect_reject_dict("{'descr': '0123456789012345678901234567890123456789', "
                       "'fortran_order': False, 'shape': (2,), }",
                       v, 16, "unsupported dtype '01234567890123456789012345678901'");
    expect_reject_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", v,
                       8, "header field 'descr': structured dtypes are not supported");
    expect_reject_dict("{'descr': 4, 'fortran_order': False, 'shape': (2,), }", v, 8,
                       "expected a quoted string");
}

static void test_reject_missing_and_extra_keys(void **state)
{
    (void)state;
    const float v[2] = {0};
    expect_reject_dict("{'descr': '<f4', 'fortran_order': False, }", v, 4,
                       "header field 'shape': missing");
    expect_reject_dict("{'shape': (2,), 'fortran_order': False}", v, 8,
                       "header field 'descr': missing");
    expect_reject_dict("{'descr': '<f4', 'shape': (2,)}", v, 8,
                       "header field 'fortran_order': missing");
    expect_reject_dict("{}", v, 0, "header field 'descr': missing");
    expect_reject_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", v, 8,
                       "unexpected key 'x'");
    expect_reject_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
                       v, 8, "header field 'descr': duplicate key");
    expect_reject_dict("{'shape': (2,), 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
                       v, 8, "header field 'shape': duplicate key");
}

static void test_reject_malformed_dict(void **state)
{
    (void)state;
    const float v[2] = {0};
    static const struct {
        const char *dict, *needle;
    } cases[] = {
        {"", "expected '{'"},
        {"[]", "expected '{'"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "expected ':'"},
        {"{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", "expected a quoted string"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "expected ',' or '}'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,),, }", "expected a quoted string"},
        {"{'descr': '<f4\", 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'"},
        {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2,)}", "escapes"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", "unexpected text"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}}", "unexpected text"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "one-element tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "expected a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': 2}", "expected a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}", "expected ',' or ')'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,,)}", "expected an integer"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", "expected an integer"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "negative extent"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (02,)}", "leading zero"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}", "expected ',' or ')'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (0x2,)}", "expected ',' or ')'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,", "expected an integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_reject_dict(cases[i].dict, v, 8, cases[i].needle);
}

static void test_reject_huge_shapes(void **state)
{
    (void)state;
    const float v[2] = {0};
    /* Each extent fits, the byte count does not. */
    expect_reject_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775807,)}",
                       v, 8, "header field 'shape': [9223372036854775807] of f32 overflows");
    expect_reject_dict(
        "{'descr': '|u1', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", v, 8,
        "overflows");
    /* One extent past int64. */
    expect_reject_dict("{'descr': '|u1', 'fortran_order': False, 'shape': (9223372036854775808,)}",
                       v, 8, "header field 'shape': extent does not fit in 64 bits");
    expect_reject_dict(
        "{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999999999999,)}", v,
        8, "does not fit in 64 bits");
    /* Rank 9. */
    expect_reject_dict(
        "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1)}", v, 1,
        "header field 'shape': rank exceeds the maximum of 8");
    /* Rank 8 is fine. */
    struct blob b;
    craft(&b, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 2)}", v,
          2);
    pjs_npy a;
    expect_parse(&b, PJS_DTYPE_INVALID, &a);
    assert_int_equal(a.shape.rank, 8);
    pjs_npy_free(&a);
}

static void test_reject_huge_header(void **state)
{
    (void)state;
    /* The length field alone decides; the bytes need not be there. */
    unsigned char b[64] = "\x93NUMPY\x02\x00";
    uint32_t len = PJS_NPY_MAX_HEADER + 1;
    for (int i = 0; i < 4; i++)
        b[8 + i] = (unsigned char)(len >> (8 * i));
    memset(b + 12, ' ', sizeof b - 12);
    expect_reject(b, sizeof b, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT,
                  "header of 65537 bytes is larger than the 65536 allowed");
    b[8] = b[9] = b[10] = b[11] = 0xff;
    expect_reject(b, sizeof b, PJS_DTYPE_BF16, PJS_ERR_INVALID_ARGUMENT, "larger than");
}

/* ---- load and save errors --------------------------------------------------- */

static void test_load_errors(void **state)
{
    struct ctx *c = *state;
    char path[128];
    pjs_error err;
    pjs_npy a;
    path_in(c, "absent.npy", path, sizeof path);
    assert_int_equal(pjs_npy_load(&a, path, PJS_DTYPE_BF16, &err), PJS_ERR_NOT_FOUND);
    assert_null(a.data);

    path_in(c, "empty-file.npy", path, sizeof path);
    assert_int_equal(pjs_write_file_atomic(path, "", 0, &err), 0);
    assert_int_equal(pjs_npy_load(&a, path, PJS_DTYPE_BF16, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "bad magic"));
    assert_memory_equal(err.msg, path, strlen(path)); /* labelled with the path */

    struct blob b;
    craft(&b, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (), }", "abcd", 4);
    path_in(c, "be.npy", path, sizeof path);
    assert_int_equal(pjs_write_file_atomic(path, b.b, b.n, &err), 0);
    assert_int_equal(pjs_npy_load(&a, path, PJS_DTYPE_BF16, &err), PJS_ERR_INVALID_ARGUMENT);
    char want[256];
    snprintf(want, sizeof want, "%s: header field 'descr': unsupported dtype '>f4' (big-endian)",
             path);
    assert_string_equal(err.msg, want);
}

static void test_save_errors(void **state)
{
    struct ctx *c = *state;
    char path[128];
    pjs_error err;
    const float v[2] = {1, 2};
    const int64_t dims[] = {2};
    pjs_shape s = shape_of(1, dims);

    assert_int_equal(pjs_npy_save("/nonexistent-dir/x.npy", PJS_DTYPE_F32, &s, v, &err),
                     PJS_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/x.npy: cannot create"));

    path_in(c, "bad.npy", path, sizeof path);
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_INVALID, &s, v, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "cannot save dtype 'invalid'"));
    assert_int_equal(pjs_npy_save(path, (pjs_dtype)99, &s, v, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_BYTES, &s, v, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "cannot save dtype 'bytes'"));
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_F32, &s, NULL, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "no data"));
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_F32, NULL, v, &err), PJS_ERR_INVALID_ARGUMENT);
    pjs_shape neg = shape_of(1, (const int64_t[]){-1});
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_F32, &neg, v, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "invalid shape"));
    pjs_shape deep = {.rank = PJS_MAX_RANK + 1};
    assert_int_equal(pjs_npy_save(path, PJS_DTYPE_F32, &deep, v, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(access(path, F_OK), -1); /* nothing was created */

    /* A write the OS refuses (here: past the file-size limit) is an I/O error
     * and leaves neither the file nor the temporary behind. */
    struct rlimit old, small = {4096, 4096};
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    small.rlim_max = old.rlim_max;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    static uint8_t big[8192];
    pjs_shape sbig = shape_of(1, (const int64_t[]){sizeof big});
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = pjs_npy_save(path, PJS_DTYPE_U8, &sbig, big, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(rc, PJS_ERR_IO);
    assert_non_null(strstr(err.msg, "write failed"));
    assert_int_equal(access(path, F_OK), -1);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_int_equal(access(tmp, F_OK), -1);
}

static void test_free_is_safe(void **state)
{
    (void)state;
    pjs_npy a;
    memset(&a, 0, sizeof a);
    pjs_npy_free(&a);
    pjs_npy_free(&a);
    pjs_npy_free(NULL);
}

/* ---- cross-check with numpy ------------------------------------------------ */

/* The arrays the script below also builds, in their raw bytes. */
static const float xf32[6] = {-2.0f, -0.5f, 1.0f, 2.5f, 4.0f, 5.5f};
static const int64_t xi64[5] = {-(1LL << 62), -1, 0, 1, 1LL << 62};
static const uint8_t xbool[6] = {1, 0, 0, 1, 1, 1};
static const uint16_t xbf16[4] = {0x3f80, 0xc020, 0x4049, 0x0000};
static const uint16_t xf16[3] = {0x3800, 0xbc00, 0x7bff};
static const double xscalar = 2.25;

static const char numpy_script[] =
    "import sys, numpy as np, ml_dtypes\n"
    "d, mode = sys.argv[1], sys.argv[2]\n"
    "arrays = {\n"
    "  'f32': (np.arange(6, dtype=np.float32) * 1.5 - 2).reshape(2, 3),\n"
    "  'i64': np.array([-(2**62), -1, 0, 1, 2**62], dtype=np.int64),\n"
    "  'bool': np.array([[True, False], [False, True], [True, True]]),\n"
    "  'bf16': np.array([1.0, -2.5, 3.140625, 0.0], dtype=ml_dtypes.bfloat16),\n"
    "  'f16': np.array([0.5, -1.0, 65504.0], dtype=np.float16),\n"
    "  'scalar': np.array(2.25),\n"
    "  'empty': np.zeros((0, 3), np.int32),\n"
    "}\n"
    "for k, v in arrays.items():\n"
    "    if mode == 'save':\n"
    "        np.save(f'{d}/np_{k}.npy', v)\n"
    "        continue\n"
    "    a = np.load(f'{d}/c_{k}.npy')\n"
    "    if k == 'bf16':\n"
    "        assert a.dtype == np.dtype('V2'), a.dtype\n"
    "        a = a.view(ml_dtypes.bfloat16)\n"
    "    assert a.dtype == v.dtype, (k, a.dtype, v.dtype)\n"
    "    assert a.shape == v.shape, (k, a.shape, v.shape)\n"
    "    assert a.tobytes() == v.tobytes(), k\n"
    "    assert not np.isfortran(a) or a.ndim < 2, k\n";

struct xcase {
    const char *name;
    pjs_dtype t;
    int rank;
    int64_t dims[2];
    const void *data;
    size_t nbytes;
};

static const struct xcase xcases[] = {
    {"f32", PJS_DTYPE_F32, 2, {2, 3}, xf32, sizeof xf32},
    {"i64", PJS_DTYPE_I64, 1, {5}, xi64, sizeof xi64},
    {"bool", PJS_DTYPE_BOOL, 2, {3, 2}, xbool, sizeof xbool},
    {"bf16", PJS_DTYPE_BF16, 1, {4}, xbf16, sizeof xbf16},
    {"f16", PJS_DTYPE_F16, 1, {3}, xf16, sizeof xf16},
    {"scalar", PJS_DTYPE_F64, 0, {0}, &xscalar, sizeof xscalar},
    {"empty", PJS_DTYPE_I32, 2, {0, 3}, NULL, 0},
};

static int run_python(const struct ctx *c, const char *script, const char *mode)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s'", PJS_VENV "/bin/python", script, c->dir, mode);
    return system(cmd);
}

static void test_numpy_cross_check(void **state)
{
    struct ctx *c = *state;
    if (access(PJS_VENV "/bin/python", X_OK) != 0) {
        print_message("no %s; skipping the numpy cross-check\n", PJS_VENV "/bin/python");
        skip();
    }
    char script[128];
    path_in(c, "xcheck.py", script, sizeof script);
    pjs_error err;
    assert_int_equal(pjs_write_file_atomic(script, numpy_script, strlen(numpy_script), &err), 0);
    assert_int_equal(run_python(c, script, "save"), 0);

    for (size_t i = 0; i < sizeof xcases / sizeof xcases[0]; i++) {
        const struct xcase *x = &xcases[i];
        pjs_shape s = shape_of(x->rank, x->dims);
        char np_path[128], c_path[128], name[32];
        snprintf(name, sizeof name, "np_%s.npy", x->name);
        path_in(c, name, np_path, sizeof np_path);
        snprintf(name, sizeof name, "c_%s.npy", x->name);
        path_in(c, name, c_path, sizeof c_path);

        /* We read numpy's file... */
        pjs_npy a;
        int rc = pjs_npy_load(&a, np_path, PJS_DTYPE_BF16, &err);
        if (rc != 0)
            print_error("%s\n", err.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(a.dtype, x->t);
        assert_true(pjs_shape_equal(&a.shape, &s));
        assert_int_equal(a.nbytes, x->nbytes);
        if (x->nbytes > 0)
            assert_memory_equal(a.data, x->data, x->nbytes);
        pjs_npy_free(&a);

        /* ...and write the same bytes numpy does. */
        assert_int_equal(pjs_npy_save(c_path, x->t, &s, x->data, &err), 0);
        char *ours, *theirs;
        size_t ours_n, theirs_n;
        assert_int_equal(pjs_read_file(c_path, 1u << 20, &ours, &ours_n, &err), 0);
        assert_int_equal(pjs_read_file(np_path, 1u << 20, &theirs, &theirs_n, &err), 0);
        assert_int_equal(ours_n, theirs_n);
        assert_memory_equal(ours, theirs, ours_n);
        free(ours);
        free(theirs);
    }
    /* numpy loads what we wrote and finds the same arrays. */
    assert_int_equal(run_python(c, script, "check"), 0);
}

/* ---- strings ------------------------------------------------------------------ */

/* The serialized BYTES form of NUL-free C strings. */
static size_t serialized(const char *const *elems, size_t n, unsigned char *out)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t len = (uint32_t)strlen(elems[i]);
        memcpy(out + at, &len, 4); /* little-endian host */
        memcpy(out + at + 4, elems[i], len);
        at += 4 + len;
    }
    return at;
}

/* "|S3" and "<U2" arrays become BYTES without their NUL padding, unicode
 * as UTF-8; a NUL inside an element stays. */
static void test_strings_read_as_bytes(void **state)
{
    (void)state;
    struct blob b;
    craft(&b, 1, "{'descr': '|S3', 'fortran_order': False, 'shape': (2, 2), }",
          "ab\0\0x\0z\0\0abc", 12);
    pjs_npy a;
    expect_parse(&b, PJS_DTYPE_INVALID, &a);
    assert_int_equal(a.dtype, PJS_DTYPE_BYTES);
    assert_int_equal(a.shape.rank, 2);
    const unsigned char want[] = {2, 0, 0, 0, 'a', 'b', 2, 0, 0, 0, 0, 'x',
                                  1, 0, 0, 0, 'z', 3, 0, 0, 0, 'a', 'b', 'c'};
    assert_int_equal(a.nbytes, sizeof want);
    assert_memory_equal(a.data, want, sizeof want);
    pjs_npy_free(&a);

    /* "é" (U+E9), "" and U+1F600 in <U2 */
    const uint32_t u[] = {0xE9, 0, 0, 0, 0x1F600, 0x41};
    craft(&b, 1, "{'descr': '<U2', 'fortran_order': False, 'shape': (3,), }", u, sizeof u);
    expect_parse(&b, PJS_DTYPE_INVALID, &a);
    const unsigned char want_u[] = {2, 0, 0, 0, 0xC3, 0xA9, 0, 0, 0, 0,
                                    5, 0, 0, 0, 0xF0, 0x9F, 0x98, 0x80, 'A'};
    assert_int_equal(a.nbytes, sizeof want_u);
    assert_memory_equal(a.data, want_u, sizeof want_u);
    pjs_npy_free(&a);

    /* not characters, no width, short data */
    const uint32_t bad[] = {0xD800};
    expect_reject_dict("{'descr': '<U1', 'fortran_order': False, 'shape': (1,), }", bad, 4,
                       "element 0, character 0: U+D800 is not a Unicode scalar value");
    const uint32_t big[] = {0x110000};
    expect_reject_dict("{'descr': '<U1', 'fortran_order': False, 'shape': (1,), }", big, 4,
                       "U+110000");
    expect_reject_dict("{'descr': '|S0', 'fortran_order': False, 'shape': (1,), }", "", 0,
                       "string width in '|S0' must be 1..");
    expect_reject_dict("{'descr': '|S4', 'fortran_order': False, 'shape': (2,), }", "abcdef", 6,
                       "needs 8 bytes, the file has 6 (truncated)");

    /* no elements: a width of two billion characters allocates nothing
     * for them (the fuzzer found a 4.8 GB allocation here) */
    craft(&b, 1, "{'descr': '|U2000000000', 'fortran_order': False, 'shape': (2, 0), }", "", 0);
    expect_parse(&b, PJS_DTYPE_INVALID, &a);
    assert_int_equal(a.dtype, PJS_DTYPE_BYTES);
    assert_int_equal(a.nbytes, 0);
    assert_int_equal(a.shape.rank, 2);
    assert_int_equal(a.shape.dims[1], 0);
    pjs_npy_free(&a);
}

static void test_strings_saved_fixed_width(void **state)
{
    struct ctx *c = *state;
    char path[128];
    path_in(c, "s.npy", path, sizeof path);
    const char *elems[] = {"a", "", "longer", "x\xffy"};
    unsigned char buf[64];
    size_t n = serialized(elems, 4, buf);
    pjs_shape s = {.rank = 2, .dims = {2, 2}};
    pjs_error err;
    assert_int_equal(pjs_npy_save_bytes(path, &s, buf, n, &err), 0);
    pjs_npy a;
    assert_int_equal(pjs_npy_load(&a, path, PJS_DTYPE_INVALID, &err), 0);
    assert_int_equal(a.dtype, PJS_DTYPE_BYTES);
    assert_int_equal(a.nbytes, n);
    assert_memory_equal(a.data, buf, n);
    pjs_npy_free(&a);

    /* a trailing NUL would be lost; counts must agree; the buffer must be well formed */
    const unsigned char nul_end[] = {2, 0, 0, 0, 'a', 0};
    pjs_shape one = {.rank = 1, .dims = {1}};
    assert_int_equal(pjs_npy_save_bytes(path, &one, nul_end, sizeof nul_end, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "string 0 ends with a NUL byte"));
    assert_int_equal(pjs_npy_save_bytes(path, &s, buf, 5, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_npy_save_bytes(path, &one, buf, n, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "the shape holds 1 strings, the data 4"));
}

static const char strings_script[] =
    "import sys, numpy as np\n"
    "d, mode = sys.argv[1], sys.argv[2]\n"
    "s = np.array([[b'ab', b''], [b'\\x00x', b'hello']])\n"
    "u = np.array(['h\\u00e9llo', '', '\\u65e5\\u672c', '\\U0001F600'])\n"
    "if mode == 'save':\n"
    "    np.save(f'{d}/np_s.npy', s); np.save(f'{d}/np_u.npy', u)\n"
    "else:\n"
    "    a = np.load(f'{d}/c_s.npy')\n"
    "    assert a.dtype == s.dtype and (a == s).all(), (a, s)\n"
    "    b = np.load(f'{d}/c_u.npy')\n"
    "    assert [x.decode() for x in b] == list(u), b\n";

/* numpy's own files read as the strings numpy holds, and what we write
 * numpy reads back equal. */
static void test_strings_numpy_cross_check(void **state)
{
    struct ctx *c = *state;
    if (access(PJS_VENV "/bin/python", X_OK) != 0) {
        print_message("no %s; skipping the numpy cross-check\n", PJS_VENV "/bin/python");
        skip();
    }
    char script[128], path[128], out[128];
    path_in(c, "strings.py", script, sizeof script);
    pjs_error err;
    assert_int_equal(
        pjs_write_file_atomic(script, strings_script, strlen(strings_script), &err), 0);
    assert_int_equal(run_python(c, script, "save"), 0);
    const char *s_elems[] = {"ab", "", NULL, "hello"};
    const char *u_elems[] = {"h\xc3\xa9llo", "", "\xe6\x97\xa5\xe6\x9c\xac",
                             "\xf0\x9f\x98\x80"};
    unsigned char want[128];
    for (int k = 0; k < 2; k++) {
        path_in(c, k == 0 ? "np_s.npy" : "np_u.npy", path, sizeof path);
        pjs_npy a;
        assert_int_equal(pjs_npy_load(&a, path, PJS_DTYPE_INVALID, &err), 0);
        assert_int_equal(a.dtype, PJS_DTYPE_BYTES);
        size_t n;
        if (k == 0) {
            n = serialized(s_elems, 2, want);
            const unsigned char nul_x[] = {2, 0, 0, 0, 0, 'x'};
            memcpy(want + n, nul_x, sizeof nul_x);
            n += sizeof nul_x;
            n += serialized(s_elems + 3, 1, want + n);
        } else {
            n = serialized(u_elems, 4, want);
        }
        assert_int_equal(a.nbytes, n);
        assert_memory_equal(a.data, want, n);
        path_in(c, k == 0 ? "c_s.npy" : "c_u.npy", out, sizeof out);
        assert_int_equal(pjs_npy_save_bytes(out, &a.shape, a.data, a.nbytes, &err), 0);
        pjs_npy_free(&a);
    }
    assert_int_equal(run_python(c, script, "check"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_every_dtype, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_round_trip_shapes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_written_header_text, setup_dir, teardown_dir),
        cmocka_unit_test(test_version_2_and_3_headers),
        cmocka_unit_test(test_header_variants_accepted),
        cmocka_unit_test(test_scalar_and_empty_parse),
        cmocka_unit_test(test_void2_as_bf16),
        cmocka_unit_test(test_reject_bad_magic_and_version),
        cmocka_unit_test(test_reject_truncated),
        cmocka_unit_test(test_reject_short_and_trailing_data),
        cmocka_unit_test(test_reject_fortran_order),
        cmocka_unit_test(test_reject_dtypes),
        cmocka_unit_test(test_strings_read_as_bytes),
        cmocka_unit_test_setup_teardown(test_strings_saved_fixed_width, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_strings_numpy_cross_check, setup_dir, teardown_dir),
        cmocka_unit_test(test_reject_missing_and_extra_keys),
        cmocka_unit_test(test_reject_malformed_dict),
        cmocka_unit_test(test_reject_huge_shapes),
        cmocka_unit_test(test_reject_huge_header),
        cmocka_unit_test_setup_teardown(test_load_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_save_errors, setup_dir, teardown_dir),
        cmocka_unit_test(test_free_is_safe),
        cmocka_unit_test_setup_teardown(test_numpy_cross_check, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
