/*
 * http_buf.h - a growable byte buffer with a hard size limit.
 *
 * Every body the HTTP front end assembles (request bodies, JSON documents,
 * responses with binary tensors, metrics text) grows in one of these, so no
 * client can make the server allocate more than the limit it was created
 * with. A buffer belongs to one thread at a time; it is plain memory.
 */
#ifndef PJS_FRONTEND_HTTP_HTTP_BUF_H
#define PJS_FRONTEND_HTTP_HTTP_BUF_H

#include <stddef.h>

#include "core/status.h"

typedef struct pjs_http_buf {
    char *data;   /* malloc'd; NUL-terminated when len < cap (appends keep it so) */
    size_t len;   /* bytes written */
    size_t cap;   /* bytes allocated */
    size_t limit; /* len never exceeds this */
} pjs_http_buf;

/* An empty buffer that refuses to grow beyond `limit` bytes. */
void pjs_http_buf_init(pjs_http_buf *b, size_t limit);
void pjs_http_buf_free(pjs_http_buf *b);
/* Hands the bytes to the caller (who frees them) and empties the buffer. */
char *pjs_http_buf_take(pjs_http_buf *b, size_t *out_len);

/* Makes room for `extra` more bytes. RESOURCE_EXHAUSTED past the limit,
 * NOMEM when malloc fails. */
int pjs_http_buf_reserve(pjs_http_buf *b, size_t extra, pjs_error *err);
int pjs_http_buf_append(pjs_http_buf *b, const void *bytes, size_t n, pjs_error *err);
/* Appends the NUL-terminated string s (without its NUL). */
int pjs_http_buf_append_str(pjs_http_buf *b, const char *s, pjs_error *err);
int pjs_http_buf_printf(pjs_http_buf *b, pjs_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Appends s as a JSON string literal (quotes and escapes included); bytes
 * that are not UTF-8 become U+FFFD, so the result is always valid JSON. */
int pjs_http_buf_json_string(pjs_http_buf *b, const char *s, pjs_error *err);

#endif
