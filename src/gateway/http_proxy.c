/*
 * http_proxy.c - the gateway's REST and metrics ports (see http_proxy.h).
 *
 * A relayed request is a job: the client's call, suspended, and one or more
 * transfers, one per worker it goes to. The route picks the workers,
 * prepares each transfer (URL, method, headers, the body as the front end
 * kept and inflated it) and starts them on libcurl's multi handle, whose
 * connection cache keeps one kept-alive connection per worker and request
 * in parallel. When a job's last transfer ends the proxy thread makes the
 * reply (relayed, merged or an error naming the worker), stores it in the
 * call and resumes the connection as its last touch of the job.
 *
 * What goes where is the relay policy's (relay_policy.h), the same as
 * over gRPC: each request's operation (its method and path shape) names a
 * class that picks its workers, says whether a transfer that ended so goes
 * to a worker not tried yet (it could not connect: refused, unresolvable,
 * no connection within the connect timeout; or the worker marked its
 * answer not-run or draining) and makes the verdict of several answers.
 * Every transfer to a worker is counted by the pool and its outcome
 * reported; anything after the connection (a reset, a timeout while
 * answering) is BROKEN and answered 503: the worker may have run it. Only
 * /metrics, which is not a KServe operation, goes to its workers uncounted.
 *
 * Threads. One proxy thread runs an event loop over both sides of the
 * REST port: its client connections (the front end's daemon in
 * external-loop mode: no connection threads of its own) and the
 * connections to the workers (the multi handle), waiting on libcurl's
 * sockets and the daemon's epoll descriptor at once. A REST request is
 * read, routed, relayed, answered and sent on that thread, waking no other:
 * hand-offs between a connection thread and a relay thread cost the
 * gateway about 2.3 context switches and 88 us of CPU per mlp request
 * (HTTP, concurrency 8, 2 CPUs), against 0.8 and 60 us on one loop
 * (docs/gateway.md, Threads). One loop relays at most a CPU's worth of REST
 * requests; --http-threads does not apply to it. The metrics port keeps
 * its own connection thread, which queues its transfers under `lock` and
 * wakes the loop; only the proxy thread touches the multi handle and
 * running transfers.
 *
 * With a tracer, an inference request is traced as over gRPC
 * (frontend/grpc/proxy.c): the client's traceparent (only a valid one, never
 * its bytes) or the rate decides, the worker gets a traceparent naming the
 * gateway's forward span, and a sampled job records the gateway's server
 * span and the forward span when it is freed.
 */
#include "core/thread_name.h"
#include "gateway/http_proxy.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"
#include "core/residency.h"
#include "core/unix_addr.h"
#include "frontend/http/http_internal.h"
#include "frontend/status_map.h"
#include "gateway/http_docs.h"
#include "gateway/relay_policy.h"
#include "trace/trace.h"

/* Upstream bounds: a worker must accept the connection within the first
 * and answer within the second (the request's own timeout travels in its
 * body and the worker enforces it; this only bounds a worker that hangs). */
#define CONNECT_TIMEOUT_MS 1000L
#define ANSWER_TIMEOUT_S 600L
/* Largest answer taken from a worker: as large as a REST reply may be; a
 * metrics scrape as large as serve renders one. */
#define ANSWER_MAX_BYTES PJS_HTTP_MAX_BODY
#define METRICS_ANSWER_MAX_BYTES ((size_t)64 << 20)
#define METRICS_MAX_BYTES ((size_t)256 << 20)
/* Connections the multi handle keeps open, in all. */
#define KEPT_CONNECTIONS 256L
/* Longest "host:port" of a worker (as pjs_gw_worker_addr holds them). */
#define HOST_PORT_MAX 280
/* Easy handles kept for reuse once their transfer ended: making one
 * allocates and clears several KiB, a measurable part of a small request's
 * cost in the gateway. As many as transfers usually run at once. */
#define SPARE_EASY_MAX 64
/* Longest forwarded URL and sequence key. */
#define URL_MAX_BYTES 8192
#define SEQUENCE_KEY_MAX 128

struct pjs_gw_http {
    pjs_gw_pool *pool;
    pjs_gateway_node_status_fn node_status;
    void *node_ctx;
    pjs_http_frontend *rest, *metrics;
    CURLM *multi; /* the proxy thread's */
    pthread_t thread;
    bool thread_running;
    pthread_mutex_t lock;
    struct transfer *queued; /* guarded by lock: the metrics port's transfers to start */
    bool quiesce;            /* guarded by lock: the REST port stops accepting */
    bool stop;               /* guarded by lock: the proxy thread ends once all is answered */
    CURL *spare[SPARE_EASY_MAX]; /* guarded by lock: ended transfers' handles, reset */
    size_t n_spare;
    /* Each worker's metrics address; "" while not known. Guarded by lock.
     * Room for every worker the pool may ever have (workers found by DNS
     * join while it runs). */
    char metrics_addr[PJS_GW_MAX_WORKERS][HOST_PORT_MAX];
    pjs_log_limiter retry_log;    /* bounds the lines retries write: one per request */
    pjs_tracer *tracer;           /* NULL: tracing off */
};

typedef enum job_kind {
    JOB_FORWARD, /* one worker's answer, relayed */
    JOB_SEVERAL, /* several workers' answers, as the operation's class combines them */
    JOB_METRICS, /* /metrics of every worker, relabelled, plus the gateway's own */
} job_kind;

typedef struct transfer {
    struct job *job;
    int worker;
    bool picked; /* counted in flight by the pool: report its outcome */
    CURL *easy;
    pjs_http_buf answer;
    const char *content_type; /* of the answer: one of the types below, or NULL */
    size_t inference_header;  /* Inference-Header-Content-Length of the answer */
    pjs_gw_mark mark; /* the worker's pjserve-answer mark */
    CURLcode result;
    long status;
    char curl_error[CURL_ERROR_SIZE];
    struct transfer *next; /* in h->queued */
} transfer;

typedef struct job {
    pjs_gw_http *h;
    pjs__http_call *call;
    job_kind kind;
    const pjs_gw_op *op;            /* NULL for JOB_METRICS */
    char model[256];                /* JOB_FORWARD of a model's call; "" otherwise */
    char sequence[SEQUENCE_KEY_MAX]; /* its sequence key; "" when none */
    uint64_t change;                /* JOB_SEVERAL: the pool's remembered change; 0: none */
    uint64_t tried;                 /* workers a JOB_FORWARD was sent to */
    char path[URL_MAX_BYTES];       /* path and query as sent to the worker */
    struct curl_slist *headers;
    transfer *transfers;
    size_t n_transfers;
    size_t pending; /* proxy thread only */
    /* A traced inference request (see top): the gateway's span and the
     * forward's, and when each began and the forward ended. */
    pjs_trace_ctx trace, forward;
    uint64_t started_ns, forward_end_ns;
    int worker;      /* the last worker it went to */
    long status;     /* that worker's HTTP status; 0: none answered */
} job;

/* ---- answers ------------------------------------------------------------- */

/* The Content-Types workers answer with, kept as the static strings the
 * front end's replies carry. */
static const char *known_content_type(const char *value, size_t len)
{
    static const char *const types[] = {
        "application/json",
        "application/octet-stream",
        "text/plain; version=0.0.4; charset=utf-8",
        "text/plain",
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strlen(types[i]) == len && strncasecmp(types[i], value, len) == 0)
            return types[i];
    return "application/octet-stream";
}

static size_t on_answer_bytes(char *data, size_t size, size_t n, void *arg)
{
    transfer *t = arg;
    pjs_error err;
    return pjs_http_buf_append(&t->answer, data, size * n, &err) == 0 ? size * n : 0;
}

/* Keeps the answer's Content-Type and Inference-Header-Content-Length. */
static size_t on_answer_header(char *line, size_t size, size_t n, void *arg)
{
    transfer *t = arg;
    size_t len = size * n;
    const char *colon = memchr(line, ':', len);
    if (colon == NULL)
        return len;
    size_t name_len = (size_t)(colon - line);
    const char *v = colon + 1, *end = line + len;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
        end--;
    static const char type[] = "Content-Type", header_length[] = "Inference-Header-Content-Length",
                      mark[] = PJS_ANSWER_MARK;
    if (name_len == sizeof mark - 1 && strncasecmp(line, mark, name_len) == 0) {
        t->mark = pjs_gw_mark_of(v, (size_t)(end - v));
    } else if (name_len == sizeof type - 1 && strncasecmp(line, type, name_len) == 0) {
        t->content_type = known_content_type(v, (size_t)(end - v));
    } else if (name_len == sizeof header_length - 1 &&
               strncasecmp(line, header_length, name_len) == 0) {
        char digits[32];
        size_t k = (size_t)(end - v) < sizeof digits - 1 ? (size_t)(end - v) : sizeof digits - 1;
        memcpy(digits, v, k);
        digits[k] = '\0';
        t->inference_header = (size_t)strtoull(digits, NULL, 10);
    }
    return len;
}

/* ---- transfers ------------------------------------------------------------ */

/* Points t at worker `worker` with a fresh answer buffer. */
static int transfer_aim(transfer *t, int worker, pjs_error *err)
{
    job *j = t->job;
    pjs_gw_http *h = j->h;
    char url[URL_MAX_BYTES + 300], addr[HOST_PORT_MAX];
    if (j->kind == JOB_METRICS) {
        pthread_mutex_lock(&h->lock);
        snprintf(addr, sizeof addr, "%s", h->metrics_addr[worker]);
        pthread_mutex_unlock(&h->lock);
    } else {
        snprintf(addr, sizeof addr, "%s", pjs_gw_pool_addr(h->pool, (size_t)worker)->http);
    }
    /* A worker on a Unix socket (core/unix_addr.h): the URL names no host. */
    const char *unix_path = pjs_unix_path(addr);
    snprintf(url, sizeof url, "http://%s%s", unix_path != NULL ? "localhost" : addr, j->path);
    if (curl_easy_setopt(t->easy, CURLOPT_UNIX_SOCKET_PATH, unix_path) != CURLE_OK)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory preparing a worker call");
    t->worker = worker;
    t->status = 0;
    t->content_type = NULL;
    t->inference_header = 0;
    t->mark = PJS_GW_MARK_NONE;
    t->curl_error[0] = '\0';
    pjs_http_buf_free(&t->answer);
    pjs_http_buf_init(&t->answer, j->kind == JOB_METRICS ? METRICS_ANSWER_MAX_BYTES
                                                         : ANSWER_MAX_BYTES);
    if (curl_easy_setopt(t->easy, CURLOPT_URL, url) != CURLE_OK)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory preparing a worker call");
    return 0;
}

/* An easy handle with default options: a spare one, or a new one. */
static CURL *easy_take(pjs_gw_http *h)
{
    CURL *e = NULL;
    pthread_mutex_lock(&h->lock);
    if (h->n_spare > 0)
        e = h->spare[--h->n_spare];
    pthread_mutex_unlock(&h->lock);
    if (e == NULL)
        return curl_easy_init();
    curl_easy_reset(e);
    return e;
}

/* Keeps e (no transfer of its own any more) for reuse, or frees it. */
static void easy_give_back(pjs_gw_http *h, CURL *e)
{
    pthread_mutex_lock(&h->lock);
    bool kept = h->n_spare < SPARE_EASY_MAX;
    if (kept)
        h->spare[h->n_spare++] = e;
    pthread_mutex_unlock(&h->lock);
    if (!kept)
        curl_easy_cleanup(e);
}

/* Sets up t's easy handle for the call's method and body. */
static int transfer_prepare(transfer *t, job *j, int worker, bool picked, pjs_error *err)
{
    pjs__http_call *c = j->call;
    t->job = j;
    t->picked = picked;
    pjs_http_buf_init(&t->answer, 0);
    t->easy = easy_take(j->h);
    if (t->easy == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory preparing a worker call");
    CURL *e = t->easy;
    curl_easy_setopt(e, CURLOPT_PRIVATE, t);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_TIMEOUT_MS);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, ANSWER_TIMEOUT_S);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http");
    /* The path is one the front end checked (no dot segments) and rebuilt
     * segment by segment; libcurl must send it as it is. */
    curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_answer_bytes);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_answer_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, t);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->curl_error);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, j->headers);
    if (strcmp(c->method, "POST") == 0) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, c->body.data ? c->body.data : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->body.len);
    } else if (strcmp(c->method, "GET") != 0 && strcmp(c->method, "HEAD") != 0) {
        /* HEAD goes as GET: the front end sends the length and drops the body. */
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, c->method);
    }
    return transfer_aim(t, worker, err);
}

static void transfer_release(transfer *t)
{
    if (t->easy != NULL)
        easy_give_back(t->job->h, t->easy);
    t->easy = NULL;
    pjs_http_buf_free(&t->answer);
}

/* A sampled job's spans (see top). */
static void trace_spans(const job *j)
{
    pjs_tracer *t = j->h->tracer;
    if (t == NULL || !j->trace.sampled)
        return;
    uint64_t now = pjs_now_ns();
    char name[PJS_SPAN_NAME_MAX];
    snprintf(name, sizeof name, "gateway infer %.80s", j->model);
    pjs_span s;
    pjs_span_init_self(&s, &j->trace, PJS_SPAN_SERVER, name, j->started_ns, now);
    pjs_span_attr_str(&s, "http.request.method", "POST");
    pjs_span_attr_str(&s, "pjserve.model", j->model);
    pjs_span_attr_int(&s, "http.response.status_code", j->status);
    if (j->status == 0 || j->status >= 400)
        pjs_span_set_error(&s, j->status == 0 ? "no worker answered" : "the worker refused it");
    pjs_tracer_emit(t, &s);
    pjs_span_init_self(&s, &j->forward, PJS_SPAN_CLIENT, "forward to a worker", j->started_ns,
                       j->forward_end_ns != 0 ? j->forward_end_ns : now);
    pjs_span_attr_int(&s, "pjserve.worker", j->worker);
    pjs_span_attr_int(&s, "pjserve.attempts", (int64_t)__builtin_popcountll(j->tried));
    pjs_tracer_emit(t, &s);
}

static void job_free(job *j)
{
    trace_spans(j);
    for (size_t i = 0; i < j->n_transfers; i++)
        transfer_release(&j->transfers[i]);
    free(j->transfers);
    curl_slist_free_all(j->headers);
    free(j);
}

/* A transfer ended (proxy thread). */
static void transfer_ended(transfer *t, CURLcode result);

/* Starts a transfer (proxy thread). */
static void transfer_start(pjs_gw_http *h, transfer *t)
{
    CURLMcode mc = curl_multi_add_handle(h->multi, t->easy);
    if (mc != CURLM_OK) {
        snprintf(t->curl_error, sizeof t->curl_error, "%s", curl_multi_strerror(mc));
        transfer_ended(t, CURLE_FAILED_INIT);
    }
}

/* Hands the metrics port's transfers to the proxy thread. */
static void queue_transfers(pjs_gw_http *h, transfer *const *ts, size_t n)
{
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < n; i++) {
        ts[i]->next = h->queued;
        h->queued = ts[i];
    }
    pthread_mutex_unlock(&h->lock);
    curl_multi_wakeup(h->multi);
}

/* ---- building a job (connection threads) ------------------------------------ */

/* Appends s to the URL in buf, percent-encoded unless it is unreserved. */
static bool url_append_escaped(char *buf, size_t size, const char *s, size_t len)
{
    char *escaped = curl_easy_escape(NULL, s, (int)len);
    if (escaped == NULL)
        return false;
    size_t have = strlen(buf), add = strlen(escaped);
    bool fits = have + add < size;
    if (fits)
        memcpy(buf + have, escaped, add + 1);
    curl_free(escaped);
    return fits;
}

static bool url_append(char *buf, size_t size, const char *s)
{
    size_t have = strlen(buf), add = strlen(s);
    if (have + add >= size)
        return false;
    memcpy(buf + have, s, add + 1);
    return true;
}

typedef struct query_builder {
    char *buf;
    size_t size;
    bool first, fits;
} query_builder;

static enum MHD_Result add_query_argument(void *cls, enum MHD_ValueKind kind, const char *key,
                                          const char *value)
{
    (void)kind;
    query_builder *q = cls;
    q->fits = q->fits && url_append(q->buf, q->size, q->first ? "?" : "&") &&
              url_append_escaped(q->buf, q->size, key, strlen(key)) &&
              (value == NULL || (url_append(q->buf, q->size, "=") &&
                                 url_append_escaped(q->buf, q->size, value, strlen(value))));
    q->first = false;
    return q->fits ? MHD_YES : MHD_NO;
}

/* The path and query the worker gets: the client's, each segment and
 * argument encoded again (libmicrohttpd decoded them). */
static bool build_path(pjs__http_call *c, const pjs__http_path *p, char *buf, size_t size)
{
    buf[0] = '\0';
    for (size_t i = 0; i < p->n; i++)
        if (!url_append(buf, size, "/") || !url_append_escaped(buf, size, p->seg[i],
                                                               strlen(p->seg[i])))
            return false;
    query_builder q = {buf, size, true, true};
    MHD_get_connection_values(c->conn, MHD_GET_ARGUMENT_KIND, add_query_argument, &q);
    return q.fits;
}

/* Whether a header value may be sent on as it is: visible ASCII, spaces
 * and tabs only. A CR or LF would start another header line upstream. */
static bool header_value_plain(const char *v)
{
    for (const unsigned char *s = (const unsigned char *)v; *s != '\0'; s++)
        if ((*s < 0x20 && *s != '\t') || *s == 0x7f)
            return false;
    return true;
}

typedef enum header_copy {
    HEADER_COPIED, /* or absent, or too long to be valid (the worker does without it) */
    HEADER_REFUSED, /* holds a control character: the request is refused */
    HEADER_NO_MEMORY,
} header_copy;

/* Adds the request header `name` to the job's headers when the client sent it. */
static header_copy copy_header(job *j, const char *name)
{
    const char *v = MHD_lookup_connection_value(j->call->conn, MHD_HEADER_KIND, name);
    if (v == NULL)
        return HEADER_COPIED;
    if (!header_value_plain(v))
        return HEADER_REFUSED;
    char line[1024];
    if ((size_t)snprintf(line, sizeof line, "%s: %s", name, v) >= sizeof line)
        return HEADER_COPIED;
    struct curl_slist *l = curl_slist_append(j->headers, line);
    if (l == NULL)
        return HEADER_NO_MEMORY;
    j->headers = l;
    return HEADER_COPIED;
}

/* A job for call c over path p with n_transfers to come; NULL: replied. */
static job *job_create(pjs__http_call *c, const pjs__http_path *p, job_kind kind,
                       const pjs_gw_op *op, size_t n_transfers)
{
    pjs_gw_http *h = c->fe->routes_ctx;
    job *j = calloc(1, sizeof *j);
    transfer *ts = calloc(n_transfers, sizeof *ts);
    if (j == NULL || ts == NULL) {
        free(j);
        free(ts);
        pjs__http_reply_message(c, 500, "out of memory relaying the request");
        return NULL;
    }
    j->h = h;
    j->call = c;
    j->kind = kind;
    j->op = op;
    j->transfers = ts;
    j->n_transfers = n_transfers;
    if (!build_path(c, p, j->path, sizeof j->path)) {
        job_free(j);
        pjs__http_reply_message(c, 414, "the request's path and query are too long to relay");
        return NULL;
    }
    const char *token = pjs_gw_pool_worker_token(h->pool);
    char authorization[PJS_ACCESS_TOKEN_MAX + 32];
    bool ok = true;
    if (token != NULL) {
        snprintf(authorization, sizeof authorization, "Authorization: Bearer %s", token);
        ok = (j->headers = curl_slist_append(j->headers, authorization)) != NULL;
    }
    /* No "Expect: 100-continue" round trip before large bodies. */
    if (ok)
        ok = (j->headers = curl_slist_append(j->headers, "Expect:")) != NULL;
    /* Who the client is, for the workers' per-client counts: set here, never
     * the client's own header (only the headers below are copied). */
    char client[PJS_CLIENT_ID_MAX], client_line[sizeof PJS_CLIENT_HEADER + PJS_CLIENT_ID_MAX + 2];
    pjs__http_client_id(c, client);
    snprintf(client_line, sizeof client_line, PJS_CLIENT_HEADER ": %s", client);
    if (ok)
        ok = (j->headers = curl_slist_append(j->headers, client_line)) != NULL;
    static const char *const forwarded[] = {MHD_HTTP_HEADER_CONTENT_TYPE,
                                            "Inference-Header-Content-Length"};
    for (size_t i = 0; ok && strcmp(c->method, "POST") == 0 && i < sizeof forwarded / sizeof *forwarded;
         i++) {
        header_copy hc = copy_header(j, forwarded[i]);
        if (hc == HEADER_REFUSED) {
            job_free(j);
            pjs__http_reply_message(c, 400,
                                    "the %s header holds a control character (CR, LF, ...); "
                                    "it is not relayed",
                                    forwarded[i]);
            return NULL;
        }
        ok = hc == HEADER_COPIED;
    }
    if (!ok) {
        job_free(j);
        pjs__http_reply_message(c, 500, "out of memory relaying the request");
        return NULL;
    }
    return j;
}

/* Prepares every transfer of j (transfer i to workers[i]), suspends the
 * call and queues them; on failure replies and frees j. */
static void job_start(job *j, const int *workers, bool picked)
{
    pjs__http_call *c = j->call;
    pjs_error err;
    transfer *ts[PJS_GW_MAX_WORKERS];
    for (size_t i = 0; i < j->n_transfers; i++) {
        ts[i] = &j->transfers[i];
        if (transfer_prepare(ts[i], j, workers[i], picked, &err) != 0) {
            for (size_t k = 0; picked && k < j->n_transfers; k++)
                pjs_gw_pool_done(j->h->pool, workers[k], PJS_GW_NOT_SENT);
            pjs_gw_pool_change_settled(j->h->pool, j->change, false); /* sent nowhere */
            job_free(j);
            pjs__http_reply_error(c, &err);
            return;
        }
    }
    j->pending = j->n_transfers;
    pjs__http_suspend(c);
    if (!c->fe->routes->external_loop) {
        queue_transfers(j->h, ts, j->n_transfers);
        return;
    }
    /* The REST port's routes run on the proxy thread. A transfer that
     * cannot start ends at once, and the last to end frees j. */
    pjs_gw_http *h = j->h;
    size_t n = j->n_transfers;
    for (size_t i = 0; i < n; i++)
        transfer_start(h, ts[i]);
}

/* The request's body, inflated; false: replied. Only POSTs have one. */
static bool body_ready(pjs__http_call *c)
{
    return strcmp(c->method, "POST") != 0 || pjs__http_body_ready(c);
}

/* Decides whether inference job j is traced (see top) and gives it the
 * worker's traceparent; false when out of memory. */
static bool trace_job(job *j)
{
    pjs_tracer *t = j->h->tracer;
    if (t == NULL || !pjs_tracer_enabled(t))
        return true;
    j->started_ns = pjs_now_ns();
    const char *value = MHD_lookup_connection_value(j->call->conn, MHD_HEADER_KIND, "traceparent");
    pjs_trace_ctx incoming;
    bool given = value != NULL && pjs_trace_parse(value, strlen(value), &incoming);
    pjs_tracer_start_relay(t, given ? &incoming : NULL, &j->trace, &j->forward);
    char line[16 + PJS_TRACEPARENT_LEN] = "traceparent: ";
    pjs_trace_format(&j->forward, line + strlen(line));
    struct curl_slist *l = curl_slist_append(j->headers, line);
    if (l == NULL)
        return false;
    j->headers = l;
    return true;
}

/* Relays the call to the one worker op's class picks (for `model`, NULL
 * when the call names none). */
static void forward(pjs__http_call *c, const pjs__http_path *p, const pjs_gw_op *op,
                    const char *model)
{
    pjs_gw_http *h = c->fe->routes_ctx;
    if (!body_ready(c))
        return;
    char sequence[SEQUENCE_KEY_MAX] = "";
    if (model != NULL && op->inference && c->body.len > 0) {
        const char *declared =
            MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
        size_t json_len = declared ? (size_t)strtoull(declared, NULL, 10) : c->body.len;
        if (json_len > c->body.len)
            json_len = c->body.len;
        pjs_gw_sequence_key(c->body.data, json_len, sequence, sizeof sequence);
    }
    pjs_error err;
    pjs_gw_route route = {model != NULL ? model : "", sequence};
    int worker = op->cls->pick(h->pool, &route, 0, &err);
    if (worker < 0) {
        pjs__http_reply_error(c, &err);
        return;
    }
    job *j = job_create(c, p, JOB_FORWARD, op, 1);
    if (j == NULL) {
        pjs_gw_pool_done(h->pool, worker, PJS_GW_NOT_SENT);
        return;
    }
    snprintf(j->model, sizeof j->model, "%s", route.model);
    snprintf(j->sequence, sizeof j->sequence, "%s", sequence);
    j->tried = (uint64_t)1 << worker;
    if (op->inference && !trace_job(j)) {
        pjs_gw_pool_done(h->pool, worker, PJS_GW_NOT_SENT);
        job_free(j);
        pjs__http_reply_message(c, 500, "out of memory relaying the request");
        return;
    }
    job_start(j, &worker, true);
}

/* The available workers whose metrics address is known. */
static uint64_t scrapable(pjs_gw_http *h)
{
    uint64_t mask = pjs_gw_pool_available(h->pool);
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < PJS_GW_MAX_WORKERS; i++)
        if (h->metrics_addr[i][0] == '\0')
            mask &= ~((uint64_t)1 << i);
    pthread_mutex_unlock(&h->lock);
    return mask;
}

/* The change a repository load or unload, or a residency call, makes (its
 * strings point into *doc, which the caller releases); false for other
 * calls and bodies that do not read (the workers refuse those). */
static bool rest_change(pjs__http_call *c, const pjs_gw_op *op, const char *model,
                        pjs_gw_change *out, json_t **doc)
{
    memset(out, 0, sizeof *out);
    *doc = NULL;
    if (model == NULL || model[0] == '\0')
        return false;
    out->model = model;
    if (op->id == PJS_GW_OP_REPOSITORY_MODEL_UNLOAD) {
        out->kind = PJS_GW_CHANGE_UNLOAD;
        return true;
    }
    bool load = op->id == PJS_GW_OP_REPOSITORY_MODEL_LOAD;
    if (!load && op->id != PJS_GW_OP_SET_MODEL_RESIDENCY)
        return false;
    if (c->body.len > 0)
        *doc = json_loadb(c->body.data, c->body.len, 0, NULL);
    if (load) {
        out->kind = PJS_GW_CHANGE_LOAD;
        json_t *config = json_object_get(json_object_get(*doc, "parameters"), "config");
        out->config = json_string_value(config);
        return c->body.len == 0 || *doc != NULL;
    }
    const char *value = json_string_value(json_object_get(*doc, "residency"));
    out->kind = PJS_GW_CHANGE_RESIDENCY;
    pjs_residency r;
    if (!pjs_residency_from_name(value, &r))
        return false;
    out->residency = pjs_residency_wire(r);
    return true;
}

/* Sends the call to the workers op's class names (`model`: the model's
 * segment, NULL when none), to be answered by its verdict; a change the
 * pool remembers for workers restarted later read out of the body. */
static void to_every_worker(pjs__http_call *c, const pjs__http_path *p, const pjs_gw_op *op,
                            const char *model)
{
    pjs_gw_http *h = c->fe->routes_ctx;
    if (!body_ready(c))
        return;
    pjs_error err;
    /* Trace settings act on the gateway's own sampling too: first here, so
     * that one the gateway refuses goes nowhere. */
    if (op->id == PJS_GW_OP_TRACE_SETTING && h->tracer != NULL &&
        strcmp(c->method, "POST") == 0 &&
        pjs_trace_settings_update_json(h->tracer, model, c->body.data, c->body.len, &err) != 0) {
        pjs__http_reply_error(c, &err);
        return;
    }
    pjs_gw_change change;
    json_t *doc;
    bool remembered = rest_change(c, op, model, &change, &doc);
    uint64_t change_seq = 0;
    uint64_t mask = op->cls->targets(h->pool, remembered ? &change : NULL, &change_seq, &err);
    json_decref(doc);
    if (mask == 0) {
        pjs__http_reply_error(c, &err);
        return;
    }
    int workers[PJS_GW_MAX_WORKERS];
    size_t n = 0;
    for (int i = 0; i < PJS_GW_MAX_WORKERS; i++)
        if (mask & ((uint64_t)1 << i))
            workers[n++] = i;
    job *j = job_create(c, p, JOB_SEVERAL, op, n);
    if (j == NULL) {
        for (size_t k = 0; k < n; k++)
            pjs_gw_pool_done(h->pool, workers[k], PJS_GW_NOT_SENT);
        pjs_gw_pool_change_settled(h->pool, change_seq, false); /* sent nowhere */
        return;
    }
    j->change = change_seq;
    job_start(j, workers, true);
}

/* /metrics of every worker whose metrics address is known (not counted by
 * the pool: not a KServe operation). */
static void scrape_workers(pjs__http_call *c, const pjs__http_path *p, uint64_t mask)
{
    int workers[PJS_GW_MAX_WORKERS];
    size_t n = 0;
    for (int i = 0; i < PJS_GW_MAX_WORKERS; i++)
        if (mask & ((uint64_t)1 << i))
            workers[n++] = i;
    job *j = job_create(c, p, JOB_METRICS, NULL, n);
    if (j != NULL)
        job_start(j, workers, false);
}

/* ---- finishing a job (proxy thread) ------------------------------------------ */

/* Whether t failed before reaching its worker. */
static bool never_reached(const transfer *t)
{
    if (t->result == CURLE_COULDNT_CONNECT || t->result == CURLE_COULDNT_RESOLVE_HOST)
        return true;
    curl_off_t connected = 0;
    return t->result == CURLE_OPERATION_TIMEDOUT &&
           curl_easy_getinfo(t->easy, CURLINFO_CONNECT_TIME_T, &connected) == CURLE_OK &&
           connected == 0;
}

static const char *worker_http(const transfer *t)
{
    return pjs_gw_pool_addr(t->job->h->pool, (size_t)t->worker)->http;
}

/* The error message in a worker's {"error": ...} answer, or its status. */
static void answer_error(const transfer *t, char *buf, size_t size)
{
    json_t *doc = json_loadb(t->answer.data ? t->answer.data : "", t->answer.len, 0, NULL);
    const char *msg = json_string_value(json_object_get(doc, "error"));
    if (msg != NULL)
        snprintf(buf, size, "%s", msg);
    else
        snprintf(buf, size, "HTTP status %ld", t->status);
    json_decref(doc);
}

/* Whether t ended with an answer of the worker's. */
static bool answered(const transfer *t)
{
    return t->result == CURLE_OK;
}

/* The reply for a transfer that got no answer. */
static void reply_no_answer(pjs__http_call *c, const transfer *t)
{
    const char *why = t->curl_error[0] ? t->curl_error : curl_easy_strerror(t->result);
    if (t->result == CURLE_WRITE_ERROR)
        pjs__http_reply_message(c, 502, "worker %d (%s) answered more than %zu bytes",
                                t->worker, worker_http(t), t->answer.limit);
    else if (never_reached(t))
        pjs__http_reply_message(c, 503, "no worker could take the request; the last tried, "
                                "worker %d (%s): %s; retry later",
                                t->worker, worker_http(t), why);
    else
        pjs__http_reply_message(c, 503, "worker %d (%s) failed while answering (%s); the "
                                "request may have run there",
                                t->worker, worker_http(t), why);
}

/* Relays t's answer as the call's reply. */
static void reply_relayed(pjs__http_call *c, transfer *t)
{
    pjs__http_reply_buf(c, (unsigned)t->status, &t->answer,
                        t->answer.len > 0 ? t->content_type : NULL);
    c->reply.inference_header = t->inference_header;
}

/* What the relay policy reads of a transfer. An answer larger than the
 * gateway takes is still the worker's answer (no fault of its own). */
static pjs_gw_result result_of(const transfer *t)
{
    bool delivered = answered(t) || t->result == CURLE_WRITE_ERROR;
    return (pjs_gw_result){
        .worker = t->worker,
        .delivery = delivered         ? PJS_GW_DELIVERED
                    : never_reached(t) ? PJS_GW_UNDELIVERED
                                       : PJS_GW_LOST,
        .mark = t->mark,
        .ok = answered(t) && t->status >= 200 && t->status <= 299,
        .status = (int)t->status,
        .text = t->answer.data,
        .text_len = t->answer.len,
    };
}

/* A transfer that failed, named as the verdict says. */
static void reply_named_failure(pjs__http_call *c, const pjs_gw_verdict *v, const transfer *t,
                                const pjs_gw_result *r)
{
    char why[PJS_ERROR_MSG_MAX], msg[PJS_ERROR_MSG_MAX + 512];
    if (answered(t))
        answer_error(t, why, sizeof why);
    else if (t->result == CURLE_WRITE_ERROR)
        snprintf(why, sizeof why, "answered more than %zu bytes", t->answer.limit);
    else
        snprintf(why, sizeof why, "%s",
                 t->curl_error[0] ? t->curl_error : curl_easy_strerror(t->result));
    pjs_gw_relay_failure_text(v, r, worker_http(t), why, msg, sizeof msg);
    unsigned status = answered(t)                      ? (unsigned)t->status
                      : t->result == CURLE_WRITE_ERROR ? 502
                                                       : 503;
    pjs__http_reply_message(c, status, "%s", msg);
}

/* The reply of a JOB_SEVERAL: its class's verdict over every transfer. */
static void finish_several(job *j)
{
    pjs__http_call *c = j->call;
    pjs_gw_result rs[PJS_GW_MAX_WORKERS];
    for (size_t i = 0; i < j->n_transfers; i++)
        rs[i] = result_of(&j->transfers[i]);
    pjs_gw_verdict v;
    j->op->cls->combine(rs, j->n_transfers, &v);
    pjs_gw_pool_change_settled(j->h->pool, j->change, v.accepted);
    transfer *at = &j->transfers[v.at];
    if (v.kind == PJS_GW_VERDICT_RELAY || (v.kind == PJS_GW_VERDICT_FAILED && v.unanimous)) {
        reply_relayed(c, at); /* unanimous: the workers' words (Triton's, for an unknown model) */
        return;
    }
    if (v.kind == PJS_GW_VERDICT_FAILED) {
        reply_named_failure(c, &v, at, &rs[v.at]);
        return;
    }
    json_t *docs[PJS_GW_MAX_WORKERS];
    size_t n = 0;
    for (size_t i = 0; i < j->n_transfers; i++) {
        const transfer *t = &j->transfers[i];
        json_t *doc = NULL;
        if (v.merged & ((uint64_t)1 << i))
            doc = json_loadb(t->answer.data ? t->answer.data : "", t->answer.len, 0, NULL);
        if (doc != NULL)
            docs[n++] = doc;
    }
    json_t *merged = j->op->merge == PJS_GW_MERGE_INDEX ? pjs_gw_merge_index(docs, n)
                                                        : pjs_gw_merge_stats(docs, n);
    for (size_t i = 0; i < n; i++)
        json_decref(docs[i]);
    pjs__http_reply_json(c, 200, merged);
}

/* The gateway's own series, after the workers'. */
static int render_gateway_metrics(pjs_gw_http *h, pjs_http_buf *b, pjs_error *err)
{
    static const struct {
        const char *name, *type, *help;
    } series[] = {
        {"pjserve_gateway_worker_ready", "gauge",
         "Whether the gateway routes to the worker: its probes answer and its breaker is closed"},
        {"pjserve_gateway_worker_breaker_open", "gauge",
         "Whether the worker's circuit breaker is open after failed forwards"},
        {"pjserve_gateway_worker_in_flight", "gauge",
         "Requests the gateway has forwarded to the worker and not yet seen answered"},
        {"pjserve_gateway_worker_models", "gauge", "Models ready on the worker"},
        {"pjserve_gateway_forwarded_total", "counter", "Requests forwarded to the worker"},
        {"pjserve_gateway_failed_total", "counter",
         "Forwards to the worker that failed (not reached or broken)"},
    };
    size_t n = pjs_gw_pool_size(h->pool);
    pjs_gw_worker_view *views = calloc(n ? n : 1, sizeof *views);
    if (views == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory rendering metrics");
    for (size_t i = 0; i < n; i++)
        pjs_gw_pool_view(h->pool, i, &views[i]);
    int rc = 0;
    for (size_t s = 0; rc == 0 && s < sizeof series / sizeof series[0]; s++) {
        rc = pjs_http_buf_printf(b, err, "# HELP %s %s\n# TYPE %s %s\n", series[s].name,
                                 series[s].help, series[s].name, series[s].type);
        for (size_t i = 0; rc == 0 && i < n; i++) {
            const pjs_gw_worker_view *v = &views[i];
            unsigned long long value =
                s == 0   ? v->state == PJS_GW_WORKER_READY && !v->breaker_open
                : s == 1 ? v->breaker_open
                : s == 2 ? v->in_flight
                : s == 3 ? v->n_models
                : s == 4 ? v->forwarded
                         : v->failed;
            rc = pjs_http_buf_printf(b, err, "%s{worker=\"%zu\"} %llu\n", series[s].name, i, value);
        }
    }
    free(views);
    if (rc == 0)
        rc = pjs_http_buf_printf(b, err,
                                 "# HELP pjserve_gateway_worker_metrics_scraped Whether this "
                                 "/metrics carries the worker's samples: 0 when its --worker "
                                 "gave no metrics=HOST:PORT\n"
                                 "# TYPE pjserve_gateway_worker_metrics_scraped gauge\n");
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; rc == 0 && i < n && i < PJS_GW_MAX_WORKERS; i++)
        rc = pjs_http_buf_printf(b, err, "pjserve_gateway_worker_metrics_scraped{worker=\"%zu\"} %d\n",
                                 i, h->metrics_addr[i][0] != '\0');
    pthread_mutex_unlock(&h->lock);
    if (rc == 0)
        rc = pjs_http_buf_printf(
            b, err,
            "# HELP pjserve_gateway_retries_total Requests sent again to another worker after "
            "the first could not be reached or refused them before running them\n"
            "# TYPE pjserve_gateway_retries_total counter\n"
            "pjserve_gateway_retries_total{protocol=\"grpc\"} %llu\n"
            "pjserve_gateway_retries_total{protocol=\"http\"} %llu\n",
            (unsigned long long)pjs_gw_pool_retries(h->pool, PJS_GW_GRPC),
            (unsigned long long)pjs_gw_pool_retries(h->pool, PJS_GW_HTTP));
    return rc;
}

static void finish_metrics(job *j)
{
    pjs_gw_metrics_text texts[PJS_GW_MAX_WORKERS];
    size_t n = 0;
    for (size_t i = 0; i < j->n_transfers; i++) {
        transfer *t = &j->transfers[i];
        if (answered(t) && t->status == 200 && t->answer.len > 0)
            texts[n++] = (pjs_gw_metrics_text){t->answer.data, t->answer.len,
                                               (unsigned)t->worker};
    }
    pjs_http_buf out;
    pjs_error err;
    pjs_http_buf_init(&out, METRICS_MAX_BYTES);
    int rc = pjs_gw_metrics_merge(texts, n, &out, &err);
    if (rc == 0)
        rc = render_gateway_metrics(j->h, &out, &err);
    if (rc != 0) {
        pjs_http_buf_free(&out);
        pjs__http_reply_error(j->call, &err);
        return;
    }
    pjs__http_reply_buf(j->call, 200, &out, "text/plain; version=0.0.4; charset=utf-8");
}

static void job_finish(job *j)
{
    switch (j->kind) {
    case JOB_FORWARD: {
        transfer *t = &j->transfers[0];
        if (answered(t))
            reply_relayed(j->call, t);
        else
            reply_no_answer(j->call, t);
        break;
    }
    case JOB_SEVERAL: finish_several(j); break;
    case JOB_METRICS: finish_metrics(j); break;
    }
    pjs__http_call *c = j->call;
    job_free(j);
    pjs__http_resume(c); /* the last touch of the call */
}

/* Sends a JOB_FORWARD transfer that provably did not run on its worker
 * (relay_policy.h) to the next worker its class picks; false when there is
 * none (t keeps its failure or answer, which is the reply). */
static bool retry_elsewhere(transfer *t)
{
    job *j = t->job;
    pjs_gw_http *h = j->h;
    pjs_error err;
    pjs_gw_route route = {j->model, j->sequence};
    int next = j->op->cls->pick(h->pool, &route, j->tried, &err);
    if (next < 0)
        return false;
    bool not_run = answered(t) && t->mark == PJS_GW_MARK_NOT_RUN;
    bool draining = answered(t) && t->mark == PJS_GW_MARK_DRAINING;
    const char *why = draining  ? "it is shutting down"
                      : not_run ? "it does not have the model"
                      : t->curl_error[0] ? t->curl_error
                                         : curl_easy_strerror(t->result);
    if (not_run) /* a model being loaded or unloaded: routine, and a client can cause it */
        pjs_debug("gateway: %s %.256s: worker %d (%s): %s; sending it to worker %d",
                  j->call->method, j->call->url, t->worker, worker_http(t), why, next);
    else
        pjs_log_limited(&h->retry_log, PJS_LOG_INFO,
                        "gateway: %s %.256s: worker %d (%s) %s (%s); sending it to worker %d",
                        j->call->method, j->call->url, t->worker, worker_http(t),
                        draining ? "refused it before running it" : "could not be reached",
                        why, next);
    j->tried |= (uint64_t)1 << next;
    if (transfer_aim(t, next, &err) != 0 || curl_multi_add_handle(h->multi, t->easy) != CURLM_OK) {
        pjs_gw_pool_done(h->pool, next, PJS_GW_NOT_SENT);
        return false;
    }
    pjs_gw_pool_count_retry(h->pool, PJS_GW_HTTP);
    return true;
}

static void transfer_ended(transfer *t, CURLcode result)
{
    job *j = t->job;
    pjs_gw_http *h = j->h;
    t->result = result;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
    j->forward_end_ns = pjs_now_ns();
    j->worker = t->worker;
    j->status = t->status;
    if (t->picked) {
        /* What the outcome means is the relay policy's: the pool hears it,
         * and a call that provably did not run goes to another worker;
         * when none is left, the worker's own words are the reply. */
        pjs_gw_result r = result_of(t);
        pjs_gw_pool_done(h->pool, t->worker, pjs_gw_relay_outcome(&r));
        if (j->kind == JOB_FORWARD && j->op->cls->retry(&r) && retry_elsewhere(t))
            return;
    }
    if (--j->pending == 0)
        job_finish(j);
}

/* Ends the transfers libcurl has finished; returns how many. */
static int end_finished(pjs_gw_http *h)
{
    int ended = 0;
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(h->multi, &left)) != NULL) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        CURL *e = msg->easy_handle;
        CURLcode result = msg->data.result;
        transfer *t = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&t);
        curl_multi_remove_handle(h->multi, e);
        transfer_ended(t, result);
        ended++;
    }
    return ended;
}

/* The proxy thread: one event loop over the REST port's client
 * connections (its daemon's epoll descriptor) and the connections to the
 * workers (libcurl's multi handle). A request is read, routed, relayed,
 * answered and sent on this thread, waking no other. */
static void *proxy_thread(void *arg)
{
    pjs_gw_http *h = arg;
    struct curl_waitfd rest_fd = {.fd = h->rest ? pjs__http_loop_fd(h->rest) : -1,
                                  .events = CURL_WAIT_POLLIN};
    int running = 0;
    for (;;) {
        pthread_mutex_lock(&h->lock);
        transfer *queued = h->queued;
        h->queued = NULL;
        bool quiesce = h->quiesce, stop = h->stop;
        pthread_mutex_unlock(&h->lock);
        if (quiesce && h->rest != NULL)
            pjs__http_loop_quiesce(h->rest);
        for (transfer *t = queued, *next; t != NULL; t = next) {
            next = t->next;
            transfer_start(h, t);
        }
        /* Requests routed here add their transfers to the multi handle. */
        int wait_ms = h->rest ? pjs__http_loop_run(h->rest) : -1;
        curl_multi_perform(h->multi, &running);
        if (end_finished(h) > 0)
            continue; /* replies to send: the daemon runs again at once */
        if (stop && queued == NULL && running == 0 &&
            (h->rest == NULL || pjs__http_loop_done(h->rest)))
            break;
        if (wait_ms < 0 || wait_ms > 1000)
            wait_ms = 1000;
        curl_multi_poll(h->multi, &rest_fd, h->rest ? 1 : 0, wait_ms, NULL);
    }
    return NULL;
}

/* ---- routes (connection threads) ---------------------------------------------- */

static bool is(const char *a, const char *b)
{
    return strcmp(a, b) == 0;
}

/* Readiness as serve answers it (200, or 400 with {"ready": false}):
 * pjs_gw_pool_ready. */
static void health(pjs__http_call *c, const char *kind)
{
    pjs_gw_http *h = c->fe->routes_ctx;
    bool ok = is(kind, "live") || pjs_gw_pool_ready(h->pool);
    pjs__http_reply_json(c, ok ? 200 : 400, json_pack("{s:b}", kind, ok));
}

static void answer_node_status(pjs__http_call *c)
{
    pjs_gw_http *h = c->fe->routes_ctx;
    if (h->node_status == NULL) {
        pjs__http_reply_message(c, 404,
                                "this gateway runs on its own, not under `pjserve node`: there "
                                "is no node status");
        return;
    }
    char *doc = h->node_status(h->node_ctx);
    if (doc == NULL) {
        pjs__http_reply_message(c, 500, "out of memory rendering the node status");
        return;
    }
    pjs__http_reply_empty(c, 200);
    c->reply.body = doc;
    c->reply.len = strlen(doc);
    c->reply.content_type = "application/json";
}

static void route_rest(pjs__http_call *c)
{
    pjs__http_path p;
    if (!pjs__http_split_path(c->url, &p) || p.n == 0 || !is(p.seg[0], "v2")) {
        pjs__http_reply_message(c, 404, "no such endpoint: %.256s", c->url);
        return;
    }
    size_t model_at;
    const pjs_gw_op *op = pjs_gw_op_of_rest(c->method, p.seg, p.n, &model_at);
    const char *model = model_at < p.n ? p.seg[model_at] : NULL;
    if (op->id == PJS_GW_OP_SERVER_LIVE)
        health(c, "live");
    else if (op->id == PJS_GW_OP_SERVER_READY)
        health(c, "ready");
    else if (op->id == PJS_GW_OP_NODE_STATUS)
        answer_node_status(c);
    else if (op->cls->targets != NULL)
        to_every_worker(c, &p, op, model);
    else
        forward(c, &p, op, model); /* the worker's word on anything else */
}

static void route_metrics(pjs__http_call *c)
{
    pjs__http_path p;
    if (!pjs__http_split_path(c->url, &p) || p.n != 1 || !is(p.seg[0], "metrics")) {
        pjs__http_reply_message(c, 404, "no such endpoint: %.256s (metrics are at /metrics)",
                                c->url);
        return;
    }
    if (!pjs__http_method_ok(c, "GET"))
        return;
    pjs_gw_http *h = c->fe->routes_ctx;
    uint64_t mask = scrapable(h);
    if (mask != 0) {
        scrape_workers(c, &p, mask);
        return;
    }
    /* No worker to ask: the gateway's own series still tell why. */
    pjs_http_buf out;
    pjs_error err;
    pjs_http_buf_init(&out, METRICS_MAX_BYTES);
    if (render_gateway_metrics(h, &out, &err) != 0) {
        pjs_http_buf_free(&out);
        pjs__http_reply_error(c, &err);
        return;
    }
    pjs__http_reply_buf(c, 200, &out, "text/plain; version=0.0.4; charset=utf-8");
}

/* Inference bodies are held to --max-request-bytes (the gateway does not
 * know each model's bound), others to the size of a control document. */
static bool limit_rest_body(pjs__http_call *c)
{
    char model[256], version[64];
    if (!pjs__http_infer_path(c->url, model, sizeof model, version, sizeof version))
        pjs__http_limit_control_body(c);
    return true;
}

static const pjs__http_routes rest_routes = {
    .what = "gateway HTTP/REST",
    .keeps_bodies = true,
    .external_loop = true,
    .limit_body = limit_rest_body,
    .route = route_rest,
};

static const pjs__http_routes metrics_routes = {
    .what = "gateway metrics",
    .route = route_metrics,
};

/* ---- start and stop ------------------------------------------------------------ */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

static void init_curl(void)
{
    curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void proxy_free(pjs_gw_http *h)
{
    for (size_t i = 0; i < h->n_spare; i++)
        curl_easy_cleanup(h->spare[i]);
    if (h->multi != NULL)
        curl_multi_cleanup(h->multi);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

/* Sets `flag` (quiesce or stop) for the proxy thread and wakes it. */
static void tell_thread(pjs_gw_http *h, bool *flag)
{
    pthread_mutex_lock(&h->lock);
    *flag = true;
    pthread_mutex_unlock(&h->lock);
    curl_multi_wakeup(h->multi);
}

/* Stops the proxy thread once no call waits for it. */
static void stop_thread(pjs_gw_http *h)
{
    if (!h->thread_running)
        return;
    tell_thread(h, &h->stop);
    pthread_join(h->thread, NULL);
    h->thread_running = false;
}

int pjs_gw_http_start(pjs_gw_pool *pool, const pjs_http_options *rest,
                      const pjs_http_options *metrics, pjs_byte_budget *budget,
                      uint64_t max_request_bytes, pjs_gateway_node_status_fn node_status,
                      void *node_ctx, pjs_tracer *tracer, pjs_gw_http **out, pjs_error *err)
{
    *out = NULL;
    pthread_once(&curl_once, init_curl);
    if (curl_init_result != CURLE_OK)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot initialise libcurl: %s",
                             curl_easy_strerror(curl_init_result));
    pjs_gw_http *h = calloc(1, sizeof *h);
    if (h == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    h->pool = pool;
    h->node_status = node_status;
    h->node_ctx = node_ctx;
    h->tracer = tracer;
    pthread_mutex_init(&h->lock, NULL);
    h->multi = curl_multi_init();
    if (h->multi == NULL) {
        proxy_free(h);
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory starting the HTTP proxy");
    }
    curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, KEPT_CONNECTIONS);
    /* The REST port first: the proxy thread runs it from its start. */
    int rc = 0;
    if (rest != NULL && rest->port != 0) {
        if (rest->threads > 1)
            pjs_info("gateway: the REST port runs on the one proxy thread that relays its "
                     "requests; --http-threads %d is not used",
                     rest->threads);
        rc = pjs__http_frontend_start(&rest_routes, h, rest, budget, max_request_bytes, &h->rest,
                                      err);
    }
    if (rc == 0 && pthread_create(&h->thread, NULL, proxy_thread, h) != 0)
        rc = pjs_error_set(err, PJS_ERR_INTERNAL, "cannot start the HTTP proxy thread");
    if (rc != 0) {
        pjs_gw_http_stop(h);
        return rc;
    }
    pjs_thread_name(h->thread, "pjs-http-proxy");
    h->thread_running = true;
    if (metrics != NULL && metrics->port != 0)
        rc = pjs__http_frontend_start(&metrics_routes, h, metrics, budget, max_request_bytes,
                                      &h->metrics, err);
    if (rc != 0) {
        pjs_gw_http_stop(h);
        return rc;
    }
    *out = h;
    return 0;
}

int pjs_gw_http_set_worker_metrics(pjs_gw_http *h, size_t i, const char *host_port,
                                   pjs_error *err)
{
    if (i >= PJS_GW_MAX_WORKERS || strlen(host_port) >= sizeof h->metrics_addr[i])
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "worker %zu metrics address %.64s: no such worker or too long", i,
                             host_port);
    pthread_mutex_lock(&h->lock);
    snprintf(h->metrics_addr[i], sizeof h->metrics_addr[i], "%s", host_port);
    pthread_mutex_unlock(&h->lock);
    return 0;
}

void pjs_gw_http_stop(pjs_gw_http *h)
{
    if (h == NULL)
        return;
    /* The REST port stops accepting and the metrics port stops while the
     * proxy thread still answers their calls; the thread ends once it has
     * answered the REST port's (or its grace period is over), and the REST
     * port's daemon, which it ran, stops after it. */
    if (h->thread_running)
        tell_thread(h, &h->quiesce);
    pjs_http_frontend_stop(h->metrics);
    stop_thread(h);
    pjs_http_frontend_stop(h->rest);
    proxy_free(h);
}
