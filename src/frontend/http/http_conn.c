/*
 * http_conn.c - the connection table of an HTTP front end: deadlines, the
 * eviction of connections that have no request in hand when the table is
 * full, and the client-certificate requirement of mutual TLS.
 *
 * Deadlines. libmicrohttpd (0.9.75) times a connection out only after a
 * period with no bytes at all (MHD_OPTION_CONNECTION_TIMEOUT, our idle
 * timeout), so a client sending one byte every few seconds (slowloris)
 * would hold its connection forever. We keep our own record per
 * connection: a phase and the deadline by which the phase must end:
 *
 *   HEADERS    accept (or, on a kept-alive connection, the next request
 *              line) + --http-header-timeout-s, until the headers are in;
 *   BODY       headers + --http-body-timeout-s, until the body is in;
 *   LINGER     a refusal before the body's end + PJS_HTTP_LINGER_S, until
 *              the rest of the body is read and dropped (http_frontend.c);
 *   ANSWERING  no deadline (the reply is made by us, sent under the idle
 *              timeout);
 *   KEEPALIVE  the previous reply + --http-idle-timeout-s, until the next
 *              request line is in.
 *
 * A watchdog thread scans the records four times a second and shuts down
 * (shutdown(2)) the socket of a connection past its deadline; libmicrohttpd
 * then sees the end of the stream and closes the connection itself, on its
 * own thread, completing any request on it. The record is unlinked under
 * conn_lock in the CLOSED notification, which libmicrohttpd gives before it
 * closes the descriptor, so no thread ever shuts down a descriptor that was
 * closed or reused.
 *
 * Eviction. When the table holds --http-max-connections, libmicrohttpd
 * stops accepting, and new clients wait in the listen queue until a place
 * frees: a crowd of connections that send nothing would deny service for
 * the header timeout. So, as nginx does, connections without a request in
 * hand (HEADERS: nothing, or not all the headers, received; KEEPALIVE:
 * between requests) make room: whenever an accepted connection fills the
 * table, the one of them waiting longest (since accept, or since its last
 * reply) is shut down the same way, so one place stays free for the next
 * client. A connection with a request begun (its headers in) or a reply in
 * flight is never evicted. libmicrohttpd splits the limit between its
 * threads; the table is full only when every thread's share is, and a place
 * freed on any thread lets that thread accept again.
 *
 * Threads: the notifications and phase changes run on libmicrohttpd's
 * connection threads (or the one thread of a port on an external loop); the
 * watchdog on its own; all share conn_lock, and shut down other
 * connections' sockets only under it. A shutdown socket wakes the thread
 * that runs its connection through the daemon's epoll descriptor, which an
 * external loop waits on too.
 */
#include "core/thread_name.h"
#include "frontend/http/http_internal.h"

#include <gnutls/gnutls.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

/* How often the watchdog looks. */
#define WATCHDOG_PERIOD_MS 250

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ms(void)
{
    return now_ns() / 1000000u;
}

/* The deadline of `phase` starting now; 0: none. */
static uint64_t phase_deadline(const pjs_http_frontend *fe, pjs__http_phase phase)
{
    unsigned s = 0;
    switch (phase) {
    case PJS_HTTP_PHASE_HEADERS: s = fe->opts.header_timeout_s; break;
    case PJS_HTTP_PHASE_BODY: s = fe->opts.body_timeout_s; break;
    case PJS_HTTP_PHASE_KEEPALIVE: s = fe->opts.idle_timeout_s; break;
    case PJS_HTTP_PHASE_LINGER: s = PJS_HTTP_LINGER_S; break;
    case PJS_HTTP_PHASE_ANSWERING:
    case PJS_HTTP_PHASE_COUNT: return 0;
    }
    return s > 0 ? now_ms() + (uint64_t)s * 1000u : 0;
}

static void set_phase(pjs_http_frontend *fe, pjs__http_conn *t, pjs__http_phase phase)
{
    if (phase == PJS_HTTP_PHASE_KEEPALIVE && t->phase != PJS_HTTP_PHASE_KEEPALIVE)
        t->waiting_since_ns = now_ns();
    t->phase = (int)phase;
    t->deadline_ms = phase_deadline(fe, phase);
}

/* Shuts down the socket of t, counted as cut in its phase or evicted.
 * Called with conn_lock held. */
static void cut(pjs_http_frontend *fe, pjs__http_conn *t, bool evicted)
{
    shutdown(t->fd, SHUT_RDWR);
    t->cut = true;
    fe->n_cut++;
    if (evicted)
        fe->evicted_unlogged++;
    else
        fe->cut_unlogged[t->phase]++;
}

static bool has_request_in_hand(const pjs__http_conn *t)
{
    return t->phase != PJS_HTTP_PHASE_HEADERS && t->phase != PJS_HTTP_PHASE_KEEPALIVE;
}

/* When the table is full, evicts the connection without a request in hand
 * that has waited longest, if there is one. Called with conn_lock held. */
static void make_room(pjs_http_frontend *fe)
{
    if (fe->n_conns - fe->n_cut < fe->opts.max_connections)
        return;
    pjs__http_conn *oldest = NULL;
    for (pjs__http_conn *t = fe->conns; t != NULL; t = t->next) {
        if (t->cut || has_request_in_hand(t))
            continue;
        if (oldest == NULL || t->waiting_since_ns < oldest->waiting_since_ns)
            oldest = t;
    }
    if (oldest != NULL)
        cut(fe, oldest, true);
}

/* Mutual TLS: the handshake asks for a client certificate, fails without
 * one, and verifies it against the CA given (libmicrohttpd loaded it into
 * the session's credentials as their trust list, but only requests a
 * certificate and never checks it). */
static void require_client_certificate(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (info == NULL || info->tls_session == NULL)
        return;
    gnutls_session_t session = (gnutls_session_t)info->tls_session;
    gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
    gnutls_session_set_verify_cert(session, NULL, 0);
}

void pjs__http_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe)
{
    pjs_http_frontend *fe = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        if (fe->opts.tls_ca != NULL)
            require_client_certificate(conn);
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        pjs__http_conn *t = calloc(1, sizeof *t);
        *socket_context = t;
        if (t == NULL || info == NULL) /* untracked: the idle timeout still applies */
            return;
        t->fd = info->connect_fd;
        t->waiting_since_ns = now_ns();
        pthread_mutex_lock(&fe->conn_lock);
        set_phase(fe, t, PJS_HTTP_PHASE_HEADERS);
        t->next = fe->conns;
        if (fe->conns != NULL)
            fe->conns->prev = t;
        fe->conns = t;
        fe->n_conns++;
        make_room(fe);
        pthread_mutex_unlock(&fe->conn_lock);
        return;
    }
    pjs__http_conn *t = *socket_context;
    *socket_context = NULL;
    if (t == NULL)
        return;
    pthread_mutex_lock(&fe->conn_lock);
    if (t->prev != NULL)
        t->prev->next = t->next;
    else if (fe->conns == t)
        fe->conns = t->next;
    if (t->next != NULL)
        t->next->prev = t->prev;
    if (fe->n_conns >= fe->opts.max_connections)
        fe->freed_at_limit = true;
    fe->n_conns--;
    if (t->cut)
        fe->n_cut--;
    pthread_mutex_unlock(&fe->conn_lock);
    free(t);
}

pjs__http_conn *pjs__http_conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info != NULL ? info->socket_context : NULL;
}

void *pjs__http_conn_request_line(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)uri;
    pjs_http_frontend *fe = cls;
    pjs__http_conn *t = pjs__http_conn_of(conn);
    if (t != NULL) {
        pthread_mutex_lock(&fe->conn_lock);
        /* A fresh connection's header deadline runs from accept; a kept-alive
         * one's starts with its next request line. */
        if (t->phase == PJS_HTTP_PHASE_KEEPALIVE)
            set_phase(fe, t, PJS_HTTP_PHASE_HEADERS);
        pthread_mutex_unlock(&fe->conn_lock);
    }
    return NULL;
}

void pjs__http_conn_phase(pjs__http_call *c, pjs__http_phase phase)
{
    pjs__http_conn *t = c->track;
    if (t == NULL)
        return;
    pthread_mutex_lock(&c->fe->conn_lock);
    set_phase(c->fe, t, phase);
    pthread_mutex_unlock(&c->fe->conn_lock);
}

bool pjs__http_conn_cut(pjs__http_call *c)
{
    pjs__http_conn *t = c->track;
    if (t == NULL)
        return false;
    pthread_mutex_lock(&c->fe->conn_lock);
    if (!t->cut)
        cut(c->fe, t, false);
    pthread_mutex_unlock(&c->fe->conn_lock);
    return true;
}

/* What a connection cut in `phase` did not send in time, into buf. */
static void missed(int phase, char *buf, size_t size)
{
    switch (phase) {
    case PJS_HTTP_PHASE_HEADERS:
        snprintf(buf, size, "headers within --http-header-timeout-s");
        break;
    case PJS_HTTP_PHASE_BODY: snprintf(buf, size, "body within --http-body-timeout-s"); break;
    case PJS_HTTP_PHASE_LINGER:
        snprintf(buf, size, "the rest of a refused body within %u s and %llu MiB",
                 PJS_HTTP_LINGER_S, (unsigned long long)(PJS_HTTP_LINGER_MAX_BYTES >> 20));
        break;
    default: snprintf(buf, size, "next request within --http-idle-timeout-s"); break;
    }
}

/* Shuts down every connection past its deadline. Called with conn_lock held. */
static void cut_overdue(pjs_http_frontend *fe, uint64_t now)
{
    for (pjs__http_conn *t = fe->conns; t != NULL; t = t->next) {
        if (t->cut || t->deadline_ms == 0 || now < t->deadline_ms)
            continue;
        cut(fe, t, false);
    }
}

/* One line (the limiter may drop a second) for the connections cut and
 * evicted since the last, naming each bound with its own flag. Called with
 * conn_lock held. */
static void log_cuts(pjs_http_frontend *fe)
{
    char what[640] = "";
    size_t used = 0;
    for (int phase = 0; phase < PJS_HTTP_PHASE_COUNT && used < sizeof what; phase++) {
        unsigned n = fe->cut_unlogged[phase];
        fe->cut_unlogged[phase] = 0;
        if (n == 0)
            continue;
        char bound[96];
        missed(phase, bound, sizeof bound);
        used += (size_t)snprintf(what + used, sizeof what - used,
                                 "%sclosed %u connection%s that did not send %s",
                                 used ? "; " : "", n, n == 1 ? "" : "s", bound);
    }
    unsigned n = fe->evicted_unlogged;
    fe->evicted_unlogged = 0;
    if (n > 0 && used < sizeof what)
        used += (size_t)snprintf(what + used, sizeof what - used,
                                 "%sclosed %u connection%s waiting for a request, longest "
                                 "waiting first, to admit new ones (--http-max-connections %u)",
                                 used ? "; " : "", n, n == 1 ? "" : "s",
                                 fe->opts.max_connections);
    if (used > 0)
        pjs_log_limited(&fe->cut_log, PJS_LOG_WARN, "%s: %s", fe->address, what);
}

static void *watchdog_main(void *arg)
{
    pjs_http_frontend *fe = arg;
    pthread_mutex_lock(&fe->conn_lock);
    while (!fe->watchdog_stop) {
        cut_overdue(fe, now_ms());
        log_cuts(fe);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += WATCHDOG_PERIOD_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&fe->conn_wake, &fe->conn_lock, &until);
    }
    pthread_mutex_unlock(&fe->conn_lock);
    return NULL;
}

int pjs__http_watchdog_start(pjs_http_frontend *fe, pjs_error *err)
{
    fe->watchdog_stop = false;
    if (pthread_create(&fe->watchdog, NULL, watchdog_main, fe) != 0)
        return pjs_error_set(err, PJS_ERR_NOMEM, "cannot start the connection watchdog thread");
    pjs_thread_name(fe->watchdog, "pjs-http-watch");
    fe->watchdog_running = true;
    return 0;
}

void pjs__http_watchdog_stop(pjs_http_frontend *fe)
{
    if (!fe->watchdog_running)
        return;
    pthread_mutex_lock(&fe->conn_lock);
    fe->watchdog_stop = true;
    pthread_cond_signal(&fe->conn_wake);
    pthread_mutex_unlock(&fe->conn_lock);
    pthread_join(fe->watchdog, NULL);
    fe->watchdog_running = false;
}
