/*
 * http_frontend.c - the libmicrohttpd daemons behind the REST and metrics
 * ports: listening, the request lifecycle, bodies and replies.
 *
 * Lifecycle of a request (see http_internal.h for the threads). The first
 * handler call creates the call, and refuses at once a caller the access
 * rules do not let in (frontend/access.h) and a declared body over the
 * limit. Body chunks are appended (a chunked body that grows past the
 * limit is read to the end and discarded, then refused). The final call
 * inflates a compressed body and runs the route, which stores a reply or
 * leaves the call waiting on a suspended connection; a reply is queued as
 * soon as the handler runs with one stored. The completion callback frees
 * the call, whatever state it is in.
 *
 * Shutdown. pjs_http_frontend_stop runs after pjs_server_drain, so every
 * inference has completed and resumed its connection. It stops accepting
 * connections, marks replies "Connection: close", waits for suspended calls
 * (model loads, deferred jobs) to resume their connections and, for a grace period, for
 * open requests to finish sending their replies (so no answered request is
 * cut off), then stops the daemon, which closes the remaining connections
 * and completes their calls.
 */
#include "frontend/http/http_internal.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "frontend/status_map.h"

/* Per-connection read buffer: bounds headers and the size of body chunks. */
#define CONNECTION_MEMORY (256u * 1024u)
/* Most connection threads a default start picks. */
#define DEFAULT_THREADS_MAX 16
/* Threads and queue of deferred jobs (model control calls that wait for the
 * dispatch thread); loads do not use them (the server's load thread answers). */
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
    reply_error_text(c, (unsigned)pjs_status_to_http(err->code), err->msg);
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

/* Refuses a body (the reply goes out once the handler may queue it). */
static void refuse_body(pjs__http_call *c, const char *what, size_t size)
{
    pjs_error_set(&c->body_error, PJS_ERR_INVALID_ARGUMENT,
                  "%s of %zu bytes exceeds the limit of %zu bytes", what, size,
                  (size_t)PJS_HTTP_MAX_BODY);
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
    pjs_http_buf_init(&c->body, PJS_HTTP_MAX_BODY);
    const char *declared =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long length = declared ? strtoull(declared, NULL, 10) : 0;
    if (length > PJS_HTTP_MAX_BODY)
        refuse_body(c, "request body", (size_t)length);
    else if (length > 0 && pjs_http_buf_reserve(&c->body, (size_t)length, &c->body_error) != 0)
        c->body_error.code = PJS_ERR_UNAVAILABLE; /* out of memory: try again later */
    return c;
}

static void call_free(pjs__http_call *c)
{
    pjs_http_frontend *fe = c->fe;
    pjs__http_infer_discard(c);
    reply_clear(&c->reply);
    pjs_http_buf_free(&c->body);
    free(c);
    count_add(fe, &fe->open_calls, -1);
}

static void append_body(pjs__http_call *c, const char *data, size_t size)
{
    if (c->body_error.code != PJS_OK)
        return; /* refused: read to the end, keep nothing */
    if (size > c->body.limit - c->body.len) {
        refuse_body(c, "request body", c->body.len + size);
        pjs_http_buf_free(&c->body);
        return;
    }
    pjs_http_buf_append(&c->body, data, size, &c->body_error);
}

/* Replaces a compressed body with its inflated bytes. */
static int inflate_body(pjs__http_call *c, pjs_error *err)
{
    const char *encoding =
        MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    pjs_http_buf plain;
    bool used = false;
    pjs_http_buf_init(&plain, PJS_HTTP_MAX_BODY);
    int rc = pjs_http_inflate(encoding, c->body.data, c->body.len, &plain, &used, err);
    if (rc != 0 || !used) {
        pjs_http_buf_free(&plain);
        return rc;
    }
    pjs_http_buf_free(&c->body);
    c->body = plain;
    return 0;
}

static void dispatch(pjs__http_call *c)
{
    pjs_error err;
    c->dispatched = true;
    if (c->body_error.code != PJS_OK) {
        pjs__http_reply_error(c, &c->body_error);
        return;
    }
    if (inflate_body(c, &err) != 0) {
        pjs__http_reply_error(c, &err);
        return;
    }
    if (c->fe->metrics)
        pjs__http_route_metrics(c);
    else
        pjs__http_route_rest(c);
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
        if (!pjs__http_access_allowed(c)) { /* refused before any body byte is read */
            c->dispatched = true;
            return queue_reply(c);
        }
        if (c->body_error.code == PJS_OK)
            return MHD_YES;
        /* A declared body over the limit is refused before it is sent. */
        c->dispatched = true;
        pjs__http_reply_error(c, &c->body_error);
        return queue_reply(c);
    }
    if (*upload_data_size > 0) {
        append_body(c, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (c->waiting) { /* resumed: the reply is stored */
        c->waiting = false;
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
    if (*con_cls != NULL)
        call_free(*con_cls);
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
    pjs_warn("http %s: %s", fe->address, msg);
}

/* ---- start and stop ------------------------------------------------------- */

/* Binds and listens on host:port, with the operating system's reason on
 * failure. */
static int listen_on(const char *host, int port, int *out_fd, pjs_error *err)
{
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

static unsigned default_threads(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 2)
        return 2;
    return cpus > DEFAULT_THREADS_MAX ? DEFAULT_THREADS_MAX : (unsigned)cpus;
}

static int frontend_start(pjs_server *s, const pjs_http_options *o, bool metrics,
                          pjs_http_frontend **out, pjs_error *err)
{
    *out = NULL;
    const char *host = o->host && o->host[0] ? o->host : "0.0.0.0";
    pjs_http_frontend *fe = calloc(1, sizeof *fe);
    if (fe == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    fe->server = s;
    fe->metrics = metrics;
    fe->access = o->access;
    pthread_mutex_init(&fe->lock, NULL);
    pthread_cond_init(&fe->idle, NULL);
    atomic_init(&fe->stopping, false);
    int fd = -1;
    int rc = 0;
    if (!metrics)
        rc = pjs_work_pool_create("REST control requests", HTTP_JOB_THREADS, HTTP_JOB_QUEUE,
                                  &fe->jobs_pool, err);
    if (rc == 0)
        rc = listen_on(host, o->port, &fd, err);
    if (rc != 0)
        goto fail;
    snprintf(fe->address, sizeof fe->address, "%s:%d", host, bound_port(fd, o->port));
    unsigned threads = o->threads > 0 ? (unsigned)o->threads : metrics ? 1 : default_threads();
    /* One thread is libmicrohttpd's internal polling thread; more, a pool of
     * them (it refuses a pool of one). */
    fe->daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
            MHD_USE_ERROR_LOG,
        0, NULL, NULL, on_request, fe, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, fe,
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, fe,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY,
        threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, threads, MHD_OPTION_END);
    if (fe->daemon == NULL) {
        close(fd);
        rc = pjs_error_set(err, PJS_ERR_IO, "cannot start the HTTP server on %s", fe->address);
        goto fail;
    }
    pjs_info("%s listening on %s (%u thread%s)", metrics ? "metrics" : "HTTP/REST", fe->address,
             threads, threads == 1 ? "" : "s");
    *out = fe;
    return 0;
fail:
    pjs_work_pool_destroy(fe->jobs_pool);
    pthread_cond_destroy(&fe->idle);
    pthread_mutex_destroy(&fe->lock);
    free(fe);
    return rc;
}

int pjs_http_frontend_start(pjs_server *s, const pjs_http_options *o, pjs_http_frontend **out,
                            pjs_error *err)
{
    return frontend_start(s, o, false, out, err);
}

int pjs_metrics_frontend_start(pjs_server *s, const pjs_http_options *o,
                               pjs_http_frontend **out, pjs_error *err)
{
    return frontend_start(s, o, true, out, err);
}

/* Waits for deferred jobs, then up to the grace period for open calls. */
static void wait_for_calls(pjs_http_frontend *f)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += STOP_GRACE_SECONDS;
    pthread_mutex_lock(&f->lock);
    while (f->jobs > 0)
        pthread_cond_wait(&f->idle, &f->lock);
    while (f->open_calls > 0 && pthread_cond_timedwait(&f->idle, &f->lock, &deadline) == 0)
        continue;
    if (f->open_calls > 0)
        pjs_warn("%s: closing %d connections with requests still open", f->address,
                 f->open_calls);
    pthread_mutex_unlock(&f->lock);
}

void pjs_http_frontend_stop(pjs_http_frontend *f)
{
    if (f == NULL)
        return;
    atomic_store(&f->stopping, true);
    MHD_socket listener = MHD_quiesce_daemon(f->daemon);
    if (listener != MHD_INVALID_SOCKET)
        close(listener);
    wait_for_calls(f);
    MHD_stop_daemon(f->daemon);
    pjs_work_pool_destroy(f->jobs_pool);
    pthread_cond_destroy(&f->idle);
    pthread_mutex_destroy(&f->lock);
    free(f);
}
