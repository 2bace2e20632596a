/*
 * http_internal.h - what the files of the HTTP front end share: the daemon,
 * the per-request context, replies and the route sets.
 *
 * The daemon (http_frontend.c, http_conn.c, http_route_util.c) knows no
 * server: it enforces the client limits (connections, deadlines, body caps,
 * the in-flight byte budget, inflation of encoded bodies), the access rules
 * and TLS, then hands each complete request to a route set chosen at start
 * (pjs__http_routes). serve's route sets (http_routes.c, http_infer.c)
 * answer from a pjs_server; the gateway's (src/gateway/http_proxy.c) relay
 * requests to workers.
 *
 * Threads. libmicrohttpd runs a pool of connection threads (epoll); each
 * connection belongs to one of them, which calls the access handler for it.
 * A request is answered either at once, on that thread, or later: the
 * handler marks the call `waiting`, suspends the connection and hands the
 * work off (an inference to the server, a model load to a helper thread).
 * Whoever finishes the work stores the reply in the call and resumes the
 * connection as its very last touch of the call; libmicrohttpd then calls
 * the handler again on the connection's thread, which queues the stored
 * reply. Resuming goes through libmicrohttpd's mutex, which orders the
 * stored reply before the second handler call. An inference suspends only
 * when its answer is not there once its submit returns (http_infer.c).
 *
 * A route set may instead run the daemon on its own thread
 * (routes->external_loop, the gateway's REST port): libmicrohttpd starts no
 * thread, and that thread waits on the daemon's epoll descriptor along
 * with its own work and calls pjs__http_loop_run, which runs the handlers;
 * its suspended calls are resumed on the same thread, which runs the
 * daemon again before it waits. The watchdog and stop act on it as on
 * any other port (http_conn.c; pjs__http_loop_quiesce and
 * pjs__http_loop_done split the stop between the loop and the caller).
 */
#ifndef PJS_FRONTEND_HTTP_HTTP_INTERNAL_H
#define PJS_FRONTEND_HTTP_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "core/log.h"
#include "core/status.h"
#include "core/work_pool.h"
#include "frontend/client_id.h"
#include "frontend/http/http_buf.h"
#include "frontend/http/http_codec.h"
#include "frontend/http/http_frontend.h"

/* One TCP connection as the deadline watchdog and the connection table
 * see it (http_conn.c). Created when libmicrohttpd accepts the
 * connection, freed when it closes; every field is guarded by the front
 * end's conn_lock. */
typedef struct pjs__http_conn {
    struct pjs__http_conn *prev, *next; /* the front end's list of connections */
    int fd;
    int phase;                 /* a pjs__http_phase */
    uint64_t deadline_ms;      /* monotonic; 0: none in this phase */
    uint64_t waiting_since_ns; /* monotonic: accept, or the end of the last reply */
    bool cut;                  /* shut down (a deadline, a bound, or evicted); closing */
} pjs__http_conn;

/* Where a connection is; each phase but ANSWERING has a deadline. A
 * connection in HEADERS or KEEPALIVE has no request in hand (none begun, or
 * its headers not all in) and may be evicted to admit a new connection when
 * the table is full; the others never are. */
typedef enum pjs__http_phase {
    PJS_HTTP_PHASE_HEADERS,   /* from accept, or the next request line, to the headers' end */
    PJS_HTTP_PHASE_BODY,      /* from the headers' end to the body's end */
    PJS_HTTP_PHASE_ANSWERING, /* the request is complete; its reply is being made or sent */
    PJS_HTTP_PHASE_KEEPALIVE, /* between requests: the next request line must come in time */
    PJS_HTTP_PHASE_LINGER,    /* refused before its body's end: the rest is read and dropped */
    PJS_HTTP_PHASE_COUNT
} pjs__http_phase;

/* Lingering: a request refused before its body is all in (413, 415, 429,
 * 401, ...) has the rest of its body read and dropped before the reply goes
 * out, so that a client writing the whole body before reading (most do,
 * unless they send Expect: 100-continue) reads the status rather than a
 * reset. At most this many bytes, for at most this long from the refusal;
 * past either the connection is cut without a reply. */
#define PJS_HTTP_LINGER_MAX_BYTES ((uint64_t)64 << 20)
#define PJS_HTTP_LINGER_S 2u

typedef struct pjs__http_call pjs__http_call;

/* What one port answers, chosen at start. */
typedef struct pjs__http_routes {
    const char *what;   /* names the port in logs: "HTTP/REST", "metrics" */
    bool keeps_bodies;  /* POST bodies are kept for the route; else read and dropped */
    bool defers_jobs;   /* routes use pjs__http_defer (the front end starts job threads) */
    /* The port has no connection threads: the route set's own thread runs
     * the daemon in its event loop (pjs__http_loop_*), and the routes'
     * suspended calls are resumed on that thread. */
    bool external_loop;
    /* Once a POST's headers are in (may be NULL): sets c->body_limit and
     * c->limit_what for the path, at most what they are, or stores a body
     * refusal in c->body_error and returns false. */
    bool (*limit_body)(pjs__http_call *c);
    /* A complete request: stores a reply or leaves the call waiting. */
    void (*route)(pjs__http_call *c);
    /* Frees what the route keeps in the call (may be NULL); runs when the
     * call is freed, whatever state it is in. */
    void (*release)(pjs__http_call *c);
} pjs__http_routes;

struct pjs_http_frontend {
    const pjs__http_routes *routes;
    void *routes_ctx;           /* the routes' own state: serve's pjs_server, the gateway's proxy */
    pjs_byte_budget *budget;    /* request bytes held at once (shared by the ports) */
    uint64_t max_request_bytes; /* largest body, decompressed */
    struct MHD_Daemon *daemon;
    const pjs_access *access; /* consulted once a request's headers are in */
    char address[300]; /* "host:port", for messages */
    pjs_http_options opts; /* as started, defaults filled in (strings borrowed) */
    pjs_log_limiter mhd_log;   /* libmicrohttpd's own messages */
    pjs_log_limiter cut_log;   /* connections cut at a deadline or bound, or evicted */
    char *tls_cert_pem, *tls_key_pem, *tls_ca_pem; /* HTTPS: the files' text, or NULL */

    /* Deadlines and the connection table (http_conn.c): every open
     * connection, and the watchdog thread that shuts down those past their
     * phase's deadline and logs what was cut. conns .. watchdog_stop are
     * guarded by conn_lock. */
    pthread_mutex_t conn_lock;
    pthread_cond_t conn_wake;
    pjs__http_conn *conns;
    unsigned n_conns;           /* records in conns */
    unsigned n_cut;             /* records in conns that are cut, not yet closed */
    unsigned cut_unlogged[PJS_HTTP_PHASE_COUNT]; /* cut at a deadline or bound, by phase */
    unsigned evicted_unlogged;  /* evicted to admit new connections */
    bool freed_at_limit;        /* a connection closed while the table was full */
    bool watchdog_stop;
    bool watchdog_running;
    pthread_t watchdog;

    /* Shutdown bookkeeping. Stop waits for every deferred job (each holds a
     * suspended connection, which must be resumed before the daemon stops)
     * and, for a grace period, for open requests to finish sending their
     * replies. `idle` is signalled when either count reaches zero. */
    pthread_mutex_t lock;
    pthread_cond_t idle;
    int jobs;             /* suspended calls waiting for work; guarded by lock */
    pjs_work_pool *jobs_pool; /* runs deferred jobs (REST only; NULL for metrics) */
    int open_calls;       /* requests begun and not yet completed; guarded by lock */
    atomic_bool stopping; /* replies ask clients to close their connections */
    bool quiesced;        /* no longer accepting; the grace period ends at stop_deadline */
    struct timespec stop_deadline; /* CLOCK_REALTIME */
    int loop_fd;          /* external_loop: libmicrohttpd's epoll descriptor */

    /* Decoded inference requests (about 32 KB each) kept for the next ones
     * (http_infer.c), at most PJS_HTTP_INFER_POOL. */
    pthread_mutex_t infer_pool_lock;
    struct pjs__http_pooled_infer *infer_pool;
    size_t n_infer_pool;
};

#define PJS_HTTP_INFER_POOL 64

/* A response waiting to be queued. */
typedef struct pjs__http_reply {
    unsigned status;
    char *body; /* malloc'd (handed to libmicrohttpd), NULL for an empty body */
    size_t len;
    const char *content_type;  /* static string, NULL with an empty body */
    size_t inference_header;   /* > 0: Inference-Header-Content-Length */
    const char *allow;         /* for 405: the methods the path takes */
    bool www_authenticate;     /* for 401: WWW-Authenticate: Bearer */
    const char *answer_mark;   /* refused before anything ran: status_map.h's mark, or NULL */
} pjs__http_reply;

/* One request, from its headers to the end of its response (libmicrohttpd's
 * per-request context). Owned by the connection's thread, except while
 * `waiting`, when the reply fields and `infer` belong to the work it waits
 * for. */
struct pjs__http_call {
    pjs_http_frontend *fe;
    struct MHD_Connection *conn;
    const char *method; /* libmicrohttpd's strings, valid for the request */
    const char *url;
    pjs__http_conn *track; /* the connection's deadline record, or NULL */
    /* The body. Only POST requests on the REST port keep one (others' bytes
     * are read and dropped); its bytes are taken from the server's request
     * budget as they arrive and given back when the call is freed. */
    bool takes_body;
    bool encoded;         /* Content-Encoding other than identity; inflated on first use */
    pjs_http_buf body;    /* limit: body_limit */
    size_t body_limit;    /* --max-request-bytes, or less for an inference (model bound) */
    char limit_what[200]; /* what body_limit is, for messages */
    uint64_t budget_taken; /* bytes taken from the request budget */
    size_t body_peak;     /* largest buffer the call held (trim the heap after a big one) */
    pjs_error body_error; /* code set when the body was refused */
    unsigned body_status; /* the HTTP status of body_error; 0: from its code */
    bool dispatched;      /* the route ran, or the request was refused: a reply is stored */
    bool waiting;         /* suspended until the reply is stored */
    bool lingering;       /* refused: the rest of the body is dropped, then the reply sent */
    uint64_t linger_left; /* bytes more that lingering may drop */
    pjs__http_reply reply;
    pjs_http_infer *infer; /* serve's routes: an inference in progress, or NULL */
    char client_id[PJS_CLIENT_ID_MAX]; /* who sent an inference starting a sequence */
    atomic_int handover;   /* an inference's hand-over (http_infer.c) */
};

/* ---- replies (http_frontend.c); each replaces any reply stored before ---- */

/* A document; `doc` is consumed (NULL: out of memory, answered 500). */
void pjs__http_reply_json(pjs__http_call *c, unsigned status, json_t *doc);
/* {"error": msg} with the HTTP status that status_map.h gives err->code. */
void pjs__http_reply_error(pjs__http_call *c, const pjs_error *err);
/* {"error": formatted} with an explicit HTTP status. */
void pjs__http_reply_message(pjs__http_call *c, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pjs__http_reply_empty(pjs__http_call *c, unsigned status);
/* Takes the bytes of b as the body. */
void pjs__http_reply_buf(pjs__http_call *c, unsigned status, pjs_http_buf *b,
                         const char *content_type);

/* Makes the body plain: inflates an encoded one (once) within body_limit
 * and the request budget. false: an error reply is stored. Every route that
 * reads the body calls this first. */
bool pjs__http_body_ready(pjs__http_call *c);

/* Stores an error reply for `err` with HTTP status `status` (0: from its code). */
void pjs__http_reply_error_status(pjs__http_call *c, unsigned status, const pjs_error *err);

/* ---- connection deadlines (http_conn.c) ------------------------------------ */

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the front end):
 * tracks the connection from accept to close; with mutual TLS, makes the
 * handshake require and verify a client certificate. */
void pjs__http_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe);
/* libmicrohttpd's MHD_OPTION_URI_LOG_CALLBACK: a request line arrived. */
void *pjs__http_conn_request_line(void *cls, const char *uri, struct MHD_Connection *conn);
/* Moves the connection of c to `phase`, starting that phase's deadline. */
void pjs__http_conn_phase(pjs__http_call *c, pjs__http_phase phase);
/* Shuts down the connection of c now, as if its phase's deadline had
 * passed (libmicrohttpd then closes it). false: the connection has no
 * record, and the caller must close it itself. */
bool pjs__http_conn_cut(pjs__http_call *c);
/* The connection's record (its socket context), or NULL. */
pjs__http_conn *pjs__http_conn_of(struct MHD_Connection *conn);
/* Starts and stops the watchdog thread (stop after the daemon stopped). */
int pjs__http_watchdog_start(pjs_http_frontend *fe, pjs_error *err);
void pjs__http_watchdog_stop(pjs_http_frontend *fe);

/* Runs fn(c) on one of the front end's job threads (a bounded pool: no
 * thread per request) with the connection suspended, then resumes it; fn
 * stores the reply. When the pool's queue is full the call is answered 429
 * at once. */
void pjs__http_defer(pjs__http_call *c, void (*fn)(pjs__http_call *c));
/* For work that answers through a callback on another thread (a model
 * load): suspend marks the call waiting and counts it for shutdown; the
 * callback stores the reply and calls resume as its last touch of c. */
void pjs__http_suspend(pjs__http_call *c);
void pjs__http_resume(pjs__http_call *c);

/* ---- starting a port ------------------------------------------------------ */

/* Binds o->host:o->port and serves it with `routes` (routes_ctx: their
 * state). Bodies are held to max_request_bytes and, together with every
 * other request in flight, to `budget`. Errors name the address and the
 * reason. */
int pjs__http_frontend_start(const pjs__http_routes *routes, void *routes_ctx,
                             const pjs_http_options *o, pjs_byte_budget *budget,
                             uint64_t max_request_bytes, pjs_http_frontend **out,
                             pjs_error *err);

/* ---- a port on its route set's event loop (routes->external_loop) ---------- */

/* All of these run on the loop's thread, the one thread that runs the
 * daemon, until the port is stopped. */

/* The descriptor to wait on: readable when the daemon has work. */
int pjs__http_loop_fd(pjs_http_frontend *fe);
/* Does the daemon's work (accepts, reads, runs the handlers and routes,
 * sends replies); returns the milliseconds the loop may wait on the
 * descriptor before running it again, -1: no bound. After resuming a
 * call, the loop runs it again before it waits. */
int pjs__http_loop_run(pjs_http_frontend *fe);
/* Stops accepting connections (the first step of stopping the port). */
void pjs__http_loop_quiesce(pjs_http_frontend *fe);
/* Once quiesced: whether the loop may end, leaving the rest to
 * pjs_http_frontend_stop: no call suspended, and every open request
 * answered or the grace period over. */
bool pjs__http_loop_done(pjs_http_frontend *fe);

/* ---- what route sets share (http_route_util.c) ------------------------------ */

/* Longest path routed; deeper or longer ones are unknown routes. */
#define PJS_HTTP_PATH_MAX_BYTES 2048
#define PJS_HTTP_PATH_MAX_SEGMENTS 8

/* A path split on '/', empty segments ignored (a trailing slash is accepted). */
typedef struct pjs__http_path {
    char text[PJS_HTTP_PATH_MAX_BYTES]; /* the path with '/' replaced by NULs */
    const char *seg[PJS_HTTP_PATH_MAX_SEGMENTS];
    size_t n;
} pjs__http_path;

/* false: too long or too deep to be a route. */
bool pjs__http_split_path(const char *url, pjs__http_path *p);
/* Whether the call's method is `method` (HEAD counts as GET); stores a 405
 * reply when it is not. */
bool pjs__http_method_ok(pjs__http_call *c, const char *method);
/* The request body as a JSON object (an empty body: *out NULL). Stores a
 * 400 reply and returns false when it is not an object. */
bool pjs__http_body_object(pjs__http_call *c, json_t **out);
/* Whether url is /v2/models/{m}[/versions/{v}]/infer; copies the model name
 * and version (empty when absent); false also when either does not fit. */
bool pjs__http_infer_path(const char *url, char *model, size_t model_size, char *version,
                          size_t version_size);
/* Holds a non-inference POST body to the size of a control document (1 MiB). */
void pjs__http_limit_control_body(pjs__http_call *c);
/* Whether the request's path has only name segments (no ".", "..", empty
 * segment or trailing slash, decoded or not); stores a 400 reply when not.
 * Asked before anything else reads the path. */
bool pjs__http_path_clean(pjs__http_call *c);
/* Whether the caller may make this request (its headers are in, its body
 * not yet read); stores a 401 or 403 reply when not. */
bool pjs__http_access_allowed(pjs__http_call *c);
/* Who made call c, into out (PJS_CLIENT_ID_MAX bytes): the `pjserve-client`
 * header when the peer is trusted with it (frontend/client_id.h), else the
 * peer's address. */
void pjs__http_client_id(pjs__http_call *c, char *out);

/* ---- serve's routes (http_routes.c, http_infer.c) ---------------------------- */

/* Called when the headers of a POST to an inference path arrive: lowers
 * c->body_limit to what a valid request for the model can hold, or stores
 * an error reply at once (unknown model). false: replied. */
bool pjs__http_infer_limit(pjs__http_call *c, const char *model, const char *version);
/* POST /v2/models/{m}[/versions/{v}]/infer (http_infer.c). */
void pjs__http_infer(pjs__http_call *c, const char *model, const char *version);
/* Releases an unfinished inference of c (after a failure or at shutdown). */
void pjs__http_infer_discard(pjs__http_call *c);
/* Frees the pooled decoded requests (the front end is being freed). */
void pjs__http_infer_pool_drain(pjs_http_frontend *fe);

#endif
