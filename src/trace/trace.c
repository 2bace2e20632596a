/*
 * trace.c - trace context, spans, and their export over OTLP/HTTP JSON.
 *
 * The export queue is a ring of pjs_span copies under one mutex; emit
 * copies in (or counts a drop) and signals the exporter when a batch is
 * full. The exporter thread wakes at least every PJS_TRACE_FLUSH_MS, takes
 * up to PJS_TRACE_BATCH_SPANS spans out under the lock, encodes and POSTs
 * them without it. Ids come from a per-thread xorshift generator seeded
 * from getrandom, so making ids takes no lock and no system call.
 */
#include "trace/trace.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/log.h"
#include "core/thread_name.h"

/* ---- trace context ------------------------------------------------------------- */

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* upper case is not allowed by the specification */
}

/* n bytes from 2n lower-case hex digits; false on any other character. */
static bool parse_hex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

static bool all_zero(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0)
            return false;
    return true;
}

bool pjs_trace_parse(const char *value, size_t len, pjs_trace_ctx *out)
{
    memset(out, 0, sizeof *out);
    if (value == NULL || len < PJS_TRACEPARENT_LEN)
        return false;
    uint8_t version, flags;
    pjs_trace_ctx c = {0};
    if (!parse_hex(value, &version, 1) || version == 0xff || value[2] != '-' ||
        !parse_hex(value + 3, c.trace_id, PJS_TRACE_ID_SIZE) || value[35] != '-' ||
        !parse_hex(value + 36, c.span_id, PJS_SPAN_ID_SIZE) || value[52] != '-' ||
        !parse_hex(value + 53, &flags, 1))
        return false;
    /* version 00 is exactly 55 characters; a later one may append fields
     * after a '-' */
    if (len > PJS_TRACEPARENT_LEN && (version == 0 || value[PJS_TRACEPARENT_LEN] != '-'))
        return false;
    if (all_zero(c.trace_id, PJS_TRACE_ID_SIZE) || all_zero(c.span_id, PJS_SPAN_ID_SIZE))
        return false;
    c.valid = true;
    c.sampled = (flags & 1) != 0;
    *out = c;
    return true;
}

static void put_hex(char *dst, const uint8_t *b, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        dst[2 * i] = digits[b[i] >> 4];
        dst[2 * i + 1] = digits[b[i] & 15];
    }
}

void pjs_trace_format(const pjs_trace_ctx *ctx, char out[PJS_TRACEPARENT_LEN + 1])
{
    memcpy(out, "00-", 3);
    put_hex(out + 3, ctx->trace_id, PJS_TRACE_ID_SIZE);
    out[35] = '-';
    put_hex(out + 36, ctx->span_id, PJS_SPAN_ID_SIZE);
    out[52] = '-';
    out[53] = '0';
    out[54] = ctx->sampled ? '1' : '0';
    out[55] = '\0';
}

/* xorshift64*, one state per thread, seeded once from the kernel. */
static uint64_t next_random(void)
{
    static _Thread_local uint64_t state;
    while (state == 0) {
        if (getrandom(&state, sizeof state, 0) != (ssize_t)sizeof state) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            state = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)&ts;
        }
    }
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dULL;
}

static void random_bytes(uint8_t *out, size_t n)
{
    do {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t r = next_random();
            memcpy(out + i, &r, n - i < 8 ? n - i : 8);
        }
    } while (all_zero(out, n));
}

void pjs_trace_new_trace_id(uint8_t out[PJS_TRACE_ID_SIZE])
{
    random_bytes(out, PJS_TRACE_ID_SIZE);
}

void pjs_trace_new_span_id(uint8_t out[PJS_SPAN_ID_SIZE])
{
    random_bytes(out, PJS_SPAN_ID_SIZE);
}

void pjs_trace_child(const pjs_trace_ctx *parent, pjs_trace_ctx *out)
{
    *out = *parent;
    memcpy(out->parent_id, parent->span_id, PJS_SPAN_ID_SIZE);
    pjs_trace_new_span_id(out->span_id);
}

/* ---- spans ------------------------------------------------------------------------ */

static void copy_text(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src != NULL ? src : "");
}

static void span_init(pjs_span *s, const uint8_t *trace_id, const uint8_t *span_id,
                      const uint8_t *parent_id, pjs_span_kind kind, const char *name,
                      uint64_t start_ns, uint64_t end_ns)
{
    memset(s, 0, offsetof(pjs_span, attrs));
    memcpy(s->trace_id, trace_id, PJS_TRACE_ID_SIZE);
    memcpy(s->span_id, span_id, PJS_SPAN_ID_SIZE);
    memcpy(s->parent_id, parent_id, PJS_SPAN_ID_SIZE);
    copy_text(s->name, sizeof s->name, name);
    s->kind = kind;
    s->start_ns = start_ns;
    s->end_ns = end_ns > start_ns ? end_ns : start_ns;
}

void pjs_span_init(pjs_span *s, const pjs_trace_ctx *parent, pjs_span_kind kind,
                   const char *name, uint64_t start_ns, uint64_t end_ns)
{
    uint8_t id[PJS_SPAN_ID_SIZE];
    pjs_trace_new_span_id(id);
    span_init(s, parent->trace_id, id, parent->span_id, kind, name, start_ns, end_ns);
}

void pjs_span_init_self(pjs_span *s, const pjs_trace_ctx *ctx, pjs_span_kind kind,
                        const char *name, uint64_t start_ns, uint64_t end_ns)
{
    span_init(s, ctx->trace_id, ctx->span_id, ctx->parent_id, kind, name, start_ns, end_ns);
}

void pjs_span_attr_int(pjs_span *s, const char *key, int64_t value)
{
    if (s->n_attrs >= PJS_SPAN_MAX_ATTRS)
        return;
    pjs_span_attr *a = &s->attrs[s->n_attrs++];
    a->key = key;
    a->is_int = true;
    a->int_value = value;
}

void pjs_span_attr_str(pjs_span *s, const char *key, const char *value)
{
    if (s->n_attrs >= PJS_SPAN_MAX_ATTRS)
        return;
    pjs_span_attr *a = &s->attrs[s->n_attrs++];
    a->key = key;
    a->is_int = false;
    copy_text(a->text, sizeof a->text, value);
}

void pjs_span_set_error(pjs_span *s, const char *message)
{
    s->error = true;
    copy_text(s->status_message, sizeof s->status_message, message);
}

/* ---- OTLP/HTTP JSON ---------------------------------------------------------------
 *
 * Written straight into one growing buffer, not through a JSON library's
 * tree: a traced request makes about eight spans, and building a tree of
 * them cost as much CPU as the request. Strings are escaped for JSON and
 * made valid UTF-8 (a client's request id may hold anything): each byte
 * that does not start a well-formed sequence becomes U+FFFD. */

typedef struct out_buf {
    char *data;
    size_t len, cap;
    bool failed; /* out of memory: the text is incomplete */
} out_buf;

static void put(out_buf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (d == NULL) {
            b->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void put_str(out_buf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* The length of the well-formed UTF-8 sequence at s (n bytes left), or 0. */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 0;
    if (len == 0 || len > n || s[0] > 0xf4 || (len == 2 && s[0] < 0xc2))
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((len == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (len == 3 && s[0] == 0xed && s[1] > 0x9f) ||
        (len == 4 && s[0] == 0xf0 && s[1] < 0x90) || (len == 4 && s[0] == 0xf4 && s[1] > 0x8f))
        return 0; /* overlong, a surrogate, or past U+10FFFF */
    return len;
}

/* s as a JSON string, quoted. */
static void put_json_string(out_buf *b, const char *s)
{
    put(b, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            put(b, esc, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put_str(b, esc);
            i++;
        } else if (c < 0x80) {
            size_t run = i;
            while (run < n && p[run] >= 0x20 && p[run] < 0x7f && p[run] != '"' && p[run] != '\\')
                run++;
            put(b, (const char *)p + i, run - i);
            i = run;
        } else {
            size_t len = utf8_sequence(p + i, n - i);
            if (len == 0) {
                put_str(b, "\\ufffd");
                i++;
            } else {
                put(b, (const char *)p + i, len);
                i += len;
            }
        }
    }
    put(b, "\"", 1);
}

static void put_hex_string(out_buf *b, const uint8_t *id, size_t n)
{
    char text[2 * PJS_TRACE_ID_SIZE + 2];
    text[0] = '"';
    put_hex(text + 1, id, n);
    text[2 * n + 1] = '"';
    put(b, text, 2 * n + 2);
}

/* OTLP/JSON writes 64-bit integers as decimal strings. */
static void put_u64_string(out_buf *b, uint64_t v)
{
    char text[24];
    int n = snprintf(text, sizeof text, "\"%" PRIu64 "\"", v);
    put(b, text, (size_t)n);
}

static void put_key_string(out_buf *b, const char *key, const char *value)
{
    put_str(b, "{\"key\":");
    put_json_string(b, key);
    put_str(b, ",\"value\":{\"stringValue\":");
    put_json_string(b, value);
    put_str(b, "}}");
}

static void put_span(out_buf *b, const pjs_span *s, int64_t unix_minus_monotonic_ns)
{
    put_str(b, "{\"traceId\":");
    put_hex_string(b, s->trace_id, PJS_TRACE_ID_SIZE);
    put_str(b, ",\"spanId\":");
    put_hex_string(b, s->span_id, PJS_SPAN_ID_SIZE);
    if (!all_zero(s->parent_id, PJS_SPAN_ID_SIZE)) {
        put_str(b, ",\"parentSpanId\":");
        put_hex_string(b, s->parent_id, PJS_SPAN_ID_SIZE);
    }
    put_str(b, ",\"name\":");
    put_json_string(b, s->name);
    char kind[16];
    snprintf(kind, sizeof kind, ",\"kind\":%d", (int)s->kind);
    put_str(b, kind);
    put_str(b, ",\"startTimeUnixNano\":");
    put_u64_string(b, (uint64_t)((int64_t)s->start_ns + unix_minus_monotonic_ns));
    put_str(b, ",\"endTimeUnixNano\":");
    put_u64_string(b, (uint64_t)((int64_t)s->end_ns + unix_minus_monotonic_ns));
    put_str(b, ",\"attributes\":[");
    for (size_t i = 0; i < s->n_attrs; i++) {
        const pjs_span_attr *a = &s->attrs[i];
        if (i > 0)
            put(b, ",", 1);
        if (!a->is_int) {
            put_key_string(b, a->key, a->text);
            continue;
        }
        put_str(b, "{\"key\":");
        put_json_string(b, a->key);
        char v[48];
        snprintf(v, sizeof v, ",\"value\":{\"intValue\":\"%" PRId64 "\"}}", a->int_value);
        put_str(b, v);
    }
    put_str(b, "],\"status\":");
    if (s->error) {
        put_str(b, "{\"code\":2,\"message\":");
        put_json_string(b, s->status_message);
        put_str(b, "}}");
    } else {
        put_str(b, "{\"code\":0}}");
    }
}

char *pjs_trace_encode_otlp_json(const pjs_tracer_options *o, const pjs_span *spans, size_t n,
                                 int64_t unix_minus_monotonic_ns)
{
    out_buf b = {0};
    put_str(&b, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    put_key_string(&b, "service.name", o->service_name ? o->service_name : "pjserve");
    if (o->instance != NULL) {
        put(&b, ",", 1);
        put_key_string(&b, "service.instance.id", o->instance);
    }
    put_str(&b, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"pjserve\"},\"spans\":[");
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            put(&b, ",", 1);
        put_span(&b, &spans[i], unix_minus_monotonic_ns);
    }
    put_str(&b, "]}]}]}");
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

/* ---- the tracer ------------------------------------------------------------------- */

struct pjs_tracer {
    pjs_tracer_options options;
    char *endpoint, *service_name, *instance; /* owned copies */
    _Atomic uint64_t rate_bits;               /* the rate, a double's bits */
    atomic_bool enabled;
    int64_t unix_minus_monotonic_ns;

    pthread_mutex_t lock;
    pthread_cond_t wake;
    pjs_span *ring;
    size_t cap, head, count;
    bool stopping;
    pthread_t thread;

    _Atomic uint64_t exported, dropped_full, dropped_failed;
    pjs_log_limiter failure_log; /* a collector down: one line a second */
};

static uint64_t double_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

double pjs_tracer_rate(const pjs_tracer *t)
{
    if (t == NULL)
        return 0;
    uint64_t b = atomic_load_explicit(&((pjs_tracer *)t)->rate_bits, memory_order_relaxed);
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

void pjs_tracer_set_rate(pjs_tracer *t, double rate)
{
    rate = rate < 0 ? 0 : rate > 1 ? 1 : rate;
    atomic_store_explicit(&t->rate_bits, double_bits(rate), memory_order_relaxed);
}

bool pjs_tracer_enabled(const pjs_tracer *t)
{
    return t != NULL && atomic_load_explicit(&((pjs_tracer *)t)->enabled, memory_order_relaxed);
}

void pjs_tracer_set_enabled(pjs_tracer *t, bool enabled)
{
    atomic_store_explicit(&t->enabled, enabled, memory_order_relaxed);
}

bool pjs_tracer_start(pjs_tracer *t, const pjs_trace_ctx *incoming, pjs_trace_ctx *ctx)
{
    if (!pjs_tracer_enabled(t)) {
        memset(ctx, 0, sizeof *ctx);
        return false;
    }
    if (incoming != NULL && incoming->valid) {
        pjs_trace_child(incoming, ctx);
        ctx->sampled = t != NULL && incoming->sampled;
        return ctx->sampled;
    }
    memset(ctx, 0, sizeof *ctx); /* a root: parent_id zero */
    double rate = pjs_tracer_rate(t);
    /* 53 random bits against the rate: exactly 0 and 1 at the ends */
    if (t == NULL || rate <= 0 || (rate < 1 && (double)(next_random() >> 11) >= rate * 0x1p53))
        return false;
    pjs_trace_new_trace_id(ctx->trace_id);
    pjs_trace_new_span_id(ctx->span_id);
    ctx->valid = ctx->sampled = true;
    return true;
}

void pjs_tracer_start_relay(pjs_tracer *t, const pjs_trace_ctx *incoming, pjs_trace_ctx *ctx,
                            pjs_trace_ctx *forward)
{
    pjs_tracer_start(t, incoming, ctx);
    if (!ctx->valid) {
        pjs_trace_new_trace_id(ctx->trace_id);
        pjs_trace_new_span_id(ctx->span_id);
        ctx->valid = true;
    }
    pjs_trace_child(ctx, forward);
}

void pjs_tracer_emit(pjs_tracer *t, const pjs_span *s)
{
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    if (t->count == t->cap) {
        pthread_mutex_unlock(&t->lock);
        atomic_fetch_add_explicit(&t->dropped_full, 1, memory_order_relaxed);
        return;
    }
    t->ring[(t->head + t->count) % t->cap] = *s;
    t->count++;
    if (t->count == PJS_TRACE_BATCH_SPANS)
        pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
}

void pjs_tracer_get_counters(pjs_tracer *t, pjs_tracer_counters *out)
{
    memset(out, 0, sizeof *out);
    if (t == NULL)
        return;
    out->exported = atomic_load(&t->exported);
    out->dropped_full = atomic_load(&t->dropped_full);
    out->dropped_failed = atomic_load(&t->dropped_failed);
}

static size_t discard_body(void *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

/* POSTs one batch; true when the collector answered 2xx. */
static bool post_batch(pjs_tracer *t, CURL *curl, const pjs_span *spans, size_t n)
{
    char *body = pjs_trace_encode_otlp_json(&t->options, spans, n, t->unix_minus_monotonic_ns);
    if (body == NULL)
        return false;
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_URL, t->endpoint);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard_body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    if (rc == CURLE_OK)
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    free(body);
    bool ok = rc == CURLE_OK && status >= 200 && status < 300;
    if (!ok && rc != CURLE_OK)
        pjs_log_limited(&t->failure_log, PJS_LOG_WARN,
                        "traces: cannot export to the collector at %s (%s): %zu spans dropped",
                        t->endpoint, curl_easy_strerror(rc), n);
    else if (!ok)
        pjs_log_limited(&t->failure_log, PJS_LOG_WARN,
                        "traces: the collector at %s answered HTTP %ld: %zu spans dropped",
                        t->endpoint, status, n);
    return ok;
}

static int64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *exporter_main(void *arg)
{
    pjs_tracer *t = arg;
    pjs_thread_name(pthread_self(), "pjs-trace");
    CURL *curl = curl_easy_init();
    pjs_span *batch = malloc(PJS_TRACE_BATCH_SPANS * sizeof *batch);
    int64_t stop_by = 0; /* when stopping: the end of the last flush's time */
    pthread_mutex_lock(&t->lock);
    for (;;) {
        if (t->count < PJS_TRACE_BATCH_SPANS && !t->stopping) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += PJS_TRACE_FLUSH_MS * 1000000L;
            until.tv_sec += until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&t->wake, &t->lock, &until);
        }
        if (t->count == 0 && t->stopping)
            break;
        size_t n = t->count < PJS_TRACE_BATCH_SPANS ? t->count : PJS_TRACE_BATCH_SPANS;
        for (size_t i = 0; batch != NULL && i < n; i++)
            batch[i] = t->ring[(t->head + i) % t->cap];
        t->head = (t->head + n) % t->cap;
        t->count -= n;
        if (n == 0)
            continue;
        pthread_mutex_unlock(&t->lock);
        bool ok = batch != NULL && curl != NULL && post_batch(t, curl, batch, n);
        atomic_fetch_add(ok ? &t->exported : &t->dropped_failed, n);
        pthread_mutex_lock(&t->lock);
        if (t->stopping && stop_by == 0)
            stop_by = clock_ns(CLOCK_MONOTONIC) + PJS_TRACE_FLUSH_AT_EXIT_MS * 1000000LL;
        /* exiting: a collector that failed or is slow does not hold it up */
        if (t->stopping && (!ok || clock_ns(CLOCK_MONOTONIC) > stop_by)) {
            atomic_fetch_add(&t->dropped_failed, t->count);
            t->count = 0;
        }
    }
    pthread_mutex_unlock(&t->lock);
    free(batch);
    if (curl != NULL)
        curl_easy_cleanup(curl);
    return NULL;
}

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void free_tracer(pjs_tracer *t)
{
    free(t->ring);
    free(t->endpoint);
    free(t->service_name);
    free(t->instance);
    free(t);
}

int pjs_tracer_create(const pjs_tracer_options *o, pjs_tracer **out, pjs_error *err)
{
    if (o->endpoint == NULL ||
        (strncmp(o->endpoint, "http://", 7) != 0 && strncmp(o->endpoint, "https://", 8) != 0))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "trace endpoint \"%s\": give the collector's OTLP/HTTP traces URL, "
                             "e.g. http://127.0.0.1:4318/v1/traces",
                             o->endpoint ? o->endpoint : "");
    if (!(o->rate >= 0 && o->rate <= 1))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "trace rate %g: give the share of requests to trace, 0 to 1",
                             o->rate);
    static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
    pthread_once(&curl_once, curl_init_once);
    pjs_tracer *t = calloc(1, sizeof *t);
    if (t == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    t->cap = o->queue_spans ? o->queue_spans : PJS_TRACE_DEFAULT_QUEUE;
    t->ring = calloc(t->cap, sizeof *t->ring);
    t->endpoint = strdup(o->endpoint);
    t->service_name = strdup(o->service_name ? o->service_name : "pjserve");
    t->instance = o->instance ? strdup(o->instance) : NULL;
    if (t->ring == NULL || t->endpoint == NULL || t->service_name == NULL ||
        (o->instance != NULL && t->instance == NULL)) {
        free_tracer(t);
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    }
    t->options = *o;
    t->options.endpoint = t->endpoint;
    t->options.service_name = t->service_name;
    t->options.instance = t->instance;
    pjs_tracer_set_rate(t, o->rate);
    atomic_init(&t->enabled, true);
    t->unix_minus_monotonic_ns = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->wake, NULL);
    if (pthread_create(&t->thread, NULL, exporter_main, t) != 0) {
        pthread_mutex_destroy(&t->lock);
        pthread_cond_destroy(&t->wake);
        free_tracer(t);
        return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot start the trace exporter thread");
    }
    *out = t;
    return 0;
}

void pjs_tracer_destroy(pjs_tracer *t)
{
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    t->stopping = true;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->wake);
    free_tracer(t);
}

/* ---- Triton's trace settings ------------------------------------------------------ */

static const char *const fixed_keys[][2] = {
    {"trace_count", "-1"}, {"log_frequency", "0"}, {"trace_file", ""},
    {"trace_mode", "opentelemetry"},
};

/* The one value of a single-valued setting, or NULL (with err) when it has
 * more than one. */
static const char *one_value(const pjs_trace_setting_in *s, pjs_error *err)
{
    if (s->n_values != 1) {
        pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "trace setting %s takes one value, not %zu",
                      s->key, s->n_values);
        return NULL;
    }
    return s->values[0];
}

int pjs_trace_settings_update(pjs_tracer *t, const char *model, const pjs_trace_setting_in *in,
                              size_t n, pjs_error *err)
{
    if (model != NULL && model[0] != '\0')
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "trace settings are server-wide in pjserve: send them without a "
                             "model name (model \"%.128s\")",
                             model);
    int level = -1;     /* 0 off, 1 on, -1 unchanged */
    double rate = -1;   /* -1 unchanged */
    bool clear_rate = false, clear_level = false;
    for (size_t i = 0; i < n; i++) {
        const pjs_trace_setting_in *s = &in[i];
        bool clears = s->n_values == 0;
        if (strcmp(s->key, "trace_level") == 0) {
            if (clears) {
                clear_level = true;
                continue;
            }
            bool off = false, on = false;
            for (size_t k = 0; k < s->n_values; k++) {
                const char *v = s->values[k];
                if (strcmp(v, "OFF") == 0)
                    off = true;
                else if (strcmp(v, "TIMESTAMPS") == 0)
                    on = true;
                else if (strcmp(v, "TENSORS") == 0)
                    return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                                         "trace_level TENSORS: pjserve traces timestamps "
                                         "(spans), not tensor values; give TIMESTAMPS or OFF");
                else
                    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                         "trace_level \"%.64s\": expected OFF or TIMESTAMPS", v);
            }
            if (off && on)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "trace_level: OFF and TIMESTAMPS together");
            level = on ? 1 : 0;
        } else if (strcmp(s->key, "trace_rate") == 0) {
            if (clears) {
                clear_rate = true;
                continue;
            }
            const char *v = one_value(s, err);
            if (v == NULL)
                return err->code;
            char *end;
            long long every = strtoll(v, &end, 10);
            if (*v == '\0' || *end != '\0' || every < 1)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "trace_rate \"%.64s\": expected a whole number N >= 1 (one "
                                     "request in N is traced)",
                                     v);
            rate = 1.0 / (double)every;
        } else {
            size_t k = 0;
            while (k < sizeof fixed_keys / sizeof fixed_keys[0] &&
                   strcmp(fixed_keys[k][0], s->key) != 0)
                k++;
            if (k == sizeof fixed_keys / sizeof fixed_keys[0])
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "unknown trace setting \"%.64s\" (known: trace_level, "
                                     "trace_rate, trace_count, log_frequency, trace_file, "
                                     "trace_mode)",
                                     s->key);
            if (clears)
                continue;
            const char *v = one_value(s, err);
            if (v == NULL)
                return err->code;
            if (strcmp(v, fixed_keys[k][1]) != 0)
                return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                                     "%s \"%.64s\": pjserve exports every sampled trace over "
                                     "OTLP to its --trace-endpoint collector, so %s is \"%s\" "
                                     "and cannot be changed",
                                     s->key, v, s->key, fixed_keys[k][1]);
        }
    }
    if (t == NULL && (level == 1 || rate >= 0))
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "tracing is off: start pjserve with --trace-endpoint URL (an "
                             "OpenTelemetry collector's OTLP/HTTP traces URL) to trace requests");
    if (t == NULL)
        return 0;
    if (clear_level)
        pjs_tracer_set_enabled(t, true);
    if (level >= 0)
        pjs_tracer_set_enabled(t, level == 1);
    if (clear_rate)
        pjs_tracer_set_rate(t, t->options.rate);
    if (rate >= 0)
        pjs_tracer_set_rate(t, rate);
    return 0;
}

size_t pjs_trace_settings_current(const pjs_tracer *t,
                                  pjs_trace_setting_out out[PJS_TRACE_SETTINGS])
{
    out[0] = (pjs_trace_setting_out){.key = "trace_level", .is_list = true};
    snprintf(out[0].value, sizeof out[0].value, "%s",
             pjs_tracer_enabled(t) ? "TIMESTAMPS" : "OFF");
    out[1] = (pjs_trace_setting_out){.key = "trace_rate"};
    double rate = pjs_tracer_rate(t);
    snprintf(out[1].value, sizeof out[1].value, "%.0f", rate > 0 ? 1.0 / rate : 0.0);
    for (size_t k = 0; k < sizeof fixed_keys / sizeof fixed_keys[0]; k++) {
        out[2 + k] = (pjs_trace_setting_out){.key = fixed_keys[k][0]};
        snprintf(out[2 + k].value, sizeof out[2 + k].value, "%s", fixed_keys[k][1]);
    }
    return PJS_TRACE_SETTINGS;
}

/* Triton's JSON: each setting a string, a list of strings, or null (clear). */
static int settings_from_json(const json_t *doc, pjs_trace_setting_in *in, const char **values,
                              size_t cap, size_t values_cap, size_t *n, pjs_error *err)
{
    const char *key;
    const json_t *v;
    size_t used = 0;
    *n = 0;
    json_object_foreach((json_t *)doc, key, v) {
        if (*n == cap)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "too many trace settings");
        pjs_trace_setting_in *s = &in[(*n)++];
        *s = (pjs_trace_setting_in){.key = key, .values = values + used};
        if (json_is_null(v))
            continue;
        if (json_is_string(v)) {
            if (used == values_cap)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "too many values");
            values[used++] = json_string_value(v);
            s->n_values = 1;
            continue;
        }
        if (!json_is_array(v))
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "trace setting %.64s: expected a string, a list of strings or "
                                 "null",
                                 key);
        size_t i;
        const json_t *x;
        json_array_foreach(v, i, x) {
            if (!json_is_string(x) || used == values_cap)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "trace setting %.64s: expected strings", key);
            values[used++] = json_string_value(x);
            s->n_values++;
        }
    }
    return 0;
}

int pjs_trace_settings_update_json(pjs_tracer *t, const char *model, const char *body,
                                   size_t len, pjs_error *err)
{
    if (len == 0)
        return pjs_trace_settings_update(t, model, NULL, 0, err);
    json_error_t jerr;
    json_t *doc = json_loadb(body, len, 0, &jerr);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "trace settings: expected a JSON object of settings (%s)",
                             doc == NULL ? jerr.text : "not an object");
    }
    pjs_trace_setting_in in[16];
    const char *values[64];
    size_t n = 0;
    int rc = settings_from_json(doc, in, values, 16, 64, &n, err);
    if (rc == 0)
        rc = pjs_trace_settings_update(t, model, in, n, err);
    json_decref(doc);
    return rc;
}
