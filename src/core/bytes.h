/*
 * bytes.h - BYTES tensors (KServe strings) in their serialized form.
 *
 * Inside pjserve a BYTES tensor is one buffer: each element a 4-byte
 * little-endian length followed by that many bytes, elements back to back,
 * nothing before, between or after them (Triton's serialization, which raw
 * gRPC contents, binary HTTP and shared memory carry as they are). Front
 * ends turn typed gRPC `bytes_contents` and REST JSON strings into this form
 * with the writer below, and read it back with the reader.
 *
 * A buffer from a client is checked with pjs_bytes_count before anything
 * reads it element by element; the reader itself never reads past the end
 * either way. Pure functions over caller-owned memory; any thread.
 */
#ifndef PJS_CORE_BYTES_H
#define PJS_CORE_BYTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Bytes of an element's length prefix. */
#define PJS_BYTES_PREFIX 4u
/* Longest element the prefix can express. */
#define PJS_BYTES_MAX_ELEMENT UINT32_MAX

/* Counts the elements of data[nbytes] into *count (0 for an empty buffer).
 * INVALID_ARGUMENT when the buffer is not well formed: a length prefix cut
 * short by the end, or a length running past the end; the message says
 * which element, at which offset, its length and the bytes left. The
 * caller prefixes the model and tensor. data may be NULL when nbytes is 0. */
int pjs_bytes_count(const void *data, size_t nbytes, uint64_t *count, pjs_error *err);

/* Walks a well-formed buffer element by element:
 *
 *     pjs_bytes_reader r = pjs_bytes_reader_init(data, nbytes);
 *     const unsigned char *s; uint32_t len;
 *     while (pjs_bytes_next(&r, &s, &len)) ...
 *
 * pjs_bytes_next returns false at the end, or where the rest is malformed
 * (then r.at < r.end). */
typedef struct pjs_bytes_reader {
    const unsigned char *at, *end;
} pjs_bytes_reader;

pjs_bytes_reader pjs_bytes_reader_init(const void *data, size_t nbytes);
bool pjs_bytes_next(pjs_bytes_reader *r, const unsigned char **data, uint32_t *len);

/* Adds the serialized size of one element of `len` bytes to *total. False
 * (total unchanged) when len exceeds PJS_BYTES_MAX_ELEMENT or the sum would
 * overflow a size_t. */
bool pjs_bytes_add_size(size_t *total, size_t len);

/* Writes elements into a buffer sized with pjs_bytes_add_size:
 *
 *     pjs_bytes_writer w = pjs_bytes_writer_init(buf, total);
 *     pjs_bytes_put(&w, s, len);   (for each element)
 *
 * pjs_bytes_put returns false and writes nothing when the element does not
 * fit what is left or is longer than PJS_BYTES_MAX_ELEMENT. */
typedef struct pjs_bytes_writer {
    unsigned char *at, *end;
} pjs_bytes_writer;

pjs_bytes_writer pjs_bytes_writer_init(void *buf, size_t size);
bool pjs_bytes_put(pjs_bytes_writer *w, const void *data, size_t len);

#endif
