/*
 * frontend.c - the gRPC front end's life: start, the completion-queue
 * threads, calls to methods nobody serves, and stop.
 *
 * Start creates the server on the gRPC C core with pjserve's channel
 * arguments (received messages up to the request limit, our own bounded
 * decompression instead of gRPC's, streams per connection, idle and
 * handshake timeouts, a memory quota, the descriptor guard of conn_guard.c,
 * keepalive, no SO_REUSEPORT so a port in use is an error), registers every
 * method of the table in unary.c, binds (plaintext, TLS or mTLS), requests
 * the first call of every method and starts the threads. Each thread waits
 * on the one completion queue and runs the tag of every event; between
 * events (or after PJS_GRPC_HEALTH_POLL_MS without one) it looks for
 * Health/Watch streams to update.
 *
 * Stop is described in internal.h; it leaves nothing allocated, and ends
 * with grpc_shutdown_blocking so the library's own threads are gone too.
 */
#include "core/thread_name.h"
#include "frontend/grpc/internal.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc_security.h>

#include "core/cpus.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/unix_addr.h"
#include "frontend/grpc/codec.h"

/* Completion-queue threads when the options leave it to us: one per CPU
 * the process may run on, at most this many (see default_threads). */
#define PJS_GRPC_DEFAULT_THREADS_MAX 2
/* Largest PEM file read for TLS. */
#define PJS_GRPC_PEM_MAX ((size_t)1 << 20)

/* ---- dispatcher accounting ----------------------------------------------- */

void pjs__grpc_call_born(pjs_grpc_frontend *f)
{
    pthread_mutex_lock(&f->lock);
    f->live_calls++;
    pthread_mutex_unlock(&f->lock);
}

void pjs__grpc_call_gone(pjs_grpc_frontend *f)
{
    pthread_mutex_lock(&f->lock);
    f->live_calls--;
    pthread_cond_broadcast(&f->changed);
    pthread_mutex_unlock(&f->lock);
}

void pjs__grpc_dispatch_begin(pjs_grpc_frontend *f)
{
    pthread_mutex_lock(&f->lock);
    f->in_dispatcher++;
    pthread_mutex_unlock(&f->lock);
}

void pjs__grpc_dispatch_end(pjs_grpc_frontend *f)
{
    pthread_mutex_lock(&f->lock);
    f->in_dispatcher--;
    pthread_cond_broadcast(&f->changed);
    pthread_mutex_unlock(&f->lock);
}

/* ---- calls to methods we do not serve ------------------------------------- */

/* A call to a method nobody serves. grpc_server_request_call hands over
 * the method's name and the deadline in `call_details`, so it is requested
 * here rather than by pjs__grpc_call_request, and base.method (SIZE_MAX) and
 * base.deadline stay unused. */
typedef struct unknown_call {
    pjs_grpc_call base;
    pjs_grpc_tag on_done;
    grpc_call_details call_details;
} unknown_call;

static void request_unknown(pjs_grpc_frontend *f);

static void unknown_free(unknown_call *c)
{
    grpc_call_details_destroy(&c->call_details);
    pjs__grpc_call_destroy(&c->base);
    free(c);
}

static void unknown_on_done(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    unknown_free(PJS_GRPC_CONTAINER(tag, unknown_call, on_done));
}

static void unknown_on_new(pjs_grpc_tag *tag, bool ok)
{
    unknown_call *c = PJS_GRPC_CONTAINER(tag, unknown_call, base.on_new);
    if (!ok) {
        unknown_free(c);
        return;
    }
    pjs_grpc_frontend *f = c->base.frontend;
    request_unknown(f);
    if (f->proxy != NULL) {
        grpc_call *call = c->base.call;
        c->base.call = NULL; /* the proxy's now, with the metadata */
        grpc_metadata_array md = c->base.metadata;
        grpc_metadata_array_init(&c->base.metadata);
        pjs__grpc_proxy_serve(f, call, &md, &c->call_details.method);
        unknown_free(c);
        return;
    }
    pjs_error err;
    grpc_slice method = c->call_details.method;
    size_t len = GRPC_SLICE_LENGTH(method);
    pjs_error_set(&err, PJS_ERR_UNSUPPORTED, "pjserve does not serve the method %.*s",
                  (int)(len > 256 ? 256 : len), (const char *)GRPC_SLICE_START_PTR(method));
    if (pjs__grpc_reply(&c->base, NULL, &err, &c->on_done) != GRPC_CALL_OK)
        unknown_free(c);
}

static void request_unknown(pjs_grpc_frontend *f)
{
    if (atomic_load(&f->stopping))
        return;
    unknown_call *c = calloc(1, sizeof *c);
    if (c == NULL)
        return;
    pjs__grpc_call_init(&c->base, f, SIZE_MAX, unknown_on_new);
    c->on_done.fn = unknown_on_done;
    grpc_call_details_init(&c->call_details);
    if (grpc_server_request_call(f->core, &c->base.call, &c->call_details, &c->base.metadata, f->cq,
                                 f->cq, pjs__grpc_tag_arm(&c->base.on_new)) != GRPC_CALL_OK)
        unknown_free(c);
}

/* Forwarding, ModelInfer (what a gateway's cost per request is measured
 * on) is registered to arrive with its message: one completion-queue
 * event and batch fewer per call than an unknown call's, which reads it
 * after. Every other method arrives as an unknown call. */
typedef struct forwarded_infer {
    pjs_grpc_call base;
    grpc_byte_buffer *payload;
} forwarded_infer;

static size_t forwarded_infer_method(void)
{
    for (size_t i = 0; i < pjs__grpc_n_methods; i++)
        if (pjs__grpc_methods[i].kind == PJS_GRPC_INFER)
            return i;
    return SIZE_MAX;
}

static void request_forwarded_infer(pjs_grpc_frontend *f);

static void forwarded_infer_on_new(pjs_grpc_tag *tag, bool ok)
{
    forwarded_infer *c = PJS_GRPC_CONTAINER(tag, forwarded_infer, base.on_new);
    pjs_grpc_frontend *f = c->base.frontend;
    if (ok) {
        request_forwarded_infer(f);
        grpc_call *call = c->base.call;
        c->base.call = NULL; /* the proxy's now, with the metadata and the message */
        grpc_metadata_array md = c->base.metadata;
        grpc_metadata_array_init(&c->base.metadata);
        grpc_slice method = grpc_slice_from_static_string(pjs__grpc_methods[c->base.method].path);
        pjs__grpc_proxy_serve_read(f, call, &md, &method, c->payload);
        c->payload = NULL;
    }
    if (c->payload != NULL)
        grpc_byte_buffer_destroy(c->payload);
    pjs__grpc_call_destroy(&c->base);
    free(c);
}

static void request_forwarded_infer(pjs_grpc_frontend *f)
{
    if (atomic_load(&f->stopping))
        return;
    forwarded_infer *c = calloc(1, sizeof *c);
    if (c == NULL)
        return;
    pjs__grpc_call_init(&c->base, f, forwarded_infer_method(), forwarded_infer_on_new);
    if (pjs__grpc_call_request(&c->base, &c->payload) != GRPC_CALL_OK) {
        pjs__grpc_call_destroy(&c->base);
        free(c);
    }
}

static int register_forwarded(pjs_grpc_frontend *f, pjs_error *err)
{
    size_t i = forwarded_infer_method();
    f->registered = calloc(pjs__grpc_n_methods, sizeof *f->registered);
    if (f->registered == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory");
    f->registered[i] = grpc_server_register_method(f->core, pjs__grpc_methods[i].path, NULL,
                                                   GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (f->registered[i] == NULL)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot register %s",
                             pjs__grpc_methods[i].path);
    return 0;
}

/* ---- threads ---------------------------------------------------------------- */

/* One completion-queue thread per CPU, at most two. Fewer threads cost
 * less per request at low concurrency (gRPC hands its poller from thread
 * to thread), more carry high concurrency: on 2 CPUs one thread instead of
 * two took the mlp's server CPU per request at concurrency 1 from 172-188
 * to 133-136 us but at 16 from 51-55 to 80-103 us, with 40 % fewer
 * requests/s; on a 16-CPU GPU machine two instead of four took the mlp's
 * p50 at concurrency 1 from 739 to 477 us and its CPU per request at 4
 * from 417 to 346 us, and ResNet-50 at 16 from 2,077 to 2,320 requests/s
 * (docs/runtime.md, "CPU cost per request on few cores"). */
static size_t default_threads(void)
{
    int cpus = pjs_cpus_schedulable();
    return cpus > PJS_GRPC_DEFAULT_THREADS_MAX ? PJS_GRPC_DEFAULT_THREADS_MAX : (size_t)cpus;
}

static void on_shutdown(pjs_grpc_tag *tag, bool ok)
{
    (void)ok;
    pjs_grpc_frontend *f = PJS_GRPC_CONTAINER(tag, pjs_grpc_frontend, shutdown_tag);
    pthread_mutex_lock(&f->lock);
    f->shutdown_done = true;
    pthread_cond_broadcast(&f->changed);
    pthread_mutex_unlock(&f->lock);
}

/* Runs events until the queue is shut down, polling health between them. */
static void run_queue(pjs_grpc_frontend *f)
{
    for (;;) {
        gpr_timespec deadline =
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                         gpr_time_from_millis(PJS_GRPC_HEALTH_POLL_MS, GPR_TIMESPAN));
        atomic_fetch_add_explicit(&f->polling, 1, memory_order_relaxed);
        grpc_event ev = grpc_completion_queue_next(f->cq, deadline, NULL);
        atomic_fetch_sub_explicit(&f->polling, 1, memory_order_relaxed);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return;
        if (ev.type == GRPC_OP_COMPLETE) {
            pjs_grpc_tag *tag = ev.tag;
            atomic_load_explicit(&tag->handoffs, memory_order_acquire);
            tag->fn(tag, ev.success != 0);
        }
        pjs__grpc_health_poll(f);
        if (f->proxy != NULL && f->stream_write_stall_ns != 0)
            pjs__grpc_proxy_sweep(f);
    }
}

static void *queue_thread(void *arg)
{
    run_queue(arg);
    return NULL;
}

/* ---- start ------------------------------------------------------------------ */

static grpc_arg int_arg(const char *key, int value)
{
    grpc_arg a;
    memset(&a, 0, sizeof a);
    a.type = GRPC_ARG_INTEGER;
    a.key = (char *)key;
    a.value.integer = value;
    return a;
}

/* The limits of the server's channel: message sizes, streams, idle and
 * handshake timeouts, the memory quota and the descriptor guard. gRPC's own
 * decompression is off: it inflates without bound (payload.c inflates under
 * the request limit instead). */
static grpc_server *create_core(pjs_grpc_frontend *f, const pjs_grpc_options *o)
{
    grpc_arg args[16];
    size_t n = 0;
    args[n++] = int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)f->max_message);
    args[n++] = int_arg(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, INT_MAX);
    args[n++] = int_arg(GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
    args[n++] = int_arg(GRPC_ARG_ALLOW_REUSEPORT, 0);
    args[n++] = int_arg(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, o->keepalive_permit_without_calls);
    if (o->keepalive_time_ms > 0) {
        args[n++] = int_arg(GRPC_ARG_KEEPALIVE_TIME_MS, o->keepalive_time_ms);
        /* Let clients ping as often as we do, or gRPC answers their
         * keepalive pings with GOAWAY "too_many_pings". */
        args[n++] =
            int_arg(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, o->keepalive_time_ms);
    }
    if (o->keepalive_timeout_ms > 0)
        args[n++] = int_arg(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, o->keepalive_timeout_ms);
    if (o->max_concurrent_streams > 0)
        args[n++] = int_arg(GRPC_ARG_MAX_CONCURRENT_STREAMS, o->max_concurrent_streams);
    if (o->max_connection_idle_ms > 0)
        args[n++] = int_arg(GRPC_ARG_MAX_CONNECTION_IDLE_MS, o->max_connection_idle_ms);
    if (o->handshake_timeout_ms > 0)
        args[n++] = int_arg(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, o->handshake_timeout_ms);
    if (f->quota != NULL) {
        grpc_arg q;
        memset(&q, 0, sizeof q);
        q.type = GRPC_ARG_POINTER;
        q.key = (char *)GRPC_ARG_RESOURCE_QUOTA;
        q.value.pointer.p = f->quota;
        q.value.pointer.vtable = grpc_resource_quota_arg_vtable();
        args[n++] = q;
    }
    if (f->guard != NULL)
        args[n++] = pjs__grpc_conn_guard_arg(f->guard);
    grpc_channel_args channel_args = {.num_args = n, .args = args};
    return grpc_server_create(&channel_args, NULL);
}

/* Sets up what create_core installs: the message limit, the quota and
 * the guard. */
static void setup_limits(pjs_grpc_frontend *f, const pjs_grpc_options *o)
{
    f->max_message = o->max_request_bytes > 0 && o->max_request_bytes < PJS_GRPC_MAX_MESSAGE
                         ? (size_t)o->max_request_bytes
                         : (size_t)PJS_GRPC_MAX_MESSAGE;
    if (o->memory_quota > 0) {
        f->quota = grpc_resource_quota_create("pjserve");
        grpc_resource_quota_resize(f->quota, (size_t)o->memory_quota);
    }
    f->guard = pjs__grpc_conn_guard_create(o->fd_share);
    char quota[32], message[32], guard[64] = "no descriptor guard";
    if (f->guard != NULL)
        snprintf(guard, sizeof guard, "connections refused on descriptors >= %d",
                 pjs__grpc_conn_guard_ceiling(f->guard));
    pjs_info("gRPC limits: messages up to %s decompressed, %d streams per connection, idle "
             "connections closed after %d ms, handshake within %d ms, memory quota %s, %s",
             pjs_format_bytes(f->max_message, message, sizeof message),
             o->max_concurrent_streams, o->max_connection_idle_ms, o->handshake_timeout_ms,
             o->memory_quota > 0 ? pjs_format_bytes(o->memory_quota, quota, sizeof quota)
                                 : "unbounded",
             guard);
}

/* Why binding host:port failed, found by trying it with a plain socket
 * (gRPC only says that it failed); NULL when a plain socket binds there. */
static const char *bind_failure(const char *host, int port, char *buf, size_t size)
{
    const char *unix_path = pjs_unix_path(host);
    if (unix_path != NULL) { /* checked for length before */
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        memcpy(sa.sun_path, unix_path, strlen(unix_path) + 1);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        const char *why = NULL;
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            snprintf(buf, size, "%s", strerror(errno));
            why = buf;
        } else {
            unlink(unix_path);
        }
        if (fd >= 0)
            close(fd);
        return why;
    }
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int gai = getaddrinfo(host, service, &hints, &ai);
    if (gai != 0) {
        snprintf(buf, size, "%s", gai_strerror(gai));
        return buf;
    }
    const char *reason = NULL;
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    int one = 1;
    if (fd >= 0) /* as gRPC does, so sockets in TIME_WAIT do not count */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        snprintf(buf, size, "%s", strerror(errno));
        reason = buf;
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return reason;
}

/* Plaintext, TLS, or mTLS when a CA is given. */
static int make_credentials(const pjs_grpc_options *o, grpc_server_credentials **out,
                            pjs_error *err)
{
    char *cert = NULL, *key = NULL, *ca = NULL;
    size_t size;
    int rc = 0;
    if (o->tls_cert == NULL) {
        if (o->tls_key != NULL || o->tls_ca != NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "TLS: a key or CA was given without a certificate");
        *out = grpc_insecure_server_credentials_create();
        return 0;
    }
    if (o->tls_key == NULL)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "TLS: certificate %s was given without its private key", o->tls_cert);
    if ((rc = pjs_read_file(o->tls_cert, PJS_GRPC_PEM_MAX, &cert, &size, err)) != 0 ||
        (rc = pjs_read_file(o->tls_key, PJS_GRPC_PEM_MAX, &key, &size, err)) != 0 ||
        (o->tls_ca != NULL &&
         (rc = pjs_read_file(o->tls_ca, PJS_GRPC_PEM_MAX, &ca, &size, err)) != 0)) {
        pjs_error_prefix(err, "TLS: ");
        goto out;
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    *out = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca != NULL ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (*out == NULL)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "TLS: certificate %s or key %s was refused", o->tls_cert, o->tls_key);
out:
    free(cert);
    free(key);
    free(ca);
    return rc;
}

static int bind_port(pjs_grpc_frontend *f, const pjs_grpc_options *o, size_t n_threads,
                     pjs_error *err)
{
    const char *host = o->host != NULL && o->host[0] != '\0' ? o->host : "0.0.0.0";
    bool v6 = strchr(host, ':') != NULL && host[0] != '[';
    char addr[320], reason[160];
    const char *unix_path = pjs_unix_path(host);
    if (unix_path != NULL && strlen(unix_path) > PJS_UNIX_PATH_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "Unix socket path %s is longer than the %zu bytes a socket path "
                             "may have",
                             unix_path, (size_t)PJS_UNIX_PATH_MAX);
    if (unix_path != NULL) /* gRPC takes the address as it is, and replaces a stale socket */
        snprintf(addr, sizeof addr, "%s", host);
    else
        snprintf(addr, sizeof addr, v6 ? "[%s]:%d" : "%s:%d", host, o->port);
    grpc_server_credentials *creds = NULL;
    int rc = make_credentials(o, &creds, err);
    if (rc != 0)
        return rc;
    int bound = grpc_server_add_http2_port(f->core, addr, creds);
    grpc_server_credentials_release(creds);
    if (bound == 0) {
        const char *why = bind_failure(host, o->port, reason, sizeof reason);
        if (why != NULL)
            return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "cannot listen on %s: %s", addr, why);
        if (o->tls_cert != NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "cannot listen on %s: TLS certificate %s or key %s is not valid "
                                 "PEM (or they do not match)",
                                 addr, o->tls_cert, o->tls_key);
        return pjs_error_set(err, PJS_ERR_UNAVAILABLE, "cannot listen on %s: gRPC refused it",
                             addr);
    }
    if (f->guard != NULL)
        pjs__grpc_conn_guard_listening(f->guard);
    pjs_info("gRPC listening on %s%s (%zu thread%s)", addr,
             o->tls_cert == NULL ? ""
             : o->tls_ca != NULL ? " (mTLS)"
                                 : " (TLS)",
             n_threads, n_threads == 1 ? "" : "s");
    return 0;
}

static void frontend_free(pjs_grpc_frontend *f)
{
    if (f->core != NULL)
        grpc_server_destroy(f->core);
    if (f->cq != NULL)
        grpc_completion_queue_destroy(f->cq);
    if (f->reflection != NULL)
        pjs__grpc_reflection_destroy(f->reflection);
    pjs_work_pool_destroy(f->control_jobs); /* idle: every deferred call was answered */
    if (f->quota != NULL)
        grpc_resource_quota_unref(f->quota);
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->changed);
    pthread_mutex_destroy(&f->watch_lock);
    pthread_mutex_destroy(&f->relayed_lock);
    pjs__grpc_infer_pool_drain(f);
    pthread_mutex_destroy(&f->pool_lock);
    free(f->registered);
    free(f->threads);
    pjs_grpc_conn_guard *guard = f->guard;
    free(f);
    grpc_shutdown_blocking();
    pjs__grpc_conn_guard_free(guard); /* gRPC held references until now */
}

static int register_methods(pjs_grpc_frontend *f, pjs_error *err)
{
    f->registered = calloc(pjs__grpc_n_methods, sizeof *f->registered);
    if (f->registered == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory");
    for (size_t i = 0; i < pjs__grpc_n_methods; i++) {
        const pjs_grpc_method *m = &pjs__grpc_methods[i];
        bool reads_first = m->kind == PJS_GRPC_UNARY || m->kind == PJS_GRPC_INFER ||
                           m->kind == PJS_GRPC_HEALTH_WATCH;
        f->registered[i] = grpc_server_register_method(
            f->core, m->path, NULL,
            reads_first ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER : GRPC_SRM_PAYLOAD_NONE, 0);
        if (f->registered[i] == NULL)
            return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot register %s", m->path);
    }
    return 0;
}

/* Requests the first calls: one per method, four per thread for ModelInfer
 * so concurrent unary inferences do not wait for each other's accept (a
 * thread may be busy executing a request when the device was free, and a
 * call that is not matched yet is cancelled, not refused, at shutdown). */
static void request_first_calls(pjs_grpc_frontend *f, size_t n_threads)
{
    for (size_t i = 0; f->proxy == NULL && i < pjs__grpc_n_methods; i++) {
        size_t n = pjs__grpc_methods[i].kind == PJS_GRPC_INFER ? 4 * n_threads : 1;
        for (size_t k = 0; k < n; k++)
            pjs__grpc_request(f, i);
    }
    /* Forwarding, every call but ModelInfer arrives as an unknown one:
     * keep as many of both requested as a served front end keeps for
     * ModelInfer. */
    size_t unknown = f->proxy != NULL ? 4 * n_threads : 1;
    for (size_t k = 0; k < unknown; k++)
        request_unknown(f);
    for (size_t k = 0; f->proxy != NULL && k < 4 * n_threads; k++)
        request_forwarded_infer(f);
}

static int start_threads(pjs_grpc_frontend *f, size_t n, pjs_error *err)
{
    f->threads = calloc(n, sizeof *f->threads);
    if (f->threads == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for threads");
    for (size_t i = 0; i < n; i++) {
        int e = pthread_create(&f->threads[i], NULL, queue_thread, f);
        if (e != 0)
            return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED, "cannot start thread %zu: %s", i,
                                 strerror(e));
        pjs_thread_name(f->threads[i], "pjs-grpc");
        f->n_threads = i + 1;
    }
    return 0;
}

/* Starts a front end that serves the server `s`, or forwards through
 * `proxy` when s is NULL. */
static int frontend_start(pjs_server *s, const pjs_grpc_proxy_ops *proxy, pjs_byte_budget *budget,
                          const pjs_grpc_options *o, pjs_grpc_frontend **out, pjs_error *err)
{
    if (o->port < 0 || o->port > 65535)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "port %d is not a TCP port", o->port);
    pjs_grpc_frontend *f = calloc(1, sizeof *f);
    if (f == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory");
    grpc_init();
    f->server = s;
    f->proxy = proxy;
    f->budget = budget;
    f->access = o->access;
    f->node_status_file = o->node_status_file;
    f->stream_write_stall_ns =
        o->stream_write_timeout_ms > 0 ? (uint64_t)o->stream_write_timeout_ms * 1000000u : 0;
    f->shutdown_tag.fn = on_shutdown;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->changed, NULL);
    pthread_mutex_init(&f->watch_lock, NULL);
    pthread_mutex_init(&f->relayed_lock, NULL);
    pthread_mutex_init(&f->pool_lock, NULL);
    size_t n_threads = o->threads > 0 ? (size_t)o->threads : default_threads();
    setup_limits(f, o);
    f->core = create_core(f, o);
    f->cq = grpc_completion_queue_create_for_next(NULL);
    int rc = proxy != NULL ? 0 : pjs__grpc_reflection_create(&f->reflection, err);
    if (rc == 0 && proxy == NULL)
        rc = pjs_work_pool_create("gRPC control requests", PJS_GRPC_CONTROL_JOB_THREADS,
                                  PJS_GRPC_CONTROL_JOB_QUEUE, &f->control_jobs, err);
    if (rc != 0) {
        frontend_free(f);
        return rc;
    }
    grpc_server_register_completion_queue(f->core, f->cq, NULL);
    if ((rc = proxy == NULL ? register_methods(f, err) : register_forwarded(f, err)) != 0 ||
        (rc = bind_port(f, o, n_threads, err)) != 0) {
        /* Never started: destroying it needs no shutdown. */
        frontend_free(f);
        return rc;
    }
    grpc_server_start(f->core);
    request_first_calls(f, n_threads);
    if ((rc = start_threads(f, n_threads, err)) != 0) {
        pjs_grpc_frontend_stop(f);
        return rc;
    }
    *out = f;
    return 0;
}

int pjs_grpc_frontend_start(pjs_server *s, const pjs_grpc_options *o, pjs_grpc_frontend **out,
                            pjs_error *err)
{
    return frontend_start(s, NULL, pjs_server_request_budget(s), o, out, err);
}

int pjs_grpc_frontend_start_proxy(const pjs_grpc_options *o, const pjs_grpc_proxy_ops *ops,
                                  pjs_byte_budget *budget, pjs_grpc_frontend **out,
                                  pjs_error *err)
{
    return frontend_start(NULL, ops, budget, o, out, err);
}

/* ---- stop ------------------------------------------------------------------- */

/* gRPC cancels every call it has not handed to pjserve when the core shuts
 * down, and a client sees CANCELLED, which it cannot tell from a call that
 * may have run. A call already on the wire when stopping began may still be
 * unread: under load the queue threads, which also poll the sockets, were
 * busy executing. So before shutting the core down, wait until no call has
 * been handed over for a quiet spell (the server is draining by then and
 * refuses them UNAVAILABLE, which clients retry elsewhere), within a bound
 * so that clients that keep retrying cannot hold the stop up. */
static void settle(pjs_grpc_frontend *f)
{
    const uint64_t ms = 1000000;
    uint64_t start = pjs_now_ns(), quiet_since = start;
    uint64_t seen = atomic_load_explicit(&f->calls_handed_over, memory_order_relaxed);
    for (;;) {
        nanosleep(&(struct timespec){.tv_nsec = 10 * (long)ms}, NULL);
        uint64_t now = pjs_now_ns();
        uint64_t n = atomic_load_explicit(&f->calls_handed_over, memory_order_relaxed);
        if (n != seen) {
            seen = n;
            quiet_since = now;
        } else if (now - quiet_since >= PJS_GRPC_SETTLE_QUIET_MS * ms) {
            return;
        }
        if (now - start >= PJS_GRPC_SETTLE_MAX_MS * ms)
            return;
    }
}

void pjs_grpc_frontend_stop(pjs_grpc_frontend *f)
{
    if (f == NULL)
        return;
    if (f->n_threads > 0)
        settle(f);
    atomic_store(&f->stopping, true);
    grpc_server_shutdown_and_notify(f->core, f->cq, pjs__grpc_tag_arm(&f->shutdown_tag));
    if (f->n_threads == 0) {
        grpc_server_cancel_all_calls(f->core);
        /* Start failed before any thread ran: no call was served, so the
         * queue only holds the requested calls and the shutdown tag. */
        grpc_completion_queue_shutdown(f->cq);
        run_queue(f);
    } else {
        struct timespec grace;
        clock_gettime(CLOCK_REALTIME, &grace);
        grace.tv_sec += PJS_GRPC_STOP_GRACE_S;
        pthread_mutex_lock(&f->lock);
        while (!f->shutdown_done &&
               pthread_cond_timedwait(&f->changed, &f->lock, &grace) != ETIMEDOUT)
            ;
        pthread_mutex_unlock(&f->lock);
        grpc_server_cancel_all_calls(f->core);
        pthread_mutex_lock(&f->lock);
        while (!f->shutdown_done || f->in_dispatcher > 0 || f->live_calls > 0)
            pthread_cond_wait(&f->changed, &f->lock);
        pthread_mutex_unlock(&f->lock);
        grpc_completion_queue_shutdown(f->cq);
        for (size_t i = 0; i < f->n_threads; i++)
            pthread_join(f->threads[i], NULL);
    }
    frontend_free(f);
}
