/*
 * fuzz_gateway_http.c - libFuzzer driver for what the gateway's HTTP proxy
 * reads of relayed bytes (src/gateway/http_docs.c).
 *
 * Input: one selector byte (modulo 4) then the bytes:
 *   0  a REST inference request's JSON for pjs_gw_sequence_key: a key found
 *      is non-empty, NUL-terminated within the buffer and never "0";
 *   1  metrics texts of up to four workers (split at NUL bytes) for
 *      pjs_gw_metrics_merge with a small output bound: 0 or
 *      RESOURCE_EXHAUSTED, the output within the bound, and every line
 *      written a HELP or TYPE line or a sample carrying worker="N";
 *   2  repository indexes of up to four workers (split at NUL bytes, each
 *      parsed as JSON when it is) for pjs_gw_merge_index: an array whose
 *      entries have string names, each name and version once;
 *   3  statistics documents likewise for pjs_gw_merge_stats: an object
 *      with a model_stats array.
 * Anything else aborts. Seeds: fuzz/corpus/fuzz_gateway_http/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/http_docs.h"

#define MAX_PARTS 4
#define METRICS_LIMIT 4096

/* Splits data at NUL bytes into at most MAX_PARTS parts. */
static size_t split(const char *data, size_t size, const char **parts, size_t *lens)
{
    size_t n = 0;
    const char *p = data, *end = data + size;
    while (n < MAX_PARTS && p <= end) {
        const char *nul = memchr(p, '\0', (size_t)(end - p));
        const char *stop = nul && n + 1 < MAX_PARTS ? nul : end;
        parts[n] = p;
        lens[n++] = (size_t)(stop - p);
        p = stop + 1;
    }
    return n;
}

static void sequence(const char *data, size_t size)
{
    char key[16];
    int rc = pjs_gw_sequence_key(data, size, key, sizeof key);
    if (rc < -1 || rc > 1)
        abort();
    if (rc == 1 && (memchr(key, '\0', sizeof key) == NULL || key[0] == '\0' ||
                    strcmp(key, "0") == 0))
        abort();
}

/* Whether line is a HELP/TYPE line or a sample whose labels start with worker="N". */
static int well_formed(const char *line, size_t len)
{
    if (len >= 7 && (memcmp(line, "# HELP ", 7) == 0 || memcmp(line, "# TYPE ", 7) == 0))
        return 1;
    const char *brace = memchr(line, '{', len);
    return brace != NULL && (size_t)(line + len - brace) > 9 &&
           memcmp(brace, "{worker=\"", 9) == 0;
}

static void metrics(const char *data, size_t size)
{
    const char *parts[MAX_PARTS];
    size_t lens[MAX_PARTS];
    size_t n = split(data, size, parts, lens);
    pjs_gw_metrics_text texts[MAX_PARTS];
    for (size_t i = 0; i < n; i++)
        texts[i] = (pjs_gw_metrics_text){parts[i], lens[i], (unsigned)i};
    pjs_http_buf out;
    pjs_error err;
    pjs_http_buf_init(&out, METRICS_LIMIT);
    int rc = pjs_gw_metrics_merge(texts, n, &out, &err);
    if ((rc != 0 && rc != PJS_ERR_RESOURCE_EXHAUSTED) || out.len > METRICS_LIMIT)
        abort();
    for (size_t at = 0; rc == 0 && at < out.len;) {
        const char *nl = memchr(out.data + at, '\n', out.len - at);
        if (nl == NULL || !well_formed(out.data + at, (size_t)(nl - (out.data + at))))
            abort();
        at = (size_t)(nl - out.data) + 1;
    }
    pjs_http_buf_free(&out);
}

static void documents(const char *data, size_t size, int stats)
{
    const char *parts[MAX_PARTS];
    size_t lens[MAX_PARTS];
    size_t n = split(data, size, parts, lens);
    json_t *docs[MAX_PARTS];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *doc = json_loadb(parts[i], lens[i], JSON_DECODE_ANY, NULL);
        if (doc != NULL)
            docs[k++] = doc;
    }
    json_t *merged = stats ? pjs_gw_merge_stats(docs, k) : pjs_gw_merge_index(docs, k);
    if (merged == NULL)
        abort(); /* no allocation fails at these sizes */
    json_t *list = stats ? json_object_get(merged, "model_stats") : merged;
    if (!json_is_array(list))
        abort();
    size_t i, j;
    json_t *e, *f;
    json_array_foreach(list, i, e) {
        if (!json_is_string(json_object_get(e, "name")))
            abort();
        json_array_foreach(list, j, f) {
            if (j > i && json_equal(json_object_get(e, "name"), json_object_get(f, "name")) &&
                json_equal(json_object_get(e, "version"), json_object_get(f, "version")))
                abort();
        }
    }
    json_decref(merged);
    for (size_t d = 0; d < k; d++)
        json_decref(docs[d]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const char *bytes = (const char *)data + 1;
    size_t len = size - 1;
    switch (data[0] % 4) {
    case 0: sequence(bytes, len); break;
    case 1: metrics(bytes, len); break;
    case 2: documents(bytes, len, 0); break;
    default: documents(bytes, len, 1); break;
    }
    return 0;
}
