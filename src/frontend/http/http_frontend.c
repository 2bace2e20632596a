/*
 * http_frontend.c - the libmicrohttpd daemons behind the REST and metrics
 * ports: listening, the request lifecycle, bodies and replies. What a port
 * answers is its route set (http_internal.h): serve's or the gateway's.
 *
 * Lifecycle of a request (see http_internal.h for the threads). The first
 * handler call creates the call, and refuses a caller the access rules do
 * not let in (frontend/access.h) and a declared body over the limit. Body
 * chunks are appended. The final call inflates a compressed body and runs
 * the route, which stores a reply or leaves the call waiting on a suspended
 * connection; a reply is queued as soon as the handler runs with one
 * stored. The completion callback frees the call, whatever state it is in.
 *
 * A request refused before its body is all in (on its headers, or when the
 * body grows past a bound) lingers: the rest of the body is read and
 * dropped, and the reply queued once it is in, so that a client writing the
 * whole body before it reads sees the status rather than a reset (closing a
 * socket with unread bytes resets it, and libmicrohttpd closes after a
 * reply queued before the body). Lingering is bounded (PJS_HTTP_LINGER_*):
 * past the bound the connection is cut without a reply. A client that waits
 * to be asked for its body (Expect: 100-continue), or declares more than
 * the bound, is answered at once and never sends it.
 *
 * Shutdown. serve stops its ports after pjs_server_drain, so every
 * inference has completed and resumed its connection. It stops accepting
 * connections, marks replies "Connection: close", waits for suspended calls
 * (model loads, deferred jobs) to resume their connections and, for a grace period, for
 * open requests to finish sending their replies (so no answered request is
 * cut off), then stops the daemon, which closes the remaining connections
 * and completes their calls. A port on an external loop (the gateway's
 * REST port) is quiesced on the loop's thread and waited for there
 * (pjs__http_loop_done); pjs_http_frontend_stop runs once the loop ended.
 */
#include "frontend/http/http_internal.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/cpus.h"
#include "core/log.h"
#include "core/unix_addr.h"
#include "frontend/status_map.h"

/* Per-connection memory of libmicrohttpd: bounds the headers and the size
 * of body chunks. libmicrohttpd clears what a connection used after every
 * request, and its read buffer takes what is free, so this is cleared per
 * request: 256 KB cost the mlp 10 us of server CPU per request (13 %) over
 * 32 KB, its default, while a 32 MB body took as long to round-trip either
 * way (docs/serving.md, Limits). */
#define CONNECTION_MEMORY (32u * 1024u)
/* Most connection threads a default start picks. */
#define DEFAULT_THREADS_MAX 16
/* Threads and queue of deferred jobs (model control calls that wait for the
 * device owner); loads do not use them (the server's load thread answers). */
#define HTTP_JOB_THREADS 2
#define HTTP_JOB_QUEUE 64
/* How long stop waits for open requests to finish sending their replies. */
#define STOP_GRACE_SECONDS 5

/* ---- replies --------------------------------------------------------------- */

static void reply_clear(pjs__http_reply *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

void pjs__http_reply_buf(pjs__http_call *c, unsigned status, pjs_http_buf *b,
                         const char *content_type)
{
    reply_clear(&c->reply);
    c->reply.status = status;
    c->reply.body = pjs_http_buf_take(b, &c->reply.len);
    c->reply.content_type = content_type;
}

void pjs__http_reply_empty(pjs__http_call *c, unsigned status)
{
    reply_clear(&c->reply);
    c->reply.status = status;
}

/* The last resort when even an error body cannot be built. */
static void reply_out_of_memory(pjs__http_call *c)
{
    pjs__http_reply_empty(c, 500);
    pjs_error("http: out of memory answering %s %s", c->method, c->url);
}

static void reply_error_text(pjs__http_call *c, unsigned status, const char *msg)
{
    pjs_http_buf b;
    pjs_error err;
    pjs_http_buf_init(&b, PJS_ERROR_MSG_MAX * 8);
    if (pjs_http_error_json(msg, &b, &err) != 0) {
        pjs_http_buf_free(&b);
        reply_out_of_memory(c);
        return;
    }
    pjs__http_reply_buf(c, status, &b, "application/json");
}

void pjs__http_reply_error(pjs__http_call *c, const pjs_error *err)
{
    pjs__http_reply_error_status(c, 0, err);
}

void pjs__http_reply_error_status(pjs__http_call *c, unsigned status, const pjs_error *err)
{
    reply_error_text(c, status != 0 ? status : (unsigned)pjs_status_to_http(err->code),
                     err->msg);
    c->reply.answer_mark = pjs_answer_mark(err, false);
}

void pjs__http_reply_message(pjs__http_call *c, unsigned status, const char *fmt, ...)
{
    char msg[PJS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply_error_text(c, status, msg);
}

void pjs__http_reply_json(pjs__http_call *c, unsigned status, json_t *doc)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (text == NULL) {
        reply_out_of_memory(c);
        return;
    }
    reply_clear(&c->reply);
    c->reply.status = status;
    c->reply.body = text;
    c->reply.len = strlen(text);
    c->reply.content_type = "application/json";
}

/* Hands the stored reply to libmicrohttpd. */
static enum MHD_Result queue_reply(pjs__http_call *c)
{
    pjs__http_reply *r = &c->reply;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        reply_clear(r);
        return MHD_NO;
    }
    r->body = NULL; /* the response owns it now */
    bool ok = true;
    if (r->content_type != NULL)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (ok && r->allow != NULL)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (ok && r->www_authenticate)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (ok && r->answer_mark != NULL)
        ok = MHD_add_response_header(resp, PJS_ANSWER_MARK, r->answer_mark);
    if (ok && r->inference_header > 0) {
        char len[32];
        snprintf(len, sizeof len, "%zu", r->inference_header);
        ok = MHD_add_response_header(resp, "Inference-Header-Content-Length", len);
    }
    if (ok && atomic_load(&c->fe->stopping))
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = ok ? MHD_queue_response(c->conn, r->status, resp) : MHD_NO;
    MHD_destroy_response(resp);
    pjs_debug("http: %s %s -> %u", c->method, c->url, r->status);
    return ret;
}

/* ---- deferred work ------------------------------------------------------- */

typedef struct deferred_job {
    pjs__http_call *call;
    void (*fn)(pjs__http_call *c);
} deferred_job;

/* Adds delta to one of the shutdown counts of fe. */
static void count_add(pjs_http_frontend *fe, int *count, int delta)
{
    pthread_mutex_lock(&fe->lock);
    *count += delta;
    if (*count == 0)
        pthread_cond_broadcast(&fe->idle);
    pthread_mutex_unlock(&fe->lock);
}

void pjs__http_suspend(pjs__http_call *c)
{
    c->waiting = true;
    MHD_suspend_connection(c->conn);
    count_add(c->fe, &c->fe->jobs, 1);
}

void pjs__http_resume(pjs__http_call *c)
{
    pjs_http_frontend *fe = c->fe;
    MHD_resume_connection(c->conn); /* the last touch of the call */
    count_add(fe, &fe->jobs, -1);
}

static void run_deferred(void *arg, bool cancelled)
{
    deferred_job job = *(deferred_job *)arg;
    free(arg);
    if (cancelled)
        pjs__http_reply_message(job.call, 503, "the server is shutting down");
    else
        job.fn(job.call);
    pjs__http_resume(job.call);
}

void pjs__http_defer(pjs__http_call *c, void (*fn)(pjs__http_call *c))
{
    deferred_job *job = malloc(sizeof *job);
    if (job == NULL) {
        pjs__http_reply_message(c, 500, "out of memory");
        return;
    }
    *job = (deferred_job){c, fn};
    pjs__http_suspend(c);
    pjs_error err;
    if (pjs_work_pool_submit(c->fe->jobs_pool, run_deferred, job, &err) != 0) {
        free(job);
        pjs__http_reply_error(c, &err);
        pjs__http_resume(c);
    }
}

/* ---- the request lifecycle ------------------------------------------------ */

/* Refuses the body with `status` (the reply goes out once the handler may
 * queue it) and lets go of what was kept of it. */
static void refuse_body(pjs__http_call *c, unsigned status, pjs_status code, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));
static void refuse_body(pjs__http_call *c, unsigned status, pjs_status code, const char *fmt,
                        ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->body_error.msg, sizeof c->body_error.msg, fmt, ap);
    va_end(ap);
    c->body_error.code = code;
    c->body_status = status;
    pjs_http_buf_free(&c->body);
    pjs_byte_budget_give(c->fe->budget, c->budget_taken);
    c->budget_taken = 0;
}

/* 413 for a body (or its inflated bytes) of `size` bytes over the limit. */
static void refuse_too_large(pjs__http_call *c, const char *what, unsigned long long size)
{
    refuse_body(c, 413, PJS_ERR_RESOURCE_EXHAUSTED,
                "%s of %llu bytes exceeds %s", what, size, c->limit_what);
}

/* Whether the request declares a Content-Encoding other than identity. */
static bool declares_encoding(struct MHD_Connection *conn)
{
    const char *e =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    return e != NULL && e[0] != '\0' && strcasecmp(e, "identity") != 0;
}

/* What the headers say about the body, decided before any of it is read. */
static void judge_declared_body(pjs__http_call *c)
{
    const pjs__http_routes *routes = c->fe->routes;
    uint64_t cap = c->fe->max_request_bytes;
    c->body_limit = cap < PJS_HTTP_MAX_BODY ? (size_t)cap : PJS_HTTP_MAX_BODY;
    snprintf(c->limit_what, sizeof c->limit_what,
             "the server's limit of %zu bytes (raise it with --max-request-bytes)",
             c->body_limit);
    c->encoded = declares_encoding(c->conn);
    c->takes_body = routes->keeps_bodies && strcmp(c->method, "POST") == 0;
    if (c->encoded && !c->takes_body) {
        refuse_body(c, 415, PJS_ERR_UNSUPPORTED,
                    "%s %.256s takes no body: Content-Encoding is accepted only on POST requests "
                    "to the REST endpoints, and nothing was inflated",
                    c->method, c->url);
        return;
    }
    const char *declared =
        MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long length = declared ? strtoull(declared, NULL, 10) : 0;
    if (length > cap) {
        refuse_too_large(c, "a request body", length);
        return;
    }
    if (c->takes_body && routes->limit_body != NULL && !routes->limit_body(c))
        return;
    pjs_byte_budget *budget = c->fe->budget;
    uint64_t used = pjs_byte_budget_used(budget);
    if (c->takes_body && length > c->body_limit)
        refuse_too_large(c, "a request body", length);
    else if (c->takes_body && length > 0 && budget->limit != 0 &&
             (used >= budget->limit || length > budget->limit - used))
        refuse_body(c, 429, PJS_ERR_RESOURCE_EXHAUSTED,
                    "a request body of %llu bytes does not fit in what is left of the server's "
                    "budget of %llu bytes for requests in flight "
                    "(--max-inflight-request-bytes); retry later",
                    length, (unsigned long long)budget->limit);
}

static pjs__http_call *call_create(pjs_http_frontend *fe, struct MHD_Connection *conn,
                                   const char *method, const char *url)
{
    pjs__http_call *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    count_add(fe, &fe->open_calls, 1);
    c->fe = fe;
    c->conn = conn;
    c->method = method;
    c->url = url;
    c->track = pjs__http_conn_of(conn);
    pjs__http_conn_phase(c, PJS_HTTP_PHASE_BODY);
    pjs_http_buf_init(&c->body, PJS_HTTP_MAX_BODY);
    judge_declared_body(c);
    c->body.limit = c->body_limit;
    return c;
}

/* Buffers past this size leave the heap trimmed when they are freed, so a
 * refused bomb does not stay resident. */
#define TRIM_AFTER_BYTES ((size_t)8 << 20)

static void call_free(pjs__http_call *c)
{
    pjs_http_frontend *fe = c->fe;
    if (fe->routes->release != NULL)
        fe->routes->release(c);
    reply_clear(&c->reply);
    pjs_http_buf_free(&c->body);
    pjs_byte_budget_give(fe->budget, c->budget_taken);
    bool trim = c->body_peak >= TRIM_AFTER_BYTES;
    free(c);
    if (trim)
        malloc_trim(0);
    count_add(fe, &fe->open_calls, -1);
}

static void append_body(pjs__http_call *c, const char *data, size_t size)
{
    if (!c->takes_body)
        return; /* a request that takes no body: read to the end, keep nothing */
    if (size > c->body.limit - c->body.len) {
        refuse_too_large(c, "a request body", (unsigned long long)c->body.len + size);
        return;
    }
    pjs_error err;
    if (pjs_byte_budget_take_or_fail(c->fe->budget, size, "a request body", &err) != 0) {
        refuse_body(c, 429, err.code, "%s", err.msg);
        return;
    }
    c->budget_taken += size;
    if (pjs_http_buf_append(&c->body, data, size, &err) != 0) {
        refuse_body(c, 503, PJS_ERR_UNAVAILABLE, "out of memory receiving the body; retry later");
        return;
    }
    if (c->body.cap > c->body_peak)
        c->body_peak = c->body.cap;
}

bool pjs__http_body_ready(pjs__http_call *c)
{
    if (!c->encoded)
        return true;
    const char *encoding =
        MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    pjs_byte_budget *budget = c->fe->budget;
    pjs_http_buf plain;
    pjs_error err;
    bool used = false;
    uint64_t charged = 0;
    pjs_http_buf_init(&plain, c->body_limit);
    int rc = pjs_http_inflate(encoding, c->body.data, c->body.len, &plain, budget, &charged,
                              &used, &err);
    if (plain.cap > c->body_peak)
        c->body_peak = plain.cap;
    c->encoded = false;
    if (rc != 0 && plain.len >= plain.limit) {
        pjs_http_buf_free(&plain);
        pjs_byte_budget_give(budget, charged);
        refuse_too_large(c, "the inflated request body", (unsigned long long)plain.limit + 1);
        pjs__http_reply_error_status(c, c->body_status, &c->body_error);
        return false;
    }
    if (rc != 0) {
        pjs_http_buf_free(&plain);
        pjs_byte_budget_give(budget, charged);
        pjs__http_reply_error(c, &err);
        return false;
    }
    /* The compressed bytes go, and their share of the budget with them. */
    pjs_byte_budget_give(budget, c->budget_taken);
    c->budget_taken = charged;
    pjs_http_buf_free(&c->body);
    c->body = plain;
    return true;
}

static void dispatch(pjs__http_call *c)
{
    c->dispatched = true;
    pjs__http_conn_phase(c, PJS_HTTP_PHASE_ANSWERING);
    if (atomic_load(&c->fe->stopping)) {
        /* A request on a connection kept alive past the stop: refused
         * before anything ran (a gateway sends it elsewhere), and never
         * suspended, so none is once the daemon stops. */
        pjs_error err;
        pjs_error_set(&err, PJS_ERR_DRAINING,
                      "pjserve is shutting down and accepts no new requests");
        pjs__http_reply_error(c, &err);
        return;
    }
    c->fe->routes->route(c);
}

/* Whether a body will follow the headers of c without the server asking
 * for it, small enough to be read and dropped before the reply: declared
 * within the linger bound, or chunked. */
static bool body_follows_unasked(pjs__http_call *c)
{
    const char *expect =
        MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    if (expect != NULL && strcasecmp(expect, "100-continue") == 0)
        return false;
    const char *declared =
        MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (declared == NULL)
        return MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                           MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
    unsigned long long length = strtoull(declared, NULL, 10);
    return length > 0 && length <= PJS_HTTP_LINGER_MAX_BYTES;
}

/* A refusal is stored before the body is all in: the rest of the body is
 * read and dropped, then the reply sent. */
static void linger(pjs__http_call *c)
{
    c->dispatched = true;
    c->lingering = true;
    c->linger_left = PJS_HTTP_LINGER_MAX_BYTES;
    pjs__http_conn_phase(c, PJS_HTTP_PHASE_LINGER);
}

/* The first handler call of a request: its headers are in. */
static enum MHD_Result on_headers(pjs__http_call *c)
{
    /* false: a 400 (a path with dot or empty segments), 401 or 403 is stored */
    bool allowed = pjs__http_path_clean(c) && pjs__http_access_allowed(c);
    if (allowed && c->body_error.code == PJS_OK)
        return MHD_YES;
    if (allowed) /* refused for the body its headers declare */
        pjs__http_reply_error_status(c, c->body_status, &c->body_error);
    if (body_follows_unasked(c)) {
        linger(c);
        return MHD_YES;
    }
    /* Answered before a byte of the body is sent. */
    c->dispatched = true;
    pjs__http_conn_phase(c, PJS_HTTP_PHASE_ANSWERING);
    return queue_reply(c);
}

/* Body bytes of a request. */
static enum MHD_Result on_body(pjs__http_call *c, const char *data, size_t size)
{
    if (!c->lingering) {
        append_body(c, data, size);
        if (c->body_error.code != PJS_OK) { /* refused as the body grew */
            pjs__http_reply_error_status(c, c->body_status, &c->body_error);
            linger(c);
        }
        return MHD_YES;
    }
    if (size <= c->linger_left) {
        c->linger_left -= size;
        return MHD_YES;
    }
    /* Past the bound: cut, reading on (and dropping) until libmicrohttpd
     * sees the end; a connection without a record is closed at once. */
    c->linger_left = 0;
    return pjs__http_conn_cut(c) ? MHD_YES : MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    pjs__http_call *c = *con_cls;
    if (c == NULL) {
        c = call_create(cls, conn, method, url);
        if (c == NULL)
            return MHD_NO; /* out of memory: drop the connection */
        *con_cls = c;
        return on_headers(c);
    }
    if (*upload_data_size > 0) {
        size_t size = *upload_data_size;
        *upload_data_size = 0;
        return on_body(c, upload_data, size);
    }
    if (c->waiting) { /* resumed: the reply is stored */
        c->waiting = false;
        return queue_reply(c);
    }
    if (c->lingering) { /* the rest of a refused body is in: its reply goes out */
        c->lingering = false;
        pjs__http_conn_phase(c, PJS_HTTP_PHASE_ANSWERING);
        return queue_reply(c);
    }
    if (c->dispatched)
        return MHD_YES; /* a reply was refused earlier; nothing more to send */
    dispatch(c);
    if (c->waiting)
        return MHD_YES;
    return queue_reply(c);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    pjs__http_call *c = *con_cls;
    if (c != NULL) {
        pjs__http_conn_phase(c, PJS_HTTP_PHASE_KEEPALIVE);
        call_free(c);
    }
    *con_cls = NULL;
}

static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    pjs_http_frontend *fe = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        msg[--n] = '\0';
    /* Rate-limited: a resource error (a full connection table, no
     * descriptors left) repeats as fast as clients connect. */
    pjs_log_limited(&fe->mhd_log, PJS_LOG_WARN, "http %s: %s", fe->address, msg);
}

/* ---- start and stop ------------------------------------------------------- */

/* Listens on the Unix-domain socket at path (core/unix_addr.h), replacing
 * a socket an earlier process left there; anything else at the path is
 * refused. */
static int listen_on_unix(const char *path, int *out_fd, pjs_error *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    *out_fd = -1;
    if (strlen(path) > PJS_UNIX_PATH_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "Unix socket path %s is longer than the %zu bytes a socket path "
                             "may have",
                             path, (size_t)PJS_UNIX_PATH_MAX);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
        int rc = pjs_error_set(err, PJS_ERR_IO, "cannot listen on unix:%s: %s", path,
                               strerror(errno));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    *out_fd = fd;
    return 0;
}

/* Binds and listens on host:port (or the Unix socket host names), with the
 * operating system's reason on failure. */
static int listen_on(const char *host, int port, int *out_fd, pjs_error *err)
{
    if (pjs_unix_path(host) != NULL)
        return listen_on_unix(pjs_unix_path(host), out_fd, err);
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *found = NULL;
    int gai = getaddrinfo(host, service, &hints, &found);
    if (gai != 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "cannot resolve %s: %s", host,
                             gai_strerror(gai));
    int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    int rc = 0;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        rc = pjs_error_set(err, PJS_ERR_IO, "cannot listen on %s:%d: %s", host, port,
                           strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(found);
    *out_fd = fd;
    return rc;
}

static int bound_port(int fd, int fallback)
{
    struct sockaddr_storage addr;
    socklen_t len = sizeof addr;
    if (getsockname(fd, (struct sockaddr *)&addr, &len) != 0)
        return fallback;
    if (addr.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&addr)->sin_port);
    if (addr.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    return fallback;
}

/* One per CPU: a second thread on one CPU cannot run in parallel, and
 * requests queued behind another thread's execution add hand-offs (on one
 * CPU, the mlp's server CPU per request over HTTP at concurrency 4 was
 * 31-35 us with one thread, 54 us with two). */
static unsigned default_threads(void)
{
    int cpus = pjs_cpus_schedulable();
    if (cpus < 1)
        return 1;
    return cpus > DEFAULT_THREADS_MAX ? DEFAULT_THREADS_MAX : (unsigned)cpus;
}

/* Connections a default start allows at most, and the share of the soft
 * descriptor limit it keeps under (gRPC, the other HTTP port, model files and
 * the PJRT plugin need descriptors too). */
#define DEFAULT_MAX_CONNECTIONS 1000u
#define DEFAULT_MAX_CONNECTIONS_PER_IP 256u
#define DEFAULT_IDLE_TIMEOUT_S 60u
#define DEFAULT_HEADER_TIMEOUT_S 10u
#define DEFAULT_BODY_TIMEOUT_S 60u
/* Largest PEM file read for HTTPS. */
#define PEM_MAX_BYTES ((size_t)1 << 20)

static uint64_t soft_file_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    return (uint64_t)rl.rlim_cur;
}

/* Fills fe->opts from o with the defaults of the zero fields. */
static void resolve_options(pjs_http_frontend *fe, const pjs_http_options *o)
{
    pjs_http_options *r = &fe->opts;
    *r = *o;
    uint64_t files = soft_file_limit();
    if (r->max_connections == 0) {
        uint64_t quarter = files / 4;
        r->max_connections = quarter < DEFAULT_MAX_CONNECTIONS ? (unsigned)quarter
                                                              : DEFAULT_MAX_CONNECTIONS;
        if (r->max_connections < 16)
            r->max_connections = 16;
    } else if (files != UINT64_MAX && r->max_connections + 64u > files) {
        pjs_warn("%s: %u connections (--http-max-connections) come close to the file "
                 "descriptor limit of %llu: raise `ulimit -n` or lower the cap",
                 fe->address, r->max_connections, (unsigned long long)files);
    }
    if (r->max_connections_per_ip == 0)
        r->max_connections_per_ip = DEFAULT_MAX_CONNECTIONS_PER_IP;
    if (r->idle_timeout_s == 0)
        r->idle_timeout_s = DEFAULT_IDLE_TIMEOUT_S;
    if (r->header_timeout_s == 0)
        r->header_timeout_s = DEFAULT_HEADER_TIMEOUT_S;
    if (r->body_timeout_s == 0)
        r->body_timeout_s = DEFAULT_BODY_TIMEOUT_S;
}

/* Reads a PEM file given by `flag` into a NUL-terminated string. */
static int read_pem(const char *flag, const char *path, char **out, pjs_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return pjs_error_set(err, PJS_ERR_IO, "%s %s: cannot open: %s", flag, path,
                             strerror(errno));
    /* One byte more than the largest file, to tell a file that is too large. */
    char *text = malloc(PEM_MAX_BYTES + 2);
    size_t n = text ? fread(text, 1, PEM_MAX_BYTES + 1, f) : 0;
    int failed = text == NULL || ferror(f);
    fclose(f);
    if (failed) {
        free(text);
        return pjs_error_set(err, PJS_ERR_IO, "%s %s: cannot read it", flag, path);
    }
    text[n] = '\0';
    if (n > PEM_MAX_BYTES || strstr(text, "-----BEGIN") == NULL) {
        free(text);
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s %s: not a PEM file (expected \"-----BEGIN ...\", at most %zu "
                             "bytes)",
                             flag, path, PEM_MAX_BYTES);
    }
    *out = text;
    return 0;
}

static void free_pem(pjs_http_frontend *fe)
{
    free(fe->tls_key_pem);
    free(fe->tls_cert_pem);
    free(fe->tls_ca_pem);
}

/* Reads the HTTPS files, after checking that libmicrohttpd has TLS. */
static int load_tls(pjs_http_frontend *fe, pjs_error *err)
{
    const pjs_http_options *o = &fe->opts;
    if (o->tls_cert == NULL)
        return 0;
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "this libmicrohttpd was built without TLS: HTTPS "
                             "(--http-tls-cert) is not available");
    int rc = read_pem("--http-tls-cert", o->tls_cert, &fe->tls_cert_pem, err);
    if (rc == 0)
        rc = read_pem("--http-tls-key", o->tls_key, &fe->tls_key_pem, err);
    if (rc == 0 && o->tls_ca != NULL)
        rc = read_pem("--http-tls-ca", o->tls_ca, &fe->tls_ca_pem, err);
    return rc;
}

/* Starts the libmicrohttpd daemon on the listening socket fd. */
static struct MHD_Daemon *start_daemon(pjs_http_frontend *fe, int fd, unsigned threads)
{
    const pjs_http_options *o = &fe->opts;
    struct MHD_OptionItem opts[20];
    size_t n = 0;
#define OPT(name, v, p) (opts[n++] = (struct MHD_OptionItem){(name), (intptr_t)(v), (p)})
    OPT(MHD_OPTION_EXTERNAL_LOGGER, log_mhd, fe);
    OPT(MHD_OPTION_LISTEN_SOCKET, fd, NULL);
    OPT(MHD_OPTION_NOTIFY_COMPLETED, on_completed, fe);
    OPT(MHD_OPTION_NOTIFY_CONNECTION, pjs__http_conn_notify, fe);
    OPT(MHD_OPTION_URI_LOG_CALLBACK, pjs__http_conn_request_line, fe);
    OPT(MHD_OPTION_CONNECTION_MEMORY_LIMIT, CONNECTION_MEMORY, NULL);
    OPT(MHD_OPTION_CONNECTION_LIMIT, o->max_connections, NULL);
    OPT(MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_connections_per_ip, NULL);
    OPT(MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s, NULL);
    /* One thread is libmicrohttpd's internal polling thread; more, a pool of
     * them (it refuses a pool of one). An external loop has none. */
    if (threads > 1 && !fe->routes->external_loop)
        OPT(MHD_OPTION_THREAD_POOL_SIZE, threads, NULL);
    if (fe->tls_cert_pem != NULL) {
        OPT(MHD_OPTION_HTTPS_MEM_CERT, 0, fe->tls_cert_pem);
        OPT(MHD_OPTION_HTTPS_MEM_KEY, 0, fe->tls_key_pem);
        if (fe->tls_ca_pem != NULL)
            OPT(MHD_OPTION_HTTPS_MEM_TRUST, 0, fe->tls_ca_pem);
    }
    OPT(MHD_OPTION_END, 0, NULL);
#undef OPT
    /* Suspending and resuming brings an inter-thread channel, which a
     * quiesced daemon needs too. */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (!fe->routes->external_loop)
        flags |= MHD_USE_INTERNAL_POLLING_THREAD;
    if (fe->tls_cert_pem != NULL)
        flags |= MHD_USE_TLS;
    return MHD_start_daemon(flags, 0, NULL, NULL, on_request, fe, MHD_OPTION_ARRAY, opts,
                            MHD_OPTION_END);
}

/* Frees a front end that never started or has stopped. */
static void frontend_free(pjs_http_frontend *fe)
{
    pjs_work_pool_destroy(fe->jobs_pool);
    pjs__http_infer_pool_drain(fe);
    pthread_mutex_destroy(&fe->infer_pool_lock);
    pthread_cond_destroy(&fe->conn_wake);
    pthread_mutex_destroy(&fe->conn_lock);
    pthread_cond_destroy(&fe->idle);
    pthread_mutex_destroy(&fe->lock);
    free_pem(fe);
    free(fe);
}

int pjs__http_frontend_start(const pjs__http_routes *routes, void *routes_ctx,
                             const pjs_http_options *o, pjs_byte_budget *budget,
                             uint64_t max_request_bytes, pjs_http_frontend **out,
                             pjs_error *err)
{
    *out = NULL;
    const char *host = o->host && o->host[0] ? o->host : "0.0.0.0";
    pjs_http_frontend *fe = calloc(1, sizeof *fe);
    if (fe == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    fe->routes = routes;
    fe->routes_ctx = routes_ctx;
    fe->budget = budget;
    fe->max_request_bytes = max_request_bytes;
    fe->access = o->access;
    pthread_mutex_init(&fe->lock, NULL);
    pthread_cond_init(&fe->idle, NULL);
    pthread_mutex_init(&fe->conn_lock, NULL);
    pthread_mutex_init(&fe->infer_pool_lock, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&fe->conn_wake, &monotonic);
    pthread_condattr_destroy(&monotonic);
    atomic_init(&fe->stopping, false);
    snprintf(fe->address, sizeof fe->address, "%s:%d", host, o->port);
    resolve_options(fe, o);
    int fd = -1;
    int rc = load_tls(fe, err);
    if (rc == 0 && routes->defers_jobs)
        rc = pjs_work_pool_create("REST control requests", HTTP_JOB_THREADS, HTTP_JOB_QUEUE,
                                  &fe->jobs_pool, err);
    if (rc == 0)
        rc = listen_on(host, o->port, &fd, err);
    if (rc != 0)
        goto fail;
    if (pjs_unix_path(host) != NULL)
        snprintf(fe->address, sizeof fe->address, "%s", host);
    else
        snprintf(fe->address, sizeof fe->address, "%s:%d", host, bound_port(fd, o->port));
    unsigned threads = routes->external_loop   ? 1
                       : o->threads > 0         ? (unsigned)o->threads
                       : !routes->keeps_bodies ? 1 /* metrics: one scrape at a time */
                                               : default_threads();
    rc = pjs__http_watchdog_start(fe, err);
    if (rc != 0) {
        close(fd);
        goto fail;
    }
    fe->daemon = start_daemon(fe, fd, threads);
    if (fe->daemon == NULL) {
        close(fd);
        pjs__http_watchdog_stop(fe);
        rc = pjs_error_set(err, PJS_ERR_IO, "cannot start the %s server on %s%s",
                           fe->tls_cert_pem ? "HTTPS" : "HTTP", fe->address,
                           fe->tls_cert_pem ? " (is --http-tls-key the private key of the "
                                              "certificate in --http-tls-cert, both PEM?)"
                                            : "");
        goto fail;
    }
    if (routes->external_loop) {
        const union MHD_DaemonInfo *info =
            MHD_get_daemon_info(fe->daemon, MHD_DAEMON_INFO_EPOLL_FD);
        fe->loop_fd = info != NULL ? info->epoll_fd : -1;
    }
    const pjs_http_options *r = &fe->opts;
    pjs_info("%s listening on %s%s (%u thread%s; at most %u connections, %u per client "
             "address; idle timeout %u s, headers within %u s, bodies within %u s)",
             routes->what, fe->address,
             fe->tls_ca_pem     ? " with HTTPS and client certificates"
             : fe->tls_cert_pem ? " with HTTPS"
                                : "",
             threads, threads == 1 ? "" : "s", r->max_connections, r->max_connections_per_ip,
             r->idle_timeout_s, r->header_timeout_s, r->body_timeout_s);
    *out = fe;
    return 0;
fail:
    frontend_free(fe);
    return rc;
}

/* Stops accepting connections and starts the grace period. */
static void quiesce(pjs_http_frontend *f)
{
    if (f->quiesced)
        return;
    f->quiesced = true;
    atomic_store(&f->stopping, true);
    clock_gettime(CLOCK_REALTIME, &f->stop_deadline);
    f->stop_deadline.tv_sec += STOP_GRACE_SECONDS;
    MHD_socket listener = MHD_quiesce_daemon(f->daemon);
    if (listener != MHD_INVALID_SOCKET)
        close(listener);
}

static void warn_open_calls(pjs_http_frontend *f)
{
    if (f->open_calls > 0)
        pjs_warn("%s: closing %d connections with requests still open", f->address,
                 f->open_calls);
}

/* Waits for deferred jobs, then up to the grace period for open calls. */
static void wait_for_calls(pjs_http_frontend *f)
{
    pthread_mutex_lock(&f->lock);
    while (f->jobs > 0)
        pthread_cond_wait(&f->idle, &f->lock);
    while (f->open_calls > 0 &&
           pthread_cond_timedwait(&f->idle, &f->lock, &f->stop_deadline) == 0)
        continue;
    warn_open_calls(f);
    /* libmicrohttpd aborts the process when stopped with a connection
     * suspended: one suspended just before `stopping` was set is waited
     * for too (it is answered: its job ends, in time, on every path). */
    while (f->jobs > 0)
        pthread_cond_wait(&f->idle, &f->lock);
    pthread_mutex_unlock(&f->lock);
}

void pjs_http_frontend_stop(pjs_http_frontend *f)
{
    if (f == NULL)
        return;
    quiesce(f);
    /* An external loop waited for the calls before it ended. */
    if (!f->routes->external_loop)
        wait_for_calls(f);
    MHD_stop_daemon(f->daemon);
    pjs__http_watchdog_stop(f);
    frontend_free(f);
}

/* ---- an external loop ------------------------------------------------------ */

int pjs__http_loop_fd(pjs_http_frontend *fe)
{
    return fe->loop_fd;
}

int pjs__http_loop_run(pjs_http_frontend *fe)
{
    MHD_run(fe->daemon);
    /* At its connection limit libmicrohttpd stops polling its listening
     * socket, and polls it again only at the start of the run after a
     * connection closed: without that run, a connection evicted to admit a
     * new one would leave the new one waiting until the next timeout. */
    pthread_mutex_lock(&fe->conn_lock);
    bool rearm = fe->freed_at_limit;
    fe->freed_at_limit = false;
    pthread_mutex_unlock(&fe->conn_lock);
    if (rearm)
        MHD_run(fe->daemon);
    MHD_UNSIGNED_LONG_LONG ms;
    if (MHD_get_timeout(fe->daemon, &ms) != MHD_YES)
        return -1;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

void pjs__http_loop_quiesce(pjs_http_frontend *fe)
{
    quiesce(fe);
}

bool pjs__http_loop_done(pjs_http_frontend *fe)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    bool grace_over = now.tv_sec > fe->stop_deadline.tv_sec ||
                      (now.tv_sec == fe->stop_deadline.tv_sec &&
                       now.tv_nsec >= fe->stop_deadline.tv_nsec);
    pthread_mutex_lock(&fe->lock);
    bool done = fe->quiesced && fe->jobs == 0 && (fe->open_calls == 0 || grace_over);
    if (done)
        warn_open_calls(fe);
    pthread_mutex_unlock(&fe->lock);
    return done;
}
