/*
 * bytes.c - the serialized form of BYTES tensors (see bytes.h).
 *
 * Lengths are read and written byte by byte, little-endian whatever the
 * host, and every comparison is made against the bytes left, never by
 * adding to a pointer first, so a length near 2^32 cannot wrap.
 */
#include "core/bytes.h"

#include <string.h>

static uint32_t read_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int pjs_bytes_count(const void *data, size_t nbytes, uint64_t *count, pjs_error *err)
{
    const unsigned char *base = data;
    size_t offset = 0;
    uint64_t n = 0;
    *count = 0;
    while (offset < nbytes) {
        size_t left = nbytes - offset;
        if (left < PJS_BYTES_PREFIX)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "malformed BYTES data: element %llu starts at offset %zu but "
                                 "only %zu bytes are left, too few for its 4-byte length",
                                 (unsigned long long)n, offset, left);
        uint32_t len = read_le32(base + offset);
        if (len > left - PJS_BYTES_PREFIX)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "malformed BYTES data: element %llu at offset %zu has length "
                                 "%lu but only %zu bytes are left after its 4-byte length",
                                 (unsigned long long)n, offset, (unsigned long)len,
                                 left - PJS_BYTES_PREFIX);
        offset += PJS_BYTES_PREFIX + (size_t)len;
        n++;
    }
    *count = n;
    return 0;
}

pjs_bytes_reader pjs_bytes_reader_init(const void *data, size_t nbytes)
{
    pjs_bytes_reader r = {NULL, NULL};
    if (data != NULL) {
        r.at = data;
        r.end = r.at + nbytes;
    }
    return r;
}

bool pjs_bytes_next(pjs_bytes_reader *r, const unsigned char **data, uint32_t *len)
{
    size_t left = (size_t)(r->end - r->at);
    if (left < PJS_BYTES_PREFIX)
        return false;
    uint32_t n = read_le32(r->at);
    if (n > left - PJS_BYTES_PREFIX)
        return false;
    *data = r->at + PJS_BYTES_PREFIX;
    *len = n;
    r->at += PJS_BYTES_PREFIX + (size_t)n;
    return true;
}

bool pjs_bytes_add_size(size_t *total, size_t len)
{
    if (len > PJS_BYTES_MAX_ELEMENT || *total > SIZE_MAX - PJS_BYTES_PREFIX ||
        len > SIZE_MAX - PJS_BYTES_PREFIX - *total)
        return false;
    *total += PJS_BYTES_PREFIX + len;
    return true;
}

pjs_bytes_writer pjs_bytes_writer_init(void *buf, size_t size)
{
    pjs_bytes_writer w = {NULL, NULL};
    if (buf != NULL) {
        w.at = buf;
        w.end = w.at + size;
    }
    return w;
}

bool pjs_bytes_put(pjs_bytes_writer *w, const void *data, size_t len)
{
    size_t left = (size_t)(w->end - w->at);
    if (len > PJS_BYTES_MAX_ELEMENT || left < PJS_BYTES_PREFIX || len > left - PJS_BYTES_PREFIX)
        return false;
    w->at[0] = (unsigned char)len;
    w->at[1] = (unsigned char)(len >> 8);
    w->at[2] = (unsigned char)(len >> 16);
    w->at[3] = (unsigned char)(len >> 24);
    if (len > 0)
        memcpy(w->at + PJS_BYTES_PREFIX, data, len);
    w->at += PJS_BYTES_PREFIX + len;
    return true;
}
