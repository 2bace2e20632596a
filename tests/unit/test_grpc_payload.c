/*
 * test_grpc_payload.c - unit tests of the gRPC front end's bounded reading of
 * received messages (src/frontend/grpc/payload.c): plain messages within and
 * past the limit, gzip and deflate messages inflated exactly (also across
 * slices), a bomb stopped at the limit without inflating the rest, and each
 * kind of corrupt compressed data refused as INVALID_ARGUMENT.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <zlib.h>

#include "frontend/grpc/internal.h"

/* Compresses src in gzip (gzip true) or zlib (deflate) framing into a
 * malloc'd buffer; its length goes to *out_len. */
static unsigned char *compress_bytes(const void *src, size_t len, bool gzip, size_t *out_len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    assert_int_equal(deflateInit2(&z, 9, Z_DEFLATED, gzip ? 16 + MAX_WBITS : MAX_WBITS, 8,
                                  Z_DEFAULT_STRATEGY),
                     Z_OK);
    size_t cap = deflateBound(&z, (uLong)len) + 64;
    unsigned char *out = malloc(cap);
    assert_non_null(out);
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    *out_len = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

/* A received message of `len` bytes cut into `pieces` slices, marked as
 * compressed with `alg` (GRPC_COMPRESS_NONE: plain). */
static grpc_byte_buffer *message(const unsigned char *bytes, size_t len, size_t pieces,
                                 grpc_compression_algorithm alg)
{
    grpc_slice slices[8];
    assert_true(pieces >= 1 && pieces <= 8);
    size_t at = 0;
    for (size_t i = 0; i < pieces; i++) {
        size_t n = i + 1 == pieces ? len - at : len / pieces;
        slices[i] = grpc_slice_from_copied_buffer((const char *)bytes + at, n);
        at += n;
    }
    grpc_byte_buffer *bb = grpc_raw_compressed_byte_buffer_create(slices, pieces, alg);
    for (size_t i = 0; i < pieces; i++)
        grpc_slice_unref(slices[i]);
    return bb;
}

/* pjs__grpc_take_payload on one message; the slice (when rc is 0) is
 * compared with want[want_len]. */
static int take(grpc_byte_buffer *bb, size_t limit, const void *want, size_t want_len,
                pjs_error *err)
{
    grpc_slice out;
    int rc = pjs__grpc_take_payload(&bb, limit, &out, err);
    assert_null(bb); /* consumed whatever happened */
    if (rc == 0) {
        assert_int_equal(GRPC_SLICE_LENGTH(out), want_len);
        if (want_len > 0)
            assert_memory_equal(GRPC_SLICE_START_PTR(out), want, want_len);
    } else {
        assert_int_equal(GRPC_SLICE_LENGTH(out), 0);
    }
    grpc_slice_unref(out);
    return rc;
}

/* Text that compresses, long enough to span several inflate rounds. */
static unsigned char *sample(size_t len)
{
    unsigned char *p = malloc(len);
    assert_non_null(p);
    for (size_t i = 0; i < len; i++)
        p[i] = (unsigned char)("0123456789abcdef"[i % 16] ^ (i / 4096));
    return p;
}

static void plain_message_within_and_past_the_limit(void **state)
{
    (void)state;
    pjs_error err;
    unsigned char *bytes = sample(1000);
    assert_int_equal(take(message(bytes, 1000, 3, GRPC_COMPRESS_NONE), 1000, bytes, 1000, &err),
                     0);
    assert_int_equal(take(message(bytes, 1000, 1, GRPC_COMPRESS_NONE), 999, NULL, 0, &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "--max-request-bytes"));
    grpc_slice out;
    grpc_byte_buffer *none = NULL;
    assert_int_equal(pjs__grpc_take_payload(&none, 10, &out, &err), 0);
    assert_int_equal(GRPC_SLICE_LENGTH(out), 0);
    free(bytes);
}

static void gzip_and_deflate_inflate_exactly(void **state)
{
    (void)state;
    pjs_error err;
    size_t len = 300000, zlen;
    unsigned char *bytes = sample(len);
    for (int gzip = 0; gzip <= 1; gzip++) {
        unsigned char *z = compress_bytes(bytes, len, gzip, &zlen);
        grpc_compression_algorithm alg = gzip ? GRPC_COMPRESS_GZIP : GRPC_COMPRESS_DEFLATE;
        for (size_t pieces = 1; pieces <= 5; pieces += 2)
            assert_int_equal(take(message(z, zlen, pieces, alg), len, bytes, len, &err), 0);
        /* one byte short of the inflated size */
        assert_int_equal(take(message(z, zlen, 2, alg), len - 1, NULL, 0, &err),
                         PJS_ERR_RESOURCE_EXHAUSTED);
        free(z);
    }
    free(bytes);
}

static void a_bomb_stops_at_the_limit(void **state)
{
    (void)state;
    pjs_error err;
    size_t len = 256u << 20, zlen; /* 256 MiB of zeros: about 256 KB compressed */
    unsigned char *zeros = calloc(1, len);
    assert_non_null(zeros);
    unsigned char *z = compress_bytes(zeros, len, true, &zlen);
    free(zeros);
    assert_true(zlen < len / 500);
    assert_int_equal(take(message(z, zlen, 4, GRPC_COMPRESS_GZIP), 1u << 20, NULL, 0, &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "once decompressed"));
    free(z);
}

static void corrupt_compressed_data_is_refused(void **state)
{
    (void)state;
    pjs_error err;
    size_t len = 50000, zlen;
    unsigned char *bytes = sample(len);
    unsigned char *z = compress_bytes(bytes, len, true, &zlen);

    /* not compressed at all */
    assert_int_equal(take(message(bytes, 100, 1, GRPC_COMPRESS_GZIP), len, NULL, 0, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    /* cut short */
    assert_int_equal(take(message(z, zlen / 2, 2, GRPC_COMPRESS_GZIP), len, NULL, 0, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "ends before"));
    /* bytes after the end of the stream, in the same slice and in a later one */
    unsigned char *longer = malloc(zlen + 7);
    assert_non_null(longer);
    memcpy(longer, z, zlen);
    memcpy(longer + zlen, "garbage", 7);
    assert_int_equal(take(message(longer, zlen + 7, 1, GRPC_COMPRESS_GZIP), len, NULL, 0, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "after the end"));
    grpc_slice two[2] = {grpc_slice_from_copied_buffer((const char *)z, zlen),
                         grpc_slice_from_copied_buffer("x", 1)};
    grpc_byte_buffer *bb = grpc_raw_compressed_byte_buffer_create(two, 2, GRPC_COMPRESS_GZIP);
    grpc_slice_unref(two[0]);
    grpc_slice_unref(two[1]);
    assert_int_equal(take(bb, len, NULL, 0, &err), PJS_ERR_INVALID_ARGUMENT);
    /* a flipped byte in the middle of the deflate data */
    longer[zlen / 2] ^= 0x5a;
    int rc = take(message(longer, zlen, 1, GRPC_COMPRESS_GZIP), len, NULL, 0, &err);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    /* gzip bytes announced as deflate */
    assert_int_equal(take(message(z, zlen, 1, GRPC_COMPRESS_DEFLATE), len, NULL, 0, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    free(longer);
    free(z);
    free(bytes);
}

static int setup(void **state)
{
    (void)state;
    grpc_init();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    grpc_shutdown();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_message_within_and_past_the_limit),
        cmocka_unit_test(gzip_and_deflate_inflate_exactly),
        cmocka_unit_test(a_bomb_stops_at_the_limit),
        cmocka_unit_test(corrupt_compressed_data_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
