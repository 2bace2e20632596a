/*
 * payload.c - a received message as one contiguous run of bytes, inflated
 * here under a byte limit when the client compressed it, and the charge of
 * inference requests to the server's budget for request bytes in flight.
 *
 * gRPC 1.51 checks its maximum receive size against the compressed message
 * and then inflates it with no bound (a 1.6 MB gzip message became 4 GiB).
 * The front end therefore turns the library's decompression off
 * (GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, frontend.c): compressed
 * messages arrive as they were sent, marked with their algorithm, and are
 * inflated here into a buffer that grows with the bytes produced and stops
 * one byte past the limit. Any CQ or completion thread may call these.
 */
#include "frontend/grpc/internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <zlib.h>

/* First size of the inflate buffer, as a multiple of the compressed size. */
#define PAYLOAD_FIRST_GUESS 4

static void free_inflated(void *buf, size_t len)
{
    (void)len;
    free(buf);
}

static int too_large(size_t limit, pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                         "the message is larger than the limit of %zu bytes once decompressed "
                         "(inference requests: --max-request-bytes)",
                         limit);
}

/* Feeds one compressed slice to z, growing *buf (capacity *cap, at most
 * limit + 1 bytes) as output comes. */
static int inflate_slice(z_stream *z, grpc_slice in, size_t limit, uint8_t **buf, size_t *cap,
                         size_t *used, int *zrc, pjs_error *err)
{
    z->next_in = GRPC_SLICE_START_PTR(in);
    z->avail_in = (uInt)GRPC_SLICE_LENGTH(in); /* a slice of a message is < 2 GiB */
    while (z->avail_in > 0 && *zrc != Z_STREAM_END) {
        if (*used == *cap) {
            if (*cap > limit)
                return too_large(limit, err);
            size_t grown = *cap > (limit + 1) / 2 ? limit + 1 : *cap * 2;
            uint8_t *more = realloc(*buf, grown);
            if (more == NULL)
                return pjs_error_set(err, PJS_ERR_NOMEM,
                                     "no memory to decompress a message of %zu bytes", grown);
            *buf = more;
            *cap = grown;
        }
        size_t room = *cap - *used;
        z->next_out = *buf + *used;
        z->avail_out = room > UINT_MAX ? UINT_MAX : (uInt)room;
        uInt before_out = z->avail_out, before_in = z->avail_in;
        *zrc = inflate(z, Z_NO_FLUSH);
        *used += before_out - z->avail_out;
        bool stuck = z->avail_out == before_out && z->avail_in == before_in;
        if ((*zrc != Z_OK && *zrc != Z_STREAM_END && *zrc != Z_BUF_ERROR) || stuck)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "the message is not valid compressed data (%s)",
                                 z->msg != NULL ? z->msg : "corrupt stream");
    }
    if (*used > limit)
        return too_large(limit, err);
    if (*zrc == Z_STREAM_END && z->avail_in > 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "the message has bytes after the end of its compressed data");
    return 0;
}

/* Inflates a gzip or deflate message into one slice of at most limit bytes. */
static int inflate_payload(grpc_byte_buffer *bb, size_t limit, grpc_slice *out, pjs_error *err)
{
    grpc_compression_algorithm alg = bb->data.raw.compression;
    if (alg != GRPC_COMPRESS_GZIP && alg != GRPC_COMPRESS_DEFLATE)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "message compression algorithm %d is not supported (use gzip, "
                             "deflate or none)",
                             (int)alg);
    z_stream z;
    memset(&z, 0, sizeof z);
    /* gzip framing, or deflate in the zlib format, as gRPC sends them */
    if (inflateInit2(&z, alg == GRPC_COMPRESS_GZIP ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory to decompress a message");
    size_t in_len = grpc_byte_buffer_length(bb);
    size_t cap = in_len > limit / PAYLOAD_FIRST_GUESS ? limit + 1
                                                      : in_len * PAYLOAD_FIRST_GUESS + 1;
    uint8_t *buf = malloc(cap);
    size_t used = 0;
    int zrc = Z_OK, rc = 0;
    grpc_slice_buffer *in = &bb->data.raw.slice_buffer;
    if (buf == NULL)
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "no memory to decompress a message");
    for (size_t i = 0; rc == 0 && i < in->count; i++) {
        if (zrc == Z_STREAM_END && GRPC_SLICE_LENGTH(in->slices[i]) > 0)
            rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                               "the message has bytes after the end of its compressed data");
        else
            rc = inflate_slice(&z, in->slices[i], limit, &buf, &cap, &used, &zrc, err);
    }
    if (rc == 0 && zrc != Z_STREAM_END)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "the compressed message ends before its compressed data does");
    inflateEnd(&z);
    if (rc != 0 || used == 0) {
        free(buf);
        *out = grpc_empty_slice();
        return rc;
    }
    *out = grpc_slice_new_with_len(buf, used, free_inflated);
    return 0;
}

int pjs__grpc_take_payload(grpc_byte_buffer **bb, size_t limit, grpc_slice *out, pjs_error *err)
{
    int rc = 0;
    *out = grpc_empty_slice();
    if (*bb == NULL)
        return 0;
    if ((*bb)->data.raw.compression != GRPC_COMPRESS_NONE) {
        rc = inflate_payload(*bb, limit, out, err);
    } else if (grpc_byte_buffer_length(*bb) > limit) {
        rc = too_large(limit, err);
    } else {
        grpc_byte_buffer_reader reader;
        if (grpc_byte_buffer_reader_init(&reader, *bb)) {
            *out = grpc_byte_buffer_reader_readall(&reader);
            grpc_byte_buffer_reader_destroy(&reader);
        }
    }
    grpc_byte_buffer_destroy(*bb);
    *bb = NULL;
    return rc;
}

size_t pjs__grpc_small_limit(const pjs_grpc_frontend *f)
{
    return f->max_message < PJS_GRPC_UNARY_ARENA_LIMIT ? f->max_message
                                                       : PJS_GRPC_UNARY_ARENA_LIMIT;
}

int pjs__grpc_take_request(pjs_grpc_frontend *f, grpc_byte_buffer **bb, grpc_slice *out,
                           uint64_t *charged, pjs_error *err)
{
    int rc = pjs__grpc_take_payload(bb, f->max_message, out, err);
    if (rc != 0)
        return rc;
    uint64_t n = GRPC_SLICE_LENGTH(*out);
    rc = pjs_byte_budget_take_or_fail(f->budget, n, "the inference request", err);
    if (rc != 0) {
        grpc_slice_unref(*out);
        *out = grpc_empty_slice();
        return rc;
    }
    *charged = n;
    return 0;
}

void pjs__grpc_release_request(pjs_grpc_frontend *f, uint64_t *charged)
{
    if (*charged == 0)
        return;
    pjs_byte_budget_give(f->budget, *charged);
    *charged = 0;
}
