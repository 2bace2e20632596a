/*
 * http_buf.c - the bounded growable buffer (see http_buf.h).
 */
#include "frontend/http/http_buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pjs_http_buf_init(pjs_http_buf *b, size_t limit)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->limit = limit;
}

void pjs_http_buf_free(pjs_http_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

char *pjs_http_buf_take(pjs_http_buf *b, size_t *out_len)
{
    char *data = b->data;
    *out_len = b->len;
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    return data;
}

int pjs_http_buf_reserve(pjs_http_buf *b, size_t extra, pjs_error *err)
{
    if (extra > b->limit || b->len > b->limit - extra)
        return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                             "a message would exceed the limit of %zu bytes", b->limit);
    size_t need = b->len + extra + 1; /* room for a terminating NUL */
    if (need <= b->cap)
        return 0;
    /* Double (amortised appends), but never past the limit, and take exactly
     * what a first large reservation asks for (a declared body length). */
    size_t cap = b->cap < 128 ? 256 : b->cap * 2;
    if (cap < need)
        cap = need;
    if (b->limit < SIZE_MAX && cap > b->limit + 1)
        cap = b->limit + 1;
    char *data = realloc(b->data, cap);
    if (data == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory growing a %zu-byte buffer", cap);
    b->data = data;
    b->cap = cap;
    return 0;
}

int pjs_http_buf_append(pjs_http_buf *b, const void *bytes, size_t n, pjs_error *err)
{
    int rc = pjs_http_buf_reserve(b, n, err);
    if (rc != 0)
        return rc;
    if (n > 0)
        memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int pjs_http_buf_append_str(pjs_http_buf *b, const char *s, pjs_error *err)
{
    return pjs_http_buf_append(b, s, strlen(s), err);
}

int pjs_http_buf_printf(pjs_http_buf *b, pjs_error *err, const char *fmt, ...)
{
    char small[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "bad format \"%s\"", fmt);
    if ((size_t)n < sizeof small)
        return pjs_http_buf_append(b, small, (size_t)n, err);
    int rc = pjs_http_buf_reserve(b, (size_t)n, err);
    if (rc != 0)
        return rc;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (1 to 4), or 0 when the bytes
 * there are not one (overlong forms and surrogates included). */
static size_t utf8_sequence_length(const unsigned char *p)
{
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

/* The JSON escape of a byte that cannot appear raw in a string: a quote, a
 * backslash, a control character, or (0) a byte that is not UTF-8. */
static void json_escape(unsigned char c, size_t utf8_length, char out[8])
{
    if (utf8_length == 0)
        strcpy(out, "\\ufffd"); /* U+FFFD REPLACEMENT CHARACTER */
    else if (c == '"' || c == '\\')
        snprintf(out, 8, "\\%c", c);
    else if (c == '\n' || c == '\r' || c == '\t')
        snprintf(out, 8, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : 't');
    else
        snprintf(out, 8, "\\u%04x", c);
}

int pjs_http_buf_json_string(pjs_http_buf *b, const char *s, pjs_error *err)
{
    int rc = pjs_http_buf_append_str(b, "\"", err);
    const unsigned char *p = (const unsigned char *)s;
    const unsigned char *run = p; /* start of the bytes not yet copied */
    while (rc == 0 && *p != '\0') {
        size_t n = utf8_sequence_length(p);
        if (n > 1 || (n == 1 && *p >= 0x20 && *p != '"' && *p != '\\')) {
            p += n;
            continue;
        }
        char escape[8];
        json_escape(*p, n, escape);
        rc = pjs_http_buf_append(b, run, (size_t)(p - run), err);
        if (rc == 0)
            rc = pjs_http_buf_append_str(b, escape, err);
        run = ++p;
    }
    if (rc == 0)
        rc = pjs_http_buf_append(b, run, (size_t)(p - run), err);
    if (rc == 0)
        rc = pjs_http_buf_append_str(b, "\"", err);
    return rc;
}
