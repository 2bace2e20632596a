/*
 * fuzz_bytes.c - libFuzzer driver for the decoders of string (BYTES)
 * tensors: the serialized form (src/core/bytes.c) and REST JSON strings
 * (pjs_http_bytes_from_json / pjs_http_bytes_to_json in
 * src/frontend/http/http_codec.c).
 *
 * The input is read two ways. As a serialized buffer: pjs_bytes_count
 * either fails with a message, and then the reader stops short of the end,
 * or counts n elements, and then the reader yields exactly n and ends at
 * the end, and writing them again gives the same bytes. As JSON text: when
 * it parses and its strings convert, the result counts as many elements as
 * there were strings, and writing it back as JSON and parsing that gives
 * the same strings in the same order (jansson only hands out valid UTF-8,
 * so the bytes-as-they-are encoding stays valid JSON here). A broken
 * invariant aborts.
 *
 * Seeds: fuzz/corpus/fuzz_bytes/ (serialized buffers, well formed and not,
 * and JSON lists of strings, nested, with escapes and NUL characters).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "frontend/http/http_codec.h"

static void check_serialized(const uint8_t *data, size_t size)
{
    uint64_t count = 0;
    pjs_error err;
    pjs_error_clear(&err);
    int rc = pjs_bytes_count(size > 0 ? data : NULL, size, &count, &err);
    pjs_bytes_reader r = pjs_bytes_reader_init(size > 0 ? data : NULL, size);
    const unsigned char *s;
    uint32_t len;
    uint64_t seen = 0;
    size_t total = 0;
    while (pjs_bytes_next(&r, &s, &len)) {
        if (s < data || len > size || s + len > data + size || !pjs_bytes_add_size(&total, len))
            abort();
        seen++;
    }
    if (rc != 0) {
        if (rc != PJS_ERR_INVALID_ARGUMENT || err.msg[0] == '\0' || r.at == r.end)
            abort();
        return;
    }
    if (seen != count || r.at != r.end || total != size)
        abort();
    unsigned char *copy = malloc(size > 0 ? size : 1);
    if (copy == NULL)
        abort();
    pjs_bytes_writer w = pjs_bytes_writer_init(copy, size);
    r = pjs_bytes_reader_init(size > 0 ? data : NULL, size);
    while (pjs_bytes_next(&r, &s, &len))
        if (!pjs_bytes_put(&w, s, len))
            abort();
    if (w.at != w.end || (size > 0 && memcmp(copy, data, size) != 0))
        abort();
    free(copy);
}

/* The strings of a (nested) JSON list, flattened, into out[]. */
static void flatten(const json_t *v, json_t *out)
{
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            flatten(json_array_get(v, i), out);
        return;
    }
    json_array_append(out, (json_t *)v);
}

static void check_json(const uint8_t *data, size_t size)
{
    json_t *doc = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (doc == NULL)
        return;
    void *buf = NULL;
    size_t nbytes = 0, count = 0;
    pjs_error err;
    pjs_error_clear(&err);
    if (pjs_http_bytes_from_json(doc, "input \"fuzz\"", &buf, &nbytes, &count, &err) != 0) {
        if (err.msg[0] == '\0' || buf != NULL)
            abort();
        json_decref(doc);
        return;
    }
    uint64_t counted = 0;
    if (pjs_bytes_count(buf, nbytes, &counted, &err) != 0 || counted != count)
        abort();
    pjs_http_buf text;
    pjs_http_buf_init(&text, 64u << 20);
    if (pjs_http_bytes_to_json(&text, buf, nbytes, &err) != 0)
        abort();
    json_t *back = json_loadb(text.data, text.len, JSON_ALLOW_NUL, NULL);
    json_t *strings = json_array();
    if (back == NULL || strings == NULL)
        abort();
    flatten(doc, strings);
    if (json_array_size(back) != count || !json_equal(back, strings))
        abort();
    json_decref(strings);
    json_decref(back);
    pjs_http_buf_free(&text);
    free(buf);
    json_decref(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_serialized(data, size);
    check_json(data, size);
    return 0;
}
