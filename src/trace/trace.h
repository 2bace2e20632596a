/*
 * trace.h - per-request traces: W3C trace context in, spans out over
 * OTLP/HTTP (JSON) to a collector.
 *
 * A request may arrive with a `traceparent` (HTTP header, gRPC metadata):
 * the trace it belongs to and the caller's span. pjserve records the
 * request as a server span that is a child of that span, and the stages
 * inside it (decode, queue, execution, hooks, a meta's sub-calls, encode) as
 * children of that; what it calls (the gateway's worker, a meta's sub-model)
 * gets a traceparent naming the span it is called from. Spans are recorded
 * once finished, from timestamps the request already keeps, so a request
 * that is not sampled costs one branch.
 *
 * Sampling is decided once per trace, where it starts: a request with a
 * traceparent follows its sampled flag (the caller decided); one without is
 * sampled at the tracer's rate. Everything it calls inherits the decision.
 *
 * Export never touches a request's path: pjs_tracer_emit copies the span
 * into a bounded queue (a full queue drops the span and counts it), and one
 * thread per tracer batches queued spans into OTLP/HTTP JSON
 * (https://opentelemetry.io/docs/specs/otlp/#otlphttp: ids as hex, times as
 * decimal strings of Unix nanoseconds) and POSTs them to the collector with
 * libcurl, a batch at least every PJS_TRACE_FLUSH_MS or when
 * PJS_TRACE_BATCH_SPANS are queued. A failed POST drops its batch and counts
 * it. Every function here may be called from any thread.
 */
#ifndef PJS_TRACE_TRACE_H
#define PJS_TRACE_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define PJS_TRACE_ID_SIZE 16
#define PJS_SPAN_ID_SIZE 8
/* "00-" 32 hex "-" 16 hex "-" 2 hex */
#define PJS_TRACEPARENT_LEN 55

#define PJS_TRACE_FLUSH_MS 200
#define PJS_TRACE_BATCH_SPANS 512
/* How long pjs_tracer_destroy goes on exporting what is queued. */
#define PJS_TRACE_FLUSH_AT_EXIT_MS 3000
/* Default bound of the export queue, spans. */
#define PJS_TRACE_DEFAULT_QUEUE 8192

/* A span's place in its trace: the trace, the span's id, and its parent's
 * (all zero for the trace's root). A traceparent carries the first two: as
 * parsed, span_id is the caller's span. */
typedef struct pjs_trace_ctx {
    uint8_t trace_id[PJS_TRACE_ID_SIZE];
    uint8_t span_id[PJS_SPAN_ID_SIZE];
    uint8_t parent_id[PJS_SPAN_ID_SIZE];
    bool valid;   /* trace_id and span_id set (not all zero) */
    bool sampled; /* spans under it are recorded */
} pjs_trace_ctx;

/* Parses a traceparent value (W3C Trace Context: "00-" trace id "-" parent
 * id "-" flags, lower-case hex; a later version's first four fields when
 * longer, as the specification says). False, *out zeroed, for anything
 * else: wrong lengths or separators, upper-case or non-hex digits, version
 * ff, all-zero ids, trailing bytes after a version 00 value. Never reads
 * past len. */
bool pjs_trace_parse(const char *value, size_t len, pjs_trace_ctx *out);
/* ctx (valid) as a version 00 traceparent: PJS_TRACEPARENT_LEN characters
 * and a NUL. */
void pjs_trace_format(const pjs_trace_ctx *ctx, char out[PJS_TRACEPARENT_LEN + 1]);
/* Random non-zero ids. */
void pjs_trace_new_trace_id(uint8_t out[PJS_TRACE_ID_SIZE]);
void pjs_trace_new_span_id(uint8_t out[PJS_SPAN_ID_SIZE]);
/* A child context: the same trace and decision, a new span id, parent_id
 * the parent's span id. */
void pjs_trace_child(const pjs_trace_ctx *parent, pjs_trace_ctx *out);

/* OTLP span kinds. */
typedef enum {
    PJS_SPAN_INTERNAL = 1,
    PJS_SPAN_SERVER = 2,
    PJS_SPAN_CLIENT = 3,
} pjs_span_kind;

#define PJS_SPAN_NAME_MAX 96
#define PJS_SPAN_TEXT_MAX 160
#define PJS_SPAN_MAX_ATTRS 8

typedef struct pjs_span_attr {
    const char *key; /* a string literal ("pjserve.batch_rows") */
    bool is_int;
    int64_t int_value;
    char text[PJS_SPAN_TEXT_MAX]; /* when !is_int; cut at the limit */
} pjs_span_attr;

/* A finished span. Times are CLOCK_MONOTONIC nanoseconds (pjs_now_ns); the
 * tracer turns them into Unix time. */
typedef struct pjs_span {
    uint8_t trace_id[PJS_TRACE_ID_SIZE];
    uint8_t span_id[PJS_SPAN_ID_SIZE];
    uint8_t parent_id[PJS_SPAN_ID_SIZE]; /* all zero: a root span */
    char name[PJS_SPAN_NAME_MAX];
    pjs_span_kind kind;
    uint64_t start_ns, end_ns;
    bool error;                          /* status ERROR, with status_message */
    char status_message[PJS_SPAN_TEXT_MAX];
    size_t n_attrs;
    pjs_span_attr attrs[PJS_SPAN_MAX_ATTRS];
} pjs_span;

/* Makes s a child span of `parent` (its trace, parent = parent->span_id)
 * with a new span id, the name (cut at PJS_SPAN_NAME_MAX - 1), kind and
 * times (an end before the start is taken as the start). */
void pjs_span_init(pjs_span *s, const pjs_trace_ctx *parent, pjs_span_kind kind,
                   const char *name, uint64_t start_ns, uint64_t end_ns);
/* Makes s the span of ctx itself (span_id and parent_id from ctx): a span
 * whose id was handed on before it ended, as a request's server span is to
 * its children. */
void pjs_span_init_self(pjs_span *s, const pjs_trace_ctx *ctx, pjs_span_kind kind,
                        const char *name, uint64_t start_ns, uint64_t end_ns);
/* Attributes past PJS_SPAN_MAX_ATTRS are left out. */
void pjs_span_attr_int(pjs_span *s, const char *key, int64_t value);
void pjs_span_attr_str(pjs_span *s, const char *key, const char *value);
void pjs_span_set_error(pjs_span *s, const char *message);

typedef struct pjs_tracer pjs_tracer;

typedef struct pjs_tracer_options {
    /* The collector's OTLP/HTTP traces URL ("http://127.0.0.1:4318/v1/traces").
     * Required. */
    const char *endpoint;
    const char *service_name; /* resource attribute service.name ("pjserve") */
    const char *instance;     /* service.instance.id, or NULL */
    double rate;              /* share of traces started here that are sampled, 0..1 */
    size_t queue_spans;       /* 0: PJS_TRACE_DEFAULT_QUEUE */
} pjs_tracer_options;

/* Checks the options (an http:// or https:// endpoint; a rate in 0..1) and
 * starts the export thread. */
int pjs_tracer_create(const pjs_tracer_options *o, pjs_tracer **out, pjs_error *err);
/* Exports what is queued (for at most PJS_TRACE_FLUSH_AT_EXIT_MS, or until a
 * batch fails; the rest is dropped and counted), stops the thread and frees.
 * NULL is a no-op. */
void pjs_tracer_destroy(pjs_tracer *t);

/* The sampling decision for a request that arrived with `incoming` (NULL,
 * or not valid: none). Sets *ctx to the context its spans are recorded
 * under, a child of incoming (same trace, new span id: the request's own
 * server span) or a new trace, and returns ctx->sampled. With t NULL
 * (tracing off): *ctx is not sampled and false is returned. */
bool pjs_tracer_start(pjs_tracer *t, const pjs_trace_ctx *incoming, pjs_trace_ctx *ctx);
/* For a process that relays the request (a gateway): pjs_tracer_start,
 * then *forward, a child of *ctx whose traceparent the callee gets. A
 * request that is not sampled and came without a trace gets one, so that
 * the decision travels all the same. */
void pjs_tracer_start_relay(pjs_tracer *t, const pjs_trace_ctx *incoming, pjs_trace_ctx *ctx,
                            pjs_trace_ctx *forward);
/* The rate of new traces (TraceSetting): 0..1; the options' at first. */
double pjs_tracer_rate(const pjs_tracer *t);
void pjs_tracer_set_rate(pjs_tracer *t, double rate);
/* Whether anything is traced (TraceSetting's trace_level; on at first):
 * off, pjs_tracer_start samples nothing, a caller's decision included. */
bool pjs_tracer_enabled(const pjs_tracer *t);
void pjs_tracer_set_enabled(pjs_tracer *t, bool enabled);

/* ---- Triton's trace settings (TraceSetting, /v2/trace/setting) ------------------
 * trace_level ["OFF"] or ["TIMESTAMPS"]; trace_rate "N": one request in N
 * (a rate of 1/N); trace_count "-1", log_frequency "0", trace_file "" and
 * trace_mode "opentelemetry" are what pjserve does and the only values
 * accepted. Settings are server-wide. */

/* One setting as a client sends it: no values clears it (back to the
 * start-up value). */
typedef struct pjs_trace_setting_in {
    const char *key;
    const char *const *values;
    size_t n_values;
} pjs_trace_setting_in;

/* One setting as reported: a list (trace_level) or a single string. */
typedef struct pjs_trace_setting_out {
    const char *key;
    bool is_list;
    char value[32];
} pjs_trace_setting_out;
#define PJS_TRACE_SETTINGS 6

/* Checks every setting, then applies them all (none when one is refused).
 * t NULL (no --trace-endpoint): only clearing, trace_level OFF and the
 * values that hold are accepted. model non-empty: UNSUPPORTED. Errors:
 * INVALID_ARGUMENT for an unknown key or a bad value, UNSUPPORTED for what
 * pjserve does not do (tensors, a trace file, Triton's own trace mode,
 * a trace count, tracing without a collector). */
int pjs_trace_settings_update(pjs_tracer *t, const char *model, const pjs_trace_setting_in *in,
                              size_t n, pjs_error *err);
/* The same from Triton's JSON body (each setting a string, a list of
 * strings, or null to clear it; an empty body changes nothing). */
int pjs_trace_settings_update_json(pjs_tracer *t, const char *model, const char *body,
                                   size_t len, pjs_error *err);
/* The current settings into out; returns PJS_TRACE_SETTINGS. */
size_t pjs_trace_settings_current(const pjs_tracer *t,
                                  pjs_trace_setting_out out[PJS_TRACE_SETTINGS]);

/* Queues a copy of s for export; never blocks (see top). No-op with t
 * NULL. */
void pjs_tracer_emit(pjs_tracer *t, const pjs_span *s);

typedef struct pjs_tracer_counters {
    uint64_t exported;      /* spans the collector accepted (HTTP 2xx) */
    uint64_t dropped_full;  /* spans dropped because the queue was full */
    uint64_t dropped_failed; /* spans of batches the collector refused or did not answer */
} pjs_tracer_counters;
void pjs_tracer_get_counters(pjs_tracer *t, pjs_tracer_counters *out);

/* Encodes spans[0..n) as one OTLP ExportTraceServiceRequest in JSON
 * (resource attributes from the options) into a malloc'd NUL-terminated
 * string; NULL when out of memory. Exposed for tests. */
char *pjs_trace_encode_otlp_json(const pjs_tracer_options *o, const pjs_span *spans, size_t n,
                                 int64_t unix_minus_monotonic_ns);

#endif
