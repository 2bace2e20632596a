/*
 * http_docs.h - what the gateway's HTTP proxy reads and writes of the bytes
 * it relays, with no network: the Prometheus text of several workers merged
 * under a `worker` label, repository indexes and statistics merged, and the
 * sequence id of a REST inference request found without decoding tensors.
 *
 * Worker answers and client bodies are untrusted bytes: every function here
 * bounds its output and skips what it cannot read rather than failing on it
 * (a worker's odd metrics line is dropped, not the whole scrape).
 */
#ifndef PJS_GATEWAY_HTTP_DOCS_H
#define PJS_GATEWAY_HTTP_DOCS_H

#include <jansson.h>
#include <stddef.h>

#include "core/status.h"
#include "frontend/http/http_buf.h"

/* One worker's /metrics answer. */
typedef struct pjs_gw_metrics_text {
    const char *text;
    size_t len;
    unsigned worker; /* the value of the `worker` label its samples get */
} pjs_gw_metrics_text;

/* Appends to out the metrics of every text, grouped by metric family in the
 * order families first appear: each family's HELP and TYPE lines once (the
 * first seen), then its samples from every text in order, each with
 * worker="N" as its first label. Other comments, blank lines and lines that
 * are not samples are left out. RESOURCE_EXHAUSTED past out's limit. */
int pjs_gw_metrics_merge(const pjs_gw_metrics_text *texts, size_t n, pjs_http_buf *out,
                         pjs_error *err);

/* The repository index (a JSON array of {"name", "version", "state",
 * "reason"}) of several workers as one: each name and version once, READY
 * when ready on any worker, else as the first worker that lists it says.
 * Entries that are not objects with a string name are skipped; so are docs
 * that are not arrays. A new reference; NULL: out of memory. */
json_t *pjs_gw_merge_index(json_t *const *docs, size_t n);

/* Statistics documents ({"model_stats": [...]}) of several workers as one:
 * entries of the same name and version summed (counts and durations; the
 * latest last_inference; batch_stats by batch size). A new reference; NULL:
 * out of memory. */
json_t *pjs_gw_merge_stats(json_t *const *docs, size_t n);

/* Finds parameters.sequence_id in the JSON of a REST inference request (its
 * first json_len bytes: the whole body, or Inference-Header-Content-Length
 * of it) by skipping over everything else, tensors included. Copies its
 * text (the digits of a number, the characters of a string) to out and
 * returns 1; 0 when there is none, it is 0 or "", or it does not fit in
 * out; -1 when the bytes are not a JSON object as far as they were read. */
int pjs_gw_sequence_key(const char *json, size_t json_len, char *out, size_t out_size);

#endif
